//! The HTTPS service API: identity registry and twins in IoT Hub's REST shapes (docs/iothub-protocol.md §3.1–3.2).
//!
//! Handlers authenticate, parse and validate the body *before* proposing (bad input costs no log
//! entry), build a [`crate::model::Command`] and hand it to [`crate::twin::Twins`]. Every failure is an
//! [`ApiError`], rendered in one place (`error.rs`).

mod backup;
mod body;
mod bulk;
mod certificates;
mod changes;
mod configurations;
pub mod console;
mod direct;
pub mod error;
mod headers;
mod jobs;
mod methods;
mod metrics;
mod path;
mod query;
mod registry;
mod serve;
mod twins;
pub mod websocket;

use std::sync::Arc;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::auth::{Permission, Policies};
use crate::model::JsonText;
use crate::twin::Twins;

pub use direct::App;
pub use error::ApiError;
pub use metrics::{metrics_handle, render_metrics};
pub use serve::serve;

/// Largest accepted request body. Twin sections are at most 32 KB; this leaves room for escaping and
/// metadata that clients echo back, and refuses anything absurd before it is buffered.
pub const BODY_LIMIT: usize = 256 * 1024;

/// What every handler needs.
pub struct AppState {
    /// `None` only in tests of routes that fail before reaching the twin layer.
    pub twins: Option<Arc<Twins>>,
    /// The notification hub (change feed, connected-device count); `None` in route tests.
    pub hub: Option<Arc<crate::notify::Hub>>,
    pub policies: Arc<Policies>,
    /// The hub host name as clients dial it (`name:port`), for SAS resource checks.
    pub host: String,
    /// The device MQTT endpoint, for MQTT over WebSockets; `None` in route tests.
    pub mqtt_ws: Option<websocket::MqttOverWebSocket>,
    /// Direct method routing; `None` in route tests.
    pub methods: Option<Arc<crate::mqtt::methods::Methods>>,
}

impl AppState {
    fn twins(&self) -> Result<&Arc<Twins>, ApiError> {
        self.twins.as_ref().ok_or_else(|| ApiError::Internal("twin layer not running".into()))
    }

    /// Verifies the `Authorization` header for `resource` (e.g. `devices/d1`) with `needed`.
    fn authorize(&self, headers: &HeaderMap, resource: &str, needed: Permission) -> Result<(), ApiError> {
        let header = headers.get(header::AUTHORIZATION).map(|v| v.to_str().unwrap_or(""));
        let now = crate::model::now_ms() / 1000;
        self.policies.authorize(header, &self.host, resource, needed, now)?;
        Ok(())
    }
}

pub type Shared = Arc<AppState>;

/// `Content-Type: application/json; charset=utf-8` on every JSON response (Node parses bodies only then).
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut resp = (status, bytes).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"));
    resp
}

pub fn ok_json(body: &serde_json::Value) -> Response {
    json_response(StatusCode::OK, body)
}

/// A 200 with a document already rendered as JSON text.
pub fn ok_json_text(body: JsonText) -> Response {
    // The body is the shared text itself (a reference count), not a copy of it.
    let mut resp = (StatusCode::OK, axum::body::Bytes::from_owner(body)).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"));
    resp
}

/// `GET /ready`: 200 once every shard of this node has a leader (the node has joined and can serve),
/// 503 before. No authentication, like `/health`: probes and launchers poll it.
async fn ready(axum::extract::State(state): axum::extract::State<Shared>) -> Response {
    match &state.twins {
        Some(t) if t.ready() => json_response(StatusCode::OK, &serde_json::json!({"status": "ready"})),
        _ => json_response(StatusCode::SERVICE_UNAVAILABLE, &serde_json::json!({"status": "starting"})),
    }
}

