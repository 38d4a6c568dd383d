//! The single writer of the node's Raft database: group commit across every shard.
//!
//! Every durable change of every shard (log appends, truncations, purges, votes, committed ids,
//! snapshots) is a [`Request`] sent to one writer thread. The thread takes *everything* pending,
//! writes it to fjall as one batch (so it is readable at once), tells each waiting caller that its
//! write is visible, then fsyncs once ([`SYNC`]) and only after that completes each
//! append's `IOFlushed` callback and each vote save's signal. Log appends and committed ids do not
//! wait to be visible (their readers have the log cache, or ask for a [`GroupCommit::barrier`]):
//! requests are taken in the order they were queued, so a later truncation or read still sees them.
//! Committed ids do not even wake the writer ([`GroupCommit::queue_unhurried`]): they go with the
//! next request, which spares the writer a round of its own for nearly every Raft round.
//!
//! Durability argument: fjall has one journal per database and writes it sequentially, so an fsync
//! makes durable every batch written before it, across all shards. A callback is completed only by
//! the fsync that followed the write of its own batch, so no append is acknowledged to openraft
//! before it is on disk; and since openraft counts the leader's own log towards the quorum only once
//! acknowledged, nothing is committed (or answered) before its fsync. Because the journal is a single
//! ordered file, what survives a crash is always a prefix of the order in which this thread wrote, so
//! the per-shard rule "a later write is never durable before an earlier one" also holds for
//! truncations and purges that are not themselves synced.
//!
//! Failure: the first write or fsync error fails every request of the batch and every later one
//! (fjall poisons itself too). openraft turns the failed callback into a `StorageError`, which stops
//! the group: a shard stops serving rather than acknowledge what it could not persist.
//!
//! Throughput: one fsync (~0.2 ms here) serves every shard's pending appends, which is where the
//! difference between ~7k and ~270k entries/s comes from.

use std::collections::HashSet;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use fjall::{Database, Keyspace, PersistMode};
use openraft::storage::IOFlushed;
use tokio::sync::oneshot;

use super::types::TypeConfig;

/// Which keyspace an [`Item`] goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Space {
    Log,
    Meta,
}

/// One key change.
pub enum Item {
    Put(Space, Vec<u8>, Vec<u8>),
    Del(Space, Vec<u8>),
}

impl Item {
    fn key(&self) -> (Space, &[u8]) {
        match self {
            Item::Put(s, k, _) | Item::Del(s, k) => (*s, k),
        }
    }
}

/// What the caller is told once its items are on disk.
pub enum Durable {
    /// Nothing: visibility is enough (the next fsync covers it).
    None,
    /// openraft's append callback.
    Flushed(IOFlushed<TypeConfig>),
    /// A caller that must not return before its write is durable (votes, snapshots).
    Signal(oneshot::Sender<io::Result<()>>),
}

/// A set of changes written atomically in one batch.
pub struct Request {
    pub items: Vec<Item>,
    /// Told once the items are visible to readers (before the fsync).
    pub written: Option<oneshot::Sender<io::Result<()>>>,
    pub durable: Durable,
}

enum Msg {
    Write(Request),
    /// Items that waited in [`GroupCommit::queue_unhurried`]'s slot, then the request that took them
    /// along: one message, so both go in the same round.
    WriteAfter(Request, Request),
    /// Flush, sync and stop the thread.
    Stop(oneshot::Sender<io::Result<()>>),
    /// Test hook: behave as if the disk had failed.
    #[cfg(test)]
    Fail,
    /// Test hook: take nothing more until the sender sends or is dropped.
    #[cfg(test)]
    Hold(mpsc::Receiver<()>),
}

