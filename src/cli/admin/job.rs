//! `twinhub job list|show|cancel|update-twin|method`: jobs v2 (`scheduleUpdateTwin`,
//! `scheduleDeviceMethod`) over the devices a query condition selects.

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use super::{cell, print_json, print_table, resolve, API, TIMEOUT};
use crate::cli::remote::{RemoteError, Target};

#[derive(Subcommand, Debug)]
pub enum JobCommand {
    /// List jobs with their status and progress.
    List(ListArgs),
    /// Print one job as JSON.
    Show(IdArgs),
    /// Cancel a job that has not finished.
    Cancel(IdArgs),
    /// Schedule a twin update (tags and desired properties) on every device the condition selects.
    UpdateTwin(UpdateTwinArgs),
    /// Schedule a direct method call on every device the condition selects.
    Method(MethodArgs),
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Print the jobs as JSON instead of a table
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Args, Debug)]
pub struct IdArgs {
    /// Job id
    pub id: String,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Args, Debug)]
pub struct Schedule {
    /// Job id (unique)
    pub id: String,
    /// Which devices: a query condition, e.g. "tags.site = 'b43'" or "STARTS_WITH(deviceId, 'lab-')"
    #[arg(long = "where")]
    pub condition: String,
    /// Give up on devices not reached within this many seconds
    #[arg(long, default_value_t = 3600)]
    pub max_seconds: u64,
}

#[derive(Args, Debug)]
pub struct UpdateTwinArgs {
    #[command(flatten)]
    pub schedule: Schedule,
    /// The twin patch: {"tags": {...}, "properties": {"desired": {...}}}
    #[arg(long)]
    pub patch: String,
    #[command(flatten)]
    pub target: Target,
}

#[derive(Args, Debug)]
pub struct MethodArgs {
    #[command(flatten)]
    pub schedule: Schedule,
    /// Method name
    #[arg(long)]
    pub method: String,
    /// Method payload (JSON)
    #[arg(long, default_value = "null")]
    pub payload: String,
    /// Seconds to wait for each device's answer
    #[arg(long, default_value_t = 30)]
    pub response_timeout: u64,
    #[command(flatten)]
    pub target: Target,
}

pub async fn main(cmd: JobCommand) -> Result<(), RemoteError> {
    match cmd {
        JobCommand::List(a) => list(a).await,
        JobCommand::Show(a) => {
            let r = resolve(&a.target)?;
            print_json(&r.call(hyper::Method::GET, &job_path(&a.id, ""), &[], Vec::new(), TIMEOUT).await?.1);
            Ok(())
        }
        JobCommand::Cancel(a) => {
            let r = resolve(&a.target)?;
            print_json(&r.call(hyper::Method::POST, &job_path(&a.id, "/cancel"), &[], Vec::new(), TIMEOUT).await?.1);
            Ok(())
        }
        JobCommand::UpdateTwin(a) => {
            let mut update = parse_json("--patch", &a.patch)?;
            if !update.is_object() {
                return Err(RemoteError::Usage("--patch must be a JSON object".into()));
            }
            // A job's twin update applies whatever each twin's etag is.
            update["etag"] = json!("*");
            schedule(&a.target, &a.schedule, json!({"type": "scheduleUpdateTwin", "updateTwin": update})).await
        }
        JobCommand::Method(a) => {
            let payload = parse_json("--payload", &a.payload)?;
            let call = json!({"methodName": a.method, "payload": payload, "responseTimeoutInSeconds": a.response_timeout, "connectTimeoutInSeconds": 0});
            schedule(&a.target, &a.schedule, json!({"type": "scheduleDeviceMethod", "cloudToDeviceMethod": call})).await
        }
    }
}

fn job_path(id: &str, suffix: &str) -> String {
    format!("/jobs/v2/{}{suffix}?api-version={API}", crate::auth::client::path_segment(id))
}

fn parse_json(what: &str, text: &str) -> Result<Value, RemoteError> {
    serde_json::from_str(text).map_err(|e| RemoteError::Usage(format!("{what} is not JSON: {e}")))
}

async fn schedule(target: &Target, s: &Schedule, mut body: Value) -> Result<(), RemoteError> {
    let r = resolve(target)?;
    body["jobId"] = json!(s.id);
    body["queryCondition"] = json!(s.condition);
    body["startTime"] = json!(crate::model::time::format_ms(crate::model::now_ms()));
    body["maxExecutionTimeInSeconds"] = json!(s.max_seconds);
    print_json(&r.call(hyper::Method::PUT, &job_path(&s.id, ""), &[], body.to_string().into_bytes(), TIMEOUT).await?.1);
    Ok(())
}

async fn list(a: ListArgs) -> Result<(), RemoteError> {
    let r = resolve(&a.target)?;
    let (_, v) =
        r.call(hyper::Method::GET, &format!("/jobs/v2/query?api-version={API}"), &[], Vec::new(), TIMEOUT).await?;
    let mut jobs = v["items"].as_array().cloned().unwrap_or_default();
    jobs.sort_by(|x, y| cell(&x["createdTime"]).cmp(&cell(&y["createdTime"])));
    if a.json {
        print_json(&Value::Array(jobs));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            let s = &j["deviceJobStatistics"];
            let done = s["succeededCount"].as_u64().unwrap_or(0) + s["failedCount"].as_u64().unwrap_or(0);
            vec![
                cell(&j["jobId"]),
                cell(&j["type"]),
                cell(&j["status"]),
                format!("{done}/{}", s["deviceCount"].as_u64().unwrap_or(0)),
                cell(&s["failedCount"]),
                cell(&j["createdTime"]),
            ]
        })
        .collect();
    print_table(&["JOB", "TYPE", "STATUS", "DONE", "FAILED", "CREATED"], &rows);
    Ok(())
}
