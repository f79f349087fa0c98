//! `OwnerJournal`: one group-committed log for every partition this node owns, as a pure actor.
//!
//! # Contract
//! - **Durability.** A journaled partition log writes a commit's frames into its own segment and reads
//!   them back, without an fsync, then hands them here ([`JournalInput::Append`]). The journal stages
//!   every log's frames, and one flush makes them all durable: `[Create (on roll)], WriteAt, SyncData,
//!   [SyncDir (while the segment's name is not durable)], ReadCrc`: the bytes read back must have the
//!   CRC-32 of those written (each entry's own CRC is checked again at replay). Only then is each append answered
//!   `Ok` ([`JournalOutput::Done`]), and only then does its log advance its high watermark. So one
//!   fsync covers the commits of every partition that had some, and the commit boundary of the
//!   produce path holds: append, fsync, read back + CRC, then visible.
//! - **Group commit.** One flush at a time; appends arriving meanwhile wait for the next one, which
//!   starts the moment the flush in flight completes, unless it waits for its cohort.
//! - **Cohort wait** ([`JournalConfig::cohort`], 0 = off; the ingress WAL's, per log instead of per
//!   append). A partition has one commit in flight, so a log answered by a flush appends again only
//!   after its next commit is written. A flush started the moment the previous one completes carries
//!   only the logs that came back meanwhile: the partitions split into two cohorts that alternate,
//!   each flush carrying about half of them. So when a flush answers at least
//!   `siblings_min` logs, the next flush waits until each of them has appended again (or is
//!   released), or until `min(delay_us_max, flush_percent of that flush's duration)` has passed
//!   ([`JournalInput::Tick`] at [`Actor::poll_timeout`]); after a flush of at least
//!   `flush_bytes_max` (bound by bandwidth, not by the fsync) it starts at once.
//!   The wait delays when a commit becomes visible, never a produce's 202.
//! - **Failure and fsyncgate.** A failed flush (create, write, sync, read-back) answers every append in
//!   it with the fault, then cuts the segment back to the last durable byte and syncs that
//!   (`[SetLen, SyncData]`), so nothing of the failed flush can come back after a crash and nothing
//!   later is written over pages a failed sync dropped. A failed sync is never retried. If the repair
//!   fails the journal **latches**: appends are refused with the fault, and the repair is tried again
//!   by the first append at least [`REPAIR_RETRY_INTERVAL`] later.
//! - **Trimming.** Each segment remembers, per log, the offset past the last record it holds for that
//!   log (its *pins*). Once more than `sealed_segments_kept` segments are sealed, the logs pinning the
//!   oldest are asked to sync their own files ([`JournalOutput::SyncWanted`], [`SYNCS_ASKED_MAX`] at
//!   a time); each
//!   [`JournalInput::Synced`] (or [`JournalInput::Released`]: the log's directory is being removed)
//!   clears its pins up to that offset, and a sealed segment with no pins left is removed
//!   (`[Remove, SyncDir]`). So the journal never drops a record its partition log does not hold
//!   durably, and a restart replays at most the retained segments (see [`replay`]).
//! - **Limits.** Staged bytes at most `staged_bytes_max` (an append past it is refused as `NoSpace`
//!   unless nothing is staged), journal bytes on disk at most `journal_bytes_max` (appends refused
//!   likewise until trims catch up): a log that can never sync cannot grow the journal without bound.
//!
//! # Polling order
//! After every `handle`, drain `poll_output`. Flushes run on `flush_lane` one at a time; trims on
//! `trim_lane`, beside them. Feed [`JournalInput::Tick`] once [`Actor::poll_timeout`] has passed (only
//! a cohort wait holding staged appends sets it).
//!
//! # Invariants (checked after every `handle` in debug builds)
//! At most one flush and one trim in flight; the active (last) segment is never trimmed; staged bytes
//! within their limit unless one append alone exceeds it; every waiter of a flush is in it once.

