//! Fast failover: noticing a dead leader without waiting out the election timeout.
//!
//! When a node's process dies, its kernel closes its sockets at once: the followers see the leader's
//! connections end within a millisecond. Raft alone would wait for the leader lease and a randomized
//! election timeout (together 1.5–2 × the maximum timeout) before anyone campaigns. Here:
//!
//! 1. A connection from node N ends (the listener tells [`on_connection_closed`]). We *probe* N: a
//!    TCP connect to its inter-node address. Only `ECONNREFUSED` — nothing listens there any more, the
//!    process is gone — counts as dead; a timeout, an accepted connection or any other error leaves
//!    everything to Raft's own timers. A partitioned, flapping or slow leader is never probed dead (a
//!    dropped packet times out, it is not refused), so this cannot disrupt a healthy leader.
//! 2. For every local group that still names N as leader and in which this node is a voter, the voters
//!    other than N campaign in id order, the first at once and each next one a stagger later if no new
//!    leader has appeared meanwhile (so they do not split the vote).
//! 3. A voter asked for its vote while its lease on N is still valid would refuse (the lease protects a
//!    live leader). [`vouch`] lets it grant the vote anyway, but only after its *own* probe of N is
//!    refused — it never takes the candidate's word for it.
//!
//! Safety does not depend on any of this: Raft's vote and log rules still decide who wins, and reads
//! go through the read index (a quorum round), not the lease, so a leader that is in fact alive can
//! never serve a stale read because of an early election.

use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::raft::VoteRequest;

use super::peers::PeerTable;
use super::server::LocalGroups;
use crate::ids::NodeId;
use crate::storage::types::TypeConfig;

/// Longest wait for a probe's connect: a refused one comes back in well under a millisecond on a LAN.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// How long an accepted probe connection is watched for a hang-up before the node counts as alive.
const PROBE_LISTEN: Duration = Duration::from_millis(50);
/// Accepted-then-dropped connects in a row that count as gone (a dying process's backlog).
const PROBE_ATTEMPTS: usize = 3;
/// Between the campaigns of successive voters of one group.
const STAGGER: Duration = Duration::from_millis(150);

/// Is node `node` gone: does its inter-node address refuse connections?
///
/// A process being killed closes its established connections and its listening socket one after the
/// other, and until the listener is closed the kernel still completes handshakes into its backlog. So
/// an accepted connect proves nothing by itself: the probe then waits a moment for the other end to
/// speak or hang up. A live node waits for our TLS hello and says nothing; a dying one resets the
/// connection as its listener closes. Refused, reset or closed: gone. Silent, or no answer to the
/// connect at all (a partition): not known to be gone, and Raft's own timers decide.
pub async fn probe_gone(peers: &PeerTable, node: NodeId) -> bool {
    use tokio::io::AsyncReadExt;
    let Some(addr) = peers.addr(node) else { return false };
    for _ in 0..PROBE_ATTEMPTS {
        match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(&addr)).await {
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => return true,
            Ok(Err(_)) | Err(_) => return false,
            Ok(Ok(mut stream)) => {
                let mut byte = [0u8; 1];
                match tokio::time::timeout(PROBE_LISTEN, stream.read(&mut byte)).await {
                    // Silence: someone is there, waiting for us to start.
                    Err(_) => return false,
                    // Closed or reset before we said anything: the process is going; ask again.
                    Ok(Ok(0)) | Ok(Err(_)) => {}
                    // It spoke first: not our server, but alive.
                    Ok(Ok(_)) => return false,
                }
            }
        }
    }
    // Every attempt was accepted and then dropped: nobody is serving there.
    true
}

