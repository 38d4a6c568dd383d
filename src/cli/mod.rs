//! Command line: `twinhub serve`, `twinhub cluster …`, `twinhub chaos`, `twinhub bench …`, backups, and
//! the admin commands (`device`, `twin`, `query`, `job`, `watch`) against a running hub.

pub mod admin;
pub mod backup;
pub mod cluster;
mod companion;
mod https;
mod logging;
pub mod remote;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use logging::init_tracing;

pub use crate::config::{Config, ConfigError, ServeArgs};
pub use companion::companion_binary;

#[derive(Parser, Debug)]
#[command(
    name = "twinhub",
    version,
    about = "Sharded, Raft-replicated device-twin service speaking Azure IoT Hub's twin protocols"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up: the size of the largest variant (the node's options) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Run a node.
    Serve(ServeArgs),
    /// Run a local cluster on this machine (loopback ports).
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Run the chaos suite against a cluster it starts itself (needs root: namespaces, iptables).
    /// Runs the `twinhub-chaos` program installed beside this one; `twinhub chaos --help` for its options.
    #[command(disable_help_flag = true)]
    Chaos {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Load generator and peer comparison (etcd, NATS JetStream KV); see benches/README.md.
    /// Runs the `twinhub-bench` program installed beside this one; `twinhub bench --help` for its commands.
    #[command(disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Write a consistent backup of a running cluster (devices, twins, job rows, jobs, configurations).
    Backup(backup::BackupArgs),
    /// Seed a new (empty) cluster from a backup, after checking the whole file.
    Restore(backup::RestoreArgs),
    /// Devices and modules of a running hub: create, show, list, delete, connection strings.
    #[command(subcommand)]
    Device(admin::device::DeviceCommand),
    /// Twins of a running hub: show, update (merge patch), replace; `--etag` for optimistic concurrency.
    #[command(subcommand)]
    Twin(admin::twin::TwinCommand),
    /// Run an IoT Hub query ("SELECT … FROM devices …") and follow its pages.
    Query(admin::query::QueryArgs),
    /// Jobs of a running hub: list, show, cancel, schedule twin updates and method calls.
    #[command(subcommand)]
    Job(admin::job::JobCommand),
    /// Follow the change feed (twin changes, lifecycle, connection state) as JSON lines; resumable.
    Watch(admin::watch::WatchArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Cluster(c) => {
            // The launcher writes the owner key, the cluster secret and the CA key: private to this user.
            crate::secrets::restrict_umask();
            cluster::run(c)
        }
        Command::Chaos { args } => companion::run("twinhub-chaos", args),
        Command::Bench { args } => companion::run("twinhub-bench", args),
        Command::Backup(a) => {
            // The backup holds every device key.
            crate::secrets::restrict_umask();
            backup::backup_main(a)
        }
        Command::Restore(a) => backup::restore_main(a),
        Command::Device(c) => admin::run(|| admin::device::main(c)),
        Command::Twin(c) => admin::run(|| admin::twin::main(c)),
        Command::Query(a) => admin::run(|| admin::query::main(a)),
        Command::Job(c) => admin::run(|| admin::job::main(c)),
        Command::Watch(a) => admin::run(|| admin::watch::main(a)),
    }
}

/// Stack of each runtime thread (workers and the blocking pool), see [`serve`].
const WORKER_STACK: usize = 8 << 20;

fn serve(args: ServeArgs) -> ExitCode {
    let config = match Config::resolve(args, |k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("twinhub: {e}");
            return ExitCode::from(2);
        }
    };
    // Before the runtime starts, so that every thread of the node inherits the class.
    if let Err(e) = config.cpu_scheduling.apply_to_current_thread() {
        tracing::warn!(
            "could not set the CPU scheduling class {}: {e}; the system's default stays",
            config.cpu_scheduling.as_str()
        );
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    // Parsing and evaluating a query recurses once per level of its nesting (at most 64 levels, each
    // up to a dozen frames), and JSON up to serde_json's 128 levels: at most a few hundred KiB
    // optimized, but between 640 KiB and 2 MiB in a debug build, tokio's whole default. 8 MiB of
    // address space per thread, touched only as deep as a request goes, keeps every build clear of it.
    builder.thread_stack_size(WORKER_STACK);
    if let Some(n) = config.worker_threads {
        builder.worker_threads(n);
    }
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("twinhub: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(crate::node::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("twinhub: {e}");
            ExitCode::FAILURE
        }
    }
}
