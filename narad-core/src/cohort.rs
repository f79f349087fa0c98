//! The cohort wait shared by the ingress WAL and the owner journal: after a flush, how long the next
//! one may wait for the callers (or logs) the flush answered to come back. Why it pays, and the
//! values each side uses, are in their module documentation.

use std::time::Duration;

/// When a flush sets a cohort wait, and for how long at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CohortWait {
    /// Longest wait, µs; 0 = never wait.
    pub delay_us_max: u64,
    /// The wait also lasts at most this percentage of the duration of the flush that set it.
    pub flush_percent: u32,
    /// A flush that wrote at least this many bytes sets no wait: it is bound by the disk's bandwidth,
    /// not by the fsync, and a wait would only idle the disk.
    pub flush_bytes_max: u64,
    /// A flush that answered fewer than this sets no wait: the load is too light for waiting to pay.
    pub siblings_min: usize,
}

impl CohortWait {
    /// The wait after a flush that answered `answered` callers, wrote `flushed_bytes` and took
    /// `took`; `None` when it sets none (off, too few, bound by bandwidth, or a zero wait).
    pub fn after(&self, answered: usize, flushed_bytes: u64, took: Duration) -> Option<Duration> {
        if answered < self.siblings_min || flushed_bytes >= self.flush_bytes_max {
            return None;
        }
        let wait = Duration::from_micros(self.delay_us_max).min(took * self.flush_percent / 100);
        (!wait.is_zero()).then_some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: CohortWait = CohortWait {
        delay_us_max: 1_000,
        flush_percent: 250,
        flush_bytes_max: 1024,
        siblings_min: 2,
    };

    #[test]
    fn the_wait_is_the_smaller_of_its_cap_and_a_share_of_the_flush() {
        let us = Duration::from_micros;
        assert_eq!(WAIT.after(2, 0, us(200)), Some(us(500)));
        assert_eq!(WAIT.after(8, 0, us(900)), Some(us(1_000)));
    }

    #[test]
    fn no_wait_when_off_too_few_bound_by_bandwidth_or_instant() {
        let us = Duration::from_micros;
        let off = CohortWait {
            delay_us_max: 0,
            ..WAIT
        };
        assert_eq!(off.after(8, 0, us(900)), None);
        assert_eq!(WAIT.after(1, 0, us(900)), None);
        assert_eq!(WAIT.after(8, 1024, us(900)), None);
        assert_eq!(WAIT.after(8, 0, Duration::ZERO), None);
    }
}
