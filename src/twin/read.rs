//! Reads of a shard's applied state, as values: a node that does not replicate a shard sends the read
//! to one that does (which linearizes it through the shard's leader), so a read is a request that can
//! travel, not a closure.

use std::borrow::Cow;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::view::TwinView;
use crate::ids::TwinId;
use crate::model::tag_index::IndexValue;
use crate::model::{Credentials, DeviceStats, ShardState, TwinError, TwinRef};
use crate::query::{self, Collection, Fields, Partial, PartialState, Query, RowKey, Scalar, Seg};
use crate::shard::{Shard, ShardError};

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
    /// Whether the read walks many twins rather than looking one up.
    fn is_scan(&self) -> bool {
        matches!(self, ReadOp::Devices { .. } | ReadOp::Query { .. } | ReadOp::BackupPage { .. } | ReadOp::Stats)
    }

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

/// Runs `op` on a local replica's applied state. Scans (queries, backup pages, device listings) run
/// on the blocking pool: walking a shard of tens of thousands of twins takes long enough that, on an
/// async worker, it would delay the Raft heartbeats queued behind it until followers call elections.
pub async fn run_local(shard: &Arc<Shard>, op: ReadOp) -> Result<ReadOut, ShardError> {
    if !op.is_scan() {
        return Ok(shard.read_local(|st| op.run(st)));
    }
    let s = Arc::clone(shard);
    tokio::task::spawn_blocking(move || s.read_local(|st| op.run(st)))
        .await
        .map_err(|e| ShardError::Fatal { shard: shard.id, msg: format!("a scan of the shard failed: {e}") })
}

/// [`run_local`] once the replica's applied state is linearizable (see [`Shard::linearize`]).
pub async fn run_linearized(shard: &Arc<Shard>, op: ReadOp) -> Result<ReadOut, ShardError> {
    shard.linearize().await?;
    run_local(shard, op).await
}

/// One candidate row of a query on a shard: a twin not yet rendered, or an already rendered
/// `devices.jobs` row.
enum Candidate<'a> {
    Twin(TwinRef<'a>),
    Doc(Value),
}

impl Candidate<'_> {
    fn matches(&self, q: &Query) -> bool {
        match self {
            Candidate::Twin(t) => q.matches_doc(&TwinView(*t)),
            Candidate::Doc(d) => q.matches(d),
        }
    }

    fn add_to(&self, p: &mut Partial) {
        match self {
            Candidate::Twin(t) => p.add_doc(&TwinView(*t)),
            Candidate::Doc(d) => p.add(d),
        };
    }

    /// The row's document with at least the members `fields` (a twin renders only those, and its
    /// ids).
    fn render(&self, fields: &Fields) -> Cow<'_, Value> {
        match self {
            Candidate::Twin(t) => Cow::Owned(t.render_members(&|name| fields.wants(name))),
            Candidate::Doc(d) => Cow::Borrowed(d),
        }
    }
}

