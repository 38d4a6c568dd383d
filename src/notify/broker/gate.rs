//! The broker's front gate: TLS termination and a thin MQTT 3.1.1 packet filter between a back-end
//! client and rumqttd's internal loopback listener.
//!
//! The gate is the only way in. It checks the back end's policy SAS token itself, answering a bad
//! CONNECT with a proper CONNACK refusal (rumqttd just drops the socket), and forwards an accepted
//! CONNECT rewritten: with the process's internal login instead of the token (rumqttd accepts nothing
//! else, see [`super::internal`]), without a will (a will is a publish rumqttd would make on the
//! client's behalf), and with the client id moved into a namespace of its own (`svc.{id}`) so that no
//! back end can take over the node's feed link by naming itself after it.
//!
//! rumqttd has no per-topic ACL, so the gate also decides what a connected client may send: only
//! SUBSCRIBE, UNSUBSCRIBE, PINGREQ, DISCONNECT and acknowledgements of deliveries. A PUBLISH (or any
//! other packet) closes the connection: only the node publishes on `twin-changes/...`. The gate reads
//! framing only (fixed header and remaining length, plus the CONNECT payload); the broker → client
//! direction is copied untouched once rumqttd's CONNACK has been seen.
//!
//! A connection holds its [`ConnPermit`] from accept on; it becomes authenticated when rumqttd accepts
//! the forwarded CONNECT (CONNACK 0).
//!
//! What rumqttd keeps for the node's whole life, the gate bounds ([`ClientLimits`]): a log per distinct
//! subscription filter (a SUBSCRIBE naming a filter past `max_filters` closes the connection, as
//! rumqttd itself closes one whose filter it refuses), a session record per client id (a back end
//! without an id gets one of a pool as large as the listener's connection cap, not a fresh random
//! one per connection), and a connection's silence (its keep-alive is clamped as the device front
//! door clamps it).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::internal::{self, InternalLogin};
use crate::auth::{AuthError, Permission, Policies, SasToken};
use crate::net::ConnPermit;

/// Largest packet a back-end client may send: CONNECT with a token, SUBSCRIBE, PINGREQ... never data.
pub const MAX_CLIENT_PACKET: usize = 64 * 1024;

/// Where back-end client ids live in rumqttd: outside the names the node's own links use.
pub const CLIENT_ID_PREFIX: &str = "svc.";

/// Where the ids the gate gives back ends that bring none live: outside [`CLIENT_ID_PREFIX`], so no
/// back end can name itself after one and take its connection over.
pub const ANONYMOUS_ID_PREFIX: &str = "anon.";

const CONNECT: u8 = 1;
const CONNACK: u8 = 2;
const PUBLISH: u8 = 3;
const SUBSCRIBE: u8 = 8;

/// Packet types a connected back end may send: acknowledgements of QoS 1/2 deliveries (PUBACK,
/// PUBREC, PUBCOMP), SUBSCRIBE, UNSUBSCRIBE, PINGREQ and DISCONNECT.
fn allowed_after_connect(kind: u8) -> bool {
    matches!(kind, 4 | 5 | 7 | 8 | 10 | 12 | 14)
}

/// CONNACK return codes of MQTT 3.1.1.
const RC_UNACCEPTABLE_PROTOCOL: u8 = 1;
const RC_IDENTIFIER_REJECTED: u8 = 2;
const RC_BAD_CREDENTIALS: u8 = 4;
const RC_NOT_AUTHORIZED: u8 = 5;

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("packet of {0} bytes exceeds the limit of {MAX_CLIENT_PACKET}")]
    TooLarge(usize),
    #[error("malformed packet: {0}")]
    Malformed(&'static str),
    #[error("first packet is not CONNECT")]
    NotConnect,
    #[error("MQTT protocol level {0} is not supported (3.1.1 only)")]
    Protocol(u8),
    #[error("refused: {0}")]
    Refused(AuthError),
    #[error("CONNECT with a will refused: back-end clients may not publish, not even through a will")]
    Will,
    #[error("client id of {0} bytes is too long")]
    ClientId(usize),
    #[error("back-end clients may not publish (topic '{0}')")]
    Publish(String),
    #[error("packet type {0} is not allowed from a back-end client")]
    Forbidden(u8),
    #[error("no CONNECT within {0:?}")]
    ConnectTimeout(Duration),
    #[error("the internal broker did not accept the connection (CONNACK {0:?})")]
    Upstream(Option<u8>),
    #[error("a persistent session needs a client id")]
    AnonymousSession,
    #[error("subscription filter '{0}' refused: the broker keeps at most {1} distinct filters")]
    Filters(String, usize),
}

