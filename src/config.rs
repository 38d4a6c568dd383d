//! The node's configuration from flags, `TWINHUB_<OPTION>` variables and a TOML file, in that order of
//! precedence, then built-in defaults. Resolution takes the environment as a function so that tests do
//! not race on the process environment.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Deserialize;

/// `twinhub serve` options. Each also reads `TWINHUB_<OPTION>` and the `--config` TOML file
/// (keys like `http_listen`).
#[derive(Args, Debug, Clone, Default, PartialEq)]
pub struct ServeArgs {
    /// Data directory (Raft log, state, policies, development certificates) [default: ./twinhub-data]
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// HTTPS service API address [default: 0.0.0.0:8443]
    #[arg(long)]
    pub http_listen: Option<String>,
    /// MQTT over TLS address for devices [default: 0.0.0.0:8883]
    #[arg(long)]
    pub mqtt_listen: Option<String>,
    /// MQTT over plain TCP for development; off unless given [default: off]
    #[arg(long)]
    pub mqtt_plain_listen: Option<String>,
    /// Back-end event broker (MQTT over TLS, policy SAS auth; `twin-changes/...` topics) [default: 0.0.0.0:8884]
    #[arg(long)]
    pub events_listen: Option<String>,
    /// Host name clients dial; used in connection strings, SAS resources and the certificate [default: localhost]
    #[arg(long)]
    pub hostname: Option<String>,
    /// Base64 primary key of the iothubowner policy [default: generated and kept in the data directory]
    #[arg(long)]
    pub owner_key: Option<String>,
    /// Number of shards, each a Raft group, fixed once data exists [default: the count the data directory
    /// was created with; a node that joins takes the cluster's; a new cluster 1]
    #[arg(long)]
    pub shard_count: Option<u32>,
    /// PEM server certificate chain [default: generated development certificate]
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    /// Snapshot each shard after this many applied entries [default: 10000]
    #[arg(long)]
    pub snapshot_every: Option<u64>,
    /// This node's id in the cluster; never reused for another node [default: 1]
    #[arg(long)]
    pub node_id: Option<u64>,
    /// Inter-node (Raft and forwarding) address; unset: a single-node hub [default: off]
    #[arg(long)]
    pub cluster_listen: Option<String>,
    /// Address other nodes dial for --cluster-listen [default: the --cluster-listen address]
    #[arg(long)]
    pub cluster_advertise: Option<String>,
    /// Secret every node of the cluster shares; signs inter-node traffic (required with --cluster-listen)
    #[arg(long)]
    pub cluster_secret: Option<String>,
    /// Initial members as `ID=ADDR,ID=ADDR,…` (every founding node gets the same list; the lowest id
    /// forms the groups)
    #[arg(long)]
    pub peers: Option<String>,
    /// Join a running cluster through any member's inter-node address (HOST:PORT) instead of founding
    /// one; this node's --node-id must never have been used in that cluster
    #[arg(long)]
    pub join: Option<String>,
    /// Raft heartbeat interval in milliseconds; elections time out after 3 to 6 heartbeats. Lower fails
    /// over faster and costs more idle CPU per shard [default: 100]
    #[arg(long)]
    pub raft_heartbeat_ms: Option<u64>,
    /// Answer twin reads from this node's replica without asking the leader (may lag the latest
    /// writes by the replication delay; linearizable reads are the default)
    #[arg(long)]
    pub follower_reads: bool,
    /// Threads running the node's tasks [default: one per CPU core]. Several nodes sharing a machine
    /// can split its cores between them
    #[arg(long)]
    pub worker_threads: Option<usize>,
    /// Calls per peer that carry Raft AppendEntries at once; what the shard groups queue meanwhile
    /// shares the next call. 0: every AppendEntries is a call of its own [default: 2]
    #[arg(long)]
    pub raft_append_calls_per_peer: Option<usize>,
    /// Entries of one shard proposed to Raft and not yet applied at once; writes of the shard that
    /// arrive while all are out wait and share the next entry (one log entry, one apply call and one
    /// answer for many). A write that finds a free place is proposed at once. 0: every write is an
    /// entry of its own, proposed at once [default: 1]
    #[arg(long)]
    pub proposals_in_flight: Option<usize>,
    /// Milliseconds the event broker's feed waits after handing rumqttd a batch of change events, so
    /// that under load the next batch carries several (one wake-up of the broker's threads and one
    /// TLS write per subscriber for all of them). Delays event delivery by at most this much, never
    /// an acknowledgement. 0: every event leaves as soon as it is published [default: 10]
    #[arg(long)]
    pub events_batch_ms: Option<u64>,
    /// CPU scheduling class of the node's threads: `normal` (the system's default, with wake-up
    /// preemption) or `batch` (Linux `SCHED_BATCH`: a woken thread does not preempt the running one
    /// mid-task; less CPU per update when saturated, a longer tail below saturation) [default: normal]
    #[arg(long)]
    pub cpu_scheduling: Option<String>,
    /// File holding the iothubowner primary key (instead of --owner-key, which other local users can
    /// read in the process list)
    #[arg(long)]
    pub owner_key_file: Option<PathBuf>,
    /// File holding the cluster secret (instead of --cluster-secret, visible in the process list)
    #[arg(long)]
    pub cluster_secret_file: Option<PathBuf>,
    /// PEM CA certificate(s) the nodes' cluster certificates chain to (inter-node mutual TLS)
    #[arg(long)]
    pub cluster_ca: Option<PathBuf>,
    /// PEM certificate of this node for inter-node TLS; must name `node-<id>.cluster.twinhub`
    #[arg(long)]
    pub cluster_cert: Option<PathBuf>,
    /// PEM private key for --cluster-cert
    #[arg(long)]
    pub cluster_key: Option<PathBuf>,
    /// Inter-node traffic in clear text (still signed): for development on one machine only; never
    /// with --cluster-ca
    #[arg(long)]
    pub cluster_plaintext: bool,
    /// Connections the HTTPS listener holds at once [default: a share of RLIMIT_NOFILE, at most 4096]
    #[arg(long)]
    pub max_connections_https: Option<usize>,
    /// Connections the device MQTT listeners (TLS and plain together) hold at once [default: what
    /// RLIMIT_NOFILE leaves after the other listeners and a reserve]
    #[arg(long)]
    pub max_connections_mqtt: Option<usize>,
    /// Connections the event broker holds at once [default: a share of RLIMIT_NOFILE, at most 1024]
    #[arg(long)]
    pub max_connections_events: Option<usize>,
    /// Connections the inter-node listener holds at once [default: a share of RLIMIT_NOFILE, at most 256]
    #[arg(long)]
    pub max_connections_cluster: Option<usize>,
    /// Connections one source address (IPv6: one /64) may hold on the HTTPS, event-broker and
    /// inter-node listeners; device MQTT has no such bound (fleets share NAT addresses) [default: 256]
    #[arg(long)]
    pub max_connections_per_source: Option<usize>,
    /// Connections not yet authenticated that each listener holds at once [default: 1024]
    #[arg(long)]
    pub max_unauthenticated: Option<usize>,
    /// Connections not yet authenticated from one source address, per listener [default: 64]
    #[arg(long)]
    pub max_unauthenticated_per_source: Option<usize>,
    /// Change-feed streams (`GET /twin-changes`) clients hold on this node at once; each has a queue of
    /// its own [default: 256]
    #[arg(long)]
    pub max_change_feeds: Option<usize>,
    /// Distinct subscription filters the event broker admits over the node's life: it keeps a log of
    /// recent events for each, for good [default: 64]
    #[arg(long)]
    pub max_event_filters: Option<usize>,
    /// Seconds a new connection has for its TLS handshake, and again for its first request head or
    /// MQTT CONNECT [default: 10]
    #[arg(long)]
    pub handshake_timeout_secs: Option<u64>,
    /// Seconds an HTTPS connection may stay idle between requests [default: 120]
    #[arg(long)]
    pub idle_timeout_secs: Option<u64>,
    /// Largest MQTT keep-alive in seconds: larger values, and keep-alive 0, are lowered to it, and a
    /// device or event-broker connection silent for 1.5 times its keep-alive is closed [default: 1740]
    #[arg(long)]
    pub mqtt_max_keep_alive_secs: Option<u64>,
    /// How often automatic device configurations are re-evaluated against the fleet (twins that start
    /// or stop matching); a created or changed configuration is evaluated at once [default: 30]
    #[arg(long)]
    pub configuration_interval_secs: Option<u64>,
    /// TOML file with any of the options above (keys with underscores)
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// The TOML file: every key optional; unknown keys are refused so typos are not silently ignored.
#[derive(Deserialize, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub data_dir: Option<PathBuf>,
    pub http_listen: Option<String>,
    pub mqtt_listen: Option<String>,
    pub mqtt_plain_listen: Option<String>,
    pub events_listen: Option<String>,
    pub hostname: Option<String>,
    pub owner_key: Option<String>,
    pub shard_count: Option<u32>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub snapshot_every: Option<u64>,
    pub node_id: Option<u64>,
    pub cluster_listen: Option<String>,
    pub cluster_advertise: Option<String>,
    pub cluster_secret: Option<String>,
    pub peers: Option<String>,
    pub join: Option<String>,
    pub raft_heartbeat_ms: Option<u64>,
    pub follower_reads: Option<bool>,
    pub worker_threads: Option<usize>,
    pub raft_append_calls_per_peer: Option<usize>,
    pub proposals_in_flight: Option<usize>,
    pub events_batch_ms: Option<u64>,
    pub cpu_scheduling: Option<String>,
    pub owner_key_file: Option<PathBuf>,
    pub cluster_secret_file: Option<PathBuf>,
    pub cluster_ca: Option<PathBuf>,
    pub cluster_cert: Option<PathBuf>,
    pub cluster_key: Option<PathBuf>,
    pub cluster_plaintext: Option<bool>,
    pub max_connections_https: Option<usize>,
    pub max_connections_mqtt: Option<usize>,
    pub max_connections_events: Option<usize>,
    pub max_connections_cluster: Option<usize>,
    pub max_connections_per_source: Option<usize>,
    pub max_unauthenticated: Option<usize>,
    pub max_unauthenticated_per_source: Option<usize>,
    pub max_change_feeds: Option<usize>,
    pub max_event_filters: Option<usize>,
    pub handshake_timeout_secs: Option<u64>,
    pub idle_timeout_secs: Option<u64>,
    pub mqtt_max_keep_alive_secs: Option<u64>,
    pub configuration_interval_secs: Option<u64>,
}

