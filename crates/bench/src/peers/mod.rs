//! The systems under test as local 3-node clusters on loopback: each module installs (if needed),
//! starts, health-checks and stops one of them, and knows its process ids for memory readings.

pub mod etcd;
pub mod nats;
pub mod twinhub;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::http::HttpConn;

/// Polls `GET path` on a plain-HTTP address until the answer is 200 and `ok(body)` holds.
pub async fn wait_http(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    ok: impl Fn(&str) -> bool,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < timeout {
        let mut c = HttpConn::new(addr, None, addr.to_string());
        match c.request("GET", path, &[], None).await {
            Ok(r) => {
                let body = String::from_utf8_lossy(&r.body).to_string();
                if r.status == 200 && ok(&body) {
                    return Ok(());
                }
                last = format!("HTTP {}: {}", r.status, body.chars().take(200).collect::<String>());
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("{addr}{path} not healthy within {timeout:?}: {last}")
}

/// The last `n` bytes of a log file, for error messages.
pub fn log_tail(path: &std::path::Path, n: usize) -> String {
    let s = std::fs::read(path).unwrap_or_default();
    let s = String::from_utf8_lossy(&s);
    let start = s.len().saturating_sub(n);
    let start = (start..s.len()).find(|i| s.is_char_boundary(*i)).unwrap_or(s.len());
    s[start..].to_string()
}

/// Stops a peer's member processes (SIGTERM, then SIGKILL after 15 s) and forgets them.
pub fn stop_all(children: &mut Vec<std::process::Child>, name: &str) {
    for c in children.iter_mut() {
        crate::procs::stop_child(c, Duration::from_secs(15));
    }
    if !children.is_empty() {
        eprintln!("{name} cluster stopped");
    }
    children.clear();
}
