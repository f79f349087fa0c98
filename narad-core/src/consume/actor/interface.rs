//! What a [`super::ConsumeActor`] takes and emits: its calls, inputs, outputs and events.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::codec::cluster::{LeasedRecord, PartitionStat, QueueHandoff};
use crate::consume::table::CursorKey;
use crate::consume::{HandleError, QueueLimits, ReceiptHandle, Settle};
use crate::disk::{IoCompletion, IoRequest};
use crate::error::IoFault;
use crate::ids::{Offset, PartitionId, TopicId};
use crate::partition::{PartitionReadError, ReadBatch, ReadFault};
use crate::planted::Plant;

/// Names one call (a consume, a settle or a flush) for as long as it is in progress; chosen by the
/// driver, unique among the calls in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CallId(pub u64);

/// A topic incarnation as a call names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueTopic {
    /// The topic name (commits are announced by name).
    pub name: Arc<str>,
    /// The incarnation.
    pub id: TopicId,
}

/// A handoff asked of a partition whose own queue state has not arrived here yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandoffPending;

/// Settings of a [`ConsumeActor`].
#[derive(Clone, Copy, Debug)]
pub struct ConsumeConfig {
    /// Seeds the queues' nonces (each new queue draws its first nonce from it).
    pub nonce_seed: u64,
    /// The bug planted (the simulator only).
    pub plant: Plant,
}

/// The events a [`ConsumeActor`] consumes.
#[derive(Clone, Debug)]
pub enum ConsumeInput {
    /// Lease one record of `topic` from `candidates` (partitions owned here), waiting up to `wait`.
    Consume {
        /// Names the call in its answer.
        call: CallId,
        /// The topic incarnation.
        topic: QueueTopic,
        /// The topic's queue limits (a queue takes new ones on its next use).
        limits: QueueLimits,
        /// The partitions to try, in the order the rotation walks them.
        candidates: Vec<PartitionId>,
        /// How long to wait for a record (clamped to [`CONSUME_WAIT_MAX`]).
        wait: Duration,
    },
    /// The caller of a consume gave up: it is answered no more.
    Abandon {
        /// The call.
        call: CallId,
    },
    /// A record leased to a call never reached its caller.
    Undelivered {
        /// The topic incarnation.
        topic: TopicId,
        /// The lease.
        handle: ReceiptHandle,
    },
    /// Ack, extend or nack the lease `handle` of `topic`; answered [`ConsumeOutput::Settled`].
    Settle {
        /// Names the call in its answer.
        call: CallId,
        /// The topic incarnation.
        topic: QueueTopic,
        /// The lease.
        handle: ReceiptHandle,
        /// What to do with it.
        action: Settle,
    },
    /// Write the cursors now if one moved (at shutdown); answered [`ConsumeOutput::Flushed`].
    Flush {
        /// Names the call in its answer.
        call: CallId,
    },
    /// The figures asked by [`ConsumeOutput::Stat`].
    StatDone {
        /// The call that asked.
        call: CallId,
        /// The partition's figures (zeros when its log is not open).
        stat: PartitionStat,
    },
    /// The read asked by [`ConsumeOutput::Read`] finished.
    ReadDone {
        /// The call that asked.
        call: CallId,
        /// What it read.
        result: Result<ReadBatch, PartitionReadError>,
    },
    /// A commit to the topic of a [`ConsumeOutput::WatchCommits`] was answered.
    Committed {
        /// The topic name.
        topic: Arc<str>,
    },
    /// The write of [`ConsumeOutput::StoreCursors`] finished.
    StoreDone(IoCompletion),
    /// Which topic incarnations the local replica holds.
    LiveTopics {
        /// Whether the replica has caught up with the log found at start-up (only then does a
        /// missing incarnation mean a deleted one).
        caught_up: bool,
        /// Every live incarnation.
        live: BTreeSet<TopicId>,
    },
    /// `poll_timeout` has passed.
    Tick,
    /// A partition is moving here: serve none of its records until its queue state is adopted
    /// ([`ConsumeInput::Adopt`]), so nothing its source's consumers acked is delivered again.
    Hold {
        /// The partition.
        key: CursorKey,
        /// The move's placement epoch (its `planned_at`): a later hold replaces an earlier one.
        epoch: u64,
    },
    /// A partition moved here: its queue resumes from the source's state (`None`: from the cursor
    /// this node holds, or 0: redelivered, never skipped). Ends the hold of `epoch`; ignored when
    /// the partition is not held for that epoch (a later move's hold stands).
    Adopt {
        /// The partition.
        key: CursorKey,
        /// The move's placement epoch.
        epoch: u64,
        /// The source's queue, as it let it go.
        state: Option<QueueHandoff>,
    },
    /// A partition moved away: let its queue go (its leases end: the new owner delivers their
    /// records again) and answer its state ([`ConsumeOutput::HandedOff`]).
    Handoff {
        /// Names the answer.
        call: CallId,
        /// The partition.
        key: CursorKey,
    },
}

