//! `twinhub bench …`: the load generator and the peer comparison (see benches/README.md).

use std::path::PathBuf;
use std::time::Duration;

use std::process::ExitCode;

use crate::compare::{self, CompareOpts};
use crate::scenarios::fleet::{self, FleetOpts, Mix};
use crate::scenarios::{hot, memory, storm, sweep};
use crate::value::SizeDist;
use clap::Subcommand;

/// Where a scenario runs: an existing cluster, or 3 nodes started (and stopped) by the command.
#[derive(clap::Args, Clone, Debug)]
pub struct ClusterArgs {
    /// cluster.json of a running cluster (`twinhub cluster up`); default: start 3 nodes here.
    #[arg(long)]
    cluster: Option<PathBuf>,
    /// twinhub binary for the cluster started here [default: $TWINHUB_BIN, else this binary]
    #[arg(long)]
    bin: Option<PathBuf>,
    #[arg(long, default_value_t = twinhub::ids::DEFAULT_SHARD_COUNT)]
    shard_count: u32,
}

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Scenario (a) against twinhub, etcd and NATS in turn (each a local 3-node cluster); prints the
    /// table with twinhub/peer ratios and writes JSON (+ SVG).
    Compare {
        #[arg(long)]
        out: PathBuf,
        /// SVG plot [default: OUT with .svg]
        #[arg(long)]
        svg: Option<PathBuf>,
        /// twinhub binary [default: $TWINHUB_BIN, else this binary]
        #[arg(long)]
        bin: Option<PathBuf>,
        /// Measured seconds per system.
        #[arg(long, default_value_t = 30)]
        duration: u64,
        #[arg(long, default_value_t = 5)]
        warmup: u64,
        /// Concurrent workers (one connection each).
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Distinct twins (keys) updated at random.
        #[arg(long, default_value_t = 10_000)]
        twins: usize,
        /// Value size in bytes: N or LO-HI (uniform).
        #[arg(long, default_value = "200")]
        value_bytes: SizeDist,
        /// Systems to run, comma-separated, in this order: twinhub, etcd, nats (fsync before every
        /// ack, as the others), nats-nofsync (NATS's default periodic fsync; a reference row).
        #[arg(long, default_value = "twinhub,etcd,nats", value_delimiter = ',')]
        systems: Vec<String>,
        #[arg(long, default_value_t = twinhub::ids::DEFAULT_SHARD_COUNT)]
        shard_count: u32,
        /// Workers that write every twin once before the measurement.
        #[arg(long, default_value_t = 64)]
        populate_concurrency: usize,
        /// etcd --quota-backend-bytes.
        #[arg(long, default_value_t = 8 * 1024 * 1024 * 1024)]
        etcd_quota_bytes: u64,
        /// Do not register the change watch during the run.
        #[arg(long)]
        no_watch: bool,
    },
    /// The generic fleet load: N MQTT devices (SAS, GET twin, reported patches, desired pushes) and
    /// HTTPS back ends (patch/get/replace mix), open loop (--rate) or closed loop (--concurrency).
    Run {
        /// Only twinhub is a fleet target (the KV peers have no devices).
        #[arg(long, default_value = "twinhub")]
        target: String,
        #[command(flatten)]
        cl: ClusterArgs,
        #[arg(long, default_value_t = 100)]
        devices: usize,
        /// Twins the back ends touch (≥ devices; the first `devices` have a connected device).
        #[arg(long, default_value_t = 0)]
        twins: usize,
        /// MQTT over TLS instead of the plain-TCP port.
        #[arg(long)]
        mqtt_tls: bool,
        #[arg(long, default_value_t = 1)]
        qos: u8,
        /// Reported patches per device per second (0: none).
        #[arg(long, default_value_t = 1.0)]
        reported_rate: f64,
        /// Back-end operations per second, open loop; without it: closed loop.
        #[arg(long)]
        rate: Option<f64>,
        /// Back-end HTTPS connections (closed loop: the concurrency; open loop: the worker pool).
        #[arg(long, default_value_t = 16)]
        concurrency: usize,
        #[arg(long, default_value = "patch=70,get=20,replace=10")]
        mix: Mix,
        #[arg(long, default_value = "200")]
        value_bytes: SizeDist,
        #[arg(long, default_value_t = 30)]
        duration: u64,
        #[arg(long, default_value_t = 3)]
        warmup: u64,
        /// Devices connecting at once.
        #[arg(long, default_value_t = 64)]
        connect_concurrency: usize,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        svg: Option<PathBuf>,
    },
    /// Scenario (b): maximum update throughput (closed loop), then open loop at % of it.
    LatencySweep {
        #[command(flatten)]
        cl: ClusterArgs,
        #[arg(long, default_value_t = 10_000)]
        twins: usize,
        #[arg(long, default_value = "200")]
        value_bytes: SizeDist,
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Measured seconds per phase.
        #[arg(long, default_value_t = 20)]
        duration: u64,
        #[arg(long, default_value_t = 3)]
        warmup: u64,
        #[arg(long, default_value = "25,50,75", value_delimiter = ',')]
        percents: Vec<f64>,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        svg: Option<PathBuf>,
    },
    /// Scenario (c): register N devices, then connect them all over MQTT as fast as allowed.
    ConnectStorm {
        #[command(flatten)]
        cl: ClusterArgs,
        #[arg(long, default_value_t = 50_000)]
        devices: usize,
        #[arg(long, default_value_t = 128)]
        create_concurrency: usize,
        /// MQTT handshakes in flight at once (in all client processes together).
        #[arg(long, default_value_t = 1000)]
        connect_concurrency: usize,
        /// Client processes to spread the connections over (each is limited by RLIMIT_NOFILE).
        #[arg(long, default_value_t = 1)]
        procs: usize,
        #[arg(long)]
        mqtt_tls: bool,
        /// Also subscribe each device to its desired-property pushes.
        #[arg(long)]
        subscribe: bool,
        /// Seconds to keep all connections open before disconnecting.
        #[arg(long, default_value_t = 10)]
        hold: u64,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        svg: Option<PathBuf>,
    },
    /// One process's share of a connect storm (started by connect-storm --procs).
    #[command(hide = true)]
    StormWorker {
        #[arg(long)]
        cluster: PathBuf,
        #[arg(long)]
        keys: PathBuf,
        #[arg(long)]
        from: usize,
        #[arg(long)]
        to: usize,
        #[arg(long)]
        connect_concurrency: usize,
        #[arg(long)]
        mqtt_tls: bool,
        #[arg(long)]
        subscribe: bool,
        #[arg(long)]
        start_at: u64,
        #[arg(long)]
        hold_until: u64,
    },
    /// Scenario (d): one twin patched at --rate per second while its device is subscribed.
    HotTwin {
        #[command(flatten)]
        cl: ClusterArgs,
        #[arg(long, default_value_t = 1000.0)]
        rate: f64,
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        #[arg(long, default_value = "200")]
        value_bytes: SizeDist,
        #[arg(long, default_value_t = 30)]
        duration: u64,
        #[arg(long)]
        mqtt_tls: bool,
        /// The device waits this long after each message (a slow device).
        #[arg(long, default_value_t = 0)]
        slow_ms: u64,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        svg: Option<PathBuf>,
    },
    /// Scenarios (e) and (f): resident bytes per twin with N twins, then a node's restart time;
    /// writes JSON and an SVG of each node's RSS against the twins loaded (OUT with .svg).
    Memory {
        #[arg(long)]
        bin: Option<PathBuf>,
        #[arg(long, default_value_t = twinhub::ids::DEFAULT_SHARD_COUNT)]
        shard_count: u32,
        #[arg(long, default_value_t = 1_000_000)]
        twins: usize,
        #[arg(long, default_value = "200")]
        value_bytes: SizeDist,
        #[arg(long, default_value_t = 128)]
        concurrency: usize,
        /// Skip the restart measurement (f).
        #[arg(long)]
        no_restart: bool,
        /// Restart with SIGKILL instead of SIGTERM.
        #[arg(long)]
        kill9: bool,
        /// Give every twin three tags (those of the query bench: building, battery, jobgroup).
        #[arg(long)]
        tags: bool,
        /// Stop creating twins early when the machine's MemAvailable falls below this (MB).
        #[arg(long, default_value_t = 4096)]
        min_available_mb: u64,
        /// Also sample RSS this many seconds after the load, once the nodes have settled (0: don't).
        #[arg(long, default_value_t = 30)]
        settle_secs: u64,
        /// Before the restart, update twins until the node to restart has applied this fraction (0-1)
        /// of the writes after which it snapshots, so that its restart re-applies that much log.
        #[arg(long, default_value_t = 0.0)]
        replay_before_restart: f64,
        #[arg(long)]
        out: PathBuf,
    },
    /// How fast this machine is right now: the probe `compare` takes before each system (a hand-off
    /// between two threads on one CPU and across two, integer arithmetic, a memory walk), printed as
    /// one line and one JSON object a time; to read the hour a run was taken in.
    Probe {
        /// Probes to take, one after the other.
        #[arg(long, default_value_t = 1)]
        repeat: u32,
    },
}

