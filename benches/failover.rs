//! Failover: how long a shard cannot take writes after its leader is SIGKILLed.
//!
//! Starts a 3-node cluster with `twinhub cluster up` (the binary cargo built for this bench, i.e. the
//! release profile), then for each round: writers PATCH twins of shard X through the nodes that do not
//! lead X (2 s per-request timeout, retry at once on any error), X's leader is SIGKILLed, and the bench
//! measures
//!
//! - **unavailability**: from the kill to the acknowledgement of the first write *sent after* the kill
//!   (a slight over-estimate: it includes that one write's latency);
//! - **gap**: the longest stretch without any acknowledgement around the kill, i.e. from the last
//!   acknowledgement before the outage to the first one after it (whatever write it answers: an answer
//!   already on its way when the leader died does not end the outage).
//!
//! The killed node is restarted from its config, and the next round waits until it is ready and
//! leadership has settled (every shard back on its preferred leader, or leaders unchanged for 5 s).
//! Rounds rotate over the nodes and over the shards each node leads.
//!
//!   cargo bench --bench failover
//!
//! Environment: `FAILOVER_ROUNDS` (5), `FAILOVER_SHARDS` (the server's default, 3), `FAILOVER_WRITERS` (4, one twin each),
//! `FAILOVER_HEARTBEAT_MS` (the nodes' `--raft-heartbeat-ms`; default: the node default, 100),
//! `FAILOVER_KEEP=1` keeps the cluster directory (node logs; `killed_unix_ms` in the JSON finds each
//! kill in them).
//! Progress on stderr; results on stdout and in `target/failover.json`. Asserts nothing about numbers.

use twinhub_testkit as common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use serde_json::json;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// A round whose writes do not resume within this is reported as failed.
const RESUME_LIMIT: Duration = Duration::from_secs(60);
const SETTLE_LIMIT: Duration = Duration::from_secs(120);

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{name}: not a number: {v}")),
        Err(_) => default,
    }
}

/// Waits until leadership settled (every node ready, leaders on their preferred nodes or stable), and
/// returns shard → (leader, term).
async fn settle(c: &Cluster) -> BTreeMap<u64, (u64, u64)> {
    let ids = c.ids();
    let started = Instant::now();
    loop {
        for id in &ids {
            c.wait_ready(*id).await;
        }
        c.settle_leadership().await;
        if let Some(l) = c.leaders(&ids).await {
            return l.into_iter().map(|(s, v)| (u64::from(s), v)).collect();
        }
        assert!(
            started.elapsed() < SETTLE_LIMIT,
            "the cluster did not settle within {SETTLE_LIMIT:?} (logs under {})",
            c.dir.display()
        );
    }
}

// ---------------------------------------------------------------------------------------------------
// The bench

#[derive(Clone, Copy)]
struct Write {
    sent: Instant,
    acked: Instant,
}

struct Round {
    round: usize,
    shard: u64,
    victim: u64,
    new_leader: Option<u64>,
    /// Kill → ack of the first write sent after the kill.
    unavailable_ms: Option<f64>,
    /// Longest time between two consecutive acks, from before the kill to the recovery.
    gap_ms: Option<f64>,
    /// Kill → first ack of any write (including ones in flight at the kill).
    first_any_ms: Option<f64>,
    acks_before: usize,
    errors: usize,
    /// Wall clock of the kill, to find it in the node logs.
    killed_unix_ms: u128,
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        println!("failover: run with `cargo bench --bench failover` (nothing to do in test mode)");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    rt.block_on(run());
}

