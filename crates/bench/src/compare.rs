//! `compare`: scenario (a) — maximum twin-update throughput, closed loop — against twinhub, etcd and
//! NATS JetStream KV in turn (in the order `--systems` names them), each as a local 3-node cluster on
//! this machine, with the same client shape (C workers, one connection each, random keys out of N,
//! JSON values of B bytes). Prints a table with twinhub/peer ratios and writes JSON (and an SVG of
//! every run).

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::loadgen::{self, Phases};
use crate::peers::etcd::EtcdCluster;
use crate::peers::nats::NatsCluster;
use crate::peers::twinhub::{default_bin, TwinhubCluster};
use crate::plot;
use crate::probe;
use crate::procs;
use crate::stats::{Recorder, Summary};
use crate::targets::etcd::Etcd;
use crate::targets::nats::{Nats, BUCKET};
use crate::targets::twinhub::Twinhub;
use crate::targets::{Target, WatchCounts};
use crate::value::SizeDist;

#[derive(Debug, Clone)]
pub struct CompareOpts {
    pub out: PathBuf,
    pub svg: Option<PathBuf>,
    pub bin: Option<PathBuf>,
    pub duration: Duration,
    pub warmup: Duration,
    pub concurrency: usize,
    pub twins: usize,
    pub value: SizeDist,
    pub systems: Vec<String>,
    pub shards: u32,
    pub populate_concurrency: usize,
    pub etcd_quota_bytes: u64,
    /// Run without the change watch.
    pub no_watch: bool,
}

/// What one system's run produced.
pub struct SystemResult {
    pub name: String,
    pub json: Value,
    pub summary: Summary,
}

