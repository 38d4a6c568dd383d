//! The hub's shared access policies and their keys, generated on first start and kept in the data
//! directory so that connection strings survive restarts.

use std::path::Path;
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use rand::RngCore;
use serde::{Deserialize, Serialize};

use super::verified::{Verified, VerifiedTokens};
use super::{AuthError, SasToken};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Permission {
    RegistryRead,
    RegistryWrite,
    ServiceConnect,
    DeviceConnect,
    /// Changing cluster membership (adding a node at an address, draining one): whoever holds it can
    /// have shard data replicated to a machine of their choosing, so only the owner policy has it.
    ClusterAdmin,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    pub name: String,
    pub primary_key: String,
    pub secondary_key: String,
    pub permissions: Vec<Permission>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policies {
    pub policies: Vec<Policy>,
    /// Tokens already verified against these policies (see `verified.rs`).
    #[serde(skip)]
    verified: VerifiedTokens,
}

/// Errors loading or saving `policies.json`.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    #[error("reading {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path} is not a valid policies file: {source}")]
    Parse { path: String, source: serde_json::Error },
    #[error("--owner-key is not valid base64")]
    BadOwnerKey,
}

pub const OWNER: &str = "iothubowner";

/// A fresh random 32-byte key, base64 (the form IoT Hub hands out).
pub fn generate_key() -> String {
    let mut k = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut k);
    B64.encode(k)
}

impl Policies {
    /// The four built-in policies with fresh keys.
    pub fn generate() -> Policies {
        use Permission::*;
        let p = |name: &str, permissions: Vec<Permission>| Policy {
            name: name.into(),
            primary_key: generate_key(),
            secondary_key: generate_key(),
            permissions,
        };
        Policies {
            policies: vec![
                p(OWNER, vec![RegistryRead, RegistryWrite, ServiceConnect, DeviceConnect, ClusterAdmin]),
                p("service", vec![ServiceConnect]),
                p("registryRead", vec![RegistryRead]),
                p("registryReadWrite", vec![RegistryRead, RegistryWrite]),
            ],
            verified: VerifiedTokens::default(),
        }
    }

