//! The twin document tree: tags, desired and reported sections kept as nodes that each hold their value
//! and the `$lastUpdated` (and, for desired, `$lastUpdatedVersion`) that IoT Hub reports in `$metadata`.
//! Rendered to JSON only on read: a fleet of millions of twins lives in memory, and a node (48 bytes plus
//! its text) is far smaller than a `serde_json::Value` with a parallel metadata document.
//!
//! Arrays are leaves, as in IoT Hub: their elements carry no metadata of their own.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use super::time::{format_ms, NEVER};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub value: NodeValue,
    /// Unix ms of the last change to this node or, for objects, to anything below it (so a removed key
    /// stays visible as a newer `$lastUpdated` on its parent). [`NEVER`] on a fresh section.
    pub updated: i64,
    /// Desired `$version` of that change (`$lastUpdatedVersion`); unused outside desired.
    pub updated_version: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum NodeValue {
    /// Members in insertion order (what clients sent first renders first).
    Object(#[serde(deserialize_with = "tight_members")] Vec<(Box<str>, Node)>),
    Bool(bool),
    /// The number's exact text (serde_json's `arbitrary_precision`), so nothing is rounded.
    Number(Box<str>),
    String(Box<str>),
    Array(#[serde(with = "array_text")] Box<Value>),
}

/// An array value as itself in JSON and as its JSON text in binary formats, which cannot read a
/// `Value` back (it needs a self-describing format).
mod array_text {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    pub fn serialize<S: Serializer>(v: &Value, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            v.serialize(s)
        } else {
            s.serialize_str(&v.to_string())
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Box<Value>, D::Error> {
        if d.is_human_readable() {
            Box::<Value>::deserialize(d)
        } else {
            let text = String::deserialize(d)?;
            serde_json::from_str(&text).map_err(D::Error::custom)
        }
    }
}

impl Node {
    /// A fresh section: an empty object never updated.
    pub fn empty_section() -> Node {
        Node { value: NodeValue::Object(Vec::new()), updated: NEVER, updated_version: 0 }
    }

    /// Builds a node from a JSON value, every node stamped `at`/`version`. `None` for `null`: a null
    /// member means "absent" in every body IoT Hub accepts.
    pub fn from_value(v: &Value, at: i64, version: i64) -> Option<Node> {
        let value = match v {
            Value::Null => return None,
            Value::Bool(b) => NodeValue::Bool(*b),
            Value::Number(n) => NodeValue::Number(n.to_string().into_boxed_str()),
            Value::String(s) => NodeValue::String(s.as_str().into()),
            Value::Array(_) => NodeValue::Array(Box::new(v.clone())),
            Value::Object(m) => NodeValue::Object(members_of(m, at, version)),
        };
        Some(Node { value, updated: at, updated_version: version })
    }

    /// A section built from an object (a replace): the section itself is stamped too.
    pub fn section_from_map(m: &Map<String, Value>, at: i64, version: i64) -> Node {
        Node { value: NodeValue::Object(members_of(m, at, version)), updated: at, updated_version: version }
    }

    pub fn members(&self) -> &[(Box<str>, Node)] {
        match &self.value {
            NodeValue::Object(m) => m,
            _ => &[],
        }
    }

    fn child(&self, key: &str) -> Option<&Node> {
        self.members().iter().find(|(k, _)| &**k == key).map(|(_, n)| n)
    }

    /// Member `key` as the query language finds it: the exact name, else the first name equal to it
    /// ignoring ASCII case.
    pub fn find_member(&self, key: &str) -> Option<&Node> {
        self.child(key).or_else(|| self.members().iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, n)| n))
    }

    /// Recursive merge of an object patch: `null` removes a key, objects merge into objects, anything
    /// else replaces. Every object the patch names is stamped, so removals show in `$lastUpdated`.
    pub fn merge(&mut self, patch: &Map<String, Value>, at: i64, version: i64) {
        self.updated = at;
        self.updated_version = version;
        if !matches!(self.value, NodeValue::Object(_)) {
            self.value = NodeValue::Object(Vec::new());
        }
        let NodeValue::Object(members) = &mut self.value else { return };
        for (key, pv) in patch {
            let pos = members.iter().position(|(k, _)| **k == **key);
            match (pv, pos) {
                (Value::Null, Some(i)) => {
                    members.remove(i);
                }
                (Value::Null, None) => {}
                (Value::Object(pm), Some(i)) if matches!(members[i].1.value, NodeValue::Object(_)) => {
                    members[i].1.merge(pm, at, version);
                }
                (v, Some(i)) => {
                    if let Some(n) = Node::from_value(v, at, version) {
                        members[i].1 = n;
                    }
                }
                (v, None) => {
                    if let Some(n) = Node::from_value(v, at, version) {
                        members.push((key.as_str().into(), n));
                    }
                }
            }
        }
        members.shrink_to_fit();
    }

    /// The plain JSON value, without metadata.
    pub fn to_value(&self) -> Value {
        match &self.value {
            NodeValue::Object(_) => Value::Object(self.to_map()),
            NodeValue::Bool(b) => Value::Bool(*b),
            NodeValue::Number(n) => n.parse::<Number>().map(Value::Number).unwrap_or(Value::Null),
            NodeValue::String(s) => Value::String(s.to_string()),
            NodeValue::Array(a) => (**a).clone(),
        }
    }

    pub fn to_map(&self) -> Map<String, Value> {
        self.members().iter().map(|(k, n)| (k.to_string(), n.to_value())).collect()
    }

    /// `$metadata` of this node and everything below it.
    pub fn metadata(&self, with_version: bool) -> Value {
        let mut m = self.own_metadata(with_version);
        for (k, n) in self.members() {
            m.insert(k.to_string(), n.metadata(with_version));
        }
        Value::Object(m)
    }

    /// `$metadata` restricted to what a patch touched (twin change events carry only that).
    pub fn patch_metadata(&self, patch: &Map<String, Value>, with_version: bool) -> Value {
        let mut m = self.own_metadata(with_version);
        for (k, pv) in patch {
            if let Some(n) = self.child(k) {
                let meta = match pv {
                    Value::Object(pm) if matches!(n.value, NodeValue::Object(_)) => n.patch_metadata(pm, with_version),
                    _ => n.metadata(with_version),
                };
                m.insert(k.clone(), meta);
            }
        }
        Value::Object(m)
    }

    fn own_metadata(&self, with_version: bool) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("$lastUpdated".into(), Value::String(format_ms(self.updated)));
        if with_version && self.updated != NEVER {
            m.insert("$lastUpdatedVersion".into(), Value::from(self.updated_version));
        }
        m
    }

    /// A section as IoT Hub renders it: members, then `$metadata`, then `$version`.
    pub fn render_section(&self, section_version: i64, with_version: bool) -> Value {
        let mut m = self.to_map();
        m.insert("$metadata".into(), self.metadata(with_version));
        m.insert("$version".into(), Value::from(section_version));
        Value::Object(m)
    }

    /// Size as [`super::validate::doc_size`] computes it, without rendering.
    pub fn size(&self) -> usize {
        match &self.value {
            NodeValue::Object(members) => {
                2 + members.len().saturating_sub(1)
                    + members.iter().map(|(k, n)| super::validate::text_size(k) + 1 + n.size()).sum::<usize>()
            }
            NodeValue::Bool(true) => 4,
            NodeValue::Bool(false) => 5,
            NodeValue::Number(n) => n.chars().count(),
            NodeValue::String(s) => super::validate::text_size(s),
            NodeValue::Array(a) => super::validate::doc_size(a),
        }
    }
}

