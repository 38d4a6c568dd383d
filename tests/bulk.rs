//! The bulk registry operation (`POST /devices`) against the real binary: every import mode, a bad
//! entry failing alone while the others apply, IoT Hub's result body, and the call's limits.

use twinhub_testkit as common;

use common::*;
use serde_json::{json, Value};

fn errors_of(r: &Resp) -> Vec<Value> {
    r.json()["errors"].as_array().cloned().unwrap_or_default()
}

fn error_for<'a>(errors: &'a [Value], device: &str) -> &'a Value {
    errors.iter().find(|e| e["deviceId"] == device).unwrap_or_else(|| panic!("no error row for {device}: {errors:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_calls_apply_each_entry_on_its_own() {
    let srv = Server::start(ServerOpts { shard_count: Some(4), ..Default::default() });
    let api = srv.owner();

    // 100 creates over every shard, with tags and desired, in one call.
    let entries: Vec<Value> = (0..100)
        .map(|i| {
            json!({"id": format!("bulk-{i:03}"), "importMode": "create", "status": "enabled",
                   "authentication": {"type": "sas", "symmetricKey": {}},
                   "tags": {"building": i % 7, "n": i}, "properties": {"desired": {"interval": i}}})
        })
        .collect();
    let r = api.send("POST", "/devices", Some(&Value::Array(entries)), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json()["isSuccessful"], true, "{}", r.text);
    assert_eq!(errors_of(&r).len(), 0);
    let t = api.must_get_twin("bulk-042").await;
    assert_eq!(t["tags"]["n"], 42);
    assert_eq!(t["properties"]["desired"]["interval"], 42);
    let dev = api.must_get("/devices/bulk-042").await;
    assert!(
        dev["authentication"]["symmetricKey"]["primaryKey"].as_str().is_some_and(|k| !k.is_empty()),
        "keys generated: {dev}"
    );

    // A mixed call: good entries apply, each bad one fails alone with its own code.
    let etag = api.must_get("/devices/bulk-001").await["etag"].as_str().expect("etag").to_string();
    let twin_etag = api.must_get_twin("bulk-002").await["etag"].as_str().expect("twin etag").to_string();
    let mixed = json!([
        {"id": "bulk-new", "importMode": "create"},
        {"id": "bulk-000", "importMode": "create"},
        {"id": "bad id!", "importMode": "create"},
        {"id": "bulk-003", "importMode": "createOrReplaceEverything"},
        {"id": "bulk-001", "importMode": "updateIfMatchETag", "eTag": "\"AAAAAAAAAAA=\"", "status": "disabled"},
        {"id": "bulk-004", "importMode": "updateIfMatchETag", "eTag": etag.clone(), "status": "disabled"},
        {"id": "bulk-001", "importMode": "update", "status": "disabled"},
        {"id": "bulk-002", "importMode": "updateTwinIfMatchETag", "twinETag": twin_etag, "tags": {"only": "this"}},
        {"id": "bulk-005", "importMode": "updateTwinIfMatchETag", "twinETag": "\"AAAAAAAAAAA=\"", "tags": {"x": 1}},
        {"id": "bulk-006", "importMode": "updateTwin", "properties": {"desired": {"interval": 600}}},
        {"id": "bulk-007", "importMode": "delete"},
        {"id": "bulk-008", "importMode": "deleteIfMatchETag", "eTag": "\"AAAAAAAAAAA=\""},
        {"id": "nobody", "importMode": "delete"},
        {"id": "bulk-009", "importMode": "updateTwin", "tags": {"long": "x".repeat(5000)}},
        {"id": "bulk-010", "moduleId": "m1", "importMode": "create", "tags": {"mod": true}},
    ]);
    let r = api.send("POST", "/devices", Some(&mixed), &[]).await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(r.json()["isSuccessful"], false);
    let errors = errors_of(&r);
    assert_eq!(error_for(&errors, "bulk-000")["errorCode"], "DeviceAlreadyExists", "{errors:?}");
    assert_eq!(error_for(&errors, "bad id!")["errorCode"], "ArgumentInvalid");
    assert!(error_for(&errors, "bulk-003")["errorStatus"].as_str().unwrap_or("").contains("importMode"));
    // bulk-001 appears twice: the second is refused, the first (stale etag) fails on its own.
    let rows_001: Vec<&Value> = errors.iter().filter(|e| e["deviceId"] == "bulk-001").collect();
    assert_eq!(rows_001.len(), 2, "{errors:?}");
    assert!(rows_001.iter().any(|e| e["errorCode"] == "PreconditionFailed"));
    assert!(rows_001.iter().any(|e| e["errorStatus"].as_str().unwrap_or("").contains("more than once")));
    // bulk-004 was given bulk-001's etag: etags are per identity, so that fails too.
    assert_eq!(error_for(&errors, "bulk-004")["errorCode"], "PreconditionFailed");
    assert_eq!(error_for(&errors, "bulk-005")["errorCode"], "PreconditionFailed");
    assert_eq!(error_for(&errors, "bulk-008")["errorCode"], "PreconditionFailed");
    assert_eq!(error_for(&errors, "nobody")["errorCode"], "DeviceNotFound");
    assert_eq!(error_for(&errors, "bulk-009")["errorCode"], "ArgumentInvalid", "a string over 4 KB");
    assert_eq!(errors.len(), 10, "exactly the bad entries: {errors:?}");

    // What the good entries did.
    assert_eq!(api.send("GET", "/devices/bulk-new", None, &[]).await.status, 200);
    let t2 = api.must_get_twin("bulk-002").await;
    assert_eq!(t2["tags"], json!({"only": "this"}), "updateTwin overwrites the tags it is given");
    assert_eq!(t2["properties"]["desired"]["interval"], 2, "and leaves desired alone");
    let t6 = api.must_get_twin("bulk-006").await;
    assert_eq!(t6["properties"]["desired"]["interval"], 600);
    assert_eq!(t6["tags"]["n"], 6);
    assert_eq!(api.send("GET", "/devices/bulk-007", None, &[]).await.status, 404);
    assert_eq!(api.send("GET", "/devices/bulk-008", None, &[]).await.status, 200);
    assert_eq!(api.must_get("/devices/bulk-001").await["status"], "enabled", "neither bulk-001 entry applied");
    assert_eq!(api.must_get("/devices/bulk-004").await["status"], "enabled");
    let m = api.must_get("/devices/bulk-010/modules/m1").await;
    assert_eq!(m["moduleId"], "m1");
    assert_eq!(api.must_get("/twins/bulk-010/modules/m1").await["tags"]["mod"], true);
    let t9 = api.must_get_twin("bulk-009").await;
    assert_eq!(t9["tags"]["n"], 9, "the refused twin entry changed nothing");

    // Twin sections are checked where they lie in the body: each bad one fails its entry alone, with
    // an error naming what is wrong, and a body laid out with whitespace reads as a compact one.
    let sections = r#"[
        {"id": "sec-ok", "importMode": "create",
         "tags": { "site" : "north", "floor": 3, "list": [1, null, {"k": "v"}] },
         "properties": { "desired": { "fw": { "v": "2.0", "gone": null } } } },
        {"id": "sec-not-object", "importMode": "create", "tags": 5},
        {"id": "sec-desired-list", "importMode": "create", "properties": {"desired": [1, 2]}},
        {"id": "sec-dot-key", "importMode": "create", "tags": {"a": {"b.c": 1}}},
        {"id": "sec-deep", "importMode": "create",
         "tags": {"l1":{"l2":{"l3":{"l4":{"l5":{"l6":{"l7":{"l8":{"l9":{"l10":{"l11":{"l12":1}}}}}}}}}}}}},
        {"id": "sec-big-int", "importMode": "create", "properties": {"desired": {"n": 4503599627370496}}},
        {"id": "sec-delete-with-tags", "importMode": "delete", "tags": {"x": 1}},
        7
    ]"#;
    let r = api.send_raw("POST", "/devices", Some(sections.as_bytes().to_vec()), &[]).await;
    assert_eq!(r.status, 400, "{}", r.text);
    let errors = errors_of(&r);
    let status_of = |id: &str| error_for(&errors, id)["errorStatus"].as_str().unwrap_or("").to_string();
    assert!(status_of("sec-not-object").contains("tags must be a JSON object, got 5"), "{errors:?}");
    assert!(status_of("sec-desired-list").contains("properties.desired must be a JSON object"), "{errors:?}");
    assert!(status_of("sec-dot-key").contains("tags.a"), "{errors:?}");
    assert!(status_of("sec-deep").contains("levels deep"), "{errors:?}");
    assert!(status_of("sec-big-int").contains("properties.desired.n"), "{errors:?}");
    assert!(status_of("sec-delete-with-tags").contains("takes no twin sections"), "{errors:?}");
    assert!(status_of("").contains("must be a JSON object"), "the entry 7: {errors:?}");
    assert_eq!(errors.len(), 7, "{errors:?}");
    for id in ["sec-not-object", "sec-desired-list", "sec-dot-key", "sec-deep", "sec-big-int"] {
        assert_eq!(api.send("GET", &format!("/devices/{id}"), None, &[]).await.status, 404, "{id} was created");
    }
    let t = api.must_get_twin("sec-ok").await;
    assert_eq!(t["tags"], json!({"site": "north", "floor": 3, "list": [1, null, {"k": "v"}]}));
    assert_eq!(t["properties"]["desired"]["fw"], json!({"v": "2.0"}), "a null member is a removal");

    // The matching etag works; update without etag overwrites regardless.
    let etag1 = api.must_get("/devices/bulk-001").await["etag"].as_str().expect("etag").to_string();
    let etag8 = api.must_get("/devices/bulk-008").await["etag"].clone();
    let call = json!([
        {"id": "bulk-001", "importMode": "updateIfMatchETag", "eTag": etag1, "status": "disabled"},
        {"id": "bulk-011", "importMode": "update", "status": "disabled", "statusReason": "bulk"},
        {"id": "bulk-008", "importMode": "deleteIfMatchETag", "eTag": etag8},
    ]);
    let r = api.send("POST", "/devices", Some(&call), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(api.must_get("/devices/bulk-001").await["status"], "disabled");
    assert_eq!(api.must_get("/devices/bulk-011").await["statusReason"], "bulk");
    assert_eq!(api.send("GET", "/devices/bulk-008", None, &[]).await.status, 404);

    // Limits of the call itself.
    let too_many: Vec<Value> = (0..101).map(|i| json!({"id": format!("x{i}")})).collect();
    let r = api.send("POST", "/devices", Some(&Value::Array(too_many)), &[]).await;
    assert_error(&r, 400, "ArgumentInvalid");
    let r = api.send("POST", "/devices", Some(&json!({"id": "not-an-array"})), &[]).await;
    assert_error(&r, 400, "ArgumentInvalid");
    // Registry writes need RegistryWrite.
    let ro = srv.api("registryRead", &srv.policy_key("registryRead"));
    let r = ro.send("POST", "/devices", Some(&json!([{"id": "ro"}])), &[]).await;
    assert_eq!(r.status, 401, "{}", r.text);
    // The trailing-slash list the Node SDK sends.
    let r = api.send("GET", "/devices/", None, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.json().as_array().is_some_and(|a| a.len() >= 90));
}
