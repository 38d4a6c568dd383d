//! Version slack: the search's main pruning rule.
//!
//! Versions only grow, and every write bumps its counters by exactly one. So for each answered op R not
//! yet linearized that pins a counter (it needs the counter at `p` right before it), every answered
//! write B not yet linearized that completed before R was invoked must still come before R, and bumps
//! the counter once. A state whose counter is above `p − #such B` can never reach R: the branch is dead.
//! Without this rule an optional write (an Unknown op) could be tried at every position; with it, it is
//! refused wherever the answered ops around it leave no room for one more bump.
//!
//! Per counter, a segment tree over the pinned ops (in invoke order) holds `p − #pending B before it`
//! and answers the minimum; linearizing B adds one to the suffix of pinned ops invoked after B
//! completed; linearizing R takes it out of the minimum (adds a large offset).

use super::model::{Counter, LinOp, Versions};

/// Range add, global minimum.
struct MinTree {
    n: usize,
    min: Vec<i64>,
    add: Vec<i64>,
}

impl MinTree {
    fn new(values: &[i64]) -> MinTree {
        let n = values.len();
        let mut t = MinTree { n, min: vec![0; 4 * n.max(1)], add: vec![0; 4 * n.max(1)] };
        if n > 0 {
            t.build(1, 0, n - 1, values);
        }
        t
    }

    fn build(&mut self, node: usize, lo: usize, hi: usize, values: &[i64]) {
        if lo == hi {
            self.min[node] = values[lo];
            return;
        }
        let mid = (lo + hi) / 2;
        self.build(2 * node, lo, mid, values);
        self.build(2 * node + 1, mid + 1, hi, values);
        self.min[node] = self.min[2 * node].min(self.min[2 * node + 1]);
    }

    /// Adds `v` to positions `from..to`.
    fn add(&mut self, from: usize, to: usize, v: i64) {
        if from < to && self.n > 0 {
            self.add_in(1, 0, self.n - 1, from, to - 1, v);
        }
    }

    fn add_in(&mut self, node: usize, lo: usize, hi: usize, from: usize, to: usize, v: i64) {
        if to < lo || hi < from {
            return;
        }
        if from <= lo && hi <= to {
            self.min[node] += v;
            self.add[node] += v;
            return;
        }
        let mid = (lo + hi) / 2;
        self.add_in(2 * node, lo, mid, from, to, v);
        self.add_in(2 * node + 1, mid + 1, hi, from, to, v);
        self.min[node] = self.min[2 * node].min(self.min[2 * node + 1]) + self.add[node];
    }

    fn min(&self) -> i64 {
        if self.n == 0 {
            i64::MAX
        } else {
            self.min[1]
        }
    }
}

/// Far above any version: what a linearized pinned op adds to leave the minimum.
const GONE: i64 = 1 << 50;

struct PerCounter {
    tree: MinTree,
    /// Op → its position among the pinned ops.
    rank: Vec<Option<usize>>,
    /// Op (an answered write bumping the counter) → first pinned position invoked after it completed.
    suffix: Vec<Option<usize>>,
    pinned: usize,
}

impl PerCounter {
    fn new(ops: &[LinOp], counter: Counter) -> PerCounter {
        let c = counter.index();
        let mut pinned: Vec<(u64, usize, i64)> = ops
            .iter()
            .enumerate()
            .filter(|(_, op)| op.complete.is_some())
            .filter_map(|(i, op)| op.required_before()[c].map(|p| (op.invoke, i, p)))
            .collect();
        pinned.sort_unstable();
        let mut rank = vec![None; ops.len()];
        for (r, &(_, i, _)) in pinned.iter().enumerate() {
            rank[i] = Some(r);
        }
        let mut bumper_ends: Vec<u64> = Vec::new();
        let mut suffix = vec![None; ops.len()];
        for (i, op) in ops.iter().enumerate() {
            if let (Some(end), true) = (op.complete, op.bumps(counter)) {
                bumper_ends.push(end);
                suffix[i] = Some(pinned.partition_point(|&(invoke, _, _)| invoke <= end));
            }
        }
        bumper_ends.sort_unstable();
        let values: Vec<i64> =
            pinned.iter().map(|&(invoke, _, p)| p - bumper_ends.partition_point(|&end| end < invoke) as i64).collect();
        PerCounter { tree: MinTree::new(&values), rank, suffix, pinned: pinned.len() }
    }

    fn update(&mut self, op: usize, sign: i64) {
        if let Some(r) = self.rank[op] {
            self.tree.add(r, r + 1, sign * GONE);
        }
        if let Some(s) = self.suffix[op] {
            self.tree.add(s, self.pinned, sign);
        }
    }
}

pub(crate) struct Slack {
    counters: [PerCounter; 3],
}

impl Slack {
    pub fn new(ops: &[LinOp]) -> Slack {
        Slack { counters: Counter::ALL.map(|c| PerCounter::new(ops, c)) }
    }

    /// Op `i` is linearized: it no longer waits, nor holds anyone back.
    pub fn take(&mut self, i: usize) {
        for c in &mut self.counters {
            c.update(i, 1);
        }
    }

    /// Undoes `take`.
    pub fn give_back(&mut self, i: usize) {
        for c in &mut self.counters {
            c.update(i, -1);
        }
    }

    /// Whether every pending answered op can still be reached from versions `v`.
    pub fn allows(&self, v: Versions) -> bool {
        let vals = [v.version, v.desired, v.reported];
        self.counters.iter().zip(vals).all(|(c, x)| x <= c.tree.min())
    }
}

/// Real-time order of the answers alone: an answered op A that completed before an answered op B was
/// invoked comes first, so A's counter after it (`pin + bump`) cannot exceed B's pin. A cheap sweep that
/// settles version contradictions before any search (the search would find them too, but only after
/// trying every placement of the optional ops).
pub(crate) fn answers_out_of_order(ops: &[LinOp]) -> bool {
    Counter::ALL.into_iter().any(|counter| {
        let c = counter.index();
        let pinned: Vec<(&LinOp, i64)> = ops
            .iter()
            .filter(|op| op.complete.is_some())
            .filter_map(|op| op.required_before()[c].map(|p| (op, p)))
            .collect();
        let mut done: Vec<(u64, i64)> = pinned
            .iter()
            .filter_map(|&(op, p)| op.complete.map(|end| (end, p + i64::from(op.bumps(counter)))))
            .collect();
        done.sort_unstable();
        let mut started: Vec<(u64, i64)> = pinned.iter().map(|&(op, p)| (op.invoke, p)).collect();
        started.sort_unstable();
        let (mut k, mut highest) = (0, i64::MIN);
        started.iter().any(|&(invoke, p)| {
            while k < done.len() && done[k].0 < invoke {
                highest = highest.max(done[k].1);
                k += 1;
            }
            highest > p
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_tree_adds_ranges() {
        let mut t = MinTree::new(&[5, 3, 8, 6]);
        assert_eq!(t.min(), 3);
        t.add(0, 2, 10);
        assert_eq!(t.min(), 6);
        t.add(3, 4, -4);
        assert_eq!(t.min(), 2);
        t.add(3, 4, 4);
        t.add(0, 2, -10);
        assert_eq!(t.min(), 3);
        assert_eq!(MinTree::new(&[]).min(), i64::MAX);
    }
}