/// Members read from a snapshot, without the spare room a vector grown element by element keeps.
fn tight_members<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<(Box<str>, Node)>, D::Error> {
    let mut members = Vec::<(Box<str>, Node)>::deserialize(d)?;
    members.shrink_to_fit();
    Ok(members)
}

/// The members of an object, in a vector of exactly their number: a twin lives in memory for as long
/// as the fleet does, and a vector grown by pushing keeps room for four members (56 bytes each) where
/// most objects have one or two.
fn members_of(m: &Map<String, Value>, at: i64, version: i64) -> Vec<(Box<str>, Node)> {
    let mut members: Vec<_> =
        m.iter().filter_map(|(k, v)| Node::from_value(v, at, version).map(|n| (k.as_str().into(), n))).collect();
    members.shrink_to_fit();
    members
}

/// What a device must receive when desired is replaced: every member of `new` (unchanged ones too, as
/// IoT Hub sends them), `null` for members that disappeared, recursing where both sides are objects.
pub fn replace_diff(old: &Map<String, Value>, new: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, nv) in new {
        if nv.is_null() {
            continue;
        }
        let v = match (old.get(k), nv) {
            (Some(Value::Object(om)), Value::Object(nm)) => Value::Object(replace_diff(om, nm)),
            _ => nv.clone(),
        };
        out.insert(k.clone(), v);
    }
    for k in old.keys() {
        if new.get(k).is_none_or(Value::is_null) {
            out.insert(k.clone(), Value::Null);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn merge_adds_replaces_and_removes_recursively() {
        let mut s = Node::empty_section();
        s.merge(&obj(json!({"a": {"b": 1, "c": 2}, "d": "x"})), 1000, 2);
        s.merge(&obj(json!({"a": {"b": null, "e": true}, "d": {"f": 1.5}})), 2000, 3);
        assert_eq!(s.to_value(), json!({"a": {"c": 2, "e": true}, "d": {"f": 1.5}}));
    }

    #[test]
    fn removal_stamps_the_parent_and_keeps_siblings() {
        let mut s = Node::empty_section();
        s.merge(&obj(json!({"a": {"b": 1, "c": 2}})), 1000, 2);
        s.merge(&obj(json!({"a": {"b": null}})), 2000, 3);
        let meta = s.metadata(true);
        assert_eq!(meta["a"]["$lastUpdated"], json!("1970-01-01T00:00:02.000Z"));
        assert_eq!(meta["a"]["$lastUpdatedVersion"], json!(3));
        assert_eq!(meta["a"]["c"]["$lastUpdated"], json!("1970-01-01T00:00:01.000Z"));
        assert_eq!(meta["a"]["c"]["$lastUpdatedVersion"], json!(2));
        assert!(meta["a"].get("b").is_none());
        assert_eq!(meta["$lastUpdated"], json!("1970-01-01T00:00:02.000Z"));
    }

    #[test]
    fn fresh_section_renders_like_iot_hub() {
        let s = Node::empty_section();
        assert_eq!(
            serde_json::to_string(&s.render_section(1, true)).unwrap_or_default(),
            r#"{"$metadata":{"$lastUpdated":"0001-01-01T00:00:00Z"},"$version":1}"#
        );
    }

    #[test]
    fn numbers_keep_their_exact_text() {
        let v: Value = serde_json::from_str(r#"{"n": 4503599627370495, "f": 0.1000000000000000055511151231257827}"#)
            .unwrap_or_default();
        let s = Node::section_from_map(&obj(v.clone()), 1, 1);
        assert_eq!(s.to_value(), v);
    }

    #[test]
    fn node_size_equals_value_size() {
        let v = json!({"a": {"b": [1, "x", null], "c": false}, "é": "ü\u{1}", "n": -12.5});
        let s = Node::section_from_map(&obj(v.clone()), 1, 1);
        assert_eq!(s.size(), super::super::validate::doc_size(&v));
    }

    #[test]
    fn replace_diff_nulls_removed_keys() {
        let d = replace_diff(
            &obj(json!({"a": 1, "b": 2, "o": {"x": 1, "y": 2}})),
            &obj(json!({"a": 1, "c": 100, "o": {"x": 1}})),
        );
        assert_eq!(Value::Object(d), json!({"a": 1, "c": 100, "o": {"x": 1, "y": null}, "b": null}));
    }
}
