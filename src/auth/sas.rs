//! Parsing and checking of `SharedAccessSignature` tokens exactly as the Azure SDKs build them: the raw
//! `sr` text is what was signed, so it is never re-encoded before verifying.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use percent_encoding::percent_decode_str;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::AuthError;
use crate::model::Credentials;

/// A parsed token. `sr_raw` keeps the text as sent because that is what the client signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SasToken {
    pub sr_raw: String,
    /// `sr` URL-decoded, for resource comparison.
    pub resource: String,
    /// The signature bytes (after URL- and base64-decoding).
    pub sig: Vec<u8>,
    pub se: i64,
    pub skn: Option<String>,
}

impl SasToken {
    pub fn parse(header: &str) -> Result<SasToken, AuthError> {
        let rest = header
            .trim()
            .strip_prefix("SharedAccessSignature ")
            .ok_or_else(|| AuthError::Malformed("must start with 'SharedAccessSignature '".into()))?;
        let (mut sr, mut sig, mut se, mut skn) = (None, None, None, None);
        for part in rest.trim().split('&') {
            let (k, v) =
                part.split_once('=').ok_or_else(|| AuthError::Malformed(format!("field '{part}' has no '='")))?;
            let slot = match k {
                "sr" => &mut sr,
                "sig" => &mut sig,
                "se" => &mut se,
                "skn" => &mut skn,
                // Unknown fields are ignored, as IoT Hub does.
                _ => continue,
            };
            if slot.replace(v.to_string()).is_some() {
                return Err(AuthError::Malformed(format!("field '{k}' appears twice")));
            }
        }
        let sr_raw = sr.ok_or_else(|| AuthError::Malformed("missing 'sr'".into()))?;
        let sig = sig.ok_or_else(|| AuthError::Malformed("missing 'sig'".into()))?;
        let se = se.ok_or_else(|| AuthError::Malformed("missing 'se'".into()))?;
        let se: i64 = se.parse().map_err(|_| AuthError::Malformed(format!("'se' is not an integer: '{se}'")))?;
        let sig = decode(&sig, "sig")?;
        let sig = B64.decode(sig.as_bytes()).map_err(|_| AuthError::Malformed("'sig' is not base64".into()))?;
        let resource = decode(&sr_raw, "sr")?;
        let skn = skn.map(|s| decode(&s, "skn")).transpose()?;
        Ok(SasToken { sr_raw, resource, sig, se, skn })
    }

    /// Checks expiry and that one of `keys` (base64) signed this token; returns the key that did.
    pub fn check<'k>(&self, keys: &[&'k str], now_secs: i64) -> Result<&'k str, AuthError> {
        if self.se < now_secs {
            return Err(AuthError::Expired(self.se));
        }
        verify_signature(&self.sr_raw, self.se, &self.sig, keys)
    }
}

fn decode(s: &str, field: &str) -> Result<String, AuthError> {
    percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| AuthError::Malformed(format!("'{field}' is not valid UTF-8 after URL-decoding")))
}

/// HMAC-SHA256 over `sr + "\n" + se` with the base64-decoded key; `None` if the key is not base64.
pub fn sign(key_b64: &str, sr_raw: &str, se: i64) -> Option<Vec<u8>> {
    mac(key_b64, &signed_text(sr_raw, se))
}

/// What a token signs: `sr + "\n" + se`.
fn signed_text(sr_raw: &str, se: i64) -> String {
    format!("{sr_raw}\n{se}")
}

fn mac(key_b64: &str, text: &str) -> Option<Vec<u8>> {
    let key = B64.decode(key_b64.as_bytes()).ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(text.as_bytes());
    Some(mac.finalize().into_bytes().to_vec())
}

/// Either key of a policy or device may have signed; each comparison is constant-time. The keys are
/// tried in order and the first match ends the search: a token made with the primary key, which is
/// nearly every token, costs one HMAC instead of two. Which key matched is no secret worth timing,
/// since learning it takes a signature that already verifies. Returns the key that signed.
pub fn verify_signature<'k>(sr_raw: &str, se: i64, sig: &[u8], keys: &[&'k str]) -> Result<&'k str, AuthError> {
    let text = signed_text(sr_raw, se);
    let matches = |key: &&str| mac(key, &text).is_some_and(|expected| bool::from(expected.ct_eq(sig)));
    keys.iter().copied().find(matches).ok_or(AuthError::BadSignature)
}

