//! The ingress WAL: a segmented, append-only log with group commit, as a pure actor ([`IngressWal`]).
//!
//! # Contract
//! - **Segments.** Frames ([`crate::codec::wal`]) live in segments named by their first sequence number
//!   (`<20-digit seq>.wal` in [`WalConfig::dir`]); sequence numbers are dense across segments and no frame
//!   spans two. A segment rolls before its frames would pass [`WalConfig::segment_bytes_max`].
//! - **Group commit.** Appends are staged into a shared buffer. A flush is one `WriteAt` and one
//!   `SyncData` on the append lane. The WAL flushes as soon as no flush is in flight (a wake per append);
//!   a backstop re-checks every [`WalConfig::sync_interval_ms`] while records wait. A caller is answered
//!   only when its own bytes are durable; once staged, a record waits for the true outcome. Buffers are
//!   reused, never allocated per flush: the staging buffer and the one in flight (the write request
//!   carries it and [`WalInput::IoDone`] hands it back) plus the copy kept for reads rotate, each trimmed
//!   to [`WalConfig::staging_bytes_max`] of capacity when it returns to the pool.
//! - **Cohort wait** ([`WalConfig::commit_delay_us_max`], 0 = off; PostgreSQL's `commit_delay` and
//!   `commit_siblings`, made adaptive). When a flush completes having answered `K` appends (a batch is
//!   one append: one caller) and `K >= commit_siblings_min`, the next flush of the open batch waits
//!   until `K` appends have been staged since that completion (the cohort came back) or until
//!   `min(commit_delay_us_max, commit_delay_flush_percent of that flush's duration)` has passed,
//!   whichever comes first; below the threshold, or after a flush of at least
//!   [`WalConfig::commit_delay_flush_bytes_max`] (bound by bandwidth, not by the fsync), it starts at
//!   once as before. Why: with `N` closed-loop
//!   callers, a flush started the moment the previous one completes carries only those that came back
//!   meanwhile, so flushes settle near `N/2` records and each caller waits about 1.5 fsyncs; waiting
//!   for the cohort makes one flush carry all `N`, at one fsync of latency each. Appends staged during
//!   the flush do not count towards `K`: counting them keeps the group at its old size for ever. Only
//!   the open batch waits: steps queued by a roll start at once, a tick at the backstop starts the
//!   flush whatever the cohort, and the wait ends at its deadline by [`Actor::poll_timeout`].
//!   This deviates from the spec's "group commit fires on every append" by default (see
//!   [`config::COMMIT_DELAY_US_MAX_DEFAULT`]); 0 restores it exactly. The wait is bounded by
//!   [`config::COMMIT_DELAY_FLUSH_PERCENT_DEFAULT`] of the last flush and by the 1 ms cap (far below
//!   the 10 ms backstop and the 10 ms accept→visible target); below `siblings_min` appends the load is
//!   too light for a wait to pay. How the values were chosen: `docs/decisions.md`.
//! - **Batches** ([`WalInput::AppendMany`]): every size is checked before anything is staged; the records
//!   take consecutive sequence numbers with nothing interleaved and one answer once the last is durable.
//!   A batch that outgrows the active segment rolls it between two records: the records staged so far
//!   are written and synced first. A failing fill withdraws the records staged since the call (or since
//!   that roll) and gives their sequence numbers back. *Fill model:* the caller announces every record's
//!   size and passes a [`FillFn`] that writes record `i` in place into the staging buffer; it may return
//!   an error or panic (caught), which is how tests make it fail.
//! - **Failure latch.** A failed write, fsync, roll or open repair fails every append not yet durable
//!   (none is acknowledged), emits [`WalOutput::Latched`] once, and refuses every later append with the
//!   same fault until restart. A failed fsync is never retried.
//! - **Segment preparation** ([`WalConfig::prealloc`]): once the active segment is half full,
//!   `next-segment.prep` is made on the prepare lane (create, zero-fill, `NWPREP01` trailer, sync); the roll
//!   renames it into place. Writes into a prepared segment go in runs of whole frames of at most
//!   [`WalConfig::prepared_write_run_bytes_max`], each written and synced. The roll that seals a prepared
//!   segment trims it to its data. No spare ready: the roll creates an empty segment. Every roll ends with
//!   a directory sync before any record in the new segment can be acknowledged.
//! - **Compaction** ([`WalInput::CheckpointSynced`]): segments whose records are all below the *synced*
//!   checkpoint are deleted (never the active one); a fully dispatched active segment past
//!   [`WalConfig::rotate_dispatched_active_after_bytes`] is rotated so it can go too.
//! - **Reads** ([`WalInput::Read`]): durable frames only, raw payloads, from an in-memory copy of the last
//!   group commit when it covers the range, else from disk via a sparse seq → offset index. Until the
//!   open repair has completed, reads answer empty: recovered bytes may still be only in the page cache
//!   (after an fsync failure), and a checkpoint must never pass a record the WAL could still lose. The
//!   repair's completion emits [`WalOutput::Durable`].
//! - **Recovery** is a pure step before the actor exists: see [`recovery`] and [`WalRecovery`].
//!
//! # Driver protocol
//! 1. Open: list [`WalConfig::dir`], give the names to [`WalRecovery::plan`], read each planned segment
//!    whole (in order) into [`WalRecovery::feed_segment`], then [`WalRecovery::finish`] returns the actor
//!    (or a loud [`OpenError`]). [`driver::open_wal`] does this over any [`crate::disk::Disk`].
//! 2. After every [`Actor::handle`] (and right after open), drain [`Actor::poll_output`] until `None`:
//!    - [`WalOutput::Io`]: run the request on its lane (requests of one lane strictly in order, one at a
//!      time; lanes may run concurrently), then feed [`WalInput::IoDone`] with the request and its
//!      completion. The first output after open is the repair request on the append lane.
//!    - [`WalOutput::AppendDone`] / [`WalOutput::ReadDone`]: route to the caller by id.
//!    - [`WalOutput::Durable`]: wake the dispatcher. [`WalOutput::Latched`], [`WalOutput::Warning`]: log
//!      (and set the `narad_ingress_wal_failed` gauge from [`IngressWal::is_latched`]).
//! 3. Feed [`WalInput::Tick`] once [`Actor::poll_timeout`] has passed.
//! 4. Feed [`WalInput::CheckpointSynced`] whenever the checkpointer has synced a new value.
//!
//! [`driver::SyncDriver`] is a synchronous implementation over any `&dyn Disk` with a manual clock.
//!
//! # Invariants (checked after every `handle`)
//! `durable_next_seq <= next_seq`; segments are contiguous (`next` of one is `first` of the next) and
//! the durable frontier is the active segment's `next`; at most one request is in flight on the append
//! lane; the open batch ends where the tail segment's staged bytes end; a latched WAL holds nothing staged.

