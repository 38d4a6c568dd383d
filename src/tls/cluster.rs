//! Mutual TLS between the nodes of a cluster.
//!
//! A cluster has its own CA, separate from the one behind the front doors' certificates (a device- or
//! browser-facing server certificate must never pass for a node). Each node holds a certificate from
//! it whose subject alternative name is `node-<id>.cluster.twinhub`; that name *is* the node's identity:
//! - a node dialling node 3 accepts only a server certificate for `node-3.cluster.twinhub`;
//! - a node accepting a connection requires a client certificate from the cluster CA and learns the
//!   caller's id from its name; the transport then refuses any request on that connection signed as
//!   another node.
//!
//! `twinhub cluster up` generates the CA and the node certificates ([`ensure_cluster_ca`],
//! [`issue_node_cert`]); operators may bring their own (any CA, as long as node certificates carry
//! those names and both the server and client auth purposes). How to rotate them is in the cluster
//! guide.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use super::dev_ca::validity;
use super::{io_err, load_certs, load_key, TlsError};
use crate::auth::write_atomically;
use crate::ids::NodeId;

/// The DNS-name suffix of node identities in cluster certificates.
const NAME_SUFFIX: &str = ".cluster.twinhub";

/// The certificate name of node `id`.
pub fn node_name(id: NodeId) -> String {
    format!("node-{id}{NAME_SUFFIX}")
}

/// The node id a certificate name stands for, if it is a node name.
fn node_of_name(name: &str) -> Option<NodeId> {
    let id = name.strip_prefix("node-")?.strip_suffix(NAME_SUFFIX)?;
    // Canonical decimal only: `node-03` must not alias `node-3`.
    if id.is_empty() || (id.len() > 1 && id.starts_with('0')) || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    id.parse().ok()
}

/// The node id in a (verified) peer certificate: its one node name. A certificate naming no node, or
/// several, identifies nobody.
pub fn node_of_cert(cert: &CertificateDer<'_>) -> Option<NodeId> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let san = parsed.subject_alternative_name().ok()??;
    let mut ids = san.value.general_names.iter().filter_map(|n| match n {
        x509_parser::extensions::GeneralName::DNSName(d) => node_of_name(d),
        _ => None,
    });
    let id = ids.next()?;
    ids.next().is_none().then_some(id)
}

/// The application protocol nodes negotiate in the TLS handshake: the inter-node frames. A node of a
/// release that spoke HTTP/2 between nodes offers `h2` and is refused in the handshake, with
/// "no application protocol", instead of failing later on bytes it cannot read.
pub const ALPN: &[u8] = b"twinhub-frames/1";

/// Where a node's cluster TLS material is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterTlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The node's two sides of inter-node TLS.
#[derive(Clone)]
pub struct ClusterTls {
    /// Requires a client certificate from the cluster CA.
    pub server: Arc<ServerConfig>,
    /// Trusts only the cluster CA and presents this node's certificate.
    pub client: Arc<ClientConfig>,
    /// As `client`, but accepts any node's certificate from the cluster CA: for dialling an address
    /// whose node is not known yet (a node joining through any member).
    pub client_any_node: Arc<ClientConfig>,
}

/// Verifies a server certificate against the cluster CA for the node name the certificate itself
/// carries, whatever name was dialled: used only when the peer's identity is not known in advance.
#[derive(Debug)]
struct AnyNode(Arc<rustls::client::WebPkiServerVerifier>);

impl rustls::client::danger::ServerCertVerifier for AnyNode {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let id = node_of_cert(end_entity)
            .ok_or_else(|| rustls::Error::General("the certificate names no cluster node".into()))?;
        self.0.verify_server_cert(end_entity, intermediates, &ClusterTls::server_name(id), ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

impl std::fmt::Debug for ClusterTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterTls")
    }
}

