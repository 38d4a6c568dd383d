//! Direct-method round trips and configuration roll-out rate.
//!
//! Starts the `twinhub` binary (the one cargo built for this bench, i.e. the release profile, or
//! `TWINHUB_BIN`), then:
//!
//!   (a) methods: D devices connect over MQTT (plain TCP listener), subscribe to
//!       `$iothub/methods/POST/#` and answer every call at once; N calls go through
//!       `POST /twins/{id}/methods` from C concurrent HTTPS callers → round-trip latency (service →
//!       device → service) p50/p90/p99 and calls per second;
//!   (b) configurations: T twins are created through the bulk registry API with a tag, then one
//!       configuration targeting that tag is created → time until its `systemMetrics.appliedCount`
//!       reaches T (every twin carries the content), and twins per second.
//!
//!   cargo bench --bench methods_configs -- --devices 20 --calls 2000 --callers 8 --twins 100000
//!
//! Flags or environment: `--devices`/`MC_DEVICES` (20), `--calls`/`MC_CALLS` (2000), `--callers`/
//! `MC_CALLERS` (8), `--twins`/`MC_TWINS` (100000; 0 skips (b)). Progress goes to stderr, results to
//! stdout. Numbers are printed, never asserted; a call that fails is an error (exit 1).

use twinhub_testkit as common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{device_token, unix_now, Api, Server, ServerOpts};
use hdrhistogram::Histogram;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{json, Value};

fn arg(flag: &str, env: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    let from_flag = args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1).cloned());
    match from_flag.or_else(|| std::env::var(env).ok()) {
        Some(v) => v.parse().unwrap_or_else(|_| panic!("{flag}/{env}: not a number: {v}")),
        None => default,
    }
}

/// A device that answers every method call with status 200 and the call's payload.
async fn answering_device(port: u16, id: String, key: String) -> AsyncClient {
    let mut o = MqttOptions::new(id.clone(), "127.0.0.1", port);
    o.set_credentials(
        format!("localhost/{id}/?api-version=2021-04-12"),
        device_token("localhost", &id, None, &key, unix_now() + 3600),
    );
    o.set_keep_alive(Duration::from_secs(60));
    o.set_clean_session(true);
    let (client, mut el) = AsyncClient::new(o, 256);
    match el.poll().await {
        Ok(Event::Incoming(Packet::ConnAck(_))) => {}
        other => panic!("{id}: no CONNACK: {other:?}"),
    }
    client.subscribe("$iothub/methods/POST/#", QoS::AtMostOnce).await.expect("subscribe");
    let answer = client.clone();
    tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if let Some(rid) = p.topic.split("?$rid=").nth(1) {
                        let topic = format!("$iothub/methods/res/200/?$rid={rid}");
                        let _ = answer.publish(topic, QoS::AtMostOnce, false, p.payload.to_vec()).await;
                    }
                }
                Ok(_) => {}
                // Disconnected (the bench is done with this device, or the server went away).
                Err(_) => return,
            }
        }
    });
    client
}

async fn methods(srv: &Server, api: &Api, devices: usize, calls: usize, callers: usize) {
    eprintln!("(a) methods: {devices} devices, {calls} calls from {callers} callers");
    let mut clients = Vec::new();
    let mut ids = Vec::new();
    for i in 0..devices {
        let id = format!("m{i:04}");
        let doc = api.must_create_device(&id).await;
        let key =
            doc.pointer("/authentication/symmetricKey/primaryKey").and_then(Value::as_str).expect("key").to_string();
        clients.push(answering_device(srv.mqtt_plain_port, id.clone(), key).await);
        ids.push(id);
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // SUBACKs
    let ids = Arc::new(ids);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let (api, ids, next) = (api.clone(), ids.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
            loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n >= calls {
                    return h;
                }
                let id = &ids[n % ids.len()];
                let body = json!({"methodName": "ping", "payload": {"n": n}, "responseTimeoutInSeconds": 30});
                let t = Instant::now();
                let r = api.send("POST", &format!("/twins/{id}/methods"), Some(&body), &[]).await;
                if r.status != 200 || r.json()["payload"]["n"] != n {
                    eprintln!("call {n} to {id} failed: {} {}", r.status, r.text);
                    std::process::exit(1);
                }
                h.record(t.elapsed().as_micros() as u64).expect("record");
                if n > 0 && n % 500 == 0 {
                    eprintln!("  {n} calls");
                }
            }
        }));
    }
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
    for t in tasks {
        h.add(t.await.expect("caller")).expect("merge");
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "methods: {calls} calls in {secs:.1} s = {:.0} calls/s; round trip p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        calls as f64 / secs,
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.9) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.max() as f64 / 1000.0
    );
    for c in clients {
        let _ = c.disconnect().await;
    }
}

