//! A few seconds' probe of how fast the machine is right now, taken before each system of a compare.
//!
//! On a shared virtual machine the same binary's CPU per update moves by a third between hours while
//! the hypervisor's steal stays near zero: the host is slower, not absent. Steal cannot show that, so
//! each system's row carries four fixed measurements taken just before it starts, on a quiet machine:
//!
//! - a hand-off between two threads on one CPU (a one-byte round trip over a socket pair: two system
//!   calls and two context switches each way), the kind of step a Raft round and an RPC are made of;
//! - the same between two CPUs, which on a guest whose idle CPUs halt also measures the host's wake-up;
//! - a loop of integer arithmetic (the core's speed, nothing else);
//! - a dependent walk over 16 MiB and over 128 MiB of memory, one cache line per step (the shared
//!   cache's and the memory's latency, which neighbours on the host compete for).
//!
//! Which of them moves with a system's CPU per update tells which kind of slowness that system is
//! sensitive to.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use serde_json::{json, Value};

/// How much of each measurement to take.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub same_cpu_round_trips: u32,
    pub cross_cpu_round_trips: u32,
    pub compute_steps: u64,
    pub small_walk_bytes: usize,
    pub large_walk_bytes: usize,
    pub walk_steps: usize,
}

/// About two seconds on an idle two-core guest, most of it the cross-CPU round trips and building
/// the 128 MiB walk.
pub const DEFAULT: Sizes = Sizes {
    same_cpu_round_trips: 20_000,
    cross_cpu_round_trips: 10_000,
    compute_steps: 100_000_000,
    small_walk_bytes: 16 << 20,
    large_walk_bytes: 128 << 20,
    walk_steps: 2_000_000,
};

/// What one probe measured. A hand-off is `None` where the threads could not be placed (no second CPU
/// to run on, or affinity refused).
#[derive(Clone, Debug)]
pub struct Probe {
    pub sizes: Sizes,
    pub handoff_same_cpu_us: Option<f64>,
    pub handoff_cross_cpu_us: Option<f64>,
    pub compute_ns_per_step: f64,
    pub small_walk_ns_per_step: f64,
    pub large_walk_ns_per_step: f64,
}

impl Probe {
    pub fn to_json(&self) -> Value {
        let sizes = &self.sizes;
        let r = |x: f64| (x * 1000.0).round() / 1000.0;
        json!({
            "handoff_same_cpu_us": self.handoff_same_cpu_us.map(r),
            "handoff_cross_cpu_us": self.handoff_cross_cpu_us.map(r),
            "compute_ns_per_step": r(self.compute_ns_per_step),
            "walk_small_ns_per_step": r(self.small_walk_ns_per_step),
            "walk_large_ns_per_step": r(self.large_walk_ns_per_step),
            "note": format!(
                "a one-byte round trip between two threads over a socket pair on one CPU ({} times) and on two ({}), µs each; {} steps of integer arithmetic, ns each; a dependent walk of {} steps, one cache line a step, over {} KiB (small) and {} KiB (large), ns each",
                sizes.same_cpu_round_trips, sizes.cross_cpu_round_trips, sizes.compute_steps, sizes.walk_steps,
                sizes.small_walk_bytes >> 10, sizes.large_walk_bytes >> 10
            ),
        })
    }

    /// One line for a log or a table.
    pub fn line(&self) -> String {
        let us = |v: Option<f64>| v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into());
        format!(
            "hand-off {} µs on one CPU, {} across; compute {:.3} ns/step; walk {} MiB {:.1} ns, {} MiB {:.1} ns",
            us(self.handoff_same_cpu_us),
            us(self.handoff_cross_cpu_us),
            self.compute_ns_per_step,
            self.sizes.small_walk_bytes >> 20,
            self.small_walk_ns_per_step,
            self.sizes.large_walk_bytes >> 20,
            self.large_walk_ns_per_step
        )
    }
}

/// Takes the probe (blocking: run it off the async runtime).
pub fn run(sizes: &Sizes) -> Probe {
    let cpus = allowed_cpus();
    let first = cpus.first().copied();
    let second = cpus.get(1).copied();
    Probe {
        sizes: *sizes,
        handoff_same_cpu_us: first.and_then(|c| handoff(c, c, sizes.same_cpu_round_trips)),
        handoff_cross_cpu_us: first.zip(second).and_then(|(a, b)| handoff(a, b, sizes.cross_cpu_round_trips)),
        compute_ns_per_step: compute(sizes.compute_steps),
        small_walk_ns_per_step: walk(sizes.small_walk_bytes, sizes.walk_steps),
        large_walk_ns_per_step: walk(sizes.large_walk_bytes, sizes.walk_steps),
    }
}

