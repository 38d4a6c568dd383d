//! twinhub: a sharded, Raft-replicated device-twin service that speaks Azure IoT Hub's twin protocols.
//!
//! # Layout
//!
//! The pure core (the twin model, the query language, the cluster map and placement, identifiers) is
//! its own crate, `twinhub-core`, re-exported here as [`model`], [`query`] and [`ids`] so the layers
//! above it read as one tree. The chaos suite and the load generator are companion programs
//! (`twinhub-chaos`, `twinhub-bench`) that `twinhub chaos` and `twinhub bench` run.
//!
//! The modules follow the path of a write:
//!
//! - [`model`]: the pure twin model: documents, `$metadata`, versions, etags, limits, the identity
//!   registry and the deterministic `apply` of a [`model::Command`]. No I/O, no clock.
//! - [`storage`]: Raft storage: the log and state machine of every group live in one fjall database per
//!   node, and a single writer group-commits the appends of every shard.
//! - [`shard`]: one openraft group per shard, placed by the cluster map.
//! - [`cluster`]: shard placement; the node-to-node transport (one authenticated connection per peer).
//! - [`twin`]: one ractor actor per *active* twin; it orders that twin's requests and pipelines them into
//!   its shard's Raft group. Actors are spawned on first use and passivated when idle.
//! - [`auth`]: SAS token parsing and verification, shared access policies.
//! - [`tls`]: rustls configuration and the generated development CA.
//! - [`notify`]: desired pushes and the twin change feed, derived from applied commands and coalesced
//!   per subscriber; the back-end event broker.
//! - [`mqtt`]: the device MQTT front door (`$iothub/twin/...`), one identity per connection.
//! - [`http`]: the HTTPS service API (registry and twins, `GET /twin-changes`), IoT Hub's error bodies.
//! - [`node`]: owns everything a process runs; start and graceful shutdown.
//! - [`sched`]: the CPU scheduling class of the node's threads, set before its runtime starts.
//! - [`query`], [`jobs`]: the IoT Hub query language, scattered to every shard; Jobs v2 on top of it.
//! - [`cli`]: `twinhub serve`, `cluster`, the admin commands, and the configuration (flags, `TWINHUB_*`
//!   variables, TOML); `chaos` and `bench` hand over to their programs.

pub mod auth;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod configurations;
pub mod error_code;
/// Fuzz entry points for every network parser (see `fuzz/README.md`); not an API.
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod jobs;
pub mod metric_handles;
pub mod mqtt;
pub mod net;
pub mod node;
pub mod notify;
pub mod sched;
pub mod secrets;
pub mod shard;
pub mod storage;
pub mod sysmetrics;
pub mod tls;
pub mod twin;

pub use twinhub_core::{ids, model, query};
pub use twinhub_core::{NodeId, ShardId, TwinId};
