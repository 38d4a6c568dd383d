//! Crash test: concurrent writers PATCH a few twins, the server is SIGKILLed mid-stream and restarted
//! from the same data directory, several times. Every acknowledged write must survive, and no twin
//! `version`, desired `$version` or etag may go back or repeat across restarts.

use twinhub_testkit as common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rand::Rng;
use serde_json::{json, Value};

const DEVICES: usize = 4;
const WRITERS: usize = 8;
const ROUNDS: usize = 3;

#[derive(Clone, Debug)]
struct Ack {
    writer: usize,
    device: String,
    seq: u64,
    version: i64,
    desired_version: i64,
    etag: String,
    desired: bool,
}

fn device_of(w: usize) -> String {
    format!("crash{}", w % DEVICES)
}

/// Even writers write desired properties, odd ones tags; each writer owns key `w{w}`.
fn is_desired(w: usize) -> bool {
    w.is_multiple_of(2)
}

fn patch_for(w: usize, seq: u64) -> Value {
    let inner = json!({ format!("w{w}"): { "seq": seq, "pad": "p".repeat(64) } });
    if is_desired(w) {
        json!({"properties": {"desired": inner}})
    } else {
        json!({"tags": inner})
    }
}

/// Runs one writer until `stop` or the first transport error; returns its acks and the last seq it
/// attempted (sent, answer unknown or received).
async fn writer(api: Api, w: usize, mut seq: u64, stop: Arc<AtomicBool>) -> (usize, Vec<Ack>, u64) {
    let dev = device_of(w);
    let mut acks = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        seq += 1;
        let body = serde_json::to_vec(&patch_for(w, seq)).unwrap();
        match api.try_send_raw("PATCH", &format!("/twins/{dev}"), Some(body), &[]).await {
            Ok(r) if r.status == 200 => {
                let t = r.json().clone();
                acks.push(Ack {
                    writer: w,
                    device: dev.clone(),
                    seq,
                    version: twin_version(&t),
                    desired_version: desired_version(&t),
                    etag: etag_of(&t),
                    desired: is_desired(w),
                });
            }
            Ok(r) => panic!("writer {w}: PATCH /twins/{dev} seq {seq} got {} {}", r.status, r.text),
            Err(_) => break, // the server died under us; this write's outcome is unknown
        }
    }
    (w, acks, seq)
}

/// The value of writer `w`'s key in a twin, if present.
fn seq_in(twin: &Value, w: usize) -> Option<u64> {
    let section = if is_desired(w) { &twin["properties"]["desired"] } else { &twin["tags"] };
    section.get(format!("w{w}")).and_then(|v| v["seq"].as_u64())
}

struct History {
    /// Every ack of every round.
    acks: Vec<Ack>,
    /// Highest acknowledged seq per writer.
    last_acked: HashMap<usize, u64>,
    /// Highest attempted seq per writer.
    last_attempted: HashMap<usize, u64>,
}

async fn verify(srv: &Server, h: &History, when: &str) -> BTreeMap<String, Value> {
    let api = srv.owner();
    let mut twins = BTreeMap::new();
    for d in 0..DEVICES {
        let dev = format!("crash{d}");
        let t = api.must_get_twin(&dev).await;
        twins.insert(dev, t);
    }
    for w in 0..WRITERS {
        let t = &twins[&device_of(w)];
        // (the probe writer, usize::MAX, writes tags.probe and is checked through versions only)
        let acked = h.last_acked.get(&w).copied().unwrap_or(0);
        let attempted = h.last_attempted.get(&w).copied().unwrap_or(0);
        let got = seq_in(t, w);
        if acked > 0 {
            let got = got.unwrap_or_else(|| {
                panic!("{when}: writer {w}'s acknowledged seq {acked} lost entirely on {}: {t}", device_of(w))
            });
            assert!(
                got >= acked,
                "{when}: writer {w} on {}: acknowledged seq {acked} but the twin holds {got} (lost write)",
                device_of(w)
            );
            assert!(got <= attempted, "{when}: writer {w}: twin holds seq {got} never sent (max {attempted})");
        }
    }
    for (dev, t) in &twins {
        let mine: Vec<&Ack> = h.acks.iter().filter(|a| &a.device == dev).collect();
        if let Some(max_v) = mine.iter().map(|a| a.version).max() {
            assert!(
                twin_version(t) >= max_v,
                "{when}: {dev}: twin version went back: acknowledged {max_v}, now {}",
                twin_version(t)
            );
        }
        if let Some(max_dv) = mine.iter().map(|a| a.desired_version).max() {
            assert!(
                desired_version(t) >= max_dv,
                "{when}: {dev}: desired $version went back: acknowledged {max_dv}, now {}",
                desired_version(t)
            );
        }
    }
    twins
}

