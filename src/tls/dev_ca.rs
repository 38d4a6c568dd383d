//! A development CA and a server certificate signed by it. Generated once and reused, so clients that
//! trust `ca.pem` keep working across restarts; the server certificate is re-issued (by the same CA)
//! when the host name changes.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

use super::{io_err, TlsError};
use crate::auth::write_atomically;

#[derive(Clone, Debug)]
pub struct DevCerts {
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

/// Names the server certificate covers: the configured host, `localhost` and `127.0.0.1`.
fn server_names(hostname: &str) -> Vec<String> {
    let mut names = vec![hostname.to_string()];
    for n in ["localhost", "127.0.0.1"] {
        if !names.iter().any(|x| x.eq_ignore_ascii_case(n)) {
            names.push(n.to_string());
        }
    }
    names
}

pub fn ensure_dev_certs(dir: &Path, hostname: &str) -> Result<DevCerts, TlsError> {
    crate::secrets::create_private_dir(dir).map_err(io_err(dir))?;
    let out = DevCerts {
        ca_cert: dir.join("ca.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server.key"),
    };
    let ca_key_path = dir.join("ca.key");
    let names_path = dir.join("server.names");
    let names = server_names(hostname).join("\n");

    let (_ca_pem, ca_key) = match (std::fs::read_to_string(&out.ca_cert), std::fs::read_to_string(&ca_key_path)) {
        (Ok(cert), Ok(key)) => (cert, KeyPair::from_pem(&key)?),
        _ => {
            let key = KeyPair::generate()?;
            let cert = ca_params()?.self_signed(&key)?;
            write_atomically(&ca_key_path, key.serialize_pem().as_bytes()).map_err(io_err(&ca_key_path))?;
            write_atomically(&out.ca_cert, cert.pem().as_bytes()).map_err(io_err(&out.ca_cert))?;
            // A new CA invalidates any server certificate signed by an older one.
            let _ = std::fs::remove_file(&names_path);
            (cert.pem(), key)
        }
    };

    let current = std::fs::read_to_string(&names_path).ok();
    if current.as_deref() == Some(names.as_str()) && out.server_cert.exists() && out.server_key.exists() {
        return Ok(out);
    }
    // The issuer needs only the CA's name and key: rebuilt from the same parameters and the stored key.
    let issuer = Issuer::new(ca_params()?, ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(server_names(hostname))?;
    params.distinguished_name.push(DnType::CommonName, hostname);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut params, 825);
    let cert = params.signed_by(&key, &issuer)?;
    write_atomically(&out.server_key, key.serialize_pem().as_bytes()).map_err(io_err(&out.server_key))?;
    write_atomically(&out.server_cert, cert.pem().as_bytes()).map_err(io_err(&out.server_cert))?;
    write_atomically(&names_path, names.as_bytes()).map_err(io_err(&names_path))?;
    Ok(out)
}

fn ca_params() -> Result<CertificateParams, rcgen::Error> {
    named_ca_params("twinhub development CA", BasicConstraints::Unconstrained)
}

/// A CA valid for ten years, named `name`. The same parameters rebuild its issuer from the stored key.
pub(super) fn named_ca_params(name: &str, constraints: BasicConstraints) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(constraints);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    validity(&mut params, 3650);
    Ok(params)
}

/// Valid from yesterday (clock skew) for `days`.
pub(super) fn validity(params: &mut CertificateParams, days: i64) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::days(1);
    params.not_after = now + Duration::days(days);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{load_certs, server_config, CertSource};
    use rustls::client::danger::ServerCertVerifier;

    #[test]
    fn generated_once_reused_and_reissued_for_new_host() {
        let dir = tempfile::tempdir().unwrap();
        let a = ensure_dev_certs(dir.path(), "hub.example").unwrap();
        let ca1 = std::fs::read(&a.ca_cert).unwrap();
        let s1 = std::fs::read(&a.server_cert).unwrap();
        ensure_dev_certs(dir.path(), "hub.example").unwrap();
        assert_eq!(std::fs::read(&a.ca_cert).unwrap(), ca1);
        assert_eq!(std::fs::read(&a.server_cert).unwrap(), s1);
        ensure_dev_certs(dir.path(), "other.example").unwrap();
        assert_eq!(std::fs::read(&a.ca_cert).unwrap(), ca1, "CA kept");
        assert_ne!(std::fs::read(&a.server_cert).unwrap(), s1, "server cert re-issued");
    }

    #[test]
    fn server_cert_chains_to_ca_for_all_names() {
        let dir = tempfile::tempdir().unwrap();
        let d = ensure_dev_certs(dir.path(), "hub.example").unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for c in load_certs(&d.ca_cert).unwrap() {
            roots.add(c).unwrap();
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider).build().unwrap();
        let chain = load_certs(&d.server_cert).unwrap();
        for name in ["hub.example", "localhost", "127.0.0.1"] {
            let sn = rustls::pki_types::ServerName::try_from(name).unwrap();
            verifier
                .verify_server_cert(&chain[0], &[], &sn, &[], rustls::pki_types::UnixTime::now())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let sn = rustls::pki_types::ServerName::try_from("evil.example").unwrap();
        assert!(verifier.verify_server_cert(&chain[0], &[], &sn, &[], rustls::pki_types::UnixTime::now()).is_err());
        let cfg = server_config(&CertSource::Dev { dir: dir.path().into(), hostname: "hub.example".into() }).unwrap();
        assert_eq!(cfg.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
    }
}