mod api;
mod compaction;
pub mod config;
pub mod driver;
mod prepare;
mod read;
pub mod recovery;
mod staging;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

pub use api::{
    AppendError, AppendId, FillError, FillFn, SeqRange, WalFrame, WalInput, WalOutput,
    WalReadError, WalReadId, WalWarning, CHECKPOINT_BELOW_OLDEST_SEGMENT,
};
pub use config::{
    ConfigError, WalConfig, WalLanes, COMMIT_DELAY_FLUSH_PERCENT_DEFAULT,
    COMMIT_DELAY_US_MAX_DEFAULT, COMMIT_SIBLINGS_MIN_DEFAULT, PREP_FILE_NAME,
};
pub use recovery::{OpenError, Opened, RecoveryReport, TornTail, WalRecovery};

use crate::actor::Actor;
use crate::disk::{IoId, IoOp, IoRequest};
use crate::error::IoFault;
use crate::ids::Seq;
use crate::time::Instant;

/// Reusable buffers kept besides the open batch, the one in flight and the recent copy.
const POOL_BUFFERS_MAX: usize = 2;

/// The appends a completed flush answered, which the next flush waits for (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cohort {
    /// How many appends the completed flush answered.
    appends_wanted: usize,
    /// Appends staged since it completed.
    appends_arrived: usize,
    /// The flush starts at this instant even if the cohort has not come back.
    deadline: Instant,
}

