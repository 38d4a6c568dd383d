//! The deterministic apply of each command. Every operation validates and computes its new state
//! first and writes only once nothing can fail any more, so a rejected command changes nothing.

use serde_json::{Map, Value};
use std::borrow::Cow;
use std::sync::Arc;

use super::change::{SectionChange, UpdateBody};
use super::command::{Command, DeviceSpec, IfMatch, ModuleSpec, Op};
use super::doc::{replace_diff, Node};
use super::error::TwinError;
use super::etag::etag_text;
use super::json_tree::{Json, Members};
use super::json_write::{write_json_int, write_key};
use super::packed::{NodeRef, Packed};
use super::registry::{DeviceEntry, Identity, ModuleEntry, TwinDoc};
use super::time::NEVER;
use super::validate::{
    check_size, parse_tree, reported_body, service_body, validate_id, Section, ServiceBody, MAX_DESIRED_SIZE,
    MAX_REPORTED_SIZE, MAX_TAGS_SIZE,
};
use super::{Event, JsonText, Reply, ShardState, MAX_MODULES_PER_DEVICE};
use crate::ids::TwinId;

type Outcome = Result<Reply, TwinError>;

/// `IfMatch::Any` (or none) matches any existing entity; an etag must equal the current one.
/// `what` names the identity in the error; it is formatted only then (every write passes here).
fn check_if_match(if_match: Option<&IfMatch>, current: u64, what: std::fmt::Arguments<'_>) -> Result<(), TwinError> {
    match if_match {
        None | Some(IfMatch::Any) => Ok(()),
        Some(IfMatch::Etag(e)) if *e == etag_text(current) => Ok(()),
        Some(IfMatch::Etag(e)) => {
            Err(TwinError::PreconditionFailed(format!("etag {e} does not match the current etag of {what}")))
        }
    }
}

/// A patch that removes every member of a section: what `"tags": null` / `"desired": null` means.
pub(super) fn clear_patch(section: NodeRef<'_>) -> Members<'static> {
    Members::from_entries(section.members().map(|(k, _)| (Cow::Owned(k.to_string()), Json::Null)).collect())
}

/// The members a section write sets: the body's own (borrowed: a replica nobody listens to never
/// copies them), or every current key removed for a `null` section.
fn effective_patch<'a>(section: Section<'a>, current: NodeRef<'_>) -> Option<Cow<'a, Members<'a>>> {
    match section {
        Section::Absent => None,
        Section::Null => Some(Cow::Owned(clear_patch(current))),
        Section::Object(m) => Some(Cow::Borrowed(m)),
    }
}

fn with_version(mut patch: Map<String, Value>, version: i64) -> Value {
    patch.insert("$version".into(), Value::from(version));
    Value::Object(patch)
}

fn not_found(id: &TwinId) -> TwinError {
    match &id.module_id {
        None => TwinError::DeviceNotFound(id.device_id.clone()),
        Some(m) => TwinError::ModuleNotFound { device: id.device_id.clone(), module: m.clone() },
    }
}

