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

mod backoff;
pub mod group_commit;
pub mod log_store;
pub mod network;
pub mod reconcile;
pub mod state_machine;
pub mod store;
pub mod tail;
pub mod types;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::error::{ClientWriteError, Fatal, InitializeError, LinearizableReadError, RaftError};
use openraft::{ReadPolicy, SnapshotPolicy};
use tokio::sync::{mpsc, oneshot};

use crate::cluster::map::{ClusterMap, ClusterOp};
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
    /// A cluster-map change the map refused (unknown or retired node, too few nodes left, ...).
    #[error("{msg}")]
    Refused { msg: String },
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
    /// A member's address this node joins through (it is then not a founder).
    pub join: Option<String>,
    /// Raft heartbeat; elections time out after 3 to 6 heartbeats.
    pub heartbeat_ms: u64,
}

/// Receives the events of a shard's applied entries, in log order.
pub type PublishFn = Arc<dyn Fn(ShardId, &[crate::model::Event]) + Send + Sync>;

/// Receives the events of every applied command: on every replica, in log order within a shard, after
/// the command is committed. Called on the state machine's task, so it must not block; the notification
/// hub only queues.
#[derive(Clone)]
pub struct EventSink {
    /// Events of applied entries, in log order per shard.
    pub publish: PublishFn,
    /// Some events of the shard could not be had (a tail fell behind its replica's ring): whoever
    /// follows them must be told rather than left with a silent gap.
    pub gap: Arc<dyn Fn(ShardId) + Send + Sync>,
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventSink")
    }
}

/// How long `write` and `read` wait before answering `Timeout` (the request may still apply).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

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
            Err(ShardError::NotLeader { leader: Some(leader), .. })
                if leader != self.node_id && self.transport.is_some() =>
            {
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
        let Some(t) = &self.transport else {
            return Err(ShardError::NotLeader { shard: self.id, leader: Some(leader) });
        };
        let body =
            postcard::to_allocvec(&self.id).map_err(|e| ShardError::Fatal { shard: self.id, msg: e.to_string() })?;
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
        let voters: Vec<NodeId> =
            self.raft.metrics().borrow_watched().membership_config.membership().voter_ids().collect();
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

/// Where a request for one shard can go (see [`Shards::route`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub leader: Option<NodeId>,
    pub replicas: Vec<NodeId>,
    /// This node has a replica: its Raft group learns the leader by itself.
    pub hosted: bool,
}

/// Group id of the metadata Raft group, which holds the [`ClusterMap`]. Data shards are `0..shard_count`.
pub const META: ShardId = ShardId::MAX;

/// The shards of a node: the groups it replicates (opened and closed as the cluster map moves
/// replicas), the metadata group in a cluster, and what it knows of shards it does not replicate
/// (their replicas from the map, their last known leader).
pub struct Shards {
    node_id: NodeId,
    shard_count: u32,
    config: ShardsConfig,
    raft_config: Arc<openraft::Config>,
    router: ShardRouter,
    store: Arc<Store>,
    groups: std::sync::RwLock<BTreeMap<ShardId, Arc<Shard>>>,
    /// The metadata group; `None` for a single-node hub.
    meta: Option<Arc<Shard>>,
    /// Last leader heard of, for shards this node does not replicate.
    hints: Mutex<HashMap<ShardId, NodeId>>,
    /// Recent events per hosted shard, for peers that tail them.
    rings: tail::Rings,
    /// Shards with a membership change in progress on this node (their leader).
    changing: Mutex<HashSet<ShardId>>,
    /// Leadership transfers tried per shard, backed off so the balancer never fights itself.
    transfers: Mutex<backoff::TransferBackoff>,
    /// Serializes opening and closing groups.
    open_lock: tokio::sync::Mutex<()>,
}

