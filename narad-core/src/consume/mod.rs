//! Queue-mode consume of one partition: leases, acks and the cursor (Narad's `GET …/consume` without
//! an offset, and `POST …/ack`).
//!
//! A [`PartitionQueue`] hands out the partition's visible records one at a time under a visibility
//! lease. Every offset in `[cursor, next)` is in exactly one of three sets:
//! - **leased**: delivered under a lease that has not ended (its nonce is in the receipt handle);
//! - **redeliver**: its lease expired, or was nacked, or its delivery failed: handed out again, lowest
//!   first, before any fresh record;
//! - **acked ahead**: acked above the cursor, waiting for the offsets below it.
//!
//! The cursor is the lowest offset not acked; it advances over the acked-ahead set as the offsets
//! below are acked. It is all that is persisted ([`table`]): after a restart everything from the
//! persisted cursor is delivered again (at-least-once). The in-flight cap bounds leased plus
//! redeliver (fresh records are leased only when nothing waits for redelivery), and the acked-ahead
//! cap bounds the acked-ahead set (an ack that would pass it is refused, [`HandleError::AckedAheadFull`],
//! and its lease kept), so a queue's memory is bounded by its two caps.
//!
//! Time is an input: a lease's deadline is compared with the `now` each call is given, so an expired
//! lease is never acked even before [`PartitionQueue::expire`] moves it.
//!
//! The node's queues and the policy above them (rotation over a topic's partitions, high-watermark
//! learning, read outcomes, long-poll wakes, cursor flushes) are [`actor::ConsumeActor`]'s.

pub mod actor;
pub mod table;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use crate::codec::cluster::QueueHandoff;
use crate::ids::{Offset, PartitionId};
use crate::time::Instant;

/// `visibility_timeout_ms` when a topic gives 0.
pub const VISIBILITY_DEFAULT: Duration = Duration::from_millis(30_000);
/// The shortest lease a topic may ask for.
pub const VISIBILITY_MIN: Duration = Duration::from_millis(1_000);

/// A queue's limits, from its topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueLimits {
    /// How long a lease lasts (and an extend renews it for).
    pub visibility: Duration,
    /// Leased plus waiting-for-redelivery offsets at most.
    pub in_flight_max: u32,
    /// Offsets acked above the cursor at most.
    pub acked_ahead_max: u32,
}

/// A lease's receipt handle: `partition:offset:nonce`, in decimal.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct ReceiptHandle {
    /// The partition.
    pub partition: PartitionId,
    /// The record's offset.
    pub offset: Offset,
    /// The lease's nonce: each delivery of an offset gets a new one.
    pub nonce: u64,
}

impl ReceiptHandle {
    /// Parses `partition:offset:nonce` (decimal, no sign, no spaces); `None` when malformed.
    pub fn parse(text: &str) -> Option<ReceiptHandle> {
        let mut parts = text.split(':');
        let partition = decimal(parts.next()?)?;
        let offset = decimal(parts.next()?)?;
        let nonce = decimal(parts.next()?)?;
        if parts.next().is_some() {
            return None;
        }
        Some(ReceiptHandle {
            partition: PartitionId(u32::try_from(partition).ok()?),
            offset: Offset(offset),
            nonce,
        })
    }
}

fn decimal(text: &str) -> Option<u64> {
    // `u64::from_str` takes a leading `+`; a handle is only ever digits.
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

impl fmt::Display for ReceiptHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.partition.0, self.offset.0, self.nonce)
    }
}

/// What [`PartitionQueue::reserve`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reserve {
    /// `offset` is leased until `deadline` under `nonce`.
    Leased {
        /// The record to deliver.
        offset: Offset,
        /// The lease's nonce.
        nonce: u64,
        /// When the lease ends.
        deadline: Instant,
        /// Whether the offset was delivered before.
        redelivery: bool,
    },
    /// Nothing to deliver: every visible record is leased or acked.
    Empty,
    /// The in-flight cap is reached: nothing more until a lease ends.
    Full,
}

/// What an ack, extend or nack does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Settle {
    /// The record is done.
    Ack,
    /// Renew the lease.
    Extend,
    /// End the lease now: redeliver.
    Nack,
}

