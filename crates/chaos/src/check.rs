//! `check`: groups the history by twin and runs every check on each twin independently.

use std::collections::BTreeMap;

use super::feed;
use super::history::{History, Op, OpKind, Outcome, TwinState};
use super::model::{etag_versions, EtagVersions, LinOp, State};
use super::report::{describe, Report, Violation, ViolationKind};
use super::wgl::{search, Verdict};
use super::{lost, push, shrink, versions};

/// Budgets and switches. The defaults suit histories of a few thousand ops per twin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckConfig {
    /// Steps (model transitions tried, and backtracks) the linearizability search may take per twin
    /// before the twin is reported inconclusive. The memo grows by at most 16 bytes per step.
    pub max_steps: u64,
    /// Shrinking a non-linearizable twin: how many re-searches it may run, the step budget of each, and
    /// of all together (a twin's shrink costs at most about `shrink_total_steps` steps).
    pub shrink_checks: usize,
    pub shrink_steps: u64,
    pub shrink_total_steps: u64,
    /// Judge If-Match writes by the versions their etag was seen with (see the module doc); `false`
    /// treats acknowledged ones as plain writes and 412s as no-ops.
    pub exact_if_match: bool,
    /// Per twin and kind, further violations are only counted (a lost write makes every later read
    /// stale; one message per cause is enough).
    pub max_reports_per_kind: usize,
}

impl Default for CheckConfig {
    fn default() -> Self {
        CheckConfig {
            max_steps: 2_000_000,
            shrink_checks: 400,
            shrink_steps: 100_000,
            shrink_total_steps: 2_000_000,
            exact_if_match: true,
            max_reports_per_kind: 5,
        }
    }
}

/// Checks a history with the default budgets.
pub fn check(history: &History) -> Report {
    check_with(history, &CheckConfig::default())
}

pub fn check_with(history: &History, cfg: &CheckConfig) -> Report {
    let mut report = Report { ops: history.ops.len(), ..Report::default() };
    let mut by_twin: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, op) in history.ops.iter().enumerate() {
        match history.validate_op(i) {
            Ok(()) => by_twin.entry(op.twin.as_str()).or_default().push(i),
            Err(e) => report.violations.push(Violation {
                twin: op.twin.clone(),
                kind: ViolationKind::MalformedHistory,
                message: e.to_string(),
                ops: vec![i],
            }),
        }
    }
    report.twins_checked = by_twin.len();
    for (twin, idx) in by_twin {
        let ctx = TwinCtx::new(twin, &history.ops, idx, history.initial.get(twin));
        let mut findings = Findings::new(twin, cfg.max_reports_per_kind);
        versions::check(&ctx, &mut findings);
        lost::check(&ctx, &mut findings);
        push::check(&ctx, &mut findings);
        feed::check(&ctx, &mut findings);
        linearizability(&ctx, cfg, &mut findings, &mut report.inconclusive);
        report.violations.extend(findings.finish());
    }
    report
}

/// Where a twin's initial state came from (said in messages, since an inferred one can be wrong).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InitialSource {
    Given,
    /// Taken from this read, which completed before any write was sent.
    Read(usize),
    /// Neither given nor readable: a fresh twin (empty sections, all versions 1).
    Fresh,
}

/// One twin's slice of the history.
pub(crate) struct TwinCtx<'a> {
    pub twin: &'a str,
    /// The whole history (indices in messages refer to it).
    pub ops: &'a [Op],
    /// This twin's well-formed ops, in history order.
    pub idx: Vec<usize>,
    pub initial: TwinState,
    pub initial_source: InitialSource,
    /// The read that must reflect every acknowledged write (see `final_read`).
    pub final_read: Option<usize>,
}

