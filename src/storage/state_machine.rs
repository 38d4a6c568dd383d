//! openraft's state machine for one shard: `model::ShardState` in memory, snapshots durable in files.
//!
//! The state itself is transient. What survives a restart is the latest snapshot (state bytes plus the
//! last applied log id and membership) and the log after it: on open the snapshot is loaded, and
//! openraft re-applies the committed log (the committed id is saved by the log store), so every
//! acknowledged write is back and `$version` continues.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockWriteGuard, TryLockError};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use openraft::entry::RaftEntry;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};

use super::store::Store;
use super::types::{LogId, Snapshot, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig};
use crate::ids::ShardId;
use crate::model::{Applied, Reply, ShardState};

/// How long apply runs before it lets the other tasks of its worker thread go first. A follower
/// applying a long run of bulk entries otherwise holds one of the node's few worker threads for tens
/// of milliseconds, and heartbeats and votes queued behind it wait: under a fast bulk load that was
/// enough to start elections. Entries stream in already committed, so pausing between two of them
/// changes nothing but timing.
const APPLY_SLICE: Duration = Duration::from_millis(2);

/// Applied state of a shard, shared with the shard's readers.
#[derive(Default)]
pub struct AppliedState {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub state: ShardState,
}

/// How far a shard is from its next snapshot, readable without the state lock (a snapshot holds it
/// while it encodes, and a scheduler waiting for it would wait as long).
#[derive(Debug, Default)]
pub struct SnapshotWork {
    /// Twin writes applied since the last snapshot ([`crate::model::Command::weight`]): what a
    /// restart would re-apply. Reset when a snapshot starts encoding.
    since: AtomicU64,
    /// Log entries applied since the last snapshot (a bulk call or a batch of writes is one).
    entries: AtomicU64,
    /// Devices the shard had at its last snapshot (or when it was opened): what the next snapshot
    /// will encode, at least.
    devices: AtomicU64,
    /// A snapshot of this shard is being built.
    building: AtomicBool,
    /// Bytes of the last snapshot built, to size the next one's buffer.
    last_len: AtomicUsize,
}

impl SnapshotWork {
    fn with_devices(devices: usize) -> SnapshotWork {
        SnapshotWork { devices: AtomicU64::new(devices as u64), ..SnapshotWork::default() }
    }

    pub fn since_snapshot(&self) -> u64 {
        self.since.load(Ordering::Relaxed)
    }

    pub fn entries_since_snapshot(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }

    pub fn devices(&self) -> u64 {
        self.devices.load(Ordering::Relaxed)
    }

    pub fn building(&self) -> bool {
        self.building.load(Ordering::Relaxed)
    }
}

/// Marks a snapshot as being built until dropped (also when the build fails or is abandoned).
struct Building(Arc<SnapshotWork>);

impl Building {
    fn start(work: &Arc<SnapshotWork>) -> Building {
        work.building.store(true, Ordering::Relaxed);
        Building(Arc::clone(work))
    }
}

impl Drop for Building {
    fn drop(&mut self) {
        self.0.building.store(false, Ordering::Relaxed);
    }
}

pub type SharedState = Arc<RwLock<AppliedState>>;

/// A shard's latest durable snapshot, decoded: the slow part of opening a group, which a restarting
/// node does for all its shards at once on the blocking pool.
pub struct Loaded {
    applied: AppliedState,
    meta: Option<SnapshotMeta>,
}

impl Loaded {
    /// Reads and decodes the snapshot of `shard` (an empty state if it has none).
    pub fn read(shard: ShardId, store: &Store) -> io::Result<Loaded> {
        let mut applied = AppliedState::default();
        let mut meta = None;
        if let Some((m, data)) = store.snapshot(shard)? {
            applied.state = ShardState::decode_snapshot(&data).map_err(invalid)?;
            applied.last_applied = m.last_log_id;
            applied.membership = m.last_membership.clone();
            meta = Some(m);
        }
        Ok(Loaded { applied, meta })
    }
}

pub struct StateMachine {
    shard: ShardId,
    store: Arc<Store>,
    shared: SharedState,
    /// Meta of the durable snapshot; serializes snapshot writes so an older one never replaces a newer.
    snapshot: Arc<Mutex<Option<SnapshotMeta>>>,
    events: Option<GroupSink>,
    work: Arc<SnapshotWork>,
}