/// Runs a query on one shard. Rows: the shard's twins are visited in key order from the cursor on and
/// the scan stops once the page (plus one row, so the gatherer knows whether more exist) is full.
/// Aggregates visit every twin and return mergeable accumulators. `devices.jobs` rows are the
/// per-device job outcomes each shard keeps next to its twins.
///
/// Twins are tested and aggregated in place ([`TwinView`]) and rendered only if they make a row, and
/// then only with the members the projection reads: a selective query over a large shard costs
/// little more than walking it.
pub fn run_query(s: &ShardState, text: &str, cursor: Option<&str>, max_items: usize) -> Result<QueryPart, String> {
    let q = query::parse(text).map_err(|e| e.to_string())?;
    let cursor = cursor.map(|t| q.cursor(t)).transpose().map_err(|e| e.to_string())?;
    fn candidates<'a>(
        s: &'a ShardState,
        c: Collection,
        after: &'a [String],
    ) -> Box<dyn Iterator<Item = Candidate<'a>> + 'a> {
        match c {
            Collection::Devices => Box::new(s.twins_after(false, after).map(Candidate::Twin)),
            Collection::Modules => Box::new(s.twins_after(true, after).map(Candidate::Twin)),
            Collection::Jobs => Box::new(s.job_rows_after(after).map(Candidate::Doc)),
        }
    }
    if let Some(mut p) = q.partial() {
        for c in indexed(s, &q, None).unwrap_or_else(|| candidates(s, q.collection(), &[])) {
            c.add_to(&mut p);
        }
        if let Some(why) = p.too_many_groups() {
            return Err(why);
        }
        return Ok(QueryPart::Partial(p.state()));
    }
    let to_project = q.fields_to_project();
    let limit = query::page_limit(max_items, q.top(), cursor.as_ref()).saturating_add(1);
    let after: RowKey = cursor.map(|c| c.last).unwrap_or_default();
    let mut rows = Vec::new();
    let mut bytes = 0usize;
    let all =
        indexed(s, &q, after.first().map(String::as_str)).unwrap_or_else(|| candidates(s, q.collection(), &after));
    for c in all {
        if rows.len() >= limit {
            break;
        }
        if c.matches(&q) {
            let doc = c.render(&to_project);
            if let Some((row, size)) = q.project_bounded(&doc)? {
                bytes += size;
                if bytes > query::MAX_PAGE_BYTES {
                    return Err(format!(
                        "a page of this query would hold more than {} MiB: ask for fewer rows a page \
                         (x-ms-max-item-count) or select fewer members",
                        query::MAX_PAGE_BYTES >> 20
                    ));
                }
                rows.push((query::row_key(q.collection(), &doc), row));
            }
        }
    }
    Ok(QueryPart::Rows(rows))
}

/// The device twins the tag index narrows a devices query to, after the device id `after`: of the
/// equalities on tags WHERE requires, the one that names the fewest devices. `None` when no such
/// equality can be answered by the index (the caller visits every twin).
fn indexed<'a>(
    s: &'a ShardState,
    q: &Query,
    after: Option<&'a str>,
) -> Option<Box<dyn Iterator<Item = Candidate<'a>> + 'a>> {
    if q.collection() != Collection::Devices {
        return None;
    }
    let mut best: Option<(usize, Box<dyn Iterator<Item = TwinRef<'a>> + 'a>)> = None;
    for (path, value) in q.required_equalities() {
        let ([Seg::Key(first), rest @ ..], Some(value)) = (path, index_value(value)) else { continue };
        let keys: Option<Vec<&str>> =
            rest.iter().map(|s| if let Seg::Key(k) = s { Some(k.as_str()) } else { None }).collect();
        let (Some(keys), true) = (keys, first.eq_ignore_ascii_case("tags")) else { continue };
        if let Some((n, twins)) = s.tagged_devices_after(keys.into_iter(), &value, after) {
            if best.as_ref().is_none_or(|(m, _)| n < *m) {
                best = Some((n, twins));
            }
        }
    }
    best.map(|(_, twins)| Box::new(twins.map(Candidate::Twin)) as Box<dyn Iterator<Item = Candidate<'a>> + 'a>)
}

/// The tag index's key of a query constant, if it has one (tags never hold `null`).
fn index_value(v: &Value) -> Option<IndexValue> {
    match Scalar::borrowed(v)? {
        Scalar::Bool(b) => Some(IndexValue::Bool(b)),
        Scalar::Num(n) => Some(IndexValue::number(n.f64())),
        Scalar::Str(s) => IndexValue::string(&s),
        Scalar::Null => None,
    }
}

