//! HTTPS serving: a TLS accept loop over an already-bound listener (tests bind port 0) with graceful
//! shutdown: stop accepting, then let open connections finish their requests (bounded wait).
//!
//! # What a stranger can make this hold
//! Every accepted socket first takes a slot from the listener's [`ConnGate`] (refused at once when the
//! listener, or its source, holds its maximum). Until one of its requests carries a valid credential
//! (see [`super::auth_first`]) the connection counts as unauthenticated: it has `handshake_timeout` for
//! the TLS handshake, and then may sit with no request in flight for at most `handshake_timeout`
//! again, and is closed three handshake timeouts after the accept whatever it asks for (the routes
//! that need no credential, `/health`, `/metrics`, the console's files, do not keep it open). A
//! request's head must arrive within `handshake_timeout` (hyper's header-read timer). An
//! authenticated connection may idle `idle_timeout` between requests. Request bodies are read only
//! after the credential check, at most [`super::BODY_LIMIT`] bytes, and each chunk must come within
//! `handshake_timeout`.
//!
//! # How a connection ends
//! A request refused for its body (too large) is answered before the client has sent all of it. If
//! the server then closed the socket with those bytes unread, the kernel would answer them with a
//! reset, and a reset makes the client's kernel drop what it had received but not yet handed over:
//! the client would see a broken connection instead of the 413. So, like a web server's lingering
//! close, a connection that ends, whichever way, shuts down its sending side first and then reads and
//! drops what still comes, until the client closes too, for at most [`LINGER_TIME`] and
//! [`LINGER_BYTES`], still holding its slot of the gate.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::direct::App;
use crate::net::{ConnGate, ConnPermit, NetLimits};

/// How long shutdown waits for in-flight requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long, and how many bytes, an ending connection reads and drops after shutting down its
/// sending side (see "How a connection ends" above).
const LINGER_TIME: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 1024 * 1024;
/// Largest request head (request line and headers) hyper buffers for HTTP/1.1.
const MAX_HEAD: usize = 64 * 1024;
/// HTTP/2 limits: concurrent streams per connection and the size of a header list.
const H2_MAX_STREAMS: u32 = 128;
const H2_MAX_HEADER_LIST: u32 = 64 * 1024;

/// What a connection's requests share with its watchdog: the gate slot (marked authenticated by the
/// first request with a valid credential), requests in flight and the time of the last I/O.
pub struct ConnState {
    permit: Mutex<ConnPermit>,
    /// The client's address (per-source budgets of protocols carried over this connection).
    peer: std::net::SocketAddr,
    in_flight: AtomicUsize,
    /// Milliseconds since `born` of the last byte read or written.
    last_io_ms: AtomicU64,
    born: Instant,
}

impl ConnState {
    fn new(permit: ConnPermit, peer: std::net::SocketAddr) -> Arc<ConnState> {
        Arc::new(ConnState {
            permit: Mutex::new(permit),
            peer,
            in_flight: AtomicUsize::new(0),
            last_io_ms: AtomicU64::new(0),
            born: Instant::now(),
        })
    }

    /// A request on this connection carried a valid credential.
    pub fn authenticated(&self) {
        self.permit.lock().unwrap_or_else(|p| p.into_inner()).authenticated();
    }

    pub fn peer(&self) -> std::net::SocketAddr {
        self.peer
    }

    fn is_authenticated(&self) -> bool {
        self.permit.lock().unwrap_or_else(|p| p.into_inner()).is_authenticated()
    }

    fn touch(&self) {
        self.last_io_ms.store(self.born.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_io_ms.load(Ordering::Relaxed));
        self.born.elapsed().saturating_sub(last)
    }

    /// Marks a request in flight until the guard is dropped (the response head is produced).
    pub fn request(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }
}

