//! How much of the machine's CPU the hypervisor took ("steal", the kernel's count of the time a virtual
//! CPU was ready to run but the host ran something else), from the first line of `/proc/stat`.
//!
//! The benches share one virtual machine among the clients and every node, so a neighbour on the host
//! that takes a fifth or a third of the CPU for a few seconds slows everything in them at once. A
//! latency phase measured at a fraction of a maximum that was measured before the neighbour came is
//! then far closer to the machine's limit than its label says, and its tail says more about the host
//! than about the system under test. Every per-second line and every phase therefore carries the
//! steal of its own interval, so such a run can be told apart from a slow server.

/// The machine's CPU time since boot, all CPUs together, in the kernel's clock ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTimes {
    /// Every state the kernel counts: user, nice, system, idle, iowait, irq, softirq, steal (guest
    /// time is already inside user and nice).
    pub total: u64,
    pub steal: u64,
}

impl CpuTimes {
    /// Reads `/proc/stat`; `None` where there is none (not Linux) or it cannot be read.
    pub fn now() -> Option<CpuTimes> {
        CpuTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The `cpu` line of a `/proc/stat` text. Kernels before 2.6.11 had no steal column: `None`.
    pub fn parse(stat: &str) -> Option<CpuTimes> {
        let line = stat.lines().find(|l| l.split_whitespace().next() == Some("cpu"))?;
        let fields: Vec<u64> =
            line.split_whitespace().skip(1).take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
        if fields.len() < 8 {
            return None;
        }
        Some(CpuTimes { total: fields.iter().sum(), steal: fields[7] })
    }

    /// The hypervisor's share of the machine's CPU time between `earlier` and `self`, in percent;
    /// `None` if no time passed (or the counters went back, which a reboot would do).
    pub fn steal_pct_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total).filter(|t| *t > 0)?;
        let steal = self.steal.checked_sub(earlier.steal)?;
        Some(100.0 * steal as f64 / total as f64)
    }
}

/// Between two optional readings, as the recorder holds them.
pub fn pct_between(earlier: Option<CpuTimes>, later: Option<CpuTimes>) -> Option<f64> {
    later?.steal_pct_since(&earlier?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 5 50 800 10 1 4 30 7 0\ncpu0 50 2 25 400 5 1 2 15 3 0\nintr 1 2 3\n";

    #[test]
    fn reads_the_machine_line_not_a_cpu_s() {
        assert_eq!(CpuTimes::parse(STAT), Some(CpuTimes { total: 1000, steal: 30 }));
    }

    #[test]
    fn steal_is_a_share_of_the_interval() {
        let a = CpuTimes { total: 1000, steal: 30 };
        let b = CpuTimes { total: 1200, steal: 80 };
        assert_eq!(b.steal_pct_since(&a), Some(25.0));
        assert_eq!(a.steal_pct_since(&a), None, "no time passed");
        assert_eq!(a.steal_pct_since(&b), None, "counters went back");
        assert_eq!(pct_between(Some(a), None), None);
    }

    #[test]
    fn refuses_what_is_not_a_stat_line() {
        assert_eq!(CpuTimes::parse(""), None);
        assert_eq!(CpuTimes::parse("cpu  1 2 3"), None, "no steal column");
        assert_eq!(CpuTimes::parse("cpu  1 2 3 4 5 6 7 x"), None);
    }
}
