//! The change feed, per twin: every change acknowledged to a writer reaches the feed's consumers — as
//! an event (alone, or merged with neighbours: an event of twin version `v` carrying `m` changes
//! covers versions `v - m + 1 ..= v`) or through a resync (the consumer re-reads, so whatever was
//! written before the resync is accounted for) — and one consumer connection never sees a twin's
//! version go back unless told to resync in between. Delivery is at least once: repeats are fine.
//!
//! Only writes whose answer carried the twin version (the HTTP ones) are checked for delivery; a
//! history without feed items (an older run, or a runner without a consumer) is not checked.

use std::collections::BTreeMap;

use super::check::{Findings, TwinCtx};
use super::history::{OpKind, Outcome};
use super::report::ViolationKind;

pub(crate) fn check(ctx: &TwinCtx<'_>, f: &mut Findings) {
    let mut events: Vec<(usize, u64, i64, i64)> = Vec::new();
    let mut resyncs: Vec<(usize, u64)> = Vec::new();
    let mut per_client: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, op) in ctx.iter() {
        match op.kind {
            OpKind::FeedEvent { version, merged } => {
                events.push((i, op.client, version, merged.max(1)));
                per_client.entry(op.client).or_default().push(i);
            }
            OpKind::FeedResync => {
                resyncs.push((i, op.invoke_ns));
                per_client.entry(op.client).or_default().push(i);
            }
            _ => {}
        }
    }
    if events.is_empty() && resyncs.is_empty() {
        return;
    }

    // Order, per consumer connection (ops are in receive order within a client).
    for idx in per_client.values() {
        let mut last: Option<(usize, i64)> = None;
        for &i in idx {
            match ctx.op(i).kind {
                OpKind::FeedResync => last = None,
                OpKind::FeedEvent { version, .. } => {
                    if let Some((j, v)) = last.filter(|(_, v)| version < *v) {
                        f.push(
                            ViolationKind::FeedOutOfOrder,
                            format!("a feed consumer saw version {version} after version {v} without a resync"),
                            vec![j, i],
                        );
                    }
                    last = Some((i, last.map_or(version, |(_, v)| v.max(version))));
                }
                _ => {}
            }
        }
    }

    // Delivery of every acknowledged, versioned write.
    for (i, op) in ctx.iter() {
        if !op.kind.is_write() {
            continue;
        }
        let Outcome::Ok { version: Some(v), .. } = op.outcome else { continue };
        let by_event = events.iter().any(|&(_, _, ev, m)| ev - m < v && v <= ev);
        let by_resync = resyncs.iter().any(|&(_, at)| at > op.invoke_ns);
        if !by_event && !by_resync {
            let near: Vec<usize> = events.iter().filter(|e| (e.2 - v).abs() <= 2).map(|e| e.0).take(4).collect();
            let mut ops = vec![i];
            ops.extend(near);
            f.push(
                ViolationKind::FeedMissed,
                format!(
                    "the write acknowledged at version {v} ({}) reached no feed consumer, as an event or a resync",
                    ctx.describe(i)
                ),
                ops,
            );
        }
    }
}
