//! The pure twin model: IoT Hub device and module twins and the identity registry of one shard.
//!
//! No I/O, no clock, no randomness: [`ShardState::apply`] is a deterministic function of the state and a
//! [`Command`], run identically on every replica. Front doors call the `validate_*` functions before
//! proposing so that bad input costs no log entry; apply validates again whatever depends on state
//! (sizes after merge, If-Match).

pub mod command;
pub mod error;

pub use command::{now_ms, AuthSpec, Command, DeviceSpec, IfMatch, ModuleSpec, Op, RequestId, Status};
pub use error::TwinError;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::TwinId;

/// Maximum modules on one device (IoT Hub: 20).
pub const MAX_MODULES_PER_DEVICE: usize = 20;

/// What a successful command answers. JSON documents are rendered in the REST shapes of
/// `../shared/spec/azure-compat.md` §3.1–3.2 (the twin document, Device, Module).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// A Device document (PUT /devices/{id}).
    Device(Value),
    /// A Module document.
    Module(Value),
    /// The full twin document after the change (PATCH/PUT /twins/...).
    Twin(Value),
    /// A reported patch was applied; the new reported `$version`.
    Reported { version: i64 },
    /// DELETE, connection state.
    Done,
}

/// A change derived from committed state, for desired pushes and twin change events (issue 3 consumes
/// these). Every event carries the versions it reflects.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// A change to tags, desired or reported: `body` is IoT Hub's twinChangeNotification body
    /// (`{"version", "tags"?, "properties": {"desired"|"reported": {patch with nulls, "$metadata", "$version"}}}`)
    /// for `updateTwin`, or the full twin for `replaceTwin`.
    TwinChanged { id: TwinId, op_type: String, body: Value, version: i64 },
    /// What a connected device receives on `$iothub/twin/PATCH/properties/desired/?$version=n`: the
    /// patch (for a replace, the difference with `null` for removed keys) plus `"$version"`.
    DesiredPatch { id: TwinId, patch: Value, desired_version: i64 },
    /// Identity lifecycle: `createDeviceIdentity`, `deleteDeviceIdentity` (and module variants).
    Lifecycle { id: TwinId, op_type: String, body: Value },
    /// `deviceConnected` / `deviceDisconnected`.
    Connection { id: TwinId, connected: bool },
}

/// Outcome of applying one command.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    pub result: Result<Reply, TwinError>,
    pub events: Vec<Event>,
}

/// Credentials of one device or module, for MQTT and device-token checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub primary_key: Option<String>,
    pub secondary_key: Option<String>,
    pub enabled: bool,
}

/// Counts for `GET /statistics/devices`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub total: u64,
    pub enabled: u64,
    pub disabled: u64,
}

/// The registry and twins of one shard: the Raft state machine's data.
#[derive(Clone, Debug, Default)]
pub struct ShardState {
    // Implementation detail of the model.
}

impl ShardState {
    /// Applies a committed command. Deterministic; a rejected command leaves the state unchanged.
    /// A command whose request id was recently applied for the same device answers the first outcome
    /// again and changes nothing.
    pub fn apply(&mut self, cmd: &Command) -> Applied {
        let _ = cmd;
        todo!("model")
    }

    /// The Device document, or `None`.
    pub fn device(&self, device_id: &str) -> Option<Value> {
        let _ = device_id;
        todo!("model")
    }

    /// Device documents in device-id order, starting after `after` (for paging).
    pub fn devices(&self, after: Option<&str>, limit: usize) -> Vec<Value> {
        let _ = (after, limit);
        todo!("model")
    }

    pub fn module(&self, device_id: &str, module_id: &str) -> Result<Value, TwinError> {
        let _ = (device_id, module_id);
        todo!("model")
    }

    pub fn modules(&self, device_id: &str) -> Result<Vec<Value>, TwinError> {
        let _ = device_id;
        todo!("model")
    }

    /// The full twin document (service view, REST shape).
    pub fn twin(&self, id: &TwinId) -> Result<Value, TwinError> {
        let _ = id;
        todo!("model")
    }

    /// The device view: `{"desired": {...}, "reported": {...}}` with `$metadata` and `$version`, no tags.
    pub fn twin_properties(&self, id: &TwinId) -> Result<Value, TwinError> {
        let _ = id;
        todo!("model")
    }

    /// Current twin etag (for If-Match pre-checks before proposing).
    pub fn twin_etag(&self, id: &TwinId) -> Result<String, TwinError> {
        let _ = id;
        todo!("model")
    }

    pub fn credentials(&self, id: &TwinId) -> Option<Credentials> {
        let _ = id;
        todo!("model")
    }

    pub fn stats(&self) -> DeviceStats {
        todo!("model")
    }

    /// Serializes the whole state for a Raft snapshot.
    pub fn encode_snapshot(&self) -> Vec<u8> {
        todo!("model")
    }

    pub fn decode_snapshot(bytes: &[u8]) -> Result<ShardState, String> {
        let _ = bytes;
        todo!("model")
    }
}

/// Validates a service twin PATCH body (`tags` and/or `properties.desired`) before proposing: limits,
/// key rules, allowed top-level members. The error names the offending path and the limit.
pub fn validate_twin_patch(body: &Value) -> Result<(), TwinError> {
    let _ = body;
    todo!("model")
}

/// Validates a service twin PUT body (replace tags and desired).
pub fn validate_twin_replace(body: &Value) -> Result<(), TwinError> {
    let _ = body;
    todo!("model")
}

/// Validates a device reported patch.
pub fn validate_reported_patch(body: &Value) -> Result<(), TwinError> {
    let _ = body;
    todo!("model")
}

/// Validates a device or module id (≤128 ASCII alnum plus `- : . + % _ # * ? ! ( ) , = @ ; $ '`).
pub fn validate_id(kind: &str, id: &str) -> Result<(), TwinError> {
    let _ = (kind, id);
    todo!("model")
}
