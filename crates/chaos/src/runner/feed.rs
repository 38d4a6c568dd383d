//! A change-feed consumer for the chaos workload: follows `GET /twin-changes` on one node, as a back
//! end would, and records each twin change event of the scenario's twins (`FeedEvent`) and each
//! resync (`FeedResync`, for every twin) into the history. When its stream ends or fails (the node was
//! killed, partitioned, restarted) it reconnects — to the next node — with `Last-Event-ID`; a node that
//! cannot serve that position answers `resync`, which is what the checker then sees. Each connection is
//! its own history client (order is promised per connection, delivery across them).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::history::{Op, OpKind, Outcome};
use crate::runner::util::now_ns;
use crate::runner::workload::Shared;

/// Longest wait for a connection and the stream's head.
const OPEN_TIMEOUT: Duration = Duration::from_secs(3);
/// With no byte for this long (the hub sends keep-alives every 15 s), the stream is given up on.
const SILENCE: Duration = Duration::from_secs(20);

/// Follows the feed until `stop` (set after the final reads, so late events still arrive). `ready` fires once the first stream is open (the workload
/// starts after it, so every write is the feed's business).
pub async fn consumer(shared: Arc<Shared>, twins: Vec<String>, ready: oneshot::Sender<()>, stop: Arc<AtomicBool>) {
    let twins: HashSet<String> = twins.into_iter().collect();
    let mut ready = Some(ready);
    let mut last_id: Option<String> = None;
    let mut node = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let client = shared.rec.client();
        if let Err(e) = follow(&shared, &twins, node, client, &mut last_id, &mut ready, &stop).await {
            crate::say!("feed consumer on node {}: {e}; reconnecting", shared.node_ids[node]);
        }
        node = (node + 1) % shared.http.len();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn record(shared: &Shared, client: u64, twin: &str, kind: OpKind, node: u64) {
    let at = now_ns();
    shared.rec.push_via(
        Op {
            client,
            twin: twin.to_string(),
            invoke_ns: at,
            complete_ns: Some(at),
            kind,
            outcome: Outcome::ok(),
            final_read: false,
        },
        Some(node),
    );
}

async fn follow(
    shared: &Shared,
    twins: &HashSet<String>,
    node: usize,
    client: u64,
    last_id: &mut Option<String>,
    ready: &mut Option<oneshot::Sender<()>>,
    stop: &AtomicBool,
) -> Result<(), String> {
    let addr = shared.http[node];
    let node_id = shared.node_ids[node];
    let open = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
        let name = ServerName::try_from(shared.hostname.clone()).map_err(|e| e.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(shared.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("tls: {e}"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let expiry = twinhub::model::now_ms() as u64 / 1000 + 3600;
        let token = twinhub::auth::client::service_token(&shared.hostname, "iothubowner", &shared.owner_key, expiry)
            .map_err(|e| e.to_string())?;
        let mut req = hyper::Request::get("/twin-changes?api-version=2021-04-12")
            .header(hyper::header::HOST, &shared.hostname)
            .header(hyper::header::AUTHORIZATION, token);
        if let Some(id) = last_id.as_ref() {
            req = req.header("last-event-id", id.as_str());
        }
        let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| format!("request: {e}"))?;
        if resp.status() != 200 {
            return Err(format!("HTTP {}", resp.status()));
        }
        Ok(resp)
    };
    let resp = tokio::time::timeout(OPEN_TIMEOUT, open).await.map_err(|_| "no stream in time".to_string())??;
    if let Some(r) = ready.take() {
        // The consumer's baseline: it starts following here.
        for t in twins {
            record(shared, client, t, OpKind::FeedResync, node_id);
        }
        let _ = r.send(());
    }
    let mut body = resp.into_body();
    let mut buf = String::new();
    let (mut event, mut id, mut data) = (String::new(), None::<String>, String::new());
    let mut heard = std::time::Instant::now();
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let frame = match tokio::time::timeout(Duration::from_millis(500), body.frame()).await {
            Err(_) if heard.elapsed() > SILENCE => return Err(format!("nothing for {SILENCE:?}")),
            Err(_) => continue,
            Ok(None) => return Err("the stream ended".into()),
            Ok(Some(Err(e))) => return Err(format!("stream: {e}")),
            Ok(Some(Ok(f))) => f,
        };
        let Some(chunk) = frame.data_ref() else { continue };
        heard = std::time::Instant::now();
        buf.push_str(&String::from_utf8_lossy(chunk));
        while let Some(end) = buf.find('\n') {
            let line: String = buf.drain(..=end).collect();
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if !data.is_empty() {
                    handle(shared, twins, client, node_id, &event, &data);
                    if id.is_some() {
                        *last_id = id.clone();
                    }
                }
                (event, id, data) = (String::new(), None, String::new());
            } else if let Some(v) = line.strip_prefix("event:") {
                event = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("id:") {
                id = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push_str(v.trim_start());
            }
        }
    }
}

fn handle(shared: &Shared, twins: &HashSet<String>, client: u64, node: u64, event: &str, data: &str) {
    match event {
        "resync" => {
            for t in twins {
                record(shared, client, t, OpKind::FeedResync, node);
            }
        }
        "twinChangeEvents" => {
            let Ok(v) = serde_json::from_str::<Value>(data) else { return };
            let Some(device) = v["properties"]["deviceId"].as_str() else { return };
            // Module twins are not in the workload.
            if v["properties"]["moduleId"].is_string() || !twins.contains(device) {
                return;
            }
            let Some(version) = v["body"]["version"].as_i64() else { return };
            let merged = v["merged"].as_i64().unwrap_or(1);
            record(shared, client, device, OpKind::FeedEvent { version, merged }, node);
        }
        _ => {}
    }
}
