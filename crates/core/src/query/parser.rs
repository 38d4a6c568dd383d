//! Recursive-descent parser.
//!
//! ```text
//! query      := SELECT [TOP int] ( '*' | item (',' item)* ) FROM collection [[AS] alias]
//!               [WHERE expr] [GROUP BY expr (',' expr)*]
//! item       := expr [AS name]
//! collection := devices | devices.modules | devices.jobs
//! expr       := and (OR and)*
//! and        := not (AND not)*
//! not        := NOT not | cmp
//! cmp        := add [ (= | != | <> | < | > | <= | >=) add | [NOT] IN list | NIN list ]
//! list       := '(' expr (',' expr)* ')' | add            -- usually an array literal
//! add        := mul (('+' | '-') mul)*
//! mul        := unary (('*' | '/' | '%') unary)*
//! unary      := ('-' | '+') unary | primary
//! primary    := number | string | true | false | null | undefined | '(' expr ')'
//!             | '[' [expr (',' expr)*] ']' | '{' [key ':' expr (',' ...)*] '}'
//!             | name '(' [expr (',' expr)*] ')' | path
//! path       := name ( '.' name | '[' (string | int) ']' | [[name]] )*
//! ```
//!
//! Comparisons do not chain (`a = b = c` is an error), AND/OR and arithmetic runs are kept flat, and
//! every nesting construct counts against [`MAX_NESTING`], so the tree depth (and with it every later
//! recursive walk) is bounded whatever the input.

use serde_json::Value;

use super::ast::*;
use super::error::{QueryError, MAX_NESTING, MAX_QUERY_CHARS};
use super::lexer::{lex, Tok, Token};
use super::num::{ArithOp, Num};

/// Words that cannot start a path (they would be ambiguous); `[[word]]` still reaches such a property.
const RESERVED: &[&str] = &[
    "SELECT",
    "TOP",
    "FROM",
    "WHERE",
    "GROUP",
    "BY",
    "AS",
    "AND",
    "OR",
    "NOT",
    "IN",
    "NIN",
    "TRUE",
    "FALSE",
    "NULL",
    "UNDEFINED",
];

fn is_reserved(s: &str) -> bool {
    RESERVED.iter().any(|r| r.eq_ignore_ascii_case(s))
}

pub(crate) fn check_length(text: &str) -> Result<(), QueryError> {
    if text.chars().nth(MAX_QUERY_CHARS).is_some() {
        return Err(QueryError::new(
            MAX_QUERY_CHARS + 1,
            format!("query is longer than the maximum of {MAX_QUERY_CHARS} characters"),
        ));
    }
    Ok(())
}

/// A full `SELECT ... FROM ...` query, with collection prefixes removed from paths and output names
/// assigned (but aggregates not yet planned).
pub(crate) fn parse_query(text: &str) -> Result<Ast, QueryError> {
    check_length(text)?;
    let mut p = Parser::new(lex(text)?);
    p.expect_kw("SELECT")?;
    let top = if p.eat_kw("TOP") { Some(p.top_count()?) } else { None };
    let select = p.select_list()?;
    p.expect_kw("FROM")?;
    let (collection, alias) = p.collection_clause()?;
    let filter = if p.eat_kw("WHERE") { Some(p.expr()?) } else { None };
    let group_pos = p.peek().pos;
    let mut group_by = Vec::new();
    if p.eat_kw("GROUP") {
        p.expect_kw("BY")?;
        group_by.push(p.expr()?);
        while p.eat(&Tok::Comma) {
            group_by.push(p.expr()?);
        }
    }
    p.expect_end()?;

    let prefixes = prefixes(collection, alias.as_deref());
    let mut ast = Ast { top, select, collection, filter, group_by, group_pos };
    if let Select::Items(items) = &mut ast.select {
        for item in items.iter_mut() {
            strip_prefixes(&mut item.expr, &prefixes);
        }
        name_items(items)?;
    }
    if let Some(f) = &mut ast.filter {
        strip_prefixes(f, &prefixes);
    }
    for g in &mut ast.group_by {
        strip_prefixes(g, &prefixes);
    }
    Ok(ast)
}

/// A bare condition (a Jobs v2 `queryCondition`): the body of a WHERE clause over `devices`.
pub(crate) fn parse_condition(text: &str) -> Result<Expr, QueryError> {
    check_length(text)?;
    let mut p = Parser::new(lex(text)?);
    let mut e = p.expr()?;
    p.expect_end()?;
    strip_prefixes(&mut e, &prefixes(Collection::Devices, None));
    Ok(e)
}

