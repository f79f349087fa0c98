//! `PartitionLog`: the owner's storage engine for one partition, as a pure actor.
//!
//! # Contract
//! - **Open / recovery.** [`PartitionLog::open`] emits `[CreateDirAll, List]`, then the length of every
//!   segment, then reads each segment in pieces of `recovery_read_bytes_max` (one `ReadAt` a piece, a
//!   piece grown to hold a whole frame longer than it: [`RECOVERY_READ_BYTES_DEFAULT`]) and scans it
//!   exactly as a scan of the whole segment would ([`super::segment::scan_segment`]). The high
//!   watermark is the end of the CRC-verified frames: there is no boundary file. Damage in the *last*
//!   segment with nothing verified behind it (a torn append: a crash keeps a prefix of an append) is
//!   truncated. Damage with verified frames behind it is skipped, never truncated, and the frames behind
//!   it kept ([`super::segment::verified_frame_behind`], [`RecoveryReport::skipped`]), whatever their
//!   commit times: rot of an acknowledged frame followed by one acknowledged commit looks exactly like a
//!   failed commit's leftovers, and keeping the latter only serves records that were produced (their
//!   commit is retried: duplicates) while truncating the former would lose acknowledged records. The
//!   skipped offsets stay below the high watermark and read as [`LogReadError::Unreadable`]. An earlier
//!   (sealed) segment's damage is skipped the same way, never truncated: with verified frames behind
//!   it (it may have been skipped while that segment was the last), or at its end, where the next
//!   segment's base proves which offsets the damaged bytes held. One rotten frame costs its own
//!   records, loudly, never the partition. Segments whose offsets do not continue each other fail the
//!   open ([`RecoveryError`]). Zeros from the end of the frames to the end of a file are no damage
//!   (the zero fill, or an append whose pages never reached the disk) unless the next segment's base
//!   proves offsets missing there. Recovery
//!   ends with `[SetLen(verified), WriteAt(last run again), SyncData(last), SyncDir]` so that bytes a
//!   process crash left in the page cache are durable before anything is served from them (the
//!   rewrite of the frames sharing the last commit time re-dirties pages a failed fsync marked clean:
//!   see `finalize`; a last run longer than a piece is read again and written back a piece at a time
//!   first, its last piece being the `WriteAt` here), and so that the durable file ends where the
//!   verified frames end even when the cache shows a truncate an earlier failed sync dropped; only
//!   then [`LogOutput::Opened`].
//! - **CommitDurable.** [`LogInput::Commit`] encodes the run into frames (one frame per about
//!   `frame_records_bytes_target`), and emits one request: `[SetLen (on roll: the sealed segment's
//!   zeros trimmed), Create (on roll)], WriteAt (the whole run, one write), [WriteZeros (when the run
//!   ends past the zero fill: the next [`PREALLOCATE_BYTES_DEFAULT`] or so)], SyncData, [SyncDir (while
//!   the segment's name is not yet durable)], ReadAt (the run)`.
//!   The read-back must decode every frame (CRC) with exactly the header written. Only then the high
//!   watermark advances and [`LogOutput::CommitDone`] reports the offsets: the only place a record becomes
//!   visible. Commit times never go backwards: a run is stamped `max(requested, last committed)`.
//! - **Failure and fsyncgate.** A failed commit (create/write/sync error, read-back error or mismatch)
//!   discards everything above the high watermark in memory at once, reports the fault, and repairs the
//!   file before accepting anything else: `[SetLen(high-watermark position), SyncData]`. After a failed
//!   fsync the tail's pages are of unknown content (dropped, yet marked clean); truncating them away and
//!   syncing the new size makes the region above the high watermark empty *durably*, so a later append
//!   there writes fresh pages instead of trusting the ones the failed sync lost. A failed sync is never
//!   retried to "confirm" data. If the repair itself fails the log **latches** ([`LogStatus::Latched`],
//!   [`LogOutput::Latched`]): every commit is refused until [`PartitionLog::retry_repair`] (the owner
//!   spaces retries out) truncates and syncs successfully. A latched log is deliberately *not* reopened
//!   in-process: recovery reads the page cache, which after a failed fsync still shows the lost run as
//!   valid frames; adopting them and appending acknowledged commits behind them would lose those commits
//!   at the next power loss. For the same reason a failed sync at the end of recovery is
//!   [`RecoveryError::Sync`], which forbids reopening in this process.
//! - **Reads** serve only offsets below the high watermark, and only bytes of the verified prefix of a
//!   segment: `Read{offset}` below the oldest segment is [`LogReadError::BelowOldestRetained`], at or past
//!   the high watermark [`LogReadError::AtOrPastHighWatermark`], both without I/O. A sparse index (one
//!   entry per `index_interval_bytes`) bounds the bytes scanned; every served frame is CRC-checked, and a
//!   damaged one is [`LogReadError::Unreadable`], never served. Reads run on their own lane and may overlap
//!   a commit (they never touch bytes above the high watermark).
//!
//! # Polling order
//! After every [`Actor::handle`] drain [`Actor::poll_output`]. Requests on `commit_lane` must run one at
//! a time in emission order; reads may run concurrently on `read_lane`. The log sets no timers.
//!
//! # Invariants (checked after every `handle` in debug builds)
//! `oldest ≤ high watermark ≤ next offset`; segments are contiguous and the last ends at the high
//! watermark; at most one commit or repair in flight; reads in flight ≤ `reads_in_flight_max`.
//! Contiguity and the sparse indexes' order are asserted where a segment or an index entry is added
//! (only the last segment changes afterwards), so the check after each event costs O(log segments).

