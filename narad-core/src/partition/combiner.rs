//! `Combiner`: one per partition on its owner; queues commit batches, runs one cycle at a time, and owns
//! the [`PartitionLog`] of the partition's live topic incarnation.
//!
//! # Contract
//! - A batch ([`CombinerInput::Submit`]) queues. With no cycle running, the oldest waiting batch leads a
//!   cycle: the cycle *is* the produce lock. It drains every queued batch, then, before appending
//!   anything, checks in this order:
//!   1. **ownership and the handoff freeze** — not owned or frozen: every batch gets the retriable
//!      [`CommitError::NotOwner`], nothing is appended;
//!   2. **the log still belongs to the live topic** — the topic is gone: a batch carrying an incarnation
//!      id gets [`CommitError::TopicIncarnationMismatch`] (live `None`), one without gets
//!      [`CommitError::TopicNotFound`]. The held log is of another incarnation (the metadata moved): the
//!      cycle lets the log go ([`CombinerOutput::LogRetired`]), opens the live incarnation's log, and runs
//!      the checks again on the same batches once it is open. The third such resolution in one cycle is
//!      the last: a fourth would be needed → `NotOwner` for every batch, nothing appended. (The Go owner
//!      asks whether the topic's metadata version moved since its log was checked; here the held log's
//!      incarnation id and directory are compared with the latest view at every check, which is exact
//!      and free, so a moved version that kept the incarnation costs nothing and `version` is carried
//!      for traces only);
//!   3. **each caller is still waiting** — a batch abandoned ([`CombinerInput::Abandon`]) or past its
//!      deadline is left out with [`CommitError::CallerGone`] (appending it would only duplicate);
//!   4. **the incarnation** — a batch with a record whose id is not the held (= live) log's gets the
//!      retriable [`CommitError::TopicIncarnationMismatch`] naming both ids (a remote owner answers 412);
//!      records without an id commit by name. (The Go owner also refuses an id that is the live topic's
//!      but not the held log's, to be resolved next cycle; here step 2 already resolved the held log to
//!      the live incarnation from the same view, so that case cannot arise within a cycle.)
//!
//!   Then one run, one `CommitDurable`, one outcome per batch: contiguous offsets in queue order, or the
//!   same error for all. Batches arriving meanwhile wait for the next cycle, which the oldest of them
//!   leads. Commit times are `unix_epoch_ms + now` and never go backwards (the log keeps the max).
//! - **Inputs, not lookups.** Ownership, freeze, metadata version and the live incarnation (with the
//!   directory of its log) come as [`TopicView`] events from the driver's metastore replica; the latest
//!   one is used at each check. A view naming another incarnation while no cycle runs retires the held
//!   log at once, so reads never serve a deleted incarnation.
//! - **Log failures.** A latched log (a failed commit's truncation failed) or a log whose open failed
//!   (when reopening is allowed) is retried by the first cycle at least `log_retry_interval` after the
//!   failure; cycles before that fail fast with [`CommitError::LogUnavailable`].
//! - **Reads** go to the held log when it is the live incarnation's, else [`LogReadError::NotOpen`].
//! - **Handoff.** [`CombinerInput::QueryHighWatermark`] is answered when no commit is in flight: with
//!   the view frozen first, the answer is the final high watermark.
//!
//! # Polling order
//! After every `handle`, drain `poll_output`. I/O requests follow the log's lanes (commit lane
//! serialized). No timers: `poll_timeout` is always `None`.
//!
//! # Invariants (checked after every `handle` in debug builds)
//! At most one commit in flight, and only inside a cycle; queue within its limits; the log's own.

use std::collections::VecDeque;
use std::time::Duration;

use super::log::{
    AppendRecord, CommitFault, CommitRequest, CommittedRun, JournalRun, LogCommitId, LogInput,
    LogOutput, LogReadError, LogReadId, LogStatus, PartitionLog, PartitionLogConfig, ReadBatch,
    ReadRequest, RecoveryError, RecoveryReport, RetainedRange, RetentionPolicy, IO_IDS_PER_LOG,
};
use crate::actor::Actor;
use crate::codec::partition::FRAME_RECORDS_BYTES_MAX;
use crate::disk::{IoCompletion, IoRequest};
use crate::error::IoFault;
use crate::ids::{Offset, TopicId};
use crate::planted::Plant;
use crate::time::Instant;