/// Populates, watches, runs the closed loop and measures memory for one started target.
async fn measure<T: Target>(target: T, opts: &CompareOpts, pids: &[u32], extra: Value) -> anyhow::Result<SystemResult> {
    let name = target.name();
    let keys: Arc<Vec<String>> = Arc::new((0..opts.twins).map(|i| target.key(i)).collect());
    let rss_idle = procs::rss_of(pids);
    let loadavg_before = loadavg();
    eprintln!(
        "[{name}] populating {} twins of {} bytes ({} at a time)",
        opts.twins, opts.value, opts.populate_concurrency
    );
    let (populate_s, populate_errors) =
        loadgen::populate(&target, keys.clone(), opts.value, opts.populate_concurrency).await?;
    let rss_populated = procs::rss_of(pids);
    let counts = Arc::new(WatchCounts::default());
    let watch = if opts.no_watch {
        None
    } else {
        match target.watch(counts.clone()).await {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("[{name}] watch failed: {e:#}");
                None
            }
        }
    };
    let workers = loadgen::update_workers(&target, keys.clone(), opts.value, opts.concurrency).await?;
    let rec = Arc::new(Recorder::new());
    let c2 = counts.clone();
    let extra_line: crate::progress::Extra =
        Arc::new(move || format!("watch {} msgs", c2.notifications.load(Ordering::Relaxed)));
    eprintln!(
        "[{name}] closed loop: {} workers, {}s warm-up + {}s",
        opts.concurrency,
        opts.warmup.as_secs(),
        opts.duration.as_secs()
    );
    let me = std::process::id();
    let each0: Vec<f64> = pids.iter().map(|p| procs::cpu_secs(*p)).collect();
    let (cli_cpu0, wall0) = (procs::cpu_secs(me), std::time::Instant::now());
    let (workers, all_ok) = loadgen::closed(
        workers,
        rec.clone(),
        Phases { warmup: opts.warmup, duration: opts.duration },
        name,
        Some(extra_line),
    )
    .await;
    let rss = procs::rss_of(pids);
    let wall = wall0.elapsed().as_secs_f64();
    let each: Vec<f64> = pids.iter().zip(&each0).map(|(p, c0)| procs::cpu_secs(*p) - c0).collect();
    let (srv_cpu, cli_cpu) = (each.iter().sum::<f64>(), procs::cpu_secs(me) - cli_cpu0);
    drop(workers);
    // Trailing notifications.
    tokio::time::sleep(Duration::from_secs(2)).await;
    if let Some(w) = watch {
        w.abort();
    }
    let summary = rec.summary();
    let total = &summary.total;
    let notifications = counts.notifications.load(Ordering::Relaxed);
    let changes = counts.changes.load(Ordering::Relaxed);
    let mut json = json!({
        "updates_per_s": round(total.per_s, 1),
        "p50_ms": round(total.latency.p50_ms, 3),
        "p99_ms": round(total.latency.p99_ms, 3),
        "rss_mb": round(rss.rss_mb, 1),
        "p90_ms": round(total.latency.p90_ms, 3),
        "p999_ms": round(total.latency.p999_ms, 3),
        "max_ms": round(total.latency.max_ms, 3),
        "mean_ms": round(total.latency.mean_ms, 3),
        "updates": total.count,
        "errors": total.errors,
        "error_kinds": summary.errors,
        "duration_s": round(summary.duration_s, 2),
        "rss_peak_mb": round(rss.hwm_mb, 1),
        "rss_idle_mb": round(rss_idle.rss_mb, 1),
        "rss_after_populate_mb": round(rss_populated.rss_mb, 1),
        "populate_s": round(populate_s, 2),
        "loadavg_before": loadavg_before,
        "loadavg_after": loadavg(),
        "populate_errors": populate_errors,
        "protocol": target.protocol(),
        "cpu": {
            "note": "CPU seconds over warm-up + measured window (all updates in it); 2 cores = 2 CPU-s per second",
            "wall_s": round(wall, 2),
            "servers_cpu_s": round(srv_cpu, 2),
            "client_cpu_s": round(cli_cpu, 2),
            "servers_cores_busy": round(srv_cpu / wall.max(1e-6), 2),
            "client_cores_busy": round(cli_cpu / wall.max(1e-6), 2),
            "servers_cpu_ms_per_update": ms_per_update(srv_cpu, all_ok),
            "client_cpu_ms_per_update": ms_per_update(cli_cpu, all_ok),
            // Which server does the work: a leader serves every write, the others replicate them
            // and pass on the writes their clients send them.
            "each_server_cpu_ms_per_update": each.iter().map(|c| ms_per_update(*c, all_ok)).collect::<Vec<_>>(),
        },
        "watch": {
            "kind": if opts.no_watch { "none (--no-watch)".to_string() } else { target.watch_kind() },
            "notifications": notifications,
            "changes_notified": changes,
            "updates_acked_incl_warmup": all_ok,
            "updates_per_notification": if notifications > 0 { round(all_ok as f64 / notifications as f64, 3) } else { 0.0 },
        },
        "steal_pct": summary.steal_pct.map(|v| round(v, 2)),
        "steal_pct_max": summary.steal_pct_max.map(|v| round(v, 2)),
        "cpu_busy_pct": summary.cpu_busy_pct.as_ref().map(|v| v.iter().map(|b| round(*b, 1)).collect::<Vec<_>>()),
        "series": summary.series,
    });
    if let (Value::Object(m), Value::Object(e)) = (&mut json, extra) {
        m.extend(e);
    }
    Ok(SystemResult { name: name.to_string(), json, summary })
}

/// CPU milliseconds per acknowledged update, to four decimals (0 when nothing was acknowledged).
fn ms_per_update(cpu_s: f64, updates: u64) -> f64 {
    if updates == 0 {
        return 0.0;
    }
    round(cpu_s * 1000.0 / updates as f64, 4)
}

fn round(x: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (x * p).round() / p
}

/// A system `--systems` can name. `nats` fsyncs before every ack like the others; `nats-nofsync` is
/// NATS's default (periodic fsync), a reference row of weaker durability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum System {
    Twinhub,
    Etcd,
    Nats { fsync: bool },
}

impl System {
    const ALL: [System; 4] =
        [System::Twinhub, System::Etcd, System::Nats { fsync: true }, System::Nats { fsync: false }];

    /// The name `--systems` takes, and the row's name in the table.
    fn name(self) -> &'static str {
        match self {
            System::Twinhub => "twinhub",
            System::Etcd => "etcd",
            System::Nats { fsync: true } => "nats",
            System::Nats { fsync: false } => "nats-nofsync",
        }
    }
}