/// `GET /cluster/status`: this node's view of every shard (leader, term, indexes, voters, and on the
/// leader each replica's lag). Needs a policy with RegistryRead; `twinhub cluster status` merges the
/// answers of all nodes.
async fn cluster_status(
    axum::extract::State(state): axum::extract::State<Shared>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    state.authorize(&headers, "cluster/status", Permission::RegistryRead)?;
    let twins = state.twins()?;
    let body = serde_json::json!({
        "node_id": twins.node_id(),
        "ready": twins.ready(),
        "shards": twins.shard_status(),
        "meta": twins.meta_status(),
        "map": twins.cluster_map(),
    });
    Ok(ok_json(&body))
}

#[derive(serde::Deserialize)]
struct NewMember {
    id: u64,
    addr: String,
}

/// `POST /cluster/members` `{"id", "addr"}`: adds a started node to the cluster map. Replicas and
/// leaderships then rebalance onto it in the background (each shard's leader adds it as a learner,
/// promotes it once caught up, then drops the replica it replaces); `/cluster/status` shows progress.
/// Needs ClusterAdmin (the owner policy): a member receives shard data, so adding one is not a
/// registry operation.
async fn add_member(
    axum::extract::State(state): axum::extract::State<Shared>,
    headers: HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    state.authorize(&headers, "cluster/members", Permission::ClusterAdmin)?;
    let body = body::bytes(body, "member")?;
    let m: NewMember = serde_json::from_slice(&body).map_err(|e| {
        ApiError::BadRequest(format!("body must be {{\"id\": <node id>, \"addr\": \"host:port\"}}: {e}"))
    })?;
    if m.id == 0 || !m.addr.contains(':') {
        return Err(ApiError::BadRequest(format!("invalid member {} at '{}'", m.id, m.addr)));
    }
    let twins = state.twins()?;
    twins.propose_cluster(crate::cluster::map::ClusterOp::AddNode { id: m.id, addr: m.addr.clone() }).await?;
    let map = twins.cluster_map();
    Ok(ok_json(&serde_json::json!({"node": m.id, "shards": map.shards_of(m.id)})))
}

/// `DELETE /cluster/members/{node}`: drains a node: the map moves its replicas to the other nodes;
/// once no shard holds it any more, its id is retired (`/cluster/status` shows when).
async fn remove_member(
    axum::extract::State(state): axum::extract::State<Shared>,
    path::Path(node): path::Path<u64>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    state.authorize(&headers, "cluster/members", Permission::ClusterAdmin)?;
    let twins = state.twins()?;
    twins.propose_cluster(crate::cluster::map::ClusterOp::RemoveNode { id: node }).await?;
    Ok(ok_json(&serde_json::json!({"node": node, "draining": true})))
}

/// Paths served without a credential: load-balancer probes and the Prometheus scrape. None of them
/// reads a body or takes a label from the request.
const OPEN_PATHS: [&str; 4] = ["/health", "/ready", "/metrics", WEBSOCKET_PATH];

/// MQTT over WebSockets: open, because the device authenticates in its MQTT CONNECT.
pub const WEBSOCKET_PATH: &str = "/$iothub/websocket";

