//! Identity registry routes (docs/iothub-protocol.md §3.1) and statistics.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Map, Value};

use super::path::Path;
use super::{body, ok_json, ApiError, Shared};
use crate::auth::{generate_key, Permission};
use crate::ids::TwinId;
use crate::model::{
    now_ms, validate_id, AuthSpec, AuthType, Command, DeviceSpec, IfMatch, ModuleSpec, Op, Reply, Status, TwinError,
};
use crate::twin::read::ReadOp;

/// `GET /devices?top=N`: default and maximum.
const MAX_LIST: usize = 1000;

/// The request's `If-Match` condition, if it sent one. A header that is not visible ASCII (an entity tag
/// never is anything else) is refused rather than taken as no condition.
pub fn if_match(headers: &HeaderMap) -> Result<Option<IfMatch>, ApiError> {
    let Some(v) = headers.get(axum::http::header::IF_MATCH) else { return Ok(None) };
    let text =
        v.to_str().map_err(|_| ApiError::BadRequest("the If-Match header is not an entity tag in ASCII".into()))?;
    Ok(Some(IfMatch::parse_header(text)))
}

/// Proposes `cmd` through the twin layer and unwraps the model's verdict.
pub async fn propose(st: &Shared, id: &TwinId, cmd: Command) -> Result<Reply, ApiError> {
    let applied = st.twins()?.write(id, cmd).await?;
    Ok(applied.result?)
}

pub async fn get_device(
    State(st): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.authorize(&headers, &format!("devices/{id}"), Permission::RegistryRead)?;
    let doc = st.twins()?.device(&id).await?;
    let doc = doc.ok_or_else(|| TwinError::DeviceNotFound(id.clone()))?;
    Ok(ok_json(&doc))
}

pub async fn list_devices(
    State(st): State<Shared>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.authorize(&headers, "devices", Permission::RegistryRead)?;
    let Query(q) = query.map_err(|e| ApiError::BadRequest(format!("malformed query string: {e}")))?;
    let top = match q.get("top") {
        None => MAX_LIST,
        Some(t) => t
            .parse::<usize>()
            .map_err(|_| ApiError::BadRequest(format!("top must be a non-negative integer, got '{t}'")))?
            .min(MAX_LIST),
    };
    let twins = st.twins()?;
    let mut all: Vec<Value> = Vec::new();
    // Each shard returns its first `top` in id order; the global first `top` are among them.
    for shard in 0..twins.shard_count() {
        all.extend(twins.docs(shard, ReadOp::Devices { after: None, limit: top }).await??);
    }
    all.sort_by(|a, b| a["deviceId"].as_str().unwrap_or("").cmp(b["deviceId"].as_str().unwrap_or("")));
    all.truncate(top);
    Ok(ok_json(&Value::Array(all)))
}

pub async fn put_device(
    State(st): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.authorize(&headers, &format!("devices/{id}"), Permission::RegistryWrite)?;
    validate_id("device", &id)?;
    let doc = body::json(raw, "Device")?;
    let device = device_spec(&id, &doc)?;
    let op = match requested_parent(&id, device.iot_edge, &doc)? {
        // Neither field in the body: the device keeps the parent it has.
        None => Op::PutDevice { device, if_match: if_match(&headers)? },
        Some(parent) => {
            if let Some(p) = &parent {
                check_parent(&st, &id, p).await?;
            }
            Op::PutDeviceWithParent { device, parent_scope: parent, if_match: if_match(&headers)? }
        }
    };
    let cmd = Command::new(op, now_ms());
    Ok(ok_json(&propose(&st, &TwinId::device(id), cmd).await?.into_device()?))
}

