//! The checks of [`super::validate`] for a twin section given as JSON text, made while the text is
//! read, without building its tree.
//!
//! A bulk registry call carries up to a hundred entries, each with its sections. The front door only
//! checks them and passes their text on to Raft, so a tree built for the check would be built and
//! dropped again at once: that was a tenth of a bulk load's CPU.
//!
//! The rules, messages and sizes are those of a parsed section, with one difference: a key given twice
//! in one object is checked, and counted in the size, each time (a parsed object keeps the last one).
//! So this check is never more lenient than the tree's, and apply checks the merged result again.

use std::borrow::Cow;
use std::cell::RefCell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::error::TwinError;
use super::validate::{check_key, check_level, check_number_text, check_size, text_size, Path, MAX_STRING_BYTES};

/// The key under which serde_json (with `arbitrary_precision`) hands a number to a visitor, as a
/// one-member map holding the number's text.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// Checks `text`, a section's JSON object, by the rules of a section at `path` whose size may not
/// exceed `limit`, counted as a patch's (members whose value is `null` are removals, not counted).
pub fn check_section_text(text: &str, path: &str, limit: usize) -> Result<(), TwinError> {
    let failure = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    let seed = Check { path: Path::Root(path), level: 0, removals_free: true, failure: &failure };
    let outcome = seed.deserialize(&mut de).and_then(|m| de.end().map(|()| m));
    if let Some(e) = failure.into_inner() {
        return Err(e);
    }
    match outcome {
        Ok(Measure { object: true, size, .. }) => check_size(path, size, limit),
        Ok(_) => Err(TwinError::InvalidArgument(format!("{path} must be a JSON object"))),
        Err(e) => Err(TwinError::InvalidArgument(format!("malformed twin section {path}: {e}"))),
    }
}

/// What a value counts for in its parent.
#[derive(Clone, Copy)]
struct Measure {
    size: usize,
    null: bool,
    object: bool,
}

impl Measure {
    fn leaf(size: usize) -> Measure {
        Measure { size, null: false, object: false }
    }
}

/// Checks one value at `path`; `level` is the level a container there would have.
struct Check<'p, 'f> {
    path: Path<'p>,
    level: usize,
    /// The value is an object member counted as a patch counts it (`null` members left out), as in
    /// [`super::validate::map_size`]; inside arrays, every member counts, as in `doc_size`.
    removals_free: bool,
    failure: &'f RefCell<Option<TwinError>>,
}

impl Check<'_, '_> {
    /// Records a rule broken and stops the reading.
    fn fail<E: serde::de::Error>(&self, e: TwinError) -> E {
        *self.failure.borrow_mut() = Some(e);
        E::custom("twin section check failed")
    }
}

