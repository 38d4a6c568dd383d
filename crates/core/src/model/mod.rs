//! The pure twin model: IoT Hub device and module twins and the identity registry of one shard.
//!
//! No I/O, no clock, no randomness: [`ShardState::apply`] is a deterministic function of the state and a
//! [`Command`], run identically on every replica. Front doors call the `validate_*` functions before
//! proposing so that bad input costs no log entry; apply validates again whatever depends on state
//! (sizes after merge, If-Match).

mod apply;
pub mod backup;
pub mod bulk;
pub mod certificates;
mod change;
pub mod command;
pub mod config;
mod dedupe;
mod doc;
pub mod error;
mod etag;
pub mod jobs;
mod json_read;
mod json_text;
pub mod json_tree;
mod json_write;
pub mod method;
mod packed;
mod registry;
mod reply;
mod scan;
mod snapshot;
pub mod tag_index;
pub mod time;
pub mod validate;
mod validate_text;

#[cfg(test)]
mod tests;

pub use command::{now_ms, AuthSpec, AuthType, Command, DeviceSpec, IfMatch, ModuleSpec, Op, RequestId, Status};
pub use doc::{Node, NodeValue};
pub use error::TwinError;
pub use json_text::JsonText;
pub use packed::{NodeRef, Packed, ValueRef};
pub use registry::{edge_scope_device, TwinDoc, TwinRef};
pub use reply::UnexpectedReply;
pub use snapshot::SnapshotImage;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::ops::Bound;
use std::sync::Arc;

use dedupe::{Dedupe, RecentReplies, Remembered, WrittenTwin};
use registry::DeviceEntry;

use crate::ids::TwinId;

/// Maximum modules on one device (IoT Hub: 20).
pub const MAX_MODULES_PER_DEVICE: usize = 20;

/// What a successful command answers. JSON documents are rendered in IoT Hub's REST shapes (the twin
/// document, Device, Module), as the service SDKs parse them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// A Device document (PUT /devices/{id}).
    Device(Value),
    /// A Module document.
    Module(Value),
    /// The full twin document after the change (PATCH/PUT /twins/...), rendered once.
    Twin(JsonText),
    /// A reported patch was applied; the new reported `$version`.
    Reported { version: i64 },
    /// DELETE, connection state, a job's update of one device.
    Done,
    /// A job record (JobResponse JSON) after a job command.
    Job(Value),
    /// Each entry's outcome of a bulk registry command, in order (`None`: applied).
    Bulk(bulk::BulkOutcome),
    /// A method job's claim of a device: `claimed` when this command created the row (call the
    /// method); otherwise whether the existing row is still `running` (claimed earlier, no answer).
    Claim { claimed: bool, running: bool },
    /// A configuration record after a configuration command (`Null` after a delete).
    Configuration(Value),
    /// A CA certificate record after a `/certificates` command (`None`: deleted).
    Certificate(Option<Value>),
    /// Each command's outcome of an [`Op::Batch`], in the batch's order.
    Batch(Vec<Result<Reply, TwinError>>),
}

/// A change derived from committed state, for desired pushes and twin change events (`notify` consumes
/// these). Every event carries the versions it reflects.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// A change to tags, desired or reported: `body` is IoT Hub's twinChangeNotification body
    /// (`{"version", "tags"?, "properties": {"desired"|"reported": {patch with nulls, "$metadata", "$version"}}}`)
    /// for `updateTwin`, or the full twin for `replaceTwin`. Kept as text: the change feed stores and
    /// sends it as it is, and looks inside only to coalesce two pending changes.
    TwinChanged { id: TwinId, op_type: String, body: JsonText, version: i64 },
    /// What a connected device receives on `$iothub/twin/PATCH/properties/desired/?$version=n`: the
    /// patch (for a replace, the difference with `null` for removed keys) plus `"$version"`. Kept as
    /// text, written from the patch on the leader of every desired write: a tree is built from it
    /// only for a twin with a device listening, which a write on its own seldom has.
    DesiredPatch { id: TwinId, patch: JsonText, desired_version: i64 },
    /// Identity lifecycle: `createDeviceIdentity`, `deleteDeviceIdentity` (and module variants).
    Lifecycle { id: TwinId, op_type: String, body: Value },
    /// `deviceConnected` / `deviceDisconnected`.
    Connection { id: TwinId, connected: bool },
}

