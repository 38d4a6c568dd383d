//! Version checks that need no search, each with a precise message: acknowledged versions are unique,
//! they follow real time, reads are not stale, versions never advance by more than the writes that
//! could have applied (which is how a write applied twice shows), and one version means one document.
//!
//! Every answered op that carries a counter is an *observation* of it: a write's answer is the value
//! after the write (it bumped the counter), any other answer a read of it. Pushes are notifications and
//! are left to the push checks.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::check::{Findings, TwinCtx};
use super::history::Outcome;
use super::model::{section_of, Counter};
use super::report::ViolationKind;

#[derive(Clone, Copy, Debug)]
struct Obs {
    op: usize,
    value: i64,
    invoke: u64,
    complete: u64,
    /// The op bumped this counter (so the value is its own, and must be new).
    write: bool,
}

pub(crate) fn check(ctx: &TwinCtx<'_>, f: &mut Findings) {
    for counter in Counter::ALL {
        let obs = observations(ctx, counter);
        unique(counter, &obs, f);
        real_time(ctx, counter, &obs, f);
        gaps(ctx, counter, &obs, f);
    }
    divergent(ctx, f);
}

/// The first op that showed a section at some version, and what it showed.
type Seen = (usize, Map<String, Value>);

/// A section changes exactly when its version does, so every answer at one section version must show
/// the same section. Two that differ are two histories (a split brain, or a version reused).
fn divergent(ctx: &TwinCtx<'_>, f: &mut Findings) {
    let mut first: BTreeMap<(&str, i64), Seen> = BTreeMap::new();
    for (i, op) in ctx.iter().filter(|(_, op)| !op.kind.is_notification()) {
        let Outcome::Ok { desired_version, desired, reported_version, reported, .. } = &op.outcome else { continue };
        for (name, version, doc) in [("desired", desired_version, desired), ("reported", reported_version, reported)] {
            let (Some(version), Some(doc)) = (version, doc) else { continue };
            let doc = section_of(doc);
            match first.get(&(name, *version)) {
                Some((j, seen)) if *seen != doc => f.push(
                    ViolationKind::DivergentState,
                    format!(
                        "#{j} and #{i} both show {name} $version {version}, with different documents: {} and {}",
                        Value::Object(seen.clone()),
                        Value::Object(doc)
                    ),
                    vec![*j, i],
                ),
                Some(_) => {}
                None => {
                    first.insert((name, *version), (i, doc));
                }
            }
        }
    }
}

fn observations(ctx: &TwinCtx<'_>, counter: Counter) -> Vec<Obs> {
    ctx.iter()
        .filter(|(_, op)| !op.kind.is_notification())
        .filter_map(|(i, op)| {
            let value = counter.observed(&op.outcome)?;
            let complete = op.complete_ns?;
            Some(Obs { op: i, value, invoke: op.invoke_ns, complete, write: counter.bumped_by(&op.kind) })
        })
        .collect()
}

fn unique(counter: Counter, obs: &[Obs], f: &mut Findings) {
    let mut first: BTreeMap<i64, usize> = BTreeMap::new();
    for o in obs.iter().filter(|o| o.write) {
        if let Some(&prev) = first.get(&o.value) {
            f.push(
                ViolationKind::DuplicateVersion,
                format!("writes #{prev} and #{} were both acknowledged at {} {}", o.op, counter.label(), o.value),
                vec![prev, o.op],
            );
        } else {
            first.insert(o.value, o.op);
        }
    }
}

