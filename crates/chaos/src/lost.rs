//! No acknowledged write is lost: the final read (taken after healing) reflects each one.
//!
//! Linearizability already implies this when the final read is in the history; this check exists for
//! its message, which names the write and what the final state lacks. A write's effect may have been
//! overwritten legitimately, so a path is only checked when no write that could have come after it (not
//! failed, not finished before it started, not pinned to an earlier version) touched that path.

use serde_json::{Map, Value};

use super::check::{Findings, TwinCtx};
use super::history::{Op, OpKind, Outcome};
use super::model::{leaves, lookup, section_of, stored, Counter, Path};
use super::report::ViolationKind;

/// Which section a write changes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    Desired,
    Reported,
}

impl Section {
    fn of(kind: &OpKind) -> Option<Section> {
        match kind {
            OpKind::PatchDesired { .. } | OpKind::ReplaceTwin { .. } => Some(Section::Desired),
            OpKind::PatchReported { .. } => Some(Section::Reported),
            _ => None,
        }
    }

    fn counter(self) -> Counter {
        match self {
            Section::Desired => Counter::Desired,
            Section::Reported => Counter::Reported,
        }
    }

    fn answered(self, o: &Outcome) -> Option<Map<String, Value>> {
        match o {
            Outcome::Ok { desired, reported, .. } => match self {
                Section::Desired => desired.as_ref().map(section_of),
                Section::Reported => reported.as_ref().map(section_of),
            },
            _ => None,
        }
    }
}

/// What a write touched: some paths, or (a replace) everything.
enum Touch {
    All,
    Paths(Vec<Path>),
}

impl Touch {
    fn of(kind: &OpKind) -> Touch {
        match kind {
            OpKind::ReplaceTwin { .. } => Touch::All,
            OpKind::PatchDesired { patch, .. } | OpKind::PatchReported { patch } => {
                let mut out = Vec::new();
                leaves(&section_of(patch), &mut Vec::new(), &mut out);
                Touch::Paths(out.into_iter().map(|(p, _)| p).collect())
            }
            _ => Touch::Paths(Vec::new()),
        }
    }

    fn meets(&self, path: &[String]) -> bool {
        match self {
            Touch::All => true,
            Touch::Paths(ps) => ps.iter().any(|p| related(p, path)),
        }
    }
}

