//! Device twin traffic over MQTT: reported-patch throughput, desired-push latency, and coalescing of a
//! desired burst to a slow device.
//!
//! Starts the `twinhub` binary (the one cargo built for this bench, i.e. the release profile, or
//! `TWINHUB_BIN`) with a plain-TCP MQTT listener (the harness passes `--mqtt-plain-listen 127.0.0.1:0`;
//! the port comes from `DIR/listen.json`), creates N devices over HTTPS and connects one rumqttc client per
//! device with an IoT Hub device SAS token (docs/iothub-protocol.md §1.3). Then:
//!
//!   (a) reported patches: every device publishes `$iothub/twin/PATCH/properties/reported/?$rid=…` and
//!       waits for `$iothub/twin/res/204/?$rid=…` (closed loop) for D seconds → throughput, p50/p90/p99;
//!   (b) desired pushes: one `PATCH /twins/{id}` at a time over HTTPS, rotating over the devices → latency
//!       from the HTTP response (the commit acknowledgement) to the device receiving
//!       `$iothub/twin/PATCH/properties/desired/?$version=n`, and from sending the request;
//!   (c) burst: K desired PATCHes to one twin as fast as possible while its device reads slowly → pushes
//!       delivered vs patches committed (coalescing), and a check that the device saw strictly increasing
//!       versions ending at the committed desired `$version` with the final state.
//!
//!   cargo bench --bench mqtt_twin -- --devices 50 --duration 10
//!
//! Flags or environment: `--devices`/`MQTT_BENCH_DEVICES` (default 50), `--duration`/`MQTT_BENCH_DURATION`
//! seconds of (a) (10), `--warmup`/`MQTT_BENCH_WARMUP` (2), `--samples`/`MQTT_BENCH_SAMPLES` desired pushes
//! in (b) (300), `--burst`/`MQTT_BENCH_BURST` patches in (c) (1000), `--burst-clients`/`MQTT_BENCH_BURST_CLIENTS`
//! concurrent HTTPS senders in (c) (16), `--slow-ms`/`MQTT_BENCH_SLOW_MS` the slow device's delay per
//! message (5), `--qos`/`MQTT_BENCH_QOS` 0 or 1 for device publishes and subscriptions (1, like the Python
//! SDK). Progress goes to stderr, results to stdout. Numbers are printed, never asserted; the only
//! failure (exit 1) is a correctness violation in (c) or a protocol error.

use twinhub_testkit as common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{enc, py_quote, sign, unix_now, Api, Server, ServerOpts};
use hdrhistogram::Histogram;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{json, Value};
use tokio::sync::mpsc;

const HOST: &str = "localhost";
const RES_PREFIX: &str = "$iothub/twin/res/";
const DESIRED_PREFIX: &str = "$iothub/twin/PATCH/properties/desired/";
const OP_TIMEOUT: Duration = Duration::from_secs(30);

