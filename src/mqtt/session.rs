//! MQTT sessions by client id, shared by every listener of the node (TLS and plain), so that a second
//! connection with the same client id finds and closes the first wherever it came in.
//!
//! A session holds the subscriptions and the `$rid` memory of one client id. With CleanSession=0 (MQTT
//! 5: clean start false and a session expiry) it outlives the connection: the Python SDK never
//! re-subscribes after a reconnect (spec §1.6). Sessions live in this node's memory only: a restart or a
//! device reconnecting to another node starts afresh (issue 4 moves sessions with the cluster).
//!
//! Every connection gets a generation number when it attaches. Only the connection whose generation is
//! current may end the session or report the identity disconnected, so a taken-over connection closing
//! late cannot overwrite the `connectionState` its successor wrote.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::topics;
use crate::model::RequestId;

/// How long a persistent session outlives its connection when the client gave no bound (MQTT 3.1.1
/// has none; IoT Hub keeps them for days). Bounds the memory of devices that never come back.
pub const MAX_SESSION_EXPIRY: Duration = Duration::from_secs(7 * 24 * 3600);

/// Subscriptions one session may hold (an SDK uses two or three).
pub const MAX_SUBSCRIPTIONS: usize = 32;

/// `$rid`s remembered per session for at-most-once reported patches.
pub const RID_MEMORY: usize = 64;

/// Expired sessions are swept at most this often (on a connect, under the lock it takes anyway).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// One subscription with its granted QoS (0 or 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscription {
    pub filter: String,
    pub qos: u8,
}

/// What a session carries across connections.
#[derive(Debug, Default)]
pub struct Session {
    subscriptions: Vec<Subscription>,
    rids: RidMemory,
}

impl Session {
    /// Adds or replaces a subscription; the granted QoS, `None` if the filter is refused.
    pub fn subscribe(&mut self, filter: &str, requested_qos: u8) -> Option<u8> {
        if !topics::valid_filter(filter) {
            return None;
        }
        let qos = requested_qos.min(1);
        if let Some(s) = self.subscriptions.iter_mut().find(|s| s.filter == filter) {
            s.qos = qos;
            return Some(qos);
        }
        if self.subscriptions.len() >= MAX_SUBSCRIPTIONS {
            return None;
        }
        self.subscriptions.push(Subscription { filter: filter.to_string(), qos });
        Some(qos)
    }

    /// Whether the filter was subscribed.
    pub fn unsubscribe(&mut self, filter: &str) -> bool {
        let before = self.subscriptions.len();
        self.subscriptions.retain(|s| s.filter != filter);
        self.subscriptions.len() != before
    }

    /// The QoS to deliver `topic` at: the highest granted by a matching subscription, `None` if no
    /// subscription matches (MQTT 3.1.1 §3.3.5).
    pub fn delivery_qos(&self, topic: &str) -> Option<u8> {
        self.subscriptions.iter().filter(|s| topics::matches(&s.filter, topic)).map(|s| s.qos).max()
    }

    pub fn subscriptions(&self) -> &[Subscription] {
        &self.subscriptions
    }

    /// The request id of a reported patch. A repeat of a `$rid` with the same payload gets the id
    /// generated when it was first received, so the state machine (which applies a request id at most
    /// once and answers a repeat with the first outcome) applies it once: on the same connection, or
    /// on a later one when the client marks it DUP (a re-send after reconnect). Anything else is a new
    /// request: a `$rid` with a different payload, or an undupped one on a new connection — the C SDK's
    /// numeric `$rid` counter restarts with the process, and an identical report after a restart must
    /// still apply.
    pub fn request_id(&mut self, rid: &str, payload: &[u8], generation: u64, dup: bool) -> RequestId {
        self.rids.request_id(rid, payload, generation, dup)
    }
}

/// A small FIFO of (`$rid`, payload hash) → (request id, generation of the connection that sent it).
#[derive(Debug, Default)]
struct RidMemory {
    entries: VecDeque<RidEntry>,
}

#[derive(Debug)]
struct RidEntry {
    rid: String,
    hash: u64,
    generation: u64,
    id: RequestId,
}

impl RidMemory {
    fn request_id(&mut self, rid: &str, payload: &[u8], generation: u64, dup: bool) -> RequestId {
        let hash = xxhash_rust::xxh3::xxh3_64(payload);
        if let Some(i) = self.entries.iter().position(|e| e.hash == hash && e.rid == rid) {
            if dup || self.entries[i].generation == generation {
                self.entries[i].generation = generation;
                return self.entries[i].id;
            }
            self.entries.remove(i);
        }
        let id = RequestId::random();
        if self.entries.len() >= RID_MEMORY {
            self.entries.pop_front();
        }
        self.entries.push_back(RidEntry { rid: rid.to_string(), hash, generation, id });
        id
    }
}

/// The last `connectionState` written for a client id (`None`: unknown). Held across the write, so the
/// writes of successive connections of one client id happen one at a time, each writing what the
/// registry says *now*: the last one always leaves the true state.
pub type StateSync = Arc<tokio::sync::Mutex<Option<bool>>>;

