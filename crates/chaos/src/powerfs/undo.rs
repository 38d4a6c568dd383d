//! The undo journal behind the power-loss file system: what to put back so that the backing tree looks
//! as if only what was synced had reached the disk.
//!
//! The file system writes through to a real backing directory and records, before each change, how to
//! undo it:
//!
//! - per file (keyed by inode): its size at the last `fsync`/`fdatasync` and the old contents of every
//!   page overwritten or cut off since (saved on the first touch of a page, so a page is saved once);
//!   a sync of the file forgets the record;
//! - per directory operation (create, mkdir, unlink, rmdir, rename), in order: what to do to undo it.
//!   A removed entry is moved to a trash directory outside the tree instead of deleted, so its undo can
//!   move it back. An operation becomes durable when the directory holding the new name (for a rename,
//!   its target directory; for a removal, the directory it was removed from) is fsynced: POSIX's
//!   strict reading, stricter than ext4's journal, which commits every pending name operation at once.
//!
//! Power loss applies every file record (truncate to the synced size, write the saved pages back), then
//! undoes the name operations that are not durable, newest first, so each undo sees the namespace as it
//! was right after its operation. A durable operation that depended on an undone one (a rename out of a
//! directory whose creation was never synced) cannot be honoured exactly: the undo of the older one
//! still happens (the directory is gone, as on a real disk) and the conflict is reported as a note.
//!
//! No FUSE here: the journal works on plain paths, so it is unit-tested on a temporary directory.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Page size of the undo records and of the optional torn write.
pub const PAGE: u64 = 4096;
/// Sector size: a torn page keeps a whole number of sectors of its new contents.
pub const SECTOR: u64 = 512;

#[derive(Debug, Default)]
struct FileUndo {
    /// Size at the last sync (or when first seen since).
    synced_size: u64,
    /// Page index → contents of the page at the last sync (only the part below `synced_size`).
    pages: BTreeMap<u64, Vec<u8>>,
}

