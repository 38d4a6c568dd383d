//! Attacks on the HTTPS front door and the node's secrets, replayed against the real binary: each one
//! must now be refused or bounded while legitimate clients keep working.
//!
//! - random method names without credentials cannot grow `/metrics`;
//! - half-sent request heads, idle TLS connections and raw TCP sockets are closed after the handshake
//!   timeout, a connection busy with requests that need no credential three handshake timeouts after
//!   its accept, and one source holds only a few unauthenticated connections;
//! - uploads without a valid token are answered 401 before their bodies are read;
//! - filling the HTTPS port's descriptor share leaves MQTT (new and connected devices) and connected
//!   HTTPS clients working;
//! - the data directory and its secrets are private, and keys can come from files;
//! - token scopes compare paths case-sensitively; membership changes need the owner policy; a job id
//!   with quotes is not pasted into a query.

use twinhub_testkit as common;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use common::*;
use rumqttc::tokio_rustls::rustls;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const HANDSHAKE_SECS: u64 = 2;

/// A server with a short handshake timeout and a small per-source unauthenticated cap (16).
fn hardened(handshake_secs: u64, per_source: u32) -> ServerOpts {
    let args = vec![
        "--handshake-timeout-secs".into(),
        handshake_secs.to_string(),
        "--max-unauthenticated-per-source".into(),
        per_source.to_string(),
    ];
    ServerOpts { shard_count: Some(2), extra_args: args, ..Default::default() }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// A TCP connection to `port` on 127.0.0.1 from the loopback address `from` (127.0.0.0/8 is all
/// local, so each address is a distinct source to the server).
async fn tcp_from(from: IpAddr, port: u16) -> std::io::Result<TcpStream> {
    let sock = TcpSocket::new_v4()?;
    sock.bind(SocketAddr::new(from, 0))?;
    sock.connect(SocketAddr::from(([127, 0, 0, 1], port))).await
}

fn tls_connector(ca_pem: &[u8]) -> tokio_rustls::TlsConnector {
    tokio_rustls::TlsConnector::from(tls_client_config(ca_pem))
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

async fn tls_from(ca: &tokio_rustls::TlsConnector, from: IpAddr, port: u16) -> std::io::Result<Tls> {
    let tcp = tcp_from(from, port).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    ca.connect(name, tcp).await
}

/// Reads until EOF or error; how long that took (capped at `within`, then `None`).
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(s: &mut S, within: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(within.saturating_sub(start.elapsed()), s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => continue,
        }
    }
}

fn lo(n: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, n])
}

