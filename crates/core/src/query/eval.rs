//! Expression evaluation with IoT Hub's (Cosmos DB-style) semantics:
//!
//! * A missing property is `undefined` (`None` here), distinct from JSON `null`.
//! * Comparisons are defined only between primitives of the same type (number/number,
//!   string/string, bool/bool, null/null); anything else (mixed types, objects, arrays, undefined)
//!   yields `undefined`, so `x = null` matches only an actual null and `x != 'a'` does not match a
//!   missing or numeric `x`. Strings compare ordinally (UTF-16 code units, like .NET's ordinal).
//! * AND/OR are three-valued over {true, false, undefined}; non-booleans count as undefined. NOT of
//!   anything but a boolean is undefined.
//! * Arithmetic is defined on numbers only.
//! * A document matches a condition only if it evaluates to exactly `true`.
//! * Property names match exactly, or failing that ASCII case-insensitively (the docs' example
//!   `SELECT DeviceId, LastActivityTime` returns `deviceId`/`lastActivityTime`).

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::{Map, Value};

use super::ast::{CmpOp, Expr, ExprKind, Seg, UnOp};
use super::functions;
use super::num::{self, Num};

/// A value or `undefined` (`None`); borrowed from the document or the query where possible.
pub(crate) type Val<'a> = Option<Cow<'a, Value>>;

/// A document a query reads: one JSON value, or anything that can answer path lookups without being
/// rendered as one (a shard's twins in their own form, see `Query::matches_doc`). Lookups follow
/// [`lookup`]'s rules: members by exact name, else ASCII case-insensitively; array elements by index.
pub trait Document {
    /// The value at `path`, `None` if a step is missing or of the wrong type.
    fn get(&self, path: &[Seg]) -> Option<Cow<'_, Value>>;
    /// The whole document (a query that names the document itself, such as `IS_OBJECT(d)`).
    fn whole(&self) -> Cow<'_, Value>;
    /// The primitive at `path`, for a comparison; `None` if undefined or not a primitive. A
    /// document that keeps values in its own form answers without building a `Value` (a WHERE
    /// clause over a large shard makes this call once per twin and condition).
    fn scalar(&self, path: &[Seg]) -> Option<Scalar<'_>> {
        self.get(path).and_then(Scalar::of)
    }
}

/// A primitive as comparisons read it: numbers already parsed, strings borrowed where possible.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar<'a> {
    Null,
    Bool(bool),
    Num(Num),
    Str(Cow<'a, str>),
}

impl<'a> Scalar<'a> {
    /// The primitive a value holds; `None` for arrays, objects and non-finite numbers.
    pub fn of(v: Cow<'a, Value>) -> Option<Scalar<'a>> {
        match v {
            Cow::Borrowed(v) => Scalar::borrowed(v),
            Cow::Owned(Value::String(s)) => Some(Scalar::Str(Cow::Owned(s))),
            Cow::Owned(Value::Null) => Some(Scalar::Null),
            Cow::Owned(Value::Bool(b)) => Some(Scalar::Bool(b)),
            Cow::Owned(ref n @ Value::Number(_)) => Num::of(n).map(Scalar::Num),
            Cow::Owned(Value::Array(_) | Value::Object(_)) => None,
        }
    }

    pub fn borrowed(v: &'a Value) -> Option<Scalar<'a>> {
        match v {
            Value::Null => Some(Scalar::Null),
            Value::Bool(b) => Some(Scalar::Bool(*b)),
            Value::Number(_) => Num::of(v).map(Scalar::Num),
            Value::String(s) => Some(Scalar::Str(Cow::Borrowed(s))),
            Value::Array(_) | Value::Object(_) => None,
        }
    }

    /// Ordering of two primitives of the same type; `None` when the comparison is undefined.
    /// Strings compare ordinally by UTF-16 code units.
    pub fn compare(&self, other: &Scalar<'_>) -> Option<Ordering> {
        match (self, other) {
            (Scalar::Null, Scalar::Null) => Some(Ordering::Equal),
            (Scalar::Bool(x), Scalar::Bool(y)) => Some(x.cmp(y)),
            (Scalar::Num(x), Scalar::Num(y)) => x.compare(*y),
            (Scalar::Str(x), Scalar::Str(y)) => Some(x.encode_utf16().cmp(y.encode_utf16())),
            _ => None,
        }
    }
}

impl Document for Value {
    fn get(&self, path: &[Seg]) -> Option<Cow<'_, Value>> {
        lookup(self, path).map(|(v, _)| Cow::Borrowed(v))
    }

    fn whole(&self) -> Cow<'_, Value> {
        Cow::Borrowed(self)
    }
}

