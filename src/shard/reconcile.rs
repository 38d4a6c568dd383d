//! The reconciler: every node, every half second, moves what it is responsible for towards the
//! cluster map.
//!
//! - The metadata leader founds the map, keeps every member in the metadata group (voters: the lowest
//!   active ids; everyone else a learner, so every node has the map) and forgets drained nodes.
//! - Every node opens the groups the map places on it, and closes those it has been removed from.
//! - A shard's leader changes its group's membership towards the map's replicas, one openraft step at
//!   a time: add a learner and wait for it to catch up, promote it, and only then remove the replica
//!   that leaves (so a shard never has fewer than its replication factor while it moves). It hands
//!   leadership to the map's preferred leader once that replica has caught up.
//! - Every node tails the change events of the shards it does not host (see [`super::tail`]).
//!
//! Each step is idempotent and derived from the current map and memberships only, so a node that
//! crashes mid-move, or a leader that changes, simply continues from what is there.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::ChangeMembers;
use openraft::Instant as _;

use super::tail::{EventPage, LONG_POLL};
use super::types::Node;
use super::{Shard, ShardError, Shards};
use crate::cluster::map::{ClusterOp, MemberState, REPLICATION_FACTOR};
use crate::cluster::transport::Call;
use crate::ids::{NodeId, ShardId};

/// Peer-table id under which a joining node dials the address it joins through (it does not know
/// that member's id yet; node ids are never this large).
pub const JOIN_PEER: NodeId = crate::cluster::transport::peers::ANY_NODE;

/// The backoff key of the metadata group's leadership (shard ids never reach it).
const META_TRANSFER_KEY: ShardId = ShardId::MAX;

/// Entries a replica may lag before it is given leadership.
const CAUGHT_UP: u64 = 100;
/// A leadership target must have acknowledged the leader within this (heartbeats come every 100 ms
/// by default).
const RECENT_ACK: Duration = Duration::from_secs(1);

/// Tasks a node runs next to its groups: event tails of shards hosted elsewhere.
#[derive(Default)]
pub struct Reconciler {
    tails: HashMap<ShardId, tokio::task::JoinHandle<()>>,
    passes: u64,
}

impl Drop for Reconciler {
    fn drop(&mut self) {
        for (_, t) in self.tails.drain() {
            t.abort();
        }
    }
}

impl Shards {
    /// Registers the calls the reconciler answers. Call once after [`Shards::open`].
    pub fn serve_reconciler_calls(self: &Arc<Self>) {
        let Some(t) = &self.config.transport else { return };
        let s = Arc::downgrade(self);
        t.handlers().register(Call::NodeStatus, move |_from, _body: bytes::Bytes| {
            let s = s.clone();
            async move { json_answer(&s.upgrade().map(|s| s.status()).unwrap_or_default()) }
        });
        let s = Arc::downgrade(self);
        t.handlers().register(Call::ClusterJoin, move |_from, body: bytes::Bytes| {
            let s = s.clone();
            async move {
                let (id, addr, shards): (NodeId, String, u32) = serde_json::from_slice(&body)
                    .map_err(|e| crate::cluster::transport::CallError(format!("bad join request: {e}")))?;
                let r = match s.upgrade() {
                    Some(s) => match join_refusal(&s.map(), id, shards) {
                        Some(refused) => Err(refused),
                        None => s.propose(ClusterOp::AddNode { id, addr }).await,
                    },
                    None => Err(ShardError::ShuttingDown { shard: super::META }),
                };
                json_answer(&r)
            }
        });
        let s = Arc::downgrade(self);
        t.handlers().register(Call::ClusterShardCount, move |_from, _body: bytes::Bytes| {
            let s = s.clone();
            async move {
                let r = match s.upgrade() {
                    Some(s) => {
                        let map = s.map();
                        Ok(ShardCounts {
                            cluster: map.is_initialized().then_some(map.shard_count),
                            node: s.shard_count,
                        })
                    }
                    None => Err(ShardError::ShuttingDown { shard: super::META }),
                };
                json_answer(&r)
            }
        });
        let s = Arc::downgrade(self);
        t.handlers().register(Call::ShardDropped, move |_from, body: bytes::Bytes| {
            let s = s.clone();
            async move {
                let id: ShardId = postcard::from_bytes(&body)
                    .map_err(|e| crate::cluster::transport::CallError(format!("bad shard id: {e}")))?;
                if let Some(s) = s.upgrade() {
                    if !s.map().replicas(id).contains(&s.node_id) {
                        s.close_group(id).await;
                    }
                }
                Ok(bytes::Bytes::new())
            }
        });
    }

