//! The ingress host: runs the [`IngressWal`], the [`Checkpointer`] and (once recovery starts it) the
//! dispatcher (`crate::ingress::dispatch`) in one task on the generic [`crate::host`], over a [`Disk`], so
//! async callers can append records and await their durable outcome, and the dispatcher gets its
//! `Durable`, its reads and its checkpoint stores without a channel round trip.
//!
//! # What it does (and decides nothing)
//! - **Open** ([`IngressHost::open`]): reads `<checkpoint dir>/checkpoint`, opens the checkpointer and runs its
//!   startup I/O to completion, so the recovered checkpoint is synced *before the WAL exists* and so before
//!   anything can compact behind it; then recovers the WAL ([`narad_core::wal::driver::open_wal`]: list the
//!   directory, read every segment, run the pure recovery) and starts one actor task. The WAL's first
//!   output is its repair request, which the task runs like any other; `open` returns once it ran
//!   (the WAL then reports its durable frontier) or failed (the WAL latches).
//! - **The task** owns the actors. Its inputs come from a bounded command mailbox
//!   ([`IngressHostConfig::mailbox_capacity`]; callers wait when it is full), from the two I/O executors
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
//!   answered go to [`AcceptTimes`] ([`IngressHost::accept_times`]), forgotten once below the written
//!   checkpoint; the dispatcher reads them for `narad_accept_to_visible_seconds`.
//! - **Shutdown** ([`IngressHost::shutdown`], or every handle dropped): stops taking commands, lets appends in
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
    AppendError, AppendId, FillFn, IngressWal, OpenError, RecoveryReport, SeqRange, WalConfig,
    WalFrame, WalInput, WalOutput, WalReadError, WalReadId,
};
use narad_core::{Actor, Instant, IoFault, Seq};
use tokio::sync::{mpsc, oneshot, watch};

use crate::accept_times::AcceptTimes;
use crate::clock::Clock;
use crate::host::{self, HostConfig, Hosted, Turn};
use crate::ingress::dispatch::{DispatchEvent, DispatchPart, WalPort};
use crate::io::IoExecutor;
use crate::observer::{Invariant, Observer, TraceField};
use hosted::Ingress;
use runner::{Runner, WalAudit};

/// Commands the mailbox holds before callers wait.
pub const MAILBOX_CAPACITY: usize = 4096;
/// Completions each actor's executor may queue for the task.
pub const COMPLETIONS_CAPACITY: usize = 256;
/// Checkpointer I/O rounds [`IngressHost::open`] runs before it gives up on the startup sync.
pub const STARTUP_CHECKPOINT_ROUNDS_MAX: usize = 16;

/// The host's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IngressHostConfig {
    /// The WAL's settings (its directory, segment size, preallocation, ...).
    pub wal: WalConfig,
    /// The checkpointer's settings (by default its file lives in the WAL's directory).
    pub checkpoint: CheckpointerConfig,
    /// Commands the mailbox holds before callers wait.
    pub mailbox_capacity: usize,
    /// Where the host reports events and broken invariants (see [`crate::observer`]).
    pub observer: Observer,
}

impl IngressHostConfig {
    /// Production settings around `wal`, with the checkpoint beside the segments.
    pub fn new(wal: WalConfig) -> Self {
        let checkpoint = CheckpointerConfig::new(wal.dir.clone());
        IngressHostConfig {
            wal,
            checkpoint,
            mailbox_capacity: MAILBOX_CAPACITY,
            observer: Observer::none(),
        }
    }
}

/// Why an append was not acknowledged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WalError {
    /// The WAL refused or failed it (disk failure or latch, size limits, overload, fill failure).
    #[error(transparent)]
    Append(#[from] AppendError),
    /// No WAL takes it: not open yet, or its host stopped (before answering, the record may or may
    /// not be durable).
    #[error("ingress WAL unavailable")]
    Unavailable,
}

/// Why a read was not answered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IngressReadError {
    /// The WAL refused or failed it.
    #[error(transparent)]
    Read(#[from] WalReadError),
    /// The host stopped before answering.
    #[error("the ingress WAL host has stopped")]
    Stopped,
}

/// Why [`IngressHost::open`] failed.
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

