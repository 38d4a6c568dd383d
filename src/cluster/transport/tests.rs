//! Transport tests over loopback: a real three-replica shard group (fjall store, openraft) that
//! replicates, fails over and catches a new replica up by snapshot; authentication; backoff; calls.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{HeaderMap, Method, Request, StatusCode};
use openraft::async_runtime::watch::WatchReceiver;
use openraft::error::RPCError;
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::VoteRequest;
use openraft::{ServerState, SnapshotPolicy};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::auth::{self, unix_ms, BodyDigest, Direction, Envelope, Nonce, HEADER_AUTH};
use super::wire::{self, TestCall};
use super::*;
use crate::model::{Command, DeviceSpec, Op, Reply};
use crate::net::{ConnGate, ListenerLimits};
use crate::shard::network::{NetworkFactory, ShardRouter};
use crate::storage::log_store::LogStore;
use crate::storage::state_machine::{SharedState, StateMachine};
use crate::storage::store::Store;
use crate::storage::types::{Node, Raft};

const SECRET: &[u8] = b"twinhub test cluster secret";
const ECHO: Call = Call::Test(TestCall::Echo);
const FAIL: Call = Call::Test(TestCall::Fail);
const SLOW: Call = Call::Test(TestCall::Slow);
const PING: Call = Call::Test(TestCall::Ping);
const COUNT: Call = Call::Test(TestCall::Count);
const NOBODY: Call = Call::Test(TestCall::Nobody);
/// Generous: these are behaviour checks on a loaded 2-core box, not performance assertions.
const WAIT: Duration = Duration::from_secs(30);

fn secret(s: &[u8]) -> ClusterSecret {
    ClusterSecret::new(s).expect("secret")
}

fn transport_with(id: NodeId, s: &[u8]) -> Transport {
    Transport::new(TransportConfig::new(id, secret(s)))
}

fn transport(id: NodeId) -> Transport {
    transport_with(id, SECRET)
}

/// A connection gate that only a flood would fill.
fn gate() -> Arc<ConnGate> {
    ConnGate::new(
        "cluster-test",
        ListenerLimits {
            max_connections: 1024,
            max_per_source: 0,
            max_unauthenticated: 256,
            max_unauthenticated_per_source: 0,
        },
    )
}

/// Serves `t` on a fresh loopback port.
async fn start_server(t: &Transport) -> (String, CancellationToken, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let stop = CancellationToken::new();
    let server = tokio::spawn(serve(listener, t.service(), gate(), WAIT, stop.clone()));
    (addr, stop, server)
}

/// Production timings (250 ms heartbeat, 1–2 s election timeout) with pre-vote on, and snapshots
/// every 10 entries with nothing kept behind them, so a new replica must be caught up by snapshot.
fn raft_config() -> Arc<openraft::Config> {
    let cfg = openraft::Config {
        cluster_name: "twinhub-test".into(),
        heartbeat_interval: 250,
        election_timeout_min: 1000,
        election_timeout_max: 2000,
        install_snapshot_timeout: 10_000,
        enable_pre_vote: Some(true),
        snapshot_policy: SnapshotPolicy::LogsSinceLast(10),
        max_in_snapshot_log_to_keep: 0,
        purge_batch_size: 10,
        ..Default::default()
    };
    Arc::new(cfg.validate().expect("raft config"))
}

/// One node hosting a replica of shard 0 on the real store, served over its own transport.
struct TestNode {
    id: NodeId,
    addr: String,
    _dir: tempfile::TempDir,
    store: Arc<Store>,
    raft: Raft,
    state: SharedState,
    transport: Transport,
    stop: CancellationToken,
    server: JoinHandle<()>,
}

impl TestNode {
    async fn start(id: NodeId) -> TestNode {
        let transport = transport(id);
        let (addr, stop, server) = start_server(&transport).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(Store::open(dir.path()).expect("store"));
        let sm = StateMachine::open(0, store.clone(), None).expect("state machine");
        let state = sm.shared();
        let log = LogStore::new(0, store.clone());
        let network = NetworkFactory::new(ShardRouter::new(transport.clone()), 0);
        let raft = Raft::new(id, raft_config(), network, log, sm).await.expect("raft");
        transport.groups().register(0, raft.clone());
        TestNode { id, addr, _dir: dir, store, raft, state, transport, stop, server }
    }

    fn member(&self) -> (NodeId, Node) {
        (self.id, Node { addr: self.addr.clone() })
    }

    fn has_device(&self, id: &str) -> bool {
        self.state.read().unwrap_or_else(|e| e.into_inner()).state.device(id).is_some()
    }

    fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow_watched().current_leader
    }

    /// Takes the node off the network and stops its group, as a crash would (minus the disk).
    async fn stop(&self) {
        self.stop.cancel();
        self.transport.groups().unregister(0);
        self.raft.shutdown().await.expect("raft shutdown");
        self.store.writer.stop().await.expect("store stop");
    }
}

fn put_device(id: &str) -> Command {
    Command::new(Op::PutDevice { device: DeviceSpec::test_sas(id), if_match: None }, 1_700_000_000_000)
}

/// Waits until every node of `nodes` names the same leader, one of them and not `not`.
async fn must_agree_on_leader(nodes: &[&TestNode], not: Option<NodeId>) -> NodeId {
    let deadline = Instant::now() + WAIT;
    loop {
        let leaders: Vec<_> = nodes.iter().map(|n| n.leader()).collect();
        if let Some(Some(l)) = leaders.first() {
            let agreed = leaders.iter().all(|x| *x == Some(*l));
            if agreed && Some(*l) != not && nodes.iter().any(|n| n.id == *l) {
                return *l;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no agreed leader among {:?}: {leaders:?}",
            nodes.iter().map(|n| n.id).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes a device through `leader` and returns the log index it was committed at. On a loaded
/// machine a leader can miss its lease for a moment (`ForwardToLeader`, no entry appended): it retries
/// until the deadline, so only a leader that stays unable to write fails the test.
async fn must_put_device(leader: &TestNode, id: &str) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        match leader.raft.client_write(std::sync::Arc::new(put_device(id))).await {
            Ok(resp) => {
                assert!(matches!(resp.data.result, Ok(Reply::Device(_))), "{:?}", resp.data.result);
                return resp.log_id.index;
            }
            Err(openraft::error::RaftError::APIError(openraft::error::ClientWriteError::ForwardToLeader(f)))
                if Instant::now() < deadline =>
            {
                eprintln!("node {} could not write ({f}); retrying", leader.id);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("client_write: {e:?}"),
        }
    }
}

async fn must_apply(nodes: &[&TestNode], index: u64) {
    for n in nodes {
        n.raft
            .wait(Some(WAIT))
            .applied_index_at_least(Some(index), format!("node {} applies {index}", n.id))
            .await
            .expect("applied");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_three_replicas_replicate_fail_over_and_catch_up_by_snapshot() {
    let nodes = vec![TestNode::start(1).await, TestNode::start(2).await, TestNode::start(3).await];
    // Only node 1 is told the membership; the others learn every address from it.
    let members: BTreeMap<_, _> = nodes.iter().map(TestNode::member).collect();
    nodes[0].raft.initialize(members).await.expect("initialize");
    let all: Vec<&TestNode> = nodes.iter().collect();
    let leader_id = must_agree_on_leader(&all, None).await;
    let leader = nodes.iter().find(|n| n.id == leader_id).expect("leader");

    let mut last = 0;
    for i in 0..5 {
        last = must_put_device(leader, &format!("dev-{i}")).await;
    }
    must_apply(&all, last).await;
    for n in &nodes {
        assert!((0..5).all(|i| n.has_device(&format!("dev-{i}"))), "node {} misses devices", n.id);
        // One connection per peer, shared by every RPC of the group.
        for (peer, _) in n.transport.peers().list() {
            let opened = n.transport.peers().get(peer).expect("peer").connections_opened();
            assert!(opened <= 1, "node {} opened {opened} connections to {peer}", n.id);
        }
    }

    // The leader crashes: the other two elect a new one and keep taking writes.
    let stopped = Instant::now();
    leader.stop().await;
    let survivors: Vec<&TestNode> = nodes.iter().filter(|n| n.id != leader_id).collect();
    let new_id = must_agree_on_leader(&survivors, Some(leader_id)).await;
    let new_leader = nodes.iter().find(|n| n.id == new_id).expect("new leader");
    new_leader.raft.wait(Some(WAIT)).state(ServerState::Leader, "new leader").await.expect("leader state");
    let first = must_put_device(new_leader, "dev-after-failover").await;
    // openraft 0.10 starts an election only after the leader lease (election_timeout_max) plus a
    // random election timeout since the last heartbeat: with 1–2 s timeouts, 3–4 s.
    println!("failover: node {leader_id} stopped, node {new_id} accepted a write after {:?}", stopped.elapsed());
    for i in 5..30 {
        last = must_put_device(new_leader, &format!("dev-{i}")).await;
    }
    assert!(last > first);
    must_apply(&survivors, last).await;
    for n in &survivors {
        assert!(
            n.has_device("dev-after-failover") && (0..30).all(|i| n.has_device(&format!("dev-{i}"))),
            "node {}",
            n.id
        );
    }

    // A new replica: the log it needs is purged, so it is caught up with a full snapshot (one RPC).
    new_leader.raft.wait(Some(WAIT)).metrics(|m| m.purged.is_some(), "leader purged its log").await.expect("purged");
    let fourth = TestNode::start(4).await;
    let (id, node) = fourth.member();
    new_leader.raft.add_learner(id, node, true).await.expect("add learner");
    must_apply(&[&fourth], last).await;
    assert!(fourth.raft.metrics().borrow_watched().snapshot.is_some(), "learner was not sent a snapshot");
    assert!(fourth.has_device("dev-after-failover") && (0..30).all(|i| fourth.has_device(&format!("dev-{i}"))));

    for n in survivors.iter().copied().chain([&fourth]) {
        n.stop().await;
    }
    for n in nodes.into_iter().chain([fourth]) {
        let _ = tokio::time::timeout(WAIT, n.server).await;
    }
}

/// What a raw request got back.
struct RawAnswer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl RawAnswer {
    fn is_unsigned(&self) -> bool {
        !self.headers.contains_key(HEADER_AUTH)
    }
}

/// Posts a raw request in a frame on a connection of its own (our own headers, no client-side signing).
async fn raw_post(addr: &str, path: &str, headers: &HeaderMap, body: Vec<u8>) -> RawAnswer {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let sender = frame::Sender::start(Box::new(tcp), 64 << 20, WAIT);
    let (status, headers, body) = sender.send(path, headers, &body).await.expect("answer");
    RawAnswer { status, headers, body }
}

/// The signature header of a request from `node`, with the given timestamp, for `digest_of`.
fn signed(s: &[u8], node: NodeId, path: &str, ts: u64, digest_of: &[u8]) -> HeaderMap {
    let mut h = HeaderMap::new();
    let e = Envelope {
        direction: Direction::Request { method: "POST" },
        path,
        node,
        ts,
        nonce: Nonce::random(),
        body: BodyDigest::of(digest_of),
    };
    secret(s).sign_headers(&mut h, &e);
    h
}

/// Registers `count`, answering `counted`, and returns how often it ran.
fn count_calls(t: &Transport) -> Arc<AtomicUsize> {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    t.handlers().register(COUNT, move |_, _| {
        c.fetch_add(1, Ordering::SeqCst);
        async { Ok(Bytes::from_static(b"counted")) }
    });
    calls
}

fn vote_req(term: u64, node: NodeId) -> VoteRequest<TypeConfig> {
    VoteRequest::new(openraft::impls::Vote::new(term, node), None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_wrong_secret_or_stale_timestamp_is_refused_before_raft() {
    let node = TestNode::start(1).await;
    let calls = count_calls(&node.transport);
    let term = || node.raft.metrics().borrow_watched().current_term;
    assert_eq!(term(), 0);

    // A client with another secret: refused, and the vote never reaches Raft (the term stays 0).
    let stranger = transport_with(2, b"not the cluster secret");
    stranger.peers().set(1, node.addr.clone());
    let err = stranger.vote(1, 0, vote_req(5, 2), WAIT).await.expect_err("stranger");
    assert!(matches!(err, TransportError::Remote { failure: RpcFailure::Unauthorized, .. }), "{err}");
    let err = stranger.call(1, COUNT, Bytes::from_static(b"x"), None).await.expect_err("stranger");
    assert!(matches!(err, TransportError::Remote { failure: RpcFailure::Unauthorized, .. }), "{err}");

    // Correctly signed but 2 minutes old: refused, unsigned.
    let path = Endpoint::Raft(RaftKind::Vote).path();
    let body = wire::encode(&wire::ShardRequest { shard: 0, rpc: vote_req(5, 2) }).expect("encode");
    let old = signed(SECRET, 2, &path, unix_ms() - 120_000, &body);
    let answer = raw_post(&node.addr, &path, &old, body.clone()).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    assert!(answer.is_unsigned(), "a refusal must not be signed: {:?}", answer.headers);

    // Garbage under a bad signature is refused as unauthorized, not as undecodable: nothing was decoded.
    let mut bad = signed(SECRET, 2, &path, unix_ms(), b"\xff\xff\xff garbage");
    let mut raw = [0u8; auth::AUTH_LEN + 2];
    let decoded = B64.decode_slice(bad.get(HEADER_AUTH).map(|v| v.as_bytes()).unwrap_or_default(), &mut raw);
    assert_eq!(decoded.ok(), Some(auth::AUTH_LEN));
    raw[auth::AUTH_LEN - 1] ^= 1;
    bad.insert(HEADER_AUTH, B64.encode(&raw[..auth::AUTH_LEN]).parse().expect("header"));
    let answer = raw_post(&node.addr, &path, &bad, b"\xff\xff\xff garbage".to_vec()).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    assert_eq!(RpcFailure::from_body(answer.status, &answer.body), RpcFailure::Unauthorized);
    assert!(answer.is_unsigned());
    // Signed for another path: refused.
    let other = signed(SECRET, 2, "/cluster/v5/raft/prevote", unix_ms(), &body);
    assert_eq!(raw_post(&node.addr, &path, &other, body.clone()).await.status, StatusCode::UNAUTHORIZED);
    // A valid header MAC over another body: refused once the body is read, and unsigned.
    let mut tampered = body.clone();
    tampered[0] ^= 1;
    let answer = raw_post(&node.addr, &path, &signed(SECRET, 2, &path, unix_ms(), &body), tampered).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    assert!(answer.is_unsigned());
    // Missing headers: refused.
    assert_eq!(raw_post(&node.addr, &path, &HeaderMap::new(), body.clone()).await.status, StatusCode::UNAUTHORIZED);
    // The previous version's paths: refused as another protocol version.
    let answer = raw_post(&node.addr, "/cluster/v4/raft/vote", &HeaderMap::new(), body).await;
    assert_eq!(
        RpcFailure::from_body(answer.status, &answer.body),
        RpcFailure::ProtocolVersion { ours: wire::PROTOCOL_VERSION }
    );

    assert_eq!(term(), 0, "a refused request reached Raft");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "a refused call reached its handler");

    // The same vote from a member goes through, so the refusals above were the signature's doing.
    let member = transport(2);
    member.peers().set(1, node.addr.clone());
    let resp = member.vote(1, 0, vote_req(5, 2), WAIT).await.expect("member vote");
    assert!(resp.is_granted_to(&openraft::impls::Vote::new(5, 2)), "{resp:?}");
    // Metrics are published after the vote is answered: wait for them rather than race them.
    node.raft
        .wait(Some(WAIT))
        .metrics(|m| m.current_term == 5, "the granted vote's term")
        .await
        .expect("term 5 in the metrics");

    // And a client refuses an answer signed by another node than the one it asked.
    let confused = transport(2);
    confused.peers().set(3, node.addr.clone());
    let err = confused.call(3, COUNT, Bytes::new(), None).await.expect_err("wrong node answered");
    assert!(
        matches!(err, TransportError::ResponseAuth { source: auth::AuthError::WrongNode { got: 1, want: 3 }, .. }),
        "{err}"
    );
    // A joining node knows a member's address only: asking "any node" there takes whoever answers.
    let joining = transport(4);
    joining.peers().set(peers::ANY_NODE, node.addr.clone());
    joining.call(peers::ANY_NODE, COUNT, Bytes::new(), None).await.expect("any member's signed answer");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_dead_peer_fails_fast_in_backoff_then_reconnects() {
    let t = transport(1);
    let dead = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = dead.local_addr().expect("addr").to_string();
    drop(dead);
    t.peers().set(9, addr.clone());

    let err = t.vote(9, 0, vote_req(1, 1), WAIT).await.expect_err("dead port");
    assert!(matches!(err, TransportError::Connect { .. }) && err.is_unreachable(), "{err}");
    let start = Instant::now();
    let err = t.vote(9, 0, vote_req(1, 1), WAIT).await.expect_err("in backoff");
    let fast = start.elapsed();
    assert!(matches!(err, TransportError::Backoff { .. }) && err.is_unreachable(), "{err}");
    assert!(fast < Duration::from_secs(1), "backoff answer took {fast:?}");
    println!("send to a peer in backoff failed after {fast:?}");

    // Through openraft's interface: Unreachable, so openraft backs off too.
    let mut factory = NetworkFactory::new(ShardRouter::new(t.clone()), 0);
    let mut net = factory.new_client(9, &Node { addr: addr.clone() }).await;
    let res = RaftNetworkV2::vote(&mut net, vote_req(1, 1), RPCOption::new(WAIT)).await;
    assert!(matches!(res, Err(RPCError::Unreachable(_))), "{res:?}");
    // A node nobody told us about: Unreachable as well.
    let mut net = factory.new_client(10, &Node::default()).await;
    let res = RaftNetworkV2::vote(&mut net, vote_req(1, 1), RPCOption::new(WAIT)).await;
    assert!(matches!(res, Err(RPCError::Unreachable(_))), "{res:?}");

    // The peer comes up at that address: once the backoff ends, the next request reconnects.
    let listener = TcpListener::bind(&addr).await.expect("rebind the dead port");
    let peer = transport(9);
    peer.handlers().register(PING, |_, _| async { Ok(Bytes::from_static(b"pong")) });
    let stop = CancellationToken::new();
    let server = tokio::spawn(serve(listener, peer.service(), gate(), WAIT, stop.clone()));
    let deadline = Instant::now() + WAIT;
    let answer = loop {
        match t.call(9, PING, Bytes::new(), None).await {
            Ok(a) => break a,
            Err(e) if e.is_unreachable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("no reconnect: {e}"),
        }
    };
    assert_eq!(&answer[..], b"pong");
    // The shard is not hosted there: Unreachable for openraft (back off), not a network error.
    let res =
        RaftNetworkV2::vote(&mut factory.new_client(9, &Node { addr }).await, vote_req(1, 1), RPCOption::new(WAIT))
            .await;
    assert!(matches!(res, Err(RPCError::Unreachable(_))), "{res:?}");
    stop.cancel();
    server.await.expect("server");
}

/// Node 1's transport with one call per peer for AppendEntries, and node 2 at `addr`.
fn one_append_slot(addr: &str) -> Transport {
    let mut config = TransportConfig::new(1, secret(SECRET));
    config.append_calls_in_flight = 1;
    let t = Transport::new(config);
    t.peers().set(2, addr);
    t
}

/// An AppendEntries without entries from node 1, leader committed in `term`.
fn no_entries(term: u64) -> openraft::raft::AppendEntriesRequest<TypeConfig> {
    openraft::raft::AppendEntriesRequest {
        vote: openraft::impls::Vote::new_committed(term, 1),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_appends_to_one_peer_share_calls_and_each_gets_its_own_answer() {
    let peer = transport(2);
    let (addr, stop, server) = start_server(&peer).await;
    let t = one_append_slot(&addr);
    // Forty groups' AppendEntries at once, for shards node 2 does not host: the first leaves alone,
    // the others queue behind it and share calls, and each learns what became of its own.
    let sends = (0..40u32).map(|shard| t.append_entries(2, shard, no_entries(u64::from(shard) + 1), WAIT));
    let results = futures::future::join_all(sends).await;
    for (shard, r) in results.iter().enumerate() {
        match r {
            Err(TransportError::Remote { failure: RpcFailure::UnknownShard(s), .. }) => {
                assert_eq!(*s as usize, shard, "answer of another request")
            }
            other => panic!("shard {shard}: {other:?}"),
        }
    }
    let batches = t.peers().get(2).expect("peer").appends.batch_calls();
    assert!((1..40).contains(&batches), "{batches} batch calls for 40 requests");
    println!("40 concurrent appends to one peer took {batches} batch call(s) besides the first");

    // With no slots configured, every request is a call of its own, and answered as well.
    let mut config = TransportConfig::new(4, secret(SECRET));
    config.append_calls_in_flight = 0;
    let unbatched = Transport::new(config);
    unbatched.peers().set(2, t.peers().addr(2).expect("addr"));
    let sends = (0..10u32).map(|shard| unbatched.append_entries(2, shard, no_entries(1), WAIT));
    for (shard, r) in futures::future::join_all(sends).await.iter().enumerate() {
        assert!(
            matches!(r, Err(TransportError::Remote { failure: RpcFailure::UnknownShard(s), .. }) if *s as usize == shard),
            "{r:?}"
        );
    }
    assert_eq!(unbatched.peers().get(2).expect("peer").appends.batch_calls(), 0);

    // A group the peer hosts, in a batch with ones it does not: the hosted one is really appended.
    let n = TestNode::start(3).await;
    t.peers().set(3, n.addr.clone());
    n.raft.initialize(BTreeMap::from([n.member()])).await.expect("initialize");
    must_agree_on_leader(&[&n], None).await;
    let sends = (0..8u32).map(|shard| t.append_entries(3, shard, no_entries(1), WAIT));
    let results = futures::future::join_all(sends).await;
    let answer = results[0].as_ref().expect("shard 0 is hosted on node 3");
    // Node 3 leads in a higher term than the stale heartbeat's: it says so rather than appending.
    assert!(!answer.is_success(), "{answer:?}");
    for r in &results[1..] {
        assert!(matches!(r, Err(TransportError::Remote { failure: RpcFailure::UnknownShard(_), .. })), "{r:?}");
    }
    n.stop().await;
    stop.cancel();
    server.await.expect("server");
}

/// More groups' AppendEntries queued for one peer than a batch may carry: they leave in several
/// batches, none larger than the receiver takes (a larger one would be refused whole).
#[tokio::test(flavor = "current_thread")]
async fn test_a_queue_longer_than_a_batch_leaves_in_batches_the_receiver_takes() {
    let peer = transport(2);
    let (addr, stop, server) = start_server(&peer).await;
    let t = one_append_slot(&addr);
    // On one thread, every request is queued before the sender first runs.
    let n = wire::MAX_BATCH_ITEMS as u32 + 100;
    let sends = (0..n).map(|shard| t.append_entries(2, shard, no_entries(1), WAIT));
    for (shard, r) in futures::future::join_all(sends).await.iter().enumerate() {
        assert!(
            matches!(r, Err(TransportError::Remote { failure: RpcFailure::UnknownShard(s), .. }) if *s as usize == shard),
            "shard {shard}: {r:?}"
        );
    }
    assert!(t.peers().get(2).expect("peer").appends.batch_calls() >= 2);
    stop.cancel();
    server.await.expect("server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_heartbeats_go_alone_and_replication_appends_share_calls() {
    let peer = transport(2);
    let (addr, stop, server) = start_server(&peer).await;
    let t = one_append_slot(&addr);
    let node = Node { addr };
    let batches = || t.peers().get(2).map_or(0, |p| p.appends.batch_calls());
    // Thirty groups' heartbeat clients at once: each a call of its own, past the append queue, so
    // no batch takes a heartbeat's short deadline.
    let mut clients = Vec::new();
    for shard in 0..30u32 {
        clients.push(NetworkFactory::new(ShardRouter::new(t.clone()), shard).new_heartbeat_client(2, &node).await);
    }
    let sends = clients.iter_mut().map(|c| RaftNetworkV2::append_entries(c, no_entries(1), RPCOption::new(WAIT)));
    for r in futures::future::join_all(sends).await {
        assert!(matches!(r, Err(RPCError::Unreachable(_))), "shard not hosted there: {r:?}");
    }
    assert_eq!(batches(), 0, "heartbeats were batched");
    // The same requests through the groups' replication clients queue and share calls.
    let mut clients = Vec::new();
    for shard in 0..30u32 {
        clients.push(NetworkFactory::new(ShardRouter::new(t.clone()), shard).new_client(2, &node).await);
    }
    let sends = clients.iter_mut().map(|c| RaftNetworkV2::append_entries(c, no_entries(1), RPCOption::new(WAIT)));
    for r in futures::future::join_all(sends).await {
        assert!(matches!(r, Err(RPCError::Unreachable(_))), "shard not hosted there: {r:?}");
    }
    assert!(batches() > 0, "thirty concurrent replication appends never shared a call");
    stop.cancel();
    server.await.expect("server");
}

/// A node of an older release: the real service for every endpoint but `append-batch`, which it does
/// not have (an unsigned 404, as the real service answers any unknown path).
async fn start_server_without_batches(t: &Transport) -> (String, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let service = t.service();
    let server = tokio::spawn(async move {
        while let Ok((io, _)) = listener.accept().await {
            let service = service.clone();
            tokio::spawn(async move {
                let (r, w) = tokio::io::split(Box::new(io) as frame::BoxIo);
                let w = frame::Writer::new(w);
                let mut r = tokio::io::BufReader::new(r);
                while let Ok(Some(head)) = frame::read_head(&mut r, 1 << 20).await {
                    let Ok(body) = frame::read_body(&mut r, head.body_len).await else { break };
                    let (service, w) = (service.clone(), w.clone());
                    tokio::spawn(async move {
                        if head.kind == frame::Kind::Ping {
                            let pong = frame::encode(head.id, frame::Kind::Pong, 0, "", &HeaderMap::new(), &[]);
                            let _ = w.write(&pong).await;
                            return;
                        }
                        let resp = if head.path.ends_with("/append-batch") {
                            let mut resp = hyper::Response::new(Full::new(Bytes::from(
                                wire::encode(&RpcFailure::NotFound).expect("encode"),
                            )));
                            *resp.status_mut() = StatusCode::NOT_FOUND;
                            resp.headers_mut().insert(wire::HEADER_PROTO, wire::PROTOCOL_VERSION.into());
                            resp
                        } else {
                            let mut req = Request::new(());
                            *req.method_mut() = Method::POST;
                            *req.uri_mut() = head.path.parse().expect("path");
                            *req.headers_mut() = head.headers;
                            match service.admit(&req, None, |_| {}) {
                                Ok(admitted) => service.answer(admitted, Ok(body)).await,
                                Err(refused) => *refused,
                            }
                        };
                        let _ = frame::write_answer(&w, head.id, resp).await;
                    });
                }
            });
        }
    });
    (addr, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_a_peer_without_the_batch_endpoint_gets_every_append_one_by_one() {
    let old = transport(2);
    let (addr, server) = start_server_without_batches(&old).await;
    let t = one_append_slot(&addr);
    // The first batches are refused; their requests, and every later one, go one by one and are
    // answered by the node itself (none of these shards is hosted there).
    let batches = || t.peers().get(2).expect("peer").appends.batch_calls();
    let mut tried = 0;
    for round in 0..3 {
        let sends = (0..20u32).map(|shard| t.append_entries(2, shard, no_entries(1), WAIT));
        for (shard, r) in futures::future::join_all(sends).await.iter().enumerate() {
            assert!(
                matches!(r, Err(TransportError::Remote { failure: RpcFailure::UnknownShard(s), .. }) if *s as usize == shard),
                "round {round}, shard {shard}: {r:?}"
            );
        }
        if round == 0 {
            // Those out before the first refusal came back (a slow first connect frees slots).
            tried = batches();
            assert!(tried >= 1, "twenty concurrent appends with one call slot made no batch");
        }
    }
    assert_eq!(batches(), tried, "batches tried again after the node said it has no such endpoint");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_call_round_trips_bytes_over_one_connection() {
    let server_t = transport(1);
    server_t.handlers().register(ECHO, |from, body: Bytes| async move {
        let mut out = format!("{from}:").into_bytes();
        out.extend(body.iter().rev());
        Ok(Bytes::from(out))
    });
    server_t.handlers().register(FAIL, |_, _| async { Err(CallError("no leader for shard 3".into())) });
    server_t.handlers().register(SLOW, |_, _| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok(Bytes::new())
    });
    let (addr, stop, server) = start_server(&server_t).await;

    let client = transport(2);
    client.peers().set(1, addr);
    let answer = client.call(1, ECHO, Bytes::from_static(b"abc"), None).await.expect("echo");
    assert_eq!(&answer[..], b"2:cba");

    // Many concurrent calls share the one connection.
    let calls = (0..50u32).map(|i| {
        let client = client.clone();
        async move { client.call(1, ECHO, Bytes::from(i.to_string()), None).await }
    });
    for (i, r) in futures::future::join_all(calls).await.into_iter().enumerate() {
        let want = format!("2:{}", i.to_string().chars().rev().collect::<String>());
        assert_eq!(r.expect("echo"), want.as_bytes());
    }
    assert_eq!(client.peers().get(1).expect("peer").connections_opened(), 1);

    // A large body crosses intact (on the bulk connection).
    let big = Bytes::from(vec![7u8; 3 << 20]);
    assert_eq!(client.call(1, ECHO, big.clone(), None).await.expect("big echo").len(), big.len() + 2);

    let err = client.call(1, NOBODY, Bytes::new(), None).await.expect_err("no handler");
    assert!(matches!(err, TransportError::Remote { failure: RpcFailure::NoHandler(_), .. }), "{err}");
    let err = client.call(1, FAIL, Bytes::new(), None).await.expect_err("handler error");
    assert!(
        matches!(&err, TransportError::Remote { failure: RpcFailure::Handler(m), .. } if m.contains("shard 3")),
        "{err}"
    );
    let err = client.call(1, SLOW, Bytes::new(), Some(Duration::from_millis(200))).await.expect_err("deadline");
    assert_eq!(err.timeout(), Some(Duration::from_millis(200)), "{err}");
    let big = Bytes::from(vec![0u8; client.config().limits.call + 1]);
    let err = client.call(1, ECHO, big, None).await.expect_err("too large");
    assert!(matches!(err, TransportError::Remote { failure: RpcFailure::TooLarge { .. }, .. }), "{err}");
    // Still the same connection after all of that.
    assert_eq!(client.call(1, ECHO, Bytes::from_static(b"z"), None).await.expect("echo"), &b"2:z"[..]);
    assert_eq!(client.peers().get(1).expect("peer").connections_opened(), 1);
    stop.cancel();
    server.await.expect("server");
}

/// A connect outlives the short deadline of the request that started it (AppendEntries' is under
/// 200 ms): its failure must still be recorded, so later requests fail fast instead of each waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_connect_outliving_short_deadlines_still_starts_backoff() {
    // A listener that never accepts, with its accept queue filled: further SYNs are dropped, so a
    // connect hangs like one to a powered-off host.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let listener = socket.listen(1).expect("listen");
    let addr = listener.local_addr().expect("addr");
    let mut fillers = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await {
            fillers.push(s);
        }
    }
    let mut config = TransportConfig::new(1, secret(SECRET));
    config.connect_timeout = Duration::from_millis(300);
    config.backoff_min = Duration::from_secs(10);
    let t = Transport::new(config);
    t.peers().set(9, addr.to_string());
    let short = Duration::from_millis(50);
    let err = t.vote(9, 0, vote_req(1, 1), short).await.expect_err("hangs");
    assert_eq!(err.timeout(), Some(short), "{err}");
    // The connect gives up at 300 ms on its own, and puts the peer in backoff.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let start = Instant::now();
    let err = t.vote(9, 0, vote_req(1, 1), short).await.expect_err("backoff");
    assert!(matches!(err, TransportError::Backoff { failures: 1, .. }), "{err} (fillers: {})", fillers.len());
    assert!(start.elapsed() < short);
    drop((listener, fillers));
}

/// A captured request works once; sent again byte for byte it is refused, and so is its answer sent as
/// a request. The answer verifies only as the answer to that request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_replayed_request_and_reflected_answer_are_refused() {
    let server_t = transport(1);
    let calls = count_calls(&server_t);
    let (addr, stop, server) = start_server(&server_t).await;
    let path = Endpoint::Call(COUNT.name().into()).path();
    let headers = signed(SECRET, 2, &path, unix_ms(), b"hi");
    let first = raw_post(&addr, &path, &headers, b"hi".to_vec()).await;
    assert_eq!((first.status, &first.body[..]), (StatusCode::OK, &b"counted"[..]));
    let claim = auth::Claim::from_headers(&first.headers, unix_ms()).expect("signed answer");
    let nonce = auth::Claim::from_headers(&headers, unix_ms()).expect("request").nonce;
    claim.verify_response(&secret(SECRET), 200, &path, nonce).expect("the answer to our request");
    assert!(claim.verify_response(&secret(SECRET), 200, &path, Nonce::random()).is_err());

    let again = raw_post(&addr, &path, &headers, b"hi".to_vec()).await;
    assert_eq!(again.status, StatusCode::UNAUTHORIZED);
    assert!(again.is_unsigned());
    let reflected = raw_post(&addr, &path, &first.headers, first.body.to_vec()).await;
    assert_eq!(reflected.status, StatusCode::UNAUTHORIZED);
    assert!(reflected.is_unsigned());
    assert_eq!(calls.load(Ordering::SeqCst), 1, "only the first copy may run");
    stop.cancel();
    server.await.expect("server");
}

/// The gate bounds unauthenticated connections, which are closed when they prove nothing in time; a
/// member's connection authenticates and frees its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_unauthenticated_connections_are_bounded_and_timed_out() {
    use tokio::io::AsyncReadExt;
    let server_t = transport(1);
    server_t.handlers().register(PING, |_, _| async { Ok(Bytes::from_static(b"pong")) });
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let gate = ConnGate::new(
        "cluster-test",
        ListenerLimits {
            max_connections: 8,
            max_per_source: 0,
            max_unauthenticated: 2,
            max_unauthenticated_per_source: 0,
        },
    );
    let stop = CancellationToken::new();
    let auth_timeout = Duration::from_millis(500);
    let server = tokio::spawn(serve(listener, server_t.service(), gate.clone(), auth_timeout, stop.clone()));

    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(TcpStream::connect(&addr).await.expect("connect"));
    }
    // The third stranger is closed at once: it reads EOF (or a reset), well before the timeout.
    let mut third = TcpStream::connect(&addr).await.expect("connect");
    let mut buf = [0u8; 64];
    let start = Instant::now();
    let n = tokio::time::timeout(WAIT, third.read(&mut buf)).await.expect("closed").unwrap_or(0);
    assert_eq!(n, 0, "the connection over the bound was served");
    // The two idle ones are closed once their time is up.
    for mut s in idle {
        let closed = async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(WAIT, closed).await.expect("idle stranger closed");
    }
    assert!(start.elapsed() >= auth_timeout - Duration::from_millis(100), "closed after {:?}", start.elapsed());
    let deadline = Instant::now() + WAIT;
    while gate.open() > 0 {
        assert!(Instant::now() < deadline, "slots not released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A member gets in, stays past the timeout, and holds no unauthenticated slot.
    let client = transport(2);
    client.peers().set(1, addr);
    assert_eq!(&client.call(1, PING, Bytes::new(), None).await.expect("ping")[..], b"pong");
    tokio::time::sleep(auth_timeout * 2).await;
    assert_eq!(&client.call(1, PING, Bytes::new(), None).await.expect("ping")[..], b"pong");
    assert_eq!((gate.open(), gate.unauthenticated()), (1, 0));
    assert_eq!(client.peers().get(1).expect("peer").connections_opened(), 1);
    stop.cancel();
    server.await.expect("server");
}

/// Every call has its own wire name, a valid path segment that reads back as the same call; an
/// unknown name is no call at all (the server answers `no_handler`).
#[test]
fn call_names_round_trip() {
    let mut seen = std::collections::HashSet::new();
    for c in Call::ALL {
        assert!(wire::valid_call_name(c.name()), "{c:?}");
        assert!(seen.insert(c.name()), "{c:?} shares its name");
        assert_eq!(Call::from_name(c.name()), Some(c));
        assert_eq!(Endpoint::parse(&Endpoint::Call(c.name().into()).path()), Some(Endpoint::Call(c.name().into())));
    }
    assert_eq!(Call::from_name("twin.delete"), None);
}
