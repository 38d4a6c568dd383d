// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use crate::Slice;
use std::{fs::File, io::Write, path::Path};

pub const MAGIC_BYTES: [u8; 4] = [b'L', b'S', b'M', 3];

pub const TABLES_FOLDER: &str = "tables";
pub const BLOBS_FOLDER: &str = "blobs";
pub const CURRENT_VERSION_FILE: &str = "current";

/// Reads bytes from a file using `pread`.
pub fn read_exact(file: &File, offset: u64, size: usize) -> std::io::Result<Slice> {
    // SAFETY: This slice builder starts uninitialized, but we know its length
    //
    // We use read_at/seek_read which give us the number of bytes read
    // If that number does not match the slice length, the function errors,
    // so the (partially) uninitialized buffer is discarded
    //
    // Additionally, generally, block loads furthermore do a checksum check which
    // would likely catch the buffer being wrong somehow
    #[expect(unsafe_code, reason = "see safety")]
    let mut builder = unsafe { Slice::builder_unzeroed(size) };

    {
        let bytes_read: usize;

        #[cfg(unix)]
        {
            use std::os::unix::fs::FileExt;

            bytes_read = file.read_at(&mut builder, offset)?;
        }

        #[cfg(windows)]
        {
            use std::os::windows::fs::FileExt;

            bytes_read = file.seek_read(&mut builder, offset)?;
        }

        #[cfg(not(any(unix, windows)))]
        {
            compile_error!("unsupported platform");
            unimplemented!();
        }

        if bytes_read != size {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("read_exact({bytes_read}) at {offset} did not read enough bytes {size}; file has length {}", file.metadata()?.len()),
            ));
        }
    }

    Ok(builder.freeze().into())
}

/// Runs an I/O operation, retrying transient Windows errors with backoff.
///
/// External programs (antivirus, indexers, backup agents) may briefly hold files open
/// without sharing flags on Windows, failing renames and deletes that would succeed a
/// moment later; POSIX has no such failure mode, so elsewhere the operation runs once.
pub fn retry_transient_io<T>(mut op: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    #[cfg(windows)]
    {
        const MAX_ATTEMPTS: u32 = 10;

        let mut delay = std::time::Duration::from_millis(1);

        for _ in 1..MAX_ATTEMPTS {
            match op() {
                Err(e) if is_transient_windows_error(&e) => {
                    std::thread::sleep(delay);
                    delay *= 2;
                }
                result => return result,
            }
        }
    }

    op()
}

#[cfg(windows)]
fn is_transient_windows_error(e: &std::io::Error) -> bool {
    // ERROR_ACCESS_DENIED, ERROR_SHARING_VIOLATION, ERROR_LOCK_VIOLATION, ERROR_USER_MAPPED_FILE
    matches!(e.raw_os_error(), Some(5 | 32 | 33 | 1224))
}

/// Persists a named temporary file to its final path, replacing any existing file.
pub fn persist_temp_file(temp_file: tempfile::NamedTempFile, path: &Path) -> std::io::Result<()> {
    let mut temp_file = Some(temp_file);

    retry_transient_io(|| {
        #[expect(clippy::expect_used, reason = "the temp file is put back on failure")]
        temp_file
            .take()
            .expect("temp file should be present")
            .persist(path)
            .map(|_| ())
            .map_err(|e| {
                temp_file = Some(e.file);
                e.error
            })
    })
}

/// Atomically rewrites a file.
pub fn rewrite_atomic(path: &Path, content: &[u8]) -> std::io::Result<()> {
    #[expect(
        clippy::expect_used,
        reason = "every file should have a parent directory"
    )]
    let folder = path.parent().expect("should have a parent");

    let mut temp_file = tempfile::NamedTempFile::new_in(folder)?;
    temp_file.write_all(content)?;
    temp_file.flush()?;
    temp_file.as_file_mut().sync_all()?;
    persist_temp_file(temp_file, path)?;

    // TODO: not sure why it fails on Windows...
    #[cfg(not(target_os = "windows"))]
    {
        let file = std::fs::File::open(path)?;
        file.sync_all()?;

        #[expect(
            clippy::expect_used,
            reason = "files should always have a parent directory"
        )]
        let folder = path.parent().expect("should have parent folder");
        fsync_directory(folder)?;
    }

    Ok(())
}

#[cfg(not(target_os = "windows"))]
pub fn fsync_directory(path: &Path) -> std::io::Result<()> {
    let file = std::fs::File::open(path)?;
    debug_assert!(file.metadata()?.is_dir());
    file.sync_all()
}

