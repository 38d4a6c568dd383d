//! Signatures of inter-node requests and responses with the shared cluster secret.
//!
//! Every signed message carries one header, `x-twinhub-auth`: the standard base64 (with padding) of
//! 104 bytes, integers big-endian:
//!
//! | bytes | field |
//! | --- | --- |
//! | 0..8 | the sender's node id |
//! | 8..16 | the sender's clock in Unix milliseconds |
//! | 16..32 | a nonce: 128 random bits chosen by the client for each request; the response repeats the nonce of the request it answers |
//! | 32..40 | the body's length in bytes |
//! | 40..72 | the body's SHA-256 |
//! | 72..104 | `HMAC-SHA256(secret, input)` |
//!
//! where `input` is three lines, each ending with `\n`, then the first 72 bytes above:
//!
//! ```text
//! request:  twinhub-req-v5  METHOD  PATH  FIELDS
//! response: twinhub-resp-v5 STATUS  PATH  FIELDS
//! ```
//!
//! Why each field is there:
//! - the **domain** (first line) differs per direction, so no response, however obtained, is ever a
//!   valid request, and no request is a valid response;
//! - the **nonce** makes every request unique, so the receiver can refuse a second copy (see
//!   [`super::replay`]); in a response it is the *request's* nonce, so a response authenticates only
//!   as the answer to that one request, never to another (or a replayed) one;
//! - **method/status and path** stop a message from being moved to another endpoint or outcome;
//! - **body length and digest** are in the header so the receiver checks the MAC, and refuses,
//!   before it reads a single body byte; the body is then read up to the declared length and compared
//!   with the declared digest.
//!
//! The domain, method or status and path are free of line breaks, and the fields have a fixed length,
//! so the input is unambiguous.
//!
//! **Why one binary header.** Protocol version 2 sent the same fields as six headers in decimal and
//! hex. Five of them are new in every message, so each one entered both ends' HPACK tables and evicted
//! the others, and the table work, header-map inserts and hex coding cost several per cent of a
//! node's CPU under write load. One value that is never indexed (marked sensitive, so HPACK sends it
//! as a literal and neither end stores it) costs one literal per message.
//!
//! Checking is split so that a receiver can refuse early: [`Claim::from_headers`] checks presence,
//! syntax and clock skew; [`Claim::verify_request`] / [`Claim::verify_response`] the MAC, in constant
//! time; [`Claim::check_body`] the body once it is read.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use hyper::header::{HeaderName, HeaderValue};
use hyper::HeaderMap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::ids::NodeId;

/// The one signature header of a signed message.
pub const HEADER_AUTH: &str = "x-twinhub-auth";
// Parsed once: every inter-node message sets or reads it.
const NAME_AUTH: HeaderName = HeaderName::from_static(HEADER_AUTH);

/// Length of the signed fields (node, timestamp, nonce, body length, body digest).
const FIELDS_LEN: usize = 72;
/// Length of the decoded header: the fields and the MAC.
pub const AUTH_LEN: usize = FIELDS_LEN + 32;
/// Length of the header value: base64 with padding of [`AUTH_LEN`] bytes.
const AUTH_B64_LEN: usize = AUTH_LEN.div_ceil(3) * 4;

/// First line of the MAC input of a request; `v5` is the protocol version (see [`super::wire`]).
pub const REQUEST_DOMAIN: &str = "twinhub-req-v5";
/// First line of the MAC input of a response.
pub const RESPONSE_DOMAIN: &str = "twinhub-resp-v5";

/// How far a message's timestamp may be from the receiver's clock. Node clocks must agree within it
/// (NTP does far better); the replay cache remembers nonces for as long as a timestamp stays valid.
pub const MAX_SKEW: Duration = Duration::from_secs(60);

type HmacSha256 = Hmac<Sha256>;

/// 128 random bits naming one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nonce(pub [u8; 16]);

impl Nonce {
    /// A fresh nonce from the thread's CSPRNG: collisions between honest requests are negligible.
    pub fn random() -> Nonce {
        Nonce(rand::random())
    }
}

/// A body's length and SHA-256, as the header declares them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyDigest {
    pub len: u64,
    pub sha256: [u8; 32],
}

impl BodyDigest {
    pub fn of(body: &[u8]) -> BodyDigest {
        BodyDigest { len: body.len() as u64, sha256: Sha256::digest(body).into() }
    }
}

/// What a signature binds besides the sender, time, nonce and body: the direction, and in it the
/// method of a request or the status of a response.
#[derive(Clone, Copy, Debug)]
pub enum Direction<'a> {
    Request { method: &'a str },
    Response { status: u16 },
}