struct Entry {
    generation: u64,
    /// Cancelled to close the live connection (takeover); `None` while no connection is attached.
    live: Option<CancellationToken>,
    session: Arc<Mutex<Session>>,
    /// Whether `session` may be resumed by a later CONNECT without clean start.
    resumable: bool,
    /// How long the session outlives a detached connection.
    expiry: Duration,
    detached_at: Option<Instant>,
    state_sync: StateSync,
}

/// A connection's hold on its session.
pub struct Attached {
    pub generation: u64,
    pub session: Arc<Mutex<Session>>,
    /// The CONNACK session-present flag.
    pub present: bool,
    /// Cancelled when another connection takes this client id over.
    pub taken_over: CancellationToken,
    pub state_sync: StateSync,
}

/// How a connection wants its session handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionRequest {
    /// CleanSession=1 (MQTT 5: clean start): discard any previous session.
    pub clean_start: bool,
    /// How long to keep the session once the connection ends; zero: it ends with the connection.
    pub expiry: Duration,
}

#[derive(Default)]
struct Inner {
    by_client: HashMap<String, Entry>,
    next_generation: u64,
    last_sweep: Option<Instant>,
}

/// The node's session registry.
#[derive(Default)]
pub struct Sessions {
    inner: Mutex<Inner>,
}