use std::collections::{BTreeMap, VecDeque};

mod commit;
mod invariants;
#[cfg(test)]
mod journaled_tests;
#[cfg(test)]
mod piece_tests;
mod pieces;
mod read;
mod recovery;
mod retention;
#[cfg(test)]
mod tests;

use super::segment::{parse_segment_name, segment_name, FrameDamage, SparseIndex};
use crate::actor::Actor;
use crate::codec::partition::{
    encode_frame, verify_frame_checked, PartitionRecord, RecordView, FRAME_HEADER_BYTES,
    FRAME_RECORDS_BYTES_MAX,
};
use crate::codec::DecodeError;
use crate::disk::{join, IoCompletion, IoId, IoLane, IoOp, IoReply, IoRequest};
use crate::error::IoFault;
use crate::ids::Offset;
use crate::planted::{Plant, PlantedBug};
use crate::time::Instant;
use pieces::{PieceRead, PieceScan, PieceScanDone};
pub use recovery::{RecoveryError, RecoveryReport, SkippedDamage};
use retention::Retention;
pub use retention::{RetainReason, RetainedRange, RetentionPolicy};

/// Segment roll threshold: a run that would take the active segment past this starts a new one.
pub const SEGMENT_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;
/// Zeros written ahead of the last segment's frames, at most an eighth of `segment_bytes_max`.
///
/// An fdatasync of an append that grows the file must also make its new size and blocks durable (a
/// journal commit; on ext4 without a journal, synchronous writes of the inode and the block bitmaps):
/// more device round trips and CPU per commit. One into bytes already written (the zeros) writes the
/// data and flushes, nothing else. So a commit that writes past the zeros extends them by this much
/// in the same fsync, and the commits after it, until the zeros run out, pay for their own bytes
/// only. 1 MiB is about a thousand 1 KiB records: one commit in many tens pays the metadata, and a
/// roll, a repair or a recovery trims the zeros off. Only while commits are small (see
/// [`PREALLOCATE_RUN_BYTES_MAX`]).
pub const PREALLOCATE_BYTES_DEFAULT: u64 = 1024 * 1024;
/// The zero fill is extended only while the log's commits average fewer bytes than this.
///
/// Every byte of fill is written twice (zeros, then frames), which pays for itself when the metadata
/// an fsync saves costs more than the commit's bytes do: small commits (11 records of 1 KiB: +9 to
/// 13% produces per second on ext4; of 4 KiB, about 42 KB: +11%), not large ones, whose disk
/// bandwidth it takes instead (100 records of 1 KiB: -21% payload MB/s; all measured side by side on
/// the bench machine).
pub const PREALLOCATE_RUN_BYTES_MAX: u64 = 64 * 1024;
/// A run is cut into frames of about this many record bytes (a frame is the unit a read verifies).
pub const FRAME_RECORDS_BYTES_TARGET_DEFAULT: usize = 1024 * 1024;
/// Bytes of frames between two sparse-index entries.
pub const INDEX_INTERVAL_BYTES_DEFAULT: u64 = 4096;
/// The most record bytes one read returns (at least one record is always returned).
pub const READ_BYTES_MAX_DEFAULT: u32 = 4 * 1024 * 1024;
/// Bytes one read of recovery asks for: a segment (up to [`SEGMENT_BYTES_MAX_DEFAULT`]) is scanned
/// a piece at a time, so that many partitions recovering at once hold a few MiB each, not a segment
/// each.
///
/// A piece grows to hold a whole frame when a frame header says the frame is longer than the piece
/// (up to [`crate::codec::partition::FRAME_BYTES_MAX`], and never past the end of the file): a frame
/// is only verified whole. The scan also holds on to the bytes of the last run while they fit in a
/// piece (for the rewrite at the end of recovery; a longer one is read again then), so a scan holds
/// at most about two pieces and the largest frame.
pub const RECOVERY_READ_BYTES_DEFAULT: usize = 4 * 1024 * 1024;
/// Reads in flight at once; more are refused with [`LogReadError::Busy`].
pub const READS_IN_FLIGHT_MAX_DEFAULT: usize = 64;
/// Io ids each log instance may use: ids `io_id_base .. io_id_base + IO_IDS_PER_LOG`.
pub const IO_IDS_PER_LOG: u64 = 1 << 40;
/// Read requests one read may issue before giving up (the first, then follow-ups for a frame larger
/// than the first chunk).
const READ_ATTEMPTS_MAX: u8 = 4;

