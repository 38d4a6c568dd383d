//! Choosing loopback ports for processes that a launcher starts (a local cluster, a bench's peers).

use std::net::TcpListener;

/// Ports below this are left to well-known services.
const FLOOR: u16 = 10_000;

/// `n` distinct free loopback ports. The listeners are held until every port is chosen.
///
/// They come from below the kernel's ephemeral range. A port found by binding port 0 lies inside
/// that range, and between our releasing it and the child binding it, any outgoing connection on the
/// machine may take it as its source port (a busy test run or a host full of clients does so often).
/// Below the range a port is only taken by someone who binds it on purpose.
pub fn free_loopback_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let low = ephemeral_low().unwrap_or(32_768);
    let mut held = Vec::with_capacity(n);
    if low > FLOOR + 1_000 {
        let span = low - FLOOR;
        let start = rand::Rng::gen_range(&mut rand::thread_rng(), 0..span);
        for i in 0..span {
            if held.len() == n {
                break;
            }
            if let Ok(l) = TcpListener::bind(("127.0.0.1", FLOOR + (start + i) % span)) {
                held.push(l);
            }
        }
    }
    // A kernel whose ephemeral range starts low leaves no such room: fall back to port 0.
    while held.len() < n {
        held.push(TcpListener::bind("127.0.0.1:0")?);
    }
    held.iter().map(|l| l.local_addr().map(|a| a.port())).collect()
}

/// Where the kernel's ephemeral port range starts (Linux).
fn ephemeral_low() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let ports = free_loopback_ports(40).expect("ports");
        assert_eq!(ports.len(), 40);
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 40, "distinct: {ports:?}");
        if let Some(low) = ephemeral_low().filter(|l| *l > FLOOR + 1_000) {
            assert!(ports.iter().all(|p| (FLOOR..low).contains(p)), "{ports:?} not in {FLOOR}..{low}");
        }
        // Released: each can be bound again by the process that will use it.
        for p in ports {
            TcpListener::bind(("127.0.0.1", p)).unwrap_or_else(|e| panic!("port {p}: {e}"));
        }
    }
}
