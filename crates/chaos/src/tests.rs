//! The checker on synthetic histories: it must fail each kind of broken history and pass valid
//! concurrent ones. The randomized tests drive the real `model::ShardState`, so the checker's model is
//! held to the state machine's semantics.

use serde_json::{json, Value};

use super::*;

mod random;

const TWIN: &str = "d1";

fn op(client: u64, invoke: u64, complete: Option<u64>, kind: OpKind, outcome: Outcome) -> Op {
    Op { client, twin: TWIN.into(), invoke_ns: invoke, complete_ns: complete, kind, outcome, final_read: false }
}

fn fin(mut o: Op) -> Op {
    o.final_read = true;
    o
}

fn patch(p: Value) -> OpKind {
    OpKind::PatchDesired { patch: p, if_match: None }
}

fn patch_if(p: Value, etag: &str) -> OpKind {
    OpKind::PatchDesired { patch: p, if_match: Some(format!("\"{etag}\"")) }
}

fn reported(p: Value) -> OpKind {
    OpKind::PatchReported { patch: p }
}

/// An HTTP answer: the whole twin.
fn twin(v: i64, dv: i64, rv: i64, desired: Value) -> Outcome {
    twin_etag(v, dv, rv, desired, None)
}

fn twin_etag(v: i64, dv: i64, rv: i64, desired: Value, etag: Option<&str>) -> Outcome {
    Outcome::Ok {
        version: Some(v),
        desired_version: Some(dv),
        reported_version: Some(rv),
        etag: etag.map(String::from),
        desired: Some(desired),
        reported: Some(json!({})),
    }
}

/// An `Ok` answer with some fields, by struct update (enum variants have none).
#[derive(Default)]
struct A {
    v: Option<i64>,
    dv: Option<i64>,
    rv: Option<i64>,
    etag: Option<String>,
    desired: Option<Value>,
    reported: Option<Value>,
}

impl A {
    fn out(self) -> Outcome {
        Outcome::Ok {
            version: self.v,
            desired_version: self.dv,
            reported_version: self.rv,
            etag: self.etag,
            desired: self.desired,
            reported: self.reported,
        }
    }
}

fn unknown() -> Outcome {
    Outcome::Unknown { reason: "timeout".into() }
}

fn history(ops: Vec<Op>) -> History {
    History { ops, initial: [(TWIN.to_string(), TwinState::fresh())].into_iter().collect() }
}

fn must_pass(h: &History) -> Report {
    let r = check(h);
    assert!(r.is_ok(), "expected a pass:\n{}", r.summary());
    r
}

fn must_fail(h: &History, kind: ViolationKind) -> Report {
    let r = check(h);
    assert!(r.has(kind), "expected {kind:?}:\n{}", r.summary());
    r
}

fn ops_of(r: &Report, kind: ViolationKind) -> Vec<usize> {
    r.of_kind(kind).next().map(|v| v.ops.clone()).unwrap_or_default()
}

// ---- failing histories ----

#[test]
fn test_lost_write_fails() {
    let h = history(vec![
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        fin(op(2, 30, Some(40), OpKind::GetTwin, twin(1, 1, 1, json!({})))),
    ]);
    let r = must_fail(&h, ViolationKind::LostWrite);
    assert!(r.has(ViolationKind::NotLinearizable));
    assert_eq!(ops_of(&r, ViolationKind::NotLinearizable), vec![0, 1]);
    assert!(r.summary().contains("lacks its effect"), "{}", r.summary());
}

#[test]
fn test_lost_write_content_fails_even_at_the_right_version() {
    // The final read is at the right version but W1's key is gone and nothing later touched it.
    let h = history(vec![
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        op(2, 25, Some(30), patch(json!({"b": 2})), twin(3, 3, 1, json!({"a": 1, "b": 2}))),
        fin(op(3, 40, Some(50), OpKind::GetTwin, twin(3, 3, 1, json!({"b": 2})))),
    ]);
    let r = must_fail(&h, ViolationKind::LostWrite);
    let lost: Vec<&Violation> = r.of_kind(ViolationKind::LostWrite).collect();
    assert_eq!(lost.len(), 1, "{}", r.summary());
    assert_eq!(lost[0].ops, vec![0, 2]);
    assert!(r.has(ViolationKind::NotLinearizable));
}

