//! The shard layer's error, and where openraft's errors become it (one place).

use openraft::error::{ClientWriteError, Fatal};

use super::types::TypeConfig;
use crate::ids::{NodeId, ShardId};

/// Errors of the shard layer, protocol-free. Serializable: a forwarded request carries them back.
#[derive(Debug, Clone, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ShardError {
    /// This node does not lead the shard; `leader` is the current leader if known. Retryable.
    #[error("node does not lead shard {shard} (leader: {leader:?})")]
    NotLeader { shard: ShardId, leader: Option<NodeId> },
    /// Storage failed: the shard stops serving rather than acknowledge what it could not persist.
    #[error("storage error on shard {shard}: {msg}")]
    Storage { shard: ShardId, msg: String },
    /// The request did not complete in time; it may or may not have been applied. Retryable.
    #[error("shard {shard} timed out")]
    Timeout { shard: ShardId },
    #[error("shard {shard} is shutting down")]
    ShuttingDown { shard: ShardId },
    #[error("shard {shard}: {msg}")]
    Fatal { shard: ShardId, msg: String },
    /// A cluster-map change the map refused (unknown or retired node, too few nodes left, ...).
    #[error("{msg}")]
    Refused { msg: String },
}

pub(super) fn write_error(shard: ShardId, e: ClientWriteError<TypeConfig>) -> ShardError {
    match e {
        ClientWriteError::ForwardToLeader(f) => ShardError::NotLeader { shard, leader: f.leader_id },
        // Discarded on a leader change: it may still commit through the new leader, so the outcome is
        // unknown (retry with the same request id; apply deduplicates).
        ClientWriteError::LogEntryDiscarded(_) => ShardError::Timeout { shard },
        other => ShardError::Fatal { shard, msg: other.to_string() },
    }
}

pub(super) fn fatal_error(shard: ShardId, f: &Fatal<TypeConfig>) -> ShardError {
    match f {
        Fatal::StorageError(e) => ShardError::Storage { shard, msg: e.to_string() },
        Fatal::Stopped => ShardError::ShuttingDown { shard },
        Fatal::Panicked => ShardError::Fatal { shard, msg: "raft core panicked".into() },
    }
}

pub(super) fn storage_error(shard: ShardId, e: impl std::fmt::Display) -> ShardError {
    ShardError::Storage { shard, msg: e.to_string() }
}
