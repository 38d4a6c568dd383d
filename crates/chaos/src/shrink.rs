//! Shrinks a non-linearizable twin history to the few answers that contradict each other, and the
//! writes that contradiction rests on.
//!
//! Deleting ops naively is misleading: delete the write a read saw and the read "fails" on its own. So
//! shrinking only ever *forgets*, which adds linearizations and keeps "still fails" monotone (a greedy
//! search is then sound). Each re-search has its own small budget, and all together a total one; one
//! that runs out counts as "does not fail", so shrinking stays bounded and errs towards keeping ops.
//!
//! 0. **Answers that contradict without a search**: one whose versions break the model's invariant or
//!    that shows a value no write ever wrote; or two that show different documents at one section
//!    version. They are the whole core.
//! 1. **Answers.** Other ops are *silenced*: their answers are forgotten, an acknowledged write still
//!    happened somewhere in its window (with any versions), an unanswered one still may have. Binary
//!    search the shortest failing prefix of answers (by completion time; its last answer completes the
//!    contradiction), then forget earlier answers in halving chunks (ddmin-style).
//! 2. **Writes.** With those answers fixed, silenced acknowledged writes are made optional (they may not
//!    have happened at all) chunk by chunk while the history still fails. The writes left mandatory are
//!    the ones the contradiction rests on.
//!
//! Ops called after every kept answer completed can only come after all of them and are left out.

use super::check::CheckConfig;
use serde_json::Value;

use super::model::{leaves, lookup, Action, LinOp, State};
use super::wgl::{search_counting, Verdict};

/// What a shrunk history keeps, as positions in the searched ops.
pub(crate) struct Core {
    /// Ops whose answers contradict each other.
    pub answers: Vec<usize>,
    /// Acknowledged writes (answers forgotten) the contradiction needs.
    pub writes: Vec<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Answer,
    Silent,
    Optional,
    Gone,
}

struct Shrinker<'a> {
    ops: &'a [LinOp],
    init: &'a State,
    /// Budget of one re-search.
    steps: u64,
    /// What all re-searches together may still spend.
    steps_left: u64,
    checks_left: usize,
}

impl Shrinker<'_> {
    fn fails(&mut self, roles: &[Role]) -> bool {
        if self.checks_left == 0 || self.steps_left == 0 {
            return false;
        }
        self.checks_left -= 1;
        let horizon =
            (0..self.ops.len()).filter(|&k| roles[k] == Role::Answer).filter_map(|k| self.ops[k].complete).max();
        let sub: Vec<LinOp> = self
            .ops
            .iter()
            .zip(roles)
            .filter(|(op, _)| horizon.is_some_and(|h| op.invoke <= h))
            .filter_map(|(op, role)| match role {
                Role::Answer => Some(op.clone()),
                Role::Silent => op.silenced(),
                Role::Optional => op.optional(),
                Role::Gone => None,
            })
            .collect();
        let (verdict, used) = search_counting(&sub, self.init, self.steps.min(self.steps_left));
        self.steps_left = self.steps_left.saturating_sub(used);
        verdict == Verdict::NotLinearizable
    }

    fn exhausted(&self) -> bool {
        self.checks_left == 0 || self.steps_left == 0
    }

    /// Roles: `answers` keep their answers, every other op is `others`.
    fn answering(&self, answers: &[usize], others: Role) -> Vec<Role> {
        let mut roles = vec![others; self.ops.len()];
        for &k in answers {
            roles[k] = Role::Answer;
        }
        roles
    }

    fn fails_with_answers(&mut self, answers: &[usize], others: Role) -> bool {
        let roles = self.answering(answers, others);
        self.fails(&roles)
    }
}

/// A small failing core of `ops` (all answered ops if the budget confirms nothing smaller).
pub(crate) fn shrink(ops: &[LinOp], init: &State, cfg: &CheckConfig) -> Core {
    if let Some(k) = phantom(ops, init) {
        return Core { answers: vec![k], writes: Vec::new() };
    }
    if let Some((a, b)) = divergent(ops) {
        return Core { answers: vec![a, b], writes: Vec::new() };
    }
    let mut answered: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].complete.is_some()).collect();
    answered.sort_by_key(|&k| (ops[k].complete, k));
    let all_writes = |answers: &[usize]| -> Vec<usize> {
        (0..ops.len())
            .filter(|k| !answers.contains(k) && ops[*k].complete.is_some() && ops[*k].silenced().is_some())
            .collect()
    };
    let mut s = Shrinker {
        ops,
        init,
        steps: cfg.shrink_steps,
        steps_left: cfg.shrink_total_steps,
        checks_left: cfg.shrink_checks,
    };
    if !s.fails_with_answers(&answered, Role::Silent) {
        return Core { writes: all_writes(&answered), answers: answered };
    }
    // First the strongest claim: these answers contradict each other whatever the other ops did. Cheap
    // when versions alone contradict; otherwise its searches run out and it keeps too much.
    // It gets half the budget; what it leaves goes to the second strategy.
    let (steps_later, checks_later) = (s.steps_left / 2, s.checks_left / 2);
    s.steps_left -= steps_later;
    s.checks_left -= checks_later;
    let alone = shrink_answers(&mut s, &answered, Role::Optional);
    if alone.len() <= 2 {
        return Core { answers: alone, writes: Vec::new() };
    }
    s.steps_left += steps_later;
    s.checks_left += checks_later;
    let answers = shrink_answers(&mut s, &answered, Role::Silent);
    let writes = shrink_writes(&mut s, &answers);
    if alone.len() <= answers.len() + writes.len() {
        return Core { answers: alone, writes: Vec::new() };
    }
    Core { answers, writes }
}

