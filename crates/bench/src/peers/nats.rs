//! A 3-server NATS cluster with JetStream on loopback (Debian package `nats-server`) and a KV bucket
//! stream `KV_<bucket>` with 3 replicas, created the way a KV client creates it. Asks for
//! `sync_interval: always` (fsync before every ack) and reports plainly whether the server took it.

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
    pub async fn up(servers: usize, bucket: &str) -> anyhow::Result<NatsCluster> {
        let bin = procs::ensure_installed("nats-server", "nats-server")?;
        let version = procs::first_line(&bin, &["--version"]);
        let dir = TempDir::new("twinhub-bench-nats")?;
        // First with sync_interval: always; if this server version rejects the option, without it.
        let mut rejected = String::new();
        for sync_always in [true, false] {
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
            } else {
                format!(
                    "NOT equal to etcd/twinhub: nats-server {version} does not support sync_interval (config rejected: {rejected}; \
                     the option came with 2.10), so it runs without: a JetStream ack means 'written by a quorum of 3 replicas \
                     to the OS page cache', fsync happens periodically in the background, not before the ack"
                )
            };
            eprintln!("nats durability: {}", c.durability);
            c.create_stream().await?;
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

    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.id()).collect()
    }

    pub fn stop(&mut self) {
        super::stop_all(&mut self.children, "nats");
    }
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
