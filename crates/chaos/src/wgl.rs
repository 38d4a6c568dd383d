//! The Wing & Gong linearizability search with Lowe's memoization, as in Porcupine and Knossos.
//!
//! Calls and returns sit in one time-ordered doubly linked list. The search walks it: at a call it tries
//! to linearize that op now (the model step must accept the op's answer); if it can, and the pair
//! (set of linearized ops, resulting state) was never seen, it lifts the op's call and return out of the
//! list and starts again from the front. Reaching a return whose op is not yet linearized means the
//! current prefix is a dead end: it undoes the last choice and tries the next call after it. The history
//! is linearizable once no return is left.
//!
//! Unanswered ops have no return entry, so they may be linearized anywhere after their call or never
//! (they may not have happened). What keeps real histories fast:
//! - the memo holds a 128-bit fingerprint of (linearized set, state) instead of the set itself, so it
//!   costs 16 bytes per entry (the set's hash is Zobrist: one XOR per lift);
//! - versions only grow and each write bumps them by one, so a state that leaves some pending answered
//!   op no room for the writes that must still precede it is cut at once (`slack`), and answered
//!   versions that already contradict real time end the search before it starts;
//! - a transition to a section version must produce the document answers showed at that version
//!   (`DocIndex`), so a wrong optional write is refused where it is tried, not at the next read.
//!
//! Together they stop optional writes from being tried in every combination.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use super::model::{LinOp, State, Step};
use super::slack::{answers_out_of_order, Slack};

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Linearizable,
    NotLinearizable,
    /// The step budget ran out first.
    Inconclusive {
        steps: u64,
    },
}

const HEAD: usize = 0;

/// One call or return in the list; entries `1..=n` (0 and n+1 are the sentinels).
#[derive(Clone, Copy)]
struct Entry {
    op: usize,
    /// For a call: the entry of its return, if it has one. For a return: `None`.
    ret: Option<usize>,
    is_call: bool,
}

struct List {
    entries: Vec<Entry>,
    next: Vec<usize>,
    prev: Vec<usize>,
    tail: usize,
}

impl List {
    /// Calls sort before returns at equal times: touching windows count as concurrent, which never
    /// invents a violation.
    fn build(ops: &[LinOp]) -> List {
        let mut events: Vec<(u64, u8, usize)> = Vec::with_capacity(ops.len() * 2);
        for (i, op) in ops.iter().enumerate() {
            events.push((op.invoke, 0, i));
            if let Some(c) = op.complete {
                events.push((c, 1, i));
            }
        }
        events.sort_unstable();
        let n = events.len();
        let mut entries = vec![Entry { op: usize::MAX, ret: None, is_call: false }; n + 2];
        let mut call_entry = vec![0usize; ops.len()];
        for (k, &(_, kind, op)) in events.iter().enumerate() {
            let e = k + 1;
            entries[e] = Entry { op, ret: None, is_call: kind == 0 };
            if kind == 0 {
                call_entry[op] = e;
            } else {
                entries[call_entry[op]].ret = Some(e);
            }
        }
        let next = (0..n + 2).map(|i| (i + 1).min(n + 1)).collect();
        let prev = (0..n + 2).map(|i| i.saturating_sub(1)).collect();
        List { entries, next, prev, tail: n + 1 }
    }

    fn unlink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        self.next[p] = n;
        self.prev[n] = p;
    }

    fn relink(&mut self, e: usize) {
        let (p, n) = (self.prev[e], self.next[e]);
        self.next[p] = e;
        self.prev[n] = e;
    }

    fn lift(&mut self, call: usize) {
        self.unlink(call);
        if let Some(r) = self.entries[call].ret {
            self.unlink(r);
        }
    }

    /// Undoes `lift`; lifts are undone in reverse order, so the stored neighbours are still right.
    fn unlift(&mut self, call: usize) {
        if let Some(r) = self.entries[call].ret {
            self.relink(r);
        }
        self.relink(call);
    }
}

/// Zobrist key of op `i`: a fixed pseudo-random 128-bit value (splitmix64), so runs are reproducible.
fn zobrist(i: usize) -> u128 {
    let mix = |mut z: u64| {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let a = mix(i as u64);
    let b = mix(a ^ 0x5851_F42D_4C95_7F2D);
    (u128::from(a) << 64) | u128::from(b)
}

/// The memo's keys are already uniform 128-bit hashes: hashing them again would only cost time.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 ^= u64::from_le_bytes(b);
        }
    }

    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64 ^ (v >> 64) as u64;
    }
}

type Memo = HashSet<u128, BuildHasherDefault<KeyHasher>>;

