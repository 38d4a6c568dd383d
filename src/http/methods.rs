//! Direct method routes (docs/iothub-protocol.md §4.1): `POST /twins/{id}/methods` and
//! `POST /twins/{id}/modules/{mid}/methods`. The call goes to the identity's live MQTT connection on
//! whichever node holds it; the answer is the device's `{"status", "payload"}`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{json, Value};

use super::path::Path;
use super::{body, ok_json, ApiError, Shared};
use crate::auth::Permission;
use crate::ids::TwinId;
use crate::model::{method, validate_id, TwinError};

async fn invoke(
    st: Shared,
    id: TwinId,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let resource = match &id.module_id {
        Some(m) => format!("twins/{}/modules/{m}/methods", id.device_id),
        None => format!("twins/{}/methods", id.device_id),
    };
    st.authorize(&headers, &resource, Permission::ServiceConnect)?;
    validate_id("device", &id.device_id)?;
    if let Some(m) = &id.module_id {
        validate_id("module", m)?;
    }
    let request = method::parse(&body::json(raw, "CloudToDeviceMethod")?).map_err(ApiError::BadRequest)?;
    let Some(methods) = st.methods.as_ref() else {
        return Err(ApiError::Internal("direct methods are not running".into()));
    };
    if st.twins()?.credentials(&id).await?.is_none() {
        return Err(match &id.module_id {
            Some(m) => TwinError::ModuleNotFound { device: id.device_id.clone(), module: m.clone() },
            None => TwinError::DeviceNotFound(id.device_id.clone()),
        }
        .into());
    }
    let reply = methods.invoke(&id, request).await?;
    let payload: Value = crate::model::json_tree::parse_untrusted(&reply.payload_json).unwrap_or(Value::Null);
    Ok(ok_json(&json!({ "status": reply.status, "payload": payload })))
}

pub async fn invoke_device(
    State(st): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    invoke(st, TwinId::device(id), headers, raw).await
}

pub async fn invoke_module(
    State(st): State<Shared>,
    Path((id, mid)): Path<(String, String)>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    invoke(st, TwinId::module(id, mid), headers, raw).await
}