pub mod entry;
pub mod replay;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use self::entry::{encode_entry, entry_len};
use super::log::{JournalRun, LogCommitId};
use super::LogKey;
use crate::actor::Actor;
use crate::cohort::CohortWait;
use crate::disk::{join, IoCompletion, IoId, IoLane, IoOp, IoReply, IoRequest};
use crate::error::IoFault;
use crate::ids::Offset;
use crate::planted::{Plant, PlantedBug};
use crate::time::Instant;

/// The journal's directory (relative to the data directory).
pub const JOURNAL_DIR: &str = "owner-journal";
/// Suffix of a journal segment's file name (`<20-digit sequence number>.journal`).
pub const JOURNAL_SUFFIX: &str = ".journal";
/// A segment rolls when a flush would take it past this.
pub const JOURNAL_SEGMENT_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Sealed segments kept before the logs pinning the oldest are asked to sync: the slack lets the
/// kernel write partition pages back on its own first, so the lazy syncs find little to do.
pub const SEALED_SEGMENTS_KEPT_DEFAULT: usize = 1;
/// Bytes staged for the next flush, at most.
pub const STAGED_BYTES_MAX_DEFAULT: usize = 64 * 1024 * 1024;
/// Journal bytes on disk, at most: appends are refused past it until trims catch up.
pub const JOURNAL_BYTES_MAX_DEFAULT: u64 = 1024 * 1024 * 1024;
/// Lazy partition syncs asked for at once: a sealed segment of thousands of partitions does not
/// become thousands of fsyncs (and blocking threads) at one instant.
pub const SYNCS_ASKED_MAX: usize = 16;
/// Zeros a segment keeps written ahead of its entries while flushes are small: a flush's fdatasync
/// then writes data only, not the file's new size and blocks (the partition logs' zero fill, for the
/// same reason: see `PREALLOCATE_BYTES_DEFAULT`).
pub const JOURNAL_PREALLOCATE_BYTES: u64 = 1024 * 1024;
/// How long a log whose lazy sync failed waits before it is asked again (on the next input after).
pub const SYNC_RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// How long a latched journal waits before an append tries its repair again.
pub const REPAIR_RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// Default of the cohort wait's `delay_us_max`: far below the accept→visible target of 10 ms.
pub const COMMIT_DELAY_US_MAX_DEFAULT: u64 = 1_000;
/// Default of the cohort wait's `flush_percent`. A log's way back passes the dispatcher
/// (its answer, then its next batch) and the log's own write, so it needs longer than a flush.
pub const COMMIT_DELAY_FLUSH_PERCENT_DEFAULT: u32 = 250;
/// Default of the cohort wait's `flush_bytes_max`: 256 KiB, as the ingress WAL's.
pub const COMMIT_DELAY_FLUSH_BYTES_MAX_DEFAULT: u64 = 256 * 1024;
/// Default of the cohort wait's `siblings_min`: a flush of one log has no sibling to wait for.
pub const COMMIT_SIBLINGS_MIN_DEFAULT: usize = 2;

/// The file name of journal segment `seq`.
pub fn journal_segment_name(seq: u64) -> String {
    format!("{seq:020}{JOURNAL_SUFFIX}")
}

