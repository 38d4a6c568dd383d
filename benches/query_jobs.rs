//! Query and jobs at scale on a 3-node cluster: a tags `WHERE` query over many twins (default 1M) and a
//! `scheduleUpdateTwin` job updating a large part of them (default 100k).
//!
//! Starts a 3-node cluster with `twinhub cluster up` (the binary cargo built for this bench, i.e. the
//! release profile), then:
//!
//! 1. **Load**: creates `QJ_TWINS` devices `qj0000000…` through the bulk registry call (`POST /devices`,
//!    100 per call), each with its tags
//!    `{"building": i % 100, "battery": (i / 100) % 50, "jobgroup": i < QJ_JOB_TWINS}`, with `QJ_CLIENTS`
//!    concurrent calls spread over the 3 nodes. Failed calls are retried (up to 8 attempts) and counted.
//!    (`battery` is `(i / 100) % 50`, not `i % 50`: with `i % 50`, `building = 43` would imply
//!    `battery = 43` and the query below would match nothing.)
//! 2. **Query**: `SELECT * FROM devices WHERE tags.building = 43 AND tags.battery < 20` with
//!    `x-ms-max-item-count: 1000`, following `x-ms-continuation` to the end, 3 times (through nodes 1,
//!    2, 3): time to first page, total time, rows, pages, rows/s. Then
//!    `SELECT COUNT() AS n FROM devices WHERE tags.battery < 20` 3 times. Row sets and the count are
//!    checked against the tag formula: a wrong answer exits non-zero.
//! 3. **Job**: `PUT /jobs/v2/qjob` updating desired `fw` on `tags.jobgroup = true`, polled every second
//!    until `completed`: time from the PUT to completion, devices/s (the runner throttles itself to 500
//!    devices/s by design, so 100k takes at least 200 s). Meanwhile the tags query (to its last page)
//!    and the count run through each node in turn, a pause of `QJ_BESIDE_PAUSE_MS` (1000) after each
//!    pair, each answer checked, their latencies printed. With 0 they run back to back and take all
//!    the CPU the job leaves, so the job falls below its throttle on this 2-core machine. Checks deviceCount = succeededCount =
//!    `QJ_JOB_TWINS`, and that 100 random matching twins got `fw = "2.0"` exactly once (desired
//!    `$version` one above what it was before the job) and 20 non-matching ones did not.
//! 4. **Memory**: VmRSS (and VmHWM) of every node after loading, after the queries and after the job,
//!    in MiB and bytes per twin (on 3 nodes every node replicates every shard, i.e. holds all twins),
//!    plus every node's data directory size on disk. RSS is also sampled every 10 s during the load.
//!
//!   QJ_TWINS=20000 QJ_JOB_TWINS=2000 cargo bench --bench query_jobs      # quick run
//!   cargo bench --bench query_jobs                                       # 1M twins, 100k job
//!
//! Environment: `QJ_TWINS` (1000000), `QJ_JOB_TWINS` (100000, at most `QJ_TWINS`), `QJ_SHARDS` (the server's default, 3),
//! `QJ_CLIENTS` (64), `QJ_BESIDE_PAUSE_MS` (1000), `QJ_KEEP=1` keeps the cluster directory (node logs).
//! Progress on stderr; results on stdout and in `target/query_jobs.json`. Asserts nothing about
//! speed; exits non-zero on a wrong answer.

use twinhub_testkit as common;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::*;
use common::*;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::{json, Value};

const QUERY: &str = "SELECT * FROM devices WHERE tags.building = 43 AND tags.battery < 20";
const COUNT_QUERY: &str = "SELECT COUNT() AS n FROM devices WHERE tags.battery < 20";
const PAGE: &str = "1000";
const REPEATS: usize = 3;
const LOAD_ATTEMPTS: u32 = 8;
const JOB_ID: &str = "qjob";
const JOB_LIMIT: Duration = Duration::from_secs(3600 + 120);

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.trim().replace('_', "").parse().unwrap_or_else(|_| panic!("{name}: not a number: {v}")),
        Err(_) => default,
    }
}

/// Devices per bulk registry call while loading (IoT Hub's maximum).
const BULK: u64 = 100;

fn device_id(i: u64) -> String {
    format!("qj{i:07}")
}

fn building(i: u64) -> u64 {
    i % 100
}

