//! Signatures of inter-node requests and responses with the shared cluster secret.
//!
//! Every signed message carries six headers:
//!
//! - `x-twinhub-node`: the sender's node id,
//! - `x-twinhub-ts`: the sender's clock in Unix milliseconds,
//! - `x-twinhub-nonce`: 128 random bits (32 hex digits) chosen by the client for each request; the
//!   response repeats the nonce of the request it answers,
//! - `x-twinhub-body-len`: the body's length in bytes,
//! - `x-twinhub-body-sha256`: the body's SHA-256 (64 hex digits),
//! - `x-twinhub-sig`: `base64(HMAC-SHA256(secret, input))`, where `input` is, one field per line
//!   (each line ends with `\n`):
//!
//! ```text
//! request:  twinhub-req-v2  METHOD  PATH NODE TS NONCE BODY-LEN BODY-SHA256
//! response: twinhub-resp-v2 STATUS  PATH NODE TS NONCE BODY-LEN BODY-SHA256
//! ```
//!
//! Why each field is there:
//! - the **domain** (first line) differs per direction, so no response, however obtained, is ever a
//!   valid request, and no request is a valid response;
//! - the **nonce** makes every request unique, so the receiver can refuse a second copy (see
//!   [`super::replay`]); in a response it is the *request's* nonce, so a response authenticates only
//!   as the answer to that one request, never to another (or a replayed) one;
//! - **method/status and path** stop a message from being moved to another endpoint or outcome;
//! - **body length and digest** are in the headers so the receiver checks the MAC, and refuses,
//!   before it reads a single body byte; the body is then read up to the declared length and compared
//!   with the declared digest.
//!
//! Every field is free of line breaks (numbers, hex, an HTTP method or an URI path), so the input is
//! unambiguous. Checking is split so that a receiver can refuse early: [`Claim::from_headers`] checks
//! presence, syntax and clock skew; [`Claim::verify_request`] / [`Claim::verify_response`] the MAC,
//! in constant time; [`Claim::check_body`] the body once it is read.

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

pub const HEADER_NODE: &str = "x-twinhub-node";
pub const HEADER_TS: &str = "x-twinhub-ts";
pub const HEADER_NONCE: &str = "x-twinhub-nonce";
pub const HEADER_BODY_LEN: &str = "x-twinhub-body-len";
pub const HEADER_BODY_SHA256: &str = "x-twinhub-body-sha256";
pub const HEADER_SIG: &str = "x-twinhub-sig";

// The same names, parsed once: every inter-node message sets and reads all six.
const NAME_NODE: HeaderName = HeaderName::from_static(HEADER_NODE);
const NAME_TS: HeaderName = HeaderName::from_static(HEADER_TS);
const NAME_NONCE: HeaderName = HeaderName::from_static(HEADER_NONCE);
const NAME_BODY_LEN: HeaderName = HeaderName::from_static(HEADER_BODY_LEN);
const NAME_BODY_SHA256: HeaderName = HeaderName::from_static(HEADER_BODY_SHA256);
const NAME_SIG: HeaderName = HeaderName::from_static(HEADER_SIG);

/// Every signature header, e.g. to check that an unsigned refusal carries none of them.
pub const SIGNATURE_HEADERS: [&str; 6] =
    [HEADER_NODE, HEADER_TS, HEADER_NONCE, HEADER_BODY_LEN, HEADER_BODY_SHA256, HEADER_SIG];

/// First line of the MAC input of a request; `v2` is the protocol version (see [`super::wire`]).
pub const REQUEST_DOMAIN: &str = "twinhub-req-v2";
/// First line of the MAC input of a response.
pub const RESPONSE_DOMAIN: &str = "twinhub-resp-v2";

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

    pub fn to_hex(self) -> String {
        String::from_utf8_lossy(hex_into(&self.0, &mut [0u8; 32])).into_owned()
    }

    fn from_hex(s: &str) -> Option<Nonce> {
        unhex::<16>(s).map(Nonce)
    }
}

