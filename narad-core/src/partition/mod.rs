//! The owner's partition log and its commit combiner.
//!
//! - [`log::PartitionLog`]: the storage engine for one partition — segmented, CRC-framed, with
//!   `CommitDurable` (append, fdatasync, read back and CRC-check, then advance the high watermark) as the
//!   only place a record becomes visible, recovery from the CRC-verified prefix, and reads below the high
//!   watermark.
//! - [`combiner::Combiner`]: one per partition; queues commit batches and runs one cycle at a time
//!   (re-checks under the produce lock, one run, one `CommitDurable`, one outcome per batch).
//! - [`owner::Owner`]: every partition log of a node, one combiner each, kept in step with the
//!   metastore replica (ownership views, parked reads, removal of retired logs).
//! - [`segment`]: segment names, the sparse offset index and the pure recovery scan.
//! - [`driver`]: a small synchronous driver that runs the actors' I/O on a `&dyn Disk` (tests, simulator).

pub mod combiner;
pub mod copy;
pub mod driver;
pub mod journal;
pub mod log;
pub mod owner;
pub mod segment;

#[cfg(test)]
mod crash_tests;

/// Why a read of [`ConsumeOutput::Read`] returned no record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PartitionReadError {
    /// The log refused or failed the read.
    #[error(transparent)]
    Log(#[from] LogReadError),
    /// The topic was deleted or recreated since the caller looked it up.
    #[error("topic incarnation {0} is no longer live")]
    NotLive(crate::ids::TopicId),
    /// The partition host stopped.
    #[error("the partition host has stopped")]
    Stopped,
}

/// Names one hosted combiner for as long as it lives; its I/O lanes are ordered by it. The owner
/// hands out the keys and the owner journal names the logs its entries belong to by them, so the key
/// lives here, below both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogKey(pub u64);

/// The key of the owner journal's requests (combiners' keys start at 1).
pub const JOURNAL_KEY: LogKey = LogKey(0);

pub use combiner::{
    BatchId, BatchRecord, Combiner, CombinerConfig, CombinerInput, CombinerOutput, CommitBatch,
    CommitError, CommittedRange, LiveTopic, QueryId, TopicView,
};
pub use log::{
    AppendRecord, CommitFault, CommitRequest, CommittedRun, JournalRun, LogCommitId, LogInput,
    LogOutput, LogReadError, LogReadId, LogStatus, PartitionLog, PartitionLogConfig,
    PartitionStats, ReadBatch, ReadFault, ReadRequest, RecoveryError, RecoveryReport,
    PREALLOCATE_BYTES_DEFAULT, SEGMENT_BYTES_MAX_DEFAULT,
};
