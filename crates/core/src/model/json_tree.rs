//! A JSON document read from a command's text into a tree that borrows from the text: what apply
//! reads a twin patch into on every replica, for every twin write.
//!
//! serde_json's `Value` copies every key and string into its own heap block and gives every object a
//! hash table besides its entries, so a small desired patch (`{"properties":{"desired":{"fb":{…}}}}`)
//! cost about seventeen allocations per replica, the largest single share of an update's allocations.
//! Here keys and strings stay slices of the text (unless they hold escapes), an object is one vector,
//! an integer is held as a number; the same patch costs four.
//!
//! It must read every text exactly as `Value` reads it (apply's outcome is the replicated state, and
//! the front door checks bodies by `Value`'s reading): [`Json`]'s visitor mirrors `Value`'s, including
//! serde_json's private number key (a number's text under [`NUMBER_TOKEN`], see `json_read`), and an
//! object's repeated key keeps its first place and its last value, as `Value`'s ordered map does. It
//! renders (through serde) the text `Value` renders, and converts to and from `Value` for the paths
//! that hold one.
//!
//! With one exception, which makes it the reader for JSON from outside ([`parse_untrusted`]): an
//! object keyed by serde_json's private raw-value key ([`RAW_VALUE_TOKEN`]) is refused. `Value` reads
//! the string under that key as JSON text again, with a fresh parser and a fresh nesting limit, on the
//! same stack; a raw value inside a raw value inside… nests without bound, and a 256 KiB body nested
//! that way overflows a thread's stack and aborts the process.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Map, Number, Value};

use super::json_read::{Key, NUMBER_TOKEN, RAW_VALUE_TOKEN};
use super::json_write::{write_json_str, write_key};

