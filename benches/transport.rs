//! Round trips of the inter-node transport over loopback (plain HTTP/2, HMAC-signed): a Raft vote
//! handled by a real openraft group on a real fjall store, and a small generic call (what request
//! forwarding uses). Prints p50 / p99 / max; asserts nothing.
//!
//!   cargo bench --bench transport
//!
//! Sequential calls on one connection: this is the latency floor under the write path's forwarded
//! requests and Raft RPCs, not a throughput figure. A last phase keeps six calls in flight and
//! prints the CPU each call and each body costs, one body a call and six.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use openraft::raft::VoteRequest;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use twinhub::cluster::transport::{serve, Call, ClusterSecret, Transport, TransportConfig};
use twinhub::net::{ConnGate, ListenerLimits};
use twinhub::shard::log_store::LogStore;
use twinhub::shard::network::{NetworkFactory, ShardRouter};
use twinhub::shard::state_machine::StateMachine;
use twinhub::shard::store::Store;
use twinhub::shard::types::{Raft, TypeConfig};

const SECRET: &[u8] = b"twinhub bench cluster secret";
const CALLS: usize = 2_000;
const WARMUP: usize = 100;
const WAIT: Duration = Duration::from_secs(30);
/// Bodies sent in the concurrent phase, and how many calls are in flight at once.
const CONCURRENT_BODIES: usize = 24_000;
const IN_FLIGHT: usize = 6;

fn transport(id: u64) -> Transport {
    Transport::new(TransportConfig::new(id, ClusterSecret::new(SECRET).expect("secret")))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // Node 1: a listener, an echo handler and shard 0's Raft group (a single voter that never starts).
    let server = transport(1);
    // The transport does not care what a handler does: node status stands in for an echo here.
    server.handlers().register(Call::NodeStatus, |_, body| async move { Ok(body) });
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let gate = ConnGate::new(
        "cluster-bench",
        ListenerLimits {
            max_connections: 64,
            max_per_source: 0,
            max_unauthenticated: 16,
            max_unauthenticated_per_source: 0,
        },
    );
    let stop = CancellationToken::new();
    let served = tokio::spawn(serve(listener, server.service(), gate, WAIT, stop.clone()));
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(Store::open(dir.path()).expect("store"));
    let sm = StateMachine::open(0, store.clone(), None).expect("state machine");
    let log = LogStore::new(0, store.clone());
    let network = NetworkFactory::new(ShardRouter::new(server.clone()), 0);
    let config = openraft::Config { cluster_name: "twinhub-bench".into(), ..Default::default() };
    let raft = Raft::new(1, Arc::new(config.validate().expect("raft config")), network, log, sm).await.expect("raft");
    server.groups().register(0, raft.clone());

    // Node 2: the client.
    let client = transport(2);
    client.peers().set(1, addr);
    for (what, is_vote) in [("vote", true), ("call", false)] {
        let mut hist = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
        for i in 0..CALLS + WARMUP {
            let start = Instant::now();
            if is_vote {
                // Term 0 never wins: the group answers without persisting anything.
                let req = VoteRequest::<TypeConfig>::new(openraft::impls::Vote::new(0, 2), None);
                client.vote(1, 0, req, WAIT).await.expect("vote");
            } else {
                client.call(1, Call::NodeStatus, Bytes::from_static(b"0123456789abcdef"), None).await.expect("call");
            }
            if i >= WARMUP {
                hist.record(start.elapsed().as_micros() as u64).expect("record");
            }
        }
        println!(
            "loopback {what} RPC over {CALLS} sequential calls: p50 {} µs, p99 {} µs, max {} µs",
            hist.value_at_quantile(0.5),
            hist.value_at_quantile(0.99),
            hist.max()
        );
    }
    // CPU per call with calls in flight side by side, as a node's Raft groups send to one peer
    // (about six `AppendEntries` in flight per peer under the compare load), against the same bodies
    // carried six to a call: what one call per peer for every group's entries could save. Both ends
    // run in this process, so the CPU is the whole round trip's.
    let body = Bytes::from(vec![b'x'; 400]);
    for per_call in [1usize, 6] {
        let payload = Bytes::from(body.repeat(per_call));
        let each = CONCURRENT_BODIES / per_call / IN_FLIGHT;
        let (cpu0, started) = (twinhub::sysmetrics::cpu_seconds().expect("cpu time"), Instant::now());
        let callers = (0..IN_FLIGHT).map(|_| {
            let (client, payload) = (client.clone(), payload.clone());
            tokio::spawn(async move {
                for _ in 0..each {
                    client.call(1, Call::NodeStatus, payload.clone(), None).await.expect("call");
                }
            })
        });
        for c in futures::future::join_all(callers).await {
            c.expect("caller");
        }
        let cpu = twinhub::sysmetrics::cpu_seconds().expect("cpu time") - cpu0;
        let bodies = (each * IN_FLIGHT * per_call) as f64;
        println!(
            "{IN_FLIGHT} calls in flight, {per_call} {} of 400 B a call: {:.1} µs CPU per body ({:.1} per call), {:.0} bodies/s",
            if per_call == 1 { "body" } else { "bodies" },
            cpu * 1e6 / bodies,
            cpu * 1e6 / (bodies / per_call as f64),
            bodies / started.elapsed().as_secs_f64()
        );
    }
    let _ = raft.shutdown().await;
    stop.cancel();
    let _ = served.await;
}