/// A connection from `node` ended: if `node` is gone, campaign in the groups it led.
pub fn on_connection_closed(me: NodeId, node: NodeId, groups: LocalGroups, peers: Arc<PeerTable>) {
    if node == me {
        return;
    }
    // Only groups that still name `node` as leader matter; none, no probe.
    let led: Vec<_> = groups
        .shards()
        .into_iter()
        .filter_map(|s| groups.get(s).map(|r| (s, r)))
        .filter(|(_, r)| leader_of(r) == Some(node))
        .collect();
    if led.is_empty() {
        return;
    }
    tokio::spawn(async move {
        if !probe_gone(&peers, node).await {
            return;
        }
        tracing::info!(
            node,
            groups = led.len(),
            "leader's process is gone (connection refused): campaigning without waiting for the election timeout"
        );
        for (shard, raft) in led {
            let (voters, term) = {
                let m = raft.metrics().borrow_watched().clone();
                (
                    m.membership_config.membership().voter_ids().filter(|v| *v != node).collect::<Vec<NodeId>>(),
                    m.current_term,
                )
            };
            let Some(rank) = voters.iter().position(|v| *v == me) else { continue };
            tokio::spawn(async move {
                tokio::time::sleep(STAGGER * rank as u32).await;
                // Someone else campaigned meanwhile (this node saw a higher term), or a leader is
                // known: leave the rest to Raft rather than start a competing election.
                let m = raft.metrics().borrow_watched().clone();
                if m.current_leader != Some(node) || m.current_term > term {
                    return;
                }
                metrics::counter!("twinhub_shard_fast_elections_total", "shard" => shard.to_string()).increment(1);
                tracing::info!(shard, dead_leader = node, rank, "campaigning: the leader's process is gone");
                if let Err(e) = raft.trigger().elect(false).await {
                    tracing::warn!(shard, "could not start an election: {e}");
                }
            });
        }
    });
}

/// Lets this voter grant `req` during its lease on a leader that its own probe finds gone (see the
/// module doc). Changes nothing otherwise.
pub async fn vouch(raft: &crate::storage::types::Raft, peers: &PeerTable, req: &mut VoteRequest<TypeConfig>) {
    if req.leadership_transfer {
        return;
    }
    let m = raft.metrics().borrow_watched().clone();
    let candidate = req.vote.leader_id().node_id;
    let Some(leader) = m.current_leader else { return };
    if leader == candidate || leader == m.id || req.vote.leader_id().term <= m.current_term {
        return;
    }
    if !probe_gone(peers, leader).await {
        return;
    }
    // The leader is gone. If this voter holds entries the candidate lacks, Raft will refuse the
    // candidate (and only a voter at least as up to date can win): this one campaigns instead, at
    // once, rather than leave it to the election timeout.
    let mine = m.last_log_index.unwrap_or(0);
    let theirs = req.last_log_id.as_ref().map_or(0, |l| l.index());
    if mine > theirs {
        tracing::info!(
            candidate,
            dead_leader = leader,
            mine,
            theirs,
            "the candidate lacks entries this voter has: campaigning instead"
        );
        let raft = raft.clone();
        tokio::spawn(async move {
            // After this vote's refusal has gone out.
            tokio::time::sleep(Duration::from_millis(5)).await;
            if raft.metrics().borrow_watched().current_leader.is_none_or(|l| l == leader) {
                // The refused candidate voted for itself in the next term, so a campaign in that same
                // term could not get its vote: the second trigger supersedes the first one term
                // higher, where the candidate (less up to date) grants it.
                let _ = raft.trigger().elect(false).await;
                let _ = raft.trigger().elect(false).await;
            }
        });
        return;
    }
    tracing::info!(candidate, dead_leader = leader, "granting an early vote: the leader's process is gone");
    req.leadership_transfer = true;
}

fn leader_of(raft: &crate::storage::types::Raft) -> Option<NodeId> {
    raft.metrics().borrow_watched().current_leader
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn table_for(addr: std::net::SocketAddr) -> PeerTable {
        let t = PeerTable::default();
        t.set(7, addr.to_string());
        t
    }

    #[tokio::test]
    async fn a_closed_port_is_gone_a_silent_listener_is_not_and_a_dying_backlog_is() {
        // Nothing listens: refused.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        assert!(probe_gone(&table_for(addr).await, 7).await);

        // A live server accepts and waits for the client to speak.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut keep = Vec::new();
            while let Ok((s, _)) = l.accept().await {
                keep.push(s);
            }
        });
        assert!(!probe_gone(&table_for(addr).await, 7).await);
        held.abort();

        // Connections accepted and dropped at once (a process on its way out): gone.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let dropper = tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                drop(s);
            }
        });
        assert!(probe_gone(&table_for(addr).await, 7).await);
        dropper.abort();

        // An unknown node is never gone.
        assert!(!probe_gone(&PeerTable::default(), 9).await);
    }
}
