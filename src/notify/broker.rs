//! The back-end event broker: rumqttd, with clients authenticated by a policy SAS token, publishing the
//! change feed on `twin-changes/{deviceId}[/{moduleId}]`.
//!
//! # Shape
//! ```text
//! back end ──TLS──▶ public listener (bound by the node, port 0 allowed)
//!                   connection permit (net::ConnGate) taken before the TLS handshake
//!                   gate.rs: TLS termination, CONNECT check (CONNACK refusal), PUBLISH refused
//!                        │ plain TCP, CONNECT rewritten with the internal login
//!                        ▼
//!                   rumqttd v4 server on 127.0.0.1:<free port>   (its own thread + runtime)
//!                        ▲ local link "twinhub-feed" (QoS 0 publishes)
//!                   feed thread: hub.changes(None) → one publish per event
//! ```
//! rumqttd binds its listener from its config and cannot take an already-bound socket, so it listens
//! on a loopback port picked by binding `127.0.0.1:0` and releasing it; the node's public listener is
//! served by the gate, which forwards to that port.
//!
//! # Security
//! Clients log in with username = policy name and password = a SAS token of that policy granting
//! `ServiceConnect` (`sr` = the hub host name, with or without a port). The gate checks the login and
//! answers a refusal with a CONNACK code. rumqttd itself accepts only the per-process internal login
//! the gate forwards instead of the token ([`internal`]), so a local process connecting to the loopback
//! port directly, even with a valid policy token, cannot log in. rumqttd 0.20 has no per-topic ACL and
//! no way to forbid client publishes, so the gate refuses wills and closes any client connection that
//! sends a PUBLISH: only the node's feed link publishes on `twin-changes/...`. Subscriptions are not
//! restricted (every authorised back end may read every twin's changes, as with `ServiceConnect` on the
//! REST API), but bounded: rumqttd keeps a log per distinct filter for its whole life, so the gate
//! admits at most `--max-event-filters` distinct filters per node and closes a connection whose
//! SUBSCRIBE would add more; it clamps keep-alives as the device front door does, and gives back ends
//! without a client id one from a reused pool (see [`gate`]).
//!
//! # Connection bounds
//! Every accepted socket takes a permit of the node's `events` [`ConnGate`] before anything else; a
//! refused one is closed at once. Until rumqttd accepts its CONNECT the connection is unauthenticated,
//! and the TLS handshake and the CONNECT each get the node's handshake timeout, so strangers only ever
//! fill the small unauthenticated budget (per source and per listener), never the slots of back ends
//! that logged in. rumqttd's own connection limit follows the gate's cap.
//!
//! # Delivery
//! At most once (QoS 0) and live only: subscribers get what is published while they are subscribed.
//! The broker's feed consumer coalesces like any other; if it ever falls `feed_queue` events behind, a
//! `{"resync": {"position", "reason"}}` message goes to `twin-changes-resync`. Back ends that need
//! resumption use the SSE feed (`GET /twin-changes` with `Last-Event-ID`). Ids in topics are escaped:
//! `%` → `%25`, `+` → `%2B`, `#` → `%23` (legal in IoT Hub ids, wildcards in MQTT).
//!
//! # Shutdown
//! On `stop` the gate stops accepting and its relays end, rumqttd's server thread drops its runtime
//! (closing every broker connection), and the hub is closed so that feed consumers (the broker's and
//! SSE streams) end rather than hold the HTTP drain open. rumqttd's router thread has no stop and
//! stays parked until the process exits.

mod gate;
mod internal;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rumqttd::local::{LinkBuilder, LinkTx};
use rumqttd::protocol::v4::V4;
use rumqttd::protocol::{Packet, Publish};
use rumqttd::{ConnectionSettings, LinkType, RouterConfig, Server, ServerSettings};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

pub use self::gate::ClientLimits;
use self::gate::Gate;
use self::internal::InternalLogin;
use super::{ChangeEvent, FeedItem, Hub};
use crate::auth::Policies;
use crate::net::ConnGate;

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("event broker: {0}")]
    Start(String),
}

