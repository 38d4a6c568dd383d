//! [`NonceCache`]: refuses a second copy of an authenticated request.
//!
//! A signed request stays valid for as long as its timestamp is within [`MAX_SKEW`] of the
//! receiver's clock, so its nonce must be remembered exactly that long: until `ts + MAX_SKEW`. Nonces
//! are kept per sender, ordered by timestamp, which makes expiry a pop from the front.
//!
//! Memory is bounded three ways, and the cache refuses rather than grows:
//! - per sender, at most `max_per_sender` nonces;
//! - in all, at most `max_total` nonces;
//! - at most `max_senders` senders.
//!
//! When a sender's set is full, its oldest nonce is forgotten and the sender's *floor* rises to that
//! nonce's timestamp: from then on its messages stamped at or below the floor are refused
//! ([`AuthError::Forgotten`]), because the cache could no longer tell them from replays. Fresh messages
//! (stamped now) are above the floor, so a busy but honest sender keeps working; only its messages
//! delayed by more than the remembered span are refused, and Raft retries those. Expiry raises the
//! floor too, which also keeps a replay out when this node's clock steps back. Only requests whose
//! MAC verified get here, so only holders of the cluster secret can fill the cache at all.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use super::auth::{AuthError, Nonce, MAX_SKEW};
use crate::ids::NodeId;

/// Bounds of a [`NonceCache`].
#[derive(Clone, Copy, Debug)]
pub struct NonceLimits {
    /// How long a nonce is remembered past its timestamp: the timestamp's validity.
    pub window_ms: u64,
    pub max_per_sender: usize,
    pub max_total: usize,
    pub max_senders: usize,
}

impl Default for NonceLimits {
    /// About 40 bytes a nonce: at most ~40 MiB in all. 64 Ki nonces a sender cover ~1,000 requests a
    /// second over the whole window before the floor starts to rise.
    fn default() -> Self {
        NonceLimits {
            window_ms: MAX_SKEW.as_millis() as u64,
            max_per_sender: 1 << 16,
            max_total: 1 << 20,
            max_senders: 256,
        }
    }
}

#[derive(Default)]
struct Sender {
    seen: BTreeSet<(u64, Nonce)>,
    /// Messages stamped at or below this are refused (0: nothing forgotten yet).
    floor: u64,
}

impl Sender {
    /// Forgets the oldest nonce, raising the floor to its timestamp.
    fn forget_oldest(&mut self) -> bool {
        match self.seen.pop_first() {
            Some((ts, _)) => {
                self.floor = self.floor.max(ts);
                true
            }
            None => false,
        }
    }

    /// Drops nonces whose timestamps are no longer valid anywhere (`ts < cutoff`); returns how many.
    fn expire(&mut self, cutoff: u64) -> usize {
        let mut n = 0;
        while self.seen.first().is_some_and(|(ts, _)| *ts < cutoff) {
            self.forget_oldest();
            n += 1;
        }
        n
    }
}

#[derive(Default)]
struct State {
    senders: HashMap<NodeId, Sender>,
    total: usize,
}

impl State {
    /// Expires every sender's old nonces and drops senders with nothing left to remember.
    fn sweep(&mut self, cutoff: u64) {
        let mut expired = 0;
        self.senders.retain(|_, s| {
            expired += s.expire(cutoff);
            // A floor below the cutoff refuses nothing the skew check does not refuse already.
            !s.seen.is_empty() || s.floor >= cutoff
        });
        self.total -= expired;
    }
}

/// Nonces of the requests this node accepted, per sender (see the module doc).
pub struct NonceCache {
    limits: NonceLimits,
    state: Mutex<State>,
}

impl Default for NonceCache {
    fn default() -> Self {
        NonceCache::new(NonceLimits::default())
    }
}

impl NonceCache {
    pub fn new(limits: NonceLimits) -> NonceCache {
        NonceCache { limits, state: Mutex::new(State::default()) }
    }

