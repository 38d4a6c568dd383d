//! The chaos harness (`twinhub chaos`): faults against a real multi-process cluster (each node a
//! `twinhub serve` process in its own network namespace), a recorded workload of HTTP back ends and
//! MQTT devices, and the history checker (the parent module) over what the clients saw.
//!
//! - `net`: namespaces, veth, bridge, iptables cuts; `cluster`: the node processes;
//! - `https`, `workload`, `device`: the clients and the recorder;
//! - `faults`: the nemesis; `scenario`: one scenario end to end; `run`: profiles;
//! - `output`: report.json, summary.txt, timeline.svg.
//!
//! Needs root (namespaces, iptables, tmpfs mounts). The README in `chaos/` says how to run it and
//! what each scenario does.

pub mod cluster;
pub mod device;
pub mod faults;
pub mod feed;
pub mod https;
pub mod net;
pub mod output;
pub mod run;
pub mod scenario;
pub mod util;
pub mod workload;
