//! One shard's handle: its Raft group and applied state, pipelined writes handed to Raft in call
//! order, and linearizable reads (a local read index, or the leader's over the transport).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::async_runtime::watch::WatchReceiver;
use openraft::error::{ClientWriteError, LinearizableReadError, RaftError};
use openraft::ReadPolicy;
use tokio::sync::oneshot;

use super::error::{fatal_error, write_error, ShardError};
use super::state_machine::SharedState;
use super::types::{ClientWriteResult, Node, Raft, ShardResponder, TypeConfig};
use super::ShardStatus;
use crate::cluster::transport::Call;
use crate::ids::{NodeId, ShardId};
use crate::model::{Applied, Command, ShardState};

/// How long `write` and `read` wait before answering `Timeout` (the request may still apply).
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

const REMOTE_READ_TIMEOUT: Duration = Duration::from_secs(5);

type Reply = oneshot::Sender<Result<Applied, ShardError>>;

/// One shard: its Raft group and its applied state.
pub struct Shard {
    pub id: ShardId,
    pub(super) node_id: NodeId,
    pub(super) raft: Raft,
    pub(super) transport: Option<crate::cluster::transport::Transport>,
    pub(super) state: SharedState,
    /// Progress toward its next snapshot (see [`Shards::snapshot_heavy_groups`](super::Shards)).
    pub(super) work: Arc<crate::storage::state_machine::SnapshotWork>,
    /// Set when the node closes the replica (shutdown, or the shard moved away): later pipelined
    /// proposals are refused at once instead of reaching a group that is stopping.
    pub(super) closed: AtomicBool,
    /// Shares one log entry between the pipelined writes that queue up under load; `None`: every
    /// write is an entry of its own.
    pub(super) proposer: Option<super::proposer::Proposer>,
}

impl Shard {
    /// Proposes a command and waits until it is committed (durable on a majority) and applied.
    pub async fn write(&self, cmd: Command) -> Result<Applied, ShardError> {
        match tokio::time::timeout(REQUEST_TIMEOUT, self.raft.client_write(Arc::new(cmd))).await {
            Err(_) => Err(ShardError::Timeout { shard: self.id }),
            Ok(Ok(resp)) => Ok(resp.data),
            Ok(Err(RaftError::APIError(e))) => Err(write_error(self.id, e)),
            Ok(Err(RaftError::Fatal(f))) => Err(fatal_error(self.id, &f)),
        }
    }

    /// Proposes without waiting for the commit: `reply` receives the outcome after commit and apply.
    /// This is how twin actors pipeline. It returns once the proposal is queued (in the shard's
    /// batching proposer, or in Raft's input channel), so commands proposed one after the other (each
    /// call awaited, as an actor does) are applied in that order; a full queue holds the caller back.
    pub async fn write_pipelined(&self, cmd: Command, reply: Reply) {
        if self.closed.load(Ordering::Acquire) {
            let _ = reply.send(Err(ShardError::ShuttingDown { shard: self.id }));
            return;
        }
        if let Some(proposer) = &self.proposer {
            return proposer.propose(self.id, cmd, reply).await;
        }
        let (shard, raft) = (self.id, self.raft.clone());
        let responder = ShardResponder::new(move |res: Option<ClientWriteResult>| {
            let _ = reply.send(Shard::outcome(&raft, shard, res));
        });
        // On a fatal error the responder is dropped unanswered and reports why itself.
        let _ = self.raft.client_write_ff(Arc::new(cmd), Some(responder)).await;
    }

    /// Refuses every later pipelined proposal (see [`Shard::write_pipelined`]).
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// A linearizable read of the applied state: on the leader a read index; on a follower the
    /// leader's read index fetched over the transport, then a wait until this replica has applied up to
    /// it (so any replica answers what a majority has committed, without moving the request).
    pub async fn read<R>(&self, f: impl FnOnce(&ShardState) -> R) -> Result<R, ShardError> {
        self.linearize().await?;
        Ok(self.read_local(f))
    }