async fn run() {
    let rounds = env_u64("FAILOVER_ROUNDS", 5) as usize;
    let shards = env_u64("FAILOVER_SHARDS", u64::from(twinhub::ids::DEFAULT_SHARD_COUNT)) as u32;
    let writers = env_u64("FAILOVER_WRITERS", 4).max(1) as usize;
    println!("failover bench: 3 nodes, {shards} shards, {rounds} rounds, {writers} writers (one twin each) through the non-leader nodes, {REQUEST_TIMEOUT:?} request timeout");
    let extra: Vec<String> = match std::env::var("FAILOVER_HEARTBEAT_MS") {
        Ok(hb) => vec!["--raft-heartbeat-ms".into(), hb],
        Err(_) => Vec::new(),
    };
    let mut c = Cluster::up_with(3, shards, &extra);
    eprintln!("cluster up in {}", c.dir.display());
    let ids = c.ids();

    // `writers` twins on every shard.
    let mut twins: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for i in 0.. {
        let id = format!("fail{i}");
        let s = u64::from(twinhub::ids::shard_of(&id, shards));
        let list = twins.entry(s).or_default();
        if list.len() < writers {
            list.push(id);
        }
        if twins.len() == shards as usize && twins.values().all(|l| l.len() == writers) {
            break;
        }
    }
    let api1 = c.api_with_timeout(1, Duration::from_secs(30));
    for id in twins.values().flatten() {
        api1.must_create_device(id).await;
    }
    eprintln!("created {} twins", twins.values().map(Vec::len).sum::<usize>());

    let mut results: Vec<Round> = Vec::new();
    for round in 0..rounds {
        let leaders = settle(&c).await;
        // Rotate the victim over the nodes, and the shard over those the victim leads.
        let want = ids[round % ids.len()];
        let led: Vec<u64> = leaders.iter().filter(|(_, (l, _))| *l == want).map(|(s, _)| *s).collect();
        let (shard, victim) = if led.is_empty() {
            let s = (round as u64) % u64::from(shards);
            (s, leaders[&s].0)
        } else {
            (led[(round / ids.len()) % led.len()], want)
        };
        let via: Vec<u64> = ids.iter().copied().filter(|id| *id != victim).collect();

        let stop = Arc::new(AtomicBool::new(false));
        let log: Arc<Mutex<Vec<Write>>> = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(0usize));
        let mut tasks = Vec::new();
        for (w, twin) in twins[&shard].iter().enumerate() {
            let api = c.api_with_timeout(via[w % via.len()], REQUEST_TIMEOUT);
            let (stop, log, errors, twin) = (stop.clone(), log.clone(), errors.clone(), twin.clone());
            tasks.push(tokio::spawn(async move {
                let mut i: u64 = 0;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let body = serde_json::to_vec(&json!({"properties": {"desired": {"i": i}}})).unwrap();
                    let sent = Instant::now();
                    match api.try_send_raw("PATCH", &format!("/twins/{twin}"), Some(body), &[]).await {
                        Ok(r) if r.status == 200 => log.lock().unwrap().push(Write { sent, acked: Instant::now() }),
                        _ => *errors.lock().unwrap() += 1,
                    }
                }
            }));
        }
        // Warm up: writes flowing.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let acks_before = log.lock().unwrap().len();
        if acks_before == 0 {
            eprintln!("round {round}: no write acknowledged during the warm-up");
        }
        let killed = Instant::now();
        c.kill9(victim);
        let killed_unix_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
        eprintln!(
            "round {round}: killed node {victim}, leader of shard {shard} (term {}), writing through {via:?}",
            leaders[&shard].1
        );

        // Until a write sent after the kill is acknowledged (or the limit).
        let resumed = loop {
            if log.lock().unwrap().iter().any(|w| w.sent >= killed) {
                break true;
            }
            if killed.elapsed() > RESUME_LIMIT {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = t.await;
        }
        let writes = log.lock().unwrap().clone();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let unavailable_ms = writes.iter().filter(|w| w.sent >= killed).map(|w| w.acked).min().map(|a| ms(a - killed));
        let first_after = writes.iter().filter(|w| w.acked > killed).map(|w| w.acked).min();
        let first_any_ms = first_after.map(|a| ms(a - killed));
        let recovered = writes.iter().filter(|w| w.sent >= killed).map(|w| w.acked).min();
        let mut acked: Vec<Instant> = writes.iter().map(|w| w.acked).collect();
        acked.sort();
        let gap_ms = recovered.and_then(|rec| {
            acked.windows(2).filter(|p| p[1] > killed && p[0] < rec).map(|p| ms(p[1] - p[0])).max_by(f64::total_cmp)
        });
        let new_leader = c.leaders(&via).await.and_then(|l| l.get(&(shard as u32)).map(|(n, _)| *n));
        let r = Round {
            round,
            shard,
            victim,
            new_leader,
            unavailable_ms,
            gap_ms,
            first_any_ms,
            acks_before,
            errors: *errors.lock().unwrap(),
            killed_unix_ms,
        };
        let f = |v: Option<f64>| v.map(|v| format!("{v:.0} ms")).unwrap_or_else(|| "—".into());
        println!(
            "round {round}: shard {shard:>2}, killed leader {victim} → new leader {}: unavailable {} | longest ack gap {} | first answer after the kill {} | {} errors{}",
            new_leader.map(|n| n.to_string()).unwrap_or_else(|| "?".into()),
            f(r.unavailable_ms),
            f(r.gap_ms),
            f(r.first_any_ms),
            r.errors,
            if resumed { String::new() } else { format!(" | writes did NOT resume within {RESUME_LIMIT:?}") }
        );
        results.push(r);

        c.restart(victim);
        eprintln!("round {round}: restarted node {victim}; waiting for the cluster to settle");
    }
    settle(&c).await;

    let mut un: Vec<f64> = results.iter().filter_map(|r| r.unavailable_ms).collect();
    let mut gap: Vec<f64> = results.iter().filter_map(|r| r.gap_ms).collect();
    un.sort_by(f64::total_cmp);
    gap.sort_by(f64::total_cmp);
    let failed = results.iter().filter(|r| r.unavailable_ms.is_none()).count();
    println!();
    println!(
        "write unavailability after SIGKILL of a shard leader, {} rounds ({failed} without recovery):",
        results.len()
    );
    println!(
        "  kill → first ack          p50 {:.0} ms | p99 {:.0} ms | max {:.0} ms",
        percentile(&un, 0.5),
        percentile(&un, 0.99),
        un.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "  longest ack gap           p50 {:.0} ms | p99 {:.0} ms | max {:.0} ms",
        percentile(&gap, 0.5),
        percentile(&gap, 0.99),
        gap.last().copied().unwrap_or(f64::NAN)
    );
    println!("  (etcd 3.4, 3 members on this kind of machine: 1.5–2.1 s; target under 500 ms)");

    let report = json!({
        "bench": "failover",
        "nodes": 3,
        "shards": shards,
        "writers": writers,
        "request_timeout_ms": REQUEST_TIMEOUT.as_millis() as u64,
        "rounds": results.iter().map(|r| json!({
            "round": r.round, "shard": r.shard, "killed": r.victim, "new_leader": r.new_leader,
            "unavailable_ms": r.unavailable_ms, "gap_ms": r.gap_ms, "first_any_ms": r.first_any_ms,
            "acks_before_kill": r.acks_before, "errors": r.errors, "killed_unix_ms": r.killed_unix_ms,
        })).collect::<Vec<_>>(),
        "unavailable_ms": {"p50": percentile(&un, 0.5), "p99": percentile(&un, 0.99), "max": un.last()},
        "gap_ms": {"p50": percentile(&gap, 0.5), "p99": percentile(&gap, 0.99), "max": gap.last()},
        "failed_rounds": failed,
    });
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target").join("failover.json");
    match std::fs::write(&out, serde_json::to_vec_pretty(&report).unwrap()) {
        Ok(()) => println!("written {}", out.display()),
        Err(e) => eprintln!("cannot write {}: {e}", out.display()),
    }
    if std::env::var("FAILOVER_KEEP").is_ok_and(|v| v == "1") {
        if let Some(root) = c.root.take() {
            eprintln!("cluster directory kept: {}", root.keep().display());
        }
    }
    drop(c);
}
