//! At-most-once: the outcomes of the last [`DEDUPE_WINDOW`] commands of a shard, by request id, so a
//! retried command (after a leader change, an MQTT DUP re-send) answers its first outcome instead of
//! applying twice. FIFO by apply order, hence the same on every replica; part of the snapshot.
//!
//! Documents are not stored: ten thousand twin documents per shard would cost far more memory than the
//! twins themselves. A duplicate of a successful write answers the entity's current document instead;
//! errors and versions are stored exactly.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

use super::command::RequestId;
use super::error::TwinError;
use crate::ids::TwinId;

pub const DEDUPE_WINDOW: usize = 10_000;

/// A compact record of an outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Remembered {
    Err(TwinError),
    Done,
    Reported(i64),
    Device(String),
    Module(String, String),
    Twin(TwinId),
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "Vec<(RequestId, Remembered)>", into = "Vec<(RequestId, Remembered)>")]
pub struct Dedupe {
    order: VecDeque<RequestId>,
    outcomes: BTreeMap<RequestId, Remembered>,
}

impl Dedupe {
    pub fn get(&self, id: &RequestId) -> Option<&Remembered> {
        self.outcomes.get(id)
    }

    pub fn remember(&mut self, id: RequestId, outcome: Remembered) {
        if self.outcomes.insert(id, outcome).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > DEDUPE_WINDOW {
            if let Some(old) = self.order.pop_front() {
                self.outcomes.remove(&old);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }
}

impl From<Vec<(RequestId, Remembered)>> for Dedupe {
    fn from(v: Vec<(RequestId, Remembered)>) -> Dedupe {
        let mut d = Dedupe::default();
        for (id, o) in v {
            d.remember(id, o);
        }
        d
    }
}

impl From<Dedupe> for Vec<(RequestId, Remembered)> {
    fn from(mut d: Dedupe) -> Self {
        d.order.iter().filter_map(|id| d.outcomes.remove(id).map(|o| (*id, o))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_is_fifo_and_bounded() {
        let mut d = Dedupe::default();
        for i in 0..(DEDUPE_WINDOW as u128 + 5) {
            d.remember(RequestId(i), Remembered::Reported(i as i64));
        }
        assert_eq!(d.len(), DEDUPE_WINDOW);
        assert!(d.get(&RequestId(4)).is_none());
        assert_eq!(d.get(&RequestId(5)), Some(&Remembered::Reported(5)));
        let back: Dedupe = Vec::from(d.clone()).into();
        assert_eq!(back, d);
    }
}