/// The sequence number a journal segment's file name encodes, or `None` for any other file.
pub fn parse_journal_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(JOURNAL_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Settings of an [`OwnerJournal`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalConfig {
    /// Directory of the segments (relative to the disk root).
    pub dir: String,
    /// See [`JOURNAL_SEGMENT_BYTES_DEFAULT`].
    pub segment_bytes_max: u64,
    /// See [`SEALED_SEGMENTS_KEPT_DEFAULT`].
    pub sealed_segments_kept: usize,
    /// See [`STAGED_BYTES_MAX_DEFAULT`].
    pub staged_bytes_max: usize,
    /// See [`JOURNAL_BYTES_MAX_DEFAULT`].
    pub journal_bytes_max: u64,
    /// The first segment's sequence number (past every segment a replay found).
    pub first_seq: u64,
    /// First io id this journal uses.
    pub io_id_base: u64,
    /// Lane of flushes and repairs (serialized).
    pub flush_lane: IoLane,
    /// Lane of trims.
    pub trim_lane: IoLane,
    /// The cohort wait (module doc); its `delay_us_max` is `storage.owner_journal_commit_delay_us`.
    pub cohort: CohortWait,
    /// The bug planted (simulator only).
    pub plant: Plant,
}

impl JournalConfig {
    /// The production defaults.
    pub fn new() -> Self {
        JournalConfig {
            dir: JOURNAL_DIR.to_string(),
            segment_bytes_max: JOURNAL_SEGMENT_BYTES_DEFAULT,
            sealed_segments_kept: SEALED_SEGMENTS_KEPT_DEFAULT,
            staged_bytes_max: STAGED_BYTES_MAX_DEFAULT,
            journal_bytes_max: JOURNAL_BYTES_MAX_DEFAULT,
            first_seq: 0,
            io_id_base: 0,
            flush_lane: IoLane(0),
            trim_lane: IoLane(1),
            cohort: CohortWait {
                delay_us_max: COMMIT_DELAY_US_MAX_DEFAULT,
                flush_percent: COMMIT_DELAY_FLUSH_PERCENT_DEFAULT,
                flush_bytes_max: COMMIT_DELAY_FLUSH_BYTES_MAX_DEFAULT,
                siblings_min: COMMIT_SIBLINGS_MIN_DEFAULT,
            },
            plant: Plant::NONE,
        }
    }
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig::new()
    }
}

/// The events an [`OwnerJournal`] consumes.
#[derive(Clone, Debug)]
pub enum JournalInput {
    /// Make a log's commit durable; answered [`JournalOutput::Done`].
    Append {
        /// The log.
        key: LogKey,
        /// Its directory (named in every entry, for replay).
        dir: Arc<str>,
        /// The commit.
        id: LogCommitId,
        /// Its frames.
        run: JournalRun,
    },
    /// The log's own files hold every record below `through` durably.
    Synced {
        /// The log.
        key: LogKey,
        /// Its high watermark when its sync started.
        through: Offset,
    },
    /// The log's lazy sync failed: it is asked again once [`SYNC_RETRY_INTERVAL`] has passed.
    SyncFailed {
        /// The log.
        key: LogKey,
    },
    /// The log is gone (its directory is being removed): nothing of it needs keeping.
    Released {
        /// The log.
        key: LogKey,
    },
    /// A request of [`JournalOutput::Io`] finished.
    Io(IoCompletion),
    /// [`Actor::poll_timeout`] has passed.
    Tick,
}

/// What happened, for the driver's log lines and counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JournalEvent {
    /// A flush failed: every append in it was refused.
    FlushFailed(IoFault),
    /// The repair after a failed flush failed: appends are refused until a repair succeeds.
    Latched(IoFault),
    /// A sealed segment was removed.
    Trimmed {
        /// Its sequence number.
        seq: u64,
    },
    /// Removing a sealed segment failed (it is tried again after the next flush).
    TrimFailed(IoFault),
}

/// The commands an [`OwnerJournal`] emits.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JournalOutput {
    /// Run this request; feed back [`JournalInput::Io`].
    Io(IoRequest),
    /// An append's outcome.
    Done {
        /// The log.
        key: LogKey,
        /// The commit.
        id: LogCommitId,
        /// `Ok` once durable and read back.
        result: Result<(), IoFault>,
    },
    /// Ask the log to sync its own files ([`super::log::LogInput::Sync`]).
    SyncWanted {
        /// The log.
        key: LogKey,
    },
    /// Something to log.
    Event(JournalEvent),
}

#[derive(Clone, Debug)]
struct Segment {
    path: String,
    /// Bytes durable (every flush before the one in flight).
    bytes: u64,
    /// How far the file holds bytes already written (entries, then zeros), as far as this process
    /// knows: only decides where the next zero fill starts.
    file_bytes: u64,
    /// False while its directory entry may not survive a crash.
    name_durable: bool,
    /// Per log: the offset past the last of its records this segment holds.
    pins: BTreeMap<LogKey, Offset>,
    /// Its pinning logs were queued to be asked to sync.
    syncs_queued: bool,
}