/// Why an ack, extend or nack was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum HandleError {
    /// No lease holds the handle: acked already, redelivered under another nonce, or expired (410).
    Stale,
    /// The ack would pass the acked-ahead cap; the lease is kept (503).
    AckedAheadFull,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lease {
    nonce: u64,
    deadline: Instant,
}

/// One partition's queue state; see the module documentation.
#[derive(Clone, Debug)]
pub struct PartitionQueue {
    limits: QueueLimits,
    cursor: u64,
    next: u64,
    leases: BTreeMap<u64, Lease>,
    deadlines: BTreeSet<(Instant, u64)>,
    redeliver: BTreeSet<u64>,
    acked_ahead: BTreeSet<u64>,
    next_nonce: u64,
}

impl PartitionQueue {
    /// A queue whose cursor (the lowest offset not acked) is `cursor`; nonces count up from
    /// `nonce_seed` (random per start, so a handle from before a restart does not name a new lease).
    pub fn new(limits: QueueLimits, cursor: Offset, nonce_seed: u64) -> PartitionQueue {
        PartitionQueue {
            limits,
            cursor: cursor.0,
            next: cursor.0,
            leases: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            redeliver: BTreeSet::new(),
            acked_ahead: BTreeSet::new(),
            next_nonce: nonce_seed,
        }
    }

    /// A queue resuming a moved partition from its source's `state`: offsets at or past the cursor
    /// that were not acked (leased or waiting there) are delivered again; acked ones never.
    pub fn resume(limits: QueueLimits, state: &QueueHandoff, nonce_seed: u64) -> PartitionQueue {
        let mut queue = PartitionQueue::new(limits, state.cursor, nonce_seed);
        let acked: BTreeSet<u64> = state
            .acked_ahead
            .iter()
            .map(|offset| offset.0)
            .filter(|offset| *offset > queue.cursor)
            .collect();
        if let Some(&last) = acked.last() {
            queue.next = last + 1;
            queue.redeliver = (queue.cursor..queue.next)
                .filter(|offset| !acked.contains(offset))
                .collect();
            queue.acked_ahead = acked;
        }
        queue.check();
        queue
    }

    /// The state a move hands to the partition's new owner: the cursor and the offsets acked past
    /// it (leases are not carried: their records are delivered again there).
    pub fn handoff(&self) -> QueueHandoff {
        QueueHandoff {
            cursor: Offset(self.cursor),
            acked_ahead: self
                .acked_ahead
                .iter()
                .map(|offset| Offset(*offset))
                .collect(),
        }
    }

    /// The lowest offset not acked: what a restart resumes from.
    pub fn cursor(&self) -> Offset {
        Offset(self.cursor)
    }

    /// The lowest offset never delivered.
    pub fn next_fresh(&self) -> Offset {
        Offset(self.next)
    }

    /// Leases now held.
    pub fn leased(&self) -> usize {
        self.leases.len()
    }

    /// Offsets waiting for redelivery.
    pub fn waiting_redelivery(&self) -> usize {
        self.redeliver.len()
    }

    /// Offsets acked above the cursor.
    pub fn acked_ahead(&self) -> usize {
        self.acked_ahead.len()
    }

    /// The limits in force.
    pub fn limits(&self) -> QueueLimits {
        self.limits
    }

    /// Takes new limits (a topic's caps changed). Leases already made keep their deadlines; a lower
    /// cap only stops new leases and acks until the queue is under it again.
    pub fn set_limits(&mut self, limits: QueueLimits) {
        self.limits = limits;
    }

