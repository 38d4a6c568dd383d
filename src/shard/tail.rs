//! Change events of shards this node does not replicate.
//!
//! With three replicas per shard on a larger cluster, a node serves devices and feed consumers whose
//! twins live in shards it does not host. Every replica keeps the events of its recently applied
//! entries in a ring keyed by log index (the same index on every replica, so a follower of the stream
//! can switch replicas without losing its place); a node tails each shard it does not host from one of
//! its replicas with a long poll and hands the events to its notification hub, in log order.
//!
//! If a tailing node falls behind the ring (or its replica restarted and lost the ring), the page says
//! so (`gap`): the events in between are not replayed. Devices re-read their twin on reconnect and
//! feed consumers resync, as after any queue overflow; the gap is logged and counted.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::ShardId;
use crate::model::Event;

/// Transport call: `postcard((ShardId, Option<u64>))` in (the last index the caller has), JSON
/// `Result<EventPage, ShardError>` out (events hold JSON values).
pub const EVENTS_CALL: &str = "shard.events";

/// Entries (with events) each replica keeps per shard for tailing peers.
const RING_ENTRIES: usize = 8192;

/// How long a tail request waits for new events before answering an empty page.
pub const LONG_POLL: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EventPage {
    /// `(log index, events)` after the caller's cursor, in log order.
    pub entries: Vec<(u64, Vec<Event>)>,
    /// The newest index this replica recorded (the cursor to use when `entries` is empty).
    pub head: u64,
    /// Entries after the caller's cursor were dropped from the ring before it asked.
    pub gap: bool,
}

#[derive(Default)]
struct Ring {
    entries: VecDeque<(u64, Vec<Event>)>,
    /// Highest index dropped from the ring (a cursor below it has missed events).
    evicted_upto: u64,
    head: u64,
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
            ring.entries.push_back((index, events.to_vec()));
            while ring.entries.len() > RING_ENTRIES {
                if let Some((i, _)) = ring.entries.pop_front() {
                    ring.evicted_upto = i;
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// Forgets a shard this node no longer hosts.
    pub fn drop_shard(&self, shard: ShardId) {
        self.rings.lock().unwrap_or_else(|e| e.into_inner()).remove(&shard);
    }

    fn page(&self, shard: ShardId, after: Option<u64>) -> EventPage {
        let rings = self.rings.lock().unwrap_or_else(|e| e.into_inner());
        let Some(ring) = rings.get(&shard) else { return EventPage::default() };
        let Some(after) = after else { return EventPage { entries: Vec::new(), head: ring.head, gap: false } };
        let entries: Vec<_> = ring.entries.iter().filter(|(i, _)| *i > after).take(256).cloned().collect();
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
    async fn pages_follow_the_cursor_and_report_gaps() {
        let rings = EventRings::default();
        assert_eq!(rings.wait_page(1, None, Duration::ZERO).await.head, 0);
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
    async fn a_waiting_tail_wakes_on_new_events() {
        let rings = Arc::new(EventRings::default());
        rings.record(2, 1, &ev(1));
        let r = rings.clone();
        let waiter = tokio::spawn(async move { r.wait_page(2, Some(1), Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        rings.record(2, 2, &ev(2));
        let p = waiter.await.unwrap();
        assert_eq!(p.entries.len(), 1);
    }
}
