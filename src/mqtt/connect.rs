//! CONNECT: who the connection is. The client id names the identity, the user name may repeat it, the
//! password is a SAS token signed with that identity's key. Identities registered for X.509
//! (`selfSigned`, `certificateAuthority`) never log in with a SAS token, even when keys were stored for
//! them: their owner chose certificates, and a leaked or guessed key must not open a way around that.
//! Conversely a CONNECT without a password but with a TLS client certificate is an X.509 login, which
//! only X.509 identities accept (`auth::x509` decides whether the certificate stands for the identity).

use percent_encoding::percent_decode_str;
use serde_json::Value;

use super::error::Refusal;
use super::Mqtt;
use crate::auth::{verify_device_token, x509, AuthError, SasToken};
use crate::ids::TwinId;
use crate::model::{now_ms, validate_id};
use crate::shard::ShardError;
use crate::twin::read::ReadOp;

/// The identity of a client id: `{deviceId}` or `{deviceId}/{moduleId}` (not URL-encoded).
pub fn parse_client_id(client_id: &str) -> Result<TwinId, Refusal> {
    let id = match client_id.split_once('/') {
        None => TwinId::device(client_id),
        Some((d, m)) => TwinId::module(d, m),
    };
    validate_id("device", &id.device_id).map_err(|e| Refusal::ClientId(e.to_string()))?;
    if let Some(m) = &id.module_id {
        validate_id("module", m).map_err(|e| Refusal::ClientId(e.to_string()))?;
    }
    Ok(id)
}

/// An accepted CONNECT: who logged in, and whether a persistent session of theirs had stored
/// subscriptions (a clean connect must discard them; known from the login's own read).
pub struct Login {
    pub id: TwinId,
    pub stored_subscriptions: bool,
}

/// A CONNECT user name, read loosely: `{host}/{device}[/{module}]/?{query}`. SDKs differ in the query
/// (api-version, DeviceClientType, model-id, in any order) and some send no query at all.
#[derive(Debug, PartialEq, Eq)]
pub struct Username<'a> {
    pub host: &'a str,
    /// The identity the user name names, if it names one.
    pub identity: Option<TwinId>,
    /// Query parameters, URL-decoded values.
    pub params: Vec<(&'a str, String)>,
}

impl Username<'_> {
    pub fn param(&self, key: &str) -> Option<&str> {
        self.params.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_str())
    }
}

pub fn parse_username(username: &str) -> Result<Username<'_>, String> {
    let (path, query) = match username.split_once("/?") {
        Some((p, q)) => (p, q),
        None => (username.strip_suffix('/').unwrap_or(username), ""),
    };
    let segments: Vec<&str> = path.split('/').collect();
    if segments.iter().any(|s| s.is_empty()) && !path.is_empty() {
        return Err(format!("user name path '{path}' has an empty segment"));
    }
    let identity = match segments[..] {
        [_] => None,
        [_, d] => Some(TwinId::device(d)),
        [_, d, m] => Some(TwinId::module(d, m)),
        _ => return Err(format!("user name path '{path}' has more than host/device/module")),
    };
    let params = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k, percent_decode_str(v).decode_utf8_lossy().into_owned())
        })
        .collect();
    Ok(Username { host: segments[0], identity, params })
}

/// The CONNECT fields authentication needs.
pub struct Credentials<'a> {
    pub client_id: &'a str,
    pub username: Option<&'a str>,
    pub password: Option<&'a str>,
    /// The TLS client certificate chain, leaf first; empty when none was sent (or over WebSockets).
    pub certs: &'a [rustls::pki_types::CertificateDer<'static>],
}