/// Outcome of applying one command.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    pub result: Result<Reply, TwinError>,
    pub events: Vec<Event>,
}

/// Credentials of one device or module, for MQTT and device-token checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    pub primary_key: Option<String>,
    pub secondary_key: Option<String>,
    pub enabled: bool,
    /// The persistent MQTT session's subscriptions (see `Op::SetSubscriptions`).
    #[serde(default)]
    pub subscriptions: Vec<(String, u8)>,
    /// `authentication.type` of the identity (`sas`, `selfSigned`, `certificateAuthority`, `none`),
    /// so a CONNECT decides how it may log in from this one read.
    #[serde(default)]
    pub auth_type: String,
}

/// Counts for `GET /statistics/devices`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStats {
    pub total: u64,
    pub enabled: u64,
    pub disabled: u64,
}

/// A shard's devices by id. A persistent B-tree (imbl's `OrdMap`, nodes shared by reference count):
/// a copy of it is O(1), so a [`SnapshotImage`] takes it without walking the map, and a write after
/// that copies only the few nodes on its path that the image still shares. With `BTreeMap` (and the
/// windows of recent outcomes and replies as `std` hash maps) the image walked and allocated
/// everything under the state lock: 10-23 ms per snapshot on a busy node, during which apply waited;
/// now a few microseconds (benches/README.md).
type Devices = imbl::OrdMap<DeviceKey, Arc<DeviceEntry>>;

/// A device id as the shard's maps hold it. Ids of up to 23 bytes (most fleets' naming) are held
/// inline in the key itself, so the half dozen compares of a lookup in a B-tree node read the node's
/// own memory; as `Arc<str>` each compare followed a pointer to the id's text, most of them a cache
/// miss: that was most of the cost of finding a twin on every replica (benches/README.md). Longer ids
/// are a shared `Arc<str>` as before, so a copy of a key (the tag index, the retry window) never
/// allocates. Serialized as the text: snapshots are unchanged.
pub type DeviceKey = smol_str::SmolStr;

/// The registry and twins of one shard: the Raft state machine's data.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShardState {
    /// Devices by id; each holds its twin and its modules (with their twins), so deleting a device
    /// deletes everything under it at once. The id ([`DeviceKey`]) is copied into the tag index
    /// without allocating, and the entry is behind a pointer: a map slot then holds 32 bytes instead
    /// of the whole entry, whose ~500 bytes would sit in B-tree nodes that are, on average, a third
    /// empty. The pointer is shared so that a [`SnapshotImage`] shares the map and the twins: apply
    /// copies an entry (`Arc::make_mut`) only when it changes one that an image being encoded still
    /// holds.
    devices: Devices,
    /// Last etag counter handed out (twin and identity etags). Only grows: etags are never reused.
    etag_seq: u64,
    /// Recent outcomes by request id (at-most-once).
    dedupe: Dedupe,
    /// The documents recent twin writes answered, so a retry answers the same (absent in snapshots
    /// taken before it existed).
    #[serde(default)]
    replies: RecentReplies,
    /// The cluster map; only the metadata group's state uses it (its twins stay empty), so the one
    /// Raft type configuration, log store and state machine serve both kinds of group.
    #[serde(default)]
    pub cluster: crate::cluster::map::ClusterMap,
    /// Job records; only the metadata group's state uses it.
    #[serde(default)]
    pub jobs: jobs::JobsState,
    /// Per-device job outcomes of this shard's devices (`devices.jobs`).
    #[serde(default)]
    device_jobs: jobs::DeviceJobs,
    /// Automatic device configurations; only the metadata group's state uses it.
    #[serde(default)]
    pub configs: config::ConfigsState,
    /// The hub's CA certificates; only the metadata group's state uses it.
    #[serde(default)]
    pub certificates: certificates::Certificates,
    /// Devices by tag value, for selective queries; derived from `devices`, rebuilt on decode.
    #[serde(skip)]
    tag_index: tag_index::TagIndex,
    /// Set only during [`ShardState::apply_quietly`]: no events are built. Never part of the state
    /// (false at rest, not in snapshots); outcomes and state changes are the same either way.
    #[serde(skip)]
    quiet: bool,
}