#[test]
fn test_overwritten_write_is_not_lost() {
    let h = history(vec![
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        op(2, 15, Some(30), patch(json!({"a": null})), twin(3, 3, 1, json!({}))),
        fin(op(3, 40, Some(50), OpKind::GetTwin, twin(3, 3, 1, json!({})))),
    ]);
    must_pass(&h);
}

#[test]
fn test_version_going_back_fails() {
    let h = history(vec![
        op(1, 10, Some(20), patch(json!({"a": 1})), A { v: Some(3), dv: Some(3), ..A::default() }.out()),
        op(2, 30, Some(40), patch(json!({"b": 1})), A { v: Some(2), dv: Some(2), ..A::default() }.out()),
    ]);
    let r = must_fail(&h, ViolationKind::VersionWentBack);
    assert_eq!(ops_of(&r, ViolationKind::VersionWentBack), vec![0, 1]);
    assert!(r.has(ViolationKind::NotLinearizable));
}

#[test]
fn test_duplicate_version_fails() {
    let h = history(vec![
        op(1, 10, Some(40), patch(json!({"a": 1})), A { dv: Some(2), ..A::default() }.out()),
        op(2, 20, Some(30), patch(json!({"b": 1})), A { dv: Some(2), ..A::default() }.out()),
    ]);
    let r = must_fail(&h, ViolationKind::DuplicateVersion);
    assert!(!r.has(ViolationKind::VersionWentBack), "concurrent writes are not ordered:\n{}", r.summary());
}

#[test]
fn test_stale_read_fails() {
    let h = history(vec![
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        op(2, 30, Some(40), OpKind::GetTwin, twin(1, 1, 1, json!({}))),
        fin(op(3, 50, Some(60), OpKind::GetTwin, twin(2, 2, 1, json!({"a": 1})))),
    ]);
    let r = must_fail(&h, ViolationKind::StaleRead);
    assert_eq!(ops_of(&r, ViolationKind::StaleRead), vec![0, 1]);
    assert_eq!(ops_of(&r, ViolationKind::NotLinearizable), vec![0, 1]);
    assert!(!r.has(ViolationKind::LostWrite), "{}", r.summary());
}

#[test]
fn test_stale_content_at_a_fresh_version_is_not_linearizable() {
    // Versions look right; only the document is wrong. Only the search can see this.
    let h = history(vec![
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        op(2, 30, Some(40), OpKind::GetTwin, twin(2, 2, 1, json!({"a": 2}))),
    ]);
    let r = must_fail(&h, ViolationKind::NotLinearizable);
    // No write ever set a = 2: the read alone contradicts every possible history.
    assert_eq!(ops_of(&r, ViolationKind::NotLinearizable), vec![1]);
}

#[test]
fn test_two_documents_at_one_version_fail() {
    // A split brain: two leaders each accepted a different write at desired $version 2.
    let h = history(vec![
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        op(2, 10, Some(20), patch(json!({"a": 2})), twin(2, 2, 1, json!({"a": 2}))),
    ]);
    let r = must_fail(&h, ViolationKind::DivergentState);
    assert_eq!(ops_of(&r, ViolationKind::DivergentState), vec![0, 1]);
    assert!(r.has(ViolationKind::DuplicateVersion));
    assert_eq!(ops_of(&r, ViolationKind::NotLinearizable), vec![0, 1]);
}

#[test]
fn test_real_time_order_without_versions_is_enforced() {
    // No versions anywhere: only the search sees that the read must follow both writes.
    let h = history(vec![
        op(1, 10, Some(20), patch(json!({"a": 1})), Outcome::ok()),
        op(2, 30, Some(40), patch(json!({"a": 2})), Outcome::ok()),
        op(3, 50, Some(60), OpKind::GetTwin, A { desired: Some(json!({"a": 1})), ..A::default() }.out()),
    ]);
    let r = must_fail(&h, ViolationKind::NotLinearizable);
    assert_eq!(ops_of(&r, ViolationKind::NotLinearizable), vec![0, 1, 2]);
    // The read is also the last one, so it must show the last acknowledged write.
    assert_eq!(ops_of(&r, ViolationKind::LostWrite), vec![1, 2]);
    // Overlapping, the same answers are fine.
    let mut ok = h.clone();
    ok.ops[0].complete_ns = Some(45);
    must_pass(&ok);
}