impl Mqtt {
    /// Decides whether a CONNECT may open a connection, and for which identity.
    pub async fn authenticate(&self, c: &Credentials<'_>) -> Result<Login, Refusal> {
        let id = parse_client_id(c.client_id)?;
        if let Some(u) = c.username.filter(|u| !u.is_empty()) {
            let u = parse_username(u).map_err(Refusal::BadCredentials)?;
            if let Some(named) = &u.identity {
                if *named != id {
                    return Err(Refusal::BadCredentials(format!("user name names {named}, client id is {id}")));
                }
            }
            tracing::debug!(
                client_id = c.client_id,
                host = u.host,
                api_version = u.param("api-version"),
                client_type = u.param("DeviceClientType"),
                model_id = u.param("model-id"),
                "CONNECT"
            );
        }
        let password = c.password.filter(|p| !p.is_empty());
        let Some(token) = password else {
            if c.certs.is_empty() {
                return Err(Refusal::BadCredentials("no password (SAS token) and no client certificate".into()));
            }
            return self.authenticate_x509(id, c.certs).await;
        };
        let token = SasToken::parse(token).map_err(|e| Refusal::BadCredentials(e.to_string()))?;
        // One read: keys, status, authentication type and stored subscriptions.
        let creds = self.twins.credentials(&id).await.map_err(Refusal::Unavailable)?;
        let creds = creds.ok_or_else(|| Refusal::BadCredentials(format!("{id} is not registered")))?;
        // Refused before the signature is checked: an X.509 identity usually has no key to check against,
        // and "not authorized" is what it gets whatever the token says.
        if !accepts_sas(&creds.auth_type) {
            return Err(Refusal::NotAuthorized(format!(
                "{id} authenticates with '{}' (X.509), not with SAS tokens",
                creds.auth_type
            )));
        }
        let host = self.sas_host(&token);
        verify_device_token(&token, host, &id.device_id, id.module_id.as_deref(), &creds, now_ms() / 1000).map_err(
            |e| match e {
                AuthError::Disabled => Refusal::NotAuthorized(format!("{id} is disabled")),
                other => Refusal::BadCredentials(other.to_string()),
            },
        )?;
        Ok(Login { stored_subscriptions: !creds.subscriptions.is_empty(), id })
    }