fn battery(i: u64) -> u64 {
    (i / 100) % 50
}

fn tags(i: u64, job_twins: u64) -> Value {
    json!({"tags": {"building": building(i), "battery": battery(i), "jobgroup": i < job_twins}})
}

/// Prints a wrong answer loudly and exits non-zero (after stopping the cluster).
fn wrong(mut c: Cluster, what: String) -> ! {
    eprintln!("\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
    eprintln!("!!! query_jobs: WRONG ANSWER: {what}");
    eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n");
    println!("WRONG ANSWER: {what}");
    eprintln!("{}", c.logs_tail());
    if let Some(root) = c.root.take() {
        eprintln!("cluster directory kept for inspection: {}", root.keep().display());
    }
    // `exit` runs no destructors: stop the nodes first.
    drop(c);
    std::process::exit(2);
}

// ---------------------------------------------------------------------------------------------------
// Memory and disk

fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn dir_bytes(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else { return 0 };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Per node: VmRSS, VmHWM, data directory size; as JSON and a printable line.
fn memory(c: &Cluster, twins: u64, data_dirs: &BTreeMap<u64, PathBuf>) -> (Value, String) {
    let mib = |kib: u64| kib as f64 / 1024.0;
    let mut nodes = Vec::new();
    let mut line = String::new();
    for n in &c.nodes {
        let rss = proc_status_kib(n.pid, "VmRSS:").unwrap_or(0);
        let hwm = proc_status_kib(n.pid, "VmHWM:").unwrap_or(0);
        let disk = data_dirs.get(&n.id).map(|d| dir_bytes(d)).unwrap_or(0);
        let per_twin = if twins > 0 { rss as f64 * 1024.0 / twins as f64 } else { f64::NAN };
        nodes.push(json!({
            "node": n.id, "pid": n.pid, "rss_mib": mib(rss), "hwm_mib": mib(hwm),
            "rss_bytes_per_twin": per_twin, "disk_mib": disk as f64 / 1048576.0,
            "disk_bytes_per_twin": if twins > 0 { disk as f64 / twins as f64 } else { f64::NAN },
        }));
        line.push_str(&format!(
            "\n    node {}: RSS {:.0} MiB (peak {:.0} MiB) = {:.0} B/twin | data dir {:.0} MiB = {:.0} B/twin",
            n.id,
            mib(rss),
            mib(hwm),
            per_twin,
            disk as f64 / 1048576.0,
            disk as f64 / twins.max(1) as f64
        ));
    }
    (Value::Array(nodes), line)
}

fn rss_sum_mib(c: &Cluster) -> f64 {
    c.nodes.iter().map(|n| proc_status_kib(n.pid, "VmRSS:").unwrap_or(0)).sum::<u64>() as f64 / 1024.0
}

fn all_alive(c: &Cluster) -> Option<u64> {
    c.nodes.iter().find(|n| !pid_alive(n.pid)).map(|n| n.id)
}

// ---------------------------------------------------------------------------------------------------
// Load

#[derive(Default)]
struct LoadErrors {
    /// "PUT 503", "PATCH transport", … → count (failed attempts that were retried).
    by_kind: BTreeMap<String, u64>,
    /// Twins that could not be loaded after every attempt.
    gave_up: Vec<String>,
}

/// Sends with retries; `ok` decides which statuses count as success (given the attempt number).
async fn with_retries(
    api: &Api,
    method: &str,
    path: &str,
    body: &Value,
    errors: &Mutex<LoadErrors>,
    ok: impl Fn(&Resp, u32) -> bool,
) -> Result<(), String> {
    let raw = serde_json::to_vec(body).unwrap();
    let mut last = String::new();
    for attempt in 0..LOAD_ATTEMPTS {
        let (kind, detail) = match api.try_send_raw(method, path, Some(raw.clone()), &[]).await {
            Ok(r) if ok(&r, attempt) => return Ok(()),
            Ok(r) => (format!("{method} {}", r.status), r.text.chars().take(300).collect::<String>()),
            Err(e) => (format!("{method} transport"), format!("{e}")),
        };
        last = format!("{kind}: {detail}");
        *errors.lock().unwrap().by_kind.entry(kind).or_default() += 1;
        tokio::time::sleep(Duration::from_millis(100 * (1 << attempt.min(5)))).await;
    }
    Err(format!("{method} {path}: gave up after {LOAD_ATTEMPTS} attempts; last: {last}"))
}

struct LoadResult {
    secs: f64,
    errors: LoadErrors,
    rss_samples: Vec<Value>,
}

async fn load(c: &Cluster, twins: u64, job_twins: u64, clients: usize) -> LoadResult {
    let ids = c.ids();
    let apis: Vec<Api> = ids.iter().map(|id| c.api_with_timeout(*id, Duration::from_secs(30))).collect();
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Mutex::new(LoadErrors::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..clients {
        let api = apis[w % apis.len()].clone();
        let (next, done, errors, stop) = (next.clone(), done.clone(), errors.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                // 100 devices per bulk registry call, created with their tags in one entry.
                let first = next.fetch_add(BULK, Ordering::Relaxed);
                if first >= twins {
                    break;
                }
                let ids = first..(first + BULK).min(twins);
                let entries: Vec<Value> = ids
                    .clone()
                    .map(|i| {
                        json!({"id": device_id(i), "importMode": "create", "status": "enabled",
                               "authentication": {"type": "sas", "symmetricKey": {}},
                               "tags": tags(i, job_twins)["tags"].clone()})
                    })
                    .collect();
                // A retried call may find devices made by an attempt whose answer was lost.
                let only_existing = |r: &Resp| {
                    r.status == 400
                        && r.json()["errors"]
                            .as_array()
                            .is_some_and(|e| !e.is_empty() && e.iter().all(|e| e["errorCode"] == "DeviceAlreadyExists"))
                };
                let res = with_retries(&api, "POST", "/devices", &Value::Array(entries), &errors, |r, a| {
                    r.status == 200 || (a > 0 && only_existing(r))
                })
                .await;
                if let Err(e) = res {
                    eprintln!("load: {e}");
                    let mut er = errors.lock().unwrap();
                    er.gave_up.push(device_id(first));
                    if er.gave_up.len() >= 20 {
                        stop.store(true, Ordering::Relaxed);
                    }
                    continue;
                }
                done.fetch_add(ids.end - ids.start, Ordering::Relaxed);
            }
        }));
    }
    // Progress every second; RSS sample every 10 s.
    let mut rss_samples = Vec::new();
    let mut last = (Instant::now(), 0u64);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let mut seconds = 0u64;
    loop {
        tick.tick().await;
        seconds += 1;
        let n = done.load(Ordering::Relaxed);
        let now = Instant::now();
        let rate_now = (n - last.1) as f64 / (now - last.0).as_secs_f64();
        last = (now, n);
        let el = started.elapsed().as_secs_f64();
        let avg = n as f64 / el;
        let eta = if avg > 0.0 { (twins - n.min(twins)) as f64 / avg } else { f64::INFINITY };
        let errs: u64 = errors.lock().unwrap().by_kind.values().sum();
        let finished = tasks.iter().all(|t| t.is_finished());
        if seconds.is_multiple_of(10) || finished {
            let per_node: Vec<Value> = c
                .nodes
                .iter()
                .map(|nd| json!({"node": nd.id, "rss_mib": proc_status_kib(nd.pid, "VmRSS:").unwrap_or(0) as f64 / 1024.0}))
                .collect();
            rss_samples.push(json!({"t_s": el, "twins": n, "nodes": per_node}));
        }
        eprintln!(
            "load: {n}/{twins} twins ({:.1}%) | {rate_now:.0} twins/s now, {avg:.0} avg | {:.0} s elapsed, ETA {:.0} s | RSS total {:.0} MiB | {errs} retried errors",
            100.0 * n as f64 / twins.max(1) as f64,
            el,
            eta,
            rss_sum_mib(c)
        );
        if let Some(id) = all_alive(c) {
            panic!("node {id} died during the load\n{}", c.logs_tail());
        }
        if finished {
            break;
        }
    }
    for t in tasks {
        t.await.expect("load task");
    }
    let secs = started.elapsed().as_secs_f64();
    let errors = std::mem::take(&mut *errors.lock().unwrap());
    LoadResult { secs, errors, rss_samples }
}

