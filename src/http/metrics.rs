//! Prometheus metrics: request counts and latencies per route.
//!
//! Every label value comes from a closed set, so no client can grow the metrics page: the route is
//! the matched path pattern (`unmatched` otherwise, so device ids never become labels), the method
//! one of the standard ones or `other`, the status a number our handlers produce.

use std::borrow::Cow;
use std::sync::OnceLock;
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics::{Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::metric_handles::HandleCache;

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process-wide recorder, installed on first use. `None` if another recorder was installed first.
pub fn metrics_handle() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let buckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
            // Requests per group-commit batch and writes per log entry: counts, not seconds.
            let batch = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];
            let builder = PrometheusBuilder::new()
                .set_buckets(&buckets)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full("twinhub_storage_batch_requests".into()), &batch))
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full("twinhub_raft_batch_commands".into()), &batch))
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
        (
            "twinhub_notify_pushes_merged_total",
            "Desired pushes merged into a pending one for a busy device (coalescing).",
        ),
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
        ("twinhub_twin_actors", "Twin actors alive on this node (one per twin written in the last idle period)."),
    ];
    for (name, help) in gauges {
        metrics::describe_gauge!(name, help);
        metrics::gauge!(name).increment(0.0);
    }
    // Everything else appears when it first happens; its help text is given here, so that every series
    // on /metrics says what it counts.
    let counters = [
        ("twinhub_http_requests_total", "HTTPS requests answered, by route pattern, method and status."),
        ("twinhub_mqtt_requests_total", "Device MQTT requests ($iothub topics) handled, by kind and status."),
        ("twinhub_mqtt_connects_total", "Device MQTT CONNECTs, by outcome."),
        ("twinhub_mqtt_disconnects_total", "Device MQTT connections closed, by reason."),
        ("twinhub_mqtt_takeovers_total", "Device connections replaced by a newer connection of the same identity."),
        ("twinhub_mqtt_desired_pushes_total", "Desired-property pushes sent to devices."),
        ("twinhub_mqtt_telemetry_dropped_total", "Device-to-cloud messages acknowledged and dropped (no routing yet)."),
        ("twinhub_mqtt_tls_failures_total", "Device MQTT TLS handshakes that failed."),
        (
            "twinhub_mqtt_sessions_restored_total",
            "Persistent MQTT sessions whose subscriptions were restored on connect.",
        ),
        ("twinhub_mqtt_sessions_evicted_total", "Detached persistent MQTT sessions evicted to bound memory."),
        ("twinhub_mqtt_websocket_connections_total", "MQTT-over-WebSocket upgrades accepted."),
        ("twinhub_mqtt_websocket_refused_total", "MQTT-over-WebSocket upgrades refused."),
        (
            "twinhub_listener_refused_total",
            "Connections refused at accept by a connection bound, by listener and reason.",
        ),
        ("twinhub_method_calls_total", "Direct method calls, by outcome."),
        ("twinhub_method_responses_total", "Direct method responses received from devices."),
        (
            "twinhub_notify_feed_resyncs_total",
            "Change-feed consumers told to resync (their position could not be served).",
        ),
        ("twinhub_notify_feed_superseded_total", "Change-feed consumers replaced by a newer one of the same identity."),
        (
            "twinhub_notify_push_overflows_total",
            "Device push queues that overflowed (the connection is closed; the device re-reads its twin).",
        ),
        ("twinhub_notify_broker_published_total", "Events published on the back-end event broker."),
        (
            "twinhub_notify_broker_internal_login_refused_total",
            "Refused logins with the event broker's internal identity.",
        ),
        (
            "twinhub_event_tail_gaps_total",
            "Change events of remotely hosted shards that a tail could not fetch (consumers are told to resync).",
        ),
        ("twinhub_route_forwarded_total", "Writes forwarded to the node leading the twin's shard."),
        ("twinhub_route_forwarded_reads_total", "Reads forwarded to a node holding a replica of the twin's shard."),
        ("twinhub_route_retries_total", "Writes retried after a leader change or an unreachable node."),
        ("twinhub_route_read_retries_total", "Reads retried after a leader change or an unreachable node."),
        ("twinhub_rpc_requests_total", "Inter-node calls sent, by kind."),
        ("twinhub_rpc_errors_total", "Inter-node calls sent that failed, by kind."),
        ("twinhub_rpc_connects_total", "Inter-node connections opened."),
        ("twinhub_rpc_connect_failures_total", "Inter-node connection attempts that failed."),
        ("twinhub_rpc_server_requests_total", "Inter-node calls received, by kind."),
        ("twinhub_rpc_server_errors_total", "Inter-node calls received that failed, by kind."),
        ("twinhub_rpc_server_refused_total", "Inter-node calls refused (bad signature, replay, unknown peer)."),
        (
            "twinhub_raft_appends_sent_total",
            "AppendEntries sent by the groups this node leads, by what they carry (entries, commit, heartbeat).",
        ),
        ("twinhub_raft_entries_sent_total", "Log entries sent in AppendEntries by the groups this node leads."),
        (
            "twinhub_raft_commits_carried_total",
            "Commit indexes that waited for the next entries and went with them instead of alone.",
        ),
        ("twinhub_shard_leader_changes_total", "Leader changes seen by this node, by shard."),
        ("twinhub_shard_leader_transfers_total", "Leadership transfers started by the balancer, by shard."),
        (
            "twinhub_shard_fast_elections_total",
            "Elections started at once because the leader's process was found gone, by shard.",
        ),
        ("twinhub_configuration_passes_total", "Passes of the configurations reconciler."),
        ("twinhub_configuration_twin_updates_total", "Twin updates written by automatic device configurations."),
    ];
    for (name, help) in counters {
        metrics::describe_counter!(name, help);
    }
    let gauges = [
        ("twinhub_notify_pushes_pending", "Desired pushes waiting for device connections to take them (queue depth)."),
        ("twinhub_notify_feed_pending", "Change events waiting for feed consumers to take them (queue depth)."),
    ];
    for (name, help) in gauges {
        metrics::describe_gauge!(name, help);
        metrics::gauge!(name).set(0.0);
    }
    let gauges = [
        ("twinhub_shard_term", "Raft term of the shard's replica on this node."),
        ("twinhub_shard_last_log_index", "Last log index of the shard's replica on this node."),
        ("twinhub_shard_commit_index", "Commit index of the shard's replica on this node."),
        ("twinhub_shard_apply_index", "Last applied index of the shard's replica on this node."),
        ("twinhub_shard_snapshot_index", "Log index of the last snapshot of the shard's replica on this node."),
        (
            "twinhub_shard_writes_since_snapshot",
            "Twin writes the shard's replica applied since its last snapshot: what a restart re-applies.",
        ),
        (
            "twinhub_shard_snapshot_due_writes",
            "Writes after which the shard's replica on this node snapshots whatever its entry count.",
        ),
        ("twinhub_shard_is_leader", "1 if this node leads the shard."),
        ("twinhub_shard_has_leader", "1 if this node knows a leader of the shard."),
        (
            "twinhub_shard_max_replica_lag",
            "Log entries the furthest follower is behind, as this node sees it when leading.",
        ),
        ("twinhub_listener_connections", "Open connections, by listener."),
        ("twinhub_listener_unauthenticated_connections", "Open connections not yet authenticated, by listener."),
        ("twinhub_mqtt_sessions", "MQTT sessions held (connected and detached persistent ones)."),
        ("twinhub_mqtt_sessions_detached", "Persistent MQTT sessions held while their device is disconnected."),
        ("twinhub_mqtt_session_bytes", "Approximate bytes held by MQTT sessions."),
        ("twinhub_notify_broker_clients", "Clients connected to the back-end event broker."),
        ("twinhub_notify_device_registrations", "Device connections registered for desired pushes."),
        ("twinhub_data_dir_size_bytes", "Total bytes of the data directory's file system."),
        ("process_open_fds", "Open file descriptors of the process."),
    ];
    for (name, help) in gauges {
        metrics::describe_gauge!(name, help);
    }
    metrics::describe_histogram!(
        "twinhub_http_request_duration_seconds",
        metrics::Unit::Seconds,
        "HTTPS request latency by route."
    );
    metrics::describe_histogram!(
        "twinhub_mqtt_request_duration_seconds",
        metrics::Unit::Seconds,
        "Device MQTT request latency by kind."
    );
    metrics::describe_histogram!(
        "twinhub_rpc_request_duration_seconds",
        metrics::Unit::Seconds,
        "Inter-node call latency seen by the caller, by kind and peer."
    );
    metrics::describe_histogram!(
        "twinhub_rpc_server_request_duration_seconds",
        metrics::Unit::Seconds,
        "Inter-node call handling time, by kind."
    );
    metrics::describe_histogram!(
        "twinhub_storage_fsync_seconds",
        metrics::Unit::Seconds,
        "Duration of one group-commit fsync."
    );
    metrics::describe_histogram!(
        "twinhub_storage_write_seconds",
        metrics::Unit::Seconds,
        "Duration of one group-commit round's write, before its fsync; every append of the node waits for it."
    );
    metrics::describe_histogram!(
        "twinhub_storage_batch_requests",
        "Storage requests (log appends of every shard) covered by one fsync."
    );
    metrics::describe_histogram!(
        "twinhub_raft_batch_commands",
        "Twin writes of one shard proposed together as one Raft log entry (see --proposals-in-flight)."
    );
    metrics::describe_histogram!(
        "twinhub_snapshot_image_seconds",
        metrics::Unit::Seconds,
        "Time one shard snapshot holds the state lock to take its image; apply waits meanwhile."
    );
    metrics::describe_histogram!(
        "twinhub_snapshot_encode_seconds",
        metrics::Unit::Seconds,
        "Time to encode one shard snapshot (off the state lock; apply goes on meanwhile)."
    );
    metrics::describe_counter!(
        "twinhub_snapshot_bytes_total",
        metrics::Unit::Bytes,
        "Bytes of shard snapshots built by this node."
    );
    metrics::describe_gauge!(
        "twinhub_data_dir_free_bytes",
        metrics::Unit::Bytes,
        "Free bytes of the data directory's file system."
    );
    metrics::describe_gauge!("process_resident_memory_bytes", metrics::Unit::Bytes, "Resident memory of the process.");
}

