//! Jobs v2 (`scheduleUpdateTwin`, `scheduleDeviceMethod`): the job records (kept in the metadata group's state) and the
//! per-device outcome rows (kept in each device's shard, next to the twin they changed).
//!
//! Exactly once per device: a job's update reaches a device as one command that applies the patch and
//! records the device's row in the same apply. A command for a (job, device) that already has a row
//! changes nothing, so a runner that restarts after a failover, or retries a write whose answer it
//! lost, can resend every device's command without applying any twice.
//!
//! A method call cannot be undone or deduplicated by the device, so a method job runs each device's
//! call at most once: the runner first *claims* the device (a row in state `running`, through Raft),
//! calls only if its claim created the row, and then records the device's answer. A runner that takes
//! over finds the claim and never calls again; a claim left `running` by a runner that died mid-call is
//! recorded as failed (the call's fate is unknown).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::error::TwinError;
use super::time::format_ms;

/// Job types that run here.
pub const UPDATE_TWIN: &str = "scheduleUpdateTwin";
pub const DEVICE_METHOD: &str = "scheduleDeviceMethod";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobStatus {
    Queued,
    Scheduled,
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl JobStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Queued => "queued",
            JobStatus::Scheduled => "scheduled",
            JobStatus::Running => "running",
            JobStatus::Completed => "completed",
            JobStatus::Failed => "failed",
            JobStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<JobStatus> {
        [
            JobStatus::Queued,
            JobStatus::Scheduled,
            JobStatus::Running,
            JobStatus::Completed,
            JobStatus::Failed,
            JobStatus::Cancelled,
        ]
        .into_iter()
        .find(|j| j.as_str().eq_ignore_ascii_case(s))
    }

    pub fn is_final(self) -> bool {
        matches!(self, JobStatus::Completed | JobStatus::Failed | JobStatus::Cancelled)
    }
}

/// What a client asked for (validated by the front door).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub job_id: String,
    pub job_type: String,
    /// A bare WHERE clause over `devices`.
    pub query_condition: String,
    pub start_ms: i64,
    pub max_execution_secs: u64,
    /// The `updateTwin` object as sent (rendered back in responses).
    pub update_twin_json: String,
    /// The service patch applied to each device: `{"tags", "properties": {"desired"}}` of `updateTwin`.
    pub patch_json: String,
    pub created_ms: i64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStats {
    pub device_count: u64,
    pub failed: u64,
    pub succeeded: u64,
    pub running: u64,
    pub pending: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub spec: JobSpec,
    pub status: JobStatus,
    /// When a runner first started it (its `maxExecutionTimeInSeconds` counts from here).
    #[serde(default)]
    pub started_ms: Option<i64>,
    pub end_ms: Option<i64>,
    pub failure_reason: Option<String>,
    pub stats: JobStats,
    /// How far the runner got: every matching device up to this (shard, device id), in the runner's
    /// (shard, id) order, has its update applied. A runner that takes over after a failover goes on
    /// from here instead of starting over.
    #[serde(default)]
    pub cursor: Option<JobCursor>,
    /// The call a `scheduleDeviceMethod` job makes on each device.
    #[serde(default)]
    pub method: Option<super::method::MethodRequest>,
}

/// A position in a job's device order: (shard, device id).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobCursor {
    pub shard: u32,
    pub device_id: String,
}

/// A change of a job record (metadata-group log entry).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobOp {
    Create(JobSpec),
    Start {
        job_id: String,
        at_ms: i64,
    },
    Progress {
        job_id: String,
        stats: JobStats,
    },
    Finish {
        job_id: String,
        status: JobStatus,
        at_ms: i64,
        stats: JobStats,
        reason: Option<String>,
    },
    Cancel {
        job_id: String,
        at_ms: i64,
    },
    /// The runner's progress: counters (which only grow) and, once some prefix of the device order
    /// is done, the cursor after it (which only moves forward).
    Checkpoint {
        job_id: String,
        stats: JobStats,
        cursor: Option<JobCursor>,
    },
    /// A `scheduleDeviceMethod` job (its `spec` carries no patch).
    CreateMethod {
        spec: JobSpec,
        method: super::method::MethodRequest,
    },
}