/// A JSON value, borrowing its keys and strings from the text it was read from where it can.
#[derive(Clone, Debug, PartialEq)]
pub enum Json<'a> {
    Null,
    Bool(bool),
    /// An integer serde_json reads as one (`Value` holds it as a number of the same text).
    U64(u64),
    I64(i64),
    /// Any other number, as `Value` holds it (its text).
    Number(Number),
    String(Cow<'a, str>),
    Array(Vec<Json<'a>>),
    Object(Members<'a>),
}

/// An object's members in their order, each key once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Members<'a>(Vec<(Cow<'a, str>, Json<'a>)>);

/// Reads `text` as `serde_json::from_str::<Value>` would, into a borrowing tree; an object keyed by
/// serde_json's private raw-value key is an error (see the module doc).
pub fn parse(text: &str) -> Result<Json<'_>, serde_json::Error> {
    serde_json::from_str(text)
}

/// JSON from outside (a request body, a device's message) as a `Value`: what
/// `serde_json::from_str::<Value>` reads, except that serde_json's private raw-value key is refused
/// rather than followed into a nesting without bound (see the module doc). Every `Value` read from
/// untrusted text is read here, or from text that was.
pub fn parse_untrusted(text: &str) -> Result<Value, serde_json::Error> {
    parse(text).map(|j| j.to_value())
}

/// The error [`parse`] gives for serde_json's private raw-value key.
pub const RESERVED_KEY: &str = "the key \"$serde_json::private::RawValue\" is reserved by the JSON reader";

impl<'a> Json<'a> {
    pub fn is_null(&self) -> bool {
        matches!(self, Json::Null)
    }

    pub fn as_object(&self) -> Option<&Members<'a>> {
        match self {
            Json::Object(m) => Some(m),
            _ => None,
        }
    }

    /// A view of `v` (its keys and strings borrowed).
    pub fn of(v: &'a Value) -> Json<'a> {
        match v {
            Value::Null => Json::Null,
            Value::Bool(b) => Json::Bool(*b),
            Value::Number(n) => Json::Number(n.clone()),
            Value::String(s) => Json::String(Cow::Borrowed(s)),
            Value::Array(items) => Json::Array(items.iter().map(Json::of).collect()),
            Value::Object(m) => Json::Object(Members::of(m)),
        }
    }

    pub fn to_value(&self) -> Value {
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::U64(u) => Value::Number((*u).into()),
            Json::I64(i) => Value::Number((*i).into()),
            Json::Number(n) => Value::Number(n.clone()),
            Json::String(s) => Value::String(s.to_string()),
            Json::Array(items) => Value::Array(items.iter().map(Json::to_value).collect()),
            Json::Object(m) => Value::Object(m.to_map()),
        }
    }

    /// The same tree, owning all of it.
    pub fn into_owned(self) -> Json<'static> {
        match self {
            Json::Null => Json::Null,
            Json::Bool(b) => Json::Bool(b),
            Json::U64(u) => Json::U64(u),
            Json::I64(i) => Json::I64(i),
            Json::Number(n) => Json::Number(n),
            Json::String(s) => Json::String(Cow::Owned(s.into_owned())),
            Json::Array(items) => Json::Array(items.into_iter().map(Json::into_owned).collect()),
            Json::Object(m) => Json::Object(m.into_owned()),
        }
    }

    /// A number's JSON text, as `Value` holds it; `None` for anything else.
    pub fn number_text(&self) -> Option<NumberText<'_>> {
        match self {
            Json::U64(u) => Some(NumberText::Integer(IntegerText::of(false, *u))),
            Json::I64(i) => Some(NumberText::Integer(IntegerText::of(*i < 0, i.unsigned_abs()))),
            Json::Number(n) => Some(NumberText::Text(n.as_str())),
            _ => None,
        }
    }

    /// The length of [`Json::number_text`], counted without writing it for an integer (each write
    /// measures every number it carries); `None` for anything but a number.
    pub fn number_len(&self) -> Option<usize> {
        let digits = |m: u64| m.checked_ilog10().map_or(1, |l| l as usize + 1);
        match self {
            Json::U64(u) => Some(digits(*u)),
            Json::I64(i) => Some(usize::from(*i < 0) + digits(i.unsigned_abs())),
            Json::Number(n) => Some(n.as_str().chars().count()),
            _ => None,
        }
    }

    /// The value as JSON text: the bytes serde_json writes for it (its `Serialize`), without a
    /// serializer (a change event carries each patch it applied, on the leader of every write).
    pub fn write_text(&self, out: &mut Vec<u8>) {
        match self {
            Json::Null => out.extend_from_slice(b"null"),
            Json::Bool(true) => out.extend_from_slice(b"true"),
            Json::Bool(false) => out.extend_from_slice(b"false"),
            Json::U64(_) | Json::I64(_) | Json::Number(_) => {
                if let Some(text) = self.number_text() {
                    out.extend_from_slice(text.as_bytes());
                }
            }
            Json::String(s) => write_json_str(out, s.as_bytes()),
            Json::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write_text(out);
                }
                out.push(b']');
            }
            Json::Object(m) => {
                out.push(b'{');
                m.write_member_list(out, &mut true);
                out.push(b'}');
            }
        }
    }

    /// An integer the reading holds as one (its text has no fraction or exponent).
    pub fn integer(&self) -> Option<i128> {
        match self {
            Json::U64(u) => Some(i128::from(*u)),
            Json::I64(i) => Some(i128::from(*i)),
            _ => None,
        }
    }
}

impl<'a> Members<'a> {
    /// The members as `"name":value` each, comma-separated, inside braces the caller writes; `first`
    /// says whether one was written before them.
    pub fn write_member_list(&self, out: &mut Vec<u8>, first: &mut bool) {
        for (k, v) in self.iter() {
            write_key(out, first, k.as_bytes());
            v.write_text(out);
        }
    }

