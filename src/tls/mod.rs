//! TLS for the front doors: a rustls server configuration from configured PEM files or from a
//! generated development CA (so the SDKs can be pointed at `DIR/tls/ca.pem`).

mod client_auth;
pub mod cluster;
mod dev_ca;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

pub use dev_ca::{ensure_dev_certs, DevCerts};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{0} contains no PEM certificate")]
    NoCertificate(String),
    #[error("{0} contains no PEM private key")]
    NoKey(String),
    #[error("generating the development certificates: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("--tls-cert and --tls-key must be given together")]
    HalfConfigured,
    #[error("{path} is not this node's cluster certificate: it should name {expected}, it names {found}")]
    WrongNode { path: String, expected: String, found: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TlsError + '_ {
    move |source| TlsError::Io { path: path.display().to_string(), source }
}

/// Where the server certificate comes from.
#[derive(Clone, Debug)]
pub enum CertSource {
    Files {
        cert: PathBuf,
        key: PathBuf,
    },
    /// Generate (or reuse) a development CA and server certificate under `dir` for `hostname`.
    Dev {
        dir: PathBuf,
        hostname: String,
    },
}

impl CertSource {
    pub fn from_options(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        data_dir: &Path,
        hostname: &str,
    ) -> Result<Self, TlsError> {
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(CertSource::Files { cert, key }),
            (None, None) => Ok(CertSource::Dev { dir: data_dir.join("tls"), hostname: hostname.to_string() }),
            _ => Err(TlsError::HalfConfigured),
        }
    }
}

/// TLS 1.2 and 1.3 (the Python device SDK pins 1.2); ALPN h2 and http/1.1. No client certificates.
pub fn server_config(source: &CertSource) -> Result<Arc<ServerConfig>, TlsError> {
    build(source, false)
}

/// The device MQTT port's configuration: as [`server_config`] without ALPN (MQTT clients offer none or
/// `mqtt`, and a server list that does not overlap would make rustls refuse the handshake), asking for
/// an optional client certificate (X.509 devices; see `client_auth`).
pub fn mqtt_server_config(source: &CertSource) -> Result<Arc<ServerConfig>, TlsError> {
    let mut c = build(source, true)?;
    if let Some(c) = Arc::get_mut(&mut c) {
        c.alpn_protocols.clear();
    }
    Ok(c)
}

fn build(source: &CertSource, client_certs: bool) -> Result<Arc<ServerConfig>, TlsError> {
    let (cert, key) = match source {
        CertSource::Files { cert, key } => (cert.clone(), key.clone()),
        CertSource::Dev { dir, hostname } => {
            let dev = ensure_dev_certs(dir, hostname)?;
            (dev.server_cert, dev.server_key)
        }
    };
    let certs = load_certs(&cert)?;
    let key = load_key(&key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = if client_certs {
        builder.with_client_cert_verifier(client_auth::OptionalClientCert::new(provider))
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder.with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = std::fs::read(path).map_err(io_err(path))?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice()).collect::<Result<Vec<_>, _>>().map_err(io_err(path))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.display().to_string()));
    }
    Ok(certs)
}

pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = std::fs::read(path).map_err(io_err(path))?;
    rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(io_err(path))?
        .ok_or_else(|| TlsError::NoKey(path.display().to_string()))
}