/// `--systems` in the order given, each once; an unknown name is an error naming the known ones.
fn parse_systems(names: &[String]) -> anyhow::Result<Vec<System>> {
    let mut out = Vec::new();
    for name in names {
        let Some(system) = System::ALL.into_iter().find(|s| s.name() == name) else {
            let known: Vec<&str> = System::ALL.iter().map(|s| s.name()).collect();
            anyhow::bail!("unknown system {name:?} in --systems (known: {})", known.join(", "));
        };
        if !out.contains(&system) {
            out.push(system);
        }
    }
    Ok(out)
}

pub async fn run(opts: CompareOpts) -> anyhow::Result<Value> {
    procs::raise_nofile(65_536);
    // In the order given: a machine that slows down over a run favours whoever runs first, so a
    // second run in another order tells the machine from the systems.
    let systems = parse_systems(&opts.systems)?;
    let mut results: Vec<SystemResult> = Vec::new();
    // A system that cannot be started or loaded is reported and skipped: the others' minutes of
    // measurement are still written, and the command fails at the end.
    let mut failed = serde_json::Map::new();
    for system in systems {
        // The first system too: whatever ran before the compare (a build, another compare) may have
        // left the disk busy, and every system starts on the same terms.
        let settled = settle_disk(system.name()).await;
        let probe = take_probe(system.name()).await;
        let r = match system {
            System::Twinhub => run_twinhub(&opts).await,
            System::Etcd => run_etcd(&opts).await,
            System::Nats { fsync } => run_nats(&opts, fsync).await,
        };
        match r {
            Ok(mut r) => {
                r.json["disk_settle_s"] = json!(round(settled.as_secs_f64(), 1));
                r.json["machine_probe"] = probe.as_ref().map(probe::Probe::to_json).unwrap_or(Value::Null);
                results.push(r)
            }
            Err(e) => {
                eprintln!("compare: {} failed, going on with the others: {e:#}", system.name());
                failed.insert(system.name().to_string(), json!(format!("{e:#}")));
            }
        }
    }

    let mut out = serde_json::Map::new();
    for r in &results {
        out.insert(r.name.clone(), r.json.clone());
    }
    let failures = failed.len();
    if failures > 0 {
        out.insert("failed".into(), Value::Object(failed));
    }
    let th = results.iter().find(|r| r.name == "twinhub").map(|r| r.json.clone());
    let mut ratios = serde_json::Map::new();
    if let Some(th) = &th {
        for r in results.iter().filter(|r| r.name != "twinhub") {
            let ratio = |k: &str| {
                let (a, b) = (th[k].as_f64().unwrap_or(0.0), r.json[k].as_f64().unwrap_or(0.0));
                if b > 0.0 {
                    json!(round(a / b, 3))
                } else {
                    Value::Null
                }
            };
            ratios.insert(
                r.name.clone(),
                json!({"updates_per_s": ratio("updates_per_s"), "p50_ms": ratio("p50_ms"), "p99_ms": ratio("p99_ms"), "rss_mb": ratio("rss_mb")}),
            );
        }
    }
    out.insert("ratios_twinhub_over_peer".into(), Value::Object(ratios));
    out.insert(
        "config".into(),
        json!({
            "scenario": "(a) maximum twin-update throughput, closed loop",
            "concurrency": opts.concurrency,
            "twins": opts.twins,
            "value_bytes": opts.value.to_string(),
            "duration_s": opts.duration.as_secs(),
            "warmup_s": opts.warmup.as_secs(),
            "nodes_per_system": 3,
            "machine": machine(),
            "rss": "sum of VmRSS of the 3 server processes at the end of the measured window (rss_peak_mb: sum of VmHWM)",
        }),
    );
    let out = Value::Object(out);
    println!("{}", table(&out, &results));
    if let Some(dir) = opts.out.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir)?;
        }
    }
    std::fs::write(&opts.out, serde_json::to_string_pretty(&out)?)?;
    eprintln!("wrote {}", opts.out.display());
    let svg = opts.svg.clone().unwrap_or_else(|| opts.out.with_extension("svg"));
    let runs: Vec<plot::Run> =
        results.iter().map(|r| plot::Run { label: r.name.clone(), series: &r.summary.series }).collect();
    plot::write_svg(
        &svg,
        &format!("compare: closed loop, {} workers, {} twins, {} B values", opts.concurrency, opts.twins, opts.value),
        &runs,
    )?;
    eprintln!("wrote {}", svg.display());
    if failures > 0 {
        anyhow::bail!("{failures} of the systems failed (see `failed` in {})", opts.out.display());
    }
    Ok(out)
}

