//! The dispatcher's driver protocol: its configuration, inputs and outputs.

use super::record::DispatchRecord;
use crate::codec::DecodeError;
use crate::error::IoFault;
use crate::ids::{NodeId, PartitionId, Seq, TopicId};
use crate::planted::Plant;
use crate::time::Instant;
use core::fmt;
use core::ops::Deref;
use std::sync::Arc;

/// Where a dispatcher starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatcherConfig {
    /// This node: partitions it owns are committed locally.
    pub node: NodeId,
    /// The recovered checkpoint (already synced, and not below the oldest WAL segment): the first
    /// sequence number to dispatch.
    pub checkpoint: Seq,
    /// The WAL's durable next sequence number at start.
    pub durable_next: Seq,
    /// The bug planted in this dispatcher (simulator only; [`Plant::NONE`] everywhere else).
    pub plant: Plant,
}

/// Names one commit from the moment it is sent until its answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommitId(pub u64);

impl fmt::Display for CommitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "commit-{}", self.0)
    }
}

/// Who commits a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CommitOwner {
    /// This node owns the partition: the batch goes straight to the local combiner (no byte budget).
    Local,
    /// Another node owns it: the batch goes over the cluster transport (at most 8 MiB of records).
    Remote(NodeId),
}

/// A commit's records, shared between the dispatcher (which needs them back if the commit fails) and
/// the driver (which encodes or appends them). Cloning is cheap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitRecords(pub(super) Arc<Vec<DispatchRecord>>);

impl From<Vec<DispatchRecord>> for CommitRecords {
    /// Records for a commit a driver makes itself (an owner's tests, a forwarded batch).
    fn from(records: Vec<DispatchRecord>) -> CommitRecords {
        CommitRecords(Arc::new(records))
    }
}

impl Deref for CommitRecords {
    type Target = [DispatchRecord];
    fn deref(&self) -> &[DispatchRecord] {
        &self.0
    }
}

/// Commit a batch of one partition's records on its owner.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendCommit {
    /// Answer with [`DispatcherInput::CommitDone`] or [`DispatcherInput::CommitFailed`] naming this id.
    pub commit_id: CommitId,
    /// The topic name: the owner resolves the partition log by it.
    pub topic: Arc<str>,
    /// The incarnation every record of the batch was accepted under (a batch never mixes ids), or
    /// `None` for records of a topic without ids (format 1), which commit by name.
    pub topic_id: Option<TopicId>,
    /// The destination partition.
    pub partition: PartitionId,
    /// The owner to commit on.
    pub owner: CommitOwner,
    /// The records, in WAL order.
    pub records: CommitRecords,
    /// Whether to write the trailing incarnation section (`CommitProduceBatch`). `false` for an owner
    /// that refused it recently (an older release): the batch then commits by name.
    pub with_ids: bool,
    /// The commit's budget ends here (30 s, a probe's 5 s). A driver that gives up at the deadline
    /// answers [`CommitFailure::Timeout`].
    pub deadline: Instant,
}

/// Read records from the ingress WAL.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadWal {
    /// The first sequence number wanted.
    pub from: Seq,
    /// Return at most this many records.
    pub max_records: usize,
    /// Return at most this many record bytes, but always the first record when one is durable.
    pub max_bytes: usize,
}

/// A command the dispatcher asks its driver to carry out.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DispatcherOutput {
    /// Read durable WAL records; answer [`DispatcherInput::WalFrames`] or
    /// [`DispatcherInput::WalReadFailed`]. At most one read is outstanding.
    ReadWal(ReadWal),
    /// Send a commit; answer exactly once.
    SendCommit(SendCommit),
    /// Hand the checkpoint to the Checkpointer; answer [`DispatcherInput::CheckpointStored`] or
    /// [`DispatcherInput::CheckpointStoreFailed`]. At most one store is outstanding.
    StoreCheckpoint {
        /// The first sequence number not yet done.
        seq: Seq,
    },
    /// Ask the metastore leader (after a barrier, when this node leads) what it holds under the name;
    /// answer [`DispatcherInput::TopicGoneAnswer`]. At most one question per topic is outstanding.
    ConfirmTopicGone {
        /// The topic name.
        topic: String,
    },
    /// Log a warning (the spec's texts: [`DispatchWarning::message`]).
    Warn(DispatchWarning),
}

