//! `twinhub cluster up|down|status`: run a cluster of local nodes on this machine (loopback ports), for
//! development, tests, benches and the chaos suite.
//!
//! `up` prepares what the nodes must share before any of them starts — the cluster secret, the policy
//! keys (`policies.json`) and one certificate every node serves (so clients trust a single CA) — writes
//! a config file per node, starts each node in its own process group (they outlive this command), waits
//! until every node answers, and records everything in `DIR/cluster.json`.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};

use crate::auth::{generate_key, write_atomically, Policies};

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Start N local nodes in the background and wait until the cluster is ready.
    Up(UpArgs),
    /// Stop the nodes of a local cluster.
    Down(DirArgs),
    /// Nodes, and for every shard its leader, replicas, term and replica lag.
    Status(StatusArgs),
    /// Start one more node and make it a replica of every shard.
    Add(AddArgs),
    /// Remove a node from every shard, stop it and set its data aside (its id is never reused).
    Remove(RemoveArgs),
    /// Make (or reuse) a cluster CA in DIR and issue inter-node TLS certificates for the given node ids
    /// (for clusters not started by `cluster up`: systemd, Kubernetes; also to rotate certificates).
    Certs(CertsArgs),
}

#[derive(Args, Debug)]
pub struct CertsArgs {
    /// Directory of the cluster CA (`cluster-ca.pem`, `cluster-ca.key`; made if absent) and of the
    /// issued certificates (`node-N/cluster-node.pem`, `node-N/cluster-node.key`)
    #[arg(long)]
    pub dir: PathBuf,
    /// Node ids to issue certificates for (repeat, or comma-separated)
    #[arg(long = "node", value_delimiter = ',', required = true)]
    pub nodes: Vec<u64>,
}

#[derive(Args, Debug)]
pub struct AddArgs {
    #[arg(long)]
    pub dir: PathBuf,
    /// Seconds to wait for the node to be ready.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
}

#[derive(Args, Debug)]
pub struct RemoveArgs {
    #[arg(long)]
    pub dir: PathBuf,
    /// Id of the node to remove.
    #[arg(long)]
    pub node: u64,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Which hub: a local cluster (`--dir`, every node is asked) or any node by connection string or
    /// profile (that node, plus the nodes given with --node-address)
    #[command(flatten)]
    pub target: super::remote::Target,
    /// HTTPS address (host:port) of another node to ask; repeat for each node
    #[arg(long = "node-address")]
    pub node_addresses: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct UpArgs {
    /// Number of nodes (≥ 1; 3 or more for a replicated cluster).
    #[arg(long, default_value_t = 3)]
    pub nodes: u32,
    /// Directory for the cluster's node data, configs, logs and cluster.json.
    #[arg(long)]
    pub dir: PathBuf,
    /// Shards of the cluster, each a Raft group; fixed once data exists.
    #[arg(long, default_value_t = crate::ids::DEFAULT_SHARD_COUNT)]
    pub shard_count: u32,
    /// The twinhub binary the nodes run [default: this executable].
    #[arg(long)]
    pub bin: Option<PathBuf>,
    /// How long to wait for the cluster to become ready, in seconds.
    #[arg(long, default_value_t = 120)]
    pub timeout: u64,
    /// Raft heartbeat of every node in milliseconds (elections time out after 3 to 6 heartbeats)
    #[arg(long)]
    pub raft_heartbeat_ms: Option<u64>,
    /// Runtime threads of every node [default: the node's, one per CPU core]
    #[arg(long)]
    pub worker_threads: Option<usize>,
    /// A node option for every node's config file, as `key=value` in the file's TOML form
    /// (`max_connections_mqtt=17000`); repeatable. Load generators that simulate a fleet from one
    /// machine use it to lift per-source and per-listener bounds.
    #[arg(long = "node-option", value_name = "KEY=VALUE", value_parser = parse_node_option)]
    pub node_options: Vec<(String, String)>,
}

/// A `key=value` node option: the key as the config file spells it, the value one TOML value.
/// Whether the node options turn inter-node TLS off (`cluster_plaintext = true`).
fn plaintext_asked(options: &[(String, String)]) -> bool {
    options.iter().any(|(k, v)| k == "cluster_plaintext" && v == "true")
}

fn parse_node_option(s: &str) -> Result<(String, String), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("'{s}': expected KEY=VALUE"))?;
    let (k, v) = (k.trim(), v.trim());
    if k.is_empty() || !k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
        return Err(format!("'{k}': a node option key is lowercase letters, digits and '_'"));
    }
    const WRITTEN: [&str; 19] = [
        "node_id",
        "data_dir",
        "hostname",
        "http_listen",
        "mqtt_listen",
        "mqtt_plain_listen",
        "events_listen",
        "shard_count",
        "tls_cert",
        "tls_key",
        "worker_threads",
        "cluster_listen",
        "cluster_secret",
        "peers",
        "join",
        "raft_heartbeat_ms",
        "cluster_ca",
        "cluster_cert",
        "cluster_key",
    ];
    if WRITTEN.contains(&k) {
        return Err(format!("'{k}' is set by `twinhub cluster` itself"));
    }
    let probe = format!("{k} = {v}");
    probe.parse::<toml::Table>().map_err(|e| format!("'{v}' is not one TOML value: {e}"))?;
    if v.contains('\n') {
        return Err(format!("'{v}': one line only"));
    }
    Ok((k.to_string(), v.to_string()))
}

