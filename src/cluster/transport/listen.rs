//! [`serve`]: the inter-node listener. Request frames (see [`frame`]) over mutual TLS (the cluster
//! CA; see [`crate::tls::cluster`]), or over plain TCP when the node runs with the development
//! plaintext flag. Members also sign every message, see the module doc of [`super`].
//!
//! With TLS, a connection whose handshake does not complete within the authentication timeout, or
//! whose client certificate is not from the cluster CA or names no node, is closed before any frame is
//! read; the node its certificate names is the only one its requests may be signed as.
//!
//! # What a stranger can make this hold
//! Every accepted socket first takes a slot from the listener's [`ConnGate`] (refused, i.e. closed at
//! once, when the listener or its source holds its maximum). The connection counts as
//! *unauthenticated* until one of its requests passes the header MAC and the replay check; if none does
//! within `auth_timeout` of the accept, the connection is closed, whatever it is doing. A request's
//! head is bounded ([`TransportConfig::max_head`]) and checked before its body is read: a refused
//! request is answered and its connection closed with the body unread (its further bytes are read
//! and dropped for a moment, so that the refusal is not lost to a reset). A body is read only up to
//! its endpoint's limit, and only when it is exactly as long as its signature says. A connection runs
//! at most [`TransportConfig::max_requests_per_connection`] requests at once, and a silent one is
//! closed after three keep-alive intervals.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::frame;
use super::server::RaftRpcService;
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

    /// Authenticates a request's head; the first that passes marks the connection as a member's.
    fn admit(&self, req: &Request<()>) -> Result<super::server::Admitted, Box<Response<Full<Bytes>>>> {
        let permit = self.permit.clone();
        let member = self.member.clone();
        let proven = move |node: NodeId| {
            permit.lock().unwrap_or_else(|p| p.into_inner()).authenticated();
            *member.lock().unwrap_or_else(|p| p.into_inner()) = Some(node);
        };
        self.service.admit(req, self.certified, proven)
    }
}

/// Serves one connection's frames until it closes, goes silent for three keep-alive intervals, sends
/// something that is not a request, or `stop` is cancelled; then waits (bounded) for the requests it
/// is running.
///
/// A request's head is authenticated before its body is read. A refused head is answered (unsigned)
/// and the connection closed without reading its body; so is a body that is not exactly as long as
/// its signature says. Each admitted request runs in its own task, which writes its answer; at most
/// `streams` run at once, and the next head is not read while they all do.
async fn serve_framed(io: frame::BoxIo, conn: ConnService, stop: CancellationToken) {
    let config = conn.service.config().clone();
    let (r, w) = tokio::io::split(io);
    let w = frame::Writer::new(w);
    let streams = config.max_requests_per_connection.max(1);
    let slots = Arc::new(tokio::sync::Semaphore::new(streams));
    let mut r = tokio::io::BufReader::with_capacity(frame::READ_BUFFER, r);
    let max_head = config.max_head + MAX_PATH;
    let silence = config.keepalive * 3;
    let mut linger = false;
    let why = loop {
        let head = tokio::select! {
            head = tokio::time::timeout(silence, frame::read_head(&mut r, max_head)) => head,
            () = stop.cancelled() => break "node stopping".to_string(),
        };
        let head = match head {
            Err(_) => break format!("silent for {silence:?}"),
            Ok(Ok(Some(head))) => head,
            Ok(Ok(None)) => break "closed by the peer".to_string(),
            Ok(Err(e)) => break e.to_string(),
        };
        match head.kind {
            frame::Kind::Request => {}
            frame::Kind::Ping if head.body_len == 0 => {
                let pong = frame::encode(head.id, frame::Kind::Pong, 0, "", &hyper::HeaderMap::new(), &[]);
                if let Err(e) = w.write(&pong).await {
                    break e.to_string();
                }
                continue;
            }
            other => break format!("unexpected {other:?} frame of {} body bytes", head.body_len),
        }
        let id = head.id;
        let declared = head.body_len;
        let mut req = Request::new(());
        match head.path.parse() {
            Ok(uri) => *req.uri_mut() = uri,
            Err(_) => break "a request path that is no URI path".to_string(),
        }
        *req.method_mut() = hyper::Method::POST;
        *req.headers_mut() = head.headers;
        let admitted = match conn.admit(&req) {
            Ok(a) => a,
            Err(refused) => {
                let _ = frame::write_answer(&w, id, *refused).await;
                linger = true;
                break "request refused".to_string();
            }
        };
        let refusal = match conn.service.body_len(&admitted) {
            Ok(len) if len == declared => None,
            Ok(len) => Some(super::RpcFailure::BadRequest(format!("frame body of {declared} bytes, signed {len}"))),
            Err(failure) => Some(failure),
        };
        if let Some(failure) = refusal {
            // From a member (the head was signed): drop the body as it comes, without holding it, and
            // go on with the connection.
            let (mut rest, mut sink) = ((&mut r).take(declared as u64), tokio::io::sink());
            match tokio::time::timeout(config.body_read_timeout, tokio::io::copy(&mut rest, &mut sink)).await {
                Ok(Ok(n)) if n == declared as u64 => {}
                _ => break "body not received".to_string(),
            }
            if let Err(e) = frame::write_answer(&w, id, conn.service.answer(admitted, Err(failure)).await).await {
                break e.to_string();
            }
            continue;
        }
        let len = declared;
        let body = match tokio::time::timeout(config.body_read_timeout, frame::read_body(&mut r, len)).await {
            Ok(Ok(body)) => body,
            Ok(Err(e)) => break e.to_string(),
            Err(_) => break format!("body not received within {:?}", config.body_read_timeout),
        };
        let Ok(slot) = slots.clone().acquire_owned().await else { break "closing".to_string() };
        let (service, w) = (conn.service.clone(), w.clone());
        tokio::spawn(async move {
            let answer = service.answer(admitted, Ok(body)).await;
            let _ = frame::write_answer(&w, id, answer).await;
            drop(slot);
        });
    };
    tracing::debug!("cluster connection ended: {why}");
    // Let the requests in flight answer (bounded), then close.
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, slots.acquire_many(streams as u32)).await;
    w.shutdown().await;
    if linger {
        // Closing with unread bytes would reset the connection, and a reset can destroy the refusal
        // before the client reads it. So read (and drop, never buffer) what it still sends, briefly and
        // only so much: a stranger must not be able to push more than a socket buffer's worth past it.
        let mut rest = (&mut r).take(LINGER_BYTES);
        let _ = tokio::time::timeout(LINGER, tokio::io::copy(&mut rest, &mut tokio::io::sink())).await;
    }
}