/// How this node takes part in a cluster (`None` in [`Config::cluster`]: a single-node hub).
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    pub listen: SocketAddr,
    /// What peers dial to reach `listen`.
    pub advertise: String,
    pub secret: String,
    /// Founding members (id → inter-node address), this node included.
    pub peers: std::collections::BTreeMap<u64, String>,
    /// A member's inter-node address to join through (a node added to a running cluster).
    pub join: Option<String>,
    /// Mutual TLS material; `None` only with the explicit plaintext flag.
    pub tls: Option<crate::tls::cluster::ClusterTlsFiles>,
}

/// The largest shard count a cluster can be created with.
pub const MAX_SHARD_COUNT: u32 = 4096;

/// `--events-batch-ms` unless set. Under load the broker's threads then wake once for the events of
/// 10 ms rather than every one or two (at 1 ms the compare's watch cost node 1 a quarter more CPU); a lone
/// event still leaves at once, since the wait follows a batch. Measured both ways in benches/README.md.
pub const DEFAULT_EVENTS_BATCH_MS: u64 = 10;

/// `--proposals-in-flight` unless set: how many entries of one shard may be proposed and not yet
/// applied before the shard's next writes wait to share an entry. One: under load each entry then
/// carries about 1.8 times the writes it did with two out at once (29 against 16 in the closed-loop
/// compare), so a shard pays Raft's per-round work (appends to each follower, an fsync on each
/// replica, wake-ups) about a third less often, for about 4 % less CPU per update and as much or more
/// throughput; a lone write is still proposed at once. Measured both ways in benches/README.md.
pub const DEFAULT_PROPOSALS_IN_FLIGHT: usize = 1;

