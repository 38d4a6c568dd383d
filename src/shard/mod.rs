//! Sharded state: one openraft group per shard, over the node's Raft storage ([`crate::storage`]:
//! one fjall database, one group-committing writer; its modules are re-exported here).
//!
//! - [`network`]: the per-node router every group shares; over the cluster transport when there is one.
//! - `error`, `config`, `group`, `calls`: the layer's error type (and the mapping of openraft's), its
//!   configuration, one shard's handle (proposals, linearizable reads), and what peers may call.
//! - this file: [`Shards`], the registry of a node's groups as the cluster map places them.

mod append_stream;
mod backoff;
mod calls;
mod config;
mod error;
mod group;
pub mod network;
mod proposer;
pub mod reconcile;
pub mod tail;

pub use crate::storage::{group_commit, log_store, state_machine, store, types};

use calls::{register_calls, remote_meta_write};
use config::{check_layout, raft_config};
pub use config::{recorded_shard_count, ShardsConfig};
pub use error::ShardError;
use error::{fatal_error, storage_error, write_error};
pub use group::Shard;

/// How long `Shards::open` waits for every group to elect itself and catch up.
const OPEN_TIMEOUT: Duration = Duration::from_secs(60);

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::error::{Fatal, InitializeError, RaftError};
use openraft::SnapshotPolicy;

use crate::cluster::map::{ClusterMap, ClusterOp};
use crate::ids::{NodeId, ShardId};
use crate::model::{Command, ShardState};
use log_store::LogStore;
use network::{NetworkFactory, ShardRouter};
use state_machine::StateMachine;
use store::Store;
use types::{Node, Raft};

/// Receives the events of a shard's applied entries, in log order.
pub type PublishFn = Arc<dyn Fn(ShardId, Vec<crate::model::Event>) + Send + Sync>;

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
    /// Whether anyone could receive a change or a desired push now (see `Hub::observed`).
    pub observed: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventSink")
    }
}

/// A shard's applied events: to the ring peers tail, and to this node's hub.
struct ShardEvents {
    shard: ShardId,
    hub: EventSink,
    rings: tail::Rings,
    starting: Arc<AtomicBool>,
}

impl state_machine::AppliedEvents for ShardEvents {
    fn wanted(&self) -> bool {
        self.rings.active(self.shard) || (!self.starting.load(Ordering::Relaxed) && (self.hub.observed)())
    }

    fn deliver(&self, index: u64, events: Vec<crate::model::Event>) {
        // Peers tailing the shard read the ring by log index, replayed entries included.
        self.rings.record(self.shard, index, &events);
        // What a starting node re-applies from its log reaches no one (the hub's feed has a new epoch
        // and nothing attached yet), and building those events was a third of a restart's replay.
        if !self.starting.load(Ordering::Relaxed) {
            (self.hub.publish)(self.shard, events);
        }
    }

    fn skipped(&self, index: u64) {
        self.rings.skipped(self.shard, index);
    }
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
    /// Log index of this replica's last snapshot (0: none yet).
    #[serde(default)]
    pub snapshot_index: u64,
    /// Twin writes this replica applied since its last snapshot: what a restart re-applies.
    #[serde(default)]
    pub writes_since_snapshot: u64,
    /// The most writes this replica's snapshot policy lets pass between snapshots (see
    /// [`Shards::snapshot_heavy_groups`]); with `writes_since_snapshot`, how far the next one is.
    #[serde(default)]
    pub snapshot_due_writes: u64,
}

/// Where a request for one shard can go (see [`Shards::route`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub leader: Option<NodeId>,
    pub replicas: Vec<NodeId>,
    /// This node has a replica: its Raft group learns the leader by itself.
    pub hosted: bool,
}

/// Twin writes since a shard's last snapshot, in units of `snapshot_every`, after which the shard is
/// snapshotted whatever its entry count. Measured with 1M bulk-loaded twins (3 nodes, 16 shards,
/// snapshot_every 10,000): at 1 the restart took 9.9 s but the load ran at 3,172 twins/s instead of
/// 5,305, each shard encoding a growing snapshot six times; 4 snapshots each shard about once.
pub const WORK_PER_SNAPSHOT: u64 = 4;

