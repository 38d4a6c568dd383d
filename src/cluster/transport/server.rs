//! The receiving side: [`RaftRpcService`] authenticates a request, then hands it to the local Raft
//! group of its shard ([`LocalGroups`]) or to the handler registered for a call name
//! ([`CallHandlers`]); [`super::listen::serve`] feeds it the requests of each connection.
//!
//! Order of checks, cheapest and least trusting first, and nothing read before it is needed:
//! 1. method and path (and the protocol version in it);
//! 2. the signature header: presence, syntax, clock skew, then the MAC over it (constant time),
//!    which covers the body's declared length and digest;
//! 3. the nonce against the replay cache ([`NonceCache`]);
//! 4. only now the body (read by [`super::listen`] once [`RaftRpcService::admit`] passed): at most its declared length (itself at most the endpoint's limit), within
//!    the read timeout, then compared with the declared digest;
//! 5. decoding and dispatch.
//!
//! A refusal in steps 1–4 is answered **unsigned**: a stranger learns a status code and nothing a
//! member would accept. Only the answer to an authenticated request is signed, over the request's
//! nonce, so it verifies as that answer and as nothing else.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use metrics::{Counter, Histogram};

use super::auth::{unix_ms, AuthError, BodyDigest, Claim, ClusterSecret, Direction, Envelope, Nonce};
use super::replay::NonceCache;
use super::wire::{self, Call, Endpoint, RaftKind, RpcFailure, ShardRequest};
use super::TransportConfig;
use crate::ids::{NodeId, ShardId};
use crate::metric_handles::HandleCache;
use crate::storage::types::{Raft, Snapshot};

/// The Raft groups this node hosts, by shard. The shard layer registers a group once it is built and
/// unregisters it when the replica leaves this node; requests for other shards are answered
/// [`RpcFailure::UnknownShard`], which the sender treats as unreachable (and backs off).
#[derive(Clone, Default)]
pub struct LocalGroups {
    groups: Arc<RwLock<HashMap<ShardId, Raft>>>,
}

impl LocalGroups {
    /// Registers (or replaces) the group of `shard`; returns the one it replaced.
    pub fn register(&self, shard: ShardId, raft: Raft) -> Option<Raft> {
        self.groups.write().unwrap_or_else(|e| e.into_inner()).insert(shard, raft)
    }

    pub fn unregister(&self, shard: ShardId) -> Option<Raft> {
        self.groups.write().unwrap_or_else(|e| e.into_inner()).remove(&shard)
    }

    pub fn get(&self, shard: ShardId) -> Option<Raft> {
        self.groups.read().unwrap_or_else(|e| e.into_inner()).get(&shard).cloned()
    }

    pub fn shards(&self) -> Vec<ShardId> {
        let mut v: Vec<_> = self.groups.read().unwrap_or_else(|e| e.into_inner()).keys().copied().collect();
        v.sort_unstable();
        v
    }
}

/// A call handler failed. Handlers encode their own typed outcomes in the answer bytes; this is for
/// what they could not answer at all.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct CallError(pub String);

pub type CallFuture = Pin<Box<dyn Future<Output = Result<Bytes, CallError>> + Send>>;

/// A handler of `POST /cluster/v5/call/{name}`: the authenticated caller's node id and the request
/// bytes in, the answer bytes out.
pub type CallHandler = Arc<dyn Fn(NodeId, Bytes) -> CallFuture + Send + Sync>;

/// Handlers of generic calls (e.g. request forwarding to a shard leader).
#[derive(Clone, Default)]
pub struct CallHandlers {
    handlers: Arc<RwLock<HashMap<Call, CallHandler>>>,
}

impl CallHandlers {
    /// Registers (or replaces) the handler of `call`.
    pub fn register<F, Fut>(&self, call: Call, handler: F)
    where
        F: Fn(NodeId, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Bytes, CallError>> + Send + 'static,
    {
        let handler: CallHandler = Arc::new(move |from, body| Box::pin(handler(from, body)));
        self.handlers.write().unwrap_or_else(|e| e.into_inner()).insert(call, handler);
    }

    pub fn unregister(&self, call: Call) -> bool {
        self.handlers.write().unwrap_or_else(|e| e.into_inner()).remove(&call).is_some()
    }

    fn get(&self, call: Call) -> Option<CallHandler> {
        self.handlers.read().unwrap_or_else(|e| e.into_inner()).get(&call).cloned()
    }
}

/// The cluster endpoints' request handling, shared by every connection. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct RaftRpcService {
    inner: Arc<Inner>,
}

