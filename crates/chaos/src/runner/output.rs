//! The report: `report.json` (every scenario: ops by kind and outcome, faults with their times,
//! unavailability windows, the checker's verdict with each violation's minimal sub-history, panics,
//! observations), `summary.txt` (readable) and `timeline.svg` (ops/s by outcome, faults shaded).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::runner::faults::FaultRecord;
use crate::runner::util::{secs, shard_of};
use crate::{History, Op, OpKind, Outcome, Report};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IndexedOp {
    /// Index in the scenario's `history.json`.
    pub index: usize,
    /// The node the op was sent to (or, for a push, received from).
    pub node: Option<u64>,
    pub op: Op,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ViolationDetail {
    pub twin: String,
    pub kind: String,
    pub message: String,
    /// The ops that show it (for `NotLinearizable`, the shrunk sub-history).
    pub sub_history: Vec<IndexedOp>,
    /// The same as a `History` file, to re-check alone.
    pub file: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Window {
    pub start_s: f64,
    pub end_s: f64,
    pub secs: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Unavailability {
    /// Gaps longer than this between acknowledged writes count.
    pub threshold_s: f64,
    /// No write acknowledged on any twin.
    pub overall: Vec<Window>,
    /// No write acknowledged on any twin of the shard.
    pub per_shard: BTreeMap<String, Vec<Window>>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Bucket {
    /// Seconds since the scenario started.
    pub t: f64,
    pub ok: u32,
    pub failed: u32,
    pub unknown: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScenarioReport {
    pub label: String,
    pub scenario: String,
    pub seed: u64,
    pub nodes: u64,
    pub shard_count: u32,
    pub twins: usize,
    /// Run clock (seconds since the run started), like every time in this report.
    pub start_s: f64,
    pub end_s: f64,
    pub workload_start_s: f64,
    pub workload_end_s: f64,
    pub ops: usize,
    pub acknowledged_writes: usize,
    pub pushes: usize,
    /// Kind → outcome → count.
    pub ops_by_kind: BTreeMap<String, BTreeMap<String, usize>>,
    pub faults: Vec<FaultRecord>,
    pub unavailability: Unavailability,
    pub check_seconds: f64,
    pub check: Report,
    pub violation_details: Vec<ViolationDetail>,
    /// `panicked at` lines in node logs during the scenario.
    pub panics: Vec<String>,
    /// What the cluster did in reaction to the faults (exits, restarts needed, …).
    pub observations: Vec<String>,
    /// Device connections that never received the final desired version (the checker judges them).
    pub convergence_notes: Vec<String>,
    /// Ops per second by outcome (completion time; unanswered ops at their invoke time).
    pub timeline: Vec<Bucket>,
    pub history: String,
    pub passed: bool,
    /// The scenario could not run (setup failure): counts as a failure.
    pub error: Option<String>,
}

impl ScenarioReport {
    pub fn failed_to_run(label: &str, scenario: &str, seed: u64, error: String) -> ScenarioReport {
        ScenarioReport {
            label: label.into(),
            scenario: scenario.into(),
            seed,
            nodes: 0,
            shard_count: 0,
            twins: 0,
            start_s: 0.0,
            end_s: 0.0,
            workload_start_s: 0.0,
            workload_end_s: 0.0,
            ops: 0,
            acknowledged_writes: 0,
            pushes: 0,
            ops_by_kind: BTreeMap::new(),
            faults: Vec::new(),
            unavailability: Unavailability::default(),
            check_seconds: 0.0,
            check: Report::default(),
            violation_details: Vec::new(),
            panics: Vec::new(),
            observations: Vec::new(),
            convergence_notes: Vec::new(),
            timeline: Vec::new(),
            history: String::new(),
            passed: false,
            error: Some(error),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunReport {
    pub profile: String,
    pub seed: u64,
    pub binary: String,
    pub started_unix: u64,
    pub wall_seconds: f64,
    pub passed: bool,
    pub scenarios: Vec<ScenarioReport>,
}

fn outcome_name(o: &Outcome) -> &'static str {
    match o {
        Outcome::Ok { .. } => "ok",
        Outcome::Failed { .. } => "failed",
        Outcome::Unknown { .. } => "unknown",
    }
}

pub fn ops_by_kind(h: &History) -> BTreeMap<String, BTreeMap<String, usize>> {
    let mut m: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for op in &h.ops {
        *m.entry(op.kind.name().to_string()).or_default().entry(outcome_name(&op.outcome).to_string()).or_default() +=
            1;
    }
    m
}

/// Requests (pushes left out) per second by outcome.
pub fn timeline(h: &History, start: u64, end: u64) -> Vec<Bucket> {
    let n = ((end.saturating_sub(start)) / 1_000_000_000 + 1) as usize;
    let mut b: Vec<Bucket> = (0..n).map(|i| Bucket { t: i as f64, ok: 0, failed: 0, unknown: 0 }).collect();
    for op in h.ops.iter().filter(|o| !matches!(o.kind, OpKind::Push { .. })) {
        let at = op.complete_ns.unwrap_or(op.invoke_ns);
        let i = (at.saturating_sub(start) / 1_000_000_000) as usize;
        if let Some(x) = b.get_mut(i.min(n - 1)) {
            match op.outcome {
                Outcome::Ok { .. } => x.ok += 1,
                Outcome::Failed { .. } => x.failed += 1,
                Outcome::Unknown { .. } => x.unknown += 1,
            }
        }
    }
    b
}

fn gaps(mut acks: Vec<u64>, from: u64, to: u64, threshold: f64) -> Vec<Window> {
    acks.sort_unstable();
    let mut out = Vec::new();
    let mut prev = from;
    for t in acks.into_iter().filter(|t| *t >= from && *t <= to).chain(std::iter::once(to)) {
        let d = secs(t.saturating_sub(prev));
        if d > threshold {
            out.push(Window { start_s: secs(prev), end_s: secs(t), secs: d });
        }
        prev = prev.max(t);
    }
    out
}

/// Intervals of the workload with no acknowledged write (overall, and per shard).
pub fn unavailability(h: &History, from: u64, to: u64, shard_count: u32, threshold: f64) -> Unavailability {
    let acked = |o: &&Op| o.kind.is_write() && o.outcome.is_ok() && !o.final_read;
    let all: Vec<u64> = h.ops.iter().filter(acked).filter_map(|o| o.complete_ns).collect();
    let mut per_shard = BTreeMap::new();
    for s in 0..shard_count {
        let twins_here = h.initial.keys().any(|t| shard_of(t, shard_count) == s);
        if !twins_here {
            continue;
        }
        let acks: Vec<u64> = h
            .ops
            .iter()
            .filter(acked)
            .filter(|o| shard_of(&o.twin, shard_count) == s)
            .filter_map(|o| o.complete_ns)
            .collect();
        per_shard.insert(format!("shard {s}"), gaps(acks, from, to, threshold));
    }
    Unavailability { threshold_s: threshold, overall: gaps(all, from, to, threshold), per_shard }
}

pub fn summary(run: &RunReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "twinhub chaos run: profile {}, seed {}, {} scenarios, wall time {:.0}s — {}",
        run.profile,
        run.seed,
        run.scenarios.len(),
        run.wall_seconds,
        if run.passed { "PASSED" } else { "FAILED" }
    );
    let _ = writeln!(s, "binary: {}\n", run.binary);
    let _ = writeln!(
        s,
        "{:<26} {:>6} {:>7} {:>6} {:>6} {:>6} {:>5} {:>9} {:>5}  verdict",
        "scenario", "ops", "acked-w", "ok", "failed", "unknwn", "viol", "unavail-s", "panic"
    );
    for r in &run.scenarios {
        let count = |o: &str| r.ops_by_kind.values().map(|m| m.get(o).copied().unwrap_or(0)).sum::<usize>();
        let longest = r.unavailability.overall.iter().map(|w| w.secs).fold(0.0, f64::max);
        let _ = writeln!(
            s,
            "{:<26} {:>6} {:>7} {:>6} {:>6} {:>6} {:>5} {:>9.1} {:>5}  {}",
            r.label,
            r.ops,
            r.acknowledged_writes,
            count("ok"),
            count("failed"),
            count("unknown"),
            r.check.violations.len(),
            longest,
            r.panics.len(),
            if r.error.is_some() {
                "ERROR"
            } else if r.passed {
                "pass"
            } else {
                "FAIL"
            }
        );
    }
    for r in &run.scenarios {
        let _ = writeln!(s, "\n== {} (scenario {}, seed {}) ==", r.label, r.scenario, r.seed);
        if let Some(e) = &r.error {
            let _ = writeln!(s, "could not run: {e}");
            continue;
        }
        let _ = writeln!(
            s,
            "workload {:.1}s..{:.1}s ({:.1}s), {} twins, {} ops, {} acknowledged writes, {} desired pushes received; check took {:.1}s",
            r.workload_start_s,
            r.workload_end_s,
            r.workload_end_s - r.workload_start_s,
            r.twins,
            r.ops,
            r.acknowledged_writes,
            r.pushes,
            r.check_seconds
        );
        for (kind, m) in &r.ops_by_kind {
            let parts: Vec<String> = m.iter().map(|(o, n)| format!("{o} {n}")).collect();
            let _ = writeln!(s, "  {kind:<14} {}", parts.join(", "));
        }
        for f in &r.faults {
            let _ = writeln!(
                s,
                "  fault {:.1}s..{:.1}s ({:.1}s) {} {:?}: {} [shard leaders before: {:?}]",
                f.start_s,
                f.end_s,
                f.end_s - f.start_s,
                f.kind,
                f.nodes,
                f.description,
                f.leaders_before
            );
        }
        let ws: Vec<String> = r
            .unavailability
            .overall
            .iter()
            .map(|w| format!("{:.1}s..{:.1}s ({:.1}s)", w.start_s, w.end_s, w.secs))
            .collect();
        let _ = writeln!(
            s,
            "  no write acknowledged at all (> {:.0}s): {}",
            r.unavailability.threshold_s,
            if ws.is_empty() { "never".into() } else { ws.join(", ") }
        );
        for (shard, w) in &r.unavailability.per_shard {
            if !w.is_empty() {
                let ws: Vec<String> =
                    w.iter().map(|w| format!("{:.1}s..{:.1}s ({:.1}s)", w.start_s, w.end_s, w.secs)).collect();
                let _ = writeln!(s, "  {shard} unavailable: {}", ws.join(", "));
            }
        }
        for o in &r.observations {
            let _ = writeln!(s, "  observed: {o}");
        }
        for n in &r.convergence_notes {
            let _ = writeln!(s, "  push convergence: {n}");
        }
        for p in &r.panics {
            let _ = writeln!(s, "  PANIC {p}");
        }
        let _ = write!(s, "  {}", r.check.summary().replace('\n', "\n  "));
        for v in &r.violation_details {
            let _ = writeln!(s, "minimal sub-history of the {} on {} ({}):", v.kind, v.twin, v.file);
            for o in &v.sub_history {
                let via = o.node.map(|n| format!(" (via node {n})")).unwrap_or_default();
                let _ = writeln!(s, "    {}{via}", crate::describe(o.index, &o.op));
            }
        }
        let _ = writeln!(s, "  history: {}", r.history);
    }
    s
}

/// One panel per scenario: ops/s ok (green), failed (orange), unknown (red); faults shaded.
pub fn draw_timeline(path: &Path, scenarios: &[&ScenarioReport]) -> Result<()> {
    let scenarios: Vec<&&ScenarioReport> = scenarios.iter().filter(|r| !r.timeline.is_empty()).collect();
    if scenarios.is_empty() {
        return Ok(());
    }
    let panel_h = 230u32;
    let root = SVGBackend::new(path, (1100, panel_h * scenarios.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let panels = root.split_evenly((scenarios.len(), 1));
    for (area, r) in panels.iter().zip(scenarios) {
        let dur = r.timeline.len() as f64;
        let max_y = r.timeline.iter().map(|b| b.ok.max(b.failed).max(b.unknown)).max().unwrap_or(1).max(1) as f64 * 1.1;
        let title = format!(
            "{} — {} ops, {} violations{}",
            r.label,
            r.ops,
            r.check.violations.len(),
            if r.passed { "" } else { " — FAIL" }
        );
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(45)
            .build_cartesian_2d(0f64..dur, 0f64..max_y)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc("seconds since scenario start")
            .y_desc("ops/s")
            .light_line_style(WHITE)
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        for f in &r.faults {
            let (a, b) = (f.start_s - r.start_s, f.end_s - r.start_s);
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(a, 0.0), (b.max(a + 0.2), max_y)],
                    RGBColor(120, 120, 255).mix(0.18).filled(),
                )))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let series =
            |f: fn(&Bucket) -> u32| r.timeline.iter().map(move |b| (b.t + 0.5, f(b) as f64)).collect::<Vec<_>>();
        type Line = (&'static str, RGBColor, fn(&Bucket) -> u32);
        let lines: [Line; 3] = [
            ("ok", RGBColor(30, 150, 30), |b| b.ok),
            ("failed", RGBColor(230, 140, 0), |b| b.failed),
            ("unknown", RGBColor(210, 30, 30), |b| b.unknown),
        ];
        for (name, color, f) in lines {
            chart
                .draw_series(LineSeries::new(series(f), color.stroke_width(2)))
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// Writes report.json, summary.txt and timeline.svg (all scenarios) under `dir`, and each scenario's
/// own timeline.svg.
pub fn write_all(dir: &Path, run: &RunReport) -> Result<()> {
    std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(run)?)?;
    std::fs::write(dir.join("summary.txt"), summary(run))?;
    let all: Vec<&ScenarioReport> = run.scenarios.iter().collect();
    // The combined plot: for long runs, the last 40 scenarios (every one has its own file).
    let shown: Vec<&ScenarioReport> = all.iter().rev().take(40).rev().copied().collect();
    draw_timeline(&dir.join("timeline.svg"), &shown)?;
    for r in &run.scenarios {
        let sdir = dir.join(&r.label);
        if sdir.is_dir() {
            draw_timeline(&sdir.join("timeline.svg"), &[r])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TwinState;
    use serde_json::json;

    fn write(twin: &str, invoke: u64, complete: u64) -> Op {
        Op {
            client: 1,
            twin: twin.into(),
            invoke_ns: invoke,
            complete_ns: Some(complete),
            kind: OpKind::PatchDesired { patch: json!({"a": 1}), if_match: None },
            outcome: Outcome::ok(),
            final_read: false,
        }
    }

    const S: u64 = 1_000_000_000;

    #[test]
    fn gaps_longer_than_the_threshold_are_windows() {
        let w = gaps(vec![S / 2, 3 * S, 3 * S + S / 2], 0, 5 * S, 1.0);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!((w[0].start_s - 0.5).abs() < 1e-9 && (w[0].end_s - 3.0).abs() < 1e-9);
        assert!((w[1].start_s - 3.5).abs() < 1e-9 && (w[1].end_s - 5.0).abs() < 1e-9);
        assert!(gaps(vec![], 0, S / 2, 1.0).is_empty());
        assert_eq!(gaps(vec![], 0, 2 * S, 1.0).len(), 1, "no write at all is one window");
    }

    #[test]
    fn unavailability_per_shard_and_overall() {
        let a = "dev-a";
        let b = (0..).map(|i| format!("dev-{i}")).find(|t| shard_of(t, 2) != shard_of(a, 2)).unwrap();
        let mut h = History::default();
        h.initial.insert(a.into(), TwinState::fresh());
        h.initial.insert(b.clone(), TwinState::fresh());
        for k in 0..10 {
            h.ops.push(write(a, k * S / 2, k * S / 2 + 1));
        }
        h.ops.push(write(&b, 0, 1));
        let u = unavailability(&h, 0, 5 * S, 2, 1.0);
        assert!(u.overall.is_empty(), "{u:?}");
        let sb = &u.per_shard[&format!("shard {}", shard_of(&b, 2))];
        assert_eq!(sb.len(), 1, "{u:?}");
        assert!(u.per_shard[&format!("shard {}", shard_of(a, 2))].is_empty());
    }

    #[test]
    fn timeline_counts_by_outcome() {
        let mut h = History::default();
        h.ops.push(write("d", 0, S / 2));
        let mut f = write("d", S, S + 1);
        f.outcome = Outcome::Failed { status: 412, message: String::new() };
        h.ops.push(f);
        let mut u = write("d", S, S);
        u.complete_ns = None;
        u.outcome = Outcome::Unknown { reason: "timeout".into() };
        h.ops.push(u);
        let t = timeline(&h, 0, 2 * S);
        assert_eq!((t[0].ok, t[1].failed, t[1].unknown), (1, 1, 1));
    }
}