/// One MQTT control packet as read from the client: the raw bytes (to forward) and its type.
struct RawPacket {
    kind: u8,
    /// Offset of the variable header in `bytes`.
    body_at: usize,
    bytes: Vec<u8>,
}

async fn read_packet<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<RawPacket>, GateError> {
    let first = match r.read_u8().await {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut bytes = vec![first];
    let mut len = 0usize;
    let mut shift = 0;
    loop {
        let b = r.read_u8().await?;
        bytes.push(b);
        len |= usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 21 {
            return Err(GateError::Malformed("remaining length longer than 4 bytes"));
        }
    }
    if len > MAX_CLIENT_PACKET {
        return Err(GateError::TooLarge(len));
    }
    let body_at = bytes.len();
    bytes.resize(body_at + len, 0);
    r.read_exact(&mut bytes[body_at..]).await?;
    Ok(Some(RawPacket { kind: first >> 4, body_at, bytes }))
}

/// What the gate needs from CONNECT.
#[derive(Debug, PartialEq, Eq)]
pub struct Login {
    /// `MQTT` or `MQIsdp`.
    pub protocol: String,
    pub level: u8,
    pub clean_session: bool,
    pub keep_alive: u16,
    pub client_id: String,
    /// Whether the CONNECT carries a will.
    pub will: bool,
    pub username: Option<String>,
    pub password: Option<String>,
}

struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn u8(&mut self) -> Result<u8, GateError> {
        let (&v, rest) = self.b.split_first().ok_or(GateError::Malformed("packet truncated"))?;
        self.b = rest;
        Ok(v)
    }

    fn u16(&mut self) -> Result<u16, GateError> {
        Ok(u16::from(self.u8()?) << 8 | u16::from(self.u8()?))
    }

    fn bytes(&mut self) -> Result<&'a [u8], GateError> {
        let n = usize::from(self.u16()?);
        if self.b.len() < n {
            return Err(GateError::Malformed("packet truncated"));
        }
        let (v, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, GateError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| GateError::Malformed("string is not UTF-8"))
    }
}

/// Parses the variable header and payload of an MQTT 3.1 / 3.1.1 CONNECT.
pub fn parse_connect(body: &[u8]) -> Result<Login, GateError> {
    let mut c = Cursor { b: body };
    let name = c.string()?;
    if name != "MQTT" && name != "MQIsdp" {
        return Err(GateError::Malformed("unknown protocol name"));
    }
    let level = c.u8()?;
    let mut login = Login {
        protocol: name,
        level,
        clean_session: false,
        keep_alive: 0,
        client_id: String::new(),
        will: false,
        username: None,
        password: None,
    };
    if level != 4 && level != 3 {
        return Ok(login);
    }
    let flags = c.u8()?;
    login.clean_session = flags & 0x02 != 0;
    login.keep_alive = c.u16()?;
    login.client_id = c.string()?;
    if flags & 0x04 != 0 {
        login.will = true;
        c.string()?; // will topic
        c.bytes()?; // will message
    }
    if flags & 0x80 != 0 {
        login.username = Some(c.string()?);
    }
    if flags & 0x40 != 0 {
        login.password =
            Some(String::from_utf8(c.bytes()?.to_vec()).map_err(|_| GateError::Malformed("password is not UTF-8"))?);
    }
    Ok(login)
}

fn put_string(out: &mut Vec<u8>, s: &[u8]) -> Result<(), GateError> {
    let n = u16::try_from(s.len()).map_err(|_| GateError::ClientId(s.len()))?;
    out.extend_from_slice(&n.to_be_bytes());
    out.extend_from_slice(s);
    Ok(())
}

fn put_remaining_length(out: &mut Vec<u8>, mut len: usize) {
    loop {
        let mut byte = (len & 0x7f) as u8;
        len >>= 7;
        if len > 0 {
            byte |= 0x80;
        }
        out.push(byte);
        if len == 0 {
            return;
        }
    }
}

/// The filter rumqttd keeps a log for when `filter` is subscribed: a shared subscription's
/// (`$share/{group}/{filter}`) shares the log of its filter; `None` for a filter rumqttd refuses (one
/// starting with `$` that is not shared: it closes the connection and keeps nothing).
fn logged_filter(filter: &str) -> Option<&str> {
    match filter.strip_prefix("$share/").and_then(|rest| rest.split_once('/')) {
        Some((_, shared)) => Some(shared),
        None if filter.starts_with('$') && !filter.starts_with("$share") => None,
        None => Some(filter),
    }
}

