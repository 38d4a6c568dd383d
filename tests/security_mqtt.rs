//! What strangers can make the device MQTT endpoint and the event broker hold, against the real
//! `twinhub` binary: each attack of the security review, shown to fail, with legitimate clients still
//! served while it runs.
//!
//! Raw sockets stand in where a client library would hide the behaviour (idle TCP connections, a
//! chosen source address, a CONNECT with a will, keep-alive 0). Every flood comes from 127.0.0.1; a
//! client that must get through during a flood binds 127.0.0.2 (Linux routes all of 127/8 to `lo`).

use twinhub_testkit as common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::raw_mqtt::*;
use common::*;
use rumqttc::{AsyncClient, ConnectReturnCode, ConnectionError, Event, MqttOptions, Packet, QoS};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const WAIT: Duration = Duration::from_secs(20);
const API: &str = "api-version=2021-04-12";

/// Whether the server closes `s` within `d` (EOF or reset), discarding whatever it sends.
async fn closed_within(s: &mut TcpStream, d: Duration) -> bool {
    let mut buf = [0u8; 256];
    let deadline = tokio::time::Instant::now() + d;
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

/// An MQTT 5 CONNECT (clean start, no properties) with user name and password.
fn connect_v5(client_id: &str, keep_alive: u16, user: &str, password: &str) -> Vec<u8> {
    let mut body = Vec::new();
    mqtt_string(&mut body, b"MQTT");
    body.push(5);
    body.push(0b1100_0010);
    body.extend_from_slice(&keep_alive.to_be_bytes());
    body.push(0); // no properties
    mqtt_string(&mut body, client_id.as_bytes());
    mqtt_string(&mut body, user.as_bytes());
    mqtt_string(&mut body, password.as_bytes());
    packet(0x10, &body)
}

/// The Server Keep Alive property (0x13) of an MQTT 5 CONNACK body.
fn server_keep_alive(connack: &[u8]) -> Option<u16> {
    let mut at = 2;
    let (mut len, mut shift) = (0usize, 0);
    loop {
        let b = *connack.get(at)?;
        at += 1;
        len |= usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    let props = connack.get(at..at + len)?;
    let mut i = 0;
    let u16_at = |i: usize| Some(u16::from_be_bytes([*props.get(i)?, *props.get(i + 1)?]));
    while i < props.len() {
        let id = props[i];
        i += 1;
        match id {
            0x13 => return u16_at(i),
            0x24 | 0x25 | 0x28 | 0x29 | 0x2A => i += 1,
            0x21 | 0x22 => i += 2,
            0x11 | 0x27 => i += 4,
            0x12 | 0x1A | 0x1C | 0x1F | 0x15 | 0x16 => i += 2 + usize::from(u16_at(i)?),
            0x26 => {
                i += 2 + usize::from(u16_at(i)?);
                i += 2 + usize::from(u16_at(i)?);
            }
            _ => return None,
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------------
// Sockets, TLS, floods

/// A TCP connection to `127.0.0.1:port` from `source` (any port).
async fn connect_from(source: [u8; 4], port: u16) -> std::io::Result<TcpStream> {
    let sock = TcpSocket::new_v4()?;
    sock.bind(SocketAddr::from((source, 0)))?;
    sock.connect(SocketAddr::from(([127, 0, 0, 1], port))).await
}

fn tls_connector(srv: &Server) -> tokio_rustls::TlsConnector {
    tokio_rustls::TlsConnector::from(tls_client_config(&srv.ca_pem))
}

/// Opens `n` TCP connections that send nothing, then says which of them the server closed within
/// `settle` (refused at accept) and returns the ones it still holds.
async fn idle_flood(port: u16, n: usize, settle: Duration) -> (usize, Vec<TcpStream>) {
    let mut socks = Vec::with_capacity(n);
    for _ in 0..n {
        // A connect that fails (a full accept queue) counts as a refusal too.
        if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(5), connect_from([127, 0, 0, 1], port)).await {
            socks.push(s);
        }
    }
    let not_connected = n - socks.len();
    tokio::time::sleep(settle).await;
    let checks = socks.into_iter().map(|mut s| async move {
        // Generous for a loaded machine, and still well within the 10 s handshake timeout that would
        // close the held ones too.
        let closed = closed_within(&mut s, Duration::from_secs(3)).await;
        (closed, s)
    });
    let mut refused = not_connected;
    let mut held = Vec::new();
    for (closed, s) in futures::future::join_all(checks).await {
        if closed {
            refused += 1;
        } else {
            held.push(s);
        }
    }
    (refused, held)
}

fn owner_token(srv: &Server) -> String {
    service_sas(&srv.host_name, "iothubowner", &srv.owner_key, unix_now() + 3600)
}

/// A back end over raw TLS from `source`: CONNECT as iothubowner, SUBSCRIBE `twin-changes/#`.
async fn raw_backend(srv: &Server, source: [u8; 4], client_id: &str) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = connect_from(source, srv.events_port).await.expect("TCP to the event broker");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("server name");
    let mut tls = tokio::time::timeout(WAIT, tls_connector(srv).connect(name, tcp))
        .await
        .expect("TLS handshake in time")
        .expect("TLS handshake");
    tls.write_all(&connect_packet(client_id, 30, "iothubowner", &owner_token(srv), None)).await.unwrap();
    let ack = tokio::time::timeout(WAIT, read_packet(&mut tls)).await.expect("CONNACK in time");
    assert_eq!(ack, Some((0x20, vec![0, 0])), "CONNACK accepted");
    tls.write_all(&subscribe_packet(1, "twin-changes/#")).await.unwrap();
    let suback = tokio::time::timeout(WAIT, read_packet(&mut tls)).await.expect("SUBACK in time");
    assert_eq!(suback.map(|(f, _)| f), Some(0x90), "SUBACK");
    tls
}

/// rumqttc back end over TLS from 127.0.0.1, subscribed to `twin-changes/#`.
async fn backend(srv: &Server, client_id: &str) -> (AsyncClient, rumqttc::EventLoop) {
    let mut o = MqttOptions::new(client_id, "localhost", srv.events_port);
    o.set_transport(rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(tls_client_config(
        &srv.ca_pem,
    ))));
    o.set_keep_alive(Duration::from_secs(30));
    o.set_max_packet_size(2 * 1024 * 1024, 64 * 1024);
    o.set_credentials("iothubowner", owner_token(srv));
    let (client, mut el) = AsyncClient::new(o, 64);
    loop {
        match tokio::time::timeout(WAIT, el.poll()).await.expect("CONNACK in time").expect("back end connects") {
            Event::Incoming(Packet::ConnAck(a)) => {
                assert_eq!(a.code, ConnectReturnCode::Success);
                break;
            }
            _ => continue,
        }
    }
    client.subscribe("twin-changes/#", QoS::AtMostOnce).await.expect("subscribe");
    loop {
        match tokio::time::timeout(WAIT, el.poll()).await.expect("SUBACK in time").expect("connection") {
            Event::Incoming(Packet::SubAck(_)) => return (client, el),
            _ => continue,
        }
    }
}

/// The next `twin-changes` publish of a rumqttc back end within `d`.
async fn rumqttc_publish(el: &mut rumqttc::EventLoop, d: Duration) -> Option<(String, Value)> {
    let deadline = tokio::time::Instant::now() + d;
    loop {
        match tokio::time::timeout_at(deadline, el.poll()).await {
            Err(_) | Ok(Err(_)) => return None,
            Ok(Ok(Event::Incoming(Packet::Publish(p)))) => {
                return Some((p.topic, serde_json::from_slice(&p.payload).unwrap_or(Value::Null)));
            }
            Ok(Ok(_)) => {}
        }
    }
}

/// A metric's value on `/metrics` (a line `name value`, no labels); `None` if absent.
async fn metric(srv: &Server, name: &str) -> Option<f64> {
    let text = srv.http_client().get(format!("{}/metrics", srv.base_url)).send().await.ok()?.text().await.ok()?;
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

// ---------------------------------------------------------------------------------------------------
// Devices

struct Dev {
    id: String,
    key: String,
}

impl Dev {
    fn username(&self) -> String {
        format!("localhost/{}/?{API}", self.id)
    }

    fn token(&self) -> String {
        device_token("localhost", &self.id, None, &self.key, unix_now() + 3600)
    }
}

async fn new_device(api: &Api, id: &str) -> Dev {
    let doc = api.must_create_device(id).await;
    let key = doc.pointer("/authentication/symmetricKey/primaryKey").and_then(Value::as_str).expect("key").to_string();
    Dev { id: id.into(), key }
}

/// A raw MQTT 3.1.1 device session on the plain port from `source`, CONNACK checked.
async fn device_session(srv: &Server, source: [u8; 4], dev: &Dev, keep_alive: u16) -> TcpStream {
    let mut s = connect_from(source, srv.mqtt_plain_port).await.expect("TCP to the MQTT port");
    s.write_all(&connect_packet(&dev.id, keep_alive, &dev.username(), &dev.token(), None)).await.unwrap();
    let ack = tokio::time::timeout(WAIT, read_packet(&mut s)).await.expect("CONNACK in time");
    assert_eq!(ack, Some((0x20, vec![0, 0])), "{} connects", dev.id);
    s
}

/// `$iothub/twin/GET` on a raw session; the answer's status topic.
async fn get_twin(s: &mut TcpStream, rid: &str) -> String {
    s.write_all(&publish_packet(&format!("$iothub/twin/GET/?$rid={rid}"), b"")).await.unwrap();
    let (topic, _) = next_publish(s, WAIT).await.expect("twin GET answered");
    topic
}

fn rumqttc_device(srv: &Server, dev: &Dev, keep_alive: u64) -> MqttOptions {
    let mut o = MqttOptions::new(dev.id.clone(), "127.0.0.1", srv.mqtt_plain_port);
    o.set_credentials(dev.username(), dev.token());
    o.set_keep_alive(Duration::from_secs(keep_alive));
    o
}

/// The CONNACK code rumqttc gets, or the connection error.
async fn rumqttc_connack(o: MqttOptions) -> Result<ConnectReturnCode, String> {
    let (_c, mut el) = AsyncClient::new(o, 8);
    match tokio::time::timeout(WAIT, el.poll()).await.expect("CONNACK in time") {
        Ok(Event::Incoming(Packet::ConnAck(a))) => Ok(a.code),
        Err(ConnectionError::ConnectionRefused(code)) => Ok(code),
        other => Err(format!("{other:?}")),
    }
}

// ---------------------------------------------------------------------------------------------------
// (a) The event broker under a flood of idle TCP connections

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_to_the_event_broker_do_not_lock_out_back_ends() {
    let srv = Server::start(ServerOpts {
        extra_args: vec!["--max-unauthenticated-per-source".into(), "32".into()],
        ..Default::default()
    });
    let api = srv.owner();
    // A back end connected before the flood, from the flooding address itself.
    let (_before, mut before_el) = backend(&srv, "before").await;

    let (refused, held) = idle_flood(srv.events_port, 200, Duration::from_millis(500)).await;
    eprintln!("events flood: {refused} of 200 idle connections refused, {} held", held.len());
    assert!(refused >= 200 - 32, "only {refused} of 200 refused");
    assert!(held.len() <= 32, "{} idle connections held", held.len());

    // During the flood: a new back end from another address connects and gets a change event...
    let started = Instant::now();
    let mut during = raw_backend(&srv, [127, 0, 0, 2], "during").await;
    let connect_time = started.elapsed();
    eprintln!("events flood: new back end connected in {connect_time:?}");
    assert!(connect_time < Duration::from_secs(5), "connecting took {connect_time:?}");
    let changed = Instant::now();
    api.must_create_device("flooded").await;
    let (topic, _) = next_publish(&mut during, WAIT).await.expect("the new back end gets the event");
    assert_eq!(topic, "twin-changes/flooded");
    eprintln!("events flood: change event delivered in {:?}", changed.elapsed());
    // ...and so does the one connected before it.
    let (topic, _) = rumqttc_publish(&mut before_el, WAIT).await.expect("the earlier back end gets the event");
    assert_eq!(topic, "twin-changes/flooded");
    drop(held);
}

// ---------------------------------------------------------------------------------------------------
// (b) rumqttd's internal loopback port

/// The internal broker's address, from the node's log line `event broker ready ... internal=ADDR`. The
/// broker starts beside the front doors, so the line can come a few milliseconds after the node said it
/// is ready: the log is read again until it is there (at most 10 s).
async fn internal_broker_addr(srv: &Server) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        let log = std::fs::read_to_string(&srv.log_path).expect("server log");
        if let Some(line) = log.lines().rev().find(|l| l.contains("event broker ready")) {
            break line.to_string();
        }
        assert!(Instant::now() < deadline, "no `event broker ready` line in the node's log within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let at = line.find("internal=").expect("internal address logged") + "internal=".len();
    line[at..].split_whitespace().next().and_then(|a| a.parse().ok()).expect("internal address")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_internal_broker_port_is_useless_to_local_clients_and_no_back_end_can_publish() {
    let srv = Server::start_default();
    let api = srv.owner();
    // The node installs its metrics recorder on its first HTTP request; count from here on.
    assert_eq!(metric(&srv, "twinhub_notify_broker_internal_login_refused_total").await, None);
    let internal = internal_broker_addr(&srv).await;
    assert_ne!(internal.port(), srv.events_port);
    let (_sub, mut sub_el) = backend(&srv, "subscriber").await;

    // A local process with a valid iothubowner login, straight to the loopback port, pipelining a
    // forged event after its CONNECT: no CONNACK 0, and nothing reaches the subscriber.
    let mut s = TcpStream::connect(internal).await.expect("loopback port reachable");
    s.write_all(&connect_packet("forger", 30, "iothubowner", &owner_token(&srv), None)).await.unwrap();
    s.write_all(&publish_packet("twin-changes/victim", br#"{"forged":true}"#)).await.unwrap();
    let first = tokio::time::timeout(WAIT, read_packet(&mut s)).await.expect("answered or closed in time");
    assert!(!matches!(first, Some((0x20, ref b)) if b.get(1) == Some(&0)), "direct login accepted: {first:?}");
    // rumqttc says the same.
    let mut o = MqttOptions::new("forger2", internal.ip().to_string(), internal.port());
    o.set_credentials("iothubowner", owner_token(&srv));
    assert!(rumqttc_connack(o).await != Ok(ConnectReturnCode::Success), "rumqttc logged in directly");
    // Both were turned away by rumqttd's login check, not by accident.
    let refused = metric(&srv, "twinhub_notify_broker_internal_login_refused_total").await;
    assert_eq!(refused, Some(2.0), "internal login refusals");

    // Through the gate: a will (a publish rumqttd would make for the client) is refused...
    let tcp = connect_from([127, 0, 0, 1], srv.events_port).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = tls_connector(&srv).connect(name, tcp).await.expect("TLS");
    let will = Some(("twin-changes/victim", &br#"{"forged":true}"#[..]));
    tls.write_all(&connect_packet("willer", 30, "iothubowner", &owner_token(&srv), will)).await.unwrap();
    let ack = tokio::time::timeout(WAIT, read_packet(&mut tls)).await.expect("CONNACK in time");
    assert_eq!(ack, Some((0x20, vec![0, 5])), "a CONNECT with a will is not authorized");
    // ...and a back end naming itself after the node's feed link does not take the feed over.
    let mut feed_thief = raw_backend(&srv, [127, 0, 0, 1], "twinhub-feed").await;

    assert!(rumqttc_publish(&mut sub_el, Duration::from_secs(3)).await.is_none(), "the subscriber got a forged event");
    api.must_create_device("victim").await;
    let (topic, v) = rumqttc_publish(&mut sub_el, WAIT).await.expect("a real change still arrives");
    assert_eq!(topic, "twin-changes/victim");
    assert!(v.get("forged").is_none(), "{v}");
    let (topic, _) = next_publish(&mut feed_thief, WAIT).await.expect("the feed still publishes");
    assert_eq!(topic, "twin-changes/victim");
}

// ---------------------------------------------------------------------------------------------------
// (c) Keep-alive 0

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_zero_is_bounded_by_the_maximum_keep_alive() {
    let srv = Server::start(ServerOpts {
        extra_args: vec!["--mqtt-max-keep-alive-secs".into(), "2".into()],
        ..Default::default()
    });
    let api = srv.owner();
    let dev = new_device(&api, "ka0").await;

    // MQTT 5 clients are told the keep-alive they got (raw: rumqttc refuses to send keep-alive 0 in v5).
    let mut s = connect_from([127, 0, 0, 1], srv.mqtt_plain_port).await.unwrap();
    s.write_all(&connect_v5(&dev.id, 0, &dev.username(), &dev.token())).await.unwrap();
    let (first, body) = tokio::time::timeout(WAIT, read_packet(&mut s)).await.unwrap().expect("v5 CONNACK");
    assert_eq!((first, body[1]), (0x20, 0), "v5 CONNACK accepted");
    assert_eq!(server_keep_alive(&body), Some(2), "server keep-alive in CONNACK");
    drop(s);

    // An MQTT 3.1.1 connection with keep-alive 0 that then says nothing is closed after 1.5 × 2 s.
    let mut s = device_session(&srv, [127, 0, 0, 1], &dev, 0).await;
    let silent = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(15)).await, "keep-alive 0 idled for 15 s");
    let after = silent.elapsed();
    eprintln!("keep-alive 0: closed after {after:?} (bound 2 s, grace 3 s)");
    assert!(after >= Duration::from_millis(2500), "closed after {after:?}, before 1.5 × the bound");
}

// ---------------------------------------------------------------------------------------------------
// (d) X.509 identities and SAS logins

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x509_identities_are_refused_sas_logins() {
    let srv = Server::start_default();
    let api = srv.owner();
    let sas = new_device(&api, "sasdev").await;
    // Keys stored for an X.509 device (the registry keeps what it is given) must not open a SAS login.
    let key = "c2VjcmV0LWtleS1mb3ItdGVzdHMtMDEyMzQ1Njc4OQ==";
    let thumbs = json!({"primaryThumbprint": "A".repeat(40), "secondaryThumbprint": "B".repeat(40)});
    for (id, kind) in [("x509self", "selfSigned"), ("x509ca", "certificateAuthority")] {
        let body = json!({"deviceId": id, "authentication": {
            "type": kind, "x509Thumbprint": thumbs, "symmetricKey": {"primaryKey": key, "secondaryKey": key}}});
        api.must_ok("PUT", &format!("/devices/{id}"), Some(&body), &[]).await;
        let dev = Dev { id: id.into(), key: key.into() };
        let code = rumqttc_connack(rumqttc_device(&srv, &dev, 30)).await;
        assert_eq!(code, Ok(ConnectReturnCode::NotAuthorized), "{kind} device with a valid SAS token");
    }
    // Without any key, too.
    let body = json!({"deviceId": "x509nokey", "authentication": {"type": "selfSigned", "x509Thumbprint": thumbs}});
    api.must_ok("PUT", "/devices/x509nokey", Some(&body), &[]).await;
    let dev = Dev { id: "x509nokey".into(), key: key.into() };
    assert_eq!(rumqttc_connack(rumqttc_device(&srv, &dev, 30)).await, Ok(ConnectReturnCode::NotAuthorized));
    // A module of type selfSigned under a SAS device.
    let body = json!({"deviceId": "sasdev", "moduleId": "m509", "authentication": {
        "type": "selfSigned", "x509Thumbprint": thumbs, "symmetricKey": {"primaryKey": key, "secondaryKey": key}}});
    let r = api.send("PUT", "/devices/sasdev/modules/m509", Some(&body), &[]).await;
    assert!(r.status == 200 || r.status == 201, "{}", r.text);
    let mut o = MqttOptions::new("sasdev/m509", "127.0.0.1", srv.mqtt_plain_port);
    o.set_credentials(
        format!("localhost/sasdev/m509/?{API}"),
        device_token("localhost", "sasdev", Some("m509"), key, unix_now() + 3600),
    );
    assert_eq!(rumqttc_connack(o).await, Ok(ConnectReturnCode::NotAuthorized), "selfSigned module");
    // The SAS device still logs in.
    assert_eq!(rumqttc_connack(rumqttc_device(&srv, &sas, 30)).await, Ok(ConnectReturnCode::Success));
}

// ---------------------------------------------------------------------------------------------------
// (e) What one session can hold

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_cannot_grow_its_session() {
    let srv = Server::start_default();
    let api = srv.owner();
    let dev = new_device(&api, "greedy").await;
    let mut s = connect_from([127, 0, 0, 1], srv.mqtt_plain_port).await.unwrap();
    // Persistent session (clean session 0).
    s.write_all(&connect_packet_with(false, &dev.id, 60, &dev.username(), &dev.token(), None)).await.unwrap();
    assert_eq!(read_packet(&mut s).await, Some((0x20, vec![0, 0])));

    // 40 long filters: the session keeps only what fits its filter budget.
    let mut granted = 0;
    for i in 0..40u16 {
        let filter = format!("devices/greedy/{}/{i}/#", "f".repeat(200));
        s.write_all(&subscribe_packet(i + 1, &filter)).await.unwrap();
        let (first, body) = tokio::time::timeout(WAIT, read_packet(&mut s)).await.unwrap().expect("SUBACK");
        assert_eq!(first, 0x90);
        if body[2] != 0x80 {
            granted += 1;
        }
    }
    eprintln!("session bounds: {granted} of 40 long filters granted");
    assert!(granted < 40 && granted > 0, "{granted} of 40 granted");

    // 200 reported patches with distinct 8 KiB `$rid`s (1.6 MB of `$rid`s in all), answered in order.
    let long = "r".repeat(8 * 1024);
    for i in 0..200 {
        let topic = format!("$iothub/twin/PATCH/properties/reported/?$rid={i}-{long}");
        s.write_all(&publish_packet(&topic, json!({"n": i}).to_string().as_bytes())).await.unwrap();
    }
    for i in 0..200 {
        let (topic, _) = next_publish(&mut s, WAIT).await.unwrap_or_else(|| panic!("answer {i}"));
        assert!(topic.starts_with("$iothub/twin/res/204/"), "{}", &topic[..40.min(topic.len())]);
    }
    let bytes = metric(&srv, "twinhub_mqtt_session_bytes").await.expect("session bytes in /metrics");
    let sessions = metric(&srv, "twinhub_mqtt_sessions").await.expect("sessions in /metrics");
    eprintln!("session bounds: {sessions} session(s) holding {bytes} bytes after 1.6 MB of $rids and 40 filters");
    assert_eq!(sessions, 1.0);
    assert!(bytes > 0.0 && bytes < 8.0 * 1024.0, "one session holds {bytes} bytes");

    // Once the device is gone its session is kept, still bounded.
    s.write_all(&[0xE0, 0x00]).await.unwrap();
    assert!(closed_within(&mut s, WAIT).await);
    let deadline = Instant::now() + WAIT;
    while metric(&srv, "twinhub_mqtt_sessions_detached").await != Some(1.0) {
        assert!(Instant::now() < deadline, "the detached session is not counted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bytes = metric(&srv, "twinhub_mqtt_session_bytes").await.expect("session bytes");
    assert!(bytes < 8.0 * 1024.0, "the detached session holds {bytes} bytes");
}

// ---------------------------------------------------------------------------------------------------
// (f) The device MQTT port under a flood of idle TCP connections

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_to_the_mqtt_port_do_not_stop_devices_or_https() {
    let srv = Server::start_default();
    let api = srv.owner();
    let early = new_device(&api, "early").await;
    let late = new_device(&api, "late").await;
    let mut connected = device_session(&srv, [127, 0, 0, 1], &early, 60).await;

    // 300 idle sockets on the TLS port (the plain port shares its budget), from 127.0.0.1.
    let (refused, held) = idle_flood(srv.mqtt_port, 300, Duration::from_millis(500)).await;
    eprintln!("MQTT flood: {refused} of 300 idle connections refused, {} held", held.len());
    assert!(refused >= 300 - 64, "only {refused} of 300 refused");

    // The connected device gets its twin.
    let started = Instant::now();
    assert!(get_twin(&mut connected, "during").await.starts_with("$iothub/twin/res/200/"));
    eprintln!("MQTT flood: twin GET of the connected device in {:?}", started.elapsed());
    // A new device connects from another address, on the plain port and over TLS.
    let started = Instant::now();
    let mut fresh = device_session(&srv, [127, 0, 0, 2], &late, 60).await;
    eprintln!("MQTT flood: new device connected in {:?}", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(get_twin(&mut fresh, "fresh").await.starts_with("$iothub/twin/res/200/"));
    let tcp = connect_from([127, 0, 0, 2], srv.mqtt_port).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = tokio::time::timeout(WAIT, tls_connector(&srv).connect(name, tcp)).await.unwrap().expect("TLS");
    tls.write_all(&connect_packet("late", 60, &late.username(), &late.token(), None)).await.unwrap();
    assert_eq!(tokio::time::timeout(WAIT, read_packet(&mut tls)).await.unwrap(), Some((0x20, vec![0, 0])));
    // HTTPS is another budget.
    let started = Instant::now();
    api.must_get("/devices/early").await;
    eprintln!("MQTT flood: HTTPS request in {:?}", started.elapsed());
    drop(held);
}

// ---------------------------------------------------------------------------------------------------
// X.509: a certificate login is judged at CONNECT against the identity's registration

/// The CONNACK return code for an MQTT 3.1.1 CONNECT with no password over TLS on the MQTT port,
/// presenting `cert` (a self-signed certificate with its key) as the client certificate.
async fn x509_connack(srv: &Server, client_id: &str, cert: &rcgen::CertifiedKey<rcgen::KeyPair>) -> u8 {
    use rumqttc::tokio_rustls::rustls;
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).expect("key DER");
    let config =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(ca_roots(&srv.ca_pem))
            .with_client_auth_cert(vec![cert.cert.der().clone()], key)
            .expect("client certificate");
    let tcp = TcpStream::connect(("127.0.0.1", srv.mqtt_port)).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut s =
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await.expect("TLS handshake");
    let user = format!("localhost/{client_id}/?{API}");
    let mut var = vec![0, 4, b'M', b'Q', b'T', b'T', 4, 0x80, 0, 60];
    for f in [client_id, user.as_str()] {
        var.extend_from_slice(&(f.len() as u16).to_be_bytes());
        var.extend_from_slice(f.as_bytes());
    }
    assert!(var.len() < 128, "one-byte remaining length");
    let mut pkt = vec![0x10, var.len() as u8];
    pkt.extend_from_slice(&var);
    s.write_all(&pkt).await.expect("CONNECT");
    let mut ack = [0u8; 4];
    tokio::time::timeout(WAIT, s.read_exact(&mut ack)).await.expect("CONNACK in time").expect("CONNACK");
    assert_eq!(ack[..3], [0x20, 2, 0], "a CONNACK");
    ack[3]
}

fn sha1_hex(der: &[u8]) -> String {
    use sha1::Digest;
    sha1::Sha1::digest(der).iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_logins_need_a_matching_x509_registration() {
    let srv = Server::start_default();
    let api = srv.owner();
    let good = rcgen::generate_simple_self_signed(vec!["x5dev".to_string()]).expect("cert");
    let other = rcgen::generate_simple_self_signed(vec!["x5dev".to_string()]).expect("cert");
    let body = json!({"deviceId": "x5dev", "authentication": {"type": "selfSigned",
        "x509Thumbprint": {"primaryThumbprint": sha1_hex(good.cert.der()), "secondaryThumbprint": null}}});
    api.must_ok("PUT", "/devices/x5dev", Some(&body), &[]).await;
    new_device(&api, "x5sas").await;
    assert_eq!(x509_connack(&srv, "x5dev", &good).await, 0, "the registered thumbprint (lower-case hex)");
    assert_eq!(x509_connack(&srv, "x5dev", &other).await, 5, "another certificate");
    assert_eq!(x509_connack(&srv, "x5sas", &good).await, 5, "a certificate login for a SAS device");
    assert_eq!(x509_connack(&srv, "x5nobody", &good).await, 4, "an unknown identity");
    // A certificateAuthority device while the hub has no verified CA.
    let body = json!({"deviceId": "x5ca", "authentication": {"type": "certificateAuthority"}});
    api.must_ok("PUT", "/devices/x5ca", Some(&body), &[]).await;
    assert_eq!(x509_connack(&srv, "x5ca", &good).await, 5, "no verified CA");
}
