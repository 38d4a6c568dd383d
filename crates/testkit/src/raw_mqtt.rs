//! Raw MQTT 3.1.1 packets, for tests where a client library would hide the behaviour under test
//! (idle sockets, a CONNECT with a will, keep-alive 0, a stream carried over a WebSocket).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

pub fn mqtt_string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s);
}

pub fn packet(first: u8, body: &[u8]) -> Vec<u8> {
    let mut p = vec![first];
    let mut len = body.len();
    loop {
        let mut b = (len % 128) as u8;
        len /= 128;
        if len > 0 {
            b |= 0x80;
        }
        p.push(b);
        if len == 0 {
            break;
        }
    }
    p.extend_from_slice(body);
    p
}

/// CONNECT (level 4, clean session) with user name, password and optionally a will.
pub fn connect_packet(
    client_id: &str,
    keep_alive: u16,
    user: &str,
    password: &str,
    will: Option<(&str, &[u8])>,
) -> Vec<u8> {
    connect_packet_with(true, client_id, keep_alive, user, password, will)
}

pub fn connect_packet_with(
    clean: bool,
    client_id: &str,
    keep_alive: u16,
    user: &str,
    password: &str,
    will: Option<(&str, &[u8])>,
) -> Vec<u8> {
    let mut body = Vec::new();
    mqtt_string(&mut body, b"MQTT");
    body.push(4);
    body.push(0b1100_0000 | if clean { 0x02 } else { 0 } | if will.is_some() { 0x04 } else { 0 });
    body.extend_from_slice(&keep_alive.to_be_bytes());
    mqtt_string(&mut body, client_id.as_bytes());
    if let Some((topic, message)) = will {
        mqtt_string(&mut body, topic.as_bytes());
        mqtt_string(&mut body, message);
    }
    mqtt_string(&mut body, user.as_bytes());
    mqtt_string(&mut body, password.as_bytes());
    packet(0x10, &body)
}

pub fn subscribe_packet(pkid: u16, filter: &str) -> Vec<u8> {
    let mut body = pkid.to_be_bytes().to_vec();
    mqtt_string(&mut body, filter.as_bytes());
    body.push(0);
    packet(0x82, &body)
}

pub fn publish_packet(topic: &str, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    mqtt_string(&mut body, topic.as_bytes());
    body.extend_from_slice(payload);
    packet(0x30, &body)
}

/// One packet: its first byte and its body; `None` once the peer has closed.
pub async fn read_packet<S: AsyncRead + Unpin>(s: &mut S) -> Option<(u8, Vec<u8>)> {
    let first = s.read_u8().await.ok()?;
    let (mut len, mut shift) = (0usize, 0);
    loop {
        let b = s.read_u8().await.ok()?;
        len |= usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    let mut body = vec![0; len];
    s.read_exact(&mut body).await.ok()?;
    Some((first, body))
}

/// The next PUBLISH (topic, payload) within `d`, skipping other packets; `None` on timeout or close.
pub async fn next_publish<S: AsyncRead + Unpin>(s: &mut S, d: Duration) -> Option<(String, Vec<u8>)> {
    let deadline = tokio::time::Instant::now() + d;
    loop {
        let (first, body) = tokio::time::timeout_at(deadline, read_packet(s)).await.ok()??;
        if first >> 4 == 3 {
            let n = usize::from(u16::from_be_bytes([body[0], body[1]]));
            let topic = String::from_utf8_lossy(&body[2..2 + n]).into_owned();
            let skip = if first & 0x06 != 0 { 2 } else { 0 };
            return Some((topic, body[2 + n + skip..].to_vec()));
        }
    }
}
