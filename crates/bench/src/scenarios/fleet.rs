//! `run --target twinhub`: a simulated fleet. N devices over MQTT (SAS login, GET twin, reported patches
//! at a rate, desired pushes received) and back ends over HTTPS (desired patches, gets, replaces in a
//! configurable mix, open-loop at a rate or closed-loop at a concurrency). Reports per-operation
//! latency, errors, push latency (PATCH ack → device, and sender timestamp → device), the coalescing
//! ratio (desired writes / pushes received), convergence, a per-second series and an SVG.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rumqttc::QoS;
use serde_json::{json, Value};

use crate::hub::{BulkDevice, Hub, HubClient};
use crate::loadgen::{self, Outcome, Phases, Worker};
use crate::mqtt::{self, Endpoint, Msg};
use crate::progress::Extra;
use crate::sas::unix_micros;
use crate::scenarios::common::{svg_path, write_json, Cluster};
use crate::stats::{Recorder, SignedSummary};
use crate::targets::{key_of, OpError};
use crate::value::{self, SizeDist};

/// Back-end operation mix in percent, e.g. `patch=70,get=20,replace=10`.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Mix {
    pub patch: u32,
    pub get: u32,
    pub replace: u32,
}

impl std::str::FromStr for Mix {
    type Err = String;
    fn from_str(s: &str) -> Result<Mix, String> {
        let mut m = Mix { patch: 0, get: 0, replace: 0 };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| format!("expected op=weight, got {part}"))?;
            let v: u32 = v.trim().parse().map_err(|e| format!("bad weight {v}: {e}"))?;
            match k.trim() {
                "patch" => m.patch = v,
                "get" => m.get = v,
                "replace" => m.replace = v,
                other => return Err(format!("unknown op {other} (patch, get, replace)")),
            }
        }
        if m.patch + m.get + m.replace == 0 {
            return Err("the mix is empty".into());
        }
        Ok(m)
    }
}

#[derive(Debug, Clone)]
pub struct FleetOpts {
    pub cluster: Option<PathBuf>,
    pub bin: Option<PathBuf>,
    pub shards: u32,
    pub devices: usize,
    pub twins: usize,
    pub mqtt_tls: bool,
    pub qos: u8,
    /// Reported patches per device per second (0: none).
    pub reported_rate: f64,
    /// Back-end operations per second (open loop); `None`: closed loop at `concurrency`.
    pub rate: Option<f64>,
    pub concurrency: usize,
    pub mix: Mix,
    pub value: SizeDist,
    pub duration: Duration,
    pub warmup: Duration,
    pub connect_concurrency: usize,
    pub out: PathBuf,
    pub svg: Option<PathBuf>,
}

/// Correlates a desired write's HTTP acknowledgement with the push that carries its version.
#[derive(Default)]
pub struct PushBook {
    /// (device, version) → when the ack or the push was seen first.
    pending: Mutex<HashMap<(u32, i64), (bool, Instant)>>,
    /// ack → receive in µs (negative: the push arrived before the HTTP response).
    samples: Mutex<Vec<i64>>,
}

impl PushBook {
    fn see(&self, dev: u32, version: i64, is_ack: bool, at: Instant) {
        let mut p = self.pending.lock().unwrap();
        match p.remove(&(dev, version)) {
            Some((first_is_ack, first)) if first_is_ack != is_ack => {
                let (ack, recv) = if is_ack { (at, first) } else { (first, at) };
                let us = if recv >= ack { (recv - ack).as_micros() as i64 } else { -((ack - recv).as_micros() as i64) };
                self.samples.lock().unwrap().push(us);
            }
            _ => {
                p.insert((dev, version), (is_ack, at));
            }
        }
    }
}

/// Per-device counters shared by the back ends (writes) and the device tasks (pushes).
pub struct FleetState {
    pub writes: Vec<AtomicU64>,
    pub pushes: Vec<AtomicU64>,
    pub last_push_version: Vec<AtomicI64>,
    pub book: PushBook,
}

struct Backend {
    c: HubClient,
    keys: Arc<Vec<String>>,
    devices: usize,
    mix: Mix,
    value: SizeDist,
    rng: StdRng,
    seq: u64,
    state: Arc<FleetState>,
}

