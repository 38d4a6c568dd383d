//! The cluster layer: where shards live and how nodes talk.
//!
//! - [`map`]: the cluster map (members, target placement), the metadata group's state (pure, from
//!   `twinhub-core`).
//! - [`placement`]: which nodes hold each shard's replicas, and balanced rebalance plans (pure, from
//!   `twinhub-core`).
//! - [`transport`]: one authenticated connection per peer carrying every shard group's Raft
//!   RPCs and generic calls (request forwarding); the server side dispatches to local groups.

pub use twinhub_core::cluster::{map, placement};
pub mod transport;