impl ShardState {
    /// [`ShardState::apply`] for a replica whose events nobody can receive (no feed position handed
    /// out, no consumer, no connected device, no peer tailing): the same outcome and the same state,
    /// without rendering the twins and patches that events carry.
    pub fn apply_quietly(&mut self, cmd: &Command) -> Applied {
        self.quiet = true;
        let applied = self.apply(cmd);
        self.quiet = false;
        applied
    }

    /// Applies a committed command. Deterministic; a rejected command leaves the state unchanged.
    /// A command whose request id was recently applied for the same device answers the first outcome
    /// again and changes nothing.
    pub fn apply(&mut self, cmd: &Command) -> Applied {
        match &cmd.op {
            Op::Batch { commands } => self.apply_batch(commands),
            _ => self.apply_one(cmd),
        }
    }

    /// [`ShardState::apply`] of one command, or of a batch inside a batch, which `apply_op` refuses.
    fn apply_one(&mut self, cmd: &Command) -> Applied {
        if let Some(first) = self.dedupe.get(&cmd.request_id) {
            let result = match (first, self.replies.get(&cmd.request_id)) {
                (Remembered::Twin(_), Some(doc)) => Ok(Reply::Twin(doc)),
                _ => self.recall(first),
            };
            return Applied { result, events: Vec::new() };
        }
        let mut events = Vec::new();
        let result = self.apply_op(cmd, &mut events);
        if result.is_err() {
            events.clear();
        }
        let remembered = match &result {
            Err(e) => Remembered::Err(e.clone()),
            Ok(Reply::Done) => Remembered::Done,
            Ok(Reply::Reported { version }) => Remembered::Reported(*version),
            Ok(Reply::Device(_)) => Remembered::Device(cmd.device_id().to_string()),
            Ok(Reply::Module(_)) => match &cmd.op {
                Op::PutModule { module, .. } => Remembered::Module(module.device_id.clone(), module.module_id.clone()),
                _ => Remembered::Done,
            },
            Ok(Reply::Job(_)) => match &cmd.op {
                Op::Job(op) => Remembered::Job(op.job_id().to_string()),
                _ => Remembered::Done,
            },
            Ok(Reply::Bulk(outcome)) if outcome.iter().all(Option::is_none) => Remembered::BulkDone(outcome.len()),
            Ok(Reply::Bulk(outcome)) => Remembered::Bulk(outcome.clone()),
            Ok(Reply::Certificate(None)) => Remembered::Done,
            Ok(Reply::Certificate(Some(_))) => match &cmd.op {
                Op::Certificate(op) => Remembered::Certificate(op.name().to_string()),
                _ => Remembered::Done,
            },
            Ok(Reply::Claim { claimed, running }) => Remembered::Claim { claimed: *claimed, running: *running },
            Ok(Reply::Configuration(_)) => match &cmd.op {
                Op::Configuration(op) => Remembered::Configuration(op.id().to_string()),
                _ => Remembered::Done,
            },
            // Only `apply_batch` builds this reply, and it answers without coming here.
            Ok(Reply::Batch(_)) => Remembered::Done,
            Ok(Reply::Twin(_)) => match &cmd.op {
                Op::UpdateTwin { id, .. } | Op::ReplaceTwin { id, .. } => Remembered::Twin(self.written_twin(id)),
                _ => Remembered::Done,
            },
        };
        if let (Remembered::Twin(_), Ok(Reply::Twin(doc))) = (&remembered, &result) {
            self.replies.remember(cmd.request_id, doc.clone()); // a reference count
        }
        self.dedupe.remember(cmd.request_id, remembered);
        Applied { result, events }
    }

    /// The twin a write just wrote, for the dedupe window. An id short enough to be held inline is
    /// copied as it is; only a longer one is worth a search of the device map, for the shard's own
    /// shared key (a reference count instead of an allocation per remembered write). The search cost
    /// about a sixth of what the retry windows cost per write, for ids that are nearly always short.
    fn written_twin(&self, id: &TwinId) -> WrittenTwin {
        let text = id.device_id.as_str();
        let device = if text.len() <= DeviceKey::INLINE_CAP {
            DeviceKey::from(text)
        } else {
            match self.devices.get_key_value(text) {
                Some((key, _)) => key.clone(),
                None => DeviceKey::from(text),
            }
        };
        WrittenTwin::new(device, id.module_id.as_deref())
    }

