//! The hub as subscribers see it, and property tests of coalescing driven by the real model: random
//! command sequences are applied by `ShardState`, their events go through the queues with random
//! interleavings of takes, and the subscriber's document must end equal to the committed twin.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

use super::coalesce::{apply_patch, merge_metadata, section_patch};
use super::event::{change_of, Kind};
use super::queue::{Change, FeedQueue, Offered, PushQueue};
use super::*;
use crate::model::{Command, DeviceSpec, Op, RequestId, ShardState};

// ------------------------------------------------------------------------------------------------
// A small model driver

struct Model {
    state: ShardState,
    clock: i64,
    req: u128,
}

fn device_spec(id: &str) -> DeviceSpec {
    DeviceSpec::test_sas(id)
}

impl Model {
    fn new() -> Model {
        Model { state: ShardState::default(), clock: 1_700_000_000_000, req: 0 }
    }

    fn apply(&mut self, op: Op) -> Vec<Event> {
        self.req += 1;
        self.clock += 7;
        let a = self.state.apply(&Command { request_id: RequestId(self.req), timestamp_ms: self.clock, op });
        a.events
    }

    fn create(&mut self, id: &str) -> Vec<Event> {
        self.apply(Op::PutDevice { device: device_spec(id), if_match: None })
    }
}

fn random_value(rng: &mut StdRng, depth: u32) -> Value {
    match rng.gen_range(0..10) {
        0 | 1 => Value::Null,
        2 => json!(rng.gen_range(0..5)),
        3 => json!(format!("s{}", rng.gen_range(0..3))),
        4 => json!([rng.gen_range(0..3), "x"]),
        5 => json!(rng.gen_bool(0.5)),
        _ if depth < 3 => random_patch(rng, depth + 1),
        _ => json!(rng.gen_range(0..5)),
    }
}

/// A merge patch over a small key space, so that keys collide, nest, vanish and come back.
fn random_patch(rng: &mut StdRng, depth: u32) -> Value {
    let mut m = Map::new();
    for _ in 0..rng.gen_range(1..4) {
        let k = ["a", "b", "c", "d"][rng.gen_range(0..4)];
        m.insert(k.into(), random_value(rng, depth));
    }
    Value::Object(m)
}

/// A random command for twin `id`; `None` when it picked an identity operation that does not apply.
fn random_op(rng: &mut StdRng, id: &TwinId) -> Op {
    let roll = rng.gen_range(0..100);
    let t = || id.clone();
    match roll {
        0..=29 => Op::UpdateTwin {
            id: t(),
            patch_json: json!({"properties": {"desired": random_patch(rng, 1)}}).to_string(),
            if_match: None,
        },
        30..=44 => {
            Op::UpdateTwin { id: t(), patch_json: json!({"tags": random_patch(rng, 1)}).to_string(), if_match: None }
        }
        45..=54 => Op::UpdateTwin {
            id: t(),
            patch_json: json!({"tags": random_patch(rng, 1), "properties": {"desired": random_patch(rng, 1)}})
                .to_string(),
            if_match: None,
        },
        55..=74 => Op::UpdateReported { id: t(), patch_json: random_patch(rng, 1).to_string() },
        75..=79 => Op::ReplaceTwin {
            id: t(),
            twin_json: json!({"tags": random_patch(rng, 2), "properties": {"desired": random_patch(rng, 2)}})
                .to_string(),
            if_match: None,
        },
        80..=81 => {
            Op::UpdateTwin { id: t(), patch_json: json!({"properties": {"desired": null}}).to_string(), if_match: None }
        }
        82..=83 => Op::UpdateTwin { id: t(), patch_json: json!({"tags": null}).to_string(), if_match: None },
        84..=93 => Op::SetConnectionState { id: t(), connected: rng.gen_bool(0.5) },
        _ => Op::DeleteDevice { device_id: id.device_id.clone(), if_match: None },
    }
}

// ------------------------------------------------------------------------------------------------
// A back-end consumer: keeps what it learnt of each twin and applies the events it receives

/// What a consumer knows of a twin: the parts a change event can carry.
#[derive(Clone, Debug, PartialEq)]
struct Doc {
    version: i64,
    tags: Map<String, Value>,
    desired: Map<String, Value>,
    reported: Map<String, Value>,
}

fn obj_at(v: &Value, ptr: &str) -> Map<String, Value> {
    v.pointer(ptr).and_then(Value::as_object).cloned().unwrap_or_default()
}

