//! Notifications derived from committed state: desired-property pushes to connected devices and the
//! twin change feed for back ends (SSE on the HTTPS port, the embedded event broker).
//!
//! Every replica's state machine hands the events of each applied command to [`Hub::publish`] (through
//! [`Hub::sink`]), in log order per shard. Publishing only queues: each subscriber has its own bounded
//! queue, and while a subscriber is busy its pending notifications for one twin merge into one that
//! carries the latest version (docs/architecture.md, invariant 7: never backwards, never skipping the final state).
//!
//! # Layout
//! - `coalesce.rs`: pure, exact merging of JSON merge patches, `$metadata` and change bodies.
//! - `queue.rs`: the per-subscriber queues (`PushQueue`, `FeedQueue`), no locks.
//! - `event.rs`: model events → [`ChangeEvent`] (application properties, JSON form).
//! - this file: the [`Hub`] that owns the queues behind two short-lived std mutexes (one for device
//!   registrations, one for the feed), the retained ring and the wake-ups.
//! - `broker.rs`: the embedded MQTT event broker for back ends.
//!
//! # The feed
//! Every change event gets a node-local sequence number; its position is `"{epoch}-{seq}"`, where the
//! epoch is random per process start, so a `Last-Event-ID` from an earlier run or another node is
//! recognised as foreign and answered with [`FeedItem::Resync`]. The last [`HubConfig::retained`]
//! events (at most [`HubConfig::retained_bytes`]) stay in a ring: a consumer resuming from a retained
//! position first reads the ring (events exactly as published, not coalesced), then switches to live
//! delivery in the same critical section that publishing uses, so nothing falls between the two. Live
//! consumers get their own bounded, coalescing queue; one that falls [`HubConfig::feed_queue`] behind
//! gets a `Resync` and continues live.
//!
//! Model events carry no time, so `operationTimestamp` is the wall clock when this node published the
//! event. Each node's feed holds the events of the shards it replicates, numbered in the order this
//! node applied them. What a starting node re-applies from its log is not published: the feed's
//! epoch is new and no consumer or device can attach before the node's front doors open.
//!
//! # Known limitation of resuming after coalescing
//! A merged event moves to the position of its newest part, so positions a consumer receives strictly
//! increase. If a consumer disconnects right after receiving an event of twin U at position p while a
//! merged event of twin T (holding a change of T *older* than p) is still pending, resuming from p
//! replays only T's changes after p: the older part is not sent again. Consumers that must never miss a
//! change re-read the twins they care about after a reconnect (as after a `Resync`).

pub mod broker;
mod coalesce;
mod event;
mod queue;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::ids::{ShardId, TwinId};
use crate::model::{Event, JsonText};
use crate::shard::EventSink;

use queue::{Change, FeedQueue, Offered, PushQueue};

/// Limits of the hub's queues.
#[derive(Clone, Debug)]
pub struct HubConfig {
    /// IoT Hub's name as it appears in change-event properties (`hubName`): the configured host name's
    /// first label.
    pub hub_name: String,
    /// Pending (already coalesced) desired pushes per device connection before the connection is
    /// closed so that the device re-reads its twin on reconnect.
    pub device_queue: usize,
    /// Pending change events per feed consumer before it is told to resync.
    pub feed_queue: usize,
    /// Change events kept for consumers resuming with `Last-Event-ID`.
    pub retained: usize,
    /// ... and at most this many bytes of them (JSON size): twin bodies run to tens of KB, so a count
    /// alone could pin gigabytes.
    pub retained_bytes: usize,
    /// Feeds clients may hold at once ([`Hub::admit_client_feed`]): each has a queue of its own.
    pub max_client_feeds: usize,
}

impl HubConfig {
    pub fn new(hostname: &str) -> HubConfig {
        HubConfig {
            hub_name: hostname.split(['.', ':']).next().unwrap_or(hostname).to_string(),
            device_queue: 256,
            feed_queue: 8192,
            retained: 65_536,
            // JSON size; parsed, a change takes roughly 3-4 times that in memory.
            retained_bytes: 16 << 20,
            max_client_feeds: 256,
        }
    }
}