    /// Applies each command of a batch as if it had an entry of its own, in order; the events of all
    /// of them go out together. The batch itself is not remembered for dedupe (its commands are),
    /// and a batch inside a batch is refused (by `apply_op`), as no proposer builds one.
    fn apply_batch(&mut self, commands: &[Command]) -> Applied {
        let mut events = Vec::new();
        let results = commands
            .iter()
            .map(|inner| {
                let applied = self.apply_one(inner);
                events.extend(applied.events);
                applied.result
            })
            .collect();
        Applied { result: Ok(Reply::Batch(results)), events }
    }

    /// The answer to a duplicate: stored errors and versions exactly; documents as they are now (twin
    /// writes are answered from `replies` first, see `apply`).
    fn recall(&self, first: &Remembered) -> Result<Reply, TwinError> {
        match first {
            Remembered::Err(e) => Err(e.clone()),
            Remembered::Done => Ok(Reply::Done),
            Remembered::Bulk(o) => Ok(Reply::Bulk(o.clone())),
            Remembered::BulkDone(n) => Ok(Reply::Bulk(vec![None; *n])),
            Remembered::Certificate(name) => Ok(Reply::Certificate(self.certificates.render(name, true))),
            Remembered::Claim { claimed, running } => Ok(Reply::Claim { claimed: *claimed, running: *running }),
            Remembered::Configuration(id) => {
                Ok(Reply::Configuration(self.configs.configs.get(id).map_or(Value::Null, |c| c.render())))
            }
            Remembered::Reported(v) => Ok(Reply::Reported { version: *v }),
            Remembered::Device(d) => {
                self.device(d).map(Reply::Device).ok_or_else(|| TwinError::DeviceNotFound(d.clone()))
            }
            Remembered::Module(d, m) => self.module(d, m).map(Reply::Module),
            Remembered::Twin(t) => self.twin_text(&t.to_id()).map(Reply::Twin),
            Remembered::Job(id) => self
                .jobs
                .jobs
                .get(id)
                .map(|j| Reply::Job(j.render()))
                .ok_or_else(|| TwinError::InvalidArgument(format!("job {id} does not exist"))),
        }
    }

    /// The Device document, or `None`.
    pub fn device(&self, device_id: &str) -> Option<Value> {
        self.devices.get(device_id).map(|d| d.render(device_id))
    }

    /// Device documents in device-id order, starting after `after` (for paging).
    pub fn devices(&self, after: Option<&str>, limit: usize) -> Vec<Value> {
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.devices.range::<_, str>((start, Bound::Unbounded)).take(limit).map(|(id, d)| d.render(id)).collect()
    }

    pub fn module(&self, device_id: &str, module_id: &str) -> Result<Value, TwinError> {
        let dev = self.device_entry(device_id)?;
        dev.modules
            .get(module_id)
            .map(|m| m.render(device_id, module_id))
            .ok_or_else(|| TwinError::ModuleNotFound { device: device_id.to_string(), module: module_id.to_string() })
    }

    fn device_entry(&self, device_id: &str) -> Result<&DeviceEntry, TwinError> {
        self.devices.get(device_id).map(|d| &**d).ok_or_else(|| TwinError::DeviceNotFound(device_id.to_string()))
    }

    pub fn modules(&self, device_id: &str) -> Result<Vec<Value>, TwinError> {
        let dev = self.device_entry(device_id)?;
        Ok(dev.modules.iter().map(|(mid, m)| m.render(device_id, mid)).collect())
    }