#[test]
fn test_duplicated_apply_fails() {
    // One acked write, but reads see desired $version move by two.
    let h = history(vec![
        op(2, 0, Some(5), OpKind::GetTwin, twin(1, 1, 1, json!({}))),
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        fin(op(2, 30, Some(40), OpKind::GetTwin, twin(3, 3, 1, json!({"a": 1})))),
    ]);
    let r = must_fail(&h, ViolationKind::DuplicatedApply);
    assert!(r.summary().contains("advanced by 1"), "{}", r.summary());
    assert!(r.has(ViolationKind::NotLinearizable));
}

#[test]
fn test_duplicated_apply_of_an_unknown_write_fails() {
    let h = history(vec![
        op(1, 10, Some(20), patch(json!({"a": 1})), unknown()),
        fin(op(2, 30, Some(40), OpKind::GetTwin, twin(3, 3, 1, json!({"a": 1})))),
    ]);
    let r = must_fail(&h, ViolationKind::DuplicatedApply);
    assert!(r.summary().contains("advanced by 2"), "{}", r.summary());
}

#[test]
fn test_pushes_out_of_order_fail() {
    let push =
        |t: u64, v: i64, p: Value| op(7, t, Some(t), OpKind::Push { desired_version: v, patch: p }, Outcome::ok());
    let h = history(vec![
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        op(1, 30, Some(40), patch(json!({"a": 2})), twin(3, 3, 1, json!({"a": 2}))),
        push(45, 3, json!({"a": 2, "$version": 3})),
        push(46, 2, json!({"a": 1, "$version": 2})),
    ]);
    let r = must_fail(&h, ViolationKind::PushOutOfOrder);
    assert_eq!(ops_of(&r, ViolationKind::PushOutOfOrder), vec![2, 3]);
    assert!(!r.has(ViolationKind::NotLinearizable), "pushes are not linearized:\n{}", r.summary());
}

fn device_get(client: u64, t0: u64, t1: u64, dv: i64, desired: Value) -> Op {
    let outcome = Outcome::Ok {
        version: None,
        desired_version: Some(dv),
        reported_version: Some(1),
        etag: None,
        desired: Some(desired),
        reported: Some(json!({"$version": 1})),
    };
    op(client, t0, Some(t1), OpKind::DeviceGet, outcome)
}

fn push(client: u64, t: u64, v: i64, p: Value) -> Op {
    op(client, t, Some(t), OpKind::Push { desired_version: v, patch: p }, Outcome::ok())
}

#[test]
fn test_pushes_that_do_not_converge_fail() {
    let h = history(vec![
        device_get(7, 1, 5, 1, json!({})),
        op(1, 10, Some(20), patch(json!({"a": 1, "b": {"x": 1}})), twin(2, 2, 1, json!({"a": 1, "b": {"x": 1}}))),
        push(7, 21, 2, json!({"a": 1, "b": {"x": 1}})),
        op(1, 30, Some(40), patch(json!({"b": {"x": null}})), twin(3, 3, 1, json!({"a": 1, "b": {}}))),
        // The push lost the removal.
        push(7, 41, 3, json!({"b": {}})),
        fin(op(2, 50, Some(60), OpKind::GetTwin, twin(3, 3, 1, json!({"a": 1, "b": {}})))),
    ]);
    let r = must_fail(&h, ViolationKind::PushNotConverged);
    assert_eq!(ops_of(&r, ViolationKind::PushNotConverged), vec![0, 2, 4, 5]);
}

#[test]
fn test_connection_missing_the_final_push_fails() {
    let h = history(vec![
        device_get(7, 1, 5, 1, json!({})),
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        push(7, 21, 2, json!({"a": 1})),
        op(1, 30, Some(40), patch(json!({"a": 2})), twin(3, 3, 1, json!({"a": 2}))),
        fin(device_get(7, 100, 110, 3, json!({"a": 2}))),
    ]);
    let r = must_fail(&h, ViolationKind::PushNotConverged);
    assert!(r.summary().contains("never pushed"), "{}", r.summary());
}

