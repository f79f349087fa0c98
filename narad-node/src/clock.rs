//! The node's clocks: the only place the node reads time.
//!
//! - [`Clock::now`] is the monotonic clock the actors take as `now` (`narad_core::time::Instant`,
//!   nanoseconds since the clock was made). It reads `tokio::time::Instant`, which is virtual under
//!   madsim, so simulated runs replay.
//! - [`unix_ms`] / [`unix_s`] read the wall clock for values stored in records (accept time, topic
//!   creation time). madsim intercepts the underlying `clock_gettime`, so these are simulated too.
//! - [`WakeTimer`] is a host loop's one wake-up timer, moved as the actors' earliest timeout moves.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use narad_core::time::Instant;

/// The node's monotonic clock, anchored when it was made.
///
/// Under `--cfg madsim` it keeps the runtime's time handle and reads the elapsed virtual time from it:
/// the same nanoseconds `tokio::time::Instant::now()` gives there (madsim's `clock_gettime` is its
/// base plus that elapsed time), without finding the runtime and converting through a `timespec` on
/// every read (the node reads its clock several times per record).
#[derive(Clone, Debug)]
pub struct Clock {
    start: tokio::time::Instant,
    /// The runtime's time source (madsim).
    #[cfg(madsim)]
    time: SimTime,
    /// The runtime's elapsed virtual time when the clock was made (madsim).
    #[cfg(madsim)]
    start_elapsed: std::time::Duration,
}

/// madsim's time handle, with a `Debug` for [`Clock`].
#[cfg(madsim)]
#[derive(Clone)]
struct SimTime(madsim::time::TimeHandle);

#[cfg(madsim)]
impl std::fmt::Debug for SimTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimTime")
    }
}

impl Clock {
    /// A clock whose zero is now.
    pub fn start() -> Self {
        #[cfg(madsim)]
        {
            let time = madsim::time::TimeHandle::current();
            let start_elapsed = time.elapsed();
            Clock {
                start: tokio::time::Instant::now(),
                time: SimTime(time),
                start_elapsed,
            }
        }
        #[cfg(not(madsim))]
        Clock {
            start: tokio::time::Instant::now(),
        }
    }

    /// Nanoseconds since the clock was made, as the actors' `now`.
    pub fn now(&self) -> Instant {
        #[cfg(madsim)]
        let elapsed = self.time.0.elapsed().saturating_sub(self.start_elapsed);
        #[cfg(not(madsim))]
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.start);
        Instant::from_nanos(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Wall-clock time, Unix milliseconds, as [`unix_ms`] reads it. Under `--cfg madsim` it reads the
    /// runtime's simulated wall clock from the kept handle (what madsim's `clock_gettime` returns for
    /// `SystemTime::now`), for the reads made per record.
    pub fn unix_ms(&self) -> u64 {
        #[cfg(madsim)]
        {
            self.time
                .0
                .now_time()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| {
                    u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
                })
        }
        #[cfg(not(madsim))]
        unix_ms()
    }

    /// The real (or simulated) instant of an actor's `Instant`, for sleeping until a timeout.
    pub fn to_tokio(&self, instant: Instant) -> tokio::time::Instant {
        self.start + std::time::Duration::from_nanos(instant.as_nanos())
    }
}

/// A host loop's wake-up timer: a `tokio::time::Sleep` that [`WakeTimer::reset`] moves, polled in the
/// loop on every turn.
///
/// Under `--cfg madsim` every poll of a pending `Sleep` files one more timer event (madsim's timer has
/// no cancellation): a loop that turns per message would file thousands that then fire as spurious
/// wake-ups, most of a simulated run's cost. So there the `Sleep` is the wake-up filed with madsim, and
/// the deadline is kept beside it: a poll files a new wake-up only when none is pending at or before
/// the deadline. A deadline moved later (a commit answered, the next one's deadline further out) keeps
/// the wake-up already filed, which wakes the loop early once, and only then is the later deadline
/// filed. That relies on being polled by one task, which a host loop is. Elsewhere it is the plain
/// `Sleep`.
#[derive(Debug)]
pub struct WakeTimer {
    /// Under madsim: the wake-up last filed (its deadline is when), once `filed`.
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// When the timer fires.
    #[cfg(madsim)]
    deadline: tokio::time::Instant,
    /// Whether `sleep` was polled at its deadline (madsim holds, or held, a wake-up for it).
    #[cfg(madsim)]
    filed: bool,
}

impl WakeTimer {
    /// A timer that fires at `deadline`.
    pub fn at(deadline: tokio::time::Instant) -> Self {
        WakeTimer {
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            #[cfg(madsim)]
            deadline,
            #[cfg(madsim)]
            filed: false,
        }
    }

    /// Moves the timer to `deadline` (whether or not it fired).
    pub fn reset(&mut self, deadline: tokio::time::Instant) {
        #[cfg(madsim)]
        {
            self.deadline = deadline;
        }
        #[cfg(not(madsim))]
        self.sleep.as_mut().reset(deadline);
    }
}

impl Future for WakeTimer {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        #[cfg(madsim)]
        {
            let filed_at = self.sleep.deadline();
            if self.filed && filed_at <= self.deadline {
                if !self.sleep.is_elapsed() {
                    // A wake-up still to come, no later than the deadline, wakes this task in time.
                    return Poll::Pending;
                }
                if filed_at == self.deadline {
                    return Poll::Ready(());
                }
            }
            // None filed, or it is late, or it fired early: file the deadline (or fire if it passed).
            let deadline = self.deadline;
            self.sleep.as_mut().reset(deadline);
            self.filed = true;
        }
        self.sleep.as_mut().poll(cx)
    }
}

/// Wall-clock time, Unix milliseconds (0 if the clock is before 1970).
#[allow(clippy::disallowed_methods)] // The node's one wall-clock read.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

/// Wall-clock time, Unix seconds.
pub fn unix_s() -> u64 {
    unix_ms() / 1000
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn wake_timer_fires_at_its_deadline_and_reset_moves_it() {
        let now = tokio::time::Instant::now();
        let mut timer = WakeTimer::at(now + Duration::from_secs(3600));
        // An hour away: still pending after a short wait (polled more than once meanwhile).
        assert!(tokio::time::timeout(Duration::from_millis(20), &mut timer)
            .await
            .is_err());
        // Moved to a deadline that passed: fires at once.
        timer.reset(now);
        assert!(tokio::time::timeout(Duration::from_secs(10), &mut timer)
            .await
            .is_ok());
        // Moved again after firing: pending again until the new deadline.
        timer.reset(tokio::time::Instant::now() + Duration::from_secs(3600));
        assert!(tokio::time::timeout(Duration::from_millis(20), &mut timer)
            .await
            .is_err());
    }
}
