//! A rendered JSON document shared without copying.
//!
//! A twin write answers the whole twin document. Every replica renders it once (the retry window keeps
//! it as text), the leader's writer sends it back over HTTP, and a forwarded write carries it between
//! nodes: as text, each of those is a reference count, where a `serde_json::Value` was a deep clone, a
//! serialization and, after forwarding, a parse and a second serialization.

use std::fmt;
use std::sync::Arc;

use serde::de::Error as _;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

use super::json_read::RAW_VALUE_TOKEN;

/// JSON text, known to be one valid JSON value. Serializes as that value (not as a string), so a
/// message that carries it looks the same on the wire as one that carried the parsed document.
#[derive(Clone, PartialEq, Eq)]
pub struct JsonText(Arc<str>);

impl JsonText {
    /// Renders a document.
    pub fn render(doc: &Value) -> JsonText {
        JsonText::of(doc)
    }

    /// Renders anything serde can write as JSON. Callers pass documents and views whose map keys are
    /// strings, which cannot fail; `null` stands in if one ever did.
    ///
    /// The text is written into a buffer the thread keeps, then copied once into its shared
    /// allocation. `serde_json::to_string` starts at 128 bytes and doubles, so a twin document of a
    /// kilobyte or two was three or four reallocations and copies, then one more copy into the `Arc`;
    /// every replica renders one per twin write.
    pub fn of(doc: &impl Serialize) -> JsonText {
        JsonText::written(|buf| serde_json::to_writer(buf, doc))
    }

    /// The text `write` writes, which must be one JSON value (the writers that render a twin without
    /// serde, [`JsonText::of`] through it); `null` if it fails.
    ///
    /// The text is checked to be UTF-8 (the twin writers copy packed strings' bytes as they are) by
    /// simdutf8, which reads 32 bytes a step where the standard library's check reads 16: the check
    /// was a twentieth of rendering a twin (benches/README.md).
    pub(crate) fn written(write: impl FnOnce(&mut Vec<u8>) -> Result<(), serde_json::Error>) -> JsonText {
        crate::scratch::with_buffer(|buf| match write(&mut *buf) {
            Ok(()) => JsonText(simdutf8::basic::from_utf8(buf).map(Arc::from).unwrap_or_else(|_| Arc::from("null"))),
            Err(_) => JsonText(Arc::from("null")),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Text read back from storage as it was written: checked to be one JSON value, kept as it is.
    pub fn parse(text: &str) -> Result<JsonText, serde_json::Error> {
        let raw: &RawValue = serde_json::from_str(text)?;
        Ok(JsonText(Arc::from(raw.get())))
    }

    /// Text another member of the cluster rendered (with this code) and sent over the authenticated
    /// inter-node transport: a forwarded twin write's answer. Kept as it came, without reading it
    /// again: checking it was most of what it cost to take that answer in, for text whose sender
    /// is trusted with the whole state anyway.
    pub fn from_member(text: &str) -> JsonText {
        JsonText(Arc::from(text))
    }

    /// The parsed document (tests, snapshots, and the rare caller that needs to look inside).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }
}

/// The text's bytes, so the shared text can be a response body as it is.
impl AsRef<[u8]> for JsonText {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for JsonText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Written as the one-field struct that serde_json's serializer writes as the field's text, verbatim:
/// the shape [`RawValue`] serializes as. Going through `RawValue` itself would mean reading the whole
/// text again to check it (it was checked when it was made), and that read was most of what it cost
/// to send a forwarded write's answer or a change event. The tests below hold this to `RawValue`'s own
/// output, so a serde_json that changed the name would fail them.
impl Serialize for JsonText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut raw = s.serialize_struct(RAW_VALUE_TOKEN, 1)?;
        raw.serialize_field(RAW_VALUE_TOKEN, &*self.0)?;
        raw.end()
    }
}

impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<JsonText, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        if raw.get().is_empty() {
            return Err(D::Error::custom("empty JSON text"));
        }
        Ok(JsonText(Arc::from(raw.get())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn travels_as_the_json_value_itself() {
        let doc = json!({"deviceId": "d1", "properties": {"desired": {"x": 1, "$version": 2}}});
        let text = JsonText::render(&doc);
        let wire = serde_json::to_string(&Some(text.clone())).unwrap();
        assert_eq!(wire, serde_json::to_string(&Some(doc.clone())).unwrap(), "same bytes as the Value");
        let back: Option<JsonText> = serde_json::from_str(&wire).unwrap();
        assert_eq!(back.unwrap().to_value(), doc);
        assert_eq!(text.to_value(), doc);
    }

    /// Written as `RawValue` writes it, in JSON (the text itself, inside other values too) and in
    /// postcard (a string), without reading the text again.
    #[test]
    fn serializes_exactly_as_raw_value() {
        for text in [r#"{"a":[1,2.5e3,"x\"y"],"b":{"c":null}}"#, "3", r#""s""#, "[]", "{}"] {
            let ours = JsonText::parse(text).unwrap();
            let raw: &RawValue = serde_json::from_str(text).unwrap();
            assert_eq!(serde_json::to_string(&ours).unwrap(), serde_json::to_string(raw).unwrap());
            assert_eq!(serde_json::to_string(&(1, &ours)).unwrap(), serde_json::to_string(&(1, raw)).unwrap());
            assert_eq!(serde_json::to_string(&ours).unwrap(), text, "written as it is");
            assert_eq!(postcard::to_allocvec(&ours).unwrap(), postcard::to_allocvec(raw).unwrap());
        }
    }

    /// A document rendered while another is being rendered (a view that embeds a rendering of its
    /// own) gets its own buffer; a huge document's buffer is not kept, and what follows it is whole.
    #[test]
    fn renders_nested_and_after_a_huge_document_are_whole() {
        struct Nested;
        impl Serialize for Nested {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let inner = JsonText::of(&json!({"inner": [1, 2, 3]}));
                (json!({"outer": true}), inner).serialize(s)
            }
        }
        assert_eq!(JsonText::of(&Nested).as_str(), r#"[{"outer":true},{"inner":[1,2,3]}]"#);
        let huge = json!({"pad": "x".repeat(crate::scratch::KEEP * 2)});
        assert_eq!(JsonText::of(&huge).to_value(), huge);
        assert!(crate::scratch::kept_capacity() <= crate::scratch::KEEP, "kept a huge buffer");
        assert_eq!(JsonText::of(&json!({"a": "b"})).as_str(), r#"{"a":"b"}"#);
    }
}