impl Doc {
    fn of_twin(twin: &Value) -> Doc {
        Doc {
            version: twin["version"].as_i64().expect("twin version"),
            tags: obj_at(twin, "/tags"),
            desired: obj_at(twin, "/properties/desired"),
            reported: obj_at(twin, "/properties/reported"),
        }
    }

    fn apply_update(&mut self, body: &Value) {
        self.version = body["version"].as_i64().expect("change version");
        if let Some(t) = body.get("tags").and_then(Value::as_object) {
            apply_patch(&mut self.tags, t);
        }
        for (name, section) in [("desired", &mut self.desired), ("reported", &mut self.reported)] {
            let Some(s) = body.pointer(&format!("/properties/{name}")).and_then(Value::as_object) else { continue };
            let patch = section_patch(s);
            apply_patch(section, &patch);
            let mut meta = section.get("$metadata").and_then(Value::as_object).cloned().unwrap_or_default();
            merge_metadata(&mut meta, &patch, s.get("$metadata").and_then(Value::as_object).unwrap_or(&Map::new()));
            // Keep `$metadata` and `$version` after the members, like the twin renders them.
            section.remove("$metadata");
            section.remove("$version");
            section.insert("$metadata".into(), Value::Object(meta));
            if let Some(v) = s.get("$version") {
                section.insert("$version".into(), v.clone());
            }
        }
    }
}

#[derive(Default)]
struct Consumer {
    docs: HashMap<TwinId, Option<Doc>>,
    /// Last version delivered per twin since the last resync or lifecycle event.
    last_version: HashMap<TwinId, i64>,
    last_seq: u64,
    delivered: usize,
    resynced: bool,
}

impl Consumer {
    fn receive(&mut self, c: &Change) {
        assert!(c.seq > self.last_seq, "positions must strictly increase: {} after {}", c.seq, self.last_seq);
        self.last_seq = c.seq;
        self.delivered += 1;
        assert_eq!(c.event.position, format!("e-{}", c.seq));
        match c.kind {
            Kind::Lifecycle => {
                self.last_version.remove(&c.twin);
                let doc = match c.event.property("opType") {
                    Some("createDeviceIdentity") | Some("createModuleIdentity") => {
                        Some(Doc::of_twin(&c.event.body.to_value()))
                    }
                    _ => None,
                };
                self.docs.insert(c.twin.clone(), doc);
            }
            Kind::Connection => {}
            Kind::Update | Kind::Replace => {
                let v = c.event.version().expect("a twin change carries its version");
                if let Some(last) = self.last_version.get(&c.twin) {
                    assert!(v > *last, "{}: version {v} delivered after {last}", c.twin);
                }
                self.last_version.insert(c.twin.clone(), v);
                let Some(doc) = self.docs.get_mut(&c.twin).and_then(Option::as_mut) else {
                    // Only a re-read after a resync can be ahead of a pending change (the twin was
                    // deleted since); without one, every change follows its twin's create event.
                    assert!(self.resynced, "a change of an unknown twin: {c:?}");
                    return;
                };
                // After a resync the re-read document may already be newer than a pending change.
                if v <= doc.version {
                    return;
                }
                if c.kind == Kind::Replace {
                    *doc = Doc::of_twin(&c.event.body.to_value());
                } else {
                    doc.apply_update(&c.event.body.to_value());
                }
            }
        }
    }

    /// What a consumer does on `Resync`: re-read every twin it cares about.
    fn resync(&mut self, state: &ShardState, twins: &[TwinId]) {
        self.last_version.clear();
        self.resynced = true;
        for t in twins {
            self.docs.insert(t.clone(), state.twin(t).ok().map(|v| Doc::of_twin(&v)));
        }
    }
}

fn feed_change(seq: u64, e: &Event) -> Option<Arc<Change>> {
    Some(Arc::new(change_of(e.clone(), "hub", 0)?.place(seq, format!("e-{seq}"))))
}

