//! `PartitionLog`: the owner's storage engine for one partition, as a pure actor.
//!
//! # Contract
//! - **Open / recovery.** [`PartitionLog::open`] emits `[CreateDirAll, List]`, then the length of every
//!   segment, then reads each segment whole and scans it ([`super::segment::scan_segment`]). The high
//!   watermark is the end of the CRC-verified frames: there is no boundary file. Damage in the *last*
//!   segment with nothing verified behind it (a torn append: a crash keeps a prefix of an append) is
//!   truncated. Damage with verified frames behind it is skipped, never truncated, and the frames behind
//!   it kept ([`super::segment::verified_frame_behind`], [`RecoveryReport::skipped`]), whatever their
//!   commit times: rot of an acknowledged frame followed by one acknowledged commit looks exactly like a
//!   failed commit's leftovers, and keeping the latter only serves records that were produced (their
//!   commit is retried: duplicates) while truncating the former would lose acknowledged records. The
//!   skipped offsets stay below the high watermark and read as [`ReadError::Unreadable`]. An earlier
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
//!   see `finalize`), and so that the durable file ends where the verified frames end even when the
//!   cache shows a truncate an earlier failed sync dropped; only then [`LogOutput::Opened`].
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
//!   segment: `Read{offset}` below the oldest segment is [`ReadError::BelowOldestRetained`], at or past
//!   the high watermark [`ReadError::AtOrPastHighWatermark`], both without I/O. A sparse index (one
//!   entry per `index_interval_bytes`) bounds the bytes scanned; every served frame is CRC-checked, and a
//!   damaged one is [`ReadError::Unreadable`], never served. Reads run on their own lane and may overlap
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

mod read;
#[cfg(test)]
mod tests;

use super::segment::{
    parse_segment_name, scan_segment_checked, segment_name, verified_frame_behind, FrameDamage,
    SparseIndex,
};
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
/// Reads in flight at once; more are refused with [`ReadError::Busy`].
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
    /// First io id this instance uses (give every instance its own range of [`IO_IDS_PER_LOG`]).
    pub io_id_base: u64,
    /// Lane of recovery, commit and repair requests (serialized).
    pub commit_lane: IoLane,
    /// Lane of read requests.
    pub read_lane: IoLane,
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
            io_id_base: 0,
            commit_lane: IoLane(0),
            read_lane: IoLane(1),
            plant: Plant::NONE,
        }
    }
}

/// Identifies a commit so its outcome can be matched to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogCommitId(pub u64);

/// Identifies a read so its outcome can be matched to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReadId(pub u64);

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
    pub id: ReadId,
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
pub enum ReadError {
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

/// Damage recovery stepped over because verified frames lie behind it (rot, or a failed commit's
/// leftovers: not a tear).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedDamage {
    /// The segment's base offset.
    pub segment: Offset,
    /// Byte position of the bad frame.
    pub byte: u64,
    /// What is wrong there.
    pub damage: FrameDamage,
    /// The offsets lost with the damaged bytes: `[first, end)`.
    pub offsets: (Offset, Offset),
}

/// What recovery found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segments kept.
    pub segments: usize,
    /// The oldest retained offset.
    pub oldest_offset: Offset,
    /// The recovered high watermark: the end of the verified prefix.
    pub high_watermark: Offset,
    /// Bytes truncated from the last segment's tail.
    pub truncated_bytes: u64,
    /// Where the last segment's verified prefix ended early, and why: `(segment base, byte, damage)`.
    pub damage: Option<(Offset, u64, FrameDamage)>,
    /// Damage with verified frames behind it, in any segment: skipped, never truncated. Its
    /// offsets stay below the high watermark and read as [`ReadError::Unreadable`].
    pub skipped: Vec<SkippedDamage>,
}

