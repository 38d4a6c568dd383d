//! The companion programs: `twinhub chaos` and `twinhub bench` run `twinhub-chaos` and `twinhub-bench`,
//! installed beside `twinhub`. The test and measurement tools are separate programs so that the server
//! binary carries none of their code or dependencies (FUSE, plotting, MQTT clients); the `twinhub`
//! command still offers them under one name.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// The program `name` installed beside the running one. Test and bench executables of a Cargo build
/// run from `target/<profile>/deps/`, one level below the programs, so that level is looked at too.
pub fn companion_binary(name: &str) -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().ok_or_else(|| io::Error::other(format!("{} has no directory", exe.display())))?;
    let beside = dir.join(name);
    if beside.is_file() {
        return Ok(beside);
    }
    if dir.file_name().is_some_and(|d| d == "deps") {
        if let Some(up) = dir.parent().map(|p| p.join(name)).filter(|p| p.is_file()) {
            return Ok(up);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("{name} is not installed beside {} (build it: cargo build -p {name})", exe.display()),
    ))
}

/// Replaces this process with the companion `name`, passing `args` on. The companion starts nodes
/// with this very `twinhub` (`TWINHUB_BIN`) unless the caller chose another.
pub fn run(name: &str, args: Vec<OsString>) -> ExitCode {
    let path = match companion_binary(name) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("twinhub: {e}");
            return ExitCode::from(2);
        }
    };
    let mut cmd = std::process::Command::new(&path);
    cmd.args(args);
    if std::env::var_os("TWINHUB_BIN").is_none() {
        if let Ok(me) = std::env::current_exe() {
            cmd.env("TWINHUB_BIN", me);
        }
    }
    // `exec` returns only if it failed.
    let e = cmd.exec();
    eprintln!("twinhub: running {}: {e}", path.display());
    ExitCode::from(2)
}