/// Configuration of one partition log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionLogConfig {
    /// Directory holding the segments (relative to the disk root).
    pub dir: String,
    /// Roll threshold; see [`SEGMENT_BYTES_MAX_DEFAULT`].
    pub segment_bytes_max: u64,
    /// Zero fill ahead of the frames (0: none); see [`PREALLOCATE_BYTES_DEFAULT`].
    pub preallocate_bytes: u64,
    /// Frame size target; see [`FRAME_RECORDS_BYTES_TARGET_DEFAULT`].
    pub frame_records_bytes_target: usize,
    /// Sparse index spacing; see [`INDEX_INTERVAL_BYTES_DEFAULT`].
    pub index_interval_bytes: u64,
    /// Cap on a read's `bytes_max`; see [`READ_BYTES_MAX_DEFAULT`].
    pub read_bytes_max: u32,
    /// See [`READS_IN_FLIGHT_MAX_DEFAULT`].
    pub reads_in_flight_max: usize,
    /// Bytes one read of recovery asks for (unless a frame is longer); see
    /// [`RECOVERY_READ_BYTES_DEFAULT`].
    pub recovery_read_bytes_max: usize,
    /// First io id this instance uses (give every instance its own range of [`IO_IDS_PER_LOG`]).
    pub io_id_base: u64,
    /// Lane of recovery, commit and repair requests (serialized).
    pub commit_lane: IoLane,
    /// Lane of read requests.
    pub read_lane: IoLane,
    /// Lane of the lazy syncs of a journaled log (they may overlap its commits and reads).
    pub sync_lane: IoLane,
    /// Whether the owner journal makes commits durable: a commit is then written and read back here
    /// without an fsync, handed to the journal ([`LogOutput::Journal`]), and made visible only once
    /// the journal's fsync covers it ([`LogInput::JournalDone`]); this log's files are synced lazily
    /// ([`LogInput::Sync`]) so the journal can be trimmed behind them.
    pub journaled: bool,
    /// The bug planted in this log (simulator only; [`Plant::NONE`] everywhere else).
    pub plant: Plant,
}

impl PartitionLogConfig {
    /// The production defaults for a log in `dir`.
    pub fn new(dir: impl Into<String>) -> Self {
        PartitionLogConfig {
            dir: dir.into(),
            segment_bytes_max: SEGMENT_BYTES_MAX_DEFAULT,
            preallocate_bytes: PREALLOCATE_BYTES_DEFAULT,
            frame_records_bytes_target: FRAME_RECORDS_BYTES_TARGET_DEFAULT,
            index_interval_bytes: INDEX_INTERVAL_BYTES_DEFAULT,
            read_bytes_max: READ_BYTES_MAX_DEFAULT,
            reads_in_flight_max: READS_IN_FLIGHT_MAX_DEFAULT,
            recovery_read_bytes_max: RECOVERY_READ_BYTES_DEFAULT,
            io_id_base: 0,
            commit_lane: IoLane(0),
            read_lane: IoLane(1),
            sync_lane: IoLane(2),
            journaled: false,
            plant: Plant::NONE,
        }
    }
}

/// Identifies a commit so its outcome can be matched to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogCommitId(pub u64);

/// Identifies a read so its outcome can be matched to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogReadId(pub u64);

/// A record to append; the log stamps its commit time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendRecord {
    /// The key, or `None` (an empty key is stored as none).
    pub key: Option<Vec<u8>>,
    /// The message bytes.
    pub payload: Vec<u8>,
}

/// One run to make durable and visible.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitRequest {
    /// Echoed in [`LogOutput::CommitDone`].
    pub id: LogCommitId,
    /// The run, in offset order.
    pub records: Vec<AppendRecord>,
    /// The commit time wanted (Unix ms); the log uses `max(this, last committed)`.
    pub committed_at_ms: u64,
}