    /// A CONNECT with a client certificate and no password: the identity must be registered for X.509
    /// and the certificate must stand for it (see `auth::x509`), checked now, so an expired certificate
    /// or a CA no longer verified stops working on the next connect.
    async fn authenticate_x509(
        &self,
        id: TwinId,
        certs: &[rustls::pki_types::CertificateDer<'static>],
    ) -> Result<Login, Refusal> {
        let (creds, doc) =
            tokio::try_join!(self.twins.credentials(&id), self.identity_doc(&id)).map_err(Refusal::Unavailable)?;
        let not_registered = || Refusal::BadCredentials(format!("{id} is not registered"));
        let (creds, doc) = (creds.ok_or_else(not_registered)?, doc.ok_or_else(not_registered)?);
        let auth_type = auth_type_of(&doc);
        if accepts_sas(&auth_type) {
            return Err(Refusal::NotAuthorized(format!(
                "{id} authenticates with SAS tokens, not with a client certificate"
            )));
        }
        if !creds.enabled {
            return Err(Refusal::NotAuthorized(format!("{id} is disabled")));
        }
        let leaf = certs.first().map(|c| c.as_ref()).unwrap_or_default();
        let now = now_ms() / 1000;
        let refused = |e: x509::X509Error| Refusal::NotAuthorized(format!("{id}: {e}"));
        match auth_type.as_str() {
            "selfSigned" => {
                let thumb = |which: &str| {
                    doc.pointer(&format!("/authentication/x509Thumbprint/{which}")).and_then(Value::as_str)
                };
                x509::matches_thumbprint(leaf, &[thumb("primaryThumbprint"), thumb("secondaryThumbprint")])
                    .map_err(refused)?;
                x509::check_validity(leaf, now).map_err(refused)?;
            }
            "certificateAuthority" => {
                x509::check_common_name(leaf, &x509::expected_common_name(&id)).map_err(refused)?;
                let anchors =
                    self.twins.read_meta(|s| s.certificates.verified_anchors()).await.map_err(Refusal::Unavailable)?;
                x509::verify_chain(certs, &anchors, now).map_err(refused)?;
            }
            other => {
                return Err(Refusal::NotAuthorized(format!(
                    "{id} has authentication type '{other}', which no certificate satisfies"
                )))
            }
        }
        Ok(Login { stored_subscriptions: !creds.subscriptions.is_empty(), id })
    }

    /// The identity's registry document (`None`: no such identity).
    async fn identity_doc(&self, id: &TwinId) -> Result<Option<Value>, ShardError> {
        Ok(match &id.module_id {
            None => self.twins.device(&id.device_id).await?,
            Some(m) => self.twins.doc(&id.device_id, ReadOp::Module(id.device_id.clone(), m.clone())).await?.ok(),
        })
    }

    /// The host to check a token's resource against. The configured host name has no port, but a
    /// device may sign `{host}:{port}/devices/...` (its connection string's HostName); the port does
    /// not name another hub, so the token's own host is used when its name part is ours.
    fn sas_host<'a>(&'a self, token: &'a SasToken) -> &'a str {
        let ours = self.hostname.split(':').next().unwrap_or(&self.hostname);
        match token.resource.split_once("/devices/") {
            Some((h, _)) if h.split(':').next().is_some_and(|n| n.eq_ignore_ascii_case(ours)) => h,
            _ => &self.hostname,
        }
    }
}

/// `authentication.type` of a Device or Module document; a document without one is a `sas` identity
/// (the registry's default type).
fn auth_type_of(doc: &Value) -> String {
    doc.pointer("/authentication/type").and_then(Value::as_str).unwrap_or("sas").to_string()
}

/// Whether an identity of this authentication type may log in with a SAS token: `sas`, and `none`
/// (keys, if any, were set by the operator). `selfSigned` and `certificateAuthority` identities prove
/// themselves with a certificate; a type this server does not know is refused too.
pub fn accepts_sas(auth_type: &str) -> bool {
    matches!(auth_type, "sas" | "none")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sas_and_none_identities_accept_sas_tokens() {
        assert!(accepts_sas("sas"));
        assert!(accepts_sas("none"));
        for t in ["selfSigned", "certificateAuthority", "SAS", "x509", ""] {
            assert!(!accepts_sas(t), "{t}");
        }
        let doc = serde_json::json!({"authentication": {"type": "selfSigned", "symmetricKey": {"primaryKey": "k"}}});
        assert_eq!(auth_type_of(&doc), "selfSigned");
        assert_eq!(auth_type_of(&serde_json::json!({"deviceId": "d"})), "sas");
    }

    #[test]
    fn client_ids() {
        assert_eq!(parse_client_id("dev1").unwrap(), TwinId::device("dev1"));
        assert_eq!(parse_client_id("dev1/mod1").unwrap(), TwinId::module("dev1", "mod1"));
        assert_eq!(parse_client_id("d-1:x.y+z%_#*?!(),=@;$'").unwrap(), TwinId::device("d-1:x.y+z%_#*?!(),=@;$'"));
        for bad in ["", "/m", "d/", "d/m/x", "a b", "dev\u{e9}", &"x".repeat(129), "d/m m"] {
            assert!(matches!(parse_client_id(bad), Err(Refusal::ClientId(_))), "{bad:?}");
        }
    }

    #[test]
    fn usernames_of_every_sdk() {
        // Python device.
        let u = parse_username("localhost/dev1/?api-version=2019-10-01&DeviceClientType=azure-iot-device-iothub-py%2F2.14.0%283.11.7%3BLinux%29").unwrap();
        assert_eq!(u.host, "localhost");
        assert_eq!(u.identity, Some(TwinId::device("dev1")));
        assert_eq!(u.param("api-version"), Some("2019-10-01"));
        assert_eq!(u.param("DeviceClientType"), Some("azure-iot-device-iothub-py/2.14.0(3.11.7;Linux)"));
        // Python module; C with model id; Node with the query in another order.
        let u = parse_username("localhost/devm/mod1/?api-version=2019-10-01&DeviceClientType=x").unwrap();
        assert_eq!(u.identity, Some(TwinId::module("devm", "mod1")));
        let u = parse_username("hub.azure-devices.net/d/?api-version=2020-09-30&DeviceClientType=iothubclient%2F1.0&model-id=dtmi%3Acom%3Aexample%3B1").unwrap();
        assert_eq!(u.param("model-id"), Some("dtmi:com:example;1"));
        let u = parse_username("host:8883/d/?api-version=2021-04-12&model-id=x&DeviceClientType=node").unwrap();
        assert_eq!((u.host, u.identity), ("host:8883", Some(TwinId::device("d"))));
        // Docs form without client type; no query at all; host only.
        assert_eq!(parse_username("h/d/?api-version=2021-04-12").unwrap().identity, Some(TwinId::device("d")));
        assert_eq!(parse_username("h/d/").unwrap().identity, Some(TwinId::device("d")));
        assert_eq!(parse_username("h/d").unwrap().identity, Some(TwinId::device("d")));
        assert_eq!(parse_username("h").unwrap().identity, None);
        assert_eq!(parse_username("h/d/?flag").unwrap().param("flag"), Some(""));
        for bad in ["h//d/?x=1", "h/d/m/x/?a=1", "/d/", "h/d//"] {
            assert!(parse_username(bad).is_err(), "{bad}");
        }
    }

    /// Parsers take any text without panicking.
    #[test]
    fn fuzz_parsers_never_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(17);
        let alphabet: Vec<char> = "/?&=%$#+ a1.:\u{e9}\0".chars().collect();
        let id = TwinId::device("a1");
        for _ in 0..50_000 {
            let s: String = (0..rng.gen_range(0..24)).map(|_| alphabet[rng.gen_range(0..alphabet.len())]).collect();
            let _ = parse_username(&s);
            let _ = parse_client_id(&s);
            let _ = super::super::topics::classify(&s, &id);
            let _ = super::super::topics::valid_filter(&s);
            let _ = super::super::topics::matches(&s, &s);
            let _ = super::super::topics::matches(&s, "$iothub/twin/res/200/?$rid=1");
            let _ = SasToken::parse(&s);
        }
    }
}
