//! Raft networking of the shard groups.
//!
//! Shaped for openraft-multi: one [`ShardRouter`] per node is shared by every group (so the cluster
//! issue keeps one HTTP/2 connection per peer node, carrying the shard id with each RPC), and each
//! group's [`NetworkFactory`] is a `GroupNetworkFactory` binding that router to its shard id. Groups are
//! single-voter today, so the router knows no peer and every send returns `Unreachable`; plugging in
//! the transport means giving `ShardRouter` a peer table and implementing these methods over it.

use std::future::Future;

use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse};
use openraft::OptionalSend;
use openraft_multi::{GroupNetworkAdapter, GroupNetworkFactory, GroupRouter};

use super::types::{Node, Snapshot, SnapshotData, TypeConfig, Vote};
use crate::ids::{NodeId, ShardId};

/// The node's outgoing Raft transport, shared by all shard groups.
#[derive(Clone, Debug, Default)]
pub struct ShardRouter {}

/// Why a send failed: there is no transport to that node (yet).
#[derive(Debug, thiserror::Error)]
#[error("no route to node {node} for shard {shard}: groups are single-voter")]
pub struct NoRoute {
    pub node: NodeId,
    pub shard: ShardId,
}

impl ShardRouter {
    fn unreachable(&self, node: NodeId, shard: ShardId) -> Unreachable<TypeConfig> {
        Unreachable::new(&NoRoute { node, shard })
    }
}

impl GroupRouter<TypeConfig, ShardId> for ShardRouter {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &self,
        target: NodeId,
        shard: ShardId,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        Err(RPCError::Unreachable(self.unreachable(target, shard)))
    }

    async fn vote(
        &self,
        target: NodeId,
        shard: ShardId,
        _rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        Err(RPCError::Unreachable(self.unreachable(target, shard)))
    }

    async fn pre_vote(
        &self,
        target: NodeId,
        shard: ShardId,
        _rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        Err(RPCError::Unreachable(self.unreachable(target, shard)))
    }

    async fn full_snapshot(
        &self,
        target: NodeId,
        shard: ShardId,
        _vote: Vote,
        _snapshot: Snapshot,
        _cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        Err(StreamingError::Unreachable(self.unreachable(target, shard)))
    }
}

/// One shard group's network factory: the shared router bound to the shard id.
pub type NetworkFactory = GroupNetworkFactory<ShardRouter, ShardId>;

/// The connection of one group to one peer.
pub type Network = GroupNetworkAdapter<TypeConfig, ShardId, ShardRouter>;

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Network;

    async fn new_client(&mut self, target: NodeId, _node: &Node) -> Self::Network {
        GroupNetworkAdapter::new(self.factory.clone(), target, self.group_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::network::v2::RaftNetworkV2;

    #[tokio::test]
    async fn sends_to_unknown_peers_are_unreachable() {
        let mut factory = NetworkFactory::new(ShardRouter::default(), 3);
        let mut net = factory.new_client(7, &Node::default()).await;
        let vote = openraft::impls::Vote::new(1, 1);
        let req = VoteRequest::new(vote, None);
        let err = RaftNetworkV2::vote(&mut net, req, RPCOption::new(std::time::Duration::from_secs(1))).await;
        match err {
            Err(RPCError::Unreachable(u)) => assert!(u.to_string().contains("node 7"), "{u}"),
            other => panic!("expected Unreachable, got {other:?}"),
        }
    }
}
