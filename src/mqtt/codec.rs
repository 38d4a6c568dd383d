//! Bytes ⇄ packets on top of `rumqttd::protocol`'s MQTT 3.1.1 (`v4`) and MQTT 5 (`v5`) codecs.
//!
//! The protocol level is sniffed from the CONNECT packet and fixed for the connection. Outgoing packets
//! are described by [`Out`], which only holds what this server sends, so that no version-specific
//! variant can reach a codec that would reject it (rumqttd's writers hit `unreachable!` for a v5 CONNACK
//! code or for properties given to the v4 codec).
//!
//! Two gaps of rumqttd's public API are bridged here: `Publish::{qos, dup, pkid}` are `pub(crate)`, so
//! the header of an incoming PUBLISH is read back from `Publish::serialize` (without its payload), and
//! an outgoing QoS 1 PUBLISH is built with `Publish::deserialize`.

use bytes::{BufMut, Bytes, BytesMut};
use rumqttd::protocol::{
    self, v4::V4, v5::V5, ConnAck, ConnAckProperties, ConnectReturnCode, Disconnect, DisconnectProperties,
    DisconnectReasonCode, Packet, PingResp, Protocol, PubAck, PubAckReason, Publish, QoS, SubAck, SubscribeReasonCode,
    UnsubAck, UnsubAckReason,
};

use super::error::ConnAckCode;

/// The protocol level of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// MQTT 3.1.1 (protocol level 4).
    V4,
    /// MQTT 5.
    V5,
}

/// Why bytes could not be turned into a packet. Either way the connection is closed.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("packet with remaining length {0} is over the limit")]
    TooLarge(usize),
    #[error("{0}")]
    Malformed(String),
}

/// What the first packet of a connection says about its protocol.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    Level(Version),
    /// A CONNECT of a protocol level we do not speak (3.1 `MQIsdp`, or anything else): answered with
    /// CONNACK return code 1 in the 3.1.1 format, which 3.1 clients read too.
    Unsupported(u8),
}

/// Looks at the first bytes of a connection. `Ok(None)`: the CONNECT is not complete yet.
pub fn sniff_connect(buf: &[u8], max_size: usize) -> Result<Option<Hello>, DecodeError> {
    let Some(&first) = buf.first() else { return Ok(None) };
    if first != 0x10 {
        return Err(DecodeError::Malformed(format!("first packet is not CONNECT (header byte {first:#04x})")));
    }
    let header = match protocol::v4::check(buf.iter(), max_size) {
        Ok(h) => h,
        Err(protocol::Error::InsufficientBytes(_)) => return Ok(None),
        Err(protocol::Error::PayloadSizeLimitExceeded(n)) => return Err(DecodeError::TooLarge(n)),
        Err(e) => return Err(DecodeError::Malformed(e.to_string())),
    };
    let body = &buf[header.fixed_header_len..header.frame_length()];
    let malformed = || DecodeError::Malformed("CONNECT too short for a protocol name and level".into());
    let name_len = match body.get(..2) {
        Some(b) => usize::from(u16::from_be_bytes([b[0], b[1]])),
        None => return Err(malformed()),
    };
    let name = body.get(2..2 + name_len).ok_or_else(malformed)?;
    let level = *body.get(2 + name_len).ok_or_else(malformed)?;
    Ok(Some(match (name, level) {
        (b"MQTT", 4) => Hello::Level(Version::V4),
        (b"MQTT", 5) => Hello::Level(Version::V5),
        (b"MQTT" | b"MQIsdp", l) => Hello::Unsupported(l),
        _ => return Err(DecodeError::Malformed("unknown protocol name".into())),
    }))
}

/// The CONNACK refusing an unsupported protocol level (3.1.1 format, return code 1).
pub const CONNACK_UNSUPPORTED_LEVEL: [u8; 4] = [0x20, 0x02, 0x00, 0x01];

/// A connection's codec: the version's decoder and encoder.
#[derive(Clone, Debug)]
pub struct Codec {
    version: Version,
    v4: V4,
    v5: V5,
}