// ---------------------------------------------------------------------------------------------------
// Query

struct QueryRun {
    node: u64,
    first_page_ms: f64,
    total_ms: f64,
    rows: usize,
    pages: usize,
    page_ms: Vec<f64>,
    ids: Vec<String>,
}

async fn run_query(api: &Api, node: u64) -> Result<QueryRun, String> {
    let body = json!({"query": QUERY});
    let started = Instant::now();
    let mut token: Option<String> = None;
    let mut first_page_ms = None;
    let mut page_ms = Vec::new();
    let mut ids = Vec::new();
    let mut pages = 0;
    loop {
        let mut headers: Vec<Hdr> = vec![("x-ms-max-item-count", PAGE)];
        if let Some(t) = &token {
            headers.push(("x-ms-continuation", t.as_str()));
        }
        let t0 = Instant::now();
        let r = api
            .try_send("POST", "/devices/query", Some(&body), &headers)
            .await
            .map_err(|e| format!("page {pages}: transport error: {e}"))?;
        page_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        if r.status != 200 {
            return Err(format!("page {pages}: status {} body {}", r.status, r.text));
        }
        pages += 1;
        first_page_ms.get_or_insert(started.elapsed().as_secs_f64() * 1000.0);
        let rows = r
            .json
            .as_ref()
            .and_then(Value::as_array)
            .ok_or_else(|| format!("page {pages}: not an array: {}", r.text))?;
        for row in rows {
            ids.push(row["deviceId"].as_str().ok_or_else(|| format!("row without deviceId: {row}"))?.to_string());
        }
        match r.headers.get("x-ms-continuation").filter(|t| !t.is_empty()) {
            Some(t) => token = Some(t.clone()),
            None => break,
        }
    }
    Ok(QueryRun {
        node,
        first_page_ms: first_page_ms.unwrap_or(f64::NAN),
        total_ms: started.elapsed().as_secs_f64() * 1000.0,
        rows: ids.len(),
        pages,
        page_ms,
        ids,
    })
}