/// A shard is not snapshotted before it has applied at least this fraction of its device count in
/// twin writes since its last snapshot (1/4: a quarter as many writes as it has devices).
///
/// A snapshot encodes the whole shard, so its cost grows with the shard while the entry and work
/// thresholds do not: one shard of a million twins (a 420 MB snapshot, 2-5 s of a core to encode)
/// was snapshotted every 40,000 writes on every node, about every 8 s under the write benchmark, which
/// cost more CPU than the writes themselves and showed as seconds of half throughput. With the floor a
/// snapshot costs each replica a bounded share of the writes it amortises (about 8-11 us per write at a
/// million twins), and a restart re-applies at most about a third of a million writes there (a few
/// seconds, beside the 4-5 s of decoding the snapshot). Small shards are unaffected (10,000 devices:
/// a floor of 2,500 writes, below both thresholds).
pub const SIZE_PER_SNAPSHOT: u64 = 4;

/// Raft's own snapshot policy, in units of `snapshot_every` entries: only a backstop, far above what
/// [`Shards::snapshot_heavy_groups`] (which decides when a shard is snapshotted) lets a log reach, for
/// a node on which that task is not running.
pub const RAFT_POLICY_BACKSTOP: u64 = 100;

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
    /// Serialize opening and closing a group: one lock per group, so different groups open side by side.
    open_locks: Mutex<HashMap<ShardId, Arc<tokio::sync::Mutex<()>>>>,
    /// Snapshots decoded ahead of their groups' opening (see [`Shards::preload`]).
    preloaded: Mutex<HashMap<ShardId, state_machine::Loaded>>,
    /// True until [`Shards::open`] returns: the groups are replaying their logs, and the node's front
    /// doors are not open yet, so no device or feed consumer can be attached to the event hub.
    starting: Arc<AtomicBool>,
}

/// How many log entries group `shard` of node `node` takes between snapshots, given the node's
/// `every`: a threshold of its own in [N, 1.5 N).
///
/// Shards written at the same rate reach the same entry count together; with one threshold they
/// would all snapshot at once, and every snapshot (several MiB: the state and its retry window) went
/// through the one group-commit journal that carries every shard's appends, so writes stalled for
/// hundreds of milliseconds. So each shard has its own slot (data shards 0..S, the metadata group
/// the last one).
///
/// The replicas of one shard receive the same entries, so with the shard's threshold alone all three
/// encoded and wrote the same snapshot at the same moment, three times the CPU of one in the same
/// tenth of a second. On two cores that was the slowest seconds of a half-load run: p99 31–50 ms
/// against 19–34 ms with no snapshots at all (benches/README.md). Each slot is therefore divided
/// into three, and a node takes the part its id falls in, so the replicas of a shard snapshot apart
/// (on nodes whose ids differ modulo 3, as 1, 2 and 3 do).
fn snapshot_threshold(every: u64, shard: ShardId, shard_count: u32, node: NodeId) -> u64 {
    const REPLICA_PARTS: u64 = 3;
    let slots = (u64::from(shard_count) + 1) * REPLICA_PARTS;
    let slot = u64::from(shard.min(shard_count)) * REPLICA_PARTS + node % REPLICA_PARTS;
    every + every / 2 * slot / slots
}

/// One replica's snapshot thresholds for one shard, each its own in [N, 1.5 N) ([`snapshot_threshold`]):
/// due after `entries` log entries or `writes` twin writes since the last snapshot, never before `floor`
/// writes.
struct SnapshotThresholds {
    floor: u64,
    entries: u64,
    writes: u64,
}

impl Shards {
    /// The Raft configuration of group `id`: the node's, with a snapshot threshold of its own
    /// ([`snapshot_threshold`]).
    fn group_config(&self, id: ShardId) -> Arc<openraft::Config> {
        let SnapshotPolicy::LogsSinceLast(every) = self.raft_config.snapshot_policy else {
            return self.raft_config.clone();
        };
        let mut cfg = (*self.raft_config).clone();
        cfg.snapshot_policy =
            SnapshotPolicy::LogsSinceLast(snapshot_threshold(every, id, self.shard_count, self.node_id));
        Arc::new(cfg)
    }

    /// Opens (or creates) the node's database and its groups. A single-node hub opens every shard as a
    /// one-voter group and waits for each to lead. A clustered node opens the metadata group (the lowest
    /// founding id initializes it) and the shards the cluster map places here; the reconciler
    /// ([`Shards::reconcile`]) follows the map from then on.
    pub async fn open(config: ShardsConfig) -> Result<Arc<Shards>, ShardError> {
        check_layout(&config)?;
        let store = Arc::new(
            Store::open_for_node(&config.data_dir.join("raft"), config.node_id).map_err(|e| storage_error(0, e))?,
        );
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
            open_locks: Default::default(),
            preloaded: Default::default(),
            starting: Arc::new(AtomicBool::new(true)),
            config,
        };
        if !clustered {
            shards.preload(&(0..shards.shard_count).collect::<Vec<_>>()).await;
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
            shards.starting.store(false, Ordering::Relaxed);
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
        let ids = map.shards_of(shards.node_id);
        shards.preload(&ids).await;
        // Each group replays its log since the snapshot as it opens: all at once, on every worker.
        let opening = ids.iter().map(|&id| {
            let (shards, map) = (shards.clone(), map.clone());
            tokio::spawn(async move { shards.ensure_group(id, &map).await })
        });
        for (opened, &id) in futures::future::join_all(opening).await.into_iter().zip(&ids) {
            opened.map_err(|e| ShardError::Fatal { shard: id, msg: format!("opening the group: {e}") })??;
        }
        if let Some(t) = &shards.config.transport {
            register_calls(t, &shards);
        }
        shards.starting.store(false, Ordering::Relaxed);
        Ok(shards)
    }