impl FileUndo {
    /// Saves page `p` as it was at the last sync, unless it is saved already.
    fn save(&mut self, f: &File, p: u64) -> io::Result<()> {
        if let std::collections::btree_map::Entry::Vacant(e) = self.pages.entry(p) {
            e.insert(read_page(f, p, self.synced_size)?);
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
enum DirOp {
    /// `path` was created (file or directory) in directory `dir`.
    Created { dir: u64, path: PathBuf },
    /// `path` was removed from `dir`; it waits in the trash at `trash`.
    Removed { dir: u64, path: PathBuf, trash: PathBuf, ino: u64 },
    /// `from` was renamed to `to` (in directory `to_dir`); what `to` named before waits at `replaced`.
    Renamed { to_dir: u64, from: PathBuf, to: PathBuf, replaced: Option<(PathBuf, u64)> },
}

impl DirOp {
    fn dir(&self) -> u64 {
        match self {
            DirOp::Created { dir, .. } | DirOp::Removed { dir, .. } => *dir,
            DirOp::Renamed { to_dir, .. } => *to_dir,
        }
    }
}

/// What a power loss dropped.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LossReport {
    /// Files whose contents or size were rolled back.
    pub files_rolled_back: usize,
    /// Bytes of unsynced data dropped (pages restored plus bytes cut beyond the synced size).
    pub bytes_dropped: u64,
    /// Name operations undone.
    pub dir_ops_undone: usize,
    /// A torn page: (path, offset of the page, bytes of new data kept).
    pub torn: Option<(PathBuf, u64, u64)>,
    /// What could not be undone exactly, and why.
    pub notes: Vec<String>,
    /// Each name operation undone, newest first (for the log).
    pub undone: Vec<String>,
}

/// The undo records of one mounted tree.
#[derive(Debug)]
pub struct Journal {
    trash_dir: PathBuf,
    trash_seq: u64,
    files: HashMap<u64, FileUndo>,
    ops: Vec<DirOp>,
    /// Inodes in the trash whose removal is durable: deleted for good once closed.
    durable_trash: HashMap<u64, PathBuf>,
    /// The last page written since its file's sync: (inode, page index).
    last_write: Option<(u64, u64)>,
}

fn read_page(f: &File, page: u64, limit: u64) -> io::Result<Vec<u8>> {
    let start = page * PAGE;
    let end = ((page + 1) * PAGE).min(limit);
    if end <= start {
        return Ok(Vec::new());
    }
    let mut buf = vec![0u8; (end - start) as usize];
    f.read_exact_at(&mut buf, start)?;
    Ok(buf)
}

impl Journal {
    /// A journal whose removed entries wait in `trash_dir` (created if missing; outside the tree).
    pub fn new(trash_dir: PathBuf) -> io::Result<Journal> {
        std::fs::create_dir_all(&trash_dir)?;
        Ok(Journal {
            trash_dir,
            trash_seq: 0,
            files: HashMap::new(),
            ops: Vec::new(),
            durable_trash: HashMap::new(),
            last_write: None,
        })
    }

    fn record(&mut self, ino: u64, f: &File) -> io::Result<&mut FileUndo> {
        Ok(match self.files.entry(ino) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(FileUndo { synced_size: f.metadata()?.len(), pages: BTreeMap::new() }),
        })
    }

    /// Saves what a write of `len` bytes at `offset` to `f` (inode `ino`) will overwrite. Call before
    /// writing; `f` must be readable.
    pub fn before_write(&mut self, ino: u64, f: &File, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let rec = self.record(ino, f)?;
        let synced = rec.synced_size;
        let first = offset / PAGE;
        let last = (offset + len - 1) / PAGE;
        for p in first..=last {
            if p * PAGE >= synced {
                break;
            }
            rec.save(f, p)?;
        }
        self.last_write = Some((ino, last));
        Ok(())
    }

    /// Saves what truncating `f` to `new_size` cuts off (and notes the size). Call before truncating.
    pub fn before_truncate(&mut self, ino: u64, f: &File, new_size: u64) -> io::Result<()> {
        let rec = self.record(ino, f)?;
        let synced = rec.synced_size;
        if new_size < synced {
            for p in new_size / PAGE..synced.div_ceil(PAGE) {
                rec.save(f, p)?;
            }
        }
        Ok(())
    }

    /// Notes a size change that keeps contents (fallocate): the synced size is remembered.
    pub fn before_resize(&mut self, ino: u64, f: &File) -> io::Result<()> {
        self.record(ino, f).map(|_| ())
    }

    /// `fsync`/`fdatasync` of inode `ino`: its contents are durable.
    pub fn sync_file(&mut self, ino: u64) {
        self.files.remove(&ino);
        if self.last_write.is_some_and(|(i, _)| i == ino) {
            self.last_write = None;
        }
    }

    /// Whether inode `ino` has unsynced changes (tests, and the summary).
    pub fn is_dirty(&self, ino: u64) -> bool {
        self.files.contains_key(&ino)
    }

    /// Name operations not yet durable.
    pub fn pending_dir_ops(&self) -> usize {
        self.ops.len()
    }

    /// `path` was just created in directory inode `dir`.
    pub fn created(&mut self, dir: u64, path: PathBuf) {
        self.ops.push(DirOp::Created { dir, path });
    }

    /// Where to move an entry being removed (or replaced by a rename): a fresh trash path.
    pub fn trash_path(&mut self) -> PathBuf {
        self.trash_seq += 1;
        self.trash_dir.join(format!("t{}", self.trash_seq))
    }

    /// `path` (inode `ino`) was removed from directory `dir` by moving it to `trash`.
    pub fn removed(&mut self, dir: u64, path: PathBuf, trash: PathBuf, ino: u64) {
        self.ops.push(DirOp::Removed { dir, path, trash, ino });
    }

    /// `from` was renamed to `to` in directory `to_dir`; `replaced` is where the entry `to` named before
    /// was moved (and its inode).
    pub fn renamed(&mut self, to_dir: u64, from: PathBuf, to: PathBuf, replaced: Option<(PathBuf, u64)>) {
        self.ops.push(DirOp::Renamed { to_dir, from, to, replaced });
    }

    /// `fsync` of directory inode `dir`: its name operations are durable. Returns the trashed inodes
    /// whose removal became durable (the caller deletes them once no handle is open).
    pub fn sync_dir(&mut self, dir: u64) -> Vec<(u64, PathBuf)> {
        let mut gone = Vec::new();
        self.ops.retain(|op| {
            if op.dir() != dir {
                return true;
            }
            match op {
                DirOp::Removed { trash, ino, .. } => gone.push((*ino, trash.clone())),
                DirOp::Renamed { replaced: Some((trash, ino)), .. } => gone.push((*ino, trash.clone())),
                _ => {}
            }
            false
        });
        for (ino, p) in &gone {
            self.durable_trash.insert(*ino, p.clone());
        }
        gone
    }

    /// Forgets a trashed inode deleted for good (and its file record).
    pub fn forget_trashed(&mut self, ino: u64) {
        self.durable_trash.remove(&ino);
        self.files.remove(&ino);
    }

    /// Trashed inodes whose removal is durable.
    pub fn durable_trash(&self) -> Vec<(u64, PathBuf)> {
        self.durable_trash.iter().map(|(i, p)| (*i, p.clone())).collect()
    }

    /// Drops everything unsynced. `path_of` gives an inode's current path (its name in the tree or in
    /// the trash). `tear`, if given, picks how many sectors (1..=7) of the last unsynced page written
    /// keep their new contents (a write torn by the power cut); `None` keeps none.
    pub fn power_loss(&mut self, path_of: &dyn Fn(u64) -> Option<PathBuf>, tear: Option<u64>) -> LossReport {
        let mut rep = LossReport::default();
        // The page to tear, read before it is restored.
        let torn = match (tear, self.last_write) {
            (Some(sectors), Some((ino, page))) => path_of(ino).and_then(|p| {
                let f = File::open(&p).ok()?;
                let len = f.metadata().ok()?.len();
                let new = read_page(&f, page, len).ok()?;
                let keep = (sectors.clamp(1, 7) * SECTOR).min(new.len() as u64);
                (keep > 0).then(|| (p, page * PAGE, new[..keep as usize].to_vec()))
            }),
            _ => None,
        };
        let files = std::mem::take(&mut self.files);
        for (ino, rec) in files {
            let Some(path) = path_of(ino) else {
                rep.notes.push(format!(
                    "inode {ino}: unsynced changes but no path (deleted for good); nothing to roll back"
                ));
                continue;
            };
            let res = (|| -> io::Result<u64> {
                let f = std::fs::OpenOptions::new().write(true).open(&path)?;
                let now = f.metadata()?.len();
                f.set_len(rec.synced_size)?;
                let mut dropped = now.saturating_sub(rec.synced_size);
                for (p, old) in &rec.pages {
                    f.write_all_at(old, p * PAGE)?;
                    dropped += old.len() as u64;
                }
                Ok(dropped)
            })();
            match res {
                Ok(d) => {
                    rep.files_rolled_back += 1;
                    rep.bytes_dropped += d;
                }
                Err(e) => rep.notes.push(format!("{}: roll back failed: {e}", path.display())),
            }
        }
        if let Some((path, off, data)) = torn {
            let res = std::fs::OpenOptions::new().write(true).open(&path).and_then(|f| f.write_all_at(&data, off));
            match res {
                Ok(()) => rep.torn = Some((path, off, data.len() as u64)),
                Err(e) => rep.notes.push(format!("{}: tearing the page at {off} failed: {e}", path.display())),
            }
        }
        let ops = std::mem::take(&mut self.ops);
        for op in ops.into_iter().rev() {
            let res = match &op {
                DirOp::Created { path, .. } => remove_any(path),
                DirOp::Removed { path, trash, .. } => std::fs::rename(trash, path),
                DirOp::Renamed { from, to, replaced, .. } => std::fs::rename(to, from).and_then(|()| match replaced {
                    Some((trash, _)) => std::fs::rename(trash, to),
                    None => Ok(()),
                }),
            };
            match res {
                Ok(()) => {
                    rep.dir_ops_undone += 1;
                    rep.undone.push(match &op {
                        DirOp::Created { path, .. } => format!("created {}", path.display()),
                        DirOp::Removed { path, .. } => format!("removed {}", path.display()),
                        DirOp::Renamed { from, to, .. } => format!("renamed {} -> {}", from.display(), to.display()),
                    });
                }
                Err(e) => rep.notes.push(format!("undo of {op:?} failed (a durable operation depended on it?): {e}")),
            }
        }
        // Whatever stays in the trash was removed durably.
        if let Ok(rd) = std::fs::read_dir(&self.trash_dir) {
            for e in rd.flatten() {
                let _ = remove_any(&e.path());
            }
        }
        self.durable_trash.clear();
        self.last_write = None;
        rep
    }
}

/// Removes a file or a directory tree.
pub fn remove_any(p: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    struct Tree {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        j: Journal,
    }

    fn tree() -> Tree {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("tree");
        std::fs::create_dir(&root).expect("mkdir");
        let j = Journal::new(tmp.path().join("trash")).expect("journal");
        Tree { _tmp: tmp, root, j }
    }

    fn ino(p: &Path) -> u64 {
        std::fs::metadata(p).expect("stat").ino()
    }

    fn rw(p: &Path) -> File {
        std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(p).expect("open")
    }

    fn write(j: &mut Journal, p: &Path, off: u64, data: &[u8]) {
        let f = rw(p);
        j.before_write(ino(p), &f, off, data.len() as u64).expect("before_write");
        f.write_all_at(data, off).expect("write");
    }

    #[test]
    fn unsynced_overwrite_and_append_roll_back_to_the_synced_contents() {
        let mut t = tree();
        let p = t.root.join("f");
        let base: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&p, &base).expect("write");
        let i = ino(&p);
        write(&mut t.j, &p, 100, b"XXXX");
        write(&mut t.j, &p, 5000, &[7u8; 9000]); // overwrites pages 1, 2 and extends
        assert!(t.j.is_dirty(i));
        let paths = HashMap::from([(i, p.clone())]);
        let rep = t.j.power_loss(&|i| paths.get(&i).cloned(), None);
        assert_eq!(std::fs::read(&p).expect("read"), base);
        assert_eq!(rep.files_rolled_back, 1);
        assert!(rep.bytes_dropped >= 4000, "{rep:?}");
    }

