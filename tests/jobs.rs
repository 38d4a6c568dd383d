//! Jobs v2 against the real binary (4 shards): a `scheduleUpdateTwin` job updates exactly the devices
//! its condition matches, once each, and records per-device rows queryable as `devices.jobs`;
//! scheduled jobs wait and can be cancelled; bad requests are refused before anything is stored.

use twinhub_testkit as common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

async fn wait_status(api: &Api, job: &str, want: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let j = api.must_get(&format!("/jobs/v2/{job}")).await;
        if j["status"] == want {
            return j;
        }
        assert!(Instant::now() < deadline, "job {job} not {want} within {within:?}: {j}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_twin_jobs_apply_once_per_matching_device() {
    let server = Server::start(ServerOpts { shard_count: Some(4), ..Default::default() });
    let api = server.owner();
    let mut before = Vec::new();
    for i in 0..24 {
        let id = format!("job-{i:02}");
        api.must_create_device(&id).await;
        let b = if i % 2 == 0 { "b43" } else { "b44" };
        let t = api.must_patch_twin(&id, &json!({"tags": {"building": b, "battery": i}})).await;
        before.push((id, b, t));
    }

    // A job for building 43 with battery below 20, starting now.
    let req = json!({
        "jobId": "fw-43", "type": "scheduleUpdateTwin",
        "queryCondition": "tags.building = 'b43' AND tags.battery < 20",
        "updateTwin": {"etag": "*", "tags": {"fw": "pending"}, "properties": {"desired": {"fw": "2.0"}, "reported": {}}},
        "startTime": "2020-01-01T00:00:00.000Z", "maxExecutionTimeInSeconds": 120
    });
    let created = api.send("PUT", "/jobs/v2/fw-43", Some(&req), &[]).await;
    assert_eq!(created.status, 200, "{}", created.text);
    assert_eq!(created.json()["jobId"], "fw-43");
    assert_eq!(created.json()["type"], "scheduleUpdateTwin");
    let done = wait_status(&api, "fw-43", "completed", Duration::from_secs(60)).await;
    let matching: Vec<&(String, &str, Value)> =
        before.iter().filter(|(_, b, t)| *b == "b43" && t["tags"]["battery"].as_i64().unwrap() < 20).collect();
    assert_eq!(matching.len(), 10);
    assert_eq!(done["deviceJobStatistics"]["deviceCount"], 10, "{done}");
    assert_eq!(done["deviceJobStatistics"]["succeededCount"], 10, "{done}");
    assert_eq!(done["deviceJobStatistics"]["failedCount"], 0, "{done}");
    assert!(done["endTime"].is_string(), "{done}");
    for (id, b, t0) in &before {
        let t = api.must_get_twin(id).await;
        let hit = matching.iter().any(|(m, _, _)| m == id);
        if hit {
            assert_eq!(t["properties"]["desired"]["fw"], "2.0", "{id}");
            assert_eq!(t["tags"]["fw"], "pending", "{id}");
            assert_eq!(desired_version(&t), desired_version(t0) + 1, "{id}: the job applied exactly once");
            assert_eq!(twin_version(&t), twin_version(t0) + 1, "{id}: one twin version for one job update");
        } else {
            assert_eq!(twin_state(&t), twin_state(t0), "{id} ({b}) must not change");
        }
    }

    // The per-device rows, through the query language.
    let r = api
        .send(
            "POST",
            "/devices/query",
            Some(&json!({"query": "SELECT * FROM devices.jobs WHERE devices.jobs.jobId = 'fw-43'"})),
            &[],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.headers.get("x-ms-item-type").map(String::as_str), Some("deviceJob"));
    let rows = r.json().as_array().expect("rows").clone();
    assert_eq!(rows.len(), 10, "{}", r.text);
    assert!(
        rows.iter().all(|row| row["status"] == "completed" && row["jobType"] == "scheduleUpdateTwin"),
        "{}",
        r.text
    );
    let mut devs: Vec<&str> = rows.iter().map(|row| row["deviceId"].as_str().unwrap()).collect();
    devs.sort();
    let mut want: Vec<&str> = matching.iter().map(|(id, _, _)| id.as_str()).collect();
    want.sort();
    assert_eq!(devs, want);

    // A job scheduled later is queued, can be cancelled, and never runs.
    let later = "2099-01-01T00:00:00Z";
    let r = api.send("PUT", "/jobs/v2/later", Some(&json!({"jobId": "later", "type": "scheduleUpdateTwin", "queryCondition": "tags.building = 'b44'", "updateTwin": {"properties": {"desired": {"x": 1}}}, "startTime": later, "maxExecutionTimeInSeconds": 60})), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json()["status"], "queued");
    let r = api.send("POST", "/jobs/v2/later/cancel", None, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json()["status"], "cancelled");
    assert_eq!(api.must_get("/jobs/v2/later").await["status"], "cancelled");

    // Job queries by status and type.
    let r = api.send("GET", "/jobs/v2/query?jobType=scheduleUpdateTwin&jobStatus=completed", None, &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json()["type"], "jobResponse");
    let ids: Vec<&str> = r.json()["items"].as_array().unwrap().iter().map(|j| j["jobId"].as_str().unwrap()).collect();
    assert_eq!(ids, vec!["fw-43"]);
    let r = api.send("GET", "/jobs/v2/query?jobStatus=cancelled", None, &[]).await;
    assert_eq!(r.json()["items"].as_array().unwrap().len(), 1);

    // Refusals: unknown job, unsupported type, a method job without a valid call, bad condition (with its position), a patch over the
    // limits, a reused id with another request, a bad status filter. Nothing is stored.
    assert_error(&api.send("GET", "/jobs/v2/nope", None, &[]).await, 404, "JobNotFound");
    assert_error(&api.send("POST", "/jobs/v2/nope/cancel", None, &[]).await, 404, "JobNotFound");
    let api = &api;
    let bad = |patch: Value| async move { api.send("PUT", "/jobs/v2/bad", Some(&patch), &[]).await };
    assert_error(
        &bad(json!({"type": "firmwareUpdate", "queryCondition": "deviceId = 'x'"})).await,
        400,
        "ArgumentInvalid",
    );
    assert_error(
        &bad(json!({"type": "scheduleDeviceMethod", "queryCondition": "deviceId = 'x'"})).await,
        400,
        "ArgumentInvalid",
    );
    assert_error(&bad(json!({"type": "scheduleDeviceMethod", "queryCondition": "deviceId = 'x'", "cloudToDeviceMethod": {"methodName": ""}})).await, 400, "ArgumentInvalid");
    let r =
        bad(json!({"type": "scheduleUpdateTwin", "queryCondition": "tags.a = = 1", "updateTwin": {"tags": {"a": 1}}}))
            .await;
    assert_error(&r, 400, "ArgumentInvalid");
    assert!(r.text.contains("position"), "{}", r.text);
    assert_error(&bad(json!({"type": "scheduleUpdateTwin", "queryCondition": "tags.a = 1", "updateTwin": {"tags": {"bad.key": 1}}})).await, 400, "ArgumentInvalid");
    assert_error(
        &bad(json!({"type": "scheduleUpdateTwin", "queryCondition": "tags.a = 1", "updateTwin": {}})).await,
        400,
        "ArgumentInvalid",
    );
    assert_error(&bad(json!({"type": "scheduleUpdateTwin", "queryCondition": "tags.a = 1", "updateTwin": {"tags": {"a": 1}}, "startTime": "yesterday"})).await, 400, "ArgumentInvalid");
    // Members of the wrong type, or missing, are named.
    for (body, says) in [
        (
            json!({"jobId": 5, "type": "scheduleUpdateTwin", "queryCondition": "tags.a = 1", "updateTwin": {"tags": {"a": 1}}}),
            "jobId must be a string, got 5",
        ),
        (
            json!({"type": 5, "queryCondition": "tags.a = 1", "updateTwin": {"tags": {"a": 1}}}),
            "type must be a string, got 5",
        ),
        (json!({"queryCondition": "tags.a = 1", "updateTwin": {"tags": {"a": 1}}}), "type is required"),
        (
            json!({"type": "scheduleUpdateTwin", "queryCondition": 5, "updateTwin": {"tags": {"a": 1}}}),
            "queryCondition must be a string, got 5",
        ),
        (json!({"type": "scheduleUpdateTwin", "updateTwin": {"tags": {"a": 1}}}), "queryCondition is required"),
        (json!(["scheduleUpdateTwin"]), "a JobRequest is a JSON object"),
    ] {
        let r = bad(body.clone()).await;
        assert_error(&r, 400, "ArgumentInvalid");
        assert!(r.text.contains(says), "{body}: {}", r.text);
    }
    assert_error(&api.send("GET", "/jobs/v2/bad", None, &[]).await, 404, "JobNotFound");
    let r = api.send("PUT", "/jobs/v2/fw-43", Some(&json!({"jobId": "fw-43", "type": "scheduleUpdateTwin", "queryCondition": "tags.a = 2", "updateTwin": {"tags": {"a": 1}}})), &[]).await;
    assert_error(&r, 412, "PreconditionFailed");
    assert_error(&api.send("GET", "/jobs/v2/query?jobStatus=sleeping", None, &[]).await, 400, "ArgumentInvalid");
}

/// A condition runs inside `SELECT deviceId FROM devices WHERE …`, so it may be at most that much shorter
/// than a query (8192 characters): one at that length is taken and runs, one a character longer is refused
/// with the limit, for jobs and configurations alike, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_that_would_make_its_query_too_long_is_refused_before_anything_is_stored() {
    let server = Server::start(ServerOpts { shard_count: Some(2), ..Default::default() });
    let api = server.owner();
    api.must_create_device("long-1").await;
    let room = 8192 - "SELECT deviceId FROM devices WHERE ".len();
    let condition = |chars: usize| format!("deviceId = '{}'", "x".repeat(chars - "deviceId = ''".len()));
    let (fits, over) = (condition(room), condition(room + 1));

    let job = |c: &str| json!({"type": "scheduleUpdateTwin", "queryCondition": c, "updateTwin": {"tags": {"a": 1}}});
    let r = api.send("PUT", "/jobs/v2/too-long", Some(&job(&over)), &[]).await;
    assert_error(&r, 400, "ArgumentInvalid");
    assert!(r.text.contains(&format!("at most {room} characters")), "{}", r.text);
    assert_error(&api.send("GET", "/jobs/v2/too-long", None, &[]).await, 404, "JobNotFound");
    api.must(200, "PUT", "/jobs/v2/fits", Some(&job(&fits)), &[]).await;
    let done = wait_status(&api, "fits", "completed", Duration::from_secs(30)).await;
    assert_eq!(done["deviceJobStatistics"]["deviceCount"], 0, "{done}");

    let config = |c: &str| json!({"content": {"deviceContent": {"properties.desired.x": 1}}, "targetCondition": c, "priority": 1});
    let r = api.send("PUT", "/configurations/too-long", Some(&config(&over)), &[]).await;
    assert_error(&r, 400, "ArgumentInvalid");
    assert!(r.text.contains(&format!("at most {room} characters")), "{}", r.text);
    api.must(404, "GET", "/configurations/too-long", None, &[]).await;
    api.must(200, "PUT", "/configurations/fits", Some(&config(&fits)), &[]).await;
    let listed = api.must_get("/configurations?top=10").await;
    assert_eq!(listed.as_array().map(|a| a.len()), Some(1), "{listed}");
    assert_eq!(listed[0]["systemMetrics"]["results"]["targetedCount"], 0, "{listed}");
}