/// rumqttd connections beyond the gate's cap: the node's own feed link, and room for connections the
/// gate has let go of that rumqttd has not noticed closing yet.
const INTERNAL_SLACK: usize = 16;
/// Largest event the broker carries (a replaced twin with full tags, desired and reported, metadata).
const MAX_EVENT: usize = 1024 * 1024;
/// Feed items the broker's feed thread takes and hands to rumqttd at once, at most.
const FEED_BATCH: usize = 64;
/// Where a resync of the broker's own feed consumer is announced (outside `twin-changes/#` on purpose:
/// `$resync` would be a legal device id).
pub const RESYNC_TOPIC: &str = "twin-changes-resync";

/// The topic of an event: `twin-changes/{deviceId}[/{moduleId}]`, ids escaped.
pub fn topic_of(e: &ChangeEvent) -> String {
    let mut topic = String::with_capacity(14 + e.device_id.len() + e.module_id.as_ref().map_or(0, |m| m.len() + 1));
    topic.push_str("twin-changes/");
    escape_into(&mut topic, &e.device_id);
    if let Some(m) = &e.module_id {
        topic.push('/');
        escape_into(&mut topic, m);
    }
    topic
}

/// `%` → `%25`, `+` → `%2B`, `#` → `%23`: legal in ids, wildcards (and the escape) in MQTT topics.
fn escape_into(topic: &mut String, id: &str) {
    for c in id.chars() {
        match c {
            '%' => topic.push_str("%25"),
            '+' => topic.push_str("%2B"),
            '#' => topic.push_str("%23"),
            c => topic.push(c),
        }
    }
}

/// `{"properties", "body", "merged", "position"}`.
pub fn payload_of(e: &ChangeEvent) -> Vec<u8> {
    e.to_json_bytes(true)
}

/// A free loopback port for rumqttd (bound and released: rumqttd binds it again itself).
fn free_loopback_port() -> Result<SocketAddr, BrokerError> {
    let l =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| BrokerError::Start(format!("no loopback port: {e}")))?;
    l.local_addr().map_err(|e| BrokerError::Start(format!("no loopback port: {e}")))
}

/// rumqttd's settings: as many connections as the gate admits (plus slack), the gate's CONNECT timeout,
/// and an auth handler that knows only the internal login.
fn rumqttd_settings(
    listen: SocketAddr,
    max_clients: usize,
    connect_timeout: Duration,
    login: Arc<InternalLogin>,
) -> (RouterConfig, ServerSettings) {
    let router = RouterConfig {
        max_connections: max_clients + INTERNAL_SLACK,
        max_outgoing_packet_count: 200,
        // Each subscribed filter keeps at most this much of its log in memory.
        max_segment_size: 4 * MAX_EVENT,
        max_segment_count: 3,
        ..Default::default()
    };
    let mut connections = ConnectionSettings {
        connection_timeout_ms: u16::try_from(connect_timeout.as_millis()).unwrap_or(u16::MAX),
        max_payload_size: MAX_EVENT,
        max_inflight_count: 100,
        auth: None,
        external_auth: None,
        dynamic_filters: false,
    };
    connections.set_auth_handler(move |client_id: String, user: String, pass: String| {
        let ok = login.verify(&user, &pass);
        if !ok {
            // Only the gate knows the login: this is a local process trying the loopback port.
            metrics::counter!("twinhub_notify_broker_internal_login_refused_total").increment(1);
            tracing::warn!(%client_id, %user, "internal event broker login refused: not the gate's");
        }
        std::future::ready(ok)
    });
    let server =
        ServerSettings { name: "twinhub-events".into(), listen, tls: None, next_connection_delay_ms: 0, connections };
    (router, server)
}

/// rumqttd's server and the builder of the local link the feed publishes through, both on one router.
/// (rumqttd does not export its router channel's type, so both are made where it is inferred.)
fn build_rumqttd(router: RouterConfig, server: ServerSettings) -> (Server<V4>, LinkBuilder<'static>) {
    let router_tx = rumqttd::Router::new(0, router).spawn();
    let link = LinkBuilder::new("twinhub-feed", router_tx.clone());
    (Server::new(server, router_tx, V4), link)
}

