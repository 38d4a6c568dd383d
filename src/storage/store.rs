//! The node's Raft database: fjall handles, key encoding and reads. Writes go through the
//! [`GroupCommit`] writer only.
//!
//! Layout (one database under `data_dir/raft`):
//! - keyspace `log`: `shard u32 BE ‖ index u64 BE` → postcard `Entry`. Big-endian keys sort by
//!   shard, then index, so a shard's log is one contiguous range.
//! - keyspace `meta`: `shard u32 BE ‖ tag u8` → postcard value (vote, committed, last purged log id,
//!   how far the purged entries are deleted, snapshot meta) or raw snapshot bytes. Snapshots are no
//!   longer written here (see [`super::snapshot_files`]); one stored by an older version is still
//!   read, and removed once a newer snapshot file is durable.
//!
//! Snapshot files live in `data_dir/raft/snapshots`, beside fjall's own folders.

use std::io;
use std::ops::RangeInclusive;
use std::path::Path;

use fjall::{CompressionType, Database, Keyspace, KeyspaceCreateOptions, KvSeparationOptions};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::group_commit::{GroupCommit, Item, Space};
use super::snapshot_files::SnapshotFiles;
use super::types::{Entry, SnapshotMeta};
use crate::ids::{NodeId, ShardId};

/// Tags of per-shard metadata keys.
#[derive(Clone, Copy, Debug)]
#[repr(u8)]
pub enum MetaKey {
    Vote = 1,
    Committed = 2,
    LastPurged = 3,
    SnapshotMeta = 4,
    SnapshotData = 5,
    /// The highest index whose deletion after a purge is written (see `LogStore::purge`).
    DeletedThrough = 6,
}

pub struct Store {
    pub db: Database,
    pub log: Keyspace,
    pub meta: Keyspace,
    pub writer: GroupCommit,
    pub snapshots: SnapshotFiles,
    /// Encodes and writes snapshots, at a lower priority ([`super::background`]).
    pub background: super::background::Background,
}

pub fn log_key(shard: ShardId, index: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(12);
    k.extend_from_slice(&shard.to_be_bytes());
    k.extend_from_slice(&index.to_be_bytes());
    k
}

pub fn meta_key(shard: ShardId, key: MetaKey) -> Vec<u8> {
    let mut k = Vec::with_capacity(5);
    k.extend_from_slice(&shard.to_be_bytes());
    k.push(key as u8);
    k
}

/// A record as postcard bytes, written out with one allocation of its size (see
/// [`twinhub_core::scratch`]): every log entry passes here on every replica.
pub fn encode<T: Serialize>(v: &T) -> io::Result<Vec<u8>> {
    twinhub_core::scratch::postcard_vec(v)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("encode: {e}")))
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> io::Result<T> {
    postcard::from_bytes(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("decode: {e}")))
}

