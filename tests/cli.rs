//! The admin commands (`twinhub device|twin|query|job|watch|cluster status`) as a user runs them: the
//! real binary against a real hub, credentials from the environment, a flag or a profile file. Each
//! command's output is checked against what the hub holds afterwards, and each failure against its
//! documented exit code and the hub's own error text.

use twinhub_testkit as common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::*;
use serde_json::{json, Value};

/// The `twinhub` binary with a hub's connection string and CA in the environment.
struct Cli {
    env: Vec<(String, String)>,
    _dir: tempfile::TempDir,
}

impl Cli {
    fn for_hub(connection_string: &str, ca_pem: &[u8]) -> Cli {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ca_pem).unwrap();
        Cli {
            env: vec![
                ("TWINHUB_CONNECTION_STRING".into(), connection_string.into()),
                ("TWINHUB_CA_FILE".into(), ca.display().to_string()),
                // No profile file of the machine's user may leak into a test.
                ("TWINHUB_PROFILES".into(), dir.path().join("no-profiles.json").display().to_string()),
            ],
            _dir: dir,
        }
    }

    fn ca(&self) -> &str {
        &self.env[1].1
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin_path());
        c.args(args).stdin(Stdio::null());
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c.env_remove("TWINHUB_PROFILE");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run twinhub")
    }

    /// Runs and insists on success; returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "twinhub {args:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn ok_json(&self, args: &[&str]) -> Value {
        let out = self.ok(args);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("twinhub {args:?} printed no JSON ({e}): {out}"))
    }

    /// Runs and insists on the exit code; returns stderr.
    fn fails(&self, code: i32, args: &[&str]) -> String {
        let out = self.run(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(code), "twinhub {args:?}: expected exit {code}; stderr:\n{err}");
        assert!(out.stdout.is_empty(), "a failed command printed a result: {}", String::from_utf8_lossy(&out.stdout));
        assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "{err}");
        err
    }
}

fn start() -> (Server, Cli) {
    let s = Server::start_default();
    let cli = Cli::for_hub(&s.connection_string, &s.ca_pem);
    (s, cli)
}

