//! Scenarios (e) and (f): resident bytes per twin with N twins in the cluster (every node holds a
//! replica of every shard with 3 nodes, so N twins per node), then the restart time of a node that
//! holds them (SIGTERM or SIGKILL, start from its config, until `/ready` and a twin read through it).
//!
//! With `replay_before_restart`, the restart is measured at its worst: twins are updated first until the
//! node has applied that fraction of the writes its snapshot policy lets pass between snapshots (read
//! from its `/metrics`), so the restarted node re-applies that much of its log, and the time until it
//! has applied everything it had committed before the stop is reported too.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::procs;
use crate::scenarios::common::{write_json, Cluster};
use crate::targets::twinhub::Twinhub;
use crate::targets::{key_of, Target};
use crate::value::SizeDist;

#[derive(Debug, Clone)]
pub struct MemoryOpts {
    pub bin: Option<PathBuf>,
    pub shards: u32,
    pub twins: usize,
    pub value: SizeDist,
    pub concurrency: usize,
    pub restart: bool,
    pub kill9: bool,
    /// Give every twin the query bench's three tags (`building`, `battery`, `jobgroup`).
    pub tags: bool,
    /// Stop creating twins when the machine's MemAvailable falls below this.
    pub min_available_mb: u64,
    /// Seconds after the load at which RSS is sampled a second time, once the nodes have settled
    /// (0: no second sample).
    pub settle_secs: u64,
    /// Before the restart, update twins until the node to restart has applied this fraction of the
    /// writes after which it snapshots (0: restart as the load left it).
    pub replay_before_restart: f64,
    pub out: PathBuf,
}

/// One shard's snapshot progress on one node, from its `/metrics` (`twinhub_shard_*` gauges).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct ShardProgress {
    writes_since_snapshot: f64,
    snapshot_due_writes: f64,
    snapshot_index: f64,
    commit_index: f64,
    apply_index: f64,
}

impl ShardProgress {
    /// How far the replica is towards its next snapshot (0 when its policy is unknown).
    fn towards_snapshot(&self) -> f64 {
        if self.snapshot_due_writes > 0.0 {
            self.writes_since_snapshot / self.snapshot_due_writes
        } else {
            0.0
        }
    }
}

/// The twin shards' progress in a node's Prometheus text (the metadata group, `shard="meta"`, left out).
fn shard_progress(text: &str) -> BTreeMap<String, ShardProgress> {
    let mut out: BTreeMap<String, ShardProgress> = BTreeMap::new();
    for line in text.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let Some((name, labels)) = series.split_once('{') else { continue };
        let Some(shard) = labels.strip_prefix("shard=\"").and_then(|l| l.strip_suffix("\"}")) else { continue };
        let Ok(v) = value.parse::<f64>() else { continue };
        if shard == "meta" {
            continue;
        }
        let p = out.entry(shard.to_string()).or_default();
        match name {
            "twinhub_shard_writes_since_snapshot" => p.writes_since_snapshot = v,
            "twinhub_shard_snapshot_due_writes" => p.snapshot_due_writes = v,
            "twinhub_shard_snapshot_index" => p.snapshot_index = v,
            "twinhub_shard_commit_index" => p.commit_index = v,
            "twinhub_shard_apply_index" => p.apply_index = v,
            _ => {}
        }
    }
    out.retain(|_, p| *p != ShardProgress::default());
    out
}

async fn progress_of(hub: &crate::hub::Hub, idx: usize) -> anyhow::Result<BTreeMap<String, ShardProgress>> {
    let r = hub.client(idx).send("GET", "/metrics", None).await.map_err(|e| anyhow::anyhow!("GET /metrics: {e}"))?;
    anyhow::ensure!(r.status == 200, "GET /metrics: HTTP {}", r.status);
    Ok(shard_progress(&String::from_utf8_lossy(&r.body)))
}

