//! Twin sections (`tags`, desired, reported) as a shard holds them: each one packed into a single
//! byte string, read in place. A fleet of millions of twins lives in memory for as long as the fleet
//! does, and as a tree of [`Node`]s a small twin cost a heap block per member, per key and per number
//! (each rounded up by the allocator) plus 56 bytes of node per member: about 760 bytes for the
//! sections of a twin with three tags and a 200-byte desired value, against about 310 packed
//! (`cargo bench --bench twin_bytes`).
//!
//! A patch is merged straight from the packed bytes into new ones ([`Packed::merged`]), and a replace
//! packs the [`Node`] tree built from its body; reads (renders, queries, the tag index) walk the packed
//! bytes without building anything.
//!
//! Layout of a node, always read from a slice that holds exactly it:
//! - a flags byte: the kind in the low three bits, [`OWN_STAMP`] if the stamp follows;
//! - the stamp (`$lastUpdated` in unix ms and `$lastUpdatedVersion`, zigzag LEB128), present only
//!   where it differs from the parent's (a whole patch is stamped alike, so most children inherit it);
//! - the payload: for an object its members, each `key length, key, node length, node`; for a number
//!   its exact text, a string its text, an array its JSON text; nothing for a boolean.

use std::cell::Cell;

use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Number, Value};

use super::doc::{Node, NodeValue};
use super::json_tree::{self, Json};
use super::json_write::{write_json_int, write_json_str, write_key};
use super::time::{Timestamp, NEVER};

const OBJECT: u8 = 0;
const FALSE: u8 = 1;
const TRUE: u8 = 2;
const NUMBER: u8 = 3;
const STRING: u8 = 4;
const ARRAY: u8 = 5;
const KIND: u8 = 0b111;
/// Flag: the node's stamp follows its flags byte (else it is its parent's).
const OWN_STAMP: u8 = 0b1000;

/// Deepest nesting a packed section may have when read from outside (a snapshot). Twins are limited
/// far below this; the bound only keeps a corrupt file from exhausting the stack.
const MAX_DEPTH: usize = 64;

/// One twin section, packed. Built only by [`Packed::pack`] or from bytes [`Packed::from_bytes`]
/// checked, so reading it never meets a malformed node.
#[derive(Clone, PartialEq, Eq)]
pub struct Packed(Box<[u8]>);

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packed({})", self.root().to_value())
    }
}

impl Default for Packed {
    fn default() -> Self {
        Packed::empty_section()
    }
}

impl Packed {
    /// A fresh section: an empty object never updated.
    pub fn empty_section() -> Packed {
        Packed::pack(&Node::empty_section())
    }

    pub fn pack(node: &Node) -> Packed {
        let mut out = Vec::with_capacity(64);
        write_node(&mut out, node, None);
        Packed(out.into_boxed_slice())
    }

    /// The section's root node.
    pub fn root(&self) -> NodeRef<'_> {
        NodeRef::read(&self.0, (NEVER, 0)).unwrap_or(NodeRef::EMPTY)
    }

    /// The section as a tree, to change it.
    pub fn unpack(&self) -> Node {
        self.root().to_node()
    }

    /// The section with an object patch merged in ([`Node::merge`]), every node it names stamped
    /// `at`/`version`: written straight from the packed bytes and the patch, the same bytes as
    /// unpacking, merging and packing again would give. Members the patch does not name are copied
    /// as they are (only their stamp is written out where their parent's changed), so a write to one
    /// leaf of a twin builds no tree of the rest of it: on every replica, for every twin write.
    pub fn merged(&self, patch: &json_tree::Members<'_>, at: i64, version: i64) -> Packed {
        crate::scratch::with_buffer(|out| {
            write_merged(out, self.root(), patch, (at, version), None);
            Packed(Box::from(out.as_slice()))
        })
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Bytes read from outside the process, checked: every node well formed, every text UTF-8.
    /// Kept as they are, without a copy.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Packed, String> {
        check(&bytes, (NEVER, 0), 0)?;
        Ok(Packed(bytes.into_boxed_slice()))
    }
}

/// `v` as LEB128: the bytes and how many of them are used.
fn varint_bytes(mut v: u64) -> ([u8; 10], usize) {
    let (mut buf, mut n) = ([0u8; 10], 0);
    while v >= 0x80 {
        buf[n] = (v as u8) | 0x80;
        v >>= 7;
        n += 1;
    }
    buf[n] = v as u8;
    (buf, n + 1)
}

fn write_varint(out: &mut Vec<u8>, v: u64) {
    let (buf, n) = varint_bytes(v);
    out.extend_from_slice(&buf[..n]);
}

fn write_signed(out: &mut Vec<u8>, v: i64) {
    write_varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// A varint and the bytes after it; `None` if `bytes` ends inside it or it overflows 64 bits.
fn read_varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut v = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((v, &bytes[i + 1..]));
        }
    }
    None
}

fn read_signed(bytes: &[u8]) -> Option<(i64, &[u8])> {
    let (v, rest) = read_varint(bytes)?;
    Some((((v >> 1) as i64) ^ -((v & 1) as i64), rest))
}

/// `len` bytes, and what follows them.
fn take(bytes: &[u8], len: u64) -> Option<(&[u8], &[u8])> {
    let len = usize::try_from(len).ok()?;
    (len <= bytes.len()).then(|| bytes.split_at(len))
}

