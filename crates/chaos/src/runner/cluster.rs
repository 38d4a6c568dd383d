//! The cluster under test: N `twinhub serve` processes, each in its own network namespace (see `net`)
//! with its data directory on its own size-limited tmpfs (so one node's disk can be filled). Nodes are
//! children of this process; they are killed, paused, resumed and restarted by pid.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::runner::https::{make_certs, HttpsClient};
use crate::runner::net;
use crate::runner::util::random_key;
use crate::say;

pub const HOSTNAME: &str = "localhost";
const HTTP_PORT: u16 = 8443;
const MQTT_PORT: u16 = 8883;
const MQTT_PLAIN_PORT: u16 = 1883;
const EVENTS_PORT: u16 = 8884;
const CLUSTER_PORT: u16 = 7000;
/// Mount points of this run's node disks, so that a later run can unmount them after a crash.
/// The tmpfs mounts of this network slot's runs, for cleanup after a crash.
fn mounts_file() -> String {
    format!("/run/twinhub-chaos-{}.mounts", super::net::slot())
}

#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub bin: PathBuf,
    /// Where configs, certificates and logs go (the disks are mounted below it).
    pub dir: PathBuf,
    pub nodes: u64,
    pub shard_count: u32,
    /// Size of each node's data disk (tmpfs), MiB.
    pub disk_mb: u64,
}

pub struct NodeProc {
    pub id: u64,
    pub ip: IpAddr,
    pub http: SocketAddr,
    pub mqtt_plain: SocketAddr,
    /// The node's tmpfs mount point; its data directory is `disk/data`, where the power-loss file
    /// system (`twinhub chaos-fs`, backed by `disk/powerfs/tree`) is mounted.
    pub disk: PathBuf,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
    /// The `twinhub chaos-fs` process serving `data_dir`; its stderr goes to `powerfs_log`.
    fs_child: Option<Child>,
    pub powerfs_log: PathBuf,
    pub paused: bool,
    pub starts: u32,
}

impl NodeProc {
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }
}

pub struct Cluster {
    pub cfg: ClusterConfig,
    pub owner_key: String,
    secret: String,
    cert: PathBuf,
    key: PathBuf,
    pub tls: Arc<rustls::ClientConfig>,
    pub nodes: Vec<NodeProc>,
    peers: String,
}

/// Unmounts the node disks of an earlier run (listed in the mounts file, or under `dir`).
pub fn unmount_stale(dir: &Path) {
    let mut points: Vec<String> =
        std::fs::read_to_string(mounts_file()).unwrap_or_default().lines().map(str::to_string).collect();
    let dir_s = dir.to_string_lossy().to_string();
    for line in std::fs::read_to_string("/proc/mounts").unwrap_or_default().lines() {
        if let Some(mp) = line.split_whitespace().nth(1) {
            if !dir_s.is_empty() && mp.starts_with(&dir_s) && (mp.ends_with("/disk") || mp.ends_with("/disk/data")) {
                points.push(mp.to_string());
            }
        }
    }
    // Power-loss file systems first (they sit on the disks).
    points.sort_by_key(|p| !p.ends_with("/data"));
    let mounted = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    for p in points {
        if mounted.lines().any(|l| l.split_whitespace().nth(1) == Some(p.as_str())) {
            let _ = net::run("umount", &["-l", &p]);
        }
    }
    let _ = std::fs::remove_file(mounts_file());
}

/// Everything a crashed or interrupted run may have left: processes in our namespaces, the namespaces,
/// the bridge, the disks.
pub fn cleanup_all(dir: &Path) {
    net::teardown();
    unmount_stale(dir);
}

