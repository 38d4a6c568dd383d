//! SAS token verification (docs/iothub-protocol.md §1.3) and the hub's shared access policies.

pub mod client;
mod policy;
mod sas;
mod verified;
pub mod x509;

pub use policy::{generate_key, write_atomically, Permission, Policies, Policy, PolicyFileError, OWNER};
pub use sas::{sign, verify_device_token, verify_signature, SasToken};

/// Why a request was not authorised. `Unauthorized` cases become 401, `Forbidden` 403, at the HTTP edge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing Authorization header")]
    Missing,
    #[error("malformed SAS token: {0}")]
    Malformed(String),
    #[error("SAS token expired at {0}")]
    Expired(i64),
    #[error("SAS token signature does not match")]
    BadSignature,
    #[error("SAS token resource '{0}' does not cover this hub or resource")]
    WrongResource(String),
    #[error("unknown shared access policy '{0}'")]
    UnknownPolicy(String),
    #[error("policy '{policy}' lacks the {needed:?} permission")]
    MissingPermission { policy: String, needed: Permission },
    #[error("device or module is disabled")]
    Disabled,
}