fn write_node(out: &mut Vec<u8>, node: &Node, parent: Option<(i64, i64)>) {
    let (kind, text): (u8, Option<std::borrow::Cow<'_, str>>) = match &node.value {
        NodeValue::Object(_) => (OBJECT, None),
        NodeValue::Bool(false) => (FALSE, None),
        NodeValue::Bool(true) => (TRUE, None),
        NodeValue::Number(n) => (NUMBER, Some((&**n).into())),
        NodeValue::String(s) => (STRING, Some((&**s).into())),
        NodeValue::Array(a) => (ARRAY, Some(a.to_string().into())),
    };
    let stamp = (node.updated, node.updated_version);
    write_head(out, kind, stamp, parent);
    if let Some(text) = text {
        out.extend_from_slice(text.as_bytes());
    }
    for (key, child) in node.members() {
        write_member(out, key, |out| write_node(out, child, Some(stamp)));
    }
}

/// Writes `old` with `patch` merged in, as [`Node::merge`] does: members keep their order, those the
/// patch names are replaced, merged (an object into an object) or removed (`null`), and the names it
/// adds follow in the patch's order. The node is stamped `stamp`, as is everything the patch names.
fn write_merged(
    out: &mut Vec<u8>,
    old: NodeRef<'_>,
    patch: &json_tree::Members<'_>,
    stamp: (i64, i64),
    parent: Option<(i64, i64)>,
) {
    write_head(out, OBJECT, stamp, parent);
    // Which of the patch's members name a member `old` has (by position in the patch): bits for
    // patches of up to 64 members, a flag each for larger ones.
    let mut named = 0u64;
    let mut named_many = if patch.len() > 64 { vec![false; patch.len()] } else { Vec::new() };
    // A few names are found by scanning the patch, more through a sorted list of them.
    let sorted = (patch.len() > SCAN_UP_TO)
        .then(|| SortedNames::new(patch.iter().enumerate().map(|(i, (k, v))| (k.as_bytes(), (i, v)))));
    // Not an object before (a leaf the patch turns into an object): it has no members to keep.
    let mut rest = if old.is_object() { old.body } else { &[] };
    while let Some((key, node, after)) = member(rest) {
        rest = after;
        let child = NodeRef::read(node, (old.updated, old.updated_version)).unwrap_or(NodeRef::EMPTY);
        let found = match &sorted {
            Some(sorted) => sorted.get(key),
            None => patch.iter().enumerate().find(|(_, (k, _))| k.as_bytes() == key).map(|(i, (_, v))| (i, v)),
        };
        if let Some((i, _)) = found {
            named |= 1u64.checked_shl(i as u32).unwrap_or(0);
            if let Some(flag) = named_many.get_mut(i) {
                *flag = true;
            }
        }
        let key = std::str::from_utf8(key).unwrap_or_default();
        match found.map(|(_, v)| v) {
            None => write_member(out, key, |out| copy_node(out, child, stamp)),
            Some(Json::Null) => {}
            Some(Json::Object(p)) if child.is_object() => {
                write_member(out, key, |out| write_merged(out, child, p, stamp, Some(stamp)))
            }
            Some(v) => write_member(out, key, |out| write_value(out, v, stamp, stamp)),
        }
    }
    for (i, (key, v)) in patch.iter().enumerate() {
        let is_named = if i < 64 { named & (1 << i) != 0 } else { named_many.get(i).copied().unwrap_or(false) };
        if !v.is_null() && !is_named {
            write_member(out, key, |out| write_value(out, v, stamp, stamp));
        }
    }
}

/// A node's flags byte, and its stamp unless it is its parent's.
fn write_head(out: &mut Vec<u8>, kind: u8, stamp: (i64, i64), parent: Option<(i64, i64)>) {
    let own = parent != Some(stamp);
    out.push(kind | if own { OWN_STAMP } else { 0 });
    if own {
        write_signed(out, stamp.0);
        write_signed(out, stamp.1);
    }
}

/// One member of an object: the key, then the node `write` writes, prefixed with its length.
fn write_member(out: &mut Vec<u8>, key: &str, write: impl FnOnce(&mut Vec<u8>)) {
    write_varint(out, key.len() as u64);
    out.extend_from_slice(key.as_bytes());
    // The node's length is known only once it is written: reserve one byte, which fits most nodes,
    // and move the node if its length needs more.
    let at = out.len();
    out.push(0);
    write(out);
    let (prefix, n) = varint_bytes((out.len() - at - 1) as u64);
    out.splice(at..at + 1, prefix[..n].iter().copied());
}

/// A node kept as it is under a parent whose stamp may have changed: its own stamp is written out if
/// it now differs from the parent's; its payload, and with it every stamp below, is copied.
fn copy_node(out: &mut Vec<u8>, node: NodeRef<'_>, parent: (i64, i64)) {
    write_head(out, node.kind, (node.updated, node.updated_version), Some(parent));
    out.extend_from_slice(node.body);
}

/// A patch value as a new node stamped `stamp` ([`Node::from_value`]); the caller skips `null`.
fn write_value(out: &mut Vec<u8>, v: &Json<'_>, stamp: (i64, i64), parent: (i64, i64)) {
    match v {
        Json::Object(m) => {
            write_head(out, OBJECT, stamp, Some(parent));
            for (key, v) in m.iter().filter(|(_, v)| !v.is_null()) {
                write_member(out, key, |out| write_value(out, v, stamp, stamp));
            }
        }
        Json::Bool(b) => write_head(out, if *b { TRUE } else { FALSE }, stamp, Some(parent)),
        Json::U64(_) | Json::I64(_) | Json::Number(_) => {
            write_head(out, NUMBER, stamp, Some(parent));
            if let Some(text) = v.number_text() {
                out.extend_from_slice(text.as_bytes());
            }
        }
        Json::String(s) => {
            write_head(out, STRING, stamp, Some(parent));
            out.extend_from_slice(s.as_bytes());
        }
        Json::Array(_) => {
            write_head(out, ARRAY, stamp, Some(parent));
            // Cannot fail: a tree of JSON values with string keys always serializes.
            let _ = serde_json::to_writer(&mut *out, v);
        }
        // Never written: a `null` member means "absent" (the callers skip it).
        Json::Null => {}
    }
}

