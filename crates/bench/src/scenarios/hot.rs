//! Scenario (d) `hot-twin`: one twin patched at a fixed rate (default 1,000/s) over HTTPS, open loop,
//! while its device is connected and subscribed. Reports patch latency, pushes received, the
//! coalescing ratio (patches acknowledged / pushes), ordering, and final convergence (the device's
//! last push is the committed final state).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};

use crate::hub::HubClient;
use crate::loadgen::{self, Outcome, Phases, Worker};
use crate::mqtt::{self, Msg};
use crate::sas::unix_micros;
use crate::scenarios::common::{svg_path, write_json, Cluster};
use crate::scenarios::fleet::{connect_and_get, create_devices, endpoint};
use crate::stats::Recorder;
use crate::targets::key_of;
use crate::value::{self, SizeDist};

/// One push a device received: (desired `$version`, sequence, receive time, send → receive µs).
type Push = (i64, u64, Instant, u64);

#[derive(Debug, Clone)]
pub struct HotOpts {
    pub cluster: Option<PathBuf>,
    pub bin: Option<PathBuf>,
    pub shards: u32,
    pub rate: f64,
    pub concurrency: usize,
    pub value: SizeDist,
    pub duration: Duration,
    pub mqtt_tls: bool,
    /// Delay per received message on the device (a slow device), ms.
    pub slow_ms: u64,
    pub out: PathBuf,
    pub svg: Option<PathBuf>,
}

struct HotWorker {
    c: HubClient,
    id: String,
    value: SizeDist,
    seq: Arc<std::sync::atomic::AtomicU64>,
    /// (desired $version, seq) of every acknowledged patch.
    acked: Arc<Mutex<Vec<(i64, u64)>>>,
}

impl Worker for HotWorker {
    async fn step(&mut self) -> Outcome {
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let v = value::make(seq, unix_micros(), self.value.sample(&mut rand::thread_rng()));
        let body = format!("{{\"properties\":{{\"desired\":{{\"fb\":{v}}}}}}}");
        match self.c.write_twin("PATCH", &self.id, Bytes::from(body)).await {
            Ok(version) => {
                self.acked.lock().unwrap().push((version, seq));
                ("patch", Ok(()))
            }
            Err(e) => ("patch", Err(e)),
        }
    }
}

pub async fn run(o: HotOpts) -> anyhow::Result<Value> {
    crate::procs::raise_nofile(65_536);
    let cluster = Cluster::get(o.cluster.as_deref(), o.bin.as_deref(), o.shards)?;
    let r = run_on(&o, &cluster).await;
    cluster.down();
    let v = r?;
    write_json(&o.out, &v)?;
    Ok(v)
}

