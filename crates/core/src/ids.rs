//! Identifiers shared by every layer.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A Raft node id. Never reused: a removed node's id stays retired.
pub type NodeId = u64;

/// Index of a shard, `0..shard_count`.
pub type ShardId = u32;

/// A device twin (`module_id == None`) or a module twin.
///
/// Modules hash by their device id, so a device, its modules and all their twins live in one shard:
/// deleting a device deletes its modules in a single Raft command.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TwinId {
    pub device_id: String,
    pub module_id: Option<String>,
}

impl TwinId {
    pub fn device(device_id: impl Into<String>) -> Self {
        TwinId { device_id: device_id.into(), module_id: None }
    }

    pub fn module(device_id: impl Into<String>, module_id: impl Into<String>) -> Self {
        TwinId { device_id: device_id.into(), module_id: Some(module_id.into()) }
    }

    /// The shard that owns this twin: a stable hash of the device id (xxh3, so every node and every
    /// version agrees), modulo the shard count.
    pub fn shard(&self, shard_count: u32) -> ShardId {
        shard_of(&self.device_id, shard_count)
    }
}

/// Shards of a cluster founded without `--shard-count`: one Raft group. Every group pays its own
/// rounds (an append to each follower, a log write and fsync on each replica, openraft's work and the
/// wake-ups between them), and a round only carries the writes of its own shard that are waiting at
/// that moment, so more groups mean more, emptier rounds. With a replication factor of 3, a cluster of
/// 3 nodes holds and applies every shard on every node whatever the count: more groups only spread
/// leadership, and on 3 nodes that bought nothing measurable: the busiest node of a one-group
/// cluster (its leader) spent 65–83 µs of CPU per write (72 on average), the busiest of a three-group
/// one 78–88 (83), so one group has about the capacity of three on machines of their own too, and on a
/// shared machine it did 1.3 times the writes at 30 % less CPU per write (benches/README.md). Groups are what spread data
/// and leadership over more than 3 nodes, and the count is fixed once data exists: a cluster meant to
/// grow is founded with one or two per node it will have.
pub const DEFAULT_SHARD_COUNT: u32 = 1;

/// Shard of a device id. Stable across processes and versions: it decides where data lives on disk.
pub fn shard_of(device_id: &str, shard_count: u32) -> ShardId {
    (xxhash_rust::xxh3::xxh3_64(device_id.as_bytes()) % u64::from(shard_count.max(1))) as ShardId
}

impl fmt::Display for TwinId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.module_id {
            Some(m) => write!(f, "{}/{}", self.device_id, m),
            None => f.write_str(&self.device_id),
        }
    }
}
