//! Backup and restore routes, owner only (`ClusterAdmin`: a backup holds every device key):
//!
//! - `GET /cluster/backup` → `{"shardCount"}`; `GET /cluster/backup/meta` → the metadata group's job and
//!   configuration records; `GET /cluster/backup/shards/{shard}?after=ID&limit=N` → a page of that
//!   shard's devices (linearizable read), `next` set when more follow;
//! - `POST /cluster/restore/meta` and `POST /cluster/restore/shards/{shard}` take them back through
//!   Raft (see `model::backup`: pages only insert missing devices, so a restore can be re-run).
//!
//! The file format and the commands are `twinhub backup` / `twinhub restore` (`cli::backup`).

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::json;

use super::path::Path;
use super::{ok_json, ApiError, Shared};
use crate::auth::Permission;
use crate::ids::TwinId;
use crate::model::backup::{BackupPage, MetaBackup};
use crate::model::{now_ms, Command, Op};
use crate::twin::read::{ReadOp, ReadOut};

const RESOURCE: &str = "cluster/backup";
/// Devices per page unless asked otherwise, and the most a page may hold.
const DEFAULT_PAGE: usize = 500;
const MAX_PAGE: usize = 5000;
/// Largest restore request (a page of devices with their twins).
pub const RESTORE_BODY_LIMIT: usize = 64 << 20;

pub async fn info(State(st): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::ClusterAdmin)?;
    Ok(ok_json(&json!({"shardCount": st.twins()?.shard_count()})))
}

pub async fn meta(State(st): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::ClusterAdmin)?;
    let m = st.twins()?.read_meta(|s| s.meta_backup()).await?;
    Ok(ok_json(&serde_json::to_value(m).map_err(|e| ApiError::Internal(e.to_string()))?))
}

fn shard_arg(st: &Shared, shard: u32) -> Result<u32, ApiError> {
    let count = st.twins()?.shard_count();
    if shard >= count {
        return Err(ApiError::BadRequest(format!("shard {shard} does not exist (the cluster has {count})")));
    }
    Ok(shard)
}

pub async fn shard_page(
    State(st): State<Shared>,
    Path(shard): Path<u32>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::ClusterAdmin)?;
    let shard = shard_arg(&st, shard)?;
    let limit = match q.get("limit") {
        None => DEFAULT_PAGE,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_PAGE).contains(n))
            .ok_or_else(|| ApiError::BadRequest(format!("limit must be from 1 to {MAX_PAGE}, got '{l}'")))?,
    };
    let op = ReadOp::BackupPage { after: q.get("after").cloned(), limit };
    let page = match st.twins()?.read_shard(shard, op).await? {
        ReadOut::Backup(json) => json,
        other => return Err(ApiError::Internal(format!("unexpected answer to a backup read: {other:?}"))),
    };
    let parsed: BackupPage = serde_json::from_str(&page).map_err(|e| ApiError::Internal(e.to_string()))?;
    let next = (parsed.devices.len() == limit).then(|| parsed.devices.keys().next_back().cloned()).flatten();
    Ok(ok_json(&json!({"shard": shard, "page": parsed, "next": next})))
}

pub async fn restore_meta(State(st): State<Shared>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::ClusterAdmin)?;
    let body = super::body::read_after_checks(body, RESTORE_BODY_LIMIT, "metadata backup").await?;
    super::body::check_untrusted(&body)?;
    let meta: MetaBackup =
        serde_json::from_slice(&body).map_err(|e| ApiError::BadRequest(format!("not a metadata backup: {e}")))?;
    meta.check_counters().map_err(ApiError::BadRequest)?;
    let meta_json = serde_json::to_string(&meta).map_err(|e| ApiError::Internal(e.to_string()))?;
    st.twins()?.propose_meta(Op::RestoreMeta { meta_json }).await??;
    Ok(ok_json(&json!({"restored": "meta"})))
}

pub async fn restore_shard(
    State(st): State<Shared>,
    Path(shard): Path<u32>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::ClusterAdmin)?;
    let shard = shard_arg(&st, shard)?;
    let body = super::body::read_after_checks(body, RESTORE_BODY_LIMIT, "backup page").await?;
    super::body::check_untrusted(&body)?;
    let page: BackupPage =
        serde_json::from_slice(&body).map_err(|e| ApiError::BadRequest(format!("not a backup page: {e}")))?;
    page.check_counters().map_err(ApiError::BadRequest)?;
    let twins = st.twins()?;
    if let Some(stray) = page.devices.keys().find(|d| twins.shard_of(d) != shard) {
        return Err(ApiError::BadRequest(format!(
            "device {stray} belongs to shard {} here, not {shard}: the backup was taken from a cluster with another shard count",
            twins.shard_of(stray)
        )));
    }
    let Some(route) = page.devices.keys().next().cloned() else {
        return Ok(ok_json(&json!({"shard": shard, "devices": 0})));
    };
    let devices = page.devices.len();
    let page_json = serde_json::to_string(&page).map_err(|e| ApiError::Internal(e.to_string()))?;
    let cmd = Command::new(Op::RestoreDevices { route: route.clone(), page_json }, now_ms());
    twins.write(&TwinId::device(route), cmd).await?.result?;
    Ok(ok_json(&json!({"shard": shard, "devices": devices})))
}