#[derive(Clone, Copy, Debug)]
struct Waiter {
    key: LogKey,
    id: LogCommitId,
    end: Offset,
}

#[derive(Clone, Debug)]
struct Flush {
    io: IoId,
    seq: u64,
    position: u64,
    len: u64,
    created: bool,
    /// Where the file's written bytes end once the flush lands (its zero fill included).
    file_bytes: u64,
    /// CRC-32 of the bytes written: the read-back must match it.
    crc: u32,
    waiters: Vec<Waiter>,
    /// When it started (its duration bounds the next cohort wait).
    started: Instant,
}

/// The logs a completed flush answered, which the next flush waits for (see the module doc).
#[derive(Clone, Debug)]
struct Cohort {
    /// Those that have not appended since.
    pending: BTreeSet<LogKey>,
    /// The flush starts at this instant even if some have not come back.
    deadline: Instant,
}

#[derive(Clone, Debug)]
enum Phase {
    Ready,
    Flushing(Box<Flush>),
    Repairing {
        io: IoId,
        seq: u64,
        position: u64,
    },
    Latched {
        fault: IoFault,
        seq: u64,
        position: u64,
        retry_at: Instant,
    },
}

/// The owner journal: see the module documentation.
#[derive(Debug)]
pub struct OwnerJournal {
    config: JournalConfig,
    phase: Phase,
    segments: BTreeMap<u64, Segment>,
    next_seq: u64,
    staged: Vec<u8>,
    staged_waiters: Vec<Waiter>,
    trim: Option<(IoId, u64)>,
    /// Moving average of flush bytes (the zero fill runs only while flushes are small).
    flush_bytes_avg: u64,
    /// A zero fill failed (a nearly full disk): none until the next segment.
    fill_off: bool,
    /// Logs to ask for a lazy sync, in order.
    sync_queue: VecDeque<LogKey>,
    /// Logs asked and not answered yet (at most [`SYNCS_ASKED_MAX`]).
    syncs_asked: BTreeSet<LogKey>,
    /// Logs whose sync failed, and when to ask them again.
    sync_retries: Vec<(Instant, LogKey)>,
    /// The cohort the next flush waits for.
    cohort: Option<Cohort>,
    next_io: u64,
    now: Instant,
    outputs: VecDeque<JournalOutput>,
}

impl OwnerJournal {
    /// An empty journal (a replay removed every segment before it starts).
    pub fn new(config: JournalConfig) -> Self {
        assert!(config.segment_bytes_max > 0 && config.staged_bytes_max > 0);
        OwnerJournal {
            next_seq: config.first_seq,
            next_io: config.io_id_base,
            config,
            phase: Phase::Ready,
            segments: BTreeMap::new(),
            staged: Vec::new(),
            staged_waiters: Vec::new(),
            trim: None,
            flush_bytes_avg: 0,
            fill_off: false,
            sync_queue: VecDeque::new(),
            syncs_asked: BTreeSet::new(),
            sync_retries: Vec::new(),
            cohort: None,
            now: Instant::default(),
            outputs: VecDeque::new(),
        }
    }

    // ---- getters ----

    /// Segments on disk (sealed and active).
    pub fn segments(&self) -> usize {
        self.segments.len()
    }

    /// Durable bytes in every segment.
    pub fn bytes(&self) -> u64 {
        self.segments.values().map(|segment| segment.bytes).sum()
    }

    /// Whether appends are refused until a repair succeeds.
    pub fn latched(&self) -> bool {
        matches!(self.phase, Phase::Latched { .. })
    }

    // ---- inputs ----