/// The machine's speed just before `next` starts ([`probe`]), on the quiet machine that
/// [`settle_disk`] left; `None` (and a line saying so) if the probe's thread could not run.
async fn take_probe(next: &str) -> Option<probe::Probe> {
    match tokio::task::spawn_blocking(|| probe::run(&probe::DEFAULT)).await {
        Ok(p) => {
            eprintln!("compare: machine before {next}: {}", p.line());
            Some(p)
        }
        Err(e) => {
            eprintln!("compare: the machine probe before {next} did not run ({e}); going on");
            None
        }
    }
}

/// The longest [`settle_disk`] waits.
const SETTLE_MAX: Duration = Duration::from_secs(60);

/// Waits until the disk is quiet before a system starts. Whatever ran before (the previous system, a
/// build, another compare) leaves work for the disk (dirty pages still to be written back, the blocks
/// of a deleted data directory to free), and whichever runs next would pay for it: in one hour twinhub
/// measured a quarter slower in third place than in first. So: `sync`, then wait until the disk's stall
/// time (PSI, `/proc/pressure/io`, "some") stays under 1 % for three seconds in a row, at most
/// [`SETTLE_MAX`]; where the kernel has no PSI, only the `sync`. Returns how long it waited.
async fn settle_disk(next: &str) -> Duration {
    let started = std::time::Instant::now();
    eprintln!("compare: sync, and waiting for the disk to settle before {next} (at most {} s)", SETTLE_MAX.as_secs());
    if let Err(e) = tokio::process::Command::new("sync").status().await {
        eprintln!("compare: sync could not run ({e}); going on");
    }
    if let Some(mut last) = io_stall_us() {
        let mut quiet = 0;
        while quiet < 3 && started.elapsed() < SETTLE_MAX {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let Some(now) = io_stall_us() else { break };
            quiet = if now.saturating_sub(last) < 10_000 { quiet + 1 } else { 0 };
            last = now;
        }
    }
    let waited = started.elapsed();
    eprintln!("compare: disk settled after {:.1} s", waited.as_secs_f64());
    waited
}

/// Microseconds some task has stalled on I/O since boot (`/proc/pressure/io`, `some ... total=`).
fn io_stall_us() -> Option<u64> {
    some_stall_us(&std::fs::read_to_string("/proc/pressure/io").ok()?)
}

/// The `total=` of the `some` line of a PSI file.
fn some_stall_us(psi: &str) -> Option<u64> {
    let some = psi.lines().find(|l| l.starts_with("some "))?;
    some.split_whitespace().find_map(|f| f.strip_prefix("total="))?.parse().ok()
}

pub fn machine() -> Value {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<u64>().ok()))
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    json!({"cpus": cpus, "memory_gib": round(mem_kib as f64 / 1048576.0, 1), "cpu_model": model, "loadavg": loadavg(),
           "note": "clients and all 3 servers share this machine (and whatever else runs on it: see loadavg)"})
}

/// `/proc/loadavg` (1, 5, 15 min), to show how busy the machine was.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

