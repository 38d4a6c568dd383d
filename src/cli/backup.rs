//! `twinhub backup --out FILE` and `twinhub restore --in FILE`: a consistent copy of a running
//! cluster's registry, twins, job rows, jobs and configurations, and seeding a new cluster from it.
//!
//! # File format (version 1)
//! JSON lines, written to `FILE.partial` and renamed when complete, mode 0600 (it holds every device
//! key):
//!
//! ```text
//! TWINHUB-BACKUP 1
//! {"kind":"header","version":1,"createdUtc":"…","shardCount":16,"source":"host:port"}
//! {"kind":"meta","meta":{…jobs and configurations…}}
//! {"kind":"shard","shard":0,"page":{"devices":{…},"deviceJobs":{…},"etag_seq":…}}   (as many as needed)
//! {"kind":"end","records":N,"sha256":"<hex of every byte before this line>"}
//! ```
//!
//! A restore reads and checks the whole file first — the magic line, the version, every record, the
//! record count and the checksum — so a truncated, corrupted or foreign file is refused before the
//! target cluster is touched. The target must have the same shard count and be empty (or be the
//! target of an interrupted restore: `--resume`); pages only insert devices a shard lacks, so running
//! a restore again completes it without applying anything twice.

use std::io::Write;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub use super::remote::Target;
use super::remote::{Remote, RemoteError};

const MAGIC: &str = "TWINHUB-BACKUP 1";
const VERSION: u64 = 1;
const TIMEOUT: Duration = Duration::from_secs(120);
/// A restore request larger than this is split (a Raft entry stays well below the append limit).
const MAX_RESTORE_BYTES: usize = 4 << 20;

#[derive(Args, Debug)]
pub struct BackupArgs {
    #[command(flatten)]
    pub target: Target,
    /// Where to write the backup
    #[arg(long)]
    pub out: PathBuf,
    /// Devices per page read from a shard
    #[arg(long, default_value_t = 500)]
    pub page: usize,
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub target: Target,
    /// The backup to restore
    #[arg(long = "in")]
    pub input: PathBuf,
    /// Continue an interrupted restore into a cluster that already holds part of this backup
    #[arg(long)]
    pub resume: bool,
    /// Only check the file; touch no cluster
    #[arg(long)]
    pub check: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("{path}: {msg}")]
    File { path: String, msg: String },
    #[error("not a twinhub backup, or damaged: {0}")]
    Invalid(String),
    #[error("the server refused {what}: HTTP {status}: {body}")]
    Refused { what: String, status: u16, body: String },
}

/// Where and how to reach a node.
struct Node(Remote);

impl Node {
    fn resolve(t: &Target) -> Result<Node, BackupError> {
        Ok(Node(Remote::resolve(t)?))
    }