/// The resolved configuration of a node.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub data_dir: PathBuf,
    pub http_listen: SocketAddr,
    pub mqtt_listen: SocketAddr,
    /// Plain-TCP MQTT for development (`None`: not bound).
    pub mqtt_plain_listen: Option<SocketAddr>,
    pub events_listen: SocketAddr,
    pub hostname: String,
    pub owner_key: Option<String>,
    /// The shard count the operator gave. `None`: the count the data directory was created with, or
    /// for a node that joins the cluster's, or [`crate::ids::DEFAULT_SHARD_COUNT`] for a new cluster
    /// (decided when the node starts, see `node.rs`).
    pub shard_count: Option<u32>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub snapshot_every: u64,
    pub node_id: u64,
    pub cluster: Option<ClusterConfig>,
    pub raft_heartbeat_ms: u64,
    pub follower_reads: bool,
    /// Threads of the node's runtime; `None`: one per CPU core.
    pub worker_threads: Option<usize>,
    /// Calls per peer carrying AppendEntries at once (0: one call per AppendEntries, no sharing).
    pub raft_append_calls_per_peer: usize,
    /// Entries of one shard proposed and not yet applied at once (0: no batching of writes).
    pub proposals_in_flight: usize,
    /// How long the event broker's feed lets change events gather after each batch it hands on.
    pub events_batch: std::time::Duration,
    /// Change-feed streams clients may hold at once.
    pub max_change_feeds: usize,
    /// Distinct subscription filters the event broker admits.
    pub max_event_filters: usize,
    /// Scheduling class of the node's threads (set before the runtime starts).
    pub cpu_scheduling: crate::sched::CpuScheduling,
    /// Connection bounds and timeouts of every listener.
    pub net: crate::net::NetLimits,
    /// The largest keep-alive a device MQTT connection gets (also the one keep-alive 0 gets).
    pub mqtt_max_keep_alive: u16,
    /// How often configurations are re-evaluated.
    pub configuration_interval: std::time::Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("config file {path}: {source}")]
    Toml { path: String, source: toml::de::Error },
    #[error("{option}: '{value}' is not a valid {expected}")]
    Invalid { option: &'static str, value: String, expected: &'static str },
    #[error("{option}: reading {path}: {source}")]
    SecretFile { option: &'static str, path: String, source: std::io::Error },
    #[error("{option} and {other} are both given; use one")]
    Conflict { option: &'static str, other: &'static str },
    #[error("inter-node traffic is TLS: give --cluster-ca, --cluster-cert and --cluster-key (`twinhub cluster up` makes them), or --cluster-plaintext for development on one machine")]
    ClusterTls,
}

