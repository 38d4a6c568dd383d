//! The nemesis: each fault is injected against the running cluster, held, healed, and recorded with its
//! start and end on the run clock. What the cluster did in reaction (a node that exited, a node that
//! needed a restart to recover) goes into the observations, never hidden.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::runner::cluster::Cluster;
use crate::runner::net::{self, Direction};
use crate::runner::util::{now_ns, secs};
use crate::say;

pub const SCENARIOS: [&str; 12] = [
    "kill-random-node",
    "kill-shard-leader",
    "pause-node",
    "partition-minority",
    "partition-majority",
    "partition-bridge",
    "one-way-loss",
    "rolling-restart",
    "disk-full",
    "power-loss-node",
    "power-loss-majority",
    "power-loss-cluster",
];

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FaultRecord {
    pub kind: String,
    pub nodes: Vec<u64>,
    pub description: String,
    /// Run clock, seconds.
    pub start_s: f64,
    pub end_s: f64,
    /// Shard → leader when the fault began.
    pub leaders_before: BTreeMap<u32, u64>,
}

/// How long faults are held.
#[derive(Clone, Debug)]
pub struct Timing {
    pub kill_down: Duration,
    pub pause: Duration,
    pub partition: Duration,
    pub disk_full: Duration,
}

impl Timing {
    pub fn short() -> Timing {
        Timing {
            kill_down: Duration::from_secs(4),
            pause: Duration::from_secs(3),
            partition: Duration::from_secs(8),
            disk_full: Duration::from_secs(8),
        }
    }

    /// Randomized, longer holds (long profile).
    pub fn random(rng: &mut StdRng) -> Timing {
        Timing {
            kill_down: Duration::from_millis(rng.gen_range(1_000..10_000)),
            pause: Duration::from_millis(rng.gen_range(1_000..8_000)),
            partition: Duration::from_millis(rng.gen_range(3_000..20_000)),
            disk_full: Duration::from_millis(rng.gen_range(5_000..15_000)),
        }
    }
}

pub struct Nemesis<'a> {
    pub cluster: &'a mut Cluster,
    pub rng: &'a mut StdRng,
    pub timing: Timing,
    pub faults: Vec<FaultRecord>,
    pub observations: Vec<String>,
    pub leaders_before: BTreeMap<u32, u64>,
}

