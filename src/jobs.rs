//! The jobs runner: runs `scheduleUpdateTwin` and `scheduleDeviceMethod` jobs on the node that leads the group holding the job
//! records (the metadata group; shard 0 on a single-node hub).
//!
//! A job's life: created `queued` (through Raft, by any node's front door); once its start time has
//! come, the runner marks it `running`, finds its devices (its condition as a query over every shard),
//! sends each device one [`Op::JobUpdateTwin`] through the normal write path (routed to the device's
//! shard leader), and marks the job `completed` with statistics counted from the per-device rows the
//! shards recorded. A job runs under a throttle (a few writes in flight, a rate cap) so a fleet-wide
//! job does not starve live traffic. Cancellation and `maxExecutionTimeInSeconds` are checked between
//! devices.
//!
//! Failover: every two seconds the runner records, through Raft, its counters and a cursor: the
//! position in its (shard, device id) order up to which every device's update has applied. When
//! leadership moves, the new leader's runner reads the record, skips the devices up to the cursor and
//! carries the counters on, so progress accumulates across runners and the statistics only grow.
//! Devices between the cursor and where the old runner really was get their command again; those
//! already have a row and answer without applying anything (see `model::jobs`), so every device gets
//! the update exactly once.
//!
//! A method job calls each device's method through [`Methods`] (wherever the device is connected),
//! at most once per device: the device is claimed through Raft before the call and its answer recorded
//! after (see `model::jobs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::ids::TwinId;
use crate::model::jobs::{Job, JobCursor, JobOp, JobSpec, JobStats, JobStatus};
use crate::model::method::MethodRequest;
use crate::model::{now_ms, Command, Op, Reply};
use crate::mqtt::methods::Methods;
use crate::query;
use crate::shard::ShardError;
use crate::twin::Twins;

/// Job updates in flight at once.
const IN_FLIGHT: usize = 8;
/// At most this many device updates per second per job.
const RATE_PER_SEC: u64 = 500;

/// Runs until `stop`: every second, starts the due jobs if this node leads the job records.
pub async fn run(twins: Arc<Twins>, methods: Option<Arc<Methods>>, stop: CancellationToken) {
    let mut running: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        running.retain(|_, h| !h.is_finished());
        let Some(meta) = twins.meta_group() else { continue };
        if !meta.is_leader() {
            for (_, h) in running.drain() {
                h.abort();
            }
            continue;
        }
        let now = now_ms();
        let due: Vec<Job> = meta.read_local(|s| {
            s.jobs.jobs.values().filter(|j| !j.status.is_final() && j.spec.start_ms <= now).cloned().collect()
        });
        for job in due {
            if !running.contains_key(&job.spec.job_id) {
                tracing::info!(job = %job.spec.job_id, "running job");
                running.insert(job.spec.job_id.clone(), tokio::spawn(execute(twins.clone(), methods.clone(), job)));
            }
        }
    }
    for (_, h) in running {
        h.abort();
    }
}

async fn execute(twins: Arc<Twins>, methods: Option<Arc<Methods>>, job: Job) {
    let id = job.spec.job_id.clone();
    match run_job(&twins, methods.as_deref(), &job).await {
        Ok(()) => tracing::info!(job = %id, "job finished"),
        Err(e) => tracing::warn!(job = %id, "job interrupted (retried while this node leads): {e}"),
    }
}

async fn meta(twins: &Twins, op: JobOp) -> Result<(), ShardError> {
    match twins.propose_meta(Op::Job(op)).await? {
        Ok(_) => Ok(()),
        Err(e) => Err(ShardError::Refused { msg: e.to_string() }),
    }
}

fn job_status(twins: &Twins, job_id: &str) -> Option<JobStatus> {
    twins.meta_group().and_then(|m| m.read_local(|s| s.jobs.jobs.get(job_id).map(|j| j.status)))
}

/// Where a runner's window stands: which of its devices are done, and the longest done prefix. Only
/// the prefix is ever recorded (as the cursor, and as the count of devices done): a runner that
/// resumes redoes what lies past the cursor, so counting those devices too would count them twice.
struct Window {
    done: Vec<bool>,
    prefix: usize,
}

impl Window {
    fn new(n: usize) -> Window {
        Window { done: vec![false; n], prefix: 0 }
    }

    fn finish(&mut self, i: usize) {
        if let Some(d) = self.done.get_mut(i) {
            *d = true;
        }
        while self.done.get(self.prefix).copied().unwrap_or(false) {
            self.prefix += 1;
        }
    }
}