struct Inner {
    node_id: NodeId,
    secret: ClusterSecret,
    config: TransportConfig,
    groups: LocalGroups,
    handlers: CallHandlers,
    nonces: NonceCache,
    /// Where the other nodes are: to probe a leader that seems gone (see `failover`).
    peers: Arc<super::peers::PeerTable>,
}

/// Why a request is refused before it is known to come from a member: answered unsigned.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("method {0} not allowed")]
    Method(Method),
    #[error("no such endpoint")]
    NotFound,
    #[error("request for another protocol version")]
    Version,
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// Signed as one member over a TLS connection certified as another.
    #[error("signed as node {claimed} on a connection certified for node {certified}")]
    Identity { claimed: NodeId, certified: NodeId },
}

impl Refusal {
    /// The one place refusals become protocol errors. Authentication failures all read
    /// "unauthorized": the reason is logged here, never told to the sender.
    fn failure(&self) -> RpcFailure {
        match self {
            Refusal::Method(_) => RpcFailure::MethodNotAllowed,
            Refusal::NotFound => RpcFailure::NotFound,
            Refusal::Version => RpcFailure::ProtocolVersion { ours: wire::PROTOCOL_VERSION },
            Refusal::Auth(_) | Refusal::Identity { .. } => RpcFailure::Unauthorized,
        }
    }

    /// Metrics label: why, for operators (a closed set; the sender only ever sees the failure).
    fn label(&self) -> &'static str {
        match self {
            Refusal::Method(_) => "method",
            Refusal::NotFound => "not_found",
            Refusal::Version => "protocol_version",
            Refusal::Identity { .. } => "identity",
            Refusal::Auth(e) => match e {
                AuthError::Missing(_) => "missing",
                AuthError::Malformed(_) => "malformed",
                AuthError::Stale { .. } => "stale",
                AuthError::BadSignature | AuthError::WrongNode { .. } => "bad_signature",
                AuthError::BodyMismatch => "body_mismatch",
                AuthError::Replayed => "replayed",
                AuthError::Forgotten => "forgotten",
                AuthError::TooManySenders => "too_many_senders",
            },
        }
    }
}

/// A request whose head is authenticated and whose body is still to be read.
pub struct Admitted {
    claim: Claim,
    endpoint: Endpoint,
    path: String,
    start: Instant,
}

/// What became of a request.
enum Outcome {
    /// Not proven to come from a member (or tampered with): an unsigned refusal.
    Refused(Refusal),
    /// From member `from`: the answer is signed over the request's `nonce`.
    Answered { from: NodeId, nonce: Nonce, result: Result<Bytes, RpcFailure> },
}

/// The last time a request of another protocol version was logged at `warn` (Unix ms): once a
/// minute is enough to say "mixed versions", and strangers cannot flood the log with it.
static LAST_VERSION_WARNING: AtomicU64 = AtomicU64::new(0);

impl RaftRpcService {
    pub fn new(
        config: TransportConfig,
        groups: LocalGroups,
        handlers: CallHandlers,
        peers: Arc<super::peers::PeerTable>,
    ) -> RaftRpcService {
        let inner = Inner {
            node_id: config.node_id,
            secret: config.secret.clone(),
            config,
            groups,
            handlers,
            nonces: NonceCache::default(),
            peers,
        };
        RaftRpcService { inner: Arc::new(inner) }
    }

    pub fn config(&self) -> &TransportConfig {
        &self.inner.config
    }

    /// The head of a request (no body yet) authenticated: the request to run once its body is read,
    /// or the refusal to send back.
    pub fn admit<B>(
        &self,
        req: &Request<B>,
        certified: Option<NodeId>,
        proven: impl FnOnce(NodeId),
    ) -> Result<Admitted, Box<Response<Full<Bytes>>>> {
        self.inner.admit(req, certified, proven)
    }

    /// How many body bytes an admitted request may send: its declared length, if its endpoint takes
    /// that much.
    pub fn body_len(&self, admitted: &Admitted) -> Result<usize, RpcFailure> {
        self.inner.body_len(admitted)
    }

