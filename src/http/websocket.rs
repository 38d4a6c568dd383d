//! MQTT over WebSockets: `GET /$iothub/websocket` on the HTTPS port, upgraded with the `mqtt`
//! subprotocol, then the very same device endpoint as the MQTT port (docs/iothub-protocol.md §4.2). The
//! SDKs use it where only 443 is open.
//!
//! The WebSocket only carries bytes: binary messages in, binary messages out, the MQTT stream inside
//! parsed by the device endpoint exactly as over TLS on 8883, with its authentication, isolation,
//! limits and sessions. Nothing here reads MQTT.
//!
//! # What a stranger can make this hold
//! The upgrade needs no credential (the device authenticates in its MQTT CONNECT), so before upgrading
//! the connection takes a slot of the *MQTT* endpoint's connection budget, unauthenticated until its
//! CONNECT is accepted: a flood of upgraded sockets fills the MQTT endpoint's unauthenticated slots of
//! its own source and is closed after the CONNECT timeout, as on port 8883. The HTTPS connection's own
//! slot then counts as authenticated so that devices behind one address are not capped by the HTTPS
//! listener's small unauthenticated budget; its per-source and total caps still apply.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_util::sync::CancellationToken;

use super::serve::ConnState;
use super::{ApiError, Shared};
use crate::mqtt::Mqtt;
use crate::net::ConnPermit;

/// The WebSocket subprotocol IoT Hub's device SDKs ask for.
const SUBPROTOCOL: &str = "mqtt";
/// Bytes buffered between the WebSocket and the MQTT connection in each direction.
const PIPE: usize = 64 * 1024;
/// After the client stops sending, how long the endpoint may still write (a CONNACK refusal, a
/// DISCONNECT) before the socket is closed.
const FLUSH_GRACE: Duration = Duration::from_secs(5);

/// The device endpoint as reached through the HTTPS port.
pub struct MqttOverWebSocket {
    pub mqtt: Arc<Mqtt>,
    /// The node's stop signal: device connections end with the node.
    pub stop: CancellationToken,
}

/// `GET /$iothub/websocket`.
pub async fn upgrade(
    State(state): State<Shared>,
    conn: Option<Extension<Arc<ConnState>>>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => return ApiError::BadRequest(format!("expected a WebSocket upgrade: {e}")).into_response(),
    };
    if !asks_for_mqtt(&headers) {
        return ApiError::BadRequest(format!("the WebSocket subprotocol must be `{SUBPROTOCOL}`")).into_response();
    }
    let (Some(endpoint), Some(Extension(conn))) = (state.mqtt_ws.as_ref(), conn) else {
        return ApiError::Internal("the device endpoint is not running".into()).into_response();
    };
    let peer = conn.peer();
    let Ok(permit) = endpoint.mqtt.gate.admit(peer.ip()) else {
        metrics::counter!("twinhub_mqtt_websocket_refused_total").increment(1);
        return ApiError::ConnectionLimit("device connections").into_response();
    };
    conn.authenticated();
    let (mqtt, stop) = (endpoint.mqtt.clone(), endpoint.stop.clone());
    let max = mqtt.limits.max_packet + 16;
    ws.protocols([SUBPROTOCOL])
        .max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| bridge(socket, mqtt, peer, permit, stop))
}

/// Whether `Sec-WebSocket-Protocol` lists `mqtt` (a comma-separated list, case-sensitive tokens).
fn asks_for_mqtt(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == SUBPROTOCOL)
}

/// Runs the device endpoint over the socket until either side ends.
async fn bridge(socket: WebSocket, mqtt: Arc<Mqtt>, peer: SocketAddr, permit: ConnPermit, stop: CancellationToken) {
    metrics::counter!("twinhub_mqtt_websocket_connections_total").increment(1);
    let (ours, theirs) = tokio::io::duplex(PIPE);
    let device = tokio::spawn(mqtt.connection(theirs, peer, permit, stop));
    pump(socket, ours).await;
    // The endpoint sees end-of-stream and finishes its own clean-up (connection state, session).
    let _ = device.await;
}

/// Copies WebSocket binary messages into `pipe` and what the endpoint writes to `pipe` back out as
/// binary messages. A text message is a protocol error that ends the connection.
async fn pump(socket: WebSocket, pipe: DuplexStream) {
    let (mut sink, mut source) = socket.split();
    let (mut from_endpoint, mut to_endpoint) = tokio::io::split(pipe);
    let inbound = async {
        while let Some(msg) = source.next().await {
            match msg {
                Ok(Message::Binary(bytes)) => {
                    if to_endpoint.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                // Pings are answered by the WebSocket layer itself.
                Ok(Message::Ping(_) | Message::Pong(_)) => {}
                Ok(Message::Text(_)) => {
                    tracing::debug!("text message on the MQTT WebSocket; closing");
                    break;
                }
                Ok(Message::Close(_)) | Err(_) => break,
            }
        }
        let _ = to_endpoint.shutdown().await;
    };
    let outbound = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from_endpoint.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink.send(Message::Binary(bytes::Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = sink.close().await;
    };
    tokio::pin!(outbound);
    tokio::select! {
        () = &mut outbound => return,
        () = inbound => {}
    }
    let _ = tokio::time::timeout(FLUSH_GRACE, outbound).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mqtt_subprotocol_is_found_in_a_list() {
        let mut h = HeaderMap::new();
        assert!(!asks_for_mqtt(&h), "no subprotocol");
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, "chat, mqtt".parse().unwrap());
        assert!(asks_for_mqtt(&h));
        h.insert(header::SEC_WEBSOCKET_PROTOCOL, "mqttv3.1".parse().unwrap());
        assert!(!asks_for_mqtt(&h), "only the exact token");
    }
}