    /// Asks the hosted group (the metadata group included) with the most applied work since its last
    /// snapshot, among those due, for a snapshot now — one group at a time, none while another is being
    /// built. A group is due when it applied `snapshot_every` log entries or [`WORK_PER_SNAPSHOT`] ×
    /// `snapshot_every` twin writes since its last snapshot (one bulk registry entry carries up to a
    /// hundred twin writes: counting entries alone, a bulk-loaded shard could reach millions of writes
    /// with no snapshot, which a restart then re-applies one by one), and at least
    /// 1/[`SIZE_PER_SNAPSHOT`] of its devices in twin writes (a snapshot encodes the whole shard). Each
    /// of the three thresholds is this replica's own, in [N, 1.5 N) ([`snapshot_threshold`]), so that
    /// the replicas of a shard, which apply the same writes, snapshot apart. One at a time because a
    /// uniform load brings every shard to the threshold at once: sixteen shards encoding and writing
    /// tens of megabytes together on every node saturated the machine for seconds, long enough for
    /// elections in every group.
    pub async fn snapshot_heavy_groups(&self) {
        let mut groups = self.hosted();
        groups.extend(self.meta.clone());
        if groups.iter().any(|s| s.work.building()) {
            return;
        }
        let heaviest = groups.iter().filter(|s| self.snapshot_due(s)).max_by_key(|s| s.work.since_snapshot());
        if let Some(s) = heaviest {
            if let Err(e) = s.raft.trigger().snapshot().await {
                tracing::debug!(shard = s.id, "asking for a snapshot: {e}");
            }
        }
    }

    /// This replica's snapshot thresholds for `shard` (see [`Shards::snapshot_heavy_groups`]).
    fn snapshot_thresholds(&self, shard: &Shard) -> SnapshotThresholds {
        let own = |n: u64| snapshot_threshold(n, shard.id, self.shard_count, self.node_id);
        let every = self.config.snapshot_every.max(1);
        SnapshotThresholds {
            floor: own(shard.work.devices() / SIZE_PER_SNAPSHOT),
            entries: own(every),
            writes: own(every.saturating_mul(WORK_PER_SNAPSHOT)),
        }
    }

    /// The writes after which `shard` is due for a snapshot on this node whatever its entry count:
    /// the most a restart of this replica re-applies, short of a snapshot that failed.
    fn snapshot_due_writes(&self, shard: &Shard) -> u64 {
        let t = self.snapshot_thresholds(shard);
        t.floor.max(t.writes)
    }

    /// Whether `shard` is due for a snapshot on this node (see [`Shards::snapshot_heavy_groups`]).
    fn snapshot_due(&self, shard: &Shard) -> bool {
        let t = self.snapshot_thresholds(shard);
        let (writes, entries) = (shard.work.since_snapshot(), shard.work.entries_since_snapshot());
        writes >= t.floor && (entries >= t.entries || writes >= t.writes)
    }

    /// Decodes the snapshots of `ids` in parallel, one per core, for the groups about to open: a node
    /// restarting with a million twins spends its start decoding them, and one core at a time would
    /// leave the others idle. A snapshot that fails to load is left for its group's opening to report.
    async fn preload(&self, ids: &[ShardId]) {
        use futures::StreamExt;
        let width = std::thread::available_parallelism().map_or(2, |n| n.get());
        let started = std::time::Instant::now();
        let loads = futures::stream::iter(ids.iter().copied())
            .map(|id| {
                let store = self.store.clone();
                tokio::task::spawn_blocking(move || (id, state_machine::Loaded::read(id, &store)))
            })
            .buffer_unordered(width)
            .collect::<Vec<_>>()
            .await;
        let mut preloaded = self.preloaded.lock().unwrap_or_else(|e| e.into_inner());
        for (id, loaded) in loads.into_iter().flatten() {
            if let Ok(l) = loaded {
                preloaded.insert(id, l);
            }
        }
        tracing::info!(shards = preloaded.len(), ms = started.elapsed().as_millis() as u64, "snapshots decoded");
    }

