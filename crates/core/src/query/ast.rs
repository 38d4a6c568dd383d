//! Syntax tree. Every node keeps its source position so semantic errors (found after parsing, e.g. a
//! path missing from GROUP BY) can still point at the offending text.

use serde_json::Value;

use super::num::ArithOp;

/// The document collections a query can range over (`FROM ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collection {
    /// `devices`: device twins.
    Devices,
    /// `devices.modules`: module twins.
    Modules,
    /// `devices.jobs`: per-device job rows.
    Jobs,
}

impl Collection {
    /// The collection's name as written in queries; also the path prefix that may start a property
    /// reference (`devices.jobs.jobId`).
    pub fn name(self) -> &'static str {
        match self {
            Collection::Devices => "devices",
            Collection::Modules => "devices.modules",
            Collection::Jobs => "devices.jobs",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Expr {
    pub kind: ExprKind,
    /// 1-based character offset of the expression's first token.
    pub pos: usize,
}

/// One step of a property path.
#[derive(Debug, Clone, PartialEq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnOp {
    Neg,
    Plus,
    Not,
}

/// Aggregate functions of the SELECT list (the docs' grammar: count, avg, sum, min, max).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AggFunc {
    Count,
    Sum,
    Avg,
    Min,
    Max,
}

impl AggFunc {
    pub fn by_name(name: &str) -> Option<AggFunc> {
        let f = match name.to_ascii_uppercase().as_str() {
            "COUNT" => AggFunc::Count,
            "SUM" => AggFunc::Sum,
            "AVG" => AggFunc::Avg,
            "MIN" => AggFunc::Min,
            "MAX" => AggFunc::Max,
            _ => return None,
        };
        Some(f)
    }
}

/// Scalar functions: `IS_DEFINED` (the only one IoT Hub documents for twin queries) plus the routing
/// query functions, which are cheap and harmless to offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Func {
    IsDefined,
    IsNull,
    IsBool,
    IsNumber,
    IsString,
    IsObject,
    IsArray,
    IsPrimitive,
    StartsWith,
    EndsWith,
    Contains,
    IndexOf,
    Substring,
    Concat,
    Lower,
    Upper,
    Length,
    AsNumber,
    Abs,
    Ceiling,
    Floor,
    Sign,
    Sqrt,
    Exp,
    Power,
    Square,
}

impl Func {
    pub fn by_name(name: &str) -> Option<Func> {
        use Func::*;
        let f = match name.to_ascii_uppercase().as_str() {
            "IS_DEFINED" => IsDefined,
            "IS_NULL" => IsNull,
            "IS_BOOL" => IsBool,
            "IS_NUMBER" => IsNumber,
            "IS_STRING" => IsString,
            "IS_OBJECT" => IsObject,
            "IS_ARRAY" => IsArray,
            "IS_PRIMITIVE" => IsPrimitive,
            "STARTS_WITH" => StartsWith,
            "ENDS_WITH" => EndsWith,
            "CONTAINS" => Contains,
            "INDEX_OF" => IndexOf,
            "SUBSTRING" => Substring,
            "CONCAT" => Concat,
            "LOWER" => Lower,
            "UPPER" => Upper,
            "LENGTH" => Length,
            "AS_NUMBER" => AsNumber,
            "ABS" => Abs,
            "CEILING" => Ceiling,
            "FLOOR" => Floor,
            "SIGN" => Sign,
            "SQRT" => Sqrt,
            "EXP" => Exp,
            "POWER" => Power,
            "SQUARE" => Square,
            _ => return None,
        };
        Some(f)
    }

