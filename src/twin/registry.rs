//! Where twin actors are found, spawned and passivated.
//!
//! One map per shard, so requests for different shards never contend on a lock. A request marks the
//! entry busy (under the map's lock) before it sends, and the sweeper removes only entries that are idle
//! and not busy (under the same lock): a message can never be sent to an actor the sweeper is stopping.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorRef};
use tokio::sync::{oneshot, Mutex};

use super::actor::{TwinActor, TwinActorArgs, TwinMsg};
use crate::ids::TwinId;
use crate::model::{Applied, Command};
use crate::shard::{ShardError, Shards};

struct Entry {
    actor: ActorRef<TwinMsg>,
    /// Requests sent and not yet answered.
    busy: Arc<AtomicUsize>,
    /// Milliseconds since `ActorRegistry::epoch` of the last request.
    last_used: Arc<AtomicU64>,
}

pub struct ActorRegistry {
    shards: Arc<Shards>,
    maps: Vec<Mutex<HashMap<TwinId, Entry>>>,
    idle_after: Duration,
    epoch: Instant,
    live: AtomicUsize,
}

/// Decrements the busy count however the request ends (answer, error or cancellation).
struct BusyGuard(Arc<AtomicUsize>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ActorRegistry {
    pub fn new(shards: Arc<Shards>, idle_after: Duration) -> Self {
        let maps = (0..shards.shard_count()).map(|_| Mutex::new(HashMap::new())).collect();
        ActorRegistry { shards, maps, idle_after, epoch: Instant::now(), live: AtomicUsize::new(0) }
    }

    pub fn len(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Sends `cmd` to the twin's actor (spawning it if needed) and waits for the outcome.
    pub async fn write(&self, id: &TwinId, cmd: Command) -> Result<Applied, ShardError> {
        let shard_id = self.shards.shard_of(&id.device_id);
        let Some(shard) = self.shards.local(shard_id) else {
            return Err(ShardError::NotLeader { shard: shard_id, leader: None });
        };
        // A dead actor (stopped between lookup and send, or crashed) is replaced once; the command is not
        // yet proposed in that case, so resending it is safe (and its request id dedupes regardless).
        let mut cmd = Some(cmd);
        for _ in 0..2 {
            let (actor, _busy) = self.checkout(id, &shard).await?;
            let (tx, rx) = oneshot::channel();
            let Some(c) = cmd.take() else { break };
            match actor.send_message(TwinMsg::Write { cmd: c, reply: tx }) {
                Ok(()) => {}
                Err(ractor::MessagingErr::SendErr(TwinMsg::Write { cmd: c, .. })) => {
                    self.evict(id, shard.id).await;
                    cmd = Some(c);
                    continue;
                }
                Err(_) => {
                    self.evict(id, shard.id).await;
                    return Err(ShardError::ShuttingDown { shard: shard.id });
                }
            }
            return match rx.await {
                Ok(outcome) => outcome,
                // The reply was dropped without an answer: the outcome is unknown to us.
                Err(_) => Err(ShardError::Timeout { shard: shard.id }),
            };
        }
        Err(ShardError::ShuttingDown { shard: shard.id })
    }

    async fn checkout(
        &self,
        id: &TwinId,
        shard: &Arc<crate::shard::Shard>,
    ) -> Result<(ActorRef<TwinMsg>, BusyGuard), ShardError> {
        let mut map = self.maps[shard.id as usize].lock().await;
        if let Some(e) = map.get(id) {
            e.busy.fetch_add(1, Ordering::AcqRel);
            e.last_used.store(self.now_ms(), Ordering::Relaxed);
            return Ok((e.actor.clone(), BusyGuard(e.busy.clone())));
        }
        let args = TwinActorArgs { id: id.clone(), shard: shard.clone() };
        let (actor, _join) = Actor::spawn(None, TwinActor, args)
            .await
            .map_err(|e| ShardError::Fatal { shard: shard.id, msg: format!("spawning twin actor: {e}") })?;
        let busy = Arc::new(AtomicUsize::new(1));
        let entry =
            Entry { actor: actor.clone(), busy: busy.clone(), last_used: Arc::new(AtomicU64::new(self.now_ms())) };
        map.insert(id.clone(), entry);
        self.live.fetch_add(1, Ordering::Relaxed);
        Ok((actor, BusyGuard(busy)))
    }

    async fn evict(&self, id: &TwinId, shard: crate::ids::ShardId) {
        let mut map = self.maps[shard as usize].lock().await;
        if let Some(e) = map.remove(id) {
            self.live.fetch_sub(1, Ordering::Relaxed);
            e.actor.stop(None);
        }
    }

    /// Stops actors that have been idle for `idle_after` and have nothing in flight.
    pub async fn sweep(&self) -> usize {
        let now = self.now_ms();
        let idle = self.idle_after.as_millis() as u64;
        let mut stopped = 0;
        for map in &self.maps {
            let mut map = map.lock().await;
            map.retain(|_, e| {
                let keep = e.busy.load(Ordering::Acquire) > 0
                    || now.saturating_sub(e.last_used.load(Ordering::Relaxed)) < idle;
                if !keep {
                    e.actor.stop(None);
                    stopped += 1;
                }
                keep
            });
        }
        self.live.fetch_sub(stopped, Ordering::Relaxed);
        stopped
    }

    pub async fn run_sweeper(self: Arc<Self>) {
        let period = (self.idle_after / 2).max(Duration::from_millis(10));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let n = self.sweep().await;
            if n > 0 {
                tracing::debug!(passivated = n, "passivated idle twin actors");
            }
        }
    }

    pub async fn stop_all(&self) {
        for map in &self.maps {
            let mut map = map.lock().await;
            for (_, e) in map.drain() {
                let _ = e.actor.stop_and_wait(None, Some(Duration::from_secs(5))).await;
            }
        }
        self.live.store(0, Ordering::Relaxed);
    }
}
