//! Router tests for everything decided before the twin layer: auth, body parsing, limits, routing.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

use super::*;
use crate::auth::{sign, Policies};

const HOST: &str = "localhost:8443";

fn app() -> (Router, Arc<Policies>) {
    let policies = Arc::new(Policies::generate());
    let state = Arc::new(AppState {
        twins: None,
        hub: None,
        policies: policies.clone(),
        host: HOST.into(),
        mqtt_ws: None,
        methods: None,
    });
    (router(state), policies)
}

fn token(policies: &Policies, name: &str) -> String {
    let key = &policies.get(name).unwrap().primary_key;
    let se = crate::model::now_ms() / 1000 + 3600;
    let sr = "localhost%3A8443";
    let sig = B64.encode(sign(key, sr, se).unwrap());
    let sig = percent_encoding::utf8_percent_encode(&sig, percent_encoding::NON_ALPHANUMERIC);
    format!("SharedAccessSignature sr={sr}&sig={sig}&se={se}&skn={name}")
}

async fn call(
    app: Router,
    method: &str,
    uri: &str,
    auth: Option<String>,
    body: impl Into<Body>,
) -> (StatusCode, Value, String) {
    let mut req = Request::builder().method(method).uri(uri).header("content-type", "application/json; charset=utf-8");
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    let resp = app.oneshot(req.body(body.into()).unwrap()).await.unwrap();
    let status = resp.status();
    let ct = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null), ct)
}

fn code(body: &Value) -> String {
    body["Message"].as_str().unwrap_or("").split(';').next().unwrap_or("").to_string()
}

#[tokio::test]
async fn missing_and_bad_auth_is_401() {
    let (app, policies) = app();
    let (s, b, ct) = call(app.clone(), "GET", "/twins/d1?api-version=2021-04-12", None, "").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(code(&b), "ErrorCode:IotHubUnauthorizedAccess");
    assert_eq!(ct, "application/json; charset=utf-8");
    let forged = token(&policies, "service").replace("skn=service", "skn=iothubowner");
    let (s, b, _) = call(app.clone(), "GET", "/devices/d1", Some(forged), "").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(b["Message"].as_str().unwrap().contains("signature"), "{b}");
    let (s, b, _) = call(app, "GET", "/devices/d1", Some("SharedAccessSignature sr=x".into()), "").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(b["Message"].as_str().unwrap().contains("missing 'sig'"), "{b}");
}

#[tokio::test]
async fn missing_permission_is_401() {
    let (app, policies) = app();
    let (s, b, _) = call(app.clone(), "PUT", "/devices/d1", Some(token(&policies, "registryRead")), "{}").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(b["Message"].as_str().unwrap().contains("RegistryWrite"), "{b}");
    let (s, _, _) = call(app.clone(), "PATCH", "/twins/d1", Some(token(&policies, "registryReadWrite")), "{}").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _, _) = call(app, "GET", "/statistics/devices", Some(token(&policies, "service")), "").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn malformed_json_is_400_with_iot_hub_body() {
    let (app, policies) = app();
    for (method, uri) in [
        ("PATCH", "/twins/d1"),
        ("PUT", "/twins/d1/modules/m1"),
        ("PUT", "/devices/d1"),
        ("PUT", "/devices/d1/modules/m1"),
    ] {
        let (s, b, ct) = call(app.clone(), method, uri, Some(token(&policies, "iothubowner")), "{\"tags\": ").await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{method} {uri}");
        assert_eq!(code(&b), "ErrorCode:ArgumentInvalid");
        assert!(b["Message"].as_str().unwrap().contains("malformed JSON"), "{b}");
        assert_eq!(ct, "application/json; charset=utf-8");
    }
    let (s, b, _) = call(app, "PATCH", "/twins/d1", Some(token(&policies, "service")), "").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(b["Message"].as_str().unwrap().contains("empty"), "{b}");
}

#[tokio::test]
async fn invalid_twin_and_ids_rejected_before_proposing() {
    let (app, policies) = app();
    let (s, b, _) =
        call(app.clone(), "PATCH", "/twins/d1", Some(token(&policies, "service")), r#"{"tags":{"a.b":1}}"#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(code(&b), "ErrorCode:ArgumentInvalid");
    let (s, b, _) = call(app.clone(), "PUT", "/devices/bad%20id", Some(token(&policies, "iothubowner")), "{}").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(b["Message"].as_str().unwrap().contains("device id"), "{b}");
    let (s, _, _) =
        call(app, "PUT", "/devices/d1", Some(token(&policies, "iothubowner")), r#"{"status":"maybe"}"#).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn oversized_body_is_413() {
    let (app, policies) = app();
    let big = format!("{{\"tags\":{{\"a\":\"{}\"}}}}", "x".repeat(BODY_LIMIT + 1));
    let (s, b, _) = call(app, "PATCH", "/twins/d1", Some(token(&policies, "service")), big).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(code(&b), "ErrorCode:RequestEntityTooLarge");
}

#[tokio::test]
async fn unknown_route_and_method() {
    let (app, policies) = app();
    let (s, b, _) = call(app.clone(), "GET", "/nope", None, "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(code(&b), "ErrorCode:NotFound");
    let (s, _, _) = call(app.clone(), "POST", "/twins/d1", Some(token(&policies, "service")), "").await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    // Without a credential nothing about the route is told.
    let (s, _, _) = call(app, "POST", "/twins/d1", None, "").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn no_body_is_read_before_the_credential() {
    let (app, _) = app();
    // A body that never ends: answered 401 without waiting for it.
    let (_tx, rx) = tokio::sync::mpsc::channel::<Result<axum::body::Bytes, std::io::Error>>(1);
    let body = Body::from_stream(tokio_stream_of(rx));
    let req = Request::builder().method("PATCH").uri("/twins/d1").body(body).unwrap();
    let resp = tokio::time::timeout(std::time::Duration::from_secs(5), app.oneshot(req))
        .await
        .expect("answered without the body")
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(resp.headers().get("connection").map(|v| v.to_str().unwrap()), Some("close"));
}

/// A stream over an mpsc receiver (no extra dependency for one test).
fn tokio_stream_of<T: Send + 'static>(mut rx: tokio::sync::mpsc::Receiver<T>) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[tokio::test]
async fn health_and_metrics_need_no_auth() {
    let (app, _) = app();
    let (s, b, _) = call(app.clone(), "GET", "/health", None, "").await;
    assert_eq!((s, b["status"].as_str()), (StatusCode::OK, Some("ok")));
    let _ = call(app.clone(), "GET", "/twins/d1", None, "").await;
    let resp = app.oneshot(Request::get("/metrics").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let text = String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(text.contains("twinhub_http_requests_total"), "{text}");
    assert!(text.contains("route=\"/twins/{id}\""), "{text}");
}

#[tokio::test]
async fn bad_top_is_400() {
    let (app, policies) = app();
    let (s, b, _) = call(app, "GET", "/devices?top=many", Some(token(&policies, "registryRead")), "").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(b["Message"].as_str().unwrap().contains("top"), "{b}");
}
