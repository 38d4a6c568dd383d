//! MQTT sessions by client id, shared by every listener of the node (TLS and plain), so that a second
//! connection with the same client id finds and closes the first wherever it came in.
//!
//! A session holds the subscriptions and the `$rid` memory of one client id. With CleanSession=0 (MQTT
//! 5: clean start false and a session expiry) it outlives the connection: the Python SDK never
//! re-subscribes after a reconnect. A persistent session's subscriptions are also stored through Raft
//! (see `connection.rs`), so a device reconnecting to another node gets them back; the rest of a
//! session lives in this node's memory only.
//!
//! # Bounds
//! What a device can make the node remember is bounded on three axes, so that neither one device nor a
//! fleet of them can grow it without limit:
//!
//! - per session: at most [`MAX_SUBSCRIPTIONS`] filters of [`MAX_FILTER_BYTES`] in all, and the last
//!   [`RID_MEMORY`] `$rid`s, remembered as fixed-size hashes whatever their length ([`MAX_SESSION_BYTES`]
//!   in all);
//! - in time: a detached session is kept for at most [`MAX_SESSION_EXPIRY`];
//! - in number: at most [`MAX_DETACHED_SESSIONS`] detached persistent sessions; beyond that the one
//!   detached longest is dropped (its device starts a fresh session when it comes back).
//!
//! `/metrics` shows `twinhub_mqtt_sessions` (client ids with a session or a connection),
//! `twinhub_mqtt_sessions_detached` (persistent sessions kept for an absent device) and
//! `twinhub_mqtt_session_bytes` (what all sessions hold, as [`Session::bytes`] counts it).
//!
//! Every connection gets a generation number when it attaches. Only the connection whose generation is
//! current may end the session or report the identity disconnected, so a taken-over connection closing
//! late cannot overwrite the `connectionState` its successor wrote.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// Bytes of subscription filters one session may hold. The longest filter an SDK uses names a module's
/// inputs (`devices/{d}/modules/{m}/inputs/#`, under 300 bytes with the longest ids).
pub const MAX_FILTER_BYTES: usize = 2048;

/// `$rid`s remembered per session for at-most-once reported patches.
pub const RID_MEMORY: usize = 64;

/// Detached persistent sessions the node keeps; beyond this the one detached longest is dropped.
pub const MAX_DETACHED_SESSIONS: usize = 100_000;

/// The most one session can hold, as [`Session::bytes`] counts it.
pub const MAX_SESSION_BYTES: usize = std::mem::size_of::<Session>()
    + MAX_SUBSCRIPTIONS * std::mem::size_of::<Subscription>()
    + MAX_FILTER_BYTES
    + RID_MEMORY * std::mem::size_of::<RidEntry>();

// What the README and `/metrics` readers are told: a session stays under 8 KiB.
const _: () = assert!(MAX_SESSION_BYTES < 8 * 1024);

/// Expired sessions are swept at most this often (on a connect, under the lock it takes anyway).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// One subscription with its granted QoS (0 or 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscription {
    pub filter: String,
    pub qos: u8,
}

/// The bytes every session of a registry holds together, kept current by the sessions themselves and
/// mirrored in the `twinhub_mqtt_session_bytes` gauge. The gauge is set to the total rather than moved by
/// the change, so it is right even if the metrics recorder was installed after sessions existed.
#[derive(Clone, Debug, Default)]
pub struct Meter(Arc<AtomicUsize>);

impl Meter {
    fn adjust(&self, from: usize, to: usize) {
        let total = if to >= from {
            self.0.fetch_add(to - from, Ordering::Relaxed) + (to - from)
        } else {
            self.0.fetch_sub(from - to, Ordering::Relaxed).saturating_sub(from - to)
        };
        metrics::gauge!("twinhub_mqtt_session_bytes").set(total as f64);
    }

    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// What a session carries across connections.
#[derive(Debug, Default)]
pub struct Session {
    subscriptions: Vec<Subscription>,
    rids: RidMemory,
    meter: Meter,
    /// What this session last added to `meter`.
    counted: usize,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.meter.adjust(self.counted, 0);
    }
}

impl Session {
    fn new(meter: Meter) -> Session {
        let mut s = Session { subscriptions: Vec::new(), rids: RidMemory::default(), meter, counted: 0 };
        s.recount();
        s
    }

