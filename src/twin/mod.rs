//! Twin actors: one ractor actor per active twin, owned by its shard's leader. The actor orders the
//! twin's requests and pipelines them into the shard's Raft group; it answers after commit. Actors are
//! spawned on first use and passivated when idle (an actor costs ~7.8 KB resident, so a fleet cannot keep
//! one per twin).

use std::sync::Arc;
use std::time::Duration;

use crate::ids::TwinId;
use crate::model::{Applied, Command, ShardState};
use crate::shard::{ShardError, Shards};

pub struct TwinsConfig {
    /// An actor with no request for this long is stopped.
    pub idle_after: Duration,
}

/// Entry point of the twin layer for the front doors.
pub struct Twins {
    pub shards: Arc<Shards>,
}

impl Twins {
    pub fn new(shards: Arc<Shards>, config: TwinsConfig) -> Arc<Twins> {
        let _ = (shards, config);
        todo!("twin")
    }

    /// Orders `cmd` behind earlier requests for `id`, proposes it and waits for the applied outcome.
    pub async fn write(&self, id: &TwinId, cmd: Command) -> Result<Applied, ShardError> {
        let _ = (id, cmd);
        todo!("twin")
    }

    /// A linearizable read of the shard owning `device_id`.
    pub async fn read<R>(&self, device_id: &str, f: impl FnOnce(&ShardState) -> R) -> Result<R, ShardError> {
        self.shards.for_device(device_id).read(f).await
    }

    /// Number of live twin actors (metrics).
    pub fn active_actors(&self) -> usize {
        todo!("twin")
    }

    pub async fn shutdown(&self) {
        todo!("twin")
    }
}