/// `COUNT_QUERY` through `api`: its time in ms, or what was wrong (status, transport, an answer other
/// than `expected`).
async fn run_count(api: &Api, expected: u64) -> Result<f64, String> {
    let t0 = Instant::now();
    let r = api
        .try_send("POST", "/devices/query", Some(&json!({"query": COUNT_QUERY})), &[])
        .await
        .map_err(|e| format!("transport error {e}"))?;
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    if r.status != 200 {
        return Err(format!("status {} {}", r.status, r.text));
    }
    let n = r.json.as_ref().and_then(|v| v.pointer("/0/n")).and_then(Value::as_u64);
    if n != Some(expected) {
        return Err(format!("answer {}, expected n = {expected}", r.text));
    }
    Ok(ms)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        f64::NAN
    } else {
        s[s.len() / 2]
    }
}

// ---------------------------------------------------------------------------------------------------

/// Leader changes each Raft group has seen so far (`twinhub_shard_leader_changes_total` from every
/// node's `/metrics`; each group's count is the highest any node reports, as every node sees every
/// group with RF 3 on 3 nodes).
async fn leader_changes(c: &Cluster) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for id in c.ids() {
        let http = c.http_client(id, Duration::from_secs(10));
        let url = format!("https://localhost:{}/metrics", c.node(id).http.port());
        let Ok(r) = http.get(url).send().await else { continue };
        let Ok(text) = r.text().await else { continue };
        for line in text.lines().filter(|l| l.starts_with("twinhub_shard_leader_changes_total{")) {
            let shard = line.split("shard=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("?").to_string();
            let n = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) as u64;
            let e = out.entry(shard).or_default();
            *e = (*e).max(n);
        }
    }
    out
}

/// `after - before` per group, and the total.
fn changes_between(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> (u64, BTreeMap<String, u64>) {
    let per: BTreeMap<String, u64> = after
        .iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(before.get(k).copied().unwrap_or(0))))
        .filter(|(_, v)| *v > 0)
        .collect();
    (per.values().sum(), per)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("query_jobs: run with `cargo bench --bench query_jobs` (nothing to do in test mode)");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(run());
}

