//! The twin document tree: tags, desired and reported sections as nodes that each hold their value
//! and the `$lastUpdated` (and, for desired, `$lastUpdatedVersion`) that IoT Hub reports in `$metadata`.
//! This is the form a section takes while a replace builds it from a body; at rest, and for every
//! read, a shard holds it packed ([`super::packed`]), and a patch is merged into the packed form.
//!
//! Arrays are leaves, as in IoT Hub: their elements carry no metadata of their own.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::time::NEVER;

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
    Object(Vec<(Box<str>, Node)>),
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

    /// Recursive merge of an object patch: `null` removes a key, objects merge into objects, anything
    /// else replaces. Every object the patch names is stamped, so removals show in `$lastUpdated`.
    /// Writes use [`super::packed::Packed::merged`], which gives the packed bytes of this merge without
    /// building the tree; this is its reference (the tests compare the two).
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
    }
}

/// The members of an object (a tree lives only while a write changes it: no need to trim vectors).
fn members_of(m: &Map<String, Value>, at: i64, version: i64) -> Vec<(Box<str>, Node)> {
    m.iter().filter_map(|(k, v)| Node::from_value(v, at, version).map(|n| (k.as_str().into(), n))).collect()
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
    use super::super::packed::Packed;
    use super::*;
    use serde_json::json;

    fn packed(n: &Node) -> Packed {
        Packed::pack(n)
    }

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
        assert_eq!(packed(&s).root().to_value(), json!({"a": {"c": 2, "e": true}, "d": {"f": 1.5}}));
    }

    #[test]
    fn removal_stamps_the_parent_and_keeps_siblings() {
        let mut s = Node::empty_section();
        s.merge(&obj(json!({"a": {"b": 1, "c": 2}})), 1000, 2);
        s.merge(&obj(json!({"a": {"b": null}})), 2000, 3);
        let meta = packed(&s).root().metadata(true);
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
            serde_json::to_string(&packed(&s).root().render_section(1, true)).unwrap_or_default(),
            r#"{"$metadata":{"$lastUpdated":"0001-01-01T00:00:00Z"},"$version":1}"#
        );
    }

    #[test]
    fn numbers_keep_their_exact_text() {
        let v: Value = serde_json::from_str(r#"{"n": 4503599627370495, "f": 0.1000000000000000055511151231257827}"#)
            .unwrap_or_default();
        let s = Node::section_from_map(&obj(v.clone()), 1, 1);
        assert_eq!(packed(&s).root().to_value(), v);
    }

    #[test]
    fn node_size_equals_value_size() {
        let v = json!({"a": {"b": [1, "x", null], "c": false}, "é": "ü\u{1}", "n": -12.5});
        let s = Node::section_from_map(&obj(v.clone()), 1, 1);
        assert_eq!(packed(&s).root().size(), super::super::validate::doc_size(&crate::model::json_tree::Json::of(&v)));
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