/// Two answers showing different documents for one section at the same section version: in any order
/// of the ops a section changes exactly when its version does, so that pair already contradicts.
fn divergent(ops: &[LinOp]) -> Option<(usize, usize)> {
    let mut seen: std::collections::HashMap<(bool, i64), usize> = std::collections::HashMap::new();
    for (k, op) in ops.iter().enumerate().filter(|(_, op)| op.complete.is_some()) {
        let e = &op.expect;
        for (reported, version, doc) in
            [(false, e.desired_version, &e.desired), (true, e.reported_version, &e.reported)]
        {
            let (Some(version), Some(doc)) = (version, doc) else { continue };
            match seen.get(&(reported, version)) {
                Some(&first) => {
                    let other = if reported { &ops[first].expect.reported } else { &ops[first].expect.desired };
                    if other.as_ref().is_some_and(|o| !o.same(doc)) {
                        return Some((first, k));
                    }
                }
                None => {
                    seen.insert((reported, version), k);
                }
            }
        }
    }
    None
}

/// The first answered op that contradicts every history on its own: its versions break the model's
/// invariant (each write bumps the twin version and exactly one section version, so
/// `version − desired − reported` never changes), or its document holds a leaf value that neither the
/// initial state nor any write's document has at that path (empty objects are left alone: removals can
/// produce them).
fn phantom(ops: &[LinOp], init: &State) -> Option<usize> {
    let invariant = init.version - init.desired_version - init.reported_version;
    let broken = |op: &LinOp| match (op.expect.version, op.expect.desired_version, op.expect.reported_version) {
        (Some(v), Some(dv), Some(rv)) => v - dv - rv != invariant,
        _ => false,
    };
    if let Some(k) = (0..ops.len()).find(|&k| ops[k].complete.is_some() && broken(&ops[k])) {
        return Some(k);
    }
    let written = |reported: bool, path: &[String], value: &Value| {
        let start = if reported { init.reported.map() } else { init.desired.map() };
        lookup(start, path) == Some(value)
            || ops.iter().any(|op| match &op.action {
                Action::Desired { doc, .. } if !reported => lookup(doc, path) == Some(value),
                Action::Reported { patch } if reported => lookup(patch, path) == Some(value),
                _ => false,
            })
    };
    (0..ops.len()).filter(|&k| ops[k].complete.is_some()).find(|&k| {
        let e = &ops[k].expect;
        [(false, &e.desired), (true, &e.reported)].into_iter().any(|(reported, doc)| {
            let Some(doc) = doc else { return false };
            let mut found = Vec::new();
            leaves(doc.map(), &mut Vec::new(), &mut found);
            found.iter().any(|(path, v)| !matches!(v, Value::Object(_)) && !written(reported, path, v))
        })
    })
}

/// Shortest failing prefix of `answered`, then ddmin over its earlier answers; ops not kept are
/// `others` (optional or silenced).
fn shrink_answers(s: &mut Shrinker<'_>, answered: &[usize], others: Role) -> Vec<usize> {
    // Shortest failing prefix: `hi` fails; `lo` is not known to fail.
    let (mut lo, mut hi) = (0, answered.len());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if s.fails_with_answers(&answered[..mid], others) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let Some((&last, earlier)) = answered[..hi].split_last() else { return answered.to_vec() };
    let mut kept: Vec<usize> = earlier.to_vec();
    let mut chunk = (kept.len() / 2).max(1);
    loop {
        let mut i = 0;
        while i < kept.len() && !s.exhausted() {
            let end = (i + chunk).min(kept.len());
            let candidate: Vec<usize> = kept[..i].iter().chain(&kept[end..]).copied().chain([last]).collect();
            if s.fails_with_answers(&candidate, others) {
                kept.drain(i..end);
            } else {
                i = end;
            }
        }
        if chunk == 1 || s.exhausted() {
            break;
        }
        chunk = (chunk / 2).max(1);
    }
    kept.push(last);
    kept.sort_unstable();
    kept
}

/// Chunks start small: every optional write multiplies what a failing search must rule out.
const FIRST_WRITE_CHUNK: usize = 4;

fn shrink_writes(s: &mut Shrinker<'_>, answers: &[usize]) -> Vec<usize> {
    let mut roles = s.answering(answers, Role::Silent);
    let horizon = answers.iter().filter_map(|&k| s.ops[k].complete).max().unwrap_or(0);
    let mut writes = Vec::new();
    for (k, op) in s.ops.iter().enumerate() {
        if roles[k] != Role::Silent {
            continue;
        }
        if op.invoke > horizon || op.silenced().is_none() {
            roles[k] = Role::Gone;
        } else if op.complete.is_none() {
            roles[k] = Role::Optional;
        } else {
            writes.push(k);
        }
    }
    let mut chunk = FIRST_WRITE_CHUNK.min(writes.len()).max(1);
    loop {
        let mut i = 0;
        while i < writes.len() && !s.exhausted() {
            let end = (i + chunk).min(writes.len());
            for &k in &writes[i..end] {
                roles[k] = Role::Optional;
            }
            if s.fails(&roles) {
                writes.drain(i..end);
            } else {
                for &k in &writes[i..end] {
                    roles[k] = Role::Silent;
                }
                i = end;
            }
        }
        if chunk == 1 || s.exhausted() {
            break;
        }
        chunk = (chunk / 2).max(1);
    }
    writes
}
