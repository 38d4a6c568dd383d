//! One call per peer for every group's AppendEntries.
//!
//! Each shard group replicates on its own: openraft sends a group's next AppendEntries to a follower
//! only after the answer to its last, so with tens of groups leading on a node there are as many
//! requests in flight to each peer. An inter-node call costs tens of microseconds of CPU at both ends
//! (framing, header maps, the signature) whatever it carries, so the requests to one peer queue
//! here and leave together: at most [`TransportConfig::append_calls_in_flight`] calls per peer carry
//! whatever has queued while the previous ones were out, as one `append-batch` request (a single
//! queued request travels alone, as a plain `append`). An idle peer's first request leaves at once:
//! batching only ever forms under load, and never waits for company.
//!
//! A call that stays out longer than [`STALL`] gives up its slot (it goes on, and still answers its
//! requests), so one slow call does not hold every group's replication to that peer behind it; the
//! receiver bounds it the same way, answering a batch after half its deadline at most with the
//! stragglers marked unfinished (see [`wire::AppendBatch`]).
//!
//! With no slots configured (`raft_append_calls_per_peer = 0`) every AppendEntries is a call of its
//! own, as before batching existed.
//!
//! A peer of an older release has no batch endpoint: it answers 404, and the requests go one by one
//! to it for a while ([`RETRY_BATCHES_AFTER`]) before batches are tried again.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::peers::Peer;
use super::wire::{self, Endpoint, RaftKind, RpcFailure};
use super::{Transport, TransportError};
use crate::ids::NodeId;

/// A call out this long no longer holds one of the peer's slots.
pub const STALL: Duration = Duration::from_millis(25);
/// How long requests go one by one to a peer that has no batch endpoint before batches are retried.
pub const RETRY_BATCHES_AFTER: Duration = Duration::from_secs(60);

/// The answer to one queued request: the encoded `AppendEntriesResponse`.
type Answer = Result<Bytes, TransportError>;

/// One group's AppendEntries waiting for a call.
struct Queued {
    /// The encoded `ShardRequest`, as the single `append` endpoint takes it.
    body: Bytes,
    deadline: Instant,
    reply: oneshot::Sender<Answer>,
}

/// A peer's queue of AppendEntries and its call slots; lives in the peer's entry, so a changed
/// address starts afresh.
#[derive(Default)]
pub(crate) struct AppendQueue {
    state: Mutex<State>,
    /// Calls that carried more than one request.
    batch_calls: AtomicU64,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Queued>,
    /// Calls out that hold a slot (a stalled one has given its slot up).
    calls: usize,
    /// Until then the peer gets single requests: it answered a batch with 404.
    singles_until: Option<Instant>,
}

impl AppendQueue {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a request; true when the caller must start a sender (a slot was free).
    fn push(&self, item: Queued, slots: usize) -> bool {
        let mut s = self.state();
        s.queue.push_back(item);
        if s.calls < slots {
            s.calls += 1;
            true
        } else {
            false
        }
    }

    /// What the next call carries: the requests whose callers still wait, up to `max_bytes` and
    /// [`wire::MAX_BATCH_ITEMS`], the most a receiver takes (at least one). `None`, and the slot is
    /// given back, when nothing is queued.
    fn take(&self, max_bytes: usize) -> Option<(Vec<Queued>, bool)> {
        let mut s = self.state();
        let mut batch = Vec::new();
        let mut bytes = 0;
        while let Some(next) = s.queue.front() {
            if !batch.is_empty() && (bytes + next.body.len() > max_bytes || batch.len() == wire::MAX_BATCH_ITEMS) {
                break;
            }
            let Some(item) = s.queue.pop_front() else { break };
            if item.reply.is_closed() {
                continue; // openraft gave up on it (hard deadline, replication closed)
            }
            bytes += item.body.len();
            batch.push(item);
        }
        if batch.is_empty() {
            s.calls -= 1;
            return None;
        }
        let singles = s.singles_until.is_some_and(|t| t > Instant::now());
        Some((batch, singles))
    }

    /// A stalled call gives its slot up; true when the caller must start another sender (requests
    /// are waiting).
    fn release_stalled(&self) -> bool {
        let mut s = self.state();
        if s.queue.is_empty() {
            s.calls -= 1;
            false
        } else {
            true // the slot passes straight to the new sender
        }
    }

    /// Calls so far that carried more than one request.
    #[cfg(test)]
    pub fn batch_calls(&self) -> u64 {
        self.batch_calls.load(Ordering::Relaxed)
    }

    fn singles_for_a_while(&self) {
        self.state().singles_until = Some(Instant::now() + RETRY_BATCHES_AFTER);
    }
}

