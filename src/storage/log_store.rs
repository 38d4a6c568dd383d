//! openraft's log storage for one shard, on the node's shared fjall database.
//!
//! Every write is a request to the group-commit writer, which makes it durable before the `IOFlushed`
//! callback fires. `append` puts the entries in a [`LogCache`] and queues their write without waiting
//! for it: reads of the newest entries (replication, apply) come from the cache, and whatever reads
//! fjall (an older entry, a truncation or purge computing what to delete) first waits for the writer
//! to have written everything queued before ([`GroupCommit::barrier`]).
//!
//! A purge writes only its marker in line; the purged entries are deleted afterwards, in the
//! background and a few hundred per writer round (see [`LogStore::purge`]).
//!
//! [`GroupCommit::barrier`]: super::group_commit::GroupCommit::barrier

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogStorage};
use openraft::{OptionalSend, RaftLogReader};

use super::group_commit::{Item, Space};
use super::log_cache::{LogCache, DEFAULT_MAX_BYTES};
use super::store::{encode, log_key, MetaKey, Store};
use super::types::{Entry, LogId, TypeConfig, Vote};
use crate::ids::ShardId;

/// The log of one shard. Cheap to clone: clones are the log readers replication tasks use, and they
/// share one cache.
#[derive(Clone)]
pub struct LogStore {
    shard: ShardId,
    store: Arc<Store>,
    cache: Arc<Mutex<LogCache>>,
    /// One past the last purged index (0: nothing purged). Entries below it may still be in fjall
    /// until their deletion is written, so reads start here.
    first_kept: Arc<AtomicU64>,
    /// Taken by a purge's deletions for as long as they run, so that the next purge's deletions start
    /// where these ended.
    deleting: Arc<tokio::sync::Mutex<()>>,
}

/// How many deletions of purged entries go to the writer in one request. The writer takes requests in
/// order and every shard's appends on the node wait for its round, so a purge's deletions are
/// written one such request at a time: a purge of ten thousand entries in one request held every
/// append of the node for 10–25 ms.
const DELETIONS_PER_ROUND: usize = 512;

impl LogStore {
    pub fn new(shard: ShardId, store: Arc<Store>) -> Self {
        Self::with_cache_bytes(shard, store, DEFAULT_MAX_BYTES)
    }

