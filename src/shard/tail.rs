//! Change events of shards this node does not replicate.
//!
//! With three replicas per shard on a larger cluster, a node serves devices and feed consumers whose
//! twins live in shards it does not host. Every replica keeps the events of its recently applied
//! entries in a ring keyed by log index (the same index on every replica, so a follower of the stream
//! can switch replicas without losing its place); a node tails each shard it does not host from one of
//! its replicas with a long poll and hands the events to its notification hub, in log order.
//!
//! A tailing node reads from one replica and touches the others every [`TOUCH_EVERY`], so all of them
//! keep recording and a switch to another replica (its source died) continues at the same index.
//! If a tailing node falls behind the ring (or its replica restarted and lost the ring), the page says
//! so (`gap`): the events in between are not replayed. The node's change-feed consumers are then told
//! to resync (never a silent gap); devices re-read their twin on reconnect. The gap is logged and
//! counted.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::ids::ShardId;
use crate::model::Event;

/// Entries (with events) each replica keeps per shard for tailing peers ...
const RING_ENTRIES: usize = 8192;
/// ... and at most this many bytes of their JSON.
const RING_BYTES: usize = 8 << 20;
/// A ring nobody has read for this long stops recording and is emptied: on a cluster where every
/// node hosts every shard nobody tails, and the ring would only cost memory.
const IDLE_AFTER: Duration = Duration::from_secs(60);

/// How often a tailing node touches the replicas it does not read from, keeping their rings recording.
pub const TOUCH_EVERY: Duration = Duration::from_secs(20);

/// How long a tail request waits for new events before answering an empty page.
pub const LONG_POLL: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EventPage {
    /// `(log index, JSON of the entry's events)` after the caller's cursor, in log order.
    pub entries: Vec<(u64, String)>,
    /// The newest index this replica recorded (the cursor to use when `entries` is empty).
    pub head: u64,
    /// Entries after the caller's cursor were dropped from the ring before it asked.
    pub gap: bool,
}

impl EventPage {
    /// The events of each entry, in order (an entry that does not parse is skipped and counted).
    pub fn events(&self) -> impl Iterator<Item = (u64, Vec<Event>)> + '_ {
        self.entries.iter().filter_map(|(i, json)| match serde_json::from_str(json) {
            Ok(events) => Some((*i, events)),
            Err(e) => {
                tracing::warn!(index = i, "an event tail entry does not parse: {e}");
                None
            }
        })
    }
}

#[derive(Default)]
struct Ring {
    /// Events as JSON text: several times smaller than parsed, and ready to send.
    entries: VecDeque<(u64, Arc<str>)>,
    bytes: usize,
    /// Highest index dropped from the ring (a cursor below it has missed events).
    evicted_upto: u64,
    head: u64,
    last_read: Option<Instant>,
}

impl Ring {
    fn clear(&mut self) {
        if let Some((last, _)) = self.entries.back() {
            self.evicted_upto = self.evicted_upto.max(*last);
        }
        self.entries.clear();
        self.bytes = 0;
    }
}

/// The per-shard rings of one node, written by its state machines.
#[derive(Default)]
pub struct EventRings {
    rings: Mutex<HashMap<ShardId, Ring>>,
    changed: tokio::sync::Notify,
}

