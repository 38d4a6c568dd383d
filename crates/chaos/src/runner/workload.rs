//! The workload: concurrent HTTP back-end clients (gets, desired patches with and without If-Match,
//! replaces) and MQTT devices (`device`), every op recorded in a shared [`Recorder`] with its invoke and
//! complete times (the run clock) and outcome, in the checker's [`History`](crate::History) form.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

use crate::runner::https::{HttpError, HttpsClient};
use crate::runner::util::{enc, now_ns};
use crate::{Op, OpKind, Outcome};

/// Every op of a scenario (with the node it went to, when known), and the client ids handed out.
#[derive(Default)]
pub struct Recorder {
    ops: Mutex<Vec<(Op, Option<u64>)>>,
    next_client: AtomicU64,
}

impl Recorder {
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder { ops: Mutex::new(Vec::new()), next_client: AtomicU64::new(1) })
    }

    /// A new client id (one per HTTP worker, one per device connection).
    pub fn client(&self) -> u64 {
        self.next_client.fetch_add(1, Ordering::Relaxed)
    }

    pub fn push(&self, op: Op) {
        self.push_via(op, None);
    }

    /// Records an op sent to (or received from) node `node`.
    pub fn push_via(&self, op: Op, node: Option<u64>) {
        self.ops.lock().unwrap_or_else(|e| e.into_inner()).push((op, node));
    }

    /// The ops in invoke order, and the node of each.
    pub fn take(&self) -> (Vec<Op>, Vec<Option<u64>>) {
        let mut ops = std::mem::take(&mut *self.ops.lock().unwrap_or_else(|e| e.into_inner()));
        ops.sort_by_key(|(o, _)| (o.invoke_ns, o.complete_ns));
        ops.into_iter().unzip()
    }

    pub fn len(&self) -> usize {
        self.ops.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A section without its `$`-members (`$metadata`, `$version`).
pub fn user_section(v: Option<&Value>) -> Value {
    match v {
        Some(Value::Object(m)) => Value::Object(strip(m)),
        _ => json!({}),
    }
}

fn strip(m: &Map<String, Value>) -> Map<String, Value> {
    m.iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| {
            let v = match v {
                Value::Object(inner) => Value::Object(strip(inner)),
                other => other.clone(),
            };
            (k.clone(), v)
        })
        .collect()
}

/// An HTTP twin answer as an `Ok` outcome.
pub fn twin_outcome(t: &Value) -> Outcome {
    Outcome::Ok {
        version: t.get("version").and_then(Value::as_i64),
        desired_version: t.pointer("/properties/desired/$version").and_then(Value::as_i64),
        reported_version: t.pointer("/properties/reported/$version").and_then(Value::as_i64),
        etag: t.get("etag").and_then(Value::as_str).map(str::to_string),
        desired: Some(user_section(t.pointer("/properties/desired"))),
        reported: Some(user_section(t.pointer("/properties/reported"))),
    }
}

/// What an HTTP answer (or error) means for the history: `Ok` only for a 200 with a twin; 4xx certainly
/// did not apply; 5xx, timeouts and resets may have. The complete time is `None` when no answer came.
pub fn classify(result: &Result<crate::runner::https::Response, HttpError>, at: u64) -> (Outcome, Option<u64>) {
    match result {
        Ok(r) if r.status == 200 => match serde_json::from_slice::<Value>(&r.body) {
            Ok(t) if t.is_object() => (twin_outcome(&t), Some(at)),
            _ => (
                Outcome::Unknown { reason: format!("200 without a twin: {}", String::from_utf8_lossy(&r.body)) },
                Some(at),
            ),
        },
        Ok(r) if (400..500).contains(&r.status) && r.status != 429 && r.status != 408 => {
            (Outcome::Failed { status: r.status, message: error_message(&r.body) }, Some(at))
        }
        Ok(r) => (Outcome::Unknown { reason: format!("{} {}", r.status, error_message(&r.body)) }, Some(at)),
        Err(HttpError::NotSent(m)) => (Outcome::Failed { status: 0, message: format!("not sent: {m}") }, Some(at)),
        Err(HttpError::Sent(m)) => (Outcome::Unknown { reason: m.clone() }, None),
    }
}