struct Parser {
    toks: Vec<Token>,
    i: usize,
    depth: usize,
}

impl Parser {
    fn new(toks: Vec<Token>) -> Parser {
        Parser { toks, i: 0, depth: 0 }
    }

    fn peek(&self) -> &Token {
        self.peek_at(0)
    }

    /// Token `ahead` positions on; the final `Eof` repeats forever, so this never fails.
    fn peek_at(&self, ahead: usize) -> &Token {
        static EOF: Token = Token { tok: Tok::Eof, pos: 1, text: String::new() };
        let last = self.toks.last().unwrap_or(&EOF);
        self.toks.get(self.i + ahead).unwrap_or(last)
    }

    fn bump(&mut self) {
        if self.i < self.toks.len() {
            self.i += 1;
        }
    }

    fn eat(&mut self, tok: &Tok) -> bool {
        if &self.peek().tok == tok {
            self.bump();
            return true;
        }
        false
    }

    fn eat_kw(&mut self, kw: &str) -> bool {
        if self.peek().is_kw(kw) {
            self.bump();
            return true;
        }
        false
    }

    fn err_expected(&self, what: &str) -> QueryError {
        let t = self.peek();
        QueryError::new(t.pos, format!("expected {what}, found {}", t.describe()))
    }

    fn expect_kw(&mut self, kw: &str) -> Result<(), QueryError> {
        if self.eat_kw(kw) {
            return Ok(());
        }
        Err(self.err_expected(kw))
    }

    fn expect(&mut self, tok: Tok, what: &str) -> Result<(), QueryError> {
        if self.eat(&tok) {
            return Ok(());
        }
        Err(self.err_expected(what))
    }

    fn expect_end(&mut self) -> Result<(), QueryError> {
        if self.peek().tok == Tok::Eof {
            return Ok(());
        }
        Err(self.err_expected("end of query"))
    }