#[tokio::test]
async fn devices_are_created_shown_listed_and_deleted() {
    let (s, cli) = start();
    let api = s.owner();
    let created = cli.ok_json(&["device", "create", "cli-d1"]);
    assert_eq!(created["deviceId"], "cli-d1");
    let key = created["authentication"]["symmetricKey"]["primaryKey"].as_str().unwrap().to_string();
    assert_eq!(api.must_get("/devices/cli-d1").await["authentication"]["symmetricKey"]["primaryKey"], key.as_str());

    // Given keys, a disabled device, a module.
    let k1 = "MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDE=";
    let k2 = "YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXphYmNkZWY=";
    cli.ok(&["device", "create", "cli-d2", "--primary-key", k1, "--secondary-key", k2, "--disabled"]);
    let d2 = api.must_get("/devices/cli-d2").await;
    assert_eq!(
        (d2["status"].as_str(), d2["authentication"]["symmetricKey"]["primaryKey"].as_str()),
        (Some("disabled"), Some(k1))
    );
    cli.ok(&["device", "create", "cli-d1", "--module", "m1"]);
    assert_eq!(cli.ok_json(&["device", "show", "cli-d1", "--module", "m1"])["moduleId"], "m1");

    let cs = cli.ok(&["device", "connection-string", "cli-d1"]);
    assert_eq!(cs.trim(), format!("HostName=localhost;DeviceId=cli-d1;SharedAccessKey={key}"));

    let table = cli.ok(&["device", "list"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("DEVICE") && lines[0].contains("STATUS"), "{table}");
    assert!(lines.iter().any(|l| l.starts_with("cli-d1 ") && l.contains("enabled")), "{table}");
    assert!(lines.iter().any(|l| l.starts_with("cli-d2 ") && l.contains("disabled")), "{table}");
    let listed: Value = serde_json::from_str(&cli.ok(&["device", "list", "--json"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2);

    // Refusals carry the hub's error code, change nothing, and exit 1.
    let err = cli.fails(1, &["device", "create", "cli-d1"]);
    assert!(err.contains("DeviceAlreadyExists") && err.contains("409"), "{err}");
    let err = cli.fails(1, &["device", "show", "nope"]);
    assert!(err.contains("DeviceNotFound") && err.contains("404"), "{err}");
    let err = cli.fails(1, &["device", "create", "bad id with spaces?"]);
    assert!(err.contains("400"), "{err}");

    // Deletion with a stale etag is refused with exit 4; with the current one (or none) it deletes.
    let err = cli.fails(4, &["device", "delete", "cli-d2", "--etag", "AAAAAAAAAAk="]);
    assert!(err.contains("412"), "{err}");
    let etag = d2["etag"].as_str().unwrap();
    cli.ok(&["device", "delete", "cli-d2", "--etag", etag]);
    cli.ok(&["device", "delete", "cli-d1", "--module", "m1"]);
    cli.ok(&["device", "delete", "cli-d1"]);
    assert_eq!(api.send("GET", "/devices/cli-d1", None, &[]).await.status, 404);
    assert_eq!(api.send("GET", "/devices/cli-d2", None, &[]).await.status, 404);
    s.assert_no_panics_in_log();
}

#[tokio::test]
async fn twins_are_shown_patched_and_replaced_with_optimistic_concurrency() {
    let (s, cli) = start();
    let api = s.owner();
    api.must_create_device("cli-t1").await;
    let t = cli.ok_json(&["twin", "show", "cli-t1"]);
    assert_eq!(t["version"], 1);
    let etag = t["etag"].as_str().unwrap().to_string();

    let t = cli.ok_json(&[
        "twin",
        "update",
        "cli-t1",
        "--etag",
        &etag,
        r#"{"tags":{"site":"b43"},"properties":{"desired":{"interval":5}}}"#,
    ]);
    assert_eq!((t["tags"]["site"].as_str(), t["properties"]["desired"]["interval"].as_i64()), (Some("b43"), Some(5)));
    // The old etag is now stale: exit 4, and nothing changes.
    let err = cli.fails(4, &["twin", "update", "cli-t1", "--etag", &etag, r#"{"tags":{"site":"x"}}"#]);
    assert!(err.contains("PreconditionFailed"), "{err}");
    assert_eq!(api.must_get_twin("cli-t1").await["tags"]["site"], "b43");

    // From a file, and from stdin.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("patch.json");
    std::fs::write(&f, r#"{"properties":{"desired":{"interval":null,"mode":"eco"}}}"#).unwrap();
    let t = cli.ok_json(&["twin", "update", "cli-t1", "--file", f.to_str().unwrap()]);
    assert!(t["properties"]["desired"].get("interval").is_none(), "null removes: {t}");
    let mut child = cli
        .cmd(&["twin", "replace", "cli-t1", "--file", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(br#"{"tags":{"only":true},"properties":{"desired":{"fresh":1}}}"#).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let t = api.must_get_twin("cli-t1").await;
    assert_eq!(user_props(&t["properties"]["desired"]), json!({"fresh": 1}));
    assert_eq!(t["tags"], json!({"only": true}));

    // Bad input is refused before anything is sent (exit 2), with the reason.
    let err = cli.fails(2, &["twin", "update", "cli-t1", "{not json"]);
    assert!(err.contains("not JSON"), "{err}");
    let err = cli.fails(2, &["twin", "update", "cli-t1", "[1,2]"]);
    assert!(err.contains("JSON object"), "{err}");
    let err = cli.fails(2, &["twin", "update", "cli-t1", "--file", "/nonexistent/patch.json"]);
    assert!(err.contains("/nonexistent/patch.json"), "{err}");
    // The hub refuses what it refuses (a reported property from a service): exit 1, its message.
    let err = cli.fails(1, &["twin", "update", "cli-t1", r#"{"properties":{"reported":{"x":1}}}"#]);
    assert!(err.contains("400"), "{err}");
    assert_eq!(twin_version(&api.must_get_twin("cli-t1").await), twin_version(&t));
    s.assert_no_panics_in_log();
}

#[tokio::test]
async fn queries_follow_continuations_and_print_tables_or_json_lines() {
    let (s, cli) = start();
    let api = s.owner();
    for i in 0..7 {
        api.must_create_device(&format!("cli-q{i}")).await;
        api.must_patch_twin(&format!("cli-q{i}"), &json!({"tags": {"n": i, "even": i % 2 == 0}})).await;
    }
    // Pages of 2: all 7 come back, once each.
    let out = cli.ok(&["query", "SELECT deviceId, tags.n FROM devices", "--output", "json", "--page-size", "2"]);
    let mut ids: Vec<String> = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["deviceId"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    assert_eq!(ids, (0..7).map(|i| format!("cli-q{i}")).collect::<Vec<_>>());
    let out = cli.ok(&["query", "SELECT * FROM devices", "--output", "json", "--page-size", "2", "--max", "3"]);
    assert_eq!(out.lines().count(), 3);

    let table = cli.ok(&["query", "SELECT deviceId, tags.n FROM devices WHERE tags.even = true", "--page-size", "1"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines[0].split_whitespace().collect::<Vec<_>>(), ["deviceId", "n"], "{table}");
    assert_eq!(lines.len(), 1 + 4, "{table}");
    assert!(lines.iter().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["cli-q6", "6"]), "{table}");
    let count = cli.ok(&["query", "SELECT COUNT() AS total FROM devices"]);
    assert_eq!(count.lines().nth(1).map(str::trim), Some("7"), "{count}");

    let err = cli.fails(1, &["query", "SELECT * FROM devices WHERE"]);
    assert!(err.contains("position"), "a syntax error says where: {err}");
    let err = cli.fails(2, &["query", "SELECT * FROM devices", "--page-size", "0"]);
    assert!(err.contains("--page-size"), "{err}");
    s.assert_no_panics_in_log();
}

#[tokio::test]
async fn jobs_are_scheduled_listed_shown_and_cancelled() {
    let (s, cli) = start();
    let api = s.owner();
    for i in 0..3 {
        api.must_create_device(&format!("cli-j{i}")).await;
    }
    api.must_patch_twin("cli-j0", &json!({"tags": {"fleet": "a"}})).await;
    api.must_patch_twin("cli-j1", &json!({"tags": {"fleet": "a"}})).await;
    let job = cli.ok_json(&[
        "job",
        "update-twin",
        "cli-job1",
        "--where",
        "tags.fleet = 'a'",
        "--patch",
        r#"{"properties":{"desired":{"fw":"2.0"}}}"#,
    ]);
    assert_eq!(job["jobId"], "cli-job1");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let j = cli.ok_json(&["job", "show", "cli-job1"]);
        if j["status"] == "completed" {
            assert_eq!(j["deviceJobStatistics"]["succeededCount"], 2, "{j}");
            break;
        }
        assert!(Instant::now() < deadline, "the job did not complete: {j}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (dev, fw) in [("cli-j0", json!("2.0")), ("cli-j1", json!("2.0")), ("cli-j2", Value::Null)] {
        assert_eq!(
            api.must_get_twin(dev).await["properties"]["desired"].get("fw").cloned().unwrap_or(Value::Null),
            fw,
            "{dev}"
        );
    }
    // A job scheduled an hour ahead stays scheduled until cancelled.
    let later = json!({"jobId": "cli-job2", "type": "scheduleUpdateTwin", "queryCondition": "tags.fleet = 'a'", "updateTwin": {"tags": {"x": 1}, "etag": "*"},
        "startTime": "2099-01-01T00:00:00Z", "maxExecutionTimeInSeconds": 60});
    api.must(200, "PUT", "/jobs/v2/cli-job2", Some(&later), &[]).await;
    let table = cli.ok(&["job", "list"]);
    assert!(
        table.lines().any(|l| l.starts_with("cli-job1 ") && l.contains("completed") && l.contains("2/2")),
        "{table}"
    );
    assert!(table.lines().any(|l| l.starts_with("cli-job2 ")), "{table}");
    let cancelled = cli.ok_json(&["job", "cancel", "cli-job2"]);
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    let err = cli.fails(1, &["job", "update-twin", "cli-job1", "--where", "tags.fleet = 'a'", "--patch", "{}"]);
    assert!(err.contains("409") || err.contains("400"), "a job id is used once: {err}");
    let err = cli.fails(
        2,
        &["job", "method", "cli-job3", "--where", "tags.fleet = 'a'", "--method", "reboot", "--payload", "{oops"],
    );
    assert!(err.contains("--payload"), "{err}");
    s.assert_no_panics_in_log();
}

/// The JSON lines of a running `twinhub watch`, as they come.
struct Watch(JsonLines);

impl Watch {
    fn start(cli: &Cli, args: &[&str]) -> Watch {
        Watch(JsonLines::spawn(cli.cmd(args).stderr(Stdio::null())))
    }

    fn next(&self, within: Duration) -> Option<Value> {
        self.0.next(within)
    }

    /// The next `n` events that carry tag `v`, skipping others (the pings that opened the feed).
    fn tagged(&self, n: usize) -> Vec<Value> {
        let mut out = Vec::new();
        while out.len() < n {
            let e = self
                .next(Duration::from_secs(30))
                .unwrap_or_else(|| panic!("watch printed {} of {n} events: {out:?}", out.len()));
            if !e["data"]["body"]["tags"]["v"].is_null() {
                out.push(e);
            }
        }
        out
    }
}

#[tokio::test]
async fn watch_prints_changes_in_order_and_resumes_from_a_position() {
    let (s, cli) = start();
    let api = s.owner();
    api.must_create_device("cli-w1").await;
    api.must_create_device("cli-w2").await;
    let watch = Watch::start(&cli, &["watch", "--device", "cli-w1"]);
    // The feed shows only what happens after it opened: ping until the first event arrives.
    let mut ping = 0;
    loop {
        ping += 1;
        api.must_patch_twin("cli-w1", &json!({"tags": {"ping": ping}})).await;
        if watch.next(Duration::from_millis(300)).is_some() {
            break;
        }
        assert!(ping < 100, "watch never printed an event");
    }
    for v in 1..=3 {
        api.must_patch_twin("cli-w2", &json!({"tags": {"other": v}})).await;
        api.must_patch_twin("cli-w1", &json!({"tags": {"v": v}})).await;
    }
    let events = watch.tagged(3);
    let tags: Vec<Value> = events.iter().map(|e| e["data"]["body"]["tags"]["v"].clone()).collect();
    assert_eq!(tags, [json!(1), json!(2), json!(3)], "only cli-w1's events, in order: {events:?}");
    assert!(events.iter().all(|e| e["event"] == "twinChangeEvents" && e["data"]["properties"]["deviceId"] == "cli-w1"));
    drop(watch);

    // Resuming from the first position replays what followed it; --count ends the command.
    let from = events[0]["position"].as_str().unwrap();
    let out = cli.cmd(&["watch", "--device", "cli-w1", "--from", from, "--count", "2"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let replay: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(replay.iter().map(|e| e["data"]["body"]["tags"]["v"].clone()).collect::<Vec<_>>(), [json!(2), json!(3)]);
    s.assert_no_panics_in_log();
}

#[tokio::test]
async fn credentials_come_from_flags_environment_or_profiles_and_bad_ones_are_explained() {
    let (s, cli) = start();
    // A profile file, with the CA path relative to it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(cli.ca(), dir.path().join("ca.pem")).unwrap();
    let profiles = dir.path().join("profiles.json");
    std::fs::write(
        &profiles,
        json!({"lab": {"connectionString": s.connection_string, "caFile": "ca.pem"}}).to_string(),
    )
    .unwrap();
    let with_profiles = |args: &[&str]| {
        let mut c = Command::new(bin_path());
        c.args(args)
            .env("TWINHUB_PROFILES", &profiles)
            .env_remove("TWINHUB_CONNECTION_STRING")
            .env_remove("TWINHUB_CA_FILE")
            .env_remove("TWINHUB_PROFILE");
        c.output().unwrap()
    };
    let out = with_profiles(&["device", "create", "cli-p1", "--profile", "lab"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = with_profiles(&["device", "show", "cli-p1", "--profile", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no profile 'nope'"));
    let out = with_profiles(&["device", "show", "cli-p1"]);
    assert_eq!(out.status.code(), Some(2), "no default profile and no connection string");
    assert!(String::from_utf8_lossy(&out.stderr).contains("which hub?"));

    // Flags override the environment.
    let out = cli.ok(&["device", "show", "cli-p1", "--connection-string", &s.connection_string, "--ca-file", cli.ca()]);
    assert!(out.contains("cli-p1"));

    // A read-only policy reads but cannot write: the hub says why (exit 1).
    let ro = format!(
        "HostName={};SharedAccessKeyName=registryRead;SharedAccessKey={}",
        s.host_name,
        s.policy_key("registryRead")
    );
    cli.ok(&["device", "show", "cli-p1", "--connection-string", &ro]);
    let err = cli.fails(1, &["device", "delete", "cli-p1", "--connection-string", &ro]);
    assert!(err.contains("Unauthorized") && err.contains("401"), "{err}");

    let wrong_key =
        format!("HostName={};SharedAccessKeyName=iothubowner;SharedAccessKey={}", s.host_name, "QUJD".repeat(11));
    let err = cli.fails(1, &["device", "show", "cli-p1", "--connection-string", &wrong_key]);
    assert!(err.contains("401"), "{err}");
    let err = cli.fails(
        2,
        &["device", "show", "cli-p1", "--connection-string", "HostName=localhost;DeviceId=d;SharedAccessKey=QUJD"],
    );
    assert!(err.contains("device connection string"), "{err}");
    let err = cli.fails(2, &["device", "show", "cli-p1", "--ca-file", "/etc/hostname"]);
    assert!(err.contains("PEM"), "{err}");
    // Nothing listens there: exit 3.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let err = cli.fails(
        3,
        &[
            "device",
            "show",
            "cli-p1",
            "--connection-string",
            &format!("HostName=127.0.0.1:{free};SharedAccessKeyName=iothubowner;SharedAccessKey=QUJD"),
        ],
    );
    assert!(err.contains("connecting"), "{err}");
    // The wrong CA: the TLS handshake fails, exit 3.
    let other = tempfile::tempdir().unwrap();
    let other_ca = write_foreign_ca(other.path());
    let err = cli.fails(3, &["device", "show", "cli-p1", "--ca-file", other_ca.to_str().unwrap()]);
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    s.assert_no_panics_in_log();
}

/// The CA of another (never started) hub: what a client pointed at the wrong cluster would trust.
fn write_foreign_ca(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    let out = Command::new(bin_path())
        .args([
            "serve",
            "--data-dir",
            data.to_str().unwrap(),
            "--http-listen",
            "127.0.0.1:0",
            "--mqtt-listen",
            "127.0.0.1:0",
            "--events-listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .and_then(|mut c| {
            let mut line = String::new();
            BufReader::new(c.stdout.take().unwrap()).read_line(&mut line)?;
            c.kill()?;
            c.wait()
        });
    out.expect("start a second hub for its CA");
    data.join("tls/ca.pem")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_status_asks_remote_nodes_with_a_connection_string() {
    let c = Cluster::up(3, 4);
    let n1 = c.node(1);
    let cs = format!(
        "HostName=localhost:{};SharedAccessKeyName=iothubowner;SharedAccessKey={}",
        n1.http.port(),
        c.owner_key
    );
    let cli = Cli::for_hub(&cs, &c.ca_pem);
    let others: Vec<String> = [2u64, 3].iter().map(|id| format!("localhost:{}", c.node(*id).http.port())).collect();
    let report =
        cli.ok_json(&["cluster", "status", "--json", "--node-address", &others[0], "--node-address", &others[1]]);
    let nodes = report["nodes"].as_array().unwrap();
    let mut ids: Vec<u64> = nodes.iter().map(|n| n["id"].as_u64().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, [1, 2, 3], "{report}");
    assert!(nodes.iter().all(|n| n["reachable"] == true && n["ready"] == true), "{report}");
    let shards = report["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 4, "{report}");
    for s in shards {
        assert!(s["leader"].as_u64().is_some_and(|l| (1..=3).contains(&l)), "{s}");
        assert_eq!(s["replicas"].as_array().map(Vec::len), Some(3), "{s}");
        assert!(s["lag"].is_object(), "the leader's view, with lag: {s}");
    }
    // The table form, and a node that does not answer is shown as such (not a failure of the rest).
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out =
        cli.run(&["cluster", "status", "--node-address", &others[0], "--node-address", &format!("127.0.0.1:{free}")]);
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.lines().next().unwrap().starts_with("node"), "{table}");
    assert!(table.lines().filter(|l| l.contains("false")).count() >= 1, "the dead address shows unreachable: {table}");
    assert!(String::from_utf8_lossy(&out.stderr).contains(&free.to_string()));
    c.assert_no_panics();
}

/// `twinhub chaos` and `twinhub bench` are separate programs the `twinhub` command hands over to: their
/// own options reach them unchanged, the tool learns which `twinhub` started it, and a missing
/// companion is named with the command that builds it.
#[test]
fn chaos_and_bench_run_their_companion_programs() {
    let bin = bin_path();
    // Both companions are built beside the server by `cargo build` of the workspace.
    twinhub_testkit::companion("twinhub-chaos");
    twinhub_testkit::companion("twinhub-bench");
    let help = |args: &[&str]| {
        let out = Command::new(&bin).args(args).output().unwrap();
        assert!(out.status.success(), "twinhub {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let chaos = help(&["chaos", "--help"]);
    assert!(chaos.contains("--profile") && chaos.contains("--background-twins"), "{chaos}");
    let bench = help(&["bench", "--help"]);
    assert!(bench.contains("compare") && bench.contains("latency-sweep"), "{bench}");
    // A bad option is the companion's to refuse, with clap's usage error (exit 2).
    let out = Command::new(&bin).args(["bench", "compare", "--no-such-flag"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The server alone in a directory: the hand-over fails with a clear error, nothing else runs.
    let dir = tempfile::tempdir().unwrap();
    let lone = dir.path().join("twinhub");
    std::fs::copy(&bin, &lone).unwrap();
    let out = Command::new(&lone).args(["bench", "--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("twinhub-bench is not installed beside") && err.contains("cargo build -p twinhub-bench"),
        "{err}"
    );
}

/// The scheduling policy (`/proc/<pid>/task/<tid>/stat`, field 41) of every thread of a process,
/// with the thread's name.
fn thread_policies(pid: u32) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the node's threads") {
        let Ok(stat) = std::fs::read_to_string(task.expect("task").path().join("stat")) else { continue };
        let (head, rest) = stat.rsplit_once(')').expect("stat has the name in parentheses");
        let name = head.split_once('(').map(|(_, n)| n.to_string()).unwrap_or_default();
        // Fields after the name start at field 3, so field 41 is the 39th.
        let policy = rest.split_whitespace().nth(38).and_then(|p| p.parse().ok()).expect("policy field");
        out.push((name, policy));
    }
    out
}

/// Every thread of a node runs in the class it was started with: with `--cpu-scheduling batch`
/// `SCHED_BATCH` (3), including the threads the runtime, storage and event broker start later; by
/// default the class the node was launched in, here the test's own.
#[cfg(target_os = "linux")]
#[test]
fn node_threads_run_in_the_configured_scheduling_class() {
    const SCHED_BATCH: u32 = 3;
    let srv =
        Server::start(ServerOpts { extra_args: vec!["--cpu-scheduling".into(), "batch".into()], ..Default::default() });
    let threads = thread_policies(srv.pid());
    assert!(threads.len() > 4, "runtime, storage and broker threads: {threads:?}");
    assert!(threads.iter().any(|(n, _)| n == "raft-group-comm"), "{threads:?}");
    assert!(threads.iter().all(|&(_, p)| p == SCHED_BATCH), "every thread in SCHED_BATCH: {threads:?}");
    drop(srv);

    let own = thread_policies(std::process::id())[0].1;
    let srv = Server::start_default();
    let threads = thread_policies(srv.pid());
    assert!(threads.iter().all(|&(_, p)| p == own), "the launcher's class ({own}) kept: {threads:?}");
    drop(srv);

    // An unknown class is refused before anything starts, by name.
    let out = Command::new(bin_path())
        .args(["serve", "--cpu-scheduling", "fifo"])
        .env("TWINHUB_DATA_DIR", tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cpu-scheduling") && err.contains("fifo"), "{err}");
}
