//! X.509 device authentication: what a TLS client certificate proves about an identity.
//!
//! The TLS handshake only proves that the peer holds the private key of the certificate it sent (see
//! `tls::client_auth`); whether that certificate stands for the identity a CONNECT names is decided
//! here, at CONNECT time, when the identity and its registration are known:
//!
//! - `selfSigned`: the leaf's SHA-1 or SHA-256 thumbprint (hex, any case; IoT Hub accepts both
//!   lengths) equals the registered primary or secondary thumbprint;
//! - `certificateAuthority`: the chain verifies to one of the hub's registered and verified CA
//!   certificates and the leaf's subject CN equals the device id.
//!
//! In both cases the leaf must be valid at connect time, so an expired certificate stops working on the
//! next connect without anyone touching the registry.

use rustls::pki_types::{CertificateDer, UnixTime};
use sha1::Digest as _;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Why a certificate does not authenticate an identity.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum X509Error {
    #[error("the client certificate is not valid DER X.509: {0}")]
    Malformed(String),
    #[error("the client certificate is not valid before {0} (unix seconds)")]
    NotYetValid(i64),
    #[error("the client certificate expired at {0} (unix seconds)")]
    Expired(i64),
    #[error("the client certificate's thumbprint matches neither registered thumbprint")]
    ThumbprintMismatch,
    #[error("the identity has no registered thumbprint")]
    NoThumbprint,
    #[error("the client certificate's subject CN {found:?} is not {expected:?}")]
    WrongCommonName { expected: String, found: Option<String> },
    #[error("the client certificate does not chain to a verified CA certificate of this hub: {0}")]
    Untrusted(String),
}

/// Upper-case hex SHA-1 and SHA-256 digests of a certificate's DER (IoT Hub shows upper case).
pub fn thumbprints(der: &[u8]) -> (String, String) {
    (hex_upper(&sha1::Sha1::digest(der)), hex_upper(&sha2::Sha256::digest(der)))
}

fn hex_upper(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

/// A thumbprint as registered, normalised for comparison: hex digits only (some tools print
/// `AB:CD:…` or spaces), upper case.
fn normalise(t: &str) -> String {
    t.chars().filter(|c| c.is_ascii_hexdigit()).map(|c| c.to_ascii_uppercase()).collect()
}

/// Whether the certificate's SHA-1 or SHA-256 thumbprint equals one of the registered thumbprints.
pub fn matches_thumbprint(der: &[u8], registered: &[Option<&str>]) -> Result<(), X509Error> {
    let registered: Vec<String> = registered.iter().flatten().map(|t| normalise(t)).filter(|t| !t.is_empty()).collect();
    if registered.is_empty() {
        return Err(X509Error::NoThumbprint);
    }
    let (sha1, sha256) = thumbprints(der);
    if registered.iter().any(|t| *t == sha1 || *t == sha256) {
        Ok(())
    } else {
        Err(X509Error::ThumbprintMismatch)
    }
}

fn parse(der: &[u8]) -> Result<X509Certificate<'_>, X509Error> {
    X509Certificate::from_der(der).map(|(_, c)| c).map_err(|e| X509Error::Malformed(e.to_string()))
}

/// The certificate is valid at `now` (unix seconds).
pub fn check_validity(der: &[u8], now: i64) -> Result<(), X509Error> {
    let c = parse(der)?;
    let v = c.validity();
    let (from, to) = (v.not_before.timestamp(), v.not_after.timestamp());
    if now < from {
        return Err(X509Error::NotYetValid(from));
    }
    if now > to {
        return Err(X509Error::Expired(to));
    }
    Ok(())
}

/// What the registry shows of a CA certificate.
pub struct Description {
    /// The subject as RFC 4514 text (`CN=…, O=…`).
    pub subject: String,
    pub not_before: i64,
    pub not_after: i64,
}

pub fn describe(der: &[u8]) -> Result<Description, X509Error> {
    let c = parse(der)?;
    let v = c.validity();
    Ok(Description {
        subject: c.subject().to_string(),
        not_before: v.not_before.timestamp(),
        not_after: v.not_after.timestamp(),
    })
}

/// The first subject common name, if it has one in a string form.
pub fn common_name(der: &[u8]) -> Result<Option<String>, X509Error> {
    let c = parse(der)?;
    let cn = c.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()).map(str::to_string);
    Ok(cn)
}

/// The leaf names `expected` as its subject CN (exactly, as IoT Hub compares device ids).
pub fn check_common_name(der: &[u8], expected: &str) -> Result<(), X509Error> {
    match common_name(der)? {
        Some(cn) if cn == expected => Ok(()),
        found => Err(X509Error::WrongCommonName { expected: expected.to_string(), found }),
    }
}

/// The subject CN a CA-signed certificate must have: the device id, or `{deviceId}/{moduleId}` for a
/// module (its MQTT client id), so a device's certificate never opens one of its modules.
pub fn expected_common_name(id: &crate::ids::TwinId) -> String {
    match &id.module_id {
        None => id.device_id.clone(),
        Some(m) => format!("{}/{}", id.device_id, m),
    }
}