impl ClusterTls {
    /// Loads the CA, the node's certificate chain and key. The node's own certificate must name it
    /// (`node-<id>.cluster.twinhub`): a node started with another node's certificate is refused here,
    /// not after its peers start refusing it.
    pub fn load(files: &ClusterTlsFiles, node_id: NodeId) -> Result<ClusterTls, TlsError> {
        let mut roots = RootCertStore::empty();
        for c in load_certs(&files.ca)? {
            roots.add(c)?;
        }
        let roots = Arc::new(roots);
        let chain = load_certs(&files.cert)?;
        let named = chain.first().and_then(node_of_cert);
        if named != Some(node_id) {
            return Err(TlsError::WrongNode {
                path: files.cert.display().to_string(),
                expected: node_name(node_id),
                found: named.map(node_name).unwrap_or_else(|| "no node name".into()),
            });
        }
        let key = load_key(&files.key)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
        // TLS 1.3 only: every node runs this same release, and 1.3 encrypts the certificates too.
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())?;
        server.alpn_protocols = vec![ALPN.to_vec()];
        let any = rustls::client::WebPkiServerVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
        let mut client_any_node = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyNode(any)))
            .with_client_auth_cert(chain.clone(), key.clone_key())?;
        client_any_node.alpn_protocols = vec![ALPN.to_vec()];
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)?;
        client.alpn_protocols = vec![ALPN.to_vec()];
        Ok(ClusterTls {
            server: Arc::new(server),
            client: Arc::new(client),
            client_any_node: Arc::new(client_any_node),
        })
    }

    /// The name to verify when dialling node `id`.
    pub fn server_name(id: NodeId) -> ServerName<'static> {
        // A node name is always a valid DNS name.
        ServerName::try_from(node_name(id))
            .unwrap_or_else(|_| ServerName::try_from("invalid.cluster.twinhub").expect("static name"))
    }
}

/// The cluster CA under `dir` (`cluster-ca.pem`, `cluster-ca.key`), generated on first use.
pub fn ensure_cluster_ca(dir: &Path) -> Result<(PathBuf, PathBuf), TlsError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let cert = dir.join("cluster-ca.pem");
    let key = dir.join("cluster-ca.key");
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    let k = KeyPair::generate()?;
    let c = ca_params()?.self_signed(&k)?;
    write_atomically(&key, k.serialize_pem().as_bytes()).map_err(io_err(&key))?;
    write_atomically(&cert, c.pem().as_bytes()).map_err(io_err(&cert))?;
    Ok((cert, key))
}

/// Issues node `id`'s certificate (`out_dir/cluster-node.pem`, `cluster-node.key`) from the CA at
/// `ca_cert`/`ca_key` (as made by [`ensure_cluster_ca`]), replacing any earlier one.
pub fn issue_node_cert(ca_cert: &Path, ca_key: &Path, id: NodeId, out_dir: &Path) -> Result<ClusterTlsFiles, TlsError> {
    std::fs::create_dir_all(out_dir).map_err(io_err(out_dir))?;
    let ca_key_pem = std::fs::read_to_string(ca_key).map_err(io_err(ca_key))?;
    let issuer = Issuer::new(ca_params()?, KeyPair::from_pem(&ca_key_pem)?);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec![node_name(id)])?;
    params.distinguished_name.push(DnType::CommonName, node_name(id));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    validity(&mut params, 825);
    let cert = params.signed_by(&key, &issuer)?;
    let files = ClusterTlsFiles {
        ca: ca_cert.to_path_buf(),
        cert: out_dir.join("cluster-node.pem"),
        key: out_dir.join("cluster-node.key"),
    };
    write_atomically(&files.key, key.serialize_pem().as_bytes()).map_err(io_err(&files.key))?;
    write_atomically(&files.cert, cert.pem().as_bytes()).map_err(io_err(&files.cert))?;
    Ok(files)
}

fn ca_params() -> Result<CertificateParams, rcgen::Error> {
    super::dev_ca::named_ca_params("twinhub cluster CA", BasicConstraints::Constrained(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_round_trip_and_nothing_else_is_a_node() {
        assert_eq!(node_of_name(&node_name(7)), Some(7));
        for bad in [
            "node-.cluster.twinhub",
            "node-07.cluster.twinhub",
            "node-7.cluster.twinhub.evil",
            "node-x.cluster.twinhub",
            "localhost",
        ] {
            assert_eq!(node_of_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn issued_certificates_name_their_node_and_load_only_as_that_node() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, ca_key) = ensure_cluster_ca(dir.path()).unwrap();
        let files = issue_node_cert(&ca, &ca_key, 3, &dir.path().join("n3")).unwrap();
        let chain = load_certs(&files.cert).unwrap();
        assert_eq!(node_of_cert(&chain[0]), Some(3));
        ClusterTls::load(&files, 3).unwrap();
        let e = ClusterTls::load(&files, 4).unwrap_err().to_string();
        assert!(e.contains("node-4.cluster.twinhub") && e.contains("node-3.cluster.twinhub"), "{e}");
        // The CA is generated once.
        let before = std::fs::read(dir.path().join("cluster-ca.pem")).unwrap();
        ensure_cluster_ca(dir.path()).unwrap();
        assert_eq!(std::fs::read(dir.path().join("cluster-ca.pem")).unwrap(), before);
    }
}