/// What the driver counts and logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConsumeEvent {
    /// A record was handed to a call (redeliveries included).
    Delivered,
    /// A record delivered before was leased again (lease expired, nacked or given back).
    Redelivered,
    /// A lease was acked.
    Acked,
    /// A lease was nacked.
    Nacked,
    /// A damaged record was passed over as done.
    Damaged {
        /// The topic.
        topic: QueueTopic,
        /// The partition.
        partition: PartitionId,
        /// The record's offset.
        offset: Offset,
        /// What the read found.
        reason: ReadFault,
    },
    /// A read failed; its lease was given back.
    ReadFailed {
        /// The topic.
        topic: QueueTopic,
        /// The partition.
        partition: PartitionId,
        /// The record's offset.
        offset: Offset,
        /// The failure (`None`: the read answered another record than the one leased).
        error: Option<PartitionReadError>,
    },
    /// A cursor flush failed; the next one writes the same slot again.
    FlushFailed(IoFault),
}

/// The commands a [`ConsumeActor`] emits.
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub enum ConsumeOutput {
    /// Ask the figures of a partition; feed them back as [`ConsumeInput::StatDone`].
    Stat {
        /// The call that asks.
        call: CallId,
        /// The topic incarnation.
        topic: QueueTopic,
        /// The partition.
        partition: PartitionId,
    },
    /// Read the one record at `offset`; feed the result back as [`ConsumeInput::ReadDone`].
    Read {
        /// The call that asks.
        call: CallId,
        /// The topic incarnation.
        topic: QueueTopic,
        /// The partition.
        partition: PartitionId,
        /// The leased record's offset.
        offset: Offset,
    },
    /// Feed one [`ConsumeInput::Committed`] for the first commit to `topic` answered from now on.
    WatchCommits {
        /// The topic name.
        topic: Arc<str>,
    },
    /// Answer a consume call: a leased record, or none within its wait.
    Consumed {
        /// The call.
        call: CallId,
        /// The record and its receipt handle.
        leased: Option<LeasedRecord>,
    },
    /// Answer a settle call.
    Settled {
        /// The call.
        call: CallId,
        /// Its outcome.
        result: Result<(), HandleError>,
    },
    /// Run this request (the cursor table's write); feed its completion back as
    /// [`ConsumeInput::StoreDone`].
    StoreCursors(IoRequest),
    /// Answer a flush call.
    Flushed {
        /// The call.
        call: CallId,
        /// The write's outcome (`Ok` when nothing had moved).
        result: Result<(), IoFault>,
    },
    /// Something to count or log.
    Event(ConsumeEvent),
    /// Answer a handoff: the queue let go (`None`: none was held here), or `Err` while the
    /// partition is still held here (it moved on before this node adopted its queue: ask again).
    HandedOff {
        /// The call.
        call: CallId,
        /// Its cursor and acked-ahead offsets.
        state: Result<Option<QueueHandoff>, HandoffPending>,
    },
}
