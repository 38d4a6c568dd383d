//! TLS client certificates on the device MQTT port. The server *asks* every client for a certificate
//! but does not require one: SAS devices send none. A certificate that is sent must be backed by a
//! handshake signature made with its key (checked here, by rustls' own signature verification); whether
//! it stands for the identity the CONNECT names is decided at CONNECT time (`auth::x509`), because only
//! then is the identity, and so its thumbprints or the CA it must chain to, known.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

/// Requests an optional client certificate and verifies possession of its key; trust is left to CONNECT.
#[derive(Debug)]
pub struct OptionalClientCert {
    provider: Arc<CryptoProvider>,
}

impl OptionalClientCert {
    pub fn new(provider: Arc<CryptoProvider>) -> Arc<Self> {
        Arc::new(OptionalClientCert { provider })
    }
}

impl ClientCertVerifier for OptionalClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    /// No hints: device certificates are self-signed or issued by CAs the hub learns at run time.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    /// Any certificate is accepted here; see the module comment.
    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}