impl Shards {
    /// The Raft configuration of group `id`: the node's, with a snapshot threshold of its own.
    ///
    /// Shards written at the same rate reach the same entry count together; with one threshold they
    /// would all snapshot at once, and every snapshot (several MiB: the state and its retry window)
    /// goes through the one group-commit journal that carries every shard's appends, so writes stalled
    /// for hundreds of milliseconds. Thresholds spread over [N, 1.5 N) keep the snapshots apart.
    fn group_config(&self, id: ShardId) -> Arc<openraft::Config> {
        let SnapshotPolicy::LogsSinceLast(every) = self.raft_config.snapshot_policy else {
            return self.raft_config.clone();
        };
        let slots = u64::from(self.shard_count) + 1;
        let slot = if id == META { u64::from(self.shard_count) } else { u64::from(id) % slots };
        let spread = every / 2 * slot / slots;
        let mut cfg = (*self.raft_config).clone();
        cfg.snapshot_policy = SnapshotPolicy::LogsSinceLast(every + spread);
        Arc::new(cfg)
    }
    /// Opens (or creates) the node's database and its groups. A single-node hub opens every shard as a
    /// one-voter group and waits for each to lead. A clustered node opens the metadata group (the lowest
    /// founding id initializes it) and the shards the cluster map places here; the reconciler
    /// ([`Shards::reconcile`]) follows the map from then on.
    pub async fn open(config: ShardsConfig) -> Result<Arc<Shards>, ShardError> {
        check_layout(&config)?;
        let store = Arc::new(Store::open(&config.data_dir.join("raft")).map_err(|e| storage_error(0, e))?);
        let raft_config = raft_config(&config)?;
        let router = config.transport.clone().map_or_else(ShardRouter::default, ShardRouter::new);
        let clustered = config.transport.is_some() && (config.members.len() > 1 || config.join.is_some());
        let mut shards = Shards {
            node_id: config.node_id,
            shard_count: config.shard_count.max(1),
            raft_config,
            router,
            store,
            groups: Default::default(),
            meta: None,
            hints: Default::default(),
            rings: Default::default(),
            changing: Default::default(),
            transfers: Default::default(),
            open_lock: Default::default(),
            config,
        };
        if !clustered {
            for id in 0..shards.shard_count {
                let shard = shards.open_group(id, Some(BTreeMap::from([(shards.node_id, Node::default())]))).await?;
                // Leader, then a read index: the state machine has re-applied everything committed.
                shard
                    .raft
                    .wait(Some(OPEN_TIMEOUT))
                    .current_leader(shards.node_id, format!("shard {id} elects this node"))
                    .await
                    .map_err(|e| ShardError::Fatal { shard: id, msg: format!("no leader: {e}") })?;
                shard.read(|_| ()).await?;
            }
            return Ok(Arc::new(shards));
        }
        // The metadata group: the lowest founding id forms it with the first founding ids as voters.
        let founders: Vec<NodeId> = shards.config.members.keys().copied().collect();
        let founder = founders.first().copied() == Some(shards.node_id) && shards.config.join.is_none();
        let voters: BTreeMap<NodeId, Node> = shards
            .config
            .members
            .iter()
            .take(crate::cluster::map::META_VOTERS)
            .map(|(id, addr)| (*id, Node { addr: addr.clone() }))
            .collect();
        let meta = shards.open_group(META, founder.then_some(voters)).await?;
        shards.meta = Some(meta);
        let shards = Arc::new(shards);
        // Shards the map (as far as this replica applied it) places here.
        let map = shards.map();
        for id in map.shards_of(shards.node_id) {
            shards.ensure_group(id, &map).await?;
        }
        if let Some(t) = &shards.config.transport {
            register_calls(t, &shards);
        }
        Ok(shards)
    }

