//! Durable sharded state: one openraft group per shard, all groups of a node storing their logs, votes
//! and snapshots in one fjall database (`data_dir/raft`). A single writer task group-commits the
//! writes of every shard: one batch, one fsync, then every append of the batch is acknowledged (see
//! [`group_commit`] for the durability argument).
//!
//! - [`types`]: the openraft type configuration (`Command` in, `Applied` out).
//! - [`store`]: fjall handles, key layout, reads.
//! - [`group_commit`]: the single writer.
//! - [`log_store`]: openraft's `RaftLogStorage` for one shard.
//! - [`state_machine`]: openraft's `RaftStateMachine` over `model::ShardState`, durable snapshots.
//! - [`network`]: the per-node router every group shares (single-voter: no peers yet).

pub mod group_commit;
pub mod log_store;
pub mod network;
pub mod state_machine;
pub mod store;
pub mod types;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::error::{ClientWriteError, Fatal, InitializeError, LinearizableReadError, RaftError};
use openraft::{ReadPolicy, SnapshotPolicy};
use tokio::sync::{mpsc, oneshot};

use crate::ids::{NodeId, ShardId};
use crate::model::{Applied, Command, ShardState};
use log_store::LogStore;
use network::{NetworkFactory, ShardRouter};
use state_machine::{SharedState, StateMachine};
use store::Store;
use types::{ClientWriteResult, Node, Raft, ShardResponder, TypeConfig};

/// Errors of the shard layer, protocol-free.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ShardError {
    /// This node does not lead the shard; `leader` is the current leader if known. Retryable.
    #[error("node does not lead shard {shard} (leader: {leader:?})")]
    NotLeader { shard: ShardId, leader: Option<NodeId> },
    /// Storage failed: the shard stops serving rather than acknowledge what it could not persist.
    #[error("storage error on shard {shard}: {msg}")]
    Storage { shard: ShardId, msg: String },
    /// The request did not complete in time; it may or may not have been applied. Retryable.
    #[error("shard {shard} timed out")]
    Timeout { shard: ShardId },
    #[error("shard {shard} is shutting down")]
    ShuttingDown { shard: ShardId },
    #[error("shard {shard}: {msg}")]
    Fatal { shard: ShardId, msg: String },
}

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
}

/// Receives the events of every applied command: on every replica, in log order within a shard, after
/// the command is committed. Called on the state machine's task, so it must not block; the notification
/// hub only queues.
#[derive(Clone)]
pub struct EventSink(pub Arc<dyn Fn(ShardId, &[crate::model::Event]) + Send + Sync>);

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventSink")
    }
}

/// How long `write` and `read` wait before answering `Timeout` (the request may still apply).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `Shards::open` waits for every group to elect itself and catch up.
const OPEN_TIMEOUT: Duration = Duration::from_secs(60);

type Reply = oneshot::Sender<Result<Applied, ShardError>>;

/// One shard: its Raft group and its applied state.
pub struct Shard {
    pub id: ShardId,
    raft: Raft,
    state: SharedState,
    /// Pipelined proposals, in call order, to the task that hands them to Raft. `None` once shut down.
    proposals: Mutex<Option<mpsc::UnboundedSender<(Command, Reply)>>>,
}

impl Shard {
    /// Proposes a command and waits until it is committed (durable on a majority) and applied.
    pub async fn write(&self, cmd: Command) -> Result<Applied, ShardError> {
        match tokio::time::timeout(REQUEST_TIMEOUT, self.raft.client_write(cmd)).await {
            Err(_) => Err(ShardError::Timeout { shard: self.id }),
            Ok(Ok(resp)) => Ok(resp.data),
            Ok(Err(RaftError::APIError(e))) => Err(write_error(self.id, e)),
            Ok(Err(RaftError::Fatal(f))) => Err(fatal_error(self.id, &f)),
        }
    }

    /// Proposes without waiting: commands proposed in this order are applied in this order, and
    /// `reply` receives the outcome after commit. This is how twin actors pipeline.
    pub fn write_pipelined(&self, cmd: Command, reply: tokio::sync::oneshot::Sender<Result<Applied, ShardError>>) {
        let tx = self.proposals.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(tx) = tx else {
            let _ = reply.send(Err(ShardError::ShuttingDown { shard: self.id }));
            return;
        };
        if let Err(mpsc::error::SendError((_, reply))) = tx.send((cmd, reply)) {
            let _ = reply.send(Err(ShardError::ShuttingDown { shard: self.id }));
        }
    }