    /// Twins in (deviceId, moduleId) order, strictly after the key `after` (`[]`, `[deviceId]` or
    /// `[deviceId, moduleId]`): device twins, or module twins. Not rendered: a query renders each one
    /// only as far as it needs, and one that stops early never touches the rest of the shard.
    pub fn twins_after<'a>(&'a self, modules: bool, after: &'a [String]) -> Box<dyn Iterator<Item = TwinRef<'a>> + 'a> {
        let first = after.first().map(String::as_str);
        if !modules {
            let start = first.map_or(Bound::Unbounded, Bound::Excluded);
            return Box::new(self.devices.range::<_, str>((start, Bound::Unbounded)).map(|(id, d)| TwinRef {
                device_id: id,
                device: d,
                module: None,
            }));
        }
        let start = first.map_or(Bound::Unbounded, Bound::Included);
        let after_module = after.get(1).map(String::as_str);
        Box::new(self.devices.range::<_, str>((start, Bound::Unbounded)).flat_map(move |(id, d)| {
            let skip_to = if Some(&**id) == first { after_module } else { None };
            let same_device_without_module = Some(&**id) == first && after_module.is_none();
            d.modules
                .iter()
                .filter(move |(mid, _)| !same_device_without_module && skip_to.is_none_or(|s| mid.as_str() > s))
                .map(move |(mid, m)| TwinRef { device_id: id, device: d, module: Some((mid.as_str(), m)) })
        }))
    }

    /// The device twins that may hold `value` at the tag path `path` (the keys after `tags`), with
    /// ids after `after`, in id order, and how many there are in all; `None` if the tag index cannot
    /// tell (see [`tag_index`]). Callers still test each twin.
    pub fn tagged_devices_after<'a, 'p>(
        &'a self,
        path: impl ExactSizeIterator<Item = &'p str>,
        value: &tag_index::IndexValue,
        after: Option<&'a str>,
    ) -> Option<(usize, Box<dyn Iterator<Item = TwinRef<'a>> + 'a>)> {
        let ids = self.tag_index.candidates(path, value)?;
        let twins = ids.after(after).filter_map(|id| {
            let (id, device) = self.devices.get_key_value(id.as_str())?;
            Some(TwinRef { device_id: id, device, module: None })
        });
        Some((ids.len(), Box::new(twins)))
    }

    /// The tag index rebuilt from the twins (what decoding a snapshot does; tests compare).
    pub fn rebuilt_tag_index(&self) -> tag_index::TagIndex {
        let mut index = tag_index::TagIndex::default();
        for (id, d) in &self.devices {
            index.add(id, d.twin.tags.root());
        }
        index
    }

    /// Whether the maintained tag index equals one rebuilt from the twins.
    pub fn tag_index_is_consistent(&self) -> bool {
        self.tag_index == self.rebuilt_tag_index()
    }

    /// `devices.jobs` rows in (jobId, deviceId) order, strictly after the key `after`.
    pub fn job_rows_after<'a>(&'a self, after: &'a [String]) -> Box<dyn Iterator<Item = Value> + 'a> {
        let first = after.first().map(String::as_str);
        let after_device = after.get(1).map(String::as_str);
        let start = first.map_or(Bound::Unbounded, Bound::Included);
        Box::new(self.device_jobs.range::<str, _>((start, Bound::Unbounded)).flat_map(move |(job, rows)| {
            let same = Some(job.as_str()) == first;
            rows.iter()
                .filter(move |(dev, _)| !same || after_device.is_some_and(|a| dev.as_str() > a))
                .map(move |(dev, row)| row.render(job, dev))
        }))
    }

    /// The full twin document (service view, REST shape).
    pub fn twin(&self, id: &TwinId) -> Result<Value, TwinError> {
        self.twin_ref(id).map(|t| t.render())
    }

    /// [`ShardState::twin`] as JSON text, written without building the document first: what a twin
    /// write answers, on every replica (the retry window keeps it).
    pub fn twin_text(&self, id: &TwinId) -> Result<JsonText, TwinError> {
        self.twin_ref(id).map(|t| t.render_text())
    }

    /// [`ShardState::twin_text`] written through serde, as it was before the text writers: the
    /// reference they are checked against (the model tests) and measured against (`render_twin` in
    /// the micro benches).
    pub fn twin_text_via_serde(&self, id: &TwinId) -> Result<JsonText, TwinError> {
        self.twin_ref(id).map(|t| t.render_text_via_serde())
    }

    fn twin_ref<'a>(&'a self, id: &'a TwinId) -> Result<TwinRef<'a>, TwinError> {
        let device = self.device_entry(&id.device_id)?;
        let module = match &id.module_id {
            None => None,
            Some(mid) => Some((
                mid.as_str(),
                device
                    .modules
                    .get(mid)
                    .ok_or_else(|| TwinError::ModuleNotFound { device: id.device_id.clone(), module: mid.clone() })?,
            )),
        };
        Ok(TwinRef { device_id: &id.device_id, device, module })
    }

    /// The device view: `{"desired": {...}, "reported": {...}}` with `$metadata` and `$version`, no tags.
    pub fn twin_properties(&self, id: &TwinId) -> Result<Value, TwinError> {
        self.twin_doc(id).map(|t| t.properties())
    }

    /// Whether an If-Match etag is certainly stale against this (possibly lagging) replica: it names
    /// an older version than the one applied here, or is no etag at all. Etag counters only grow, so
    /// an etag older than a state this replica applied can never match the committed state again;
    /// a newer one may be current (this replica may lag), so it is not judged here.
    pub fn etag_certainly_stale(&self, id: &TwinId, if_match: &str) -> bool {
        match (self.twin_doc(id), etag::etag_counter(if_match)) {
            (Ok(doc), Some(counter)) => counter < doc.etag,
            (Ok(_), None) => true,
            (Err(_), _) => false,
        }
    }

    /// Whether a command with this request id was applied here (recently): a retry of it must reach
    /// apply, which answers the first outcome, rather than be judged again by a pre-check (its own
    /// apply moved the etag it carries).
    pub fn remembers(&self, request_id: &RequestId) -> bool {
        self.dedupe.get(request_id).is_some()
    }

    /// Current twin etag (for If-Match pre-checks before proposing).
    pub fn twin_etag(&self, id: &TwinId) -> Result<String, TwinError> {
        self.twin_doc(id).map(|t| etag::etag_text(t.etag))
    }

    /// A module is usable only while its device is enabled.
    pub fn credentials(&self, id: &TwinId) -> Option<Credentials> {
        let dev = self.devices.get(id.device_id.as_str())?;
        let identity = match &id.module_id {
            None => &dev.identity,
            Some(m) => &dev.modules.get(m)?.identity,
        };
        Some(Credentials {
            primary_key: identity.auth.primary_key.as_deref().map(String::from),
            secondary_key: identity.auth.secondary_key.as_deref().map(String::from),
            enabled: dev.status == Status::Enabled,
            subscriptions: identity.subscriptions.to_vec(),
            auth_type: identity.auth.auth_type.to_string(),
        })
    }

    pub fn stats(&self) -> DeviceStats {
        let total = self.devices.len() as u64;
        let enabled = self.devices.values().filter(|d| d.status == Status::Enabled).count() as u64;
        DeviceStats { total, enabled, disabled: total - enabled }
    }
}

