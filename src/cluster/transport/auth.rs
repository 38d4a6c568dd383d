//! Signatures of inter-node requests and responses with the shared cluster secret.
//!
//! Every message carries three headers:
//!
//! - `x-twinhub-node`: the sender's node id,
//! - `x-twinhub-ts`: the sender's clock in Unix milliseconds,
//! - `x-twinhub-sig`: `base64(HMAC-SHA256(secret, "{node}\n{ts}\n{path}\n{hex(sha256(body))}"))`.
//!
//! `path` is the request path for both directions, so a response cannot be passed off as the answer
//! to another endpoint. Checking is split in two so a receiver can refuse before it reads or decodes
//! anything: [`Claim::from_headers`] checks presence, syntax and the clock skew, [`Claim::verify`] the
//! MAC once the body is in (in constant time).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use hyper::header::HeaderValue;
use hyper::HeaderMap;
use sha2::{Digest, Sha256};

use crate::ids::NodeId;

pub const HEADER_NODE: &str = "x-twinhub-node";
pub const HEADER_TS: &str = "x-twinhub-ts";
pub const HEADER_SIG: &str = "x-twinhub-sig";

/// How far a message's timestamp may be from the receiver's clock. Bounds how long a captured
/// message can be replayed; node clocks must agree within it (NTP does far better).
pub const MAX_SKEW: Duration = Duration::from_secs(60);

type HmacSha256 = Hmac<Sha256>;

/// The secret every member of the cluster shares. Keyed once; `Debug` never prints it.
#[derive(Clone)]
pub struct ClusterSecret {
    mac: Arc<HmacSha256>,
}

/// The cluster secret is empty: every node would accept anybody.
#[derive(Debug, thiserror::Error)]
#[error("the cluster secret must not be empty")]
pub struct EmptySecret;

impl ClusterSecret {
    pub fn new(secret: &[u8]) -> Result<ClusterSecret, EmptySecret> {
        if secret.is_empty() {
            return Err(EmptySecret);
        }
        // HMAC takes keys of any length, so this cannot fail for a non-empty key.
        let mac = HmacSha256::new_from_slice(secret).map_err(|_| EmptySecret)?;
        Ok(ClusterSecret { mac: Arc::new(mac) })
    }

    fn mac(&self, node: NodeId, ts: u64, path: &str, body: &[u8]) -> HmacSha256 {
        let mut mac = (*self.mac).clone();
        mac.update(format!("{node}\n{ts}\n{path}\n").as_bytes());
        mac.update(hex(&Sha256::digest(body)).as_bytes());
        mac
    }

    /// The base64 signature of a message.
    pub fn sign(&self, node: NodeId, ts: u64, path: &str, body: &[u8]) -> String {
        B64.encode(self.mac(node, ts, path, body).finalize().into_bytes())
    }

    /// Adds the three signature headers for a message from `node`, stamped now.
    pub fn sign_headers(&self, headers: &mut HeaderMap, node: NodeId, path: &str, body: &[u8]) {
        let ts = unix_ms();
        let sig = self.sign(node, ts, path, body);
        headers.insert(HEADER_NODE, HeaderValue::from(node));
        headers.insert(HEADER_TS, HeaderValue::from(ts));
        // base64 is always a valid header value.
        if let Ok(v) = HeaderValue::from_str(&sig) {
            headers.insert(HEADER_SIG, v);
        }
    }
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

/// Why a message was not accepted as coming from a member.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("header {0} is missing")]
    Missing(&'static str),
    #[error("header {0} is malformed")]
    Malformed(&'static str),
    #[error("timestamp {ts} is {skew_ms} ms away from this node's clock")]
    Stale { ts: u64, skew_ms: u64 },
    #[error("signature does not match")]
    BadSignature,
    #[error("answer signed by node {got}, expected node {want}")]
    WrongNode { got: NodeId, want: NodeId },
}

/// What a message's headers claim, before the MAC is checked.
#[derive(Debug, Clone)]
pub struct Claim {
    pub node: NodeId,
    pub ts: u64,
    sig: Vec<u8>,
}

impl Claim {
    /// Parses the signature headers and checks the timestamp against `now_ms`.
    pub fn from_headers(headers: &HeaderMap, now_ms: u64) -> Result<Claim, AuthError> {
        let node = header(headers, HEADER_NODE)?.parse().map_err(|_| AuthError::Malformed(HEADER_NODE))?;
        let ts: u64 = header(headers, HEADER_TS)?.parse().map_err(|_| AuthError::Malformed(HEADER_TS))?;
        let sig = B64.decode(header(headers, HEADER_SIG)?).map_err(|_| AuthError::Malformed(HEADER_SIG))?;
        let skew_ms = ts.abs_diff(now_ms);
        if u128::from(skew_ms) > MAX_SKEW.as_millis() {
            return Err(AuthError::Stale { ts, skew_ms });
        }
        Ok(Claim { node, ts, sig })
    }

    /// Checks the MAC over `path` and `body` in constant time.
    pub fn verify(&self, secret: &ClusterSecret, path: &str, body: &[u8]) -> Result<(), AuthError> {
        secret.mac(self.node, self.ts, path, body).verify_slice(&self.sig).map_err(|_| AuthError::BadSignature)
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &'static str) -> Result<&'a str, AuthError> {
    headers.get(name).ok_or(AuthError::Missing(name))?.to_str().map_err(|_| AuthError::Malformed(name))
}

/// This node's clock in Unix milliseconds (0 if the clock is before 1970).
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 0xf) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> ClusterSecret {
        ClusterSecret::new(s.as_bytes()).expect("secret")
    }

    #[test]
    fn test_signature_round_trips_and_binds_path_body_and_node() {
        let s = secret("k");
        let mut h = HeaderMap::new();
        s.sign_headers(&mut h, 7, "/a", b"body");
        let claim = Claim::from_headers(&h, unix_ms()).expect("claim");
        assert_eq!(claim.node, 7);
        claim.verify(&s, "/a", b"body").expect("valid");
        assert_eq!(claim.verify(&s, "/b", b"body"), Err(AuthError::BadSignature));
        assert_eq!(claim.verify(&s, "/a", b"bodY"), Err(AuthError::BadSignature));
        assert_eq!(claim.verify(&secret("other"), "/a", b"body"), Err(AuthError::BadSignature));
        let forged = Claim { node: 8, ..claim };
        assert_eq!(forged.verify(&s, "/a", b"body"), Err(AuthError::BadSignature));
    }

    #[test]
    fn test_stale_and_missing_headers_are_refused() {
        let s = secret("k");
        let mut h = HeaderMap::new();
        s.sign_headers(&mut h, 1, "/a", b"");
        let later = unix_ms() + MAX_SKEW.as_millis() as u64 + 5_000;
        assert!(matches!(Claim::from_headers(&h, later), Err(AuthError::Stale { .. })));
        h.remove(HEADER_SIG);
        assert_eq!(Claim::from_headers(&h, unix_ms()).err(), Some(AuthError::Missing(HEADER_SIG)));
        assert!(ClusterSecret::new(b"").is_err());
        assert_eq!(format!("{s:?}"), "ClusterSecret(..)");
    }
}
