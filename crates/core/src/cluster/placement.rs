//! Where each shard's replicas live, and the moves that get from one placement to a balanced one.
//!
//! Pure: no I/O and no clock, so the metadata group can store a [`Placement`] and every node computes
//! the same plan from it. Balance means every node holds `⌊S·R/N⌋` or `⌈S·R/N⌉` replicas and leads
//! `⌊S/N⌋` or `⌈S/N⌉` shards, so that load and leadership spread evenly. Plans move one replica at a
//! time, adding before removing (openraft changes membership one step at a time, and a shard never
//! drops below its replication factor while a replica moves).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ids::{NodeId, ShardId};

/// Replicas of one shard; `leader` is the preferred leader (leadership is moved there when it drifts).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardReplicas {
    pub replicas: BTreeSet<NodeId>,
    pub leader: NodeId,
}

/// The placement of every shard of the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub shards: Vec<ShardReplicas>,
}

/// One step of a rebalance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Move {
    /// Add `node` as a learner, let it catch up, then make it a voter.
    AddReplica { shard: ShardId, node: NodeId },
    /// Remove `node` from the shard's voters (only after the shard has `rf` other replicas).
    RemoveReplica { shard: ShardId, node: NodeId },
    /// Move the shard's preferred leadership to `to` (a replica).
    TransferLeader { shard: ShardId, to: NodeId },
}

impl Placement {
    /// A balanced placement of `shard_count` shards on `nodes` with `rf` replicas each (at most the
    /// number of nodes): shard `s` starts on `rf` consecutive nodes from `s mod N`, with that first node
    /// as its preferred leader; when `S` is not a multiple of `N` the windows leave the counts uneven by
    /// up to `rf`, and the rebalance plan evens them out.
    pub fn initial(nodes: &[NodeId], shard_count: u32, rf: usize) -> Placement {
        let nodes: Vec<NodeId> = nodes.iter().copied().collect::<BTreeSet<_>>().into_iter().collect();
        if nodes.is_empty() {
            return Placement::default();
        }
        let rf = rf.clamp(1, nodes.len());
        let shards = (0..shard_count as usize)
            .map(|s| {
                let replicas = (0..rf).map(|i| nodes[(s + i) % nodes.len()]).collect();
                ShardReplicas { replicas, leader: nodes[s % nodes.len()] }
            })
            .collect();
        let mut p = Placement { shards };
        for m in p.plan(&nodes, rf) {
            p.apply(m);
        }
        p
    }

    /// Replicas held by each of `nodes` (nodes holding none included, with 0).
    pub fn replica_load(&self, nodes: &[NodeId]) -> BTreeMap<NodeId, usize> {
        let mut load: BTreeMap<NodeId, usize> = nodes.iter().map(|n| (*n, 0)).collect();
        for s in &self.shards {
            for r in &s.replicas {
                *load.entry(*r).or_default() += 1;
            }
        }
        load
    }

    /// Preferred leaderships held by each of `nodes`.
    pub fn leader_load(&self, nodes: &[NodeId]) -> BTreeMap<NodeId, usize> {
        let mut load: BTreeMap<NodeId, usize> = nodes.iter().map(|n| (*n, 0)).collect();
        for s in &self.shards {
            *load.entry(s.leader).or_default() += 1;
        }
        load
    }

    /// Applies one move (moves that do not fit the placement are ignored, so applying a stale plan
    /// is harmless).
    pub fn apply(&mut self, m: Move) {
        match m {
            Move::AddReplica { shard, node } => {
                if let Some(s) = self.shards.get_mut(shard as usize) {
                    s.replicas.insert(node);
                }
            }
            Move::RemoveReplica { shard, node } => {
                if let Some(s) = self.shards.get_mut(shard as usize) {
                    if s.replicas.len() > 1 && s.replicas.remove(&node) && s.leader == node {
                        if let Some(first) = s.replicas.iter().next() {
                            s.leader = *first;
                        }
                    }
                }
            }
            Move::TransferLeader { shard, to } => {
                if let Some(s) = self.shards.get_mut(shard as usize) {
                    if s.replicas.contains(&to) {
                        s.leader = to;
                    }
                }
            }
        }
    }