/// No version, desired `$version` or etag repeats across all acks of a device; each writer's acks
/// have strictly increasing versions.
fn check_no_repeats(h: &History) {
    let mut by_dev: HashMap<&str, Vec<&Ack>> = HashMap::new();
    for a in &h.acks {
        by_dev.entry(&a.device).or_default().push(a);
    }
    for (dev, acks) in by_dev {
        let mut versions = HashSet::new();
        let mut etags = HashSet::new();
        let mut dversions = HashSet::new();
        for a in &acks {
            assert!(versions.insert(a.version), "{dev}: twin version {} acknowledged twice", a.version);
            assert!(etags.insert(a.etag.clone()), "{dev}: etag {} acknowledged twice", a.etag);
            if a.desired {
                assert!(
                    dversions.insert(a.desired_version),
                    "{dev}: desired $version {} acknowledged for two desired patches",
                    a.desired_version
                );
            }
        }
    }
    let mut by_writer: HashMap<(usize, &str), Vec<&Ack>> = HashMap::new();
    for a in &h.acks {
        by_writer.entry((a.writer, &a.device)).or_default().push(a);
    }
    for ((w, _), acks) in by_writer {
        for pair in acks.windows(2) {
            assert!(
                pair[1].version > pair[0].version && pair[1].seq > pair[0].seq,
                "writer {w}: versions not increasing: seq {} → v{}, then seq {} → v{}",
                pair[0].seq,
                pair[0].version,
                pair[1].seq,
                pair[1].version
            );
            if pair[0].desired {
                assert!(
                    pair[1].desired_version > pair[0].desired_version,
                    "writer {w}: desired $version not increasing"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_writes_loses_no_acknowledged_write() {
    let mut srv = Server::start_default();
    {
        let api = srv.owner();
        for d in 0..DEVICES {
            api.must_create_device(&format!("crash{d}")).await;
        }
    }
    let mut h = History { acks: Vec::new(), last_acked: HashMap::new(), last_attempted: HashMap::new() };
    let mut rng = rand::thread_rng();

    for round in 1..=ROUNDS + 1 {
        let final_round = round == ROUNDS + 1;
        let api = srv.owner();
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for w in 0..WRITERS {
            let start = h.last_attempted.get(&w).copied().unwrap_or(0);
            tasks.push(tokio::spawn(writer(api.clone(), w, start, stop.clone())));
        }
        let run_ms = rng.gen_range(700..2000);
        tokio::time::sleep(Duration::from_millis(run_ms)).await;
        if final_round {
            // Last round ends cleanly: stop the writers, then SIGTERM.
            stop.store(true, Ordering::Relaxed);
        } else {
            srv.kill9();
            stop.store(true, Ordering::Relaxed);
        }
        let mut round_acks = 0;
        for t in tasks {
            let (w, acks, attempted) = t.await.expect("writer task panicked");
            if let Some(a) = acks.last() {
                h.last_acked.insert(w, a.seq);
            }
            round_acks += acks.len();
            h.acks.extend(acks);
            h.last_attempted.insert(w, attempted);
        }
        eprintln!(
            "round {round}: {round_acks} acknowledged writes in {run_ms} ms before {}",
            if final_round { "SIGTERM" } else { "SIGKILL" }
        );
        assert!(round_acks >= WRITERS, "round {round}: only {round_acks} writes acknowledged; the test proves nothing");

        if final_round {
            let st = srv.sigterm();
            assert!(st.success(), "SIGTERM must exit cleanly, got {st}\n{}", srv.stderr_tail());
        }
        srv.restart();
        let twins = verify(&srv, &h, &format!("after round {round}")).await;
        check_no_repeats(&h);
        // The next write on each twin must continue above what the restarted server shows.
        if !final_round {
            let api = srv.owner();
            for (dev, t) in &twins {
                let nt = api.must_patch_twin(dev, &json!({"tags": {"probe": round}})).await;
                assert!(
                    twin_version(&nt) > twin_version(t),
                    "{dev}: version after restart did not continue: {} then {}",
                    twin_version(t),
                    twin_version(&nt)
                );
                assert_ne!(etag_of(&nt), etag_of(t));
                let pv = nt.get("etag").cloned();
                assert!(
                    !h.acks.iter().any(|a| &a.device == dev && Some(json!(a.etag)) == pv),
                    "{dev}: etag after restart repeats an earlier acknowledged etag"
                );
                assert!(
                    !h.acks.iter().any(|a| &a.device == dev && a.version == twin_version(&nt)),
                    "{dev}: twin version {} after restart repeats an acknowledged one",
                    twin_version(&nt)
                );
                h.acks.push(Ack {
                    writer: usize::MAX,
                    device: dev.clone(),
                    seq: round as u64,
                    version: twin_version(&nt),
                    desired_version: desired_version(&nt),
                    etag: etag_of(&nt),
                    desired: false,
                });
            }
        }
    }
}