    /// Runs an admitted request on its body (or the failure to read it) and signs the answer.
    pub async fn answer(&self, admitted: Admitted, body: Result<Bytes, RpcFailure>) -> Response<Full<Bytes>> {
        self.inner.answer(admitted, body).await
    }

    /// A connection from member `node` ended (see `failover`).
    pub fn connection_closed(&self, node: NodeId) {
        super::failover::on_connection_closed(
            self.inner.node_id,
            node,
            self.inner.groups.clone(),
            self.inner.peers.clone(),
        );
    }
}

impl Inner {
    /// Steps 1–3 of the module doc, on the request's head alone; a refusal comes back as the answer.
    fn admit<B>(
        &self,
        req: &Request<B>,
        certified: Option<NodeId>,
        proven: impl FnOnce(NodeId),
    ) -> Result<Admitted, Box<Response<Full<Bytes>>>> {
        let start = Instant::now();
        let path = req.uri().path().to_string();
        let endpoint = Endpoint::parse(&path);
        let kind = endpoint.as_ref().map_or("unknown", Endpoint::label);
        match self.authenticate(req, endpoint, certified) {
            Err(refusal) => Err(Box::new(self.finish(&path, kind, start, Outcome::Refused(refusal)))),
            Ok((claim, endpoint)) => {
                proven(claim.node);
                Ok(Admitted { claim, endpoint, path, start })
            }
        }
    }

    /// The body length an admitted request declared, if its endpoint takes that much.
    fn body_len(&self, a: &Admitted) -> Result<usize, RpcFailure> {
        let limit = self.config.limits.for_endpoint(&a.endpoint);
        if a.claim.body.len > limit as u64 {
            return Err(RpcFailure::TooLarge { limit: limit as u64 });
        }
        Ok(a.claim.body.len as usize)
    }

    /// Runs an admitted request on its body (or the failure to read it) and signs the answer.
    async fn answer(&self, a: Admitted, body: Result<Bytes, RpcFailure>) -> Response<Full<Bytes>> {
        let kind = a.endpoint.label();
        let outcome = self.dispatch(a.claim, a.endpoint, body).await;
        self.finish(&a.path, kind, a.start, outcome)
    }