/// The topic filters of a SUBSCRIBE's variable header and payload (a packet id, then filter and
/// requested-QoS pairs).
pub fn subscribe_filters(body: &[u8]) -> Result<Vec<&str>, GateError> {
    let mut c = Cursor { b: body };
    c.u16()?;
    let mut filters = Vec::new();
    while !c.b.is_empty() {
        let filter = std::str::from_utf8(c.bytes()?).map_err(|_| GateError::Malformed("topic filter is not UTF-8"))?;
        c.u8()?;
        filters.push(filter);
    }
    if filters.is_empty() {
        return Err(GateError::Malformed("SUBSCRIBE without a topic filter"));
    }
    Ok(filters)
}

/// The CONNECT the gate sends rumqttd for an accepted `login`, as `client_id` (see
/// [`Gate::upstream_id`]): the same protocol and clean-session flag; the keep-alive clamped to
/// `max_keep_alive`; the internal login instead of the client's token; no will.
pub fn forwarded_connect(
    login: &Login,
    client_id: &str,
    max_keep_alive: u16,
    internal: &InternalLogin,
) -> Result<Vec<u8>, GateError> {
    let flags = 0x80 | 0x40 | if login.clean_session { 0x02 } else { 0 };
    let mut body = Vec::with_capacity(64 + client_id.len());
    put_string(&mut body, login.protocol.as_bytes())?;
    body.push(login.level);
    body.push(flags);
    body.extend_from_slice(&crate::net::clamp_keep_alive(login.keep_alive, max_keep_alive).to_be_bytes());
    put_string(&mut body, client_id.as_bytes())?;
    put_string(&mut body, internal::USER.as_bytes())?;
    put_string(&mut body, internal.password().as_bytes())?;
    let mut packet = vec![CONNECT << 4];
    put_remaining_length(&mut packet, body.len());
    packet.extend_from_slice(&body);
    Ok(packet)
}

/// Verifies a back-end login: username = the policy name, password = a SAS token of that policy for
/// this hub (`sr` = the host name, with or without a port) that grants `ServiceConnect`.
pub fn verify_login(policies: &Policies, host: &str, username: &str, password: &str) -> Result<(), AuthError> {
    let token = SasToken::parse(password)?;
    // A token for `host:port` (any port: clients sign the name they dial) covers this broker.
    let res = token.resource.to_ascii_lowercase();
    let host_lc = host.to_ascii_lowercase();
    let checked_host = match res.strip_prefix(&host_lc).and_then(|r| r.strip_prefix(':')) {
        Some(port) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => res.clone(),
        _ => host_lc,
    };
    let now = crate::model::now_ms() / 1000;
    let policy = policies.authorize(Some(password), &checked_host, "", Permission::ServiceConnect, now)?;
    if policy.name != username {
        return Err(AuthError::Malformed(format!("username '{username}' is not the token's policy '{}'", policy.name)));
    }
    Ok(())
}

async fn refuse<W: AsyncWrite + Unpin>(w: &mut W, rc: u8) {
    let _ = w.write_all(&[0x20, 0x02, 0x00, rc]).await;
    let _ = w.flush().await;
    let _ = w.shutdown().await;
}

/// The topic of a PUBLISH body (for the log line).
fn publish_topic(body: &[u8]) -> String {
    Cursor { b: body }.string().unwrap_or_default()
}

/// What back ends may make the broker keep.
#[derive(Clone, Copy, Debug)]
pub struct ClientLimits {
    /// Distinct subscription filters over the node's life. rumqttd keeps a log for each distinct filter
    /// ever subscribed (up to three segments of recent events), checks it against each new topic, and
    /// never drops one, not even once no one subscribes to it any more.
    pub max_filters: usize,
    /// Keep-alive values above this, and 0, become this (see [`crate::net::clamp_keep_alive`]).
    pub max_keep_alive: u16,
}

/// The pool of ids for back ends that connect without one: rumqttd would make up a new one for each
/// connection and keep a record of each for ever; from this pool a connection takes the number freed
/// longest ago (so that rumqttd has long seen its last holder leave), or a new one when none is free,
/// so the records are as many as connections ever open at once.
#[derive(Default)]
struct AnonymousIds {
    free: std::collections::VecDeque<u32>,
    next: u32,
}

/// A number of the anonymous pool, held while its connection lasts.
pub struct AnonymousId<'a> {
    gate: &'a Gate,
    n: u32,
}

impl Drop for AnonymousId<'_> {
    fn drop(&mut self) {
        self.gate.anonymous.lock().unwrap_or_else(PoisonError::into_inner).free.push_back(self.n);
    }
}