/// Runs rumqttd's v4 server on its own thread and runtime until `stop` fires (dropping the runtime
/// closes every broker connection).
fn start_rumqttd(mut server: Server<V4>, stop: oneshot::Receiver<()>) -> Result<(), BrokerError> {
    std::thread::Builder::new()
        .name("twinhub-broker".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return tracing::error!("event broker runtime: {e}"),
            };
            rt.block_on(async move {
                tokio::select! {
                    r = server.start(LinkType::Remote) => if let Err(e) = r {
                        tracing::error!("event broker stopped: {e}");
                    },
                    _ = stop => {}
                }
            });
        })
        .map(|_| ())
        .map_err(|e| BrokerError::Start(format!("broker thread: {e}")))
}

/// Publishes the change feed through a local link, on its own thread: rumqttd's link calls block on
/// the router's channel, which must not stall a tokio worker.
///
/// After a batch that did not fill [`FEED_BATCH`], the thread waits `batch` before it takes the next:
/// under load the events of that moment then leave together, and rumqttd's router, its connection
/// task and the gate's TLS relay each wake once for them instead of once per event. Publishers do
/// not wait (their wake-ups meanwhile cost nothing: nobody is parked), and a quiet feed is not
/// delayed beyond that one wait: the thread sleeps only after it has just published.
fn start_feed(
    hub: Arc<Hub>,
    link: LinkBuilder<'static>,
    gate: Arc<ConnGate>,
    batch: Duration,
) -> Result<(), BrokerError> {
    // A subscription lives on a client connection, and the gate counts a connection from before its
    // CONNECT: with none open, no one can receive what would be published.
    let mut feed = hub.changes_while(Arc::new(move || gate.open() > 0));
    std::thread::Builder::new()
        .name("twinhub-broker-feed".into())
        .spawn(move || {
            let (mut tx, _rx, _ack) = match link.build() {
                Ok(link) => link,
                Err(e) => return tracing::error!("event broker feed link: {e}"),
            };
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return tracing::error!("event broker feed runtime: {e}"),
            };
            rt.block_on(async move {
                let mut items = Vec::with_capacity(FEED_BATCH);
                while feed.next_batch(&mut items, FEED_BATCH).await {
                    let full = items.len() >= FEED_BATCH;
                    if let Err(e) = publish(&mut tx, &mut items) {
                        tracing::error!("event broker feed stopped: {e}");
                        return;
                    }
                    if !full && !batch.is_zero() {
                        tokio::time::sleep(batch).await;
                    }
                }
            });
        })
        .map(|_| ())
        .map_err(|e| BrokerError::Start(format!("broker feed thread: {e}")))
}

/// Publishes `items` (and empties it). All but the last go straight into the link's buffer; publishing
/// the last wakes rumqttd's router once for all of them, which then routes the whole buffer in one
/// pass instead of one channel message and one wake-up per event.
fn publish(tx: &mut LinkTx, items: &mut Vec<FeedItem>) -> Result<(), Box<rumqttd::local::LinkError>> {
    let events = items.iter().filter(|i| matches!(i, FeedItem::Event(_))).count() as u64;
    // Rendered before the link's buffer is locked: the router thread takes that lock to drain it.
    let mut messages: Vec<Publish> = items.drain(..).map(message_of).collect();
    let Some(last) = messages.pop() else { return Ok(()) };
    if !messages.is_empty() {
        tx.buffer().extend(messages.into_iter().map(|m| Packet::Publish(m, None)));
    }
    tx.publish(last.topic, last.payload)?;
    metrics::counter!("twinhub_notify_broker_published_total").increment(events);
    Ok(())
}

