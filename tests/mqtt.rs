//! The device MQTT endpoint (docs/iothub-protocol.md §1) against the real `twinhub` binary, with the real Rust MQTT client
//! `rumqttc` (3.1.1 and 5) and raw sockets where a client library would hide the behaviour.
//!
//! Tests that need the notification hub's desired pushes: `desired_patch_and_replace_are_pushed`,
//! `reconnect_flow_receives_only_newer_pushes_without_resubscribing`.

use twinhub_testkit as common;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rumqttc::{
    AsyncClient, ConnectReturnCode, ConnectionError, Event, MqttOptions, Packet, QoS, SubscribeReasonCode,
    TlsConfiguration, Transport,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(15);
const API: &str = "api-version=2021-04-12&DeviceClientType=twinhub-tests%2F1.0";

// ---------------------------------------------------------------------------------------------------
// Identities and tokens

/// A device or module identity with its primary key.
#[derive(Clone, Debug)]
struct Ident {
    device: String,
    module: Option<String>,
    key: String,
}

impl Ident {
    fn client_id(&self) -> String {
        match &self.module {
            Some(m) => format!("{}/{m}", self.device),
            None => self.device.clone(),
        }
    }

    fn username(&self) -> String {
        format!("localhost/{}/?{API}", self.client_id())
    }

    /// A token as the Python device SDK builds it (`sr = quote(resource, safe="")`).
    fn token(&self) -> String {
        device_token("localhost", &self.device, self.module.as_deref(), &self.key, unix_now() + 3600)
    }

    fn twin_path(&self) -> String {
        match &self.module {
            Some(m) => format!("/twins/{}/modules/{}", enc(&self.device), enc(m)),
            None => format!("/twins/{}", enc(&self.device)),
        }
    }
}

fn primary_key(doc: &Value) -> String {
    doc.pointer("/authentication/symmetricKey/primaryKey")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no primary key in {doc}"))
        .to_string()
}

async fn new_device(api: &Api, id: &str) -> Ident {
    let doc = api.must_create_device(id).await;
    Ident { device: id.into(), module: None, key: primary_key(&doc) }
}

async fn new_module(api: &Api, device: &str, module: &str) -> Ident {
    let doc = api.must_create_module(device, module).await;
    Ident { device: device.into(), module: Some(module.into()), key: primary_key(&doc) }
}

fn options(srv: &Server, ident: &Ident, clean: bool) -> MqttOptions {
    let mut o = MqttOptions::new(ident.client_id(), "127.0.0.1", srv.mqtt_plain_port);
    o.set_credentials(ident.username(), ident.token());
    o.set_keep_alive(Duration::from_secs(30));
    o.set_clean_session(clean);
    o.set_max_packet_size(1 << 20, 1 << 20);
    o
}

// ---------------------------------------------------------------------------------------------------
// A device client over rumqttc 3.1.1

#[derive(Debug)]
enum Ev {
    Publish { topic: String, payload: Vec<u8>, qos: QoS },
    SubAck(Vec<SubscribeReasonCode>),
    Closed(String),
}

struct Dev {
    client: AsyncClient,
    rx: mpsc::UnboundedReceiver<Ev>,
    backlog: VecDeque<Ev>,
    closed: Option<String>,
}

/// A twin response: status, the topic as received, the payload.
#[derive(Debug)]
struct Res {
    status: u16,
    topic: String,
    payload: Vec<u8>,
    qos: QoS,
}

impl Res {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.payload).unwrap_or_else(|e| {
            panic!("response on {} is not JSON ({e}): {:?}", self.topic, String::from_utf8_lossy(&self.payload))
        })
    }

    /// `&$version=` of a 204.
    fn version(&self) -> i64 {
        let v = self.topic.split("&$version=").nth(1).unwrap_or_else(|| panic!("no $version in {}", self.topic));
        v.parse().unwrap_or_else(|_| panic!("bad $version in {}", self.topic))
    }
}

static RID: AtomicU64 = AtomicU64::new(1);

fn next_rid() -> String {
    format!("rid-{}", RID.fetch_add(1, Ordering::Relaxed))
}

/// Connects; `Err` carries the CONNACK refusal code.
async fn connect(o: MqttOptions) -> Result<(Dev, bool), ConnectReturnCode> {
    let (client, mut el) = AsyncClient::new(o, 64);
    let first = tokio::time::timeout(WAIT, el.poll()).await.expect("no CONNACK in time");
    let present = match first {
        Ok(Event::Incoming(Packet::ConnAck(ack))) => ack.session_present,
        Err(ConnectionError::ConnectionRefused(code)) => return Err(code),
        other => panic!("unexpected first event: {other:?}"),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let ev = match el.poll().await {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    Ev::Publish { topic: p.topic.clone(), payload: p.payload.to_vec(), qos: p.qos }
                }
                Ok(Event::Incoming(Packet::SubAck(s))) => Ev::SubAck(s.return_codes),
                Ok(_) => continue,
                // Stop at the first error: polling again would reconnect.
                Err(e) => {
                    let _ = tx.send(Ev::Closed(e.to_string()));
                    return;
                }
            };
            if tx.send(ev).is_err() {
                return;
            }
        }
    });
    Ok((Dev { client, rx, backlog: VecDeque::new(), closed: None }, present))
}

async fn must_connect(srv: &Server, ident: &Ident) -> Dev {
    match connect(options(srv, ident, true)).await {
        Ok((d, _)) => d,
        Err(code) => panic!("{} refused: {code:?}\n{}", ident.client_id(), srv.stderr_tail()),
    }
}

