//! MQTT over WebSockets on the HTTPS port (`/$iothub/websocket`, subprotocol `mqtt`) against the real
//! `twinhub` binary, with a real WebSocket client (tokio-tungstenite over rustls) carrying hand-built
//! MQTT packets. The official Python device SDK's `websockets=True` is exercised in
//! tests/python/test_websockets.py; this file covers what a stranger can do with the endpoint.

use twinhub_testkit as common;

use std::time::Duration;

use common::raw_mqtt::*;
use common::*;
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

const WAIT: Duration = Duration::from_secs(20);
const PATH: &str = "/$iothub/websocket";

type Ws = tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

async fn tls(srv: &Server) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", srv.port)).await.expect("TCP to the HTTPS port");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("server name");
    let connector = tokio_rustls::TlsConnector::from(without_h2(srv));
    connector.connect(name, tcp).await.expect("TLS handshake")
}

/// WebSocket upgrades are HTTP/1.1: offer no ALPN.
fn without_h2(srv: &Server) -> std::sync::Arc<rustls::ClientConfig> {
    let mut c = (*tls_client_config(&srv.ca_pem)).clone();
    c.alpn_protocols.clear();
    std::sync::Arc::new(c)
}

/// Opens the WebSocket, asking for `subprotocol`; `Err` carries the HTTP status of a refused upgrade.
async fn open(srv: &Server, subprotocol: Option<&str>) -> Result<Ws, (u16, String)> {
    let mut req = format!("wss://localhost:{}{PATH}", srv.port).into_client_request().expect("request");
    if let Some(p) = subprotocol {
        req.headers_mut().insert("Sec-WebSocket-Protocol", HeaderValue::from_str(p).expect("header"));
    }
    match tokio_tungstenite::client_async(req, tls(srv).await).await {
        Ok((ws, resp)) => {
            assert_eq!(resp.headers().get("sec-websocket-protocol").map(|v| v.as_bytes()), Some(&b"mqtt"[..]));
            Ok(ws)
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let body = resp.body().as_ref().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
            Err((resp.status().as_u16(), body))
        }
        Err(e) => Err((0, e.to_string())),
    }
}

/// The WebSocket's binary payload as one byte stream (what the server's MQTT endpoint sees), plus a
/// sender of MQTT bytes.
fn as_stream(ws: Ws) -> (DuplexStream, tokio::sync::mpsc::Sender<Vec<u8>>) {
    let (mut sink, mut source) = ws.split();
    let (mut ours, theirs) = tokio::io::duplex(64 * 1024);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                m = source.next() => match m {
                    Some(Ok(Message::Binary(b))) => if ours.write_all(&b).await.is_err() { break },
                    Some(Ok(_)) => {}
                    _ => break,
                },
                out = rx.recv() => match out {
                    Some(bytes) => if sink.send(Message::Binary(bytes.into())).await.is_err() { break },
                    None => break,
                },
            }
        }
    });
    (theirs, tx)
}

async fn device(api: &Api, id: &str) -> (String, String) {
    let doc = api.must_create_device(id).await;
    let key = doc.pointer("/authentication/symmetricKey/primaryKey").and_then(Value::as_str).expect("key");
    (id.to_string(), key.to_string())
}

fn connect_for(id: &str, key: &str) -> Vec<u8> {
    let token = device_token("localhost", id, None, key, unix_now() + 3600);
    connect_packet(id, 60, &format!("localhost/{id}/?api-version=2021-04-12"), &token, None)
}