/// The signed fields of one message.
#[derive(Clone, Copy, Debug)]
pub struct Envelope<'a> {
    pub direction: Direction<'a>,
    pub path: &'a str,
    pub node: NodeId,
    pub ts: u64,
    pub nonce: Nonce,
    pub body: BodyDigest,
}

impl Envelope<'_> {
    /// The fixed-length fields, as they are signed and sent.
    fn fields(&self) -> [u8; FIELDS_LEN] {
        fields(self.node, self.ts, self.nonce, self.body)
    }
}

fn fields(node: NodeId, ts: u64, nonce: Nonce, body: BodyDigest) -> [u8; FIELDS_LEN] {
    let mut out = [0u8; FIELDS_LEN];
    out[0..8].copy_from_slice(&node.to_be_bytes());
    out[8..16].copy_from_slice(&ts.to_be_bytes());
    out[16..32].copy_from_slice(&nonce.0);
    out[32..40].copy_from_slice(&body.len.to_be_bytes());
    out[40..72].copy_from_slice(&body.sha256);
    out
}

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

    /// The MAC over the message's input (see the module doc), fed to the HMAC piece by piece.
    fn mac(&self, direction: Direction<'_>, path: &str, fields: &[u8; FIELDS_LEN]) -> HmacSha256 {
        let mut mac = (*self.mac).clone();
        let mut line = |bytes: &[u8]| {
            mac.update(bytes);
            mac.update(b"\n");
        };
        match direction {
            Direction::Request { method } => {
                line(REQUEST_DOMAIN.as_bytes());
                line(method.as_bytes());
            }
            Direction::Response { status } => {
                line(RESPONSE_DOMAIN.as_bytes());
                line(decimal(u64::from(status), &mut [0u8; 20]));
            }
        }
        line(path.as_bytes());
        mac.update(fields);
        mac
    }

    /// The decoded header of a message: its fields and their MAC.
    pub fn sign(&self, e: &Envelope<'_>) -> [u8; AUTH_LEN] {
        let fields = e.fields();
        let mut out = [0u8; AUTH_LEN];
        out[..FIELDS_LEN].copy_from_slice(&fields);
        out[FIELDS_LEN..].copy_from_slice(&self.mac(e.direction, e.path, &fields).finalize().into_bytes());
        out
    }

    /// Sets the signature header of a message.
    pub fn sign_headers(&self, headers: &mut HeaderMap, e: &Envelope<'_>) {
        let mut b64 = [0u8; AUTH_B64_LEN];
        // The buffer is exactly the encoded length, so this cannot fail; base64 is always a valid
        // header value.
        if let Ok(n) = B64.encode_slice(self.sign(e), &mut b64) {
            if let Ok(mut v) = HeaderValue::from_bytes(&b64[..n]) {
                v.set_sensitive(true);
                headers.insert(NAME_AUTH, v);
            }
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
    #[error("body does not match its signed length and digest")]
    BodyMismatch,
    #[error("nonce already seen: a replayed message")]
    Replayed,
    /// The sender's timestamp is at or below what the replay cache still remembers for it (see
    /// [`super::replay`]): it might be a replay the cache can no longer recognise.
    #[error("message older than the replay window this node still remembers")]
    Forgotten,
    #[error("replay cache full: too many senders")]
    TooManySenders,
}

/// What a message's header claims, before the MAC is checked.
#[derive(Debug, Clone)]
pub struct Claim {
    pub node: NodeId,
    pub ts: u64,
    pub nonce: Nonce,
    pub body: BodyDigest,
    sig: [u8; 32],
}

impl Claim {
    /// Parses the signature header and checks the timestamp against `now_ms`.
    pub fn from_headers(headers: &HeaderMap, now_ms: u64) -> Result<Claim, AuthError> {
        let value = headers.get(&NAME_AUTH).ok_or(AuthError::Missing(HEADER_AUTH))?;
        let malformed = AuthError::Malformed(HEADER_AUTH);
        if value.len() != AUTH_B64_LEN {
            return Err(malformed);
        }
        let mut raw = [0u8; AUTH_LEN + 2];
        match B64.decode_slice(value.as_bytes(), &mut raw) {
            Ok(AUTH_LEN) => {}
            _ => return Err(malformed),
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&raw[at..at + 8]);
            u64::from_be_bytes(b)
        };
        let (node, ts, len) = (u64_at(0), u64_at(8), u64_at(32));
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&raw[16..32]);
        let mut sha256 = [0u8; 32];
        sha256.copy_from_slice(&raw[40..72]);
        let mut sig = [0u8; 32];
        sig.copy_from_slice(&raw[FIELDS_LEN..AUTH_LEN]);
        let skew_ms = ts.abs_diff(now_ms);
        if u128::from(skew_ms) > MAX_SKEW.as_millis() {
            return Err(AuthError::Stale { ts, skew_ms });
        }
        Ok(Claim { node, ts, nonce: Nonce(nonce), body: BodyDigest { len, sha256 }, sig })
    }

    /// Checks the MAC of a request (with its own nonce), in constant time.
    pub fn verify_request(&self, secret: &ClusterSecret, method: &str, path: &str) -> Result<(), AuthError> {
        self.verify(secret, Direction::Request { method }, path, self.nonce)
    }

    /// Checks the MAC of a response to the request that carried `request_nonce`. The nonce is the one
    /// we sent, not the one the response claims: an answer to any other request does not verify.
    pub fn verify_response(
        &self,
        secret: &ClusterSecret,
        status: u16,
        path: &str,
        request_nonce: Nonce,
    ) -> Result<(), AuthError> {
        self.verify(secret, Direction::Response { status }, path, request_nonce)
    }

    fn verify(
        &self,
        secret: &ClusterSecret,
        direction: Direction<'_>,
        path: &str,
        nonce: Nonce,
    ) -> Result<(), AuthError> {
        let fields = fields(self.node, self.ts, nonce, self.body);
        secret.mac(direction, path, &fields).verify_slice(&self.sig).map_err(|_| AuthError::BadSignature)
    }

    /// Checks a body read after the MAC against the signed length and digest.
    pub fn check_body(&self, body: &[u8]) -> Result<(), AuthError> {
        let got = BodyDigest::of(body);
        let same = got.len == self.body.len && bool::from(got.sha256.ct_eq(&self.body.sha256));
        if same {
            Ok(())
        } else {
            Err(AuthError::BodyMismatch)
        }
    }
}

