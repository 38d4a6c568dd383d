//! [`ConnGate`]: the connection budget of one listener.
//!
//! Each accepted socket asks the gate for a [`ConnPermit`] before anything else is done with it (no TLS
//! handshake, no read). The permit counts against four bounds:
//!
//! - `max_connections`: everything this listener holds at once;
//! - `max_per_source`: everything one source holds at once (0 = no bound: device fleets behind one
//!   NAT address are normal for MQTT);
//! - `max_unauthenticated`: connections that have not proved a credential yet;
//! - `max_unauthenticated_per_source`: the same, per source.
//!
//! [`ConnPermit::authenticated`] moves a connection out of the unauthenticated counts; dropping the
//! permit releases it. Sources are IPv4 addresses, or IPv6 /64 prefixes (one host usually owns a
//! whole /64, so counting single v6 addresses would not bound anything). The per-source table only
//! holds sources with an open connection, so it is bounded by `max_connections`.
//!
//! A listener whose legitimate clients are known by address (the inter-node port: the cluster's
//! members) can name them ([`ConnGate::set_trusted`]): a connection from a trusted address is held
//! not to the listener's per-source and unauthenticated bounds but to a small one of its own
//! ([`TRUSTED_UNAUTHENTICATED_PER_SOURCE`]), and to the listener's cap only once it is
//! [`TRUSTED_RESERVE`] past it, so strangers who fill those bounds cannot keep a member from
//! reconnecting, and a stranger sharing a member's address cannot take the others' room. It still
//! has to authenticate like any other connection; the address only buys it a slot.
//!
//! Refusals are counted in `twinhub_listener_refused_total{listener, reason}` and the open counts are
//! gauges; both take their labels from closed sets (the listener names are fixed strings and
//! [`Refusal::label`] has four values), so no client can grow the metrics page.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, RwLock};

/// Connections from trusted addresses a listener admits past its cap (see the module doc).
pub const TRUSTED_RESERVE: usize = 64;

/// Unauthenticated connections one trusted address may hold at once: a member opens a few links at a
/// time; a stranger sharing its address (another process on its host, a NAT) cannot take more.
pub const TRUSTED_UNAUTHENTICATED_PER_SOURCE: usize = 16;

/// Bounds of one listener. `0` in a per-source field means "no per-source bound".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    pub max_connections: usize,
    pub max_per_source: usize,
    pub max_unauthenticated: usize,
    pub max_unauthenticated_per_source: usize,
}

/// Why a connection was refused at accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the listener holds its maximum number of connections")]
    Full,
    #[error("this source holds its maximum number of connections")]
    SourceFull,
    #[error("the listener holds its maximum number of unauthenticated connections")]
    TooManyUnauthenticated,
    #[error("this source holds its maximum number of unauthenticated connections")]
    SourceTooManyUnauthenticated,
}

impl Refusal {
    /// The metrics label (a closed set).
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Full => "full",
            Refusal::SourceFull => "source_full",
            Refusal::TooManyUnauthenticated => "unauthenticated_full",
            Refusal::SourceTooManyUnauthenticated => "source_unauthenticated_full",
        }
    }
}

/// The key connections are counted under: the IPv4 address, or the IPv6 /64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Source {
    V4(u32),
    V6Prefix(u64),
}

fn source_of(ip: IpAddr) -> Source {
    match ip {
        IpAddr::V4(a) => Source::V4(u32::from(a)),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => Source::V4(u32::from(v4)),
            None => Source::V6Prefix((u128::from(a) >> 64) as u64),
        },
    }
}

#[derive(Default)]
struct Counts {
    open: usize,
    unauthenticated: usize,
}

#[derive(Default)]
struct State {
    total: Counts,
    sources: HashMap<Source, Counts>,
}

/// The connection budget of one listener (see the module doc).
pub struct ConnGate {
    name: &'static str,
    limits: ListenerLimits,
    state: Mutex<State>,
    /// Addresses whose connections skip the stranger bounds (see the module doc).
    trusted: RwLock<HashSet<IpAddr>>,
}

impl ConnGate {
    /// `name` labels the listener in metrics and logs (`https`, `mqtt`, `events`, `cluster`, …).
    pub fn new(name: &'static str, limits: ListenerLimits) -> Arc<ConnGate> {
        Arc::new(ConnGate { name, limits, state: Mutex::new(State::default()), trusted: RwLock::default() })
    }

    /// Replaces the trusted addresses (see the module doc). IPv4-mapped IPv6 addresses count as IPv4.
    pub fn set_trusted(&self, addresses: impl IntoIterator<Item = IpAddr>) {
        let set: HashSet<IpAddr> = addresses.into_iter().map(|a| a.to_canonical()).collect();
        let mut trusted = self.trusted.write().unwrap_or_else(|p| p.into_inner());
        if *trusted != set {
            tracing::debug!(listener = self.name, addresses = ?set, "trusted sources");
            *trusted = set;
        }
    }

