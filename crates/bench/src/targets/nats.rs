//! NATS JetStream KV as a `Target`, speaking the NATS text protocol over TCP (no client library): an
//! update is `PUB $KV.<bucket>.<key> <inbox>.<n>` with the JSON value, then waiting for the JetStream
//! publish ack on the inbox — exactly what a KV `put` does. One connection per worker, workers spread
//! over the servers. The watch is a core subscription to `$KV.<bucket>.>` on server 1.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use super::{Client, OpError, Target, WatchCounts};

pub const BUCKET: &str = "twins";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Nats {
    pub servers: Vec<SocketAddr>,
    pub bucket: String,
    /// Whether the servers fsync before every ack; only names the row (`nats` or `nats-nofsync`).
    pub fsync: bool,
}

/// One message delivered to a subscription.
pub struct Delivered {
    pub subject: String,
    /// Raw header block of an HMSG (empty for MSG).
    pub headers: Bytes,
    pub payload: Bytes,
}

/// A NATS connection with a private inbox subscription for request/reply.
pub struct NatsConn {
    rd: BufReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
    inbox: String,
    next: u64,
    line: Vec<u8>,
}

impl NatsConn {
    pub async fn connect(addr: SocketAddr) -> Result<NatsConn, OpError> {
        let tcp = TcpStream::connect(addr).await.map_err(|e| OpError::new("connect", e))?;
        let _ = tcp.set_nodelay(true);
        let (rd, wr) = tcp.into_split();
        let mut c = NatsConn {
            rd: BufReader::with_capacity(64 * 1024, rd),
            wr,
            inbox: format!("_INBOX.fb{:016x}", rand::random::<u64>()),
            next: 0,
            line: Vec::new(),
        };
        let info = c.read_line().await?;
        if !info.starts_with("INFO ") {
            return Err(OpError::new("protocol", format!("expected INFO, got {info}")));
        }
        let connect = r#"{"verbose":false,"pedantic":false,"lang":"rust","name":"twinhub-bench","version":"0.1.0","protocol":1,"headers":true,"no_responders":true}"#;
        let sub = format!("CONNECT {connect}\r\nSUB {}.* 1\r\nPING\r\n", c.inbox);
        c.wr.write_all(sub.as_bytes()).await.map_err(|e| OpError::new("io", e))?;
        loop {
            let l = c.read_line().await?;
            if l == "PONG" {
                break;
            }
            if l.starts_with("-ERR") {
                return Err(OpError::new("nats_err", l));
            }
        }
        Ok(c)
    }

    async fn read_line(&mut self) -> Result<String, OpError> {
        self.line.clear();
        let n = self.rd.read_until(b'\n', &mut self.line).await.map_err(|e| OpError::new("io", e))?;
        if n == 0 {
            return Err(OpError::new("io", "connection closed"));
        }
        Ok(String::from_utf8_lossy(&self.line).trim_end().to_string())
    }

    /// Subscribes to `subject` (with `sid` ≥ 2; 1 is the inbox).
    pub async fn subscribe(&mut self, subject: &str, sid: u64) -> Result<(), OpError> {
        self.wr
            .write_all(format!("SUB {subject} {sid}\r\nPING\r\n").as_bytes())
            .await
            .map_err(|e| OpError::new("io", e))?;
        Ok(())
    }

    /// The next message for any subscription, answering server PINGs on the way.
    pub async fn next_msg(&mut self) -> Result<Delivered, OpError> {
        loop {
            let l = self.read_line().await?;
            if l == "PING" {
                self.wr.write_all(b"PONG\r\n").await.map_err(|e| OpError::new("io", e))?;
                continue;
            }
            if l == "PONG" || l == "+OK" || l.starts_with("INFO ") {
                continue;
            }
            if l.starts_with("-ERR") {
                return Err(OpError::new("nats_err", l));
            }
            let parts: Vec<&str> = l.split_ascii_whitespace().collect();
            let num =
                |s: &str| s.parse::<usize>().map_err(|_| OpError::new("protocol", format!("bad header line {l}")));
            let (subject, hlen, total) = match parts.first().copied() {
                Some("MSG") if parts.len() == 4 || parts.len() == 5 => (parts[1], 0, num(parts[parts.len() - 1])?),
                Some("HMSG") if parts.len() == 5 || parts.len() == 6 => {
                    (parts[1], num(parts[parts.len() - 2])?, num(parts[parts.len() - 1])?)
                }
                _ => return Err(OpError::new("protocol", format!("unexpected line {l}"))),
            };
            let subject = subject.to_string();
            let mut buf = vec![0u8; total + 2];
            self.rd.read_exact(&mut buf).await.map_err(|e| OpError::new("io", e))?;
            buf.truncate(total);
            let mut all = Bytes::from(buf);
            let payload = all.split_off(hlen.min(total));
            return Ok(Delivered { subject, headers: all, payload });
        }
    }