/// Checks the node that is all of `bytes`.
fn check(bytes: &[u8], parent: (i64, i64), depth: usize) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err("packed section nested too deep".into());
    }
    let node = NodeRef::read(bytes, parent).ok_or("malformed packed node")?;
    match node.kind {
        OBJECT => {
            let mut rest = node.body;
            while !rest.is_empty() {
                let (key, child, after) = member(rest).ok_or("malformed packed member")?;
                std::str::from_utf8(key).map_err(|e| format!("packed key: {e}"))?;
                check(child, (node.updated, node.updated_version), depth + 1)?;
                rest = after;
            }
            Ok(())
        }
        FALSE | TRUE if node.body.is_empty() => Ok(()),
        NUMBER | STRING | ARRAY => std::str::from_utf8(node.body).map(drop).map_err(|e| format!("packed text: {e}")),
        _ => Err(format!("packed node of unknown kind {}", node.kind)),
    }
}

/// The first member of an object's payload: key, node bytes, and the members after it.
fn member(bytes: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let (key_len, rest) = read_varint(bytes)?;
    let (key, rest) = take(rest, key_len)?;
    let (node_len, rest) = read_varint(rest)?;
    let (node, rest) = take(rest, node_len)?;
    Some((key, node, rest))
}

/// One node of a packed section, with its stamp resolved.
#[derive(Clone, Copy, Debug)]
pub struct NodeRef<'a> {
    kind: u8,
    /// Unix ms of the last change to this node or anything below it ([`NEVER`] on a fresh section).
    pub updated: i64,
    /// Desired `$version` of that change; unused outside desired.
    pub updated_version: i64,
    body: &'a [u8],
}

/// What a node holds; texts are borrowed from the packed bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ValueRef<'a> {
    Object,
    Bool(bool),
    /// The number's exact text.
    Number(&'a str),
    String(&'a str),
    /// The array's JSON text.
    Array(&'a str),
}

/// The members of an object node, in order.
pub struct Members<'a> {
    rest: &'a [u8],
    stamp: (i64, i64),
}

impl<'a> Iterator for Members<'a> {
    type Item = (&'a str, NodeRef<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        let (key, node) = self.next_raw()?;
        Some((std::str::from_utf8(key).unwrap_or_default(), node))
    }
}

impl<'a> Members<'a> {
    /// The next member with its name as bytes: the text writers copy names out as they are, as the
    /// bytes were checked to be UTF-8 when the section was built or read ([`Packed::from_bytes`]).
    fn next_raw(&mut self) -> Option<(&'a [u8], NodeRef<'a>)> {
        let (key, node, rest) = member(self.rest)?;
        self.rest = rest;
        Some((key, NodeRef::read(node, self.stamp).unwrap_or(NodeRef::EMPTY)))
    }
}

impl<'a> NodeRef<'a> {
    const EMPTY: NodeRef<'static> = NodeRef { kind: OBJECT, updated: NEVER, updated_version: 0, body: &[] };

    fn read(bytes: &'a [u8], parent: (i64, i64)) -> Option<NodeRef<'a>> {
        let (&flags, rest) = bytes.split_first()?;
        let ((updated, updated_version), body) = if flags & OWN_STAMP != 0 {
            let (at, rest) = read_signed(rest)?;
            let (version, rest) = read_signed(rest)?;
            ((at, version), rest)
        } else {
            (parent, rest)
        };
        Some(NodeRef { kind: flags & KIND, updated, updated_version, body })
    }

    fn text(&self) -> &'a str {
        std::str::from_utf8(self.body).unwrap_or_default()
    }

    pub fn value(&self) -> ValueRef<'a> {
        match self.kind {
            FALSE => ValueRef::Bool(false),
            TRUE => ValueRef::Bool(true),
            NUMBER => ValueRef::Number(self.text()),
            STRING => ValueRef::String(self.text()),
            ARRAY => ValueRef::Array(self.text()),
            _ => ValueRef::Object,
        }
    }

    pub fn is_object(&self) -> bool {
        self.kind == OBJECT
    }

    /// The members, in insertion order; none for anything but an object.
    pub fn members(&self) -> Members<'a> {
        let rest = if self.is_object() { self.body } else { &[] };
        Members { rest, stamp: (self.updated, self.updated_version) }
    }

    /// Member `key`, its name compared as bytes (not decoded first).
    fn child(&self, key: &str) -> Option<NodeRef<'a>> {
        let mut members = self.members();
        while let Some((name, node)) = members.next_raw() {
            if name == key.as_bytes() {
                return Some(node);
            }
        }
        None
    }

    /// Member `key` as the query language finds it: the exact name, else the first name equal to it
    /// ignoring ASCII case.
    pub fn find_member(&self, key: &str) -> Option<NodeRef<'a>> {
        self.child(key).or_else(|| self.members().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, n)| n))
    }

    /// The tree, to change it.
    pub fn to_node(&self) -> Node {
        let value = match self.value() {
            ValueRef::Object => NodeValue::Object(self.members().map(|(k, n)| (k.into(), n.to_node())).collect()),
            ValueRef::Bool(b) => NodeValue::Bool(b),
            ValueRef::Number(n) => NodeValue::Number(n.into()),
            ValueRef::String(s) => NodeValue::String(s.into()),
            ValueRef::Array(a) => NodeValue::Array(Box::new(serde_json::from_str(a).unwrap_or(Value::Null))),
        };
        Node { value, updated: self.updated, updated_version: self.updated_version }
    }

    /// The plain JSON value, without metadata.
    pub fn to_value(&self) -> Value {
        match self.value() {
            ValueRef::Object => Value::Object(self.to_map()),
            ValueRef::Bool(b) => Value::Bool(b),
            ValueRef::Number(n) => n.parse::<Number>().map(Value::Number).unwrap_or(Value::Null),
            ValueRef::String(s) => Value::String(s.to_string()),
            ValueRef::Array(a) => serde_json::from_str(a).unwrap_or(Value::Null),
        }
    }

    pub fn to_map(&self) -> Map<String, Value> {
        self.members().map(|(k, n)| (k.to_string(), n.to_value())).collect()
    }

    /// `$metadata` of this node and everything below it.
    pub fn metadata(&self, with_version: bool) -> Value {
        to_value(&Metadata { node: *self, with_version })
    }

    /// `$metadata` restricted to what `patch` touched (twin change events carry only that), as a
    /// view that serializes it.
    pub fn patch_metadata<'p>(&self, patch: &'p json_tree::Members<'p>, with_version: bool) -> PatchMetadata<'a, 'p> {
        PatchMetadata { node: *self, patch, with_version }
    }

    /// [`NodeRef::patch_metadata`] written as text, the bytes serde_json writes for it.
    pub fn write_patch_metadata(&self, out: &mut Vec<u8>, patch: &json_tree::Members<'_>, with_version: bool) {
        write_patch_metadata(out, *self, patch, with_version, &mut LastStamp::default());
    }

    /// A section as IoT Hub renders it: members, then `$metadata`, then `$version`.
    pub fn render_section(&self, section_version: i64, with_version: bool) -> Value {
        to_value(&Section { node: *self, version: section_version, with_version })
    }

    /// Size as [`super::validate::doc_size`] computes it, without rendering. Names, strings and
    /// numbers are measured from their bytes where they are ASCII (nearly always), without reading
    /// them as `str` first: each write measures the sections it merged on every replica.
    pub fn size(&self) -> usize {
        let text_size = |bytes: &[u8]| {
            use super::validate::{ascii_text_size, text_size};
            ascii_text_size(bytes).unwrap_or_else(|| text_size(std::str::from_utf8(bytes).unwrap_or_default()))
        };
        match self.kind {
            FALSE => 5,
            TRUE => 4,
            NUMBER if self.body.is_ascii() => self.body.len(),
            NUMBER => self.text().chars().count(),
            STRING => text_size(self.body),
            ARRAY => json_tree::parse(self.text()).map_or(0, |v| super::validate::doc_size(&v)),
            _ => {
                let (mut count, mut sum) = (0usize, 0usize);
                let mut members = self.members();
                while let Some((name, node)) = members.next_raw() {
                    count += 1;
                    sum += text_size(name) + 1 + node.size();
                }
                2 + count.saturating_sub(1) + sum
            }
        }
    }
}

