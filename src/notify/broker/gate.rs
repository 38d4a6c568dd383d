//! The broker's front gate: TLS termination and a thin MQTT 3.1.1 packet filter between a back-end
//! client and rumqttd's internal loopback listener.
//!
//! rumqttd authenticates at CONNECT (our handler checks the SAS token there too) but has no per-topic
//! ACL: any authenticated client could PUBLISH on `twin-changes/...` and forge events. The gate reads
//! the client's packets (only framing: fixed header and remaining length, plus the CONNECT payload) and
//! closes the connection on the first PUBLISH. It also answers a bad CONNECT itself with a proper
//! CONNACK refusal, which rumqttd does not send (it just drops the socket). The broker → client
//! direction is copied untouched.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::auth::{AuthError, Permission, Policies, SasToken};

/// Largest packet a back-end client may send: CONNECT with a token, SUBSCRIBE, PINGREQ... never data.
pub const MAX_CLIENT_PACKET: usize = 64 * 1024;
/// A client must send CONNECT this soon after the TLS handshake.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

const CONNECT: u8 = 1;
const PUBLISH: u8 = 3;

/// CONNACK return codes of MQTT 3.1.1.
const RC_UNACCEPTABLE_PROTOCOL: u8 = 1;
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
    #[error("back-end clients may not publish (topic '{0}')")]
    Publish(String),
    #[error("no CONNECT within {CONNECT_TIMEOUT:?}")]
    ConnectTimeout,
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
    pub level: u8,
    pub client_id: String,
    pub username: Option<String>,
    pub password: Option<String>,
}

struct Cursor<'a> {
    b: &'a [u8],
}

impl Cursor<'_> {
    fn u8(&mut self) -> Result<u8, GateError> {
        let (&v, rest) = self.b.split_first().ok_or(GateError::Malformed("CONNECT truncated"))?;
        self.b = rest;
        Ok(v)
    }

    fn u16(&mut self) -> Result<u16, GateError> {
        Ok(u16::from(self.u8()?) << 8 | u16::from(self.u8()?))
    }

    fn bytes(&mut self) -> Result<&[u8], GateError> {
        let n = usize::from(self.u16()?);
        if self.b.len() < n {
            return Err(GateError::Malformed("CONNECT truncated"));
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
    if level != 4 && level != 3 {
        return Ok(Login { level, client_id: String::new(), username: None, password: None });
    }
    let flags = c.u8()?;
    let _keep_alive = c.u16()?;
    let client_id = c.string()?;
    if flags & 0x04 != 0 {
        c.string()?; // will topic
        c.bytes()?; // will message
    }
    let username = if flags & 0x80 != 0 { Some(c.string()?) } else { None };
    let password = if flags & 0x40 != 0 {
        Some(String::from_utf8(c.bytes()?.to_vec()).map_err(|_| GateError::Malformed("password is not UTF-8"))?)
    } else {
        None
    };
    Ok(Login { level, client_id, username, password })
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

/// Serves one client: authenticate its CONNECT, then relay both ways until either side closes.
pub async fn relay<S>(client: S, upstream: SocketAddr, policies: Arc<Policies>, host: Arc<str>) -> Result<(), GateError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let connect = match tokio::time::timeout(CONNECT_TIMEOUT, read_packet(&mut cr)).await {
        Err(_) => return Err(GateError::ConnectTimeout),
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
    if let Err(e) = verify_login(&policies, &host, user, pass) {
        let rc = if matches!(e, AuthError::MissingPermission { .. }) { RC_NOT_AUTHORIZED } else { RC_BAD_CREDENTIALS };
        refuse(&mut cw, rc).await;
        return Err(GateError::Refused(e));
    }
    let up = connect_upstream(upstream).await?;
    let (mut ur, mut uw) = up.into_split();
    uw.write_all(&connect.bytes).await?;
    let to_broker = async {
        loop {
            let Some(p) = read_packet(&mut cr).await? else { return Ok::<_, GateError>(()) };
            if p.kind == PUBLISH {
                return Err(GateError::Publish(publish_topic(&p.bytes[p.body_at..])));
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
                level: 4,
                client_id: "client-1".into(),
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

    #[tokio::test]
    async fn bad_login_gets_a_connack_refusal_and_never_reaches_the_broker() {
        let p = Arc::new(Policies::generate());
        // Nothing listens here: a refused login must not even try.
        let nowhere: SocketAddr = "127.0.0.1:1".parse().unwrap();
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
        let r = relay(server, nowhere, p.clone(), Arc::from("localhost")).await;
        assert!(matches!(r, Err(GateError::Refused(AuthError::BadSignature))), "{r:?}");
        let mut ack = Vec::new();
        client.read_to_end(&mut ack).await.unwrap();
        assert_eq!(ack, [0x20, 0x02, 0x00, RC_BAD_CREDENTIALS]);

        let (mut client, server) = tokio::io::duplex(4096);
        client.write_all(&packet(1, 0, &connect_body(4, None, None, false))).await.unwrap();
        let r = relay(server, nowhere, p, Arc::from("localhost")).await;
        assert!(matches!(r, Err(GateError::Refused(AuthError::Missing))), "{r:?}");
        let mut ack = Vec::new();
        client.read_to_end(&mut ack).await.unwrap();
        assert_eq!(ack, [0x20, 0x02, 0x00, RC_NOT_AUTHORIZED]);
    }
}
