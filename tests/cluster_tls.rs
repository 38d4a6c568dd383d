//! Inter-node mutual TLS, against a real `twinhub cluster up`: nodes talk TLS 1.3 with certificates
//! from the cluster's own CA; a plaintext peer, a peer without a certificate and a peer whose
//! certificate (or CA) is foreign are refused before any request is read; a node's server certificate is for
//! that node only; and a packet capture of the cluster ports during writes shows none of the twin
//! JSON that a capture of the plain MQTT port (same writes) does show.

use twinhub_testkit as common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::cluster::*;
use common::*;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{json, Value};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(10);

/// Sends one (unsigned) request frame over `io`; `Err` if the connection is refused at any step.
async fn frame_request<I>(io: I) -> Result<u16, String>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    Ok(frames::request(io, "/cluster/v5/call/node.status", &[], b"").await?.status)
}

/// TCP + TLS with `config` to node `id` at `addr`, then one request.
async fn tls_request(addr: SocketAddr, id: u64, config: Arc<rustls::ClientConfig>) -> Result<u16, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(cluster_node_name(id), tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    frame_request(tls).await
}

/// A CA and a certificate named like node `id`, from nobody this cluster knows.
fn foreign_identity(dir: &std::path::Path, id: u64) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(vec![format!("node-{id}.cluster.twinhub")]).unwrap();
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let cert = p.signed_by(&key, &Issuer::new(ca, ca_key)).unwrap();
    let paths = (dir.join("foreign-ca.pem"), dir.join("foreign.pem"), dir.join("foreign.key"));
    std::fs::write(&paths.0, ca_cert.pem()).unwrap();
    std::fs::write(&paths.1, cert.pem()).unwrap();
    std::fs::write(&paths.2, key.serialize_pem()).unwrap();
    paths
}

/// `tcpdump` on loopback for `filter`, writing to `file`; returns once it listens.
fn capture(file: &std::path::Path, filter: &str) -> Child {
    let mut child = Command::new("tcpdump")
        // Immediate mode: without it, packets still in the capture ring when tcpdump is stopped are lost.
        .args(["-i", "lo", "--immediate-mode", "-U", "-s", "0", "-w"])
        .arg(file)
        .arg(filter)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tcpdump is required (scripts/test.sh installs it)");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("listening on") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(20)).expect("tcpdump did not start listening");
    child
}

