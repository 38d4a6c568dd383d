//! What travels between nodes: endpoints, postcard envelopes and the failure body of a refused request.
//!
//! One endpoint per RPC kind (`POST /cluster/v2/raft/{append|vote|prevote|snapshot|transfer-leader}`)
//! so metrics, limits and logs name the kind without decoding, and `POST /cluster/v2/call/{name}` for
//! anything else a node asks another (request forwarding). Bodies are postcard: compact, and every
//! payload of ours is postcard-safe (JSON documents travel as strings).
//!
//! # Versions
//! [`PROTOCOL_VERSION`] is in every path, in the signature domains (see [`super::auth`]) and in the
//! [`HEADER_PROTO`] header of every answer, so nodes of different versions refuse each other at once
//! and say why ([`RpcFailure::ProtocolVersion`], `TransportError::Protocol`) rather than half-work.
//! Version 2 signs requests and responses in separate domains, with nonces, and the body's length and
//! digest in the headers; version 1 nodes cannot talk to it.

use std::borrow::Cow;

use hyper::StatusCode;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::ids::ShardId;
use crate::storage::types::{SnapshotMeta, Vote};

/// The inter-node protocol this build speaks; bump it with any incompatible change.
pub const PROTOCOL_VERSION: u32 = 2;
/// Every answer (signed or not) says which protocol version the node speaks, for diagnosis only: it
/// is not authenticated and decides nothing but the error message.
pub const HEADER_PROTO: &str = "x-twinhub-proto";
pub const RAFT_PREFIX: &str = "/cluster/v2/raft/";
pub const CALL_PREFIX: &str = "/cluster/v2/call/";
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
}

impl RaftKind {
    pub const ALL: [RaftKind; 5] =
        [RaftKind::Append, RaftKind::Vote, RaftKind::PreVote, RaftKind::Snapshot, RaftKind::TransferLeader];

    /// Path segment and metrics label.
    pub fn name(self) -> &'static str {
        match self {
            RaftKind::Append => "append",
            RaftKind::Vote => "vote",
            RaftKind::PreVote => "prevote",
            RaftKind::Snapshot => "snapshot",
            RaftKind::TransferLeader => "transfer-leader",
        }
    }
}

/// The generic inter-node calls (`POST /cluster/v2/call/{name}`), each served by one handler. The
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
    /// `serde_json((NodeId, addr))` in, `serde_json(Result<(), ShardError>)` out.
    ClusterJoin,
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
    pub const ALL: [Call; 10] = [
        Call::TwinWrite,
        Call::TwinWrites,
        Call::TwinRead,
        Call::MetaWrite,
        Call::ReadIndex,
        Call::NodeStatus,
        Call::ShardDropped,
        Call::ClusterJoin,
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

pub fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_allocvec(v)
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
        for bad in ["/cluster/v2/raft/nope", "/cluster/v2/call/", "/cluster/v2/call/a/b", "/cluster/v2/call/%20", "/x"]
        {
            assert_eq!(Endpoint::parse(bad), None, "{bad}");
        }
        // The version 1 paths are no endpoints any more, and are recognised as another version.
        assert_eq!(Endpoint::parse("/cluster/v1/call/node.status"), None);
        assert!(other_version("/cluster/v1/call/node.status") && other_version("/cluster/v3/raft/vote"));
        assert!(!other_version("/cluster/v2/call/twin.write") && !other_version("/x"));
        assert!(
            RAFT_PREFIX.contains(&format!("/v{PROTOCOL_VERSION}/"))
                && CALL_PREFIX.contains(&format!("/v{PROTOCOL_VERSION}/"))
        );
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