/// What an expression can see: the document (absent when evaluating aggregate output rows), and for
/// aggregate rows the group's key values and finished aggregate values.
#[derive(Clone, Copy)]
pub(crate) struct Env<'a> {
    pub doc: Option<&'a dyn Document>,
    pub keys: &'a [Option<Value>],
    pub aggs: &'a [Option<Value>],
}

impl<'a> Env<'a> {
    pub fn doc(doc: &'a dyn Document) -> Env<'a> {
        Env { doc: Some(doc), keys: &[], aggs: &[] }
    }
}

/// Member `key` of an object: exact match first, then ASCII case-insensitive. Returns the key as
/// spelled in the document too (projections are named after it).
pub(crate) fn member<'a>(m: &'a Map<String, Value>, key: &str) -> Option<(&'a String, &'a Value)> {
    m.get_key_value(key).or_else(|| m.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)))
}

/// Follows a path; `None` if any step is missing or of the wrong type. Also returns the document's
/// spelling of the last key.
pub fn lookup<'a>(doc: &'a Value, segs: &[Seg]) -> Option<(&'a Value, Option<&'a str>)> {
    let mut cur = doc;
    let mut last = None;
    for s in segs {
        match (s, cur) {
            (Seg::Key(k), Value::Object(m)) => {
                let (name, v) = member(m, k)?;
                cur = v;
                last = Some(name.as_str());
            }
            (Seg::Index(i), Value::Array(a)) => {
                cur = a.get(*i)?;
                last = None;
            }
            _ => return None,
        }
    }
    Some((cur, last))
}

/// `Some(true)` / `Some(false)` for booleans, `None` for everything else.
fn as_bool(v: &Val<'_>) -> Option<bool> {
    match v.as_deref() {
        Some(Value::Bool(b)) => Some(*b),
        _ => None,
    }
}

fn boolean<'a>(b: Option<bool>) -> Val<'a> {
    b.map(|b| Cow::Owned(Value::Bool(b)))
}

fn owned<'a>(v: Option<Value>) -> Val<'a> {
    v.map(Cow::Owned)
}

/// Ordering of two primitives of the same type; `None` when the comparison is undefined.
pub(crate) fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    Scalar::borrowed(a)?.compare(&Scalar::borrowed(b)?)
}

pub(crate) fn is_primitive(v: &Value) -> bool {
    !matches!(v, Value::Array(_) | Value::Object(_))
}

/// `true` iff the expression evaluates to boolean `true` (the rule for WHERE).
pub(crate) fn truthy(e: &Expr, env: Env<'_>) -> bool {
    matches!(eval(e, env).as_deref(), Some(Value::Bool(true)))
}

