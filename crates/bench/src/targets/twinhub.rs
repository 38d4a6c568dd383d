//! twinhub as a `Target`: an update is `PATCH /twins/{id}` of `{"properties":{"desired":{"fb": VALUE}}}`
//! over HTTPS (HTTP/1.1 keep-alive, one TLS connection per worker, workers spread over the nodes);
//! `create` registers the device. The watch is one back-end subscription to the event broker of node
//! 1 (`twin-changes/#`, MQTT over TLS, policy SAS), the counterpart of an etcd prefix watch.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rumqttc::QoS;
use tokio::task::JoinHandle;

use super::{Client, OpError, Target, WatchCounts};
use crate::hub::{Hub, HubClient};
use crate::mqtt::{self, Endpoint, Msg};
use crate::sas;

/// Names the node (1-based) that every worker connects to, instead of spreading the workers over the
/// nodes. A diagnostic for what the forwarding hop costs: a write that reaches a node which does not lead
/// its shard is forwarded to the leader, so with every worker on the leader no write is forwarded and with
/// every worker on a follower every write is. Never the yardstick: clients of a real deployment arrive
/// through a load balancer, spread, as the default runs them. Unset or empty: spread.
pub const CLIENTS_ON_NODE: &str = "TWINHUB_BENCH_CLIENTS_ON_NODE";

fn clients_on_node() -> anyhow::Result<Option<usize>> {
    match std::env::var(CLIENTS_ON_NODE) {
        Ok(v) if !v.trim().is_empty() => {
            v.trim().parse().map(Some).map_err(|e| anyhow::anyhow!("{CLIENTS_ON_NODE}={v:?}: {e}"))
        }
        _ => Ok(None),
    }
}

pub struct Twinhub {
    pub hub: Hub,
}

pub struct TwinhubClient {
    c: HubClient,
}

impl Target for Twinhub {
    type Client = TwinhubClient;

    fn name(&self) -> &'static str {
        "twinhub"
    }

    fn protocol(&self) -> String {
        let spread = match clients_on_node() {
            Ok(Some(n)) => format!("ALL on node {n} ({CLIENTS_ON_NODE}; a diagnostic, not the yardstick)"),
            _ => format!("over {} nodes", self.hub.http.len()),
        };
        format!("HTTPS (TLS, HTTP/1.1 keep-alive, one connection per worker {spread}): PATCH /twins/{{id}} desired properties")
    }

    async fn client(&self, worker: usize) -> anyhow::Result<TwinhubClient> {
        let node = match clients_on_node()? {
            Some(n) if (1..=self.hub.http.len()).contains(&n) => n - 1,
            Some(n) => anyhow::bail!("{CLIENTS_ON_NODE}={n}: the cluster has nodes 1 to {}", self.hub.http.len()),
            None => worker,
        };
        Ok(TwinhubClient { c: self.hub.client(node) })
    }

    async fn watch(&self, counts: Arc<WatchCounts>) -> anyhow::Result<JoinHandle<()>> {
        let node = &self.hub.info.nodes[0];
        let events = node.events.as_ref().ok_or_else(|| anyhow::anyhow!("node {} has no events listener", node.id))?;
        let ep = Endpoint {
            addr: crate::http::addr(events)?,
            tls: Some((self.hub.tls.config.clone(), self.hub.info.hostname.clone())),
        };
        let pass = sas::service_sas(
            &self.hub.info.hostname,
            "iothubowner",
            &self.hub.info.owner_key,
            sas::unix_now() + 86_400,
        )?;
        let id = format!("twinhub-bench-watch-{}", rand::random::<u32>());
        let mut conn = mqtt::connect(&ep, &id, "iothubowner", &pass, Duration::from_secs(60), None)
            .await
            .map_err(|e| anyhow::anyhow!("event broker: {e}"))?;
        conn.subscribe("twin-changes/#", QoS::AtMostOnce).await.map_err(|e| anyhow::anyhow!("event broker: {e}"))?;
        Ok(tokio::spawn(async move {
            let _client = conn.client;
            while let Some(m) = conn.rx.recv().await {
                match m {
                    Msg::Publish { payload, .. } => {
                        counts.notifications.fetch_add(1, Ordering::Relaxed);
                        let merged =
                            serde_json::from_slice::<ChangeEvent>(&payload).ok().and_then(|e| e.merged).unwrap_or(1);
                        counts.changes.fetch_add(merged, Ordering::Relaxed);
                    }
                    Msg::Closed(e) => {
                        eprintln!("twinhub watch closed: {e}");
                        return;
                    }
                    Msg::SubAck => {}
                }
            }
        }))
    }

    fn watch_kind(&self) -> String {
        "event broker of node 1: MQTT over TLS, SUBSCRIBE twin-changes/# QoS 0 (\"merged\" counts coalesced changes)"
            .into()
    }
}

impl Client for TwinhubClient {
    async fn create(&mut self, key: &str) -> Result<(), OpError> {
        self.c.create_device(key).await.map(|_| ())
    }

    async fn update(&mut self, key: &str, value: &str) -> Result<(), OpError> {
        self.c.patch_fast(key, value).await
    }
}

/// What the watch reads of a change event: how many changes it stands for. The rest of the event is
/// checked to be JSON and skipped, without building a tree of it (the watch runs beside the load,
/// on the same machine as the nodes).
#[derive(serde::Deserialize)]
struct ChangeEvent {
    merged: Option<u64>,
}