/// When a job started at `started_ms` must have finished; `None` without a limit (0). The limit is
/// whatever u64 the client sent in `maxExecutionTimeInSeconds`: a huge one means "no practical
/// limit", so the arithmetic saturates (`secs as i64 * 1000` overflowed: a panic in debug builds, a
/// wrapped, past deadline that failed the job at once in release builds).
fn deadline_ms(started_ms: i64, max_execution_secs: u64) -> Option<i64> {
    (max_execution_secs > 0).then(|| {
        let limit_ms = i64::try_from(max_execution_secs).unwrap_or(i64::MAX).saturating_mul(1000);
        started_ms.saturating_add(limit_ms)
    })
}

async fn run_job(twins: &Twins, methods: Option<&Methods>, job: &Job) -> Result<(), ShardError> {
    use futures::StreamExt;
    let spec = &job.spec;
    meta(twins, JobOp::Start { job_id: spec.job_id.clone(), at_ms: now_ms() }).await?;
    // The record as the last runner left it: a checkpointed cursor and counters are carried on.
    let record = twins.meta_group().and_then(|m| m.read_local(|s| s.jobs.jobs.get(&spec.job_id).cloned()));
    let started = record.as_ref().and_then(|j| j.started_ms).unwrap_or_else(now_ms);
    let (resume, base) = record.map(|j| (j.cursor, j.stats)).unwrap_or_default();
    let devices = matching_devices(twins, &spec.query_condition).await?;
    let remaining: Vec<JobCursor> = devices.into_iter().filter(|d| resume.as_ref().is_none_or(|c| d > c)).collect();
    let done_before = base.succeeded + base.failed;
    let total = base.device_count.max(done_before + remaining.len() as u64);
    if resume.is_some() {
        tracing::info!(job = %spec.job_id, done_before, remaining = remaining.len(), "resuming job from its checkpoint");
    }
    let checkpoint = |w: &Window, running: usize| {
        let done = done_before + w.prefix as u64;
        JobOp::Checkpoint {
            job_id: spec.job_id.clone(),
            stats: JobStats {
                device_count: total,
                succeeded: done,
                failed: 0,
                running: running as u64,
                pending: total.saturating_sub(done),
            },
            cursor: w.prefix.checked_sub(1).and_then(|i| remaining.get(i)).cloned(),
        }
    };
    let mut window = Window::new(remaining.len());
    meta(twins, checkpoint(&window, 0)).await?;
    let deadline = deadline_ms(started, spec.max_execution_secs);
    let mut throttle = tokio::time::interval(Duration::from_micros(1_000_000 / RATE_PER_SEC));
    throttle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut in_flight = futures::stream::FuturesUnordered::new();
    let mut last_progress = std::time::Instant::now();
    let mut stop: Option<(JobStatus, Option<String>)> = None;
    for (i, device) in remaining.iter().enumerate() {
        if i % 64 == 0 {
            if job_status(twins, &spec.job_id) == Some(JobStatus::Cancelled) {
                stop = Some((JobStatus::Cancelled, None));
                break;
            }
            if deadline.is_some_and(|d| now_ms() > d) {
                stop = Some((
                    JobStatus::Failed,
                    Some(format!("the job ran longer than maxExecutionTimeInSeconds ({})", spec.max_execution_secs)),
                ));
                break;
            }
        }
        throttle.tick().await;
        while in_flight.len() >= IN_FLIGHT {
            if let Some(r) = in_flight.next().await {
                window.finish(r?);
            }
        }
        let work: futures::future::BoxFuture<'_, Result<usize, ShardError>> = match &job.method {
            None => {
                let cmd = Command::new(
                    Op::JobUpdateTwin {
                        job_id: spec.job_id.clone(),
                        job_type: spec.job_type.clone(),
                        created_ms: spec.created_ms,
                        start_ms: spec.start_ms,
                        device_id: device.device_id.clone(),
                        patch_json: spec.patch_json.clone(),
                    },
                    now_ms(),
                );
                let id = TwinId::device(device.device_id.clone());
                Box::pin(async move { twins.write(&id, cmd).await.map(|_| i) })
            }
            Some(request) => {
                let call = call_method(twins, methods, spec, &device.device_id, request.clone());
                Box::pin(async move { call.await.map(|()| i) })
            }
        };
        in_flight.push(work);
        if last_progress.elapsed() > Duration::from_secs(2) {
            last_progress = std::time::Instant::now();
            meta(twins, checkpoint(&window, in_flight.len())).await?;
        }
    }
    while let Some(r) = in_flight.next().await {
        window.finish(r?);
    }
    meta(twins, checkpoint(&window, 0)).await?;
    let (succeeded, failed) = outcome_counts(twins, &spec.job_id).await?;
    let stats = JobStats {
        device_count: total.max(succeeded + failed),
        succeeded,
        failed,
        running: 0,
        pending: total.saturating_sub(succeeded + failed),
    };
    let (status, reason) = match stop {
        Some((JobStatus::Cancelled, _)) => return Ok(()),
        Some((s, r)) => (s, r),
        None => (JobStatus::Completed, None),
    };
    meta(twins, JobOp::Finish { job_id: spec.job_id.clone(), status, at_ms: now_ms(), stats, reason }).await
}

