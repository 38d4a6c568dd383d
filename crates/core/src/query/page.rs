//! Paging of row (non-aggregate) results across shards.
//!
//! Every row has a [`RowKey`] (devices: deviceId; modules: deviceId, moduleId; jobs: jobId,
//! deviceId), unique within a collection. Results are defined to come in row-key order, so a page
//! boundary is just "the last key emitted": each shard returns its smallest matching keys above that
//! boundary ([`select_rows`]), and [`merge_page`] k-way merges those sorted streams into one page.
//! A shard never needs to send more than `limit + 1` rows (`limit` = what the page can still hold):
//! the extra row only tells whether another page exists.
//!
//! The continuation token ([`Cursor`]) carries that last key plus how many rows were emitted so far,
//! so `TOP n` holds across pages, and a fingerprint of the query text so a token cannot be replayed
//! against another query. It is JSON in URL-safe base64 without padding: opaque to clients, safe in
//! an HTTP header, and decoding garbage is an error, never a panic.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ast::Collection;
use super::error::CursorError;

/// Sort key of a result row; compared lexicographically (strings by bytes).
pub type RowKey = Vec<String>;

/// Longest continuation token accepted, so a hostile header cannot make us decode megabytes. Keys are
/// bounded ids (device/module ids ≤ 128 chars, job ids similar), so real tokens are far shorter.
const MAX_TOKEN_LEN: usize = 4096;

/// The key of a document of `collection`; missing ids sort as "".
pub fn row_key(collection: Collection, doc: &Value) -> RowKey {
    let field = |name: &str| doc.get(name).and_then(Value::as_str).unwrap_or_default().to_string();
    match collection {
        Collection::Devices => vec![field("deviceId")],
        Collection::Modules => vec![field("deviceId"), field("moduleId")],
        Collection::Jobs => vec![field("jobId"), field("deviceId")],
    }
}

/// Position in a paged result: everything up to and including `last` has been returned, `emitted`
/// rows in total.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// Format version, so a future layout can reject (or translate) old tokens.
    v: u8,
    /// [`fingerprint`] of the query text the token belongs to.
    q: u64,
    pub last: RowKey,
    pub emitted: u64,
}

impl Cursor {
    pub fn new(query_fingerprint: u64, last: RowKey, emitted: u64) -> Cursor {
        Cursor { v: 1, q: query_fingerprint, last, emitted }
    }

    pub fn query_fingerprint(&self) -> u64 {
        self.q
    }

    /// The opaque token for `x-ms-continuation`.
    pub fn encode(&self) -> String {
        // Serializing plain strings and integers to JSON cannot fail.
        let json = serde_json::to_vec(self).unwrap_or_default();
        URL_SAFE_NO_PAD.encode(json)
    }

    /// Parses a token from [`Cursor::encode`]. Padding is tolerated (some clients re-pad base64).
    pub fn decode(token: &str) -> Result<Cursor, CursorError> {
        let bad = |why: &str| CursorError::Invalid(why.to_string());
        if token.len() > MAX_TOKEN_LEN {
            return Err(bad("too long"));
        }
        let bytes = URL_SAFE_NO_PAD.decode(token.trim().trim_end_matches('=')).map_err(|_| bad("not base64"))?;
        let c: Cursor = serde_json::from_slice(&bytes).map_err(|_| bad("malformed"))?;
        if c.v != 1 {
            return Err(bad("unknown version"));
        }
        Ok(c)
    }
}

/// FNV-1a of the query text: stable across processes and builds (unlike `std`'s hasher), which
/// matters because the node that decodes a token may not be the one that issued it.
pub fn fingerprint(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// One page of rows and, when more rows exist, the cursor to continue from.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub items: Vec<Value>,
    pub next: Option<Cursor>,
}