impl ShardState {
    /// Applies one command (no dedupe here); events are produced only by accepted commands.
    pub(super) fn apply_op(&mut self, cmd: &Command, events: &mut Vec<Event>) -> Outcome {
        let at = cmd.timestamp_ms;
        match &cmd.op {
            Op::PutDevice { device, if_match } => self.put_device(cmd, device, if_match.as_ref(), events),
            Op::DeleteDevice { device_id, if_match } => self.delete_device(device_id, if_match.as_ref(), events),
            Op::PutModule { module, if_match } => self.put_module(cmd, module, if_match.as_ref(), events),
            Op::DeleteModule { device_id, module_id, if_match } => {
                self.delete_module(device_id, module_id, if_match.as_ref(), events)
            }
            Op::UpdateTwin { id, patch_json, if_match } => {
                self.update_twin(id, patch_json, if_match.as_ref(), at, events)
            }
            Op::ReplaceTwin { id, twin_json, if_match } => {
                self.replace_twin(id, twin_json, if_match.as_ref(), at, events)
            }
            Op::UpdateReported { id, patch_json } => self.update_reported(id, patch_json, at, events),
            Op::SetConnectionState { id, connected } => self.set_connection(id, *connected, at, events),
            Op::Job(op) => self.jobs.apply(op).map(Reply::Job),
            Op::Certificate(op) => self.certificates.apply(op, cmd.timestamp_ms).map(Reply::Certificate),
            Op::JobUpdateTwin { job_id, job_type, created_ms, start_ms, device_id, patch_json } => {
                if self.device_jobs.get(job_id).is_some_and(|rows| rows.contains_key(device_id)) {
                    return Ok(Reply::Done);
                }
                let mut changed = Vec::new();
                let r = self.patch_twin(&TwinId::device(device_id.clone()), patch_json, None, at, &mut changed);
                let row = super::jobs::DeviceJobRow {
                    job_type: job_type.clone(),
                    succeeded: r.is_ok(),
                    created_ms: *created_ms,
                    start_ms: *start_ms,
                    end_ms: at,
                    error: r.err().map(|e| e.to_string()),
                    running: false,
                    method_response_json: None,
                };
                events.extend(changed);
                self.device_jobs.entry(job_id.clone()).or_default().insert(device_id.clone(), row);
                Ok(Reply::Done)
            }
            Op::Bulk { entries } => Ok(Reply::Bulk(self.apply_bulk(cmd, entries, events))),
            Op::Configuration(op) => self.configs.apply(op, at).map(Reply::Configuration),
            Op::RestoreDevices { page_json, .. } => {
                let page: super::backup::BackupPage = serde_json::from_str(page_json)
                    .map_err(|e| TwinError::InvalidArgument(format!("a restore page is not valid: {e}")))?;
                self.restore_page(&page);
                Ok(Reply::Done)
            }
            Op::RestoreMeta { meta_json } => {
                let meta: super::backup::MetaBackup = serde_json::from_str(meta_json)
                    .map_err(|e| TwinError::InvalidArgument(format!("restored metadata is not valid: {e}")))?;
                self.restore_meta(&meta)?;
                Ok(Reply::Done)
            }
            Op::SetSubscriptions { id, filters } => {
                let bytes: usize = filters.iter().map(|(f, _)| f.len()).sum();
                if filters.len() > MAX_STORED_SUBSCRIPTIONS || bytes > MAX_STORED_FILTER_BYTES {
                    return Err(TwinError::InvalidArgument(format!(
                        "a session keeps at most {MAX_STORED_SUBSCRIPTIONS} subscriptions of {MAX_STORED_FILTER_BYTES} bytes in all"
                    )));
                }
                self.identity_mut(id)?.subscriptions = filters.as_slice().into();
                Ok(Reply::Done)
            }
            Op::PutDeviceWithParent { device, parent_scope, if_match } => {
                self.write_device(cmd, device, if_match.as_ref(), events)?;
                let entry = self
                    .devices
                    .get_mut(device.device_id.as_str())
                    .map(Arc::make_mut)
                    .ok_or_else(|| TwinError::DeviceNotFound(device.device_id.clone()))?;
                let parents: Box<[String]> = parent_scope.iter().cloned().collect();
                if entry.iot_edge {
                    entry.scopes.parent_scopes = parents;
                } else {
                    entry.scopes = super::registry::Scopes {
                        device_scope: parent_scope.as_deref().map(Into::into),
                        parent_scopes: parents,
                    };
                }
                Ok(Reply::Device(entry.render(&device.device_id)))
            }
            Op::ApplyConfiguration { device_id, marks, apply } => {
                self.apply_configuration(device_id, marks, apply.as_ref(), at, events)
            }
            Op::JobMethodClaim { job_id, job_type, created_ms, start_ms, device_id } => {
                if let Some(row) = self.device_jobs.get(job_id).and_then(|rows| rows.get(device_id)) {
                    return Ok(Reply::Claim { claimed: false, running: row.running });
                }
                let exists = self.devices.contains_key(device_id.as_str());
                let row = super::jobs::DeviceJobRow {
                    job_type: job_type.clone(),
                    succeeded: false,
                    created_ms: *created_ms,
                    start_ms: *start_ms,
                    end_ms: at,
                    error: (!exists).then(|| TwinError::DeviceNotFound(device_id.clone()).to_string()),
                    running: exists,
                    method_response_json: None,
                };
                self.device_jobs.entry(job_id.clone()).or_default().insert(device_id.clone(), row);
                Ok(Reply::Claim { claimed: exists, running: false })
            }
            Op::JobMethodResult { job_id, device_id, outcome } => {
                if let Some(row) = self.device_jobs.get_mut(job_id).and_then(|rows| rows.get_mut(device_id)) {
                    if row.running {
                        row.running = false;
                        row.end_ms = at;
                        match outcome {
                            Ok((status, payload_json)) => {
                                // A device's text: read as untrusted, as the front door read it.
                                let payload =
                                    super::json_tree::parse_untrusted(payload_json).unwrap_or(serde_json::Value::Null);
                                row.succeeded = true;
                                row.method_response_json =
                                    Some(serde_json::json!({"status": status, "payload": payload}).to_string());
                            }
                            Err(e) => row.error = Some(e.clone()),
                        }
                    }
                }
                Ok(Reply::Done)
            }
            Op::Cluster(op) => {
                self.cluster.apply(op).map(|()| Reply::Done).map_err(|e| TwinError::InvalidArgument(e.to_string()))
            }
            // `ShardState::apply` unpacks a batch before it gets here; only one inside a batch arrives.
            Op::Batch { .. } => Err(TwinError::InvalidArgument("a batch of commands cannot hold another batch".into())),
        }
    }

