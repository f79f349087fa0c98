//! The node's queue-mode consume: every [`PartitionQueue`] of the partitions this node owns, and the
//! policy above them (a partition queue's own leases, acks and cursor are [`super`]'s).
//!
//! # Contract
//! - **Calls.** A consume call ([`ConsumeInput::Consume`]) tries its candidate partitions in a
//!   rotation: each round of any call on a topic starts one candidate further than the one before,
//!   so a topic's consumers spread over its partitions. The first queue with work leases a record,
//!   which is then read ([`ConsumeOutput::Read`]); the call is answered
//!   [`ConsumeOutput::Consumed`] with the record, or with none once its wait (at most
//!   [`CONSUME_WAIT_MAX`]) has ended.
//! - **Read outcomes.** A read that returns the leased record answers the call. A read below the
//!   oldest retained record moves the queue past what retention removed, and a damaged record is
//!   passed over as done (damaged bytes never heal, so the queue would stop at them): both try the
//!   same partition again, at most [`READS_PER_PARTITION_MAX`] reads per partition and round. A
//!   read at or past the high watermark gives the lease back and believes the log's watermark (the
//!   one learned was another incarnation's, or ran ahead of a log that reopened); any other failure
//!   gives the lease back (redelivered next). Both move on to the next candidate.
//! - **Visibility boundary.** A queue leases fresh records below the high watermark it last learned,
//!   from a read or from the partition's figures ([`ConsumeOutput::Stat`]), which are asked again
//!   only once the queue has nothing to lease below it.
//! - **Long poll.** A round that leased nothing waits for the first of: a commit to the topic
//!   ([`ConsumeInput::Committed`], asked for with [`ConsumeOutput::WatchCommits`]), a nack on it (the
//!   record is redelivered at once), the earliest lease deadline among its candidates (an expired
//!   lease is redelivered), or the end of its wait. A commit or nack that lands while a round is
//!   still reading makes the call try again at once instead of waiting: it may be what the round
//!   just missed.
//! - **Cursors on disk.** One [`CURSOR_FLUSH_INTERVAL`] after the last flush, if a cursor moved, the
//!   whole table is written ([`ConsumeOutput::StoreCursors`]: one write and one fsync, see
//!   [`super::table`]), so an ack is answered at once and a crash redelivers at most the acks of the
//!   last interval plus every acked-ahead offset: at-least-once. A failed write is written again at
//!   the next interval. Cursors (and queues) of topic incarnations no longer live are dropped from a
//!   flush, but only once the replica has caught up with its log: a booting replica lists no topic
//!   yet, and pruning on it would send every cursor back to 0.
//!
//! # Driver protocol
//! Build the actor with the cursor table read at start-up. Feed [`ConsumeInput::LiveTopics`] at
//! start and again, when the replica changed, before a [`ConsumeInput::Tick`] or a
//! [`ConsumeInput::Flush`] (the only inputs that may flush). After every `handle`, drain
//! `poll_output` and carry out each output: run `Stat`, `Read` and `StoreCursors` and feed their
//! results back (`StatDone`, `ReadDone`, `StoreDone`); on `WatchCommits`, feed one `Committed` for
//! the next commit to the topic after it; answer the callers. Feed `Tick` once `poll_timeout` has
//! passed. A caller that gives up is reported with `Abandon`; a leased record whose answer could
//! not be handed over, with `Undelivered` (its lease is given back).
//!
//! # Invariants (checked after every input when deep checks are on)
//! Every call is in exactly one state (reading its figures, reading a record, or waiting), a waiting
//! one is indexed by when it next tries and never past its deadline; every call's topic is watched;
//! flush callers wait only while a write is in flight; calls are at most [`CALLS_MAX`].

mod interface;
#[cfg(test)]
mod tests;

