//! A file system that forgets what was not synced: the chaos suite's power-loss fault.
//!
//! `twinhub chaos-fs --backing DIR --mount DIR` (hidden; started by `twinhub chaos` for each node)
//! mounts a FUSE passthrough of `DIR/tree` at the mount point. Every write goes through to the backing
//! file at once, but first the [`undo::Journal`] saves what it overwrites; a file's `fsync`/`fdatasync`
//! forgets its saved state, a directory's `fsync` makes its name operations final.
//!
//! Signals control it: **SIGUSR1** is a power loss (call it only once the node using the mount is
//! dead): every unsynced change is undone, one line says what was dropped, the file system unmounts
//! and the process exits 0. **SIGTERM**/**SIGINT** unmount without dropping anything (a clean stop).
//! Unmounting is also what drops the kernel's page cache of the mount: the next mount starts cold and
//! reads only what the backing tree holds after the drop (`FOPEN_DIRECT_IO` would do the same but makes
//! every read a round trip to this process for the whole run; a remount costs a few milliseconds once
//! per fault).
//!
//! `--tear` also keeps 1 to 7 sectors of the last unsynced page written (a write torn by the power
//! cut): a test of checksums, for harnesses that want it; the scenarios do not use it.

pub mod fs;
pub mod undo;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use fuser::{Config, MountOption};

/// Arguments of `twinhub chaos-fs`.
#[derive(clap::Args, Debug)]
pub struct ChaosFsArgs {
    /// Backing directory: the files live in `BACKING/tree`, removed ones wait in `BACKING/trash`.
    #[arg(long)]
    pub backing: PathBuf,
    /// Where to mount (an existing, empty directory).
    #[arg(long)]
    pub mount: PathBuf,
    /// On power loss, keep a few sectors of the last unsynced page written.
    #[arg(long)]
    pub tear: bool,
}

/// Mounts, waits for a signal, unmounts. Exit status 0 on a clean stop or a power loss, 2 when the
/// mount failed.
pub fn main(a: ChaosFsArgs) -> ExitCode {
    match run(&a.backing, &a.mount, a.tear) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("twinhub chaos-fs: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(backing: &Path, mount: &Path, tear: bool) -> anyhow::Result<()> {
    use anyhow::Context;
    let tree = backing.join("tree");
    let trash = backing.join("trash");
    std::fs::create_dir_all(&tree).with_context(|| format!("creating {}", tree.display()))?;
    std::fs::create_dir_all(mount).with_context(|| format!("creating {}", mount.display()))?;
    let fs = fs::PowerFs::new(&tree, &trash).with_context(|| format!("opening {}", tree.display()))?;
    let state = fs.state.clone();
    let mut cfg = Config::default();
    cfg.mount_options = vec![MountOption::FSName("twinhub-powerfs".into()), MountOption::Subtype("powerfs".into())];
    cfg.n_threads = Some(2);
    // Signals are blocked in every thread (the FUSE threads inherit the mask) and taken with sigwait.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: plain libc signal-set calls on a local set.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in [libc::SIGUSR1, libc::SIGTERM, libc::SIGINT] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let session = fuser::spawn_mount(fs, mount, &cfg)
        .with_context(|| format!("mounting the power-loss file system at {}", mount.display()))?;
    eprintln!("twinhub chaos-fs: {} mounted over {}", mount.display(), tree.display());
    let mut sig: libc::c_int = 0;
    // SAFETY: `set` is initialised above, `sig` a valid out pointer.
    unsafe { libc::sigwait(&set, &mut sig) };
    if sig == libc::SIGUSR1 {
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        let pending = st.journal.pending_dir_ops();
        let tear_sectors = tear.then(|| rand::random::<u64>() % 7 + 1);
        let rep = st.power_loss(tear_sectors);
        eprintln!(
            "twinhub chaos-fs: POWER LOSS: {} files rolled back, {} bytes of unsynced data dropped, {} of {} unsynced name operations undone{}",
            rep.files_rolled_back,
            rep.bytes_dropped,
            rep.dir_ops_undone,
            pending,
            rep.torn.as_ref().map(|(p, off, n)| format!(", page at {off} of {} torn after {n} bytes", p.display())).unwrap_or_default()
        );
        for u in &rep.undone {
            eprintln!("twinhub chaos-fs: undone: {u}");
        }
        for n in &rep.notes {
            eprintln!("twinhub chaos-fs: note: {n}");
        }
        drop(st);
    } else {
        eprintln!("twinhub chaos-fs: clean stop (signal {sig})");
        // The journal is dropped with the process: a clean stop is a disk that stays powered.
    }
    {
        let st = state.lock().unwrap_or_else(|p| p.into_inner());
        for r in &st.refused {
            eprintln!("twinhub chaos-fs: refused (cannot be undone): {r}");
        }
    }
    session
        .umount_and_join()
        .with_context(|| format!("unmounting {} (does a process still use it?)", mount.display()))?;
    let _ = std::fs::remove_dir_all(&trash);
    Ok(())
}