    /// The memory this session holds: itself, its subscriptions with their filters, its `$rid` memory.
    /// At most [`MAX_SESSION_BYTES`].
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Session>()
            + self.subscriptions.len() * std::mem::size_of::<Subscription>()
            + self.filter_bytes()
            + self.rids.entries.len() * std::mem::size_of::<RidEntry>()
    }

    fn filter_bytes(&self) -> usize {
        self.subscriptions.iter().map(|s| s.filter.len()).sum()
    }

    fn recount(&mut self) {
        let now = self.bytes();
        debug_assert!(now <= MAX_SESSION_BYTES, "{now} > {MAX_SESSION_BYTES}");
        self.meter.adjust(self.counted, now);
        self.counted = now;
    }

    /// Adds or replaces a subscription; the granted QoS, `None` if the filter is refused (invalid, or
    /// over the session's count or byte bound).
    pub fn subscribe(&mut self, filter: &str, requested_qos: u8) -> Option<u8> {
        if !topics::valid_filter(filter) {
            return None;
        }
        let qos = requested_qos.min(1);
        if let Some(s) = self.subscriptions.iter_mut().find(|s| s.filter == filter) {
            s.qos = qos;
            return Some(qos);
        }
        if self.subscriptions.len() >= MAX_SUBSCRIPTIONS || self.filter_bytes() + filter.len() > MAX_FILTER_BYTES {
            return None;
        }
        self.subscriptions.push(Subscription { filter: filter.to_string(), qos });
        self.recount();
        Some(qos)
    }

    /// Whether the filter was subscribed.
    pub fn unsubscribe(&mut self, filter: &str) -> bool {
        let before = self.subscriptions.len();
        self.subscriptions.retain(|s| s.filter != filter);
        self.recount();
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
        let id = self.rids.request_id(rid, payload, generation, dup);
        self.recount();
        id
    }
}

/// A small FIFO of (`$rid`, payload hash) → (request id, generation of the connection that sent it).
#[derive(Debug, Default)]
struct RidMemory {
    entries: VecDeque<RidEntry>,
}

/// One remembered request: fixed-size, so a device sending long `$rid`s cannot make it bigger. The
/// `$rid` is kept as a 128-bit hash: telling two of one device's requests apart needs no more.
#[derive(Debug)]
struct RidEntry {
    rid: u128,
    hash: u64,
    generation: u64,
    id: RequestId,
}

impl RidMemory {
    fn request_id(&mut self, rid: &str, payload: &[u8], generation: u64, dup: bool) -> RequestId {
        let hash = xxhash_rust::xxh3::xxh3_64(payload);
        let rid = xxhash_rust::xxh3::xxh3_128(rid.as_bytes());
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
        self.entries.push_back(RidEntry { rid, hash, generation, id });
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
    /// Detached persistent sessions by (detach time, generation): the oldest is dropped first when there
    /// are more than [`MAX_DETACHED_SESSIONS`].
    detached: BTreeMap<(Instant, u64), String>,
    next_generation: u64,
    last_sweep: Option<Instant>,
}

impl Inner {
    /// Takes an entry out of the detached index (it is attached again, or removed).
    fn undetach(&mut self, at: Option<Instant>, generation: u64) {
        if let Some(at) = at {
            self.detached.remove(&(at, generation));
        }
    }

    /// Drops the longest-detached persistent sessions while there are more than `max`. One whose
    /// connection-state write is still running is left for a later call (see [`sweep`]).
    fn evict(&mut self, max: usize) {
        while self.detached.len() > max {
            let Some(((at, generation), client_id)) = self.detached.pop_first() else { return };
            let busy = self.by_client.get(&client_id).is_some_and(|e| Arc::strong_count(&e.state_sync) > 1);
            if busy {
                self.detached.insert((at, generation), client_id);
                return;
            }
            let idle = self.by_client.get(&client_id).is_some_and(|e| e.live.is_none() && e.generation == generation);
            if idle {
                self.by_client.remove(&client_id);
                metrics::counter!("twinhub_mqtt_sessions_evicted_total").increment(1);
            }
        }
    }

    fn publish(&self) {
        metrics::gauge!("twinhub_mqtt_sessions").set(self.by_client.len() as f64);
        metrics::gauge!("twinhub_mqtt_sessions_detached").set(self.detached.len() as f64);
    }
}

/// The node's session registry.
#[derive(Default)]
pub struct Sessions {
    inner: Mutex<Inner>,
    meter: Meter,
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
            sweep(&mut inner, now);
        }
        inner.next_generation += 1;
        let generation = inner.next_generation;
        let taken_over = CancellationToken::new();
        let expiry = req.expiry.min(MAX_SESSION_EXPIRY);
        if let Some(e) = inner.by_client.get(client_id) {
            let (at, g) = (e.detached_at, e.generation);
            inner.undetach(at, g);
        }
        let fresh = || Arc::new(Mutex::new(Session::new(self.meter.clone())));
        let entry = inner.by_client.entry(client_id.to_string()).or_insert_with(|| Entry {
            generation,
            live: None,
            session: fresh(),
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
            entry.session = fresh();
        }
        entry.generation = generation;
        entry.live = Some(taken_over.clone());
        entry.resumable = !expiry.is_zero();
        entry.expiry = expiry;
        entry.detached_at = None;
        let attached = Attached {
            generation,
            session: entry.session.clone(),
            present,
            taken_over,
            state_sync: entry.state_sync.clone(),
        };
        inner.publish();
        attached
    }