/// What every relayed connection shares.
pub struct Gate {
    /// rumqttd's internal listener.
    pub upstream: SocketAddr,
    pub policies: Arc<Policies>,
    /// The hub host name tokens are signed for.
    pub host: Arc<str>,
    pub internal: Arc<InternalLogin>,
    /// CONNECT must arrive this soon after the TLS handshake, and rumqttd must answer it this soon.
    pub connect_timeout: Duration,
    pub limits: ClientLimits,
    /// Every filter forwarded so far: the filters rumqttd keeps a log for.
    filters: Mutex<HashSet<String>>,
    anonymous: Mutex<AnonymousIds>,
}

impl Gate {
    pub fn new(
        upstream: SocketAddr,
        policies: Arc<Policies>,
        host: Arc<str>,
        internal: Arc<InternalLogin>,
        connect_timeout: Duration,
        limits: ClientLimits,
    ) -> Gate {
        Gate {
            upstream,
            policies,
            host,
            internal,
            connect_timeout,
            limits,
            filters: Mutex::default(),
            anonymous: Mutex::default(),
        }
    }

    /// The client id rumqttd knows a back end by: its own in the back-end namespace, or, for one without
    /// an id (clean sessions only: a persistent session needs a name to come back to), a number of the
    /// anonymous pool, held by the returned guard.
    pub fn upstream_id(&self, login: &Login) -> Result<(String, Option<AnonymousId<'_>>), GateError> {
        if !login.client_id.is_empty() {
            return Ok((format!("{CLIENT_ID_PREFIX}{}", login.client_id), None));
        }
        if !login.clean_session {
            return Err(GateError::AnonymousSession);
        }
        let mut pool = self.anonymous.lock().unwrap_or_else(PoisonError::into_inner);
        let n = match pool.free.pop_front() {
            Some(n) => n,
            None => {
                pool.next += 1;
                pool.next - 1
            }
        };
        Ok((format!("{ANONYMOUS_ID_PREFIX}{n}"), Some(AnonymousId { gate: self, n })))
    }

    /// Admits the filters of a SUBSCRIBE: each already known, or room for all the new ones under
    /// [`ClientLimits::max_filters`]. Nothing is counted for a SUBSCRIBE that is refused.
    pub fn admit_filters(&self, filters: &[&str]) -> Result<(), GateError> {
        let mut known = self.filters.lock().unwrap_or_else(PoisonError::into_inner);
        let new: HashSet<&str> =
            filters.iter().filter_map(|f| logged_filter(f)).filter(|f| !known.contains(*f)).collect();
        if known.len() + new.len() > self.limits.max_filters {
            metrics::counter!("twinhub_notify_broker_filters_refused_total").increment(1);
            let first = filters.iter().find(|f| logged_filter(f).is_some_and(|l| new.contains(l))).copied();
            let first = first.unwrap_or_default();
            return Err(GateError::Filters(first.to_string(), self.limits.max_filters));
        }
        known.extend(new.into_iter().map(str::to_string));
        metrics::gauge!("twinhub_notify_broker_filters").set(known.len() as f64);
        Ok(())
    }