/// Where the events of one group's applied commands go.
pub trait AppliedEvents: Send + Sync {
    /// Whether anyone could receive the events of the entry about to be applied. If not, the entry is
    /// applied without building them ([`crate::model::ShardState::apply_quietly`]) and
    /// [`AppliedEvents::skipped`] takes its index.
    fn wanted(&self) -> bool;
    /// `(log index, events)` of an applied entry, in log order.
    fn deliver(&self, index: u64, events: Vec<crate::model::Event>);
    /// An applied entry whose events were not built.
    fn skipped(&self, index: u64);
}

pub type GroupSink = Arc<dyn AppliedEvents>;

fn reply_done() -> Applied {
    Applied { result: Ok(Reply::Done), events: Vec::new() }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The applied state for writing. Readers that scan a whole shard (queries, snapshots) hold the read
/// lock on the blocking pool for a while; waiting for them on an async worker would stall every task
/// queued behind it, so a contended wait hands the worker's other tasks over first.
fn write_lock(shared: &SharedState) -> RwLockWriteGuard<'_, AppliedState> {
    match shared.try_write() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => {
            let wait = || shared.write().unwrap_or_else(|e| e.into_inner());
            match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
                Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
                _ => wait(),
            }
        }
    }
}

impl StateMachine {
    /// Opens the shard's state machine from its latest durable snapshot, if any.
    pub fn open(shard: ShardId, store: Arc<Store>, events: Option<GroupSink>) -> io::Result<StateMachine> {
        let loaded = Loaded::read(shard, &store)?;
        Ok(StateMachine::from_loaded(shard, store, loaded, events))
    }

    /// The state machine over a snapshot already decoded by [`Loaded::read`].
    pub fn from_loaded(shard: ShardId, store: Arc<Store>, loaded: Loaded, events: Option<GroupSink>) -> StateMachine {
        StateMachine {
            shard,
            store,
            snapshot: Arc::new(Mutex::new(loaded.meta)),
            work: Arc::new(SnapshotWork::with_devices(loaded.applied.state.device_count())),
            shared: Arc::new(RwLock::new(loaded.applied)),
            events,
        }
    }

    pub fn shared(&self) -> SharedState {
        self.shared.clone()
    }

    pub fn work(&self) -> Arc<SnapshotWork> {
        self.work.clone()
    }

    fn builder(&self) -> SnapshotBuilder {
        SnapshotBuilder {
            shard: self.shard,
            store: self.store.clone(),
            shared: self.shared.clone(),
            snapshot: self.snapshot.clone(),
            work: self.work.clone(),
        }
    }
}

/// Writes a snapshot durably unless a newer one is already stored; hands the data back.
///
/// The file is written and fsynced on the snapshot thread ([`super::background`]), not through the
/// group-commit writer, so a large snapshot never holds up the log appends of the node's other groups.
async fn persist_snapshot(
    shard: ShardId,
    store: &Arc<Store>,
    current: &Mutex<Option<SnapshotMeta>>,
    meta: &SnapshotMeta,
    data: Vec<u8>,
) -> io::Result<Vec<u8>> {
    {
        let cur = current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cur) = cur.as_ref() {
            if cur.last_log_id > meta.last_log_id {
                return Ok(data);
            }
        }
    }
    let (files, m) = (Arc::clone(store), meta.clone());
    let background = store.background.clone();
    let data = background.run(move || files.snapshots.write(shard, &m, &data).map(|()| data)).await??;
    // A snapshot an older version kept in the database is superseded now; its deletion needs no fsync
    // of its own (the file above is what a restart reads first).
    store.writer.write(Store::drop_legacy_snapshot(shard)).await?;
    let mut cur = current.lock().unwrap_or_else(|e| e.into_inner());
    if cur.as_ref().is_none_or(|c| c.last_log_id <= meta.last_log_id) {
        *cur = Some(meta.clone());
    }
    Ok(data)
}

