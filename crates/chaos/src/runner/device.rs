//! MQTT devices (plain MQTT 3.1.1 with rumqttc): each device keeps one connection to one node, does
//! twin GETs and reported patches, and records every desired push it receives. A connection that fails
//! (an error, a timeout, a 5xx answer) is dropped and the device reconnects to another node as a new
//! `client` (push ordering is promised per connection).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::runner::util::{device_sas, now_ns};
use crate::runner::workload::{user_section, Shared, Values};
use crate::{Op, OpKind, Outcome};

const RES_PREFIX: &str = "$iothub/twin/res/";
const PUSH_PREFIX: &str = "$iothub/twin/PATCH/properties/desired/";

struct Answer {
    status: u16,
    version: Option<i64>,
    body: Bytes,
    at: u64,
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Answer>>>>;

/// One device connection.
pub struct DeviceConn {
    pub twin: String,
    pub client_id: u64,
    pub node: usize,
    client: AsyncClient,
    pending: Pending,
    closed: Arc<AtomicBool>,
    /// Highest desired `$version` pushed on this connection (0: none).
    last_push: Arc<AtomicI64>,
    /// Desired `$version` of the last GET answered on this connection.
    last_get_dv: i64,
    rid: u64,
    shared: Arc<Shared>,
}

fn query_param(topic: &str, key: &str) -> Option<String> {
    let q = topic.split_once('?')?.1;
    q.split('&').find_map(|kv| kv.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v.to_string()))
}