/// How many rows the next page may hold: `max_items` (at least 1), further capped by what TOP leaves.
pub fn page_limit(max_items: usize, top: Option<u64>, cursor: Option<&Cursor>) -> usize {
    let emitted = cursor.map_or(0, |c| c.emitted);
    let room = top.map_or(u64::MAX, |t| t.saturating_sub(emitted));
    usize::try_from(room).unwrap_or(usize::MAX).min(max_items.max(1))
}

/// Shard side: of `rows` (any order), the `limit` smallest keys strictly after `after`, sorted.
/// Uses a bounded heap, O(n log limit), so a shard never sorts its whole result.
pub fn select_rows<T>(
    rows: impl IntoIterator<Item = (RowKey, T)>,
    after: Option<&RowKey>,
    limit: usize,
) -> Vec<(RowKey, T)> {
    if limit == 0 {
        return Vec::new();
    }
    let mut heap: BinaryHeap<ByKey<T>> = BinaryHeap::new();
    for (key, item) in rows {
        if after.is_some_and(|a| key <= *a) {
            continue;
        }
        if heap.len() < limit {
            heap.push(ByKey(key, item));
        } else if heap.peek().is_some_and(|top| key < top.0) {
            heap.pop();
            heap.push(ByKey(key, item));
        }
    }
    let mut out: Vec<(RowKey, T)> = heap.into_iter().map(|ByKey(k, v)| (k, v)).collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Heap entry ordered by key only (payloads need not be comparable).
struct ByKey<T>(RowKey, T);

impl<T> PartialEq for ByKey<T> {
    fn eq(&self, o: &Self) -> bool {
        self.0 == o.0
    }
}
impl<T> Eq for ByKey<T> {}
impl<T> PartialOrd for ByKey<T> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for ByKey<T> {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.cmp(&o.0)
    }
}

/// Merge side: k-way merges per-shard streams, each sorted by key, into one page after `cursor`.
/// Rows at or before the cursor are skipped (defensively; shards normally filter already). The page
/// holds at most `max_items` rows (at least 1) and never goes past `top` rows in total; `next` is set
/// only if another row exists and TOP is not yet reached.
pub fn merge_page<I>(
    shards: Vec<I>,
    cursor: Option<&Cursor>,
    max_items: usize,
    top: Option<u64>,
    query_fingerprint: u64,
) -> Page
where
    I: IntoIterator<Item = (RowKey, Value)>,
{
    let limit = page_limit(max_items, top, cursor);
    let after = cursor.map(|c| &c.last);
    let mut streams: Vec<Stream<I::IntoIter>> =
        shards.into_iter().map(|s| Stream { rows: s.into_iter(), head: None }).collect();
    // Min-heap of (key, stream index) over each stream's head row.
    let mut heap: BinaryHeap<Reverse<(RowKey, usize)>> = BinaryHeap::new();
    for (i, s) in streams.iter_mut().enumerate() {
        if let Some(k) = s.pull(after) {
            heap.push(Reverse((k, i)));
        }
    }
    let mut items = Vec::new();
    let mut last: Option<RowKey> = None;
    while items.len() < limit {
        let Some(Reverse((key, i))) = heap.pop() else { break };
        let Some(stream) = streams.get_mut(i) else { break };
        if let Some(v) = stream.head.take() {
            items.push(v);
        }
        last = Some(key);
        if let Some(k) = stream.pull(after) {
            heap.push(Reverse((k, i)));
        }
    }
    // `emitted` comes back from the client inside the continuation token: saturate rather than trust it.
    let emitted = cursor.map_or(0, |c| c.emitted).saturating_add(items.len() as u64);
    let top_reached = top.is_some_and(|t| emitted >= t);
    let next = match last {
        Some(last) if !heap.is_empty() && !top_reached => Some(Cursor::new(query_fingerprint, last, emitted)),
        _ => None,
    };
    Page { items, next }
}

/// One shard's rows with the current head parked while its key sits in the merge heap.
struct Stream<I> {
    rows: I,
    head: Option<Value>,
}

