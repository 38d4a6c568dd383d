//! The body of an `updateTwin` change event, IoT Hub's twinChangeNotification:
//! `{"version", "tags"?, "properties"?: {"desired"|"reported": {patch, "$metadata", "$version"}}}`.
//!
//! Written straight as JSON text from the patch and the merged section, like a twin write's reply:
//! the change feed keeps, sends and finally frees each body as one string, where a tree cost a copy of
//! the patch, a map per `$metadata` level, a serialization per consumer and as many frees.

use serde::ser::{Serialize, SerializeMap, Serializer};

use super::json_text::JsonText;
use super::json_tree::Members;
use super::json_write::{write_json_int, write_key};
use super::packed::NodeRef;

/// What an `updateTwin` changed, borrowed from the command and the twin after it.
pub(super) struct UpdateBody<'a> {
    /// The twin's `$version` after the change.
    pub version: i64,
    /// The tags patch, if the command patched tags.
    pub tags: Option<&'a Members<'a>>,
    /// The desired or reported patch, if the command patched one.
    pub properties: Option<SectionChange<'a>>,
}

/// A properties section's patch as a change event renders it: the patch's members, then `$metadata`
/// of what it touched, then the section's `$version`.
pub(super) struct SectionChange<'a> {
    /// `"desired"` or `"reported"`.
    pub name: &'static str,
    pub patch: &'a Members<'a>,
    /// The section after the merge.
    pub node: NodeRef<'a>,
    pub version: i64,
    /// Whether `$metadata` carries `$lastUpdatedVersion` (desired does, reported does not).
    pub with_version: bool,
}

impl UpdateBody<'_> {
    /// The body as shared text.
    pub fn to_text(&self) -> JsonText {
        JsonText::written(|buf| {
            self.write_text(buf);
            Ok(())
        })
    }

    /// The body as JSON text: the bytes its `Serialize` gives through serde_json, written straight
    /// (the leader writes one for every twin write; through a serializer, the patch's strings were
    /// checked for escapes byte by byte, as were all the names).
    pub fn write_text(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"version\":");
        write_json_int(out, self.version);
        if let Some(t) = self.tags {
            out.extend_from_slice(b",\"tags\":{");
            t.write_member_list(out, &mut true);
            out.push(b'}');
        }
        if let Some(p) = &self.properties {
            out.extend_from_slice(b",\"properties\":{");
            write_key(out, &mut true, p.name.as_bytes());
            out.push(b'{');
            let mut first = true;
            p.patch.write_member_list(out, &mut first);
            write_key(out, &mut first, b"$metadata");
            p.node.write_patch_metadata(out, p.patch, p.with_version);
            out.extend_from_slice(b",\"$version\":");
            write_json_int(out, p.version);
            out.extend_from_slice(b"}}");
        }
        out.push(b'}');
    }
}

impl Serialize for UpdateBody<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("version", &self.version)?;
        if let Some(t) = self.tags {
            map.serialize_entry("tags", t)?;
        }
        if let Some(p) = &self.properties {
            map.serialize_entry("properties", &Properties(p))?;
        }
        map.end()
    }
}

struct Properties<'s, 'a>(&'s SectionChange<'a>);

impl Serialize for Properties<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        map.serialize_entry(self.0.name, self.0)?;
        map.end()
    }
}

impl Serialize for SectionChange<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        // Patch keys never start with `$` (validation refuses it): no collision with the two below.
        for (k, v) in self.patch.iter() {
            map.serialize_entry(k, v)?;
        }
        map.serialize_entry("$metadata", &self.node.patch_metadata(self.patch, self.with_version))?;
        map.serialize_entry("$version", &self.version)?;
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::json_tree::{self, Json};
    use crate::model::packed::Packed;

    /// The body written as text is what serde_json writes for it, with and without tags and a
    /// section, desired and reported, names and strings that need escapes included.
    #[test]
    fn change_body_text_matches_its_serde_rendering() {
        let patches = [
            r#"{"a":1}"#,
            r#"{"fb":{"seq":12,"ts":1795000000123,"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}"#,
            r#"{"q\"uote":"a\"b\\c\u0001","é":{"n":-0.5e3,"gone":null,"arr":[1,"t",{"k":null}]},"z":{}}"#,
            r#"{"x":null}"#,
        ];
        for (i, text) in patches.iter().enumerate() {
            let Ok(Json::Object(patch)) = json_tree::parse(text) else { panic!("{text}") };
            let section = Packed::empty_section().merged(&patch, 1_700_000_000_123, 3);
            for (tags, name, with_version) in [(true, "desired", true), (false, "reported", false), (true, "", true)] {
                let body = UpdateBody {
                    version: 7 + i as i64,
                    tags: tags.then_some(&patch),
                    properties: (!name.is_empty()).then(|| SectionChange {
                        name,
                        patch: &patch,
                        node: section.root(),
                        version: 4,
                        with_version,
                    }),
                };
                let want = serde_json::to_string(&body).unwrap_or_default();
                assert_eq!(body.to_text().as_str(), want, "{text}, {name:?}");
            }
        }
    }
}
