//! The recorded history: what the chaos runner writes and the checker reads. One [`Op`] per client
//! request (or received desired push), with the client's own invoke and complete times and what it
//! learned. Nothing here interprets the ops; [`History::validate_op`] only rejects records the checker
//! could not reason about.
//!
//! The JSON form is serde's default (externally tagged enums, e.g. `{"PatchDesired": {...}}` and
//! `"GetTwin"`): internally tagged enums would buffer their content, which breaks numbers under
//! serde_json's `arbitrary_precision` (enabled in this crate).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A whole run: every operation on every twin, plus the state each twin started from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct History {
    pub ops: Vec<Op>,
    /// Twin id (`device` or `device/module`) → its state before the first op. The runner creates twins
    /// fresh and should pass [`TwinState::fresh`] for each; a twin missing here gets an inferred one
    /// (see `check`), which is weaker.
    #[serde(default)]
    pub initial: BTreeMap<String, TwinState>,
}

/// One operation as a client saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// Who issued it. For MQTT ops and pushes: one device *connection* (a reconnect is a new client),
    /// because push ordering and convergence are promised per connection, not per device.
    pub client: u64,
    /// `device` or `device/module`. Twins are checked independently.
    pub twin: String,
    /// Client clock (ns, any epoch shared by all clients) just before the request was sent.
    pub invoke_ns: u64,
    /// When the answer arrived; `None` if it never did (the op may or may not have applied).
    #[serde(default)]
    pub complete_ns: Option<u64>,
    pub kind: OpKind,
    pub outcome: Outcome,
    /// Set by the runner on the reads it takes after healing and quiescence: the `GetTwin` per twin that
    /// must reflect every acknowledged write, and the converged `DeviceGet` of each device connection.
    /// Without a marked read the checker uses the last read invoked after every write completed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub final_read: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum OpKind {
    /// Service `GET /twins/{id}`: answers the whole twin.
    GetTwin,
    /// Service `PATCH /twins/{id}` of `properties.desired`: merge, `null` deletes, desired `$version`+1.
    PatchDesired {
        patch: Value,
        #[serde(default)]
        if_match: Option<String>,
    },
    /// Service `PUT /twins/{id}`: tags and desired replaced wholesale, desired `$version`+1.
    ReplaceTwin {
        desired: Value,
        #[serde(default)]
        tags: Value,
        #[serde(default)]
        if_match: Option<String>,
    },
    /// Device reported patch over MQTT: merge, reported `$version`+1.
    PatchReported { patch: Value },
    /// Device `GET` over MQTT: answers desired and reported (no tags, no twin version).
    DeviceGet,
    /// A desired push received by a device connection (`invoke_ns` = `complete_ns` = receive time). It is
    /// a notification, not a request: checked for order and convergence, not linearized.
    Push { desired_version: i64, patch: Value },
    /// A twin change event received by a change-feed consumer (`client` = one consumer connection,
    /// `invoke_ns` = `complete_ns` = receive time): the twin `version` it shows and how many committed
    /// changes it carries (coalescing merges several into one). Checked for delivery and order.
    FeedEvent { version: i64, merged: i64 },
    /// The consumer was told to resync (or started following): it re-reads its twins, so changes
    /// committed before this are accounted for without events.
    FeedResync,
}

impl OpKind {
    /// Short name for messages.
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::GetTwin => "GetTwin",
            OpKind::PatchDesired { .. } => "PatchDesired",
            OpKind::ReplaceTwin { .. } => "ReplaceTwin",
            OpKind::PatchReported { .. } => "PatchReported",
            OpKind::DeviceGet => "DeviceGet",
            OpKind::Push { .. } => "Push",
            OpKind::FeedEvent { .. } => "FeedEvent",
            OpKind::FeedResync => "FeedResync",
        }
    }

    /// A notification received (a push or a feed item), not a request: not linearized.
    pub fn is_notification(&self) -> bool {
        matches!(self, OpKind::Push { .. } | OpKind::FeedEvent { .. } | OpKind::FeedResync)
    }

    /// Changes desired (and so bumps desired `$version`).
    pub fn writes_desired(&self) -> bool {
        matches!(self, OpKind::PatchDesired { .. } | OpKind::ReplaceTwin { .. })
    }

    pub fn writes_reported(&self) -> bool {
        matches!(self, OpKind::PatchReported { .. })
    }

    pub fn is_write(&self) -> bool {
        self.writes_desired() || self.writes_reported()
    }

    pub fn is_read(&self) -> bool {
        matches!(self, OpKind::GetTwin | OpKind::DeviceGet)
    }

    /// The If-Match etag, if the write is conditional on one (the wildcard `*` is not a condition).
    pub fn if_match(&self) -> Option<String> {
        match self {
            OpKind::PatchDesired { if_match, .. } | OpKind::ReplaceTwin { if_match, .. } => {
                if_match.as_deref().map(normalize_etag).filter(|e| e != "*")
            }
            _ => None,
        }
    }
}