    /// The earliest lease deadline: when [`PartitionQueue::expire`] next has work.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|(deadline, _)| *deadline)
    }

    /// Moves every lease whose deadline is at or before `now` to the redelivery set.
    pub fn expire(&mut self, now: Instant) {
        while let Some(&(deadline, offset)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            self.leases.remove(&offset);
            self.redeliver.insert(offset);
        }
        self.check();
    }

    /// Whether a [`PartitionQueue::reserve`] at `now` could lease something below `high_watermark`.
    pub fn has_work(&self, now: Instant, high_watermark: Offset) -> bool {
        let expired = self.next_deadline().is_some_and(|deadline| deadline <= now);
        if expired || !self.redeliver.is_empty() {
            return true;
        }
        self.next < high_watermark.0 && self.leases.len() < self.limits.in_flight_max as usize
    }

    /// Leases the next record: the lowest waiting for redelivery, else the next fresh one below
    /// `high_watermark` (the partition's visibility boundary), unless the in-flight cap is reached.
    pub fn reserve(&mut self, now: Instant, high_watermark: Offset) -> Reserve {
        self.expire(now);
        let (offset, redelivery) = if let Some(offset) = self.redeliver.pop_first() {
            (offset, true)
        } else if self.next >= high_watermark.0 {
            return Reserve::Empty;
        } else if self.leases.len() >= self.limits.in_flight_max as usize {
            return Reserve::Full;
        } else {
            self.next += 1;
            (self.next - 1, false)
        };
        let nonce = self.next_nonce;
        self.next_nonce = self.next_nonce.wrapping_add(1);
        let deadline = now + self.limits.visibility;
        self.leases.insert(offset, Lease { nonce, deadline });
        self.deadlines.insert((deadline, offset));
        self.check();
        Reserve::Leased {
            offset: Offset(offset),
            nonce,
            deadline,
            redelivery,
        }
    }

    /// The live lease of `offset` under `nonce` at `now`, or [`HandleError::Stale`].
    fn live_lease(&mut self, now: Instant, offset: u64, nonce: u64) -> Result<Lease, HandleError> {
        let lease = *self.leases.get(&offset).ok_or(HandleError::Stale)?;
        if lease.nonce != nonce {
            return Err(HandleError::Stale);
        }
        if lease.deadline <= now {
            // Expired but not yet swept: it is redelivered, never acked.
            self.expire(now);
            return Err(HandleError::Stale);
        }
        Ok(lease)
    }

    fn end_lease(&mut self, offset: u64, lease: Lease) {
        self.leases.remove(&offset);
        self.deadlines.remove(&(lease.deadline, offset));
    }

    /// Acks the lease `offset`/`nonce`: the record is done. Returns the cursor after the ack.
    pub fn ack(&mut self, now: Instant, offset: Offset, nonce: u64) -> Result<Offset, HandleError> {
        let lease = self.live_lease(now, offset.0, nonce)?;
        if offset.0 != self.cursor && self.acked_ahead.len() >= self.limits.acked_ahead_max as usize
        {
            return Err(HandleError::AckedAheadFull);
        }
        self.end_lease(offset.0, lease);
        self.done(offset.0);
        self.check();
        Ok(Offset(self.cursor))
    }

    fn done(&mut self, offset: u64) {
        if offset == self.cursor {
            self.cursor += 1;
            while self.acked_ahead.first() == Some(&self.cursor) {
                self.acked_ahead.pop_first();
                self.cursor += 1;
            }
        } else {
            self.acked_ahead.insert(offset);
        }
    }

    /// Renews the lease `offset`/`nonce` for a full visibility timeout from `now`.
    pub fn extend(&mut self, now: Instant, offset: Offset, nonce: u64) -> Result<(), HandleError> {
        let lease = self.live_lease(now, offset.0, nonce)?;
        self.deadlines.remove(&(lease.deadline, offset.0));
        let deadline = now + self.limits.visibility;
        self.leases.insert(offset.0, Lease { nonce, deadline });
        self.deadlines.insert((deadline, offset.0));
        self.check();
        Ok(())
    }

    /// Ends the lease `offset`/`nonce` at once: the record is redelivered next.
    pub fn nack(&mut self, now: Instant, offset: Offset, nonce: u64) -> Result<(), HandleError> {
        let lease = self.live_lease(now, offset.0, nonce)?;
        self.end_lease(offset.0, lease);
        self.redeliver.insert(offset.0);
        self.check();
        Ok(())
    }

    /// Acks, extends or nacks the lease `offset`/`nonce`.
    pub fn settle(
        &mut self,
        now: Instant,
        offset: Offset,
        nonce: u64,
        action: Settle,
    ) -> Result<(), HandleError> {
        match action {
            Settle::Ack => self.ack(now, offset, nonce).map(|_| ()),
            Settle::Extend => self.extend(now, offset, nonce),
            Settle::Nack => self.nack(now, offset, nonce),
        }
    }

    /// Ends the lease `offset`/`nonce` as done without a consumer's ack: its record is damaged past
    /// reading, so no consumer can ever have it (a replay answers 410 there too). The acked-ahead cap
    /// does not refuse it: a lease held is already counted in flight.
    pub fn discard(&mut self, offset: Offset, nonce: u64) {
        if let Some(lease) = self.leases.get(&offset.0).copied() {
            if lease.nonce == nonce {
                self.end_lease(offset.0, lease);
                self.done(offset.0);
            }
        }
        self.check();
    }

    /// Gives back a lease whose record never reached a consumer (its read failed, or the answer
    /// could not be sent): redelivered next, as a nack. A lease no longer held is left alone.
    pub fn release(&mut self, offset: Offset, nonce: u64) {
        if let Some(lease) = self.leases.get(&offset.0).copied() {
            if lease.nonce == nonce {
                self.end_lease(offset.0, lease);
                self.redeliver.insert(offset.0);
            }
        }
        self.check();
    }

    /// The partition no longer holds records below `oldest` (retention removed them): they count as
    /// done, leased or not, and are never delivered again.
    pub fn skip_below(&mut self, oldest: Offset) {
        let oldest = oldest.0;
        if oldest <= self.cursor {
            return;
        }
        let gone: Vec<(u64, Lease)> = self
            .leases
            .range(..oldest)
            .map(|(offset, lease)| (*offset, *lease))
            .collect();
        for (offset, lease) in gone {
            self.end_lease(offset, lease);
        }
        self.redeliver = self.redeliver.split_off(&oldest);
        self.acked_ahead = self.acked_ahead.split_off(&oldest);
        self.cursor = oldest;
        self.next = self.next.max(oldest);
        while self.acked_ahead.first() == Some(&self.cursor) {
            self.acked_ahead.pop_first();
            self.cursor += 1;
        }
        self.check();
    }

    /// Checks the partition of `[cursor, next)` into the three sets (deep checks only).
    fn check(&self) {
        if !crate::DEEP_CHECKS {
            return;
        }
        assert!(self.cursor <= self.next, "cursor past next");
        assert_eq!(self.leases.len(), self.deadlines.len(), "deadline index");
        for (deadline, offset) in &self.deadlines {
            assert_eq!(
                self.leases.get(offset).map(|lease| lease.deadline),
                Some(*deadline),
                "deadline index names a lease"
            );
        }
        let tracked = self.leases.len() + self.redeliver.len() + self.acked_ahead.len();
        assert_eq!(
            tracked as u64,
            self.next - self.cursor,
            "every offset in [cursor, next) is leased, waiting or acked ahead"
        );
        let in_range = |offset: &u64| *offset > self.cursor && *offset < self.next;
        assert!(self.acked_ahead.iter().all(in_range), "acked ahead range");
        let live = |offset: &u64| *offset >= self.cursor && *offset < self.next;
        assert!(self.leases.keys().all(live), "lease range");
        assert!(self.redeliver.iter().all(live), "redeliver range");
        assert!(
            self.leases.keys().all(
                |offset| !self.redeliver.contains(offset) && !self.acked_ahead.contains(offset)
            ),
            "leased offsets are in no other set"
        );
        assert!(
            self.redeliver
                .iter()
                .all(|offset| !self.acked_ahead.contains(offset)),
            "waiting offsets are not acked"
        );
    }
}

/// A topic's limits as a queue takes them: `visibility_timeout_ms` (0 = the default) and the caps.
pub fn limits_of(visibility_ms: u64, in_flight_max: u32, acked_ahead_max: u32) -> QueueLimits {
    let visibility = if visibility_ms == 0 {
        VISIBILITY_DEFAULT
    } else {
        Duration::from_millis(visibility_ms).max(VISIBILITY_MIN)
    };
    QueueLimits {
        visibility,
        in_flight_max: in_flight_max.max(1),
        acked_ahead_max,
    }
}