    /// Enter one nesting level; see [`MAX_NESTING`].
    fn enter(&mut self, pos: usize) -> Result<(), QueryError> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err(QueryError::new(pos, format!("expression nested more than {MAX_NESTING} levels deep")));
        }
        Ok(())
    }

    fn top_count(&mut self) -> Result<u64, QueryError> {
        let t = self.peek().clone();
        if let Tok::Num(v) = &t.tok {
            if let Some(n) = v.as_u64() {
                self.bump();
                return Ok(n);
            }
        }
        Err(QueryError::new(t.pos, format!("expected a non-negative integer after TOP, found {}", t.describe())))
    }

    fn select_list(&mut self) -> Result<Select, QueryError> {
        if self.eat(&Tok::Star) {
            return Ok(Select::Star);
        }
        let mut items = Vec::new();
        loop {
            let expr = self.expr()?;
            let name = if self.eat_kw("AS") {
                OutName::Alias(self.name("an alias after AS")?)
            } else {
                OutName::Positional(String::new()) // assigned by `name_items`
            };
            items.push(SelectItem { expr, name });
            if !self.eat(&Tok::Comma) {
                break;
            }
        }
        Ok(Select::Items(items))
    }

    /// An identifier (not reserved) or `[[quoted]]` name.
    fn name(&mut self, what: &str) -> Result<String, QueryError> {
        match &self.peek().tok {
            Tok::Ident(s) if !is_reserved(s) => {
                let s = s.clone();
                self.bump();
                Ok(s)
            }
            Tok::Quoted(s) => {
                let s = s.clone();
                self.bump();
                Ok(s)
            }
            _ => Err(self.err_expected(what)),
        }
    }

    fn collection_clause(&mut self) -> Result<(Collection, Option<String>), QueryError> {
        const WHAT: &str = "devices, devices.modules or devices.jobs";
        if !self.peek().is_kw("devices") {
            return Err(self.err_expected(WHAT));
        }
        self.bump();
        let mut collection = Collection::Devices;
        if self.peek().tok == Tok::Dot {
            let sub = self.peek_at(1);
            collection = if sub.is_kw("modules") {
                Collection::Modules
            } else if sub.is_kw("jobs") {
                Collection::Jobs
            } else {
                let sub = sub.clone();
                return Err(QueryError::new(sub.pos, format!("expected modules or jobs, found {}", sub.describe())));
            };
            self.bump();
            self.bump();
        }
        let alias = if self.eat_kw("AS") {
            Some(self.name("an alias after AS")?)
        } else if matches!(&self.peek().tok, Tok::Ident(s) if !is_reserved(s)) {
            Some(self.name("an alias")?)
        } else {
            None
        };
        Ok((collection, alias))
    }

    /// A full expression; one nesting level (see [`MAX_NESTING`]).
    fn expr(&mut self) -> Result<Expr, QueryError> {
        let pos = self.peek().pos;
        self.enter(pos)?;
        let e = self.binary(PREC_OR);
        self.depth -= 1;
        e
    }

    /// Precedence climbing over the binary operators. A Pratt loop rather than one function per
    /// precedence level keeps the recursion to a few frames per nesting level (unoptimized builds
    /// have large frames, and queries run on 2 MiB tokio stacks).
    fn binary(&mut self, min_prec: u8) -> Result<Expr, QueryError> {
        let mut lhs = self.prefix(min_prec)?;
        // Comparisons do not chain: after one, a second comparison operator ends this expression
        // (and is then reported as unexpected by the caller).
        let mut compared = false;
        while let Some(op) = self.binop() {
            let prec = op.prec();
            if prec < min_prec || (prec == PREC_CMP && compared) {
                break;
            }
            for _ in 0..op.tokens() {
                self.bump();
            }
            let rhs = match op {
                BinOp::In { .. } => self.in_list()?,
                BinOp::Cmp(_) => self.binary(PREC_ADD)?,
                _ => self.binary(prec + 1)?,
            };
            compared |= prec == PREC_CMP;
            lhs = combine(op, lhs, rhs);
        }
        Ok(lhs)
    }

    /// The binary operator at the current token, if any.
    fn binop(&self) -> Option<BinOp> {
        let t = self.peek();
        let op = match &t.tok {
            Tok::Eq => BinOp::Cmp(CmpOp::Eq),
            Tok::Ne => BinOp::Cmp(CmpOp::Ne),
            Tok::Lt => BinOp::Cmp(CmpOp::Lt),
            Tok::Gt => BinOp::Cmp(CmpOp::Gt),
            Tok::Le => BinOp::Cmp(CmpOp::Le),
            Tok::Ge => BinOp::Cmp(CmpOp::Ge),
            Tok::Plus => BinOp::Arith(ArithOp::Add),
            Tok::Minus => BinOp::Arith(ArithOp::Sub),
            Tok::Star => BinOp::Arith(ArithOp::Mul),
            Tok::Slash => BinOp::Arith(ArithOp::Div),
            Tok::Percent => BinOp::Arith(ArithOp::Rem),
            Tok::Ident(_) if t.is_kw("OR") => BinOp::Or,
            Tok::Ident(_) if t.is_kw("AND") => BinOp::And,
            Tok::Ident(_) if t.is_kw("IN") => BinOp::In { negated: false, tokens: 1 },
            Tok::Ident(_) if t.is_kw("NIN") => BinOp::In { negated: true, tokens: 1 },
            Tok::Ident(_) if t.is_kw("NOT") && self.peek_at(1).is_kw("IN") => BinOp::In { negated: true, tokens: 2 },
            _ => return None,
        };
        Some(op)
    }

    /// Prefix operators, then a primary. `NOT` binds looser than comparisons (`NOT a = 1` is
    /// `NOT (a = 1)`) and is only accepted where a condition may start.
    fn prefix(&mut self, min_prec: u8) -> Result<Expr, QueryError> {
        let t = self.peek();
        let pos = t.pos;
        let op = match &t.tok {
            Tok::Minus => UnOp::Neg,
            Tok::Plus => UnOp::Plus,
            Tok::Ident(_) if t.is_kw("NOT") && min_prec <= PREC_CMP => UnOp::Not,
            _ => return self.primary(),
        };
        self.bump();
        self.enter(pos)?;
        let inner = if op == UnOp::Not { self.binary(PREC_CMP) } else { self.prefix(PREC_UNARY) };
        self.depth -= 1;
        Ok(unary(op, inner?, pos))
    }

    /// Right side of IN/NIN: an array expression, or a parenthesised list (SQL style).
    fn in_list(&mut self) -> Result<Expr, QueryError> {
        if self.peek().tok != Tok::LParen {
            return self.binary(PREC_ADD);
        }
        let pos = self.peek().pos;
        self.bump();
        let items = self.expr_list(Tok::RParen, "',' or ')'")?;
        Ok(array(items, pos))
    }

    /// Comma-separated expressions up to `close` (consumed); empty lists allowed.
    fn expr_list(&mut self, close: Tok, what: &str) -> Result<Vec<Expr>, QueryError> {
        let mut items = Vec::new();
        if self.eat(&close) {
            return Ok(items);
        }
        loop {
            items.push(self.expr()?);
            if self.eat(&close) {
                return Ok(items);
            }
            self.expect(Tok::Comma, what)?;
        }
    }

    /// Bracketing constructs and calls (the recursive cases) here; leaves in [`Parser::atom`], so
    /// the frame that recurses stays small.
    fn primary(&mut self) -> Result<Expr, QueryError> {
        let pos = self.peek().pos;
        // Elements, members and arguments are parsed with `expr`, which counts the nesting.
        match &self.peek().tok {
            Tok::LParen => {
                self.bump();
                let e = self.expr()?;
                self.expect(Tok::RParen, "')'")?;
                Ok(e)
            }
            Tok::LBracket => {
                self.bump();
                let items = self.expr_list(Tok::RBracket, "',' or ']'")?;
                Ok(array(items, pos))
            }
            Tok::LBrace => {
                self.bump();
                let members = self.object_members()?;
                Ok(Expr::new(ExprKind::Object(members), pos))
            }
            Tok::Ident(s) if !is_reserved(s) && self.peek_at(1).tok == Tok::LParen => self.call(),
            _ => self.atom(),
        }
    }

    /// A literal or a path.
    #[inline(never)]
    fn atom(&mut self) -> Result<Expr, QueryError> {
        let t = self.peek();
        let pos = t.pos;
        let kind = match &t.tok {
            Tok::Num(v) => ExprKind::Const(v.clone()),
            Tok::Str(s) => ExprKind::Const(Value::String(s.clone())),
            Tok::Quoted(_) => return self.path(),
            Tok::Ident(_) if t.is_kw("TRUE") => ExprKind::Const(Value::Bool(true)),
            Tok::Ident(_) if t.is_kw("FALSE") => ExprKind::Const(Value::Bool(false)),
            Tok::Ident(_) if t.is_kw("NULL") => ExprKind::Const(Value::Null),
            Tok::Ident(_) if t.is_kw("UNDEFINED") => ExprKind::Undefined,
            Tok::Ident(s) if !is_reserved(s) => return self.path(),
            _ => return Err(self.err_expected("an expression")),
        };
        self.bump();
        Ok(Expr::new(kind, pos))
    }

    fn object_members(&mut self) -> Result<Vec<(String, Expr)>, QueryError> {
        let mut members: Vec<(String, Expr)> = Vec::new();
        if self.eat(&Tok::RBrace) {
            return Ok(members);
        }
        loop {
            let key = match &self.peek().tok {
                Tok::Ident(s) | Tok::Str(s) | Tok::Quoted(s) => s.clone(),
                _ => return Err(self.err_expected("a member name")),
            };
            self.bump();
            self.expect(Tok::Colon, "':'")?;
            let value = self.expr()?;
            members.retain(|(k, _)| k != &key);
            members.push((key, value));
            if self.eat(&Tok::RBrace) {
                return Ok(members);
            }
            self.expect(Tok::Comma, "',' or '}'")?;
        }
    }

    fn call(&mut self) -> Result<Expr, QueryError> {
        let pos = self.peek().pos;
        let name = self.peek().text.clone();
        self.bump(); // name
        self.bump(); // '('
        let args = self.expr_list(Tok::RParen, "',' or ')'")?;
        make_call(&name, pos, args)
    }

    fn path(&mut self) -> Result<Expr, QueryError> {
        let pos = self.peek().pos;
        let mut segs = match &self.peek().tok {
            Tok::Ident(s) | Tok::Quoted(s) => vec![Seg::Key(s.clone())],
            _ => return Err(self.err_expected("a property name")),
        };
        self.bump();
        loop {
            match &self.peek().tok {
                Tok::Dot => {
                    self.bump();
                    match &self.peek().tok {
                        Tok::Ident(s) | Tok::Quoted(s) => {
                            segs.push(Seg::Key(s.clone()));
                            self.bump();
                        }
                        _ => return Err(self.err_expected("a property name after '.'")),
                    }
                }
                Tok::Quoted(s) => {
                    segs.push(Seg::Key(s.clone()));
                    self.bump();
                }
                Tok::LBracket => {
                    self.bump();
                    let seg = match &self.peek().tok {
                        Tok::Str(s) => Seg::Key(s.clone()),
                        Tok::Num(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                            Some(n) => Seg::Index(n),
                            None => return Err(self.err_expected("a property name or array index")),
                        },
                        _ => return Err(self.err_expected("a property name or array index")),
                    };
                    self.bump();
                    self.expect(Tok::RBracket, "']'")?;
                    segs.push(seg);
                }
                _ => break,
            }
        }
        Ok(Expr::new(ExprKind::Path(segs), pos))
    }
}

