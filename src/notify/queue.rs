//! The per-subscriber queues, without any synchronisation: a device connection's pending desired
//! pushes and a feed consumer's pending change events. Both are bounded, both coalesce what is
//! pending (never what was already taken), and both only ever hand out versions that move forward.
//! The hub wraps them in its locks; tests drive them directly.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Map, Value};

use super::coalesce::{check_patch, merge_change_body, merge_patch};
use super::event::Kind;
use super::{ChangeEvent, DesiredPush};
use crate::ids::TwinId;
use crate::model::JsonText;

/// What happened to an offered item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offered {
    /// Queued as a new pending item.
    Appended,
    /// Merged into a pending item (which now carries the newer version).
    Merged,
    /// Replaced this many pending items (a `replaceTwin` supersedes pending changes of its twin).
    Superseded(u32),
    /// Not newer than what this subscriber already has or had: dropped.
    Stale,
    /// The queue was full: the caller must tell the subscriber to start over.
    Overflow,
}

/// A pending desired push: the patch without `$version`, kept as JSON so later patches can merge.
#[derive(Clone, Debug, PartialEq)]
struct PendingPush {
    version: i64,
    patch: Map<String, Value>,
    merged: u32,
}

/// A device connection's pending desired pushes.
#[derive(Debug)]
pub struct PushQueue {
    pending: VecDeque<PendingPush>,
    capacity: usize,
    /// Highest desired version accepted (pending or taken); anything not above it is stale.
    last_accepted: i64,
    /// Version of the last push handed out by [`PushQueue::take`].
    last_taken: i64,
    overflowed: bool,
}

impl PushQueue {
    pub fn new(capacity: usize) -> PushQueue {
        PushQueue {
            pending: VecDeque::new(),
            capacity: capacity.max(1),
            last_accepted: i64::MIN,
            last_taken: i64::MIN,
            overflowed: false,
        }
    }

    /// Once overflowed the connection must close (the device re-reads its twin on reconnect), so
    /// nothing more is queued.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Pushes waiting for the device connection to take them.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Offers a committed desired patch (`patch` may include `"$version"`, which is ignored in favour
    /// of `version`). Merges into the last pending push when the merge is exact.
    pub fn offer(&mut self, patch: &Value, version: i64) -> Offered {
        if self.overflowed || version <= self.last_accepted {
            return Offered::Stale;
        }
        let Some(p) = patch.as_object() else { return Offered::Stale };
        let patch: Map<String, Value> =
            p.iter().filter(|(k, _)| *k != "$version").map(|(k, v)| (k.clone(), v.clone())).collect();
        self.last_accepted = version;
        if let Some(last) = self.pending.back_mut() {
            if check_patch(&last.patch, &patch, "").is_ok() {
                merge_patch(&mut last.patch, &patch);
                last.version = version;
                last.merged += 1;
                return Offered::Merged;
            }
        }
        if self.pending.len() >= self.capacity {
            self.pending.clear();
            self.overflowed = true;
            return Offered::Overflow;
        }
        self.pending.push_back(PendingPush { version, patch, merged: 1 });
        Offered::Appended
    }

    /// The oldest pending push, rendered (`$version` last, as IoT Hub sends it).
    pub fn take(&mut self) -> Option<DesiredPush> {
        while let Some(p) = self.pending.pop_front() {
            if p.version <= self.last_taken {
                continue;
            }
            self.last_taken = p.version;
            let mut body = p.patch;
            body.insert("$version".into(), Value::from(p.version));
            let body = serde_json::to_vec(&Value::Object(body)).unwrap_or_else(|_| b"{}".to_vec());
            return Some(DesiredPush { version: p.version, body, merged: p.merged });
        }
        None
    }
}

/// One change in the feed: the event and what coalescing needs to know about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    /// Position in the node's feed (the numeric part of `event.position`).
    pub seq: u64,
    pub twin: TwinId,
    pub kind: Kind,
    /// Approximate bytes this change holds (its body's JSON size), for the retained ring's bound.
    pub size: usize,
    /// Shared with the consumers it is handed to.
    pub event: Arc<ChangeEvent>,
}

