//! SAS tokens for the bench's clients (built by [`twinhub::auth::client`]) and wall-clock helpers.

use std::time::{SystemTime, UNIX_EPOCH};

pub use twinhub::auth::client::{path_segment as enc, quote};

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Microseconds since the Unix epoch (wall clock; used for send → receive latencies on one machine).
pub fn unix_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// A policy token for the whole hub (`sr` = the host name).
pub fn service_sas(host: &str, policy: &str, key_b64: &str, expiry: u64) -> anyhow::Result<String> {
    Ok(twinhub::auth::client::service_token(host, policy, key_b64, expiry)?)
}

/// A device token (`sr` = `{host}/devices/{id}`, no `skn`), signed with the device's key.
pub fn device_sas(host: &str, device_id: &str, key_b64: &str, expiry: u64) -> anyhow::Result<String> {
    Ok(twinhub::auth::client::device_token(host, device_id, key_b64, expiry)?)
}
