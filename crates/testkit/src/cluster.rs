//! A local cluster of real `twinhub` processes for tests and benches: `twinhub cluster up` starts the
//! nodes on loopback; helpers read their status, kill, restart, add and remove nodes.
//!
//! Every cluster is stopped when its [`Cluster`] is dropped, also on panic: every pid in `cluster.json`
//! and every node restarted here is SIGKILLed. On failure the cluster directory (node logs under
//! `node-*/twinhub.log`) is kept and its path printed.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::*;

/// The `twinhub` binary cargo built, without the caller's `TWINHUB_*` settings (the config files
/// decide), logging at info (nodes inherit this), stdin closed.
pub fn twinhub_cmd() -> Command {
    let mut cmd = Command::new(bin_path());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TWINHUB_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info,openraft=warn".into()))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    cmd
}

/// Generous: debug builds on a shared 2-core machine.
pub const WAIT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------------
// The cluster harness

#[derive(Clone, Debug)]
pub struct Node {
    pub id: u64,
    pub pid: u32,
    pub http: SocketAddr,
    pub mqtt_plain: SocketAddr,
    pub config: PathBuf,
    pub log: PathBuf,
}

/// A local cluster started with `twinhub cluster up`; SIGKILLs all its nodes on drop.
pub struct Cluster {
    pub root: Option<tempfile::TempDir>,
    pub dir: PathBuf,
    pub owner_key: String,
    pub ca_pem: Vec<u8>,
    pub shard_count: u32,
    pub nodes: Vec<Node>,
    /// Nodes restarted by the test (`twinhub serve --config`), our own children.
    pub restarted: Vec<Child>,
}

pub fn pid_alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped) still has a /proc entry: look at its state. The thread-group
    // leader turns zombie before its other threads have exited (one may still be finishing an fsync
    // after SIGKILL), and those still hold the process's files and listening sockets: until they
    // are gone too, a restart on the same ports would fail.
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let zombie = stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
    !zombie || threads > 1
}

/// SIGKILL `pid` if it still runs twinhub (never a recycled pid of something else).
pub fn kill9(pid: u32) {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if pid == 0 || !String::from_utf8_lossy(&cmdline).contains("twinhub") {
        return;
    }
    let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).stderr(Stdio::null()).status();
}

pub fn file_tail(path: &std::path::Path, bytes: usize) -> String {
    let s = std::fs::read(path).unwrap_or_default();
    let s = String::from_utf8_lossy(&s);
    let start = s.len().saturating_sub(bytes);
    let start = (start..s.len()).find(|i| s.is_char_boundary(*i)).unwrap_or(s.len());
    s[start..].to_string()
}

impl Cluster {
    /// `twinhub cluster up --nodes N --shard-count S` in a fresh temporary directory.
    pub fn up(nodes: u32, shards: u32) -> Cluster {
        Cluster::up_with(nodes, shards, &[])
    }

