//! Desired pushes, per device connection: `$version`s strictly increase (docs/architecture.md, invariant 7), no push carries a
//! version that was never committed, and the pushes converge: replaying them over the connection's last
//! GET gives the final desired. Coalescing may skip versions, which replay tolerates: a coalesced patch
//! is the composition of the patches it replaces, and a patch already reflected re-applies as a no-op.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::check::{Findings, TwinCtx};
use super::history::{Op, OpKind, Outcome};
use super::model::{merge, section_of};
use super::report::ViolationKind;

struct Push<'a> {
    index: usize,
    at: u64,
    version: i64,
    patch: &'a Value,
}

/// A GET that answered desired with its version.
struct Seen {
    index: usize,
    desired_version: i64,
    desired: Map<String, Value>,
}

fn seen(index: usize, op: &Op) -> Option<Seen> {
    match &op.outcome {
        Outcome::Ok { desired_version: Some(dv), desired: Some(d), .. } => {
            Some(Seen { index, desired_version: *dv, desired: section_of(d) })
        }
        _ => None,
    }
}

pub(crate) fn check(ctx: &TwinCtx<'_>, f: &mut Findings) {
    let mut pushes: BTreeMap<u64, Vec<Push<'_>>> = BTreeMap::new();
    for (i, op) in ctx.iter() {
        if let OpKind::Push { desired_version, patch } = &op.kind {
            pushes.entry(op.client).or_default().push(Push {
                index: i,
                at: op.invoke_ns,
                version: *desired_version,
                patch,
            });
        }
    }
    if pushes.is_empty() {
        return;
    }
    let final_twin = ctx.final_read.and_then(|i| seen(i, ctx.op(i)));
    // Desired writes that may have applied, by invoke time: a push can reflect no more than these.
    let mut sent: Vec<u64> =
        ctx.possible_writes().filter(|(_, op)| op.kind.writes_desired()).map(|(_, op)| op.invoke_ns).collect();
    sent.sort_unstable();
    for (client, mut list) in pushes {
        list.sort_by_key(|p| (p.at, p.index));
        order(client, &list, f);
        future(ctx, &list, &sent, final_twin.as_ref(), f);
        converge(ctx, client, &list, final_twin.as_ref(), f);
    }
}

fn order(client: u64, list: &[Push<'_>], f: &mut Findings) {
    for w in list.windows(2) {
        if w[1].version <= w[0].version {
            f.push(
                ViolationKind::PushOutOfOrder,
                format!(
                    "connection {client} received desired $version {} (#{}) after $version {} (#{})",
                    w[1].version, w[1].index, w[0].version, w[0].index
                ),
                vec![w[0].index, w[1].index],
            );
        }
    }
}

fn future(ctx: &TwinCtx<'_>, list: &[Push<'_>], sent: &[u64], final_twin: Option<&Seen>, f: &mut Findings) {
    for p in list {
        if let Some(fin) = final_twin.filter(|fin| p.version > fin.desired_version) {
            f.push(
                ViolationKind::PushFromFuture,
                format!(
                    "push #{} carries desired $version {}, beyond the final desired $version {} (read by #{})",
                    p.index, p.version, fin.desired_version, fin.index
                ),
                vec![p.index, fin.index],
            );
            continue;
        }
        let writes = sent.partition_point(|&t| t <= p.at) as i64;
        let reachable = ctx.initial.desired_version + writes;
        if p.version > reachable {
            f.push(
                ViolationKind::PushFromFuture,
                format!(
                    "push #{} carries desired $version {} but only {writes} desired writes had been sent when it \
                     arrived (at most $version {reachable})",
                    p.index, p.version
                ),
                vec![p.index],
            );
        }
    }
}

/// Replays the pushes after the connection's last (non-final) GET and compares with the final desired:
/// the connection's own converged GET if the runner marked one, else the twin's final read.
fn converge(ctx: &TwinCtx<'_>, client: u64, list: &[Push<'_>], final_twin: Option<&Seen>, f: &mut Findings) {
    let gets = || ctx.iter().filter(|(_, op)| op.client == client && matches!(op.kind, OpKind::DeviceGet));
    let own_final = gets()
        .filter(|(_, op)| op.final_read)
        .filter_map(|(i, op)| seen(i, op).map(|s| (op.invoke_ns, s)))
        .max_by_key(|(t, s)| (*t, s.index))
        .map(|(_, s)| s);
    let Some(base) = gets()
        .filter(|(_, op)| !op.final_read)
        .filter_map(|(i, op)| seen(i, op).map(|s| (op.complete_ns.unwrap_or(0), op.invoke_ns, s)))
        .max_by_key(|(c, _, s)| (*c, s.index))
    else {
        return;
    };
    let (_, base_invoke, base) = base;
    let Some(target) = own_final.as_ref().or(final_twin) else { return };
    let mut view = base.desired.clone();
    let mut at = base.desired_version;
    let mut replayed = Vec::new();
    for p in list.iter().filter(|p| p.at >= base_invoke) {
        if p.version > at {
            merge(&mut view, &section_of(p.patch));
            at = p.version;
            replayed.push(p.index);
        }
    }
    let mut ops = vec![base.index, target.index];
    ops.extend(replayed.iter().rev().take(20));
    if at == target.desired_version && view != target.desired {
        f.push(
            ViolationKind::PushNotConverged,
            format!(
                "connection {client}: GET #{} (desired $version {}) plus the {} pushes after it give {}, but the final \
                 desired at $version {at} (read by #{}) is {}",
                base.index,
                base.desired_version,
                replayed.len(),
                Value::Object(view),
                target.index,
                Value::Object(target.desired.clone())
            ),
            ops,
        );
    } else if at < target.desired_version && own_final.is_some() {
        f.push(
            ViolationKind::PushNotConverged,
            format!(
                "connection {client}: after GET #{} (desired $version {}) the last push it received was $version {at}, \
                 but its converged GET #{} shows $version {}: the final desired was never pushed",
                base.index, base.desired_version, target.index, target.desired_version
            ),
            ops,
        );
    }
}
