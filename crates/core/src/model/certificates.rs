//! The hub's CA certificates (`/certificates`), kept in the metadata group's state: X.509
//! `certificateAuthority` devices authenticate with a chain to one of them, but only once its owner has
//! proved possession of its private key (`generateVerificationCode`, then `verify` with a certificate
//! signed by the CA whose subject CN is the code). Everything here is deterministic: the front door
//! parses and checks certificates and chooses the verification code; apply only compares and records.

use std::collections::BTreeMap;

use base64::Engine as _;
use rustls_pki_types::CertificateDer;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::command::IfMatch;
use super::error::TwinError;
use super::time::format_ms;

/// What the front door learned from an uploaded certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaCert {
    /// The certificate's DER, base64 (the PEM body).
    pub der_b64: String,
    pub subject: String,
    /// Upper-case hex SHA-1 of the DER (IoT Hub's `thumbprint`).
    pub thumbprint: String,
    pub not_before_ms: i64,
    pub expiry_ms: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaRecord {
    pub cert: CaCert,
    pub verified: bool,
    /// The code a proof of possession must name; set by `generateVerificationCode`.
    pub verification_code: Option<String>,
    pub etag: String,
    pub created_ms: i64,
    pub updated_ms: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CertOp {
    /// Create, or (with `if_match`) replace an existing record; a new certificate is unverified unless
    /// the caller states `isVerified: true` (as IoT Hub lets an owner do on upload).
    Put {
        name: String,
        cert: CaCert,
        verified: bool,
        if_match: Option<IfMatch>,
    },
    Delete {
        name: String,
        if_match: Option<IfMatch>,
    },
    GenerateCode {
        name: String,
        code: String,
        if_match: Option<IfMatch>,
    },
    /// The front door checked a proof naming `code`; it counts only if `code` is still the record's.
    Verify {
        name: String,
        code: String,
        if_match: Option<IfMatch>,
    },
}

impl CertOp {
    pub fn name(&self) -> &str {
        match self {
            CertOp::Put { name, .. }
            | CertOp::Delete { name, .. }
            | CertOp::GenerateCode { name, .. }
            | CertOp::Verify { name, .. } => name,
        }
    }
}

/// CA certificates a hub holds at most: a device presenting a certificate is checked against each.
pub const MAX_CERTIFICATES: usize = 25;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Certificates {
    records: BTreeMap<String, CaRecord>,
    /// Last etag counter handed out; only grows.
    seq: u64,
}

fn not_found(name: &str) -> TwinError {
    TwinError::CertificateNotFound(name.to_string())
}

fn check_etag(r: &CaRecord, if_match: &Option<IfMatch>) -> Result<(), TwinError> {
    match if_match {
        Some(IfMatch::Etag(e)) if e.trim_matches('"') != r.etag => {
            Err(TwinError::PreconditionFailed(format!("certificate etag is {}, If-Match was {e}", r.etag)))
        }
        _ => Ok(()),
    }
}

impl Certificates {
    fn next_etag(&mut self) -> String {
        self.seq += 1;
        base64::engine::general_purpose::STANDARD.encode(self.seq.to_be_bytes())
    }

    /// Applies a committed change; answers the record as IoT Hub renders it (`Done` for a delete).
    pub fn apply(&mut self, op: &CertOp, now_ms: i64) -> Result<Option<Value>, TwinError> {
        let name = op.name().to_string();
        match op {
            CertOp::Put { cert, verified, if_match, .. } => {
                let created_ms = match (self.records.get(&name), if_match) {
                    (Some(r), Some(_)) => {
                        check_etag(r, if_match)?;
                        r.created_ms
                    }
                    (Some(_), None) => {
                        return Err(TwinError::PreconditionFailed(format!(
                            "certificate {name} exists; replacing it needs If-Match"
                        )))
                    }
                    (None, _) if self.records.len() >= MAX_CERTIFICATES => {
                        return Err(TwinError::QuotaExceeded { what: "CA certificates".into(), max: MAX_CERTIFICATES })
                    }
                    (None, _) => now_ms,
                };
                let etag = self.next_etag();
                let r = CaRecord {
                    cert: cert.clone(),
                    verified: *verified,
                    verification_code: None,
                    etag,
                    created_ms,
                    updated_ms: now_ms,
                };
                self.records.insert(name.clone(), r);
            }
            CertOp::Delete { if_match, .. } => {
                let r = self.records.get(&name).ok_or_else(|| not_found(&name))?;
                check_etag(r, if_match)?;
                self.records.remove(&name);
                return Ok(None);
            }
            CertOp::GenerateCode { code, if_match, .. } => {
                let r = self.records.get(&name).ok_or_else(|| not_found(&name))?;
                check_etag(r, if_match)?;
                let etag = self.next_etag();
                let r = self.records.get_mut(&name).ok_or_else(|| not_found(&name))?;
                r.verification_code = Some(code.clone());
                r.etag = etag;
                r.updated_ms = now_ms;
            }
            CertOp::Verify { code, if_match, .. } => {
                let r = self.records.get(&name).ok_or_else(|| not_found(&name))?;
                check_etag(r, if_match)?;
                if r.verification_code.as_deref() != Some(code.as_str()) {
                    return Err(TwinError::InvalidArgument(format!(
                        "the verification certificate's CN is not the current verification code of certificate {name}"
                    )));
                }
                let etag = self.next_etag();
                let r = self.records.get_mut(&name).ok_or_else(|| not_found(&name))?;
                r.verified = true;
                r.verification_code = None;
                r.etag = etag;
                r.updated_ms = now_ms;
            }
        }
        Ok(self.render(&name, false))
    }

    pub fn get(&self, name: &str) -> Option<&CaRecord> {
        self.records.get(name)
    }

    /// `CertificateDescription` JSON; `with_code` adds the verification code (only the
    /// `generateVerificationCode` answer shows it).
    pub fn render(&self, name: &str, with_code: bool) -> Option<Value> {
        let r = self.records.get(name)?;
        let mut props = json!({
            "subject": r.cert.subject,
            "expiry": format_ms(r.cert.expiry_ms),
            "thumbprint": r.cert.thumbprint,
            "isVerified": r.verified,
            "created": format_ms(r.created_ms),
            "updated": format_ms(r.updated_ms),
            "certificate": pem(&r.cert.der_b64),
        });
        if with_code {
            props["verificationCode"] = json!(r.verification_code);
        }
        Some(
            json!({"properties": props, "id": name, "name": name, "etag": r.etag, "type": "Microsoft.Devices/IotHubs/Certificates"}),
        )
    }

    pub fn list(&self) -> Vec<Value> {
        self.records.keys().filter_map(|n| self.render(n, false)).collect()
    }

    /// DER of every verified CA: the trust anchors of `certificateAuthority` devices.
    pub fn verified_anchors(&self) -> Vec<CertificateDer<'static>> {
        self.records
            .values()
            .filter(|r| r.verified)
            .filter_map(|r| base64::engine::general_purpose::STANDARD.decode(&r.cert.der_b64).ok())
            .map(CertificateDer::from)
            .collect()
    }
}