/// Why a log could not be opened. The directory is left as it was (except a truncated tail).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryError {
    /// An I/O operation of the recovery failed before anything was changed; opening again may work.
    #[error("i/o during recovery: {0}")]
    Io(IoFault),
    /// The final truncate-and-sync of the recovered tail failed. Which of the tail's bytes are durable
    /// is now unknown while the page cache still shows them all (fsyncgate), so this process must not
    /// open the log again: only a restart that drops the page cache (power cycle, reboot) may.
    #[error("sync at the end of recovery failed: {0}")]
    Sync(IoFault),
    /// A sealed (not last) segment has a bad frame and its verified frames already reach past the
    /// next segment's base: the segments contradict each other.
    #[error("segment {segment} damaged at byte {byte}: {damage}")]
    Corrupt {
        /// The segment's base offset.
        segment: Offset,
        /// Byte position of the bad frame.
        byte: u64,
        /// What is wrong there.
        damage: FrameDamage,
    },
    /// A segment does not start where the previous one ended.
    #[error("segment {segment} does not continue the log at offset {expected}")]
    Discontiguous {
        /// The segment's base offset.
        segment: Offset,
        /// Where the previous segment ended.
        expected: Offset,
    },
    /// A segment's length does not fit in memory.
    #[error("segment {segment} too large to scan ({len} bytes)")]
    SegmentTooLarge {
        /// The segment's base offset.
        segment: Offset,
        /// Its length.
        len: u64,
    },
}

impl RecoveryError {
    /// True when opening the log again in this process is safe (nothing was left of unknown durability).
    pub fn reopen_allowed(&self) -> bool {
        match self {
            RecoveryError::Io(_) => true,
            RecoveryError::Sync(_)
            | RecoveryError::Corrupt { .. }
            | RecoveryError::Discontiguous { .. }
            | RecoveryError::SegmentTooLarge { .. } => false,
        }
    }
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
        id: ReadId,
        /// Records, or why none.
        result: Result<ReadBatch, ReadError>,
    },
    /// A failed commit could not be repaired: commits are refused until the log is reopened.
    Latched(IoFault),
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
}

#[derive(Clone, Debug)]
enum Phase {
    Listing(IoId),
    Measuring(IoId, Vec<Offset>),
    Scanning(IoId, ScanState),
    Finalizing(IoId, RecoveryReport),
    Ready,
    Committing(Box<PendingCommit>),
    Repairing(IoId, RepairTarget),
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
    outputs: VecDeque<LogOutput>,
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
            | Phase::Finalizing(..) => LogStatus::Opening,
            Phase::Ready => LogStatus::Ready,
            Phase::Committing(..) => LogStatus::Committing,
            Phase::Repairing(..) => LogStatus::Repairing,
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
    pub fn take_pending_reads(&mut self) -> Vec<ReadId> {
        std::mem::take(&mut self.reads)
            .into_values()
            .map(|read| read.request.id)
            .collect()
    }

    /// The fault that latched the log, while latched.
    pub fn latched_fault(&self) -> Option<&IoFault> {
        match &self.phase {
            Phase::Latched(fault, _) => Some(fault),
            _ => None,
        }
    }