    /// Members from entries in order, a key given more than once kept where it first appears, with
    /// the value it was given last (how `Value`'s ordered map inserts).
    pub fn from_entries(mut entries: Vec<(Cow<'a, str>, Json<'a>)>) -> Members<'a> {
        // Nearly every object is small: compare every pair without allocating.
        if entries.len() <= 16 {
            let mut i = 1;
            while i < entries.len() {
                match entries[..i].iter().position(|(k, _)| *k == entries[i].0) {
                    Some(first) => {
                        let (_, v) = entries.remove(i);
                        entries[first].1 = v;
                    }
                    None => i += 1,
                }
            }
            return Members(entries);
        }
        // Larger ones through their order by key: O(n log n) even when a stranger repeats keys.
        let mut by_key: Vec<usize> = (0..entries.len()).collect();
        by_key.sort_by(|a, b| entries[*a].0.cmp(&entries[*b].0).then(a.cmp(b)));
        let mut keep = vec![true; entries.len()];
        let mut moves = Vec::new();
        for group in by_key.chunk_by(|a, b| entries[*a].0 == entries[*b].0) {
            if let [first, .., last] = *group {
                moves.push((first, last));
                for &i in &group[1..] {
                    keep[i] = false;
                }
            }
        }
        for (first, last) in moves {
            let v = std::mem::replace(&mut entries[last].1, Json::Null);
            entries[first].1 = v;
        }
        let mut i = 0;
        entries.retain(|_| {
            i += 1;
            keep[i - 1]
        });
        Members(entries)
    }

    /// A view of `m` (its keys and strings borrowed).
    pub fn of(m: &'a Map<String, Value>) -> Members<'a> {
        Members(m.iter().map(|(k, v)| (Cow::Borrowed(k.as_str()), Json::of(v))).collect())
    }

    pub fn to_map(&self) -> Map<String, Value> {
        self.0.iter().map(|(k, v)| (k.to_string(), v.to_value())).collect()
    }

    pub fn into_owned(self) -> Members<'static> {
        Members(self.0.into_iter().map(|(k, v)| (Cow::Owned(k.into_owned()), v.into_owned())).collect())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Json<'a>)> + Clone {
        self.0.iter().map(|(k, v)| (&**k, v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| &**k)
    }

    pub fn get(&self, key: &str) -> Option<&Json<'a>> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The entries, to build another object from (see [`Members::from_entries`]).
    pub fn into_entries(self) -> Vec<(Cow<'a, str>, Json<'a>)> {
        self.0
    }
}

/// A number's text, borrowed or formatted on the stack.
pub enum NumberText<'a> {
    Text(&'a str),
    Integer(IntegerText),
}

impl std::ops::Deref for NumberText<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            NumberText::Text(t) => t,
            NumberText::Integer(i) => i.as_str(),
        }
    }
}

/// An integer's decimal text (a sign and at most 20 digits), written on the stack: numbers are
/// measured, checked and packed on every replica for every write.
pub struct IntegerText {
    buf: [u8; 21],
    start: usize,
}

impl IntegerText {
    fn of(negative: bool, mut magnitude: u64) -> IntegerText {
        let mut t = IntegerText { buf: [0; 21], start: 21 };
        loop {
            t.start -= 1;
            t.buf[t.start] = b'0' + (magnitude % 10) as u8;
            magnitude /= 10;
            if magnitude == 0 {
                break;
            }
        }
        if negative {
            t.start -= 1;
            t.buf[t.start] = b'-';
        }
        t
    }

    fn as_str(&self) -> &str {
        // Only ASCII digits and '-' are ever written.
        std::str::from_utf8(&self.buf[self.start..]).unwrap_or_default()
    }
}

impl Serialize for Json<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            Json::U64(u) => s.serialize_u64(*u),
            Json::I64(i) => s.serialize_i64(*i),
            Json::Number(n) => n.serialize(s),
            Json::String(t) => s.serialize_str(t),
            Json::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Json::Object(m) => m.serialize(s),
        }
    }
}

impl Serialize for Members<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.len()))?;
        for (k, v) in self.iter() {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Json<'de> {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Json<'de>, D::Error> {
        de.deserialize_any(JsonVisitor)
    }
}