/// The CPUs this process may run on, in order.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `set` is a plain bit set the kernel fills in; its size is passed along.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> bool {
    // SAFETY: as in `allowed_cpus`; pid 0 is the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// Microseconds per one-byte round trip between a thread on `a` and one on `b`.
fn handoff(a: usize, b: usize, round_trips: u32) -> Option<f64> {
    let (mut near, mut far) = UnixStream::pair().ok()?;
    let echo = std::thread::spawn(move || -> Option<()> {
        if !pin(b) {
            return None;
        }
        let mut byte = [0u8; 1];
        loop {
            if far.read(&mut byte).ok()? == 0 {
                return Some(());
            }
            far.write_all(&byte).ok()?;
        }
    });
    let timed = std::thread::spawn(move || -> Option<f64> {
        if !pin(a) {
            return None;
        }
        let mut byte = [1u8; 1];
        // A few untimed trips, so that both threads are placed before the clock starts.
        for _ in 0..100 {
            near.write_all(&byte).ok()?;
            near.read_exact(&mut byte).ok()?;
        }
        let t = Instant::now();
        for _ in 0..round_trips {
            near.write_all(&byte).ok()?;
            near.read_exact(&mut byte).ok()?;
        }
        Some(t.elapsed().as_secs_f64() * 1e6 / f64::from(round_trips.max(1)))
    });
    let us = timed.join().ok().flatten();
    // The echo thread ends when `near`, dropped with the timed thread, closes.
    let echoed = echo.join().ok().flatten();
    us.filter(|_| echoed.is_some())
}

/// Nanoseconds per step of a dependent chain of multiplies, shifts and xors.
fn compute(steps: u64) -> f64 {
    let t = Instant::now();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..steps {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i);
        x ^= x >> 29;
    }
    std::hint::black_box(x);
    t.elapsed().as_secs_f64() * 1e9 / steps.max(1) as f64
}

/// Bytes of a cache line, the walk's stride.
const LINE: usize = 64;

/// Nanoseconds per step of a walk that visits the cache lines of `bytes` of memory in one random cycle,
/// each step's address read from the line before, so that no step can start before the last ends.
fn walk(bytes: usize, steps: usize) -> f64 {
    let next = cycle(bytes / LINE, 0x2545_f491_4f6c_dd1d);
    let t = Instant::now();
    let mut at = 0usize;
    for _ in 0..steps {
        at = next[at][0] as usize;
    }
    std::hint::black_box(at);
    t.elapsed().as_secs_f64() * 1e9 / steps.max(1) as f64
}

/// `lines` cache lines whose first word names the next line to visit, in one cycle through all of
/// them (Sattolo's shuffle), so the walk never settles in a part that fits a cache.
fn cycle(lines: usize, seed: u64) -> Vec<[u32; LINE / 4]> {
    let mut order: Vec<u32> = (0..lines as u32).collect();
    let mut s = seed | 1;
    for i in (1..lines).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let j = (s % i as u64) as usize;
        order.swap(i, j);
    }
    let mut next = vec![[0u32; LINE / 4]; lines];
    for (from, to) in order.iter().zip(order.iter().cycle().skip(1)) {
        next[*from as usize][0] = *to;
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_visits_every_line_once_per_cycle() {
        let next = cycle(1000, 7);
        let mut seen = vec![false; 1000];
        let mut at = 0usize;
        for _ in 0..1000 {
            assert!(!seen[at], "line {at} visited twice in one cycle");
            seen[at] = true;
            at = next[at][0] as usize;
        }
        assert_eq!(at, 0, "the cycle closes after every line");
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn a_small_probe_measures_every_part_it_can() {
        let sizes = Sizes {
            same_cpu_round_trips: 200,
            cross_cpu_round_trips: 200,
            compute_steps: 100_000,
            small_walk_bytes: 1 << 16,
            large_walk_bytes: 1 << 18,
            walk_steps: 10_000,
        };
        let p = run(&sizes);
        let cpus = allowed_cpus().len();
        assert!(cpus >= 1);
        assert!(p.handoff_same_cpu_us.is_some_and(|v| v > 0.0 && v.is_finite()), "{p:?}");
        assert_eq!(p.handoff_cross_cpu_us.is_some(), cpus >= 2, "{p:?}");
        for v in [p.compute_ns_per_step, p.small_walk_ns_per_step, p.large_walk_ns_per_step] {
            assert!(v > 0.0 && v.is_finite(), "{p:?}");
        }
        let j = p.to_json();
        assert!(j["walk_small_ns_per_step"].as_f64().is_some(), "{j}");
        assert!(j["note"].as_str().is_some_and(|n| n.contains("(200 times)") && n.contains("64 KiB")), "{j}");
    }
}