    async fn call(&self, method: hyper::Method, path: &str, body: Vec<u8>, what: &str) -> Result<Value, BackupError> {
        match self.0.call(method, path, &[], body, TIMEOUT).await {
            Ok((_, v)) => Ok(v),
            Err(RemoteError::Hub { status, code, message }) => {
                Err(BackupError::Refused { what: what.to_string(), status, body: format!("{code}: {message}") })
            }
            Err(e) => Err(e.into()),
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, BackupError> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| BackupError::Usage(e.to_string()))
}

pub fn backup_main(args: BackupArgs) -> ExitCode {
    report(runtime().and_then(|rt| rt.block_on(backup(args))))
}

pub fn restore_main(args: RestoreArgs) -> ExitCode {
    report(runtime().and_then(|rt| rt.block_on(restore(args))))
}

fn report(r: Result<(), BackupError>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("twinhub: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Appends lines and hashes them.
struct Writer {
    file: std::fs::File,
    hash: Sha256,
    records: u64,
}

impl Writer {
    fn line(&mut self, text: &str) -> std::io::Result<()> {
        let mut bytes = text.as_bytes().to_vec();
        bytes.push(b'\n');
        self.hash.update(&bytes);
        self.file.write_all(&bytes)
    }

    fn record(&mut self, v: &Value) -> std::io::Result<()> {
        self.records += 1;
        self.line(&v.to_string())
    }
}

async fn backup(args: BackupArgs) -> Result<(), BackupError> {
    let node = Node::resolve(&args.target)?;
    let started = Instant::now();
    let info = node.call(hyper::Method::GET, "/cluster/backup", Vec::new(), "the backup").await?;
    let shards = info["shardCount"].as_u64().ok_or_else(|| BackupError::Invalid("no shard count".into()))?;
    let partial = partial_path(&args.out);
    let file_err = |e: std::io::Error| BackupError::File { path: partial.display().to_string(), msg: e.to_string() };
    let file = private_file(&partial).map_err(file_err)?;
    let mut w = Writer { file, hash: Sha256::new(), records: 0 };
    w.line(MAGIC).map_err(file_err)?;
    let created = crate::model::time::format_ms(crate::model::now_ms());
    w.record(&json!({"kind": "header", "version": VERSION, "createdUtc": created, "shardCount": shards, "source": node.0.addr.to_string()}))
        .map_err(file_err)?;
    let meta = node.call(hyper::Method::GET, "/cluster/backup/meta", Vec::new(), "the metadata backup").await?;
    w.record(&json!({"kind": "meta", "meta": meta})).map_err(file_err)?;
    let mut devices = 0u64;
    for shard in 0..shards {
        let mut after: Option<String> = None;
        loop {
            let mut path = format!("/cluster/backup/shards/{shard}?limit={}", args.page.clamp(1, 5000));
            if let Some(a) = &after {
                path.push_str(&format!("&after={}", crate::auth::client::path_segment(a)));
            }
            let r = node.call(hyper::Method::GET, &path, Vec::new(), &format!("shard {shard}")).await?;
            let n = r["page"]["devices"].as_object().map_or(0, |d| d.len());
            if n > 0 {
                devices += n as u64;
                w.record(&json!({"kind": "shard", "shard": shard, "page": r["page"]})).map_err(file_err)?;
            }
            match r["next"].as_str() {
                Some(next) => after = Some(next.to_string()),
                None => break,
            }
        }
        eprintln!("shard {shard}/{shards}: {devices} devices so far ({:.1?})", started.elapsed());
    }
    let digest = hex(&w.hash.clone().finalize());
    let records = w.records;
    w.line(&json!({"kind": "end", "records": records, "sha256": digest}).to_string()).map_err(file_err)?;
    w.file.sync_all().map_err(file_err)?;
    drop(w);
    std::fs::rename(&partial, &args.out)
        .map_err(|e| BackupError::File { path: args.out.display().to_string(), msg: e.to_string() })?;
    eprintln!(
        "backup of {devices} devices in {shards} shards written to {} in {:.1?}",
        args.out.display(),
        started.elapsed()
    );
    Ok(())
}

fn partial_path(out: &Path) -> PathBuf {
    let mut p = out.as_os_str().to_owned();
    p.push(".partial");
    PathBuf::from(p)
}

fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A checked backup: its shard count, metadata and pages.
pub struct Checked {
    pub shard_count: u64,
    pub meta: Value,
    pub pages: Vec<(u64, Value)>,
}

/// Reads and checks a whole backup file; nothing is trusted until the checksum matches.
pub fn check(bytes: &[u8]) -> Result<Checked, BackupError> {
    let bad = |m: String| BackupError::Invalid(m);
    let text = std::str::from_utf8(bytes).map_err(|_| bad("the file is not UTF-8 text".into()))?;
    let Some(first) = text.lines().next() else { return Err(bad("the file is empty".into())) };
    if first != MAGIC {
        return Err(bad(format!("the first line is not '{MAGIC}'")));
    }
    let body = text.strip_suffix('\n').ok_or_else(|| bad("the file is truncated (no final newline)".into()))?;
    let (before_end, end_line) = body.rsplit_once('\n').ok_or_else(|| bad("the file is truncated".into()))?;
    let end: Value = serde_json::from_str(end_line)
        .map_err(|_| bad("the file is truncated: its last line is not the end record".into()))?;
    if end["kind"] != "end" {
        return Err(bad("the file is truncated: no end record".into()));
    }
    let digest = hex(&Sha256::digest(format!("{before_end}\n").as_bytes()));
    if end["sha256"].as_str() != Some(digest.as_str()) {
        return Err(bad("the checksum does not match: the file was changed or damaged".into()));
    }
    let records: Vec<Value> = before_end
        .lines()
        .skip(1)
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| bad(format!("record {}: {e}", i + 1))))
        .collect::<Result<_, _>>()?;
    if end["records"].as_u64() != Some(records.len() as u64) {
        return Err(bad(format!("{} records, the end record says {}", records.len(), end["records"])));
    }
    let header = records.first().filter(|h| h["kind"] == "header").ok_or_else(|| bad("no header record".into()))?;
    if header["version"].as_u64() != Some(VERSION) {
        return Err(bad(format!("format version {} is not {VERSION}", header["version"])));
    }
    let shard_count = header["shardCount"].as_u64().ok_or_else(|| bad("the header has no shard count".into()))?;
    let mut meta = None;
    let mut pages = Vec::new();
    for r in &records[1..] {
        match r["kind"].as_str() {
            Some("meta") => meta = Some(r["meta"].clone()),
            Some("shard") => {
                let s = r["shard"]
                    .as_u64()
                    .filter(|s| *s < shard_count)
                    .ok_or_else(|| bad(format!("a page of shard {}", r["shard"])))?;
                pages.push((s, r["page"].clone()));
            }
            other => return Err(bad(format!("unknown record kind {other:?}"))),
        }
    }
    Ok(Checked { shard_count, meta: meta.ok_or_else(|| bad("no metadata record".into()))?, pages })
}

/// Splits a page whose JSON is too large for one restore request into smaller ones.
fn split(page: &Value) -> Vec<Value> {
    let size = page.to_string().len();
    let devices = page["devices"].as_object().cloned().unwrap_or_default();
    if size <= MAX_RESTORE_BYTES || devices.len() <= 1 {
        return vec![page.clone()];
    }
    let half = devices.len() / 2;
    let mut out = Vec::new();
    let entries: Vec<(String, Value)> = devices.into_iter().collect();
    for chunk in [&entries[..half], &entries[half..]] {
        let part: serde_json::Map<String, Value> = chunk.iter().cloned().collect();
        let mut p = page.clone();
        p["devices"] = Value::Object(part);
        out.extend(split(&p));
    }
    out
}

async fn restore(args: RestoreArgs) -> Result<(), BackupError> {
    let bytes = std::fs::read(&args.input)
        .map_err(|e| BackupError::File { path: args.input.display().to_string(), msg: e.to_string() })?;
    let checked = check(&bytes)?;
    let devices: usize = checked.pages.iter().map(|(_, p)| p["devices"].as_object().map_or(0, |d| d.len())).sum();
    eprintln!("{}: a valid backup of {devices} devices in {} shards", args.input.display(), checked.shard_count);
    if args.check {
        return Ok(());
    }
    let node = Node::resolve(&args.target)?;
    let info = node.call(hyper::Method::GET, "/cluster/backup", Vec::new(), "the cluster").await?;
    if info["shardCount"].as_u64() != Some(checked.shard_count) {
        return Err(BackupError::Usage(format!(
            "the backup has {} shards, the cluster {}: restore into a cluster with the same --shard-count",
            checked.shard_count, info["shardCount"]
        )));
    }
    let stats = node.call(hyper::Method::GET, "/statistics/devices", Vec::new(), "the device count").await?;
    let present = stats["totalDeviceCount"].as_u64().unwrap_or(0);
    if present > 0 && !args.resume {
        return Err(BackupError::Usage(format!("the cluster already has {present} devices: restore into a new cluster (or --resume an interrupted restore)")));
    }
    let started = Instant::now();
    node.call(hyper::Method::POST, "/cluster/restore/meta", checked.meta.to_string().into_bytes(), "the metadata")
        .await?;
    let mut done = 0usize;
    for (i, (shard, page)) in checked.pages.iter().enumerate() {
        for part in split(page) {
            let n = part["devices"].as_object().map_or(0, |d| d.len());
            node.call(
                hyper::Method::POST,
                &format!("/cluster/restore/shards/{shard}"),
                part.to_string().into_bytes(),
                &format!("a page of shard {shard}"),
            )
            .await?;
            done += n;
        }
        if i % 10 == 9 || i + 1 == checked.pages.len() {
            eprintln!("restored {done} of {devices} devices ({:.1?})", started.elapsed());
        }
    }
    eprintln!("restore of {devices} devices finished in {:.1?}", started.elapsed());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut w = Vec::new();
        let mut hash = Sha256::new();
        let mut push = |line: String, w: &mut Vec<u8>| {
            let l = format!("{line}\n");
            hash.update(l.as_bytes());
            w.extend_from_slice(l.as_bytes());
        };
        push(MAGIC.to_string(), &mut w);
        push(json!({"kind": "header", "version": 1, "shardCount": 2}).to_string(), &mut w);
        push(
            json!({"kind": "meta", "meta": {"jobs": {"jobs": {}}, "configs": {"configs": {}, "etag_seq": 0}}})
                .to_string(),
            &mut w,
        );
        push(
            json!({"kind": "shard", "shard": 1, "page": {"devices": {}, "device_jobs": {}, "etag_seq": 3}}).to_string(),
            &mut w,
        );
        let end = json!({"kind": "end", "records": 3, "sha256": hex(&hash.finalize())}).to_string();
        w.extend_from_slice(format!("{end}\n").as_bytes());
        w
    }

