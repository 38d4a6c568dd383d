//! Reaching a running hub from the command line: which node, which credential, which CA — and signed
//! requests to it. Shared by `backup`/`restore`, the admin commands and `cluster status`.
//!
//! A target is, in this order of precedence:
//! 1. `--dir DIR`: a local cluster started by `twinhub cluster up` (its first node, CA and owner key);
//! 2. `--connection-string` (or `TWINHUB_CONNECTION_STRING`) with `--ca-file` (or `TWINHUB_CA_FILE`);
//! 3. a profile: `--profile NAME` (or `TWINHUB_PROFILE`, else `default`) in the profile file
//!    (`TWINHUB_PROFILES`, else `~/.config/twinhub/profiles.json`):
//!    `{"NAME": {"connectionString": "HostName=…;SharedAccessKeyName=…;SharedAccessKey=…", "caFile": "…"}}`.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use super::https::{self, Answer, HttpsError};

#[derive(Args, Debug, Clone, Default)]
pub struct Target {
    /// A local cluster's directory (`twinhub cluster up --dir`): its first node, CA and owner key
    #[arg(long, conflicts_with_all = ["connection_string", "profile"])]
    pub dir: Option<PathBuf>,
    /// A policy connection string of any node (`HostName=host:port;SharedAccessKeyName=…;SharedAccessKey=…`)
    #[arg(long, env = "TWINHUB_CONNECTION_STRING", hide_env_values = true)]
    pub connection_string: Option<String>,
    /// The CA certificate the node's HTTPS certificate chains to (PEM)
    #[arg(long, env = "TWINHUB_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// A named entry of the profile file (see `twinhub help device`)
    #[arg(long, env = "TWINHUB_PROFILE")]
    pub profile: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// Bad arguments or local files: nothing was sent.
    #[error("{0}")]
    Usage(String),
    /// The hub could not be reached (connection, TLS, timeout).
    #[error(transparent)]
    Unreachable(#[from] HttpsError),
    /// The hub answered with an error: its IoT Hub error code and text.
    #[error("{code}: {message} (HTTP {status})")]
    Hub { status: u16, code: String, message: String },
    /// The hub's answer was not what the protocol says.
    #[error("unexpected answer: {0}")]
    Invalid(String),
}

impl RemoteError {
    /// An error answer, with IoT Hub's `{"Message": "ErrorCode:<code>;<text>"}` taken apart.
    pub fn from_answer(status: u16, body: &[u8]) -> RemoteError {
        let text = String::from_utf8_lossy(body).into_owned();
        let message = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v["Message"].as_str().map(str::to_string))
            .unwrap_or_else(|| text.trim().to_string());
        let (code, message) = match message.strip_prefix("ErrorCode:").and_then(|m| m.split_once(';')) {
            Some((c, m)) => (c.to_string(), m.to_string()),
            None => (format!("HTTP{status}"), message),
        };
        RemoteError::Hub { status, code, message }
    }
}

/// Where and how to reach one node.
pub struct Remote {
    pub addr: SocketAddr,
    pub host: String,
    pub tls: Arc<rustls::ClientConfig>,
    /// `host:port` as in the connection string: the SAS resource.
    pub hub: String,
    key: String,
    policy: String,
}

/// The profile file's location.
fn profiles_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TWINHUB_PROFILES") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config/twinhub/profiles.json"))
}

/// The connection string and CA of a profile. An explicitly named profile must exist; the implicit
/// `default` may be absent (then there is simply no target).
fn profile(name: Option<&str>) -> Result<Option<(String, PathBuf)>, RemoteError> {
    let Some(path) = profiles_path() else { return Ok(None) };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && name.is_none() => return Ok(None),
        Err(e) => return Err(RemoteError::Usage(format!("the profile file {}: {e}", path.display()))),
    };
    let all: HashMap<String, Value> = serde_json::from_str(&text)
        .map_err(|e| RemoteError::Usage(format!("the profile file {} is not valid: {e}", path.display())))?;
    let wanted = name.unwrap_or("default");
    let Some(p) = all.get(wanted) else {
        return match name {
            Some(n) => Err(RemoteError::Usage(format!("no profile '{n}' in {}", path.display()))),
            None => Ok(None),
        };
    };
    let field = |k: &str| {
        p[k].as_str()
            .map(str::to_string)
            .ok_or_else(|| RemoteError::Usage(format!("profile '{wanted}' in {} has no \"{k}\"", path.display())))
    };
    let ca = PathBuf::from(field("caFile")?);
    // A relative CA path is relative to the profile file.
    let ca = match path.parent() {
        Some(dir) if ca.is_relative() => dir.join(ca),
        _ => ca,
    };
    Ok(Some((field("connectionString")?, ca)))
}

