//! Behaviour of `ShardState::apply` and the validators, as IoT Hub clients observe it.

use serde_json::{json, Value};

use super::json_tree::Json;
use super::validate::{doc_size, MAX_DESIRED_SIZE, MAX_REPORTED_SIZE, MAX_TAGS_SIZE};
use super::*;

const T0: i64 = 1_700_000_000_000;

fn auth() -> AuthSpec {
    AuthSpec {
        auth_type: AuthType::Sas,
        primary_key: Some("cHJpbWFyeQ==".into()),
        secondary_key: Some("c2Vjb25kYXJ5".into()),
        primary_thumbprint: None,
        secondary_thumbprint: None,
    }
}

fn device_spec(id: &str) -> DeviceSpec {
    DeviceSpec { device_id: id.into(), status: Status::Enabled, status_reason: None, auth: auth(), iot_edge: false }
}

struct Fixture {
    state: ShardState,
    next_req: u128,
    clock: i64,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture { state: ShardState::default(), next_req: 1, clock: T0 }
    }

    fn with_device(id: &str) -> Fixture {
        let mut f = Fixture::new();
        f.must(Op::PutDevice { device: device_spec(id), if_match: None });
        f
    }

    fn cmd(&mut self, op: Op) -> Command {
        self.next_req += 1;
        self.clock += 1000;
        Command { request_id: RequestId(self.next_req), timestamp_ms: self.clock, op }
    }

    fn apply(&mut self, op: Op) -> Applied {
        let c = self.cmd(op);
        self.state.apply(&c)
    }

    fn must(&mut self, op: Op) -> Applied {
        let a = self.apply(op);
        assert!(a.result.is_ok(), "unexpected rejection: {:?}", a.result);
        a
    }

    /// Applies and asserts a rejection that left the state exactly as it was (dedupe aside).
    fn must_reject(&mut self, op: Op) -> TwinError {
        let before = self.state.clone();
        let a = self.apply(op);
        assert!(a.events.is_empty());
        assert_eq!(self.state.devices, before.devices, "a rejected command changed the state");
        assert_eq!(self.state.etag_seq, before.etag_seq);
        match a.result {
            Err(e) => e,
            Ok(r) => panic!("expected a rejection, got {r:?}"),
        }
    }

    fn patch(&mut self, id: &TwinId, body: Value) -> Applied {
        self.apply(Op::UpdateTwin { id: id.clone(), patch_json: body.to_string(), if_match: None })
    }

    fn replace(&mut self, id: &TwinId, body: Value) -> Applied {
        self.apply(Op::ReplaceTwin { id: id.clone(), twin_json: body.to_string(), if_match: None })
    }

    fn report(&mut self, id: &TwinId, body: Value) -> Applied {
        self.apply(Op::UpdateReported { id: id.clone(), patch_json: body.to_string() })
    }

    fn twin(&self, id: &TwinId) -> Value {
        self.state.twin(id).unwrap_or(Value::Null)
    }
}