/// Handle of the writer thread.
pub struct GroupCommit {
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    /// Items that do not wake the writer (see [`GroupCommit::queue_unhurried`]): the next request
    /// takes them along, ahead of itself.
    unhurried: Mutex<Vec<Item>>,
    /// Whether `unhurried` holds anything, so that a request only locks it when it does.
    has_unhurried: AtomicBool,
    /// fsyncs done so far (metrics; tests check that batches share them).
    syncs: Arc<AtomicU64>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// How the writer makes fjall's journal durable. On Linux `fdatasync`: it makes the written data
/// durable together with the metadata needed to read it back (the file's size and block map; ext4 and
/// XFS commit a block allocation before `fdatasync` returns), and skips only what reading does not need
/// (modification times), so what a crash keeps of the journal is what `fsync` would have kept. The
/// journal file itself was made durable when fjall created it (`fsync` of the file, and of the
/// directory when it rotates to a new one). etcd's WAL and PostgreSQL (its default on Linux) sync the
/// same way; measured both ways in benches/README.md. Elsewhere `fsync`, since not every system's
/// `fdatasync` promises as much.
#[cfg(target_os = "linux")]
const SYNC: PersistMode = PersistMode::SyncData;
#[cfg(not(target_os = "linux"))]
const SYNC: PersistMode = PersistMode::SyncAll;

/// Upper bound of requests in one batch, so that one fsync never waits behind an unbounded write.
const MAX_BATCH: usize = 4096;

impl GroupCommit {
    pub fn start(db: Database, log: Keyspace, meta: Keyspace) -> io::Result<GroupCommit> {
        let (tx, rx) = mpsc::channel();
        let syncs = Arc::new(AtomicU64::new(0));
        let writer = Writer {
            db,
            log,
            meta,
            failed: None,
            syncs: syncs.clone(),
            batch_requests: metrics::histogram!("twinhub_storage_batch_requests"),
            fsync_seconds: metrics::histogram!("twinhub_storage_fsync_seconds"),
            write_seconds: metrics::histogram!("twinhub_storage_write_seconds"),
        };
        let thread = std::thread::Builder::new().name("raft-group-commit".into()).spawn(move || writer.run(rx))?;
        Ok(GroupCommit {
            tx: Mutex::new(Some(tx)),
            unhurried: Mutex::new(Vec::new()),
            has_unhurried: AtomicBool::new(false),
            syncs,
            thread: Mutex::new(Some(thread)),
        })
    }

    pub fn sync_count(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    fn sender(&self) -> Option<mpsc::Sender<Msg>> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Queues a request. If the writer is gone, the request fails at once (callbacks included).
    pub fn submit(&self, req: Request) {
        let Some(tx) = self.sender() else {
            fail(req, &stopped());
            return;
        };
        if !self.has_unhurried.load(Ordering::Acquire) {
            if let Err(mpsc::SendError(Msg::Write(req))) = tx.send(Msg::Write(req)) {
                fail(req, &stopped());
            }
            return;
        }
        // The slot stays locked until its items are in the channel, so that two callers cannot
        // pass each other's items to the writer out of order.
        let mut slot = self.lock_unhurried();
        let msg = match take_all(&mut slot) {
            Some(ahead) => Msg::WriteAfter(ahead, req),
            None => Msg::Write(req),
        };
        match tx.send(msg) {
            Ok(()) => {}
            Err(mpsc::SendError(Msg::Write(req) | Msg::WriteAfter(_, req))) => fail(req, &stopped()),
            Err(mpsc::SendError(_)) => {}
        }
    }

    fn lock_unhurried(&self) -> std::sync::MutexGuard<'_, Vec<Item>> {
        let slot = self.unhurried.lock().unwrap_or_else(|e| e.into_inner());
        self.has_unhurried.store(false, Ordering::Release);
        slot
    }

    /// Writes `items` and returns once they are visible to readers (durable at the next fsync).
    pub async fn write(&self, items: Vec<Item>) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.submit(Request { items, written: Some(tx), durable: Durable::None });
        rx.await.map_err(|_| stopped())?
    }