impl Remote {
    pub fn resolve(t: &Target) -> Result<Remote, RemoteError> {
        let (host_port, policy, key, ca) = if let Some(dir) = &t.dir {
            let file = super::cluster::read_cluster_file(dir).map_err(|e| RemoteError::Usage(e.to_string()))?;
            let n = file.nodes.first().ok_or_else(|| RemoteError::Usage(format!("{}: no nodes", dir.display())))?;
            (
                format!("{}:{}", file.hostname, n.http.port()),
                "iothubowner".to_string(),
                file.owner_key.clone(),
                file.ca.clone(),
            )
        } else {
            let (cs, ca) = match (&t.connection_string, profile(t.profile.as_deref())?) {
                (Some(cs), from_profile) => {
                    let ca = t.ca_file.clone().or(from_profile.map(|(_, ca)| ca));
                    (cs.clone(), ca.ok_or_else(|| RemoteError::Usage("--ca-file (or TWINHUB_CA_FILE) is required with a connection string".into()))?)
                }
                (None, Some((cs, ca))) => (cs, t.ca_file.clone().unwrap_or(ca)),
                (None, None) => {
                    return Err(RemoteError::Usage(
                        "which hub? give --connection-string and --ca-file (or TWINHUB_CONNECTION_STRING and TWINHUB_CA_FILE), --profile, or --dir".into(),
                    ))
                }
            };
            let (host_port, policy, key) = parse_connection_string(&cs)?;
            (host_port, policy, key, ca)
        };
        let addr = host_port
            .to_socket_addrs()
            .map_err(|e| RemoteError::Usage(format!("{host_port}: {e}")))?
            .next()
            .ok_or_else(|| RemoteError::Usage(format!("{host_port} resolves to no address")))?;
        let host = host_port.rsplit_once(':').map_or(host_port.as_str(), |(h, _)| h).to_string();
        let tls = https::client_config(&ca).map_err(|e| RemoteError::Usage(e.to_string()))?;
        Ok(Remote { addr, host, tls, hub: host_port, key, policy })
    }

    /// The same credential at another node (`cluster status` asks every node): each node checks
    /// tokens against its own `host:port`.
    pub fn at(&self, host: &str, addr: SocketAddr) -> Remote {
        let hub = format!("{host}:{}", addr.port());
        Remote {
            addr,
            host: host.to_string(),
            tls: self.tls.clone(),
            hub,
            key: self.key.clone(),
            policy: self.policy.clone(),
        }
    }

    /// A policy token valid for an hour.
    pub fn token(&self) -> Result<String, RemoteError> {
        let expiry = crate::model::now_ms() as u64 / 1000 + 3600;
        crate::auth::client::service_token(&self.hub, &self.policy, &self.key, expiry)
            .map_err(|e| RemoteError::Usage(format!("the connection string's key: {e}")))
    }

    fn headers(&self, extra: &[(&str, String)]) -> Result<Vec<(String, String)>, RemoteError> {
        let mut h = vec![("authorization".to_string(), self.token()?)];
        h.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        Ok(h)
    }