    #[test]
    fn synced_writes_survive_and_later_ones_do_not() {
        let mut t = tree();
        let p = t.root.join("f");
        std::fs::write(&p, b"").expect("create");
        let i = ino(&p);
        write(&mut t.j, &p, 0, b"durable");
        t.j.sync_file(i);
        write(&mut t.j, &p, 7, b"+lost");
        write(&mut t.j, &p, 0, b"D");
        let paths = HashMap::from([(i, p.clone())]);
        t.j.power_loss(&|i| paths.get(&i).cloned(), None);
        assert_eq!(std::fs::read(&p).expect("read"), b"durable");
    }

    #[test]
    fn truncation_is_undone() {
        let mut t = tree();
        let p = t.root.join("f");
        let base = vec![3u8; 9000];
        std::fs::write(&p, &base).expect("write");
        let i = ino(&p);
        let f = rw(&p);
        t.j.before_truncate(i, &f, 10).expect("before_truncate");
        f.set_len(10).expect("truncate");
        write(&mut t.j, &p, 10, &[9u8; 20000]);
        let paths = HashMap::from([(i, p.clone())]);
        t.j.power_loss(&|i| paths.get(&i).cloned(), None);
        assert_eq!(std::fs::read(&p).expect("read"), base);
    }

    #[test]
    fn a_torn_page_keeps_whole_sectors_of_the_last_write() {
        let mut t = tree();
        let p = t.root.join("f");
        std::fs::write(&p, vec![1u8; 4096]).expect("write");
        let i = ino(&p);
        write(&mut t.j, &p, 0, &[2u8; 4096]);
        let paths = HashMap::from([(i, p.clone())]);
        let rep = t.j.power_loss(&|i| paths.get(&i).cloned(), Some(3));
        let got = std::fs::read(&p).expect("read");
        assert_eq!(&got[..1536], &[2u8; 1536][..]);
        assert_eq!(&got[1536..], &[1u8; 4096 - 1536][..]);
        assert_eq!(rep.torn.map(|t| t.2), Some(1536));
    }

