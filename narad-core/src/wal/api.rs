//! The WAL actor's inputs, outputs and operating errors.

use core::fmt;

use crate::codec::DecodeError;
use crate::disk::{IoCompletion, IoRequest};
use crate::error::IoFault;
use crate::ids::Seq;

/// Identifies one append (single or batch) so its outcome can be routed to its caller. Chosen by the
/// driver; the WAL only echoes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AppendId(pub u64);

/// Identifies one read so its reply can be routed. Chosen by the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WalReadId(pub u64);

/// The consecutive sequence numbers `[first, next)` an append took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqRange {
    /// The first record's sequence number.
    pub first: Seq,
    /// One past the last record's.
    pub next: Seq,
}

impl SeqRange {
    /// How many records.
    pub fn len(&self) -> u64 {
        self.next.0 - self.first.0
    }

    /// True when the range holds no record.
    pub fn is_empty(&self) -> bool {
        self.first == self.next
    }
}

/// Why a batch's fill could not produce record `index`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FillError {
    /// The fill reported a failure.
    #[error("fill failed: {0}")]
    Failed(String),
    /// The fill panicked; the panic was caught and treated as a failure.
    #[error("fill panicked")]
    Panicked,
}

/// Writes record `index` of a batch into `out`, which is exactly the size announced for it, directly
/// inside the staging buffer (no intermediate copy). It runs while the batch holds the WAL, in record
/// order, once per record. A failure (or panic) withdraws the records staged since the call started or
/// since a roll inside it, and gives their sequence numbers back.
pub type FillFn = Box<dyn FnMut(usize, &mut [u8]) -> Result<(), FillError> + Send>;

/// Why an append was not acknowledged. Every error means "not durable as a whole": records of a batch
/// that a roll already synced stay in the log and are replayed (at-least-once).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AppendError {
    /// The write or fsync of the append's group commit failed, or the WAL was already latched by such a
    /// failure: every append is refused with the same fault until restart.
    #[error("ingress WAL disk failure: {0}")]
    Disk(IoFault),
    /// The batch's fill failed for record `index`; nothing of the batch after the last roll was kept.
    #[error("record {index}: {error}")]
    Fill {
        /// The record whose fill failed.
        index: usize,
        /// What the fill reported.
        error: FillError,
    },
    /// Record `index` is larger than the record limit (nothing was staged).
    #[error("record {index} is {bytes} bytes, above the {bytes_max}-byte limit")]
    RecordTooLarge {
        /// The record.
        index: usize,
        /// Its size.
        bytes: usize,
        /// The limit.
        bytes_max: usize,
    },
    /// Record `index` is empty, which the frame format cannot carry (nothing was staged).
    #[error("record {index} is empty")]
    EmptyRecord {
        /// The record.
        index: usize,
    },
    /// Too many bytes wait for durability already (nothing was staged).
    #[error("ingress WAL overloaded: {unflushed_bytes} bytes unflushed, limit {bytes_max}")]
    Overloaded {
        /// Bytes staged, queued or in flight, plus this append's.
        unflushed_bytes: usize,
        /// [`super::WalConfig::unflushed_bytes_max`].
        bytes_max: usize,
    },
}

/// One durable record as read back: its sequence number and its raw (still encoded) record bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalFrame {
    /// The record's sequence number.
    pub seq: Seq,
    /// The encoded record (a [`crate::codec::wal::ProduceRecord`] for the ingress path), not decoded.
    pub payload: Vec<u8>,
}

/// Why a read failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WalReadError {
    /// `from` is below the oldest segment left on disk.
    #[error("sequence numbers below {oldest} were compacted")]
    Compacted {
        /// The oldest segment's first sequence number.
        oldest: Seq,
    },
    /// [`super::WalConfig::reads_in_flight_max`] disk reads are in flight; ask again later.
    #[error("too many WAL reads in flight")]
    Busy,
    /// The disk read failed.
    #[error("WAL read failed: {0}")]
    Io(IoFault),
    /// Durable bytes no longer decode (bit rot); never served as good.
    #[error("corrupt WAL frame in segment {segment} at offset {offset}: {error}")]
    Corrupt {
        /// The segment's first sequence number.
        segment: Seq,
        /// Byte offset of the frame in the segment.
        offset: u64,
        /// What was wrong.
        error: DecodeError,
    },
    /// A frame that decodes carries another sequence number than its position implies.
    #[error(
        "WAL frame in segment {segment} at offset {offset} has seq {found}, expected {expected}"
    )]
    SeqMismatch {
        /// The segment's first sequence number.
        segment: Seq,
        /// Byte offset of the frame in the segment.
        offset: u64,
        /// The sequence number the position implies.
        expected: Seq,
        /// The one the frame carries.
        found: Seq,
    },
}

/// Text of the warning logged when the stored checkpoint is below the oldest segment (spec, WAL compaction).
pub const CHECKPOINT_BELOW_OLDEST_SEGMENT: &str =
    "ingress dispatch checkpoint was below the oldest WAL segment; dispatch starts at that segment";

/// Something the driver should log at warning level; nothing for it to decide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WalWarning {
    /// At open, the stored checkpoint was below the oldest segment: dispatch starts at the segment.
    CheckpointBelowOldestSegment {
        /// The stored checkpoint.
        checkpoint: Seq,
        /// The oldest segment's first sequence number, where dispatch starts.
        oldest_segment: Seq,
    },
    /// Preparing the spare segment failed; the next roll creates an empty segment instead.
    PrepareFailed {
        /// The fault.
        fault: IoFault,
    },
    /// Deleting compacted segments failed; they stay and are retried at the next synced checkpoint.
    CompactionFailed {
        /// The fault.
        fault: IoFault,
    },
}

