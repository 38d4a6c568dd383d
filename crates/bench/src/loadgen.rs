//! Load drivers. A `Worker` owns one connection and performs one operation per `step`; the drivers run
//! many of them either closed-loop (each worker starts its next operation when the previous one ends:
//! maximum throughput at a given concurrency) or open-loop (operations are scheduled at a fixed rate
//! and a latency is measured from the *intended* send time, so a stalled target is not hidden by
//! coordinated omission). Both show progress every second and leave their numbers in a `Recorder`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, Mutex};

use crate::progress::{Extra, Progress};
use crate::sas::unix_micros;
use crate::stats::Recorder;
use crate::targets::{Client, OpError, Target};
use crate::value::{self, SizeDist};

/// One operation's type and outcome.
pub type Outcome = (&'static str, Result<(), OpError>);

pub trait Worker: Send + 'static {
    fn step(&mut self) -> impl Future<Output = Outcome> + Send;
}

/// Updates random twins out of `twins` with fresh values (the shape of scenario (a) and the compare).
pub struct UpdateWorker<C: Client> {
    pub client: C,
    pub keys: Arc<Vec<String>>,
    pub value: SizeDist,
    pub rng: StdRng,
    pub seq: u64,
}

impl<C: Client> UpdateWorker<C> {
    pub fn new(client: C, keys: Arc<Vec<String>>, value: SizeDist) -> Self {
        UpdateWorker { client, keys, value, rng: StdRng::from_entropy(), seq: 0 }
    }
}

impl<C: Client> Worker for UpdateWorker<C> {
    async fn step(&mut self) -> Outcome {
        let i = self.rng.gen_range(0..self.keys.len());
        self.seq += 1;
        let size = self.value.sample(&mut self.rng);
        let v = value::make(self.seq, unix_micros(), size);
        let key = self.keys[i].clone();
        ("update", self.client.update(&key, &v).await)
    }
}

/// Creates `concurrency` workers updating `twins` keys of `target`.
pub async fn update_workers<T: Target>(
    target: &T,
    keys: Arc<Vec<String>>,
    value: SizeDist,
    concurrency: usize,
) -> anyhow::Result<Vec<UpdateWorker<T::Client>>> {
    let mut ws = Vec::with_capacity(concurrency);
    for w in 0..concurrency {
        ws.push(UpdateWorker::new(target.client(w).await?, keys.clone(), value));
    }
    Ok(ws)
}

/// Writes every key once (after `create` where the target needs it), `concurrency` at a time, so that
/// all targets hold the same data set before the measurement. Returns (seconds, errors).
pub async fn populate<T: Target>(
    target: &T,
    keys: Arc<Vec<String>>,
    value: SizeDist,
    concurrency: usize,
) -> anyhow::Result<(f64, u64)> {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let mut c = target.client(w).await?;
        let (keys, next, done, errors) = (keys.clone(), next.clone(), done.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::from_entropy();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= keys.len() {
                    break;
                }
                let v = value::make(0, unix_micros(), value.sample(&mut rng));
                let mut ok = false;
                for attempt in 0..5 {
                    let r = match c.create(&keys[i]).await {
                        Ok(()) => c.update(&keys[i], &v).await,
                        Err(e) => Err(e),
                    };
                    match r {
                        Ok(()) => {
                            ok = true;
                            break;
                        }
                        Err(e) => {
                            if errors.fetch_add(1, Ordering::Relaxed) < 5 {
                                eprintln!("populate {}: {e} (attempt {})", keys[i], attempt + 1);
                            }
                            // 0.1, 0.2, 0.4, 0.8 s: a cluster settling after start has 1.5 s.
                            if attempt < 4 {
                                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                            }
                        }
                    }
                }
                if ok {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let total = keys.len();
    let ticker = {
        let done = done.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let d = done.load(Ordering::Relaxed);
                eprintln!("  populated {d}/{total} ({:.0}/s)", d as f64 / started.elapsed().as_secs_f64());
            }
        })
    };
    for t in tasks {
        t.await?;
    }
    ticker.abort();
    let secs = started.elapsed().as_secs_f64();
    let d = done.load(Ordering::Relaxed);
    if d < total as u64 {
        anyhow::bail!("populate: only {d} of {total} keys written");
    }
    Ok((secs, errors.load(Ordering::Relaxed)))
}

/// Phases of a driver run.
#[derive(Clone, Copy)]
pub struct Phases {
    pub warmup: Duration,
    pub duration: Duration,
}

/// Closed loop: every worker runs back to back until the end; the recorder is reset after the
/// warm-up. Returns the workers for reuse.
/// The second value is the number of successful operations including the warm-up.
pub async fn closed<W: Worker>(
    workers: Vec<W>,
    rec: Arc<Recorder>,
    ph: Phases,
    label: &str,
    extra: Option<Extra>,
) -> (Vec<W>, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let all_ok = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for mut w in workers {
        let (rec, stop, all_ok) = (rec.clone(), stop.clone(), all_ok.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                let (op, r) = w.step().await;
                match r {
                    Ok(()) => {
                        rec.record(op, t0.elapsed());
                        all_ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        rec.error(op, &e.kind, &e.detail);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            w
        }));
    }
    let progress = Progress::spawn(rec.clone(), label.to_string(), extra);
    tokio::time::sleep(ph.warmup).await;
    rec.reset();
    tokio::time::sleep(ph.duration).await;
    // Freeze the numbers at the end of the window: late completions are not counted in the rate.
    rec.freeze();
    stop.store(true, Ordering::Relaxed);
    progress.stop();
    let mut out = Vec::new();
    for t in tasks {
        if let Ok(w) = t.await {
            out.push(w);
        }
    }
    (out, all_ok.load(Ordering::Relaxed))
}

