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
use serde_json::value::RawValue;

use super::error::TwinError;
use super::json_read::{not_objects, read_text, Key, Read, Skip, TreeNeeded, NUMBER_TOKEN};
use super::validate::{
    check_key, check_level, check_number_text, check_size, is_body_member, is_properties_member, parse_tree,
    service_body, text_size, BodyRule, Path, MAX_DESIRED_SIZE, MAX_STRING_BYTES, MAX_TAGS_SIZE,
};

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

/// Checks the text of a service twin PATCH or PUT body by the rules of
/// [`super::validate::service_body`], in the same order and with the same messages, without building
/// its tree. The front door only checks a twin write and hands its text on to Raft, where every
/// replica parses it for itself; the tree it built for the check was dropped at once.
///
/// The body is read once to split it: its two sections are kept as slices of the text, anything else
/// is skipped (its nesting still bounded as the tree's reading bounds it). Then each section is checked
/// as [`check_section_text`] checks one, so a key given twice in a section counts twice, as there. A
/// body that gives a section twice, or holds one of serde_json's private keys where its tree reads
/// them specially (see `json_read`), is checked as a tree instead.
pub fn check_service_text(text: &str) -> Result<(), TwinError> {
    let top = match read_object::<2>(text, ["tags", "properties"], is_body_member)? {
        Read::Text(top) => top.ok_or(BodyRule::NotAnObject)?,
        Read::Tree => return service_body(&parse_tree(text)?).map(|_| ()),
    };
    BodyRule::unknown_members(top.unknown.iter().map(|k| &**k))?;
    let [tags, properties] = top.found;
    let tags = section(tags, "tags")?;
    let mut desired = None;
    match properties.map(RawValue::get) {
        None | Some("null") => {}
        Some(props) => {
            let props = match read_object::<2>(props, ["desired", "reported"], is_properties_member)? {
                Read::Text(props) => props.ok_or(BodyRule::PropertiesNotAnObject)?,
                Read::Tree => return service_body(&parse_tree(text)?).map(|_| ()),
            };
            BodyRule::unknown_properties(props.unknown.iter().map(|k| &**k))?;
            let [found_desired, reported] = props.found;
            if let Some(r) = reported.map(RawValue::get).filter(|r| *r != "null") {
                let empty = r.strip_prefix('{').and_then(|r| r.strip_suffix('}')).is_some_and(|r| r.trim().is_empty());
                if !empty {
                    return Err(BodyRule::ReportedByService.into());
                }
            }
            desired = section(found_desired, "properties.desired")?;
        }
    }
    if let Some(t) = tags {
        check_section_text(t, "tags", MAX_TAGS_SIZE)?;
    }
    if let Some(d) = desired {
        check_section_text(d, "properties.desired", MAX_DESIRED_SIZE)?;
    }
    Ok(())
}

/// A section's text if it is an object to check; `None` if absent or `null`.
fn section<'a>(raw: Option<&'a RawValue>, path: &str) -> Result<Option<&'a str>, TwinError> {
    match raw.map(RawValue::get) {
        None | Some("null") => Ok(None),
        Some(t) if t.starts_with('{') => Ok(Some(t)),
        Some(_) => Err(BodyRule::SectionNotAnObject(path).into()),
    }
}

/// The members of one JSON object that a body's shape looks at.
struct Object<'de, const N: usize> {
    /// The text of each wanted member's value (the last one, if given twice, as a parsed object keeps).
    found: [Option<&'de RawValue>; N],
    /// Members neither wanted nor allowed, each once, in the order first given.
    unknown: Vec<Key<'de>>,
}

/// Reads `text` as one JSON object (`None` if it is another JSON value); any syntax error is the
/// tree's "malformed JSON body". [`Read::Tree`] if the text holds what only the tree reads right.
fn read_object<'de, const N: usize>(
    text: &'de str,
    wanted: [&'static str; N],
    allowed: fn(&str) -> bool,
) -> Result<Read<Option<Object<'de, N>>>, TwinError> {
    let tree = TreeNeeded::default();
    read_text(text, ObjectOf { wanted, allowed, tree: &tree }, &tree)
}