impl Nemesis<'_> {
    fn observe(&mut self, s: String) {
        say!("  observation: {s}");
        self.observations.push(s);
    }

    fn record(&mut self, kind: &str, nodes: Vec<u64>, description: String, start: u64) {
        say!("  fault {kind} on {nodes:?}: {description} ({:.1}s)", secs(now_ns() - start));
        self.faults.push(FaultRecord {
            kind: kind.into(),
            nodes,
            description,
            start_s: secs(start),
            end_s: secs(now_ns()),
            leaders_before: self.leaders_before.clone(),
        });
    }

    /// Waits until node `id` answers `/ready`; returns the time it took, or notes that it did not.
    async fn wait_node_ready(&mut self, id: u64, timeout: Duration) -> Option<Duration> {
        let t = Instant::now();
        while t.elapsed() < timeout {
            if let Some(st) = self.cluster.check_exited(id) {
                self.observe(format!("node {id} exited while starting: {st}"));
                return None;
            }
            if self.cluster.ready(id).await {
                return Some(t.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.observe(format!("node {id} was not ready within {timeout:?} of its restart"));
        None
    }

    async fn restart(&mut self, id: u64) -> String {
        if let Err(e) = self.cluster.spawn(id) {
            self.observe(format!("node {id}: restart failed: {e}"));
            return "restart failed".into();
        }
        match self.wait_node_ready(id, Duration::from_secs(60)).await {
            Some(d) => format!("ready {:.1}s after restart", d.as_secs_f64()),
            None => "not ready after restart".into(),
        }
    }

    fn random_node(&mut self) -> u64 {
        *self.cluster.ids().choose(self.rng).expect("nodes")
    }

    /// The node leading the fewest shards (random among ties).
    async fn leader_light(&mut self) -> u64 {
        let leaders = self.cluster.leaders().await;
        let mut count: BTreeMap<u64, usize> = self.cluster.ids().into_iter().map(|i| (i, 0)).collect();
        for n in leaders.values() {
            *count.entry(*n).or_default() += 1;
        }
        let min = count.values().copied().min().unwrap_or(0);
        let light: Vec<u64> = count.into_iter().filter(|(_, c)| *c == min).map(|(n, _)| n).collect();
        *light.choose(self.rng).expect("nodes")
    }

    /// Injects one fault of `scenario`, holds it, heals it.
    pub async fn inject(&mut self, scenario: &str) -> anyhow::Result<()> {
        let ids = self.cluster.ids();
        self.leaders_before = self.cluster.leaders().await;
        match scenario {
            "kill-random-node" => {
                let id = self.random_node();
                let start = now_ns();
                self.cluster.kill9(id).await;
                tokio::time::sleep(self.timing.kill_down).await;
                let how = self.restart(id).await;
                self.record(
                    "sigkill",
                    vec![id],
                    format!("SIGKILL node {id}, down {:?}, restarted: {how}", self.timing.kill_down),
                    start,
                );
            }
            "kill-shard-leader" => {
                let leaders = self.cluster.leaders().await;
                let shards: Vec<u32> = leaders.keys().copied().collect();
                let Some(&shard) = shards.choose(self.rng) else { anyhow::bail!("no shard has a leader") };
                let id = leaders[&shard];
                let led: Vec<u32> = leaders.iter().filter(|(_, n)| **n == id).map(|(s, _)| *s).collect();
                let start = now_ns();
                self.cluster.kill9(id).await;
                tokio::time::sleep(self.timing.kill_down).await;
                let how = self.restart(id).await;
                self.record(
                    "sigkill-leader",
                    vec![id],
                    format!("SIGKILL node {id}, leader of shard {shard} (and of shards {led:?}), down {:?}, restarted: {how}", self.timing.kill_down),
                    start,
                );
            }
            "pause-node" => {
                let id = self.cluster.leader_heavy().await;
                let start = now_ns();
                self.cluster.pause(id);
                tokio::time::sleep(self.timing.pause).await;
                self.cluster.resume(id);
                self.record(
                    "sigstop",
                    vec![id],
                    format!("SIGSTOP node {id} (leader-heavy) for {:?}, then SIGCONT", self.timing.pause),
                    start,
                );
            }
            "partition-minority" | "partition-majority" => {
                let id = if scenario == "partition-minority" {
                    self.leader_light().await
                } else {
                    self.cluster.leader_heavy().await
                };
                let others: Vec<u64> = ids.iter().copied().filter(|i| *i != id).collect();
                let start = now_ns();
                for o in &others {
                    net::cut(id, *o, Direction::Both)?;
                }
                let rules = net::rules(id);
                tokio::time::sleep(self.timing.partition).await;
                net::heal(id)?;
                let which = if scenario == "partition-minority" { "leader-light" } else { "leader-heavy" };
                self.record(
                    "partition",
                    vec![id],
                    format!(
                        "node {id} ({which}) isolated from {others:?} for {:?} (clients still reach every node); rules: {}",
                        self.timing.partition,
                        rules.lines().filter(|l| l.contains("DROP")).collect::<Vec<_>>().join("; ")
                    ),
                    start,
                );
            }
            "partition-bridge" => {
                let mut order = ids.clone();
                order.shuffle(self.rng);
                let (bridge, a, c) = (order[0], order[1], order.get(2).copied().unwrap_or(order[1]));
                let start = now_ns();
                net::cut(a, c, Direction::Both)?;
                net::cut(c, a, Direction::Both)?;
                for extra in order.iter().skip(3) {
                    // Bigger clusters: the rest join one side.
                    net::cut(*extra, c, Direction::Both)?;
                }
                tokio::time::sleep(self.timing.partition).await;
                for id in &ids {
                    net::heal(*id)?;
                }
                self.record(
                    "partition-bridge",
                    vec![a, bridge, c],
                    format!(
                        "node {bridge} sees {a} and {c}, which do not see each other, for {:?}",
                        self.timing.partition
                    ),
                    start,
                );
            }
            "one-way-loss" => {
                let id = self.cluster.leader_heavy().await;
                let others: Vec<u64> = ids.iter().copied().filter(|i| *i != id).collect();
                let start = now_ns();
                for o in &others {
                    net::cut(id, *o, Direction::In)?;
                }
                tokio::time::sleep(self.timing.partition).await;
                net::heal(id)?;
                self.record(
                    "one-way-loss",
                    vec![id],
                    format!(
                        "node {id} (leader-heavy) receives nothing from {others:?} but can send to them, for {:?}",
                        self.timing.partition
                    ),
                    start,
                );
            }
            "rolling-restart" => {
                for id in ids {
                    self.leaders_before = self.cluster.leaders().await;
                    let start = now_ns();
                    let how_stop = self.cluster.stop(id, Duration::from_secs(20)).await;
                    let how = self.restart(id).await;
                    self.record(
                        "restart",
                        vec![id],
                        format!("SIGTERM node {id} ({how_stop}), restarted: {how}"),
                        start,
                    );
                    if let Err(e) = self.cluster.wait_healthy(Duration::from_secs(60)).await {
                        self.observe(format!("cluster not healthy 60 s after restarting node {id}: {e}"));
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
            "disk-full" => self.disk_full().await?,
            "power-loss-node" => {
                let id = self.cluster.leader_heavy().await;
                self.power_loss(vec![id], "leader-heavy node").await;
            }
            "power-loss-majority" => {
                let first = self.cluster.leader_heavy().await;
                let mut rest: Vec<u64> = ids.iter().copied().filter(|i| *i != first).collect();
                rest.shuffle(self.rng);
                let mut chosen = vec![first];
                chosen.extend(rest.into_iter().take(ids.len() / 2));
                chosen.sort();
                self.power_loss(chosen, "a majority, with the leader-heavy node").await;
            }
            "power-loss-cluster" => self.power_loss(ids.clone(), "every node").await,
            other => anyhow::bail!("unknown scenario {other}"),
        }
        Ok(())
    }

    /// Power loss on `ids` at once: SIGKILL them all, then each one's file system drops what it had not
    /// synced and unmounts; after the hold every node restarts on what is left. A node that cannot
    /// start on it is observed with what it logged.
    async fn power_loss(&mut self, ids: Vec<u64>, which: &str) {
        let start = now_ns();
        for &id in &ids {
            self.cluster.signal(id, libc::SIGCONT);
            self.cluster.signal(id, libc::SIGKILL);
        }
        let mut dropped = Vec::new();
        for &id in &ids {
            match self.cluster.power_loss(id).await {
                Ok(s) => dropped.push(format!("node {id}: {s}")),
                Err(e) => {
                    self.observe(format!("power loss on node {id} failed: {e:#}"));
                    dropped.push(format!("node {id}: drop failed"));
                }
            }
        }
        tokio::time::sleep(self.timing.kill_down).await;
        let log_from: BTreeMap<u64, u64> = ids
            .iter()
            .map(|id| (*id, std::fs::metadata(&self.cluster.node(*id).log).map(|m| m.len()).unwrap_or(0)))
            .collect();
        for &id in &ids {
            if let Err(e) = self.cluster.spawn(id) {
                self.observe(format!("node {id}: restart after the power loss failed: {e:#}"));
            }
        }
        let mut hows = Vec::new();
        for &id in &ids {
            let how = match self.wait_node_ready(id, Duration::from_secs(60)).await {
                Some(d) => format!("node {id} ready {:.1}s after restart", d.as_secs_f64()),
                None => {
                    let log = self.cluster.node(id).log.clone();
                    let text = std::fs::read(&log).unwrap_or_default();
                    let from = (log_from[&id] as usize).min(text.len());
                    let text = String::from_utf8_lossy(&text[from..]).to_string();
                    let errs: Vec<&str> =
                        text.lines().filter(|l| l.contains("ERROR") || l.contains("twinhub:")).take(4).collect();
                    self.observe(format!(
                        "node {id} did not come back after the power loss; it said: {}",
                        errs.join(" || ")
                    ));
                    if self.cluster.is_running(id) {
                        format!("node {id} not ready")
                    } else {
                        // Restart once more so that the rest of the run has its cluster.
                        let _ = self.cluster.spawn(id);
                        format!("node {id} exited at start (restarted once more)")
                    }
                }
            };
            hows.push(how);
        }
        self.record(
            "power-loss",
            ids.clone(),
            format!(
                "power loss on {which} {ids:?} (SIGKILL, unsynced data dropped), down {:?}; {}; {}",
                self.timing.kill_down,
                dropped.join("; "),
                hows.join(", ")
            ),
            start,
        );
    }

    /// Fills the leader-heavy node's data disk until writes fail, keeps it full while the workload runs,
    /// frees it, and watches whether the node recovers by itself. Then restarts it once (SIGTERM) to see
    /// that its data reopens cleanly.
    async fn disk_full(&mut self) -> anyhow::Result<()> {
        let id = self.cluster.leader_heavy().await;
        let disk = self.cluster.node(id).disk.clone();
        let log = self.cluster.node(id).log.clone();
        let log_from = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let filler = disk.join("filler");
        let start = now_ns();
        let f2 = filler.clone();
        let written = tokio::task::spawn_blocking(move || -> std::io::Result<u64> {
            let mut f = std::fs::File::create(&f2)?;
            let chunk = vec![0u8; 1 << 20];
            let mut n = 0u64;
            loop {
                match f.write(&chunk) {
                    Ok(0) => break,
                    Ok(k) => n += k as u64,
                    Err(_) => break, // ENOSPC: the disk is full
                }
            }
            let _ = f.flush();
            Ok(n)
        })
        .await??;
        let used_by_node = dir_size(&self.cluster.node(id).data_dir);
        self.observe(format!(
            "node {id}: disk full after writing {} MiB of filler (its data directory holds {} KiB)",
            written >> 20,
            used_by_node >> 10
        ));
        let hold_until = Instant::now() + self.timing.disk_full;
        let mut exited = None;
        let mut ready_lost_at = None;
        while Instant::now() < hold_until {
            if let Some(st) = self.cluster.check_exited(id) {
                exited = Some((secs(now_ns() - start), st));
                break;
            }
            if ready_lost_at.is_none() && !self.cluster.ready(id).await {
                ready_lost_at = Some(secs(now_ns() - start));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if exited.is_none() {
            tokio::time::sleep(hold_until.saturating_duration_since(Instant::now())).await;
        }
        let _ = std::fs::remove_file(&filler);
        self.record(
            "disk-full",
            vec![id],
            format!(
                "node {id}'s data disk ({}) full for {:?}, then the filler deleted",
                disk.display(),
                self.timing.disk_full
            ),
            start,
        );
        match (&exited, ready_lost_at) {
            (Some((t, st)), _) => self.observe(format!("node {id} exited {t:.1}s into the disk-full fault: {st}")),
            (None, Some(t)) => {
                self.observe(format!("node {id} kept running but stopped answering /ready {t:.1}s into the fault"))
            }
            (None, None) => {
                self.observe(format!("node {id} kept running and answering /ready while its disk was full"))
            }
        }
        // What the node said about it.
        let text = std::fs::read(&log).unwrap_or_default();
        let text = String::from_utf8_lossy(&text[(log_from as usize).min(text.len())..]).to_string();
        let mut seen = Vec::new();
        for l in text.lines().filter(|l| l.contains("ERROR") || l.contains("WARN") || l.contains("panicked")) {
            let key: String = l.split_whitespace().skip(2).collect::<Vec<_>>().join(" ").chars().take(160).collect();
            if !seen.iter().any(|s: &String| s == &key) {
                seen.push(key);
            }
            if seen.len() >= 4 {
                break;
            }
        }
        if !seen.is_empty() {
            self.observe(format!("node {id} logged during the fault: {}", seen.join(" || ")));
        }
        // Recovery once space returned.
        let t = Instant::now();
        let mut recovered = false;
        if exited.is_none() {
            while t.elapsed() < Duration::from_secs(20) {
                if self.cluster.check_exited(id).is_some() {
                    self.observe(format!("node {id} exited after space returned"));
                    break;
                }
                if self.cluster.healthy().await.is_ok() {
                    recovered = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        if recovered {
            self.observe(format!(
                "node {id} recovered by itself {:.1}s after space returned (no restart)",
                t.elapsed().as_secs_f64()
            ));
        } else {
            let start = now_ns();
            let how_stop = if self.cluster.is_running(id) {
                self.observe(format!("node {id} did not recover within 20 s after space returned: restarting it"));
                self.cluster.stop(id, Duration::from_secs(20)).await
            } else {
                "had exited".to_string()
            };
            let how = self.restart(id).await;
            self.record(
                "restart",
                vec![id],
                format!("restart of node {id} to recover from the full disk ({how_stop}); {how}"),
                start,
            );
        }
        // Its data must reopen cleanly.
        if let Err(e) = self.cluster.wait_healthy(Duration::from_secs(60)).await {
            self.observe(format!("cluster not healthy after the disk-full recovery: {e}"));
        }
        let start = now_ns();
        let how_stop = self.cluster.stop(id, Duration::from_secs(20)).await;
        let how = self.restart(id).await;
        self.record(
            "restart",
            vec![id],
            format!("integrity restart of node {id} after the disk-full fault ({how_stop}); {how}"),
            start,
        );
        Ok(())
    }
}

fn dir_size(p: &std::path::Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += dir_size(&e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}
