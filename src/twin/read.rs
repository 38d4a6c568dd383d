//! Reads of a shard's applied state, as values: a node that does not replicate a shard sends the read
//! to one that does (which linearizes it through the shard's leader), so a read is a request that can
//! travel, not a closure.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::TwinId;
use crate::model::{Credentials, DeviceStats, ShardState, TwinError};
use crate::query::{self, Collection, PartialState, RowKey};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ReadOp {
    Credentials(TwinId),
    TwinProperties(TwinId),
    Twin(TwinId),
    Device(String),
    Devices {
        after: Option<String>,
        limit: usize,
    },
    Modules(String),
    Module(String, String),
    Stats,
    /// One shard's part of a query (see [`run_query`]).
    Query {
        text: String,
        cursor: Option<String>,
        max_items: usize,
    },
    /// A backup page: at most `limit` devices after `after` (see `model::backup`).
    BackupPage {
        after: Option<String>,
        limit: usize,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ReadOut {
    Credentials(Option<Credentials>),
    Doc(Result<Value, TwinError>),
    Docs(Result<Vec<Value>, TwinError>),
    MaybeDoc(Option<Value>),
    Stats(DeviceStats),
    /// A query part, or why the shard could not run it.
    Query(Result<QueryPart, String>),
    /// A backup page as JSON text.
    Backup(String),
}

/// One shard's contribution to a query.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum QueryPart {
    /// Row queries: at most the page's limit plus one rows after the cursor, in key order.
    Rows(Vec<(RowKey, Value)>),
    /// Aggregates: the shard's accumulators.
    Partial(PartialState),
}

impl ReadOp {
    pub fn run(&self, s: &ShardState) -> ReadOut {
        match self {
            ReadOp::Credentials(id) => ReadOut::Credentials(s.credentials(id)),
            ReadOp::TwinProperties(id) => ReadOut::Doc(s.twin_properties(id)),
            ReadOp::Twin(id) => ReadOut::Doc(s.twin(id)),
            ReadOp::Device(id) => ReadOut::MaybeDoc(s.device(id)),
            ReadOp::Devices { after, limit } => ReadOut::Docs(Ok(s.devices(after.as_deref(), *limit))),
            ReadOp::Modules(id) => ReadOut::Docs(s.modules(id)),
            ReadOp::Module(d, m) => ReadOut::Doc(s.module(d, m)),
            ReadOp::Stats => ReadOut::Stats(s.stats()),
            ReadOp::Query { text, cursor, max_items } => {
                ReadOut::Query(run_query(s, text, cursor.as_deref(), *max_items))
            }
            ReadOp::BackupPage { after, limit } => {
                ReadOut::Backup(serde_json::to_string(&s.backup_page(after.as_deref(), *limit)).unwrap_or_default())
            }
        }
    }
}

/// Runs a query on one shard. Rows: the shard's twins are visited in key order from the cursor on and
/// the scan stops once the page (plus one row, so the gatherer knows whether more exist) is full.
/// Aggregates visit every twin and return mergeable accumulators. `devices.jobs` rows are the
/// per-device job outcomes each shard keeps next to its twins.
pub fn run_query(s: &ShardState, text: &str, cursor: Option<&str>, max_items: usize) -> Result<QueryPart, String> {
    let q = query::parse(text).map_err(|e| e.to_string())?;
    let cursor = cursor.map(|t| q.cursor(t)).transpose().map_err(|e| e.to_string())?;
    fn docs<'a>(s: &'a ShardState, c: Collection, after: &'a [String]) -> Box<dyn Iterator<Item = Value> + 'a> {
        match c {
            Collection::Devices => s.twins_after(false, after),
            Collection::Modules => s.twins_after(true, after),
            Collection::Jobs => s.job_rows_after(after),
        }
    }
    if let Some(mut p) = q.partial() {
        for doc in docs(s, q.collection(), &[]) {
            p.add(&doc);
        }
        return Ok(QueryPart::Partial(p.state()));
    }
    let limit = query::page_limit(max_items, q.top(), cursor.as_ref()).saturating_add(1);
    let after: RowKey = cursor.map(|c| c.last).unwrap_or_default();
    let mut rows = Vec::new();
    for doc in docs(s, q.collection(), &after) {
        if rows.len() >= limit {
            break;
        }
        if q.matches(&doc) {
            if let Some(row) = q.project(&doc) {
                rows.push((query::row_key(q.collection(), &doc), row));
            }
        }
    }
    Ok(QueryPart::Rows(rows))
}

/// A read answered with another kind of result than asked for: a bug or a node of another version.
#[derive(Debug, thiserror::Error)]
#[error("unexpected answer to a read: {0:?}")]
pub struct Mismatch(pub ReadOut);
