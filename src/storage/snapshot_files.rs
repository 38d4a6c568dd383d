//! Durable snapshot files: one file per shard, written beside the Raft database, not inside it.
//!
//! Why files and not fjall values: a snapshot of a large shard is megabytes. Written through the
//! group-commit writer it queued every group's log appends (and so their heartbeats' answers) behind
//! one large write and fsync, and it went through fjall's journal, which a restart reads back in full.
//! Here a snapshot is written on the blocking pool by its own thread, fsynced on its own, and read at
//! restart with one sequential read.
//!
//! Layout: `dir/<shard>-<last applied index>.snap`, each file
//! `MAGIC ‖ meta length u32 LE ‖ postcard SnapshotMeta ‖ data length u64 LE ‖ data ‖ xxh3-64 LE of all before`.
//!
//! Durability: a snapshot is written to a temporary name, fsynced, renamed into place, and the
//! directory fsynced, before [`SnapshotFiles::write`] returns. openraft purges the log behind a
//! snapshot only after the snapshot call returned, so the log a snapshot replaces is never dropped
//! before the snapshot is on disk. A file with the final name is therefore whole; older files of the
//! shard are removed afterwards (a crash in between leaves one behind, and the newest wins on read).
//! A file that fails its checksum is an error naming the file, never silently skipped: an older
//! snapshot without the log it replaced would lose acknowledged writes.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use lsm_tree::file::PacedFile;

use super::store::{decode, encode};
use super::types::SnapshotMeta;
use crate::ids::ShardId;

const MAGIC: &[u8; 8] = b"THSNAP01";
const SUFFIX: &str = ".snap";
const TMP_MARK: &str = ".tmp";

/// The snapshot directory of one node.
pub struct SnapshotFiles {
    dir: PathBuf,
    /// Makes temporary names unique when two snapshots of one shard are written at once.
    seq: AtomicU64,
    /// The buffer the last snapshot was encoded in, kept for the next one (see [`SnapshotFiles::buffer`]).
    spare: Mutex<Vec<u8>>,
}

/// The largest encoding buffer kept between snapshots. A shard of a million-twin fleet encodes into
/// about 55 MB at 8 shards, so about 150 MB at 3; a buffer above this is freed after use rather than held,
/// so a large shard's snapshots do not keep their size resident between them.
const SPARE_LIMIT: usize = 64 << 20;

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// `(shard, index)` of a final snapshot file name.
fn parse_name(name: &str) -> Option<(ShardId, u64)> {
    let stem = name.strip_suffix(SUFFIX)?;
    let (shard, index) = stem.split_once('-')?;
    Some((shard.parse().ok()?, index.parse().ok()?))
}