    fn next_etag(&mut self) -> u64 {
        self.etag_seq += 1;
        self.etag_seq
    }

    pub(super) fn twin_doc(&self, id: &TwinId) -> Result<&TwinDoc, TwinError> {
        let dev =
            self.devices.get(id.device_id.as_str()).ok_or_else(|| TwinError::DeviceNotFound(id.device_id.clone()))?;
        match &id.module_id {
            None => Ok(&dev.twin),
            Some(m) => dev.modules.get(m).map(|m| &m.twin).ok_or_else(|| not_found(id)),
        }
    }

    fn twin_doc_mut(&mut self, id: &TwinId) -> Result<&mut TwinDoc, TwinError> {
        let dev = self
            .devices
            .get_mut(id.device_id.as_str())
            .map(Arc::make_mut)
            .ok_or_else(|| TwinError::DeviceNotFound(id.device_id.clone()))?;
        match &id.module_id {
            None => Ok(&mut dev.twin),
            Some(m) => dev.modules.get_mut(m).map(|m| &mut m.twin).ok_or_else(|| not_found(id)),
        }
    }

    /// Moves a device twin's entries in the tag index from its current tags to `new` (call just
    /// before the twin takes them; module twins are not indexed).
    fn retag(&mut self, id: &TwinId, new: &Packed) {
        if id.module_id.is_none() {
            if let Some((key, dev)) = self.devices.get_key_value(id.device_id.as_str()) {
                self.tag_index.remove(key, dev.twin.tags.root());
                self.tag_index.add(key, new.root());
            }
        }
    }

    fn identity_mut(&mut self, id: &TwinId) -> Result<&mut Identity, TwinError> {
        let dev = self
            .devices
            .get_mut(id.device_id.as_str())
            .map(Arc::make_mut)
            .ok_or_else(|| TwinError::DeviceNotFound(id.device_id.clone()))?;
        match &id.module_id {
            None => Ok(&mut dev.identity),
            Some(m) => dev.modules.get_mut(m).map(|m| &mut m.identity).ok_or_else(|| not_found(id)),
        }
    }

    pub(super) fn put_device(
        &mut self,
        cmd: &Command,
        spec: &DeviceSpec,
        if_match: Option<&IfMatch>,
        events: &mut Vec<Event>,
    ) -> Outcome {
        let id = spec.device_id.as_str();
        self.write_device(cmd, spec, if_match, events)?;
        let entry = self.devices.get(id).ok_or_else(|| TwinError::DeviceNotFound(id.to_string()))?;
        Ok(Reply::Device(entry.render(id)))
    }

