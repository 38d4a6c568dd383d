//! Aggregate queries (`COUNT()`, `SUM/AVG/MIN/MAX(expr)`, `GROUP BY`), computed so that each shard
//! can aggregate its own documents and the results can be merged anywhere afterwards.
//!
//! The SELECT list is *planned* once: every aggregate call becomes a slot (`AggRef`), every
//! sub-expression equal to a GROUP BY expression becomes a key reference (`GroupKey`). A [`Partial`]
//! then holds, per group key, one accumulator per slot; accumulators are commutative and associative
//! (COUNT: a count; SUM/AVG: integer sum + float sum + count; MIN/MAX: best primitive), so merging
//! shard partials in any order gives the single-node answer. Output rows are built only in
//! [`Partial::finish`], by evaluating the planned SELECT items against the group's keys and results.
//!
//! Semantics (Cosmos DB-like): undefined arguments are ignored; SUM/AVG of any non-number, or
//! MIN/MAX of an object/array, makes that aggregate undefined (its member is omitted). MIN/MAX order
//! mixed primitives null < booleans < numbers < strings. SUM of nothing is 0; AVG/MIN/MAX of nothing
//! are undefined. Without GROUP BY there is always exactly one row (e.g. `{"total": 0}` on an empty
//! hub); with GROUP BY, one row per distinct key, documents whose key is undefined forming their own
//! group whose key member is omitted. Rows come out ordered by canonical key text (IoT Hub defines no
//! order) and TOP keeps the first n of them. Aggregate results are never paged: every group is
//! returned at once (group counts are small; a continuation over merged partials would need the
//! partials kept server-side).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ast::{AggFunc, Expr, ExprKind, Seg, SelectItem};
use super::error::{MergeError, QueryError};
use super::eval::{compare, eval, truthy, Document, Env};
use super::num::{self, canonical, Num};

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AggSpec {
    pub func: AggFunc,
    pub arg: Option<Expr>,
}

/// Everything needed to aggregate documents and render the rows.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AggPlan {
    pub filter: Option<Expr>,
    pub group_by: Vec<Expr>,
    pub specs: Vec<AggSpec>,
    /// SELECT items with aggregates and group keys replaced by references.
    pub items: Vec<SelectItem>,
    pub top: Option<u64>,
}

pub(crate) fn plan(
    items: &[SelectItem],
    group_by: &[Expr],
    filter: Option<&Expr>,
    top: Option<u64>,
) -> Result<AggPlan, QueryError> {
    let mut specs = Vec::new();
    let mut planned = Vec::with_capacity(items.len());
    for item in items {
        let mut expr = item.expr.clone();
        rewrite(&mut expr, group_by, &mut specs)?;
        planned.push(SelectItem { expr, name: item.name.clone() });
    }
    Ok(AggPlan { filter: filter.cloned(), group_by: group_by.to_vec(), specs, items: planned, top })
}

fn path_text(segs: &[Seg]) -> String {
    let mut out = String::new();
    for (i, s) in segs.iter().enumerate() {
        match s {
            Seg::Key(k) if i == 0 => out.push_str(k),
            Seg::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
            Seg::Index(n) => out.push_str(&format!("[{n}]")),
        }
    }
    out
}

fn rewrite(e: &mut Expr, group_by: &[Expr], specs: &mut Vec<AggSpec>) -> Result<(), QueryError> {
    if let Some(i) = group_by.iter().position(|g| g.same(e)) {
        e.kind = ExprKind::GroupKey(i);
        return Ok(());
    }
    match &mut e.kind {
        ExprKind::AggCall(func, arg) => {
            if let Some(inner) = arg.as_deref().and_then(|a| a.find(&|x| matches!(x.kind, ExprKind::AggCall(..)))) {
                return Err(QueryError::new(inner.pos, "aggregate functions cannot be nested"));
            }
            specs.push(AggSpec { func: *func, arg: arg.take().map(|b| *b) });
            e.kind = ExprKind::AggRef(specs.len() - 1);
            Ok(())
        }
        ExprKind::Path(segs) => Err(QueryError::new(
            e.pos,
            format!("'{}' must appear in GROUP BY or inside an aggregate function", path_text(segs)),
        )),
        ExprKind::Root => {
            Err(QueryError::new(e.pos, "the whole document must appear in GROUP BY or inside an aggregate function"))
        }
        _ => {
            for c in e.children_mut() {
                rewrite(c, group_by, specs)?;
            }
            Ok(())
        }
    }
}

