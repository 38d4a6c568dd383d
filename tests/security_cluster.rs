//! The inter-node (cluster) port under attack, against real `twinhub` processes: `twinhub cluster up`
//! starts three nodes on loopback, and the test talks to their cluster ports with a raw client of the
//! inter-node frames holding a member's TLS certificate (the second line of defence: what the signatures stop even a
//! certificate holder from doing; `tests/cluster_tls.rs` covers strangers without one), then checks
//! that the cluster still serves clients.
//!
//! (a) an unsigned request is refused, and the refusal carries no signature (no signing oracle);
//! (b) a correctly signed request (the test knows the secret from `cluster.json`, as a member does)
//!     works once, and the same bytes sent again are refused; so is a tampered body;
//!     and a request signed as node 3 on node 2's TLS connection is refused (a certificate speaks
//!     for its node only);
//! (c) the signed answer of (b), sent back as a request, is refused;
//! (d) twelve concurrent 60 MiB uploads without a valid signature are refused before their bodies
//!     are read: the node's RSS stays flat and the refusals are quick;
//! (e) afterwards a write through one node's HTTPS API is read back through another.
//!
//! The signing code here is written from the protocol's description (`cluster::transport::auth`), not
//! borrowed from the server, so it also pins the wire format.

use twinhub_testkit as common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use common::cluster::*;
use hmac::{Hmac, Mac};
use hyper::header::HeaderValue;
use hyper::{HeaderMap, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const SHARDS: u32 = 2;
const STATUS_PATH: &str = "/cluster/v5/call/node.status";
/// The one header that carries a message's signed fields and MAC.
const AUTH_HEADER: &str = "x-twinhub-auth";
/// Generous: a debug build on a loaded 2-core machine.
const IO_WAIT: Duration = Duration::from_secs(30);

const UPLOADS: usize = 12;
const UPLOAD_BYTES: u64 = 60 << 20;
const CHUNK: usize = 1 << 20;

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_millis() as u64
}

/// The 72 signed bytes: node id, timestamp, nonce and body length (big-endian), and the body's SHA-256.
fn fields(node: u64, ts: u64, nonce: &[u8; 16], body_len: u64, body_sha256: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(72);
    f.extend_from_slice(&node.to_be_bytes());
    f.extend_from_slice(&ts.to_be_bytes());
    f.extend_from_slice(nonce);
    f.extend_from_slice(&body_len.to_be_bytes());
    f.extend_from_slice(body_sha256);
    f
}

/// `HMAC-SHA256(secret, domain \n verb \n path \n fields)`.
fn mac(secret: &str, domain: &str, verb: &str, path: &str, fields: &[u8]) -> Vec<u8> {
    let mut m = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("hmac key");
    m.update(format!("{domain}\n{verb}\n{path}\n").as_bytes());
    m.update(fields);
    m.finalize().into_bytes().to_vec()
}

/// The header value: base64 of the fields followed by the MAC.
fn auth_value(fields: &[u8], mac: &[u8]) -> HeaderValue {
    HeaderValue::from_str(&B64.encode([fields, mac].concat())).expect("header value")
}

/// The header of a request from member `node`, signed over `signed_body`; returns it and the nonce.
fn signed_request(secret: &str, node: u64, path: &str, signed_body: &[u8]) -> (HeaderMap, [u8; 16]) {
    let nonce = rand::random::<[u8; 16]>();
    let f = fields(node, unix_ms(), &nonce, signed_body.len() as u64, &Sha256::digest(signed_body));
    let mut h = HeaderMap::new();
    h.insert(AUTH_HEADER, auth_value(&f, &mac(secret, "twinhub-req-v5", "POST", path, &f)));
    (h, nonce)
}

