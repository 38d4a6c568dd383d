//! The cluster layer: where shards live and how nodes talk.
//!
//! - [`map`]: the cluster map (members, target placement), the metadata group's state (pure).
//! - [`placement`]: which nodes hold each shard's replicas, and balanced rebalance plans (pure).
//! - [`transport`]: one authenticated HTTP/2 connection per peer carrying every shard group's Raft
//!   RPCs and generic calls (request forwarding); the server side dispatches to local groups.

pub mod map;
pub mod placement;
pub mod transport;