impl<'de> DeserializeSeed<'de> for Check<'_, '_> {
    type Value = Measure;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Measure, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Check<'_, '_> {
    type Value = Measure;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Measure, E> {
        Ok(Measure { size: 4, null: true, object: false })
    }

    fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Measure, E> {
        Ok(Measure::leaf(if b { 4 } else { 5 }))
    }

    // Without `arbitrary_precision` numbers would arrive here; with it they come as a map (below).
    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Measure, E> {
        self.number(&n.to_string())
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Measure, E> {
        self.number(&n.to_string())
    }

    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Measure, E> {
        self.number(&n.to_string())
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Measure, E> {
        if s.len() > MAX_STRING_BYTES {
            let msg =
                format!("string at {} is {} bytes, over the limit of {MAX_STRING_BYTES} bytes", self.path, s.len());
            return Err(self.fail(TwinError::InvalidArgument(msg)));
        }
        Ok(Measure::leaf(text_size(s)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Measure, A::Error> {
        check_level(self.path, self.level).map_err(|e| self.fail(e))?;
        let (mut items, mut size) = (0usize, 0usize);
        loop {
            let item = Check {
                path: Path::Index(&self.path, items),
                level: self.level + 1,
                removals_free: false,
                failure: self.failure,
            };
            let Some(m) = seq.next_element_seed(item)? else { break };
            items += 1;
            size += m.size;
        }
        Ok(Measure::leaf(2 + items.saturating_sub(1) + size))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Measure, A::Error> {
        let mut first = true;
        let (mut kept, mut size) = (0usize, 0usize);
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if std::mem::take(&mut first) {
                if key == NUMBER_TOKEN {
                    let text = map.next_value::<Cow<'de, str>>()?;
                    return self.number(&text);
                }
                // An object: its depth is checked before its members, as the tree's check does.
                check_level(self.path, self.level).map_err(|e| self.fail(e))?;
            }
            check_key(self.path, &key).map_err(|e| self.fail(e))?;
            let member = Check {
                path: Path::Member(&self.path, &key),
                level: self.level + 1,
                removals_free: self.removals_free,
                failure: self.failure,
            };
            let m = map.next_value_seed(member)?;
            if !(self.removals_free && m.null) {
                kept += 1;
                size += text_size(&key) + 1 + m.size;
            }
        }
        if first {
            check_level(self.path, self.level).map_err(|e| self.fail(e))?;
        }
        Ok(Measure { size: 2 + kept.saturating_sub(1) + size, null: false, object: true })
    }
}

impl Check<'_, '_> {
    fn number<E: serde::de::Error>(&self, text: &str) -> Result<Measure, E> {
        check_number_text(text, self.path).map_err(|e| self.fail(e))?;
        Ok(Measure::leaf(text.chars().count()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::validate::{check_sections, Section, MAX_DEPTH, MAX_TAGS_SIZE};
    use serde_json::{json, Value};

    /// The tree's verdict on `v` as a tags section.
    fn tree(v: &Value) -> Result<(), TwinError> {
        let Value::Object(m) = v else { panic!("not an object") };
        check_sections(Section::Object(m), Section::Absent)
    }

    fn text(v: &Value) -> Result<(), TwinError> {
        check_section_text(&v.to_string(), "tags", MAX_TAGS_SIZE)
    }

    fn nested(depth: usize) -> Value {
        (0..depth).fold(json!(1), |inner, i| json!({ format!("l{i}"): inner }))
    }

    #[test]
    fn agrees_with_the_tree_check() {
        let long = "x".repeat(MAX_STRING_BYTES + 1);
        let cases = [
            json!({}),
            json!({"a": 1, "b": "two", "c": [1, null, {"d": null}], "e": null, "f": {"g": null, "h": true}}),
            json!({"big": 4_503_599_627_370_495_i64, "neg": -4_503_599_627_370_496_i64, "f": 1.5e3}),
            json!({"over": 4_503_599_627_370_496_i64}),
            json!({"bad.key": 1}),
            json!({"$bad": 1}),
            json!({"": 1}),
            json!({"a": {"b c": 1}}),
            json!({"s": long}),
            json!({"arr": [[[[[[[[[[[1]]]]]]]]]]]}),
            json!({"k": "\u{7f}é\u{1}ü"}),
            nested(MAX_DEPTH),
            nested(MAX_DEPTH + 1),
            nested(MAX_DEPTH + 2),
            json!({"wide": (0..900).map(|i| (format!("k{i}"), json!(i))).collect::<serde_json::Map<_, _>>()}),
            json!({"nulls": (0..2000).map(|i| (format!("k{i}"), Value::Null)).collect::<serde_json::Map<_, _>>()}),
        ];
        for v in &cases {
            assert_eq!(text(v), tree(v), "{}", &v.to_string()[..v.to_string().len().min(120)]);
        }
        let huge = serde_json::from_str::<Value>("{\"n\": 1e400}").expect("parse");
        assert_eq!(text(&huge), tree(&huge));
    }

    #[test]
    fn refuses_what_is_not_one_object() {
        for bad in ["[1]", "1", "\"s\"", "null", "{\"a\":1} {}", "{\"a\":", ""] {
            assert!(check_section_text(bad, "tags", MAX_TAGS_SIZE).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn a_key_given_twice_counts_twice() {
        let half = "y".repeat(MAX_STRING_BYTES - 100);
        let one = format!("{{\"a\":\"{half}\",\"b\":\"{half}\"}}");
        assert!(check_section_text(&one, "tags", MAX_TAGS_SIZE).is_ok());
        let twice = format!("{{\"a\":\"{half}\",\"a\":\"{half}\",\"b\":\"{half}\"}}");
        assert!(check_section_text(&twice, "tags", MAX_TAGS_SIZE).is_err());
    }
}