/// Whether an answer is signed by `node` as the answer, with its status, to the request with `nonce`.
fn is_answer_to(secret: &str, a: &Answer, path: &str, node: u64, nonce: &[u8; 16]) -> bool {
    let Some(raw) = a.headers.get(AUTH_HEADER).and_then(|v| B64.decode(v.as_bytes()).ok()) else { return false };
    if raw.len() != 104 {
        return false;
    }
    let ts = u64::from_be_bytes(raw[8..16].try_into().expect("8 bytes"));
    let want = fields(node, ts, nonce, a.body.len() as u64, &Sha256::digest(&a.body));
    raw[..72] == want[..] && raw[72..] == mac(secret, "twinhub-resp-v5", a.status.as_str(), path, &want)[..]
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    /// Our headers other than the protocol version: a signature of this version or of an older one.
    fn signature_headers(&self) -> Vec<&str> {
        self.headers
            .keys()
            .map(|k| k.as_str())
            .filter(|k| k.starts_with("x-twinhub-") && *k != "x-twinhub-proto")
            .collect()
    }

    fn assert_unsigned_refusal(&self, what: &str) {
        assert_eq!(self.status, StatusCode::UNAUTHORIZED, "{what}: {:?}", self.body);
        assert!(self.signature_headers().is_empty(), "{what}: a refusal carries {:?}", self.signature_headers());
    }
}

/// The TLS identity the attacker holds: node 2's cluster certificate (a member's, or a stolen one),
/// and which node listens where. Inter-node traffic is mutual TLS, so without a member certificate
/// nobody reaches the request frames at all (`tests/cluster_tls.rs`); these tests are about what the
/// signatures still stop a certificate holder from doing.
static MEMBER: std::sync::OnceLock<(Arc<rustls::ClientConfig>, std::collections::HashMap<SocketAddr, u64>)> =
    std::sync::OnceLock::new();

/// A TLS connection to a cluster port, with node 2's certificate.
async fn member_conn(addr: SocketAddr) -> tokio_rustls::client::TlsStream<TcpStream> {
    let (tls, ids) = MEMBER.get().expect("the member identity is set up first");
    let tcp = tokio::time::timeout(IO_WAIT, TcpStream::connect(addr)).await.expect("connect in time").expect("connect");
    let name = cluster_node_name(ids[&addr]);
    tokio::time::timeout(IO_WAIT, tokio_rustls::TlsConnector::from(tls.clone()).connect(name, tcp))
        .await
        .expect("TLS in time")
        .expect("TLS handshake with a member certificate")
}

fn header_list(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    headers.iter().map(|(n, v)| (n.as_str().to_string(), v.as_bytes().to_vec())).collect()
}

fn header_map(list: Vec<(String, Vec<u8>)>) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (n, v) in list {
        let name = hyper::header::HeaderName::from_bytes(n.as_bytes()).expect("header name");
        h.append(name, HeaderValue::from_bytes(&v).expect("header value"));
    }
    h
}

/// One request on a fresh connection; the whole answer.
async fn send(addr: SocketAddr, path: &str, headers: &HeaderMap, body: Bytes) -> Answer {
    let io = member_conn(addr).await;
    let a = tokio::time::timeout(IO_WAIT, frames::request(io, path, &header_list(headers), &body))
        .await
        .expect("answer in time")
        .expect("answer");
    Answer {
        status: StatusCode::from_u16(a.status).expect("status"),
        headers: header_map(a.headers),
        body: a.body.into(),
    }
}

/// What one bogus upload achieved.
struct Upload {
    status: Option<StatusCode>,
    /// Bytes the client handed to its connection before the refusal (the connection takes them only
    /// as far as the sockets' buffers go while the server reads nothing).
    handed_over: u64,
    answered_after: Duration,
}