/// A segment that exists on disk (created, or renamed into place, and its directory synced).
#[derive(Clone, Debug)]
struct Segment {
    /// Its first sequence number (its name).
    first: Seq,
    /// One past its last durable record.
    next: Seq,
    /// Bytes of durable frames.
    data_end: u64,
    /// The file's length (a prepared segment is full length until trimmed).
    file_len: u64,
    /// `Some(write limit)` while the file is a prepared (zero-filled, trailer-ended) segment.
    prepared_limit: Option<u64>,
    /// Sparse `(seq, offset)` entries, one at least every `index_interval_bytes`, first frame first.
    index: Vec<(Seq, u64)>,
}

impl Segment {
    fn empty(first: Seq) -> Segment {
        Segment {
            first,
            next: first,
            data_end: 0,
            file_len: 0,
            prepared_limit: None,
            index: Vec::new(),
        }
    }

    /// Records a frame at `offset` in the index when it is far enough past the last entry.
    fn note_frame(&mut self, seq: Seq, offset: u64, interval_bytes: u64) {
        let due = match self.index.last() {
            None => true,
            Some(&(_, last)) => offset >= last + interval_bytes,
        };
        if due {
            self.index.push((seq, offset));
        }
    }

    /// The index entry at or before `seq`. The segment must hold `seq`.
    fn index_lookup(&self, seq: Seq) -> (Seq, u64) {
        let after = self.index.partition_point(|&(entry, _)| entry <= seq);
        assert!(after > 0, "segment {} holds no record {seq}", self.first);
        self.index[after - 1]
    }
}

/// Where the next record is staged: the last segment, or the one a queued roll will create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tail {
    first: Seq,
    /// Bytes of frames staged into it so far (durable, in flight, queued or open).
    end: u64,
    /// Frames must end at or before this offset.
    limit: u64,
    /// A prepared segment: written in runs, trimmed when sealed.
    prepared: bool,
}

/// Records staged for one segment, written by one flush.
#[derive(Debug)]
struct Batch {
    segment: Seq,
    prepared: bool,
    offset: u64,
    /// The frames; moved into the write request while in flight (and handed back with the completion).
    buf: Vec<u8>,
    /// Bytes of frames, fixed when the flush starts (the buffer may be away in the request).
    len: usize,
    seqs: SeqRange,
    /// Appends whose last record is in this batch, in staging order.
    waiters: Vec<(AppendId, SeqRange)>,
}

/// Seal the tail segment and put the next one in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Roll {
    old: Seq,
    /// `Some(data bytes)` when the old segment is prepared: trim it to its data.
    old_trim: Option<u64>,
    new: Seq,
    /// Rename the ready spare into place instead of creating an empty file.
    spare: bool,
}

/// Work for the append lane, in order.
#[derive(Debug)]
enum Step {
    /// The open-time repair (truncate a torn tail, make the tail durable, remove a stale spare).
    Repair,
    Flush(Batch),
    Roll(Roll),
}

/// State of `next-segment.prep`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prep {
    Idle,
    Preparing,
    Ready,
    /// A queued roll will rename it.
    Claimed,
    /// Removing what a failed preparation left.
    Cleaning,
}

/// The frames of the last group commit, kept to serve the dispatcher's read without I/O.
#[derive(Debug)]
struct Recent {
    segment: Seq,
    offset: u64,
    seqs: SeqRange,
    buf: Vec<u8>,
}

/// Requests in flight, by id.
#[derive(Debug)]
enum Pending {
    Append(Step),
    Prepare { tail: Seq },
    PrepareCleanup,
    Compact { victims: Vec<Segment> },
    Read(read::ReadState),
}

