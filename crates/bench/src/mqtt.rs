//! MQTT clients (rumqttc): IoT Hub devices (client id = device id, SAS password) and the back-end
//! event-broker watcher. Each connection's event loop runs in its own task and forwards what arrives.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS, TlsConfiguration, Transport};
use tokio::sync::{mpsc, oneshot};

use crate::hub::API_VERSION;
use crate::sas;
use crate::targets::OpError;

pub const RES_PREFIX: &str = "$iothub/twin/res/";
pub const DESIRED_PREFIX: &str = "$iothub/twin/PATCH/properties/desired/";
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Where and how to dial: plain TCP to the address, or TLS (server name = the hub host name).
#[derive(Clone)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub tls: Option<(Arc<rustls::ClientConfig>, String)>,
}

impl Endpoint {
    fn options(&self, client_id: &str) -> MqttOptions {
        match &self.tls {
            None => MqttOptions::new(client_id, self.addr.ip().to_string(), self.addr.port()),
            Some((cfg, host)) => {
                let mut o = MqttOptions::new(client_id, host.clone(), self.addr.port());
                o.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(cfg.clone())));
                o
            }
        }
    }
}

/// What a connection's event-loop task hands over.
#[derive(Debug)]
pub enum Msg {
    Publish { at: Instant, topic: String, payload: Bytes },
    SubAck,
    Closed(String),
}

pub struct Conn {
    pub client: AsyncClient,
    pub rx: mpsc::UnboundedReceiver<Msg>,
    /// Time from dialling to CONNACK.
    pub connect_latency: Duration,
}

/// Dials, waits for the CONNACK (returns the refusal or transport error as an `OpError`), and keeps
/// polling the event loop in a task until the connection ends or the client disconnects.
///
/// `slow`: the event loop pauses this long after each incoming PUBLISH, which also delays reading the
/// socket and acknowledging — a slow device, as the server sees it.
pub async fn connect(
    ep: &Endpoint,
    client_id: &str,
    user: &str,
    pass: &str,
    keep_alive: Duration,
    slow: Option<Duration>,
) -> Result<Conn, OpError> {
    let mut opts = ep.options(client_id);
    opts.set_credentials(user, pass);
    opts.set_clean_session(false);
    opts.set_keep_alive(keep_alive);
    opts.set_max_packet_size(1024 * 1024, 1024 * 1024);
    let (client, mut eventloop) = AsyncClient::new(opts, 64);
    let (tx, rx) = mpsc::unbounded_channel();
    let (conn_tx, conn_rx) = oneshot::channel::<Result<(), OpError>>();
    let started = Instant::now();
    tokio::spawn(async move {
        let mut conn_tx = Some(conn_tx);
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                    if let Some(t) = conn_tx.take() {
                        let r = if ack.code == rumqttc::ConnectReturnCode::Success {
                            Ok(())
                        } else {
                            Err(OpError::new("connack_refused", format!("{:?}", ack.code)))
                        };
                        let refused = r.is_err();
                        let _ = t.send(r);
                        if refused {
                            return;
                        }
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let at = Instant::now();
                    if tx.send(Msg::Publish { at, topic: p.topic, payload: p.payload }).is_err() {
                        return;
                    }
                    if let Some(d) = slow {
                        tokio::time::sleep(d).await;
                    }
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    let _ = tx.send(Msg::SubAck);
                }
                Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => {
                    let _ = tx.send(Msg::Closed("disconnect".into()));
                    return;
                }
                Ok(_) => {}
                Err(e) => {
                    match conn_tx.take() {
                        Some(t) => {
                            let kind = classify(&e);
                            let _ = t.send(Err(OpError::new(kind, e)));
                        }
                        None => {
                            let _ = tx.send(Msg::Closed(e.to_string()));
                        }
                    }
                    return;
                }
            }
        }
    });
    match tokio::time::timeout(CONNECT_TIMEOUT, conn_rx).await {
        Ok(Ok(Ok(()))) => Ok(Conn { client, rx, connect_latency: started.elapsed() }),
        Ok(Ok(Err(e))) => Err(e),
        Ok(Err(_)) => Err(OpError::new("connect", "event loop ended before CONNACK")),
        Err(_) => {
            let _ = client.try_disconnect();
            Err(OpError::new("connect_timeout", format!("no CONNACK within {CONNECT_TIMEOUT:?}")))
        }
    }
}

fn classify(e: &rumqttc::ConnectionError) -> &'static str {
    use rumqttc::ConnectionError as E;
    match e {
        E::ConnectionRefused(_) => "connack_refused",
        E::Io(_) => "connect_io",
        E::Tls(_) => "connect_tls",
        E::NetworkTimeout | E::FlushTimeout => "connect_timeout",
        _ => "connect",
    }
}

impl Conn {
    /// Subscribes and waits for the SUBACK (messages arriving meanwhile are dropped: call before use).
    pub async fn subscribe(&mut self, topic: &str, qos: QoS) -> Result<(), OpError> {
        self.client.subscribe(topic, qos).await.map_err(|e| OpError::new("subscribe", e))?;
        let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(Msg::SubAck)) => return Ok(()),
                Ok(Some(Msg::Closed(e))) => return Err(OpError::new("subscribe", e)),
                Ok(Some(_)) => {}
                Ok(None) => return Err(OpError::new("subscribe", "connection closed")),
                Err(_) => return Err(OpError::new("subscribe", "no SUBACK")),
            }
        }
    }
}

/// Connects as IoT Hub device `id` with a SAS token of its key, like the device SDKs
/// (username `{host}/{id}/?api-version=…`, CleanSession 0).
pub async fn connect_device(
    ep: &Endpoint,
    host: &str,
    id: &str,
    key: &str,
    slow: Option<Duration>,
) -> Result<Conn, OpError> {
    let user = format!("{host}/{id}/?api-version={API_VERSION}&DeviceClientType=twinhub-bench");
    let pass = sas::device_sas(host, id, key, sas::unix_now() + 86_400).map_err(|e| OpError::new("sas", e))?;
    connect(ep, id, &user, &pass, Duration::from_secs(120), slow).await
}

/// `$iothub/twin/res/{status}/?$rid={rid}[&$version=v]` → (status, rid, version).
pub fn parse_response(topic: &str) -> Option<(u16, u64, Option<i64>)> {
    let rest = topic.strip_prefix(RES_PREFIX)?;
    let (status, query) = rest.split_once("/?")?;
    let rid = query_param(query, "$rid")?.parse().ok()?;
    let version = query_param(query, "$version").and_then(|v| v.parse().ok());
    Some((status.parse().ok()?, rid, version))
}

/// `$iothub/twin/PATCH/properties/desired/?$version={n}` → n.
pub fn desired_version(topic: &str) -> Option<i64> {
    let query = topic.strip_prefix(DESIRED_PREFIX)?.strip_prefix('?')?;
    query_param(query, "$version")?.parse().ok()
}

fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query.split('&').find_map(|kv| kv.split_once('=').filter(|(k, _)| *k == name).map(|(_, v)| v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics() {
        assert_eq!(parse_response("$iothub/twin/res/204/?$rid=7&$version=3"), Some((204, 7, Some(3))));
        assert_eq!(parse_response("$iothub/twin/res/200/?$rid=1"), Some((200, 1, None)));
        assert_eq!(desired_version("$iothub/twin/PATCH/properties/desired/?$version=12"), Some(12));
        assert_eq!(desired_version("$iothub/twin/res/200/?$rid=1"), None);
    }
}
