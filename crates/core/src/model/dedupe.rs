//! At-most-once: the outcomes of the last [`DEDUPE_WINDOW`] commands of a shard, by request id, so a
//! retried command (after a leader change, an MQTT DUP re-send) answers its first outcome instead of
//! applying twice. FIFO by apply order, hence the same on every replica; part of the snapshot.
//!
//! Errors and versions are stored exactly. Ten thousand twin documents per shard would cost far more
//! memory than the twins themselves, so the twin documents that writes answered are kept in a separate
//! window bounded by bytes ([`RecentReplies`]): a retried twin write (a leader change, a forwarding
//! timeout) answers exactly what the first attempt would have, with *its* `version` and `$version`,
//! never a later document that another write produced. Only a retry arriving after that window has
//! moved on gets the entity's current document.

use serde::ser::SerializeSeq;
use serde::{Deserialize, Serialize, Serializer};
use std::sync::Arc;

use super::command::RequestId;
use super::error::TwinError;
use super::json_text::JsonText;
use super::DeviceKey;
use crate::ids::TwinId;

pub const DEDUPE_WINDOW: usize = 10_000;

/// A compact record of an outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Remembered {
    Err(TwinError),
    Done,
    Reported(i64),
    Device(String),
    Module(String, String),
    Twin(WrittenTwin),
    /// A job command: answered with the job as it is now.
    Job(String),
    /// A bulk registry command: each entry's outcome.
    Bulk(Vec<Option<TwinError>>),
    /// A method job's claim of a device: a retried claim must answer `claimed` again, or the device
    /// would never be called.
    Claim {
        claimed: bool,
        running: bool,
    },
    /// A configuration command: answered with the record as it is now.
    Configuration(String),
    /// A `/certificates` command: answered with the record as it is now.
    Certificate(String),
    /// A bulk registry command whose entries all succeeded (how many): what nearly every bulk call of
    /// a fleet load is, remembered in one word instead of an outcome per entry, for each of the
    /// window's thousands of commands on every shard.
    BulkDone(usize),
}

/// The twin a remembered twin write wrote. Written exactly as a [`TwinId`] is, so snapshots read and
/// write it as they always have; held as a [`DeviceKey`] (a short id inline, a longer one as the shard's
/// own shared key), so that copying the window for a snapshot (ten thousand outcomes, nearly all twin
/// writes under a write load) and dropping the copy never allocate or free a string each.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "TwinId")]
pub struct WrittenTwin {
    device_id: DeviceKey,
    module_id: Option<Arc<str>>,
}

impl WrittenTwin {
    pub fn new(device_id: DeviceKey, module_id: Option<&str>) -> WrittenTwin {
        WrittenTwin { device_id, module_id: module_id.map(Arc::from) }
    }

    pub fn to_id(&self) -> TwinId {
        TwinId { device_id: self.device_id.to_string(), module_id: self.module_id.as_deref().map(str::to_string) }
    }
}

/// A window's map by request id: a persistent B-tree (imbl's `OrdMap`, whose nodes are shared by
/// reference count), like the window's order, a persistent vector. A snapshot takes an image of both
/// windows under the state lock that apply waits for: copying `std` hash maps there allocated two
/// tables of most of a MiB and cloned ten thousand entries into them, 1-46 ms on a busy node (fresh
/// huge pages faulted in among it); these copy in O(1), and a write after the image copies only the
/// few nodes on its path. Measured against imbl's hash map (a hash array mapped trie) in the closed
/// write loop, the B-tree cost less CPU per update: its wide nodes keep the 128-bit keys of a lookup
/// in a few contiguous arrays (benches/README.md).
type ById<V> = imbl::OrdMap<RequestId, V>;

/// The order lives in the queue; the map only answers "seen?", once per applied command on every
/// replica. Nothing iterates the maps, so their order cannot make replicas differ.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "Vec<(RequestId, Remembered)>")]
pub struct Dedupe {
    order: imbl::Vector<RequestId>,
    outcomes: ById<Remembered>,
}

impl Dedupe {
    pub fn get(&self, id: &RequestId) -> Option<&Remembered> {
        self.outcomes.get(id)
    }

    pub fn remember(&mut self, id: RequestId, outcome: Remembered) {
        if self.outcomes.insert(id, outcome).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > DEDUPE_WINDOW {
            if let Some(old) = self.order.pop_front() {
                self.outcomes.remove(&old);
            }
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.order.len()
    }
}

/// Bytes of reply documents a shard keeps for retries (4 MiB: thousands of typical twins, seconds of
/// traffic even at the shard's peak rate, which is when leader changes make clients retry).
pub const REPLY_BYTES: usize = 4 << 20;

/// The twin documents the most recent twin writes answered, FIFO by apply order (so the same on every
/// replica), bounded by [`REPLY_BYTES`] and by [`DEDUPE_WINDOW`] entries. Part of the snapshot.
/// Kept as JSON text: a parsed document costs several times its text in memory, and a reply is read
/// back only when a retry arrives.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "Vec<(RequestId, JsonText)>")]
pub struct RecentReplies {
    order: imbl::Vector<(RequestId, usize)>,
    docs: ById<JsonText>,
    bytes: usize,
}

impl RecentReplies {
    /// The window oldest first, as snapshots hold it.
    pub fn in_order(&self) -> impl Iterator<Item = (RequestId, &JsonText)> + Clone {
        self.order.iter().filter_map(|(id, _)| self.docs.get(id).map(|doc| (*id, doc)))
    }

    pub fn get(&self, id: &RequestId) -> Option<JsonText> {
        self.docs.get(id).cloned()
    }