impl Worker for Backend {
    async fn step(&mut self) -> Outcome {
        let i = self.rng.gen_range(0..self.keys.len());
        let key = self.keys[i].clone();
        let total = self.mix.patch + self.mix.get + self.mix.replace;
        let pick = self.rng.gen_range(0..total);
        self.seq += 1;
        if pick < self.mix.get {
            return ("get", self.c.get_twin(&key).await.map(|_| ()));
        }
        let v = value::make(self.seq, unix_micros(), self.value.sample(&mut self.rng));
        let (op, method, body) = if pick < self.mix.get + self.mix.patch {
            ("patch", "PATCH", format!("{{\"properties\":{{\"desired\":{{\"fb\":{v}}}}}}}"))
        } else {
            (
                "replace",
                "PUT",
                format!("{{\"tags\":{{\"fbseq\":{}}},\"properties\":{{\"desired\":{{\"fb\":{v}}}}}}}", self.seq),
            )
        };
        match self.c.write_twin(method, &key, Bytes::from(body)).await {
            Ok(version) => {
                if i < self.devices {
                    self.state.writes[i].fetch_add(1, Ordering::Relaxed);
                    self.state.book.see(i as u32, version, true, Instant::now());
                }
                (op, Ok(()))
            }
            Err(e) => (op, Err(e)),
        }
    }
}

/// Devices per bulk registry call (IoT Hub's maximum).
pub const BULK: usize = 100;

/// Creates `n` devices `fb0000000..` over HTTPS with the bulk registry call (100 per call, keys
/// generated here), `concurrency` calls at a time; returns their primary keys.
pub async fn create_devices(
    hub: &Hub,
    n: usize,
    concurrency: usize,
    rec: Option<Arc<Recorder>>,
) -> anyhow::Result<(Vec<String>, f64)> {
    let started = Instant::now();
    let keys: Arc<Vec<String>> = Arc::new((0..n).map(|_| twinhub::auth::generate_key()).collect());
    let chunks = n.div_ceil(BULK);
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..concurrency.min(chunks.max(1)) {
        let (mut c, next, done, keys, rec) = (hub.client(w), next.clone(), done.clone(), keys.clone(), rec.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let chunk = next.fetch_add(1, Ordering::Relaxed) as usize;
                if chunk >= chunks {
                    return Ok::<(), anyhow::Error>(());
                }
                let range = chunk * BULK..((chunk + 1) * BULK).min(n);
                let entries: Vec<BulkDevice> = range
                    .clone()
                    .map(|i| BulkDevice { id: key_of(i), key: keys[i].clone(), tags: None, desired: None })
                    .collect();
                let mut last = None;
                for _ in 0..5 {
                    let t0 = Instant::now();
                    match c.bulk_create(&entries).await {
                        Ok(()) => {
                            if let Some(r) = &rec {
                                r.record("create_devices_bulk", t0.elapsed());
                            }
                            done.fetch_add(range.len() as u64, Ordering::Relaxed);
                            last = None;
                            break;
                        }
                        Err(e) => {
                            if let Some(r) = &rec {
                                r.error("create_devices_bulk", &e.kind, &e.detail);
                            }
                            last = Some(e);
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
                if let Some(e) = last {
                    anyhow::bail!("create devices {}..{}: {e}", key_of(range.start), key_of(range.end - 1));
                }
            }
        }));
    }
    let ticker = {
        let done = done.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let d = done.load(Ordering::Relaxed).min(n as u64);
                eprintln!("  devices created {d}/{n} ({:.0}/s)", d as f64 / started.elapsed().as_secs_f64());
            }
        })
    };
    for t in tasks {
        t.await??;
    }
    ticker.abort();
    let secs = started.elapsed().as_secs_f64();
    Ok((keys.to_vec(), secs))
}

pub fn endpoint(hub: &Hub, node: usize, tls: bool) -> anyhow::Result<Endpoint> {
    Ok(Endpoint {
        addr: hub.mqtt_addr(node, tls)?,
        tls: if tls { Some((hub.tls.config.clone(), hub.info.hostname.clone())) } else { None },
    })
}

