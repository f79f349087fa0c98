//! Time as an input: a monotonic instant in nanoseconds since the node started.

use core::fmt;
use core::ops::{Add, AddAssign, Sub};
use core::time::Duration;

/// A point on the node's monotonic clock, in nanoseconds since the node started.
///
/// Drivers read the real (or simulated) clock once per event and pass it in; actors never read a clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(pub u64);

impl Instant {
    /// The node's start.
    pub const ZERO: Instant = Instant(0);

    /// Builds an instant from nanoseconds since the node started.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// Builds an instant from milliseconds since the node started.
    pub const fn from_millis(millis: u64) -> Self {
        Instant(millis * 1_000_000)
    }

    /// Nanoseconds since the node started.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The time from `earlier` to `self`, or zero when `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// `self + duration`, saturating at the end of time instead of wrapping.
    pub fn saturating_add(self, duration: Duration) -> Instant {
        Instant(self.0.saturating_add(duration_nanos(duration)))
    }
}

fn duration_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        self.saturating_add(rhs)
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let micros = self.0 / 1_000;
        write!(f, "{}.{:06}s", micros / 1_000_000, micros % 1_000_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_millis(10);
        assert_eq!(t + Duration::from_millis(5), Instant::from_millis(15));
        assert_eq!(Instant::from_millis(5) - t, Duration::ZERO);
        assert_eq!(
            Instant(u64::MAX - 1) + Duration::from_secs(1),
            Instant(u64::MAX)
        );
        assert_eq!(t.to_string(), "0.010000s");
    }
}