pub use interface::{
    CallId, ConsumeConfig, ConsumeEvent, ConsumeInput, ConsumeOutput, HandoffPending, QueueTopic,
};

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::table::{CursorKey, CursorSlots, CursorTable};
use super::{HandleError, PartitionQueue, QueueLimits, ReceiptHandle, Reserve, Settle};
use crate::actor::Actor;
use crate::codec::cluster::{LeasedRecord, PartitionStat, QueueHandoff, StoredRecord};
use crate::disk::{IoCompletion, IoId, IoLane, IoRequest};
use crate::ids::{Offset, PartitionId, TopicId};
use crate::partition::{LogReadError, PartitionReadError, ReadBatch, ReadFault};
use crate::planted::PlantedBug;
use crate::time::Instant;

/// How long after the last flush moved cursors are written to disk.
pub const CURSOR_FLUSH_INTERVAL: Duration = Duration::from_millis(100);
/// The longest a consume call waits (its `wait` is clamped to it), as Narad's `max_consume_wait`.
pub const CONSUME_WAIT_MAX: Duration = Duration::from_secs(10);
/// Reads one call may try on one partition per round before it moves on (each failed read gives its
/// lease back or passes its record over, so a partition whose reads fail cannot hold a call).
pub const READS_PER_PARTITION_MAX: usize = 4;
/// Consume calls in progress at most; one more is answered at once with no record (the consumer
/// polls again), so the actor's memory stays bounded whatever its callers do.
pub const CALLS_MAX: usize = 65_536;

/// One partition's queue and what is known of its log.
#[derive(Debug)]
struct Queue {
    queue: PartitionQueue,
    /// The high watermark last learned.
    high_watermark: Offset,
}

/// Where a call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CallState {
    /// Waiting for a partition's figures.
    Stat,
    /// Waiting for the read of the record it leased.
    Read { offset: Offset, nonce: u64 },
    /// Waiting for a wake, or until `until` (a lease deadline or its own).
    Waiting { until: Instant },
}

#[derive(Debug)]
struct Call {
    topic: QueueTopic,
    limits: QueueLimits,
    candidates: Vec<PartitionId>,
    /// When the call is answered with no record.
    deadline: Instant,
    /// Where this round's rotation starts.
    start: usize,
    /// Candidates done in this round.
    index: usize,
    /// Reads tried on the current candidate.
    reads: usize,
    /// A commit or nack on the topic landed since this round started.
    woken: bool,
    /// The caller gave up: ended once the I/O in flight is back.
    abandoned: bool,
    state: CallState,
}

impl Call {
    fn partition(&self) -> PartitionId {
        self.candidates[(self.start + self.index) % self.candidates.len()]
    }

    fn key(&self) -> CursorKey {
        (self.topic.id, self.partition())
    }

    fn next_partition(&mut self) {
        self.index += 1;
        self.reads = 0;
    }
}

/// What a read's outcome leads to.
enum AfterRead {
    /// The record reached the call.
    Answer(LeasedRecord),
    /// Try the same partition again.
    Again,
    /// Move on to the next candidate.
    Move,
}

/// The node's queue-mode consume; see the module documentation.
#[derive(Debug)]
pub struct ConsumeActor {
    config: ConsumeConfig,
    queues: BTreeMap<CursorKey, Queue>,
    /// Cursors read at start-up for partitions no call has touched since.
    loaded: BTreeMap<CursorKey, Offset>,
    /// Where each topic's next round starts its rotation.
    rotation: BTreeMap<TopicId, u32>,
    /// Draws each new queue's nonce seed.
    rng: ChaCha8Rng,
    calls: BTreeMap<CallId, Call>,
    /// The waiting calls, by when they next try.
    waits: BTreeSet<(Instant, CallId)>,
    /// The calls of each topic name (wakes come by name).
    by_topic: BTreeMap<Arc<str>, BTreeSet<CallId>>,
    /// The topics a [`ConsumeOutput::WatchCommits`] is out for.
    watched: BTreeSet<Arc<str>>,
    /// The live incarnations, once the replica caught up (`None` before: nothing is pruned).
    live: Option<BTreeSet<TopicId>>,
    slots: CursorSlots,
    /// A cursor moved since the last flush started.
    dirty: bool,
    /// When the next flush may start.
    flush_at: Instant,
    /// The table being written, and its request's id.
    storing: Option<(IoId, CursorTable)>,
    next_io: u64,
    /// Flush calls answered by the write in flight.
    flush_waiting: Vec<CallId>,
    /// Flush calls that came during it: answered by a write of their own if a cursor moved since.
    flush_queued: Vec<CallId>,
    /// Partitions moving here whose queue state is not adopted yet: not served.
    held: BTreeMap<CursorKey, u64>,
    /// Partitions whose queue was handed to a move's destination: not served (until one moves
    /// back and is adopted).
    handed_off: BTreeSet<CursorKey>,
    /// Queue states adopted from moves, for the queue made on first use.
    adopted: BTreeMap<CursorKey, QueueHandoff>,
    outputs: VecDeque<ConsumeOutput>,
}

