//! Profiles: `short` runs every scenario once (CI); `long` loops randomly chosen scenarios with
//! randomized fault timings for `--minutes`. One cluster serves every scenario (fresh twins each time);
//! it is rebuilt if a scenario leaves it broken. Reports are rewritten after every scenario, so an
//! interrupted run still leaves one.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::runner::cluster::{cleanup_all, Cluster, ClusterConfig};
use crate::runner::faults::SCENARIOS;
use crate::runner::output::{write_all, RunReport, ScenarioReport};
use crate::runner::scenario::{self, ScenarioOpts};
use crate::say;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    Short,
    Long,
}

#[derive(Clone, Debug)]
pub struct RunOpts {
    pub profile: Profile,
    pub dir: PathBuf,
    pub bin: PathBuf,
    pub seed: u64,
    /// Only this scenario (repeated in the long profile).
    pub scenario: Option<String>,
    /// Long profile: how long to loop.
    pub minutes: u64,
    pub nodes: u64,
    pub shard_count: u32,
    pub disk_mb: u64,
    /// Twins loaded into every (re)built cluster beside the scenarios' own.
    pub background_twins: u64,
}

/// Removes what a run leaves on the machine, also when the run future is dropped (Ctrl-C) or panics.
pub struct CleanupGuard(pub PathBuf);

impl Drop for CleanupGuard {
    fn drop(&mut self) {
        cleanup_all(&self.0.join("cluster"));
    }
}

async fn fresh_cluster(opts: &RunOpts, cluster: Option<Cluster>) -> Result<Cluster> {
    if let Some(mut c) = cluster {
        c.shutdown().await;
    }
    let cfg = ClusterConfig {
        bin: opts.bin.clone(),
        dir: opts.dir.join("cluster"),
        nodes: opts.nodes,
        shard_count: opts.shard_count,
        disk_mb: opts.disk_mb,
    };
    // Keep the previous cluster's logs: a new cluster starts in a fresh directory.
    if cfg.dir.exists() {
        cleanup_all(&cfg.dir);
        let stamp = crate::runner::util::unix_now();
        let _ = std::fs::rename(&cfg.dir, opts.dir.join(format!("cluster-{stamp}")));
    }
    let mut c = Cluster::start(cfg).await?;
    if opts.background_twins > 0 {
        if let Err(e) = c.load_background(opts.background_twins).await {
            // Stop the nodes and their power-loss file systems before giving up.
            c.shutdown().await;
            return Err(e);
        }
    }
    Ok(c)
}

/// Runs the profile; returns the report (also written under `dir`).
pub async fn run(opts: RunOpts) -> Result<RunReport> {
    let started = Instant::now();
    crate::runner::util::start();
    if let Some(s) = &opts.scenario {
        if !SCENARIOS.contains(&s.as_str()) {
            bail!("unknown scenario {s}; known: {}", SCENARIOS.join(", "));
        }
    }
    if !opts.bin.is_file() {
        bail!("twinhub binary {} not found (--bin)", opts.bin.display());
    }
    std::fs::create_dir_all(&opts.dir)?;
    let dir = opts.dir.canonicalize()?;
    let opts = RunOpts { dir: dir.clone(), ..opts };
    let _guard = CleanupGuard(dir.clone());
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut report = RunReport {
        profile: format!("{:?}", opts.profile).to_lowercase(),
        seed: opts.seed,
        binary: opts.bin.display().to_string(),
        started_unix: crate::runner::util::unix_now(),
        wall_seconds: 0.0,
        passed: false,
        scenarios: Vec::new(),
    };
    say!(
        "chaos run: profile {}, seed {}, dir {}, binary {}",
        report.profile,
        opts.seed,
        dir.display(),
        opts.bin.display()
    );
    let mut cluster = Some(fresh_cluster(&opts, None).await?);

    let (sopts, deadline) = match opts.profile {
        Profile::Short => (ScenarioOpts::short(), None),
        Profile::Long => (ScenarioOpts::long(), Some(started + Duration::from_secs(opts.minutes * 60))),
    };
    let mut index = 0usize;
    loop {
        let name: String = match (opts.profile, &opts.scenario) {
            (Profile::Short, Some(s)) if index == 0 => s.clone(),
            (Profile::Short, Some(_)) => break,
            (Profile::Short, None) => match SCENARIOS.get(index) {
                Some(s) => s.to_string(),
                None => break,
            },
            (Profile::Long, s) => {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                s.clone().unwrap_or_else(|| SCENARIOS.choose(&mut rng).expect("scenarios").to_string())
            }
        };
        let seed: u64 = rng.gen();
        let label = format!("{:03}-{name}", index + 1);
        let c = match cluster.as_mut() {
            Some(c) => c,
            None => {
                cluster = Some(fresh_cluster(&opts, None).await?);
                cluster.as_mut().expect("just set")
            }
        };
        let r = match scenario::run(c, &name, &label, seed, &sopts, &dir).await {
            Ok(r) => r,
            Err(e) => {
                say!("scenario {label} could not run: {e:#}");
                ScenarioReport::failed_to_run(&label, &name, seed, format!("{e:#}"))
            }
        };
        let broken = r.error.is_some();
        report.scenarios.push(r);
        report.wall_seconds = started.elapsed().as_secs_f64();
        report.passed = report.scenarios.iter().all(|s| s.passed);
        write_all(&dir, &report)?;
        index += 1;
        // A cluster that does not come back healthy is rebuilt for the next scenario (if one follows).
        let more = match opts.profile {
            Profile::Short => opts.scenario.is_none() && index < SCENARIOS.len(),
            Profile::Long => deadline.is_none_or(|d| Instant::now() < d),
        };
        if !more {
            break;
        }
        let c = cluster.as_mut().expect("cluster");
        if broken || c.wait_healthy(Duration::from_secs(60)).await.is_err() {
            say!("the cluster is not healthy after {label}: rebuilding it");
            let old = cluster.take();
            cluster = Some(fresh_cluster(&opts, old).await?);
        }
    }
    if let Some(mut c) = cluster {
        c.shutdown().await;
    }
    report.wall_seconds = started.elapsed().as_secs_f64();
    report.passed = !report.scenarios.is_empty() && report.scenarios.iter().all(|s| s.passed);
    write_all(&dir, &report)?;
    print_tail(&dir);
    Ok(report)
}

fn print_tail(dir: &Path) {
    if let Ok(s) = std::fs::read_to_string(dir.join("summary.txt")) {
        let head: Vec<&str> = s.lines().take_while(|l| !l.starts_with("== ")).collect();
        eprintln!("{}", head.join("\n"));
    }
    say!("report: {}/report.json, {}/summary.txt, {}/timeline.svg", dir.display(), dir.display(), dir.display());
}
