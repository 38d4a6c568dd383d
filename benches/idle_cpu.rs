//! Idle CPU of a 3-node cluster on this machine.
//!
//! Starts 3 nodes with `twinhub cluster up` (the binary cargo built for this bench, i.e. the release
//! profile) and the default shard count, lets it settle, then samples each node's CPU time (utime +
//! stime of `/proc/PID/stat`) over a window with no client
//! traffic, and prints each node's and the total share of one core and of the machine's cores. Resident
//! memory (VmRSS) and thread counts are printed alongside.
//!
//!   cargo bench --bench idle_cpu
//!
//! Environment: `IDLE_SECS` (30) measurement window, `IDLE_SETTLE_SECS` (10), `IDLE_SHARDS` (3, the
//! default of `twinhub cluster up`), `IDLE_HEARTBEAT_MS` (the nodes' `--raft-heartbeat-ms`). Results on stdout
//! and in `target/idle_cpu.json`; asserts nothing.

use twinhub_testkit as common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use serde_json::json;
use twinhub_bench::procs::{cpu_secs, status_kib};

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{name}: not a number: {v}")),
        Err(_) => default,
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("idle_cpu: run with `cargo bench --bench idle_cpu` (nothing to do in test mode)");
        return;
    }
    let secs = env_u64("IDLE_SECS", 30);
    let settle = env_u64("IDLE_SETTLE_SECS", 10);
    let shards = env_u64("IDLE_SHARDS", u64::from(twinhub::ids::DEFAULT_SHARD_COUNT)) as u32;
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!("idle CPU bench: 3 nodes, {shards} shards, settle {settle}s, measure {secs}s, {cores} cores");

    let extra: Vec<String> = match std::env::var("IDLE_HEARTBEAT_MS") {
        Ok(hb) => vec!["--raft-heartbeat-ms".into(), hb],
        Err(_) => Vec::new(),
    };
    let c = Cluster::up_with(3, shards, &extra);
    let nodes: Vec<(u64, u32)> = c.nodes.iter().map(|n| (n.id, n.pid)).collect();
    eprintln!("cluster up in {}; settling {settle}s", c.dir.display());
    std::thread::sleep(Duration::from_secs(settle));

    let before: Vec<f64> = nodes.iter().map(|(_, pid)| cpu_secs(*pid)).collect();
    let t0 = Instant::now();
    for s in 1..=secs {
        std::thread::sleep(Duration::from_secs(1));
        if s % 10 == 0 || s == secs {
            eprintln!("  measured {s}/{secs}s");
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let after: Vec<f64> = nodes.iter().map(|(_, pid)| cpu_secs(*pid)).collect();

    let mut rows = Vec::new();
    let mut total_core = 0.0;
    println!();
    println!(
        "{:<6} {:>8} {:>12} {:>14} {:>9} {:>8}",
        "node",
        "pid",
        "% of 1 core",
        format!("% of {cores} cores"),
        "RSS MiB",
        "threads"
    );
    for (i, (id, pid)) in nodes.iter().enumerate() {
        let cpu_s = after[i] - before[i];
        let core_pct = cpu_s / elapsed * 100.0;
        total_core += core_pct;
        let rss_mib = status_kib(*pid, "VmRSS").map(|kb| kb as f64 / 1024.0);
        // `Threads:` is a count, not KiB, but the field parser is the same.
        let threads = status_kib(*pid, "Threads");
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
        "cores": cores,
        "total_pct_of_one_core": total_core,
        "total_pct_of_machine": total_core / cores as f64,
    });
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target").join("idle_cpu.json");
    match serde_json::to_vec_pretty(&report).map_err(std::io::Error::other).and_then(|b| std::fs::write(&path, b)) {
        Ok(()) => println!("written {}", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }
    // Dropping the cluster SIGKILLs its nodes.
}
