//! What travels between nodes: endpoints, postcard envelopes and the failure body of a refused request.
//!
//! One endpoint per RPC kind (`POST /cluster/v5/raft/{append|append-batch|vote|prevote|snapshot|transfer-leader}`)
//! so metrics, limits and logs name the kind without decoding, and `POST /cluster/v5/call/{name}` for
//! anything else a node asks another (request forwarding). Bodies are postcard: compact, and every
//! payload of ours is postcard-safe (JSON documents travel as strings).
//!
//! # Versions
//! [`PROTOCOL_VERSION`] is in every path, in the signature domains (see [`super::auth`]) and in the
//! [`HEADER_PROTO`] header of every answer, so nodes of different versions refuse each other at once
//! and say why ([`RpcFailure::ProtocolVersion`], `TransportError::Protocol`) rather than half-work.
//! Version 2 signs requests and responses in separate domains, with nonces, and the body's length and
//! digest in the headers; version 1 nodes cannot talk to it. Version 3 carries the same signed fields
//! in one binary header instead of six text ones (see [`super::auth`]). Version 4 adds a log entry that
//! carries several twin writes of one shard (`Op::Batch`), which a version 3 node cannot read. Version 5
//! answers a forwarded twin write that returns a twin document with that document's text alone, not
//! inside the JSON of the outcome (see `twin::write_answer`).

use std::borrow::Cow;

use hyper::StatusCode;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::ids::ShardId;
use crate::storage::types::{SnapshotMeta, Vote};

/// The inter-node protocol this build speaks; bump it with any incompatible change.
pub const PROTOCOL_VERSION: u32 = 5;
/// Every answer (signed or not) says which protocol version the node speaks, for diagnosis only: it
/// is not authenticated and decides nothing but the error message.
pub const HEADER_PROTO: &str = "x-twinhub-proto";
pub const RAFT_PREFIX: &str = "/cluster/v5/raft/";
pub const CALL_PREFIX: &str = "/cluster/v5/call/";
/// What every version's paths start with.
const VERSIONED_PREFIX: &str = "/cluster/v";

/// Longest name of a generic call; names are code-defined, this only bounds a hostile path.
pub const MAX_CALL_NAME: usize = 64;

/// The Raft RPCs openraft sends between the replicas of a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RaftKind {
    Append,
    Vote,
    PreVote,
    Snapshot,
    TransferLeader,
    /// Several groups' AppendEntries to one node in one request (see [`AppendBatch`]).
    AppendBatch,
}

impl RaftKind {
    pub const ALL: [RaftKind; 6] = [
        RaftKind::Append,
        RaftKind::Vote,
        RaftKind::PreVote,
        RaftKind::Snapshot,
        RaftKind::TransferLeader,
        RaftKind::AppendBatch,
    ];

    /// Path segment and metrics label.
    pub fn name(self) -> &'static str {
        match self {
            RaftKind::Append => "append",
            RaftKind::Vote => "vote",
            RaftKind::PreVote => "prevote",
            RaftKind::Snapshot => "snapshot",
            RaftKind::TransferLeader => "transfer-leader",
            RaftKind::AppendBatch => "append-batch",
        }
    }
}