    /// [`Cluster::up`] with more `twinhub cluster up` options (e.g. `--raft-heartbeat-ms 50`).
    pub fn up_with(nodes: u32, shards: u32, extra: &[String]) -> Cluster {
        let root = tempfile::Builder::new().prefix("twinhub-cluster-").tempdir().expect("create temp dir");
        let dir = root.path().join("cluster");
        // The guard exists before anything starts, so a half-started cluster is stopped too.
        let mut c = Cluster {
            root: Some(root),
            dir: dir.clone(),
            owner_key: String::new(),
            ca_pem: Vec::new(),
            shard_count: shards,
            nodes: Vec::new(),
            restarted: Vec::new(),
        };
        let mut cmd = twinhub_cmd();
        cmd.args(["cluster", "up", "--nodes", &nodes.to_string(), "--shard-count", &shards.to_string()])
            .arg("--dir")
            .arg(&dir)
            .args(["--timeout", "180"])
            .args(extra);
        let out = cmd.output().expect("run twinhub cluster up");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            out.status.success(),
            "twinhub cluster up failed ({}):\n{stdout}\n{stderr}\n{}",
            out.status,
            c.logs_tail()
        );
        let file = c.cluster_file();
        c.owner_key = file["owner_key"].as_str().expect("cluster.json: owner_key").to_string();
        assert_eq!(file["hostname"], "localhost", "cluster.json: hostname");
        assert_eq!(file["shard_count"], shards, "cluster.json: shard_count");
        let ca = file["ca"].as_str().expect("cluster.json: ca");
        c.ca_pem = std::fs::read(ca).unwrap_or_else(|e| panic!("cannot read the cluster CA {ca}: {e}"));
        let entries = file["nodes"].as_array().expect("cluster.json: nodes");
        assert_eq!(entries.len(), nodes as usize, "cluster.json lists every node: {file}");
        for (i, n) in entries.iter().enumerate() {
            let addr = |k: &str| -> SocketAddr {
                let a = n[k].as_str().unwrap_or_else(|| panic!("cluster.json: node {i} without {k}: {n}"));
                a.parse().unwrap_or_else(|_| panic!("cluster.json: node {i}: {k} {a} is not ADDR:PORT"))
            };
            let path =
                |k: &str| PathBuf::from(n[k].as_str().unwrap_or_else(|| panic!("cluster.json: node {i} without {k}")));
            let node = Node {
                id: n["id"].as_u64().expect("node id"),
                pid: n["pid"].as_u64().expect("node pid") as u32,
                http: addr("http"),
                mqtt_plain: addr("mqtt_plain"),
                config: path("config"),
                log: path("log"),
            };
            for k in ["mqtt", "events", "cluster"] {
                assert!(addr(k).ip().is_loopback(), "node {}: {k} must be on loopback", node.id);
            }
            assert!(path("data_dir").is_dir(), "node {}: data_dir must exist", node.id);
            assert!(node.config.is_file(), "node {}: config file must exist", node.id);
            assert_eq!(node.id, i as u64 + 1, "node ids are 1..=N in order");
            assert!(pid_alive(node.pid), "node {} (pid {}) is not running", node.id, node.pid);
            let cs = n["connection_string"].as_str().unwrap_or("");
            let parsed = parse_connection_string(cs);
            assert_eq!(
                parsed.get("HostName"),
                Some(&format!("localhost:{}", node.http.port())),
                "node {}: {cs}",
                node.id
            );
            assert_eq!(parsed.get("SharedAccessKey"), Some(&c.owner_key), "node {}: {cs}", node.id);
            assert!(
                stdout.contains(&format!("node {}: {cs}", node.id)),
                "cluster up must print node {}'s connection string; stdout:\n{stdout}",
                node.id
            );
            c.nodes.push(node);
        }
        eprintln!("cluster of {nodes} nodes up in {}", dir.display());
        c
    }

    pub fn cluster_file(&self) -> Value {
        let path = self.dir.join("cluster.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON ({e}): {text}", path.display()))
    }

    pub fn node(&self, id: u64) -> &Node {
        self.nodes.iter().find(|n| n.id == id).unwrap_or_else(|| panic!("no node {id}"))
    }

    pub fn ids(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    pub fn http_client(&self, id: u64, timeout: Duration) -> reqwest::Client {
        let ca = reqwest::Certificate::from_pem(&self.ca_pem).expect("parse the cluster CA");
        reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(ca)
            .https_only(true)
            .resolve("localhost", self.node(id).http)
            .timeout(timeout)
            .build()
            .expect("build reqwest client")
    }

    /// An iothubowner client of node `id` (the token's `sr` is that node's `localhost:PORT`).
    pub fn api_with_timeout(&self, id: u64, timeout: Duration) -> Api {
        let port = self.node(id).http.port();
        Api {
            http: self.http_client(id, timeout),
            base_url: format!("https://localhost:{port}"),
            host_name: format!("localhost:{port}"),
            auth: Auth::Policy { name: "iothubowner".into(), key: self.owner_key.clone() },
        }
    }

    pub fn api(&self, id: u64) -> Api {
        self.api_with_timeout(id, Duration::from_secs(60))
    }

    /// Node `id`'s `/cluster/status`, or `None` if it does not answer 200.
    pub async fn status(&self, id: u64) -> Option<Value> {
        let api = self.api_with_timeout(id, Duration::from_secs(5));
        match api.try_send("GET", "/cluster/status", None, &[]).await {
            Ok(r) if r.status == 200 => r.json.clone(),
            _ => None,
        }
    }

    /// A label-less counter or gauge on node `id`'s `/metrics` (a line `name value`); 0 if absent.
    pub async fn metric(&self, id: u64, name: &str) -> f64 {
        let page = self.api(id).send("GET", "/metrics", None, &[]).await.text;
        page.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    }

    pub async fn shard_status(&self, id: u64, shard: u32) -> Option<Value> {
        let st = self.status(id).await?;
        st["shards"].as_array()?.iter().find(|s| s["shard"] == shard).cloned()
    }

    /// The leader of `shard` that every live node hosting it agrees on (and that says it leads), with
    /// its term. Nodes that do not replicate the shard are not asked.
    pub async fn agreed_leader(&self, shard: u32, live: &[u64]) -> Option<(u64, u64)> {
        let mut leader = None;
        for id in live {
            let st = self.status(*id).await?;
            let Some(s) = st["shards"].as_array().and_then(|a| a.iter().find(|s| s["shard"] == shard)) else {
                continue;
            };
            let l = s["leader"].as_u64()?;
            if leader.is_some_and(|x| x != l) {
                return None;
            }
            leader = Some(l);
        }
        let l = leader?;
        let s = self.shard_status(l, shard).await?;
        (s["is_leader"] == true).then(|| (l, s["term"].as_u64().unwrap_or(0)))
    }

    /// Every shard's agreed leader and term (see [`Cluster::agreed_leader`]), or `None` while any shard
    /// has none.
    pub async fn leaders(&self, live: &[u64]) -> Option<std::collections::BTreeMap<u32, (u64, u64)>> {
        let mut out = std::collections::BTreeMap::new();
        for shard in 0..self.shard_count {
            out.insert(shard, self.agreed_leader(shard, live).await?);
        }
        Some(out)
    }

    /// The cluster map as node `id` applied it (`members`, `placement`), if it answers.
    pub async fn map(&self, id: u64) -> Option<Value> {
        Some(self.status(id).await?["map"].clone())
    }

    /// Target replicas of `shard` in the map of any answering node.
    pub async fn target_replicas(&self, shard: u32) -> Vec<u64> {
        for id in self.ids() {
            if let Some(map) = self.map(id).await {
                if let Some(r) = map["placement"]["shards"][shard as usize]["replicas"].as_array() {
                    return r.iter().filter_map(Value::as_u64).collect();
                }
            }
        }
        Vec::new()
    }

    /// True when every shard's leader reports exactly the map's target replicas as voters and no
    /// learners: every move has completed.
    pub async fn converged(&self) -> bool {
        let ids = self.ids();
        let Some(map) = self.map(ids[0]).await else { return false };
        for shard in 0..self.shard_count {
            let want: Vec<u64> = map["placement"]["shards"][shard as usize]["replicas"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default();
            // The view of the node that leads the shard (highest term if two claim it): a leadership
            // move may be under way, so not every node need agree on the leader at this instant.
            let mut lead: Option<Value> = None;
            for id in &ids {
                if let Some(st) = self.shard_status(*id, shard).await {
                    if st["is_leader"] == true && lead.as_ref().is_none_or(|l| l["term"].as_u64() < st["term"].as_u64())
                    {
                        lead = Some(st);
                    }
                }
            }
            let Some(s) = lead else { return false };
            let voters: Vec<u64> =
                s["voters"].as_array().map(|a| a.iter().filter_map(Value::as_u64).collect()).unwrap_or_default();
            if voters != want || s["learners"].as_array().is_some_and(|l| !l.is_empty()) {
                return false;
            }
        }
        true
    }

    /// Waits until [`Cluster::converged`].
    pub async fn wait_converged(&self, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.converged().await {
            assert!(
                Instant::now() < deadline,
                "replicas did not reach the map's placement within {within:?}\n{}",
                self.logs_tail()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// `twinhub cluster add --dir`: starts a new node and adds it; returns its id.
    pub fn add_node(&mut self) -> u64 {
        let out = self.cli(&["add"]);
        let file = self.cluster_file();
        let entry = file["nodes"].as_array().and_then(|a| a.last()).cloned().expect("cluster.json lists the new node");
        let id = entry["id"].as_u64().expect("id");
        assert!(
            out.contains(&format!("node {id}:")),
            "cluster add must print the new node's connection string:\n{out}"
        );
        let addr = |k: &str| -> SocketAddr { entry[k].as_str().and_then(|a| a.parse().ok()).expect("address") };
        self.nodes.push(Node {
            id,
            pid: entry["pid"].as_u64().expect("pid") as u32,
            http: addr("http"),
            mqtt_plain: addr("mqtt_plain"),
            config: PathBuf::from(entry["config"].as_str().expect("config")),
            log: PathBuf::from(entry["log"].as_str().expect("log")),
        });
        id
    }

    /// `twinhub cluster remove --dir --node ID`: drains the node, waits until it holds nothing, stops it.
    pub fn remove_node(&mut self, id: u64) {
        self.cli(&["remove", "--node", &id.to_string()]);
        assert!(
            !self.cluster_file()["nodes"].as_array().expect("nodes").iter().any(|n| n["id"] == id),
            "node {id} left cluster.json"
        );
        self.nodes.retain(|n| n.id != id);
    }

    /// Runs `twinhub cluster <args> --dir DIR`, asserting success; returns stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let mut cmd = twinhub_cmd();
        cmd.arg("cluster").args(args).arg("--dir").arg(&self.dir);
        let out = cmd.output().expect("run twinhub cluster");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            out.status.success(),
            "twinhub cluster {args:?} failed ({}):\n{stdout}\n{stderr}\n{}",
            out.status,
            self.logs_tail()
        );
        eprintln!("twinhub cluster {args:?}:\n{stderr}");
        stdout
    }

    /// Waits for a leader of `shard` that every node in `live` agrees on and that holds for `stable`.
    pub async fn settled_leader(&self, shard: u32, live: &[u64], stable: Duration) -> (u64, u64) {
        let deadline = Instant::now() + WAIT;
        let mut since: Option<(u64, Instant)> = None;
        loop {
            match self.agreed_leader(shard, live).await {
                Some((l, term)) => match since {
                    Some((prev, t)) if prev == l => {
                        if t.elapsed() >= stable {
                            return (l, term);
                        }
                    }
                    _ => since = Some((l, Instant::now())),
                },
                None => since = None,
            }
            assert!(
                Instant::now() < deadline,
                "shard {shard}: no leader agreed by nodes {live:?} within {WAIT:?}\n{}",
                self.logs_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until leadership has settled on every shard: all nodes agree on each leader and it is the
    /// shard's preferred node in the cluster map (the balancer is done), or the leaders stayed
    /// unchanged for 5 s.
    pub async fn settle_leadership(&self) {
        let ids = self.ids();
        let deadline = Instant::now() + WAIT;
        let mut stable: Option<(Vec<u64>, Instant)> = None;
        loop {
            let map = self.map(ids[0]).await.unwrap_or_default();
            let mut leaders = Vec::new();
            for shard in 0..self.shard_count {
                match self.agreed_leader(shard, &ids).await {
                    Some((l, _)) => leaders.push(l),
                    None => break,
                }
            }
            if leaders.len() == self.shard_count as usize {
                let on_preferred =
                    leaders.iter().enumerate().all(|(s, l)| map["placement"]["shards"][s]["leader"] == *l);
                match &stable {
                    Some((prev, since)) if *prev == leaders => {
                        if (on_preferred && since.elapsed() >= Duration::from_millis(500))
                            || since.elapsed() >= Duration::from_secs(5)
                        {
                            return;
                        }
                    }
                    _ => stable = Some((leaders, Instant::now())),
                }
            } else {
                stable = None;
            }
            assert!(Instant::now() < deadline, "leadership did not settle within {WAIT:?}\n{}", self.logs_tail());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn is_ready(&self, id: u64) -> bool {
        let http = self.http_client(id, Duration::from_secs(3));
        let url = format!("https://localhost:{}/ready", self.node(id).http.port());
        matches!(http.get(url).send().await, Ok(r) if r.status().as_u16() == 200)
    }

    pub async fn wait_ready(&self, id: u64) {
        let deadline = Instant::now() + WAIT;
        while !self.is_ready(id).await {
            assert!(pid_alive(self.node(id).pid), "node {id} exited before it was ready\n{}", self.logs_tail());
            assert!(Instant::now() < deadline, "node {id} not ready within {WAIT:?}\n{}", self.logs_tail());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGKILL node `id` and wait until it is gone.
    pub fn kill9(&self, id: u64) {
        let pid = self.node(id).pid;
        assert!(pid_alive(pid), "node {id} (pid {pid}) is not running before the kill");
        kill9(pid);
        let deadline = Instant::now() + Duration::from_secs(30);
        while pid_alive(pid) {
            assert!(Instant::now() < deadline, "node {id} (pid {pid}) still alive 30 s after SIGKILL");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `twinhub serve --config <node's config>`, logging where `cluster up` logged; records the new pid
    /// here and in cluster.json.
    pub fn restart(&mut self, id: u64) {
        let node = self.node(id).clone();
        assert!(!pid_alive(node.pid), "node {id} still runs");
        let open = |p: PathBuf| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
                .unwrap_or_else(|e| panic!("open {}: {e}", p.display()))
        };
        let mut cmd = twinhub_cmd();
        cmd.arg("serve")
            .arg("--config")
            .arg(&node.config)
            .stdout(open(node.log.with_extension("stdout")))
            .stderr(open(node.log.clone()));
        let child = cmd.spawn().expect("spawn twinhub serve");
        let pid = child.id();
        self.restarted.push(child);
        self.nodes.iter_mut().find(|n| n.id == id).expect("node").pid = pid;
        let mut file = self.cluster_file();
        for n in file["nodes"].as_array_mut().expect("nodes") {
            if n["id"] == id {
                n["pid"] = json!(pid);
            }
        }
        std::fs::write(self.dir.join("cluster.json"), serde_json::to_vec_pretty(&file).unwrap())
            .expect("update cluster.json");
        eprintln!("node {id} restarted as pid {pid}");
    }

    /// No node log reports a panic.
    pub fn assert_no_panics(&self) {
        for n in &self.nodes {
            let log = String::from_utf8_lossy(&std::fs::read(&n.log).unwrap_or_default()).to_string();
            if let Some(line) = log.lines().find(|l| l.contains("panicked")) {
                panic!("node {} panicked: {line}\n{}", n.id, self.logs_tail());
            }
        }
    }

    pub fn logs_tail(&self) -> String {
        let mut out = String::new();
        let mut logs: Vec<(String, PathBuf)> =
            self.nodes.iter().map(|n| (format!("node {}", n.id), n.log.clone())).collect();
        if logs.is_empty() {
            for i in 1..=9 {
                let p = self.dir.join(format!("node-{i}")).join("twinhub.log");
                if p.exists() {
                    logs.push((format!("node {i}"), p));
                }
            }
        }
        for (name, p) in logs {
            out.push_str(&format!("--- {name}: {} (tail) ---\n{}\n", p.display(), file_tail(&p, 4096)));
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut pids: Vec<u32> = self.nodes.iter().map(|n| n.pid).collect();
        if let Ok(text) = std::fs::read_to_string(self.dir.join("cluster.json")) {
            if let Ok(v) = serde_json::from_str::<Value>(&text) {
                pids.extend(
                    v["nodes"].as_array().into_iter().flatten().filter_map(|n| n["pid"].as_u64()).map(|p| p as u32),
                );
            }
        }
        for pid in pids {
            kill9(pid);
        }
        for c in &mut self.restarted {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs_tail());
            if let Some(root) = self.root.take() {
                let kept = root.keep();
                eprintln!("cluster directory kept for inspection: {}", kept.display());
            }
        }
    }
}

/// The first id `{prefix}{i}` that hashes to `shard`, skipping ids in `taken`.
pub fn device_on_shard(prefix: &str, shard: u32, shard_count: u32, taken: &mut HashSet<String>) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|id| twinhub_core::ids::shard_of(id, shard_count) == shard && taken.insert(id.clone()))
        .expect("some id hashes to every shard")
}

pub fn permutations(ids: &[u64]) -> Vec<Vec<u64>> {
    if ids.len() <= 1 {
        return vec![ids.to_vec()];
    }
    let mut out = Vec::new();
    for (i, first) in ids.iter().enumerate() {
        let mut rest = ids.to_vec();
        rest.remove(i);
        for mut p in permutations(&rest) {
            p.insert(0, *first);
            out.push(p);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------------
// The inter-node port, for tests that talk to it directly

impl Cluster {
    /// The inter-node secret every node shares, as `cluster up` recorded it in `cluster.json` (each
    /// node's `twinhub.toml` holds the same value as `cluster_secret`).
    pub fn cluster_secret(&self) -> String {
        self.cluster_file()["secret"].as_str().expect("cluster.json: secret").to_string()
    }

    /// A TLS client that presents node `as_node`'s cluster certificate (what `cluster up` issued it)
    /// and trusts the cluster CA: a member's credentials, for tests of what a member may still not do.
    pub fn member_tls(&self, as_node: u64) -> std::sync::Arc<rustls::ClientConfig> {
        let node_dir = self.dir.join(format!("node-{as_node}"));
        cluster_tls_client(
            &self.dir.join("shared/tls/cluster-ca.pem"),
            Some((&node_dir.join("cluster-node.pem"), &node_dir.join("cluster-node.key"))),
        )
    }

    /// Node `id`'s inter-node listener.
    pub fn cluster_addr(&self, id: u64) -> SocketAddr {
        let file = self.cluster_file();
        let entry = file["nodes"].as_array().and_then(|a| a.iter().find(|n| n["id"] == id)).cloned();
        let entry = entry.unwrap_or_else(|| panic!("cluster.json: no node {id}"));
        entry["cluster"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("cluster.json: node {id} without cluster address"))
    }
}

/// The name node `id`'s cluster certificate carries (and a TLS client must ask for).
pub fn cluster_node_name(id: u64) -> rustls::pki_types::ServerName<'static> {
    rustls::pki_types::ServerName::try_from(format!("node-{id}.cluster.twinhub")).expect("a DNS name")
}

/// A TLS 1.3 client with ALPN `h2` trusting the CA in `ca`, presenting `identity` (cert, key) if given.
pub fn cluster_tls_client(
    ca: &std::path::Path,
    identity: Option<(&std::path::Path, &std::path::Path)>,
) -> std::sync::Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).expect("read CA") {
        roots.add(c.expect("CA PEM")).expect("add CA");
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => {
            let chain: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(cert)
                .expect("read cert")
                .map(|c| c.expect("cert PEM"))
                .collect();
            let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key).expect("read key");
            b.with_client_auth_cert(chain, key).expect("client identity")
        }
        None => b.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"twinhub-frames/1".to_vec()];
    std::sync::Arc::new(config)
}

/// Resident set size of process `pid` in KiB (`VmRSS` of `/proc/PID/status`); 0 if it is gone.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The inter-node framing, as a member speaks it, written from its description (not borrowed from the
/// server) so that tests pin the wire format: `u32` head length and `u32` body length (little-endian),
/// the head (`u64` id, `u8` kind — 1 request, 2 answer, 3 ping, 4 pong —, `u16` status, `u16` path
/// length and path, `u16` header count, per header `u16` name length, name, `u32` value length,
/// value), then the body.
pub mod frames {
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

    /// An answer: its status, headers (lower-case names) and body.
    #[derive(Debug)]
    pub struct FrameAnswer {
        pub status: u16,
        pub headers: Vec<(String, Vec<u8>)>,
        pub body: Vec<u8>,
    }

    /// The lengths and head of a request frame declaring `body_len` body bytes (which follow it).
    pub fn request_head(id: u64, path: &str, headers: &[(String, Vec<u8>)], body_len: usize) -> Vec<u8> {
        let mut head = Vec::new();
        head.extend_from_slice(&id.to_le_bytes());
        head.push(1);
        head.extend_from_slice(&0u16.to_le_bytes());
        head.extend_from_slice(&(path.len() as u16).to_le_bytes());
        head.extend_from_slice(path.as_bytes());
        head.extend_from_slice(&(headers.len() as u16).to_le_bytes());
        for (name, value) in headers {
            head.extend_from_slice(&(name.len() as u16).to_le_bytes());
            head.extend_from_slice(name.as_bytes());
            head.extend_from_slice(&(value.len() as u32).to_le_bytes());
            head.extend_from_slice(value);
        }
        let mut frame = Vec::with_capacity(8 + head.len());
        frame.extend_from_slice(&(head.len() as u32).to_le_bytes());
        frame.extend_from_slice(&(body_len as u32).to_le_bytes());
        frame.extend_from_slice(&head);
        frame
    }

    fn bad(what: &str) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
    }

    fn take<'a>(b: &mut &'a [u8], n: usize) -> std::io::Result<&'a [u8]> {
        if b.len() < n {
            return Err(bad("short head"));
        }
        let (x, rest) = b.split_at(n);
        *b = rest;
        Ok(x)
    }

    /// Reads the next answer frame (pongs are skipped).
    pub async fn read_answer<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<FrameAnswer> {
        loop {
            let head_len = r.read_u32_le().await? as usize;
            let body_len = r.read_u32_le().await? as usize;
            if head_len > 1 << 20 || body_len > 64 << 20 {
                return Err(bad("frame too large"));
            }
            let mut head = vec![0; head_len];
            r.read_exact(&mut head).await?;
            let mut body = vec![0; body_len];
            r.read_exact(&mut body).await?;
            let mut h = &head[..];
            let _id = take(&mut h, 8)?;
            let kind = take(&mut h, 1)?[0];
            let status = u16::from_le_bytes(take(&mut h, 2)?.try_into().map_err(|_| bad("status"))?);
            let path_len = u16::from_le_bytes(take(&mut h, 2)?.try_into().map_err(|_| bad("path"))?) as usize;
            take(&mut h, path_len)?;
            let count = u16::from_le_bytes(take(&mut h, 2)?.try_into().map_err(|_| bad("count"))?);
            let mut headers = Vec::new();
            for _ in 0..count {
                let n = u16::from_le_bytes(take(&mut h, 2)?.try_into().map_err(|_| bad("name"))?) as usize;
                let name = String::from_utf8_lossy(take(&mut h, n)?).into_owned();
                let v = u32::from_le_bytes(take(&mut h, 4)?.try_into().map_err(|_| bad("value"))?) as usize;
                headers.push((name, take(&mut h, v)?.to_vec()));
            }
            match kind {
                2 => return Ok(FrameAnswer { status, headers, body }),
                4 => continue,
                k => return Err(bad(&format!("frame kind {k} where an answer was due"))),
            }
        }
    }

    /// One request on `io` (a fresh connection) and its answer; `Err` if the connection is refused or
    /// closed first.
    pub async fn request<IO>(
        io: IO,
        path: &str,
        headers: &[(String, Vec<u8>)],
        body: &[u8],
    ) -> Result<FrameAnswer, String>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let (mut r, mut w) = tokio::io::split(io);
        let mut frame = request_head(1, path, headers, body.len());
        frame.extend_from_slice(body);
        w.write_all(&frame).await.map_err(|e| format!("write: {e}"))?;
        w.flush().await.map_err(|e| format!("flush: {e}"))?;
        read_answer(&mut r).await.map_err(|e| format!("answer: {e}"))
    }
}