impl EventRings {
    pub fn record(&self, shard: ShardId, index: u64, events: &[Event]) {
        {
            let mut rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
            let ring = rings.entry(shard).or_default();
            if index <= ring.head {
                // Re-applied after a restart or a snapshot: the ring already moved past it.
                return;
            }
            ring.head = index;
            if ring.last_read.is_none_or(|t| t.elapsed() >= IDLE_AFTER) {
                ring.clear();
                ring.evicted_upto = index;
                return;
            }
            let json: Arc<str> = serde_json::to_string(events).unwrap_or_default().into();
            ring.bytes += json.len();
            ring.entries.push_back((index, json));
            while ring.entries.len() > RING_ENTRIES || ring.bytes > RING_BYTES {
                if let Some((i, old)) = ring.entries.pop_front() {
                    ring.evicted_upto = i;
                    ring.bytes = ring.bytes.saturating_sub(old.len());
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// Whether a peer has read the shard's ring recently (it records only then).
    pub fn active(&self, shard: ShardId) -> bool {
        let rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        rings.get(&shard).and_then(|r| r.last_read).is_some_and(|t| t.elapsed() < IDLE_AFTER)
    }

    /// Entry `index` was applied without building its events (nobody read the ring): a cursor
    /// before it has missed whatever they were, exactly as if the idle ring had dropped them.
    pub fn skipped(&self, shard: ShardId, index: u64) {
        let mut rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        let ring = rings.entry(shard).or_default();
        if index <= ring.head {
            return;
        }
        ring.head = index;
        ring.clear();
        ring.evicted_upto = index;
    }

    /// Forgets a shard this node no longer hosts.
    pub fn drop_shard(&self, shard: ShardId) {
        self.rings.lock().unwrap_or_else(|e| e.into_inner()).remove(&shard);
    }

    fn page(&self, shard: ShardId, after: Option<u64>) -> EventPage {
        let mut rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        let ring = rings.entry(shard).or_default();
        ring.last_read = Some(Instant::now());
        let Some(after) = after else { return EventPage { entries: Vec::new(), head: ring.head, gap: false } };
        let entries: Vec<_> =
            ring.entries.iter().filter(|(i, _)| *i > after).take(256).map(|(i, j)| (*i, j.to_string())).collect();
        EventPage { entries, head: ring.head, gap: after < ring.evicted_upto }
    }

    /// The events after `after`, waiting up to `wait` for some to arrive.
    pub async fn wait_page(&self, shard: ShardId, after: Option<u64>, wait: Duration) -> EventPage {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.changed.notified();
            let page = self.page(shard, after);
            if !page.entries.is_empty() || page.gap || after.is_none() {
                return page;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return page;
            }
        }
    }
}

/// Shared handle.
pub type Rings = Arc<EventRings>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::TwinId;

    fn ev(v: i64) -> Vec<Event> {
        vec![Event::Connection { id: TwinId::device(format!("d{v}")), connected: true }]
    }

    #[tokio::test]
    async fn entries_applied_without_events_are_a_gap_for_cursors_before_them() {
        let rings = EventRings::default();
        assert!(!rings.active(1), "nobody has read the ring");
        rings.skipped(1, 4);
        let start = rings.wait_page(1, None, Duration::ZERO).await;
        assert_eq!(start.head, 4, "a new reader starts after what was skipped");
        assert!(rings.active(1));
        rings.skipped(1, 6);
        // A reader whose cursor is before a skipped entry is told, never left with a silent hole.
        assert!(rings.wait_page(1, Some(start.head), Duration::ZERO).await.gap);
        rings.record(1, 7, &ev(7));
        let p = rings.wait_page(1, Some(6), Duration::ZERO).await;
        assert_eq!((p.entries.len(), p.gap), (1, false));
    }

    #[tokio::test]
    async fn pages_follow_the_cursor_and_report_gaps() {
        let rings = EventRings::default();
        assert_eq!(rings.wait_page(1, None, Duration::ZERO).await.head, 0, "a first read starts the recording");
        rings.record(1, 5, &ev(5));
        rings.record(1, 7, &ev(7));
        rings.record(1, 7, &ev(8)); // re-applied: ignored
        let p = rings.wait_page(1, Some(5), Duration::ZERO).await;
        assert_eq!(p.entries.iter().map(|e| e.0).collect::<Vec<_>>(), vec![7]);
        assert!(!p.gap);
        for i in 8..(8 + RING_ENTRIES as u64 + 1) {
            rings.record(1, i, &ev(1));
        }
        assert!(rings.wait_page(1, Some(6), Duration::ZERO).await.gap);
    }

    #[tokio::test]
    async fn an_unread_ring_records_nothing() {
        let rings = EventRings::default();
        rings.record(3, 1, &ev(1));
        rings.record(3, 2, &ev(2));
        let p = rings.wait_page(3, None, Duration::ZERO).await;
        assert_eq!(p.head, 2);
        assert!(p.entries.is_empty());
        assert!(rings.wait_page(3, Some(0), Duration::ZERO).await.gap, "what was not recorded is a gap");
        rings.record(3, 3, &ev(3));
        let p = rings.wait_page(3, Some(2), Duration::ZERO).await;
        assert_eq!(p.events().map(|(i, _)| i).collect::<Vec<_>>(), vec![3]);
    }

    #[tokio::test]
    async fn a_waiting_tail_wakes_on_new_events() {
        let rings = Arc::new(EventRings::default());
        rings.wait_page(2, None, Duration::ZERO).await;
        rings.record(2, 1, &ev(1));
        let r = rings.clone();
        let waiter = tokio::spawn(async move { r.wait_page(2, Some(1), Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        rings.record(2, 2, &ev(2));
        let p = waiter.await.unwrap();
        assert_eq!(p.entries.len(), 1);
    }
}
