//! The process's file descriptors, shared out between listeners so that a flood of connections on
//! one port can never take the descriptors another port, the storage engine or the cluster links need.
//!
//! At start the soft `RLIMIT_NOFILE` is raised to the hard limit (what systemd's `LimitNOFILE` or
//! `ulimit -Hn` allow). A reserve stays for everything that is not an accepted connection (log and
//! state files, outbound peer links, the event broker's internal sockets); the rest is divided between
//! the listeners. An operator can set any listener's cap; the ones left unset share what remains.

/// Descriptors kept for everything that is not an accepted connection.
const RESERVE_MIN: u64 = 512;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the soft limit now in force.
pub fn raise_nofile_limit() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

/// Per-listener connection caps carved from the descriptor limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FdBudget {
    pub https: usize,
    pub mqtt: usize,
    pub events: usize,
    pub cluster: usize,
    /// Descriptors left for files and outbound sockets.
    pub reserve: u64,
}

/// Caps an operator set explicitly (`None`: derive from the descriptor limit).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CapOverrides {
    pub https: Option<usize>,
    pub mqtt: Option<usize>,
    pub events: Option<usize>,
    pub cluster: Option<usize>,
}

impl FdBudget {
    /// Shares `nofile` descriptors out: a reserve (a tenth, at least 512), then HTTPS up to 4,096,
    /// the event broker up to 1,024 and the cluster port up to 256 (each at most a tenth of what is
    /// left), and everything else to MQTT, which is where fleets connect. Explicit caps are taken as
    /// given; if they add up to more than the limit, the node still starts but says so.
    pub fn from_limit(nofile: u64, o: &CapOverrides) -> FdBudget {
        let reserve = (nofile / 10).max(RESERVE_MIN).min(nofile / 2);
        let usable = nofile.saturating_sub(reserve);
        let tenth = (usable / 10) as usize;
        let https = o.https.unwrap_or(tenth.clamp(16, 4096));
        let events = o.events.unwrap_or(tenth.clamp(16, 1024));
        let cluster = o.cluster.unwrap_or(tenth.clamp(16, 256));
        let rest = (usable as usize).saturating_sub(https + events + cluster);
        let mqtt = o.mqtt.unwrap_or(rest.max(16));
        let b = FdBudget { https, mqtt, events, cluster, reserve };
        if b.total() + reserve > nofile {
            tracing::warn!(
                nofile,
                https,
                mqtt,
                events,
                cluster,
                "the connection caps add up to more than RLIMIT_NOFILE allows: a flood on one port may starve the others; raise LimitNOFILE or lower the caps"
            );
        }
        b
    }

    pub fn total(&self) -> u64 {
        (self.https + self.mqtt + self.events + self.cluster) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_fit_the_limit() {
        for nofile in [1024u64, 4096, 20_000, 1_048_576] {
            let b = FdBudget::from_limit(nofile, &CapOverrides::default());
            assert!(b.total() + b.reserve <= nofile, "{nofile}: {b:?}");
            assert!(b.mqtt >= b.https, "{nofile}: {b:?}");
        }
        let b = FdBudget::from_limit(20_000, &CapOverrides::default());
        assert_eq!((b.https, b.events, b.cluster), (1800, 1024, 256));
    }

    #[test]
    fn overrides_are_taken() {
        let o = CapOverrides { https: Some(10), mqtt: Some(20), ..Default::default() };
        let b = FdBudget::from_limit(20_000, &o);
        assert_eq!((b.https, b.mqtt), (10, 20));
    }

    #[test]
    fn raise_returns_a_limit() {
        assert!(raise_nofile_limit() >= 16);
    }
}