#[derive(Args, Debug)]
pub struct DirArgs {
    #[arg(long)]
    pub dir: PathBuf,
}

/// `DIR/cluster.json`: what scripts need to talk to the cluster.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ClusterFile {
    pub owner_key: String,
    /// The inter-node secret (nodes added later need it).
    pub secret: String,
    /// Certificate and key every node serves.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The binary the nodes run.
    pub bin: PathBuf,
    /// Ids of removed nodes: never reused.
    #[serde(default)]
    pub removed: Vec<u64>,
    /// PEM of the CA every node's certificate chains to.
    pub ca: PathBuf,
    pub hostname: String,
    pub shard_count: u32,
    /// Raft heartbeat the nodes were configured with (`None`: the node default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raft_heartbeat_ms: Option<u64>,
    /// Runtime threads the nodes were configured with (`None`: the node default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_threads: Option<usize>,
    /// Extra `key = value` lines of every node's config file (`cluster up --node-option`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_options: Vec<(String, String)>,
    pub nodes: Vec<NodeEntry>,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct NodeEntry {
    pub id: u64,
    pub pid: u32,
    /// HTTPS API address.
    pub http: SocketAddr,
    /// MQTT over TLS.
    pub mqtt: SocketAddr,
    /// Plain-TCP MQTT (development).
    pub mqtt_plain: SocketAddr,
    pub events: SocketAddr,
    /// Inter-node address.
    pub cluster: SocketAddr,
    pub data_dir: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
    /// The node's service connection string.
    pub connection_string: String,
}