impl ConsumeActor {
    /// An actor resuming from the cursor table `slots` read at start-up; `now` starts the flush
    /// interval.
    pub fn new(config: ConsumeConfig, slots: CursorSlots, now: Instant) -> ConsumeActor {
        ConsumeActor {
            config,
            queues: BTreeMap::new(),
            loaded: slots.table.cursors.clone(),
            rotation: BTreeMap::new(),
            rng: ChaCha8Rng::seed_from_u64(config.nonce_seed),
            calls: BTreeMap::new(),
            waits: BTreeSet::new(),
            by_topic: BTreeMap::new(),
            watched: BTreeSet::new(),
            live: None,
            slots,
            dirty: false,
            flush_at: now + CURSOR_FLUSH_INTERVAL,
            storing: None,
            next_io: 0,
            flush_waiting: Vec::new(),
            flush_queued: Vec::new(),
            held: BTreeMap::new(),
            handed_off: BTreeSet::new(),
            adopted: BTreeMap::new(),
            outputs: VecDeque::new(),
        }
    }

    /// The cursor of one partition's queue, as a restart would resume it.
    pub fn cursor(&self, topic: TopicId, partition: PartitionId) -> Option<Offset> {
        self.queues
            .get(&(topic, partition))
            .map(|queue| queue.queue.cursor())
            .or_else(|| self.loaded.get(&(topic, partition)).copied())
    }

    /// The high watermark learned for one partition's queue.
    pub fn high_watermark(&self, topic: TopicId, partition: PartitionId) -> Option<Offset> {
        self.queues
            .get(&(topic, partition))
            .map(|queue| queue.high_watermark)
    }

    /// Consume calls in progress.
    pub fn calls(&self) -> usize {
        self.calls.len()
    }

    /// Whether a cursor moved since the last flush started.
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    fn on_adopt(&mut self, now: Instant, key: CursorKey, epoch: u64, state: Option<QueueHandoff>) {
        if self.held.get(&key) != Some(&epoch) {
            // A later move's hold (or none): this answer is an earlier move's, and stale.
            return;
        }
        self.held.remove(&key);
        self.handed_off.remove(&key);
        let Some(mut state) = state else {
            return;
        };
        if self.config.plant.is(PlantedBug::MoveDropsAckedAhead) {
            state.acked_ahead.clear();
        }
        // Leases made here meanwhile end: their records are delivered again from the adopted state.
        self.queues.remove(&key);
        self.loaded.remove(&key);
        self.adopted.insert(key, state);
        self.mark_dirty(now);
    }

    fn on_handoff(&mut self, call: CallId, key: CursorKey) {
        if self.held.contains_key(&key) {
            // Moved on before its own queue state arrived: handing over nothing would deliver
            // again what was acked.
            self.emit(ConsumeOutput::HandedOff {
                call,
                state: Err(HandoffPending),
            });
            return;
        }
        let state = match self.queues.remove(&key) {
            Some(queue) => Some(queue.queue.handoff()),
            None => self.adopted.remove(&key).or_else(|| {
                self.loaded.remove(&key).map(|cursor| QueueHandoff {
                    cursor,
                    acked_ahead: Vec::new(),
                })
            }),
        };
        self.handed_off.insert(key);
        self.emit(ConsumeOutput::HandedOff {
            call,
            state: Ok(state),
        });
    }