    fn is_trusted(&self, peer: IpAddr) -> bool {
        let trusted = self.trusted.read().unwrap_or_else(|p| p.into_inner());
        !trusted.is_empty() && trusted.contains(&peer.to_canonical())
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn limits(&self) -> &ListenerLimits {
        &self.limits
    }

    /// Admits a new, unauthenticated connection from `peer`, or says which bound it would break.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<ConnPermit, Refusal> {
        let source = source_of(peer);
        let l = &self.limits;
        let trusted = self.is_trusted(peer);
        let verdict = {
            let mut st = self.lock();
            let here = st.sources.get(&source);
            let (src_open, src_unauth) = here.map_or((0, 0), |c| (c.open, c.unauthenticated));
            let verdict = if trusted && st.total.open >= l.max_connections.saturating_add(TRUSTED_RESERVE) {
                Err(Refusal::Full)
            } else if trusted && src_unauth >= TRUSTED_UNAUTHENTICATED_PER_SOURCE {
                Err(Refusal::SourceTooManyUnauthenticated)
            } else if trusted {
                Ok(())
            } else if st.total.open >= l.max_connections {
                Err(Refusal::Full)
            } else if l.max_per_source > 0 && src_open >= l.max_per_source {
                Err(Refusal::SourceFull)
            } else if st.total.unauthenticated >= l.max_unauthenticated {
                Err(Refusal::TooManyUnauthenticated)
            } else if l.max_unauthenticated_per_source > 0 && src_unauth >= l.max_unauthenticated_per_source {
                Err(Refusal::SourceTooManyUnauthenticated)
            } else {
                Ok(())
            };
            if verdict.is_ok() {
                st.total.open += 1;
                st.total.unauthenticated += 1;
                let c = st.sources.entry(source).or_default();
                c.open += 1;
                c.unauthenticated += 1;
            }
            verdict
        };
        match verdict {
            Ok(()) => {
                self.publish();
                Ok(ConnPermit { gate: self.clone(), source, authenticated: false })
            }
            Err(r) => {
                metrics::counter!("twinhub_listener_refused_total", "listener" => self.name, "reason" => r.label())
                    .increment(1);
                tracing::debug!(listener = self.name, %peer, "connection refused: {r}");
                Err(r)
            }
        }
    }

    /// Connections open now (authenticated or not).
    pub fn open(&self) -> usize {
        self.lock().total.open
    }

    /// Unauthenticated connections open now.
    pub fn unauthenticated(&self) -> usize {
        self.lock().total.unauthenticated
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The counters stay consistent even if a holder panicked (every update is a few integer ops).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self) {
        let (open, unauth) = {
            let st = self.lock();
            (st.total.open, st.total.unauthenticated)
        };
        metrics::gauge!("twinhub_listener_connections", "listener" => self.name).set(open as f64);
        metrics::gauge!("twinhub_listener_unauthenticated_connections", "listener" => self.name).set(unauth as f64);
    }

    fn authenticate(&self, source: Source) {
        {
            let mut st = self.lock();
            st.total.unauthenticated = st.total.unauthenticated.saturating_sub(1);
            if let Some(c) = st.sources.get_mut(&source) {
                c.unauthenticated = c.unauthenticated.saturating_sub(1);
            }
        }
        self.publish();
    }

    fn release(&self, source: Source, authenticated: bool) {
        {
            let mut st = self.lock();
            st.total.open = st.total.open.saturating_sub(1);
            if !authenticated {
                st.total.unauthenticated = st.total.unauthenticated.saturating_sub(1);
            }
            if let Some(c) = st.sources.get_mut(&source) {
                c.open = c.open.saturating_sub(1);
                if !authenticated {
                    c.unauthenticated = c.unauthenticated.saturating_sub(1);
                }
                if c.open == 0 {
                    st.sources.remove(&source);
                }
            }
        }
        self.publish();
    }
}

/// One admitted connection; dropping it gives the slot back.
pub struct ConnPermit {
    gate: Arc<ConnGate>,
    source: Source,
    authenticated: bool,
}

impl ConnPermit {
    /// The connection proved a credential: it no longer counts as unauthenticated. Idempotent.
    pub fn authenticated(&mut self) {
        if !self.authenticated {
            self.authenticated = true;
            self.gate.authenticate(self.source);
        }
    }

    pub fn is_authenticated(&self) -> bool {
        self.authenticated
    }
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        self.gate.release(self.source, self.authenticated);
    }
}

impl std::fmt::Debug for ConnPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnPermit")
            .field("listener", &self.gate.name)
            .field("authenticated", &self.authenticated)
            .finish()
    }
}