    /// Creates or overwrites a device identity without rendering it: a bulk entry answers only its
    /// error, and rendering a device it does not answer was a large part of a bulk load's apply.
    pub(super) fn write_device(
        &mut self,
        cmd: &Command,
        spec: &DeviceSpec,
        if_match: Option<&IfMatch>,
        events: &mut Vec<Event>,
    ) -> Result<(), TwinError> {
        let id = spec.device_id.as_str();
        validate_id("device", id)?;
        match (self.devices.get(id), if_match) {
            (Some(_), None) => Err(TwinError::DeviceAlreadyExists(id.to_string())),
            (None, Some(_)) => Err(TwinError::DeviceNotFound(id.to_string())),
            (None, None) => {
                let identity_etag = self.next_etag();
                let twin_etag = self.next_etag();
                let mut entry = DeviceEntry {
                    identity: Identity::new(spec.auth.clone(), cmd.request_id, identity_etag),
                    status: spec.status,
                    status_reason: spec.status_reason.as_deref().map(Into::into),
                    status_updated: NEVER,
                    iot_edge: spec.iot_edge,
                    twin: TwinDoc::new(twin_etag),
                    modules: Default::default(),
                    scopes: Default::default(),
                };
                set_edge_scope(&mut entry, id, cmd);
                if !self.quiet {
                    events.push(Event::Lifecycle {
                        id: TwinId::device(id),
                        op_type: "createDeviceIdentity".into(),
                        body: entry.render_twin(id, None),
                    });
                }
                let id = super::DeviceKey::from(id);
                self.tag_index.add(&id, entry.twin.tags.root());
                self.devices.insert(id, Arc::new(entry));
                Ok(())
            }
            (Some(existing), Some(im)) => {
                check_if_match(Some(im), existing.identity.etag, format_args!("device {id}"))?;
                let etag = self.next_etag();
                let entry = self
                    .devices
                    .get_mut(id)
                    .map(Arc::make_mut)
                    .ok_or_else(|| TwinError::DeviceNotFound(id.to_string()))?;
                if entry.status != spec.status {
                    entry.status_updated = cmd.timestamp_ms;
                }
                entry.status = spec.status;
                entry.status_reason = spec.status_reason.as_deref().map(Into::into);
                entry.iot_edge = spec.iot_edge;
                set_edge_scope(entry, id, cmd);
                entry.identity.auth = merged_auth(&entry.identity.auth, &spec.auth);
                entry.identity.etag = etag;
                Ok(())
            }
        }
    }

    pub(super) fn delete_device(&mut self, id: &str, if_match: Option<&IfMatch>, events: &mut Vec<Event>) -> Outcome {
        let dev = self.devices.get(id).ok_or_else(|| TwinError::DeviceNotFound(id.to_string()))?;
        check_if_match(if_match, dev.identity.etag, format_args!("device {id}"))?;
        if !self.quiet {
            for (mid, m) in &dev.modules {
                events.push(Event::Lifecycle {
                    id: TwinId::module(id, mid.as_str()),
                    op_type: "deleteModuleIdentity".into(),
                    body: dev.render_twin(id, Some((mid, m))),
                });
            }
            events.push(Event::Lifecycle {
                id: TwinId::device(id),
                op_type: "deleteDeviceIdentity".into(),
                body: dev.render_twin(id, None),
            });
        }
        if let Some(dev) = self.devices.remove(id) {
            self.tag_index.remove(id, dev.twin.tags.root());
        }
        Ok(Reply::Done)
    }

