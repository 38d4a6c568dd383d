//! Fuzz entry points: every parser that faces the network, reachable from outside the crate as one
//! pure function of a byte slice each. Two drivers call them with the same inputs: the libFuzzer
//! targets in `fuzz/fuzz_targets/` (coverage-guided, for long runs by developers) and the mutation
//! driver `tests/fuzz_smoke.rs` (stable Rust, a few seconds per entry point in every test run); see
//! `fuzz/README.md`.
//!
//! Contract: no entry point panics, for any input. Each one follows the path the server takes
//! (same functions, same order, same limits) but stops where the server would do I/O: no twin layer,
//! no Raft, no sockets. Keys, host names and the clock the parsers compare against are fixed here so
//! that a crashing input reproduces anywhere.
//!
//! The module is public only so that the fuzz crate and the integration test can reach it; it is not
//! an API.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::{Bytes, BytesMut};
use rumqttd::protocol::Packet;
use serde_json::{json, Value};

use crate::auth::{verify_device_token, Permission, Policies, SasToken};
use crate::ids::TwinId;
use crate::model::Credentials;

/// The hub host name every entry point uses (as clients dial it, with port).
pub const HOST: &str = "fuzzhub.azure-devices.net:8443";

/// "Now" for SAS expiry checks, in Unix seconds (2026-11-01): seeds carry `se` values after it.
pub const NOW_SECS: i64 = 1_793_491_200;

/// Fixed base64 key of test policy `i` and of the device credentials: reproducible signatures.
fn key(i: u8) -> String {
    B64.encode([i.wrapping_mul(37).wrapping_add(11); 32])
}

/// The four built-in policies with fixed keys.
pub fn policies() -> Arc<Policies> {
    static P: OnceLock<Arc<Policies>> = OnceLock::new();
    P.get_or_init(|| {
        let mut p = Policies::generate();
        for (i, policy) in p.policies.iter_mut().enumerate() {
            let i = u8::try_from(i).unwrap_or(0);
            policy.primary_key = key(2 * i);
            policy.secondary_key = key(2 * i + 1);
        }
        Arc::new(p)
    })
    .clone()
}

/// The credentials every device identity has in these entry points (primary key `key(100)`).
pub fn device_credentials() -> Credentials {
    Credentials {
        primary_key: Some(key(100)),
        secondary_key: Some(key(101)),
        enabled: true,
        subscriptions: Vec::new(),
        auth_type: "sas".into(),
    }
}

/// A valid `SharedAccessSignature` header of policy `name` for `sr_raw` (already URL-encoded, as
/// the SDKs send it), expiring `se`. `None` for an unknown policy.
pub fn policy_token(name: &str, sr_raw: &str, se: i64) -> Option<String> {
    let policies = policies();
    let policy = policies.get(name)?;
    let sig = crate::auth::sign(&policy.primary_key, sr_raw, se)?;
    let sig = percent_encoding::utf8_percent_encode(&B64.encode(sig), percent_encoding::NON_ALPHANUMERIC).to_string();
    Some(format!("SharedAccessSignature sr={sr_raw}&sig={sig}&se={se}&skn={name}"))
}

/// A valid device token (no `skn`) for `sr_raw`, signed with the device credentials' primary key.
pub fn device_token(sr_raw: &str, se: i64) -> Option<String> {
    let sig = crate::auth::sign(&key(100), sr_raw, se)?;
    let sig = percent_encoding::utf8_percent_encode(&B64.encode(sig), percent_encoding::NON_ALPHANUMERIC).to_string();
    Some(format!("SharedAccessSignature sr={sr_raw}&sig={sig}&se={se}"))
}

// ---------------------------------------------------------------------------------------------------
// SAS tokens

/// A SAS token as an HTTP `Authorization` header or an MQTT CONNECT password: parsed, then checked
/// the three ways the server checks one (service front door, service route with resource and
/// permission, device token against device credentials).
pub fn sas_token(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let policies = policies();
    let _ = policies.verify_credential(Some(&text), HOST, NOW_SECS);
    for (resource, needed) in [
        ("devices/d1", Permission::RegistryRead),
        ("twins/d1/modules/m1", Permission::ServiceConnect),
        ("cluster/members", Permission::ClusterAdmin),
    ] {
        let _ = policies.authorize(Some(&text), HOST, resource, needed, NOW_SECS);
    }
    let Ok(token) = SasToken::parse(&text) else { return };
    let creds = device_credentials();
    let bare = HOST.split(':').next().unwrap_or(HOST);
    for host in [HOST, bare] {
        let _ = verify_device_token(&token, host, "d1", None, &creds, NOW_SECS);
        let _ = verify_device_token(&token, host, "d1", Some("m1"), &creds, NOW_SECS);
    }
    let _ = token.check(&[&key(0)], NOW_SECS);
}