/// For each observation B, the largest value among observations that completed before B was invoked
/// must be below B's (B a write) or at most B's (B a read).
fn real_time(ctx: &TwinCtx<'_>, counter: Counter, obs: &[Obs], f: &mut Findings) {
    let mut by_complete: Vec<&Obs> = obs.iter().collect();
    by_complete.sort_by_key(|o| (o.complete, o.op));
    let mut by_invoke: Vec<&Obs> = obs.iter().collect();
    by_invoke.sort_by_key(|o| (o.invoke, o.op));
    let mut best: Option<&Obs> = None;
    let mut k = 0;
    let what = |o: &Obs| if o.write { "acknowledged" } else { "read" };
    for b in by_invoke {
        while k < by_complete.len() && by_complete[k].complete < b.invoke {
            let a = by_complete[k];
            if best.is_none_or(|x| a.value > x.value || (a.value == x.value && a.write && !x.write)) {
                best = Some(a);
            }
            k += 1;
        }
        let Some(a) = best else { continue };
        let label = counter.label();
        if b.write && a.value >= b.value && !(a.write && a.value == b.value) {
            f.push(
                ViolationKind::VersionWentBack,
                format!(
                    "{} #{} was acknowledged at {label} {}, but #{} had already {} {label} {} before it was sent",
                    ctx.op(b.op).kind.name(),
                    b.op,
                    b.value,
                    a.op,
                    what(a),
                    a.value
                ),
                vec![a.op, b.op],
            );
        } else if !b.write && a.value > b.value {
            f.push(
                ViolationKind::StaleRead,
                format!(
                    "{} #{} read {label} {}, but #{} had already {} {label} {} before the read was sent",
                    ctx.op(b.op).kind.name(),
                    b.op,
                    b.value,
                    a.op,
                    what(a),
                    a.value
                ),
                vec![a.op, b.op],
            );
        }
    }
}

/// Between two consecutive observed values a < b, the counter advanced by b − a. Each step needs its
/// own write: one whose answer pinned a value in (a, b], or one without a value for this counter whose
/// window meets the span from the earliest op that saw a to the latest that saw b. Fewer such writes
/// than steps means something applied twice (or a write nobody sent applied).
fn gaps(ctx: &TwinCtx<'_>, counter: Counter, obs: &[Obs], f: &mut Findings) {
    let start = counter_of_initial(ctx, counter);
    let mut values: BTreeSet<i64> = obs.iter().map(|o| o.value).filter(|&v| v >= start).collect();
    values.insert(start);
    let written: BTreeSet<i64> = obs.iter().filter(|o| o.write).map(|o| o.value).collect();
    // Writes of this counter that did not answer its value: they may fill any step in their window.
    let unpinned: Vec<(usize, u64, u64)> = ctx
        .possible_writes()
        .filter(|(_, op)| counter.bumped_by(&op.kind) && counter.observed(&op.outcome).is_none())
        .map(|(i, op)| {
            let end = if op.outcome.is_ok() { op.complete_ns.unwrap_or(u64::MAX) } else { u64::MAX };
            (i, op.invoke_ns, end)
        })
        .collect();
    let values: Vec<i64> = values.into_iter().collect();
    for pair in values.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let seen_a = obs.iter().filter(|o| o.value == a);
        let (from, from_op) = if a == start {
            (0, None)
        } else {
            match seen_a.min_by_key(|o| o.invoke) {
                Some(o) => (o.invoke, Some(o.op)),
                None => continue,
            }
        };
        let Some(to) = obs.iter().filter(|o| o.value == b).max_by_key(|o| o.complete) else { continue };
        let known: Vec<i64> = written.range(a + 1..=b).copied().collect();
        let fillers: Vec<usize> =
            unpinned.iter().filter(|&&(_, inv, end)| inv <= to.complete && end >= from).map(|&(i, _, _)| i).collect();
        let possible = known.len() + fillers.len();
        let delta = b - a;
        if (possible as i64) < delta {
            let mut ops: Vec<usize> = from_op.into_iter().chain([to.op]).collect();
            ops.extend(obs.iter().filter(|o| o.write && o.value > a && o.value <= b).map(|o| o.op).take(20));
            ops.extend(fillers.iter().take(20));
            let origin = from_op.map_or_else(|| "the initial state".to_string(), |i| format!("#{i}"));
            f.push(
                ViolationKind::DuplicatedApply,
                format!(
                    "{} advanced by {delta} (from {a} at {origin} to {b} at #{}) with only {possible} writes that \
                     could have applied in between: a write applied twice, or a write nobody sent",
                    counter.label(),
                    to.op
                ),
                ops,
            );
        }
    }
}

fn counter_of_initial(ctx: &TwinCtx<'_>, counter: Counter) -> i64 {
    match counter {
        Counter::Version => ctx.initial.version,
        Counter::Desired => ctx.initial.desired_version,
        Counter::Reported => ctx.initial.reported_version,
    }
}
