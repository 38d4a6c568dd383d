//! The device MQTT front door: MQTT 3.1.1 and 5 on one port, IoT Hub's `$iothub/twin/...` topics. See
//! `README.md` in this directory for the design.
//!
//! # Layout
//!
//! - `mod.rs`: [`Mqtt`], the accept loop and TLS.
//! - `codec`: bytes ⇄ packets on `rumqttd::protocol`; protocol level sniffed from CONNECT.
//! - `connect`: client id, user name and SAS token → the connection's identity.
//! - `connection`: one task per connection (read loop, ordered twin requests, desired pushes, keep-alive)
//!   plus one writer task behind a bounded queue.
//! - `session`: sessions by client id (subscriptions, `$rid` memory), takeover, generations.
//! - `topics`: topic classification in the identity's scope, filters and matching.
//! - `error`: the only place where errors become status codes, CONNACK codes and DISCONNECT reasons.

pub(crate) mod codec;
pub(crate) mod connect;
mod connection;
pub(crate) mod error;
pub mod methods;
pub(crate) mod session;
pub(crate) mod topics;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::net::{ConnGate, ConnPermit};
use crate::notify::Hub;
use crate::twin::Twins;

pub use session::Sessions;

/// Limits and timeouts of the MQTT endpoint.
#[derive(Clone, Debug)]
pub struct Limits {
    /// A TLS handshake must complete within this.
    pub tls_handshake: Duration,
    /// CONNECT must arrive (and be answered) within this after the transport is up: an idle socket
    /// costs memory and a file descriptor, and an unauthenticated peer has no business keeping one.
    pub connect: Duration,
    /// Largest packet accepted (remaining length) once connected; larger ones close the connection.
    pub max_packet: usize,
    /// Largest CONNECT accepted (a SAS token is a few hundred bytes).
    pub max_connect: usize,
    /// Keep-alive values above this, and keep-alive 0 ("never"), become this (IoT Hub's maximum is 29
    /// minutes): a connection that says nothing for 1.5 times it is closed, so no client can hold a
    /// connection and its session forever without a packet. MQTT 5 clients are told in CONNACK (server
    /// keep-alive); MQTT 3.1.1 clients must ping at least this often.
    pub max_keep_alive: u16,
    /// Twin requests of one connection in flight before the connection stops reading (backpressure).
    pub max_in_flight: usize,
    /// Packets queued for a connection's writer.
    pub outbound_queue: usize,
    /// How long the queue to the writer may stay full before the connection is closed: a client that
    /// does not read must not hold the read loop forever.
    pub outbound_stall: Duration,
    /// QoS 1 pushes sent and not yet acknowledged before the connection is closed.
    pub max_unacked: usize,
    /// After a connection ends: how long its accepted twin requests may take to finish, and how long the
    /// `connectionState` write may take.
    pub drain: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            tls_handshake: Duration::from_secs(10),
            connect: Duration::from_secs(10),
            max_packet: 256 * 1024,
            max_connect: 16 * 1024,
            max_keep_alive: 1740,
            max_in_flight: 64,
            outbound_queue: 128,
            outbound_stall: Duration::from_secs(10),
            max_unacked: 256,
            drain: Duration::from_secs(5),
        }
    }
}

impl Limits {
    /// The node's limits: the unauthenticated phase (TLS handshake, then CONNECT) gets the handshake
    /// timeout every listener shares, so that a stranger's socket is held for as long on this port as
    /// on the others; `max_keep_alive` is the operator's bound on idle connections.
    pub fn new(handshake_timeout: Duration, max_keep_alive: u16) -> Limits {
        Limits {
            tls_handshake: handshake_timeout,
            connect: handshake_timeout,
            max_keep_alive: max_keep_alive.max(1),
            ..Limits::default()
        }
    }

    /// The keep-alive a connection gets for the one its CONNECT asked for: 0 ("no keep-alive") and
    /// anything above the maximum become the maximum.
    pub fn keep_alive(&self, asked: u16) -> u16 {
        crate::net::clamp_keep_alive(asked, self.max_keep_alive)
    }
}

/// State shared by every MQTT listener of a node (TLS and plain share sessions, so a takeover works
/// across them).
pub struct Mqtt {
    pub twins: Arc<Twins>,
    pub hub: Arc<Hub>,
    /// Host name devices put in their SAS `sr` and username.
    pub hostname: String,
    pub sessions: Sessions,
    pub limits: Limits,
    /// The connection budget both listeners share: every accepted socket takes a permit before the TLS
    /// handshake and holds it until it closes.
    pub gate: Arc<ConnGate>,
    /// This node's connections that take direct method calls.
    pub methods: Arc<methods::LocalMethods>,
}

