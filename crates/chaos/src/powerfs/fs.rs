//! The FUSE side of the power-loss file system: a path-based passthrough to the backing tree that
//! records every change in the [`Journal`] before making it.
//!
//! Inodes are the backing tree's own inode numbers (the backing root and inode 1 swap places, since
//! FUSE's root is 1); each inode's current path is kept in a map updated on rename and unlink. Hard
//! links, symlinks, device nodes and fallocate modes other than plain allocation are refused with an
//! error, because the journal could not undo them.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use super::undo::{remove_any, Journal, LossReport};

const TTL: Duration = Duration::from_secs(1);

/// Shared state: the FUSE threads and the control side (power loss) both take the lock.
pub struct State {
    pub journal: Journal,
    /// Inode → current path (in the tree, or in the trash after an unlink).
    paths: HashMap<u64, PathBuf>,
    handles: HashMap<u64, (u64, File)>,
    next_fh: u64,
    root_ino: u64,
    /// Operations refused because the journal cannot undo them (reported at exit).
    pub refused: Vec<String>,
}

impl State {
    fn to_fuse(&self, backing: u64) -> u64 {
        if backing == self.root_ino {
            1
        } else if backing == 1 {
            self.root_ino
        } else {
            backing
        }
    }

    fn path(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.paths.get(&ino.0).cloned().ok_or(Errno::ENOENT)
    }

    fn open_count(&self, ino: u64) -> usize {
        self.handles.values().filter(|(i, _)| *i == ino).count()
    }

    /// Deletes trashed inodes whose removal is durable and that nobody holds open.
    fn collect_trash(&mut self) {
        for (ino, p) in self.journal.durable_trash() {
            if self.open_count(ino) == 0 {
                let _ = remove_any(&p);
                self.journal.forget_trashed(ino);
                self.paths.remove(&ino);
            }
        }
    }

    /// Power loss: every unsynced change dropped (see [`Journal::power_loss`]).
    pub fn power_loss(&mut self, tear: Option<u64>) -> LossReport {
        let paths = self.paths.clone();
        self.handles.clear();
        self.journal.power_loss(&|i| paths.get(&i).cloned(), tear)
    }
}

pub struct PowerFs {
    pub state: Arc<Mutex<State>>,
}

fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

fn kind_of(m: &std::fs::Metadata) -> FileType {
    let t = m.file_type();
    if t.is_dir() {
        FileType::Directory
    } else if t.is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    }
}