    /// Waits until a read of this replica's applied state is linearizable (see [`Shard::read`]).
    pub async fn linearize(&self) -> Result<(), ShardError> {
        match self.read_index().await {
            Ok(_) => Ok(()),
            Err(ShardError::NotLeader { leader: Some(leader), .. })
                if leader != self.node_id && self.transport.is_some() =>
            {
                let index = self.remote_read_index(leader).await?;
                if let Some(index) = index {
                    self.raft
                        .wait(Some(REQUEST_TIMEOUT))
                        .applied_index_at_least(Some(index), "read index applied")
                        .await
                        .map_err(|_| ShardError::Timeout { shard: self.id })?;
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The leader's read index: the log index a linearizable read must have applied.
    pub async fn read_index(&self) -> Result<Option<u64>, ShardError> {
        let check = self.raft.ensure_linearizable(ReadPolicy::ReadIndex);
        match tokio::time::timeout(REQUEST_TIMEOUT, check).await {
            Err(_) => Err(ShardError::Timeout { shard: self.id }),
            Ok(Ok(read)) => Ok(Some(read.log_id().index)),
            Ok(Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(fwd)))) => {
                Err(ShardError::NotLeader { shard: self.id, leader: fwd.leader_id })
            }
            Ok(Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_)))) => {
                Err(ShardError::Timeout { shard: self.id })
            }
            Ok(Err(RaftError::Fatal(f))) => Err(fatal_error(self.id, &f)),
        }
    }

    async fn remote_read_index(&self, leader: NodeId) -> Result<Option<u64>, ShardError> {
        let Some(t) = &self.transport else {
            return Err(ShardError::NotLeader { shard: self.id, leader: Some(leader) });
        };
        let body =
            postcard::to_allocvec(&self.id).map_err(|e| ShardError::Fatal { shard: self.id, msg: e.to_string() })?;
        let answer = t.call(leader, Call::ReadIndex, body.into(), Some(REMOTE_READ_TIMEOUT)).await.map_err(|e| {
            tracing::debug!(shard = self.id, leader, "remote read index: {e}");
            ShardError::NotLeader { shard: self.id, leader: None }
        })?;
        let r: Result<Option<u64>, ShardError> =
            postcard::from_bytes(&answer).map_err(|e| ShardError::Fatal { shard: self.id, msg: e.to_string() })?;
        r
    }

    /// Makes `node` a voter of this shard: first a learner that has caught up (blocking), then a voter,
    /// one membership change at a time as openraft requires. Idempotent. Leader only.
    pub async fn add_voter(&self, node: NodeId, addr: &str) -> Result<(), ShardError> {
        let voters: Vec<NodeId> =
            self.raft.metrics().borrow_watched().membership_config.membership().voter_ids().collect();
        if voters.contains(&node) {
            return Ok(());
        }
        let step = |r: Result<_, RaftError<TypeConfig, ClientWriteError<TypeConfig>>>| match r {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(e)) => Err(write_error(self.id, e)),
            Err(RaftError::Fatal(f)) => Err(fatal_error(self.id, &f)),
        };
        step(self.raft.add_learner(node, Node { addr: addr.to_string() }, true).await)?;
        step(self.raft.change_membership(openraft::ChangeMembers::AddVoterIds([node].into()), false).await)
    }

    /// Removes `node` from this shard's voters (and from its learners). Idempotent. Leader only.
    pub async fn remove_voter(&self, node: NodeId) -> Result<(), ShardError> {
        let m = self.raft.metrics().borrow_watched().membership_config.clone();
        let is_voter = m.membership().voter_ids().any(|v| v == node);
        let is_learner = m.membership().learner_ids().any(|v| v == node);
        if !is_voter && !is_learner {
            return Ok(());
        }
        let r = self.raft.change_membership(openraft::ChangeMembers::RemoveVoters([node].into()), false).await;
        match r {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(e)) => Err(write_error(self.id, e)),
            Err(RaftError::Fatal(f)) => Err(fatal_error(self.id, &f)),
        }
    }

    /// The current leader as this replica knows it.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow_watched().current_leader
    }

    /// Whether this node leads the shard now.
    pub fn is_leader(&self) -> bool {
        self.leader() == Some(self.node_id)
    }

    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Reads the local applied state without a linearizability check.
    pub fn read_local<R>(&self, f: impl FnOnce(&ShardState) -> R) -> R {
        let applied = self.state.read().unwrap_or_else(|e| e.into_inner());
        f(&applied.state)
    }

    /// What a pipelined write's caller is answered, from what openraft completed its entry with
    /// (`None`: the entry's responder was dropped unanswered, as the group stopped).
    pub(super) fn outcome(raft: &Raft, shard: ShardId, res: Option<ClientWriteResult>) -> Result<Applied, ShardError> {
        match res {
            Some(Ok(resp)) => Ok(resp.data),
            Some(Err(e)) => Err(write_error(shard, e)),
            None => Err(Shard::stopped_error(raft, shard)),
        }
    }

    /// Why the group stopped, if it did: a storage failure is reported as such, not as a shutdown.
    fn stopped_error(raft: &Raft, shard: ShardId) -> ShardError {
        match &raft.metrics().borrow_watched().running_state {
            Err(f) => fatal_error(shard, f),
            Ok(()) => ShardError::ShuttingDown { shard },
        }
    }
}

impl Shard {
    /// This replica's view of its group (without the node's snapshot policy, see `Shards::status`).
    pub fn status(&self) -> ShardStatus {
        let m = self.raft.metrics().borrow_watched().clone();
        let membership = m.membership_config.membership();
        let last = m.last_log_index.unwrap_or(0);
        ShardStatus {
            shard: self.id,
            leader: m.current_leader,
            is_leader: m.current_leader == Some(self.node_id),
            term: m.current_term,
            last_log_index: last,
            committed: m.local_committed.map(|l| l.index).unwrap_or(0),
            applied: m.last_applied.map(|l| l.index).unwrap_or(0),
            voters: membership.voter_ids().collect(),
            learners: membership.learner_ids().collect(),
            lag: m
                .replication
                .as_ref()
                .map(|r| r.iter().map(|(n, l)| (*n, last.saturating_sub(l.map(|l| l.index).unwrap_or(0)))).collect())
                .unwrap_or_default(),
            healthy: m.running_state.is_ok(),
            snapshot_index: m.snapshot.map(|l| l.index).unwrap_or(0),
            writes_since_snapshot: self.work.since_snapshot(),
            // The policy is the node's: `Shards::status` fills it in.
            snapshot_due_writes: 0,
        }
    }
}
