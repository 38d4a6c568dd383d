//! The compiled query and condition types: the crate's entry points.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::aggregate::{self, AggPlan, Partial};
use super::ast::{Collection, Expr, ExprKind, OutName, Seg, Select, SelectItem};
use super::error::{CursorError, QueryError, MAX_QUERY_CHARS};
use super::eval::{eval, lookup, truthy, Document, Env};
use super::fields::Fields;
use super::page::{self, Cursor, Page, RowKey};
use super::parser;

/// A parsed, validated `SELECT` query. Cheap to clone (shared), `Send + Sync`: parse once per request
/// and hand it to every shard.
#[derive(Debug, Clone)]
pub struct Query {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    fingerprint: u64,
    collection: Collection,
    top: Option<u64>,
    select: Select,
    filter: Option<Expr>,
    plan: Option<Arc<AggPlan>>,
}

fn first_aggregate(e: &Expr) -> Option<&Expr> {
    e.find(&|x| matches!(x.kind, ExprKind::AggCall(..)))
}

/// Parses and validates a query (see the crate docs for the language).
pub fn parse(text: &str) -> Result<Query, QueryError> {
    let ast = parser::parse_query(text)?;
    if let Some(a) = ast.filter.as_ref().and_then(first_aggregate) {
        return Err(QueryError::new(a.pos, "aggregate functions are not allowed in WHERE"));
    }
    if let Some(a) = ast.group_by.iter().find_map(first_aggregate) {
        return Err(QueryError::new(a.pos, "aggregate functions are not allowed in GROUP BY"));
    }
    let has_aggregate = match &ast.select {
        Select::Star => false,
        Select::Items(items) => items.iter().any(|i| first_aggregate(&i.expr).is_some()),
    };
    let plan = match &ast.select {
        Select::Star if !ast.group_by.is_empty() => {
            return Err(QueryError::new(ast.group_pos, "SELECT * cannot be combined with GROUP BY"));
        }
        Select::Items(items) if has_aggregate || !ast.group_by.is_empty() => {
            Some(Arc::new(aggregate::plan(items, &ast.group_by, ast.filter.as_ref(), ast.top)?))
        }
        _ => None,
    };
    let inner = Inner {
        fingerprint: page::fingerprint(text),
        collection: ast.collection,
        top: ast.top,
        select: ast.select,
        filter: ast.filter,
        plan,
    };
    Ok(Query { inner: Arc::new(inner) })
}

/// The start of the query a condition runs as ([`condition_query`]).
pub const CONDITION_QUERY_PREFIX: &str = "SELECT deviceId FROM devices WHERE ";

/// The largest row a query may make (estimated JSON size): a whole twin at its limits, several times
/// over.
pub const MAX_ROW_BYTES: usize = 1 << 20;

/// The most the rows one shard gathers for one page may hold together (estimated JSON size): a
/// thousand twins at their limits fit; a query past it is refused with the advice to ask for fewer
/// rows a page.
pub const MAX_PAGE_BYTES: usize = 256 << 20;

/// The length of `v`'s JSON text, near enough (numbers are counted as 8 characters, escapes not at
/// all): what bounds a query's rows.
pub fn json_size(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) | Value::Number(_) => 8,
        Value::String(s) => s.len() + 2,
        Value::Array(items) => 2 + items.iter().map(|i| json_size(i) + 1).sum::<usize>(),
        Value::Object(m) => 2 + m.iter().map(|(k, v)| k.len() + 4 + json_size(v)).sum::<usize>(),
    }
}

/// The query that selects the devices a job's or a configuration's condition matches.
pub fn condition_query(condition: &str) -> String {
    format!("{CONDITION_QUERY_PREFIX}{condition}")
}

/// Parses a bare condition: a Jobs v2 `queryCondition` (the body of a WHERE clause over `devices`).
pub fn parse_condition(text: &str) -> Result<Condition, QueryError> {
    // A condition runs as part of a query (`condition_query`): it must leave that query within the limit.
    let room = MAX_QUERY_CHARS - CONDITION_QUERY_PREFIX.len();
    if text.chars().nth(room).is_some() {
        return Err(QueryError::new(
            room + 1,
            format!(
                "a condition may have at most {room} characters: it runs as `{CONDITION_QUERY_PREFIX}…`, \
                 a query of at most {MAX_QUERY_CHARS}"
            ),
        ));
    }
    let expr = parser::parse_condition(text)?;
    if let Some(a) = first_aggregate(&expr) {
        return Err(QueryError::new(a.pos, "aggregate functions are not allowed in a condition"));
    }
    Ok(Condition { expr: Arc::new(expr) })
}

