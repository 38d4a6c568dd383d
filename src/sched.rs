//! The CPU scheduling class of a node's threads.
//!
//! A write crosses many threads in small pieces: the front door reads a request, a frame goes to
//! the leader, the group-commit thread writes and syncs, a Raft round comes back, the answer is
//! written. Each hand-off wakes a thread. Under Linux's default class (`SCHED_OTHER`) a woken thread
//! may preempt the one running on its core at once, in the middle of its piece of work, which then
//! resumes later with its caches cold: on a busy machine a node spent about a tenth of its CPU
//! switching between its own threads and the other processes'.
//!
//! `SCHED_BATCH` is the same fair scheduler, with the same shares and nice values, minus that
//! wake-up preemption: a woken thread waits until the running one blocks or its time slice ends.
//! On an idle core a woken thread runs at once as before; on a busy one it waits for the scheduler's
//! tick to end the running thread's slice. Measured with three nodes on two cores
//! (benches/README.md): saturated, the nodes were preempted about 85 % less often (730 instead of
//! 5,000 times a second) and spent 5–8 % less CPU per update, less in each of twelve interleaved
//! pairs; below saturation every hop of a write may wait for a tick, and the p99 grew (at a quarter of
//! the maximum rate 7–10 ms instead of 5.4; at half of it over 20 ms in two sweeps of four). So the
//! default stays the system's class, and `--cpu-scheduling batch` is there for nodes that run
//! saturated, where throughput per core matters more than the tail of a partly loaded node.
//!
//! The class is set on the main thread before the runtime starts; every thread the node starts later
//! (runtime workers, the blocking pool, the group-commit writer, fjall's and the event broker's
//! threads) inherits it, as Linux threads inherit their creator's policy.

use std::str::FromStr;

/// How the node's threads are scheduled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuScheduling {
    /// `SCHED_BATCH` on Linux (elsewhere the system's default).
    Batch,
    /// The system's default class, with wake-up preemption.
    #[default]
    Normal,
}

impl FromStr for CpuScheduling {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        match s.trim() {
            v if v.eq_ignore_ascii_case("batch") => Ok(CpuScheduling::Batch),
            v if v.eq_ignore_ascii_case("normal") => Ok(CpuScheduling::Normal),
            _ => Err(()),
        }
    }
}

impl CpuScheduling {
    pub fn as_str(self) -> &'static str {
        match self {
            CpuScheduling::Batch => "batch",
            CpuScheduling::Normal => "normal",
        }
    }

    /// Puts the calling thread, and so every thread it starts from now on, in this class.
    /// `Normal` changes nothing: a process starts in the default class (or in whatever class its
    /// launcher chose, which is left alone).
    pub fn apply_to_current_thread(self) -> std::io::Result<()> {
        match self {
            CpuScheduling::Normal => Ok(()),
            CpuScheduling::Batch => set_batch(),
        }
    }
}

#[cfg(target_os = "linux")]
fn set_batch() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid, initialised sched_param that outlives the call; pid 0 names the
    // calling thread. Moving to SCHED_BATCH (priority 0) needs no privilege.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn set_batch() -> std::io::Result<()> {
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn policy() -> i32 {
        // SAFETY: no arguments besides the calling thread's id 0.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn parses_both_classes_and_nothing_else() {
        assert_eq!("batch".parse(), Ok(CpuScheduling::Batch));
        assert_eq!(" Normal ".parse(), Ok(CpuScheduling::Normal));
        assert_eq!("fifo".parse::<CpuScheduling>(), Err(()));
        assert_eq!("".parse::<CpuScheduling>(), Err(()));
        assert_eq!(CpuScheduling::default(), CpuScheduling::Normal);
    }

    #[test]
    fn batch_is_inherited_by_threads_started_afterwards() {
        // On a thread of its own, so that the test harness's threads keep their class.
        let (own, child) = std::thread::spawn(|| {
            CpuScheduling::Batch.apply_to_current_thread().expect("SCHED_BATCH needs no privilege");
            let child = std::thread::spawn(policy).join().expect("child thread");
            (policy(), child)
        })
        .join()
        .expect("test thread");
        assert_eq!(own, libc::SCHED_BATCH);
        assert_eq!(child, libc::SCHED_BATCH, "a thread started later inherits the class");
    }

    #[test]
    fn normal_leaves_the_class_alone() {
        let before = policy();
        let after = std::thread::spawn(move || {
            CpuScheduling::Normal.apply_to_current_thread().expect("no-op");
            policy()
        })
        .join()
        .expect("test thread");
        assert_eq!(after, before);
    }
}