// ---------------------------------------------------------------------------------------------------
// MQTT

/// Bytes a device sends on a fresh MQTT connection, handled as the connection does up to the twin
/// layer: the protocol level is sniffed from CONNECT, CONNECT is decoded and its client id, user
/// name and password (SAS token) are parsed and checked against fixed credentials; then every further
/// packet is decoded in a loop (at most 64), PUBLISH topics are classified in the identity's scope
/// (twin requests, `$rid` and the query string), reported patches are parsed and validated, and
/// SUBSCRIBE/UNSUBSCRIBE change a session. Every answer the server would send is encoded. Unlike
/// the server, it reads on whether or not CONNECT authenticates (so that a mutated token does not
/// hide everything after it); where the server closes the connection (QoS 2, a topic out of scope or
/// not UTF-8, a packet a client may not send) it stops.
pub fn mqtt_packets(data: &[u8]) {
    let _ = mqtt_session(data);
}

/// What [`mqtt_packets`] got through, so tests can check that seeds reach past CONNECT.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MqttRun {
    /// The CONNECT's SAS token verified against the fixed device credentials.
    pub authenticated: bool,
    /// Packets handled after CONNECT.
    pub packets: usize,
}

/// [`mqtt_packets`], reporting how far the input got.
pub fn mqtt_session(data: &[u8]) -> MqttRun {
    use crate::mqtt::codec::{self, Codec, Hello, Out};
    use crate::mqtt::connect::{parse_client_id, parse_username};
    use crate::mqtt::error::ConnAckCode;
    use crate::mqtt::session::Session;
    use crate::mqtt::topics::{self, Inbound, TwinRequest};

    let limits = crate::mqtt::Limits::default();
    let mut run = MqttRun::default();
    let version = match codec::sniff_connect(data, limits.max_connect) {
        Ok(Some(Hello::Level(v))) => v,
        _ => return run,
    };
    let mut codec = Codec::new(version);
    let mut buf = BytesMut::from(data);
    let Ok(Some(Packet::Connect(connect, _props, _will, _, login))) = codec.decode(&mut buf, limits.max_connect) else {
        return run;
    };
    let mut out = BytesMut::new();
    let id = match parse_client_id(&connect.client_id) {
        Ok(id) => id,
        Err(_) => TwinId::device("d1"),
    };
    if let Some(login) = &login {
        if let Ok(u) = parse_username(&login.username) {
            let _ = (
                u.param("api-version"),
                u.param("DeviceClientType"),
                u.param("model-id"),
                u.identity == Some(id.clone()),
            );
        }
        if let Ok(token) = SasToken::parse(&login.password) {
            let creds = device_credentials();
            run.authenticated =
                verify_device_token(&token, HOST, &id.device_id, id.module_id.as_deref(), &creds, NOW_SECS).is_ok();
        }
    }
    codec.encode(Out::ConnAck { session_present: false, code: ConnAckCode::Accepted, properties: None }, &mut out);

    let mut session = Session::default();
    for _ in 0..64 {
        let packet = match codec.decode(&mut buf, limits.max_packet) {
            Ok(Some(p)) => p,
            Ok(None) | Err(_) => break,
        };
        match packet {
            Packet::Publish(p, _) => {
                let header = codec::publish_header(&p);
                if header.qos >= 2 {
                    break;
                }
                let Ok(topic) = std::str::from_utf8(&p.topic) else { break };
                match topics::classify(topic, &id) {
                    Inbound::Twin { kind, rid } => {
                        if kind == TwinRequest::PatchReported {
                            let valid = serde_json::from_slice::<Value>(&p.payload)
                                .ok()
                                .is_some_and(|v| crate::model::validate_reported_patch(&v).is_ok());
                            if valid && std::str::from_utf8(&p.payload).is_ok() {
                                let _ = session.request_id(rid, &p.payload, 1, header.dup);
                            }
                        }
                        let answer = topics::response_topic(204, rid, Some(2));
                        let publish = codec::outgoing_publish(&answer, Bytes::new(), 0, 0);
                        codec.encode(Out::Publish(publish), &mut out);
                    }
                    Inbound::BadTwinQuery { rid, .. } => {
                        let answer = topics::response_topic(400, rid, None);
                        let publish = codec::outgoing_publish(&answer, Bytes::from_static(b"{}"), 0, 0);
                        codec.encode(Out::Publish(publish), &mut out);
                    }
                    Inbound::MethodResponse { rid, .. } => {
                        let answer = crate::mqtt::methods::answer_json(&p.payload);
                        assert!(
                            serde_json::from_str::<Value>(&answer).is_ok(),
                            "method answer {answer:?} for {rid:?} is not JSON"
                        );
                    }
                    Inbound::NoRid { .. } | Inbound::Telemetry | Inbound::BadMethodResponse(_) => {}
                    Inbound::OutOfScope(_) => break,
                }
                if header.qos == 1 {
                    codec.encode(Out::PubAck(header.pkid), &mut out);
                }
            }
            Packet::Subscribe(s, _) => {
                let granted: Vec<Option<u8>> =
                    s.filters.iter().map(|f| session.subscribe(&f.path, f.qos as u8)).collect();
                let _ = session.delivery_qos(&topics::desired_topic(3));
                let _ = session.delivery_qos(&topics::response_topic(200, "1", None));
                codec.encode(Out::SubAck { pkid: s.pkid, granted }, &mut out);
            }
            Packet::Unsubscribe(u, _) => {
                let existed = u.filters.iter().map(|f| session.unsubscribe(f)).collect();
                codec.encode(Out::UnsubAck { pkid: u.pkid, existed }, &mut out);
            }
            Packet::PingReq(_) => {
                codec.encode(Out::PingResp, &mut out);
            }
            Packet::PubAck(..) => {}
            _ => break,
        }
        run.packets += 1;
        out.clear();
    }
    run
}

