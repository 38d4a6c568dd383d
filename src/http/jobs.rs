//! Jobs v2 routes (docs/iothub-protocol.md §3.4): `PUT /jobs/v2/{id}`, `GET /jobs/v2/{id}`, `POST /jobs/v2/{id}/cancel`,
//! `GET /jobs/v2/query`. `scheduleUpdateTwin` and `scheduleDeviceMethod` jobs run; the request is
//! validated completely (condition syntax, the twin patch or the method call, times) before anything
//! is stored.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::path::Path;
use super::{body, ok_json, ApiError, Shared};
use crate::auth::Permission;
use crate::model::jobs::{JobOp, JobSpec, JobStatus, DEVICE_METHOD, UPDATE_TWIN};
use crate::model::{now_ms, validate_id, validate_twin_patch, Op, Reply};

/// Default `maxExecutionTimeInSeconds` when the request has none.
const DEFAULT_MAX_SECS: u64 = 3600;

fn job_reply(r: Result<Reply, crate::model::TwinError>) -> Result<Response, ApiError> {
    Ok(ok_json(&r?.into_job()?))
}

fn parse_time(field: &str, v: &Value) -> Result<i64, ApiError> {
    let text = v.as_str().ok_or_else(|| ApiError::BadRequest(format!("{field} must be an ISO-8601 string")))?;
    let t = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .or_else(|_| time::OffsetDateTime::parse(&format!("{text}Z"), &time::format_description::well_known::Rfc3339))
        .map_err(|_| ApiError::BadRequest(format!("{field} '{text}' is not an ISO-8601 time")))?;
    Ok((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// `updateTwin` → the service patch a device gets: its `tags` and `properties.desired`; `etag`,
/// `deviceId` and `properties.reported` (which the SDKs send empty) are ignored.
fn patch_of(update: &Value) -> Result<Value, ApiError> {
    let obj = update.as_object().ok_or_else(|| ApiError::BadRequest("updateTwin must be a JSON object".into()))?;
    let mut patch = Map::new();
    if let Some(tags) = obj.get("tags").filter(|t| !t.is_null()) {
        patch.insert("tags".into(), tags.clone());
    }
    if let Some(desired) = obj.get("properties").and_then(|p| p.get("desired")).filter(|d| !d.is_null()) {
        patch.insert("properties".into(), json!({"desired": desired}));
    }
    if patch.is_empty() {
        return Err(ApiError::BadRequest("updateTwin changes nothing: give tags or properties.desired".into()));
    }
    let patch = Value::Object(patch);
    validate_twin_patch(&patch)?;
    Ok(patch)
}

/// A string member of a request, if present; a refusal naming it if it is anything else.
fn string_field<'a>(req: &'a Value, key: &str) -> Result<Option<&'a str>, ApiError> {
    match req.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ApiError::BadRequest(format!("{key} must be a string, got {other}"))),
    }
}

pub async fn create(
    State(st): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.authorize(&headers, "jobs", Permission::RegistryWrite)?;
    validate_id("job", &id)?;
    let req = body::json(raw, "JobRequest")?;
    if !req.is_object() {
        return Err(ApiError::BadRequest(format!("a JobRequest is a JSON object, got {req}")));
    }
    if let Some(j) = string_field(&req, "jobId")? {
        if j != id {
            return Err(ApiError::BadRequest(format!("jobId '{j}' in the body differs from '{id}' in the path")));
        }
    }
    let job_type = string_field(&req, "type")?
        .ok_or_else(|| ApiError::BadRequest(format!("type is required: {UPDATE_TWIN} or {DEVICE_METHOD}")))?;
    let condition = string_field(&req, "queryCondition")?
        .ok_or_else(|| ApiError::BadRequest("queryCondition is required".into()))?
        .to_string();
    crate::query::parse_condition(&condition).map_err(|e| ApiError::BadRequest(format!("queryCondition: {e}")))?;
    let (update, patch, method) = match job_type {
        UPDATE_TWIN => {
            let update = req.get("updateTwin").cloned().unwrap_or(Value::Null);
            let patch = patch_of(&update)?;
            (update.to_string(), patch.to_string(), None)
        }
        DEVICE_METHOD => {
            let call = req
                .get("cloudToDeviceMethod")
                .filter(|c| !c.is_null())
                .ok_or_else(|| ApiError::BadRequest(format!("a {DEVICE_METHOD} job needs cloudToDeviceMethod")))?;
            let method = crate::model::method::parse(call)
                .map_err(|e| ApiError::BadRequest(format!("cloudToDeviceMethod: {e}")))?;
            ("null".to_string(), String::new(), Some(method))
        }
        other => {
            return Err(ApiError::BadRequest(format!(
                "job type '{other}' is not supported: {UPDATE_TWIN} and {DEVICE_METHOD} run here"
            )))
        }
    };
    let now = now_ms();
    let start_ms = match req.get("startTime") {
        None | Some(Value::Null) => now,
        Some(v) => parse_time("startTime", v)?,
    };
    let max_execution_secs = match req.get("maxExecutionTimeInSeconds") {
        None | Some(Value::Null) => DEFAULT_MAX_SECS,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| ApiError::BadRequest("maxExecutionTimeInSeconds must be a non-negative integer".into()))?,
    };
    let spec = JobSpec {
        job_id: id,
        job_type: job_type.to_string(),
        query_condition: condition,
        start_ms,
        max_execution_secs,
        update_twin_json: update,
        patch_json: patch,
        created_ms: now,
    };
    let op = match method {
        None => JobOp::Create(spec),
        Some(method) => JobOp::CreateMethod { spec, method },
    };
    job_reply(st.twins()?.propose_meta(Op::Job(op)).await?)
}

pub async fn get(State(st): State<Shared>, Path(id): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    st.authorize(&headers, "jobs", Permission::RegistryRead)?;
    let job = st.twins()?.read_meta(|s| s.jobs.jobs.get(&id).map(|j| j.render())).await?;
    job.map(|j| ok_json(&j)).ok_or(ApiError::JobNotFound(id))
}

pub async fn cancel(
    State(st): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.authorize(&headers, "jobs", Permission::RegistryWrite)?;
    let twins = st.twins()?;
    if !twins.read_meta(|s| s.jobs.jobs.contains_key(&id)).await? {
        return Err(ApiError::JobNotFound(id));
    }
    job_reply(twins.propose_meta(Op::Job(JobOp::Cancel { job_id: id, at_ms: now_ms() })).await?)
}

/// `GET /jobs/v2/query?jobType=&jobStatus=`: every matching job in one page.
pub async fn query(
    State(st): State<Shared>,
    q: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.authorize(&headers, "jobs", Permission::RegistryRead)?;
    let Query(q) = q.map_err(|e| ApiError::BadRequest(format!("malformed query string: {e}")))?;
    let job_type = q.get("jobType").filter(|t| !t.is_empty()).cloned();
    let status = match q.get("jobStatus").filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(JobStatus::parse(s).ok_or_else(|| ApiError::BadRequest(format!("unknown jobStatus '{s}'")))?),
    };
    let items: Vec<Value> = st
        .twins()?
        .read_meta(|s| {
            s.jobs
                .jobs
                .values()
                .filter(|j| job_type.as_deref().is_none_or(|t| j.spec.job_type == t))
                .filter(|j| status.is_none_or(|st| j.status == st))
                .map(|j| j.render())
                .collect()
        })
        .await?;
    Ok(ok_json(&json!({"type": "jobResponse", "items": items, "continuationToken": null})))
}