/// The ingress WAL actor. Build it with [`WalRecovery`]; see the module documentation for the contract.
#[derive(Debug)]
pub struct IngressWal {
    config: WalConfig,
    segments: BTreeMap<Seq, Segment>,
    tail: Tail,
    next_seq: Seq,
    durable_next: Seq,
    open: Batch,
    queue: VecDeque<Step>,
    append_in_flight: Option<IoId>,
    unflushed_bytes: usize,
    backstop_at: Option<Instant>,
    /// When the flush on the append lane started (its duration bounds the next cohort wait).
    flush_started_at: Option<Instant>,
    /// The cohort the next flush of the open batch waits for.
    cohort: Option<Cohort>,
    pool: Vec<Vec<u8>>,
    /// The waiter list of the last batch flushed, emptied, for the next batch opened (one list per
    /// batch otherwise: an allocation per group commit).
    spare_waiters: Vec<(AppendId, SeqRange)>,
    buffers_created: u64,
    recent: Recent,
    latched: Option<IoFault>,
    /// The open repair completed: recovered records are durable and may be read.
    repaired: bool,
    prep: Prep,
    prep_failed_for: Option<Seq>,
    checkpoint_synced: Seq,
    dispatch_start: Seq,
    compact_in_flight: bool,
    compact_blocked: bool,
    reads_in_flight: usize,
    /// Set by the planted `roll-drops-batch-tail` for the call being staged.
    planted_tail_dropped: bool,
    next_io_id: u64,
    pending: BTreeMap<IoId, Pending>,
    outputs: VecDeque<WalOutput>,
    /// A [`WalInput::Batch`] is being handled: no flush starts before its last input.
    batching: bool,
}

/// What recovery hands the actor.
struct Recovered {
    segments: BTreeMap<Seq, Segment>,
    tail: Tail,
    next_seq: Seq,
    checkpoint: Seq,
    dispatch_start: Seq,
    repair: Vec<IoOp>,
    warning: Option<WalWarning>,
}

impl IngressWal {
    fn from_recovered(config: WalConfig, recovered: Recovered) -> IngressWal {
        let next_seq = recovered.next_seq;
        let tail = recovered.tail;
        let mut wal = IngressWal {
            open: Batch {
                segment: tail.first,
                prepared: tail.prepared,
                offset: tail.end,
                buf: Vec::new(),
                len: 0,
                seqs: SeqRange {
                    first: next_seq,
                    next: next_seq,
                },
                waiters: Vec::new(),
            },
            config,
            segments: recovered.segments,
            tail,
            next_seq,
            durable_next: next_seq,
            queue: VecDeque::new(),
            append_in_flight: None,
            unflushed_bytes: 0,
            backstop_at: None,
            flush_started_at: None,
            cohort: None,
            pool: Vec::new(),
            spare_waiters: Vec::new(),
            buffers_created: 1,
            recent: Recent {
                segment: tail.first,
                offset: tail.end,
                seqs: SeqRange {
                    first: next_seq,
                    next: next_seq,
                },
                buf: Vec::new(),
            },
            latched: None,
            repaired: false,
            prep: Prep::Idle,
            prep_failed_for: None,
            checkpoint_synced: recovered.checkpoint,
            dispatch_start: recovered.dispatch_start,
            compact_in_flight: false,
            compact_blocked: false,
            reads_in_flight: 0,
            planted_tail_dropped: false,
            next_io_id: 0,
            pending: BTreeMap::new(),
            outputs: VecDeque::new(),
            batching: false,
        };
        if let Some(warning) = recovered.warning {
            wal.outputs.push_back(WalOutput::Warning(warning));
        }
        let id = wal.io_id();
        wal.pending.insert(id, Pending::Append(Step::Repair));
        wal.append_in_flight = Some(id);
        wal.outputs.push_back(WalOutput::Io(IoRequest {
            id,
            lane: wal.config.lanes.append,
            ops: recovered.repair,
        }));
        wal.check_invariants();
        wal
    }

    // ---- getters ----

    /// The settings.
    pub fn config(&self) -> &WalConfig {
        &self.config
    }

    /// Every record below this is durable.
    pub fn durable_next_seq(&self) -> Seq {
        self.durable_next
    }

    /// The sequence number the next staged record takes.
    pub fn next_seq(&self) -> Seq {
        self.next_seq
    }

    /// The first sequence number of the oldest segment still on disk.
    pub fn oldest_segment_first_seq(&self) -> Seq {
        *self
            .segments
            .keys()
            .next()
            .expect("an open WAL has at least one segment")
    }

    /// Where dispatch starts after open: the stored checkpoint, or the oldest segment when the
    /// checkpoint was below it.
    pub fn dispatch_start(&self) -> Seq {
        self.dispatch_start
    }