/// One request in flight on a connection (see [`ConnState::request`]).
pub struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The transport with every successful read and write recorded as activity. When it is dropped (the
/// connection ended, whichever way) it lingers (see "How a connection ends" above).
struct Watched<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> {
    /// Always `Some` until the drop hands it to the lingering task.
    inner: Option<S>,
    state: Arc<ConnState>,
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Watched<S> {
    fn new(inner: S, state: Arc<ConnState>) -> Watched<S> {
        Watched { inner: Some(inner), state }
    }

    /// The transport. Only the drop takes it, and nothing polls a value being dropped; should that
    /// ever change, the poll fails with an I/O error rather than panicking the connection's task.
    fn io(&mut self) -> std::io::Result<Pin<&mut S>> {
        self.inner
            .as_mut()
            .map(Pin::new)
            .ok_or_else(|| std::io::Error::other("a connection's transport used after it was dropped"))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> Drop for Watched<S> {
    fn drop(&mut self) {
        let (Some(io), Ok(runtime)) = (self.inner.take(), tokio::runtime::Handle::try_current()) else { return };
        // The gate slot stays taken while the socket lingers.
        let state = self.state.clone();
        runtime.spawn(async move {
            linger(io).await;
            drop(state);
        });
    }
}

/// Shuts down the sending side of `io`, then reads and drops what the peer still sends until it
/// closes, fails, or [`LINGER_TIME`] or [`LINGER_BYTES`] run out; then the socket is closed.
async fn linger<S: AsyncRead + AsyncWrite + Unpin>(mut io: S) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let drain = async {
        // A connection that already shut down (hyper does on a clean end) fails here harmlessly.
        let _ = io.shutdown().await;
        let mut scratch = [0u8; 8 * 1024];
        let mut left = LINGER_BYTES;
        while left > 0 {
            match io.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = match self.io() {
            Ok(io) => io.poll_read(cx, buf),
            Err(e) => return Poll::Ready(Err(e)),
        };
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.touch();
        }
        r
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let r = match self.io() {
            Ok(io) => io.poll_write(cx, buf),
            Err(e) => return Poll::Ready(Err(e)),
        };
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.state.touch();
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.io() {
            Ok(io) => io.poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.io() {
            Ok(io) => io.poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = match self.io() {
            Ok(io) => io.poll_write_vectored(cx, bufs),
            Err(e) => return Poll::Ready(Err(e)),
        };
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.state.touch();
        }
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.as_ref().is_some_and(|io| io.is_write_vectored())
    }
}

/// How long a connection may stay unauthenticated, counted from the accept, in handshake timeouts (30 s
/// by default): time for a page of the console and a few probes of `/health` or `/metrics`. Without it, a
/// stranger that keeps sending requests that need no credential would hold its slot for ever.
const UNAUTHENTICATED_LIFETIME: u32 = 3;

/// Resolves when the connection must close: idle (no request in flight, no I/O) for longer than it
/// may, `unauthenticated` until a request proved a credential and `authenticated` after; or still
/// unauthenticated [`UNAUTHENTICATED_LIFETIME`] handshake timeouts after the accept, once no request
/// is in flight (and one handshake timeout later at the latest).
async fn idle_watchdog(state: Arc<ConnState>, unauthenticated: Duration, authenticated: Duration) {
    let lifetime = unauthenticated * UNAUTHENTICATED_LIFETIME;
    loop {
        let authenticated_now = state.is_authenticated();
        let allowed = if authenticated_now { authenticated } else { unauthenticated };
        let idle = state.idle_for();
        let in_flight = state.in_flight.load(Ordering::Relaxed);
        if in_flight == 0 && idle >= allowed {
            return;
        }
        let mut wait = allowed.saturating_sub(idle);
        if !authenticated_now {
            let age = state.born.elapsed();
            if age >= lifetime && (in_flight == 0 || age >= lifetime + unauthenticated) {
                tracing::debug!(peer = %state.peer, "connection closed: no credential within {lifetime:?}");
                return;
            }
            wait = wait.min(lifetime.saturating_sub(age));
        }
        tokio::time::sleep(wait.max(Duration::from_millis(200))).await;
    }
}

fn builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).max_buf_size(MAX_HEAD);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .max_header_list_size(H2_MAX_HEADER_LIST);
    builder
}

pub async fn serve(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    app: App,
    gate: Arc<ConnGate>,
    limits: NetLimits,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(tls);
    let graceful = GracefulShutdown::new();
    let mut builder = builder();
    builder.http1().header_read_timeout(limits.handshake_timeout);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Usually EMFILE: back off rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Refused connections are closed at once, before any handshake work.
        let Ok(permit) = gate.admit(peer.ip()) else { continue };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let state = ConnState::new(permit, peer);
        let service = app.for_connection(state.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let limits = limits.clone();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, "TLS handshake failed: {e}");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            state.touch();
            let io = TokioIo::new(Watched::new(stream, state.clone()));
            let conn = builder.serve_connection_with_upgrades(io, service);
            let watchdog = idle_watchdog(state, limits.handshake_timeout, limits.idle_timeout);
            tokio::select! {
                r = watcher.watch(conn.into_owned()) => if let Err(e) = r {
                    tracing::debug!(%peer, "connection ended: {e}");
                },
                () = watchdog => tracing::debug!(%peer, "idle connection closed"),
            }
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(DRAIN_TIMEOUT) => tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; closing"),
    }
}