    /// Loads `DIR/policies.json`, creating it on first start; `owner_key` (base64) overrides and persists
    /// iothubowner's primary key.
    pub fn load_or_create(dir: &Path, owner_key: Option<&str>) -> Result<Policies, PolicyFileError> {
        let path = dir.join("policies.json");
        let shown = path.display().to_string();
        let mut policies = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|source| PolicyFileError::Parse { path: shown.clone(), source })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Policies::generate(),
            Err(source) => return Err(PolicyFileError::Io { path: shown, source }),
        };
        if let Some(key) = owner_key {
            if B64.decode(key.trim()).is_err() || key.trim().is_empty() {
                return Err(PolicyFileError::BadOwnerKey);
            }
            if let Some(owner) = policies.policies.iter_mut().find(|p| p.name == OWNER) {
                owner.primary_key = key.trim().to_string();
            }
        }
        // Policies files written before ClusterAdmin existed: the owner gets it, nobody else.
        if let Some(owner) = policies.policies.iter_mut().find(|p| p.name == OWNER) {
            if !owner.permissions.contains(&Permission::ClusterAdmin) {
                owner.permissions.push(Permission::ClusterAdmin);
            }
        }
        let text = serde_json::to_vec_pretty(&policies)
            .map_err(|source| PolicyFileError::Parse { path: shown.clone(), source })?;
        write_atomically(&path, &text).map_err(|source| PolicyFileError::Io { path: shown, source })?;
        Ok(policies)
    }

    pub fn get(&self, name: &str) -> Option<&Policy> {
        self.policies.iter().find(|p| p.name == name)
    }

    pub fn owner_key(&self) -> &str {
        self.get(OWNER).map(|p| p.primary_key.as_str()).unwrap_or("")
    }

    /// Verifies an `Authorization` header for a service request on `host` (as the client dialled it,
    /// with or without port) needing `needed`. The token's resource must be the host or a prefix path
    /// of `request_resource` (e.g. `host/devices/d1`).
    pub fn authorize(
        &self,
        header: Option<&str>,
        host: &str,
        request_resource: &str,
        needed: Permission,
        now_secs: i64,
    ) -> Result<&Policy, AuthError> {
        let (policy, resource) = self.signed(header, host, now_secs)?;
        if !resource_covers(&resource, host, request_resource) {
            return Err(AuthError::WrongResource(resource.to_string()));
        }
        if !policy.permissions.contains(&needed) {
            return Err(AuthError::MissingPermission { policy: policy.name.clone(), needed });
        }
        Ok(policy)
    }

    /// Checks only that the header is a valid, unexpired token of one of this hub's policies (any
    /// resource of this hub, any permission). The HTTPS front door runs this before it reads a
    /// request body, so strangers cannot make it buffer anything; the route then checks resource and
    /// permission with [`Policies::authorize`].
    pub fn verify_credential(&self, header: Option<&str>, host: &str, now_secs: i64) -> Result<&Policy, AuthError> {
        self.signed(header, host, now_secs).map(|(policy, _)| policy)
    }

    /// The policy whose key signed the token in `header`, and the token's resource, once the token is
    /// known to be unexpired and for this hub. A token seen before is looked up instead of verified
    /// again; a new one is parsed and its signature checked.
    fn signed(&self, header: Option<&str>, host: &str, now_secs: i64) -> Result<(&Policy, Arc<str>), AuthError> {
        let header = header.ok_or(AuthError::Missing)?;
        if let Some(known) = self.verified.get(header) {
            match self.policies.get(known.policy) {
                Some(policy) if known.still_signed_by(policy) => {
                    if known.expires < now_secs {
                        self.verified.remove(header);
                        return Err(AuthError::Expired(known.expires));
                    }
                    if path_below_host(&known.resource, host).is_none() {
                        return Err(AuthError::WrongResource(known.resource.to_string()));
                    }
                    return Ok((policy, known.resource));
                }
                _ => self.verified.remove(header),
            }
        }
        let token = SasToken::parse(header)?;
        let skn = token.skn.as_deref().ok_or_else(|| AuthError::Malformed("missing 'skn' (policy name)".into()))?;
        let (index, policy) = self
            .policies
            .iter()
            .enumerate()
            .find(|(_, p)| p.name == skn)
            .ok_or_else(|| AuthError::UnknownPolicy(skn.to_string()))?;
        if path_below_host(&token.resource, host).is_none() {
            return Err(AuthError::WrongResource(token.resource.clone()));
        }
        let key = token.check(&[&policy.primary_key, &policy.secondary_key], now_secs)?;
        let resource: Arc<str> = token.resource.into();
        let verified = Verified { policy: index, key: key.into(), resource: resource.clone(), expires: token.se };
        self.verified.insert(header, verified);
        Ok((policy, resource))
    }
}

/// The token resource, without trailing `/`, must be the hub host (with or without port; host names
/// compare case-insensitively) or a path prefix of the requested resource below it. The path compares
/// exactly: device ids are case-sensitive, so a token for `devices/a` must not open `devices/A`.
fn resource_covers(resource: &str, host: &str, request_resource: &str) -> bool {
    let Some(token_path) = path_below_host(resource, host) else { return false };
    let path = request_resource.trim_start_matches('/');
    token_path.is_empty()
        || token_path == path
        || (path.starts_with(token_path) && path[token_path.len()..].starts_with('/'))
}

/// The path part of a token resource (`host[:port][/path]`, trailing `/` ignored), if its host part is
/// this hub's host (with or without port, case-insensitively).
fn path_below_host<'a>(resource: &'a str, host: &str) -> Option<&'a str> {
    let resource = resource.trim_end_matches('/');
    let (res_host, res_path) = resource.split_once('/').unwrap_or((resource, ""));
    let bare = host.split(':').next().unwrap_or(host);
    (res_host.eq_ignore_ascii_case(host) || res_host.eq_ignore_ascii_case(bare)).then_some(res_path)
}