/// A function call node from its name and parsed arguments (kept out of the recursive
/// [`Parser::call`] so that frame stays small).
fn make_call(name: &str, pos: usize, mut args: Vec<Expr>) -> Result<Expr, QueryError> {
    if let Some(agg) = AggFunc::by_name(name) {
        let arg = match (agg, args.len()) {
            (AggFunc::Count, 0) => None,
            (_, 1) => args.pop().map(Box::new),
            (AggFunc::Count, _) => {
                return Err(QueryError::new(pos, format!("{} takes zero or one argument", name.to_uppercase())))
            }
            _ => return Err(QueryError::new(pos, format!("{} takes exactly one argument", name.to_uppercase()))),
        };
        return Ok(Expr::new(ExprKind::AggCall(agg, arg), pos));
    }
    let Some(func) = Func::by_name(name) else {
        return Err(QueryError::new(pos, format!("unknown function '{name}'")));
    };
    let (lo, hi) = func.arity();
    if args.len() < lo || args.len() > hi {
        let expect = if lo == hi { format!("{lo}") } else { format!("{lo} to {hi}") };
        return Err(QueryError::new(
            pos,
            format!("{} takes {expect} argument(s), got {}", name.to_uppercase(), args.len()),
        ));
    }
    Ok(Expr::new(ExprKind::Call(func, args), pos))
}