    fn emit(&mut self, output: ConsumeOutput) {
        self.outputs.push_back(output);
    }

    fn event(&mut self, event: ConsumeEvent) {
        self.emit(ConsumeOutput::Event(event));
    }

    /// A cursor moved: the next flush writes it. Flushes keep their interval grid while idle, so the
    /// first move after a quiet spell is written at the grid's next point, as by a periodic flush.
    fn mark_dirty(&mut self, now: Instant) {
        if self.dirty {
            return;
        }
        self.dirty = true;
        if self.storing.is_none() && self.flush_at <= now {
            let interval = CURSOR_FLUSH_INTERVAL.as_nanos() as u64;
            let behind = now.as_nanos() - self.flush_at.as_nanos();
            self.flush_at =
                Instant::from_nanos(self.flush_at.as_nanos() + (behind / interval + 1) * interval);
        }
    }

    /// The queue of `key`, made on first use from an adopted move's state, else from the loaded
    /// cursor (or 0); its limits refreshed.
    fn queue(&mut self, key: CursorKey, limits: QueueLimits) -> &mut Queue {
        let ConsumeActor {
            queues,
            loaded,
            adopted,
            rng,
            ..
        } = self;
        let queue = queues
            .entry(key)
            .or_insert_with(|| match adopted.remove(&key) {
                Some(state) => Queue {
                    queue: PartitionQueue::resume(limits, &state, rng.random()),
                    high_watermark: state.cursor,
                },
                None => {
                    let cursor = loaded.remove(&key).unwrap_or_default();
                    Queue {
                        queue: PartitionQueue::new(limits, cursor, rng.random()),
                        high_watermark: cursor,
                    }
                }
            });
        if queue.queue.limits() != limits {
            queue.queue.set_limits(limits);
        }
        queue
    }

    fn call(&mut self, call: CallId) -> &mut Call {
        self.calls.get_mut(&call).expect("a call in progress")
    }

    fn on_consume(
        &mut self,
        now: Instant,
        call: CallId,
        topic: QueueTopic,
        limits: QueueLimits,
        candidates: Vec<PartitionId>,
        wait: Duration,
    ) {
        assert!(!self.calls.contains_key(&call), "call ids are unique");
        if candidates.is_empty() || self.calls.len() >= CALLS_MAX {
            self.emit(ConsumeOutput::Consumed { call, leased: None });
            return;
        }
        // Watched before the first round: a commit landing while it reads wakes it.
        if self.watched.insert(topic.name.clone()) {
            self.emit(ConsumeOutput::WatchCommits {
                topic: topic.name.clone(),
            });
        }
        self.by_topic
            .entry(topic.name.clone())
            .or_default()
            .insert(call);
        self.calls.insert(
            call,
            Call {
                topic,
                limits,
                candidates,
                deadline: now + wait.min(CONSUME_WAIT_MAX),
                start: 0,
                index: 0,
                reads: 0,
                woken: false,
                abandoned: false,
                state: CallState::Waiting { until: now },
            },
        );
        self.start_round(now, call);
    }

    /// Starts a round over every candidate, one further in the topic's rotation than the last.
    fn start_round(&mut self, now: Instant, call: CallId) {
        self.begin_round(call);
        self.advance(now, call);
    }

    fn begin_round(&mut self, id: CallId) {
        let topic = self.call(id).topic.id;
        let next = self.rotation.entry(topic).or_insert(0);
        let start = *next as usize;
        *next = next.wrapping_add(1);
        let call = self.call(id);
        call.start = start;
        call.index = 0;
        call.reads = 0;
        call.woken = false;
    }

