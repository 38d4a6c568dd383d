//! Request bodies: size limit and JSON parsing with IoT Hub's error body instead of axum's text.

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::Value;

use super::{ApiError, BODY_LIMIT};

/// Parses a JSON body. An empty body is an error naming what was expected.
pub fn json(body: Result<Bytes, impl Into<Unread>>, what: &str) -> Result<Value, ApiError> {
    parse(&bytes(body, what)?)
}

fn parse(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::BadRequest(format!("malformed JSON body: {e}")))
}

/// The text of a body that should hold a `what` JSON document, unparsed: a twin write checks it
/// straight from the text and hands it on to Raft as it came (the replicas parse it themselves, so any
/// JSON spelling of the same document applies alike).
pub fn text(body: Result<Bytes, impl Into<Unread>>, what: &str) -> Result<String, ApiError> {
    let bytes = bytes(body, what)?;
    String::from_utf8(Vec::from(bytes))
        .map_err(|e| ApiError::BadRequest(format!("malformed JSON body: not UTF-8 ({e})")))
}

/// Why a request body could not be read: the router's extractor and the twin routes served without it
/// ([`super::direct`]) both say it this way, so both answer alike.
pub enum Unread {
    /// More than [`BODY_LIMIT`] bytes.
    TooLarge,
    /// The connection failed or a chunk did not come in time.
    Failed(String),
}

impl From<BytesRejection> for Unread {
    fn from(r: BytesRejection) -> Unread {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Unread::TooLarge
        } else {
            Unread::Failed(r.to_string())
        }
    }
}

/// The bytes of a body of up to `limit` bytes that should hold a `what` JSON document, read only when
/// the handler asks: a route whose bodies may be large (a restore's pages) checks the caller's
/// permission first, so that no one without it can make the node hold such a body.
pub async fn read_after_checks(body: Body, limit: usize, what: &str) -> Result<Bytes, ApiError> {
    let read = match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => return Err(ApiError::TooLarge(limit)),
        Err(e) => Err(Unread::Failed(e.to_string())),
    };
    bytes(read, what)
}

/// The bytes of a body that should hold a `what` JSON document: an error if it could not be read, was
/// too large or is empty.
pub fn bytes(body: Result<Bytes, impl Into<Unread>>, what: &str) -> Result<Bytes, ApiError> {
    let bytes = body.map_err(|r| match r.into() {
        Unread::TooLarge => ApiError::TooLarge(BODY_LIMIT),
        Unread::Failed(why) => ApiError::BadRequest(format!("could not read the request body: {why}")),
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest(format!("the request body is empty; expected a {what} JSON object")));
    }
    Ok(bytes)
}
