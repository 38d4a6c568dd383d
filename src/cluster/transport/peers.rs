//! The peer table (node id → address) and the connections to each peer: the main one, and a second
//! for large bodies (see [`Lane`]).
//!
//! A connection is opened on first use and shared by every request to that node (frames carry
//! their request's id, so requests interleave), whatever the shard. When a connect fails the peer enters exponential backoff: until it ends,
//! requests fail at once with [`TransportError::Backoff`] instead of each waiting for a connect timeout
//! (with tens of shards, every group would otherwise block on the same dead node). A connection that
//! closes (the peer restarted, a write failed, keep-alive timeout) is replaced on the next request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::error::TransportError;
use super::TransportConfig;
use crate::ids::NodeId;

/// Peer-table id for an address whose node is not known yet (a node joins through any member): TLS
/// then accepts any node certificate of the cluster CA.
pub const ANY_NODE: NodeId = NodeId::MAX;

/// Addresses of the other nodes, updated at runtime as memberships name them.
#[derive(Default)]
pub struct PeerTable {
    peers: RwLock<HashMap<NodeId, Arc<Peer>>>,
}

impl PeerTable {
    /// Sets a node's address. A changed address drops the old connection and backoff (a node that
    /// moved is not the dead one we backed off from). Returns whether anything changed.
    pub fn set(&self, node: NodeId, addr: impl Into<String>) -> bool {
        let addr = addr.into();
        let mut peers = self.peers.write().unwrap_or_else(|e| e.into_inner());
        if peers.get(&node).is_some_and(|p| p.addr == addr) {
            return false;
        }
        tracing::info!(node, %addr, "cluster peer address set");
        peers.insert(node, Arc::new(Peer::new(node, addr)));
        true
    }

    /// Learns an address from a Raft membership entry. Called for every new network client openraft
    /// makes (on each heartbeat round), so the common case is a read lock and a string compare. An
    /// empty address (a single-voter group's `Node::default()`) says nothing and is ignored.
    pub fn learn(&self, node: NodeId, addr: &str) {
        if addr.is_empty() {
            return;
        }
        let known = self.peers.read().unwrap_or_else(|e| e.into_inner()).get(&node).is_some_and(|p| p.addr == addr);
        if !known {
            self.set(node, addr);
        }
    }

    /// Forgets a node (removed from the cluster); its connection closes when in-flight requests end.
    pub fn remove(&self, node: NodeId) -> bool {
        self.peers.write().unwrap_or_else(|e| e.into_inner()).remove(&node).is_some()
    }

    pub fn addr(&self, node: NodeId) -> Option<String> {
        self.get(node).map(|p| p.addr.clone())
    }

    /// Every known peer and its address, sorted by node id.
    pub fn list(&self) -> Vec<(NodeId, String)> {
        let peers = self.peers.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = peers.iter().map(|(n, p)| (*n, p.addr.clone())).collect();
        out.sort();
        out
    }

    pub(crate) fn get(&self, node: NodeId) -> Option<Arc<Peer>> {
        self.peers.read().unwrap_or_else(|e| e.into_inner()).get(&node).cloned()
    }
}

/// One peer at one address: its connection slot.
pub(crate) struct Peer {
    pub node: NodeId,
    pub addr: String,
    /// Held only for short, non-async sections; connecting happens outside it.
    slot: Mutex<Slot>,
    /// The second connection, for large bodies (see `frame`).
    bulk: Mutex<Slot>,
    /// AppendEntries waiting for a call to this peer (see `batch`).
    pub appends: super::batch::AppendQueue,
}

/// The outcome of one connect attempt, shared by every request waiting for it.
type Connecting = Shared<BoxFuture<'static, Result<Conn, Arc<std::io::Error>>>>;

