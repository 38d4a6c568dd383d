//! A small HTTPS client for the commands that talk to a running hub (`cluster`, `backup`, the admin
//! commands): they trust only the hub's CA, and need no HTTP client crate beyond hyper, which the
//! server already links.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use rustls::pki_types::ServerName;

#[derive(Debug, thiserror::Error)]
pub enum HttpsError {
    #[error("{0}")]
    Tls(String),
    #[error("connecting to {addr}: {msg}")]
    Connect { addr: String, msg: String },
    #[error("{addr}: {msg}")]
    Http { addr: String, msg: String },
    #[error("{0}: timed out")]
    Timeout(String),
}

/// Trust anchor for every request of one command run.
pub fn client_config(ca: &Path) -> Result<Arc<rustls::ClientConfig>, HttpsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in crate::tls::load_certs(ca).map_err(|e| HttpsError::Tls(e.to_string()))? {
        roots.add(c).map_err(|e| HttpsError::Tls(format!("{}: {e}", ca.display())))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| HttpsError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// GET `https://{host}:{port}{path}` (connecting to `addr`), with an optional Authorization header.
/// Returns the status and body.
pub async fn get(
    tls: Arc<rustls::ClientConfig>,
    addr: std::net::SocketAddr,
    host: &str,
    path: &str,
    authorization: Option<&str>,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), HttpsError> {
    request(tls, addr, host, hyper::Method::GET, path, authorization, Vec::new(), timeout).await
}

/// Any method with a (possibly empty) JSON body.
#[allow(clippy::too_many_arguments)]
pub async fn request(
    tls: Arc<rustls::ClientConfig>,
    addr: std::net::SocketAddr,
    host: &str,
    method: hyper::Method,
    path: &str,
    authorization: Option<&str>,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), HttpsError> {
    let mut headers = Vec::new();
    if let Some(a) = authorization {
        headers.push(("authorization".to_string(), a.to_string()));
    }
    let answer = request_with(tls, addr, host, method, path, &headers, body, timeout).await?;
    Ok((answer.status, answer.body))
}

/// A whole answer: status, headers (continuation tokens travel there) and body.
pub struct Answer {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Vec<u8>,
}

/// Any method, any extra request headers; the whole answer is read within `timeout`.
#[allow(clippy::too_many_arguments)]
pub async fn request_with(
    tls: Arc<rustls::ClientConfig>,
    addr: std::net::SocketAddr,
    host: &str,
    method: hyper::Method,
    path: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
    timeout: Duration,
) -> Result<Answer, HttpsError> {
    let shown = addr.to_string();
    let work = async {
        let resp = open(tls, addr, host, method, path, headers, body).await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| HttpsError::Http { addr: shown.clone(), msg: e.to_string() })?
            .to_bytes()
            .to_vec();
        Ok(Answer { status, headers, body })
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| HttpsError::Timeout(addr.to_string()))?
}

/// Sends a request and returns the response as soon as its head arrives, with the body still
/// streaming (the change feed). The caller bounds the time.
pub async fn open(
    tls: Arc<rustls::ClientConfig>,
    addr: std::net::SocketAddr,
    host: &str,
    method: hyper::Method,
    path: &str,
    headers: &[(String, String)],
    body: Vec<u8>,
) -> Result<hyper::Response<hyper::body::Incoming>, HttpsError> {
    let shown = addr.to_string();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| HttpsError::Connect { addr: shown.clone(), msg: e.to_string() })?;
    let name = ServerName::try_from(host.to_string()).map_err(|e| HttpsError::Tls(e.to_string()))?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| HttpsError::Connect { addr: shown.clone(), msg: e.to_string() })?;
    let http = |msg: String| HttpsError::Http { addr: shown.clone(), msg };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| http(e.to_string()))?;
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, format!("{host}:{}", addr.port()))
        .header(hyper::header::CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        req = req.header(name.as_str(), value.as_str());
    }
    let req = req.body(Full::new(Bytes::from(body))).map_err(|e| http(e.to_string()))?;
    sender.send_request(req).await.map_err(|e| http(e.to_string()))
}