/// The node's notification hub.
pub struct Hub {
    config: HubConfig,
    /// Random per process start: positions from another run or node are recognised as foreign.
    epoch: String,
    pushes: Mutex<PushState>,
    feed: Mutex<FeedState>,
    /// Whether a position of the feed has been handed out (by [`Hub::head`], with an event or a
    /// resync) or a consumer was listening when changes were published. Until then no one can ever
    /// read a change (positions are this process's own, and live consumers only see what is
    /// published while they listen), so changes are counted but not built or retained: a bulk load
    /// into a node nobody follows costs no change events. Never goes back to false.
    issued: AtomicBool,
    closed: AtomicBool,
    /// Client feeds admitted and not yet dropped.
    client_feeds: AtomicUsize,
}

/// A client feed's place among the [`HubConfig::max_client_feeds`]; freed when dropped.
pub struct FeedPermit(Arc<Hub>);

impl Drop for FeedPermit {
    fn drop(&mut self) {
        self.0.client_feeds.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Device connections registered for desired pushes.
#[derive(Default)]
struct PushState {
    next_id: u64,
    /// Registrations per identity (several during a takeover).
    by_twin: HashMap<TwinId, Vec<u64>>,
    regs: HashMap<u64, Registration>,
}

struct Registration {
    queue: PushQueue,
    notify: Arc<Notify>,
}

/// The change feed: sequence, retained ring and consumers.
struct FeedState {
    /// Sequence of the last published event (0: none yet).
    seq: u64,
    /// The last `retained` changes; `ring[i].seq == ring_first + i`.
    ring: VecDeque<Arc<Change>>,
    /// JSON size of the changes in `ring`.
    ring_bytes: usize,
    next_id: u64,
    consumers: HashMap<u64, Consumer>,
}

impl FeedState {
    /// Sequence of the oldest retained change (`seq + 1` when the ring is empty).
    fn ring_first(&self) -> u64 {
        self.ring.front().map_or(self.seq + 1, |c| c.seq)
    }
}

/// Which events a consumer wants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeedFilter {
    /// Only this device and its modules.
    pub device_id: Option<String>,
    /// Only this module (with `device_id`).
    pub module_id: Option<String>,
}

impl FeedFilter {
    pub fn matches(&self, twin: &TwinId) -> bool {
        self.device_id.as_ref().is_none_or(|d| *d == twin.device_id)
            && self.module_id.as_ref().is_none_or(|m| twin.module_id.as_ref() == Some(m))
    }
}

enum Mode {
    /// Reading the ring after this sequence (a resumed consumer catching up).
    Replay { after: u64 },
    /// Receiving published changes in its own queue.
    Live,
}

/// Whether a consumer's reader can see live changes at all right now (see [`Hub::changes_while`]).
pub type Listening = Arc<dyn Fn() -> bool + Send + Sync>;

struct Consumer {
    filter: FeedFilter,
    /// Live changes are skipped while this says no one can see them (no copy, no queueing).
    listening: Option<Listening>,
    mode: Mode,
    queue: FeedQueue,
    /// A resync to deliver before anything else: (position, reason).
    resync: Option<(String, String)>,
    notify: Arc<Notify>,
}

/// One desired-property push for a device connection: publish `body` on
/// `$iothub/twin/PATCH/properties/desired/?$version={version}`.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredPush {
    pub version: i64,
    /// The JSON patch including `"$version"`.
    pub body: Vec<u8>,
    /// How many committed patches this push carries (1 when nothing was coalesced).
    pub merged: u32,
}

/// A device connection's registration for desired pushes; dropping it unregisters.
pub struct DesiredPushes {
    hub: Arc<Hub>,
    id: TwinId,
    reg: u64,
    notify: Arc<Notify>,
}

impl DesiredPushes {
    /// The next push. `None` means the queue overflowed: close the connection (the device re-reads its
    /// twin when it reconnects) — or the hub shut down.
    ///
    /// Cancel safe: a push is removed from the queue only when this returns it, so using it in
    /// `select!` loses nothing.
    pub async fn next(&mut self) -> Option<DesiredPush> {
        loop {
            match self.hub.take_push(self.reg) {
                Step::Item(p) => return Some(p),
                Step::End => return None,
                Step::Wait => self.notify.notified().await,
                Step::Again => tokio::task::yield_now().await,
            }
        }
    }

