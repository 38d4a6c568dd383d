//! The body of an `updateTwin` change event, IoT Hub's twinChangeNotification:
//! `{"version", "tags"?, "properties"?: {"desired"|"reported": {patch, "$metadata", "$version"}}}`.
//!
//! Written straight as JSON text from the patch and the merged section, like a twin write's reply:
//! the change feed keeps, sends and finally frees each body as one string, where a tree cost a copy of
//! the patch, a map per `$metadata` level, a serialization per consumer and as many frees.

use serde::ser::{Serialize, SerializeMap, Serializer};

use super::json_tree::Members;
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
