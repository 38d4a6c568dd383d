//! Direct methods (docs/iothub-protocol.md §4.1): a back end calls a method on a connected device or
//! module and waits for its answer.
//!
//! A device that wants calls subscribes to `$iothub/methods/POST/#`; a call reaches it as a PUBLISH on
//! `$iothub/methods/POST/{method}/?$rid={rid}` with the JSON payload, and it answers on
//! `$iothub/methods/res/{status}/?$rid={rid}`. Calls are not durable (IoT Hub does not queue them
//! either): they reach the connection the identity has *now*, on whichever node holds it.
//!
//! - [`LocalMethods`] is this node's registry of device connections that can take calls; each
//!   connection attaches on CONNACK and reads its calls from a channel.
//! - [`Methods`] routes a call: to a local connection, else to the node that holds it (every other
//!   member is asked at once; only the node with the connection delivers), retrying while the
//!   caller's connect timeout lasts.
//!
//! Isolation: the registry is keyed by the identity the connection authenticated as, and a response
//! is matched to a call only by the `$rid` this node generated *on that connection*; one device can
//! neither receive nor answer another's calls.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::cluster::transport::{Call, CallError, Transport};
use crate::ids::TwinId;
pub use crate::model::method::MethodRequest;
use crate::shard::Shards;

/// Calls queued for one connection before callers are told it is busy.
const QUEUE: usize = 32;
/// Calls sent to one connection and not answered yet.
pub const MAX_PENDING: usize = 64;
/// How often a call waiting for its device to connect looks again.
const CONNECT_POLL: Duration = Duration::from_millis(200);
/// Extra time a forwarded call gets beyond the device's response timeout.
const FORWARD_SLACK: Duration = Duration::from_secs(5);

/// The device's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MethodReply {
    pub status: i64,
    /// The device's payload as JSON text (`null` when it sent none).
    pub payload_json: String,
}

#[derive(Clone, Debug, PartialEq, thiserror::Error, Serialize, Deserialize)]
pub enum MethodError {
    /// No connection of the identity subscribed to methods (within the connect timeout).
    #[error("the device is not online, or not subscribed to methods")]
    NotOnline,
    /// Delivered, and no answer came within the response timeout.
    #[error("timed out waiting for the response from the device")]
    Timeout,
    /// The connection has too many calls in flight.
    #[error("too many method calls in flight for this device")]
    Busy,
}

/// One call as a connection receives it.
pub struct MethodCall {
    pub request: MethodRequest,
    pub reply: oneshot::Sender<Result<MethodReply, MethodError>>,
}

/// This node's device connections that can take method calls.
#[derive(Default)]
pub struct LocalMethods {
    conns: Mutex<HashMap<TwinId, (u64, mpsc::Sender<MethodCall>)>>,
    next: AtomicU64,
}

/// Removes a connection's registration when it ends, unless a newer connection of the same identity
/// replaced it meanwhile.
pub struct Attached {
    methods: Arc<LocalMethods>,
    id: TwinId,
    token: u64,
}

impl Drop for Attached {
    fn drop(&mut self) {
        let mut conns = self.methods.lock();
        if conns.get(&self.id).is_some_and(|(t, _)| *t == self.token) {
            conns.remove(&self.id);
        }
    }
}

impl LocalMethods {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TwinId, (u64, mpsc::Sender<MethodCall>)>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers the identity's new connection (replacing an older one: a takeover).
    pub fn attach(self: &Arc<Self>, id: &TwinId) -> (mpsc::Receiver<MethodCall>, Attached) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id.clone(), (token, tx));
        (rx, Attached { methods: self.clone(), id: id.clone(), token })
    }

    /// Calls the method on this node's connection of `id`; [`MethodError::NotOnline`] if there is none
    /// (or it is not subscribed).
    pub async fn call(&self, id: &TwinId, request: MethodRequest) -> Result<MethodReply, MethodError> {
        let Some(tx) = self.lock().get(id).map(|(_, tx)| tx.clone()) else { return Err(MethodError::NotOnline) };
        let timeout = Duration::from_secs(request.response_timeout_secs);
        let (reply, answer) = oneshot::channel();
        match tx.try_send(MethodCall { request, reply }) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => return Err(MethodError::Busy),
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(MethodError::NotOnline),
        }
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(r)) => r,
            // The connection ended before answering.
            Ok(Err(_)) => Err(MethodError::NotOnline),
            Err(_) => Err(MethodError::Timeout),
        }
    }
}

/// Routes method calls to wherever the device is connected.
pub struct Methods {
    local: Arc<LocalMethods>,
    transport: Option<Transport>,
    shards: Arc<Shards>,
}

impl Methods {
    /// With a `transport`, also answers the calls other nodes route here.
    pub fn new(local: Arc<LocalMethods>, transport: Option<Transport>, shards: Arc<Shards>) -> Arc<Methods> {
        if let Some(t) = &transport {
            let local = local.clone();
            t.handlers().register(Call::DeviceMethod, move |_from, body: bytes::Bytes| {
                let local = local.clone();
                async move {
                    let (id, request): (TwinId, MethodRequest) =
                        postcard::from_bytes(&body).map_err(|e| CallError(format!("bad method call: {e}")))?;
                    request.check().map_err(|e| CallError(format!("bad method call: {e}")))?;
                    let r = local.call(&id, request).await;
                    serde_json::to_vec(&r).map(bytes::Bytes::from).map_err(|e| CallError(e.to_string()))
                }
            });
        }
        Arc::new(Methods { local, transport, shards })
    }