/// Why [`IngressHost::shutdown`] did not confirm a synced checkpoint.
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
    /// [`IngressHost::open`] returns only once it is set (or the WAL latched).
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
        reply: oneshot::Sender<Result<Vec<WalFrame>, WalReadError>>,
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
    /// When a record earned its 202, and how many group commits are kept.
    AcceptTime {
        seq: Seq,
        reply: oneshot::Sender<(Option<Instant>, usize)>,
    },
}

/// Who waits for a checkpoint store: answered once the value is written in place, or at the next failure.
type StoreReply = oneshot::Sender<Result<(), CheckpointFailure>>;

/// Called with the number of records each group commit made durable (for the group-commit histogram).
pub type DurableObserver = Arc<dyn Fn(u64) + Send + Sync>;

/// Why [`IngressHost::store_checkpoint_written`] did not confirm the store.
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
pub struct IngressHost {
    commands: mpsc::Sender<Command>,
    status: watch::Receiver<WalStatus>,
}

impl IngressHost {
    /// Opens (recovers) the WAL and its checkpoint on `disk` and starts the actor task; the actors read
    /// time from `clock` (the node's).
    /// Returns the host and what recovery found.
    pub async fn open(
        disk: Arc<dyn Disk>,
        config: IngressHostConfig,
        clock: Clock,
    ) -> Result<(IngressHost, RecoveryReport), WalHostOpenError> {
        IngressHost::open_observed(disk, config, clock, None).await
    }

    /// [`IngressHost::open`], calling `observer` with the records of every group commit.
    pub async fn open_observed(
        disk: Arc<dyn Disk>,
        config: IngressHostConfig,
        clock: Clock,
        observer: Option<DurableObserver>,
    ) -> Result<(IngressHost, RecoveryReport), WalHostOpenError> {
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
        let accept_times = AcceptTimes::new(wal.durable_next_seq());
        config.observer.event(
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
        let audit = WalAudit::new(config.observer.clone());
        let durable_next = wal.durable_next_seq();
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
                accept_times,
                appending: Vec::new(),
                durable_next,
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
        let host = IngressHost {
            commands: command_sender,
            status,
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
            .ok_or(WalError::Unavailable)?;
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
            .ok_or(WalError::Unavailable)?;
        let range = result?;
        Ok(range.first..range.next)
    }

    /// Reads durable records from `from` on (at most `max_records`, about `max_bytes` of payload).
    pub async fn read(
        &self,
        from: Seq,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<WalFrame>, IngressReadError> {
        let result = self
            .ask(|reply| Command::Read {
                from,
                max_records,
                max_bytes,
                reply,
            })
            .await
            .ok_or(IngressReadError::Stopped)?;
        Ok(result?)
    }

    /// Stores the dispatcher's checkpoint (never backwards): written in place at once, synced within
    /// 250 ms; compaction follows the synced value.
    pub async fn store_checkpoint(&self, seq: Seq) -> Result<(), WalError> {
        self.commands
            .send(Command::StoreCheckpoint { seq, reply: None })
            .await
            .map_err(|_| WalError::Unavailable)
    }

    /// Stores the checkpoint like [`IngressHost::store_checkpoint`] and answers once its in-place write
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

    /// When the record `seq` earned its 202, and how many group commits' instants are kept (asked of
    /// the host's task, which alone holds them).
    pub async fn accept_time(&self, seq: Seq) -> Option<(Option<Instant>, usize)> {
        self.ask(|reply| Command::AcceptTime { seq, reply }).await
    }

    /// The current status.
    pub fn status(&self) -> WalStatus {
        self.status.borrow().clone()
    }

    /// A receiver that wakes when the repair finishes, the durable frontier moves, the WAL latches, or
    /// the synced checkpoint or its failure changes. The stored and written checkpoint values change
    /// with every dispatched batch and wake nobody: read them with `borrow` (or [`IngressHost::status`]).
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
            narad_core::feed(
                &mut checkpointer,
                clock.now(),
                CheckpointInput::Io(completion),
            );
        }
    }
    Err(WalHostOpenError::Task(
        "the checkpoint's startup sync did not finish".to_string(),
    ))
}

pub mod dispatch;
mod hosted;
mod runner;
#[cfg(test)]
mod tests;
pub mod transport;
