//! Keeping secrets private on disk: the data directory holds every policy key, the TLS private keys
//! and the Raft journal (device keys in plain text), so nothing in it may be readable by other local
//! users.
//!
//! [`private_data_dir`] creates the directory `0700` (and tightens an existing one) and sets the
//! process umask to `077`, so every file the node, the storage engine included, creates afterwards is
//! `0600` and every directory `0700`. [`crate::auth::write_atomically`] creates its files `0600`
//! explicitly as well, for callers that run before the umask is set.

use std::path::Path;

/// Creates `dir` (and its parents) if needed, makes it `0700`, takes group and other permissions off
/// everything already in it (data written by an earlier version), and sets the umask to `077`.
pub fn private_data_dir(dir: &Path) -> std::io::Result<()> {
    restrict_umask();
    create_private_dir(dir)?;
    tighten_tree(dir)
}

/// Removes group and other permission bits from every file and directory under `dir` (symbolic
/// links are not followed).
pub fn tighten_tree(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let meta = entry.path().symlink_metadata()?;
            if meta.file_type().is_symlink() {
                continue;
            }
            let mode = meta.permissions().mode();
            if mode & 0o077 != 0 {
                std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(mode & !0o077))?;
            }
            if meta.is_dir() {
                tighten_tree(&entry.path())?;
            }
        }
    }
    Ok(())
}

/// `mkdir -p` with mode `0700` for `dir` itself; an existing `dir` is tightened to `0700`. Durable: the
/// directories it creates are synced into their parents (see [`create_dir_durably`]).
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        create_dir_durably(dir, |d| std::fs::DirBuilder::new().recursive(true).mode(0o700).create(d))?;
        let meta = std::fs::metadata(dir)?;
        if meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        create_dir_durably(dir, |d| std::fs::create_dir_all(d))
    }
}

/// Runs `mkdir_p(dir)` and then fsyncs every directory it created and the parent of the topmost one.
///
/// A new directory's name lives in its parent until the parent is synced: without this, a power loss
/// soon after the first start can take the whole data directory, and with it every write the node
/// acknowledged from it, because the journal's fsyncs only cover what is inside.
pub fn create_dir_durably(dir: &Path, mkdir_p: impl FnOnce(&Path) -> std::io::Result<()>) -> std::io::Result<()> {
    // The deepest ancestor that already exists (the empty path of a relative `dir` stands for `.`).
    let existing = dir.ancestors().find(|a| a.as_os_str().is_empty() || a.exists());
    mkdir_p(dir)?;
    if existing == Some(dir) {
        return Ok(());
    }
    for d in dir.ancestors() {
        std::fs::File::open(if d.as_os_str().is_empty() { Path::new(".") } else { d })?.sync_all()?;
        if Some(d) == existing {
            break;
        }
    }
    Ok(())
}

/// Files and directories created from now on by this process are private to its user.
pub fn restrict_umask() {
    #[cfg(unix)]
    // SAFETY: umask only swaps the process's file-creation mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn dir_is_private_and_existing_dir_tightened() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("a/b");
        create_private_dir(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_private_dir(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700);
        let f = d.join("keys.json");
        std::fs::write(&f, b"{}").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        tighten_tree(tmp.path()).unwrap();
        assert_eq!(std::fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