    /// The identity this registration is for.
    pub fn id(&self) -> &TwinId {
        &self.id
    }
}

impl Drop for DesiredPushes {
    fn drop(&mut self) {
        self.hub.unregister_pushes(&self.id, self.reg);
    }
}

/// Which IoT Hub event stream an event belongs to (`iothub-message-source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    TwinChangeEvents,
    DeviceLifecycleEvents,
    DeviceConnectionStateEvents,
}

/// One change event as back ends receive it.
#[derive(Clone, Debug, PartialEq)]
pub struct ChangeEvent {
    /// Position in this node's feed, for `Last-Event-ID`.
    pub position: String,
    pub source: Source,
    pub device_id: String,
    pub module_id: Option<String>,
    /// Application properties: hubName, deviceId, moduleId, operationTimestamp, iothub-message-schema, opType.
    pub properties: Vec<(&'static str, String)>,
    /// The body as JSON text: the feed keeps it, every consumer sends it as it is, and only coalescing
    /// looks inside.
    pub body: JsonText,
    /// How many committed changes this event carries.
    pub merged: u32,
}

/// What a feed consumer receives next.
#[derive(Clone, Debug, PartialEq)]
pub enum FeedItem {
    /// Shared with the feed's retained ring and every other consumer it reached: handing an event out
    /// copies nothing.
    Event(Arc<ChangeEvent>),
    /// The consumer's position is no longer retained (too old, or from an earlier run of this node), or
    /// it fell too far behind: re-read the twins it cares about, then carry on from here.
    Resync { position: String, reason: String },
}

/// A consumer's view of the change feed; dropping it unregisters.
pub struct ChangeFeed {
    hub: Arc<Hub>,
    id: u64,
    notify: Arc<Notify>,
}

impl ChangeFeed {
    /// The next event or resync; `None` once the hub is closed. Cancel safe.
    pub async fn next(&mut self) -> Option<FeedItem> {
        let mut one = Vec::with_capacity(1);
        if self.next_batch(&mut one, 1).await {
            one.pop()
        } else {
            None
        }
    }

    /// Waits for the next event or resync, then moves it and up to `max - 1` more that are ready
    /// into `out`, in order, under one lock: a consumer that forwards every event (the event broker)
    /// takes what queued while it was busy in one go instead of one wake-up and one lock each.
    /// `false` once the hub is closed. Cancel safe: nothing is taken unless it is returned.
    pub async fn next_batch(&mut self, out: &mut Vec<FeedItem>, max: usize) -> bool {
        loop {
            match self.hub.take_feed(self.id, out, max.max(1)) {
                Step::Item(()) => return true,
                Step::End => return false,
                Step::Wait => self.notify.notified().await,
                Step::Again => tokio::task::yield_now().await,
            }
        }
    }
}

impl Drop for ChangeFeed {
    fn drop(&mut self) {
        self.hub.unregister_feed(self.id);
    }
}

/// One attempt to take from a queue.
enum Step<T> {
    Item(T),
    Wait,
    /// Made progress without a result; yield to the runtime and try again.
    Again,
    End,
}

/// A poisoned lock means a panic while it was held; carry on with the queues as they are rather than
/// spread the panic into the state machine that publishes.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How many ring entries one `take_feed` call scans for a filtered consumer before releasing the lock.
const REPLAY_SCAN: usize = 1024;

impl Hub {
    pub fn new(config: HubConfig) -> Arc<Hub> {
        let epoch = format!("{:016x}", rand::random::<u64>());
        Arc::new(Hub {
            config,
            epoch,
            pushes: Mutex::new(PushState::default()),
            feed: Mutex::new(FeedState {
                seq: 0,
                ring: VecDeque::new(),
                ring_bytes: 0,
                next_id: 0,
                consumers: HashMap::new(),
            }),
            issued: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            client_feeds: AtomicUsize::new(0),
        })
    }

    pub fn config(&self) -> &HubConfig {
        &self.config
    }