/// Why a commit did not land: an owner's typed answer (the local combiner's, or a remote owner's
/// over the cluster transport), or the driver giving up. [`CommitFailure::reaction`] is what the
/// dispatcher does about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommitFailure {
    /// The node is not (or no longer, or not yet) the partition's owner, or the partition is frozen for
    /// a handoff: retriable, there once the handoff ends or at the new owner.
    NotOwner,
    /// The owner holds another incarnation under the name (a remote owner's 412, the local combiner's
    /// `TopicIncarnationMismatch`). Not a failure of the destination.
    IncarnationMismatch {
        /// The incarnation the batch carried.
        record_topic_id: TopicId,
        /// The owner's live incarnation under the name (`None`: none, or one without an id).
        live_topic_id: Option<TopicId>,
    },
    /// The owner refused the trailing incarnation section as trailing data (400): an older release.
    RefusedTrailingIds,
    /// The owner could not take the batch now: unreachable, stopped, overloaded, its log not open.
    Unavailable(String),
    /// The owner tried and failed (its storage, or a batch it cannot commit); nothing of it is visible.
    Failed(String),
    /// The driver gave up at the commit's deadline (or the owner saw the caller gone).
    Timeout,
}

/// What the dispatcher does about a failed commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureReaction {
    /// The records (and the destination's queue) go back to the WAL, checked again at the next
    /// rescan; the destination is not failing and nothing is rerouted.
    Refused {
        /// The owner's live incarnation under the name, for the warning.
        live_topic_id: Option<TopicId>,
    },
    /// Sent again without the incarnation section on the rest of the same budget, and the owner gets
    /// id-less batches for a while (unless the batch already went without ids, or its budget is
    /// spent, or its incarnation changed: then it is [`FailureReaction::Failing`]).
    ResendWithoutIds,
    /// The destination is failing: the incarnation check runs again, then a probe and, past the
    /// reroute grace, a reroute.
    Failing,
}

impl CommitFailure {
    /// The dispatcher's reaction to this failure (the rules "Incarnation checks" and "Legacy owner").
    pub fn reaction(&self) -> FailureReaction {
        match self {
            CommitFailure::IncarnationMismatch { live_topic_id, .. } => FailureReaction::Refused {
                live_topic_id: *live_topic_id,
            },
            CommitFailure::RefusedTrailingIds => FailureReaction::ResendWithoutIds,
            CommitFailure::NotOwner
            | CommitFailure::Unavailable(_)
            | CommitFailure::Failed(_)
            | CommitFailure::Timeout => FailureReaction::Failing,
        }
    }
}

impl fmt::Display for CommitFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommitFailure::NotOwner => f.write_str("not the partition owner"),
            CommitFailure::IncarnationMismatch {
                record_topic_id,
                live_topic_id,
            } => write!(
                f,
                "topic incarnation mismatch: record {record_topic_id}, live {live_topic_id:?}"
            ),
            CommitFailure::RefusedTrailingIds => f.write_str("owner refused topic ids"),
            CommitFailure::Unavailable(reason) => write!(f, "owner unavailable: {reason}"),
            CommitFailure::Failed(reason) => write!(f, "commit failed: {reason}"),
            CommitFailure::Timeout => f.write_str("commit timed out"),
        }
    }
}

/// A topic as the local metastore replica holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicPlacement {
    /// The live incarnation, or `None` for a topic created before incarnation ids.
    pub topic_id: Option<TopicId>,
    /// The owner of each partition (`None`: not assigned yet). Its length is the partition count.
    pub owners: Vec<Option<NodeId>>,
}

/// What the metastore leader holds under a topic name, after a barrier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaderView {
    /// No topic has the name.
    Absent,
    /// A topic has the name, with this incarnation.
    Present {
        /// The live incarnation id (`None`: a topic from before ids).
        topic_id: Option<TopicId>,
    },
    /// The leader could not be reached or could not confirm: nothing is confirmed.
    Unconfirmed,
}

/// The events a dispatcher consumes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DispatcherInput {
    /// Time passed (the driver's timer for [`crate::Actor::poll_timeout`]).
    Tick,
    /// The WAL made records durable up to (not including) `next_seq`.
    Durable {
        /// The WAL's durable next sequence number.
        next_seq: Seq,
    },
    /// The answer to [`DispatcherOutput::ReadWal`]: consecutive records from its `from` (fewer than
    /// asked, or none, when the durable end comes first). Each is `(seq, encoded produce record)`.
    WalFrames {
        /// The records, in sequence order.
        frames: Vec<(Seq, Vec<u8>)>,
    },
    /// The WAL read failed: the dispatcher backs off.
    WalReadFailed {
        /// What failed.
        fault: IoFault,
    },
    /// The Checkpointer stored the checkpoint (in place; it syncs it within 250 ms).
    CheckpointStored {
        /// The stored value.
        seq: Seq,
    },
    /// The Checkpointer could not store it: the dispatcher backs off.
    CheckpointStoreFailed {
        /// The value that was not stored.
        seq: Seq,
        /// What failed.
        fault: IoFault,
    },
    /// A commit landed: its records are durable and visible on the owner.
    CommitDone {
        /// The commit.
        commit_id: CommitId,
    },
    /// A commit failed.
    CommitFailed {
        /// The commit.
        commit_id: CommitId,
        /// Why.
        failure: CommitFailure,
    },
    /// Membership reports a node alive or dead. A node never reported is neither.
    Member {
        /// The node.
        node: NodeId,
        /// `true` alive, `false` dead.
        alive: bool,
    },
    /// The local metastore replica changed a topic (`None`: the name is absent).
    Topic {
        /// The topic name.
        name: String,
        /// Its new state.
        view: Option<TopicPlacement>,
    },
    /// The answer to [`DispatcherOutput::ConfirmTopicGone`].
    TopicGoneAnswer {
        /// The topic name asked about.
        topic: String,
        /// What the leader holds.
        view: LeaderView,
    },
}