/// Locks a std mutex, ignoring poisoning: the data behind these locks stays consistent at every await
/// point (none is held across one), so a panic elsewhere leaves nothing half-written.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Sessions {
    /// Attaches a new connection to `client_id`'s session: closes the connection currently attached (if
    /// any), resumes or starts the session.
    pub fn attach(&self, client_id: &str, req: SessionRequest) -> Attached {
        let mut inner = lock(&self.inner);
        let now = Instant::now();
        if inner.last_sweep.is_none_or(|t| now.duration_since(t) >= SWEEP_EVERY) {
            inner.last_sweep = Some(now);
            sweep(&mut inner.by_client, now);
        }
        inner.next_generation += 1;
        let generation = inner.next_generation;
        let taken_over = CancellationToken::new();
        let expiry = req.expiry.min(MAX_SESSION_EXPIRY);
        let entry = inner.by_client.entry(client_id.to_string()).or_insert_with(|| Entry {
            generation,
            live: None,
            session: Arc::default(),
            resumable: false,
            expiry,
            detached_at: None,
            state_sync: Arc::default(),
        });
        if let Some(old) = entry.live.take() {
            tracing::info!(client_id, "a new connection takes over the client id; closing the old one");
            metrics::counter!("twinhub_mqtt_takeovers_total").increment(1);
            old.cancel();
        }
        let expired = entry.detached_at.is_some_and(|t| now.duration_since(t) >= entry.expiry);
        let present = entry.resumable && !req.clean_start && !expired;
        if !present {
            entry.session = Arc::default();
        }
        entry.generation = generation;
        entry.live = Some(taken_over.clone());
        entry.resumable = !expiry.is_zero();
        entry.expiry = expiry;
        entry.detached_at = None;
        Attached {
            generation,
            session: entry.session.clone(),
            present,
            taken_over,
            state_sync: entry.state_sync.clone(),
        }
    }

    /// Detaches a closing connection. Returns its state sync if it was still the current connection of
    /// the client id (then it must report the identity disconnected), `None` if it was taken over.
    pub fn detach(&self, client_id: &str, generation: u64) -> Option<StateSync> {
        let mut inner = lock(&self.inner);
        let entry = inner.by_client.get_mut(client_id)?;
        if entry.generation != generation {
            return None;
        }
        entry.live = None;
        entry.detached_at = Some(Instant::now());
        if !entry.resumable {
            entry.session = Arc::default();
        }
        Some(entry.state_sync.clone())
    }

    /// Whether a connection is attached to `client_id` now.
    pub fn is_live(&self, client_id: &str) -> bool {
        lock(&self.inner).by_client.get(client_id).is_some_and(|e| e.live.is_some())
    }

    /// Number of client ids with a session or a connection (metrics, tests).
    pub fn len(&self) -> usize {
        lock(&self.inner).by_client.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Drops sessions that are detached and expired, unless a connection-state write still holds their
/// sync (clones are only made under the registry lock, so the count cannot grow behind our back).
fn sweep(by_client: &mut HashMap<String, Entry>, now: Instant) {
    by_client.retain(|_, e| {
        e.live.is_some()
            || Arc::strong_count(&e.state_sync) > 1
            || e.detached_at.is_none_or(|t| now.duration_since(t) < e.expiry)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEEP: SessionRequest = SessionRequest { clean_start: false, expiry: Duration::from_secs(3600) };
    const CLEAN: SessionRequest = SessionRequest { clean_start: true, expiry: Duration::ZERO };

    #[test]
    fn persistent_session_keeps_subscriptions_across_connections() {
        let s = Sessions::default();
        let a = s.attach("d1", KEEP);
        assert!(!a.present);
        assert_eq!(lock(&a.session).subscribe("$iothub/twin/PATCH/properties/desired/#", 1), Some(1));
        assert!(s.detach("d1", a.generation).is_some());
        assert!(!s.is_live("d1"));
        let b = s.attach("d1", KEEP);
        assert!(b.present);
        assert_eq!(lock(&b.session).delivery_qos("$iothub/twin/PATCH/properties/desired/?$version=2"), Some(1));
        // Clean start drops it.
        s.detach("d1", b.generation);
        let c = s.attach("d1", CLEAN);
        assert!(!c.present);
        assert!(lock(&c.session).subscriptions().is_empty());
        // A clean session ends with its connection.
        lock(&c.session).subscribe("a/#", 0);
        s.detach("d1", c.generation);
        let d = s.attach("d1", KEEP);
        assert!(!d.present);
        assert!(lock(&d.session).subscriptions().is_empty());
    }

    #[test]
    fn takeover_cancels_the_old_connection_and_only_the_current_one_detaches() {
        let s = Sessions::default();
        let a = s.attach("d1", KEEP);
        lock(&a.session).subscribe("x/#", 1);
        let b = s.attach("d1", KEEP);
        assert!(a.taken_over.is_cancelled());
        assert!(!b.taken_over.is_cancelled());
        assert!(b.present, "a persistent session taken over is resumed");
        assert!(Arc::ptr_eq(&a.session, &b.session));
        assert!(s.detach("d1", a.generation).is_none(), "the old connection is not current any more");
        assert!(s.is_live("d1"));
        assert!(s.detach("d1", b.generation).is_some());
        assert!(!s.is_live("d1"));
        // Other client ids are independent.
        let c = s.attach("d2", CLEAN);
        assert!(!c.taken_over.is_cancelled());
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn expired_sessions_are_not_resumed() {
        let s = Sessions::default();
        let short = SessionRequest { clean_start: false, expiry: Duration::from_millis(1) };
        let a = s.attach("d1", short);
        lock(&a.session).subscribe("x", 0);
        s.detach("d1", a.generation);
        std::thread::sleep(Duration::from_millis(5));
        assert!(!s.attach("d1", short).present);
    }

    #[test]
    fn sweep_keeps_live_recent_and_busy_entries() {
        let s = Sessions::default();
        let gone = s.attach("gone", CLEAN);
        s.detach("gone", gone.generation);
        let busy = s.attach("busy", CLEAN);
        let sync = s.detach("busy", busy.generation);
        let _live = s.attach("live", CLEAN);
        let kept = s.attach("kept", KEEP);
        s.detach("kept", kept.generation);
        drop((gone, busy));
        let mut inner = lock(&s.inner);
        sweep(&mut inner.by_client, Instant::now());
        let mut left: Vec<&str> = inner.by_client.keys().map(String::as_str).collect();
        left.sort();
        assert_eq!(left, ["busy", "kept", "live"]);
        drop(sync);
    }

    #[test]
    fn subscriptions_grant_at_most_qos_1_and_refuse_bad_filters() {
        let mut s = Session::default();
        assert_eq!(s.subscribe("$iothub/twin/res/#", 2), Some(1));
        assert_eq!(s.subscribe("$iothub/twin/res/#", 0), Some(0), "re-subscribing replaces");
        assert_eq!(s.subscriptions().len(), 1);
        assert_eq!(s.subscribe("a/#/b", 1), None);
        assert_eq!(s.subscribe("$iothub/#", 1), Some(1));
        assert_eq!(s.delivery_qos("$iothub/twin/res/200/?$rid=1"), Some(1), "the highest matching grant");
        assert_eq!(s.delivery_qos("other"), None);
        assert!(s.unsubscribe("$iothub/#"));
        assert!(!s.unsubscribe("$iothub/#"));
        for i in 0..MAX_SUBSCRIPTIONS {
            s.subscribe(&format!("f/{i}"), 0);
        }
        assert_eq!(s.subscribe("one/too/many", 0), None);
    }

    #[test]
    fn rid_memory_reuses_ids_for_identical_repeats_only() {
        let mut s = Session::default();
        let a = s.request_id("1", b"{\"a\":1}", 1, false);
        assert_eq!(s.request_id("1", b"{\"a\":1}", 1, false), a, "a repeat on the same connection");
        assert_eq!(s.request_id("1", b"{\"a\":1}", 2, true), a, "a DUP re-send after reconnect");
        assert_ne!(s.request_id("1", b"{\"a\":2}", 2, false), a, "same rid, new payload: a new request");
        assert_ne!(s.request_id("2", b"{\"a\":1}", 2, false), a);
        let fresh = s.request_id("1", b"{\"a\":1}", 3, false);
        assert_ne!(fresh, a, "not a DUP, new connection: the client restarted its rid counter");
        assert_eq!(s.request_id("1", b"{\"a\":1}", 3, false), fresh);
        for i in 0..RID_MEMORY {
            s.request_id(&format!("x{i}"), b"", 3, false);
        }
        assert_ne!(s.request_id("1", b"{\"a\":1}", 3, true), fresh, "forgotten after {RID_MEMORY} newer rids");
    }
}