/// Evaluates `e`. The recursive function only dispatches; each operator's work lives in its own
/// function so the frame repeated per tree level stays small (unoptimized builds give every local of
/// every arm its own stack slot).
pub(crate) fn eval<'a>(e: &'a Expr, env: Env<'a>) -> Val<'a> {
    match &e.kind {
        ExprKind::Const(v) => Some(Cow::Borrowed(v)),
        ExprKind::Undefined => None,
        ExprKind::Path(segs) => env.doc?.get(segs),
        ExprKind::Root => env.doc.map(Document::whole),
        ExprKind::Array(items) => array(items, env),
        ExprKind::Object(members) => object(members, env),
        ExprKind::Unary(op, inner) => unary(*op, eval(inner, env)),
        ExprKind::Arith(first, rest) => arith(first, rest, env),
        ExprKind::Cmp(op, a, b) => cmp(*op, operand(a, env), operand(b, env)),
        ExprKind::In { negated, lhs, rhs } => in_array(*negated, eval(lhs, env), eval(rhs, env)),
        ExprKind::And(all) => and(all, env),
        ExprKind::Or(all) => or(all, env),
        ExprKind::Call(f, args) => call(*f, args, env),
        ExprKind::AggRef(i) => env.aggs.get(*i).and_then(|v| v.as_ref()).map(Cow::Borrowed),
        ExprKind::GroupKey(i) => env.keys.get(*i).and_then(|v| v.as_ref()).map(Cow::Borrowed),
        // Never present after planning; undefined rather than a panic if it ever were.
        ExprKind::AggCall(..) => None,
    }
}

fn array<'a>(items: &'a [Expr], env: Env<'a>) -> Val<'a> {
    // Undefined elements are dropped, as in Cosmos DB.
    let vals = items.iter().filter_map(|i| eval(i, env)).map(Cow::into_owned).collect();
    Some(Cow::Owned(Value::Array(vals)))
}

fn object<'a>(members: &'a [(String, Expr)], env: Env<'a>) -> Val<'a> {
    let mut m = Map::new();
    for (k, v) in members {
        if let Some(v) = eval(v, env) {
            m.insert(k.clone(), v.into_owned());
        }
    }
    Some(Cow::Owned(Value::Object(m)))
}

fn unary<'a>(op: UnOp, v: Val<'_>) -> Val<'a> {
    match op {
        UnOp::Not => boolean(as_bool(&v).map(|b| !b)),
        UnOp::Plus => owned(v.as_deref().and_then(Num::of).and_then(Num::value)),
        UnOp::Neg => {
            let n = v.as_deref().and_then(Num::of);
            owned(n.and_then(|n| num::arith(num::ArithOp::Sub, Num::I(0), n)).and_then(Num::value))
        }
    }
}

fn arith<'a>(first: &'a Expr, rest: &'a [(num::ArithOp, Expr)], env: Env<'a>) -> Val<'a> {
    let mut acc = eval(first, env).as_deref().and_then(Num::of);
    for (op, e) in rest {
        let rhs = eval(e, env).as_deref().and_then(Num::of);
        acc = match (acc, rhs) {
            (Some(a), Some(b)) => num::arith(*op, a, b),
            _ => None,
        };
    }
    owned(acc.and_then(Num::value))
}

/// A comparison's operand: paths ask the document for a primitive directly (no `Value` built).
fn operand<'a>(e: &'a Expr, env: Env<'a>) -> Option<Scalar<'a>> {
    match &e.kind {
        ExprKind::Path(segs) => env.doc?.scalar(segs),
        ExprKind::Const(v) => Scalar::borrowed(v),
        _ => eval(e, env).and_then(Scalar::of),
    }
}

fn cmp<'a>(op: CmpOp, a: Option<Scalar<'_>>, b: Option<Scalar<'_>>) -> Val<'a> {
    let ord = match (a, b) {
        (Some(a), Some(b)) => a.compare(&b),
        _ => None,
    };
    boolean(ord.map(|o| match op {
        CmpOp::Eq => o == Ordering::Equal,
        CmpOp::Ne => o != Ordering::Equal,
        CmpOp::Lt => o == Ordering::Less,
        CmpOp::Gt => o == Ordering::Greater,
        CmpOp::Le => o != Ordering::Greater,
        CmpOp::Ge => o != Ordering::Less,
    }))
}

fn in_array<'a>(negated: bool, l: Val<'_>, r: Val<'_>) -> Val<'a> {
    let found = match (l.as_deref(), r.as_deref()) {
        (Some(l), Some(Value::Array(items))) if is_primitive(l) => {
            Some(items.iter().any(|i| compare(l, i) == Some(Ordering::Equal)))
        }
        _ => None,
    };
    boolean(found.map(|f| f != negated))
}

