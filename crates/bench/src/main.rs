//! `twinhub-bench` (run as `twinhub bench`): the fleet load generator and the peer comparison.

use std::process::ExitCode;

use clap::Parser;

/// The same allocator as the server: the load generator shares the machine with the nodes it
/// measures, so its own allocation cost is kept as low as theirs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(name = "twinhub bench", version, about = "Load generator and peer comparison (etcd, NATS JetStream KV)")]
struct Bench {
    #[command(subcommand)]
    command: twinhub_bench::cli::BenchCommand,
}

fn main() -> ExitCode {
    let bench = Bench::parse();
    twinhub::cli::init_tracing();
    twinhub_bench::cli::main(bench.command)
}
