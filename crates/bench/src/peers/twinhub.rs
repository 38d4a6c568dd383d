//! A local twinhub cluster started with the twinhub binary's own launcher (`twinhub cluster up`), used
//! strictly as a black box: its `cluster.json`, its HTTPS/MQTT ports and its process ids.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::hub::Hub;
use crate::procs::{self, TempDir};

/// The twinhub binary the bench starts its cluster with: `--bin`, else `$TWINHUB_BIN` (which `twinhub
/// bench` sets to itself), else the `twinhub` beside this program (so `target/release/twinhub bench …`
/// measures that very build).
pub fn default_bin(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("TWINHUB_BIN") {
        return Ok(PathBuf::from(p));
    }
    twinhub::cli::companion_binary("twinhub").context("no twinhub binary: pass --bin PATH or set TWINHUB_BIN")
}

/// Runtime threads per node: `$TWINHUB_BENCH_NODE_WORKER_THREADS` if set to a positive number, else
/// the node's own default (one per core). Measured both ways on a 2-core machine with 3 nodes
/// (benches/README.md, "Runtime threads"): one thread per node was no faster, so the default stays.
pub fn node_worker_threads() -> Option<usize> {
    std::env::var("TWINHUB_BENCH_NODE_WORKER_THREADS").ok().and_then(|v| v.trim().parse().ok()).filter(|n| *n > 0)
}

/// `--node-option KEY=VALUE` for each comma-separated `KEY=VALUE` of `$TWINHUB_BENCH_NODE_OPTIONS`
/// (keys as in a node's config file, e.g. `events_batch_ms=0`): how a bench measures a node option
/// both ways without a flag of its own.
pub fn node_options() -> Vec<String> {
    std::env::var("TWINHUB_BENCH_NODE_OPTIONS")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|o| !o.is_empty())
        .flat_map(|o| ["--node-option".to_string(), o.to_string()])
        .collect()
}

pub struct TwinhubCluster {
    pub bin: PathBuf,
    pub dir: TempDir,
    pub hub: Hub,
    pub version: String,
    /// Nodes restarted by this process (their `Child` handles, reaped on `down`).
    restarted: Vec<Child>,
}

impl TwinhubCluster {
    /// `twinhub cluster up --nodes N --dir DIR --shard-count S [--worker-threads T] [--node-option K=V …]`
    /// ([`node_worker_threads`], [`node_options`]).
    pub fn up(bin: &Path, nodes: usize, shards: u32) -> anyhow::Result<TwinhubCluster> {
        TwinhubCluster::up_with(bin, nodes, shards, &[])
    }

    /// [`TwinhubCluster::up`] with more `twinhub cluster up` options for every node.
    pub fn up_with(bin: &Path, nodes: usize, shards: u32, extra: &[String]) -> anyhow::Result<TwinhubCluster> {
        let dir = TempDir::new("twinhub-bench-twinhub")?;
        let version = procs::first_line(bin, &["--version"]);
        let mut threads_args: Vec<String> =
            node_worker_threads().map(|t| vec!["--worker-threads".to_string(), t.to_string()]).unwrap_or_default();
        threads_args.extend(node_options());
        threads_args.extend(extra.iter().cloned());
        eprintln!(
            "starting twinhub ({version}): {} cluster up --nodes {nodes} --shard-count {shards} {}--dir {}",
            bin.display(),
            threads_args.iter().map(|a| format!("{a} ")).collect::<String>(),
            dir.path.display()
        );
        let out = Command::new(bin)
            .args(["cluster", "up", "--nodes", &nodes.to_string(), "--shard-count", &shards.to_string()])
            .args(&threads_args)
            .arg("--dir")
            .arg(&dir.path)
            .env("RUST_LOG", std::env::var("TWINHUB_BENCH_NODE_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("run {}", bin.display()))?;
        if !out.status.success() {
            anyhow::bail!(
                "twinhub cluster up failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let hub = Hub::load(&dir.path.join("cluster.json"))?;
        Ok(TwinhubCluster { bin: bin.to_path_buf(), dir, hub, version, restarted: Vec::new() })
    }

    pub fn cluster_json(&self) -> PathBuf {
        self.dir.path.join("cluster.json")
    }

    pub fn pids(&self) -> Vec<u32> {
        self.hub.pids()
    }

    /// `twinhub cluster down --dir DIR` (and the temp dir goes, unless kept).
    pub fn down(mut self) {
        let st = Command::new(&self.bin)
            .args(["cluster", "down", "--dir"])
            .arg(&self.dir.path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status();
        if !matches!(st, Ok(s) if s.success()) {
            eprintln!("twinhub cluster down failed: {st:?}");
        }
        for c in &mut self.restarted {
            let _ = procs::stop_child(c, Duration::from_secs(10));
        }
        eprintln!("twinhub cluster stopped");
    }

    /// Stops node `idx` (SIGTERM, or SIGKILL if `kill9`), starts it again from its config, and waits for
    /// `/ready`. Returns (stop time, time from spawn to the node's HTTPS port answering, time from spawn
    /// to ready).
    pub async fn restart_node(&mut self, idx: usize, kill9: bool) -> anyhow::Result<(Duration, Duration, Duration)> {
        let node = self.hub.info.nodes[idx].clone();
        let stop_started = Instant::now();
        unsafe {
            libc::kill(node.pid as i32, if kill9 { libc::SIGKILL } else { libc::SIGTERM });
        }
        while procs::pid_alive(node.pid) {
            if stop_started.elapsed() > Duration::from_secs(60) {
                unsafe {
                    libc::kill(node.pid as i32, libc::SIGKILL);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let stopped = stop_started.elapsed();
        let config =
            node.config.clone().ok_or_else(|| anyhow::anyhow!("cluster.json has no config for node {}", node.id))?;
        let log = node.log.clone().unwrap_or_else(|| self.dir.path.join(format!("node-{}.restart.log", node.id)));
        let logf = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        let started = Instant::now();
        let child = Command::new(&self.bin)
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", std::env::var("TWINHUB_BENCH_NODE_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .spawn()
            .context("restart node")?;
        let pid = child.id();
        self.restarted.push(child);
        self.set_pid(idx, pid)?;
        let mut c = self.hub.client(idx);
        let mut answered = None;
        loop {
            if started.elapsed() > Duration::from_secs(1800) {
                anyhow::bail!("node {} not ready 30 min after restart", node.id);
            }
            if !procs::pid_alive(pid) {
                anyhow::bail!("node {} exited after restart: {}", node.id, super::log_tail(&log, 2000));
            }
            if let Ok(r) = c.send("GET", "/ready", None).await {
                answered.get_or_insert(started.elapsed());
                if r.status == 200 {
                    return Ok((stopped, answered.unwrap_or_default(), started.elapsed()));
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Records a restarted node's new pid (here and in cluster.json, so that `cluster down` stops it).
    fn set_pid(&mut self, idx: usize, pid: u32) -> anyhow::Result<()> {
        self.hub.info.nodes[idx].pid = pid;
        let path = self.cluster_json();
        let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        v["nodes"][idx]["pid"] = serde_json::json!(pid);
        std::fs::write(&path, serde_json::to_string_pretty(&v)?)?;
        Ok(())
    }
}