    fn on_append(&mut self, key: LogKey, dir: &str, id: LogCommitId, run: JournalRun) {
        self.came_back(key);
        let end = run.frames.last().map_or(Offset(0), |&(_, _, end)| end);
        let waiter = Waiter { key, id, end };
        if let Phase::Latched {
            fault,
            seq,
            position,
            retry_at,
        } = &self.phase
        {
            if self.now < *retry_at {
                let fault = fault.clone();
                return self.answer(waiter, Err(fault));
            }
            let (seq, position) = (*seq, *position);
            self.repair(seq, position);
        }
        let len: usize = run
            .frames
            .iter()
            .map(|&(_, frame_len, _)| entry_len(dir, frame_len))
            .sum();
        let over_staged =
            !self.staged.is_empty() && self.staged.len() + len > self.config.staged_bytes_max;
        let over_disk = self.bytes() + (self.staged.len() + len) as u64
            > self.config.journal_bytes_max
            && !self.segments.is_empty();
        if over_staged || over_disk {
            return self.answer(waiter, Err(IoFault::NoSpace));
        }
        for &(start, frame_len, _) in &run.frames {
            let position = run.position + start as u64;
            let frame = &run.bytes[start..start + frame_len];
            encode_entry(&mut self.staged, dir, run.segment, position, frame);
        }
        self.staged_waiters.push(waiter);
        self.flush_if_ready();
    }

    fn on_synced(&mut self, key: LogKey, through: Offset) {
        for segment in self.segments.values_mut() {
            if segment.pins.get(&key).is_some_and(|&end| end <= through) {
                segment.pins.remove(&key);
            }
        }
        self.answered(key);
    }

    fn on_sync_failed(&mut self, key: LogKey) {
        self.syncs_asked.remove(&key);
        self.sync_retries
            .push((self.now + SYNC_RETRY_INTERVAL, key));
        self.ask_syncs();
    }

    /// Queues again the logs whose failed sync is due for another try.
    fn retry_syncs(&mut self) {
        if self.sync_retries.is_empty() {
            return;
        }
        let now = self.now;
        let (due, later): (Vec<_>, Vec<_>) =
            self.sync_retries.drain(..).partition(|&(at, _)| at <= now);
        self.sync_retries = later;
        if due.is_empty() {
            return;
        }
        self.sync_queue.extend(due.into_iter().map(|(_, key)| key));
        self.ask_syncs();
    }

    fn on_released(&mut self, key: LogKey) {
        self.came_back(key);
        for segment in self.segments.values_mut() {
            segment.pins.remove(&key);
        }
        self.answered(key);
        self.flush_if_ready();
    }

    /// `key` pins less (or nothing) now: it no longer waits to be asked, and the oldest segment may go.
    fn answered(&mut self, key: LogKey) {
        self.syncs_asked.remove(&key);
        self.sync_retries.retain(|&(_, retried)| retried != key);
        self.trim_if_due();
        self.ask_syncs();
    }

    /// Asks the queued logs that still pin a sealed segment to sync, [`SYNCS_ASKED_MAX`] at a time.
    fn ask_syncs(&mut self) {
        while self.syncs_asked.len() < SYNCS_ASKED_MAX {
            let Some(key) = self.sync_queue.pop_front() else {
                return;
            };
            let pinned = self
                .segments
                .values()
                .any(|segment| segment.pins.contains_key(&key));
            if pinned && self.syncs_asked.insert(key) {
                self.outputs.push_back(JournalOutput::SyncWanted { key });
            }
        }
    }

    fn on_io(&mut self, completion: IoCompletion) {
        if self.trim.is_some_and(|(io, _)| io == completion.id) {
            return self.on_trim_io(completion);
        }
        match std::mem::replace(&mut self.phase, Phase::Ready) {
            Phase::Flushing(flush) if flush.io == completion.id => {
                self.on_flush_io(*flush, completion)
            }
            Phase::Repairing { io, seq, position } if io == completion.id => {
                match completion.result {
                    Ok(_) => {
                        self.phase = Phase::Ready;
                        self.flush_if_ready();
                    }
                    Err((_, fault)) => {
                        self.outputs
                            .push_back(JournalOutput::Event(JournalEvent::Latched(fault.clone())));
                        self.fail_staged(&fault);
                        self.phase = Phase::Latched {
                            fault,
                            seq,
                            position,
                            retry_at: self.now + REPAIR_RETRY_INTERVAL,
                        };
                    }
                }
            }
            phase @ (Phase::Ready
            | Phase::Flushing(_)
            | Phase::Repairing { .. }
            | Phase::Latched { .. }) => self.phase = phase,
        }
    }

