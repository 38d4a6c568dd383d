//! The hub's CA certificates: `PUT/GET/DELETE /certificates/{name}`, `GET /certificates`,
//! `POST /certificates/{name}/generateVerificationCode`, `POST /certificates/{name}/verify` (the shape
//! of IoT Hub's certificate resource, `{"properties": {...}, "etag", "name"}`). Writes need
//! RegistryWrite, reads RegistryRead. A CA authenticates `certificateAuthority` devices only once it is
//! verified: its owner proves possession of its key by presenting a certificate it signed whose subject
//! CN is the verification code the hub generated.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use rustls::pki_types::CertificateDer;
use serde_json::{json, Value};

use super::path::Path;
use super::registry::if_match;
use super::{body, ok_json, ApiError, Shared};
use crate::auth::{x509, Permission};
use crate::model::certificates::{CaCert, CertOp};
use crate::model::{now_ms, validate_id, IfMatch, Op, Reply};

const RESOURCE: &str = "certificates";

/// DER of a certificate sent as PEM or as bare base64.
fn der_of(text: &str) -> Result<Vec<u8>, ApiError> {
    let bad =
        |why: &str| ApiError::BadRequest(format!("'certificate' is not a PEM or base64 X.509 certificate: {why}"));
    if text.contains("-----BEGIN") {
        let mut bytes = text.as_bytes();
        let mut certs = rustls_pemfile::certs(&mut bytes);
        return match certs.next() {
            Some(Ok(c)) => Ok(c.to_vec()),
            Some(Err(e)) => Err(bad(&e.to_string())),
            None => Err(bad("no CERTIFICATE block")),
        };
    }
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    base64::engine::general_purpose::STANDARD.decode(compact).map_err(|e| bad(&e.to_string()))
}

fn certificate_field<'a>(v: &'a Value, pointer: &str) -> Result<&'a str, ApiError> {
    v.pointer(pointer).and_then(Value::as_str).ok_or_else(|| {
        ApiError::BadRequest(format!("the body has no string '{}'", pointer.trim_start_matches('/').replace('/', ".")))
    })
}

fn describe(der: Vec<u8>) -> Result<CaCert, ApiError> {
    let d = x509::describe(&der).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok(CaCert {
        subject: d.subject,
        thumbprint: x509::thumbprints(&der).0,
        not_before_ms: d.not_before * 1000,
        expiry_ms: d.not_after * 1000,
        der_b64: base64::engine::general_purpose::STANDARD.encode(&der),
    })
}

/// Operations other than create name the version they change, as IoT Hub insists.
fn required_if_match(headers: &HeaderMap) -> Result<Option<IfMatch>, ApiError> {
    match if_match(headers)? {
        None => Err(ApiError::BadRequest("this operation needs an If-Match header with the certificate's etag".into())),
        m => Ok(m),
    }
}

fn reply(r: Result<Reply, crate::model::TwinError>) -> Result<Response, ApiError> {
    match r?.into_certificate()? {
        Some(v) => Ok(ok_json(&v)),
        None => Ok(axum::http::StatusCode::OK.into_response()),
    }
}

pub async fn put(
    State(st): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::RegistryWrite)?;
    validate_id("certificate", &name)?;
    let req = body::json(raw, "CertificateDescription")?;
    let cert = describe(der_of(certificate_field(&req, "/properties/certificate")?)?)?;
    let verified = req.pointer("/properties/isVerified").and_then(Value::as_bool).unwrap_or(false);
    let op = CertOp::Put { name, cert, verified, if_match: if_match(&headers)? };
    reply(st.twins()?.propose_meta(Op::Certificate(op)).await?)
}

pub async fn get(State(st): State<Shared>, Path(name): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::RegistryRead)?;
    let v = st.twins()?.read_meta(|s| s.certificates.render(&name, false)).await?;
    v.map(|v| ok_json(&v)).ok_or(ApiError::Twin(crate::model::TwinError::CertificateNotFound(name)))
}

pub async fn list(State(st): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::RegistryRead)?;
    let all = st.twins()?.read_meta(|s| s.certificates.list()).await?;
    Ok(ok_json(&json!({ "value": all })))
}

pub async fn delete(
    State(st): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::RegistryWrite)?;
    let op = CertOp::Delete { name, if_match: required_if_match(&headers)? };
    reply(st.twins()?.propose_meta(Op::Certificate(op)).await?)
}

pub async fn generate_code(
    State(st): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::RegistryWrite)?;
    let code = hex_code();
    let op = CertOp::GenerateCode { name, code, if_match: required_if_match(&headers)? };
    match st.twins()?.propose_meta(Op::Certificate(op)).await?? {
        Reply::Certificate(Some(v)) => {
            let mut v = v;
            // The answer (and only it) carries the code the proof must name.
            let name = v["name"].as_str().unwrap_or_default().to_string();
            let code =
                st.twins()?.read_meta(|s| s.certificates.get(&name).and_then(|r| r.verification_code.clone())).await?;
            v["properties"]["verificationCode"] = json!(code);
            Ok(ok_json(&v))
        }
        other => reply(Ok(other)),
    }
}

/// A random code: 32 upper-case hex digits, fit for a certificate's CN.
fn hex_code() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

pub async fn verify(
    State(st): State<Shared>,
    Path(name): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::RegistryWrite)?;
    let if_match = required_if_match(&headers)?;
    let req = body::json(raw, "CertificateVerificationDescription")?;
    let proof = der_of(certificate_field(&req, "/certificate")?)?;
    let twins = st.twins()?;
    let ca = twins
        .read_meta(|s| {
            s.certificates
                .get(&name)
                .and_then(|r| base64::engine::general_purpose::STANDARD.decode(&r.cert.der_b64).ok())
        })
        .await?
        .ok_or_else(|| ApiError::Twin(crate::model::TwinError::CertificateNotFound(name.clone())))?;
    let code = x509::common_name(&proof)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?
        .ok_or_else(|| ApiError::BadRequest("the verification certificate has no subject CN".into()))?;
    x509::verify_chain(&[CertificateDer::from(proof)], &[CertificateDer::from(ca)], now_ms() / 1000).map_err(|e| {
        ApiError::BadRequest(format!("the verification certificate is not signed by certificate {name}: {e}"))
    })?;
    // Apply compares the code with the record's current one, so a code regenerated meanwhile wins.
    reply(twins.propose_meta(Op::Certificate(CertOp::Verify { name, code, if_match })).await?)
}
