//! Fuzzes the query front end and everything a parsed query can do: any UTF-8 text goes through
//! `parse` and `parse_condition`; whatever parses is evaluated against fixed twins, projected,
//! paged (with its own continuation token) and aggregated (through serialized shard state). The text
//! is also fed to the continuation-token decoder. Nothing may panic or overflow the stack.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

/// The query module's own source: it depends on serde, serde_json, thiserror and base64 only, so the
/// fuzzer builds it alone instead of the whole server.
#[path = "../../src/query/mod.rs"]
#[allow(dead_code)]
mod query;
use serde_json::{json, Value};

fn docs() -> &'static [Value] {
    static DOCS: OnceLock<Vec<Value>> = OnceLock::new();
    DOCS.get_or_init(|| {
        vec![
            json!({"deviceId": "dev-1", "etag": "AAAAAAAAAAE=", "status": "enabled", "connectionState": "Connected",
                   "version": 3, "capabilities": {"iotEdge": false},
                   "x509Thumbprint": {"primaryThumbprint": null},
                   "tags": {"location": {"region": "US", "plant": "Redmond43"}, "floor": 2, "group": "a"},
                   "properties": {"desired": {"telemetryConfig": {"sendFrequencyInSecs": 300}, "$version": 4},
                                  "reported": {"telemetryConfig": {"status": "Success"}, "batteryLevel": 55.5,
                                               "ports": [80, 443], "connectivity": {"type": "cellular"}, "$version": 7}}}),
            json!({"deviceId": "Dev-2", "moduleId": "m", "status": "disabled", "version": 1,
                   "tags": {"floor": "2"}, "properties": {"reported": {"batteryLevel": "low"}}}),
            json!({"deviceId": "dev-3", "jobId": "job", "jobType": "scheduleUpdateTwin", "status": "completed",
                   "outcome": {"deviceMethodResponse": null}}),
        ]
    })
}

fn exercise(q: &query::Query) {
    let docs = docs();
    let _ = q.item_type();
    let _ = q.run(docs);
    if let Some(mut p) = q.partial() {
        let mut other = q.partial().expect("aggregate");
        for (i, d) in docs.iter().enumerate() {
            if i % 2 == 0 {
                p.add(d);
            } else {
                other.add(d);
            }
        }
        let wire = serde_json::to_string(&other.state()).expect("state serializes");
        p.merge_state(serde_json::from_str(&wire).expect("state deserializes")).expect("same query");
        let _ = p.finish();
        return;
    }
    for d in docs {
        if q.matches(d) {
            let _ = q.project(d);
        }
    }
    let mut cursor = None;
    for _ in 0..docs.len() + 1 {
        let shards = docs.iter().map(|d| q.shard_rows(std::iter::once(d), cursor.as_ref(), 1)).collect();
        let page = q.page(shards, cursor.as_ref(), 1);
        match page.next {
            Some(c) => cursor = Some(q.cursor(&c.encode()).expect("own token")),
            None => break,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match query::parse(text) {
        Ok(q) => exercise(&q),
        Err(e) => assert!(e.position >= 1 && e.position <= text.chars().count() + 1),
    }
    if let Ok(c) = query::parse_condition(text) {
        for d in docs() {
            let _ = c.matches(d);
        }
    }
    let _ = query::Cursor::decode(text);
});