    // ---- flushes ----

    /// `key` appended (or is gone): the cohort no longer waits for it.
    fn came_back(&mut self, key: LogKey) {
        if let Some(cohort) = &mut self.cohort {
            cohort.pending.remove(&key);
        }
    }

    /// Sets the cohort wait after `flush` succeeded, if it answered enough logs (module doc).
    fn set_cohort(&mut self, flush: &Flush) {
        let pending: BTreeSet<LogKey> = flush.waiters.iter().map(|waiter| waiter.key).collect();
        let took = self.now.saturating_duration_since(flush.started);
        let Some(wait) = self.config.cohort.after(pending.len(), flush.len, took) else {
            return;
        };
        self.cohort = Some(Cohort {
            pending,
            deadline: self.now + wait,
        });
    }

    /// The deadline of the cohort wait while it holds staged appends back.
    fn cohort_deadline(&self) -> Option<Instant> {
        let cohort = self.cohort.as_ref()?;
        let holding = matches!(self.phase, Phase::Ready)
            && !self.staged.is_empty()
            && !cohort.pending.is_empty();
        holding.then_some(cohort.deadline)
    }

    fn flush_if_ready(&mut self) {
        if !matches!(self.phase, Phase::Ready) || self.staged.is_empty() {
            return;
        }
        if self.cohort_deadline().is_some_and(|at| self.now < at) {
            return;
        }
        self.cohort = None;
        let data = std::mem::take(&mut self.staged);
        let waiters = std::mem::take(&mut self.staged_waiters);
        let len = data.len() as u64;
        let active = self
            .segments
            .iter()
            .next_back()
            .filter(|(_, segment)| {
                segment.bytes == 0 || segment.bytes + len <= self.config.segment_bytes_max
            })
            .map(|(&seq, _)| seq);
        let (seq, created) = match active {
            Some(seq) => (seq, false),
            None => {
                let seq = self.next_seq;
                self.next_seq += 1;
                (seq, true)
            }
        };
        let path = join(&self.config.dir, &journal_segment_name(seq));
        let (position, name_durable, written) = match self.segments.get(&seq) {
            Some(segment) => (segment.bytes, segment.name_durable, segment.file_bytes),
            None => (0, false, 0),
        };
        if created {
            self.fill_off = false;
        }
        self.flush_bytes_avg = match self.flush_bytes_avg {
            0 => len,
            avg => (avg * 7 + len) / 8,
        };
        let end = position + len;
        let fill = if end > written
            && !self.fill_off
            && self.flush_bytes_avg < crate::partition::log::PREALLOCATE_RUN_BYTES_MAX
        {
            JOURNAL_PREALLOCATE_BYTES.min(self.config.segment_bytes_max.saturating_sub(end))
        } else {
            0
        };
        // Every entry carries its own CRC (checked at replay); the flush's read-back compares one CRC
        // over all of them with this, so it need not bring the bytes back.
        let crc = crc32fast::hash(&data);
        let mut ops = Vec::with_capacity(5);
        if created {
            ops.push(IoOp::CreateDirAll {
                dir: self.config.dir.clone(),
            });
            ops.push(IoOp::Create { path: path.clone() });
        }
        ops.push(IoOp::WriteAt {
            path: path.clone(),
            offset: position,
            data,
        });
        if fill > 0 {
            ops.push(IoOp::WriteZeros {
                path: path.clone(),
                offset: end,
                len: fill,
            });
        }
        ops.push(IoOp::SyncData { path: path.clone() });
        if !name_durable {
            ops.push(IoOp::SyncDir {
                dir: self.config.dir.clone(),
            });
        }
        ops.push(IoOp::ReadCrc {
            path,
            offset: position,
            len: len as usize,
        });
        let io = self.request(self.config.flush_lane, ops);
        self.phase = Phase::Flushing(Box::new(Flush {
            io,
            seq,
            position,
            len,
            created,
            file_bytes: written.max(end + fill),
            crc,
            waiters,
            started: self.now,
        }));
    }

