//! Query corpus: every case of `fixtures/corpus.json` runs against the twins of `fixtures/twins.json`
//! and is checked three ways: the one-shot result against the expectation, the same result computed
//! as 3 shards (aggregates: partials merged through their serialized state; rows: paged through
//! continuation tokens with several page sizes), and the error position for invalid queries.

use serde::Deserialize;
use serde_json::Value;
use twinhub::query::{parse, parse_condition, Collection, Cursor, Query};

#[derive(Deserialize)]
struct Fixtures {
    devices: Vec<Value>,
    modules: Vec<Value>,
    jobs: Vec<Value>,
}

#[derive(Deserialize, Debug)]
struct Case {
    query: Option<String>,
    condition: Option<String>,
    item_type: Option<String>,
    /// Expected SELECT * results, by id (devices: deviceId, modules: deviceId/moduleId, jobs: jobId/deviceId).
    ids: Option<Vec<String>>,
    rows: Option<Vec<Value>>,
    #[serde(default)]
    ordered: bool,
    error_position: Option<usize>,
    error_contains: Option<String>,
}

fn fixtures() -> Fixtures {
    serde_json::from_str(include_str!("fixtures/query/twins.json")).expect("fixture JSON")
}

fn corpus() -> Vec<Case> {
    serde_json::from_str(include_str!("fixtures/query/corpus.json")).expect("corpus JSON")
}

fn docs(f: &Fixtures, c: Collection) -> &[Value] {
    match c {
        Collection::Devices => &f.devices,
        Collection::Modules => &f.modules,
        Collection::Jobs => &f.jobs,
    }
}

fn id_of(c: Collection, row: &Value) -> String {
    let s = |k: &str| row.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
    match c {
        Collection::Devices => s("deviceId"),
        Collection::Modules => format!("{}/{}", s("deviceId"), s("moduleId")),
        Collection::Jobs => format!("{}/{}", s("jobId"), s("deviceId")),
    }
}

/// Text form that ignores member order and number spelling (`2.0` vs `2`; serde_json's
/// `arbitrary_precision` keeps number text, so plain `==` would tell them apart).
fn norm(v: &Value) -> String {
    match v {
        Value::Number(n) => format!("{}", n.as_f64().unwrap_or(f64::NAN)),
        Value::Array(a) => format!("[{}]", a.iter().map(norm).collect::<Vec<_>>().join(",")),
        Value::Object(m) => {
            let mut members: Vec<String> = m.iter().map(|(k, v)| format!("{k:?}:{}", norm(v))).collect();
            members.sort();
            format!("{{{}}}", members.join(","))
        }
        other => other.to_string(),
    }
}

fn assert_same(label: &str, actual: &[String], expected: &[String], ordered: bool) {
    let (mut a, mut e) = (actual.to_vec(), expected.to_vec());
    if !ordered {
        a.sort();
        e.sort();
    }
    assert_eq!(a, e, "{label}");
}

/// Round-robin split into 3 shards.
fn shards(all: &[Value]) -> Vec<Vec<&Value>> {
    let mut out = vec![Vec::new(), Vec::new(), Vec::new()];
    for (i, d) in all.iter().enumerate() {
        out[i % 3].push(d);
    }
    out
}

/// The whole result fetched page by page over 3 shards, tokens round-tripped through their text.
fn paged(q: &Query, all: &[Value], max_items: usize) -> Vec<Value> {
    let parts = shards(all);
    let mut cursor: Option<Cursor> = None;
    let mut out = Vec::new();
    for _ in 0..1000 {
        let per_shard = parts.iter().map(|p| q.shard_rows(p.iter().copied(), cursor.as_ref(), max_items)).collect();
        let page = q.page(per_shard, cursor.as_ref(), max_items);
        assert!(page.items.len() <= max_items.max(1), "page too large");
        out.extend(page.items);
        match page.next {
            Some(c) => cursor = Some(q.cursor(&c.encode()).expect("own token decodes")),
            None => return out,
        }
    }
    panic!("paging did not terminate");
}

/// Aggregate computed per shard, shipped as serialized state, merged, finished.
fn sharded_aggregate(q: &Query, all: &[Value]) -> Vec<Value> {
    let mut merged = q.partial().expect("aggregate");
    for part in shards(all) {
        let mut p = q.partial().expect("aggregate");
        for d in part {
            p.add(d);
        }
        let wire = serde_json::to_string(&p.state()).expect("state serializes");
        merged.merge_state(serde_json::from_str(&wire).expect("state deserializes")).expect("same shape");
    }
    merged.finish()
}