/// The broker message for one feed item: the event on its twin's topic, or a resync notice.
fn message_of(item: FeedItem) -> Publish {
    match item {
        FeedItem::Event(e) => Publish::new(Bytes::from(topic_of(&e)), Bytes::from(payload_of(&e)), false),
        FeedItem::Resync { position, reason } => {
            tracing::warn!(%position, %reason, "event broker feed fell behind; subscribers must resync");
            let msg = serde_json::json!({"resync": {"position": position, "reason": reason}});
            Publish::new(Bytes::from_static(RESYNC_TOPIC.as_bytes()), Bytes::from(msg.to_string()), false)
        }
    }
}

/// Serves the event broker on `listener` (TLS with `tls`) until `stop`. `gate` bounds the connections it
/// holds; `handshake_timeout` bounds the TLS handshake and, again, the wait for CONNECT; `limits` what
/// back ends may make rumqttd keep.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    hub: Arc<Hub>,
    policies: Arc<Policies>,
    host: String,
    gate: Arc<ConnGate>,
    handshake_timeout: Duration,
    limits: ClientLimits,
    batch: Duration,
    stop: CancellationToken,
) -> Result<(), BrokerError> {
    // Closing the hub on stop ends every feed consumer (SSE streams included) so that the HTTP drain
    // does not wait for them, whatever happens to the broker below.
    {
        let (hub, stop) = (hub.clone(), stop.clone());
        tokio::spawn(async move {
            stop.cancelled().await;
            hub.close();
        });
    }
    let internal = free_loopback_port()?;
    let login = Arc::new(InternalLogin::generate());
    let (router_config, server) =
        rumqttd_settings(internal, gate.limits().max_connections, handshake_timeout, login.clone());
    let (server, link) = build_rumqttd(router_config, server);
    let (stop_server, server_stopped) = oneshot::channel();
    start_rumqttd(server, server_stopped)?;
    start_feed(hub.clone(), link, gate.clone(), batch)?;
    tracing::info!(public = ?listener.local_addr().ok(), %internal, "event broker ready");

    let relay = Arc::new(Gate::new(internal, policies, Arc::from(host.as_str()), login, handshake_timeout, limits));
    let acceptor = TlsAcceptor::from(tls);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!("event broker accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        // Refused sockets are closed at once, before any TLS work.
        let Ok(mut permit) = gate.admit(peer.ip()) else { continue };
        let _ = tcp.set_nodelay(true);
        let (acceptor, relay, stop) = (acceptor.clone(), relay.clone(), stop.clone());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return tracing::debug!(%peer, "event broker TLS handshake failed: {e}"),
                Err(_) => return tracing::debug!(%peer, "event broker TLS handshake timed out"),
            };
            metrics::gauge!("twinhub_notify_broker_clients").increment(1.0);
            tokio::select! {
                r = relay.relay(stream, &mut permit) => match r {
                    Ok(()) => tracing::debug!(%peer, "event broker client left"),
                    Err(e) => tracing::info!(%peer, "event broker client closed: {e}"),
                },
                () = stop.cancelled() => {}
            }
            metrics::gauge!("twinhub_notify_broker_clients").decrement(1.0);
            drop(permit);
        });
    }
    drop(listener);
    let _ = stop_server.send(());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::JsonText;
    use crate::notify::Source;

    #[test]
    fn topics_escape_mqtt_wildcards_and_payload_has_the_position() {
        let mut e = ChangeEvent {
            position: "ep-5".into(),
            source: Source::TwinChangeEvents,
            device_id: "a+b#c%d".into(),
            module_id: None,
            properties: vec![],
            body: JsonText::render(&serde_json::json!({"version": 2})),
            merged: 1,
        };
        assert_eq!(topic_of(&e), "twin-changes/a%2Bb%23c%25d");
        e.module_id = Some("m".into());
        assert_eq!(topic_of(&e), "twin-changes/a%2Bb%23c%25d/m");
        let p: serde_json::Value = serde_json::from_slice(&payload_of(&e)).unwrap();
        assert_eq!(p["position"], "ep-5");
        assert_eq!(p["body"]["version"], 2);
        assert_eq!(p["properties"]["iothub-message-source"], "twinChangeEvents");
    }
}