impl Config {
    /// Flags > `TWINHUB_*` (via `env`) > TOML file (`--config` / `TWINHUB_CONFIG`) > defaults.
    pub fn resolve(args: ServeArgs, env: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let file_path = args.config.clone().or_else(|| env("TWINHUB_CONFIG").map(PathBuf::from));
        let file = match file_path {
            Some(p) => load_file(&p)?,
            None => FileConfig::default(),
        };
        let env = |name: &str| env(name).filter(|v| !v.is_empty());
        let parse_u = |option: &'static str, v: String| -> Result<u64, ConfigError> {
            v.trim().parse().map_err(|_| ConfigError::Invalid { option, value: v, expected: "number" })
        };
        // A number from the flag, else the environment variable, else the file.
        let number = |flag: Option<u64>, var: &'static str, f: Option<u64>| -> Result<Option<u64>, ConfigError> {
            match flag {
                Some(n) => Ok(Some(n)),
                None => Ok(env(var).map(|v| parse_u(var, v)).transpose()?.or(f)),
            }
        };
        let shard_count = match args.shard_count {
            Some(n) => Some(n),
            None => env("TWINHUB_SHARD_COUNT")
                .map(|v| parse_u("TWINHUB_SHARD_COUNT", v).map(|n| n as u32))
                .transpose()?
                .or(file.shard_count),
        };
        if let Some(n) = shard_count.filter(|n| !(1..=MAX_SHARD_COUNT).contains(n)) {
            return Err(ConfigError::Invalid {
                option: "shard-count",
                value: n.to_string(),
                expected: "shard count (1..=4096)",
            });
        }
        let snapshot_every =
            number(args.snapshot_every, "TWINHUB_SNAPSHOT_EVERY", file.snapshot_every)?.unwrap_or(10_000);
        let http = args
            .http_listen
            .or_else(|| env("TWINHUB_HTTP_LISTEN"))
            .or(file.http_listen)
            .unwrap_or_else(|| "0.0.0.0:8443".into());
        let mqtt = args
            .mqtt_listen
            .or_else(|| env("TWINHUB_MQTT_LISTEN"))
            .or(file.mqtt_listen)
            .unwrap_or_else(|| "0.0.0.0:8883".into());
        let mqtt_plain = args.mqtt_plain_listen.or_else(|| env("TWINHUB_MQTT_PLAIN_LISTEN")).or(file.mqtt_plain_listen);
        let events = args
            .events_listen
            .or_else(|| env("TWINHUB_EVENTS_LISTEN"))
            .or(file.events_listen)
            .unwrap_or_else(|| "0.0.0.0:8884".into());
        let path =
            |flag: Option<PathBuf>, var: &str, f: Option<PathBuf>| flag.or_else(|| env(var).map(PathBuf::from)).or(f);
        let hostname =
            args.hostname.or_else(|| env("TWINHUB_HOSTNAME")).or(file.hostname).unwrap_or_else(|| "localhost".into());
        if hostname.is_empty() || hostname.contains(['/', ';', ' ']) {
            return Err(ConfigError::Invalid { option: "hostname", value: hostname, expected: "host name" });
        }
        let node_id = match args.node_id {
            Some(n) => n,
            None => {
                env("TWINHUB_NODE_ID").map(|v| parse_u("TWINHUB_NODE_ID", v)).transpose()?.or(file.node_id).unwrap_or(1)
            }
        };
        if node_id == 0 {
            return Err(ConfigError::Invalid { option: "node-id", value: "0".into(), expected: "node id (≥ 1)" });
        }
        let cluster_listen = args.cluster_listen.or_else(|| env("TWINHUB_CLUSTER_LISTEN")).or(file.cluster_listen);
        let cluster = match cluster_listen {
            None => None,
            Some(listen) => {
                let listen = addr("cluster-listen", listen)?;
                let advertise = args
                    .cluster_advertise
                    .or_else(|| env("TWINHUB_CLUSTER_ADVERTISE"))
                    .or(file.cluster_advertise)
                    .unwrap_or_else(|| listen.to_string());
                let secret_file = path(
                    args.cluster_secret_file.clone(),
                    "TWINHUB_CLUSTER_SECRET_FILE",
                    file.cluster_secret_file.clone(),
                );
                let secret_inline = args
                    .cluster_secret
                    .clone()
                    .or_else(|| env("TWINHUB_CLUSTER_SECRET"))
                    .or(file.cluster_secret.clone());
                let secret = match (secret_inline, secret_file) {
                    (Some(_), Some(_)) => {
                        return Err(ConfigError::Conflict { option: "cluster-secret", other: "cluster-secret-file" })
                    }
                    (Some(s), None) => s,
                    (None, Some(p)) => read_secret("cluster-secret-file", &p)?,
                    (None, None) => String::new(),
                };
                if secret.len() < 16 {
                    return Err(ConfigError::Invalid {
                        option: "cluster-secret",
                        value: "(hidden)".into(),
                        expected: "secret of at least 16 characters (required with --cluster-listen)",
                    });
                }
                let peers_text = args.peers.or_else(|| env("TWINHUB_PEERS")).or(file.peers).unwrap_or_default();
                let mut peers = parse_peers(&peers_text)?;
                peers.entry(node_id).or_insert_with(|| advertise.clone());
                let join = args.join.or_else(|| env("TWINHUB_JOIN")).or(file.join);
                if let Some(j) = &join {
                    if !j.contains(':') {
                        return Err(ConfigError::Invalid {
                            option: "join",
                            value: j.clone(),
                            expected: "HOST:PORT of a member's --cluster-listen",
                        });
                    }
                }
                let plaintext = args.cluster_plaintext
                    || env("TWINHUB_CLUSTER_PLAINTEXT").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
                    || file.cluster_plaintext.unwrap_or(false);
                let ca = path(args.cluster_ca.clone(), "TWINHUB_CLUSTER_CA", file.cluster_ca.clone());
                let cert = path(args.cluster_cert.clone(), "TWINHUB_CLUSTER_CERT", file.cluster_cert.clone());
                let key = path(args.cluster_key.clone(), "TWINHUB_CLUSTER_KEY", file.cluster_key.clone());
                let tls = match (ca, cert, key, plaintext) {
                    (None, None, None, true) => None,
                    (Some(_), _, _, true) | (_, Some(_), _, true) | (_, _, Some(_), true) => {
                        return Err(ConfigError::Conflict {
                            option: "cluster-plaintext",
                            other: "cluster-ca/cluster-cert/cluster-key",
                        })
                    }
                    (Some(ca), Some(cert), Some(key), false) => {
                        Some(crate::tls::cluster::ClusterTlsFiles { ca, cert, key })
                    }
                    _ => return Err(ConfigError::ClusterTls),
                };
                Some(ClusterConfig { listen, advertise, secret, peers, join, tls })
            }
        };
        let raft_heartbeat_ms =
            number(args.raft_heartbeat_ms, "TWINHUB_RAFT_HEARTBEAT_MS", file.raft_heartbeat_ms)?.unwrap_or(100);
        if !(10..=10_000).contains(&raft_heartbeat_ms) {
            return Err(ConfigError::Invalid {
                option: "raft-heartbeat-ms",
                value: raft_heartbeat_ms.to_string(),
                expected: "interval in milliseconds (10..=10000)",
            });
        }
        let owner_key_inline = args.owner_key.clone().or_else(|| env("TWINHUB_OWNER_KEY")).or(file.owner_key.clone());
        let owner_key_file = path(args.owner_key_file.clone(), "TWINHUB_OWNER_KEY_FILE", file.owner_key_file.clone());
        let owner_key = match (owner_key_inline, owner_key_file) {
            (Some(_), Some(_)) => return Err(ConfigError::Conflict { option: "owner-key", other: "owner-key-file" }),
            (Some(k), None) => Some(k),
            (None, Some(p)) => Some(read_secret("owner-key-file", &p)?),
            (None, None) => None,
        };
        let count = |flag: Option<usize>, var: &'static str, f: Option<usize>| -> Result<Option<usize>, ConfigError> {
            Ok(number(flag.map(|n| n as u64), var, f.map(|n| n as u64))?.map(|n| n as usize))
        };
        let caps = crate::net::fds::CapOverrides {
            https: count(args.max_connections_https, "TWINHUB_MAX_CONNECTIONS_HTTPS", file.max_connections_https)?,
            mqtt: count(args.max_connections_mqtt, "TWINHUB_MAX_CONNECTIONS_MQTT", file.max_connections_mqtt)?,
            events: count(args.max_connections_events, "TWINHUB_MAX_CONNECTIONS_EVENTS", file.max_connections_events)?,
            cluster: count(
                args.max_connections_cluster,
                "TWINHUB_MAX_CONNECTIONS_CLUSTER",
                file.max_connections_cluster,
            )?,
        };
        let secs = |flag: Option<u64>,
                    var: &'static str,
                    f: Option<u64>,
                    default: u64|
         -> Result<std::time::Duration, ConfigError> {
            let n = match flag {
                Some(n) => n,
                None => env(var).map(|v| parse_u(var, v)).transpose()?.or(f).unwrap_or(default),
            };
            if n == 0 || n > 86_400 {
                return Err(ConfigError::Invalid {
                    option: var,
                    value: n.to_string(),
                    expected: "number of seconds (1..=86400)",
                });
            }
            Ok(std::time::Duration::from_secs(n))
        };
        let net = crate::net::NetLimits {
            caps,
            max_per_source: count(
                args.max_connections_per_source,
                "TWINHUB_MAX_CONNECTIONS_PER_SOURCE",
                file.max_connections_per_source,
            )?
            .unwrap_or(256),
            max_unauthenticated: count(
                args.max_unauthenticated,
                "TWINHUB_MAX_UNAUTHENTICATED",
                file.max_unauthenticated,
            )?
            .unwrap_or(1024)
            .max(1),
            max_unauthenticated_per_source: count(
                args.max_unauthenticated_per_source,
                "TWINHUB_MAX_UNAUTHENTICATED_PER_SOURCE",
                file.max_unauthenticated_per_source,
            )?
            .unwrap_or(64),
            handshake_timeout: secs(
                args.handshake_timeout_secs,
                "TWINHUB_HANDSHAKE_TIMEOUT_SECS",
                file.handshake_timeout_secs,
                10,
            )?,
            idle_timeout: secs(args.idle_timeout_secs, "TWINHUB_IDLE_TIMEOUT_SECS", file.idle_timeout_secs, 120)?,
        };
        let mqtt_max_keep_alive = secs(
            args.mqtt_max_keep_alive_secs,
            "TWINHUB_MQTT_MAX_KEEP_ALIVE_SECS",
            file.mqtt_max_keep_alive_secs,
            1740,
        )?;
        let mqtt_max_keep_alive = u16::try_from(mqtt_max_keep_alive.as_secs()).map_err(|_| ConfigError::Invalid {
            option: "mqtt-max-keep-alive-secs",
            value: mqtt_max_keep_alive.as_secs().to_string(),
            expected: "number of seconds (1..=65535)",
        })?;
        let configuration_interval = secs(
            args.configuration_interval_secs,
            "TWINHUB_CONFIGURATION_INTERVAL_SECS",
            file.configuration_interval_secs,
            30,
        )?;
        let follower_reads = args.follower_reads
            || env("TWINHUB_FOLLOWER_READS").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
            || file.follower_reads.unwrap_or(false);
        let worker_threads = count(args.worker_threads, "TWINHUB_WORKER_THREADS", file.worker_threads)?;
        if worker_threads == Some(0) {
            return Err(ConfigError::Invalid {
                option: "worker-threads",
                value: "0".into(),
                expected: "number of threads (at least 1)",
            });
        }
        let raft_append_calls_per_peer = count(
            args.raft_append_calls_per_peer,
            "TWINHUB_RAFT_APPEND_CALLS_PER_PEER",
            file.raft_append_calls_per_peer,
        )?
        .unwrap_or(2);
        let proposals_in_flight =
            count(args.proposals_in_flight, "TWINHUB_PROPOSALS_IN_FLIGHT", file.proposals_in_flight)?
                .unwrap_or(DEFAULT_PROPOSALS_IN_FLIGHT);
        let events_batch_ms = number(args.events_batch_ms, "TWINHUB_EVENTS_BATCH_MS", file.events_batch_ms)?
            .unwrap_or(DEFAULT_EVENTS_BATCH_MS);
        if events_batch_ms > 100 {
            return Err(ConfigError::Invalid {
                option: "events-batch-ms",
                value: events_batch_ms.to_string(),
                expected: "milliseconds (0..=100)",
            });
        }
        let cpu_scheduling = match args.cpu_scheduling.or_else(|| env("TWINHUB_CPU_SCHEDULING")).or(file.cpu_scheduling)
        {
            None => crate::sched::CpuScheduling::default(),
            Some(v) => v.parse().map_err(|()| ConfigError::Invalid {
                option: "cpu-scheduling",
                value: v,
                expected: "batch or normal",
            })?,
        };
        Ok(Config {
            node_id,
            cluster,
            raft_heartbeat_ms,
            follower_reads,
            worker_threads,
            raft_append_calls_per_peer,
            proposals_in_flight,
            events_batch: std::time::Duration::from_millis(events_batch_ms),
            max_change_feeds: count(args.max_change_feeds, "TWINHUB_MAX_CHANGE_FEEDS", file.max_change_feeds)?
                .unwrap_or(256),
            max_event_filters: count(args.max_event_filters, "TWINHUB_MAX_EVENT_FILTERS", file.max_event_filters)?
                .unwrap_or(64),
            cpu_scheduling,
            data_dir: path(args.data_dir, "TWINHUB_DATA_DIR", file.data_dir)
                .unwrap_or_else(|| PathBuf::from("./twinhub-data")),
            http_listen: addr("http-listen", http)?,
            mqtt_listen: addr("mqtt-listen", mqtt)?,
            mqtt_plain_listen: mqtt_plain.map(|v| addr("mqtt-plain-listen", v)).transpose()?,
            events_listen: addr("events-listen", events)?,
            hostname,
            owner_key,
            net,
            mqtt_max_keep_alive,
            configuration_interval,
            shard_count,
            tls_cert: path(args.tls_cert, "TWINHUB_TLS_CERT", file.tls_cert),
            tls_key: path(args.tls_key, "TWINHUB_TLS_KEY", file.tls_key),
            snapshot_every,
        })
    }
}