/// Batches waiting for a cycle, at most (more are refused with [`CommitError::Overloaded`]).
pub const BATCHES_QUEUED_MAX_DEFAULT: usize = 1024;
/// Records waiting for a cycle, at most.
pub const RECORDS_QUEUED_MAX_DEFAULT: usize = 65_536;
/// Key and payload bytes waiting for a cycle, at most (a batch arriving at an empty queue is always
/// taken, so one large local batch is never refused for size alone).
pub const BYTES_QUEUED_MAX_DEFAULT: usize = 64 * 1024 * 1024;
/// Log resolutions one cycle may make before refusing with [`CommitError::NotOwner`].
pub const RESOLVE_TRIES_MAX_DEFAULT: u32 = 3;
/// How long a latched or failed log waits before a cycle tries it again.
pub const LOG_RETRY_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

/// Configuration of one partition's combiner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CombinerConfig {
    /// The template of every log this combiner opens; `dir` is replaced by the live incarnation's
    /// directory and `io_id_base` by a fresh range per log.
    pub log: PartitionLogConfig,
    /// See [`BATCHES_QUEUED_MAX_DEFAULT`].
    pub batches_queued_max: usize,
    /// See [`RECORDS_QUEUED_MAX_DEFAULT`].
    pub records_queued_max: usize,
    /// See [`BYTES_QUEUED_MAX_DEFAULT`].
    pub bytes_queued_max: usize,
    /// See [`RESOLVE_TRIES_MAX_DEFAULT`].
    pub resolve_tries_max: u32,
    /// See [`LOG_RETRY_INTERVAL_DEFAULT`].
    pub log_retry_interval: Duration,
    /// Unix time in milliseconds at [`Instant::ZERO`]: commit time = this + `now`.
    pub unix_epoch_ms: u64,
    /// The bug planted in this combiner (simulator only; [`Plant::NONE`] everywhere else).
    pub plant: Plant,
}

impl CombinerConfig {
    /// Production defaults; `unix_epoch_ms` from the driver's wall clock at node start.
    pub fn new(unix_epoch_ms: u64) -> Self {
        CombinerConfig {
            log: PartitionLogConfig::new(""),
            batches_queued_max: BATCHES_QUEUED_MAX_DEFAULT,
            records_queued_max: RECORDS_QUEUED_MAX_DEFAULT,
            bytes_queued_max: BYTES_QUEUED_MAX_DEFAULT,
            resolve_tries_max: RESOLVE_TRIES_MAX_DEFAULT,
            log_retry_interval: LOG_RETRY_INTERVAL_DEFAULT,
            unix_epoch_ms,
            plant: Plant::NONE,
        }
    }
}

/// Identifies a batch (assigned by the driver, unique among batches it has not seen answered).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BatchId(pub u64);

/// Identifies a high-watermark query.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueryId(pub u64);

/// One record of a commit batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchRecord {
    /// The incarnation the record was accepted under, or `None` (commits by name).
    pub topic_id: Option<TopicId>,
    /// The key, or `None`.
    pub key: Option<Vec<u8>>,
    /// The message bytes.
    pub payload: Vec<u8>,
}

/// A commit batch from one caller (a dispatcher's commit, a fan-out cursor, a synchronous produce).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitBatch {
    /// Echoed in the outcome.
    pub id: BatchId,
    /// The records, in order.
    pub records: Vec<BatchRecord>,
    /// When the caller stops waiting (its RPC budget); `None` = until answered or abandoned.
    pub deadline: Option<Instant>,
}

/// The live topic incarnation, as the metastore replica shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveTopic {
    /// Its incarnation id (`None` for a topic created before ids existed).
    pub topic_id: Option<TopicId>,
    /// The directory of this partition's log for that incarnation.
    pub log_dir: String,
}

/// What this node's metastore replica says about the partition, delivered whenever it changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicView {
    /// The topic's metadata version (moves on every change of its record).
    pub version: u64,
    /// This node owns the partition.
    pub owned: bool,
    /// A rebalance handoff froze the partition.
    pub frozen: bool,
    /// The live incarnation under the topic's name, or `None` when the topic does not exist.
    pub live: Option<LiveTopic>,
}

/// A batch's offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommittedRange {
    /// Offset of the batch's first record.
    pub base: Offset,
    /// Records committed (all of the batch).
    pub count: u64,
    /// Commit time of every record, Unix ms.
    pub committed_at_ms: u64,
}