// ---------------------------------------------------------------------------------------------------
// Twin JSON

/// A twin body as the HTTPS API and MQTT receive it: parsed as JSON and validated as a service
/// PATCH, a service PUT and a device's reported patch. The text is also checked as the front door
/// checks a service body and as a bulk entry's section is, straight from the text: those checks may
/// never accept what the parsed check refuses. Apply reads twin bodies into a tree that borrows from
/// the text (`json_tree`): it must read every text as serde_json's `Value` does, and write it back as
/// serde_json writes the `Value` (change events carry patches written by it).
pub fn twin_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let text_ok = crate::model::validate_twin_section_texts(Some(text), None).is_ok();
    let body_ok = crate::model::validate_twin_body_text(text).is_ok();
    let borrowed = crate::model::json_tree::parse(text);
    // The one text the borrowing tree refuses on purpose (serde_json's private raw-value key, which
    // `Value` would follow into a nesting without bound): nothing to compare, and `Value` must not
    // read it here either.
    if borrowed.as_ref().is_err_and(|e| e.to_string().contains(crate::model::json_tree::RESERVED_KEY)) {
        assert!(crate::model::validate::parse_json(text).is_err(), "untrusted JSON read the reserved key");
        return;
    }
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        assert!(!text_ok, "the text check accepted what does not parse");
        assert!(!body_ok, "the body text check accepted what does not parse");
        assert!(borrowed.is_err(), "the borrowing tree read what Value refuses: {borrowed:?}");
        return;
    };
    match &borrowed {
        Ok(j) => {
            assert_eq!(j.to_value(), v, "the borrowing tree read another document");
            assert_eq!(serde_json::to_string(j).ok(), serde_json::to_string(&v).ok(), "it renders other text");
            let mut written = Vec::new();
            j.write_text(&mut written);
            assert_eq!(serde_json::to_vec(&v).ok(), Some(written), "its text writer writes other text");
        }
        Err(e) => panic!("the borrowing tree refused what Value reads: {e}"),
    }
    if text_ok {
        let tree = crate::model::validate_twin_patch(&json!({ "tags": v }));
        assert!(tree.is_ok(), "the text check accepted tags the parsed check refuses: {tree:?}");
    }
    if body_ok {
        let tree = crate::model::validate_twin_patch(&v);
        assert!(tree.is_ok(), "the body text check accepted a body the parsed check refuses: {tree:?}");
    }
    let _ = crate::model::validate_twin_patch(&v);
    let _ = crate::model::validate_twin_replace(&v);
    let _ = crate::model::validate_reported_patch(&v);
    // The other service bodies read as JSON documents: a configuration (its desired paths are built
    // from flat keys), a method call, a restore's metadata.
    let _ = crate::model::config::parse("c", &v, |_| Ok(()), |_| Ok(()));
    let _ = crate::model::method::parse(&v);
    if let Ok(meta) = serde_json::from_value::<crate::model::backup::MetaBackup>(v) {
        let _ = meta.check_counters();
    }
}