impl<'a> TwinCtx<'a> {
    fn new(twin: &'a str, ops: &'a [Op], idx: Vec<usize>, given: Option<&TwinState>) -> TwinCtx<'a> {
        let mut ctx = TwinCtx {
            twin,
            ops,
            idx,
            initial: TwinState::fresh(),
            initial_source: InitialSource::Fresh,
            final_read: None,
        };
        match given {
            Some(t) => {
                ctx.initial = t.clone();
                ctx.initial_source = InitialSource::Given;
            }
            None => {
                if let Some((i, t)) = ctx.infer_initial() {
                    ctx.initial = t;
                    ctx.initial_source = InitialSource::Read(i);
                }
            }
        }
        ctx.final_read = ctx.find_final_read();
        ctx
    }

    pub fn op(&self, i: usize) -> &'a Op {
        &self.ops[i]
    }

    /// This twin's ops with their indices.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &'a Op)> + '_ {
        self.idx.iter().map(|&i| (i, &self.ops[i]))
    }

    /// Writes that may have applied: acknowledged or unknown, not failed.
    pub fn possible_writes(&self) -> impl Iterator<Item = (usize, &'a Op)> + '_ {
        self.iter().filter(|(_, op)| op.kind.is_write() && !op.outcome.is_failed())
    }

    /// A complete `GetTwin` answered before any write was sent shows the state every op started from.
    fn infer_initial(&self) -> Option<(usize, TwinState)> {
        let first_write = self.possible_writes().map(|(_, op)| op.invoke_ns).min().unwrap_or(u64::MAX);
        self.iter()
            .filter(|(_, op)| matches!(op.kind, OpKind::GetTwin) && op.complete_ns.is_some_and(|c| c < first_write))
            .filter_map(|(i, op)| match &op.outcome {
                Outcome::Ok {
                    version: Some(v),
                    desired_version: Some(dv),
                    reported_version: Some(rv),
                    desired: Some(d),
                    reported: Some(r),
                    ..
                } => Some((
                    i,
                    TwinState {
                        desired: super::model::section_of(d),
                        desired_version: *dv,
                        reported: super::model::section_of(r),
                        reported_version: *rv,
                        version: *v,
                    },
                )),
                _ => None,
            })
            .min_by_key(|(i, _)| self.ops[*i].complete_ns)
    }

    /// The marked final `GetTwin` (latest invoked), else the latest marked `DeviceGet`, else the latest
    /// answered read invoked after every answered write completed.
    fn find_final_read(&self) -> Option<usize> {
        let answered_reads = || self.iter().filter(|(_, op)| op.kind.is_read() && op.outcome.is_ok());
        let latest =
            |it: &mut dyn Iterator<Item = (usize, &Op)>| it.max_by_key(|(i, op)| (op.invoke_ns, *i)).map(|(i, _)| i);
        let marked_get =
            latest(&mut answered_reads().filter(|(_, op)| op.final_read && matches!(op.kind, OpKind::GetTwin)));
        let marked_device = || latest(&mut answered_reads().filter(|(_, op)| op.final_read));
        marked_get.or_else(marked_device).or_else(|| {
            let last_write = self.possible_writes().filter_map(|(_, op)| op.complete_ns).max().unwrap_or(0);
            let mut candidates = answered_reads().filter(|(_, op)| op.invoke_ns >= last_write);
            latest(&mut candidates)
        })
    }

    pub fn describe(&self, i: usize) -> String {
        describe(i, &self.ops[i])
    }
}

/// A twin's violations, capped per kind.
pub(crate) struct Findings {
    twin: String,
    cap: usize,
    list: Vec<Violation>,
    counts: BTreeMap<ViolationKind, usize>,
}

impl Findings {
    fn new(twin: &str, cap: usize) -> Findings {
        Findings { twin: twin.to_string(), cap: cap.max(1), list: Vec::new(), counts: BTreeMap::new() }
    }

    pub fn push(&mut self, kind: ViolationKind, message: String, mut ops: Vec<usize>) {
        let n = self.counts.entry(kind).or_default();
        *n += 1;
        if *n <= self.cap {
            ops.sort_unstable();
            ops.dedup();
            self.list.push(Violation { twin: self.twin.clone(), kind, message, ops });
        }
    }

    fn finish(mut self) -> Vec<Violation> {
        for (kind, n) in &self.counts {
            if *n > self.cap {
                if let Some(last) = self.list.iter_mut().rev().find(|v| v.kind == *kind) {
                    last.message
                        .push_str(&format!(" ({} more {kind:?} violations on this twin not listed)", n - self.cap));
                }
            }
        }
        self.list
    }
}

fn linearizability(ctx: &TwinCtx<'_>, cfg: &CheckConfig, f: &mut Findings, inconclusive: &mut Vec<String>) {
    let etags: EtagVersions = if cfg.exact_if_match { etag_versions(ctx.iter()) } else { EtagVersions::new() };
    let lin: Vec<LinOp> = ctx.iter().filter_map(|(i, op)| LinOp::from_op(i, op, &etags)).collect();
    let init = State::from_twin(&ctx.initial);
    match search(&lin, &init, cfg.max_steps) {
        Verdict::Linearizable => {}
        Verdict::Inconclusive { steps } => inconclusive.push(format!(
            "twin {}: the linearizability search gave up after {steps} steps over {} ops",
            ctx.twin,
            lin.len()
        )),
        Verdict::NotLinearizable => {
            let core = shrink::shrink(&lin, &init, cfg);
            let answers: Vec<usize> = core.answers.iter().map(|&k| lin[k].index).collect();
            let writes: Vec<usize> = core.writes.iter().map(|&k| lin[k].index).collect();
            let evidence: Vec<usize> = core.answers.iter().flat_map(|&k| lin[k].evidence.iter().copied()).collect();
            let list = |ops: &[usize]| {
                let shown: Vec<String> = ops.iter().take(12).map(|&i| ctx.describe(i)).collect();
                let more = if ops.len() > shown.len() {
                    format!("; and {} more", ops.len() - shown.len())
                } else {
                    String::new()
                };
                format!("{}{more}", shown.join("; "))
            };
            let origin = match ctx.initial_source {
                InitialSource::Given => "the given initial state".to_string(),
                InitialSource::Read(i) => format!("the initial state read by #{i}"),
                InitialSource::Fresh => "a fresh twin (no initial state given)".to_string(),
            };
            let mut message = format!(
                "no order of the {} ops agrees with every answer and with real time, from {origin}. These {} answers \
                 contradict each other: {}",
                lin.len(),
                answers.len(),
                list(&answers)
            );
            if !writes.is_empty() {
                message.push_str(&format!(
                    ". Given that these {} acknowledged writes happened (answers aside): {}",
                    writes.len(),
                    list(&writes)
                ));
            }
            if !evidence.is_empty() {
                message.push_str(&format!(". If-Match etags as answered by: {}", list(&evidence)));
            }
            let ops = answers.into_iter().chain(writes).chain(evidence).collect();
            f.push(ViolationKind::NotLinearizable, message, ops);
        }
    }
}