/// Why a batch was not committed. Nothing of it is visible.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    /// Not the owner, frozen by a handoff, or the topic record kept changing (retriable elsewhere).
    #[error("not the partition owner")]
    NotOwner,
    /// The topic does not exist here (for a batch without incarnation ids).
    #[error("topic not found")]
    TopicNotFound,
    /// A record was accepted for another incarnation than the live one (HTTP 412).
    #[error("topic incarnation mismatch: record {record_topic_id}, live {live_topic_id:?}")]
    TopicIncarnationMismatch {
        /// The record's incarnation id.
        record_topic_id: TopicId,
        /// The live incarnation's id here (`None`: no live topic, or one without an id).
        live_topic_id: Option<TopicId>,
    },
    /// The log is latched, failed to open, or cannot be retried yet.
    #[error("partition log unavailable ({0:?})")]
    LogUnavailable(LogStatus),
    /// The commit failed; nothing of the cycle is visible.
    #[error("commit failed: {0}")]
    Storage(CommitFault),
    /// The queue is full.
    #[error("commit queue full")]
    Overloaded,
    /// A record does not fit in a frame.
    #[error("record too large")]
    RecordTooLarge,
    /// The batch has no records.
    #[error("empty batch")]
    EmptyBatch,
    /// The caller gave up before the cycle reached its batch; nothing was appended.
    #[error("caller gave up")]
    CallerGone,
}

impl CommitError {
    /// True when the same batch may succeed later (here or at another owner).
    pub fn retriable(&self) -> bool {
        match self {
            CommitError::NotOwner
            | CommitError::TopicNotFound
            | CommitError::TopicIncarnationMismatch { .. }
            | CommitError::LogUnavailable(_)
            | CommitError::Storage(_)
            | CommitError::Overloaded
            | CommitError::CallerGone => true,
            CommitError::RecordTooLarge | CommitError::EmptyBatch => false,
        }
    }
}

/// Inputs of [`Combiner`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CombinerInput {
    /// A commit batch arrives.
    Submit(CommitBatch),
    /// The caller of a batch gave up (connection closed, RPC timed out).
    Abandon(BatchId),
    /// The metastore replica's view of the partition changed.
    View(TopicView),
    /// Read records of the live incarnation.
    Read(ReadRequest),
    /// Ask for the high watermark once no commit is in flight.
    QueryHighWatermark(QueryId),
    /// An I/O request completed.
    Io(IoCompletion),
    /// The owner journal's outcome for the held log's commit ([`CombinerOutput::Journal`]).
    JournalDone {
        /// The log's commit.
        id: LogCommitId,
        /// `Ok` once durable in the journal.
        result: Result<(), IoFault>,
    },
    /// The owner journal wants the held log's files synced ([`CombinerOutput::Synced`] answers).
    Sync,
    /// A retention check of the held log, if it is the live one.
    Retain(RetentionPolicy),
}

/// Outputs of [`Combiner`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum CombinerOutput {
    /// Run this I/O request and feed back its completion.
    Io(IoRequest),
    /// A batch's outcome.
    Committed {
        /// The batch.
        id: BatchId,
        /// Its offsets, or why it was not committed.
        result: Result<CommittedRange, CommitError>,
    },
    /// A read's outcome.
    ReadDone {
        /// The read.
        id: LogReadId,
        /// Records, or why none.
        result: Result<ReadBatch, LogReadError>,
    },
    /// The answer to a [`CombinerInput::QueryHighWatermark`] (`None`: no open log).
    HighWatermark {
        /// The query.
        id: QueryId,
        /// The high watermark of the live incarnation's log.
        high_watermark: Option<Offset>,
    },
    /// A log finished opening.
    LogOpened {
        /// Its incarnation.
        topic_id: Option<TopicId>,
        /// What recovery found.
        report: RecoveryReport,
    },
    /// A log failed to open.
    LogOpenFailed {
        /// Its incarnation.
        topic_id: Option<TopicId>,
        /// Why.
        error: RecoveryError,
    },
    /// A log latched after a failed commit could not be truncated.
    LogLatched {
        /// Its incarnation.
        topic_id: Option<TopicId>,
        /// The fault.
        fault: IoFault,
    },
    /// The held log's commit is written and read back: make it durable in the owner journal and
    /// answer [`CombinerInput::JournalDone`].
    Journal {
        /// The log's directory.
        dir: String,
        /// The log's commit.
        id: LogCommitId,
        /// Its frames.
        run: JournalRun,
    },
    /// The held log's files hold every record below `through` durably.
    Synced {
        /// The log's high watermark when its sync started.
        through: Offset,
    },
    /// The held log cannot sync now (a resync waits for its commit in flight): ask again later.
    SyncDeferred,
    /// The held log's lazy sync failed (the journal asks again later; the log resyncs then).
    SyncFailed {
        /// Its incarnation.
        topic_id: Option<TopicId>,
        /// The fault.
        fault: IoFault,
    },
    /// Retention took segments out of the held log.
    Retained(RetainedRange),
    /// A step of the held log's retention failed (tried again at the next check).
    RetentionFailed(IoFault),
    /// A log was let go: its incarnation is no longer live here (the driver may quarantine `dir`).
    LogRetired {
        /// Its incarnation.
        topic_id: Option<TopicId>,
        /// Its directory.
        dir: String,
    },
}