/// How often [`trust_members`] looks the members' addresses up again.
const TRUST_REFRESH: Duration = Duration::from_secs(5);

/// Keeps `gate`'s trusted sources ([`ConnGate::set_trusted`]) to the addresses of the nodes the
/// transport knows (the cluster's members and the peers it was started with), looked up every few
/// seconds, since a member named by host name may move: strangers who fill the listener's
/// unauthenticated bounds then cannot keep a member from reconnecting. A member that dials from
/// another address than the one it is known by is admitted as any connection is. An address that
/// does not resolve keeps what it last resolved to.
pub async fn trust_members(transport: super::Transport, gate: Arc<ConnGate>, stop: CancellationToken) {
    let mut resolved: HashMap<String, Vec<IpAddr>> = HashMap::new();
    let mut tick = tokio::time::interval(TRUST_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let addrs: HashSet<String> = transport.peers().list().into_iter().map(|(_, a)| a).collect();
        resolved.retain(|a, _| addrs.contains(a));
        for addr in addrs {
            let lookup = tokio::time::timeout(Duration::from_secs(2), tokio::net::lookup_host(addr.clone())).await;
            if let Ok(Ok(found)) = lookup {
                resolved.insert(addr, found.map(|a| a.ip()).collect());
            }
        }
        gate.set_trusted(resolved.values().flatten().copied());
    }
}

/// How long a refused connection's further bytes are read and dropped before it is closed.
const LINGER: Duration = Duration::from_secs(1);

/// The most bytes a refused connection may still send while it lingers: enough for what was already in
/// flight when the refusal left (a few socket buffers), so the refusal is not lost to a reset.
const LINGER_BYTES: u64 = 1 << 20;

/// The longest request path a head may carry (the endpoints' paths are far shorter).
const MAX_PATH: usize = 1024;

type Io = tokio_rustls::server::TlsStream<TcpStream>;

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
    Ok((stream, Some(node)))
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
    let connections = tokio_util::task::TaskTracker::new();
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
        // A refused connection is closed at once (dropped), before any TLS work.
        let Ok(permit) = gate.admit(peer.ip()) else { continue };
        let _ = tcp.set_nodelay(true);
        let service = service.clone();
        let tls = service.config().tls.clone();
        let stop = stop.clone();
        connections.spawn(async move {
            let (io, certified): (frame::BoxIo, _) = match tls {
                None => (Box::new(tcp), None),
                Some(tls) => match tls_accept(&tls, tcp, auth_timeout).await {
                    Ok((io, node)) => (Box::new(io), node),
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
            tokio::select! {
                () = serve_framed(io, conn_service, stop) => {
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
    connections.close();
    tokio::select! {
        () = connections.wait() => {}
        () = tokio::time::sleep(DRAIN_TIMEOUT * 2) => tracing::warn!("cluster connections still open after {:?}; closing", DRAIN_TIMEOUT * 2),
    }
}