/// The generic inter-node calls (`POST /cluster/v5/call/{name}`), each served by one handler. The
/// name on the wire is the variant's [`Call::name`]; a name no handler serves (a node of another
/// release) is answered `no_handler`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Call {
    /// Runs a write on the node leading the twin's shard: `postcard((TwinId, Command))` in,
    /// `serde_json(Result<Applied, ShardError>)` out (replies hold JSON documents, which postcard
    /// cannot carry).
    TwinWrite,
    /// Runs several writes on this node, each in the group of its twin's shard (one forwarded bulk
    /// call carries the writes of every shard the callee leads): `postcard(Vec<(TwinId, Command)>)`
    /// in, `serde_json(Vec<Result<Applied, ShardError>>)` out, one answer per write, in order.
    TwinWrites,
    /// Runs a read on a replica of the shard: `postcard((ShardId, ReadOp))` in,
    /// `serde_json(Result<ReadOut, ShardError>)` out.
    TwinRead,
    /// Proposes a metadata change (cluster map, jobs, configurations, certificates) on the metadata
    /// leader: `serde_json(Command)` in, `serde_json(Result<Applied, ShardError>)` out.
    MetaWrite,
    /// Answers a shard's read index: `postcard(ShardId)` in, `postcard(Result<Option<u64>,
    /// ShardError>)` out.
    ReadIndex,
    /// This node's view of the groups it hosts: `()` in, `serde_json(Vec<ShardStatus>)` out.
    NodeStatus,
    /// A shard leader tells a replica it removed to close its group at once (a removed replica never
    /// hears the final membership from Raft itself): `postcard(ShardId)` in.
    ShardDropped,
    /// A starting node (`--join`) asks any member to propose it to the cluster map:
    /// `serde_json((NodeId, addr, shard count))` in, `serde_json(Result<(), ShardError>)` out.
    ClusterJoin,
    /// A node started with `--join` and no shard count asks a member for the cluster's before it opens
    /// its data directory: `()` in, `serde_json(Result<u32, ShardError>)` out.
    ClusterShardCount,
    /// A page of a shard's change events: `postcard((ShardId, Option<u64>))` in (the last index the
    /// caller has), JSON `Result<EventPage, ShardError>` out (events hold JSON values).
    ShardEvents,
    /// Delivers a direct method call to a device connection the callee holds (never forwarded on).
    DeviceMethod,
    /// Handlers the transport's own tests register.
    #[cfg(test)]
    Test(TestCall),
}

/// The transport tests' handlers.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TestCall {
    Echo,
    Fail,
    Slow,
    Ping,
    Count,
    /// Registered by no test: a call nobody serves.
    Nobody,
}

impl Call {
    /// Every call a node serves.
    pub const ALL: [Call; 11] = [
        Call::TwinWrite,
        Call::TwinWrites,
        Call::TwinRead,
        Call::MetaWrite,
        Call::ReadIndex,
        Call::NodeStatus,
        Call::ShardDropped,
        Call::ClusterJoin,
        Call::ClusterShardCount,
        Call::ShardEvents,
        Call::DeviceMethod,
    ];

    /// The name on the wire (a path segment).
    pub fn name(self) -> &'static str {
        match self {
            Call::TwinWrite => "twin.write",
            Call::TwinWrites => "twin.writes",
            Call::TwinRead => "twin.read",
            Call::MetaWrite => "meta.write",
            Call::ReadIndex => "shard.read-index",
            Call::NodeStatus => "node.status",
            Call::ShardDropped => "shard.dropped",
            Call::ClusterJoin => "cluster.join",
            Call::ClusterShardCount => "cluster.shard-count",
            Call::ShardEvents => "shard.events",
            Call::DeviceMethod => "device.method",
            #[cfg(test)]
            Call::Test(t) => match t {
                TestCall::Echo => "test.echo",
                TestCall::Fail => "test.fail",
                TestCall::Slow => "test.slow",
                TestCall::Ping => "test.ping",
                TestCall::Count => "test.count",
                TestCall::Nobody => "test.nobody",
            },
        }
    }

    /// The call a wire name stands for; `None` for a name this release does not know.
    pub fn from_name(name: &str) -> Option<Call> {
        #[cfg(test)]
        {
            use TestCall::*;
            let tests = [Echo, Fail, Slow, Ping, Count, Nobody].map(Call::Test);
            if let Some(c) = tests.into_iter().find(|c| c.name() == name) {
                return Some(c);
            }
        }
        Call::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// A request target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Raft(RaftKind),
    Call(String),
}

