//! A group's stream of appends to one follower: sent one at a time, as openraft's default does, except
//! that an append carrying no entries, only a newer commit index, waits a moment for the next entries
//! and travels with them.
//!
//! Why: with one entry of a shard in flight (the default), an entry commits, the leader applies it and
//! only then proposes the next. openraft tells each follower the new commit at once, in an append of
//! its own, and since a follower's appends go one after the other the next entry then waits for that
//! append's answer. Under load the next entry follows within a fraction of a millisecond, so the commit
//! waits for it instead: one append and one answer fewer per round and follower, and the next entry
//! leaves without waiting a round trip. With no entry within [`RIDE_WINDOW`] the commit goes alone, as
//! before. Followers learn a commit at most that much later. Writes do not wait for that (they are
//! answered from the leader's apply); a linearizable read served by a follower waits until the follower
//! has applied the leader's read index, so such a read just after the last write of an idle shard can
//! take that much longer.
//!
//! Why the answer stays true: the append sent instead starts where the held one did (same previous log
//! id, same vote) and carries a commit at least as new, so the follower's answer to it answers the held
//! one too. openraft matches answers to requests by log id, and takes the moment it produced the later
//! request as the time the follower last acknowledged the leader, which is no later than the follower's
//! real acknowledgement.

use std::time::Duration;

use futures::{Stream, StreamExt};
use openraft::base::{BoxFuture, BoxStream};
use openraft::entry::RaftEntry;
use openraft::error::RPCError;
use openraft::network::{NetAppend, RPCOption};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, StreamAppendResult};
use openraft::OptionalSend;

use super::types::TypeConfig;

/// How long an entry-less append waits for entries to carry its commit. Under load the next entry is
/// proposed as soon as the leader applied the last one (a few hundred microseconds); this is several
/// times that, and small beside the 100 ms heartbeat that would carry the commit anyway.
pub(super) const RIDE_WINDOW: Duration = Duration::from_millis(2);

type Request = AppendEntriesRequest<TypeConfig>;
type Answers<'s> = BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>;

/// Where the stream is between two appends.
struct State<'s, N, S> {
    net: &'s mut N,
    input: S,
    /// A request taken from `input` while waiting for entries that could not carry the held commit
    /// (it starts elsewhere); it goes next.
    next: Option<Request>,
    /// `input` has ended; once `next` is sent the stream ends too.
    ended: bool,
}

/// Sends `input` to the follower one append at a time, each answered before the next goes, folding
/// entry-less appends into the appends that follow them within [`RIDE_WINDOW`].
pub(super) fn stream_append<'s, N, S>(
    net: &'s mut N,
    input: S,
    option: RPCOption,
) -> BoxFuture<'s, Result<Answers<'s>, RPCError<TypeConfig>>>
where
    N: NetAppend<TypeConfig>,
    S: Stream<Item = Request> + OptionalSend + Unpin + 'static,
{
    let answers = futures::stream::unfold(Some(State { net, input, next: None, ended: false }), move |state| {
        let option = option.clone();
        async move {
            let mut state = state?;
            let req = match state.next.take() {
                Some(req) => req,
                None if state.ended => return None,
                None => state.input.next().await?,
            };
            let req = ride(&mut state, req).await;
            let prev = req.prev_log_id;
            let last = req.entries.last().map(|e| e.log_id()).or(prev);
            match state.net.append_entries(req, option).await {
                Ok(answer) => {
                    // A follower that took only part of the entries stops the stream, as openraft's
                    // default does: the rest goes again from where it stopped.
                    let go_on = match &answer {
                        AppendEntriesResponse::Success => true,
                        AppendEntriesResponse::PartialSuccess(upto) => *upto == last,
                        AppendEntriesResponse::Conflict | AppendEntriesResponse::HigherVote(_) => false,
                    };
                    let result = answer.into_stream_result(prev, last);
                    let go_on = go_on && result.is_ok();
                    Some((Ok(result), go_on.then_some(state)))
                }
                Err(e) => Some((Err(e), None)),
            }
        }
    });
    let answers: Answers<'s> = Box::pin(answers);
    Box::pin(async move { Ok(answers) })
}

