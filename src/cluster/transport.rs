//! Node-to-node transport: Raft RPCs of every shard group, and generic calls (request forwarding),
//! as length-prefixed frames over one connection per peer (and a second one for large bodies).
//!
//! - [`Transport`]: the client side and the node's registries; `ShardRouter` (in `shard::network`)
//!   sends openraft's RPCs through it, tagged with the shard id.
//! - [`server`]: [`RaftRpcService`] authenticates a request, then dispatches it to the local group of
//!   a shard ([`LocalGroups`]) or to a registered call handler ([`CallHandlers`]).
//! - [`listen`]: [`serve`] runs it on a bound listener, under the listener's connection gate.
//! - [`frame`]: the framing: requests and answers by id on one connection, keep-alive pings, the
//!   bulk connection for large bodies. It replaced HTTP/2, whose framing, flow control and HPACK
//!   cost about a tenth of the nodes' CPU under load (measured in `benches/README.md`).
//! - [`peers`]: node id → address, the lazily opened connection per peer and its backoff.
//! - [`batch`]: every group's AppendEntries to one peer share a call when they queue up.
//! - [`wire`]: endpoints (the paths `/cluster/v5/raft/{append|append-batch|vote|prevote|snapshot|transfer-leader}`,
//!   `/cluster/v5/call/{name}`), the protocol version and postcard envelopes.
//! - [`auth`]: request and response signatures; [`replay`]: the receiver's nonce cache.
//!
//! # Deadlines
//! Every request has one: openraft's `RPCOption::soft_ttl()` for Raft RPCs (openraft asks transports
//! to time out at the soft TTL so they report `Timeout` before it abandons the call at the hard one;
//! replication `AppendEntries` get four times that, heartbeats go alone with the soft TTL, see
//! `shard::network`),
//! [`TransportConfig::call_timeout`] or the caller's for calls. A connect counts against the deadline
//! too, and a peer whose connects fail is put in exponential backoff: requests to it fail at once
//! (`Unreachable` for openraft) until the backoff ends, instead of each waiting for a timeout.
//!
//! # Authentication, and what it does not do
//! Members share a cluster secret. Every request carries, in one header, the sender's node id, a
//! timestamp, a fresh 128-bit nonce, the body's length and SHA-256, and an HMAC-SHA256 over those, the
//! method (always `POST`) and the path, in a request-only domain (see [`auth`]). A receiver checks the header MAC (constant time) and
//! the clock skew (60 s) before it reads any body byte, refuses a nonce it has seen from that sender
//! within the skew window ([`replay`]), then reads at most the declared length and compares the digest.
//! Refusals are unsigned. An answer to an authenticated request is signed in a response-only domain
//! over its status, path, body and *the request's* nonce; the client refuses an answer that is not
//! signed, for that request, by the node it asked.
//!
//! This gives **authenticity, integrity and freshness between members**: nobody without the secret
//! can make a node vote, append, install a snapshot or run a call, alter or forge a message or an
//! answer, replay a captured request, or pass a response off as a request or as the answer to
//! another request.
//!
//! # Mutual TLS underneath
//! The connections themselves are TLS 1.3 with certificates from the cluster's own CA
//! ([`crate::tls::cluster`]): that adds **confidentiality** (twin documents and device keys never cross
//! the network in clear) and **peer identity**: a node dials only a server holding the certificate of
//! the node it means, accepts only clients holding a certificate from the cluster CA, and refuses a
//! request signed as another node than the connection's certificate names — so a compromised member
//! can no longer impersonate the others, although it still holds the shared secret. Without a
//! certificate nobody gets past the TLS handshake. Plaintext is only possible with the explicit
//! development flag (`--cluster-plaintext`). Anyone on the path can still drop or delay messages,
//! which Raft tolerates.

pub mod auth;
pub mod batch;
pub mod error;
pub mod failover;
pub mod frame;
pub mod listen;
pub mod peers;
pub mod replay;
pub mod server;
pub mod wire;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, StatusCode};
use metrics::{Counter, Histogram};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest, TransferLeaderResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use auth::ClusterSecret;
pub use error::TransportError;
pub use listen::{serve, trust_members};
pub use peers::PeerTable;
pub use server::{CallError, CallHandlers, LocalGroups, RaftRpcService};
pub use wire::{Call, Endpoint, RaftKind, RpcFailure};

use crate::ids::{NodeId, ShardId};
use crate::metric_handles::HandleCache;
use crate::storage::types::{Snapshot, TypeConfig, Vote};
use auth::{unix_ms, AuthError, BodyDigest, Claim, Direction, Envelope, Nonce};
use wire::{ShardRequest, SnapshotHead};

