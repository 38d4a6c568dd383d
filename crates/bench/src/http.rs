//! One HTTP/1.1 keep-alive connection (plain TCP or TLS) per worker, built on hyper's low-level client
//! connection: no pool, no hidden concurrency, so "C workers" means exactly C connections. A broken
//! connection is dropped and re-dialled on the next request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use crate::targets::OpError;

/// An HTTP/1.1 handshake on `io` (TLS or plain), its connection driven by a task of its own.
async fn handshake<T>(io: T) -> Result<SendRequest<Full<Bytes>>, OpError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(io)).await.map_err(|e| OpError::new("connect", e))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// How long one request (including dialling) may take before it counts as a timeout error.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone)]
pub struct Tls {
    pub config: Arc<rustls::ClientConfig>,
    pub server_name: ServerName<'static>,
}

pub struct HttpConn {
    addr: SocketAddr,
    tls: Option<Tls>,
    host_header: String,
    sender: Option<SendRequest<Full<Bytes>>>,
    /// Connections dialled so far (1 = never reconnected).
    pub dials: u64,
}

/// A response: status and the whole body.
pub struct Resp {
    pub status: u16,
    pub body: Bytes,
}

impl HttpConn {
    pub fn new(addr: SocketAddr, tls: Option<Tls>, host_header: impl Into<String>) -> HttpConn {
        HttpConn { addr, tls, host_header: host_header.into(), sender: None, dials: 0 }
    }

    async fn dial(&mut self) -> Result<SendRequest<Full<Bytes>>, OpError> {
        self.dials += 1;
        let tcp = TcpStream::connect(self.addr).await.map_err(|e| OpError::new("connect", e))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            Some(tls) => {
                let conn = tokio_rustls::TlsConnector::from(tls.config.clone());
                let stream = conn.connect(tls.server_name.clone(), tcp).await.map_err(|e| OpError::new("tls", e))?;
                handshake(stream).await
            }
            None => handshake(tcp).await,
        }
    }

    /// Sends one request and reads the whole response; any transport failure drops the connection.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<Resp, OpError> {
        match tokio::time::timeout(REQUEST_TIMEOUT, self.request_inner(method, path, headers, body)).await {
            Ok(r) => {
                if r.is_err() {
                    self.sender = None;
                }
                r
            }
            Err(_) => {
                self.sender = None;
                Err(OpError::new("timeout", format!("no response within {REQUEST_TIMEOUT:?}")))
            }
        }
    }

    async fn request_inner(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<Resp, OpError> {
        if self.sender.as_ref().map(|s| s.is_closed()).unwrap_or(true) {
            self.sender = Some(self.dial().await?);
        }
        let sender = self.sender.as_mut().expect("dialled");
        sender.ready().await.map_err(|e| OpError::new("io", e))?;
        let mut rb = hyper::Request::builder().method(method).uri(path).header("host", self.host_header.as_str());
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        let has_body = body.is_some();
        if has_body {
            rb = rb.header("content-type", "application/json");
        }
        let req = rb.body(Full::new(body.unwrap_or_default())).map_err(|e| OpError::new("request", e))?;
        let resp = sender.send_request(req).await.map_err(|e| OpError::new("io", e))?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(|e| OpError::new("io", e))?.to_bytes();
        Ok(Resp { status, body })
    }
}

/// Parses `"127.0.0.1:PORT"`.
pub fn addr(s: &str) -> anyhow::Result<SocketAddr> {
    s.parse().map_err(|e| anyhow::anyhow!("bad address {s}: {e}"))
}
