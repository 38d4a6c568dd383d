//! A running node: shards, twin layer, policies, TLS and the HTTPS listener, with graceful shutdown.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::{Policies, PolicyFileError, OWNER};
use crate::cluster::transport::{ClusterSecret, Transport, TransportConfig};
use crate::config::Config;
use crate::mqtt::Mqtt;
use crate::notify::{Hub, HubConfig};
use crate::shard::{ShardError, Shards, ShardsConfig};
use crate::tls::{CertSource, TlsError};
use crate::twin::{Twins, TwinsConfig};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("data directory {path}: {source}")]
    DataDir { path: String, source: std::io::Error },
    #[error(transparent)]
    Policies(#[from] PolicyFileError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("the cluster secret must not be empty")]
    ClusterSecret,
    #[error("opening shards: {0}")]
    Shards(#[from] ShardError),
    /// A Raft group stopped on a storage error: the node exits so that its supervisor restarts it
    /// (systemd `Restart=`, a Kubernetes pod), which reopens the data once the disk works again.
    #[error("storage failed, stopping so that a restart reopens the data: {0}")]
    StorageFailed(String),
    /// The cluster map was founded with another shard count than this node's: the node would hash
    /// devices to the wrong groups, so it stops instead of serving.
    #[error("stopping: {0}")]
    ShardCount(String),
}

pub struct Node {
    /// The address the HTTPS API actually listens on (port 0 resolved).
    pub http_addr: SocketAddr,
    /// Bound addresses of every listener (also written to `DIR/listen.json`).
    pub listen: Listen,
    pub hub: Arc<Hub>,
    pub hostname: String,
    pub policies: Arc<Policies>,
    pub twins: Arc<Twins>,
    shards: Arc<Shards>,
    stop: CancellationToken,
    http: tokio::task::JoinHandle<()>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The addresses a node actually listens on (ports 0 resolved), as `DIR/listen.json` records them for
/// scripts and tests.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Listen {
    pub http: SocketAddr,
    pub mqtt: SocketAddr,
    pub mqtt_plain: Option<SocketAddr>,
    pub events: SocketAddr,
    /// Inter-node listener (clustered nodes only).
    pub cluster: Option<SocketAddr>,
}

/// Listen backlog of every listener (the kernel caps it at `net.core.somaxconn`). A fleet reconnecting
/// after an outage arrives faster than a busy node accepts; connections that find the accept queue
/// full are dropped by the kernel and retried by the client only after 1 s, then 3 s. tokio's default
/// (1,024) overflowed in the 50,000-device connect storm on a saturated 2-core machine.
const LISTEN_BACKLOG: u32 = 8192;

/// The shard count this node opens its data with: the one given; else the one its data directory was
/// created with (a restart or an upgrade never depends on this release's default); else, for a node
/// that joins, the cluster's; else, founding a cluster, [`crate::ids::DEFAULT_SHARD_COUNT`].
async fn shard_count(config: &Config, dir: &std::path::Path, transport: Option<&Transport>) -> Result<u32, NodeError> {
    if let Some(n) = config.shard_count {
        return Ok(n);
    }
    if let Some(n) = crate::shard::recorded_shard_count(dir)? {
        return Ok(n);
    }
    let join = config.cluster.as_ref().and_then(|c| c.join.as_deref());
    Ok(match (transport, join) {
        (Some(t), Some(via)) => crate::shard::reconcile::cluster_shard_count(t, via).await,
        _ => crate::ids::DEFAULT_SHARD_COUNT,
    })
}

async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), NodeError> {
    let err = |source| NodeError::Bind { addr, source };
    let socket =
        if addr.is_ipv4() { tokio::net::TcpSocket::new_v4() } else { tokio::net::TcpSocket::new_v6() }.map_err(err)?;
    // What `TcpListener::bind` does on Unix: a restarted node may rebind a port in TIME_WAIT.
    #[cfg(unix)]
    socket.set_reuseaddr(true).map_err(err)?;
    socket.bind(addr).map_err(err)?;
    let listener = socket.listen(LISTEN_BACKLOG).map_err(err)?;
    let bound = listener.local_addr().map_err(err)?;
    Ok((listener, bound))
}