/// A body's length and SHA-256, as the headers declare them.
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

    /// The MAC over the message's lines (see the module doc), fed to the HMAC piece by piece: every
    /// inter-node message is signed and checked, and formatting the input as one string first cost
    /// more than the HMAC itself.
    fn mac(&self, e: &Envelope<'_>) -> HmacSha256 {
        let mut mac = (*self.mac).clone();
        let mut line = |bytes: &[u8]| {
            mac.update(bytes);
            mac.update(b"\n");
        };
        let mut digits = [0u8; 20];
        match e.direction {
            Direction::Request { method } => {
                line(REQUEST_DOMAIN.as_bytes());
                line(method.as_bytes());
            }
            Direction::Response { status } => {
                line(RESPONSE_DOMAIN.as_bytes());
                line(decimal(u64::from(status), &mut digits));
            }
        }
        line(e.path.as_bytes());
        line(decimal(e.node, &mut digits));
        line(decimal(e.ts, &mut digits));
        line(hex_into(&e.nonce.0, &mut [0u8; 32]));
        line(decimal(e.body.len, &mut digits));
        line(hex_into(&e.body.sha256, &mut [0u8; 64]));
        mac
    }

    /// The base64 signature of a message.
    pub fn sign(&self, e: &Envelope<'_>) -> String {
        B64.encode(self.mac(e).finalize().into_bytes())
    }

    /// Sets the six signature headers of a message.
    pub fn sign_headers(&self, headers: &mut HeaderMap, e: &Envelope<'_>) {
        let sig = self.sign(e);
        headers.reserve(SIGNATURE_HEADERS.len());
        headers.insert(NAME_NODE, HeaderValue::from(e.node));
        headers.insert(NAME_TS, HeaderValue::from(e.ts));
        headers.insert(NAME_BODY_LEN, HeaderValue::from(e.body.len));
        // Hex and base64 are always valid header values.
        for (name, value) in [
            (NAME_NONCE, hex_into(&e.nonce.0, &mut [0u8; 32])),
            (NAME_BODY_SHA256, hex_into(&e.body.sha256, &mut [0u8; 64])),
            (NAME_SIG, sig.as_bytes()),
        ] {
            if let Ok(v) = HeaderValue::from_bytes(value) {
                headers.insert(name, v);
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

/// What a message's headers claim, before the MAC is checked.
#[derive(Debug, Clone)]
pub struct Claim {
    pub node: NodeId,
    pub ts: u64,
    pub nonce: Nonce,
    pub body: BodyDigest,
    sig: Vec<u8>,
}

impl Claim {
    /// Parses the signature headers and checks the timestamp against `now_ms`.
    pub fn from_headers(headers: &HeaderMap, now_ms: u64) -> Result<Claim, AuthError> {
        let node = header(headers, &NAME_NODE, HEADER_NODE)?.parse().map_err(|_| AuthError::Malformed(HEADER_NODE))?;
        let ts: u64 = header(headers, &NAME_TS, HEADER_TS)?.parse().map_err(|_| AuthError::Malformed(HEADER_TS))?;
        let nonce =
            Nonce::from_hex(header(headers, &NAME_NONCE, HEADER_NONCE)?).ok_or(AuthError::Malformed(HEADER_NONCE))?;
        let len = header(headers, &NAME_BODY_LEN, HEADER_BODY_LEN)?
            .parse()
            .map_err(|_| AuthError::Malformed(HEADER_BODY_LEN))?;
        let sha256 = unhex::<32>(header(headers, &NAME_BODY_SHA256, HEADER_BODY_SHA256)?)
            .ok_or(AuthError::Malformed(HEADER_BODY_SHA256))?;
        let sig = B64.decode(header(headers, &NAME_SIG, HEADER_SIG)?).map_err(|_| AuthError::Malformed(HEADER_SIG))?;
        let skew_ms = ts.abs_diff(now_ms);
        if u128::from(skew_ms) > MAX_SKEW.as_millis() {
            return Err(AuthError::Stale { ts, skew_ms });
        }
        Ok(Claim { node, ts, nonce, body: BodyDigest { len, sha256 }, sig })
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
        let e = Envelope { direction, path, node: self.node, ts: self.ts, nonce, body: self.body };
        secret.mac(&e).verify_slice(&self.sig).map_err(|_| AuthError::BadSignature)
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

fn header<'a>(headers: &'a HeaderMap, name: &HeaderName, label: &'static str) -> Result<&'a str, AuthError> {
    headers.get(name).ok_or(AuthError::Missing(label))?.to_str().map_err(|_| AuthError::Malformed(label))
}

/// This node's clock in Unix milliseconds (0 if the clock is before 1970).
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Lower-case hex of `bytes` into `out` (twice as long), without allocating.
fn hex_into<'a>(bytes: &[u8], out: &'a mut [u8]) -> &'a [u8] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[(b >> 4) as usize];
        pair[1] = DIGITS[(b & 0xf) as usize];
    }
    &out[..2 * bytes.len().min(out.len() / 2)]
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

/// Exactly `2 * N` hex digits (either case) into `N` bytes.
fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let s = s.as_bytes();
    if s.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = [0u8; N];
    for (i, pair) in s.chunks_exact(2).enumerate() {
        out[i] = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
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
        let later = unix_ms() + MAX_SKEW.as_millis() as u64 + 5_000;
        assert!(matches!(Claim::from_headers(&h, later), Err(AuthError::Stale { .. })));
        for name in SIGNATURE_HEADERS {
            let mut without = h.clone();
            without.remove(name);
            assert_eq!(Claim::from_headers(&without, unix_ms()).err(), Some(AuthError::Missing(name)));
        }
        h.insert(HEADER_NONCE, HeaderValue::from_static("abcd"));
        assert_eq!(Claim::from_headers(&h, unix_ms()).err(), Some(AuthError::Malformed(HEADER_NONCE)));
        assert!(ClusterSecret::new(b"").is_err());
        assert_eq!(format!("{s:?}"), "ClusterSecret(..)");
    }

    /// The MAC input is fed in pieces; it must stay the documented lines, byte for byte, or nodes of
    /// different releases would refuse each other.
    #[test]
    fn test_mac_input_is_the_documented_lines() {
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
                Envelope { direction, path: "/cluster/v2/raft/append", node: 7, ts: 1_700_000_000_123, nonce, body };
            // Hex written independently of the code under test.
            let sha: String = body.sha256.iter().map(|b| format!("{b:02x}")).collect();
            let input =
                format!("{domain}\n{verb}\n/cluster/v2/raft/append\n7\n1700000000123\n{}\n4\n{sha}\n", "5a".repeat(16));
            let mut mac = HmacSha256::new_from_slice(b"k").expect("key");
            mac.update(input.as_bytes());
            assert_eq!(s.sign(&e), B64.encode(mac.finalize().into_bytes()), "{domain}");
        }
        let mut digits = [0u8; 20];
        for n in [0u64, 9, 10, 1234567890, u64::MAX] {
            assert_eq!(decimal(n, &mut digits), n.to_string().as_bytes());
        }
    }

    #[test]
    fn test_hex_round_trips() {
        let n = Nonce([0xab; 16]);
        assert_eq!(Nonce::from_hex(&n.to_hex()), Some(n));
        assert_eq!(Nonce::from_hex(&n.to_hex().to_uppercase()), Some(n));
        assert_eq!(Nonce::from_hex("zz"), None);
        assert_eq!(unhex::<1>("g0"), None);
    }
}
