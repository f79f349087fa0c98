//! The ingress host: runs the [`IngressWal`], the [`Checkpointer`] and (once recovery starts it) the
//! dispatcher (`crate::node::dispatch`) in one task on the generic [`crate::host`], over a [`Disk`], so
//! async callers can append records and await their durable outcome, and the dispatcher gets its
//! `Durable`, its reads and its checkpoint stores without a channel round trip.
//!
//! # What it does (and decides nothing)
//! - **Open** ([`WalHost::open`]): reads `<checkpoint dir>/checkpoint`, opens the checkpointer and runs its
//!   startup I/O to completion, so the recovered checkpoint is synced *before the WAL exists* and so before
//!   anything can compact behind it; then recovers the WAL ([`narad_core::wal::driver::open_wal`]: list the
//!   directory, read every segment, run the pure recovery) and starts one actor task. The WAL's first
//!   output is its repair request, which the task runs like any other; `open` returns once it ran
//!   (the WAL then reports its durable frontier) or failed (the WAL latches).
//! - **The task** owns the actors. Its inputs come from a bounded command mailbox
//!   ([`WalHostConfig::mailbox_capacity`]; callers wait when it is full), from the two I/O executors
//!   (one per actor, [`crate::io::IoExecutor`]), from the dispatcher's answers on their way, and from one
//!   timer set to the earliest of the actors' `poll_timeout`s. The appends a turn hands over reach the
//!   WAL as one [`WalInput::Batch`] (one group commit for all of them, even when no flush was running).
//!   After every input it drains the WAL's and the checkpointer's outputs and routes them: I/O to the
//!   executor, the WAL's durable frontier and latch into [`WalStatus`], checkpoint stores into the
//!   checkpointer, the checkpointer's *synced* value into the WAL (the only value compaction trails),
//!   warnings and failures to the log, and then the answers to the waiting callers (so an answered
//!   caller already sees the status its answer implies, and a 202 never waits for the dispatcher).
//!   Only then is the dispatcher fed what the WAL answered it (`Durable`, its read, its store), and the
//!   WAL what the dispatcher asked, until neither has more.
//! - **Accept instants**: each group commit's durable frontier and the instant its callers are
//!   answered go to [`AcceptTimes`] ([`WalHost::accept_times`]), forgotten once below the written
//!   checkpoint; the dispatcher reads them for `narad_accept_to_visible_seconds`.
//! - **Shutdown** ([`WalHost::shutdown`], or every handle dropped): stops taking commands, lets appends in
//!   flight finish, flushes the checkpoint (one sync now), waits for every request either actor has
//!   running (a segment preparation, a compaction) and ends the task.
//!
//! Time for the actors comes from the node's [`Clock`] (`tokio::time`, virtual under `--cfg madsim`).
//! The WAL's `poll_timeout` includes the deadline of its cohort wait (a group commit waiting, at most
//! `storage.ingress_wal_commit_delay_us`, for the producers the previous one answered). tokio's timer
//! has millisecond resolution, so a sub-millisecond deadline fires at the runtime's next tick; under
//! load the wait usually ends sooner, when the cohort is back or an append arrives past the deadline.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Range;
use std::sync::Arc;

use narad_core::checkpoint::{
    read_checkpoint_file, CheckpointFailure, CheckpointInput, CheckpointOpenError,
    CheckpointOutput, Checkpointer, CheckpointerConfig,
};
use narad_core::disk::{Disk, IoCompletion, IoOp, IoRequest};
use narad_core::dispatcher::{DispatcherInput, ReadWal};
use narad_core::wal::driver::open_wal;
use narad_core::wal::{
    AppendError, AppendId, FillFn, IngressWal, OpenError, ReadError, ReadId, RecoveryReport,
    SeqRange, WalConfig, WalFrame, WalInput, WalOutput,
};
use narad_core::{Actor, Instant, IoFault, Seq};
use tokio::sync::{mpsc, oneshot, watch};

use crate::accept_times::AcceptTimes;
use crate::clock::Clock;
use crate::host::{self, HostConfig, Hosted, Turn};
use crate::io::IoExecutor;
use crate::node::dispatch::{DispatchEvent, DispatchPart, WalPort};
use crate::probe::{Invariant, Probe, TraceField};

/// Commands the mailbox holds before callers wait.
pub const MAILBOX_CAPACITY: usize = 4096;
/// Completions each actor's executor may queue for the task.
pub const COMPLETIONS_CAPACITY: usize = 256;
/// Checkpointer I/O rounds [`WalHost::open`] runs before it gives up on the startup sync.
pub const STARTUP_CHECKPOINT_ROUNDS_MAX: usize = 16;

/// The host's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalHostConfig {
    /// The WAL's settings (its directory, segment size, preallocation, ...).
    pub wal: WalConfig,
    /// The checkpointer's settings (by default its file lives in the WAL's directory).
    pub checkpoint: CheckpointerConfig,
    /// Commands the mailbox holds before callers wait.
    pub mailbox_capacity: usize,
    /// Where the host reports events and broken invariants (see [`crate::probe`]).
    pub probe: Probe,
}

impl WalHostConfig {
    /// Production settings around `wal`, with the checkpoint beside the segments.
    pub fn new(wal: WalConfig) -> Self {
        let checkpoint = CheckpointerConfig::new(wal.dir.clone());
        WalHostConfig {
            wal,
            checkpoint,
            mailbox_capacity: MAILBOX_CAPACITY,
            probe: Probe::none(),
        }
    }
}

/// Why an append was not acknowledged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WalError {
    /// The WAL refused or failed it (disk failure or latch, size limits, overload, fill failure).
    #[error(transparent)]
    Append(#[from] AppendError),
    /// The host stopped before answering; the record may or may not be durable.
    #[error("the ingress WAL host has stopped")]
    Stopped,
}

/// Why a read was not answered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WalReadError {
    /// The WAL refused or failed it.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The host stopped before answering.
    #[error("the ingress WAL host has stopped")]
    Stopped,
}

/// Why [`WalHost::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum WalHostOpenError {
    /// Reading the checkpoint file failed.
    #[error("reading the checkpoint: {0}")]
    CheckpointRead(IoFault),
    /// The checkpoint file is malformed.
    #[error(transparent)]
    CheckpointFile(#[from] CheckpointOpenError),
    /// The startup sync (or first creation) of the checkpoint failed.
    #[error("syncing the checkpoint at startup: {op:?} failed: {fault}", op = .0.op, fault = .0.fault)]
    CheckpointSync(CheckpointFailure),
    /// WAL recovery failed (corruption, unreadable segment, bad settings).
    #[error(transparent)]
    Wal(#[from] OpenError),
    /// A blocking open step could not run.
    #[error("open task failed: {0}")]
    Task(String),
}

/// Why [`WalHost::shutdown`] did not confirm a synced checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShutdownError {
    /// The final checkpoint sync failed.
    #[error("final checkpoint sync: {op:?} failed: {fault}", op = .0.op, fault = .0.fault)]
    Checkpoint(CheckpointFailure),
    /// The host had already stopped.
    #[error("the ingress WAL host has stopped")]
    Stopped,
}