const PREC_OR: u8 = 1;
const PREC_AND: u8 = 2;
const PREC_CMP: u8 = 3;
const PREC_ADD: u8 = 4;
const PREC_MUL: u8 = 5;
const PREC_UNARY: u8 = 6;

#[derive(Debug, Clone, Copy, PartialEq)]
enum BinOp {
    Or,
    And,
    Cmp(CmpOp),
    /// `IN`, `NIN` or `NOT IN` (`tokens` = how many tokens the operator spans).
    In {
        negated: bool,
        tokens: usize,
    },
    Arith(ArithOp),
}

impl BinOp {
    fn tokens(self) -> usize {
        match self {
            BinOp::In { tokens, .. } => tokens,
            _ => 1,
        }
    }

    fn prec(self) -> u8 {
        match self {
            BinOp::Or => PREC_OR,
            BinOp::And => PREC_AND,
            BinOp::Cmp(_) | BinOp::In { .. } => PREC_CMP,
            BinOp::Arith(ArithOp::Add | ArithOp::Sub) => PREC_ADD,
            BinOp::Arith(_) => PREC_MUL,
        }
    }
}

/// `lhs op rhs` as a node.
fn combine(op: BinOp, lhs: Expr, rhs: Expr) -> Expr {
    let pos = lhs.pos;
    match op {
        BinOp::Or | BinOp::And => nary(op, lhs, rhs),
        BinOp::Arith(a) => arith(lhs, a, rhs),
        BinOp::Cmp(c) => Expr::new(ExprKind::Cmp(c, Box::new(lhs), Box::new(rhs)), pos),
        BinOp::In { negated, .. } => Expr::new(ExprKind::In { negated, lhs: Box::new(lhs), rhs: Box::new(rhs) }, pos),
    }
}

/// A prefix operator node; `-5` / `+5` fold into constants so negative numbers in IN lists keep
/// the list a constant array.
fn unary(op: UnOp, inner: Expr, pos: usize) -> Expr {
    if op != UnOp::Not {
        if let Some(n) = match &inner.kind {
            ExprKind::Const(v) => Num::of(v),
            _ => None,
        } {
            let folded = match op {
                UnOp::Neg => super::num::arith(ArithOp::Sub, Num::I(0), n).and_then(Num::value),
                _ => n.value(),
            };
            if let Some(v) = folded {
                return Expr::new(ExprKind::Const(v), pos);
            }
        }
    }
    Expr::new(ExprKind::Unary(op, Box::new(inner)), pos)
}