impl Transport {
    /// Sends an encoded AppendEntries (`ShardRequest`) to `target` through its queue; the encoded
    /// answer.
    pub(super) async fn append_queued(&self, target: NodeId, body: Bytes, deadline: Duration) -> Answer {
        let slots = self.inner.config.append_calls_in_flight;
        if slots == 0 {
            return self.send(target, &Endpoint::Raft(RaftKind::Append), body, deadline).await;
        }
        let peer = self.inner.peers.get(target).ok_or(TransportError::UnknownPeer(target))?;
        let (reply, answer) = oneshot::channel();
        let item = Queued { body, deadline: Instant::now() + deadline, reply };
        if peer.appends.push(item, slots) {
            tokio::spawn(self.clone().send_queued(target, peer));
        }
        match tokio::time::timeout(deadline, answer).await {
            Ok(Ok(answer)) => answer,
            // The sender went away without answering (the runtime is shutting down).
            Ok(Err(_)) | Err(_) => Err(TransportError::Timeout { node: target, after: deadline }),
        }
    }

    /// Holds one of `peer`'s slots: sends what is queued, call after call, until the queue is empty
    /// or a call stalls (then another sender takes over the slot while this one finishes its call).
    /// (Boxed: it may spawn itself.)
    fn send_queued(self, target: NodeId, peer: Arc<Peer>) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let max_bytes = self.inner.config.limits.append / 2;
            while let Some((batch, singles)) = peer.appends.take(max_bytes) {
                let call = self.send_batch(target, &peer, batch, singles);
                tokio::pin!(call);
                if tokio::time::timeout(STALL, &mut call).await.is_err() {
                    if peer.appends.release_stalled() {
                        tokio::spawn(self.clone().send_queued(target, peer.clone()));
                    }
                    call.await;
                    return;
                }
            }
        })
    }

    /// One call for `batch` (or, to a peer without the batch endpoint, one per request); answers
    /// every request in it.
    async fn send_batch(&self, target: NodeId, peer: &Peer, batch: Vec<Queued>, singles: bool) {
        if batch.len() == 1 || singles {
            return self.send_singles(target, batch).await;
        }
        let now = Instant::now();
        let deadline = batch.iter().map(|q| q.deadline).min().unwrap_or(now).saturating_duration_since(now);
        let deadline = deadline.max(Duration::from_millis(1));
        let wait_ms = u32::try_from(deadline.as_millis() / 2).unwrap_or(u32::MAX);
        let bodies: Vec<&[u8]> = batch.iter().map(|q| &q.body[..]).collect();
        peer.appends.batch_calls.fetch_add(1, Ordering::Relaxed);
        let result = match wire::encode_append_batch(wait_ms, &bodies) {
            Ok(body) => self.send(target, &Endpoint::Raft(RaftKind::AppendBatch), body.into(), deadline).await,
            Err(e) => Err(TransportError::Encode(e)),
        };
        metrics::counter!("twinhub_rpc_append_batched_total", "peer" => target.to_string())
            .increment(batch.len() as u64);
        let answers = match result {
            Ok(answer) => match wire::decode::<Vec<Result<Bytes, RpcFailure>>>(&answer) {
                Ok(answers) if answers.len() == batch.len() => answers,
                Ok(answers) => {
                    let msg = format!("{} answers to a batch of {}", answers.len(), batch.len());
                    return answer_all(batch, &TransportError::Decode { node: target, msg });
                }
                Err(e) => return answer_all(batch, &TransportError::Decode { node: target, msg: e.to_string() }),
            },
            Err(TransportError::Remote { failure: RpcFailure::NotFound, .. }) => {
                tracing::info!(node = target, "peer has no batch endpoint (an older release): sending one by one");
                peer.appends.singles_for_a_while();
                return self.send_singles(target, batch).await;
            }
            Err(e) => return answer_all(batch, &e),
        };
        for (q, answer) in batch.into_iter().zip(answers) {
            let answer = answer.map_err(|failure| match failure {
                RpcFailure::Unfinished { .. } => TransportError::Timeout { node: target, after: deadline },
                failure => TransportError::Remote { node: target, failure },
            });
            let _ = q.reply.send(answer);
        }
    }

    /// Each request of `batch` as a call of its own, all at once.
    async fn send_singles(&self, target: NodeId, batch: Vec<Queued>) {
        futures::future::join_all(batch.into_iter().map(|q| async move {
            let deadline = q.deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            let answer = self.send(target, &Endpoint::Raft(RaftKind::Append), q.body, deadline).await;
            let _ = q.reply.send(answer);
        }))
        .await;
    }
}

fn answer_all(batch: Vec<Queued>, e: &TransportError) {
    for q in batch {
        let _ = q.reply.send(Err(e.clone()));
    }
}
