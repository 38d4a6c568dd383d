//! Scenario (b) `latency-sweep`: measure the maximum twin-update throughput closed-loop, then run open
//! loop at 25/50/75 % (or the given percentages) of it and report the latency distribution at each
//! load, latency measured from the intended send time.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::loadgen::{self, Phases};
use crate::scenarios::common::{svg_path, write_json, Cluster};
use crate::stats::{Recorder, Summary};
use crate::targets::twinhub::Twinhub;
use crate::targets::Target;
use crate::value::SizeDist;

#[derive(Debug, Clone)]
pub struct SweepOpts {
    pub cluster: Option<PathBuf>,
    pub bin: Option<PathBuf>,
    pub shards: u32,
    pub twins: usize,
    pub value: SizeDist,
    pub concurrency: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub percents: Vec<f64>,
    pub out: PathBuf,
    pub svg: Option<PathBuf>,
}

pub async fn run(o: SweepOpts) -> anyhow::Result<Value> {
    crate::procs::raise_nofile(65_536);
    let cluster = Cluster::get(o.cluster.as_deref(), o.bin.as_deref(), o.shards)?;
    let r = run_on(&o, Twinhub { hub: cluster.hub().clone() }, &cluster.version()).await;
    cluster.down();
    let v = r?;
    write_json(&o.out, &v)?;
    Ok(v)
}

fn phase_json(label: &str, target_rate: Option<f64>, s: &Summary, open: Option<&loadgen::OpenLoopStats>) -> Value {
    json!({
        "phase": label,
        "target_rate": target_rate,
        "achieved_per_s": s.total.per_s,
        "p50_ms": s.total.latency.p50_ms,
        "p90_ms": s.total.latency.p90_ms,
        "p99_ms": s.total.latency.p99_ms,
        "p999_ms": s.total.latency.p999_ms,
        "max_ms": s.total.latency.max_ms,
        "errors": s.total.errors,
        "error_kinds": s.errors,
        "backlog_at_end": open.map(|o| o.backlog_at_end),
        "steal_pct": s.steal_pct,
        "steal_pct_max": s.steal_pct_max,
        "cpu_busy_pct": s.cpu_busy_pct.as_ref().map(|v| v.iter().map(|b| (b * 10.0).round() / 10.0).collect::<Vec<_>>()),
        "series": s.series,
    })
}

async fn run_on<T: Target>(o: &SweepOpts, target: T, version: &str) -> anyhow::Result<Value> {
    let keys: Arc<Vec<String>> = Arc::new((0..o.twins).map(|i| target.key(i)).collect());
    eprintln!("populating {} twins", o.twins);
    loadgen::populate(&target, keys.clone(), o.value, 64).await?;
    let ph = Phases { warmup: o.warmup, duration: o.duration };
    let workers = loadgen::update_workers(&target, keys.clone(), o.value, o.concurrency).await?;
    let rec = Arc::new(Recorder::new());
    eprintln!("max: closed loop, {} workers", o.concurrency);
    let (mut workers, _) = loadgen::closed(workers, rec.clone(), ph, "max", None).await;
    let max = rec.summary();
    let max_rate = max.total.per_s;
    let mut phases = vec![phase_json("max (closed loop)", None, &max, None)];
    let mut summaries = vec![("max".to_string(), max)];
    for pct in &o.percents {
        let rate = max_rate * pct / 100.0;
        let rec = Arc::new(Recorder::new());
        let label = format!("{pct:.0}%");
        eprintln!("{label}: open loop at {rate:.0} updates/s over {} connections", o.concurrency);
        let (w, stats) = loadgen::open(workers, rate, rec.clone(), ph, &label, None).await;
        workers = w;
        let s = rec.summary();
        phases.push(phase_json(&label, Some(rate), &s, Some(&stats)));
        summaries.push((label, s));
    }
    drop(workers);
    println!(
        "\nlatency sweep ({}): {} twins, values {} B, {} connections, {} s per phase",
        target.name(),
        o.twins,
        o.value,
        o.concurrency,
        o.duration.as_secs()
    );
    println!(
        "{:<18} {:>11} {:>11} {:>9} {:>9} {:>9} {:>10} {:>8} {:>8} {:>14} {:>14}",
        "phase",
        "target/s",
        "achieved/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "p99.9 ms",
        "errors",
        "backlog",
        "steal % (max)",
        "CPUs busy %"
    );
    for p in &phases {
        println!(
            "{:<18} {:>11} {:>11.0} {:>9.2} {:>9.2} {:>9.2} {:>10.2} {:>8} {:>8} {:>14} {:>14}",
            p["phase"].as_str().unwrap_or(""),
            p["target_rate"].as_f64().map(|r| format!("{r:.0}")).unwrap_or_else(|| "max".into()),
            p["achieved_per_s"].as_f64().unwrap_or(0.0),
            p["p50_ms"].as_f64().unwrap_or(0.0),
            p["p90_ms"].as_f64().unwrap_or(0.0),
            p["p99_ms"].as_f64().unwrap_or(0.0),
            p["p999_ms"].as_f64().unwrap_or(0.0),
            p["errors"].as_u64().unwrap_or(0),
            p["backlog_at_end"].as_u64().map(|b| b.to_string()).unwrap_or_else(|| "-".into()),
            match (p["steal_pct"].as_f64(), p["steal_pct_max"].as_f64()) {
                (Some(mean), Some(max)) => format!("{mean:.1} ({max:.1})"),
                (Some(mean), None) => format!("{mean:.1}"),
                _ => "-".into(),
            },
            busy_cell(&p["cpu_busy_pct"]),
        );
    }
    for note in steal_notes(&phases).into_iter().chain(packing_notes(&phases)) {
        println!("{note}");
    }
    let svg = svg_path(&o.out, o.svg.as_deref());
    let runs: Vec<crate::plot::Run> =
        summaries.iter().map(|(l, s)| crate::plot::Run { label: l.clone(), series: &s.series }).collect();
    crate::plot::write_svg(&svg, &format!("{} latency sweep: max, then open loop at % of max", target.name()), &runs)?;
    eprintln!("wrote {}", svg.display());
    Ok(json!({
        "scenario": "(b) latency at % of maximum throughput",
        "target": target.name(),
        "version": version,
        "protocol": target.protocol(),
        "config": {"twins": o.twins, "value_bytes": o.value.to_string(), "concurrency": o.concurrency,
                   "duration_s": o.duration.as_secs(), "warmup_s": o.warmup.as_secs(), "percents": o.percents,
                   "machine": crate::compare::machine()},
        "max_updates_per_s": max_rate,
        "phases": phases,
    }))
}

