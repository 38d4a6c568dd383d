//! The cluster map: the members of the cluster and where each shard's replicas should be. It is the
//! state of the metadata Raft group (shard 0, the metadata group), so every node agrees on it and it
//! survives any minority of failures.
//!
//! Pure: [`ClusterMap::apply`] is deterministic. The map holds the *target* placement only; each
//! shard's leader moves its group's real membership towards the target one openraft step at a time
//! (learner, voter, then removal), so the map never has to track moves in flight. A node that joins or
//! leaves changes the target at once to a balanced placement that moves as few replicas as the
//! planner can ([`Placement::plan`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::placement::Placement;
use crate::ids::{NodeId, ShardId};

/// Replicas per shard.
pub const REPLICATION_FACTOR: usize = 3;

/// Voters of the metadata group; the other members follow it as learners (so every node has the map).
pub const META_VOTERS: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemberState {
    /// Holds replicas and takes requests.
    Active,
    /// Being drained: its replicas move away; its id is never given out again.
    Leaving,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Inter-node (cluster transport) address.
    pub addr: String,
    pub state: MemberState,
}

/// What the metadata group stores.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    pub shard_count: u32,
    pub rf: usize,
    /// Members, active or leaving.
    pub members: BTreeMap<NodeId, Member>,
    /// Ids that were members once and were removed: never accepted again (their data may still sit
    /// on a disk somewhere and must not rejoin).
    pub retired: Vec<NodeId>,
    /// Target placement: the replicas each shard should have and its preferred leader.
    pub placement: Placement,
    /// The placement the cluster was founded with: each shard's group is initialized once, by its
    /// founding preferred leader, with its founding replicas. Nodes that join later never initialize
    /// a group (they are added to existing ones), so no group can be founded twice.
    pub founding: Placement,
}

/// A change of the cluster map (a metadata-group log entry).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClusterOp {
    /// Founds the map; ignored once the map exists (every founding node may propose it).
    Init { shard_count: u32, rf: usize, members: BTreeMap<NodeId, String> },
    /// A new node joins: replicas and leaderships rebalance onto it.
    AddNode { id: NodeId, addr: String },
    /// Drains a node: its replicas move to the others. It stays listed as `Leaving` until `Forget`.
    RemoveNode { id: NodeId },
    /// A drained node holds no replica any more: forget it and retire its id.
    Forget { id: NodeId },
}

/// Why a cluster change was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum MapError {
    #[error("the cluster map is not initialized yet")]
    NotInitialized,
    #[error("node id {0} was removed from this cluster and cannot be reused")]
    Retired(NodeId),
    #[error("node {0} is already a member at another address ({1})")]
    AddressConflict(NodeId, String),
    #[error("node {0} is not a member")]
    UnknownNode(NodeId),
    #[error("removing node {0} would leave fewer than {1} active nodes for {1} replicas")]
    TooFewNodes(NodeId, usize),
    #[error("node {0} still holds replicas; drain it first")]
    NotDrained(NodeId),
}

impl ClusterMap {
    pub fn is_initialized(&self) -> bool {
        !self.members.is_empty()
    }

    /// Members that take replicas.
    pub fn active(&self) -> Vec<NodeId> {
        self.members.iter().filter(|(_, m)| m.state == MemberState::Active).map(|(id, _)| *id).collect()
    }

    /// Target replicas of `shard` (empty when the map is not initialized or the shard is unknown).
    pub fn replicas(&self, shard: ShardId) -> Vec<NodeId> {
        self.placement.shards.get(shard as usize).map(|s| s.replicas.iter().copied().collect()).unwrap_or_default()
    }

    /// Preferred leader of `shard`.
    pub fn preferred_leader(&self, shard: ShardId) -> Option<NodeId> {
        self.placement.shards.get(shard as usize).map(|s| s.leader)
    }

    /// Shards whose target replicas include `node`.
    pub fn shards_of(&self, node: NodeId) -> Vec<ShardId> {
        (0..self.placement.shards.len() as ShardId).filter(|s| self.replicas(*s).contains(&node)).collect()
    }

    /// The metadata group's voters: the lowest ids among active members.
    pub fn meta_voters(&self) -> Vec<NodeId> {
        self.active().into_iter().take(META_VOTERS).collect()
    }

    pub fn addr(&self, node: NodeId) -> Option<&str> {
        self.members.get(&node).map(|m| m.addr.as_str())
    }

