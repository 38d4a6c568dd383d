//! The multi-node cluster against real processes: `twinhub cluster up` starts three `twinhub serve`
//! nodes on loopback, and the tests talk to them over HTTPS and plain MQTT exactly as clients would.
//!
//! - `writes_through_every_http_front_door_land_on_the_owner`: create, patch and read a twin through
//!   three different nodes, for devices on every shard and every order of the nodes.
//! - `mqtt_device_on_one_node_sees_writes_made_through_another`: a device connected to node 2 patches
//!   reported properties (read back through node 3) and receives the desired patches made through node 3.
//! - `sigkill_of_a_shard_leader_under_load_loses_no_acknowledged_write`: concurrent writers on one shard,
//!   SIGKILL of its leader; writes resume, versions never repeat or go back, every acknowledged write is
//!   present, and the killed node restarts and catches up.
//!
//! Every cluster is stopped when its [`Cluster`] is dropped, also on panic: every pid in `cluster.json`
//! and every node restarted here is SIGKILLed. On failure the cluster directory (node logs under
//! `node-*/twinhub.log`) is kept and its path printed.

use twinhub_testkit as common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use common::cluster::*;
use common::*;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{json, Value};
use tokio::sync::mpsc;

const SHARDS: u32 = 4;
/// Generous: debug builds on a shared 2-core machine.
const MQTT_WAIT: Duration = Duration::from_secs(30);

/// One cluster at a time: three nodes each is all two cores should carry. (An async mutex: each test
/// has its own runtime, and a test that panics releases it without poisoning.)
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// ---------------------------------------------------------------------------------------------------
// HTTP front doors

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_every_http_front_door_land_on_the_owner() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = Cluster::up(3, SHARDS);
    let ids = c.ids();
    c.settle_leadership().await;

    // Every founding node replicates every shard, and all agree on each shard's leader.
    let mut leaders = BTreeMap::new();
    for shard in 0..SHARDS {
        let (l, _) = c.settled_leader(shard, &ids, Duration::ZERO).await;
        leaders.insert(shard, l);
        for id in &ids {
            let s = c.shard_status(*id, shard).await.unwrap_or_else(|| panic!("node {id}: no status of shard {shard}"));
            assert_eq!(s["voters"], json!([1, 2, 3]), "node {id}, shard {shard}: every founding node is a voter");
            assert_eq!(s["healthy"], true, "node {id}, shard {shard}: {s}");
        }
    }
    eprintln!("shard leaders: {leaders:?}");

    let mut taken = HashSet::new();
    let mut forwarded = 0;
    let mut devices = Vec::new();
    for (pi, p) in permutations(&ids).iter().enumerate() {
        let (create_on, patch_on, get_on) = (p[0], p[1], p[2]);
        for shard in 0..SHARDS {
            let dev = device_on_shard(&format!("door{pi}-"), shard, SHARDS, &mut taken);
            let doc = c.api(create_on).must_create_device(&dev).await;
            assert_eq!(doc["deviceId"], dev.as_str(), "create through node {create_on}: {doc}");

            let patch = json!({"properties": {"desired": {"perm": pi, "via": patch_on}}, "tags": {"shard": shard}});
            let t = c.api(patch_on).must_patch_twin(&dev, &patch).await;
            assert_eq!(t["properties"]["desired"]["via"], patch_on, "PATCH through node {patch_on}: {t}");

            let g = c.api(get_on).must_get_twin(&dev).await;
            let what = format!(
                "{dev} (shard {shard}, leader {}): created on {create_on}, patched on {patch_on}, read on {get_on}",
                leaders[&shard]
            );
            assert_eq!(g["deviceId"], dev.as_str(), "{what}: {g}");
            assert_eq!(g["properties"]["desired"]["perm"], pi, "{what}: {g}");
            assert_eq!(g["properties"]["desired"]["via"], patch_on, "{what}: {g}");
            assert_eq!(g["tags"]["shard"], shard, "{what}: {g}");
            assert_eq!(twin_version(&g), twin_version(&t), "{what}: version");
            assert_eq!(desired_version(&g), desired_version(&t), "{what}: desired $version");
            assert_eq!(etag_of(&g), etag_of(&t), "{what}: etag");
            let d = c.api(get_on).must_get(&format!("/devices/{}", enc(&dev))).await;
            assert_eq!(d["deviceId"], dev.as_str(), "{what}: device document {d}");
            forwarded += [create_on, patch_on].iter().filter(|n| **n != leaders[&shard]).count();
            devices.push((dev, t));
        }
    }
    assert!(forwarded > 0, "no write went through a node that does not lead its shard: nothing was forwarded");

    // Every node returns the same twin for every device: one owner, one history.
    for (dev, t) in &devices {
        for id in &ids {
            let g = c.api(*id).must_get_twin(dev).await;
            assert_eq!(
                twin_state(&g),
                twin_state(t),
                "{dev} read through node {id} differs from what the write returned"
            );
        }
    }
    // And the registry lists them all through any node.
    for id in &ids {
        let api = c.api(*id);
        for (dev, _) in devices.iter().step_by(5) {
            api.must_get(&format!("/devices/{}", enc(dev))).await;
        }
    }
    c.assert_no_panics();
}

/// A bulk call through any node: the groups of shards other nodes lead travel there in one call per
/// node, and every entry is answered from its own shard — good ones apply, a bad one fails alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_call_through_any_node_answers_every_entry_from_its_shard() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = Cluster::up(3, SHARDS);
    let ids = c.ids();
    c.settle_leadership().await;
    let taken_before = c.api(ids[0]).must_create_device("bk-taken").await;
    assert_eq!(taken_before["deviceId"], "bk-taken");
    for via in &ids {
        let api = c.api(*via);
        let mut entries: Vec<Value> = (0..40)
            .map(|i| json!({"id": format!("bk{via}-{i:02}"), "importMode": "create", "tags": {"via": via, "i": i}}))
            .collect();
        entries.insert(17, json!({"id": "bk-taken", "importMode": "create"}));
        entries.push(json!({"id": format!("bk{via}-ghost"), "importMode": "updateTwin", "tags": {"a": 1}}));
        let r = api.send("POST", "/devices", Some(&Value::Array(entries)), &[]).await;
        assert_eq!(r.status, 400, "through node {via}: {}", r.text);
        let body = r.json();
        let errors = body["errors"].as_array().cloned().unwrap_or_default();
        let failed: Vec<&str> = errors.iter().filter_map(|e| e["deviceId"].as_str()).collect();
        assert_eq!(failed, ["bk-taken", format!("bk{via}-ghost").as_str()], "through node {via}: {body}");
        assert_eq!(errors[0]["errorCode"], "DeviceAlreadyExists", "{body}");
        assert_eq!(errors[1]["errorCode"], "DeviceNotFound", "{body}");
    }
    // One call updating a twin created through each node.
    let updates: Vec<Value> = ids
        .iter()
        .map(
            |via| json!({"id": format!("bk{via}-05"), "importMode": "updateTwin", "properties": {"desired": {"x": 1}}}),
        )
        .collect();
    let r = c.api(ids[1]).send("POST", "/devices", Some(&Value::Array(updates)), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Every created twin reads back the same through every node, with its tags and the later update.
    for via in &ids {
        for i in (0..40).step_by(5) {
            let dev = format!("bk{via}-{i:02}");
            for reader in &ids {
                let t = c.api(*reader).must_get_twin(&dev).await;
                assert_eq!(t["tags"]["via"], *via, "{dev} through node {reader}: {t}");
                assert_eq!(t["tags"]["i"], i, "{dev} through node {reader}: {t}");
                let x = if i == 5 { json!(1) } else { Value::Null };
                assert_eq!(t["properties"]["desired"]["x"], x, "{dev} through node {reader}: {t}");
            }
        }
    }
    let mut forwarded = 0.0;
    for id in &ids {
        forwarded += c.metric(*id, "twinhub_route_forwarded_total").await;
    }
    assert!(forwarded > 0.0, "no bulk group went to another node");
    c.assert_no_panics();
}