    pub fn remember(&mut self, id: RequestId, text: JsonText) {
        let size = text.as_str().len();
        if size > REPLY_BYTES {
            return;
        }
        if self.docs.insert(id, text).is_none() {
            self.order.push_back((id, size));
            self.bytes += size;
        }
        while self.bytes > REPLY_BYTES || self.order.len() > DEDUPE_WINDOW {
            let Some((old, n)) = self.order.pop_front() else { break };
            self.docs.remove(&old);
            self.bytes = self.bytes.saturating_sub(n);
        }
    }
}

impl From<Vec<(RequestId, JsonText)>> for RecentReplies {
    fn from(v: Vec<(RequestId, JsonText)>) -> RecentReplies {
        let mut r = RecentReplies::default();
        for (id, doc) in v {
            r.remember(id, doc);
        }
        r
    }
}

/// As the list of `(request id, document)` pairs, oldest first, that [`From`] reads back; the
/// documents are embedded as JSON values (the text itself, not re-rendered).
impl Serialize for RecentReplies {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize_in_order(s, self.in_order())
    }
}

impl From<Vec<(RequestId, Remembered)>> for Dedupe {
    fn from(v: Vec<(RequestId, Remembered)>) -> Dedupe {
        let mut d = Dedupe::default();
        for (id, o) in v {
            d.remember(id, o);
        }
        d
    }
}

/// As the list of `(request id, outcome)` pairs, oldest first, that [`From`] reads back.
impl Serialize for Dedupe {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize_in_order(s, self.order.iter().filter_map(|id| self.outcomes.get(id).map(|o| (*id, o))))
    }
}

/// Writes a window's pairs as a sequence, read from the window itself. Snapshots write both windows
/// (ten thousand entries each); turned into a list first, as serde's `into` does, each window was
/// copied whole and then taken apart entry by entry. A sequence must say its length first, so the
/// pairs are counted, then written.
fn serialize_in_order<S: Serializer, T: Serialize>(
    s: S,
    pairs: impl Iterator<Item = (RequestId, T)> + Clone,
) -> Result<S::Ok, S::Error> {
    let mut seq = s.serialize_seq(Some(pairs.clone().count()))?;
    for pair in pairs {
        seq.serialize_element(&pair)?;
    }
    seq.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_bounded_by_bytes_and_round_trip() {
        let mut r = RecentReplies::default();
        let doc = serde_json::json!({"pad": "x".repeat(1 << 20)});
        for i in 0..6u128 {
            r.remember(RequestId(i), JsonText::render(&doc));
        }
        assert!(r.get(&RequestId(0)).is_none() && r.get(&RequestId(1)).is_none(), "oldest evicted");
        assert_eq!(r.get(&RequestId(5)).map(|t| t.to_value()), Some(doc.clone()));
        assert_eq!(round_trips(&r), r);
    }

    /// Through JSON, as snapshots hold the windows (in the state's JSON part, or the replies' text
    /// beside it); they are written as the plain list of pairs older snapshots hold.
    fn round_trips<W>(window: &W) -> W
    where
        W: Serialize + serde::de::DeserializeOwned,
    {
        serde_json::from_str(&serde_json::to_string(window).unwrap()).unwrap()
    }

    #[test]
    fn windows_are_written_as_their_lists_of_pairs() {
        let mut d = Dedupe::default();
        let twin = |m: Option<&str>| Remembered::Twin(WrittenTwin::new(DeviceKey::from("d"), m));
        d.remember(RequestId(3), twin(None));
        d.remember(RequestId(1), Remembered::Reported(7));
        d.remember(RequestId(4), twin(Some("m")));
        let list =
            vec![(RequestId(3), twin(None)), (RequestId(1), Remembered::Reported(7)), (RequestId(4), twin(Some("m")))];
        assert_eq!(postcard::to_allocvec(&d).unwrap(), postcard::to_allocvec(&list).unwrap());
        assert_eq!(serde_json::to_string(&d).unwrap(), serde_json::to_string(&list).unwrap());
        // A written twin is written as the twin id it names, so older snapshots read as they did.
        #[derive(Serialize)]
        enum Before {
            #[serde(rename = "Twin")]
            Twin(TwinId),
        }
        let ids = [TwinId::device("d"), TwinId::module("d", "m")];
        let before = |i: usize| Before::Twin(ids[i].clone());
        assert_eq!(serde_json::to_string(&twin(None)).unwrap(), serde_json::to_string(&before(0)).unwrap());
        assert_eq!(serde_json::to_string(&twin(Some("m"))).unwrap(), serde_json::to_string(&before(1)).unwrap());
        let read: Remembered = serde_json::from_str(&serde_json::to_string(&before(1)).unwrap()).unwrap();
        assert_eq!(read, twin(Some("m")));
        match read {
            Remembered::Twin(t) => assert_eq!(t.to_id(), ids[1]),
            other => panic!("{other:?}"),
        }
        let mut r = RecentReplies::default();
        r.remember(RequestId(9), JsonText::render(&serde_json::json!({"a": [1, "b"]})));
        let list = vec![(RequestId(9), serde_json::json!({"a": [1, "b"]}))];
        assert_eq!(serde_json::to_string(&r).unwrap(), serde_json::to_string(&list).unwrap());
        assert_eq!(round_trips(&r), r);
        assert_eq!(round_trips(&d), d);
    }

    #[test]
    fn window_is_fifo_and_bounded() {
        let mut d = Dedupe::default();
        for i in 0..(DEDUPE_WINDOW as u128 + 5) {
            d.remember(RequestId(i), Remembered::Reported(i as i64));
        }
        assert_eq!(d.len(), DEDUPE_WINDOW);
        assert!(d.get(&RequestId(4)).is_none());
        assert_eq!(d.get(&RequestId(5)), Some(&Remembered::Reported(5)));
        assert_eq!(round_trips(&d), d);
    }
}