#[derive(Debug)]
struct Slot {
    log: PartitionLog,
    topic_id: Option<TopicId>,
    dir: String,
    /// When a latched or failed log may be tried again.
    retry_at: Option<Instant>,
}

#[derive(Debug)]
struct Queued {
    batch: CommitBatch,
    abandoned: bool,
    bytes: usize,
}

#[derive(Debug)]
struct Cycle {
    batches: Vec<Queued>,
    resolutions: u32,
    /// The commit in flight and each batch's record count, in run order.
    committing: Option<(LogCommitId, Vec<(BatchId, u64)>)>,
}

enum Step {
    Wait,
    Done,
    Commit,
}

/// The per-partition commit combiner: see the module documentation.
#[derive(Debug)]
pub struct Combiner {
    config: CombinerConfig,
    view: TopicView,
    slot: Option<Slot>,
    logs_opened: u64,
    queue: VecDeque<Queued>,
    queued_records: usize,
    queued_bytes: usize,
    cycle: Option<Cycle>,
    /// The last cycle's (emptied) batch list, reused by the next cycle.
    spare_batches: Vec<Queued>,
    /// The (emptied) list of commit outcomes one drain of the log collects, reused by the next.
    spare_outcomes: Vec<(LogCommitId, Result<CommittedRun, CommitFault>)>,
    next_commit: u64,
    hwm_queries: Vec<QueryId>,
    outputs: VecDeque<CombinerOutput>,
}

impl Combiner {
    /// A combiner for the partition as `view` shows it; opens the live incarnation's log at once.
    pub fn new(config: CombinerConfig, view: TopicView) -> Self {
        assert!(config.batches_queued_max > 0 && config.records_queued_max > 0);
        let mut combiner = Combiner {
            config,
            view,
            slot: None,
            logs_opened: 0,
            queue: VecDeque::new(),
            queued_records: 0,
            queued_bytes: 0,
            cycle: None,
            spare_batches: Vec::new(),
            spare_outcomes: Vec::new(),
            next_commit: 0,
            hwm_queries: Vec::new(),
            outputs: VecDeque::new(),
        };
        if let Some(live) = combiner.view.live.clone() {
            combiner.open_log(&live, Instant::ZERO);
        }
        combiner
    }

    /// The latest view.
    pub fn view(&self) -> &TopicView {
        &self.view
    }

    /// The held log (of the live incarnation or, until a check retires it, a previous one).
    pub fn log(&self) -> Option<&PartitionLog> {
        self.slot.as_ref().map(|slot| &slot.log)
    }

    /// The incarnation of the held log.
    pub fn log_topic_id(&self) -> Option<Option<TopicId>> {
        self.slot.as_ref().map(|slot| slot.topic_id)
    }

    /// Batches waiting for the next cycle.
    pub fn queued_batches(&self) -> usize {
        self.queue.len()
    }

    /// True while a cycle runs.
    pub fn cycle_running(&self) -> bool {
        self.cycle.is_some()
    }

    // ---- inputs ----