fn memo_key(set: u128, state: &State) -> u128 {
    let mut buf = [0u8; 32];
    buf[..16].copy_from_slice(&set.to_le_bytes());
    buf[16..].copy_from_slice(&state.fingerprint.to_le_bytes());
    xxhash_rust::xxh3::xxh3_128(&buf)
}

/// The section documents answers showed at each section version. A section changes exactly when its
/// version does, so whatever transition reaches desired `$version` k must produce the desired some
/// answer showed at k, pending or not. Checking this at the transition (instead of at the next read)
/// is what keeps optional writes cheap: a wrong one is refused where it is tried.
struct DocIndex {
    desired: HashMap<i64, u128>,
    reported: HashMap<i64, u128>,
}

impl DocIndex {
    /// `None` if two answers show different documents at one version (no linearization exists).
    fn new(ops: &[LinOp]) -> Option<DocIndex> {
        let mut index = DocIndex { desired: HashMap::new(), reported: HashMap::new() };
        for op in ops.iter().filter(|op| op.complete.is_some()) {
            let e = &op.expect;
            for (map, version, doc) in [
                (&mut index.desired, e.desired_version, &e.desired),
                (&mut index.reported, e.reported_version, &e.reported),
            ] {
                if let (Some(v), Some(d)) = (version, doc) {
                    if *map.entry(v).or_insert(d.fingerprint()) != d.fingerprint() {
                        return None;
                    }
                }
            }
        }
        Some(index)
    }

    fn allows(&self, s: &State) -> bool {
        self.desired.get(&s.desired_version).is_none_or(|&f| f == s.desired.fingerprint())
            && self.reported.get(&s.reported_version).is_none_or(|&f| f == s.reported.fingerprint())
    }
}

/// Searches for a linearization of `ops` from `init`, giving up after `max_steps` steps: model
/// transitions tried plus backtracks. (Visits the version slack refuses at once are not counted: they
/// cost a few comparisons, and a list holds at most twice the ops.)
pub(crate) fn search(ops: &[LinOp], init: &State, max_steps: u64) -> Verdict {
    search_counting(ops, init, max_steps).0
}

/// `search`, also saying how many steps it took.
pub(crate) fn search_counting(ops: &[LinOp], init: &State, max_steps: u64) -> (Verdict, u64) {
    let mut steps: u64 = 0;
    let verdict = run(ops, init, max_steps, &mut steps);
    (verdict, steps)
}

fn run(ops: &[LinOp], init: &State, max_steps: u64, steps: &mut u64) -> Verdict {
    let mut list = List::build(ops);
    let mut slack = Slack::new(ops);
    let mut seen = Memo::default();
    // (call entry, state before the op if it changed the state)
    let mut stack: Vec<(usize, Option<State>)> = Vec::new();
    let mut state = init.clone();
    let mut set: u128 = 0;
    let Some(docs) = DocIndex::new(ops) else { return Verdict::NotLinearizable };
    if !slack.allows(state.versions()) || !docs.allows(&state) || answers_out_of_order(ops) {
        return Verdict::NotLinearizable;
    }
    let mut e = list.next[HEAD];
    loop {
        if e == list.tail {
            return Verdict::Linearizable;
        }
        let entry = list.entries[e];
        if entry.is_call {
            let op = &ops[entry.op];
            let mut taken = false;
            slack.take(entry.op);
            if slack.allows(op.next_versions(state.versions())) {
                *steps += 1;
                if *steps > max_steps {
                    return Verdict::Inconclusive { steps: *steps };
                }
                let step = op.step(&state);
                let (changed, next_state) = match step {
                    Step::Invalid => (false, None),
                    Step::Same => (true, None),
                    Step::Next(s) if docs.allows(&s) => (true, Some(s)),
                    Step::Next(_) => (false, None),
                };
                if changed {
                    let new_set = set ^ zobrist(entry.op);
                    let key = memo_key(new_set, next_state.as_ref().unwrap_or(&state));
                    if seen.insert(key) {
                        set = new_set;
                        let before = next_state.map(|s| std::mem::replace(&mut state, s));
                        stack.push((e, before));
                        list.lift(e);
                        taken = true;
                    }
                }
            }
            if taken {
                e = list.next[HEAD];
            } else {
                slack.give_back(entry.op);
                e = list.next[e];
            }
        } else {
            // A return of an op not linearized yet: undo the last choice.
            *steps += 1;
            if *steps > max_steps {
                return Verdict::Inconclusive { steps: *steps };
            }
            let Some((call, before)) = stack.pop() else { return Verdict::NotLinearizable };
            let op_index = list.entries[call].op;
            list.unlift(call);
            slack.give_back(op_index);
            set ^= zobrist(op_index);
            if let Some(s) = before {
                state = s;
            }
            e = list.next[call];
        }
    }
}
