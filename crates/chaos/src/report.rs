//! The checker's verdict: what it checked, each violation with the ops that show it, and the twins it
//! could not decide.

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

use super::history::{Op, OpKind, Outcome};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub twins_checked: usize,
    pub ops: usize,
    pub violations: Vec<Violation>,
    /// One line per twin whose linearizability search ran out of budget (no verdict either way).
    pub inconclusive: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Violation {
    pub twin: String,
    pub kind: ViolationKind,
    pub message: String,
    /// Indices into `History::ops` of the ops that show the violation: for `NotLinearizable`, a shrunk
    /// sub-history whose answers already contradict each other whatever the other ops did.
    pub ops: Vec<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ViolationKind {
    /// Two acknowledged writes answered the same version.
    DuplicateVersion,
    /// A write acknowledged a version not above one already acknowledged or read before it started.
    VersionWentBack,
    /// A read saw an older version than an op that completed before the read started.
    StaleRead,
    /// Versions advanced by more than the writes that could have applied (a write applied twice, or a
    /// write nobody made).
    DuplicatedApply,
    /// Two answers show different documents for one section at the same section version.
    DivergentState,
    /// An acknowledged write is missing from the final state.
    LostWrite,
    /// No order of the ops agrees with every answer and with real time.
    NotLinearizable,
    /// A device connection received desired pushes out of `$version` order.
    PushOutOfOrder,
    /// A push carried a desired `$version` that was never committed (beyond the final one, or before
    /// enough writes had even been sent).
    PushFromFuture,
    /// Replaying a connection's pushes from its last GET does not give the final desired, or the
    /// connection never received the final version.
    PushNotConverged,
    /// The history itself is malformed (a runner bug); the op was left out.
    MalformedHistory,
    /// An acknowledged change never reached a change-feed consumer, as an event or through a resync.
    FeedMissed,
    /// A change-feed consumer saw a twin's version go back (without a resync in between).
    FeedOutOfOrder,
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty() && self.inconclusive.is_empty()
    }

    /// Violations of one kind (for tests and the runner's exit message).
    pub fn of_kind(&self, kind: ViolationKind) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(move |v| v.kind == kind)
    }

    pub fn has(&self, kind: ViolationKind) -> bool {
        self.of_kind(kind).next().is_some()
    }

    /// A readable account, one violation per paragraph.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let verdict = if self.is_ok() { "OK" } else { "FAILED" };
        let _ = writeln!(
            s,
            "chaos check {verdict}: {} twins, {} ops, {} violations, {} inconclusive",
            self.twins_checked,
            self.ops,
            self.violations.len(),
            self.inconclusive.len()
        );
        for v in &self.violations {
            let ops: Vec<String> = v.ops.iter().map(|i| format!("#{i}")).collect();
            let _ = writeln!(s, "- [{:?}] twin {}: {} (ops {})", v.kind, v.twin, v.message, ops.join(", "));
        }
        for i in &self.inconclusive {
            let _ = writeln!(s, "- [inconclusive] {i}");
        }
        s
    }
}

/// One op on one line, for messages: `#12 client 3 PatchDesired {"a":1} [100..250] → Ok v5 dv3`.
pub fn describe(index: usize, op: &Op) -> String {
    let body = match &op.kind {
        OpKind::PatchDesired { patch, if_match } => format!("{}{}", short(patch), cond(if_match)),
        OpKind::ReplaceTwin { desired, if_match, .. } => format!("{}{}", short(desired), cond(if_match)),
        OpKind::PatchReported { patch } => short(patch),
        OpKind::Push { desired_version, patch } => format!("v{desired_version} {}", short(patch)),
        OpKind::FeedEvent { version, merged } => format!("v{version} merged {merged}"),
        OpKind::GetTwin | OpKind::DeviceGet | OpKind::FeedResync => String::new(),
    };
    let end = op.complete_ns.map_or_else(|| "∞".to_string(), |c| c.to_string());
    let outcome = match &op.outcome {
        Outcome::Ok { version, desired_version, reported_version, desired, .. } => {
            let mut o = "Ok".to_string();
            if let Some(v) = version {
                let _ = write!(o, " v{v}");
            }
            if let Some(v) = desired_version {
                let _ = write!(o, " dv{v}");
            }
            if let Some(v) = reported_version {
                let _ = write!(o, " rv{v}");
            }
            if let (true, Some(d)) = (op.kind.is_read(), desired) {
                let _ = write!(o, " desired {}", short(d));
            }
            o
        }
        Outcome::Failed { status, .. } => format!("Failed {status}"),
        Outcome::Unknown { reason } => format!("Unknown ({reason})"),
    };
    format!("#{index} client {} {} {body} [{}..{end}] → {outcome}", op.client, op.kind.name(), op.invoke_ns)
}

fn cond(if_match: &Option<String>) -> String {
    if_match.as_ref().map(|e| format!(" if-match {e}")).unwrap_or_default()
}

fn short(v: &serde_json::Value) -> String {
    let s = v.to_string();
    if s.chars().count() <= 80 {
        s
    } else {
        let head: String = s.chars().take(77).collect();
        format!("{head}...")
    }
}