/// The same certificate without ALPN: MQTT clients offer none or `mqtt`, and a server ALPN list that
/// does not overlap would make rustls refuse the handshake.
fn without_alpn(tls: &Arc<rustls::ServerConfig>) -> Arc<rustls::ServerConfig> {
    let mut c = (**tls).clone();
    c.alpn_protocols.clear();
    Arc::new(c)
}

impl Node {
    /// Everything a client needs is in place when this returns: shards have leaders and the HTTPS
    /// listener is accepting.
    pub async fn start(config: Config) -> Result<Node, NodeError> {
        let dir = config.data_dir.clone();
        crate::secrets::private_data_dir(&dir)
            .map_err(|source| NodeError::DataDir { path: dir.display().to_string(), source })?;
        // The metrics recorder first: counters recorded before it exists are lost.
        crate::http::metrics_handle();
        let gates = crate::net::Gates::new(&config.net);
        let policies = Arc::new(Policies::load_or_create(&dir, config.owner_key.as_deref())?);
        let source = CertSource::from_options(config.tls_cert.clone(), config.tls_key.clone(), &dir, &config.hostname)?;
        let tls = crate::tls::server_config(&source)?;
        let mqtt_tls = crate::tls::mqtt_server_config(&source)?;
        // Bind before the (slower) shard recovery so a taken port fails fast.
        let (listener, http_addr) = bind(config.http_listen).await?;
        let (mqtt_listener, mqtt_addr) = bind(config.mqtt_listen).await?;
        let mqtt_plain = match config.mqtt_plain_listen {
            Some(a) => Some(bind(a).await?),
            None => None,
        };
        let (events_listener, events_addr) = bind(config.events_listen).await?;
        let stop = CancellationToken::new();
        // The inter-node server runs before the shards open: peers may already be calling.
        let (transport, cluster_addr) = match &config.cluster {
            None => (None, None),
            Some(c) => {
                let secret = ClusterSecret::new(c.secret.as_bytes()).map_err(|_| NodeError::ClusterSecret)?;
                let mut transport_config = TransportConfig::new(config.node_id, secret);
                transport_config.append_calls_in_flight = config.raft_append_calls_per_peer;
                transport_config.tls = match &c.tls {
                    Some(files) => Some(crate::tls::cluster::ClusterTls::load(files, config.node_id)?),
                    None => {
                        tracing::warn!("inter-node traffic is NOT encrypted (--cluster-plaintext): for development on one machine only");
                        None
                    }
                };
                let transport = Transport::new(transport_config);
                for (id, addr) in &c.peers {
                    transport.peers().set(*id, addr.clone());
                }
                let (l, a) = bind(c.listen).await?;
                tokio::spawn(crate::cluster::transport::serve(
                    l,
                    transport.service(),
                    gates.cluster.clone(),
                    gates.limits.handshake_timeout,
                    stop.child_token(),
                ));
                tokio::spawn(crate::cluster::transport::trust_members(
                    transport.clone(),
                    gates.cluster.clone(),
                    stop.child_token(),
                ));
                (Some(transport), Some(a))
            }
        };
        let listen = Listen {
            http: http_addr,
            mqtt: mqtt_addr,
            mqtt_plain: mqtt_plain.as_ref().map(|(_, a)| *a),
            events: events_addr,
            cluster: cluster_addr,
        };
        let hub = Hub::new(HubConfig { max_client_feeds: config.max_change_feeds, ..HubConfig::new(&config.hostname) });
        let shard_count = shard_count(&config, &dir, transport.as_ref()).await?;

        let shards = Shards::open(ShardsConfig {
            data_dir: dir.clone(),
            node_id: config.node_id,
            shard_count,
            snapshot_every: config.snapshot_every,
            events: Some(hub.sink()),
            transport: transport.clone(),
            members: config.cluster.as_ref().map(|c| c.peers.clone()).unwrap_or_default(),
            join: config.cluster.as_ref().and_then(|c| c.join.clone()),
            heartbeat_ms: config.raft_heartbeat_ms,
            proposals_in_flight: config.proposals_in_flight,
        })
        .await?;
        shards.serve_reconciler_calls();
        if let Some(c) = config.cluster.as_ref().filter(|c| c.join.is_some()) {
            let (s, via, advertise) = (shards.clone(), c.join.clone().unwrap_or_default(), c.advertise.clone());
            tokio::spawn(async move { s.join(&via, &advertise).await });
        }
        let twins_config = TwinsConfig { follower_reads: config.follower_reads, ..TwinsConfig::default() };
        let twins = Twins::new(shards.clone(), twins_config, transport.clone());
        let mqtt_limits = crate::mqtt::Limits::new(gates.limits.handshake_timeout, config.mqtt_max_keep_alive);
        let mqtt = Mqtt::new(twins.clone(), hub.clone(), config.hostname.clone(), gates.mqtt.clone(), mqtt_limits);
        let methods = crate::mqtt::methods::Methods::new(mqtt.methods.clone(), transport.clone(), shards.clone());
        let state = Arc::new(crate::http::AppState {
            twins: Some(twins.clone()),
            hub: Some(hub.clone()),
            policies: policies.clone(),
            host: format!("{}:{}", config.hostname, http_addr.port()),
            mqtt_ws: Some(crate::http::websocket::MqttOverWebSocket { mqtt: mqtt.clone(), stop: stop.clone() }),
            methods: Some(methods.clone()),
        });
        let app = crate::http::App::new(state);
        let plain_tls = without_alpn(&tls);
        let http = tokio::spawn(crate::http::serve(
            listener,
            tls,
            app,
            gates.https.clone(),
            gates.limits.clone(),
            stop.clone().cancelled_owned(),
        ));
        let mut tasks = vec![tokio::spawn(mqtt.clone().serve(mqtt_listener, Some(mqtt_tls), stop.clone()))];
        if let Some((l, _)) = mqtt_plain {
            tasks.push(tokio::spawn(mqtt.serve(l, None, stop.clone())));
        }
        let broker = crate::notify::broker::serve(
            events_listener,
            plain_tls,
            hub.clone(),
            policies.clone(),
            config.hostname.clone(),
            gates.events.clone(),
            gates.limits.handshake_timeout,
            crate::notify::broker::ClientLimits {
                max_filters: config.max_event_filters,
                max_keep_alive: config.mqtt_max_keep_alive,
            },
            config.events_batch,
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            if let Err(e) = broker.await {
                tracing::error!("{e}");
            }
        }));
        tasks.push(tokio::spawn(shard_metrics(shards.clone(), hub.clone(), dir.clone(), stop.clone())));
        tasks.push(tokio::spawn(reconcile(shards.clone(), stop.clone())));
        tasks.push(tokio::spawn(snapshot_by_work(shards.clone(), stop.clone())));
        tasks.push(tokio::spawn(crate::configurations::run(
            twins.clone(),
            config.configuration_interval,
            stop.clone(),
        )));
        tasks.push(tokio::spawn(crate::jobs::run(twins.clone(), Some(methods), stop.clone())));
        let listen_json = serde_json::to_vec_pretty(&listen).unwrap_or_default();
        crate::auth::write_atomically(&dir.join("listen.json"), &listen_json)
            .map_err(|source| NodeError::DataDir { path: dir.join("listen.json").display().to_string(), source })?;
        tracing::info!(node = config.node_id, %http_addr, %mqtt_addr, mqtt_plain = ?listen.mqtt_plain, %events_addr, cluster = ?cluster_addr, shards = shard_count, data_dir = %dir.display(), "twinhub ready");
        Ok(Node { http_addr, listen, hub, hostname: config.hostname, policies, twins, shards, stop, http, tasks })
    }

    /// The service connection string for the iothubowner policy, with the bound port.
    pub fn connection_string(&self) -> String {
        format!(
            "HostName={}:{};SharedAccessKeyName={OWNER};SharedAccessKey={}",
            self.hostname,
            self.http_addr.port(),
            self.policies.owner_key()
        )
    }

    /// The web console on this node's HTTPS port.
    pub fn console_url(&self) -> String {
        format!("https://{}:{}{}", self.hostname, self.http_addr.port(), crate::http::console::CONSOLE_PATH)
    }

    /// Stop accepting, drain open requests, stop the twin actors, then the Raft groups and storage.
    pub async fn shutdown(self) {
        self.stop.cancel();
        // Open SSE streams and device push loops end now rather than holding the HTTP drain.
        self.hub.close();
        if let Err(e) = self.http.await {
            tracing::warn!("HTTP server task: {e}");
        }
        for t in self.tasks {
            if let Err(e) = t.await {
                tracing::warn!("listener task: {e}");
            }
        }
        self.twins.shutdown().await;
        self.shards.shutdown().await;
        tracing::info!("twinhub stopped");
    }
}

