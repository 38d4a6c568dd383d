//! Automatic device configuration routes (docs/iothub-protocol.md §4.5): `PUT|GET|DELETE
//! /configurations/{id}`, `GET /configurations?top=N`, `POST /configurations/testQueries`. Records are
//! stored through Raft in the metadata group; the reconciler (`crate::configurations`) applies them
//! to twins. Metric results are counted when a configuration is read.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use super::path::Path;
use super::registry::if_match;
use super::{body, ok_json, ApiError, Shared};
use crate::auth::Permission;
use crate::model::config::{self, ConfigOp, Configuration};
use crate::model::{validate_id, Op};
use crate::query::{self, Collection};

/// `GET /configurations` without `top`, and the most it returns (IoT Hub's limits).
const DEFAULT_TOP: usize = 20;
const MAX_TOP: usize = 100;
const RESOURCE: &str = "configurations";

fn check_condition(text: &str) -> Result<(), String> {
    query::parse_condition(text).map(|_| ()).map_err(|e| e.to_string())
}

/// A metric query counts rows: a non-aggregate query over `devices`.
fn check_metric_query(text: &str) -> Result<(), String> {
    let q = query::parse(text).map_err(|e| e.to_string())?;
    if q.is_aggregate() {
        return Err("a metric query selects devices (rows are counted); aggregates are not allowed".into());
    }
    if q.collection() != Collection::Devices {
        return Err("a metric query selects FROM devices".into());
    }
    Ok(())
}

/// Renders records with their metric results counted now.
async fn render(st: &Shared, configs: &[&Configuration]) -> Result<Vec<Value>, ApiError> {
    let results = crate::configurations::metric_results(st.twins()?, configs).await?;
    Ok(configs
        .iter()
        .map(|c| {
            let mut v = c.render();
            if let Some((system, user)) = results.get(&c.spec.id) {
                v["systemMetrics"] = json!({
                    "results": system,
                    "queries": {
                        "targetedCount": crate::configurations::target_query(&c.spec.target_condition),
                        "appliedCount": format!("SELECT deviceId FROM devices WHERE configurations.{}.status = '{}'", c.spec.id, config::APPLIED),
                    },
                });
                v["metrics"]["results"] = user.clone();
            }
            v
        })
        .collect())
}

pub async fn put(
    State(st): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::RegistryWrite)?;
    validate_id("configuration", &id)?;
    let doc = body::json(raw, "Configuration")?;
    let spec = config::parse(&id, &doc, check_condition, check_metric_query).map_err(ApiError::BadRequest)?;
    let op = Op::Configuration(ConfigOp::Put { spec, if_match: if_match(&headers)? });
    st.twins()?.propose_meta(op).await??.into_configuration()?;
    get_one(&st, &id).await
}

async fn get_one(st: &Shared, id: &str) -> Result<Response, ApiError> {
    let c = st.twins()?.read_meta(|s| s.configs.configs.get(id).cloned()).await?;
    let c = c.ok_or_else(|| crate::model::TwinError::ConfigurationNotFound(id.to_string()))?;
    let mut v = render(st, &[&c]).await?;
    Ok(ok_json(&v.pop().unwrap_or(Value::Null)))
}

pub async fn get(State(st): State<Shared>, Path(id): Path<String>, headers: HeaderMap) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::RegistryRead)?;
    get_one(&st, &id).await
}

pub async fn delete(
    State(st): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::RegistryWrite)?;
    let op = Op::Configuration(ConfigOp::Delete { id, if_match: if_match(&headers)? });
    st.twins()?.propose_meta(op).await??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub async fn list(
    State(st): State<Shared>,
    q: Result<Query<HashMap<String, String>>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::RegistryRead)?;
    let Query(q) = q.map_err(|e| ApiError::BadRequest(format!("malformed query string: {e}")))?;
    let top =
        match q.get("top") {
            None => DEFAULT_TOP,
            Some(t) => t.parse::<usize>().ok().filter(|n| (1..=MAX_TOP).contains(n)).ok_or_else(|| {
                ApiError::BadRequest(format!("top must be an integer from 1 to {MAX_TOP}, got '{t}'"))
            })?,
        };
    let configs: Vec<Configuration> =
        st.twins()?.read_meta(|s| s.configs.configs.values().take(top).cloned().collect()).await?;
    let refs: Vec<&Configuration> = configs.iter().collect();
    Ok(ok_json(&Value::Array(render(&st, &refs).await?)))
}

/// `POST /configurations/testQueries`: parses a target condition and metric queries without storing
/// anything; empty strings mean "no error".
pub async fn test_queries(
    State(st): State<Shared>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    st.authorize(&headers, RESOURCE, Permission::RegistryRead)?;
    let doc = body::json(raw, "ConfigurationQueriesTestInput")?;
    let condition_error = match doc.get("targetCondition").and_then(Value::as_str) {
        None => String::new(),
        Some(c) if c.trim().is_empty() || c.trim() == config::ALL_DEVICES => String::new(),
        Some(c) => check_condition(c).err().unwrap_or_default(),
    };
    let mut metric_errors = Map::new();
    if let Some(queries) = doc.get("customMetricQueries").and_then(Value::as_object) {
        for (name, text) in queries {
            let err = match text.as_str() {
                Some(t) => check_metric_query(t).err().unwrap_or_default(),
                None => "the query must be a string".into(),
            };
            metric_errors.insert(name.clone(), Value::String(err));
        }
    }
    Ok(ok_json(&json!({"targetConditionError": condition_error, "customMetricQueryErrors": metric_errors})))
}