    /// Asks the cluster to add this node (`--join`), through the given member, until the map lists it.
    /// A refusal (a retired id, an id in use at another address) is final and logged as an error.
    pub async fn join(self: &Arc<Self>, via: &str, advertise: &str) {
        let Some(t) = self.config.transport.clone() else { return };
        t.peers().set(JOIN_PEER, via.to_string());
        let mut pause = Duration::from_millis(200);
        while !self.map().members.contains_key(&self.node_id) {
            let Ok(body) = serde_json::to_vec(&(self.node_id, advertise, self.shard_count)) else { return };
            match t.call(JOIN_PEER, Call::ClusterJoin, body.into(), Some(Duration::from_secs(15))).await {
                Ok(answer) => match serde_json::from_slice::<Result<(), ShardError>>(&answer) {
                    Ok(Ok(())) => tracing::info!(via, "joined the cluster map; waiting for replicas"),
                    Ok(Err(ShardError::Refused { msg })) => {
                        tracing::error!(via, "the cluster refused this node: {msg}");
                        return;
                    }
                    Ok(Err(e)) => tracing::warn!(via, "joining: {e}"),
                    Err(e) => tracing::warn!(via, "joining: bad answer: {e}"),
                },
                Err(e) => tracing::warn!(via, "joining: {e}"),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }

    /// One reconciliation pass (see the module doc). Never fails: what cannot be done now is retried
    /// on the next pass.
    pub async fn reconcile(self: &Arc<Self>, r: &mut Reconciler) {
        let Some(meta) = self.meta.clone() else { return };
        r.passes += 1;
        let map = self.map();
        if let Some(t) = &self.config.transport {
            for (id, m) in &map.members {
                if *id != self.node_id {
                    t.peers().learn(*id, &m.addr);
                }
            }
        }
        if meta.is_leader() {
            self.lead_meta(&meta, r.passes).await;
        }
        if !map.is_initialized() {
            return;
        }
        // A node started with another count than the cluster's would hash devices to the wrong
        // groups: it opens none, routes nothing (see `Shards::route`) and `node::run` stops it.
        if let Some(refused) = join_refusal(&map, self.node_id, self.shard_count) {
            if r.passes % 20 == 1 {
                tracing::error!("{refused}");
            }
            return;
        }
        for id in map.shards_of(self.node_id) {
            if let Err(e) = self.ensure_group(id, &map).await {
                tracing::warn!(shard = id, "opening a replica the map places here: {e}");
            }
        }
        for shard in self.hosted() {
            let target: BTreeSet<NodeId> = map.replicas(shard.id).into_iter().collect();
            if shard.is_leader() {
                self.lead_shard(&shard, &target, map.preferred_leader(shard.id)).await;
            } else if !target.contains(&self.node_id) && !shard.is_member(self.node_id) {
                self.close_group(shard.id).await;
            }
        }
        // Event tails for the shards hosted elsewhere.
        r.tails.retain(|id, task| {
            let keep = !task.is_finished() && self.local(*id).is_none();
            if !keep {
                task.abort();
            }
            keep
        });
        if self.config.events.is_some() {
            for id in 0..self.shard_count {
                if self.local(id).is_none() && !r.tails.contains_key(&id) {
                    r.tails.insert(id, tokio::spawn(tail(Arc::downgrade(self), id)));
                }
            }
        }
    }

    /// Metadata leader duties.
    async fn lead_meta(self: &Arc<Self>, meta: &Arc<Shard>, pass: u64) {
        let map = self.map();
        if !map.is_initialized() {
            if let Err(not_yet) = self.founders_agree().await {
                match not_yet {
                    Founding::Disagree { .. } if pass % 10 == 1 => {
                        tracing::error!("not founding the cluster map: {not_yet}")
                    }
                    Founding::Waiting { .. } if pass % 10 == 1 => {
                        tracing::info!("not founding the cluster map yet: {not_yet}")
                    }
                    _ => {}
                }
                return;
            }
            let op = ClusterOp::Init {
                shard_count: self.shard_count,
                rf: REPLICATION_FACTOR,
                members: self.config.members.clone(),
            };
            if let Err(e) = self.propose(op).await {
                tracing::warn!("founding the cluster map: {e}");
            }
            return;
        }
        let membership = meta.raft.metrics().borrow_watched().membership_config.membership().clone();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let nodes: BTreeSet<NodeId> = membership.nodes().map(|(id, _)| *id).collect();
        // Every member follows the map (as a learner at least).
        let missing: BTreeMap<NodeId, Node> = map
            .members
            .iter()
            .filter(|(id, _)| !nodes.contains(id))
            .map(|(id, m)| (*id, Node { addr: m.addr.clone() }))
            .collect();
        for (id, node) in missing {
            if let Err(e) = meta.raft.add_learner(id, node, false).await {
                tracing::warn!(node = id, "adding a metadata learner: {e}");
                return;
            }
        }
        let target: BTreeSet<NodeId> = map.meta_voters().into_iter().collect();
        let change = if let Some(v) = target.iter().find(|v| !voters.contains(v)) {
            Some(ChangeMembers::AddVoterIds([*v].into()))
        } else if let Some(v) = voters.iter().find(|v| !target.contains(v) && **v != self.node_id) {
            // Demoted to a learner: it still follows the map.
            Some(ChangeMembers::RemoveVoters([*v].into()))
        } else if voters.contains(&self.node_id) && !target.contains(&self.node_id) {
            if let Some(to) = target.iter().next() {
                if self.may_transfer(META_TRANSFER_KEY) {
                    let _ = meta.raft.trigger().transfer_leader(*to).await;
                }
            }
            None
        } else {
            let gone: BTreeSet<NodeId> =
                nodes.iter().filter(|n| !map.members.contains_key(n) && !voters.contains(n)).copied().collect();
            (!gone.is_empty()).then_some(ChangeMembers::RemoveNodes(gone))
        };
        if let Some(change) = change {
            tracing::info!(?change, "metadata group membership");
            if let Err(e) = meta.raft.change_membership(change, true).await {
                tracing::warn!("metadata membership change: {e}");
            }
        }
        // Forget drained nodes (every two seconds: it asks every node).
        let leaving: Vec<NodeId> =
            map.members.iter().filter(|(_, m)| m.state == MemberState::Leaving).map(|(id, _)| *id).collect();
        if !leaving.is_empty() && pass.is_multiple_of(4) {
            let views = self.cluster_status().await;
            for node in leaving {
                if self.drained(node, &views) {
                    match self.propose(ClusterOp::Forget { id: node }).await {
                        Ok(()) => tracing::info!(node, "node drained: its id is retired"),
                        Err(e) => tracing::debug!(node, "forgetting a drained node: {e}"),
                    }
                }
            }
        }
    }

    /// Whether the founding members were started with this node's shard count, asked of each before
    /// the map is founded with it. The map's count is final once founded, and a founder started with
    /// another count would route every device to the wrong group, so one that disagrees stops the
    /// founding, and the founders' logs name both counts. Every founder must answer: a new cluster
    /// needs all of them anyway, as each one initializes the groups it is the founding leader of.
    async fn founders_agree(&self) -> Result<(), Founding> {
        let Some(t) = &self.config.transport else { return Ok(()) };
        let asks = self.config.members.keys().filter(|id| **id != self.node_id).map(|&id| async move {
            let answer = t.call(id, Call::ClusterShardCount, bytes::Bytes::new(), Some(Duration::from_secs(2))).await;
            match serde_json::from_slice::<Result<ShardCounts, ShardError>>(&answer.ok()?) {
                Ok(Ok(counts)) => Some((id, counts.node)),
                _ => None,
            }
        });
        let answers: Vec<(NodeId, u32)> = futures::future::join_all(asks).await.into_iter().flatten().collect();
        founding_check(self.shard_count, self.config.members.len(), &answers)
    }

    /// True when, for every shard, the view of its leader names `node` neither as voter nor learner.
    fn drained(&self, node: NodeId, views: &BTreeMap<NodeId, Vec<ShardStatusView>>) -> bool {
        (0..self.shard_count).all(|id| {
            let leader_view = views.values().flatten().filter(|s| s.shard == id && s.is_leader).max_by_key(|s| s.term);
            leader_view.is_some_and(|s| !s.voters.contains(&node) && !s.learners.contains(&node))
        })
    }

    /// Every reachable node's view of the groups it hosts (this one included), by node.
    pub async fn cluster_status(&self) -> BTreeMap<NodeId, Vec<ShardStatusView>> {
        let mut out = BTreeMap::from([(self.node_id, self.status().into_iter().map(ShardStatusView::from).collect())]);
        let Some(t) = &self.config.transport else { return out };
        let members: Vec<NodeId> = self.map().members.keys().copied().collect();
        let calls = members.iter().filter(|id| **id != self.node_id).map(|id| {
            let t = t.clone();
            let id = *id;
            async move {
                let r = t.call(id, Call::NodeStatus, bytes::Bytes::new(), Some(Duration::from_secs(1))).await;
                (id, r.ok().and_then(|b| serde_json::from_slice::<Vec<ShardStatusView>>(&b).ok()))
            }
        });
        for (id, view) in futures::future::join_all(calls).await {
            if let Some(v) = view {
                out.insert(id, v);
            }
        }
        out
    }

    /// Shard leader duties: membership towards `target`, then leadership to the preferred replica.
    async fn lead_shard(self: &Arc<Self>, shard: &Arc<Shard>, target: &BTreeSet<NodeId>, preferred: Option<NodeId>) {
        if target.is_empty() {
            return;
        }
        let st = shard.status();
        let voters: BTreeSet<NodeId> = st.voters.iter().copied().collect();
        let learners: BTreeSet<NodeId> = st.learners.iter().copied().collect();
        let busy = {
            let changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
            changing.contains(&shard.id)
        };
        if busy {
            return;
        }
        let map = self.map();
        if let Some(add) = target.iter().find(|n| !voters.contains(n)).copied() {
            let Some(addr) = map.addr(add).map(str::to_string) else { return };
            self.spawn_change(shard.clone(), move |s| async move { s.add_voter(add, &addr).await });
            return;
        }
        if let Some(remove) = voters.iter().find(|n| !target.contains(n) && **n != self.node_id).copied() {
            let me = Arc::downgrade(self);
            self.spawn_change(shard.clone(), move |s| async move {
                s.remove_voter(remove).await?;
                notify_dropped(me, s.id, remove).await;
                Ok(())
            });
            return;
        }
        if let Some(stray) = learners.iter().find(|n| !target.contains(n)).copied() {
            self.spawn_change(shard.clone(), move |s| async move { s.remove_learner(stray).await });
            return;
        }
        // Leadership: to the preferred replica, or away from this node if the map moved it off.
        let to = match preferred {
            Some(p) if p != self.node_id && voters.contains(&p) => Some(p),
            _ if !target.contains(&self.node_id) => target.iter().next().copied(),
            _ => None,
        };
        let Some(to) = to else {
            self.transfers.lock().unwrap_or_else(|e| e.into_inner()).settled(shard.id);
            return;
        };
        // Only to a replica that answered lately: right after a failover the new leader still lists
        // the dead one with a small lag, and a transfer to it would stop writes again.
        let answered_lately = {
            let m = shard.raft.metrics().borrow_watched().clone();
            m.heartbeat.as_ref().and_then(|h| h.get(&to).cloned().flatten()).is_some_and(|at| at.elapsed() < RECENT_ACK)
        };
        if answered_lately && st.lag.get(&to).is_some_and(|lag| *lag < CAUGHT_UP) && self.may_transfer(shard.id) {
            tracing::info!(shard = shard.id, to, "moving leadership to its preferred replica");
            metrics::counter!("twinhub_shard_leader_transfers_total", "shard" => shard.id.to_string()).increment(1);
            let _ = shard.raft.trigger().transfer_leader(to).await;
        }
    }

    /// Whether a leadership transfer of `shard` may be tried now (see [`super::backoff`]).
    fn may_transfer(&self, shard: ShardId) -> bool {
        self.transfers.lock().unwrap_or_else(|e| e.into_inner()).try_transfer(shard, std::time::Instant::now())
    }

    /// Runs one membership change of `shard` in the background (adding a learner waits for it to catch
    /// up, which can take a snapshot transfer); the shard is skipped by later passes until it is done.
    fn spawn_change<F, Fut>(self: &Arc<Self>, shard: Arc<Shard>, change: F)
    where
        F: FnOnce(Arc<Shard>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<(), ShardError>> + Send + 'static,
    {
        self.changing.lock().unwrap_or_else(|e| e.into_inner()).insert(shard.id);
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let id = shard.id;
            match tokio::time::timeout(Duration::from_secs(120), change(shard)).await {
                Ok(Ok(())) => tracing::info!(shard = id, "membership step done"),
                Ok(Err(e)) => tracing::warn!(shard = id, "membership step: {e}"),
                Err(_) => tracing::warn!(shard = id, "membership step timed out"),
            }
            if let Some(s) = me.upgrade() {
                s.changing.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            }
        });
    }
}

/// What a peer reports of one group (the fields of `ShardStatus` the reconciler needs).
#[derive(Clone, Debug, serde::Deserialize)]
pub struct ShardStatusView {
    pub shard: ShardId,
    pub is_leader: bool,
    pub term: u64,
    pub voters: Vec<NodeId>,
    pub learners: Vec<NodeId>,
}

impl From<super::ShardStatus> for ShardStatusView {
    fn from(s: super::ShardStatus) -> Self {
        ShardStatusView { shard: s.shard, is_leader: s.is_leader, term: s.term, voters: s.voters, learners: s.learners }
    }
}

async fn notify_dropped(me: Weak<Shards>, shard: ShardId, node: NodeId) {
    let Some(t) = me.upgrade().and_then(|s| s.config.transport.clone()) else { return };
    let Ok(body) = postcard::to_allocvec(&shard) else { return };
    if let Err(e) = t.call(node, Call::ShardDropped, body.into(), Some(Duration::from_secs(2))).await {
        tracing::debug!(shard, node, "telling a removed replica: {e}");
    }
}

/// Follows the change events of a shard hosted elsewhere and hands them to this node's hub, until the
/// shard is hosted here (or the node stops).
async fn tail(shards: Weak<Shards>, id: ShardId) {
    let mut cursor: Option<u64> = None;
    let mut attempt = 0usize;
    let mut touched: Option<std::time::Instant> = None;
    loop {
        let Some(s) = shards.upgrade() else { return };
        if s.local(id).is_some() {
            return;
        }
        let (Some(t), Some(sink)) = (s.config.transport.clone(), s.config.events.clone()) else { return };
        let route = s.route(id);
        drop(s);
        let node = match route.leader {
            Some(l) if attempt == 0 => Some(l),
            _ => route.replicas.get(attempt % route.replicas.len().max(1)).copied(),
        };
        let Some(node) = node else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        // Keep the other replicas' rings recording too (a ring nobody reads stops), so that when this
        // one fails or restarts the tail goes on from another without a gap.
        if touched.is_none_or(|t| t.elapsed() >= super::tail::TOUCH_EVERY) {
            touched = Some(std::time::Instant::now());
            for other in route.replicas.iter().copied().filter(|r| *r != node) {
                let (t, body) = (t.clone(), postcard::to_allocvec(&(id, None::<u64>)).unwrap_or_default());
                tokio::spawn(async move {
                    let _ = t.call(other, Call::ShardEvents, body.into(), Some(Duration::from_secs(3))).await;
                });
            }
        }
        let Ok(body) = postcard::to_allocvec(&(id, cursor)) else { return };
        let answer = t.call(node, Call::ShardEvents, body.into(), Some(LONG_POLL + Duration::from_secs(3))).await;
        let page = answer
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<Result<EventPage, ShardError>>(&b).map_err(|e| e.to_string()))
            .and_then(|r| r.map_err(|e| e.to_string()));
        match page {
            Ok(page) => {
                if page.gap {
                    metrics::counter!("twinhub_event_tail_gaps_total").increment(1);
                    tracing::warn!(
                        shard = id,
                        node,
                        "event tail fell behind: some change events were skipped; feed consumers are told to resync"
                    );
                    (sink.gap)(id);
                }
                let mut last = cursor;
                for (index, events) in page.events() {
                    (sink.publish)(id, events);
                    last = Some(index);
                }
                if let Some((index, _)) = page.entries.last() {
                    last = Some(last.map_or(*index, |l| l.max(*index)));
                }
                cursor = match (last, cursor) {
                    (Some(l), _) => Some(l),
                    (None, None) => Some(page.head),
                    (None, c) => c,
                };
            }
            Err(e) => {
                tracing::debug!(shard = id, node, "event tail: {e}");
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

impl Shard {
    /// Whether `node` is a voter or learner of this group as this replica knows it.
    pub fn is_member(&self, node: NodeId) -> bool {
        let m = self.raft.metrics().borrow_watched().membership_config.clone();
        let member = m.membership().voter_ids().any(|v| v == node) || m.membership().learner_ids().any(|v| v == node);
        member
    }

    /// Drops a learner that the map no longer wants (e.g. an add that was abandoned midway).
    pub async fn remove_learner(&self, node: NodeId) -> Result<(), ShardError> {
        match self.raft.change_membership(ChangeMembers::RemoveNodes([node].into()), false).await {
            Ok(_) => Ok(()),
            Err(openraft::error::RaftError::APIError(e)) => Err(super::write_error(self.id, e)),
            Err(openraft::error::RaftError::Fatal(f)) => Err(super::fatal_error(self.id, &f)),
        }
    }
}

/// A handler's answer as JSON.
fn json_answer<T: serde::Serialize>(answer: &T) -> Result<bytes::Bytes, crate::cluster::transport::CallError> {
    serde_json::to_vec(answer).map(bytes::Bytes::from).map_err(|e| crate::cluster::transport::CallError(e.to_string()))
}

/// Why a node may not join, if it may not: it hashes devices to another number of shards than the
/// cluster, so every request it took would go to the wrong group.
pub(super) fn join_refusal(map: &crate::cluster::map::ClusterMap, id: NodeId, shards: u32) -> Option<ShardError> {
    let have = map.shard_count;
    (map.is_initialized() && have != shards).then(|| ShardError::Refused {
        msg: format!(
            "this cluster has {have} shards and node {id} was started with {shards}: start it without \
             --shard-count, or with --shard-count {have}, on a new data directory"
        ),
    })
}

/// A member's answer to `cluster.shard-count`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ShardCounts {
    /// The count the cluster map was founded with; `None` until it is founded.
    pub cluster: Option<u32>,
    /// The count this member was started with (or found recorded in its data directory).
    pub node: u32,
}

/// Why the founding of the cluster map waits.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum Founding {
    #[error(
        "founding member {node} was started with {theirs} shards and this node with {mine}: start every \
         founder with the same --shard-count, on new data directories"
    )]
    Disagree { node: NodeId, theirs: u32, mine: u32 },
    #[error("{answered} of the {founders} founding members answered with their shard count")]
    Waiting { answered: usize, founders: usize },
}