/// A successful commit: the run's offsets, now below the high watermark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommittedRun {
    /// Offset of the run's first record.
    pub base: Offset,
    /// Records in the run.
    pub count: u64,
    /// The commit time stamped on every record of the run (Unix ms).
    pub committed_at_ms: u64,
}

/// Why a commit did not become durable. Nothing of the run is visible; the caller may commit again.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommitFault {
    /// The log is opening, repairing, committing, latched or failed to open.
    #[error("partition log not ready ({0:?})")]
    NotReady(LogStatus),
    /// The run had no records.
    #[error("empty commit")]
    Empty,
    /// A record does not fit in a frame.
    #[error("record larger than a frame")]
    RecordTooLarge,
    /// Creating the new segment (roll) failed.
    #[error("creating a segment failed: {0}")]
    Create(IoFault),
    /// The write failed.
    #[error("write failed: {0}")]
    Write(IoFault),
    /// fdatasync (or the directory sync of a new segment) failed.
    #[error("sync failed: {0}")]
    Sync(IoFault),
    /// Reading the run back failed.
    #[error("read-back failed: {0}")]
    ReadBack(IoFault),
    /// The bytes read back are not the frames written (torn, rotten or short).
    #[error("read-back verification failed")]
    ReadBackMismatch,
}

/// A read: up to `records_max` records (and about `bytes_max` payload bytes) from `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    /// Echoed in [`LogOutput::ReadDone`].
    pub id: LogReadId,
    /// First offset wanted.
    pub offset: Offset,
    /// Records wanted at most (0 counts as 1).
    pub records_max: u32,
    /// Record bytes wanted at most; at least one record is returned. Capped by the config.
    pub bytes_max: u32,
}

/// Records read: `records[i]` is at offset `first + i`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadBatch {
    /// Offset of the first record.
    pub first: Offset,
    /// At least one record, all below the high watermark.
    pub records: Vec<PartitionRecord>,
    /// The high watermark when the read completed.
    pub high_watermark: Offset,
}

/// Why a read returned no records.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LogReadError {
    /// The log is not open (opening, or failed to open).
    #[error("partition log not open")]
    NotOpen,
    /// Too many reads in flight.
    #[error("too many reads in flight")]
    Busy,
    /// Nothing is visible at this offset yet (HTTP 204).
    #[error("offset at or past the high watermark {high_watermark}")]
    AtOrPastHighWatermark {
        /// The current high watermark.
        high_watermark: Offset,
    },
    /// The offset is below the oldest retained record (HTTP 410).
    #[error("offset below the oldest retained offset {oldest}")]
    BelowOldestRetained {
        /// The oldest retained offset.
        oldest: Offset,
    },
    /// The bytes holding the offset could not be read or failed their check (HTTP 410).
    #[error("offset {offset} unreadable: {reason}")]
    Unreadable {
        /// The offset asked for.
        offset: Offset,
        /// What went wrong.
        reason: ReadFault,
    },
    /// The log was retired (its topic incarnation is gone) before the read completed.
    #[error("partition log retired")]
    Retired,
}

/// Why stored bytes could not be served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadFault {
    /// The disk failed the read.
    #[error("{0}")]
    Io(IoFault),
    /// A frame failed to decode (checksum, structure) — damage below the high watermark.
    #[error("damaged frame: {0}")]
    Damaged(DecodeError),
    /// The offset lies in damaged bytes that recovery skipped (the frames around it do not hold it).
    #[error("in damaged bytes recovery skipped")]
    Skipped,
}

/// Where the log is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogStatus {
    /// Recovery in progress.
    Opening,
    /// Accepting a commit.
    Ready,
    /// A commit is in flight.
    Committing,
    /// Truncating a failed commit's tail.
    Repairing,
    /// A repair failed: commits refused until [`PartitionLog::retry_repair`] succeeds.
    Latched,
    /// Retention is rolling the active segment (an idle partition's data expires too): commits wait.
    Rolling,
    /// Recovery failed: nothing is served until reopened.
    OpenFailed,
}