    fn on_submit(&mut self, now: Instant, batch: CommitBatch) {
        if batch.records.is_empty() {
            return self.answer(batch.id, Err(CommitError::EmptyBatch));
        }
        let mut bytes = 0usize;
        for record in &batch.records {
            let record_bytes = record.key.as_ref().map_or(0, Vec::len) + record.payload.len();
            // Length prefix, format byte, at most 10 varint bytes, timestamp.
            if record_bytes + 23 > FRAME_RECORDS_BYTES_MAX {
                return self.answer(batch.id, Err(CommitError::RecordTooLarge));
            }
            bytes += record_bytes;
        }
        let full = !self.queue.is_empty()
            && (self.queue.len() >= self.config.batches_queued_max
                || self.queued_records + batch.records.len() > self.config.records_queued_max
                || self.queued_bytes + bytes > self.config.bytes_queued_max);
        if full {
            return self.answer(batch.id, Err(CommitError::Overloaded));
        }
        self.queued_records += batch.records.len();
        self.queued_bytes += bytes;
        self.queue.push_back(Queued {
            batch,
            abandoned: false,
            bytes,
        });
        self.advance(now);
    }

    fn on_abandon(&mut self, id: BatchId) {
        let waiting = self
            .cycle
            .iter_mut()
            .filter(|cycle| cycle.committing.is_none())
            .flat_map(|cycle| cycle.batches.iter_mut())
            .chain(self.queue.iter_mut());
        for queued in waiting {
            if queued.batch.id == id {
                queued.abandoned = true;
            }
        }
    }

    fn on_view(&mut self, now: Instant, view: TopicView) {
        self.view = view;
        self.advance(now);
    }

    /// With no cycle running, lets go of a log that is not the live incarnation's and opens the live
    /// one, so reads never serve a deleted incarnation and the next cycle finds its log open.
    fn resolve_idle(&mut self, now: Instant) {
        if self.cycle.is_some() || self.slot_is_live() {
            return;
        }
        if self.slot.is_none() && self.view.live.is_none() {
            return;
        }
        self.retire_log();
        if let Some(live) = self.view.live.clone() {
            self.open_log(&live, now);
        }
    }

    fn on_read(&mut self, now: Instant, request: ReadRequest) {
        if !self.slot_is_live() {
            self.outputs.push_back(CombinerOutput::ReadDone {
                id: request.id,
                result: Err(LogReadError::NotOpen),
            });
            return;
        }
        self.feed_log(now, LogInput::Read(request));
    }

    fn on_query(&mut self, id: QueryId) {
        self.hwm_queries.push(id);
        self.answer_queries();
    }

    fn on_io(&mut self, now: Instant, completion: IoCompletion) {
        let owned = self
            .slot
            .as_ref()
            .is_some_and(|slot| slot.log.owns_io(completion.id));
        if owned {
            self.feed_log(now, LogInput::Io(completion));
        }
        // Otherwise the completion belongs to a retired log: nobody waits for it.
        self.advance(now);
    }

    // ---- the log slot ----

    fn slot_is_live(&self) -> bool {
        match (&self.slot, &self.view.live) {
            (Some(slot), Some(live)) => slot.topic_id == live.topic_id && slot.dir == live.log_dir,
            _ => false,
        }
    }

    fn open_log(&mut self, live: &LiveTopic, now: Instant) {
        let config = PartitionLogConfig {
            dir: live.log_dir.clone(),
            io_id_base: self.config.log.io_id_base + self.logs_opened * IO_IDS_PER_LOG,
            ..self.config.log.clone()
        };
        self.logs_opened += 1;
        self.slot = Some(Slot {
            log: PartitionLog::open(config),
            topic_id: live.topic_id,
            dir: live.log_dir.clone(),
            retry_at: None,
        });
        self.drain_log(now);
    }

    fn retire_log(&mut self) {
        let Some(mut slot) = self.slot.take() else {
            return;
        };
        for id in slot.log.take_pending_reads() {
            self.outputs.push_back(CombinerOutput::ReadDone {
                id,
                result: Err(LogReadError::Retired),
            });
        }
        self.outputs.push_back(CombinerOutput::LogRetired {
            topic_id: slot.topic_id,
            dir: slot.dir,
        });
    }

    fn feed_log(&mut self, now: Instant, input: LogInput) {
        if let Some(slot) = self.slot.as_mut() {
            crate::feed(&mut slot.log, now, input);
            self.drain_log(now);
        }
    }

