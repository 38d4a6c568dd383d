//! A direct method call as the service API describes it (`CloudToDeviceMethod`), validated; shared by
//! the method route, `scheduleDeviceMethod` jobs and the device endpoint that delivers calls. Pure: no
//! I/O.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Limits of IoT Hub's method API.
pub const MAX_NAME_LEN: usize = 100;
pub const MAX_PAYLOAD: usize = 128 * 1024;
pub const RESPONSE_TIMEOUT: std::ops::RangeInclusive<u64> = 5..=300;
pub const DEFAULT_RESPONSE_TIMEOUT: u64 = 30;
pub const CONNECT_TIMEOUT: std::ops::RangeInclusive<u64> = 0..=300;

/// A validated method call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MethodRequest {
    pub name: String,
    /// The payload as JSON text (`null` when the caller sent none).
    pub payload_json: String,
    pub response_timeout_secs: u64,
    pub connect_timeout_secs: u64,
}

impl MethodRequest {
    /// The `cloudToDeviceMethod` object, as job records render it.
    pub fn render(&self) -> Value {
        serde_json::json!({
            "methodName": self.name,
            "payload": super::json_tree::parse_untrusted(&self.payload_json).unwrap_or(Value::Null),
            "responseTimeoutInSeconds": self.response_timeout_secs,
            "connectTimeoutInSeconds": self.connect_timeout_secs,
        })
    }

    /// Checks a call that did not come through [`parse`] (a restored job's) against the same limits:
    /// the node adds its timeouts to the clock, so an absurd one must never get that far.
    pub fn check(&self) -> Result<(), String> {
        if !valid_name(&self.name) {
            return Err(format!("methodName must be 1 to {MAX_NAME_LEN} characters without control characters"));
        }
        if self.payload_json.len() > MAX_PAYLOAD {
            return Err(format!("the method payload is larger than {MAX_PAYLOAD} bytes"));
        }
        super::json_tree::parse(&self.payload_json).map_err(|e| format!("the method payload is not JSON: {e}"))?;
        for (field, v, range) in [
            ("responseTimeoutInSeconds", self.response_timeout_secs, RESPONSE_TIMEOUT),
            ("connectTimeoutInSeconds", self.connect_timeout_secs, CONNECT_TIMEOUT),
        ] {
            if !range.contains(&v) {
                return Err(format!("{field} must be an integer from {} to {} (got {v})", range.start(), range.end()));
            }
        }
        Ok(())
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.chars().count() <= MAX_NAME_LEN && !s.chars().any(char::is_control)
}

/// A `CloudToDeviceMethod` body, checked field by field so that the error names what is wrong.
pub fn parse(doc: &Value) -> Result<MethodRequest, String> {
    let Some(obj) = doc.as_object() else {
        return Err("the method call must be a JSON object".into());
    };
    let name = match obj.get("methodName") {
        Some(Value::String(s)) if valid_name(s) => s.clone(),
        Some(Value::String(_)) => {
            return Err(format!("methodName must be 1 to {MAX_NAME_LEN} characters without control characters"))
        }
        Some(_) => return Err("methodName must be a string".into()),
        None => return Err("methodName is required".into()),
    };
    let payload_json = serde_json::to_string(obj.get("payload").unwrap_or(&Value::Null)).map_err(|e| e.to_string())?;
    if payload_json.len() > MAX_PAYLOAD {
        return Err(format!("the method payload is larger than {MAX_PAYLOAD} bytes"));
    }
    let seconds = |field: &str, default: u64, range: std::ops::RangeInclusive<u64>| -> Result<u64, String> {
        match obj.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => match v.as_u64() {
                Some(n) if range.contains(&n) => Ok(n),
                _ => Err(format!("{field} must be an integer from {} to {} (got {v})", range.start(), range.end())),
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_method_call_body_is_checked_field_by_field() {
        let ok = parse(&json!({"methodName": "reboot", "payload": {"delay": 5}})).unwrap();
        assert_eq!(ok.name, "reboot");
        assert_eq!(ok.payload_json, r#"{"delay":5}"#);
        assert_eq!((ok.response_timeout_secs, ok.connect_timeout_secs), (30, 0));
        let none =
            parse(&json!({"methodName": "m", "responseTimeoutInSeconds": 5, "connectTimeoutInSeconds": 300})).unwrap();
        assert_eq!(
            (none.payload_json.as_str(), none.response_timeout_secs, none.connect_timeout_secs),
            ("null", 5, 300)
        );
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

    #[test]
    fn a_call_from_elsewhere_is_held_to_the_same_limits() {
        let ok = parse(&json!({"methodName": "reboot"})).unwrap();
        ok.check().unwrap();
        for (bad, says) in [
            (MethodRequest { connect_timeout_secs: u64::MAX, ..ok.clone() }, "connectTimeoutInSeconds"),
            (MethodRequest { response_timeout_secs: 0, ..ok.clone() }, "responseTimeoutInSeconds"),
            (MethodRequest { name: "a\nb".into(), ..ok.clone() }, "methodName"),
            (MethodRequest { payload_json: "1".repeat(MAX_PAYLOAD + 1), ..ok.clone() }, "larger"),
            (
                MethodRequest { payload_json: r#"{"$serde_json::private::RawValue":"1"}"#.into(), ..ok.clone() },
                "not JSON",
            ),
        ] {
            let e = bad.check().unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
