//! An equality index over device twins' tags: which devices hold a given primitive at a given tag
//! path. A selective query (`WHERE tags.building = 43 AND …`) then visits the few devices the index
//! names instead of every twin of the shard.
//!
//! The index is a *candidate filter*, never the answer: every candidate is still tested against the
//! whole WHERE clause. So it only has to hold one property — every device whose tags hold `value` at
//! `path` (by the query language's lookup and comparison rules) is listed under the key of
//! `(path, value)` — and keys may be coarser than the language's equality:
//! - paths are keyed ASCII-lowercased, because a lookup falls back to a case-insensitive member;
//! - numbers are keyed by their `f64` value, because the language compares an integer with a float
//!   (and integers beyond 2^53 with each other exactly, which only makes a key list more devices).
//!
//! Only primitives in objects are indexed (not inside arrays), at most [`MAX_DEPTH`] keys deep, and
//! strings of at most [`MAX_STRING`] bytes; a lookup whose key could not have been indexed answers
//! `None` ("cannot tell"), and the caller scans. Module twins are not indexed.
//!
//! The index is derived state: it is not in snapshots and is rebuilt when a snapshot is decoded.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;

use super::packed::{NodeRef, ValueRef};
use super::DeviceKey;

/// Deepest tag path indexed (`tags.a.b.c.d`).
pub const MAX_DEPTH: usize = 4;
/// Longest string value indexed, in bytes.
pub const MAX_STRING: usize = 128;

/// An indexed primitive.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum IndexValue {
    Bool(bool),
    /// Bits of the number's `f64` value (`-0` as `0`).
    Num(u64),
    Str(Box<str>),
}

impl IndexValue {
    pub fn number(f: f64) -> IndexValue {
        IndexValue::Num(if f == 0.0 { 0.0f64.to_bits() } else { f.to_bits() })
    }

    /// The key of a string, if strings that long are indexed.
    pub fn string(s: &str) -> Option<IndexValue> {
        (s.len() <= MAX_STRING).then(|| IndexValue::Str(s.into()))
    }
}

/// Key of a path below `tags`: lowercased segments joined by `\u{1f}`. A key containing that
/// character could make two paths share a key; that only lists more candidates.
fn path_key<'a>(segments: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = String::new();
    for (i, s) in segments.into_iter().enumerate() {
        if i > 0 {
            out.push('\u{1f}');
        }
        out.extend(s.chars().map(|c| c.to_ascii_lowercase()));
    }
    out
}

/// Ids of at most this many bytes are held inline in the index.
const INLINE: usize = 16;

/// The devices listed under one key. An insert compares the new id with a dozen or more of the set's,
/// so ids of up to [`INLINE`] bytes (most fleets' naming) are held inline, as the big-endian number
/// of their zero-padded bytes: each of those compares is one integer compare in the tree's own nodes
/// instead of a pointer chase to the id's text. Padded numbers order as the ids do, since an id held
/// inline never contains a NUL byte. Longer ids are the shard's own key (shared with its device map),
/// so no entry allocates.
#[derive(Clone, Debug, Default, PartialEq)]
struct IdSet {
    inline: BTreeSet<u128>,
    shared: BTreeSet<DeviceKey>,
}

/// The big-endian number of `bytes` (at most [`INLINE`] of them) zero-padded.
fn padded(bytes: &[u8]) -> u128 {
    let mut out = [0; INLINE];
    out[..bytes.len()].copy_from_slice(bytes);
    u128::from_be_bytes(out)
}

/// `id` as its inline number, if it is held inline.
fn inline_id(id: &str) -> Option<u128> {
    let bytes = id.as_bytes();
    (bytes.len() <= INLINE && !bytes.contains(&0)).then(|| padded(bytes))
}

/// A listed device id: an inline one's bytes, or the shard's shared text.
#[derive(Clone, Copy, Debug)]
pub enum CandidateId<'a> {
    Inline([u8; INLINE]),
    Shared(&'a str),
}

impl CandidateId<'_> {
    /// The id (an inline one was a whole `str` before padding, so it decodes).
    pub fn as_str(&self) -> &str {
        match self {
            CandidateId::Inline(bytes) => {
                let len = bytes.iter().position(|&b| b == 0).unwrap_or(INLINE);
                std::str::from_utf8(&bytes[..len]).unwrap_or_default()
            }
            CandidateId::Shared(s) => s,
        }
    }
}