#[test]
fn test_push_of_an_uncommitted_version_fails() {
    let h = history(vec![
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        push(7, 15, 2, json!({"a": 1})),
        push(7, 16, 3, json!({"a": 5})),
        fin(op(2, 50, Some(60), OpKind::GetTwin, twin(2, 2, 1, json!({"a": 1})))),
    ]);
    let r = must_fail(&h, ViolationKind::PushFromFuture);
    assert_eq!(r.of_kind(ViolationKind::PushFromFuture).count(), 1, "{}", r.summary());
}

#[test]
fn test_lost_update_through_if_match_fails() {
    // Two writers read at etag E1; both write If-Match E1; both are acknowledged.
    let h = history(vec![
        op(1, 0, Some(5), OpKind::GetTwin, twin_etag(1, 1, 1, json!({}), Some("E1"))),
        op(1, 10, Some(20), patch_if(json!({"a": 1}), "E1"), twin_etag(2, 2, 1, json!({"a": 1}), Some("E2"))),
        op(2, 30, Some(40), patch_if(json!({"a": 2}), "E1"), twin_etag(3, 3, 1, json!({"a": 2}), Some("E3"))),
    ]);
    let r = must_fail(&h, ViolationKind::NotLinearizable);
    assert_eq!(ops_of(&r, ViolationKind::NotLinearizable), vec![0, 2]);
    let plain = check_with(&h, &CheckConfig { exact_if_match: false, ..CheckConfig::default() });
    assert!(plain.is_ok(), "the simplified If-Match treats both as plain writes:\n{}", plain.summary());
}

#[test]
fn test_412_while_the_etag_was_current_fails() {
    let h = history(vec![
        op(1, 0, Some(5), OpKind::GetTwin, twin_etag(1, 1, 1, json!({}), Some("E1"))),
        op(2, 6, Some(8), patch_if(json!({"a": 2}), "E1"), Outcome::Failed { status: 412, message: "stale".into() }),
        op(1, 10, Some(20), patch(json!({"a": 1})), twin_etag(2, 2, 1, json!({"a": 1}), Some("E2"))),
    ]);
    let r = must_fail(&h, ViolationKind::NotLinearizable);
    assert_eq!(ops_of(&r, ViolationKind::NotLinearizable), vec![0, 1]);
}

// ---- passing histories ----

#[test]
fn test_overlapping_writes_in_either_order_pass() {
    for (v1, v2) in [(2, 3), (3, 2)] {
        let last = if v1 > v2 { 1 } else { 2 };
        let desired_at = |v: i64| if v == 2 { json!({"a": if v1 == 2 { 1 } else { 2 }}) } else { json!({"a": last}) };
        let h = history(vec![
            op(1, 10, Some(50), patch(json!({"a": 1})), twin(v1, v1, 1, desired_at(v1))),
            op(2, 20, Some(40), patch(json!({"a": 2})), twin(v2, v2, 1, desired_at(v2))),
            fin(op(3, 60, Some(70), OpKind::GetTwin, twin(3, 3, 1, json!({"a": last})))),
        ]);
        must_pass(&h);
    }
}

