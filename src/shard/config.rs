//! How a node's shards are configured: the options, the Raft timing and snapshot policy, and the
//! shard-count record that keeps a data directory from being reopened with another count.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use openraft::SnapshotPolicy;

use super::error::ShardError;
use super::EventSink;
use crate::ids::NodeId;

/// How a node's shards are opened.
#[derive(Clone, Debug)]
pub struct ShardsConfig {
    pub data_dir: PathBuf,
    pub node_id: NodeId,
    pub shard_count: u32,
    /// Take a snapshot (and purge the log before it) after this many applied entries.
    pub snapshot_every: u64,
    /// Where the events of applied commands go (desired pushes, change events).
    pub events: Option<EventSink>,
    /// Inter-node transport; `None`: a single-node hub whose groups have one voter.
    pub transport: Option<crate::cluster::transport::Transport>,
    /// Founding members (id → inter-node address) every group starts with. Only the lowest id
    /// initializes the groups; the others learn the membership from its log. Empty: this node alone.
    pub members: BTreeMap<NodeId, String>,
    /// A member's address this node joins through (it is then not a founder).
    pub join: Option<String>,
    /// Raft heartbeat; elections time out after 3 to 6 heartbeats.
    pub heartbeat_ms: u64,
    /// Entries of one shard proposed and not yet applied at once before its next writes share an
    /// entry (see `proposer`); 0: every write is an entry of its own.
    pub proposals_in_flight: usize,
}

/// Raft timing for many groups on a small box. openraft ticks every group separately (100 groups at a
/// 50 ms heartbeat cost ~30 % of a core idle on 2 cores), so tens of groups per node at a 100 ms
/// heartbeat. A follower starts an election only after the leader lease (`election_timeout_max`) has
/// run out *and* its own random election timeout, so failover takes roughly max + [min, max]:
/// 0.6 + 0.3…0.6 s here (the 1–2 s of the single-node era measured 3.3–3.9 s on a 3-node group).
pub(super) fn raft_config(config: &ShardsConfig) -> Result<Arc<openraft::Config>, ShardError> {
    let every = config.snapshot_every.max(1);
    let cfg = openraft::Config {
        cluster_name: "twinhub".into(),
        heartbeat_interval: config.heartbeat_ms,
        election_timeout_min: 3 * config.heartbeat_ms,
        election_timeout_max: 6 * config.heartbeat_ms,
        // A partitioned node rejoining must not depose a healthy leader by bumping terms.
        enable_pre_vote: Some(true),
        // A leader that restarts must win a new election, never resume its old term (docs/architecture.md,
        // invariant 10). A resumed leader starts with the committed index it last saved, and that save
        // rides on a later fsync than the entries themselves: after a power loss it can be a few entries
        // behind writes that were acknowledged. Until a follower's answer re-teaches it, its read index (the larger of its first
        // entry of the term and that stale committed index) is below those writes, and a linearizable
        // read served by it — or by a follower waiting for that index — misses them. A new term's blank
        // entry commits only after everything before it, so its read index covers every acknowledged
        // write. The price is one election (3 to 6 heartbeats) after a leader restarts.
        enable_leader_restore: Some(false),
        // Snapshots travel in one RPC: the default 200 ms deadline cannot carry a large shard.
        install_snapshot_timeout: 30_000,
        // Snapshots are asked for by `Shards::snapshot_heavy_groups`, which weighs entries, twin
        // writes and the shard's size; Raft's own count of entries is only a backstop.
        snapshot_policy: SnapshotPolicy::LogsSinceLast(every.saturating_mul(super::RAFT_POLICY_BACKSTOP)),
        // A follower a little behind catches up from the log rather than a full snapshot.
        max_in_snapshot_log_to_keep: every.min(1000),
        // Purge in chunks, not entry by entry: each purge is a write.
        purge_batch_size: every.min(1024),
        ..Default::default()
    };
    cfg.validate().map(Arc::new).map_err(|e| ShardError::Fatal { shard: 0, msg: format!("raft config: {e}") })
}

/// The shard count decides where every device lives (`hash(deviceId) mod S`): reopening a data
/// directory with another count would make existing devices look lost. The count is recorded on first
/// open and a mismatch is refused with a message naming both numbers.
pub(super) fn check_layout(config: &ShardsConfig) -> Result<(), ShardError> {
    let path = config.data_dir.join(LAYOUT_FILE);
    let want = config.shard_count.max(1);
    let io = |e: std::io::Error| ShardError::Storage { shard: 0, msg: format!("{}: {e}", path.display()) };
    match recorded_shard_count(&config.data_dir)? {
        Some(have) if have != want => Err(ShardError::Fatal {
            shard: 0,
            msg: format!(
                "data directory {} was created with {have} shards; refusing to open it with {want} \
                 (devices would hash to other shards)",
                config.data_dir.display()
            ),
        }),
        Some(_) => Ok(()),
        None => {
            crate::secrets::create_private_dir(&config.data_dir).map_err(io)?;
            let tmp = config.data_dir.join("shard-count.tmp");
            std::fs::write(&tmp, format!("{want}\n")).map_err(io)?;
            std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(io)?;
            std::fs::rename(&tmp, &path).map_err(io)?;
            Ok(())
        }
    }
}

/// Where a data directory records its shard count.
const LAYOUT_FILE: &str = "shard-count";

/// The shard count `data_dir` was created with; `None` for a directory no node has opened yet. A node
/// started without `--shard-count` keeps this count, so a restart or an upgrade never depends on the
/// default of the release it runs.
pub fn recorded_shard_count(data_dir: &std::path::Path) -> Result<Option<u32>, ShardError> {
    let path = data_dir.join(LAYOUT_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map(Some).map_err(|_| ShardError::Fatal {
            shard: 0,
            msg: format!("{} holds {:?}, not a shard count", path.display(), text.trim()),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ShardError::Storage { shard: 0, msg: format!("{}: {e}", path.display()) }),
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    fn config(dir: &std::path::Path, shard_count: u32) -> ShardsConfig {
        ShardsConfig {
            data_dir: dir.to_path_buf(),
            node_id: 1,
            shard_count,
            snapshot_every: 1000,
            events: None,
            transport: None,
            members: BTreeMap::new(),
            join: None,
            heartbeat_ms: 100,
            proposals_in_flight: 0,
        }
    }

    #[test]
    fn test_shard_count_mismatch_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        check_layout(&config(dir.path(), 8)).unwrap();
        check_layout(&config(dir.path(), 8)).unwrap();
        let err = check_layout(&config(dir.path(), 16)).unwrap_err();
        assert!(err.to_string().contains("created with 8 shards"), "{err}");
    }

    #[test]
    fn the_recorded_count_is_read_back_and_a_new_directory_has_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(recorded_shard_count(dir.path()).unwrap(), None);
        check_layout(&config(dir.path(), 16)).unwrap();
        assert_eq!(recorded_shard_count(dir.path()).unwrap(), Some(16));
        std::fs::write(dir.path().join(LAYOUT_FILE), "sixteen\n").unwrap();
        let err = recorded_shard_count(dir.path()).unwrap_err();
        assert!(err.to_string().contains("not a shard count"), "{err}");
    }
}