pub fn render_metrics() -> String {
    let mut text = metrics_handle().map(|h| h.render()).unwrap_or_default();
    text.push_str(&crate::sysmetrics::render_process_cpu());
    text
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

/// A route's request counter (by method and status) and duration histogram (by method). The route is
/// borrowed when it is a pattern known at compile time (the twin routes served without the router).
static ROUTES: HandleCache<(Cow<'static, str>, &'static str, u16), (Counter, Histogram)> = HandleCache::new();

pub async fn track(req: Request, next: Next) -> Response {
    let route = match req.extensions().get::<MatchedPath>() {
        Some(p) => Cow::Owned(p.as_str().to_string()),
        None => Cow::Borrowed("unmatched"),
    };
    let method = req.method().clone();
    let start = Instant::now();
    let resp = next.run(req).await;
    record(route, &method, resp.status(), start);
    resp
}

/// Counts one answered request of `route` (a path pattern, never a path) and its duration since `start`.
pub fn record(route: Cow<'static, str>, method: &axum::http::Method, status: StatusCode, start: Instant) {
    metrics_handle();
    let (requests, duration) = ROUTES.get((route, method_label(method), status.as_u16()), |(route, method, status)| {
        let labels = [("method", method.to_string()), ("route", route.to_string()), ("status", status.to_string())];
        (
            metrics::counter!("twinhub_http_requests_total", &labels),
            metrics::histogram!("twinhub_http_request_duration_seconds", &labels[..2]),
        )
    });
    requests.increment(1);
    duration.record(start.elapsed().as_secs_f64());
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