/// Renders a view through serde into a tree. The views (these and the twin's in `registry`) cannot
/// fail to serialize (their map keys are strings), so the `Null` fallback is never taken.
pub(super) fn to_value(view: &impl Serialize) -> Value {
    serde_json::to_value(view).unwrap_or(Value::Null)
}

// Views of a packed node that serialize as the JSON IoT Hub renders: `serde_json::to_value` builds
// the tree (queries, events) and `serde_json::to_writer` the text of change events. The text a twin
// write answers is written by the text writers further down, to the same bytes.

/// A node's plain JSON value, without metadata: what [`NodeRef::to_value`] builds.
#[derive(Clone, Copy)]
pub struct Plain<'a>(pub NodeRef<'a>);

impl Serialize for Plain<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.value() {
            ValueRef::Object => MembersOf(self.0).serialize(s),
            ValueRef::Bool(b) => s.serialize_bool(b),
            // The number's text written as it is: a `Number` parsed from it would copy it into a
            // string of its own first (arbitrary precision) only to write the same text out again.
            ValueRef::Number(n) => match serde_json::from_str::<&serde_json::value::RawValue>(n) {
                Ok(raw) => raw.serialize(s),
                Err(_) => s.serialize_unit(),
            },
            ValueRef::String(text) => s.serialize_str(text),
            ValueRef::Array(a) => serde_json::from_str::<Value>(a).unwrap_or(Value::Null).serialize(s),
        }
    }
}

/// An object node's members as a map (none for anything else): what [`NodeRef::to_map`] builds.
#[derive(Clone, Copy)]
pub struct MembersOf<'a>(pub NodeRef<'a>);

impl Serialize for MembersOf<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for (k, n) in self.0.members() {
            map.serialize_entry(k, &Plain(n))?;
        }
        map.end()
    }
}

/// A node's own stamp: `$lastUpdated`, and `$lastUpdatedVersion` where asked for and ever updated.
struct Stamp<'a> {
    node: NodeRef<'a>,
    with_version: bool,
}

impl Stamp<'_> {
    fn entries<M: SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        map.serialize_entry("$lastUpdated", &Timestamp(self.node.updated))?;
        if self.with_version && self.node.updated != NEVER {
            map.serialize_entry("$lastUpdatedVersion", &self.node.updated_version)?;
        }
        Ok(())
    }
}

impl Serialize for Stamp<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        self.entries(&mut map)?;
        map.end()
    }
}