/// What the host publishes for the dispatcher and the metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalStatus {
    /// The WAL's open-time repair finished: reads are served and the durable frontier is current.
    /// [`WalHost::open`] returns only once it is set (or the WAL latched).
    pub repaired: bool,
    /// Every record below this is durable (the dispatcher reads up to it).
    pub durable_next_seq: Seq,
    /// The fault the WAL latched on (`narad_ingress_wal_failed` = 1 when set).
    pub latched: Option<IoFault>,
    /// Where dispatch starts after open (the stored checkpoint, or the oldest segment above it).
    pub dispatch_start: Seq,
    /// The latest checkpoint the dispatcher stored.
    pub checkpoint_stored: Seq,
    /// The latest checkpoint written in place (what a process crash keeps): the dispatch backlog is
    /// `durable_next_seq - checkpoint_written`.
    pub checkpoint_written: Seq,
    /// The latest checkpoint known durable.
    pub checkpoint_synced: Seq,
    /// The latest checkpoint store or sync failure, cleared by the next successful sync.
    pub checkpoint_failure: Option<CheckpointFailure>,
}

enum Command {
    Append {
        record: Vec<u8>,
        reply: oneshot::Sender<Result<SeqRange, AppendError>>,
    },
    AppendMany {
        sizes: Vec<usize>,
        fill: FillFn,
        reply: oneshot::Sender<Result<SeqRange, AppendError>>,
    },
    Read {
        from: Seq,
        max_records: usize,
        max_bytes: usize,
        reply: oneshot::Sender<Result<Vec<WalFrame>, ReadError>>,
    },
    StoreCheckpoint {
        seq: Seq,
        reply: Option<StoreReply>,
    },
    Shutdown {
        reply: oneshot::Sender<Result<Seq, CheckpointFailure>>,
    },
    /// The dispatcher joins the task (once recovery is far enough along).
    StartDispatch {
        part: Box<DispatchPart>,
        reply: oneshot::Sender<()>,
    },
    /// The dispatcher stops: nothing more is fed to it.
    StopDispatch {
        reply: oneshot::Sender<()>,
    },
}

/// Who waits for a checkpoint store: answered once the value is written in place, or at the next failure.
type StoreReply = oneshot::Sender<Result<(), CheckpointFailure>>;

/// Called with the number of records each group commit made durable (for the group-commit histogram).
pub type DurableObserver = Arc<dyn Fn(u64) + Send + Sync>;

/// Why [`WalHost::store_checkpoint_written`] did not confirm the store.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The checkpointer's write (or a sync) failed; it retries on its own after its retry delay.
    #[error("checkpoint {op:?} failed: {fault}", op = .0.op, fault = .0.fault)]
    Failed(CheckpointFailure),
    /// The host stopped before answering.
    #[error("the ingress WAL host has stopped")]
    Stopped,
}

/// What comes back to the host: a finished request of one of the two actors, or the dispatcher's
/// answers.
enum Event {
    Wal(IoRequest, IoCompletion),
    Checkpoint(IoCompletion),
    Dispatch(DispatchEvent),
}

impl From<DispatchEvent> for Event {
    fn from(event: DispatchEvent) -> Event {
        Event::Dispatch(event)
    }
}

/// A handle on the running WAL host; clones share it.
#[derive(Clone, Debug)]
pub struct WalHost {
    commands: mpsc::Sender<Command>,
    status: watch::Receiver<WalStatus>,
    accept_times: Arc<AcceptTimes>,
}

impl WalHost {
    /// Opens (recovers) the WAL and its checkpoint on `disk` and starts the actor task; the actors read
    /// time from `clock` (the node's).
    /// Returns the host and what recovery found.
    pub async fn open(
        disk: Arc<dyn Disk>,
        config: WalHostConfig,
        clock: Clock,
    ) -> Result<(WalHost, RecoveryReport), WalHostOpenError> {
        WalHost::open_observed(disk, config, clock, None).await
    }

    /// [`WalHost::open`], calling `observer` with the records of every group commit.
    pub async fn open_observed(
        disk: Arc<dyn Disk>,
        config: WalHostConfig,
        clock: Clock,
        observer: Option<DurableObserver>,
    ) -> Result<(WalHost, RecoveryReport), WalHostOpenError> {
        let checkpointer =
            open_checkpointer(&disk, config.checkpoint.clone(), clock.clone()).await?;
        let recovered = checkpointer.recovered();
        let wal_config = config.wal.clone();
        let recovery_disk = Arc::clone(&disk);
        let opened = run_blocking(move || open_wal(&*recovery_disk, wal_config, recovered))
            .await
            .map_err(WalHostOpenError::Task)??;
        let wal = opened.wal;
        let status = WalStatus {
            repaired: false,
            durable_next_seq: wal.durable_next_seq(),
            latched: wal.latch_fault().cloned(),
            dispatch_start: wal.dispatch_start(),
            checkpoint_stored: checkpointer.stored(),
            checkpoint_written: checkpointer.written(),
            checkpoint_synced: checkpointer.synced().unwrap_or(recovered),
            checkpoint_failure: None,
        };
        let (status_sender, status_receiver) = watch::channel(status);
        let accept_times = Arc::new(AcceptTimes::new(wal.durable_next_seq()));
        config.probe.event(
            "wal",
            format_args!(
                "open: next_seq {} checkpoint {} dispatch_start {} segments {}",
                wal.next_seq(),
                recovered,
                wal.dispatch_start(),
                wal.segment_count()
            ),
        );
        let host_config = HostConfig {
            mailbox_capacity: config.mailbox_capacity.max(1),
            completions_capacity: COMPLETIONS_CAPACITY,
        };
        let times = Arc::clone(&accept_times);
        let audit = WalAudit::new(config.probe.clone());
        let (durable_next, latched) = (wal.durable_next_seq(), wal.latch_fault().is_some());
        let command_sender = host::spawn(host_config, clock.clone(), move |completions| {
            let runner = Runner {
                wal,
                checkpointer,
                wal_io: IoExecutor::new(Arc::clone(&disk), completions.clone(), Event::Wal),
                checkpoint_io: IoExecutor::new(disk, completions, |_, completion| {
                    Event::Checkpoint(completion)
                }),
                clock,
                status: status_sender,
                appends: BTreeMap::new(),
                answers: Vec::new(),
                reads: BTreeMap::new(),
                stores: Vec::new(),
                observer,
                next_id: 0,
                io_in_flight: 0,
                stopping: false,
                shutdown_replies: Vec::new(),
                flushed: None,
                audit,
                accept_times: times,
                appending: Vec::new(),
                durable_next,
                latched,
                dispatch_read: None,
                dispatch_read_id: None,
                dispatch_store: None,
                dispatch_store_waiting: None,
                dispatch_inputs: VecDeque::new(),
            };
            Ingress {
                runner,
                dispatch: None,
                finished: false,
            }
        });
        let mut status = status_receiver;
        // The WAL serves reads and reports its durable frontier once its open-time repair ran; a failed
        // repair latches it instead (the WAL's decision; the host only reports it).
        status
            .wait_for(|status| status.repaired || status.latched.is_some())
            .await
            .map_err(|_| WalHostOpenError::Task("the WAL task ended during open".to_string()))?;
        let host = WalHost {
            commands: command_sender,
            status,
            accept_times,
        };
        Ok((host, opened.report))
    }