fn arith_prec(op: ArithOp) -> u8 {
    BinOp::Arith(op).prec()
}

/// `lhs AND rhs` / `lhs OR rhs`, appending to `lhs` if it already is that n-ary node (AND and OR
/// are associative, also three-valued), so long chains stay one flat node.
fn nary(op: BinOp, lhs: Expr, rhs: Expr) -> Expr {
    let pos = lhs.pos;
    match (op, lhs.kind) {
        (BinOp::Or, ExprKind::Or(mut all)) | (BinOp::And, ExprKind::And(mut all)) => {
            all.push(rhs);
            Expr::new(if op == BinOp::Or { ExprKind::Or(all) } else { ExprKind::And(all) }, pos)
        }
        (_, kind) => {
            let all = vec![Expr::new(kind, pos), rhs];
            Expr::new(if op == BinOp::Or { ExprKind::Or(all) } else { ExprKind::And(all) }, pos)
        }
    }
}

/// `lhs op rhs` for arithmetic, appending to a left operand of the same precedence (evaluation is
/// left to right, so `(a - b) - c` and `a - b - c` are the same run).
fn arith(lhs: Expr, op: ArithOp, rhs: Expr) -> Expr {
    let pos = lhs.pos;
    match lhs.kind {
        ExprKind::Arith(first, mut rest) if rest.first().is_some_and(|(o, _)| arith_prec(*o) == arith_prec(op)) => {
            rest.push((op, rhs));
            Expr::new(ExprKind::Arith(first, rest), pos)
        }
        kind => Expr::new(ExprKind::Arith(Box::new(Expr::new(kind, pos)), vec![(op, rhs)]), pos),
    }
}

/// An array expression; all-constant arrays become one constant (no per-row allocation).
fn array(items: Vec<Expr>, pos: usize) -> Expr {
    if items.iter().all(|e| matches!(e.kind, ExprKind::Const(_))) {
        let values = items
            .into_iter()
            .filter_map(|e| match e.kind {
                ExprKind::Const(v) => Some(v),
                _ => None,
            })
            .collect();
        return Expr::new(ExprKind::Const(Value::Array(values)), pos);
    }
    Expr::new(ExprKind::Array(items), pos)
}

/// Path prefixes that name the document itself: the collection name and the alias, longest first.
fn prefixes(collection: Collection, alias: Option<&str>) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = vec![collection.name().split('.').map(str::to_string).collect()];
    if let Some(a) = alias {
        out.push(vec![a.to_string()]);
    }
    out.sort_by_key(|p| std::cmp::Reverse(p.len()));
    out
}

/// `devices.tags.x` / `d.tags.x` → `tags.x`; a bare `devices` or alias → the whole document.
fn strip_prefixes(e: &mut Expr, prefixes: &[Vec<String>]) {
    if let ExprKind::Path(segs) = &mut e.kind {
        for p in prefixes {
            let matches = segs.len() >= p.len()
                && p.iter().zip(segs.iter()).all(|(a, s)| matches!(s, Seg::Key(k) if k.eq_ignore_ascii_case(a)));
            if matches {
                if segs.len() == p.len() {
                    e.kind = ExprKind::Root;
                } else {
                    segs.drain(..p.len());
                }
                return;
            }
        }
        return;
    }
    for c in e.children_mut() {
        strip_prefixes(c, prefixes);
    }
}

