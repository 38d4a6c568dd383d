//! The openraft type configuration shared by every shard group, and the write responder that lets a
//! pipelined proposal answer its caller straight from the apply path.

use std::fmt;
use std::sync::Arc;

use openraft::raft::responder::Responder;
use openraft::OptionalSend;
use serde::{Deserialize, Serialize};

use crate::ids::NodeId;
use crate::model::{Applied, Command};

/// A cluster member as Raft membership records it. The address is empty while groups are single-voter;
/// a cluster fills it with the node's Raft/HTTP2 endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub addr: String,
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Node({})", self.addr)
    }
}

/// Types of every shard's Raft group: twin commands in, apply outcomes out. Written by hand rather
/// than with `declare_raft_types!`, which cannot name a generic `Responder<T>`.
#[derive(Debug, Clone, Copy, Default, Eq, PartialEq, Ord, PartialOrd)]
pub struct TypeConfig {}

impl openraft::RaftTypeConfig for TypeConfig {
    /// Shared, so that the log cache, replication and apply hand an entry around without copying
    /// its command (serialized exactly as a bare `Command`: the log and wire formats are unchanged).
    type D = Arc<Command>;
    type R = Applied;
    type NodeId = NodeId;
    type Node = Node;
    type Term = u64;
    type LeaderId = openraft::impls::leader_id_adv::LeaderId<u64, NodeId>;
    type Vote = openraft::impls::Vote<Self::LeaderId>;
    type Payload = openraft::EntryPayload<Arc<Command>, NodeId, Node>;
    type Entry = openraft::Entry<<Self::LeaderId as openraft::vote::RaftLeaderId>::Committed, Self::Payload>;
    type AsyncRuntime = openraft::TokioRuntime;
    type Responder<T>
        = ShardResponder<T>
    where
        T: OptionalSend + 'static;
    type Batch<T>
        = openraft::impls::InlineBatch<T>
    where
        T: OptionalSend + 'static;
    type ErrorSource = openraft::impls::BoxedErrorSource;
}

/// Snapshot payload of a shard: `SnapshotImage::encode` bytes (meta travels separately).
pub type SnapshotData = Vec<u8>;

pub type Raft = openraft::Raft<TypeConfig, super::state_machine::StateMachine>;
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotData>;
pub type ClientWriteResult = openraft::raft::ClientWriteResult<TypeConfig>;

/// Completion callback of one proposal. Called with `Some(result)` when openraft completes the write,
/// or `None` if the responder is dropped unanswered (the group stopped before applying it), so a
/// pipelined caller is always answered instead of waiting on a channel nobody will ever fill.
pub struct ShardResponder<T> {
    callback: Option<Box<dyn FnOnce(Option<T>) + Send + 'static>>,
}

impl<T> ShardResponder<T> {
    pub fn new(callback: impl FnOnce(Option<T>) + Send + 'static) -> Self {
        ShardResponder { callback: Some(Box::new(callback)) }
    }
}

impl<T> Responder<TypeConfig, T> for ShardResponder<T>
where
    T: OptionalSend + 'static,
{
    fn on_complete(mut self, result: T) {
        if let Some(cb) = self.callback.take() {
            cb(Some(result));
        }
    }
}

impl<T> Drop for ShardResponder<T> {
    fn drop(&mut self) {
        if let Some(cb) = self.callback.take() {
            cb(None);
        }
    }
}
