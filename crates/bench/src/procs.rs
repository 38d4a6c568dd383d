//! Process and machine helpers: resident memory from /proc, free loopback ports, finding and installing
//! Debian packages, RLIMIT_NOFILE, stopping children.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `VmRSS` (or another `/proc/PID/status` field) in KiB.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Memory of a set of processes: the sum of VmRSS (now) and of VmHWM (peak), in MiB.
#[derive(Debug, Clone, Copy, serde::Serialize, Default)]
pub struct Rss {
    pub rss_mb: f64,
    pub hwm_mb: f64,
}

pub fn rss_of(pids: &[u32]) -> Rss {
    let sum = |f: &str| pids.iter().filter_map(|p| status_kib(*p, f)).sum::<u64>() as f64 / 1024.0;
    Rss { rss_mb: sum("VmRSS"), hwm_mb: sum("VmHWM") }
}

/// CPU time (user + system) a process has used so far, in seconds; 0 if it is gone.
pub fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // Fields after "pid (comm) ": state is the first; utime and stime are the 12th and 13th.
    let Some(rest) = stat.rsplit_once(") ").map(|(_, r)| r) else { return 0.0 };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) as f64 / hz
}

/// Summed CPU seconds of several processes.
pub fn cpu_of(pids: &[u32]) -> f64 {
    pids.iter().map(|p| cpu_secs(*p)).sum()
}

/// `n` distinct free loopback ports for a peer's listeners (below the ephemeral range, so that no
/// outgoing connection takes one before the peer binds it).
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    Ok(twinhub::net::free_loopback_ports(n)?)
}

/// An executable on PATH (or in /usr/sbin, /usr/bin).
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Finds `bin`, installing Debian package `package` with apt-get if it is missing (printing what it does).
pub fn ensure_installed(bin: &str, package: &str) -> anyhow::Result<PathBuf> {
    if let Some(p) = which(bin) {
        return Ok(p);
    }
    eprintln!("{bin} is not installed: running `apt-get install -y {package}`");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .stdout(progress_out())
            .status()
    };
    let ok = install().map(|s| s.success()).unwrap_or(false);
    if !ok {
        eprintln!("apt-get install failed: running `apt-get update` and trying again");
        let _ = Command::new("apt-get").arg("update").stdin(Stdio::null()).stdout(progress_out()).status();
        let st = install()?;
        if !st.success() {
            anyhow::bail!("apt-get install -y {package} failed ({st})");
        }
    }
    which(bin).ok_or_else(|| anyhow::anyhow!("{package} is installed but {bin} is not on PATH"))
}

/// Where an installer's own output goes: this program's stderr, beside its progress lines, so that
/// stdout carries only the result table (a first compare installs its peers, and `> table.txt` would
/// otherwise start with apt's output).
pub fn progress_out() -> Stdio {
    Stdio::from(std::io::stderr())
}

/// First line of `cmd args` (stdout or stderr), for version strings.
pub fn first_line(cmd: &std::path::Path, args: &[&str]) -> String {
    match Command::new(cmd).args(args).stdin(Stdio::null()).output() {
        Ok(o) => {
            let s = if o.stdout.is_empty() { o.stderr } else { o.stdout };
            String::from_utf8_lossy(&s).lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; ")
        }
        Err(e) => format!("unknown ({e})"),
    }
}

/// SIGTERM, wait up to `grace`, then SIGKILL; returns how long the exit took.
pub fn stop_child(c: &mut Child, grace: Duration) -> Duration {
    let started = Instant::now();
    unsafe {
        libc::kill(c.id() as i32, libc::SIGTERM);
    }
    while started.elapsed() < grace {
        if let Ok(Some(_)) = c.try_wait() {
            return started.elapsed();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = c.kill();
    let _ = c.wait();
    started.elapsed()
}

/// Whether `pid` still runs: the cluster launcher's check. A process whose main thread has exited
/// shows as a zombie while its other threads are still being torn down (a node unmapping gigabytes of
/// heap), and until the last of them is gone it keeps its files, the data directory's lock among them:
/// it counts as alive until then.
pub use twinhub::cli::cluster::pid_alive;

/// Raises the soft (and if needed, as root, the hard) RLIMIT_NOFILE to at least `want`; returns the
/// resulting soft limit.
pub fn raise_nofile(want: u64) -> u64 {
    unsafe {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        if r.rlim_cur >= want {
            return r.rlim_cur;
        }
        if r.rlim_max < want {
            let try_hard = libc::rlimit { rlim_cur: want, rlim_max: want };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &try_hard) == 0 {
                return want;
            }
        }
        let soft = libc::rlimit { rlim_cur: want.min(r.rlim_max), rlim_max: r.rlim_max };
        libc::setrlimit(libc::RLIMIT_NOFILE, &soft);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur
    }
}

/// A temporary directory removed on drop unless `keep` is set.
pub struct TempDir {
    pub path: PathBuf,
    pub keep: bool,
}

impl TempDir {
    pub fn new(prefix: &str) -> anyhow::Result<TempDir> {
        let base = std::env::var_os("TWINHUB_BENCH_TMP").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let path = base.join(format!("{prefix}-{}-{:08x}", std::process::id(), rand::random::<u32>()));
        std::fs::create_dir_all(&path)?;
        // TWINHUB_BENCH_KEEP=1 keeps data dirs and logs for a post-mortem.
        let keep = std::env::var_os("TWINHUB_BENCH_KEEP").is_some();
        Ok(TempDir { path, keep })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Disk used under a directory, in MiB (for data-dir sizes in reports).
pub fn du_mb(path: &std::path::Path) -> f64 {
    fn walk(p: &std::path::Path) -> u64 {
        let Ok(md) = std::fs::symlink_metadata(p) else { return 0 };
        if md.is_dir() {
            std::fs::read_dir(p).map(|rd| rd.flatten().map(|e| walk(&e.path())).sum()).unwrap_or(0)
        } else {
            md.len()
        }
    }
    walk(path) as f64 / (1024.0 * 1024.0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn own_rss_is_positive() {
        let r = super::rss_of(&[std::process::id()]);
        assert!(r.rss_mb > 0.0 && r.hwm_mb >= r.rss_mb);
    }
}
