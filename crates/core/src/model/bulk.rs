//! Bulk registry operations (`POST /devices`): up to 100 identities created, updated or deleted in one
//! call, each with IoT Hub's import mode. The front door groups a call's entries by shard and proposes
//! one [`Op::Bulk`](super::Op::Bulk) per shard, so a call costs one Raft entry (one fsync, one
//! replication round) per shard it touches instead of one or two per device.
//!
//! Every entry stands alone: it succeeds or fails as a whole (validated before anything of it is
//! written, like the single-identity operations it reuses), and a failed entry does not stop the others.

use serde::{Deserialize, Serialize};

use super::apply::clear_patch;
use super::command::{Command, DeviceSpec, IfMatch, ModuleSpec};
use super::error::TwinError;
use super::json_tree::{self, Json, Members};
use super::validate::{Section, ServiceBody};
use super::{Event, ShardState};
use crate::ids::TwinId;

/// What to do with one identity, as IoT Hub names it (`importMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImportMode {
    /// Register; an existing identity is an error.
    Create,
    /// Overwrite an existing identity regardless of its etag; a missing one is an error.
    Update,
    /// Overwrite an existing identity whose etag matches `eTag`.
    UpdateIfMatchETag,
    /// Delete regardless of the etag.
    Delete,
    /// Delete if the etag matches `eTag`.
    DeleteIfMatchETag,
    /// Overwrite the given twin sections (`tags`, `properties.desired`) regardless of the twin etag.
    UpdateTwin,
    /// The same, if the twin etag matches `twinETag`.
    UpdateTwinIfMatchETag,
}

impl ImportMode {
    /// IoT Hub's spelling, compared case-insensitively (the SDKs send camelCase).
    pub fn parse(s: &str) -> Option<ImportMode> {
        use ImportMode::*;
        [Create, Update, UpdateIfMatchETag, Delete, DeleteIfMatchETag, UpdateTwin, UpdateTwinIfMatchETag]
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(s))
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ImportMode::Create => "create",
            ImportMode::Update => "update",
            ImportMode::UpdateIfMatchETag => "updateIfMatchETag",
            ImportMode::Delete => "delete",
            ImportMode::DeleteIfMatchETag => "deleteIfMatchETag",
            ImportMode::UpdateTwin => "updateTwin",
            ImportMode::UpdateTwinIfMatchETag => "updateTwinIfMatchETag",
        }
    }
}

/// The identity an entry creates or overwrites.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Identity {
    Device(DeviceSpec),
    Module(ModuleSpec),
}

/// One entry of a bulk call, validated by the front door.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BulkEntry {
    pub id: TwinId,
    pub mode: ImportMode,
    /// The identity for `create`/`update*` (keys already generated where absent).
    pub identity: Option<Identity>,
    /// `eTag` (identity) for the `…IfMatchETag` identity modes.
    pub etag: Option<String>,
    /// `twinETag` for `updateTwinIfMatchETag`.
    pub twin_etag: Option<String>,
    /// `tags` as JSON text, if the entry carries any.
    pub tags_json: Option<String>,
    /// `properties.desired` as JSON text, if the entry carries any.
    pub desired_json: Option<String>,
}

/// The outcome of each entry, in order: `None` for success.
pub type BulkOutcome = Vec<Option<TwinError>>;

fn etag_match(e: &Option<String>, field: &str) -> Result<IfMatch, TwinError> {
    match e.as_deref().map(str::trim).filter(|e| !e.is_empty()) {
        Some(e) => Ok(IfMatch::parse_header(e)),
        None => Err(TwinError::InvalidArgument(format!("{field} is required for this importMode"))),
    }
}

impl ShardState {
    /// Applies each entry on its own; events of successful entries only.
    pub(super) fn apply_bulk(&mut self, cmd: &Command, entries: &[BulkEntry], events: &mut Vec<Event>) -> BulkOutcome {
        entries
            .iter()
            .map(|entry| {
                let mut mine = Vec::new();
                match self.apply_entry(cmd, entry, &mut mine) {
                    Ok(()) => {
                        events.append(&mut mine);
                        None
                    }
                    Err(e) => Some(e),
                }
            })
            .collect()
    }