pub struct SnapshotBuilder {
    shard: ShardId,
    store: Arc<Store>,
    shared: SharedState,
    snapshot: Arc<Mutex<Option<SnapshotMeta>>>,
    work: Arc<SnapshotWork>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    /// Encodes the shard into the node's snapshot buffer, writes it durably, and answers the
    /// snapshot's meta with **no data**, keeping the buffer for the next snapshot: openraft uses only
    /// the meta of a snapshot it asked to build, and reads the stored one through
    /// [`RaftStateMachine::get_current_snapshot`] when it sends one to a follower. Should a later
    /// openraft send these bytes, the follower refuses an empty snapshot as corrupt rather than read
    /// it as an empty shard.
    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let _building = Building::start(&self.work);
        // The image is taken under the state's lock, which apply needs too: at the default priority,
        // so that a thread at a lower one is never preempted holding it, and on the blocking pool,
        // since waiting for the lock would block an async worker. The copy itself is O(1) now (the devices
        // and both retry windows are persistent collections); its time, lock wait included, is on
        // `/metrics` (`twinhub_snapshot_image_seconds`).
        let (shared, work) = (Arc::clone(&self.shared), Arc::clone(&self.work));
        let (meta, image) = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let a = shared.read().unwrap_or_else(|e| e.into_inner());
            let meta = SnapshotMeta { last_log_id: a.last_applied, last_membership: a.membership.clone() };
            work.since.store(0, Ordering::Relaxed);
            work.entries.store(0, Ordering::Relaxed);
            work.devices.store(a.state.device_count() as u64, Ordering::Relaxed);
            let image = a.state.snapshot_image();
            drop(a);
            metrics::histogram!("twinhub_snapshot_image_seconds").record(started.elapsed().as_secs_f64());
            (meta, image)
        })
        .await
        .map_err(io::Error::other)?;
        // Encoding takes long, and holds nothing apply needs: on the snapshot thread, at a lower
        // priority.
        let (work, store) = (Arc::clone(&self.work), Arc::clone(&self.store));
        let data = self
            .store
            .background
            .run(move || {
                // The shard grew since its last snapshot: a little room avoids one doubling; a first
                // snapshot guesses a kilobyte per device (room not written to is never resident).
                let last = work.last_len.load(Ordering::Relaxed);
                let hint = (last + last / 8).max(image.device_count().saturating_mul(1024) + (64 << 10));
                let mut data = store.snapshots.buffer(hint);
                let started = Instant::now();
                image.encode_into(&mut data);
                metrics::histogram!("twinhub_snapshot_encode_seconds").record(started.elapsed().as_secs_f64());
                metrics::counter!("twinhub_snapshot_bytes_total").increment(data.len() as u64);
                work.last_len.store(data.len(), Ordering::Relaxed);
                data
            })
            .await?;
        let data = persist_snapshot(self.shard, &self.store, &self.snapshot, &meta, data).await?;
        self.store.snapshots.keep(data);
        Ok(Snapshot { meta, snapshot: Vec::new() })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let a = self.shared.read().unwrap_or_else(|e| e.into_inner());
        Ok((a.last_applied, a.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        let mut slice_started = Instant::now();
        while let Some(item) = entries.next().await {
            if slice_started.elapsed() >= APPLY_SLICE {
                tokio::task::yield_now().await;
                slice_started = Instant::now();
            }
            let (entry, responder) = item?;
            let log_id = entry.log_id();
            // Asked per entry, before the state lock: a consumer that starts listening misses at most
            // the entry being applied, as it would if it had started a moment later.
            let wanted = self.events.as_ref().is_some_and(|s| s.wanted());
            let outcome = {
                let mut a = write_lock(&self.shared);
                a.last_applied = Some(log_id);
                match &entry.payload {
                    EntryPayload::Blank => reply_done(),
                    EntryPayload::Normal(cmd) => {
                        self.work.since.fetch_add(cmd.weight(), Ordering::Relaxed);
                        self.work.entries.fetch_add(1, Ordering::Relaxed);
                        if wanted {
                            a.state.apply(cmd)
                        } else {
                            a.state.apply_quietly(cmd)
                        }
                    }
                    EntryPayload::Membership(m) => {
                        a.membership = StoredMembership::new(Some(log_id), m.clone());
                        reply_done()
                    }
                }
            };
            let Applied { result, events } = outcome;
            match &self.events {
                Some(sink) if !wanted => sink.skipped(log_id.index),
                Some(sink) if !events.is_empty() => sink.deliver(log_id.index, events),
                _ => {}
            }
            // The events went to the sink; the writer (and a forwarded write's caller, over the wire)
            // only needs the result.
            if let Some(r) = responder {
                r.send(Applied { result, events: Vec::new() });
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.builder()
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: SnapshotData) -> Result<(), io::Error> {
        let (state, snapshot) = tokio::task::spawn_blocking(move || (ShardState::decode_snapshot(&snapshot), snapshot))
            .await
            .map_err(io::Error::other)?;
        let state = state.map_err(invalid)?;
        persist_snapshot(self.shard, &self.store, &self.snapshot, meta, snapshot).await?;
        let mut a = write_lock(&self.shared);
        a.state = state;
        a.last_applied = meta.last_log_id;
        a.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let (store, shard) = (Arc::clone(&self.store), self.shard);
        let stored = tokio::task::spawn_blocking(move || store.snapshot(shard)).await.map_err(io::Error::other)??;
        Ok(stored.map(|(meta, snapshot)| Snapshot { meta, snapshot }))
    }
}
