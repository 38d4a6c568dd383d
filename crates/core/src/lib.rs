//! twinhub's pure core: everything that decides *what* a twin hub does, with no I/O.
//!
//! - [`model`]: twin documents, `$metadata`, versions, etags, limits, the identity registry, jobs and
//!   configurations, and the deterministic `apply` of a [`model::Command`] to a shard's state. Every
//!   replica applies the same log to the same state, so `apply` must not read the clock, the disk or
//!   the network (the leader stamps times into the command).
//! - [`query`]: the IoT Hub query language: lexer, parser, evaluation over documents, aggregation and
//!   the continuation pages a scatter over shards merges.
//! - [`cluster`]: the cluster map (members, target placement) kept by the metadata group, and the
//!   placement of shard replicas on nodes.
//! - [`ids`]: device, module and twin identifiers, and which shard a device hashes to.
//! - [`scratch`]: a buffer each thread keeps, so messages of unknown size are written out with one
//!   allocation.
//!
//! The server crate (`twinhub`) puts this core behind Raft, actors and the front doors; it is the
//! only place that knows about time, storage and sockets.

#![forbid(unsafe_code)]

pub mod cluster;
pub mod ids;
pub mod model;
pub mod query;
pub mod scratch;

pub use ids::{NodeId, ShardId, TwinId};
