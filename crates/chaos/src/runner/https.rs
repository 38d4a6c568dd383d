//! Certificates for the cluster (one CA, one server certificate every node serves) and a minimal HTTPS
//! client: one HTTP/1.1 keep-alive connection to one node, reopened after any error. Errors say whether
//! the request may have reached the server (`Sent`) or certainly did not (`NotSent`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

pub struct Certs {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn validity(params: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(days);
}

/// A CA and a server certificate for `names` (DNS names or IP addresses), written under `dir`.
pub fn make_certs(dir: &Path, names: &[String]) -> Result<Certs> {
    std::fs::create_dir_all(dir)?;
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.distinguished_name.push(DnType::CommonName, "twinhub chaos CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    validity(&mut ca_params, 30);
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names.to_vec())?;
    params.distinguished_name.push(DnType::CommonName, names.first().map(String::as_str).unwrap_or("localhost"));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut params, 30);
    let cert = params.signed_by(&key, &issuer)?;
    let out = Certs { ca: dir.join("ca.pem"), cert: dir.join("server.pem"), key: dir.join("server.key") };
    std::fs::write(&out.ca, ca_cert.pem())?;
    std::fs::write(&out.cert, cert.pem())?;
    std::fs::write(&out.key, key.serialize_pem())?;
    Ok(out)
}

/// A client configuration trusting only `ca_pem`.
pub fn client_config(ca_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut &ca_pem[..]) {
        roots.add(c.context("parsing the CA")?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

#[derive(Debug, Clone)]
pub enum HttpError {
    /// Failed before the request was written (connect refused, TLS handshake): it certainly did not apply.
    NotSent(String),
    /// The request may have reached the server: timeout, reset, broken connection.
    Sent(String),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::NotSent(m) => write!(f, "not sent: {m}"),
            HttpError::Sent(m) => write!(f, "{m}"),
        }
    }
}

pub struct Response {
    pub status: u16,
    pub body: Bytes,
}

/// One keep-alive HTTPS connection to `addr`, authenticated as iothubowner.
pub struct HttpsClient {
    pub addr: SocketAddr,
    tls: TlsConnector,
    host: String,
    owner_key: String,
    sender: Option<SendRequest<Full<Bytes>>>,
    pub connect_timeout: Duration,
}

impl HttpsClient {
    pub fn new(addr: SocketAddr, tls: Arc<rustls::ClientConfig>, host: &str, owner_key: &str) -> HttpsClient {
        HttpsClient {
            addr,
            tls: TlsConnector::from(tls),
            host: host.to_string(),
            owner_key: owner_key.to_string(),
            sender: None,
            connect_timeout: Duration::from_secs(3),
        }
    }

    /// Points the client at another node (drops the connection).
    pub fn retarget(&mut self, addr: SocketAddr) {
        if addr != self.addr {
            self.addr = addr;
            self.sender = None;
        }
    }

    async fn connect(&mut self) -> Result<(), HttpError> {
        let fut = async {
            let tcp = tokio::net::TcpStream::connect(self.addr)
                .await
                .map_err(|e| HttpError::NotSent(format!("connect: {e}")))?;
            let _ = tcp.set_nodelay(true);
            let name = ServerName::try_from(self.host.clone()).map_err(|e| HttpError::NotSent(e.to_string()))?;
            let tls = self.tls.connect(name, tcp).await.map_err(|e| HttpError::NotSent(format!("tls: {e}")))?;
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .map_err(|e| HttpError::NotSent(format!("handshake: {e}")))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok::<_, HttpError>(sender)
        };
        match tokio::time::timeout(self.connect_timeout, fut).await {
            Ok(Ok(s)) => {
                self.sender = Some(s);
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(HttpError::NotSent("connect timed out".into())),
        }
    }

    /// `method path` (api-version appended) with an optional JSON body and extra headers.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
        headers: &[(&str, String)],
        timeout: Duration,
    ) -> Result<Response, HttpError> {
        let ready = match self.sender.as_mut() {
            Some(s) => s.ready().await.is_ok(),
            None => false,
        };
        if !ready {
            self.sender = None;
            self.connect().await?;
        }
        let sep = if path.contains('?') { '&' } else { '?' };
        let uri = format!("{path}{sep}api-version={}", crate::runner::util::API_VERSION);
        let mut rb = hyper::Request::builder()
            .method(method)
            .uri(uri)
            .header("host", &self.host)
            .header("authorization", crate::runner::util::service_sas(&self.host, &self.owner_key));
        for (k, v) in headers {
            rb = rb.header(*k, v);
        }
        let has_body = body.is_some();
        if has_body {
            rb = rb.header("content-type", "application/json");
        }
        let req =
            rb.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(|e| HttpError::NotSent(e.to_string()))?;
        let sender = self.sender.as_mut().expect("connected above");
        let fut = async {
            let resp = sender.send_request(req).await.map_err(|e| {
                // hyper tells when the request was not even written (a closed keep-alive connection).
                if e.is_canceled() {
                    HttpError::NotSent(format!("send: {e}"))
                } else {
                    HttpError::Sent(format!("send: {e}"))
                }
            })?;
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.map_err(|e| HttpError::Sent(format!("body: {e}")))?.to_bytes();
            Ok(Response { status, body })
        };
        let r = match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(HttpError::Sent(format!("timeout after {timeout:?}"))),
        };
        if r.is_err() {
            self.sender = None;
        }
        r
    }

    /// A request whose only interest is the answer (setup, status, probes): JSON body or an error text.
    pub async fn json(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
        timeout: Duration,
    ) -> Result<(u16, serde_json::Value), String> {
        let raw = body.map(|b| serde_json::to_vec(b).unwrap_or_default());
        match self.request(method, path, raw, &[], timeout).await {
            Ok(r) => Ok((r.status, serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null))),
            Err(e) => Err(e.to_string()),
        }
    }
}