/// Moves this node's share of the cluster towards the cluster map, twice a second.
async fn reconcile(shards: Arc<Shards>, stop: CancellationToken) {
    let mut r = crate::shard::reconcile::Reconciler::default();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = shards.reconcile(&mut r) => {}
        }
    }
}

/// Once a second, asks the group most due for a snapshot for one: this is the node's snapshot
/// policy, Raft's own count of entries being only a backstop (see [`Shards::snapshot_heavy_groups`]).
async fn snapshot_by_work(shards: Arc<Shards>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        shards.snapshot_heavy_groups().await;
    }
}

/// Per-shard gauges of the replicas this node hosts (and of the metadata group as shard `meta`), the
/// process and disk gauges, and the notification queue depths.
async fn shard_metrics(shards: Arc<Shards>, hub: Arc<Hub>, data_dir: std::path::PathBuf, stop: CancellationToken) {
    let mut leaders: std::collections::HashMap<String, Option<u64>> = Default::default();
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        crate::sysmetrics::record(&data_dir);
        hub.record_queue_depths();
        let meta = shards.meta_status().map(|m| ("meta".to_string(), m));
        let hosted = shards.status().into_iter().map(|s| (s.shard.to_string(), s));
        for (shard, st) in hosted.chain(meta) {
            metrics::gauge!("twinhub_shard_term", "shard" => shard.clone()).set(st.term as f64);
            metrics::gauge!("twinhub_shard_last_log_index", "shard" => shard.clone()).set(st.last_log_index as f64);
            metrics::gauge!("twinhub_shard_commit_index", "shard" => shard.clone()).set(st.committed as f64);
            metrics::gauge!("twinhub_shard_apply_index", "shard" => shard.clone()).set(st.applied as f64);
            metrics::gauge!("twinhub_shard_snapshot_index", "shard" => shard.clone()).set(st.snapshot_index as f64);
            metrics::gauge!("twinhub_shard_writes_since_snapshot", "shard" => shard.clone())
                .set(st.writes_since_snapshot as f64);
            metrics::gauge!("twinhub_shard_snapshot_due_writes", "shard" => shard.clone())
                .set(st.snapshot_due_writes as f64);
            metrics::gauge!("twinhub_shard_is_leader", "shard" => shard.clone()).set(if st.is_leader {
                1.0
            } else {
                0.0
            });
            metrics::gauge!("twinhub_shard_has_leader", "shard" => shard.clone()).set(if st.leader.is_some() {
                1.0
            } else {
                0.0
            });
            let max_lag = st.lag.values().copied().max().unwrap_or(0);
            metrics::gauge!("twinhub_shard_max_replica_lag", "shard" => shard.clone()).set(max_lag as f64);
            let prev = leaders.entry(shard.clone()).or_insert_with(|| {
                // Registered at zero so the series exists before the first change.
                metrics::counter!("twinhub_shard_leader_changes_total", "shard" => shard.clone()).increment(0);
                st.leader
            });
            if *prev != st.leader {
                metrics::counter!("twinhub_shard_leader_changes_total", "shard" => shard).increment(1);
                *prev = st.leader;
            }
        }
    }
}