/// Inputs of [`PartitionLog`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogInput {
    /// Append and make durable a run.
    Commit(CommitRequest),
    /// Read records below the high watermark.
    Read(ReadRequest),
    /// An I/O request completed.
    Io(IoCompletion),
    /// The owner journal's outcome for the commit handed to it ([`LogOutput::Journal`]).
    JournalDone {
        /// The commit.
        id: LogCommitId,
        /// `Ok` once the journal's fsync covers the commit's frames and they were read back.
        result: Result<(), IoFault>,
    },
    /// Make every visible record of a journaled log durable in its own files; answered
    /// [`LogOutput::Synced`] (at once when nothing is unsynced) or [`LogOutput::SyncFailed`].
    Sync,
    /// Remove what the topic's retention no longer keeps (see the `retention` module).
    Retain(RetentionPolicy),
}

/// A journaled commit's frames, as written to (and read back from) the partition segment: what the
/// owner journal makes durable for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalRun {
    /// The partition segment the run was written to (its base offset).
    pub segment: Offset,
    /// The run's byte position in that segment.
    pub position: u64,
    /// The run's frames, byte for byte as read back.
    pub bytes: Vec<u8>,
    /// Each frame: `(position in bytes, length, offset past its last record)`.
    pub frames: Vec<(usize, usize, Offset)>,
}

/// Outputs of [`PartitionLog`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum LogOutput {
    /// Run this I/O request and feed back its completion.
    Io(IoRequest),
    /// Recovery finished; the log is ready.
    Opened(RecoveryReport),
    /// Recovery failed; the log serves nothing.
    OpenFailed(RecoveryError),
    /// A commit's outcome.
    CommitDone {
        /// The commit.
        id: LogCommitId,
        /// Its offsets, or why nothing of it is visible.
        result: Result<CommittedRun, CommitFault>,
    },
    /// A read's outcome.
    ReadDone {
        /// The read.
        id: LogReadId,
        /// Records, or why none.
        result: Result<ReadBatch, LogReadError>,
    },
    /// A failed commit could not be repaired: commits are refused until the log is reopened.
    Latched(IoFault),
    /// A journaled commit is written and read back here: make `run` durable in the owner journal and
    /// answer [`LogInput::JournalDone`].
    Journal {
        /// The commit.
        id: LogCommitId,
        /// Its frames.
        run: JournalRun,
    },
    /// Every record below `through` is durable in this log's own files (a lazy sync, or nothing was
    /// unsynced).
    Synced {
        /// The high watermark when the sync started.
        through: Offset,
    },
    /// A lazy sync failed: nothing is vouched for; the next [`LogInput::Sync`] resyncs (reads the
    /// unsynced ranges back, verifies and writes them again, then syncs).
    SyncFailed(IoFault),
    /// A resync must wait for the commit in flight: ask again later.
    SyncDeferred,
    /// Retention took segments out of the log (their files are unlinked behind the readers).
    Retained(RetainedRange),
    /// An unlink or a roll of retention failed; the next check tries again.
    RetentionFailed(IoFault),
}

/// The figures `partition_stats` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionStats {
    /// Segment files.
    pub segments: usize,
    /// The oldest retained offset.
    pub oldest_offset: Offset,
    /// The next offset to assign (above the high watermark only while a commit is in flight).
    pub next_offset: Offset,
    /// Records below it are visible.
    pub high_watermark: Offset,
    /// Verified bytes in all segments.
    pub size_bytes: u64,
    /// The commit time of the oldest record kept (Unix ms), if any.
    pub oldest_segment_at_ms: Option<u64>,
}

#[derive(Clone, Debug)]
struct Segment {
    /// The file's path, formatted once (every commit and read names it).
    path: String,
    end_offset: Offset,
    /// Bytes of frames (the verified prefix, then the commits of this process).
    bytes: u64,
    /// How far the file holds bytes already written, frames then zeros, as far as this process knows
    /// (at least `bytes`; it only decides where the next zero fill starts, never what is read).
    file_bytes: u64,
    index: SparseIndex,
    /// False while the segment's directory entry may not survive a crash (created, dir not synced).
    name_durable: bool,
    /// Journaled: bytes of frames a successful sync covered (the rest is durable in the journal only).
    synced_bytes: u64,
    /// The commit time of its first and of its last verified record (retention judges by them).
    first_at_ms: Option<u64>,
    last_at_ms: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Trimming the zero fill off the segment a roll seals.
    Seal,
    Create,
    Write,
    /// Extending the zero fill.
    Fill,
    Sync,
    SyncDir,
    ReadBack,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FrameMeta {
    base: Offset,
    count: u32,
    /// Position relative to the run's start.
    position: u64,
    records_bytes: u32,
    crc: u32,
}

#[derive(Clone, Debug)]
struct PendingCommit {
    id: LogCommitId,
    io: IoId,
    segment: Offset,
    created: bool,
    position: u64,
    run_bytes: u64,
    /// The segment's `file_bytes` once the commit lands.
    file_bytes: u64,
    frames: Vec<FrameMeta>,
    end_offset: Offset,
    committed_at_ms: u64,
    stages: Stages,
}

/// The stage of each op of a commit request, in op order (at most seven ops: no allocation per commit).
#[derive(Clone, Copy, Debug, Default)]
struct Stages {
    stages: [Option<Stage>; 7],
    len: usize,
}

impl Stages {
    fn push(&mut self, stage: Stage) {
        self.stages[self.len] = Some(stage);
        self.len += 1;
    }