/// One random run of the feed property; returns (events published, events delivered, resyncs).
fn feed_run(seed: u64, capacity: usize, steps: usize) -> (usize, usize, usize) {
    let mut rng = StdRng::seed_from_u64(seed);
    let twins = [TwinId::device("t1"), TwinId::device("t2"), TwinId::device("t3")];
    let mut model = Model::new();
    let mut consumer = Consumer::default();
    let mut queue = FeedQueue::new(capacity);
    let mut seq = 0u64;
    let mut resyncs = 0;
    let mut published = 0;
    let mut resync_at: Option<u64> = None;
    // The consumer starts knowing nothing: every twin is unknown until its create event.
    let take_bias = rng.gen_range(0.05..0.6);
    for _ in 0..steps {
        let twin = &twins[rng.gen_range(0..twins.len())];
        let events = if model.state.twin(twin).is_err() {
            model.create(&twin.device_id)
        } else {
            model.apply(random_op(&mut rng, twin))
        };
        for e in &events {
            seq += 1;
            let Some(c) = feed_change(seq, e) else { continue };
            published += 1;
            if queue.offer(c) == Offered::Overflow {
                resyncs += 1;
                assert!(queue.is_empty(), "an overflowed queue starts over");
                resync_at = Some(seq);
            }
        }
        while rng.gen_bool(take_bias) {
            // The resync is delivered first; the consumer re-reads the state as it is *then*.
            if let Some(at) = resync_at.take() {
                consumer.resync(&model.state, &twins);
                consumer.last_seq = at;
                continue;
            }
            match queue.take() {
                Some(c) => consumer.receive(&c),
                None => break,
            }
        }
    }
    if resync_at.take().is_some() {
        consumer.resync(&model.state, &twins);
    }
    while let Some(c) = queue.take() {
        consumer.receive(&c);
    }
    for t in &twins {
        let expected = model.state.twin(t).ok().map(|v| Doc::of_twin(&v));
        let got = consumer.docs.get(t).cloned().flatten();
        assert_eq!(got, expected, "seed {seed}: consumer's view of {t} differs from the committed twin");
    }
    (published, consumer.delivered, resyncs)
}

#[test]
fn feed_coalescing_reaches_the_committed_state_with_increasing_versions() {
    let (mut published, mut delivered, mut resyncs) = (0, 0, 0);
    for seed in 0..200 {
        let capacity = if seed % 3 == 0 { 4 } else { 1000 };
        let (p, d, r) = feed_run(seed, capacity, 150);
        published += p;
        delivered += d;
        resyncs += r;
    }
    // The runs must actually exercise coalescing and overflow, or they prove nothing.
    assert!(delivered * 10 < published * 9, "too little coalescing: {delivered} of {published}");
    assert!(resyncs > 10, "overflow path not exercised: {resyncs}");
}

/// A device connection's view of desired properties, fed by a `PushQueue`.
#[test]
fn desired_pushes_reach_the_committed_desired_state() {
    let mut merged_total = 0;
    let mut overflows = 0;
    for seed in 0..200 {
        let mut rng = StdRng::seed_from_u64(seed);
        let id = TwinId::device("d");
        let mut model = Model::new();
        model.create("d");
        let capacity = if seed % 2 == 0 { 2 } else { 64 };
        let read = |m: &Model| {
            let t = m.state.twin(&id).unwrap();
            (
                t["properties"]["desired"]["$version"].as_i64().unwrap(),
                section_patch(&obj_at(&t, "/properties/desired")),
            )
        };
        // Connect: register, then read the twin (the device flow of docs/iothub-protocol.md §1.6).
        let mut queue = PushQueue::new(capacity);
        let (mut version, mut doc) = read(&model);
        let mut last_taken = i64::MIN;
        for _ in 0..120 {
            let op = match rng.gen_range(0..10) {
                0 => Op::ReplaceTwin {
                    id: id.clone(),
                    twin_json: json!({"properties": {"desired": random_patch(&mut rng, 2)}}).to_string(),
                    if_match: None,
                },
                1 => Op::UpdateTwin {
                    id: id.clone(),
                    patch_json: json!({"tags": random_patch(&mut rng, 1)}).to_string(),
                    if_match: None,
                },
                _ => Op::UpdateTwin {
                    id: id.clone(),
                    patch_json: json!({"properties": {"desired": random_patch(&mut rng, 1)}}).to_string(),
                    if_match: None,
                },
            };
            for e in model.apply(op) {
                if let Event::DesiredPatch { patch, desired_version, .. } = e {
                    if queue.offer(&patch.to_value(), desired_version) == Offered::Overflow {
                        overflows += 1;
                    }
                }
            }
            if queue.overflowed() {
                // The connection closes; the device reconnects, registers again and re-reads.
                queue = PushQueue::new(capacity);
                (version, doc) = read(&model);
                last_taken = i64::MIN;
                continue;
            }
            while rng.gen_bool(0.3) {
                let Some(p) = queue.take() else { break };
                assert!(p.version > last_taken, "push versions must increase");
                last_taken = p.version;
                merged_total += p.merged as usize - 1;
                let body: Value = serde_json::from_slice(&p.body).unwrap();
                assert_eq!(body["$version"].as_i64(), Some(p.version));
                if p.version > version {
                    apply_patch(&mut doc, &section_patch(body.as_object().unwrap()));
                    version = p.version;
                }
            }
        }
        while let Some(p) = queue.take() {
            let body: Value = serde_json::from_slice(&p.body).unwrap();
            assert!(p.version > last_taken);
            last_taken = p.version;
            if p.version > version {
                apply_patch(&mut doc, &section_patch(body.as_object().unwrap()));
                version = p.version;
            }
        }
        let (v, expected) = read(&model);
        assert_eq!(version, v, "seed {seed}: final desired version");
        assert_eq!(doc, expected, "seed {seed}: device's desired properties");
    }
    assert!(merged_total > 100, "coalescing not exercised: {merged_total}");
    assert!(overflows > 5, "overflow not exercised: {overflows}");
}