/// Bulk calls through the survivors while a node leading shards is SIGKILLed: the groups forwarded to
/// it fail as one call and go the single-write route, which waits out the election. Every entry a call
/// acknowledged exists afterwards on every survivor, an entry that failed was not half-applied, and
/// calls after the failover succeed whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_calls_settle_every_entry_when_a_shard_leader_is_killed() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = Cluster::up(3, SHARDS);
    let ids = c.ids();
    c.settle_leadership().await;
    let leaders = c.leaders(&ids).await.expect("every shard has a leader");
    let victim = leaders[&0].0;
    let survivors: Vec<u64> = ids.iter().copied().filter(|i| *i != victim).collect();
    let stop = AtomicBool::new(false);
    let killed_at = OnceLock::new();
    let bulk = |w: usize, k: usize| -> (Vec<String>, Value) {
        let batch: Vec<String> = (0..40).map(|i| format!("bf{w}-{k:03}-{i:02}")).collect();
        let body = batch.iter().map(|d| json!({"id": d, "importMode": "create", "tags": {"w": w}})).collect();
        (batch, Value::Array(body))
    };
    let workers = survivors.iter().enumerate().map(|(w, via)| {
        let api = c.api_with_timeout(*via, Duration::from_secs(60));
        let (stop, bulk) = (&stop, &bulk);
        async move {
            let (mut acked, mut failed, mut calls, mut spans) = (Vec::new(), Vec::new(), 0, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let (batch, body) = bulk(w, calls);
                let started = Instant::now();
                let r = api.send("POST", "/devices", Some(&body), &[]).await;
                spans.push((started, Instant::now()));
                assert!(r.status == 200 || r.status == 400, "bulk call through node {via}: {} {}", r.status, r.text);
                let answer = r.json();
                let errors: HashMap<String, String> = answer["errors"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| (e["deviceId"].as_str().unwrap_or("").to_string(), e["errorCode"].to_string()))
                    .collect();
                for d in batch {
                    match errors.get(&d) {
                        Some(code) => failed.push((d, code.clone())),
                        None => acked.push(d),
                    }
                }
                calls += 1;
            }
            (acked, failed, calls, spans)
        }
    });
    let killer = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let _ = killed_at.set(Instant::now());
        c.kill9(victim);
        eprintln!("node {victim} (leader of shard 0) killed");
        tokio::time::sleep(Duration::from_secs(4)).await;
        stop.store(true, Ordering::Relaxed);
    };
    let (outcomes, ()) = tokio::join!(futures::future::join_all(workers), killer);
    let mut all_acked = Vec::new();
    let killed_at = *killed_at.get().expect("the kill happened");
    let mut spanning = 0;
    for (w, (acked, failed, calls, spans)) in outcomes.into_iter().enumerate() {
        // The call in flight when the node died was answered (every call is checked below), and
        // calls went on well after it.
        spanning += spans.iter().filter(|(start, end)| *start <= killed_at && killed_at <= *end).count();
        assert!(
            spans.iter().any(|(start, _)| *start > killed_at + Duration::from_secs(1)),
            "worker {w}: no call after the kill"
        );
        eprintln!(
            "worker {w}: {calls} calls, {} entries acknowledged, {} failed: {failed:?}",
            acked.len(),
            failed.len()
        );
        assert!(calls >= 2, "worker {w} made {calls} calls in ~5 s");
        for (d, code) in &failed {
            assert!(!code.contains("DeviceAlreadyExists"), "{d}: a retried entry must answer its first outcome");
            let body = json!([{"id": d, "importMode": "create", "tags": {"w": w}}]);
            let r = c.api(survivors[0]).send("POST", "/devices", Some(&body), &[]).await;
            assert!(r.status == 200 || r.text.contains("DeviceAlreadyExists"), "{d} created again: {}", r.text);
        }
        all_acked.extend(acked);
    }
    assert!(!all_acked.is_empty(), "no entry was acknowledged");
    assert!(spanning > 0, "no bulk call was in flight when the node was killed");
    for d in all_acked.iter().step_by(31) {
        for via in &survivors {
            let r = c.api(*via).send("GET", &format!("/devices/{d}"), None, &[]).await;
            assert_eq!(r.status, 200, "{d}, acknowledged, read through node {via}: {}", r.text);
        }
    }
    for (w, via) in survivors.iter().enumerate() {
        let (_, body) = bulk(w + 10, 0);
        let r = c.api(*via).send("POST", "/devices", Some(&body), &[]).await;
        assert_eq!(r.status, 200, "a whole call through node {via} after the failover: {}", r.text);
    }
    c.assert_no_panics();
}

// ---------------------------------------------------------------------------------------------------
// MQTT front door

fn device_token(device: &str, key: &str) -> String {
    common::device_token("localhost", device, None, key, unix_now() + 3600)
}

#[derive(Debug)]
enum Ev {
    Publish { topic: String, payload: Vec<u8> },
    SubAck,
    Closed(String),
}

/// A device on plain MQTT (rumqttc 3.1.1); events arrive through a channel.
struct Dev {
    id: String,
    client: AsyncClient,
    rx: mpsc::UnboundedReceiver<Ev>,
    backlog: Vec<Ev>,
    rid: u64,
}

impl Dev {
    async fn connect(addr: SocketAddr, device: &str, key: &str) -> Dev {
        Dev::connect_session(addr, device, key, true).await.0
    }

