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
//! - [`network`]: the per-node router every group shares; over the cluster transport when there is one.

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

/// Errors of the shard layer, protocol-free. Serializable: a forwarded request carries them back.
#[derive(Debug, Clone, thiserror::Error, serde::Serialize, serde::Deserialize)]
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
    /// Inter-node transport; `None`: a single-node hub whose groups have one voter.
    pub transport: Option<crate::cluster::transport::Transport>,
    /// Founding members (id → inter-node address) every group starts with. Only the lowest id
    /// initializes the groups; the others learn the membership from its log. Empty: this node alone.
    pub members: BTreeMap<NodeId, String>,
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

/// Transport call that changes a shard's voters on its leader: `postcard(MemberChange)` in,
/// `postcard(Result<(), ShardError>)` out.
pub const MEMBER_CALL: &str = "shard.member";

/// A membership change of one shard, run on its leader.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum MemberChange {
    Add { shard: ShardId, node: NodeId, addr: String },
    Remove { shard: ShardId, node: NodeId },
}

impl MemberChange {
    fn shard(&self) -> ShardId {
        match self {
            MemberChange::Add { shard, .. } | MemberChange::Remove { shard, .. } => *shard,
        }
    }
}

/// How long one shard's membership change may look for its leader and wait for a learner to catch up.
const MEMBER_DEADLINE: Duration = Duration::from_secs(120);

/// Name of the transport call that answers a shard's read index (`postcard(ShardId)` in,
/// `postcard(Result<Option<u64>, ShardError>)` out).
pub const READ_INDEX_CALL: &str = "shard.read-index";

const REMOTE_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `Shards::open` waits for every group to elect itself and catch up.
const OPEN_TIMEOUT: Duration = Duration::from_secs(60);

type Reply = oneshot::Sender<Result<Applied, ShardError>>;

/// One shard: its Raft group and its applied state.
pub struct Shard {
    pub id: ShardId,
    node_id: NodeId,
    raft: Raft,
    transport: Option<crate::cluster::transport::Transport>,
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

    /// A linearizable read of the applied state: on the leader a read index; on a follower the
    /// leader's read index fetched over the transport, then a wait until this replica has applied up to
    /// it (so any replica answers what a majority has committed, without moving the request).
    pub async fn read<R>(&self, f: impl FnOnce(&ShardState) -> R) -> Result<R, ShardError> {
        self.linearize().await?;
        Ok(self.read_local(f))
    }

