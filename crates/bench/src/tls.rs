//! rustls client configuration trusting only a given CA (the twinhub cluster's development CA).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::ServerName;

/// A TLS client config (ring provider, TLS 1.2 and 1.3) whose only root is the PEM CA at `ca`.
pub fn client_config(ca: &Path) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let pem = std::fs::read(ca).with_context(|| format!("read CA {}", ca.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut &pem[..]) {
        roots.add(cert.context("parse CA PEM")?).context("add CA root")?;
    }
    if roots.is_empty() {
        anyhow::bail!("no certificate in {}", ca.display());
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

pub fn server_name(host: &str) -> anyhow::Result<ServerName<'static>> {
    ServerName::try_from(host.to_string()).map_err(|e| anyhow::anyhow!("bad TLS server name {host}: {e}"))
}
