//! The cluster-wide side of the twin layer: the shard layout, the metadata group (jobs,
//! configurations, CA certificates, the cluster map) and the node's readiness. Front doors and the
//! background runners ask [`Twins`] for these, so only the twin layer talks to the shard registry.

use std::sync::Arc;

use crate::cluster::map::{ClusterMap, ClusterOp};
use crate::ids::{NodeId, ShardId};
use crate::model::{Op, Reply, ShardState, TwinError};
use crate::shard::{Shard, ShardError, ShardStatus};

use super::Twins;

impl Twins {
    /// Shards of the hub (fixed at its creation).
    pub fn shard_count(&self) -> u32 {
        self.shards.shard_count()
    }

    /// The shard a device (and its modules) belongs to.
    pub fn shard_of(&self, device_id: &str) -> ShardId {
        self.shards.shard_of(device_id)
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.shards.node_id()
    }

    /// Every group this node hosts has a leader: `/ready`.
    pub fn ready(&self) -> bool {
        self.shards.ready()
    }

    /// The cluster map as this node last applied it.
    pub fn cluster_map(&self) -> ClusterMap {
        self.shards.map()
    }

    /// Raft status of the twin shards hosted here.
    pub fn shard_status(&self) -> Vec<ShardStatus> {
        self.shards.status()
    }

    /// Raft status of the metadata group, in a cluster.
    pub fn meta_status(&self) -> Option<ShardStatus> {
        self.shards.meta_status()
    }

    /// Proposes a membership change to the cluster map (through the metadata group's leader).
    pub async fn propose_cluster(&self, op: ClusterOp) -> Result<(), ShardError> {
        self.shards.propose(op).await
    }

    /// The metadata group's handle on this node, for the runners that act only while it leads here
    /// (jobs, configurations): they check `is_leader` and read its state locally.
    pub fn meta_group(&self) -> Option<Arc<Shard>> {
        self.shards.meta_group()
    }

    /// A linearizable read of the metadata state (jobs, configurations, certificates).
    pub async fn read_meta<R>(&self, f: impl FnOnce(&ShardState) -> R) -> Result<R, ShardError> {
        self.shards.read_meta(f).await
    }

    /// A write to the metadata state, forwarded to the metadata group's leader when it is elsewhere.
    pub async fn propose_meta(&self, op: Op) -> Result<Result<Reply, TwinError>, ShardError> {
        self.shards.propose_meta(op).await
    }
}