    /// Runs the call until it waits for I/O, waits for a wake, or is answered.
    fn advance(&mut self, now: Instant, id: CallId) {
        loop {
            let call = self.call(id);
            if call.index >= call.candidates.len() {
                if self.end_round(now, id) {
                    continue;
                }
                return;
            }
            if call.reads >= READS_PER_PARTITION_MAX {
                call.next_partition();
                continue;
            }
            let (key, limits) = (call.key(), call.limits);
            if self.held.contains_key(&key) || self.handed_off.contains(&key) {
                // Moving here (its state not adopted yet) or moved away.
                self.call(id).next_partition();
                continue;
            }
            let queue = self.queue(key, limits);
            if !queue.queue.has_work(now, queue.high_watermark) {
                let call = self.call(id);
                call.state = CallState::Stat;
                let (topic, partition) = (call.topic.clone(), call.partition());
                self.emit(ConsumeOutput::Stat {
                    call: id,
                    topic,
                    partition,
                });
                return;
            }
            if self.reserve(now, id) {
                return;
            }
            self.call(id).next_partition();
        }
    }

    /// Leases the next record of the call's current candidate and asks for its read; `false` when
    /// the queue has none to lease.
    fn reserve(&mut self, now: Instant, id: CallId) -> bool {
        let call = &self.calls[&id];
        let (key, limits) = (call.key(), call.limits);
        let queue = self.queue(key, limits);
        match queue.queue.reserve(now, queue.high_watermark) {
            Reserve::Leased {
                offset,
                nonce,
                redelivery,
                ..
            } => {
                if redelivery {
                    self.event(ConsumeEvent::Redelivered);
                }
                let call = self.call(id);
                call.state = CallState::Read { offset, nonce };
                let (topic, partition) = (call.topic.clone(), call.partition());
                self.emit(ConsumeOutput::Read {
                    call: id,
                    topic,
                    partition,
                    offset,
                });
                true
            }
            Reserve::Empty | Reserve::Full => false,
        }
    }

    /// Every candidate was tried: answered with none past the deadline, tried again at once if woken
    /// meanwhile (`true`), else waiting.
    fn end_round(&mut self, now: Instant, id: CallId) -> bool {
        let call = &self.calls[&id];
        if now >= call.deadline {
            self.finish(id);
            self.emit(ConsumeOutput::Consumed {
                call: id,
                leased: None,
            });
            return false;
        }
        if call.woken {
            self.begin_round(id);
            return true;
        }
        // Held and handed-off partitions are passed over by the rounds (their leases never expire
        // here), so their deadlines wake nobody.
        let lease_end = call
            .candidates
            .iter()
            .map(|partition| (call.topic.id, *partition))
            .filter(|key| !self.held.contains_key(key) && !self.handed_off.contains(key))
            .filter_map(|key| self.queues.get(&key))
            .filter_map(|queue| queue.queue.next_deadline())
            .min();
        let until = lease_end.map_or(call.deadline, |end| end.min(call.deadline));
        self.call(id).state = CallState::Waiting { until };
        self.waits.insert((until, id));
        false
    }

    /// Forgets a call (answered, or its caller gone).
    fn finish(&mut self, id: CallId) {
        let call = self.calls.remove(&id).expect("a call in progress");
        if let CallState::Waiting { until } = call.state {
            self.waits.remove(&(until, id));
        }
        if let Some(calls) = self.by_topic.get_mut(&call.topic.name) {
            calls.remove(&id);
            if calls.is_empty() {
                self.by_topic.remove(&call.topic.name);
            }
        }
    }

    fn on_stat(&mut self, now: Instant, id: CallId, stat: PartitionStat) {
        let call = &self.calls[&id];
        assert_eq!(call.state, CallState::Stat, "figures the call asked for");
        if call.abandoned {
            self.finish(id);
            return;
        }
        let (key, limits) = (call.key(), call.limits);
        let queue = self.queue(key, limits);
        queue.high_watermark = queue.high_watermark.max(stat.high_watermark);
        let skipped = stat.oldest_offset > queue.queue.cursor();
        if skipped {
            queue.queue.skip_below(stat.oldest_offset);
            self.mark_dirty(now);
        }
        if self.reserve(now, id) {
            return;
        }
        self.call(id).next_partition();
        self.advance(now, id);
    }