/// The first 64 bits of an IPv6 address (exposed for tests of the grouping).
pub fn v6_prefix(a: Ipv6Addr) -> u64 {
    (u128::from(a) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: usize, per_src: usize, unauth: usize, unauth_src: usize) -> ListenerLimits {
        ListenerLimits {
            max_connections: total,
            max_per_source: per_src,
            max_unauthenticated: unauth,
            max_unauthenticated_per_source: unauth_src,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn unauthenticated_bound_per_source_frees_on_authentication() {
        let g = ConnGate::new("t", limits(100, 0, 50, 2));
        let mut a = g.admit(ip("10.0.0.1")).unwrap();
        let _b = g.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(g.admit(ip("10.0.0.1")).unwrap_err(), Refusal::SourceTooManyUnauthenticated);
        // Another source is not affected.
        let _c = g.admit(ip("10.0.0.2")).unwrap();
        a.authenticated();
        a.authenticated();
        assert_eq!(g.unauthenticated(), 2);
        let _d = g.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(g.open(), 4);
    }

    #[test]
    fn totals_and_release() {
        let g = ConnGate::new("t", limits(3, 2, 3, 0));
        let a = g.admit(ip("10.0.0.1")).unwrap();
        let _b = g.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(g.admit(ip("10.0.0.1")).unwrap_err(), Refusal::SourceFull);
        let _c = g.admit(ip("10.0.0.2")).unwrap();
        assert_eq!(g.admit(ip("10.0.0.3")).unwrap_err(), Refusal::Full);
        drop(a);
        assert_eq!(g.open(), 2);
        let _e = g.admit(ip("10.0.0.3")).unwrap();
    }

    #[test]
    fn unauthenticated_total() {
        let g = ConnGate::new("t", limits(10, 0, 2, 0));
        let mut a = g.admit(ip("10.0.0.1")).unwrap();
        let _b = g.admit(ip("10.0.0.2")).unwrap();
        assert_eq!(g.admit(ip("10.0.0.3")).unwrap_err(), Refusal::TooManyUnauthenticated);
        a.authenticated();
        let _c = g.admit(ip("10.0.0.3")).unwrap();
        drop(a);
        assert_eq!((g.open(), g.unauthenticated()), (2, 2));
    }

    #[test]
    fn ipv6_counts_by_prefix_and_mapped_v4_as_v4() {
        let g = ConnGate::new("t", limits(10, 0, 10, 1));
        let _a = g.admit(ip("2001:db8::1")).unwrap();
        assert_eq!(g.admit(ip("2001:db8::ffff:2")).unwrap_err(), Refusal::SourceTooManyUnauthenticated);
        let _b = g.admit(ip("2001:db8:0:1::1")).unwrap();
        let _c = g.admit(ip("10.1.2.3")).unwrap();
        assert_eq!(g.admit(ip("::ffff:10.1.2.3")).unwrap_err(), Refusal::SourceTooManyUnauthenticated);
        assert_eq!(v6_prefix("2001:db8::1".parse().unwrap()), 0x2001_0db8_0000_0000);
    }

    #[test]
    fn trusted_sources_pass_the_stranger_bounds_up_to_the_reserve() {
        let g = ConnGate::new("t", limits(4, 2, 2, 2));
        let _strangers: Vec<_> = ["10.0.0.1", "10.0.0.2"].iter().map(|a| g.admit(ip(a)).unwrap()).collect();
        assert_eq!(g.admit(ip("10.0.0.3")).unwrap_err(), Refusal::TooManyUnauthenticated);
        assert_eq!(g.admit(ip("10.0.0.9")).unwrap_err(), Refusal::TooManyUnauthenticated, "not trusted yet");
        g.set_trusted([ip("10.0.0.9"), ip("::ffff:10.0.0.8")]);
        let mut members: Vec<_> = Vec::new();
        for _ in 0..TRUSTED_RESERVE + 1 {
            let mut m = g.admit(ip("10.0.0.9")).unwrap();
            m.authenticated();
            members.push(m);
        }
        let _mapped = g.admit(ip("10.0.0.8")).unwrap();
        // The cap plus the reserve, counting everyone: the next trusted connection is refused too.
        assert_eq!(g.open(), 4 + TRUSTED_RESERVE);
        assert_eq!(g.admit(ip("10.0.0.9")).unwrap_err(), Refusal::Full);
        assert_eq!(g.admit(ip("10.0.0.4")).unwrap_err(), Refusal::Full);
        drop(members);
        // A trusted address holds few connections that have not authenticated yet.
        let waiting: Vec<_> =
            (0..TRUSTED_UNAUTHENTICATED_PER_SOURCE).map(|_| g.admit(ip("10.0.0.9")).unwrap()).collect();
        assert_eq!(g.admit(ip("10.0.0.9")).unwrap_err(), Refusal::SourceTooManyUnauthenticated);
        drop(waiting);
        g.set_trusted([]);
        assert_eq!(g.admit(ip("10.0.0.9")).unwrap_err(), Refusal::TooManyUnauthenticated, "no longer trusted");
    }

    #[test]
    fn source_table_is_emptied() {
        let g = ConnGate::new("t", limits(10, 0, 10, 0));
        for i in 0..5 {
            drop(g.admit(ip(&format!("10.0.0.{i}"))).unwrap());
        }
        assert!(g.lock().sources.is_empty());
    }
}
