//! The HTTPS service API (docs/iothub-protocol.md §3.1–3.2) against the real `twinhub` binary: registry, twins,
//! optimistic concurrency, SAS auth, malformed input and limits.

use twinhub_testkit as common;

use common::*;
use serde_json::{json, Value};

// IoT Hub error codes (the text after `ErrorCode:` in the error body's Message).
const DEVICE_NOT_FOUND: &str = "DeviceNotFound";
const MODULE_NOT_FOUND: &str = "ModuleNotFound";
const DEVICE_ALREADY_EXISTS: &str = "DeviceAlreadyExists";
const MODULE_ALREADY_EXISTS: &str = "ModuleAlreadyExistsOnDevice";
const PRECONDITION_FAILED: &str = "PreconditionFailed";
const ARGUMENT_INVALID: &str = "ArgumentInvalid";
const UNAUTHORIZED: &str = "IotHubUnauthorizedAccess";
const TOO_MANY_MODULES: &str = "TooManyModulesOnDevice";

fn assert_generated_key(k: &Value, what: &str) -> String {
    let s = k.as_str().unwrap_or_else(|| panic!("{what}: key is not a string: {k}"));
    assert!(!s.is_empty(), "{what}: generated key is empty");
    use base64::Engine;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap_or_else(|e| panic!("{what}: generated key {s:?} is not base64: {e}"));
    assert!(raw.len() >= 16, "{what}: generated key has only {} bytes", raw.len());
    s.to_string()
}