    /// The next move towards a balanced placement on `nodes` (the cluster's current members) with `rf`
    /// replicas per shard, or `None` when balanced. Order of priorities: first restore the replication
    /// factor (add replicas to shards that are short, drop replicas on nodes that left), then even out
    /// replica counts, then leaderships. Call again after each move has completed.
    pub fn next_move(&self, nodes: &[NodeId], rf: usize) -> Option<Move> {
        let members: BTreeSet<NodeId> = nodes.iter().copied().collect();
        if members.is_empty() {
            return None;
        }
        let rf = rf.clamp(1, members.len());
        let load = self.replica_load(&members.iter().copied().collect::<Vec<_>>());
        let least_loaded = |exclude: &BTreeSet<NodeId>| {
            members
                .iter()
                .filter(|n| !exclude.contains(n))
                .min_by_key(|n| (load.get(n).copied().unwrap_or(0), **n))
                .copied()
        };
        // 1. Shards with fewer than rf live replicas get one on the least-loaded member.
        for (i, s) in self.shards.iter().enumerate() {
            let live: BTreeSet<NodeId> = s.replicas.intersection(&members).copied().collect();
            if live.len() < rf {
                if let Some(node) = least_loaded(&s.replicas) {
                    return Some(Move::AddReplica { shard: i as ShardId, node });
                }
            }
        }
        // 2. Replicas on nodes that are no longer members (their shard has rf live ones by now).
        for (i, s) in self.shards.iter().enumerate() {
            if let Some(gone) = s.replicas.iter().find(|r| !members.contains(r)) {
                if s.leader == *gone {
                    if let Some(to) = s.replicas.iter().find(|r| members.contains(r)) {
                        return Some(Move::TransferLeader { shard: i as ShardId, to: *to });
                    }
                }
                return Some(Move::RemoveReplica { shard: i as ShardId, node: *gone });
            }
        }
        // 3. Even out replica counts: a shard on the most-loaded node gains a replica on the least
        //    loaded node that does not hold it; the surplus replica is removed next round.
        for (i, s) in self.shards.iter().enumerate() {
            if s.replicas.len() > rf {
                let victim = s
                    .replicas
                    .iter()
                    .filter(|r| **r != s.leader)
                    .max_by_key(|r| (load.get(r).copied().unwrap_or(0), **r))
                    .copied();
                if let Some(node) = victim {
                    return Some(Move::RemoveReplica { shard: i as ShardId, node });
                }
            }
        }
        let (max_node, max) = load.iter().max_by_key(|(n, l)| (**l, std::cmp::Reverse(**n))).map(|(n, l)| (*n, *l))?;
        let (min_node, min) = load.iter().min_by_key(|(n, l)| (**l, **n)).map(|(n, l)| (*n, *l))?;
        if max > min + 1 {
            let candidate = self
                .shards
                .iter()
                .enumerate()
                .find(|(_, s)| s.replicas.contains(&max_node) && !s.replicas.contains(&min_node));
            if let Some((i, _)) = candidate {
                return Some(Move::AddReplica { shard: i as ShardId, node: min_node });
            }
        }
        // 4. Even out preferred leaderships among each shard's replicas.
        let leaders = self.leader_load(&members.iter().copied().collect::<Vec<_>>());
        let (lmax_node, lmax) =
            leaders.iter().max_by_key(|(n, l)| (**l, std::cmp::Reverse(**n))).map(|(n, l)| (*n, *l))?;
        for (i, s) in self.shards.iter().enumerate() {
            if s.leader != lmax_node {
                continue;
            }
            let target = s
                .replicas
                .iter()
                .filter(|r| **r != lmax_node)
                .min_by_key(|r| (leaders.get(r).copied().unwrap_or(0), **r))
                .copied();
            if let Some(to) = target {
                if leaders.get(&to).copied().unwrap_or(0) + 1 < lmax {
                    return Some(Move::TransferLeader { shard: i as ShardId, to });
                }
            }
        }
        None
    }