    /// The highest synced checkpoint seen (at open, the stored one).
    pub fn checkpoint_synced(&self) -> Seq {
        self.checkpoint_synced
    }

    /// Bytes of WAL files on disk, as far as the WAL knows (segments, plus a spare being prepared or ready).
    pub fn bytes_on_disk(&self) -> u64 {
        let segments: u64 = self.segments.values().map(|segment| segment.file_len).sum();
        let spare = match self.prep {
            Prep::Preparing | Prep::Ready | Prep::Claimed => self.config.segment_bytes_max,
            Prep::Idle | Prep::Cleaning => 0,
        };
        segments + spare
    }

    /// Number of segments on disk.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// True once a disk failure latched the WAL (`narad_ingress_wal_failed`).
    pub fn is_latched(&self) -> bool {
        self.latched.is_some()
    }

    /// The fault the WAL latched on, if any.
    pub fn latch_fault(&self) -> Option<&IoFault> {
        self.latched.as_ref()
    }

    /// Bytes staged, queued behind a roll or in flight: not yet durable.
    pub fn unflushed_bytes(&self) -> usize {
        self.unflushed_bytes
    }

    /// Staging buffers allocated since open (steady state stops growing: buffers are reused).
    pub fn staging_buffers_created(&self) -> u64 {
        self.buffers_created
    }

    // ---- shared helpers ----

    fn io_id(&mut self) -> IoId {
        let id = IoId(self.next_io_id);
        self.next_io_id += 1;
        id
    }

    fn emit_io(&mut self, lane: crate::disk::IoLane, ops: Vec<IoOp>, pending: Pending) -> IoId {
        let id = self.io_id();
        self.pending.insert(id, pending);
        self.outputs
            .push_back(WalOutput::Io(IoRequest { id, lane, ops }));
        id
    }

    fn sync_interval(&self) -> Duration {
        Duration::from_millis(self.config.sync_interval_ms)
    }

    /// True while records wait to be written (staged in the open batch or queued behind a roll).
    fn records_waiting(&self) -> bool {
        !self.open.seqs.is_empty() || self.queue.iter().any(|step| matches!(step, Step::Flush(_)))
    }

    fn on_tick(&mut self, now: Instant) {
        if self.backstop_at.is_some_and(|at| at <= now) {
            // The backstop bounds everything: the flush starts whatever the cohort.
            self.backstop_at = None;
            self.cohort = None;
            self.start_next(now);
        }
        if self.cohort.is_some_and(|cohort| cohort.deadline <= now) {
            self.cohort = None;
            self.start_next(now);
        }
    }

    /// The deadline of the cohort wait while it holds staged records back.
    fn cohort_deadline(&self) -> Option<Instant> {
        let cohort = self.cohort?;
        let holding = self.latched.is_none()
            && self.append_in_flight.is_none()
            && self.queue.is_empty()
            && !self.open.seqs.is_empty();
        holding.then_some(cohort.deadline)
    }

    /// Arms the backstop when records start waiting; disarms it when none do.
    fn rearm_backstop(&mut self, now: Instant) {
        if self.latched.is_none() && self.records_waiting() {
            if self.backstop_at.is_none() {
                self.backstop_at = Some(now + self.sync_interval());
            }
        } else {
            self.backstop_at = None;
        }
    }

