//! Path parameters, refused the IoT Hub way: axum's own `Path` answers a segment that is not UTF-8 once
//! percent-decoded, or not a number where one is expected, with a plain-text 400 of its own; this one
//! answers it as every other bad request is answered (an [`ApiError`], so IoT Hub's error body), naming
//! what was wrong.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::ApiError;

/// The route's parameters, deserialized as [`axum::extract::Path`] does.
pub struct Path<T>(pub T);

impl<S, T> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(Path(v)),
            Err(e) => Err(ApiError::BadRequest(format!("the request path: {}", e.body_text()))),
        }
    }
}
