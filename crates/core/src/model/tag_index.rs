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
use std::sync::Arc;

use super::packed::{NodeRef, ValueRef};

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

/// Device ids are the shard's own (`Arc<str>` shared with its device map): an entry costs a pointer,
/// not a copy of the id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TagIndex {
    entries: HashMap<(String, IndexValue), BTreeSet<Arc<str>>>,
}

impl TagIndex {
    /// Lists `device` under every indexed primitive of `tags`.
    pub fn add(&mut self, device: &Arc<str>, tags: NodeRef<'_>) {
        let entries = &mut self.entries;
        Self::keys_of(tags, &mut Vec::new(), &mut |key| {
            entries.entry(key).or_default().insert(device.clone());
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

    /// The devices that may hold `value` at the tag path `path` (the segments after `tags`), in id
    /// order; `None` if such a path or value is not indexed, so the index cannot tell.
    pub fn candidates<'s, 'p>(
        &'s self,
        path: impl ExactSizeIterator<Item = &'p str>,
        value: &IndexValue,
    ) -> Option<&'s BTreeSet<Arc<str>>> {
        static EMPTY: BTreeSet<Arc<str>> = BTreeSet::new();
        if path.len() == 0 || path.len() > MAX_DEPTH {
            return None;
        }
        if matches!(value, IndexValue::Str(s) if s.len() > MAX_STRING) {
            return None;
        }
        Some(self.entries.get(&(path_key(path), value.clone())).unwrap_or(&EMPTY))
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

    fn ids(set: Option<&BTreeSet<Arc<str>>>) -> Vec<&str> {
        set.expect("indexed").iter().map(|id| &**id).collect()
    }

    fn id(s: &str) -> Arc<str> {
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
