//! Damping of leadership transfers, so the balancer never fights itself.
//!
//! The reconciler hands a shard's leadership to the map's preferred replica. On a loaded machine that
//! replica may fail to win (or win and lose again); retrying every pass would turn one slow node into
//! a leadership ping-pong in which every transfer costs an election's worth of unavailability. So each
//! shard's transfers back off exponentially (5 s, 10 s, … up to 5 minutes) until the preferred
//! replica is seen leading, which resets the shard's delay.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::ids::ShardId;

const FIRST: Duration = Duration::from_secs(5);
const MAX: Duration = Duration::from_secs(300);

#[derive(Debug)]
struct Entry {
    next_allowed: Instant,
    delay: Duration,
}

/// Per-shard transfer backoff (see the module doc).
#[derive(Debug, Default)]
pub struct TransferBackoff {
    shards: HashMap<ShardId, Entry>,
}

impl TransferBackoff {
    /// Whether a transfer of `shard` may be tried at `now`; if so, it is recorded as tried and the
    /// shard's next attempt is pushed back by the current delay, which then doubles.
    pub fn try_transfer(&mut self, shard: ShardId, now: Instant) -> bool {
        let e = self.shards.entry(shard).or_insert(Entry { next_allowed: now, delay: FIRST });
        if now < e.next_allowed {
            return false;
        }
        e.next_allowed = now + e.delay;
        e.delay = (e.delay * 2).min(MAX);
        true
    }

    /// The shard is led where the map wants it: its next transfer, if ever needed, may go at once.
    pub fn settled(&mut self, shard: ShardId) {
        self.shards.remove(&shard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_back_off_and_reset() {
        let mut b = TransferBackoff::default();
        let t0 = Instant::now();
        assert!(b.try_transfer(3, t0));
        assert!(!b.try_transfer(3, t0 + Duration::from_secs(1)), "not every pass");
        assert!(b.try_transfer(7, t0), "shards are independent");
        assert!(b.try_transfer(3, t0 + FIRST));
        assert!(!b.try_transfer(3, t0 + FIRST + Duration::from_secs(9)), "the delay doubled");
        assert!(b.try_transfer(3, t0 + FIRST + Duration::from_secs(10)));
        let mut t = t0 + FIRST + Duration::from_secs(10);
        for _ in 0..20 {
            t += MAX;
            assert!(b.try_transfer(3, t), "capped at {MAX:?}");
        }
        b.settled(3);
        assert!(b.try_transfer(3, t + Duration::from_millis(1)));
    }
}
