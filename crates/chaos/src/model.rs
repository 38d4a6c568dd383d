//! The sequential model of one twin that linearizability is judged against, and the ops of a history
//! turned into its transitions.
//!
//! The merge mirrors `model::doc::Node::merge` (recursive, `null` deletes, nulls inside new objects
//! dropped, arrays are opaque leaves), so that the checker and the state machine agree on what a patch
//! means; the randomized tests drive the real `ShardState` to keep them in step.

use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::rc::Rc;

use super::history::{Op, OpKind, Outcome, TwinState};

/// A section's content with its fingerprint. Shared (`Rc`): a write changes one section, and the search
/// keeps many states alive; comparing fingerprints is how answers are matched against the model.
#[derive(Clone, Debug)]
pub(crate) struct Doc {
    map: Rc<Map<String, Value>>,
    fingerprint: u128,
}

impl Doc {
    pub fn new(map: Map<String, Value>) -> Doc {
        let mut buf = Vec::with_capacity(128);
        canonical_map(&map, &mut buf);
        Doc { fingerprint: xxhash_rust::xxh3::xxh3_128(&buf), map: Rc::new(map) }
    }

    pub fn map(&self) -> &Map<String, Value> {
        &self.map
    }

    /// Same content (key order aside; numbers by their exact text).
    pub fn same(&self, other: &Doc) -> bool {
        self.fingerprint == other.fingerprint
    }

    pub fn fingerprint(&self) -> u128 {
        self.fingerprint
    }
}

/// One twin's modelled state, with a fingerprint for the search's memo (computed once per state: reads
/// leave the state untouched and reuse it).
#[derive(Clone, Debug)]
pub(crate) struct State {
    pub desired: Doc,
    pub desired_version: i64,
    pub reported: Doc,
    pub reported_version: i64,
    pub version: i64,
    pub fingerprint: u128,
}

impl State {
    pub fn new(desired: Doc, dv: i64, reported: Doc, rv: i64, v: i64) -> State {
        let mut buf = [0u8; 56];
        buf[..8].copy_from_slice(&dv.to_le_bytes());
        buf[8..16].copy_from_slice(&rv.to_le_bytes());
        buf[16..24].copy_from_slice(&v.to_le_bytes());
        buf[24..40].copy_from_slice(&desired.fingerprint.to_le_bytes());
        buf[40..].copy_from_slice(&reported.fingerprint.to_le_bytes());
        let fingerprint = xxhash_rust::xxh3::xxh3_128(&buf);
        State { desired, desired_version: dv, reported, reported_version: rv, version: v, fingerprint }
    }

    pub fn from_twin(t: &TwinState) -> State {
        let (d, r) = (Doc::new(section(&t.desired)), Doc::new(section(&t.reported)));
        State::new(d, t.desired_version, r, t.reported_version, t.version)
    }

    pub fn versions(&self) -> Versions {
        Versions { version: self.version, desired: self.desired_version, reported: self.reported_version }
    }
}

/// The three counters a twin carries. Every write bumps `version` and exactly one of the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Versions {
    pub version: i64,
    pub desired: i64,
    pub reported: i64,
}

/// Which of the three counters a check is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Counter {
    Version,
    Desired,
    Reported,
}

impl Counter {
    pub const ALL: [Counter; 3] = [Counter::Version, Counter::Desired, Counter::Reported];

    pub fn label(self) -> &'static str {
        match self {
            Counter::Version => "twin version",
            Counter::Desired => "desired $version",
            Counter::Reported => "reported $version",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether an op of this kind increments the counter when it applies.
    pub fn bumped_by(self, kind: &OpKind) -> bool {
        match self {
            Counter::Version => kind.is_write(),
            Counter::Desired => kind.writes_desired(),
            Counter::Reported => kind.writes_reported(),
        }
    }

    /// The counter's value an `Ok` answer carried (for a write: after it applied).
    pub fn observed(self, outcome: &Outcome) -> Option<i64> {
        match outcome {
            Outcome::Ok { version, desired_version, reported_version, .. } => match self {
                Counter::Version => *version,
                Counter::Desired => *desired_version,
                Counter::Reported => *reported_version,
            },
            _ => None,
        }
    }
}

/// A section as the model holds it: answers may carry `$metadata` and `$version`, which are not data.
pub(crate) fn section(m: &Map<String, Value>) -> Map<String, Value> {
    m.iter()
        .filter(|(k, _)| k.as_str() != "$metadata" && k.as_str() != "$version")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// `section` of a value known to be an object (validated); anything else reads as empty.
pub(crate) fn section_of(v: &Value) -> Map<String, Value> {
    v.as_object().map(section).unwrap_or_default()
}

/// A value as stored: nulls inside objects mean "absent" (`Node::from_value`); arrays stay verbatim.
pub(crate) fn stored(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            Value::Object(m.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), stored(v))).collect())
        }
        other => other.clone(),
    }
}

