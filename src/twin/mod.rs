//! Twin actors: one ractor actor per active twin, owned by its shard's leader. The actor orders the
//! twin's requests and pipelines them into the shard's Raft group; the caller is answered after commit.
//! Actors are spawned on first use and passivated when idle: an actor costs ~7.8 KB resident, so a fleet
//! of millions cannot keep one per twin. Twin *state* lives in the shard's state machine, never in the
//! actor, so passivating loses nothing.

mod actor;
mod registry;

use std::sync::Arc;
use std::time::Duration;

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

/// Entry point of the twin layer for the front doors.
pub struct Twins {
    pub shards: Arc<Shards>,
    registry: Arc<ActorRegistry>,
    sweeper: tokio::task::JoinHandle<()>,
}

impl Twins {
    /// Must be called inside a tokio runtime: it starts the idle sweeper.
    pub fn new(shards: Arc<Shards>, config: TwinsConfig) -> Arc<Twins> {
        let registry = Arc::new(ActorRegistry::new(shards.clone(), config.idle_after));
        let sweeper = tokio::spawn(registry.clone().run_sweeper());
        Arc::new(Twins { shards, registry, sweeper })
    }

    /// Orders `cmd` behind earlier requests for `id`, proposes it and waits for the applied outcome.
    pub async fn write(&self, id: &TwinId, cmd: Command) -> Result<Applied, ShardError> {
        self.registry.write(id, cmd).await
    }

    /// A linearizable read of the shard owning `device_id`.
    pub async fn read<R>(&self, device_id: &str, f: impl FnOnce(&ShardState) -> R) -> Result<R, ShardError> {
        self.shards.for_device(device_id).read(f).await
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
