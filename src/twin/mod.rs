//! Twin actors: one ractor actor per active twin, owned by its shard's leader. The actor orders the
//! twin's requests and pipelines them into the shard's Raft group; the caller is answered after commit.
//! Actors are spawned on first use and passivated when idle: an actor costs ~7.8 KB resident, so a fleet
//! of millions cannot keep one per twin. Twin *state* lives in the shard's state machine, never in the
//! actor, so passivating loses nothing.

mod actor;
mod registry;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster::transport::{CallError, Transport};
use crate::ids::TwinId;
use crate::model::{Applied, Command, ShardState};
use crate::shard::{ShardError, Shards};

pub use registry::ActorRegistry;

#[derive(Clone, Debug)]
pub struct TwinsConfig {
    /// An actor with no request for this long is stopped.
    pub idle_after: Duration,
}

impl Default for TwinsConfig {
    fn default() -> Self {
        TwinsConfig { idle_after: Duration::from_secs(30) }
    }
}

/// Transport call that runs a write on the node leading the twin's shard: `postcard((TwinId, Command))`
/// in, `serde_json(Result<Applied, ShardError>)` out (replies hold JSON documents, which postcard
/// cannot carry).
pub const WRITE_CALL: &str = "twin.write";

/// How long a write keeps looking for its shard's leader (elections, forwarding hiccups) before it
/// answers a retryable error.
const ROUTE_DEADLINE: Duration = Duration::from_secs(10);

/// Deadline of one forwarded write; the remote side's own Raft timeout is longer, so a timeout here
/// means "unknown outcome": the retry carries the same request id and apply deduplicates it.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// Entry point of the twin layer for the front doors.
pub struct Twins {
    pub shards: Arc<Shards>,
    registry: Arc<ActorRegistry>,
    sweeper: tokio::task::JoinHandle<()>,
    /// Present in a cluster: writes for shards led elsewhere are forwarded to the leader.
    transport: Option<Transport>,
}

impl Twins {
    /// Must be called inside a tokio runtime: it starts the idle sweeper. With a `transport`, it also
    /// answers the writes other nodes forward here.
    pub fn new(shards: Arc<Shards>, config: TwinsConfig, transport: Option<Transport>) -> Arc<Twins> {
        let registry = Arc::new(ActorRegistry::new(shards.clone(), config.idle_after));
        let sweeper = tokio::spawn(registry.clone().run_sweeper());
        if let Some(t) = &transport {
            let registry = registry.clone();
            t.handlers().register(WRITE_CALL, move |_from, body: bytes::Bytes| {
                let registry = registry.clone();
                async move {
                    let (id, cmd): (TwinId, Command) =
                        postcard::from_bytes(&body).map_err(|e| CallError(format!("bad forwarded write: {e}")))?;
                    // Never forwarded again from here: if this node lost the lead meanwhile, the caller
                    // hears NotLeader and routes anew (no ping-pong between two stale views).
                    let r = registry.write(&id, cmd).await;
                    serde_json::to_vec(&r).map(bytes::Bytes::from).map_err(|e| CallError(e.to_string()))
                }
            });
        }
        Arc::new(Twins { shards, registry, sweeper, transport })
    }

    /// Orders `cmd` behind earlier requests for `id` on the node that leads the twin's shard (this one,
    /// or the leader over the transport), proposes it and waits for the applied outcome. Across a leader
    /// change it retries with the same command, hence the same request id, so it applies at most once.
    pub async fn write(&self, id: &TwinId, cmd: Command) -> Result<Applied, ShardError> {
        let Some(t) = &self.transport else { return self.registry.write(id, cmd).await };
        let shard = self.shards.for_device(&id.device_id).clone();
        let deadline = Instant::now() + ROUTE_DEADLINE;
        let mut pause = Duration::from_millis(20);
        loop {
            let r = match shard.leader() {
                Some(l) if l == t.node_id() => self.registry.write(id, cmd.clone()).await,
                Some(l) => self.forward(t, l, id, &cmd).await,
                None => Err(ShardError::NotLeader { shard: shard.id, leader: None }),
            };
            match r {
                Err(ShardError::NotLeader { .. } | ShardError::Timeout { .. }) if Instant::now() < deadline => {
                    metrics::counter!("twinhub_route_retries_total").increment(1);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                other => return other,
            }
        }
    }

    async fn forward(&self, t: &Transport, leader: u64, id: &TwinId, cmd: &Command) -> Result<Applied, ShardError> {
        let shard = crate::ids::shard_of(&id.device_id, self.shards.shard_count());
        let body = postcard::to_allocvec(&(id, cmd)).map_err(|e| ShardError::Fatal { shard, msg: e.to_string() })?;
        metrics::counter!("twinhub_route_forwarded_total").increment(1);
        match t.call(leader, WRITE_CALL, body.into(), Some(FORWARD_TIMEOUT)).await {
            Ok(answer) => serde_json::from_slice::<Result<Applied, ShardError>>(&answer)
                .map_err(|e| ShardError::Fatal { shard, msg: format!("bad forwarded answer: {e}") })?,
            // Delivered or not, we cannot tell: retry (same request id) until the route deadline.
            Err(e) => {
                tracing::debug!(shard, leader, "forwarding a write: {e}");
                Err(ShardError::Timeout { shard })
            }
        }
    }

    /// A linearizable read of the shard owning `device_id`.
    /// In a cluster it waits out a leader change (election, leadership transfer) like writes do.
    pub async fn read<R>(&self, device_id: &str, f: impl FnOnce(&ShardState) -> R) -> Result<R, ShardError> {
        let shard = self.shards.for_device(device_id);
        if self.transport.is_none() {
            return shard.read(f).await;
        }
        let deadline = Instant::now() + ROUTE_DEADLINE;
        let mut pause = Duration::from_millis(20);
        loop {
            match shard.linearize().await {
                Ok(()) => return Ok(shard.read_local(f)),
                Err(ShardError::NotLeader { .. } | ShardError::Timeout { .. }) if Instant::now() < deadline => {
                    metrics::counter!("twinhub_route_read_retries_total").increment(1);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Number of live twin actors (metrics).
    pub fn active_actors(&self) -> usize {
        self.registry.len()
    }

    /// Stops every actor; requests already proposed still complete through the shard.
    pub async fn shutdown(&self) {
        self.sweeper.abort();
        self.registry.stop_all().await;
    }
}