// ------------------------------------------------------------------------------------------------
// The hub

fn hub() -> Arc<Hub> {
    Hub::new(HubConfig::new("myhub.example.com"))
}

fn hub_with(f: impl FnOnce(&mut HubConfig)) -> Arc<Hub> {
    let mut c = HubConfig::new("myhub.example.com");
    f(&mut c);
    Hub::new(c)
}

async fn next_push(p: &mut DesiredPushes) -> Option<DesiredPush> {
    tokio::time::timeout(Duration::from_secs(5), p.next()).await.expect("push within 5 s")
}

async fn next_item(f: &mut ChangeFeed) -> Option<FeedItem> {
    tokio::time::timeout(Duration::from_secs(5), f.next()).await.expect("feed item within 5 s")
}

async fn next_event(f: &mut ChangeFeed) -> Arc<ChangeEvent> {
    match next_item(f).await {
        Some(FeedItem::Event(e)) => e,
        other => panic!("expected an event, got {other:?}"),
    }
}

async fn assert_idle<T: std::fmt::Debug>(fut: impl std::future::Future<Output = T>) {
    if let Ok(v) = tokio::time::timeout(Duration::from_millis(50), fut).await {
        panic!("expected nothing, got {v:?}");
    }
}

fn desired(id: &TwinId, v: i64, patch: Value) -> Event {
    let mut p = patch.as_object().cloned().unwrap();
    p.insert("$version".into(), json!(v));
    Event::DesiredPatch { id: id.clone(), patch: JsonText::render(&Value::Object(p)), desired_version: v }
}

fn tags_change(id: &TwinId, v: i64, tags: Value) -> Event {
    Event::TwinChanged {
        id: id.clone(),
        op_type: "updateTwin".into(),
        body: JsonText::render(&json!({"version": v, "tags": tags})),
        version: v,
    }
}

#[tokio::test]
async fn desired_pushes_go_to_every_registration_of_the_identity_only() {
    let hub = hub();
    let d1 = TwinId::device("d1");
    let mut a = hub.desired_pushes(&d1);
    let mut b = hub.desired_pushes(&d1);
    let mut other = hub.desired_pushes(&TwinId::module("d1", "m"));
    assert_eq!(hub.connected_devices(), 2);
    hub.publish(0, vec![desired(&d1, 2, json!({"x": 1}))]);
    for p in [&mut a, &mut b] {
        let got = next_push(p).await.unwrap();
        assert_eq!((got.version, got.merged), (2, 1));
        assert_eq!(serde_json::from_slice::<Value>(&got.body).unwrap(), json!({"x": 1, "$version": 2}));
    }
    assert_idle(other.next()).await;
    drop(b);
    assert_eq!(hub.connected_devices(), 2);
    drop(a);
    assert_eq!(hub.connected_devices(), 1);
    drop(other);
    assert_eq!(hub.connected_devices(), 0);
}

