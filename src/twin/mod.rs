//! Twin actors: one ractor actor per active twin, owned by its shard's leader. The actor orders the
//! twin's requests and pipelines them into the shard's Raft group; the caller is answered after commit.
//! Actors are spawned on first use and passivated when idle: an actor costs ~7.8 KB resident, so a fleet
//! of millions cannot keep one per twin. Twin *state* lives in the shard's state machine, never in the
//! actor, so passivating loses nothing.

mod actor;
mod meta;
pub mod read;
mod registry;
mod scan;
mod view;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::cluster::transport::{Call, CallError, Transport};
use serde_json::Value;

use crate::ids::{NodeId, ShardId, TwinId};
use crate::model::{Applied, Command, JsonText, Reply, TwinError};
use crate::shard::{ShardError, Shards};
use read::{ReadOp, ReadOut};

pub use registry::ActorRegistry;

#[derive(Clone, Debug)]
pub struct TwinsConfig {
    /// An actor with no request for this long is stopped.
    pub idle_after: Duration,
    /// Reads on a node that hosts a replica are answered from it without the leader's read index
    /// (stale by at most the replication lag). Off: every read is linearizable.
    pub follower_reads: bool,
}

impl Default for TwinsConfig {
    fn default() -> Self {
        TwinsConfig { idle_after: Duration::from_secs(30), follower_reads: false }
    }
}

/// How long a write keeps looking for its shard's leader (elections, forwarding hiccups) before it
/// answers a retryable error.
const ROUTE_DEADLINE: Duration = Duration::from_secs(10);

/// Deadline of one forwarded write; the remote side's own Raft timeout is longer, so a timeout here
/// means "unknown outcome": the retry carries the same request id and apply deduplicates it.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// `twinhub_route_forwarded_total`, looked up once (see `metric_handles`).
fn forwarded() -> &'static metrics::Counter {
    static FORWARDED: OnceLock<metrics::Counter> = OnceLock::new();
    FORWARDED.get_or_init(|| metrics::counter!("twinhub_route_forwarded_total"))
}

/// Entry point of the twin layer for the front doors.
pub struct Twins {
    shards: Arc<Shards>,
    registry: Arc<ActorRegistry>,
    sweeper: tokio::task::JoinHandle<()>,
    /// Present in a cluster: writes for shards led elsewhere are forwarded to the leader.
    transport: Option<Transport>,
    follower_reads: bool,
}

/// Room for a forwarded call's answer: a twin document of a kilobyte or two and its envelope.
const ANSWER_ROOM: usize = 4 << 10;

/// A forwarded call's answer as JSON, in a buffer sized up front: grown from serde_json's 128 bytes,
/// every answered write cost several reallocations and copies of its twin document.
fn answer(r: &impl serde::Serialize) -> Result<bytes::Bytes, CallError> {
    let mut out = Vec::with_capacity(ANSWER_ROOM);
    serde_json::to_writer(&mut out, r).map_err(|e| CallError(e.to_string()))?;
    Ok(out.into())
}

/// The first byte of a forwarded write's answer that is only the twin document the write answered
/// (what nearly every forwarded twin write answers), followed by that document's text. Every other
/// answer is the JSON of the outcome, which starts with `{`.
const TWIN_ANSWER: u8 = b'T';

/// A forwarded write's answer. A twin document goes as its text behind [`TWIN_ANSWER`]: inside JSON,
/// the forwarding node had to read the whole document again to find where it ends, a microsecond
/// per forwarded write.
fn write_answer(r: &Result<Applied, ShardError>) -> Result<bytes::Bytes, CallError> {
    match r {
        Ok(Applied { result: Ok(Reply::Twin(doc)), events }) if events.is_empty() => {
            let text = doc.as_str().as_bytes();
            let mut out = Vec::with_capacity(1 + text.len());
            out.push(TWIN_ANSWER);
            out.extend_from_slice(text);
            Ok(out.into())
        }
        other => answer(other),
    }
}

/// Reads what [`write_answer`] wrote (fuzzed as a cluster message, `fuzzing::cluster_wire`). A twin's
/// text is checked to be UTF-8 and not empty, not read as JSON (see [`JsonText::from_member`]).
pub(crate) fn read_write_answer(bytes: &[u8]) -> Result<Result<Applied, ShardError>, String> {
    match bytes.split_first() {
        Some((&TWIN_ANSWER, text)) => {
            let text = std::str::from_utf8(text).map_err(|e| format!("twin text: {e}"))?;
            if text.is_empty() {
                return Err("twin text: empty".into());
            }
            let doc = JsonText::from_member(text);
            Ok(Ok(Applied { result: Ok(Reply::Twin(doc)), events: Vec::new() }))
        }
        _ => serde_json::from_slice(bytes).map_err(|e| e.to_string()),
    }
}