/// A warning the dispatcher logs. [`DispatchWarning::message`] is the spec's text; the fields are the
/// spec's fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DispatchWarning {
    /// A record placed for a topic the leader confirmed deleted.
    DiscardedForDeletedTopic {
        /// The topic name.
        topic: String,
        /// The record's incarnation, if it has one.
        topic_id: Option<TopicId>,
        /// The record's partition.
        partition: PartitionId,
        /// The record's WAL sequence number.
        seq: Seq,
    },
    /// A record placed for an incarnation the leader confirmed replaced (the name lives on).
    DiscardedStaleIncarnation {
        /// The topic name.
        topic: String,
        /// The record's (deleted) incarnation.
        topic_id: TopicId,
        /// The record's partition.
        partition: PartitionId,
        /// The record's WAL sequence number.
        seq: Seq,
    },
    /// A destination's queued records, discarded together just before they would have left.
    DiscardedQueueForDeletedTopic {
        /// The topic name.
        topic: String,
        /// The records' incarnation.
        topic_id: Option<TopicId>,
        /// The destination partition.
        partition: PartitionId,
        /// How many records.
        records: usize,
    },
    /// A record of a failed commit whose topic (incarnation) the leader confirmed deleted.
    DiscardedAfterFailedCommit {
        /// The topic name.
        topic: String,
        /// The record's incarnation.
        topic_id: Option<TopicId>,
        /// The destination partition.
        partition: PartitionId,
        /// The record's WAL sequence number.
        seq: Seq,
        /// The commit's error.
        error: CommitFailure,
    },
    /// An owner answered 412 (or the local combiner a mismatch): the records go back to the WAL.
    IncarnationRefused {
        /// The topic name.
        topic: String,
        /// The incarnation the batch carried.
        topic_id: Option<TopicId>,
        /// The destination partition.
        partition: PartitionId,
        /// The owner that refused.
        owner: CommitOwner,
        /// The owner's live incarnation under the name.
        live_topic_id: Option<TopicId>,
        /// Records sent back to the WAL (the batch and what queued behind it).
        records: usize,
    },
    /// A WAL record this release cannot decode: dispatch stops in front of it (a downgrade across a
    /// record format, or damage the frame CRC did not catch).
    UndecodableRecord {
        /// Its WAL sequence number.
        seq: Seq,
        /// Why it does not decode.
        error: DecodeError,
    },
}

/// "discarding undispatched record for deleted topic"
pub const WARN_DISCARD_DELETED_TOPIC: &str = "discarding undispatched record for deleted topic";
/// "discarding undispatched record of a deleted topic incarnation"
pub const WARN_DISCARD_STALE_INCARNATION: &str =
    "discarding undispatched record of a deleted topic incarnation";
/// "discarding undispatched produce records for deleted topic"
pub const WARN_DISCARD_QUEUE_DELETED_TOPIC: &str =
    "discarding undispatched produce records for deleted topic";
/// "owner refused produce records accepted for another topic incarnation; checking them again"
pub const WARN_INCARNATION_REFUSED: &str =
    "owner refused produce records accepted for another topic incarnation; checking them again";
/// Not a spec text: dispatch stops in front of a record it cannot decode.
pub const WARN_UNDECODABLE_RECORD: &str =
    "ingress dispatch stopped at a WAL record this release cannot decode";

impl DispatchWarning {
    /// The log line's text.
    pub fn message(&self) -> &'static str {
        match self {
            DispatchWarning::DiscardedForDeletedTopic { .. } => WARN_DISCARD_DELETED_TOPIC,
            DispatchWarning::DiscardedStaleIncarnation { .. } => WARN_DISCARD_STALE_INCARNATION,
            DispatchWarning::DiscardedQueueForDeletedTopic { .. } => {
                WARN_DISCARD_QUEUE_DELETED_TOPIC
            }
            DispatchWarning::DiscardedAfterFailedCommit { .. } => WARN_DISCARD_DELETED_TOPIC,
            DispatchWarning::IncarnationRefused { .. } => WARN_INCARNATION_REFUSED,
            DispatchWarning::UndecodableRecord { .. } => WARN_UNDECODABLE_RECORD,
        }
    }
}