pub async fn run(config: Config) -> Result<(), NodeError> {
    let node = Node::start(config).await?;
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", node.connection_string());
        let _ = out.flush();
    }
    // stdout carries only the connection string (scripts read its first line); the console's address
    // is for the person at the terminal.
    eprintln!("twinhub: web console at {}; sign in with the connection string above", node.console_url());
    let failed = tokio::select! {
        _ = wait_for_signal() => None,
        why = must_stop(&node) => Some(why),
    };
    tracing::info!("shutting down");
    node.shutdown().await;
    failed.map_or(Ok(()), Err)
}

/// Resolves once the node must stop:
/// - a Raft group of the node has stopped on a storage error. A node in that state no longer
///   replicates or leads that shard (the others take over) but would otherwise stay up answering
///   from a frozen replica; exiting lets a supervisor restart it, and the restart reopens the data
///   (the same path as after a crash, so nothing acknowledged is lost);
/// - the cluster map it follows was founded with another shard count than the node's. Restarting
///   does not help there, and the error says what does.
async fn must_stop(node: &Node) -> NodeError {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    loop {
        tick.tick().await;
        if let Some(why) = node.shards.storage_failure() {
            tracing::error!("{why}");
            return NodeError::StorageFailed(why);
        }
        if let Some(why) = node.shards.misconfiguration() {
            tracing::error!("{why}");
            return NodeError::ShardCount(why);
        }
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(e) => {
                tracing::warn!("cannot watch SIGTERM ({e}); only SIGINT stops the node");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole edge in-process: start on port 0, HTTPS with the generated CA, one authorised write,
    /// graceful shutdown, and a restart that keeps keys and data.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn starts_serves_and_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::config::Config::resolve(
            crate::config::ServeArgs {
                data_dir: Some(dir.path().into()),
                http_listen: Some("127.0.0.1:0".into()),
                mqtt_listen: Some("127.0.0.1:0".into()),
                events_listen: Some("127.0.0.1:0".into()),
                shard_count: Some(2),
                ..Default::default()
            },
            |_| None,
        )
        .unwrap();
        let node = Node::start(config.clone()).await.unwrap();
        let cs = node.connection_string();
        assert!(cs.starts_with(&format!(
            "HostName=localhost:{};SharedAccessKeyName=iothubowner;SharedAccessKey=",
            node.http_addr.port()
        )));
        let ca = reqwest::Certificate::from_pem(&std::fs::read(dir.path().join("tls/ca.pem")).unwrap()).unwrap();
        let client = reqwest::Client::builder().add_root_certificate(ca).build().unwrap();
        let base = format!("https://localhost:{}", node.http_addr.port());
        let health = client.get(format!("{base}/health")).send().await.unwrap();
        assert_eq!(health.status(), 200);

        let auth = |port: u16, key: &str| {
            let sr = format!("localhost%3A{port}");
            let se = crate::model::now_ms() / 1000 + 600;
            let sig = base64::Engine::encode(
                &base64::engine::general_purpose::STANDARD,
                crate::auth::sign(key, &sr, se).unwrap(),
            );
            let sig = percent_encoding::utf8_percent_encode(&sig, percent_encoding::NON_ALPHANUMERIC);
            format!("SharedAccessSignature sr={sr}&sig={sig}&se={se}&skn=iothubowner")
        };
        let key = node.policies.owner_key().to_string();
        let resp = client
            .put(format!("{base}/devices/d1?api-version=2021-04-12"))
            .header("authorization", auth(node.http_addr.port(), &key))
            .body(r#"{"deviceId":"d1","authentication":{"symmetricKey":{},"type":"sas"}}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let dev: serde_json::Value = resp.json().await.unwrap();
        assert!(dev["authentication"]["symmetricKey"]["primaryKey"].as_str().is_some_and(|k| !k.is_empty()));
        node.shutdown().await;

        let node = Node::start(config).await.unwrap();
        assert_eq!(node.policies.owner_key(), key);
        let base = format!("https://localhost:{}", node.http_addr.port());
        let resp = client
            .get(format!("{base}/devices/d1"))
            .header("authorization", auth(node.http_addr.port(), &key))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        node.shutdown().await;
    }
}
