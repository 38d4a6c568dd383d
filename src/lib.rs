//! twinhub: a sharded, Raft-replicated device-twin service that speaks Azure IoT Hub's twin protocols.
//!
//! # Layout
//!
//! The modules follow the path of a write:
//!
//! - [`model`]: the pure twin model: documents, `$metadata`, versions, etags, limits, the identity
//!   registry and the deterministic `apply` of a [`model::Command`]. No I/O, no clock.
//! - [`shard`]: one openraft group per shard; the log and state machine live in one fjall database per
//!   node, and a single writer group-commits the appends of every shard.
//! - [`cluster`]: shard placement; the node-to-node transport (one authenticated HTTP/2 connection per peer).
//! - [`twin`]: one ractor actor per *active* twin; it orders that twin's requests and pipelines them into
//!   its shard's Raft group. Actors are spawned on first use and passivated when idle.
//! - [`auth`]: SAS token parsing and verification, shared access policies.
//! - [`tls`]: rustls configuration and the generated development CA.
//! - [`notify`]: desired pushes and the twin change feed, derived from applied commands and coalesced
//!   per subscriber; the back-end event broker.
//! - [`mqtt`]: the device MQTT front door (`$iothub/twin/...`), one identity per connection.
//! - [`http`]: the HTTPS service API (registry and twins, `GET /twin-changes`), IoT Hub's error bodies.
//! - [`node`]: owns everything a process runs; start and graceful shutdown.
//! - [`chaos`]: the chaos suite's pure history checker: versions, linearizability (WGL), lost writes, pushes.
//! - [`query`], [`jobs`]: the IoT Hub query language, scattered to every shard; Jobs v2 on top of it.
//! - [`bench`]: `twinhub bench`, the fleet load generator and the etcd/NATS comparison; it drives a
//!   cluster strictly from outside, over HTTPS and MQTT, like any user would.
//! - [`cli`]: `twinhub serve`, `cluster`, `chaos`, `bench`, and the configuration (flags, `TWINHUB_*`
//!   variables, TOML).

pub mod auth;
pub mod bench;
pub mod chaos;
pub mod cli;
pub mod cluster;
pub mod configurations;
/// Fuzz entry points for every network parser (see `fuzz/README.md`); not an API.
#[doc(hidden)]
pub mod fuzzing;
pub mod http;
pub mod ids;
pub mod jobs;
pub mod model;
pub mod mqtt;
pub mod net;
pub mod node;
pub mod notify;
pub mod query;
pub mod secrets;
pub mod shard;
pub mod sysmetrics;
pub mod tls;
pub mod twin;

pub use ids::{NodeId, ShardId, TwinId};
