//! The actor of one active twin.
//!
//! It exists to order: requests for one twin are proposed in the order they arrived, and proposing does
//! not wait for the previous commit (the shard pipelines them), so a busy twin keeps its Raft group's
//! pipeline full while requests for it still apply in order.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;

use crate::ids::TwinId;
use crate::model::{Applied, Command, IfMatch, Op, TwinError};
use crate::shard::{Shard, ShardError};

pub struct TwinActor;

pub enum TwinMsg {
    /// Propose `cmd`; `reply` receives the outcome after commit and apply.
    Write { cmd: Command, reply: oneshot::Sender<Result<Applied, ShardError>> },
}

pub struct TwinActorArgs {
    pub id: TwinId,
    pub shard: Arc<Shard>,
}

pub struct TwinActorState {
    id: TwinId,
    shard: Arc<Shard>,
}

impl Actor for TwinActor {
    type Msg = TwinMsg;
    type State = TwinActorState;
    type Arguments = TwinActorArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: TwinActorArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(TwinActorState { id: args.id, shard: args.shard })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            TwinMsg::Write { cmd, reply } => {
                if let Some(rejected) = precheck(&state.id, &state.shard, &cmd) {
                    let _ = reply.send(Ok(rejected));
                    return Ok(());
                }
                state.shard.write_pipelined(cmd, reply).await;
            }
        }
        Ok(())
    }
}

/// Rejects a request whose If-Match cannot match before it costs a log entry (docs/architecture.md, invariant 6). Apply
/// checks If-Match again on the committed order, so this is only an optimisation, and it must never
/// reject what apply would accept: this replica may lag (a deposed leader that does not know it yet,
/// a leader whose storage failed), so only an etag *older* than the state applied here is rejected
/// (etag counters only grow); an etag this replica has not seen yet goes to Raft, and so does a retry of
/// a command this replica already applied. The chaos suite found both: a deposed leader answering 412
/// to a current etag, and a retried If-Match write answered 412 although its first attempt applied.
fn precheck(id: &TwinId, shard: &Shard, cmd: &Command) -> Option<Applied> {
    let if_match = match &cmd.op {
        Op::UpdateTwin { if_match: Some(IfMatch::Etag(e)), .. }
        | Op::ReplaceTwin { if_match: Some(IfMatch::Etag(e)), .. } => e,
        _ => return None,
    };
    // A retry of a command that already applied (its answer was lost in a leader change) carries the
    // etag its own apply replaced: it goes to Raft, where dedupe answers the first outcome.
    if !shard.read_local(|s| !s.remembers(&cmd.request_id) && s.etag_certainly_stale(id, if_match)) {
        return None;
    }
    Some(Applied {
        result: Err(TwinError::PreconditionFailed(format!("etag {if_match} does not match the twin's current etag"))),
        events: Vec::new(),
    })
}