    /// Applies one op. A refused op changes nothing.
    pub fn apply(&mut self, op: &ClusterOp) -> Result<(), MapError> {
        match op {
            ClusterOp::Init { shard_count, rf, members } => {
                if self.is_initialized() || members.is_empty() {
                    return Ok(());
                }
                self.shard_count = (*shard_count).max(1);
                self.rf = (*rf).max(1);
                self.members = members
                    .iter()
                    .map(|(id, addr)| (*id, Member { addr: addr.clone(), state: MemberState::Active }))
                    .collect();
                let nodes = self.active();
                self.placement = Placement::initial(&nodes, self.shard_count, self.rf);
                self.founding = self.placement.clone();
                Ok(())
            }
            ClusterOp::AddNode { id, addr } => {
                if !self.is_initialized() {
                    return Err(MapError::NotInitialized);
                }
                if self.retired.contains(id) {
                    return Err(MapError::Retired(*id));
                }
                if let Some(m) = self.members.get(id) {
                    // Idempotent for a retried join; a different address is a mistake worth naming.
                    if m.addr == *addr && m.state == MemberState::Active {
                        return Ok(());
                    }
                    if m.state == MemberState::Leaving {
                        return Err(MapError::Retired(*id));
                    }
                    return Err(MapError::AddressConflict(*id, m.addr.clone()));
                }
                self.members.insert(*id, Member { addr: addr.clone(), state: MemberState::Active });
                self.rebalance();
                Ok(())
            }
            ClusterOp::RemoveNode { id } => {
                let Some(m) = self.members.get(id) else { return Err(MapError::UnknownNode(*id)) };
                if m.state == MemberState::Leaving {
                    return Ok(());
                }
                if self.active().len() <= self.rf {
                    return Err(MapError::TooFewNodes(*id, self.rf));
                }
                if let Some(m) = self.members.get_mut(id) {
                    m.state = MemberState::Leaving;
                }
                self.rebalance();
                Ok(())
            }
            ClusterOp::Forget { id } => {
                let Some(m) = self.members.get(id) else { return Ok(()) };
                if m.state != MemberState::Leaving || !self.shards_of(*id).is_empty() {
                    return Err(MapError::NotDrained(*id));
                }
                self.members.remove(id);
                if !self.retired.contains(id) {
                    self.retired.push(*id);
                }
                Ok(())
            }
        }
    }

    /// Moves the target to a balanced placement over the active members.
    fn rebalance(&mut self) {
        let nodes = self.active();
        for m in self.placement.plan(&nodes, self.rf) {
            self.placement.apply(m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn founded(n: u64, shards: u32) -> ClusterMap {
        let mut m = ClusterMap::default();
        let members = (1..=n).map(|i| (i, format!("127.0.0.1:{}", 7000 + i))).collect();
        m.apply(&ClusterOp::Init { shard_count: shards, rf: 3, members }).unwrap();
        m
    }

    #[test]
    fn init_places_three_replicas_and_is_idempotent() {
        let mut m = founded(5, 16);
        for s in 0..16 {
            assert_eq!(m.replicas(s).len(), 3);
        }
        let before = m.clone();
        m.apply(&ClusterOp::Init { shard_count: 4, rf: 1, members: BTreeMap::from([(9, "x".into())]) }).unwrap();
        assert_eq!(m, before, "a second Init changes nothing");
        assert_eq!(m.meta_voters(), vec![1, 2, 3]);
    }

    #[test]
    fn add_then_remove_moves_replicas_and_retires_the_id() {
        let mut m = founded(3, 16);
        m.apply(&ClusterOp::AddNode { id: 4, addr: "a4".into() }).unwrap();
        assert!(m.shards_of(4).len() >= 11, "new node takes its share");
        assert_eq!(
            m.apply(&ClusterOp::AddNode { id: 4, addr: "other".into() }),
            Err(MapError::AddressConflict(4, "a4".into()))
        );
        m.apply(&ClusterOp::RemoveNode { id: 2 }).unwrap();
        assert!(m.shards_of(2).is_empty(), "drained in the target");
        assert_eq!(m.apply(&ClusterOp::RemoveNode { id: 1 }), Err(MapError::TooFewNodes(1, 3)));
        m.apply(&ClusterOp::Forget { id: 2 }).unwrap();
        assert!(!m.members.contains_key(&2));
        assert_eq!(m.apply(&ClusterOp::AddNode { id: 2, addr: "a2".into() }), Err(MapError::Retired(2)));
        for s in 0..16 {
            assert_eq!(m.replicas(s).len(), 3, "shard {s}");
            assert!(!m.replicas(s).contains(&2));
        }
    }

    #[test]
    fn forget_refuses_a_node_that_still_holds_replicas() {
        let mut m = founded(4, 8);
        assert_eq!(m.apply(&ClusterOp::Forget { id: 1 }), Err(MapError::NotDrained(1)));
        assert!(m.apply(&ClusterOp::AddNode { id: 9, addr: "x".into() }).is_ok());
    }
}