    /// Serves one client: authenticate its CONNECT, forward it rewritten, then relay both ways until
    /// either side closes. `permit` becomes authenticated when rumqttd accepts the CONNECT.
    pub async fn relay<S>(&self, client: S, permit: &mut ConnPermit) -> Result<(), GateError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let (mut cr, mut cw) = tokio::io::split(client);
        let connect = match tokio::time::timeout(self.connect_timeout, read_packet(&mut cr)).await {
            Err(_) => return Err(GateError::ConnectTimeout(self.connect_timeout)),
            Ok(r) => r?.ok_or(GateError::NotConnect)?,
        };
        if connect.kind != CONNECT {
            return Err(GateError::NotConnect);
        }
        let login = parse_connect(&connect.bytes[connect.body_at..])?;
        if login.level != 4 && login.level != 3 {
            refuse(&mut cw, RC_UNACCEPTABLE_PROTOCOL).await;
            return Err(GateError::Protocol(login.level));
        }
        let (Some(user), Some(pass)) = (login.username.as_deref(), login.password.as_deref()) else {
            refuse(&mut cw, RC_NOT_AUTHORIZED).await;
            return Err(GateError::Refused(AuthError::Missing));
        };
        if let Err(e) = verify_login(&self.policies, &self.host, user, pass) {
            let rc =
                if matches!(e, AuthError::MissingPermission { .. }) { RC_NOT_AUTHORIZED } else { RC_BAD_CREDENTIALS };
            refuse(&mut cw, rc).await;
            return Err(GateError::Refused(e));
        }
        if login.will {
            refuse(&mut cw, RC_NOT_AUTHORIZED).await;
            return Err(GateError::Will);
        }
        let (client_id, _anonymous) = match self.upstream_id(&login) {
            Ok(id) => id,
            Err(e) => {
                refuse(&mut cw, RC_IDENTIFIER_REJECTED).await;
                return Err(e);
            }
        };
        let forwarded = match forwarded_connect(&login, &client_id, self.limits.max_keep_alive, &self.internal) {
            Ok(f) => f,
            Err(e) => {
                refuse(&mut cw, RC_IDENTIFIER_REJECTED).await;
                return Err(e);
            }
        };
        let up = connect_upstream(self.upstream).await?;
        let (mut ur, mut uw) = up.into_split();
        uw.write_all(&forwarded).await?;
        let connack = match tokio::time::timeout(self.connect_timeout, read_packet(&mut ur)).await {
            Ok(Ok(Some(p))) if p.kind == CONNACK => p,
            _ => return Err(GateError::Upstream(None)),
        };
        cw.write_all(&connack.bytes).await?;
        let rc = connack.bytes.get(connack.body_at + 1).copied();
        if rc != Some(0) {
            let _ = cw.shutdown().await;
            return Err(GateError::Upstream(rc));
        }
        permit.authenticated();
        let to_broker = async {
            loop {
                let Some(p) = read_packet(&mut cr).await? else { return Ok::<_, GateError>(()) };
                if p.kind == PUBLISH {
                    return Err(GateError::Publish(publish_topic(&p.bytes[p.body_at..])));
                }
                if !allowed_after_connect(p.kind) {
                    return Err(GateError::Forbidden(p.kind));
                }
                if p.kind == SUBSCRIBE {
                    self.admit_filters(&subscribe_filters(&p.bytes[p.body_at..])?)?;
                }
                uw.write_all(&p.bytes).await?;
            }
        };
        let to_client = async {
            tokio::io::copy(&mut ur, &mut cw).await?;
            cw.shutdown().await?;
            Ok::<_, GateError>(())
        };
        // Whichever side ends first ends the session; dropping both halves closes both sockets.
        tokio::select! {
            r = to_broker => r,
            r = to_client => r,
        }
    }
}