impl Dev {
    /// The next event matching `pred` within `d`; others are kept for later.
    async fn wait_for(&mut self, d: Duration, mut pred: impl FnMut(&Ev) -> bool) -> Option<Ev> {
        if let Some(i) = self.backlog.iter().position(&mut pred) {
            return self.backlog.remove(i);
        }
        let deadline = tokio::time::Instant::now() + d;
        loop {
            let ev = match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(ev)) => ev,
                Ok(None) | Err(_) => return None,
            };
            if let Ev::Closed(why) = &ev {
                self.closed = Some(why.clone());
            }
            if pred(&ev) {
                return Some(ev);
            }
            if matches!(ev, Ev::Closed(_)) {
                return None;
            }
            self.backlog.push_back(ev);
        }
    }

    async fn subscribe(&mut self, filter: &str, qos: QoS) -> SubscribeReasonCode {
        self.client.subscribe(filter, qos).await.expect("queue SUBSCRIBE");
        match self.wait_for(WAIT, |e| matches!(e, Ev::SubAck(_))).await {
            Some(Ev::SubAck(codes)) => codes[0],
            other => panic!("no SUBACK for {filter}: {other:?} (closed: {:?})", self.closed),
        }
    }

    async fn publish(&self, topic: &str, qos: QoS, payload: impl Into<Vec<u8>>) {
        self.client.publish(topic, qos, false, payload.into()).await.expect("queue PUBLISH");
    }

    /// Publishes a twin request and waits for the response carrying its `$rid`.
    async fn request(&mut self, topic_prefix: &str, rid: &str, qos: QoS, payload: impl Into<Vec<u8>>) -> Res {
        self.publish(&format!("{topic_prefix}?$rid={rid}"), qos, payload).await;
        self.response(rid).await
    }

    async fn response(&mut self, rid: &str) -> Res {
        let ev = self
            .wait_for(WAIT, |e| match e {
                Ev::Publish { topic, .. } => topic.starts_with("$iothub/twin/res/") && rid_of(topic) == Some(rid),
                _ => false,
            })
            .await;
        match ev {
            Some(Ev::Publish { topic, payload, qos }) => {
                let status = topic["$iothub/twin/res/".len()..].split('/').next().and_then(|s| s.parse().ok());
                Res { status: status.unwrap_or_else(|| panic!("no status in {topic}")), topic, payload, qos }
            }
            other => panic!("no response for $rid={rid}: {other:?} (closed: {:?})", self.closed),
        }
    }

    async fn get_twin(&mut self) -> Value {
        let r = self.request("$iothub/twin/GET/", &next_rid(), QoS::AtLeastOnce, " ").await;
        assert_eq!(r.status, 200, "GET twin: {r:?}");
        r.json()
    }

    async fn patch_reported(&mut self, patch: &Value) -> Res {
        let rid = next_rid();
        self.request("$iothub/twin/PATCH/properties/reported/", &rid, QoS::AtLeastOnce, patch.to_string()).await
    }

    /// The next desired push.
    async fn desired_push(&mut self, d: Duration) -> Option<(i64, Value)> {
        match self
            .wait_for(d, |e| matches!(e, Ev::Publish { topic, .. } if topic.starts_with("$iothub/twin/PATCH/properties/desired/")))
            .await?
        {
            Ev::Publish { topic, payload, .. } => {
                let v = topic.split("?$version=").nth(1).and_then(|v| v.parse().ok());
                let v = v.unwrap_or_else(|| panic!("push topic without $version: {topic}"));
                Some((v, serde_json::from_slice(&payload).expect("push body is JSON")))
            }
            _ => None,
        }
    }

    /// Asserts the server closes the connection within `d`.
    async fn must_be_closed(&mut self, d: Duration, why: &str) -> String {
        if let Some(c) = &self.closed {
            return c.clone();
        }
        match self.wait_for(d, |e| matches!(e, Ev::Closed(_))).await {
            Some(Ev::Closed(reason)) => reason,
            _ => panic!("{why}: the connection was not closed within {d:?}"),
        }
    }

    /// Every PUBLISH received so far and within `d`.
    async fn publishes_within(&mut self, d: Duration) -> Vec<String> {
        let _ = self.wait_for(d, |_| false).await;
        self.backlog
            .iter()
            .filter_map(|e| match e {
                Ev::Publish { topic, .. } => Some(topic.clone()),
                _ => None,
            })
            .collect()
    }
}

/// The `$rid` of a response topic (`...?$rid=X[&...]`).
fn rid_of(topic: &str) -> Option<&str> {
    let q = topic.split_once("/?")?.1;
    q.strip_prefix("$rid=").map(|r| r.split('&').next().unwrap_or(r))
}

async fn device_doc(api: &Api, id: &str) -> Value {
    api.must_get(&format!("/devices/{}", enc(id))).await
}

/// Polls the Device document until `connectionState` is `want`.
async fn wait_connection_state(api: &Api, id: &str, want: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let d = device_doc(api, id).await;
        if d["connectionState"] == want {
            return d;
        }
        assert!(Instant::now() < deadline, "{id}: connectionState stayed {} (want {want})", d["connectionState"]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------------------
// Raw MQTT packets for what a client library would not send

fn mqtt_string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s);
}

fn remaining_length(out: &mut Vec<u8>, mut len: usize) {
    loop {
        let mut b = (len % 128) as u8;
        len /= 128;
        if len > 0 {
            b |= 0x80;
        }
        out.push(b);
        if len == 0 {
            break;
        }
    }
}

/// An MQTT 3.1.1 (or other level) CONNECT with user name and password.
fn raw_connect(name: &[u8], level: u8, keep_alive: u16, client_id: &str, user: &str, password: &str) -> Vec<u8> {
    let mut body = Vec::new();
    mqtt_string(&mut body, name);
    body.push(level);
    body.push(0b1100_0010); // user name, password, clean session
    body.extend_from_slice(&keep_alive.to_be_bytes());
    mqtt_string(&mut body, client_id.as_bytes());
    mqtt_string(&mut body, user.as_bytes());
    mqtt_string(&mut body, password.as_bytes());
    let mut p = vec![0x10];
    remaining_length(&mut p, body.len());
    p.extend_from_slice(&body);
    p
}