/// Largest body accepted per endpoint. A snapshot is the whole state of a shard in one request; the
/// others are bounded far lower so a bad peer cannot make a node buffer 64 MiB per stream.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    /// Vote, pre-vote, transfer-leader: a few hundred bytes.
    pub small: usize,
    /// AppendEntries: a batch of log entries (openraft sends at most `max_payload_entries`).
    pub append: usize,
    pub snapshot: usize,
    pub call: usize,
}

impl Default for BodyLimits {
    fn default() -> Self {
        BodyLimits { small: 64 << 10, append: 32 << 20, snapshot: 64 << 20, call: 8 << 20 }
    }
}

impl BodyLimits {
    pub fn for_endpoint(&self, endpoint: &Endpoint) -> usize {
        match endpoint {
            Endpoint::Raft(RaftKind::Append | RaftKind::AppendBatch) => self.append,
            Endpoint::Raft(RaftKind::Snapshot) => self.snapshot,
            Endpoint::Raft(_) => self.small,
            Endpoint::Call(_) => self.call,
        }
    }
}

/// How a node talks to the others. [`TransportConfig::new`] has defaults for a LAN.
#[derive(Clone, Debug)]
pub struct TransportConfig {
    pub node_id: NodeId,
    pub secret: ClusterSecret,
    /// Deadline of a call when the caller gives none.
    pub call_timeout: Duration,
    /// Upper bound of one connect (TCP + TLS handshake); the request deadline may cut it shorter.
    pub connect_timeout: Duration,
    /// First backoff after a failed connect; doubles per further failure up to `backoff_max`.
    pub backoff_min: Duration,
    /// Longest backoff: how stale our view of a recovered peer can get.
    pub backoff_max: Duration,
    /// Keep-alive: a client pings a connection silent this long and closes it after twice this; a
    /// server closes a connection silent for three times this. Detects a peer that vanished without
    /// closing (power loss, a partition).
    pub keepalive: Duration,
    /// A sender that does not deliver its body in this time is dropped (server side).
    pub body_read_timeout: Duration,
    pub limits: BodyLimits,
    /// Requests one connection may have running at once (server side): every group's RPCs to one
    /// node share it. The next request is not read while they all run.
    pub max_requests_per_connection: usize,
    /// Largest request head (path and headers) the server reads: ours are a few hundred bytes.
    pub max_head: usize,
    /// Calls per peer carrying AppendEntries at once; what queues meanwhile leaves together in the
    /// next (see [`batch`]). 0: every AppendEntries is a call of its own.
    pub append_calls_in_flight: usize,
    /// Mutual TLS (the cluster CA and this node's certificate); `None` only with the explicit
    /// plaintext development flag, and in unit tests.
    pub tls: Option<crate::tls::cluster::ClusterTls>,
}

impl TransportConfig {
    pub fn new(node_id: NodeId, secret: ClusterSecret) -> TransportConfig {
        TransportConfig {
            node_id,
            secret,
            call_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(1),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
            keepalive: Duration::from_secs(5),
            body_read_timeout: Duration::from_secs(30),
            limits: BodyLimits::default(),
            max_requests_per_connection: 1024,
            max_head: 16 << 10,
            append_calls_in_flight: 2,
            tls: None,
        }
    }
}

/// A node's transport: the client to every peer, plus the registries its server dispatches to.
/// Cheap to clone (one `Arc`); every shard group shares one.
#[derive(Clone)]
pub struct Transport {
    inner: Arc<Inner>,
}

struct Inner {
    config: TransportConfig,
    peers: Arc<PeerTable>,
    groups: LocalGroups,
    handlers: CallHandlers,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport").field("node_id", &self.inner.config.node_id).finish_non_exhaustive()
    }
}

impl Transport {
    pub fn new(config: TransportConfig) -> Transport {
        let inner = Inner {
            config,
            peers: Arc::new(PeerTable::default()),
            groups: LocalGroups::default(),
            handlers: CallHandlers::default(),
        };
        Transport { inner: Arc::new(inner) }
    }

    pub fn node_id(&self) -> NodeId {
        self.inner.config.node_id
    }

    pub fn config(&self) -> &TransportConfig {
        &self.inner.config
    }

    /// Where the other nodes are. Raft memberships fill it as openraft creates clients; add seeds
    /// (or nodes about to join) with [`PeerTable::set`].
    pub fn peers(&self) -> &PeerTable {
        &self.inner.peers
    }

    /// The Raft groups this node hosts; register each shard group once it is built.
    pub fn groups(&self) -> &LocalGroups {
        &self.inner.groups
    }

    /// Handlers of generic calls.
    pub fn handlers(&self) -> &CallHandlers {
        &self.inner.handlers
    }

    /// The server side, dispatching to this transport's registries; run it with [`serve`].
    pub fn service(&self) -> RaftRpcService {
        RaftRpcService::new(
            self.inner.config.clone(),
            self.inner.groups.clone(),
            self.inner.handlers.clone(),
            self.inner.peers.clone(),
        )
    }