/// A 60 MiB request streamed in 1 MiB chunks, with the given (invalid or absent) signature header.
async fn bogus_upload(addr: SocketAddr, headers: HeaderMap) -> Upload {
    let (mut r, mut w) = tokio::io::split(member_conn(addr).await);
    let handed_over = Arc::new(AtomicU64::new(0));
    let counter = handed_over.clone();
    let start = Instant::now();
    let head = frames::request_head(1, STATUS_PATH, &header_list(&headers), UPLOAD_BYTES as usize);
    let writer = tokio::spawn(async move {
        w.write_all(&head).await?;
        let chunk = vec![0x5a; CHUNK];
        for _ in 0..UPLOAD_BYTES / CHUNK as u64 {
            w.write_all(&chunk).await?;
            w.flush().await?;
            counter.fetch_add(CHUNK as u64, Ordering::Relaxed);
        }
        Ok::<_, std::io::Error>(())
    });
    let status = match tokio::time::timeout(IO_WAIT, frames::read_answer(&mut r)).await {
        Ok(Ok(a)) => StatusCode::from_u16(a.status).ok(),
        // A reset instead of an answer also refuses; the test only requires the refusal to be quick.
        Ok(Err(e)) => {
            eprintln!("upload ended without an answer: {e}");
            None
        }
        Err(_) => panic!("a bogus upload was neither answered nor closed within {IO_WAIT:?}"),
    };
    let answered_after = start.elapsed();
    writer.abort();
    Upload { status, handed_over: handed_over.load(Ordering::Relaxed), answered_after }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_port_refuses_strangers_replays_reflections_and_unsigned_floods() {
    let started = Instant::now();
    let c = Cluster::up(3, SHARDS);
    c.settle_leadership().await;
    let secret = c.cluster_secret();
    let (n1, n2) = (c.cluster_addr(1), c.cluster_addr(2));
    let ids = c.ids().into_iter().map(|id| (c.cluster_addr(id), id)).collect();
    let _ = MEMBER.set((c.member_tls(2), ids));

    // (a) An unauthenticated POST: refused, unsigned, with only a failure code in the body.
    let a = send(n1, STATUS_PATH, &HeaderMap::new(), Bytes::new()).await;
    a.assert_unsigned_refusal("unauthenticated node.status");
    assert_eq!(a.headers.get("x-twinhub-proto").map(|v| v.as_bytes()), Some(&b"5"[..]));
    assert_eq!(&a.body[..], b"\x00", "only the 'unauthorized' code");
    // The previous version's path is refused as another protocol version, also unsigned.
    let old = send(n1, "/cluster/v4/call/node.status", &HeaderMap::new(), Bytes::new()).await;
    assert_eq!(old.status, StatusCode::BAD_REQUEST);
    assert!(old.signature_headers().is_empty());
    eprintln!("(a) unauthenticated request: {} without a signature header", a.status);

    // (b) A member's signed request works once...
    let (headers, nonce) = signed_request(&secret, 2, STATUS_PATH, b"");
    let b = send(n1, STATUS_PATH, &headers, Bytes::new()).await;
    assert_eq!(b.status, StatusCode::OK, "{:?}", String::from_utf8_lossy(&b.body));
    let status: Value = serde_json::from_slice(&b.body).expect("node.status answers JSON");
    assert!(status.to_string().contains("shard"), "{status}");
    assert!(is_answer_to(&secret, &b, STATUS_PATH, 1, &nonce), "the answer is signed by node 1 for our nonce");
    // ...and the same bytes again are refused, on that node.
    send(n1, STATUS_PATH, &headers, Bytes::new()).await.assert_unsigned_refusal("replayed request");
    // A valid header MAC over another body is refused too (the body is checked against its digest).
    let (headers, _) = signed_request(&secret, 2, STATUS_PATH, b"signed");
    send(n1, STATUS_PATH, &headers, Bytes::from_static(b"sent!!")).await.assert_unsigned_refusal("tampered body");
    eprintln!("(b) signed request answered {}, its replay refused", b.status);
    // A member's certificate speaks for that member only: signed as node 3 on node 2's TLS connection,
    // a request is refused although the signature is good.
    let (headers, _) = signed_request(&secret, 3, STATUS_PATH, b"");
    send(n1, STATUS_PATH, &headers, Bytes::new())
        .await
        .assert_unsigned_refusal("signed as another node than the certificate names");
    eprintln!("(b') signed as node 3 over node 2's certificate: refused");

    // (c) The signed answer, sent back as a request (to the node that signed it, and to another).
    for addr in [n1, n2] {
        send(addr, STATUS_PATH, &b.headers, b.body.clone())
            .await
            .assert_unsigned_refusal("answer replayed as a request");
    }
    eprintln!("(c) the answer replayed as a request: refused");

    // (d) Twelve concurrent 60 MiB uploads, half unsigned, half with a well-formed but wrong signature.
    let pid = c.node(1).pid;
    let before = rss_kib(pid);
    let peak = Arc::new(AtomicU64::new(before));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let flood = Instant::now();
    let uploads = (0..UPLOADS).map(|i| {
        let headers = if i % 2 == 0 {
            HeaderMap::new()
        } else {
            // A member's fields declaring the whole upload, under a MAC that does not match.
            let f = fields(2, unix_ms(), &rand::random(), UPLOAD_BYTES, &[0u8; 32]);
            let mut h = HeaderMap::new();
            h.insert(AUTH_HEADER, auth_value(&f, &[7u8; 32]));
            h
        };
        tokio::spawn(bogus_upload(n1, headers))
    });
    let results: Vec<Upload> =
        futures::future::join_all(uploads).await.into_iter().map(|r| r.expect("upload task")).collect();
    let flood_time = flood.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    done.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");
    let after = rss_kib(pid);
    let peak = peak.load(Ordering::Relaxed);
    let handed: u64 = results.iter().map(|u| u.handed_over).sum();
    let slowest = results.iter().map(|u| u.answered_after).max().unwrap_or_default();
    eprintln!(
        "(d) {UPLOADS} bogus uploads of {} MiB: RSS of node 1 {} MiB before, {} MiB peak, {} MiB after; \
         {:.1} MiB handed to the connections in all; slowest refusal {slowest:?}, all within {flood_time:?}; statuses {:?}",
        UPLOAD_BYTES >> 20,
        before / 1024,
        peak / 1024,
        after / 1024,
        handed as f64 / f64::from(1 << 20),
        results.iter().map(|u| u.status.map(|s| s.as_u16())).collect::<Vec<_>>()
    );
    assert!(before > 0 && pid_alive(pid), "node 1 must still run");
    for u in &results {
        assert!(u.status.is_none_or(|s| s == StatusCode::UNAUTHORIZED), "a bogus upload got {:?}", u.status);
        assert!(u.handed_over < UPLOAD_BYTES / 4, "an upload got {} bytes out before its refusal", u.handed_over);
    }
    assert!(results.iter().filter(|u| u.status.is_some()).count() >= UPLOADS / 2, "most uploads are answered 401");
    assert!(peak.saturating_sub(before) < 64 << 10, "RSS grew from {before} to {peak} KiB");
    assert!(slowest < Duration::from_secs(20), "slowest refusal took {slowest:?}");

    // (e) The cluster still works: a write through node 1, read back through node 2.
    let device = format!("sec-cluster-{}", unix_ms());
    c.api(1).must_create_device(&device).await;
    c.api(1).must_patch_twin(&device, &json!({"properties": {"desired": {"checked": true}}})).await;
    let deadline = Instant::now() + WAIT;
    loop {
        let r = c.api(2).try_send("GET", &format!("/twins/{device}"), None, &[]).await;
        if let Ok(r) = r {
            if r.status == 200 && r.json()["properties"]["desired"]["checked"] == true {
                break;
            }
        }
        assert!(Instant::now() < deadline, "node 2 never served the write made through node 1\n{}", c.logs_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("(e) write through node 1 read back through node 2");
    c.assert_no_panics();
    eprintln!("done in {:?}", started.elapsed());
}

/// A TCP connection to `port` on 127.0.0.1 from the loopback address 127.0.0.`from` (each address is
/// a source of its own to the node).
async fn tcp_from(from: u8, port: u16) -> std::io::Result<TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4()?;
    sock.bind(SocketAddr::from(([127, 0, 0, from], 0)))?;
    sock.connect(SocketAddr::from(([127, 0, 0, 1], port))).await
}

/// Strangers who hold every slot a node's cluster port gives strangers cannot keep a member from
/// reconnecting: connections from the members' addresses are not held to the stranger bounds (they
/// still have to pass mutual TLS and the signature). Node `other` restarts while the flood holds the
/// port of shard 0's leader, and a write through `other` to a twin of shard 0 needs a new connection
/// to that leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_who_fill_the_cluster_port_cannot_keep_a_member_out() {
    let opts: Vec<String> =
        ["max_connections_cluster=24", "max_unauthenticated_per_source=6", "handshake_timeout_secs=2"]
            .iter()
            .flat_map(|o| ["--node-option".to_string(), o.to_string()])
            .collect();
    let mut c = Cluster::up_with(3, SHARDS, &opts);
    c.settle_leadership().await;
    let (target, _) = c.settled_leader(0, &[1, 2, 3], Duration::from_secs(1)).await;
    let other = if target == 1 { 2 } else { 1 };
    let port = c.cluster_addr(target).port();
    let mut taken = std::collections::HashSet::new();
    let device = device_on_shard("kept-out", 0, SHARDS, &mut taken);
    c.api(target).must_create_device(&device).await;

    // 4 sources × 6 unauthenticated slots = the port's cap of 24: each slot is opened again as soon as
    // the node closes it (after the 2 s handshake timeout), or tried again 20 ms after a refusal.
    let stop = Arc::new(AtomicBool::new(false));
    let held = Arc::new(AtomicU64::new(0));
    let mut flood = Vec::new();
    for i in 0..24u8 {
        let (stop, held) = (stop.clone(), held.clone());
        flood.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match tcp_from(2 + i % 4, port).await {
                    Ok(mut s) => {
                        held.fetch_add(1, Ordering::Relaxed);
                        let mut buf = [0u8; 64];
                        let _ = tokio::time::timeout(
                            Duration::from_secs(5),
                            tokio::io::AsyncReadExt::read(&mut s, &mut buf),
                        )
                        .await;
                        held.fetch_sub(1, Ordering::Relaxed);
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Saturated: another stranger is refused at once (closed without a handshake).
    let mut probe = tcp_from(9, port).await.expect("TCP connect");
    let mut buf = [0u8; 64];
    let closed =
        tokio::time::timeout(Duration::from_millis(1500), tokio::io::AsyncReadExt::read(&mut probe, &mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "the flood did not fill the port: {closed:?}");
    eprintln!("flood holds {} connections of node {target}'s cluster port", held.load(Ordering::Relaxed));

    c.kill9(other);
    c.restart(other);
    let api = c.api_with_timeout(other, Duration::from_secs(20));
    let started = Instant::now();
    let mut last = String::new();
    let written = loop {
        // A transport error until the restarted node listens again.
        match api.try_send("PATCH", &format!("/twins/{device}"), Some(&json!({"tags": {"kept": "in"}})), &[]).await {
            Ok(r) if r.status == 200 => break true,
            Ok(r) => last = format!("{} {}", r.status, r.text),
            Err(e) => last = format!("{e}"),
        }
        if started.elapsed() > Duration::from_secs(60) {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let still_held = held.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for f in flood {
        f.abort();
    }
    assert!(written, "node {other} could not reach shard 0's leader (node {target}) through the flood: {last}");
    eprintln!("node {other} wrote through node {target} after {:?}, the flood holding {still_held}", started.elapsed());
    let twin = c.api(target).must_get_twin(&device).await;
    assert_eq!(twin["tags"]["kept"], "in");
}