async fn run_on(o: &HotOpts, cluster: &Cluster) -> anyhow::Result<Value> {
    let hub = cluster.hub();
    let (keys, _) = create_devices(hub, 1, 1, None).await?;
    let id = key_of(0);
    let rec = Arc::new(Recorder::new());
    let qos = rumqttc::QoS::AtLeastOnce;
    let slow = if o.slow_ms > 0 { Some(Duration::from_millis(o.slow_ms)) } else { None };
    let (mut conn, _, initial) =
        connect_and_get(&endpoint(hub, 0, o.mqtt_tls)?, &hub.info.hostname, &id, &keys[0], qos, &rec, slow)
            .await
            .map_err(|e| anyhow::anyhow!("device: {e}"))?;
    // The device: records (version, seq, receive time, send → receive µs) of every push. A slow device
    // sleeps in its MQTT event loop (it reads its socket slowly), not here.
    let seen: Arc<Mutex<Vec<Push>>> = Arc::default();
    let collector = {
        let seen = seen.clone();
        let rec = rec.clone();
        tokio::spawn(async move {
            let _client = conn.client;
            while let Some(m) = conn.rx.recv().await {
                if let Msg::Publish { at, topic, payload } = m {
                    if let Some(v) = mqtt::desired_version(&topic) {
                        let body: Value = serde_json::from_slice(&payload).unwrap_or(Value::Null);
                        let seq = body.pointer("/fb/seq").and_then(Value::as_u64).unwrap_or(0);
                        // Receive time is when the event loop read it (`at`), not when this task ran.
                        let at_wall = unix_micros().saturating_sub(at.elapsed().as_micros() as u64);
                        let lat = value::ts_of(&body, &["fb"]).map(|ts| at_wall.saturating_sub(ts)).unwrap_or(0);
                        if lat > 0 {
                            rec.latency_us("push_send_to_recv", lat);
                        }
                        seen.lock().unwrap().push((v, seq, at, lat));
                    }
                }
            }
        })
    };
    let acked: Arc<Mutex<Vec<(i64, u64)>>> = Arc::default();
    let seq = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let workers: Vec<HotWorker> = (0..o.concurrency.max(1))
        .map(|w| HotWorker { c: hub.client(w), id: id.clone(), value: o.value, seq: seq.clone(), acked: acked.clone() })
        .collect();
    let s2 = seen.clone();
    let extra: crate::progress::Extra = Arc::new(move || format!("pushes {}", s2.lock().unwrap().len()));
    eprintln!(
        "hot twin {id}: {} PATCH/s for {} s over {} HTTPS connections",
        o.rate,
        o.duration.as_secs(),
        o.concurrency
    );
    let (_, open) = loadgen::open(
        workers,
        o.rate,
        rec.clone(),
        Phases { warmup: Duration::ZERO, duration: o.duration },
        "hot-twin",
        Some(extra),
    )
    .await;
    let load_end = Instant::now();
    let summary = rec.summary();
    // Converge: the device must reach the committed final version.
    let mut c = hub.client(0);
    let twin = c.get_twin(&id).await.map_err(|e| anyhow::anyhow!("final GET: {e}"))?;
    let final_version = crate::hub::desired_version(&twin).unwrap_or(0);
    let final_seq = twin.pointer("/properties/desired/fb/seq").and_then(Value::as_u64).unwrap_or(0);
    let mut converged_after = None;
    while load_end.elapsed() < Duration::from_secs(60) {
        if let Some((v, _, at, _)) = seen.lock().unwrap().last() {
            if *v >= final_version {
                converged_after = Some(at.saturating_duration_since(load_end).as_secs_f64());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    collector.abort();
    let seen = seen.lock().unwrap().clone();
    let acked = acked.lock().unwrap().clone();
    let versions: Vec<i64> = seen.iter().map(|s| s.0).collect();
    let increasing = versions.windows(2).all(|w| w[0] < w[1]);
    let last = seen.last().cloned();
    let last_ok = last.as_ref().map(|(v, s, _, _)| *v == final_version && *s == final_seq).unwrap_or(false);
    let patches = acked.len();
    let pushes = seen.len();
    let send_to_recv = summary.latencies.get("push_send_to_recv").cloned();
    let patch = summary.ops.get("patch").cloned();
    let out = json!({
        "scenario": "(d) hot twin",
        "target": "twinhub",
        "version": cluster.version(),
        "config": {"rate": o.rate, "concurrency": o.concurrency, "value_bytes": o.value.to_string(), "duration_s": o.duration.as_secs(),
                   "mqtt": if o.mqtt_tls { "TLS" } else { "plain TCP" }, "device_delay_ms_per_message": o.slow_ms,
                   "machine": crate::compare::machine()},
        "patches_acked": patches,
        "patches_per_s": summary.total.per_s,
        "patch_latency": patch,
        "errors": summary.errors,
        "open_loop": open,
        "desired_version": {"initial": initial, "final": final_version},
        "pushes_received": pushes,
        "coalescing_ratio": if pushes > 0 { patches as f64 / pushes as f64 } else { 0.0 },
        "push_send_to_receive": send_to_recv,
        "versions_strictly_increasing": increasing,
        "last_push_is_final_state": last_ok,
        "converged_s_after_load": converged_after,
        "series": summary.series,
    });
    println!(
        "\nhot twin: {} PATCH/s target to one twin for {} s, {} connections",
        o.rate,
        o.duration.as_secs(),
        o.concurrency
    );
    if let Some(p) = &patch {
        println!("  patches acked {patches} ({:.0}/s), latency p50 {:.2} ms p90 {:.2} ms p99 {:.2} ms p99.9 {:.2} ms, backlog at end {}",
            summary.total.per_s, p.latency.p50_ms, p.latency.p90_ms, p.latency.p99_ms, p.latency.p999_ms, open.backlog_at_end);
    }
    println!(
        "  pushes received {pushes} → coalescing ratio {:.2} patches per push",
        if pushes > 0 { patches as f64 / pushes as f64 } else { 0.0 }
    );
    if let Some(l) = &send_to_recv {
        println!("  push send → device p50 {:.2} ms p99 {:.2} ms max {:.2} ms", l.p50_ms, l.p99_ms, l.max_ms);
    }
    println!("  versions strictly increasing: {increasing}; last push = final committed state (v{final_version}): {last_ok}; converged {:?} s after the load",
        converged_after);
    println!("  errors {:?}", summary.errors);
    let svg = svg_path(&o.out, o.svg.as_deref());
    crate::plot::write_svg(
        &svg,
        &format!("twinhub hot twin: {} PATCH/s to one twin", o.rate),
        &[crate::plot::Run { label: "patches".into(), series: &summary.series }],
    )?;
    eprintln!("wrote {}", svg.display());
    Ok(out)
}