/// Validates a service twin PATCH body (`tags` and/or `properties.desired`) before proposing: limits,
/// key rules, allowed top-level members. The error names the offending path and the limit.
pub fn validate_twin_patch(body: &Value) -> Result<(), TwinError> {
    validate::service_body(&json_tree::Json::of(body)).map(|_| ())
}

/// Validates the sections a bulk registry entry writes (`tags`, `properties.desired`), given as their
/// JSON text, by the same rules as a twin PATCH carrying them, without building that PATCH or their
/// trees (see `validate_text`).
pub fn validate_twin_section_texts(tags: Option<&str>, desired: Option<&str>) -> Result<(), TwinError> {
    if let Some(t) = tags {
        validate_text::check_section_text(t, "tags", validate::MAX_TAGS_SIZE)?;
    }
    if let Some(d) = desired {
        validate_text::check_section_text(d, "properties.desired", validate::MAX_DESIRED_SIZE)?;
    }
    Ok(())
}

/// Validates the text of a service twin PATCH or PUT body (the two follow the same rules) without
/// building its tree: what the front door does before it hands the text on to Raft. Gives the errors
/// [`validate_twin_patch`] gives for the parsed body, and never accepts what that refuses (see
/// `validate_text`).
pub fn validate_twin_body_text(text: &str) -> Result<(), TwinError> {
    validate_text::check_service_text(text)
}

/// Validates a service twin PUT body (replace tags and desired).
pub fn validate_twin_replace(body: &Value) -> Result<(), TwinError> {
    validate::service_body(&json_tree::Json::of(body)).map(|_| ())
}

/// Validates a device reported patch.
pub fn validate_reported_patch(body: &Value) -> Result<(), TwinError> {
    validate::reported_body(&json_tree::Json::of(body)).map(|_| ())
}

/// Validates the text of a device reported patch, read as untrusted JSON into the borrowing tree
/// apply reads it into (see `json_tree`): [`validate_reported_patch`]'s rules, without a `Value`.
pub fn validate_reported_patch_text(text: &str) -> Result<(), TwinError> {
    validate::reported_body(&validate::parse_tree(text)?).map(|_| ())
}

/// Validates a device or module id (≤128 ASCII alnum plus `- : . + % _ # * ? ! ( ) , = @ ; $ '`).
pub fn validate_id(kind: &str, id: &str) -> Result<(), TwinError> {
    validate::validate_id(kind, id)
}