/// Sum of numbers, exact while all inputs are integers and the sum fits `i64`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Total {
    int: i64,
    float: f64,
    /// Whether `float` holds anything (a non-integer input or an integer overflow).
    has_float: bool,
    count: u64,
    /// A non-number was seen: the aggregate is undefined.
    poisoned: bool,
}

impl Total {
    fn add(&mut self, v: &Value) {
        match Num::of(v) {
            Some(Num::I(i)) => match self.int.checked_add(i) {
                Some(s) => self.int = s,
                None => self.add_float(i as f64),
            },
            Some(Num::F(f)) => self.add_float(f),
            None => self.poisoned = true,
        }
        self.count += 1;
    }

    fn add_float(&mut self, f: f64) {
        self.float += f;
        self.has_float = true;
    }

    fn merge(&mut self, o: &Total) {
        match self.int.checked_add(o.int) {
            Some(s) => self.int = s,
            None => self.add_float(o.int as f64),
        }
        if o.has_float {
            self.add_float(o.float);
        }
        self.count += o.count;
        self.poisoned |= o.poisoned;
    }

    fn sum(&self) -> Option<Value> {
        if self.poisoned {
            return None;
        }
        if !self.has_float {
            return Some(Value::from(self.int));
        }
        num::float_value(self.int as f64 + self.float)
    }

    fn avg(&self) -> Option<Value> {
        if self.poisoned || self.count == 0 {
            return None;
        }
        num::float_value((self.int as f64 + self.float) / self.count as f64)
    }
}