/// `ID=ADDR,ID=ADDR`: ids ≥ 1, no id twice.
pub fn parse_peers(text: &str) -> Result<std::collections::BTreeMap<u64, String>, ConfigError> {
    let mut peers = std::collections::BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = || ConfigError::Invalid { option: "peers", value: item.to_string(), expected: "ID=HOST:PORT list" };
        let (id, a) = item.split_once('=').ok_or_else(bad)?;
        let id: u64 = id.trim().parse().map_err(|_| bad())?;
        let a = a.trim();
        if id == 0 || a.is_empty() || !a.contains(':') || peers.insert(id, a.to_string()).is_some() {
            return Err(bad());
        }
    }
    Ok(peers)
}

/// A secret kept in a file: its content without surrounding whitespace. A file that other users can
/// read is used, with a warning (the secret is already exposed; refusing would not take it back).
fn read_secret(option: &'static str, path: &Path) -> Result<String, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::SecretFile {
        option,
        path: shown.clone(),
        source,
    })?;
    #[cfg(unix)]
    if let Ok(meta) = std::fs::metadata(path) {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(path = %shown, "{option}: the file is readable by other users; chmod 600 it");
        }
    }
    let secret = text.trim().to_string();
    if secret.is_empty() {
        return Err(ConfigError::Invalid { option, value: shown, expected: "file holding a non-empty secret" });
    }
    Ok(secret)
}

