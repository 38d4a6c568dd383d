//! The one scatter/gather of the query language over the shards. [`Twins::query_page`] asks every
//! shard at once for its part (rows after the continuation cursor, at most a page; or aggregate
//! accumulators) and merges the answers into one page: the query route serves clients with it and
//! [`Twins::aggregate`] counts with it. [`Twins::scan`] reads every row, shard by shard, for the node's
//! own background work (jobs, configurations), which needs each row's shard.
//!
//! An invalid query, continuation or aggregate mix is [`ShardError::Refused`] (a 400 at the front
//! door); a shard that cannot answer is its own error.

use serde_json::Value;

use super::read::{QueryPart, ReadOp, ReadOut};
use super::Twins;
use crate::ids::ShardId;
use crate::query::{self, Cursor, Query};
use crate::shard::ShardError;

/// Rows asked of a shard at a time by [`Twins::scan`].
const PAGE: usize = 1000;

/// One page of a query's result.
#[derive(Debug)]
pub struct QueryPage {
    pub items: Vec<Value>,
    /// Where the next page starts; `None` on the last page (and always for aggregates).
    pub next: Option<Cursor>,
}

fn refused(msg: impl Into<String>) -> ShardError {
    ShardError::Refused { msg: msg.into() }
}

impl Twins {
    /// Shard `shard`'s part of the query `text` after the continuation `token`.
    async fn query_shard(
        &self,
        shard: ShardId,
        text: &str,
        token: Option<&str>,
        max_items: usize,
    ) -> Result<QueryPart, ShardError> {
        let op = ReadOp::Query { text: text.to_string(), cursor: token.map(str::to_string), max_items };
        match self.read_shard(shard, op).await? {
            ReadOut::Query(Ok(part)) => Ok(part),
            ReadOut::Query(Err(e)) => Err(refused(e)),
            other => Err(ShardError::Fatal { shard, msg: format!("unexpected answer to a query: {other:?}") }),
        }
    }

    /// One page of `q` (parsed from `text`) over every shard, after the continuation `token`, with at
    /// most `max_items` rows. Aggregates answer all their groups in one page.
    pub async fn query_page(
        &self,
        q: &Query,
        text: &str,
        token: Option<&str>,
        max_items: usize,
    ) -> Result<QueryPage, ShardError> {
        let cursor = token.map(|t| q.cursor(t)).transpose().map_err(|e| refused(format!("x-ms-continuation: {e}")))?;
        let parts = futures::future::join_all(
            (0..self.shard_count()).map(|shard| self.query_shard(shard, text, token, max_items)),
        )
        .await;
        let mut rows = Vec::new();
        let mut partial = q.partial();
        for (shard, part) in (0..).zip(parts) {
            // A shard whose answer does not fit the query the others answered is a bug, not bad input.
            let fatal = |msg: String| ShardError::Fatal { shard, msg };
            match (part?, partial.as_mut()) {
                (QueryPart::Rows(r), None) => rows.push(r),
                (QueryPart::Partial(state), Some(p)) => {
                    p.merge_state(state).map_err(|e| fatal(format!("merging query results: {e}")))?
                }
                (QueryPart::Rows(_), Some(_)) | (QueryPart::Partial(_), None) => {
                    return Err(fatal(format!("answered '{text}' as the other kind of query (rows or aggregate)")))
                }
            }
        }
        if let Some(msg) = partial.as_ref().and_then(|p| p.too_many_groups()) {
            return Err(ShardError::Refused { msg });
        }
        Ok(match partial {
            Some(p) => QueryPage { items: p.finish(), next: None },
            None => {
                let page = q.page(rows, cursor.as_ref(), max_items);
                QueryPage { items: page.items, next: page.next }
            }
        })
    }

    /// Every row of the (non-aggregate) query `text`, with the shard it came from, shard by shard in
    /// row-key order. No shard is asked for more than a page at a time.
    pub async fn scan(&self, text: &str) -> Result<Vec<(ShardId, Value)>, ShardError> {
        let mut out = Vec::new();
        self.each_row(text, |shard, row| out.push((shard, row))).await?;
        Ok(out)
    }

    /// How many rows the row query `text` makes over every shard, counted a page at a time: no more
    /// than a page's rows are held at once, however large the fleet (a configuration's metrics are
    /// such counts, of queries its author wrote).
    pub async fn count(&self, text: &str) -> Result<usize, ShardError> {
        let mut n = 0;
        self.each_row(text, |_, _| n += 1).await?;
        Ok(n)
    }

    /// Hands every row of the row query `text` to `take`, shard by shard, a page at a time.
    async fn each_row(&self, text: &str, mut take: impl FnMut(ShardId, Value)) -> Result<(), ShardError> {
        let q = query::parse(text).map_err(|e| refused(e.to_string()))?;
        if q.partial().is_some() {
            return Err(refused(format!("'{text}' is an aggregate query")));
        }
        for shard in 0..self.shard_count() {
            let mut cursor: Option<Cursor> = None;
            loop {
                let token = cursor.as_ref().map(Cursor::encode);
                let QueryPart::Rows(rows) = self.query_shard(shard, text, token.as_deref(), PAGE).await? else {
                    return Err(refused(format!("'{text}' is an aggregate query")));
                };
                let page = q.page(vec![rows], cursor.as_ref(), PAGE);
                for row in page.items {
                    take(shard, row);
                }
                match page.next {
                    Some(c) => cursor = Some(c),
                    None => break,
                }
            }
        }
        Ok(())
    }

    /// The groups of the aggregate query `text` (`COUNT()`, `GROUP BY`, …), merged over every shard.
    pub async fn aggregate(&self, text: &str) -> Result<Vec<Value>, ShardError> {
        let q = query::parse(text).map_err(|e| refused(e.to_string()))?;
        if q.partial().is_none() {
            return Err(refused(format!("'{text}' is not an aggregate query")));
        }
        Ok(self.query_page(&q, text, None, 1).await?.items)
    }
}
