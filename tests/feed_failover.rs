//! The change feed through failures, from a node that holds no replica of the twin's shard: on a
//! 5-node cluster (3 replicas per shard) a consumer follows one twin with `twinhub watch` on a node
//! outside the shard while a writer patches it; the shard's leader is SIGKILLed and later restarted
//! (a replica that comes back with nothing in its event ring). Every acknowledged version must reach
//! the consumer — as an event (alone or merged with others: an event carrying `merged = m` changes
//! covers the m versions up to its own), or be covered by an explicit `resync` (after which the
//! consumer re-reads the twin, as a real one would) — and the versions it sees never go back.

use twinhub_testkit as common;

use std::collections::HashSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::cluster::*;
use common::*;
use serde_json::{json, Value};

const SHARDS: u32 = 4;
const WAIT: Duration = Duration::from_secs(120);

/// What the consumer has been shown: versions covered by events, and resyncs.
#[derive(Default)]
struct Seen {
    /// `(first, last)` version ranges covered: an event of version v carrying m changes covers
    /// `v - m + 1 ..= v`; a resync followed by a re-read at version r covers everything up to r.
    covered: Vec<(i64, i64)>,
    last_version: i64,
    events: usize,
    resyncs: usize,
    went_back: Vec<String>,
}

impl Seen {
    fn covers(&self, v: i64) -> bool {
        self.covered.iter().any(|(a, b)| *a <= v && v <= *b)
    }
}

async fn take(item: Value, seen: &mut Seen, reread: &Api, dev: &str) {
    match item["event"].as_str() {
        Some("twinChangeEvents") => {
            let v = item["data"]["body"]["version"]
                .as_i64()
                .unwrap_or_else(|| panic!("an event without a version: {item}"));
            let m = item["data"]["merged"].as_i64().unwrap_or(1).max(1);
            if v < seen.last_version {
                seen.went_back.push(format!("version {v} after {}", seen.last_version));
            }
            seen.last_version = seen.last_version.max(v);
            seen.covered.push((v - m + 1, v));
            seen.events += 1;
        }
        Some("resync") => {
            // What a consumer does on a resync: re-read the twin it follows.
            let r = twin_version(&reread.must_get_twin(dev).await);
            seen.covered.push((0, r));
            seen.last_version = seen.last_version.max(r);
            seen.resyncs += 1;
            eprintln!("resync: {} — re-read at version {r}", item["data"]);
        }
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_on_a_node_outside_the_shard_misses_no_acknowledged_change_through_a_leader_kill_and_restart() {
    let mut c = Cluster::up(5, SHARDS);
    c.wait_converged(WAIT).await;
    c.settle_leadership().await;
    let ids = c.ids();
    let shard = 0;
    let replicas = c.target_replicas(shard).await;
    let outsider = *ids.iter().find(|id| !replicas.contains(id)).expect("a node outside the shard");
    let (leader, _) = c.settled_leader(shard, &ids, Duration::ZERO).await;
    let writer_node = *ids.iter().find(|id| **id != outsider && **id != leader).expect("a writer node");
    eprintln!(
        "shard {shard}: replicas {replicas:?}, leader {leader}; consumer on {outsider}, writes through {writer_node}"
    );

    let dev = device_on_shard("feed-", shard, SHARDS, &mut HashSet::new());
    let api_out = c.api(outsider);
    api_out.must_create_device(&dev).await;

    // The consumer: `twinhub watch` against the outsider, a real client that resumes by position.
    let ca = c.dir.join("shared/tls/ca.pem");
    let cs = format!(
        "HostName=localhost:{};SharedAccessKeyName=iothubowner;SharedAccessKey={}",
        c.node(outsider).http.port(),
        c.owner_key
    );
    let watch = JsonLines::spawn(
        twinhub_cmd()
            .args(["watch", "--device", &dev, "--connection-string", &cs, "--ca-file"])
            .arg(&ca)
            .env("TWINHUB_PROFILES", "/nonexistent")
            .stderr(Stdio::inherit()),
    );
    let writer = c.api_with_timeout(writer_node, Duration::from_secs(5));
    let mut seen = Seen::default();
    // The feed shows what happens after it opened: write until the first event arrives.
    let mut acked: Vec<i64> = Vec::new();
    let mut n = 0;
    loop {
        n += 1;
        let t = writer.must_patch_twin(&dev, &json!({"tags": {"n": n}})).await;
        acked.push(twin_version(&t));
        if let Some(first) = watch.next(Duration::from_millis(300)) {
            take(first, &mut seen, &api_out, &dev).await;
            break;
        }
        assert!(n < 100, "the consumer never saw an event");
    }
    // Versions acknowledged before the consumer's first event are not its business.
    let from = seen.covered.first().map(|(a, _)| *a).unwrap_or(0);
    acked.retain(|v| *v >= from);

    // Writes (retried through failures: a write that fails may still have applied, so only the
    // acknowledged ones count), the leader killed in the middle and restarted later.
    let started = Instant::now();
    for phase in 0..3 {
        match phase {
            1 => {
                eprintln!("SIGKILL node {leader} (leader of shard {shard})");
                c.kill9(leader);
            }
            2 => {
                c.restart(leader);
                c.wait_ready(leader).await;
                eprintln!("node {leader} back");
            }
            _ => {}
        }
        for _ in 0..40 {
            n += 1;
            match writer.try_send("PATCH", &format!("/twins/{dev}"), Some(&json!({"tags": {"n": n}})), &[]).await {
                Ok(r) if r.status == 200 => acked.push(twin_version(r.json.as_ref().expect("twin JSON"))),
                Ok(r) => eprintln!("write {n}: {} (retrying the next)", r.status),
                Err(e) => eprintln!("write {n}: {e} (retrying the next)"),
            }
            while let Some(item) = watch.next(Duration::ZERO) {
                take(item, &mut seen, &api_out, &dev).await;
            }
        }
    }
    let last = *acked.last().expect("acknowledged writes");
    // Drain: everything acknowledged must arrive (or be resynced) within the deadline.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !acked.iter().all(|v| seen.covers(*v)) && Instant::now() < deadline {
        if let Some(item) = watch.next(Duration::from_millis(500)) {
            take(item, &mut seen, &api_out, &dev).await;
        }
    }
    let missing: Vec<i64> = acked.iter().copied().filter(|v| !seen.covers(*v)).collect();
    eprintln!(
        "{} acknowledged versions up to {last} in {:.1?}; the consumer saw {} events and {} resyncs",
        acked.len(),
        started.elapsed(),
        seen.events,
        seen.resyncs
    );
    assert!(seen.went_back.is_empty(), "versions went back on the feed: {:?}", seen.went_back);
    assert!(missing.is_empty(), "acknowledged versions never shown nor resynced: {missing:?}");
    c.assert_no_panics();
}
