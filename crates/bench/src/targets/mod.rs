//! The systems under test behind one interface: a `Target` hands out one `Client` per worker (its own
//! connection), and a client updates one key with one JSON value, the same for twinhub (HTTPS PATCH of
//! the twin's desired properties), etcd (put through the v3 JSON gateway) and NATS JetStream KV (PUB to
//! `$KV.<bucket>.<key>` and wait for the JetStream ack).

pub mod etcd;
pub mod nats;
pub mod twinhub;

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use tokio::task::JoinHandle;

/// A failed operation: `kind` is a short class used as the error key (`timeout`, `http_503`, …).
#[derive(Debug, Clone)]
pub struct OpError {
    pub kind: String,
    pub detail: String,
}

impl OpError {
    pub fn new(kind: &str, detail: impl std::fmt::Display) -> OpError {
        OpError { kind: kind.to_string(), detail: detail.to_string() }
    }
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.detail)
    }
}

impl std::error::Error for OpError {}

/// Counts of a change watch: notifications (messages) received, and changes they carried (more than
/// one when the system coalesces several changes into one notification).
#[derive(Default, Debug)]
pub struct WatchCounts {
    pub notifications: AtomicU64,
    pub changes: AtomicU64,
}

/// A system under test.
pub trait Target: Send + Sync + 'static {
    type Client: Client;

    /// `twinhub`, `etcd` or `nats`.
    fn name(&self) -> &'static str;

    /// How the clients talk to it, for the report (protocol, connection model).
    fn protocol(&self) -> String;

    /// A new client for worker `worker` (workers are spread over the nodes round-robin).
    fn client(&self, worker: usize) -> impl Future<Output = anyhow::Result<Self::Client>> + Send;

    /// The key of twin number `i`.
    fn key(&self, i: usize) -> String {
        key_of(i)
    }

    /// Subscribes to changes of every key and counts them until the returned task is aborted.
    fn watch(&self, counts: Arc<WatchCounts>) -> impl Future<Output = anyhow::Result<JoinHandle<()>>> + Send;

    /// How it is watched, for the report.
    fn watch_kind(&self) -> String;
}

/// One worker's connection to a target.
pub trait Client: Send + 'static {
    /// Makes `key` exist before it is updated (twinhub registers the device); nothing for the KV stores.
    fn create(&mut self, _key: &str) -> impl Future<Output = Result<(), OpError>> + Send {
        async { Ok(()) }
    }

    /// Writes `value` (a JSON document) as the state of `key`, durably, and waits for the acknowledgement.
    fn update(&mut self, key: &str, value: &str) -> impl Future<Output = Result<(), OpError>> + Send;
}

/// The common key naming: `fb0000042`; valid as an IoT Hub device id, an etcd key suffix and a NATS
/// subject token.
pub fn key_of(i: usize) -> String {
    format!("fb{i:07}")
}