    fn apply_entry(&mut self, cmd: &Command, e: &BulkEntry, events: &mut Vec<Event>) -> Result<(), TwinError> {
        use ImportMode::*;
        match e.mode {
            Create | Update | UpdateIfMatchETag => {
                let if_match = match e.mode {
                    Create => None,
                    Update => Some(IfMatch::Any),
                    _ => Some(etag_match(&e.etag, "eTag")?),
                };
                let identity = e
                    .identity
                    .as_ref()
                    .ok_or_else(|| TwinError::InvalidArgument(format!("{}: no identity to write", e.id)))?;
                // The twin sections are checked against the twin they will land on before the identity
                // is written, so an entry never half-applies.
                let patch = match e.mode {
                    Create => self.sections_patch(None, e)?,
                    _ => self.sections_patch(Some(&e.id), e)?,
                };
                match identity {
                    Identity::Device(d) => self.write_device(cmd, d, if_match.as_ref(), events)?,
                    Identity::Module(m) => {
                        self.put_module(cmd, m, if_match.as_ref(), events)?;
                    }
                };
                if let Some(p) = patch {
                    self.patch_twin_sections(&e.id, p.body(), None, cmd.timestamp_ms, events)?;
                }
                Ok(())
            }
            Delete | DeleteIfMatchETag => {
                let if_match = match e.mode {
                    Delete => Some(IfMatch::Any),
                    _ => Some(etag_match(&e.etag, "eTag")?),
                };
                match &e.id.module_id {
                    None => self.delete_device(&e.id.device_id, if_match.as_ref(), events)?,
                    Some(m) => self.delete_module(&e.id.device_id, m, if_match.as_ref(), events)?,
                };
                Ok(())
            }
            UpdateTwin | UpdateTwinIfMatchETag => {
                let if_match = match e.mode {
                    UpdateTwin => None,
                    _ => Some(etag_match(&e.twin_etag, "twinETag")?),
                };
                if let Some(p) = self.sections_patch(Some(&e.id), e)? {
                    self.patch_twin_sections(&e.id, p.body(), if_match.as_ref(), cmd.timestamp_ms, events)?;
                } else {
                    // Nothing to write, but the twin must exist and the etag must hold.
                    self.twin_doc(&e.id)?;
                    if let Some(m) = if_match {
                        self.patch_twin(&e.id, "{}", Some(&m), cmd.timestamp_ms, events)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// The service patch that overwrites the sections the entry carries: for each given section, every
    /// current key removed (`null`) and the given members set. `current` names the twin whose sections
    /// are overwritten (`None`: a twin about to be created, which has none). The sections were checked
    /// by the front door before the entry was proposed, so they are only parsed here.
    fn sections_patch<'e>(
        &self,
        current: Option<&TwinId>,
        e: &'e BulkEntry,
    ) -> Result<Option<SectionsPatch<'e>>, TwinError> {
        if e.tags_json.is_none() && e.desired_json.is_none() {
            return Ok(None);
        }
        let twin = match current {
            Some(id) => match self.twin_doc(id) {
                Ok(t) => Some(t),
                // `update` of a missing identity fails in put_device with the right error.
                Err(_) if matches!(e.mode, ImportMode::Update | ImportMode::UpdateIfMatchETag) => None,
                Err(err) => return Err(err),
            },
            None => None,
        };
        fn section<'e>(
            json: &'e Option<String>,
            cur: Option<super::packed::NodeRef<'_>>,
        ) -> Result<Option<Members<'e>>, TwinError> {
            let Some(text) = json else { return Ok(None) };
            let given = json_tree::parse(text)
                .map_err(|err| TwinError::InvalidArgument(format!("malformed twin section: {err}")))?;
            let Json::Object(given) = given else {
                return Err(TwinError::InvalidArgument("tags and properties.desired must be JSON objects".into()));
            };
            // Every current key removed, then the given members (a key in both keeps its place).
            let mut entries: Vec<_> = cur.map(clear_patch).map(Members::into_entries).unwrap_or_default();
            entries.extend(given.into_entries());
            Ok(Some(Members::from_entries(entries)))
        }
        Ok(Some(SectionsPatch {
            tags: section(&e.tags_json, twin.map(|t| t.tags.root()))?,
            desired: section(&e.desired_json, twin.map(|t| t.desired.root()))?,
        }))
    }
}

/// The sections a bulk entry writes, as patches of the twin's current ones.
struct SectionsPatch<'e> {
    tags: Option<Members<'e>>,
    desired: Option<Members<'e>>,
}