#[test]
fn test_concurrent_read_may_see_either_side_pass() {
    for seen in [json!({}), json!({"a": 1})] {
        let v = if seen == json!({}) { 1 } else { 2 };
        let h = history(vec![
            op(1, 10, Some(50), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
            op(2, 20, Some(40), OpKind::GetTwin, twin(v, v, 1, seen)),
        ]);
        must_pass(&h);
    }
}

#[test]
fn test_unknown_writes_that_did_or_did_not_apply_pass() {
    // Applied before a later acked write.
    must_pass(&history(vec![
        op(1, 10, None, patch(json!({"b": 1})), unknown()),
        op(2, 20, Some(30), patch(json!({"a": 1})), twin(3, 3, 1, json!({"a": 1, "b": 1}))),
        fin(op(3, 40, Some(50), OpKind::GetTwin, twin(3, 3, 1, json!({"a": 1, "b": 1})))),
    ]));
    // Never applied.
    must_pass(&history(vec![
        op(1, 10, None, patch(json!({"b": 1})), unknown()),
        op(2, 20, Some(30), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        fin(op(3, 40, Some(50), OpKind::GetTwin, twin(2, 2, 1, json!({"a": 1})))),
    ]));
    // Timed out early, applied late (after an op that started after the timeout).
    must_pass(&history(vec![
        op(1, 10, Some(15), patch(json!({"b": 1})), unknown()),
        op(2, 20, Some(30), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        fin(op(3, 40, Some(50), OpKind::GetTwin, twin(3, 3, 1, json!({"a": 1, "b": 1})))),
    ]));
    // An unknown reported patch, seen by an MQTT GET only.
    must_pass(&history(vec![
        op(7, 10, None, reported(json!({"t": 20})), unknown()),
        op(
            7,
            20,
            Some(30),
            OpKind::DeviceGet,
            A {
                dv: Some(1),
                rv: Some(2),
                desired: Some(json!({"$version": 1})),
                reported: Some(json!({"t": 20, "$version": 2, "$metadata": {}})),
                ..A::default()
            }
            .out(),
        ),
    ]));
}

#[test]
fn test_failed_412s_pass() {
    let h = history(vec![
        op(1, 0, Some(5), OpKind::GetTwin, twin_etag(1, 1, 1, json!({}), Some("E1"))),
        op(1, 10, Some(20), patch_if(json!({"a": 1}), "E1"), twin_etag(2, 2, 1, json!({"a": 1}), Some("E2"))),
        // Stale etag: correctly refused, even though it overlaps the write that made it stale.
        op(2, 12, Some(40), patch_if(json!({"a": 2}), "E1"), Outcome::Failed { status: 412, message: "stale".into() }),
        // A 412 for an etag no answer showed: a no-op.
        op(2, 41, Some(42), patch_if(json!({"a": 3}), "E9"), Outcome::Failed { status: 412, message: "stale".into() }),
        op(3, 15, Some(25), reported(json!({"r": 1})), A { rv: Some(2), ..A::default() }.out()),
        // If-Match still holds after a reported patch (the etag follows tags and desired only).
        op(
            1,
            30,
            Some(35),
            patch_if(json!({"c": 1}), "E2"),
            Outcome::Ok {
                version: Some(4),
                desired_version: Some(3),
                reported_version: Some(2),
                etag: Some("E3".into()),
                desired: Some(json!({"a": 1, "c": 1})),
                reported: Some(json!({"r": 1})),
            },
        ),
        op(
            2,
            50,
            Some(60),
            OpKind::ReplaceTwin { desired: json!({"z": {"k": null, "j": 1}}), tags: json!({}), if_match: None },
            Outcome::Ok {
                version: Some(5),
                desired_version: Some(4),
                reported_version: Some(2),
                etag: Some("E4".into()),
                desired: Some(json!({"z": {"j": 1}})),
                reported: Some(json!({"r": 1})),
            },
        ),
        fin(op(
            3,
            70,
            Some(80),
            OpKind::GetTwin,
            Outcome::Ok {
                version: Some(5),
                desired_version: Some(4),
                reported_version: Some(2),
                etag: Some("E4".into()),
                desired: Some(json!({"z": {"j": 1}})),
                reported: Some(json!({"r": 1})),
            },
        )),
    ]);
    must_pass(&h);
}

#[test]
fn test_pushes_converge_with_coalescing_pass() {
    let h = history(vec![
        device_get(7, 1, 5, 1, json!({})),
        op(1, 10, Some(20), patch(json!({"a": 1, "b": {"x": 1}})), twin(2, 2, 1, json!({"a": 1, "b": {"x": 1}}))),
        op(1, 30, Some(40), patch(json!({"b": {"x": null}})), twin(3, 3, 1, json!({"a": 1, "b": {}}))),
        // v2 and v3 coalesced into one push.
        push(7, 41, 3, json!({"a": 1, "b": {"x": null}, "$version": 3})),
        op(
            1,
            50,
            Some(60),
            OpKind::ReplaceTwin { desired: json!({"c": 1}), tags: json!({}), if_match: None },
            twin(4, 4, 1, json!({"c": 1})),
        ),
        push(7, 61, 4, json!({"c": 1, "a": null, "b": null, "$version": 4})),
        fin(device_get(7, 70, 80, 4, json!({"c": 1}))),
        fin(op(2, 70, Some(80), OpKind::GetTwin, twin(4, 4, 1, json!({"c": 1})))),
    ]);
    must_pass(&h);
}

#[test]
fn test_initial_state_is_inferred_from_a_first_read() {
    let mut h = history(vec![
        op(1, 0, Some(5), OpKind::GetTwin, twin(7, 4, 1, json!({"q": 1}))),
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(8, 5, 1, json!({"q": 1, "a": 1}))),
    ]);
    h.initial.clear();
    must_pass(&h);
    let wrong = history(h.ops.clone());
    must_fail(&wrong, ViolationKind::NotLinearizable);
}

// ---- the history format and budgets ----

#[test]
fn test_history_round_trips_through_json() {
    let h = history(vec![
        op(
            1,
            10,
            Some(20),
            patch_if(json!({"a": 1.25, "n": null, "big": 12345678901234567890u64}), "E1"),
            twin(2, 2, 1, json!({"a": 1.25})),
        ),
        op(7, 21, Some(21), OpKind::Push { desired_version: 2, patch: json!({"a": 1.25}) }, Outcome::ok()),
        op(2, 30, None, OpKind::DeviceGet, unknown()),
        op(3, 40, Some(41), reported(json!({})), Outcome::Failed { status: 400, message: "bad".into() }),
        fin(op(2, 50, Some(60), OpKind::GetTwin, twin(2, 2, 1, json!({"a": 1.25})))),
    ]);
    let text = h.to_json().unwrap_or_default();
    assert!(text.contains("\"PatchDesired\""), "{text}");
    let back = History::from_json(&text);
    assert_eq!(back, Ok(h.clone()));
    let report = check(&h);
    let report_text = serde_json::to_string(&report).unwrap_or_default();
    let report_back: Report = serde_json::from_str(&report_text).unwrap_or_default();
    assert_eq!(report_back, report);
}

#[test]
fn test_hand_written_json_is_read() {
    let text = r#"{"ops": [
        {"client": 1, "twin": "d1", "invoke_ns": 10, "complete_ns": 20,
         "kind": {"PatchDesired": {"patch": {"a": 1}}},
         "outcome": {"Ok": {"version": 2, "desired_version": 2}}},
        {"client": 2, "twin": "d1", "invoke_ns": 30, "complete_ns": 40, "final_read": true,
         "kind": "GetTwin",
         "outcome": {"Ok": {"version": 2, "desired_version": 2, "reported_version": 1,
                            "desired": {"a": 1, "$version": 2}, "reported": {"$version": 1}}}}
    ], "initial": {"d1": {"desired_version": 1, "reported_version": 1, "version": 1}}}"#;
    let h = History::from_json(text);
    assert!(h.is_ok(), "{h:?}");
    // The example in chaos/README.md.
    let readme = r#"{"client": 3, "twin": "dev-1", "invoke_ns": 1000, "complete_ns": 2500,
 "kind": {"PatchDesired": {"patch": {"a": 1, "b": null}, "if_match": "\"AAAAAAAAAAs=\""}},
 "outcome": {"Ok": {"version": 5, "desired_version": 3, "reported_version": 2, "etag": "AAAAAAAAAAw=",
                    "desired": {"a": 1}, "reported": {"t": 20}}}}"#;
    let op: Result<Op, _> = serde_json::from_str(readme);
    assert!(op.as_ref().is_ok_and(|op| op.kind.if_match().as_deref() == Some("AAAAAAAAAAs=")), "{op:?}");
    let h = h.unwrap_or_default();
    assert_eq!(h.ops.len(), 2);
    must_pass(&h);
}