/// `held`, or, if it carries no entries, the request that replaces it: the next one from the input
/// that starts at the same place under the same vote, if it comes within [`RIDE_WINDOW`]. A later
/// entry-less request replaces it too (its commit is newer), and the wait goes on until entries come,
/// the window ends, or the input does.
async fn ride<N, S>(state: &mut State<'_, N, S>, mut held: Request) -> Request
where
    S: Stream<Item = Request> + Unpin,
{
    if !held.entries.is_empty() || state.ended {
        return held;
    }
    let until = tokio::time::Instant::now() + RIDE_WINDOW;
    while held.entries.is_empty() {
        // Cancel-safe: the input is openraft's `unfold`, which keeps a request it is still forming
        // inside the stream, and hands it over at the next poll.
        match tokio::time::timeout_at(until, state.input.next()).await {
            Ok(Some(req)) if req.prev_log_id == held.prev_log_id && req.vote == held.vote => {
                rode(!req.entries.is_empty());
                held = req;
            }
            Ok(Some(req)) => {
                state.next = Some(req);
                break;
            }
            Ok(None) => {
                state.ended = true;
                break;
            }
            Err(_) => break,
        }
    }
    held
}

/// Counts commits that rode with entries instead of going alone.
fn rode(with_entries: bool) {
    if with_entries {
        metrics::counter!("twinhub_raft_commits_carried_total").increment(1);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use futures::channel::mpsc;
    use openraft::raft::StreamAppendError;
    use openraft::testing::{blank_ent, log_id};

    use super::*;
    use crate::shard::types::{LogId, Vote};

    /// What the follower was sent: previous index, entries, commit index.
    type Sent = (Option<u64>, usize, Option<u64>);

    /// A follower that records every append and answers `Conflict` to those starting at `conflict_at`.
    #[derive(Clone, Default)]
    struct Follower {
        sent: Arc<Mutex<Vec<Sent>>>,
        conflict_at: Option<u64>,
    }

    impl NetAppend<TypeConfig> for Follower {
        async fn append_entries(
            &mut self,
            rpc: Request,
            _option: RPCOption,
        ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
            let prev = rpc.prev_log_id.map(|l| l.index);
            let sent = (prev, rpc.entries.len(), rpc.leader_commit.map(|l| l.index));
            self.sent.lock().expect("lock").push(sent);
            if prev.is_some() && prev == self.conflict_at {
                return Ok(AppendEntriesResponse::Conflict);
            }
            Ok(AppendEntriesResponse::Success)
        }
    }

    fn id(index: u64) -> LogId {
        log_id::<TypeConfig>(1, 1, index)
    }

    /// An append after `prev` carrying entries `prev + 1 ..= prev + n` and the commit `commit`.
    fn append(prev: u64, n: u64, commit: u64) -> Request {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: Some(id(prev)),
            entries: (prev + 1..=prev + n).map(|i| blank_ent::<TypeConfig>(1, 1, i)).collect(),
            leader_commit: Some(id(commit)),
        }
    }

    fn option() -> RPCOption {
        RPCOption::new(Duration::from_secs(1))
    }

    async fn answers(
        follower: &mut Follower,
        input: mpsc::UnboundedReceiver<Request>,
    ) -> Vec<StreamAppendResult<TypeConfig>> {
        let stream = stream_append(follower, input, option()).await.expect("stream");
        let got: Vec<_> =
            tokio::time::timeout(Duration::from_secs(5), stream.collect::<Vec<_>>()).await.expect("stream ended");
        got.into_iter().map(|r| r.expect("no RPC error")).collect()
    }

    #[tokio::test]
    async fn a_commit_rides_with_the_entries_that_follow() {
        let (tx, rx) = mpsc::unbounded();
        tx.unbounded_send(append(10, 0, 10)).expect("send");
        tx.unbounded_send(append(10, 3, 10)).expect("send");
        tx.unbounded_send(append(13, 2, 13)).expect("send");
        drop(tx);
        let mut follower = Follower::default();
        let got = answers(&mut follower, rx).await;
        assert_eq!(got, [Ok(Some(id(13))), Ok(Some(id(15)))]);
        assert_eq!(*follower.sent.lock().expect("lock"), [(Some(10), 3, Some(10)), (Some(13), 2, Some(13))]);
    }

    #[tokio::test]
    async fn a_commit_with_no_entries_behind_it_goes_alone_after_the_window() {
        let (tx, rx) = mpsc::unbounded();
        tx.unbounded_send(append(10, 0, 9)).expect("send");
        tx.unbounded_send(append(10, 0, 10)).expect("send");
        let follower = Follower::default();
        let mut sender = follower.clone();
        let stream = stream_append(&mut sender, rx, option()).await.expect("stream");
        let mut stream = std::pin::pin!(stream);
        let start = tokio::time::Instant::now();
        let first = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.expect("answered");
        assert!(start.elapsed() >= RIDE_WINDOW, "went before the window ended");
        assert_eq!(first.expect("an answer").expect("no RPC error"), Ok(Some(id(10))));
        // The newer commit replaced the older one: one append.
        assert_eq!(*follower.sent.lock().expect("lock"), [(Some(10), 0, Some(10))]);
        drop(tx);
        assert!(stream.next().await.is_none());
    }

    #[tokio::test]
    async fn appends_that_start_elsewhere_go_one_after_the_other() {
        let (tx, rx) = mpsc::unbounded();
        tx.unbounded_send(append(10, 0, 10)).expect("send");
        tx.unbounded_send(append(7, 3, 10)).expect("send");
        drop(tx);
        let mut follower = Follower::default();
        let got = answers(&mut follower, rx).await;
        assert_eq!(got, [Ok(Some(id(10))), Ok(Some(id(10)))]);
        assert_eq!(*follower.sent.lock().expect("lock"), [(Some(10), 0, Some(10)), (Some(7), 3, Some(10))]);
    }

    #[tokio::test]
    async fn a_conflict_ends_the_stream() {
        let (tx, rx) = mpsc::unbounded();
        tx.unbounded_send(append(10, 0, 10)).expect("send");
        tx.unbounded_send(append(10, 2, 10)).expect("send");
        tx.unbounded_send(append(12, 2, 10)).expect("send");
        drop(tx);
        let mut follower = Follower { conflict_at: Some(10), ..Follower::default() };
        let got = answers(&mut follower, rx).await;
        assert_eq!(got, [Err(StreamAppendError::Conflict(id(10)))]);
        assert_eq!(follower.sent.lock().expect("lock").len(), 1);
    }
}