fn file_name(shard: ShardId, index: u64) -> String {
    format!("{shard}-{index:020}{SUFFIX}")
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl SnapshotFiles {
    /// Opens (or creates) the directory and removes temporary files a crash left behind.
    pub fn open(dir: PathBuf) -> io::Result<SnapshotFiles> {
        crate::secrets::create_dir_durably(&dir, |d| std::fs::create_dir_all(d))?;
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().contains(TMP_MARK) {
                std::fs::remove_file(entry.path())?;
            }
        }
        Ok(SnapshotFiles { dir, seq: AtomicU64::new(0), spare: Mutex::new(Vec::new()) })
    }

    /// Final snapshot files of `shard`, as `(index, path)`, oldest first.
    fn files_of(&self, shard: ShardId) -> io::Result<Vec<(u64, PathBuf)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            if let Some((s, index)) = parse_name(&entry.file_name().to_string_lossy()) {
                if s == shard {
                    out.push((index, entry.path()));
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// The newest snapshot of `shard`, if it has one. Blocking.
    pub fn read(&self, shard: ShardId) -> io::Result<Option<(SnapshotMeta, Vec<u8>)>> {
        let Some((_, path)) = self.files_of(shard)?.pop() else {
            return Ok(None);
        };
        let mut bytes = Vec::new();
        File::open(&path)?.read_to_end(&mut bytes)?;
        decode_file(bytes).map(Some).map_err(|e| invalid(format!("snapshot file {}: {e}", path.display())))
    }

    /// A buffer to encode a snapshot into, with room for `size_hint` bytes: the one the last snapshot
    /// used, if no other snapshot holds it. Encoding into fresh memory faulted in every page of tens
    /// of megabytes, each time; on this kind of virtual machine that was half of a snapshot's cost
    /// (benches/README.md). Hand it back with [`SnapshotFiles::keep`].
    pub fn buffer(&self, size_hint: usize) -> Vec<u8> {
        let mut buf = std::mem::take(&mut *self.spare.lock().unwrap_or_else(|e| e.into_inner()));
        buf.clear();
        if buf.capacity() < size_hint {
            // A quarter more, so the next shard's a little larger snapshot still fits: a buffer
            // grown again is fresh memory again. Room never written to is never resident.
            buf = Vec::with_capacity(size_hint + size_hint / 4);
        }
        buf
    }

    /// Keeps `buf` for the next snapshot, unless it is over [`SPARE_LIMIT`] or a larger one is kept.
    pub fn keep(&self, mut buf: Vec<u8>) {
        if buf.capacity() > SPARE_LIMIT {
            return;
        }
        buf.clear();
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        if buf.capacity() > spare.capacity() {
            *spare = buf;
        }
    }

    /// Writes the snapshot of `shard` durably and removes the shard's older files. Blocking.
    pub fn write(&self, shard: ShardId, meta: &SnapshotMeta, data: &[u8]) -> io::Result<()> {
        let index = meta.last_log_id.map_or(0, |l| l.index);
        let name = file_name(shard, index);
        let tmp = self.dir.join(format!("{name}{TMP_MARK}{}", self.seq.fetch_add(1, Ordering::Relaxed)));
        let result = (|| {
            // Paced: the file reaches the device a MiB at a time as it is written, not all at once
            // at its fsync, so the node's log fsyncs meanwhile never wait behind megabytes of it.
            let mut f = io::BufWriter::new(PacedFile::new(File::create(&tmp)?));
            write_file(&mut f, meta, data)?;
            let f = f.into_inner().map_err(|e| e.into_error())?;
            f.sync_all()?;
            std::fs::rename(&tmp, self.dir.join(&name))?;
            sync_dir(&self.dir)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result?;
        for (old, path) in self.files_of(shard)? {
            if old < index {
                std::fs::remove_file(path)?;
            }
        }
        Ok(())
    }
}

/// Writes the file format to `out`, hashing as it goes (the data is not copied).
fn write_file(out: &mut impl Write, meta: &SnapshotMeta, data: &[u8]) -> io::Result<()> {
    let meta = encode(meta)?;
    let meta_len = u32::try_from(meta.len()).map_err(|_| invalid("snapshot meta too large".into()))?;
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for part in [MAGIC.as_slice(), &meta_len.to_le_bytes(), &meta, &(data.len() as u64).to_le_bytes(), data] {
        hasher.update(part);
        out.write_all(part)?;
    }
    out.write_all(&hasher.digest().to_le_bytes())
}

/// The meta and data of a file's bytes; the data keeps the file's buffer (a restart reads every
/// shard's snapshot, megabytes each: no second copy).
fn decode_file(mut bytes: Vec<u8>) -> Result<(SnapshotMeta, Vec<u8>), String> {
    let body_len = bytes.len().checked_sub(8).ok_or("shorter than its checksum")?;
    let (body, sum) = bytes.split_at(body_len);
    let sum = u64::from_le_bytes(sum.try_into().map_err(|_| "checksum")?);
    if xxhash_rust::xxh3::xxh3_64(body) != sum {
        return Err("checksum mismatch".into());
    }
    let rest = body.strip_prefix(MAGIC.as_slice()).ok_or("not a snapshot file (magic)")?;
    let (meta_len, rest) = rest.split_first_chunk::<4>().ok_or("truncated meta length")?;
    let meta_len = u32::from_le_bytes(*meta_len) as usize;
    let (meta, rest) = rest.split_at_checked(meta_len).ok_or("truncated meta")?;
    let (data_len, data) = rest.split_first_chunk::<8>().ok_or("truncated data length")?;
    if u64::from_le_bytes(*data_len) != data.len() as u64 {
        return Err("data length mismatch".into());
    }
    let meta: SnapshotMeta = decode(meta).map_err(|e| e.to_string())?;
    let start = body_len - data.len();
    bytes.truncate(body_len);
    bytes.drain(..start);
    Ok((meta, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::types::{LogId, StoredMembership};

    fn meta(index: u64) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: Some(LogId::new(openraft::impls::leader_id_adv::LeaderId { term: 1, node_id: 0 }, index)),
            last_membership: StoredMembership::default(),
        }
    }

    #[test]
    fn newest_file_wins_and_older_ones_are_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = SnapshotFiles::open(dir.path().join("snapshots")).expect("open");
        assert!(files.read(3).expect("read").is_none());
        files.write(3, &meta(10), b"ten").expect("write");
        files.write(3, &meta(20), b"twenty").expect("write");
        files.write(4, &meta(5), b"other shard").expect("write");
        let (m, data) = files.read(3).expect("read").expect("some");
        assert_eq!((m.last_log_id.map(|l| l.index), data.as_slice()), (Some(20), b"twenty".as_slice()));
        assert_eq!(files.files_of(3).expect("list").len(), 1, "older snapshot left behind");
        assert_eq!(files.read(4).expect("read").expect("some").1, b"other shard");
    }

    /// A snapshot of several MiB goes through the paced writer in one slice, which it splits at
    /// each MiB to hand the part before to the device: every byte must come back, checksum included.
    #[test]
    fn a_snapshot_of_several_mib_is_written_paced_and_read_back_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = SnapshotFiles::open(dir.path().to_path_buf()).expect("open");
        let size = 3 * lsm_tree::file::PACE_BYTES as usize + 12_345;
        let data: Vec<u8> = (0..size as u64).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        files.write(2, &meta(9), &data).expect("write");
        let (m, back) = files.read(2).expect("read").expect("some");
        assert_eq!(m.last_log_id.map(|l| l.index), Some(9));
        assert!(back == data, "{} bytes back of {size}", back.len());
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = SnapshotFiles::open(dir.path().to_path_buf()).expect("open");
        files.write(1, &meta(7), b"payload").expect("write");
        let path = dir.path().join(file_name(1, 7));
        let mut bytes = std::fs::read(&path).expect("read");
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(&path, &bytes).expect("damage");
        let err = files.read(1).expect_err("damaged file accepted");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains(&file_name(1, 7)), "{err}");
    }

    #[test]
    fn a_kept_buffer_is_handed_out_again_empty_unless_too_large() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = SnapshotFiles::open(dir.path().to_path_buf()).expect("open");
        let mut buf = files.buffer(1000);
        buf.extend_from_slice(b"last snapshot");
        let at = buf.as_ptr();
        files.keep(buf);
        let again = files.buffer(10);
        assert!(again.is_empty() && again.capacity() >= 1000 && again.as_ptr() == at, "not the kept buffer");
        let taken_meanwhile = files.buffer(10);
        assert!(taken_meanwhile.capacity() < 1000, "a second snapshot meanwhile gets its own buffer");
        files.keep(again);
        files.keep(Vec::with_capacity(SPARE_LIMIT + 1));
        assert!(files.buffer(0).capacity() < SPARE_LIMIT, "an oversized buffer was kept");
    }

    #[test]
    fn leftover_temporary_files_are_removed_on_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(format!("{}{TMP_MARK}0", file_name(2, 9))), b"half").expect("leftover");
        let files = SnapshotFiles::open(dir.path().to_path_buf()).expect("open");
        assert!(files.read(2).expect("read").is_none());
        assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 0);
    }
}