/// `$metadata` of a node and everything below it.
struct Metadata<'a> {
    node: NodeRef<'a>,
    with_version: bool,
}

impl Serialize for Metadata<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        Stamp { node: self.node, with_version: self.with_version }.entries(&mut map)?;
        for (k, n) in self.node.members() {
            map.serialize_entry(k, &Metadata { node: n, with_version: self.with_version })?;
        }
        map.end()
    }
}

/// `$metadata` of the members a merge patch named, as its node holds them after the merge: the
/// node's own stamp, then for each patched key still present its metadata (recursing where both the
/// patch and the node hold an object). Keys the patch deleted have none. Patch keys never start with
/// `$` (validation refuses it), so they cannot collide with the stamp's members.
pub struct PatchMetadata<'a, 'p> {
    node: NodeRef<'a>,
    patch: &'p json_tree::Members<'p>,
    with_version: bool,
}

impl Serialize for PatchMetadata<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        Stamp { node: self.node, with_version: self.with_version }.entries(&mut map)?;
        let children = Children::of(self.node, self.patch.len());
        for (k, pv) in self.patch.iter() {
            let Some(n) = children.get(k) else { continue };
            match pv {
                Json::Object(pm) if n.is_object() => {
                    map.serialize_entry(k, &n.patch_metadata(pm, self.with_version))?
                }
                _ => map.serialize_entry(k, &Metadata { node: n, with_version: self.with_version })?,
            }
        }
        map.end()
    }
}

/// How many lookups by name a scan serves before a sorted list of the names is worth building: a
/// patch of a hundred members merged into an object of a hundred would otherwise be ten thousand
/// comparisons, in the merge and again in the change event's `$metadata`.
const SCAN_UP_TO: usize = 8;

/// Names (unique, as an object's are) sorted by their bytes, each with what it names.
struct SortedNames<'a, T>(Vec<(&'a [u8], T)>);

impl<'a, T: Copy> SortedNames<'a, T> {
    fn new(names: impl Iterator<Item = (&'a [u8], T)>) -> SortedNames<'a, T> {
        let mut sorted: Vec<_> = names.collect();
        sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
        SortedNames(sorted)
    }

    fn get(&self, name: &[u8]) -> Option<T> {
        self.0.binary_search_by(|(n, _)| (*n).cmp(name)).ok().map(|i| self.0[i].1)
    }
}

/// An object's members found by name, for as many lookups as a patch has members.
enum Children<'a> {
    Scan(NodeRef<'a>),
    Sorted(SortedNames<'a, NodeRef<'a>>),
}

impl<'a> Children<'a> {
    fn of(node: NodeRef<'a>, lookups: usize) -> Children<'a> {
        if lookups <= SCAN_UP_TO {
            return Children::Scan(node);
        }
        let mut members = node.members();
        Children::Sorted(SortedNames::new(std::iter::from_fn(|| members.next_raw())))
    }

    fn get(&self, key: &str) -> Option<NodeRef<'a>> {
        match self {
            Children::Scan(node) => node.child(key),
            Children::Sorted(sorted) => sorted.get(key.as_bytes()),
        }
    }
}

/// A section as IoT Hub renders it: members, then `$metadata`, then `$version`. Member keys never
/// start with `$` (validation refuses it), so these two cannot collide with a member.
pub struct Section<'a> {
    pub node: NodeRef<'a>,
    pub version: i64,
    pub with_version: bool,
}

impl Serialize for Section<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for (k, n) in self.node.members() {
            map.serialize_entry(k, &Plain(n))?;
        }
        map.serialize_entry("$metadata", &Metadata { node: self.node, with_version: self.with_version })?;
        map.serialize_entry("$version", &self.version)?;
        map.end()
    }
}

// The same views written straight as JSON text, without serde: the twin a write answers is rendered
// on every replica, and through serde most of that was its generic map machinery, byte-by-byte string
// escaping, and UTF-8 checks of names already checked. The bytes are serde_json's for the views above
// (`text_writers_match_the_serde_views` compares them over generated sections).

/// [`Plain`] as text.
fn write_plain(out: &mut Vec<u8>, node: NodeRef<'_>) {
    match node.kind {
        OBJECT => write_members(out, node),
        FALSE => out.extend_from_slice(b"false"),
        TRUE => out.extend_from_slice(b"true"),
        // A number's text is written as it is; text that is not a number (never packed, but the bytes
        // are only checked to be UTF-8 when read) is `null`, as [`Plain`] writes it. Each byte is
        // tested by a `match`: searching a list of the allowed bytes cost some 25 instructions a digit.
        NUMBER
            if !node.body.is_empty()
                && node.body.iter().all(|b| matches!(b, b'0'..=b'9' | b'+' | b'-' | b'.' | b'e' | b'E')) =>
        {
            out.extend_from_slice(node.body)
        }
        NUMBER => out.extend_from_slice(b"null"),
        STRING => write_json_str(out, node.body),
        // Rare; written as [`Plain`] writes it, through the parsed array.
        _ => {
            let _ = serde_json::to_writer(&mut *out, &Plain(node)); // cannot fail: into a vector
        }
    }
}

/// [`MembersOf`] as text.
pub(crate) fn write_members(out: &mut Vec<u8>, node: NodeRef<'_>) {
    out.push(b'{');
    write_member_list(out, node, &mut true);
    out.push(b'}');
}

/// An object node's members, `"name":value` each, inside braces the caller writes.
fn write_member_list(out: &mut Vec<u8>, node: NodeRef<'_>, first: &mut bool) {
    let mut members = node.members();
    while let Some((name, child)) = members.next_raw() {
        write_key(out, first, name);
        write_plain(out, child);
    }
}