    /// The lock that serializes opening and closing group `id` (other groups open beside it).
    fn open_lock(&self, id: ShardId) -> Arc<tokio::sync::Mutex<()>> {
        self.open_locks.lock().unwrap_or_else(|e| e.into_inner()).entry(id).or_default().clone()
    }

    /// Opens one group (idempotent). `init`: the voters to initialize it with if it is pristine.
    async fn open_group(&self, id: ShardId, init: Option<BTreeMap<NodeId, Node>>) -> Result<Arc<Shard>, ShardError> {
        let lock = self.open_lock(id);
        let _guard = lock.lock().await;
        if let Some(s) = self.local(id) {
            return Ok(s);
        }
        if id == META {
            if let Some(m) = &self.meta {
                return Ok(m.clone());
            }
        }
        let sink: Option<state_machine::GroupSink> = match (&self.config.events, id == META) {
            (Some(hub), false) => Some(Arc::new(ShardEvents {
                shard: id,
                hub: hub.clone(),
                rings: self.rings.clone(),
                starting: self.starting.clone(),
            })),
            _ => None,
        };
        let preloaded = self.preloaded.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        let loaded = match preloaded {
            Some(l) => l,
            None => {
                let store = self.store.clone();
                tokio::task::spawn_blocking(move || state_machine::Loaded::read(id, &store))
                    .await
                    .map_err(|e| ShardError::Fatal { shard: id, msg: format!("loading the snapshot: {e}") })?
                    .map_err(|e| storage_error(id, e))?
            }
        };
        let sm = StateMachine::from_loaded(id, self.store.clone(), loaded, sink);
        let state = sm.shared();
        let work = sm.work();
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
        let proposer = (self.config.proposals_in_flight > 0 && id != META)
            .then(|| proposer::Proposer::start(raft.clone(), id, self.config.proposals_in_flight));
        let shard = Arc::new(Shard {
            id,
            node_id: self.node_id,
            raft,
            transport: self.config.transport.clone(),
            state,
            work,
            closed: std::sync::atomic::AtomicBool::new(false),
            proposer,
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
        let lock = self.open_lock(id);
        let _guard = lock.lock().await;
        let Some(shard) = self.groups.write().unwrap_or_else(|e| e.into_inner()).remove(&id) else { return };
        if let Some(t) = &self.config.transport {
            t.groups().unregister(id);
        }
        shard.close();
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
        self.with_map(ClusterMap::clone)
    }

    /// `f` of the cluster map, read in place: routing asks it for one shard's replicas on every
    /// request, where a copy of the whole map cost more than the answer.
    fn with_map<R>(&self, f: impl FnOnce(&ClusterMap) -> R) -> R {
        match &self.meta {
            Some(m) => m.read_local(|s| f(&s.cluster)),
            None => {
                let mut map = ClusterMap::default();
                let members = BTreeMap::from([(self.node_id, String::new())]);
                let _ = map.apply(&ClusterOp::Init { shard_count: self.shard_count, rf: 1, members });
                f(&map)
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
        // A map founded with another count than this node's hashes devices differently: no route
        // rather than the wrong group (the node stops, see `reconcile`).
        let replicas =
            self.with_map(|m| if m.shard_count == self.shard_count { m.replicas(shard) } else { Vec::new() });
        Route { leader, replicas, hosted: local.is_some() }
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
        self.hosted().iter().map(|s| self.status_of(s)).collect()
    }

    /// The metadata group's status, in a cluster.
    pub fn meta_status(&self) -> Option<ShardStatus> {
        self.meta.as_ref().map(|m| self.status_of(m))
    }

    /// A group's Raft status with this node's snapshot work on it.
    fn status_of(&self, shard: &Shard) -> ShardStatus {
        ShardStatus { snapshot_due_writes: self.snapshot_due_writes(shard), ..shard.status() }
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

    /// Why this node must not serve the cluster whose map it follows, if it must not: the map was
    /// founded with another shard count than the node was started with (a founder given another
    /// `--shard-count` than the others, on a new data directory).
    pub fn misconfiguration(&self) -> Option<String> {
        self.with_map(|m| reconcile::join_refusal(m, self.node_id, self.shard_count)).map(|e| e.to_string())
    }

    /// Stops every Raft group and flushes storage.
    pub async fn shutdown(&self) {
        let mut all = self.hosted();
        all.extend(self.meta.clone());
        for shard in all {
            if let Some(t) = &shard.transport {
                t.groups().unregister(shard.id);
            }
            shard.close();
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
