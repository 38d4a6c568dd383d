//! One device connection, bound to one identity at CONNECT.
//!
//! Two tasks: this one reads packets, runs twin requests and forwards desired pushes; a writer task owns
//! the socket's write half behind a bounded queue. Twin requests are pipelined: each becomes a future in
//! a `FuturesOrdered`, so the read loop keeps reading while they run, and their answers and PUBACKs leave
//! in the order the requests arrived (MQTT requires PUBACKs in order). The futures are first polled in
//! the order they were pushed, so a connection's writes reach its twin's actor (which orders them behind
//! each other) in arrival order. A GET waits for the writes received before it, so it sees them.
//!
//! PUBACK timing: a QoS 1 request is acknowledged after it has been processed (answer first, then
//! PUBACK). If the connection drops before, the client re-sends it (DUP) after reconnecting and the
//! session's `$rid` memory turns the re-send into the same request id, which the state machine applies
//! at most once. Telemetry and unanswerable requests are acknowledged in order with the rest.
//!
//! Direct method calls come in from the node's method registry (see `methods.rs`): each is published
//! with a `$rid` this connection generates and waits in `pending_methods` for the device's answer on
//! `$iothub/methods/res/{status}/?$rid=…`.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::stream::{FuturesOrdered, StreamExt};
use rumqttd::protocol::{ConnAckProperties, Packet, Publish};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::codec::{self, Codec, DecodeError, Out, Version};
use super::connect::{Credentials, Login};
use super::error::{Close, ConnAckCode, Refusal, RequestError};
use super::methods::{MethodCall, MethodError, MethodReply, MAX_PENDING};
use super::session::{lock, Session, SessionRequest, StateSync, MAX_SESSION_EXPIRY};
use super::topics::{self, Inbound, TwinRequest};
use super::Mqtt;
use crate::ids::TwinId;
use crate::model::{now_ms, validate_reported_patch_text, Applied, Command, Op};
use crate::net::ConnPermit;
use crate::notify::{DesiredPush, DesiredPushes};

/// Entry point for an accepted transport (TLS already done). `permit` is the connection's slot in the
/// listener's budget: unauthenticated until CONNECT is accepted, held until the connection ends.
/// `certs` is the TLS client certificate chain, leaf first (empty when the client sent none).
pub async fn run<S>(
    mqtt: Arc<Mqtt>,
    stream: S,
    peer: SocketAddr,
    permit: ConnPermit,
    certs: Vec<rustls::pki_types::CertificateDer<'static>>,
    stop: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut buf = BytesMut::with_capacity(4096);
    let first = tokio::select! {
        _ = stop.cancelled() => return,
        r = tokio::time::timeout(mqtt.limits.connect, read_connect(&mut rd, &mut buf, mqtt.limits.max_connect)) => r,
    };
    let (codec, packet) = match first {
        Err(_) => {
            metrics::counter!("twinhub_mqtt_connects_total", "result" => "timeout").increment(1);
            tracing::debug!(%peer, "no CONNECT within {:?}; closing", mqtt.limits.connect);
            return;
        }
        Ok(Err(close)) => {
            metrics::counter!("twinhub_mqtt_connects_total", "result" => "malformed").increment(1);
            tracing::debug!(%peer, "closing before CONNECT: {close}");
            return;
        }
        Ok(Ok(FirstPacket::Unsupported(level))) => {
            refuse_raw(&mut wr, &codec::CONNACK_UNSUPPORTED_LEVEL).await;
            let r = Refusal::UnsupportedProtocol(level);
            metrics::counter!("twinhub_mqtt_connects_total", "result" => r.label()).increment(1);
            tracing::info!(%peer, "CONNECT refused: {r}");
            return;
        }
        Ok(Ok(FirstPacket::Connect(codec, packet))) => (codec, packet),
    };
    let Packet::Connect(connect, props, will, _, login) = *packet else {
        tracing::debug!(%peer, "first packet is not CONNECT");
        return;
    };
    let client_id = connect.client_id.clone();
    let creds = Credentials {
        client_id: &client_id,
        username: login.as_ref().map(|l| l.username.as_str()),
        password: login.as_ref().map(|l| l.password.as_str()),
        certs: &certs,
    };
    let id = tokio::select! {
        _ = stop.cancelled() => return,
        r = mqtt.authenticate(&creds) => r,
    };
    let login = match id {
        Ok(login) => login,
        Err(r) => {
            metrics::counter!("twinhub_mqtt_connects_total", "result" => r.label()).increment(1);
            tracing::info!(%peer, client_id, version = ?codec.version(), "CONNECT refused: {r}");
            let mut out = BytesMut::new();
            codec.encode(Out::ConnAck { session_present: false, code: r.code(), properties: None }, &mut out);
            refuse_raw(&mut wr, &out).await;
            return;
        }
    };
    if will.is_some() {
        tracing::debug!(client_id, "ignoring the CONNECT's will: IoT Hub does not support wills");
    }
    let span = tracing::info_span!("mqtt", client_id = %client_id, %peer);
    let hello = Authenticated { connect, props, login, permit };
    Connection::start(mqtt, codec, hello, rd, wr, buf, stop).instrument(span).await
}