    /// The stage of the op at `index`, if there is such an op.
    fn get(&self, index: usize) -> Option<Stage> {
        self.stages.get(index).copied().flatten()
    }
}

#[derive(Clone, Debug)]
struct ScanState {
    bases: Vec<Offset>,
    lens: Vec<u64>,
    next: usize,
    /// Damage skipped so far, in segment order.
    skipped: Vec<SkippedDamage>,
    /// The scan of segment `next` and the read of its that is in flight.
    reading: Option<(Box<PieceScan>, PieceRead)>,
}

/// What the end of recovery writes again of the last segment's last run.
#[derive(Clone, Debug)]
enum RunRewrite {
    /// No frame verified.
    None,
    /// The run's bytes, from its byte position, as the scan kept them.
    Held(u64, Vec<u8>),
    /// The run's byte range `[start, end)`, longer than the scan kept: read again first.
    Reread(u64, u64),
}

/// A last run being read again and written back, a piece at a time, before the final request.
#[derive(Clone, Debug)]
struct Reread {
    report: RecoveryReport,
    /// Where the run ends.
    end: u64,
    /// The piece being read.
    read: PieceRead,
    /// A piece was written back already (a failure now is [`RecoveryError::Sync`]).
    wrote: bool,
}

#[derive(Clone, Debug)]
enum Phase {
    Listing(IoId),
    Measuring(IoId, Vec<Offset>),
    Scanning(IoId, ScanState),
    Rewriting(IoId, Box<Reread>),
    Finalizing(IoId, RecoveryReport),
    Ready,
    Committing(Box<PendingCommit>),
    /// Written and read back here; waiting for the owner journal's fsync.
    Journaling(Box<PendingCommit>),
    Repairing(IoId, RepairTarget),
    /// Retention's roll of the active segment (whether it trims the zero fill first).
    Rolling(IoId, bool),
    Latched(IoFault, RepairTarget),
    OpenFailed(RecoveryError),
}

/// Where a failed commit's segment must be cut back to: the last byte known durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RepairTarget {
    segment: Offset,
    position: u64,
}

#[derive(Clone, Copy, Debug)]
struct PendingRead {
    request: ReadRequest,
    segment: Offset,
    position: u64,
    /// The base offset of the frame at `position` (walks check every header continues it).
    expected: Offset,
    attempts: u8,
}

/// The owner's storage engine for one partition: see the module documentation.
#[derive(Debug)]
pub struct PartitionLog {
    config: PartitionLogConfig,
    phase: Phase,
    segments: BTreeMap<Offset, Segment>,
    high_watermark: Offset,
    next_offset: Offset,
    last_committed_at_ms: u64,
    reads: BTreeMap<IoId, PendingRead>,
    next_io: u64,
    /// Moving average of the bytes of the runs committed (decides the zero fill); 0 before the first.
    run_bytes_avg: u64,
    /// A fill failed in the last segment: none until a roll.
    fill_off: bool,
    /// Journaled: segments written since their last sync, with the write count when last written.
    dirty: BTreeMap<Offset, u64>,
    /// Journaled: commits written so far (orders writes against the start of a lazy sync).
    writes: u64,
    /// Journaled: the lazy sync in flight.
    sync: Option<LazySync>,
    /// Journaled: a sync of this log's files failed (fsyncgate: pages it covered may be dropped yet
    /// marked clean, so a bare sync would "succeed" without them). Until a resync (read back, verify,
    /// write again, sync) succeeds, the log does not vouch for anything; commits go on meanwhile,
    /// durable in the journal.
    resync: bool,
    /// Journaled: syncs of this log's files that failed so far (a sync that overlapped a failure
    /// vouches for nothing: the failure may have dropped pages it was to cover).
    sync_failures: u64,
    retention: Retention,
    outputs: VecDeque<LogOutput>,
}

/// A range a resync reads back: `(segment base, from byte, offset past its last frame)`.
type ResyncRange = (Offset, u64, Offset);

