//! The newest entries of one shard's log, kept in memory as they were appended.
//!
//! Every entry is read back soon after it is appended: by each replication stream that sends it to a
//! follower, and by the apply worker once it commits. Read from fjall, each of those reads is a range
//! scan plus a full decode of the command; from here it is a clone of an `Arc`. The cache holds a
//! contiguous run of indexes ending at the last appended entry, bounded in encoded bytes; a read that
//! starts below it (a follower far behind) goes to fjall as before.
//!
//! It mirrors the log's own changes: `append` adds at the end (an append that does not continue the
//! run restarts it), `truncate_after` drops the conflicting suffix, `purge` drops the prefix; and it
//! answers only a range it holds whole. So a read it answers is always what fjall would answer.

use std::collections::VecDeque;

use openraft::entry::RaftEntry;

use super::types::Entry;

/// Encoded bytes a shard's cache may hold. Replication and apply read entries within milliseconds of
/// their append, so a few hundred KiB already covers a busy shard's pipeline; the bound keeps 16 shards
/// under 16 MiB per node.
pub const DEFAULT_MAX_BYTES: usize = 1 << 20;

#[derive(Debug)]
pub struct LogCache {
    /// Entries with consecutive indexes, each with its encoded size.
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
    max_bytes: usize,
}

impl LogCache {
    pub fn new(max_bytes: usize) -> Self {
        LogCache { entries: VecDeque::new(), bytes: 0, max_bytes }
    }

    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(e, _)| e.index())
    }

    fn next_index(&self) -> Option<u64> {
        self.entries.back().map(|(e, _)| e.index() + 1)
    }

    /// Records an appended entry of `encoded` bytes. An entry that does not directly follow the last
    /// one restarts the run (openraft truncates before it overwrites, so this only happens after a
    /// snapshot install or a restart).
    pub fn push(&mut self, entry: Entry, encoded: usize) {
        if self.next_index().is_some_and(|next| next != entry.index()) {
            self.clear();
        }
        self.bytes += encoded;
        self.entries.push_back((entry, encoded));
        while self.bytes > self.max_bytes && self.entries.len() > 1 {
            if let Some((_, b)) = self.entries.pop_front() {
                self.bytes -= b;
            }
        }
    }

    /// Entries `[start, end)` if the cache holds every one of them, `None` if the read must go to
    /// fjall (part of the range is below the cache or past its last entry).
    pub fn get(&self, start: u64, end: u64) -> Option<Vec<Entry>> {
        let (first, next) = (self.first_index()?, self.next_index()?);
        if start < first || end > next {
            return None;
        }
        let skip = usize::try_from(start - first).ok()?;
        let take = usize::try_from(end.saturating_sub(start)).ok()?;
        Some(self.entries.iter().skip(skip).take(take).map(|(e, _)| e.clone()).collect())
    }

    /// The log dropped every entry from `from` on.
    pub fn truncate_from(&mut self, from: u64) {
        while self.next_index().is_some_and(|next| next > from) {
            if let Some((_, b)) = self.entries.pop_back() {
                self.bytes -= b;
            }
        }
    }

    /// The log dropped every entry up to and including `upto`.
    pub fn purge_upto(&mut self, upto: u64) {
        while self.first_index().is_some_and(|first| first <= upto) {
            if let Some((_, b)) = self.entries.pop_front() {
                self.bytes -= b;
            }
        }
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use openraft::entry::RaftEntry;

    use super::*;
    use crate::storage::types::TypeConfig;

    fn entry(index: u64) -> Entry {
        openraft::testing::blank_ent::<TypeConfig>(1, 1, index)
    }

    fn indexes(v: Option<Vec<Entry>>) -> Option<Vec<u64>> {
        v.map(|v| v.iter().map(|e| e.index()).collect())
    }

    #[test]
    fn answers_only_ranges_it_holds_whole() {
        let mut c = LogCache::new(1000);
        assert_eq!(indexes(c.get(0, 1)), None);
        for i in 5..10 {
            c.push(entry(i), 10);
        }
        assert_eq!(indexes(c.get(5, 10)), Some(vec![5, 6, 7, 8, 9]));
        assert_eq!(indexes(c.get(7, 9)), Some(vec![7, 8]));
        assert_eq!(indexes(c.get(8, 8)), Some(vec![]));
        assert_eq!(indexes(c.get(4, 8)), None, "below the cache: read the log");
        assert_eq!(indexes(c.get(7, 11)), None, "past the cache: read the log");
        assert_eq!(indexes(c.get(7, u64::MAX)), None);
    }

    #[test]
    fn stays_within_its_bytes_by_dropping_the_oldest() {
        let mut c = LogCache::new(25);
        for i in 1..=5 {
            c.push(entry(i), 10);
        }
        assert_eq!(indexes(c.get(4, 6)), Some(vec![4, 5]));
        assert_eq!(indexes(c.get(3, 6)), None);
        // One entry larger than the bound is still kept (the newest is always readable).
        c.push(entry(6), 100);
        assert_eq!(indexes(c.get(6, 7)), Some(vec![6]));
        assert_eq!(c.bytes, 100);
    }

    #[test]
    fn follows_truncation_purge_and_a_gap_like_the_log() {
        let mut c = LogCache::new(1000);
        for i in 1..=6 {
            c.push(entry(i), 1);
        }
        c.truncate_from(4);
        assert_eq!(indexes(c.get(1, 4)), Some(vec![1, 2, 3]));
        assert_eq!(indexes(c.get(1, 5)), None);
        c.push(entry(4), 1);
        assert_eq!(indexes(c.get(3, 5)), Some(vec![3, 4]));
        c.purge_upto(2);
        assert_eq!(indexes(c.get(3, 5)), Some(vec![3, 4]));
        assert_eq!(indexes(c.get(2, 5)), None);
        c.push(entry(9), 1);
        assert_eq!(indexes(c.get(9, 10)), Some(vec![9]), "a gap restarts the run");
        assert_eq!(indexes(c.get(4, 10)), None);
        c.truncate_from(0);
        assert_eq!(indexes(c.get(0, 1)), None);
        assert_eq!(c.bytes, 0);
    }
}