/// How long `serve` waits, after `stop`, for its connections to finish closing.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(15);

impl Mqtt {
    pub fn new(twins: Arc<Twins>, hub: Arc<Hub>, hostname: String, gate: Arc<ConnGate>, limits: Limits) -> Arc<Mqtt> {
        Arc::new(Mqtt { twins, hub, hostname, sessions: Sessions::default(), limits, gate, methods: Arc::default() })
    }

    /// Accepts connections until `stop`, then closes them all (each reports its identity disconnected)
    /// and returns once they are closed or [`SHUTDOWN_GRACE`] has passed.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Option<Arc<rustls::ServerConfig>>,
        stop: CancellationToken,
    ) {
        let acceptor = tls.map(TlsAcceptor::from);
        let tracker = TaskTracker::new();
        let local = listener.local_addr().ok();
        tracing::info!(addr = ?local, tls = acceptor.is_some(), "MQTT listener accepting");
        loop {
            let (tcp, peer) = tokio::select! {
                _ = stop.cancelled() => break,
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        // Usually out of file descriptors: back off instead of spinning.
                        tracing::warn!("MQTT accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            // A refused socket is closed at once, before any TLS work: a flood only ever fills the
            // unauthenticated slots of its own source, never those of connected devices.
            let Ok(permit) = self.gate.admit(peer.ip()) else { continue };
            let _ = tcp.set_nodelay(true);
            tracker.spawn(self.clone().accepted(tcp, peer, permit, acceptor.clone(), stop.clone()));
        }
        tracker.close();
        if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait()).await.is_err() {
            tracing::warn!(remaining = tracker.len(), "MQTT connections still closing after {SHUTDOWN_GRACE:?}");
        }
        tracing::info!(addr = ?local, "MQTT listener stopped");
    }

    async fn accepted(
        self: Arc<Self>,
        tcp: TcpStream,
        peer: SocketAddr,
        permit: ConnPermit,
        tls: Option<TlsAcceptor>,
        stop: CancellationToken,
    ) {
        let Some(acceptor) = tls else {
            return connection::run(self, tcp, peer, permit, Vec::new(), stop).await;
        };
        let handshake = tokio::time::timeout(self.limits.tls_handshake, acceptor.accept(tcp));
        let stream = tokio::select! {
            _ = stop.cancelled() => return,
            r = handshake => match r {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    metrics::counter!("twinhub_mqtt_tls_failures_total").increment(1);
                    tracing::debug!(%peer, "MQTT TLS handshake failed: {e}");
                    return;
                }
                Err(_) => {
                    metrics::counter!("twinhub_mqtt_tls_failures_total").increment(1);
                    tracing::debug!(%peer, "MQTT TLS handshake timed out");
                    return;
                }
            },
        };
        // The certificate chain an X.509 device sent (none for SAS devices), judged at CONNECT.
        let certs = stream.get_ref().1.peer_certificates().map(<[_]>::to_vec).unwrap_or_default();
        connection::run(self, stream, peer, permit, certs, stop).await
    }

    /// Serves one device connection over an already-secured byte stream: TLS on the MQTT port, or the
    /// payload of a WebSocket on the HTTPS port. `permit` comes from this endpoint's [`ConnGate`]. Such a
    /// stream carries no client certificate: over WebSockets only SAS identities log in.
    pub async fn connection<S>(
        self: Arc<Self>,
        stream: S,
        peer: SocketAddr,
        permit: ConnPermit,
        stop: CancellationToken,
    ) where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        connection::run(self, stream, peer, permit, Vec::new(), stop).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_zero_and_large_values_become_the_maximum() {
        let l = Limits::new(Duration::from_secs(10), 30);
        assert_eq!(l.keep_alive(0), 30, "no keep-alive is not forever");
        assert_eq!(l.keep_alive(10), 10);
        assert_eq!(l.keep_alive(30), 30);
        assert_eq!(l.keep_alive(u16::MAX), 30);
        assert_eq!((l.tls_handshake, l.connect), (Duration::from_secs(10), Duration::from_secs(10)));
        assert_eq!(Limits::new(Duration::from_secs(1), 0).keep_alive(0), 1, "a zero maximum would disable the bound");
        assert_eq!(Limits::default().keep_alive(0), 1740);
    }
}