/// A lazy sync in flight.
#[derive(Clone, Debug)]
struct LazySync {
    io: IoId,
    /// Writes completed when it was issued: it covers those.
    writes: u64,
    /// The high watermark when it was issued.
    through: Offset,
    /// Segments whose names it makes durable.
    names: Vec<Offset>,
    /// Segments it covers, with their bytes of frames when it was issued.
    covered: Vec<(Offset, u64)>,
    /// A resync's read-back of the unsynced ranges, before the writes.
    reading: Option<Vec<ResyncRange>>,
    /// Failed syncs when it was issued.
    failures: u64,
}

impl PartitionLog {
    /// Whether frames are checksummed when read back, read or recovered: always, unless the simulator
    /// planted `skip-readback-crc`.
    fn verify_crc(&self) -> bool {
        !self.config.plant.is(PlantedBug::SkipReadbackCrc)
    }

    /// Starts opening the log in `config.dir`: the first request is already queued as an output.
    pub fn open(config: PartitionLogConfig) -> Self {
        assert!(config.segment_bytes_max > 0 && config.frame_records_bytes_target > 0);
        assert!(config.index_interval_bytes > 0 && config.reads_in_flight_max > 0);
        let mut log = PartitionLog {
            next_io: config.io_id_base,
            config,
            phase: Phase::Ready,
            segments: BTreeMap::new(),
            high_watermark: Offset(0),
            next_offset: Offset(0),
            last_committed_at_ms: 0,
            reads: BTreeMap::new(),
            run_bytes_avg: 0,
            fill_off: false,
            dirty: BTreeMap::new(),
            writes: 0,
            sync: None,
            resync: false,
            sync_failures: 0,
            retention: Retention::default(),
            outputs: VecDeque::new(),
        };
        let dir = log.config.dir.clone();
        let io = log.request(
            log.config.commit_lane,
            vec![IoOp::CreateDirAll { dir: dir.clone() }, IoOp::List { dir }],
        );
        log.phase = Phase::Listing(io);
        log
    }

    // ---- getters ----