    /// Accepted argument counts (inclusive range).
    pub fn arity(self) -> (usize, usize) {
        use Func::*;
        match self {
            StartsWith | EndsWith | Contains | IndexOf | Power => (2, 2),
            Substring => (2, 3),
            Concat => (1, 64),
            _ => (1, 1),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ExprKind {
    /// A literal (arrays of literals are folded into one constant at parse time).
    Const(Value),
    Undefined,
    /// A property path relative to the document (collection prefix / alias already removed).
    Path(Vec<Seg>),
    /// The whole document (a path that is just the collection name or alias).
    Root,
    Array(Vec<Expr>),
    Object(Vec<(String, Expr)>),
    Unary(UnOp, Box<Expr>),
    /// Left-associative run of same-precedence arithmetic: `first op e1 op e2 ...`. Kept flat so long
    /// chains do not make a deep tree.
    Arith(Box<Expr>, Vec<(ArithOp, Expr)>),
    Cmp(CmpOp, Box<Expr>, Box<Expr>),
    In {
        negated: bool,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
    },
    /// Flat n-ary AND / OR (long generated `a OR b OR ...` chains stay shallow).
    And(Vec<Expr>),
    Or(Vec<Expr>),
    Call(Func, Vec<Expr>),
    /// An aggregate call as parsed; replaced by `AggRef` when the aggregate plan is built.
    AggCall(AggFunc, Option<Box<Expr>>),
    /// Result of the n-th aggregate of the plan (only in planned SELECT items).
    AggRef(usize),
    /// Value of the n-th GROUP BY expression (only in planned SELECT items).
    GroupKey(usize),
}

impl Expr {
    pub fn new(kind: ExprKind, pos: usize) -> Expr {
        Expr { kind, pos }
    }

    /// Direct children, for read-only walks.
    pub fn children(&self) -> Vec<&Expr> {
        match &self.kind {
            ExprKind::Const(_)
            | ExprKind::Undefined
            | ExprKind::Path(_)
            | ExprKind::Root
            | ExprKind::AggRef(_)
            | ExprKind::GroupKey(_) => Vec::new(),
            ExprKind::Array(v) | ExprKind::And(v) | ExprKind::Or(v) | ExprKind::Call(_, v) => v.iter().collect(),
            ExprKind::Object(m) => m.iter().map(|(_, e)| e).collect(),
            ExprKind::Unary(_, e) => vec![e],
            ExprKind::Arith(first, rest) => {
                let mut out = vec![&**first];
                out.extend(rest.iter().map(|(_, e)| e));
                out
            }
            ExprKind::Cmp(_, a, b) | ExprKind::In { lhs: a, rhs: b, .. } => vec![a, b],
            ExprKind::AggCall(_, arg) => arg.iter().map(|b| &**b).collect(),
        }
    }

    /// Direct children, for rewriting walks.
    pub fn children_mut(&mut self) -> Vec<&mut Expr> {
        match &mut self.kind {
            ExprKind::Const(_)
            | ExprKind::Undefined
            | ExprKind::Path(_)
            | ExprKind::Root
            | ExprKind::AggRef(_)
            | ExprKind::GroupKey(_) => Vec::new(),
            ExprKind::Array(v) | ExprKind::And(v) | ExprKind::Or(v) | ExprKind::Call(_, v) => v.iter_mut().collect(),
            ExprKind::Object(m) => m.iter_mut().map(|(_, e)| e).collect(),
            ExprKind::Unary(_, e) => vec![e],
            ExprKind::Arith(first, rest) => {
                let mut out = vec![&mut **first];
                out.extend(rest.iter_mut().map(|(_, e)| e));
                out
            }
            ExprKind::Cmp(_, a, b) | ExprKind::In { lhs: a, rhs: b, .. } => vec![a, b],
            ExprKind::AggCall(_, arg) => arg.iter_mut().map(|b| &mut **b).collect(),
        }
    }

    /// First node (pre-order) satisfying `pred`. Recursion depth is bounded by the parser's nesting
    /// limit.
    pub fn find(&self, pred: &dyn Fn(&Expr) -> bool) -> Option<&Expr> {
        if pred(self) {
            return Some(self);
        }
        self.children().into_iter().find_map(|c| c.find(pred))
    }

    /// Structural equality ignoring positions, with property names compared case-insensitively
    /// (property lookup is case-insensitive, see `eval`). Used to recognise a GROUP BY expression
    /// repeated in the SELECT list.
    pub fn same(&self, other: &Expr) -> bool {
        use ExprKind::*;
        match (&self.kind, &other.kind) {
            (Path(a), Path(b)) => {
                a.len() == b.len()
                    && a.iter().zip(b).all(|(x, y)| match (x, y) {
                        (Seg::Key(x), Seg::Key(y)) => x.eq_ignore_ascii_case(y),
                        (Seg::Index(x), Seg::Index(y)) => x == y,
                        _ => false,
                    })
            }
            (Const(a), Const(b)) => a == b,
            (Unary(o1, a), Unary(o2, b)) => o1 == o2 && a.same(b),
            (Arith(a, ra), Arith(b, rb)) => {
                a.same(b) && ra.len() == rb.len() && ra.iter().zip(rb).all(|((o1, x), (o2, y))| o1 == o2 && x.same(y))
            }
            (Cmp(o1, a1, b1), Cmp(o2, a2, b2)) => o1 == o2 && a1.same(a2) && b1.same(b2),
            (In { negated: n1, lhs: a1, rhs: b1 }, In { negated: n2, lhs: a2, rhs: b2 }) => {
                n1 == n2 && a1.same(a2) && b1.same(b2)
            }
            (Array(a), Array(b)) | (And(a), And(b)) | (Or(a), Or(b)) => all_same(a, b),
            (Call(f1, a), Call(f2, b)) => f1 == f2 && all_same(a, b),
            (Object(a), Object(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|((k1, x), (k2, y))| k1 == k2 && x.same(y))
            }
            (Undefined, Undefined) | (Root, Root) => true,
            _ => false,
        }
    }
}

fn all_same(a: &[Expr], b: &[Expr]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same(y))
}

/// How a SELECT item names its output member.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum OutName {
    /// `expr AS alias`.
    Alias(String),
    /// An un-aliased path: the last property name, as IoT Hub (like Cosmos DB) does
    /// (`properties.reported.x` → `"x"`). For row projections the document's own spelling of the key
    /// is used, so `SELECT DeviceId` yields `"deviceId"` as in the docs' example.
    Leaf(String),
    /// Anything else un-aliased: `$1`, `$2`, ... (Cosmos DB's convention).
    Positional(String),
}

impl OutName {
    pub fn as_str(&self) -> &str {
        match self {
            OutName::Alias(s) | OutName::Leaf(s) | OutName::Positional(s) => s,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SelectItem {
    pub expr: Expr,
    pub name: OutName,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Select {
    Star,
    Items(Vec<SelectItem>),
}

/// A parsed (but not yet planned) query.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ast {
    pub top: Option<u64>,
    pub select: Select,
    pub collection: Collection,
    pub filter: Option<Expr>,
    pub group_by: Vec<Expr>,
    /// Position of the GROUP keyword, for errors about the clause as a whole.
    pub group_pos: usize,
}