    pub async fn append_entries(
        &self,
        target: NodeId,
        shard: ShardId,
        rpc: AppendEntriesRequest<TypeConfig>,
        deadline: Duration,
    ) -> Result<AppendEntriesResponse<TypeConfig>, TransportError> {
        let body = wire::encode(&ShardRequest { shard, rpc }).map_err(TransportError::Encode)?;
        let answer = self.append_queued(target, body.into(), deadline).await?;
        decode_answer(target, &answer)
    }

    /// An `AppendEntries` as a call of its own, past the peer's append queue: for heartbeats, whose
    /// short deadline must not become a batch's.
    pub async fn heartbeat(
        &self,
        target: NodeId,
        shard: ShardId,
        rpc: AppendEntriesRequest<TypeConfig>,
        deadline: Duration,
    ) -> Result<AppendEntriesResponse<TypeConfig>, TransportError> {
        self.raft(target, RaftKind::Append, &ShardRequest { shard, rpc }, deadline).await
    }

    pub async fn vote(
        &self,
        target: NodeId,
        shard: ShardId,
        rpc: VoteRequest<TypeConfig>,
        deadline: Duration,
    ) -> Result<VoteResponse<TypeConfig>, TransportError> {
        self.raft(target, RaftKind::Vote, &ShardRequest { shard, rpc }, deadline).await
    }

    pub async fn pre_vote(
        &self,
        target: NodeId,
        shard: ShardId,
        rpc: VoteRequest<TypeConfig>,
        deadline: Duration,
    ) -> Result<VoteResponse<TypeConfig>, TransportError> {
        self.raft(target, RaftKind::PreVote, &ShardRequest { shard, rpc }, deadline).await
    }

    pub async fn transfer_leader(
        &self,
        target: NodeId,
        shard: ShardId,
        rpc: TransferLeaderRequest<TypeConfig>,
        deadline: Duration,
    ) -> Result<TransferLeaderResponse<TypeConfig>, TransportError> {
        self.raft(target, RaftKind::TransferLeader, &ShardRequest { shard, rpc }, deadline).await
    }

    /// Sends a whole snapshot in one request.
    pub async fn full_snapshot(
        &self,
        target: NodeId,
        shard: ShardId,
        vote: Vote,
        snapshot: Snapshot,
        deadline: Duration,
    ) -> Result<SnapshotResponse<TypeConfig>, TransportError> {
        let head = SnapshotHead { shard, vote, meta: snapshot.meta };
        let body = wire::encode_snapshot(&head, &snapshot.snapshot).map_err(TransportError::Encode)?;
        drop(snapshot.snapshot);
        let answer = self.send(target, &Endpoint::Raft(RaftKind::Snapshot), body.into(), deadline).await?;
        decode_answer(target, &answer)
    }

    /// Calls the handler of `call` on `target`: bytes in, bytes out. `deadline` defaults to
    /// [`TransportConfig::call_timeout`].
    pub async fn call(
        &self,
        target: NodeId,
        call: Call,
        body: Bytes,
        deadline: Option<Duration>,
    ) -> Result<Bytes, TransportError> {
        let deadline = deadline.unwrap_or(self.inner.config.call_timeout);
        self.send(target, &Endpoint::Call(call.name().to_string()), body, deadline).await
    }