#[derive(Default)]
struct Slot {
    conn: Option<Conn>,
    /// The attempt in progress: later requests wait for it instead of opening their own connection.
    connecting: Option<Connecting>,
    /// Connects that failed in a row; reset by a successful one.
    failures: u32,
    /// While set and in the future, requests fail fast.
    retry_at: Option<Instant>,
    /// Numbers connections, so a request reporting a broken one does not drop its replacement.
    generation: u64,
}

/// A handle on the peer's connection; cloning it is how requests share the connection.
#[derive(Clone)]
pub(crate) struct Conn {
    pub sender: super::frame::Sender,
    pub generation: u64,
    pub lane: Lane,
}

/// Which of a peer's two connections: the main one, or the one for large bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    Main,
    Bulk,
}

impl Lane {
    /// Large bodies go on their own connection, so they never hold up heartbeats and appends.
    pub fn for_body(len: usize) -> Lane {
        if len > super::frame::BULK_BODY {
            Lane::Bulk
        } else {
            Lane::Main
        }
    }
}

impl Peer {
    fn new(node: NodeId, addr: String) -> Peer {
        Peer { node, addr, slot: Mutex::default(), bulk: Mutex::default(), appends: Default::default() }
    }

    fn slot(&self, lane: Lane) -> std::sync::MutexGuard<'_, Slot> {
        match lane {
            Lane::Main => &self.slot,
            Lane::Bulk => &self.bulk,
        }
        .lock()
        .unwrap_or_else(|e| e.into_inner())
    }

    /// The live connection, opening one if there is none and the peer is not in backoff.
    ///
    /// Cancel safety: the connect runs in its own task and records its outcome (connection, or
    /// failure and backoff) itself, so a request whose deadline ends first does not lose it; without
    /// that, a peer that swallows SYNs would never enter backoff when deadlines are shorter than the
    /// connect timeout (AppendEntries' is below 200 ms).
    pub async fn conn(self: &Arc<Self>, config: &TransportConfig, lane: Lane) -> Result<Conn, TransportError> {
        let connecting = {
            let mut slot = self.slot(lane);
            if let Some(conn) = &slot.conn {
                if !conn.sender.is_closed() {
                    return Ok(conn.clone());
                }
                tracing::debug!(node = self.node, addr = %self.addr, "connection closed; reconnecting");
                slot.conn = None;
            }
            match &slot.connecting {
                Some(c) => c.clone(),
                None => {
                    let now = Instant::now();
                    if let Some(at) = slot.retry_at.filter(|at| *at > now) {
                        return Err(TransportError::Backoff {
                            node: self.node,
                            addr: self.addr.clone(),
                            failures: slot.failures,
                            retry_in: at - now,
                        });
                    }
                    let task = tokio::spawn(self.clone().connect_and_record(config.clone(), lane));
                    let c: Connecting = async move {
                        task.await
                            .unwrap_or_else(|e| Err(Arc::new(std::io::Error::other(format!("connect task: {e}")))))
                    }
                    .boxed()
                    .shared();
                    slot.connecting = Some(c.clone());
                    c
                }
            }
        };
        connecting.await.map_err(|e| TransportError::Connect { node: self.node, addr: self.addr.clone(), source: e })
    }

    /// One connect attempt, bounded by the connect timeout; records the outcome in the slot.
    async fn connect_and_record(
        self: Arc<Self>,
        config: TransportConfig,
        lane: Lane,
    ) -> Result<Conn, Arc<std::io::Error>> {
        let result = match tokio::time::timeout(config.connect_timeout, connect(&self.addr, self.node, &config)).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no connection within {:?}", config.connect_timeout),
            )),
        };
        let mut slot = self.slot(lane);
        slot.connecting = None;
        match result {
            Ok(sender) => {
                slot.generation += 1;
                slot.failures = 0;
                slot.retry_at = None;
                let conn = Conn { sender, generation: slot.generation, lane };
                slot.conn = Some(conn.clone());
                metrics::counter!("twinhub_rpc_connects_total", "peer" => self.node.to_string()).increment(1);
                tracing::debug!(node = self.node, addr = %self.addr, "connected");
                Ok(conn)
            }
            Err(e) => {
                slot.failures = slot.failures.saturating_add(1);
                let delay = backoff_delay(&config, slot.failures);
                slot.retry_at = Some(Instant::now() + delay);
                metrics::counter!("twinhub_rpc_connect_failures_total", "peer" => self.node.to_string()).increment(1);
                // Once per outage, not once per attempt: a dead peer would otherwise log every few seconds.
                if slot.failures == 1 {
                    tracing::warn!(node = self.node, addr = %self.addr, ?delay, "connect failed: {e}; backing off");
                } else {
                    tracing::debug!(
                        node = self.node,
                        failures = slot.failures,
                        ?delay,
                        "connect failed: {e}; backing off"
                    );
                }
                Err(Arc::new(e))
            }
        }
    }

    /// How many connections to this peer were opened (tests: requests share one).
    #[cfg(test)]
    pub fn connections_opened(&self) -> u64 {
        self.slot(Lane::Main).generation
    }

    /// A request failed on connection `generation`: drop it so the next request reconnects.
    pub fn broken(&self, conn: &Conn) {
        let (generation, mut slot) = (conn.generation, self.slot(conn.lane));
        if slot.conn.as_ref().is_some_and(|c| c.generation == generation) {
            slot.conn = None;
        }
    }
}