/// Steal (percentage points of the machine's CPU) by which a phase must exceed the closed loop's before
/// the sweep says so: a few points come and go in any run.
const STEAL_NOTE_POINTS: f64 = 5.0;

/// A line for each open-loop phase during which the hypervisor took clearly more of the machine than
/// during the closed loop the phase's rate was derived from: that phase ran nearer the machine's limit
/// than its percentage says, and its tail is the host's as much as the system's.
fn steal_notes(phases: &[Value]) -> Vec<String> {
    let steal = |p: &Value| p["steal_pct"].as_f64();
    let Some(base) = phases.first().and_then(steal) else { return Vec::new() };
    phases
        .iter()
        .skip(1)
        .filter_map(|p| {
            let s = steal(p)?;
            (s >= base + STEAL_NOTE_POINTS).then(|| {
                format!(
                    "note: during the {} phase the hypervisor took {s:.1} % of the machine's CPU (worst second {:.1} %), \
                     against {base:.1} % during the closed loop: that phase ran nearer the machine's limit than its \
                     percentage says",
                    p["phase"].as_str().unwrap_or("?"),
                    p["steal_pct_max"].as_f64().unwrap_or(s),
                )
            })
        })
        .collect()
}

/// Each CPU's busy share, in the kernel's order ("98/61"), or "-" where it was not read.
fn busy_cell(v: &Value) -> String {
    match v.as_array() {
        Some(a) if !a.is_empty() => {
            a.iter().map(|b| format!("{:.0}", b.as_f64().unwrap_or(0.0))).collect::<Vec<_>>().join("/")
        }
        _ => "-".into(),
    }
}

/// How busy a CPU must be to count as full, in percent.
const FULL_CPU_PCT: f64 = 95.0;
/// How far (percentage points) another CPU must be below a full one before the sweep calls the phase
/// packed.
const PACKED_GAP_POINTS: f64 = 25.0;

/// A line for each phase in which one CPU was full while another was clearly not: the kernel kept the
/// work on fewer CPUs than the machine has, so the threads on the full one queued for it while the
/// other idled. Such a phase has less headroom where its threads run than the machine's idle time
/// suggests, and its tail shows it.
fn packing_notes(phases: &[Value]) -> Vec<String> {
    phases
        .iter()
        .filter_map(|p| {
            let busy: Vec<f64> = p["cpu_busy_pct"].as_array()?.iter().filter_map(Value::as_f64).collect();
            let most = busy.iter().copied().reduce(f64::max)?;
            let least = busy.iter().copied().reduce(f64::min)?;
            (most >= FULL_CPU_PCT && least <= most - PACKED_GAP_POINTS).then(|| {
                format!(
                    "note: during the {} phase one CPU was {most:.0} % busy while another was {least:.0} %: the \
                     kernel kept the work on fewer CPUs than the machine has, so threads queued on the full one \
                     while the other idled",
                    p["phase"].as_str().unwrap_or("?"),
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_only_phases_with_clearly_more_steal_than_the_closed_loop() {
        let phase = |name: &str, steal: Option<f64>| json!({"phase": name, "steal_pct": steal, "steal_pct_max": steal});
        let phases = [phase("max (closed loop)", Some(0.5)), phase("25%", Some(4.0)), phase("50%", Some(16.0))];
        let notes = steal_notes(&phases);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("50% phase") && notes[0].contains("16.0 %") && notes[0].contains("0.5 %"),
            "{}",
            notes[0]
        );
        assert!(steal_notes(&[phase("max (closed loop)", None), phase("50%", Some(30.0))]).is_empty());
    }

    #[test]
    fn notes_only_phases_with_one_cpu_full_and_another_clearly_not() {
        let phase = |name: &str, busy: Value| json!({"phase": name, "cpu_busy_pct": busy});
        let phases = [
            phase("max (closed loop)", json!([95.0, 86.0])),
            phase("25%", json!([70.0, 30.0])),
            phase("50%", json!([99.0, 62.0])),
            phase("75%", Value::Null),
        ];
        let notes = packing_notes(&phases);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("50% phase one CPU was 99 % busy while another was 62 %"), "{}", notes[0]);
        assert_eq!(busy_cell(&phases[2]["cpu_busy_pct"]), "99/62");
        assert_eq!(busy_cell(&Value::Null), "-");
    }
}