/// PEM text of a base64 DER body.
pub fn pem(der_b64: &str) -> String {
    let lines: Vec<&str> = der_b64.as_bytes().chunks(64).filter_map(|c| std::str::from_utf8(c).ok()).collect();
    format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert() -> CaCert {
        CaCert {
            der_b64: "AAEC".into(),
            subject: "CN=root".into(),
            thumbprint: "AB".into(),
            not_before_ms: 0,
            expiry_ms: 1,
        }
    }

    #[test]
    fn a_hub_holds_at_most_its_quota_of_ca_certificates() {
        let mut c = Certificates::default();
        let put = |name: String| CertOp::Put { name, cert: cert(), verified: false, if_match: None };
        for i in 0..MAX_CERTIFICATES {
            c.apply(&put(format!("ca{i}")), 1).unwrap();
        }
        let e = c.apply(&put("one-more".into()), 2).unwrap_err();
        assert_eq!(e, TwinError::QuotaExceeded { what: "CA certificates".into(), max: MAX_CERTIFICATES });
        c.apply(&CertOp::Delete { name: "ca0".into(), if_match: Some(IfMatch::Any) }, 3).unwrap();
        c.apply(&put("one-more".into()), 4).unwrap();
    }

    #[test]
    fn proof_of_possession_verifies_only_with_the_current_code_and_etag() {
        let mut c = Certificates::default();
        let put = CertOp::Put { name: "ca".into(), cert: cert(), verified: false, if_match: None };
        let v = c.apply(&put, 1).unwrap().unwrap();
        assert_eq!(v["properties"]["isVerified"], false);
        assert!(c.verified_anchors().is_empty(), "an unverified CA trusts nothing");
        assert!(matches!(c.apply(&put, 2), Err(TwinError::PreconditionFailed(_))), "a second create");
        let etag = v["etag"].as_str().unwrap().to_string();
        let verify = |code: &str, etag: &str| CertOp::Verify {
            name: "ca".into(),
            code: code.into(),
            if_match: Some(IfMatch::Etag(etag.into())),
        };
        assert!(matches!(c.apply(&verify("x", &etag), 3), Err(TwinError::InvalidArgument(_))), "no code generated yet");
        let gen = CertOp::GenerateCode {
            name: "ca".into(),
            code: "C0DE".into(),
            if_match: Some(IfMatch::Etag("stale".into())),
        };
        assert!(matches!(c.apply(&gen, 3), Err(TwinError::PreconditionFailed(_))));
        let gen = CertOp::GenerateCode {
            name: "ca".into(),
            code: "C0DE".into(),
            if_match: Some(IfMatch::Etag(etag.clone())),
        };
        let v = c.apply(&gen, 4).unwrap().unwrap();
        let etag2 = v["etag"].as_str().unwrap().to_string();
        assert_ne!(etag, etag2);
        assert_eq!(c.render("ca", true).unwrap()["properties"]["verificationCode"], "C0DE");
        assert!(matches!(c.apply(&verify("OTHER", &etag2), 5), Err(TwinError::InvalidArgument(_))));
        assert!(matches!(c.apply(&verify("C0DE", &etag), 5), Err(TwinError::PreconditionFailed(_))));
        let v = c.apply(&verify("C0DE", &etag2), 6).unwrap().unwrap();
        assert_eq!(v["properties"]["isVerified"], true);
        assert_eq!(c.verified_anchors(), vec![CertificateDer::from(vec![0u8, 1, 2])]);
        let del = CertOp::Delete { name: "ca".into(), if_match: Some(IfMatch::Any) };
        assert_eq!(c.apply(&del, 7), Ok(None));
        assert!(c.verified_anchors().is_empty(), "a deleted CA trusts nothing");
        assert!(matches!(c.apply(&del, 8), Err(TwinError::CertificateNotFound(_))));
    }
}