    /// Why the open failed, while failed.
    pub fn open_error(&self) -> Option<&RecoveryError> {
        match &self.phase {
            Phase::OpenFailed(error) => Some(error),
            _ => None,
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

    // ---- recovery ----

    fn on_recovery_io(&mut self, completion: IoCompletion) {
        let phase = std::mem::replace(&mut self.phase, Phase::Ready);
        let replies = match completion.result {
            Ok(replies) => replies,
            Err((_, fault)) if matches!(phase, Phase::Finalizing(..)) => {
                return self.fail_open(RecoveryError::Sync(fault))
            }
            Err((_, fault)) => return self.fail_open(RecoveryError::Io(fault)),
        };
        match phase {
            Phase::Listing(_) => self.on_listed(replies),
            Phase::Measuring(_, bases) => self.on_measured(bases, replies),
            Phase::Scanning(_, scan) => self.on_segment_read(scan, replies),
            Phase::Finalizing(_, report) => {
                self.phase = Phase::Ready;
                self.outputs.push_back(LogOutput::Opened(report));
            }
            other => unreachable!("recovery completion in phase {other:?}"),
        }
    }

    fn on_listed(&mut self, replies: Vec<IoReply>) {
        let mut bases: Vec<Offset> = match replies.last() {
            Some(IoReply::Names(names)) => names
                .iter()
                .filter_map(|name| parse_segment_name(name))
                .collect(),
            _ => return self.fail_open(RecoveryError::Io(bad_reply("list"))),
        };
        bases.sort();
        if bases.is_empty() {
            return self.finalize(None, Vec::new(), 0, None);
        }
        let ops = bases
            .iter()
            .map(|&base| IoOp::Len {
                path: self.path(base),
            })
            .collect();
        let io = self.request(self.config.commit_lane, ops);
        self.phase = Phase::Measuring(io, bases);
    }

    fn on_measured(&mut self, bases: Vec<Offset>, replies: Vec<IoReply>) {
        let mut lens = Vec::with_capacity(bases.len());
        for reply in &replies {
            match reply {
                IoReply::Len(len) => lens.push(*len),
                _ => return self.fail_open(RecoveryError::Io(bad_reply("len"))),
            }
        }
        if lens.len() != bases.len() {
            return self.fail_open(RecoveryError::Io(bad_reply("len")));
        }
        self.read_next_segment(ScanState {
            bases,
            lens,
            next: 0,
            skipped: Vec::new(),
        });
    }

    fn read_next_segment(&mut self, scan: ScanState) {
        let base = scan.bases[scan.next];
        let len = scan.lens[scan.next];
        let Ok(len_usize) = usize::try_from(len) else {
            return self.fail_open(RecoveryError::SegmentTooLarge { segment: base, len });
        };
        let path = self.path(base);
        let io = self.request(
            self.config.commit_lane,
            vec![IoOp::ReadAt {
                path,
                offset: 0,
                len: len_usize,
            }],
        );
        self.phase = Phase::Scanning(io, scan);
    }

    fn on_segment_read(&mut self, mut scan: ScanState, replies: Vec<IoReply>) {
        let Some(IoReply::Data(bytes)) = replies.last() else {
            return self.fail_open(RecoveryError::Io(bad_reply("read")));
        };
        let base = scan.bases[scan.next];
        let is_last = scan.next + 1 == scan.bases.len();
        if let Some(previous) = self.segments.values().next_back() {
            if previous.end_offset != base {
                let expected = previous.end_offset;
                return self.fail_open(RecoveryError::Discontiguous {
                    segment: base,
                    expected,
                });
            }
        }
        let mut result = scan_segment_checked(
            base,
            bytes,
            self.config.index_interval_bytes,
            self.verify_crc(),
        );
        let file_len = bytes.len() as u64;
        // Zeros from where the frames end to the end of the file: the preallocated fill, or an append
        // whose pages never reached the disk. Neither holds a frame.
        let mut zero_tail = false;
        // In any segment: a sealed one may hold damage skipped while it was the last.
        while let Some((byte, damage)) = result.damage {
            if bytes[byte as usize..].iter().all(|&b| b == 0) {
                zero_tail = true;
                break;
            }
            // A tail is a tear unless verified frames lie behind it; then the damaged bytes are
            // skipped and the frames behind them kept (see `verified_frame_behind`).
            let Some((resume, resume_offset)) =
                verified_frame_behind(bytes, byte, result.end_offset)
            else {
                break;
            };
            let Ok(resume_usize) = usize::try_from(resume) else {
                break;
            };
            scan.skipped.push(SkippedDamage {
                segment: base,
                byte,
                damage,
                offsets: (result.end_offset, resume_offset),
            });
            let rest = scan_segment_checked(
                resume_offset,
                &bytes[resume_usize..],
                self.config.index_interval_bytes,
                self.verify_crc(),
            );
            result.index.extend_shifted(rest.index, resume);
            result.end_offset = rest.end_offset;
            result.verified_bytes = resume + rest.verified_bytes;
            // The last run may span the damage: frames of one commit time behind it, that of the
            // frames before it. Then the rewrite in `finalize` starts before the damage.
            let spans =
                rest.last_run_start == 0 && rest.committed_at_ms_max == result.committed_at_ms_max;
            if !spans {
                result.last_run_start = resume + rest.last_run_start;
            }
            result.committed_at_ms_max = result.committed_at_ms_max.max(rest.committed_at_ms_max);
            result.damage = rest.damage.map(|(at, damage)| (resume + at, damage));
        }
        let next_base = scan.bases.get(scan.next + 1).copied();
        if zero_tail && next_base.is_none_or(|next_base| next_base == result.end_offset) {
            // The frames end where the next segment (if any) begins: nothing is missing.
            result.damage = None;
        }
        if let (Some((byte, damage)), Some(next_base)) = (result.damage, next_base) {
            // Damage at the end of a sealed segment: the next segment's name proves where this one
            // ended, so its offsets behind the damage are a hole, reported, not a reason to refuse the
            // whole partition (its bytes stay on disk as they are).
            if next_base < result.end_offset {
                return self.fail_open(RecoveryError::Corrupt {
                    segment: base,
                    byte,
                    damage,
                });
            }
            scan.skipped.push(SkippedDamage {
                segment: base,
                byte,
                damage,
                offsets: (result.end_offset, next_base),
            });
            result.end_offset = next_base;
        }
        if let Some(at_ms) = result.committed_at_ms_max {
            self.last_committed_at_ms = self.last_committed_at_ms.max(at_ms);
        }
        self.high_watermark = result.end_offset;
        self.next_offset = result.end_offset;
        let path = self.path(base);
        self.insert_segment(
            base,
            Segment {
                path,
                end_offset: result.end_offset,
                bytes: result.verified_bytes,
                // `finalize` cuts the last segment back to its frames.
                file_bytes: if is_last {
                    result.verified_bytes
                } else {
                    file_len
                },
                index: result.index,
                name_durable: true,
            },
        );
        if is_last {
            let damage = result.damage.map(|(byte, damage)| (base, byte, damage));
            let last_run =
                bytes[result.last_run_start as usize..result.verified_bytes as usize].to_vec();
            let rewrite = (!last_run.is_empty()).then_some((result.last_run_start, last_run));
            let skipped = std::mem::take(&mut scan.skipped);
            return self.finalize(damage, skipped, file_len - result.verified_bytes, rewrite);
        }
        scan.next += 1;
        self.read_next_segment(scan);
    }

    /// Truncates the last segment to its verified prefix, rewrites its last run, and makes it, and the
    /// directory, durable.
    ///
    /// The rewrite closes the fsyncgate window of a process that died between a failed fdatasync and
    /// the truncation that follows it: the lost run is then the file's last run, still in the page cache
    /// as valid frames but marked clean, so a bare fdatasync would "succeed" without writing it. Writing
    /// the same bytes again dirties those pages, so the sync below really persists them (or fails). It
    /// costs one write of the frames of the last commit time, usually one run.
    fn finalize(
        &mut self,
        damage: Option<(Offset, u64, FrameDamage)>,
        skipped: Vec<SkippedDamage>,
        truncated_bytes: u64,
        rewrite: Option<(u64, Vec<u8>)>,
    ) {
        let report = RecoveryReport {
            segments: self.segments.len(),
            oldest_offset: self.oldest_offset(),
            high_watermark: self.high_watermark,
            truncated_bytes,
            damage,
            skipped,
        };
        let mut ops = Vec::new();
        if let Some(last) = self.segments.values().next_back() {
            let path = last.path.clone();
            // Always, not only after damage: a process restart sees the page cache, and a truncate
            // whose sync failed before it (fsyncgate drops it, yet the cache shows the short file)
            // would otherwise leave the old tail on disk, past the frames, in what becomes a sealed
            // segment at the next roll.
            ops.push(IoOp::SetLen {
                path: path.clone(),
                len: last.bytes,
            });
            if let Some((offset, data)) = rewrite {
                ops.push(IoOp::WriteAt {
                    path: path.clone(),
                    offset,
                    data,
                });
            }
            ops.push(IoOp::SyncData { path });
        }
        ops.push(IoOp::SyncDir {
            dir: self.config.dir.clone(),
        });
        let io = self.request(self.config.commit_lane, ops);
        self.phase = Phase::Finalizing(io, report);
    }

    fn fail_open(&mut self, error: RecoveryError) {
        self.segments.clear();
        self.high_watermark = Offset(0);
        self.next_offset = Offset(0);
        self.phase = Phase::OpenFailed(error.clone());
        self.outputs.push_back(LogOutput::OpenFailed(error));
    }

    // ---- commit ----

    fn on_commit(&mut self, request: CommitRequest) {
        if let Err(fault) = self.begin_commit(&request) {
            self.outputs.push_back(LogOutput::CommitDone {
                id: request.id,
                result: Err(fault),
            });
        }
    }

    fn begin_commit(&mut self, request: &CommitRequest) -> Result<(), CommitFault> {
        if !matches!(self.phase, Phase::Ready) {
            return Err(CommitFault::NotReady(self.status()));
        }
        if request.records.is_empty() {
            return Err(CommitFault::Empty);
        }
        let committed_at_ms = request.committed_at_ms.max(self.last_committed_at_ms);
        let views: Vec<RecordView<'_>> = request
            .records
            .iter()
            .map(|record| RecordView {
                key: record.key.as_deref().filter(|key| !key.is_empty()),
                committed_at_ms,
                payload: &record.payload,
            })
            .collect();
        if views
            .iter()
            .any(|view| view.framed_len() > FRAME_RECORDS_BYTES_MAX)
        {
            return Err(CommitFault::RecordTooLarge);
        }
        let (run, frames) = self.encode_run(&views);
        let run_bytes = run.len() as u64;
        let (segment, created) = match self.segments.iter().next_back() {
            Some((&base, last))
                if last.bytes == 0 || last.bytes + run_bytes <= self.config.segment_bytes_max =>
            {
                (base, false)
            }
            _ => (self.high_watermark, true),
        };
        let position = if created {
            0
        } else {
            self.segments[&segment].bytes
        };
        let name_durable = !created && self.segments[&segment].name_durable;
        let path = self.segment_path(segment);
        let mut ops = Vec::with_capacity(7);
        let mut stages = Stages::default();
        if created {
            if let Some(sealed) = self
                .segments
                .values()
                .next_back()
                .filter(|last| last.file_bytes > last.bytes)
            {
                // Not synced: a crash may keep the zeros, which recovery reads as a clean end.
                ops.push(IoOp::SetLen {
                    path: sealed.path.clone(),
                    len: sealed.bytes,
                });
                stages.push(Stage::Seal);
            }
            ops.push(IoOp::Create { path: path.clone() });
            stages.push(Stage::Create);
        }
        ops.push(IoOp::WriteAt {
            path: path.clone(),
            offset: position,
            data: run,
        });
        stages.push(Stage::Write);
        let write_end = position + run_bytes;
        let zeroed = if created {
            0
        } else {
            self.segments[&segment].file_bytes
        };
        self.run_bytes_avg = match self.run_bytes_avg {
            0 => run_bytes,
            avg => (avg * 7 + run_bytes) / 8,
        };
        if created {
            self.fill_off = false;
        }
        let fill = if self.run_bytes_avg < PREALLOCATE_RUN_BYTES_MAX && !self.fill_off {
            self.config
                .preallocate_bytes
                .min(self.config.segment_bytes_max / 8)
                .min(self.config.segment_bytes_max.saturating_sub(write_end))
        } else {
            0
        };
        let file_bytes = if write_end > zeroed && fill > 0 {
            ops.push(IoOp::WriteZeros {
                path: path.clone(),
                offset: write_end,
                len: fill,
            });
            stages.push(Stage::Fill);
            write_end + fill
        } else {
            zeroed.max(write_end)
        };
        ops.push(IoOp::SyncData { path: path.clone() });
        stages.push(Stage::Sync);
        if !name_durable {
            ops.push(IoOp::SyncDir {
                dir: self.config.dir.clone(),
            });
            stages.push(Stage::SyncDir);
        }
        ops.push(IoOp::ReadAt {
            path,
            offset: position,
            len: run_bytes as usize,
        });
        stages.push(Stage::ReadBack);
        let end_offset = Offset(self.high_watermark.0 + request.records.len() as u64);
        let io = self.request(self.config.commit_lane, ops);
        self.next_offset = end_offset;
        self.phase = Phase::Committing(Box::new(PendingCommit {
            id: request.id,
            io,
            segment,
            created,
            position,
            run_bytes,
            file_bytes,
            frames,
            end_offset,
            committed_at_ms,
            stages,
        }));
        Ok(())
    }

    /// Encodes a run as frames of about `frame_records_bytes_target` record bytes each.
    fn encode_run(&self, views: &[RecordView<'_>]) -> (Vec<u8>, Vec<FrameMeta>) {
        let total: usize = views.iter().map(RecordView::framed_len).sum();
        let mut run = Vec::with_capacity(total + FRAME_HEADER_BYTES * (1 + total / 4096));
        let mut frames = Vec::new();
        let mut start = 0;
        let mut base = self.high_watermark;
        while start < views.len() {
            let mut end = start + 1;
            let mut bytes = views[start].framed_len();
            while end < views.len() {
                let next = views[end].framed_len();
                if bytes + next > self.config.frame_records_bytes_target
                    || bytes + next > FRAME_RECORDS_BYTES_MAX
                    || end - start >= i32::MAX as usize
                {
                    break;
                }
                bytes += next;
                end += 1;
            }
            let position = run.len();
            encode_frame(&mut run, base, &views[start..end]);
            let crc_bytes = &run[position + 23..position + FRAME_HEADER_BYTES];
            frames.push(FrameMeta {
                base,
                count: (end - start) as u32,
                position: position as u64,
                records_bytes: bytes as u32,
                crc: u32::from_be_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]),
            });
            base = Offset(base.0 + (end - start) as u64);
            start = end;
        }
        (run, frames)
    }

    fn on_commit_io(&mut self, pending: PendingCommit, completion: IoCompletion) {
        let outcome = match completion.result {
            Ok(replies) => match replies.last() {
                Some(IoReply::Data(bytes)) if verify_run(&pending, bytes, self.verify_crc()) => {
                    Ok(())
                }
                _ => Err(CommitFault::ReadBackMismatch),
            },
            Err((index, fault)) => Err(match pending.stages.get(index).as_ref() {
                Some(Stage::Seal) | Some(Stage::Create) => CommitFault::Create(fault),
                Some(Stage::Fill) => {
                    // A nearly full disk may hold the frames but not the zeros: commits go on
                    // without a fill until the next segment.
                    self.fill_off = true;
                    CommitFault::Write(fault)
                }
                Some(Stage::Write) => CommitFault::Write(fault),
                Some(Stage::Sync) | Some(Stage::SyncDir) => CommitFault::Sync(fault),
                Some(Stage::ReadBack) | None => CommitFault::ReadBack(fault),
            }),
        };
        match outcome {
            Ok(()) => self.apply_commit(pending),
            Err(fault) => self.discard_commit(pending, fault),
        }
    }

    /// Keeps a just-created segment file (its name not yet durable) as the empty active segment.
    fn insert_empty_segment(&mut self, base: Offset) {
        let path = self.path(base);
        self.insert_segment(
            base,
            Segment {
                path,
                end_offset: base,
                bytes: 0,
                file_bytes: 0,
                index: SparseIndex::default(),
                name_durable: false,
            },
        );
    }

    fn apply_commit(&mut self, pending: PendingCommit) {
        let interval = self.config.index_interval_bytes;
        if !self.segments.contains_key(&pending.segment) {
            self.insert_empty_segment(pending.segment);
        }
        let segment = self
            .segments
            .get_mut(&pending.segment)
            .expect("inserted above");
        for frame in &pending.frames {
            segment
                .index
                .note_frame(frame.base, pending.position + frame.position, interval);
        }
        segment.bytes = pending.position + pending.run_bytes;
        segment.file_bytes = pending.file_bytes;
        segment.end_offset = pending.end_offset;
        segment.name_durable = true;
        self.high_watermark = pending.end_offset;
        self.next_offset = pending.end_offset;
        self.last_committed_at_ms = pending.committed_at_ms;
        self.phase = Phase::Ready;
        self.outputs.push_back(LogOutput::CommitDone {
            id: pending.id,
            result: Ok(CommittedRun {
                base: pending.frames[0].base,
                count: pending.end_offset.0 - pending.frames[0].base.0,
                committed_at_ms: pending.committed_at_ms,
            }),
        });
    }

    /// Discards the run above the high watermark and repairs the file (see the module documentation).
    fn discard_commit(&mut self, pending: PendingCommit, fault: CommitFault) {
        self.next_offset = self.high_watermark;
        self.outputs.push_back(LogOutput::CommitDone {
            id: pending.id,
            result: Err(fault.clone()),
        });
        if matches!(fault, CommitFault::Create(_)) {
            // Nothing was written; the segment was never ours. The one it would have sealed may have
            // lost its zeros: the next commit into it fills again.
            if let Some(last) = self.segments.values_mut().next_back() {
                last.file_bytes = last.bytes;
            }
            self.phase = Phase::Ready;
            return;
        }
        if pending.created {
            // The file exists (at least in the page cache); keep it as the empty active segment.
            self.insert_empty_segment(pending.segment);
        }
        self.repair(RepairTarget {
            segment: pending.segment,
            position: pending.position,
        });
    }

    fn repair(&mut self, target: RepairTarget) {
        if let Some(segment) = self.segments.get_mut(&target.segment) {
            segment.file_bytes = target.position;
        }
        let path = self.segment_path(target.segment);
        let io = self.request(
            self.config.commit_lane,
            vec![
                IoOp::SetLen {
                    path: path.clone(),
                    len: target.position,
                },
                IoOp::SyncData { path },
            ],
        );
        self.phase = Phase::Repairing(io, target);
    }

    /// Tries the truncation of a latched log again (the caller spaces attempts out).
    ///
    /// Returns false when the log is not latched. This never re-reads or trusts the tail: it only cuts
    /// the file back to the last position this process knows durable and syncs that, which is why a
    /// latched log is repaired this way rather than reopened (a reopen would re-scan the page cache
    /// and could adopt frames whose fsync failed, then build acknowledged commits on top of them).
    pub fn retry_repair(&mut self) -> bool {
        match self.phase {
            Phase::Latched(_, target) => {
                self.repair(target);
                true
            }
            _ => false,
        }
    }

    fn on_repair_io(&mut self, target: RepairTarget, completion: IoCompletion) {
        match completion.result {
            Ok(_) => self.phase = Phase::Ready,
            Err((_, fault)) => {
                self.phase = Phase::Latched(fault.clone(), target);
                self.outputs.push_back(LogOutput::Latched(fault));
            }
        }
    }

    fn on_io(&mut self, completion: IoCompletion) {
        if let Some(read) = self.reads.remove(&completion.id) {
            return self.on_read_io(read, completion);
        }
        let phase_io = match &self.phase {
            Phase::Listing(io)
            | Phase::Measuring(io, _)
            | Phase::Scanning(io, _)
            | Phase::Finalizing(io, _)
            | Phase::Repairing(io, _) => Some(*io),
            Phase::Committing(pending) => Some(pending.io),
            Phase::Ready | Phase::Latched(..) | Phase::OpenFailed(_) => None,
        };
        if phase_io != Some(completion.id) {
            // A completion for a read forgotten by `take_pending_reads`: nobody waits for it.
            return;
        }
        match std::mem::replace(&mut self.phase, Phase::Ready) {
            Phase::Committing(pending) => self.on_commit_io(*pending, completion),
            Phase::Repairing(_, target) => self.on_repair_io(target, completion),
            phase => {
                self.phase = phase;
                self.on_recovery_io(completion);
            }
        }
    }

    /// Asserts the invariants in the module documentation.
    pub fn check_invariants(&self) {
        assert!(self.oldest_offset() <= self.high_watermark);
        assert!(self.high_watermark <= self.next_offset);
        let committing = matches!(self.phase, Phase::Committing(..));
        assert!(committing || self.next_offset == self.high_watermark);
        // Contiguity and sorted indexes are asserted where segments and index entries are added
        // (`insert_segment`, `SparseIndex::note_frame`), and only the last segment ever changes
        // afterwards, so checking it here keeps the whole chain checked at O(log n) per event.
        if let Some((&base, last)) = self.segments.iter().next_back() {
            assert!(last.end_offset >= base);
            assert_eq!(
                last.end_offset, self.high_watermark,
                "last segment ends at the high watermark"
            );
            assert!(
                last.file_bytes >= last.bytes,
                "the zero fill lies past the frames"
            );
        }
        assert!(self.reads.len() <= self.config.reads_in_flight_max);
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
}

fn bad_reply(what: &str) -> IoFault {
    IoFault::Other(format!("unexpected reply to {what}"))
}

/// True when `bytes` are exactly the frames of `pending`: each decodes (CRC, structure) with the
/// header that was written, and nothing else follows.
fn verify_run(pending: &PendingCommit, bytes: &[u8], verify_crc: bool) -> bool {
    if bytes.len() as u64 != pending.run_bytes {
        return false;
    }
    pending.frames.iter().all(|meta| {
        let Some(at) = bytes.get(meta.position as usize..) else {
            return false;
        };
        match verify_frame_checked(at, verify_crc) {
            Ok(header) => {
                header.base_offset == meta.base
                    && header.count == meta.count
                    && header.records_bytes == meta.records_bytes
                    && header.crc == meta.crc
            }
            Err(_) => false,
        }
    })
}