    /// Moves the log's outputs to ours, acting on commit outcomes and failures.
    fn drain_log(&mut self, now: Instant) {
        let Some(slot) = self.slot.as_mut() else {
            return;
        };
        let topic_id = slot.topic_id;
        let retry_at = now + self.config.log_retry_interval;
        let mut commit_outcomes = std::mem::take(&mut self.spare_outcomes);
        while let Some(output) = slot.log.poll_output() {
            let forwarded = match output {
                LogOutput::Io(request) => CombinerOutput::Io(request),
                LogOutput::Opened(report) => CombinerOutput::LogOpened { topic_id, report },
                LogOutput::OpenFailed(error) => {
                    slot.retry_at = Some(retry_at);
                    CombinerOutput::LogOpenFailed { topic_id, error }
                }
                LogOutput::Latched(fault) => {
                    slot.retry_at = Some(retry_at);
                    CombinerOutput::LogLatched { topic_id, fault }
                }
                LogOutput::ReadDone { id, result } => CombinerOutput::ReadDone { id, result },
                LogOutput::Journal { id, run } => CombinerOutput::Journal {
                    dir: slot.dir.clone(),
                    id,
                    run,
                },
                LogOutput::Synced { through } => CombinerOutput::Synced { through },
                LogOutput::SyncFailed(fault) => CombinerOutput::SyncFailed { topic_id, fault },
                LogOutput::SyncDeferred => CombinerOutput::SyncDeferred,
                LogOutput::Retained(range) => CombinerOutput::Retained(range),
                LogOutput::RetentionFailed(fault) => CombinerOutput::RetentionFailed(fault),
                LogOutput::CommitDone { id, result } => {
                    commit_outcomes.push((id, result));
                    continue;
                }
            };
            self.outputs.push_back(forwarded);
        }
        for (id, result) in commit_outcomes.drain(..) {
            self.on_commit_done(id, result);
        }
        self.spare_outcomes = commit_outcomes;
    }

    // ---- cycles ----

    fn advance(&mut self, now: Instant) {
        loop {
            if self.cycle.is_none() {
                if self.queue.is_empty() {
                    return self.resolve_idle(now);
                }
                let mut batches = std::mem::take(&mut self.spare_batches);
                batches.extend(self.queue.drain(..));
                self.queued_records = 0;
                self.queued_bytes = 0;
                self.cycle = Some(Cycle {
                    batches,
                    resolutions: 0,
                    committing: None,
                });
            }
            if self.cycle.as_ref().is_some_and(|c| c.committing.is_some()) {
                return;
            }
            match self.check_cycle(now) {
                Step::Wait => return,
                Step::Commit => return self.start_commit(now),
                Step::Done => {
                    self.end_cycle();
                    self.answer_queries();
                }
            }
        }
    }

    /// The checks under the lock, in the order of the module documentation.
    fn check_cycle(&mut self, now: Instant) -> Step {
        // The planted bug: a freeze is answered but not checked here, under the lock.
        let frozen = self.view.frozen
            && !self
                .config
                .log
                .plant
                .is(crate::planted::PlantedBug::FreezeNotRecheckedUnderLock);
        if !self.view.owned || frozen {
            self.fail_cycle(|_| CommitError::NotOwner);
            return Step::Done;
        }
        let Some(live_topic_id) = self.view.live.as_ref().map(|live| live.topic_id) else {
            self.fail_cycle(|batch| match first_topic_id(batch) {
                Some(record_topic_id) => CommitError::TopicIncarnationMismatch {
                    record_topic_id,
                    live_topic_id: None,
                },
                None => CommitError::TopicNotFound,
            });
            return Step::Done;
        };
        if !self.slot_is_live() {
            let cycle = self.cycle.as_mut().expect("checking a cycle");
            cycle.resolutions += 1;
            if cycle.resolutions > self.config.resolve_tries_max {
                self.fail_cycle(|_| CommitError::NotOwner);
                return Step::Done;
            }
            let live = self.view.live.clone().expect("checked above");
            self.retire_log();
            self.open_log(&live, now);
            return Step::Wait;
        }
        if let Some(step) = self.check_log_ready(now) {
            return step;
        }
        self.drop_gone_callers(now);
        self.refuse_other_incarnations(live_topic_id);
        if self.cycle.as_ref().is_some_and(|c| c.batches.is_empty()) {
            return Step::Done;
        }
        Step::Commit
    }