    async fn ask<T>(&self, command: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (reply, answer) = oneshot::channel();
        crate::mailbox::send(&self.commands, command(reply))
            .await
            .ok()?;
        answer.await.ok()
    }

    /// Appends one encoded record; returns its sequence number once it is durable.
    pub async fn append(&self, record: Vec<u8>) -> Result<Seq, WalError> {
        let result = self
            .ask(|reply| Command::Append { record, reply })
            .await
            .ok_or(WalError::Stopped)?;
        Ok(result?.first)
    }

    /// Appends encoded records as one batch (consecutive sequence numbers, nothing interleaved);
    /// returns their range once the last is durable.
    pub async fn append_many(&self, records: Vec<Vec<u8>>) -> Result<Range<Seq>, WalError> {
        let sizes = records.iter().map(Vec::len).collect();
        let fill: FillFn = Box::new(move |index: usize, out: &mut [u8]| {
            out.copy_from_slice(&records[index]);
            Ok(())
        });
        self.append_many_with(sizes, fill).await
    }

    /// Appends a batch whose record `i` has `sizes[i]` bytes, written in place by `fill`
    /// (see [`FillFn`]); returns the range once the last record is durable.
    pub async fn append_many_with(
        &self,
        sizes: Vec<usize>,
        fill: FillFn,
    ) -> Result<Range<Seq>, WalError> {
        let result = self
            .ask(|reply| Command::AppendMany { sizes, fill, reply })
            .await
            .ok_or(WalError::Stopped)?;
        let range = result?;
        Ok(range.first..range.next)
    }

    /// Reads durable records from `from` on (at most `max_records`, about `max_bytes` of payload).
    pub async fn read(
        &self,
        from: Seq,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<WalFrame>, WalReadError> {
        let result = self
            .ask(|reply| Command::Read {
                from,
                max_records,
                max_bytes,
                reply,
            })
            .await
            .ok_or(WalReadError::Stopped)?;
        Ok(result?)
    }

    /// Stores the dispatcher's checkpoint (never backwards): written in place at once, synced within
    /// 250 ms; compaction follows the synced value.
    pub async fn store_checkpoint(&self, seq: Seq) -> Result<(), WalError> {
        self.commands
            .send(Command::StoreCheckpoint { seq, reply: None })
            .await
            .map_err(|_| WalError::Stopped)
    }

    /// Stores the checkpoint like [`WalHost::store_checkpoint`] and answers once its in-place write
    /// completed (a process crash keeps it from then on), or with the checkpointer's next failure.
    pub async fn store_checkpoint_written(&self, seq: Seq) -> Result<(), StoreError> {
        let result = self
            .ask(|reply| Command::StoreCheckpoint {
                seq,
                reply: Some(reply),
            })
            .await
            .ok_or(StoreError::Stopped)?;
        result.map_err(StoreError::Failed)
    }

    /// When each record accepted by this host earned its 202 (for `narad_accept_to_visible_seconds`).
    pub fn accept_times(&self) -> &Arc<AcceptTimes> {
        &self.accept_times
    }

    /// The current status.
    pub fn status(&self) -> WalStatus {
        self.status.borrow().clone()
    }

    /// A receiver that wakes when the repair finishes, the durable frontier moves, the WAL latches, or
    /// the synced checkpoint or its failure changes. The stored and written checkpoint values change
    /// with every dispatched batch and wake nobody: read them with `borrow` (or [`WalHost::status`]).
    pub fn subscribe(&self) -> watch::Receiver<WalStatus> {
        self.status.clone()
    }

    /// Every record below this is durable.
    pub fn durable_next_seq(&self) -> Seq {
        self.status.borrow().durable_next_seq
    }

    /// Records a restart would replay: the durable end minus the checkpoint written in place
    /// (`narad_ingress_dispatch_backlog_records`).
    pub fn backlog_records(&self) -> u64 {
        let status = self.status.borrow();
        status
            .durable_next_seq
            .0
            .saturating_sub(status.checkpoint_written.0)
    }

    /// True once a disk failure latched the WAL (`narad_ingress_wal_failed`).
    pub fn is_latched(&self) -> bool {
        self.status.borrow().latched.is_some()
    }

    /// Hands the dispatcher to the host's task; returns once it runs there.
    pub(crate) async fn start_dispatch(&self, part: Box<DispatchPart>) {
        // A host that stopped has no dispatcher to run: nothing to wait for.
        let _ = self
            .ask(|reply| Command::StartDispatch { part, reply })
            .await;
    }

    /// Stops the dispatcher in the host's task; returns once nothing more is fed to it.
    pub(crate) async fn stop_dispatch(&self) {
        let _ = self.ask(|reply| Command::StopDispatch { reply }).await;
    }

    /// Stops the host: no new commands, appends in flight finish, the checkpoint is synced now.
    /// Returns the durable checkpoint.
    pub async fn shutdown(&self) -> Result<Seq, ShutdownError> {
        let result = self
            .ask(|reply| Command::Shutdown { reply })
            .await
            .ok_or(ShutdownError::Stopped)?;
        result.map_err(ShutdownError::Checkpoint)
    }
}

/// Runs a blocking closure off the async threads (inline under madsim).
#[cfg_attr(madsim, allow(deprecated))]
async fn run_blocking<T: Send + 'static>(
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(job)
        .await
        .map_err(|error| error.to_string())
}

/// Opens the checkpointer and runs its startup I/O (first creation, or rewrite and sync of the
/// recovered value) until it publishes the synced value.
async fn open_checkpointer(
    disk: &Arc<dyn Disk>,
    config: CheckpointerConfig,
    clock: Clock,
) -> Result<Checkpointer, WalHostOpenError> {
    let dir = config.dir.clone();
    let read_disk = Arc::clone(disk);
    let bytes = run_blocking(move || read_checkpoint_file(&*read_disk, &dir))
        .await
        .map_err(WalHostOpenError::Task)?
        .map_err(WalHostOpenError::CheckpointRead)?;
    let mut checkpointer = Checkpointer::open(config, clock.now(), bytes.as_deref())?;
    for _ in 0..STARTUP_CHECKPOINT_ROUNDS_MAX {
        let mut requests = Vec::new();
        while let Some(output) = checkpointer.poll_output() {
            match output {
                CheckpointOutput::Io(request) => requests.push(request),
                CheckpointOutput::Synced(_) => return Ok(checkpointer),
                CheckpointOutput::Failed(failure) => {
                    return Err(WalHostOpenError::CheckpointSync(failure))
                }
                CheckpointOutput::Flushed(_) => {}
            }
        }
        for request in requests {
            let (_, completion) = crate::io::run_request(Arc::clone(disk), request).await;
            checkpointer.handle(clock.now(), CheckpointInput::Io(completion));
        }
    }
    Err(WalHostOpenError::Task(
        "the checkpoint's startup sync did not finish".to_string(),
    ))
}

/// Who waits for an append's outcome.
type AppendReply = oneshot::Sender<Result<SeqRange, AppendError>>;