    /// A signed request; any answer (errors included) is returned.
    pub async fn send(
        &self,
        method: hyper::Method,
        path: &str,
        extra: &[(&str, String)],
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Answer, RemoteError> {
        let headers = self.headers(extra)?;
        Ok(https::request_with(self.tls.clone(), self.addr, &self.host, method, path, &headers, body, timeout).await?)
    }

    /// A signed request whose answer must be a 2xx: its headers and JSON body (`Null` when empty).
    pub async fn call(
        &self,
        method: hyper::Method,
        path: &str,
        extra: &[(&str, String)],
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<(hyper::HeaderMap, Value), RemoteError> {
        let a = self.send(method, path, extra, body, timeout).await?;
        if !(200..300).contains(&a.status) {
            return Err(RemoteError::from_answer(a.status, &a.body));
        }
        if a.body.is_empty() {
            return Ok((a.headers, Value::Null));
        }
        let v = serde_json::from_slice(&a.body)
            .map_err(|e| RemoteError::Invalid(format!("{path}: the answer is not JSON: {e}")))?;
        Ok((a.headers, v))
    }

    /// A signed request whose body streams (the change feed); an error answer is read whole.
    pub async fn open(
        &self,
        path: &str,
        extra: &[(&str, String)],
        timeout: Duration,
    ) -> Result<hyper::Response<hyper::body::Incoming>, RemoteError> {
        use http_body_util::BodyExt;
        let headers = self.headers(extra)?;
        let resp = tokio::time::timeout(
            timeout,
            https::open(self.tls.clone(), self.addr, &self.host, hyper::Method::GET, path, &headers, Vec::new()),
        )
        .await
        .map_err(|_| HttpsError::Timeout(self.addr.to_string()))??;
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            let body = tokio::time::timeout(timeout, resp.into_body().collect())
                .await
                .ok()
                .and_then(Result::ok)
                .map(|b| b.to_bytes().to_vec())
                .unwrap_or_default();
            return Err(RemoteError::from_answer(status, &body));
        }
        Ok(resp)
    }
}

/// `(host:port, policy, key)` of a policy connection string.
pub fn parse_connection_string(cs: &str) -> Result<(String, String, String), RemoteError> {
    let parts: HashMap<&str, &str> =
        cs.split(';').filter_map(|p| p.split_once('=')).map(|(k, v)| (k.trim(), v.trim())).collect();
    if parts.contains_key("DeviceId") && !parts.contains_key("SharedAccessKeyName") {
        return Err(RemoteError::Usage(
            "that is a device connection string: give a shared access policy's (e.g. iothubowner)".into(),
        ));
    }
    let get = |k: &str| {
        parts
            .get(k)
            .map(|v| v.to_string())
            .ok_or_else(|| RemoteError::Usage(format!("the connection string has no {k}")))
    };
    let host = get("HostName")?;
    let host = if host.contains(':') { host } else { format!("{host}:443") };
    Ok((host, get("SharedAccessKeyName")?, get("SharedAccessKey")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_strings_are_taken_apart_or_refused_with_the_reason() {
        let (h, p, k) =
            parse_connection_string("HostName=localhost:8443;SharedAccessKeyName=iothubowner;SharedAccessKey=a2V5")
                .unwrap();
        assert_eq!((h.as_str(), p.as_str(), k.as_str()), ("localhost:8443", "iothubowner", "a2V5"));
        let (h, _, _) =
            parse_connection_string("HostName=hub.example;SharedAccessKeyName=service;SharedAccessKey=a2V5").unwrap();
        assert_eq!(h, "hub.example:443");
        let e = parse_connection_string("HostName=h:1;DeviceId=d;SharedAccessKey=a2V5").unwrap_err().to_string();
        assert!(e.contains("device connection string"), "{e}");
        let e = parse_connection_string("HostName=h:1;SharedAccessKey=a2V5").unwrap_err().to_string();
        assert!(e.contains("SharedAccessKeyName"), "{e}");
    }

    #[test]
    fn hub_errors_keep_their_code_and_text() {
        let e = RemoteError::from_answer(
            404,
            br#"{"Message":"ErrorCode:DeviceNotFound;Device d1 not found","ExceptionMessage":"x"}"#,
        );
        assert_eq!(e.to_string(), "DeviceNotFound: Device d1 not found (HTTP 404)");
        let e = RemoteError::from_answer(502, b"bad gateway");
        assert_eq!(e.to_string(), "HTTP502: bad gateway (HTTP 502)");
    }
}