    pub(super) fn put_module(
        &mut self,
        cmd: &Command,
        spec: &ModuleSpec,
        if_match: Option<&IfMatch>,
        events: &mut Vec<Event>,
    ) -> Outcome {
        let (did, mid) = (spec.device_id.as_str(), spec.module_id.as_str());
        validate_id("device", did)?;
        validate_id("module", mid)?;
        let dev = self.devices.get(did).ok_or_else(|| TwinError::DeviceNotFound(did.to_string()))?;
        let module_err = |e: fn(String, String) -> TwinError| e(did.to_string(), mid.to_string());
        match (dev.modules.get(mid), if_match) {
            (Some(_), None) => Err(module_err(|device, module| TwinError::ModuleAlreadyExists { device, module })),
            (None, Some(_)) => Err(module_err(|device, module| TwinError::ModuleNotFound { device, module })),
            (None, None) => {
                if dev.modules.len() >= MAX_MODULES_PER_DEVICE {
                    return Err(TwinError::TooManyModulesOnDevice {
                        device: did.to_string(),
                        max: MAX_MODULES_PER_DEVICE,
                    });
                }
                let identity_etag = self.next_etag();
                let twin_etag = self.next_etag();
                let entry = ModuleEntry {
                    identity: Identity::new(spec.auth.clone(), cmd.request_id, identity_etag),
                    managed_by: spec.managed_by.clone(),
                    twin: TwinDoc::new(twin_etag),
                };
                let quiet = self.quiet;
                let dev = self
                    .devices
                    .get_mut(did)
                    .map(Arc::make_mut)
                    .ok_or_else(|| TwinError::DeviceNotFound(did.to_string()))?;
                if !quiet {
                    events.push(Event::Lifecycle {
                        id: TwinId::module(did, mid),
                        op_type: "createModuleIdentity".into(),
                        body: dev.render_twin(did, Some((mid, &entry))),
                    });
                }
                let doc = entry.render(did, mid);
                dev.modules.insert(mid.to_string(), entry);
                Ok(Reply::Module(doc))
            }
            (Some(existing), Some(im)) => {
                check_if_match(Some(im), existing.identity.etag, format_args!("module {mid} on device {did}"))?;
                let etag = self.next_etag();
                let entry = self
                    .devices
                    .get_mut(did)
                    .and_then(|d| Arc::make_mut(d).modules.get_mut(mid))
                    .ok_or_else(|| module_err(|device, module| TwinError::ModuleNotFound { device, module }))?;
                entry.identity.auth = merged_auth(&entry.identity.auth, &spec.auth);
                entry.managed_by = spec.managed_by.clone();
                entry.identity.etag = etag;
                Ok(Reply::Module(entry.render(did, mid)))
            }
        }
    }

    pub(super) fn delete_module(
        &mut self,
        did: &str,
        mid: &str,
        if_match: Option<&IfMatch>,
        events: &mut Vec<Event>,
    ) -> Outcome {
        let id = TwinId::module(did, mid);
        let dev = self.devices.get(did).ok_or_else(|| TwinError::DeviceNotFound(did.to_string()))?;
        let m = dev.modules.get(mid).ok_or_else(|| not_found(&id))?;
        check_if_match(if_match, m.identity.etag, format_args!("module {mid} on device {did}"))?;
        if !self.quiet {
            let body = dev.render_twin(did, Some((mid, m)));
            events.push(Event::Lifecycle { id, op_type: "deleteModuleIdentity".into(), body });
        }
        if let Some(dev) = self.devices.get_mut(did) {
            Arc::make_mut(dev).modules.remove(mid);
        }
        Ok(Reply::Done)
    }

