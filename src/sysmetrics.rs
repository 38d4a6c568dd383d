//! Process and data-directory gauges for `/metrics`, read once a second: resident memory and open
//! descriptors of this process (Prometheus' standard `process_*` names, from `/proc/self`; CPU time is read at scrape time), and
//! the free and total bytes of the file system holding the data directory (for "disk nearly full"
//! alerts). Reads only; a value that cannot be read is left as it was.

use std::path::Path;

/// Sets every gauge this module owns.
pub fn record(data_dir: &Path) {
    if let Some(rss) = resident_bytes() {
        metrics::gauge!("process_resident_memory_bytes").set(rss as f64);
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        metrics::gauge!("process_open_fds").set(fds.count() as f64);
    }
    if let Ok(s) = rustix::fs::statvfs(data_dir) {
        let block = s.f_frsize as f64;
        metrics::gauge!("twinhub_data_dir_free_bytes").set(s.f_bavail as f64 * block);
        metrics::gauge!("twinhub_data_dir_size_bytes").set(s.f_blocks as f64 * block);
    }
}

/// `process_cpu_seconds_total`, read at scrape time and rendered by hand: Prometheus defines it as a
/// counter of (fractional) seconds, and the metrics crate's counters hold integers.
pub fn render_process_cpu() -> String {
    match cpu_seconds() {
        Some(cpu) => format!(
            "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n\
             # TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total {cpu}\n"
        ),
        None => String::new(),
    }
}

/// Resident set size: the second field of `/proc/self/statm`, in pages.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * rustix::param::page_size() as u64)
}

/// User plus system CPU time: fields 14 and 15 of `/proc/self/stat`, in clock ticks. The command name
/// (field 2) may hold spaces, so fields are counted after its closing parenthesis.
pub fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state), so field N is at index N - 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / rustix::param::clock_ticks_per_second() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_cpu_and_a_disk() {
        assert!(resident_bytes().is_some_and(|b| b > 1 << 20), "{:?}", resident_bytes());
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1 && cpu_seconds().is_some_and(|c| c > 0.0), "{:?}", cpu_seconds());
        assert!(rustix::fs::statvfs(Path::new(".")).is_ok_and(|s| s.f_blocks > 0));
    }
}