/// The chain (`chain[0]` the leaf, the rest intermediates as the client sent them) verifies to one of
/// `anchors` at `now` for client authentication. Validity of every certificate in the path is part of
/// the verification.
pub fn verify_chain(
    chain: &[CertificateDer<'static>],
    anchors: &[CertificateDer<'static>],
    now: i64,
) -> Result<(), X509Error> {
    let Some((leaf, intermediates)) = chain.split_first() else {
        return Err(X509Error::Untrusted("no certificate".into()));
    };
    let mut roots = rustls::RootCertStore::empty();
    for a in anchors {
        // A CA that cannot serve as an anchor (malformed) is skipped: it trusts nothing.
        let _ = roots.add(a.clone());
    }
    if roots.is_empty() {
        return Err(X509Error::Untrusted("the hub has no verified CA certificate".into()));
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(std::sync::Arc::new(roots), provider)
        .build()
        .map_err(|e| X509Error::Untrusted(e.to_string()))?;
    let now = UnixTime::since_unix_epoch(std::time::Duration::from_secs(now.max(0) as u64));
    verifier.verify_client_cert(leaf, intermediates, now).map(|_| ()).map_err(|e| X509Error::Untrusted(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

    fn self_signed(cn: &str, from: i64, to: i64) -> Vec<u8> {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        p.not_before = time::OffsetDateTime::from_unix_timestamp(from).unwrap();
        p.not_after = time::OffsetDateTime::from_unix_timestamp(to).unwrap();
        p.self_signed(&KeyPair::generate().unwrap()).unwrap().der().to_vec()
    }

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn thumbprints_match_sha1_or_sha256_in_any_case_and_spacing() {
        let der = self_signed("d1", NOW - 10, NOW + 10);
        let (sha1, sha256) = thumbprints(&der);
        assert_eq!((sha1.len(), sha256.len()), (40, 64));
        assert_eq!(matches_thumbprint(&der, &[Some(&sha1), None]), Ok(()));
        assert_eq!(matches_thumbprint(&der, &[None, Some(&sha256.to_lowercase())]), Ok(()));
        let colons: String =
            sha1.as_bytes().chunks(2).map(|c| std::str::from_utf8(c).unwrap()).collect::<Vec<_>>().join(":");
        assert_eq!(matches_thumbprint(&der, &[Some("0000"), Some(&colons)]), Ok(()));
        let other = self_signed("d1", NOW - 10, NOW + 10);
        assert_eq!(matches_thumbprint(&other, &[Some(&sha1), Some(&sha256)]), Err(X509Error::ThumbprintMismatch));
        assert_eq!(matches_thumbprint(&der, &[None, Some("")]), Err(X509Error::NoThumbprint));
        assert_eq!(
            matches_thumbprint(&der, &[Some(&sha1[..39]), None]),
            Err(X509Error::ThumbprintMismatch),
            "a prefix is not a match"
        );
    }

    #[test]
    fn validity_is_checked_at_the_given_time() {
        let der = self_signed("d1", NOW - 10, NOW + 10);
        assert_eq!(check_validity(&der, NOW), Ok(()));
        assert!(matches!(check_validity(&der, NOW + 11), Err(X509Error::Expired(_))));
        assert!(matches!(check_validity(&der, NOW - 11), Err(X509Error::NotYetValid(_))));
        assert!(matches!(check_validity(b"not a certificate", NOW), Err(X509Error::Malformed(_))));
    }

    #[test]
    fn chains_verify_to_anchors_and_the_cn_names_the_device() {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name.push(rcgen::DnType::CommonName, "root");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
        leaf.distinguished_name.push(rcgen::DnType::CommonName, "dev-1");
        let leaf = leaf.signed_by(&KeyPair::generate().unwrap(), &issuer).unwrap();
        let chain = vec![leaf.der().clone()];
        let anchors = vec![ca_cert.der().clone()];
        let now = crate::model::now_ms() / 1000;
        assert_eq!(verify_chain(&chain, &anchors, now), Ok(()));
        assert_eq!(check_common_name(leaf.der(), "dev-1"), Ok(()));
        assert!(matches!(check_common_name(leaf.der(), "dev-2"), Err(X509Error::WrongCommonName { .. })));
        // Another CA trusts nothing this one signed; no CA at all trusts nothing.
        let other =
            CertificateParams::new(Vec::<String>::new()).unwrap().self_signed(&KeyPair::generate().unwrap()).unwrap();
        assert!(matches!(verify_chain(&chain, &[other.der().clone()], now), Err(X509Error::Untrusted(_))));
        assert!(matches!(verify_chain(&chain, &[], now), Err(X509Error::Untrusted(_))));
        // Past the leaf's validity (rcgen's default ends in 4096), the chain no longer verifies.
        assert!(matches!(verify_chain(&chain, &anchors, 420_000_000_000), Err(X509Error::Untrusted(_))));
    }
}
