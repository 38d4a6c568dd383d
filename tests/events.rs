//! Twin change notifications (docs/iothub-protocol.md §3.5) against the real `twinhub` binary: the SSE feed on the HTTPS
//! API (`GET /twin-changes`), resuming with `Last-Event-ID`, coalescing for a slow consumer, and the
//! embedded event broker (MQTT over TLS, policy SAS login, `twin-changes/{deviceId}` topics).

use twinhub_testkit as common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use rumqttc::{
    AsyncClient, ConnectReturnCode, ConnectionError, Event, MqttOptions, Packet, QoS, TlsConfiguration, Transport,
};
use serde_json::{json, Map, Value};

const WAIT: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------------------------------
// An SSE client

/// One SSE message.
#[derive(Debug, Clone)]
struct Msg {
    id: Option<String>,
    event: String,
    data: Value,
}

impl Msg {
    fn prop(&self, name: &str) -> &str {
        self.data["properties"][name].as_str().unwrap_or_else(|| panic!("no property {name} in {}", self.data))
    }

    fn body(&self) -> &Value {
        &self.data["body"]
    }

    fn version(&self) -> i64 {
        self.body()["version"].as_i64().unwrap_or_else(|| panic!("body without version: {}", self.data))
    }

    fn merged(&self) -> u64 {
        self.data["merged"].as_u64().unwrap_or_else(|| panic!("no merged count: {}", self.data))
    }
}

struct Sse {
    /// Read with `chunk()` (reqwest's `stream` feature, for `bytes_stream`, is not enabled).
    resp: reqwest::Response,
    buf: String,
    /// Keep-alive comments seen.
    comments: usize,
}

/// A client without reqwest's whole-request timeout (a stream may stay open for minutes).
fn stream_client(srv: &Server) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&srv.ca_pem).expect("CA");
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .https_only(true)
        .resolve("localhost", SocketAddr::from(([127, 0, 0, 1], srv.port)))
        .connect_timeout(Duration::from_secs(10))
        .build()
        .expect("client")
}

fn owner_token(srv: &Server) -> String {
    service_sas(&srv.host_name, "iothubowner", &srv.owner_key, unix_now() + 3600)
}

async fn try_sse(srv: &Server, query: &str, auth: Option<&str>, last_event_id: Option<&str>) -> reqwest::Response {
    let mut rb = stream_client(srv).get(format!("{}/twin-changes?api-version={API_VERSION}{query}", srv.base_url));
    if let Some(a) = auth {
        rb = rb.header("Authorization", a);
    }
    if let Some(id) = last_event_id {
        rb = rb.header("Last-Event-ID", id);
    }
    rb.send().await.expect("GET /twin-changes")
}

/// Opens the feed as iothubowner; `query` is appended (e.g. `&deviceId=d1`).
async fn sse(srv: &Server, query: &str, last_event_id: Option<&str>) -> Sse {
    let r = try_sse(srv, query, Some(&owner_token(srv)), last_event_id).await;
    assert_eq!(r.status(), 200, "GET /twin-changes");
    let ct = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    assert!(ct.starts_with("text/event-stream"), "content type {ct}");
    Sse { resp: r, buf: String::new(), comments: 0 }
}

impl Sse {
    /// The next message, or `None` if none arrives within `wait`.
    async fn next_within(&mut self, wait: Duration) -> Option<Msg> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (None, String::new(), None);
                let mut comment = false;
                for line in block.lines() {
                    if let Some(c) = line.strip_prefix(':') {
                        assert_eq!(c.trim(), "keep-alive", "unexpected comment {line:?}");
                        comment = true;
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.to_string());
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        event = v.to_string();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        assert!(data.is_none(), "data must be one line: {block:?}");
                        data = Some(serde_json::from_str(v).unwrap_or_else(|e| panic!("data is not JSON ({e}): {v}")));
                    } else if !line.is_empty() {
                        panic!("unexpected SSE line {line:?}");
                    }
                }
                if comment && data.is_none() {
                    self.comments += 1;
                    continue;
                }
                return Some(Msg {
                    id,
                    event,
                    data: data.unwrap_or_else(|| panic!("message without data: {block:?}")),
                });
            }
            let chunk = match tokio::time::timeout_at(deadline, self.resp.chunk()).await {
                Err(_) => return None,
                Ok(Ok(None)) => panic!("SSE stream ended"),
                Ok(Err(e)) => panic!("SSE stream failed: {e}"),
                Ok(Ok(Some(b))) => b,
            };
            self.buf.push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        }
    }

    async fn next(&mut self) -> Msg {
        self.next_within(WAIT).await.expect("an SSE message within 15 s")
    }

    async fn assert_quiet(&mut self) {
        if let Some(m) = self.next_within(Duration::from_millis(300)).await {
            panic!("expected no message, got {m:?}");
        }
    }
}