impl Cluster {
    /// Sets up the network, disks and certificates, starts every node and waits until the cluster is
    /// healthy.
    pub async fn start(cfg: ClusterConfig) -> Result<Cluster> {
        cleanup_all(&cfg.dir);
        std::fs::create_dir_all(&cfg.dir)?;
        let ids: Vec<u64> = (1..=cfg.nodes).collect();
        net::setup(&ids).context("setting up the namespaces")?;
        let mut names = vec![HOSTNAME.to_string()];
        names.extend(ids.iter().map(|id| net::node_ip(*id).to_string()));
        let certs = make_certs(&cfg.dir.join("tls"), &names)?;
        let ca_pem = std::fs::read(&certs.ca)?;
        let tls = crate::runner::https::client_config(&ca_pem)?;
        let peers =
            ids.iter().map(|id| format!("{id}={}:{CLUSTER_PORT}", net::node_ip(*id))).collect::<Vec<_>>().join(",");
        // Inter-node mutual TLS, as in production: a cluster CA and one certificate per node.
        let (cluster_ca, cluster_ca_key) = twinhub::tls::cluster::ensure_cluster_ca(&cfg.dir.join("tls"))?;
        for &id in &ids {
            twinhub::tls::cluster::issue_node_cert(
                &cluster_ca,
                &cluster_ca_key,
                id,
                &cfg.dir.join(format!("node-{id}")),
            )?;
        }
        let mut nodes = Vec::new();
        let mut mounts = String::new();
        for &id in &ids {
            let ip = IpAddr::V4(net::node_ip(id));
            let node_dir = cfg.dir.join(format!("node-{id}"));
            let disk = node_dir.join("disk");
            std::fs::create_dir_all(&disk)?;
            net::run(
                "mount",
                &["-t", "tmpfs", "-o", &format!("size={}m", cfg.disk_mb), "tmpfs", &disk.to_string_lossy()],
            )?;
            let data_dir = disk.join("data");
            std::fs::create_dir_all(&data_dir)?;
            mounts.push_str(&format!("{}\n{}\n", data_dir.display(), disk.display()));
            std::fs::write(mounts_file(), &mounts)?;
            nodes.push(NodeProc {
                id,
                ip,
                http: SocketAddr::new(ip, HTTP_PORT),
                mqtt_plain: SocketAddr::new(ip, MQTT_PLAIN_PORT),
                disk,
                data_dir,
                log: node_dir.join("twinhub.log"),
                child: None,
                fs_child: None,
                powerfs_log: node_dir.join("powerfs.log"),
                paused: false,
                starts: 0,
            });
        }
        let mut c = Cluster {
            cfg,
            owner_key: random_key(),
            secret: random_key(),
            cert: certs.cert,
            key: certs.key,
            tls,
            nodes,
            peers,
        };
        for id in ids {
            c.spawn(id)?;
        }
        let took = c.wait_healthy(Duration::from_secs(120)).await?;
        say!(
            "cluster of {} nodes ({} shards) healthy after {:.1}s",
            c.cfg.nodes,
            c.cfg.shard_count,
            took.as_secs_f64()
        );
        Ok(c)
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    pub fn node(&self, id: u64) -> &NodeProc {
        self.nodes.iter().find(|n| n.id == id).expect("known node id")
    }

    fn node_mut(&mut self, id: u64) -> &mut NodeProc {
        self.nodes.iter_mut().find(|n| n.id == id).expect("known node id")
    }

    /// Mounts node `id`'s power-loss file system (`twinhub chaos-fs`) over its data directory unless
    /// it is mounted already; waits until the mount shows in `/proc/mounts`.
    pub fn mount_fs(&mut self, id: u64) -> Result<()> {
        // The file system is served by this program (`twinhub-chaos chaos-fs`), not by the node binary.
        let bin = std::env::current_exe().context("locating twinhub-chaos for chaos-fs")?;
        let n = self.node_mut(id);
        if let Some(c) = n.fs_child.as_mut() {
            match c.try_wait() {
                Ok(None) => return Ok(()),
                Ok(Some(st)) => say!("node {id}: its power-loss file system had exited ({st}); mounting it again"),
                Err(e) => say!("node {id}: power-loss file system: {e}"),
            }
            n.fs_child = None;
        }
        let err = std::fs::OpenOptions::new().create(true).append(true).open(&n.powerfs_log)?;
        let mount = n.data_dir.clone();
        let child = Command::new(&bin)
            .arg("chaos-fs")
            .arg("--backing")
            .arg(n.disk.join("powerfs"))
            .arg("--mount")
            .arg(&mount)
            .env("RUST_LOG", "warn,fuser=error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {} chaos-fs", bin.display()))?;
        n.fs_child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        let want = mount.to_string_lossy().to_string();
        loop {
            let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
            if mounts.lines().any(|l| l.split_whitespace().nth(1) == Some(want.as_str()) && l.contains("fuse")) {
                return Ok(());
            }
            let n = self.node_mut(id);
            if let Some(Ok(Some(st))) = n.fs_child.as_mut().map(|c| c.try_wait()) {
                n.fs_child = None;
                bail!("node {id}: the power-loss file system exited at mount ({st}); see {}", n.powerfs_log.display());
            }
            if Instant::now() > deadline {
                bail!(
                    "node {id}: the power-loss file system did not mount within 20 s; see {}",
                    n.powerfs_log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Power loss on node `id`: SIGKILL the node, then tell its file system to drop everything that
    /// was not synced and unmount (which also drops the kernel's page cache of it). The next
    /// [`spawn`](Self::spawn) mounts it again. Returns the file system's account of what it dropped.
    pub async fn power_loss(&mut self, id: u64) -> Result<String> {
        self.kill9(id).await;
        if self.node(id).child.is_some() {
            bail!("node {id} did not die on SIGKILL");
        }
        let log = self.node(id).powerfs_log.clone();
        let from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0) as usize;
        let n = self.node_mut(id);
        let Some(mut c) = n.fs_child.take() else { bail!("node {id}: no power-loss file system mounted") };
        unsafe {
            libc::kill(c.id() as i32, libc::SIGUSR1);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let st = loop {
            if let Some(st) = c.try_wait()? {
                break st;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                bail!(
                    "node {id}: the power-loss file system did not finish the drop within 30 s; see {}",
                    log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let text = std::fs::read(&log).unwrap_or_default();
        let text = String::from_utf8_lossy(&text[from.min(text.len())..]).to_string();
        let said: Vec<&str> =
            text.lines().filter(|l| l.contains("POWER LOSS") || l.contains("note:") || l.contains("refused")).collect();
        if !st.success() {
            bail!("node {id}: the power-loss file system exited {st}: {}", said.join(" | "));
        }
        Ok(said.join(" | ").replace("twinhub chaos-fs: ", ""))
    }

    /// Unmounts node `id`'s power-loss file system cleanly (nothing dropped). The node must be down.
    pub async fn unmount_fs(&mut self, id: u64) {
        if let Some(mut c) = self.node_mut(id).fs_child.take() {
            unsafe {
                libc::kill(c.id() as i32, libc::SIGTERM);
            }
            for _ in 0..500 {
                if !matches!(c.try_wait(), Ok(None)) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts `twinhub serve` for node `id` inside its namespace (mounting its power-loss file system
    /// first if needed); stderr appended to its log.
    pub fn spawn(&mut self, id: u64) -> Result<()> {
        if self.node(id).child.is_some() {
            bail!("node {id} is already running");
        }
        self.mount_fs(id)?;
        let (ip, data_dir, log) = {
            let n = self.node(id);
            (n.ip, n.data_dir.clone(), n.log.clone())
        };
        let err = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log.with_extension("stdout"))?;
        let ns = File::open(net::ns_path(id)).with_context(|| format!("opening namespace of node {id}"))?;
        let ns_fd = ns.as_raw_fd();
        let addr = |p: u16| SocketAddr::new(ip, p).to_string();
        let mut cmd = Command::new(&self.cfg.bin);
        cmd.arg("serve")
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--http-listen", &addr(HTTP_PORT)])
            .args(["--mqtt-listen", &addr(MQTT_PORT)])
            .args(["--mqtt-plain-listen", &addr(MQTT_PLAIN_PORT)])
            .args(["--events-listen", &addr(EVENTS_PORT)])
            .args(["--hostname", HOSTNAME])
            .args(["--owner-key", &self.owner_key])
            .args(["--shard-count", &self.cfg.shard_count.to_string()])
            .args(["--node-id", &id.to_string()])
            .args(["--cluster-listen", &addr(CLUSTER_PORT)])
            .args(["--cluster-advertise", &addr(CLUSTER_PORT)])
            .args(["--cluster-secret", &self.secret])
            .args(["--peers", &self.peers])
            .arg("--tls-cert")
            .arg(&self.cert)
            .arg("--tls-key")
            .arg(&self.key)
            .arg("--cluster-ca")
            .arg(self.cfg.dir.join("tls").join("cluster-ca.pem"))
            .arg("--cluster-cert")
            .arg(self.cfg.dir.join(format!("node-{id}")).join("cluster-node.pem"))
            .arg("--cluster-key")
            .arg(self.cfg.dir.join(format!("node-{id}")).join("cluster-node.key"));
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("TWINHUB_") {
                cmd.env_remove(&k);
            }
        }
        // The test-only durability mutation passes through (debug builds honour it; see group_commit).
        if let Ok(v) = std::env::var(twinhub::shard::group_commit::SKIP_FSYNC_MUTATION_ENV) {
            cmd.env(twinhub::shard::group_commit::SKIP_FSYNC_MUTATION_ENV, v);
        }
        cmd.env("RUST_LOG", std::env::var("CHAOS_NODE_LOG").unwrap_or_else(|_| "info,openraft=warn".into()))
            .env("NO_COLOR", "1")
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Its own process group: a Ctrl-C at the terminal reaches only the harness, which cleans up.
            .process_group(0);
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(ns_fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("starting {}", self.cfg.bin.display()))?;
        drop(ns);
        let n = self.node_mut(id);
        n.starts += 1;
        n.paused = false;
        say!("node {id}: started pid {} (start #{})", child.id(), n.starts);
        n.child = Some(child);
        Ok(())
    }

    /// Sends a signal to node `id` (if it runs).
    pub fn signal(&self, id: u64, sig: i32) {
        if let Some(pid) = self.node(id).pid() {
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }

    /// Whether node `id`'s process is running; reaps it (and says how it ended) if it exited.
    pub fn check_exited(&mut self, id: u64) -> Option<ExitStatus> {
        let n = self.node_mut(id);
        let st = n.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
        if st.is_some() {
            n.child = None;
            n.paused = false;
        }
        st
    }

    pub fn is_running(&mut self, id: u64) -> bool {
        let _ = self.check_exited(id);
        self.node(id).child.is_some()
    }

    /// SIGKILL and wait until the process is gone.
    pub async fn kill9(&mut self, id: u64) {
        self.signal(id, libc::SIGCONT);
        self.signal(id, libc::SIGKILL);
        self.wait_exit(id, Duration::from_secs(30)).await;
    }

    async fn wait_exit(&mut self, id: u64, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            self.node(id).child.as_ref()?;
            if let Some(st) = self.check_exited(id) {
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM and wait up to `timeout` for a clean exit; SIGKILL after that. Says how it ended.
    pub async fn stop(&mut self, id: u64, timeout: Duration) -> String {
        self.signal(id, libc::SIGCONT);
        self.signal(id, libc::SIGTERM);
        match self.wait_exit(id, timeout).await {
            Some(st) => format!("exited on SIGTERM: {st}"),
            None if self.node(id).child.is_none() => "was not running".into(),
            None => {
                self.kill9(id).await;
                format!("did not exit within {timeout:?} of SIGTERM: SIGKILLed")
            }
        }
    }

    pub fn pause(&mut self, id: u64) {
        self.signal(id, libc::SIGSTOP);
        self.node_mut(id).paused = true;
    }

    pub fn resume(&mut self, id: u64) {
        self.signal(id, libc::SIGCONT);
        self.node_mut(id).paused = false;
    }

    /// Loads `n` background twins (`bg-<i>`, with tags and a desired property) through the bulk
    /// registry call, 100 per request from four clients, with progress: a fleet the nodes must carry
    /// through every fault (bigger snapshots to install, more to catch up on), beside the scenarios'
    /// own twins.
    pub async fn load_background(&self, n: u64) -> Result<()> {
        let started = std::time::Instant::now();
        let key = random_key();
        let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ids = self.ids();
        let mut tasks = Vec::new();
        for w in 0..4usize {
            let mut c = self.client(ids[w % ids.len()]);
            let (key, done, next) = (key.clone(), done.clone(), next.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let from = next.fetch_add(100, std::sync::atomic::Ordering::Relaxed);
                    if from >= n {
                        return Ok::<(), anyhow::Error>(());
                    }
                    let to = (from + 100).min(n);
                    let body: Vec<Value> = (from..to)
                        .map(|i| {
                            json!({"id": format!("bg-{i}"), "importMode": "create", "status": "enabled",
                                "authentication": {"type": "sas", "symmetricKey": {"primaryKey": key, "secondaryKey": key}},
                                "tags": {"fleet": "background", "i": i}, "properties": {"desired": {"interval": 30}}})
                        })
                        .collect();
                    let body = Value::Array(body);
                    let mut last = String::new();
                    let mut ok = false;
                    for _ in 0..20 {
                        match c.json("POST", "/devices", Some(&body), Duration::from_secs(30)).await {
                            Ok((200, _)) => {
                                ok = true;
                                break;
                            }
                            // A retry after a lost answer finds the entries created.
                            Ok((400, v))
                                if v["errors"].as_array().is_some_and(|e| {
                                    !e.is_empty() && e.iter().all(|x| x["errorCode"] == "DeviceAlreadyExists")
                                }) =>
                            {
                                ok = true;
                                break;
                            }
                            Ok((s, v)) => last = format!("{s} {v}"),
                            Err(e) => last = e,
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    if !ok {
                        let last: String = last.chars().take(300).collect();
                        anyhow::bail!("loading background twins {from}..{to}: {last}");
                    }
                    let d = done.fetch_add(to - from, std::sync::atomic::Ordering::Relaxed) + (to - from);
                    if d % 10_000 < 100 || d == n {
                        say!("background fleet: {d}/{n} twins loaded");
                    }
                }
            }));
        }
        for t in tasks {
            t.await??;
        }
        say!("background fleet of {n} twins loaded in {:.1}s", started.elapsed().as_secs_f64());
        Ok(())
    }

    pub fn client(&self, id: u64) -> HttpsClient {
        HttpsClient::new(self.node(id).http, self.tls.clone(), HOSTNAME, &self.owner_key)
    }

    pub async fn ready(&self, id: u64) -> bool {
        matches!(self.client(id).json("GET", "/ready", None, Duration::from_secs(2)).await, Ok((200, _)))
    }

    pub async fn status(&self, id: u64) -> Option<Value> {
        match self.client(id).json("GET", "/cluster/status", None, Duration::from_secs(2)).await {
            Ok((200, v)) => Some(v),
            _ => None,
        }
    }

    /// Shard → node for every shard some node says it leads (the highest term wins a disagreement).
    pub async fn leaders(&self) -> BTreeMap<u32, u64> {
        let mut best: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for id in self.ids() {
            if self.node(id).child.is_none() || self.node(id).paused {
                continue;
            }
            let Some(st) = self.status(id).await else { continue };
            for s in st["shards"].as_array().into_iter().flatten() {
                if s["is_leader"] == true {
                    let shard = s["shard"].as_u64().unwrap_or(0) as u32;
                    let term = s["term"].as_u64().unwrap_or(0);
                    if best.get(&shard).is_none_or(|(_, t)| term > *t) {
                        best.insert(shard, (id, term));
                    }
                }
            }
        }
        best.into_iter().map(|(s, (n, _))| (s, n)).collect()
    }

    /// The node leading the most shards (lowest id on a tie), or a random live one.
    pub async fn leader_heavy(&self) -> u64 {
        let leaders = self.leaders().await;
        let mut count: BTreeMap<u64, usize> = BTreeMap::new();
        for n in leaders.values() {
            *count.entry(*n).or_default() += 1;
        }
        count.into_iter().max_by_key(|(n, c)| (*c, std::cmp::Reverse(*n))).map(|(n, _)| n).unwrap_or(1)
    }

    /// Healthy: every node runs, answers `/ready`, and agrees with the others on a leader for every
    /// shard. Returns how long it took.
    pub async fn healthy(&mut self) -> Result<(), String> {
        for id in self.ids() {
            if let Some(st) = self.check_exited(id) {
                return Err(format!("node {id} exited: {st}"));
            }
            if self.node(id).child.is_none() {
                return Err(format!("node {id} is not running"));
            }
        }
        let mut agreed: BTreeMap<u32, u64> = BTreeMap::new();
        for id in self.ids() {
            if !self.ready(id).await {
                return Err(format!("node {id} not ready"));
            }
            let Some(st) = self.status(id).await else { return Err(format!("node {id}: no status")) };
            let shards = st["shards"].as_array().cloned().unwrap_or_default();
            for s in shards {
                let shard = s["shard"].as_u64().unwrap_or(0) as u32;
                let Some(l) = s["leader"].as_u64() else {
                    return Err(format!("node {id}: shard {shard} without leader"));
                };
                if *agreed.entry(shard).or_insert(l) != l {
                    return Err(format!("shard {shard}: nodes disagree on the leader"));
                }
            }
        }
        if agreed.len() < self.cfg.shard_count as usize {
            return Err(format!("only {} of {} shards have a leader", agreed.len(), self.cfg.shard_count));
        }
        Ok(())
    }

    pub async fn wait_healthy(&mut self, timeout: Duration) -> Result<Duration> {
        let started = Instant::now();
        let mut last = String::new();
        let mut last_say = Instant::now();
        while started.elapsed() < timeout {
            match self.healthy().await {
                Ok(()) => return Ok(started.elapsed()),
                Err(e) => {
                    if e.contains("exited") {
                        bail!("{e} (see {})", self.cfg.dir.display());
                    }
                    last = e;
                }
            }
            if last_say.elapsed() > Duration::from_secs(10) {
                say!("waiting for the cluster to be healthy: {last}");
                last_say = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        bail!("cluster not healthy within {timeout:?}: {last}")
    }

    /// Current sizes of every node's log (to look for panics since then).
    pub fn log_offsets(&self) -> BTreeMap<u64, u64> {
        self.nodes.iter().map(|n| (n.id, std::fs::metadata(&n.log).map(|m| m.len()).unwrap_or(0))).collect()
    }

    /// Lines with `panicked at` written to any node's log since `offsets`, with the line after each;
    /// and each time a node stopped because it could not open its storage (a power loss that left
    /// data the node cannot read back is a durability defect, even if the others carry the run).
    pub fn panics_since(&self, offsets: &BTreeMap<u64, u64>) -> Vec<String> {
        let mut out = Vec::new();
        for n in &self.nodes {
            let text = std::fs::read(&n.log).unwrap_or_default();
            let from = (*offsets.get(&n.id).unwrap_or(&0) as usize).min(text.len());
            let text = String::from_utf8_lossy(&text[from..]).to_string();
            let lines: Vec<&str> = text.lines().collect();
            for (i, l) in lines.iter().enumerate() {
                if l.contains("panicked at") {
                    let next = lines.get(i + 1).copied().unwrap_or("");
                    out.push(format!("node {}: {} | {}", n.id, l.trim(), next.trim()));
                } else if l.contains("ERROR twinhub::cli") && l.contains("storage error") {
                    out.push(format!("node {} stopped, its storage unreadable: {}", n.id, l.trim()));
                }
            }
        }
        out
    }

    /// Kills every node, removes the namespaces and unmounts the disks.
    pub async fn shutdown(&mut self) {
        for id in self.ids() {
            self.kill9(id).await;
            self.unmount_fs(id).await;
        }
        cleanup_all(&self.cfg.dir);
    }
}
