//! `POST /devices`: the bulk registry operation (an array of up to 100 `ExportImportDevice` entries,
//! each with its `importMode`), answered with `{"isSuccessful", "errors", "warnings"}` — 200 when every
//! entry applied, 400 with the same body when some failed (what the SDKs expect).
//!
//! Entries are validated here first; a malformed entry fails alone. The valid ones are grouped by
//! shard and each group goes through Raft as one command (see `model::bulk`), all shards at once; the
//! groups of the shards another node leads travel to it in one call ([`crate::twin::Twins::write_many`]).
//!
//! An entry's twin sections are checked where they lie in the body and passed on as their text: no
//! JSON tree is built for them here (every replica parses them when it applies the entry).

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::registry::{device_spec, module_spec};
use super::{body, json_response, ApiError, Shared};
use crate::auth::Permission;
use crate::ids::TwinId;
use crate::model::bulk::{BulkEntry, Identity, ImportMode};
use crate::model::{now_ms, validate_id, validate_twin_section_texts, Command, Op, Reply};

/// Entries one call may carry, as IoT Hub allows.
pub const MAX_ENTRIES: usize = 100;

fn bad(msg: String) -> ApiError {
    ApiError::BadRequest(msg)
}

fn opt_string(obj: &Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(bad(format!("{key} must be a string, got {other}"))),
    }
}

/// One `ExportImportDevice` as read from the body: the twin sections as their text, every other
/// member (identity, mode, etags: small) parsed.
struct EntryDoc<'a> {
    /// Always an object.
    fields: Value,
    tags: Option<&'a RawValue>,
    properties: Option<&'a RawValue>,
}

impl<'de> Deserialize<'de> for EntryDoc<'de> {
    fn deserialize<D: Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        struct Entry;
        impl<'de> Visitor<'de> for Entry {
            type Value = EntryDoc<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an ExportImportDevice object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EntryDoc<'de>, A::Error> {
                let (mut fields, mut tags, mut properties) = (Map::new(), None, None);
                // A member given twice: the last one counts, as in a parsed object.
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "tags" => tags = Some(map.next_value()?),
                        "properties" => properties = Some(map.next_value()?),
                        _ => {
                            fields.insert(key, map.next_value()?);
                        }
                    }
                }
                Ok(EntryDoc { fields: Value::Object(fields), tags, properties })
            }
        }
        de.deserialize_map(Entry)
    }
}

/// `properties` of an entry: only `desired` is written.
#[derive(serde::Deserialize)]
struct Properties<'a> {
    #[serde(borrow, default)]
    desired: Option<&'a RawValue>,
}

/// A section's JSON text: `None` when absent or `null`; an error naming `path` when not an object.
fn section<'a>(raw: Option<&'a RawValue>, path: &str) -> Result<Option<&'a str>, ApiError> {
    let Some(text) = raw.map(RawValue::get) else { return Ok(None) };
    match text.as_bytes().first() {
        Some(b'{') => Ok(Some(text)),
        _ if text == "null" => Ok(None),
        _ => {
            let shown: String = text.chars().take(64).collect();
            let more = if shown.len() < text.len() { "…" } else { "" };
            Err(bad(format!("{path} must be a JSON object, got {shown}{more}")))
        }
    }
}

/// The `properties.desired` text of an entry (`None` when `properties` is not an object).
fn desired_section<'a>(properties: Option<&'a RawValue>) -> Result<Option<&'a str>, ApiError> {
    let Some(p) = properties.filter(|p| p.get().starts_with('{')) else { return Ok(None) };
    let props: Properties<'a> =
        serde_json::from_str(p.get()).map_err(|e| bad(format!("properties of the entry: {e}")))?;
    section(props.desired, "properties.desired")
}

/// One `ExportImportDevice` → a validated entry. Identity bodies go through the same parsing as
/// `PUT /devices/{id}` (keys generated where absent), twin sections through the twin patch checks.
fn parse_entry(entry: &EntryDoc<'_>) -> Result<BulkEntry, ApiError> {
    let empty = Map::new();
    let obj = entry.fields.as_object().unwrap_or(&empty);
    let device =
        opt_string(obj, "id")?.filter(|s| !s.is_empty()).ok_or_else(|| bad("id (the device id) is required".into()))?;
    validate_id("device", &device)?;
    let module = opt_string(obj, "moduleId")?.filter(|s| !s.is_empty());
    if let Some(m) = &module {
        validate_id("module", m)?;
    }
    let mode_text = opt_string(obj, "importMode")?.unwrap_or_else(|| "create".into());
    let mode = ImportMode::parse(&mode_text).ok_or_else(|| {
        bad(format!(
            "importMode '{mode_text}' is not one of create, update, updateIfMatchETag, delete, deleteIfMatchETag, updateTwin, updateTwinIfMatchETag"
        ))
    })?;
    let identity = match mode {
        ImportMode::Create | ImportMode::Update | ImportMode::UpdateIfMatchETag => Some(match &module {
            None => Identity::Device(device_spec(&device, &entry.fields)?),
            Some(m) => Identity::Module(module_spec(&device, m, &entry.fields)?),
        }),
        _ => None,
    };
    let tags = section(entry.tags, "tags")?;
    let desired = desired_section(entry.properties)?;
    if matches!(mode, ImportMode::Delete | ImportMode::DeleteIfMatchETag) && (tags.is_some() || desired.is_some()) {
        return Err(bad(format!("importMode {} takes no twin sections", mode.as_str())));
    }
    // The same limits as a twin PATCH (key names, depth, sizes), before anything is proposed.
    validate_twin_section_texts(tags, desired)?;
    Ok(BulkEntry {
        id: match module {
            Some(m) => TwinId::module(device, m),
            None => TwinId::device(device),
        },
        mode,
        identity,
        etag: opt_string(obj, "eTag")?,
        twin_etag: opt_string(obj, "twinETag")?,
        tags_json: tags.map(str::to_owned),
        desired_json: desired.map(str::to_owned),
    })
}