/// The twin merge: objects merge into objects, `null` removes, anything else replaces.
pub(crate) fn merge(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (key, pv) in patch {
        match pv {
            Value::Null => {
                target.shift_remove(key);
            }
            Value::Object(pm) => match target.get_mut(key) {
                Some(Value::Object(tm)) => merge(tm, pm),
                _ => {
                    target.insert(key.clone(), stored(pv));
                }
            },
            v => {
                target.insert(key.clone(), v.clone());
            }
        }
    }
}

pub(crate) type Path = Vec<String>;

/// Leaves of a document or patch: non-objects, `null`s and empty objects, with their paths.
pub(crate) fn leaves(m: &Map<String, Value>, prefix: &mut Path, out: &mut Vec<(Path, Value)>) {
    for (k, v) in m {
        prefix.push(k.clone());
        match v {
            Value::Object(inner) if !inner.is_empty() => leaves(inner, prefix, out),
            _ => out.push((prefix.clone(), v.clone())),
        }
        prefix.pop();
    }
}

pub(crate) fn lookup<'a>(m: &'a Map<String, Value>, path: &[String]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    let v = m.get(first)?;
    if rest.is_empty() {
        Some(v)
    } else {
        lookup(v.as_object()?, rest)
    }
}

/// Order-independent bytes of a map (keys sorted), for fingerprints. Numbers keep their exact text.
fn canonical_map(m: &Map<String, Value>, out: &mut Vec<u8>) {
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort();
    out.push(b'{');
    out.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    for k in keys {
        out.extend_from_slice(&(k.len() as u64).to_le_bytes());
        out.extend_from_slice(k.as_bytes());
        if let Some(v) = m.get(k) {
            canonical(v, out);
        }
    }
}