/// `Value`'s visitor, method for method, building a [`Json`].
struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Json<'de>, E> {
        Ok(Json::Bool(b))
    }

    fn visit_i64<E>(self, i: i64) -> Result<Json<'de>, E> {
        Ok(Json::I64(i))
    }

    fn visit_u64<E>(self, u: u64) -> Result<Json<'de>, E> {
        Ok(Json::U64(u))
    }

    fn visit_i128<E: de::Error>(self, i: i128) -> Result<Json<'de>, E> {
        Number::deserialize(de::value::I128Deserializer::new(i)).map(Json::Number)
    }

    fn visit_u128<E: de::Error>(self, u: u128) -> Result<Json<'de>, E> {
        Number::deserialize(de::value::U128Deserializer::new(u)).map(Json::Number)
    }

    fn visit_f64<E>(self, f: f64) -> Result<Json<'de>, E> {
        Ok(Number::from_f64(f).map_or(Json::Null, Json::Number))
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Borrowed(s)))
    }

    fn visit_str<E>(self, s: &str) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Owned(s.to_string())))
    }

    fn visit_string<E>(self, s: String) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Owned(s)))
    }

    fn visit_none<E>(self) -> Result<Json<'de>, E> {
        Ok(Json::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, de: D) -> Result<Json<'de>, D::Error> {
        Deserialize::deserialize(de)
    }

    fn visit_unit<E>(self) -> Result<Json<'de>, E> {
        Ok(Json::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json<'de>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json<'de>, A::Error> {
        let Some(Key(first)) = map.next_key::<Key<'de>>()? else {
            return Ok(Json::Object(Members::default()));
        };
        // `Value` reads a map whose first key is one of these as what serde_json hands over under it.
        if first == NUMBER_TOKEN {
            return map.next_value::<NumberFromString>().map(|n| Json::Number(n.0));
        }
        // Refused in any place: a later key can come first once a document is merged or re-rendered.
        if first == RAW_VALUE_TOKEN {
            return Err(de::Error::custom(RESERVED_KEY));
        }
        let mut entries = vec![(first, map.next_value()?)];
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            if key == RAW_VALUE_TOKEN {
                return Err(de::Error::custom(RESERVED_KEY));
            }
            entries.push((key, map.next_value()?));
        }
        Ok(Json::Object(Members::from_entries(entries)))
    }
}

/// A number given as a string under [`NUMBER_TOKEN`], read as `Value` reads it.
struct NumberFromString(Number);