/// Write to a temp file, fsync, rename: a crash leaves either the old or the new file. The file is
/// created `0600` and a missing parent `0700`: what is written this way (policy keys, TLS keys, the
/// listen addresses) is for the node's own user.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() && !parent.exists() {
            crate::secrets::create_private_dir(parent)?;
        }
    }
    let tmp = path.with_extension("tmp");
    {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts.open(&tmp)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            // A temp file left by an earlier crash keeps its old mode through `open`: tighten it.
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(parent) = path.parent() {
        if let Ok(d) = std::fs::File::open(parent) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::sign;

    fn token(policy: &str, key: &str, sr: &str, se: i64) -> String {
        let sig = B64.encode(sign(key, sr, se).unwrap());
        let sig = percent_encoding::utf8_percent_encode(&sig, percent_encoding::NON_ALPHANUMERIC).to_string();
        format!("SharedAccessSignature sr={sr}&sig={sig}&se={se}&skn={policy}")
    }

    #[test]
    fn permissions_and_keys() {
        let p = Policies::generate();
        let owner = p.get(OWNER).unwrap().clone();
        let svc = p.get("service").unwrap().clone();
        let se = 2_000_000_000;
        let h = token(OWNER, &owner.secondary_key, "localhost%3A8443", se);
        assert!(p.authorize(Some(&h), "localhost:8443", "devices/d1", Permission::RegistryWrite, 0).is_ok());
        // Without the port, too.
        let h2 = token(OWNER, &owner.primary_key, "LocalHost", se);
        assert!(p.authorize(Some(&h2), "localhost:8443", "twins/d1", Permission::ServiceConnect, 0).is_ok());
        let hs = token("service", &svc.primary_key, "localhost", se);
        assert_eq!(
            p.authorize(Some(&hs), "localhost", "devices/d1", Permission::RegistryRead, 0).unwrap_err(),
            AuthError::MissingPermission { policy: "service".into(), needed: Permission::RegistryRead }
        );
        let bad = token("service", &owner.primary_key, "localhost", se);
        assert_eq!(
            p.authorize(Some(&bad), "localhost", "", Permission::ServiceConnect, 0).unwrap_err(),
            AuthError::BadSignature
        );
        let unknown = token("nobody", &owner.primary_key, "localhost", se);
        assert_eq!(
            p.authorize(Some(&unknown), "localhost", "", Permission::ServiceConnect, 0).unwrap_err(),
            AuthError::UnknownPolicy("nobody".into())
        );
        assert_eq!(p.authorize(None, "localhost", "", Permission::ServiceConnect, 0).unwrap_err(), AuthError::Missing);
        assert_eq!(
            p.authorize(Some(&h), "localhost:8443", "", Permission::ServiceConnect, se + 1).unwrap_err(),
            AuthError::Expired(se)
        );
    }

    #[test]
    fn a_verified_token_is_kept_and_still_checked_on_every_use() {
        let mut p = Policies::generate();
        let owner = p.get(OWNER).unwrap().clone();
        let se = 2_000_000_000;
        let scoped = token(OWNER, &owner.primary_key, "localhost/devices/d1", se);
        let forged = token(OWNER, &generate_key(), "localhost", se);
        assert_eq!(p.verify_credential(Some(&forged), "localhost", 0).unwrap_err(), AuthError::BadSignature);
        assert_eq!(p.verified.len(), 0, "a token that failed is not kept");
        assert!(p.verify_credential(Some(&scoped), "localhost", 0).is_ok());
        assert_eq!(p.verified.len(), 1);
        // From the map: resource, permission, host and expiry are checked per use.
        assert!(p.authorize(Some(&scoped), "localhost", "devices/d1", Permission::RegistryRead, 0).is_ok());
        assert!(matches!(
            p.authorize(Some(&scoped), "localhost", "devices/d2", Permission::RegistryRead, 0),
            Err(AuthError::WrongResource(_))
        ));
        assert!(matches!(p.verify_credential(Some(&scoped), "elsewhere", 0), Err(AuthError::WrongResource(_))));
        assert_eq!(p.verify_credential(Some(&scoped), "localhost", se + 1).unwrap_err(), AuthError::Expired(se));
        assert_eq!(p.verified.len(), 0, "an expired token leaves the map");
        // A key that changed after the token was kept: the token is verified again, and fails.
        assert!(p.verify_credential(Some(&scoped), "localhost", 0).is_ok());
        let i = p.policies.iter().position(|x| x.name == OWNER).unwrap();
        p.policies[i].primary_key = generate_key();
        assert_eq!(p.verify_credential(Some(&scoped), "localhost", 0).unwrap_err(), AuthError::BadSignature);
        let svc = p.get("service").unwrap().clone();
        let hs = token("service", &svc.primary_key, "localhost", se);
        assert!(p.verify_credential(Some(&hs), "localhost", 0).is_ok());
        assert_eq!(
            p.authorize(Some(&hs), "localhost", "devices/d1", Permission::RegistryRead, 0).unwrap_err(),
            AuthError::MissingPermission { policy: "service".into(), needed: Permission::RegistryRead },
            "a kept token grants only its own policy's permissions"
        );
    }

    #[test]
    fn kept_tokens_are_bounded() {
        let p = Policies::generate();
        let owner = p.get(OWNER).unwrap().clone();
        for se in 0..(super::super::verified::CAPACITY as i64 + 10) {
            let t = token(OWNER, &owner.primary_key, "localhost", 2_000_000_000 + se);
            assert!(p.verify_credential(Some(&t), "localhost", 0).is_ok());
            assert!(p.verified.len() <= super::super::verified::CAPACITY);
        }
    }

    #[test]
    fn paths_are_case_sensitive_hosts_are_not() {
        assert!(resource_covers("LOCALHOST:8443/devices/a", "localhost:8443", "devices/a"));
        assert!(!resource_covers("localhost/devices/a", "localhost", "devices/A"));
        assert!(!resource_covers("localhost/Devices", "localhost", "devices/d1"));
        // A device named "query" is not the query endpoint's collection.
        assert!(!resource_covers("localhost/devices/query", "localhost", "devices"));
    }

    #[test]
    fn credential_check_needs_a_policy_token_of_this_hub() {
        let p = Policies::generate();
        let owner = p.get(OWNER).unwrap().clone();
        let se = 2_000_000_000;
        let scoped = token(OWNER, &owner.primary_key, "localhost/devices/d1", se);
        assert!(p.verify_credential(Some(&scoped), "localhost:8443", 0).is_ok());
        let other_hub = token(OWNER, &owner.primary_key, "elsewhere", se);
        assert!(matches!(p.verify_credential(Some(&other_hub), "localhost:8443", 0), Err(AuthError::WrongResource(_))));
        let forged = token(OWNER, &generate_key(), "localhost", se);
        assert_eq!(p.verify_credential(Some(&forged), "localhost", 0).unwrap_err(), AuthError::BadSignature);
        assert_eq!(p.verify_credential(None, "localhost", 0).unwrap_err(), AuthError::Missing);
    }

    #[test]
    fn only_the_owner_may_change_membership() {
        let p = Policies::generate();
        let with: Vec<_> = p
            .policies
            .iter()
            .filter(|x| x.permissions.contains(&Permission::ClusterAdmin))
            .map(|x| x.name.as_str())
            .collect();
        assert_eq!(with, [OWNER]);
    }

    #[test]
    fn resource_prefixes() {
        assert!(resource_covers("localhost:8443", "localhost:8443", "devices/d1"));
        assert!(resource_covers("localhost/devices", "localhost:8443", "devices/d1"));
        assert!(resource_covers("localhost/devices/d1", "localhost", "devices/d1"));
        assert!(!resource_covers("localhost/devices/d", "localhost", "devices/d1"));
        assert!(!resource_covers("otherhost", "localhost", "devices/d1"));
        assert!(!resource_covers("localhost/devices/d2", "localhost", "devices/d1"));
    }

    #[test]
    fn persisted_and_owner_key_override() {
        let dir = tempfile::tempdir().unwrap();
        let a = Policies::load_or_create(dir.path(), None).unwrap();
        let b = Policies::load_or_create(dir.path(), None).unwrap();
        assert_eq!(a, b);
        let key = generate_key();
        let c = Policies::load_or_create(dir.path(), Some(&key)).unwrap();
        assert_eq!(c.owner_key(), key);
        assert_eq!(c.get("service"), a.get("service"));
        assert_eq!(Policies::load_or_create(dir.path(), None).unwrap().owner_key(), key);
        assert!(matches!(Policies::load_or_create(dir.path(), Some("not base64!")), Err(PolicyFileError::BadOwnerKey)));
    }
}
