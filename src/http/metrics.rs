//! Prometheus metrics: request counts and latencies per route.
//!
//! Every label value comes from a closed set, so no client can grow the metrics page: the route is
//! the matched path pattern (`unmatched` otherwise, so device ids never become labels), the method
//! one of the standard ones or `other`, the status a number our handlers produce.

use std::sync::OnceLock;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process-wide recorder, installed on first use. `None` if another recorder was installed first.
pub fn metrics_handle() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let buckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
            let builder = PrometheusBuilder::new().set_buckets(&buckets).unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok().map(|_| handle)
        })
        .as_ref()
}

pub fn render_metrics() -> String {
    metrics_handle().map(|h| h.render()).unwrap_or_default()
}

pub async fn metrics_route() -> Response {
    if let Some(h) = metrics_handle() {
        h.run_upkeep();
    }
    let mut resp = render_metrics().into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4"));
    resp
}

/// The method as a label: the standard methods by name, anything else (extension methods are any
/// token a client cares to send) as `other`.
fn method_label(m: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

pub async fn track(req: Request, next: Next) -> Response {
    metrics_handle();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let method = method_label(req.method());
    let start = Instant::now();
    let resp = next.run(req).await;
    let status = resp.status().as_u16().to_string();
    let labels = [("method", method.to_string()), ("route", route), ("status", status)];
    metrics::counter!("twinhub_http_requests_total", &labels).increment(1);
    metrics::histogram!("twinhub_http_request_duration_seconds", &labels[..2]).record(start.elapsed().as_secs_f64());
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_a_closed_set() {
        let odd = axum::http::Method::from_bytes(b"XYZZY").unwrap();
        assert_eq!(method_label(&odd), "other");
        assert_eq!(method_label(&axum::http::Method::PATCH), "PATCH");
    }
}