    fn on_read(&mut self, now: Instant, id: CallId, result: Result<ReadBatch, PartitionReadError>) {
        let call = &self.calls[&id];
        let CallState::Read { offset, nonce } = call.state else {
            panic!("a read the call asked for");
        };
        let (topic, partition, limits) = (call.topic.clone(), call.partition(), call.limits);
        let abandoned = call.abandoned;
        let after = self.apply_read(now, &topic, partition, limits, (offset, nonce), result);
        if abandoned {
            if let AfterRead::Answer(_) = after {
                // It never reaches a consumer: redelivered next, as a nack.
                self.queue((topic.id, partition), limits)
                    .queue
                    .release(offset, nonce);
            }
            self.finish(id);
            return;
        }
        match after {
            AfterRead::Answer(leased) => {
                self.finish(id);
                self.event(ConsumeEvent::Delivered);
                self.emit(ConsumeOutput::Consumed {
                    call: id,
                    leased: Some(leased),
                });
            }
            AfterRead::Again => {
                self.call(id).reads += 1;
                self.advance(now, id);
            }
            AfterRead::Move => {
                self.call(id).next_partition();
                self.advance(now, id);
            }
        }
    }

    /// Applies a read's outcome to the queue (the four ways of the module documentation).
    fn apply_read(
        &mut self,
        now: Instant,
        topic: &QueueTopic,
        partition: PartitionId,
        limits: QueueLimits,
        (offset, nonce): (Offset, u64),
        result: Result<ReadBatch, PartitionReadError>,
    ) -> AfterRead {
        let queue = self.queue((topic.id, partition), limits);
        match result {
            Ok(batch) if batch.first == offset && !batch.records.is_empty() => {
                queue.high_watermark = queue.high_watermark.max(batch.high_watermark);
                let record = batch.records.into_iter().next().expect("not empty");
                AfterRead::Answer(LeasedRecord {
                    record: StoredRecord {
                        offset,
                        key: record.key,
                        payload: record.payload,
                        committed_at_ms: record.committed_at_ms,
                    },
                    handle: ReceiptHandle {
                        partition,
                        offset,
                        nonce,
                    },
                })
            }
            Err(PartitionReadError::Log(LogReadError::BelowOldestRetained { oldest, .. })) => {
                queue.queue.skip_below(oldest);
                self.mark_dirty(now);
                AfterRead::Again
            }
            Err(PartitionReadError::Log(LogReadError::Unreadable {
                reason: reason @ (ReadFault::Damaged(_) | ReadFault::Skipped),
                ..
            })) => {
                // Damaged bytes never heal (a replay answers 410 there): passed over, or the queue
                // would stop at them. A disk's read error is retried instead, below.
                queue.queue.discard(offset, nonce);
                self.mark_dirty(now);
                self.event(ConsumeEvent::Damaged {
                    topic: topic.clone(),
                    partition,
                    offset,
                    reason,
                });
                AfterRead::Again
            }
            Err(PartitionReadError::Log(LogReadError::AtOrPastHighWatermark {
                high_watermark,
                ..
            })) => {
                queue.queue.release(offset, nonce);
                queue.high_watermark = high_watermark;
                AfterRead::Move
            }
            other => {
                queue.queue.release(offset, nonce);
                self.event(ConsumeEvent::ReadFailed {
                    topic: topic.clone(),
                    partition,
                    offset,
                    error: other.err(),
                });
                AfterRead::Move
            }
        }
    }

    fn on_abandon(&mut self, id: CallId) {
        let Some(state) = self.calls.get(&id).map(|call| call.state) else {
            return; // Answered already.
        };
        match state {
            CallState::Waiting { .. } => self.finish(id),
            // Its I/O comes back still: ended then (a lease it read is given back).
            CallState::Stat | CallState::Read { .. } => self.call(id).abandoned = true,
        }
    }

    fn on_undelivered(&mut self, topic: TopicId, handle: ReceiptHandle) {
        if let Some(queue) = self.queues.get_mut(&(topic, handle.partition)) {
            queue.queue.release(handle.offset, handle.nonce);
        }
    }