impl DeviceConn {
    /// Connects to `addr`, subscribes to responses and desired pushes. `None` if any step fails.
    pub async fn connect(shared: Arc<Shared>, node: usize, twin: &str, key: &str) -> Result<DeviceConn, String> {
        let addr: SocketAddr = shared.mqtt[node];
        let mut o = MqttOptions::new(twin, addr.ip().to_string(), addr.port());
        o.set_credentials(
            format!("{}/{twin}/?api-version={}", shared.hostname, crate::runner::util::API_VERSION),
            device_sas(&shared.hostname, twin, key),
        );
        o.set_keep_alive(Duration::from_secs(5));
        o.set_clean_session(true);
        o.set_max_packet_size(1 << 20, 1 << 20);
        let (client, mut el) = AsyncClient::new(o, 64);
        el.network_options.set_connection_timeout(3);
        match tokio::time::timeout(Duration::from_secs(4), el.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(a)))) if a.code == rumqttc::ConnectReturnCode::Success => {}
            other => return Err(format!("no CONNACK from {addr}: {other:?}")),
        }
        let client_id = shared.rec.client();
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let closed = Arc::new(AtomicBool::new(false));
        let last_push = Arc::new(AtomicI64::new(0));
        let (suback_tx, mut suback_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        {
            let pending = pending.clone();
            let closed = closed.clone();
            let last_push = last_push.clone();
            let rec = shared.rec.clone();
            let twin = twin.to_string();
            let node_id = shared.node_ids[node];
            tokio::spawn(async move {
                loop {
                    match el.poll().await {
                        Ok(Event::Incoming(Packet::Publish(p))) => {
                            let at = now_ns();
                            if let Some(rest) = p.topic.strip_prefix(RES_PREFIX) {
                                let status = rest.split('/').next().and_then(|s| s.parse().ok()).unwrap_or(0);
                                let rid: Option<u64> = query_param(&p.topic, "$rid").and_then(|r| r.parse().ok());
                                let version = query_param(&p.topic, "$version").and_then(|v| v.parse().ok());
                                if let Some(tx) =
                                    rid.and_then(|r| pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&r))
                                {
                                    let _ = tx.send(Answer { status, version, body: p.payload.clone(), at });
                                }
                            } else if p.topic.starts_with(PUSH_PREFIX) {
                                let version: i64 =
                                    query_param(&p.topic, "$version").and_then(|v| v.parse().ok()).unwrap_or(-1);
                                let patch: Value = serde_json::from_slice(&p.payload).unwrap_or(Value::Null);
                                let patch = if patch.is_object() {
                                    patch
                                } else {
                                    json!({"$unparsable": String::from_utf8_lossy(&p.payload)})
                                };
                                last_push.fetch_max(version, Ordering::Relaxed);
                                rec.push_via(
                                    Op {
                                        client: client_id,
                                        twin: twin.clone(),
                                        invoke_ns: at,
                                        complete_ns: Some(at),
                                        kind: OpKind::Push { desired_version: version, patch },
                                        outcome: Outcome::ok(),
                                        final_read: false,
                                    },
                                    Some(node_id),
                                );
                            }
                        }
                        Ok(Event::Incoming(Packet::SubAck(_))) => {
                            let _ = suback_tx.send(());
                        }
                        Ok(_) => {}
                        Err(_) => {
                            closed.store(true, Ordering::Relaxed);
                            // Dropping the senders fails every waiting request.
                            pending.lock().unwrap_or_else(|e| e.into_inner()).clear();
                            return; // polling again would reconnect: a reconnect is a new connection
                        }
                    }
                }
            });
        }
        let conn = DeviceConn {
            twin: twin.to_string(),
            client_id,
            node,
            client,
            pending,
            closed,
            last_push,
            last_get_dv: 0,
            rid: 0,
            shared,
        };
        for filter in ["$iothub/twin/res/#", "$iothub/twin/PATCH/properties/desired/#"] {
            if conn.client.subscribe(filter, QoS::AtLeastOnce).await.is_err() {
                conn.close().await;
                return Err("subscribe failed".into());
            }
            match tokio::time::timeout(Duration::from_secs(4), suback_rx.recv()).await {
                Ok(Some(())) => {}
                _ => {
                    conn.close().await;
                    return Err(format!("no SUBACK for {filter}"));
                }
            }
        }
        Ok(conn)
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    pub async fn close(&self) {
        let _ = self.client.try_disconnect();
        self.closed.store(true, Ordering::Relaxed);
    }

    /// Sends one twin request; `None` if the connection was already closed (nothing sent).
    async fn request(
        &mut self,
        prefix: &str,
        payload: String,
        timeout: Duration,
    ) -> Option<(u64, Result<Answer, String>)> {
        if self.is_closed() {
            return None;
        }
        self.rid += 1;
        let rid = self.rid;
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(rid, tx);
        let invoke = now_ns();
        if self.client.publish(format!("{prefix}?$rid={rid}"), QoS::AtLeastOnce, false, payload).await.is_err() {
            return None;
        }
        let r = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(_)) => Err("connection closed".to_string()),
            Err(_) => Err(format!("no answer within {timeout:?}")),
        };
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&rid);
        Some((invoke, r))
    }

    /// A device GET; records it. Returns whether it succeeded.
    pub async fn get(&mut self, final_read: bool) -> bool {
        let Some((invoke, r)) = self.request("$iothub/twin/GET/", String::new(), self.shared.timeout).await else {
            return false;
        };
        let (outcome, complete) = match r {
            Ok(a) if a.status == 200 => match serde_json::from_slice::<Value>(&a.body) {
                Ok(t) if t.is_object() => {
                    let dv = t.pointer("/desired/$version").and_then(Value::as_i64);
                    if let Some(dv) = dv {
                        self.last_get_dv = dv;
                    }
                    (
                        Outcome::Ok {
                            version: None,
                            desired_version: dv,
                            reported_version: t.pointer("/reported/$version").and_then(Value::as_i64),
                            etag: None,
                            desired: Some(user_section(t.get("desired"))),
                            reported: Some(user_section(t.get("reported"))),
                        },
                        Some(a.at),
                    )
                }
                _ => (Outcome::Unknown { reason: "200 without a twin".into() }, Some(a.at)),
            },
            Ok(a) => answer_failure(&a),
            Err(e) => (Outcome::Unknown { reason: e }, None),
        };
        let ok = outcome.is_ok();
        self.record(invoke, complete, OpKind::DeviceGet, outcome, final_read && ok);
        ok
    }

    /// A reported patch; records it. Returns whether it was acknowledged.
    pub async fn patch_reported(&mut self, patch: Value) -> bool {
        let Some((invoke, r)) =
            self.request("$iothub/twin/PATCH/properties/reported/", patch.to_string(), self.shared.timeout).await
        else {
            return false;
        };
        let (outcome, complete) = match r {
            Ok(a) if a.status == 204 || a.status == 200 => {
                let mut o = Outcome::ok();
                if let Outcome::Ok { reported_version, .. } = &mut o {
                    *reported_version = a.version;
                }
                (o, Some(a.at))
            }
            Ok(a) => answer_failure(&a),
            Err(e) => (Outcome::Unknown { reason: e }, None),
        };
        let ok = outcome.is_ok();
        self.record(invoke, complete, OpKind::PatchReported { patch }, outcome, false);
        ok
    }

    fn record(&self, invoke: u64, complete: Option<u64>, kind: OpKind, outcome: Outcome, final_read: bool) {
        self.shared.rec.push_via(
            Op {
                client: self.client_id,
                twin: self.twin.clone(),
                invoke_ns: invoke,
                complete_ns: complete,
                kind,
                outcome,
                final_read,
            },
            Some(self.shared.node_ids[self.node]),
        );
    }

    /// After healing: a final GET (marked), then waits until a push (or that GET) brought this
    /// connection to the final desired `$version`. Returns a note if it never did.
    pub async fn converge(&mut self, deadline: tokio::time::Instant) -> Result<(), String> {
        let before = self.last_get_dv;
        let mut tries = 0;
        while !self.get(true).await {
            tries += 1;
            if self.is_closed() || tokio::time::Instant::now() > deadline || tries > 5 {
                return Err(format!("{} (connection {}): no final GET", self.twin, self.client_id));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let target = self.last_get_dv;
        if target <= before {
            return Ok(());
        }
        while self.last_push.load(Ordering::Relaxed) < target {
            if self.is_closed() {
                return Err(format!(
                    "{} (connection {}): closed before the push of $version {target}",
                    self.twin, self.client_id
                ));
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "{} (connection {}): last push $version {} < final $version {target}",
                    self.twin,
                    self.client_id,
                    self.last_push.load(Ordering::Relaxed)
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

/// A non-success answer: 4xx certainly did not apply; anything else may have.
fn answer_failure(a: &Answer) -> (Outcome, Option<u64>) {
    let text: String = String::from_utf8_lossy(&a.body).chars().take(200).collect();
    if (400..500).contains(&a.status) && a.status != 429 && a.status != 408 {
        (Outcome::Failed { status: a.status, message: text }, Some(a.at))
    } else {
        (Outcome::Unknown { reason: format!("{} {text}", a.status) }, Some(a.at))
    }
}

/// One device: connects (to a random node, another one after a failure), GETs its twin, then patches
/// reported properties and GETs until stopped; returns its live connection for the final reads.
pub async fn device_worker(shared: Arc<Shared>, twin: String, key: String, seed: u64) -> Option<DeviceConn> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut vals = Values::new(1000 + seed % 1_000_000);
    let n = shared.mqtt.len();
    let mut node = rng.gen_range(0..n);
    while !shared.stopped() {
        let mut conn = match DeviceConn::connect(shared.clone(), node, &twin, &key).await {
            Ok(c) => c,
            Err(_) => {
                node = (node + rng.gen_range(1..n.max(2))) % n;
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
        };
        let mut healthy = conn.get(false).await;
        while healthy && !shared.stopped() {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(80..250))).await;
            if shared.stopped() {
                break;
            }
            healthy = if rng.gen_bool(0.65) {
                let mut p = serde_json::Map::new();
                p.insert("t".into(), json!(vals.fresh()));
                if rng.gen_bool(0.3) {
                    p.insert(
                        ["s", "u", "v"][rng.gen_range(0..3)].into(),
                        if rng.gen_bool(0.2) { Value::Null } else { json!(vals.fresh()) },
                    );
                }
                conn.patch_reported(Value::Object(p)).await
            } else {
                conn.get(false).await
            };
        }
        if healthy && !conn.is_closed() {
            return Some(conn);
        }
        conn.close().await;
        node = (node + rng.gen_range(1..n.max(2))) % n;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}