pub fn main(cmd: BenchCommand) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("twinhub bench: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let r = rt.block_on(async move {
        match cmd {
            BenchCommand::Compare {
                out,
                svg,
                bin,
                duration,
                warmup,
                concurrency,
                twins,
                value_bytes,
                systems,
                shard_count,
                populate_concurrency,
                etcd_quota_bytes,
                no_watch,
            } => compare::run(CompareOpts {
                out,
                svg,
                bin,
                duration: Duration::from_secs(duration),
                warmup: Duration::from_secs(warmup),
                concurrency,
                twins: twins.max(1),
                value: value_bytes,
                systems,
                shards: shard_count,
                populate_concurrency,
                etcd_quota_bytes,
                no_watch,
            })
            .await
            .map(|_| ()),
            BenchCommand::Run {
                target,
                cl,
                devices,
                twins,
                mqtt_tls,
                qos,
                reported_rate,
                rate,
                concurrency,
                mix,
                value_bytes,
                duration,
                warmup,
                connect_concurrency,
                out,
                svg,
            } => {
                if target != "twinhub" {
                    eprintln!("twinhub bench run: only --target twinhub has devices; use `compare` for etcd and nats");
                    return Err(anyhow::anyhow!("unknown --target {target}"));
                }
                fleet::run(FleetOpts {
                    cluster: cl.cluster,
                    bin: cl.bin,
                    shards: cl.shard_count,
                    devices,
                    twins,
                    mqtt_tls,
                    qos,
                    reported_rate,
                    rate,
                    concurrency,
                    mix,
                    value: value_bytes,
                    duration: Duration::from_secs(duration),
                    warmup: Duration::from_secs(warmup),
                    connect_concurrency,
                    out,
                    svg,
                })
                .await
                .map(|_| ())
            }
            BenchCommand::LatencySweep {
                cl,
                twins,
                value_bytes,
                concurrency,
                duration,
                warmup,
                percents,
                out,
                svg,
            } => sweep::run(sweep::SweepOpts {
                cluster: cl.cluster,
                bin: cl.bin,
                shards: cl.shard_count,
                twins: twins.max(1),
                value: value_bytes,
                concurrency,
                duration: Duration::from_secs(duration),
                warmup: Duration::from_secs(warmup),
                percents,
                out,
                svg,
            })
            .await
            .map(|_| ()),
            BenchCommand::StormWorker {
                cluster,
                keys,
                from,
                to,
                connect_concurrency,
                mqtt_tls,
                subscribe,
                start_at,
                hold_until,
            } => {
                storm::worker(&cluster, &keys, from, to, connect_concurrency, mqtt_tls, subscribe, start_at, hold_until)
                    .await
            }
            BenchCommand::ConnectStorm {
                cl,
                devices,
                create_concurrency,
                connect_concurrency,
                procs,
                mqtt_tls,
                subscribe,
                hold,
                out,
                svg,
            } => storm::run(storm::StormOpts {
                procs,
                cluster: cl.cluster,
                bin: cl.bin,
                shards: cl.shard_count,
                devices,
                create_concurrency,
                connect_concurrency,
                mqtt_tls,
                subscribe,
                hold: Duration::from_secs(hold),
                out,
                svg,
            })
            .await
            .map(|_| ()),
            BenchCommand::HotTwin { cl, rate, concurrency, value_bytes, duration, mqtt_tls, slow_ms, out, svg } => {
                hot::run(hot::HotOpts {
                    cluster: cl.cluster,
                    bin: cl.bin,
                    shards: cl.shard_count,
                    rate,
                    concurrency,
                    value: value_bytes,
                    duration: Duration::from_secs(duration),
                    mqtt_tls,
                    slow_ms,
                    out,
                    svg,
                })
                .await
                .map(|_| ())
            }
            BenchCommand::Memory {
                bin,
                shard_count,
                twins,
                value_bytes,
                concurrency,
                no_restart,
                kill9,
                tags,
                min_available_mb,
                settle_secs,
                replay_before_restart,
                out,
            } => memory::run(memory::MemoryOpts {
                replay_before_restart: replay_before_restart.clamp(0.0, 1.0),
                tags,
                min_available_mb,
                settle_secs,
                bin,
                shards: shard_count,
                twins: twins.max(1),
                value: value_bytes,
                concurrency,
                restart: !no_restart,
                kill9,
                out,
            })
            .await
            .map(|_| ()),
            BenchCommand::Probe { repeat } => {
                for _ in 0..repeat.max(1) {
                    let p = tokio::task::spawn_blocking(|| crate::probe::run(&crate::probe::DEFAULT)).await?;
                    eprintln!("{}", p.line());
                    println!("{}", p.to_json());
                }
                Ok(())
            }
        }
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("twinhub bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