    /// Metrics, logs and the answer of a request.
    fn finish(&self, path: &str, kind: &'static str, start: Instant, outcome: Outcome) -> Response<Full<Bytes>> {
        /// Each kind's request counter by peer (`None`: refused, peer unknown) and duration histogram.
        static RECEIVED: HandleCache<(&'static str, Option<NodeId>), (Counter, Histogram)> = HandleCache::new();
        let peer = match &outcome {
            Outcome::Answered { from, .. } => Some(*from),
            Outcome::Refused(_) => None,
        };
        let (requests, duration) = RECEIVED.get((kind, peer), |&(kind, peer)| {
            let peer = peer.map_or_else(|| "unknown".to_string(), |p| p.to_string());
            (
                metrics::counter!("twinhub_rpc_server_requests_total", "kind" => kind, "peer" => peer),
                metrics::histogram!("twinhub_rpc_server_request_duration_seconds", "kind" => kind),
            )
        });
        requests.increment(1);
        duration.record(start.elapsed().as_secs_f64());
        let error = |failure: &RpcFailure| {
            let from = peer.map_or_else(|| "unknown".to_string(), |p| p.to_string());
            metrics::counter!("twinhub_rpc_server_errors_total", "kind" => kind, "peer" => from, "error" => failure.label())
                .increment(1);
        };
        match outcome {
            Outcome::Refused(refusal) => {
                let failure = refusal.failure();
                error(&failure);
                metrics::counter!("twinhub_rpc_server_refused_total", "reason" => refusal.label()).increment(1);
                self.log_refusal(path, &refusal);
                unsigned(failure)
            }
            Outcome::Answered { from: node, nonce, result } => {
                let (status, body) = match result {
                    Ok(body) => (StatusCode::OK, body),
                    Err(failure) => {
                        error(&failure);
                        tracing::debug!(%path, from = node, "cluster request failed: {failure}");
                        (failure.status(), encode_failure(&failure))
                    }
                };
                self.signed(status, path, nonce, body)
            }
        }
    }

    fn log_refusal(&self, path: &str, refusal: &Refusal) {
        if matches!(refusal, Refusal::Version) {
            let now = unix_ms();
            let last = LAST_VERSION_WARNING.load(Ordering::Relaxed);
            if now.saturating_sub(last) >= 60_000
                && LAST_VERSION_WARNING.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
            {
                tracing::warn!(
                    %path,
                    ours = wire::PROTOCOL_VERSION,
                    "cluster request for another protocol version: every node must run the same release"
                );
                return;
            }
        }
        tracing::debug!(%path, "cluster request refused: {refusal}");
    }

    /// An answer signed as this node, bound to the request's nonce, status and path.
    fn signed(&self, status: StatusCode, path: &str, nonce: Nonce, body: Bytes) -> Response<Full<Bytes>> {
        let mut resp = Response::new(Full::new(Bytes::new()));
        let envelope = Envelope {
            direction: Direction::Response { status: status.as_u16() },
            path,
            node: self.node_id,
            ts: unix_ms(),
            nonce,
            body: BodyDigest::of(&body),
        };
        self.secret.sign_headers(resp.headers_mut(), &envelope);
        common_headers(&mut resp);
        *resp.status_mut() = status;
        *resp.body_mut() = Full::new(body);
        resp
    }

    /// Runs an authenticated request on its body.
    async fn dispatch(&self, claim: Claim, endpoint: Endpoint, body: Result<Bytes, RpcFailure>) -> Outcome {
        let (from, nonce) = (claim.node, claim.nonce);
        let answered = |result| Outcome::Answered { from, nonce, result };
        let body = match body {
            Ok(b) => b,
            Err(f) => return answered(Err(f)),
        };
        if let Err(e) = claim.check_body(&body) {
            // The headers were a member's, the body is not the one it signed: tampered in transit.
            return Outcome::Refused(Refusal::Auth(e));
        }
        let result = match endpoint {
            Endpoint::Raft(kind) => self.raft(kind, &body).await,
            Endpoint::Call(name) => self.call(&name, from, body).await,
        };
        answered(result)
    }

    /// Steps 1–3 of the module doc: everything that needs no body.
    fn authenticate<B>(
        &self,
        req: &Request<B>,
        endpoint: Option<Endpoint>,
        certified: Option<NodeId>,
    ) -> Result<(Claim, Endpoint), Refusal> {
        if req.method() != Method::POST {
            return Err(Refusal::Method(req.method().clone()));
        }
        let Some(endpoint) = endpoint else {
            return Err(if wire::other_version(req.uri().path()) { Refusal::Version } else { Refusal::NotFound });
        };
        let now = unix_ms();
        let claim = Claim::from_headers(req.headers(), now)?;
        // The path as sent: `Endpoint::parse` takes a path only in the one form `Endpoint::path`
        // writes, which is what the sender signed, so it need not be written again here.
        claim.verify_request(&self.secret, Method::POST.as_str(), req.uri().path())?;
        // Holding the secret is not enough to speak for another member: the certificate says who
        // is on the other end of this connection.
        if let Some(certified) = certified.filter(|c| *c != claim.node) {
            return Err(Refusal::Identity { claimed: claim.node, certified });
        }
        // Only after the MAC: nobody without the secret can put anything in the cache.
        self.nonces.admit(claim.node, claim.ts, claim.nonce, now)?;
        Ok((claim, endpoint))
    }

    fn group(&self, shard: ShardId) -> Result<Raft, RpcFailure> {
        self.groups.get(shard).ok_or(RpcFailure::UnknownShard(shard))
    }

    async fn raft(&self, kind: RaftKind, body: &[u8]) -> Result<Bytes, RpcFailure> {
        let bad = |e: postcard::Error| RpcFailure::BadRequest(format!("{} body: {e}", kind.name()));
        let stopped =
            |shard: ShardId, e: &dyn std::fmt::Display| RpcFailure::GroupStopped { shard, msg: e.to_string() };
        let answer = match kind {
            RaftKind::Append => return self.append_one(body, None).await,
            RaftKind::Vote => {
                let mut req: ShardRequest<_> = wire::decode(body).map_err(bad)?;
                let group = self.group(req.shard)?;
                super::failover::vouch(&group, &self.peers, &mut req.rpc).await;
                let resp = group.vote(req.rpc).await.map_err(|e| stopped(req.shard, &e))?;
                wire::encode(&resp)
            }
            RaftKind::PreVote => {
                let req: ShardRequest<_> = wire::decode(body).map_err(bad)?;
                let resp = self.group(req.shard)?.pre_vote(req.rpc).await.map_err(|e| stopped(req.shard, &e))?;
                wire::encode(&resp)
            }
            RaftKind::TransferLeader => {
                let req: ShardRequest<_> = wire::decode(body).map_err(bad)?;
                let resp =
                    self.group(req.shard)?.handle_transfer_leader(req.rpc).await.map_err(|e| stopped(req.shard, &e))?;
                wire::encode(&resp)
            }
            RaftKind::AppendBatch => {
                let batch = wire::decode_append_batch(body)
                    .map_err(|e| RpcFailure::BadRequest(format!("{} body: {e}", kind.name())))?;
                wire::encode(&self.append_batch(batch).await)
            }
            RaftKind::Snapshot => {
                let (head, data) = wire::decode_snapshot(body).map_err(bad)?;
                let raft = self.group(head.shard)?;
                let snapshot = Snapshot { meta: head.meta, snapshot: data.to_vec() };
                let resp =
                    raft.install_full_snapshot(head.vote, snapshot).await.map_err(|e| stopped(head.shard, &e))?;
                wire::encode(&resp)
            }
        };
        answer.map(Bytes::from).map_err(|e| RpcFailure::Handler(format!("encoding the answer: {e}")))
    }

    /// Runs a batch's AppendEntries concurrently, each in its shard's group, and answers when all have
    /// finished or `wait_ms` has passed (see [`wire::AppendBatch`]). A straggler dropped here still
    /// completes in its group if openraft already has it: only the answer is lost, as on a timeout.
    async fn append_batch(&self, batch: wire::AppendBatch<'_>) -> Vec<Result<Bytes, RpcFailure>> {
        use futures::stream::{FuturesUnordered, StreamExt};
        let mut answers: Vec<Result<Bytes, RpcFailure>> =
            vec![Err(RpcFailure::Unfinished { waited_ms: batch.wait_ms }); batch.items.len()];
        let mut running = FuturesUnordered::new();
        for (i, item) in batch.items.iter().enumerate() {
            running.push(async move { (i, self.append_one(item, Some(i)).await) });
        }
        let wait = tokio::time::sleep(std::time::Duration::from_millis(u64::from(batch.wait_ms)));
        tokio::pin!(wait);
        while !running.is_empty() {
            tokio::select! {
                Some((i, answer)) = running.next() => answers[i] = answer,
                () = &mut wait => break,
            }
        }
        answers
    }

    /// One group's AppendEntries (an encoded `ShardRequest`), alone or as item `item` of a batch.
    async fn append_one(&self, body: &[u8], item: Option<usize>) -> Result<Bytes, RpcFailure> {
        let req: ShardRequest<_> = wire::decode(body).map_err(|e| {
            RpcFailure::BadRequest(match item {
                None => format!("append body: {e}"),
                Some(i) => format!("append-batch item {i}: {e}"),
            })
        })?;
        let shard = req.shard;
        let resp = self
            .group(shard)?
            .append_entries(req.rpc)
            .await
            .map_err(|e| RpcFailure::GroupStopped { shard, msg: e.to_string() })?;
        wire::encode(&resp).map(Bytes::from).map_err(|e| RpcFailure::Handler(format!("encoding the answer: {e}")))
    }

    async fn call(&self, name: &str, from: NodeId, body: Bytes) -> Result<Bytes, RpcFailure> {
        let handler = Call::from_name(name)
            .and_then(|c| self.handlers.get(c))
            .ok_or_else(|| RpcFailure::NoHandler(name.to_string()))?;
        handler(from, body).await.map_err(|e| RpcFailure::Handler(e.0))
    }
}

/// Headers of every answer, signed or not.
fn common_headers(resp: &mut Response<Full<Bytes>>) {
    resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/postcard"));
    resp.headers_mut().insert(wire::HEADER_PROTO, HeaderValue::from(wire::PROTOCOL_VERSION));
}

/// A refusal without any signature header: the status and the failure code, nothing to replay.
fn unsigned(failure: RpcFailure) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(encode_failure(&failure)));
    common_headers(&mut resp);
    *resp.status_mut() = failure.status();
    resp
}

/// Encoding our own enum into a Vec cannot fail; an empty body would still carry the status.
fn encode_failure(failure: &RpcFailure) -> Bytes {
    Bytes::from(wire::encode(failure).unwrap_or_default())
}
