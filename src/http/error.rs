//! The one place where errors become IoT Hub protocol errors: status code, `ErrorCode`, and the body
//! `{"Message":"ErrorCode:<Code>;<text>","ExceptionMessage":"Tracking ID:<id>-TimeStamp:<ts>"}` that the
//! SDKs parse (Node maps status and code to its error classes).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::auth::AuthError;
use crate::error_code::ErrorCode;
use crate::model::TwinError;
use crate::model::UnexpectedReply;
use crate::mqtt::methods::MethodError;
use crate::shard::ShardError;

use super::json_response;

/// Anything a handler can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(transparent)]
    Twin(#[from] TwinError),
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// The body is not JSON or not the expected shape.
    #[error("{0}")]
    BadRequest(String),
    #[error("request body is larger than the limit of {0} bytes")]
    TooLarge(usize),
    #[error("no route for {0}")]
    NoRoute(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("job {0} not found")]
    JobNotFound(String),
    #[error(transparent)]
    Method(#[from] crate::mqtt::methods::MethodError),
    /// The node holds as many connections of this kind (or from this source) as it may.
    #[error("connection limit reached: {0}")]
    ConnectionLimit(&'static str),
    #[error("internal error: {0}")]
    Internal(String),
    /// A command answered a kind of reply it never produces: a bug between layers.
    #[error("internal error: {0}")]
    UnexpectedReply(#[from] UnexpectedReply),
}

impl ApiError {
    /// IoT Hub's error code for this failure (the table both front doors share).
    pub fn code(&self) -> ErrorCode {
        match self {
            // IoT Hub answers 401 for a valid token whose policy lacks the permission too; SDKs read
            // 403 as something else entirely (Node: TooManyDevices).
            ApiError::Auth(_) => ErrorCode::IotHubUnauthorizedAccess,
            ApiError::Twin(e) => ErrorCode::of_twin(e),
            ApiError::Shard(e) => ErrorCode::of_shard(e),
            ApiError::BadRequest(_) => ErrorCode::ArgumentInvalid,
            ApiError::TooLarge(_) => ErrorCode::RequestEntityTooLarge,
            ApiError::NoRoute(_) => ErrorCode::NotFound,
            ApiError::MethodNotAllowed => ErrorCode::MethodNotAllowed,
            ApiError::JobNotFound(_) => ErrorCode::JobNotFound,
            ApiError::Method(e) => match e {
                MethodError::NotOnline => ErrorCode::DeviceNotOnline,
                MethodError::Timeout => ErrorCode::GatewayTimeout,
                MethodError::Busy => ErrorCode::ThrottlingException,
            },
            ApiError::ConnectionLimit(_) => ErrorCode::ServerBusy,
            ApiError::Internal(_) | ApiError::UnexpectedReply(_) => ErrorCode::ServerError,
        }
    }

    /// Status and IoT Hub `ErrorCode` name.
    pub fn classify(&self) -> (StatusCode, &'static str) {
        let code = self.code();
        (StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), code.name())
    }
}

fn tracking_stamp() -> String {
    let fmt = time::macros::format_description!("[month]/[day]/[year] [hour]:[minute]:[second]");
    time::OffsetDateTime::now_utc().format(&fmt).unwrap_or_default()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.classify();
        if status.is_server_error() {
            tracing::warn!(%status, "{self}");
        } else {
            tracing::debug!(%status, "{self}");
        }
        let tracking = uuid::Uuid::new_v4().simple().to_string();
        let body = json!({
            "Message": format!("ErrorCode:{code};{self}"),
            "ExceptionMessage": format!("Tracking ID:{tracking}-G:0-TimeStamp:{}", tracking_stamp()),
        });
        let mut resp = json_response(status, &body);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        if matches!(self, ApiError::TooLarge(_)) {
            // The rest of the body was never read, so this connection cannot carry another request:
            // said in the answer, a client does not send its next one on it (and lose it when the
            // connection closes under it). See http::serve, "How a connection ends".
            resp.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body_of(e: ApiError) -> (StatusCode, serde_json::Value, Option<String>) {
        let r = e.into_response();
        let status = r.status();
        let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
        let bytes = r.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap(), ct)
    }

    #[tokio::test]
    async fn iot_hub_error_body() {
        let (s, b, ct) = body_of(TwinError::DeviceNotFound("abc".into()).into()).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        assert_eq!(b["Message"], "ErrorCode:DeviceNotFound;Device abc not found");
        assert!(b["ExceptionMessage"].as_str().unwrap().starts_with("Tracking ID:"));
        assert!(b["ExceptionMessage"].as_str().unwrap().contains("-TimeStamp:"));
        assert_eq!(ct.as_deref(), Some("application/json; charset=utf-8"));
    }

    #[test]
    fn status_mapping() {
        let cases: Vec<(ApiError, u16, &str)> = vec![
            (AuthError::BadSignature.into(), 401, "IotHubUnauthorizedAccess"),
            (
                AuthError::MissingPermission { policy: "p".into(), needed: crate::auth::Permission::RegistryWrite }
                    .into(),
                401,
                "IotHubUnauthorizedAccess",
            ),
            (TwinError::ModuleNotFound { device: "d".into(), module: "m".into() }.into(), 404, "ModuleNotFound"),
            (TwinError::DeviceAlreadyExists("d".into()).into(), 409, "DeviceAlreadyExists"),
            (
                TwinError::ModuleAlreadyExists { device: "d".into(), module: "m".into() }.into(),
                409,
                "ModuleAlreadyExistsOnDevice",
            ),
            (TwinError::PreconditionFailed("x".into()).into(), 412, "PreconditionFailed"),
            (TwinError::InvalidArgument("x".into()).into(), 400, "ArgumentInvalid"),
            (ApiError::TooLarge(1), 413, "RequestEntityTooLarge"),
            (ShardError::NotLeader { shard: 1, leader: None }.into(), 503, "ServerBusy"),
            (ShardError::Timeout { shard: 1 }.into(), 503, "ServerBusy"),
            (ShardError::ShuttingDown { shard: 1 }.into(), 503, "ServerBusy"),
            (ShardError::Storage { shard: 1, msg: "x".into() }.into(), 503, "ServerBusy"),
            (ShardError::Fatal { shard: 1, msg: "x".into() }.into(), 500, "ServerError"),
        ];
        for (e, status, code) in cases {
            let (s, c) = e.classify();
            assert_eq!((s.as_u16(), c), (status, code), "{e}");
        }
    }

    #[test]
    fn only_a_refused_body_closes_the_connection() {
        let close = |e: ApiError| e.into_response().headers().get("connection").map(|v| v.as_bytes().to_vec());
        assert_eq!(close(ApiError::TooLarge(1)), Some(b"close".to_vec()));
        assert_eq!(close(TwinError::InvalidArgument("x".into()).into()), None);
    }
}
