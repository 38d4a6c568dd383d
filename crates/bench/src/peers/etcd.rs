//! A 3-member etcd cluster on loopback (Debian package `etcd-server`, etcd 3.4), each member with its
//! own data directory under a temp dir, default fsync (etcd fsyncs its WAL before acknowledging).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::procs::{self, TempDir};

pub struct EtcdCluster {
    pub dir: TempDir,
    children: Vec<Child>,
    pub clients: Vec<SocketAddr>,
    pub version: String,
    pub bin: PathBuf,
    pub flags: Vec<String>,
}

impl EtcdCluster {
    pub async fn up(members: usize, quota_bytes: u64) -> anyhow::Result<EtcdCluster> {
        let bin = procs::ensure_installed("etcd", "etcd-server")?;
        let version = procs::first_line(&bin, &["--version"]);
        let dir = TempDir::new("twinhub-bench-etcd")?;
        let ports = procs::free_ports(members * 2)?;
        let peer_url = |i: usize| format!("http://127.0.0.1:{}", ports[members + i]);
        let initial: Vec<String> = (0..members).map(|i| format!("m{}={}", i + 1, peer_url(i))).collect();
        let common = vec![
            format!("--quota-backend-bytes={quota_bytes}"),
            "--initial-cluster-token=twinhub-bench".to_string(),
            "--initial-cluster-state=new".to_string(),
            format!("--initial-cluster={}", initial.join(",")),
            "--logger=zap".to_string(),
            "--log-level=warn".to_string(),
        ];
        eprintln!("starting etcd ({version}): {members} members under {}, {}", dir.path.display(), common.join(" "));
        let mut children = Vec::new();
        let mut clients = Vec::new();
        for (i, port) in ports.iter().enumerate().take(members) {
            let client = format!("http://127.0.0.1:{port}");
            let log = std::fs::File::create(dir.path.join(format!("m{}.log", i + 1)))?;
            let child = Command::new(&bin)
                .arg(format!("--name=m{}", i + 1))
                .arg(format!("--data-dir={}", dir.path.join(format!("m{}", i + 1)).display()))
                .arg(format!("--listen-client-urls={client}"))
                .arg(format!("--advertise-client-urls={client}"))
                .arg(format!("--listen-peer-urls={}", peer_url(i)))
                .arg(format!("--initial-advertise-peer-urls={}", peer_url(i)))
                .args(&common)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?;
            children.push(child);
            clients.push(SocketAddr::from(([127, 0, 0, 1], ports[i])));
        }
        let mut c = EtcdCluster { dir, children, clients, version, bin, flags: common };
        for (i, a) in c.clients.clone().iter().enumerate() {
            if let Err(e) = super::wait_http(*a, "/health", Duration::from_secs(60), |b| b.contains("\"true\"")).await {
                let tail = super::log_tail(&c.dir.path.join(format!("m{}.log", i + 1)), 2000);
                c.stop();
                anyhow::bail!("etcd member {} did not become healthy: {e}\n{tail}", i + 1);
            }
        }
        eprintln!("etcd cluster healthy: clients {:?}", c.clients);
        Ok(c)
    }

    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.id()).collect()
    }

    pub fn stop(&mut self) {
        super::stop_all(&mut self.children, "etcd");
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.stop();
    }
}