#[tokio::test]
async fn pending_pushes_coalesce_and_stale_versions_are_dropped() {
    let hub = hub();
    let d = TwinId::device("d");
    let mut p = hub.desired_pushes(&d);
    hub.publish(0, vec![desired(&d, 2, json!({"a": 1}))]);
    hub.publish(0, vec![desired(&d, 3, json!({"b": 1}))]);
    hub.publish(0, vec![desired(&d, 3, json!({"c": 1}))]);
    let got = next_push(&mut p).await.unwrap();
    assert_eq!((got.version, got.merged), (3, 2));
    assert_eq!(serde_json::from_slice::<Value>(&got.body).unwrap(), json!({"a": 1, "b": 1, "$version": 3}));
    hub.publish(0, vec![desired(&d, 1, json!({"old": 1}))]);
    assert_idle(p.next()).await;
}

#[tokio::test]
async fn push_overflow_ends_the_registration() {
    let hub = hub_with(|c| c.device_queue = 2);
    let d = TwinId::device("d");
    let mut p = hub.desired_pushes(&d);
    hub.publish(0, vec![desired(&d, 2, json!({"o": 1}))]);
    hub.publish(0, vec![desired(&d, 3, json!({"o": {"x": 1}}))]);
    hub.publish(0, vec![desired(&d, 4, json!({"o": null}))]);
    hub.publish(0, vec![desired(&d, 5, json!({"o": {"y": 1}}))]);
    assert_eq!(next_push(&mut p).await, None);
    assert_eq!(next_push(&mut p).await, None);
    // A new connection of the same identity starts clean.
    let mut again = hub.desired_pushes(&d);
    hub.publish(0, vec![desired(&d, 6, json!({"z": 1}))]);
    assert_eq!(next_push(&mut again).await.unwrap().version, 6);
}

#[tokio::test]
async fn close_wakes_every_waiter_with_none() {
    let hub = hub();
    let mut p = hub.desired_pushes(&TwinId::device("d"));
    let mut f = hub.changes(None);
    let (h1, h2) = (tokio::spawn(async move { p.next().await }), tokio::spawn(async move { f.next().await }));
    tokio::time::sleep(Duration::from_millis(20)).await;
    hub.close();
    assert_eq!(tokio::time::timeout(Duration::from_secs(5), h1).await.unwrap().unwrap(), None);
    assert_eq!(tokio::time::timeout(Duration::from_secs(5), h2).await.unwrap().unwrap(), None);
    // Publishing after close is ignored, and new subscribers end at once.
    hub.publish(0, vec![tags_change(&TwinId::device("d"), 2, json!({}))]);
    assert_eq!(hub.changes(None).next().await, None);
}