impl PowerFs {
    /// Serves `tree`; removed entries wait in `trash` (outside `tree`, same file system).
    pub fn new(tree: &Path, trash: &Path) -> io::Result<PowerFs> {
        let root_ino = std::fs::metadata(tree)?.ino();
        let mut paths = HashMap::new();
        paths.insert(1, tree.to_path_buf());
        let st = State {
            journal: Journal::new(trash.to_path_buf())?,
            paths,
            handles: HashMap::new(),
            next_fh: 1,
            root_ino,
            refused: Vec::new(),
        };
        Ok(PowerFs { state: Arc::new(Mutex::new(st)) })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn attr_of(st: &State, m: &std::fs::Metadata) -> FileAttr {
    let t = |s: i64, ns: i64| UNIX_EPOCH + Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32);
    FileAttr {
        ino: INodeNo(st.to_fuse(m.ino())),
        size: m.len(),
        blocks: m.blocks(),
        atime: t(m.atime(), m.atime_nsec()),
        mtime: t(m.mtime(), m.mtime_nsec()),
        ctime: t(m.ctime(), m.ctime_nsec()),
        crtime: t(m.ctime(), m.ctime_nsec()),
        kind: kind_of(m),
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: 4096,
        flags: 0,
    }
}

/// Looks `path` up, records its inode's path, returns its attributes.
fn entry(st: &mut State, path: PathBuf) -> Result<FileAttr, Errno> {
    let m = std::fs::symlink_metadata(&path).map_err(errno)?;
    let a = attr_of(st, &m);
    st.paths.insert(a.ino.0, path);
    Ok(a)
}

/// Open flags passed on to the backing file. Access mode, creation and truncation are handled here
/// (truncation through the journal); `O_APPEND` is dropped because the kernel already gives each write
/// its offset (the end of the file), and `pwrite` on an `O_APPEND` file would ignore that offset;
/// `O_DIRECT` because durability here is the journal's business, not the backing page cache's (and
/// tmpfs refuses it).
fn backing_flags(flags: i32) -> i32 {
    flags & !(libc::O_ACCMODE | libc::O_APPEND | libc::O_TRUNC | libc::O_CREAT | libc::O_EXCL | libc::O_DIRECT)
}

fn child(st: &State, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
    if name.as_bytes().contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    Ok(st.path(parent)?.join(name))
}

impl Filesystem for PowerFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.lock();
        match child(&st, parent, name).and_then(|p| entry(&mut st, p)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let st = self.lock();
        match st.path(ino).and_then(|p| std::fs::symlink_metadata(p).map_err(errno)) {
            Ok(m) => reply.attr(&TTL, &attr_of(&st, &m)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.lock();
        let res = (|| -> Result<FileAttr, Errno> {
            let p = st.path(ino)?;
            if let Some(mode) = mode {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode & 0o7777)).map_err(errno)?;
            }
            if let Some(size) = size {
                let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).map_err(errno)?;
                st.journal.before_truncate(ino.0, &f, size).map_err(errno)?;
                f.set_len(size).map_err(errno)?;
            }
            // Ownership and times are passed over: the journal does not undo metadata.
            let m = std::fs::symlink_metadata(&p).map_err(errno)?;
            Ok(attr_of(&st, &m))
        })();
        match res {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, _ino: INodeNo, reply: ReplyData) {
        reply.error(Errno::EINVAL)
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        self.lock().refused.push(format!("mknod {name:?}"));
        reply.error(Errno::EPERM)
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let mut st = self.lock();
        let res = (|| -> Result<FileAttr, Errno> {
            let p = child(&st, parent, name)?;
            std::fs::create_dir(&p).map_err(errno)?;
            let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode & !umask & 0o7777));
            st.journal.created(parent.0, p.clone());
            entry(&mut st, p)
        })();
        match res {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, false, reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, true, reply)
    }

    fn symlink(&self, _req: &Request, _parent: INodeNo, name: &OsStr, _target: &Path, reply: ReplyEntry) {
        self.lock().refused.push(format!("symlink {name:?}"));
        reply.error(Errno::EPERM)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut st = self.lock();
        let res = (|| -> Result<(), Errno> {
            if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
                st.refused.push(format!("rename {name:?} with flags {flags:?}"));
                return Err(Errno::EINVAL);
            }
            let from = child(&st, parent, name)?;
            let to = child(&st, newparent, newname)?;
            let fm = std::fs::symlink_metadata(&from).map_err(errno)?;
            let mut replaced = None;
            if let Ok(tm) = std::fs::symlink_metadata(&to) {
                if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                    return Err(Errno::EEXIST);
                }
                if tm.ino() == fm.ino() {
                    return Ok(());
                }
                match (fm.is_dir(), tm.is_dir()) {
                    (false, true) => return Err(Errno::EISDIR),
                    (true, false) => return Err(Errno::ENOTDIR),
                    (true, true) if std::fs::read_dir(&to).map_err(errno)?.next().is_some() => {
                        return Err(Errno::ENOTEMPTY)
                    }
                    _ => {}
                }
                let trash = st.journal.trash_path();
                std::fs::rename(&to, &trash).map_err(errno)?;
                let ti = st.to_fuse(tm.ino());
                st.paths.insert(ti, trash.clone());
                replaced = Some((trash, ti));
            }
            if let Err(e) = std::fs::rename(&from, &to) {
                if let Some((trash, ti)) = &replaced {
                    let _ = std::fs::rename(trash, &to);
                    st.paths.insert(*ti, to.clone());
                }
                return Err(errno(e));
            }
            // Paths below a renamed directory move with it.
            for p in st.paths.values_mut() {
                if let Ok(rest) = p.strip_prefix(&from) {
                    *p = if rest.as_os_str().is_empty() { to.clone() } else { to.join(rest) };
                }
            }
            st.journal.renamed(newparent.0, from, to, replaced);
            Ok(())
        })();
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn link(&self, _req: &Request, _ino: INodeNo, _newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        self.lock().refused.push(format!("link {newname:?}"));
        reply.error(Errno::EPERM)
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.lock();
        let res = (|| -> Result<u64, Errno> {
            let p = st.path(ino)?;
            let acc = flags.0 & libc::O_ACCMODE;
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(acc != libc::O_RDONLY)
                .custom_flags(backing_flags(flags.0))
                .open(&p)
                .map_err(errno)?;
            if flags.0 & libc::O_TRUNC != 0 && acc != libc::O_RDONLY {
                st.journal.before_truncate(ino.0, &f, 0).map_err(errno)?;
                f.set_len(0).map_err(errno)?;
            }
            let fh = st.next_fh;
            st.next_fh += 1;
            st.handles.insert(fh, (ino.0, f));
            Ok(fh)
        })();
        match res {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let st = self.lock();
        let Some((_, f)) = st.handles.get(&fh.0) else { return reply.error(Errno::EBADF) };
        let mut buf = vec![0u8; size as usize];
        let mut n = 0;
        while n < buf.len() {
            match f.read_at(&mut buf[n..], offset + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return reply.error(errno(e)),
            }
        }
        reply.data(&buf[..n])
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _wf: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut st = self.lock();
        let st = &mut *st;
        let Some((_, f)) = st.handles.get(&fh.0) else { return reply.error(Errno::EBADF) };
        if let Err(e) = st.journal.before_write(ino.0, f, offset, data.len() as u64) {
            return reply.error(errno(e));
        }
        match f.write_all_at(data, offset) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock: LockOwner, reply: ReplyEmpty) {
        reply.ok()
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.lock();
        st.handles.remove(&fh.0);
        st.collect_trash();
        reply.ok()
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.lock().journal.sync_file(ino.0);
        reply.ok()
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let st = self.lock();
        match st.path(ino) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let mut st = self.lock();
        let res = (|| -> Result<Vec<(u64, FileType, std::ffi::OsString)>, Errno> {
            let p = st.path(ino)?;
            let mut out = vec![(ino.0, FileType::Directory, ".".into()), (ino.0, FileType::Directory, "..".into())];
            let mut names: Vec<_> = std::fs::read_dir(&p).map_err(errno)?.flatten().collect();
            names.sort_by_key(|e| e.file_name());
            for e in names {
                if let Ok(m) = e.metadata() {
                    let i = st.to_fuse(m.ino());
                    st.paths.insert(i, e.path());
                    out.push((i, kind_of(&m), e.file_name()));
                }
            }
            Ok(out)
        })();
        match res {
            Ok(entries) => {
                for (k, (i, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(i), (k + 1) as u64, kind, &name) {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let mut st = self.lock();
        st.journal.sync_dir(ino.0);
        st.collect_trash();
        reply.ok()
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let st = self.lock();
        let Ok(p) = st.path(ino).or_else(|_| st.path(INodeNo::ROOT)) else { return reply.error(Errno::ENOENT) };
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else { return reply.error(Errno::EINVAL) };
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid NUL-terminated path and `s` a valid out pointer.
        if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
            return reply.error(errno(io::Error::last_os_error()));
        }
        reply.statfs(
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            s.f_namemax as u32,
            s.f_frsize as u32,
        )
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok()
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut st = self.lock();
        let res = (|| -> Result<(FileAttr, u64), Errno> {
            let p = child(&st, parent, name)?;
            let existed = p.exists();
            if existed && flags & libc::O_EXCL != 0 {
                return Err(Errno::EEXIST);
            }
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(mode & !umask & 0o7777)
                .custom_flags(backing_flags(flags))
                .open(&p)
                .map_err(errno)?;
            let a = entry(&mut st, p.clone())?;
            if existed {
                if flags & libc::O_TRUNC != 0 {
                    st.journal.before_truncate(a.ino.0, &f, 0).map_err(errno)?;
                    f.set_len(0).map_err(errno)?;
                }
            } else {
                st.journal.created(parent.0, p);
            }
            let fh = st.next_fh;
            st.next_fh += 1;
            st.handles.insert(fh, (a.ino.0, f));
            Ok((a, fh))
        })();
        match res {
            Ok((a, fh)) => reply.created(&TTL, &a, Generation(0), FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut st = self.lock();
        let st = &mut *st;
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            st.refused.push(format!("fallocate mode {mode:#x}"));
            return reply.error(Errno::EOPNOTSUPP);
        }
        let Some((_, f)) = st.handles.get(&fh.0) else { return reply.error(Errno::EBADF) };
        if let Err(e) = st.journal.before_resize(ino.0, f) {
            return reply.error(errno(e));
        }
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open descriptor; plain allocation does not change existing contents.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as libc::off_t, length as libc::off_t) };
        if r != 0 {
            return reply.error(errno(io::Error::last_os_error()));
        }
        reply.ok()
    }
}

impl PowerFs {
    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool, reply: ReplyEmpty) {
        let mut st = self.lock();
        let res = (|| -> Result<(), Errno> {
            let p = child(&st, parent, name)?;
            let m = std::fs::symlink_metadata(&p).map_err(errno)?;
            if dir != m.is_dir() {
                return Err(if dir { Errno::ENOTDIR } else { Errno::EISDIR });
            }
            if dir && std::fs::read_dir(&p).map_err(errno)?.next().is_some() {
                return Err(Errno::ENOTEMPTY);
            }
            let trash = st.journal.trash_path();
            std::fs::rename(&p, &trash).map_err(errno)?;
            let i = st.to_fuse(m.ino());
            st.paths.insert(i, trash.clone());
            st.journal.removed(parent.0, p, trash, i);
            Ok(())
        })();
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}
