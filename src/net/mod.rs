//! What every listener shares: bounds on the connections a stranger can make a node hold, and the
//! process's file-descriptor budget that those bounds are carved from.
//!
//! A connection is *unauthenticated* from `accept` until it has proved a credential (a valid SAS token
//! on its first HTTPS request, an accepted MQTT CONNECT, a verified inter-node signature). Strangers can
//! only ever occupy unauthenticated slots, which are few per source address and short-lived (handshake
//! and first-request timeouts), so a flood from outside fills its own small budget and nothing else:
//! authenticated clients, and every other port, keep theirs.

pub mod fds;
pub mod limit;
pub mod ports;

pub use fds::{raise_nofile_limit, FdBudget};
pub use limit::{ConnGate, ConnPermit, ListenerLimits, Refusal};
pub use ports::free_loopback_ports;

use std::time::Duration;

pub use fds::CapOverrides;

/// The MQTT keep-alive a server holds a client to: what it asked, but at most `max`, and `max` for 0
/// ("never"), so that no connection can stay silent for ever. One rule for the device front door and
/// the back-end event broker.
pub fn clamp_keep_alive(asked: u16, max: u16) -> u16 {
    if asked == 0 {
        max
    } else {
        asked.min(max)
    }
}

/// The connection bounds and timeouts of a node's listeners, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetLimits {
    /// Per-listener caps set by the operator (the others come from the descriptor budget).
    pub caps: CapOverrides,
    /// Connections one source may hold on the HTTPS, event-broker and inter-node listeners.
    pub max_per_source: usize,
    /// Unauthenticated connections each listener holds at once.
    pub max_unauthenticated: usize,
    /// Unauthenticated connections one source may hold on each listener.
    pub max_unauthenticated_per_source: usize,
    /// TLS handshake; then, again, the first request head or MQTT CONNECT.
    pub handshake_timeout: Duration,
    /// Idle time allowed between HTTPS requests on one connection.
    pub idle_timeout: Duration,
}

impl Default for NetLimits {
    fn default() -> Self {
        NetLimits {
            caps: CapOverrides::default(),
            max_per_source: 256,
            max_unauthenticated: 1024,
            max_unauthenticated_per_source: 64,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
        }
    }
}

/// The gates of a node's listeners, built once at start from [`NetLimits`] and the descriptor budget.
#[derive(Clone)]
pub struct Gates {
    pub https: std::sync::Arc<ConnGate>,
    /// Shared by the TLS and plain MQTT listeners.
    pub mqtt: std::sync::Arc<ConnGate>,
    pub events: std::sync::Arc<ConnGate>,
    pub cluster: std::sync::Arc<ConnGate>,
    pub limits: NetLimits,
}

impl Gates {
    /// Raises the descriptor limit and shares it out (see [`fds`]).
    pub fn new(limits: &NetLimits) -> Gates {
        let nofile = raise_nofile_limit();
        let budget = FdBudget::from_limit(nofile, &limits.caps);
        tracing::info!(
            nofile,
            https = budget.https,
            mqtt = budget.mqtt,
            events = budget.events,
            cluster = budget.cluster,
            "connection caps"
        );
        let l = |max_connections: usize, per_source: usize| ListenerLimits {
            max_connections,
            max_per_source: per_source,
            max_unauthenticated: limits.max_unauthenticated.min(max_connections),
            max_unauthenticated_per_source: limits.max_unauthenticated_per_source,
        };
        Gates {
            https: ConnGate::new("https", l(budget.https, limits.max_per_source)),
            mqtt: ConnGate::new("mqtt", l(budget.mqtt, 0)),
            events: ConnGate::new("events", l(budget.events, limits.max_per_source)),
            cluster: ConnGate::new("cluster", l(budget.cluster, limits.max_per_source)),
            limits: limits.clone(),
        }
    }
}
