//! One scenario: fresh twins, the workload, the fault(s) mid-way, healing, quiescence, final reads per
//! twin and per device connection, then the checker over the recorded history.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::runner::cluster::{Cluster, HOSTNAME};
use crate::runner::device::{device_worker, DeviceConn};
use crate::runner::faults::{Nemesis, Timing};
use crate::runner::output::{ops_by_kind, timeline, unavailability, IndexedOp, ScenarioReport, ViolationDetail};
use crate::runner::util::{enc, now_ns, secs};
use crate::runner::workload::{final_reads, http_worker, Recorder, Shared};
use crate::say;
use crate::{check, History, OpKind, Outcome, TwinState};

#[derive(Clone, Debug)]
pub struct ScenarioOpts {
    pub twins: usize,
    /// Twins per group; each group has `http_per_group` HTTP workers (per-twin concurrency: those plus
    /// the twin's device).
    pub group: usize,
    pub http_per_group: usize,
    /// Workload before the first fault.
    pub warmup: Duration,
    /// Workload after the last fault healed.
    pub tail: Duration,
    /// At least this much workload in all.
    pub min_workload: Duration,
    /// Faults injected one after the other (with `gap` between).
    pub rounds: usize,
    pub gap: Duration,
    pub random_timing: bool,
    pub request_timeout: Duration,
}

impl ScenarioOpts {
    pub fn short() -> ScenarioOpts {
        ScenarioOpts {
            twins: 24,
            group: 4,
            http_per_group: 3,
            warmup: Duration::from_secs(6),
            tail: Duration::from_secs(6),
            min_workload: Duration::from_secs(24),
            rounds: 1,
            gap: Duration::ZERO,
            random_timing: false,
            request_timeout: Duration::from_secs(4),
        }
    }

    pub fn long() -> ScenarioOpts {
        ScenarioOpts {
            twins: 24,
            group: 4,
            http_per_group: 3,
            warmup: Duration::from_secs(8),
            tail: Duration::from_secs(8),
            min_workload: Duration::from_secs(60),
            rounds: 2,
            gap: Duration::from_secs(8),
            random_timing: true,
            request_timeout: Duration::from_secs(4),
        }
    }
}