/// One path is a prefix of the other: a write to either can change what the other holds.
fn related(a: &[String], b: &[String]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// Whether the final section shows a patch leaf: `null` → absent, `{}` → some object, else equal.
fn shows(final_doc: &Map<String, Value>, path: &[String], leaf: &Value) -> bool {
    match (leaf, lookup(final_doc, path)) {
        (Value::Null, found) => found.is_none(),
        (Value::Object(_), Some(found)) => found.is_object(),
        (v, Some(found)) => *found == stored(v),
        (_, None) => false,
    }
}

pub(crate) fn check(ctx: &TwinCtx<'_>, f: &mut Findings) {
    let Some(fi) = ctx.final_read else { return };
    let fin = ctx.op(fi);
    let Some(fin_complete) = fin.complete_ns else { return };
    let touches: Vec<(usize, Touch)> = ctx.possible_writes().map(|(i, op)| (i, Touch::of(&op.kind))).collect();
    for (wi, w) in ctx.iter() {
        let Some(section) = Section::of(&w.kind) else { continue };
        let Some(w_complete) = w.complete_ns else { continue };
        if !w.outcome.is_ok() || w_complete >= fin.invoke_ns {
            continue;
        }
        let counter = section.counter();
        let label = counter.label();
        let (w_v, fin_v) = (counter.observed(&w.outcome), counter.observed(&fin.outcome));
        if let (Some(wv), Some(fv)) = (w_v, fin_v) {
            if fv < wv {
                f.push(
                    ViolationKind::LostWrite,
                    format!(
                        "write #{wi} ({}) was acknowledged at {label} {wv}; the final read #{fi} is at {label} {fv} \
                         and lacks its effect",
                        w.kind.name()
                    ),
                    vec![wi, fi],
                );
                continue;
            }
        }
        let Some(fin_doc) = section.answered(&fin.outcome) else { continue };
        // Writes of the same section that may have applied after `w` and before the final read.
        let later: Vec<&Touch> = touches
            .iter()
            .filter(|(oi, _)| *oi != wi && *oi != fi)
            .filter(|(oi, _)| could_follow(ctx.op(*oi), w, section, fin_complete))
            .map(|(_, t)| t)
            .collect();
        let at = w_v.map(|v| format!(" at {label} {v}")).unwrap_or_default();
        let fin_at = fin_v.map(|v| format!(" ({label} {v})")).unwrap_or_default();
        if let Some(problem) = missing_effect(w, &fin_doc, &later) {
            f.push(
                ViolationKind::LostWrite,
                format!(
                    "write #{wi} ({}) was acknowledged{at}, but the final read #{fi}{fin_at} {problem}, and no write \
                     that could have followed it touched that path",
                    w.kind.name()
                ),
                vec![wi, fi],
            );
        }
    }
}

/// `o` is a write to the same section that real time and versions allow after `w`, before the final read.
fn could_follow(o: &Op, w: &Op, section: Section, fin_complete: u64) -> bool {
    if Section::of(&o.kind) != Some(section) || o.invoke_ns > fin_complete {
        return false;
    }
    let finished_before = o.outcome.is_ok() && o.complete_ns.is_some_and(|c| c < w.invoke_ns);
    let counter = section.counter();
    let pinned_before = matches!(
        (counter.observed(&o.outcome), counter.observed(&w.outcome)),
        (Some(ov), Some(wv)) if ov < wv
    );
    !finished_before && !pinned_before
}

/// The first effect of `w` the final section does not show, as a phrase; `None` if all show.
fn missing_effect(w: &Op, fin_doc: &Map<String, Value>, later: &[&Touch]) -> Option<String> {
    let free = |p: &[String]| !later.iter().any(|t| t.meets(p));
    let (doc, replace) = match &w.kind {
        OpKind::PatchDesired { patch, .. } | OpKind::PatchReported { patch } => (section_of(patch), false),
        OpKind::ReplaceTwin { desired, .. } => match stored(&Value::Object(section_of(desired))) {
            Value::Object(m) => (m, true),
            _ => (Map::new(), true),
        },
        _ => return None,
    };
    if replace && later.iter().any(|t| matches!(t, Touch::All)) {
        return None;
    }
    let mut wl = Vec::new();
    leaves(&doc, &mut Vec::new(), &mut wl);
    for (path, leaf) in &wl {
        if free(path) && !shows(fin_doc, path, leaf) {
            let found = lookup(fin_doc, path).map_or_else(|| "nothing".to_string(), |v| v.to_string());
            let wanted = if leaf.is_null() { "no value".to_string() } else { stored(leaf).to_string() };
            return Some(format!("has {found} at {}, not {wanted}", path.join(".")));
        }
    }
    if replace {
        // Whatever the final state holds beyond the replaced document must come from a later write.
        let mut fl = Vec::new();
        leaves(fin_doc, &mut Vec::new(), &mut fl);
        for (path, v) in &fl {
            if lookup(&doc, path).is_none() && free(path) {
                return Some(format!("still has {} = {v}, which the replace removed", path.join(".")));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_relate_by_prefix() {
        let p = |s: &str| s.split('.').map(String::from).collect::<Vec<_>>();
        assert!(related(&p("a.b"), &p("a")));
        assert!(related(&p("a"), &p("a.b.c")));
        assert!(!related(&p("a.b"), &p("a.c")));
    }

    #[test]
    fn final_doc_shows_leaves() {
        let fin = json!({"a": {"b": 1}, "c": [1, null]});
        let fin = fin.as_object().cloned().unwrap_or_default();
        let p = |s: &str| s.split('.').map(String::from).collect::<Vec<_>>();
        assert!(shows(&fin, &p("a.b"), &json!(1)));
        assert!(shows(&fin, &p("a.x"), &Value::Null));
        assert!(shows(&fin, &p("a"), &json!({})));
        assert!(shows(&fin, &p("c"), &json!([1, null])));
        assert!(!shows(&fin, &p("a.b"), &json!(2)));
        assert!(!shows(&fin, &p("a.b.z"), &json!(2)));
    }
}