/// Everything the server sends.
#[derive(Clone, Debug)]
pub enum Out {
    ConnAck {
        session_present: bool,
        code: ConnAckCode,
        properties: Option<ConnAckProperties>,
    },
    Publish(Publish),
    PubAck(u16),
    SubAck {
        pkid: u16,
        granted: Vec<Option<u8>>,
    },
    UnsubAck {
        pkid: u16,
        existed: Vec<bool>,
    },
    PingResp,
    /// Sent on MQTT 5 only; MQTT 3.1.1 has no server DISCONNECT.
    Disconnect {
        reason: DisconnectReasonCode,
        text: String,
    },
}

/// QoS, DUP and packet id of a PUBLISH.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublishHeader {
    pub qos: u8,
    pub dup: bool,
    pub pkid: u16,
}

/// Reads the header of a decoded PUBLISH (its `qos`, `dup`, `pkid` fields are not public in rumqttd):
/// `serialize` writes `header byte, pkid, topic length, topic, payload`, so serialising a copy without
/// payload (Bytes clones share memory) costs only the topic.
pub fn publish_header(p: &Publish) -> PublishHeader {
    let mut head = p.clone();
    head.payload = Bytes::new();
    let s = head.serialize();
    let byte = s.first().copied().unwrap_or(0);
    let pkid = match s.get(1..3) {
        Some(b) => u16::from_be_bytes([b[0], b[1]]),
        None => 0,
    };
    PublishHeader { qos: (byte >> 1) & 0b11, dup: byte & 0b1000 != 0, pkid }
}

/// A PUBLISH to send at QoS 0 or 1 (`pkid` is ignored at QoS 0). Built through `Publish::deserialize`,
/// the only public constructor that sets a QoS; the input is laid out exactly as it expects.
pub fn outgoing_publish(topic: &str, payload: Bytes, qos: u8, pkid: u16) -> Publish {
    if qos == 0 {
        return Publish::new(Bytes::copy_from_slice(topic.as_bytes()), payload, false);
    }
    let topic = topic.as_bytes();
    let topic_len = u16::try_from(topic.len()).unwrap_or(u16::MAX);
    let topic = &topic[..usize::from(topic_len)];
    let mut b = BytesMut::with_capacity(5 + topic.len());
    b.put_u8(0b0011_0000 | (1 << 1));
    b.put_u16(pkid);
    b.put_u16(topic_len);
    b.extend_from_slice(topic);
    let mut p = Publish::deserialize(b.freeze());
    p.payload = payload;
    p
}

impl Codec {
    pub fn new(version: Version) -> Codec {
        Codec { version, v4: V4, v5: V5 }
    }

    pub fn version(&self) -> Version {
        self.version
    }

