//! The one place where MQTT-side failures become protocol answers: twin request errors become IoT Hub
//! status codes and error bodies on `$iothub/twin/res/{status}/`, CONNECT refusals become CONNACK return
//! codes (3.1.1) or reason codes (5), and the reasons a connection ends become MQTT 5 DISCONNECT reasons.

use rumqttd::protocol::DisconnectReasonCode;
use serde_json::json;

use crate::error_code::ErrorCode;
use crate::model::time::format_ms;
use crate::model::{now_ms, TwinError, UnexpectedReply};
use crate::shard::ShardError;

/// Why a twin request (`$iothub/twin/GET`, `.../PATCH/properties/reported`) failed.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Twin(#[from] TwinError),
    #[error(transparent)]
    Shard(#[from] ShardError),
    /// The request itself is malformed (payload is not JSON, query string without `key=value`).
    #[error("{0}")]
    BadRequest(String),
    /// The write answered a kind of reply it never produces: a bug between layers (a 500).
    #[error("internal error: {0}")]
    UnexpectedReply(#[from] UnexpectedReply),
}

impl RequestError {
    /// The response status (topic) and IoT Hub's numeric `errorCode` (body): the status followed by a
    /// three-digit detail, as IoT Hub numbers them (400004 ArgumentInvalid, 404001 DeviceNotFound, …).
    pub fn classify(&self) -> (u16, u32) {
        let code = match self {
            RequestError::Twin(e) => ErrorCode::of_twin(e),
            RequestError::Shard(e) => ErrorCode::of_shard(e),
            RequestError::BadRequest(_) => ErrorCode::ArgumentInvalid,
            RequestError::UnexpectedReply(_) => ErrorCode::ServerError,
        };
        (code.status(), code.number())
    }

    /// IoT Hub's MQTT error body: `{"errorCode","trackingId","message","timestampUtc"}`. Node turns any
    /// response whose body has `errorCode` into an error; Python and C look at the status only.
    pub fn body(&self) -> Vec<u8> {
        let (status, code) = self.classify();
        if status >= 500 {
            tracing::warn!(status, "twin request failed: {self}");
        } else {
            tracing::debug!(status, "twin request rejected: {self}");
        }
        let body = json!({
            "errorCode": code,
            "trackingId": uuid::Uuid::new_v4().simple().to_string(),
            "message": self.to_string(),
            "timestampUtc": format_ms(now_ms()),
        });
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

/// Why a CONNECT was refused. Every refusal is logged with its reason; the client only sees the code.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("unsupported protocol level {0}")]
    UnsupportedProtocol(u8),
    #[error("client identifier rejected: {0}")]
    ClientId(String),
    /// Unknown identity, bad or expired token, token for another resource, no password, a user name
    /// that names another identity. IoT Hub does not tell these apart on the wire, and neither do we:
    /// the client must not learn which devices exist.
    #[error("bad user name or password: {0}")]
    BadCredentials(String),
    /// The credentials are right but the device is disabled.
    #[error("not authorized: {0}")]
    NotAuthorized(String),
    /// The device's shard cannot be read right now: the client should retry (Python retries rc 3).
    #[error("server unavailable: {0}")]
    Unavailable(ShardError),
}

/// A CONNACK outcome independent of the protocol version; [`super::codec`] picks the per-version code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnAckCode {
    Accepted,
    UnsupportedProtocol,
    ClientIdRejected,
    BadCredentials,
    NotAuthorized,
    ServerUnavailable,
}

impl ConnAckCode {
    /// MQTT 3.1.1 return code (§3.2.2.3).
    pub fn v4(self) -> u8 {
        match self {
            ConnAckCode::Accepted => 0,
            ConnAckCode::UnsupportedProtocol => 1,
            ConnAckCode::ClientIdRejected => 2,
            ConnAckCode::ServerUnavailable => 3,
            ConnAckCode::BadCredentials => 4,
            ConnAckCode::NotAuthorized => 5,
        }
    }

    /// MQTT 5 reason code (§3.2.2.2).
    pub fn v5(self) -> u8 {
        match self {
            ConnAckCode::Accepted => 0x00,
            ConnAckCode::UnsupportedProtocol => 0x84,
            ConnAckCode::ClientIdRejected => 0x85,
            ConnAckCode::BadCredentials => 0x86,
            ConnAckCode::NotAuthorized => 0x87,
            ConnAckCode::ServerUnavailable => 0x88,
        }
    }
}

impl Refusal {
    pub fn code(&self) -> ConnAckCode {
        match self {
            Refusal::UnsupportedProtocol(_) => ConnAckCode::UnsupportedProtocol,
            Refusal::ClientId(_) => ConnAckCode::ClientIdRejected,
            Refusal::BadCredentials(_) => ConnAckCode::BadCredentials,
            Refusal::NotAuthorized(_) => ConnAckCode::NotAuthorized,
            Refusal::Unavailable(_) => ConnAckCode::ServerUnavailable,
        }
    }

    /// Metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Refusal::UnsupportedProtocol(_) => "unsupported_protocol",
            Refusal::ClientId(_) => "client_id",
            Refusal::BadCredentials(_) => "bad_credentials",
            Refusal::NotAuthorized(_) => "not_authorized",
            Refusal::Unavailable(_) => "unavailable",
        }
    }
}

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
pub enum Close {
    #[error("client sent DISCONNECT")]
    ClientDisconnect,
    #[error("client closed the connection")]
    PeerClosed,
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("no packet within 1.5 times the keep-alive of {0} s")]
    KeepAlive(u16),
    #[error("another connection with the same client id connected")]
    TakenOver,
    #[error("server shutting down")]
    ShuttingDown,
    #[error("packet of {0} bytes is over the limit")]
    TooLarge(usize),
    #[error("malformed packet: {0}")]
    Malformed(String),
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// A PUBLISH outside this identity's scope (another device's topic, unknown `$iothub/...`).
    #[error("publish outside the connection's identity: {0}")]
    OutOfScope(String),
    #[error("QoS 2 is not supported")]
    QoS2,
    /// The hub dropped this connection's desired-push queue (it overflowed) or shut down: the device
    /// re-reads its twin when it reconnects.
    #[error("desired-property push queue overflowed or the hub closed")]
    PushesLost,
    #[error("client does not read: outbound queue stayed full")]
    OutboundStalled,
    #[error("writer stopped")]
    WriterGone,
}