    fn on_flush_io(&mut self, flush: Flush, completion: IoCompletion) {
        let outcome = match completion.result {
            Ok(mut replies) => match replies.pop() {
                Some(IoReply::Crc(crc, read)) if crc == flush.crc && read as u64 == flush.len => {
                    Ok(())
                }
                _ => Err(IoFault::Other(
                    "journal read-back verification failed".into(),
                )),
            },
            Err((index, fault)) if flush.created && index < 2 => {
                // The new segment could not be created: nothing was written, nothing to repair.
                self.outputs
                    .push_back(JournalOutput::Event(JournalEvent::FlushFailed(
                        fault.clone(),
                    )));
                for waiter in flush.waiters {
                    self.answer(waiter, Err(fault.clone()));
                }
                self.phase = Phase::Ready;
                return self.flush_if_ready();
            }
            Err((index, fault)) => {
                if is_fill_op(&flush, index) {
                    self.fill_off = true;
                }
                Err(fault)
            }
        };
        if flush.created {
            // The file exists at least in the page cache: it is the active segment from now on.
            self.segments.insert(
                flush.seq,
                Segment {
                    path: join(&self.config.dir, &journal_segment_name(flush.seq)),
                    bytes: 0,
                    file_bytes: 0,
                    name_durable: false,
                    pins: BTreeMap::new(),
                    syncs_queued: false,
                },
            );
        }
        match outcome {
            Ok(()) => {
                let segment = self.segments.get_mut(&flush.seq).expect("flushed segment");
                segment.bytes = flush.position + flush.len;
                segment.file_bytes = flush.file_bytes;
                segment.name_durable = true;
                for waiter in &flush.waiters {
                    let pin = segment.pins.entry(waiter.key).or_insert(waiter.end);
                    *pin = (*pin).max(waiter.end);
                }
                self.set_cohort(&flush);
                for waiter in flush.waiters {
                    self.answer(waiter, Ok(()));
                }
                self.phase = Phase::Ready;
                self.trim_if_due();
                self.flush_if_ready();
            }
            Err(fault) => {
                self.outputs
                    .push_back(JournalOutput::Event(JournalEvent::FlushFailed(
                        fault.clone(),
                    )));
                for waiter in flush.waiters {
                    self.answer(waiter, Err(fault.clone()));
                }
                self.repair(flush.seq, flush.position);
            }
        }
    }

    /// Cuts segment `seq` back to `position` (its last durable byte) and syncs that.
    fn repair(&mut self, seq: u64, position: u64) {
        if let Some(segment) = self.segments.get_mut(&seq) {
            segment.file_bytes = position;
        }
        let path = join(&self.config.dir, &journal_segment_name(seq));
        let io = self.request(
            self.config.flush_lane,
            vec![
                IoOp::SetLen {
                    path: path.clone(),
                    len: position,
                },
                IoOp::SyncData { path },
            ],
        );
        self.phase = Phase::Repairing { io, seq, position };
    }

    fn fail_staged(&mut self, fault: &IoFault) {
        self.staged.clear();
        for waiter in std::mem::take(&mut self.staged_waiters) {
            self.answer(waiter, Err(fault.clone()));
        }
    }

    fn answer(&mut self, waiter: Waiter, result: Result<(), IoFault>) {
        self.outputs.push_back(JournalOutput::Done {
            key: waiter.key,
            id: waiter.id,
            result,
        });
    }

    // ---- trims ----

