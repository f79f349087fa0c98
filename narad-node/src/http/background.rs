//! A small pool of threads for the CPU work a request can ask for beyond its own handling: argon2id
//! password verification and batch body decompression. They run under `SCHED_IDLE` (and at nice
//! [`NICE`] where that policy is refused), so when the cores are saturated (a flood of gzip bombs or
//! of logins) the async threads that answer produces get the CPU first, and produce latency holds
//! while the expensive requests wait.
//!
//! Why `SCHED_IDLE` and not only nice 19: the scheduler lets a waking normal thread preempt an
//! idle-policy thread at once, while a nice-19 thread that has just been given a core may keep it for
//! the rest of its slice (milliseconds), and a produce woken behind it waits that long.
//!
//! Threads are started on first use, half the cores (at least one). On Linux both the nice value and
//! the policy are set per thread; a thread that cannot lower its priority runs at the default one.

use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

/// The pool threads' nice value.
pub const NICE: i32 = 19;

type Job = Box<dyn FnOnce() + Send + 'static>;

fn pool() -> &'static Mutex<mpsc::Sender<Job>> {
    static POOL: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    POOL.get_or_init(|| {
        let (sender, receiver) = mpsc::channel::<Job>();
        let receiver = std::sync::Arc::new(Mutex::new(receiver));
        let threads = (std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
            / 2)
        .max(1);
        for index in 0..threads {
            let receiver = receiver.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("narad-background-{index}"))
                .spawn(move || {
                    lower_priority();
                    loop {
                        let job = match receiver.lock() {
                            Ok(receiver) => receiver.recv(),
                            Err(poisoned) => poisoned.into_inner().recv(),
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                });
            if let Err(error) = spawned {
                tracing::error!(%error, "could not start a background CPU thread");
            }
        }
        Mutex::new(sender)
    })
}

fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        use thread_priority::{
            set_thread_priority_and_policy, thread_native_id, NormalThreadSchedulePolicy,
            ThreadPriority, ThreadSchedulePolicy,
        };
        if let Err(error) = set_thread_priority_and_policy(
            thread_native_id(),
            ThreadPriority::Min,
            ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle),
        ) {
            tracing::debug!(?error, "background CPU thread keeps the normal policy");
        }
    }
    // After the policy, which resets the nice value. `None`: the caller, which on Linux is this
    // thread, not the whole process.
    if let Err(error) = rustix::process::setpriority_process(None, NICE) {
        tracing::debug!(%error, "background CPU thread keeps the default nice value");
    }
}

/// Runs `work` on the pool and waits for its value; a panic in `work` resumes here. If the pool
/// could not start a thread, `work` runs on tokio's blocking pool instead.
pub async fn run<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        let _ = reply.send(outcome);
    });
    let sent = pool()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send(job);
    let outcome = match sent {
        Ok(()) => answer.await,
        Err(mpsc::SendError(job)) => {
            let _ = tokio::task::spawn_blocking(job).await;
            answer.await
        }
    };
    match outcome {
        Ok(Ok(value)) => value,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("a background job was dropped unanswered"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_at_a_lower_priority_and_panics_come_back() {
        let nice = run(|| rustix::process::getpriority_process(None).unwrap()).await;
        assert_eq!(nice, NICE);
        #[cfg(target_os = "linux")]
        {
            use thread_priority::{NormalThreadSchedulePolicy, ThreadSchedulePolicy};
            let policy = run(|| thread_priority::thread_schedule_policy().unwrap()).await;
            assert_eq!(
                policy,
                ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle)
            );
            assert_ne!(thread_priority::thread_schedule_policy().unwrap(), policy);
        }
        let ours = rustix::process::getpriority_process(None).unwrap();
        assert_ne!(ours, NICE, "only the pool's threads are reniced");
        assert_eq!(run(|| 6 * 7).await, 42);
        let panicked = tokio::spawn(run(|| -> u8 { panic!("boom") })).await;
        assert!(panicked.is_err());
        assert_eq!(run(|| 1).await, 1, "the pool survives a panicking job");
    }
}