    /// Connects with CleanSession `clean`; also answers the CONNACK's session-present flag.
    async fn connect_session(addr: SocketAddr, device: &str, key: &str, clean: bool) -> (Dev, bool) {
        let mut o = MqttOptions::new(device, addr.ip().to_string(), addr.port());
        o.set_credentials(format!("localhost/{device}/?api-version=2021-04-12"), device_token(device, key));
        o.set_keep_alive(Duration::from_secs(30));
        o.set_clean_session(clean);
        o.set_max_packet_size(1 << 20, 1 << 20);
        let (client, mut el) = AsyncClient::new(o, 64);
        let present = match tokio::time::timeout(MQTT_WAIT, el.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(a)))) => a.session_present,
            other => panic!("{device}: no CONNACK from {addr}: {other:?}"),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let ev = match el.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        Ev::Publish { topic: p.topic.clone(), payload: p.payload.to_vec() }
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => Ev::SubAck,
                    Ok(_) => continue,
                    Err(e) => {
                        let _ = tx.send(Ev::Closed(e.to_string()));
                        return; // polling again would reconnect
                    }
                };
                if tx.send(ev).is_err() {
                    return;
                }
            }
        });
        (Dev { id: device.to_string(), client, rx, backlog: Vec::new(), rid: 0 }, present)
    }

    async fn wait_for(&mut self, mut pred: impl FnMut(&Ev) -> bool) -> Option<Ev> {
        if let Some(i) = self.backlog.iter().position(&mut pred) {
            return Some(self.backlog.remove(i));
        }
        let deadline = tokio::time::Instant::now() + MQTT_WAIT;
        loop {
            let ev = tokio::time::timeout_at(deadline, self.rx.recv()).await.ok().flatten()?;
            if pred(&ev) {
                return Some(ev);
            }
            if let Ev::Closed(why) = &ev {
                panic!("{}: connection closed: {why}", self.id);
            }
            self.backlog.push(ev);
        }
    }

    async fn subscribe(&mut self, filter: &str) {
        self.client.subscribe(filter, QoS::AtLeastOnce).await.expect("queue SUBSCRIBE");
        self.wait_for(|e| matches!(e, Ev::SubAck))
            .await
            .unwrap_or_else(|| panic!("{}: no SUBACK for {filter}", self.id));
    }

    /// Publishes a twin request; returns the response's status, topic and payload.
    async fn request(&mut self, prefix: &str, payload: String) -> (u16, String, Vec<u8>) {
        self.rid += 1;
        let rid = format!("{}", self.rid);
        self.client
            .publish(format!("{prefix}?$rid={rid}"), QoS::AtLeastOnce, false, payload)
            .await
            .expect("queue PUBLISH");
        let want = format!("?$rid={rid}");
        let ev = self
            .wait_for(|e| match e {
                Ev::Publish { topic, .. } => {
                    topic.starts_with("$iothub/twin/res/")
                        && topic
                            .split_once("/?")
                            .is_some_and(|(_, q)| format!("?{q}").split('&').next() == Some(want.as_str()))
                }
                _ => false,
            })
            .await;
        match ev {
            Some(Ev::Publish { topic, payload }) => {
                let status = topic["$iothub/twin/res/".len()..].split('/').next().and_then(|s| s.parse().ok());
                (status.unwrap_or_else(|| panic!("no status in {topic}")), topic, payload)
            }
            other => panic!("{}: no response to {prefix} $rid={rid}: {other:?}", self.id),
        }
    }

    /// The next desired push: its `$version` (from the topic) and body.
    async fn desired_push(&mut self) -> Option<(i64, Value)> {
        let ev = self
            .wait_for(|e| matches!(e, Ev::Publish { topic, .. } if topic.starts_with("$iothub/twin/PATCH/properties/desired/")))
            .await?;
        let Ev::Publish { topic, payload } = ev else { return None };
        let v = topic
            .split("?$version=")
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("push without $version: {topic}"));
        Some((v, serde_json::from_slice(&payload).expect("push body is JSON")))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_device_on_one_node_sees_writes_made_through_another() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = Cluster::up(3, SHARDS);
    c.settle_leadership().await;
    let (dev_node, svc_node) = (2, 3);
    let mut taken = HashSet::new();
    let mut leaders = BTreeMap::new();
    for shard in 0..SHARDS {
        leaders.insert(shard, c.settled_leader(shard, &c.ids(), Duration::ZERO).await.0);
    }
    // One device per shard: some shards are led by node 2 (local), others elsewhere (forwarded).
    let mut devs = Vec::new();
    for shard in 0..SHARDS {
        let id = device_on_shard("mq-", shard, SHARDS, &mut taken);
        let doc = c.api(1).must_create_device(&id).await;
        let key = doc
            .pointer("/authentication/symmetricKey/primaryKey")
            .and_then(Value::as_str)
            .expect("primary key")
            .to_string();
        let mut d = Dev::connect(c.node(dev_node).mqtt_plain, &id, &key).await;
        d.subscribe("$iothub/twin/res/#").await;
        d.subscribe("$iothub/twin/PATCH/properties/desired/#").await;
        devs.push((shard, d));
    }
    for (shard, d) in devs.iter_mut() {
        let what = format!("{} (shard {shard}, leader {}) on node {dev_node}", d.id, leaders[shard]);
        let (st, topic, body) = d.request("$iothub/twin/GET/", " ".into()).await;
        assert_eq!(st, 200, "{what}: GET twin: {topic} {}", String::from_utf8_lossy(&body));
        let got: Value = serde_json::from_slice(&body).expect("twin JSON");
        let r0 = got["reported"]["$version"].as_i64().unwrap_or_else(|| panic!("{what}: no reported $version: {got}"));

        // Reported through node 2 → visible through node 3.
        let (st, topic, _) = d
            .request(
                "$iothub/twin/PATCH/properties/reported/",
                json!({"temp": 20 + *shard, "shard": *shard}).to_string(),
            )
            .await;
        assert_eq!(st, 204, "{what}: PATCH reported: {topic}");
        let rv: i64 = topic
            .split("&$version=")
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{what}: 204 without $version: {topic}"));
        assert_eq!(rv, r0 + 1, "{what}: reported $version");
        let t = c.api(svc_node).must_get_twin(&d.id).await;
        assert_eq!(
            t["properties"]["reported"]["temp"],
            20 + *shard,
            "{what}: node {svc_node} sees the reported patch: {t}"
        );
        assert_eq!(reported_version(&t), rv, "{what}: node {svc_node} sees reported $version {rv}: {t}");

        // Desired through node 3 → pushed to the device on node 2.
        let t = c
            .api(svc_node)
            .must_patch_twin(&d.id, &json!({"properties": {"desired": {"setpoint": 100 + *shard}}}))
            .await;
        let dv = desired_version(&t);
        let (pv, push) = d.desired_push().await.unwrap_or_else(|| {
            panic!("{what}: no desired push after a PATCH through node {svc_node}\n{}", c.logs_tail())
        });
        assert_eq!(pv, dv, "{what}: pushed $version");
        assert_eq!(push, json!({"setpoint": 100 + *shard, "$version": dv}), "{what}: pushed patch");

        // And the device's own GET (through node 2) shows both.
        let (st, _, body) = d.request("$iothub/twin/GET/", " ".into()).await;
        assert_eq!(st, 200);
        let got: Value = serde_json::from_slice(&body).expect("twin JSON");
        assert_eq!(got["desired"]["setpoint"], 100 + *shard, "{what}: {got}");
        assert_eq!(got["desired"]["$version"], dv, "{what}: {got}");
        assert_eq!(got["reported"]["$version"], rv, "{what}: {got}");
    }
    for (_, d) in &devs {
        let _ = d.client.disconnect().await;
    }
    c.assert_no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_method_called_through_any_node_reaches_the_node_holding_the_device() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = Cluster::up(3, SHARDS);
    c.settle_leadership().await;
    let dev_node = 2;
    let id = "method-dev";
    let doc = c.api(1).must_create_device(id).await;
    let key = doc
        .pointer("/authentication/symmetricKey/primaryKey")
        .and_then(Value::as_str)
        .expect("primary key")
        .to_string();
    let mut d = Dev::connect(c.node(dev_node).mqtt_plain, id, &key).await;
    d.subscribe("$iothub/methods/POST/#").await;
    for via in [1, 3, 2] {
        let api = c.api(via);
        let call = tokio::spawn(async move {
            let body = json!({"methodName": "blink", "payload": {"via": via}, "responseTimeoutInSeconds": 10});
            api.send("POST", &format!("/twins/{id}/methods"), Some(&body), &[]).await
        });
        let ev = d
            .wait_for(
                |e| matches!(e, Ev::Publish { topic, .. } if topic.starts_with("$iothub/methods/POST/blink/?$rid=")),
            )
            .await
            .unwrap_or_else(|| {
                panic!("no method call on node {dev_node} for a call through node {via}\n{}", c.logs_tail())
            });
        let Ev::Publish { topic, payload } = ev else { unreachable!() };
        assert_eq!(serde_json::from_slice::<Value>(&payload).unwrap(), json!({"via": via}));
        let rid = topic.split("?$rid=").nth(1).expect("rid");
        d.client
            .publish(
                format!("$iothub/methods/res/201/?$rid={rid}"),
                QoS::AtLeastOnce,
                false,
                json!({"blinked": via}).to_string(),
            )
            .await
            .expect("queue the answer");
        let r = call.await.unwrap();
        assert_eq!(r.status, 200, "call through node {via}: {}", r.text);
        assert_eq!(r.json(), &json!({"status": 201, "payload": {"blinked": via}}), "call through node {via}");
    }
    // A device connected nowhere is not online, whichever node is asked.
    c.api(1).must_create_device("method-offline").await;
    let r = c.api(3).send("POST", "/twins/method-offline/methods", Some(&json!({"methodName": "blink"})), &[]).await;
    assert_error(&r, 404, "DeviceNotOnline");
    let _ = d.client.disconnect().await;
    c.assert_no_panics();
}

