//! The once-a-second progress line on stderr (ops/s of the last second, p99 of the last second and of
//! the run so far, errors, the hypervisor's steal), which also closes the recorder's per-second
//! interval for the series.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::stats::Recorder;

/// Extra text appended to each progress line (e.g. pushes received so far).
pub type Extra = Arc<dyn Fn() -> String + Send + Sync>;

pub struct Progress {
    task: JoinHandle<()>,
}

impl Progress {
    pub fn spawn(rec: Arc<Recorder>, label: impl Into<String>, extra: Option<Extra>) -> Progress {
        let label = label.into();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some((s, run, errors)) = rec.tick() else { continue };
                let more = extra.as_ref().map(|f| format!("  {}", f())).unwrap_or_default();
                let steal = s.steal_pct.map(|v| format!("  steal {v:.1} %")).unwrap_or_default();
                eprintln!(
                    "[{label}] {:>5.0}s {:>8.0} ops/s  p50 {:>7.2} ms  p99 {:>7.2} ms (run p99 {:>7.2})  errors {}{more}{steal}",
                    s.t_s, s.ops_per_s, s.p50_ms, s.p99_ms, run.p99_ms, errors
                );
            }
        });
        Progress { task }
    }

    /// Stops the line; the last partial second is not added to the series.
    pub fn stop(self) {
        self.task.abort();
    }
}