impl JobOp {
    pub fn job_id(&self) -> &str {
        match self {
            JobOp::Create(spec) | JobOp::CreateMethod { spec, .. } => &spec.job_id,
            JobOp::Start { job_id, .. }
            | JobOp::Progress { job_id, .. }
            | JobOp::Finish { job_id, .. }
            | JobOp::Cancel { job_id, .. }
            | JobOp::Checkpoint { job_id, .. } => job_id,
        }
    }
}

/// Jobs that may be queued, scheduled or running at once: each running one holds the list of its
/// devices and takes its share of the fleet's write rate.
pub const MAX_ACTIVE_JOBS: usize = 100;

/// Job records by id.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobsState {
    pub jobs: BTreeMap<String, Job>,
}

impl JobsState {
    pub fn apply(&mut self, op: &JobOp) -> Result<Value, TwinError> {
        let missing = |id: &str| TwinError::InvalidArgument(format!("job {id} does not exist"));
        match op {
            JobOp::Create(spec) => self.create(spec, None),
            JobOp::CreateMethod { spec, method } => self.create(spec, Some(method)),
            JobOp::Start { job_id, at_ms } => {
                let job = self.jobs.get_mut(job_id).ok_or_else(|| missing(job_id))?;
                if matches!(job.status, JobStatus::Queued | JobStatus::Scheduled) {
                    job.status = JobStatus::Running;
                    job.started_ms = Some(*at_ms);
                }
                Ok(job.render())
            }
            JobOp::Progress { job_id, stats } => {
                let job = self.jobs.get_mut(job_id).ok_or_else(|| missing(job_id))?;
                if !job.status.is_final() {
                    job.stats = *stats;
                }
                Ok(job.render())
            }
            JobOp::Finish { job_id, status, at_ms, stats, reason } => {
                let job = self.jobs.get_mut(job_id).ok_or_else(|| missing(job_id))?;
                if !job.status.is_final() {
                    job.status = *status;
                    job.end_ms = Some(*at_ms);
                    job.stats = *stats;
                    job.failure_reason = reason.clone();
                }
                Ok(job.render())
            }
            JobOp::Checkpoint { job_id, stats, cursor } => {
                let job = self.jobs.get_mut(job_id).ok_or_else(|| missing(job_id))?;
                if !job.status.is_final() {
                    let old = job.stats;
                    job.stats = JobStats {
                        device_count: old.device_count.max(stats.device_count),
                        succeeded: old.succeeded.max(stats.succeeded),
                        failed: old.failed.max(stats.failed),
                        running: stats.running,
                        pending: stats.pending,
                    };
                    if cursor.is_some() && *cursor > job.cursor {
                        job.cursor = cursor.clone();
                    }
                }
                Ok(job.render())
            }
            JobOp::Cancel { job_id, at_ms } => {
                let job = self.jobs.get_mut(job_id).ok_or_else(|| missing(job_id))?;
                if !job.status.is_final() {
                    job.status = JobStatus::Cancelled;
                    job.end_ms = Some(*at_ms);
                }
                Ok(job.render())
            }
        }
    }
}