    /// Waits until a read of this replica's applied state is linearizable (see [`Shard::read`]).
    pub async fn linearize(&self) -> Result<(), ShardError> {
        match self.read_index().await {
            Ok(_) => Ok(()),
            Err(ShardError::NotLeader { leader: Some(leader), .. }) if leader != self.node_id && self.transport.is_some() => {
                let index = self.remote_read_index(leader).await?;
                if let Some(index) = index {
                    self.raft
                        .wait(Some(REQUEST_TIMEOUT))
                        .applied_index_at_least(Some(index), "read index applied")
                        .await
                        .map_err(|_| ShardError::Timeout { shard: self.id })?;
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The leader's read index: the log index a linearizable read must have applied.
    pub async fn read_index(&self) -> Result<Option<u64>, ShardError> {
        let check = self.raft.ensure_linearizable(ReadPolicy::ReadIndex);
        match tokio::time::timeout(REQUEST_TIMEOUT, check).await {
            Err(_) => Err(ShardError::Timeout { shard: self.id }),
            Ok(Ok(read)) => Ok(Some(read.log_id().index)),
            Ok(Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(fwd)))) => {
                Err(ShardError::NotLeader { shard: self.id, leader: fwd.leader_id })
            }
            Ok(Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_)))) => {
                Err(ShardError::Timeout { shard: self.id })
            }
            Ok(Err(RaftError::Fatal(f))) => Err(fatal_error(self.id, &f)),
        }
    }

    async fn remote_read_index(&self, leader: NodeId) -> Result<Option<u64>, ShardError> {
        let Some(t) = &self.transport else { return Err(ShardError::NotLeader { shard: self.id, leader: Some(leader) }) };
        let body = postcard::to_allocvec(&self.id).map_err(|e| ShardError::Fatal { shard: self.id, msg: e.to_string() })?;
        let answer = t.call(leader, READ_INDEX_CALL, body.into(), Some(REMOTE_READ_TIMEOUT)).await.map_err(|e| {
            tracing::debug!(shard = self.id, leader, "remote read index: {e}");
            ShardError::NotLeader { shard: self.id, leader: None }
        })?;
        let r: Result<Option<u64>, ShardError> =
            postcard::from_bytes(&answer).map_err(|e| ShardError::Fatal { shard: self.id, msg: e.to_string() })?;
        r
    }

    /// Makes `node` a voter of this shard: first a learner that has caught up (blocking), then a voter,
    /// one membership change at a time as openraft requires. Idempotent. Leader only.
    pub async fn add_voter(&self, node: NodeId, addr: &str) -> Result<(), ShardError> {
        let voters: Vec<NodeId> = self.raft.metrics().borrow_watched().membership_config.membership().voter_ids().collect();
        if voters.contains(&node) {
            return Ok(());
        }
        let step = |r: Result<_, RaftError<TypeConfig, ClientWriteError<TypeConfig>>>| match r {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(e)) => Err(write_error(self.id, e)),
            Err(RaftError::Fatal(f)) => Err(fatal_error(self.id, &f)),
        };
        step(self.raft.add_learner(node, Node { addr: addr.to_string() }, true).await)?;
        step(self.raft.change_membership(openraft::ChangeMembers::AddVoterIds([node].into()), false).await)
    }

    /// Removes `node` from this shard's voters (and from its learners). Idempotent. Leader only.
    pub async fn remove_voter(&self, node: NodeId) -> Result<(), ShardError> {
        let m = self.raft.metrics().borrow_watched().membership_config.clone();
        let is_voter = m.membership().voter_ids().any(|v| v == node);
        let is_learner = m.membership().learner_ids().any(|v| v == node);
        if !is_voter && !is_learner {
            return Ok(());
        }
        let r = self.raft.change_membership(openraft::ChangeMembers::RemoveVoters([node].into()), false).await;
        match r {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(e)) => Err(write_error(self.id, e)),
            Err(RaftError::Fatal(f)) => Err(fatal_error(self.id, &f)),
        }
    }

    /// The current leader as this replica knows it.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow_watched().current_leader
    }

    /// Whether this node leads the shard now.
    pub fn is_leader(&self) -> bool {
        self.leader() == Some(self.node_id)
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
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
/// 50 ms heartbeat cost ~30 % of a core idle on 2 cores), so tens of groups per node at a 100 ms
/// heartbeat. A follower starts an election only after the leader lease (`election_timeout_max`) has
/// run out *and* its own random election timeout, so failover takes roughly max + [min, max]:
/// 0.6 + 0.3…0.6 s here (the 1–2 s of the single-node era measured 3.3–3.9 s on a 3-node group).
fn raft_config(config: &ShardsConfig) -> Result<Arc<openraft::Config>, ShardError> {
    let every = config.snapshot_every.max(1);
    let cfg = openraft::Config {
        cluster_name: "twinhub".into(),
        heartbeat_interval: 100,
        election_timeout_min: 300,
        election_timeout_max: 600,
        // A partitioned node rejoining must not depose a healthy leader by bumping terms.
        enable_pre_vote: Some(true),
        // Snapshots travel in one RPC: the default 200 ms deadline cannot carry a large shard.
        install_snapshot_timeout: 30_000,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(every),
        // A follower a little behind catches up from the log rather than a full snapshot.
        max_in_snapshot_log_to_keep: every.min(1000),
        // Purge in chunks, not entry by entry: each purge is a write.
        purge_batch_size: every.min(1024),
        ..Default::default()
    };
    cfg.validate().map(Arc::new).map_err(|e| ShardError::Fatal { shard: 0, msg: format!("raft config: {e}") })
}

/// One replica's view of a shard.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ShardStatus {
    pub shard: ShardId,
    pub leader: Option<NodeId>,
    pub is_leader: bool,
    pub term: u64,
    pub last_log_index: u64,
    pub committed: u64,
    pub applied: u64,
    pub voters: Vec<NodeId>,
    pub learners: Vec<NodeId>,
    /// Leader only: entries each replica is behind this node's last log index.
    pub lag: BTreeMap<NodeId, u64>,
    /// `false` once the group stopped on a storage error.
    pub healthy: bool,
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
        let router = config.transport.clone().map_or_else(ShardRouter::default, ShardRouter::new);
        let node_id = config.node_id;
        let clustered = config.transport.is_some() && config.members.len() > 1;
        // The founding node forms the groups; the others wait to be contacted.
        let founder = config.members.keys().next().copied().unwrap_or(node_id) == node_id;

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
            if let Some(t) = &config.transport {
                t.groups().register(id, raft.clone());
            }
            let initialized = raft.is_initialized().await.map_err(|f| fatal_error(id, &f))?;
            if !initialized && founder {
                let members: BTreeMap<NodeId, Node> = if clustered {
                    config.members.iter().map(|(id, addr)| (*id, Node { addr: addr.clone() })).collect()
                } else {
                    BTreeMap::from([(node_id, Node::default())])
                };
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
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(Shard::run_proposer(id, raft.clone(), rx));
            let shard = Shard { id, node_id, raft, transport: config.transport.clone(), state, proposals: Mutex::new(Some(tx)) };
            if !clustered {
                // Leader, then a read index: the state machine has re-applied everything committed.
                // A clustered node does not wait here (its peers may not be up yet): `/ready` says
                // when every shard has a leader.
                shard
                    .raft
                    .wait(Some(OPEN_TIMEOUT))
                    .current_leader(node_id, format!("shard {id} elects this node"))
                    .await
                    .map_err(|e| ShardError::Fatal { shard: id, msg: format!("no leader: {e}") })?;
                shard.read(|_| ()).await?;
            }
            shards.push(Arc::new(shard));
        }
        if let Some(t) = &config.transport {
            register_read_index(t, &shards);
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

    /// Adds `node` (reachable at `addr`) as a voter of every shard, or removes it, one shard and one
    /// membership step at a time, each on the shard's current leader (here or over the transport).
    /// Returns how many shards changed; stops at the first shard that fails.
    pub async fn change_members(&self, add: Option<&str>, node: NodeId) -> Result<usize, ShardError> {
        let mut changed = 0;
        for s in &self.shards {
            let change = match add {
                Some(addr) => MemberChange::Add { shard: s.id, node, addr: addr.to_string() },
                None => MemberChange::Remove { shard: s.id, node },
            };
            let deadline = std::time::Instant::now() + MEMBER_DEADLINE;
            loop {
                let r = match s.leader() {
                    Some(l) if l == s.node_id => run_member_change(s, &change).await,
                    Some(l) => remote_member_change(s, l, &change).await,
                    None => Err(ShardError::NotLeader { shard: s.id, leader: None }),
                };
                match r {
                    Ok(()) => break,
                    Err(ShardError::NotLeader { .. } | ShardError::Timeout { .. }) if std::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
            changed += 1;
            tracing::info!(shard = s.id, node, add = add.is_some(), "membership changed");
        }
        Ok(changed)
    }

    /// Keeps the transport's peer table in step with the members every shard's membership names (a
    /// follower never dials the other followers for Raft, but forwards writes to whichever leads).
    pub fn learn_peers(&self) {
        let Some(t) = self.shards.first().and_then(|s| s.transport.clone()) else { return };
        for s in &self.shards {
            let m = s.raft.metrics().borrow_watched().membership_config.clone();
            for (id, node) in m.membership().nodes() {
                if *id != s.node_id && !node.addr.is_empty() {
                    t.peers().learn(*id, &node.addr);
                }
            }
        }
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.shards.first().map(|s| s.node_id).unwrap_or(0)
    }

    /// Spreads leadership evenly: every shard this node leads but whose preferred leader (from the
    /// balanced placement over its voters, [`crate::cluster::placement::Placement`]) is another,
    /// caught-up voter is handed to that voter. Runs periodically on every node; each node only gives
    /// away what it leads, so nodes never fight over a shard.
    pub async fn balance_leaders(&self) -> usize {
        let mut moved = 0;
        for st in self.status() {
            if !st.is_leader || st.voters.len() < 2 {
                continue;
            }
            let placement = crate::cluster::placement::Placement::initial(&st.voters, self.shard_count(), st.voters.len());
            let Some(preferred) = placement.shards.get(st.shard as usize).map(|p| p.leader) else { continue };
            let caught_up = st.lag.get(&preferred).is_some_and(|lag| *lag < 100);
            if preferred != st.leader.unwrap_or(0) && caught_up {
                if let Some(shard) = self.shards.get(st.shard as usize) {
                    tracing::info!(shard = st.shard, to = preferred, "moving leadership to its preferred node");
                    if shard.raft.trigger().transfer_leader(preferred).await.is_ok() {
                        moved += 1;
                    }
                }
            }
        }
        moved
    }

    /// What this replica knows of every shard (for `/cluster/status` and metrics).
    pub fn status(&self) -> Vec<ShardStatus> {
        self.shards
            .iter()
            .map(|s| {
                let m = s.raft.metrics().borrow_watched().clone();
                let membership = m.membership_config.membership();
                let last = m.last_log_index.unwrap_or(0);
                ShardStatus {
                    shard: s.id,
                    leader: m.current_leader,
                    is_leader: m.current_leader == Some(s.node_id),
                    term: m.current_term,
                    last_log_index: last,
                    committed: m.local_committed.map(|l| l.index).unwrap_or(0),
                    applied: m.last_applied.map(|l| l.index).unwrap_or(0),
                    voters: membership.voter_ids().collect(),
                    learners: membership.learner_ids().collect(),
                    lag: m
                        .replication
                        .as_ref()
                        .map(|r| r.iter().map(|(n, l)| (*n, last.saturating_sub(l.map(|l| l.index).unwrap_or(0)))).collect())
                        .unwrap_or_default(),
                    healthy: m.running_state.is_ok(),
                }
            })
            .collect()
    }

    /// Every shard has a known leader and this replica has applied something (a node that just
    /// joined or restarted has caught up with the committed log as far as it knows).
    pub fn ready(&self) -> bool {
        self.shards.iter().all(|s| {
            let m = s.raft.metrics().borrow_watched().clone();
            m.current_leader.is_some() && m.running_state.is_ok()
        })
    }

    /// Stops every Raft group and flushes storage.
    pub async fn shutdown(&self) {
        for shard in &self.shards {
            if let Some(t) = &shard.transport {
                t.groups().unregister(shard.id);
            }
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

async fn run_member_change(s: &Shard, change: &MemberChange) -> Result<(), ShardError> {
    match change {
        MemberChange::Add { node, addr, .. } => s.add_voter(*node, addr).await,
        MemberChange::Remove { node, .. } => s.remove_voter(*node).await,
    }
}

async fn remote_member_change(s: &Shard, leader: NodeId, change: &MemberChange) -> Result<(), ShardError> {
    let Some(t) = &s.transport else { return Err(ShardError::NotLeader { shard: s.id, leader: Some(leader) }) };
    let body = postcard::to_allocvec(change).map_err(|e| ShardError::Fatal { shard: s.id, msg: e.to_string() })?;
    let answer = t.call(leader, MEMBER_CALL, body.into(), Some(MEMBER_DEADLINE)).await.map_err(|e| {
        tracing::debug!(shard = s.id, leader, "membership change on the leader: {e}");
        ShardError::Timeout { shard: s.id }
    })?;
    postcard::from_bytes::<Result<(), ShardError>>(&answer).map_err(|e| ShardError::Fatal { shard: s.id, msg: e.to_string() })?
}

/// Answers peers' read-index requests for the shards of this node.
fn register_read_index(t: &crate::cluster::transport::Transport, shards: &[Arc<Shard>]) {
    let by_id: Arc<BTreeMap<ShardId, Arc<Shard>>> = Arc::new(shards.iter().map(|s| (s.id, s.clone())).collect());
    t.handlers().register(READ_INDEX_CALL, move |_from, body: bytes::Bytes| {
        let by_id = by_id.clone();
        async move {
            let id: ShardId = postcard::from_bytes(&body)
                .map_err(|e| crate::cluster::transport::CallError(format!("bad read-index request: {e}")))?;
            let r = match by_id.get(&id) {
                Some(s) => s.read_index().await,
                None => Err(ShardError::NotLeader { shard: id, leader: None }),
            };
            postcard::to_allocvec(&r)
                .map(bytes::Bytes::from)
                .map_err(|e| crate::cluster::transport::CallError(e.to_string()))
        }
    });
    let by_id: Arc<BTreeMap<ShardId, Arc<Shard>>> = Arc::new(shards.iter().map(|s| (s.id, s.clone())).collect());
    t.handlers().register(MEMBER_CALL, move |_from, body: bytes::Bytes| {
        let by_id = by_id.clone();
        async move {
            let change: MemberChange = postcard::from_bytes(&body)
                .map_err(|e| crate::cluster::transport::CallError(format!("bad membership change: {e}")))?;
            let r = match by_id.get(&change.shard()) {
                Some(s) => run_member_change(s, &change).await,
                None => Err(ShardError::NotLeader { shard: change.shard(), leader: None }),
            };
            postcard::to_allocvec(&r)
                .map(bytes::Bytes::from)
                .map_err(|e| crate::cluster::transport::CallError(e.to_string()))
        }
    });
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
        ShardsConfig { data_dir: dir.to_path_buf(), node_id: 1, shard_count, snapshot_every: 1000, events: None, transport: None, members: BTreeMap::new() }
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