fn check_query(f: &Fixtures, case: &Case, text: &str) {
    let q = match (parse(text), case.error_position) {
        (Err(e), Some(pos)) => {
            assert_eq!(e.position, pos, "{text}: {e}");
            if let Some(s) = &case.error_contains {
                assert!(e.to_string().contains(s.as_str()), "{text}: '{e}' lacks '{s}'");
            }
            assert!(e.to_string().starts_with(&format!("syntax error at position {pos}: ")));
            return;
        }
        (Err(e), None) => panic!("{text}: unexpected error {e}"),
        (Ok(_), Some(_)) => panic!("{text}: expected an error"),
        (Ok(q), None) => q,
    };
    if let Some(t) = &case.item_type {
        assert_eq!(q.item_type(), t, "{text}");
    }
    let all = docs(f, q.collection());
    let result = q.run(all);
    match (&case.ids, &case.rows) {
        (Some(ids), _) => {
            let got: Vec<String> = result.iter().map(|r| id_of(q.collection(), r)).collect();
            assert_same(text, &got, ids, case.ordered);
            // SELECT * returns the stored documents unchanged.
            for r in &result {
                assert!(all.contains(r), "{text}: row is not a fixture document");
            }
        }
        (None, Some(rows)) => {
            let got: Vec<String> = result.iter().map(norm).collect();
            let want: Vec<String> = rows.iter().map(norm).collect();
            assert_same(text, &got, &want, case.ordered);
        }
        (None, None) => panic!("{text}: case has no expectation"),
    }
    let one_shot: Vec<String> = result.iter().map(norm).collect();
    if q.is_aggregate() {
        let merged: Vec<String> = sharded_aggregate(&q, all).iter().map(norm).collect();
        assert_eq!(merged, one_shot, "{text}: 3-shard merge differs");
    } else {
        for max_items in [1, 2, 3, 1000] {
            let pages: Vec<String> = paged(&q, all, max_items).iter().map(norm).collect();
            assert_eq!(pages, one_shot, "{text}: paged with max_items {max_items} differs");
        }
    }
}

fn check_condition(f: &Fixtures, case: &Case, text: &str) {
    match (parse_condition(text), case.error_position) {
        (Err(e), Some(pos)) => {
            assert_eq!(e.position, pos, "{text}: {e}");
            if let Some(s) = &case.error_contains {
                assert!(e.to_string().contains(s.as_str()), "{text}: '{e}' lacks '{s}'");
            }
        }
        (Err(e), None) => panic!("{text}: unexpected error {e}"),
        (Ok(_), Some(_)) => panic!("{text}: expected an error"),
        (Ok(c), None) => {
            let got: Vec<String> =
                f.devices.iter().filter(|d| c.matches(d)).map(|d| id_of(Collection::Devices, d)).collect();
            assert_same(text, &got, case.ids.as_deref().unwrap_or_default(), false);
        }
    }
}

#[test]
fn corpus_cases() {
    let f = fixtures();
    let cases = corpus();
    assert!(cases.len() >= 100);
    for case in &cases {
        match (&case.query, &case.condition) {
            (Some(q), None) => check_query(&f, case, q),
            (None, Some(c)) => check_condition(&f, case, c),
            _ => panic!("case needs exactly one of query/condition: {case:?}"),
        }
    }
}

#[test]
fn query_length_limit() {
    let head = "SELECT * FROM devices WHERE deviceId = '";
    let exact = format!("{head}{}'", "x".repeat(8192 - head.len() - 1));
    assert_eq!(exact.chars().count(), 8192);
    assert!(parse(&exact).is_ok());
    let over = format!("{head}{}'", "x".repeat(8193 - head.len() - 1));
    let e = parse(&over).unwrap_err();
    assert_eq!(e.position, 8193);
    assert!(e.message.contains("8192"));
    assert!(parse_condition(&"x".repeat(9000)).is_err());
}

#[test]
fn nesting_limit() {
    let ok = format!("SELECT * FROM devices WHERE {}true{}", "(".repeat(63), ")".repeat(63));
    assert!(parse(&ok).is_ok());
    for deep in [
        format!("SELECT * FROM devices WHERE {}true{}", "(".repeat(64), ")".repeat(64)),
        format!("SELECT * FROM devices WHERE x IN {}1{}", "[".repeat(80), "]".repeat(80)),
        format!("SELECT * FROM devices WHERE {}1 = 1", "-".repeat(100)),
        format!("SELECT * FROM devices WHERE {}true", "NOT ".repeat(100)),
        format!("SELECT * FROM devices WHERE {}x{}", "ABS(".repeat(70), ")".repeat(70)),
        format!("SELECT {}1{} AS o FROM devices", "{a:".repeat(70), "}".repeat(70)),
    ] {
        let e = parse(&deep).unwrap_err();
        assert!(e.message.contains("nested"), "{e}");
    }
    let e = parse_condition(&"(".repeat(8000)).unwrap_err();
    assert!(e.message.contains("nested"), "{e}");
}

#[test]
fn foreign_and_corrupt_tokens() {
    let f = fixtures();
    let a = parse("SELECT * FROM devices").unwrap();
    let b = parse("SELECT deviceId FROM devices").unwrap();
    let first = a.page(vec![a.shard_rows(&f.devices, None, 2)], None, 2);
    let token = first.next.expect("more pages").encode();
    assert!(a.cursor(&token).is_ok());
    assert!(matches!(b.cursor(&token), Err(twinhub::query::CursorError::OtherQuery)));
    let mut bytes = token.clone().into_bytes();
    bytes.truncate(bytes.len() / 2);
    assert!(a.cursor(&String::from_utf8(bytes).unwrap()).is_err());
    assert!(a.cursor("%%%").is_err());
}

#[test]
fn aggregate_queries_are_not_paged_and_rows_have_no_partial() {
    let f = fixtures();
    let agg = parse("SELECT COUNT() AS n FROM devices").unwrap();
    assert!(agg.is_aggregate());
    assert!(agg.shard_rows(&f.devices, None, 10).is_empty());
    assert_eq!(agg.project(&f.devices[0]), None);
    let rows = parse("SELECT * FROM devices").unwrap();
    assert!(rows.partial().is_none());
}