    /// Writes `items` and returns once they are durable.
    pub async fn write_durable(&self, items: Vec<Item>) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.submit(Request { items, written: None, durable: Durable::Signal(tx) });
        rx.await.map_err(|_| stopped())?
    }

    /// Queues `items` and returns at once; completes `flushed` after the fsync that follows their
    /// write. Nothing waits for them to become visible: a reader that needs them from fjall (rather
    /// than from a cache kept beside it) calls [`GroupCommit::barrier`] first. The caller, a Raft
    /// group's core task, goes on while the writer writes instead of standing still until it has.
    pub fn append(&self, items: Vec<Item>, flushed: IOFlushed<TypeConfig>) {
        self.submit(Request { items, written: None, durable: Durable::Flushed(flushed) });
    }

    /// Queues `items` and returns at once; they are written in order with everything else and made
    /// durable by the next fsync. A write failure fails every later request, so a caller that needs
    /// to know learns it from its next acknowledged one.
    pub fn queue(&self, items: Vec<Item>) {
        self.submit(Request { items, written: None, durable: Durable::None });
    }

    /// Like [`GroupCommit::queue`], but without waking the writer: the items wait until the next
    /// request of any caller (or a barrier, or [`GroupCommit::stop`]) and are written just ahead of
    /// it, so the order of everything queued is kept. An item replaces one still waiting for the
    /// same key. For writes whose loss in a crash costs nothing but work (a group's committed id:
    /// openraft learns it again from the leader); a writer woken for each of them would do a round
    /// of its own, with its thread hand-offs, for every Raft round of every group.
    pub fn queue_unhurried(&self, items: Vec<Item>) {
        let mut slot = self.lock_unhurried();
        for item in items {
            slot.retain(|waiting| waiting.key() != item.key());
            slot.push(item);
        }
        self.has_unhurried.store(!slot.is_empty(), Ordering::Release);
    }

    /// Returns once everything queued before it is visible to readers. The writer takes requests in
    /// the order they were queued, so an empty request is answered only after every earlier one.
    pub async fn barrier(&self) -> io::Result<()> {
        self.write(Vec::new()).await
    }

    /// Test hook: the writer takes nothing more until `release` is dropped or sent to.
    #[cfg(test)]
    pub fn hold(&self) -> mpsc::Sender<()> {
        let (release, held) = mpsc::channel();
        if let Some(tx) = self.sender() {
            let _ = tx.send(Msg::Hold(held));
        }
        release
    }

    /// Test hook: every later write fails as if the disk had failed.
    #[cfg(test)]
    pub fn inject_failure(&self) {
        if let Some(tx) = self.sender() {
            let _ = tx.send(Msg::Fail);
        }
    }

    /// Syncs whatever is pending and stops the thread. Later requests fail.
    pub async fn stop(&self) -> io::Result<()> {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        let result = match tx {
            Some(tx) => {
                if let Some(ahead) = take_all(&mut self.lock_unhurried()) {
                    let _ = tx.send(Msg::Write(ahead));
                }
                let (done_tx, done_rx) = oneshot::channel();
                match tx.send(Msg::Stop(done_tx)) {
                    Ok(()) => done_rx.await.map_err(|_| stopped()).and_then(|r| r),
                    Err(_) => Err(stopped()),
                }
            }
            None => Ok(()),
        };
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        result
    }
}

/// A round of the writer that takes longer than this is logged: every Raft group of the node waits
/// for it, so a stall here is a stall of all the node's writes. 100 ms is past the heartbeats'
/// deadline (75 ms at the default heartbeat), so a round long enough to make the peers' heartbeats to
/// this node time out is logged here too, naming the write or the fsync; at 500 ms the fsyncs of 100–500 ms
/// that a contended disk shows a few times a minute went unexplained.
const SLOW_ROUND: Duration = Duration::from_millis(100);