/// Creates a device (retrying through every node); returns its primary key.
async fn create_device(cluster: &Cluster, id: &str) -> Result<String> {
    let body = json!({"deviceId": id, "status": "enabled", "authentication": {"type": "sas", "symmetricKey": {}}});
    let path = format!("/devices/{}", enc(id));
    let mut last = String::new();
    for attempt in 0..30 {
        let node = cluster.ids()[attempt % cluster.nodes.len()];
        let mut c = cluster.client(node);
        let r = c.json("PUT", &path, Some(&body), Duration::from_secs(5)).await;
        let r = match r {
            Ok((409, _)) => c.json("GET", &path, None, Duration::from_secs(5)).await,
            other => other,
        };
        match r {
            Ok((200, v)) => {
                if let Some(k) = v.pointer("/authentication/symmetricKey/primaryKey").and_then(Value::as_str) {
                    return Ok(k.to_string());
                }
                last = format!("no key in {v}");
            }
            Ok((s, v)) => last = format!("{s} {v}"),
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    anyhow::bail!("cannot create device {id}: {last}")
}

/// Runs scenario `name` on `cluster`; writes `dir/<label>/history.json` (and the minimal sub-history
/// of each violation) and returns the report.
pub async fn run(
    cluster: &mut Cluster,
    name: &str,
    label: &str,
    seed: u64,
    opts: &ScenarioOpts,
    dir: &Path,
) -> Result<ScenarioReport> {
    let mut rng = StdRng::seed_from_u64(seed);
    let sdir = dir.join(label);
    std::fs::create_dir_all(&sdir)?;
    let scenario_start = now_ns();
    say!("scenario {label} ({name}, seed {seed}): preparing");
    let mut observations = Vec::new();
    if let Err(e) = cluster.wait_healthy(Duration::from_secs(90)).await {
        observations.push(format!("cluster not healthy before the scenario: {e}"));
    }
    let log_offsets = cluster.log_offsets();

    // Fresh twins, named after the scenario.
    let tag: String = label.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
    let twins: Vec<String> = (0..opts.twins).map(|i| format!("{tag}-d{i:02}")).collect();
    let mut keys = Vec::new();
    for t in &twins {
        keys.push(create_device(cluster, t).await.with_context(|| format!("scenario {label}: creating twins"))?);
    }
    let rec = Recorder::new();
    let shared = Arc::new(Shared {
        rec: rec.clone(),
        stop: Default::default(),
        http: cluster.nodes.iter().map(|n| n.http).collect(),
        mqtt: cluster.nodes.iter().map(|n| n.mqtt_plain).collect(),
        node_ids: cluster.ids(),
        tls: cluster.tls.clone(),
        owner_key: cluster.owner_key.clone(),
        hostname: HOSTNAME.to_string(),
        timeout: opts.request_timeout,
    });

    // A change-feed consumer, following from before the first write to after the final reads.
    let feed_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (feed_ready, feed_opened) = tokio::sync::oneshot::channel();
    let feed =
        tokio::spawn(crate::runner::feed::consumer(shared.clone(), twins.clone(), feed_ready, feed_stop.clone()));
    if tokio::time::timeout(Duration::from_secs(30), feed_opened).await.is_err() {
        observations.push("the change-feed consumer could not open a stream within 30 s".into());
    }

    // The workload.
    let workload_start = now_ns();
    let mut devices = Vec::new();
    for (i, (t, k)) in twins.iter().zip(&keys).enumerate() {
        devices.push(tokio::spawn(device_worker(
            shared.clone(),
            t.clone(),
            k.clone(),
            seed.wrapping_mul(1000) + i as u64,
        )));
    }
    let mut workers = Vec::new();
    for (g, group) in twins.chunks(opts.group.max(1)).enumerate() {
        for w in 0..opts.http_per_group {
            let s = seed.wrapping_mul(7919).wrapping_add((g * 100 + w) as u64);
            workers.push(tokio::spawn(http_worker(shared.clone(), group.to_vec(), s)));
        }
    }
    say!(
        "scenario {label}: workload of {} HTTP clients and {} devices on {} twins",
        workers.len(),
        devices.len(),
        twins.len()
    );
    tokio::time::sleep(opts.warmup).await;

    // The faults.
    let timing = if opts.random_timing { Timing::random(&mut rng) } else { Timing::short() };
    let mut nemesis_rng = StdRng::seed_from_u64(rng.gen());
    let mut nem = Nemesis {
        cluster: &mut *cluster,
        rng: &mut nemesis_rng,
        timing,
        faults: Vec::new(),
        observations: Vec::new(),
        leaders_before: Default::default(),
    };
    for round in 0..opts.rounds {
        if round > 0 {
            tokio::time::sleep(opts.gap).await;
            if let Err(e) = nem.cluster.wait_healthy(Duration::from_secs(60)).await {
                nem.observations.push(format!("cluster not healthy before fault round {}: {e}", round + 1));
            }
        }
        say!("scenario {label}: injecting {name} (round {}), {} ops so far", round + 1, rec.len());
        if let Err(e) = nem.inject(name).await {
            nem.observations.push(format!("fault injection failed: {e:#}"));
        }
    }
    let faults = std::mem::take(&mut nem.faults);
    observations.append(&mut nem.observations);
    drop(nem);
    tokio::time::sleep(opts.tail).await;
    let min_end = workload_start + opts.min_workload.as_nanos() as u64;
    if now_ns() < min_end {
        tokio::time::sleep(Duration::from_nanos(min_end - now_ns())).await;
    }

    // Stop, quiesce.
    shared.stop.store(true, Ordering::Relaxed);
    let workload_end = now_ns();
    for w in workers {
        let _ = w.await;
    }
    let mut conns: Vec<DeviceConn> = Vec::new();
    for d in devices {
        if let Ok(Some(c)) = d.await {
            conns.push(c);
        }
    }
    say!(
        "scenario {label}: workload stopped after {:.1}s, {} ops; quiescing",
        secs(workload_end - workload_start),
        rec.len()
    );
    for id in cluster.ids() {
        if let Some(st) = cluster.check_exited(id) {
            observations.push(format!("node {id} had exited by the end of the workload ({st}): restarting it"));
            let _ = cluster.spawn(id);
        }
    }
    if let Err(e) = cluster.wait_healthy(Duration::from_secs(90)).await {
        observations.push(format!("cluster not healthy after healing: {e}"));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Final reads: every twin through every node (the last one marked), every live connection's GET.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut reads = Vec::new();
    for (i, t) in twins.iter().enumerate() {
        reads.push(tokio::spawn(final_reads(shared.clone(), t.clone(), i, deadline)));
    }
    for r in reads {
        let _ = r.await;
    }
    let live = conns.len();
    let mut conv = Vec::new();
    for mut c in conns {
        conv.push(tokio::spawn(async move {
            let r = c.converge(tokio::time::Instant::now() + Duration::from_secs(15)).await;
            c.close().await;
            r
        }));
    }
    let mut convergence_notes = Vec::new();
    for c in conv {
        if let Ok(Err(note)) = c.await {
            convergence_notes.push(note);
        }
    }
    // Events of the last writes may still be on their way (a tail long-polls a replica).
    tokio::time::sleep(Duration::from_secs(3)).await;
    feed_stop.store(true, Ordering::Relaxed);
    let _ = feed.await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let scenario_end = now_ns();

    // The history and its check.
    let (ops, op_nodes) = rec.take();
    let history = History { ops, initial: twins.iter().map(|t| (t.clone(), TwinState::fresh())).collect() };
    let history_path = sdir.join("history.json");
    std::fs::write(&history_path, serde_json::to_vec(&history)?)?;
    // Which node each op went to (aligned with history.json's ops; null: unknown).
    std::fs::write(sdir.join("ops-nodes.json"), serde_json::to_vec(&op_nodes)?)?;
    say!("scenario {label}: checking {} ops ({} device connections live at the end)", history.ops.len(), live);
    let h2 = history.clone();
    let t_check = std::time::Instant::now();
    let mut report = tokio::task::spawn_blocking(move || check(&h2)).await?;
    // A twin with acknowledged writes that no node could read at the end (after a minute of retries)
    // has no final read for the checker to judge: the runner reports it, with the last answers.
    for t in &twins {
        let acked = history
            .ops
            .iter()
            .filter(|o| &o.twin == t && o.kind.is_write() && matches!(o.outcome, Outcome::Ok { .. }))
            .count();
        if acked == 0 || history.ops.iter().any(|o| &o.twin == t && o.final_read) {
            continue;
        }
        let tries: Vec<usize> = history
            .ops
            .iter()
            .enumerate()
            .filter(|(_, o)| &o.twin == t && matches!(o.kind, OpKind::GetTwin) && o.invoke_ns >= workload_end)
            .map(|(i, _)| i)
            .collect();
        let last = tries.last().map(|&i| format!("{:?}", history.ops[i].outcome)).unwrap_or_else(|| "none".into());
        report.violations.push(crate::Violation {
            twin: t.clone(),
            kind: crate::ViolationKind::LostWrite,
            message: format!(
                "{acked} writes were acknowledged, but no final read succeeded ({} tries through every node; the last answered {last})",
                tries.len()
            ),
            ops: tries.into_iter().rev().take(3).collect(),
        });
    }
    let check_secs = t_check.elapsed().as_secs_f64();
    let panics = cluster.panics_since(&log_offsets);

    let mut details = Vec::new();
    for (k, v) in report.violations.iter().enumerate() {
        let sub: Vec<IndexedOp> = v
            .ops
            .iter()
            .filter_map(|&i| {
                history.ops.get(i).map(|op| IndexedOp {
                    index: i,
                    node: op_nodes.get(i).copied().flatten(),
                    op: op.clone(),
                })
            })
            .collect();
        let file = sdir.join(format!("violation-{k}.json"));
        let sub_history = History {
            ops: sub.iter().map(|o| o.op.clone()).collect(),
            initial: history
                .initial
                .get(&v.twin)
                .map(|s| BTreeMap::from([(v.twin.clone(), s.clone())]))
                .unwrap_or_default(),
        };
        std::fs::write(&file, serde_json::to_vec_pretty(&sub_history)?)?;
        details.push(ViolationDetail {
            twin: v.twin.clone(),
            kind: format!("{:?}", v.kind),
            message: v.message.clone(),
            sub_history: sub,
            file: file.display().to_string(),
        });
    }
    let shard_count = cluster.cfg.shard_count;
    let unavail = unavailability(&history, workload_start, workload_end, shard_count, 1.0);
    let passed = report.is_ok() && panics.is_empty();
    let pushes = history.ops.iter().filter(|o| matches!(o.kind, OpKind::Push { .. })).count();
    let acked = history.ops.iter().filter(|o| o.kind.is_write() && matches!(o.outcome, Outcome::Ok { .. })).count();
    let out = ScenarioReport {
        label: label.to_string(),
        scenario: name.to_string(),
        seed,
        nodes: cluster.cfg.nodes,
        shard_count,
        twins: twins.len(),
        start_s: secs(scenario_start),
        end_s: secs(scenario_end),
        workload_start_s: secs(workload_start),
        workload_end_s: secs(workload_end),
        ops: history.ops.len(),
        acknowledged_writes: acked,
        pushes,
        ops_by_kind: ops_by_kind(&history),
        faults,
        unavailability: unavail,
        check_seconds: check_secs,
        check: report,
        violation_details: details,
        panics,
        observations,
        convergence_notes,
        timeline: timeline(&history, scenario_start, scenario_end),
        history: history_path.display().to_string(),
        passed,
        error: None,
    };
    say!(
        "scenario {label}: {} — {} ops, {} violations, {} inconclusive, {} panics (check {:.1}s)",
        if out.passed { "PASS" } else { "FAIL" },
        out.ops,
        out.check.violations.len(),
        out.check.inconclusive.len(),
        out.panics.len(),
        check_secs
    );
    Ok(out)
}