impl Endpoint {
    /// The endpoint of a request path; `None` for anything else (404).
    pub fn parse(path: &str) -> Option<Endpoint> {
        if let Some(kind) = path.strip_prefix(RAFT_PREFIX) {
            return RaftKind::ALL.into_iter().find(|k| k.name() == kind).map(Endpoint::Raft);
        }
        let name = path.strip_prefix(CALL_PREFIX)?;
        valid_call_name(name).then(|| Endpoint::Call(name.to_string()))
    }

    pub fn path(&self) -> Cow<'static, str> {
        match self {
            Endpoint::Raft(k) => Cow::Owned(format!("{RAFT_PREFIX}{}", k.name())),
            Endpoint::Call(name) => Cow::Owned(format!("{CALL_PREFIX}{name}")),
        }
    }

    /// Metrics label: the Raft kind, or `call` (names stay out of labels; there are few, but they are
    /// not ours to bound).
    pub fn label(&self) -> &'static str {
        match self {
            Endpoint::Raft(k) => k.name(),
            Endpoint::Call(_) => "call",
        }
    }
}

/// A cluster path of another protocol version: a node running a different release.
pub fn other_version(path: &str) -> bool {
    path.starts_with(VERSIONED_PREFIX) && !path.starts_with(&format!("{VERSIONED_PREFIX}{PROTOCOL_VERSION}/"))
}

/// Call names are path segments: ASCII letters, digits, `.`, `_`, `-`.
pub fn valid_call_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_CALL_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Body of a Raft request other than a snapshot: the shard (group) id, then openraft's request.
#[derive(Serialize, Deserialize)]
pub struct ShardRequest<T> {
    pub shard: ShardId,
    pub rpc: T,
}

/// Head of a snapshot request. The snapshot bytes follow it unframed (to the end of the body), so a
/// 64 MiB snapshot is copied once into the request, not re-encoded.
#[derive(Serialize, Deserialize)]
pub struct SnapshotHead {
    pub shard: ShardId,
    pub vote: Vote,
    pub meta: SnapshotMeta,
}

/// Why a node refused or failed a request: the postcard body of every non-200 answer, so the caller
/// can tell "no such shard here" (back off) from a bug (log it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RpcFailure {
    /// Missing, stale or invalid signature. Deliberately says nothing more.
    #[error("unauthorized")]
    Unauthorized,
    #[error("no such endpoint")]
    NotFound,
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("body larger than {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("bad request: {0}")]
    BadRequest(String),
    /// This node hosts no replica of the shard (not yet, or no more).
    #[error("shard {0} is not hosted here")]
    UnknownShard(ShardId),
    /// The shard's Raft group here has stopped (shut down or failed storage).
    #[error("shard {shard} stopped: {msg}")]
    GroupStopped { shard: ShardId, msg: String },
    #[error("no handler for call {0:?}")]
    NoHandler(String),
    /// A call handler failed; its message.
    #[error("handler failed: {0}")]
    Handler(String),
    /// An answer whose body was not a failure we know (e.g. from a proxy); status and text.
    #[error("HTTP {status}: {text}")]
    Other { status: u16, text: String },
    /// The request was for another protocol version than the one this node speaks.
    #[error("this node speaks cluster protocol version {ours} only: every node must run the same version")]
    ProtocolVersion { ours: u32 },
    /// One request of a batch had not finished when the batch was answered (after the wait the
    /// sender asked for): its outcome is unknown, as after a timeout.
    #[error("not finished within {waited_ms} ms")]
    Unfinished { waited_ms: u32 },
}

impl RpcFailure {
    pub fn status(&self) -> StatusCode {
        match self {
            RpcFailure::Unauthorized => StatusCode::UNAUTHORIZED,
            RpcFailure::NotFound | RpcFailure::UnknownShard(_) | RpcFailure::NoHandler(_) => StatusCode::NOT_FOUND,
            RpcFailure::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            RpcFailure::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            RpcFailure::BadRequest(_) | RpcFailure::ProtocolVersion { .. } => StatusCode::BAD_REQUEST,
            RpcFailure::GroupStopped { .. } => StatusCode::SERVICE_UNAVAILABLE,
            RpcFailure::Unfinished { .. } => StatusCode::GATEWAY_TIMEOUT,
            RpcFailure::Handler(_) => StatusCode::INTERNAL_SERVER_ERROR,
            RpcFailure::Other { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            }
        }
    }