/// A primitive remembered by MIN/MAX.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Prim {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl Prim {
    fn of(v: &Value) -> Option<Prim> {
        Some(match v {
            Value::Null => Prim::Null,
            Value::Bool(b) => Prim::Bool(*b),
            Value::Number(_) => match Num::of(v)? {
                Num::I(i) => Prim::Int(i),
                Num::F(f) => Prim::Float(f),
            },
            Value::String(s) => Prim::Str(s.clone()),
            _ => return None,
        })
    }

    fn value(&self) -> Option<Value> {
        match self {
            Prim::Null => Some(Value::Null),
            Prim::Bool(b) => Some(Value::Bool(*b)),
            Prim::Int(i) => Some(Value::from(*i)),
            Prim::Float(f) => num::float_value(*f),
            Prim::Str(s) => Some(Value::String(s.clone())),
        }
    }

    fn rank(&self) -> u8 {
        match self {
            Prim::Null => 0,
            Prim::Bool(_) => 1,
            Prim::Int(_) | Prim::Float(_) => 2,
            Prim::Str(_) => 3,
        }
    }

    fn order(&self, other: &Prim) -> Ordering {
        let by_rank = self.rank().cmp(&other.rank());
        if by_rank != Ordering::Equal {
            return by_rank;
        }
        match (self.value(), other.value()) {
            (Some(a), Some(b)) => compare(&a, &b).unwrap_or(Ordering::Equal),
            _ => Ordering::Equal,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Extreme {
    best: Option<Prim>,
    poisoned: bool,
}

impl Extreme {
    fn offer(&mut self, p: Prim, want: Ordering) {
        let better = match &self.best {
            None => true,
            Some(b) => p.order(b) == want,
        };
        if better {
            self.best = Some(p);
        }
    }

    fn add(&mut self, v: &Value, want: Ordering) {
        match Prim::of(v) {
            Some(p) => self.offer(p, want),
            None => self.poisoned = true,
        }
    }

    fn merge(&mut self, o: &Extreme, want: Ordering) {
        if let Some(p) = &o.best {
            self.offer(p.clone(), want);
        }
        self.poisoned |= o.poisoned;
    }

    fn value(&self) -> Option<Value> {
        if self.poisoned {
            return None;
        }
        self.best.as_ref().and_then(Prim::value)
    }
}

/// One aggregate's running state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Acc {
    Count(u64),
    Sum(Total),
    Avg(Total),
    Min(Extreme),
    Max(Extreme),
}

impl Acc {
    fn fresh(f: AggFunc) -> Acc {
        match f {
            AggFunc::Count => Acc::Count(0),
            AggFunc::Sum => Acc::Sum(Total::default()),
            AggFunc::Avg => Acc::Avg(Total::default()),
            AggFunc::Min => Acc::Min(Extreme::default()),
            AggFunc::Max => Acc::Max(Extreme::default()),
        }
    }

    fn fits(&self, f: AggFunc) -> bool {
        matches!(
            (self, f),
            (Acc::Count(_), AggFunc::Count)
                | (Acc::Sum(_), AggFunc::Sum)
                | (Acc::Avg(_), AggFunc::Avg)
                | (Acc::Min(_), AggFunc::Min)
                | (Acc::Max(_), AggFunc::Max)
        )
    }

    /// Feeds one defined argument value (for COUNT: one counted row).
    fn add(&mut self, v: &Value) {
        match self {
            Acc::Count(n) => *n += 1,
            Acc::Sum(t) | Acc::Avg(t) => t.add(v),
            Acc::Min(e) => e.add(v, Ordering::Less),
            Acc::Max(e) => e.add(v, Ordering::Greater),
        }
    }

    fn merge(&mut self, other: &Acc) {
        match (self, other) {
            (Acc::Count(a), Acc::Count(b)) => *a += b,
            (Acc::Sum(a), Acc::Sum(b)) | (Acc::Avg(a), Acc::Avg(b)) => a.merge(b),
            (Acc::Min(a), Acc::Min(b)) => a.merge(b, Ordering::Less),
            (Acc::Max(a), Acc::Max(b)) => a.merge(b, Ordering::Greater),
            // Shapes are validated before merging; a mismatch is ignored rather than trusted.
            _ => {}
        }
    }

    fn value(&self) -> Option<Value> {
        match self {
            Acc::Count(n) => Some(Value::from(*n)),
            Acc::Sum(t) => t.sum(),
            Acc::Avg(t) => t.avg(),
            Acc::Min(e) | Acc::Max(e) => e.value(),
        }
    }
}

/// A group key: the canonical JSON text of each GROUP BY value (`None` = undefined). Text rather
/// than `Value` so the state serializes with any serde format (postcard cannot carry a `Value`).
type GroupKey = Vec<Option<String>>;

/// Serializable content of a [`Partial`], for shipping a shard's aggregate to the node that merges.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PartialState {
    groups: Vec<GroupEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct GroupEntry {
    key: GroupKey,
    accs: Vec<Acc>,
}

/// Aggregation in progress for one query: feed documents with [`Partial::add`], combine shards with
/// [`Partial::merge`] (or [`Partial::merge_state`] for state received over the wire), render with
/// [`Partial::finish`].
#[derive(Debug, Clone)]
pub struct Partial {
    plan: Arc<AggPlan>,
    groups: BTreeMap<GroupKey, Vec<Acc>>,
    /// A document or a merged shard would have made a group past [`MAX_GROUPS`].
    overflowed: bool,
}

/// Groups one aggregate query may make, on a shard and merged: grouping by a value nearly every twin has
/// its own (`GROUP BY deviceId`) would otherwise hold and answer a row per twin of the fleet at once.
pub const MAX_GROUPS: usize = 10_000;

impl Partial {
    pub(crate) fn new(plan: Arc<AggPlan>) -> Partial {
        Partial { plan, groups: BTreeMap::new(), overflowed: false }
    }

    fn fresh_accs(&self) -> Vec<Acc> {
        self.plan.specs.iter().map(|s| Acc::fresh(s.func)).collect()
    }

    /// Offers one document of the query's collection. Applies the WHERE clause itself (so callers
    /// simply feed every document) and returns whether the document was counted.
    pub fn add(&mut self, doc: &Value) -> bool {
        self.add_doc(doc)
    }

    /// [`Partial::add`] for any [`Document`].
    pub fn add_doc(&mut self, doc: &dyn Document) -> bool {
        let env = Env::doc(doc);
        if let Some(f) = &self.plan.filter {
            if !truthy(f, env) {
                return false;
            }
        }
        let key: GroupKey =
            self.plan.group_by.iter().map(|g| eval(g, env).map(|v| canonical(&v).to_string())).collect();
        if !self.groups.contains_key(&key) {
            if self.groups.len() >= MAX_GROUPS {
                self.overflowed = true;
                return true;
            }
            let fresh = self.fresh_accs();
            self.groups.insert(key.clone(), fresh);
        }
        let plan = Arc::clone(&self.plan);
        if let Some(accs) = self.groups.get_mut(&key) {
            for (acc, spec) in accs.iter_mut().zip(&plan.specs) {
                match &spec.arg {
                    None => acc.add(&Value::Null),
                    Some(arg) => {
                        if let Some(v) = eval(arg, env) {
                            acc.add(&v);
                        }
                    }
                }
            }
        }
        true
    }

    /// Folds another partial of the same query into this one.
    pub fn merge(&mut self, other: Partial) {
        for (key, accs) in other.groups {
            self.merge_group(key, accs);
        }
    }

    fn merge_group(&mut self, key: GroupKey, accs: Vec<Acc>) {
        let full = self.groups.len() >= MAX_GROUPS;
        match self.groups.get_mut(&key) {
            Some(mine) => {
                for (a, b) in mine.iter_mut().zip(&accs) {
                    a.merge(b);
                }
            }
            None if full => self.overflowed = true,
            None => {
                self.groups.insert(key, accs);
            }
        }
    }

    /// Why the result cannot be given, if the query made more groups than [`MAX_GROUPS`].
    pub fn too_many_groups(&self) -> Option<String> {
        self.overflowed.then(|| {
            format!(
                "GROUP BY makes more than {MAX_GROUPS} groups: group by fewer distinct values, or narrow the WHERE clause"
            )
        })
    }

    /// The serializable state (see [`PartialState`]).
    pub fn state(&self) -> PartialState {
        PartialState {
            groups: self.groups.iter().map(|(k, a)| GroupEntry { key: k.clone(), accs: a.clone() }).collect(),
        }
    }

    /// Folds in state received from another shard, after checking that it has this query's shape.
    pub fn merge_state(&mut self, state: PartialState) -> Result<(), MergeError> {
        for g in &state.groups {
            if g.key.len() != self.plan.group_by.len() {
                return Err(MergeError(format!(
                    "group key has {} values, expected {}",
                    g.key.len(),
                    self.plan.group_by.len()
                )));
            }
            if g.accs.len() != self.plan.specs.len()
                || !g.accs.iter().zip(&self.plan.specs).all(|(a, s)| a.fits(s.func))
            {
                return Err(MergeError("aggregates differ from the query's".to_string()));
            }
            if g.key.iter().flatten().any(|k| serde_json::from_str::<Value>(k).is_err()) {
                return Err(MergeError("group key is not JSON".to_string()));
            }
        }
        for g in state.groups {
            self.merge_group(g.key, g.accs);
        }
        Ok(())
    }

    /// The result rows (see the module docs for order, TOP and empty-input behaviour).
    pub fn finish(&self) -> Vec<Value> {
        let implicit;
        let groups: Box<dyn Iterator<Item = (&GroupKey, &Vec<Acc>)>> =
            if self.groups.is_empty() && self.plan.group_by.is_empty() {
                implicit = (Vec::new(), self.fresh_accs());
                Box::new(std::iter::once((&implicit.0, &implicit.1)))
            } else {
                Box::new(self.groups.iter())
            };
        let limit = self.plan.top.map_or(usize::MAX, |t| usize::try_from(t).unwrap_or(usize::MAX));
        groups
            .take(limit)
            .map(|(key, accs)| {
                let keys: Vec<Option<Value>> =
                    key.iter().map(|k| k.as_deref().and_then(|t| serde_json::from_str(t).ok())).collect();
                let aggs: Vec<Option<Value>> = accs.iter().map(Acc::value).collect();
                let env = Env { doc: None, keys: &keys, aggs: &aggs };
                let mut row = Map::new();
                for item in &self.plan.items {
                    if let Some(v) = eval(&item.expr, env) {
                        row.insert(item.name.as_str().to_string(), v.into_owned());
                    }
                }
                Value::Object(row)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse;
    use serde_json::{json, Value};

    fn docs() -> Vec<Value> {
        vec![
            json!({"deviceId": "a", "r": {"s": "ok", "t": 1}}),
            json!({"deviceId": "b", "r": {"s": "ok", "t": 2.5}}),
            json!({"deviceId": "c", "r": {"s": "bad", "t": 4}}),
            json!({"deviceId": "d", "r": {"t": "hot"}}),
            json!({"deviceId": "e"}),
        ]
    }

    fn run(q: &str) -> Vec<Value> {
        let q = parse(q).unwrap();
        let mut p = q.partial().unwrap();
        for d in docs() {
            p.add(&d);
        }
        p.finish()
    }

    #[test]
    fn a_query_may_make_at_most_max_groups_on_a_shard_and_merged() {
        let q = parse("SELECT deviceId, COUNT() AS n FROM devices GROUP BY deviceId").unwrap();
        let fill = |from: usize, to: usize| {
            let mut p = q.partial().unwrap();
            for i in from..to {
                p.add(&json!({"deviceId": format!("d{i}")}));
            }
            p
        };
        let full = fill(0, super::MAX_GROUPS);
        assert_eq!(full.too_many_groups(), None);
        assert_eq!(full.finish().len(), super::MAX_GROUPS);
        let over = fill(0, super::MAX_GROUPS + 1);
        assert!(over.too_many_groups().is_some_and(|m| m.contains("more than 10000 groups")));
        // Two shards within the bound each, over it together.
        let (mut a, b) = (fill(0, 6000), fill(6000, 12000));
        assert_eq!(b.too_many_groups(), None);
        a.merge_state(b.state()).unwrap();
        assert!(a.too_many_groups().is_some());
    }

    #[test]
    fn count_and_group() {
        assert_eq!(run("SELECT COUNT() AS n FROM devices"), vec![json!({"n": 5})]);
        assert_eq!(run("SELECT COUNT() AS n FROM devices WHERE false"), vec![json!({"n": 0})]);
        assert_eq!(run("SELECT COUNT() AS n FROM devices WHERE false GROUP BY r.s"), Vec::<Value>::new());
        assert_eq!(
            run("SELECT r.s, COUNT() AS n FROM devices GROUP BY r.s"),
            vec![json!({"n": 2}), json!({"s": "bad", "n": 1}), json!({"s": "ok", "n": 2})]
        );
        assert_eq!(run("SELECT COUNT(r.s) AS n FROM devices"), vec![json!({"n": 3})]);
    }

    #[test]
    fn numeric_aggregates() {
        let q = "SELECT SUM(r.t) AS s, AVG(r.t) AS a, MIN(r.t) AS lo, MAX(r.t) AS hi FROM devices WHERE IS_NUMBER(r.t)";
        assert_eq!(run(q), vec![json!({"s": 7.5, "a": 2.5, "lo": 1, "hi": 4})]);
        // A string poisons SUM/AVG; MIN/MAX order numbers before strings.
        let q = "SELECT SUM(r.t) AS s, AVG(r.t) AS a, MIN(r.t) AS lo, MAX(r.t) AS hi FROM devices";
        assert_eq!(run(q), vec![json!({"lo": 1, "hi": "hot"})]);
        assert_eq!(run("SELECT SUM(r.t) AS s, AVG(r.t) AS a FROM devices WHERE false"), vec![json!({"s": 0})]);
        assert_eq!(run("SELECT SUM(r.t) / COUNT() AS x FROM devices WHERE IS_NUMBER(r.t)"), vec![json!({"x": 2.5})]);
    }

    #[test]
    fn planning_errors() {
        assert!(parse("SELECT deviceId, COUNT() AS n FROM devices").unwrap_err().message.contains("GROUP BY"));
        assert!(parse("SELECT COUNT(SUM(x)) AS n FROM devices").unwrap_err().message.contains("nested"));
        assert!(parse("SELECT * FROM devices WHERE COUNT() > 1").is_err());
        assert!(parse("SELECT * FROM devices GROUP BY x").is_err());
        assert!(parse("SELECT x FROM devices GROUP BY COUNT()").is_err());
    }

    #[test]
    fn state_round_trip_and_validation() {
        let q = parse("SELECT r.s AS s, COUNT() AS n, AVG(r.t) AS a FROM devices GROUP BY r.s").unwrap();
        let all = docs();
        let mut whole = q.partial().unwrap();
        let mut left = q.partial().unwrap();
        let mut right = q.partial().unwrap();
        for (i, d) in all.iter().enumerate() {
            whole.add(d);
            if i % 2 == 0 {
                left.add(d)
            } else {
                right.add(d)
            };
        }
        let wire = serde_json::to_string(&right.state()).unwrap();
        left.merge_state(serde_json::from_str(&wire).unwrap()).unwrap();
        assert_eq!(left.finish(), whole.finish());

        let other = parse("SELECT COUNT() AS n FROM devices").unwrap();
        assert!(other.partial().unwrap().merge_state(whole.state()).is_err());
    }
}