/// One device of a method job: claim it, call it if the claim is ours, record what it answered. A
/// device claimed before by a runner that stopped mid-call is recorded as failed, never called again.
async fn call_method(
    twins: &Twins,
    methods: Option<&Methods>,
    spec: &JobSpec,
    device_id: &str,
    request: MethodRequest,
) -> Result<(), ShardError> {
    let id = TwinId::device(device_id.to_string());
    let claim = Op::JobMethodClaim {
        job_id: spec.job_id.clone(),
        job_type: spec.job_type.clone(),
        created_ms: spec.created_ms,
        start_ms: spec.start_ms,
        device_id: device_id.to_string(),
    };
    let outcome = match twins.write(&id, Command::new(claim, now_ms())).await?.result {
        Ok(Reply::Claim { claimed: true, .. }) => match methods {
            Some(m) => m.invoke(&id, request).await.map(|r| (r.status, r.payload_json)).map_err(|e| e.to_string()),
            None => Err("direct methods are not running on the job's node".to_string()),
        },
        Ok(Reply::Claim { claimed: false, running: true }) => {
            Err("the job's runner stopped during this device's call; a method is never called twice".to_string())
        }
        // Answered before, or no such device (its row says so).
        Ok(_) => return Ok(()),
        Err(e) => {
            tracing::warn!(job = %spec.job_id, device_id, "claiming a device for a method job: {e}");
            return Ok(());
        }
    };
    let result = Op::JobMethodResult { job_id: spec.job_id.clone(), device_id: device_id.to_string(), outcome };
    twins.write(&id, Command::new(result, now_ms())).await.map(|_| ())
}

/// Device ids matching a job's condition, over every shard, in (shard, device id) order.
async fn matching_devices(twins: &Twins, condition: &str) -> Result<Vec<JobCursor>, ShardError> {
    let rows = twins.scan(&query::condition_query(condition)).await?;
    Ok(rows
        .into_iter()
        .filter_map(|(shard, r)| r["deviceId"].as_str().map(|d| JobCursor { shard, device_id: d.to_string() }))
        .collect())
}

/// (succeeded, failed) device rows of a job, counted on every shard.
async fn outcome_counts(twins: &Twins, job_id: &str) -> Result<(u64, u64), ShardError> {
    let text =
        format!("SELECT status, COUNT() AS n FROM devices.jobs WHERE jobId = {} GROUP BY status", query::quote(job_id));
    let (mut ok, mut failed) = (0, 0);
    for g in twins.aggregate(&text).await? {
        let n = g["n"].as_u64().unwrap_or(0);
        match g["status"].as_str() {
            Some("completed") => ok += n,
            Some("failed") => failed += n,
            _ => {}
        }
    }
    Ok((ok, failed))
}

#[cfg(test)]
mod tests {
    use super::{deadline_ms, Window};

    /// The cursor only covers devices whose whole prefix is done, whatever order they finish in.
    #[test]
    fn window_prefix_follows_the_oldest_unfinished_device() {
        let mut w = Window::new(5);
        w.finish(1);
        w.finish(2);
        assert_eq!(w.prefix, 0);
        w.finish(0);
        assert_eq!(w.prefix, 3);
        w.finish(2);
        w.finish(9);
        assert_eq!(w.prefix, 3, "repeats and strays change nothing");
        w.finish(4);
        w.finish(3);
        assert_eq!(w.prefix, 5);
    }

    /// Any `maxExecutionTimeInSeconds` a client sends gives a deadline, never an overflow.
    #[test]
    fn deadline_saturates_for_huge_limits() {
        assert_eq!(deadline_ms(1_000, 0), None);
        assert_eq!(deadline_ms(1_000, 2), Some(3_000));
        assert_eq!(deadline_ms(1_000, u64::MAX), Some(i64::MAX));
        assert_eq!(deadline_ms(1_000, i64::MAX as u64 / 1000 + 1), Some(i64::MAX));
        assert_eq!(deadline_ms(i64::MAX - 5, 1), Some(i64::MAX));
    }
}