    /// The next complete packet in `buf` (consumed), `Ok(None)` if more bytes are needed.
    pub fn decode(&mut self, buf: &mut BytesMut, max_size: usize) -> Result<Option<Packet>, DecodeError> {
        if buf.is_empty() {
            return Ok(None);
        }
        // rumqttd's v5 reader has no arm for CONNACK and UNSUBACK and reaches `unreachable!()` on
        // them. Server-to-client packets are never valid from a client, so they are refused before the
        // codec sees them, whatever the version.
        if let 2 | 9 | 11 | 13 = buf[0] >> 4 {
            return Err(DecodeError::Malformed(format!(
                "server-to-client packet type {} sent by a client",
                buf[0] >> 4
            )));
        }
        let before = buf.len();
        // Last line of defence: a panic in the third-party decoder on hostile input becomes a malformed
        // packet (the connection is closed; the buffer is not used again).
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match self.version {
            Version::V4 => self.v4.read_mut(buf, max_size),
            Version::V5 => self.v5.read_mut(buf, max_size),
        }))
        .map_err(|_| DecodeError::Malformed("the decoder failed on this packet".into()))?;
        match r {
            Ok(p) => Ok(Some(p)),
            // rumqttd also says "insufficient bytes" when a complete frame's *content* runs short (it has
            // consumed the frame by then): only an untouched buffer means "read more".
            Err(protocol::Error::InsufficientBytes(_)) if buf.len() == before => Ok(None),
            Err(protocol::Error::PayloadSizeLimitExceeded(n)) => Err(DecodeError::TooLarge(n)),
            Err(e) => Err(DecodeError::Malformed(e.to_string())),
        }
    }

    /// Appends the encoding of `out` to `buf`. Returns `false` (nothing written) for a packet this
    /// version cannot carry or the codec refused.
    pub fn encode(&self, out: Out, buf: &mut BytesMut) -> bool {
        let v5 = self.version == Version::V5;
        let packet = match out {
            Out::ConnAck { session_present, code, properties } => {
                let code = if v5 { v5_connack(code) } else { v4_connack(code) };
                Packet::ConnAck(ConnAck { session_present, code }, if v5 { properties } else { None })
            }
            Out::Publish(p) => Packet::Publish(p, None),
            Out::PubAck(pkid) => Packet::PubAck(PubAck { pkid, reason: PubAckReason::Success }, None),
            Out::SubAck { pkid, granted } => {
                let return_codes = granted
                    .into_iter()
                    .map(|g| match g {
                        Some(0) => SubscribeReasonCode::Success(QoS::AtMostOnce),
                        Some(_) => SubscribeReasonCode::Success(QoS::AtLeastOnce),
                        None => SubscribeReasonCode::Failure,
                    })
                    .collect();
                Packet::SubAck(SubAck { pkid, return_codes }, None)
            }
            Out::UnsubAck { pkid, existed } => {
                let reasons = existed
                    .into_iter()
                    .map(|e| if e { UnsubAckReason::Success } else { UnsubAckReason::NoSubscriptionExisted })
                    .collect();
                Packet::UnsubAck(UnsubAck { pkid, reasons }, None)
            }
            Out::PingResp => Packet::PingResp(PingResp),
            Out::Disconnect { reason, text } => {
                if !v5 {
                    return false;
                }
                // With properties: rumqttd's v5 writer miscounts the length of a reason code without
                // properties.
                let props = DisconnectProperties {
                    session_expiry_interval: None,
                    reason_string: Some(text),
                    user_properties: Vec::new(),
                    server_reference: None,
                };
                Packet::Disconnect(Disconnect { reason_code: reason }, Some(props))
            }
        };
        let mark = buf.len();
        let r = match self.version {
            Version::V4 => self.v4.write(packet, buf),
            Version::V5 => self.v5.write(packet, buf),
        };
        match r {
            Ok(_) => true,
            Err(e) => {
                buf.truncate(mark);
                tracing::warn!("cannot encode an outgoing packet: {e}");
                false
            }
        }
    }
}

fn v4_connack(code: ConnAckCode) -> ConnectReturnCode {
    match code {
        ConnAckCode::Accepted => ConnectReturnCode::Success,
        ConnAckCode::UnsupportedProtocol => ConnectReturnCode::RefusedProtocolVersion,
        ConnAckCode::ClientIdRejected => ConnectReturnCode::ClientIdentifierNotValid,
        ConnAckCode::ServerUnavailable => ConnectReturnCode::ServiceUnavailable,
        ConnAckCode::BadCredentials => ConnectReturnCode::BadUserNamePassword,
        ConnAckCode::NotAuthorized => ConnectReturnCode::NotAuthorized,
    }
}