/// A token of `policy` scoped to `path` below the hub (`sr = quote_plus(host/path)`).
fn scoped_sas(host: &str, path: &str, policy: &str, key: &str) -> String {
    let expiry = unix_now() + 3600;
    let sr = py_quote_plus(&format!("{host}/{path}"));
    let sig = sign(key, &format!("{sr}\n{expiry}"));
    format!("SharedAccessSignature sr={sr}&sig={}&se={expiry}&skn={policy}", py_quote(&sig, "/"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_labels_stay_bounded_under_random_methods() {
    let srv = Server::start(hardened(HANDSHAKE_SECS, 16));
    let http = srv.http_client();
    let metrics = |http: reqwest::Client, url: String| async move {
        http.get(url).send().await.expect("metrics").text().await.expect("metrics text")
    };
    let url = format!("{}/metrics", srv.base_url);
    let before = metrics(http.clone(), url.clone()).await.len();
    let mut sent = Vec::new();
    for i in 0..600u32 {
        let len = 200 + (i as usize * 37) % 800;
        let name: String = (0..len).map(|j| (b'A' + ((i as usize * 7 + j * 13) % 26) as u8) as char).collect();
        let method = reqwest::Method::from_bytes(name.as_bytes()).expect("token method");
        // Unrouted paths keep the connection; routed ones are refused 401 and closed.
        let path = if i % 4 == 0 { "/devices/x" } else { "/nope" };
        let r = http.request(method, format!("{}{path}", srv.base_url)).send().await.expect("answered");
        assert!(matches!(r.status().as_u16(), 401 | 404 | 405), "{}", r.status());
        if i < 3 {
            sent.push(name);
        }
    }
    let page = metrics(http.clone(), url).await;
    assert!(page.len() < before + 16 * 1024, "metrics grew from {before} to {} bytes", page.len());
    for name in &sent {
        assert!(!page.contains(name.as_str()), "a client-chosen method became a label");
    }
    assert!(page.contains("method=\"other\""), "odd methods are counted as other");
    eprintln!("metrics page: {before} bytes before, {} after 600 odd-method requests", page.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_connections_are_closed_after_the_handshake_timeout() {
    let srv = Server::start(hardened(HANDSHAKE_SECS, 16));
    let ca = tls_connector(&srv.ca_pem);
    let limit = Duration::from_secs(HANDSHAKE_SECS * 3 + 3);
    let start = Instant::now();
    // 12 half-sent heads, 12 idle TLS sessions, 12 raw TCP sockets that never start TLS: one source
    // each group, so the per-source cap (16) does not refuse them and each timeout is exercised.
    let mut tasks = Vec::new();
    for i in 0..12u8 {
        let (ca1, ca2, port) = (ca.clone(), ca.clone(), srv.port);
        tasks.push(tokio::spawn(async move {
            let mut s = tls_from(&ca1, lo(10), port).await.expect("TLS");
            s.write_all(b"GET /devices?api-version=2021-04-12 HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
                .await
                .expect("partial head");
            s.flush().await.expect("flush");
            ("half head", i, closed_within(&mut s, limit).await)
        }));
        tasks.push(tokio::spawn(async move {
            let mut s = tls_from(&ca2, lo(11), port).await.expect("TLS");
            ("idle TLS", i, closed_within(&mut s, limit).await)
        }));
        tasks.push(tokio::spawn(async move {
            let mut s = tcp_from(lo(12), port).await.expect("TCP");
            ("raw TCP", i, closed_within(&mut s, limit).await)
        }));
    }
    let mut worst = Duration::ZERO;
    for t in tasks {
        let (what, i, closed) = t.await.expect("task");
        let took = closed.unwrap_or_else(|| panic!("{what} #{i} still open after {limit:?}"));
        worst = worst.max(took);
    }
    eprintln!("36 slow/idle connections all closed; the last after {worst:?} (test took {:?})", start.elapsed());
    // The server still serves.
    srv.owner().must_create_device("after-slow").await;
}

/// Sends `GET path` on a kept-alive HTTP/1.1 connection and reads the answer's head and body; `None`
/// once the server has closed the connection.
async fn get_kept_alive(s: &mut Tls, path: &str, auth: Option<&str>) -> Option<u16> {
    let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    s.flush().await.ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("a content-length");
            if got.len() >= end + 4 + len {
                return head.get(9..12).and_then(|c| c.parse().ok());
            }
        }
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_shows_no_credential_is_closed_however_busy_it_keeps() {
    let srv = Server::start(hardened(HANDSHAKE_SECS, 16));
    let ca = tls_connector(&srv.ca_pem);
    let owner = service_sas(&srv.host_name, "iothubowner", &srv.owner_key, unix_now() + 3600);
    let lifetime = Duration::from_secs(HANDSHAKE_SECS * 3);
    // One connection probes /health every 300 ms without a credential, one /metrics, and one proves the
    // owner's credential once and then probes /health the same way.
    let mut tasks = Vec::new();
    for (what, first) in [("health", None), ("metrics", None), ("authenticated", Some(owner))] {
        let ca = ca.clone();
        let port = srv.port;
        tasks.push(tokio::spawn(async move {
            let start = Instant::now();
            let mut s = tls_from(&ca, lo(30), port).await.expect("TLS");
            if let Some(token) = &first {
                let status = get_kept_alive(&mut s, "/statistics/devices?api-version=2021-04-12", Some(token)).await;
                assert_eq!(status, Some(200), "{what}: the credential is taken");
            }
            let path = if what == "metrics" { "/metrics" } else { "/health" };
            let mut answered = 0u32;
            while start.elapsed() < lifetime * 3 {
                match get_kept_alive(&mut s, path, None).await {
                    Some(status) => assert_eq!(status, 200, "{what}"),
                    None => return (what, answered, Some(start.elapsed())),
                }
                answered += 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            (what, answered, None)
        }));
    }
    for t in tasks {
        let (what, answered, closed) = t.await.expect("task");
        eprintln!("{what}: {answered} probes answered, closed after {closed:?}");
        if what == "authenticated" {
            assert_eq!(closed, None, "an authenticated connection stays open while it is used");
        } else {
            let at = closed
                .unwrap_or_else(|| panic!("{what}: unauthenticated connection still open after {:?}", lifetime * 3));
            assert!(
                at >= lifetime - Duration::from_millis(500),
                "{what}: closed after {at:?}, before its {lifetime:?}"
            );
            assert!(at <= lifetime + Duration::from_secs(HANDSHAKE_SECS + 2), "{what}: closed only after {at:?}");
            assert!(answered >= 10, "{what}: only {answered} probes answered before the close");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_holds_few_unauthenticated_connections() {
    let srv = Server::start(hardened(30, 16));
    // 300 sockets from one address that never speak.
    let mut held = Vec::new();
    for _ in 0..300 {
        if let Ok(s) = tcp_from(lo(20), srv.port).await {
            held.push(s);
        }
    }
    // Refused ones are closed by the server at once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut open = 0;
    for s in held.iter_mut() {
        let mut b = [0u8; 1];
        if tokio::time::timeout(Duration::from_millis(20), s.read(&mut b)).await.is_err() {
            open += 1
        }
    }
    assert!(open <= 16, "{open} of 300 sockets from one source still held");
    eprintln!("one source: {open} of 300 idle sockets held, the rest refused at accept");
    // Meanwhile another source, and MQTT from the flooding source, work.
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&srv.ca_pem).expect("CA"))
        .resolve("localhost", SocketAddr::from(([127, 0, 0, 1], srv.port)))
        .local_address(lo(21))
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client");
    let token = service_sas(&srv.host_name, "iothubowner", &srv.owner_key, unix_now() + 3600);
    let r = http
        .put(format!("{}/devices/flooded?api-version={API_VERSION}", srv.base_url))
        .header("Authorization", &token)
        .json(&json!({"deviceId": "flooded"}))
        .send()
        .await
        .expect("legit client from another source");
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let key = r.json::<serde_json::Value>().await.expect("json")["authentication"]["symmetricKey"]["primaryKey"]
        .as_str()
        .expect("key")
        .to_string();
    let mut dev = MqttDevice::connect(&srv, "flooded", &key).await;
    assert_eq!(dev.get_twin().await, 200);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_without_credentials_are_refused_unread() {
    let srv = Server::start(hardened(HANDSHAKE_SECS, 16));
    let ca = tls_connector(&srv.ca_pem);
    let rss_before = rss_kib(srv.pid());
    let start = Instant::now();
    // 400 uploads announcing 250 KB, sending 1 KB and stalling; spread over 25 sources (16 each).
    let mut tasks = Vec::new();
    for i in 0..400u32 {
        let (ca, port) = (ca.clone(), srv.port);
        tasks.push(tokio::spawn(async move {
            let from = lo(30 + (i / 16) as u8);
            let Ok(mut s) = tls_from(&ca, from, port).await else { return ("refused at accept", None) };
            let head = format!(
                "PATCH /twins/d{i}?api-version=2021-04-12 HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 250000\r\n\r\n"
            );
            if s.write_all(head.as_bytes()).await.is_err() || s.write_all(&[b' '; 1024]).await.is_err() {
                return ("refused at accept", None);
            }
            let mut got = Vec::new();
            let mut buf = [0u8; 2048];
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(20) {
                match tokio::time::timeout(Duration::from_secs(20), s.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
                    Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
                }
            }
            let text = String::from_utf8_lossy(&got).to_string();
            ("answered", Some((text, t0.elapsed())))
        }));
    }
    let (mut answered, mut slowest) = (0, Duration::ZERO);
    for t in tasks {
        if let ("answered", Some((text, took))) = t.await.expect("task") {
            assert!(text.starts_with("HTTP/1.1 401"), "an unauthenticated upload got: {text:.200}");
            assert!(text.to_ascii_lowercase().contains("connection: close"), "{text:.300}");
            answered += 1;
            slowest = slowest.max(took);
        }
    }
    let rss_after = rss_kib(srv.pid());
    eprintln!(
        "{answered} of 400 stalled uploads answered 401 (slowest {slowest:?}), total {:?}; RSS {} -> {} KiB",
        start.elapsed(),
        rss_before,
        rss_after
    );
    assert!(answered >= 300, "only {answered} uploads were answered");
    assert!(slowest < Duration::from_secs(5), "a refusal took {slowest:?}: the body was waited for");
    assert!(rss_after < rss_before + 40 * 1024, "RSS grew from {rss_before} to {rss_after} KiB");
    srv.owner().must_create_device("after-uploads").await;
}

/// A restore's page may be 64 MiB, so its body is read only once the caller has shown the ClusterAdmin
/// permission: a valid credential of a policy without it is refused while the body is still coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_body_is_not_read_for_a_credential_without_the_permission() {
    let srv = Server::start(hardened(HANDSHAKE_SECS, 16));
    let policies: Value =
        serde_json::from_slice(&std::fs::read(srv.data_dir.join("policies.json")).expect("policies.json")).unwrap();
    let key = policies["policies"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "registryRead"))
        .and_then(|p| p["primary_key"].as_str())
        .expect("the registryRead policy's key")
        .to_string();
    let token = service_sas(&srv.host_name, "registryRead", &key, unix_now() + 3600);
    let ca = tls_connector(&srv.ca_pem);
    for path in ["/cluster/restore/meta", "/cluster/restore/shards/0"] {
        let mut s = tls_from(&ca, lo(40), srv.port).await.expect("TLS");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: {token}\r\nContent-Type: application/json\r\nContent-Length: 60000000\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.expect("head");
        s.write_all(&[b' '; 4096]).await.expect("the body's first bytes");
        let t0 = Instant::now();
        let mut got = Vec::new();
        let mut buf = [0u8; 2048];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") && t0.elapsed() < Duration::from_secs(8) {
            match tokio::time::timeout(Duration::from_secs(8), s.read(&mut buf)).await {
                Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        let text = String::from_utf8_lossy(&got).to_string();
        assert!(text.starts_with("HTTP/1.1 401"), "{path}: {text:.300}");
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{path}: answered after {:?}: the body was waited for",
            t0.elapsed()
        );
    }
    srv.owner().must_create_device("after-restores").await;
}

/// The twin routes, served beside the router rather than through it, keep every bound the router puts
/// on a request: a body over the limit is 413 and changes nothing, an authenticated body that stalls
/// is answered 400 after the chunk timeout (10 s), and their metrics carry the route pattern, never
/// the device id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twin_routes_keep_the_routers_bounds() {
    let srv = Server::start(hardened(HANDSHAKE_SECS, 16));
    let owner = srv.owner();
    owner.must_create_device("bounded-1").await;
    owner.must_create_module("bounded-1", "m1").await;
    let before = owner.must_get_twin("bounded-1").await;

    // Just over the limit, and four times it: the server stops reading at the limit and answers, and
    // before it closes it reads (and drops) what the client is still sending, so the client gets the
    // 413 rather than a connection reset that would discard it.
    let body = |kib: usize| format!(r#"{{"properties":{{"desired":{{"k":"{}"}}}}}}"#, "x".repeat(kib * 1024));
    for huge in [body(300), body(1024)] {
        for path in ["/twins/bounded-1", "/twins/bounded-1/modules/m1"] {
            for method in ["PATCH", "PUT"] {
                let r = owner.send_raw(method, path, Some(huge.clone().into_bytes()), &[]).await;
                assert_error(&r, 413, "RequestEntityTooLarge");
            }
        }
    }
    let after = owner.must_get_twin("bounded-1").await;
    assert_eq!(after["$version"], before["$version"], "a refused body changed the twin: {after}");

    // Percent-encoded segments are decoded as the router decodes path parameters.
    owner.must_create_device("x#1?y").await;
    let r = owner.must_ok("GET", "/twins/x%231%3Fy", None, &[]).await;
    assert_eq!(r["deviceId"], "x#1?y");
    // A trailing slash is not the twin route: the router's 404.
    owner.must_err(404, "NotFound", "GET", "/twins/bounded-1/", None, &[]).await;

    // An authenticated PATCH announcing 1,000 bytes and sending 10.
    let ca = tls_connector(&srv.ca_pem);
    let mut s = tls_from(&ca, lo(1), srv.port).await.expect("connect");
    let auth = owner.auth_header().expect("owner token");
    let head = format!(
        "PATCH /twins/bounded-1?api-version=2021-04-12 HTTP/1.1\r\nHost: localhost\r\nAuthorization: {auth}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"tags\": {{"
    );
    s.write_all(head.as_bytes()).await.expect("head");
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") && t0.elapsed() < Duration::from_secs(30) {
        match tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&got).to_string();
    let took = t0.elapsed();
    assert!(text.starts_with("HTTP/1.1 400"), "a stalled body got: {text:.300}");
    assert!(took >= Duration::from_secs(9) && took < Duration::from_secs(20), "answered after {took:?}");
    let after = owner.must_get_twin("bounded-1").await;
    assert_eq!(after["$version"], before["$version"], "a stalled body changed the twin: {after}");

    owner.must(200, "PATCH", "/twins/bounded-1", Some(&json!({"tags": {"a": 1}})), &[]).await;
    owner.must(200, "PATCH", "/twins/bounded-1/modules/m1", Some(&json!({"tags": {"a": 1}})), &[]).await;
    let page = srv.http_client().get(format!("{}/metrics", srv.base_url)).send().await.expect("metrics");
    let page = page.text().await.expect("metrics text");
    for want in [
        r#"method="PATCH",route="/twins/{id}",status="200""#,
        r#"method="PATCH",route="/twins/{id}",status="413""#,
        r#"method="PATCH",route="/twins/{id}",status="400""#,
        r#"method="PUT",route="/twins/{id}/modules/{mid}",status="413""#,
        r#"method="GET",route="/twins/{id}",status="200""#,
    ] {
        assert!(
            page.lines().any(|l| l.starts_with("twinhub_http_requests_total") && l.contains(want)),
            "no {want} in /metrics"
        );
    }
    assert!(!page.contains("bounded-1"), "a device id became a label");
    eprintln!("stalled twin body answered 400 after {took:?}");
}

/// Sends `method path` on an authenticated connection announcing a body of 100,000 bytes and then
/// sends 50 bytes a second, each chunk well within the chunk timeout; the answer and when it came
/// (`None` if none came within 40 s).
async fn trickle(srv: &Server, method: &str, path: &str) -> (String, Option<Duration>) {
    let ca = tls_connector(&srv.ca_pem);
    let mut s = tls_from(&ca, lo(2), srv.port).await.expect("connect");
    let auth = srv.owner().auth_header().expect("owner token");
    let head = format!(
        "{method} {path}?api-version=2021-04-12 HTTP/1.1\r\nHost: localhost\r\nAuthorization: {auth}\r\n\
         Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{\"tags\": {{"
    );
    s.write_all(head.as_bytes()).await.expect("head");
    let (mut r, mut w) = tokio::io::split(s);
    let sender = tokio::spawn(async move {
        let chunk = [b' '; 50];
        while w.write_all(&chunk).await.is_ok() && w.flush().await.is_ok() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    let answered = loop {
        if got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"}") {
            break Some(t0.elapsed());
        }
        match tokio::time::timeout(Duration::from_secs(40).saturating_sub(t0.elapsed()), r.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break got.windows(4).any(|w| w == b"\r\n\r\n").then(|| t0.elapsed()),
            Err(_) => break None,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    };
    sender.abort();
    (String::from_utf8_lossy(&got).to_string(), answered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_trickles_in_is_cut_off() {
    let srv = Server::start(hardened(HANDSHAKE_SECS, 16));
    let owner = srv.owner();
    owner.must_create_device("slow-1").await;
    let before = owner.must_get_twin("slow-1").await;
    // A chunk every second never trips the 10 s chunk timeout; 50 bytes a second is far below the
    // 4,096 a body must average once its first 10 s are spent. A twin route (served without the
    // router) and a routed one, at the same time.
    let (twin, query) = tokio::join!(trickle(&srv, "PATCH", "/twins/slow-1"), trickle(&srv, "POST", "/devices/query"));
    for (what, (text, took)) in [("twin patch", twin), ("query", query)] {
        let took = took.unwrap_or_else(|| panic!("{what}: no answer within 40 s to a trickling body: {text:.300}"));
        eprintln!("{what}: answered after {took:?}");
        assert!(text.starts_with("HTTP/1.1 400"), "{what}: {text:.400}");
        assert!(text.contains("too slowly"), "{what}: the answer does not say why: {text:.400}");
        assert!(took >= Duration::from_secs(9) && took < Duration::from_secs(16), "{what}: answered after {took:?}");
    }
    let after = owner.must_get_twin("slow-1").await;
    assert_eq!(after["$version"], before["$version"], "a cut-off body changed the twin: {after}");
    // The connection's limits did not outlast it: the same client goes on.
    owner.must(200, "PATCH", "/twins/slow-1", Some(&json!({"tags": {"a": 1}})), &[]).await;
}

/// JSON that nests through serde_json's private raw-value key (a fresh nesting limit at each level,
/// on the same stack) is refused on every route that reads a body, and the node goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_nested_through_the_raw_value_key_is_a_400_and_the_node_stays_up() {
    let srv = Server::start_default();
    let api = srv.owner();
    api.must_create_device("raw-1").await;
    let evil = nested_raw_values(120).into_bytes();
    let wrapped = |key: &str| {
        let mut b = format!("{{\"{key}\":").into_bytes();
        b.extend_from_slice(&evil);
        b.push(b'}');
        b
    };
    for (method, path, body) in [
        ("POST", "/devices/query", evil.clone()),
        ("PUT", "/configurations/c1", evil.clone()),
        ("PUT", "/jobs/v2/j1", evil.clone()),
        ("POST", "/devices", evil.clone()),
        ("PUT", "/devices/raw-2", evil.clone()),
        ("POST", "/twins/raw-1/methods", evil.clone()),
        ("POST", "/cluster/restore/meta", evil.clone()),
        ("PATCH", "/twins/raw-1", evil.clone()),
        ("PATCH", "/twins/raw-1", wrapped("tags")),
        ("PUT", "/twins/raw-1", wrapped("properties")),
    ] {
        let r = api.send_raw(method, path, Some(body), &[]).await;
        assert_eq!(r.status, 400, "{method} {path}: {}", r.text);
        if !path.starts_with("/twins/raw-1") || method == "POST" {
            assert!(r.text.contains("reserved"), "{method} {path}: {}", r.text);
        }
    }
    api.must_create_device("raw-3").await;
    assert_eq!(api.must_get_twin("raw-1").await["version"], api.must_get_twin("raw-3").await["version"]);
}

/// Sends on `api`'s pooled, authenticated connection while the HTTPS port refuses every new one. The
/// client puts a connection back into its pool a moment after the previous response ended; a request
/// sent in that moment opens a new connection, which the flood gets refused. So a transport error is
/// retried for up to a second. That cannot hide a server that dropped the authenticated connection:
/// every retry would need a new connection, and the flood refuses them all.
async fn on_the_pooled_connection(api: &Api, method: &str, path: &str, body: &Value) -> Resp {
    let mut last = None;
    for _ in 0..20 {
        match api.try_send(method, path, Some(body), &[]).await {
            Ok(r) => return r,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{method} {path} during the flood: {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_on_the_https_port_leaves_the_other_ports_working() {
    // 1,024 descriptors: the HTTPS listener gets a small share (about 50 connections).
    let srv = Server::start(ServerOpts { nofile: Some(1024), ..hardened(60, 8) });
    let api = srv.owner();
    let doc = api.must_create_device("steady").await;
    let key = doc["authentication"]["symmetricKey"]["primaryKey"].as_str().expect("key").to_string();
    let mut connected = MqttDevice::connect(&srv, "steady", &key).await;
    assert_eq!(connected.get_twin().await, 200);
    // The HTTPS client's pooled connection was authenticated before the flood.
    api.must_get_twin("steady").await;

    // The flood: idle TLS connections from 60 sources, 8 each, far more than the port's share.
    let ca = tls_connector(&srv.ca_pem);
    let mut held = Vec::new();
    for src in 0..60u8 {
        for _ in 0..8 {
            if let Ok(Ok(s)) =
                tokio::time::timeout(Duration::from_secs(5), tls_from(&ca, lo(100 + src), srv.port)).await
            {
                held.push(s);
            }
        }
    }
    let mut alive = 0;
    for s in held.iter_mut() {
        let mut b = [0u8; 1];
        if tokio::time::timeout(Duration::from_millis(10), s.read(&mut b)).await.is_err() {
            alive += 1;
        }
    }
    eprintln!("HTTPS flood: {alive} of {} TLS connections held open", held.len());
    assert!(alive < 200, "{alive} connections held: the HTTPS share is not bounded");
    let fresh = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&srv.ca_pem).expect("CA"))
        .resolve("localhost", SocketAddr::from(([127, 0, 0, 1], srv.port)))
        .local_address(lo(250))
        .timeout(Duration::from_secs(3))
        .build()
        .expect("client");
    let refused = fresh.get(format!("{}/health", srv.base_url)).send().await;
    eprintln!("a new HTTPS client during the flood: {:?}", refused.as_ref().map(|r| r.status()));

    // Other ports and connected clients are unaffected.
    assert_eq!(connected.get_twin().await, 200, "a connected device still gets its twin");
    let patch = json!({"properties": {"desired": {"during": "flood"}}});
    let r = on_the_pooled_connection(&api, "PATCH", "/twins/steady", &patch).await;
    assert_eq!(r.status, 200, "PATCH during the flood: {}", r.text);
    let body =
        json!({"deviceId": "newcomer", "status": "enabled", "authentication": {"type": "sas", "symmetricKey": {}}});
    let r = on_the_pooled_connection(&api, "PUT", "/devices/newcomer", &body).await;
    assert_eq!(r.status, 200, "PUT /devices/newcomer during the flood: {}", r.text);
    let doc = r.json().clone();
    let key2 = doc["authentication"]["symmetricKey"]["primaryKey"].as_str().expect("key").to_string();
    let mut newcomer = MqttDevice::connect(&srv, "newcomer", &key2).await;
    assert_eq!(newcomer.get_twin().await, 200, "a new device connects during the flood");

    // Once the flood lets go, new HTTPS clients are served again.
    drop(held);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = fresh.get(format!("{}/health", srv.base_url)).send().await.expect("served after the flood");
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_private_and_can_come_from_files() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tmp");
    let key_file = dir.path().join("owner.key");
    let key = "c2VjcmV0LWtleS1mcm9tLWEtZmlsZS0xMjM0NTY3ODk=";
    std::fs::write(&key_file, format!("{key}\n")).expect("write key");
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let srv = Server::start(ServerOpts {
        extra_args: vec!["--owner-key-file".into(), key_file.display().to_string()],
        ..Default::default()
    });
    assert_eq!(srv.owner_key, key, "the owner key comes from the file");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", srv.pid())).expect("cmdline");
    assert!(!String::from_utf8_lossy(&cmdline).contains(key), "the key is not on the command line");
    srv.owner().must_create_device("d1").await;

    let mode = |p: &std::path::Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&srv.data_dir), 0o700, "data directory");
    for f in ["policies.json", "tls/ca.key", "tls/server.key"] {
        assert_eq!(mode(&srv.data_dir.join(f)), 0o600, "{f}");
    }
    // Everything the node and its storage engine wrote is private to its user.
    let mut stack = vec![srv.data_dir.clone()];
    let mut checked = 0;
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir") {
            let p = e.expect("entry").path();
            let m = std::fs::symlink_metadata(&p).expect("stat");
            assert_eq!(m.permissions().mode() & 0o077, 0, "{} is {:o}", p.display(), m.permissions().mode() & 0o777);
            checked += 1;
            if m.is_dir() {
                stack.push(p);
            }
        }
    }
    assert!(checked > 10, "walked {checked} entries");

    // Both a key and a key file: refused with a clear error.
    let out = std::process::Command::new(bin_path())
        .args(["serve", "--owner-key", key, "--owner-key-file"])
        .arg(&key_file)
        .args(["--data-dir"])
        .arg(dir.path().join("other"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("owner-key-file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_scopes_and_membership_permissions() {
    let srv = Server::start(ServerOpts { shard_count: Some(2), ..Default::default() });
    let owner = srv.owner();
    owner.must_create_device("a").await;
    owner.must_create_device("A").await;
    let host = &srv.host_name;

    // A token for devices/a opens devices/a only, not devices/A.
    let scoped = srv.api_raw_auth(Some(&scoped_sas(host, "devices/a", "iothubowner", &srv.owner_key)));
    assert_eq!(scoped.send("GET", "/devices/a", None, &[]).await.status, 200);
    assert_eq!(scoped.send("GET", "/devices/A", None, &[]).await.status, 401);
    // A token for a device named "query" does not authorise the query endpoint.
    let q = srv.api_raw_auth(Some(&scoped_sas(host, "devices/query", "iothubowner", &srv.owner_key)));
    let r = q.send("POST", "/devices/query", Some(&json!({"query": "SELECT * FROM devices"})), &[]).await;
    assert_eq!(r.status, 401, "{}", r.text);
    let r = owner.send("POST", "/devices/query", Some(&json!({"query": "SELECT * FROM devices"})), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);

    // Membership changes need the owner policy, not RegistryWrite.
    let rw = srv.api("registryReadWrite", &srv.policy_key("registryReadWrite"));
    let r = rw.send("POST", "/cluster/members", Some(&json!({"id": 9, "addr": "127.0.0.1:9"})), &[]).await;
    assert_eq!(r.status, 401, "{}", r.text);
    let r = rw.send("DELETE", "/cluster/members/1", None, &[]).await;
    assert_eq!(r.status, 401, "{}", r.text);
    // The owner passes the permission check (a single node then refuses for its own reasons).
    let r = owner.send("DELETE", "/cluster/members/7", None, &[]).await;
    assert_ne!(r.status, 401, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_id_with_quotes_is_not_query_text() {
    let srv = Server::start(ServerOpts { shard_count: Some(2), ..Default::default() });
    let api = srv.owner();
    for id in ["jq-1", "jq-2"] {
        api.must_create_device(id).await;
    }
    api.must_patch_twin("jq-1", &json!({"tags": {"pick": 1}})).await;
    // Legal job id characters that would close the literal and add a condition if pasted into a query.
    let job = "o'brien'OR(jobId='x')";
    let req = json!({
        "jobId": job, "type": "scheduleUpdateTwin",
        "queryCondition": "tags.pick = 1",
        "updateTwin": {"etag": "*", "properties": {"desired": {"quoted": true}}},
        "startTime": "2020-01-01T00:00:00.000Z", "maxExecutionTimeInSeconds": 60
    });
    let path = format!("/jobs/v2/{}", enc(job));
    let r = api.send("PUT", &path, Some(&req), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let deadline = Instant::now() + Duration::from_secs(60);
    let done = loop {
        let j = api.must_get(&path).await;
        if j["status"] == "completed" {
            break j;
        }
        assert!(Instant::now() < deadline, "job not completed: {j}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(done["deviceJobStatistics"]["succeededCount"], 1, "{done}");
    assert_eq!(done["deviceJobStatistics"]["failedCount"], 0, "{done}");
}

/// A device over plain MQTT, just enough to ask for its twin.
struct MqttDevice {
    client: rumqttc::AsyncClient,
    rx: tokio::sync::mpsc::UnboundedReceiver<String>,
    rid: u32,
}

impl MqttDevice {
    async fn connect(srv: &Server, id: &str, key: &str) -> MqttDevice {
        let mut o = rumqttc::MqttOptions::new(id, "127.0.0.1", srv.mqtt_plain_port);
        o.set_credentials(
            format!("localhost/{id}/?api-version=2021-04-12"),
            device_token("localhost", id, None, key, unix_now() + 3600),
        );
        o.set_keep_alive(Duration::from_secs(30));
        let (client, mut el) = rumqttc::AsyncClient::new(o, 16);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            loop {
                match el.poll().await {
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_))) => {
                        if let Some(r) = ready.take() {
                            let _ = r.send(Ok(()));
                        }
                    }
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) => {
                        let _ = tx.send(p.topic);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if let Some(r) = ready.take() {
                            let _ = r.send(Err(e.to_string()));
                        }
                        return;
                    }
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(20), ready_rx)
            .await
            .expect("CONNACK in time")
            .expect("event loop")
            .expect("connected");
        client.subscribe("$iothub/twin/res/#", rumqttc::QoS::AtMostOnce).await.expect("subscribe");
        MqttDevice { client, rx, rid: 0 }
    }

    /// `$iothub/twin/GET`, returning the response status.
    async fn get_twin(&mut self) -> u16 {
        self.rid += 1;
        let rid = self.rid;
        self.client
            .publish(format!("$iothub/twin/GET/?$rid={rid}"), rumqttc::QoS::AtMostOnce, false, Vec::new())
            .await
            .expect("publish");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let topic = tokio::time::timeout(left, self.rx.recv())
                .await
                .expect("twin response in time")
                .expect("connection open");
            if topic.ends_with(&format!("$rid={rid}")) {
                let status = topic.trim_start_matches("$iothub/twin/res/").split('/').next().unwrap_or("");
                return status.parse().expect("status");
            }
        }
    }
}