// ---------------------------------------------------------------------------------------------------
// Query

fn query_docs() -> &'static [Value] {
    static DOCS: OnceLock<Vec<Value>> = OnceLock::new();
    DOCS.get_or_init(|| {
        vec![
            json!({"deviceId": "dev-1", "etag": "AAAAAAAAAAE=", "status": "enabled", "connectionState": "Connected",
                   "version": 3, "capabilities": {"iotEdge": false},
                   "x509Thumbprint": {"primaryThumbprint": null},
                   "tags": {"location": {"region": "US", "plant": "Redmond43"}, "floor": 2, "group": "a"},
                   "properties": {"desired": {"telemetryConfig": {"sendFrequencyInSecs": 300}, "$version": 4},
                                  "reported": {"telemetryConfig": {"status": "Success"}, "batteryLevel": 55.5,
                                               "ports": [80, 443], "connectivity": {"type": "cellular"}, "$version": 7}}}),
            json!({"deviceId": "Dev-2", "moduleId": "m", "status": "disabled", "version": 1,
                   "tags": {"floor": "2"}, "properties": {"reported": {"batteryLevel": "low"}}}),
            json!({"deviceId": "dev-3", "jobId": "job", "jobType": "scheduleUpdateTwin", "status": "completed",
                   "outcome": {"deviceMethodResponse": null}}),
        ]
    })
}

/// Any text as an IoT Hub query, a job `queryCondition` and a continuation token; whatever parses
/// is evaluated against fixed twins, projected, paged with its own tokens and aggregated through
/// serialized shard state (as the shards and the coordinating node do).
pub fn query(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match crate::query::parse(text) {
        Ok(q) => query_exercise(&q),
        // The error position is shown to the user as a column: it must lie within the text (or just
        // after it, for "unexpected end").
        Err(e) => assert!(
            e.position >= 1 && e.position <= text.chars().count() + 1,
            "error position {} outside the query text",
            e.position
        ),
    }
    if let Ok(c) = crate::query::parse_condition(text) {
        for d in query_docs() {
            let _ = c.matches(d);
        }
    }
    let _ = crate::query::Cursor::decode(text);
}

fn query_exercise(q: &crate::query::Query) {
    let docs = query_docs();
    let _ = q.item_type();
    let _ = q.run(docs);
    if let Some(mut p) = q.partial() {
        let Some(mut other) = q.partial() else { return };
        for (i, d) in docs.iter().enumerate() {
            if i % 2 == 0 {
                p.add(d);
            } else {
                other.add(d);
            }
        }
        // The state crosses the network as JSON between nodes: it must survive the trip.
        let wire = serde_json::to_string(&other.state()).unwrap_or_default();
        if let Ok(state) = serde_json::from_str(&wire) {
            let _ = p.merge_state(state);
        }
        let _ = p.finish();
        return;
    }
    for d in docs {
        if q.matches(d) {
            let _ = q.project(d);
        }
    }
    let mut cursor = None;
    for _ in 0..docs.len() + 1 {
        let shards = docs.iter().map(|d| q.shard_rows(std::iter::once(d), cursor.as_ref(), 1)).collect();
        let page = q.page(shards, cursor.as_ref(), 1);
        match page.next {
            Some(c) => match q.cursor(&c.encode()) {
                Ok(c) => cursor = Some(c),
                Err(e) => panic!("a continuation token of this query does not decode: {e}"),
            },
            None => break,
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// HTTPS API

/// Longest an in-memory request may take through the router before it counts as a hang (nothing here
/// waits on I/O: the twin layer is absent, so every route answers at once).
const HTTP_HANG: Duration = Duration::from_secs(10);

fn http_runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a current-thread runtime builds")
    })
}