impl JobsState {
    fn create(&mut self, spec: &JobSpec, method: Option<&super::method::MethodRequest>) -> Result<Value, TwinError> {
        if let Some(existing) = self.jobs.get(&spec.job_id) {
            // The same request retried answers the job; another request with that id is refused.
            if existing.spec == *spec && existing.method.as_ref() == method {
                return Ok(existing.render());
            }
            return Err(TwinError::PreconditionFailed(format!("a job with id '{}' already exists", spec.job_id)));
        }
        if self.jobs.values().filter(|j| !j.status.is_final()).count() >= MAX_ACTIVE_JOBS {
            return Err(TwinError::JobQuotaExceeded { max: MAX_ACTIVE_JOBS });
        }
        let job = Job {
            spec: spec.clone(),
            status: JobStatus::Queued,
            started_ms: None,
            end_ms: None,
            failure_reason: None,
            stats: JobStats::default(),
            cursor: None,
            method: method.cloned(),
        };
        let out = job.render();
        self.jobs.insert(spec.job_id.clone(), job);
        Ok(out)
    }
}

impl Job {
    /// IoT Hub's JobResponse.
    pub fn render(&self) -> Value {
        let update_twin: Value = super::json_tree::parse_untrusted(&self.spec.update_twin_json).unwrap_or(Value::Null);
        let method = self.method.as_ref().map_or(Value::Null, |m| m.render());
        let s = &self.stats;
        let mut v = json!({
            "jobId": self.spec.job_id,
            "queryCondition": self.spec.query_condition,
            "createdTime": format_ms(self.spec.created_ms),
            "startTime": format_ms(self.spec.start_ms),
            "maxExecutionTimeInSeconds": self.spec.max_execution_secs,
            "type": self.spec.job_type,
            "updateTwin": update_twin,
            "cloudToDeviceMethod": method,
            "status": self.status.as_str(),
            "deviceJobStatistics": {
                "deviceCount": s.device_count,
                "failedCount": s.failed,
                "succeededCount": s.succeeded,
                "runningCount": s.running,
                "pendingCount": s.pending,
            },
        });
        if let Some(end) = self.end_ms {
            v["endTime"] = json!(format_ms(end));
        }
        if let Some(r) = &self.failure_reason {
            v["failureReason"] = json!(r);
            v["statusMessage"] = json!(r);
        }
        v
    }
}

/// One device's outcome of one job (a `devices.jobs` row).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceJobRow {
    pub job_type: String,
    pub succeeded: bool,
    pub created_ms: i64,
    pub start_ms: i64,
    pub end_ms: i64,
    /// Why the update failed (the twin error), when it did.
    pub error: Option<String>,
    /// A method job's device is claimed and its call has no recorded answer yet.
    #[serde(default)]
    pub running: bool,
    /// A method job's device answer, `{"status", "payload"}` as JSON text.
    #[serde(default)]
    pub method_response_json: Option<String>,
}

impl DeviceJobRow {
    pub fn render(&self, job_id: &str, device_id: &str) -> Value {
        let mut v = json!({
            "deviceId": device_id,
            "jobId": job_id,
            "jobType": self.job_type,
            "status": if self.running { "running" } else if self.succeeded { "completed" } else { "failed" },
            "startTimeUtc": format_ms(self.start_ms),
            "endTimeUtc": format_ms(self.end_ms),
            "createdDateTimeUtc": format_ms(self.created_ms),
            "lastUpdatedDateTimeUtc": format_ms(self.end_ms),
            "outcome": {},
        });
        if let Some(r) = self.method_response_json.as_deref().and_then(|r| super::json_tree::parse_untrusted(r).ok()) {
            v["outcome"] = json!({ "deviceMethodResponse": r });
        }
        if let Some(e) = &self.error {
            v["error"] = json!({"code": "JobRunPreconditionFailed", "description": e});
        }
        v
    }
}

