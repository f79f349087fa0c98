//! [`AcceptTimes`]: when each record earned its 202, kept from the WAL host's group commits until the
//! dispatcher makes the record visible, so `narad_accept_to_visible_seconds` measures exactly that span.
//!
//! A record's 202 is earned when the group commit that covers it is durable: the WAL host answers every
//! caller of that flush in the same step. So one monotonic instant per group commit is enough: the host
//! calls [`AcceptTimes::committed`] with the durable frontier after the commit and the node's
//! [`crate::clock::Clock`] reading, just before it answers the callers. Group commits are contiguous, so
//! entry `i` covers `[next of entry i-1, next of entry i)`; the first entry starts at the floor.
//!
//! The dispatcher, in the same task, reads the instants back by sequence number when a commit to a
//! partition is answered ([`AcceptTimes::observe_visible`]), and observes `visible - accepted` for
//! each record.
//! Records with no instant are skipped rather than guessed: records recovered at start-up (not accepted
//! by this process) and records whose group commit was forgotten.
//!
//! Bounds: at most [`ACCEPT_TIMES_MAX`] group commits are kept (the oldest go first); the WAL host also
//! forgets every group commit wholly below the checkpoint written in place
//! ([`AcceptTimes::forget_below`]), whose records are all visible already, so in steady state only the
//! group commits of the dispatch backlog are kept.

use std::collections::VecDeque;
use std::time::Duration;

use narad_core::{Instant, Seq};

/// Group commits kept at most (16 bytes each).
pub const ACCEPT_TIMES_MAX: usize = 65_536;

/// Accept instants of the group commits not yet known visible; see the module documentation.
#[derive(Debug)]
pub struct AcceptTimes {
    inner: Commits,
    capacity: usize,
}

#[derive(Debug)]
struct Commits {
    /// First sequence number the oldest kept entry covers; records below it have no instant.
    floor: Seq,
    /// `(durable next seq after the group commit, the instant its callers were answered)`, ascending.
    entries: VecDeque<(Seq, Instant)>,
}

impl AcceptTimes {
    /// Nothing known yet: every record below `durable_next` (recovered ones) has no instant.
    pub fn new(durable_next: Seq) -> AcceptTimes {
        AcceptTimes::with_capacity(durable_next, ACCEPT_TIMES_MAX)
    }

    /// [`AcceptTimes::new`] keeping at most `capacity` group commits (at least one).
    pub fn with_capacity(durable_next: Seq, capacity: usize) -> AcceptTimes {
        AcceptTimes {
            inner: Commits {
                floor: durable_next,
                entries: VecDeque::new(),
            },
            capacity: capacity.max(1),
        }
    }

    /// A group commit made every record below `durable_next` durable, and its callers are answered at
    /// `at`. A frontier that does not advance is ignored.
    pub fn committed(&mut self, durable_next: Seq, at: Instant) {
        let commits = &mut self.inner;
        let end = commits
            .entries
            .back()
            .map_or(commits.floor, |(next, _)| *next);
        if durable_next <= end {
            return;
        }
        if commits.entries.len() == self.capacity {
            if let Some((next, _)) = commits.entries.pop_front() {
                commits.floor = next;
            }
        }
        commits.entries.push_back((durable_next, at));
    }

    /// Forgets the group commits whose records are all below `seq` (they are visible already).
    pub fn forget_below(&mut self, seq: Seq) {
        let commits = &mut self.inner;
        while let Some(&(next, _)) = commits.entries.front() {
            if next > seq {
                break;
            }
            commits.entries.pop_front();
            commits.floor = next;
        }
    }

    /// The instant the record `seq` earned its 202, if it is known.
    pub fn accepted_at(&self, seq: Seq) -> Option<Instant> {
        self.inner.accepted_at(seq)
    }

