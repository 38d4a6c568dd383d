//! Raft networking of the shard groups.
//!
//! Shaped for openraft-multi: one [`ShardRouter`] per node is shared by every group (so there is one
//! connection per peer node, carrying the shard id with each RPC), and each group's
//! [`NetworkFactory`] is a `GroupNetworkFactory` binding that router to its shard id. The router sends
//! over the node's [`Transport`]; `ShardRouter::default()` has none (single-voter groups), and every
//! send is `Unreachable`.
//!
//! This is the one place where transport errors become openraft's: `Unreachable` when the peer is
//! known not to serve (no address, connect refused, in backoff, shard not hosted there, group stopped),
//! so openraft backs off; `Timeout` when the deadline passed; `Network` for the rest (a connection that
//! broke mid-request, an undecodable answer), which openraft retries at once.

use std::future::Future;
use std::time::Duration;

use futures::Stream;
use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable};
use openraft::network::v2::RaftNetworkV2;
use openraft::network::{stream_append_sequential, Backoff, RPCOption, RPCTypes, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult, TransferLeaderRequest,
    TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::OptionalSend;
use openraft_multi::{GroupNetworkAdapter, GroupNetworkFactory, GroupRouter};

use super::append_stream;
use super::types::{Node, Snapshot, SnapshotData, TypeConfig, Vote};
use crate::cluster::transport::{Transport, TransportError};
use crate::ids::{NodeId, ShardId};
use crate::metric_handles::HandleCache;

/// The node's outgoing Raft transport, shared by all shard groups.
#[derive(Clone, Debug, Default)]
pub struct ShardRouter {
    /// `None` for single-voter groups: there is nobody to talk to.
    transport: Option<Transport>,
    /// This copy carries a group's heartbeats (see [`append_deadline`]).
    heartbeats: bool,
}

/// Why a send failed: there is no transport to that node (yet).
#[derive(Debug, thiserror::Error)]
#[error("no route to node {node} for shard {shard}: groups are single-voter")]
pub struct NoRoute {
    pub node: NodeId,
    pub shard: ShardId,
}

impl ShardRouter {
    /// A router sending over `transport`.
    pub fn new(transport: Transport) -> ShardRouter {
        ShardRouter { transport: Some(transport), heartbeats: false }
    }

    pub fn transport(&self) -> Option<&Transport> {
        self.transport.as_ref()
    }

    fn transport_to(&self, node: NodeId, shard: ShardId) -> Result<&Transport, Unreachable<TypeConfig>> {
        self.transport.as_ref().ok_or_else(|| Unreachable::new(&NoRoute { node, shard }))
    }

    /// Maps a transport error to openraft's retry classes (see the module doc).
    fn rpc_error(&self, target: NodeId, action: RPCTypes, e: TransportError) -> RPCError<TypeConfig> {
        if let Some(timeout) = e.timeout() {
            let id = self.transport.as_ref().map_or(0, Transport::node_id);
            RPCError::Timeout(Timeout { action, id, target, timeout })
        } else if e.is_unreachable() {
            RPCError::Unreachable(Unreachable::new(&e))
        } else {
            RPCError::Network(NetworkError::new(&e))
        }
    }
}

/// The transport deadline of an openraft RPC: the soft TTL, so the transport reports `Timeout` before
/// openraft abandons the call at the hard TTL.
fn deadline(option: &RPCOption) -> Duration {
    option.soft_ttl()
}

/// The deadline of a replication `AppendEntries`: four soft TTLs (300 ms at the default 100 ms
/// heartbeat). openraft gives every append the heartbeat interval, but under load a follower's answer
/// waits for its turn at the node's storage writer, and near saturation that passes 75 ms: each such
/// timeout ends the follower's replication stream and sends its entries again, more work exactly when
/// the nodes have least to spare. Nothing waits on this deadline for safety: a commit needs only the
/// fastest majority, and a dead peer is found sooner by its connection (refused connects,
/// keep-alive) than by a timeout.
///
/// Heartbeats (and the lease probes of linearizable reads) come through the group's heartbeat client
/// instead: they keep the soft TTL, and go as calls of their own rather than through the peer's
/// append queue. A heartbeat in a batch would cut the whole batch's deadline to its own (the
/// receiver answers a batch at half its earliest deadline), and openraft wants them free of
/// replication backpressure anyway; at one per group and follower every 100 ms they are few.
fn append_deadline(heartbeat: bool, option: &RPCOption) -> Duration {
    if heartbeat {
        deadline(option)
    } else {
        deadline(option) * 4
    }
}

/// Counts an outgoing `AppendEntries` by what it carries: heartbeats, entries, or neither (the
/// replication stream telling a follower a new commit index it had no entry to ride on). Entries
/// per append is how much each Raft round is shared.
fn count_append(heartbeat: bool, entries: usize) {
    static SENT: HandleCache<&'static str, metrics::Counter> = HandleCache::new();
    static ENTRIES: HandleCache<(), metrics::Counter> = HandleCache::new();
    let carries = match (heartbeat, entries) {
        (true, _) => "heartbeat",
        (false, 0) => "commit",
        (false, _) => "entries",
    };
    SENT.get(carries, |c| metrics::counter!("twinhub_raft_appends_sent_total", "carries" => *c)).increment(1);
    if entries > 0 {
        ENTRIES.get((), |_| metrics::counter!("twinhub_raft_entries_sent_total")).increment(entries as u64);
    }
}

impl GroupRouter<TypeConfig, ShardId> for ShardRouter {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &self,
        target: NodeId,
        shard: ShardId,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let t = self.transport_to(target, shard)?;
        count_append(self.heartbeats, rpc.entries.len());
        let deadline = append_deadline(self.heartbeats, &option);
        let answer = if self.heartbeats {
            t.heartbeat(target, shard, rpc, deadline).await
        } else {
            t.append_entries(target, shard, rpc, deadline).await
        };
        answer.map_err(|e| self.rpc_error(target, RPCTypes::AppendEntries, e))
    }

    async fn vote(
        &self,
        target: NodeId,
        shard: ShardId,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let t = self.transport_to(target, shard)?;
        t.vote(target, shard, rpc, deadline(&option)).await.map_err(|e| self.rpc_error(target, RPCTypes::Vote, e))
    }

    async fn pre_vote(
        &self,
        target: NodeId,
        shard: ShardId,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let t = self.transport_to(target, shard)?;
        t.pre_vote(target, shard, rpc, deadline(&option)).await.map_err(|e| self.rpc_error(target, RPCTypes::Vote, e))
    }

    /// Sends the whole snapshot in one request; gives up as soon as `cancel` fires (replication to the
    /// target closed, e.g. leadership lost), dropping the in-flight request.
    async fn full_snapshot(
        &self,
        target: NodeId,
        shard: ShardId,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let t = self.transport_to(target, shard)?;
        tokio::select! {
            res = t.full_snapshot(target, shard, vote, snapshot, deadline(&option)) => {
                res.map_err(|e| self.rpc_error(target, RPCTypes::InstallSnapshot, e).into())
            }
            closed = cancel => Err(StreamingError::Closed(closed)),
        }
    }

    async fn transfer_leader(
        &self,
        target: NodeId,
        shard: ShardId,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let t = self.transport_to(target, shard)?;
        t.transfer_leader(target, shard, req, deadline(&option))
            .await
            .map_err(|e| self.rpc_error(target, RPCTypes::TransferLeader, e))
    }
}