async fn raw_socket(srv: &Server) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(("127.0.0.1", srv.mqtt_plain_port)).await.expect("connect to the plain MQTT port")
}

/// A raw MQTT 3.1.1 connection, CONNACK checked.
async fn raw_session(srv: &Server, ident: &Ident, keep_alive: u16) -> tokio::net::TcpStream {
    let mut s = raw_socket(srv).await;
    s.write_all(&raw_connect(b"MQTT", 4, keep_alive, &ident.client_id(), &ident.username(), &ident.token()))
        .await
        .unwrap();
    let mut ack = [0u8; 4];
    tokio::time::timeout(WAIT, s.read_exact(&mut ack)).await.expect("CONNACK in time").unwrap();
    assert_eq!(ack, [0x20, 2, 0, 0], "CONNACK accepted");
    s
}

/// SUBSCRIBE (packet id `pkid`) with `(filter, qos)` pairs.
fn raw_subscribe(pkid: u16, filters: &[(&str, u8)]) -> Vec<u8> {
    let mut body = pkid.to_be_bytes().to_vec();
    for (f, q) in filters {
        mqtt_string(&mut body, f.as_bytes());
        body.push(*q);
    }
    let mut p = vec![0x82];
    remaining_length(&mut p, body.len());
    p.extend_from_slice(&body);
    p
}

/// PUBLISH at QoS 0 to any topic bytes (a client library refuses wildcards in a topic name).
fn raw_publish(topic: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    mqtt_string(&mut body, topic);
    body.extend_from_slice(payload);
    let mut p = vec![0x30];
    remaining_length(&mut p, body.len());
    p.extend_from_slice(&body);
    p
}