/// One connected device's task: reported patches on an open-loop schedule, responses matched by
/// `$rid`, desired pushes counted and timed.
#[allow(clippy::too_many_arguments)]
async fn device_loop(
    idx: usize,
    mut conn: mqtt::Conn,
    qos: QoS,
    rate: f64,
    rec: Arc<Recorder>,
    state: Arc<FleetState>,
    stop: Arc<AtomicBool>,
    mut rid: u64,
) {
    let mut inflight: HashMap<u64, Instant> = HashMap::new();
    let interval = if rate > 0.0 { Some(Duration::from_secs_f64(1.0 / rate)) } else { None };
    // Spread the devices' schedules over one interval.
    let mut next = Instant::now() + interval.map(|i| i.mul_f64(rand::random::<f64>())).unwrap_or_default();
    let mut seq = 0u64;
    loop {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let wake = match interval {
            Some(_) => next,
            None => Instant::now() + Duration::from_millis(200),
        };
        tokio::select! {
            _ = tokio::time::sleep_until(wake.into()) => {
                if let Some(iv) = interval {
                    // Open loop: every due patch is sent; its latency counts from its intended time.
                    while next <= Instant::now() {
                        rid += 1;
                        seq += 1;
                        inflight.insert(rid, next);
                        let body = format!("{{\"fbr\":{{\"seq\":{seq},\"ts\":{}}}}}", unix_micros());
                        let topic = format!("$iothub/twin/PATCH/properties/reported/?$rid={rid}");
                        if let Err(e) = conn.client.publish(topic, qos, false, body.into_bytes()).await {
                            rec.error("mqtt_reported", "publish", &e.to_string());
                            inflight.remove(&rid);
                        }
                        next += iv;
                    }
                }
                let now = Instant::now();
                inflight.retain(|_, t| {
                    if now.duration_since(*t) > Duration::from_secs(30) {
                        rec.error("mqtt_reported", "timeout", "no response within 30 s");
                        false
                    } else {
                        true
                    }
                });
            }
            m = conn.rx.recv() => {
                let Some(m) = m else { break };
                match m {
                    Msg::Publish { at, topic, payload } => {
                        if let Some((status, r, _)) = mqtt::parse_response(&topic) {
                            if let Some(t0) = inflight.remove(&r) {
                                if status == 204 {
                                    rec.record("mqtt_reported", at.duration_since(t0));
                                } else {
                                    rec.error("mqtt_reported", &format!("status_{status}"), &topic);
                                }
                            }
                        } else if let Some(version) = mqtt::desired_version(&topic) {
                            state.pushes[idx].fetch_add(1, Ordering::Relaxed);
                            state.book.see(idx as u32, version, false, at);
                            let prev = state.last_push_version[idx].swap(version, Ordering::Relaxed);
                            if version <= prev {
                                rec.count("push_out_of_order", 1);
                            }
                            if let Ok(v) = serde_json::from_slice::<Value>(&payload) {
                                if let Some(ts) = value::ts_of(&v, &["fb"]) {
                                    let at_wall = unix_micros().saturating_sub(at.elapsed().as_micros() as u64);
                                    rec.latency_us("push_send_to_recv", at_wall.saturating_sub(ts));
                                }
                                if v.get("$version").and_then(Value::as_i64) != Some(version) {
                                    rec.count("push_body_version_mismatch", 1);
                                }
                            }
                        }
                    }
                    Msg::Closed(e) => {
                        if !stop.load(Ordering::Relaxed) {
                            rec.error("mqtt", "closed", &e);
                        }
                        break;
                    }
                    Msg::SubAck => {}
                }
            }
        }
    }
    let _ = conn.client.try_disconnect();
}