    /// A linearizable read of the applied state (read index on the leader).
    pub async fn read<R>(&self, f: impl FnOnce(&ShardState) -> R) -> Result<R, ShardError> {
        let check = self.raft.ensure_linearizable(ReadPolicy::ReadIndex);
        match tokio::time::timeout(REQUEST_TIMEOUT, check).await {
            Err(_) => Err(ShardError::Timeout { shard: self.id }),
            Ok(Ok(_)) => Ok(self.read_local(f)),
            Ok(Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(fwd)))) => {
                Err(ShardError::NotLeader { shard: self.id, leader: fwd.leader_id })
            }
            Ok(Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_)))) => {
                Err(ShardError::Timeout { shard: self.id })
            }
            Ok(Err(RaftError::Fatal(f))) => Err(fatal_error(self.id, &f)),
        }
    }

    /// Reads the local applied state without a linearizability check.
    pub fn read_local<R>(&self, f: impl FnOnce(&ShardState) -> R) -> R {
        let applied = self.state.read().unwrap_or_else(|e| e.into_inner());
        f(&applied.state)
    }

    /// Why the group stopped, if it did: a storage failure is reported as such, not as a shutdown.
    fn stopped_error(raft: &Raft, shard: ShardId) -> ShardError {
        match &raft.metrics().borrow_watched().running_state {
            Err(f) => fatal_error(shard, f),
            Ok(()) => ShardError::ShuttingDown { shard },
        }
    }

    /// Hands pipelined proposals to Raft one after the other, so Raft sees them in call order.
    async fn run_proposer(shard: ShardId, raft: Raft, mut rx: mpsc::UnboundedReceiver<(Command, Reply)>) {
        while let Some((cmd, reply)) = rx.recv().await {
            let r = raft.clone();
            let responder = ShardResponder::new(move |res: Option<ClientWriteResult>| {
                let out = match res {
                    Some(Ok(resp)) => Ok(resp.data),
                    Some(Err(e)) => Err(write_error(shard, e)),
                    None => Err(Shard::stopped_error(&r, shard)),
                };
                let _ = reply.send(out);
            });
            // On a fatal error the responder is dropped unanswered and reports why itself.
            let _ = raft.client_write_ff(cmd, Some(responder)).await;
        }
    }
}

fn write_error(shard: ShardId, e: ClientWriteError<TypeConfig>) -> ShardError {
    match e {
        ClientWriteError::ForwardToLeader(f) => ShardError::NotLeader { shard, leader: f.leader_id },
        // Discarded on a leader change: it may still commit through the new leader, so the outcome is
        // unknown (retry with the same request id; apply deduplicates).
        ClientWriteError::LogEntryDiscarded(_) => ShardError::Timeout { shard },
        other => ShardError::Fatal { shard, msg: other.to_string() },
    }
}

fn fatal_error(shard: ShardId, f: &Fatal<TypeConfig>) -> ShardError {
    match f {
        Fatal::StorageError(e) => ShardError::Storage { shard, msg: e.to_string() },
        Fatal::Stopped => ShardError::ShuttingDown { shard },
        Fatal::Panicked => ShardError::Fatal { shard, msg: "raft core panicked".into() },
    }
}

fn storage_error(shard: ShardId, e: impl std::fmt::Display) -> ShardError {
    ShardError::Storage { shard, msg: e.to_string() }
}

/// Raft timing for many groups on a small box. openraft ticks every group separately (100 groups at a
/// 50 ms heartbeat cost ~30 % of a core idle on 2 cores), so heartbeats are slow and elections slower:
/// a single voter never waits on either, and with replicas a 1–2 s failover still beats etcd's.
fn raft_config(config: &ShardsConfig) -> Result<Arc<openraft::Config>, ShardError> {
    let every = config.snapshot_every.max(1);
    let cfg = openraft::Config {
        cluster_name: "twinhub".into(),
        heartbeat_interval: 250,
        election_timeout_min: 1000,
        election_timeout_max: 2000,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(every),
        // Nothing lags behind a single voter; the cluster issue may keep a tail for slow followers.
        max_in_snapshot_log_to_keep: 0,
        // Purge in chunks, not entry by entry: each purge is a write.
        purge_batch_size: every.min(1024),
        ..Default::default()
    };
    cfg.validate().map(Arc::new).map_err(|e| ShardError::Fatal { shard: 0, msg: format!("raft config: {e}") })
}

/// All shards of a node and their shared storage.
pub struct Shards {
    pub shards: Vec<Arc<Shard>>,
    store: Arc<Store>,
}