/// A feed consumer's pending changes, in position order. A merged change moves to the position of its
/// newest part, so positions handed out strictly increase and a consumer that resumes from the last
/// position it saw never gets an older version of a twin again.
#[derive(Debug)]
pub struct FeedQueue {
    pending: BTreeMap<u64, Arc<Change>>,
    /// For each twin, the positions of its pending twin changes since its last pending lifecycle event
    /// (ascending): the last one is where a new patch may merge; a replace drops them all.
    changes: HashMap<TwinId, Vec<u64>>,
    capacity: usize,
}

impl FeedQueue {
    pub fn new(capacity: usize) -> FeedQueue {
        FeedQueue { pending: BTreeMap::new(), changes: HashMap::new(), capacity: capacity.max(1) }
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Events waiting for the consumer to take them.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Drops everything pending (the consumer is told to resync).
    pub fn clear(&mut self) {
        self.pending.clear();
        self.changes.clear();
    }

    /// Offers the next change of the feed (positions must increase from call to call).
    pub fn offer(&mut self, change: Arc<Change>) -> Offered {
        match change.kind {
            Kind::Update => {
                if let Some(merged) = self.try_merge(&change) {
                    return merged;
                }
                self.append(change)
            }
            Kind::Replace => {
                let dropped = self.changes.remove(&change.twin).unwrap_or_default();
                if dropped.is_empty() {
                    return self.append(change);
                }
                let mut carried = 0u32;
                for seq in &dropped {
                    if let Some(c) = self.pending.remove(seq) {
                        carried = carried.saturating_add(c.event.merged);
                    }
                }
                let mut replace = (*change).clone();
                Arc::make_mut(&mut replace.event).merged = change.event.merged.saturating_add(carried);
                self.changes.insert(replace.twin.clone(), vec![replace.seq]);
                self.pending.insert(replace.seq, Arc::new(replace));
                Offered::Superseded(dropped.len() as u32)
            }
            Kind::Lifecycle => {
                // Nothing after this may merge into changes before it.
                self.changes.remove(&change.twin);
                self.append(change)
            }
            Kind::Connection => self.append(change),
        }
    }

    /// Merges an `updateTwin` into the twin's last pending change if that is an `updateTwin` and the
    /// merge is exact; the result takes the new change's position.
    fn try_merge(&mut self, change: &Arc<Change>) -> Option<Offered> {
        let last_seq = *self.changes.get(&change.twin)?.last()?;
        let last = self.pending.get(&last_seq)?;
        if last.kind != Kind::Update {
            return None;
        }
        // The only place a change body is looked inside: both are parsed, merged and written again.
        let body = merge_change_body(&last.event.body.to_value(), &change.event.body.to_value()).ok()?;
        let carried = last.event.merged;
        self.pending.remove(&last_seq);
        let mut merged = (**change).clone();
        let event = Arc::make_mut(&mut merged.event);
        event.body = JsonText::render(&body);
        event.merged = event.merged.saturating_add(carried);
        if let Some(seqs) = self.changes.get_mut(&change.twin) {
            if let Some(l) = seqs.last_mut() {
                *l = merged.seq;
            }
        }
        self.pending.insert(merged.seq, Arc::new(merged));
        Some(Offered::Merged)
    }

    fn append(&mut self, change: Arc<Change>) -> Offered {
        if self.pending.len() >= self.capacity {
            self.clear();
            return Offered::Overflow;
        }
        if matches!(change.kind, Kind::Update | Kind::Replace) {
            self.changes.entry(change.twin.clone()).or_default().push(change.seq);
        }
        self.pending.insert(change.seq, change);
        Offered::Appended
    }

    /// The pending change with the lowest position.
    pub fn take(&mut self) -> Option<Arc<Change>> {
        let (seq, change) = self.pending.pop_first()?;
        if let Some(seqs) = self.changes.get_mut(&change.twin) {
            if seqs.first() == Some(&seq) {
                seqs.remove(0);
            }
            if seqs.is_empty() {
                self.changes.remove(&change.twin);
            }
        }
        Some(change)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::Source;
    use serde_json::json;

    fn push_body(p: &DesiredPush) -> Value {
        serde_json::from_slice(&p.body).unwrap()
    }

    #[test]
    fn pushes_merge_into_the_last_pending_and_carry_the_latest_version() {
        let mut q = PushQueue::new(4);
        assert_eq!(q.offer(&json!({"a": 1, "$version": 2}), 2), Offered::Appended);
        assert_eq!(q.offer(&json!({"b": {"c": 1}, "$version": 3}), 3), Offered::Merged);
        assert_eq!(q.offer(&json!({"a": null, "$version": 4}), 4), Offered::Merged);
        let p = q.take().unwrap();
        assert_eq!((p.version, p.merged), (4, 3));
        assert_eq!(push_body(&p), json!({"a": null, "b": {"c": 1}, "$version": 4}));
        // `$version` is the last member, as IoT Hub renders it.
        assert!(String::from_utf8(p.body).unwrap().ends_with("\"$version\":4}"));
        assert!(q.take().is_none());
        // Taken pushes are never merged into.
        assert_eq!(q.offer(&json!({"d": 1}), 5), Offered::Appended);
        assert_eq!(q.take().unwrap().merged, 1);
    }

    #[test]
    fn push_conflict_appends_and_stale_versions_are_dropped() {
        let mut q = PushQueue::new(4);
        q.offer(&json!({"o": null}), 2);
        assert_eq!(q.offer(&json!({"o": {"x": 1}}), 3), Offered::Appended);
        assert_eq!(q.len(), 2);
        assert_eq!(q.offer(&json!({"z": 1}), 3), Offered::Stale);
        assert_eq!(q.offer(&json!({"z": 1}), 1), Offered::Stale);
        assert_eq!(push_body(&q.take().unwrap()), json!({"o": null, "$version": 2}));
        assert_eq!(push_body(&q.take().unwrap()), json!({"o": {"x": 1}, "$version": 3}));
    }

    #[test]
    fn push_overflow_is_final() {
        let mut q = PushQueue::new(2);
        // Each conflicts with the previous one, so nothing merges.
        q.offer(&json!({"o": 1}), 1);
        q.offer(&json!({"o": {"x": 1}}), 2);
        assert_eq!(q.offer(&json!({"o": null}), 3), Offered::Merged);
        assert_eq!(q.offer(&json!({"o": {"y": 1}}), 4), Offered::Overflow);
        assert!(q.overflowed());
        assert!(q.take().is_none());
        assert_eq!(q.offer(&json!({"p": 1}), 5), Offered::Stale);
        assert!(q.take().is_none());
    }

    fn change(seq: u64, twin: &str, kind: Kind, body: Value) -> Arc<Change> {
        let source = match kind {
            Kind::Update | Kind::Replace => Source::TwinChangeEvents,
            Kind::Lifecycle => Source::DeviceLifecycleEvents,
            Kind::Connection => Source::DeviceConnectionStateEvents,
        };
        Arc::new(Change {
            seq,
            twin: TwinId::device(twin),
            kind,
            size: 0,
            event: Arc::new(ChangeEvent {
                position: format!("e-{seq}"),
                source,
                device_id: twin.into(),
                module_id: None,
                properties: vec![],
                body: JsonText::render(&body),
                merged: 1,
            }),
        })
    }

    fn upd(seq: u64, twin: &str, v: i64, tags: Value) -> Arc<Change> {
        change(seq, twin, Kind::Update, json!({"version": v, "tags": tags}))
    }

    fn drain(q: &mut FeedQueue) -> Vec<(u64, String, Value, u32)> {
        std::iter::from_fn(|| q.take())
            .map(|c| (c.seq, c.twin.device_id.clone(), c.event.body.to_value(), c.event.merged))
            .collect()
    }

    #[test]
    fn feed_merge_moves_to_the_newer_position() {
        let mut q = FeedQueue::new(10);
        q.offer(upd(1, "t", 2, json!({"a": 1})));
        q.offer(upd(2, "u", 5, json!({"x": 1})));
        assert_eq!(q.offer(upd(3, "t", 3, json!({"b": 1}))), Offered::Merged);
        assert_eq!(
            drain(&mut q),
            vec![
                (2, "u".into(), json!({"version": 5, "tags": {"x": 1}}), 1),
                (3, "t".into(), json!({"version": 3, "tags": {"a": 1, "b": 1}}), 2),
            ]
        );
    }

    #[test]
    fn feed_conflict_appends_and_later_patches_merge_into_the_last() {
        let mut q = FeedQueue::new(10);
        q.offer(upd(1, "t", 2, json!({"a": null})));
        assert_eq!(q.offer(upd(2, "t", 3, json!({"a": {"x": 1}}))), Offered::Appended);
        assert_eq!(q.offer(upd(3, "t", 4, json!({"b": 1}))), Offered::Merged);
        let got = drain(&mut q);
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(got[1].2, json!({"version": 4, "tags": {"a": {"x": 1}, "b": 1}}));
    }

    #[test]
    fn replace_supersedes_pending_changes_and_update_after_replace_appends() {
        let mut q = FeedQueue::new(10);
        q.offer(upd(1, "t", 2, json!({"a": null})));
        q.offer(upd(2, "t", 3, json!({"a": {"x": 1}})));
        q.offer(upd(3, "u", 9, json!({"k": 1})));
        assert_eq!(
            q.offer(change(4, "t", Kind::Replace, json!({"deviceId": "t", "version": 4}))),
            Offered::Superseded(2)
        );
        assert_eq!(q.offer(upd(5, "t", 5, json!({"c": 1}))), Offered::Appended);
        let got = drain(&mut q);
        assert_eq!(got.iter().map(|g| (g.0, g.3)).collect::<Vec<_>>(), vec![(3, 1), (4, 3), (5, 1)]);
    }

    #[test]
    fn nothing_merges_across_a_lifecycle_event_and_events_of_other_kinds_never_merge() {
        let mut q = FeedQueue::new(10);
        q.offer(upd(1, "t", 2, json!({"a": 1})));
        q.offer(change(2, "t", Kind::Lifecycle, json!({})));
        assert_eq!(q.offer(upd(3, "t", 1, json!({"b": 1}))), Offered::Appended);
        assert_eq!(q.offer(change(4, "t", Kind::Connection, json!({}))), Offered::Appended);
        assert_eq!(q.offer(change(5, "t", Kind::Connection, json!({}))), Offered::Appended);
        // A connection event in between does not stop a patch from merging.
        assert_eq!(q.offer(upd(6, "t", 2, json!({"c": 1}))), Offered::Merged);
        // A replace after a lifecycle event drops only the changes after it.
        q.offer(change(7, "t", Kind::Lifecycle, json!({})));
        q.offer(upd(8, "t", 2, json!({"d": 1})));
        assert_eq!(q.offer(change(9, "t", Kind::Replace, json!({"version": 3}))), Offered::Superseded(1));
        let got = drain(&mut q);
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![1, 2, 4, 5, 6, 7, 9]);
        assert_eq!(got[4].2, json!({"version": 2, "tags": {"b": 1, "c": 1}}));
    }

    #[test]
    fn taken_changes_are_not_merged_into() {
        let mut q = FeedQueue::new(10);
        q.offer(upd(1, "t", 2, json!({"a": 1})));
        assert_eq!(q.take().unwrap().seq, 1);
        assert_eq!(q.offer(upd(2, "t", 3, json!({"b": 1}))), Offered::Appended);
        assert_eq!(q.take().unwrap().event.body.to_value(), json!({"version": 3, "tags": {"b": 1}}));
    }

    #[test]
    fn full_feed_queue_overflows_and_starts_over() {
        let mut q = FeedQueue::new(2);
        q.offer(upd(1, "a", 2, json!({})));
        q.offer(upd(2, "b", 2, json!({})));
        // Merging needs no room.
        assert_eq!(q.offer(upd(3, "a", 3, json!({"x": 1}))), Offered::Merged);
        assert_eq!(q.offer(upd(4, "c", 2, json!({}))), Offered::Overflow);
        assert!(q.is_empty());
        assert_eq!(q.offer(upd(5, "a", 4, json!({}))), Offered::Appended);
        assert_eq!(drain(&mut q).len(), 1);
    }
}