fn canonical(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.push(b'n'),
        Value::Bool(b) => out.extend_from_slice(if *b { b"t" } else { b"f" }),
        Value::Number(n) => {
            let s = n.to_string();
            out.push(b'#');
            out.extend_from_slice(&(s.len() as u64).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        Value::String(s) => {
            out.push(b'"');
            out.extend_from_slice(&(s.len() as u64).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        Value::Array(a) => {
            out.push(b'[');
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for x in a {
                canonical(x, out);
            }
        }
        Value::Object(m) => canonical_map(m, out),
    }
}

/// What an `Ok` answer claims about the state right after the op (for a write) or at it (for a read).
#[derive(Clone, Debug, Default)]
pub(crate) struct Expect {
    pub version: Option<i64>,
    pub desired_version: Option<i64>,
    pub reported_version: Option<i64>,
    pub desired: Option<Doc>,
    pub reported: Option<Doc>,
}

impl Expect {
    fn from_outcome(o: &Outcome) -> Expect {
        match o {
            Outcome::Ok { version, desired_version, reported_version, desired, reported, .. } => Expect {
                version: *version,
                desired_version: *desired_version,
                reported_version: *reported_version,
                desired: desired.as_ref().map(|d| Doc::new(section_of(d))),
                reported: reported.as_ref().map(|r| Doc::new(section_of(r))),
            },
            _ => Expect::default(),
        }
    }

    fn versions_match(&self, v: &Versions) -> bool {
        self.version.is_none_or(|x| x == v.version)
            && self.desired_version.is_none_or(|x| x == v.desired)
            && self.reported_version.is_none_or(|x| x == v.reported)
    }
}

#[derive(Clone, Debug)]
pub(crate) enum Action {
    /// A desired patch (`replace: false`) or a replace of the whole section.
    Desired {
        doc: Map<String, Value>,
        replace: bool,
        /// Exact If-Match: the desired `$version` whose etag the write was conditional on.
        required_dv: Option<i64>,
    },
    Reported {
        patch: Map<String, Value>,
    },
    Read,
    /// An If-Match write answered 412: at its linearization point the twin was not at any of these
    /// versions (the ones observed carrying its etag). Changes nothing.
    Rejected {
        not_versions: BTreeSet<i64>,
    },
}

/// One op of the linearizability search.
#[derive(Clone, Debug)]
pub(crate) struct LinOp {
    /// Index in `History::ops`.
    pub index: usize,
    pub invoke: u64,
    /// `None`: never answered, so optional and unbounded (it may not have happened at all).
    pub complete: Option<u64>,
    pub action: Action,
    pub expect: Expect,
    /// Ops whose answers showed the If-Match etag at its versions: the condition rests on them, so a
    /// shrunk history that keeps this op shows them too.
    pub evidence: Vec<usize>,
}

pub(crate) enum Step {
    /// Consistent; the state is unchanged (reads, rejections).
    Same,
    Next(State),
    Invalid,
}

impl LinOp {
    /// The transition of `op`, or `None` if the op takes no part in linearizability: failed ops (never
    /// applied), unanswered reads (no information), pushes. `etag_versions` maps an etag to the
    /// `(desired_version, version)` pairs seen with it, for exact If-Match; pass an empty map to treat
    /// conditional writes as plain ones.
    pub fn from_op(index: usize, op: &Op, etag_versions: &EtagVersions) -> Option<LinOp> {
        let expect = Expect::from_outcome(&op.outcome);
        let action = match (&op.kind, &op.outcome) {
            (OpKind::Push { .. } | OpKind::FeedEvent { .. } | OpKind::FeedResync, _) => return None,
            (k, Outcome::Failed { .. }) if k.is_write() && op.outcome.is_precondition_failed() => {
                let etag = k.if_match()?;
                let seen = etag_versions.get(&etag)?;
                Action::Rejected { not_versions: seen.keys().map(|&(_, v)| v).collect() }
            }
            (_, Outcome::Failed { .. }) => return None,
            (k, Outcome::Unknown { .. }) if k.is_read() => return None,
            (OpKind::GetTwin | OpKind::DeviceGet, _) => Action::Read,
            (OpKind::PatchDesired { patch, .. }, _) => Action::Desired {
                doc: patch.as_object().cloned().unwrap_or_default(),
                replace: false,
                required_dv: required_dv(&op.kind, etag_versions),
            },
            (OpKind::ReplaceTwin { desired, .. }, _) => Action::Desired {
                doc: desired
                    .as_object()
                    .map(|m| match stored(&Value::Object(m.clone())) {
                        Value::Object(m) => m,
                        _ => Map::new(),
                    })
                    .unwrap_or_default(),
                replace: true,
                required_dv: required_dv(&op.kind, etag_versions),
            },
            (OpKind::PatchReported { patch }, _) => {
                Action::Reported { patch: patch.as_object().cloned().unwrap_or_default() }
            }
        };
        let complete = if op.outcome.is_ok() || op.outcome.is_failed() { op.complete_ns } else { None };
        let conditional = matches!(action, Action::Rejected { .. } | Action::Desired { required_dv: Some(_), .. });
        let evidence = match op.kind.if_match().and_then(|e| etag_versions.get(&e)) {
            Some(seen) if conditional => seen.values().copied().collect(),
            _ => Vec::new(),
        };
        Some(LinOp { index, invoke: op.invoke_ns, complete, action, expect, evidence })
    }

    /// The same op with its answer forgotten: an acknowledged write still happened within its window,
    /// but with whatever versions and document; an unanswered one stays optional. Reads and rejections
    /// say nothing once forgotten (`None`). Forgetting answers only adds linearizations.
    pub fn silenced(&self) -> Option<LinOp> {
        let action = match &self.action {
            Action::Read | Action::Rejected { .. } => return None,
            Action::Desired { doc, replace, .. } => {
                Action::Desired { doc: doc.clone(), replace: *replace, required_dv: None }
            }
            a @ Action::Reported { .. } => a.clone(),
        };
        Some(LinOp {
            index: self.index,
            invoke: self.invoke,
            complete: self.complete,
            action,
            expect: Expect::default(),
            evidence: Vec::new(),
        })
    }

    /// `silenced`, and optional too: it may not have happened at all.
    pub fn optional(&self) -> Option<LinOp> {
        self.silenced().map(|op| LinOp { complete: None, ..op })
    }

    /// Whether applying this op increments `counter`.
    pub fn bumps(&self, counter: Counter) -> bool {
        match self.action {
            Action::Desired { .. } => counter != Counter::Reported,
            Action::Reported { .. } => counter != Counter::Desired,
            Action::Read | Action::Rejected { .. } => false,
        }
    }

    /// Versions after this op applied to a state at `v`.
    pub fn next_versions(&self, v: Versions) -> Versions {
        match self.action {
            Action::Desired { .. } => Versions { version: v.version + 1, desired: v.desired + 1, reported: v.reported },
            Action::Reported { .. } => {
                Versions { version: v.version + 1, desired: v.desired, reported: v.reported + 1 }
            }
            Action::Read | Action::Rejected { .. } => v,
        }
    }

    /// The counter values the state must have right before this op, as far as its answer pins them.
    /// Versions only grow, so once the state is past one of these the op can never be linearized.
    pub fn required_before(&self) -> [Option<i64>; 3] {
        let e = &self.expect;
        let (dv_bump, rv_bump, v_bump) = match self.action {
            Action::Desired { .. } => (1, 0, 1),
            Action::Reported { .. } => (0, 1, 1),
            Action::Read | Action::Rejected { .. } => (0, 0, 0),
        };
        let mut dv = e.desired_version.map(|x| x - dv_bump);
        if let Action::Desired { required_dv: Some(r), .. } = self.action {
            dv = Some(dv.map_or(r, |d| d.min(r)));
        }
        let mut out = [None; 3];
        out[Counter::Version.index()] = e.version.map(|x| x - v_bump);
        out[Counter::Desired.index()] = dv;
        out[Counter::Reported.index()] = e.reported_version.map(|x| x - rv_bump);
        out
    }

    /// Applies the op to `s` if its answer is consistent with doing so there.
    pub fn step(&self, s: &State) -> Step {
        let next = self.next_versions(s.versions());
        if !self.expect.versions_match(&next) {
            return Step::Invalid;
        }
        match &self.action {
            Action::Read => {
                let ok = self.expect.desired.as_ref().is_none_or(|d| d.same(&s.desired))
                    && self.expect.reported.as_ref().is_none_or(|r| r.same(&s.reported));
                if ok {
                    Step::Same
                } else {
                    Step::Invalid
                }
            }
            Action::Rejected { not_versions } => {
                if not_versions.contains(&s.version) {
                    Step::Invalid
                } else {
                    Step::Same
                }
            }
            Action::Desired { doc, replace, required_dv } => {
                if required_dv.is_some_and(|r| r != s.desired_version) {
                    return Step::Invalid;
                }
                let desired = Doc::new(if *replace {
                    doc.clone()
                } else {
                    let mut d = s.desired.map().clone();
                    merge(&mut d, doc);
                    d
                });
                let ok = self.expect.desired.as_ref().is_none_or(|d| d.same(&desired))
                    && self.expect.reported.as_ref().is_none_or(|r| r.same(&s.reported));
                if !ok {
                    return Step::Invalid;
                }
                Step::Next(State::new(desired, next.desired, s.reported.clone(), next.reported, next.version))
            }
            Action::Reported { patch } => {
                let mut reported = s.reported.map().clone();
                merge(&mut reported, patch);
                let reported = Doc::new(reported);
                let ok = self.expect.reported.as_ref().is_none_or(|r| r.same(&reported))
                    && self.expect.desired.as_ref().is_none_or(|d| d.same(&s.desired));
                if !ok {
                    return Step::Invalid;
                }
                Step::Next(State::new(s.desired.clone(), next.desired, reported, next.reported, next.version))
            }
        }
    }
}

/// Etag → the `(desired_version, version)` pairs answers showed with it, each with the first op that
/// showed it.
pub(crate) type EtagVersions = std::collections::BTreeMap<String, std::collections::BTreeMap<(i64, i64), usize>>;

/// Exact If-Match for an acknowledged write: it applied at the one desired `$version` its etag was seen
/// with. Ambiguous or unseen etags give no condition (the documented fallback: a plain write).
fn required_dv(kind: &OpKind, etag_versions: &EtagVersions) -> Option<i64> {
    let seen = etag_versions.get(&kind.if_match()?)?;
    let dvs: BTreeSet<i64> = seen.keys().map(|&(dv, _)| dv).collect();
    match dvs.len() {
        1 => dvs.into_iter().next(),
        _ => None,
    }
}

/// Collects, from every answer carrying an etag with both versions, which versions it was seen at.
pub(crate) fn etag_versions<'a>(ops: impl Iterator<Item = (usize, &'a Op)>) -> EtagVersions {
    let mut map = EtagVersions::new();
    for (i, op) in ops {
        if let Outcome::Ok { etag: Some(e), desired_version: Some(dv), version: Some(v), .. } = &op.outcome {
            map.entry(super::history::normalize_etag(e)).or_default().entry((*dv, *v)).or_insert(i);
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn merge_matches_the_twin_merge() {
        let mut s = Map::new();
        merge(&mut s, &obj(json!({"a": {"b": 1, "c": 2}, "d": "x", "n": null})));
        merge(&mut s, &obj(json!({"a": {"b": null, "e": true}, "d": {"f": 1.5, "g": null}})));
        assert_eq!(Value::Object(s), json!({"a": {"c": 2, "e": true}, "d": {"f": 1.5}}));
    }

    #[test]
    fn fingerprint_ignores_key_order_but_not_values() {
        let st = |v: Value, dv: i64| State::new(Doc::new(obj(v)), dv, Doc::new(Map::new()), 1, 2);
        let a = st(json!({"x": 1, "y": {"p": 1, "q": 2}}), 2);
        let b = st(json!({"y": {"q": 2, "p": 1}, "x": 1}), 2);
        let c = st(json!({"y": {"q": 2, "p": 1}, "x": 2}), 2);
        let d = st(json!({"y": {"q": 2, "p": 1}, "x": 1}), 3);
        assert_eq!(a.fingerprint, b.fingerprint);
        assert_ne!(a.fingerprint, c.fingerprint);
        assert_ne!(a.fingerprint, d.fingerprint);
    }
}