fn id_seq(m: &Msg) -> u64 {
    let id = m.id.as_deref().unwrap_or_else(|| panic!("message without id: {m:?}"));
    id.rsplit_once('-').and_then(|(_, s)| s.parse().ok()).unwrap_or_else(|| panic!("id is not epoch-seq: {id}"))
}

fn assert_timestamp(s: &str) {
    let b = s.as_bytes();
    assert!(
        b.len() == 24 && b[4] == b'-' && b[10] == b'T' && b[19] == b'.' && b[23] == b'Z',
        "operationTimestamp {s:?} is not ISO-8601 UTC with milliseconds"
    );
}

/// Common checks of a twin change event.
fn assert_twin_change(m: &Msg, device: &str, module: Option<&str>, op: &str) {
    assert_eq!(m.event, "twinChangeEvents", "{m:?}");
    assert_eq!(m.prop("iothub-message-source"), "twinChangeEvents");
    assert_eq!(m.prop("iothub-message-schema"), "twinChangeNotification");
    assert_eq!(m.prop("opType"), op);
    assert_eq!(m.prop("hubName"), "localhost");
    assert_eq!(m.prop("deviceId"), device);
    assert_eq!(m.data["properties"].get("moduleId").and_then(Value::as_str), module);
    assert_timestamp(m.prop("operationTimestamp"));
    assert!(m.id.is_some());
}