    /// `None` when the held (live) log accepts a commit now; else whether to wait or give up.
    fn check_log_ready(&mut self, now: Instant) -> Option<Step> {
        let slot = self.slot.as_mut().expect("live slot");
        let status = slot.log.status();
        let retry_due = slot.retry_at.is_none_or(|at| now >= at);
        match status {
            LogStatus::Ready => None,
            LogStatus::Opening
            | LogStatus::Repairing
            | LogStatus::Committing
            | LogStatus::Rolling => Some(Step::Wait),
            // A log whose lazy sync failed has nothing to repair: only a restart replays its journal.
            LogStatus::Latched if retry_due && slot.log.retry_repair() => {
                slot.retry_at = None;
                self.drain_log(now);
                Some(Step::Wait)
            }
            LogStatus::OpenFailed
                if retry_due
                    && slot
                        .log
                        .open_error()
                        .is_some_and(RecoveryError::reopen_allowed) =>
            {
                let live = LiveTopic {
                    topic_id: slot.topic_id,
                    log_dir: slot.dir.clone(),
                };
                self.open_log(&live, now);
                Some(Step::Wait)
            }
            LogStatus::Latched | LogStatus::OpenFailed => {
                self.fail_cycle(|_| CommitError::LogUnavailable(status));
                Some(Step::Done)
            }
        }
    }

    fn drop_gone_callers(&mut self, now: Instant) {
        if self
            .config
            .plant
            .is(crate::planted::PlantedBug::CommitAfterCallerGaveUp)
        {
            return; // Planted: a caller that gave up is committed for all the same.
        }
        let cycle = self.cycle.as_mut().expect("checking a cycle");
        let is_gone =
            |queued: &Queued| queued.abandoned || queued.batch.deadline.is_some_and(|at| now >= at);
        if !cycle.batches.iter().any(is_gone) {
            return; // The usual case: every caller still waits, and nothing is moved.
        }
        let (gone, waiting): (Vec<Queued>, Vec<Queued>) =
            cycle.batches.drain(..).partition(is_gone);
        cycle.batches = waiting;
        for queued in gone {
            self.answer(queued.batch.id, Err(CommitError::CallerGone));
        }
    }

    fn refuse_other_incarnations(&mut self, live_topic_id: Option<TopicId>) {
        if self
            .config
            .plant
            .is(crate::planted::PlantedBug::StaleIncarnationIntoRecreatedTopic)
        {
            return; // Planted: every incarnation's records go into the live log.
        }
        let cycle = self.cycle.as_mut().expect("checking a cycle");
        let mut refused = Vec::new();
        cycle.batches.retain(|queued| {
            let other = queued
                .batch
                .records
                .iter()
                .find_map(|record| record.topic_id.filter(|id| Some(*id) != live_topic_id));
            match other {
                Some(record_topic_id) => {
                    refused.push((queued.batch.id, record_topic_id));
                    false
                }
                None => true,
            }
        });
        for (id, record_topic_id) in refused {
            let error = CommitError::TopicIncarnationMismatch {
                record_topic_id,
                live_topic_id,
            };
            self.answer(id, Err(error));
        }
    }

    fn start_commit(&mut self, now: Instant) {
        let cycle = self.cycle.as_mut().expect("committing a cycle");
        if crate::DEEP_CHECKS {
            // The checks ran at this instant: every caller in the run still waits.
            for queued in &cycle.batches {
                assert!(
                    !queued.abandoned && queued.batch.deadline.is_none_or(|at| now < at),
                    "batch {:?} is appended after its caller gave up",
                    queued.batch.id
                );
            }
        }
        let id = LogCommitId(self.next_commit);
        self.next_commit += 1;
        let mut records = Vec::new();
        let mut counts = Vec::with_capacity(cycle.batches.len());
        for queued in &mut cycle.batches {
            counts.push((queued.batch.id, queued.batch.records.len() as u64));
            records.extend(queued.batch.records.drain(..).map(|record| AppendRecord {
                key: record.key,
                payload: record.payload,
            }));
        }
        cycle.committing = Some((id, counts));
        let committed_at_ms = self.config.unix_epoch_ms + now.as_nanos() / 1_000_000;
        let request = CommitRequest {
            id,
            records,
            committed_at_ms,
        };
        self.feed_log(now, LogInput::Commit(request));
    }

    fn on_commit_done(
        &mut self,
        id: LogCommitId,
        result: Result<super::log::CommittedRun, CommitFault>,
    ) {
        let Some(cycle) = self.cycle.as_mut() else {
            return;
        };
        let Some((committing, counts)) = cycle.committing.take() else {
            return;
        };
        self.end_cycle();
        assert_eq!(committing, id, "one commit in flight");
        match result {
            Ok(run) => {
                let mut base = run.base.0;
                for (batch, count) in counts {
                    let range = CommittedRange {
                        base: Offset(base),
                        count,
                        committed_at_ms: run.committed_at_ms,
                    };
                    base += count;
                    self.answer(batch, Ok(range));
                }
            }
            Err(fault) => {
                for (batch, _) in counts {
                    self.answer(batch, Err(CommitError::Storage(fault.clone())));
                }
            }
        }
        self.answer_queries();
    }