enum FirstPacket {
    Connect(Codec, Box<Packet>),
    Unsupported(u8),
}

/// Reads until the first packet (which must be CONNECT) is complete.
async fn read_connect<R>(rd: &mut R, buf: &mut BytesMut, max: usize) -> Result<FirstPacket, Close>
where
    R: AsyncRead + Unpin,
{
    loop {
        let decode_err = |e: DecodeError| match e {
            DecodeError::TooLarge(n) => Close::TooLarge(n),
            DecodeError::Malformed(m) => Close::Malformed(m),
        };
        match codec::sniff_connect(buf, max).map_err(decode_err)? {
            Some(codec::Hello::Unsupported(level)) => return Ok(FirstPacket::Unsupported(level)),
            Some(codec::Hello::Level(v)) => {
                let mut codec = Codec::new(v);
                return match codec.decode(buf, max).map_err(decode_err)? {
                    Some(p @ Packet::Connect(..)) => Ok(FirstPacket::Connect(codec, Box::new(p))),
                    _ => Err(Close::Malformed("CONNECT could not be decoded".into())),
                };
            }
            None => {
                buf.reserve(1024);
                if rd.read_buf(buf).await? == 0 {
                    return Err(Close::PeerClosed);
                }
            }
        }
    }
}

/// Writes a refusal and closes, without waiting long for a peer that does not read.
async fn refuse_raw<W: AsyncWrite + Unpin>(wr: &mut W, bytes: &[u8]) {
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        wr.write_all(bytes).await?;
        wr.shutdown().await
    })
    .await;
}

/// An authenticated CONNECT.
struct Authenticated {
    connect: rumqttd::protocol::Connect,
    props: Option<rumqttd::protocol::ConnectProperties>,
    login: Login,
    /// Still unauthenticated: it becomes authenticated once CONNACK 0 is on its way.
    permit: ConnPermit,
}

/// The outcome of one twin request (or of a PUBLISH that only needs its PUBACK), in arrival order.
struct Done {
    /// The request kind for metrics; `None` for acknowledgement-only entries.
    kind: Option<TwinRequest>,
    status: u16,
    response: Option<Publish>,
    puback: Option<u16>,
    /// A reported patch: GETs received after it wait for it.
    write: bool,
    started: Instant,
}

impl Done {
    fn ack_only(pkid: u16) -> Done {
        Done { kind: None, status: 0, response: None, puback: Some(pkid), write: false, started: Instant::now() }
    }

    fn answer(
        kind: TwinRequest,
        status: u16,
        topic: String,
        body: Vec<u8>,
        puback: Option<u16>,
        started: Instant,
    ) -> Done {
        let response = codec::outgoing_publish(&topic, Bytes::from(body), 0, 0);
        Done { kind: Some(kind), status, response: Some(response), puback, write: false, started }
    }

    fn error(kind: TwinRequest, rid: &str, e: RequestError, puback: Option<u16>, started: Instant) -> Done {
        let (status, _) = e.classify();
        Done::answer(kind, status, topics::response_topic(status, rid, None), e.body(), puback, started)
    }
}

/// Decrements the connection gauge however the connection ends.
struct Gauge;

impl Gauge {
    fn open() -> Gauge {
        metrics::gauge!("twinhub_mqtt_connections").increment(1.0);
        Gauge
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        metrics::gauge!("twinhub_mqtt_connections").decrement(1.0);
    }
}

struct Connection {
    mqtt: Arc<Mqtt>,
    id: TwinId,
    client_id: String,
    generation: u64,
    codec: Codec,
    session: Arc<Mutex<Session>>,
    out: mpsc::Sender<Out>,
    ops: FuturesOrdered<BoxFuture<'static, Done>>,
    /// Reported patches pushed so far, and (through the channel) how many of them have finished.
    writes_issued: u64,
    writes_done: watch::Sender<u64>,
    /// Packet ids of QoS 1 pushes not yet acknowledged.
    unacked: HashSet<u16>,
    max_unacked: usize,
    next_pkid: u16,
    /// `$version` of the last desired push sent on this connection: what a device sees only increases.
    last_push: Option<i64>,
    /// Method calls published to the device and not answered yet, by the `$rid` they were sent with.
    pending_methods: HashMap<String, oneshot::Sender<Result<MethodReply, MethodError>>>,
    next_method_rid: u64,
    /// The session outlives the connection: its subscriptions are kept through Raft.
    persistent: bool,
}