fn v5_connack(code: ConnAckCode) -> ConnectReturnCode {
    match code {
        ConnAckCode::Accepted => ConnectReturnCode::Success,
        ConnAckCode::UnsupportedProtocol => ConnectReturnCode::UnsupportedProtocolVersion,
        ConnAckCode::ClientIdRejected => ConnectReturnCode::ClientIdentifierNotValid,
        ConnAckCode::ServerUnavailable => ConnectReturnCode::ServerUnavailable,
        ConnAckCode::BadCredentials => ConnectReturnCode::BadUserNamePassword,
        ConnAckCode::NotAuthorized => ConnectReturnCode::NotAuthorized,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rumqttd::protocol::{Connect, ConnectProperties, Filter, Login, RetainForwardRule, Subscribe};

    const MAX: usize = 256 * 1024;
    const ROUNDS: usize = 50_000;

    fn connect_bytes(version: Version) -> Vec<u8> {
        let connect = Connect { keep_alive: 60, client_id: "dev1".into(), clean_session: false };
        let login = Some(Login {
            username: "localhost/dev1/?api-version=2021-04-12".into(),
            password: "SharedAccessSignature sr=x&sig=y&se=1".into(),
        });
        let mut b = BytesMut::new();
        match version {
            Version::V4 => V4.write(Packet::Connect(connect, None, None, None, login), &mut b).unwrap(),
            Version::V5 => {
                let props = ConnectProperties {
                    session_expiry_interval: Some(3600),
                    receive_maximum: None,
                    max_packet_size: None,
                    topic_alias_max: None,
                    request_response_info: None,
                    request_problem_info: None,
                    user_properties: vec![("k".into(), "v".into())],
                    authentication_method: None,
                    authentication_data: None,
                };
                V5.write(Packet::Connect(connect, Some(props), None, None, login), &mut b).unwrap()
            }
        };
        b.to_vec()
    }

    /// A client's view of a stream: CONNECT, a QoS 1 PUBLISH, SUBSCRIBE, PINGREQ, DISCONNECT.
    fn session_bytes(version: Version) -> Vec<u8> {
        let mut b = BytesMut::from(&connect_bytes(version)[..]);
        let publish =
            outgoing_publish("$iothub/twin/PATCH/properties/reported/?$rid=1", Bytes::from_static(b"{\"a\":1}"), 1, 7);
        let sub = Subscribe {
            pkid: 8,
            filters: vec![Filter {
                path: "$iothub/twin/res/#".into(),
                qos: QoS::AtLeastOnce,
                nolocal: false,
                preserve_retain: false,
                retain_forward_rule: RetainForwardRule::OnEverySubscribe,
            }],
        };
        let packets = [
            Packet::Publish(publish, None),
            Packet::Subscribe(sub, None),
            Packet::PingReq(protocol::PingReq),
            Packet::Disconnect(Disconnect { reason_code: DisconnectReasonCode::NormalDisconnection }, None),
        ];
        for p in packets {
            match version {
                Version::V4 => V4.write(p, &mut b).unwrap(),
                Version::V5 => V5.write(p, &mut b).unwrap(),
            };
        }
        b.to_vec()
    }

    #[test]
    fn sniffs_levels() {
        assert_eq!(sniff_connect(&connect_bytes(Version::V4), MAX).unwrap(), Some(Hello::Level(Version::V4)));
        assert_eq!(sniff_connect(&connect_bytes(Version::V5), MAX).unwrap(), Some(Hello::Level(Version::V5)));
        let mut v3 = connect_bytes(Version::V4);
        // MQTT 3.1: name "MQIsdp", level 3.
        let body: Vec<u8> = [&[0u8, 6][..], b"MQIsdp", &[3u8, 2, 0, 60, 0, 1, b'x']].concat();
        v3.clear();
        v3.push(0x10);
        v3.push(body.len() as u8);
        v3.extend_from_slice(&body);
        assert_eq!(sniff_connect(&v3, MAX).unwrap(), Some(Hello::Unsupported(3)));
        let full = connect_bytes(Version::V4);
        for cut in 0..full.len() {
            assert_eq!(sniff_connect(&full[..cut], MAX).unwrap(), None, "prefix of {cut} bytes");
        }
        assert!(matches!(sniff_connect(&[0x30, 0x00], MAX), Err(DecodeError::Malformed(_))));
        assert!(matches!(sniff_connect(&[0x10, 0xff, 0xff, 0x7f], 1000), Err(DecodeError::TooLarge(_))));
    }

    #[test]
    fn decodes_a_whole_session_in_any_chunking() {
        for version in [Version::V4, Version::V5] {
            let bytes = session_bytes(version);
            for chunk in [1, 2, 3, 7, 64, bytes.len()] {
                let mut codec = Codec::new(version);
                let mut buf = BytesMut::new();
                let mut got = Vec::new();
                for part in bytes.chunks(chunk) {
                    buf.extend_from_slice(part);
                    while let Some(p) = codec.decode(&mut buf, MAX).unwrap() {
                        got.push(p);
                    }
                }
                assert_eq!(got.len(), 5, "{version:?} chunk {chunk}: {got:?}");
                let Packet::Publish(p, _) = &got[1] else { panic!("{:?}", got[1]) };
                assert_eq!(publish_header(p), PublishHeader { qos: 1, dup: false, pkid: 7 });
                assert_eq!(&p.topic[..], b"$iothub/twin/PATCH/properties/reported/?$rid=1");
                assert_eq!(&p.payload[..], b"{\"a\":1}");
            }
        }
    }

    #[test]
    fn oversized_packets_are_refused_before_they_arrive() {
        let mut codec = Codec::new(Version::V4);
        // PUBLISH announcing 300 KiB, only the header present.
        let mut buf = BytesMut::from(&[0x30u8, 0x80, 0xe0, 0x12][..]);
        assert!(matches!(codec.decode(&mut buf, MAX), Err(DecodeError::TooLarge(n)) if n == 300 * 1024));
    }

    #[test]
    fn encodes_version_specific_packets_safely() {
        for version in [Version::V4, Version::V5] {
            let codec = Codec::new(version);
            let mut buf = BytesMut::new();
            for code in [ConnAckCode::Accepted, ConnAckCode::NotAuthorized, ConnAckCode::UnsupportedProtocol] {
                assert!(codec.encode(
                    Out::ConnAck { session_present: true, code, properties: Some(ConnAckProperties::default()) },
                    &mut buf
                ));
            }
            assert!(codec.encode(Out::SubAck { pkid: 1, granted: vec![Some(0), Some(1), None] }, &mut buf));
            assert!(codec.encode(Out::UnsubAck { pkid: 2, existed: vec![true, false] }, &mut buf));
            assert!(codec.encode(Out::PubAck(3), &mut buf));
            assert!(codec.encode(Out::PingResp, &mut buf));
            let p =
                outgoing_publish("$iothub/twin/PATCH/properties/desired/?$version=2", Bytes::from_static(b"{}"), 1, 9);
            assert!(codec.encode(Out::Publish(p), &mut buf));
            let sent = codec
                .encode(Out::Disconnect { reason: DisconnectReasonCode::SessionTakenOver, text: "x".into() }, &mut buf);
            assert_eq!(sent, version == Version::V5);
            assert_eq!(&buf[..4], if version == Version::V4 { &[0x20, 2, 1, 0][..] } else { &[0x20, 3, 1, 0][..] });
        }
        // The v4 CONNACK codes on the wire.
        let mut buf = BytesMut::new();
        Codec::new(Version::V4).encode(
            Out::ConnAck { session_present: false, code: ConnAckCode::NotAuthorized, properties: None },
            &mut buf,
        );
        assert_eq!(&buf[..], &[0x20, 2, 0, 5]);
        let mut buf = BytesMut::new();
        Codec::new(Version::V5).encode(
            Out::ConnAck { session_present: false, code: ConnAckCode::BadCredentials, properties: None },
            &mut buf,
        );
        assert_eq!(&buf[..], &[0x20, 3, 0, 0x86, 0]);
    }

    #[test]
    fn outgoing_publish_round_trips() {
        let p = outgoing_publish("t/1", Bytes::from_static(b"body"), 1, 513);
        assert_eq!(publish_header(&p), PublishHeader { qos: 1, dup: false, pkid: 513 });
        assert_eq!((&p.topic[..], &p.payload[..]), (&b"t/1"[..], &b"body"[..]));
        let p = outgoing_publish("t/0", Bytes::from_static(b""), 0, 5);
        assert_eq!(publish_header(&p), PublishHeader { qos: 0, dup: false, pkid: 0 });
    }

    /// Garbage, truncations and bit flips of valid streams never panic the decoder (not even inside
    /// rumqttd, whose panics `decode` would catch); it either yields packets, asks for more, or fails.
    #[test]
    fn fuzz_decode_never_panics() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x0771_74ab);
        for version in [Version::V4, Version::V5] {
            let valid = session_bytes(version);
            for round in 0..ROUNDS {
                let mut bytes = match round % 3 {
                    0 => (0..rng.gen_range(0..64)).map(|_| rng.gen()).collect::<Vec<u8>>(),
                    1 => valid[..rng.gen_range(0..=valid.len())].to_vec(),
                    _ => {
                        let mut v = valid.clone();
                        for _ in 0..rng.gen_range(1..4) {
                            let i = rng.gen_range(0..v.len());
                            v[i] = rng.gen();
                        }
                        v
                    }
                };
                let _ = sniff_connect(&bytes, MAX);
                let mut codec = Codec::new(version);
                let mut buf = BytesMut::from(&bytes[..]);
                for _ in 0..64 {
                    match codec.decode(&mut buf, MAX) {
                        Ok(Some(Packet::Publish(p, _))) => {
                            let _ = publish_header(&p);
                        }
                        Ok(Some(_)) => {}
                        Err(DecodeError::Malformed(m)) if m.contains("decoder failed") => {
                            panic!("rumqttd panicked on {bytes:02x?}")
                        }
                        Ok(None) | Err(_) => break,
                    }
                }
                bytes.clear();
            }
        }
    }
}