/// The shard nearest its next snapshot.
fn nearest(p: &BTreeMap<String, ShardProgress>) -> Option<(&String, &ShardProgress)> {
    p.iter().max_by(|a, b| a.1.towards_snapshot().total_cmp(&b.1.towards_snapshot()))
}

/// Updates random twins, `concurrency` at a time, until node `idx` has applied `fraction` of the
/// writes after which one of its shards snapshots, or 30 minutes pass. The gauges are those of the
/// node once the updates have stopped (they refresh once a second).
async fn drive_to_replay(
    o: &MemoryOpts,
    hub: &crate::hub::Hub,
    idx: usize,
    keys: Arc<Vec<String>>,
) -> anyhow::Result<(Value, BTreeMap<String, ShardProgress>)> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let target = Twinhub { hub: hub.clone() };
    let workers = crate::loadgen::update_workers(&target, keys, o.value, o.concurrency).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for mut w in workers {
        let (stop, ok, errors) = (stop.clone(), ok.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            use crate::loadgen::Worker;
            while !stop.load(Ordering::Relaxed) {
                match w.step().await.1 {
                    Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    let started = Instant::now();
    let mut last_print = Instant::now();
    let mut snapshots_seen = 0u32;
    let mut previous: Option<f64> = None;
    let reached = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let p = progress_of(hub, idx).await?;
        let Some((shard, s)) = nearest(&p) else { anyhow::bail!("node {} exports no shard progress", idx + 1) };
        let toward = s.towards_snapshot();
        if previous.is_some_and(|prev| toward < prev) {
            snapshots_seen += 1;
        }
        previous = Some(toward);
        if last_print.elapsed() >= Duration::from_secs(5) || toward >= o.replay_before_restart {
            last_print = Instant::now();
            eprintln!(
                "  {:.0} s: {} updates ({:.0}/s); node {} shard {shard}: {:.0} writes since its snapshot of {:.0} due ({:.1} %)",
                started.elapsed().as_secs_f64(),
                ok.load(Ordering::Relaxed),
                ok.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64(),
                idx + 1,
                s.writes_since_snapshot,
                s.snapshot_due_writes,
                toward * 100.0
            );
        }
        if toward >= o.replay_before_restart {
            break true;
        }
        if started.elapsed() > Duration::from_secs(1800) {
            break false;
        }
    };
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let at_stop = progress_of(hub, idx).await?;
    let (updates, errors) = (ok.load(Ordering::Relaxed), errors.load(Ordering::Relaxed));
    let replay_writes: f64 = at_stop.values().map(|s| s.writes_since_snapshot).sum();
    let replay_entries: f64 = at_stop.values().map(|s| (s.apply_index - s.snapshot_index).max(0.0)).sum();
    println!(
        "  before the restart: {updates} updates in {secs:.0} s ({:.0}/s, {errors} errors); node {} holds {replay_writes:.0} writes in {replay_entries:.0} log entries since its snapshots{}",
        updates as f64 / secs,
        idx + 1,
        if reached { String::new() } else { format!(" (the {:.0} % asked for not reached in 30 min)", o.replay_before_restart * 100.0) }
    );
    let report = json!({
        "fraction_asked": o.replay_before_restart,
        "reached": reached,
        "updates": updates,
        "update_errors": errors,
        "seconds": secs,
        "snapshots_seen": snapshots_seen,
        "writes_to_replay": replay_writes,
        "entries_to_replay": replay_entries,
        "shards": at_stop.iter().map(|(k, s)| (k.clone(), json!({
            "writes_since_snapshot": s.writes_since_snapshot,
            "snapshot_due_writes": s.snapshot_due_writes,
            "snapshot_index": s.snapshot_index,
            "commit_index": s.commit_index,
            "apply_index": s.apply_index,
        }))).collect::<serde_json::Map<String, Value>>(),
    });
    Ok((report, at_stop))
}

fn mem_available_mb() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map(|kib| kib / 1024.0)
        .unwrap_or(f64::MAX)
}

/// Per node: (RSS at the end − RSS at the middle of the curve) / (twins added in between).
fn marginal_bytes_per_twin(curve: &[Value]) -> Option<Vec<f64>> {
    if curve.len() < 2 {
        return None;
    }
    let (a, b) = (&curve[(curve.len() - 1) / 2], &curve[curve.len() - 1]);
    let (ta, tb) = (a["twins"].as_f64()?, b["twins"].as_f64()?);
    if tb <= ta {
        return None;
    }
    let ra = a["rss_mb"].as_array()?;
    let rb = b["rss_mb"].as_array()?;
    Some(
        ra.iter()
            .zip(rb)
            .map(|(x, y)| (y.as_f64().unwrap_or(0.0) - x.as_f64().unwrap_or(0.0)) * 1048576.0 / (tb - ta))
            .collect(),
    )
}

fn per_node(pids: &[u32]) -> Vec<f64> {
    pids.iter().map(|p| procs::status_kib(*p, "VmRSS").unwrap_or(0) as f64 / 1024.0).collect()
}

pub async fn run(o: MemoryOpts) -> anyhow::Result<Value> {
    procs::raise_nofile(65_536);
    let mut cluster = match Cluster::get(None, o.bin.as_deref(), o.shards)? {
        Cluster::Own(c) => c,
        Cluster::Existing(_) => unreachable!(),
    };
    let r = run_on(&o, &mut cluster).await;
    cluster.down();
    let v = r?;
    write_json(&o.out, &v)?;
    let svg = o.out.with_extension("svg");
    crate::plot::write_xy_svg(
        &svg,
        "(e) resident memory per node while loading twins",
        "twins (each node holds all)",
        "RSS MB",
        &rss_lines(&v),
    )?;
    eprintln!("wrote {}", svg.display());
    Ok(v)
}

/// Per node: (twins, RSS MB) points of the load curve in the report.
fn rss_lines(report: &Value) -> Vec<(String, Vec<(f64, f64)>)> {
    let curve = report["curve"].as_array().cloned().unwrap_or_default();
    let nodes = curve.first().and_then(|p| p["rss_mb"].as_array()).map(|a| a.len()).unwrap_or(0);
    (0..nodes)
        .map(|i| {
            let pts = curve
                .iter()
                .filter_map(|p| Some((p["twins"].as_f64()?, p["rss_mb"].as_array()?.get(i)?.as_f64()?)))
                .collect();
            (format!("node {}", i + 1), pts)
        })
        .collect()
}

/// The tags the query bench gives twin `i` (with `--tags`).
pub fn tags_of(i: usize) -> Value {
    json!({"building": i % 100, "battery": (i / 100) % 50, "jobgroup": false})
}

/// Creates `keys` (twins `first`, `first + 1`, …) with one desired value each (`{"fb": value}`, as the
/// update benches write) and, if `tags`, [`tags_of`] through bulk registry calls of 100, `concurrency`
/// calls at a time. Returns (seconds, failed calls).
async fn bulk_populate(
    hub: &crate::hub::Hub,
    keys: &[String],
    first: usize,
    tags: bool,
    value: SizeDist,
    concurrency: usize,
) -> anyhow::Result<(f64, u64)> {
    use crate::hub::BulkDevice;
    use crate::scenarios::fleet::BULK;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    let started = Instant::now();
    let chunks: Arc<Vec<Vec<String>>> = Arc::new(keys.chunks(BULK).map(<[String]>::to_vec).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..concurrency.min(chunks.len()).max(1) {
        let (mut c, chunks, next, errors) = (hub.client(w), chunks.clone(), next.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_entropy();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(ids) = chunks.get(i) else { return };
                let entries: Vec<BulkDevice> = ids
                    .iter()
                    .enumerate()
                    .map(|(j, id)| {
                        let v = crate::value::make(0, 0, value.sample(&mut rng));
                        let desired = serde_json::from_str::<Value>(&v)
                            .ok()
                            .map(|v| Value::Object(serde_json::Map::from_iter([("fb".to_string(), v)])));
                        let tags = tags.then(|| tags_of(first + i * BULK + j));
                        BulkDevice { id: id.clone(), key: twinhub::auth::generate_key(), tags, desired }
                    })
                    .collect();
                let mut ok = false;
                for attempt in 0..5 {
                    match c.bulk_create(&entries).await {
                        Ok(()) => {
                            ok = true;
                            break;
                        }
                        Err(e) => {
                            if errors.fetch_add(1, Ordering::Relaxed) < 5 {
                                eprintln!("bulk create from {}: {e} (attempt {})", ids[0], attempt + 1);
                            }
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
                if !ok {
                    eprintln!("bulk create from {} gave up", ids[0]);
                }
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    Ok((started.elapsed().as_secs_f64(), errors.load(Ordering::Relaxed)))
}

async fn run_on(o: &MemoryOpts, cluster: &mut crate::peers::twinhub::TwinhubCluster) -> anyhow::Result<Value> {
    let pids = cluster.pids();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = per_node(&pids);
    let target = Twinhub { hub: cluster.hub.clone() };
    let keys: Arc<Vec<String>> = Arc::new((0..o.twins).map(|i| target.key(i)).collect());
    eprintln!(
        "creating {} devices with one desired value of {} B each{} through bulk registry calls of 100, {} calls at a time",
        o.twins,
        o.value,
        if o.tags { " and three tags" } else { "" },
        o.concurrency
    );
    // In steps, watching the machine: stop early rather than push it into the OOM killer.
    let step = (o.twins / 20).clamp(1_000, 50_000);
    let mut done = 0usize;
    let mut populate_s = 0.0;
    let mut populate_errors = 0;
    let mut curve = Vec::new();
    let mut stopped_early = None;
    // CPU seconds the nodes and this client spend loading: a steadier yardstick than the rate on a
    // machine whose speed drifts from one run to the next.
    let cpu_start = (crate::procs::cpu_of(&pids), crate::procs::cpu_secs(std::process::id()));
    while done < o.twins {
        let end = (done + step).min(o.twins);
        let chunk: Arc<Vec<String>> = Arc::new(keys[done..end].to_vec());
        let (s, e) = bulk_populate(&cluster.hub, &chunk, done, o.tags, o.value, o.concurrency).await?;
        populate_s += s;
        populate_errors += e;
        done = end;
        let rss = per_node(&pids);
        let avail = mem_available_mb();
        eprintln!(
            "  {done} twins: node RSS {rss:.0?} MB, machine MemAvailable {avail:.0} MB, {:.0} twins/s",
            done as f64 / populate_s
        );
        curve.push(json!({"twins": done, "rss_mb": rss, "mem_available_mb": avail, "elapsed_s": populate_s}));
        if avail < o.min_available_mb as f64 && done < o.twins {
            stopped_early = Some(format!(
                "stopped at {done} of {} twins: MemAvailable {avail:.0} MB < {} MB (--min-available-mb), to keep the machine out of the OOM killer",
                o.twins, o.min_available_mb
            ));
            eprintln!("{}", stopped_early.as_ref().unwrap());
            break;
        }
    }
    let twins_done = done;
    let per_twin_us = |secs: f64| secs * 1e6 / twins_done.max(1) as f64;
    let server_cpu_us = per_twin_us(crate::procs::cpu_of(&pids) - cpu_start.0);
    let client_cpu_us = per_twin_us(crate::procs::cpu_secs(std::process::id()) - cpu_start.1);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = per_node(&pids);
    let data_mb: Vec<f64> =
        cluster.hub.info.nodes.iter().map(|n| n.data_dir.as_ref().map(|d| procs::du_mb(d)).unwrap_or(0.0)).collect();
    let bytes_per_twin: Vec<f64> =
        before.iter().zip(&after).map(|(b, a)| (a - b) * 1024.0 * 1024.0 / twins_done.max(1) as f64).collect();
    let mean_bpt = bytes_per_twin.iter().sum::<f64>() / bytes_per_twin.len().max(1) as f64;
    // What "above the twins' JSON" is measured against: one twin as the service API renders it.
    let json_bytes = match cluster.hub.client(0).get_twin(&key_of(twins_done / 2)).await {
        Ok(t) => t.to_string().len(),
        Err(e) => anyhow::bail!("reading a twin back: {e}"),
    };
    println!(
        "\nmemory: {twins_done} twins (values {} B{}) on 3 nodes, each node a replica of every shard",
        o.value,
        if o.tags { ", three tags" } else { "" }
    );
    println!(
        "  a twin's JSON (service API): {json_bytes} B; RSS per twin above it: {:.0} B (mean of the nodes)",
        mean_bpt - json_bytes as f64
    );
    if let Some(s) = &stopped_early {
        println!("  {s}");
    }
    for (i, ((b, a), bpt)) in before.iter().zip(&after).zip(&bytes_per_twin).enumerate() {
        println!("  node {}: RSS {b:.0} MB → {a:.0} MB, {bpt:.0} bytes per twin, data dir {:.0} MB", i + 1, data_mb[i]);
    }
    println!(
        "  populate {:.0} s ({:.0} twins/s); CPU per twin: {server_cpu_us:.0} µs in the 3 nodes, {client_cpu_us:.0} µs in this client",
        populate_s,
        twins_done as f64 / populate_s
    );
    // RSS 5 s after the load still holds what the load left in flight (the last snapshots being
    // written, allocator pages not yet returned); a node at rest is sampled again later.
    let settled = if o.settle_secs > 5 {
        eprintln!("  waiting {} s after the load for the nodes to settle", o.settle_secs);
        tokio::time::sleep(Duration::from_secs(o.settle_secs - 5)).await;
        let rss = per_node(&pids);
        println!("  RSS {} s after the load: {rss:.0?} MB", o.settle_secs);
        Some(rss)
    } else {
        None
    };
    // Marginal cost from the second half of the curve (excludes fixed start-up memory).
    let marginal = marginal_bytes_per_twin(&curve);
    if let Some(m) = &marginal {
        println!("  marginal bytes per twin per node (slope over the second half of the load): {m:.0?}");
    }
    let mut out = json!({
        "scenario": "(e) memory per twin",
        "target": "twinhub",
        "version": cluster.version,
        "config": {"twins": o.twins, "value_bytes": o.value.to_string(), "tags": o.tags, "concurrency": o.concurrency, "shard_count": o.shards,
                   "machine": crate::compare::machine()},
        "twins_requested": o.twins,
        "twins": twins_done,
        "stopped_early": stopped_early,
        "populate_s": populate_s,
        "populate_errors": populate_errors,
        "twins_per_s": twins_done as f64 / populate_s,
        "server_cpu_us_per_twin": server_cpu_us,
        "client_cpu_us_per_twin": client_cpu_us,
        "curve": curve,
        "marginal_bytes_per_twin_per_node": marginal,
        "rss_before_mb": before,
        "rss_after_mb": after,
        "rss_settled_mb": settled,
        "settle_secs": o.settle_secs,
        "bytes_per_twin_per_node": bytes_per_twin,
        "bytes_per_twin_mean": mean_bpt,
        "twin_json_bytes": json_bytes,
        "data_dir_mb": data_mb,
    });
    if o.restart {
        let idx = cluster.hub.info.nodes.len() - 1;
        let before_stop = if o.replay_before_restart > 0.0 {
            eprintln!(
                "updating twins until node {} has applied {:.0} % of the writes after which it snapshots",
                idx + 1,
                o.replay_before_restart * 100.0
            );
            let loaded = Arc::new(keys[..twins_done].to_vec());
            let (report, progress) = drive_to_replay(o, &cluster.hub, idx, loaded).await?;
            out["replay"] = report;
            Some(progress)
        } else {
            None
        };
        eprintln!("restarting node {} ({})", idx + 1, if o.kill9 { "SIGKILL" } else { "SIGTERM" });
        let (stop, answered, ready) = cluster.restart_node(idx, o.kill9).await?;
        let t0 = Instant::now();
        // A twin read through the restarted node.
        let mut c = cluster.hub.client(idx);
        let mut first_read = None;
        while t0.elapsed() < Duration::from_secs(300) {
            if c.get_twin(&key_of(twins_done / 2)).await.is_ok() {
                first_read = Some(ready.as_secs_f64() + t0.elapsed().as_secs_f64());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Until the node has applied, on every shard, what it had committed before the stop.
        let mut caught_up = None;
        if let Some(before) = &before_stop {
            while t0.elapsed() < Duration::from_secs(1800) {
                if let Ok(now) = progress_of(&cluster.hub, idx).await {
                    if before.iter().all(|(k, b)| now.get(k).is_some_and(|n| n.apply_index >= b.commit_index)) {
                        caught_up = Some(ready.as_secs_f64() + t0.elapsed().as_secs_f64());
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            println!(
                "restart of node {}: start → applied all it had committed before the stop {caught_up:?} s (gauges refresh once a second)",
                idx + 1
            );
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let rss_restarted = procs::status_kib(cluster.hub.info.nodes[idx].pid, "VmRSS").unwrap_or(0) as f64 / 1024.0;
        println!(
            "restart of node {} holding {} twins: stop {:.2} s; start → HTTPS answers {:.2} s, → /ready {:.2} s, → first twin read {:?} s; RSS after restart {rss_restarted:.0} MB",
            idx + 1, twins_done, stop.as_secs_f64(), answered.as_secs_f64(), ready.as_secs_f64(), first_read
        );
        out["restart"] = json!({
            "scenario": "(f) restart time of a node",
            "node": idx + 1,
            "signal": if o.kill9 { "SIGKILL" } else { "SIGTERM" },
            "stop_s": stop.as_secs_f64(),
            "start_to_https_s": answered.as_secs_f64(),
            "start_to_ready_s": ready.as_secs_f64(),
            "start_to_first_twin_read_s": first_read,
            "rss_after_restart_mb": rss_restarted,
            "start_to_caught_up_s": caught_up,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_progress_reads_the_twin_shards_gauges_and_leaves_the_metadata_group_out() {
        let text = "# HELP twinhub_shard_apply_index Last applied index\n\
twinhub_shard_apply_index{shard=\"0\"} 120\n\
twinhub_shard_apply_index{shard=\"meta\"} 7\n\
twinhub_shard_commit_index{shard=\"0\"} 121\n\
twinhub_shard_snapshot_index{shard=\"0\"} 20\n\
twinhub_shard_writes_since_snapshot{shard=\"0\"} 600\n\
twinhub_shard_snapshot_due_writes{shard=\"0\"} 2400\n\
twinhub_shard_writes_since_snapshot{shard=\"1\"} 10\n\
twinhub_shard_snapshot_due_writes{shard=\"1\"} 20\n\
twinhub_http_requests_total{method=\"GET\",route=\"/x\",status=\"200\"} 3\n";
        let p = shard_progress(text);
        assert_eq!(p.len(), 2, "{p:?}");
        let zero = &p["0"];
        assert_eq!(
            (
                zero.apply_index,
                zero.commit_index,
                zero.snapshot_index,
                zero.writes_since_snapshot,
                zero.snapshot_due_writes
            ),
            (120.0, 121.0, 20.0, 600.0, 2400.0)
        );
        assert_eq!(zero.towards_snapshot(), 0.25);
        let (shard, nearest) = nearest(&p).unwrap();
        assert_eq!((shard.as_str(), nearest.towards_snapshot()), ("1", 0.5));
        assert!(shard_progress("garbage\n{}\n").is_empty());
    }
}