// ---------------------------------------------------------------------------------------------------
// SSE

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twin_writes_and_identity_changes_produce_iot_hub_events() {
    let srv = Server::start_default();
    let api = srv.owner();
    let mut feed = sse(&srv, "", None).await;

    api.must_create_device("d1").await;
    let m = feed.next().await;
    assert_eq!(m.event, "deviceLifecycleEvents");
    assert_eq!(m.prop("opType"), "createDeviceIdentity");
    assert_eq!(m.prop("iothub-message-schema"), "deviceLifecycleNotification");
    assert_eq!(m.prop("iothub-message-source"), "deviceLifecycleEvents");
    assert_eq!(m.prop("deviceId"), "d1");
    assert_eq!(m.body()["deviceId"], "d1");
    assert_eq!(m.version(), 1);
    let mut last = id_seq(&m);

    // Desired PATCH: the patch with `$metadata` and `$version`, and the twin version.
    let twin = api.must_patch_twin("d1", &json!({"properties": {"desired": {"interval": 5, "cfg": {"a": 1}}}})).await;
    let m = feed.next().await;
    assert_twin_change(&m, "d1", None, "updateTwin");
    assert_eq!(m.version(), twin_version(&twin));
    let d = &m.body()["properties"]["desired"];
    assert_eq!((d["interval"].clone(), d["cfg"].clone()), (json!(5), json!({"a": 1})));
    assert_eq!(d["$version"].as_i64(), Some(desired_version(&twin)));
    assert_eq!(d["$metadata"]["interval"]["$lastUpdatedVersion"].as_i64(), Some(desired_version(&twin)));
    assert_eq!(
        d["$metadata"]["cfg"]["a"]["$lastUpdated"],
        twin["properties"]["desired"]["$metadata"]["cfg"]["a"]["$lastUpdated"]
    );
    assert!(m.body().get("tags").is_none());
    assert_eq!(m.merged(), 1);
    assert!(id_seq(&m) > last);
    last = id_seq(&m);

    // A removal carries the null.
    let twin = api.must_patch_twin("d1", &json!({"properties": {"desired": {"cfg": null}}})).await;
    let m = feed.next().await;
    assert_eq!(m.body()["properties"]["desired"]["cfg"], Value::Null);
    assert!(m.body()["properties"]["desired"].as_object().unwrap().contains_key("cfg"));
    assert_eq!(m.version(), twin_version(&twin));

    // Tags PATCH: tags only.
    let twin = api.must_patch_twin("d1", &json!({"tags": {"site": {"building": "43"}}})).await;
    let m = feed.next().await;
    assert_twin_change(&m, "d1", None, "updateTwin");
    assert_eq!(m.body(), &json!({"version": twin_version(&twin), "tags": {"site": {"building": "43"}}}));
    assert!(id_seq(&m) > last);

    // PUT: the full twin.
    let twin = api
        .must_ok("PUT", "/twins/d1", Some(&json!({"tags": {"t": 1}, "properties": {"desired": {"y": 2}}})), &[])
        .await;
    let m = feed.next().await;
    assert_twin_change(&m, "d1", None, "replaceTwin");
    assert_eq!(m.body()["deviceId"], "d1");
    assert_eq!(m.version(), twin_version(&twin));
    assert_eq!(m.body()["tags"], json!({"t": 1}));
    assert_eq!(user_props(&m.body()["properties"]["desired"]), json!({"y": 2}));
    assert_eq!(m.body()["etag"], twin["etag"]);

    // Modules carry moduleId.
    api.must_create_module("d1", "m1").await;
    let m = feed.next().await;
    assert_eq!(
        (m.event.as_str(), m.prop("opType"), m.prop("moduleId")),
        ("deviceLifecycleEvents", "createModuleIdentity", "m1")
    );
    let twin = api.must_ok("PATCH", "/twins/d1/modules/m1", Some(&json!({"tags": {"mt": true}})), &[]).await;
    let m = feed.next().await;
    assert_twin_change(&m, "d1", Some("m1"), "updateTwin");
    assert_eq!(m.body()["tags"]["mt"], true);
    assert_eq!(m.version(), twin_version(&twin));

    // Deleting the device deletes its module first.
    api.must(204, "DELETE", "/devices/d1", None, &[]).await;
    let m = feed.next().await;
    assert_eq!((m.prop("opType"), m.prop("moduleId")), ("deleteModuleIdentity", "m1"));
    let m = feed.next().await;
    assert_eq!(m.prop("opType"), "deleteDeviceIdentity");
    assert_eq!(m.body()["deviceId"], "d1");
    feed.assert_quiet().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_filter_selects_one_device() {
    let srv = Server::start_default();
    let api = srv.owner();
    let mut only_b = sse(&srv, "&deviceId=b", None).await;
    let mut only_bm = sse(&srv, "&deviceId=b&moduleId=m", None).await;
    for d in ["a", "b"] {
        api.must_create_device(d).await;
        api.must_create_module(d, "m").await;
        api.must_patch_twin(d, &json!({"tags": {"x": 1}})).await;
    }
    let got: Vec<(String, Option<String>)> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            let m = only_b.next().await;
            v.push((
                m.prop("deviceId").to_string(),
                m.data["properties"].get("moduleId").and_then(Value::as_str).map(str::to_string),
            ));
        }
        v
    };
    assert!(got.iter().all(|(d, _)| d == "b"), "{got:?}");
    assert_eq!(got.iter().filter(|(_, m)| m.is_some()).count(), 1);
    only_b.assert_quiet().await;
    let m = only_bm.next().await;
    assert_eq!((m.prop("deviceId"), m.prop("moduleId")), ("b", "m"));
    only_bm.assert_quiet().await;
    // moduleId alone is refused.
    let r = try_sse(&srv, "&moduleId=m", Some(&owner_token(&srv)), None).await;
    assert_eq!(r.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_with_last_event_id_replays_exactly_what_was_missed() {
    let srv = Server::start_default();
    let api = srv.owner();
    let mut feed = sse(&srv, "", None).await;
    api.must_create_device("r").await;
    let created = feed.next().await;
    let mut versions = Vec::new();
    for i in 0..3 {
        let t = api.must_patch_twin("r", &json!({"properties": {"desired": {"i": i}}})).await;
        versions.push(twin_version(&t));
        assert_eq!(feed.next().await.version(), *versions.last().unwrap());
    }
    // Disconnected: five writes happen meanwhile.
    drop(feed);
    for i in 3..8 {
        let t = api.must_patch_twin("r", &json!({"tags": {"i": i}})).await;
        versions.push(twin_version(&t));
    }
    let resume_from = created.id.clone().unwrap();
    let mut feed = sse(&srv, "", Some(&resume_from)).await;
    let mut seqs = vec![id_seq(&created)];
    for (n, v) in versions.iter().enumerate() {
        let m = feed.next().await;
        assert_eq!(m.version(), *v, "replayed event {n}");
        assert_eq!(m.merged(), 1, "replay is exact, not coalesced");
        assert!(id_seq(&m) > *seqs.last().unwrap());
        seqs.push(id_seq(&m));
        if n < 3 {
            assert_eq!(m.body()["properties"]["desired"]["i"], n);
        } else {
            assert_eq!(m.body()["tags"]["i"], n);
        }
    }
    // Then live.
    let t = api.must_patch_twin("r", &json!({"tags": {"live": true}})).await;
    let m = feed.next().await;
    assert_eq!(m.version(), twin_version(&t));
    feed.assert_quiet().await;

    // Resuming from the last event seen gives nothing old; `?lastEventId=` works like the header.
    let last = m.id.clone().unwrap();
    let mut again = sse(&srv, &format!("&lastEventId={last}"), None).await;
    again.assert_quiet().await;
    let t = api.must_patch_twin("r", &json!({"tags": {"after": 1}})).await;
    assert_eq!(again.next().await.version(), twin_version(&t));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_last_event_id_resyncs_then_streams_live() {
    let srv = Server::start_default();
    let api = srv.owner();
    api.must_create_device("x").await;
    for bogus in ["0123456789abcdef-1", "not-a-position", "garbage"] {
        let mut feed = sse(&srv, "", Some(bogus)).await;
        let m = feed.next().await;
        assert_eq!(m.event, "resync", "{bogus}: {m:?}");
        assert!(m.data["reason"].as_str().is_some_and(|r| !r.is_empty()), "{m:?}");
        let pos = m.data["position"].as_str().expect("position").to_string();
        assert_eq!(m.id.as_deref(), Some(pos.as_str()));
        let t = api.must_patch_twin("x", &json!({"tags": {"b": bogus}})).await;
        let m = feed.next().await;
        assert_eq!(m.version(), twin_version(&t), "{bogus}: live after the resync");
        assert!(id_seq(&m) > pos.rsplit_once('-').unwrap().1.parse::<u64>().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_needs_a_service_connect_token() {
    let srv = Server::start_default();
    srv.api_raw_auth(None).must_err(401, "IotHubUnauthorizedAccess", "GET", "/twin-changes", None, &[]).await;
    srv.api_raw_auth(Some("SharedAccessSignature sr=localhost&sig=AAAA&se=9999999999&skn=iothubowner"))
        .must_err(401, "IotHubUnauthorizedAccess", "GET", "/twin-changes", None, &[])
        .await;
    srv.api("registryRead", &srv.policy_key("registryRead"))
        .must_err(401, "IotHubUnauthorizedAccess", "GET", "/twin-changes", None, &[])
        .await;
    // The `service` policy has ServiceConnect.
    let token = service_sas(&srv.host_name, "service", &srv.policy_key("service"), unix_now() + 3600);
    let r = try_sse(&srv, "", Some(&token), None).await;
    assert_eq!(r.status(), 200);
}

/// A node holds at most `--max-change-feeds` streams for clients; the next is refused as busy (503 with
/// Retry-After), and a stream that closes frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_feed_streams_are_bounded_and_a_closed_one_frees_its_place() {
    let srv =
        Server::start(ServerOpts { extra_args: vec!["--max-change-feeds".into(), "3".into()], ..Default::default() });
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(sse(&srv, "", None).await);
    }
    let r = try_sse(&srv, "", Some(&owner_token(&srv)), None).await;
    assert_eq!(r.status(), 503, "a fourth stream");
    assert!(r.headers().contains_key("retry-after"));
    let body = r.text().await.expect("body");
    assert!(body.contains("ServerBusy") && body.contains("change-feed streams"), "{body}");
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = try_sse(&srv, "", Some(&owner_token(&srv)), None).await;
        if r.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the closed stream's place was not freed: {}", r.status());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------------
// Coalescing for a slow consumer

/// What a back end does with the events of one twin: start from the created twin, apply each update's
/// sections as merge patches (`$metadata` guided by the patch), take `$version` and `version`.
fn apply_patch(doc: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (k, v) in patch {
        match v {
            Value::Null => {
                doc.remove(k);
            }
            Value::Object(p) => {
                let t = doc.entry(k.clone()).or_insert_with(|| json!({}));
                if !t.is_object() {
                    *t = json!({});
                }
                apply_patch(t.as_object_mut().unwrap(), p);
            }
            other => {
                doc.insert(k.clone(), other.clone());
            }
        }
    }
}

/// `$metadata` of a section after a patch: own `$`-members from the event, recursion where the patch
/// value is an object, the event's subtree (or removal) elsewhere; untouched keys keep theirs.
fn apply_metadata(doc: &mut Map<String, Value>, patch: &Map<String, Value>, meta: &Map<String, Value>) {
    for (k, v) in meta.iter().filter(|(k, _)| k.starts_with('$')) {
        doc.insert(k.clone(), v.clone());
    }
    for (k, pv) in patch {
        match (pv, meta.get(k)) {
            (Value::Object(p), Some(Value::Object(m))) => match doc.get_mut(k) {
                Some(Value::Object(d)) => apply_metadata(d, p, m),
                _ => {
                    doc.insert(k.clone(), Value::Object(m.clone()));
                }
            },
            (_, Some(m)) => {
                doc.insert(k.clone(), m.clone());
            }
            (_, None) => {
                doc.remove(k);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumer_gets_coalesced_events_that_add_up_to_the_committed_twin() {
    const WRITES: usize = 1000;
    let srv = Server::start_default();
    let api = srv.owner();
    let mut feed = sse(&srv, "&deviceId=slow", None).await;
    api.must_create_device("slow").await;
    let created = feed.next().await;
    assert_eq!(created.prop("opType"), "createDeviceIdentity");
    let mut desired = created.body()["properties"]["desired"].as_object().cloned().expect("desired");

    // The consumer stops reading. ~20 KB per event fills the socket buffers after a few hundred
    // events; everything after that waits in the hub, where it coalesces.
    // (String values are limited to 4 KB, desired to 32 KB.)
    let blob = "x".repeat(3_900);
    let writes = futures::stream::iter(0..WRITES)
        .map(|i| {
            let api = api.clone();
            let mut d = json!({"n": i, format!("k{}", i % 10): i});
            for b in 0..5 {
                d[format!("blob{b}")] = json!(format!("{i}{blob}"));
            }
            if i % 7 == 0 {
                d[format!("k{}", (i + 3) % 10)] = Value::Null;
            }
            async move { api.must_patch_twin("slow", &json!({"properties": {"desired": d}})).await }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    assert_eq!(writes.len(), WRITES);
    let twin = api.must_get_twin("slow").await;
    let final_version = twin_version(&twin);
    assert_eq!(final_version, 1 + WRITES as i64);

    // Now read everything.
    let (mut events, mut merged_total, mut last_version, mut last_seq) = (0, 0, created.version(), id_seq(&created));
    while last_version < final_version {
        let m = feed.next().await;
        assert_twin_change(&m, "slow", None, "updateTwin");
        assert!(m.version() > last_version, "versions must strictly increase: {} after {last_version}", m.version());
        assert!(id_seq(&m) > last_seq, "positions must strictly increase");
        last_version = m.version();
        last_seq = id_seq(&m);
        events += 1;
        merged_total += m.merged();
        let section = m.body()["properties"]["desired"].as_object().expect("desired section");
        let patch: Map<String, Value> =
            section.iter().filter(|(k, _)| !k.starts_with('$')).map(|(k, v)| (k.clone(), v.clone())).collect();
        apply_patch(&mut desired, &patch);
        let mut meta = desired.remove("$metadata").and_then(|m| m.as_object().cloned()).unwrap_or_default();
        apply_metadata(&mut meta, &patch, section["$metadata"].as_object().expect("$metadata"));
        desired.insert("$metadata".into(), Value::Object(meta));
        desired.insert("$version".into(), section["$version"].clone());
    }
    feed.assert_quiet().await;
    eprintln!("slow consumer: {events} events for {WRITES} writes");
    assert_eq!(merged_total, WRITES as u64, "every committed change is accounted for exactly once");
    assert!(events < WRITES / 2, "expected far fewer events than writes, got {events}");
    assert_eq!(
        Value::Object(desired),
        twin["properties"]["desired"],
        "the consumer's desired section (values, $metadata, $version) is the committed one"
    );
}

// ---------------------------------------------------------------------------------------------------
// The event broker

fn broker_options(srv: &Server, client_id: &str) -> MqttOptions {
    let mut o = MqttOptions::new(client_id, "localhost", srv.events_port);
    o.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(tls_client_config(&srv.ca_pem))));
    o.set_keep_alive(Duration::from_secs(30));
    o.set_max_packet_size(2 * 1024 * 1024, 64 * 1024);
    o
}

/// Polls until the CONNACK (or the refusal).
async fn broker_connect(o: MqttOptions) -> Result<(AsyncClient, rumqttc::EventLoop), ConnectionError> {
    let (client, mut el) = AsyncClient::new(o, 64);
    loop {
        match tokio::time::timeout(WAIT, el.poll()).await.expect("CONNACK in time")? {
            Event::Incoming(Packet::ConnAck(a)) => {
                assert_eq!(a.code, ConnectReturnCode::Success);
                return Ok((client, el));
            }
            _ => continue,
        }
    }
}

/// Polls until a PUBLISH arrives; `None` if the connection ends or nothing comes within `wait`.
async fn next_publish(el: &mut rumqttc::EventLoop, wait: Duration) -> Option<(String, Value)> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, el.poll()).await {
            Err(_) | Ok(Err(_)) => return None,
            Ok(Ok(Event::Incoming(Packet::Publish(p)))) => {
                let v = serde_json::from_slice(&p.payload).expect("payload is JSON");
                return Some((p.topic, v));
            }
            Ok(Ok(_)) => continue,
        }
    }
}

async fn subscribe(client: &AsyncClient, el: &mut rumqttc::EventLoop, filter: &str) {
    client.subscribe(filter, QoS::AtMostOnce).await.expect("subscribe");
    loop {
        match tokio::time::timeout(WAIT, el.poll()).await.expect("SUBACK in time").expect("connection") {
            Event::Incoming(Packet::SubAck(_)) => return,
            _ => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_refuses_missing_and_bad_tokens() {
    let srv = Server::start_default();
    let refused = |r: Result<(AsyncClient, rumqttc::EventLoop), ConnectionError>, what: &str| match r {
        Err(ConnectionError::ConnectionRefused(code)) => code,
        Err(e) => panic!("{what}: expected a CONNACK refusal, got {e:?}"),
        Ok(_) => panic!("{what}: connected"),
    };
    let code = refused(broker_connect(broker_options(&srv, "anon")).await, "no credentials");
    assert_eq!(code, ConnectReturnCode::NotAuthorized);

    let mut o = broker_options(&srv, "bad");
    let wrong_key = service_sas(&srv.host_name, "iothubowner", &srv.policy_key("service"), unix_now() + 3600);
    o.set_credentials("iothubowner", wrong_key);
    assert_eq!(refused(broker_connect(o).await, "wrong key"), ConnectReturnCode::BadUserNamePassword);

    let mut o = broker_options(&srv, "expired");
    o.set_credentials("iothubowner", service_sas(&srv.host_name, "iothubowner", &srv.owner_key, unix_now() - 10));
    assert_eq!(refused(broker_connect(o).await, "expired"), ConnectReturnCode::BadUserNamePassword);

    let mut o = broker_options(&srv, "noperm");
    o.set_credentials(
        "registryRead",
        service_sas(&srv.host_name, "registryRead", &srv.policy_key("registryRead"), unix_now() + 3600),
    );
    assert_eq!(refused(broker_connect(o).await, "registryRead"), ConnectReturnCode::NotAuthorized);

    let mut o = broker_options(&srv, "mismatch");
    o.set_credentials("service", owner_token(&srv));
    assert_eq!(refused(broker_connect(o).await, "username is not the policy"), ConnectReturnCode::BadUserNamePassword);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_delivers_twin_changes_to_authorised_subscribers() {
    let srv = Server::start_default();
    let api = srv.owner();
    // The `service` policy, token for the bare host name (no port).
    let mut o = broker_options(&srv, "backend-1");
    o.set_credentials("service", service_sas("localhost", "service", &srv.policy_key("service"), unix_now() + 3600));
    let (all, mut all_el) = broker_connect(o).await.expect("service policy connects");
    subscribe(&all, &mut all_el, "twin-changes/#").await;
    let mut o = broker_options(&srv, "backend-2");
    o.set_credentials("iothubowner", owner_token(&srv));
    let (one, mut one_el) = broker_connect(o).await.expect("owner connects");
    subscribe(&one, &mut one_el, "twin-changes/other").await;

    api.must_create_device("dev").await;
    let (topic, v) = next_publish(&mut all_el, WAIT).await.expect("lifecycle event");
    assert_eq!(topic, "twin-changes/dev");
    assert_eq!(v["properties"]["opType"], "createDeviceIdentity");
    assert_eq!(v["properties"]["iothub-message-source"], "deviceLifecycleEvents");
    let first_position = v["position"].as_str().expect("position").to_string();

    let twin = api.must_patch_twin("dev", &json!({"properties": {"desired": {"speed": 3}}})).await;
    let (topic, v) = next_publish(&mut all_el, WAIT).await.expect("twin change");
    assert_eq!(topic, "twin-changes/dev");
    assert_eq!(v["properties"]["opType"], "updateTwin");
    assert_eq!(v["properties"]["iothub-message-schema"], "twinChangeNotification");
    assert_eq!(v["properties"]["deviceId"], "dev");
    assert_eq!(v["body"]["version"].as_i64(), Some(twin_version(&twin)));
    assert_eq!(v["body"]["properties"]["desired"]["speed"], 3);
    assert_eq!(v["merged"], 1);
    assert_ne!(v["position"].as_str(), Some(first_position.as_str()));

    api.must_create_module("dev", "mod").await;
    let (topic, v) = next_publish(&mut all_el, WAIT).await.expect("module event");
    assert_eq!(topic, "twin-changes/dev/mod");
    assert_eq!(v["properties"]["moduleId"], "mod");

    // The subscriber of another device's topic got nothing of this.
    assert!(next_publish(&mut one_el, Duration::from_millis(500)).await.is_none());
    api.must_create_device("other").await;
    let (topic, _) = next_publish(&mut one_el, WAIT).await.expect("event of the subscribed device");
    assert_eq!(topic, "twin-changes/other");
}

/// A bulk call publishes its events all at once, so the broker hands them to its subscribers in
/// batches: each arrives once, on its own topic, in feed order, none lost between batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_events_reaches_a_subscriber_whole_and_in_order() {
    const DEVICES: usize = 300;
    let srv = Server::start_default();
    let mut o = broker_options(&srv, "burst");
    o.set_credentials("iothubowner", owner_token(&srv));
    let (sub, mut el) = broker_connect(o).await.expect("owner connects");
    subscribe(&sub, &mut el, "twin-changes/#").await;
    // Three bulk calls of 100 (the most one takes) at once.
    let api = srv.owner();
    let calls = (0..DEVICES / 100).map(|c| {
        let entries: Vec<Value> =
            (c * 100..(c + 1) * 100).map(|i| json!({"id": format!("burst-{i:03}"), "importMode": "create"})).collect();
        let api = &api;
        async move { api.send("POST", "/devices", Some(&Value::Array(entries)), &[]).await }
    });
    for r in futures::future::join_all(calls).await {
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut last_seq = 0;
    while seen.len() < DEVICES {
        let (topic, v) = next_publish(&mut el, WAIT).await.unwrap_or_else(|| panic!("only {} events", seen.len()));
        assert_eq!(v["properties"]["opType"], "createDeviceIdentity", "{v}");
        let device = v["properties"]["deviceId"].as_str().expect("deviceId").to_string();
        assert_eq!(topic, format!("twin-changes/{device}"));
        let seq: u64 = v["position"].as_str().and_then(|p| p.rsplit_once('-')).expect("position").1.parse().unwrap();
        assert!(seq > last_seq, "position {seq} after {last_seq}");
        last_seq = seq;
        assert!(seen.insert(device.clone()), "{device} twice");
    }
    assert!(next_publish(&mut el, Duration::from_millis(500)).await.is_none(), "nothing more than the burst");
}

/// What back ends can make the broker keep is bounded: distinct subscription filters (rumqttd keeps
/// a log for each for good) up to `--max-event-filters`, and a keep-alive of 0 ("never", which rumqttd
/// refuses outright) becomes the node's maximum instead of a dropped connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscription_filters_are_bounded_and_keep_alive_zero_is_served() {
    let srv =
        Server::start(ServerOpts { extra_args: vec!["--max-event-filters".into(), "3".into()], ..Default::default() });
    let mut o = broker_options(&srv, "filters-1");
    o.set_credentials("iothubowner", owner_token(&srv));
    o.set_keep_alive(Duration::ZERO);
    let (first, mut first_el) = broker_connect(o).await.expect("keep-alive 0 connects");
    for filter in ["twin-changes/a", "twin-changes/b", "twin-changes/#"] {
        subscribe(&first, &mut first_el, filter).await;
    }
    // A fourth distinct filter, from a back end without a client id: its connection is closed.
    let mut o = broker_options(&srv, "");
    o.set_credentials("iothubowner", owner_token(&srv));
    let (second, mut second_el) = broker_connect(o).await.expect("a back end without an id connects");
    second.subscribe("twin-changes/c", QoS::AtMostOnce).await.expect("subscribe");
    let closed = async {
        loop {
            match second_el.poll().await {
                Err(_) => return true,
                Ok(Event::Incoming(Packet::SubAck(_))) => return false,
                Ok(_) => continue,
            }
        }
    };
    assert!(tokio::time::timeout(WAIT, closed).await.expect("an answer in time"), "a fourth filter was taken");
    // A filter already kept is still open to anyone, and delivers.
    let mut o = broker_options(&srv, "");
    o.set_credentials("iothubowner", owner_token(&srv));
    let (third, mut third_el) = broker_connect(o).await.expect("connects again");
    subscribe(&third, &mut third_el, "twin-changes/a").await;
    srv.owner().must_create_device("a").await;
    let (topic, _) = next_publish(&mut third_el, WAIT).await.expect("event on a kept filter");
    assert_eq!(topic, "twin-changes/a");
    let (topic, _) = next_publish(&mut first_el, WAIT).await.expect("event for the first back end");
    assert_eq!(topic, "twin-changes/a");
    let page = srv.http_client().get(format!("{}/metrics", srv.base_url)).send().await.expect("metrics");
    let page = page.text().await.expect("metrics text");
    for want in ["twinhub_notify_broker_filters_refused_total 1", "twinhub_notify_broker_filters 3"] {
        assert!(page.lines().any(|l| l == want), "no '{want}' in /metrics");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_ends_cannot_forge_events() {
    let srv = Server::start_default();
    let mut o = broker_options(&srv, "listener");
    o.set_credentials("iothubowner", owner_token(&srv));
    let (sub, mut sub_el) = broker_connect(o).await.unwrap();
    subscribe(&sub, &mut sub_el, "twin-changes/#").await;

    let mut o = broker_options(&srv, "forger");
    o.set_credentials("iothubowner", owner_token(&srv));
    let (forger, mut forger_el) = broker_connect(o).await.unwrap();
    forger.publish("twin-changes/victim", QoS::AtMostOnce, false, r#"{"forged":true}"#).await.unwrap();
    // The forger's connection is closed...
    let closed = async {
        loop {
            if forger_el.poll().await.is_err() {
                return;
            }
        }
    };
    tokio::time::timeout(WAIT, closed).await.expect("a publishing client is disconnected");
    // ...and nothing reached the subscriber.
    assert!(next_publish(&mut sub_el, Duration::from_millis(500)).await.is_none());
    // Real events still flow.
    srv.owner().must_create_device("victim").await;
    let (topic, v) = next_publish(&mut sub_el, WAIT).await.expect("real event");
    assert_eq!(topic, "twin-changes/victim");
    assert!(v.get("forged").is_none());
}

// ---------------------------------------------------------------------------------------------------
// Connection state: device connections over MQTT

fn device_token(host: &str, device: &str, key: &str, expiry: u64) -> String {
    common::device_token(host, device, None, key, expiry)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_connections_count_and_produce_connection_state_events() {
    let srv = Server::start_default();
    let api = srv.owner();
    let doc = api.must_create_device("cd").await;
    let key = doc.pointer("/authentication/symmetricKey/primaryKey").and_then(Value::as_str).unwrap().to_string();
    let mut feed = sse(&srv, "&deviceId=cd", None).await;
    assert_eq!(api.must_get("/statistics/service").await["connectedDeviceCount"], 0);

    let mut o = MqttOptions::new("cd", "127.0.0.1", srv.mqtt_plain_port);
    o.set_credentials("localhost/cd/?api-version=2021-04-12", device_token("localhost", "cd", &key, unix_now() + 3600));
    let (client, mut el) = broker_connect(o).await.expect("device connects");
    let pump = tokio::spawn(async move { while el.poll().await.is_ok() {} });

    let m = feed.next().await;
    assert_eq!(m.event, "deviceConnectionStateEvents");
    assert_eq!(m.prop("opType"), "deviceConnected");
    assert_eq!(m.prop("iothub-message-schema"), "deviceConnectionStateNotification");
    let seq = m.body()["sequenceNumber"].as_str().expect("sequenceNumber").to_string();
    assert!(seq.len() >= 16 && seq.bytes().all(|b| b.is_ascii_hexdigit()), "{seq}");
    let mut count = HashMap::new();
    for _ in 0..50 {
        let c = api.must_get("/statistics/service").await["connectedDeviceCount"].clone();
        *count.entry(c.to_string()).or_insert(0) += 1;
        if c == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(api.must_get("/statistics/service").await["connectedDeviceCount"], 1, "{count:?}");

    client.disconnect().await.unwrap();
    let m = feed.next().await;
    assert_eq!(m.prop("opType"), "deviceDisconnected");
    let seq2 = m.body()["sequenceNumber"].as_str().unwrap().to_string();
    assert!(seq2 > seq, "sequence numbers order connection events: {seq2} after {seq}");
    let _ = pump.await;
    for _ in 0..50 {
        if api.must_get("/statistics/service").await["connectedDeviceCount"] == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("connectedDeviceCount did not return to 0");
}

// ---------------------------------------------------------------------------------------------------
// Shutdown

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_streams_do_not_hold_up_shutdown() {
    let mut srv = Server::start_default();
    let mut feed = sse(&srv, "", None).await;
    let mut o = broker_options(&srv, "watcher");
    o.set_credentials("iothubowner", owner_token(&srv));
    let (_sub, mut el) = broker_connect(o).await.unwrap();
    subscribe(&_sub, &mut el, "twin-changes/#").await;
    srv.owner().must_create_device("s").await;
    assert_eq!(feed.next().await.prop("opType"), "createDeviceIdentity");
    let started = std::time::Instant::now();
    let status = tokio::task::spawn_blocking(move || {
        let st = srv.sigterm();
        (st, srv)
    })
    .await
    .unwrap()
    .0;
    assert!(status.success(), "exit status {status:?}");
    assert!(started.elapsed() < Duration::from_secs(8), "shutdown took {:?}", started.elapsed());
}
