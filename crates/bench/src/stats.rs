//! Measurements: HdrHistogram latencies per operation type, errors by kind, extra latency series
//! (push latency), counters, and a per-second series (throughput, p50/p99 of that second) for the
//! progress line and the plot. One `Recorder` is shared by all workers of a run.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::steal::{self, CpuTimes};

/// Latencies are recorded in microseconds, 1 µs .. 10 min, 3 significant digits.
pub fn new_hist() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("histogram bounds")
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl LatencySummary {
    pub fn of(h: &Histogram<u64>) -> LatencySummary {
        if h.is_empty() {
            return LatencySummary::default();
        }
        let ms = |us: u64| us as f64 / 1000.0;
        LatencySummary {
            count: h.len(),
            mean_ms: h.mean() / 1000.0,
            p50_ms: ms(h.value_at_quantile(0.50)),
            p90_ms: ms(h.value_at_quantile(0.90)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct OpSummary {
    /// Successful operations.
    pub count: u64,
    pub errors: u64,
    /// Successful operations per second over the measured interval.
    pub per_s: f64,
    #[serde(flatten)]
    pub latency: LatencySummary,
}

/// One second of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Second {
    /// Seconds since the measurement started (end of this interval).
    pub t_s: f64,
    pub ops_per_s: f64,
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub by_op: BTreeMap<String, u64>,
    /// The hypervisor's share of the machine's CPU in this second, in percent (see [`crate::steal`]).
    pub steal_pct: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub duration_s: f64,
    /// All operation types together.
    pub total: OpSummary,
    pub ops: BTreeMap<String, OpSummary>,
    /// `"{op}/{kind}"` → count.
    pub errors: BTreeMap<String, u64>,
    /// Extra latencies that are not operations (push latency, connect latency, …).
    pub latencies: BTreeMap<String, LatencySummary>,
    pub counters: BTreeMap<String, i64>,
    pub series: Vec<Second>,
    /// The hypervisor's share of the machine's CPU over the measured window, in percent.
    pub steal_pct: Option<f64>,
    /// The same in the window's worst second.
    pub steal_pct_max: Option<f64>,
    /// How busy each of the machine's CPUs was over the window, in percent (see [`crate::steal`]).
    pub cpu_busy_pct: Option<Vec<f64>>,
}

struct OpAcc {
    hist: Histogram<u64>,
    errors: u64,
}

struct Inner {
    started: Instant,
    /// Set by `freeze`: the end of the measured window; later records are ignored.
    frozen: Option<Instant>,
    last_tick: Instant,
    ops: BTreeMap<String, OpAcc>,
    all: Histogram<u64>,
    all_errors: u64,
    errors: BTreeMap<String, u64>,
    error_samples: Vec<String>,
    latencies: BTreeMap<String, Histogram<u64>>,
    counters: BTreeMap<String, i64>,
    interval: Histogram<u64>,
    interval_errors: u64,
    interval_by_op: BTreeMap<String, u64>,
    series: Vec<Second>,
    /// The machine's CPU counters at `started`, at `last_tick` and at `frozen`.
    cpu_started: Option<CpuTimes>,
    cpu_last_tick: Option<CpuTimes>,
    cpu_frozen: Option<CpuTimes>,
}

pub struct Recorder {
    inner: Mutex<Inner>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        let now = Instant::now();
        let cpu = CpuTimes::now();
        Recorder {
            inner: Mutex::new(Inner {
                started: now,
                frozen: None,
                last_tick: now,
                ops: BTreeMap::new(),
                all: new_hist(),
                all_errors: 0,
                errors: BTreeMap::new(),
                error_samples: Vec::new(),
                latencies: BTreeMap::new(),
                counters: BTreeMap::new(),
                interval: new_hist(),
                interval_errors: 0,
                interval_by_op: BTreeMap::new(),
                series: Vec::new(),
                cpu_started: cpu.clone(),
                cpu_last_tick: cpu,
                cpu_frozen: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A successful operation of type `op` that took `lat`.
    pub fn record(&self, op: &str, lat: Duration) {
        self.record_us(op, lat.as_micros() as u64)
    }

    pub fn record_us(&self, op: &str, us: u64) {
        let us = us.max(1);
        let mut g = self.lock();
        if g.frozen.is_some() {
            return;
        }
        match g.ops.get_mut(op) {
            Some(a) => a.hist.saturating_record(us),
            None => {
                let mut hist = new_hist();
                hist.saturating_record(us);
                g.ops.insert(op.to_string(), OpAcc { hist, errors: 0 });
            }
        }
        g.all.saturating_record(us);
        g.interval.saturating_record(us);
        *g.interval_by_op.entry(op.to_string()).or_default() += 1;
    }

    /// A failed operation of type `op`; `kind` classifies it (`timeout`, `http_503`, …).
    pub fn error(&self, op: &str, kind: &str, detail: &str) {
        let mut g = self.lock();
        if g.frozen.is_some() {
            return;
        }
        g.ops.entry(op.to_string()).or_insert_with(|| OpAcc { hist: new_hist(), errors: 0 }).errors += 1;
        g.all_errors += 1;
        g.interval_errors += 1;
        *g.errors.entry(format!("{op}/{kind}")).or_default() += 1;
        if g.error_samples.len() < 5 {
            let s = format!("{op}/{kind}: {detail}");
            eprintln!("error: {s}");
            g.error_samples.push(s);
        }
    }

    /// An extra latency (not an operation), in microseconds.
    pub fn latency_us(&self, name: &str, us: u64) {
        let mut g = self.lock();
        g.latencies.entry(name.to_string()).or_insert_with(new_hist).saturating_record(us.max(1));
    }

    pub fn count(&self, name: &str, n: i64) {
        *self.lock().counters.entry(name.to_string()).or_default() += n;
    }

    pub fn counter(&self, name: &str) -> i64 {
        self.lock().counters.get(name).copied().unwrap_or(0)
    }

    /// Forgets everything recorded so far (end of the warm-up); the clock restarts now.
    pub fn reset(&self) {
        let mut g = self.lock();
        let now = Instant::now();
        g.started = now;
        g.frozen = None;
        g.last_tick = now;
        g.ops.clear();
        g.all.reset();
        g.all_errors = 0;
        g.errors.clear();
        g.latencies.clear();
        g.counters.clear();
        g.interval.reset();
        g.interval_errors = 0;
        g.interval_by_op.clear();
        g.series.clear();
        g.cpu_started = CpuTimes::now();
        g.cpu_last_tick = g.cpu_started.clone();
        g.cpu_frozen = None;
    }

    /// Closes the current one-second interval and returns it (also kept in the series); `None` for a
    /// stub shorter than half a second (right after a `reset`).
    pub fn tick(&self) -> Option<(Second, LatencySummary, u64)> {
        let mut g = self.lock();
        let now = Instant::now();
        let dt = now.duration_since(g.last_tick).as_secs_f64().max(1e-6);
        if dt < 0.5 {
            return None;
        }
        g.last_tick = now;
        let cpu = CpuTimes::now();
        let steal_pct = steal::pct_between(g.cpu_last_tick.as_ref(), cpu.as_ref());
        g.cpu_last_tick = cpu;
        let s = Second {
            t_s: now.duration_since(g.started).as_secs_f64(),
            ops_per_s: g.interval.len() as f64 / dt,
            errors: g.interval_errors,
            p50_ms: g.interval.value_at_quantile(0.5) as f64 / 1000.0,
            p99_ms: g.interval.value_at_quantile(0.99) as f64 / 1000.0,
            by_op: std::mem::take(&mut g.interval_by_op),
            steal_pct,
        };
        g.interval.reset();
        g.interval_errors = 0;
        g.series.push(s.clone());
        Some((s, LatencySummary::of(&g.all), g.all_errors))
    }

    /// Closes the measured window: operations completing later are not counted.
    pub fn freeze(&self) {
        let mut g = self.lock();
        if g.frozen.is_none() {
            g.frozen = Some(Instant::now());
            g.cpu_frozen = CpuTimes::now();
        }
    }

    pub fn elapsed(&self) -> Duration {
        let g = self.lock();
        g.frozen.unwrap_or_else(Instant::now).duration_since(g.started)
    }

    /// Total successful operations so far.
    pub fn total_ops(&self) -> u64 {
        self.lock().all.len()
    }

    pub fn summary(&self) -> Summary {
        let g = self.lock();
        let end = g.frozen.unwrap_or_else(Instant::now);
        let cpu_end = g.cpu_frozen.clone().or_else(CpuTimes::now);
        let duration_s = end.duration_since(g.started).as_secs_f64().max(1e-6);
        let op_summary = |h: &Histogram<u64>, errors: u64| OpSummary {
            count: h.len(),
            errors,
            per_s: h.len() as f64 / duration_s,
            latency: LatencySummary::of(h),
        };
        Summary {
            duration_s,
            total: op_summary(&g.all, g.all_errors),
            ops: g.ops.iter().map(|(k, a)| (k.clone(), op_summary(&a.hist, a.errors))).collect(),
            errors: g.errors.clone(),
            latencies: g.latencies.iter().map(|(k, h)| (k.clone(), LatencySummary::of(h))).collect(),
            counters: g.counters.clone(),
            series: g.series.clone(),
            steal_pct: steal::pct_between(g.cpu_started.as_ref(), cpu_end.as_ref()),
            steal_pct_max: g.series.iter().filter_map(|s| s.steal_pct).reduce(f64::max),
            cpu_busy_pct: steal::busy_between(g.cpu_started.as_ref(), cpu_end.as_ref()),
        }
    }
}

/// Percentiles of signed samples (µs), e.g. push ack → receive, which can be negative.
#[derive(Debug, Clone, Serialize, Default)]
pub struct SignedSummary {
    pub count: usize,
    pub negative: usize,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

impl SignedSummary {
    pub fn of(mut v: Vec<i64>) -> SignedSummary {
        if v.is_empty() {
            return SignedSummary::default();
        }
        v.sort_unstable();
        let q = |p: f64| {
            let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
            v[i] as f64 / 1000.0
        };
        SignedSummary {
            count: v.len(),
            negative: v.iter().filter(|x| **x < 0).count(),
            p50_ms: q(0.5),
            p90_ms: q(0.9),
            p99_ms: q(0.99),
            p999_ms: q(0.999),
            max_ms: *v.last().unwrap() as f64 / 1000.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_summarises() {
        let r = Recorder::new();
        for i in 1..=100u64 {
            r.record_us("patch", i * 1000);
        }
        r.error("patch", "timeout", "x");
        std::thread::sleep(Duration::from_millis(600));
        let (sec, _, _) = r.tick().unwrap();
        assert_eq!(sec.by_op["patch"], 100);
        let s = r.summary();
        assert_eq!(s.ops["patch"].count, 100);
        assert_eq!(s.ops["patch"].errors, 1);
        assert!((s.ops["patch"].latency.p50_ms - 50.0).abs() < 0.1);
        assert_eq!(s.errors["patch/timeout"], 1);
        assert_eq!(s.series.len(), 1);
    }

    #[test]
    fn signed_percentiles() {
        let s = SignedSummary::of(vec![-2000, 1000, 3000, 4000]);
        assert_eq!(s.negative, 1);
        assert_eq!(s.p50_ms, 1.0);
        assert_eq!(s.max_ms, 4.0);
    }
}
