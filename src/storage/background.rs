//! One thread per node, at a lower priority, for the snapshot work: encoding a shard's state and
//! writing the file.
//!
//! A snapshot of a shard is several MiB (the twins and the retry window). Encoding and writing one
//! takes tens of milliseconds of a core, and it comes back every few seconds somewhere in a node
//! under write load. On the blocking pool at the default priority that work took its share of the
//! cores from the threads serving requests, and the seconds with a snapshot in them were the slowest
//! of a half-load run. Here it still gets every idle cycle, and yields when request work wants the
//! core too, like fjall's own background threads ([`super::store::BACKGROUND_NICE`]). Nothing that
//! acknowledges a write waits for it: openraft builds snapshots beside the log and apply.
//!
//! One thread: snapshots of a node's groups are taken one after the other anyway (see
//! `Shards::snapshot_heavy_groups`), and one at a time keeps their memory bounded.

use std::io;
use std::sync::mpsc;

use super::store::BACKGROUND_NICE;

type Job = Box<dyn FnOnce() + Send>;

/// The handle; jobs run in submission order. The thread ends when every handle is dropped.
#[derive(Clone)]
pub struct Background {
    jobs: mpsc::Sender<Job>,
}

impl Background {
    /// Starts the thread (named `name`). If its priority cannot be lowered, it runs at the default one.
    pub fn start(name: &str) -> io::Result<Background> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new().name(name.into()).spawn(move || {
            if let Err(e) = rustix::process::setpriority_process(None, BACKGROUND_NICE) {
                tracing::warn!(error = %e, "could not lower the priority of the snapshot thread");
            }
            for job in queue {
                job();
            }
        })?;
        Ok(Background { jobs })
    }

    /// Runs `f` on the thread and waits for its result. A job that panics fails with an error, and
    /// the thread goes on with the next.
    pub async fn run<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> io::Result<R> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(result);
        });
        self.jobs.send(job).map_err(|_| io::Error::other("the snapshot thread has stopped"))?;
        match rx.await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err(io::Error::other("a snapshot job panicked")),
            Err(_) => Err(io::Error::other("the snapshot thread has stopped")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn jobs_run_in_order_at_the_lower_priority_and_a_panic_fails_only_its_job() {
        let own = rustix::process::getpriority_process(None).expect("own priority");
        let bg = Background::start("bg-test").expect("start");
        let nice = bg.run(|| rustix::process::getpriority_process(None).expect("priority")).await.expect("run");
        assert_eq!(nice, BACKGROUND_NICE);
        assert_eq!(rustix::process::getpriority_process(None).expect("own priority"), own, "the caller's changed");
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let runs: Vec<_> = (0..5)
            .map(|i| {
                let order = order.clone();
                bg.run(move || order.lock().unwrap().push(i))
            })
            .collect();
        for r in futures::future::join_all(runs).await {
            r.expect("run");
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        let failed = bg.run(|| -> u8 { panic!("a job that fails") }).await;
        assert!(failed.is_err());
        assert_eq!(bg.run(|| 7).await.expect("the thread goes on"), 7);
    }
}