    fn on_settle(
        &mut self,
        now: Instant,
        call: CallId,
        topic: QueueTopic,
        handle: ReceiptHandle,
        action: Settle,
    ) {
        let result = match self.queues.get_mut(&(topic.id, handle.partition)) {
            None => Err(HandleError::Stale),
            Some(queue) => {
                let before = queue.queue.cursor();
                let result = queue.queue.settle(now, handle.offset, handle.nonce, action);
                if queue.queue.cursor() != before {
                    self.mark_dirty(now);
                }
                result
            }
        };
        match (&result, action) {
            (Ok(()), Settle::Ack) => self.event(ConsumeEvent::Acked),
            (Ok(()), Settle::Nack) => self.event(ConsumeEvent::Nacked),
            _ => {}
        }
        self.emit(ConsumeOutput::Settled { call, result });
        if result.is_ok() && action == Settle::Nack {
            // A nacked record is redelivered at once: a waiting call takes it.
            self.wake(now, &topic.name);
        }
    }

    /// Something to lease may have appeared on `topic`: its waiting calls try again now, and those
    /// still reading try again when their round ends.
    fn wake(&mut self, now: Instant, topic: &str) {
        let Some(calls) = self.by_topic.get(topic) else {
            return;
        };
        let ids: Vec<CallId> = calls.iter().copied().collect();
        for id in ids {
            match self.call(id).state {
                CallState::Waiting { until } => {
                    self.waits.remove(&(until, id));
                    self.start_round(now, id);
                }
                CallState::Stat | CallState::Read { .. } => self.call(id).woken = true,
            }
        }
    }

    fn on_committed(&mut self, now: Instant, topic: Arc<str>) {
        self.watched.remove(&topic);
        self.wake(now, &topic);
        // Watched again while calls remain; a topic nobody waits on costs its commits nothing.
        if self.by_topic.contains_key(&topic) && self.watched.insert(topic.clone()) {
            self.emit(ConsumeOutput::WatchCommits { topic });
        }
    }

    fn on_tick(&mut self, now: Instant) {
        while let Some(&(until, id)) = self.waits.first() {
            if until > now {
                break;
            }
            self.waits.pop_first();
            self.start_round(now, id);
        }
        if self.dirty && self.storing.is_none() && self.flush_at <= now {
            self.start_store();
        }
    }

    fn on_flush(&mut self, call: CallId) {
        if self.storing.is_some() {
            self.flush_queued.push(call);
        } else if self.dirty {
            self.start_store();
            self.flush_waiting.push(call);
        } else {
            self.emit(ConsumeOutput::Flushed {
                call,
                result: Ok(()),
            });
        }
    }

    /// Writes the whole table: every loaded cursor and every queue's, less those of incarnations no
    /// longer live.
    fn start_store(&mut self) {
        assert!(self.storing.is_none(), "one cursor write at a time");
        self.dirty = false;
        if let Some(live) = &self.live {
            self.loaded.retain(|(topic, _), _| live.contains(topic));
            self.queues.retain(|(topic, _), _| live.contains(topic));
            self.rotation.retain(|topic, _| live.contains(topic));
        }
        let mut cursors = self.loaded.clone();
        let planted = self.config.plant.is(PlantedBug::CursorPastLeases);
        for (key, queue) in &self.queues {
            let cursor = match planted {
                // Planted: the leased records not yet acked are below what is stored.
                true => queue.queue.next_fresh(),
                false => queue.queue.cursor(),
            };
            cursors.insert(*key, cursor);
        }
        let (table, ops) = self.slots.flush_ops(&cursors);
        let id = IoId(self.next_io);
        self.next_io += 1;
        self.storing = Some((id, table));
        self.emit(ConsumeOutput::StoreCursors(IoRequest {
            id,
            lane: IoLane(0),
            ops,
        }));
    }

