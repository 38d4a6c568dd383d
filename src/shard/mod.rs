//! Durable sharded state: one openraft group per shard, all groups of a node storing their logs, votes
//! and snapshots in one fjall database. A single writer task group-commits the log appends of every
//! shard: one batch, one fsync, then every append of the batch is acknowledged.

use std::path::PathBuf;
use std::sync::Arc;

use crate::ids::{NodeId, ShardId};
use crate::model::{Applied, Command, ShardState};

/// Errors of the shard layer, protocol-free.
#[derive(Debug, Clone, thiserror::Error)]
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
}

/// How a node's shards are opened.
#[derive(Clone, Debug)]
pub struct ShardsConfig {
    pub data_dir: PathBuf,
    pub node_id: NodeId,
    pub shard_count: u32,
    /// Take a snapshot (and purge the log before it) after this many applied entries.
    pub snapshot_every: u64,
}

/// One shard: its Raft group and its applied state.
pub struct Shard {
    pub id: ShardId,
}

impl Shard {
    /// Proposes a command and waits until it is committed (durable on a majority) and applied.
    pub async fn write(&self, cmd: Command) -> Result<Applied, ShardError> {
        let _ = cmd;
        todo!("shard")
    }

    /// Proposes without waiting: commands proposed in this order are applied in this order, and
    /// `reply` receives the outcome after commit. This is how twin actors pipeline.
    pub fn write_pipelined(&self, cmd: Command, reply: tokio::sync::oneshot::Sender<Result<Applied, ShardError>>) {
        let _ = (cmd, reply);
        todo!("shard")
    }

    /// A linearizable read of the applied state (read index on the leader).
    pub async fn read<R>(&self, f: impl FnOnce(&ShardState) -> R) -> Result<R, ShardError> {
        let _ = f;
        todo!("shard")
    }

    /// Reads the local applied state without a linearizability check.
    pub fn read_local<R>(&self, f: impl FnOnce(&ShardState) -> R) -> R {
        let _ = f;
        todo!("shard")
    }
}

/// All shards of a node and their shared storage.
pub struct Shards {
    pub shards: Vec<Arc<Shard>>,
}

impl Shards {
    /// Opens (or creates) the node's database, starts every shard's Raft group (a single voter for
    /// now) and waits until each has a leader.
    pub async fn open(config: ShardsConfig) -> Result<Shards, ShardError> {
        let _ = config;
        todo!("shard")
    }

    pub fn shard_count(&self) -> u32 {
        self.shards.len() as u32
    }

    pub fn for_device(&self, device_id: &str) -> &Arc<Shard> {
        &self.shards[crate::ids::shard_of(device_id, self.shard_count()) as usize]
    }

    /// Stops every Raft group and flushes storage.
    pub async fn shutdown(&self) {
        todo!("shard")
    }
}