pub async fn delete_device(
    State(st): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.authorize(&headers, &format!("devices/{id}"), Permission::RegistryWrite)?;
    let cmd = Command::new(Op::DeleteDevice { device_id: id.clone(), if_match: if_match(&headers)? }, now_ms());
    propose(&st, &TwinId::device(id), cmd).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub async fn list_modules(
    State(st): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.authorize(&headers, &format!("devices/{id}/modules"), Permission::RegistryRead)?;
    let modules = st.twins()?.docs(st.twins()?.shard_of(&id), ReadOp::Modules(id.clone())).await??;
    Ok(ok_json(&Value::Array(modules)))
}

pub async fn get_module(
    State(st): State<Shared>,
    Path((id, mid)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.authorize(&headers, &format!("devices/{id}/modules/{mid}"), Permission::RegistryRead)?;
    let doc = st.twins()?.doc(&id, ReadOp::Module(id.clone(), mid.clone())).await??;
    Ok(ok_json(&doc))
}

pub async fn put_module(
    State(st): State<Shared>,
    Path((id, mid)): Path<(String, String)>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.authorize(&headers, &format!("devices/{id}/modules/{mid}"), Permission::RegistryWrite)?;
    validate_id("device", &id)?;
    validate_id("module", &mid)?;
    let doc = body::json(raw, "Module")?;
    let module = module_spec(&id, &mid, &doc)?;
    let cmd = Command::new(Op::PutModule { module, if_match: if_match(&headers)? }, now_ms());
    Ok(ok_json(&propose(&st, &TwinId::module(id, mid), cmd).await?.into_module()?))
}

pub async fn delete_module(
    State(st): State<Shared>,
    Path((id, mid)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.authorize(&headers, &format!("devices/{id}/modules/{mid}"), Permission::RegistryWrite)?;
    let op = Op::DeleteModule { device_id: id.clone(), module_id: mid.clone(), if_match: if_match(&headers)? };
    propose(&st, &TwinId::module(id, mid), Command::new(op, now_ms())).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub async fn device_stats(State(st): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    st.authorize(&headers, "statistics", Permission::RegistryRead)?;
    let (mut total, mut enabled, mut disabled) = (0u64, 0u64, 0u64);
    let twins = st.twins()?;
    for shard in 0..twins.shard_count() {
        let s = twins.stats(shard).await?;
        total += s.total;
        enabled += s.enabled;
        disabled += s.disabled;
    }
    Ok(ok_json(&json!({"totalDeviceCount": total, "enabledDeviceCount": enabled, "disabledDeviceCount": disabled})))
}

/// Identities with an open MQTT connection on this node (each connection registers for desired pushes).
pub async fn service_stats(State(st): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    st.authorize(&headers, "statistics", Permission::RegistryRead)?;
    let connected = st.hub.as_ref().map_or(0, |h| h.connected_devices());
    Ok(ok_json(&json!({"connectedDeviceCount": connected})))
}

fn bad(msg: String) -> ApiError {
    ApiError::BadRequest(msg)
}

fn opt_str(obj: &Map<String, Value>, key: &str, path: &str) -> Result<Option<String>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(bad(format!("{path}{key} must be a string, got {other}"))),
    }
}

fn object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>, ApiError> {
    v.as_object().ok_or_else(|| bad(format!("{path} must be a JSON object")))
}

/// The body's id, if given, must name the same identity as the URL.
fn check_body_id(obj: &Map<String, Value>, key: &str, expected: &str) -> Result<(), ApiError> {
    match opt_str(obj, key, "")? {
        Some(given) if !given.is_empty() && given != expected => {
            Err(bad(format!("{key} '{given}' in the body does not match '{expected}' in the URL")))
        }
        _ => Ok(()),
    }
}

pub fn device_spec(id: &str, doc: &Value) -> Result<DeviceSpec, ApiError> {
    let obj = object(doc, "the Device body")?;
    check_body_id(obj, "deviceId", id)?;
    let status = match opt_str(obj, "status", "")?.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("enabled") => Status::Enabled,
        Some("disabled") => Status::Disabled,
        Some(other) => return Err(bad(format!("status must be 'enabled' or 'disabled', got '{other}'"))),
    };
    let iot_edge = match obj.get("capabilities").and_then(|c| c.get("iotEdge")) {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(bad(format!("capabilities.iotEdge must be a boolean, got {other}"))),
    };
    Ok(DeviceSpec {
        device_id: id.to_string(),
        status,
        status_reason: opt_str(obj, "statusReason", "")?,
        auth: auth_spec(obj.get("authentication"))?,
        iot_edge,
    })
}

/// The parent a Device body asks for: `None` when it has neither `deviceScope` nor `parentScopes`
/// (keep the current one); `Some(None)` for no parent; `Some(Some(scope))` for the edge device whose
/// scope it names. A leaf names its parent in `deviceScope` (`parentScopes` may repeat it); an edge
/// device in `parentScopes` (its `deviceScope` is its own, assigned by the hub).
fn requested_parent(id: &str, iot_edge: bool, doc: &Value) -> Result<Option<Option<String>>, ApiError> {
    let scope = match doc.get("deviceScope") {
        None => None,
        Some(Value::Null) => Some(None),
        Some(Value::String(s)) => Some((!s.is_empty()).then(|| s.clone())),
        Some(other) => return Err(bad(format!("deviceScope must be a string, got {other}"))),
    };
    let parents = match doc.get("parentScopes") {
        None => None,
        Some(Value::Null) => Some(Vec::new()),
        Some(Value::Array(a)) => Some(
            a.iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| bad(format!("parentScopes must hold strings, got {v}")))
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(other) => return Err(bad(format!("parentScopes must be an array, got {other}"))),
    };
    if scope.is_none() && parents.is_none() {
        return Ok(None);
    }
    let parents = parents.unwrap_or_default();
    if parents.len() > 1 {
        return Err(bad("parentScopes may name one parent".into()));
    }
    let listed = parents.into_iter().next();
    if iot_edge {
        if let Some(Some(s)) = &scope {
            if crate::model::edge_scope_device(s) != Some(id) {
                return Err(bad(format!(
                    "an edge device's deviceScope is its own (assigned by the hub), not '{s}'; name its parent in parentScopes"
                )));
            }
        }
        return Ok(Some(listed));
    }
    match (scope.flatten(), listed) {
        (Some(s), Some(p)) if s != p => Err(bad(format!("parentScopes ['{p}'] differs from deviceScope '{s}'"))),
        (Some(s), _) | (None, Some(s)) => Ok(Some(Some(s))),
        (None, None) => Ok(Some(None)),
    }
}

/// A parent scope must be the current scope of another device that is an edge device.
async fn check_parent(st: &Shared, id: &str, scope: &str) -> Result<(), ApiError> {
    let not_edge = || bad(format!("'{scope}' is not the scope of an edge device"));
    let parent = crate::model::edge_scope_device(scope).ok_or_else(not_edge)?;
    if parent == id {
        return Err(bad(format!("device {id} cannot be its own parent")));
    }
    let doc = st.twins()?.device(parent).await?.ok_or_else(not_edge)?;
    let is_edge = doc.pointer("/capabilities/iotEdge").and_then(Value::as_bool) == Some(true);
    if !is_edge || doc.get("deviceScope").and_then(Value::as_str) != Some(scope) {
        return Err(not_edge());
    }
    Ok(())
}

pub fn module_spec(id: &str, mid: &str, doc: &Value) -> Result<ModuleSpec, ApiError> {
    let obj = object(doc, "the Module body")?;
    check_body_id(obj, "deviceId", id)?;
    check_body_id(obj, "moduleId", mid)?;
    Ok(ModuleSpec {
        device_id: id.to_string(),
        module_id: mid.to_string(),
        managed_by: opt_str(obj, "managedBy", "")?,
        auth: auth_spec(obj.get("authentication"))?,
    })
}

/// `authentication` of a Device or Module. For `sas`, missing or empty keys are generated here, before
/// proposing, so that apply stays deterministic.
fn auth_spec(v: Option<&Value>) -> Result<AuthSpec, ApiError> {
    let empty = Map::new();
    let obj = match v {
        None | Some(Value::Null) => &empty,
        Some(v) => object(v, "authentication")?,
    };
    let auth_type = match opt_str(obj, "type", "authentication.")? {
        None => AuthType::Sas,
        Some(name) => AuthType::parse(&name).ok_or_else(|| {
            bad(format!("authentication.type must be sas, selfSigned, certificateAuthority or none, got '{name}'"))
        })?,
    };
    let sub = |key: &str| -> Result<&Map<String, Value>, ApiError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(&empty),
            Some(v) => object(v, &format!("authentication.{key}")),
        }
    };
    let sym = sub("symmetricKey")?;
    let thumbs = sub("x509Thumbprint")?;
    let non_empty = |s: Option<String>| s.filter(|s| !s.is_empty());
    let mut primary_key = non_empty(opt_str(sym, "primaryKey", "authentication.symmetricKey.")?);
    let mut secondary_key = non_empty(opt_str(sym, "secondaryKey", "authentication.symmetricKey.")?);
    for (name, key) in [("primaryKey", &primary_key), ("secondaryKey", &secondary_key)] {
        if let Some(k) = key {
            check_key(name, k)?;
        }
    }
    if auth_type == AuthType::Sas {
        primary_key.get_or_insert_with(generate_key);
        secondary_key.get_or_insert_with(generate_key);
    }
    let boxed = |s: Option<String>| s.map(String::into_boxed_str);
    Ok(AuthSpec {
        auth_type,
        primary_key: boxed(primary_key),
        secondary_key: boxed(secondary_key),
        primary_thumbprint: boxed(non_empty(opt_str(thumbs, "primaryThumbprint", "authentication.x509Thumbprint.")?)),
        secondary_thumbprint: boxed(non_empty(opt_str(
            thumbs,
            "secondaryThumbprint",
            "authentication.x509Thumbprint.",
        )?)),
    })
}

