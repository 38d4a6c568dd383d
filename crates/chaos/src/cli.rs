//! `twinhub chaos --profile short|long --dir DIR`: the chaos suite (see `chaos::runner`). Needs root.
//! Exit status 0 when every scenario passed, 1 on any violation or node panic, 2 on a harness error,
//! 130 when interrupted (namespaces, mounts and processes are cleaned up in every case).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::runner::run::{run, Profile, RunOpts};

#[derive(Args, Debug)]
pub struct ChaosArgs {
    /// short: every scenario once (a few minutes, CI); long: random scenarios and faults for --minutes.
    #[arg(long, value_enum)]
    pub profile: Profile,
    /// Where the report, histories, node logs and the cluster's files go.
    #[arg(long)]
    pub dir: PathBuf,
    /// The twinhub binary the nodes run [default: the `twinhub` beside this program].
    #[arg(long, env = "TWINHUB_BIN")]
    pub bin: Option<PathBuf>,
    /// Seed for every random choice (twins, ops, fault targets and timings) [default: random].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run only this scenario (kill-random-node, kill-shard-leader, pause-node, partition-minority,
    /// partition-majority, partition-bridge, one-way-loss, rolling-restart, disk-full).
    #[arg(long)]
    pub scenario: Option<String>,
    /// Long profile: minutes to loop.
    #[arg(long, default_value_t = 60)]
    pub minutes: u64,
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 3)]
    pub nodes: u64,
    /// Shards of the cluster.
    #[arg(long, default_value_t = 4)]
    pub shard_count: u32,
    /// Size of each node's data disk (tmpfs), MiB [default: 256, plus 12 MiB per 1,000 background twins]
    #[arg(long)]
    pub disk_mb: Option<u64>,
    /// Twins to load into the cluster beside the scenarios' own (a fleet the nodes carry through every
    /// fault: bigger snapshots to install and more to catch up on), e.g. 100000
    #[arg(long, default_value_t = 0)]
    pub background_twins: u64,
}

pub fn main(a: ChaosArgs) -> ExitCode {
    let seed = a.seed.unwrap_or_else(rand::random);
    let dir = a.dir.clone();
    let bin = match a.bin.clone().map_or_else(|| twinhub::cli::companion_binary("twinhub"), Ok) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("twinhub chaos: cannot find the twinhub binary: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = RunOpts {
        profile: a.profile,
        dir: a.dir,
        bin,
        seed,
        scenario: a.scenario,
        minutes: a.minutes,
        nodes: a.nodes,
        shard_count: a.shard_count,
        disk_mb: a.disk_mb.unwrap_or(256 + a.background_twins * 12 / 1000),
        background_twins: a.background_twins,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("twinhub chaos: {e}");
            return ExitCode::from(2);
        }
    };
    let code = rt.block_on(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("twinhub chaos: cannot watch SIGTERM: {e}");
                return 2u8;
            }
        };
        tokio::select! {
            r = run(opts) => match r {
                Ok(report) if report.passed => 0u8,
                Ok(report) => {
                    let failed: Vec<&str> = report.scenarios.iter().filter(|s| !s.passed).map(|s| s.label.as_str()).collect();
                    eprintln!("twinhub chaos: FAILED (seed {seed}): {}", failed.join(", "));
                    1
                }
                Err(e) => {
                    eprintln!("twinhub chaos: error: {e:#}");
                    2
                }
            },
            _ = tokio::signal::ctrl_c() => { eprintln!("twinhub chaos: interrupted, cleaning up"); 130 }
            _ = term.recv() => { eprintln!("twinhub chaos: terminated, cleaning up"); 130 }
        }
    });
    // The run future was dropped: its guard removed the namespaces, processes and mounts. Once more for
    // certainty (idempotent).
    crate::runner::cluster::cleanup_all(&dir.join("cluster"));
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    ExitCode::from(code)
}