/// Job rows of one shard: job id → device id → row (both in key order, as `devices.jobs` pages them).
/// Nested maps rather than tuple keys: snapshots are JSON, whose map keys are strings.
pub type DeviceJobs = BTreeMap<String, BTreeMap<String, DeviceJobRow>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str) -> JobSpec {
        JobSpec {
            job_id: id.into(),
            job_type: UPDATE_TWIN.into(),
            query_condition: "tags.a = 1".into(),
            start_ms: 1_700_000_000_000,
            max_execution_secs: 60,
            update_twin_json: r#"{"etag":"*","tags":{"x":1}}"#.into(),
            patch_json: r#"{"tags":{"x":1}}"#.into(),
            created_ms: 1_700_000_000_000,
        }
    }

    #[test]
    fn at_most_the_quota_of_jobs_is_active_and_an_ended_one_frees_a_place() {
        let mut s = JobsState::default();
        for i in 0..MAX_ACTIVE_JOBS {
            s.apply(&JobOp::Create(spec(&format!("j{i}")))).unwrap();
        }
        let e = s.apply(&JobOp::Create(spec("one-more"))).unwrap_err();
        assert_eq!(e, TwinError::JobQuotaExceeded { max: MAX_ACTIVE_JOBS });
        // A retried create of a job already there still answers it.
        assert_eq!(s.apply(&JobOp::Create(spec("j0"))).unwrap()["jobId"], "j0");
        s.apply(&JobOp::Cancel { job_id: "j0".into(), at_ms: 1_700_000_000_001 }).unwrap();
        assert_eq!(s.apply(&JobOp::Create(spec("one-more"))).unwrap()["status"], "queued");
    }

    #[test]
    fn checkpoints_only_move_forward() {
        let mut s = JobsState::default();
        s.apply(&JobOp::Create(spec("j"))).unwrap();
        let at = |shard: u32, d: &str| Some(JobCursor { shard, device_id: d.into() });
        let st =
            |succeeded: u64| JobStats { device_count: 10, succeeded, pending: 10 - succeeded, ..Default::default() };
        s.apply(&JobOp::Checkpoint { job_id: "j".into(), stats: st(4), cursor: at(1, "d4") }).unwrap();
        // A stale runner's late checkpoint moves nothing back.
        let v = s.apply(&JobOp::Checkpoint { job_id: "j".into(), stats: st(2), cursor: at(0, "d9") }).unwrap();
        assert_eq!(v["deviceJobStatistics"]["succeededCount"], 4);
        assert_eq!(s.jobs["j"].cursor, at(1, "d4"));
        s.apply(&JobOp::Checkpoint { job_id: "j".into(), stats: st(6), cursor: at(2, "a") }).unwrap();
        assert_eq!(s.jobs["j"].cursor, at(2, "a"));
        assert_eq!(s.jobs["j"].stats.succeeded, 6);
    }

    #[test]
    fn lifecycle_and_final_states_stick() {
        let mut s = JobsState::default();
        assert_eq!(s.apply(&JobOp::Create(spec("j"))).unwrap()["status"], "queued");
        assert_eq!(s.apply(&JobOp::Create(spec("j"))).unwrap()["status"], "queued", "a retried create answers the job");
        let mut other = spec("j");
        other.query_condition = "tags.a = 2".into();
        assert!(matches!(s.apply(&JobOp::Create(other)), Err(TwinError::PreconditionFailed(_))));
        assert_eq!(
            s.apply(&JobOp::Start { job_id: "j".into(), at_ms: 1_700_000_000_500 }).unwrap()["status"],
            "running"
        );
        let stats = JobStats { device_count: 2, succeeded: 2, ..Default::default() };
        let done = s
            .apply(&JobOp::Finish {
                job_id: "j".into(),
                status: JobStatus::Completed,
                at_ms: 1_700_000_001_000,
                stats,
                reason: None,
            })
            .unwrap();
        assert_eq!(done["status"], "completed");
        assert_eq!(done["deviceJobStatistics"]["succeededCount"], 2);
        assert_eq!(done["endTime"], "2023-11-14T22:13:21.000Z");
        assert_eq!(s.apply(&JobOp::Cancel { job_id: "j".into(), at_ms: 0 }).unwrap()["status"], "completed", "final");
        assert!(s.apply(&JobOp::Start { job_id: "nope".into(), at_ms: 0 }).is_err());
    }
}
