//! Where twin actors are found, spawned and passivated.
//!
//! The map is split into [`STRIPES`] stripes by the twin's hash, each behind its own short, synchronous
//! lock: a request marks its entry busy under the stripe's lock before it sends, and the sweeper removes
//! only entries that are idle and not busy (under the same lock), so a message can never be sent to an
//! actor the sweeper is stopping. Nothing awaits while holding a lock: an actor is spawned without
//! waiting for its start (its mailbox takes messages at once), so a write to a twin with no actor does
//! not hold up the writes to its neighbours.
//!
//! Why stripes and a sweep spread over the period: a fleet of millions written at random keeps a
//! six-figure number of actors alive, and one map swept in one go held every write of the shard for
//! the whole scan and then stopped tens of thousands of actors at once. Now each tick sweeps one
//! stripe: the same idle bound, a sixty-fourth of the work. (Measured at a million twins, this alone
//! moved throughput no more than run-to-run spread; the slow seconds there were snapshots.)

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ractor::{ActorRef, ActorRuntime};
use tokio::sync::oneshot;

use super::actor::{TwinActor, TwinActorArgs, TwinMsg};
use crate::ids::TwinId;
use crate::model::{Applied, Command};
use crate::shard::{ShardError, Shards};

/// Stripes of the actor map. Enough that a sweep tick (one stripe) stays short at millions of twins
/// and writes rarely meet on a lock; few enough that an idle node's sweeper wakes rarely.
const STRIPES: usize = 64;

struct Entry {
    actor: ActorRef<TwinMsg>,
    /// Requests sent and not yet answered.
    busy: Arc<AtomicUsize>,
    /// Milliseconds since `ActorRegistry::epoch` of the last request.
    last_used: Arc<AtomicU64>,
}

type Stripe = HashMap<TwinId, Entry>;

pub struct ActorRegistry {
    shards: Arc<Shards>,
    stripes: Box<[Mutex<Stripe>]>,
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
        let stripes = (0..STRIPES).map(|_| Mutex::new(HashMap::new())).collect();
        ActorRegistry { shards, stripes, idle_after, epoch: Instant::now(), live: AtomicUsize::new(0) }
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

    /// The stripe `id` lives in. A critical section never panics (map operations and sends only), so
    /// a poisoned lock's map is intact and is used as it is.
    fn stripe(&self, id: &TwinId) -> MutexGuard<'_, Stripe> {
        let mut h = DefaultHasher::new();
        id.hash(&mut h);
        self.lock(h.finish() as usize % STRIPES)
    }

    fn lock(&self, stripe: usize) -> MutexGuard<'_, Stripe> {
        self.stripes[stripe].lock().unwrap_or_else(PoisonError::into_inner)
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
            let (actor, _busy) = self.checkout(id, &shard)?;
            let (tx, rx) = oneshot::channel();
            let Some(c) = cmd.take() else { break };
            match actor.send_message(TwinMsg::Write { cmd: c, reply: tx }) {
                Ok(()) => {}
                Err(ractor::MessagingErr::SendErr(TwinMsg::Write { cmd: c, .. })) => {
                    self.evict(id);
                    cmd = Some(c);
                    continue;
                }
                Err(_) => {
                    self.evict(id);
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

    /// The twin's actor, marked busy; spawned if there is none. The new actor's start runs on its own
    /// task: its `pre_start` cannot fail, and messages wait in its mailbox until it has run.
    fn checkout(
        &self,
        id: &TwinId,
        shard: &Arc<crate::shard::Shard>,
    ) -> Result<(ActorRef<TwinMsg>, BusyGuard), ShardError> {
        let mut map = self.stripe(id);
        if let Some(e) = map.get(id) {
            e.busy.fetch_add(1, Ordering::AcqRel);
            e.last_used.store(self.now_ms(), Ordering::Relaxed);
            return Ok((e.actor.clone(), BusyGuard(e.busy.clone())));
        }
        let args = TwinActorArgs { id: id.clone(), shard: shard.clone() };
        let (actor, _started) = ActorRuntime::spawn_instant(None, TwinActor, args)
            .map_err(|e| ShardError::Fatal { shard: shard.id, msg: format!("spawning twin actor: {e}") })?;
        let busy = Arc::new(AtomicUsize::new(1));
        let entry =
            Entry { actor: actor.clone(), busy: busy.clone(), last_used: Arc::new(AtomicU64::new(self.now_ms())) };
        map.insert(id.clone(), entry);
        self.live.fetch_add(1, Ordering::Relaxed);
        Ok((actor, BusyGuard(busy)))
    }

    fn evict(&self, id: &TwinId) {
        if let Some(e) = self.stripe(id).remove(id) {
            self.live.fetch_sub(1, Ordering::Relaxed);
            e.actor.stop(None);
        }
    }

    /// Stops the actors of one stripe that have been idle for `idle_after` and have nothing in flight.
    fn sweep_stripe(&self, stripe: usize) -> usize {
        let now = self.now_ms();
        let idle = self.idle_after.as_millis() as u64;
        let mut stopped = 0;
        self.lock(stripe).retain(|_, e| {
            let keep =
                e.busy.load(Ordering::Acquire) > 0 || now.saturating_sub(e.last_used.load(Ordering::Relaxed)) < idle;
            if !keep {
                e.actor.stop(None);
                stopped += 1;
            }
            keep
        });
        self.live.fetch_sub(stopped, Ordering::Relaxed);
        stopped
    }

    /// Sweeps the stripes in turn, one per tick, so that each is swept every `idle_after / 2` (an actor
    /// lives at most one and a half idle periods after its last request, as before the stripes).
    pub async fn run_sweeper(self: Arc<Self>) {
        let round = (self.idle_after / 2).max(Duration::from_millis(10));
        let mut tick = tokio::time::interval(round / STRIPES as u32);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut stripe, mut stopped) = (0, 0);
        loop {
            tick.tick().await;
            stopped += self.sweep_stripe(stripe);
            metrics::gauge!("twinhub_twin_actors").set(self.len() as f64);
            stripe = (stripe + 1) % STRIPES;
            if stripe == 0 && stopped > 0 {
                tracing::debug!(passivated = stopped, "passivated idle twin actors");
                stopped = 0;
            }
        }
    }

    pub async fn stop_all(&self) {
        for stripe in 0..STRIPES {
            let entries: Vec<Entry> = self.lock(stripe).drain().map(|(_, e)| e).collect();
            for e in entries {
                let _ = e.actor.stop_and_wait(None, Some(Duration::from_secs(5))).await;
            }
        }
        self.live.store(0, Ordering::Relaxed);
    }
}
