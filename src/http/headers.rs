//! The request's headers for a handler, moved out of the request instead of copied.

use std::convert::Infallible;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;

/// The request's headers, taken out of it: axum's own `HeaderMap` extractor clones the map (its
/// entries and index, two allocations, then freed again when the handler ends), which the twin
/// routes paid on every request. Only for handlers whose later extractors do not read headers: the
/// path, the state and the body (`Bytes`) do not.
pub struct Headers(pub HeaderMap);

impl<S: Send + Sync> FromRequestParts<S> for Headers {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Headers(std::mem::take(&mut parts.headers)))
    }
}