/// rumqttd starts on its own thread; give it a moment if a client arrives first.
async fn connect_upstream(addr: SocketAddr) -> Result<TcpStream, GateError> {
    let mut delay = Duration::from_millis(10);
    for _ in 0..8 {
        match TcpStream::connect(addr).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(TcpStream::connect(addr).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    fn connect_body(level: u8, user: Option<&str>, pass: Option<&str>, will: bool) -> Vec<u8> {
        let s = |v: &str| {
            let mut b = (v.len() as u16).to_be_bytes().to_vec();
            b.extend_from_slice(v.as_bytes());
            b
        };
        let mut flags = 0x02;
        if user.is_some() {
            flags |= 0x80;
        }
        if pass.is_some() {
            flags |= 0x40;
        }
        if will {
            flags |= 0x04;
        }
        let mut b = s("MQTT");
        b.extend_from_slice(&[level, flags, 0, 60]);
        b.extend(s("client-1"));
        if will {
            b.extend(s("will/topic"));
            b.extend(s("bye"));
        }
        if let Some(u) = user {
            b.extend(s(u));
        }
        if let Some(p) = pass {
            b.extend(s(p));
        }
        b
    }

    #[test]
    fn parses_connect_with_and_without_credentials() {
        let l = parse_connect(&connect_body(4, Some("service"), Some("SharedAccessSignature sr=x"), true)).unwrap();
        assert_eq!(
            l,
            Login {
                protocol: "MQTT".into(),
                level: 4,
                clean_session: true,
                keep_alive: 60,
                client_id: "client-1".into(),
                will: true,
                username: Some("service".into()),
                password: Some("SharedAccessSignature sr=x".into())
            }
        );
        let l = parse_connect(&connect_body(4, None, None, false)).unwrap();
        assert_eq!((l.username, l.password), (None, None));
        assert_eq!(parse_connect(&connect_body(5, None, None, false)).unwrap().level, 5);
        assert!(parse_connect(&connect_body(4, Some("u"), Some("p"), false)[..20]).is_err());
    }

    fn token(policy: &str, key: &str, sr: &str) -> String {
        let se = crate::model::now_ms() / 1000 + 600;
        let sig = base64::engine::general_purpose::STANDARD.encode(crate::auth::sign(key, sr, se).unwrap());
        let sig = percent_encoding::utf8_percent_encode(&sig, percent_encoding::NON_ALPHANUMERIC);
        format!("SharedAccessSignature sr={sr}&sig={sig}&se={se}&skn={policy}")
    }

    #[test]
    fn login_needs_a_service_connect_token_of_the_named_policy_for_this_host() {
        let p = Policies::generate();
        let owner = p.get("iothubowner").unwrap().primary_key.clone();
        let read = p.get("registryRead").unwrap().primary_key.clone();
        verify_login(&p, "localhost", "iothubowner", &token("iothubowner", &owner, "localhost")).unwrap();
        verify_login(&p, "localhost", "iothubowner", &token("iothubowner", &owner, "localhost%3A8443")).unwrap();
        assert!(matches!(
            verify_login(&p, "localhost", "service", &token("iothubowner", &owner, "localhost")),
            Err(AuthError::Malformed(_))
        ));
        assert!(matches!(
            verify_login(&p, "localhost", "registryRead", &token("registryRead", &read, "localhost")),
            Err(AuthError::MissingPermission { .. })
        ));
        assert_eq!(
            verify_login(&p, "localhost", "iothubowner", &token("iothubowner", &read, "localhost")),
            Err(AuthError::BadSignature)
        );
        assert!(matches!(
            verify_login(&p, "localhost", "iothubowner", &token("iothubowner", &owner, "otherhost")),
            Err(AuthError::WrongResource(_))
        ));
        assert!(matches!(
            verify_login(&p, "localhost", "iothubowner", &token("iothubowner", &owner, "localhost%3Aevil")),
            Err(AuthError::WrongResource(_))
        ));
        assert!(verify_login(&p, "localhost", "iothubowner", "not a token").is_err());
    }

    fn packet(kind: u8, flags: u8, body: &[u8]) -> Vec<u8> {
        let mut b = vec![kind << 4 | flags];
        let mut len = body.len();
        loop {
            let mut byte = (len & 0x7f) as u8;
            len >>= 7;
            if len > 0 {
                byte |= 0x80;
            }
            b.push(byte);
            if len == 0 {
                break;
            }
        }
        b.extend_from_slice(body);
        b
    }

    #[tokio::test]
    async fn reads_packets_with_multi_byte_lengths_and_refuses_huge_ones() {
        let body = vec![7u8; 300];
        let mut bytes = packet(8, 2, &body);
        bytes.extend(packet(12, 0, &[]));
        let mut r = &bytes[..];
        let p = read_packet(&mut r).await.unwrap().unwrap();
        assert_eq!((p.kind, p.body_at, p.bytes.len()), (8, 3, 303));
        assert_eq!(read_packet(&mut r).await.unwrap().unwrap().kind, 12);
        assert!(read_packet(&mut r).await.unwrap().is_none());
        let huge = [0x82u8, 0xff, 0xff, 0xff, 0x7f];
        assert!(matches!(read_packet(&mut &huge[..]).await, Err(GateError::TooLarge(_))));
    }

    fn test_gate(policies: Arc<Policies>, upstream: SocketAddr) -> Gate {
        Gate::new(
            upstream,
            policies,
            Arc::from("localhost"),
            Arc::new(InternalLogin::generate()),
            Duration::from_secs(5),
            ClientLimits { max_filters: 3, max_keep_alive: 30 },
        )
    }

    fn test_permit() -> (Arc<crate::net::ConnGate>, ConnPermit) {
        let limits = crate::net::ListenerLimits {
            max_connections: 4,
            max_per_source: 0,
            max_unauthenticated: 4,
            max_unauthenticated_per_source: 0,
        };
        let g = crate::net::ConnGate::new("test", limits);
        let p = g.admit("127.0.0.1".parse().unwrap()).unwrap();
        (g, p)
    }

    #[tokio::test]
    async fn bad_login_gets_a_connack_refusal_and_never_reaches_the_broker() {
        let p = Arc::new(Policies::generate());
        // Nothing listens here: a refused login must not even try.
        let nowhere: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let gate = test_gate(p.clone(), nowhere);
        let (g, mut permit) = test_permit();
        let (mut client, server) = tokio::io::duplex(4096);
        let bytes = packet(
            1,
            0,
            &connect_body(
                4,
                Some("iothubowner"),
                Some("SharedAccessSignature sr=localhost&sig=AAAA&se=9999999999&skn=iothubowner"),
                false,
            ),
        );
        client.write_all(&bytes).await.unwrap();
        let r = gate.relay(server, &mut permit).await;
        assert!(matches!(r, Err(GateError::Refused(AuthError::BadSignature))), "{r:?}");
        let mut ack = Vec::new();
        client.read_to_end(&mut ack).await.unwrap();
        assert_eq!(ack, [0x20, 0x02, 0x00, RC_BAD_CREDENTIALS]);

        let (mut client, server) = tokio::io::duplex(4096);
        client.write_all(&packet(1, 0, &connect_body(4, None, None, false))).await.unwrap();
        let r = gate.relay(server, &mut permit).await;
        assert!(matches!(r, Err(GateError::Refused(AuthError::Missing))), "{r:?}");
        let mut ack = Vec::new();
        client.read_to_end(&mut ack).await.unwrap();
        assert_eq!(ack, [0x20, 0x02, 0x00, RC_NOT_AUTHORIZED]);

        // A valid login with a will is refused: a will is a publish made on the client's behalf.
        let owner = p.get("iothubowner").unwrap().primary_key.clone();
        let (mut client, server) = tokio::io::duplex(4096);
        let login = connect_body(4, Some("iothubowner"), Some(&token("iothubowner", &owner, "localhost")), true);
        client.write_all(&packet(1, 0, &login)).await.unwrap();
        let r = gate.relay(server, &mut permit).await;
        assert!(matches!(r, Err(GateError::Will)), "{r:?}");
        let mut ack = Vec::new();
        client.read_to_end(&mut ack).await.unwrap();
        assert_eq!(ack, [0x20, 0x02, 0x00, RC_NOT_AUTHORIZED]);
        assert!(!permit.is_authenticated());
        assert_eq!(g.unauthenticated(), 1);
    }

    fn forwarded(f: &[u8]) -> Login {
        assert_eq!(f[0], 0x10);
        let body_at = f.iter().skip(1).position(|b| b & 0x80 == 0).unwrap() + 2;
        parse_connect(&f[body_at..]).unwrap()
    }

    #[test]
    fn forwarded_connect_carries_the_internal_login_a_namespaced_client_id_and_a_clamped_keep_alive() {
        let gate = test_gate(Arc::new(Policies::generate()), "127.0.0.1:1".parse().unwrap());
        let internal = InternalLogin::generate();
        let mut login =
            parse_connect(&connect_body(4, Some("iothubowner"), Some("SharedAccessSignature x"), true)).unwrap();
        let (id, anonymous) = gate.upstream_id(&login).unwrap();
        assert!(anonymous.is_none());
        let fwd = forwarded(&forwarded_connect(&login, &id, 120, &internal).unwrap());
        assert_eq!(fwd.client_id, "svc.client-1");
        assert_eq!(
            (fwd.username.as_deref(), fwd.password.as_deref()),
            (Some(internal::USER), Some(internal.password()))
        );
        assert_eq!((fwd.will, fwd.clean_session, fwd.keep_alive, fwd.level), (false, true, 60, 4));
        // Above the maximum, or 0 ("never", which rumqttd refuses outright): the maximum.
        assert_eq!(forwarded(&forwarded_connect(&login, &id, 30, &internal).unwrap()).keep_alive, 30);
        login.keep_alive = 0;
        assert_eq!(forwarded(&forwarded_connect(&login, &id, 30, &internal).unwrap()).keep_alive, 30);
    }

    #[test]
    fn back_ends_without_an_id_share_a_pool_as_large_as_the_connections_open_at_once() {
        let gate = test_gate(Arc::new(Policies::generate()), "127.0.0.1:1".parse().unwrap());
        let mut login = parse_connect(&connect_body(4, None, None, false)).unwrap();
        login.client_id.clear();
        let (a, ga) = gate.upstream_id(&login).unwrap();
        let (b, gb) = gate.upstream_id(&login).unwrap();
        assert_eq!((a.as_str(), b.as_str()), ("anon.0", "anon.1"));
        drop(ga);
        let (c, gc) = gate.upstream_id(&login).unwrap();
        assert_eq!(c, "anon.0", "a number is reused once its connection has ended");
        drop(gb);
        drop(gc);
        let (d, _gd) = gate.upstream_id(&login).unwrap();
        assert_eq!(d, "anon.1", "the number freed longest ago first");
        let (e, _ge) = gate.upstream_id(&login).unwrap();
        assert_eq!(e, "anon.0");
        let (f, _gf) = gate.upstream_id(&login).unwrap();
        assert_eq!(f, "anon.2");
        // A named back end cannot take one of them: its id is in another namespace.
        login.client_id = "anon.0".into();
        assert_eq!(gate.upstream_id(&login).unwrap().0, "svc.anon.0");
        // No id and a persistent session: nothing to come back to.
        login.client_id.clear();
        login.clean_session = false;
        assert!(matches!(gate.upstream_id(&login), Err(GateError::AnonymousSession)));
    }

    #[test]
    fn subscribe_filters_are_read_and_bounded_over_the_nodes_life() {
        assert_eq!(subscribe_filters(&[0, 1, 0, 3, b'a', b'/', b'#', 0, 0, 1, b'b', 1]).unwrap(), ["a/#", "b"]);
        for bad in [&[0u8, 1][..], &[0, 1, 0, 3, b'a'], &[0, 1, 0, 1, 0xff, 0], &[0, 1, 0, 1, b'a'], &[0]] {
            assert!(matches!(subscribe_filters(bad), Err(GateError::Malformed(_))), "{bad:?}");
        }
        let gate = test_gate(Arc::new(Policies::generate()), "127.0.0.1:1".parse().unwrap());
        gate.admit_filters(&["a", "b"]).unwrap();
        gate.admit_filters(&["a", "b", "a"]).unwrap();
        // Two new filters where there is room for one: neither is taken.
        let refused = gate.admit_filters(&["b", "c", "d"]);
        assert!(matches!(&refused, Err(GateError::Filters(f, 3)) if f == "c"), "{refused:?}");
        gate.admit_filters(&["c", "c"]).unwrap();
        assert!(gate.admit_filters(&["d"]).is_err());
        gate.admit_filters(&["a", "b", "c"]).unwrap();
        // A shared subscription shares its filter's log; a filter rumqttd refuses keeps nothing.
        gate.admit_filters(&["$share/g1/a", "$share/g2/b", "$SYS/x"]).unwrap();
        assert!(gate.admit_filters(&["$share/g1/d"]).is_err());
    }

    /// A fake rumqttd: checks the forwarded CONNECT, accepts it, then records what it receives.
    #[tokio::test]
    async fn accepted_login_is_forwarded_rewritten_and_publishes_close_the_connection() {
        let p = Arc::new(Policies::generate());
        let owner = p.get("iothubowner").unwrap().primary_key.clone();
        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gate = test_gate(p, upstream.local_addr().unwrap());
        let password = gate.internal.password().to_string();
        let broker = tokio::spawn(async move {
            let (mut s, _) = upstream.accept().await.unwrap();
            let connect = read_packet(&mut s).await.unwrap().unwrap();
            let login = parse_connect(&connect.bytes[connect.body_at..]).unwrap();
            assert_eq!(login.username.as_deref(), Some(internal::USER));
            assert_eq!(login.password.as_deref(), Some(password.as_str()));
            assert_eq!(login.client_id, "svc.client-1");
            s.write_all(&[0x20, 0x02, 0x00, 0x00]).await.unwrap();
            let mut kinds = Vec::new();
            while let Ok(Some(p)) = read_packet(&mut s).await {
                kinds.push(p.kind);
            }
            kinds
        });
        let (g, mut permit) = test_permit();
        let (mut client, server) = tokio::io::duplex(4096);
        let login = connect_body(4, Some("iothubowner"), Some(&token("iothubowner", &owner, "localhost")), false);
        client.write_all(&packet(1, 0, &login)).await.unwrap();
        client.write_all(&packet(8, 2, &[0, 1, 0, 3, b'a', b'/', b'#', 0])).await.unwrap();
        client.write_all(&packet(12, 0, &[])).await.unwrap();
        client.write_all(&packet(3, 0, &[0, 3, b't', b'/', b'x', b'{', b'}'])).await.unwrap();
        let r = gate.relay(server, &mut permit).await;
        assert!(matches!(&r, Err(GateError::Publish(t)) if t == "t/x"), "{r:?}");
        assert!(gate.admit_filters(&["a/#", "b", "c"]).is_ok(), "the forwarded filter was counted");
        assert!(gate.admit_filters(&["d"]).is_err());
        assert!(permit.is_authenticated());
        assert_eq!(g.unauthenticated(), 0);
        let mut ack = [0u8; 4];
        client.read_exact(&mut ack).await.unwrap();
        assert_eq!(ack, [0x20, 0x02, 0x00, 0x00], "rumqttd's CONNACK reaches the client");
        assert_eq!(broker.await.unwrap(), [8, 12], "SUBSCRIBE and PINGREQ pass, the PUBLISH does not");
    }

    #[test]
    fn only_subscriptions_pings_acks_and_disconnect_pass_after_connect() {
        let allowed: Vec<u8> = (0..16).filter(|k| allowed_after_connect(*k)).collect();
        assert_eq!(allowed, [4, 5, 7, 8, 10, 12, 14]);
    }
}