    fn check_invariants(&self) {
        assert!(self.durable_next <= self.next_seq, "durable past next");
        assert!(!self.segments.is_empty(), "an open WAL has a segment");
        let (_, active) = self.segments.last_key_value().expect("checked above");
        assert_eq!(
            active.next, self.durable_next,
            "durable frontier is the active segment's next"
        );
        assert_eq!(
            self.open.offset + self.open.buf.len() as u64,
            self.tail.end,
            "the open batch ends where the tail's staged bytes end"
        );
        assert_eq!(
            self.open.seqs.next, self.next_seq,
            "the open batch ends at next_seq"
        );
        assert_eq!(
            self.open.segment, self.tail.first,
            "the open batch targets the tail"
        );
        let append_pending = self
            .pending
            .values()
            .filter(|pending| matches!(pending, Pending::Append(_)))
            .count();
        assert_eq!(
            append_pending,
            usize::from(self.append_in_flight.is_some()),
            "one request at a time on the append lane"
        );
        if self.latched.is_some() {
            assert!(
                self.queue.is_empty() && self.open.seqs.is_empty(),
                "latched WAL stages nothing"
            );
            assert_eq!(self.unflushed_bytes, 0);
            assert!(self.cohort.is_none(), "a latched WAL waits for no cohort");
        }
        if let Some(cohort) = self.cohort {
            assert!(
                cohort.appends_arrived < cohort.appends_wanted,
                "a cohort that came back starts the flush"
            );
        }
        assert!(self.pool.len() <= POOL_BUFFERS_MAX);
        assert!(self.reads_in_flight <= self.config.reads_in_flight_max);
        if crate::DEEP_CHECKS {
            let mut expected: Option<Seq> = None;
            for (first, segment) in &self.segments {
                assert_eq!(*first, segment.first);
                if let Some(expected) = expected {
                    assert_eq!(segment.first, expected, "segments are contiguous");
                }
                assert!(segment.data_end <= segment.file_len);
                expected = Some(segment.next);
            }
        }
    }
}

impl Actor for IngressWal {
    type Input = WalInput;
    type Output = WalOutput;

    fn handle(&mut self, now: Instant, input: WalInput) {
        match input {
            WalInput::Batch(inputs) => {
                self.batching = true;
                for input in inputs {
                    assert!(
                        !matches!(input, WalInput::Batch(_)),
                        "a batch holds no batch"
                    );
                    self.handle_one(now, input);
                }
                self.batching = false;
                self.start_next(now);
            }
            input @ (WalInput::Append { .. }
            | WalInput::AppendMany { .. }
            | WalInput::IoDone { .. }
            | WalInput::Read { .. }
            | WalInput::CheckpointSynced { .. }
            | WalInput::Tick) => self.handle_one(now, input),
        }
        self.rearm_backstop(now);
        self.check_invariants();
    }

    fn poll_output(&mut self) -> Option<WalOutput> {
        self.outputs.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match (self.backstop_at, self.cohort_deadline()) {
            (Some(backstop), Some(cohort)) => Some(backstop.min(cohort)),
            (backstop, cohort) => backstop.or(cohort),
        }
    }

    fn has_output(&self) -> bool {
        !self.outputs.is_empty()
    }
}

impl IngressWal {
    fn handle_one(&mut self, now: Instant, input: WalInput) {
        match input {
            WalInput::Batch(_) => unreachable!("handled by `handle`"),
            WalInput::Append { id, record } => {
                let mut copy = |_: usize, out: &mut [u8]| {
                    out.copy_from_slice(&record);
                    Ok(())
                };
                self.on_append(now, id, &[record.len()], &mut copy);
            }
            WalInput::AppendMany {
                id,
                sizes,
                mut fill,
            } => self.on_append(now, id, &sizes, &mut *fill),
            WalInput::IoDone {
                request,
                completion,
            } => self.on_io_done(now, request, completion),
            WalInput::Read {
                id,
                from,
                max_records,
                max_bytes,
            } => self.on_read(id, from, max_records, max_bytes),
            WalInput::CheckpointSynced { seq } => self.on_checkpoint_synced(now, seq),
            WalInput::Tick => self.on_tick(now),
        }
    }

    fn on_io_done(
        &mut self,
        now: Instant,
        request: IoRequest,
        completion: crate::disk::IoCompletion,
    ) {
        assert_eq!(
            request.id, completion.id,
            "completion handed back with another request"
        );
        let pending = self
            .pending
            .remove(&completion.id)
            .expect("a completion for a request this WAL emitted and has not seen complete");
        match pending {
            Pending::Append(step) => {
                self.on_append_step_done(now, step, request, completion.result)
            }
            Pending::Prepare { tail } => self.on_prepare_done(tail, completion.result),
            Pending::PrepareCleanup => self.on_prepare_cleanup_done(),
            Pending::Compact { victims } => self.on_compact_done(now, victims, completion.result),
            Pending::Read(state) => self.on_read_done(state, completion.result),
        }
    }
}