fn assert_generated_keys(doc: &Value, what: &str) -> (String, String) {
    let sk = doc
        .pointer("/authentication/symmetricKey")
        .unwrap_or_else(|| panic!("{what}: no authentication.symmetricKey in {doc}"));
    let p = assert_generated_key(&sk["primaryKey"], what);
    let s = assert_generated_key(&sk["secondaryKey"], what);
    assert_ne!(p, s, "{what}: primary and secondary keys must differ");
    (p, s)
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` (the epoch-zero `0001-01-01T00:00:00Z` of a fresh section is allowed too).
fn assert_timestamp(v: &Value, what: &str) {
    let s = v.as_str().unwrap_or_else(|| panic!("{what}: timestamp is not a string: {v}"));
    if s == "0001-01-01T00:00:00Z" {
        return;
    }
    let b = s.as_bytes();
    let ok = b.len() >= 24
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && b[19] == b'.'
        && b[b.len() - 1] == b'Z'
        && b[20..b.len() - 1].iter().all(u8::is_ascii_digit)
        && b.len() - 21 >= 3
        && [0..4, 5..7, 8..10, 11..13, 14..16, 17..19].into_iter().all(|r| b[r].iter().all(u8::is_ascii_digit));
    assert!(ok, "{what}: {s:?} is not ISO-8601 UTC with milliseconds");
}

/// A timestamp written by an update (not the fresh-section epoch), with milliseconds.
fn assert_updated_timestamp(v: &Value, what: &str) {
    assert_timestamp(v, what);
    assert_ne!(v.as_str(), Some("0001-01-01T00:00:00Z"), "{what}: not updated");
}

// ---------------------------------------------------------------------------------------------------
// Registry

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_crud_generated_keys_conflicts_and_if_match() {
    let srv = Server::start_default();
    let api = srv.owner();

    // Generated keys for `{}` (Python SDK) and for empty strings (Node SDK).
    let d1 = api
        .must_ok(
            "PUT",
            "/devices/d1",
            Some(&json!({"deviceId": "d1", "status": "enabled",
                          "authentication": {"type": "sas", "symmetricKey": {}}})),
            &[],
        )
        .await;
    assert_eq!(d1["deviceId"], "d1");
    assert_eq!(d1["status"], "enabled");
    let (p1, s1) = assert_generated_keys(&d1, "d1");
    let e1 = etag_of(&d1);
    assert!(d1["generationId"].as_str().is_some_and(|g| !g.is_empty()), "generationId: {d1}");

    let d2 = api
        .must_ok(
            "PUT",
            "/devices/d2",
            Some(&json!({"deviceId": "d2",
                          "authentication": {"symmetricKey": {"primaryKey": "", "secondaryKey": ""}}})),
            &[],
        )
        .await;
    let (p2, _) = assert_generated_keys(&d2, "d2");
    assert_ne!(p1, p2, "two devices got the same generated key");

    // Given keys are kept as given.
    let pk = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    let sk = "HxweHRwbGhkYFxYVFBMSERAPDg0MCwoJCAcGBQQDAgE=";
    let d3 = api
        .must_ok(
            "PUT",
            "/devices/d3",
            Some(&json!({"deviceId": "d3",
                          "authentication": {"type": "sas", "symmetricKey": {"primaryKey": pk, "secondaryKey": sk}}})),
            &[],
        )
        .await;
    assert_eq!(d3.pointer("/authentication/symmetricKey/primaryKey"), Some(&json!(pk)));
    assert_eq!(d3.pointer("/authentication/symmetricKey/secondaryKey"), Some(&json!(sk)));

    // GET returns what was created.
    let g1 = api.must_get("/devices/d1").await;
    assert_eq!(g1["deviceId"], "d1");
    assert_eq!(etag_of(&g1), e1);
    assert_eq!(g1.pointer("/authentication/symmetricKey/primaryKey"), Some(&json!(p1)));
    assert_eq!(g1.pointer("/authentication/symmetricKey/secondaryKey"), Some(&json!(s1)));

    // Duplicate create without If-Match → 409, device unchanged.
    api.must_err(
        409,
        DEVICE_ALREADY_EXISTS,
        "PUT",
        "/devices/d1",
        Some(&json!({"deviceId": "d1", "status": "disabled", "authentication": {"symmetricKey": {}}})),
        &[],
    )
    .await;
    let g1b = api.must_get("/devices/d1").await;
    assert_eq!(g1b["status"], "enabled");
    assert_eq!(etag_of(&g1b), e1);
    assert_eq!(g1b.pointer("/authentication/symmetricKey/primaryKey"), Some(&json!(p1)));

    // Unknown device → 404.
    api.must_err(404, DEVICE_NOT_FOUND, "GET", "/devices/nope", None, &[]).await;

    // Update with the current etag.
    let mut upd = g1.clone();
    upd["status"] = json!("disabled");
    let u1 = api.must_ok("PUT", "/devices/d1", Some(&upd), &[("If-Match", &quoted(&e1))]).await;
    assert_eq!(u1["status"], "disabled");
    let e1b = etag_of(&u1);
    assert_ne!(e1b, e1, "device etag must change on update");
    assert_eq!(u1.pointer("/authentication/symmetricKey/primaryKey"), Some(&json!(p1)));

    // Update with the stale etag → 412, unchanged.
    let mut upd2 = g1.clone();
    upd2["status"] = json!("enabled");
    api.must_err(412, PRECONDITION_FAILED, "PUT", "/devices/d1", Some(&upd2), &[("If-Match", &quoted(&e1))]).await;
    let g = api.must_get("/devices/d1").await;
    assert_eq!(g["status"], "disabled");
    assert_eq!(etag_of(&g), e1b);

    // Update with "*" matches anything.
    let u2 = api.must_ok("PUT", "/devices/d1", Some(&upd2), &[("If-Match", "\"*\"")]).await;
    assert_eq!(u2["status"], "enabled");
    let e1c = etag_of(&u2);
    assert_ne!(e1c, e1b);

    // Update of a device that does not exist, with an etag → 404 (nothing created).
    api.must_err(
        404,
        DEVICE_NOT_FOUND,
        "PUT",
        "/devices/ghost",
        Some(&json!({"deviceId": "ghost", "authentication": {"symmetricKey": {}}})),
        &[("If-Match", &quoted(&e1c))],
    )
    .await;
    api.must_err(404, DEVICE_NOT_FOUND, "GET", "/devices/ghost", None, &[]).await;

    // DELETE with a stale etag → 412, still there; an empty tag is a condition too, one no etag meets.
    api.must_err(412, PRECONDITION_FAILED, "DELETE", "/devices/d1", None, &[("If-Match", &quoted(&e1))]).await;
    for empty in ["\"\"", "", "W/\"\""] {
        api.must_err(412, PRECONDITION_FAILED, "DELETE", "/devices/d1", None, &[("If-Match", empty)]).await;
        let patch = json!({"tags": {"unconditional": 1}});
        api.must_err(412, PRECONDITION_FAILED, "PATCH", "/twins/d1", Some(&patch), &[("If-Match", empty)]).await;
    }
    api.must_get("/devices/d1").await;
    assert!(api.must_get_twin("d1").await["tags"].get("unconditional").is_none());

    // DELETE with the current etag → 204 with an empty body, then 404.
    let r = api.must(204, "DELETE", "/devices/d1", None, &[("If-Match", &quoted(&e1c))]).await;
    assert!(r.text.is_empty(), "DELETE 204 must have no body, got {:?}", r.text);
    api.must_err(404, DEVICE_NOT_FOUND, "GET", "/devices/d1", None, &[]).await;
    api.must_err(404, DEVICE_NOT_FOUND, "GET", "/twins/d1", None, &[]).await;
    api.must_err(404, DEVICE_NOT_FOUND, "DELETE", "/devices/d1", None, &[("If-Match", "\"*\"")]).await;

    // DELETE with "*".
    api.must(204, "DELETE", "/devices/d2", None, &[("If-Match", "\"*\"")]).await;
    api.must_err(404, DEVICE_NOT_FOUND, "GET", "/devices/d2", None, &[]).await;

    // Re-creating a deleted id works and gives new keys and a fresh twin.
    let d1n = api.must_create_device("d1").await;
    let (p1n, _) = assert_generated_keys(&d1n, "d1 again");
    assert_ne!(p1n, p1, "a re-created device must get new generated keys");
    let t = api.must_get_twin("d1").await;
    assert_eq!(desired_version(&t), 1);
    assert_eq!(user_props(&t["properties"]["desired"]), json!({}));

    // Ids with characters that need URL encoding round-trip.
    let odd = "dev:1.a+b_c(x)=@$'";
    let d = api.must_create_device(odd).await;
    assert_eq!(d["deviceId"], odd);
    let g = api.must_get(&format!("/devices/{}", enc(odd))).await;
    assert_eq!(g["deviceId"], odd);
    let t = api.must_get_twin(odd).await;
    assert_eq!(t["deviceId"], odd);

    // Invalid ids are rejected with 400 and not created.
    let bad = "bad id with spaces";
    api.must_err(
        400,
        ARGUMENT_INVALID,
        "PUT",
        &format!("/devices/{}", enc(bad)),
        Some(&json!({"deviceId": bad, "authentication": {"symmetricKey": {}}})),
        &[],
    )
    .await;
    let too_long = "x".repeat(129);
    api.must_err(
        400,
        ARGUMENT_INVALID,
        "PUT",
        &format!("/devices/{too_long}"),
        Some(&json!({"deviceId": too_long, "authentication": {"symmetricKey": {}}})),
        &[],
    )
    .await;
    let ok_128 = "y".repeat(128);
    api.must_create_device(&ok_128).await;
    let list = api.must_get("/devices?top=100").await;
    let ids: Vec<&str> = list.as_array().unwrap().iter().filter_map(|d| d["deviceId"].as_str()).collect();
    assert!(!ids.contains(&bad) && !ids.contains(&too_long.as_str()), "invalid ids listed: {ids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_limit_and_cascading_delete() {
    let srv = Server::start_default();
    let api = srv.owner();
    api.must_create_device("dm").await;

    let m1 = api.must_create_module("dm", "m1").await;
    assert_eq!(m1["moduleId"], "m1");
    assert_eq!(m1["deviceId"], "dm");
    assert_generated_keys(&m1, "module m1");
    etag_of(&m1);

    // Duplicate module → 409.
    api.must_err(
        409,
        MODULE_ALREADY_EXISTS,
        "PUT",
        "/devices/dm/modules/m1",
        Some(&json!({"deviceId": "dm", "moduleId": "m1", "authentication": {"symmetricKey": {}}})),
        &[],
    )
    .await;
    // Module on a device that does not exist → 404.
    api.must_err(
        404,
        DEVICE_NOT_FOUND,
        "PUT",
        "/devices/nodev/modules/m1",
        Some(&json!({"deviceId": "nodev", "moduleId": "m1", "authentication": {"symmetricKey": {}}})),
        &[],
    )
    .await;
    api.must_err(404, MODULE_NOT_FOUND, "GET", "/devices/dm/modules/nomod", None, &[]).await;
    api.must_err(404, MODULE_NOT_FOUND, "GET", "/twins/dm/modules/nomod", None, &[]).await;

    let g = api.must_get("/devices/dm/modules/m1").await;
    assert_eq!(g["moduleId"], "m1");
    assert_eq!(
        g.pointer("/authentication/symmetricKey/primaryKey"),
        m1.pointer("/authentication/symmetricKey/primaryKey")
    );

    // Module twin: its own document and versions, independent of the device twin.
    let mt = api.must_get("/twins/dm/modules/m1").await;
    assert_eq!(mt["deviceId"], "dm");
    assert_eq!(mt["moduleId"], "m1");
    assert_eq!(desired_version(&mt), 1);
    let mt2 = api
        .must_ok(
            "PATCH",
            "/twins/dm/modules/m1",
            Some(&json!({"tags": {"role": "edge"}, "properties": {"desired": {"rate": 5}}})),
            &[("If-Match", &quoted(&etag_of(&mt)))],
        )
        .await;
    assert_eq!(mt2["moduleId"], "m1");
    assert_eq!(desired_version(&mt2), 2);
    assert_eq!(tags_of(&mt2), json!({"role": "edge"}));
    assert_eq!(user_props(&mt2["properties"]["desired"]), json!({"rate": 5}));
    let mt3 = api
        .must_ok(
            "PUT",
            "/twins/dm/modules/m1",
            Some(&json!({"tags": {"only": 1}, "properties": {"desired": {"x": "y"}}})),
            &[],
        )
        .await;
    assert_eq!(tags_of(&mt3), json!({"only": 1}));
    assert_eq!(user_props(&mt3["properties"]["desired"]), json!({"x": "y"}));
    assert_eq!(desired_version(&mt3), 3);
    let dt = api.must_get_twin("dm").await;
    assert_eq!(desired_version(&dt), 1, "module twin writes must not touch the device twin");
    assert_eq!(tags_of(&dt), json!({}));

    // Up to 20 modules per device; the 21st is refused and not created.
    for i in 2..=20 {
        api.must_create_module("dm", &format!("m{i}")).await;
    }
    let list = api.must_get("/devices/dm/modules").await;
    assert_eq!(list.as_array().map(Vec::len), Some(20), "module list: {list}");
    api.must_err(
        400,
        TOO_MANY_MODULES,
        "PUT",
        "/devices/dm/modules/m21",
        Some(&json!({"deviceId": "dm", "moduleId": "m21", "authentication": {"symmetricKey": {}}})),
        &[],
    )
    .await;
    api.must_err(404, MODULE_NOT_FOUND, "GET", "/devices/dm/modules/m21", None, &[]).await;
    let list = api.must_get("/devices/dm/modules").await;
    assert_eq!(list.as_array().map(Vec::len), Some(20));

    // Delete one module: 204, gone with its twin; then a 21st fits again.
    api.must(204, "DELETE", "/devices/dm/modules/m20", None, &[("If-Match", "\"*\"")]).await;
    api.must_err(404, MODULE_NOT_FOUND, "GET", "/devices/dm/modules/m20", None, &[]).await;
    api.must_err(404, MODULE_NOT_FOUND, "GET", "/twins/dm/modules/m20", None, &[]).await;
    api.must_create_module("dm", "m21").await;

    // Deleting the device deletes its modules and all their twins.
    api.must(204, "DELETE", "/devices/dm", None, &[("If-Match", "\"*\"")]).await;
    api.must_err(404, DEVICE_NOT_FOUND, "GET", "/devices/dm", None, &[]).await;
    api.must_err(404, DEVICE_NOT_FOUND, "GET", "/twins/dm", None, &[]).await;
    let r = api.send("GET", "/devices/dm/modules/m1", None, &[]).await;
    assert_eq!(r.status, 404, "module of a deleted device: {}", r.text);
    let r = api.send("GET", "/twins/dm/modules/m1", None, &[]).await;
    assert_eq!(r.status, 404, "module twin of a deleted device: {}", r.text);

    // Re-creating the device starts clean: no modules, fresh twin.
    api.must_create_device("dm").await;
    let list = api.must_get("/devices/dm/modules").await;
    assert_eq!(list, json!([]), "modules survived their device's deletion");
    api.must_err(404, MODULE_NOT_FOUND, "GET", "/twins/dm/modules/m1", None, &[]).await;
    let m1b = api.must_create_module("dm", "m1").await;
    let mt = api.must_get("/twins/dm/modules/m1").await;
    assert_eq!(desired_version(&mt), 1, "module twin survived its deletion: {mt}");
    assert_eq!(tags_of(&mt), json!({}));
    assert_ne!(
        m1b.pointer("/authentication/symmetricKey/primaryKey"),
        m1.pointer("/authentication/symmetricKey/primaryKey")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_with_top_and_statistics() {
    let srv = Server::start_default();
    let api = srv.owner();
    let stats = api.must_get("/statistics/devices").await;
    assert_eq!(
        (
            stats["totalDeviceCount"].as_i64(),
            stats["enabledDeviceCount"].as_i64(),
            stats["disabledDeviceCount"].as_i64()
        ),
        (Some(0), Some(0), Some(0)),
        "empty hub statistics: {stats}"
    );
    for i in 0..7 {
        let status = if i < 5 { "enabled" } else { "disabled" };
        api.must_ok(
            "PUT",
            &format!("/devices/ls{i}"),
            Some(&json!({"deviceId": format!("ls{i}"), "status": status, "authentication": {"symmetricKey": {}}})),
            &[],
        )
        .await;
    }
    // Modules are not devices.
    api.must_create_module("ls0", "mod").await;

    let all = api.must_get("/devices?top=100").await;
    let mut ids: Vec<String> =
        all.as_array().unwrap().iter().map(|d| d["deviceId"].as_str().unwrap().to_string()).collect();
    ids.sort();
    assert_eq!(ids, (0..7).map(|i| format!("ls{i}")).collect::<Vec<_>>());
    let three = api.must_get("/devices?top=3").await;
    assert_eq!(three.as_array().map(Vec::len), Some(3), "top=3: {three}");
    for d in three.as_array().unwrap() {
        assert!(ids.contains(&d["deviceId"].as_str().unwrap().to_string()));
    }
    let stats = api.must_get("/statistics/devices").await;
    assert_eq!(stats["totalDeviceCount"].as_i64(), Some(7), "{stats}");
    assert_eq!(stats["enabledDeviceCount"].as_i64(), Some(5), "{stats}");
    assert_eq!(stats["disabledDeviceCount"].as_i64(), Some(2), "{stats}");

    api.must(204, "DELETE", "/devices/ls6", None, &[("If-Match", "\"*\"")]).await;
    api.must(204, "DELETE", "/devices/ls0", None, &[("If-Match", "\"*\"")]).await;
    let stats = api.must_get("/statistics/devices").await;
    assert_eq!(stats["totalDeviceCount"].as_i64(), Some(5), "{stats}");
    assert_eq!(stats["enabledDeviceCount"].as_i64(), Some(4), "{stats}");
    assert_eq!(stats["disabledDeviceCount"].as_i64(), Some(1), "{stats}");
    let all = api.must_get("/devices?top=100").await;
    assert_eq!(all.as_array().map(Vec::len), Some(5));
}

// ---------------------------------------------------------------------------------------------------
// Twins

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twin_shape_merge_null_and_metadata() {
    let srv = Server::start_default();
    let api = srv.owner();
    api.must_create_device("t1").await;

    let r = api.must(200, "GET", "/twins/t1", None, &[]).await;
    let t0 = r.json().clone();
    assert_eq!(t0["deviceId"], "t1");
    assert!(t0.get("moduleId").is_none() || t0["moduleId"].is_null() || t0["moduleId"] == "", "{t0}");
    let e0 = etag_of(&t0);
    {
        use base64::Engine;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(&e0)
            .unwrap_or_else(|e| panic!("twin etag {e0:?} is not base64: {e}"));
        assert_eq!(raw.len(), 8, "twin etag should be base64 of an 8-byte counter: {e0}");
    }
    let v0 = twin_version(&t0);
    assert_eq!(t0["status"], "enabled");
    for section in ["desired", "reported"] {
        let s = &t0["properties"][section];
        assert_eq!(s["$version"], 1, "fresh {section}: {s}");
        assert_timestamp(&s["$metadata"]["$lastUpdated"], section);
        assert_eq!(user_props(s), json!({}), "fresh {section} has user properties");
    }
    assert_eq!(tags_of(&t0), json!({}));

    // Merge patch of tags and desired.
    let t1 = api
        .must_patch_twin(
            "t1",
            &json!({"tags": {"loc": {"bldg": "43", "floor": 1}},
                    "properties": {"desired": {"cfg": {"rate": 5, "mode": "fast"}, "name": "x", "arr": [1, {"a": 2}]}}}),
        )
        .await;
    assert_eq!(tags_of(&t1), json!({"loc": {"bldg": "43", "floor": 1}}));
    let d = &t1["properties"]["desired"];
    assert_eq!(user_props(d), json!({"cfg": {"rate": 5, "mode": "fast"}, "name": "x", "arr": [1, {"a": 2}]}));
    assert_eq!(desired_version(&t1), 2, "desired $version +1 per desired change");
    assert_eq!(reported_version(&t1), 1, "reported $version untouched by desired patch");
    assert!(twin_version(&t1) > v0, "twin version must grow");
    let e1 = etag_of(&t1);
    assert_ne!(e1, e0);
    // $metadata mirrors every level and leaf, with $lastUpdatedVersion in desired.
    let md = &d["$metadata"];
    assert_updated_timestamp(&md["$lastUpdated"], "desired.$metadata");
    assert_eq!(md["$lastUpdatedVersion"], 2, "{md}");
    for p in ["/cfg", "/cfg/rate", "/cfg/mode", "/name", "/arr"] {
        let m = md.pointer(p).unwrap_or_else(|| panic!("no $metadata{p}: {md}"));
        assert_updated_timestamp(&m["$lastUpdated"], &format!("desired.$metadata{p}"));
        assert_eq!(m["$lastUpdatedVersion"], 2, "$metadata{p}: {m}");
    }
    // GET returns the same document.
    let g = api.must_get_twin("t1").await;
    assert_eq!(twin_state(&g), twin_state(&t1));

    // Nested merge: change one leaf, add one, the rest stays.
    let t2 = api.must_patch_twin("t1", &json!({"properties": {"desired": {"cfg": {"rate": 10, "extra": true}}}})).await;
    assert_eq!(
        user_props(&t2["properties"]["desired"]),
        json!({"cfg": {"rate": 10, "mode": "fast", "extra": true}, "name": "x", "arr": [1, {"a": 2}]})
    );
    assert_eq!(desired_version(&t2), 3);
    let md = &t2["properties"]["desired"]["$metadata"];
    assert_eq!(md.pointer("/cfg/rate/$lastUpdatedVersion"), Some(&json!(3)), "{md}");
    assert_eq!(md.pointer("/cfg/extra/$lastUpdatedVersion"), Some(&json!(3)), "{md}");
    assert_eq!(md.pointer("/cfg/mode/$lastUpdatedVersion"), Some(&json!(2)), "untouched leaf keeps its version: {md}");
    assert_eq!(md.pointer("/name/$lastUpdatedVersion"), Some(&json!(2)), "{md}");
    assert_eq!(md.pointer("/cfg/$lastUpdatedVersion"), Some(&json!(3)), "{md}");
    assert_eq!(md.pointer("/$lastUpdatedVersion"), Some(&json!(3)), "{md}");
    let e2 = etag_of(&t2);
    assert_ne!(e2, e1);

    // null removes a key; its parent's metadata records the change.
    let t3 =
        api.must_patch_twin("t1", &json!({"properties": {"desired": {"cfg": {"mode": null}, "name": null}}})).await;
    assert_eq!(
        user_props(&t3["properties"]["desired"]),
        json!({"cfg": {"rate": 10, "extra": true}, "arr": [1, {"a": 2}]})
    );
    assert_eq!(desired_version(&t3), 4);
    let md = &t3["properties"]["desired"]["$metadata"];
    assert_eq!(md.pointer("/cfg/$lastUpdatedVersion"), Some(&json!(4)), "parent of a removed key: {md}");
    assert!(md.pointer("/cfg/mode/$lastUpdatedVersion") != Some(&json!(2)), "stale metadata for removed key: {md}");

    // Removing a key that does not exist is accepted.
    let t3b = api.must_patch_twin("t1", &json!({"properties": {"desired": {"neverThere": null}}})).await;
    assert_eq!(user_props(&t3b["properties"]["desired"]), user_props(&t3["properties"]["desired"]));
    assert!(desired_version(&t3b) >= 4);

    // A tags-only patch: desired $version unchanged, etag and version change.
    let t4 = api.must_patch_twin("t1", &json!({"tags": {"loc": {"floor": null}, "owner": "ops"}})).await;
    assert_eq!(tags_of(&t4), json!({"loc": {"bldg": "43"}, "owner": "ops"}));
    assert_eq!(desired_version(&t4), desired_version(&t3b), "tags patch must not bump desired $version");
    assert_ne!(etag_of(&t4), etag_of(&t3b), "etag must change on a tags change");
    assert!(twin_version(&t4) > twin_version(&t3b));

    // "tags": null clears all tags.
    let t5 = api.must_patch_twin("t1", &json!({"tags": null})).await;
    assert_eq!(tags_of(&t5), json!({}));
    assert_ne!(etag_of(&t5), etag_of(&t4));
    assert_eq!(user_props(&t5["properties"]["desired"]), user_props(&t4["properties"]["desired"]));

    // "desired": null clears all desired properties, bumping $version once; metadata stays.
    let dv = desired_version(&t5);
    let t6 = api.must_patch_twin("t1", &json!({"properties": {"desired": null}})).await;
    assert_eq!(user_props(&t6["properties"]["desired"]), json!({}));
    assert_eq!(desired_version(&t6), dv + 1);
    assert_eq!(t6["properties"]["desired"]["$metadata"]["$lastUpdatedVersion"], dv + 1);
    assert_updated_timestamp(&t6["properties"]["desired"]["$metadata"]["$lastUpdated"], "cleared desired");

    // Reported cannot be written by the service: the twin's reported section stays as it was.
    let r = api.send("PATCH", "/twins/t1", Some(&json!({"properties": {"reported": {"x": 1}}})), &[]).await;
    assert_error(&r, 400, ARGUMENT_INVALID);
    let after = api.must_get_twin("t1").await;
    assert_eq!(
        user_props(&after["properties"]["reported"]),
        json!({}),
        "service wrote reported ({}): {}",
        r.status,
        r.text
    );
    assert_eq!(reported_version(&after), 1);

    // The body goes to the replicas as it was sent: any JSON spelling of a patch applies as the
    // document it parses to (whitespace, \u escapes, a key given twice where the last one counts).
    let spelled = "\n{ \"properties\" :\t{\"desired\": {\"sp\\u0065lled\": {\"k\": 1}, \"sp\\u0065lled\": \
                   {\"k\": 2.50, \"t\": \"\\u00e9\\n\"}}}}  \r\n";
    let r = api.send_raw("PATCH", "/twins/t1", Some(spelled.as_bytes().to_vec()), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let want: Value = serde_json::from_str(r#"{"k": 2.50, "t": "\u00e9\n"}"#).expect("literal");
    assert_eq!(r.json()["properties"]["desired"]["spelled"], want, "{}", r.text);
    let g = api.must_get_twin("t1").await;
    assert_eq!(user_props(&g["properties"]["desired"]), json!({"spelled": want}));
    assert_eq!(g["properties"]["desired"]["spelled"]["k"].to_string(), "2.50", "the number's text is kept");
    let r = api.send_raw("PATCH", "/twins/t1", Some(b"{\"tags\": {\"x\": 1},}".to_vec()), &[]).await;
    assert_error(&r, 400, ARGUMENT_INVALID);
    assert!(r.text.contains("malformed JSON body"), "{}", r.text);

    // Etags seen so far are all distinct.
    let mut seen = vec![e0, e1, e2, etag_of(&t3), etag_of(&t4), etag_of(&t5), etag_of(&t6)];
    let n = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), n, "an etag repeated: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twin_put_replace_and_etag_concurrency() {
    let srv = Server::start_default();
    let api = srv.owner();
    api.must_create_device("tr").await;
    let t1 = api
        .must_patch_twin(
            "tr",
            &json!({"tags": {"a": 1, "b": {"c": 2}}, "properties": {"desired": {"x": 1, "y": {"z": 2}}}}),
        )
        .await;
    let e1 = etag_of(&t1);

    // PUT replaces tags and desired entirely.
    let t2 = api
        .must_ok(
            "PUT",
            "/twins/tr",
            Some(&json!({"tags": {"n": "new"}, "properties": {"desired": {"only": true}}})),
            &[("If-Match", &quoted(&e1))],
        )
        .await;
    assert_eq!(tags_of(&t2), json!({"n": "new"}));
    assert_eq!(user_props(&t2["properties"]["desired"]), json!({"only": true}));
    assert_eq!(desired_version(&t2), desired_version(&t1) + 1, "replace is one desired change");
    let md = &t2["properties"]["desired"]["$metadata"];
    assert!(md.get("x").is_none() && md.get("y").is_none(), "metadata of replaced keys left: {md}");
    assert_eq!(md.pointer("/only/$lastUpdatedVersion"), Some(&json!(desired_version(&t2))));
    let e2 = etag_of(&t2);
    assert_ne!(e2, e1);
    assert_eq!(twin_state(&api.must_get_twin("tr").await), twin_state(&t2));

    // Stale etag → 412 for PATCH and PUT; nothing changes.
    api.must_err(
        412,
        PRECONDITION_FAILED,
        "PATCH",
        "/twins/tr",
        Some(&json!({"tags": {"stale": 1}, "properties": {"desired": {"stale": 1}}})),
        &[("If-Match", &quoted(&e1))],
    )
    .await;
    api.must_err(
        412,
        PRECONDITION_FAILED,
        "PUT",
        "/twins/tr",
        Some(&json!({"tags": {}, "properties": {"desired": {}}})),
        &[("If-Match", &quoted(&e1))],
    )
    .await;
    api.must_err(
        412,
        PRECONDITION_FAILED,
        "PATCH",
        "/twins/tr",
        Some(&json!({"tags": {"stale": 1}})),
        &[("If-Match", "\"AAAAAAAAA+c=\"")],
    )
    .await;
    let g = api.must_get_twin("tr").await;
    assert_eq!(twin_state(&g), twin_state(&t2), "a 412 changed the twin");

    // Current etag, quoted, with or without W/.
    let t3 = api.must_ok("PATCH", "/twins/tr", Some(&json!({"tags": {"k": 3}})), &[("If-Match", &quoted(&e2))]).await;
    let e3 = etag_of(&t3);
    let t4 = api
        .must_ok(
            "PATCH",
            "/twins/tr",
            Some(&json!({"properties": {"desired": {"k": 4}}})),
            &[("If-Match", &format!("W/\"{e3}\""))],
        )
        .await;
    let e4 = etag_of(&t4);
    // "*" matches any etag.
    let t5 = api.must_ok("PATCH", "/twins/tr", Some(&json!({"tags": {"k": 5}})), &[("If-Match", "\"*\"")]).await;
    let e5 = etag_of(&t5);
    let t6 = api
        .must_ok(
            "PUT",
            "/twins/tr",
            Some(&json!({"tags": {"k": 6}, "properties": {"desired": {"k": 6}}})),
            &[("If-Match", "\"*\"")],
        )
        .await;
    let e6 = etag_of(&t6);
    let mut all = vec![e1.clone(), e2.clone(), e3.clone(), e4, e5, e6];
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "etags must change on every tags/desired change: {all:?}");
    assert_eq!(tags_of(&t6), json!({"k": 6}));
    assert_eq!(user_props(&t6["properties"]["desired"]), json!({"k": 6}));
    // The twin version grows on every change.
    let vs: Vec<i64> = [&t1, &t2, &t3, &t4, &t5, &t6].iter().map(|t| twin_version(t)).collect();
    assert!(vs.windows(2).all(|w| w[1] > w[0]), "twin versions must increase: {vs:?}");

    // Twins of unknown devices.
    api.must_err(404, DEVICE_NOT_FOUND, "GET", "/twins/none", None, &[]).await;
    api.must_err(404, DEVICE_NOT_FOUND, "PATCH", "/twins/none", Some(&json!({"tags": {"a": 1}})), &[]).await;
    api.must_err(404, DEVICE_NOT_FOUND, "PUT", "/twins/none", Some(&json!({"tags": {"a": 1}})), &[]).await;
    api.must_err(404, DEVICE_NOT_FOUND, "GET", "/devices/none", None, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_patches_each_get_their_own_desired_version() {
    let srv = Server::start_default();
    let api = srv.owner();
    api.must_create_device("cc").await;
    let mut tasks = Vec::new();
    for w in 0..8 {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..10 {
                let t = api.must_patch_twin("cc", &json!({"properties": {"desired": {format!("w{w}"): i}}})).await;
                out.push((desired_version(&t), twin_version(&t), etag_of(&t)));
            }
            out
        }));
    }
    let mut acks = Vec::new();
    for t in tasks {
        acks.extend(t.await.expect("writer task"));
    }
    let mut dv: Vec<i64> = acks.iter().map(|a| a.0).collect();
    dv.sort();
    assert_eq!(dv, (2..=81).collect::<Vec<_>>(), "80 desired patches must get $version 2..=81, each once");
    let mut tv: Vec<i64> = acks.iter().map(|a| a.1).collect();
    tv.sort();
    tv.dedup();
    assert_eq!(tv.len(), 80, "twin versions repeated");
    let mut es: Vec<String> = acks.iter().map(|a| a.2.clone()).collect();
    es.sort();
    es.dedup();
    assert_eq!(es.len(), 80, "etags repeated");
    let t = api.must_get_twin("cc").await;
    assert_eq!(desired_version(&t), 81);
    let want: serde_json::Map<String, Value> = (0..8).map(|w| (format!("w{w}"), json!(9))).collect();
    assert_eq!(user_props(&t["properties"]["desired"]), Value::Object(want));
}

// ---------------------------------------------------------------------------------------------------
// Auth

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sas_auth_failures_and_policy_permissions() {
    // A fixed owner key: the printed one must be this one.
    let owner_key = "c2VjcmV0LW93bmVyLWtleS1mb3ItdHdpbmh1Yi10ZXN0cw==";
    let srv = Server::start(ServerOpts { owner_key: Some(owner_key.into()), ..Default::default() });
    assert_eq!(srv.owner_key, owner_key);
    let api = srv.owner();
    api.must_create_device("a1").await;
    let create = json!({"deviceId": "a2", "authentication": {"symmetricKey": {}}});
    let host = srv.host_name.clone();

    let cases: Vec<(&str, Option<String>)> = vec![
        ("no Authorization header", None),
        ("garbage header", Some("Bearer abc".into())),
        (
            "token without signature",
            Some(format!("SharedAccessSignature sr={}&se={}&skn=iothubowner", py_quote_plus(&host), unix_now() + 3600)),
        ),
        (
            "signed with a wrong key",
            Some(service_sas(&host, "iothubowner", "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk=", unix_now() + 3600)),
        ),
        ("expired", Some(service_sas(&host, "iothubowner", owner_key, unix_now() - 60))),
        ("unknown policy", Some(service_sas(&host, "nosuchpolicy", owner_key, unix_now() + 3600))),
        (
            "another hub's resource",
            Some(service_sas("otherhub.example.com", "iothubowner", owner_key, unix_now() + 3600)),
        ),
        (
            "tampered expiry",
            Some(service_sas(&host, "iothubowner", owner_key, unix_now() + 3600).replace("&se=", "&se=9")),
        ),
    ];
    for (what, header) in &cases {
        let c = srv.api_raw_auth(header.as_deref());
        let r = c.send("GET", "/devices/a1", None, &[]).await;
        assert_eq!(r.status, 401, "{what}: GET expected 401, got {} {}", r.status, r.text);
        assert_error(&r, 401, UNAUTHORIZED);
        let r = c.send("PUT", "/devices/a2", Some(&create), &[]).await;
        assert_eq!(r.status, 401, "{what}: PUT expected 401, got {} {}", r.status, r.text);
        let r = c.send("PATCH", "/twins/a1", Some(&json!({"tags": {"evil": 1}})), &[]).await;
        assert_eq!(r.status, 401, "{what}: PATCH expected 401, got {} {}", r.status, r.text);
    }
    api.must_err(404, DEVICE_NOT_FOUND, "GET", "/devices/a2", None, &[]).await;
    assert_eq!(tags_of(&api.must_get_twin("a1").await), json!({}));

    // The owner key signs with the policy name it belongs to only.
    let wrong_name = srv.api("registryRead", owner_key);
    let r = wrong_name.send("GET", "/devices/a1", None, &[]).await;
    assert_error(&r, 401, UNAUTHORIZED);

    // registryRead: may read the registry, may not write it nor touch twins' desired state. A valid
    // token lacking the permission is 401 (IotHubUnauthorizedAccess) like a bad token, as IoT Hub answers.
    let rr = srv.api("registryRead", &srv.policy_key("registryRead"));
    rr.must_get("/devices/a1").await;
    rr.must_get("/devices?top=10").await;
    rr.must_err(401, UNAUTHORIZED, "PUT", "/devices/a2", Some(&create), &[]).await;
    rr.must_err(401, UNAUTHORIZED, "DELETE", "/devices/a1", None, &[("If-Match", "\"*\"")]).await;
    rr.must_err(401, UNAUTHORIZED, "PATCH", "/twins/a1", Some(&json!({"tags": {"evil": 1}})), &[]).await;
    api.must_err(404, DEVICE_NOT_FOUND, "GET", "/devices/a2", None, &[]).await;
    api.must_get("/devices/a1").await;
    assert_eq!(tags_of(&api.must_get_twin("a1").await), json!({}));

    // registryReadWrite: may write the registry.
    let rw = srv.api("registryReadWrite", &srv.policy_key("registryReadWrite"));
    rw.must_create_device("a2").await;
    rw.must(204, "DELETE", "/devices/a2", None, &[("If-Match", "\"*\"")]).await;

    // service: twins yes, registry writes no.
    let sv = srv.api("service", &srv.policy_key("service"));
    sv.must_get_twin("a1").await;
    let t = sv.must_patch_twin("a1", &json!({"tags": {"by": "service"}})).await;
    assert_eq!(tags_of(&t), json!({"by": "service"}));
    sv.must_err(
        401,
        UNAUTHORIZED,
        "PUT",
        "/devices/a3",
        Some(&json!({"deviceId": "a3", "authentication": {"symmetricKey": {}}})),
        &[],
    )
    .await;
    api.must_err(404, DEVICE_NOT_FOUND, "GET", "/devices/a3", None, &[]).await;

    // A different policy's key does not work for this policy.
    let mixed = srv.api("service", &srv.policy_key("registryRead"));
    let r = mixed.send("GET", "/twins/a1", None, &[]).await;
    assert_error(&r, 401, UNAUTHORIZED);
}

// ---------------------------------------------------------------------------------------------------
// Malformed input and limits

/// Sends a PATCH expected to be rejected with 400 naming `needle`, then checks the twin is unchanged.
async fn must_reject_patch(api: &Api, id: &str, patch: &Value, needle: &str, before: &Value) {
    let r = api.send("PATCH", &format!("/twins/{id}"), Some(patch), &[]).await;
    let shown: String = serde_json::to_string(patch).unwrap().chars().take(120).collect();
    assert_eq!(r.status, 400, "PATCH {shown}…: expected 400, got {} {}", r.status, r.text);
    assert_error(&r, 400, ARGUMENT_INVALID);
    let msg = r.message();
    assert!(msg.contains(needle), "400 message must name {needle:?}; got {msg:?}");
    let after = api.must_get_twin(id).await;
    assert_eq!(twin_state(&after), twin_state(before), "a rejected PATCH changed the twin");
}

fn nested(depth: usize, leaf: Value) -> Value {
    let mut v = leaf;
    for i in (0..depth).rev() {
        v = json!({ format!("l{i}"): v });
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_and_limits_are_400_and_change_nothing() {
    let srv = Server::start_default();
    let api = srv.owner();
    api.must_create_device("lim").await;
    let base =
        api.must_patch_twin("lim", &json!({"tags": {"keep": "me"}, "properties": {"desired": {"keep": 1}}})).await;

    // Path segments that are not UTF-8 once decoded, or not a number where one is expected: IoT Hub's
    // error body, naming the path.
    for (method, path) in [
        ("GET", "/twins/%FF"),
        ("PATCH", "/twins/lim/modules/%C3"),
        ("DELETE", "/devices/%FE%FF"),
        ("GET", "/devices/lim/modules/%FF"),
        ("GET", "/jobs/v2/%FF"),
        ("DELETE", "/cluster/members/abc"),
        ("GET", "/cluster/backup/shards/-1"),
    ] {
        let r = api.must_err(400, "ArgumentInvalid", method, path, Some(&json!({})), &[("If-Match", "*")]).await;
        assert!(r.text.contains("the request path"), "{method} {path}: {}", r.text);
    }
    // A method the route does not serve: IoT Hub's 405 body, and the methods it does serve.
    for path in ["/jobs/v2/x", "/twins/lim", "/devices/lim/modules"] {
        let r = api.must_err(405, "MethodNotAllowed", "DELETE", path, None, &[]).await;
        let allow = r.headers.get("allow").cloned().unwrap_or_default();
        assert!(allow.contains("GET"), "{path}: Allow {allow:?}");
    }
    // An unknown console file is IoT Hub's 404 body too, like any unknown path.
    let r = api.must_err(404, "NotFound", "GET", "/console/no-such-page.js", None, &[]).await;
    assert!(r.text.contains("/console/no-such-page.js"), "{}", r.text);

    // Malformed JSON.
    for (what, body) in [
        ("truncated", &b"{\"tags\": {\"a\": "[..]),
        ("not json", b"hello"),
        ("trailing garbage", b"{\"tags\":{}} x"),
        ("array body", b"[1,2]"),
    ] {
        let r = api.send_raw("PATCH", "/twins/lim", Some(body.to_vec()), &[]).await;
        assert_eq!(r.status, 400, "{what}: expected 400, got {} {}", r.status, r.text);
        assert_error(&r, 400, ARGUMENT_INVALID);
        let r = api.send_raw("PUT", "/twins/lim", Some(body.to_vec()), &[]).await;
        assert_eq!(r.status, 400, "{what} (PUT twin): expected 400, got {} {}", r.status, r.text);
        let r = api.send_raw("PUT", "/devices/mal", Some(body.to_vec()), &[]).await;
        assert_eq!(r.status, 400, "{what} (PUT device): expected 400, got {} {}", r.status, r.text);
    }
    api.must_err(404, DEVICE_NOT_FOUND, "GET", "/devices/mal", None, &[]).await;
    assert_eq!(twin_state(&api.must_get_twin("lim").await), twin_state(&base));

    // Key rules.
    for (k, why) in
        [("a.b", "dot"), ("a$b", "dollar"), ("$bad", "leading dollar"), ("a b", "space"), ("a\u{1}b", "control")]
    {
        let _ = why;
        must_reject_patch(&api, "lim", &json!({"tags": {"tagKeyParent": {(k): 1}}}), "tagKeyParent", &base).await;
        must_reject_patch(&api, "lim", &json!({"properties": {"desired": {"deskey": {(k): 1}}}}), "deskey", &base)
            .await;
    }
    // Key length: 1024 bytes passes, 1025 fails.
    let k1025 = "k".repeat(1025);
    must_reject_patch(
        &api,
        "lim",
        &json!({"properties": {"desired": {"longKeyParent": {(k1025.clone()): 1}}}}),
        "longKeyParent",
        &base,
    )
    .await;
    // String length: 4096 bytes passes, 4097 fails.
    must_reject_patch(
        &api,
        "lim",
        &json!({"properties": {"desired": {"longString": "s".repeat(4097)}}}),
        "longString",
        &base,
    )
    .await;
    must_reject_patch(&api, "lim", &json!({"tags": {"longTag": "s".repeat(4097)}}), "longTag", &base).await;
    // Integers within ±2^52.
    must_reject_patch(
        &api,
        "lim",
        &json!({"properties": {"desired": {"bigInt": 4503599627370496i64}}}),
        "bigInt",
        &base,
    )
    .await;
    must_reject_patch(
        &api,
        "lim",
        &json!({"properties": {"desired": {"smallInt": -4503599627370497i64}}}),
        "smallInt",
        &base,
    )
    .await;
    must_reject_patch(&api, "lim", &json!({"tags": {"bigTagInt": 9007199254740993i64}}), "bigTagInt", &base).await;
    // Depth: 11 nested objects under desired breaks the limit of 10 however the root is counted.
    must_reject_patch(&api, "lim", &json!({"properties": {"desired": {"deep": nested(11, json!(1))}}}), "deep", &base)
        .await;
    must_reject_patch(&api, "lim", &json!({"tags": {"deepTag": nested(11, json!(1))}}), "deepTag", &base).await;
    // Section sizes: tags > 8 KB, desired > 32 KB (each string within its own limit).
    let big_tags: serde_json::Map<String, Value> = (0..3).map(|i| (format!("t{i}"), json!("x".repeat(3000)))).collect();
    must_reject_patch(&api, "lim", &json!({"tags": big_tags}), "tags", &base).await;
    let big_desired: serde_json::Map<String, Value> =
        (0..9).map(|i| (format!("d{i}"), json!("x".repeat(4000)))).collect();
    must_reject_patch(&api, "lim", &json!({"properties": {"desired": big_desired.clone()}}), "desired", &base).await;
    // Replace with an oversized document.
    let r =
        api.send("PUT", "/twins/lim", Some(&json!({"tags": {}, "properties": {"desired": big_desired}})), &[]).await;
    assert_error(&r, 400, ARGUMENT_INVALID);
    assert!(r.message().contains("desired"), "message must name desired: {}", r.message());
    assert_eq!(twin_state(&api.must_get_twin("lim").await), twin_state(&base));

    // Just inside every limit passes.
    let k1024 = "k".repeat(1024);
    let ok = api
        .must_patch_twin(
            "lim",
            &json!({"properties": {"desired": {
                "edgeKey": {(k1024.clone()): 1},
                "edgeString": "s".repeat(4096),
                "maxInt": 4503599627370495i64,
                "minInt": -4503599627370496i64,
                "shallow": nested(8, json!("leaf")),
                "float": 1.5,
                "arr": [1, "two", {"three": 3}, [4]],
            }}}),
        )
        .await;
    let d = &ok["properties"]["desired"];
    assert_eq!(d["maxInt"], json!(4503599627370495i64));
    assert_eq!(d["minInt"], json!(-4503599627370496i64));
    assert_eq!(d["edgeString"].as_str().map(str::len), Some(4096));
    assert_eq!(d["edgeKey"][&k1024], 1);
    assert_eq!(d["arr"], json!([1, "two", {"three": 3}, [4]]));

    // The size limit applies after the merge: two patches that each fit, together exceed 8 KB.
    let half: serde_json::Map<String, Value> = (0..2).map(|i| (format!("h{i}"), json!("x".repeat(2500)))).collect();
    let cur = api.must_patch_twin("lim", &json!({"tags": half})).await;
    let other: serde_json::Map<String, Value> = (0..2).map(|i| (format!("o{i}"), json!("x".repeat(2500)))).collect();
    must_reject_patch(&api, "lim", &json!({"tags": other}), "tags", &cur).await;

    // Body members outside tags/properties.desired must not change identity fields.
    let r = api.send("PATCH", "/twins/lim", Some(&json!({"deviceId": "other", "tags": {"z": 1}})), &[]).await;
    let after = api.must_get_twin("lim").await;
    assert_eq!(after["deviceId"], "lim", "PATCH changed the deviceId ({}: {})", r.status, r.text);
}

// ---------------------------------------------------------------------------------------------------
// The harness's SAS tokens are byte-for-byte what azure-iot-hub 2.7.0 (`azure/iot/hub/sastoken.py`)
// builds; vectors produced by that SDK.

#[test]
fn sas_tokens_match_the_python_sdk() {
    let key = "c2VjcmV0LW93bmVyLWtleS1mb3ItdHdpbmh1Yi10ZXN0cw==";
    assert_eq!(
        service_sas("localhost:8443", "iothubowner", key, 1795352543),
        "SharedAccessSignature sr=localhost%3A8443&sig=cfTqfDxDOFRmWZSaqhn4tmrRAQsyJj1ga4a4gyhqmGE%3D&se=1795352543&skn=iothubowner"
    );
    // A signature containing '/', which the SDK leaves unescaped.
    assert_eq!(
        service_sas("localhost:8443", "iothubowner", key, 1795379354),
        "SharedAccessSignature sr=localhost%3A8443&sig=8RyNF/kgHzR5n48uhz3CRjJS2VO8mjnkJ/gJUJptzSY%3D&se=1795379354&skn=iothubowner"
    );
    assert_eq!(
        service_sas("my hub.example:1", "service", key, 1700000000),
        "SharedAccessSignature sr=my+hub.example%3A1&sig=JxBW7AIAH4utzzsLDqFy07nfevhblwe44l68LNApFCs%3D&se=1700000000&skn=service"
    );
}

// ---------------------------------------------------------------------------------------------------
// Process interface

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_restart_keeps_owner_key_ca_and_state() {
    let mut srv = Server::start_default();
    let key = srv.owner_key.clone();
    let ca = srv.ca_pem.clone();
    let api = srv.owner();
    api.must_create_device("keep").await;
    let t = api.must_patch_twin("keep", &json!({"tags": {"a": 1}, "properties": {"desired": {"b": 2}}})).await;
    let st = srv.sigterm();
    assert!(st.success(), "SIGTERM must exit cleanly, got {st}");
    srv.restart();
    assert_eq!(srv.owner_key, key, "the generated owner key must be kept in the data directory");
    assert_eq!(srv.ca_pem, ca, "the generated CA must be kept in the data directory");
    let api = srv.owner();
    let t2 = api.must_get_twin("keep").await;
    assert_eq!(twin_state(&t2), twin_state(&t), "twin changed across a clean restart");
    let t3 = api.must_patch_twin("keep", &json!({"properties": {"desired": {"b": 3}}})).await;
    assert_eq!(desired_version(&t3), desired_version(&t) + 1, "desired $version must continue after restart");
    assert_ne!(etag_of(&t3), etag_of(&t));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_shard_count_keeps_the_count_the_data_was_created_with() {
    // 16 was the default of earlier releases: their data directories must start under this one.
    let mut srv = Server::start(ServerOpts { shard_count: Some(16), ..Default::default() });
    let ids: Vec<String> = (0..24).map(|i| format!("count{i}")).collect();
    for id in &ids {
        srv.owner().must_create_device(id).await;
    }
    assert!(srv.sigterm().success());
    srv.restart_with(ServerOpts::default());
    let api = srv.owner();
    for id in &ids {
        assert_eq!(api.must_get_twin(id).await["deviceId"], id.as_str(), "{id} after a restart without --shard-count");
    }
    // Given, the count must still match the data: a mismatch is refused with both numbers.
    assert!(srv.sigterm().success());
    let mut other = std::process::Command::new(common::bin_path());
    other.args(["serve", "--shard-count", "8", "--data-dir"]).arg(&srv.data_dir);
    for flag in ["--http-listen", "--mqtt-listen", "--events-listen"] {
        other.arg(flag).arg("127.0.0.1:0");
    }
    let out = other.output().expect("run twinhub serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a data directory of 16 shards opened with 8");
    assert!(err.contains("created with 16 shards") && err.contains("with 8"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_from_environment() {
    let key = "ZW52aXJvbm1lbnQtb3duZXIta2V5LWZvci10d2luaHVi";
    let srv = Server::start(ServerOpts {
        env: vec![("TWINHUB_OWNER_KEY".into(), key.into()), ("TWINHUB_SHARD_COUNT".into(), "3".into())],
        ..Default::default()
    });
    assert_eq!(srv.owner_key, key, "TWINHUB_OWNER_KEY must set the iothubowner key");
    let api = srv.owner();
    for i in 0..6 {
        api.must_create_device(&format!("env{i}")).await;
        api.must_patch_twin(&format!("env{i}"), &json!({"tags": {"i": i}})).await;
    }
    let stats = api.must_get("/statistics/devices").await;
    assert_eq!(stats["totalDeviceCount"].as_i64(), Some(6), "{stats}");
}

/// Edge scopes as the registry returns them: an edge device gets its own `deviceScope`; a leaf names
/// its parent edge device in `deviceScope` and gets `parentScopes`; an edge device names its parent in
/// `parentScopes`; a scope that is not an edge device's is refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_scopes_for_edge_devices_and_their_children() {
    let srv = Server::start_default();
    let api = srv.owner();
    let edge = api
        .must(
            200,
            "PUT",
            "/devices/gateway",
            Some(&json!({"deviceId": "gateway", "capabilities": {"iotEdge": true}})),
            &[],
        )
        .await
        .json()
        .clone();
    let scope = edge["deviceScope"].as_str().expect("an edge device has a deviceScope").to_string();
    assert!(scope.starts_with("ms-azure-iot-edge://gateway-"), "{scope}");
    assert_eq!(edge["parentScopes"], json!([]));
    let plain = api.must_create_device("plain").await;
    assert_eq!(plain["deviceScope"], Value::Null, "{plain}");

    let leaf =
        api.must(200, "PUT", "/devices/leaf", Some(&json!({"deviceId": "leaf", "deviceScope": scope})), &[]).await;
    assert_eq!(leaf.json()["deviceScope"], json!(scope));
    assert_eq!(leaf.json()["parentScopes"], json!([scope]));
    let twin = api.must_get_twin("leaf").await;
    assert_eq!((twin["deviceScope"].clone(), twin["parentScopes"].clone()), (json!(scope), json!([scope])), "{twin}");

    // An update without scope fields keeps the parent; the scope itself survives updates.
    let etag = leaf.json()["etag"].as_str().unwrap().to_string();
    let r = api
        .must(
            200,
            "PUT",
            "/devices/leaf",
            Some(&json!({"deviceId": "leaf", "status": "disabled"})),
            &[("If-Match", &quoted(&etag))],
        )
        .await;
    assert_eq!(r.json()["deviceScope"], json!(scope));
    let etag = edge["etag"].as_str().unwrap().to_string();
    let again = api
        .must(
            200,
            "PUT",
            "/devices/gateway",
            Some(&json!({"deviceId": "gateway", "capabilities": {"iotEdge": true}, "deviceScope": scope})),
            &[("If-Match", &quoted(&etag))],
        )
        .await;
    assert_eq!(again.json()["deviceScope"], json!(scope), "an edge device keeps its scope");

    // A nested edge device names its parent in parentScopes and keeps its own scope.
    let child = api
        .must(
            200,
            "PUT",
            "/devices/child-edge",
            Some(&json!({"deviceId": "child-edge", "capabilities": {"iotEdge": true}, "parentScopes": [scope]})),
            &[],
        )
        .await
        .json()
        .clone();
    assert!(child["deviceScope"].as_str().unwrap().starts_with("ms-azure-iot-edge://child-edge-"), "{child}");
    assert_eq!(child["parentScopes"], json!([scope]));

    // Scopes that are not an edge device's are refused, and nothing is created.
    for bad in [
        json!({"deviceId": "orphan", "deviceScope": "ms-azure-iot-edge://gateway-1"}),
        json!({"deviceId": "orphan", "deviceScope": "ms-azure-iot-edge://plain-1"}),
        json!({"deviceId": "orphan", "deviceScope": "not-a-scope"}),
        json!({"deviceId": "orphan", "deviceScope": scope.clone(), "parentScopes": ["ms-azure-iot-edge://x-1"]}),
        json!({"deviceId": "orphan", "capabilities": {"iotEdge": true}, "deviceScope": scope.clone()}),
    ] {
        let r = api.send("PUT", "/devices/orphan", Some(&bad), &[]).await;
        assert_error(&r, 400, "ArgumentInvalid");
    }
    let r = api.send("GET", "/devices/orphan", None, &[]).await;
    assert_eq!(r.status, 404);
}