impl<'de> Deserialize<'de> for NumberFromString {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<NumberFromString, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = NumberFromString;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("string containing a number")
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<NumberFromString, E> {
                s.parse::<Number>().map(NumberFromString).map_err(de::Error::custom)
            }
        }
        de.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both readings of `text`: the same outcome, and where both read it, the same tree and the same
    /// rendering.
    fn same_as_value(text: &str) {
        let tree = serde_json::from_str::<Value>(text);
        let ours = parse(text);
        if text.contains(RAW_VALUE_TOKEN) {
            // The one reading that differs on purpose: refused, wherever the key stands.
            let e = ours.expect_err(text).to_string();
            assert!(e.contains(RESERVED_KEY), "{text}: {e}");
            return;
        }
        match (&tree, &ours) {
            (Ok(v), Ok(j)) => {
                assert_eq!(&j.to_value(), v, "{text}");
                assert_eq!(serde_json::to_string(j).ok(), serde_json::to_string(v).ok(), "{text}");
                assert_eq!(Json::of(v).to_value(), *v, "{text}");
            }
            (Err(_), Err(_)) => {}
            _ => panic!("{text}: Value read {tree:?}, Json read {ours:?}"),
        }
    }

    /// Raw values nested in raw values, as a hostile client would send them: `levels` levels of 125
    /// arrays around an object whose one key is serde_json's private raw-value key, over the escaped
    /// text of the level below (~140 levels fit in a 256 KiB body: about 17,500 nestings deep).
    fn nested_raw_values(levels: usize) -> String {
        let mut t = "0".to_string();
        for _ in 0..levels {
            let escaped = t.replace('\\', "\\u005c").replace('"', "\\u0022");
            t = format!("{}{{\"{RAW_VALUE_TOKEN}\":\"{escaped}\"}}{}", "[".repeat(125), "]".repeat(125));
        }
        t
    }

    #[test]
    fn a_raw_value_nested_in_raw_values_is_refused_at_once_on_a_small_stack() {
        let text = nested_raw_values(140);
        assert!(text.len() < 256 * 1024, "{} bytes", text.len());
        // `Value` would read this as 17,500 nestings on one stack; a quarter of a MiB is plenty here.
        let read = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || parse_untrusted(&text).map_err(|e| e.to_string()))
            .unwrap()
            .join()
            .unwrap();
        let e = read.unwrap_err();
        assert!(e.contains(RESERVED_KEY), "{e}");
        // The key is refused wherever it stands, also escaped.
        for text in
            [r#"{"a":1,"$serde_json::private::RawValue":"1"}"#, r#"[{"\u0024serde_json::private::RawValue":"1"}]"#]
        {
            assert!(parse_untrusted(text).unwrap_err().to_string().contains(RESERVED_KEY), "{text}");
        }
    }

    #[test]
    fn reads_what_value_reads() {
        for text in [
            r#"{"properties":{"desired":{"fb":{"seq":12,"ts":1765000000123,"pad":"xx"}}}}"#,
            r#"{"a":1,"b":-2,"c":1.5,"d":1e3,"e":-0,"f":1.0E+2,"g":18446744073709551616,"h":-9223372036854775809}"#,
            r#"{"s":"esc\"aped\u00e9\n","k\u0065y":true,"n":null,"arr":[1,"x",{"y":[]},null,false]}"#,
            r#"{"a":1,"b":2,"a":3}"#,
            r#"{"a":{"x":1},"a":null}"#,
            r#"[1,2,[3,[4]]]"#,
            r#""text""#,
            r#"12"#,
            r#"{"$serde_json::private::Number":"12.50"}"#,
            r#"{"$serde_json::private::Number":"not a number"}"#,
            r#"{"$serde_json::private::Number":12}"#,
            r#"{"$serde_json::private::Number":"1","a":2}"#,
            r#"{"$serde_json::private::RawValue":"{\"a\":[1,2],\"b\":\"c\"}"}"#,
            r#"{"$serde_json::private::RawValue":"{bad"}"#,
            r#"{"x":{"$serde_json::private::RawValue":"7"}}"#,
            r#"{"a":1,"$serde_json::private::Number":"2"}"#,
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{}"#,
            r#"{"a":1} x"#,
        ] {
            same_as_value(text);
        }
    }

    #[test]
    fn repeated_keys_keep_their_first_place_and_last_value() {
        // Over the small-object limit too, where repeats are found through the sorted keys.
        for n in [3usize, 40] {
            let mut members: Vec<String> = (0..n).map(|i| format!("\"k{i}\":{i}")).collect();
            members.push("\"k1\":\"last\"".into());
            members.insert(2, "\"k0\":{\"middle\":true}".into());
            members.push("\"k2\":[2]".into());
            same_as_value(&format!("{{{}}}", members.join(",")));
        }
    }

    #[test]
    fn keys_and_plain_strings_are_borrowed() {
        let text = r#"{"key":"plain","esc":"a\nb"}"#;
        let Ok(Json::Object(m)) = parse(text) else { panic!("an object") };
        let entries = m.into_entries();
        assert!(matches!(&entries[0], (Cow::Borrowed("key"), Json::String(Cow::Borrowed("plain")))));
        assert!(matches!(&entries[1].1, Json::String(Cow::Owned(s)) if s == "a\nb"));
    }

    #[test]
    fn number_texts_are_values_texts() {
        let edges = ["0", "-0", "7", "-7", "9", "10", "-10", "99", "100", "999999999999", "1000000000000"];
        let more = ["18446744073709551615", "-9223372036854775808", "9223372036854775807", "1.25", "1e400", "2E-3"];
        for text in edges.into_iter().chain(more) {
            let (Ok(v), Ok(j)) = (serde_json::from_str::<Value>(text), parse(text)) else { continue };
            match (&v, j.number_text()) {
                (Value::Number(n), Some(t)) => {
                    assert_eq!(n.as_str(), &*t, "{text}");
                    assert_eq!(j.number_len(), Some(n.as_str().len()), "{text}: length");
                }
                _ => assert_eq!(j.to_value(), v, "{text}"),
            }
        }
    }
}