fn http_router() -> axum::Router {
    static ROUTER: OnceLock<axum::Router> = OnceLock::new();
    ROUTER
        .get_or_init(|| {
            let state = Arc::new(crate::http::AppState {
                twins: None,
                hub: None,
                policies: policies(),
                host: HOST.into(),
                mqtt_ws: None,
                methods: None,
            });
            crate::http::router(state)
        })
        .clone()
}

/// One HTTP request, given as text in the shape of HTTP/1.1 (so seeds are readable and mutations
/// stay meaningful): a request line `METHOD target`, header lines `name: value`, an empty line, then
/// the body. Hyper would refuse a method, target or header that `http` cannot represent, so such
/// inputs (and such header lines) are dropped here too. An `Authorization` value `$policy` (e.g.
/// `$service`, `$iothubowner`) is replaced by a valid token of that policy for the whole hub, so that
/// inputs get past the credential check into routing, body parsing and validation. The request goes
/// through the real router (`crate::http::router`) with no twin layer: routes that need it answer an
/// error after their own parsing, auth and validation. The response body is read to its end.
pub fn http_request(data: &[u8]) {
    let _ = http_status(data);
}

/// [`http_request`], returning the response status (`None` for an input hyper would refuse), so
/// tests can check that seeds get past authentication.
pub fn http_status(data: &[u8]) -> Option<u16> {
    let req = http_parse(data)?;
    let router = http_router();
    http_runtime().block_on(async move {
        use tower::ServiceExt;
        let run = async {
            let Ok(resp) = router.oneshot(req).await;
            let status = resp.status().as_u16();
            let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
            status
        };
        match tokio::time::timeout(HTTP_HANG, run).await {
            Ok(status) => Some(status),
            Err(_) => panic!("the router did not answer within {HTTP_HANG:?}"),
        }
    })
}

