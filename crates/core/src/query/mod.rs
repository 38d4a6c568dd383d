//! The Azure IoT Hub query language (device twins, module twins, per-device job rows), as pure code:
//! no I/O, no clocks, no global state. The HTTP layer parses a query once, each shard evaluates it
//! against its own documents, and the results are merged (rows by k-way merge with continuation
//! tokens, aggregates by merging accumulators).
//!
//! # Language
//!
//! ```text
//! SELECT [TOP n] * | expr [AS name], ...  FROM devices | devices.modules | devices.jobs [[AS] alias]
//!   [WHERE condition] [GROUP BY expr, ...]
//! ```
//!
//! * Keywords and function names are case-insensitive. Queries longer than 8192 characters and
//!   expressions nested deeper than 64 levels are refused.
//! * Paths: `deviceId`, `tags.a.b`, `properties.reported.x`, `tags['a b']`, `arr[0]`,
//!   `tags.[[group]]` (IoT Hub's escape for keyword-named properties), optionally prefixed by the
//!   collection or its alias (`devices.jobs.jobId`, `d.tags.x`). Property names match exactly or,
//!   failing that, ASCII case-insensitively.
//! * Constants: `'..'`/`".."` strings (escapes `\' \" \\ \/ \b \f \n \r \t \uXXXX`), integers,
//!   decimals, exponents, hex `0x1F`, `true`, `false`, `null`, `undefined`, arrays `[..]`,
//!   objects `{k: v}`.
//! * Operators: `OR`, `AND`, `NOT`, `= != <> < > <= >=`, `IN`/`NIN`/`NOT IN` (array or `( .. )`
//!   list), `+ - * / %`, unary `-`/`+`.
//! * Functions: `IS_DEFINED` plus the routing functions `IS_NULL IS_BOOL IS_NUMBER IS_STRING
//!   IS_OBJECT IS_ARRAY IS_PRIMITIVE STARTS_WITH ENDS_WITH CONTAINS INDEX_OF SUBSTRING CONCAT LOWER
//!   UPPER LENGTH AS_NUMBER ABS CEILING FLOOR SIGN SQRT EXP POWER SQUARE`.
//! * Aggregates (SELECT only): `COUNT()`, `COUNT(x)`, `SUM(x)`, `AVG(x)`, `MIN(x)`, `MAX(x)`, freely
//!   combined in expressions (`SUM(x) / COUNT()`); non-aggregated paths must be GROUP BY expressions.
//!
//! Evaluation semantics are described in `eval`, aggregate semantics in `aggregate`, paging in `page`.
//!
//! # Output
//!
//! `SELECT *` returns documents unchanged (`x-ms-item-type: twin`, or `deviceJob` for
//! `devices.jobs`). Projections return objects (`raw`) keyed by alias, else by the path's last
//! property name (`properties.reported.x` → `"x"`), else `$1`, `$2`, ...; undefined values are
//! omitted. Duplicate output names are a query error. Row results are ordered by row key (deviceId,
//! then moduleId; for jobs jobId, then deviceId), which is what makes paging across shards exact.
//!
//! # Using it
//!
//! * [`parse`] once per request; the [`Query`] is shared (`Arc`) and `Send + Sync`.
//! * Row queries ([`Query::is_aggregate`] false): each shard calls [`Query::shard_rows`] with the
//!   decoded [`Cursor`] (from [`Query::cursor`]) and the page size; the gathering node calls
//!   [`Query::page`] and returns `page.next.map(|c| c.encode())` as `x-ms-continuation`.
//! * Aggregate queries: each shard feeds its documents to [`Query::partial`]`().add(doc)` (which
//!   applies WHERE itself) and ships [`Partial::state`]; the gathering node merges with
//!   [`Partial::merge_state`] and answers [`Partial::finish`] in one page. `partial()` returns
//!   `Option` so a row query cannot be aggregated by mistake.
//! * Jobs: [`parse_condition`] for `queryCondition`, then [`Condition::matches`] per device twin.
//! * Errors: [`QueryError`] (400 with its text), [`CursorError`] (400: bad continuation token),
//!   [`MergeError`] (internal: shard state that does not fit the query).
//!
//! # Not supported
//!
//! `ORDER BY`, `DISTINCT`, `SELECT VALUE`, `JOIN`, sub-queries, `||`/`LIKE`/`BETWEEN`, comments,
//! routing-only syntax (`$body`, `$twin`, system properties), and paging of aggregate results (all
//! groups come in one response). As a superset of IoT Hub, projections and aggregates are also
//! accepted on `devices.jobs` (IoT Hub allows only `SELECT *` there).

mod aggregate;
mod api;
mod ast;
mod error;
mod eval;
mod fields;
mod functions;
mod lexer;
mod num;
mod page;
mod parser;

pub use aggregate::{Partial, PartialState};
pub use api::{
    condition_query, json_size, parse, parse_condition, Condition, Query, CONDITION_QUERY_PREFIX, MAX_PAGE_BYTES,
    MAX_ROW_BYTES,
};
pub use ast::{Collection, Seg};
pub use error::{CursorError, MergeError, QueryError, MAX_NESTING, MAX_QUERY_CHARS};
pub use eval::{lookup, Document, Scalar};
pub use fields::Fields;
pub use lexer::quote;
pub use num::Num;
pub use page::{fingerprint, merge_page, page_limit, row_key, select_rows, Cursor, Page, RowKey};
