//! `POST /devices/query` against the real binary (4 shards, so every query is scattered and merged):
//! row queries with WHERE over tags, reported properties and identity fields, projections, TOP,
//! aggregates with GROUP BY, paging through `x-ms-max-item-count` / `x-ms-continuation`, module twins,
//! and the errors (syntax error with its position, a foreign continuation token, a bad page size).

use twinhub_testkit as common;

use std::collections::BTreeSet;

use common::*;
use serde_json::{json, Value};

async fn query(api: &Api, q: &str, headers: &[Hdr<'_>]) -> Resp {
    api.send("POST", "/devices/query", Some(&json!({"query": q})), headers).await
}

/// Every page of `q` at `page` rows each, concatenated; checks the item type on every page.
async fn all_pages(api: &Api, q: &str, page: usize, item_type: &str) -> (Vec<Value>, usize) {
    let mut items = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let n = page.to_string();
        let mut h: Vec<Hdr<'_>> = vec![("x-ms-max-item-count", n.as_str())];
        if let Some(t) = &token {
            h.push(("x-ms-continuation", t.as_str()));
        }
        let r = query(api, q, &h).await;
        assert_eq!(r.status, 200, "{q}: {}", r.text);
        assert_eq!(r.headers.get("x-ms-item-type").map(String::as_str), Some(item_type), "{q}");
        let got = r.json().as_array().cloned().unwrap_or_else(|| panic!("{q}: not an array: {}", r.text));
        assert!(got.len() <= page, "{q}: page of {} > {page}", got.len());
        items.extend(got);
        pages += 1;
        assert!(pages < 1000, "{q}: paging does not end");
        match r.headers.get("x-ms-continuation") {
            Some(t) => token = Some(t.clone()),
            None => return (items, pages),
        }
    }
}

