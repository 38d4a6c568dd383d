//! openraft's log storage for one shard, on the node's shared fjall database.
//!
//! Every write is a request to the group-commit writer, which makes it durable before the `IOFlushed`
//! callback fires. `append` puts the entries in a [`LogCache`] and queues their write without waiting
//! for it: reads of the newest entries (replication, apply) come from the cache, and whatever reads
//! fjall (an older entry, a truncation or purge computing what to delete) first waits for the writer
//! to have written everything queued before ([`GroupCommit::barrier`]).
//!
//! [`GroupCommit::barrier`]: super::group_commit::GroupCommit::barrier

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
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
}

impl LogStore {
    pub fn new(shard: ShardId, store: Arc<Store>) -> Self {
        Self::with_cache_bytes(shard, store, DEFAULT_MAX_BYTES)
    }

    fn with_cache_bytes(shard: ShardId, store: Arc<Store>, bytes: usize) -> Self {
        LogStore { shard, store, cache: Arc::new(Mutex::new(LogCache::new(bytes))) }
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
        let last = match self.store.last_entry(self.shard)? {
            Some(e) => Some(e.log_id()),
            None => last_purged,
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
        // Rides on the next fsync: a committed id that is lost in a crash only means openraft
        // re-learns it, while one that survives lets a restart re-apply everything acknowledged.
        let item = match committed {
            Some(c) => Store::put_meta(self.shard, MetaKey::Committed, &c)?,
            None => Item::Del(Space::Meta, super::store::meta_key(self.shard, MetaKey::Committed)),
        };
        // Nor does it wait to be visible: only `read_committed` reads it, after a barrier.
        self.store.writer.queue(vec![item]);
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

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        // The marker and the deletions are one batch: a crash never leaves a hole below a stale marker.
        // Deletions start after the previous purge: everything below it went in that purge's batch.
        self.cache().purge_upto(log_id.index);
        self.store.writer.barrier().await?;
        let previous: Option<LogId> = self.store.get_meta(self.shard, MetaKey::LastPurged)?;
        let from = previous.map_or(0, |p| p.index + 1);
        let mut items = vec![Store::put_meta(self.shard, MetaKey::LastPurged, &log_id)?];
        items.extend(self.store.log_deletions(self.shard, from, log_id.index)?);
        self.store.writer.write(items).await
    }
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
}