impl Twins {
    /// Must be called inside a tokio runtime: it starts the idle sweeper. With a `transport`, it also
    /// answers the writes other nodes forward here.
    pub fn new(shards: Arc<Shards>, config: TwinsConfig, transport: Option<Transport>) -> Arc<Twins> {
        let registry = Arc::new(ActorRegistry::new(shards.clone(), config.idle_after));
        let sweeper = tokio::spawn(registry.clone().run_sweeper());
        if let Some(t) = &transport {
            let registry = registry.clone();
            t.handlers().register(Call::TwinWrite, move |_from, body: bytes::Bytes| {
                let registry = registry.clone();
                async move {
                    let (id, cmd): (TwinId, Command) =
                        postcard::from_bytes(&body).map_err(|e| CallError(format!("bad forwarded write: {e}")))?;
                    // Never forwarded again from here: if this node lost the lead meanwhile, the caller
                    // hears NotLeader and routes anew (no ping-pong between two stale views).
                    let r = registry.write(&id, cmd).await;
                    write_answer(&r)
                }
            });
        }
        if let Some(t) = &transport {
            let registry = registry.clone();
            t.handlers().register(Call::TwinWrites, move |_from, body: bytes::Bytes| {
                let registry = registry.clone();
                async move {
                    let writes: Vec<(TwinId, Command)> =
                        postcard::from_bytes(&body).map_err(|e| CallError(format!("bad forwarded writes: {e}")))?;
                    // Like a single forwarded write: run here or answer NotLeader, never forwarded on.
                    let runs = writes.into_iter().map(|(id, cmd)| {
                        let registry = registry.clone();
                        async move { registry.write(&id, cmd).await }
                    });
                    let r: Vec<Result<Applied, ShardError>> = futures::future::join_all(runs).await;
                    answer(&r)
                }
            });
        }
        if let Some(t) = &transport {
            let shards = shards.clone();
            t.handlers().register(Call::TwinRead, move |_from, body: bytes::Bytes| {
                let shards = shards.clone();
                async move {
                    let (shard, op): (ShardId, ReadOp) =
                        postcard::from_bytes(&body).map_err(|e| CallError(format!("bad forwarded read: {e}")))?;
                    // Answered only from a local replica (never forwarded again): the caller walks
                    // the shard's replicas itself.
                    let r = match shards.local(shard) {
                        Some(s) => read::run_linearized(&s, op).await,
                        None => Err(ShardError::NotLeader { shard, leader: None }),
                    };
                    answer(&r)
                }
            });
        }
        Arc::new(Twins { shards, registry, sweeper, transport, follower_reads: config.follower_reads })
    }

    /// Orders `cmd` behind earlier requests for `id` on the node that leads the twin's shard (this one,
    /// or the leader over the transport), proposes it and waits for the applied outcome. Across a leader
    /// change it retries with the same command, hence the same request id, so it applies at most once.
    pub async fn write(&self, id: &TwinId, cmd: Command) -> Result<Applied, ShardError> {
        let Some(t) = &self.transport else { return self.registry.write(id, cmd).await };
        let shard = self.shards.shard_of(&id.device_id);
        let mut retry = Retry::new();
        loop {
            let target = retry.pick(&self.shards.route(shard));
            let r = match target {
                Some(n) if n == t.node_id() => self.registry.write(id, cmd.clone()).await,
                Some(n) => self.forward(t, n, id, &cmd).await,
                None => Err(ShardError::NotLeader { shard, leader: None }),
            };
            if retry.again(&self.shards, shard, target, &r).await {
                continue;
            }
            return r;
        }
    }

