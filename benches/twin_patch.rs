//! Single-node twin PATCH throughput and latency.
//!
//! Starts the `twinhub` binary (the one cargo built for this bench, i.e. the release profile, or
//! `TWINHUB_BIN`), creates N devices, then drives `PATCH /twins/{id}` (desired properties) with C
//! concurrent HTTPS clients for D seconds and prints throughput and latency percentiles.
//!
//!   cargo bench --bench twin_patch -- --devices 1000 --clients 64 --duration 20
//!
//! Flags or environment: `--devices`/`BENCH_DEVICES` (default 1000), `--clients`/`BENCH_CLIENTS`
//! (64), `--duration`/`BENCH_DURATION` seconds (20), `--warmup`/`BENCH_WARMUP` seconds (3),
//! `--shards`/`BENCH_SHARDS` (server default). This is a benchmark: it asserts nothing about numbers.

use twinhub_testkit as common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Server, ServerOpts};
use hdrhistogram::Histogram;
use serde_json::json;

struct Config {
    devices: usize,
    clients: usize,
    duration: u64,
    warmup: u64,
    shards: Option<u32>,
}

fn config() -> Config {
    let args: Vec<String> = std::env::args().collect();
    let get = |flag: &str, env: &str, default: u64| -> u64 {
        let prefix = format!("{flag}=");
        let from_flag = args.iter().enumerate().find_map(|(i, a)| {
            if a == flag {
                args.get(i + 1).cloned()
            } else {
                a.strip_prefix(&prefix).map(str::to_string)
            }
        });
        let raw = from_flag.or_else(|| std::env::var(env).ok());
        match raw {
            Some(v) => v.parse().unwrap_or_else(|_| panic!("{flag}/{env}: not a number: {v}")),
            None => default,
        }
    };
    Config {
        devices: get("--devices", "BENCH_DEVICES", 1000) as usize,
        clients: get("--clients", "BENCH_CLIENTS", 64) as usize,
        duration: get("--duration", "BENCH_DURATION", 20),
        warmup: get("--warmup", "BENCH_WARMUP", 3),
        shards: {
            let s = get("--shards", "BENCH_SHARDS", 0);
            (s > 0).then_some(s as u32)
        },
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches`/`--all-targets` does not: then there is
    // nothing to do (a bench is not a test).
    if !std::env::args().any(|a| a == "--bench") {
        println!("twin_patch: run with `cargo bench --bench twin_patch` (nothing to do in test mode)");
        return;
    }
    let cfg = config();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(run(cfg));
}

async fn run(cfg: Config) {
    let bin = std::env::var_os("TWINHUB_BIN").map(PathBuf::from);
    let shown = bin.clone().unwrap_or_else(common::bin_path);
    println!(
        "twin_patch bench: binary {} | devices {} | clients {} | duration {}s (+{}s warm-up) | shards {}",
        shown.display(),
        cfg.devices,
        cfg.clients,
        cfg.duration,
        cfg.warmup,
        cfg.shards.map(|s| s.to_string()).unwrap_or_else(|| "default".into())
    );
    let srv = Server::start(ServerOpts {
        shard_count: cfg.shards,
        bin,
        env: vec![("RUST_LOG".into(), std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))],
        ..Default::default()
    });
    println!("server up at {} (data {})", srv.base_url, srv.data_dir.display());

    // Create the devices, C at a time.
    let t0 = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..cfg.clients {
        let api = srv.owner();
        let next = next.clone();
        let n = cfg.devices as u64;
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                api.must_create_device(&format!("bench{i}")).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("device creation");
    }
    println!("created {} devices in {:.1}s", cfg.devices, t0.elapsed().as_secs_f64());

    // Drive PATCHes.
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let recording = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..cfg.clients {
        let api = srv.owner();
        let (done, errors, recording, stop) = (done.clone(), errors.clone(), recording.clone(), stop.clone());
        let devices = cfg.devices;
        tasks.push(tokio::spawn(async move {
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
            let mut i: u64 = 0;
            while !stop.load(Ordering::Relaxed) {
                let dev = (c + (i as usize) * 7919) % devices;
                let body =
                    serde_json::to_vec(&json!({"properties": {"desired": {"counter": i, "client": c}}})).unwrap();
                let start = Instant::now();
                let r = api.try_send_raw("PATCH", &format!("/twins/bench{dev}"), Some(body), &[]).await;
                let us = start.elapsed().as_micros() as u64;
                match r {
                    Ok(r) if r.status == 200 => {
                        if recording.load(Ordering::Relaxed) {
                            hist.saturating_record(us.max(1));
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(r) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        if errors.load(Ordering::Relaxed) <= 5 {
                            eprintln!("PATCH bench{dev}: {} {}", r.status, r.text);
                        }
                    }
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        if errors.load(Ordering::Relaxed) <= 5 {
                            eprintln!("PATCH bench{dev}: {e}");
                        }
                    }
                }
                i += 1;
            }
            hist
        }));
    }
    println!("warming up for {}s", cfg.warmup);
    tokio::time::sleep(Duration::from_secs(cfg.warmup)).await;
    recording.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let mut last = 0;
    for s in 1..=cfg.duration {
        tokio::time::sleep_until((started + Duration::from_secs(s)).into()).await;
        let now = done.load(Ordering::Relaxed);
        println!("  {s:>3}s  {:>8} PATCH/s  total {now}  errors {}", now - last, errors.load(Ordering::Relaxed));
        last = now;
    }
    recording.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    for t in tasks {
        hist.add(t.await.expect("client task")).unwrap();
    }
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    println!();
    println!("twin PATCH, single node, {} clients over HTTPS, {} devices:", cfg.clients, cfg.devices);
    println!("  requests   {} in {:.1}s, errors {}", hist.len(), elapsed, errors.load(Ordering::Relaxed));
    println!("  throughput {:.0} PATCH/s", hist.len() as f64 / elapsed);
    println!(
        "  latency    p50 {:.2} ms | p90 {:.2} ms | p99 {:.2} ms | p99.9 {:.2} ms | max {:.2} ms",
        ms(0.50),
        ms(0.90),
        ms(0.99),
        ms(0.999),
        hist.max() as f64 / 1000.0
    );
    drop(srv);
}
