//! Twin writes of one shard proposed to Raft together, as one log entry, when they queue up.
//!
//! Every Raft entry costs work of its own besides its command's apply: openraft's handling of the
//! proposal, a storage key and its encoding, a place in each follower's append, a decode there, an
//! apply call and an answer, on all three replicas. Under load several writes of one shard wait at
//! the same moment, so they share one entry ([`Op::Batch`]) and that work is paid once.
//!
//! Nothing waits to form a batch. At most `in_flight` entries of the shard are proposed and not yet
//! applied; a write that finds a free place is proposed at once, alone. Writes that arrive while every
//! place is taken queue, and the next free place takes all of them (up to [`MAX_COMMANDS`] and
//! [`MAX_BYTES`]). So a batch forms only behind proposals that are already on their way through Raft,
//! and an idle shard proposes every write the moment it arrives, as without batching.
//!
//! What it buys, measured (benches/README.md): fewer Raft rounds. A round's work (an append to each
//! follower, an fsync on every replica, the wake-ups between them) is paid once for every write of an
//! entry, so the fewer entries out at once, the more writes each carries: with one (the default) the
//! closed loop's entries carry about 1.8 times the writes they do with two, for about 4 % less CPU per
//! update. A batch waits for the earlier entry's apply, after that entry's commit was decided; the
//! commit reaches the followers with the batch's append (see `append_stream`). Light load sees a lower tail, and the log holds fewer entries.
//!
//! Order: the queue is one channel, taken in order, and each entry is handed to openraft before the
//! next is formed; writes of one twin (sent by its actor one after the other) apply in that order.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use super::types::{ClientWriteResult, Raft, ShardResponder};
use super::{Shard, ShardError};
use crate::ids::ShardId;
use crate::model::{now_ms, Applied, Command, Op, Reply};

/// At most this many commands share an entry: an entry is applied under the shard's state lock, and
/// reads of the shard wait for it.
pub const MAX_COMMANDS: usize = 64;

/// A batch stops growing past this many bytes of documents, so an entry stays far below what an
/// append may carry (twin documents are at most a few tens of kilobytes each).
pub const MAX_BYTES: usize = 256 * 1024;

/// The longest a write waits for a place. Entries normally apply within tens of milliseconds; places
/// held longer belong to proposals a deposed leader cannot finish, and the write goes to Raft without
/// one (to be refused there with the leader's name) rather than wait behind them.
const PLACE_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// Writes waiting for a place; a full queue holds the twin actors back, as openraft's own input
/// channel would.
const QUEUE: usize = 1024;

type Answer = oneshot::Sender<Result<Applied, ShardError>>;

/// The queue of one shard's batching proposer. Dropping it ends the proposer once the queue is empty.
pub(super) struct Proposer {
    queue: mpsc::Sender<(Command, Answer)>,
}

impl Proposer {
    /// Starts the proposer of `shard`, keeping at most `in_flight` (at least 1) entries proposed and
    /// not yet applied.
    pub(super) fn start(raft: Raft, shard: ShardId, in_flight: usize) -> Proposer {
        let (queue, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(raft, shard, rx, in_flight.max(1)));
        Proposer { queue }
    }

    /// Queues `cmd`; `answer` receives its outcome after commit and apply. Returns once queued.
    pub(super) async fn propose(&self, shard: ShardId, cmd: Command, answer: Answer) {
        if let Err(mpsc::error::SendError((_, answer))) = self.queue.send((cmd, answer)).await {
            let _ = answer.send(Err(ShardError::ShuttingDown { shard }));
        }
    }
}

async fn run(raft: Raft, shard: ShardId, mut rx: mpsc::Receiver<(Command, Answer)>, in_flight: usize) {
    let places = Arc::new(Semaphore::new(in_flight));
    let sizes = metrics::histogram!("twinhub_raft_batch_commands");
    // A write taken from the queue that had to start the next entry rather than join this one.
    let mut held = None;
    loop {
        let first = match held.take() {
            Some(first) => first,
            None => match rx.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let place = match tokio::time::timeout(PLACE_WAIT, Arc::clone(&places).acquire_owned()).await {
            Ok(Ok(place)) => Some(place),
            Ok(Err(_)) => return,
            // Every place has been out for long: proposals stranded on a leader that lost its group
            // (answered only once their entries commit or are truncated). Raft answers this one.
            Err(_) => None,
        };
        let mut bytes = document_bytes(&first.0);
        let mut batch = vec![first];
        while !alone(&batch[0].0) && batch.len() < MAX_COMMANDS && bytes < MAX_BYTES {
            match rx.try_recv() {
                Ok(next) if alone(&next.0) => {
                    held = Some(next);
                    break;
                }
                Ok(next) => {
                    bytes += document_bytes(&next.0);
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        sizes.record(batch.len() as f64);
        let (cmd, responder) = entry(&raft, shard, batch, place);
        // On a fatal error the responder is dropped unanswered and answers every write itself.
        let _ = raft.client_write_ff(Arc::new(cmd), Some(responder)).await;
    }
}

/// The entry for `batch` and the responder that answers each of its writes and frees its place: a
/// lone write is its own entry, exactly as without batching.
fn entry(
    raft: &Raft,
    shard: ShardId,
    mut batch: Vec<(Command, Answer)>,
    place: Option<OwnedSemaphorePermit>,
) -> (Command, ShardResponder<ClientWriteResult>) {
    let raft = raft.clone();
    if batch.len() == 1 {
        let (cmd, answer) = batch.remove(0);
        let responder = ShardResponder::new(move |res: Option<ClientWriteResult>| {
            drop(place);
            let _ = answer.send(Shard::outcome(&raft, shard, res));
        });
        return (cmd, responder);
    }
    let (commands, answers): (Vec<Command>, Vec<Answer>) = batch.into_iter().unzip();
    let responder = ShardResponder::new(move |res: Option<ClientWriteResult>| {
        drop(place);
        let results = match Shard::outcome(&raft, shard, res).map(|applied| applied.result) {
            Ok(Ok(Reply::Batch(results))) if results.len() == answers.len() => results,
            Ok(other) => {
                let kind = other.map(|r| r.kind());
                let e = ShardError::Fatal { shard, msg: format!("a batch of writes was answered with {kind:?}") };
                return answer_all(answers, e);
            }
            Err(e) => return answer_all(answers, e),
        };
        for (answer, result) in answers.into_iter().zip(results) {
            let _ = answer.send(Ok(Applied { result, events: Vec::new() }));
        }
    });
    (Command::new(Op::Batch { commands }, now_ms()), responder)
}

fn answer_all(answers: Vec<Answer>, e: ShardError) {
    for answer in answers {
        let _ = answer.send(Err(e.clone()));
    }
}

/// Bulk registry and restore commands carry many twins already: each keeps an entry of its own.
fn alone(cmd: &Command) -> bool {
    matches!(cmd.op, Op::Bulk { .. } | Op::RestoreDevices { .. })
}

/// The JSON a command carries, for the batch's byte budget.
fn document_bytes(cmd: &Command) -> usize {
    match &cmd.op {
        Op::UpdateTwin { patch_json, .. } | Op::UpdateReported { patch_json, .. } => patch_json.len(),
        Op::ReplaceTwin { twin_json, .. } => twin_json.len(),
        _ => 256,
    }
}
