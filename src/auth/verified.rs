//! Service tokens this process has already verified, by their exact text, so that a client that sends
//! the same token with every request (every SDK does, for the token's lifetime of an hour or so) has
//! it parsed, URL- and base64-decoded and HMAC-checked once instead of twice per request.
//!
//! Only a token whose signature verified is ever kept, so a stranger cannot fill the map; it holds at
//! most [`CAPACITY`] tokens and starts over when full. A hit still checks what can change with time or
//! with the policies: the expiry against the clock, and that the policy still has the key that signed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::Policy;

/// Tokens kept at most: a node's service clients rarely hold more than a few tokens each.
pub const CAPACITY: usize = 1024;

/// What verifying a token established, minus what has to be checked again on every use.
#[derive(Clone, Debug)]
pub struct Verified {
    /// Index of the policy in its `Policies`.
    pub policy: usize,
    /// The key that signed, compared with the policy's keys on every hit.
    pub key: Arc<str>,
    /// The token's `sr`, URL-decoded.
    pub resource: Arc<str>,
    /// The token's `se`, seconds since the epoch.
    pub expires: i64,
}

impl Verified {
    /// Whether `policy` (the one at [`Verified::policy`]) still holds the key that signed.
    pub fn still_signed_by(&self, policy: &Policy) -> bool {
        *self.key == *policy.primary_key || *self.key == *policy.secondary_key
    }
}

/// The map itself. Not part of what a `Policies` is: a clone starts empty, and it never makes two
/// `Policies` differ.
#[derive(Default)]
pub struct VerifiedTokens(Mutex<HashMap<Box<str>, Verified>>);

impl VerifiedTokens {
    pub fn get(&self, token: &str) -> Option<Verified> {
        self.0.lock().ok()?.get(token).cloned()
    }

    pub fn insert(&self, token: &str, verified: Verified) {
        if let Ok(mut map) = self.0.lock() {
            if map.len() >= CAPACITY {
                map.clear();
            }
            map.insert(token.into(), verified);
        }
    }

    pub fn remove(&self, token: &str) {
        if let Ok(mut map) = self.0.lock() {
            map.remove(token);
        }
    }

    pub fn len(&self) -> usize {
        self.0.lock().map(|m| m.len()).unwrap_or(0)
    }
}

impl Clone for VerifiedTokens {
    fn clone(&self) -> Self {
        VerifiedTokens::default()
    }
}

impl PartialEq for VerifiedTokens {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for VerifiedTokens {}

impl std::fmt::Debug for VerifiedTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerifiedTokens({})", self.len())
    }
}