#[tokio::test]
async fn a_device_speaks_the_twin_protocol_over_a_websocket() {
    let srv = Server::start_default();
    let api = srv.owner();
    let (id, key) = device(&api, "ws-dev").await;
    let ws = open(&srv, Some("mqtt")).await.expect("upgrade with the mqtt subprotocol");
    let (mut rd, tx) = as_stream(ws);
    tx.send(connect_for(&id, &key)).await.unwrap();
    let (first, body) = tokio::time::timeout(WAIT, read_packet(&mut rd)).await.unwrap().expect("CONNACK");
    assert_eq!((first, body.as_slice()), (0x20, &[0u8, 0][..]), "CONNACK accepted");

    // A twin GET without any subscription is answered on the requesting connection.
    tx.send(publish_packet("$iothub/twin/GET/?$rid=42", b" ")).await.unwrap();
    let (topic, payload) = next_publish(&mut rd, WAIT).await.expect("twin response");
    assert_eq!(topic, "$iothub/twin/res/200/?$rid=42");
    let twin: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(twin["desired"]["$version"], 1, "{twin}");

    tx.send(publish_packet("$iothub/twin/PATCH/properties/reported/?$rid=43", br#"{"over":"wss"}"#)).await.unwrap();
    let (topic, _) = next_publish(&mut rd, WAIT).await.expect("patch response");
    assert_eq!(topic, "$iothub/twin/res/204/?$rid=43&$version=2");
    let t = api.must_get_twin(&id).await;
    assert_eq!(t["properties"]["reported"]["over"], "wss");
    assert_eq!(t["connectionState"], "Connected");
}

#[tokio::test]
async fn wrong_credentials_over_a_websocket_are_refused_in_connack() {
    let srv = Server::start_default();
    let api = srv.owner();
    let (id, _key) = device(&api, "ws-bad").await;
    let (_, other_key) = device(&api, "ws-other").await;
    let (mut rd, tx) = as_stream(open(&srv, Some("mqtt")).await.expect("upgrade"));
    tx.send(connect_for(&id, &other_key)).await.unwrap();
    let (first, body) = tokio::time::timeout(WAIT, read_packet(&mut rd)).await.unwrap().expect("CONNACK");
    // 4 (bad user name or password) as on port 8883; the SDKs treat 4 and 5 alike as a credential error.
    assert_eq!((first, body.as_slice()), (0x20, &[0u8, 4][..]), "refused");
    assert!(tokio::time::timeout(WAIT, read_packet(&mut rd)).await.unwrap().is_none(), "closed after the refusal");
}

#[tokio::test]
async fn upgrades_without_the_mqtt_subprotocol_or_without_websocket_are_refused() {
    let srv = Server::start_default();
    let (status, body) = open(&srv, None).await.expect_err("refused without a subprotocol");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("ArgumentInvalid") && body.contains("subprotocol"), "{body}");
    let (status, _) = open(&srv, Some("chat")).await.expect_err("refused with another subprotocol");
    assert_eq!(status, 400);

    // A plain GET (no upgrade) is a clear 400, not a hang or a 404.
    let r = srv.api_raw_auth(None).send("GET", PATH, None, &[]).await;
    assert_error(&r, 400, "ArgumentInvalid");
    assert!(r.message().contains("WebSocket"), "{}", r.message());
}

#[tokio::test]
async fn idle_upgraded_sockets_are_bounded_and_closed_like_mqtt_ones() {
    let srv = Server::start(ServerOpts {
        extra_args: vec![
            "--max-unauthenticated-per-source".into(),
            "4".into(),
            "--handshake-timeout-secs".into(),
            "2".into(),
        ],
        ..Default::default()
    });
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..12 {
        match open(&srv, Some("mqtt")).await {
            Ok(ws) => held.push(ws),
            Err((status, body)) => {
                assert!(status == 503 || status == 0, "refusal {status}: {body}");
                refused += 1;
            }
        }
    }
    eprintln!("{} upgraded, {refused} refused", held.len());
    assert!(held.len() <= 4, "{} idle upgraded sockets held past the unauthenticated budget", held.len());
    assert!(refused >= 8);
    // Without a CONNECT, the server closes each within the handshake timeout (plus slack).
    for ws in held.iter_mut() {
        let end = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match ws.next().await {
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => {}
                }
            }
        })
        .await;
        assert!(end.is_ok(), "an idle upgraded socket was not closed");
    }
    // Once they are gone, a device gets through again.
    let api = srv.owner();
    let (id, key) = device(&api, "ws-after").await;
    let (mut rd, tx) = as_stream(open(&srv, Some("mqtt")).await.expect("upgrade after the flood"));
    tx.send(connect_for(&id, &key)).await.unwrap();
    let (first, body) = tokio::time::timeout(WAIT, read_packet(&mut rd)).await.unwrap().expect("CONNACK");
    assert_eq!((first, body[1]), (0x20, 0));
}