struct ObjectOf<'f, const N: usize> {
    wanted: [&'static str; N],
    allowed: fn(&str) -> bool,
    tree: &'f TreeNeeded,
}

impl<'de, const N: usize> DeserializeSeed<'de> for ObjectOf<'_, N> {
    type Value = Option<Object<'de, N>>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Self::Value, D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de, const N: usize> Visitor<'de> for ObjectOf<'_, N> {
    type Value = Option<Object<'de, N>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    not_objects!(None, s => s.tree);

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut object = Object { found: [None; N], unknown: Vec::new() };
        let mut first = true;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            self.tree.unless_plain(&key, std::mem::take(&mut first))?;
            if let Some(i) = self.wanted.iter().position(|w| *w == &*key) {
                // A section given twice: the tree keeps the last, and this reading checks only the
                // section it keeps, so the first could hide what the tree would refuse (serde_json
                // reads some objects specially, see `json_read`). Rare enough to leave to the tree.
                if object.found[i].replace(map.next_value::<&'de RawValue>()?).is_some() {
                    return Err(self.tree.stop());
                }
                continue;
            }
            if !(self.allowed)(&key) && !object.unknown.contains(&key) {
                object.unknown.push(key);
            }
            map.next_value_seed(Skip(self.tree))?;
        }
        Ok(Some(object))
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
        while let Some(key) = map.next_key::<Key<'de>>()? {
            if std::mem::take(&mut first) {
                if *key == *NUMBER_TOKEN {
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
    use crate::model::json_read::RAW_VALUE_TOKEN;
    use crate::model::validate::{check_sections, Section, MAX_DEPTH, MAX_TAGS_SIZE};
    use serde_json::{json, Value};

    /// The tree's verdict on `v` as a tags section.
    fn tree(v: &Value) -> Result<(), TwinError> {
        let Value::Object(m) = v else { panic!("not an object") };
        check_sections(Section::Object(&crate::model::json_tree::Members::of(m)), Section::Absent)
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

    /// The parsed body's verdict, with a malformed body's message cut to what both readings say.
    fn body_tree(text: &str) -> Result<(), String> {
        match super::super::validate::parse_tree(text) {
            Ok(v) => super::super::validate::service_body(&v).map(|_| ()).map_err(|e| e.to_string()),
            Err(_) => Err("malformed JSON body".into()),
        }
    }

    fn body_text(text: &str) -> Result<(), String> {
        check_service_text(text).map_err(|e| {
            let e = e.to_string();
            if e.contains("malformed JSON body") {
                "malformed JSON body".into()
            } else {
                e
            }
        })
    }

    #[test]
    fn service_bodies_get_the_tree_checks_verdict_and_message() {
        let deep = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        let long = "x".repeat(MAX_STRING_BYTES + 1);
        let bodies = [
            r#"{"properties":{"desired":{"a":1}}}"#.to_string(),
            r#"{"tags":{"t":"v"},"properties":{"desired":{"a":{"b":[1,2,{"c":null}]}}}}"#.into(),
            r#" { "tags" : null , "properties" : { "desired" : null } } "#.into(),
            r#"{"tags":{},"properties":{}}"#.into(),
            r#"{"properties":null}"#.into(),
            r#"{}"#.into(),
            r#"{"deviceId":"d","etag":"AAAA","version":3,"capabilities":{"iotEdge":false},"tags":{"a":1}}"#.into(),
            r#"{"properties":{"reported":{}}}"#.into(),
            r#"{"properties":{"reported":{ }},"tags":{"x":1}}"#.into(),
            r#"{"properties":{"reported":null}}"#.into(),
            r#"{"properties":{"reported":{"r":1}}}"#.into(),
            r#"{"properties":{"reported":[]}}"#.into(),
            r#"{"properties":{"desired":{"a":1},"other":1,"more":2,"other":3}}"#.into(),
            r#"{"nope":1,"tags":{"a":1},"alsonope":{},"nope":2}"#.into(),
            r#"{"tags":5}"#.into(),
            r#"{"tags":"s"}"#.into(),
            r#"{"tags":[]}"#.into(),
            r#"{"properties":{"desired":true}}"#.into(),
            r#"{"properties":[1]}"#.into(),
            r#"{"properties":"p"}"#.into(),
            r#"{"tags":{"bad.key":1}}"#.into(),
            r#"{"tags":{"a":1},"tags":{"$bad":1}}"#.into(),
            r#"{"tags":{"$bad":1},"tags":{"a":1}}"#.into(),
            r#"{"tags":{"bad key":1},"properties":{"desired":{"$x":1}}}"#.into(),
            format!(r#"{{"properties":{{"desired":{{"s":"{long}"}}}}}}"#),
            format!(r#"{{"tags":{{"big":{}}}}}"#, 4_503_599_627_370_496_i64),
            r#"{"tags":{"n":1e400}}"#.into(),
            format!(r#"{{"capabilities":{}}}"#, deep(200)),
            format!(r#"{{"tags":{{"a":{}}}}}"#, deep(12)),
            r#"{"t\u0061gs":{"a":1},"\u0070roperties":{"d\u0065sired":{"k":2}}}"#.into(),
            r#"{"$serde_json::private::Number":"5"}"#.into(),
            "[1, 2]".into(),
            "5".into(),
            "-1.5e3".into(),
            r#""text""#.into(),
            "null".into(),
            "true".into(),
            "{".into(),
            r#"{"tags":{"a":1}"#.into(),
            r#"{"tags":{"a":1}} {}"#.into(),
            r#"{"tags":{"a":01}}"#.into(),
            "".into(),
        ];
        for body in &bodies {
            assert_eq!(body_text(body), body_tree(body), "{}", &body[..body.len().min(100)]);
        }
    }

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[self.below(from.len())]
        }

        fn value(&mut self, depth: usize) -> String {
            match self.below(if depth > 3 { 6 } else { 9 }) {
                0 => "null".into(),
                1 => self.pick(&["true", "false"]).into(),
                2 => self.pick(&["1", "-2.5e3", "1e400", "4503599627370496", "0"]).into(),
                3 => self.pick(&[r#""s""#, r#""a\"b""#, r#""\u00e9""#, r#""""#]).into(),
                4 => format!("{}1{}", "[".repeat(125 + self.below(8)), "]".repeat(125 + self.below(8))),
                5 => "{}".into(),
                6 | 7 => {
                    let keys = ["a", "b", "$x", "a.b", "a b", NUMBER_TOKEN, RAW_VALUE_TOKEN];
                    let members: Vec<String> = (0..self.below(4))
                        .map(|_| {
                            let key = self.pick(&keys);
                            let value = match key {
                                k if k == NUMBER_TOKEN => self.pick(&[r#""5""#, r#""abc""#, "5"]).into(),
                                k if k == RAW_VALUE_TOKEN => {
                                    self.pick(&[r#""{\"tags\":{\"a\":1}}""#, r#""[[""#, "1", r#""7""#]).into()
                                }
                                _ => self.value(depth + 1),
                            };
                            format!("{key:?}:{value}")
                        })
                        .collect();
                    format!("{{{}}}", members.join(","))
                }
                _ => format!("[{},{}]", self.value(depth + 1), self.value(depth + 1)),
            }
        }

        fn properties(&mut self) -> String {
            if self.below(6) == 0 {
                return self.value(1);
            }
            let keys = ["desired", "reported", "other", NUMBER_TOKEN, RAW_VALUE_TOKEN];
            let members: Vec<String> = (0..self.below(4))
                .map(|_| {
                    let key = self.pick(&keys);
                    let value = match key {
                        "reported" => self.pick(&["{}", "{ }", "null", r#"{"r":1}"#, "[]"]).into(),
                        "desired" => self.value(1),
                        k if k == RAW_VALUE_TOKEN => r#""{\"desired\":{\"a\":1}}""#.into(),
                        _ => self.value(1),
                    };
                    format!("{key:?}:{value}")
                })
                .collect();
            format!("{{{}}}", members.join(","))
        }

        fn body(&mut self) -> String {
            if self.below(12) == 0 {
                return self.value(0);
            }
            let keys = ["tags", "properties", "deviceId", "etag", "nope", "x.y", NUMBER_TOKEN, RAW_VALUE_TOKEN];
            let members: Vec<String> = (0..self.below(6))
                .map(|_| {
                    let key = self.pick(&keys);
                    let value = match key {
                        "properties" => self.properties(),
                        k if k == RAW_VALUE_TOKEN => r#""{\"tags\":{\"a\":1}}""#.into(),
                        k if k == NUMBER_TOKEN => self.pick(&[r#""5""#, r#""x""#]).into(),
                        _ => self.value(0),
                    };
                    // Some keys spelled with an escape, as a client may.
                    let key = if key == "tags" && self.below(4) == 0 {
                        r#""t\u0061gs""#.to_string()
                    } else {
                        format!("{key:?}")
                    };
                    format!("{key}:{value}")
                })
                .collect();
            let mut text = format!("{{{}}}", members.join(","));
            match self.below(12) {
                0 => text.truncate(self.below(text.len() + 1)),
                1 => text.insert(
                    self.below(text.len() + 1),
                    self.pick(&["{", "}", "[", ",", ":", "\"", "x"]).chars().next().unwrap_or('x'),
                ),
                _ => {}
            }
            text
        }
    }

    /// Generated bodies (sections, ignored and unknown members, members given twice, deep nesting,
    /// serde_json's private keys, broken text): the text check never accepts what the tree refuses.
    #[test]
    fn generated_bodies_are_never_accepted_when_the_tree_refuses_them() {
        let mut rng = Rng(0x5eed_2026_1204);
        let (mut accepted, mut tree_read) = (0, 0);
        for _ in 0..20_000 {
            let text = rng.body();
            let tree = body_tree(&text);
            if check_service_text(&text).is_ok() {
                assert!(tree.is_ok(), "the text check accepted {text}");
                accepted += 1;
            }
            tree_read +=
                usize::from(matches!(read_object::<2>(&text, ["tags", "properties"], is_body_member), Ok(Read::Tree)));
        }
        // The draw reaches both verdicts and the tree's reading, or the test would prove little.
        assert!(accepted > 2_000 && accepted < 18_000, "{accepted} accepted");
        assert!(tree_read > 200, "{tree_read} read as trees");
    }

    /// The same bodies read by apply's borrowing tree and by serde_json's `Value`: the same outcome,
    /// the same tree, the same text rendered back.
    #[test]
    fn generated_bodies_read_alike_as_json_and_value() {
        let mut rng = Rng(0x5eed_2026_1206);
        let mut read = 0;
        for _ in 0..20_000 {
            let text = rng.body();
            match (serde_json::from_str::<Value>(&text), crate::model::json_tree::parse(&text)) {
                (Ok(v), Ok(j)) => {
                    assert_eq!(j.to_value(), v, "{text}");
                    assert_eq!(serde_json::to_string(&j).ok(), serde_json::to_string(&v).ok(), "{text}");
                    let mut written = Vec::new();
                    j.write_text(&mut written);
                    assert_eq!(serde_json::to_vec(&v).ok(), Some(written), "{text}: written");
                    read += 1;
                }
                (Err(_), Err(_)) => {}
                // The one reading that differs on purpose (see `json_tree`).
                (_, Err(e)) if e.to_string().contains(crate::model::json_tree::RESERVED_KEY) => {}
                (v, j) => panic!("{text}: Value read {v:?}, the borrowing tree {j:?}"),
            }
        }
        assert!(read > 5_000, "{read} read");
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