/// One shard group's network factory: the shared router bound to the shard id.
pub type NetworkFactory = GroupNetworkFactory<ShardRouter, ShardId>;

/// The connection of one group to one peer: openraft-multi's adapter, whose replication stream lets
/// entry-less appends ride with the entries that follow (see [`append_stream`](super::append_stream)).
pub struct Network {
    inner: GroupNetworkAdapter<TypeConfig, ShardId, ShardRouter>,
    /// Heartbeats go as they come: each one is the point.
    heartbeats: bool,
}

impl RaftNetworkV2<TypeConfig> for Network {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.inner.append_entries(rpc, option).await
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>, RPCError<TypeConfig>>,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        if self.heartbeats {
            stream_append_sequential(&mut self.inner, input, option)
        } else {
            append_stream::stream_append(&mut self.inner, input, option)
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.inner.vote(rpc, option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.inner.pre_vote(rpc, option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        self.inner.full_snapshot(vote, snapshot, cancel, option).await
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.inner.transfer_leader(req, option).await
    }

    fn backoff(&self) -> Option<Backoff> {
        self.inner.backoff()
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Network;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> Self::Network {
        client(self, target, node, false)
    }

    /// A client whose appends are heartbeats: short deadline, sent alone (see [`append_deadline`]).
    async fn new_heartbeat_client(&mut self, target: NodeId, node: &Node) -> Self::Network {
        client(self, target, node, true)
    }
}

/// A group's client to `target`. Also where the router learns peer addresses: membership records each
/// node's address, and openraft asks for a client for every target it is about to talk to.
fn client(factory: &NetworkFactory, target: NodeId, node: &Node, heartbeats: bool) -> Network {
    if let Some(t) = &factory.factory.transport {
        t.peers().learn(target, &node.addr);
    }
    let router = ShardRouter { heartbeats, ..factory.factory.clone() };
    Network { inner: GroupNetworkAdapter::new(router, target, factory.group_id), heartbeats }
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
