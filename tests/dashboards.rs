//! The Grafana dashboard (`cluster/grafana/twinhub.json`) and the Prometheus files
//! (`cluster/prometheus/alerts.yml`, `prometheus.yml`): the dashboard has the shape Grafana imports,
//! `promtool` accepts the rules and the scrape config, and every metric either of them reads is on a
//! real node's `/metrics` after a little traffic (HTTPS, MQTT, change events).

use twinhub_testkit as common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::*;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{json, Value};

const DASHBOARD: &str = "cluster/grafana/twinhub.json";
const RULES: &str = "cluster/prometheus/alerts.yml";
const SCRAPE: &str = "cluster/prometheus/prometheus.yml";

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Metric names in a PromQL expression: identifiers of our namespaces, histogram suffixes stripped.
fn metric_names(expr: &str, into: &mut BTreeSet<String>) {
    let mut word = String::new();
    for c in expr.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if word.starts_with("twinhub_") || word.starts_with("process_") {
            let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| word.strip_suffix(s)).unwrap_or(&word);
            into.insert(base.to_string());
        }
        word.clear();
    }
}

fn promtool(args: &[&str]) -> String {
    let out = std::process::Command::new("promtool")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("promtool is required (scripts/test.sh installs Debian's prometheus package): {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_dashboard_has_the_shape_grafana_imports() {
    let d: Value = serde_json::from_str(&std::fs::read_to_string(repo(DASHBOARD)).unwrap()).expect("valid JSON");
    assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty() && u.len() <= 40), "uid");
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 30));
    let vars = d["templating"]["list"].as_array().expect("templating");
    assert!(vars.iter().any(|v| v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus"));
    assert!(vars.iter().any(|v| v["name"] == "instance"));
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut graphs = 0;
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().expect("panel id")), "duplicate panel id {}", p["id"]);
        for k in ["x", "y", "w", "h"] {
            assert!(p["gridPos"][k].as_u64().is_some(), "{}: gridPos.{k}", p["title"]);
        }
        assert!(
            p["gridPos"]["x"].as_u64().unwrap() + p["gridPos"]["w"].as_u64().unwrap() <= 24,
            "{}: wider than the grid",
            p["title"]
        );
        if p["type"] == "row" {
            continue;
        }
        graphs += 1;
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("{}: no targets", p["title"]));
        assert!(!targets.is_empty(), "{}", p["title"]);
        for t in targets {
            assert!(t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()), "{}: empty expr", p["title"]);
        }
    }
    assert!(graphs >= 15, "{graphs} panels");
}

#[test]
fn promtool_accepts_the_rules_and_the_scrape_config() {
    let out = promtool(&["check", "rules", repo(RULES).to_str().unwrap()]);
    assert!(out.contains("SUCCESS"), "{out}");
    // `prometheus.yml` names `ca.pem` beside it; check a copy with a CA in place.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(repo(SCRAPE), dir.path().join("prometheus.yml")).unwrap();
    std::fs::copy(repo(RULES), dir.path().join("alerts.yml")).unwrap();
    std::fs::write(dir.path().join("ca.pem"), "").unwrap();
    promtool(&["check", "config", dir.path().join("prometheus.yml").to_str().unwrap()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_alerts_read_is_exported() {
    let mut wanted = BTreeSet::new();
    let d: Value = serde_json::from_str(&std::fs::read_to_string(repo(DASHBOARD)).unwrap()).unwrap();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            metric_names(t["expr"].as_str().unwrap_or_default(), &mut wanted);
        }
    }
    for line in std::fs::read_to_string(repo(RULES)).unwrap().lines() {
        if let Some(expr) = line.trim().strip_prefix("expr:") {
            metric_names(expr, &mut wanted);
        }
    }
    assert!(wanted.len() >= 20, "{wanted:?}");

    // Traffic: registry and twin writes over HTTPS, a device over MQTT, a change-feed consumer.
    let srv = Server::start_default();
    let api = srv.owner();
    let doc = api.must_create_device("dash-dev").await;
    let key = doc.pointer("/authentication/symmetricKey/primaryKey").and_then(Value::as_str).unwrap().to_string();
    for i in 0..5 {
        api.must_patch_twin("dash-dev", &json!({"properties": {"desired": {"i": i}}})).await;
    }
    let _ = api.send("GET", "/twins/nobody", None, &[]).await;
    let mut o = MqttOptions::new("dash-dev", "127.0.0.1", srv.mqtt_plain_port);
    o.set_credentials(
        "localhost/dash-dev/?api-version=2021-04-12",
        device_token("localhost", "dash-dev", None, &key, unix_now() + 3600),
    );
    let (client, mut el) = AsyncClient::new(o, 16);
    client.subscribe("$iothub/twin/res/#", QoS::AtLeastOnce).await.unwrap();
    client.publish("$iothub/twin/GET/?$rid=1", QoS::AtLeastOnce, false, " ").await.unwrap();
    let answered = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Ok(Event::Incoming(Packet::Publish(p))) = el.poll().await {
                if p.topic.starts_with("$iothub/twin/res/200/") {
                    return;
                }
            }
        }
    })
    .await;
    assert!(answered.is_ok(), "no twin response over MQTT");
    // Let the once-a-second gauges (shards, process, disk) run.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let page = srv.api_raw_auth(None).send("GET", "/metrics", None, &[]).await.text;
    let exported: BTreeSet<String> = page
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(|n| ["_bucket", "_sum", "_count"].iter().find_map(|s| n.strip_suffix(s)).unwrap_or(n).to_string())
        .collect();
    let missing: Vec<&String> = wanted.iter().filter(|m| !exported.contains(*m)).collect();
    assert!(missing.is_empty(), "read by the dashboard or the alerts but not on /metrics: {missing:?}");
    let _ = client.disconnect().await;
    follows_prometheus_naming(&page);
}

/// Prometheus' conventions: every family has HELP and TYPE; counters, and only counters, end in
/// `_total`; names are snake case under this project's (or the standard `process_`) prefix; durations
/// are in seconds and say so; no label value carries a device id.
fn follows_prometheus_naming(page: &str) {
    let mut types = std::collections::BTreeMap::new();
    let mut helps = BTreeSet::new();
    for line in page.lines() {
        let mut w = line.split_whitespace();
        match (w.next(), w.next(), w.next(), w.next()) {
            (Some("#"), Some("TYPE"), Some(name), Some(kind)) => {
                types.insert(name.to_string(), kind.to_string());
            }
            (Some("#"), Some("HELP"), Some(name), Some(_)) => {
                helps.insert(name.to_string());
            }
            _ => {}
        }
    }
    assert!(types.len() >= 25, "{types:?}");
    let mut wrong = Vec::new();
    for (name, kind) in &types {
        if !helps.contains(name) {
            wrong.push(format!("{name}: no HELP"));
        }
        if !(name.starts_with("twinhub_") || name.starts_with("process_"))
            || name.chars().any(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
        {
            wrong.push(format!("{name}: not a snake-case twinhub_/process_ name"));
        }
        match (kind.as_str(), name.ends_with("_total")) {
            ("counter", false) => wrong.push(format!("{name}: a counter must end in _total")),
            ("gauge" | "histogram" | "summary", true) => wrong.push(format!("{name}: a {kind} must not end in _total")),
            _ => {}
        }
        if (name.contains("latency") || name.contains("duration")) && !name.ends_with("_seconds") {
            wrong.push(format!("{name}: a duration must be in seconds and named so"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(!page.contains("dash-dev"), "a device id became a label value");
}