impl Close {
    /// The MQTT 5 DISCONNECT reason the server sends before closing, if any. A client-initiated close
    /// gets none; MQTT 3.1.1 has no server DISCONNECT at all (the socket is just closed).
    pub fn v5_reason(&self) -> Option<DisconnectReasonCode> {
        use DisconnectReasonCode as R;
        Some(match self {
            Close::ClientDisconnect | Close::PeerClosed | Close::Io(_) | Close::WriterGone => return None,
            Close::KeepAlive(_) => R::KeepAliveTimeout,
            Close::TakenOver => R::SessionTakenOver,
            Close::ShuttingDown => R::ServerShuttingDown,
            Close::TooLarge(_) => R::PacketTooLarge,
            Close::Malformed(_) => R::MalformedPacket,
            Close::Protocol(_) => R::ProtocolError,
            Close::OutOfScope(_) => R::NotAuthorized,
            Close::QoS2 => R::QoSNotSupported,
            Close::PushesLost | Close::OutboundStalled => R::ServerBusy,
        })
    }

    /// Metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Close::ClientDisconnect => "client_disconnect",
            Close::PeerClosed => "peer_closed",
            Close::Io(_) => "io",
            Close::KeepAlive(_) => "keep_alive",
            Close::TakenOver => "taken_over",
            Close::ShuttingDown => "shutdown",
            Close::TooLarge(_) => "too_large",
            Close::Malformed(_) => "malformed",
            Close::Protocol(_) => "protocol",
            Close::OutOfScope(_) => "out_of_scope",
            Close::QoS2 => "qos2",
            Close::PushesLost => "pushes_lost",
            Close::OutboundStalled => "outbound_stalled",
            Close::WriterGone => "writer_gone",
        }
    }

    /// Closes the client did not cause by misbehaving are routine; the others are worth a warning.
    pub fn is_routine(&self) -> bool {
        matches!(
            self,
            Close::ClientDisconnect | Close::PeerClosed | Close::Io(_) | Close::TakenOver | Close::ShuttingDown
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twin_and_shard_errors_map_to_iot_hub_codes() {
        let cases: Vec<(RequestError, u16, u32)> = vec![
            (TwinError::InvalidArgument("x".into()).into(), 400, 400_004),
            (TwinError::DeviceNotFound("d".into()).into(), 404, 404_001),
            (TwinError::ModuleNotFound { device: "d".into(), module: "m".into() }.into(), 404, 404_010),
            (TwinError::PreconditionFailed("x".into()).into(), 412, 412_001),
            (RequestError::BadRequest("x".into()), 400, 400_004),
            (ShardError::NotLeader { shard: 0, leader: None }.into(), 503, 503_001),
            (ShardError::Timeout { shard: 0 }.into(), 503, 503_001),
            (ShardError::ShuttingDown { shard: 0 }.into(), 503, 503_001),
            (ShardError::Storage { shard: 0, msg: "x".into() }.into(), 503, 503_001),
            (ShardError::Fatal { shard: 0, msg: "x".into() }.into(), 500, 500_001),
            (
                RequestError::UnexpectedReply(crate::model::UnexpectedReply { wanted: "reported", got: "twin" }),
                500,
                500_001,
            ),
        ];
        for (e, status, code) in cases {
            assert_eq!(e.classify(), (status, code), "{e}");
        }
    }

    #[test]
    fn error_body_has_iot_hub_fields() {
        let e = RequestError::from(TwinError::InvalidArgument("key 'a b' contains a space".into()));
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(v["errorCode"], 400_004);
        assert_eq!(v["message"], "key 'a b' contains a space");
        assert_eq!(v["trackingId"].as_str().map(str::len), Some(32));
        let ts = v["timestampUtc"].as_str().unwrap();
        assert!(ts.ends_with('Z') && ts.len() == 24, "{ts}");
    }

    #[test]
    fn refusals_map_to_connack_codes_of_both_versions() {
        let cases = [
            (Refusal::UnsupportedProtocol(3), 1, 0x84),
            (Refusal::ClientId("x".into()), 2, 0x85),
            (Refusal::Unavailable(ShardError::Timeout { shard: 0 }), 3, 0x88),
            (Refusal::BadCredentials("x".into()), 4, 0x86),
            (Refusal::NotAuthorized("x".into()), 5, 0x87),
        ];
        for (r, v4, v5) in cases {
            assert_eq!((r.code().v4(), r.code().v5()), (v4, v5), "{r}");
        }
        assert_eq!((ConnAckCode::Accepted.v4(), ConnAckCode::Accepted.v5()), (0, 0));
    }

    #[test]
    fn only_server_side_closes_send_a_v5_reason() {
        assert_eq!(Close::ClientDisconnect.v5_reason(), None);
        assert_eq!(Close::PeerClosed.v5_reason(), None);
        assert_eq!(Close::TakenOver.v5_reason(), Some(DisconnectReasonCode::SessionTakenOver));
        assert_eq!(Close::KeepAlive(2).v5_reason(), Some(DisconnectReasonCode::KeepAliveTimeout));
        assert_eq!(Close::OutOfScope("x".into()).v5_reason(), Some(DisconnectReasonCode::NotAuthorized));
        assert_eq!(Close::TooLarge(1).v5_reason(), Some(DisconnectReasonCode::PacketTooLarge));
    }
}