    /// Opens one group (idempotent). `init`: the voters to initialize it with if it is pristine.
    async fn open_group(&self, id: ShardId, init: Option<BTreeMap<NodeId, Node>>) -> Result<Arc<Shard>, ShardError> {
        let _guard = self.open_lock.lock().await;
        if let Some(s) = self.local(id) {
            return Ok(s);
        }
        if id == META {
            if let Some(m) = &self.meta {
                return Ok(m.clone());
            }
        }
        let sink: Option<state_machine::GroupSink> = match (&self.config.events, id == META) {
            (Some(hub), false) => {
                let hub = hub.clone();
                let rings = self.rings.clone();
                Some(Arc::new(move |index: u64, events: &[crate::model::Event]| {
                    rings.record(id, index, events);
                    (hub.publish)(id, events);
                }))
            }
            _ => None,
        };
        let sm = StateMachine::open(id, self.store.clone(), sink).map_err(|e| storage_error(id, e))?;
        let state = sm.shared();
        let log = LogStore::new(id, self.store.clone());
        let network = NetworkFactory::new(self.router.clone(), id);
        let raft =
            Raft::new(self.node_id, self.group_config(id), network, log, sm).await.map_err(|f| fatal_error(id, &f))?;
        if let Some(t) = &self.config.transport {
            t.groups().register(id, raft.clone());
        }
        // Only a pristine group is initialized: a restarted one has its vote and log already.
        if let Some(members) = init {
            let initialized = raft.is_initialized().await.map_err(|f| fatal_error(id, &f))?;
            if !initialized {
                match raft.initialize(members).await {
                    Ok(()) | Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                    Err(RaftError::APIError(e)) => return Err(ShardError::Fatal { shard: id, msg: e.to_string() }),
                    Err(RaftError::Fatal(f)) => return Err(fatal_error(id, &f)),
                }
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(Shard::run_proposer(id, raft.clone(), rx));
        let shard = Arc::new(Shard {
            id,
            node_id: self.node_id,
            raft,
            transport: self.config.transport.clone(),
            state,
            proposals: Mutex::new(Some(tx)),
        });
        if id != META {
            self.groups.write().unwrap_or_else(|e| e.into_inner()).insert(id, shard.clone());
            tracing::info!(shard = id, "replica opened");
        }
        Ok(shard)
    }

    /// Opens a data shard the map places here; the founding placement's preferred leader initializes
    /// it with the founding replicas (nodes added later always join existing groups as learners).
    async fn ensure_group(&self, id: ShardId, map: &ClusterMap) -> Result<Arc<Shard>, ShardError> {
        if let Some(s) = self.local(id) {
            return Ok(s);
        }
        let init = map.founding.shards.get(id as usize).filter(|f| f.leader == self.node_id).map(|f| {
            f.replicas.iter().map(|n| (*n, Node { addr: map.addr(*n).unwrap_or_default().to_string() })).collect()
        });
        self.open_group(id, init).await
    }

    /// Stops a group this node no longer replicates. Its log and snapshot stay on disk until the shard
    /// comes back here (Raft then truncates what conflicts) or the node is retired.
    async fn close_group(&self, id: ShardId) {
        let _guard = self.open_lock.lock().await;
        let Some(shard) = self.groups.write().unwrap_or_else(|e| e.into_inner()).remove(&id) else { return };
        if let Some(t) = &self.config.transport {
            t.groups().unregister(id);
        }
        shard.proposals.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Err(e) = shard.raft.shutdown().await {
            tracing::warn!(shard = id, "raft shutdown: {e}");
        }
        self.rings.drop_shard(id);
        tracing::info!(shard = id, "replica closed: the shard moved to other nodes");
    }

    pub fn shard_count(&self) -> u32 {
        self.shard_count
    }

    /// The shard owning `device_id`.
    pub fn shard_of(&self, device_id: &str) -> ShardId {
        crate::ids::shard_of(device_id, self.shard_count)
    }

    /// This node's replica of `shard`, if it hosts one.
    pub fn local(&self, shard: ShardId) -> Option<Arc<Shard>> {
        self.groups.read().unwrap_or_else(|e| e.into_inner()).get(&shard).cloned()
    }

    /// The replicas this node hosts, in shard order.
    pub fn hosted(&self) -> Vec<Arc<Shard>> {
        self.groups.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect()
    }

    /// Whether this node is part of a cluster (shards may live elsewhere).
    pub fn is_clustered(&self) -> bool {
        self.meta.is_some()
    }

    /// The cluster map as this node applied it. A single-node hub answers a map of itself.
    pub fn map(&self) -> ClusterMap {
        match &self.meta {
            Some(m) => m.read_local(|s| s.cluster.clone()),
            None => {
                let mut map = ClusterMap::default();
                let members = BTreeMap::from([(self.node_id, String::new())]);
                let _ = map.apply(&ClusterOp::Init { shard_count: self.shard_count, rf: 1, members });
                map
            }
        }
    }

    /// Where to send a request for `shard`: its leader as far as this node knows (its own replica's
    /// view, or the last hint for a shard it does not host) and the shard's replicas from the map.
    pub fn route(&self, shard: ShardId) -> Route {
        let local = self.local(shard);
        let leader = match &local {
            Some(s) => s.leader(),
            None => self.hints.lock().unwrap_or_else(|e| e.into_inner()).get(&shard).copied(),
        };
        Route { leader, replicas: self.map().replicas(shard), hosted: local.is_some() }
    }

    /// Remembers who leads a shard this node does not replicate.
    pub fn note_leader(&self, shard: ShardId, leader: Option<NodeId>) {
        let mut hints = self.hints.lock().unwrap_or_else(|e| e.into_inner());
        match leader {
            Some(l) => {
                hints.insert(shard, l);
            }
            None => {
                hints.remove(&shard);
            }
        }
    }

    /// fsyncs of the node's Raft database so far; against the number of writes it shows how well the
    /// group commit batches (metrics, benches).
    pub fn storage_syncs(&self) -> u64 {
        self.store.writer.sync_count()
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    pub fn rings(&self) -> &tail::Rings {
        &self.rings
    }

    /// Proposes a cluster-map change on the metadata group's leader (here or over the transport).
    pub async fn propose(&self, op: ClusterOp) -> Result<(), ShardError> {
        if self.meta.is_none() {
            return Err(ShardError::Fatal { shard: META, msg: "not a cluster: start the node with --peers".into() });
        }
        match self.propose_meta(crate::model::Op::Cluster(op)).await? {
            Ok(_) => Ok(()),
            Err(e) => Err(ShardError::Refused { msg: e.to_string() }),
        }
    }

    /// The group that keeps cluster-wide records (the cluster map, jobs): the metadata group, or shard
    /// 0 on a single-node hub.
    pub fn meta_group(&self) -> Option<Arc<Shard>> {
        self.meta.clone().or_else(|| self.local(0))
    }

    /// A linearizable read of the cluster-wide records (see [`Shards::meta_group`]).
    pub async fn read_meta<R>(&self, f: impl FnOnce(&ShardState) -> R) -> Result<R, ShardError> {
        let Some(meta) = self.meta_group() else { return Err(ShardError::NotLeader { shard: META, leader: None }) };
        meta.read(f).await
    }

    /// Proposes a command to the cluster-wide records' group on its leader (here or over the
    /// transport), retrying across leader changes for up to 10 s; answers the model's verdict.
    pub async fn propose_meta(
        &self,
        op: crate::model::Op,
    ) -> Result<Result<crate::model::Reply, crate::model::TwinError>, ShardError> {
        let Some(meta) = self.meta_group() else { return Err(ShardError::NotLeader { shard: META, leader: None }) };
        let cmd = Command::new(op, crate::model::now_ms());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let r = match meta.leader() {
                Some(l) if l == self.node_id => meta.write(cmd.clone()).await,
                Some(l) => remote_meta_write(&meta, l, &cmd).await,
                None => Err(ShardError::NotLeader { shard: META, leader: None }),
            };
            match r {
                Ok(applied) => return Ok(applied.result),
                Err(ShardError::NotLeader { .. } | ShardError::Timeout { .. })
                    if std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// What this replica knows of every shard it hosts (for `/cluster/status` and metrics).
    pub fn status(&self) -> Vec<ShardStatus> {
        self.hosted().iter().map(|s| s.status()).collect()
    }

    /// The metadata group's status, in a cluster.
    pub fn meta_status(&self) -> Option<ShardStatus> {
        self.meta.as_ref().map(|m| m.status())
    }

    /// Ready to serve: in a cluster, the map is known and every shard it places here has a leader;
    /// alone, every shard has one.
    pub fn ready(&self) -> bool {
        let has_leader = |s: &Shard| {
            let m = s.raft.metrics().borrow_watched().clone();
            m.current_leader.is_some() && m.running_state.is_ok()
        };
        if let Some(meta) = &self.meta {
            let map = self.map();
            if !has_leader(meta) || !map.is_initialized() {
                return false;
            }
            return map.shards_of(self.node_id).into_iter().all(|id| self.local(id).is_some_and(|s| has_leader(&s)));
        }
        self.hosted().iter().all(|s| has_leader(s))
    }

    /// The first group whose Raft core stopped on a storage error (a full or failing disk), with the
    /// error. openraft does not restart a group after that; the node must be restarted (see
    /// `node::run`), which reopens the data as after a crash.
    pub fn storage_failure(&self) -> Option<String> {
        let mut all = self.hosted();
        all.extend(self.meta.clone());
        all.iter().find_map(|s| match &s.raft.metrics().borrow_watched().running_state {
            Err(f @ Fatal::StorageError(_)) => Some(format!("shard {}: {f}", s.id)),
            _ => None,
        })
    }

    /// Stops every Raft group and flushes storage.
    pub async fn shutdown(&self) {
        let mut all = self.hosted();
        all.extend(self.meta.clone());
        for shard in all {
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

impl Shard {
    /// This replica's view of its group.
    pub fn status(&self) -> ShardStatus {
        let m = self.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let last = m.last_log_index.unwrap_or(0);
        ShardStatus {
            shard: self.id,
            leader: m.current_leader,
            is_leader: m.current_leader == Some(self.node_id),
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
    }
}

/// Transport call that proposes a cluster-map change on the metadata leader: `serde_json(Command)` in,
/// `serde_json(Result<Applied, ShardError>)` out.
pub const META_WRITE_CALL: &str = "meta.write";

async fn remote_meta_write(meta: &Shard, leader: NodeId, cmd: &Command) -> Result<Applied, ShardError> {
    let Some(t) = &meta.transport else { return Err(ShardError::NotLeader { shard: META, leader: Some(leader) }) };
    let body = serde_json::to_vec(cmd).map_err(|e| ShardError::Fatal { shard: META, msg: e.to_string() })?;
    let answer = t.call(leader, META_WRITE_CALL, body.into(), Some(Duration::from_secs(5))).await.map_err(|e| {
        tracing::debug!(leader, "cluster-map change on the metadata leader: {e}");
        ShardError::Timeout { shard: META }
    })?;
    serde_json::from_slice::<Result<Applied, ShardError>>(&answer)
        .map_err(|e| ShardError::Fatal { shard: META, msg: e.to_string() })?
}

fn call_error(e: impl std::fmt::Display) -> crate::cluster::transport::CallError {
    crate::cluster::transport::CallError(e.to_string())
}

/// Answers peers: read indexes, cluster-map writes, event tails.
fn register_calls(t: &crate::cluster::transport::Transport, shards: &Arc<Shards>) {
    let s = Arc::downgrade(shards);
    t.handlers().register(READ_INDEX_CALL, move |_from, body: bytes::Bytes| {
        let s = s.clone();
        async move {
            let id: ShardId =
                postcard::from_bytes(&body).map_err(|e| call_error(format!("bad read-index request: {e}")))?;
            let group = s.upgrade().and_then(|s| if id == META { s.meta.clone() } else { s.local(id) });
            let r = match group {
                Some(g) => g.read_index().await,
                None => Err(ShardError::NotLeader { shard: id, leader: None }),
            };
            postcard::to_allocvec(&r).map(bytes::Bytes::from).map_err(call_error)
        }
    });
    let s = Arc::downgrade(shards);
    t.handlers().register(META_WRITE_CALL, move |_from, body: bytes::Bytes| {
        let s = s.clone();
        async move {
            let cmd: Command = serde_json::from_slice(&body).map_err(|e| call_error(format!("bad map change: {e}")))?;
            let r = match s.upgrade().and_then(|s| s.meta.clone()) {
                Some(m) if m.is_leader() => m.write(cmd).await,
                Some(m) => Err(ShardError::NotLeader { shard: META, leader: m.leader() }),
                None => Err(ShardError::NotLeader { shard: META, leader: None }),
            };
            serde_json::to_vec(&r).map(bytes::Bytes::from).map_err(call_error)
        }
    });
    let s = Arc::downgrade(shards);
    t.handlers().register(tail::EVENTS_CALL, move |_from, body: bytes::Bytes| {
        let s = s.clone();
        async move {
            let (id, after): (ShardId, Option<u64>) =
                postcard::from_bytes(&body).map_err(|e| call_error(format!("bad event tail request: {e}")))?;
            let r = match s.upgrade() {
                Some(s) if s.local(id).is_some() => Ok(s.rings.wait_page(id, after, tail::LONG_POLL).await),
                _ => Err(ShardError::NotLeader { shard: id, leader: None }),
            };
            serde_json::to_vec(&r).map(bytes::Bytes::from).map_err(call_error)
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
            crate::secrets::create_private_dir(&config.data_dir).map_err(io)?;
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
}
