//! Twin routes (docs/iothub-protocol.md §3.2): GET, PATCH (merge) and PUT (replace) of device and module twins.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;

use super::body::Unread;
use super::headers::Headers;
use super::path::Path;
use super::registry::{if_match, propose};
use super::{body, ok_json, ApiError, Shared};
use crate::auth::Permission;
use crate::ids::TwinId;
use crate::model::{now_ms, validate_id, validate_twin_body_text, Command, Op};

fn resource(id: &TwinId) -> String {
    match &id.module_id {
        Some(m) => format!("twins/{}/modules/{m}", id.device_id),
        None => format!("twins/{}", id.device_id),
    }
}

pub(super) async fn get(st: Shared, id: TwinId, headers: HeaderMap) -> Result<Response, ApiError> {
    st.authorize(&headers, &resource(&id), Permission::ServiceConnect)?;
    let twin = st.twins()?.doc(&id.device_id, crate::twin::read::ReadOp::Twin(id.clone())).await??;
    Ok(ok_json(&twin))
}

/// PATCH (`replace == false`) or PUT of a twin: validated before proposing.
pub(super) async fn write(
    st: Shared,
    id: TwinId,
    headers: HeaderMap,
    raw: Result<Bytes, Unread>,
    replace: bool,
) -> Result<Response, ApiError> {
    st.authorize(&headers, &resource(&id), Permission::ServiceConnect)?;
    validate_id("device", &id.device_id)?;
    if let Some(m) = &id.module_id {
        validate_id("module", m)?;
    }
    let json = body::text(raw, "Twin")?;
    // A PATCH and a PUT body follow the same rules; they differ in what a missing section means.
    validate_twin_body_text(&json)?;
    let if_match = if_match(&headers)?;
    let op = if replace {
        Op::ReplaceTwin { id: id.clone(), twin_json: json, if_match }
    } else {
        Op::UpdateTwin { id: id.clone(), patch_json: json, if_match }
    };
    let twin = propose(&st, &id, Command::new(op, now_ms())).await?.into_twin()?;
    Ok(super::ok_json_text(twin))
}

pub async fn get_twin(
    State(st): State<Shared>,
    Path(id): Path<String>,
    Headers(headers): Headers,
) -> Result<Response, ApiError> {
    get(st, TwinId::device(id), headers).await
}

pub async fn get_module_twin(
    State(st): State<Shared>,
    Path((id, mid)): Path<(String, String)>,
    Headers(headers): Headers,
) -> Result<Response, ApiError> {
    get(st, TwinId::module(id, mid), headers).await
}

pub async fn update_twin(
    State(st): State<Shared>,
    Path(id): Path<String>,
    Headers(headers): Headers,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    write(st, TwinId::device(id), headers, raw.map_err(Unread::from), false).await
}

pub async fn replace_twin(
    State(st): State<Shared>,
    Path(id): Path<String>,
    Headers(headers): Headers,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    write(st, TwinId::device(id), headers, raw.map_err(Unread::from), true).await
}

pub async fn update_module_twin(
    State(st): State<Shared>,
    Path((id, mid)): Path<(String, String)>,
    Headers(headers): Headers,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    write(st, TwinId::module(id, mid), headers, raw.map_err(Unread::from), false).await
}

pub async fn replace_module_twin(
    State(st): State<Shared>,
    Path((id, mid)): Path<(String, String)>,
    Headers(headers): Headers,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    write(st, TwinId::module(id, mid), headers, raw.map_err(Unread::from), true).await
}