impl Connection {
    /// After authentication: session, CONNACK, the loop, and the orderly end.
    async fn start<R, W>(
        mqtt: Arc<Mqtt>,
        codec: Codec,
        hello: Authenticated,
        mut rd: R,
        mut wr: W,
        mut buf: BytesMut,
        stop: CancellationToken,
    ) where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let limits = mqtt.limits.clone();
        let Authenticated { connect, props, login, mut permit } = hello;
        let id = login.id;
        let v5 = codec.version() == Version::V5;
        let (expiry, expiry_capped) = match (v5, connect.clean_session) {
            (false, true) => (Duration::ZERO, false),
            (false, false) => (MAX_SESSION_EXPIRY, false),
            (true, _) => {
                let asked =
                    Duration::from_secs(props.as_ref().and_then(|p| p.session_expiry_interval).unwrap_or(0).into());
                (asked.min(MAX_SESSION_EXPIRY), asked > MAX_SESSION_EXPIRY)
            }
        };
        let keep_alive = limits.keep_alive(connect.keep_alive);
        let client_max_packet = props.as_ref().and_then(|p| p.max_packet_size).map_or(usize::MAX, |m| m as usize);
        let client_receive_max = props.as_ref().and_then(|p| p.receive_maximum).map_or(usize::MAX, usize::from);
        // Register for pushes before CONNACK: nothing committed after the device is told it is
        // connected can be missed.
        let mut pushes = mqtt.hub.desired_pushes(&id);
        let attached =
            mqtt.sessions.attach(&connect.client_id, SessionRequest { clean_start: connect.clean_session, expiry });
        let persistent = !expiry.is_zero();
        let present = match persistent {
            true => restore_stored_session(&mqtt, &id, &attached.session).await.unwrap_or(attached.present),
            false => false,
        };
        if !persistent && login.stored_subscriptions {
            // Before CONNACK, so that a persistent connect right after this one cannot find them.
            discard_stored_session(&mqtt, &id).await;
        }
        let properties = v5.then(|| ConnAckProperties {
            session_expiry_interval: expiry_capped.then(|| MAX_SESSION_EXPIRY.as_secs() as u32),
            receive_max: Some(u16::try_from(limits.max_in_flight).unwrap_or(u16::MAX)),
            max_qos: Some(1),
            retain_available: Some(0),
            max_packet_size: Some(u32::try_from(limits.max_packet).unwrap_or(u32::MAX)),
            wildcard_subscription_available: Some(1),
            subscription_identifiers_available: Some(0),
            shared_subscription_available: Some(0),
            server_keep_alive: (keep_alive != connect.keep_alive).then_some(keep_alive),
            ..Default::default()
        });
        let mut hello_bytes = BytesMut::new();
        codec.encode(
            Out::ConnAck { session_present: present, code: ConnAckCode::Accepted, properties },
            &mut hello_bytes,
        );
        let sent = tokio::time::timeout(limits.outbound_stall, wr.write_all(&hello_bytes)).await;
        if !matches!(sent, Ok(Ok(()))) {
            tracing::debug!("could not send CONNACK");
            finish_session(&mqtt, &connect.client_id, attached.generation, &id, limits.drain).await;
            return;
        }
        // From here on the connection no longer counts against the small unauthenticated budget.
        permit.authenticated();
        metrics::counter!("twinhub_mqtt_connects_total", "result" => "accepted").increment(1);
        tracing::info!(
            identity = %id,
            version = ?codec.version(),
            keep_alive,
            clean_start = connect.clean_session,
            session_present = present,
            "MQTT connection accepted"
        );
        let _gauge = Gauge::open();
        // Method calls may reach this connection from now on (and no longer reach an older one).
        let (mut calls, _methods) = mqtt.methods.attach(&id);
        {
            // Connected is reported in the background: CONNACK does not wait for a Raft commit.
            let (mqtt, sync, client_id, id) =
                (mqtt.clone(), attached.state_sync.clone(), connect.client_id.clone(), id.clone());
            tokio::spawn(async move { sync_connection_state(&mqtt, &sync, &client_id, &id).await }.in_current_span());
        }