impl WalWarning {
    /// The log message (the spec's text where it gives one).
    pub fn message(&self) -> &'static str {
        match self {
            WalWarning::CheckpointBelowOldestSegment { .. } => CHECKPOINT_BELOW_OLDEST_SEGMENT,
            WalWarning::PrepareFailed { .. } => {
                "ingress WAL segment preparation failed; the next roll creates an empty segment"
            }
            WalWarning::CompactionFailed { .. } => "ingress WAL compaction failed; retrying later",
        }
    }
}

/// An event for [`super::IngressWal`].
pub enum WalInput {
    /// Stage one encoded record; answered by one [`WalOutput::AppendDone`] once it is durable or failed.
    Append {
        /// Echoed in the answer.
        id: AppendId,
        /// The encoded record (1..=`record_bytes_max` bytes).
        record: Vec<u8>,
    },
    /// Stage a batch: `sizes[i]` bytes for record `i`, written by `fill`. Every size is checked before
    /// anything is staged; the records take consecutive sequence numbers with nothing interleaved; one
    /// [`WalOutput::AppendDone`] answers the whole batch once its last record is durable.
    AppendMany {
        /// Echoed in the answer.
        id: AppendId,
        /// Each record's encoded size.
        sizes: Vec<usize>,
        /// Writes each record into the staging buffer; see [`FillFn`].
        fill: FillFn,
    },
    /// A request the WAL emitted has run. The driver hands the request back with its completion, so the
    /// WAL reuses its write buffers instead of allocating one per group commit.
    IoDone {
        /// The request as emitted.
        request: IoRequest,
        /// Its outcome.
        completion: IoCompletion,
    },
    /// Read durable records from `from` on; answered by one [`WalOutput::ReadDone`].
    Read {
        /// Echoed in the answer.
        id: WalReadId,
        /// First sequence number wanted.
        from: Seq,
        /// At most this many records.
        max_records: usize,
        /// At most this many payload bytes, except that a non-empty answer always holds one record.
        max_bytes: usize,
    },
    /// The checkpointer synced this value: every record below it is committed. Compaction trails it.
    CheckpointSynced {
        /// The synced checkpoint (first sequence number not dispatched).
        seq: Seq,
    },
    /// [`crate::Actor::poll_timeout`] has passed.
    Tick,
    /// Several inputs at once, handled in order as one event: the next flush starts only after the
    /// last of them, so appends that arrived together share one group commit even when no flush was
    /// running (a driver hands over what its mailbox held in one turn). A batch holds no batch.
    Batch(Vec<WalInput>),
}

impl WalInput {
    /// A batch of already encoded records, as [`WalInput::AppendMany`] with a fill that copies them.
    pub fn append_many_bytes(id: AppendId, records: Vec<Vec<u8>>) -> WalInput {
        let sizes = records.iter().map(Vec::len).collect();
        let fill = move |index: usize, out: &mut [u8]| {
            out.copy_from_slice(&records[index]);
            Ok(())
        };
        WalInput::AppendMany {
            id,
            sizes,
            fill: Box::new(fill),
        }
    }
}

impl fmt::Debug for WalInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WalInput::Batch(inputs) => f.debug_tuple("Batch").field(inputs).finish(),
            WalInput::Append { id, record } => f
                .debug_struct("Append")
                .field("id", id)
                .field("bytes", &record.len())
                .finish(),
            WalInput::AppendMany { id, sizes, fill: _ } => f
                .debug_struct("AppendMany")
                .field("id", id)
                .field("sizes", sizes)
                .finish_non_exhaustive(),
            WalInput::IoDone {
                request,
                completion,
            } => f
                .debug_struct("IoDone")
                .field("id", &request.id)
                .field("ok", &completion.result.is_ok())
                .finish(),
            WalInput::Read {
                id,
                from,
                max_records,
                max_bytes,
            } => f
                .debug_struct("Read")
                .field("id", id)
                .field("from", from)
                .field("max_records", max_records)
                .field("max_bytes", max_bytes)
                .finish(),
            WalInput::CheckpointSynced { seq } => f
                .debug_struct("CheckpointSynced")
                .field("seq", seq)
                .finish(),
            WalInput::Tick => f.write_str("Tick"),
        }
    }
}

/// A command from [`super::IngressWal`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum WalOutput {
    /// Run this request on its lane and hand it back with its completion ([`WalInput::IoDone`]).
    Io(IoRequest),
    /// An append's outcome: its sequence numbers once all its records are durable, or why not.
    AppendDone {
        /// The append.
        id: AppendId,
        /// Durable sequence numbers, or the error.
        result: Result<SeqRange, AppendError>,
    },
    /// The durable frontier advanced: every record below `next_seq` is durable (wake the dispatcher).
    Durable {
        /// The new durable next sequence number.
        next_seq: Seq,
    },
    /// A read's answer: consecutive durable records from `from` on (empty when `from` is at or past the
    /// durable frontier; otherwise at least one, possibly stopping early at a segment's end).
    ReadDone {
        /// The read.
        id: WalReadId,
        /// The records, or why not.
        result: Result<Vec<WalFrame>, WalReadError>,
    },
    /// The WAL latched on this fault: every later append is refused until restart
    /// (`narad_ingress_wal_failed` = 1). Emitted once.
    Latched {
        /// The fault.
        fault: IoFault,
    },
    /// Log this at warning level.
    Warning(WalWarning),
}