    #[test]
    fn a_whole_file_checks_and_any_damage_is_refused() {
        let good = sample();
        let c = check(&good).expect("valid");
        assert_eq!((c.shard_count, c.pages.len()), (2, 1));
        let msg = |b: &[u8]| check(b).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg(&good[..good.len() - 10]).contains("truncated"), "{}", msg(&good[..good.len() - 10]));
        assert!(msg(&good[..good.len() / 2]).contains("truncated"));
        let mut flipped = good.clone();
        let at = good.len() / 2;
        flipped[at] = if flipped[at] == b'1' { b'2' } else { b'1' };
        assert!(msg(&flipped).contains("checksum") || msg(&flipped).contains("record"), "{}", msg(&flipped));
        assert!(msg(b"{\"not\": \"ours\"}\n").contains("first line"));
        assert!(msg(b"").contains("empty"));
        let other_version = String::from_utf8(good.clone()).unwrap().replace("\"version\":1", "\"version\":2");
        assert!(!msg(other_version.as_bytes()).is_empty(), "a changed version breaks the checksum or is refused");
    }

    #[test]
    fn large_pages_are_split_by_device() {
        let big = "x".repeat(MAX_RESTORE_BYTES / 3);
        let devices: serde_json::Map<String, Value> = (0..8).map(|i| (format!("d{i}"), json!({"blob": big}))).collect();
        let parts = split(&json!({"devices": devices, "device_jobs": {}, "etag_seq": 1}));
        assert!(parts.len() >= 3, "{} parts", parts.len());
        assert_eq!(parts.iter().map(|p| p["devices"].as_object().unwrap().len()).sum::<usize>(), 8);
        assert!(parts.iter().all(|p| p.to_string().len() <= MAX_RESTORE_BYTES));
    }
}