    /// The sink to give the shards.
    pub fn sink(self: &Arc<Self>) -> EventSink {
        let (hub, gaps, observer) = (self.clone(), self.clone(), self.clone());
        EventSink {
            publish: Arc::new(move |shard, events| hub.publish(shard, events)),
            gap: Arc::new(move |shard| gaps.gap(shard)),
            observed: Arc::new(move || observer.observed()),
        }
    }

    /// Some change events of `shard` were lost to this node (its tail fell behind): every feed consumer
    /// is told to resync at the current position instead of silently missing them. (A consumer that
    /// follows other twins only gets a resync it did not need: harmless.)
    pub fn gap(&self, shard: ShardId) {
        let mut st = lock(&self.feed);
        let position = self.position(st.seq);
        if !st.consumers.is_empty() {
            self.issued.store(true, Ordering::Release);
        }
        let n = st.consumers.len();
        for c in st.consumers.values_mut() {
            c.queue.clear();
            c.mode = Mode::Live;
            c.resync = Some((
                position.clone(),
                format!("change events of shard {shard} could not be fetched from its replicas"),
            ));
            c.notify.notify_one();
        }
        drop(st);
        metrics::counter!("twinhub_notify_feed_resyncs_total", "reason" => "tail_gap").increment(n as u64);
    }

    fn position(&self, seq: u64) -> String {
        format!("{}-{seq}", self.epoch)
    }

    /// The position of the newest event published so far (`{epoch}-0` before the first).
    pub fn head(&self) -> String {
        let st = lock(&self.feed);
        self.issued.store(true, Ordering::Release);
        self.position(st.seq)
    }

    /// Queues the events of one applied command. Never blocks: only short std-mutex critical sections
    /// (no I/O, no await); change bodies are built before the feed lock is taken.
    pub fn publish(&self, _shard: ShardId, events: Vec<Event>) {
        if self.closed.load(Ordering::Acquire) || events.is_empty() {
            return;
        }
        let now = crate::model::now_ms();
        let mut feed = Vec::with_capacity(events.len());
        for e in events {
            match e {
                Event::DesiredPatch { id, patch, desired_version } => self.push_desired(&id, &patch, desired_version),
                other => feed.push(other),
            }
        }
        if feed.is_empty() || self.unobserved(feed.len()) {
            return;
        }
        // By value: a change event takes the model event's body (a whole twin for lifecycle events)
        // instead of a deep copy of it.
        let changes: Vec<_> =
            feed.into_iter().filter_map(|e| event::change_of(e, &self.config.hub_name, now)).collect();
        if !changes.is_empty() {
            self.publish_changes(changes);
        }
    }

    /// Whether `n` changes about to be published can never be read (see the hub's `issued`); if
    /// so they take their sequence numbers now and are dropped.
    fn unobserved(&self, n: usize) -> bool {
        let mut st = lock(&self.feed);
        if !self.issued.load(Ordering::Acquire) && !Self::anyone_listening(&st) {
            st.seq += n as u64;
            metrics::counter!("twinhub_notify_feed_events_total").increment(n as u64);
            return true;
        }
        self.issued.store(true, Ordering::Release);
        false
    }

    fn anyone_listening(st: &FeedState) -> bool {
        st.consumers.values().any(|c| c.listening.as_ref().is_none_or(|l| l()))
    }

    /// Whether anything published now could reach anyone: a feed position is out or a consumer
    /// listens, or a device connection waits for desired pushes. If not, the shards may apply without
    /// building events at all.
    pub fn observed(&self) -> bool {
        if self.issued.load(Ordering::Acquire) || self.closed.load(Ordering::Acquire) {
            // A closed hub drops everything anyway; answering "observed" keeps shutdown on the
            // well-trodden path.
            return true;
        }
        if !lock(&self.pushes).regs.is_empty() {
            return true;
        }
        Self::anyone_listening(&lock(&self.feed))
    }