/// Runs before every routed handler, so before any body is read: a request without a valid policy
/// token of this hub is answered 401 at once (with `Connection: close`), and its body is never
/// buffered. The first request with a valid token marks its connection authenticated (see
/// `serve.rs`). The handler still checks resource and permission.
async fn auth_first(
    axum::extract::State(state): axum::extract::State<Shared>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let conn = req.extensions().get::<Arc<serve::ConnState>>().cloned();
    let _in_flight = conn.as_ref().map(|c| c.request());
    if OPEN_PATHS.contains(&req.uri().path()) || console::is_console_path(req.uri().path()) {
        return next.run(req).await;
    }
    match admit(&state, conn.as_deref(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => refused(e),
    }
}

/// The credential check of [`auth_first`], shared with the twin routes served without the router:
/// `Ok` marks the connection authenticated; an error is answered with [`refused`], before any body is read.
fn admit(state: &AppState, conn: Option<&serve::ConnState>, headers: &HeaderMap) -> Result<(), ApiError> {
    let header = headers.get(header::AUTHORIZATION).map(|v| v.to_str().unwrap_or(""));
    let now = crate::model::now_ms() / 1000;
    state.policies.verify_credential(header, &state.host, now)?;
    if let Some(c) = conn {
        c.authenticated();
    }
    Ok(())
}

/// The answer to a request [`admit`] refused: its error, and the connection closed after it.
fn refused(e: ApiError) -> Response {
    let mut resp = e.into_response();
    resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/devices", get(registry::list_devices).post(bulk::bulk))
        // The Node SDK's Registry.list asks for `/devices/`.
        .route("/devices/", get(registry::list_devices))
        .route("/devices/query", axum::routing::post(query::query_devices))
        .route("/certificates", get(certificates::list))
        .route("/certificates/{name}", get(certificates::get).put(certificates::put).delete(certificates::delete))
        .route("/certificates/{name}/generateVerificationCode", axum::routing::post(certificates::generate_code))
        .route("/certificates/{name}/verify", axum::routing::post(certificates::verify))
        .route("/jobs/v2/query", get(jobs::query))
        .route("/jobs/v2/{id}", get(jobs::get).put(jobs::create))
        .route("/jobs/v2/{id}/cancel", axum::routing::post(jobs::cancel))
        .route("/devices/{id}", get(registry::get_device).put(registry::put_device).delete(registry::delete_device))
        .route("/devices/{id}/modules", get(registry::list_modules))
        .route(
            "/devices/{id}/modules/{mid}",
            get(registry::get_module).put(registry::put_module).delete(registry::delete_module),
        )
        .route("/twins/{id}", get(twins::get_twin).patch(twins::update_twin).put(twins::replace_twin))
        .route(
            "/twins/{id}/modules/{mid}",
            get(twins::get_module_twin).patch(twins::update_module_twin).put(twins::replace_module_twin),
        )
        .route("/statistics/devices", get(registry::device_stats))
        .route("/statistics/service", get(registry::service_stats))
        .route("/twin-changes", get(changes::twin_changes))
        .route("/health", get(|| async { json_response(StatusCode::OK, &serde_json::json!({"status": "ok"})) }))
        .route("/ready", get(ready))
        .route("/cluster/status", get(cluster_status))
        .route("/cluster/members", axum::routing::post(add_member))
        .route("/cluster/members/{node}", axum::routing::delete(remove_member))
        .route("/metrics", get(metrics::metrics_route))
        .route("/cluster/backup", get(backup::info))
        .route("/cluster/backup/meta", get(backup::meta))
        .route("/cluster/backup/shards/{shard}", get(backup::shard_page))
        .route("/cluster/restore/meta", axum::routing::post(backup::restore_meta))
        .route("/cluster/restore/shards/{shard}", axum::routing::post(backup::restore_shard))
        .route("/configurations", get(configurations::list))
        .route("/configurations/testQueries", axum::routing::post(configurations::test_queries))
        .route("/configurations/{id}", get(configurations::get).put(configurations::put).delete(configurations::delete))
        .route("/twins/{id}/methods", axum::routing::post(methods::invoke_device))
        .route("/twins/{id}/modules/{mid}/methods", axum::routing::post(methods::invoke_module))
        .route(WEBSOCKET_PATH, get(websocket::upgrade))
        .route(console::CONSOLE_PATH, get(console::serve))
        .route("/console/{*asset}", get(console::serve))
        .fallback(|uri: axum::http::Uri| async move { ApiError::NoRoute(uri.path().to_string()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth_first))
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .layer(tower::util::MapRequestLayer::new(body::paced))
        .layer(axum::middleware::from_fn(metrics::track))
        .with_state(state)
}

#[cfg(test)]
mod tests;