    /// Sets a device twin's configuration marks and, for a configuration it newly applies, merges the
    /// configuration's desired patch like a service PATCH. A device deleted meanwhile is skipped.
    fn apply_configuration(
        &mut self,
        device_id: &str,
        marks: &std::collections::BTreeMap<String, String>,
        apply: Option<&(String, String)>,
        at: i64,
        events: &mut Vec<Event>,
    ) -> Outcome {
        let id = TwinId::device(device_id.to_string());
        let Ok(twin) = self.twin_doc(&id) else { return Ok(Reply::Done) };
        let newly = apply
            .filter(|(cfg, _)| twin.configurations.get().get(cfg).map(String::as_str) != Some(super::config::APPLIED));
        if let Some((_, patch)) = newly {
            let body = format!(r#"{{"properties":{{"desired":{patch}}}}}"#);
            self.patch_twin(&id, &body, None, at, events)?;
        }
        self.twin_doc_mut(&id)?.configurations.set(marks.clone());
        Ok(Reply::Done)
    }

    pub(super) fn update_twin(
        &mut self,
        id: &TwinId,
        json: &str,
        if_match: Option<&IfMatch>,
        at: i64,
        events: &mut Vec<Event>,
    ) -> Outcome {
        self.patch_twin(id, json, if_match, at, events)?;
        Ok(Reply::Twin(self.twin_text(id)?))
    }

    /// [`ShardState::update_twin`] without rendering the twin it answers: a bulk registry entry
    /// answers only its error, and rendering each twin was most of a bulk call's apply (and of a
    /// restart's replay of it).
    pub(super) fn patch_twin(
        &mut self,
        id: &TwinId,
        json: &str,
        if_match: Option<&IfMatch>,
        at: i64,
        events: &mut Vec<Event>,
    ) -> Result<(), TwinError> {
        let body = parse_tree(json)?;
        self.patch_twin_sections(id, service_body(&body)?, if_match, at, events)
    }

    /// [`Self::patch_twin`] with the sections already parsed and checked (a bulk entry's were checked
    /// before they were proposed); the merged sections' sizes are checked here.
    pub(super) fn patch_twin_sections(
        &mut self,
        id: &TwinId,
        sb: ServiceBody<'_>,
        if_match: Option<&IfMatch>,
        at: i64,
        events: &mut Vec<Event>,
    ) -> Result<(), TwinError> {
        let cur = self.twin_doc(id)?;
        check_if_match(if_match, cur.etag, format_args!("twin {id}"))?;
        let tags_patch = effective_patch(sb.tags, cur.tags.root());
        let desired_patch = effective_patch(sb.desired, cur.desired.root());
        if tags_patch.is_none() && desired_patch.is_none() {
            return Ok(());
        }
        let version = cur.version + 1;
        let desired_version = cur.desired_version + i64::from(desired_patch.is_some());
        let tags = match &tags_patch {
            Some(p) => {
                let n = cur.tags.merged(p, at, 0);
                check_size("tags", n.root().size(), MAX_TAGS_SIZE)?;
                Some(n)
            }
            None => None,
        };
        let desired = match &desired_patch {
            Some(p) => {
                let n = cur.desired.merged(p, at, desired_version);
                check_size("properties.desired", n.root().size(), MAX_DESIRED_SIZE)?;
                Some(n)
            }
            None => None,
        };
        let etag = self.next_etag();
        if let Some(t) = &tags {
            self.retag(id, t);
        }
        let quiet = self.quiet;
        let twin = self.twin_doc_mut(id)?;
        twin.etag = etag;
        twin.version = version;
        twin.desired_version = desired_version;
        if let Some(t) = tags {
            twin.tags = t;
        }
        if let Some(d) = desired {
            twin.desired = d;
        }
        if quiet {
            return Ok(());
        }
        let body = UpdateBody {
            version,
            tags: tags_patch.as_deref(),
            properties: desired_patch.as_deref().map(|patch| SectionChange {
                name: "desired",
                patch,
                node: twin.desired.root(),
                version: desired_version,
                with_version: true,
            }),
        }
        .to_text();
        events.push(Event::TwinChanged { id: id.clone(), op_type: "updateTwin".into(), body, version });
        if let Some(p) = desired_patch {
            let patch = JsonText::written(|out| {
                // Patch keys never start with `$` (validation refuses it): `$version` comes last, as
                // a map of the patch with it inserted would write it.
                out.push(b'{');
                let mut first = true;
                p.write_member_list(out, &mut first);
                write_key(out, &mut first, b"$version");
                write_json_int(out, desired_version);
                out.push(b'}');
                Ok(())
            });
            events.push(Event::DesiredPatch { id: id.clone(), patch, desired_version });
        }
        Ok(())
    }

    fn replace_twin(
        &mut self,
        id: &TwinId,
        json: &str,
        if_match: Option<&IfMatch>,
        at: i64,
        events: &mut Vec<Event>,
    ) -> Outcome {
        let body = parse_tree(json)?;
        let sb = service_body(&body)?;
        let cur = self.twin_doc(id)?;
        check_if_match(if_match, cur.etag, format_args!("twin {id}"))?;
        let empty = Map::new();
        let section_map = |s: Section<'_>| match s {
            Section::Object(m) => m.to_map(),
            Section::Absent | Section::Null => empty.clone(),
        };
        let (tags_map, desired_map) = (section_map(sb.tags), section_map(sb.desired));
        let version = cur.version + 1;
        let desired_version = cur.desired_version + 1;
        let tags = Packed::pack(&Node::section_from_map(&tags_map, at, 0));
        check_size("tags", tags.root().size(), MAX_TAGS_SIZE)?;
        let desired = Packed::pack(&Node::section_from_map(&desired_map, at, desired_version));
        check_size("properties.desired", desired.root().size(), MAX_DESIRED_SIZE)?;
        let diff = replace_diff(&cur.desired.root().to_map(), &desired_map);
        let etag = self.next_etag();
        self.retag(id, &tags);
        let twin = self.twin_doc_mut(id)?;
        twin.etag = etag;
        twin.version = version;
        twin.desired_version = desired_version;
        twin.tags = tags;
        twin.desired = desired;
        let reply = self.twin_text(id)?;
        if !self.quiet {
            // The full twin: the document the reply already is.
            let body = reply.clone();
            events.push(Event::TwinChanged { id: id.clone(), op_type: "replaceTwin".into(), body, version });
            let patch = JsonText::render(&with_version(diff, desired_version));
            events.push(Event::DesiredPatch { id: id.clone(), patch, desired_version });
        }
        Ok(Reply::Twin(reply))
    }

