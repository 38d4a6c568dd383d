//! Randomized histories from the real state machine: a random sequential run of `ShardState::apply`
//! on one twin, each op given a random window around its point in that run (so the run is a valid
//! linearization), some answers lost (Unknown, applied or not), some refused (400, stale If-Match 412),
//! desired pushes from the apply events with random coalescing. The checker must pass all of these, and
//! fail each once one read is corrupted.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

use super::super::*;
use twinhub::ids::TwinId;
use twinhub::model::{self, Command, DeviceSpec, Event, IfMatch, Reply, RequestId, ShardState};

/// The device's MQTT connection: reported patches, device GETs and pushes.
const DEVICE: u64 = 100;
const STEP: u64 = 1_000;

struct Gen {
    rng: StdRng,
    state: ShardState,
    id: TwinId,
    name: String,
    req: u128,
    ops: Vec<Op>,
    /// Etags answers have shown, for If-Match (some stale by the time they are used).
    etags: Vec<String>,
    /// (receive time, desired version, patch) of pushes not yet delivered.
    pushes: Vec<(u64, i64, Value)>,
    /// How far a window may reach either side of its op's point.
    spread: u64,
}

fn compose(first: &Value, then: &Value) -> Value {
    match (first, then) {
        (Value::Object(a), Value::Object(b)) => {
            let mut out = a.clone();
            for (k, v) in b {
                let merged = match (out.get(k), v) {
                    (Some(old @ Value::Object(_)), Value::Object(_)) => compose(old, v),
                    _ => v.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (_, v) => v.clone(),
    }
}

fn twin_answer(doc: &Value) -> Outcome {
    let props = &doc["properties"];
    Outcome::Ok {
        version: doc["version"].as_i64(),
        desired_version: props["desired"]["$version"].as_i64(),
        reported_version: props["reported"]["$version"].as_i64(),
        etag: doc["etag"].as_str().map(String::from),
        desired: Some(props["desired"].clone()),
        reported: Some(props["reported"].clone()),
    }
}

fn device_answer(props: &Value) -> Outcome {
    Outcome::Ok {
        version: None,
        desired_version: props["desired"]["$version"].as_i64(),
        reported_version: props["reported"]["$version"].as_i64(),
        etag: None,
        desired: Some(props["desired"].clone()),
        reported: Some(props["reported"].clone()),
    }
}

impl Gen {
    fn new(seed: u64, device: &str, spread: u64) -> Gen {
        let mut g = Gen {
            rng: StdRng::seed_from_u64(seed),
            state: ShardState::default(),
            id: TwinId::device(device),
            name: device.to_string(),
            req: 0,
            ops: Vec::new(),
            etags: Vec::new(),
            pushes: Vec::new(),
            spread,
        };
        let spec = DeviceSpec::test_sas(device);
        let created = g.apply(model::Op::PutDevice { device: spec, if_match: None });
        assert!(created.result.is_ok());
        g
    }

    fn apply(&mut self, op: model::Op) -> model::Applied {
        self.req += 1;
        self.state.apply(&Command {
            request_id: RequestId(self.req),
            timestamp_ms: 1_700_000_000_000 + self.req as i64,
            op,
        })
    }

    fn value(&mut self, depth: u32) -> Value {
        match self.rng.gen_range(0..100) {
            0..=44 => json!(self.rng.gen_range(0..4)),
            45..=59 => Value::Null,
            60..=84 if depth == 0 => {
                let mut m = Map::new();
                for k in ["x", "y"] {
                    if self.rng.gen_bool(0.7) {
                        m.insert(k.into(), self.value(depth + 1));
                    }
                }
                Value::Object(m)
            }
            85..=92 => json!([self.rng.gen_range(0..3), null]),
            _ => json!(format!("s{}", self.rng.gen_range(0..3))),
        }
    }

    fn patch(&mut self) -> Value {
        let mut m = Map::new();
        while m.is_empty() {
            for k in ["a", "b", "c", "d"] {
                if self.rng.gen_bool(0.4) {
                    m.insert(k.into(), self.value(0));
                }
            }
        }
        Value::Object(m)
    }

    fn window(&mut self, point: u64) -> (u64, u64) {
        (point.saturating_sub(self.rng.gen_range(0..=self.spread)), point + self.rng.gen_range(0..=self.spread))
    }

    fn record(&mut self, client: u64, window: (u64, u64), kind: OpKind, outcome: Outcome) {
        let complete = match outcome {
            Outcome::Unknown { .. } if self.rng.gen_bool(0.5) => None,
            _ => Some(window.1),
        };
        self.ops.push(Op {
            client,
            twin: self.name.clone(),
            invoke_ns: window.0,
            complete_ns: complete,
            kind,
            outcome,
            final_read: false,
        });
    }

    fn remember(&mut self, outcome: &Outcome) {
        if let Outcome::Ok { etag: Some(e), .. } = outcome {
            self.etags.push(e.clone());
        }
    }

    fn pushes_from(&mut self, events: &[Event], point: u64) {
        for e in events {
            if let Event::DesiredPatch { patch, desired_version, .. } = e {
                self.pushes.push((point + STEP / 2, *desired_version, patch.to_value()));
            }
        }
    }

    /// One op at sequential point `point`.
    fn step(&mut self, point: u64) {
        let window = self.window(point);
        let r = self.rng.gen_range(0..100);
        if r >= 57 {
            let lost = self.rng.gen_bool(0.05);
            let (client, kind, outcome) = if r < 78 {
                let doc = self.state.twin(&self.id).unwrap_or_default();
                (self.rng.gen_range(1..=4), OpKind::GetTwin, twin_answer(&doc))
            } else {
                let props = self.state.twin_properties(&self.id).unwrap_or_default();
                (DEVICE, OpKind::DeviceGet, device_answer(&props))
            };
            self.remember(&outcome);
            let outcome = if lost { Outcome::Unknown { reason: "reset".into() } } else { outcome };
            self.record(client, window, kind, outcome);
            return;
        }
        // A write: its fate first.
        let fate = self.rng.gen_range(0..100);
        let (lost_applied, lost_not_applied, refused) = (fate < 8, (8..15).contains(&fate), (15..18).contains(&fate));
        let client = if r >= 32 { DEVICE } else { self.rng.gen_range(1..=4) };
        let body = self.patch();
        let (kind, cmd) = if r < 25 {
            let if_match = if self.rng.gen_bool(0.25) {
                let current = self.state.twin_etag(&self.id).unwrap_or_default();
                let e = if self.etags.is_empty() || self.rng.gen_bool(0.5) {
                    current
                } else {
                    self.etags[self.rng.gen_range(0..self.etags.len())].clone()
                };
                Some(e)
            } else {
                None
            };
            let cmd = model::Op::UpdateTwin {
                id: self.id.clone(),
                patch_json: json!({"properties": {"desired": body}}).to_string(),
                if_match: if_match.clone().map(IfMatch::Etag),
            };
            (OpKind::PatchDesired { patch: body, if_match }, cmd)
        } else if r < 32 {
            let cmd = model::Op::ReplaceTwin {
                id: self.id.clone(),
                twin_json: json!({"tags": {}, "properties": {"desired": body}}).to_string(),
                if_match: None,
            };
            (OpKind::ReplaceTwin { desired: body, tags: json!({}), if_match: None }, cmd)
        } else {
            let cmd = model::Op::UpdateReported { id: self.id.clone(), patch_json: body.to_string() };
            (OpKind::PatchReported { patch: body }, cmd)
        };
        if lost_not_applied {
            self.record(client, window, kind, Outcome::Unknown { reason: "timeout".into() });
            return;
        }
        if refused {
            self.record(client, window, kind, Outcome::Failed { status: 400, message: "refused".into() });
            return;
        }
        let applied = self.apply(cmd);
        self.pushes_from(&applied.events, point);
        let outcome = match applied.result {
            Ok(Reply::Twin(doc)) => twin_answer(&doc.to_value()),
            Ok(Reply::Reported { version }) => Outcome::Ok {
                version: None,
                desired_version: None,
                reported_version: Some(version),
                etag: None,
                desired: None,
                reported: None,
            },
            Ok(other) => panic!("unexpected reply {other:?}"),
            Err(model::TwinError::PreconditionFailed(m)) => Outcome::Failed { status: 412, message: m },
            Err(e) => panic!("unexpected rejection {e}"),
        };
        self.remember(&outcome);
        let outcome = if lost_applied { Outcome::Unknown { reason: "timeout".into() } } else { outcome };
        self.record(client, window, kind, outcome);
    }

    /// Runs `n` ops, then the final reads; returns the ops (sorted by invoke, as a runner would log them).
    fn run(mut self, n: u64) -> Vec<Op> {
        // The device subscribes and reads first.
        let props = self.state.twin_properties(&self.id).unwrap_or_default();
        self.record(DEVICE, (1, 2), OpKind::DeviceGet, device_answer(&props));
        for i in 0..n {
            self.step(STEP * (i + 3));
        }
        // Coalescing: some pushes are folded into the next one (never the last).
        let mut pushes: Vec<(u64, i64, Value)> = Vec::new();
        for p in std::mem::take(&mut self.pushes) {
            match pushes.last_mut() {
                Some(prev) if self.rng.gen_bool(0.25) => *prev = (p.0, p.1, compose(&prev.2, &p.2)),
                _ => pushes.push(p),
            }
        }
        for (at, v, patch) in pushes {
            self.ops.push(Op {
                client: DEVICE,
                twin: self.name.clone(),
                invoke_ns: at,
                complete_ns: Some(at),
                kind: OpKind::Push { desired_version: v, patch },
                outcome: Outcome::ok(),
                final_read: false,
            });
        }
        let end = STEP * (n + 10) + 2 * self.spread;
        let doc = self.state.twin(&self.id).unwrap_or_default();
        let props = self.state.twin_properties(&self.id).unwrap_or_default();
        self.record(1, (end, end + 10), OpKind::GetTwin, twin_answer(&doc));
        self.record(DEVICE, (end, end + 10), OpKind::DeviceGet, device_answer(&props));
        let k = self.ops.len();
        self.ops[k - 1].final_read = true;
        self.ops[k - 2].final_read = true;
        self.ops.sort_by_key(|o| o.invoke_ns);
        self.ops
    }
}

fn history_of(twins: &[(&str, u64, u64)], seed: u64, spread: u64) -> History {
    let mut h = History::default();
    for (k, &(name, n, salt)) in twins.iter().enumerate() {
        h.ops.extend(Gen::new(seed * 1000 + salt + k as u64, name, spread).run(n));
        h.initial.insert(name.to_string(), TwinState::fresh());
    }
    h.ops.sort_by_key(|o| o.invoke_ns);
    h
}

#[test]
fn test_random_valid_histories_pass() {
    for seed in 0..40 {
        let h = history_of(&[("dev-a", 80, 1), ("dev-b", 40, 2)], seed, 2_500);
        let r = check(&h);
        assert!(r.is_ok(), "seed {seed}:\n{}", r.summary());
        assert_eq!(r.twins_checked, 2);
    }
}

#[test]
fn test_random_histories_survive_json() {
    let h = history_of(&[("dev-a", 60, 1)], 7, 2_500);
    let text = h.to_json().unwrap_or_default();
    let back = History::from_json(&text).unwrap_or_default();
    assert_eq!(back, h);
    assert!(check(&back).is_ok());
}

/// Corrupts one answered read, by `seed % 4`:
/// - 0: the twin version off by one (a `GetTwin`; else as 1);
/// - 1: a key no write ever set;
/// - 2: the whole answer of an older `GetTwin`, chosen so that an answer pinned at a newer version
///   completed before the corrupted read was sent (so the old state is provably gone);
/// - 3: the desired document of another read at another desired version, its own versions kept (only
///   the search can tell: every value in it was written by someone).
fn corrupt(h: &mut History, seed: u64) -> usize {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xC0FFEE);
    let answered = |o: &Op| o.outcome.is_ok() && o.complete_ns.is_some();
    let version = |o: &Op| match o.outcome {
        Outcome::Ok { version, .. } => version,
        _ => None,
    };
    let desired = |o: &Op| match &o.outcome {
        Outcome::Ok { desired_version: Some(dv), desired: Some(d), .. } => {
            Some((*dv, super::super::model::section_of(d)))
        }
        _ => None,
    };
    if seed % 4 == 2 {
        let gets: Vec<usize> =
            (0..h.ops.len()).filter(|&i| matches!(h.ops[i].kind, OpKind::GetTwin) && answered(&h.ops[i])).collect();
        let mut pairs = Vec::new();
        for &i in &gets {
            for &j in &gets {
                let (Some(vi), Some(vj)) = (version(&h.ops[i]), version(&h.ops[j])) else { continue };
                let newer_done = h.ops.iter().any(|o| {
                    answered(o) && version(o).is_some_and(|v| v > vj) && o.complete_ns < Some(h.ops[i].invoke_ns)
                });
                if vj < vi && newer_done {
                    pairs.push((i, j));
                }
            }
        }
        if !pairs.is_empty() {
            let (i, j) = pairs[rng.gen_range(0..pairs.len())];
            h.ops[i].outcome = h.ops[j].outcome.clone();
            return i;
        }
    }
    if seed % 4 == 3 {
        let reads: Vec<usize> = (0..h.ops.len()).filter(|&i| h.ops[i].kind.is_read() && answered(&h.ops[i])).collect();
        let mut pairs = Vec::new();
        for &i in &reads {
            for &j in &reads {
                if let (Some((dvi, di)), Some((dvj, dj))) = (desired(&h.ops[i]), desired(&h.ops[j])) {
                    if dvi != dvj && di != dj {
                        pairs.push((i, j));
                    }
                }
            }
        }
        if !pairs.is_empty() {
            let (i, j) = pairs[rng.gen_range(0..pairs.len())];
            let other = match &h.ops[j].outcome {
                Outcome::Ok { desired, .. } => desired.clone(),
                _ => None,
            };
            if let Outcome::Ok { desired, .. } = &mut h.ops[i].outcome {
                *desired = other;
            }
            return i;
        }
    }
    let reads: Vec<usize> = (0..h.ops.len()).filter(|&i| h.ops[i].kind.is_read() && answered(&h.ops[i])).collect();
    let i = reads[rng.gen_range(0..reads.len())];
    let by_version = seed.is_multiple_of(4) && matches!(h.ops[i].kind, OpKind::GetTwin);
    if let Outcome::Ok { version, desired, .. } = &mut h.ops[i].outcome {
        if by_version {
            *version = version.map(|v| v + 1);
        } else if let Some(Value::Object(d)) = desired {
            d.insert("zz".into(), json!(999));
        }
    }
    i
}

#[test]
fn test_random_histories_with_one_corrupted_read_fail() {
    let cfg = CheckConfig::default();
    for seed in 0..40 {
        let mut h = history_of(&[("dev-a", 60, 1)], seed, 2_500);
        let bad = corrupt(&mut h, seed);
        let r = check_with(&h, &cfg);
        assert!(r.has(ViolationKind::NotLinearizable), "seed {seed}, corrupted #{bad}:\n{}", r.summary());
        let core = r.of_kind(ViolationKind::NotLinearizable).next().map(|v| v.ops.clone()).unwrap_or_default();
        assert!(
            core.contains(&bad),
            "seed {seed}: the shrunk history {core:?} should contain #{bad}:\n{}",
            r.summary()
        );
        assert!(core.len() <= 3, "seed {seed}: shrunk to {} ops:\n{}", core.len(), r.summary());
    }
}

#[test]
fn test_large_random_history_passes_in_time() {
    let started = std::time::Instant::now();
    let h = history_of(&[("dev-big", 3_000, 1)], 42, 8_000);
    let r = check(&h);
    assert!(r.is_ok(), "{}", r.summary());
    assert!(started.elapsed().as_secs() < 60, "took {:?}", started.elapsed());
}