/// The actor task's state.
struct Runner {
    wal: IngressWal,
    checkpointer: Checkpointer,
    wal_io: IoExecutor<Event>,
    checkpoint_io: IoExecutor<Event>,
    clock: Clock,
    status: watch::Sender<WalStatus>,
    appends: BTreeMap<AppendId, AppendReply>,
    /// Append outcomes routed but not yet sent (sent at the end of each drain).
    answers: Vec<(AppendReply, Result<SeqRange, AppendError>)>,
    reads: BTreeMap<ReadId, oneshot::Sender<Result<Vec<WalFrame>, ReadError>>>,
    /// Checkpoint stores waiting for their write: `(value, caller)`.
    stores: Vec<(Seq, StoreReply)>,
    observer: Option<DurableObserver>,
    next_id: u64,
    /// Requests submitted to either executor whose completion has not been handled yet.
    io_in_flight: usize,
    /// No new command is taken once set.
    stopping: bool,
    shutdown_replies: Vec<oneshot::Sender<Result<Seq, CheckpointFailure>>>,
    /// The final flush's outcome, once it came.
    flushed: Option<Result<Seq, CheckpointFailure>>,
    audit: WalAudit,
    /// Each group commit's answer instant, kept until its records are below the written checkpoint.
    accept_times: Arc<AcceptTimes>,
    /// The appends of the commands being handed over, fed to the WAL as one batch.
    appending: Vec<WalInput>,
    /// The WAL's durable frontier and latch, as last routed (the dispatcher follows them).
    durable_next: Seq,
    latched: bool,
    /// The dispatcher's read, to be fed to the WAL at the start of the next drain.
    dispatch_read: Option<ReadWal>,
    /// The WAL's id of the dispatcher's read in flight.
    dispatch_read_id: Option<ReadId>,
    /// The dispatcher's checkpoint store, to be fed to the checkpointer at the start of the next drain.
    dispatch_store: Option<Seq>,
    /// The dispatcher's store waiting for its in-place write.
    dispatch_store_waiting: Option<Seq>,
    /// Answers for the dispatcher, fed by the ingress host after each drain.
    dispatch_inputs: VecDeque<DispatcherInput>,
}

/// The WAL's invariants as the host sees them (see [`crate::probe`]): what its requests did to the
/// disk against what it acknowledges and deletes. Kept only while a probe watches.
struct WalAudit {
    probe: Probe,
    /// Segment files with a completed write that no completed fdatasync has covered since.
    unsynced: BTreeSet<String>,
}

impl WalAudit {
    fn new(probe: Probe) -> WalAudit {
        WalAudit {
            probe,
            unsynced: BTreeSet::new(),
        }
    }

    /// Notes what the ops of a finished request did, up to the first failed one.
    fn on_completed(&mut self, request: &IoRequest, completion: &IoCompletion) {
        if !self.probe.is_watched() {
            return;
        }
        let done = match &completion.result {
            Ok(_) => request.ops.len(),
            Err((index, _)) => *index,
        };
        for op in &request.ops[..done] {
            match op {
                IoOp::WriteAt { path, .. }
                | IoOp::WriteZeros { path, .. }
                | IoOp::SetLen { path, .. } => {
                    self.unsynced.insert(path.clone());
                }
                IoOp::SyncData { path } | IoOp::Remove { path } => {
                    self.unsynced.remove(path);
                }
                IoOp::Rename { from, to } => {
                    if self.unsynced.remove(from) {
                        self.unsynced.insert(to.clone());
                    } else {
                        self.unsynced.remove(to);
                    }
                }
                IoOp::Create { .. }
                | IoOp::CreateDirAll { .. }
                | IoOp::ReadAt { .. }
                | IoOp::Len { .. }
                | IoOp::SyncDir { .. }
                | IoOp::List { .. } => {}
            }
        }
    }

    /// An acknowledgement is going out: every segment write must be covered by a completed sync.
    fn on_ack(&self, range: SeqRange) {
        if range.is_empty() {
            return;
        }
        if let Some(path) = self.unsynced.iter().find(|path| path.ends_with(".wal")) {
            self.probe.violation(
                Invariant::AckBeforeSync,
                format_args!(
                    "records {}..{} acknowledged while {path} holds a write no fdatasync covered",
                    range.first, range.next
                ),
            );
        }
    }

    /// The WAL emitted `request`: a segment deletion must trail the checkpoint an fdatasync made durable.
    fn on_request(&self, request: &IoRequest, oldest_kept: Seq, synced: Option<Seq>) {
        if !self.probe.is_watched() {
            return;
        }
        let removes_segment = request.ops.iter().any(|op| match op {
            IoOp::Remove { path } => path.ends_with(".wal"),
            _ => false,
        });
        if removes_segment && synced.is_none_or(|synced| oldest_kept > synced) {
            self.probe.violation(
                Invariant::CompactionAheadOfSyncedCheckpoint,
                format_args!(
                    "segments below {oldest_kept} deleted while the synced checkpoint is {synced:?}"
                ),
            );
        }
        if removes_segment {
            self.probe.event(
                "wal",
                format_args!("compact: oldest kept {oldest_kept}, synced checkpoint {synced:?}"),
            );
        }
    }
}

impl Runner {
    fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Stages an append for the batch [`Runner::feed_appends`] hands the WAL.
    fn stage_append(&mut self, command: Command) {
        match command {
            Command::Append { record, reply } => {
                let id = AppendId(self.next_id());
                self.appends.insert(id, reply);
                self.appending.push(WalInput::Append { id, record });
            }
            Command::AppendMany { sizes, fill, reply } => {
                let id = AppendId(self.next_id());
                self.appends.insert(id, reply);
                self.appending
                    .push(WalInput::AppendMany { id, sizes, fill });
            }
            other => self.on_command(other),
        }
    }

    /// Feeds the staged appends to the WAL as one input: one group commit for all of them.
    fn feed_appends(&mut self) {
        match self.appending.len() {
            0 => {}
            1 => {
                let input = self.appending.pop().expect("one");
                self.wal.handle(self.clock.now(), input);
            }
            _ => {
                let inputs = std::mem::take(&mut self.appending);
                self.wal.handle(self.clock.now(), WalInput::Batch(inputs));
            }
        }
    }

    fn on_command(&mut self, command: Command) {
        let now = self.clock.now();
        match command {
            Command::Append { .. } | Command::AppendMany { .. } => {
                self.stage_append(command);
                self.feed_appends();
            }
            Command::StartDispatch { .. } | Command::StopDispatch { .. } => {
                unreachable!("the ingress host handles the dispatcher's commands")
            }
            Command::Read {
                from,
                max_records,
                max_bytes,
                reply,
            } => {
                let id = ReadId(self.next_id());
                self.reads.insert(id, reply);
                self.wal.handle(
                    now,
                    WalInput::Read {
                        id,
                        from,
                        max_records,
                        max_bytes,
                    },
                );
            }
            Command::StoreCheckpoint { seq, reply } => {
                self.store_checkpoint_now(now, seq);
                if let Some(reply) = reply {
                    self.stores.push((seq, reply));
                }
            }
            Command::Shutdown { reply } => {
                self.shutdown_replies.push(reply);
                self.begin_stop();
            }
        }
    }