    fn push_desired(&self, id: &TwinId, patch: &JsonText, version: i64) {
        // The patch comes as text; most desired writes reach a twin no device listens to, and only
        // for one that has is it read into the tree the queues merge.
        if !lock(&self.pushes).by_twin.contains_key(id) {
            return;
        }
        let patch = &patch.to_value();
        let mut st = lock(&self.pushes);
        let Some(regs) = st.by_twin.get(id).cloned() else { return };
        for r in regs {
            let Some(reg) = st.regs.get_mut(&r) else { continue };
            let outcome = reg.queue.offer(patch, version);
            match outcome {
                Offered::Appended => {}
                Offered::Merged => metrics::counter!("twinhub_notify_pushes_merged_total").increment(1),
                Offered::Stale | Offered::Superseded(_) => {
                    metrics::counter!("twinhub_notify_pushes_stale_total").increment(1)
                }
                Offered::Overflow => {
                    metrics::counter!("twinhub_notify_push_overflows_total").increment(1);
                    tracing::info!(twin = %id, "desired push queue overflowed; closing the device connection");
                }
            }
            if matches!(outcome, Offered::Appended | Offered::Merged | Offered::Overflow) {
                reg.notify.notify_one();
            }
        }
    }

    fn publish_changes(&self, changes: Vec<event::Unplaced>) {
        let mut st = lock(&self.feed);
        let mut published = 0u64;
        let (mut merged, mut superseded, mut overflows) = (0u64, 0u64, 0u64);
        // Changes that leave the ring are freed after the lock is released: the last reference to a
        // twin's change body is often the ring's, and freeing it is not work for the critical section.
        let mut evicted = Vec::new();
        // Asked once per batch: a reader that starts listening during it sees the next one.
        let deaf: Vec<u64> = st
            .consumers
            .iter()
            .filter(|(_, c)| c.listening.as_ref().is_some_and(|l| !l()))
            .map(|(id, _)| *id)
            .collect();
        for u in changes {
            st.seq += 1;
            let seq = st.seq;
            let change = Arc::new(u.place(seq, self.position(seq)));
            if self.config.retained > 0 {
                st.ring_bytes += change.size;
                st.ring.push_back(change.clone());
                while st.ring.len() > self.config.retained || st.ring_bytes > self.config.retained_bytes {
                    let Some(old) = st.ring.pop_front() else { break };
                    st.ring_bytes = st.ring_bytes.saturating_sub(old.size);
                    evicted.push(old);
                }
            }
            published += 1;
            for (id, c) in st.consumers.iter_mut() {
                if !matches!(c.mode, Mode::Live) || !c.filter.matches(&change.twin) || deaf.contains(id) {
                    continue;
                }
                match c.queue.offer(change.clone()) {
                    Offered::Appended => {}
                    Offered::Merged => merged += 1,
                    Offered::Superseded(n) => superseded += u64::from(n),
                    Offered::Stale => continue,
                    Offered::Overflow => {
                        overflows += 1;
                        c.resync = Some((
                            change.event.position.clone(),
                            format!("consumer fell more than {} events behind", self.config.feed_queue),
                        ));
                    }
                }
                c.notify.notify_one();
            }
        }
        drop(st);
        drop(evicted);
        metrics::counter!("twinhub_notify_feed_events_total").increment(published);
        metrics::counter!("twinhub_notify_feed_merged_total").increment(merged);
        metrics::counter!("twinhub_notify_feed_superseded_total").increment(superseded);
        if overflows > 0 {
            metrics::counter!("twinhub_notify_feed_resyncs_total", "reason" => "overflow").increment(overflows);
        }
    }

    /// Registers a device connection of identity `id` for desired pushes.
    pub fn desired_pushes(self: &Arc<Self>, id: &TwinId) -> DesiredPushes {
        let notify = Arc::new(Notify::new());
        let mut st = lock(&self.pushes);
        st.next_id += 1;
        let reg = st.next_id;
        st.regs.insert(reg, Registration { queue: PushQueue::new(self.config.device_queue), notify: notify.clone() });
        st.by_twin.entry(id.clone()).or_default().push(reg);
        let regs = st.regs.len();
        drop(st);
        metrics::gauge!("twinhub_notify_device_registrations").set(regs as f64);
        DesiredPushes { hub: self.clone(), id: id.clone(), reg, notify }
    }

