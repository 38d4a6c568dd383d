//! `POST /devices/query` (docs/iothub-protocol.md §3.3): the IoT Hub query language over every shard.
//!
//! The query is parsed here first (a syntax error is a 400 naming the position, before any shard is
//! asked), then the twin layer's scatter/gather ([`crate::twin::Twins::query_page`]) sends it to every
//! shard at once; each answers its part (rows after the continuation cursor, at most a page plus one,
//! or aggregate accumulators) and this node merges them: rows by key into one page with a continuation
//! token, aggregates into their groups. A page never holds more than
//! `x-ms-max-item-count` rows (default 100, at most 1000), so large results stream page by page.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use serde_json::Value;

use super::{body, ok_json, ApiError, Shared};
use crate::auth::Permission;
use crate::query;

/// Rows per page when the client does not say.
const DEFAULT_PAGE: usize = 100;
/// The most rows a page may hold (IoT Hub documents ≤ 1000).
const MAX_PAGE: usize = 1000;

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

pub async fn query_devices(
    State(st): State<Shared>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    // The resource is the `devices` collection: a token scoped to a device named "query" does not cover it.
    st.authorize(&headers, "devices", Permission::RegistryRead)?;
    let doc = body::json(raw, "QuerySpecification")?;
    let text = match doc.get("query") {
        Some(Value::String(q)) => q.clone(),
        _ => return Err(ApiError::BadRequest("the body must be {\"query\": \"SELECT ...\"}".into())),
    };
    let q = query::parse(&text).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let max_items = match header(&headers, "x-ms-max-item-count") {
        None => DEFAULT_PAGE,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| ApiError::BadRequest(format!("x-ms-max-item-count must be a positive integer, got '{v}'")))?
            .min(MAX_PAGE),
    };
    let token = header(&headers, "x-ms-continuation");
    let page = st.twins()?.query_page(&q, &text, token, max_items).await?;
    let (items, next) = (page.items, page.next.map(|c| c.encode()));
    let mut resp = ok_json(&Value::Array(items));
    let h = resp.headers_mut();
    h.insert("x-ms-item-type", HeaderValue::from_static(q.item_type()));
    if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        h.insert("x-ms-continuation", next);
    }
    Ok(resp)
}