#[tokio::test]
async fn change_events_carry_iot_hub_properties_and_positions() {
    let hub = hub();
    let mut f = hub.changes(None);
    let m = TwinId::module("d1", "m1");
    hub.publish(
        0,
        vec![
            Event::Lifecycle {
                id: m.clone(),
                op_type: "createModuleIdentity".into(),
                body: json!({"deviceId": "d1", "moduleId": "m1"}),
            },
            tags_change(&m, 2, json!({"a": 1})),
            desired(&m, 2, json!({"x": 1})),
            Event::Connection { id: TwinId::device("d1"), connected: true },
        ],
    );
    let l = next_event(&mut f).await;
    assert_eq!(l.source, Source::DeviceLifecycleEvents);
    assert_eq!(l.property("opType"), Some("createModuleIdentity"));
    assert_eq!(l.property("moduleId"), Some("m1"));
    assert_eq!(l.property("hubName"), Some("myhub"));
    let t = next_event(&mut f).await;
    assert_eq!(t.source, Source::TwinChangeEvents);
    assert_eq!(t.property("iothub-message-schema"), Some("twinChangeNotification"));
    assert_eq!(t.body.to_value(), json!({"version": 2, "tags": {"a": 1}}));
    let c = next_event(&mut f).await;
    assert_eq!(c.property("opType"), Some("deviceConnected"));
    let (epoch, seq) = c.position.rsplit_once('-').unwrap();
    assert_eq!(seq, "3", "the desired patch is not a feed event");
    assert_eq!(c.body.to_value()["sequenceNumber"], format!("{:064X}", 3));
    assert_eq!(l.position, format!("{epoch}-1"));
    assert_eq!(t.position, format!("{epoch}-2"));
    assert_eq!(hub.head(), c.position);
    let ts = t.property("operationTimestamp").unwrap();
    assert!(ts.len() == 24 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T', "{ts}");
}

#[tokio::test]
async fn busy_consumer_gets_one_merged_change_at_the_newest_position() {
    let hub = hub();
    let mut f = hub.changes(None);
    let d = TwinId::device("d");
    for v in 2..=10 {
        hub.publish(0, vec![tags_change(&d, v, json!({ format!("k{v}"): v }))]);
    }
    let e = next_event(&mut f).await;
    assert_eq!(e.merged, 9);
    assert_eq!(e.body.to_value()["version"], 10);
    assert_eq!(e.body.to_value()["tags"].as_object().unwrap().len(), 9);
    assert!(e.position.ends_with("-9"));
    assert_idle(f.next()).await;
}

#[tokio::test]
async fn a_batch_takes_what_is_ready_in_order_up_to_its_bound_and_shares_the_events() {
    let hub = hub();
    let mut batched = hub.changes(None);
    let mut single = hub.changes(None);
    let twins: Vec<TwinId> = (0..5).map(|i| TwinId::device(format!("t{i}"))).collect();
    for t in &twins {
        hub.publish(0, vec![tags_change(t, 2, json!({"k": 1}))]);
    }
    let mut out = Vec::new();
    assert!(tokio::time::timeout(Duration::from_secs(5), batched.next_batch(&mut out, 3)).await.unwrap());
    let ids = |items: &[FeedItem]| -> Vec<String> {
        items
            .iter()
            .map(|i| match i {
                FeedItem::Event(e) => e.device_id.clone(),
                other => panic!("expected an event, got {other:?}"),
            })
            .collect()
    };
    assert_eq!(ids(&out), ["t0", "t1", "t2"], "the oldest three, in feed order");
    let first_batch = std::mem::take(&mut out);
    assert!(batched.next_batch(&mut out, 64).await);
    assert_eq!(ids(&out), ["t3", "t4"], "then what is left, without waiting for more");
    // A consumer that takes one at a time gets the same events: shared, not copied.
    let FeedItem::Event(batched_first) = &first_batch[0] else { panic!("{first_batch:?}") };
    assert!(Arc::ptr_eq(batched_first, &next_event(&mut single).await));
    for t in &twins[1..] {
        assert_eq!(next_event(&mut single).await.device_id, t.device_id);
    }
    // Nothing is pending, so a batch waits; one that is dropped while waiting takes nothing.
    out.clear();
    assert_idle(batched.next_batch(&mut out, 8)).await;
    assert!(out.is_empty());
    hub.publish(0, vec![tags_change(&twins[0], 3, json!({"k": 2}))]);
    assert!(batched.next_batch(&mut out, 8).await);
    assert_eq!(ids(&out), ["t0"]);
    hub.close();
    out.clear();
    assert!(!batched.next_batch(&mut out, 8).await, "a closed hub ends the feed");
}

#[tokio::test]
async fn resume_replays_exactly_what_followed_then_goes_live() {
    let hub = hub();
    let d = TwinId::device("d");
    let mut first = hub.changes(None);
    for v in 2..=4 {
        hub.publish(0, vec![tags_change(&d, v, json!({"v": v}))]);
    }
    // A consumer that read position 1 only.
    let p1 = hub.head().rsplit_once('-').unwrap().0.to_string() + "-1";
    let mut resumed = hub.changes(Some(&p1));
    let a = next_event(&mut resumed).await;
    let b = next_event(&mut resumed).await;
    assert_eq!((a.body.to_value()["version"].clone(), b.body.to_value()["version"].clone()), (json!(3), json!(4)));
    assert_eq!(a.merged + b.merged, 2, "replayed events are not coalesced");
    hub.publish(0, vec![tags_change(&d, 5, json!({"v": 5}))]);
    assert_eq!(next_event(&mut resumed).await.body.to_value()["version"], 5);
    assert_idle(resumed.next()).await;
    // The live consumer saw everything merged.
    assert_eq!(next_event(&mut first).await.merged, 4);
    // Resuming from the head is live from now.
    let mut at_head = hub.changes(Some(&hub.head()));
    assert_idle(at_head.next()).await;
}

#[tokio::test]
async fn foreign_stale_or_malformed_positions_resync_then_go_live() {
    let hub = hub_with(|c| c.retained = 3);
    let d = TwinId::device("d");
    for v in 2..=7 {
        hub.publish(0, vec![tags_change(&d, v, json!({}))]);
    }
    let epoch = hub.head().rsplit_once('-').unwrap().0.to_string();
    for bad in ["0123456789abcdef-3".to_string(), format!("{epoch}-1"), format!("{epoch}-99"), "garbage".into()] {
        let mut f = hub.changes(Some(&bad));
        match next_item(&mut f).await {
            Some(FeedItem::Resync { position, reason }) => {
                assert_eq!(position, hub.head(), "{bad}");
                assert!(!reason.is_empty());
            }
            other => panic!("{bad}: expected a resync, got {other:?}"),
        }
        hub.publish(0, vec![tags_change(&d, 100, json!({}))]);
        assert_eq!(next_event(&mut f).await.body.to_value()["version"], 100, "{bad}: live after the resync");
    }
    // The oldest retained position still resumes.
    let oldest = hub.head().rsplit_once('-').unwrap().1.parse::<u64>().unwrap() - 3;
    let mut ok = hub.changes(Some(&format!("{epoch}-{oldest}")));
    assert!(matches!(next_item(&mut ok).await, Some(FeedItem::Event(_))));
}

#[tokio::test]
async fn slow_consumer_overflow_resyncs_and_continues_live() {
    let hub = hub_with(|c| c.feed_queue = 3);
    let mut f = hub.changes(None);
    for i in 0..5 {
        // Different twins never merge.
        hub.publish(0, vec![tags_change(&TwinId::device(format!("d{i}")), 2, json!({}))]);
    }
    match next_item(&mut f).await {
        Some(FeedItem::Resync { position, .. }) => assert!(position.ends_with("-4")),
        other => panic!("expected a resync, got {other:?}"),
    }
    assert_eq!(next_event(&mut f).await.device_id, "d4");
    assert_idle(f.next()).await;
}

#[tokio::test]
async fn filtered_consumers_see_only_their_twins_live_and_on_resume() {
    let hub = hub();
    let filter = FeedFilter { device_id: Some("d1".into()), module_id: None };
    let mut f = hub.changes_filtered(None, filter.clone());
    let start = hub.head();
    for id in [TwinId::device("d2"), TwinId::module("d1", "m"), TwinId::device("d1")] {
        hub.publish(0, vec![tags_change(&id, 2, json!({}))]);
    }
    assert_eq!(next_event(&mut f).await.module_id.as_deref(), Some("m"));
    assert_eq!(next_event(&mut f).await.module_id, None);
    assert_idle(f.next()).await;
    let mut r =
        hub.changes_filtered(Some(&start), FeedFilter { device_id: Some("d1".into()), module_id: Some("m".into()) });
    assert_eq!(next_event(&mut r).await.module_id.as_deref(), Some("m"));
    assert_idle(r.next()).await;
}

#[tokio::test]
async fn events_from_a_real_model_run_have_the_versions_they_reflect() {
    let hub = hub();
    let mut f = hub.changes(None);
    let mut model = Model::new();
    let id = TwinId::device("d");
    hub.publish(0, model.create("d"));
    let mut p = hub.desired_pushes(&id);
    hub.publish(
        0,
        model.apply(Op::UpdateTwin {
            id: id.clone(),
            patch_json: json!({"properties": {"desired": {"x": 1}}}).to_string(),
            if_match: None,
        }),
    );
    let create = next_event(&mut f).await;
    assert_eq!(create.property("opType"), Some("createDeviceIdentity"));
    let upd = next_event(&mut f).await;
    assert_eq!(upd.body.to_value()["version"], 2);
    assert_eq!(upd.body.to_value()["properties"]["desired"]["$version"], 2);
    assert_eq!(upd.body.to_value()["properties"]["desired"]["x"], 1);
    let push = next_push(&mut p).await.unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&push.body).unwrap(), json!({"x": 1, "$version": 2}));
}

