//! twinhub as a black box: the `cluster.json` written by `twinhub cluster up`, and a small HTTPS
//! client of the service API (registry and twins) authenticated as `iothubowner`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::Value;

use crate::http::{HttpConn, Tls};
use crate::sas;
use crate::targets::OpError;

pub const API_VERSION: &str = "2021-04-12";

#[derive(Debug, Clone, Deserialize)]
pub struct NodeInfo {
    pub id: u64,
    pub pid: u32,
    pub http: String,
    pub mqtt: String,
    #[serde(default)]
    pub mqtt_plain: Option<String>,
    #[serde(default)]
    pub events: Option<String>,
    #[serde(default)]
    pub data_dir: Option<PathBuf>,
    #[serde(default)]
    pub config: Option<PathBuf>,
    #[serde(default)]
    pub log: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ClusterInfo {
    pub owner_key: String,
    pub ca: PathBuf,
    pub hostname: String,
    #[serde(default)]
    pub shard_count: Option<u64>,
    pub nodes: Vec<NodeInfo>,
}

impl ClusterInfo {
    pub fn load(path: &Path) -> anyhow::Result<ClusterInfo> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))
    }
}

/// What the clients need to reach a twinhub cluster.
#[derive(Clone)]
pub struct Hub {
    pub info: ClusterInfo,
    pub tls: Tls,
    pub http: Vec<SocketAddr>,
    /// A service token of `iothubowner`, valid for a day.
    pub auth: String,
}

impl Hub {
    pub fn new(info: ClusterInfo) -> anyhow::Result<Hub> {
        let config = crate::tls::client_config(&info.ca)?;
        let tls = Tls { config, server_name: crate::tls::server_name(&info.hostname)? };
        let http = info.nodes.iter().map(|n| crate::http::addr(&n.http)).collect::<anyhow::Result<Vec<_>>>()?;
        let auth = sas::service_sas(&info.hostname, "iothubowner", &info.owner_key, sas::unix_now() + 86_400)?;
        Ok(Hub { info, tls, http, auth })
    }

    pub fn load(path: &Path) -> anyhow::Result<Hub> {
        Hub::new(ClusterInfo::load(path)?)
    }

    /// An HTTPS client connected (lazily) to node `i % nodes`.
    pub fn client(&self, i: usize) -> HubClient {
        let addr = self.http[i % self.http.len()];
        HubClient {
            conn: HttpConn::new(addr, Some(self.tls.clone()), self.info.hostname.clone()),
            auth: self.auth.clone(),
        }
    }

    /// Plain-TCP MQTT address of node `i % nodes` (or TLS if `tls`).
    pub fn mqtt_addr(&self, i: usize, tls: bool) -> anyhow::Result<SocketAddr> {
        let n = &self.info.nodes[i % self.info.nodes.len()];
        let a = if tls { Some(&n.mqtt) } else { n.mqtt_plain.as_ref() };
        let a = a.ok_or_else(|| anyhow::anyhow!("node {} has no plain MQTT port (mqtt_plain)", n.id))?;
        crate::http::addr(a)
    }

    pub fn pids(&self) -> Vec<u32> {
        self.info.nodes.iter().map(|n| n.pid).collect()
    }
}

/// One device of a bulk creation: id, primary key (the caller's, so a retried call finds the same
/// device), and optionally its tags and desired properties.
#[derive(Clone, Debug)]
pub struct BulkDevice {
    pub id: String,
    pub key: String,
    pub tags: Option<Value>,
    pub desired: Option<Value>,
}

/// One `ExportImportDevice` of a bulk create, as the bench sends it.
#[derive(serde::Serialize)]
struct ImportEntry<'a> {
    id: &'a str,
    #[serde(rename = "importMode")]
    import_mode: &'static str,
    status: &'static str,
    authentication: ImportAuth<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tags: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    properties: Option<ImportProperties<'a>>,
}

#[derive(serde::Serialize)]
struct ImportAuth<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(rename = "symmetricKey")]
    symmetric_key: ImportKeys<'a>,
}

#[derive(serde::Serialize)]
struct ImportKeys<'a> {
    #[serde(rename = "primaryKey")]
    primary: &'a str,
    #[serde(rename = "secondaryKey")]
    secondary: &'a str,
}

#[derive(serde::Serialize)]
struct ImportProperties<'a> {
    desired: &'a Value,
}