/// Connects a device, subscribes, and GETs its twin; returns the connection, the next `$rid` and the
/// twin's desired `$version`.
pub async fn connect_and_get(
    ep: &Endpoint,
    host: &str,
    id: &str,
    key: &str,
    qos: QoS,
    rec: &Recorder,
    slow: Option<Duration>,
) -> Result<(mqtt::Conn, u64, i64), OpError> {
    let mut conn = mqtt::connect_device(ep, host, id, key, slow).await?;
    rec.record("mqtt_connect", conn.connect_latency);
    conn.subscribe("$iothub/twin/res/#", qos).await?;
    conn.subscribe("$iothub/twin/PATCH/properties/desired/#", qos).await?;
    let t0 = Instant::now();
    conn.client
        .publish("$iothub/twin/GET/?$rid=1", qos, false, Vec::new())
        .await
        .map_err(|e| OpError::new("publish", e))?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match tokio::time::timeout_at(deadline, conn.rx.recv()).await {
            Ok(Some(Msg::Publish { at, topic, payload })) => {
                if let Some((status, 1, _)) = mqtt::parse_response(&topic) {
                    if status != 200 {
                        return Err(OpError::new(&format!("get_status_{status}"), topic));
                    }
                    rec.record("mqtt_get", at.duration_since(t0));
                    let v: Value = serde_json::from_slice(&payload).map_err(|e| OpError::new("bad_response", e))?;
                    let version = v.pointer("/desired/$version").and_then(Value::as_i64).unwrap_or(0);
                    return Ok((conn, 1, version));
                }
            }
            Ok(Some(Msg::Closed(e))) => return Err(OpError::new("closed", e)),
            Ok(Some(Msg::SubAck)) => {}
            Ok(None) => return Err(OpError::new("closed", "connection closed")),
            Err(_) => return Err(OpError::new("timeout", "no twin GET response within 30 s")),
        }
    }
}

pub async fn run(o: FleetOpts) -> anyhow::Result<Value> {
    crate::procs::raise_nofile((o.devices as u64 + o.concurrency as u64) * 2 + 4096);
    let cluster = Cluster::get(o.cluster.as_deref(), o.bin.as_deref(), o.shards)?;
    let r = run_on(&o, cluster.hub(), &cluster.version()).await;
    cluster.down();
    let v = r?;
    write_json(&o.out, &v)?;
    Ok(v)
}