    fn store_checkpoint_now(&mut self, now: Instant, seq: Seq) {
        self.checkpointer.handle(now, CheckpointInput::Store(seq));
        let stored = self.checkpointer.stored();
        // Silent (see `WalHost::subscribe`): one store per dispatched batch would wake every
        // subscriber for a value none of them follows.
        self.status.send_if_modified(|status| {
            status.checkpoint_stored = stored;
            false
        });
    }

    /// Ends the host once nothing is outstanding: no caller waits and no request of either actor
    /// runs, so a WAL reopened on the same disk right after never races an old request.
    fn try_finish(&mut self) -> bool {
        if !self.stopping
            || !self.appends.is_empty()
            || !self.reads.is_empty()
            || self.io_in_flight > 0
        {
            return false;
        }
        let Some(flushed) = self.flushed.clone() else {
            return false;
        };
        for reply in self.shutdown_replies.drain(..) {
            // A caller that gave up waiting does not need the answer.
            let _ = reply.send(flushed.clone());
        }
        true
    }

    fn begin_stop(&mut self) {
        if !self.stopping {
            self.stopping = true;
            self.checkpointer
                .handle(self.clock.now(), CheckpointInput::Flush);
        }
    }

    fn on_io(&mut self, event: Event) {
        self.io_in_flight -= 1;
        let now = self.clock.now();
        match event {
            Event::Dispatch(_) => unreachable!("the ingress host hands these to the dispatcher"),
            Event::Wal(request, completion) => {
                self.audit.on_completed(&request, &completion);
                self.wal.handle(
                    now,
                    WalInput::IoDone {
                        request,
                        completion,
                    },
                )
            }
            Event::Checkpoint(completion) => self
                .checkpointer
                .handle(now, CheckpointInput::Io(completion)),
        }
    }

    /// Feeds each actor its tick once its own timeout has passed (by the clock, not the timer).
    fn on_tick(&mut self) {
        let now = self.clock.now();
        if self.wal.poll_timeout().is_some_and(|at| at <= now) {
            self.wal.handle(now, WalInput::Tick);
        }
        if self.checkpointer.poll_timeout().is_some_and(|at| at <= now) {
            self.checkpointer.handle(now, CheckpointInput::Tick);
        }
    }

    /// Routes both actors' outputs until neither has any (a synced checkpoint feeds the WAL), then
    /// answers the appends, so a caller that is answered already sees the status that answer implies.
    fn drain(&mut self) {
        let now = self.clock.now();
        if let Some(read) = self.dispatch_read.take() {
            let id = ReadId(self.next_id());
            self.dispatch_read_id = Some(id);
            let ReadWal {
                from,
                max_records,
                max_bytes,
            } = read;
            self.wal.handle(
                now,
                WalInput::Read {
                    id,
                    from,
                    max_records,
                    max_bytes,
                },
            );
        }
        if let Some(seq) = self.dispatch_store.take() {
            self.store_checkpoint_now(now, seq);
            self.dispatch_store_waiting = Some(seq);
        }
        self.route_all();
        for (reply, result) in self.answers.drain(..) {
            // A caller that stopped waiting still had its record handled truthfully.
            let _ = reply.send(result);
        }
        let written = self.checkpointer.written();
        if self.status.borrow().checkpoint_written != written {
            // Silent, like the stored value (see `WalHost::subscribe`).
            self.status.send_if_modified(|status| {
                status.checkpoint_written = written;
                false
            });
            // Everything below a written checkpoint is visible: its accept instants are not needed.
            self.accept_times.forget_below(written);
        }
        if let Some(seq) = self.dispatch_store_waiting {
            if seq <= written {
                self.dispatch_store_waiting = None;
                self.dispatch_inputs
                    .push_back(DispatcherInput::CheckpointStored { seq });
            }
        }
        // Most drains answer no store (one waits for the write in flight): look before rebuilding.
        if self.stores.iter().any(|(seq, _)| *seq <= written) {
            let (done, waiting) = std::mem::take(&mut self.stores)
                .into_iter()
                .partition(|(seq, _)| *seq <= written);
            self.stores = waiting;
            for (_, reply) in done {
                let _ = reply.send(Ok(()));
            }
        }
    }

    fn route_all(&mut self) {
        loop {
            let mut idle = true;
            while let Some(output) = self.wal.poll_output() {
                idle = false;
                self.route_wal(output);
            }
            while let Some(output) = self.checkpointer.poll_output() {
                idle = false;
                self.route_checkpoint(output);
            }
            if idle {
                return;
            }
        }
    }

    fn route_wal(&mut self, output: WalOutput) {
        match output {
            WalOutput::Io(request) => {
                self.audit.on_request(
                    &request,
                    self.wal.oldest_segment_first_seq(),
                    self.checkpointer.synced(),
                );
                self.io_in_flight += 1;
                self.wal_io.submit(request);
            }
            WalOutput::AppendDone { id, result } => {
                if let Ok(range) = &result {
                    self.audit.on_ack(*range);
                }
                if let Some(reply) = self.appends.remove(&id) {
                    self.answers.push((reply, result));
                }
            }
            WalOutput::Durable { next_seq } => {
                let (repaired, before) = {
                    let status = self.status.borrow();
                    (status.repaired, status.durable_next_seq)
                };
                if repaired && next_seq > before {
                    self.audit.probe.event_fields(
                        "wal",
                        &[
                            TraceField::Str("group commit"),
                            TraceField::U64(before.0),
                            TraceField::U64(next_seq.0),
                        ],
                        format_args!("group commit {before}..{next_seq}"),
                    );
                    // The flush's callers are answered at the end of this drain: their 202 instant.
                    self.accept_times.committed(next_seq, self.clock.now());
                }
                if let Some(observer) = &self.observer {
                    // The open repair's frontier is recovery, not a group commit.
                    if repaired && next_seq > before {
                        observer(next_seq.0 - before.0);
                    }
                }
                self.status.send_modify(|status| {
                    status.repaired = true;
                    status.durable_next_seq = next_seq;
                });
                self.durable_next = next_seq;
            }
            WalOutput::ReadDone { id, result } => {
                if self.dispatch_read_id == Some(id) {
                    self.dispatch_read_id = None;
                    let input = match result {
                        Ok(frames) => DispatcherInput::WalFrames {
                            frames: frames
                                .into_iter()
                                .map(|frame| (frame.seq, frame.payload))
                                .collect(),
                        },
                        Err(ReadError::Io(fault)) => DispatcherInput::WalReadFailed { fault },
                        Err(error) => DispatcherInput::WalReadFailed {
                            fault: IoFault::Other(error.to_string()),
                        },
                    };
                    self.dispatch_inputs.push_back(input);
                } else if let Some(reply) = self.reads.remove(&id) {
                    let _ = reply.send(result);
                }
            }
            WalOutput::Latched { fault } => {
                tracing::error!(%fault, "ingress WAL latched: every append is refused until restart");
                self.audit
                    .probe
                    .event("wal", format_args!("latched: {fault}"));
                self.status
                    .send_modify(|status| status.latched = Some(fault));
                self.latched = true;
            }
            WalOutput::Warning(warning) => {
                tracing::warn!(?warning, "{}", warning.message());
            }
        }
    }