fn error_message(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let m = v
        .get("Message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(body).to_string());
    m.chars().take(200).collect()
}

/// What every worker shares.
pub struct Shared {
    pub rec: Arc<Recorder>,
    pub stop: AtomicBool,
    /// HTTPS API of every node.
    pub http: Vec<SocketAddr>,
    /// Plain MQTT of every node.
    pub mqtt: Vec<SocketAddr>,
    /// Node id of each entry of `http` and `mqtt`.
    pub node_ids: Vec<u64>,
    pub tls: Arc<rustls::ClientConfig>,
    pub owner_key: String,
    pub hostname: String,
    /// HTTP request timeout (an op still unanswered then is Unknown).
    pub timeout: Duration,
}

impl Shared {
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// Unique values: every write carries numbers no other write uses.
pub struct Values {
    base: i64,
    seq: i64,
}

impl Values {
    pub fn new(worker: u64) -> Values {
        Values { base: worker as i64 * 10_000_000, seq: 0 }
    }
    pub fn fresh(&mut self) -> i64 {
        self.seq += 1;
        self.base + self.seq
    }
}

/// A desired patch: one or two of a few keys, set to a fresh number, an object, or deleted (null).
fn desired_patch(rng: &mut StdRng, vals: &mut Values) -> Value {
    let keys = ["a", "b", "c", "d", "e"];
    let mut m = Map::new();
    for _ in 0..rng.gen_range(1..=2) {
        let k = keys[rng.gen_range(0..keys.len())];
        let roll: f64 = rng.gen();
        let v = if roll < 0.08 {
            Value::Null
        } else if roll < 0.18 {
            json!({"x": vals.fresh(), "y": {"z": vals.fresh()}})
        } else {
            json!(vals.fresh())
        };
        m.insert(k.to_string(), v);
    }
    Value::Object(m)
}

/// One HTTP back end: picks a twin of its group, an operation, and a node (it stays on one node until
/// that node fails it, then moves to another), records, repeats until stopped.
pub async fn http_worker(shared: Arc<Shared>, twins: Vec<String>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let client_id = shared.rec.client();
    let mut vals = Values::new(client_id);
    let mut node = rng.gen_range(0..shared.http.len());
    let mut http = HttpsClient::new(shared.http[node], shared.tls.clone(), &shared.hostname, &shared.owner_key);
    let mut etags: HashMap<String, String> = HashMap::new();
    while !shared.stopped() {
        let twin = twins[rng.gen_range(0..twins.len())].clone();
        let path = format!("/twins/{}", enc(&twin));
        let roll: f64 = rng.gen();
        let etag = etags.get(&twin).cloned();
        let (method, body, if_match, kind) = if roll < 0.40 {
            ("GET", None, None, OpKind::GetTwin)
        } else if roll < 0.70 || (roll < 0.85 && etag.is_none()) {
            let p = desired_patch(&mut rng, &mut vals);
            let body = json!({"properties": {"desired": p.clone()}});
            ("PATCH", Some(body), None, OpKind::PatchDesired { patch: p, if_match: None })
        } else if roll < 0.85 {
            let p = desired_patch(&mut rng, &mut vals);
            let body = json!({"properties": {"desired": p.clone()}});
            let im = format!("\"{}\"", etag.clone().unwrap_or_default());
            ("PATCH", Some(body), Some(im.clone()), OpKind::PatchDesired { patch: p, if_match: Some(im) })
        } else {
            let mut d = Map::new();
            d.insert("a".into(), json!(vals.fresh()));
            d.insert("r".into(), json!(vals.fresh()));
            if rng.gen_bool(0.5) {
                d.insert("c".into(), json!({"x": vals.fresh()}));
            }
            let tags = json!({"w": client_id});
            let desired = Value::Object(d);
            let body = json!({"tags": tags.clone(), "properties": {"desired": desired.clone()}});
            let im = if rng.gen_bool(0.5) { etag.clone().map(|e| format!("\"{e}\"")) } else { None };
            ("PUT", Some(body), im.clone(), OpKind::ReplaceTwin { desired, tags, if_match: im })
        };
        let mut headers = Vec::new();
        if let Some(im) = &if_match {
            headers.push(("if-match", im.clone()));
        }
        let raw = body.map(|b| serde_json::to_vec(&b).unwrap_or_default());
        let invoke = now_ns();
        let result = http.request(method, &path, raw, &headers, shared.timeout).await;
        let done = now_ns();
        let (outcome, complete) = classify(&result, done);
        if let Outcome::Ok { etag: Some(e), .. } = &outcome {
            etags.insert(twin.clone(), e.clone());
        }
        let moved =
            !matches!(outcome, Outcome::Ok { .. } | Outcome::Failed { status: 400..=499, .. }) || rng.gen_bool(0.03);
        shared.rec.push_via(
            Op { client: client_id, twin, invoke_ns: invoke, complete_ns: complete, kind, outcome, final_read: false },
            Some(shared.node_ids[node]),
        );
        if moved && shared.http.len() > 1 {
            let others: Vec<usize> = (0..shared.http.len()).filter(|i| *i != node).collect();
            node = others[rng.gen_range(0..others.len())];
            http.retarget(shared.http[node]);
            if result.is_err() {
                // Do not hammer a dead node: a short pause before the next attempt.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(10..60))).await;
    }
}

/// The final reads after healing: each twin read through every node (all recorded), the last one marked
/// `final_read`. Retries a read that fails until `deadline_ns`.
pub async fn final_reads(shared: Arc<Shared>, twin: String, first_node: usize, deadline: tokio::time::Instant) -> bool {
    let client_id = shared.rec.client();
    let n = shared.http.len();
    let path = format!("/twins/{}", enc(&twin));
    let mut marked = false;
    for k in 0..n {
        let node = (first_node + k) % n;
        let last = k == n - 1;
        let mut http = HttpsClient::new(shared.http[node], shared.tls.clone(), &shared.hostname, &shared.owner_key);
        loop {
            let invoke = now_ns();
            let result = http.request("GET", &path, None, &[], shared.timeout).await;
            let (outcome, complete) = classify(&result, now_ns());
            let ok = outcome.is_ok();
            shared.rec.push_via(
                Op {
                    client: client_id,
                    twin: twin.clone(),
                    invoke_ns: invoke,
                    complete_ns: complete,
                    kind: OpKind::GetTwin,
                    outcome,
                    final_read: ok && last,
                },
                Some(shared.node_ids[node]),
            );
            if ok {
                marked |= last;
                break;
            }
            if tokio::time::Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    marked
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::https::Response;
    use bytes::Bytes;

    fn resp(status: u16, body: &str) -> Result<Response, HttpError> {
        Ok(Response { status, body: Bytes::from(body.to_string()) })
    }

    #[test]
    fn outcomes_of_answers() {
        let twin = r#"{"deviceId":"d","etag":"AAAAAAAAAAs=","version":5,"properties":{"desired":{"a":1,"$metadata":{},"$version":3},"reported":{"$version":2}}}"#;
        let (o, c) = classify(&resp(200, twin), 7);
        assert_eq!(c, Some(7));
        match o {
            Outcome::Ok { version, desired_version, reported_version, etag, desired, reported } => {
                assert_eq!((version, desired_version, reported_version), (Some(5), Some(3), Some(2)));
                assert_eq!(etag.as_deref(), Some("AAAAAAAAAAs="));
                assert_eq!(desired, Some(json!({"a": 1})));
                assert_eq!(reported, Some(json!({})));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            classify(&resp(412, r#"{"Message":"ErrorCode:PreconditionFailed;x"}"#), 1).0,
            Outcome::Failed { status: 412, .. }
        ));
        assert!(matches!(classify(&resp(503, "{}"), 1), (Outcome::Unknown { .. }, Some(1))));
        assert!(matches!(classify(&resp(429, "{}"), 1).0, Outcome::Unknown { .. }));
        assert!(matches!(classify(&Err(HttpError::Sent("reset".into())), 1), (Outcome::Unknown { .. }, None)));
        assert!(matches!(classify(&Err(HttpError::NotSent("refused".into())), 1).0, Outcome::Failed { status: 0, .. }));
    }
}