/// Where the last `$lastUpdated` was written, and its time: a patch stamps all it writes alike, so
/// the members of a section mostly share their parent's time, and computing a date is most of writing
/// one. A repeat copies the earlier text from the output.
#[derive(Default)]
struct LastStamp {
    written: Option<(i64, std::ops::Range<usize>)>,
}

impl LastStamp {
    fn write(&mut self, out: &mut Vec<u8>, at: i64) {
        match &self.written {
            Some((time, text)) if *time == at => out.extend_from_within(text.clone()),
            _ => {
                let start = out.len();
                Timestamp(at).write_json(out);
                self.written = Some((at, start..out.len()));
            }
        }
    }
}

/// `{` and [`Stamp`] as text: the start of a node's `$metadata`, whose members the caller writes.
fn write_stamp(out: &mut Vec<u8>, node: NodeRef<'_>, with_version: bool, last: &mut LastStamp) {
    out.extend_from_slice(b"{\"$lastUpdated\":");
    last.write(out, node.updated);
    if with_version && node.updated != NEVER {
        out.extend_from_slice(b",\"$lastUpdatedVersion\":");
        write_json_int(out, node.updated_version);
    }
}

/// [`Metadata`] as text.
fn write_metadata(out: &mut Vec<u8>, node: NodeRef<'_>, with_version: bool, last: &mut LastStamp) {
    write_stamp(out, node, with_version, last);
    let mut members = node.members();
    while let Some((name, child)) = members.next_raw() {
        write_key(out, &mut false, name);
        write_metadata(out, child, with_version, last);
    }
    out.push(b'}');
}

/// [`PatchMetadata`] as text.
fn write_patch_metadata(
    out: &mut Vec<u8>,
    node: NodeRef<'_>,
    patch: &json_tree::Members<'_>,
    with_version: bool,
    last: &mut LastStamp,
) {
    write_stamp(out, node, with_version, last);
    let children = Children::of(node, patch.len());
    for (k, pv) in patch.iter() {
        let Some(n) = children.get(k) else { continue };
        write_key(out, &mut false, k.as_bytes());
        match pv {
            Json::Object(pm) if n.is_object() => write_patch_metadata(out, n, pm, with_version, last),
            _ => write_metadata(out, n, with_version, last),
        }
    }
    out.push(b'}');
}

impl Section<'_> {
    /// This section as text: the bytes its `Serialize` gives through serde_json.
    pub(crate) fn write_text(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        let mut first = true;
        write_member_list(out, self.node, &mut first);
        write_key(out, &mut first, b"$metadata");
        write_metadata(out, self.node, self.with_version, &mut LastStamp::default());
        out.extend_from_slice(b",\"$version\":");
        write_json_int(out, self.version);
        out.push(b'}');
    }
}