/// A configuration key is a flat, dotted path: one of 120,000 segments fits in a request body. It is
/// refused with a 400 naming the depth, and the node goes on serving (building that path recursively
/// would overflow a worker's stack and take the whole node down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_key_nested_past_the_twin_depth_is_a_400_and_the_node_stays_up() {
    let server = Server::start(ServerOpts { shard_count: Some(2), ..Default::default() });
    let api = server.owner();
    let key = format!("properties.desired.{}", vec!["a"; 120_000].join("."));
    let deep = json!({"content": {"deviceContent": {key: 1}}, "targetCondition": "*"});
    let r = api.send("PUT", "/configurations/deep", Some(&deep), &[]).await;
    assert_error(&r, 400, "ArgumentInvalid");
    assert!(r.text.contains("120000 levels deep"), "{}", r.text);
    api.must(404, "GET", "/configurations/deep", None, &[]).await;
    let ok = json!({"content": {"deviceContent": {"properties.desired.a.b.c": 1}}, "targetCondition": "*"});
    api.must(200, "PUT", "/configurations/shallow", Some(&ok), &[]).await;
}

/// The hub's quotas, over HTTPS: the configuration after the hundredth and the job after a hundred active
/// ones are refused with IoT Hub's 403 and nothing is stored; a job that ends frees a place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_and_the_job_past_the_quota_are_refused_with_a_403() {
    let server = Server::start(ServerOpts { shard_count: Some(2), ..Default::default() });
    let api = server.owner();
    let config = json!({"content": {"deviceContent": {"properties.desired.x": 1}}, "targetCondition": "deviceId = 'none'", "priority": 1});
    for i in 0..100 {
        api.must(200, "PUT", &format!("/configurations/c{i:03}"), Some(&config), &[]).await;
    }
    let r = api.send("PUT", "/configurations/c100", Some(&config), &[]).await;
    assert_error(&r, 403, "IotHubQuotaExceeded");
    assert!(r.text.contains("maximum of 100 configurations"), "{}", r.text);
    api.must(404, "GET", "/configurations/c100", None, &[]).await;

    // Jobs that start in a year stay scheduled, so each one holds its place.
    let job = json!({"type": "scheduleUpdateTwin", "queryCondition": "deviceId = 'none'", "updateTwin": {"tags": {"a": 1}},
        "startTime": "2099-01-01T00:00:00.000Z"});
    for i in 0..100 {
        api.must(200, "PUT", &format!("/jobs/v2/j{i:03}"), Some(&job), &[]).await;
    }
    let r = api.send("PUT", "/jobs/v2/j100", Some(&job), &[]).await;
    assert_error(&r, 403, "JobQuotaExceeded");
    assert_error(&api.send("GET", "/jobs/v2/j100", None, &[]).await, 404, "JobNotFound");
    api.must(200, "POST", "/jobs/v2/j000/cancel", None, &[]).await;
    api.must(200, "PUT", "/jobs/v2/j100", Some(&job), &[]).await;
}