/// Reads until the server closes (EOF or reset); returns everything read.
async fn read_until_closed(s: &mut tokio::net::TcpStream, d: Duration) -> Option<Vec<u8>> {
    let mut all = Vec::new();
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + d;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(all),
            Ok(Ok(n)) => all.extend_from_slice(&buf[..n]),
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Twin requests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_twin_answers_properties_only_even_without_a_response_subscription() {
    let srv = Server::start_default();
    let api = srv.owner();
    let dev = new_device(&api, "getdev").await;
    api.must_patch_twin("getdev", &json!({"tags": {"site": "b43"}, "properties": {"desired": {"interval": 5}}})).await;
    let mut d = must_connect(&srv, &dev).await;

    // Python: QoS 1 with " "; C: QoS 0 with an empty payload. No SUBSCRIBE at all (Python after a
    // reconnect), yet the answers arrive.
    let rid = "7a53d196-e4f1-4071-b437-0b2a38b88a48";
    let r = d.request("$iothub/twin/GET/", rid, QoS::AtLeastOnce, " ").await;
    assert_eq!(r.topic, format!("$iothub/twin/res/200/?$rid={rid}"));
    assert_eq!(r.qos, QoS::AtMostOnce, "responses go at QoS 0, as IoT Hub sends them");
    let body = r.json();
    let keys: Vec<&String> = body.as_object().expect("object").keys().collect();
    assert_eq!(keys, ["desired", "reported"], "properties only, no tags or identity: {body}");
    assert_eq!(body["desired"]["interval"], 5);
    assert_eq!(body["desired"]["$version"], 2);
    assert!(body["desired"]["$metadata"]["$lastUpdated"].is_string(), "{body}");
    assert_eq!(body["reported"]["$version"], 1);
    let https = api.must_get_twin("getdev").await;
    assert_eq!(body, https["properties"], "MQTT GET = the properties section of the HTTPS twin");

    let r = d.request("$iothub/twin/GET/", "42", QoS::AtMostOnce, "").await;
    assert_eq!((r.status, r.topic.as_str()), (200, "$iothub/twin/res/200/?$rid=42"));
    assert_eq!(r.json(), body);

    // A subscription to res/# changes nothing about who gets the answer.
    assert_eq!(
        d.subscribe("$iothub/twin/res/#", QoS::AtLeastOnce).await,
        SubscribeReasonCode::Success(QoS::AtLeastOnce)
    );
    assert_eq!(d.get_twin().await, body);

    // The device is deleted while connected: 404 with IoT Hub's error body.
    api.must(204, "DELETE", "/devices/getdev", None, &[]).await;
    let r = d.request("$iothub/twin/GET/", "after-delete", QoS::AtMostOnce, "").await;
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(r.json()["errorCode"], 404001);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_patch_answers_204_with_version_and_shows_over_https() {
    let srv = Server::start_default();
    let api = srv.owner();
    let dev = new_device(&api, "repdev").await;
    let before = device_doc(&api, "repdev").await;
    let mut d = must_connect(&srv, &dev).await;
    let r = d.patch_reported(&json!({"fw": "1.0", "nested": {"a": 1}})).await;
    assert_eq!(r.status, 204, "{r:?}");
    assert!(r.payload.is_empty(), "204 has an empty payload");
    assert_eq!(r.version(), 2);
    assert!(r.topic.starts_with("$iothub/twin/res/204/?$rid=rid-") && r.topic.ends_with("&$version=2"), "{}", r.topic);
    let r2 = d.patch_reported(&json!({"nested": {"a": null, "b": 2}})).await;
    assert_eq!((r2.status, r2.version()), (204, 3));

    let twin = api.must_get_twin("repdev").await;
    assert_eq!(user_props(&twin["properties"]["reported"]), json!({"fw": "1.0", "nested": {"b": 2}}));
    assert_eq!(reported_version(&twin), 3);
    assert_eq!(d.get_twin().await["reported"], twin["properties"]["reported"]);
    // Device activity moves lastActivityTime.
    let after = device_doc(&api, "repdev").await;
    assert_ne!(after["lastActivityTime"], before["lastActivityTime"], "{after}");

    // The same over a module identity: its own twin, not the device's.
    let m = new_module(&api, "repdev", "mod1").await;
    let mut md = must_connect(&srv, &m).await;
    let r = md.patch_reported(&json!({"moduleSays": "hi"})).await;
    assert_eq!((r.status, r.version()), (204, 2));
    let mt = api.must_get(&m.twin_path()).await;
    assert_eq!(user_props(&mt["properties"]["reported"]), json!({"moduleSays": "hi"}));
    assert_eq!(reported_version(&api.must_get_twin("repdev").await), 3, "device twin untouched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reported_patches_are_400_with_error_body_and_change_nothing() {
    let srv = Server::start_default();
    let api = srv.owner();
    let dev = new_device(&api, "baddev").await;
    let mut d = must_connect(&srv, &dev).await;
    assert_eq!(d.patch_reported(&json!({"ok": 1})).await.status, 204);
    let before = twin_state(&api.must_get_twin("baddev").await);

    let deep = (0..12).fold(json!(1), |v, i| json!({ format!("l{i}"): v }));
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{not json".to_vec(), "JSON"),
        (b"".to_vec(), "JSON"),
        (b"[1,2]".to_vec(), "object"),
        (json!({"bad key": 1}).to_string().into_bytes(), "bad key"),
        (json!({"a.b": 1}).to_string().into_bytes(), "a.b"),
        (deep.to_string().into_bytes(), "depth"),
        (json!({"s": "x".repeat(5000)}).to_string().into_bytes(), "s"),
        // Read by serde_json's `Value`, this would nest 15,000 deep on one stack and abort the node.
        (nested_raw_values(120).into_bytes(), "reserved"),
    ];
    for (payload, needle) in cases {
        let rid = next_rid();
        let r = d.request("$iothub/twin/PATCH/properties/reported/", &rid, QoS::AtLeastOnce, payload.clone()).await;
        assert_eq!(
            r.topic,
            format!("$iothub/twin/res/400/?$rid={rid}"),
            "payload {:?}",
            String::from_utf8_lossy(&payload)
        );
        let body = r.json();
        assert_eq!(body["errorCode"], 400004, "{body}");
        let msg = body["message"].as_str().unwrap_or_default();
        assert!(
            msg.contains(needle) || msg.to_lowercase().contains(&needle.to_lowercase()),
            "message {msg:?} should name {needle:?}"
        );
        assert!(body["trackingId"].as_str().is_some_and(|t| !t.is_empty()), "{body}");
        assert!(body["timestampUtc"].as_str().is_some_and(|t| t.ends_with('Z')), "{body}");
    }
    // `$rid` must come first: the answer still reaches the requester, with its rid echoed.
    d.publish("$iothub/twin/GET/?x=1&$rid=late", QoS::AtMostOnce, "").await;
    let r = d.response("late").await;
    assert_eq!((r.status, r.json()["errorCode"].clone()), (400, json!(400004)));
    // A request without any $rid cannot be answered; the connection stays usable.
    d.publish("$iothub/twin/GET/?x=1", QoS::AtLeastOnce, "").await;
    assert!(d.get_twin().await["reported"]["ok"] == 1);

    assert_eq!(twin_state(&api.must_get_twin("baddev").await), before, "rejected patches changed the twin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_rid_with_the_same_payload_applies_once() {
    let srv = Server::start_default();
    let api = srv.owner();
    let dev = new_device(&api, "dupdev").await;
    let mut d = must_connect(&srv, &dev).await;
    let topic = "$iothub/twin/PATCH/properties/reported/";
    let payload = json!({"counter": 1}).to_string();
    let first = d.request(topic, "dup-1", QoS::AtLeastOnce, payload.clone()).await;
    assert_eq!((first.status, first.version()), (204, 2));
    // The C SDK wraps its counter; paho re-sends with the same $rid: answered with the first outcome.
    let again = d.request(topic, "dup-1", QoS::AtLeastOnce, payload.clone()).await;
    assert_eq!((again.status, again.version()), (204, 2), "a repeat answers the first outcome");
    assert_eq!(reported_version(&api.must_get_twin("dupdev").await), 2, "applied once");
    // Same $rid, different payload: a new request.
    let other = d.request(topic, "dup-1", QoS::AtLeastOnce, json!({"counter": 2}).to_string()).await;
    assert_eq!((other.status, other.version()), (204, 3));
    let twin = api.must_get_twin("dupdev").await;
    assert_eq!((reported_version(&twin), twin["properties"]["reported"]["counter"].clone()), (3, json!(2)));
}

// ---------------------------------------------------------------------------------------------------
// Desired pushes (need the notification hub)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn desired_patch_and_replace_are_pushed() {
    let srv = Server::start_default();
    let api = srv.owner();
    let dev = new_device(&api, "pushdev").await;
    let mut d = must_connect(&srv, &dev).await;
    d.subscribe("$iothub/twin/PATCH/properties/desired/#", QoS::AtLeastOnce).await;
    let v0 = d.get_twin().await["desired"]["$version"].as_i64().expect("desired $version");

    api.must_patch_twin("pushdev", &json!({"properties": {"desired": {"a": 1, "b": 2}}})).await;
    let (v1, body) = d.desired_push(WAIT).await.expect("no desired push after PATCH");
    assert_eq!(v1, v0 + 1);
    assert_eq!(body, json!({"a": 1, "b": 2, "$version": v1}));

    // PUT {a:1,c:100} over {a:1,b:2}: the difference, with null for the removed key (docs/iothub-protocol.md §3.2).
    api.must_ok("PUT", "/twins/pushdev", Some(&json!({"properties": {"desired": {"a": 1, "c": 100}}})), &[]).await;
    let (v2, body) = d.desired_push(WAIT).await.expect("no desired push after PUT");
    assert_eq!(v2, v1 + 1);
    assert_eq!(body, json!({"a": 1, "b": null, "c": 100, "$version": v2}));

    // Tag-only changes are not desired changes.
    api.must_patch_twin("pushdev", &json!({"tags": {"t": 1}})).await;
    api.must_patch_twin("pushdev", &json!({"properties": {"desired": {"z": true}}})).await;
    let (v3, body) = d.desired_push(WAIT).await.expect("no push after the third change");
    assert_eq!((v3, body["z"].clone()), (v2 + 1, json!(true)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_flow_receives_only_newer_pushes_without_resubscribing() {
    let srv = Server::start_default();
    let api = srv.owner();
    let dev = new_device(&api, "flowdev").await;
    let (mut d, present) = connect(options(&srv, &dev, false)).await.expect("connect");
    assert!(!present);
    d.subscribe("$iothub/twin/PATCH/properties/desired/#", QoS::AtLeastOnce).await;
    d.client.disconnect().await.expect("queue DISCONNECT");
    d.must_be_closed(WAIT, "after DISCONNECT").await;

    // Changed while disconnected: no push queued (IoT Hub does not queue), the GET shows it.
    api.must_patch_twin("flowdev", &json!({"properties": {"desired": {"while": "away"}}})).await;
    let (mut d, present) = connect(options(&srv, &dev, false)).await.expect("reconnect");
    assert!(present, "CleanSession=0 resumes the session");
    let twin = d.get_twin().await;
    let fetched = twin["desired"]["$version"].as_i64().expect("desired $version");
    assert_eq!(twin["desired"]["while"], "away");

    // No re-SUBSCRIBE: the stored subscription delivers the next change.
    api.must_patch_twin("flowdev", &json!({"properties": {"desired": {"next": 1}}})).await;
    let mut newer = None;
    while let Some((v, body)) = d.desired_push(WAIT).await {
        if v <= fetched {
            continue; // the device ignores what the GET already covered
        }
        newer = Some((v, body));
        break;
    }
    let (v, body) = newer.expect("no push newer than the fetched twin");
    assert_eq!(v, fetched + 1);
    assert_eq!(body, json!({"next": 1, "$version": v}));
}

// ---------------------------------------------------------------------------------------------------
// Sessions and connection state

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_sessions_survive_reconnects_and_clean_sessions_do_not() {
    let srv = Server::start_default();
    let api = srv.owner();
    let dev = new_device(&api, "sessdev").await;
    let (mut d, present) = connect(options(&srv, &dev, false)).await.expect("connect");
    assert!(!present, "a first connection has no session");
    d.subscribe("$iothub/twin/PATCH/properties/desired/#", QoS::AtLeastOnce).await;
    d.client.disconnect().await.expect("queue DISCONNECT");
    d.must_be_closed(WAIT, "after DISCONNECT").await;

    let (mut d, present) = connect(options(&srv, &dev, false)).await.expect("reconnect");
    assert!(present, "CleanSession=0: session present");
    // Python's flow after a reconnect: GET with no SUBSCRIBE at all.
    assert_eq!(d.get_twin().await["desired"]["$version"], 1);
    d.client.disconnect().await.expect("queue DISCONNECT");
    d.must_be_closed(WAIT, "after DISCONNECT").await;

    let (d, present) = connect(options(&srv, &dev, true)).await.expect("clean connect");
    assert!(!present, "CleanSession=1 drops the session");
    d.client.disconnect().await.expect("queue DISCONNECT");
    let (_d, present) = connect(options(&srv, &dev, false)).await.expect("connect after clean");
    assert!(!present, "a clean session is not kept after its connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_state_and_same_client_id_takeover() {
    let srv = Server::start_default();
    let api = srv.owner();
    let dev = new_device(&api, "statedev").await;
    assert_eq!(device_doc(&api, "statedev").await["connectionState"], "Disconnected");

    let mut first = must_connect(&srv, &dev).await;
    let doc = wait_connection_state(&api, "statedev", "Connected").await;
    assert_ne!(doc["connectionStateUpdatedTime"], "0001-01-01T00:00:00Z");

    // A second connection with the same client id closes the first (IoT Hub behaviour).
    let mut second = must_connect(&srv, &dev).await;
    first.must_be_closed(WAIT, "the taken-over connection").await;
    assert_eq!(second.get_twin().await["reported"]["$version"], 1, "the new connection works");
    // The old connection's end must not report the device disconnected.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(device_doc(&api, "statedev").await["connectionState"], "Connected");

    second.client.disconnect().await.expect("queue DISCONNECT");
    second.must_be_closed(WAIT, "after DISCONNECT").await;
    wait_connection_state(&api, "statedev", "Disconnected").await;

    // A connection that just drops (no DISCONNECT) is reported disconnected too.
    let s = raw_session(&srv, &dev, 60).await;
    wait_connection_state(&api, "statedev", "Connected").await;
    drop(s);
    wait_connection_state(&api, "statedev", "Disconnected").await;
}

// ---------------------------------------------------------------------------------------------------
// Authentication

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_auth_refusal_has_its_connack_code() {
    let srv = Server::start_default();
    let api = srv.owner();
    let dev = new_device(&api, "authdev").await;
    let other = new_device(&api, "otherdev").await;
    let disabled_doc = api
        .must_ok(
            "PUT",
            "/devices/offdev",
            Some(&json!({"deviceId": "offdev", "status": "disabled", "authentication": {"type": "sas", "symmetricKey": {}}})),
            &[],
        )
        .await;
    let disabled = Ident { device: "offdev".into(), module: None, key: primary_key(&disabled_doc) };
    let exp = unix_now() + 3600;

    let with = |client_id: &str, user: &str, password: &str| {
        let mut o = MqttOptions::new(client_id, "127.0.0.1", srv.mqtt_plain_port);
        o.set_credentials(user, password);
        o
    };
    let cases: Vec<(&str, MqttOptions, ConnectReturnCode)> = vec![
        (
            "bad signature",
            with("authdev", &dev.username(), &device_token("localhost", "authdev", None, &other.key, exp)),
            ConnectReturnCode::BadUserNamePassword,
        ),
        (
            "expired token",
            with("authdev", &dev.username(), &device_token("localhost", "authdev", None, &dev.key, unix_now() - 10)),
            ConnectReturnCode::BadUserNamePassword,
        ),
        (
            "token for another device",
            with("authdev", &dev.username(), &other.token()),
            ConnectReturnCode::BadUserNamePassword,
        ),
        (
            "unknown device",
            with("ghost", &format!("localhost/ghost/?{API}"), &device_token("localhost", "ghost", None, &dev.key, exp)),
            ConnectReturnCode::BadUserNamePassword,
        ),
        ("disabled device", with("offdev", &disabled.username(), &disabled.token()), ConnectReturnCode::NotAuthorized),
        ("missing password", with("authdev", &dev.username(), ""), ConnectReturnCode::BadUserNamePassword),
        (
            "user name naming another device",
            with("authdev", &format!("localhost/otherdev/?{API}"), &dev.token()),
            ConnectReturnCode::BadUserNamePassword,
        ),
        ("invalid client id", with("auth dev", &dev.username(), &dev.token()), ConnectReturnCode::BadClientId),
        (
            "too many client id levels",
            with("authdev/m/x", &dev.username(), &dev.token()),
            ConnectReturnCode::BadClientId,
        ),
        (
            "garbage token",
            with("authdev", &dev.username(), "SharedAccessSignature nonsense"),
            ConnectReturnCode::BadUserNamePassword,
        ),
    ];
    for (what, o, want) in cases {
        match connect(o).await {
            Err(code) => assert_eq!(code, want, "{what}"),
            Ok(_) => panic!("{what}: connection accepted"),
        }
    }

    // The right credentials work, with the HTTPS host (with port) in `sr` as well.
    let o = with("authdev", &dev.username(), &device_token(&srv.host_name, "authdev", None, &dev.key, exp));
    assert!(connect(o).await.is_ok(), "sr with host:port");
    // No user name at all is fine: the client id and the token decide.
    let mut o = MqttOptions::new("authdev", "127.0.0.1", srv.mqtt_plain_port);
    o.set_credentials("", dev.token());
    assert!(connect(o).await.is_ok(), "no user name");

    // MQTT 5 reason codes.
    let v5 = |client_id: &str, password: String| {
        let mut o = rumqttc::v5::MqttOptions::new(client_id, "127.0.0.1", srv.mqtt_plain_port);
        o.set_credentials(format!("localhost/{client_id}/?{API}"), password);
        o
    };
    use rumqttc::v5::mqttbytes::v5::ConnectReturnCode as V5Code;
    for (what, o, want) in [
        (
            "v5 bad signature",
            v5("authdev", device_token("localhost", "authdev", None, &other.key, exp)),
            V5Code::BadUserNamePassword,
        ),
        ("v5 disabled", v5("offdev", disabled.token()), V5Code::NotAuthorized),
        ("v5 invalid client id", v5("a b", dev.token()), V5Code::ClientIdentifierNotValid),
    ] {
        let (_c, mut el) = rumqttc::v5::AsyncClient::new(o, 8);
        match tokio::time::timeout(WAIT, el.poll()).await.expect("v5 CONNACK in time") {
            Err(rumqttc::v5::ConnectionError::ConnectionRefused(code)) => assert_eq!(code, want, "{what}"),
            other => panic!("{what}: {other:?}"),
        }
    }

    // MQTT 3.1 (protocol level 3) is refused with return code 1.
    let mut s = raw_socket(&srv).await;
    s.write_all(&raw_connect(b"MQIsdp", 3, 60, "authdev", &dev.username(), &dev.token())).await.unwrap();
    let got = read_until_closed(&mut s, WAIT).await.expect("closed after the refusal");
    assert_eq!(got, [0x20, 2, 0, 1]);
}

// ---------------------------------------------------------------------------------------------------
// Isolation and protocol violations

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_never_see_each_others_traffic() {
    let srv = Server::start_default();
    let api = srv.owner();
    let a = new_device(&api, "devA").await;
    let b = new_device(&api, "devB").await;
    let mut da = must_connect(&srv, &a).await;
    let mut db = must_connect(&srv, &b).await;
    for f in ["#", "$iothub/#", "$iothub/twin/#", "$iothub/twin/PATCH/properties/desired/#", "+/#"] {
        assert_eq!(db.subscribe(f, QoS::AtLeastOnce).await, SubscribeReasonCode::Success(QoS::AtLeastOnce), "{f}");
    }
    da.subscribe("$iothub/twin/PATCH/properties/desired/#", QoS::AtLeastOnce).await;

    // A is busy: GETs, reported patches, a desired change from the back end.
    da.get_twin().await;
    assert_eq!(da.patch_reported(&json!({"secret": "a"})).await.status, 204);
    api.must_patch_twin("devA", &json!({"properties": {"desired": {"forA": 1}}})).await;
    da.get_twin().await;
    let seen = db.publishes_within(Duration::from_secs(2)).await;
    assert!(seen.is_empty(), "B saw A's traffic: {seen:?}");

    // B's twin topics act on B's twin only.
    let before_a = twin_state(&api.must_get_twin("devA").await);
    assert_eq!(db.patch_reported(&json!({"mine": "b"})).await.status, 204);
    assert_eq!(api.must_get_twin("devB").await["properties"]["reported"]["mine"], "b");
    // Publishing on A's telemetry topic is outside B's identity: B is disconnected, A unaffected.
    db.publish("devices/devA/messages/events/", QoS::AtLeastOnce, "{\"spoof\":1}").await;
    db.must_be_closed(WAIT, "publish on another device's topic").await;
    assert_eq!(twin_state(&api.must_get_twin("devA").await), before_a);
    assert_eq!(da.patch_reported(&json!({"still": "ok"})).await.status, 204, "A keeps working");
    // A's own telemetry is accepted (and dropped).
    da.publish("devices/devA/messages/events/", QoS::AtLeastOnce, "{\"t\":1}").await;
    assert_eq!(da.get_twin().await["reported"]["still"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_violations_close_the_connection() {
    let srv = Server::start_default();
    let api = srv.owner();
    let dev = new_device(&api, "violdev").await;

    let mut d = must_connect(&srv, &dev).await;
    d.publish("$iothub/methods/POST/reboot/?$rid=1", QoS::AtMostOnce, "{}").await;
    d.must_be_closed(WAIT, "unsupported $iothub topic").await;

    let mut d = must_connect(&srv, &dev).await;
    d.publish("$iothub/twin/PATCH/properties/reported/?$rid=q2", QoS::ExactlyOnce, "{\"q\":2}").await;
    d.must_be_closed(WAIT, "QoS 2").await;

    let mut d = must_connect(&srv, &dev).await;
    let big = json!({"big": "x".repeat(300 * 1024)}).to_string();
    d.publish("$iothub/twin/PATCH/properties/reported/?$rid=big", QoS::AtMostOnce, big).await;
    d.must_be_closed(WAIT, "a packet over 256 KiB").await;

    // Invalid filters are refused in SUBACK (0x80), valid ones granted at most QoS 1; the connection
    // stays up. (rumqttc refuses to send invalid filters, hence raw bytes.)
    let mut s = raw_session(&srv, &dev, 60).await;
    s.write_all(&raw_subscribe(7, &[("a/#/b", 1), ("$iothub/twin/res/#", 2), ("x+", 0), ("", 0), ("+/#", 0)]))
        .await
        .unwrap();
    let mut suback = [0u8; 9];
    tokio::time::timeout(WAIT, s.read_exact(&mut suback)).await.expect("SUBACK in time").unwrap();
    assert_eq!(suback, [0x90, 7, 0, 7, 0x80, 1, 0x80, 0x80, 0]);
    s.write_all(&[0xC0, 0x00]).await.unwrap();
    let mut pong = [0u8; 2];
    tokio::time::timeout(WAIT, s.read_exact(&mut pong)).await.expect("PINGRESP in time").unwrap();
    assert_eq!(pong, [0xD0, 0x00]);

    // A wildcard or NUL in a topic name (here in the request id the answer's topic would echo) closes
    // the connection without an answer.
    for topic in ["$iothub/twin/GET/?$rid=1#", "$iothub/twin/GET/?$rid=+", "$iothub/twin/GET/?$rid=a\0"] {
        let mut s = raw_session(&srv, &dev, 60).await;
        s.write_all(&raw_publish(topic.as_bytes(), b"")).await.unwrap();
        assert_eq!(read_until_closed(&mut s, WAIT).await.expect("closed"), b"", "{topic:?}");
    }

    // Garbage instead of CONNECT is closed without an answer.
    let mut s = raw_socket(&srv).await;
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    assert_eq!(read_until_closed(&mut s, WAIT).await.expect("closed"), b"");

    assert_eq!(reported_version(&api.must_get_twin("violdev").await), 1, "nothing was applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_client_is_disconnected_after_one_and_a_half_keep_alives() {
    let srv = Server::start_default();
    let api = srv.owner();
    let dev = new_device(&api, "kadev").await;
    let mut s = raw_session(&srv, &dev, 2).await;
    // A PINGREQ is answered and restarts the clock.
    s.write_all(&[0xC0, 0x00]).await.unwrap();
    let mut pong = [0u8; 2];
    s.read_exact(&mut pong).await.unwrap();
    assert_eq!(pong, [0xD0, 0x00]);
    let silent = Instant::now();
    let rest = read_until_closed(&mut s, Duration::from_secs(8)).await;
    let after = silent.elapsed();
    assert!(rest.is_some(), "still open {after:?} after the last packet with keep-alive 2 s");
    assert!(after >= Duration::from_millis(2500), "closed after {after:?}, before 1.5 × keep-alive");
    assert!(after <= Duration::from_secs(6), "closed only after {after:?}");
}

// ---------------------------------------------------------------------------------------------------
// MQTT 5 and TLS

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt5_client_gets_the_twin_and_patches_reported() {
    use rumqttc::v5::mqttbytes::v5::Packet as P5;
    use rumqttc::v5::mqttbytes::QoS as Q5;
    use rumqttc::v5::{AsyncClient as Client5, Event as E5, MqttOptions as Options5};

    let srv = Server::start_default();
    let api = srv.owner();
    let dev = new_device(&api, "v5dev").await;
    let mut o = Options5::new("v5dev", "127.0.0.1", srv.mqtt_plain_port);
    o.set_credentials(dev.username(), dev.token());
    let (client, mut el) = Client5::new(o, 16);
    match tokio::time::timeout(WAIT, el.poll()).await.expect("CONNACK in time") {
        Ok(E5::Incoming(P5::ConnAck(ack))) => {
            let props = ack.properties.expect("CONNACK properties");
            assert_eq!(props.max_qos, Some(1));
            assert_eq!(props.retain_available, Some(0));
        }
        other => panic!("unexpected {other:?}"),
    }
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, Vec<u8>)>();
    tokio::spawn(async move {
        while let Ok(ev) = el.poll().await {
            if let E5::Incoming(P5::Publish(p)) = ev {
                let _ = tx.send((String::from_utf8_lossy(&p.topic).into_owned(), p.payload.to_vec()));
            }
        }
    });
    client.publish("$iothub/twin/GET/?$rid=g5", Q5::AtLeastOnce, false, " ").await.unwrap();
    let (topic, payload) = tokio::time::timeout(WAIT, rx.recv()).await.expect("GET answer in time").expect("answer");
    assert_eq!(topic, "$iothub/twin/res/200/?$rid=g5");
    let body: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(body["reported"]["$version"], 1);
    client
        .publish(
            "$iothub/twin/PATCH/properties/reported/?$rid=p5",
            Q5::AtLeastOnce,
            false,
            json!({"v5": true}).to_string(),
        )
        .await
        .unwrap();
    let (topic, payload) = tokio::time::timeout(WAIT, rx.recv()).await.expect("PATCH answer in time").expect("answer");
    assert_eq!(topic, "$iothub/twin/res/204/?$rid=p5&$version=2");
    assert!(payload.is_empty());
    assert_eq!(api.must_get_twin("v5dev").await["properties"]["reported"]["v5"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_1_2_connection_with_the_generated_ca() {
    use rumqttc::tokio_rustls::rustls;
    let srv = Server::start_default();
    let api = srv.owner();
    let dev = new_device(&api, "tlsdev").await;
    let roots = ca_roots(&srv.ca_pem);
    // Like the Python SDK: exactly TLS 1.2, hostname checked against the certificate.
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .expect("TLS 1.2")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut o = MqttOptions::new(dev.client_id(), "localhost", srv.mqtt_port);
    o.set_credentials(dev.username(), dev.token());
    o.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(Arc::new(config))));
    let (mut d, _) = connect(o).await.unwrap_or_else(|code| panic!("TLS connect refused: {code:?}"));
    assert_eq!(d.get_twin().await["desired"]["$version"], 1);
    assert_eq!(d.patch_reported(&json!({"tls": 1.2})).await.status, 204);
    wait_connection_state(&api, "tlsdev", "Connected").await;
}

/// RFC 7386 merge as a device applies a desired push: `null` deletes, objects merge recursively.
fn merge_patch(target: &mut Value, patch: &Value) {
    let (Some(t), Some(p)) = (target.as_object_mut(), patch.as_object()) else {
        *target = patch.clone();
        return;
    };
    for (k, v) in p {
        if k.starts_with('$') {
            continue;
        }
        if v.is_null() {
            t.remove(k);
        } else if v.is_object() && t.get(k).is_some_and(Value::is_object) {
            merge_patch(t.get_mut(k).expect("checked"), v);
        } else {
            let mut fresh = json!({});
            merge_patch(&mut fresh, v);
            t.insert(k.clone(), if v.is_object() { fresh } else { v.clone() });
        }
    }
}

/// The coalescing check: 1,000 desired PATCHes to one twin in a burst while the device reads
/// slowly (it stalls during the burst, then takes 20 ms per message; QoS 1, so its acknowledgements
/// pace the server) → far fewer pushes than
/// patches, strictly increasing `$version`s, and the pushes applied in order equal the committed twin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_desired_patches_coalesces_for_a_slow_device() {
    const PATCHES: usize = 1000;
    const SENDERS: usize = 16;
    let srv = Server::start_default();
    let api = srv.owner();
    let ident = new_device(&api, "burst-dev").await;
    let (client, mut el) = AsyncClient::new(options(&srv, &ident, true), 64);
    client.subscribe("$iothub/twin/PATCH/properties/desired/#", QoS::AtLeastOnce).await.expect("queue SUBSCRIBE");
    let (tx, mut rx) = mpsc::unbounded_channel::<Option<(String, Vec<u8>)>>();
    // The device stalls (reads nothing, acknowledges nothing) until the burst has been sent, then reads
    // slowly: how fast the senders are on a loaded machine does not change what is being tested.
    let go = Arc::new(tokio::sync::Notify::new());
    let gate = go.clone();
    tokio::spawn(async move {
        let mut subscribed = false;
        loop {
            if subscribed {
                gate.notified().await;
                subscribed = false;
            }
            match el.poll().await {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let _ = tx.send(Some((p.topic.clone(), p.payload.to_vec())));
                    // A slow device: the next packet (and the PUBACK of this one) waits.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    let _ = tx.send(None);
                    subscribed = true;
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("slow device closed: {e}");
                    return;
                }
            }
        }
    });
    assert_eq!(
        tokio::time::timeout(WAIT, rx.recv()).await.expect("SUBACK in time"),
        Some(None),
        "first event is the SUBACK"
    );
    let start = api.must_get_twin("burst-dev").await;
    let mut view = user_props(&start["properties"]["desired"]);
    let start_version = desired_version(&start);

    let api = Arc::new(api);
    let mut senders = Vec::new();
    for s in 0..SENDERS {
        let api = api.clone();
        senders.push(tokio::spawn(async move {
            for i in (s..PATCHES).step_by(SENDERS) {
                // Keys come and go (nulls) so that merging has deletions to carry. (An object written
                // over a deleted key cannot merge into one patch; the hub sends those separately.)
                let patch = json!({"properties": {"desired": {
                    format!("k{s}"): {"i": i},
                    "last": i,
                    "gone": if i % 3 == 0 { Value::Null } else { json!(i) },
                }}});
                api.must_patch_twin("burst-dev", &patch).await;
            }
        }));
    }
    for s in senders {
        s.await.expect("sender");
    }
    let committed = api.must_get_twin("burst-dev").await;
    let final_version = desired_version(&committed);
    assert_eq!(final_version, start_version + PATCHES as i64, "one desired $version per PATCH");
    go.notify_one();

    let mut versions = Vec::new();
    while versions.last().copied() != Some(final_version) {
        let ev = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("device never reached $version {final_version}; saw {versions:?}"));
        let Some(Some((topic, payload))) = ev else { panic!("device connection ended after {versions:?}") };
        let v: i64 = topic.split("?$version=").nth(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{topic}"));
        let body: Value = serde_json::from_slice(&payload).expect("push is JSON");
        assert_eq!(body["$version"], json!(v), "body $version matches the topic");
        assert!(versions.last().is_none_or(|last| v > *last), "versions must strictly increase: {versions:?} then {v}");
        merge_patch(&mut view, &body);
        versions.push(v);
    }
    assert!(
        versions.len() < PATCHES / 2,
        "a slow device must get far fewer pushes than patches: {} pushes for {PATCHES} patches",
        versions.len()
    );
    assert_eq!(view, user_props(&committed["properties"]["desired"]), "the device's view equals the committed desired");
    eprintln!("{PATCHES} patches → {} pushes", versions.len());
}