/// Three-valued AND: false wins over undefined; stops at the first false.
fn and<'a>(all: &'a [Expr], env: Env<'a>) -> Val<'a> {
    let mut result = Some(true);
    for x in all {
        match as_bool(&eval(x, env)) {
            Some(false) => return boolean(Some(false)),
            Some(true) => {}
            None => result = None,
        }
    }
    boolean(result)
}

/// Three-valued OR: true wins over undefined; stops at the first true.
fn or<'a>(all: &'a [Expr], env: Env<'a>) -> Val<'a> {
    let mut result = Some(false);
    for x in all {
        match as_bool(&eval(x, env)) {
            Some(true) => return boolean(Some(true)),
            Some(false) => {}
            None => result = None,
        }
    }
    boolean(result)
}

fn call<'a>(f: super::ast::Func, args: &'a [Expr], env: Env<'a>) -> Val<'a> {
    let vals: Vec<Val<'a>> = args.iter().map(|a| eval(a, env)).collect();
    functions::call(f, vals)
}

#[cfg(test)]
mod tests {
    use super::super::parser::parse_condition;
    use super::*;
    use serde_json::json;

    fn ev(cond: &str, doc: &Value) -> Option<Value> {
        let e = parse_condition(cond).unwrap();
        eval(&e, Env::doc(doc)).map(Cow::into_owned)
    }

    #[test]
    fn three_valued_logic() {
        let d = json!({"a": 1, "s": "x", "n": null, "o": {"k": 1}});
        assert_eq!(ev("a = 1", &d), Some(json!(true)));
        assert_eq!(ev("missing = 1", &d), None);
        assert_eq!(ev("NOT missing = 1", &d), None);
        assert_eq!(ev("missing = 1 AND false", &d), Some(json!(false)));
        assert_eq!(ev("missing = 1 AND true", &d), None);
        assert_eq!(ev("missing = 1 OR true", &d), Some(json!(true)));
        assert_eq!(ev("missing = 1 OR false", &d), None);
        assert_eq!(ev("a = 'x'", &d), None, "mixed types are undefined");
        assert_eq!(ev("a != 'x'", &d), None);
        assert_eq!(ev("n = null", &d), Some(json!(true)));
        assert_eq!(ev("s = null", &d), None);
        assert_eq!(ev("o = o", &d), None, "objects do not compare");
        assert_eq!(ev("1.0 = 1", &d), Some(json!(true)));
        assert_eq!(ev("'B' < 'a'", &d), Some(json!(true)), "ordinal");
        assert_eq!(ev("'\\uFF61' < '\\uD83D\\uDE00'", &d), Some(json!(false)), "UTF-16 order");
    }

    #[test]
    fn in_and_arithmetic() {
        let d = json!({"a": 3, "s": "x"});
        assert_eq!(ev("a IN [1, 2, 3]", &d), Some(json!(true)));
        assert_eq!(ev("a NIN [1, 2, 3]", &d), Some(json!(false)));
        assert_eq!(ev("missing NIN [1]", &d), None);
        assert_eq!(ev("a IN ['3']", &d), Some(json!(false)));
        assert_eq!(ev("a IN [a - 1, a]", &d), Some(json!(true)));
        assert_eq!(ev("a * 2 + 1 - 7 / 2", &d), Some(json!(3.5)));
        assert_eq!(ev("a % 2", &d), Some(json!(1)));
        assert_eq!(ev("-a", &d), Some(json!(-3)));
        assert_eq!(ev("s + 1", &d), None);
        assert_eq!(ev("a / 0", &d), None);
    }

    #[test]
    fn case_insensitive_members() {
        let d = json!({"deviceId": "d1", "Tags": {"X": 1, "x": 2}});
        assert_eq!(ev("DEVICEID", &d), Some(json!("d1")));
        assert_eq!(ev("tags.x", &d), Some(json!(2)), "exact match wins");
        assert_eq!(ev("tags.X", &d), Some(json!(1)));
    }
}