impl IdSet {
    fn insert(&mut self, id: &DeviceKey) {
        match inline_id(id) {
            Some(n) => self.inline.insert(n),
            None => self.shared.insert(id.clone()),
        };
    }

    fn remove(&mut self, id: &str) {
        match inline_id(id) {
            Some(n) => self.inline.remove(&n),
            None => self.shared.remove(id),
        };
    }

    fn is_empty(&self) -> bool {
        self.inline.is_empty() && self.shared.is_empty()
    }
}

/// The devices an index key lists (see [`TagIndex::candidates`]).
#[derive(Clone, Copy)]
pub struct Candidates<'a> {
    set: &'a IdSet,
}

impl<'a> Candidates<'a> {
    pub fn len(&self) -> usize {
        self.set.inline.len() + self.set.shared.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// The ids after `after` (all of them for `None`), in id order.
    pub fn after(self, after: Option<&'a str>) -> impl Iterator<Item = CandidateId<'a>> + 'a {
        // Inline ids from a lower bound no id after `after` is below: its first bytes up to a NUL.
        let low = after.map(|a| {
            let cut = a.bytes().take(INLINE).position(|b| b == 0).unwrap_or(a.len().min(INLINE));
            padded(&a.as_bytes()[..cut])
        });
        let inline = self
            .set
            .inline
            .range((low.map_or(Bound::Unbounded, Bound::Included), Bound::Unbounded))
            .map(|n| CandidateId::Inline(n.to_be_bytes()))
            .filter(move |id| after.is_none_or(|a| id.as_str() > a));
        let shared = self
            .set
            .shared
            .range::<str, _>((after.map_or(Bound::Unbounded, Bound::Excluded), Bound::Unbounded))
            .map(|id| CandidateId::Shared(id));
        let mut inline = inline.peekable();
        let mut shared = shared.peekable();
        std::iter::from_fn(move || match (inline.peek(), shared.peek()) {
            (Some(a), Some(b)) if b.as_str() < a.as_str() => shared.next(),
            (Some(_), _) => inline.next(),
            (None, _) => shared.next(),
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct TagIndex {
    entries: HashMap<(String, IndexValue), IdSet>,
}

impl TagIndex {
    /// Lists `device` under every indexed primitive of `tags`.
    pub fn add(&mut self, device: &DeviceKey, tags: NodeRef<'_>) {
        let entries = &mut self.entries;
        Self::keys_of(tags, &mut Vec::new(), &mut |key| {
            entries.entry(key).or_default().insert(device);
        });
    }

    /// Removes `device` from every key `tags` lists it under.
    pub fn remove(&mut self, device: &str, tags: NodeRef<'_>) {
        let entries = &mut self.entries;
        Self::keys_of(tags, &mut Vec::new(), &mut |key| {
            if let Some(set) = entries.get_mut(&key) {
                set.remove(device);
                if set.is_empty() {
                    entries.remove(&key);
                }
            }
        });
    }

    /// Calls `f` with the key of every indexed primitive below `node` (`path` leads to `node`).
    fn keys_of<'a>(node: NodeRef<'a>, path: &mut Vec<&'a str>, f: &mut dyn FnMut((String, IndexValue))) {
        for (name, child) in node.members() {
            path.push(name);
            let value = match child.value() {
                ValueRef::Object if path.len() < MAX_DEPTH => {
                    Self::keys_of(child, path, f);
                    None
                }
                ValueRef::Bool(b) => Some(IndexValue::Bool(b)),
                ValueRef::Number(text) => text.parse::<f64>().ok().filter(|x| x.is_finite()).map(IndexValue::number),
                ValueRef::String(s) => IndexValue::string(s),
                ValueRef::Object | ValueRef::Array(_) => None,
            };
            if let Some(v) = value {
                f((path_key(path.iter().copied()), v));
            }
            path.pop();
        }
    }

    /// The devices that may hold `value` at the tag path `path` (the segments after `tags`); `None`
    /// if such a path or value is not indexed, so the index cannot tell.
    pub fn candidates<'s, 'p>(
        &'s self,
        path: impl ExactSizeIterator<Item = &'p str>,
        value: &IndexValue,
    ) -> Option<Candidates<'s>> {
        static EMPTY: IdSet = IdSet { inline: BTreeSet::new(), shared: BTreeSet::new() };
        if path.len() == 0 || path.len() > MAX_DEPTH {
            return None;
        }
        if matches!(value, IndexValue::Str(s) if s.len() > MAX_STRING) {
            return None;
        }
        Some(Candidates { set: self.entries.get(&(path_key(path), value.clone())).unwrap_or(&EMPTY) })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::super::{Node, Packed};
    use super::*;

    fn node(v: Value) -> Packed {
        let Value::Object(m) = v else { panic!("object") };
        Packed::pack(&Node::section_from_map(&m, 1, 0))
    }

    fn ids(set: Option<Candidates<'_>>) -> Vec<String> {
        let set = set.expect("indexed");
        let all: Vec<String> = set.after(None).map(|id| id.as_str().to_string()).collect();
        assert_eq!(all.len(), set.len());
        all
    }

    fn id(s: &str) -> DeviceKey {
        s.into()
    }

    #[test]
    fn lists_devices_by_lowercased_path_and_numeric_value() {
        let mut idx = TagIndex::default();
        idx.add(&id("d2"), node(json!({"Building": 43, "loc": {"Floor": "2"}})).root());
        idx.add(&id("d1"), node(json!({"building": 43.0, "on": true, "arr": [1]})).root());
        idx.add(&id("d3"), node(json!({"building": 44})).root());
        assert_eq!(ids(idx.candidates(["BUILDING"].into_iter(), &IndexValue::number(43.0))), ["d1", "d2"]);
        assert_eq!(ids(idx.candidates(["loc", "floor"].into_iter(), &IndexValue::Str("2".into()))), ["d2"]);
        assert_eq!(ids(idx.candidates(["on"].into_iter(), &IndexValue::Bool(true))), ["d1"]);
        assert!(ids(idx.candidates(["on"].into_iter(), &IndexValue::Bool(false))).is_empty());
        // Not indexed: the caller must scan.
        assert!(idx.candidates(["a", "b", "c", "d", "e"].into_iter(), &IndexValue::Bool(true)).is_none());
        let long = "x".repeat(MAX_STRING + 1);
        assert!(idx.candidates(["s"].into_iter(), &IndexValue::Str(long.into())).is_none());
        assert_eq!(IndexValue::number(-0.0), IndexValue::number(0.0));
    }

    #[test]
    fn short_and_long_ids_list_in_one_id_order_and_resume_after_any_id() {
        let mut idx = TagIndex::default();
        let tags = node(json!({"b": 1}));
        // Ids around the inline limit, sharing prefixes with the longer ones.
        let ids = [
            "a",
            "abcdefghijklmnop",  // 16 bytes: inline
            "abcdefghijklmnopq", // 17: shared
            "abcdefghijklmnoq",
            "abcdefghijklmnopqrstuvwxyz",
            "b",
            "zzzzzzzzzzzzzzzzzzzz",
        ];
        for d in ids {
            idx.add(&id(d), tags.root());
        }
        let mut sorted = ids.to_vec();
        sorted.sort();
        let set = idx.candidates(["b"].into_iter(), &IndexValue::number(1.0)).expect("indexed");
        let listed = |after| set.after(after).map(|id| id.as_str().to_string()).collect::<Vec<_>>();
        assert_eq!(listed(None), sorted);
        assert_eq!(set.len(), ids.len());
        // Resuming after each listed id, and after ids that are not listed (shorter, longer, between).
        for after in
            sorted.iter().copied().chain(["", "abcdefghijklmno", "abcdefghijklmnopp", "aa", "zzzzzzzzzzzzzzzzzzzzz"])
        {
            let want: Vec<&str> = sorted.iter().copied().filter(|d| *d > after).collect();
            assert_eq!(listed(Some(after)), want, "after {after:?}");
        }
        for d in ids {
            idx.remove(d, tags.root());
        }
        assert_eq!(idx, TagIndex::default());
    }

    #[test]
    fn removing_a_device_drops_it_and_empty_keys() {
        let mut idx = TagIndex::default();
        let tags = node(json!({"b": 1, "t": {"x": "y"}}));
        idx.add(&id("d1"), tags.root());
        idx.add(&id("d2"), tags.root());
        idx.remove("d1", tags.root());
        assert_eq!(ids(idx.candidates(["b"].into_iter(), &IndexValue::number(1.0))), ["d2"]);
        idx.remove("d2", tags.root());
        assert_eq!(idx, TagIndex::default());
    }
}