async fn run_twinhub(opts: &CompareOpts) -> anyhow::Result<SystemResult> {
    let bin = default_bin(opts.bin.as_deref())?;
    let cluster = TwinhubCluster::up(&bin, 3, opts.shards)?;
    let pids = cluster.pids();
    let data_dirs: Vec<PathBuf> = cluster.hub.info.nodes.iter().filter_map(|n| n.data_dir.clone()).collect();
    let extra = json!({
        "version": cluster.version,
        "binary": bin.display().to_string(),
        "nodes": 3,
        "shard_count": opts.shards,
        "durability": "Raft (openraft) per shard, 3 replicas; group commit, a write is acknowledged only after it is fsynced on a majority (twinhub README)",
    });
    let r = measure(Twinhub { hub: cluster.hub.clone() }, opts, &pids, extra).await;
    let disk: f64 = data_dirs.iter().map(|d| procs::du_mb(d)).sum();
    cluster.down();
    let mut r = r?;
    r.json["disk_mb"] = json!(round(disk, 1));
    Ok(r)
}

async fn run_etcd(opts: &CompareOpts) -> anyhow::Result<SystemResult> {
    let mut cluster = EtcdCluster::up(3, opts.etcd_quota_bytes).await?;
    let pids = cluster.pids();
    let extra = json!({
        "version": cluster.version,
        "members": 3,
        "flags": cluster.flags,
        "durability": "Raft, 3 members; WAL fsync before every acknowledgement (etcd default, cannot be turned off)",
    });
    let r = measure(Etcd { members: cluster.clients.clone() }, opts, &pids, extra).await;
    let disk = procs::du_mb(&cluster.dir.path);
    cluster.stop();
    let mut r = r?;
    r.json["disk_mb"] = json!(round(disk, 1));
    Ok(r)
}

/// `fsync`: the `nats` row (fsync before every ack); without it the `nats-nofsync` reference row.
async fn run_nats(opts: &CompareOpts, fsync: bool) -> anyhow::Result<SystemResult> {
    let mut cluster = NatsCluster::up(3, BUCKET, fsync).await?;
    let pids = cluster.pids();
    let extra = json!({
        "version": cluster.version,
        "binary": cluster.bin.display().to_string(),
        "servers": 3,
        "sync_always": cluster.sync_always,
        "durability": cluster.durability,
        "stream_config": cluster.stream_config,
    });
    let target = Nats { servers: cluster.clients.clone(), bucket: cluster.bucket.clone(), fsync };
    let r = measure(target, opts, &pids, extra).await;
    let disk = procs::du_mb(&cluster.dir.path);
    cluster.stop();
    let mut r = r?;
    r.json["disk_mb"] = json!(round(disk, 1));
    Ok(r)
}

