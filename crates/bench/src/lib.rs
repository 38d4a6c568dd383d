//! `twinhub bench`: the fleet load generator and the peer comparison (etcd, NATS JetStream KV).
//!
//! twinhub is driven strictly as a black box over HTTPS and MQTT (its `cluster.json`, ports and
//! process ids), exactly like the peers etcd and NATS JetStream KV. Modules:
//!
//! - [`stats`], [`progress`], [`plot`]: HdrHistogram measurements, per-second series, the progress
//!   line, JSON-able summaries and the SVG plot; [`steal`]: the hypervisor's share of the machine's
//!   CPU in each second and phase;
//! - [`loadgen`]: closed-loop and open-loop drivers over `Worker`s;
//! - [`targets`]: the systems under test behind one `Target` trait (twinhub, etcd, nats);
//! - [`peers`]: installing, starting and stopping the 3-node clusters;
//! - [`hub`], [`mqtt`], [`http`], [`sas`], [`tls`]: twinhub's HTTPS API, MQTT devices, HTTP/1.1
//!   connections, SAS tokens, TLS;
//! - [`compare`] and [`scenarios`]: the commands.

pub mod cli;
pub mod compare;
pub mod http;
pub mod hub;
pub mod loadgen;
pub mod mqtt;
pub mod peers;
pub mod plot;
pub mod probe;
pub mod procs;
pub mod progress;
pub mod sas;
pub mod scenarios;
pub mod stats;
pub mod steal;
pub mod targets;
pub mod tls;
pub mod value;