    fn unregister_pushes(&self, id: &TwinId, reg: u64) {
        let mut st = lock(&self.pushes);
        st.regs.remove(&reg);
        if let Some(v) = st.by_twin.get_mut(id) {
            v.retain(|r| *r != reg);
            if v.is_empty() {
                st.by_twin.remove(id);
            }
        }
        let regs = st.regs.len();
        drop(st);
        metrics::gauge!("twinhub_notify_device_registrations").set(regs as f64);
    }

    fn take_push(&self, reg: u64) -> Step<DesiredPush> {
        if self.closed.load(Ordering::Acquire) {
            return Step::End;
        }
        let mut st = lock(&self.pushes);
        let Some(r) = st.regs.get_mut(&reg) else { return Step::End };
        if r.queue.overflowed() {
            return Step::End;
        }
        match r.queue.take() {
            Some(p) => {
                drop(st);
                metrics::counter!("twinhub_notify_pushes_delivered_total").increment(1);
                Step::Item(p)
            }
            None => Step::Wait,
        }
    }

    /// A consumer of the change feed, starting after `last_event_id` (live from now if `None`).
    pub fn changes(self: &Arc<Self>, last_event_id: Option<&str>) -> ChangeFeed {
        self.changes_filtered(last_event_id, FeedFilter::default())
    }

    /// A live consumer of every change that skips the changes published while `listening` says no
    /// one downstream can see them: the event broker forwards changes to MQTT subscribers, who only
    /// ever receive what is published after they subscribe, so while no client is connected to it
    /// there is nothing to copy, queue or serialize.
    pub fn changes_while(self: &Arc<Self>, listening: Listening) -> ChangeFeed {
        let feed = self.changes(None);
        if let Some(c) = lock(&self.feed).consumers.get_mut(&feed.id) {
            c.listening = Some(listening);
        }
        feed
    }

    /// A place for one more feed a client asked for, or `None` if clients hold as many as they may.
    /// The node's own consumers (the event broker's relay) take none.
    pub fn admit_client_feed(self: &Arc<Self>) -> Option<FeedPermit> {
        let max = self.config.max_client_feeds;
        self.client_feeds.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).ok()?;
        Some(FeedPermit(self.clone()))
    }

    /// Like [`Hub::changes`], only for the twins `filter` selects (resuming skips the others too).
    pub fn changes_filtered(self: &Arc<Self>, last_event_id: Option<&str>, filter: FeedFilter) -> ChangeFeed {
        let notify = Arc::new(Notify::new());
        let mut st = lock(&self.feed);
        let (mode, resync) = match last_event_id.map(|p| self.resume_point(&st, p)) {
            None => (Mode::Live, None),
            Some(Ok(after)) if after >= st.seq => (Mode::Live, None),
            Some(Ok(after)) => (Mode::Replay { after }, None),
            Some(Err(reason)) => (Mode::Live, Some((self.position(st.seq), reason))),
        };
        if let Some((_, reason)) = &resync {
            self.issued.store(true, Ordering::Release);
            tracing::debug!(last_event_id, %reason, "change feed consumer must resync");
            metrics::counter!("twinhub_notify_feed_resyncs_total", "reason" => "resume").increment(1);
        }
        st.next_id += 1;
        let id = st.next_id;
        st.consumers.insert(
            id,
            Consumer {
                filter,
                listening: None,
                mode,
                queue: FeedQueue::new(self.config.feed_queue),
                resync,
                notify: notify.clone(),
            },
        );
        let n = st.consumers.len();
        drop(st);
        metrics::gauge!("twinhub_notify_feed_consumers").set(n as f64);
        ChangeFeed { hub: self.clone(), id, notify }
    }

    /// The sequence to resume after, or why that is impossible.
    fn resume_point(&self, st: &FeedState, last_event_id: &str) -> Result<u64, String> {
        let (epoch, seq) = last_event_id
            .trim()
            .rsplit_once('-')
            .ok_or_else(|| format!("'{last_event_id}' is not a position of this feed"))?;
        let seq: u64 = seq.parse().map_err(|_| format!("'{last_event_id}' is not a position of this feed"))?;
        if epoch != self.epoch {
            return Err(format!("position {last_event_id} is from another node or an earlier run of this one"));
        }
        if seq > st.seq {
            return Err(format!("position {last_event_id} is ahead of this feed"));
        }
        if seq + 1 < st.ring_first() {
            return Err(format!("position {last_event_id} is no longer retained"));
        }
        Ok(seq)
    }

