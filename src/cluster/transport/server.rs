//! The receiving side: [`RaftRpcService`] authenticates a request, then hands it to the local Raft
//! group of its shard ([`LocalGroups`]) or to the handler registered for a call name
//! ([`CallHandlers`]); [`serve`] runs it on an HTTP/2 (h2c) listener.
//!
//! Order of checks, cheapest and least trusting first: method and path, signature headers and clock
//! skew (before the body is read), body size limit and read timeout, MAC over the body, and only then
//! decoding. A stranger costs us a header parse, never a postcard decode or a Raft message.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::auth::{unix_ms, Claim, ClusterSecret};
use super::wire::{self, Endpoint, RaftKind, RpcFailure, ShardRequest};
use super::TransportConfig;
use crate::ids::{NodeId, ShardId};
use crate::shard::types::{Raft, Snapshot};

/// How long [`serve`] waits, once stopped, for in-flight requests before closing connections.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

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

/// A handler of `POST /cluster/v1/call/{name}`: the authenticated caller's node id and the request
/// bytes in, the answer bytes out.
pub type CallHandler = Arc<dyn Fn(NodeId, Bytes) -> CallFuture + Send + Sync>;

/// Handlers of generic calls, by name (e.g. request forwarding to a shard leader).
#[derive(Clone, Default)]
pub struct CallHandlers {
    handlers: Arc<RwLock<HashMap<String, CallHandler>>>,
}

impl CallHandlers {
    /// Registers (or replaces) the handler of `name`. Names are path segments: ASCII letters, digits,
    /// `.`, `_` and `-`; returns `false` (and registers nothing) for any other.
    pub fn register<F, Fut>(&self, name: &str, handler: F) -> bool
    where
        F: Fn(NodeId, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Bytes, CallError>> + Send + 'static,
    {
        if !wire::valid_call_name(name) {
            return false;
        }
        let handler: CallHandler = Arc::new(move |from, body| Box::pin(handler(from, body)));
        self.handlers.write().unwrap_or_else(|e| e.into_inner()).insert(name.to_string(), handler);
        true
    }

    pub fn unregister(&self, name: &str) -> bool {
        self.handlers.write().unwrap_or_else(|e| e.into_inner()).remove(name).is_some()
    }

    fn get(&self, name: &str) -> Option<CallHandler> {
        self.handlers.read().unwrap_or_else(|e| e.into_inner()).get(name).cloned()
    }
}

/// The hyper service of the cluster endpoints. Cheap to clone (one `Arc`).
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
}

impl RaftRpcService {
    pub fn new(config: TransportConfig, groups: LocalGroups, handlers: CallHandlers) -> RaftRpcService {
        let inner = Inner { node_id: config.node_id, secret: config.secret.clone(), config, groups, handlers };
        RaftRpcService { inner: Arc::new(inner) }
    }

    pub fn config(&self) -> &TransportConfig {
        &self.inner.config
    }
}

impl hyper::service::Service<Request<Incoming>> for RaftRpcService {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move { Ok(inner.handle(req).await) })
    }
}