/// A read answered with another kind of result than asked for: a bug or a node of another version.
#[derive(Debug, thiserror::Error)]
#[error("unexpected answer to a read: {0:?}")]
pub struct Mismatch(pub ReadOut);

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::{run_query, QueryPart};
    use crate::ids::TwinId;
    use crate::model::{Command, DeviceSpec, ModuleSpec, Op, RequestId, ShardState};
    use crate::query::{self, Cursor};

    fn shard() -> ShardState {
        let mut s = ShardState::default();
        let mut req = 0u128;
        let mut apply = |s: &mut ShardState, op: Op| {
            req += 1;
            let applied = s.apply(&Command { request_id: RequestId(req), timestamp_ms: 1_700_000_000_000, op });
            assert!(applied.result.is_ok(), "{:?}", applied.result);
        };
        for i in 0..40 {
            let id = format!("d{i:02}");
            apply(&mut s, Op::PutDevice { device: DeviceSpec::test_sas(&id), if_match: None });
            let patch = json!({
                "tags": {"b": i % 4, "t": {"x": i, "On": i % 2 == 0}, "arr": [i, {"k": i % 3}], "f": f64::from(i) / 2.0, "S": format!("s{}", i % 5)},
                "properties": {"desired": {"fw": format!("v{}", i % 3), "n": {"deep": i}}}
            });
            let twin = TwinId { device_id: id.clone(), module_id: None };
            apply(&mut s, Op::UpdateTwin { id: twin, patch_json: patch.to_string(), if_match: None });
            if i % 5 == 0 {
                let module = ModuleSpec {
                    device_id: id.clone(),
                    module_id: "m".into(),
                    managed_by: None,
                    auth: DeviceSpec::test_sas(&id).auth,
                };
                apply(&mut s, Op::PutModule { module, if_match: None });
            }
        }
        s
    }

    /// Every row of `text`, paged 7 rows at a time through [`run_query`] as the gatherer does.
    fn paged(s: &ShardState, text: &str) -> Vec<Value> {
        let q = query::parse(text).unwrap();
        let (mut out, mut cursor) = (Vec::new(), None::<Cursor>);
        loop {
            let token = cursor.as_ref().map(Cursor::encode);
            match run_query(s, text, token.as_deref(), 7).unwrap() {
                QueryPart::Partial(state) => {
                    let mut p = q.partial().unwrap();
                    p.merge_state(state).unwrap();
                    return p.finish();
                }
                QueryPart::Rows(rows) => {
                    let page = q.page(vec![rows], cursor.as_ref(), 7);
                    out.extend(page.items);
                    match page.next {
                        Some(c) => cursor = Some(c),
                        None => return out,
                    }
                }
            }
        }
    }

    /// Rendering only what WHERE reads gives the same answers as evaluating whole documents.
    #[test]
    fn partial_rendering_answers_like_whole_documents() {
        let s = shard();
        let devices: Vec<Value> = s.twins_after(false, &[]).map(|t| t.render()).collect();
        let modules: Vec<Value> = s.twins_after(true, &[]).map(|t| t.render()).collect();
        for text in [
            "SELECT * FROM devices WHERE tags.b = 2",
            "SELECT * FROM devices WHERE Tags.B = 2 AND tags.t.x < 20",
            "SELECT deviceId, properties.desired.fw FROM devices WHERE tags.b = 1",
            "SELECT tags.t.x AS x FROM devices WHERE properties.desired.fw = 'v1'",
            "SELECT * FROM devices WHERE status = 'enabled' AND version > 1",
            "SELECT * FROM devices d WHERE IS_OBJECT(d.tags)",
            "SELECT TOP 3 * FROM devices",
            "SELECT COUNT() AS n FROM devices WHERE tags.b = 3",
            "SELECT properties.desired.fw AS fw, COUNT() AS n, SUM(tags.t.x) AS s FROM devices WHERE tags.b < 3 GROUP BY properties.desired.fw",
            "SELECT * FROM devices.modules WHERE deviceId > 'd10'",
            "SELECT moduleId, tags FROM devices.modules",
            "SELECT * FROM devices WHERE tags.arr[0] > 30 OR tags.arr[1].k = 2",
            "SELECT * FROM devices WHERE Properties.Desired.N.DEEP >= 35",
            "SELECT * FROM devices WHERE properties.desired.$version > 1 AND tags.t.on = true",
            "SELECT * FROM devices WHERE IS_DEFINED(properties.desired.$metadata.fw) AND NOT IS_DEFINED(tags.nope)",
            "SELECT deviceId FROM devices WHERE IS_OBJECT(tags.t) AND IS_ARRAY(tags.arr) AND tags.t.x < 5",
            "SELECT deviceId FROM devices WHERE IS_OBJECT(properties.desired) AND tags.b = 0",
            "SELECT deviceId FROM devices WHERE properties.reported.x = 1 OR deviceid = 'd03'",
            "SELECT tags.arr[1] AS a, COUNT() AS n FROM devices GROUP BY tags.arr[1]",
            "SELECT MAX(properties.desired.n.deep) AS m FROM devices WHERE connectionState = 'Disconnected'",
            // Comparisons read primitives in place: integer against float text, exponents, strings,
            // booleans, objects (undefined), IN.
            "SELECT deviceId FROM devices WHERE tags.f = 1 OR tags.f = 2.5 OR tags.t.x = 7.0",
            "SELECT deviceId FROM devices WHERE tags.f > 1.5e1 AND tags.t.x <= 3.5e1",
            "SELECT deviceId FROM devices WHERE properties.desired.fw < 'v1' AND tags.t.On = false",
            "SELECT deviceId FROM devices WHERE tags.t = 1 OR tags.b IN (1, 2.0)",
            "SELECT deviceId FROM devices WHERE 10 > tags.t.x AND 'v0' != properties.desired.fw",
            // Equalities on tags are answered through the tag index, the rest of WHERE on each twin.
            "SELECT * FROM devices WHERE tags.s = 's3' AND tags.t.x > 10",
            "SELECT deviceId FROM devices WHERE TAGS.B = 1.0 AND 2 = tags.b OR tags.b = 1",
            "SELECT deviceId FROM devices WHERE tags.f = 1 AND tags.t.On = true AND tags.b = 2",
            "SELECT deviceId FROM devices WHERE tags.b = 3 AND tags.s = 's1' AND tags.t.on = false",
            "SELECT COUNT() AS n FROM devices WHERE tags.s = 's2' AND properties.desired.fw = 'v2'",
            "SELECT deviceId FROM devices WHERE tags.t = 1 OR tags.arr[0] = 3",
            "SELECT deviceId FROM devices WHERE tags.b = 2 AND tags.s = 's4' AND deviceId > 'd20'",
        ] {
            let q = query::parse(text).unwrap();
            let docs = if text.contains("devices.modules") { &modules } else { &devices };
            let expected = q.run(docs.iter());
            assert!(!expected.is_empty(), "{text} selects nothing: a weak case");
            assert_eq!(paged(&s, text), expected, "{text}");
        }
    }

    /// Which queries the tag index narrows, and to how many twins.
    #[test]
    fn tag_equalities_narrow_the_scan() {
        let s = shard();
        let visited = |text: &str| super::indexed(&s, &query::parse(text).unwrap(), None).map(Iterator::count);
        assert_eq!(visited("SELECT * FROM devices WHERE tags.b = 2"), Some(10));
        assert_eq!(visited("SELECT * FROM devices WHERE tags.b = 2 AND Tags.S = 's4'"), Some(8), "the smaller set");
        assert_eq!(visited("SELECT COUNT() FROM devices WHERE tags.t.on = true AND tags.t.x < 9"), Some(20));
        assert_eq!(visited("SELECT * FROM devices WHERE tags.nope = 2"), Some(0));
        assert_eq!(visited("SELECT * FROM devices WHERE tags.t = 2"), Some(0), "an object is never equal");
        for scan in [
            "SELECT * FROM devices WHERE tags.b = 2 OR tags.b = 1",
            "SELECT * FROM devices WHERE tags.arr[0] = 3",
            "SELECT * FROM devices WHERE tags.b < 2",
            "SELECT * FROM devices WHERE properties.desired.fw = 'v1'",
            "SELECT * FROM devices.modules WHERE tags.b = 2",
        ] {
            assert_eq!(visited(scan), None, "{scan}");
        }
    }
}
