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
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process-wide recorder, installed on first use. `None` if another recorder was installed first.
pub fn metrics_handle() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let buckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
            // Requests per group-commit batch: a count, not seconds.
            let batch = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];
            let builder = PrometheusBuilder::new()
                .set_buckets(&buckets)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full("twinhub_storage_batch_requests".into()), &batch))
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            let installed = metrics::set_global_recorder(recorder).ok().map(|_| handle);
            register_defaults();
            installed
        })
        .as_ref()
}

/// Series the dashboards and alert rules read that would otherwise appear only once something happens
/// (a coalesced push, the first change event), at zero, with their help text: a panel or rule over a
/// missing series shows "no data", which reads like a broken scrape.
fn register_defaults() {
    let counters = [
        ("twinhub_notify_pushes_delivered_total", "Desired pushes handed to device connections."),
        ("twinhub_notify_pushes_merged_total", "Desired pushes merged into a pending one for a busy device (coalescing)."),
        ("twinhub_notify_pushes_stale_total", "Desired pushes dropped because the device already had a newer version."),
        ("twinhub_notify_feed_events_total", "Twin change events published to the change feed."),
        ("twinhub_notify_feed_delivered_total", "Change events delivered to feed consumers."),
        ("twinhub_notify_feed_merged_total", "Change events merged into a pending one for a slow consumer."),
    ];
    for (name, help) in counters {
        metrics::describe_counter!(name, help);
        metrics::counter!(name).increment(0);
    }
    let gauges = [
        ("twinhub_notify_feed_consumers", "Open change-feed consumers on this node."),
        ("twinhub_mqtt_connections", "Open device MQTT connections (TLS, plain and WebSocket)."),
    ];
    for (name, help) in gauges {
        metrics::describe_gauge!(name, help);
        metrics::gauge!(name).increment(0.0);
    }
    metrics::describe_histogram!("twinhub_http_request_duration_seconds", metrics::Unit::Seconds, "HTTPS request latency by route.");
    metrics::describe_histogram!("twinhub_storage_fsync_seconds", metrics::Unit::Seconds, "Duration of one group-commit fsync.");
    metrics::describe_histogram!("twinhub_storage_batch_requests", "Storage requests (log appends of every shard) covered by one fsync.");
    metrics::describe_gauge!("twinhub_shard_has_leader", "1 if this node knows a leader of the shard.");
    metrics::describe_gauge!("twinhub_shard_max_replica_lag", "Log entries the furthest follower is behind, as this node sees it when leading.");
    metrics::describe_gauge!("twinhub_data_dir_free_bytes", metrics::Unit::Bytes, "Free bytes of the data directory's file system.");
    metrics::describe_gauge!("process_resident_memory_bytes", metrics::Unit::Bytes, "Resident memory of the process.");
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
