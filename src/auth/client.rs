//! The client side of SAS: tokens built exactly as the Azure SDKs build them, for the clients twinhub
//! ships itself (`twinhub chaos`, `twinhub bench`). Signing is the same HMAC the server verifies with
//! ([`super::sign`]), so a client and the server can never disagree on the string to sign.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;

use super::AuthError;

/// Python's `urllib.parse.quote(s, safe)` (what the SDKs use): keeps ASCII alphanumerics, `_.-~` and
/// the ASCII bytes in `safe`, percent-encodes everything else with upper-case hex.
pub fn quote(s: &str, safe: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        let c = b as char;
        if c.is_ascii_alphanumeric() || "_.-~".contains(c) || (b < 128 && safe.contains(c)) {
            out.push(c);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One URL path segment (a device or module id), encoded as the service SDK does.
pub fn path_segment(s: &str) -> String {
    quote(s, "!'()*")
}

/// `SharedAccessSignature sr=…&sig=…&se=…[&skn=…]` for the resource `resource` (not yet encoded).
fn token(resource: &str, key_b64: &str, expiry_unix: u64, skn: Option<&str>) -> Result<String, AuthError> {
    let sr = quote(resource, "");
    let se = i64::try_from(expiry_unix)
        .map_err(|_| AuthError::Malformed(format!("expiry {expiry_unix} is out of range")))?;
    let sig = super::sign(key_b64, &sr, se).ok_or_else(|| AuthError::Malformed("the SAS key is not base64".into()))?;
    let sig = quote(&B64.encode(sig), "");
    Ok(match skn {
        Some(policy) => format!("SharedAccessSignature sr={sr}&sig={sig}&se={se}&skn={policy}"),
        None => format!("SharedAccessSignature sr={sr}&sig={sig}&se={se}"),
    })
}

/// A shared-access-policy token for the whole hub (`sr` = the host name, `skn` = the policy).
pub fn service_token(host: &str, policy: &str, key_b64: &str, expiry_unix: u64) -> Result<String, AuthError> {
    token(host, key_b64, expiry_unix, Some(policy))
}

/// A device token (`sr` = `{host}/devices/{id}`, no `skn`), signed with one of the device's keys.
pub fn device_token(host: &str, device_id: &str, key_b64: &str, expiry_unix: u64) -> Result<String, AuthError> {
    token(&format!("{host}/devices/{device_id}"), key_b64, expiry_unix, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::SasToken;

    #[test]
    fn quoting_matches_python() {
        assert_eq!(quote("localhost/devices/d1", ""), "localhost%2Fdevices%2Fd1");
        assert_eq!(quote("a+b=c", ""), "a%2Bb%3Dc");
        assert_eq!(path_segment("dev 1"), "dev%201");
        assert_eq!(path_segment("it's(1)*"), "it's(1)*");
        assert_eq!(quote("é", ""), "%C3%A9");
    }

    #[test]
    fn tokens_have_the_sdk_shape_and_verify() {
        let key = B64.encode([7u8; 32]);
        let t = service_token("localhost", "iothubowner", &key, 4_000_000_000).expect("token");
        assert!(t.starts_with("SharedAccessSignature sr=localhost&sig="), "{t}");
        assert!(t.ends_with("&se=4000000000&skn=iothubowner"), "{t}");
        let parsed = SasToken::parse(&t).expect("parses");
        assert_eq!(parsed.skn.as_deref(), Some("iothubowner"));
        parsed.check(&[&key], 1).expect("the server accepts it");
        assert!(parsed.check(&[&B64.encode([8u8; 32])], 1).is_err(), "another key must not verify");

        let d = device_token("localhost", "d1", &key, 4_000_000_000).expect("token");
        assert!(d.starts_with("SharedAccessSignature sr=localhost%2Fdevices%2Fd1&sig="), "{d}");
        assert!(!d.contains("skn"));
        let parsed = SasToken::parse(&d).expect("parses");
        parsed.check(&[&key], 1).expect("the server accepts it");
    }

    #[test]
    fn a_key_that_is_not_base64_is_an_error() {
        assert!(matches!(device_token("h", "d", "not base64!", 10), Err(AuthError::Malformed(_))));
    }
}