    /// Ends the running cycle, keeping its batch list for the next one.
    fn end_cycle(&mut self) {
        if let Some(cycle) = self.cycle.take() {
            let mut batches = cycle.batches;
            batches.clear();
            self.spare_batches = batches;
        }
    }

    fn fail_cycle(&mut self, error: impl Fn(&CommitBatch) -> CommitError) {
        let cycle = self.cycle.as_mut().expect("failing a cycle");
        let batches: Vec<Queued> = cycle.batches.drain(..).collect();
        for queued in batches {
            let error = error(&queued.batch);
            self.answer(queued.batch.id, Err(error));
        }
    }

    fn answer(&mut self, id: BatchId, result: Result<CommittedRange, CommitError>) {
        self.outputs
            .push_back(CombinerOutput::Committed { id, result });
    }

    fn answer_queries(&mut self) {
        let committing = self.cycle.as_ref().is_some_and(|c| c.committing.is_some());
        if committing || self.hwm_queries.is_empty() {
            return;
        }
        let high_watermark = match &self.slot {
            Some(slot)
                if self.slot_is_live()
                    && !matches!(
                        slot.log.status(),
                        LogStatus::Opening | LogStatus::OpenFailed
                    ) =>
            {
                Some(slot.log.high_watermark())
            }
            _ => None,
        };
        for id in std::mem::take(&mut self.hwm_queries) {
            self.outputs
                .push_back(CombinerOutput::HighWatermark { id, high_watermark });
        }
    }

    /// Asserts the invariants in the module documentation.
    pub fn check_invariants(&self) {
        assert!(self.queue.len() <= self.config.batches_queued_max);
        assert_eq!(
            self.queued_records,
            self.queue
                .iter()
                .map(|q| q.batch.records.len())
                .sum::<usize>()
        );
        assert_eq!(
            self.queued_bytes,
            self.queue.iter().map(|q| q.bytes).sum::<usize>()
        );
        let committing = self.cycle.as_ref().is_some_and(|c| c.committing.is_some());
        let log_committing = self
            .slot
            .as_ref()
            .is_some_and(|slot| slot.log.status() == LogStatus::Committing);
        assert_eq!(
            committing, log_committing,
            "a commit runs only inside a cycle"
        );
        if let Some(slot) = &self.slot {
            slot.log.check_invariants();
        }
    }
}

fn first_topic_id(batch: &CommitBatch) -> Option<TopicId> {
    batch.records.iter().find_map(|record| record.topic_id)
}

impl Actor for Combiner {
    type Input = CombinerInput;
    type Output = CombinerOutput;

    fn handle(&mut self, now: Instant, input: CombinerInput) {
        match input {
            CombinerInput::Submit(batch) => self.on_submit(now, batch),
            CombinerInput::Abandon(id) => self.on_abandon(id),
            CombinerInput::View(view) => self.on_view(now, view),
            CombinerInput::Read(request) => self.on_read(now, request),
            CombinerInput::QueryHighWatermark(id) => self.on_query(id),
            CombinerInput::Io(completion) => self.on_io(now, completion),
            CombinerInput::JournalDone { id, result } => {
                self.feed_log(now, LogInput::JournalDone { id, result });
                // The commit landed (or failed): batches queued behind it start the next cycle.
                self.advance(now);
            }
            CombinerInput::Sync => {
                self.feed_log(now, LogInput::Sync);
                self.advance(now);
            }
            CombinerInput::Retain(policy) => {
                if self.slot_is_live() {
                    self.feed_log(now, LogInput::Retain(policy));
                }
                // A roll holds commits back; its completion (an `Io`) advances the queue.
                self.advance(now);
            }
        }
        if crate::DEEP_CHECKS {
            self.check_invariants();
        }
    }

    fn poll_output(&mut self) -> Option<CombinerOutput> {
        self.outputs.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn has_output(&self) -> bool {
        !self.outputs.is_empty()
    }
}

#[cfg(test)]
mod tests;