#[tokio::test]
async fn the_ring_is_bounded_by_bytes_too() {
    let hub = hub_with(|c| c.retained_bytes = 10_000);
    let d = TwinId::device("d");
    let epoch = hub.head().rsplit_once('-').unwrap().0.to_string();
    for v in 2..=21 {
        hub.publish(0, vec![tags_change(&d, v, json!({"blob": "x".repeat(1000)}))]);
    }
    // ~1.3 KB each: fewer than ten fit, so position 5 is gone but 15 is kept.
    let mut old = hub.changes(Some(&format!("{epoch}-5")));
    assert!(matches!(next_item(&mut old).await, Some(FeedItem::Resync { .. })));
    let mut recent = hub.changes(Some(&format!("{epoch}-15")));
    assert_eq!(next_event(&mut recent).await.body.to_value()["version"], 17);
}

#[tokio::test]
async fn a_tail_gap_resyncs_every_consumer_instead_of_skipping_silently() {
    let hub = hub();
    let mut f = hub.changes(None);
    hub.publish(0, vec![tags_change(&TwinId::device("d1".to_string()), 2, json!({}))]);
    // Events of shard 5 were lost to this node (its tail fell behind): what was pending goes, and the
    // consumer hears a resync at the current position before anything else.
    (hub.sink().gap)(5);
    match next_item(&mut f).await {
        Some(FeedItem::Resync { position, reason }) => {
            assert_eq!(position, hub.head());
            assert!(reason.contains("shard 5"), "{reason}");
        }
        other => panic!("expected a resync, got {other:?}"),
    }
    // Then it carries on live.
    hub.publish(0, vec![tags_change(&TwinId::device("d2".to_string()), 2, json!({}))]);
    assert_eq!(next_event(&mut f).await.device_id, "d2");
    assert_idle(f.next()).await;
}