    /// Detaches a closing connection. Returns its state sync if it was still the current connection of
    /// the client id (then it must report the identity disconnected), `None` if it was taken over.
    pub fn detach(&self, client_id: &str, generation: u64) -> Option<StateSync> {
        self.detach_bounded(client_id, generation, MAX_DETACHED_SESSIONS)
    }

    fn detach_bounded(&self, client_id: &str, generation: u64, max_detached: usize) -> Option<StateSync> {
        let mut inner = lock(&self.inner);
        let entry = inner.by_client.get_mut(client_id)?;
        if entry.generation != generation {
            return None;
        }
        let now = Instant::now();
        entry.live = None;
        entry.detached_at = Some(now);
        if !entry.resumable {
            entry.session = Arc::new(Mutex::new(Session::new(self.meter.clone())));
        }
        let (sync, resumable) = (entry.state_sync.clone(), entry.resumable);
        if resumable {
            inner.detached.insert((now, generation), client_id.to_string());
            inner.evict(max_detached);
        }
        inner.publish();
        Some(sync)
    }

    /// Whether a connection is attached to `client_id` now.
    pub fn is_live(&self, client_id: &str) -> bool {
        lock(&self.inner).by_client.get(client_id).is_some_and(|e| e.live.is_some())
    }

    /// Number of client ids with a session or a connection (metrics, tests).
    pub fn len(&self) -> usize {
        lock(&self.inner).by_client.len()
    }

    /// What all sessions of this registry hold, in bytes (see [`Session::bytes`]).
    pub fn bytes(&self) -> usize {
        self.meter.get()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Drops sessions that are detached and expired, unless a connection-state write still holds their
/// sync (clones are only made under the registry lock, so the count cannot grow behind our back).
fn sweep(inner: &mut Inner, now: Instant) {
    let Inner { by_client, detached, .. } = inner;
    by_client.retain(|_, e| {
        let keep = e.live.is_some()
            || Arc::strong_count(&e.state_sync) > 1
            || e.detached_at.is_none_or(|t| now.duration_since(t) < e.expiry);
        if !keep {
            if let Some(at) = e.detached_at {
                detached.remove(&(at, e.generation));
            }
        }
        keep
    });
    inner.publish();
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
        sweep(&mut inner, Instant::now());
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

    #[test]
    fn filters_are_bounded_in_bytes_and_rids_in_size_whatever_their_length() {
        let mut s = Session::default();
        let long = format!("{}/#", "f".repeat(MAX_FILTER_BYTES - 200));
        assert_eq!(s.subscribe(&long, 1), Some(1));
        assert_eq!(s.subscribe(&format!("{}/#", "g".repeat(300)), 1), None, "over the byte budget");
        assert_eq!(s.subscribe("$iothub/twin/res/#", 0), Some(0), "a short one still fits");
        let before = s.bytes();
        for i in 0..1000 {
            s.request_id(&format!("{i}-{}", "r".repeat(60_000)), b"{}", 1, false);
        }
        assert!(s.bytes() <= MAX_SESSION_BYTES, "{} > {MAX_SESSION_BYTES}", s.bytes());
        assert!(s.bytes() - before <= RID_MEMORY * std::mem::size_of::<RidEntry>());
    }

    #[test]
    fn the_meter_follows_every_session_and_their_end() {
        let s = Sessions::default();
        let a = s.attach("d1", KEEP);
        let empty = s.bytes();
        assert!(empty > 0);
        lock(&a.session).subscribe("$iothub/twin/PATCH/properties/desired/#", 1);
        lock(&a.session).request_id("1", b"{}", a.generation, false);
        let used = s.bytes();
        assert_eq!(used, lock(&a.session).bytes());
        assert!(used > empty);
        let b = s.attach("d2", KEEP);
        assert_eq!(s.bytes(), used + empty);
        // A clean start drops the old session: its bytes go with it once nobody holds it.
        s.detach("d1", a.generation);
        drop(a);
        let c = s.attach("d1", CLEAN);
        assert_eq!(s.bytes(), 2 * empty);
        drop((b, c));
    }

    #[test]
    fn the_longest_detached_sessions_are_dropped_beyond_the_bound() {
        let s = Sessions::default();
        for i in 0..5 {
            let id = format!("d{i}");
            let a = s.attach(&id, KEEP);
            lock(&a.session).subscribe("x/#", 1);
            let sync = s.detach_bounded(&id, a.generation, 3);
            assert!(sync.is_some());
        }
        assert_eq!(s.len(), 3);
        assert_eq!(lock(&s.inner).detached.len(), 3);
        assert!(!s.attach("d0", KEEP).present, "the oldest was dropped");
        assert!(s.attach("d4", KEEP).present, "the newest is kept");
        // Re-attaching takes a session out of the detached index.
        assert_eq!(lock(&s.inner).detached.len(), 2);
    }
}