    /// [`Twins::write`] of several twins at once, answered in order. The first attempt sends the
    /// writes of all shards one node leads in one forwarded call, not one call per shard: a bulk
    /// registry call touches every shard, and per call the inter-node cost (a stream, signatures, a
    /// task on each side) was comparable to the cost of the writes themselves. Whatever that attempt
    /// does not settle (no leader known, a leader change, a lost call, a callee of an older release)
    /// goes through [`Twins::write`] with its retries; the same request ids make that safe.
    pub async fn write_many(&self, writes: Vec<(TwinId, Command)>) -> Vec<Result<Applied, ShardError>> {
        let Some(t) = &self.transport else {
            let runs = writes.iter().map(|(id, cmd)| self.write(id, cmd.clone()));
            return futures::future::join_all(runs).await;
        };
        // Writes whose shard this node leads (or whose leader is unknown) go their own way at once,
        // beside the forwarded calls.
        let mut by_node: std::collections::BTreeMap<NodeId, Vec<usize>> = Default::default();
        let mut own = Vec::new();
        for (i, (id, _)) in writes.iter().enumerate() {
            match self.shards.route(self.shards.shard_of(&id.device_id)).leader {
                Some(n) if n != t.node_id() => by_node.entry(n).or_default().push(i),
                _ => own.push(i),
            }
        }
        let calls = by_node.into_iter().map(|(n, idx)| {
            let batch: Vec<&(TwinId, Command)> = idx.iter().map(|&i| &writes[i]).collect();
            async move { (idx, self.forward_many(t, n, &batch).await) }
        });
        let writes = &writes;
        let runs = own.iter().map(|&i| async move { (i, self.write(&writes[i].0, writes[i].1.clone()).await) });
        let (forwarded, ran) =
            futures::future::join(futures::future::join_all(calls), futures::future::join_all(runs)).await;
        let mut out: Vec<Option<Result<Applied, ShardError>>> = writes.iter().map(|_| None).collect();
        for (i, r) in ran {
            out[i] = Some(r);
        }
        for (idx, answers) in forwarded {
            if let Some(answers) = answers.filter(|a| a.len() == idx.len()) {
                for (i, a) in idx.into_iter().zip(answers) {
                    out[i] = a.is_ok().then_some(a);
                }
            }
        }
        let settle = writes.iter().zip(out).map(|((id, cmd), settled)| async move {
            match settled {
                Some(r) => r,
                None => self.write(id, cmd.clone()).await,
            }
        });
        futures::future::join_all(settle).await
    }

    /// One forwarded call carrying `writes` to `node`; `None` if the call itself failed or its answer
    /// could not be read (every write then goes its own way).
    async fn forward_many(
        &self,
        t: &Transport,
        node: NodeId,
        writes: &[&(TwinId, Command)],
    ) -> Option<Vec<Result<Applied, ShardError>>> {
        let body = twinhub_core::scratch::postcard_vec(writes).ok()?;
        forwarded().increment(writes.len() as u64);
        match t.call(node, Call::TwinWrites, body.into(), Some(FORWARD_TIMEOUT)).await {
            Ok(answer) => serde_json::from_slice(&answer).ok(),
            Err(e) => {
                tracing::debug!(node, "forwarding {} writes: {e}", writes.len());
                None
            }
        }
    }

    async fn forward(&self, t: &Transport, leader: u64, id: &TwinId, cmd: &Command) -> Result<Applied, ShardError> {
        let shard = self.shards.shard_of(&id.device_id);
        let body = twinhub_core::scratch::postcard_vec(&(id, cmd))
            .map_err(|e| ShardError::Fatal { shard, msg: e.to_string() })?;
        forwarded().increment(1);
        match t.call(leader, Call::TwinWrite, body.into(), Some(FORWARD_TIMEOUT)).await {
            Ok(answer) => read_write_answer(&answer)
                .map_err(|e| ShardError::Fatal { shard, msg: format!("bad forwarded answer: {e}") })?,
            // Delivered or not, we cannot tell: retry (same request id) until the route deadline.
            Err(e) => {
                tracing::debug!(shard, leader, "forwarding a write: {e}");
                Err(ShardError::Timeout { shard })
            }
        }
    }

    /// A linearizable read of the shard owning `device_id` (see [`Twins::read_shard`]).
    pub async fn read(&self, device_id: &str, op: ReadOp) -> Result<ReadOut, ShardError> {
        self.read_shard(self.shards.shard_of(device_id), op).await
    }