/// The printed table.
pub fn table(out: &Value, results: &[SystemResult]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let cfg = &out["config"];
    let _ = writeln!(
        s,
        "\nscenario (a), closed loop: {} workers, {} twins, values {} B, {} s (+{} s warm-up), 3 nodes each, same machine",
        cfg["concurrency"], cfg["twins"], cfg["value_bytes"].as_str().unwrap_or(""), cfg["duration_s"], cfg["warmup_s"]
    );
    let _ = writeln!(
        s,
        "{:<12} {:>10} {:>8} {:>8} {:>8} {:>9} {:>7} {:>8} {:>11} {:>12} {:>12} {:>8}",
        "system",
        "updates/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "p99.9 ms",
        "errors",
        "RSS MB",
        "watch msgs",
        "srv CPU ms/u",
        "cli CPU ms/u",
        "steal %"
    );
    for r in results {
        let j = &r.json;
        let _ = writeln!(
            s,
            "{:<12} {:>10.0} {:>8.2} {:>8.2} {:>8.2} {:>9.2} {:>7} {:>8.1} {:>11} {:>12.3} {:>12.3} {:>8}",
            r.name,
            j["updates_per_s"].as_f64().unwrap_or(0.0),
            j["p50_ms"].as_f64().unwrap_or(0.0),
            j["p90_ms"].as_f64().unwrap_or(0.0),
            j["p99_ms"].as_f64().unwrap_or(0.0),
            j["p999_ms"].as_f64().unwrap_or(0.0),
            j["errors"].as_u64().unwrap_or(0),
            j["rss_mb"].as_f64().unwrap_or(0.0),
            j["watch"]["notifications"].as_u64().unwrap_or(0),
            j["cpu"]["servers_cpu_ms_per_update"].as_f64().unwrap_or(0.0),
            j["cpu"]["client_cpu_ms_per_update"].as_f64().unwrap_or(0.0),
            j["steal_pct"].as_f64().map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into())
        );
    }
    if let Some(Value::Object(ratios)) = out.get("ratios_twinhub_over_peer") {
        if !ratios.is_empty() {
            let _ = writeln!(s, "\ntwinhub / peer   updates/s (>1: twinhub faster)   p50 (<1: twinhub lower)   p99 (<1: twinhub lower)   RSS (<1: twinhub smaller)");
            for (peer, r) in ratios {
                let f = |k: &str| r[k].as_f64().map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into());
                let _ = writeln!(
                    s,
                    "  / {:<12} {:>10} {:>27} {:>24} {:>24}",
                    peer,
                    f("updates_per_s"),
                    f("p50_ms"),
                    f("p99_ms"),
                    f("rss_mb")
                );
            }
        }
    }
    let _ = writeln!(s, "(RSS: sum of VmRSS of the 3 server processes at the end of the window; CPU ms/u: CPU milliseconds per acknowledged update, servers summed / this client; steal: the hypervisor's share of the machine's CPU over the window, which slows every system in it)");
    let _ = writeln!(s, "\nmachine before each system (the same probe each time; larger is slower):");
    for r in results {
        let p = &r.json["machine_probe"];
        let f = |k: &str, d: usize| p[k].as_f64().map(|v| format!("{v:.d$}")).unwrap_or_else(|| "-".into());
        let _ = writeln!(
            s,
            "  {:<12} hand-off {} µs on one CPU, {} across; compute {} ns/step; memory walk {} / {} ns a step (small / large)",
            r.name,
            f("handoff_same_cpu_us", 2),
            f("handoff_cross_cpu_us", 2),
            f("compute_ns_per_step", 3),
            f("walk_small_ns_per_step", 1),
            f("walk_large_ns_per_step", 1)
        );
    }
    let _ = writeln!(s, "\nclients:");
    for r in results {
        let _ = writeln!(s, "  {:<12} {}", r.name, r.json["protocol"].as_str().unwrap_or(""));
    }
    let _ = writeln!(s, "durability:");
    for r in results {
        let _ = writeln!(s, "  {:<12} {}", r.name, r.json["durability"].as_str().unwrap_or(""));
    }
    let _ = writeln!(s, "versions:");
    for r in results {
        let _ = writeln!(s, "  {:<12} {}", r.name, r.json["version"].as_str().unwrap_or(""));
    }
    if let Some(Value::Object(failed)) = out.get("failed") {
        let _ = writeln!(s, "failed (not measured):");
        for (name, error) in failed {
            let _ = writeln!(s, "  {:<12} {}", name, error.as_str().unwrap_or(""));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::{ms_per_update, parse_systems, some_stall_us, System};

    #[test]
    fn cpu_per_update_is_in_milliseconds_and_zero_without_updates() {
        assert_eq!(ms_per_update(1.5, 20_000), 0.075);
        assert_eq!(ms_per_update(1.0, 3), 333.3333);
        assert_eq!(ms_per_update(2.0, 0), 0.0);
    }

    #[test]
    fn the_stall_total_is_read_from_the_some_line_of_a_psi_file() {
        let psi = "some avg10=0.15 avg60=4.97 avg300=5.62 total=821478809\n\
                   full avg10=0.05 avg60=0.97 avg300=0.81 total=223878894\n";
        assert_eq!(some_stall_us(psi), Some(821_478_809));
        assert_eq!(some_stall_us("full avg10=0.00 total=5\n"), None);
        assert_eq!(some_stall_us("some avg10=0.00 total=x\n"), None);
    }

    #[test]
    fn systems_run_in_the_order_named_once_each_and_unknown_names_are_refused() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let got = parse_systems(&names(&["etcd", "nats-nofsync", "twinhub", "etcd", "nats"])).unwrap();
        assert_eq!(got, [System::Etcd, System::Nats { fsync: false }, System::Twinhub, System::Nats { fsync: true }]);
        let err = parse_systems(&names(&["twinhub", "redis"])).unwrap_err().to_string();
        assert!(err.contains("\"redis\"") && err.contains("nats-nofsync"), "{err}");
    }
}