    async fn raft<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        target: NodeId,
        kind: RaftKind,
        req: &Req,
        deadline: Duration,
    ) -> Result<Resp, TransportError> {
        let body = wire::encode(req).map_err(TransportError::Encode)?;
        let answer = self.send(target, &Endpoint::Raft(kind), body.into(), deadline).await?;
        decode_answer(target, &answer)
    }

    /// One request under a deadline, with metrics.
    async fn send(
        &self,
        target: NodeId,
        endpoint: &Endpoint,
        body: Bytes,
        deadline: Duration,
    ) -> Result<Bytes, TransportError> {
        /// Each kind's request counter and duration histogram, by peer.
        static SENT: HandleCache<(&'static str, NodeId), (Counter, Histogram)> = HandleCache::new();
        let start = Instant::now();
        let kind = endpoint.label();
        let (requests, duration) = SENT.get((kind, target), |&(kind, peer)| {
            let peer = peer.to_string();
            (
                metrics::counter!("twinhub_rpc_requests_total", "kind" => kind, "peer" => peer.clone()),
                metrics::histogram!("twinhub_rpc_request_duration_seconds", "kind" => kind, "peer" => peer),
            )
        });
        requests.increment(1);
        let result = match tokio::time::timeout(deadline, self.exchange(target, endpoint, body)).await {
            Ok(r) => r,
            Err(_) => Err(TransportError::Timeout { node: target, after: deadline }),
        };
        duration.record(start.elapsed().as_secs_f64());
        if let Err(e) = &result {
            let peer = target.to_string();
            metrics::counter!("twinhub_rpc_errors_total", "kind" => kind, "peer" => peer, "error" => e.label())
                .increment(1);
            tracing::debug!(target, kind, "cluster request failed: {e}");
        }
        result
    }

    async fn exchange(&self, target: NodeId, endpoint: &Endpoint, body: Bytes) -> Result<Bytes, TransportError> {
        let peer = self.inner.peers.get(target).ok_or(TransportError::UnknownPeer(target))?;
        let conn = peer.conn(&self.inner.config, peers::Lane::for_body(body.len())).await?;
        let path = endpoint.path();
        let config = &self.inner.config;

        let nonce = Nonce::random();
        let envelope = Envelope {
            direction: Direction::Request { method: Method::POST.as_str() },
            path: &path,
            node: config.node_id,
            ts: unix_ms(),
            nonce,
            body: BodyDigest::of(&body),
        };
        let mut headers = hyper::HeaderMap::new();
        config.secret.sign_headers(&mut headers, &envelope);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/postcard"));
        let (status, rheaders, answer) = match conn.sender.send(&path, &headers, &body).await {
            Ok(r) => r,
            Err(source) => {
                peer.broken(&conn);
                return Err(TransportError::Connection { node: target, source: Arc::new(source) });
            }
        };
        // The answer's headers are checked before its body is used, as on the server.
        let claim = match verify_answer(target, status, &rheaders, &path, nonce, config) {
            Ok(claim) => claim,
            Err(e) => {
                // An answer not signed for this request is a refusal of its head (a bad signature,
                // a replay, another protocol version), after which the server closes the connection.
                // The connection is dropped here, before the caller hears of the refusal, so that its
                // next request opens a new one instead of racing that close on this one.
                peer.broken(&conn);
                return Err(e);
            }
        };
        let limit = config.limits.for_endpoint(endpoint);
        if claim.body.len > limit as u64 || answer.len() as u64 != claim.body.len {
            return Err(TransportError::Decode {
                node: target,
                msg: format!("answer of {} bytes, declared {}, limit {limit}", answer.len(), claim.body.len),
            });
        }
        claim.check_body(&answer).map_err(|source| TransportError::ResponseAuth { node: target, source })?;
        if status != StatusCode::OK {
            return Err(TransportError::Remote { node: target, failure: RpcFailure::from_body(status, &answer) });
        }
        Ok(answer)
    }
}

/// Checks that an answer's headers are signed by `target` as the answer to the request with `nonce`.
///
/// Refusals are never signed, so an unsigned 401 is reported as "unauthorized": a forged one can only
/// fail a request, which anyone on the path can do anyway, and "check the cluster secret" is the
/// diagnosis that matters. An answer without this protocol version's marker comes from a node of
/// another release, and says so.
fn verify_answer(
    target: NodeId,
    status: StatusCode,
    headers: &hyper::HeaderMap,
    path: &str,
    nonce: Nonce,
    config: &TransportConfig,
) -> Result<Claim, TransportError> {
    let version = headers.get(wire::HEADER_PROTO).and_then(|v| v.to_str().ok());
    if version != Some(&*wire::PROTOCOL_VERSION.to_string()) {
        return Err(TransportError::Protocol {
            node: target,
            status: status.as_u16(),
            theirs: version.map(str::to_string),
        });
    }
    let auth = |source| TransportError::ResponseAuth { node: target, source };
    let claim = match Claim::from_headers(headers, unix_ms()) {
        Ok(c) => c,
        Err(_) if status == StatusCode::UNAUTHORIZED => {
            return Err(TransportError::Remote { node: target, failure: RpcFailure::Unauthorized })
        }
        // Likewise an unsigned 404: an endpoint the node does not have (an older release), which
        // makes the batch sender fall back to single requests, and a forged one does no more.
        Err(_) if status == StatusCode::NOT_FOUND => {
            return Err(TransportError::Remote { node: target, failure: RpcFailure::NotFound })
        }
        Err(e) => return Err(auth(e)),
    };
    claim.verify_response(&config.secret, status.as_u16(), path, nonce).map_err(auth)?;
    // A call to [`peers::ANY_NODE`] (a joining node that knows a member's address, not its id) takes
    // the answer of whichever member holds that address; the MAC still proves a member signed it.
    if claim.node != target && target != peers::ANY_NODE {
        return Err(auth(AuthError::WrongNode { got: claim.node, want: target }));
    }
    Ok(claim)
}

fn decode_answer<T: DeserializeOwned>(node: NodeId, answer: &[u8]) -> Result<T, TransportError> {
    wire::decode(answer).map_err(|e| TransportError::Decode { node, msg: e.to_string() })
}
