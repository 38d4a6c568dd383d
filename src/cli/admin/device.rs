//! `twinhub device create|show|list|delete|connection-string`: the identity registry.

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::{cell, identity_path, if_match, print_json, print_table, resolve, IdArgs, API, TIMEOUT};
use crate::cli::remote::{RemoteError, Target};

#[derive(Subcommand, Debug)]
pub enum DeviceCommand {
    /// Create a device (or, with --module, a module); SAS keys are generated unless given.
    Create(CreateArgs),
    /// Print a device's (or module's) identity as JSON, keys included.
    Show(IdArgs),
    /// List devices: id, status, connection state, last activity (at most --top; use `twinhub query` for more).
    List(ListArgs),
    /// Delete a device (with its modules and twin) or a module.
    Delete(DeleteArgs),
    /// Print the connection string a device (or module) connects with, from its primary key.
    ConnectionString(IdArgs),
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    #[command(flatten)]
    pub id: IdArgs,
    /// Primary SAS key (base64); generated if absent
    #[arg(long, requires = "secondary_key")]
    pub primary_key: Option<String>,
    /// Secondary SAS key (base64)
    #[arg(long, requires = "primary_key")]
    pub secondary_key: Option<String>,
    /// Create the device disabled (it cannot connect until enabled)
    #[arg(long)]
    pub disabled: bool,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// At most this many devices (1–1000)
    #[arg(long, default_value_t = 100)]
    pub top: u32,
    /// Print the identities as JSON instead of a table
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Args, Debug)]
pub struct DeleteArgs {
    #[command(flatten)]
    pub id: IdArgs,
    /// Delete only if the identity still has this etag (default: whatever it is)
    #[arg(long, default_value = "*")]
    pub etag: String,
}

pub async fn main(cmd: DeviceCommand) -> Result<(), RemoteError> {
    match cmd {
        DeviceCommand::Create(a) => create(a).await,
        DeviceCommand::Show(a) => {
            print_json(&show(&a).await?);
            Ok(())
        }
        DeviceCommand::List(a) => list(a).await,
        DeviceCommand::Delete(a) => {
            let r = resolve(&a.id.target)?;
            let path = identity_path("devices", &a.id.id, a.id.module.as_deref());
            r.call(hyper::Method::DELETE, &path, &[if_match(&a.etag)], Vec::new(), TIMEOUT).await?;
            eprintln!("deleted {}", shown(&a.id));
            Ok(())
        }
        DeviceCommand::ConnectionString(a) => {
            let identity = show(&a).await?;
            let key = identity["authentication"]["symmetricKey"]["primaryKey"]
                .as_str()
                .ok_or_else(|| RemoteError::Usage(format!("{} does not use SAS keys", shown(&a))))?;
            let r = resolve(&a.target)?;
            let module = a.module.as_ref().map(|m| format!(";ModuleId={m}")).unwrap_or_default();
            // Devices dial MQTT (8883) or WebSockets (443) on the hub's host: no HTTPS port here.
            println!("HostName={};DeviceId={}{module};SharedAccessKey={key}", r.host, a.id);
            Ok(())
        }
    }
}

fn shown(a: &IdArgs) -> String {
    match &a.module {
        Some(m) => format!("module {}/{m}", a.id),
        None => format!("device {}", a.id),
    }
}

async fn show(a: &IdArgs) -> Result<Value, RemoteError> {
    let r = resolve(&a.target)?;
    Ok(r.call(hyper::Method::GET, &identity_path("devices", &a.id, a.module.as_deref()), &[], Vec::new(), TIMEOUT)
        .await?
        .1)
}

async fn create(a: CreateArgs) -> Result<(), RemoteError> {
    let r = resolve(&a.id.target)?;
    let mut body = json!({"deviceId": a.id.id, "status": if a.disabled { "disabled" } else { "enabled" }});
    if let Some(m) = &a.id.module {
        body["moduleId"] = json!(m);
    }
    if let (Some(p), Some(s)) = (&a.primary_key, &a.secondary_key) {
        body["authentication"] = json!({"type": "sas", "symmetricKey": {"primaryKey": p, "secondaryKey": s}});
    }
    // IoT Hub creates with PUT and no If-Match; an existing identity is refused (409), never replaced.
    let path = identity_path("devices", &a.id.id, a.id.module.as_deref());
    let (_, created) = r.call(hyper::Method::PUT, &path, &[], body.to_string().into_bytes(), TIMEOUT).await?;
    print_json(&created);
    Ok(())
}

async fn list(a: ListArgs) -> Result<(), RemoteError> {
    if !(1..=1000).contains(&a.top) {
        return Err(RemoteError::Usage(format!("--top must be from 1 to 1000, got {}", a.top)));
    }
    let r = resolve(&a.target)?;
    let path = format!("/devices?top={}&api-version={API}", a.top);
    let (_, v) = r.call(hyper::Method::GET, &path, &[], Vec::new(), TIMEOUT).await?;
    let devices = v.as_array().cloned().unwrap_or_default();
    if a.json {
        print_json(&Value::Array(devices));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = devices
        .iter()
        .map(|d| ["deviceId", "status", "connectionState", "lastActivityTime"].iter().map(|k| cell(&d[*k])).collect())
        .collect();
    print_table(&["DEVICE", "STATUS", "CONNECTION", "LAST ACTIVITY"], &rows);
    Ok(())
}