/// A persistent session (CleanSession 0) is kept through Raft: after its node is SIGKILLed, the device
/// reconnects to another node, does not subscribe again, and still gets desired pushes and methods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_session_survives_the_kill_of_its_node() {
    let _one = ONE_AT_A_TIME.lock().await;
    let c = Cluster::up(3, SHARDS);
    c.settle_leadership().await;
    let id = "session-dev";
    let doc = c.api(1).must_create_device(id).await;
    let key = doc
        .pointer("/authentication/symmetricKey/primaryKey")
        .and_then(Value::as_str)
        .expect("primary key")
        .to_string();
    let (mut d, present) = Dev::connect_session(c.node(2).mqtt_plain, id, &key, false).await;
    assert!(!present, "a first connection has no session");
    d.subscribe("$iothub/twin/PATCH/properties/desired/#").await;
    d.subscribe("$iothub/methods/POST/#").await;
    c.kill9(2);
    drop(d);

    let (mut d, present) = Dev::connect_session(c.node(3).mqtt_plain, id, &key, false).await;
    assert!(present, "node 3 resumes the session node 2 held");
    // The first write after the kill may wait for a new leader: retry until it is acknowledged.
    let patch = json!({"properties": {"desired": {"after_kill": 1}}});
    let deadline = Instant::now() + Duration::from_secs(60);
    let dv = loop {
        let r = c.api(1).send("PATCH", &format!("/twins/{id}"), Some(&patch), &[]).await;
        if r.status == 200 {
            break desired_version(r.json());
        }
        assert!(Instant::now() < deadline, "no write acknowledged after the kill: {} {}", r.status, r.text);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (pv, push) = d
        .desired_push()
        .await
        .unwrap_or_else(|| panic!("no desired push on node 3 without resubscribing\n{}", c.logs_tail()));
    assert_eq!((pv, push), (dv, json!({"after_kill": 1, "$version": dv})));

    let api = c.api(1);
    let call = tokio::spawn(async move {
        api.send(
            "POST",
            &format!("/twins/{id}/methods"),
            Some(&json!({"methodName": "still-there", "responseTimeoutInSeconds": 10})),
            &[],
        )
        .await
    });
    let ev = d
        .wait_for(|e| matches!(e, Ev::Publish { topic, .. } if topic.starts_with("$iothub/methods/POST/still-there/")))
        .await
        .expect("a method call without resubscribing");
    let Ev::Publish { topic, .. } = ev else { unreachable!() };
    let rid = topic.split("?$rid=").nth(1).expect("rid");
    d.client
        .publish(format!("$iothub/methods/res/200/?$rid={rid}"), QoS::AtLeastOnce, false, "{}")
        .await
        .expect("answer");
    assert_eq!(call.await.unwrap().status, 200);

    // A clean session discards the stored one: the next persistent connection starts empty.
    let _ = d.client.disconnect().await;
    let (clean, _) = Dev::connect_session(c.node(1).mqtt_plain, id, &key, true).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let twin_doc = c.api(1).send("GET", &format!("/devices/{id}"), None, &[]).await;
        assert_eq!(twin_doc.status, 200);
        let _ = clean.client.disconnect().await;
        let (_fresh, present) = Dev::connect_session(c.node(3).mqtt_plain, id, &key, false).await;
        if !present {
            break;
        }
        assert!(Instant::now() < deadline, "the stored session was not discarded by a clean connection");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

// ---------------------------------------------------------------------------------------------------
// Failover

const WRITERS: usize = 6;
const TWINS: usize = 2;

#[derive(Clone, Debug)]
struct Ack {
    writer: usize,
    twin: String,
    seq: u64,
    node: u64,
    sent: Instant,
    acked: Instant,
    version: i64,
    desired_version: i64,
}

struct WriterOutcome {
    writer: usize,
    acks: Vec<Ack>,
    /// Highest seq sent (its outcome may be unknown).
    attempted: u64,
    /// 5xx answers and transport errors (retried with the next seq).
    retryable: usize,
    /// Anything else: a failure of the test.
    unexpected: Vec<String>,
}

/// What the writers share: who not to write through, when the kill happened, and progress counters.
struct Shared {
    victim: AtomicU64,
    stop: AtomicBool,
    killed_at: OnceLock<Instant>,
    acks: Vec<AtomicU64>,
    acks_after_kill: Vec<AtomicU64>,
}

/// Writer `w`'s twin.
fn twin_of(twins: &[String], w: usize) -> String {
    twins[w % twins.len()].clone()
}

/// Writer `w` sets `desired.w{w}` to 1, 2, 3… on its twin, alternating between the nodes that are not
/// the victim. A write with an unknown outcome (timeout, 5xx, connection error) is not retried: the next
/// one carries a higher value.
async fn writer(apis: Arc<BTreeMap<u64, Api>>, dev: String, w: usize, shared: Arc<Shared>) -> WriterOutcome {
    let mut out = WriterOutcome { writer: w, acks: Vec::new(), attempted: 0, retryable: 0, unexpected: Vec::new() };
    let key = format!("w{w}");
    let mut seq = 0;
    while !shared.stop.load(Ordering::Relaxed) {
        seq += 1;
        out.attempted = seq;
        let victim = shared.victim.load(Ordering::Relaxed);
        let others: Vec<u64> = apis.keys().copied().filter(|id| *id != victim).collect();
        let node = others[(w + seq as usize) % others.len()];
        let body = serde_json::to_vec(&json!({"properties": {"desired": {key.clone(): seq}}})).unwrap();
        let sent = Instant::now();
        match apis[&node].try_send_raw("PATCH", &format!("/twins/{dev}"), Some(body), &[]).await {
            Ok(r) if r.status == 200 => {
                let acked = Instant::now();
                let t = match &r.json {
                    Some(t) => t.clone(),
                    None => {
                        out.unexpected.push(format!("seq {seq} via node {node}: 200 without JSON: {}", r.text));
                        continue;
                    }
                };
                if t["properties"]["desired"][&key] != seq {
                    out.unexpected
                        .push(format!("seq {seq} via node {node}: the answer does not hold {key}={seq}: {t}"));
                }
                out.acks.push(Ack {
                    writer: w,
                    twin: dev.clone(),
                    seq,
                    node,
                    sent,
                    acked,
                    version: twin_version(&t),
                    desired_version: desired_version(&t),
                });
                shared.acks[w].fetch_add(1, Ordering::Relaxed);
                if shared.killed_at.get().is_some_and(|k| sent > *k) {
                    shared.acks_after_kill[w].fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(r) if r.status >= 500 => {
                out.retryable += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(r) => out.unexpected.push(format!("seq {seq} via node {node}: {} {}", r.status, r.text)),
            Err(_) => {
                out.retryable += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    out
}

/// An ack, with times relative to the kill.
fn show(a: &Ack, kill: Instant) -> String {
    let rel = |t: Instant| {
        if t >= kill {
            format!("+{:.3}s", (t - kill).as_secs_f64())
        } else {
            format!("-{:.3}s", (kill - t).as_secs_f64())
        }
    };
    format!(
        "writer {} seq {} via node {}: sent {} acked {} (relative to the kill) → version {}, desired $version {}",
        a.writer,
        a.seq,
        a.node,
        rel(a.sent),
        rel(a.acked),
        a.version,
        a.desired_version
    )
}

/// Versions of acknowledged writes never repeat and never go back: all distinct per twin, increasing
/// per writer, and in real time (a write sent after another was acknowledged gets a higher `version`
/// and desired `$version`). Returns every violation, each with both writes.
fn version_violations(acks: &[Ack], kill: Instant) -> Vec<String> {
    let mut out = Vec::new();
    let mut by_twin: HashMap<&str, Vec<&Ack>> = HashMap::new();
    for a in acks {
        by_twin.entry(&a.twin).or_default().push(a);
    }
    for (twin, mut list) in by_twin {
        let mut versions: HashMap<i64, &Ack> = HashMap::new();
        let mut dversions: HashMap<i64, &Ack> = HashMap::new();
        for a in &list {
            if let Some(b) = versions.insert(a.version, a) {
                out.push(format!(
                    "{twin}: twin version {} acknowledged twice:\n    {}\n    {}",
                    a.version,
                    show(b, kill),
                    show(a, kill)
                ));
            }
            if let Some(b) = dversions.insert(a.desired_version, a) {
                out.push(format!(
                    "{twin}: desired $version {} acknowledged twice:\n    {}\n    {}",
                    a.desired_version,
                    show(b, kill),
                    show(a, kill)
                ));
            }
        }
        let mut by_writer: BTreeMap<usize, Vec<&Ack>> = BTreeMap::new();
        for a in &list {
            by_writer.entry(a.writer).or_default().push(a);
        }
        for (w, mine) in by_writer {
            for pair in mine.windows(2) {
                if pair[1].version <= pair[0].version || pair[1].desired_version <= pair[0].desired_version {
                    out.push(format!(
                        "{twin}: writer {w}'s versions did not increase:\n    {}\n    {}",
                        show(pair[0], kill),
                        show(pair[1], kill)
                    ));
                }
            }
        }
        // Real time: sorted by acknowledgement, a prefix maximum answers "the highest version
        // acknowledged before this write was sent".
        list.sort_by_key(|a| a.acked);
        let mut max_v: Option<&Ack> = None;
        let mut max_dv: Option<&Ack> = None;
        let prefix_max: Vec<(&Ack, &Ack)> = list
            .iter()
            .map(|a| {
                if max_v.is_none_or(|b| a.version > b.version) {
                    max_v = Some(*a);
                }
                if max_dv.is_none_or(|b| a.desired_version > b.desired_version) {
                    max_dv = Some(*a);
                }
                (max_v.expect("set above"), max_dv.expect("set above"))
            })
            .collect();
        for b in &list {
            let before = list.partition_point(|a| a.acked < b.sent);
            if before == 0 {
                continue;
            }
            let (v, dv) = prefix_max[before - 1];
            if b.version <= v.version {
                out.push(format!(
                    "{twin}: twin version went back (a write sent after another was acknowledged):\n    {}\n    {}",
                    show(v, kill),
                    show(b, kill)
                ));
            }
            if b.desired_version <= dv.desired_version {
                out.push(format!(
                    "{twin}: desired $version went back (a write sent after another was acknowledged):\n    {}\n    {}",
                    show(dv, kill),
                    show(b, kill)
                ));
            }
        }
    }
    out
}

/// Each writer's key holds at least its last acknowledged value (and nothing never sent); versions are
/// at least the highest acknowledged.
fn check_final(twins: &BTreeMap<String, Value>, outcomes: &[WriterOutcome], when: &str) {
    for o in outcomes {
        let Some(dev) = o.acks.first().map(|a| a.twin.clone()) else { continue };
        let t = &twins[&dev];
        let Some(last) = o.acks.last() else { continue };
        let got = t["properties"]["desired"][format!("w{}", o.writer)].as_u64().unwrap_or_else(|| {
            panic!("{when}: writer {}'s acknowledged value {} is lost entirely on {dev}: {t}", o.writer, last.seq)
        });
        assert!(
            got >= last.seq,
            "{when}: writer {} on {dev}: acknowledged {} but the twin holds {got} (lost write)",
            o.writer,
            last.seq
        );
        assert!(
            got <= o.attempted,
            "{when}: writer {} on {dev}: the twin holds {got}, never sent (max {})",
            o.writer,
            o.attempted
        );
    }
    for (dev, t) in twins {
        let acks = outcomes.iter().flat_map(|o| o.acks.iter()).filter(|a| &a.twin == dev);
        if let Some(max_dv) = acks.clone().map(|a| a.desired_version).max() {
            assert!(
                desired_version(t) >= max_dv,
                "{when}: {dev}: desired $version {} below acknowledged {max_dv}",
                desired_version(t)
            );
        }
        if let Some(max_v) = acks.map(|a| a.version).max() {
            assert!(twin_version(t) >= max_v, "{when}: {dev}: version {} below acknowledged {max_v}", twin_version(t));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_a_shard_leader_under_load_loses_no_acknowledged_write() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut c = Cluster::up(3, SHARDS);
    let ids = c.ids();

    // The twins, all on one shard; its leader once leadership has settled (the balancer moves leaders
    // early on).
    let shard = 1;
    let mut taken = HashSet::new();
    let twins: Vec<String> = (0..TWINS).map(|_| device_on_shard("fo-", shard, SHARDS, &mut taken)).collect();
    for t in &twins {
        c.api(1).must_create_device(t).await;
    }
    let (leader, term_before) = c.settled_leader(shard, &ids, Duration::from_secs(3)).await;
    eprintln!("shard {shard}: leader node {leader}, term {term_before}");

    let apis: Arc<BTreeMap<u64, Api>> =
        Arc::new(ids.iter().map(|id| (*id, c.api_with_timeout(*id, Duration::from_secs(15)))).collect());
    let shared = Arc::new(Shared {
        victim: AtomicU64::new(leader),
        stop: AtomicBool::new(false),
        killed_at: OnceLock::new(),
        acks: (0..WRITERS).map(|_| AtomicU64::new(0)).collect(),
        acks_after_kill: (0..WRITERS).map(|_| AtomicU64::new(0)).collect(),
    });
    let tasks: Vec<_> =
        (0..WRITERS).map(|w| tokio::spawn(writer(apis.clone(), twin_of(&twins, w), w, shared.clone()))).collect();

    // Let every writer get a few writes acknowledged.
    let deadline = Instant::now() + WAIT;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    while shared.acks.iter().any(|a| a.load(Ordering::Relaxed) < 3) {
        assert!(Instant::now() < deadline, "writers made no progress before the kill\n{}", c.logs_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The leader may have moved meanwhile: kill whoever leads now, and steer writers away from it first.
    let (victim, _) = c.settled_leader(shard, &ids, Duration::ZERO).await;
    if victim != leader {
        eprintln!("shard {shard}: leadership moved from {leader} to {victim} before the kill");
        shared.victim.store(victim, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let acks_before: u64 = shared.acks.iter().map(|a| a.load(Ordering::Relaxed)).sum();
    let killed_at = Instant::now();
    shared.killed_at.set(killed_at).expect("killed once");
    c.kill9(victim);
    eprintln!("SIGKILLed node {victim} (leader of shard {shard}) after {acks_before} acknowledged writes");

    // Writes resume: every writer gets writes sent after the kill acknowledged, then keeps going a while.
    let deadline = Instant::now() + WAIT;
    while shared.acks_after_kill.iter().any(|a| a.load(Ordering::Relaxed) == 0) {
        assert!(
            Instant::now() < deadline,
            "writes to shard {shard} did not resume within {WAIT:?} of killing node {victim}: acks after kill {:?}\n{}",
            shared.acks_after_kill.iter().map(|a| a.load(Ordering::Relaxed)).collect::<Vec<_>>(),
            c.logs_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let resumed_after = killed_at.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    shared.stop.store(true, Ordering::Relaxed);
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.expect("writer task panicked"));
    }
    outcomes.sort_by_key(|o| o.writer);
    let acks: Vec<Ack> = outcomes.iter().flat_map(|o| o.acks.iter().cloned()).collect();
    let after: usize = acks.iter().filter(|a| a.sent > killed_at).count();
    eprintln!(
        "{} acknowledged writes ({} sent after the kill), {} retryable failures; every writer acknowledged again within {:.2?}",
        acks.len(),
        after,
        outcomes.iter().map(|o| o.retryable).sum::<usize>(),
        resumed_after
    );
    for o in &outcomes {
        assert!(o.unexpected.is_empty(), "writer {}: unexpected answers: {:#?}", o.writer, o.unexpected);
    }

    // A new leader, elected among the survivors in a later term.
    let survivors: Vec<u64> = ids.iter().copied().filter(|id| *id != victim).collect();
    let (new_leader, term_after) = c.settled_leader(shard, &survivors, Duration::ZERO).await;
    assert_ne!(new_leader, victim, "shard {shard}: the killed node cannot lead");
    assert!(term_after > term_before, "shard {shard}: a new leader needs a new term ({term_before} → {term_after})");
    eprintln!("shard {shard}: new leader {new_leader}, term {term_after}");

    // Checked here, reported at the end: the final state and the restart are worth checking either way.
    let violations = version_violations(&acks, killed_at);
    for v in &violations {
        eprintln!("VIOLATION {v}");
    }

    // The final twins, read through each survivor: identical, and holding every acknowledged write.
    let twins_ids = twins;
    let mut finals: BTreeMap<String, Value> = BTreeMap::new();
    for id in &survivors {
        let mut twins = BTreeMap::new();
        for t in &twins_ids {
            twins.insert(t.clone(), c.api(*id).must_get_twin(t).await);
        }
        check_final(&twins, &outcomes, &format!("read through node {id} after the failover"));
        if finals.is_empty() {
            finals = twins;
        } else {
            for (dev, t) in &twins {
                assert_eq!(twin_state(t), twin_state(&finals[dev]), "{dev}: nodes {survivors:?} disagree");
            }
        }
    }

    // The killed node restarts from its config and catches up.
    c.restart(victim);
    c.wait_ready(victim).await;
    let (leader_now, _) = c.settled_leader(shard, &ids, Duration::ZERO).await;
    let commit = c
        .shard_status(leader_now, shard)
        .await
        .and_then(|s| s["committed"].as_u64())
        .unwrap_or_else(|| panic!("shard {shard}: no commit index from its leader {leader_now}"));
    let deadline = Instant::now() + WAIT;
    loop {
        let s = c.shard_status(victim, shard).await;
        let applied = s.as_ref().and_then(|s| s["applied"].as_u64()).unwrap_or(0);
        if applied >= commit {
            eprintln!("node {victim} caught up on shard {shard}: applied {applied} ≥ leader's commit {commit}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node {victim} did not catch up on shard {shard}: applied {applied} < commit {commit}; status {s:?}\n{}",
            c.logs_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The balancer hands the restarted node its leaderships back; reads start once that is done.
    c.settle_leadership().await;
    let api = c.api(victim);
    for (dev, t) in &finals {
        let got = api.must_get_twin(dev).await;
        assert_eq!(twin_state(&got), twin_state(t), "{dev} read through the restarted node {victim}");
    }
    // And it serves writes again: the next version continues after everything acknowledged.
    let dev = twin_of(&twins_ids, 0);
    let t = api.must_patch_twin(&dev, &json!({"properties": {"desired": {"after": "restart"}}})).await;
    assert_eq!(twin_version(&t), twin_version(&finals[&dev]) + 1, "{dev}: version after restart");
    assert_eq!(desired_version(&t), desired_version(&finals[&dev]) + 1, "{dev}: desired $version after restart");
    c.assert_no_panics();
    assert!(
        violations.is_empty(),
        "{} version violation(s) among {} acknowledged writes:\n{}",
        violations.len(),
        acks.len(),
        violations.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------------
// Five nodes: three replicas per shard, every front door serves every shard

/// Nodes whose `/cluster/status` lists a replica of `shard`.
async fn hosts_of(c: &Cluster, shard: u32) -> Vec<u64> {
    let mut out = Vec::new();
    for id in c.ids() {
        let st = c.status(id).await.unwrap_or_else(|| panic!("node {id}: no status"));
        if st["shards"].as_array().is_some_and(|a| a.iter().any(|s| s["shard"] == shard)) {
            out.push(id);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_keep_three_replicas_per_shard_and_any_node_serves_any_twin() {
    let _one = ONE_AT_A_TIME.lock().await;
    const S: u32 = 5;
    let c = Cluster::up(5, S);
    let ids = c.ids();
    c.wait_converged(WAIT).await;
    c.settle_leadership().await;

    // Exactly three replicas per shard, on the nodes the map names, and the load spread evenly.
    let mut load: BTreeMap<u64, usize> = ids.iter().map(|id| (*id, 0)).collect();
    let mut outside: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for shard in 0..S {
        let target = c.target_replicas(shard).await;
        assert_eq!(target.len(), 3, "shard {shard}: the map places 3 replicas: {target:?}");
        let hosts = hosts_of(&c, shard).await;
        assert_eq!(hosts, target, "shard {shard}: hosted exactly on its target replicas");
        let (leader, _) = c.settled_leader(shard, &ids, Duration::ZERO).await;
        let st = c.shard_status(leader, shard).await.expect("leader status");
        assert_eq!(st["voters"], json!(target), "shard {shard}: voters");
        for h in &hosts {
            *load.get_mut(h).expect("node") += 1;
        }
        outside.insert(shard, ids.iter().copied().filter(|id| !hosts.contains(id)).collect());
    }
    assert!(load.values().all(|l| *l == 3), "5 shards × 3 replicas over 5 nodes: 3 each, got {load:?}");

    // HTTP: create through one node, patch through another, read through every node — including the
    // two that hold no replica of the twin's shard.
    let mut taken = HashSet::new();
    for shard in 0..S {
        let dev = device_on_shard("five-", shard, S, &mut taken);
        let far = &outside[&shard];
        c.api(far[0]).must_create_device(&dev).await;
        let t = c
            .api(far[1])
            .must_patch_twin(&dev, &json!({"tags": {"shard": shard}, "properties": {"desired": {"x": shard}}}))
            .await;
        for id in &ids {
            let g = c.api(*id).must_get_twin(&dev).await;
            assert_eq!(twin_state(&g), twin_state(&t), "{dev} (shard {shard}) read through node {id}");
        }
    }

    // MQTT: a device connected to a node that holds no replica of its shard reports through it and
    // receives the desired patches made through the other such node (events tailed from a replica).
    let mut taken = HashSet::new();
    for shard in 0..S {
        let far = outside[&shard].clone();
        let dev = device_on_shard("five-mq-", shard, S, &mut taken);
        let doc = c.api(far[1]).must_create_device(&dev).await;
        let key =
            doc.pointer("/authentication/symmetricKey/primaryKey").and_then(Value::as_str).expect("key").to_string();
        let mut d = Dev::connect(c.node(far[0]).mqtt_plain, &dev, &key).await;
        d.subscribe("$iothub/twin/res/#").await;
        d.subscribe("$iothub/twin/PATCH/properties/desired/#").await;
        let (st, topic, _) =
            d.request("$iothub/twin/PATCH/properties/reported/", json!({"shard": shard}).to_string()).await;
        assert_eq!(st, 204, "{dev}: reported patch through node {}: {topic}", far[0]);
        let t = c.api(far[1]).must_get_twin(&dev).await;
        assert_eq!(t["properties"]["reported"]["shard"], shard, "{dev}: {t}");
        let t = c.api(far[1]).must_patch_twin(&dev, &json!({"properties": {"desired": {"sp": shard}}})).await;
        let dv = desired_version(&t);
        let (pv, push) = d.desired_push().await.unwrap_or_else(|| {
            panic!("{dev}: no push on node {} (no replica of shard {shard})\n{}", far[0], c.logs_tail())
        });
        assert_eq!(pv, dv, "{dev}: pushed $version");
        assert_eq!(push, json!({"sp": shard, "$version": dv}), "{dev}: pushed patch");
        let _ = d.client.disconnect().await;
    }
    c.assert_no_panics();
}

// ---------------------------------------------------------------------------------------------------
// Membership under load

/// Consecutive acknowledged writes of one writer on a twin nobody else writes: the desired `$version`
/// advances by at most the number of writes sent in between (exactly 1 when none was lost in
/// flight), so a write applied twice shows up as a gap no send accounts for.
fn duplicate_applies(outcomes: &[WriterOutcome]) -> Vec<String> {
    let mut out = Vec::new();
    for o in outcomes {
        for pair in o.acks.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let sends = (b.seq - a.seq) as i64;
            let advance = b.desired_version - a.desired_version;
            if advance > sends {
                out.push(format!(
                    "writer {}: seq {} → {} ({sends} send(s)) advanced desired $version {} → {} (applied twice?)",
                    o.writer, a.seq, b.seq, a.desired_version, b.desired_version
                ));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_and_another_leaves_while_writes_run() {
    let _one = ONE_AT_A_TIME.lock().await;
    const W: usize = 4;
    let mut c = Cluster::up(3, SHARDS);
    c.settle_leadership().await;

    // One twin per writer (so duplicate applies are visible), spread over every shard.
    let mut taken = HashSet::new();
    let twins: Vec<String> = (0..W).map(|w| device_on_shard("mv-", w as u32 % SHARDS, SHARDS, &mut taken)).collect();
    for t in &twins {
        c.api(1).must_create_device(t).await;
    }
    // Writers go through nodes 2 and 3, which stay throughout (node 1 leaves, node 4 joins).
    let apis: Arc<BTreeMap<u64, Api>> =
        Arc::new([2u64, 3].iter().map(|id| (*id, c.api_with_timeout(*id, Duration::from_secs(15)))).collect());
    let shared = Arc::new(Shared {
        victim: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        killed_at: OnceLock::new(),
        acks: (0..W).map(|_| AtomicU64::new(0)).collect(),
        acks_after_kill: (0..W).map(|_| AtomicU64::new(0)).collect(),
    });
    let tasks: Vec<_> =
        (0..W).map(|w| tokio::spawn(writer(apis.clone(), twins[w].clone(), w, shared.clone()))).collect();
    let deadline = Instant::now() + WAIT;
    while shared.acks.iter().any(|a| a.load(Ordering::Relaxed) < 3) {
        assert!(Instant::now() < deadline, "writers made no progress\n{}", c.logs_tail());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let started = Instant::now();

    // Join: `cluster add` returns once every shard's replicas match the map.
    let new = tokio::task::block_in_place(|| c.add_node());
    assert_eq!(new, 4, "the next never-used id");
    assert!(c.converged().await, "cluster add returned before the moves completed");
    let on_new = c.status(new).await.expect("new node status")["shards"].as_array().map_or(0, Vec::len);
    assert!(on_new >= 2, "the new node took replicas: {on_new}");
    // `cluster add` starts the node without a shard count: it asked the cluster for its count (not
    // the release's default, 8) and its data directory recorded it for every later start.
    let config = std::fs::read_to_string(&c.node(new).config).expect("the new node's config");
    assert!(!config.contains("\nshard_count"), "a joining node's config names no shard count:\n{config}");
    let file = c.cluster_file();
    let entry = file["nodes"].as_array().and_then(|n| n.iter().find(|n| n["id"] == new)).expect("new node entry");
    let data_dir = std::path::PathBuf::from(entry["data_dir"].as_str().expect("data_dir"));
    let recorded = std::fs::read_to_string(data_dir.join("shard-count")).expect("recorded shard count");
    assert_eq!(recorded.trim(), SHARDS.to_string(), "the new node took the cluster's shard count");
    let acks_mid: u64 = shared.acks.iter().map(|a| a.load(Ordering::Relaxed)).sum();

    // Leave: `cluster remove` drains node 1, waits until no shard holds it, then stops it.
    tokio::task::block_in_place(|| c.remove_node(1));
    c.wait_converged(WAIT).await;
    for shard in 0..SHARDS {
        let r = c.target_replicas(shard).await;
        assert!(!r.contains(&1) && r.len() == 3, "shard {shard}: replicas {r:?}");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    shared.stop.store(true, Ordering::Relaxed);
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.expect("writer task panicked"));
    }
    let acks: Vec<Ack> = outcomes.iter().flat_map(|o| o.acks.iter().cloned()).collect();
    let total: u64 = shared.acks.iter().map(|a| a.load(Ordering::Relaxed)).sum();
    eprintln!(
        "{} acknowledged writes ({} during the join, {} during the leave), {} retryable failures, in {:.1?}",
        acks.len(),
        acks_mid,
        total - acks_mid,
        outcomes.iter().map(|o| o.retryable).sum::<usize>(),
        started.elapsed()
    );
    for o in &outcomes {
        assert!(o.unexpected.is_empty(), "writer {}: unexpected answers: {:#?}", o.writer, o.unexpected);
        assert!(o.acks.len() >= 3, "writer {} stalled", o.writer);
    }
    let violations = version_violations(&acks, started);
    assert!(violations.is_empty(), "versions repeated or went back:\n{}", violations.join("\n"));
    let dups = duplicate_applies(&outcomes);
    assert!(dups.is_empty(), "{}", dups.join("\n"));

    // Every acknowledged write is there, read through the new node and an old one; and the new
    // node's front door takes writes.
    for id in [new, 2] {
        let mut finals = BTreeMap::new();
        for t in &twins {
            finals.insert(t.clone(), c.api(id).must_get_twin(t).await);
        }
        check_final(&finals, &outcomes, &format!("read through node {id} after the moves"));
    }
    let t = c.api(new).must_patch_twin(&twins[0], &json!({"properties": {"desired": {"via": "new"}}})).await;
    assert_eq!(t["properties"]["desired"]["via"], "new");
    c.assert_no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn founders_with_different_shard_counts_found_nothing_until_they_agree() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut c = Cluster::up(3, SHARDS);
    let other = SHARDS * 2;
    // The three founders again on new Raft state, `count(id)` shards each.
    let refound = |c: &mut Cluster, count: &dyn Fn(u64) -> u32| {
        for id in c.ids() {
            c.kill9(id);
        }
        for id in c.ids() {
            let node = c.node(id).clone();
            let config = std::fs::read_to_string(&node.config).expect("node config");
            let data_dir = config
                .lines()
                .find_map(|l| l.strip_prefix("data_dir = "))
                .map(|v| std::path::PathBuf::from(v.trim_matches('"')))
                .expect("data_dir in the node's config");
            // The Raft state and its recorded count go; the policy keys stay, so the test's
            // owner key still signs in.
            std::fs::remove_dir_all(data_dir.join("raft")).expect("remove the node's Raft state");
            std::fs::remove_file(data_dir.join("shard-count")).expect("remove the node's recorded count");
            let config: String = config
                .lines()
                .map(|l| {
                    if l.starts_with("shard_count = ") {
                        format!("shard_count = {}\n", count(id))
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect();
            assert!(config.contains(&format!("shard_count = {}", count(id))), "node {id}'s config:\n{config}");
            std::fs::write(&node.config, config).expect("rewrite the node's config");
            c.restart(id);
        }
    };
    // Node 3 given another count, as a mistyped config would start it: it would hash devices to
    // other shards than the others. Whichever founder leads the metadata group asks the others
    // first, finds the disagreement and founds nothing; its log names both counts.
    refound(&mut c, &|id| if id == 3 { other } else { SHARDS });
    let said = [
        format!("founding member 3 was started with {other} shards and this node with {SHARDS}"),
        format!("was started with {SHARDS} shards and this node with {other}"),
    ];
    let logs = |c: &Cluster| {
        c.ids().iter().map(|id| std::fs::read_to_string(&c.node(*id).log).unwrap_or_default()).collect::<String>()
    };
    let deadline = Instant::now() + WAIT;
    while !said.iter().any(|s| logs(&c).contains(s.as_str())) {
        assert!(Instant::now() < deadline, "no founder named the disagreement\n{}", c.logs_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for id in c.ids() {
        let map = c.map(id).await.unwrap_or_default();
        assert!(map["members"].as_object().is_none_or(|m| m.is_empty()), "node {id} founded a map: {map}");
        assert!(!c.is_ready(id).await, "node {id} is ready without a map");
    }
    // The same founders, all given one count, found the cluster and serve every shard.
    refound(&mut c, &|_| SHARDS);
    for id in c.ids() {
        c.wait_ready(id).await;
    }
    let mut taken = HashSet::new();
    for shard in 0..SHARDS {
        let dev = device_on_shard("fc-", shard, SHARDS, &mut taken);
        c.api(1).must_create_device(&dev).await;
        assert_eq!(c.api(3).must_get_twin(&dev).await["deviceId"], dev.as_str());
    }
    c.assert_no_panics();
}

// ---------------------------------------------------------------------------------------------------
// Jobs across a failover

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_survives_the_kill_of_its_runner_and_applies_once_per_device() {
    let _one = ONE_AT_A_TIME.lock().await;
    // Long enough at the runner's 500 devices/s for a checkpoint (every 2 s) before the kill.
    const N: usize = 3000;
    let c = Cluster::up(3, SHARDS);
    c.settle_leadership().await;
    let ids = c.ids();

    // The devices, created with bulk registry calls through every node.
    let apis: Vec<Api> = ids.iter().map(|id| c.api(*id)).collect();
    let devices: Vec<String> = (0..N).map(|i| format!("jk-{i:04}")).collect();
    futures::future::join_all(devices.chunks(100).enumerate().map(|(k, chunk)| {
        let api = &apis[k % apis.len()];
        let body = Value::Array(chunk.iter().map(|d| json!({"id": d, "importMode": "create"})).collect());
        async move {
            let r = api.send("POST", "/devices", Some(&body), &[]).await;
            assert_eq!(r.status, 200, "{}", r.text);
        }
    }))
    .await;

    // The job runs on the metadata leader: that is the node to kill once the job is under way.
    let meta_leader = c.status(ids[0]).await.expect("status")["meta"]["leader"].as_u64().expect("a metadata leader");
    let via = *ids.iter().find(|id| **id != meta_leader).expect("another node");
    let api = c.api(via);
    let req = json!({"jobId": "fleet", "type": "scheduleUpdateTwin", "queryCondition": "STARTS_WITH(deviceId, 'jk-')",
                     "updateTwin": {"properties": {"desired": {"fw": "9"}}}, "maxExecutionTimeInSeconds": 600});
    let r = api.send("PUT", "/jobs/v2/fleet", Some(&req), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let deadline = Instant::now() + WAIT;
    loop {
        let j = api.must_get("/jobs/v2/fleet").await;
        let s = &j["deviceJobStatistics"];
        // A third of the way: at least one checkpoint is in the record.
        if j["status"] == "running"
            && s["succeededCount"].as_u64().unwrap_or(0) >= N as u64 / 3
            && s["deviceCount"] == N
        {
            eprintln!("job under way: {s}");
            break;
        }
        assert!(j["status"] != "completed", "the job finished before the kill; make it longer: {j}");
        assert!(Instant::now() < deadline, "job not under way: {j}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before_kill =
        api.must_get("/jobs/v2/fleet").await["deviceJobStatistics"]["succeededCount"].as_u64().unwrap_or(0);
    c.kill9(meta_leader);
    eprintln!("SIGKILLed node {meta_leader} (metadata leader, the job's runner) at {before_kill} devices done");

    // The new runner carries the record on: the counters never go back.
    let deadline = Instant::now() + WAIT;
    let mut seen = before_kill;
    let done = loop {
        if let Ok(r) = api.try_send("GET", "/jobs/v2/fleet", None, &[]).await {
            if r.status == 200 {
                let n = r.json()["deviceJobStatistics"]["succeededCount"].as_u64().unwrap_or(0);
                assert!(n + 8 * 2 >= seen, "succeededCount went back from {seen} to {n}: {}", r.text);
                seen = seen.max(n);
            }
            if r.status == 200 && r.json()["status"] == "completed" {
                break r.json().clone();
            }
            assert!(r.json()["status"] != "failed", "{}", r.text);
        }
        assert!(Instant::now() < deadline, "job did not complete after the failover\n{}", c.logs_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(done["deviceJobStatistics"]["deviceCount"], N, "{done}");
    assert_eq!(done["deviceJobStatistics"]["succeededCount"], N, "{done}");
    // Exactly once: every device's desired $version moved from 1 to 2, and it holds the value.
    for d in &devices {
        let t = api.must_get_twin(d).await;
        assert_eq!(t["properties"]["desired"]["fw"], "9", "{d}");
        assert_eq!(desired_version(&t), 2, "{d}: applied {} times", desired_version(&t) - 1);
    }
    let r = api.send("POST", "/devices/query", Some(&json!({"query": "SELECT COUNT() AS n FROM devices.jobs WHERE jobId = 'fleet' AND status = 'completed'"})), &[]).await;
    assert_eq!(r.json(), &json!([{"n": N}]), "{}", r.text);
    // The runner that took over went on from the checkpoint rather than from the start.
    let resumed = c
        .nodes
        .iter()
        .any(|n| std::fs::read_to_string(&n.log).unwrap_or_default().contains("resuming job from its checkpoint"));
    assert!(resumed, "no runner resumed from a checkpoint\n{}", c.logs_tail());
    c.assert_no_panics();
}