/// `backoff_min · 2^(failures-1)`, capped at `backoff_max`.
fn backoff_delay(config: &TransportConfig, failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(20);
    config.backoff_min.saturating_mul(1 << exp).min(config.backoff_max)
}

/// Opens TCP (no Nagle: Raft messages are small and latency-bound), then TLS verifying that the
/// other end holds node `node`'s certificate (unless the node runs in plaintext), and starts the
/// connection's frames (its reader and keep-alive tasks end when it closes).
async fn connect(addr: &str, node: NodeId, config: &TransportConfig) -> std::io::Result<super::frame::Sender> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    match &config.tls {
        None => Ok(start(Box::new(tcp), config)),
        Some(tls) => {
            // An address whose node is not known yet (joining through any member): any node of the
            // cluster CA will do; otherwise exactly the node meant.
            let client = if node == ANY_NODE { tls.client_any_node.clone() } else { tls.client.clone() };
            let connector = tokio_rustls::TlsConnector::from(client);
            let stream = connector.connect(crate::tls::cluster::ClusterTls::server_name(node), tcp).await?;
            Ok(start(Box::new(stream), config))
        }
    }
}

/// Starts the frames on a connected stream; answers may be as large as the largest body.
fn start(io: super::frame::BoxIo, config: &TransportConfig) -> super::frame::Sender {
    let limits = &config.limits;
    let largest = limits.small.max(limits.append).max(limits.snapshot).max(limits.call);
    super::frame::Sender::start(io, largest, config.keepalive)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_backoff_doubles_up_to_the_cap() {
        let mut c = TransportConfig::new(1, super::super::ClusterSecret::new(b"k").expect("secret"));
        c.backoff_min = Duration::from_millis(50);
        c.backoff_max = Duration::from_secs(2);
        let d: Vec<u64> = (1..=8).map(|f| backoff_delay(&c, f).as_millis() as u64).collect();
        assert_eq!(d, vec![50, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(backoff_delay(&c, u32::MAX), Duration::from_secs(2));
    }

    #[test]
    fn test_learn_ignores_empty_and_keeps_unchanged() {
        let t = PeerTable::default();
        t.learn(2, "");
        assert_eq!(t.addr(2), None);
        t.learn(2, "127.0.0.1:1");
        let first = t.get(2).expect("peer");
        t.learn(2, "127.0.0.1:1");
        assert!(Arc::ptr_eq(&first, &t.get(2).expect("peer")), "unchanged address must keep the connection");
        assert!(t.set(2, "127.0.0.1:2"));
        assert_eq!(t.list(), vec![(2, "127.0.0.1:2".to_string())]);
        assert!(t.remove(2));
    }
}
