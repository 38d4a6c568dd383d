//! Request bodies: their pace, their size limit, and JSON parsing with IoT Hub's error body instead of
//! axum's text.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Frame, SizeHint};
use serde_json::Value;
use tokio::time::{Instant, Sleep};

use super::{ApiError, BODY_LIMIT};

/// Longest wait for the next chunk of a request body.
pub const CHUNK_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a body may take before it must keep up [`MIN_RATE`]: room for a slow start.
pub const GRACE: Duration = Duration::from_secs(10);

/// Bytes a second a body must average after [`GRACE`] (32 kbit/s). With a chunk timeout alone, a
/// client could send a byte every few seconds and hold its request, and the buffer it fills, for days;
/// with this a 256 KiB body has at most 74 s and a 64 MiB restore page under five hours.
pub const MIN_RATE: u64 = 4096;

/// A request body that must keep a pace: a chunk within [`CHUNK_TIMEOUT`] of the last one (or of the
/// request), and by any moment at least [`MIN_RATE`] bytes a second since the request came, after a
/// [`GRACE`] — the rule Apache's `mod_reqtimeout` applies with its `MinRate`. The clock starts when the
/// request is read, so a handler that checks the caller before reading the body spends the grace.
pub struct Paced<B> {
    body: B,
    start: Instant,
    /// When the last chunk came (the request, before the first).
    last: Instant,
    received: u64,
    /// Set the first time the body has nothing ready: a body that arrives with its request never needs it.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl<B> Paced<B> {
    pub fn new(body: B) -> Paced<B> {
        let now = Instant::now();
        Paced { body, start: now, last: now, received: 0, sleep: None }
    }

    /// The latest moment the next chunk may come: the chunk timeout, or the pace, whichever is sooner.
    fn deadline(&self) -> Instant {
        let paced = GRACE.saturating_add(Duration::from_millis(self.received.saturating_mul(1000) / MIN_RATE));
        (self.last + CHUNK_TIMEOUT).min(self.start + paced)
    }
}

/// Why a [`Paced`] body ended early.
#[derive(Debug, thiserror::Error)]
pub enum TooSlow {
    #[error("no part of the request body came for {} s", CHUNK_TIMEOUT.as_secs())]
    Stalled,
    #[error(
        "the request body came too slowly: {received} bytes in {secs} s (at least {MIN_RATE} bytes a second \
         are needed after the first {} s)",
        GRACE.as_secs()
    )]
    BelowRate { received: u64, secs: u64 },
}

impl<B> hyper::body::Body for Paced<B>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            if let Some(Ok(f)) = &frame {
                if let Some(data) = f.data_ref() {
                    this.received = this.received.saturating_add(data.len() as u64);
                    this.last = Instant::now();
                }
            }
            return Poll::Ready(frame.map(|r| r.map_err(Into::into)));
        }
        let deadline = this.deadline();
        let sleep = this.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() != deadline {
            sleep.as_mut().reset(deadline);
        }
        ready!(sleep.as_mut().poll(cx));
        let err = if deadline == this.last + CHUNK_TIMEOUT {
            TooSlow::Stalled
        } else {
            TooSlow::BelowRate { received: this.received, secs: this.start.elapsed().as_secs() }
        };
        Poll::Ready(Some(Err(err.into())))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The router's bodies, paced (a layer's mapping).
pub fn paced(req: axum::extract::Request) -> axum::extract::Request {
    req.map(|body| Body::new(Paced::new(body)))
}

/// The whole of `body`, at most `limit` bytes.
pub async fn collect<B>(body: B, limit: usize) -> Result<Bytes, Unread>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(Unread::TooLarge(limit)),
        Err(e) => Err(Unread::Failed(e.to_string())),
    }
}

/// Parses a JSON body. An empty body is an error naming what was expected.
pub fn json(body: Result<Bytes, impl Into<Unread>>, what: &str) -> Result<Value, ApiError> {
    parse(&bytes(body, what)?)
}

/// Refuses a body that is not JSON as untrusted JSON is read (see `json_tree::parse_untrusted`), for
/// routes that read it into their own types, parts of which become `Value`s.
pub fn check_untrusted(bytes: &[u8]) -> Result<(), ApiError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| ApiError::BadRequest(format!("malformed JSON body: not UTF-8 ({e})")))?;
    crate::model::json_tree::parse(text)
        .map(drop)
        .map_err(|e| ApiError::BadRequest(format!("malformed JSON body: {e}")))
}

fn parse(bytes: &[u8]) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| ApiError::BadRequest(format!("malformed JSON body: not UTF-8 ({e})")))?;
    crate::model::json_tree::parse_untrusted(text)
        .map_err(|e| ApiError::BadRequest(format!("malformed JSON body: {e}")))
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
    /// More than this many bytes.
    TooLarge(usize),
    /// The connection failed or the body did not keep its pace ([`Paced`]).
    Failed(String),
}

impl From<BytesRejection> for Unread {
    fn from(r: BytesRejection) -> Unread {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Unread::TooLarge(BODY_LIMIT)
        } else {
            Unread::Failed(r.to_string())
        }
    }
}

/// The bytes of a body of up to `limit` bytes that should hold a `what` JSON document, read only when
/// the handler asks: a route whose bodies may be large (a restore's pages) checks the caller's
/// permission first, so that no one without it can make the node hold such a body.
pub async fn read_after_checks(body: Body, limit: usize, what: &str) -> Result<Bytes, ApiError> {
    bytes(collect(body, limit).await, what)
}

/// The bytes of a body that should hold a `what` JSON document: an error if it could not be read, was
/// too large or is empty.
pub fn bytes(body: Result<Bytes, impl Into<Unread>>, what: &str) -> Result<Bytes, ApiError> {
    let bytes = body.map_err(|r| match r.into() {
        Unread::TooLarge(limit) => ApiError::TooLarge(limit),
        Unread::Failed(why) => ApiError::BadRequest(format!("could not read the request body: {why}")),
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest(format!("the request body is empty; expected a {what} JSON object")));
    }
    Ok(bytes)
}