fn io_err(e: fjall::Error) -> io::Error {
    match e {
        fjall::Error::Io(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

/// The log's memtable: fjall's default (64 MiB) is resident memory that buys nothing here, since
/// entries are read back only by a lagging follower's replication and are purged behind every
/// snapshot.
const LOG_MEMTABLE_BYTES: u64 = 16 << 20;

/// The log memtable size of node `node`: [`LOG_MEMTABLE_BYTES`] times 0.8, 1.0 or 1.2, by node id.
///
/// Every replica of a shard receives the same entries. With one size, the replicas fill their log
/// memtables in step and flush them in the same fraction of a second, so for that moment a whole
/// majority is busy flushing and every commit waits for it. With sizes a fifth apart the replicas'
/// flushes drift apart (at 1,600 updates/s: every 24, 30 and 36 s), and most flushes slow one
/// replica while the other two still make the majority. Nodes are numbered from 1, so the founding
/// members of a three-node cluster get all three sizes. fjall records the size when it creates the
/// keyspace: a node's size is chosen once, with its data directory.
pub fn log_memtable_bytes(node: NodeId) -> u64 {
    LOG_MEMTABLE_BYTES * (4 + node % 3) / 5
}

/// Log entries of at least this many bytes (a bulk registry call's share of a shard, a large twin
/// write) are kept apart from the keys, in blob files written once when the memtable is flushed;
/// the LSM tree then compacts only keys and pointers. Entries live until the next snapshot purges
/// them, so with values inline the tree rewrote every byte of the log one or more times before
/// deleting it: at 1M bulk-loaded twins, compaction and its writes took an eighth of the CPU.
const LOG_BLOB_BYTES: u32 = 1024;

/// The log keyspace's options. Blobs are not compressed: entries are short-lived and mostly read
/// back from the cache in memory, so compressing them would cost CPU for disk space held briefly.
fn log_options(memtable_bytes: u64) -> KeyspaceCreateOptions {
    KeyspaceCreateOptions::default().max_memtable_size(memtable_bytes).with_kv_separation(Some(
        KvSeparationOptions::default().compression(CompressionType::None).separation_threshold(LOG_BLOB_BYTES),
    ))
}

/// Nice value of fjall's own threads, which flush memtables and compact in the background.
///
/// Every replica of a shard receives the same entries, so the three nodes fill their log memtables
/// in step and flush them within the same fraction of a second: on a busy machine that burst took
/// CPU from the threads serving requests, and the seconds with it were the slowest of a run. At a
/// lower priority the flush still gets every idle cycle and a share under contention, but yields
/// to request work when both want a core (like RocksDB's lowered priority for its compaction
/// threads). Background work only: nothing that acknowledges a write runs in these threads, and
/// the group-commit writer keeps the default priority. The snapshot thread ([`super::background`])
/// runs at the same value for the same reason. Measured in benches/README.md.
pub const BACKGROUND_NICE: i32 = 10;

/// Opens the database from a short-lived thread running at [`BACKGROUND_NICE`]: the workers fjall
/// starts while opening are spawned by that thread and inherit its priority (Linux keeps a nice value
/// per thread), so no later thread of the node is affected. Raising one's own nice value needs no
/// privilege; if it fails anyway, the database opens at the default priority.
fn open_in_background(dir: &Path) -> io::Result<Database> {
    let dir = dir.to_path_buf();
    let opener = std::thread::Builder::new().name("raft-db-open".into()).spawn(move || {
        if let Err(e) = rustix::process::setpriority_process(None, BACKGROUND_NICE) {
            tracing::warn!(error = %e, "could not lower the priority of fjall's background threads");
        }
        Database::builder(&dir).open().map_err(io_err)
    })?;
    opener.join().map_err(|_| io::Error::other("opening the raft database panicked"))?
}

impl Store {
    /// Opens (or creates) the database in `dir` and starts its writer thread.
    pub fn open(dir: &Path) -> io::Result<Store> {
        Store::open_with_log_memtable(dir, LOG_MEMTABLE_BYTES)
    }

    /// [`Store::open`] for node `node` of a cluster: its log memtable size is
    /// [`log_memtable_bytes`]`(node)` if the database is created now.
    pub fn open_for_node(dir: &Path, node: NodeId) -> io::Result<Store> {
        Store::open_with_log_memtable(dir, log_memtable_bytes(node))
    }

    fn open_with_log_memtable(dir: &Path, log_memtable_bytes: u64) -> io::Result<Store> {
        crate::secrets::create_dir_durably(dir, |d| std::fs::create_dir_all(d))?;
        // fjall's default hands every batch to the OS (one write syscall per group-commit batch); the
        // fsync that makes it durable is the group-commit writer's.
        let db = open_in_background(dir)?;
        let log = db.keyspace("log", || log_options(log_memtable_bytes)).map_err(io_err)?;
        let meta = db.keyspace("meta", KeyspaceCreateOptions::default).map_err(io_err)?;
        // fjall creates each keyspace's directory under `keyspaces/` without an fsync of `keyspaces/`
        // (and the database directory's own entry in its parent is ours to sync): until these syncs a
        // power loss may drop a whole keyspace directory, and with it every table flushed into it
        // (chaos/findings/2026-11-24-power-loss-keyspace-dir). Cheap when nothing changed.
        // A keyspace's own directory gets entries after its creation was synced (the log's `blobs`
        // folder), so each is synced too.
        let mut dirs: Vec<_> = std::fs::read_dir(dir.join("keyspaces"))?
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        dirs.extend([dir.join("keyspaces"), dir.to_path_buf()]);
        dirs.extend(dir.parent().map(Path::to_path_buf));
        for d in &dirs {
            std::fs::File::open(d)?.sync_all()?;
        }
        let snapshots = SnapshotFiles::open(dir.join("snapshots"))?;
        let writer = GroupCommit::start(db.clone(), log.clone(), meta.clone())?;
        let background = super::background::Background::start("raft-snapshots")?;
        Ok(Store { db, log, meta, writer, snapshots, background })
    }

    pub fn get_meta<T: DeserializeOwned>(&self, shard: ShardId, key: MetaKey) -> io::Result<Option<T>> {
        match self.meta.get(meta_key(shard, key)).map_err(io_err)? {
            Some(v) => decode(&v).map(Some),
            None => Ok(None),
        }
    }

    /// The latest durable snapshot of `shard` (meta, data): its snapshot file, or the one an older
    /// version kept in the database. Blocking.
    pub fn snapshot(&self, shard: ShardId) -> io::Result<Option<(SnapshotMeta, Vec<u8>)>> {
        match self.snapshots.read(shard)? {
            Some(s) => Ok(Some(s)),
            None => self.legacy_snapshot(shard),
        }
    }

    /// Deletions of the snapshot an older version kept in the database (absent keys are no-ops).
    pub fn drop_legacy_snapshot(shard: ShardId) -> Vec<Item> {
        [MetaKey::SnapshotMeta, MetaKey::SnapshotData].map(|k| Item::Del(Space::Meta, meta_key(shard, k))).into()
    }

    /// The snapshot of `shard` as an older version stored it, read from one consistent view.
    fn legacy_snapshot(&self, shard: ShardId) -> io::Result<Option<(SnapshotMeta, Vec<u8>)>> {
        use fjall::Readable;
        let view = self.db.snapshot();
        let meta = view.get(&self.meta, meta_key(shard, MetaKey::SnapshotMeta)).map_err(io_err)?;
        let data = view.get(&self.meta, meta_key(shard, MetaKey::SnapshotData)).map_err(io_err)?;
        match (meta, data) {
            (Some(m), Some(d)) => Ok(Some((decode(&m)?, d.to_vec()))),
            (None, None) => Ok(None),
            _ => Err(io::Error::new(io::ErrorKind::InvalidData, format!("shard {shard}: torn snapshot record"))),
        }
    }

    pub fn put_meta<T: Serialize>(shard: ShardId, key: MetaKey, v: &T) -> io::Result<Item> {
        Ok(Item::Put(Space::Meta, meta_key(shard, key), encode(v)?))
    }

    /// Entries of `shard` with index in `[start, end)`, in order.
    pub fn entries(&self, shard: ShardId, start: u64, end: u64) -> io::Result<Vec<Entry>> {
        if start >= end {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for guard in self.log.range(log_key(shard, start)..log_key(shard, end)) {
            let (_, v) = guard.into_inner().map_err(io_err)?;
            out.push(decode(&v)?);
        }
        Ok(out)
    }

    /// The entry with the highest index of `shard`.
    pub fn last_entry(&self, shard: ShardId) -> io::Result<Option<Entry>> {
        match self.log.range(log_key(shard, 0)..=log_key(shard, u64::MAX)).next_back() {
            Some(guard) => {
                let (_, v) = guard.into_inner().map_err(io_err)?;
                decode(&v).map(Some)
            }
            None => Ok(None),
        }
    }

    /// Deletions of the log keys of `shard` from the first present at or after `from` through `upto`
    /// (or the last present, if lower), as a truncation (a suffix, `upto` = `u64::MAX`) needs them.
    /// See [`Store::present_indexes`].
    pub fn log_deletions(&self, shard: ShardId, from: u64, upto: u64) -> io::Result<Vec<Item>> {
        let present = self.present_indexes(shard, from, upto)?;
        Ok(present.into_iter().flatten().map(|i| Item::Del(Space::Log, log_key(shard, i))).collect())
    }

    /// The indexes of `shard`'s log from the first present at or after `from` through `upto` (or the
    /// last present, if lower); `None` if none is. Computed, not read: a Raft log has every index
    /// between its first and last entry, and walking a thousand entries through fjall's merge of
    /// memtables and segments just to learn their keys was about 2 % of a node's CPU under steady
    /// writes. Only the two ends are read.
    pub fn present_indexes(&self, shard: ShardId, from: u64, upto: u64) -> io::Result<Option<RangeInclusive<u64>>> {
        let index_of = |key: &[u8]| -> io::Result<u64> {
            let tail: [u8; 8] = key
                .get(key.len().saturating_sub(8)..)
                .and_then(|t| t.try_into().ok())
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "log key without an index"))?;
            Ok(u64::from_be_bytes(tail))
        };
        let (lo, hi) = (log_key(shard, from), log_key(shard, upto));
        let first = match self.log.range(lo..=hi.clone()).next() {
            Some(guard) => index_of(&guard.key().map_err(io_err)?)?,
            None => return Ok(None),
        };
        let last = match self.log.range(log_key(shard, first)..=hi).next_back() {
            Some(guard) => index_of(&guard.key().map_err(io_err)?)?,
            None => return Ok(None),
        };
        Ok(Some(first..=last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_founding_members_log_memtables_differ_by_a_fifth() {
        let sizes: Vec<u64> = (1..=3).map(log_memtable_bytes).collect();
        let mut sorted = sizes.clone();
        sorted.sort();
        assert_eq!(sorted, [LOG_MEMTABLE_BYTES * 4 / 5, LOG_MEMTABLE_BYTES, LOG_MEMTABLE_BYTES * 6 / 5], "{sizes:?}");
        // Any three consecutive ids (a cluster that replaced its founders) get all three sizes too.
        for first in [4u64, 17, 1000] {
            let mut s: Vec<u64> = (first..first + 3).map(log_memtable_bytes).collect();
            s.sort();
            assert_eq!(s, sorted);
        }
    }

    /// A memtable flush and a compaction write their blob and table files through lsm-tree's paced
    /// writer (vendor/lsm-tree), which hands each MiB to the device as it is written: files of several
    /// MiB must come back whole after a reopen.
    #[test]
    fn log_files_of_several_mib_are_flushed_compacted_and_read_back_after_a_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let value = |i: u64| -> Vec<u8> { (0..3000 + i % 7).map(|j| (i.wrapping_mul(31) ^ j) as u8).collect() };
        let (entries, blob_bytes) = {
            let store = Store::open(dir.path()).expect("open");
            let mut bytes = 0;
            for i in 0..1500u64 {
                let v = value(i);
                bytes += v.len();
                store.log.insert(log_key(0, i), v).expect("insert");
                // Short values stay in the tables, beside the blobs' keys and pointers.
                store.log.insert(log_key(1, i), i.to_le_bytes()).expect("insert");
            }
            store.log.rotate_memtable_and_wait().expect("flush");
            store.log.major_compact().expect("compact");
            (1500u64, bytes)
        };
        assert!(blob_bytes as u64 > 3 * lsm_tree::file::PACE_BYTES, "{blob_bytes} bytes do not cross several MiB");
        let store = Store::open(dir.path()).expect("reopen");
        for i in 0..entries {
            assert_eq!(store.log.get(log_key(0, i)).expect("get").as_deref(), Some(value(i).as_slice()), "entry {i}");
            assert_eq!(store.log.get(log_key(1, i)).expect("get").as_deref(), Some(&i.to_le_bytes()[..]), "key {i}");
        }
    }

    #[test]
    fn log_keys_sort_by_shard_then_index() {
        let mut keys = vec![log_key(1, 0), log_key(0, u64::MAX), log_key(0, 256), log_key(0, 1)];
        keys.sort();
        assert_eq!(keys, vec![log_key(0, 1), log_key(0, 256), log_key(0, u64::MAX), log_key(1, 0)]);
    }

    /// `(thread name, nice value)` of every thread of this process.
    fn threads() -> Vec<(String, i32)> {
        let mut out = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task").flatten() {
            let Ok(name) = std::fs::read_to_string(task.path().join("comm")) else { continue };
            let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else { continue };
            let nice = rustix::process::getpriority_process(rustix::process::Pid::from_raw(tid));
            out.extend(nice.ok().map(|n| (name.trim_end().to_string(), n)));
        }
        out
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn fjall_background_threads_run_at_a_lower_priority_and_nothing_else_does() {
        let own = rustix::process::getpriority_process(None).expect("own priority");
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        // A thread names itself once it runs, so a thread just spawned may not carry its name yet:
        // wait (bounded) for the names. Other tests of this process open stores too; every thread of
        // a kind must have that kind's priority.
        let named = |prefix: &str| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            loop {
                let found: Vec<i32> =
                    threads().into_iter().filter(|(name, _)| name.starts_with(prefix)).map(|(_, n)| n).collect();
                if !found.is_empty() || std::time::Instant::now() > deadline {
                    break found;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        };
        let workers = named("fjall:");
        assert!(!workers.is_empty(), "no fjall worker thread found");
        assert!(workers.iter().all(|&n| n == BACKGROUND_NICE), "fjall workers' nice values: {workers:?}");
        assert_eq!(
            rustix::process::getpriority_process(None).expect("own priority"),
            own,
            "the caller's priority changed"
        );
        let writers = named("raft-group-comm");
        assert!(!writers.is_empty(), "no group-commit writer thread found");
        assert!(writers.iter().all(|&n| n == own), "group-commit writers' nice values: {writers:?}, expected {own}");
        store.writer.stop().await.expect("stop");
    }

    #[tokio::test]
    async fn a_snapshot_stored_by_an_older_version_is_read_until_a_file_replaces_it() {
        use crate::storage::types::LogId;
        let meta = |index| SnapshotMeta {
            last_log_id: Some(LogId::new(openraft::impls::leader_id_adv::LeaderId { term: 1, node_id: 0 }, index)),
            last_membership: Default::default(),
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let legacy = vec![
            Store::put_meta(2, MetaKey::SnapshotMeta, &meta(5)).expect("encode"),
            Item::Put(Space::Meta, meta_key(2, MetaKey::SnapshotData), b"old".to_vec()),
        ];
        store.writer.write_durable(legacy).await.expect("write");
        assert_eq!(store.snapshot(2).expect("read").expect("legacy").1, b"old");
        store.snapshots.write(2, &meta(9), b"new").expect("file");
        store.writer.write_durable(Store::drop_legacy_snapshot(2)).await.expect("drop");
        let (m, data) = store.snapshot(2).expect("read").expect("file");
        assert_eq!((m.last_log_id.map(|l| l.index), data.as_slice()), (Some(9), b"new".as_slice()));
        assert!(store.legacy_snapshot(2).expect("read").is_none());
        store.writer.stop().await.expect("stop");
    }

    #[tokio::test]
    async fn a_purge_deletes_exactly_the_present_keys_up_to_its_index() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let put = |shard: ShardId, i: u64| Item::Put(Space::Log, log_key(shard, i), vec![1]);
        let mut items: Vec<Item> = (5..=20).map(|i| put(1, i)).collect();
        items.extend([put(0, 3), put(0, 30), put(2, 0), put(2, 7)]);
        store.writer.write(items).await.expect("write");
        let deleted = |items: Vec<Item>| -> Vec<(ShardId, u64)> {
            items
                .into_iter()
                .map(|item| match item {
                    Item::Del(Space::Log, k) => {
                        let shard = ShardId::from_be_bytes(k[..4].try_into().expect("shard"));
                        (shard, u64::from_be_bytes(k[4..].try_into().expect("index")))
                    }
                    _ => panic!("not a log deletion"),
                })
                .collect()
        };
        // From below the first entry: starts at the first present key, ends at the purge index.
        let first = deleted(store.log_deletions(1, 0, 10).expect("purge"));
        assert_eq!(first, (5..=10).map(|i| (1, i)).collect::<Vec<_>>());
        // Beyond the last entry (a snapshot installed ahead of the log): ends at the last present key.
        let rest = deleted(store.log_deletions(1, 11, 1_000_000).expect("purge"));
        assert_eq!(rest, (11..=20).map(|i| (1, i)).collect::<Vec<_>>());
        // Nothing left in the range, and other shards are never touched.
        assert!(store.log_deletions(1, 21, 1_000_000).expect("purge").is_empty());
        assert!(store.log_deletions(3, 0, u64::MAX).expect("purge").is_empty());
        store.writer.stop().await.expect("stop");
    }
}