    fn on_store_done(&mut self, now: Instant, completion: IoCompletion) {
        let (id, table) = self.storing.take().expect("a cursor write in flight");
        assert_eq!(completion.id, id, "the cursor write's completion");
        let result = match completion.result {
            Ok(_) => {
                self.slots.flushed(table);
                Ok(())
            }
            Err((_, fault)) => {
                // Written again, the same slot, at the next interval.
                self.dirty = true;
                self.event(ConsumeEvent::FlushFailed(fault.clone()));
                Err(fault)
            }
        };
        self.flush_at = now + CURSOR_FLUSH_INTERVAL;
        for call in std::mem::take(&mut self.flush_waiting) {
            let result = result.clone();
            self.emit(ConsumeOutput::Flushed { call, result });
        }
        for call in std::mem::take(&mut self.flush_queued) {
            self.on_flush(call);
        }
    }

    fn check(&self) {
        if !crate::DEEP_CHECKS {
            return;
        }
        assert!(self.calls.len() <= CALLS_MAX, "calls bounded");
        let mut waiting = 0;
        for (id, call) in &self.calls {
            assert!(!call.candidates.is_empty(), "a call has candidates");
            assert!(call.index <= call.candidates.len(), "round index");
            assert!(call.reads <= READS_PER_PARTITION_MAX, "reads per partition");
            assert!(
                self.watched.contains(&call.topic.name),
                "a call's topic is watched"
            );
            assert!(
                self.by_topic
                    .get(&call.topic.name)
                    .is_some_and(|calls| calls.contains(id)),
                "a call is indexed by its topic"
            );
            if let CallState::Waiting { until } = call.state {
                waiting += 1;
                assert!(until <= call.deadline, "a wait ends by the deadline");
                assert!(self.waits.contains(&(until, *id)), "a wait is indexed");
                assert!(!call.abandoned, "an abandoned call does not wait");
            }
        }
        assert_eq!(
            self.waits.len(),
            waiting,
            "the wait index holds waiting calls"
        );
        let indexed: usize = self.by_topic.values().map(BTreeSet::len).sum();
        assert_eq!(
            indexed,
            self.calls.len(),
            "the topic index holds every call"
        );
        assert!(
            self.storing.is_some()
                || (self.flush_waiting.is_empty() && self.flush_queued.is_empty()),
            "flush calls wait only on a write in flight"
        );
    }
}

impl Actor for ConsumeActor {
    type Input = ConsumeInput;
    type Output = ConsumeOutput;

    fn handle(&mut self, now: Instant, input: ConsumeInput) {
        match input {
            ConsumeInput::Consume {
                call,
                topic,
                limits,
                candidates,
                wait,
            } => self.on_consume(now, call, topic, limits, candidates, wait),
            ConsumeInput::Abandon { call } => self.on_abandon(call),
            ConsumeInput::Undelivered { topic, handle } => self.on_undelivered(topic, handle),
            ConsumeInput::Settle {
                call,
                topic,
                handle,
                action,
            } => self.on_settle(now, call, topic, handle, action),
            ConsumeInput::Flush { call } => self.on_flush(call),
            ConsumeInput::StatDone { call, stat } => self.on_stat(now, call, stat),
            ConsumeInput::ReadDone { call, result } => self.on_read(now, call, result),
            ConsumeInput::Committed { topic } => self.on_committed(now, topic),
            ConsumeInput::StoreDone(completion) => self.on_store_done(now, completion),
            ConsumeInput::LiveTopics { caught_up, live } => {
                self.live = caught_up.then_some(live);
            }
            ConsumeInput::Tick => self.on_tick(now),
            ConsumeInput::Hold { key, epoch } => {
                // A queue left from an earlier stay is stale: the adopted state replaces it.
                self.queues.remove(&key);
                self.handed_off.remove(&key);
                self.held.insert(key, epoch);
            }
            ConsumeInput::Adopt { key, epoch, state } => self.on_adopt(now, key, epoch, state),
            ConsumeInput::Handoff { call, key } => self.on_handoff(call, key),
        }
        self.check();
    }

    fn poll_output(&mut self) -> Option<ConsumeOutput> {
        self.outputs.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let wait = self.waits.first().map(|(until, _)| *until);
        let flush = (self.dirty && self.storing.is_none()).then_some(self.flush_at);
        wait.into_iter().chain(flush).min()
    }

    fn has_output(&self) -> bool {
        !self.outputs.is_empty()
    }
}