    /// Calls `request` on `id`'s connection, waiting up to its connect timeout for one to appear.
    pub async fn invoke(&self, id: &TwinId, request: MethodRequest) -> Result<MethodReply, MethodError> {
        // A checked call never waits longer than the API allows; capped all the same, as an `Instant`
        // past the clock's range panics.
        let wait = request.connect_timeout_secs.min(*crate::model::method::CONNECT_TIMEOUT.end());
        let connect_by = Instant::now() + Duration::from_secs(wait);
        loop {
            match self.once(id, &request).await {
                Err(MethodError::NotOnline) if Instant::now() < connect_by => {
                    tokio::time::sleep(CONNECT_POLL.min(connect_by.saturating_duration_since(Instant::now()))).await;
                }
                r => return r,
            }
        }
    }

    async fn once(&self, id: &TwinId, request: &MethodRequest) -> Result<MethodReply, MethodError> {
        match self.local.call(id, request.clone()).await {
            Err(MethodError::NotOnline) => {}
            r => return r,
        }
        let Some(t) = &self.transport else { return Err(MethodError::NotOnline) };
        let body = match postcard::to_allocvec(&(id, request)) {
            Ok(b) => bytes::Bytes::from(b),
            Err(e) => {
                tracing::warn!("encoding a method call: {e}");
                return Err(MethodError::NotOnline);
            }
        };
        let deadline = Duration::from_secs(request.response_timeout_secs).saturating_add(FORWARD_SLACK);
        let me = t.node_id();
        let mut asked: FuturesUnordered<_> = self
            .shards
            .map()
            .members
            .keys()
            .copied()
            .filter(|n| *n != me)
            .map(|n| {
                let body = body.clone();
                async move { (n, t.call(n, Call::DeviceMethod, body, Some(deadline)).await) }
            })
            .collect();
        // Only the node holding the connection answers anything but NotOnline.
        while let Some((node, answer)) = asked.next().await {
            match answer.map(|b| serde_json::from_slice::<Result<MethodReply, MethodError>>(&b)) {
                Ok(Ok(Err(MethodError::NotOnline))) => {}
                Ok(Ok(r)) => return r,
                Ok(Err(e)) => tracing::warn!(node, "bad method answer: {e}"),
                Err(e) => tracing::debug!(node, "routing a method call: {e}"),
            }
        }
        Err(MethodError::NotOnline)
    }
}

/// The device's method answer as JSON text: as sent when it is JSON, `null` when empty, otherwise the
/// bytes as a JSON string (the caller always gets valid JSON). JSON is judged as untrusted JSON is
/// read everywhere (see `json_tree::parse_untrusted`), so an answer that holds serde_json's private
/// raw-value key travels as a string, never as JSON a later reader would follow.
pub fn answer_json(payload: &[u8]) -> String {
    let trimmed = payload.trim_ascii();
    if trimmed.is_empty() {
        return "null".into();
    }
    match std::str::from_utf8(trimmed) {
        Ok(text) if crate::model::json_tree::parse(text).is_ok() => text.to_string(),
        _ => serde_json::to_string(&String::from_utf8_lossy(payload)).unwrap_or_else(|_| "null".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_answers_always_become_json() {
        assert_eq!(answer_json(b""), "null");
        assert_eq!(answer_json(b" {\"a\": 1} "), "{\"a\": 1}");
        assert_eq!(answer_json(b"42"), "42");
        assert_eq!(answer_json(b"not json"), "\"not json\"");
    }

    fn request(timeout: u64) -> MethodRequest {
        MethodRequest {
            name: "reboot".into(),
            payload_json: "null".into(),
            response_timeout_secs: timeout,
            connect_timeout_secs: 0,
        }
    }

    #[tokio::test]
    async fn a_call_reaches_the_attached_connection_and_its_answer_comes_back() {
        let local = Arc::new(LocalMethods::default());
        let id = TwinId::device("d1");
        assert_eq!(local.call(&id, request(5)).await, Err(MethodError::NotOnline));
        let (mut rx, _attached) = local.attach(&id);
        let device = tokio::spawn(async move {
            let call = rx.recv().await.expect("call");
            assert_eq!(call.request.name, "reboot");
            let _ = call.reply.send(Ok(MethodReply { status: 200, payload_json: "{\"ok\":true}".into() }));
        });
        let r = local.call(&id, request(5)).await.expect("answer");
        assert_eq!(r.status, 200);
        device.await.unwrap();
        assert_eq!(local.call(&TwinId::device("d2"), request(5)).await, Err(MethodError::NotOnline), "other identity");
    }

    #[tokio::test]
    async fn a_takeover_keeps_the_new_registration_when_the_old_one_ends() {
        let local = Arc::new(LocalMethods::default());
        let id = TwinId::device("d1");
        let (_old_rx, old) = local.attach(&id);
        let (mut new_rx, _new) = local.attach(&id);
        drop(old);
        let call = tokio::spawn({
            let local = local.clone();
            let id = id.clone();
            async move { local.call(&id, request(5)).await }
        });
        let c = new_rx.recv().await.expect("the new connection gets the call");
        let _ = c.reply.send(Ok(MethodReply { status: 201, payload_json: "null".into() }));
        assert_eq!(call.await.unwrap().unwrap().status, 201);
    }

    #[tokio::test]
    async fn an_unanswered_call_times_out_and_a_dropped_connection_is_not_online() {
        let local = Arc::new(LocalMethods::default());
        let id = TwinId::device("d1");
        let (mut rx, attached) = local.attach(&id);
        let held = tokio::spawn(async move { rx.recv().await.map(|c| c.reply) });
        assert_eq!(local.call(&id, request(1)).await, Err(MethodError::Timeout));
        drop(held.await.unwrap());
        drop(attached);
        assert_eq!(local.call(&id, request(5)).await, Err(MethodError::NotOnline));
    }
}
