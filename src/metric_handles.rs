//! Metric handles kept by their label values, for the paths every request takes.
//!
//! `metrics::counter!(name, labels)` builds a key from its labels (allocating each value), hashes it
//! and looks it up in the recorder's registry on every call. Four such calls per forwarded write were
//! about 1 % of a node's CPU under write load. A handle is a shared pointer to the series, so a path
//! keeps the handles it made by its own small key (a route, a kind, a peer: closed sets) and
//! increments them directly.
//!
//! A handle made before the process installs its recorder is a no-op forever; `node` installs the
//! recorder before it serves anything.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::RwLock;

/// Handles of one or more metric families by label values `K`.
pub struct HandleCache<K, H>(RwLock<Option<HashMap<K, H>>>);

impl<K: Hash + Eq, H: Clone> HandleCache<K, H> {
    pub const fn new() -> Self {
        HandleCache(RwLock::new(None))
    }

    /// The handles for `key`, made by `make` the first time.
    pub fn get(&self, key: K, make: impl FnOnce(&K) -> H) -> H {
        if let Ok(map) = self.0.read() {
            if let Some(h) = map.as_ref().and_then(|m| m.get(&key)) {
                return h.clone();
            }
        }
        let made = make(&key);
        match self.0.write() {
            Ok(mut map) => map.get_or_insert_with(HashMap::new).entry(key).or_insert(made).clone(),
            Err(_) => made,
        }
    }
}

impl<K: Hash + Eq, H: Clone> Default for HandleCache<K, H> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn makes_each_key_once() {
        let cache = HandleCache::<(&str, u16), u32>::new();
        let mut made = 0;
        for _ in 0..3 {
            assert_eq!(
                cache.get(("a", 1), |_| {
                    made += 1;
                    7
                }),
                7
            );
        }
        assert_eq!(cache.get(("a", 2), |_| 8), 8);
        assert_eq!(cache.get(("a", 1), |_| 9), 7, "the first handle stays");
        assert_eq!(made, 1);
    }
}
