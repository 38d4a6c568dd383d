//! Scenario (c) `connect-storm`: registers N devices (the registry API has no bulk import, so
//! concurrently), then connects all of them over MQTT as fast as allowed (a bounded number of
//! handshakes in flight), keeps them connected for a while and reports connects/s, connect latency
//! (dial → CONNACK) percentiles, failures by kind, and the nodes' memory per connection.
//!
//! One process can hold at most RLIMIT_NOFILE connections and an unprivileged container cannot raise
//! the hard limit, so `--procs K` splits the devices over K worker processes (this same binary, hidden
//! `storm-worker` command) that start at the same instant and report back as JSON.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::QoS;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::hub::Hub;
use crate::mqtt;
use crate::procs;
use crate::sas::unix_micros;
use crate::scenarios::common::{svg_path, write_json, Cluster};
use crate::scenarios::fleet::{create_devices, endpoint};
use crate::stats::{new_hist, LatencySummary, Recorder, Second};
use crate::targets::key_of;

#[derive(Debug, Clone)]
pub struct StormOpts {
    pub cluster: Option<PathBuf>,
    pub bin: Option<PathBuf>,
    pub shards: u32,
    pub devices: usize,
    pub create_concurrency: usize,
    pub connect_concurrency: usize,
    pub procs: usize,
    pub mqtt_tls: bool,
    pub subscribe: bool,
    pub hold: Duration,
    pub out: PathBuf,
    pub svg: Option<PathBuf>,
}

/// What one connecting process reports.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct WorkerReport {
    pub connected: usize,
    pub latencies_us: Vec<u64>,
    /// Wall-clock µs at which each connection completed (for the per-second series).
    pub done_at_us: Vec<u64>,
    pub errors: BTreeMap<String, u64>,
    pub error_samples: Vec<String>,
    pub last_connect_us: u64,
    pub closed_during_hold: usize,
    pub rlimit_nofile: u64,
}

/// Connects devices `from..to` (keys indexed by device number) starting at wall-clock `start_at_us`,
/// `concurrency` handshakes at a time. Returns the open connections and the report.
#[allow(clippy::too_many_arguments)] // one call site per storm phase, each naming every argument
pub async fn connect_range(
    hub: &Hub,
    keys: &[String],
    from: usize,
    to: usize,
    concurrency: usize,
    tls: bool,
    subscribe: bool,
    start_at_us: u64,
    label: &str,
) -> anyhow::Result<(Vec<mqtt::Conn>, WorkerReport)> {
    let now = unix_micros();
    if start_at_us > now {
        tokio::time::sleep(Duration::from_micros(start_at_us - now)).await;
    }
    let report = Arc::new(Mutex::new(WorkerReport::default()));
    let done = Arc::new(AtomicU64::new(0));
    let sem = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let mut tasks = Vec::with_capacity(to - from);
    for (i, key) in keys.iter().enumerate().take(to).skip(from) {
        let ep = endpoint(hub, i, tls)?;
        let (host, key, sem, report, done) =
            (hub.info.hostname.clone(), key.clone(), sem.clone(), report.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await.ok()?;
            let r = mqtt::connect_device(&ep, &host, &key_of(i), &key, None).await;
            let r = match r {
                Ok(mut c) if subscribe => {
                    match c.subscribe("$iothub/twin/PATCH/properties/desired/#", QoS::AtLeastOnce).await {
                        Ok(()) => Ok(c),
                        Err(e) => Err(e),
                    }
                }
                other => other,
            };
            let mut g = report.lock().unwrap();
            match r {
                Ok(c) => {
                    let at = unix_micros();
                    g.connected += 1;
                    g.latencies_us.push(c.connect_latency.as_micros() as u64);
                    g.done_at_us.push(at);
                    g.last_connect_us = g.last_connect_us.max(at);
                    done.fetch_add(1, Ordering::Relaxed);
                    Some(c)
                }
                Err(e) => {
                    *g.errors.entry(format!("connect/{}", e.kind)).or_default() += 1;
                    if g.error_samples.len() < 5 {
                        g.error_samples.push(e.to_string());
                    }
                    None
                }
            }
        }));
    }
    let ticker = {
        let (done, label, n) = (done.clone(), label.to_string(), to - from);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                eprintln!("[{label}] connected {}/{n}", done.load(Ordering::Relaxed));
            }
        })
    };
    let mut conns = Vec::with_capacity(to - from);
    for t in tasks {
        if let Ok(Some(c)) = t.await {
            conns.push(c);
        }
    }
    ticker.abort();
    let report = std::mem::take(&mut *report.lock().unwrap());
    Ok((conns, report))
}