impl<I: Iterator<Item = (RowKey, Value)>> Stream<I> {
    /// Parks the next row after `after` as the head and returns its key; `None` when exhausted.
    fn pull(&mut self, after: Option<&RowKey>) -> Option<RowKey> {
        for (k, v) in self.rows.by_ref() {
            if after.is_some_and(|a| k <= *a) {
                continue;
            }
            self.head = Some(v);
            return Some(k);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn k(s: &str) -> RowKey {
        vec![s.to_string()]
    }

    fn shard(ids: &[&str]) -> Vec<(RowKey, Value)> {
        ids.iter().map(|i| (k(i), json!(i))).collect()
    }

    #[test]
    fn cursor_round_trip_and_garbage() {
        let c = Cursor::new(7, vec!["dev".into(), "mod".into()], 12);
        let t = c.encode();
        assert!(t.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        assert_eq!(Cursor::decode(&t).unwrap(), c);
        assert_eq!(Cursor::decode(&format!("{t}==")).unwrap(), c);
        for junk in ["", "!!!", "e30", "bnVsbA", &"A".repeat(5000), "eyJ2IjoyLCJxIjowLCJsYXN0IjpbXSwiZW1pdHRlZCI6MH0"] {
            assert!(Cursor::decode(junk).is_err(), "{junk}");
        }
    }

    #[test]
    fn merge_pages_until_done() {
        let shards = [shard(&["a", "d", "g"]), shard(&["b", "e"]), shard(&["c", "f", "h", "i"])];
        let mut cursor: Option<Cursor> = None;
        let mut all = Vec::new();
        let mut pages = 0;
        loop {
            let page = merge_page(shards.to_vec(), cursor.as_ref(), 2, None, 1);
            pages += 1;
            all.extend(page.items);
            match page.next {
                Some(c) => cursor = Some(Cursor::decode(&c.encode()).unwrap()),
                None => break,
            }
        }
        assert_eq!(pages, 5);
        assert_eq!(all, ["a", "b", "c", "d", "e", "f", "g", "h", "i"].map(|s| json!(s)).to_vec());
    }

    #[test]
    fn top_across_pages() {
        let shards = [shard(&["a", "c", "e"]), shard(&["b", "d"])];
        let p1 = merge_page(shards.to_vec(), None, 2, Some(3), 1);
        assert_eq!(p1.items.len(), 2);
        let p2 = merge_page(shards.to_vec(), p1.next.as_ref(), 2, Some(3), 1);
        assert_eq!(p2.items, vec![json!("c")]);
        assert_eq!(p2.next, None);
        let exact = merge_page(shards.to_vec(), None, 5, Some(5), 1);
        assert_eq!((exact.items.len(), exact.next), (5, None));
        let zero = merge_page(shards.to_vec(), None, 5, Some(0), 1);
        assert_eq!((zero.items.len(), zero.next), (0, None));
    }

    #[test]
    fn a_forged_count_in_the_token_neither_panics_nor_wraps() {
        let shards = [shard(&["a", "c", "e"]), shard(&["b", "d"])];
        let forged = Cursor::new(1, k("a"), u64::MAX);
        let p = merge_page(shards.to_vec(), Some(&forged), 2, None, 1);
        assert_eq!(p.items, vec![json!("b"), json!("c")]);
        assert_eq!(p.next.map(|c| c.emitted), Some(u64::MAX));
    }

    #[test]
    fn select_rows_is_bounded_and_sorted() {
        let rows = ["q", "b", "z", "a", "m", "c"].map(|s| (k(s), s));
        assert_eq!(select_rows(rows.clone(), Some(&k("b")), 2), vec![(k("c"), "c"), (k("m"), "m")]);
        assert_eq!(select_rows(rows.clone(), None, 0), vec![]);
        assert_eq!(select_rows(rows, Some(&k("z")), 5), vec![]);
    }
}