    /// Every move from here to balance (applied one after the other), bounded so that a bug can never
    /// loop forever.
    pub fn plan(&self, nodes: &[NodeId], rf: usize) -> Vec<Move> {
        let mut p = self.clone();
        let mut moves = Vec::new();
        let bound = 4 * (self.shards.len() + 1) * (rf + 1) * (nodes.len() + 1);
        while let Some(m) = p.next_move(nodes, rf) {
            if moves.len() >= bound {
                break;
            }
            p.apply(m);
            moves.push(m);
        }
        moves
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn balanced(p: &Placement, nodes: &[NodeId], rf: usize) {
        let rf = rf.min(nodes.len());
        for (i, s) in p.shards.iter().enumerate() {
            assert_eq!(s.replicas.len(), rf, "shard {i} has {:?}", s.replicas);
            assert!(s.replicas.contains(&s.leader), "shard {i} leader {} not a replica", s.leader);
            assert!(s.replicas.iter().all(|r| nodes.contains(r)), "shard {i} on a non-member");
        }
        let load = p.replica_load(nodes);
        let (lo, hi) = (load.values().min().unwrap(), load.values().max().unwrap());
        assert!(hi - lo <= 1, "replica load {load:?}");
        let leaders = p.leader_load(nodes);
        let (lo, hi) = (leaders.values().min().unwrap(), leaders.values().max().unwrap());
        assert!(hi - lo <= 1, "leader load {leaders:?}");
    }

    #[test]
    fn initial_placement_is_balanced() {
        for n in 1..=7u64 {
            let nodes: Vec<NodeId> = (1..=n).collect();
            for shards in [1u32, 3, 16, 17, 64] {
                let p = Placement::initial(&nodes, shards, 3);
                assert_eq!(p.shards.len(), shards as usize);
                if shards as u64 >= n {
                    balanced(&p, &nodes, 3);
                }
                assert!(p.next_move(&nodes, 3).is_none() || (shards as u64) < n, "n={n} shards={shards}");
            }
        }
    }

    #[test]
    fn adding_a_node_moves_replicas_and_leaders_onto_it_one_step_at_a_time() {
        let nodes = [1, 2, 3];
        let p = Placement::initial(&nodes, 16, 3);
        let grown = [1, 2, 3, 4];
        let plan = p.plan(&grown, 3);
        assert!(!plan.is_empty());
        let mut q = p.clone();
        for m in &plan {
            q.apply(*m);
            for (i, s) in q.shards.iter().enumerate() {
                assert!(s.replicas.len() >= 3, "shard {i} fell below rf during {m:?}");
                assert!(s.replicas.len() <= 4, "shard {i} grew past rf+1 during {m:?}");
            }
        }
        balanced(&q, &grown, 3);
        assert!(q.replica_load(&grown)[&4] >= 11, "new node holds its share: {:?}", q.replica_load(&grown));
        assert!(q.next_move(&grown, 3).is_none());
    }

    #[test]
    fn removing_a_node_re_replicates_before_dropping() {
        let nodes = [1, 2, 3, 4];
        let p = Placement::initial(&nodes, 16, 3);
        let shrunk = [1, 2, 4];
        let plan = p.plan(&shrunk, 3);
        let mut q = p.clone();
        for m in &plan {
            if let Move::RemoveReplica { shard, node } = m {
                let live = q.shards[*shard as usize].replicas.iter().filter(|r| shrunk.contains(r)).count();
                assert!(*node != 3 || live >= 3, "removed node 3 from shard {shard} before re-replicating");
            }
            q.apply(*m);
        }
        balanced(&q, &shrunk, 3);
        assert!(q.shards.iter().all(|s| !s.replicas.contains(&3)));
    }

    #[test]
    fn stale_moves_are_harmless() {
        let mut p = Placement::initial(&[1, 2, 3], 4, 3);
        let before = p.clone();
        p.apply(Move::TransferLeader { shard: 0, to: 9 });
        p.apply(Move::AddReplica { shard: 99, node: 1 });
        assert_eq!(p, before);
        p.apply(Move::RemoveReplica { shard: 0, node: 1 });
        assert!(!p.shards[0].replicas.contains(&1));
        assert!(p.shards[0].replicas.contains(&p.shards[0].leader));
    }
}