thread_local! {
    /// Set while a snapshot written before sections were packed is decoded: its sections are
    /// [`Node`] trees in postcard, which has no marks to tell the two apart.
    static NODE_LAYOUT: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` (a decode) with binary sections in the [`Node`] layout of earlier snapshots.
pub(super) fn with_node_layout<T>(f: impl FnOnce() -> T) -> T {
    NODE_LAYOUT.with(|l| l.set(true));
    let out = f();
    NODE_LAYOUT.with(|l| l.set(false));
    out
}

/// Human-readable formats (JSON backups, JSON snapshots) carry the tree; binary ones carry the
/// packed bytes (or the tree, inside `with_node_layout`).
impl Serialize for Packed {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() || NODE_LAYOUT.with(Cell::get) {
            self.unpack().serialize(s)
        } else {
            s.serialize_bytes(&self.0)
        }
    }
}

impl<'de> Deserialize<'de> for Packed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Packed, D::Error> {
        if d.is_human_readable() || NODE_LAYOUT.with(Cell::get) {
            Node::deserialize(d).map(|n| Packed::pack(&n))
        } else {
            Packed::from_bytes(serde_bytes_buf(d)?).map_err(serde::de::Error::custom)
        }
    }
}

/// A byte string from a binary deserializer (postcard hands it borrowed or owned).
fn serde_bytes_buf<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    struct Bytes;
    impl<'de> serde::de::Visitor<'de> for Bytes {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a packed twin section")
        }
        fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
        fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }
    }
    d.deserialize_bytes(Bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn section(v: Value, at: i64, version: i64) -> Node {
        let Value::Object(m) = v else { panic!("object") };
        Node::section_from_map(&m, at, version)
    }

    #[test]
    fn packing_keeps_values_stamps_and_order() {
        let v = json!({"z": {"b": [1, {"x": null}], "a": false, "n": -1.50e3}, "é": "ü\u{1}", "t": true, "e": {}});
        let mut n = section(v.clone(), 1_700_000_000_123, 4);
        n.merge(&json!({"z": {"a": true}}).as_object().cloned().unwrap_or_default(), 1_800_000_000_000, 5);
        let p = Packed::pack(&n);
        assert_eq!(p.unpack(), n);
        let root = p.root();
        assert_eq!(root.find_member("Z").map(|z| (z.updated, z.updated_version)), Some((1_800_000_000_000, 5)));
        let z = root.find_member("z").expect("z");
        assert_eq!(z.find_member("b").map(|b| b.updated), Some(1_700_000_000_123));
        assert_eq!(z.find_member("n").map(|b| b.value()), Some(ValueRef::Number("-1500.0")));
        assert_eq!(root.members().map(|(k, _)| k).collect::<Vec<_>>(), ["z", "é", "t", "e"]);
        assert_eq!(root.size(), super::super::validate::doc_size(&Json::of(&n_value(&n))));
    }

    fn n_value(n: &Node) -> Value {
        Packed::pack(n).root().to_value()
    }

    /// A small xorshift generator: the same cases on every run, no dependency.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }

        /// A value whose objects draw their keys from four names, so that patches meet existing
        /// members, replace leaves with objects and objects with leaves, and remove what is there.
        fn value(&mut self, depth: u32) -> Value {
            match self.below(if depth == 0 { 6 } else { 8 }) {
                0 => Value::Null,
                1 => Value::Bool(self.below(2) == 1),
                2 => serde_json::from_str(["1", "-2.50", "1e3", "4503599627370497"][self.below(4) as usize])
                    .unwrap_or(Value::Null),
                3 => Value::String(["", "x", "é\u{1}", "long text", "tab\there\u{7f}"][self.below(5) as usize].into()),
                4 => json!([1, {"a": null}, "s"]),
                5 => json!({}),
                _ => {
                    let mut m = Map::new();
                    for _ in 0..self.below(5) {
                        m.insert(["a", "b", "c", "d"][self.below(4) as usize].into(), self.value(depth - 1));
                    }
                    Value::Object(m)
                }
            }
        }

        /// A patch of `n` distinct members named from `k0` to `k23`, for the sorted lookups.
        fn wide_patch(&mut self, n: u64) -> Map<String, Value> {
            let mut m = Map::new();
            while (m.len() as u64) < n.min(24) {
                m.insert(format!("k{}", self.below(24)), self.value(2));
            }
            m
        }

        fn patch(&mut self) -> Map<String, Value> {
            match self.value(3) {
                Value::Object(m) => m,
                _ => Map::new(),
            }
        }
    }

    /// Merges `cases` series of generated patches into sections in place and through the tree, and
    /// checks that both give the same bytes, which read back as they are.
    fn merges_match_the_tree(seed: u64, cases: usize, mut draw: impl FnMut(&mut Rng) -> Map<String, Value>) {
        let mut rng = Rng(seed);
        for case in 0..cases {
            let mut p = Packed::empty_section();
            // Stamps from a small set, so that a patch's stamp is often one a kept member already has.
            for _ in 0..rng.below(4) + 1 {
                let (patch, at, version) = (draw(&mut rng), 1_000 * rng.below(3) as i64, rng.below(3) as i64);
                let mut tree = p.unpack();
                tree.merge(&patch, at, version);
                let want = Packed::pack(&tree);
                let got = p.merged(&json_tree::Members::of(&patch), at, version);
                assert_eq!(got.as_bytes(), want.as_bytes(), "case {case}: {:?} merged with {patch:?}", p.unpack());
                assert_eq!(Packed::from_bytes(got.as_bytes().to_vec()).as_ref(), Ok(&got));
                p = got;
            }
        }
    }

    #[test]
    fn merged_in_place_equals_unpack_merge_pack() {
        merges_match_the_tree(0x9e37_79b9_7f4a_7c15, 5_000, Rng::patch);
    }

    /// The text writers against the serde views they stand in for, over the sections the merge test
    /// builds plus names and strings that need escapes, arrays, numbers in every shape and stamps
    /// never set.
    #[test]
    fn text_writers_match_the_serde_views() {
        let assert_same = |p: &Packed, case: &str| {
            let root = p.root();
            let mut text = Vec::new();
            write_members(&mut text, root);
            assert_eq!(Some(&text), serde_json::to_vec(&MembersOf(root)).ok().as_ref(), "{case}: members");
            let size = super::super::validate::doc_size(&Json::of(&root.to_value()));
            assert_eq!(root.size(), size, "{case}: size");
            for (version, with_version) in [(0, false), (7, true), (-3, true)] {
                let section = Section { node: root, version, with_version };
                let mut text = Vec::new();
                section.write_text(&mut text);
                assert_eq!(Some(&text), serde_json::to_vec(&section).ok().as_ref(), "{case}: section");
            }
        };
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for case in 0..3_000 {
            let mut p = Packed::empty_section();
            for _ in 0..rng.below(4) + 1 {
                p = p.merged(
                    &json_tree::Members::of(&rng.patch()),
                    [NEVER, 0, 1_700_000_000_123][rng.below(3) as usize],
                    rng.below(3) as i64,
                );
                assert_same(&p, &format!("case {case}"));
            }
        }
        let odd = json!({
            "q\"uote": "a\"b\\c\u{1}\u{1f}\u{7f}\n\t\u{8}\u{c}\r",
            "é/ü": {"back\\slash": ["x\"", 1.5, {"k": null}], "n": -0.0, "big": 123456789012345678901234567890u128},
            "e": 1e300, "f": 2.50E-3, "s": "", "o": {}, "t": true, "u": false
        });
        assert_same(&Packed::pack(&section(odd.clone(), NEVER, 0)), "odd, never set");
        assert_same(&Packed::pack(&section(odd, 253_402_300_800_000, 9)), "odd, past year 9999");
    }

    /// The change event's `$metadata` written as text is what serde_json writes for its view, for
    /// patches merged into generated sections (narrow and wide, nested, removing, replacing).
    #[test]
    fn patch_metadata_text_matches_the_serde_view() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..3_000 {
            let mut p = Packed::empty_section();
            for step in 0..rng.below(4) + 1 {
                let wide = rng.below(4) == 0;
                let members = rng.below(20) + 1;
                let patch = if wide { rng.wide_patch(members) } else { rng.patch() };
                let members = json_tree::Members::of(&patch);
                let at = [NEVER, 0, 1_700_000_000_123][rng.below(3) as usize] + step as i64;
                p = p.merged(&members, at, step as i64);
                for with_version in [false, true] {
                    let mut text = Vec::new();
                    p.root().write_patch_metadata(&mut text, &members, with_version);
                    let want = serde_json::to_vec(&p.root().patch_metadata(&members, with_version)).ok();
                    assert_eq!(Some(text), want, "case {case}, step {step}: {patch:?}");
                }
            }
        }
    }

    /// A patch of many members finds them through a sorted list, one of a few by scanning; both must
    /// give what the patch's members give one at a time (each a scan), in the patch's order.
    #[test]
    fn patch_metadata_of_many_members_equals_their_metadata_one_by_one() {
        let mut rng = Rng(0x853c_49e6_748f_ea9b);
        for case in 0..500 {
            let base = Packed::empty_section().merged(&json_tree::Members::of(&rng.wide_patch(20)), 1_000, 1);
            let members = 9 + rng.below(12);
            let patch = rng.wide_patch(members);
            let merged = base.merged(&json_tree::Members::of(&patch), 2_000, 2);
            let root = merged.root();
            let with_version = rng.below(2) == 1;
            let text = |p: &Map<String, Value>| {
                serde_json::to_value(root.patch_metadata(&json_tree::Members::of(p), with_version)).ok()
            };
            let mut want = text(&Map::new()).and_then(|v| v.as_object().cloned()).unwrap_or_default();
            for (k, v) in &patch {
                let one: Map<String, Value> = [(k.clone(), v.clone())].into_iter().collect();
                if let Some(found) = text(&one).and_then(|m| m.get(k).cloned()) {
                    want.insert(k.clone(), found);
                }
            }
            assert!(patch.len() > SCAN_UP_TO, "case {case}: {} members", patch.len());
            assert_eq!(text(&patch), Some(Value::Object(want)), "case {case}: {patch:?}");
        }
    }

    /// [`merged_in_place_equals_unpack_merge_pack`] for patches of more members than a scan serves.
    #[test]
    fn wide_patches_merged_in_place_equal_unpack_merge_pack() {
        merges_match_the_tree(0xda94_2042_e4dd_58b5, 1_000, |rng| {
            let members = rng.below(24) + 1;
            rng.wide_patch(members)
        });
    }

    #[test]
    fn merged_members_over_127_bytes_get_longer_prefixes() {
        let p = Packed::pack(&section(json!({"a": {"s": "x".repeat(300), "t": 1}, "b": 2}), 5, 0));
        let patch = json!({"a": {"t": 2, "u": "y".repeat(200)}, "c": {"d": "z".repeat(130)}});
        let patch = patch.as_object().cloned().unwrap_or_default();
        let mut tree = p.unpack();
        tree.merge(&patch, 9, 1);
        assert_eq!(p.merged(&json_tree::Members::of(&patch), 9, 1), Packed::pack(&tree));
    }

    #[test]
    fn merged_patches_of_more_than_64_members() {
        let old: Map<String, Value> = (0..100).step_by(3).map(|i| (format!("k{i}"), json!(i))).collect();
        let p = Packed::pack(&Node::section_from_map(&old, 5, 1));
        let patch: Map<String, Value> =
            (0..90).map(|i| (format!("k{i}"), if i % 7 == 0 { Value::Null } else { json!({"v": i}) })).collect();
        let mut tree = p.unpack();
        tree.merge(&patch, 9, 2);
        assert_eq!(p.merged(&json_tree::Members::of(&patch), 9, 2), Packed::pack(&tree));
    }

    #[test]
    fn long_members_get_longer_length_prefixes() {
        let big = "x".repeat(70_000);
        let n = section(json!({"a": {"s": big, "t": 1}, "b": 2}), 5, 0);
        let p = Packed::pack(&n);
        assert_eq!(p.unpack(), n);
        assert_eq!(Packed::from_bytes(p.as_bytes().to_vec()), Ok(p));
    }

    #[test]
    fn malformed_bytes_are_refused() {
        let p = Packed::pack(&section(json!({"a": {"b": "text"}, "c": true}), 5, 1));
        let bytes = p.as_bytes();
        for cut in 0..bytes.len() {
            // Any prefix is either refused or a different valid section; never a panic.
            let _ = Packed::from_bytes(bytes[..cut].to_vec());
        }
        assert!(Packed::from_bytes(Vec::new()).is_err());
        assert!(Packed::from_bytes([7].to_vec()).is_err(), "unknown kind");
        assert!(Packed::from_bytes([OBJECT, 1, 0xff].to_vec()).is_err(), "key past the end");
        assert!(Packed::from_bytes([STRING, 0xc3].to_vec()).is_err(), "not UTF-8");
        assert!(Packed::from_bytes([TRUE, 1].to_vec()).is_err(), "a boolean with a payload");
    }

    #[test]
    fn serializes_as_the_tree_in_json_and_as_bytes_in_postcard() {
        let p = Packed::pack(&section(json!({"a": [1, 2], "b": "x"}), 5, 1));
        let json = serde_json::to_string(&p).unwrap_or_default();
        assert_eq!(serde_json::to_string(&p.unpack()).unwrap_or_default(), json);
        assert_eq!(serde_json::from_str::<Packed>(&json).ok(), Some(p.clone()));
        let bin = postcard::to_allocvec(&p).unwrap_or_default();
        assert_eq!(postcard::from_bytes::<Packed>(&bin).ok(), Some(p.clone()));
        let old = postcard::to_allocvec(&p.unpack()).unwrap_or_default();
        assert_eq!(with_node_layout(|| postcard::from_bytes::<Packed>(&old).ok()), Some(p));
    }
}