#[test]
fn test_malformed_ops_are_reported() {
    let h = history(vec![
        op(1, 30, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        op(1, 40, Some(50), patch(json!([1])), unknown()),
        op(1, 40, None, OpKind::GetTwin, twin(1, 1, 1, json!({}))),
    ]);
    let r = check(&h);
    assert_eq!(r.of_kind(ViolationKind::MalformedHistory).count(), 3, "{}", r.summary());
}

#[test]
fn test_search_budget_gives_inconclusive() {
    // Many concurrent unknown writes and an answer that no subset explains cheaply.
    let mut ops: Vec<Op> = (0..24).map(|i| op(i, 10, None, patch(json!({format!("k{i}"): i})), unknown())).collect();
    ops.push(op(99, 20, Some(30), OpKind::GetTwin, A { desired: Some(json!({"zz": 1})), ..A::default() }.out()));
    let h = history(ops);
    let r = check_with(&h, &CheckConfig { max_steps: 1_000, ..CheckConfig::default() });
    assert!(r.violations.is_empty(), "{}", r.summary());
    assert_eq!(r.inconclusive.len(), 1, "{}", r.summary());
}

#[test]
fn test_independent_twins_are_checked_independently() {
    let mut ok_twin = vec![
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        fin(op(2, 30, Some(40), OpKind::GetTwin, twin(2, 2, 1, json!({"a": 1})))),
    ];
    for o in &mut ok_twin {
        o.twin = "d2/m1".into();
    }
    let mut ops = vec![
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        fin(op(2, 30, Some(40), OpKind::GetTwin, twin(1, 1, 1, json!({})))),
    ];
    ops.extend(ok_twin);
    let mut h = history(ops);
    h.initial.insert("d2/m1".into(), TwinState::fresh());
    let r = check(&h);
    assert_eq!(r.twins_checked, 2);
    assert!(!r.violations.is_empty());
    assert!(r.violations.iter().all(|v| v.twin == TWIN), "{}", r.summary());
}

fn feed(client: u64, at: u64, kind: OpKind) -> Op {
    op(client, at, Some(at), kind, Outcome::ok())
}

#[test]
fn test_feed_delivery_by_event_merged_event_or_resync_passes() {
    let h = history(vec![
        feed(9, 5, OpKind::FeedResync),
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        op(1, 30, Some(40), patch(json!({"a": 2})), twin(3, 3, 1, json!({"a": 2}))),
        op(1, 50, Some(60), patch(json!({"a": 3})), twin(4, 4, 1, json!({"a": 3}))),
        feed(9, 45, OpKind::FeedEvent { version: 2, merged: 1 }),
        // Versions 3 and 4 as one coalesced event; then a repeat (at least once).
        feed(9, 65, OpKind::FeedEvent { version: 4, merged: 2 }),
        feed(9, 66, OpKind::FeedEvent { version: 4, merged: 2 }),
        fin(op(2, 70, Some(80), OpKind::GetTwin, twin(4, 4, 1, json!({"a": 3})))),
    ]);
    must_pass(&h);
}

#[test]
fn test_feed_missing_an_acknowledged_change_fails() {
    let h = history(vec![
        feed(9, 5, OpKind::FeedResync),
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        op(1, 30, Some(40), patch(json!({"a": 2})), twin(3, 3, 1, json!({"a": 2}))),
        feed(9, 45, OpKind::FeedEvent { version: 3, merged: 1 }),
        fin(op(2, 70, Some(80), OpKind::GetTwin, twin(3, 3, 1, json!({"a": 2})))),
    ]);
    assert_eq!(ops_of(&must_fail(&h, ViolationKind::FeedMissed), ViolationKind::FeedMissed)[0], 1);
    // A resync after the write covers it.
    let mut ops = h.ops.clone();
    ops.push(feed(9, 50, OpKind::FeedResync));
    must_pass(&history(ops));
}

#[test]
fn test_feed_version_going_back_without_a_resync_fails() {
    let h = history(vec![
        feed(9, 5, OpKind::FeedResync),
        op(1, 10, Some(20), patch(json!({"a": 1})), twin(2, 2, 1, json!({"a": 1}))),
        op(1, 30, Some(40), patch(json!({"a": 2})), twin(3, 3, 1, json!({"a": 2}))),
        feed(9, 45, OpKind::FeedEvent { version: 3, merged: 1 }),
        feed(9, 46, OpKind::FeedEvent { version: 2, merged: 1 }),
        fin(op(2, 70, Some(80), OpKind::GetTwin, twin(3, 3, 1, json!({"a": 2})))),
    ]);
    must_fail(&h, ViolationKind::FeedOutOfOrder);
    // Another connection (a reconnect) may see it again, in its own order.
    let mut ops = h.ops.clone();
    ops[4].client = 10;
    must_pass(&history(ops));
}