    /// Metrics label.
    pub fn label(&self) -> &'static str {
        match self {
            RpcFailure::Unauthorized => "unauthorized",
            RpcFailure::NotFound => "not_found",
            RpcFailure::MethodNotAllowed => "method",
            RpcFailure::TooLarge { .. } => "too_large",
            RpcFailure::BadRequest(_) => "bad_request",
            RpcFailure::UnknownShard(_) => "unknown_shard",
            RpcFailure::GroupStopped { .. } => "group_stopped",
            RpcFailure::NoHandler(_) => "no_handler",
            RpcFailure::Handler(_) => "handler",
            RpcFailure::Other { .. } => "other",
            RpcFailure::ProtocolVersion { .. } => "protocol_version",
            RpcFailure::Unfinished { .. } => "unfinished",
        }
    }

    /// Reads a failure body; anything else becomes [`RpcFailure::Other`].
    pub fn from_body(status: StatusCode, body: &[u8]) -> RpcFailure {
        postcard::from_bytes(body).unwrap_or_else(|_| RpcFailure::Other {
            status: status.as_u16(),
            text: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
        })
    }
}

/// A message as postcard bytes, written out with one allocation of its size (see
/// [`twinhub_core::scratch`]): every Raft request and answer between nodes passes here.
pub fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, postcard::Error> {
    twinhub_core::scratch::postcard_vec(v)
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, postcard::Error> {
    postcard::from_bytes(bytes)
}

/// A snapshot request body: the postcard head, then the data.
pub fn encode_snapshot(head: &SnapshotHead, data: &[u8]) -> Result<Vec<u8>, postcard::Error> {
    let mut out = postcard::to_allocvec(head)?;
    out.reserve_exact(data.len());
    out.extend_from_slice(data);
    Ok(out)
}

pub fn decode_snapshot(body: &[u8]) -> Result<(SnapshotHead, &[u8]), postcard::Error> {
    postcard::take_from_bytes(body)
}

/// Several shard groups' AppendEntries to one node, in one request: every group leading on the sender
/// with a replica on the receiver shares a call, instead of one call each (an inter-node call costs
/// tens of microseconds of CPU at both ends whatever it carries).
///
/// Body: the postcard head `(wait_ms, item lengths)`, then the items back to back, each an encoded
/// [`ShardRequest`] of an `AppendEntriesRequest` exactly as the single `append` endpoint takes it, so
/// the sender encodes each group's request once, whichever way it travels. The receiver runs the
/// items concurrently (one per shard: openraft sends a group's next entries only after the answer to
/// the last) and answers after all have finished, or after `wait_ms` with the stragglers marked
/// [`RpcFailure::Unfinished`], so one slow group delays the others' answers by that much at most.
/// Answer: postcard `Vec<Result<bytes, RpcFailure>>`, one per item, in order, each `Ok` the encoded
/// `AppendEntriesResponse`.
#[derive(Debug, PartialEq, Eq)]
pub struct AppendBatch<'a> {
    pub wait_ms: u32,
    pub items: Vec<&'a [u8]>,
}

/// Most items one batch may carry: bounds what a member's one request makes the receiver run at once.
pub const MAX_BATCH_ITEMS: usize = 1024;

pub fn encode_append_batch(wait_ms: u32, items: &[&[u8]]) -> Result<Vec<u8>, postcard::Error> {
    let lens: Vec<u32> = items.iter().map(|i| u32::try_from(i.len()).unwrap_or(u32::MAX)).collect();
    let mut out = postcard::to_allocvec(&(wait_ms, lens))?;
    out.reserve_exact(items.iter().map(|i| i.len()).sum());
    for item in items {
        out.extend_from_slice(item);
    }
    Ok(out)
}

