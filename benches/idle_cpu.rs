//! Idle CPU of a 3-node cluster on this machine.
//!
//! Starts 3 nodes with `twinhub cluster up` (the binary cargo built for this bench, i.e. the release
//! profile) and the default shard count, lets it settle, then samples each node's CPU time (utime +
//! stime of `/proc/PID/stat`, in clock ticks of `getconf CLK_TCK`) over a window with no client
//! traffic, and prints each node's and the total share of one core and of the machine's cores. Resident
//! memory (VmRSS) and thread counts are printed alongside.
//!
//!   cargo bench --bench idle_cpu
//!
//! Environment: `IDLE_SECS` (30) measurement window, `IDLE_SETTLE_SECS` (10), `IDLE_SHARDS` (16, the
//! default of `twinhub cluster up`), `IDLE_HEARTBEAT_MS` (the nodes' `--raft-heartbeat-ms`). Results on stdout
//! and in `target/idle_cpu.json`; asserts nothing.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{name}: not a number: {v}")),
        Err(_) => default,
    }
}

/// Stops every node listed in cluster.json on drop, also on panic.
struct Guard {
    _root: tempfile::TempDir,
    dir: PathBuf,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Ok(text) = std::fs::read_to_string(self.dir.join("cluster.json")) else { return };
        let Ok(v) = serde_json::from_str::<Value>(&text) else { return };
        for pid in v["nodes"].as_array().into_iter().flatten().filter_map(|n| n["pid"].as_u64()) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains("twinhub") {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).stderr(Stdio::null()).status();
            }
        }
    }
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u64) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_else(|e| panic!("node pid {pid} is gone: {e}"));
    // Fields after the command name (which may contain spaces) start at field 3 (state).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
    let stime: u64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    utime + stime
}

fn status_field(pid: u64, name: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(name))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn clk_tck() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100)
}

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("idle_cpu: run with `cargo bench --bench idle_cpu` (nothing to do in test mode)");
        return;
    }
    let secs = env_u64("IDLE_SECS", 30);
    let settle = env_u64("IDLE_SETTLE_SECS", 10);
    let shards = env_u64("IDLE_SHARDS", 16);
    let tck = clk_tck();
    let cores = cores();
    println!("idle CPU bench: 3 nodes, {shards} shards, settle {settle}s, measure {secs}s, CLK_TCK {tck}, {cores} cores");

    let root = tempfile::Builder::new().prefix("twinhub-idle-").tempdir().expect("temp dir");
    let dir = root.path().join("cluster");
    let guard = Guard { _root: root, dir: dir.clone() };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_twinhub"));
    cmd.args(["cluster", "up", "--nodes", "3", "--shard-count", &shards.to_string()]).arg("--dir").arg(&dir);
    if let Ok(hb) = std::env::var("IDLE_HEARTBEAT_MS") {
        cmd.args(["--raft-heartbeat-ms", &hb]);
    }
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TWINHUB_") {
            cmd.env_remove(&k);
        }
    }
    // Production-like logging: an idle node should not be logging anyway.
    cmd.env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into())).env("NO_COLOR", "1");
    let out = cmd.stdin(Stdio::null()).output().expect("run twinhub cluster up");
    assert!(
        out.status.success(),
        "twinhub cluster up failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let file: Value = serde_json::from_slice(&std::fs::read(dir.join("cluster.json")).expect("cluster.json")).expect("JSON");
    let nodes: Vec<(u64, u64)> = file["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| (n["id"].as_u64().expect("id"), n["pid"].as_u64().expect("pid")))
        .collect();
    eprintln!("cluster up in {}; settling {settle}s", dir.display());
    std::thread::sleep(Duration::from_secs(settle));

    let before: Vec<u64> = nodes.iter().map(|(_, pid)| cpu_ticks(*pid)).collect();
    let t0 = Instant::now();
    for s in 1..=secs {
        std::thread::sleep(Duration::from_secs(1));
        if s % 10 == 0 || s == secs {
            eprintln!("  measured {s}/{secs}s");
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let after: Vec<u64> = nodes.iter().map(|(_, pid)| cpu_ticks(*pid)).collect();

    let mut rows = Vec::new();
    let mut total_core = 0.0;
    println!();
    println!("{:<6} {:>8} {:>12} {:>14} {:>9} {:>8}", "node", "pid", "% of 1 core", format!("% of {cores} cores"), "RSS MiB", "threads");
    for (i, (id, pid)) in nodes.iter().enumerate() {
        let cpu_s = (after[i] - before[i]) as f64 / tck as f64;
        let core_pct = cpu_s / elapsed * 100.0;
        total_core += core_pct;
        let rss_mib = status_field(*pid, "VmRSS:").map(|kb| kb as f64 / 1024.0);
        let threads = status_field(*pid, "Threads:");
        println!(
            "{:<6} {:>8} {:>11.2}% {:>13.2}% {:>9} {:>8}",
            id,
            pid,
            core_pct,
            core_pct / cores as f64,
            rss_mib.map(|r| format!("{r:.1}")).unwrap_or_else(|| "?".into()),
            threads.map(|t| t.to_string()).unwrap_or_else(|| "?".into())
        );
        rows.push(json!({"node": id, "pid": pid, "cpu_seconds": cpu_s, "pct_of_one_core": core_pct,
                         "pct_of_machine": core_pct / cores as f64, "rss_mib": rss_mib, "threads": threads}));
    }
    println!("{:<6} {:>8} {:>11.2}% {:>13.2}%", "total", "", total_core, total_core / cores as f64);
    let hb = std::env::var("IDLE_HEARTBEAT_MS").unwrap_or_else(|_| "100".into());
    println!("(3 nodes × {shards} shards = {} Raft replicas + the metadata group, heartbeat {hb} ms; {elapsed:.1}s without client traffic)", 3 * shards);

    let report = json!({
        "bench": "idle_cpu",
        "nodes": rows,
        "shards": shards,
        "seconds": elapsed,
        "clk_tck": tck,
        "cores": cores,
        "total_pct_of_one_core": total_core,
        "total_pct_of_machine": total_core / cores as f64,
    });
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target").join("idle_cpu.json");
    match std::fs::write(&path, serde_json::to_vec_pretty(&report).unwrap()) {
        Ok(()) => println!("written {}", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }

    // Stop the nodes gracefully; the guard SIGKILLs whatever remains.
    let _ = Command::new(env!("CARGO_BIN_EXE_twinhub")).args(["cluster", "down"]).arg("--dir").arg(&dir).stdout(Stdio::null()).status();
    drop(guard);
}