async fn run() {
    let twins = env_u64("QJ_TWINS", 1_000_000);
    let job_twins = env_u64("QJ_JOB_TWINS", 100_000).min(twins);
    let shards = env_u64("QJ_SHARDS", u64::from(twinhub::ids::DEFAULT_SHARD_COUNT)) as u32;
    let clients = env_u64("QJ_CLIENTS", 64).max(1) as usize;
    println!(
        "query_jobs bench: 3 nodes, {shards} shards | {twins} twins, job over {job_twins} | {clients} loading clients | binary {}",
        env!("CARGO_BIN_EXE_twinhub")
    );
    let t_up = Instant::now();
    let mut c = Cluster::up(3, shards);
    c.settle_leadership().await;
    eprintln!("cluster up and settled in {:.1} s: {}", t_up.elapsed().as_secs_f64(), c.dir.display());
    let data_dirs: BTreeMap<u64, PathBuf> = c.cluster_file()["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| Some((n["id"].as_u64()?, PathBuf::from(n["data_dir"].as_str()?))))
        .collect();
    let (mem_empty, mem_empty_line) = memory(&c, 0, &data_dirs);
    eprintln!("memory of the empty cluster:{mem_empty_line}");

    // The expected answers, from the tag formula.
    let expected_ids: Vec<String> =
        (0..twins).filter(|i| building(*i) == 43 && battery(*i) < 20).map(device_id).collect();
    let expected_count = (0..twins).filter(|i| battery(*i) < 20).count() as u64;

    // ---- Load
    let lc_start = leader_changes(&c).await;
    let ld = load(&c, twins, job_twins, clients).await;
    let load_rate = twins as f64 / ld.secs;
    let retried: u64 = ld.errors.by_kind.values().sum();
    println!(
        "load: {twins} twins ({} requests) in {:.1} s = {load_rate:.0} twins/s ({:.0} requests/s), {retried} failed attempts retried {:?}, {} twins given up",
        2 * twins,
        ld.secs,
        2.0 * load_rate,
        ld.errors.by_kind,
        ld.errors.gave_up.len()
    );
    if !ld.errors.gave_up.is_empty() {
        wrong(
            c,
            format!(
                "{} twins could not be loaded, e.g. {:?}",
                ld.errors.gave_up.len(),
                &ld.errors.gave_up[..ld.errors.gave_up.len().min(5)]
            ),
        );
    }
    let (mem_loaded, line) = memory(&c, twins, &data_dirs);
    println!("memory after loading {twins} twins (every node holds all of them):{line}");

    // ---- Query
    let mut runs = Vec::new();
    for rep in 0..REPEATS {
        let node = c.ids()[rep % c.nodes.len()];
        let api = c.api_with_timeout(node, Duration::from_secs(600));
        let run = match run_query(&api, node).await {
            Ok(r) => r,
            Err(e) => wrong(c, format!("query run {rep} through node {node} failed: {e}")),
        };
        let slowest = run.page_ms.iter().copied().fold(0.0, f64::max);
        println!(
            "query run {rep} (node {node}): first page {:.0} ms | all {} pages {:.0} ms (slowest page {slowest:.0} ms) | {} rows = {:.0} rows/s",
            run.first_page_ms,
            run.pages,
            run.total_ms,
            run.rows,
            run.rows as f64 / (run.total_ms / 1000.0)
        );
        if run.ids != expected_ids {
            let got: HashSet<&String> = run.ids.iter().collect();
            let want: HashSet<&String> = expected_ids.iter().collect();
            let missing: Vec<_> = want.difference(&got).take(5).collect();
            let extra: Vec<_> = got.difference(&want).take(5).collect();
            let sorted = run.ids.windows(2).all(|w| w[0] < w[1]);
            wrong(
                c,
                format!(
                    "query run {rep} through node {node}: {} rows, expected {} (missing e.g. {missing:?}, unexpected e.g. {extra:?}, in strict key order: {sorted})",
                    run.rows,
                    expected_ids.len()
                ),
            );
        }
        runs.push(run);
    }
    let mut count_ms = Vec::new();
    let mut count_nodes = Vec::new();
    for rep in 0..REPEATS {
        let node = c.ids()[rep % c.nodes.len()];
        let api = c.api_with_timeout(node, Duration::from_secs(600));
        let ms = match run_count(&api, expected_count).await {
            Ok(ms) => ms,
            Err(e) => wrong(c, format!("count query through node {node}: {e}")),
        };
        println!("count run {rep} (node {node}): {ms:.0} ms, n = {:?}", Some(expected_count));
        count_ms.push(ms);
        count_nodes.push(node);
    }
    let (mem_queried, line) = memory(&c, twins, &data_dirs);
    println!("memory after the queries:{line}");

    // ---- Job
    let api1 = c.api_with_timeout(1, Duration::from_secs(120));
    // 100 random matching twins and 20 non-matching ones, with their desired $version before the job.
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x9e37_79b9);
    let mut sample: Vec<u64> =
        (0..job_twins).collect::<Vec<_>>().choose_multiple(&mut rng, 100.min(job_twins as usize)).copied().collect();
    let others: Vec<u64> = (job_twins..twins)
        .collect::<Vec<_>>()
        .choose_multiple(&mut rng, 20.min((twins - job_twins) as usize))
        .copied()
        .collect();
    sample.sort();
    let mut before: BTreeMap<u64, Value> = BTreeMap::new();
    for i in sample.iter().chain(others.iter()) {
        before.insert(*i, api1.must_get_twin(&device_id(*i)).await);
    }
    let job = json!({
        "jobId": JOB_ID, "type": "scheduleUpdateTwin", "queryCondition": "tags.jobgroup = true",
        "updateTwin": {"properties": {"desired": {"fw": "2.0"}}}, "maxExecutionTimeInSeconds": 3600
    });
    let lc_before_job = leader_changes(&c).await;
    // Queries run beside the job through each node in turn until it ends: the tags query to its last
    // page, then the count, then a pause of `QJ_BESIDE_PAUSE_MS`. Their answers do not change (the
    // job writes desired `fw`, not tags), so each is checked.
    let beside_pause = Duration::from_millis(env_u64("QJ_BESIDE_PAUSE_MS", 1000));
    let beside_stop = Arc::new(AtomicBool::new(false));
    let beside = {
        let apis: Vec<(u64, Api)> =
            c.ids().into_iter().map(|id| (id, c.api_with_timeout(id, Duration::from_secs(600)))).collect();
        let (stop, expected_ids) = (Arc::clone(&beside_stop), expected_ids.clone());
        tokio::spawn(async move {
            let (mut tags_runs, mut counts, mut wrong_answers) = (Vec::new(), Vec::new(), Vec::new());
            let mut turn = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let (node, api) = &apis[turn % apis.len()];
                turn += 1;
                match run_query(api, *node).await {
                    Ok(run) if run.ids == expected_ids => tags_runs.push((run.first_page_ms, run.total_ms)),
                    Ok(run) => wrong_answers.push(format!("tags query through node {node}: {} rows", run.rows)),
                    Err(e) => wrong_answers.push(format!("tags query through node {node}: {e}")),
                }
                match run_count(api, expected_count).await {
                    Ok(ms) => counts.push(ms),
                    Err(e) => wrong_answers.push(format!("count through node {node}: {e}")),
                }
                tokio::time::sleep(beside_pause).await;
            }
            (tags_runs, counts, wrong_answers)
        })
    };
    let t_put = Instant::now();
    let r = api1.send("PUT", &format!("/jobs/v2/{JOB_ID}"), Some(&job), &[]).await;
    if r.status != 200 {
        wrong(c, format!("PUT /jobs/v2/{JOB_ID}: {} {}", r.status, r.text));
    }
    let put_ms = t_put.elapsed().as_secs_f64() * 1000.0;
    let mut running_s = None;
    let mut counted_s = None;
    let mut polls: Vec<Value> = Vec::new();
    let mut last_poll_err = 0u64;
    let done = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let el = t_put.elapsed().as_secs_f64();
        let j = match api1.try_send("GET", &format!("/jobs/v2/{JOB_ID}"), None, &[]).await {
            Ok(r) if r.status == 200 => r.json().clone(),
            other => {
                last_poll_err += 1;
                eprintln!("job: poll failed ({last_poll_err}): {:?}", other.map(|r| (r.status, r.text)));
                assert!(el < JOB_LIMIT.as_secs_f64(), "job did not finish within {JOB_LIMIT:?}");
                continue;
            }
        };
        let st = j["status"].as_str().unwrap_or("?").to_string();
        let stats = j["deviceJobStatistics"].clone();
        if st != "queued" && running_s.is_none() {
            running_s = Some(el);
        }
        if counted_s.is_none() && stats["deviceCount"].as_u64().unwrap_or(0) > 0 {
            counted_s = Some(el);
        }
        let ok = stats["succeededCount"].as_u64().unwrap_or(0);
        eprintln!(
            "job: {el:>6.1} s {st:<10} {stats} | ≈{:.0} devices/s | RSS total {:.0} MiB",
            ok as f64 / (el - counted_s.unwrap_or(el)).max(1e-9),
            rss_sum_mib(&c)
        );
        polls.push(json!({"t_s": el, "status": st, "stats": stats}));
        if let Some(id) = all_alive(&c) {
            panic!("node {id} died during the job\n{}", c.logs_tail());
        }
        if matches!(st.as_str(), "completed" | "failed" | "cancelled") {
            break j;
        }
        assert!(el < JOB_LIMIT.as_secs_f64(), "job did not finish within {JOB_LIMIT:?}: {j}");
    };
    let job_secs = t_put.elapsed().as_secs_f64();
    beside_stop.store(true, Ordering::Relaxed);
    let (tags_runs, counts, wrong_answers) = match beside.await {
        Ok(r) => r,
        Err(e) => wrong(c, format!("the queries beside the job: {e}")),
    };
    if !wrong_answers.is_empty() {
        wrong(c, format!("queries beside the job answered wrong: {wrong_answers:?}"));
    }
    let beside_firsts: Vec<f64> = tags_runs.iter().map(|r| r.0).collect();
    let beside_totals: Vec<f64> = tags_runs.iter().map(|r| r.1).collect();
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let beside_line = format!(
        "{} tags queries (first page median {:.0} ms, max {:.0}; all pages median {:.0} ms, max {:.0}), {} counts (median {:.0} ms, max {:.0}), {} ms between rounds, all answers right",
        tags_runs.len(),
        median(&beside_firsts),
        max(&beside_firsts),
        median(&beside_totals),
        max(&beside_totals),
        counts.len(),
        median(&counts),
        max(&counts),
        beside_pause.as_millis()
    );
    println!("queries beside the job: {beside_line}");
    let stats = &done["deviceJobStatistics"];
    let job_rate = job_twins as f64 / job_secs;
    println!(
        "job: {} after {job_secs:.1} s (PUT answered in {put_ms:.0} ms, running after ≤{:.1} s, devices counted after ≤{:.1} s) | {stats} | {job_rate:.0} devices/s (runner throttle: 500/s by design)",
        done["status"],
        running_s.unwrap_or(f64::NAN),
        counted_s.unwrap_or(f64::NAN)
    );
    if done["status"] != "completed"
        || stats["deviceCount"].as_u64() != Some(job_twins)
        || stats["succeededCount"].as_u64() != Some(job_twins)
        || stats["failedCount"].as_u64() != Some(0)
    {
        wrong(
            c,
            format!(
                "job: expected completed with deviceCount = succeededCount = {job_twins}, failedCount = 0; got {done}"
            ),
        );
    }
    for i in sample.iter().chain(others.iter()) {
        let id = device_id(*i);
        let t = api1.must_get_twin(&id).await;
        let b = &before[i];
        let (v0, v1) = (desired_version(b), desired_version(&t));
        let hit = *i < job_twins;
        let good = if hit {
            t["properties"]["desired"]["fw"] == "2.0"
                && v1 == v0 + 1
                && v1 == 2
                && twin_version(&t) == twin_version(b) + 1
        } else {
            twin_state(&t) == twin_state(b)
        };
        if !good {
            wrong(
                c,
                format!(
                    "twin {id} ({}): desired $version {v0} → {v1}, version {} → {}, fw {}",
                    if hit { "in the job" } else { "not in the job" },
                    twin_version(b),
                    twin_version(&t),
                    t["properties"]["desired"]["fw"]
                ),
            );
        }
    }
    println!(
        "job: {} matching twins have desired fw \"2.0\" at desired $version 2 (one update), {} others unchanged",
        sample.len(),
        others.len()
    );
    let (mem_job, line) = memory(&c, twins, &data_dirs);
    println!("memory after the job:{line}");
    c.assert_no_panics();

    // ---- Summary
    let totals: Vec<f64> = runs.iter().map(|r| r.total_ms).collect();
    let firsts: Vec<f64> = runs.iter().map(|r| r.first_page_ms).collect();
    let rows = runs[0].rows;
    let pages = runs[0].pages;
    println!();
    println!("=== query_jobs: 3 nodes, {shards} shards, {twins} twins ===");
    println!("  load             {:.1} s = {load_rate:.0} twins/s ({:.0} bulk calls/s of {BULK}, {clients} clients), {retried} retried errors", ld.secs, load_rate / BULK as f64);
    println!(
        "  tags query       {rows} rows in {pages} pages: first page median {:.0} ms {:?} | all pages median {:.0} ms {:?} | {:.0} rows/s",
        median(&firsts),
        firsts.iter().map(|v| v.round()).collect::<Vec<_>>(),
        median(&totals),
        totals.iter().map(|v| v.round()).collect::<Vec<_>>(),
        rows as f64 / (median(&totals) / 1000.0)
    );
    println!(
        "  COUNT() query    n = {expected_count}: median {:.0} ms {:?}",
        median(&count_ms),
        count_ms.iter().map(|v| v.round()).collect::<Vec<_>>()
    );
    println!("  job              {job_twins} devices in {job_secs:.1} s = {job_rate:.0} devices/s (throttled to 500/s by design)");
    let lc_end = leader_changes(&c).await;
    let (lc_job, lc_job_per) = changes_between(&lc_before_job, &lc_end);
    let (lc_all, lc_all_per) = changes_between(&lc_start, &lc_end);
    println!("  beside the job   {beside_line}");
    println!("  leader changes   during the job {lc_job} {lc_job_per:?} | from load to end {lc_all} {lc_all_per:?}");
    for (name, m) in [("RSS after load ", &mem_loaded), ("RSS after job  ", &mem_job)] {
        let parts: Vec<String> = m
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                format!(
                    "node {} {:.0} MiB ({:.0} B/twin)",
                    n["node"],
                    n["rss_mib"].as_f64().unwrap_or(0.0),
                    n["rss_bytes_per_twin"].as_f64().unwrap_or(0.0)
                )
            })
            .collect();
        println!("  {name}  {}", parts.join(" | "));
    }

    let report = json!({
        "bench": "query_jobs",
        "nodes": 3,
        "shards": shards,
        "twins": twins,
        "job_twins": job_twins,
        "clients": clients,
        "tags_formula": {"building": "i % 100", "battery": "(i / 100) % 50", "jobgroup": "i < job_twins"},
        "load": {
            "secs": ld.secs, "twins_per_sec": load_rate, "bulk_calls_per_sec": load_rate / BULK as f64,
            "retried_errors": ld.errors.by_kind, "rss_samples": ld.rss_samples,
        },
        "query": {
            "text": QUERY, "page_size": 1000, "expected_rows": expected_ids.len(),
            "runs": runs.iter().map(|r| json!({
                "node": r.node, "first_page_ms": r.first_page_ms, "total_ms": r.total_ms, "rows": r.rows,
                "pages": r.pages, "rows_per_sec": r.rows as f64 / (r.total_ms / 1000.0), "page_ms": r.page_ms,
            })).collect::<Vec<_>>(),
            "median_first_page_ms": median(&firsts),
            "median_total_ms": median(&totals),
            "median_rows_per_sec": rows as f64 / (median(&totals) / 1000.0),
        },
        "count_query": {"text": COUNT_QUERY, "n": expected_count, "ms": count_ms, "nodes": count_nodes, "median_ms": median(&count_ms)},
        "job": {
            "secs": job_secs, "devices_per_sec": job_rate, "put_ms": put_ms, "running_after_s": running_s,
            "devices_counted_after_s": counted_s, "final": done, "polls": polls, "throttle_per_sec": 500,
        },
        "beside_job": {"tags_first_page_ms": beside_firsts, "tags_total_ms": beside_totals, "count_ms": counts},
        "leader_changes": {"during_job": lc_job, "during_job_per_group": lc_job_per, "load_to_end": lc_all, "load_to_end_per_group": lc_all_per},
        "memory": {"empty": mem_empty, "after_load": mem_loaded, "after_queries": mem_queried, "after_job": mem_job},
    });
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target").join("query_jobs.json");
    match std::fs::write(&out, serde_json::to_vec_pretty(&report).unwrap()) {
        Ok(()) => println!("written {}", out.display()),
        Err(e) => eprintln!("cannot write {}: {e}", out.display()),
    }
    if std::env::var("QJ_KEEP").is_ok_and(|v| v == "1") {
        if let Some(root) = c.root.take() {
            eprintln!("cluster directory kept: {}", root.keep().display());
        }
    }
    drop(c);
}