/// Counts connections that were closed since they connected.
fn count_closed(conns: &mut [mqtt::Conn]) -> usize {
    let mut n = 0;
    for c in conns.iter_mut() {
        while let Ok(m) = c.rx.try_recv() {
            if matches!(m, mqtt::Msg::Closed(_)) {
                n += 1;
            }
        }
    }
    n
}

/// The hidden `storm-worker` command: one process's share of the storm.
#[allow(clippy::too_many_arguments)]
pub async fn worker(
    cluster: &Path,
    keys_file: &Path,
    from: usize,
    to: usize,
    concurrency: usize,
    tls: bool,
    subscribe: bool,
    start_at_us: u64,
    hold_until_us: u64,
) -> anyhow::Result<()> {
    let nofile = procs::raise_nofile((to - from) as u64 + 1024);
    let hub = Hub::load(cluster)?;
    let keys: Vec<String> = serde_json::from_str(&std::fs::read_to_string(keys_file)?)?;
    let label = format!("worker {from}..{to}");
    let (mut conns, mut report) =
        connect_range(&hub, &keys, from, to, concurrency, tls, subscribe, start_at_us, &label).await?;
    let now = unix_micros();
    if hold_until_us > now {
        tokio::time::sleep(Duration::from_micros(hold_until_us - now)).await;
    }
    report.closed_during_hold = count_closed(&mut conns);
    report.rlimit_nofile = nofile;
    println!("{}", serde_json::to_string(&report)?);
    for c in &conns {
        let _ = c.client.try_disconnect();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(())
}

pub async fn run(o: StormOpts) -> anyhow::Result<Value> {
    // Before the cluster starts, so that the nodes (our children) inherit it too.
    let nofile = procs::raise_nofile(o.devices as u64 * 2 + 16_384);
    eprintln!("RLIMIT_NOFILE now {nofile}");
    // Every simulated device connects from this one machine and address, like a fleet behind one
    // NAT, to 3 nodes sharing it. A cluster started here is configured for that (an existing cluster
    // must be, by its operator): the whole in-flight window may come from one source (the default,
    // 64 unauthenticated connections per source and listener, is for hubs facing the internet), and
    // each node takes its third of the devices even where the descriptor limit (`ulimit -Hn`) would
    // give its MQTT listener less by default (the node then warns that its caps exceed the limit).
    let node_options = [
        format!("max_unauthenticated_per_source={}", o.connect_concurrency.max(64)),
        format!("max_connections_mqtt={}", o.devices.div_ceil(3) + 256),
    ];
    let extra: Vec<String> = node_options.into_iter().flat_map(|opt| ["--node-option".to_string(), opt]).collect();
    let cluster = Cluster::get_with(o.cluster.as_deref(), o.bin.as_deref(), o.shards, &extra)?;
    let r = run_on(&o, &cluster, nofile).await;
    cluster.down();
    let v = r?;
    write_json(&o.out, &v)?;
    Ok(v)
}

async fn run_on(o: &StormOpts, cluster: &Cluster, nofile: u64) -> anyhow::Result<Value> {
    let hub = cluster.hub();
    let pids = hub.pids();
    let create_rec = Arc::new(Recorder::new());
    eprintln!("registering {} devices over HTTPS, {} at a time", o.devices, o.create_concurrency);
    let (keys, create_s) = create_devices(hub, o.devices, o.create_concurrency, Some(create_rec.clone())).await?;
    let create = create_rec.summary();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_before = procs::rss_of(&pids);
    // One process cannot hold more connections than its RLIMIT_NOFILE (and then cannot even open
    // /proc files): spread over enough processes.
    let per_proc_max = nofile.saturating_sub(2_000).max(1000) as usize;
    let needed = o.devices.div_ceil(per_proc_max);
    let procs_n = o.procs.max(needed).max(1);
    if procs_n > o.procs {
        eprintln!(
            "RLIMIT_NOFILE {nofile} allows ~{per_proc_max} connections per process: using {procs_n} client processes"
        );
    }
    let per_proc_conc = (o.connect_concurrency / procs_n).max(1);
    eprintln!(
        "connecting {} devices from {procs_n} process(es), {} handshakes in flight in all",
        o.devices,
        per_proc_conc * procs_n
    );
    let start_at = unix_micros() + 3_000_000;
    let mut reports: Vec<WorkerReport> = Vec::new();
    let rss_after;
    let alive: Vec<bool>;
    if procs_n == 1 {
        let (mut conns, mut rep) =
            connect_range(hub, &keys, 0, o.devices, o.connect_concurrency, o.mqtt_tls, o.subscribe, start_at, "storm")
                .await?;
        eprintln!("{}/{} connected; holding {} s", conns.len(), o.devices, o.hold.as_secs());
        tokio::time::sleep(o.hold).await;
        rss_after = procs::rss_of(&pids);
        alive = pids.iter().map(|p| procs::pid_alive(*p)).collect();
        rep.closed_during_hold = count_closed(&mut conns);
        rep.rlimit_nofile = nofile;
        for c in &conns {
            let _ = c.client.try_disconnect();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        reports.push(rep);
    } else {
        let cluster_json = match cluster {
            Cluster::Own(c) => c.cluster_json(),
            Cluster::Existing(_) => o.cluster.clone().expect("--cluster given"),
        };
        let keys_file = std::env::temp_dir().join(format!("twinhub-bench-storm-keys-{}.json", std::process::id()));
        std::fs::write(&keys_file, serde_json::to_string(&keys)?)?;
        // Generous: every worker must have connected before the hold ends (≥ 30 s, or 500 connects/s).
        let window_us = (30_000_000u64).max(o.devices as u64 * 2_000);
        let hold_until = start_at + window_us + o.hold.as_micros() as u64;
        let exe = std::env::current_exe()?;
        let mut children = Vec::new();
        for k in 0..procs_n {
            let (from, to) = (o.devices * k / procs_n, o.devices * (k + 1) / procs_n);
            let mut cmd = Command::new(&exe);
            cmd.arg("storm-worker")
                .arg("--cluster")
                .arg(&cluster_json)
                .arg("--keys")
                .arg(&keys_file)
                .args(["--from", &from.to_string(), "--to", &to.to_string()])
                .args(["--connect-concurrency", &per_proc_conc.to_string()])
                .args(["--start-at", &start_at.to_string(), "--hold-until", &hold_until.to_string()]);
            if o.mqtt_tls {
                cmd.arg("--mqtt-tls");
            }
            if o.subscribe {
                cmd.arg("--subscribe");
            }
            children.push(cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn()?);
        }
        // Memory and liveness while every connection is held.
        let now = unix_micros();
        let wait_until = hold_until.saturating_sub(2_000_000);
        // Wake early if all connected earlier: poll the hold deadline in steps.
        if wait_until > now {
            tokio::time::sleep(Duration::from_micros(wait_until - now)).await;
        }
        rss_after = procs::rss_of(&pids);
        alive = pids.iter().map(|p| procs::pid_alive(*p)).collect();
        for c in children {
            let out = tokio::task::spawn_blocking(move || c.wait_with_output()).await??;
            let text = String::from_utf8_lossy(&out.stdout);
            match text.lines().last().map(serde_json::from_str::<WorkerReport>) {
                Some(Ok(r)) => reports.push(r),
                _ => eprintln!("storm worker failed ({}): {}", out.status, text),
            }
        }
        let _ = std::fs::remove_file(&keys_file);
    }
    for (i, a) in alive.iter().enumerate() {
        if !a {
            let log = hub.info.nodes[i].log.clone().unwrap_or_default();
            eprintln!("node {} DIED during the storm; log tail:\n{}", i + 1, crate::peers::log_tail(&log, 3000));
        }
    }
    // Merge.
    let mut h = new_hist();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut samples = Vec::new();
    let (mut connected, mut closed, mut last) = (0usize, 0usize, start_at);
    let mut done_at: Vec<u64> = Vec::new();
    let mut worker_nofile = Vec::new();
    for r in &reports {
        connected += r.connected;
        closed += r.closed_during_hold;
        last = last.max(r.last_connect_us);
        for l in &r.latencies_us {
            h.saturating_record((*l).max(1));
        }
        for (k, v) in &r.errors {
            *errors.entry(k.clone()).or_default() += v;
        }
        samples.extend(r.error_samples.iter().cloned());
        done_at.extend(&r.done_at_us);
        worker_nofile.push(r.rlimit_nofile);
    }
    let storm_s = (last.saturating_sub(start_at)) as f64 / 1e6;
    let storm_s = storm_s.max(1e-6);
    // Connects per second over time.
    let secs = (storm_s.ceil() as usize).max(1);
    let mut per_sec = vec![0u64; secs];
    for t in &done_at {
        let i = ((t.saturating_sub(start_at)) / 1_000_000) as usize;
        if let Some(x) = per_sec.get_mut(i.min(secs - 1)) {
            *x += 1;
        }
    }
    let series: Vec<Second> = per_sec
        .iter()
        .enumerate()
        .map(|(i, n)| Second {
            t_s: (i + 1) as f64,
            ops_per_s: *n as f64,
            errors: 0,
            p50_ms: 0.0,
            p99_ms: 0.0,
            by_op: BTreeMap::new(),
            steal_pct: None,
        })
        .collect();
    let connect = LatencySummary::of(&h);
    let per_conn_kib =
        if connected > 0 { (rss_after.rss_mb - rss_before.rss_mb) * 1024.0 / connected as f64 } else { 0.0 };
    let out = json!({
        "scenario": "(c) connect storm",
        "target": "twinhub",
        "version": cluster.version(),
        "config": {"devices": o.devices, "connect_concurrency": o.connect_concurrency, "client_processes": procs_n,
                   "create_concurrency": o.create_concurrency,
                   "mqtt": if o.mqtt_tls { "TLS" } else { "plain TCP" }, "subscribe": o.subscribe, "hold_s": o.hold.as_secs(),
                   "rlimit_nofile_parent_and_nodes": nofile, "rlimit_nofile_workers": worker_nofile,
                   "machine": crate::compare::machine()},
        "registry": {"seconds": create_s, "devices_per_s": o.devices as f64 / create_s.max(1e-6),
                     "create_device": create.ops.get("create_device"), "errors": create.errors},
        "connected": connected,
        "failed": o.devices - connected,
        "storm_s": storm_s,
        "connects_per_s": connected as f64 / storm_s,
        "connect_latency": connect,
        "errors": errors,
        "error_samples": samples,
        "closed_during_hold": closed,
        "nodes_alive_after_hold": alive,
        "server_rss_before_mb": rss_before.rss_mb,
        "server_rss_connected_mb": rss_after.rss_mb,
        "server_kib_per_connection": per_conn_kib,
        "series": series,
    });
    println!(
        "\nconnect storm: {} devices over MQTT ({}), {} handshakes in flight from {procs_n} client process(es)",
        o.devices,
        if o.mqtt_tls { "TLS" } else { "plain TCP" },
        per_proc_conc * procs_n
    );
    println!("  registry: {} devices in {:.1}s ({:.0}/s)", o.devices, create_s, o.devices as f64 / create_s.max(1e-6));
    println!(
        "  connected {connected}, failed {}, in {storm_s:.1}s → {:.0} connects/s",
        o.devices - connected,
        connected as f64 / storm_s
    );
    println!(
        "  connect latency p50 {:.2} ms p90 {:.2} ms p99 {:.2} ms p99.9 {:.2} ms max {:.2} ms",
        connect.p50_ms, connect.p90_ms, connect.p99_ms, connect.p999_ms, connect.max_ms
    );
    println!("  errors {errors:?}; closed during hold {closed}; nodes alive {alive:?}");
    println!(
        "  server RSS {:.0} MB → {:.0} MB ({per_conn_kib:.1} KiB per connection)",
        rss_before.rss_mb, rss_after.rss_mb
    );
    let svg = svg_path(&o.out, o.svg.as_deref());
    crate::plot::write_svg(
        &svg,
        &format!("twinhub connect storm: {} devices (connects per second)", o.devices),
        &[crate::plot::Run { label: "connects".into(), series: &series }],
    )?;
    eprintln!("wrote {}", svg.display());
    Ok(out)
}
