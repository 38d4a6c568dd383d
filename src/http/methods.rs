//! Direct method routes (docs/iothub-protocol.md §4.1): `POST /twins/{id}/methods` and
//! `POST /twins/{id}/modules/{mid}/methods`. The call goes to the identity's live MQTT connection on
//! whichever node holds it; the answer is the device's `{"status", "payload"}`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{json, Value};

use super::{body, ok_json, ApiError, Shared};
use crate::auth::Permission;
use crate::ids::TwinId;
use crate::model::{validate_id, TwinError};
use crate::mqtt::methods::{
    MethodRequest, CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT, MAX_NAME_LEN, MAX_PAYLOAD, RESPONSE_TIMEOUT,
};

/// A `CloudToDeviceMethod` body, checked field by field so that the error names what is wrong.
fn parse(doc: &Value) -> Result<MethodRequest, ApiError> {
    let Some(obj) = doc.as_object() else {
        return Err(ApiError::BadRequest("the method call must be a JSON object".into()));
    };
    let name = match obj.get("methodName") {
        Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= MAX_NAME_LEN && !s.chars().any(char::is_control) => s.clone(),
        Some(Value::String(_)) => {
            return Err(ApiError::BadRequest(format!(
                "methodName must be 1 to {MAX_NAME_LEN} characters without control characters"
            )))
        }
        Some(_) => return Err(ApiError::BadRequest("methodName must be a string".into())),
        None => return Err(ApiError::BadRequest("methodName is required".into())),
    };
    let payload_json = serde_json::to_string(obj.get("payload").unwrap_or(&Value::Null))
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    if payload_json.len() > MAX_PAYLOAD {
        return Err(ApiError::BadRequest(format!("the method payload is larger than {MAX_PAYLOAD} bytes")));
    }
    let seconds = |field: &str, default: u64, range: std::ops::RangeInclusive<u64>| -> Result<u64, ApiError> {
        match obj.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => match v.as_u64() {
                Some(n) if range.contains(&n) => Ok(n),
                _ => Err(ApiError::BadRequest(format!(
                    "{field} must be an integer from {} to {} (got {v})",
                    range.start(),
                    range.end()
                ))),
            },
        }
    };
    Ok(MethodRequest {
        name,
        payload_json,
        response_timeout_secs: seconds("responseTimeoutInSeconds", DEFAULT_RESPONSE_TIMEOUT, RESPONSE_TIMEOUT)?,
        connect_timeout_secs: seconds("connectTimeoutInSeconds", 0, CONNECT_TIMEOUT)?,
    })
}

async fn invoke(st: Shared, id: TwinId, headers: HeaderMap, raw: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let resource = match &id.module_id {
        Some(m) => format!("twins/{}/modules/{m}/methods", id.device_id),
        None => format!("twins/{}/methods", id.device_id),
    };
    st.authorize(&headers, &resource, Permission::ServiceConnect)?;
    validate_id("device", &id.device_id)?;
    if let Some(m) = &id.module_id {
        validate_id("module", m)?;
    }
    let request = parse(&body::json(raw, "CloudToDeviceMethod")?)?;
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
    let payload: Value = serde_json::from_str(&reply.payload_json).unwrap_or(Value::Null);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_method_call_body_is_checked_field_by_field() {
        let ok = parse(&json!({"methodName": "reboot", "payload": {"delay": 5}})).unwrap();
        assert_eq!(ok.name, "reboot");
        assert_eq!(ok.payload_json, r#"{"delay":5}"#);
        assert_eq!((ok.response_timeout_secs, ok.connect_timeout_secs), (30, 0));
        let none = parse(&json!({"methodName": "m", "responseTimeoutInSeconds": 5, "connectTimeoutInSeconds": 300})).unwrap();
        assert_eq!((none.payload_json.as_str(), none.response_timeout_secs, none.connect_timeout_secs), ("null", 5, 300));
        for (bad, says) in [
            (json!([]), "object"),
            (json!({}), "methodName is required"),
            (json!({"methodName": 3}), "must be a string"),
            (json!({"methodName": ""}), "1 to 100"),
            (json!({"methodName": "x".repeat(101)}), "1 to 100"),
            (json!({"methodName": "m", "responseTimeoutInSeconds": 4}), "responseTimeoutInSeconds"),
            (json!({"methodName": "m", "responseTimeoutInSeconds": 301}), "responseTimeoutInSeconds"),
            (json!({"methodName": "m", "connectTimeoutInSeconds": -1}), "connectTimeoutInSeconds"),
            (json!({"methodName": "m", "connectTimeoutInSeconds": "5"}), "connectTimeoutInSeconds"),
            (json!({"methodName": "m", "payload": "x".repeat(MAX_PAYLOAD)}), "larger"),
        ] {
            let e = parse(&bad).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