impl<'e> SectionsPatch<'e> {
    fn body(&self) -> ServiceBody<'_> {
        fn section<'a>(m: &'a Option<Members<'a>>) -> Section<'a> {
            m.as_ref().map_or(Section::Absent, Section::Object)
        }
        ServiceBody { tags: section(&self.tags), desired: section(&self.desired) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::command::Op;
    use crate::model::Reply;

    fn entry(id: &str, mode: ImportMode) -> BulkEntry {
        BulkEntry {
            id: TwinId::device(id.to_string()),
            mode,
            identity: Some(Identity::Device(DeviceSpec::test_sas(id))),
            etag: None,
            twin_etag: None,
            tags_json: None,
            desired_json: None,
        }
    }

    fn run(st: &mut ShardState, entries: Vec<BulkEntry>) -> BulkOutcome {
        match st.apply(&Command::new(Op::Bulk { entries }, 1_700_000_000_000)).result {
            Ok(Reply::Bulk(o)) => o,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn modes_and_independent_failures() {
        let mut st = ShardState::default();
        let mut c = entry("a", ImportMode::Create);
        c.tags_json = Some(r#"{"site":"b43","old":1}"#.into());
        c.desired_json = Some(r#"{"interval":5}"#.into());
        let out = run(&mut st, vec![c, entry("b", ImportMode::Create), entry("zz", ImportMode::Update)]);
        assert_eq!(out[0], None);
        assert_eq!(out[1], None);
        assert!(matches!(out[2], Some(TwinError::DeviceNotFound(_))), "{out:?}");
        let twin = st.twin(&TwinId::device("a".to_string())).unwrap();
        assert_eq!(twin["tags"]["site"], "b43");
        assert_eq!(twin["properties"]["desired"]["interval"], 5);

        // Again: create fails for the existing one only.
        let out = run(&mut st, vec![entry("a", ImportMode::Create), entry("c", ImportMode::Create)]);
        assert!(matches!(out[0], Some(TwinError::DeviceAlreadyExists(_))));
        assert_eq!(out[1], None);

        // updateTwin overwrites the given section: `old` goes, `site` changes, desired untouched.
        let mut u = entry("a", ImportMode::UpdateTwin);
        u.identity = None;
        u.tags_json = Some(r#"{"site":"b44"}"#.into());
        assert_eq!(run(&mut st, vec![u]), vec![None]);
        let twin = st.twin(&TwinId::device("a".to_string())).unwrap();
        assert_eq!(twin["tags"], serde_json::json!({"site": "b44"}));
        assert_eq!(twin["properties"]["desired"]["interval"], 5);

        // Etag modes: a stale etag fails, a missing one is named.
        let mut stale = entry("b", ImportMode::UpdateTwinIfMatchETag);
        stale.twin_etag = Some("\"AAAAAAAAAAA=\"".into());
        stale.tags_json = Some("{}".into());
        let mut missing = entry("b", ImportMode::DeleteIfMatchETag);
        missing.etag = None;
        let out = run(&mut st, vec![stale, missing, entry("c", ImportMode::Delete)]);
        assert!(matches!(out[0], Some(TwinError::PreconditionFailed(_))), "{out:?}");
        assert!(matches!(&out[1], Some(TwinError::InvalidArgument(m)) if m.contains("eTag")), "{out:?}");
        assert_eq!(out[2], None);
        assert!(st.device("c").is_none());
        assert!(st.device("b").is_some());
    }

    #[test]
    fn a_retried_bulk_command_applies_once() {
        let mut st = ShardState::default();
        let cmd = Command::new(Op::Bulk { entries: vec![entry("a", ImportMode::Create)] }, 1);
        let first = st.apply(&cmd);
        let again = st.apply(&cmd);
        assert_eq!(first.result, again.result);
        assert!(again.events.is_empty());
        // A mixed outcome is remembered entry by entry, an all-good one by its count; both survive a
        // snapshot and answer a retry the same.
        let mixed =
            Command::new(Op::Bulk { entries: vec![entry("a", ImportMode::Create), entry("b", ImportMode::Create)] }, 2);
        let first_mixed = st.apply(&mixed);
        assert!(matches!(&first_mixed.result, Ok(Reply::Bulk(o)) if o[0].is_some() && o[1].is_none()));
        let mut restored = ShardState::decode_snapshot(&st.encode_snapshot()).expect("snapshot");
        assert_eq!(restored.apply(&mixed).result, first_mixed.result);
        assert_eq!(restored.apply(&cmd).result, first.result);
        assert!(restored.device("b").is_some());
    }

    #[test]
    fn modes_parse_case_insensitively() {
        assert_eq!(ImportMode::parse("updateTwinIfMatchETag"), Some(ImportMode::UpdateTwinIfMatchETag));
        assert_eq!(ImportMode::parse("CREATE"), Some(ImportMode::Create));
        assert_eq!(ImportMode::parse("createOrUpdate"), None);
    }
}
