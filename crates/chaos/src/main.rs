//! `twinhub-chaos` (run as `twinhub chaos`): the chaos suite, and the power-loss file system it mounts
//! under each node (`twinhub-chaos chaos-fs`, started by the suite itself).

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "twinhub chaos",
    version,
    about = "Run the chaos suite against a cluster it starts itself (needs root)"
)]
struct Chaos {
    #[command(flatten)]
    args: twinhub_chaos::cli::ChaosArgs,
}

#[derive(Parser, Debug)]
#[command(name = "twinhub-chaos chaos-fs", about = "The chaos suite's power-loss file system")]
struct ChaosFs {
    #[command(flatten)]
    args: twinhub_chaos::powerfs::ChaosFsArgs,
}

fn main() -> ExitCode {
    let mut argv: Vec<OsString> = std::env::args_os().collect();
    twinhub::cli::init_tracing();
    if argv.get(1).is_some_and(|a| a == "chaos-fs") {
        argv.remove(1);
        return twinhub_chaos::powerfs::main(ChaosFs::parse_from(argv).args);
    }
    twinhub_chaos::cli::main(Chaos::parse_from(argv).args)
}
