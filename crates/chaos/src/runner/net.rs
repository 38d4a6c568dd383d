//! The test network: one network namespace per node (`thS-nI`, address 10.(78+S).0.(10+I)), each joined
//! by a veth pair to the bridge `thS-br` (10.(78+S).0.1) in the root namespace, where the clients run.
//! Links are cut with iptables DROP rules in a chain `CHAOS` inside a node's namespace (hooked into INPUT
//! and OUTPUT); healing flushes that chain. Nothing leaves these namespaces and the bridge.
//!
//! `S` is the network slot, `TWINHUB_CHAOS_NET` (0–9, default 0): runs in different slots use different
//! names and subnets, so two runs on one machine (a long soak and CI) do not tear down each other's
//! network. Cleanup only ever touches its own slot.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

const CHAIN: &str = "CHAOS";

/// This run's network slot (see the module doc).
pub fn slot() -> u8 {
    static SLOT: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    *SLOT.get_or_init(|| {
        std::env::var("TWINHUB_CHAOS_NET")
            .ok()
            .and_then(|v| v.trim().parse::<u8>().ok())
            .filter(|s| *s <= 9)
            .unwrap_or(0)
    })
}

pub fn bridge() -> String {
    format!("th{}-br", slot())
}

fn ns_prefix() -> String {
    format!("th{}-n", slot())
}

fn veth_prefix() -> String {
    format!("th{}v", slot())
}

pub fn bridge_ip() -> Ipv4Addr {
    Ipv4Addr::new(10, 78 + slot(), 0, 1)
}

pub fn ns_name(id: u64) -> String {
    format!("{}{id}", ns_prefix())
}

pub fn node_ip(id: u64) -> Ipv4Addr {
    Ipv4Addr::new(10, 78 + slot(), 0, 10 + id as u8)
}

/// Runs a command; an error carries its stderr.
pub fn run(cmd: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd} {}", args.join(" ")))?;
    if !out.status.success() {
        bail!("{cmd} {} failed ({}): {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

fn in_ns(id: u64, cmd: &str, args: &[&str]) -> Result<String> {
    let ns = ns_name(id);
    let mut full = vec!["netns", "exec", ns.as_str(), cmd];
    full.extend_from_slice(args);
    run("ip", &full)
}

/// Namespaces of ours that exist now (from an earlier or a crashed run too).
pub fn our_namespaces() -> Vec<String> {
    run("ip", &["netns", "list"])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| {
            n.strip_prefix(ns_prefix().as_str())
                .is_some_and(|rest| !rest.is_empty() && rest.chars().all(|c| c.is_ascii_digit()))
        })
        .map(str::to_string)
        .collect()
}

/// Pids of the processes inside one of our namespaces (only processes this harness started live there).
pub fn pids_in(ns: &str) -> Vec<i32> {
    run("ip", &["netns", "pids", ns]).unwrap_or_default().split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// Creates the bridge and one namespace per node. Assumes `teardown` ran before.
pub fn setup(ids: &[u64]) -> Result<()> {
    let bridge = bridge();
    run("ip", &["link", "add", &bridge, "type", "bridge"])?;
    run("ip", &["addr", "add", &format!("{}/24", bridge_ip()), "dev", &bridge])?;
    run("ip", &["link", "set", &bridge, "up"])?;
    for &id in ids {
        let ns = ns_name(id);
        let host_end = format!("{}{id}", veth_prefix());
        let ns_end = format!("th{}p{id}", slot());
        run("ip", &["netns", "add", &ns])?;
        in_ns(id, "ip", &["link", "set", "lo", "up"])?;
        run("ip", &["link", "add", &host_end, "type", "veth", "peer", "name", &ns_end])?;
        run("ip", &["link", "set", &ns_end, "netns", &ns])?;
        run("ip", &["link", "set", &host_end, "master", &bridge])?;
        run("ip", &["link", "set", &host_end, "up"])?;
        in_ns(id, "ip", &["addr", "add", &format!("{}/24", node_ip(id)), "dev", &ns_end])?;
        in_ns(id, "ip", &["link", "set", &ns_end, "up"])?;
        in_ns(id, "iptables", &["-N", CHAIN])?;
        in_ns(id, "iptables", &["-I", "INPUT", "-j", CHAIN])?;
        in_ns(id, "iptables", &["-I", "OUTPUT", "-j", CHAIN])?;
    }
    Ok(())
}

/// Kills every process left in our namespaces (SIGCONT first: a stopped process must die too), then
/// deletes the namespaces and the bridge. Safe to call when nothing exists.
pub fn teardown() {
    for ns in our_namespaces() {
        for pid in pids_in(&ns) {
            unsafe {
                libc::kill(pid, libc::SIGCONT);
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
    for ns in our_namespaces() {
        // Wait (briefly) for the processes to be gone, or the namespace lingers.
        for _ in 0..50 {
            if pids_in(&ns).is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = run("ip", &["netns", "del", &ns]);
    }
    let links = run("ip", &["-o", "link", "show"]).unwrap_or_default();
    for l in links.lines() {
        if let Some(name) = l.split(':').nth(1).map(|s| s.trim().split('@').next().unwrap_or("").to_string()) {
            if name.starts_with(veth_prefix().as_str()) || name == bridge() {
                let _ = run("ip", &["link", "del", &name]);
            }
        }
    }
}

/// Which traffic of `node` to drop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Packets from the peer to `node`.
    In,
    /// Packets from `node` to the peer.
    Out,
    Both,
}

/// Drops traffic between `node` and `peer` (node-to-node only: clients on the bridge still reach both).
pub fn cut(node: u64, peer: u64, dir: Direction) -> Result<()> {
    let ip = node_ip(peer).to_string();
    if matches!(dir, Direction::In | Direction::Both) {
        in_ns(node, "iptables", &["-A", CHAIN, "-s", &ip, "-j", "DROP"])?;
    }
    if matches!(dir, Direction::Out | Direction::Both) {
        in_ns(node, "iptables", &["-A", CHAIN, "-d", &ip, "-j", "DROP"])?;
    }
    Ok(())
}

/// Removes every cut on `node`.
pub fn heal(node: u64) -> Result<()> {
    in_ns(node, "iptables", &["-F", CHAIN]).map(|_| ())
}

/// The rules in force on `node` (for the report).
pub fn rules(node: u64) -> String {
    in_ns(node, "iptables", &["-S", CHAIN]).unwrap_or_default()
}

/// Opens `/var/run/netns/NAME` for `setns` in a child (see `cluster::spawn`).
pub fn ns_path(id: u64) -> String {
    format!("/var/run/netns/{}", ns_name(id))
}