fn ids(items: &[Value]) -> Vec<String> {
    items.iter().map(|t| t["deviceId"].as_str().unwrap_or("?").to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_scatter_over_shards_and_page() {
    let server = Server::start(ServerOpts { shard_count: Some(4), ..Default::default() });
    let api = server.owner();
    // 30 devices in 3 buildings, battery 0..29; every third has a module.
    for i in 0..30 {
        let id = format!("q-{i:02}");
        api.must_create_device(&id).await;
        let building = ["b43", "b44", "b45"][i % 3];
        api.must_patch_twin(&id, &json!({"tags": {"building": building, "n": i}, "properties": {"desired": {"mode": if i % 2 == 0 {"eco"} else {"fast"}}}})).await;
        if i % 3 == 0 {
            api.must_create_module(&id, "sensor").await;
        }
    }

    // WHERE over tags, across shards, in deviceId order.
    let r = query(&api, "SELECT * FROM devices WHERE tags.building = 'b43' AND tags.n < 20", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.headers.get("x-ms-item-type").map(String::as_str), Some("twin"));
    let got = ids(r.json().as_array().expect("array"));
    let want: Vec<String> = (0..20).filter(|i| i % 3 == 0).map(|i| format!("q-{i:02}")).collect();
    assert_eq!(got, want);
    assert!(r.json()[0]["properties"]["desired"]["$version"].is_number(), "full twins: {}", r.json()[0]);

    // Operators: IN, NIN, OR, NOT, arithmetic, IS_DEFINED, != on desired properties.
    for (q, want) in [
        ("SELECT * FROM devices WHERE tags.n IN [1, 2, 3]", vec![1, 2, 3]),
        ("SELECT * FROM devices WHERE tags.n NIN [0, 1] AND tags.n < 4", vec![2, 3]),
        ("SELECT * FROM devices WHERE tags.n = 5 OR tags.n = 7", vec![5, 7]),
        ("SELECT * FROM devices WHERE NOT (tags.n >= 2) ", vec![0, 1]),
        ("SELECT * FROM devices WHERE tags.n % 10 = 0", vec![0, 10, 20]),
        ("SELECT * FROM devices WHERE tags.n * 2 + 1 = 9", vec![4]),
        ("SELECT * FROM devices WHERE IS_DEFINED(tags.nope)", vec![]),
        ("SELECT * FROM devices WHERE properties.desired.mode != 'eco' AND tags.n <= 5", vec![1, 3, 5]),
        ("SELECT * FROM devices WHERE deviceId = 'q-07'", vec![7]),
    ] {
        let r = query(&api, q, &[]).await;
        assert_eq!(r.status, 200, "{q}: {}", r.text);
        let want: Vec<String> = want.iter().map(|i| format!("q-{i:02}")).collect();
        assert_eq!(ids(r.json().as_array().expect("array")), want, "{q}");
    }

    // Projections are raw items keyed by alias or last segment; TOP cuts across shards.
    let r = query(&api, "SELECT TOP 3 deviceId, tags.building AS b FROM devices WHERE tags.n >= 10", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.headers.get("x-ms-item-type").map(String::as_str), Some("raw"));
    assert_eq!(
        r.json(),
        &json!([{"deviceId": "q-10", "b": "b44"}, {"deviceId": "q-11", "b": "b45"}, {"deviceId": "q-12", "b": "b43"}])
    );

    // Aggregates merge across shards.
    let r = query(&api, "SELECT COUNT() AS n FROM devices", &[]).await;
    assert_eq!(r.json(), &json!([{"n": 30}]), "{}", r.text);
    let r = query(
        &api,
        "SELECT tags.building AS building, COUNT() AS n FROM devices WHERE tags.n < 12 GROUP BY tags.building",
        &[],
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let groups: BTreeSet<String> = r.json().as_array().expect("array").iter().map(|g| g.to_string()).collect();
    let want: BTreeSet<String> =
        [json!({"building": "b43", "n": 4}), json!({"building": "b44", "n": 4}), json!({"building": "b45", "n": 4})]
            .iter()
            .map(|g| g.to_string())
            .collect();
    assert_eq!(groups, want);

    // Paging: every page size gives the same rows as one big page, and a TOP spans pages.
    let (one, pages) = all_pages(&api, "SELECT * FROM devices", 1000, "twin").await;
    assert_eq!(pages, 1);
    assert_eq!(ids(&one), (0..30).map(|i| format!("q-{i:02}")).collect::<Vec<_>>());
    for page in [1, 2, 7] {
        let (paged, pages) = all_pages(&api, "SELECT * FROM devices", page, "twin").await;
        assert_eq!(ids(&paged), ids(&one), "page size {page}");
        assert_eq!(pages, 30usize.div_ceil(page), "page size {page}");
    }
    let (top, _) = all_pages(&api, "SELECT TOP 5 deviceId FROM devices WHERE tags.building = 'b44'", 2, "raw").await;
    assert_eq!(top, (0..5).map(|k| json!({"deviceId": format!("q-{:02}", 1 + 3 * k)})).collect::<Vec<_>>());

    // Module twins.
    let r =
        query(&api, "SELECT deviceId, moduleId FROM devices.modules WHERE deviceId IN ['q-00', 'q-03', 'q-04']", &[])
            .await;
    assert_eq!(
        r.json(),
        &json!([{"deviceId": "q-00", "moduleId": "sensor"}, {"deviceId": "q-03", "moduleId": "sensor"}]),
        "{}",
        r.text
    );

    // Errors: the position of a syntax error, a foreign token, a bad page size, a missing query.
    let r = query(&api, "SELECT * FROM devices WHERE tags.n = = 1", &[]).await;
    assert_error(&r, 400, "ArgumentInvalid");
    assert!(r.text.contains("position 38"), "names the position: {}", r.text);
    let r = query(&api, "SELECT * FROM devices WHERE", &[]).await;
    assert_error(&r, 400, "ArgumentInvalid");
    let long = format!("SELECT * FROM devices WHERE deviceId = '{}'", "x".repeat(8200));
    assert_error(&query(&api, &long, &[]).await, 400, "ArgumentInvalid");
    let first = query(&api, "SELECT * FROM devices", &[("x-ms-max-item-count", "2")]).await;
    let token = first.headers.get("x-ms-continuation").expect("a continuation").clone();
    let r = query(&api, "SELECT deviceId FROM devices", &[("x-ms-continuation", token.as_str())]).await;
    assert_error(&r, 400, "ArgumentInvalid");
    let r = query(&api, "SELECT * FROM devices", &[("x-ms-continuation", "%%%garbage")]).await;
    assert_error(&r, 400, "ArgumentInvalid");
    let r = query(&api, "SELECT * FROM devices", &[("x-ms-max-item-count", "zero")]).await;
    assert_error(&r, 400, "ArgumentInvalid");
    let r = api.send("POST", "/devices/query", Some(&json!({"sql": "SELECT 1"})), &[]).await;
    assert_error(&r, 400, "ArgumentInvalid");
    // A registry-read policy may query.
    let r = server
        .api("registryRead", &server.policy_key("registryRead"))
        .send("POST", "/devices/query", Some(&json!({"query": "SELECT * FROM devices"})), &[])
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}

/// A SELECT list may name the whole document under hundreds of names within its 8192 characters: each
/// row would hold that many copies of its twin, a page a thousand such rows. A row past 1 MiB is a
/// 400 that says so; the same twins queried plainly still answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_that_copies_its_twin_hundreds_of_times_is_refused() {
    let server = Server::start(ServerOpts { shard_count: Some(4), ..Default::default() });
    let api = server.owner();
    for i in 0..3 {
        let id = format!("big-{i}");
        api.must_create_device(&id).await;
        let tags: serde_json::Map<String, Value> =
            (0..8).map(|k| (format!("t{k}"), Value::String("x".repeat(900)))).collect();
        api.must_patch_twin(&id, &json!({ "tags": tags })).await;
    }
    let items: Vec<String> = (0..200).map(|i| format!("d AS c{i}")).collect();
    let q = format!("SELECT {} FROM devices d", items.join(", "));
    let r = query(&api, &q, &[]).await;
    assert_error(&r, 400, "ArgumentInvalid");
    assert!(r.text.contains("larger than 1024 KiB"), "{}", r.text);
    let r = query(&api, "SELECT d AS c0, d AS c1 FROM devices d", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json().as_array().map(Vec::len), Some(3));
}