    #[test]
    fn unsynced_names_are_undone_and_synced_ones_kept() {
        let mut t = tree();
        let dir = ino(&t.root);
        let keep = t.root.join("keep");
        std::fs::write(&keep, b"k").expect("write");
        t.j.created(dir, keep.clone());
        t.j.sync_dir(dir);
        // Unsynced: a new file, a rename over `keep`'s old neighbour, an unlink.
        let old = t.root.join("old");
        std::fs::write(&old, b"o").expect("write");
        t.j.created(dir, old.clone());
        t.j.sync_dir(dir);
        let new = t.root.join("new");
        std::fs::write(&new, b"n").expect("write");
        t.j.created(dir, new.clone());
        let tmp = t.root.join("tmp");
        std::fs::write(&tmp, b"t").expect("write");
        t.j.created(dir, tmp.clone());
        let trash = t.j.trash_path();
        std::fs::rename(&old, &trash).expect("trash");
        std::fs::rename(&tmp, &old).expect("rename");
        t.j.renamed(dir, tmp.clone(), old.clone(), Some((trash, 1)));
        let trash2 = t.j.trash_path();
        std::fs::rename(&keep, &trash2).expect("trash");
        t.j.removed(dir, keep.clone(), trash2, 2);
        assert_eq!(t.j.pending_dir_ops(), 4);
        let rep = t.j.power_loss(&|_| None, None);
        assert_eq!(rep.dir_ops_undone, 4, "{rep:?}");
        assert!(!new.exists() && !tmp.exists());
        assert_eq!(std::fs::read(&old).expect("old"), b"o");
        assert_eq!(std::fs::read(&keep).expect("keep"), b"k");
    }

    #[test]
    fn a_directory_sync_makes_its_removals_final() {
        let mut t = tree();
        let dir = ino(&t.root);
        let f = t.root.join("f");
        std::fs::write(&f, b"x").expect("write");
        let trash = t.j.trash_path();
        std::fs::rename(&f, &trash).expect("trash");
        t.j.removed(dir, f.clone(), trash.clone(), 42);
        assert_eq!(t.j.sync_dir(dir), vec![(42, trash)]);
        t.j.power_loss(&|_| None, None);
        assert!(!f.exists());
    }

    #[test]
    fn an_unsynced_directory_takes_its_synced_contents_with_it() {
        let mut t = tree();
        let root = ino(&t.root);
        let d = t.root.join("d");
        std::fs::create_dir(&d).expect("mkdir");
        t.j.created(root, d.clone());
        let f = d.join("f");
        std::fs::write(&f, b"x").expect("write");
        t.j.created(ino(&d), f.clone());
        t.j.sync_dir(ino(&d));
        t.j.power_loss(&|_| None, None);
        assert!(!d.exists());
    }
}
