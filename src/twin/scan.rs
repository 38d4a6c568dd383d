//! Queries over every shard for the node's own background work (the jobs runner, configurations):
//! all rows of a query, page by page, or the merged groups of an aggregate. The query route pages
//! for clients itself; these read everything.

use serde_json::Value;

use super::read::{QueryPart, ReadOp, ReadOut};
use super::Twins;
use crate::ids::ShardId;
use crate::query;
use crate::shard::ShardError;

/// Rows asked of a shard at a time.
const PAGE: usize = 1000;

impl Twins {
    /// Every row of the (non-aggregate) query `text`, with the shard it came from, shard by shard in
    /// row-key order. No shard is asked for more than a page at a time.
    pub async fn scan(&self, text: &str) -> Result<Vec<(ShardId, Value)>, ShardError> {
        let q = query::parse(text).map_err(|e| ShardError::Refused { msg: e.to_string() })?;
        let mut out = Vec::new();
        for shard in 0..self.shards.shard_count() {
            let mut cursor: Option<String> = None;
            loop {
                let op = ReadOp::Query { text: text.to_string(), cursor: cursor.clone(), max_items: PAGE };
                let rows = match self.read_shard(shard, op).await? {
                    ReadOut::Query(Ok(QueryPart::Rows(rows))) => rows,
                    ReadOut::Query(Ok(QueryPart::Partial(_))) => {
                        return Err(ShardError::Refused { msg: format!("'{text}' is an aggregate query") })
                    }
                    ReadOut::Query(Err(e)) => return Err(ShardError::Refused { msg: e }),
                    other => {
                        return Err(ShardError::Fatal { shard, msg: format!("unexpected query answer {other:?}") })
                    }
                };
                let at = cursor.as_deref().map(|t| q.cursor(t)).transpose().ok().flatten();
                let page = q.page(vec![rows], at.as_ref(), PAGE);
                out.extend(page.items.into_iter().map(|r| (shard, r)));
                match page.next {
                    Some(c) => cursor = Some(c.encode()),
                    None => break,
                }
            }
        }
        Ok(out)
    }

    /// The groups of the aggregate query `text` (`COUNT()`, `GROUP BY`, …), merged over every shard.
    pub async fn aggregate(&self, text: &str) -> Result<Vec<Value>, ShardError> {
        let q = query::parse(text).map_err(|e| ShardError::Refused { msg: e.to_string() })?;
        let Some(mut total) = q.partial() else {
            return Err(ShardError::Refused { msg: format!("'{text}' is not an aggregate query") });
        };
        for shard in 0..self.shards.shard_count() {
            let op = ReadOp::Query { text: text.to_string(), cursor: None, max_items: 1 };
            match self.read_shard(shard, op).await? {
                ReadOut::Query(Ok(QueryPart::Partial(state))) => {
                    total.merge_state(state).map_err(|e| ShardError::Fatal { shard, msg: e.to_string() })?
                }
                ReadOut::Query(Err(e)) => return Err(ShardError::Refused { msg: e }),
                other => return Err(ShardError::Fatal { shard, msg: format!("unexpected query answer {other:?}") }),
            }
        }
        Ok(total.finish())
    }
}