    fn route_checkpoint(&mut self, output: CheckpointOutput) {
        match output {
            CheckpointOutput::Io(request) => {
                self.io_in_flight += 1;
                self.checkpoint_io.submit(request);
            }
            CheckpointOutput::Synced(seq) => {
                self.status.send_modify(|status| {
                    status.checkpoint_synced = seq;
                    status.checkpoint_failure = None;
                });
                self.wal
                    .handle(self.clock.now(), WalInput::CheckpointSynced { seq });
            }
            CheckpointOutput::Failed(failure) => {
                tracing::warn!(op = ?failure.op, fault = %failure.fault, "ingress dispatch checkpoint store failed");
                for (_, reply) in self.stores.drain(..) {
                    let _ = reply.send(Err(failure.clone()));
                }
                if let Some(seq) = self.dispatch_store_waiting.take() {
                    let fault = failure.fault.clone();
                    self.dispatch_inputs
                        .push_back(DispatcherInput::CheckpointStoreFailed { seq, fault });
                }
                self.status
                    .send_modify(|status| status.checkpoint_failure = Some(failure));
            }
            CheckpointOutput::Flushed(result) => {
                if self.stopping {
                    self.flushed = Some(result);
                }
            }
        }
    }
}

impl WalPort for Runner {
    fn read(&mut self, read: ReadWal) {
        assert!(
            self.dispatch_read.is_none() && self.dispatch_read_id.is_none(),
            "at most one dispatcher read is outstanding"
        );
        self.dispatch_read = Some(read);
    }

    fn store_checkpoint(&mut self, seq: Seq) {
        assert!(
            self.dispatch_store.is_none() && self.dispatch_store_waiting.is_none(),
            "at most one dispatcher store is outstanding"
        );
        self.dispatch_store = Some(seq);
    }

    fn accept_times(&self) -> &AcceptTimes {
        &self.accept_times
    }
}

/// The ingress host: the WAL, the checkpointer and (once started) the dispatcher in one task.
///
/// After every input the WAL's and the checkpointer's outputs are routed first (a flush's I/O leaves,
/// its callers are answered), then the dispatcher is fed what the WAL answered it (`Durable`, its
/// read, its checkpoint store), and the WAL again what the dispatcher asked, until neither has more.
struct Ingress {
    runner: Runner,
    dispatch: Option<Box<DispatchPart>>,
    finished: bool,
}

impl Ingress {
    /// Routes both ways until quiet; see [`Ingress`].
    fn settle(&mut self, turn: &mut Turn<'_, Event>) {
        self.runner.drain();
        match self.dispatch.as_deref_mut() {
            None => self.runner.dispatch_inputs.clear(),
            Some(dispatch) => {
                loop {
                    let (durable_next, latched) = (self.runner.durable_next, self.runner.latched);
                    let fed = dispatch.on_wal(turn, &mut self.runner, durable_next, latched);
                    match self.runner.dispatch_inputs.pop_front() {
                        Some(input) => dispatch.feed(turn, &mut self.runner, input),
                        None if !fed => break,
                        None => {}
                    }
                    self.runner.drain();
                }
                dispatch.publish();
            }
        }
        self.finished = self.runner.try_finish();
    }
}

impl Hosted for Ingress {
    type Command = Command;
    type Completion = Event;

    fn on_start(&mut self, turn: &mut Turn<'_, Event>) {
        self.settle(turn);
    }

    fn on_commands(&mut self, turn: &mut Turn<'_, Event>, commands: &mut VecDeque<Command>) {
        for command in commands.drain(..) {
            if self.runner.stopping {
                // No command is taken once stopping; its caller sees the host stopped.
                continue;
            }
            match command {
                Command::Append { .. } | Command::AppendMany { .. } => {
                    self.runner.stage_append(command);
                    continue;
                }
                Command::StartDispatch { mut part, reply } => {
                    self.runner.feed_appends();
                    self.settle(turn);
                    let status = self.runner.status.borrow().clone();
                    part.start(turn, &mut self.runner, &status);
                    self.dispatch = Some(part);
                    let _ = reply.send(());
                }
                Command::StopDispatch { reply } => {
                    if let Some(dispatch) = self.dispatch.as_deref_mut() {
                        dispatch.stop();
                    }
                    let _ = reply.send(());
                }
                other => {
                    self.runner.feed_appends();
                    self.settle(turn);
                    self.runner.on_command(other);
                }
            }
        }
        self.runner.feed_appends();
        self.settle(turn);
    }

    fn on_mailbox_closed(&mut self, turn: &mut Turn<'_, Event>) {
        self.runner.begin_stop();
        self.settle(turn);
    }

    fn on_completion(&mut self, turn: &mut Turn<'_, Event>, event: Event) {
        match event {
            Event::Dispatch(event) => {
                if let Some(dispatch) = self.dispatch.as_deref_mut() {
                    dispatch.on_event(turn, &mut self.runner, event);
                }
            }
            io => self.runner.on_io(io),
        }
        self.settle(turn);
    }

    fn on_timeout(&mut self, turn: &mut Turn<'_, Event>) {
        self.runner.on_tick();
        if let Some(dispatch) = self.dispatch.as_deref_mut() {
            dispatch.on_timeout(turn, &mut self.runner);
        }
        self.settle(turn);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let wal = earliest(
            self.runner.wal.poll_timeout(),
            self.runner.checkpointer.poll_timeout(),
        );
        earliest(
            wal,
            self.dispatch
                .as_deref()
                .and_then(DispatchPart::poll_timeout),
        )
    }