/// Etags are compared without the HTTP quoting (`W/"…"` and `"…"` are the same etag as `…`), because a
/// runner may record the header it sent and the body field it read.
pub fn normalize_etag(raw: &str) -> String {
    let v = raw.trim();
    let v = v.strip_prefix("W/").unwrap_or(v);
    v.strip_prefix('"').and_then(|s| s.strip_suffix('"')).unwrap_or(v).trim().to_string()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// The op took effect (writes) or answered (reads). Every field is what the answer carried, if it did.
    Ok {
        /// Twin `version` (HTTP answers carry it; MQTT answers do not).
        #[serde(default)]
        version: Option<i64>,
        #[serde(default)]
        desired_version: Option<i64>,
        #[serde(default)]
        reported_version: Option<i64>,
        #[serde(default)]
        etag: Option<String>,
        /// The whole desired section, without `$metadata` and `$version`.
        #[serde(default)]
        desired: Option<Value>,
        #[serde(default)]
        reported: Option<Value>,
    },
    /// Definitely not applied (400, 404, 412…).
    Failed { status: u16, message: String },
    /// No answer, or an answer that does not say (timeout, reset, 503 after sending): may have applied.
    Unknown { reason: String },
}

impl Outcome {
    /// An `Ok` with nothing known, for building histories by hand.
    pub fn ok() -> Outcome {
        Outcome::Ok {
            version: None,
            desired_version: None,
            reported_version: None,
            etag: None,
            desired: None,
            reported: None,
        }
    }

    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok { .. })
    }

    pub fn is_failed(&self) -> bool {
        matches!(self, Outcome::Failed { .. })
    }

    pub fn is_precondition_failed(&self) -> bool {
        matches!(self, Outcome::Failed { status: 412, .. })
    }
}

/// A twin's state as the checker models it. Tags are not modelled: no op reads them back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TwinState {
    #[serde(default)]
    pub desired: Map<String, Value>,
    pub desired_version: i64,
    #[serde(default)]
    pub reported: Map<String, Value>,
    pub reported_version: i64,
    pub version: i64,
}

impl TwinState {
    /// A twin just created: empty sections, every version 1 (as `TwinDoc::new`).
    pub fn fresh() -> TwinState {
        TwinState { desired: Map::new(), desired_version: 1, reported: Map::new(), reported_version: 1, version: 1 }
    }
}

/// Why an op cannot be checked. Such ops are left out and reported, since a runner bug makes the whole
/// verdict doubtful.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    #[error("op #{0} completes before it was invoked")]
    CompletesBeforeInvoke(usize),
    #[error("op #{0} has an answer (Ok or Failed) but no complete time")]
    AnsweredWithoutCompletion(usize),
    #[error("op #{index}: {what} is not a JSON object")]
    NotAnObject { index: usize, what: &'static str },
    #[error("op #{0}: a push must be received at one instant (complete = invoke)")]
    PushWithDuration(usize),
    #[error("history is not valid JSON: {0}")]
    Json(String),
}

impl History {
    pub fn from_json(text: &str) -> Result<History, HistoryError> {
        serde_json::from_str(text).map_err(|e| HistoryError::Json(e.to_string()))
    }

    pub fn to_json(&self) -> Result<String, HistoryError> {
        serde_json::to_string(self).map_err(|e| HistoryError::Json(e.to_string()))
    }

    /// Rejects records the checker cannot interpret.
    pub fn validate_op(&self, index: usize) -> Result<(), HistoryError> {
        let Some(op) = self.ops.get(index) else { return Ok(()) };
        if let Some(c) = op.complete_ns {
            if c < op.invoke_ns {
                return Err(HistoryError::CompletesBeforeInvoke(index));
            }
        }
        if !matches!(op.outcome, Outcome::Unknown { .. }) && op.complete_ns.is_none() && !op.kind.is_notification() {
            return Err(HistoryError::AnsweredWithoutCompletion(index));
        }
        let object = |v: &Value, what: &'static str| {
            if v.is_object() {
                Ok(())
            } else {
                Err(HistoryError::NotAnObject { index, what })
            }
        };
        match &op.kind {
            OpKind::PatchDesired { patch, .. } => object(patch, "the desired patch")?,
            OpKind::PatchReported { patch } => object(patch, "the reported patch")?,
            OpKind::ReplaceTwin { desired, .. } if !desired.is_null() => object(desired, "the replaced desired")?,
            OpKind::Push { patch, .. } => {
                object(patch, "the pushed patch")?;
                if op.complete_ns.is_some_and(|c| c != op.invoke_ns) {
                    return Err(HistoryError::PushWithDuration(index));
                }
            }
            _ => {}
        }
        if let Outcome::Ok { desired, reported, .. } = &op.outcome {
            if let Some(d) = desired {
                object(d, "the answered desired")?;
            }
            if let Some(r) = reported {
                object(r, "the answered reported")?;
            }
        }
        Ok(())
    }
}