/// IoT Hub accepts base64 keys of 16 to 64 bytes.
fn check_key(name: &str, key: &str) -> Result<(), ApiError> {
    let len =
        B64.decode(key).map_err(|_| bad(format!("authentication.symmetricKey.{name} is not valid base64")))?.len();
    if !(16..=64).contains(&len) {
        return Err(bad(format!("authentication.symmetricKey.{name} decodes to {len} bytes; it must be 16 to 64")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_sdk_create_body_gets_generated_keys() {
        let body = json!({"deviceId":"d1","status":"enabled","authentication":{"symmetricKey":{},"type":"sas"},"capabilities":{"iotEdge":false}});
        let spec = device_spec("d1", &body).unwrap();
        let (p, s) = (spec.auth.primary_key.unwrap(), spec.auth.secondary_key.unwrap());
        assert_eq!(B64.decode(p.as_bytes()).unwrap().len(), 32);
        assert_ne!(p, s);
        // Node sends empty strings.
        let body = json!({"deviceId":"d1","authentication":{"symmetricKey":{"primaryKey":"","secondaryKey":""}}});
        assert!(device_spec("d1", &body).unwrap().auth.primary_key.is_some());
    }

    #[test]
    fn given_keys_kept_and_checked() {
        let k = B64.encode([7u8; 32]);
        let body = json!({"authentication":{"type":"sas","symmetricKey":{"primaryKey":k,"secondaryKey":k}},"status":"Disabled"});
        let spec = device_spec("d1", &body).unwrap();
        assert_eq!(spec.auth.primary_key.as_deref(), Some(k.as_str()));
        assert_eq!(spec.status, Status::Disabled);
        let short = json!({"authentication":{"symmetricKey":{"primaryKey":B64.encode([1u8; 4])}}});
        assert!(device_spec("d1", &short).unwrap_err().to_string().contains("primaryKey decodes to 4 bytes"));
        let junk = json!({"authentication":{"symmetricKey":{"primaryKey":"!!"}}});
        assert!(device_spec("d1", &junk).unwrap_err().to_string().contains("not valid base64"));
    }

    #[test]
    fn bad_device_bodies_are_named() {
        assert!(device_spec("d1", &json!({"deviceId":"d2"})).unwrap_err().to_string().contains("does not match"));
        assert!(device_spec("d1", &json!({"status":"on"})).unwrap_err().to_string().contains("status"));
        assert!(device_spec("d1", &json!([])).unwrap_err().to_string().contains("JSON object"));
        assert!(device_spec("d1", &json!({"authentication":{"type":"magic"}}))
            .unwrap_err()
            .to_string()
            .contains("authentication.type"));
        let m = module_spec("d1", "m1", &json!({"moduleId":"m2"})).unwrap_err().to_string();
        assert!(m.contains("moduleId"), "{m}");
        let none = device_spec("d1", &json!({"authentication":{"type":"none"}})).unwrap();
        assert_eq!(none.auth.primary_key, None);
    }
}