    fn finished(&self) -> bool {
        self.finished
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use narad_core::checkpoint::CheckpointOp;
    use narad_core::disk::DiskLayer;

    use super::*;
    use crate::failpoints::{Counter, Failpoints, FaultKind, Rule};
    use crate::fs_disk::FsDisk;

    const DIR: &str = "wal";

    /// FsDisk that counts `sync_data` calls on segments.
    struct CountingDisk {
        inner: FsDisk,
        segment_syncs: AtomicU64,
    }

    impl DiskLayer for CountingDisk {
        fn inner(&self) -> &dyn Disk {
            &self.inner
        }
        fn sync_data(&self, path: &str) -> Result<(), IoFault> {
            if path.ends_with(".wal") {
                self.segment_syncs.fetch_add(1, Ordering::Relaxed);
            }
            self.inner.sync_data(path)
        }
    }

    /// An FsDisk in `dir` whose files under `DIR/<prefix>` fail with `fault` after `after` of `counter`.
    fn failing_disk(
        dir: &tempfile::TempDir,
        prefix: &str,
        fault: FaultKind,
        counter: Counter,
        after: u64,
    ) -> Arc<dyn Disk> {
        let failpoints = Failpoints::new(vec![Rule {
            path_prefix: format!("{DIR}/{prefix}"),
            fault,
            counter,
            after,
        }]);
        Arc::new(FsDisk::with_failpoints(dir.path(), failpoints).unwrap())
    }

    fn config() -> WalHostConfig {
        WalHostConfig::new(WalConfig {
            dir: DIR.to_string(),
            ..WalConfig::default()
        })
    }

    fn fs_disk(root: &std::path::Path) -> Arc<dyn Disk> {
        Arc::new(FsDisk::new(root).expect("disk"))
    }

    fn record(index: u64) -> Vec<u8> {
        format!("record {index:05}").into_bytes()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_take_dense_seqs_and_are_durable_when_answered() {
        let dir = tempfile::tempdir().unwrap();
        let (host, report) = WalHost::open(fs_disk(dir.path()), config(), Clock::start())
            .await
            .unwrap();
        assert_eq!(report.next_seq, Seq(0));
        for index in 0..3 {
            assert_eq!(host.append(record(index)).await, Ok(Seq(index)));
        }
        assert_eq!(host.durable_next_seq(), Seq(3));
        assert_eq!(
            host.append_many(vec![record(3), record(4), record(5)])
                .await,
            Ok(Seq(3)..Seq(6))
        );
        assert_eq!(host.durable_next_seq(), Seq(6));
        let frames = host.read(Seq(0), 100, 1 << 20).await.unwrap();
        let payloads: Vec<Vec<u8>> = frames.iter().map(|frame| frame.payload.clone()).collect();
        assert_eq!(payloads, (0..6).map(record).collect::<Vec<_>>());
        assert_eq!(host.shutdown().await, Ok(Seq(0)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_appends_share_fsyncs() {
        let dir = tempfile::tempdir().unwrap();
        let disk = Arc::new(CountingDisk {
            inner: FsDisk::new(dir.path()).unwrap(),
            segment_syncs: AtomicU64::new(0),
        });
        let (host, _) = WalHost::open(disk.clone(), config(), Clock::start())
            .await
            .unwrap();
        let before = disk.segment_syncs.load(Ordering::Relaxed);
        let appenders = 64u64;
        let per_appender = 20u64;
        let mut tasks = Vec::new();
        for appender in 0..appenders {
            let host = host.clone();
            tasks.push(tokio::spawn(async move {
                let mut seqs = Vec::new();
                for index in 0..per_appender {
                    let seq = host.append(record(appender * 1000 + index)).await.unwrap();
                    seqs.push(seq);
                }
                seqs
            }));
        }
        let mut seqs = Vec::new();
        for task in tasks {
            seqs.extend(task.await.unwrap());
        }
        seqs.sort();
        let records = appenders * per_appender;
        assert_eq!(seqs, (0..records).map(Seq).collect::<Vec<_>>());
        let syncs = disk.segment_syncs.load(Ordering::Relaxed) - before;
        assert!(
            syncs * 4 <= records,
            "{records} records took {syncs} fsyncs: group commit must share them"
        );
        host.shutdown().await.unwrap();
    }

    /// FsDisk that notes the node clock's reading when each segment `sync_data` returns.
    struct SyncTimesDisk {
        inner: FsDisk,
        clock: Clock,
        synced_at: std::sync::Mutex<Vec<Instant>>,
    }

    impl DiskLayer for SyncTimesDisk {
        fn inner(&self) -> &dyn Disk {
            &self.inner
        }
        fn sync_data(&self, path: &str) -> Result<(), IoFault> {
            let result = self.inner.sync_data(path);
            if path.ends_with(".wal") {
                self.synced_at.lock().unwrap().push(self.clock.now());
            }
            result
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_s_accept_instant_is_its_answer_after_the_fsync_and_recovered_ones_have_none()
    {
        let dir = tempfile::tempdir().unwrap();
        let clock = Clock::start();
        {
            let (host, _) = WalHost::open(fs_disk(dir.path()), config(), clock.clone())
                .await
                .unwrap();
            host.append(record(0)).await.unwrap();
            host.shutdown().await.unwrap();
        }
        let disk = Arc::new(SyncTimesDisk {
            inner: FsDisk::new(dir.path()).unwrap(),
            clock: clock.clone(),
            synced_at: std::sync::Mutex::new(Vec::new()),
        });
        let (host, _) = WalHost::open(disk.clone(), config(), clock.clone())
            .await
            .unwrap();
        let times = Arc::clone(host.accept_times());
        assert_eq!(times.accepted_at(Seq(0)), None, "recovered: no 202 here");
        for index in 1..4 {
            let asked = clock.now();
            let seq = host.append(record(index)).await.unwrap();
            let answered = clock.now();
            let accepted = times
                .accepted_at(seq)
                .expect("an accepted record has an instant");
            let last_sync = *disk.synced_at.lock().unwrap().last().unwrap();
            assert!(
                asked <= last_sync && last_sync <= accepted && accepted <= answered,
                "record {seq}: asked {asked}, fsynced {last_sync}, accepted {accepted}, answered {answered}"
            );
        }
        assert_eq!(times.len(), 3);
        host.store_checkpoint_written(Seq(3)).await.unwrap();
        assert_eq!(
            times.len(),
            1,
            "group commits below the written checkpoint are forgotten"
        );
        assert!(times.accepted_at(Seq(3)).is_some());
        host.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_restart_recovers_every_acknowledged_record() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (host, _) = WalHost::open(fs_disk(dir.path()), config(), Clock::start())
                .await
                .unwrap();
            for index in 0..10 {
                host.append(record(index)).await.unwrap();
            }
            host.append_many(vec![record(10), record(11)])
                .await
                .unwrap();
            host.shutdown().await.unwrap();
        }
        let (host, report) = WalHost::open(fs_disk(dir.path()), config(), Clock::start())
            .await
            .unwrap();
        assert_eq!(report.next_seq, Seq(12));
        assert_eq!(host.durable_next_seq(), Seq(12));
        let frames = host.read(Seq(0), 100, 1 << 20).await.unwrap();
        let got: Vec<(Seq, Vec<u8>)> = frames
            .into_iter()
            .map(|frame| (frame.seq, frame.payload))
            .collect();
        let want: Vec<(Seq, Vec<u8>)> = (0..12).map(|index| (Seq(index), record(index))).collect();
        assert_eq!(got, want);
        assert_eq!(host.append(record(12)).await, Ok(Seq(12)));
        host.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_checkpoint_round_trips_through_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (host, _) = WalHost::open(fs_disk(dir.path()), config(), Clock::start())
                .await
                .unwrap();
            for index in 0..8 {
                host.append(record(index)).await.unwrap();
            }
            host.store_checkpoint(Seq(5)).await.unwrap();
            assert_eq!(host.shutdown().await, Ok(Seq(5)));
        }
        let bytes = std::fs::read(dir.path().join(DIR).join("checkpoint")).unwrap();
        assert_eq!(bytes, 5u64.to_be_bytes());
        let (host, _) = WalHost::open(fs_disk(dir.path()), config(), Clock::start())
            .await
            .unwrap();
        let status = host.status();
        assert_eq!(status.checkpoint_synced, Seq(5));
        assert_eq!(status.checkpoint_stored, Seq(5));
        assert_eq!(status.dispatch_start, Seq(5));
        host.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_synced_checkpoint_compacts_segments_behind_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config();
        config.wal.segment_bytes_max = 64 * 1024;
        config.wal.record_bytes_max = 1024;
        config.wal.rotate_dispatched_active_after_bytes = 1024;
        let (host, _) = WalHost::open(fs_disk(dir.path()), config, Clock::start())
            .await
            .unwrap();
        let payload = vec![7u8; 1000];
        for _ in 0..300 {
            host.append(payload.clone()).await.unwrap();
        }
        let segments = |path: &std::path::Path| {
            std::fs::read_dir(path.join(DIR))
                .unwrap()
                .filter(|entry| {
                    entry
                        .as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .ends_with(".wal")
                })
                .count()
        };
        assert!(
            segments(dir.path()) >= 4,
            "300 KB of records in 64 KiB segments"
        );
        let mut status = host.subscribe();
        host.store_checkpoint(Seq(300)).await.unwrap();
        // Compaction follows only the synced value, which comes within the 250 ms flush delay.
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            status.wait_for(|status| status.checkpoint_synced == Seq(300)),
        )
        .await
        .expect("synced within the delay")
        .unwrap();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while segments(dir.path()) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(
            segments(dir.path()),
            1,
            "everything dispatched is reclaimed"
        );
        host.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_fsync_latches_and_every_later_append_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        // Segment names start with a digit: the checkpoint file is spared.
        let disk = failing_disk(&dir, "0", FaultKind::Eio, Counter::Syncs, 3);
        let (host, _) = WalHost::open(disk, config(), Clock::start()).await.unwrap();
        let mut acked = 0u64;
        let mut failure = None;
        for index in 0..10 {
            match host.append(record(index)).await {
                Ok(seq) => {
                    assert_eq!(seq, Seq(acked));
                    acked += 1;
                }
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }
        let error = WalError::Append(AppendError::Disk(IoFault::Eio));
        assert_eq!(failure, Some(error.clone()));
        assert!(host.is_latched());
        assert_eq!(host.status().latched, Some(IoFault::Eio));
        assert_eq!(host.append(record(99)).await, Err(error.clone()));
        assert_eq!(host.append_many(vec![record(100)]).await, Err(error));
        host.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_checkpoint_that_cannot_be_created_fails_the_open() {
        let dir = tempfile::tempdir().unwrap();
        let disk = failing_disk(&dir, "checkpoint", FaultKind::NoSpace, Counter::Bytes, 0);
        let error = WalHost::open(disk, config(), Clock::start())
            .await
            .expect_err("no space");
        assert!(
            matches!(
                &error,
                WalHostOpenError::CheckpointSync(CheckpointFailure {
                    op: CheckpointOp::Create,
                    fault: IoFault::NoSpace
                })
            ),
            "{error}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_confirmed_store_is_answered_once_written_and_sets_the_backlog() {
        let dir = tempfile::tempdir().unwrap();
        let (host, _) = WalHost::open(fs_disk(dir.path()), config(), Clock::start())
            .await
            .unwrap();
        for index in 0..5 {
            host.append(record(index)).await.unwrap();
        }
        assert_eq!(host.backlog_records(), 5);
        assert_eq!(host.store_checkpoint_written(Seq(3)).await, Ok(()));
        assert_eq!(host.status().checkpoint_written, Seq(3));
        assert_eq!(host.backlog_records(), 2);
        host.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_confirmed_store_reports_the_checkpointer_s_failure() {
        let dir = tempfile::tempdir().unwrap();
        // The creation at open writes 8 bytes; the first store's in-place write is the next.
        let disk = failing_disk(&dir, "checkpoint", FaultKind::Eio, Counter::Bytes, 8);
        let (host, _) = WalHost::open(disk, config(), Clock::start()).await.unwrap();
        host.append(record(0)).await.unwrap();
        let failure = CheckpointFailure {
            op: CheckpointOp::Write,
            fault: IoFault::Eio,
        };
        assert_eq!(
            host.store_checkpoint_written(Seq(1)).await,
            Err(StoreError::Failed(failure))
        );
        assert_eq!(host.status().checkpoint_written, Seq(0));
        assert_eq!(host.backlog_records(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn handles_fail_with_stopped_after_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let (host, _) = WalHost::open(fs_disk(dir.path()), config(), Clock::start())
            .await
            .unwrap();
        host.shutdown().await.unwrap();
        // A command sent now is never taken: it is dropped with the mailbox when the task ends.
        assert_eq!(host.append(record(0)).await, Err(WalError::Stopped));
        assert_eq!(host.shutdown().await, Err(ShutdownError::Stopped));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_simdisk_every_acknowledged_record_survives_a_power_loss() {
        use narad_core::disk::sim::SimDisk;
        let disk = SimDisk::new(7);
        let (host, _) = WalHost::open(Arc::new(disk.clone()), config(), Clock::start())
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for appender in 0..8u64 {
            let host = host.clone();
            tasks.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                for index in 0..10 {
                    let record = record(appender * 100 + index);
                    let seq = host.append(record.clone()).await.unwrap();
                    acked.push((seq, record));
                }
                acked
            }));
        }
        let mut acked = Vec::new();
        for task in tasks {
            acked.extend(task.await.unwrap());
        }
        acked.sort();
        host.store_checkpoint(Seq(40)).await.unwrap();
        assert_eq!(host.shutdown().await, Ok(Seq(40)));
        disk.crash();
        let (host, report) = WalHost::open(Arc::new(disk.clone()), config(), Clock::start())
            .await
            .unwrap();
        assert_eq!(report.next_seq, Seq(80));
        assert_eq!(host.status().checkpoint_synced, Seq(40));
        let frames = host.read(Seq(0), 100, 1 << 20).await.unwrap();
        let recovered: Vec<(Seq, Vec<u8>)> = frames
            .into_iter()
            .map(|frame| (frame.seq, frame.payload))
            .collect();
        assert_eq!(recovered, acked);
        host.shutdown().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn open_truncates_a_torn_tail_and_appends_after_it() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (host, _) = WalHost::open(fs_disk(dir.path()), config(), Clock::start())
                .await
                .unwrap();
            for index in 0..5 {
                host.append(record(index)).await.unwrap();
            }
            host.shutdown().await.unwrap();
        }
        let segment = dir.path().join(DIR).join("00000000000000000000.wal");
        let clean_len = std::fs::metadata(&segment).unwrap().len();
        let mut bytes = std::fs::read(&segment).unwrap();
        bytes.extend_from_slice(&[0xAB; 37]);
        std::fs::write(&segment, &bytes).unwrap();
        let (host, report) = WalHost::open(fs_disk(dir.path()), config(), Clock::start())
            .await
            .unwrap();
        let torn = report.torn_tail.expect("a torn tail");
        assert_eq!(
            (torn.segment, torn.offset, torn.bytes_dropped),
            (Seq(0), clean_len, 37)
        );
        assert_eq!(
            std::fs::metadata(&segment).unwrap().len(),
            clean_len,
            "repaired on disk"
        );
        assert_eq!(host.append(record(5)).await, Ok(Seq(5)));
        let frames = host.read(Seq(0), 100, 1 << 20).await.unwrap();
        let payloads: Vec<Vec<u8>> = frames.into_iter().map(|frame| frame.payload).collect();
        assert_eq!(payloads, (0..6).map(record).collect::<Vec<_>>());
        host.shutdown().await.unwrap();
    }
}