fn addr(option: &'static str, value: String) -> Result<SocketAddr, ConfigError> {
    value.trim().parse().map_err(|_| ConfigError::Invalid { option, value, expected: "ADDR:PORT socket address" })
}

fn load_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: shown.clone(), source })?;
    toml::from_str(&text).map_err(|source| ConfigError::Toml { path: shown, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn defaults() {
        let c = Config::resolve(ServeArgs::default(), env_of(&[])).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("./twinhub-data"));
        assert_eq!(c.http_listen, "0.0.0.0:8443".parse().unwrap());
        assert_eq!(c.mqtt_listen, "0.0.0.0:8883".parse().unwrap());
        assert_eq!(c.hostname, "localhost");
        assert_eq!(c.shard_count, None, "decided at start from the data directory or the cluster");
        assert_eq!(c.owner_key, None);
    }

    #[test]
    fn flag_over_env_over_file_over_default() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(&file, "http_listen = \"127.0.0.1:1001\"\nmqtt_listen = \"127.0.0.1:2001\"\nhostname = \"file-host\"\nshard_count = 3\ndata_dir = \"/file\"\n").unwrap();
        let env = env_of(&[
            ("TWINHUB_HTTP_LISTEN", "127.0.0.1:1002"),
            ("TWINHUB_HOSTNAME", "env-host"),
            ("TWINHUB_SHARD_COUNT", "5"),
        ]);
        let args =
            ServeArgs { config: Some(file.clone()), http_listen: Some("127.0.0.1:1003".into()), ..Default::default() };
        let c = Config::resolve(args, &env).unwrap();
        assert_eq!(c.http_listen, "127.0.0.1:1003".parse().unwrap(), "flag wins");
        assert_eq!(c.hostname, "env-host", "env beats file");
        assert_eq!(c.shard_count, Some(5));
        assert_eq!(c.mqtt_listen, "127.0.0.1:2001".parse().unwrap(), "file beats default");
        assert_eq!(c.data_dir, PathBuf::from("/file"));
        assert_eq!(c.snapshot_every, 10_000, "default");
        // The config file itself may come from the environment.
        let c = Config::resolve(ServeArgs::default(), env_of(&[("TWINHUB_CONFIG", file.to_str().unwrap())])).unwrap();
        assert_eq!(c.hostname, "file-host");
    }

    #[test]
    fn clap_flags_parse() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            a: ServeArgs,
        }
        let t = T::try_parse_from(["x", "--http-listen", "127.0.0.1:0", "--shard-count", "4", "--owner-key", "AAAA"])
            .unwrap();
        assert_eq!(t.a.http_listen.as_deref(), Some("127.0.0.1:0"));
        assert_eq!(t.a.shard_count, Some(4));
        assert_eq!(t.a.owner_key.as_deref(), Some("AAAA"));
    }

    #[test]
    fn bad_values_are_named() {
        let e = Config::resolve(ServeArgs { http_listen: Some("nope".into()), ..Default::default() }, env_of(&[]))
            .unwrap_err();
        assert!(e.to_string().contains("http-listen") && e.to_string().contains("nope"), "{e}");
        let e = Config::resolve(ServeArgs::default(), env_of(&[("TWINHUB_SHARD_COUNT", "x")])).unwrap_err();
        assert!(e.to_string().contains("TWINHUB_SHARD_COUNT"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(&file, "http_lisen = \"x\"\n").unwrap();
        let e = Config::resolve(ServeArgs { config: Some(file), ..Default::default() }, env_of(&[])).unwrap_err();
        assert!(e.to_string().contains("http_lisen"), "{e}");
    }

    /// Runtime threads: the flag, else the variable, else the file; none means one per core; zero is
    /// refused by name.
    #[test]
    fn worker_threads_come_from_flag_variable_or_file() {
        let c = Config::resolve(ServeArgs::default(), env_of(&[])).unwrap();
        assert_eq!(c.worker_threads, None);
        let c = Config::resolve(ServeArgs::default(), env_of(&[("TWINHUB_WORKER_THREADS", "3")])).unwrap();
        assert_eq!(c.worker_threads, Some(3));
        let args = ServeArgs { worker_threads: Some(1), ..Default::default() };
        assert_eq!(Config::resolve(args, env_of(&[("TWINHUB_WORKER_THREADS", "3")])).unwrap().worker_threads, Some(1));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(&file, "worker_threads = 2\n").unwrap();
        let c = Config::resolve(ServeArgs { config: Some(file), ..Default::default() }, env_of(&[])).unwrap();
        assert_eq!(c.worker_threads, Some(2));
        let e = Config::resolve(ServeArgs { worker_threads: Some(0), ..Default::default() }, env_of(&[])).unwrap_err();
        assert!(e.to_string().contains("worker-threads"), "{e}");
    }

    /// The scheduling class: normal unless the flag, the variable or the file says otherwise; an
    /// unknown class is refused by name.
    #[test]
    fn cpu_scheduling_comes_from_flag_variable_or_file() {
        use crate::sched::CpuScheduling;
        let class =
            |args: ServeArgs, env: &[(&str, &str)]| Config::resolve(args, env_of(env)).map(|c| c.cpu_scheduling);
        assert_eq!(class(ServeArgs::default(), &[]).unwrap(), CpuScheduling::Normal);
        assert_eq!(class(ServeArgs::default(), &[("TWINHUB_CPU_SCHEDULING", "batch")]).unwrap(), CpuScheduling::Batch);
        let args = ServeArgs { cpu_scheduling: Some("normal".into()), ..Default::default() };
        assert_eq!(class(args, &[("TWINHUB_CPU_SCHEDULING", "batch")]).unwrap(), CpuScheduling::Normal);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(&file, "cpu_scheduling = \"batch\"\n").unwrap();
        assert_eq!(class(ServeArgs { config: Some(file), ..Default::default() }, &[]).unwrap(), CpuScheduling::Batch);
        let e = class(ServeArgs { cpu_scheduling: Some("realtime".into()), ..Default::default() }, &[]).unwrap_err();
        assert!(e.to_string().contains("cpu-scheduling") && e.to_string().contains("realtime"), "{e}");
    }

    /// The event broker's batching wait: the default unless the flag, the variable or the file says
    /// otherwise; 0 turns it off; more than 100 ms is refused by name.
    #[test]
    fn events_batch_comes_from_flag_variable_or_file_and_is_bounded() {
        let ms = |c: Config| c.events_batch.as_millis() as u64;
        assert_eq!(ms(Config::resolve(ServeArgs::default(), env_of(&[])).unwrap()), DEFAULT_EVENTS_BATCH_MS);
        let var = [("TWINHUB_EVENTS_BATCH_MS", "0")];
        assert_eq!(ms(Config::resolve(ServeArgs::default(), env_of(&var)).unwrap()), 0);
        let args = ServeArgs { events_batch_ms: Some(5), ..Default::default() };
        assert_eq!(ms(Config::resolve(args, env_of(&var)).unwrap()), 5);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(&file, "events_batch_ms = 3\n").unwrap();
        let c = Config::resolve(ServeArgs { config: Some(file), ..Default::default() }, env_of(&[])).unwrap();
        assert_eq!(ms(c), 3);
        let args = ServeArgs { events_batch_ms: Some(101), ..Default::default() };
        let e = Config::resolve(args, env_of(&[])).unwrap_err();
        assert!(e.to_string().contains("events-batch-ms"), "{e}");
    }

    /// Entries in flight per shard: the default unless the flag, the variable or the file says
    /// otherwise; 0 (no batching) is a valid choice.
    #[test]
    fn proposals_in_flight_come_from_flag_variable_or_file() {
        let get = |args: ServeArgs, var: &[(&str, &str)]| Config::resolve(args, env_of(var));
        assert_eq!(get(ServeArgs::default(), &[]).unwrap().proposals_in_flight, DEFAULT_PROPOSALS_IN_FLIGHT);
        let var = [("TWINHUB_PROPOSALS_IN_FLIGHT", "0")];
        assert_eq!(get(ServeArgs::default(), &var).unwrap().proposals_in_flight, 0);
        let args = ServeArgs { proposals_in_flight: Some(4), ..Default::default() };
        assert_eq!(get(args, &var).unwrap().proposals_in_flight, 4);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(&file, "proposals_in_flight = 1\n").unwrap();
        assert_eq!(get(ServeArgs { config: Some(file), ..Default::default() }, &[]).unwrap().proposals_in_flight, 1);
        let e = get(ServeArgs::default(), &[("TWINHUB_PROPOSALS_IN_FLIGHT", "-1")]).unwrap_err();
        assert!(e.to_string().contains("TWINHUB_PROPOSALS_IN_FLIGHT"), "{e}");
    }

    /// Append calls per peer: 2 unless the flag, the variable or the file says otherwise; 0 (one call
    /// per AppendEntries) is a valid choice.
    #[test]
    fn raft_append_calls_per_peer_come_from_flag_variable_or_file() {
        let c = Config::resolve(ServeArgs::default(), env_of(&[])).unwrap();
        assert_eq!(c.raft_append_calls_per_peer, 2);
        let var = [("TWINHUB_RAFT_APPEND_CALLS_PER_PEER", "0")];
        assert_eq!(Config::resolve(ServeArgs::default(), env_of(&var)).unwrap().raft_append_calls_per_peer, 0);
        let args = ServeArgs { raft_append_calls_per_peer: Some(4), ..Default::default() };
        assert_eq!(Config::resolve(args, env_of(&var)).unwrap().raft_append_calls_per_peer, 4);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(&file, "raft_append_calls_per_peer = 1\n").unwrap();
        let c = Config::resolve(ServeArgs { config: Some(file), ..Default::default() }, env_of(&[])).unwrap();
        assert_eq!(c.raft_append_calls_per_peer, 1);
        let e = Config::resolve(ServeArgs::default(), env_of(&[("TWINHUB_RAFT_APPEND_CALLS_PER_PEER", "two")]))
            .unwrap_err();
        assert!(e.to_string().contains("TWINHUB_RAFT_APPEND_CALLS_PER_PEER"), "{e}");
    }

    #[test]
    fn a_cluster_node_needs_tls_files_or_the_explicit_plaintext_flag() {
        let base = || ServeArgs {
            cluster_listen: Some("127.0.0.1:7400".into()),
            cluster_secret: Some("0123456789abcdef0123".into()),
            ..Default::default()
        };
        let e = Config::resolve(base(), env_of(&[])).unwrap_err().to_string();
        assert!(e.contains("--cluster-ca") && e.contains("--cluster-plaintext"), "{e}");
        let half = ServeArgs { cluster_ca: Some("/ca.pem".into()), ..base() };
        assert!(Config::resolve(half, env_of(&[])).is_err(), "a CA alone is not enough");
        let both = ServeArgs { cluster_plaintext: true, cluster_ca: Some("/ca.pem".into()), ..base() };
        assert!(Config::resolve(both, env_of(&[])).unwrap_err().to_string().contains("both given"));
        let plain = Config::resolve(ServeArgs { cluster_plaintext: true, ..base() }, env_of(&[])).unwrap();
        assert_eq!(plain.cluster.unwrap().tls, None);
        let env = env_of(&[
            ("TWINHUB_CLUSTER_CA", "/ca.pem"),
            ("TWINHUB_CLUSTER_CERT", "/n.pem"),
            ("TWINHUB_CLUSTER_KEY", "/n.key"),
        ]);
        let tls = Config::resolve(base(), env).unwrap().cluster.unwrap().tls.unwrap();
        assert_eq!((tls.ca, tls.cert, tls.key), ("/ca.pem".into(), "/n.pem".into(), "/n.key".into()));
    }
}