impl<'a> ImportEntry<'a> {
    fn create(d: &'a BulkDevice) -> ImportEntry<'a> {
        ImportEntry {
            id: &d.id,
            import_mode: "create",
            status: "enabled",
            authentication: ImportAuth {
                kind: "sas",
                symmetric_key: ImportKeys { primary: &d.key, secondary: &d.key },
            },
            tags: d.tags.as_ref(),
            properties: d.desired.as_ref().map(|desired| ImportProperties { desired }),
        }
    }
}

pub struct HubClient {
    pub conn: HttpConn,
    auth: String,
}

/// A twin as far as the bench cares: the desired `$version` after a write.
pub fn desired_version(twin: &Value) -> Option<i64> {
    twin.pointer("/properties/desired/$version").and_then(Value::as_i64)
}

fn status_error(status: u16, body: &[u8]) -> OpError {
    let text = String::from_utf8_lossy(&body[..body.len().min(300)]).to_string();
    OpError::new(&format!("http_{status}"), text)
}

impl HubClient {
    pub async fn send(&mut self, method: &str, path: &str, body: Option<Bytes>) -> Result<crate::http::Resp, OpError> {
        let sep = if path.contains('?') { '&' } else { '?' };
        let uri = format!("{path}{sep}api-version={API_VERSION}");
        let auth = self.auth.clone();
        self.conn.request(method, &uri, &[("authorization", auth.as_str())], body).await
    }

    /// `PUT /devices/{id}`; an existing device is read back instead. Returns the primary key.
    pub async fn create_device(&mut self, id: &str) -> Result<String, OpError> {
        let body = format!(
            "{{\"deviceId\":{},\"status\":\"enabled\",\"authentication\":{{\"type\":\"sas\",\"symmetricKey\":{{}}}}}}",
            serde_json::to_string(id).unwrap_or_default()
        );
        let path = format!("/devices/{}", sas::enc(id));
        let r = self.send("PUT", &path, Some(Bytes::from(body))).await?;
        let r = if r.status == 409 || r.status == 412 { self.send("GET", &path, None).await? } else { r };
        if r.status != 200 && r.status != 201 {
            return Err(status_error(r.status, &r.body));
        }
        let v: Value = serde_json::from_slice(&r.body).map_err(|e| OpError::new("bad_response", e))?;
        v.pointer("/authentication/symmetricKey/primaryKey")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| OpError::new("bad_response", "device without a primary key"))
    }

    /// `POST /devices` (the bulk registry call) creating each entry (with its tags and desired), at most
    /// 100. An entry answered `DeviceAlreadyExists` counts as created: it is what a retried call finds
    /// when the answer to the first attempt was lost (the keys are the caller's, so they match).
    pub async fn bulk_create(&mut self, entries: &[BulkDevice]) -> Result<(), OpError> {
        // Serialized from borrowed parts: the loading client shares the machine with the nodes it
        // measures, so it copies no twin section on the way.
        let body: Vec<ImportEntry<'_>> = entries.iter().map(ImportEntry::create).collect();
        let body = serde_json::to_vec(&body).map_err(|e| OpError::new("encode", e))?;
        let r = self.send("POST", "/devices", Some(Bytes::from(body))).await?;
        match r.status {
            200 => Ok(()),
            400 => {
                let v: Value = serde_json::from_slice(&r.body).map_err(|e| OpError::new("bad_response", e))?;
                let errors = v["errors"].as_array().cloned().unwrap_or_default();
                match errors.iter().find(|e| e["errorCode"] != "DeviceAlreadyExists") {
                    None if !errors.is_empty() => Ok(()),
                    Some(e) => Err(OpError::new(&format!("bulk_{}", e["errorCode"].as_str().unwrap_or("error")), e)),
                    None => Err(status_error(r.status, &r.body)),
                }
            }
            s => Err(status_error(s, &r.body)),
        }
    }

    /// Sends a twin write (`PATCH` or `PUT`) with a ready-made JSON body; returns the new desired
    /// `$version`.
    pub async fn write_twin(&mut self, method: &str, id: &str, body: Bytes) -> Result<i64, OpError> {
        let r = self.send(method, &format!("/twins/{}", sas::enc(id)), Some(body)).await?;
        if r.status != 200 {
            return Err(status_error(r.status, &r.body));
        }
        let v: Value = serde_json::from_slice(&r.body).map_err(|e| OpError::new("bad_response", e))?;
        desired_version(&v).ok_or_else(|| OpError::new("bad_response", "twin without properties.desired.$version"))
    }

    /// `PATCH /twins/{id}` of `{"properties":{"desired":{"fb": value}}}` without parsing the answer.
    pub async fn patch_fast(&mut self, id: &str, value: &str) -> Result<(), OpError> {
        let body = format!("{{\"properties\":{{\"desired\":{{\"fb\":{value}}}}}}}");
        let r = self.send("PATCH", &format!("/twins/{}", sas::enc(id)), Some(Bytes::from(body))).await?;
        if r.status != 200 {
            return Err(status_error(r.status, &r.body));
        }
        Ok(())
    }

    pub async fn get_twin(&mut self, id: &str) -> Result<Value, OpError> {
        let r = self.send("GET", &format!("/twins/{}", sas::enc(id)), None).await?;
        if r.status != 200 {
            return Err(status_error(r.status, &r.body));
        }
        serde_json::from_slice(&r.body).map_err(|e| OpError::new("bad_response", e))
    }
}