/// The request of [`http_request`]'s text format; `None` where hyper would refuse it.
pub fn http_parse(data: &[u8]) -> Option<axum::http::Request<axum::body::Body>> {
    let (head, body) = match find(data, b"\n\n") {
        Some(i) => (&data[..i], &data[i + 2..]),
        None => (data, &[][..]),
    };
    let mut lines = head.split(|&b| b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let request_line = lines.next()?;
    let (method, target) = match find(request_line, b" ") {
        Some(i) => (&request_line[..i], &request_line[i + 1..]),
        None => (request_line, &b"/"[..]),
    };
    let method = axum::http::Method::from_bytes(method).ok()?;
    let uri = axum::http::Uri::try_from(target).ok()?;
    let mut req = axum::http::Request::builder().method(method).uri(uri);
    for line in lines {
        let Some(i) = find(line, b":") else { continue };
        let (name, value) = (&line[..i], line[i + 1..].trim_ascii());
        let Ok(name) = axum::http::HeaderName::from_bytes(name) else { continue };
        let value = if name == axum::http::header::AUTHORIZATION && value.first() == Some(&b'$') {
            let policy = String::from_utf8_lossy(&value[1..]);
            let sr = percent_encoding::utf8_percent_encode(HOST, percent_encoding::NON_ALPHANUMERIC).to_string();
            match policy_token(&policy, &sr, NOW_SECS + 365 * 24 * 3600) {
                Some(t) => t.into_bytes(),
                None => value.to_vec(),
            }
        } else {
            value.to_vec()
        };
        let Ok(value) = axum::http::HeaderValue::from_bytes(&value) else { continue };
        req = req.header(name, value);
    }
    req.body(axum::body::Body::from(body.to_vec())).ok()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

// ---------------------------------------------------------------------------------------------------
// Cluster transport

/// A body or path another node (or anyone who reaches the cluster port) sends, decoded the ways the
/// transport decodes one: the endpoint of a path, every Raft request and answer, a snapshot (head,
/// then the shard state inside), a refusal body, and the bodies of the generic calls (forwarded
/// writes and reads, read indexes, cluster-map writes, event tails, joins). Decoding happens only
/// after the signature check in the server; it is fuzzed without it, as a compromised or buggy member
/// would send.
pub fn cluster_wire(data: &[u8]) {
    use crate::cluster::transport::wire::{self, Endpoint, RpcFailure, ShardRequest};
    use crate::ids::{NodeId, ShardId};
    use crate::storage::types::TypeConfig;
    use openraft::raft::{
        AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest, VoteRequest, VoteResponse,
    };

    let text = String::from_utf8_lossy(data);
    let _ = Endpoint::parse(&text).map(|e| (e.path(), e.label()));
    let failure = RpcFailure::from_body(hyper::StatusCode::BAD_GATEWAY, data);
    let _ = (failure.status(), failure.label(), failure.to_string());

    // Requests a member serves, and re-encoding as the answer path would.
    if let Ok(r) = wire::decode::<ShardRequest<AppendEntriesRequest<TypeConfig>>>(data) {
        let _ = wire::encode(&r);
    }
    let _ = wire::decode::<ShardRequest<VoteRequest<TypeConfig>>>(data);
    let _ = wire::decode::<ShardRequest<TransferLeaderRequest<TypeConfig>>>(data);
    if let Ok(batch) = wire::decode_append_batch(data) {
        for item in &batch.items {
            let _ = wire::decode::<ShardRequest<AppendEntriesRequest<TypeConfig>>>(item);
        }
        let _ = wire::encode_append_batch(batch.wait_ms, &batch.items);
    }
    if let Ok((head, rest)) = wire::decode_snapshot(data) {
        let _ = wire::encode_snapshot(&head, rest);
        let _ = crate::model::ShardState::decode_snapshot(rest);
    }
    // Answers a member reads.
    let _ = wire::decode::<AppendEntriesResponse<TypeConfig>>(data);
    let _ = wire::decode::<VoteResponse<TypeConfig>>(data);
    let _ = wire::decode::<SnapshotResponse<TypeConfig>>(data);
    let _ = wire::decode::<Vec<Result<bytes::Bytes, RpcFailure>>>(data);
    // Generic call bodies.
    let _ = postcard::from_bytes::<(TwinId, crate::model::Command)>(data);
    let _ = postcard::from_bytes::<(ShardId, crate::twin::read::ReadOp)>(data);
    let _ = postcard::from_bytes::<ShardId>(data);
    let _ = postcard::from_bytes::<(ShardId, Option<u64>)>(data);
    let _ = serde_json::from_slice::<crate::model::Command>(data);
    let _ = serde_json::from_slice::<(NodeId, String, u32)>(data);
    // The answer of a forwarded write.
    let _ = crate::twin::read_write_answer(data);

    cluster_auth_headers(data);
    cluster_frame(data);
}

/// A frame as a node reads it from a connection: the two lengths, the head, then the body.
fn cluster_frame(data: &[u8]) {
    use crate::cluster::transport::frame;
    use std::future::Future as _;
    let run = async {
        let mut r = data;
        while let Ok(Some(head)) = frame::read_head(&mut r, 64 * 1024).await {
            let _ = frame::encode(head.id, head.kind, head.status, &head.path, &head.headers, &[]);
            if head.body_len > r.len() || frame::read_body(&mut r, head.body_len).await.is_err() {
                break;
            }
        }
    };
    // A slice never waits, so the future finishes on its first poll.
    let mut run = std::pin::pin!(run);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let _ = run.as_mut().poll(&mut cx);
}

/// The signature header of a cluster message (the first line of `data`; the rest is the body) parsed
/// against a fixed clock and checked, as a request and as a response, against a fixed secret; then
/// the body against the signed digest. Kept apart because the header scheme changes independently of
/// the wire format.
fn cluster_auth_headers(data: &[u8]) {
    use crate::cluster::transport::auth::{Claim, ClusterSecret, Nonce, HEADER_AUTH};

    const NOW_MS: u64 = NOW_SECS as u64 * 1000;
    let mut parts = data.splitn(2, |&b| b == b'\n');
    let mut headers = axum::http::HeaderMap::new();
    if let Some(Ok(v)) = parts.next().map(axum::http::HeaderValue::from_bytes) {
        headers.insert(HEADER_AUTH, v);
    }
    let body = parts.next().unwrap_or_default();
    let Ok(claim) = Claim::from_headers(&headers, NOW_MS) else { return };
    if let Ok(secret) = ClusterSecret::new(b"fuzz cluster secret") {
        let _ = claim.verify_request(&secret, "POST", "/cluster/v5/raft/append");
        let _ = claim.verify_response(&secret, 200, "/cluster/v5/raft/append", Nonce([7; 16]));
        let _ = claim.check_body(body);
    }
}