fn stop_capture(mut child: Child, file: &std::path::Path) -> Vec<u8> {
    // SIGINT: tcpdump flushes and exits.
    let _ = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
    let _ = child.wait();
    std::fs::read(file).unwrap()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_talk_mutual_tls_and_refuse_plaintext_and_foreign_peers() {
    let c = Cluster::up(3, 2);
    c.settle_leadership().await;
    let toml = std::fs::read_to_string(&c.node(1).config).unwrap();
    assert!(
        toml.contains("cluster_ca") && toml.contains("cluster_cert") && !toml.contains("cluster_plaintext"),
        "{toml}"
    );
    let n1 = c.cluster_addr(1);
    let tmp = tempfile::tempdir().unwrap();
    let cluster_ca = c.dir.join("shared/tls/cluster-ca.pem");

    // A member's certificate gets an answer (401 here: the request is not signed).
    let member = tokio::time::timeout(WAIT, tls_request(n1, 1, c.member_tls(2))).await.expect("in time");
    assert_eq!(member, Ok(401), "a member's TLS reaches the signature check");

    // A plaintext request (what nodes spoke before TLS): no answer at all.
    let tcp = TcpStream::connect(n1).await.unwrap();
    let plain = tokio::time::timeout(WAIT, frame_request(tcp)).await.expect("refused in time, not hung");
    assert!(plain.is_err(), "a plaintext peer got an answer: {plain:?}");

    // TLS without a client certificate: refused.
    let anonymous = cluster_tls_client(&cluster_ca, None);
    let r = tokio::time::timeout(WAIT, tls_request(n1, 1, anonymous)).await.expect("in time");
    assert!(r.is_err(), "a peer without a certificate got an answer: {r:?}");

    // A certificate named like node 2 from a foreign CA: the node refuses it...
    let (foreign_ca, foreign_cert, foreign_key) = foreign_identity(tmp.path(), 2);
    let impostor = cluster_tls_client(&cluster_ca, Some((&foreign_cert, &foreign_key)));
    let r = tokio::time::timeout(WAIT, tls_request(n1, 1, impostor)).await.expect("in time");
    assert!(r.is_err(), "a foreign-CA certificate got an answer: {r:?}");
    // ...and a client trusting only the foreign CA refuses the node (it is no node of *that* cluster).
    let wrong_trust = cluster_tls_client(&foreign_ca, Some((&foreign_cert, &foreign_key)));
    let r = tokio::time::timeout(WAIT, tls_request(n1, 1, wrong_trust)).await.expect("in time");
    assert!(r.as_ref().is_err_and(|e| e.contains("TLS")), "the node's certificate passed a foreign CA: {r:?}");

    // A node's certificate is for that node: dialling node 1 while expecting node 2 fails.
    let tcp = TcpStream::connect(n1).await.unwrap();
    let r = tokio_rustls::TlsConnector::from(c.member_tls(3)).connect(cluster_node_name(2), tcp).await;
    assert!(r.is_err(), "node 1's certificate passed as node 2's");

    // The cluster still works through every node.
    let api1 = c.api(1);
    api1.must_create_device("tls-d1").await;
    api1.must_patch_twin("tls-d1", &json!({"tags": {"ok": true}})).await;
    let t = c.api(3).must_get_twin("tls-d1").await;
    assert_eq!(t["tags"]["ok"], true);
    c.assert_no_panics();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_of_the_cluster_ports_shows_no_twin_json() {
    let c = Cluster::up(3, 2);
    c.settle_leadership().await;
    let api = c.api(1);
    let doc = api.must_create_device("wire-d1").await;
    let key = doc.pointer("/authentication/symmetricKey/primaryKey").and_then(Value::as_str).unwrap().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let cluster_ports =
        c.ids().iter().map(|id| format!("tcp port {}", c.cluster_addr(*id).port())).collect::<Vec<_>>().join(" or ");
    let device_node = c.node(2).mqtt_plain;
    let (cluster_pcap, mqtt_pcap) = (tmp.path().join("cluster.pcap"), tmp.path().join("mqtt.pcap"));
    let cluster_cap = capture(&cluster_pcap, &cluster_ports);
    let mqtt_cap = capture(&mqtt_pcap, &format!("tcp port {}", device_node.port()));

    // The same secret travels both ways: in a desired patch over HTTPS (to node 1, replicated over the
    // cluster ports) and in a reported patch over plain MQTT (to node 2, forwarded and replicated).
    let marker = format!("secret-{}", std::process::id());
    api.must_patch_twin("wire-d1", &json!({"properties": {"desired": {"wifiPassword": marker}}})).await;
    let mut o = MqttOptions::new("wire-d1", device_node.ip().to_string(), device_node.port());
    o.set_credentials(
        "localhost/wire-d1/?api-version=2021-04-12",
        device_token("localhost", "wire-d1", None, &key, unix_now() + 3600),
    );
    let (client, mut el) = AsyncClient::new(o, 16);
    client.subscribe("$iothub/twin/res/#", QoS::AtLeastOnce).await.unwrap();
    client
        .publish(
            "$iothub/twin/PATCH/properties/reported/?$rid=1",
            QoS::AtLeastOnce,
            false,
            json!({"echo": marker}).to_string(),
        )
        .await
        .unwrap();
    let acked = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Ok(Event::Incoming(Packet::Publish(p))) = el.poll().await {
                if p.topic.starts_with("$iothub/twin/res/204/") {
                    return;
                }
            }
        }
    })
    .await;
    assert!(acked.is_ok(), "the reported patch was not acknowledged");
    // Every replica holds both writes, so both crossed the cluster ports.
    for id in c.ids() {
        let t = c.api(id).must_get_twin("wire-d1").await;
        assert_eq!(t["properties"]["reported"]["echo"], marker.as_str(), "node {id}");
    }
    let _ = client.disconnect().await;
    let cluster_bytes = stop_capture(cluster_cap, &cluster_pcap);
    let mqtt_bytes = stop_capture(mqtt_cap, &mqtt_pcap);
    assert!(contains(&mqtt_bytes, marker.as_bytes()), "the capture itself works: the plain MQTT port shows the marker ({} bytes captured there, {} on the cluster ports)", mqtt_bytes.len(), cluster_bytes.len());
    assert!(cluster_bytes.len() > 2000, "the cluster ports carried traffic ({} bytes captured)", cluster_bytes.len());
    assert!(!contains(&cluster_bytes, marker.as_bytes()), "twin JSON crossed the cluster ports in clear");
    assert!(
        !contains(&cluster_bytes, b"wifiPassword") && !contains(&cluster_bytes, b"\"properties\""),
        "JSON keys in clear on the cluster ports"
    );
    c.assert_no_panics();
}