/// Output names for un-aliased items, then a duplicate check (case-insensitive, because leaf names
/// take the document's spelling at run time).
fn name_items(items: &mut [SelectItem]) -> Result<(), QueryError> {
    let mut positional = 0usize;
    for item in items.iter_mut() {
        if !matches!(item.name, OutName::Alias(_)) {
            item.name = match &item.expr.kind {
                ExprKind::Path(segs) => match segs.last() {
                    Some(Seg::Key(k)) => OutName::Leaf(k.clone()),
                    _ => {
                        positional += 1;
                        OutName::Positional(format!("${positional}"))
                    }
                },
                _ => {
                    positional += 1;
                    OutName::Positional(format!("${positional}"))
                }
            };
        }
    }
    for (i, item) in items.iter().enumerate() {
        let name = item.name.as_str();
        if items.iter().take(i).any(|o| o.name.as_str().eq_ignore_ascii_case(name)) {
            return Err(QueryError::new(
                item.expr.pos,
                format!("duplicate output name '{name}' in SELECT; use AS to rename"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(q: &str) -> QueryError {
        parse_query(q).unwrap_err()
    }

    #[test]
    fn basic_shapes() {
        let a = parse_query("select top 5 * from DEVICES.Modules m where m.tags.x = 1").unwrap();
        assert_eq!(a.top, Some(5));
        assert_eq!(a.collection, Collection::Modules);
        assert_eq!(a.select, Select::Star);
        let f = a.filter.unwrap();
        let ExprKind::Cmp(CmpOp::Eq, l, _) = f.kind else { panic!() };
        assert_eq!(l.kind, ExprKind::Path(vec![Seg::Key("tags".into()), Seg::Key("x".into())]));
    }

    #[test]
    fn error_positions() {
        let e = err("SELECT * WHERE x = 1");
        assert_eq!(e.position, 10);
        assert_eq!(e.to_string(), "syntax error at position 10: expected FROM, found 'WHERE'");
        assert_eq!(err("SELECT * FROM devices WHERE").position, 28);
        assert_eq!(
            err("SELECT * FROM things").message,
            "expected devices, devices.modules or devices.jobs, found 'things'"
        );
        assert_eq!(err("SELECT * FROM devices WHERE a = b = c").position, 35);
        assert_eq!(err("SELECT * FROM devices WHERE foo(1)").message, "unknown function 'foo'");
        assert_eq!(err("SELECT TOP -1 * FROM devices").position, 12);
        assert_eq!(err("SELECT * FROM devices WHERE is_defined(a, b)").position, 29);
    }

    #[test]
    fn names() {
        let a = parse_query(
            "SELECT deviceId, properties.reported.x, COUNT() , 1+1 AS two, devices.tags['a b'] FROM devices",
        )
        .unwrap();
        let Select::Items(items) = a.select else { panic!() };
        let names: Vec<&str> = items.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["deviceId", "x", "$1", "two", "a b"]);
        assert!(err("SELECT tags.x, properties.reported.X FROM devices").message.contains("duplicate"));
    }

    #[test]
    fn nesting_is_bounded() {
        let ok = format!("SELECT * FROM devices WHERE {}1{} = 1", "(".repeat(63), ")".repeat(63));
        assert!(parse_query(&ok).is_ok());
        let deep = format!("SELECT * FROM devices WHERE {}1{} = 1", "(".repeat(64), ")".repeat(64));
        assert!(err(&deep).message.contains("nested"));
        let nots = format!("SELECT * FROM devices WHERE {} true", "NOT ".repeat(100));
        assert!(err(&nots).message.contains("nested"));
        let long_or = format!("SELECT * FROM devices WHERE {}", vec!["deviceId = 'x'"; 300].join(" OR "));
        assert!(parse_query(&long_or).is_ok());
    }

    #[test]
    fn length_limit() {
        let base = "SELECT * FROM devices WHERE deviceId = ''";
        let fits = format!("SELECT * FROM devices WHERE deviceId = '{}'", "é".repeat(8192 - base.len()));
        assert_eq!(fits.chars().count(), 8192);
        assert!(parse_query(&fits).is_ok());
        let over = format!("SELECT * FROM devices WHERE deviceId = '{}'", "é".repeat(8193 - base.len()));
        assert_eq!(err(&over).position, 8193);
    }

    #[test]
    fn a_condition_leaves_room_for_the_query_it_runs_as() {
        let room = 8192 - crate::query::CONDITION_QUERY_PREFIX.len();
        let cond = |n: usize| format!("deviceId = '{}'", "é".repeat(n - "deviceId = ''".len()));
        let fits = crate::query::parse_condition(&cond(room)).map(|_| ());
        assert_eq!(fits, Ok(()));
        assert!(parse_query(&crate::query::condition_query(&cond(room))).is_ok());
        let e = crate::query::parse_condition(&cond(room + 1)).map(|_| ()).unwrap_err();
        assert_eq!(e.position, room + 1);
        assert!(e.message.contains(&format!("at most {room} characters")), "{}", e.message);
    }

    #[test]
    fn condition() {
        let e = parse_condition("devices.deviceId IN ['a', 'b'] AND NOT tags.x NIN [1, -2]").unwrap();
        assert!(matches!(e.kind, ExprKind::And(_)));
        assert!(parse_condition("").is_err());
        assert!(parse_condition("deviceId = 'a' GROUP BY x").is_err());
    }
}