/// Decides the founding from the other founders' answers (`(node, its shard count)`): any that
/// disagrees stops it; otherwise it waits for all `founders`, this node included.
fn founding_check(mine: u32, founders: usize, answers: &[(NodeId, u32)]) -> Result<(), Founding> {
    if let Some(&(node, theirs)) = answers.iter().find(|(_, n)| *n != mine) {
        return Err(Founding::Disagree { node, theirs, mine });
    }
    let answered = answers.len() + 1;
    if answered < founders {
        return Err(Founding::Waiting { answered, founders });
    }
    Ok(())
}

/// The shard count of the cluster a node joins through `via`, asked before the node opens its data
/// directory (which then records it). Retries until a member answers, as joining itself does: the
/// member may still be starting.
pub async fn cluster_shard_count(t: &crate::cluster::transport::Transport, via: &str) -> u32 {
    t.peers().set(JOIN_PEER, via.to_string());
    let mut pause = Duration::from_millis(200);
    loop {
        match t.call(JOIN_PEER, Call::ClusterShardCount, bytes::Bytes::new(), Some(Duration::from_secs(5))).await {
            Ok(answer) => match serde_json::from_slice::<Result<ShardCounts, ShardError>>(&answer) {
                Ok(Ok(ShardCounts { cluster: Some(n), .. })) => {
                    tracing::info!(via, shards = n, "the cluster's shard count");
                    return n;
                }
                Ok(Ok(ShardCounts { cluster: None, .. })) => {
                    tracing::warn!(via, "asking the cluster's shard count: the cluster is not founded yet")
                }
                Ok(Err(e)) => tracing::warn!(via, "asking the cluster's shard count: {e}"),
                Err(e) => tracing::warn!(via, "asking the cluster's shard count: bad answer: {e}"),
            },
            Err(e) => tracing::warn!(via, "asking the cluster's shard count: {e}"),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cluster::map::ClusterMap;

    #[test]
    fn a_node_with_another_shard_count_is_refused_naming_both() {
        let mut map = ClusterMap::default();
        assert!(join_refusal(&map, 4, 8).is_none(), "a map not founded yet decides nothing");
        let members: BTreeMap<NodeId, String> = (1..=3).map(|i| (i, format!("127.0.0.1:{}", 7000 + i))).collect();
        map.apply(&ClusterOp::Init { shard_count: 16, rf: 3, members }).unwrap();
        assert!(join_refusal(&map, 4, 16).is_none());
        let refused = join_refusal(&map, 4, 8).expect("8 shards against 16").to_string();
        assert!(refused.contains("has 16 shards") && refused.contains("started with 8"), "{refused}");
    }

    #[test]
    fn founders_found_the_map_when_all_agree() {
        assert_eq!(founding_check(8, 1, &[]), Ok(()), "a single founder decides alone");
        assert_eq!(founding_check(8, 3, &[]), Err(Founding::Waiting { answered: 1, founders: 3 }));
        assert_eq!(founding_check(8, 3, &[(2, 8)]), Err(Founding::Waiting { answered: 2, founders: 3 }));
        assert_eq!(founding_check(8, 3, &[(2, 8), (3, 8)]), Ok(()));
        let disagree = founding_check(8, 3, &[(2, 8), (3, 16)]).expect_err("16 against 8");
        assert_eq!(disagree, Founding::Disagree { node: 3, theirs: 16, mine: 8 });
        let said = disagree.to_string();
        assert!(said.contains("member 3 was started with 16") && said.contains("this node with 8"), "{said}");
    }
}
