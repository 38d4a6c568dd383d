//! Where shards live, as data: the cluster map and the placement of replicas (both pure).
//!
//! - [`map`]: the members of the cluster and each shard's target replicas; the metadata group's state.
//! - [`placement`]: which nodes hold each shard's replicas, and balanced rebalance plans.

pub mod map;
pub mod placement;