#[tokio::test]
async fn a_consumer_that_cannot_be_heard_skips_changes_until_someone_listens() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let hub = hub();
    let listening = Arc::new(AtomicBool::new(false));
    let l = listening.clone();
    let mut f = hub.changes_while(Arc::new(move || l.load(Ordering::SeqCst)));
    let mut all = hub.changes(None);
    let (a, b) = (TwinId::device("a"), TwinId::device("b"));
    hub.publish(0, vec![tags_change(&a, 2, json!({"k": 1}))]);
    assert_idle(f.next()).await;
    listening.store(true, Ordering::SeqCst);
    hub.publish(0, vec![tags_change(&b, 2, json!({"k": 2}))]);
    let e = next_event(&mut f).await;
    assert_eq!(e.body.to_value()["tags"], json!({"k": 2}), "only what was published while listening");
    assert!(e.position.ends_with("-2"), "positions still count every change: {}", e.position);
    // Other consumers saw both.
    assert_eq!(next_event(&mut all).await.body.to_value()["tags"], json!({"k": 1}));
    assert_eq!(next_event(&mut all).await.body.to_value()["tags"], json!({"k": 2}));
}

#[tokio::test]
async fn changes_no_one_can_ever_read_are_counted_but_not_retained() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let hub = hub();
    // Only a consumer that cannot be heard (the event broker without clients) is attached.
    let quiet = Arc::new(AtomicBool::new(false));
    let q = quiet.clone();
    let _broker = hub.changes_while(Arc::new(move || q.load(Ordering::SeqCst)));
    hub.publish(0, vec![tags_change(&TwinId::device("a"), 2, json!({"k": 1}))]);
    // The change took its sequence number, but no position before it was ever handed out, so no
    // consumer can resume into it and nothing was kept.
    let head = hub.head();
    assert!(head.ends_with("-1"), "{head}");
    let mut from_start = hub.changes(Some(&head.replace("-1", "-0")));
    assert!(matches!(next_item(&mut from_start).await, Some(FeedItem::Resync { .. })));
    // Once a position is out, what follows it is retained for whoever resumes from it.
    hub.publish(0, vec![tags_change(&TwinId::device("b"), 2, json!({"k": 2}))]);
    let mut resumed = hub.changes(Some(&head));
    let e = next_event(&mut resumed).await;
    assert_eq!((e.device_id.as_str(), e.position.ends_with("-2")), ("b", true));
}

#[tokio::test]
async fn the_hub_is_observed_once_anyone_could_receive_what_it_publishes() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let hub = hub();
    assert!(!hub.observed(), "a fresh hub: no position out, no consumer, no device");
    let quiet = Arc::new(AtomicBool::new(false));
    let q = quiet.clone();
    let _broker = hub.changes_while(Arc::new(move || q.load(Ordering::SeqCst)));
    assert!(!hub.observed(), "a consumer that cannot be heard does not count");
    let device = hub.desired_pushes(&TwinId::device("d"));
    assert!(hub.observed(), "a connected device waits for desired pushes");
    drop(device);
    assert!(!hub.observed());
    quiet.store(true, Ordering::SeqCst);
    assert!(hub.observed(), "the broker has a client now");
    quiet.store(false, Ordering::SeqCst);
    assert!(!hub.observed());
    let _ = hub.head();
    assert!(hub.observed(), "a position is out: whoever holds it may resume");
}