async fn run_on(o: &FleetOpts, hub: &Hub, version: &str) -> anyhow::Result<Value> {
    let twins = o.twins.max(o.devices).max(1);
    let qos = if o.qos == 0 { QoS::AtMostOnce } else { QoS::AtLeastOnce };
    eprintln!("creating {twins} devices over HTTPS");
    let (keys, create_s) = create_devices(hub, twins, 64, None).await?;
    let rec = Arc::new(Recorder::new());
    let state = Arc::new(FleetState {
        writes: (0..o.devices).map(|_| AtomicU64::new(0)).collect(),
        pushes: (0..o.devices).map(|_| AtomicU64::new(0)).collect(),
        last_push_version: (0..o.devices).map(|_| AtomicI64::new(0)).collect(),
        book: PushBook::default(),
    });
    // Devices: connect, subscribe, GET twin; then their loops start.
    eprintln!(
        "connecting {} devices over MQTT ({}), {} at a time",
        o.devices,
        if o.mqtt_tls { "TLS" } else { "plain TCP" },
        o.connect_concurrency
    );
    let stop = Arc::new(AtomicBool::new(false));
    let connect_started = Instant::now();
    let sem = Arc::new(tokio::sync::Semaphore::new(o.connect_concurrency.max(1)));
    let mut connecting = Vec::new();
    for (i, key) in keys.iter().enumerate().take(o.devices) {
        let ep = endpoint(hub, i, o.mqtt_tls)?;
        let (host, id, key) = (hub.info.hostname.clone(), key_of(i), key.clone());
        let (sem, rec, state, stop) = (sem.clone(), rec.clone(), state.clone(), stop.clone());
        let rate = o.reported_rate;
        connecting.push(tokio::spawn(async move {
            let permit = sem.acquire_owned().await;
            let r = connect_and_get(&ep, &host, &id, &key, qos, &rec, None).await;
            drop(permit);
            match r {
                Ok((conn, rid, version)) => {
                    state.last_push_version[i].store(version, Ordering::Relaxed);
                    Some(tokio::spawn(device_loop(i, conn, qos, rate, rec, state, stop, rid)))
                }
                Err(e) => {
                    rec.error("mqtt_connect", &e.kind, &e.detail);
                    None
                }
            }
        }));
    }
    let mut device_tasks = Vec::new();
    for c in connecting {
        if let Some(t) = c.await? {
            device_tasks.push(t);
        }
    }
    let connect_s = connect_started.elapsed().as_secs_f64();
    let connect_summary = rec.summary();
    eprintln!("{} of {} devices connected in {connect_s:.1}s", device_tasks.len(), o.devices);

    // Back ends.
    let keys_arc: Arc<Vec<String>> = Arc::new((0..twins).map(key_of).collect());
    let mut backends = Vec::new();
    for w in 0..o.concurrency.max(1) {
        backends.push(Backend {
            c: hub.client(w),
            keys: keys_arc.clone(),
            devices: o.devices,
            mix: o.mix,
            value: o.value,
            rng: StdRng::from_entropy(),
            seq: 0,
            state: state.clone(),
        });
    }
    let st = state.clone();
    let extra: Extra = Arc::new(move || {
        let p: u64 = st.pushes.iter().map(|x| x.load(Ordering::Relaxed)).sum();
        let w: u64 = st.writes.iter().map(|x| x.load(Ordering::Relaxed)).sum();
        format!("desired writes {w} pushes {p}")
    });
    let ph = Phases { warmup: o.warmup, duration: o.duration };
    let mode;
    let mut open_stats = Value::Null;
    if let Some(rate) = o.rate {
        mode = format!("open loop, {rate} back-end ops/s over {} connections", o.concurrency);
        let (_, s) = loadgen::open(backends, rate, rec.clone(), ph, "fleet", Some(extra)).await;
        open_stats = serde_json::to_value(s)?;
    } else {
        mode = format!("closed loop, {} back-end connections", o.concurrency);
        loadgen::closed(backends, rec.clone(), ph, "fleet", Some(extra)).await;
    }
    let summary = rec.summary();
    // Let trailing pushes arrive, then check convergence: each device's last push = its twin's version.
    let mut converged = 0usize;
    let sample: Vec<usize> = (0..o.devices).collect();
    let mut c = hub.client(0);
    let mut expected: HashMap<usize, i64> = HashMap::new();
    for &i in &sample {
        if let Ok(t) = c.get_twin(&key_of(i)).await {
            expected.insert(i, crate::hub::desired_version(&t).unwrap_or(0));
        }
    }
    // Timed from after the twins were read back.
    let converge_started = Instant::now();
    while converge_started.elapsed() < Duration::from_secs(30) {
        converged =
            expected.iter().filter(|(i, v)| state.last_push_version[**i].load(Ordering::Relaxed) >= **v).count();
        if converged == expected.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let converge_s = converge_started.elapsed().as_secs_f64();
    let mut not_converged: Vec<Value> = expected
        .iter()
        .filter(|(i, v)| state.last_push_version[**i].load(Ordering::Relaxed) < **v)
        .map(|(i, v)| {
            json!({"device": key_of(*i), "twin_desired_version": v,
                   "last_push_version": state.last_push_version[*i].load(Ordering::Relaxed),
                   "writes_acked": state.writes[*i].load(Ordering::Relaxed), "pushes": state.pushes[*i].load(Ordering::Relaxed)})
        })
        .collect();
    not_converged.sort_by_key(|v| v["device"].as_str().unwrap_or("").to_string());
    not_converged.truncate(50);
    stop.store(true, Ordering::Relaxed);
    for t in device_tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    let writes: Vec<u64> = state.writes.iter().map(|x| x.load(Ordering::Relaxed)).collect();
    let pushes: Vec<u64> = state.pushes.iter().map(|x| x.load(Ordering::Relaxed)).collect();
    let (w, p) = (writes.iter().sum::<u64>(), pushes.iter().sum::<u64>());
    let max_ratio =
        writes.iter().zip(&pushes).filter(|(_, p)| **p > 0).map(|(w, p)| *w as f64 / *p as f64).fold(0.0f64, f64::max);
    let ack_to_recv = SignedSummary::of(state.book.samples.lock().unwrap().clone());
    let unmatched = state.book.pending.lock().unwrap().len();
    let out = json!({
        "scenario": "fleet",
        "target": "twinhub",
        "version": version,
        "config": {
            "devices": o.devices, "twins": twins, "mqtt": if o.mqtt_tls { "TLS" } else { "plain TCP" }, "qos": o.qos,
            "reported_rate_per_device": o.reported_rate, "backend": mode, "mix": o.mix, "value_bytes": o.value.to_string(),
            "duration_s": o.duration.as_secs(), "warmup_s": o.warmup.as_secs(),
            "machine": crate::compare::machine(),
        },
        "setup": {
            "devices_created_s": create_s,
            "devices_connected": connect_summary.ops.get("mqtt_connect").map(|s| s.count).unwrap_or(0),
            "connect_s": connect_s,
            "mqtt_connect": connect_summary.ops.get("mqtt_connect"),
            "mqtt_get": connect_summary.ops.get("mqtt_get"),
            "connect_errors": connect_summary.errors,
        },
        "results": summary,
        "pushes": {
            "desired_writes_acked_incl_warmup": w,
            "pushes_received_incl_warmup": p,
            "coalescing_ratio": if p > 0 { w as f64 / p as f64 } else { 0.0 },
            "max_device_coalescing_ratio": max_ratio,
            "ack_to_receive": ack_to_recv,
            "ack_to_receive_note": "HTTP response of the PATCH/PUT → the device receives the push of that exact $version; negative: push before the HTTP response; coalesced writes have no push of their own",
            "writes_without_own_push_or_pushes_without_ack": unmatched,
            "send_to_receive": summary.latencies.get("push_send_to_recv"),
            "converged_devices": converged,
            "checked_devices": expected.len(),
            "convergence_wait_s_after_reading_twins": converge_s,
            "not_converged_sample": not_converged,
        },
        "open_loop": open_stats,
    });
    print_fleet(&out);
    let svg = svg_path(&o.out, o.svg.as_deref());
    crate::plot::write_svg(
        &svg,
        &format!("twinhub fleet: {} devices, {mode}", o.devices),
        &[crate::plot::Run { label: "all ops".into(), series: &summary.series }],
    )?;
    eprintln!("wrote {}", svg.display());
    Ok(out)
}

fn print_fleet(v: &Value) {
    let r = &v["results"];
    println!("\nfleet run: {} | {}", v["config"]["backend"].as_str().unwrap_or(""), v["config"]["mix"]);
    println!(
        "{:<16} {:>10} {:>8} {:>9} {:>9} {:>9} {:>10} {:>9}",
        "op", "count", "errors", "ops/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms"
    );
    if let Some(ops) = r["ops"].as_object() {
        for (k, s) in ops {
            println!(
                "{:<16} {:>10} {:>8} {:>9.1} {:>9.2} {:>9.2} {:>10.2} {:>9.2}",
                k,
                s["count"].as_u64().unwrap_or(0),
                s["errors"].as_u64().unwrap_or(0),
                s["per_s"].as_f64().unwrap_or(0.0),
                s["p50_ms"].as_f64().unwrap_or(0.0),
                s["p90_ms"].as_f64().unwrap_or(0.0),
                s["p99_ms"].as_f64().unwrap_or(0.0),
                s["p999_ms"].as_f64().unwrap_or(0.0)
            );
        }
    }
    let p = &v["pushes"];
    println!(
        "pushes: {} desired writes → {} pushes (coalescing ratio {:.2}, max per device {:.2}); converged {}/{} devices",
        p["desired_writes_acked_incl_warmup"],
        p["pushes_received_incl_warmup"],
        p["coalescing_ratio"].as_f64().unwrap_or(0.0),
        p["max_device_coalescing_ratio"].as_f64().unwrap_or(0.0),
        p["converged_devices"],
        p["checked_devices"]
    );
    println!(
        "push latency: ack → device p50 {:.2} ms p99 {:.2} ms ({} samples, {} negative); send → device p50 {:.2} ms p99 {:.2} ms",
        p["ack_to_receive"]["p50_ms"].as_f64().unwrap_or(0.0),
        p["ack_to_receive"]["p99_ms"].as_f64().unwrap_or(0.0),
        p["ack_to_receive"]["count"],
        p["ack_to_receive"]["negative"],
        p["send_to_receive"]["p50_ms"].as_f64().unwrap_or(0.0),
        p["send_to_receive"]["p99_ms"].as_f64().unwrap_or(0.0)
    );
    println!("errors: {}", r["errors"]);
}