impl Inner {
    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let start = Instant::now();
        let path = req.uri().path().to_string();
        let endpoint = Endpoint::parse(&path);
        let kind = endpoint.as_ref().map_or("unknown", Endpoint::label);
        let (from, result) = self.dispatch(req, endpoint).await;
        let from = from.map_or_else(|| "unknown".to_string(), |n| n.to_string());
        metrics::counter!("twinhub_rpc_server_requests_total", "kind" => kind, "peer" => from.clone()).increment(1);
        metrics::histogram!("twinhub_rpc_server_latency_seconds", "kind" => kind).record(start.elapsed().as_secs_f64());
        let (status, body) = match result {
            Ok(body) => (StatusCode::OK, body),
            Err(failure) => {
                metrics::counter!("twinhub_rpc_server_errors_total", "kind" => kind, "peer" => from.clone(), "error" => failure.label())
                    .increment(1);
                if failure == RpcFailure::Unauthorized {
                    tracing::debug!(%path, from, "cluster request refused: unauthorized");
                } else {
                    tracing::debug!(%path, from, "cluster request failed: {failure}");
                }
                // Encoding our own enum into a Vec cannot fail; an empty body would still carry the status.
                (failure.status(), Bytes::from(wire::encode(&failure).unwrap_or_default()))
            }
        };
        self.respond(status, &path, body)
    }

    /// Signs the answer as this node so the caller knows who answered.
    fn respond(&self, status: StatusCode, path: &str, body: Bytes) -> Response<Full<Bytes>> {
        let mut resp = Response::new(Full::new(Bytes::new()));
        self.secret.sign_headers(resp.headers_mut(), self.node_id, path, &body);
        resp.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/postcard"));
        *resp.status_mut() = status;
        *resp.body_mut() = Full::new(body);
        resp
    }

    /// Authenticates and runs a request; also returns the caller's node id once it is proven.
    async fn dispatch(
        &self,
        req: Request<Incoming>,
        endpoint: Option<Endpoint>,
    ) -> (Option<NodeId>, Result<Bytes, RpcFailure>) {
        if req.method() != Method::POST {
            return (None, Err(RpcFailure::MethodNotAllowed));
        }
        let Some(endpoint) = endpoint else {
            return (None, Err(RpcFailure::NotFound));
        };
        let claim = match Claim::from_headers(req.headers(), unix_ms()) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!("refusing cluster request: {e}");
                return (None, Err(RpcFailure::Unauthorized));
            }
        };
        let limit = self.config.limits.for_endpoint(&endpoint);
        let path = endpoint.path();
        let body = match self.read_body(req.into_body(), limit).await {
            Ok(b) => b,
            Err(f) => return (None, Err(f)),
        };
        if let Err(e) = claim.verify(&self.secret, &path, &body) {
            tracing::debug!(claimed = claim.node, "refusing cluster request: {e}");
            return (None, Err(RpcFailure::Unauthorized));
        }
        let from = claim.node;
        let result = match endpoint {
            Endpoint::Raft(kind) => self.raft(kind, &body).await,
            Endpoint::Call(name) => self.call(&name, from, body).await,
        };
        (Some(from), result)
    }

    async fn read_body(&self, body: Incoming, limit: usize) -> Result<Bytes, RpcFailure> {
        match tokio::time::timeout(self.config.body_read_timeout, Limited::new(body, limit).collect()).await {
            Err(_) => {
                Err(RpcFailure::BadRequest(format!("body not received within {:?}", self.config.body_read_timeout)))
            }
            Ok(Ok(collected)) => Ok(collected.to_bytes()),
            Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
                Err(RpcFailure::TooLarge { limit: limit as u64 })
            }
            Ok(Err(e)) => Err(RpcFailure::BadRequest(format!("reading body: {e}"))),
        }
    }

    fn group(&self, shard: ShardId) -> Result<Raft, RpcFailure> {
        self.groups.get(shard).ok_or(RpcFailure::UnknownShard(shard))
    }

    async fn raft(&self, kind: RaftKind, body: &[u8]) -> Result<Bytes, RpcFailure> {
        let bad = |e: postcard::Error| RpcFailure::BadRequest(format!("{} body: {e}", kind.name()));
        let stopped =
            |shard: ShardId, e: &dyn std::fmt::Display| RpcFailure::GroupStopped { shard, msg: e.to_string() };
        let answer = match kind {
            RaftKind::Append => {
                let req: ShardRequest<_> = wire::decode(body).map_err(bad)?;
                let resp = self.group(req.shard)?.append_entries(req.rpc).await.map_err(|e| stopped(req.shard, &e))?;
                wire::encode(&resp)
            }
            RaftKind::Vote => {
                let req: ShardRequest<_> = wire::decode(body).map_err(bad)?;
                let resp = self.group(req.shard)?.vote(req.rpc).await.map_err(|e| stopped(req.shard, &e))?;
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

    async fn call(&self, name: &str, from: NodeId, body: Bytes) -> Result<Bytes, RpcFailure> {
        let handler = self.handlers.get(name).ok_or_else(|| RpcFailure::NoHandler(name.to_string()))?;
        handler(from, body).await.map_err(|e| RpcFailure::Handler(e.0))
    }
}

/// Serves the cluster endpoints on an already-bound listener (tests bind port 0) until `stop` is
/// cancelled; then stops accepting and lets open connections finish their requests (bounded wait).
/// HTTP/2 only, without TLS (prior knowledge): members authenticate every message, see the module
/// doc of [`super`] for what that does and does not protect.
pub async fn serve(listener: TcpListener, service: RaftRpcService, stop: CancellationToken) {
    let config = service.config().clone();
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .initial_stream_window_size(config.h2_stream_window)
        .initial_connection_window_size(config.h2_connection_window)
        .max_frame_size(config.h2_max_frame)
        .max_concurrent_streams(config.h2_max_concurrent_streams)
        .keep_alive_interval(config.keepalive)
        .keep_alive_timeout(config.keepalive);
    let graceful = GracefulShutdown::new();
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Usually EMFILE: back off rather than spin.
                    tracing::warn!("cluster accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        let _ = tcp.set_nodelay(true);
        let conn = builder.serve_connection(TokioIo::new(tcp), service.clone());
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, "cluster connection ended: {e}");
            }
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(DRAIN_TIMEOUT) => tracing::warn!("cluster connections still open after {DRAIN_TIMEOUT:?}; closing"),
    }
}