struct Config {
    devices: usize,
    duration: u64,
    warmup: u64,
    samples: usize,
    burst: usize,
    burst_clients: usize,
    slow_ms: u64,
    qos: QoS,
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
        devices: get("--devices", "MQTT_BENCH_DEVICES", 50).max(1) as usize,
        duration: get("--duration", "MQTT_BENCH_DURATION", 10).max(1),
        warmup: get("--warmup", "MQTT_BENCH_WARMUP", 2),
        samples: get("--samples", "MQTT_BENCH_SAMPLES", 300) as usize,
        burst: get("--burst", "MQTT_BENCH_BURST", 1000) as usize,
        burst_clients: get("--burst-clients", "MQTT_BENCH_BURST_CLIENTS", 16).max(1) as usize,
        slow_ms: get("--slow-ms", "MQTT_BENCH_SLOW_MS", 5),
        qos: match get("--qos", "MQTT_BENCH_QOS", 1) {
            0 => QoS::AtMostOnce,
            1 => QoS::AtLeastOnce,
            q => panic!("--qos/MQTT_BENCH_QOS must be 0 or 1, not {q}"),
        },
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches`/`--all-targets` does not: then there is
    // nothing to do (a bench is not a test).
    if !std::env::args().any(|a| a == "--bench") {
        println!("mqtt_twin: run with `cargo bench --bench mqtt_twin` (nothing to do in test mode)");
        return;
    }
    let cfg = config();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let ok = rt.block_on(run(cfg));
    drop(rt);
    if !ok {
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------------------------------------------
// A device connection

/// What a device's event-loop task reports.
enum Msg {
    /// An incoming PUBLISH and when the event loop handed it over.
    Publish {
        at: Instant,
        topic: String,
        payload: Vec<u8>,
    },
    SubAck,
}

struct Device {
    id: String,
    client: AsyncClient,
    rx: mpsc::UnboundedReceiver<Msg>,
    next_rid: u64,
    /// Set before a deliberate disconnect, so that the event loop does not report the close as an error.
    closing: Arc<AtomicBool>,
}

/// `SharedAccessSignature sr={quote(host/devices/id)}&sig={quote(b64 hmac)}&se={expiry}` (docs/iothub-protocol.md §1.3).
fn device_sas(device_id: &str, key: &str, expiry: u64) -> String {
    let sr = py_quote(&format!("{HOST}/devices/{device_id}"), "");
    let sig = sign(key, &format!("{sr}\n{expiry}"));
    format!("SharedAccessSignature sr={sr}&sig={}&se={expiry}", py_quote(&sig, ""))
}

/// Connects and subscribes like an IoT Hub device SDK (client id = device id, CleanSession 0, keep-alive
/// 60 s, username `{host}/{id}/?api-version=…`). `slow` delays the event loop after each incoming PUBLISH,
/// which also delays reading the socket (and the PUBACKs) — a slow device.
async fn connect_device(port: u16, id: &str, key: &str, qos: QoS, slow: Option<Duration>) -> Device {
    let mut opts = MqttOptions::new(id, "127.0.0.1", port);
    opts.set_credentials(
        format!("{HOST}/{id}/?api-version=2021-04-12&DeviceClientType=twinhub-bench"),
        device_sas(id, key, unix_now() + 3600),
    );
    opts.set_clean_session(false);
    opts.set_keep_alive(Duration::from_secs(60));
    opts.set_max_packet_size(256 * 1024, 256 * 1024);
    let (client, mut eventloop) = AsyncClient::new(opts, 64);
    let (tx, rx) = mpsc::unbounded_channel();
    let (conn_tx, conn_rx) = tokio::sync::oneshot::channel::<Result<(), String>>();
    let name = id.to_string();
    let closing = Arc::new(AtomicBool::new(false));
    let closing_el = closing.clone();
    tokio::spawn(async move {
        let mut conn_tx = Some(conn_tx);
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    if let Some(t) = conn_tx.take() {
                        let _ = t.send(Ok(()));
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let at = Instant::now();
                    if tx.send(Msg::Publish { at, topic: p.topic, payload: p.payload.to_vec() }).is_err() {
                        return;
                    }
                    if let Some(d) = slow {
                        tokio::time::sleep(d).await;
                    }
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    let _ = tx.send(Msg::SubAck);
                }
                Ok(_) => {}
                Err(e) => {
                    match conn_tx.take() {
                        Some(t) => {
                            let _ = t.send(Err(e.to_string()));
                        }
                        None => {
                            if !closing_el.load(Ordering::Relaxed) {
                                eprintln!("device {name}: connection error: {e}");
                            }
                        }
                    }
                    return;
                }
            }
        }
    });
    match tokio::time::timeout(OP_TIMEOUT, conn_rx).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => panic!("device {id}: MQTT connect failed: {e}"),
        Ok(Err(_)) => panic!("device {id}: event loop ended before CONNACK"),
        Err(_) => panic!("device {id}: no CONNACK within {OP_TIMEOUT:?}"),
    }
    let mut dev = Device { id: id.to_string(), client, rx, next_rid: 0, closing };
    for topic in ["$iothub/twin/res/#", "$iothub/twin/PATCH/properties/desired/#"] {
        dev.client.subscribe(topic, qos).await.expect("queue SUBSCRIBE");
        dev.wait(|m| matches!(m, Msg::SubAck), "SUBACK").await;
    }
    dev
}

impl Device {
    fn disconnect(&self) {
        self.closing.store(true, Ordering::Relaxed);
        let _ = self.client.try_disconnect();
    }

    /// Waits for a message matching `pred`, dropping others; panics after OP_TIMEOUT.
    async fn wait(&mut self, pred: impl Fn(&Msg) -> bool, what: &str) -> Msg {
        let deadline = tokio::time::Instant::now() + OP_TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(m)) if pred(&m) => return m,
                Ok(Some(_)) => {}
                Ok(None) => panic!("device {}: connection closed while waiting for {what}", self.id),
                Err(_) => panic!("device {}: no {what} within {OP_TIMEOUT:?}", self.id),
            }
        }
    }

    /// One reported patch, request to response; returns the response status.
    async fn patch_reported(&mut self, qos: QoS, body: &Value) -> u16 {
        self.next_rid += 1;
        let rid = self.next_rid.to_string();
        let topic = format!("$iothub/twin/PATCH/properties/reported/?$rid={rid}");
        self.client.publish(topic, qos, false, serde_json::to_vec(body).unwrap()).await.expect("queue PUBLISH");
        let m = self
            .wait(
                |m| matches!(m, Msg::Publish { topic, .. } if response_rid(topic) == Some(rid.as_str())),
                "twin response",
            )
            .await;
        let Msg::Publish { topic, .. } = m else { unreachable!() };
        response_status(&topic).unwrap_or_else(|| panic!("malformed response topic {topic}"))
    }
}

/// `$iothub/twin/res/{status}/?$rid={rid}[&…]` → rid.
fn response_rid(topic: &str) -> Option<&str> {
    let rest = topic.strip_prefix(RES_PREFIX)?;
    let (_, query) = rest.split_once("/?")?;
    query_param(query, "$rid")
}

fn response_status(topic: &str) -> Option<u16> {
    topic.strip_prefix(RES_PREFIX)?.split('/').next()?.parse().ok()
}

fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query.split('&').find_map(|kv| kv.split_once('=').filter(|(k, _)| *k == name).map(|(_, v)| v))
}

/// `$iothub/twin/PATCH/properties/desired/?$version={n}` → n.
fn desired_topic_version(topic: &str) -> Option<i64> {
    let query = topic.strip_prefix(DESIRED_PREFIX)?.strip_prefix('?')?;
    query_param(query, "$version")?.parse().ok()
}

fn hist() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).unwrap()
}

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

fn desired_version_of(twin: &Value) -> i64 {
    twin.pointer("/properties/desired/$version")
        .and_then(Value::as_i64)
        .unwrap_or_else(|| panic!("twin without properties.desired.$version: {twin}"))
}

// ---------------------------------------------------------------------------------------------------

async fn run(cfg: Config) -> bool {
    let bin = std::env::var_os("TWINHUB_BIN").map(PathBuf::from);
    let shown = bin.clone().unwrap_or_else(common::bin_path);
    println!(
        "mqtt_twin bench: binary {} | devices {} | reported phase {}s (+{}s warm-up) | desired samples {} | \
         burst {} patches from {} senders, slow device {} ms/message | QoS {}",
        shown.display(),
        cfg.devices,
        cfg.duration,
        cfg.warmup,
        cfg.samples,
        cfg.burst,
        cfg.burst_clients,
        cfg.slow_ms,
        cfg.qos as u8
    );
    let srv = Server::start(ServerOpts {
        bin,
        env: vec![("RUST_LOG".into(), std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))],
        ..Default::default()
    });
    assert!(
        srv.mqtt_plain_port != 0,
        "the server reports no plain MQTT port in {}/listen.json",
        srv.data_dir.display()
    );
    eprintln!(
        "server up: https {} | mqtt (plain) 127.0.0.1:{} | data {}",
        srv.base_url,
        srv.mqtt_plain_port,
        srv.data_dir.display()
    );
    let api = srv.owner();

    // Devices (+ one for the burst), created over HTTPS 32 at a time.
    let t0 = Instant::now();
    let mut ids: Vec<String> = (0..cfg.devices).map(|i| format!("mqtt{i}")).collect();
    ids.push("burst0".into());
    let mut keys: HashMap<String, String> = HashMap::new();
    for chunk in ids.chunks(32) {
        let mut tasks = Vec::new();
        for id in chunk {
            let (api, id) = (api.clone(), id.clone());
            tasks.push(tokio::spawn(async move {
                let d = api.must_create_device(&id).await;
                let key = d
                    .pointer("/authentication/symmetricKey/primaryKey")
                    .and_then(Value::as_str)
                    .unwrap_or_else(|| panic!("device {id} without a primary key: {d}"))
                    .to_string();
                (id, key)
            }));
        }
        for t in tasks {
            let (id, key) = t.await.expect("device creation");
            keys.insert(id, key);
        }
    }
    eprintln!("created {} devices in {:.1}s", ids.len(), t0.elapsed().as_secs_f64());

    // Connections, 32 at a time.
    let t0 = Instant::now();
    let port = srv.mqtt_plain_port;
    let mut devices: Vec<Device> = Vec::new();
    for chunk in ids[..cfg.devices].chunks(32) {
        let mut tasks = Vec::new();
        for id in chunk {
            let (id, key, qos) = (id.clone(), keys[id].clone(), cfg.qos);
            tasks.push(tokio::spawn(async move { connect_device(port, &id, &key, qos, None).await }));
        }
        for t in tasks {
            devices.push(t.await.expect("device connection"));
        }
    }
    eprintln!("connected and subscribed {} devices over MQTT in {:.1}s", devices.len(), t0.elapsed().as_secs_f64());

    // (a) reported patches, closed loop.
    let devices = phase_reported(&cfg, devices).await;
    // (b) desired-push latency.
    let devices = phase_desired(&cfg, &api, devices).await;
    // (c) burst to a slow device.
    let ok = phase_burst(&cfg, &api, port, &keys["burst0"]).await;

    for d in devices.iter() {
        d.disconnect();
    }
    drop(devices);
    drop(srv);
    ok
}

async fn phase_reported(cfg: &Config, devices: Vec<Device>) -> Vec<Device> {
    eprintln!(
        "(a) reported patches: {} devices, closed loop, {}s warm-up + {}s",
        devices.len(),
        cfg.warmup,
        cfg.duration
    );
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let recording = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for mut dev in devices {
        let (done, errors, recording, stop, qos) =
            (done.clone(), errors.clone(), recording.clone(), stop.clone(), cfg.qos);
        tasks.push(tokio::spawn(async move {
            let mut h = hist();
            let mut i: u64 = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let body = json!({"counter": i, "fw": "1.0", "sensor": {"t": (i % 50) as f64 / 2.0}});
                let start = Instant::now();
                let status = dev.patch_reported(qos, &body).await;
                let us = start.elapsed().as_micros() as u64;
                if status == 204 {
                    if recording.load(Ordering::Relaxed) {
                        h.saturating_record(us.max(1));
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                } else if errors.fetch_add(1, Ordering::Relaxed) < 5 {
                    eprintln!("device {}: reported patch answered {status}", dev.id);
                }
            }
            (dev, h)
        }));
    }
    tokio::time::sleep(Duration::from_secs(cfg.warmup)).await;
    recording.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let mut last = 0;
    for s in 1..=cfg.duration {
        tokio::time::sleep_until((started + Duration::from_secs(s)).into()).await;
        let now = done.load(Ordering::Relaxed);
        eprintln!("  {s:>3}s  {:>7} patches/s  total {now}  errors {}", now - last, errors.load(Ordering::Relaxed));
        last = now;
    }
    recording.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut h = hist();
    let mut devices = Vec::new();
    for t in tasks {
        let (dev, dh) = t.await.expect("reported-patch task");
        h.add(dh).unwrap();
        devices.push(dev);
    }
    println!();
    println!(
        "(a) reported patches over MQTT, {} devices, closed loop (PUBLISH → $iothub/twin/res/204):",
        devices.len()
    );
    println!("  patches    {} in {:.1}s, non-204 answers {}", h.len(), elapsed, errors.load(Ordering::Relaxed));
    println!("  throughput {:.0} patches/s", h.len() as f64 / elapsed);
    println!(
        "  latency    p50 {:.2} ms | p90 {:.2} ms | p99 {:.2} ms | max {:.2} ms",
        ms(&h, 0.50),
        ms(&h, 0.90),
        ms(&h, 0.99),
        h.max() as f64 / 1000.0
    );
    devices
}

async fn phase_desired(cfg: &Config, api: &Api, mut devices: Vec<Device>) -> Vec<Device> {
    eprintln!("(b) desired pushes: {} sequential PATCH /twins/{{id}} over {} devices", cfg.samples, devices.len());
    // Signed: a push may reach the device before the HTTP response reaches the client (both leave the
    // node at commit), so ack → receive can be negative; percentiles from the sorted samples.
    let mut ack_to_recv_us: Vec<i64> = Vec::with_capacity(cfg.samples);
    let mut send_to_recv = hist();
    let mut http = hist();
    let started = Instant::now();
    for i in 0..cfg.samples {
        let n = devices.len();
        let dev = &mut devices[i % n];
        let body = serde_json::to_vec(&json!({"properties": {"desired": {"seq": i, "interval": i % 60}}})).unwrap();
        let sent = Instant::now();
        let r = api
            .try_send_raw("PATCH", &format!("/twins/{}", enc(&dev.id)), Some(body), &[])
            .await
            .unwrap_or_else(|e| panic!("PATCH /twins/{}: {e}", dev.id));
        let acked = Instant::now();
        assert_eq!(r.status, 200, "PATCH /twins/{}: {} {}", dev.id, r.status, r.text);
        let version = desired_version_of(r.json());
        let m = dev
            .wait(
                |m| matches!(m, Msg::Publish { topic, .. } if desired_topic_version(topic) == Some(version)),
                "desired push",
            )
            .await;
        let Msg::Publish { at, payload, .. } = m else { unreachable!() };
        let pushed: Value = serde_json::from_slice(&payload).unwrap_or_else(|e| {
            panic!("desired push for {} is not JSON ({e}): {:?}", dev.id, String::from_utf8_lossy(&payload))
        });
        assert_eq!(pushed["seq"], json!(i), "device {} got the wrong desired push: {pushed}", dev.id);
        assert_eq!(pushed["$version"], json!(version), "push body $version differs from the topic's: {pushed}");
        http.saturating_record((acked - sent).as_micros().max(1) as u64);
        send_to_recv.saturating_record(at.saturating_duration_since(sent).as_micros().max(1) as u64);
        ack_to_recv_us.push(if at < acked {
            -((acked - at).as_micros() as i64)
        } else {
            (at - acked).as_micros() as i64
        });
        if (i + 1) % 100 == 0 {
            eprintln!("  {} / {} pushes", i + 1, cfg.samples);
        }
    }
    if cfg.samples > 0 {
        println!();
        println!(
            "(b) desired-push latency, {} sequential PATCHes over HTTPS, {:.1}s:",
            cfg.samples,
            started.elapsed().as_secs_f64()
        );
        ack_to_recv_us.sort_unstable();
        let q = |p: f64| {
            let i = ((ack_to_recv_us.len() as f64 * p).ceil() as usize).clamp(1, ack_to_recv_us.len()) - 1;
            ack_to_recv_us[i] as f64 / 1000.0
        };
        let early = ack_to_recv_us.iter().filter(|v| **v < 0).count();
        println!(
            "  ack → device receives   p50 {:.2} ms | p90 {:.2} ms | p99 {:.2} ms | max {:.2} ms  \
             (negative: the push reached the device before the HTTP response reached the client; {early} of {} pushes)",
            q(0.50),
            q(0.90),
            q(0.99),
            ack_to_recv_us.last().copied().unwrap_or(0) as f64 / 1000.0,
            ack_to_recv_us.len()
        );
        println!(
            "  send → device receives  p50 {:.2} ms | p90 {:.2} ms | p99 {:.2} ms | max {:.2} ms",
            ms(&send_to_recv, 0.50),
            ms(&send_to_recv, 0.90),
            ms(&send_to_recv, 0.99),
            send_to_recv.max() as f64 / 1000.0
        );
        println!(
            "  HTTP PATCH round trip   p50 {:.2} ms | p90 {:.2} ms | p99 {:.2} ms",
            ms(&http, 0.50),
            ms(&http, 0.90),
            ms(&http, 0.99)
        );
    }
    devices
}

async fn phase_burst(cfg: &Config, api: &Api, port: u16, key: &str) -> bool {
    if cfg.burst == 0 {
        return true;
    }
    let slow = Duration::from_millis(cfg.slow_ms);
    eprintln!(
        "(c) burst: {} desired PATCHes to burst0 from {} senders; the device sleeps {} ms per message",
        cfg.burst, cfg.burst_clients, cfg.slow_ms
    );
    let mut dev = connect_device(port, "burst0", key, cfg.qos, Some(slow)).await;
    let initial = desired_version_of(&api.must_get_twin("burst0").await);

    // Collect what the device receives in the background.
    let seen: Arc<std::sync::Mutex<Vec<(i64, Value)>>> = Arc::default();
    let collector = {
        let seen = seen.clone();
        let mut rx = std::mem::replace(&mut dev.rx, mpsc::unbounded_channel().1);
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if let Msg::Publish { topic, payload, .. } = m {
                    if let Some(v) = desired_topic_version(&topic) {
                        let body = serde_json::from_slice(&payload).unwrap_or(Value::Null);
                        seen.lock().unwrap().push((v, body));
                    }
                }
            }
        })
    };

    let next = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..cfg.burst_clients {
        let (api, next, sent, k) = (api.clone(), next.clone(), sent.clone(), cfg.burst as u64);
        tasks.push(tokio::spawn(async move {
            // version → the burst value the twin had at that version
            let mut committed: Vec<(i64, u64)> = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= k {
                    break;
                }
                let twin = api.must_patch_twin("burst0", &json!({"properties": {"desired": {"burst": i}}})).await;
                committed.push((desired_version_of(&twin), i));
                sent.fetch_add(1, Ordering::Relaxed);
            }
            committed
        }));
    }
    let progress = {
        let (sent, seen, k) = (sent.clone(), seen.clone(), cfg.burst as u64);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let s = sent.load(Ordering::Relaxed);
                eprintln!(
                    "  {:>5.1}s  committed {s} / {k}  pushes received {}",
                    started.elapsed().as_secs_f64(),
                    seen.lock().unwrap().len()
                );
            }
        })
    };
    let mut committed: Vec<(i64, u64)> = Vec::new();
    for t in tasks {
        committed.extend(t.await.expect("burst sender"));
    }
    let burst_secs = started.elapsed().as_secs_f64();
    let final_version = desired_version_of(&api.must_get_twin("burst0").await);
    let final_value = committed.iter().find(|(v, _)| *v == final_version).map(|(_, b)| *b);

    // Wait for the device to catch up with the committed state (or give up after a while), then a little
    // longer for anything trailing.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let caught_up = seen.lock().unwrap().last().map(|(v, _)| *v) == Some(final_version);
        if caught_up || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drained = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500) + slow * 10).await;
    progress.abort();
    dev.disconnect();
    drop(dev);
    collector.abort();
    let seen = seen.lock().unwrap().clone();

    let versions: Vec<i64> = seen.iter().map(|(v, _)| *v).collect();
    let increasing = versions.windows(2).all(|w| w[0] < w[1]);
    let last = versions.last().copied();
    let bodies_match = seen.iter().all(|(v, b)| b.get("$version").and_then(Value::as_i64) == Some(*v));
    let last_state_ok = match (seen.last(), final_value) {
        (Some((_, b)), Some(val)) => b.get("burst") == Some(&json!(val)),
        _ => false,
    };
    println!();
    println!(
        "(c) burst: {} desired PATCHes to one twin in {:.2}s ({:.0}/s) from {} senders, device reading 1 message per {} ms:",
        committed.len(),
        burst_secs,
        committed.len() as f64 / burst_secs,
        cfg.burst_clients,
        cfg.slow_ms
    );
    println!(
        "  desired $version {initial} → {final_version} committed; device received {} pushes ({:.1} patches per push), caught up after {:.2}s",
        seen.len(),
        committed.len() as f64 / seen.len().max(1) as f64,
        drained
    );
    let first = versions.first().copied();
    println!(
        "  versions seen: first {:?}, last {:?}; strictly increasing: {}; last = committed $version: {}; \
         last push carries the final state (burst = {:?}): {}; body $version = topic $version: {}",
        first,
        last,
        yes(increasing),
        yes(last == Some(final_version)),
        final_value,
        yes(last_state_ok),
        yes(bodies_match)
    );
    let ok = increasing && last == Some(final_version) && last_state_ok && bodies_match;
    if !ok {
        println!("  FAILED: the device's view of the burst violates the notification invariants");
        println!("  versions seen: {versions:?}");
    }
    ok
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}