    /// Calls `observe` with `visible - accepted` for every record of `seqs` whose accept instant is
    /// known.
    pub fn observe_visible(
        &self,
        seqs: impl IntoIterator<Item = Seq>,
        visible: Instant,
        mut observe: impl FnMut(Duration),
    ) {
        let commits = &self.inner;
        for seq in seqs {
            if let Some(accepted) = commits.accepted_at(seq) {
                observe(visible.saturating_duration_since(accepted));
            }
        }
    }

    /// Group commits kept (for tests).
    pub fn len(&self) -> usize {
        self.inner.entries.len()
    }

    /// True when no group commit is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Commits {
    fn accepted_at(&self, seq: Seq) -> Option<Instant> {
        if seq < self.floor {
            return None;
        }
        let index = self.entries.partition_point(|(next, _)| *next <= seq);
        self.entries.get(index).map(|(_, at)| *at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Instant {
        Instant::from_millis(millis)
    }

    #[test]
    fn a_record_takes_the_instant_of_the_group_commit_that_covers_it() {
        let mut times = AcceptTimes::new(Seq(10));
        times.committed(Seq(13), ms(5));
        times.committed(Seq(15), ms(7));
        assert_eq!(
            times.accepted_at(Seq(9)),
            None,
            "recovered, not accepted here"
        );
        assert_eq!(times.accepted_at(Seq(10)), Some(ms(5)));
        assert_eq!(times.accepted_at(Seq(12)), Some(ms(5)));
        assert_eq!(times.accepted_at(Seq(13)), Some(ms(7)));
        assert_eq!(times.accepted_at(Seq(14)), Some(ms(7)));
        assert_eq!(times.accepted_at(Seq(15)), None, "not durable yet");
    }

    #[test]
    fn visible_minus_accepted_is_observed_per_record_with_an_instant() {
        let mut times = AcceptTimes::new(Seq(10));
        times.committed(Seq(13), ms(5));
        times.committed(Seq(15), ms(7));
        let mut seen = Vec::new();
        times.observe_visible([Seq(4), Seq(11), Seq(14), Seq(20)], ms(12), |latency| {
            seen.push(latency)
        });
        assert_eq!(
            seen,
            [Duration::from_millis(7), Duration::from_millis(5)],
            "seq 4 was recovered and seq 20 is unknown: neither is guessed"
        );
    }

    #[test]
    fn a_frontier_that_does_not_advance_is_ignored() {
        let mut times = AcceptTimes::new(Seq(0));
        times.committed(Seq(0), ms(1));
        times.committed(Seq(3), ms(2));
        times.committed(Seq(3), ms(9));
        times.committed(Seq(2), ms(9));
        assert_eq!(times.len(), 1);
        assert_eq!(times.accepted_at(Seq(2)), Some(ms(2)));
    }

    #[test]
    fn group_commits_below_the_checkpoint_are_forgotten() {
        let mut times = AcceptTimes::new(Seq(0));
        times.committed(Seq(3), ms(1));
        times.committed(Seq(6), ms(2));
        times.committed(Seq(9), ms(3));
        times.forget_below(Seq(5));
        assert_eq!(times.len(), 2, "3..6 still holds seq 5");
        assert_eq!(times.accepted_at(Seq(2)), None);
        assert_eq!(times.accepted_at(Seq(5)), Some(ms(2)));
        times.forget_below(Seq(9));
        assert!(times.is_empty());
        assert_eq!(times.accepted_at(Seq(8)), None);
        times.committed(Seq(10), ms(4));
        assert_eq!(times.accepted_at(Seq(9)), Some(ms(4)));
    }

    #[test]
    fn at_capacity_the_oldest_group_commit_goes_first() {
        let mut times = AcceptTimes::with_capacity(Seq(0), 2);
        times.committed(Seq(1), ms(1));
        times.committed(Seq(2), ms(2));
        times.committed(Seq(3), ms(3));
        assert_eq!(times.len(), 2);
        assert_eq!(times.accepted_at(Seq(0)), None);
        assert_eq!(times.accepted_at(Seq(1)), Some(ms(2)));
        assert_eq!(times.accepted_at(Seq(2)), Some(ms(3)));
    }
}