impl Shards {
    /// Opens (or creates) the node's database, starts every shard's Raft group (a single voter for
    /// now) and waits until each has a leader.
    pub async fn open(config: ShardsConfig) -> Result<Shards, ShardError> {
        check_layout(&config)?;
        let store = Arc::new(Store::open(&config.data_dir.join("raft")).map_err(|e| storage_error(0, e))?);
        let raft_config = raft_config(&config)?;
        let router = ShardRouter::default();
        let node_id = config.node_id;

        let mut rafts = Vec::new();
        for id in 0..config.shard_count.max(1) {
            let sm = StateMachine::open(id, store.clone(), config.events.clone()).map_err(|e| storage_error(id, e))?;
            let state = sm.shared();
            let log = LogStore::new(id, store.clone());
            let network = NetworkFactory::new(router.clone(), id);
            let raft = Raft::new(node_id, raft_config.clone(), network, log, sm)
                .await
                .map_err(|f| fatal_error(id, &f))?;
            // Only a pristine group is initialized: a restarted one has its vote and log already.
            let initialized = raft.is_initialized().await.map_err(|f| fatal_error(id, &f))?;
            if !initialized {
                let members = BTreeMap::from([(node_id, Node::default())]);
                match raft.initialize(members).await {
                    Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                    Err(RaftError::APIError(e)) => return Err(ShardError::Fatal { shard: id, msg: e.to_string() }),
                    Err(RaftError::Fatal(f)) => return Err(fatal_error(id, &f)),
                }
            }
            rafts.push((id, raft, state));
        }

        let mut shards = Vec::new();
        for (id, raft, state) in rafts {
            // Leader, then a read index: the state machine has re-applied everything committed.
            raft.wait(Some(OPEN_TIMEOUT))
                .current_leader(node_id, format!("shard {id} elects this node"))
                .await
                .map_err(|e| ShardError::Fatal { shard: id, msg: format!("no leader: {e}") })?;
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(Shard::run_proposer(id, raft.clone(), rx));
            let shard = Shard { id, raft, state, proposals: Mutex::new(Some(tx)) };
            shard.read(|_| ()).await?;
            shards.push(Arc::new(shard));
        }
        Ok(Shards { shards, store })
    }

    pub fn shard_count(&self) -> u32 {
        self.shards.len() as u32
    }

    pub fn for_device(&self, device_id: &str) -> &Arc<Shard> {
        &self.shards[crate::ids::shard_of(device_id, self.shard_count()) as usize]
    }

    /// fsyncs of the node's Raft database so far; against the number of writes it shows how well the
    /// group commit batches (metrics, benches).
    pub fn storage_syncs(&self) -> u64 {
        self.store.writer.sync_count()
    }

    /// Stops every Raft group and flushes storage.
    pub async fn shutdown(&self) {
        for shard in &self.shards {
            shard.proposals.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Err(e) = shard.raft.shutdown().await {
                tracing::warn!(shard = shard.id, "raft shutdown: {e}");
            }
        }
        if let Err(e) = self.store.writer.stop().await {
            tracing::error!("raft storage final sync failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests;

/// The shard count decides where every device lives (`hash(deviceId) mod S`): reopening a data
/// directory with another count would make existing devices look lost. The count is recorded on first
/// open and a mismatch is refused with a message naming both numbers.
fn check_layout(config: &ShardsConfig) -> Result<(), ShardError> {
    let path = config.data_dir.join("shard-count");
    let want = config.shard_count.max(1);
    let io = |e: std::io::Error| ShardError::Storage { shard: 0, msg: format!("{}: {e}", path.display()) };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let have: u32 = text.trim().parse().map_err(|_| ShardError::Fatal {
                shard: 0,
                msg: format!("{} holds {:?}, not a shard count", path.display(), text.trim()),
            })?;
            if have != want {
                return Err(ShardError::Fatal {
                    shard: 0,
                    msg: format!(
                        "data directory {} was created with {have} shards; refusing to open it with {want} \
                         (devices would hash to other shards)",
                        config.data_dir.display()
                    ),
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(&config.data_dir).map_err(io)?;
            let tmp = config.data_dir.join("shard-count.tmp");
            std::fs::write(&tmp, format!("{want}\n")).map_err(io)?;
            std::fs::File::open(&tmp).and_then(|f| f.sync_all()).map_err(io)?;
            std::fs::rename(&tmp, &path).map_err(io)?;
            Ok(())
        }
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod layout_tests {
    use super::*;

    fn config(dir: &std::path::Path, shard_count: u32) -> ShardsConfig {
        ShardsConfig { data_dir: dir.to_path_buf(), node_id: 1, shard_count, snapshot_every: 1000, events: None }
    }

    #[test]
    fn test_shard_count_mismatch_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        check_layout(&config(dir.path(), 8)).unwrap();
        check_layout(&config(dir.path(), 8)).unwrap();
        let err = check_layout(&config(dir.path(), 16)).unwrap_err();
        assert!(err.to_string().contains("created with 8 shards"), "{err}");
    }
}