    fn update_reported(&mut self, id: &TwinId, json: &str, at: i64, events: &mut Vec<Event>) -> Outcome {
        let body = parse_tree(json)?;
        let patch = reported_body(&body)?;
        let cur = self.twin_doc(id)?;
        let version = cur.version + 1;
        let reported_version = cur.reported_version + 1;
        let reported = cur.reported.merged(patch, at, reported_version);
        check_size("properties.reported", reported.root().size(), MAX_REPORTED_SIZE)?;
        // A reported patch is device activity: `lastActivityTime` follows it, at the command's own
        // timestamp so that every replica writes the same value.
        self.identity_mut(id)?.last_activity = at;
        let quiet = self.quiet;
        let twin = self.twin_doc_mut(id)?;
        twin.version = version;
        twin.reported_version = reported_version;
        twin.reported = reported;
        if quiet {
            return Ok(Reply::Reported { version: reported_version });
        }
        let body = UpdateBody {
            version,
            tags: None,
            properties: Some(SectionChange {
                name: "reported",
                patch,
                node: twin.reported.root(),
                version: reported_version,
                with_version: false,
            }),
        }
        .to_text();
        events.push(Event::TwinChanged { id: id.clone(), op_type: "updateTwin".into(), body, version });
        Ok(Reply::Reported { version: reported_version })
    }

    fn set_connection(&mut self, id: &TwinId, connected: bool, at: i64, events: &mut Vec<Event>) -> Outcome {
        let identity = self.identity_mut(id)?;
        identity.connected = connected;
        identity.connection_state_updated = at;
        identity.last_activity = at;
        if !self.quiet {
            events.push(Event::Connection { id: id.clone(), connected });
        }
        Ok(Reply::Done)
    }
}

/// An update keeps the keys it was not given: the front door generates keys only on create, and an
/// update that names no keys (e.g. a status change) must not erase them.
fn merged_auth(old: &super::command::AuthSpec, new: &super::command::AuthSpec) -> super::command::AuthSpec {
    let mut a = new.clone();
    if a.auth_type == old.auth_type {
        a.primary_key = a.primary_key.or_else(|| old.primary_key.clone());
        a.secondary_key = a.secondary_key.or_else(|| old.secondary_key.clone());
        a.primary_thumbprint = a.primary_thumbprint.or_else(|| old.primary_thumbprint.clone());
        a.secondary_thumbprint = a.secondary_thumbprint.or_else(|| old.secondary_thumbprint.clone());
    }
    a
}

/// An edge device keeps (or gets, from the command's request id, so every replica picks the same) its
/// own edge scope; a device that stops being an edge device loses it (a leaf's parent scope stays).
fn set_edge_scope(entry: &mut DeviceEntry, device_id: &str, cmd: &Command) {
    let own = entry.scopes.device_scope.as_deref().and_then(super::registry::edge_scope_device) == Some(device_id);
    if entry.iot_edge && !own {
        entry.scopes.device_scope =
            Some(super::registry::edge_scope(device_id, cmd.request_id.0 as u64 % 1_000_000_000_000_000).into());
    } else if !entry.iot_edge && own {
        entry.scopes.device_scope = None;
    }
}

/// Bounds of a stored session (the MQTT endpoint enforces the same per live session).
pub const MAX_STORED_SUBSCRIPTIONS: usize = 32;
pub const MAX_STORED_FILTER_BYTES: usize = 2048;