    /// Publishes `payload` to `subject` with a reply inbox and waits for the reply.
    pub async fn request(&mut self, subject: &str, payload: &[u8]) -> Result<Bytes, OpError> {
        self.next += 1;
        let reply = format!("{}.{}", self.inbox, self.next);
        let mut out = Vec::with_capacity(payload.len() + subject.len() + reply.len() + 32);
        out.extend_from_slice(format!("PUB {subject} {reply} {}\r\n", payload.len()).as_bytes());
        out.extend_from_slice(payload);
        out.extend_from_slice(b"\r\n");
        self.wr.write_all(&out).await.map_err(|e| OpError::new("io", e))?;
        let wait = async {
            loop {
                let m = self.next_msg().await?;
                if m.subject != reply {
                    continue; // a late reply to an earlier, timed-out request
                }
                if !m.headers.is_empty() && m.payload.is_empty() {
                    let h = String::from_utf8_lossy(&m.headers);
                    let kind = if h.contains(" 503") { "no_responders" } else { "status" };
                    return Err(OpError::new(kind, h.lines().next().unwrap_or("").to_string()));
                }
                return Ok(m.payload);
            }
        };
        tokio::time::timeout(REQUEST_TIMEOUT, wait)
            .await
            .map_err(|_| OpError::new("timeout", format!("no reply within {REQUEST_TIMEOUT:?}")))?
    }

    /// A JetStream API request: the reply must be JSON without an `error` member.
    pub async fn js_api(&mut self, subject: &str, body: &serde_json::Value) -> Result<serde_json::Value, OpError> {
        let r = self.request(subject, body.to_string().as_bytes()).await?;
        let v: serde_json::Value = serde_json::from_slice(&r).map_err(|e| OpError::new("bad_response", e))?;
        if let Some(e) = v.get("error") {
            return Err(OpError::new("js_error", e.to_string()));
        }
        Ok(v)
    }
}

pub struct NatsClient {
    addr: SocketAddr,
    conn: Option<NatsConn>,
    bucket: String,
}

impl Target for Nats {
    type Client = NatsClient;

    fn name(&self) -> &'static str {
        if self.fsync {
            "nats"
        } else {
            "nats-nofsync"
        }
    }

    fn protocol(&self) -> String {
        format!(
            "NATS text protocol over TCP (plain), JetStream KV put = PUB $KV.{}.<key> + wait for the JetStream ack, one connection per worker over {} servers",
            self.bucket,
            self.servers.len()
        )
    }

    async fn client(&self, worker: usize) -> anyhow::Result<NatsClient> {
        let addr = self.servers[worker % self.servers.len()];
        Ok(NatsClient { addr, conn: None, bucket: self.bucket.clone() })
    }

    async fn watch(&self, counts: Arc<WatchCounts>) -> anyhow::Result<JoinHandle<()>> {
        let mut c = NatsConn::connect(self.servers[0]).await?;
        c.subscribe(&format!("$KV.{}.>", self.bucket), 2).await?;
        Ok(tokio::spawn(async move {
            loop {
                match c.next_msg().await {
                    Ok(m) if m.subject.starts_with("$KV.") => {
                        counts.notifications.fetch_add(1, Ordering::Relaxed);
                        counts.changes.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        eprintln!("nats watch ended: {e}");
                        return;
                    }
                }
            }
        }))
    }

    fn watch_kind(&self) -> String {
        format!("core NATS subscription on server 1 to $KV.{}.> (sees every published put)", self.bucket)
    }
}

impl Client for NatsClient {
    async fn update(&mut self, key: &str, value: &str) -> Result<(), OpError> {
        if self.conn.is_none() {
            self.conn = Some(NatsConn::connect(self.addr).await?);
        }
        let conn = self.conn.as_mut().expect("connected");
        let subject = format!("$KV.{}.{key}", self.bucket);
        let r = conn.request(&subject, value.as_bytes()).await;
        let r = match r {
            Ok(ack) => ack,
            Err(e) => {
                if e.kind == "io" || e.kind == "timeout" || e.kind == "protocol" {
                    self.conn = None;
                }
                return Err(e);
            }
        };
        // {"stream":"KV_twins","seq":N} or {"error":{...}}
        if memchr(b"\"error\"", &r) {
            return Err(OpError::new("js_error", String::from_utf8_lossy(&r).to_string()));
        }
        if !memchr(b"\"seq\"", &r) {
            return Err(OpError::new("bad_ack", String::from_utf8_lossy(&r).to_string()));
        }
        Ok(())
    }
}

fn memchr(needle: &[u8], hay: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}