/// Logs a slow round with where its time went: the write (fjall halts writes while its memtables
/// wait to be flushed or its first level has too many runs) or the fsync (the disk).
fn slow_round(requests: usize, write: Duration, fsync: Option<Duration>) {
    let total = write + fsync.unwrap_or_default();
    if total >= SLOW_ROUND {
        tracing::warn!(
            requests,
            write_ms = write.as_millis() as u64,
            fsync_ms = fsync.map(|f| f.as_millis() as u64),
            "slow raft storage round: {} ms (all writes on this node waited for it)",
            total.as_millis()
        );
    }
}

/// The unhurried slot's items as one request, leaving it empty.
fn take_all(slot: &mut Vec<Item>) -> Option<Request> {
    let items = std::mem::take(slot);
    (!items.is_empty()).then_some(Request { items, written: None, durable: Durable::None })
}

fn stopped() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "raft storage writer stopped")
}

fn fail(req: Request, err: &io::Error) {
    let e = || io::Error::new(err.kind(), err.to_string());
    if let Some(w) = req.written {
        let _ = w.send(Err(e()));
    }
    complete(req.durable, Err(e()));
}

fn complete(durable: Durable, result: io::Result<()>) {
    match durable {
        Durable::None => {}
        Durable::Flushed(cb) => cb.io_completed(result),
        Durable::Signal(tx) => {
            let _ = tx.send(result);
        }
    }
}

struct Writer {
    db: Database,
    log: Keyspace,
    meta: Keyspace,
    /// The first I/O error: once storage failed, nothing more is written or acknowledged.
    failed: Option<String>,
    syncs: Arc<AtomicU64>,
    /// `twinhub_storage_batch_requests` and `twinhub_storage_fsync_seconds`, looked up once: the
    /// writer records both every round (the recorder is installed before storage opens).
    batch_requests: metrics::Histogram,
    fsync_seconds: metrics::Histogram,
    /// `twinhub_storage_write_seconds`: how long a round's write into fjall took (before its fsync).
    /// fjall holds a writer back when its memtable flushes fall behind, and every append of the node
    /// waits for that round.
    write_seconds: metrics::Histogram,
}

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Msg>) {
        while let Ok(first) = rx.recv() {
            let mut reqs = Vec::new();
            let mut stop = None;
            let mut next = Some(first);
            while let Some(msg) = next.take() {
                match msg {
                    Msg::Write(r) => reqs.push(r),
                    Msg::WriteAfter(ahead, r) => {
                        reqs.push(ahead);
                        reqs.push(r);
                    }
                    Msg::Stop(done) => stop = Some(done),
                    #[cfg(test)]
                    Msg::Fail => self.failed = Some("injected disk failure".into()),
                    #[cfg(test)]
                    Msg::Hold(held) => {
                        let _ = held.recv();
                    }
                }
                if stop.is_none() && reqs.len() < MAX_BATCH {
                    next = rx.try_recv().ok();
                }
            }
            self.commit(reqs);
            if let Some(done) = stop {
                let result = self.sync();
                let _ = done.send(result);
                return;
            }
        }
        // Every sender is gone: make what was written durable before exiting.
        let _ = self.sync();
    }

    fn commit(&mut self, reqs: Vec<Request>) {
        if let Some(msg) = &self.failed {
            let err = io::Error::other(msg.clone());
            reqs.into_iter().for_each(|r| fail(r, &err));
            return;
        }
        let started = std::time::Instant::now();
        if let Err(e) = self.write(&reqs) {
            self.failed = Some(format!("raft storage write failed: {e}"));
            let err = io::Error::other(e.to_string());
            reqs.into_iter().for_each(|r| fail(r, &err));
            return;
        }
        let wrote = started.elapsed();
        self.write_seconds.record(wrote.as_secs_f64());
        let requests = reqs.len();
        self.batch_requests.record(requests as f64);
        let mut durables = Vec::with_capacity(reqs.len());
        for req in reqs {
            if let Some(w) = req.written {
                let _ = w.send(Ok(()));
            }
            if !matches!(req.durable, Durable::None) {
                durables.push(req.durable);
            }
        }
        if durables.is_empty() {
            slow_round(requests, wrote, None);
            return;
        }
        let result = self.sync();
        slow_round(requests, wrote, Some(started.elapsed().saturating_sub(wrote)));
        for d in durables {
            complete(d, result.as_ref().map(|_| ()).map_err(|e| io::Error::new(e.kind(), e.to_string())));
        }
    }

    /// Writes all requests in as few fjall batches as possible. Items of one batch share a sequence
    /// number, so two changes of the same key must go to different batches to keep their order.
    fn write(&self, reqs: &[Request]) -> Result<(), fjall::Error> {
        if reqs.iter().all(|r| r.items.is_empty()) {
            // Only barriers: nothing to write.
            return Ok(());
        }
        let mut batch = self.db.batch();
        let mut keys: HashSet<(Space, &[u8])> = HashSet::new();
        for req in reqs {
            if req.items.iter().any(|i| keys.contains(&i.key())) {
                std::mem::replace(&mut batch, self.db.batch()).commit()?;
                keys.clear();
            }
            for item in &req.items {
                keys.insert(item.key());
                match item {
                    Item::Put(s, k, v) => batch.insert(self.space(*s), k.as_slice(), v.as_slice()),
                    Item::Del(s, k) => batch.remove(self.space(*s), k.as_slice()),
                }
            }
        }
        batch.commit()
    }

    fn space(&self, s: Space) -> &Keyspace {
        match s {
            Space::Log => &self.log,
            Space::Meta => &self.meta,
        }
    }

    fn sync(&mut self) -> io::Result<()> {
        if let Some(msg) = &self.failed {
            return Err(io::Error::other(msg.clone()));
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if skip_fsync_mutation() {
            // Test-only mutation (debug builds only): acknowledge without making the batch durable.
            return Ok(());
        }
        let started = std::time::Instant::now();
        let synced = self.db.persist(SYNC);
        self.fsync_seconds.record(started.elapsed().as_secs_f64());
        synced.map_err(|e| {
            self.failed = Some(format!("raft storage fsync failed: {e}"));
            io::Error::other(e.to_string())
        })
    }
}