/// A compiled job `queryCondition`.
#[derive(Debug, Clone)]
pub struct Condition {
    expr: Arc<Expr>,
}

impl Condition {
    /// Whether the device twin `doc` satisfies the condition (evaluates to exactly `true`).
    pub fn matches(&self, doc: &Value) -> bool {
        truthy(&self.expr, Env::doc(doc))
    }
}

impl Query {
    pub fn collection(&self) -> Collection {
        self.inner.collection
    }

    pub fn top(&self) -> Option<u64> {
        self.inner.top
    }

    /// Fingerprint of the query text, carried in continuation tokens.
    pub fn fingerprint(&self) -> u64 {
        self.inner.fingerprint
    }

    /// The `x-ms-item-type` response header: `twin` for `SELECT *` over devices or modules,
    /// `deviceJob` for `SELECT *` over devices.jobs, `raw` for projections and aggregates.
    pub fn item_type(&self) -> &'static str {
        match (&self.inner.select, self.inner.collection) {
            (Select::Star, Collection::Jobs) => "deviceJob",
            (Select::Star, _) => "twin",
            _ => "raw",
        }
    }

    /// Aggregate queries (an aggregate in SELECT, or GROUP BY) are answered through [`Query::partial`]
    /// and are not paged; all others through [`Query::project`] / paging.
    pub fn is_aggregate(&self) -> bool {
        self.inner.plan.is_some()
    }

    /// Whether `doc` passes the WHERE clause (always true without one).
    pub fn matches(&self, doc: &Value) -> bool {
        self.matches_doc(doc)
    }

    /// [`Query::matches`] for any [`Document`]: a shard tests its twins without rendering them.
    pub fn matches_doc(&self, doc: &dyn Document) -> bool {
        self.inner.filter.as_ref().is_none_or(|f| truthy(f, Env::doc(doc)))
    }

    /// The equalities every matching document must satisfy: conditions `path = constant` (either
    /// way round) that stand alone in WHERE or in its top-level AND. A document that fails one of
    /// them cannot match, so an index over such a path can narrow the documents to test.
    pub fn required_equalities(&self) -> Vec<(&[Seg], &Value)> {
        use super::ast::CmpOp;
        let Some(filter) = self.inner.filter.as_ref() else { return Vec::new() };
        let conjuncts = match &filter.kind {
            ExprKind::And(all) => all.as_slice(),
            _ => std::slice::from_ref(filter),
        };
        conjuncts
            .iter()
            .filter_map(|c| match &c.kind {
                ExprKind::Cmp(CmpOp::Eq, a, b) => match (&a.kind, &b.kind) {
                    (ExprKind::Path(p), ExprKind::Const(v)) | (ExprKind::Const(v), ExprKind::Path(p)) => {
                        Some((p.as_slice(), v))
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    /// The result row for `doc` (which the caller has already checked with [`Query::matches`]):
    /// the document itself for `SELECT *`, else an object of the projected values, undefined ones
    /// omitted. `None` for aggregate queries, whose rows only exist per group.
    pub fn project(&self, doc: &Value) -> Option<Value> {
        self.project_bounded(doc).ok().flatten().map(|(row, _)| row)
    }

    /// [`Query::project`], and the row's size (its JSON text's, estimated by [`json_size`]); an error
    /// once the row passes [`MAX_ROW_BYTES`]. A SELECT list can name the whole document hundreds of
    /// times under as many names within its 8192 characters: unchecked, one row of a large twin would
    /// hold hundreds of copies of it, and a page of a thousand such rows would exhaust the node.
    pub fn project_bounded(&self, doc: &Value) -> Result<Option<(Value, usize)>, String> {
        if self.is_aggregate() {
            return Ok(None);
        }
        let items = match &self.inner.select {
            Select::Star => return Ok(Some((doc.clone(), json_size(doc)))),
            Select::Items(items) => items,
        };
        let env = Env::doc(doc);
        let mut row = Map::new();
        let mut size = 2;
        for SelectItem { expr, name } in items {
            let (value, name) = match (&expr.kind, name) {
                // A bare path takes the document's spelling of its last key (`DeviceId` → `deviceId`).
                (ExprKind::Path(segs), OutName::Leaf(written)) => match lookup(doc, segs) {
                    Some((v, actual)) => (v.clone(), actual.unwrap_or(written).to_string()),
                    None => continue,
                },
                _ => match eval(expr, env) {
                    Some(v) => (v.into_owned(), name.as_str().to_string()),
                    None => continue,
                },
            };
            size += name.len() + 4 + json_size(&value);
            if size > MAX_ROW_BYTES {
                return Err(format!(
                    "a row of this query would be larger than {} KiB: select fewer or smaller members",
                    MAX_ROW_BYTES >> 10
                ));
            }
            row.insert(name, value);
        }
        Ok(Some((Value::Object(row), size)))
    }

    /// The top-level members [`Query::project`] reads: a shard renders only these (and the ids) of a
    /// matching twin to answer it. Every member for `SELECT *`; none for aggregates, which read their
    /// documents through [`Partial::add_doc`].
    pub fn fields_to_project(&self) -> Fields {
        let mut f = Fields::none();
        match (&self.inner.plan, &self.inner.select) {
            (Some(_), _) => {}
            (None, Select::Star) => return Fields::All,
            (None, Select::Items(items)) => {
                for item in items {
                    f.add_expr(&item.expr);
                }
            }
        }
        f
    }

    /// A fresh aggregation for this query; `None` if the query is not an aggregate one.
    pub fn partial(&self) -> Option<Partial> {
        self.inner.plan.as_ref().map(|p| Partial::new(Arc::clone(p)))
    }

    /// Decodes a continuation token and checks it belongs to this query.
    pub fn cursor(&self, token: &str) -> Result<Cursor, CursorError> {
        let c = Cursor::decode(token)?;
        if c.query_fingerprint() != self.inner.fingerprint {
            return Err(CursorError::OtherQuery);
        }
        Ok(c)
    }

    /// Shard side of a paged (non-aggregate) query: among `docs` (this shard's documents of the
    /// query's collection, in any order), the matching rows after `cursor`, at most what the page can
    /// use plus one, sorted by row key and projected. Empty for aggregate queries.
    pub fn shard_rows<'a>(
        &self,
        docs: impl IntoIterator<Item = &'a Value>,
        cursor: Option<&Cursor>,
        max_items: usize,
    ) -> Vec<(RowKey, Value)> {
        if self.is_aggregate() {
            return Vec::new();
        }
        let limit = page::page_limit(max_items, self.inner.top, cursor).saturating_add(1);
        let candidates =
            docs.into_iter().filter(|d| self.matches(d)).map(|d| (page::row_key(self.inner.collection, d), d));
        page::select_rows(candidates, cursor.map(|c| &c.last), limit)
            .into_iter()
            .filter_map(|(k, d)| self.project(d).map(|row| (k, row)))
            .collect()
    }

    /// Merge side of a paged query: combines the shards' [`Query::shard_rows`] into one page.
    pub fn page(&self, shards: Vec<Vec<(RowKey, Value)>>, cursor: Option<&Cursor>, max_items: usize) -> Page {
        page::merge_page(shards, cursor, max_items, self.inner.top, self.inner.fingerprint)
    }

    /// The whole result over one set of documents, unpaged: rows in row-key order cut at TOP, or the
    /// aggregate rows. For single-node use and tests.
    pub fn run<'a>(&self, docs: impl IntoIterator<Item = &'a Value>) -> Vec<Value> {
        if let Some(mut p) = self.partial() {
            for d in docs {
                p.add(d);
            }
            return p.finish();
        }
        let mut rows: Vec<(RowKey, &Value)> = docs
            .into_iter()
            .filter(|d| self.matches(d))
            .map(|d| (page::row_key(self.inner.collection, d), d))
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        let top = self.inner.top.map_or(usize::MAX, |t| usize::try_from(t).unwrap_or(usize::MAX));
        rows.into_iter().take(top).filter_map(|(_, d)| self.project(d)).collect()
    }
}