    /// Asks the logs pinning the oldest sealed segment to sync once more than `sealed_segments_kept`
    /// are sealed, and removes it once nothing pins it.
    fn trim_if_due(&mut self) {
        if self.trim.is_some() || self.segments.len() <= self.config.sealed_segments_kept + 1 {
            return;
        }
        let ignore_pins = self
            .config
            .plant
            .is(PlantedBug::TrimJournalAheadOfPartitionSync);
        let Some((&seq, oldest)) = self.segments.iter_mut().next() else {
            return;
        };
        if !oldest.pins.is_empty() && !ignore_pins {
            if !oldest.syncs_queued {
                oldest.syncs_queued = true;
                self.sync_queue.extend(oldest.pins.keys().copied());
                self.ask_syncs();
            }
            return;
        }
        let path = oldest.path.clone();
        let io = self.request(
            self.config.trim_lane,
            vec![
                IoOp::Remove { path },
                IoOp::SyncDir {
                    dir: self.config.dir.clone(),
                },
            ],
        );
        self.trim = Some((io, seq));
    }

    fn on_trim_io(&mut self, completion: IoCompletion) {
        let Some((_, seq)) = self.trim.take() else {
            return;
        };
        match completion.result {
            Ok(_) => {
                self.segments.remove(&seq);
                self.outputs
                    .push_back(JournalOutput::Event(JournalEvent::Trimmed { seq }));
                self.trim_if_due();
            }
            Err((_, fault)) => {
                // The segment stays (a later trim tries again); a file that is gone or still there is
                // fine either way, since replay is idempotent.
                self.outputs
                    .push_back(JournalOutput::Event(JournalEvent::TrimFailed(fault)));
            }
        }
    }

    fn request(&mut self, lane: IoLane, ops: Vec<IoOp>) -> IoId {
        let id = IoId(self.next_io);
        self.next_io += 1;
        self.outputs
            .push_back(JournalOutput::Io(IoRequest { id, lane, ops }));
        id
    }

    /// Asserts the invariants in the module documentation.
    pub fn check_invariants(&self) {
        let waiting: BTreeSet<(LogKey, LogCommitId)> = self
            .staged_waiters
            .iter()
            .map(|waiter| (waiter.key, waiter.id))
            .collect();
        assert_eq!(
            waiting.len(),
            self.staged_waiters.len(),
            "one waiter per append"
        );
        if let Some((_, seq)) = self.trim {
            assert!(
                self.segments.keys().next_back() != Some(&seq),
                "the active segment is never trimmed"
            );
        }
        if let Phase::Flushing(flush) = &self.phase {
            assert!(!flush.waiters.is_empty());
        }
        assert!(self.syncs_asked.len() <= SYNCS_ASKED_MAX);
    }
}

/// Whether op `index` of a flush's request is its zero fill (`[CreateDirAll, Create]?, WriteAt,
/// WriteZeros?, SyncData, ...`).
fn is_fill_op(flush: &Flush, index: usize) -> bool {
    let write = if flush.created { 2 } else { 0 };
    flush.file_bytes > flush.position + flush.len && index == write + 1
}

impl Actor for OwnerJournal {
    type Input = JournalInput;
    type Output = JournalOutput;

    fn handle(&mut self, now: Instant, input: JournalInput) {
        self.now = now;
        match input {
            JournalInput::Append { key, dir, id, run } => self.on_append(key, &dir, id, run),
            JournalInput::Synced { key, through } => self.on_synced(key, through),
            JournalInput::SyncFailed { key } => self.on_sync_failed(key),
            JournalInput::Released { key } => self.on_released(key),
            JournalInput::Io(completion) => self.on_io(completion),
            JournalInput::Tick => self.flush_if_ready(),
        }
        self.retry_syncs();
        if crate::DEEP_CHECKS {
            self.check_invariants();
        }
    }

    fn poll_output(&mut self) -> Option<JournalOutput> {
        self.outputs.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.cohort_deadline()
    }

    fn has_output(&self) -> bool {
        !self.outputs.is_empty()
    }
}