#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("{0}")]
    Usage(String),
    #[error("node {id} exited before it was ready (see {log})")]
    Exited { id: u64, log: String },
    #[error("the cluster was not ready within {0} s (logs under the cluster directory)")]
    Timeout(u64),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error(transparent)]
    Policies(#[from] crate::auth::PolicyFileError),
    #[error(transparent)]
    Https(#[from] super::https::HttpsError),
    #[error(transparent)]
    Remote(#[from] super::remote::RemoteError),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LauncherError {
    let what = what.into();
    move |source| LauncherError::Io { what, source }
}

pub fn run(cmd: ClusterCommand) -> ExitCode {
    let result = match cmd {
        ClusterCommand::Up(a) => up(a),
        ClusterCommand::Down(a) => down(&a.dir),
        ClusterCommand::Status(a) => status(&a),
        ClusterCommand::Add(a) => add(&a.dir, a.timeout),
        ClusterCommand::Remove(a) => remove(&a.dir, a.node),
        ClusterCommand::Certs(a) => certs(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("twinhub cluster: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Free loopback ports for the nodes' listeners (see [`crate::net::free_loopback_ports`]).
fn free_ports(n: usize) -> Result<Vec<u16>, LauncherError> {
    crate::net::free_loopback_ports(n).map_err(io("choosing a free port"))
}

/// Whether `pid` still runs, counting a zombie whose other threads have not all exited (the bench's
/// process helpers use this one too).
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

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).stderr(Stdio::null()).status();
}

pub fn read_cluster_file(dir: &Path) -> Result<ClusterFile, LauncherError> {
    let path = dir.join("cluster.json");
    let text = std::fs::read_to_string(&path).map_err(io(format!("reading {}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| LauncherError::Usage(format!("{}: {e}", path.display())))
}

fn up(a: UpArgs) -> Result<(), LauncherError> {
    if a.nodes == 0 {
        return Err(LauncherError::Usage("--nodes must be at least 1".into()));
    }
    if let Ok(existing) = read_cluster_file(&a.dir) {
        if existing.nodes.iter().any(|n| pid_alive(n.pid)) {
            return Err(LauncherError::Usage(format!(
                "a cluster is already running from {} (twinhub cluster down --dir {} first)",
                a.dir.display(),
                a.dir.display()
            )));
        }
    }
    crate::secrets::create_private_dir(&a.dir).map_err(io(format!("creating {}", a.dir.display())))?;
    let dir = a.dir.canonicalize().map_err(io(format!("resolving {}", a.dir.display())))?;
    let bin = match a.bin {
        Some(b) => b,
        None => std::env::current_exe().map_err(io("locating the twinhub binary"))?,
    };
    let hostname = "localhost".to_string();

    // What every node shares.
    let shared = dir.join("shared");
    crate::secrets::create_private_dir(&shared).map_err(io(format!("creating {}", shared.display())))?;
    let certs = crate::tls::ensure_dev_certs(&shared.join("tls"), &hostname)?;
    let policies = Policies::load_or_create(&shared, None)?;
    let owner_key = policies.owner_key().to_string();
    let policies_json = std::fs::read(shared.join("policies.json")).map_err(io("reading the shared policies"))?;
    let secret = generate_key();

    let ids: Vec<u64> = (1..=u64::from(a.nodes)).collect();
    let ports = free_ports(ids.len() * 5)?;
    let peers: BTreeMap<u64, SocketAddr> =
        ids.iter().enumerate().map(|(i, id)| (*id, loopback(ports[i * 5 + 4]))).collect();
    let mut file = ClusterFile {
        owner_key,
        ca: certs.ca_cert.clone(),
        hostname: hostname.clone(),
        shard_count: a.shard_count,
        nodes: Vec::new(),
        secret,
        cert: certs.server_cert.clone(),
        key: certs.server_key.clone(),
        bin: bin.clone(),
        removed: Vec::new(),
        raft_heartbeat_ms: a.raft_heartbeat_ms,
        worker_threads: a.worker_threads,
        node_options: a.node_options.clone(),
    };
    for (i, id) in ids.iter().enumerate() {
        let entry = prepare_node(&dir, &file, *id, &ports[i * 5..i * 5 + 5], &peers, None, &policies_json)?;
        file.nodes.push(entry);
    }
    for n in file.nodes.iter_mut() {
        spawn_node(&bin, n)?;
    }
    // Written before waiting, so `down` can stop a cluster that never became ready.
    save(&dir, &file)?;
    let tls = super::https::client_config(&certs.ca_cert)?;
    let started = Instant::now();
    wait_ready(&tls, &mut file.nodes, Duration::from_secs(a.timeout))?;
    save(&dir, &file)?;
    let nodes = file.nodes.clone();
    let mut out = std::io::stdout().lock();
    for n in &nodes {
        let _ = writeln!(out, "node {}: {}", n.id, n.connection_string);
    }
    let _ = writeln!(out, "CA: {}", certs.ca_cert.display());
    let _ = writeln!(out, "cluster file: {}", dir.join("cluster.json").display());
    eprintln!("cluster of {} node(s) ready in {:.1?}", nodes.len(), started.elapsed());
    Ok(())
}

fn loopback(p: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], p))
}

fn save(dir: &Path, file: &ClusterFile) -> Result<(), LauncherError> {
    let json = serde_json::to_vec_pretty(file).unwrap_or_default();
    write_atomically(&dir.join("cluster.json"), &json).map_err(io("writing cluster.json"))
}

/// Creates node `id`'s directory, data directory (with the shared policies) and config file.
/// `ports`: http, mqtt, plain mqtt, events, cluster. `peers`: every member the node should know.
fn prepare_node(
    dir: &Path,
    file: &ClusterFile,
    id: u64,
    ports: &[u16],
    peers: &BTreeMap<u64, SocketAddr>,
    join: Option<SocketAddr>,
    policies_json: &[u8],
) -> Result<NodeEntry, LauncherError> {
    let node_dir = dir.join(format!("node-{id}"));
    let data_dir = node_dir.join("data");
    crate::secrets::create_private_dir(&data_dir).map_err(io(format!("creating {}", data_dir.display())))?;
    if !data_dir.join("policies.json").exists() {
        write_atomically(&data_dir.join("policies.json"), policies_json).map_err(io("writing policies.json"))?;
    }
    let entry = NodeEntry {
        id,
        pid: 0,
        http: loopback(ports[0]),
        mqtt: loopback(ports[1]),
        mqtt_plain: loopback(ports[2]),
        events: loopback(ports[3]),
        cluster: loopback(ports[4]),
        data_dir: data_dir.clone(),
        config: node_dir.join("twinhub.toml"),
        log: node_dir.join("twinhub.log"),
        connection_string: String::new(),
    };
    let peers_text = peers.iter().map(|(id, a)| format!("{id}={a}")).collect::<Vec<_>>().join(",");
    let toml = format!(
        "# twinhub node {id} of a local cluster (written by `twinhub cluster`)\n\
         node_id = {id}\n\
         data_dir = {data:?}\n\
         hostname = {hostname:?}\n\
         http_listen = \"{http}\"\n\
         mqtt_listen = \"{mqtt}\"\n\
         mqtt_plain_listen = \"{plain}\"\n\
         events_listen = \"{events}\"\n\
         {shards}\
         tls_cert = {cert:?}\n\
         tls_key = {key:?}\n{threads}{options}{cluster}",
        data = data_dir.display().to_string(),
        hostname = file.hostname,
        http = entry.http,
        mqtt = entry.mqtt,
        plain = entry.mqtt_plain,
        events = entry.events,
        // A joining node takes the cluster's count on its first start and its data directory keeps it.
        shards = match join {
            None => format!("shard_count = {}\n", file.shard_count),
            Some(_) => "# shard_count: the cluster's, asked when the node first starts\n".to_string(),
        },
        cert = file.cert.display().to_string(),
        key = file.key.display().to_string(),
        threads = file.worker_threads.map(|n| format!("worker_threads = {n}\n")).unwrap_or_default(),
        options = file.node_options.iter().map(|(k, v)| format!("{k} = {v}\n")).collect::<String>(),
        cluster = if peers.len() > 1 || join.is_some() {
            let join = join.map(|j| format!("join = \"{j}\"\n")).unwrap_or_default();
            let hb = file.raft_heartbeat_ms.map(|h| format!("raft_heartbeat_ms = {h}\n")).unwrap_or_default();
            // Inter-node mutual TLS: the cluster's own CA (made once, beside the front-door CA) and
            // this node's certificate, naming it; none when the nodes were asked to talk in plaintext
            // (`--node-option cluster_plaintext=true`, for measuring what the TLS costs), which a node
            // refuses together with certificates.
            let tls = if plaintext_asked(&file.node_options) {
                String::new()
            } else {
                let tls_dir = dir.join("shared").join("tls");
                let (ca, ca_key) = crate::tls::cluster::ensure_cluster_ca(&tls_dir)?;
                let t = crate::tls::cluster::issue_node_cert(&ca, &ca_key, id, &node_dir)?;
                format!("cluster_ca = {:?}\ncluster_cert = {:?}\ncluster_key = {:?}\n", t.ca, t.cert, t.key)
            };
            format!(
                "cluster_listen = \"{}\"\ncluster_secret = \"{}\"\npeers = \"{peers_text}\"\n{join}{hb}{tls}",
                entry.cluster, file.secret
            )
        } else {
            String::new()
        },
    );
    write_atomically(&entry.config, toml.as_bytes()).map_err(io(format!("writing {}", entry.config.display())))?;
    Ok(entry)
}

/// Starts a node in its own process group (it outlives this command), logs in its directory.
fn spawn_node(bin: &Path, n: &mut NodeEntry) -> Result<(), LauncherError> {
    let out = std::fs::File::create(n.log.with_extension("stdout")).map_err(io("creating the node's stdout file"))?;
    let err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&n.log)
        .map_err(io(format!("opening {}", n.log.display())))?;
    let mut cmd = Command::new(bin);
    cmd.arg("serve").arg("--config").arg(&n.config).stdin(Stdio::null()).stdout(out).stderr(err);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TWINHUB_") {
            cmd.env_remove(&k);
        }
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let child = cmd.spawn().map_err(io(format!("starting {}", bin.display())))?;
    n.pid = child.id();
    n.connection_string.clear();
    eprintln!("node {}: pid {} http {} mqtt {} cluster {}", n.id, n.pid, n.http, n.mqtt, n.cluster);
    Ok(())
}

/// Waits until every node printed its connection string and answers `/ready` with 200.
fn wait_ready(
    tls: &std::sync::Arc<rustls::ClientConfig>,
    nodes: &mut [NodeEntry],
    timeout: Duration,
) -> Result<(), LauncherError> {
    let deadline = Instant::now() + timeout;
    let started = Instant::now();
    let mut last_report = Instant::now();
    loop {
        let mut ready = 0;
        for n in nodes.iter_mut() {
            if n.connection_string.is_empty() {
                let out = std::fs::read_to_string(n.log.with_extension("stdout")).unwrap_or_default();
                if let Some(line) = out.lines().find(|l| l.starts_with("HostName=")) {
                    n.connection_string = line.trim().to_string();
                }
            }
            if !n.connection_string.is_empty() && node_ready(tls, n) {
                ready += 1;
            } else if !pid_alive(n.pid) {
                return Err(LauncherError::Exited { id: n.id, log: n.log.display().to_string() });
            }
        }
        if ready == nodes.len() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(LauncherError::Timeout(timeout.as_secs()));
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            eprintln!("waiting for the cluster: {ready}/{} nodes ready after {:.0?}", nodes.len(), started.elapsed());
            last_report = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Calls `method path` on the first live node (owner policy); the answer body as JSON.
fn call_any(
    file: &ClusterFile,
    skip: Option<u64>,
    method: hyper::Method,
    path: &str,
    body: Vec<u8>,
) -> Result<serde_json::Value, LauncherError> {
    let tls = super::https::client_config(&file.ca)?;
    let rt = runtime()?;
    let mut last = String::from("no live node");
    for n in file.nodes.iter().filter(|n| Some(n.id) != skip && pid_alive(n.pid)) {
        let host = format!("{}:{}", file.hostname, n.http.port());
        let token = owner_token(&host, &file.owner_key);
        let r = rt.block_on(super::https::request(
            tls.clone(),
            n.http,
            &file.hostname,
            method.clone(),
            path,
            Some(&token),
            body.clone(),
            Duration::from_secs(300),
        ));
        match r {
            Ok((200, b)) => return Ok(serde_json::from_slice(&b).unwrap_or_default()),
            Ok((code, b)) => last = format!("node {} answered {code}: {}", n.id, String::from_utf8_lossy(&b)),
            Err(e) => last = e.to_string(),
        }
    }
    Err(LauncherError::Usage(format!("{method} {path} failed: {last}")))
}

/// Starts a new node (a never-used id) that joins through a live member, and waits until replicas and
/// leaderships have rebalanced onto it.
fn add(dir: &Path, timeout: u64) -> Result<(), LauncherError> {
    let mut file = read_cluster_file(dir)?;
    let id = file.nodes.iter().map(|n| n.id).chain(file.removed.iter().copied()).max().unwrap_or(0) + 1;
    let ports = free_ports(5)?;
    // The new node knows only itself and joins through a member (as on real machines, `--join`).
    let peers: BTreeMap<u64, SocketAddr> = BTreeMap::from([(id, loopback(ports[4]))]);
    let via = file
        .nodes
        .iter()
        .find(|n| pid_alive(n.pid))
        .map(|n| n.cluster)
        .ok_or_else(|| LauncherError::Usage("the cluster has no node to join through".into()))?;
    let policies_json =
        std::fs::read(dir.join("shared").join("policies.json")).map_err(io("reading the shared policies"))?;
    let mut entry = prepare_node(dir, &file, id, &ports, &peers, Some(via), &policies_json)?;
    spawn_node(&file.bin, &mut entry)?;
    file.nodes.push(entry.clone());
    save(dir, &file)?;
    let started = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(timeout);
    wait_until(&file, deadline, &format!("the cluster map lists node {id}"), |views| {
        if !pid_alive(entry.pid) {
            return true;
        }
        views
            .iter()
            .any(|(n, v)| *n != id && v.as_ref().is_some_and(|v| v["map"]["members"].get(id.to_string()).is_some()))
    })?;
    if !pid_alive(entry.pid) {
        return Err(LauncherError::Exited { id, log: entry.log.display().to_string() });
    }
    eprintln!("node {id} joined the cluster map through {via}; replicas move onto it");
    let tls = super::https::client_config(&file.ca)?;
    let remaining = deadline.saturating_duration_since(Instant::now());
    if let Some(n) = file.nodes.iter_mut().find(|n| n.id == id) {
        wait_ready(&tls, std::slice::from_mut(n), remaining)?;
    }
    wait_until(&file, deadline, "every shard's replicas match the map", |views| converged(&file, views))?;
    eprintln!("replicas and leaderships rebalanced in {:.1?}", started.elapsed());
    if let Some(n) = file.nodes.iter().find(|n| n.id == id) {
        println!("node {}: {}", n.id, n.connection_string);
    }
    save(dir, &file)
}

fn certs(a: &CertsArgs) -> Result<(), LauncherError> {
    if a.nodes.contains(&0) {
        return Err(LauncherError::Usage("node ids start at 1".into()));
    }
    crate::secrets::create_private_dir(&a.dir).map_err(io(format!("creating {}", a.dir.display())))?;
    let (ca, ca_key) = crate::tls::cluster::ensure_cluster_ca(&a.dir)?;
    println!("cluster CA: {} (its key {} stays with whoever issues certificates)", ca.display(), ca_key.display());
    for id in &a.nodes {
        let f = crate::tls::cluster::issue_node_cert(&ca, &ca_key, *id, &a.dir.join(format!("node-{id}")))?;
        println!(
            "node {id}: --cluster-ca {} --cluster-cert {} --cluster-key {}",
            f.ca.display(),
            f.cert.display(),
            f.key.display()
        );
    }
    Ok(())
}

/// Every node's `/cluster/status` (`None` for a node that did not answer).
fn views(file: &ClusterFile) -> Result<Vec<(u64, Option<serde_json::Value>)>, LauncherError> {
    let tls = super::https::client_config(&file.ca)?;
    let rt = runtime()?;
    Ok(file
        .nodes
        .iter()
        .map(|n| {
            let host = format!("{}:{}", file.hostname, n.http.port());
            let token = owner_token(&host, &file.owner_key);
            let r = rt.block_on(super::https::get(
                tls.clone(),
                n.http,
                &file.hostname,
                "/cluster/status",
                Some(&token),
                Duration::from_secs(3),
            ));
            let v = match r {
                Ok((200, body)) => serde_json::from_slice(&body).ok(),
                _ => None,
            };
            (n.id, v)
        })
        .collect())
}

/// The view of `shard` from the node that leads it (highest term if several claim to).
fn leader_view(views: &[(u64, Option<serde_json::Value>)], shard: u32) -> Option<serde_json::Value> {
    views
        .iter()
        .filter_map(|(_, v)| v.as_ref())
        .filter_map(|v| {
            v["shards"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["shard"] == shard && x["is_leader"] == true))
                .cloned()
        })
        .max_by_key(|x| x["term"].as_u64().unwrap_or(0))
}

/// Every shard's leader has exactly the map's target replicas as voters and no learners.
fn converged(file: &ClusterFile, views: &[(u64, Option<serde_json::Value>)]) -> bool {
    let Some(map) = views.iter().filter_map(|(_, v)| v.as_ref()).map(|v| v["map"].clone()).next() else { return false };
    (0..file.shard_count).all(|s| {
        let want = &map["placement"]["shards"][s as usize]["replicas"];
        leader_view(views, s)
            .is_some_and(|v| v["voters"] == *want && v["learners"].as_array().is_none_or(Vec::is_empty))
    })
}

/// Polls every node's status until `done` holds, printing progress.
fn wait_until(
    file: &ClusterFile,
    deadline: Instant,
    what: &str,
    done: impl Fn(&[(u64, Option<serde_json::Value>)]) -> bool,
) -> Result<(), LauncherError> {
    let mut last_note = Instant::now();
    loop {
        let v = views(file)?;
        if done(&v) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(LauncherError::Usage(format!("timed out waiting until {what}")));
        }
        if last_note.elapsed() > Duration::from_secs(5) {
            eprintln!("waiting until {what} ...");
            last_note = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Removes a node from every shard, stops it, and sets its data aside so it can never rejoin.
fn remove(dir: &Path, node: u64) -> Result<(), LauncherError> {
    let mut file = read_cluster_file(dir)?;
    let Some(pos) = file.nodes.iter().position(|n| n.id == node) else {
        return Err(LauncherError::Usage(format!("node {node} is not in {}", dir.join("cluster.json").display())));
    };
    call_any(&file, Some(node), hyper::Method::DELETE, &format!("/cluster/members/{node}"), Vec::new())?;
    eprintln!("node {node} is draining: its replicas move to the other nodes");
    let started = Instant::now();
    let deadline = started + Duration::from_secs(600);
    // Drained when the map has forgotten it (the metadata leader does so once no shard holds it).
    wait_until(&file, deadline, &format!("node {node} holds no replica"), |views| {
        let maps: Vec<&serde_json::Value> =
            views.iter().filter(|(id, _)| *id != node).filter_map(|(_, v)| v.as_ref()).collect();
        !maps.is_empty() && maps.iter().all(|v| v["map"]["members"].get(node.to_string()).is_none())
    })?;
    eprintln!("node {node} drained in {:.1?}", started.elapsed());
    let n = file.nodes.remove(pos);
    if pid_alive(n.pid) {
        signal(n.pid, "TERM");
        let deadline = Instant::now() + Duration::from_secs(30);
        while pid_alive(n.pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if pid_alive(n.pid) {
            signal(n.pid, "KILL");
        }
    }
    let aside = n.data_dir.with_file_name(format!("data.removed-{}", crate::model::now_ms()));
    std::fs::rename(&n.data_dir, &aside).map_err(io(format!("setting {} aside", n.data_dir.display())))?;
    file.removed.push(node);
    save(dir, &file)?;
    eprintln!("node {node} stopped; its data is in {}", aside.display());
    Ok(())
}

fn down(dir: &Path) -> Result<(), LauncherError> {
    let file = read_cluster_file(dir)?;
    let alive: Vec<&NodeEntry> = file.nodes.iter().filter(|n| n.pid != 0 && pid_alive(n.pid)).collect();
    for n in &alive {
        signal(n.pid, "TERM");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while alive.iter().any(|n| pid_alive(n.pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    for n in alive.iter().filter(|n| pid_alive(n.pid)) {
        eprintln!("node {} (pid {}) did not stop within 30 s: SIGKILL", n.id, n.pid);
        signal(n.pid, "KILL");
    }
    eprintln!("stopped {} node(s)", alive.len());
    Ok(())
}

fn runtime() -> Result<tokio::runtime::Runtime, LauncherError> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(io("starting a runtime"))
}

/// `GET /ready` answers 200: every shard of the node has a leader.
fn node_ready(tls: &std::sync::Arc<rustls::ClientConfig>, n: &NodeEntry) -> bool {
    let Ok(rt) = runtime() else { return false };
    let r = rt.block_on(super::https::get(tls.clone(), n.http, "localhost", "/ready", None, Duration::from_secs(2)));
    matches!(r, Ok((200, _)))
}

/// A service token for the owner policy, as `azure-iot-hub` builds it.
fn owner_token(host: &str, key: &str) -> String {
    let sr: String = url_encode(host);
    let se = crate::model::now_ms() / 1000 + 300;
    let sig = crate::auth::sign(key, &sr, se).unwrap_or_default();
    let sig = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, sig);
    format!("SharedAccessSignature sr={sr}&sig={}&se={se}&skn={}", url_encode(&sig), crate::auth::OWNER)
}

fn url_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn status(a: &StatusArgs) -> Result<(), LauncherError> {
    let (nodes, all, shard_count) = match &a.target.dir {
        Some(dir) => local_views(dir)?,
        None => remote_views(a)?,
    };
    print_status(nodes, &all, shard_count, a.json);
    Ok(())
}

type Views = Vec<(u64, Option<serde_json::Value>)>;

/// Every node of a local cluster, from its cluster file.
fn local_views(dir: &Path) -> Result<(Vec<serde_json::Value>, Views, u32), LauncherError> {
    let file = read_cluster_file(dir)?;
    let all = views(&file)?;
    let mut nodes = Vec::new();
    for (n, (_, view)) in file.nodes.iter().zip(&all) {
        let ready = view.as_ref().is_some_and(|v| v["ready"].as_bool().unwrap_or(false));
        if view.is_none() {
            eprintln!("node {}: /cluster/status did not answer", n.id);
        }
        nodes.push(serde_json::json!({"id": n.id, "pid": n.pid, "alive": pid_alive(n.pid), "reachable": view.is_some(), "ready": ready, "http": n.http, "mqtt": n.mqtt}));
    }
    Ok((nodes, all, file.shard_count))
}

/// The node of the connection string and every `--node-address`, with the same credential.
fn remote_views(a: &StatusArgs) -> Result<(Vec<serde_json::Value>, Views, u32), LauncherError> {
    use std::net::ToSocketAddrs;
    let first = super::remote::Remote::resolve(&a.target)?;
    let mut targets = vec![(first.hub.clone(), first.addr)];
    for n in &a.node_addresses {
        let addr = n
            .to_socket_addrs()
            .ok()
            .and_then(|mut i| i.next())
            .ok_or_else(|| LauncherError::Usage(format!("--node-address {n}: not a reachable host:port")))?;
        targets.push((n.clone(), addr));
    }
    let rt = runtime()?;
    let mut nodes = Vec::new();
    let mut all = Vec::new();
    for (shown, addr) in targets {
        let host = shown.rsplit_once(':').map_or(shown.as_str(), |(h, _)| h);
        let node = first.at(host, addr);
        let r = rt.block_on(node.call(hyper::Method::GET, "/cluster/status", &[], Vec::new(), Duration::from_secs(5)));
        let view = match r {
            Ok((_, v)) => Some(v),
            Err(e) => {
                eprintln!("{shown}: {e}");
                None
            }
        };
        let id = view.as_ref().and_then(|v| v["node_id"].as_u64()).unwrap_or(0);
        let ready = view.as_ref().is_some_and(|v| v["ready"].as_bool().unwrap_or(false));
        nodes.push(serde_json::json!({"id": id, "pid": null, "alive": null, "reachable": view.is_some(), "ready": ready, "http": shown, "mqtt": null}));
        all.push((id, view));
    }
    let shard_count = all
        .iter()
        .filter_map(|(_, v)| v.as_ref())
        .map(|v| {
            v["map"]["shard_count"].as_u64().unwrap_or(0).max(v["shards"].as_array().map_or(0, |s| s.len() as u64))
        })
        .max()
        .unwrap_or(0) as u32;
    Ok((nodes, all, shard_count))
}

fn print_status(nodes: Vec<serde_json::Value>, all: &Views, shard_count: u32, json: bool) {
    let map = all.iter().filter_map(|(_, v)| v.as_ref()).map(|v| v["map"].clone()).next().unwrap_or_default();
    let meta = all
        .iter()
        .filter_map(|(_, v)| v.as_ref())
        .map(|v| v["meta"].clone())
        .find(|m| m["is_leader"] == true)
        .unwrap_or_default();
    // A shard's truth comes from the replica that leads it (its lag map is only known there); any
    // replica's view stands in when no leader answered.
    let mut shards = Vec::new();
    for s in 0..shard_count {
        let leader_view = leader_view(all, s);
        let any = all
            .iter()
            .filter_map(|(_, v)| v.as_ref())
            .filter_map(|v| v["shards"].as_array().and_then(|a| a.iter().find(|x| x["shard"] == s)).cloned())
            .next();
        let Some(v) = leader_view.clone().or(any) else { continue };
        let target = map["placement"]["shards"][s as usize]["replicas"].clone();
        shards.push(serde_json::json!({
            "shard": s,
            "leader": v["leader"],
            "term": v["term"],
            "replicas": v["voters"],
            "learners": v["learners"],
            "target": target,
            "settled": v["voters"] == target && v["learners"].as_array().is_none_or(Vec::is_empty),
            "commit_index": v["committed"],
            "lag": if leader_view.is_some() { v["lag"].clone() } else { serde_json::Value::Null },
        }));
    }
    let members = map["members"].clone();
    let meta_summary = serde_json::json!({"leader": meta["leader"], "term": meta["term"], "voters": meta["voters"], "learners": meta["learners"]});
    let report = serde_json::json!({"nodes": nodes, "members": members, "meta": meta_summary, "shards": shards});
    // Written with writeln! and errors ignored: piping into `head` must not panic.
    let mut out = std::io::stdout().lock();
    if json {
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&report).unwrap_or_default());
        return;
    }
    let t = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "-".to_string(),
        other => other.to_string(),
    };
    let _ = writeln!(out, "{:<6} {:<8} {:<7} {:<10} {:<6} http", "node", "pid", "alive", "reachable", "ready");
    for n in &nodes {
        let _ = writeln!(
            out,
            "{:<6} {:<8} {:<7} {:<10} {:<6} {}",
            t(&n["id"]),
            t(&n["pid"]),
            t(&n["alive"]),
            t(&n["reachable"]),
            t(&n["ready"]),
            t(&n["http"])
        );
    }
    // A single node has no metadata group.
    if !meta_summary["voters"].is_null() {
        let _ = writeln!(
            out,
            "\nmetadata group: leader {}, term {}, voters {}, learners {}",
            t(&meta_summary["leader"]),
            t(&meta_summary["term"]),
            t(&meta_summary["voters"]),
            t(&meta_summary["learners"])
        );
    }
    let _ = writeln!(
        out,
        "\n{:<6} {:<7} {:<6} {:<12} {:<12} {:<8} {:<10} lag",
        "shard", "leader", "term", "replicas", "target", "settled", "commit"
    );
    for s in &shards {
        let _ = writeln!(
            out,
            "{:<6} {:<7} {:<6} {:<12} {:<12} {:<8} {:<10} {}",
            t(&s["shard"]),
            t(&s["leader"]),
            t(&s["term"]),
            t(&s["replicas"]),
            t(&s["target"]),
            t(&s["settled"]),
            t(&s["commit_index"]),
            t(&s["lag"])
        );
    }
}

#[cfg(test)]
mod node_option_tests {
    use super::{parse_node_option, plaintext_asked};

    #[test]
    fn plaintext_between_nodes_is_asked_by_its_node_option_only() {
        let opt = |v: &str| vec![parse_node_option(&format!("cluster_plaintext={v}")).unwrap()];
        assert!(plaintext_asked(&opt("true")));
        assert!(!plaintext_asked(&opt("false")));
        assert!(!plaintext_asked(&[]));
    }

    #[test]
    fn node_options_are_one_toml_value_under_a_key_cluster_does_not_write() {
        assert_eq!(
            parse_node_option("max_connections_mqtt=17000"),
            Ok(("max_connections_mqtt".into(), "17000".into()))
        );
        assert_eq!(parse_node_option(" hostname_x = \"a\" "), Ok(("hostname_x".into(), "\"a\"".into())));
        for bad in ["no_equals", "=1", "Bad=1", "a b=1", "node_id=4", "peers=\"x\"", "x=1\ny=2", "x=not toml", "x=1 2"]
        {
            assert!(parse_node_option(bad).is_err(), "{bad:?} accepted");
        }
    }
}