    /// Accepts the first request from `node` with this timestamp and nonce, remembering it; refuses a
    /// second one, one older than what the cache still remembers, or a sender that does not fit.
    /// `ts` has already passed the skew check against `now_ms`.
    pub fn admit(&self, node: NodeId, ts: u64, nonce: Nonce, now_ms: u64) -> Result<(), AuthError> {
        let l = self.limits;
        let cutoff = now_ms.saturating_sub(l.window_ms);
        // Every count stays consistent even if a holder panicked (no await, a few map operations).
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !st.senders.contains_key(&node) && st.senders.len() >= l.max_senders {
            st.sweep(cutoff);
            if st.senders.len() >= l.max_senders {
                return Err(AuthError::TooManySenders);
            }
        }
        let st = &mut *st;
        let sender = st.senders.entry(node).or_default();
        st.total -= sender.expire(cutoff);
        if sender.floor > 0 && ts <= sender.floor {
            return Err(AuthError::Forgotten);
        }
        if !sender.seen.insert((ts, nonce)) {
            return Err(AuthError::Replayed);
        }
        st.total += 1;
        if sender.seen.len() > l.max_per_sender || st.total > l.max_total {
            // The sender pays for its own excess, even if the total is the others' doing: nobody can
            // evict another sender's nonces.
            if sender.forget_oldest() {
                st.total -= 1;
            }
        }
        Ok(())
    }

    /// Nonces remembered now (tests, metrics).
    pub fn len(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).total
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Senders with something remembered (tests).
    pub fn senders(&self) -> usize {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).senders.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(i: u8) -> Nonce {
        Nonce([i; 16])
    }

    fn cache(per_sender: usize, total: usize, senders: usize) -> NonceCache {
        NonceCache::new(NonceLimits {
            window_ms: 1_000,
            max_per_sender: per_sender,
            max_total: total,
            max_senders: senders,
        })
    }

    #[test]
    fn test_replay_is_refused_per_sender() {
        let c = cache(10, 100, 10);
        c.admit(1, 5_000, n(1), 5_000).expect("first");
        assert_eq!(c.admit(1, 5_000, n(1), 5_001), Err(AuthError::Replayed));
        // The same nonce from another sender, or at another time, is another message.
        c.admit(2, 5_000, n(1), 5_001).expect("other sender");
        c.admit(1, 5_001, n(1), 5_001).expect("other timestamp");
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn test_nonces_expire_with_their_timestamp_and_stay_refused() {
        let c = cache(10, 100, 10);
        c.admit(1, 5_000, n(1), 5_000).expect("first");
        c.admit(1, 5_900, n(2), 5_900).expect("second");
        // Past 5_000 + window the first is forgotten; the floor refuses it anyway (clock stepped back).
        c.admit(1, 6_100, n(3), 6_100).expect("third");
        assert_eq!(c.len(), 2);
        assert_eq!(c.admit(1, 5_000, n(1), 5_500), Err(AuthError::Forgotten));
        assert_eq!(c.admit(1, 5_900, n(2), 6_200), Err(AuthError::Replayed));
        // Long after, everything is gone, and so is the sender.
        c.admit(2, 20_000, n(9), 20_000).expect("another sender");
        let c2 = cache(10, 100, 1);
        c2.admit(1, 1_000, n(1), 1_000).expect("sender 1");
        assert_eq!(c2.admit(2, 1_000, n(1), 1_500), Err(AuthError::TooManySenders));
        c2.admit(2, 10_000, n(1), 10_000).expect("sender 1 swept");
        assert_eq!((c2.len(), c2.senders()), (1, 1));
    }

    #[test]
    fn test_per_sender_and_total_caps_bound_memory_and_raise_the_floor() {
        let c = cache(4, 6, 10);
        for i in 0..10u8 {
            c.admit(1, 1_000 + u64::from(i), n(i), 1_000).expect("fresh messages keep being accepted");
        }
        assert_eq!(c.len(), 4);
        // Forgotten nonces are refused, not accepted again.
        for i in 0..6u8 {
            assert_eq!(c.admit(1, 1_000 + u64::from(i), n(i), 1_010), Err(AuthError::Forgotten));
        }
        for i in 6..10u8 {
            assert_eq!(c.admit(1, 1_000 + u64::from(i), n(i), 1_010), Err(AuthError::Replayed));
        }
        // The total cap: sender 2 pays for its own excess, sender 1 keeps its nonces.
        for i in 0..5u8 {
            c.admit(2, 1_000 + u64::from(i), n(i), 1_000).expect("sender 2");
        }
        assert_eq!(c.len(), 6);
        assert_eq!(c.admit(1, 1_009, n(9), 1_010), Err(AuthError::Replayed));
        assert_eq!(c.admit(2, 1_002, n(2), 1_010), Err(AuthError::Forgotten));
    }
}
