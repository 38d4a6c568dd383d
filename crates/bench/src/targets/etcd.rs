//! etcd (3.4) as a `Target`: an update is a put of the JSON value under `twins/<key>` through the v3
//! JSON gRPC gateway (`POST /v3/kv/put`, base64 key and value, plain HTTP/1.1 keep-alive, one connection
//! per worker, workers spread over the members). The watch is `POST /v3/watch` on the `twins/` prefix,
//! a streaming response of one JSON message per line.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::task::JoinHandle;

use super::{Client, OpError, Target, WatchCounts};
use crate::http::HttpConn;

pub const PREFIX: &str = "twins/";

pub struct Etcd {
    /// Client URLs of the members (`127.0.0.1:PORT`).
    pub members: Vec<SocketAddr>,
}

pub struct EtcdClient {
    conn: HttpConn,
}

impl Target for Etcd {
    type Client = EtcdClient;

    fn name(&self) -> &'static str {
        "etcd"
    }

    fn protocol(&self) -> String {
        format!(
            "HTTP/1.1 keep-alive (plain), etcd v3 JSON gateway POST /v3/kv/put, one connection per worker over {} members",
            self.members.len()
        )
    }

    async fn client(&self, worker: usize) -> anyhow::Result<EtcdClient> {
        let addr = self.members[worker % self.members.len()];
        Ok(EtcdClient { conn: HttpConn::new(addr, None, addr.to_string()) })
    }

    async fn watch(&self, counts: Arc<WatchCounts>) -> anyhow::Result<JoinHandle<()>> {
        let addr = self.members[0];
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let body = serde_json::json!({"create_request": {
            "key": B64.encode(PREFIX),
            "range_end": B64.encode(prefix_end(PREFIX.as_bytes())),
        }})
        .to_string();
        let req = hyper::Request::builder()
            .method("POST")
            .uri("/v3/watch")
            .header("host", addr.to_string())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let resp = sender.send_request(req).await?;
        if resp.status() != 200 {
            anyhow::bail!("etcd watch: HTTP {}", resp.status());
        }
        let mut body = resp.into_body();
        let (created_tx, created_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _sender = sender;
            let mut created_tx = Some(created_tx);
            let mut buf: Vec<u8> = Vec::new();
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else { return };
                let Some(data) = frame.data_ref() else { continue };
                buf.extend_from_slice(data);
                while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=nl).collect();
                    let Ok(v) = serde_json::from_slice::<WatchLine>(&line) else { continue };
                    if let Some(t) = created_tx.take() {
                        let _ = t.send(());
                    }
                    let n = v.result.and_then(|r| r.events).map_or(0, |e| e.len() as u64);
                    if n > 0 {
                        counts.notifications.fetch_add(1, Ordering::Relaxed);
                        counts.changes.fetch_add(n, Ordering::Relaxed);
                    }
                }
            }
        });
        tokio::time::timeout(std::time::Duration::from_secs(10), created_rx)
            .await
            .map_err(|_| anyhow::anyhow!("etcd watch: no 'created' message within 10 s"))?
            .map_err(|_| anyhow::anyhow!("etcd watch: stream ended before 'created'"))?;
        Ok(task)
    }

    fn watch_kind(&self) -> String {
        "etcd watch on member 1: POST /v3/watch, key range twins/ .. twins0 (a message may carry several events)".into()
    }
}

/// The end of the key range of a prefix: the prefix with its last byte incremented.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Client for EtcdClient {
    async fn update(&mut self, key: &str, value: &str) -> Result<(), OpError> {
        let body =
            format!("{{\"key\":\"{}\",\"value\":\"{}\"}}", B64.encode(format!("{PREFIX}{key}")), B64.encode(value));
        let r = self.conn.request("POST", "/v3/kv/put", &[], Some(Bytes::from(body))).await?;
        if r.status != 200 {
            let text = String::from_utf8_lossy(&r.body[..r.body.len().min(300)]).to_string();
            return Err(OpError::new(&format!("http_{}", r.status), text));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefix_end() {
        assert_eq!(super::prefix_end(b"twins/"), b"twins0".to_vec());
    }
}

/// What the watch reads of a line of the gateway's watch stream: how many events it carries. The rest
/// is checked to be JSON and skipped, without building a tree of it (as the twinhub watch does).
#[derive(serde::Deserialize)]
struct WatchLine {
    result: Option<WatchResult>,
}

#[derive(serde::Deserialize)]
struct WatchResult {
    events: Option<Vec<serde::de::IgnoredAny>>,
}