/// What an open-loop run scheduled and whether the target kept up.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OpenLoopStats {
    pub target_rate: f64,
    pub scheduled: u64,
    /// Operations still queued (never started) when the window closed: a sign of saturation.
    pub backlog_at_end: u64,
}

/// Open loop at `rate` operations per second spread over the workers; the latency of an operation runs
/// from its intended send time to its completion (queueing included).
pub async fn open<W: Worker>(
    workers: Vec<W>,
    rate: f64,
    rec: Arc<Recorder>,
    ph: Phases,
    label: &str,
    extra: Option<Extra>,
) -> (Vec<W>, OpenLoopStats) {
    let (tx, rx) = mpsc::unbounded_channel::<Instant>();
    let rx = Arc::new(Mutex::new(rx));
    let queued = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for mut w in workers {
        let (rec, rx, queued) = (rec.clone(), rx.clone(), queued.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let intended = { rx.lock().await.recv().await };
                let Some(intended) = intended else { break };
                queued.fetch_sub(1, Ordering::Relaxed);
                let (op, r) = w.step().await;
                match r {
                    Ok(()) => rec.record(op, intended.elapsed()),
                    Err(e) => rec.error(op, &e.kind, &e.detail),
                }
            }
            w
        }));
    }
    let progress = {
        let q = queued.clone();
        let extra2 = extra.clone();
        let f: Extra = Arc::new(move || {
            let more = extra2.as_ref().map(|f| format!("  {}", f())).unwrap_or_default();
            format!("backlog {}{more}", q.load(Ordering::Relaxed))
        });
        Progress::spawn(rec.clone(), label.to_string(), Some(f))
    };
    let pacer = {
        let (rec, queued, tx) = (rec.clone(), queued.clone(), tx.clone());
        // On a thread of its own, sleeping with the OS's timer: tokio's timer ticks once a millisecond,
        // so a release planned for 0.3 ms past a tick went out at the next one, and since latency runs
        // from the planned time, up to a millisecond of the load generator's own lateness was counted
        // as the target's.
        tokio::task::spawn_blocking(move || pace(rate, ph, &rec, &queued, &tx))
    };
    let scheduled = pacer.await.unwrap_or(0);
    rec.freeze();
    drop(tx);
    // Drop what never started (it is reported as backlog), let in-flight operations finish.
    let backlog = {
        let mut g = rx.lock().await;
        let mut n = 0;
        while g.try_recv().is_ok() {
            n += 1;
        }
        n
    };
    progress.stop();
    let mut out = Vec::new();
    for t in tasks {
        if let Ok(w) = t.await {
            out.push(w);
        }
    }
    (out, OpenLoopStats { target_rate: rate, scheduled, backlog_at_end: backlog })
}

/// Releases the open loop's operations at their planned times, `rate` a second over the warm-up and
/// the measured phase (resetting `rec` between them), and returns how many it released in the
/// measured phase. Each release carries its planned time, from which its latency is counted.
fn pace(rate: f64, ph: Phases, rec: &Recorder, queued: &AtomicU64, tx: &mpsc::UnboundedSender<Instant>) -> u64 {
    let interval = Duration::from_secs_f64(1.0 / rate.max(0.001));
    let start = Instant::now();
    let warm_end = start + ph.warmup;
    let end = warm_end + ph.duration;
    let mut next = start;
    let mut scheduled = 0u64;
    let mut reset_done = ph.warmup.is_zero();
    if reset_done {
        rec.reset();
    }
    loop {
        let now = Instant::now();
        if !reset_done && now >= warm_end {
            rec.reset();
            reset_done = true;
            scheduled = 0;
        }
        if now >= end {
            return scheduled;
        }
        while next <= now && next < end {
            queued.fetch_add(1, Ordering::Relaxed);
            let _ = tx.send(next);
            scheduled += 1;
            next += interval;
        }
        let mut wake = next.min(end);
        if !reset_done {
            wake = wake.min(warm_end);
        }
        std::thread::sleep(wake.saturating_duration_since(Instant::now()).max(Duration::from_micros(20)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pacer releases every planned operation, `rate` a second, each stamped with its own planned
    /// time (one interval after the previous), and counts only the measured phase's.
    #[test]
    fn pacer_releases_on_a_fixed_plan_and_counts_the_measured_phase() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (rec, queued) = (Recorder::new(), AtomicU64::new(0));
        let ph = Phases { warmup: Duration::from_millis(100), duration: Duration::from_millis(200) };
        let measured = pace(1000.0, ph, &rec, &queued, &tx);
        let mut planned = Vec::new();
        while let Ok(t) = rx.try_recv() {
            planned.push(t);
        }
        assert_eq!(planned.len() as u64, queued.load(Ordering::Relaxed));
        assert!((295..=300).contains(&planned.len()), "released {}", planned.len());
        assert!((195..=200).contains(&measured), "counted {measured}");
        for w in planned.windows(2) {
            assert_eq!(w[1] - w[0], Duration::from_millis(1));
        }
    }
}