/// Verifies a device or module token (no `skn`) against the device's credentials. The resource must be
/// `{host}/devices/{id}` or `{host}/devices/{id}/modules/{mid}` (case-insensitive; host with or without
/// port).
pub fn verify_device_token(
    token: &SasToken,
    host: &str,
    device_id: &str,
    module_id: Option<&str>,
    creds: &Credentials,
    now_secs: i64,
) -> Result<(), AuthError> {
    let path = match module_id {
        Some(m) => format!("/devices/{device_id}/modules/{m}"),
        None => format!("/devices/{device_id}"),
    };
    let res = token.resource.to_ascii_lowercase();
    let bare = host.split(':').next().unwrap_or(host);
    let matches = [host, bare].iter().any(|h| res == format!("{h}{path}").to_ascii_lowercase());
    if !matches {
        return Err(AuthError::WrongResource(token.resource.clone()));
    }
    let keys: Vec<&str> =
        [&creds.primary_key, &creds.secondary_key].into_iter().flatten().map(String::as_str).collect();
    token.check(&keys, now_secs)?;
    if !creds.enabled {
        return Err(AuthError::Disabled);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};

    const KEY: &str = "c2VjcmV0LWtleS1mb3ItdGVzdHMtMDEyMzQ1Njc4OQ==";

    /// Python's `urllib.parse.quote(s, safe="")`: everything but `A-Za-z0-9_.-~` escaped.
    fn quote_all(s: &str) -> String {
        const SET: &percent_encoding::AsciiSet = &NON_ALPHANUMERIC.remove(b'_').remove(b'.').remove(b'-').remove(b'~');
        utf8_percent_encode(s, SET).to_string()
    }

    /// Python's `quote(sig)` with the default `safe="/"`: the service SDK leaves `/` raw.
    fn quote_keep_slash(s: &str) -> String {
        const SET: &percent_encoding::AsciiSet =
            &NON_ALPHANUMERIC.remove(b'_').remove(b'.').remove(b'-').remove(b'~').remove(b'/');
        utf8_percent_encode(s, SET).to_string()
    }

    fn sig_b64(key: &str, sr: &str, se: i64) -> String {
        B64.encode(sign(key, sr, se).unwrap())
    }

    #[test]
    fn device_token_as_python_device_sdk_builds_it() {
        let sr = quote_all("localhost/devices/dev1");
        assert_eq!(sr, "localhost%2Fdevices%2Fdev1");
        let se = 1_795_352_543;
        let header = format!("SharedAccessSignature sr={sr}&sig={}&se={se}", quote_all(&sig_b64(KEY, &sr, se)));
        let t = SasToken::parse(&header).unwrap();
        assert_eq!(t.resource, "localhost/devices/dev1");
        assert_eq!(t.skn, None);
        let creds = Credentials {
            primary_key: Some("AAAA".into()),
            secondary_key: Some(KEY.into()),
            enabled: true,
            subscriptions: Vec::new(),
            auth_type: "sas".into(),
        };
        verify_device_token(&t, "LOCALHOST:8883", "dev1", None, &creds, se - 10).unwrap();
        assert_eq!(
            verify_device_token(&t, "localhost", "dev2", None, &creds, se - 10),
            Err(AuthError::WrongResource("localhost/devices/dev1".into()))
        );
        assert_eq!(verify_device_token(&t, "localhost", "dev1", None, &creds, se + 1), Err(AuthError::Expired(se)));
        let other = Credentials {
            primary_key: Some("AAAA".into()),
            secondary_key: None,
            enabled: true,
            subscriptions: Vec::new(),
            auth_type: "sas".into(),
        };
        assert_eq!(verify_device_token(&t, "localhost", "dev1", None, &other, se), Err(AuthError::BadSignature));
        let disabled = Credentials { enabled: false, ..creds };
        assert_eq!(verify_device_token(&t, "localhost", "dev1", None, &disabled, se), Err(AuthError::Disabled));
    }

    #[test]
    fn module_token_resource() {
        let sr = quote_all("localhost/devices/d/modules/m");
        let se = 2_000_000_000;
        let header = format!("SharedAccessSignature sr={sr}&sig={}&se={se}", quote_all(&sig_b64(KEY, &sr, se)));
        let t = SasToken::parse(&header).unwrap();
        let creds = Credentials {
            primary_key: Some(KEY.into()),
            secondary_key: None,
            enabled: true,
            subscriptions: Vec::new(),
            auth_type: "sas".into(),
        };
        verify_device_token(&t, "localhost", "d", Some("m"), &creds, 0).unwrap();
        assert!(verify_device_token(&t, "localhost", "d", None, &creds, 0).is_err());
    }

    #[test]
    fn service_token_with_raw_slash_in_sig_verifies() {
        // Find an se whose signature contains '/', which Python's service SDK leaves unescaped.
        let sr = "localhost%3A8443";
        let (se, sig) =
            (1_700_000_000i64..).map(|se| (se, sig_b64(KEY, sr, se))).find(|(_, s)| s.contains('/')).unwrap();
        let header = format!("SharedAccessSignature sr={sr}&sig={}&se={se}&skn=iothubowner", quote_keep_slash(&sig));
        assert!(header.contains('/'));
        let t = SasToken::parse(&header).unwrap();
        assert_eq!(t.resource, "localhost:8443");
        assert_eq!(t.skn.as_deref(), Some("iothubowner"));
        t.check(&[KEY], se).unwrap();
        // The raw sr is what is signed: a re-encoded variant must not verify.
        assert_eq!(verify_signature("localhost:8443", se, &t.sig, &[KEY]), Err(AuthError::BadSignature));
    }

    #[test]
    fn malformed_tokens_name_the_problem() {
        let cases = [
            ("Bearer x", "SharedAccessSignature"),
            ("SharedAccessSignature sig=AAAA&se=1", "'sr'"),
            ("SharedAccessSignature sr=a&se=1", "'sig'"),
            ("SharedAccessSignature sr=a&sig=AAAA", "'se'"),
            ("SharedAccessSignature sr=a&sig=AAAA&se=soon", "integer"),
            ("SharedAccessSignature sr=a&sig=%%%&se=1", "base64"),
            ("SharedAccessSignature sr=a&sig&se=1", "no '='"),
            ("SharedAccessSignature sr=a&sr=b&sig=AAAA&se=1", "twice"),
        ];
        for (h, needle) in cases {
            match SasToken::parse(h) {
                Err(AuthError::Malformed(m)) => assert!(m.contains(needle), "{h}: {m}"),
                other => panic!("{h}: {other:?}"),
            }
        }
    }
}
