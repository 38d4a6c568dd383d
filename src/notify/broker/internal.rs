//! The credential that opens rumqttd's internal listener.
//!
//! rumqttd listens on a loopback port that any local process can reach. If it accepted the policy SAS
//! tokens back ends use, a local process holding one could connect there directly, past the gate that
//! refuses publishes, and forge change events. So rumqttd accepts exactly one login: a user name and a
//! password drawn at random when the process starts, known only to this process. The gate checks the
//! back end's policy token and forwards its CONNECT with this login instead; a direct connection to
//! the loopback port has no login that works.

use base64::Engine;
use rand::RngCore;
use subtle::ConstantTimeEq;

/// The user name of the gate's forwarded CONNECTs.
pub const USER: &str = "twinhub-gate";

/// The per-process login of the internal broker.
pub struct InternalLogin {
    password: String,
}

impl InternalLogin {
    /// 256 random bits from the operating system, base64: unguessable, never written anywhere.
    pub fn generate() -> InternalLogin {
        let mut secret = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut secret);
        InternalLogin { password: base64::engine::general_purpose::STANDARD_NO_PAD.encode(secret) }
    }

    pub fn password(&self) -> &str {
        &self.password
    }

    /// Whether a login presented to rumqttd is this one (in constant time: the port is local, but a
    /// timing oracle on the password would still be one).
    pub fn verify(&self, user: &str, password: &str) -> bool {
        let pass_ok: bool = password.as_bytes().ct_eq(self.password.as_bytes()).into();
        user == USER && pass_ok
    }
}

impl std::fmt::Debug for InternalLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InternalLogin").field("user", &USER).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_processes_login_is_accepted() {
        let a = InternalLogin::generate();
        let b = InternalLogin::generate();
        assert_ne!(a.password(), b.password(), "each process draws its own");
        assert!(a.password().len() >= 43);
        assert!(a.verify(USER, a.password()));
        assert!(!a.verify(USER, b.password()));
        assert!(!a.verify("iothubowner", a.password()));
        assert!(!a.verify(USER, ""));
        assert!(!a.verify(USER, &a.password()[..10]));
        assert!(!format!("{a:?}").contains(a.password()), "never logged");
    }
}