/// The environment variable of the test-only mutation that skips the group commit's fsync.
pub const SKIP_FSYNC_MUTATION_ENV: &str = "TWINHUB_MUTATION_SKIP_RAFT_FSYNC";

/// Whether the group commit skips its fsync: a deliberate durability bug, so that the chaos suite's
/// power-loss scenarios can show that they catch one (`crates/chaos/tests/power.rs`). Only debug
/// builds honour it (`cfg(debug_assertions)`): a release build compiles the check away, whatever its
/// environment says. The node logs an error at start when it is on.
pub fn skip_fsync_mutation() -> bool {
    #[cfg(debug_assertions)]
    {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            let on = std::env::var(SKIP_FSYNC_MUTATION_ENV).is_ok_and(|v| v == "1");
            if on {
                tracing::error!("{SKIP_FSYNC_MUTATION_ENV}=1: MUTATION ON, writes are acknowledged without fsync (debug build, tests only)");
            }
            on
        })
    }
    #[cfg(not(debug_assertions))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::super::store::{log_key, Store};
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_durable_writes_share_fsyncs_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let before = store.writer.sync_count();
        let mut tasks = Vec::new();
        for shard in 0..16u32 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..50u64 {
                    let item = Item::Put(Space::Log, log_key(shard, i), vec![shard as u8, i as u8]);
                    store.writer.write_durable(vec![item]).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let syncs = store.writer.sync_count() - before;
        assert!(syncs < 16 * 50, "every durable write took its own fsync ({syncs})");
        store.writer.stop().await.unwrap();
        drop(store);

        let store = Store::open(dir.path()).unwrap();
        for shard in 0..16u32 {
            for i in 0..50u64 {
                let v = store.log.get(log_key(shard, i)).unwrap().expect("durable write lost");
                assert_eq!(&v[..], &[shard as u8, i as u8]);
            }
        }
        store.writer.stop().await.unwrap();
    }

    /// An unhurried item wakes nobody: it is invisible until the next request of any caller, then
    /// written ahead of it; a newer one for the same key replaces it; a stop writes what still waits.
    #[tokio::test]
    async fn unhurried_items_ride_on_the_next_request_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let committed = |v: u8| Item::Put(Space::Meta, b"committed".to_vec(), vec![v]);
        store.writer.barrier().await.unwrap();
        let syncs = store.writer.sync_count();

        store.writer.queue_unhurried(vec![committed(1)]);
        store.writer.queue_unhurried(vec![committed(2)]);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(store.meta.get(b"committed").unwrap(), None, "an unhurried item woke the writer");
        assert_eq!(store.writer.sync_count(), syncs);

        // A later request of another caller takes it along, and a write of the same key queued after it wins.
        store.writer.write(vec![Item::Put(Space::Log, log_key(0, 1), vec![9])]).await.unwrap();
        assert_eq!(store.meta.get(b"committed").unwrap().as_deref(), Some(&[2u8][..]));
        store.writer.queue_unhurried(vec![committed(3)]);
        store.writer.write(vec![committed(4)]).await.unwrap();
        assert_eq!(store.meta.get(b"committed").unwrap().as_deref(), Some(&[4u8][..]));

        store.writer.queue_unhurried(vec![committed(5)]);
        store.writer.stop().await.unwrap();
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.meta.get(b"committed").unwrap().as_deref(), Some(&[5u8][..]), "stop left an item behind");
        store.writer.stop().await.unwrap();
    }

    /// The journal is written with zeros ahead of its data (the patch in vendor/fjall), so that an
    /// fsync overwrites blocks in place instead of allocating them; and the zeros never reach an
    /// entry: entries made durable one by one, all read back after each reopen, including those
    /// appended to the journal after the first reopen.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_journal_is_written_ahead_of_its_data_and_keeps_every_entry() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        // Incompressible (fjall compresses large journal values): an xorshift stream seeded by `i`.
        let value = |i: u64| {
            let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            (0..5000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect::<Vec<u8>>()
        };
        let journal_blocks = |dir: &std::path::Path| -> u64 {
            let journals: Vec<_> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "jnl"))
                .collect();
            assert_eq!(journals.len(), 1, "{journals:?}");
            std::fs::metadata(&journals[0]).unwrap().blocks() * 512
        };
        // Written in two sessions: 3 MB into the journal the database created, 1.5 MB more into
        // the same journal reopened (cut back to its last entry by recovery).
        for (session, range) in [(0, 0..600u64), (1, 600..900)] {
            let store = Store::open(dir.path()).unwrap();
            for i in 0..range.start {
                let v = store.log.get(log_key(1, i)).unwrap().expect("durable write lost");
                assert_eq!(&v[..], &value(i)[..], "entry {i} changed");
            }
            for i in range.clone() {
                store.writer.write_durable(vec![Item::Put(Space::Log, log_key(1, i), value(i))]).await.unwrap();
            }
            if session == 0 {
                // A reopened journal is only appended to (see vendor/README.md).
                let allocated = journal_blocks(dir.path());
                let data = range.end * 5000;
                assert!(allocated >= data + 512 * 1024, "{allocated} bytes allocated for {data} of entries");
                assert!(allocated < data + 4 * 1024 * 1024, "{allocated} bytes allocated, all at once");
            }
            store.writer.stop().await.unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        for i in 0..900u64 {
            let v = store.log.get(log_key(1, i)).unwrap().expect("durable write lost");
            assert_eq!(&v[..], &value(i)[..], "entry {i} changed");
        }
        store.writer.stop().await.unwrap();
    }

    #[tokio::test]
    async fn requests_after_stop_fail() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.writer.stop().await.unwrap();
        let item = Item::Put(Space::Meta, vec![1], vec![2]);
        assert!(store.writer.write_durable(vec![item]).await.is_err());
    }
}