    /// Where the log is in its life.
    pub fn status(&self) -> LogStatus {
        match self.phase {
            Phase::Listing(..)
            | Phase::Measuring(..)
            | Phase::Scanning(..)
            | Phase::Rewriting(..)
            | Phase::Finalizing(..) => LogStatus::Opening,
            Phase::Ready => LogStatus::Ready,
            Phase::Committing(..) | Phase::Journaling(..) => LogStatus::Committing,
            Phase::Repairing(..) => LogStatus::Repairing,
            Phase::Rolling(..) => LogStatus::Rolling,
            Phase::Latched(..) => LogStatus::Latched,
            Phase::OpenFailed(..) => LogStatus::OpenFailed,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &PartitionLogConfig {
        &self.config
    }

    /// Records below this offset are visible.
    pub fn high_watermark(&self) -> Offset {
        self.high_watermark
    }

    /// The commit time of the last visible record (0 when none), Unix ms.
    pub fn last_committed_at_ms(&self) -> u64 {
        self.last_committed_at_ms
    }

    /// The figures `partition_stats` reports.
    pub fn stats(&self) -> PartitionStats {
        PartitionStats {
            segments: self.segments.len(),
            oldest_offset: self.oldest_offset(),
            next_offset: self.next_offset,
            high_watermark: self.high_watermark,
            size_bytes: self.segments.values().map(|segment| segment.bytes).sum(),
            oldest_segment_at_ms: self.oldest_segment_at_ms(),
        }
    }

    /// Each segment's base and bytes of frames, in order (tests compare them with the files).
    #[cfg(test)]
    pub(crate) fn segment_bytes(&self) -> Vec<(Offset, u64)> {
        self.segments
            .iter()
            .map(|(&base, segment)| (base, segment.bytes))
            .collect()
    }

    /// True when `id` belongs to this instance's io id range.
    pub fn owns_io(&self, id: IoId) -> bool {
        id.0 >= self.config.io_id_base && id.0 - self.config.io_id_base < IO_IDS_PER_LOG
    }

    /// Reads in flight.
    pub fn reads_in_flight(&self) -> usize {
        self.reads.len()
    }

    /// Forgets every read in flight and returns their ids (the log is being retired; the caller answers
    /// them). Their completions, if they come, are ignored.
    pub fn take_pending_reads(&mut self) -> Vec<LogReadId> {
        std::mem::take(&mut self.reads)
            .into_values()
            .map(|read| read.request.id)
            .collect()
    }

    /// The fault that latched the log, while latched.
    pub fn latched_fault(&self) -> Option<&IoFault> {
        if let Phase::Latched(fault, _) = &self.phase {
            Some(fault)
        } else {
            None
        }
    }

    /// Journaled: whether records below the high watermark wait for a lazy sync of this log's files.
    pub fn unsynced(&self) -> bool {
        !self.dirty.is_empty() || self.resync
    }

    /// Why the open failed, while failed.
    pub fn open_error(&self) -> Option<&RecoveryError> {
        if let Phase::OpenFailed(error) = &self.phase {
            Some(error)
        } else {
            None
        }
    }

    fn oldest_offset(&self) -> Offset {
        self.segments
            .keys()
            .next()
            .copied()
            .unwrap_or(self.high_watermark)
    }

    fn path(&self, base: Offset) -> String {
        join(&self.config.dir, &segment_name(base))
    }

    /// Adds segment `base` as the new last one. Panics unless it continues the log (programmer error:
    /// recovery refuses a discontiguous segment before adding it, and a roll starts at the high
    /// watermark, where the last segment ends).
    fn insert_segment(&mut self, base: Offset, segment: Segment) {
        if let Some((&last_base, last)) = self.segments.iter().next_back() {
            assert!(
                last_base < base && last.end_offset == base,
                "segments contiguous"
            );
        }
        assert!(segment.end_offset >= base);
        self.segments.insert(base, segment);
    }

    /// The path of segment `base`: the one kept with it when it is held, else formatted.
    fn segment_path(&self, base: Offset) -> String {
        match self.segments.get(&base) {
            Some(segment) => segment.path.clone(),
            None => self.path(base),
        }
    }

    fn request(&mut self, lane: IoLane, ops: Vec<IoOp>) -> IoId {
        let id = IoId(self.next_io);
        self.next_io += 1;
        assert!(self.owns_io(id), "io id range exhausted");
        self.outputs
            .push_back(LogOutput::Io(IoRequest { id, lane, ops }));
        id
    }

    fn on_io(&mut self, completion: IoCompletion) {
        if let Some(read) = self.reads.remove(&completion.id) {
            return self.on_read_io(read, completion);
        }
        if self
            .sync
            .as_ref()
            .is_some_and(|sync| sync.io == completion.id)
        {
            return self.on_sync_io(completion);
        }
        if self.is_retention_io(completion.id) {
            return self.on_unlink_io(completion);
        }
        let phase_io = match &self.phase {
            Phase::Listing(io)
            | Phase::Measuring(io, _)
            | Phase::Scanning(io, _)
            | Phase::Rewriting(io, _)
            | Phase::Finalizing(io, _)
            | Phase::Repairing(io, _)
            | Phase::Rolling(io, _) => Some(*io),
            Phase::Committing(pending) => Some(pending.io),
            Phase::Ready | Phase::Journaling(..) | Phase::Latched(..) | Phase::OpenFailed(_) => {
                None
            }
        };
        if phase_io != Some(completion.id) {
            // A completion for a read forgotten by `take_pending_reads`: nobody waits for it.
            return;
        }
        match std::mem::replace(&mut self.phase, Phase::Ready) {
            Phase::Committing(pending) => self.on_commit_io(*pending, completion),
            Phase::Repairing(_, target) => self.on_repair_io(target, completion),
            Phase::Rolling(_, sealing) => self.on_roll_io(sealing, completion),
            phase @ (Phase::Listing(_)
            | Phase::Measuring(..)
            | Phase::Scanning(..)
            | Phase::Rewriting(..)
            | Phase::Finalizing(..)
            | Phase::Ready
            | Phase::Journaling(_)
            | Phase::Latched(..)
            | Phase::OpenFailed(_)) => {
                self.phase = phase;
                self.on_recovery_io(completion);
            }
        }
    }
}

impl Actor for PartitionLog {
    type Input = LogInput;
    type Output = LogOutput;

    fn handle(&mut self, _now: Instant, input: LogInput) {
        match input {
            LogInput::Commit(request) => self.on_commit(request),
            LogInput::Read(request) => self.on_read(request),
            LogInput::Io(completion) => self.on_io(completion),
            LogInput::JournalDone { id, result } => self.on_journal_done(id, result),
            LogInput::Sync => self.on_sync(),
            LogInput::Retain(policy) => self.on_retain(policy),
        }
        if crate::DEEP_CHECKS {
            self.check_invariants();
        }
    }

    fn poll_output(&mut self) -> Option<LogOutput> {
        self.outputs.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn has_output(&self) -> bool {
        !self.outputs.is_empty()
    }
}

fn bad_reply(what: &str) -> IoFault {
    IoFault::Other(format!("unexpected reply to {what}"))
}