        let (out, rx) = mpsc::channel(limits.outbound_queue);
        let writer_gone = CancellationToken::new();
        let writer =
            tokio::spawn(write_loop(wr, codec.clone(), rx, client_max_packet, writer_gone.clone()).in_current_span());
        let mut conn = Connection {
            mqtt: mqtt.clone(),
            id,
            client_id: connect.client_id,
            generation: attached.generation,
            codec,
            session: attached.session,
            out,
            ops: FuturesOrdered::new(),
            writes_issued: 0,
            writes_done: watch::Sender::new(0),
            unacked: HashSet::new(),
            max_unacked: limits.max_unacked.min(client_receive_max).max(1),
            next_pkid: 0,
            last_push: None,
            pending_methods: HashMap::new(),
            next_method_rid: 0,
            persistent,
        };
        let close = conn
            .run(&mut rd, &mut buf, &mut pushes, &mut calls, &stop, &attached.taken_over, &writer_gone, keep_alive)
            .await;
        drop(pushes);
        conn.close(close, writer, rd).await;
        drop(permit);
    }

    #[allow(clippy::too_many_arguments)]
    async fn run<R>(
        &mut self,
        rd: &mut R,
        buf: &mut BytesMut,
        pushes: &mut DesiredPushes,
        calls: &mut mpsc::Receiver<MethodCall>,
        stop: &CancellationToken,
        taken_over: &CancellationToken,
        writer_gone: &CancellationToken,
        keep_alive: u16,
    ) -> Close
    where
        R: AsyncRead + Unpin,
    {
        let max_packet = self.mqtt.limits.max_packet;
        let max_in_flight = self.mqtt.limits.max_in_flight;
        // 1.5 × keep-alive without any packet closes the connection, as MQTT prescribes. `keep_alive`
        // is never 0 here (see `Limits::keep_alive`), so every connection has an idle bound.
        let grace = idle_grace(keep_alive);
        let idle = tokio::time::sleep(grace);
        tokio::pin!(idle);
        loop {
            let can_read = self.ops.len() < max_in_flight;
            if can_read {
                match self.codec.decode(buf, max_packet) {
                    Ok(Some(packet)) => {
                        idle.as_mut().reset(tokio::time::Instant::now() + grace);
                        if let Err(c) = self.on_packet(packet).await {
                            return c;
                        }
                        continue;
                    }
                    Ok(None) => {}
                    Err(DecodeError::TooLarge(n)) => return Close::TooLarge(n),
                    Err(DecodeError::Malformed(m)) => return Close::Malformed(m),
                }
                if buf.capacity() - buf.len() < 1024 {
                    buf.reserve(8 * 1024);
                }
            }
            let can_push = self.unacked.len() < self.max_unacked;
            let step = tokio::select! {
                biased;
                _ = stop.cancelled() => Err(Close::ShuttingDown),
                _ = taken_over.cancelled() => Err(Close::TakenOver),
                _ = writer_gone.cancelled() => Err(Close::WriterGone),
                Some(done) = self.ops.next(), if !self.ops.is_empty() => self.on_done(done).await,
                push = pushes.next(), if can_push => match push {
                    Some(p) => self.on_push(p).await,
                    None => Err(Close::PushesLost),
                },
                Some(call) = calls.recv() => self.on_method_call(call).await,
                r = rd.read_buf(buf), if can_read => match r {
                    Ok(0) => Err(Close::PeerClosed),
                    Ok(_) => Ok(()),
                    Err(e) => Err(Close::Io(e)),
                },
                _ = &mut idle, if can_read => Err(Close::KeepAlive(keep_alive)),
            };
            if let Err(c) = step {
                return c;
            }
        }
    }

    async fn on_packet(&mut self, packet: Packet) -> Result<(), Close> {
        match packet {
            Packet::Publish(p, _) => self.on_publish(p),
            Packet::PubAck(ack, _) => {
                if !self.unacked.remove(&ack.pkid) {
                    tracing::debug!(pkid = ack.pkid, "PUBACK for no pending push");
                }
                Ok(())
            }
            Packet::Subscribe(s, _) => {
                let granted: Vec<Option<u8>> = {
                    let mut session = lock(&self.session);
                    s.filters.iter().map(|f| session.subscribe(&f.path, f.qos as u8)).collect()
                };
                for (f, g) in s.filters.iter().zip(&granted) {
                    match g {
                        Some(q) => tracing::debug!(filter = f.path, granted = q, "subscribed"),
                        None => tracing::info!(filter = f.path, "subscription refused"),
                    }
                }
                self.store_subscriptions().await;
                self.send(Out::SubAck { pkid: s.pkid, granted }).await
            }
            Packet::Unsubscribe(u, _) => {
                let existed = {
                    let mut session = lock(&self.session);
                    u.filters.iter().map(|f| session.unsubscribe(f)).collect()
                };
                self.store_subscriptions().await;
                self.send(Out::UnsubAck { pkid: u.pkid, existed }).await
            }
            Packet::PingReq(_) => self.send(Out::PingResp).await,
            Packet::Disconnect(..) => Err(Close::ClientDisconnect),
            Packet::Connect(..) => Err(Close::Protocol("second CONNECT".into())),
            Packet::PubRec(..) | Packet::PubRel(..) | Packet::PubComp(..) => {
                Err(Close::Protocol("QoS 2 flow packet, but QoS 2 is not supported".into()))
            }
            Packet::ConnAck(..) | Packet::SubAck(..) | Packet::UnsubAck(..) | Packet::PingResp(..) => {
                Err(Close::Protocol("server-to-client packet sent by the client".into()))
            }
        }
    }

    /// Classifies a PUBLISH in this identity's scope and queues its processing.
    fn on_publish(&mut self, p: Publish) -> Result<(), Close> {
        let header = codec::publish_header(&p);
        if header.qos >= 2 {
            return Err(Close::QoS2);
        }
        let puback = (header.qos == 1).then_some(header.pkid);
        let topic = std::str::from_utf8(&p.topic).map_err(|_| Close::Malformed("topic is not UTF-8".into()))?;
        // A topic name never holds a wildcard or a NUL (MQTT 3.1.1, 3.3.2-2 and 1.5.3): the request id
        // is echoed into the answer's topic, which would then be no topic name at all.
        if topic.contains(['+', '#', '\0']) {
            return Err(Close::Malformed(format!("the topic name {topic:?} holds a wildcard or NUL")));
        }
        let started = Instant::now();
        match topics::classify(topic, &self.id) {
            Inbound::Twin { kind: TwinRequest::Get, rid } => {
                let op = self.get(rid.to_string(), puback, started);
                self.ops.push_back(op);
            }
            Inbound::Twin { kind: TwinRequest::PatchReported, rid } => {
                let rid = rid.to_string();
                self.patch_reported(rid, p.payload, header.dup, puback, started);
            }
            Inbound::BadTwinQuery { kind, rid, why } => {
                let done = Done::error(kind, rid, RequestError::BadRequest(why), puback, started);
                self.ops.push_back(Box::pin(std::future::ready(done)));
            }
            Inbound::NoRid { kind, why } => {
                metrics::counter!("twinhub_mqtt_requests_total", "op" => kind.label(), "status" => "no_rid")
                    .increment(1);
                tracing::info!("dropping a twin request that cannot be answered: {why}");
                self.ack_only(puback);
            }
            Inbound::MethodResponse { status, rid } => {
                self.on_method_response(status, rid, &p.payload);
                self.ack_only(puback);
            }
            Inbound::BadMethodResponse(why) => {
                metrics::counter!("twinhub_method_responses_total", "result" => "malformed").increment(1);
                tracing::info!("dropping a method response: {why}");
                self.ack_only(puback);
            }
            Inbound::Telemetry => {
                metrics::counter!("twinhub_mqtt_telemetry_dropped_total").increment(1);
                self.ack_only(puback);
            }
            Inbound::OutOfScope(why) => return Err(Close::OutOfScope(why)),
        }
        Ok(())
    }

    fn ack_only(&mut self, puback: Option<u16>) {
        if let Some(pkid) = puback {
            self.ops.push_back(Box::pin(std::future::ready(Done::ack_only(pkid))));
        }
    }

    /// `$iothub/twin/GET`: the properties section (no tags), after this connection's earlier writes.
    fn get(&self, rid: String, puback: Option<u16>, started: Instant) -> BoxFuture<'static, Done> {
        let twins = self.mqtt.twins.clone();
        let id = self.id.clone();
        let barrier = (self.writes_issued > 0).then(|| (self.writes_done.subscribe(), self.writes_issued));
        Box::pin(async move {
            if let Some((mut done, n)) = barrier {
                let _ = done.wait_for(|d| *d >= n).await;
            }
            let kind = TwinRequest::Get;
            match twins.doc(&id.device_id, crate::twin::read::ReadOp::TwinProperties(id.clone())).await {
                Ok(Ok(props)) => {
                    let body = serde_json::to_vec(&props).unwrap_or_default();
                    Done::answer(kind, 200, topics::response_topic(200, &rid, None), body, puback, started)
                }
                Ok(Err(e)) => Done::error(kind, &rid, e.into(), puback, started),
                Err(e) => Done::error(kind, &rid, e.into(), puback, started),
            }
        })
    }

    /// `$iothub/twin/PATCH/properties/reported`: validated here (bad input costs no log entry), then
    /// proposed with the request id the session's `$rid` memory gives it.
    fn patch_reported(&mut self, rid: String, payload: Bytes, dup: bool, puback: Option<u16>, started: Instant) {
        let kind = TwinRequest::PatchReported;
        let checked = std::str::from_utf8(&payload)
            .map_err(|_| RequestError::BadRequest("the reported properties patch is not UTF-8".into()))
            .and_then(|text| validate_reported_patch_text(text).map(|()| text.to_string()).map_err(RequestError::from));
        let patch_json = match checked {
            Ok(j) => j,
            Err(e) => {
                let done = Done::error(kind, &rid, e, puback, started);
                self.ops.push_back(Box::pin(std::future::ready(done)));
                return;
            }
        };
        let request_id = lock(&self.session).request_id(&rid, &payload, self.generation, dup);
        let twins = self.mqtt.twins.clone();
        let id = self.id.clone();
        self.writes_issued += 1;
        self.ops.push_back(Box::pin(async move {
            let cmd =
                Command { request_id, timestamp_ms: now_ms(), op: Op::UpdateReported { id: id.clone(), patch_json } };
            let version = async {
                let reply = twins.write(&id, cmd).await?.result?;
                Ok::<_, RequestError>(reply.into_reported_version()?)
            }
            .await;
            let mut done = match version {
                Ok(version) => Done::answer(
                    kind,
                    204,
                    topics::response_topic(204, &rid, Some(version)),
                    Vec::new(),
                    puback,
                    started,
                ),
                Err(e) => Done::error(kind, &rid, e, puback, started),
            };
            done.write = true;
            done
        }));
    }

    /// Bookkeeping of a finished request, whether or not its answer can still be sent.
    fn account(&self, done: &Done) {
        if done.write {
            self.writes_done.send_modify(|n| *n += 1);
        }
        if let Some(kind) = done.kind {
            let labels = [("op", kind.label()), ("status", status_label(done.status))];
            metrics::counter!("twinhub_mqtt_requests_total", &labels).increment(1);
            metrics::histogram!("twinhub_mqtt_request_duration_seconds", &labels[..1])
                .record(done.started.elapsed().as_secs_f64());
        }
    }

    async fn on_done(&mut self, done: Done) -> Result<(), Close> {
        self.account(&done);
        if let Some(p) = done.response {
            self.send(Out::Publish(p)).await?;
        }
        if let Some(pkid) = done.puback {
            self.send(Out::PubAck(pkid)).await?;
        }
        Ok(())
    }

    /// Forwards a desired push if the session subscribes to it and it is newer than the last one sent.
    async fn on_push(&mut self, push: DesiredPush) -> Result<(), Close> {
        if self.last_push.is_some_and(|v| push.version <= v) {
            metrics::counter!("twinhub_mqtt_desired_pushes_total", "result" => "stale").increment(1);
            return Ok(());
        }
        let topic = topics::desired_topic(push.version);
        let Some(qos) = lock(&self.session).delivery_qos(&topic) else {
            metrics::counter!("twinhub_mqtt_desired_pushes_total", "result" => "not_subscribed").increment(1);
            return Ok(());
        };
        self.last_push = Some(push.version);
        let pkid = if qos == 1 { self.next_pkid() } else { 0 };
        metrics::counter!("twinhub_mqtt_desired_pushes_total", "result" => "sent").increment(1);
        tracing::debug!(version = push.version, merged = push.merged, qos, "desired push");
        self.send(Out::Publish(codec::outgoing_publish(&topic, Bytes::from(push.body), qos, pkid))).await
    }

    /// A persistent session's subscriptions, written through the identity's shard before SUBACK or
    /// UNSUBACK: a device that reconnects to another node (after this one failed) finds them there.
    fn store_subscriptions(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let write = self.persistent.then(|| {
            let filters = lock(&self.session).subscriptions().iter().map(|s| (s.filter.clone(), s.qos)).collect();
            (
                self.mqtt.clone(),
                self.id.clone(),
                Command::new(Op::SetSubscriptions { id: self.id.clone(), filters }, now_ms()),
            )
        });
        async move {
            let Some((mqtt, id, cmd)) = write else { return };
            match mqtt.twins.write(&id, cmd).await {
                Ok(Applied { result: Ok(_), .. }) => {}
                Ok(Applied { result: Err(e), .. }) => tracing::warn!("session subscriptions not stored: {e}"),
                Err(e) => tracing::warn!("session subscriptions not stored: {e}"),
            }
        }
    }

    /// Publishes a direct method call to the device if it subscribed to methods; the answer comes back
    /// through [`Self::on_method_response`].
    async fn on_method_call(&mut self, call: MethodCall) -> Result<(), Close> {
        self.pending_methods.retain(|_, waiting| !waiting.is_closed());
        if self.pending_methods.len() >= MAX_PENDING {
            let _ = call.reply.send(Err(MethodError::Busy));
            return Ok(());
        }
        self.next_method_rid += 1;
        let rid = self.next_method_rid.to_string();
        let topic = topics::method_topic(&call.request.name, &rid);
        let Some(qos) = lock(&self.session).delivery_qos(&topic) else {
            metrics::counter!("twinhub_method_calls_total", "result" => "not_subscribed").increment(1);
            let _ = call.reply.send(Err(MethodError::NotOnline));
            return Ok(());
        };
        if qos == 1 && self.unacked.len() >= self.max_unacked {
            let _ = call.reply.send(Err(MethodError::Busy));
            return Ok(());
        }
        let pkid = if qos == 1 { self.next_pkid() } else { 0 };
        metrics::counter!("twinhub_method_calls_total", "result" => "sent").increment(1);
        tracing::debug!(method = call.request.name, rid, qos, "method call");
        let payload = Bytes::from(call.request.payload_json.into_bytes());
        self.pending_methods.insert(rid, call.reply);
        self.send(Out::Publish(codec::outgoing_publish(&topic, payload, qos, pkid))).await
    }

    /// The device's answer to a call sent on this connection. An answer to no pending call (late, after
    /// the caller timed out, or made up) is dropped.
    fn on_method_response(&mut self, status: i64, rid: &str, payload: &[u8]) {
        let Some(waiting) = self.pending_methods.remove(rid) else {
            metrics::counter!("twinhub_method_responses_total", "result" => "unmatched").increment(1);
            tracing::debug!(rid, "method response for no pending call");
            return;
        };
        metrics::counter!("twinhub_method_responses_total", "result" => "matched").increment(1);
        let _ = waiting.send(Ok(MethodReply { status, payload_json: super::methods::answer_json(payload) }));
    }

    /// A packet id not used by an unacknowledged push (the loop stops taking pushes before all are used).
    fn next_pkid(&mut self) -> u16 {
        loop {
            self.next_pkid = self.next_pkid.checked_add(1).unwrap_or(1);
            if self.unacked.insert(self.next_pkid) {
                return self.next_pkid;
            }
        }
    }

    /// Queues a packet for the writer; a queue that stays full closes the connection.
    async fn send(&mut self, out: Out) -> Result<(), Close> {
        match self.out.try_send(out) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(Close::WriterGone),
            Err(mpsc::error::TrySendError::Full(out)) => {
                match tokio::time::timeout(self.mqtt.limits.outbound_stall, self.out.send(out)).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(_)) => Err(Close::WriterGone),
                    Err(_) => Err(Close::OutboundStalled),
                }
            }
        }
    }

    /// Ends the connection: the MQTT 5 DISCONNECT reason, the writer, accepted requests, the session and
    /// the identity's `connectionState`.
    async fn close<R>(self, close: Close, writer: tokio::task::JoinHandle<()>, rd: R) {
        metrics::counter!("twinhub_mqtt_disconnects_total", "reason" => close.label()).increment(1);
        if close.is_routine() {
            tracing::info!("MQTT connection closed: {close}");
        } else {
            tracing::warn!("MQTT connection closed: {close}");
        }
        let Connection { mqtt, id, client_id, generation, codec, mut ops, out, writes_done, .. } = self;
        if codec.version() == Version::V5 {
            if let Some(reason) = close.v5_reason() {
                let _ = out.try_send(Out::Disconnect { reason, text: close.to_string() });
            }
        }
        drop(out);
        let abort = writer.abort_handle();
        if tokio::time::timeout(Duration::from_secs(2), writer).await.is_err() {
            abort.abort();
        }
        drop(rd);
        // Requests already accepted still complete (a QoS 0 patch followed by DISCONNECT must not be
        // lost); their answers have nowhere to go.
        let drained = tokio::time::timeout(mqtt.limits.drain, async {
            while let Some(done) = ops.next().await {
                if done.write {
                    writes_done.send_modify(|n| *n += 1);
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(pending = ops.len(), "twin requests still running after the connection closed");
        }
        finish_session(&mqtt, &client_id, generation, &id, mqtt.limits.drain).await;
    }
}

/// A persistent session's subscriptions as the identity's shard keeps them. Every SUBSCRIBE and
/// UNSUBSCRIBE of a persistent session is stored before it is acknowledged, so the stored set is never
/// older than what any node remembers: it replaces the local one (a device may have used another node,
/// or a clean session elsewhere may have discarded it). Whether a session with subscriptions exists;
/// `None` if the shard could not be read (the local session is kept as it is).
async fn restore_stored_session(mqtt: &Mqtt, id: &TwinId, session: &Arc<Mutex<Session>>) -> Option<bool> {
    let stored = match mqtt.twins.credentials(id).await {
        Ok(c) => c.map(|c| c.subscriptions).unwrap_or_default(),
        Err(e) => {
            tracing::warn!("stored session not read: {e}");
            return None;
        }
    };
    let mut s = lock(session);
    let local: Vec<(String, u8)> = s.subscriptions().iter().map(|x| (x.filter.clone(), x.qos)).collect();
    if local != stored {
        for (filter, _) in &local {
            s.unsubscribe(filter);
        }
        for (filter, qos) in &stored {
            s.subscribe(filter, *qos);
        }
        metrics::counter!("twinhub_mqtt_sessions_restored_total").increment(1);
        tracing::info!(subscriptions = stored.len(), "persistent session taken from the registry");
    }
    Some(!stored.is_empty())
}

/// A clean session discards what a persistent one stored (called only when the login's read found
/// stored subscriptions: most clean devices have none, and a read costs less than a write).
async fn discard_stored_session(mqtt: &Mqtt, id: &TwinId) {
    let cmd = Command::new(Op::SetSubscriptions { id: id.clone(), filters: Vec::new() }, now_ms());
    if let Err(e) = mqtt.twins.write(id, cmd).await {
        tracing::warn!("stored session not discarded: {e}");
    }
}

/// Detaches from the session and, unless taken over, reports the identity disconnected.
async fn finish_session(mqtt: &Mqtt, client_id: &str, generation: u64, id: &TwinId, limit: Duration) {
    let Some(sync) = mqtt.sessions.detach(client_id, generation) else { return };
    if tokio::time::timeout(limit, sync_connection_state(mqtt, &sync, client_id, id)).await.is_err() {
        tracing::warn!("writing connectionState timed out");
    }
}

/// Brings the identity's `connectionState` in line with the session registry: Connected while a
/// connection of this client id is attached. Under the client id's sync lock, so the writes of a
/// connection and of its successor never overtake each other, and the last one reflects the present.
async fn sync_connection_state(mqtt: &Mqtt, sync: &StateSync, client_id: &str, id: &TwinId) {
    let mut last = sync.lock().await;
    let connected = mqtt.sessions.is_live(client_id);
    if *last == Some(connected) {
        return;
    }
    let cmd = Command::new(Op::SetConnectionState { id: id.clone(), connected }, now_ms());
    *last = match mqtt.twins.write(id, cmd).await {
        Ok(Applied { result: Ok(_), .. }) => Some(connected),
        Ok(Applied { result: Err(e), .. }) => {
            tracing::warn!(connected, "connectionState not written: {e}");
            None
        }
        Err(e) => {
            tracing::warn!(connected, "connectionState not written: {e}");
            None
        }
    };
}

/// The writer task: encodes queued packets, batching what is already queued into one write.
async fn write_loop<W>(
    mut wr: W,
    codec: Codec,
    mut rx: mpsc::Receiver<Out>,
    client_max_packet: usize,
    gone: CancellationToken,
) where
    W: AsyncWrite + Unpin,
{
    let _gone = gone.drop_guard();
    let mut buf = BytesMut::with_capacity(8 * 1024);
    while let Some(out) = rx.recv().await {
        encode_within(&codec, out, &mut buf, client_max_packet);
        while buf.len() < 64 * 1024 {
            match rx.try_recv() {
                Ok(out) => encode_within(&codec, out, &mut buf, client_max_packet),
                Err(_) => break,
            }
        }
        let written = async {
            wr.write_all(&buf).await?;
            wr.flush().await
        };
        if let Err(e) = written.await {
            tracing::debug!("MQTT write failed: {e}");
            return;
        }
        buf.clear();
    }
    let _ = wr.shutdown().await;
}

/// Encodes one packet unless it exceeds the maximum packet size the MQTT 5 client announced (then it
/// must not be sent at all, MQTT 5 §3.1.2.11.4).
fn encode_within(codec: &Codec, out: Out, buf: &mut BytesMut, max: usize) {
    let mark = buf.len();
    if codec.encode(out, buf) && buf.len() - mark > max {
        tracing::warn!(size = buf.len() - mark, max, "dropping a packet larger than the client accepts");
        buf.truncate(mark);
    }
}

/// How long a connection with this keep-alive may stay silent: one and a half keep-alives, and at
/// least one and a half seconds (a keep-alive of 0 never reaches here, but must not mean "at once").
fn idle_grace(keep_alive: u16) -> Duration {
    Duration::from_millis(u64::from(keep_alive.max(1)) * 1500)
}

fn status_label(status: u16) -> &'static str {
    match status {
        200 => "200",
        204 => "204",
        400 => "400",
        404 => "404",
        412 => "412",
        500 => "500",
        503 => "503",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_grace_is_one_and_a_half_keep_alives_and_never_zero() {
        assert_eq!(idle_grace(60), Duration::from_secs(90));
        assert_eq!(idle_grace(1740), Duration::from_secs(2610));
        assert_eq!(idle_grace(0), Duration::from_millis(1500));
    }
}
