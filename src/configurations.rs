//! The configurations reconciler: on the node that leads the metadata group, brings every twin's
//! configuration marks and desired properties in line with the configurations (see
//! `model::config`).
//!
//! A pass finds, for every configuration, the devices its target condition selects now, and the
//! devices that carry marks; for each device whose marks differ from what the configurations say, it
//! sends one [`Op::ApplyConfiguration`] through the normal write path (the device's shard leader). The
//! command sets the marks and, when the winning configuration is newly applied, merges its content
//! into desired properties: so a twin that starts matching later gets the content on the next pass,
//! and a configuration's content reaches each twin once. A pass runs at once when a configuration is
//! created, changed or deleted, and otherwise every `interval` while any configuration exists (IoT
//! Hub evaluates every five minutes); with no configurations nothing is scanned.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::ids::TwinId;
use crate::model::config::{ConfigsState, ALL_DEVICES};
use crate::model::{now_ms, Command, Op};
use crate::shard::ShardError;
use crate::twin::Twins;

/// Twin updates in flight at once during a pass.
const IN_FLIGHT: usize = 16;

/// The query that selects a configuration's targets.
pub fn target_query(condition: &str) -> String {
    if condition.trim() == ALL_DEVICES {
        "SELECT deviceId FROM devices".to_string()
    } else {
        crate::query::condition_query(condition)
    }
}

/// Devices that carry configuration marks, with their marks (id → status).
pub async fn marked_twins(twins: &Twins) -> Result<BTreeMap<String, BTreeMap<String, String>>, ShardError> {
    let rows = twins.scan("SELECT deviceId, configurations FROM devices WHERE IS_DEFINED(configurations)").await?;
    Ok(rows
        .into_iter()
        .filter_map(|(_, row)| {
            let device = row["deviceId"].as_str()?.to_string();
            let marks = row["configurations"]
                .as_object()
                .map(|m| {
                    m.iter().filter_map(|(id, v)| v["status"].as_str().map(|s| (id.clone(), s.to_string()))).collect()
                })
                .unwrap_or_default();
            Some((device, marks))
        })
        .collect())
}

/// Runs until `stop`.
pub async fn run(twins: Arc<Twins>, interval: Duration, stop: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen: Option<u64> = None;
    let mut last_pass: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let Some(meta) = twins.meta_group() else { continue };
        if !meta.is_leader() {
            seen = None;
            continue;
        }
        let configs = meta.read_local(|s| s.configs.clone());
        let changed = seen != Some(configs.etag_seq);
        let due = !configs.configs.is_empty() && last_pass.is_none_or(|t| t.elapsed() >= interval);
        if !changed && !due {
            continue;
        }
        let started = Instant::now();
        match pass(&twins, &configs).await {
            Ok(updated) => {
                seen = Some(configs.etag_seq);
                last_pass = Some(Instant::now());
                metrics::counter!("twinhub_configuration_passes_total").increment(1);
                metrics::counter!("twinhub_configuration_twin_updates_total").increment(updated as u64);
                if updated > 0 {
                    tracing::info!(updated, configurations = configs.configs.len(), elapsed = ?started.elapsed(), "configurations applied");
                }
            }
            Err(e) => tracing::warn!("configuration pass interrupted (retried): {e}"),
        }
    }
}

/// One pass; answers how many twins it updated.
async fn pass(twins: &Twins, configs: &ConfigsState) -> Result<usize, ShardError> {
    let mut targets: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in configs.configs.values() {
        for (_, row) in twins.scan(&target_query(&c.spec.target_condition)).await? {
            if let Some(d) = row["deviceId"].as_str() {
                targets.entry(d.to_string()).or_default().push(c.spec.id.clone());
            }
        }
    }
    let current = marked_twins(twins).await?;
    let devices: BTreeSet<&String> = targets.keys().chain(current.keys()).collect();
    let empty = BTreeMap::new();
    let mut work = Vec::new();
    for device in devices {
        let ids = targets.get(device).map(Vec::as_slice).unwrap_or_default();
        let (winner, marks) = configs.marks(ids);
        if current.get(device).unwrap_or(&empty) == &marks {
            continue;
        }
        let apply = winner.map(|w| (w.spec.id.clone(), w.spec.desired_patch_json.clone()));
        work.push((TwinId::device(device.clone()), Op::ApplyConfiguration { device_id: device.clone(), marks, apply }));
    }
    let updated = work.len();
    let mut writes = futures::stream::iter(work.into_iter().map(|(id, op)| async move {
        twins.write(&id, Command::new(op, now_ms())).await.map(|applied| (id, applied.result))
    }))
    .buffer_unordered(IN_FLIGHT);
    while let Some(r) = writes.next().await {
        if let (id, Err(e)) = r? {
            tracing::warn!(%id, "configuration not applied: {e}");
        }
    }
    Ok(updated)
}

/// `systemMetrics.results` and `metrics.results` of each configuration (by id): devices targeted now,
/// twins that applied it, and the row count of each user metric query.
pub async fn metric_results(
    twins: &Twins,
    configs: &[&crate::model::config::Configuration],
) -> Result<BTreeMap<String, (Value, Value)>, ShardError> {
    let marked = if configs.is_empty() { BTreeMap::new() } else { marked_twins(twins).await? };
    let mut out = BTreeMap::new();
    for c in configs {
        let targeted = twins.count(&target_query(&c.spec.target_condition)).await?;
        let applied = marked
            .values()
            .filter(|m| m.get(&c.spec.id).map(String::as_str) == Some(crate::model::config::APPLIED))
            .count();
        let mut user = serde_json::Map::new();
        for (name, q) in &c.spec.metric_queries {
            let n = twins.count(q).await.unwrap_or(0);
            user.insert(name.clone(), Value::from(n));
        }
        let system = serde_json::json!({"targetedCount": targeted, "appliedCount": applied});
        out.insert(c.spec.id.clone(), (system, Value::Object(user)));
    }
    Ok(out)
}