fn invalid_msg(e: TwinError) -> String {
    match e {
        TwinError::InvalidArgument(m) => m,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

fn dev() -> TwinId {
    TwinId::device("d1")
}

/// A JSON object of exactly `size` (as the seeds count it), made of string members.
fn object_of_size(size: usize) -> Value {
    // {"k0":"…","k1":"…"} — each member `"kN":"<s>"` costs len(kN)+2+1+len(s)+2, plus commas and braces.
    let mut m = serde_json::Map::new();
    let mut remaining = size - 2;
    let mut i = 0;
    while remaining > 0 {
        let key = format!("k{i}");
        let overhead = key.len() + 5 + usize::from(i > 0);
        let len = remaining.saturating_sub(overhead).min(4000);
        m.insert(key, Value::String("x".repeat(len)));
        remaining -= overhead + len;
        i += 1;
    }
    let v = Value::Object(m);
    assert_eq!(doc_size(&Json::of(&v)), size);
    v
}

fn nested(depth: usize, leaf: Value) -> Value {
    (0..depth).fold(leaf, |inner, i| json!({ format!("l{}", depth - i): inner }))
}

// ---------------------------------------------------------------- fresh twin, rendering

#[test]
fn fresh_twin_renders_iot_hub_shape() {
    let f = Fixture::with_device("d1");
    let t = f.twin(&dev());
    let never = json!({"$metadata": {"$lastUpdated": "0001-01-01T00:00:00Z"}, "$version": 1});
    assert_eq!(t["properties"]["desired"], never);
    assert_eq!(t["properties"]["reported"], never);
    assert_eq!(t["version"], json!(1));
    assert_eq!(t["etag"], json!("AAAAAAAAAAI="));
    assert_eq!(t["deviceEtag"], json!("AAAAAAAAAAE="));
    assert_eq!(t["tags"], json!({}));
    assert_eq!(t["connectionState"], json!("Disconnected"));
    assert_eq!(t["authenticationType"], json!("sas"));
    assert_eq!(t["x509Thumbprint"], json!({"primaryThumbprint": null, "secondaryThumbprint": null}));
    assert_eq!(t["capabilities"], json!({"iotEdge": false}));
    assert_eq!(t["statusUpdateTime"], json!("0001-01-01T00:00:00Z"));
    assert_eq!(
        serde_json::to_string(&f.state.twin_properties(&dev()).unwrap_or_default()).unwrap_or_default(),
        r#"{"desired":{"$metadata":{"$lastUpdated":"0001-01-01T00:00:00Z"},"$version":1},"reported":{"$metadata":{"$lastUpdated":"0001-01-01T00:00:00Z"},"$version":1}}"#
    );
}

#[test]
fn device_document_has_every_field() {
    let f = Fixture::with_device("d1");
    let d = f.state.device("d1").unwrap_or_default();
    for key in [
        "deviceId",
        "generationId",
        "etag",
        "connectionState",
        "status",
        "statusReason",
        "connectionStateUpdatedTime",
        "statusUpdatedTime",
        "lastActivityTime",
        "cloudToDeviceMessageCount",
        "authentication",
        "capabilities",
    ] {
        assert!(d.get(key).is_some(), "missing {key}");
    }
    assert_eq!(d["cloudToDeviceMessageCount"], json!(0));
    assert_eq!(d["status"], json!("enabled"));
    assert_eq!(d["authentication"]["symmetricKey"]["primaryKey"], json!("cHJpbWFyeQ=="));
    assert_eq!(d["authentication"]["type"], json!("sas"));
    assert_eq!(d["generationId"].as_str().map(str::len), Some(18));
}

// ---------------------------------------------------------------- merge, null, replace

#[test]
fn patch_merges_recursively_and_null_removes() {
    let mut f = Fixture::with_device("d1");
    f.patch(&dev(), json!({"tags": {"a": {"b": 1, "c": 2}}, "properties": {"desired": {"x": {"y": 1, "z": 2}}}}));
    f.patch(
        &dev(),
        json!({"tags": {"a": {"b": null, "d": 3}}, "properties": {"desired": {"x": {"y": null}, "w": true}}}),
    );
    let t = f.twin(&dev());
    assert_eq!(t["tags"], json!({"a": {"c": 2, "d": 3}}));
    assert_eq!(t["properties"]["desired"]["x"], json!({"z": 2}));
    assert_eq!(t["properties"]["desired"]["w"], json!(true));
}

#[test]
fn section_null_clears_whole_section() {
    let mut f = Fixture::with_device("d1");
    f.patch(&dev(), json!({"tags": {"a": 1}, "properties": {"desired": {"b": 2}}}));
    let a = f.patch(&dev(), json!({"tags": null, "properties": {"desired": null}}));
    assert!(a.result.is_ok());
    let t = f.twin(&dev());
    assert_eq!(t["tags"], json!({}));
    assert_eq!(t["properties"]["desired"]["$version"], json!(3));
    assert!(t["properties"]["desired"].get("b").is_none());
    let patch = a.events.iter().find_map(|e| match e {
        Event::DesiredPatch { patch, .. } => Some(patch.to_value()),
        _ => None,
    });
    assert_eq!(patch, Some(json!({"b": null, "$version": 3})));
}

#[test]
fn replace_replaces_tags_and_desired_and_missing_means_empty() {
    let mut f = Fixture::with_device("d1");
    f.patch(&dev(), json!({"tags": {"a": 1, "b": 2}, "properties": {"desired": {"a": 1, "b": 2}}}));
    f.report(&dev(), json!({"r": 1}));
    let a = f.replace(&dev(), json!({"tags": {"only": true}, "properties": {"desired": {"a": 1, "c": 100}}}));
    assert!(a.result.is_ok());
    let t = f.twin(&dev());
    assert_eq!(t["tags"], json!({"only": true}));
    assert_eq!(t["properties"]["desired"]["a"], json!(1));
    assert!(t["properties"]["desired"].get("b").is_none());
    assert_eq!(t["properties"]["reported"]["r"], json!(1), "replace must not touch reported");
    let patch = a.events.iter().find_map(|e| match e {
        Event::DesiredPatch { patch, desired_version, .. } => Some((patch.to_value(), *desired_version)),
        _ => None,
    });
    assert_eq!(patch, Some((json!({"a": 1, "c": 100, "b": null, "$version": 3}), 3)));

    f.replace(&dev(), json!({"tags": {"t": 1}}));
    let t = f.twin(&dev());
    assert_eq!(t["properties"]["desired"]["$version"], json!(4));
    assert_eq!(t["properties"]["desired"]["$metadata"]["$lastUpdatedVersion"], json!(4));
    assert!(t["properties"]["desired"].get("a").is_none());
}

#[test]
fn reported_patch_merges_with_null_removal() {
    let mut f = Fixture::with_device("d1");
    let a = f.report(&dev(), json!({"fw": "1.0", "nested": {"a": 1, "b": 2}}));
    assert_eq!(a.result, Ok(Reply::Reported { version: 2 }));
    let a = f.report(&dev(), json!({"nested": {"a": null}}));
    assert_eq!(a.result, Ok(Reply::Reported { version: 3 }));
    let p = f.state.twin_properties(&dev()).unwrap_or_default();
    assert_eq!(p["reported"]["nested"], json!({"b": 2}));
    assert_eq!(p["reported"]["fw"], json!("1.0"));
    assert!(p["reported"]["$metadata"].get("$lastUpdatedVersion").is_none(), "reported has no $lastUpdatedVersion");
}

#[test]
fn reported_patch_advances_last_activity_of_its_identity_only() {
    let mut f = Fixture::with_device("d1");
    f.must(Op::PutModule { module: module_spec("d1", "m"), if_match: None });
    f.report(&dev(), json!({"a": 1}));
    let at = f.clock;
    assert_eq!(f.state.device("d1").unwrap_or_default()["lastActivityTime"], json!(time::format_ms(at)));
    let m = f.state.module("d1", "m").unwrap_or_default();
    assert_eq!(m["lastActivityTime"], json!("0001-01-01T00:00:00Z"), "the module was not active");
    f.report(&TwinId::module("d1", "m"), json!({"b": 1}));
    assert_eq!(f.state.module("d1", "m").unwrap_or_default()["lastActivityTime"], json!(time::format_ms(f.clock)));
    assert_eq!(f.state.device("d1").unwrap_or_default()["lastActivityTime"], json!(time::format_ms(at)));
    // A rejected patch is not activity.
    let before = f.state.device("d1").unwrap_or_default()["lastActivityTime"].clone();
    f.must_reject(Op::UpdateReported { id: dev(), patch_json: "[1]".into() });
    assert_eq!(f.state.device("d1").unwrap_or_default()["lastActivityTime"], before);
}

#[test]
fn service_body_ignores_identity_members_and_empty_reported() {
    let mut f = Fixture::with_device("d1");
    let body = json!({"deviceId": "d1", "etag": "*", "version": null, "status": "enabled", "moduleId": null,
        "tags": {"a": 1}, "properties": {"desired": {"b": 2}, "reported": {}}});
    assert!(validate_twin_patch(&body).is_ok());
    assert!(f.patch(&dev(), body.clone()).result.is_ok());
    assert!(f.replace(&dev(), body).result.is_ok());
    assert_eq!(f.twin(&dev())["tags"], json!({"a": 1}));
}

#[test]
fn service_body_rejects_reported_and_unknown_members() {
    let mut f = Fixture::with_device("d1");
    let m = invalid_msg(f.must_reject(Op::UpdateTwin {
        id: dev(),
        patch_json: json!({"properties": {"reported": {"x": 1}}}).to_string(),
        if_match: None,
    }));
    assert!(m.contains("properties.reported"), "{m}");
    let m = invalid_msg(f.must_reject(Op::UpdateTwin {
        id: dev(),
        patch_json: json!({"tags": {}, "bogus": 1, "other": 2}).to_string(),
        if_match: None,
    }));
    assert!(m.contains("bogus") && m.contains("other"), "{m}");
    let m = invalid_msg(f.must_reject(Op::UpdateTwin { id: dev(), patch_json: "{not json".into(), if_match: None }));
    assert!(m.contains("malformed JSON"), "{m}");
    assert!(validate_twin_patch(&json!({"tags": 5})).is_err());
    assert!(validate_twin_patch(&json!([1])).is_err());
    assert!(validate_reported_patch(&json!("x")).is_err());
}

// ---------------------------------------------------------------- metadata

#[test]
fn metadata_at_every_level_with_last_updated_version() {
    let mut f = Fixture::with_device("d1");
    f.patch(&dev(), json!({"properties": {"desired": {"a": {"b": {"c": 1}}, "s": "x"}}}));
    let first = f.clock;
    f.patch(&dev(), json!({"properties": {"desired": {"s": "y"}}}));
    let second = f.clock;
    let d = &f.twin(&dev())["properties"]["desired"];
    let meta = &d["$metadata"];
    let ts = |ms| json!(time::format_ms(ms));
    assert_eq!(meta["$lastUpdated"], ts(second));
    assert_eq!(meta["$lastUpdatedVersion"], json!(3));
    assert_eq!(meta["a"]["$lastUpdated"], ts(first));
    assert_eq!(meta["a"]["$lastUpdatedVersion"], json!(2));
    assert_eq!(meta["a"]["b"]["$lastUpdated"], ts(first));
    assert_eq!(meta["a"]["b"]["c"], json!({"$lastUpdated": time::format_ms(first), "$lastUpdatedVersion": 2}));
    assert_eq!(meta["s"], json!({"$lastUpdated": time::format_ms(second), "$lastUpdatedVersion": 3}));
    assert_eq!(d["$version"], json!(3));
    assert!(time::format_ms(second).ends_with("Z") && time::format_ms(second).len() == 24);
}

#[test]
fn removal_stays_visible_in_parent_metadata() {
    let mut f = Fixture::with_device("d1");
    f.report(&dev(), json!({"a": {"b": 1, "c": 2}}));
    let first = f.clock;
    f.report(&dev(), json!({"a": {"b": null}}));
    let second = f.clock;
    let meta = &f.twin(&dev())["properties"]["reported"]["$metadata"];
    assert_eq!(meta["a"]["$lastUpdated"], json!(time::format_ms(second)));
    assert_eq!(meta["a"]["c"]["$lastUpdated"], json!(time::format_ms(first)));
    assert!(meta["a"].get("b").is_none());
}

// ---------------------------------------------------------------- versions and etags

#[test]
fn desired_version_moves_exactly_one_per_desired_change() {
    let mut f = Fixture::with_device("d1");
    for expected in 2..6 {
        // Unchanged values still count as a change, as on IoT Hub.
        f.patch(&dev(), json!({"properties": {"desired": {"a": 1}}}));
        assert_eq!(f.twin(&dev())["properties"]["desired"]["$version"], json!(expected));
    }
    // Removing a key that never existed still moves the desired version.
    f.patch(&dev(), json!({"properties": {"desired": {"ghost": null}}}));
    assert_eq!(f.twin(&dev())["properties"]["desired"]["$version"], json!(6));
    // Tags alone do not.
    f.patch(&dev(), json!({"tags": {"t": 1}}));
    assert_eq!(f.twin(&dev())["properties"]["desired"]["$version"], json!(6));
    // A reported patch neither.
    f.report(&dev(), json!({"r": 1}));
    let t = f.twin(&dev());
    assert_eq!(t["properties"]["desired"]["$version"], json!(6));
    assert_eq!(t["properties"]["reported"]["$version"], json!(2));
    assert_eq!(t["version"], json!(8));
}

#[test]
fn etag_changes_on_tags_and_desired_only_and_is_never_star() {
    let mut f = Fixture::with_device("d1");
    let e0 = f.twin(&dev())["etag"].clone();
    f.patch(&dev(), json!({"tags": {"a": 1}}));
    let e1 = f.twin(&dev())["etag"].clone();
    f.patch(&dev(), json!({"properties": {"desired": {"a": 1}}}));
    let e2 = f.twin(&dev())["etag"].clone();
    f.report(&dev(), json!({"a": 1}));
    let e3 = f.twin(&dev())["etag"].clone();
    f.apply(Op::SetConnectionState { id: dev(), connected: true });
    let e4 = f.twin(&dev())["etag"].clone();
    assert_ne!(e0, e1);
    assert_ne!(e1, e2);
    assert_eq!(e2, e3);
    assert_eq!(e3, e4);
    for e in [e0, e1, e2] {
        assert_ne!(e, json!("*"));
    }
    assert_eq!(f.state.twin_etag(&dev()).map(Value::String), Ok(f.twin(&dev())["etag"].clone()));
}

#[test]
fn device_etag_changes_on_identity_update() {
    let mut f = Fixture::with_device("d1");
    let before = f.state.device("d1").unwrap_or_default();
    let mut spec = device_spec("d1");
    spec.status = Status::Disabled;
    spec.auth.primary_key = None;
    let etag = before["etag"].as_str().unwrap_or_default().to_string();
    let a = f.must(Op::PutDevice { device: spec, if_match: Some(IfMatch::Etag(etag)) });
    let Ok(Reply::Device(after)) = a.result else { panic!("expected a Device reply") };
    assert_ne!(before["etag"], after["etag"]);
    assert_eq!(after["status"], json!("disabled"));
    assert_eq!(after["statusUpdatedTime"], json!(time::format_ms(f.clock)));
    assert_eq!(after["authentication"]["symmetricKey"]["primaryKey"], json!("cHJpbWFyeQ=="), "keys kept");
    assert_eq!(f.state.stats(), DeviceStats { total: 1, enabled: 0, disabled: 1 });
    assert_eq!(f.state.credentials(&dev()).map(|c| c.enabled), Some(false));
}

// ---------------------------------------------------------------- If-Match

#[test]
fn if_match_rules() {
    let mut f = Fixture::with_device("d1");
    let etag = f.state.twin_etag(&dev()).unwrap_or_default();
    let body = json!({"tags": {"a": 1}}).to_string();
    let ok =
        f.apply(Op::UpdateTwin { id: dev(), patch_json: body.clone(), if_match: Some(IfMatch::Etag(etag.clone())) });
    assert!(ok.result.is_ok());
    // The etag moved: the old one is stale now.
    let e = f.must_reject(Op::UpdateTwin {
        id: dev(),
        patch_json: body.clone(),
        if_match: Some(IfMatch::Etag(etag.clone())),
    });
    assert!(matches!(e, TwinError::PreconditionFailed(_)));
    let e = f.must_reject(Op::ReplaceTwin { id: dev(), twin_json: body.clone(), if_match: Some(IfMatch::Etag(etag)) });
    assert!(matches!(e, TwinError::PreconditionFailed(_)));
    assert!(f
        .apply(Op::UpdateTwin { id: dev(), patch_json: body.clone(), if_match: Some(IfMatch::Any) })
        .result
        .is_ok());
    // An empty tag is a condition no etag meets: nothing is written.
    for op in [
        Op::UpdateTwin { id: dev(), patch_json: body.clone(), if_match: Some(IfMatch::parse_header("\"\"")) },
        Op::ReplaceTwin { id: dev(), twin_json: body.clone(), if_match: Some(IfMatch::parse_header("")) },
        Op::DeleteDevice { device_id: "d1".into(), if_match: Some(IfMatch::parse_header("W/\"\"")) },
    ] {
        let e = f.must_reject(op);
        assert!(matches!(e, TwinError::PreconditionFailed(_)), "{e:?}");
    }
    // `*` on a missing twin is still "not found".
    let e =
        f.must_reject(Op::UpdateTwin { id: TwinId::device("nope"), patch_json: body, if_match: Some(IfMatch::Any) });
    assert_eq!(e, TwinError::DeviceNotFound("nope".into()));
}

#[test]
fn put_device_create_update_and_conflicts() {
    let mut f = Fixture::with_device("d1");
    let e = f.must_reject(Op::PutDevice { device: device_spec("d1"), if_match: None });
    assert_eq!(e, TwinError::DeviceAlreadyExists("d1".into()));
    let e = f.must_reject(Op::PutDevice { device: device_spec("d2"), if_match: Some(IfMatch::Any) });
    assert_eq!(e, TwinError::DeviceNotFound("d2".into()));
    let e = f
        .must_reject(Op::PutDevice { device: device_spec("d1"), if_match: Some(IfMatch::Etag("AAAAAAAAAAA=".into())) });
    assert!(matches!(e, TwinError::PreconditionFailed(_)));
    assert!(f.apply(Op::PutDevice { device: device_spec("d1"), if_match: Some(IfMatch::Any) }).result.is_ok());
    let e = f
        .must_reject(Op::DeleteDevice { device_id: "d1".into(), if_match: Some(IfMatch::Etag("AAAAAAAAAAA=".into())) });
    assert!(matches!(e, TwinError::PreconditionFailed(_)));
    let e = f.must_reject(Op::PutDevice { device: device_spec("bad id"), if_match: None });
    assert!(invalid_msg(e).contains("device id"));
}

// ---------------------------------------------------------------- modules and cascade

fn module_spec(d: &str, m: &str) -> ModuleSpec {
    ModuleSpec { device_id: d.into(), module_id: m.into(), managed_by: None, auth: auth() }
}

#[test]
fn module_limit_is_twenty() {
    let mut f = Fixture::with_device("d1");
    for i in 0..MAX_MODULES_PER_DEVICE {
        f.must(Op::PutModule { module: module_spec("d1", &format!("m{i}")), if_match: None });
    }
    let e = f.must_reject(Op::PutModule { module: module_spec("d1", "one-too-many"), if_match: None });
    assert_eq!(e, TwinError::TooManyModulesOnDevice { device: "d1".into(), max: MAX_MODULES_PER_DEVICE });
    assert_eq!(f.state.modules("d1").map(|m| m.len()), Ok(MAX_MODULES_PER_DEVICE));
}

#[test]
fn module_conflicts_and_missing_device() {
    let mut f = Fixture::with_device("d1");
    f.must(Op::PutModule { module: module_spec("d1", "m"), if_match: None });
    let e = f.must_reject(Op::PutModule { module: module_spec("d1", "m"), if_match: None });
    assert_eq!(e, TwinError::ModuleAlreadyExists { device: "d1".into(), module: "m".into() });
    let e = f.must_reject(Op::PutModule { module: module_spec("d1", "x"), if_match: Some(IfMatch::Any) });
    assert_eq!(e, TwinError::ModuleNotFound { device: "d1".into(), module: "x".into() });
    let e = f.must_reject(Op::PutModule { module: module_spec("zz", "m"), if_match: None });
    assert_eq!(e, TwinError::DeviceNotFound("zz".into()));
    let m = f.state.module("d1", "m").unwrap_or_default();
    assert_eq!(m["moduleId"], json!("m"));
    assert_eq!(m["deviceId"], json!("d1"));
    let mt = f.twin(&TwinId::module("d1", "m"));
    assert_eq!(mt["moduleId"], json!("m"));
    assert_eq!(mt["properties"]["desired"]["$version"], json!(1));
    f.must(Op::DeleteModule { device_id: "d1".into(), module_id: "m".into(), if_match: Some(IfMatch::Any) });
    assert!(f.state.module("d1", "m").is_err());
}

#[test]
fn deleting_a_device_deletes_its_modules_and_twins() {
    let mut f = Fixture::with_device("d1");
    f.must(Op::PutModule { module: module_spec("d1", "m1"), if_match: None });
    f.must(Op::PutModule { module: module_spec("d1", "m2"), if_match: None });
    let a = f.must(Op::DeleteDevice { device_id: "d1".into(), if_match: Some(IfMatch::Any) });
    assert_eq!(a.result, Ok(Reply::Done));
    let ops: Vec<&str> = a
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Lifecycle { op_type, .. } => Some(op_type.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(ops, ["deleteModuleIdentity", "deleteModuleIdentity", "deleteDeviceIdentity"]);
    assert_eq!(f.state.device("d1"), None);
    assert!(f.state.twin(&TwinId::module("d1", "m1")).is_err());
    assert!(f.state.credentials(&TwinId::module("d1", "m2")).is_none());
    assert_eq!(f.state.stats().total, 0);
    // Re-created: fresh twin, new etags (never reused).
    let old_etag = "AAAAAAAAAAI=";
    f.must(Op::PutDevice { device: device_spec("d1"), if_match: None });
    assert_ne!(f.twin(&dev())["etag"], json!(old_etag));
    assert_eq!(f.twin(&dev())["version"], json!(1));
}

#[test]
fn listing_pages_in_id_order() {
    let mut f = Fixture::new();
    for id in ["c", "a", "b"] {
        f.must(Op::PutDevice { device: device_spec(id), if_match: None });
    }
    let ids =
        |v: Vec<Value>| v.iter().map(|d| d["deviceId"].as_str().unwrap_or_default().to_string()).collect::<Vec<_>>();
    assert_eq!(ids(f.state.devices(None, 10)), ["a", "b", "c"]);
    assert_eq!(ids(f.state.devices(Some("a"), 1)), ["b"]);
}

// ---------------------------------------------------------------- batches

/// A batch applies each of its commands exactly as entries of their own would, in order: the same
/// outcomes, the same state, the same events; each command is remembered for dedupe, the batch is not.
#[test]
fn a_batch_applies_like_its_commands_one_by_one() {
    let mut one_by_one = Fixture::with_device("d1");
    let mut batched = Fixture::with_device("d1");
    let ops = || {
        vec![
            Op::UpdateReported { id: dev(), patch_json: json!({"a": 1}).to_string() },
            Op::UpdateTwin {
                id: dev(),
                patch_json: json!({"properties": {"desired": {"x": 1}}}).to_string(),
                if_match: None,
            },
            // Rejected: the etag is not the twin's; it changes nothing and the next command still applies.
            Op::UpdateTwin {
                id: dev(),
                patch_json: json!({"tags": {"t": 1}}).to_string(),
                if_match: Some(IfMatch::Etag("AAAAAAAAAAE=".into())),
            },
            Op::UpdateReported { id: dev(), patch_json: json!({"a": 2}).to_string() },
        ]
    };
    let cmds: Vec<Command> = ops().into_iter().map(|op| one_by_one.cmd(op)).collect();
    let mut want_events = Vec::new();
    let want: Vec<_> = cmds
        .iter()
        .map(|c| {
            let a = one_by_one.state.apply(c);
            want_events.extend(a.events);
            a.result
        })
        .collect();
    batched.next_req = one_by_one.next_req;
    let batch = Command { request_id: RequestId(9_999), timestamp_ms: T0, op: Op::Batch { commands: cmds.clone() } };
    let got = batched.state.apply(&batch);
    assert_eq!(got.result, Ok(Reply::Batch(want.clone())));
    assert!(matches!(want[2], Err(TwinError::PreconditionFailed(_))), "{want:?}");
    assert_eq!(got.events, want_events);
    assert_eq!(batched.twin(&dev()), one_by_one.twin(&dev()));

    // Each command is remembered: a retry alone, or in another batch, answers the first outcome.
    assert_eq!(batched.state.apply(&cmds[3]).result, want[3]);
    let again = batched.state.apply(&Command { request_id: RequestId(10_000), ..batch.clone() });
    assert_eq!(again.result, Ok(Reply::Batch(want)));
    assert!(again.events.is_empty());
    assert_eq!(batched.twin(&dev())["properties"]["reported"]["$version"], json!(3));

    // No proposer nests batches; one that arrives is refused and changes nothing.
    let nested = Command { request_id: RequestId(10_001), timestamp_ms: T0, op: Op::Batch { commands: vec![batch] } };
    let before = batched.twin(&dev());
    match batched.state.apply(&nested).result {
        Ok(Reply::Batch(r)) => assert!(matches!(r[..], [Err(TwinError::InvalidArgument(_))]), "{r:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(batched.twin(&dev()), before);
}

// ---------------------------------------------------------------- duplicates

#[test]
fn duplicate_request_id_answers_first_outcome_without_reapplying() {
    let mut f = Fixture::with_device("d1");
    let c = f.cmd(Op::UpdateReported { id: dev(), patch_json: json!({"a": 1}).to_string() });
    let first = f.state.apply(&c);
    assert_eq!(first.result, Ok(Reply::Reported { version: 2 }));
    assert!(!first.events.is_empty());
    let again = f.state.apply(&c);
    assert_eq!(again.result, first.result);
    assert!(again.events.is_empty());
    assert_eq!(f.twin(&dev())["properties"]["reported"]["$version"], json!(2));

    let c = f.cmd(Op::UpdateTwin {
        id: dev(),
        patch_json: json!({"properties": {"desired": {"a": 1}}}).to_string(),
        if_match: None,
    });
    let first = f.state.apply(&c);
    let again = f.state.apply(&c);
    assert_eq!(again.result, first.result);
    assert_eq!(f.twin(&dev())["properties"]["desired"]["$version"], json!(2));

    let c = f.cmd(Op::PutDevice { device: device_spec("d1"), if_match: None });
    let first = f.state.apply(&c);
    assert!(matches!(first.result, Err(TwinError::DeviceAlreadyExists(_))));
    assert_eq!(f.state.apply(&c).result, first.result);
}

/// A retry that arrives after another write (a leader change between the two attempts) answers the
/// document the first attempt produced, not the later one: two acknowledged writes never share a
/// `$version`.
#[test]
fn retried_twin_write_answers_its_own_document_after_later_writes() {
    let mut f = Fixture::with_device("d1");
    let first_cmd = f.cmd(Op::UpdateTwin {
        id: dev(),
        patch_json: json!({"properties": {"desired": {"w": 1}}}).to_string(),
        if_match: None,
    });
    let first = f.state.apply(&first_cmd);
    let later = f.cmd(Op::UpdateTwin {
        id: dev(),
        patch_json: json!({"properties": {"desired": {"w": 2}}}).to_string(),
        if_match: None,
    });
    let later = f.state.apply(&later);
    let retry = f.state.apply(&first_cmd);
    assert_eq!(retry.result, first.result, "the retry answers the first attempt's document");
    assert_ne!(retry.result, later.result);
    let Ok(Reply::Twin(doc)) = &retry.result else { panic!("{:?}", retry.result) };
    assert_eq!(doc.to_value()["properties"]["desired"]["$version"], json!(2));
    assert_eq!(f.twin(&dev())["properties"]["desired"]["$version"], json!(3), "applied once each");
    // And the same after a snapshot round trip (a new leader may have installed one).
    let state = ShardState::decode_snapshot(&f.state.encode_snapshot()).expect("decode");
    assert_eq!(state.clone().apply(&first_cmd).result, first.result);
}

// ---------------------------------------------------------------- events

#[test]
fn update_emits_twin_changed_and_desired_patch() {
    let mut f = Fixture::with_device("d1");
    let a = f.patch(&dev(), json!({"tags": {"t": 1}, "properties": {"desired": {"interval": 5, "gone": null}}}));
    let ts = time::format_ms(f.clock);
    assert_eq!(a.events.len(), 2);
    match &a.events[0] {
        Event::TwinChanged { id, op_type, body, version } => {
            assert_eq!(id, &dev());
            assert_eq!(op_type, "updateTwin");
            assert_eq!(*version, 2);
            // Byte for byte, member order included: the feed sends this text as it is.
            assert_eq!(
                body.as_str(),
                json!({"version": 2, "tags": {"t": 1}, "properties": {"desired": {
                    "interval": 5, "gone": null,
                    "$metadata": {"$lastUpdated": ts, "$lastUpdatedVersion": 2,
                                  "interval": {"$lastUpdated": ts, "$lastUpdatedVersion": 2}},
                    "$version": 2}}})
                .to_string()
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    // The text a connected device receives, byte for byte: the patch in its order, then `$version`.
    let Event::DesiredPatch { id, patch, desired_version } = &a.events[1] else { panic!("{:?}", a.events[1]) };
    assert_eq!((id, *desired_version), (&dev(), 2));
    assert_eq!(patch.as_str(), r#"{"interval":5,"gone":null,"$version":2}"#);
}

#[test]
fn change_body_carries_the_metadata_of_what_a_nested_patch_touched() {
    let mut f = Fixture::with_device("d1");
    f.patch(&dev(), json!({"properties": {"desired": {"a": {"x": 1, "y": {"z": 2}}, "b": 1, "s": [1, 2]}}}));
    let first = f.clock;
    let a = f.patch(
        &dev(),
        json!({"properties": {"desired": {"a": {"y": {"w": "new"}, "x": null}, "c": {"d": true}, "s": "t", "b": null}}}),
    );
    let (t1, t2) = (time::format_ms(first), time::format_ms(f.clock));
    let Some(Event::TwinChanged { body, version, .. }) = a.events.first() else { panic!("{:?}", a.events) };
    assert_eq!(*version, 3);
    // Patch members in the patch's order; `$metadata` only for keys still present, recursing where
    // both the patch and the twin hold an object, the whole subtree's metadata elsewhere.
    let want = json!({"version": 3, "properties": {"desired": {
        "a": {"y": {"w": "new"}, "x": null}, "c": {"d": true}, "s": "t", "b": null,
        "$metadata": {
            "$lastUpdated": t2, "$lastUpdatedVersion": 3,
            "a": {"$lastUpdated": t2, "$lastUpdatedVersion": 3,
                  "y": {"$lastUpdated": t2, "$lastUpdatedVersion": 3,
                        "w": {"$lastUpdated": t2, "$lastUpdatedVersion": 3}}},
            "c": {"$lastUpdated": t2, "$lastUpdatedVersion": 3, "d": {"$lastUpdated": t2, "$lastUpdatedVersion": 3}},
            "s": {"$lastUpdated": t2, "$lastUpdatedVersion": 3}},
        "$version": 3}}});
    assert_eq!(body.as_str(), want.to_string());
    // The untouched leaf kept its own stamp in the twin, which the event does not repeat.
    let twin = f.twin(&dev());
    assert_eq!(twin["properties"]["desired"]["$metadata"]["a"]["y"]["z"]["$lastUpdated"], json!(t1));
}

#[test]
fn reported_change_event_carries_nulls() {
    let mut f = Fixture::with_device("d1");
    f.report(&dev(), json!({"testContent": "x"}));
    let a = f.report(&dev(), json!({"testContent": null}));
    let body = a.events.iter().find_map(|e| match e {
        Event::TwinChanged { body, .. } => Some(body.clone()),
        _ => None,
    });
    let body = body.map(|b| b.to_value()).unwrap_or_default();
    assert_eq!(body["properties"]["reported"]["testContent"], Value::Null);
    assert!(body["properties"]["reported"].as_object().is_some_and(|m| m.contains_key("testContent")));
    assert_eq!(body["properties"]["reported"]["$version"], json!(3));
    assert!(!a.events.iter().any(|e| matches!(e, Event::DesiredPatch { .. })));
}

#[test]
fn lifecycle_and_connection_events() {
    let mut f = Fixture::new();
    let a = f.must(Op::PutDevice { device: device_spec("d1"), if_match: None });
    assert!(
        matches!(&a.events[..], [Event::Lifecycle { op_type, body, .. }] if op_type == "createDeviceIdentity" && body["deviceId"] == "d1")
    );
    let a = f.must(Op::SetConnectionState { id: dev(), connected: true });
    assert_eq!(a.events, vec![Event::Connection { id: dev(), connected: true }]);
    let d = f.state.device("d1").unwrap_or_default();
    assert_eq!(d["connectionState"], json!("Connected"));
    assert_eq!(d["connectionStateUpdatedTime"], json!(time::format_ms(f.clock)));
    assert_eq!(d["lastActivityTime"], json!(time::format_ms(f.clock)));
    assert_eq!(f.twin(&dev())["version"], json!(1), "connection state is not a twin change");
    let e = f.must_reject(Op::SetConnectionState { id: TwinId::module("d1", "m"), connected: true });
    assert_eq!(e, TwinError::ModuleNotFound { device: "d1".into(), module: "m".into() });
}

// ---------------------------------------------------------------- limits at their boundaries

fn reject_patch(f: &mut Fixture, body: Value) -> String {
    assert!(validate_twin_patch(&body).is_err(), "validator accepted {body}");
    invalid_msg(f.must_reject(Op::UpdateTwin { id: dev(), patch_json: body.to_string(), if_match: None }))
}

fn accept_patch(f: &mut Fixture, body: Value) {
    assert_eq!(validate_twin_patch(&body), Ok(()));
    let a = f.patch(&dev(), body);
    assert!(a.result.is_ok(), "{:?}", a.result);
}

#[test]
fn key_length_boundary() {
    let mut f = Fixture::with_device("d1");
    accept_patch(&mut f, json!({"tags": {"k".repeat(1024): 1}}));
    let m = reject_patch(&mut f, json!({"tags": {"a": {"k".repeat(1025): 1}}}));
    assert!(m.contains("tags.a") && m.contains("1024"), "{m}");
    // Multi-byte characters count in UTF-8 bytes: 512 × 'é' = 1024 bytes.
    accept_patch(&mut f, json!({"tags": {"é".repeat(512): 1}}));
    reject_patch(&mut f, json!({"tags": {format!("{}x", "é".repeat(512)): 1}}));
}

#[test]
fn key_characters() {
    let mut f = Fixture::with_device("d1");
    for bad in ["a.b", "$a", "a b", "a\u{1}", "a\u{85}", ""] {
        let m = reject_patch(&mut f, json!({"properties": {"desired": {"x": {bad: 1}}}}));
        assert!(m.contains("properties.desired.x"), "{m}");
    }
    accept_patch(&mut f, json!({"properties": {"desired": {"a-b_c:d@é": 1}}}));
    // Reported keys follow the same rules.
    assert!(validate_reported_patch(&json!({"a.b": 1})).is_err());
    assert!(f.report(&dev(), json!({"$x": 1})).result.is_err());
}

#[test]
fn string_length_boundary() {
    let mut f = Fixture::with_device("d1");
    accept_patch(&mut f, json!({"properties": {"desired": {"s": "x".repeat(4096)}}}));
    let m = reject_patch(&mut f, json!({"properties": {"desired": {"s": "x".repeat(4097)}}}));
    assert!(m.contains("properties.desired.s") && m.contains("4096"), "{m}");
    // Inside arrays too.
    let m = reject_patch(&mut f, json!({"tags": {"arr": [1, "x".repeat(4097)]}}));
    assert!(m.contains("tags.arr[1]"), "{m}");
}

#[test]
fn integer_range_boundary() {
    let mut f = Fixture::with_device("d1");
    accept_patch(&mut f, json!({"tags": {"max": 4_503_599_627_370_495_i64, "min": -4_503_599_627_370_496_i64}}));
    let m = reject_patch(&mut f, json!({"tags": {"n": 4_503_599_627_370_496_i64}}));
    assert!(m.contains("tags.n") && m.contains("4503599627370495"), "{m}");
    reject_patch(&mut f, json!({"tags": {"n": -4_503_599_627_370_497_i64}}));
    let huge: Value = serde_json::from_str(r#"{"tags": {"n": 123456789012345678901234567890}}"#).unwrap_or_default();
    reject_patch(&mut f, huge);
    accept_patch(&mut f, json!({"tags": {"f": 1.5e300}}));
    // Stored exactly.
    assert_eq!(f.twin(&dev())["tags"]["max"], json!(4_503_599_627_370_495_i64));
}

#[test]
fn depth_boundary() {
    let mut f = Fixture::with_device("d1");
    // The guide's deepest valid example: ten nested objects, then a leaf.
    accept_patch(&mut f, json!({"tags": nested(10, json!({"property": "value"}))}));
    accept_patch(&mut f, json!({"properties": {"desired": nested(9, json!({"property": "value"}))}}));
    let m = reject_patch(&mut f, json!({"tags": nested(11, json!({"property": "value"}))}));
    assert!(m.contains("tags.l1.l2") && m.contains("10"), "{m}");
    reject_patch(&mut f, json!({"properties": {"desired": nested(10, json!({"p": {}}))}}));
    // Arrays count as a level.
    accept_patch(&mut f, json!({"tags": nested(9, json!({"arr": [1, 2]}))}));
    reject_patch(&mut f, json!({"tags": nested(10, json!({"arr": [1, 2]}))}));
    let too_deep_report = nested(11, json!({"p": 1}));
    assert!(validate_reported_patch(&too_deep_report).is_err());
}

#[test]
fn section_size_boundaries_on_request() {
    let mut f = Fixture::with_device("d1");
    accept_patch(&mut f, json!({"tags": object_of_size(MAX_TAGS_SIZE)}));
    let m = reject_patch(&mut f, json!({"tags": object_of_size(MAX_TAGS_SIZE + 1)}));
    assert!(m.contains("tags") && m.contains("8192"), "{m}");
    accept_patch(&mut f, json!({"properties": {"desired": object_of_size(MAX_DESIRED_SIZE)}}));
    let m = reject_patch(&mut f, json!({"properties": {"desired": object_of_size(MAX_DESIRED_SIZE + 1)}}));
    assert!(m.contains("properties.desired") && m.contains("32768"), "{m}");
    assert_eq!(validate_reported_patch(&object_of_size(MAX_REPORTED_SIZE)), Ok(()));
    assert!(validate_reported_patch(&object_of_size(MAX_REPORTED_SIZE + 1)).is_err());
    assert_eq!(validate_twin_replace(&json!({"tags": object_of_size(MAX_TAGS_SIZE)})), Ok(()));
    assert!(validate_twin_replace(&json!({"tags": object_of_size(MAX_TAGS_SIZE + 1)})).is_err());
}

#[test]
fn merged_size_is_checked_in_apply() {
    let mut f = Fixture::with_device("d1");
    // Fill tags to the limit minus the room of `,"b":1` (6): exactly full after it.
    accept_patch(&mut f, json!({"tags": object_of_size(MAX_TAGS_SIZE - 6)}));
    // Each patch alone is small; merged, one fits exactly and the next is one over.
    accept_patch(&mut f, json!({"tags": {"b": 1}}));
    assert_eq!(doc_size(&Json::of(&f.twin(&dev())["tags"])), MAX_TAGS_SIZE);
    let version = f.twin(&dev())["version"].clone();
    let body = json!({"tags": {"b": 12}});
    assert_eq!(validate_twin_patch(&body), Ok(()));
    let m = invalid_msg(f.must_reject(Op::UpdateTwin { id: dev(), patch_json: body.to_string(), if_match: None }));
    assert!(m.contains("tags") && m.contains("8192"), "{m}");
    assert_eq!(f.twin(&dev())["version"], version);
    // Removing something makes room again.
    accept_patch(&mut f, json!({"tags": {"k0": null, "b": 12}}));

    // Reported: the same on the merged result.
    let big = "x".repeat(4000);
    let mut g = Fixture::with_device("d1");
    for i in 0..8 {
        assert!(g.report(&dev(), json!({ format!("k{i}"): big })).result.is_ok());
    }
    let reported = g.state.twin_properties(&dev()).unwrap_or_default()["reported"].clone();
    let mut members = reported.as_object().cloned().unwrap_or_default();
    members.remove("$metadata");
    members.remove("$version");
    let used = doc_size(&Json::of(&Value::Object(members)));
    let room = MAX_REPORTED_SIZE - used - 1; // minus the comma
                                             // `"zz":"…"` costs 7 + len.
    assert!(g.report(&dev(), json!({"zz": "y".repeat(room - 7)})).result.is_ok());
    let before = g.state.clone();
    let a = g.report(&dev(), json!({"z2": ""}));
    assert!(matches!(a.result, Err(TwinError::InvalidArgument(ref m)) if m.contains("properties.reported")));
    assert_eq!(g.state.devices, before.devices);
}

#[test]
fn replace_size_limit() {
    let mut f = Fixture::with_device("d1");
    let ok = f.replace(&dev(), json!({"properties": {"desired": object_of_size(MAX_DESIRED_SIZE)}}));
    assert!(ok.result.is_ok());
    let e = f.must_reject(Op::ReplaceTwin {
        id: dev(),
        twin_json: json!({"properties": {"desired": object_of_size(MAX_DESIRED_SIZE + 1)}}).to_string(),
        if_match: None,
    });
    assert!(invalid_msg(e).contains("properties.desired"));
}

#[test]
fn ids_are_validated() {
    assert_eq!(validate_id("device", &"a".repeat(128)), Ok(()));
    assert!(invalid_msg(
        validate_id("device", &"a".repeat(129)).err().unwrap_or(TwinError::InvalidArgument(String::new()))
    )
    .contains("device"));
    assert_eq!(validate_id("module", "a-:.+%_#*?!(),=@;$'Z9"), Ok(()));
    for bad in ["", "a/b", "a b", "é", "a&b"] {
        let e = validate_id("module", bad);
        assert!(matches!(&e, Err(TwinError::InvalidArgument(m)) if m.contains("module")), "{bad:?}: {e:?}");
    }
}

// ---------------------------------------------------------------- snapshot

/// An image is the state when it was taken: writes applied meanwhile (to twins it shares, to new and
/// to deleted devices) change the live state only.
#[test]
fn a_snapshot_image_keeps_the_state_it_was_taken_from() {
    let mut f = Fixture::with_device("d1");
    f.must(Op::PutDevice { device: device_spec("d2"), if_match: None });
    f.patch(&dev(), json!({"tags": {"site": "a"}, "properties": {"desired": {"x": 1}}}));
    let before = f.state.clone();
    let image = f.state.snapshot_image();
    f.patch(&dev(), json!({"tags": {"site": "b"}, "properties": {"desired": {"x": 2}}}));
    f.report(&dev(), json!({"r": 1}));
    f.must(Op::PutModule { module: module_spec("d1", "m"), if_match: None });
    f.must(Op::DeleteDevice { device_id: "d2".into(), if_match: None });
    f.must(Op::PutDevice { device: device_spec("d3"), if_match: None });
    let live = f.state.clone();
    let decoded = ShardState::decode_snapshot(&image.encode(0)).expect("decode the image");
    assert_eq!(decoded, before, "the image encodes the state as it was taken");
    assert_ne!(decoded, live);
    assert_eq!(f.twin(&dev())["tags"]["site"], "b", "the live state has the later writes");
    assert_eq!(ShardState::decode_snapshot(&f.state.encode_snapshot()).as_ref().ok(), Some(&live));
}

#[test]
fn snapshot_round_trips_exactly() {
    let mut f = Fixture::with_device("d1");
    f.must(Op::PutModule { module: module_spec("d1", "m"), if_match: None });
    f.patch(&dev(), json!({"tags": {"a": [1, {"b": null}], "n": 4503599627370495_i64}, "properties": {"desired": {"x": {"y": 0.1}}}}));
    f.report(&TwinId::module("d1", "m"), json!({"r": "é\u{1}"}));
    f.apply(Op::SetConnectionState { id: dev(), connected: true });
    f.apply(Op::PutDevice { device: device_spec("d1"), if_match: None }); // a remembered error
    let bytes = f.state.encode_snapshot();
    assert!(!bytes.is_empty());
    let back = ShardState::decode_snapshot(&bytes);
    assert_eq!(back.as_ref().ok(), Some(&f.state));
    // The JSON layout earlier versions wrote reads back to the same state.
    let json = serde_json::to_vec(&json!({"format": 1, "state": &f.state})).unwrap();
    assert_eq!(ShardState::decode_snapshot(&json).as_ref().ok(), Some(&f.state));
    let mut back = back.unwrap_or_default();
    assert_eq!(back.twin(&dev()), f.state.twin(&dev()));
    // The dedupe window survived: replaying the last command is still a duplicate.
    let c = Command {
        request_id: RequestId(f.next_req),
        timestamp_ms: f.clock,
        op: Op::PutDevice { device: device_spec("d1"), if_match: None },
    };
    assert!(matches!(back.apply(&c).result, Err(TwinError::DeviceAlreadyExists(_))));
    // And the etag counter continues.
    let a = back.apply(&Command {
        request_id: RequestId(999_999),
        timestamp_ms: f.clock + 1,
        op: Op::UpdateTwin { id: dev(), patch_json: "{\"tags\":{}}".into(), if_match: None },
    });
    assert!(a.result.is_ok());
    assert!(back.etag_seq > f.state.etag_seq);
    assert!(ShardState::decode_snapshot(b"garbage").is_err());
    assert!(ShardState::decode_snapshot(&[]).is_err());
}

/// The pre-check's view (chaos finding): a retried If-Match write whose first attempt applied carries
/// an etag its own apply made stale. The pre-check must let it through (the request id is known), and
/// apply answers the first outcome instead of a 412.
#[test]
fn a_retried_if_match_write_is_not_judged_stale_by_its_own_apply() {
    let mut f = Fixture::with_device("d1");
    let etag = f.state.twin_etag(&dev()).unwrap_or_default();
    assert!(!f.state.etag_certainly_stale(&dev(), &etag), "the current etag is not stale");
    let newer = super::etag::etag_text(u64::MAX - 1);
    assert!(!f.state.etag_certainly_stale(&dev(), &newer), "an etag this replica has not seen may be current");
    assert!(f.state.etag_certainly_stale(&dev(), "garbage"), "no etag of ours can never match");
    let op = Op::UpdateTwin {
        id: dev(),
        patch_json: json!({"tags": {"a": 1}}).to_string(),
        if_match: Some(IfMatch::Etag(etag.clone())),
    };
    let cmd = f.cmd(op);
    let first = f.state.apply(&cmd);
    assert!(first.result.is_ok());
    assert!(f.state.etag_certainly_stale(&dev(), &etag), "the etag moved");
    assert!(f.state.remembers(&cmd.request_id), "the pre-check sees that this request applied");
    let retry = f.state.apply(&cmd);
    assert_eq!(retry.result, first.result, "a retry answers the first outcome, not a 412");
}

/// A method job calls each device at most once: only the claim that creates the row calls; a retry of
/// that claim (same request id) still says "call"; a later claim never does; the answer lands once.
#[test]
fn method_job_claims_call_each_device_at_most_once() {
    let mut f = Fixture::with_device("d1");
    let claim = |device: &str| Op::JobMethodClaim {
        job_id: "j".into(),
        job_type: "scheduleDeviceMethod".into(),
        created_ms: T0,
        start_ms: T0,
        device_id: device.into(),
    };
    let first = f.cmd(claim("d1"));
    assert_eq!(f.state.apply(&first).result, Ok(Reply::Claim { claimed: true, running: false }));
    assert_eq!(f.state.apply(&first).result, Ok(Reply::Claim { claimed: true, running: false }), "a retried claim");
    assert_eq!(
        f.must(claim("d1")).result,
        Ok(Reply::Claim { claimed: false, running: true }),
        "another runner's claim"
    );
    assert_eq!(f.state.device_jobs["j"]["d1"].render("j", "d1")["status"], "running");

    let answer = |outcome: Result<(i64, String), String>| Op::JobMethodResult {
        job_id: "j".into(),
        device_id: "d1".into(),
        outcome,
    };
    f.must(answer(Ok((200, r#"{"ok":true}"#.into()))));
    f.must(answer(Err("late and stale".into())));
    let row = f.state.device_jobs["j"]["d1"].render("j", "d1");
    assert_eq!(row["status"], "completed", "{row}");
    assert_eq!(row["outcome"], json!({"deviceMethodResponse": {"status": 200, "payload": {"ok": true}}}));
    assert_eq!(f.must(claim("d1")).result, Ok(Reply::Claim { claimed: false, running: false }));

    // A device that does not exist is never called and fails.
    assert_eq!(f.must(claim("ghost")).result, Ok(Reply::Claim { claimed: false, running: false }));
    let row = f.state.device_jobs["j"]["ghost"].render("j", "ghost");
    assert_eq!(row["status"], "failed", "{row}");
}

/// The tag index follows every way tags change: patches (nested, removal by null), replacement,
/// module twins (not indexed), deletion, and a snapshot round trip rebuilds the same index.
#[test]
fn tag_index_follows_every_tag_change() {
    let mut f = Fixture::new();
    for id in ["a", "b", "c"] {
        f.must(Op::PutDevice { device: device_spec(id), if_match: None });
    }
    let (a, b, c) = (TwinId::device("a"), TwinId::device("b"), TwinId::device("c"));
    f.patch(&a, json!({"tags": {"site": "x", "loc": {"floor": 2}}}));
    f.patch(&b, json!({"tags": {"site": "x", "on": true}}));
    f.patch(&c, json!({"tags": {"Site": "y"}}));
    assert!(f.state.tag_index_is_consistent());
    f.patch(&a, json!({"tags": {"loc": {"floor": null}, "site": "y"}}));
    f.replace(&b, json!({"tags": {"site": "z"}}));
    f.must(Op::PutModule {
        module: ModuleSpec { device_id: "c".into(), module_id: "m".into(), managed_by: None, auth: auth() },
        if_match: None,
    });
    f.patch(&TwinId::module("c", "m"), json!({"tags": {"site": "x"}}));
    // A rejected patch (tags too large) leaves the index alone.
    f.must_reject(Op::UpdateTwin {
        id: a.clone(),
        patch_json: json!({"tags": {"big": object_of_size(MAX_TAGS_SIZE + 1)}}).to_string(),
        if_match: None,
    });
    assert!(f.state.tag_index_is_consistent());
    let site = |s: &ShardState, v: &str| -> Vec<String> {
        let value = tag_index::IndexValue::string(v).unwrap();
        let (_, twins) = s.tagged_devices_after(["SITE"].into_iter(), &value, None).unwrap();
        twins.map(|t| t.device_id.to_string()).collect()
    };
    assert_eq!(site(&f.state, "y"), ["a", "c"]);
    assert!(site(&f.state, "x").is_empty(), "a module twin's tags are not indexed; b's were replaced");
    f.must(Op::DeleteDevice { device_id: "a".into(), if_match: None });
    assert_eq!(site(&f.state, "y"), ["c"]);
    assert!(f.state.tag_index_is_consistent());
    let decoded = ShardState::decode_snapshot(&f.state.encode_snapshot()).unwrap();
    assert_eq!(decoded, f.state, "the index is rebuilt from the snapshot");
}

#[test]
fn quiet_apply_changes_the_state_and_answers_exactly_like_apply_without_events() {
    use super::bulk::{BulkEntry, Identity as BulkIdentity, ImportMode};
    let d = dev();
    let m = TwinId::module("d1", "m1");
    let ops = vec![
        Op::PutDevice { device: device_spec("d1"), if_match: None },
        Op::Bulk {
            entries: vec![BulkEntry {
                id: TwinId::device("d2"),
                mode: ImportMode::Create,
                identity: Some(BulkIdentity::Device(device_spec("d2"))),
                etag: None,
                twin_etag: None,
                tags_json: Some(r#"{"building": 43}"#.into()),
                desired_json: Some(r#"{"fb": "x"}"#.into()),
            }],
        },
        Op::UpdateTwin {
            id: d.clone(),
            patch_json: json!({"tags": {"a": 1}, "properties": {"desired": {"b": {"c": 2}}}}).to_string(),
            if_match: None,
        },
        Op::ReplaceTwin { id: d.clone(), twin_json: json!({"tags": {"z": true}}).to_string(), if_match: None },
        Op::UpdateReported { id: d.clone(), patch_json: json!({"r": 1}).to_string() },
        Op::SetConnectionState { id: d.clone(), connected: true },
        Op::PutModule {
            module: ModuleSpec { device_id: "d1".into(), module_id: "m1".into(), managed_by: None, auth: auth() },
            if_match: None,
        },
        Op::DeleteModule { device_id: m.device_id.clone(), module_id: "m1".into(), if_match: None },
        Op::UpdateTwin { id: TwinId::device("nope"), patch_json: "{}".into(), if_match: None },
        Op::DeleteDevice { device_id: "d2".into(), if_match: None },
    ];
    let (mut loud, mut quiet) = (Fixture::new(), Fixture::new());
    let mut heard_events = 0;
    for op in ops {
        let (a, b) = (loud.cmd(op.clone()), quiet.cmd(op));
        let heard = loud.state.apply(&a);
        let unheard = quiet.state.apply_quietly(&b);
        assert_eq!(heard.result, unheard.result);
        heard_events += heard.events.len();
        assert!(unheard.events.is_empty(), "{:?}", unheard.events);
        assert_eq!(loud.state, quiet.state);
    }
    assert!(heard_events >= 9, "the loud replica built {heard_events} events");
    assert!(quiet.state.tag_index_is_consistent());
}

/// Members the golden twins below do not have (thumbprints, a self-signed identity, a connected
/// device) render as text exactly as through serde.
#[test]
fn twin_text_of_a_self_signed_device_is_its_serde_rendering() {
    let mut f = Fixture::new();
    let mut spec = device_spec("x509-$(1)");
    spec.auth = AuthSpec {
        auth_type: AuthType::SelfSigned,
        primary_key: None,
        secondary_key: None,
        primary_thumbprint: Some("ABCDEF0123456789ABCDEF0123456789ABCDEF01".into()),
        secondary_thumbprint: None,
    };
    f.must(Op::PutDevice { device: spec, if_match: None });
    let id = TwinId::device("x509-$(1)");
    let text = f.state.twin_text(&id).unwrap();
    assert_eq!(text.as_str(), f.state.twin_text_via_serde(&id).unwrap().as_str());
    assert_eq!(text.as_str(), serde_json::to_string(&f.state.twin(&id).unwrap()).unwrap());
    assert!(text.as_str().contains(r#""x509Thumbprint":{"primaryThumbprint":"ABCDEF"#), "{}", text.as_str());
    assert!(text.as_str().contains(r#""authenticationType":"selfSigned""#), "{}", text.as_str());
}

/// Twins whose rendering covers every member kind: tags, nested desired and reported values (big and
/// fractional numbers, escapes, non-ASCII, arrays, booleans, null removal), an edge device, a disabled
/// device with a reason, a module twin.
fn rendering_fixture() -> (Fixture, Vec<TwinId>) {
    let mut f = Fixture::with_device("d1");
    let d1 = TwinId::device("d1");
    let ok = |a: Applied| assert!(a.result.is_ok(), "{:?}", a.result);
    ok(f.patch(
        &d1,
        json!({"tags": {"site": {"building": "B\"7\"", "floor": 3}, "ü": true},
               "properties": {"desired": {"n": 4503599627370495i64, "m": -17, "x": 1.5e-7, "s": "tab\there",
                                          "a": [1, "two", {"three": 3}], "o": {"deep": {"er": false}}}}}),
    ));
    ok(f.patch(&d1, json!({"properties": {"desired": {"o": {"deep": null}, "late": "\u{1F600}"}}})));
    ok(f.report(&d1, json!({"fw": "1.2.3", "temp": {"c": -4.25}})));
    let mut edge = device_spec("edge-1");
    edge.iot_edge = true;
    edge.status = Status::Disabled;
    edge.status_reason = Some("maintenance \"window\"".into());
    f.must(Op::PutDevice { device: edge, if_match: None });
    let e1 = TwinId::device("edge-1");
    ok(f.patch(&e1, json!({"tags": {"role": "gateway"}})));
    f.must(Op::PutModule { module: module_spec("d1", "m1"), if_match: None });
    let m1 = TwinId::module("d1", "m1");
    ok(f.report(&m1, json!({"up": 1})));
    (f, vec![d1, e1, m1])
}

/// The texts these twins rendered as before twins were written straight to text (one per line): the
/// service SDKs see exactly these bytes, so a change to them is a change of the wire format.
const RENDERED: &str = include_str!("testdata/twin_render.jsonl");

#[test]
fn twin_text_is_the_rendered_document_byte_for_byte() {
    let (f, ids) = rendering_fixture();
    let golden: Vec<&str> = RENDERED.lines().collect();
    assert_eq!(golden.len(), ids.len());
    for (id, want) in ids.iter().zip(golden) {
        let text = f.state.twin_text(id).unwrap();
        assert_eq!(text.as_str(), want, "{id:?}: text");
        assert_eq!(f.state.twin_text_via_serde(id).unwrap().as_str(), want, "{id:?}: text through serde");
        let tree = f.state.twin(id).unwrap();
        assert_eq!(serde_json::to_string(&tree).unwrap(), want, "{id:?}: tree");
    }
}

// ---------------------------------------------------------------- restored counters

#[test]
fn a_restore_takes_counters_up_to_the_json_safe_bound_and_names_the_first_past_it() {
    use super::backup::{MetaBackup, MAX_RESTORED_COUNTER};
    let mut f = Fixture::with_device("d1");
    f.must(Op::PutModule { module: module_spec("d1", "m1"), if_match: None });
    let page = f.state.backup_page(None, 10);
    assert_eq!(page.check_counters(), Ok(()));

    let mut at_bound = page.clone();
    at_bound.etag_seq = MAX_RESTORED_COUNTER;
    at_bound.devices.get_mut("d1").unwrap().twin.version = MAX_RESTORED_COUNTER as i64;
    assert_eq!(at_bound.check_counters(), Ok(()));

    let mut forged = page.clone();
    forged.etag_seq = u64::MAX;
    let e = forged.check_counters().unwrap_err();
    assert!(e.starts_with("the page's etag_seq is 18446744073709551615"), "{e}");

    let mut forged = page.clone();
    forged.devices.get_mut("d1").unwrap().modules.get_mut("m1").unwrap().twin.reported_version = -1;
    let e = forged.check_counters().unwrap_err();
    assert!(e.starts_with("module d1/m1's twin reported $version is -1"), "{e}");

    let mut meta = MetaBackup::default();
    assert_eq!(meta.check_counters(), Ok(()));
    meta.configs.etag_seq = MAX_RESTORED_COUNTER + 1;
    let e = meta.check_counters().unwrap_err();
    assert!(e.starts_with("the configurations' etag_seq is 9007199254740992"), "{e}");

    // JSON carried in strings is read later: it must be JSON as a client may send it.
    meta.configs.etag_seq = 1;
    let body = serde_json::json!({"content": {"deviceContent": {"properties.desired.a": 1}}, "targetCondition": "*"});
    let mut spec = super::config::parse("c1", &body, |_| Ok(()), |_| Ok(())).unwrap();
    spec.device_content_json = r#"{"$serde_json::private::RawValue":"[[1]]"}"#.into();
    let c = super::config::Configuration { spec, created_ms: 0, updated_ms: 0, etag: 1 };
    meta.configs.configs.insert("c1".into(), c);
    let e = meta.check_counters().unwrap_err();
    assert!(e.starts_with("configuration c1's content is not JSON"), "{e}");
}