/// `DeviceRegistryOperationError` for entry `id`.
fn error_row(id: &TwinId, mode: Option<ImportMode>, e: &ApiError) -> Value {
    let (_, code) = e.classify();
    let mut row = json!({"deviceId": id.device_id, "errorCode": code, "errorStatus": e.to_string()});
    if let Some(m) = &id.module_id {
        row["moduleId"] = json!(m);
    }
    if let Some(mode) = mode {
        row["operation"] = json!(mode.as_str());
    }
    row
}

/// The identity an unparsable entry names, as far as it can be read (for its error row).
fn named_id(raw: &RawValue) -> TwinId {
    let v: Value = serde_json::from_str(raw.get()).unwrap_or_default();
    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    match s("moduleId") {
        Some(m) => TwinId::module(s("id").unwrap_or_default(), m),
        None => TwinId::device(s("id").unwrap_or_default()),
    }
}

/// The entries of the body, each as its JSON text.
fn entries(bytes: &[u8]) -> Result<Vec<&RawValue>, ApiError> {
    let not_array = || bad("the body must be a JSON array of ExportImportDevice entries".into());
    match serde_json::from_slice::<&RawValue>(bytes) {
        Err(e) => Err(bad(format!("malformed JSON body: {e}"))),
        Ok(doc) if !doc.get().starts_with('[') => Err(not_array()),
        Ok(doc) => serde_json::from_str(doc.get()).map_err(|_| not_array()),
    }
}

pub async fn bulk(
    State(st): State<Shared>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.authorize(&headers, "devices", Permission::RegistryWrite)?;
    let bytes = body::bytes(raw, "ExportImportDevice array")?;
    // The entries' parts are read as `Value`s below: the whole body is first read as untrusted JSON.
    body::check_untrusted(&bytes)?;
    let items = entries(&bytes)?;
    if items.is_empty() || items.len() > MAX_ENTRIES {
        return Err(bad(format!("a bulk call takes 1 to {MAX_ENTRIES} entries, got {}", items.len())));
    }
    // Every entry is read before the twin layer is asked for: parsing needs none of it.
    let parsed: Vec<Result<BulkEntry, ApiError>> = items
        .iter()
        .map(|item| {
            serde_json::from_str::<EntryDoc>(item.get())
                .map_err(|_| bad("each entry must be a JSON object".into()))
                .and_then(|d| parse_entry(&d))
        })
        .collect();
    let twins = st.twins()?;
    let mut errors: Vec<(usize, Value)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut by_shard: BTreeMap<u32, Vec<(usize, BulkEntry)>> = BTreeMap::new();
    for (i, (item, entry)) in items.iter().zip(parsed).enumerate() {
        match entry {
            Ok(entry) => {
                if !seen.insert(entry.id.clone()) {
                    let msg = format!("{} appears more than once in the call", entry.id);
                    errors.push((i, error_row(&entry.id, Some(entry.mode), &bad(msg))));
                    continue;
                }
                by_shard.entry(twins.shard_of(&entry.id.device_id)).or_default().push((i, entry));
            }
            Err(e) => errors.push((i, error_row(&named_id(item), None, &e))),
        }
    }
    let at = now_ms();
    let mut groups = Vec::with_capacity(by_shard.len());
    let mut writes = Vec::with_capacity(by_shard.len());
    for group in by_shard.into_values() {
        let (idx, entries): (Vec<usize>, Vec<BulkEntry>) = group.into_iter().unzip();
        let ids: Vec<(TwinId, ImportMode)> = entries.iter().map(|e| (e.id.clone(), e.mode)).collect();
        writes.push((ids[0].0.clone(), Command::new(Op::Bulk { entries }, at)));
        groups.push((idx, ids));
    }
    let answers = twins.write_many(writes).await;
    for ((idx, ids), answer) in groups.into_iter().zip(answers) {
        let outcome = match answer {
            Ok(applied) => match applied.result.map(Reply::into_bulk) {
                Ok(Ok(o)) if o.len() == ids.len() => Ok(o),
                Ok(Ok(o)) => Err(ApiError::Internal(format!("{} outcomes for {} bulk entries", o.len(), ids.len()))),
                Ok(Err(e)) => Err(ApiError::from(e)),
                Err(e) => Err(ApiError::from(e)),
            },
            Err(e) => Err(ApiError::from(e)),
        };
        match outcome {
            Ok(o) => {
                for ((i, (id, mode)), err) in idx.into_iter().zip(ids).zip(o) {
                    if let Some(e) = err {
                        errors.push((i, error_row(&id, Some(mode), &ApiError::from(e))));
                    }
                }
            }
            // The whole group failed to commit (no leader in time…): every entry says so; a retry
            // of the call is safe, entries that did apply answer with their own errors next time.
            Err(e) => {
                for (i, (id, mode)) in idx.into_iter().zip(ids) {
                    errors.push((i, error_row(&id, Some(mode), &e)));
                }
            }
        }
    }
    errors.sort_by_key(|(i, _)| *i);
    let ok = errors.is_empty();
    let body = json!({
        "isSuccessful": ok,
        "errors": errors.into_iter().map(|(_, r)| r).collect::<Vec<_>>(),
        "warnings": [],
    });
    Ok(json_response(if ok { StatusCode::OK } else { StatusCode::BAD_REQUEST }, &body))
}