/// This node's clock in Unix milliseconds (0 if the clock is before 1970).
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The decimal digits of `n` in `buf`, without allocating.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> ClusterSecret {
        ClusterSecret::new(s.as_bytes()).expect("secret")
    }

    fn request<'a>(path: &'a str, node: NodeId, nonce: Nonce, body: &[u8]) -> Envelope<'a> {
        Envelope {
            direction: Direction::Request { method: "POST" },
            path,
            node,
            ts: unix_ms(),
            nonce,
            body: BodyDigest::of(body),
        }
    }

    fn signed(s: &ClusterSecret, e: &Envelope<'_>) -> Claim {
        let mut h = HeaderMap::new();
        s.sign_headers(&mut h, e);
        Claim::from_headers(&h, unix_ms()).expect("claim")
    }

    #[test]
    fn test_request_signature_binds_method_path_node_nonce_and_body() {
        let s = secret("k");
        let nonce = Nonce::random();
        let claim = signed(&s, &request("/a", 7, nonce, b"body"));
        assert_eq!((claim.node, claim.nonce), (7, nonce));
        claim.verify_request(&s, "POST", "/a").expect("valid");
        claim.check_body(b"body").expect("body");
        assert_eq!(claim.verify_request(&s, "POST", "/b"), Err(AuthError::BadSignature));
        assert_eq!(claim.verify_request(&s, "PUT", "/a"), Err(AuthError::BadSignature));
        assert_eq!(claim.verify_request(&secret("other"), "POST", "/a"), Err(AuthError::BadSignature));
        assert_eq!(claim.check_body(b"bodY"), Err(AuthError::BodyMismatch));
        assert_eq!(claim.check_body(b"body!"), Err(AuthError::BodyMismatch));
        for forged in [
            Claim { node: 8, ..claim.clone() },
            Claim { nonce: Nonce::random(), ..claim.clone() },
            Claim { ts: claim.ts + 1, ..claim.clone() },
            Claim { body: BodyDigest::of(b"other"), ..claim.clone() },
        ] {
            assert_eq!(forged.verify_request(&s, "POST", "/a"), Err(AuthError::BadSignature));
        }
    }

    #[test]
    fn test_directions_are_separate_domains() {
        let s = secret("k");
        let nonce = Nonce::random();
        // A response signed by node 1 for a request to /a carrying `nonce`...
        let resp = Envelope { direction: Direction::Response { status: 200 }, ..request("/a", 1, nonce, b"x") };
        let claim = signed(&s, &resp);
        claim.verify_response(&s, 200, "/a", nonce).expect("valid response");
        // ...is no request, whatever method is assumed (a refusal's headers are no oracle either).
        for method in ["POST", "200", ""] {
            assert_eq!(claim.verify_request(&s, method, "/a"), Err(AuthError::BadSignature));
        }
        // ...answers only that request, with that status.
        assert_eq!(claim.verify_response(&s, 200, "/a", Nonce::random()), Err(AuthError::BadSignature));
        assert_eq!(claim.verify_response(&s, 401, "/a", nonce), Err(AuthError::BadSignature));
        // And a request is no response, even to itself.
        let req = signed(&s, &request("/a", 1, nonce, b"x"));
        assert_eq!(req.verify_response(&s, 200, "/a", nonce), Err(AuthError::BadSignature));
    }

    #[test]
    fn test_stale_missing_and_malformed_headers_are_refused() {
        let s = secret("k");
        let mut h = HeaderMap::new();
        s.sign_headers(&mut h, &request("/a", 1, Nonce::random(), b""));
        assert!(h.get(HEADER_AUTH).is_some_and(HeaderValue::is_sensitive), "never indexed by HPACK");
        let later = unix_ms() + MAX_SKEW.as_millis() as u64 + 5_000;
        assert!(matches!(Claim::from_headers(&h, later), Err(AuthError::Stale { .. })));
        assert_eq!(Claim::from_headers(&HeaderMap::new(), unix_ms()).err(), Some(AuthError::Missing(HEADER_AUTH)));
        let good = h.get(HEADER_AUTH).map(|v| v.to_str().unwrap_or_default().to_string()).unwrap_or_default();
        for bad in [
            "abcd".to_string(),
            // One byte short, one too many, not base64, unpadded.
            B64.encode([0u8; AUTH_LEN - 1]),
            B64.encode([0u8; AUTH_LEN + 1]),
            format!("{}!", &good[..good.len() - 1]),
            good.trim_end_matches('=').to_string(),
        ] {
            h.insert(HEADER_AUTH, HeaderValue::from_str(&bad).expect("value"));
            assert_eq!(Claim::from_headers(&h, unix_ms()).err(), Some(AuthError::Malformed(HEADER_AUTH)), "{bad}");
        }
        assert!(ClusterSecret::new(b"").is_err());
        assert_eq!(format!("{s:?}"), "ClusterSecret(..)");
    }

    /// The MAC input is fed in pieces; it must stay the documented bytes, or nodes of different
    /// releases would refuse each other.
    #[test]
    fn test_header_is_the_documented_bytes() {
        let s = secret("k");
        let nonce = Nonce([0x5a; 16]);
        let body = BodyDigest::of(b"body");
        for (direction, verb) in [
            (Direction::Request { method: "POST" }, "POST".to_string()),
            (Direction::Response { status: 200 }, "200".into()),
        ] {
            let domain = match direction {
                Direction::Request { .. } => REQUEST_DOMAIN,
                Direction::Response { .. } => RESPONSE_DOMAIN,
            };
            let e =
                Envelope { direction, path: "/cluster/v5/raft/append", node: 7, ts: 1_700_000_000_123, nonce, body };
            // The layout written out independently of the code under test.
            let mut fields = Vec::new();
            fields.extend_from_slice(&7u64.to_be_bytes());
            fields.extend_from_slice(&1_700_000_000_123u64.to_be_bytes());
            fields.extend_from_slice(&[0x5a; 16]);
            fields.extend_from_slice(&4u64.to_be_bytes());
            fields.extend_from_slice(&body.sha256);
            let mut mac = HmacSha256::new_from_slice(b"k").expect("key");
            mac.update(format!("{domain}\n{verb}\n/cluster/v5/raft/append\n").as_bytes());
            mac.update(&fields);
            let mut want = fields.clone();
            want.extend_from_slice(&mac.finalize().into_bytes());
            assert_eq!(&s.sign(&e)[..], &want[..], "{domain}");
            let mut h = HeaderMap::new();
            s.sign_headers(&mut h, &e);
            assert_eq!(h.get(HEADER_AUTH).map(HeaderValue::as_bytes), Some(B64.encode(&want).as_bytes()));
        }
        let mut digits = [0u8; 20];
        for n in [0u64, 9, 10, 1234567890, u64::MAX] {
            assert_eq!(decimal(n, &mut digits), n.to_string().as_bytes());
        }
    }
}
