//! The admin commands, in the spirit of `etcdctl` and `az iot hub`: devices, twins, queries, jobs and
//! the change feed of a running hub, from any node, with a policy connection string (see
//! [`super::remote`] for how the hub and credential are chosen).
//!
//! Output goes to stdout (tables for people, `--json` / JSON lines for scripts); errors go to stderr
//! as the hub's own error code and text. Exit codes:
//!
//! | code | meaning |
//! | ---: | --- |
//! | 0 | done |
//! | 1 | the hub refused (its error code and text are printed), or answered something unexpected |
//! | 2 | bad arguments, connection string, profile or input file: nothing was sent |
//! | 3 | the hub could not be reached (connection, TLS, timeout) |
//! | 4 | the etag given no longer matches (HTTP 412): re-read and retry |

pub mod device;
pub mod job;
pub mod query;
pub mod twin;
pub mod watch;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use super::remote::{Remote, RemoteError, Target};

/// How long one request may take.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Runs one command on a small runtime and turns its outcome into the documented exit code.
pub fn run<F, Fut>(f: F) -> ExitCode
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(), RemoteError>>,
{
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("twinhub: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    exit_code(rt.block_on(f()))
}

pub fn exit_code(r: Result<(), RemoteError>) -> ExitCode {
    let Err(e) = r else { return ExitCode::SUCCESS };
    eprintln!("twinhub: {e}");
    ExitCode::from(match e {
        RemoteError::Usage(_) => 2,
        RemoteError::Unreachable(_) => 3,
        RemoteError::Hub { status: 412, .. } => 4,
        RemoteError::Hub { .. } | RemoteError::Invalid(_) => 1,
    })
}

/// One device (or, with `--module`, one module) of a hub.
#[derive(Args, Debug)]
pub struct IdArgs {
    /// Device id
    pub id: String,
    /// Module id
    #[arg(long)]
    pub module: Option<String>,
    #[command(flatten)]
    pub target: Target,
}

/// A JSON document given inline or in a file (`-` for stdin).
#[derive(Args, Debug)]
pub struct JsonInput {
    /// The JSON document
    #[arg(conflicts_with = "file")]
    pub json: Option<String>,
    /// Read the JSON document from this file (`-` for stdin)
    #[arg(long)]
    pub file: Option<PathBuf>,
}

impl JsonInput {
    pub fn read(&self) -> Result<Value, RemoteError> {
        let (text, from) = match (&self.json, &self.file) {
            (Some(t), _) => (t.clone(), "the argument".to_string()),
            (None, Some(p)) if p.as_os_str() == "-" => {
                let mut t = String::new();
                std::io::stdin().read_to_string(&mut t).map_err(|e| RemoteError::Usage(format!("stdin: {e}")))?;
                (t, "stdin".to_string())
            }
            (None, Some(p)) => {
                let t = std::fs::read_to_string(p).map_err(|e| RemoteError::Usage(format!("{}: {e}", p.display())))?;
                (t, p.display().to_string())
            }
            (None, None) => return Err(RemoteError::Usage("give the JSON as an argument or with --file".into())),
        };
        let v: Value =
            serde_json::from_str(&text).map_err(|e| RemoteError::Usage(format!("{from} is not JSON: {e}")))?;
        if !v.is_object() {
            return Err(RemoteError::Usage(format!("{from} must be a JSON object")));
        }
        Ok(v)
    }
}

/// `/devices/{id}` or `/devices/{id}/modules/{mid}` (or the same under `/twins`).
pub fn identity_path(root: &str, id: &str, module: Option<&str>) -> String {
    let seg = crate::auth::client::path_segment;
    match module {
        Some(m) => format!("/{root}/{}/modules/{}?api-version={API}", seg(id), seg(m)),
        None => format!("/{root}/{}?api-version={API}", seg(id)),
    }
}

/// The REST API version the commands speak.
pub const API: &str = "2021-04-12";

/// Pretty JSON on stdout; a closed pipe (`| head`) is not an error worth a panic.
pub fn print_json(v: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

/// One JSON line on stdout, flushed (for `watch` and `--output json` readers).
pub fn print_line(v: &Value) -> bool {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{v}").and_then(|_| out.flush()).is_ok()
}

/// A cell of a text table: strings bare, everything else as JSON, absent as empty.
pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// An aligned text table on stdout.
pub fn print_table(columns: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = columns.iter().map(|c| c.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = std::io::stdout().lock();
    let line = |cells: Vec<&str>| {
        cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect::<Vec<_>>().join("  ").trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(columns.to_vec()));
    for r in rows {
        let _ = writeln!(out, "{}", line(r.iter().map(String::as_str).collect()));
    }
}

/// `If-Match` for an etag given on the command line (quoted as the SDKs send it; `*` bare).
pub fn if_match(etag: &str) -> (&'static str, String) {
    let v = if etag == "*" || etag.starts_with('"') { etag.to_string() } else { format!("\"{etag}\"") };
    ("if-match", v)
}

pub fn resolve(t: &super::remote::Target) -> Result<Remote, RemoteError> {
    Remote::resolve(t)
}