    /// A linearizable read of one shard: on a local replica (through the leader's read index), or on a
    /// replica elsewhere when this node does not host the shard. Waits out leader changes like writes.
    pub async fn read_shard(&self, shard: ShardId, op: ReadOp) -> Result<ReadOut, ShardError> {
        let Some(t) = &self.transport else {
            let Some(s) = self.shards.local(shard) else { return Err(ShardError::NotLeader { shard, leader: None }) };
            return read::run_linearized(&s, op).await;
        };
        let mut retry = Retry::new();
        loop {
            let (target, r) = match self.shards.local(shard) {
                Some(s) if self.follower_reads => return read::run_local(&s, op).await,
                Some(s) => (Some(t.node_id()), read::run_linearized(&s, op.clone()).await),
                None => {
                    let target = retry.pick(&self.shards.route(shard));
                    let r = match target {
                        Some(n) => self.remote_read(t, n, shard, &op).await,
                        None => Err(ShardError::NotLeader { shard, leader: None }),
                    };
                    (target, r)
                }
            };
            if retry.again(&self.shards, shard, target, &r).await {
                metrics::counter!("twinhub_route_read_retries_total").increment(1);
                continue;
            }
            return r;
        }
    }

    async fn remote_read(
        &self,
        t: &Transport,
        node: NodeId,
        shard: ShardId,
        op: &ReadOp,
    ) -> Result<ReadOut, ShardError> {
        let body = postcard::to_allocvec(&(shard, op)).map_err(|e| ShardError::Fatal { shard, msg: e.to_string() })?;
        metrics::counter!("twinhub_route_forwarded_reads_total").increment(1);
        match t.call(node, Call::TwinRead, body.into(), Some(FORWARD_TIMEOUT)).await {
            Ok(answer) => serde_json::from_slice::<Result<ReadOut, ShardError>>(&answer)
                .map_err(|e| ShardError::Fatal { shard, msg: format!("bad forwarded answer: {e}") })?,
            Err(e) => {
                tracing::debug!(shard, node, "forwarding a read: {e}");
                Err(ShardError::NotLeader { shard, leader: None })
            }
        }
    }

    /// Credentials of a device or module (`None`: no such identity).
    pub async fn credentials(&self, id: &TwinId) -> Result<Option<crate::model::Credentials>, ShardError> {
        match self.read(&id.device_id, ReadOp::Credentials(id.clone())).await? {
            ReadOut::Credentials(c) => Ok(c),
            other => Err(mismatch(other)),
        }
    }

    /// A document read (`twin`, `twin_properties`, `module`).
    pub async fn doc(&self, device_id: &str, op: ReadOp) -> Result<Result<Value, TwinError>, ShardError> {
        match self.read(device_id, op).await? {
            ReadOut::Doc(d) => Ok(d),
            other => Err(mismatch(other)),
        }
    }

    /// The Device document, or `None`.
    pub async fn device(&self, device_id: &str) -> Result<Option<Value>, ShardError> {
        match self.read(device_id, ReadOp::Device(device_id.to_string())).await? {
            ReadOut::MaybeDoc(d) => Ok(d),
            other => Err(mismatch(other)),
        }
    }

    /// A list read on one shard (`devices`, `modules`).
    pub async fn docs(&self, shard: ShardId, op: ReadOp) -> Result<Result<Vec<Value>, TwinError>, ShardError> {
        match self.read_shard(shard, op).await? {
            ReadOut::Docs(d) => Ok(d),
            other => Err(mismatch(other)),
        }
    }

    /// Device counts of one shard.
    pub async fn stats(&self, shard: ShardId) -> Result<crate::model::DeviceStats, ShardError> {
        match self.read_shard(shard, ReadOp::Stats).await? {
            ReadOut::Stats(s) => Ok(s),
            other => Err(mismatch(other)),
        }
    }

    /// Number of live twin actors (metrics).
    pub fn active_actors(&self) -> usize {
        self.registry.len()
    }

    /// Stops every actor; requests already proposed still complete through the shard.
    pub async fn shutdown(&self) {
        self.sweeper.abort();
        self.registry.stop_all().await;
    }
}

fn mismatch(other: ReadOut) -> ShardError {
    ShardError::Fatal { shard: 0, msg: read::Mismatch(other).to_string() }
}

/// The retry policy of routed requests: go to the shard's leader as this node knows it; a node that
/// hosts no replica walks the shard's replicas until one names the leader. A target that timed out or
/// could not be reached is avoided for a moment (a dead leader stays "the leader" in the local view
/// until the election ends). Pauses grow to 100 ms; gives up after [`ROUTE_DEADLINE`].
struct Retry {
    deadline: Instant,
    pause: Duration,
    attempt: usize,
    avoid: Option<(NodeId, Instant)>,
}

