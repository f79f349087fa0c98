//! The client timeout of every produce call, on one timer ([`Watchdog`]).
//!
//! Contract: a call watched with a deadline sees [`Deadline::fired`] set, and its task woken, once
//! simulated time reaches the deadline (or up to 1 ms later, see [`Watchdog`]); a call that ended
//! sets [`Deadline::ended`] and is forgotten. The watchdog task must run while calls are watched.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::Duration;

use super::{lock, sim_now_ns};

/// One call's deadline, as the [`Watchdog`] holds it.
#[derive(Default)]
pub(super) struct Deadline {
    /// The deadline passed: the client gives up.
    pub(super) fired: AtomicBool,
    /// The call ended: the watchdog forgets it.
    pub(super) ended: AtomicBool,
    /// The call's task, woken when the deadline fires.
    pub(super) waker: Mutex<Option<Waker>>,
}

impl Deadline {
    fn fire(&self) {
        self.fired.store(true, Ordering::Release);
        if let Some(waker) = lock(&self.waker).take() {
            waker.wake();
        }
    }
}

/// The client timeout of every produce call, on one timer. A madsim timer costs about a thousand
/// instructions to add, expire and poll, and a call's timer outlives the call (madsim cannot cancel
/// one): a timer per call was a timer per record. Produce calls share one timeout, so their deadlines
/// arrive in order: the watchdog sleeps until the oldest deadline of a call still running, fires the
/// deadlines that passed and forgets the calls that ended, so in a healthy run it wakes about once per
/// timeout. A deadline fires at its instant, or up to 1 ms later when it follows the one before it by
/// less than madsim's shortest sleep.
#[derive(Default)]
pub(super) struct Watchdog {
    /// (deadline in simulated ns, the call's), in deadline order.
    queue: Mutex<VecDeque<(u64, Arc<Deadline>)>>,
    /// A deadline entered at the front of the queue: the watchdog's sleep is too long.
    earlier: tokio::sync::Notify,
}

impl Watchdog {
    /// Watches a call that gives up at `at_ns`.
    pub(super) fn watch(&self, at_ns: u64) -> Arc<Deadline> {
        let deadline = Arc::new(Deadline::default());
        let mut queue = lock(&self.queue);
        // Deadlines come in order (one timeout, a clock that never goes back): the back, normally.
        let position = queue.partition_point(|(queued_ns, _)| *queued_ns <= at_ns);
        queue.insert(position, (at_ns, deadline.clone()));
        if position == 0 {
            self.earlier.notify_one();
        }
        deadline
    }

    /// Fires the deadlines due at `now_ns` and drops the ended calls ahead of the first still running;
    /// returns that one's deadline.
    fn expire(&self, now_ns: u64) -> Option<u64> {
        let mut queue = lock(&self.queue);
        while let Some((at_ns, deadline)) = queue.front() {
            if !deadline.ended.load(Ordering::Acquire) {
                if *at_ns > now_ns {
                    return Some(*at_ns);
                }
                deadline.fire();
            }
            queue.pop_front();
        }
        None
    }

    /// Fires deadlines as they pass; runs for the whole run.
    pub(super) async fn run(self: Arc<Self>) {
        loop {
            let now = sim_now_ns();
            match self.expire(now) {
                None => self.earlier.notified().await,
                Some(at_ns) => {
                    tokio::select! {
                        biased;
                        () = self.earlier.notified() => {}
                        () = tokio::time::sleep(Duration::from_nanos(at_ns - now)) => {}
                    }
                }
            }
        }
    }
}