    fn with_cache_bytes(shard: ShardId, store: Arc<Store>, bytes: usize) -> Self {
        LogStore {
            shard,
            store,
            cache: Arc::new(Mutex::new(LogCache::new(bytes))),
            first_kept: Arc::new(AtomicU64::new(0)),
            deleting: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Notes that everything up to `purged` is purged: reads no longer reach below it.
    fn purged(&self, purged: Option<&LogId>) {
        if let Some(p) = purged {
            self.first_kept.fetch_max(p.index.saturating_add(1), Ordering::AcqRel);
        }
    }

    fn cache(&self) -> MutexGuard<'_, LogCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn bounds<RB: RangeBounds<u64>>(range: &RB) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let (start, end) = bounds(&range);
        // Purged entries whose deletion is not yet written are not part of the log.
        let start = start.max(self.first_kept.load(Ordering::Acquire));
        if let Some(hit) = self.cache().get(start, end) {
            return Ok(hit);
        }
        self.store.writer.barrier().await?;
        self.store.entries(self.shard, start, end)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.store.get_meta(self.shard, MetaKey::Vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        self.store.writer.barrier().await?;
        let last_purged: Option<LogId> = self.store.get_meta(self.shard, MetaKey::LastPurged)?;
        self.purged(last_purged.as_ref());
        // The last entry in fjall can be a purged one whose deletion a crash interrupted, when no
        // entry follows the purge point (a snapshot installed ahead of the log).
        let last = match self.store.last_entry(self.shard)? {
            Some(e) if last_purged.as_ref().is_none_or(|p| e.index() > p.index) => Some(e.log_id()),
            _ => last_purged,
        };
        Ok(LogState { last_purged_log_id: last_purged, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let item = Store::put_meta(self.shard, MetaKey::Vote, vote)?;
        self.store.writer.write_durable(vec![item]).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Rides on the next request of any group, without a writer round of its own: a committed id
        // that is lost in a crash only means openraft re-learns it, while one that survives lets a
        // restart re-apply everything acknowledged.
        let item = match committed {
            Some(c) => Store::put_meta(self.shard, MetaKey::Committed, &c)?,
            None => Item::Del(Space::Meta, super::store::meta_key(self.shard, MetaKey::Committed)),
        };
        // Nor does it wait to be visible: only `read_committed` reads it, after a barrier.
        self.store.writer.queue_unhurried(vec![item]);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        self.store.writer.barrier().await?;
        self.store.get_meta(self.shard, MetaKey::Committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<TypeConfig>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        for e in entries {
            let bytes = encode(&e)?;
            encoded.push((e, bytes));
        }
        // Cached before the writer makes the entries visible in fjall, and only once all of them
        // encoded: the cache never holds an entry the log will not have.
        let mut items = Vec::with_capacity(encoded.len());
        {
            let mut cache = self.cache();
            for (e, bytes) in encoded {
                let index = e.index();
                cache.push(e, bytes.len());
                items.push(Item::Put(Space::Log, log_key(self.shard, index), bytes));
            }
        }
        self.store.writer.append(items, callback);
        Ok(())
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = last_log_id.map(|l| l.index + 1).unwrap_or(0);
        self.cache().truncate_from(from);
        // The deletions are computed from what fjall holds: every append queued before must be in it.
        self.store.writer.barrier().await?;
        let items = self.store.log_deletions(self.shard, from, u64::MAX)?;
        self.store.writer.write(items).await
    }

    /// Writes the purge marker in line and deletes the purged entries afterwards, in the background.
    ///
    /// openraft's core waits for a purge, and every shard's appends on the node wait for the writer
    /// round that carries it. A snapshot purges ten thousand entries or more at once, so the deletions
    /// run apart: in order, [`DELETIONS_PER_ROUND`] per request, each request written before the next
    /// is queued. The marker is queued before any of them, so on disk a deletion is never ahead of its
    /// marker and the log never has a hole above the marker. A crash in between leaves entries below
    /// the marker: reads never reach below it ([`LogStore::first_kept`]), and the next purge deletes
    /// them, since deletions resume from what the last written request recorded (`DeletedThrough`).
    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.cache().purge_upto(log_id.index);
        self.purged(Some(&log_id));
        self.store.writer.queue(vec![Store::put_meta(self.shard, MetaKey::LastPurged, &log_id)?]);
        let (store, shard, deleting) = (self.store.clone(), self.shard, self.deleting.clone());
        tokio::spawn(async move {
            let _turn = deleting.lock().await;
            if let Err(e) = delete_purged(&store, shard, log_id.index).await {
                // Only garbage is left: the next purge deletes it. A failed writer says so itself.
                tracing::debug!(shard, upto = log_id.index, "deleting purged log entries: {e}");
            }
        });
        Ok(())
    }
}

/// Deletes `shard`'s entries up to `upto` from where the previous deletions ended.
async fn delete_purged(store: &Store, shard: ShardId, upto: u64) -> io::Result<()> {
    // The ends of the range are read from fjall: every append queued before must be in it.
    store.writer.barrier().await?;
    let from = store.get_meta::<u64>(shard, MetaKey::DeletedThrough)?.map_or(0, |d| d.saturating_add(1));
    let Some(present) = store.present_indexes(shard, from, upto)? else { return Ok(()) };
    let (mut next, last) = present.into_inner();
    while next <= last {
        let through = last.min(next.saturating_add(DELETIONS_PER_ROUND as u64 - 1));
        let mut items: Vec<Item> = (next..=through).map(|i| Item::Del(Space::Log, log_key(shard, i))).collect();
        items.push(Store::put_meta(shard, MetaKey::DeletedThrough, &through)?);
        store.writer.write(items).await?;
        next = through.saturating_add(1);
        if through == u64::MAX {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use openraft::testing::{blank_ent, log_id};

    use super::*;

    fn indexes(entries: &[Entry]) -> Vec<u64> {
        entries.iter().map(|e| e.index()).collect()
    }

    async fn append(log: &mut LogStore, indexes: std::ops::RangeInclusive<u64>) {
        let entries = indexes.map(|i| blank_ent::<TypeConfig>(1, 1, i));
        tokio::time::timeout(Duration::from_secs(5), log.append(entries, IOFlushed::noop()))
            .await
            .expect("append waited for the writer")
            .expect("append");
    }

    /// `append` returns while the writer is held; a read of an entry the cache no longer has, a
    /// truncation and a committed id queued behind it all wait for the writer and see the appends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_do_not_wait_for_the_writer_and_whatever_reads_fjall_sees_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(Store::open(dir.path()).expect("open"));
        // A cache of one byte keeps only the newest entry.
        let mut log = LogStore::with_cache_bytes(0, store.clone(), 1);

        let release = store.writer.hold();
        append(&mut log, 1..=5).await;
        let mut reader = log.get_log_reader().await;
        let read = tokio::spawn(async move { reader.try_get_log_entries(1..3).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!read.is_finished(), "read fjall before the writer had written the appends");
        drop(release);
        let got = read.await.expect("read task").expect("read");
        assert_eq!(indexes(&got), [1, 2]);

        let release = store.writer.hold();
        append(&mut log, 6..=8).await;
        let truncate = tokio::spawn(async move {
            log.truncate_after(Some(log_id::<TypeConfig>(1, 1, 5))).await.expect("truncate");
            log
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!truncate.is_finished(), "computed the truncation before the writer had written the appends");
        drop(release);
        let mut log = truncate.await.expect("truncate task");
        assert_eq!(indexes(&store.entries(0, 0, 100).expect("entries")), [1, 2, 3, 4, 5]);

        let committed = Some(log_id::<TypeConfig>(1, 1, 5));
        log.save_committed(committed).await.expect("save committed");
        assert_eq!(log.read_committed().await.expect("read committed"), committed);
        store.writer.stop().await.expect("stop");
    }

    /// Waits until fjall holds exactly `want` of shard 0's log.
    async fn until_fjall_holds(store: &Store, want: std::ops::RangeInclusive<u64>) {
        let want: Vec<u64> = want.collect();
        for _ in 0..500 {
            if indexes(&store.entries(0, 0, u64::MAX).expect("entries")) == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the purged entries were not deleted");
    }

    /// A purge waits neither for the writer nor for its deletions, and reads start above it at once.
    /// Entries a crash left below a marker (written, their deletions not) are not part of the log,
    /// not even its last entry, and the next purge deletes them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_purge_deletes_in_the_background_and_reads_never_reach_below_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(Store::open(dir.path()).expect("open"));
        let mut log = LogStore::with_cache_bytes(0, store.clone(), 1);
        append(&mut log, 1..=1500).await;

        let release = store.writer.hold();
        tokio::time::timeout(Duration::from_secs(5), log.purge(log_id::<TypeConfig>(1, 1, 1200)))
            .await
            .expect("the purge waited for the writer")
            .expect("purge");
        let mut reader = log.get_log_reader().await;
        let read = tokio::spawn(async move { reader.try_get_log_entries(0..1203).await });
        drop(release);
        assert_eq!(indexes(&read.await.expect("read task").expect("read")), [1201, 1202]);
        until_fjall_holds(&store, 1201..=1500).await;
        assert_eq!(store.get_meta::<u64>(0, MetaKey::DeletedThrough).expect("meta"), Some(1200));

        // A snapshot installed ahead of the log purges past its last entry; a crash comes between the
        // marker and the deletions, then a restart.
        let marker = log_id::<TypeConfig>(1, 1, 1600);
        store
            .writer
            .write(vec![Store::put_meta(0, MetaKey::LastPurged, &marker).expect("encode")])
            .await
            .expect("marker");
        let mut log = LogStore::with_cache_bytes(0, store.clone(), 1);
        let state = log.get_log_state().await.expect("log state");
        assert_eq!(state.last_purged_log_id, Some(marker));
        assert_eq!(state.last_log_id, Some(marker), "an entry left below the marker is not the last one");
        assert!(log.try_get_log_entries(0..2000).await.expect("read").is_empty());

        append(&mut log, 1601..=1610).await;
        log.purge(log_id::<TypeConfig>(1, 1, 1605)).await.expect("purge");
        until_fjall_holds(&store, 1606..=1610).await;
        store.writer.stop().await.expect("stop");
    }
}