#[cfg(target_os = "windows")]
pub fn fsync_directory(path: &Path) -> std::io::Result<()> {
    // Cannot fsync directory on Windows
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Write;
    use test_log::test;

    #[test]
    fn atomic_rewrite() -> crate::Result<()> {
        let dir = tempfile::tempdir()?;

        let path = dir.path().join("test.txt");
        {
            let mut file = File::create(&path)?;
            write!(file, "asdasdasdasdasd")?;
        }

        rewrite_atomic(&path, b"newcontent")?;

        let content = std::fs::read_to_string(&path)?;
        assert_eq!("newcontent", content);

        Ok(())
    }

    #[test]
    fn persist_temp_file_replaces_existing() -> crate::Result<()> {
        let dir = tempfile::tempdir()?;

        let path = dir.path().join("test.txt");
        std::fs::write(&path, b"old")?;

        let mut temp_file = tempfile::NamedTempFile::new_in(dir.path())?;
        write!(temp_file, "new")?;
        persist_temp_file(temp_file, &path)?;

        let content = std::fs::read_to_string(&path)?;
        assert_eq!("new", content);

        Ok(())
    }

    #[test]
    #[cfg(windows)]
    fn retry_transient_io_retries_sharing_violation() {
        let mut attempts = 0;

        let result = retry_transient_io(|| {
            attempts += 1;

            if attempts < 3 {
                // ERROR_SHARING_VIOLATION
                Err(std::io::Error::from_raw_os_error(32))
            } else {
                Ok(42)
            }
        });

        assert!(matches!(result, Ok(42)));
        assert_eq!(3, attempts);
    }

    #[test]
    #[cfg(windows)]
    fn retry_transient_io_fails_fast_on_other_errors() {
        let mut attempts = 0;

        let result: std::io::Result<()> = retry_transient_io(|| {
            attempts += 1;

            // ERROR_FILE_NOT_FOUND
            Err(std::io::Error::from_raw_os_error(2))
        });

        assert!(result.is_err());
        assert_eq!(1, attempts);
    }
}

/// (twinhub's patch.) How much of a new table or blob file [`PacedFile`] lets the page cache hold
/// before it hands that much to the device and waits for the part before it.
pub const PACE_BYTES: u64 = 1 << 20;

/// (twinhub's patch.) A new table or blob file whose data reaches the device a MiB at a time while
/// it is written, as RocksDB's `bytes_per_sync` with `strict_bytes_per_sync`.
///
/// A memtable flush or a compaction writes a whole file into the page cache and then `sync_all`s
/// it: the device receives all of it (megabytes) at once, and a write-ahead log's `fdatasync`
/// issued meanwhile, which must also flush the device's cache, waits behind all of it. Handing
/// each MiB to the device as soon as it is complete (`sync_file_range` WRITE) and waiting for the
/// MiB before it keeps at most about two MiB of this file in flight: the file's writer is paced by
/// the device, the log's `fdatasync` waits for at most that much. Durability is unchanged: the
/// file is still `sync_all`ed before anything names it; the ranges only start its writeback early.
pub struct PacedFile {
    file: File,
    /// The file position (writes are sequential; `stream_position` is the only seek).
    pos: u64,
    /// Bytes before this offset have been handed to the device.
    queued: u64,
}

impl PacedFile {
    /// Wraps a file just created (empty).
    #[must_use]
    pub fn new(file: File) -> Self {
        Self {
            file,
            pos: 0,
            queued: 0,
        }
    }

    /// `sync_all` of the file.
    ///
    /// # Errors
    ///
    /// Will return `Err` if an IO error occurs.
    pub fn sync_all(&self) -> std::io::Result<()> {
        self.file.sync_all()
    }

    /// Hands every complete MiB not yet handed to the device, waiting for the one before each.
    /// A hint only: `sync_file_range` errors are ignored, since [`PacedFile::sync_all`] decides
    /// durability.
    fn pace(&mut self) {
        while self.pos >= self.queued + PACE_BYTES {
            #[cfg(target_os = "linux")]
            {
                use std::os::fd::AsRawFd;
                let fd = self.file.as_raw_fd();
                #[expect(unsafe_code, reason = "sync_file_range on an open descriptor; no memory is passed")]
                #[expect(clippy::cast_possible_wrap, reason = "file offsets are far below i64::MAX")]
                // SAFETY: `fd` is this file's open descriptor for the whole call.
                unsafe {
                    libc::sync_file_range(
                        fd,
                        self.queued as libc::off64_t,
                        PACE_BYTES as libc::off64_t,
                        libc::SYNC_FILE_RANGE_WRITE,
                    );
                    if let Some(before) = self.queued.checked_sub(PACE_BYTES) {
                        libc::sync_file_range(
                            fd,
                            before as libc::off64_t,
                            PACE_BYTES as libc::off64_t,
                            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                                | libc::SYNC_FILE_RANGE_WRITE
                                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                        );
                    }
                }
            }
            self.queued += PACE_BYTES;
        }
    }
}

impl Write for PacedFile {
    /// Writes `buf` a MiB at a time, pacing after each, and reports it all written (as
    /// `File::write` does for a regular file): the checksumming writers above count what they
    /// are given, not what was written.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            #[expect(clippy::cast_possible_truncation, reason = "PACE_BYTES is 1 MiB")]
            let take = (buf.len() - done).min(PACE_BYTES as usize);
            let n = self.file.write(&buf[done..done + take])?;
            if n == 0 {
                break;
            }
            done += n;
            self.pos += n as u64;
            self.pace();
        }
        Ok(done)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl std::io::Seek for PacedFile {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        self.pos = self.file.seek(to)?;
        Ok(self.pos)
    }
}