/// Why a batch body is not one.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("batch head: {0}")]
    Head(#[from] postcard::Error),
    #[error("batch of {0} items, at most {MAX_BATCH_ITEMS}")]
    TooMany(usize),
    #[error("batch items declare {declared} bytes, the body holds {actual}")]
    Length { declared: u64, actual: usize },
}

pub fn decode_append_batch(body: &[u8]) -> Result<AppendBatch<'_>, BatchError> {
    let ((wait_ms, lens), mut rest): ((u32, Vec<u32>), &[u8]) = postcard::take_from_bytes(body)?;
    if lens.len() > MAX_BATCH_ITEMS {
        return Err(BatchError::TooMany(lens.len()));
    }
    let declared: u64 = lens.iter().map(|l| u64::from(*l)).sum();
    if declared != rest.len() as u64 {
        return Err(BatchError::Length { declared, actual: rest.len() });
    }
    let mut items = Vec::with_capacity(lens.len());
    for len in lens {
        let (item, tail) = rest.split_at(len as usize);
        items.push(item);
        rest = tail;
    }
    Ok(AppendBatch { wait_ms, items })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_endpoints_round_trip_and_reject_strangers() {
        for k in RaftKind::ALL {
            let ep = Endpoint::Raft(k);
            assert_eq!(Endpoint::parse(&ep.path()), Some(ep));
        }
        let call = Endpoint::Call("twin.write".into());
        assert_eq!(Endpoint::parse(&call.path()), Some(call));
        for bad in ["/cluster/v5/raft/nope", "/cluster/v5/call/", "/cluster/v5/call/a/b", "/cluster/v5/call/%20", "/x"]
        {
            assert_eq!(Endpoint::parse(bad), None, "{bad}");
        }
        // Earlier versions' paths are no endpoints any more, and are recognised as another version.
        assert_eq!(Endpoint::parse("/cluster/v2/call/node.status"), None);
        assert!(
            other_version("/cluster/v2/call/node.status")
                && other_version("/cluster/v3/raft/vote")
                && other_version("/cluster/v4/raft/vote")
        );
        assert!(!other_version("/cluster/v5/call/twin.write") && !other_version("/x"));
        assert!(
            RAFT_PREFIX.contains(&format!("/v{PROTOCOL_VERSION}/"))
                && CALL_PREFIX.contains(&format!("/v{PROTOCOL_VERSION}/"))
        );
    }

    #[test]
    fn test_append_batch_round_trips_and_refuses_bad_framing() {
        let items: [&[u8]; 3] = [b"first", b"", &[7u8; 300]];
        let body = encode_append_batch(40, &items).expect("encode");
        assert_eq!(decode_append_batch(&body).expect("decode"), AppendBatch { wait_ms: 40, items: items.to_vec() });
        // Every truncation and one byte too many are refused, never misread.
        for cut in 0..body.len() {
            assert!(decode_append_batch(&body[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = body.clone();
        long.push(0);
        assert!(matches!(decode_append_batch(&long), Err(BatchError::Length { .. })));
        let huge = postcard::to_allocvec(&(1u32, vec![0u32; MAX_BATCH_ITEMS + 1])).expect("encode");
        assert!(matches!(decode_append_batch(&huge), Err(BatchError::TooMany(_))));
        let lying = postcard::to_allocvec(&(1u32, vec![u32::MAX, u32::MAX])).expect("encode");
        assert!(matches!(decode_append_batch(&lying), Err(BatchError::Length { .. })));
    }

    #[test]
    fn test_failure_body_round_trips() {
        let f = RpcFailure::UnknownShard(4);
        let body = encode(&f).expect("encode");
        assert_eq!(RpcFailure::from_body(f.status(), &body), f);
        let other = RpcFailure::from_body(StatusCode::BAD_GATEWAY, b"\xffproxy says no");
        assert!(matches!(other, RpcFailure::Other { status: 502, .. }), "{other:?}");
    }
}
