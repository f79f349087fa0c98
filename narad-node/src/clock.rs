//! The node's clocks: the only place the node reads time.
//!
//! - [`Clock::now`] is the monotonic clock the actors take as `now` (`narad_core::time::Instant`,
//!   nanoseconds since the clock was made). It reads `tokio::time::Instant`, which is virtual under
//!   madsim, so simulated runs replay.
//! - [`unix_ms`] / [`unix_s`] read the wall clock for values stored in records (accept time, topic
//!   creation time). madsim intercepts the underlying `clock_gettime`, so these are simulated too.

use narad_core::time::Instant;

/// The node's monotonic clock, anchored when it was made.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: tokio::time::Instant,
}

impl Clock {
    /// A clock whose zero is now.
    pub fn start() -> Self {
        Clock {
            start: tokio::time::Instant::now(),
        }
    }

    /// Nanoseconds since the clock was made, as the actors' `now`.
    pub fn now(&self) -> Instant {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.start);
        Instant::from_nanos(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX))
    }

    /// The real (or simulated) instant of an actor's `Instant`, for sleeping until a timeout.
    pub fn to_tokio(&self, instant: Instant) -> tokio::time::Instant {
        self.start + std::time::Duration::from_nanos(instant.as_nanos())
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
