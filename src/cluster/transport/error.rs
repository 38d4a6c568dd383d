//! Errors of the transport client. The shard layer maps them to openraft's three network outcomes in
//! one place (`shard::network`): the distinction drives openraft's retry policy.

use std::sync::Arc;
use std::time::Duration;

use super::auth::AuthError;
use super::wire::RpcFailure;
use crate::ids::NodeId;

/// Cloneable (sources behind `Arc`): one failed batch call is every batched request's failure.
#[derive(Clone, Debug, thiserror::Error)]
pub enum TransportError {
    /// No address is known for the node (not in any membership this node has seen).
    #[error("node {0} is not in the peer table")]
    UnknownPeer(NodeId),
    /// Recent connects to the node failed: fail fast instead of waiting for another connect timeout.
    #[error("node {node} at {addr} is unreachable ({failures} failed connects), next attempt in {retry_in:?}")]
    Backoff { node: NodeId, addr: String, failures: u32, retry_in: Duration },
    /// Connecting (TCP or the TLS handshake) failed; the node enters backoff.
    #[error("connecting to node {node} at {addr}: {source}")]
    Connect {
        node: NodeId,
        addr: String,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// No answer within the deadline. The request may or may not have been processed.
    #[error("no answer from node {node} within {after:?}")]
    Timeout { node: NodeId, after: Duration },
    /// The connection failed while the request was in flight; the next request reconnects.
    #[error("connection to node {node} failed: {source}")]
    Connection {
        node: NodeId,
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The peer refused or failed the request.
    #[error("node {node} answered: {failure}")]
    Remote { node: NodeId, failure: RpcFailure },
    /// The answer was not signed by the node we asked: a stranger, or another node at that address.
    #[error("answer from node {node} failed authentication: {source}")]
    ResponseAuth {
        node: NodeId,
        #[source]
        source: AuthError,
    },
    /// The answer lacks this protocol version's marker: the node runs another release (or something
    /// else listens at its address). Nothing in it was trusted.
    #[error(
        "node {node} answered HTTP {status} for cluster protocol version {}, this node speaks {}: every node must run the same release",
        theirs.as_deref().unwrap_or("(none)"),
        super::wire::PROTOCOL_VERSION
    )]
    Protocol { node: NodeId, status: u16, theirs: Option<String> },
    #[error("encoding a request: {0}")]
    Encode(#[source] postcard::Error),
    #[error("undecodable answer from node {node}: {msg}")]
    Decode { node: NodeId, msg: String },
}

impl TransportError {
    /// The node is known not to serve this request now: openraft should back off before retrying
    /// (`Unreachable`) rather than retry at once.
    pub fn is_unreachable(&self) -> bool {
        match self {
            TransportError::UnknownPeer(_) | TransportError::Backoff { .. } | TransportError::Connect { .. } => true,
            TransportError::Remote { failure, .. } => {
                matches!(failure, RpcFailure::UnknownShard(_) | RpcFailure::GroupStopped { .. })
            }
            _ => false,
        }
    }

    /// The deadline passed: the outcome is unknown.
    pub fn timeout(&self) -> Option<Duration> {
        match self {
            TransportError::Timeout { after, .. } => Some(*after),
            _ => None,
        }
    }

    /// Metrics label.
    pub fn label(&self) -> &'static str {
        match self {
            TransportError::UnknownPeer(_) => "unknown_peer",
            TransportError::Backoff { .. } => "backoff",
            TransportError::Connect { .. } => "connect",
            TransportError::Timeout { .. } => "timeout",
            TransportError::Connection { .. } => "connection",
            TransportError::Remote { failure, .. } => failure.label(),
            TransportError::ResponseAuth { .. } => "response_auth",
            TransportError::Protocol { .. } => "protocol_version",
            TransportError::Encode(_) => "encode",
            TransportError::Decode { .. } => "decode",
        }
    }
}
