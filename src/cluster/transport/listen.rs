//! [`serve`]: the inter-node listener. HTTP/2 over mutual TLS (the cluster CA; see
//! [`crate::tls::cluster`]), or over plain TCP with prior knowledge when the node runs with the
//! development plaintext flag. Members also sign every message, see the module doc of [`super`].
//!
//! With TLS, a connection whose handshake does not complete within the authentication timeout, or
//! whose client certificate is not from the cluster CA or names no node, is closed before any HTTP/2
//! work; the node its certificate names is the only one its requests may be signed as.
//!
//! # What a stranger can make this hold
//! Every accepted socket first takes a slot from the listener's [`ConnGate`] (refused, i.e. closed at
//! once, when the listener or its source holds its maximum). The connection counts as
//! *unauthenticated* until one of its requests passes the header MAC and the replay check; if none does
//! within `auth_timeout` of the accept, the connection is closed, whatever it is doing. Its requests
//! are refused before their bodies are read (see [`super::server`]), and what HTTP/2 buffers for a
//! stream before the refusal is bounded by the receive windows ([`TransportConfig::h2_stream_window`],
//! [`TransportConfig::h2_connection_window`]). Header lists are bounded, and PINGs find dead peers.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

use super::server::RaftRpcService;
use super::TransportConfig;
use crate::ids::NodeId;
use crate::net::{ConnGate, ConnPermit};
use crate::tls::cluster::ClusterTls;

/// How long [`serve`] waits, once stopped, for in-flight requests before closing connections.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The service of one connection: the shared request handling, plus the connection's gate slot, which
/// the first authenticated request marks as such.
#[derive(Clone)]
struct ConnService {
    service: RaftRpcService,
    permit: Arc<Mutex<ConnPermit>>,
    /// The node the TLS client certificate names.
    certified: Option<crate::ids::NodeId>,
    /// The member whose requests this connection carries (the last authenticated sender).
    member: Arc<Mutex<Option<NodeId>>>,
}

impl ConnService {
    fn is_authenticated(&self) -> bool {
        self.permit.lock().unwrap_or_else(|p| p.into_inner()).is_authenticated()
    }
}

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let permit = this.permit.clone();
            let member = this.member.clone();
            let proven = move |node: NodeId| {
                permit.lock().unwrap_or_else(|p| p.into_inner()).authenticated();
                *member.lock().unwrap_or_else(|p| p.into_inner()) = Some(node);
            };
            Ok(this.service.handle(req, this.certified, proven).await)
        })
    }
}

fn builder(config: &TransportConfig) -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .initial_stream_window_size(config.h2_stream_window)
        .initial_connection_window_size(config.h2_connection_window)
        .max_frame_size(config.h2_max_frame)
        .max_concurrent_streams(config.h2_max_concurrent_streams)
        // h2 closes the whole connection (GOAWAY "too_many_resets") once a peer has reset more than
        // 20 streams the server had not yet picked up: its guard against rapid-reset floods. Between
        // members that is normal under load: a heartbeat that waits past its 75 ms deadline is
        // cancelled, and on a saturated node dozens are at once. Losing the connection then fails
        // every group's heartbeats together and elections follow. Only cluster members get this far
        // (mutual TLS), and they may hold at most `h2_max_concurrent_streams` streams anyway.
        .max_pending_accept_reset_streams(config.h2_max_concurrent_streams as usize)
        .max_header_list_size(config.h2_max_header_list)
        .keep_alive_interval(config.keepalive)
        .keep_alive_timeout(config.keepalive);
    builder
}

type Io = Either<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>;

/// The TLS handshake, within `timeout`, and the node the client certificate names.
async fn tls_accept(tls: &ClusterTls, tcp: TcpStream, timeout: Duration) -> Result<(Io, Option<NodeId>), String> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server.clone());
    let stream = tokio::time::timeout(timeout, acceptor.accept(tcp))
        .await
        .map_err(|_| format!("no TLS handshake within {timeout:?}"))?
        .map_err(|e| format!("TLS handshake: {e}"))?;
    // The verifier required a certificate from the cluster CA; it must also name a node.
    let node = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(crate::tls::cluster::node_of_cert)
        .ok_or("the client certificate names no node")?;
    Ok((Either::Right(stream), Some(node)))
}

/// Resolves `auth_timeout` after the accept if the connection has not authenticated by then; never
/// otherwise.
async fn unauthenticated_deadline(conn: ConnService, auth_timeout: Duration) {
    tokio::time::sleep(auth_timeout).await;
    if conn.is_authenticated() {
        std::future::pending::<()>().await;
    }
}

/// Serves the cluster endpoints on an already-bound listener (tests bind port 0) until `stop` is
/// cancelled; then stops accepting and lets open connections finish their requests (bounded wait).
/// `gate` bounds the connections (see the module doc); a connection that proves nothing within
/// `auth_timeout` is closed.
pub async fn serve(
    listener: TcpListener,
    service: RaftRpcService,
    gate: Arc<ConnGate>,
    auth_timeout: Duration,
    stop: CancellationToken,
) {
    let builder = builder(service.config());
    let graceful = GracefulShutdown::new();
    loop {
        let (tcp, peer): (_, SocketAddr) = tokio::select! {
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
        // A refused connection is closed at once (dropped), before any HTTP/2 work.
        let Ok(permit) = gate.admit(peer.ip()) else { continue };
        let _ = tcp.set_nodelay(true);
        let service = service.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let tls = service.config().tls.clone();
        tokio::spawn(async move {
            let (io, certified) = match tls {
                None => (Either::Left(tcp), None),
                Some(tls) => match tls_accept(&tls, tcp, auth_timeout).await {
                    Ok(accepted) => accepted,
                    Err(why) => {
                        metrics::counter!("twinhub_rpc_server_refused_total", "reason" => "tls").increment(1);
                        tracing::debug!(%peer, "cluster connection refused: {why}");
                        return;
                    }
                },
            };
            let member = Arc::new(Mutex::new(None));
            let conn_service = ConnService {
                service: service.clone(),
                permit: Arc::new(Mutex::new(permit)),
                certified,
                member: member.clone(),
            };
            let deadline = unauthenticated_deadline(conn_service.clone(), auth_timeout);
            let conn = watcher.watch(builder.serve_connection(TokioIo::new(io), conn_service));
            tokio::select! {
                r = conn => {
                    if let Err(e) = &r {
                        tracing::debug!(%peer, "cluster connection ended: {e}");
                    }
                    // A member's connection ended: its process may be gone (see `failover`).
                    let member = *member.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(node) = certified.or(member) {
                        service.connection_closed(node);
                    }
                },
                () = deadline => tracing::debug!(%peer, "cluster connection closed: not authenticated within {auth_timeout:?}"),
            }
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(DRAIN_TIMEOUT) => tracing::warn!("cluster connections still open after {DRAIN_TIMEOUT:?}; closing"),
    }
}