/// How long a target that timed out is not tried again.
const AVOID_FOR: Duration = Duration::from_millis(300);

impl Retry {
    fn new() -> Retry {
        Retry { deadline: Instant::now() + ROUTE_DEADLINE, pause: Duration::from_millis(20), attempt: 0, avoid: None }
    }

    fn avoided(&self, n: NodeId) -> bool {
        self.avoid.is_some_and(|(a, until)| a == n && Instant::now() < until)
    }

    fn pick(&self, route: &crate::shard::Route) -> Option<NodeId> {
        if let Some(l) = route.leader.filter(|l| !self.avoided(*l)) {
            return Some(l);
        }
        if route.hosted {
            // Our own replica will learn the new leader; asking its followers adds nothing.
            return None;
        }
        let candidates: Vec<NodeId> = route.replicas.iter().copied().filter(|n| !self.avoided(*n)).collect();
        candidates.get(self.attempt % candidates.len().max(1)).copied()
    }

    async fn pause(&mut self) {
        metrics::counter!("twinhub_route_retries_total").increment(1);
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(Duration::from_millis(100));
    }

    /// Whether to try again after `r` from `target`; remembers leader hints.
    async fn again<T>(
        &mut self,
        shards: &Shards,
        shard: ShardId,
        target: Option<NodeId>,
        r: &Result<T, ShardError>,
    ) -> bool {
        let hosted = shards.local(shard).is_some();
        match r {
            Ok(_) => {
                if !hosted {
                    shards.note_leader(shard, target);
                }
                false
            }
            _ if Instant::now() >= self.deadline => false,
            Err(ShardError::NotLeader { leader: Some(l), .. }) if Some(*l) != target => {
                // A fresh hint: follow it at once.
                if !hosted {
                    shards.note_leader(shard, Some(*l));
                }
                self.avoid = None;
                if self.avoided(*l) || hosted {
                    self.pause().await;
                }
                true
            }
            Err(ShardError::NotLeader { .. }) => {
                if !hosted {
                    shards.note_leader(shard, None);
                }
                self.attempt += 1;
                self.pause().await;
                true
            }
            Err(ShardError::Timeout { .. }) => {
                if let Some(t) = target {
                    self.avoid = Some((t, Instant::now() + AVOID_FOR));
                }
                if !hosted {
                    shards.note_leader(shard, None);
                }
                self.attempt += 1;
                self.pause().await;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(r: &Result<Applied, ShardError>) -> (Vec<u8>, Result<Applied, ShardError>) {
        let wire = write_answer(r).expect("encodes").to_vec();
        let back = read_write_answer(&wire).expect("decodes");
        (wire, back)
    }

    #[test]
    fn a_twin_answer_travels_as_its_text_and_others_as_json() {
        let doc = JsonText::render(&serde_json::json!({"deviceId": "d1", "version": 3, "tags": {"é": "ü"}}));
        let twin = Ok(Applied { result: Ok(Reply::Twin(doc.clone())), events: Vec::new() });
        let (wire, back) = round_trip(&twin);
        assert_eq!(wire[0], TWIN_ANSWER);
        assert_eq!(&wire[1..], doc.as_str().as_bytes(), "the text itself, nothing around it");
        match back {
            Ok(Applied { result: Ok(Reply::Twin(t)), events }) => assert!(t == doc && events.is_empty()),
            other => panic!("{other:?}"),
        }
        let others: [Result<Applied, ShardError>; 3] = [
            Ok(Applied { result: Ok(Reply::Reported { version: 4 }), events: Vec::new() }),
            Ok(Applied { result: Err(TwinError::DeviceNotFound("d2".into())), events: Vec::new() }),
            Err(ShardError::NotLeader { shard: 0, leader: Some(2) }),
        ];
        for r in &others {
            let (wire, back) = round_trip(r);
            assert_eq!(wire[0], b'{', "JSON: {}", String::from_utf8_lossy(&wire));
            assert_eq!(format!("{back:?}"), format!("{r:?}"));
        }
    }

    #[test]
    fn a_twin_answer_that_is_not_text_is_refused() {
        assert!(read_write_answer(&[TWIN_ANSWER, 0xff, 0xfe]).is_err());
        assert!(read_write_answer(&[TWIN_ANSWER]).is_err(), "no document at all");
        assert!(read_write_answer(b"").is_err());
        assert!(read_write_answer(b"not json").is_err());
    }
}