async fn configurations(api: &Api, twins: usize) {
    eprintln!("(b) configurations: loading {twins} twins through the bulk API");
    let started = Instant::now();
    let batches: Vec<Vec<Value>> = (0..twins)
        .map(|i| json!({"id": format!("c{i:07}"), "importMode": "create", "status": "enabled", "tags": {"fleet": "rollout"}}))
        .collect::<Vec<_>>()
        .chunks(100)
        .map(|c| c.to_vec())
        .collect();
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let queue = Arc::new(std::sync::Mutex::new(batches));
    let mut loaders = Vec::new();
    for _ in 0..4 {
        let (api, queue, done) = (api.clone(), queue.clone(), done.clone());
        loaders.push(tokio::spawn(async move {
            loop {
                let Some(batch) = queue.lock().unwrap_or_else(|p| p.into_inner()).pop() else { return };
                let r = api.send("POST", "/devices", Some(&Value::Array(batch.clone())), &[]).await;
                if r.status != 200 || r.json()["isSuccessful"] != true {
                    eprintln!("bulk load failed: {} {}", r.status, r.text);
                    std::process::exit(1);
                }
                let n = done.fetch_add(batch.len(), std::sync::atomic::Ordering::Relaxed) + batch.len();
                if n % 10_000 < 100 {
                    eprintln!("  {n} twins loaded");
                }
            }
        }));
    }
    for l in loaders {
        l.await.expect("loader");
    }
    eprintln!("  loaded in {:.1} s", started.elapsed().as_secs_f64());
    let body = json!({
        "id": "rollout",
        "content": {"deviceContent": {"properties.desired.firmware": {"version": "2.0", "url": "https://example.invalid/fw-2.0.bin"}}},
        "targetCondition": "tags.fleet = 'rollout'",
        "priority": 1,
    });
    let started = Instant::now();
    let r = api.send("PUT", "/configurations/rollout", Some(&body), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let mut last = 0;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let c = api.must_get("/configurations/rollout").await;
        let applied = c["systemMetrics"]["results"]["appliedCount"].as_u64().unwrap_or(0) as usize;
        if applied != last {
            eprintln!("  {applied} of {twins} twins applied after {:.1} s", started.elapsed().as_secs_f64());
            last = applied;
        }
        if applied >= twins {
            break;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!("configurations: one configuration reached {twins} twins in {secs:.1} s = {:.0} twins/s (metrics polled every second)", twins as f64 / secs);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let devices = arg("--devices", "MC_DEVICES", 20).max(1) as usize;
    let calls = arg("--calls", "MC_CALLS", 2000) as usize;
    let callers = arg("--callers", "MC_CALLERS", 8).max(1) as usize;
    let twins = arg("--twins", "MC_TWINS", 100_000) as usize;
    let srv = Server::start(ServerOpts {
        extra_args: vec!["--configuration-interval-secs".into(), "5".into()],
        ..Default::default()
    });
    let api = srv.owner();
    methods(&srv, &api, devices, calls, callers).await;
    if twins > 0 {
        configurations(&api, twins).await;
    }
}
