//! How much of the machine's CPU the hypervisor took ("steal", the kernel's count of the time a virtual
//! CPU was ready to run but the host ran something else), from the first line of `/proc/stat`; and how
//! busy each CPU was, from its own line.
//!
//! The benches share one virtual machine among the clients and every node, so a neighbour on the host
//! that takes a fifth or a third of the CPU for a few seconds slows everything in them at once. A
//! latency phase measured at a fraction of a maximum that was measured before the neighbour came is
//! then far closer to the machine's limit than its label says, and its tail says more about the host
//! than about the system under test. Every per-second line and every phase therefore carries the
//! steal of its own interval, so such a run can be told apart from a slow server.
//!
//! Each CPU's busy share matters for the same reason. A guest kernel may keep a partly loaded machine's
//! work on fewer CPUs than it has (to spare the host): then one CPU runs flat out, with threads queued
//! on it, while another is partly idle, and a phase at "half" of the maximum has no headroom where its
//! threads run although the machine as a whole looks a fifth idle.

/// The machine's CPU time since boot, in the kernel's clock ticks: all CPUs together, and each one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuTimes {
    /// Every state the kernel counts: user, nice, system, idle, iowait, irq, softirq, steal (guest
    /// time is already inside user and nice).
    pub total: u64,
    pub steal: u64,
    /// Each CPU's (`cpuN` lines, in their order) busy ticks and all its ticks; busy is every state but
    /// idle, iowait and steal.
    pub per_cpu: Vec<(u64, u64)>,
}

/// The first eight counters of a `/proc/stat` CPU line (after its name).
fn counters(line: &str) -> Option<[u64; 8]> {
    let fields: Vec<u64> = line.split_whitespace().skip(1).take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    fields.try_into().ok()
}

impl CpuTimes {
    /// Reads `/proc/stat`; `None` where there is none (not Linux) or it cannot be read.
    pub fn now() -> Option<CpuTimes> {
        CpuTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The `cpu` and `cpuN` lines of a `/proc/stat` text. Kernels before 2.6.11 had no steal column:
    /// `None`.
    pub fn parse(stat: &str) -> Option<CpuTimes> {
        let line = stat.lines().find(|l| l.split_whitespace().next() == Some("cpu"))?;
        let all = counters(line)?;
        let per_cpu = stat
            .lines()
            .filter(|l| l.strip_prefix("cpu").is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit())))
            .filter_map(counters)
            .map(|c| {
                let total: u64 = c.iter().sum();
                (total.saturating_sub(c[3] + c[4] + c[7]), total)
            })
            .collect();
        Some(CpuTimes { total: all.iter().sum(), steal: all[7], per_cpu })
    }

    /// The hypervisor's share of the machine's CPU time between `earlier` and `self`, in percent;
    /// `None` if no time passed (or the counters went back, which a reboot would do).
    pub fn steal_pct_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total).filter(|t| *t > 0)?;
        let steal = self.steal.checked_sub(earlier.steal)?;
        Some(100.0 * steal as f64 / total as f64)
    }

    /// How busy each CPU was between `earlier` and `self`, in percent, in the kernel's order; `None`
    /// if the CPUs changed (one went offline), no time passed on one of them, or the counters went back.
    pub fn busy_pct_since(&self, earlier: &CpuTimes) -> Option<Vec<f64>> {
        if self.per_cpu.len() != earlier.per_cpu.len() || self.per_cpu.is_empty() {
            return None;
        }
        self.per_cpu
            .iter()
            .zip(&earlier.per_cpu)
            .map(|((busy, total), (busy0, total0))| {
                let t = total.checked_sub(*total0).filter(|t| *t > 0)?;
                Some(100.0 * busy.checked_sub(*busy0)? as f64 / t as f64)
            })
            .collect()
    }
}

/// Steal between two optional readings, as the recorder holds them.
pub fn pct_between(earlier: Option<&CpuTimes>, later: Option<&CpuTimes>) -> Option<f64> {
    later?.steal_pct_since(earlier?)
}

/// Each CPU's busy share between two optional readings.
pub fn busy_between(earlier: Option<&CpuTimes>, later: Option<&CpuTimes>) -> Option<Vec<f64>> {
    later?.busy_pct_since(earlier?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 5 50 800 10 1 4 30 7 0\ncpu0 50 2 25 400 5 1 2 15 3 0\nintr 1 2 3\n";

    #[test]
    fn reads_the_machine_line_for_steal_and_each_cpu_s_line_for_its_busy_time() {
        // cpu0: 50+2+25+1+2 busy (idle 400, iowait 5, steal 15 not), 500 in all.
        assert_eq!(CpuTimes::parse(STAT), Some(CpuTimes { total: 1000, steal: 30, per_cpu: vec![(80, 500)] }));
    }

    #[test]
    fn steal_is_a_share_of_the_interval() {
        let a = CpuTimes { total: 1000, steal: 30, per_cpu: vec![] };
        let b = CpuTimes { total: 1200, steal: 80, per_cpu: vec![] };
        assert_eq!(b.steal_pct_since(&a), Some(25.0));
        assert_eq!(a.steal_pct_since(&a), None, "no time passed");
        assert_eq!(a.steal_pct_since(&b), None, "counters went back");
        assert_eq!(pct_between(Some(&a), None), None);
    }

    #[test]
    fn each_cpu_s_busy_share_is_of_its_own_interval() {
        let a = CpuTimes { total: 0, steal: 0, per_cpu: vec![(100, 1000), (100, 1000)] };
        let b = CpuTimes { total: 0, steal: 0, per_cpu: vec![(199, 1100), (160, 1100)] };
        assert_eq!(b.busy_pct_since(&a), Some(vec![99.0, 60.0]));
        assert_eq!(busy_between(Some(&a), Some(&b)), Some(vec![99.0, 60.0]));
        assert_eq!(a.busy_pct_since(&a), None, "no time passed");
        let fewer = CpuTimes { per_cpu: vec![(199, 1100)], ..b.clone() };
        assert_eq!(fewer.busy_pct_since(&a), None, "a CPU went offline");
        assert_eq!(a.busy_pct_since(&b), None, "counters went back");
    }

    #[test]
    fn refuses_what_is_not_a_stat_line() {
        assert_eq!(CpuTimes::parse(""), None);
        assert_eq!(CpuTimes::parse("cpu  1 2 3"), None, "no steal column");
        assert_eq!(CpuTimes::parse("cpu  1 2 3 4 5 6 7 x"), None);
    }
}