    fn unregister_feed(&self, id: u64) {
        let mut st = lock(&self.feed);
        st.consumers.remove(&id);
        let n = st.consumers.len();
        drop(st);
        metrics::gauge!("twinhub_notify_feed_consumers").set(n as f64);
    }

    /// Moves up to `max` items for consumer `id` into `out` (`Item` once at least one is there).
    fn take_feed(&self, id: u64, out: &mut Vec<FeedItem>, max: usize) -> Step<()> {
        if self.closed.load(Ordering::Acquire) {
            return Step::End;
        }
        let mut guard = lock(&self.feed);
        let (mut items, mut events) = (0, 0);
        let step = loop {
            match self.take_one(&mut guard, id) {
                Step::Item(item) => {
                    events += u64::from(matches!(item, FeedItem::Event(_)));
                    out.push(item);
                    items += 1;
                    if items >= max {
                        break Step::Item(());
                    }
                }
                // What was taken so far is the answer; the next call waits or goes on.
                _ if items > 0 => break Step::Item(()),
                Step::Wait => break Step::Wait,
                Step::Again => break Step::Again,
                Step::End => break Step::End,
            }
        };
        drop(guard);
        if events > 0 {
            metrics::counter!("twinhub_notify_feed_delivered_total").increment(events);
        }
        step
    }

    /// The next item for consumer `id`, under the feed lock.
    fn take_one(&self, st: &mut FeedState, id: u64) -> Step<FeedItem> {
        let (seq, ring_first) = (st.seq, st.ring_first());
        let Some(c) = st.consumers.get_mut(&id) else { return Step::End };
        if let Some((position, reason)) = c.resync.take() {
            return Step::Item(FeedItem::Resync { position, reason });
        }
        if let Mode::Replay { after } = c.mode {
            if after + 1 < ring_first {
                // The ring moved on while this consumer was still replaying it.
                c.mode = Mode::Live;
                metrics::counter!("twinhub_notify_feed_resyncs_total", "reason" => "replay").increment(1);
                return Step::Item(FeedItem::Resync {
                    position: self.position(seq),
                    reason: "fell behind the retained events while catching up".into(),
                });
            }
            let start = (after + 1 - ring_first) as usize;
            let mut last = after;
            for change in st.ring.iter().skip(start).take(REPLAY_SCAN) {
                last = change.seq;
                if c.filter.matches(&change.twin) {
                    c.mode = Mode::Replay { after: change.seq };
                    return Step::Item(FeedItem::Event(change.event.clone()));
                }
            }
            if last < seq {
                // Scanned a batch without a match; let others have the lock, then carry on.
                c.mode = Mode::Replay { after: last };
                return Step::Again;
            }
            // Caught up: from now on publishing queues for this consumer (same lock, nothing missed).
            c.mode = Mode::Live;
        }
        match c.queue.take() {
            Some(change) => Step::Item(FeedItem::Event(change.event.clone())),
            None => Step::Wait,
        }
    }

    /// Devices with at least one open connection on this node (`/statistics/service`): distinct
    /// identities (device or module) with a desired-push registration.
    /// Sets the queue-depth gauges: pushes waiting for device connections and events waiting for
    /// feed consumers, summed over all of them (one pass under each lock; called once a second).
    pub fn record_queue_depths(&self) {
        let pushes: usize = lock(&self.pushes).regs.values().map(|r| r.queue.len()).sum();
        let events: usize = lock(&self.feed).consumers.values().map(|c| c.queue.len()).sum();
        metrics::gauge!("twinhub_notify_pushes_pending").set(pushes as f64);
        metrics::gauge!("twinhub_notify_feed_pending").set(events as f64);
    }

    pub fn connected_devices(&self) -> u64 {
        lock(&self.pushes).by_twin.len() as u64
    }

    /// Wakes every subscriber with `None` (node shutdown). Later events are ignored.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for r in lock(&self.pushes).regs.values() {
            r.notify.notify_one();
        }
        for c in lock(&self.feed).consumers.values() {
            c.notify.notify_one();
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}
