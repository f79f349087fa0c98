//! The partition host (the owner host): drives the [`Owner`] (`narad_core::partition::owner`: one
//! combiner per partition, ownership views, parked reads, removal of retired logs) in one task, with
//! its I/O on a keyed [`IoExecutor`] (each combiner's lanes are its own ordering domains). It decides
//! nothing: it feeds the owner the local metastore replica, the callers' commits and reads and the I/O
//! completions, and carries out what comes out.
//!
//! - **Replica.** The owner is fed the replica's state at start and after every change; before handling
//!   any command the host feeds a pending change first, so the owner's views are never older than the
//!   replica state the caller looked at.
//! - **Commits** arrive from the dispatcher through [`super::local_transport::LocalTransport`] (and, in a
//!   cluster, from peers); dropping a commit's future before its answer tells the owner the caller
//!   gave up.
//! - **Commit wakes.** Every commit answered is announced on [`CommitWakes`], per topic, to the
//!   queue-mode consume host's long polls (`super::consumers`, which depends on this module, never
//!   the other way round).
//! - **Log events** become log lines and counters (damage found by recovery is an error an operator
//!   must hear of, one count per damaged range).
//!
//! Polling order: the host task handles one input per turn, an I/O completion first, else a
//! metastore change, else a command, and publishes its status after each; it polls its sources
//! itself with the task's waker (one `poll_fn` loop, no `select!` futures made and dropped per turn).
//! After every input its outputs are drained at once.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use narad_core::disk::{Disk, IoCompletion, IoLane, IoOp, IoReply, IoRequest};
use narad_core::ids::{NodeId, Offset, PartitionId};
use narad_core::partition::journal::replay::{
    JournalReplay, ReplayConfig, ReplayOutput, ReplayReport,
};
use narad_core::partition::journal::{JournalConfig, JournalEvent, JOURNAL_DIR};
pub use narad_core::partition::owner::{partition_dir, PARKED_READS_MAX, TOPICS_DIR};
use narad_core::partition::owner::{
    FreezeRefused, FreezeRequest, LogEvent, Owner, OwnerConfig, OwnerInput, OwnerOutput, OwnerRead,
};
use narad_core::partition::{
    BatchId, BatchRecord, CombinerConfig, CommitBatch, CommitError, CommittedRange, LogKey,
    LogReadError, LogReadId, PartitionReadError, QueryId, ReadBatch,
};
use narad_core::{Actor, Instant, IoFault};
use tokio::sync::{mpsc, oneshot, watch};

use crate::clock::Clock;
use crate::hooks::NodeHooks;
use crate::host::{self, HostConfig, Hosted, Turn};
use crate::http::{self, BoxFuture, PartitionStat, ReadOutcome, StoredRecord, TopicKey};
use crate::io::{ActorKey, IoExecutor};
use crate::metastore::{MetaView, Metastore};
use crate::metrics::Metrics;
use crate::observer::{Invariant, Observer};
use narad_core::codec::partition::verify_frame_checked;

/// Commands the host's mailbox holds before callers wait.
pub const MAILBOX_CAPACITY: usize = 4096;
/// Completions the executor may queue for the host.
pub const COMPLETIONS_CAPACITY: usize = 1024;
/// The most record bytes one replay read asks for (a read always returns at least one record).
pub const REPLAY_READ_BYTES_MAX: u32 = 1024 * 1024;
/// The lane a combiner's logs run recovery and commits on (the owner's removals join it).
const COMMIT_LANE: IoLane = IoLane(0);

/// For the observer: whether the data a completed request read back decodes as whole frames with valid
/// checksums (`None` when it read nothing).
fn read_back_verifies(completion: &IoCompletion) -> Option<bool> {
    let Ok(replies) = &completion.result else {
        return None;
    };
    let mut verified = None;
    for reply in replies {
        if let IoReply::Data(bytes) = reply {
            let mut position = 0;
            let mut ok = true;
            while position < bytes.len() {
                match verify_frame_checked(&bytes[position..], true) {
                    Ok(header) => position += header.frame_len(),
                    Err(_) => {
                        ok = false;
                        break;
                    }
                }
            }
            verified = Some(verified.unwrap_or(true) && ok);
        }
    }
    verified
}

/// Runs the owner journal's start-up replay ([`JournalReplay`]) to its end: every partition log's
/// files get back what the journal holds for them, and the journal is emptied. Runs before the
/// partition host opens any log.
///
/// The replay and its I/O run on one thread of their own, which ends with it: every buffer it reads
/// (the whole journal passes through them) is allocated and freed by that thread, and the thread's
/// end hands its heap back. Run on the blocking pool, the buffers were read on pool threads and freed
/// on the node's: the pool threads kept their share, idle, until they exited (as much RSS as the
/// journal held, for the pool's keep-alive).
#[cfg(not(madsim))]
pub async fn replay_owner_journal(
    disk: Arc<dyn Disk>,
    clock: &Clock,
) -> Result<ReplayReport, IoFault> {
    // The replay takes no decision on time: one reading serves every input.
    let now = clock.now();
    let (done, answer) = oneshot::channel();
    std::thread::Builder::new()
        .name("narad-journal-replay".into())
        .spawn(move || {
            let mut replay = JournalReplay::start(ReplayConfig::new(JOURNAL_DIR));
            let result = loop {
                match replay.poll_output() {
                    Some(ReplayOutput::Io(request)) => {
                        narad_core::feed(
                            &mut replay,
                            now,
                            narad_core::disk::execute(&*disk, &request),
                        );
                    }
                    Some(ReplayOutput::Done(report)) => break Ok(report),
                    Some(ReplayOutput::Failed(fault)) => break Err(fault),
                    None => break Err(IoFault::Other("owner journal replay stalled".into())),
                }
            };
            let _ = done.send(result);
        })
        .map_err(|error| IoFault::Other(format!("cannot start the replay thread: {error}")))?;
    let report = answer
        .await
        .map_err(|_| IoFault::Other("the owner journal replay thread failed".into()))??;
    log_replay(&report);
    Ok(report)
}

/// Runs the owner journal's start-up replay ([`JournalReplay`]) to its end (see the real node's): in
/// the simulated task, each request taking its simulated time, so a crash can fall inside the replay.
#[cfg(madsim)]
pub async fn replay_owner_journal(
    disk: Arc<dyn Disk>,
    clock: &Clock,
) -> Result<ReplayReport, IoFault> {
    let mut replay = JournalReplay::start(ReplayConfig::new(JOURNAL_DIR));
    loop {
        match replay.poll_output() {
            Some(ReplayOutput::Io(request)) => {
                let (_, completion) = crate::io::run_request(Arc::clone(&disk), request).await;
                narad_core::feed(&mut replay, clock.now(), completion);
            }
            Some(ReplayOutput::Done(report)) => {
                log_replay(&report);
                return Ok(report);
            }
            Some(ReplayOutput::Failed(fault)) => return Err(fault),
            None => return Err(IoFault::Other("owner journal replay stalled".into())),
        }
    }
}

fn log_replay(report: &ReplayReport) {
    if report.entries > 0 || report.segments > 0 {
        tracing::info!(
            segments = report.segments,
            entries = report.entries,
            bytes = report.bytes,
            logs = report.logs,
            torn_bytes = report.torn_bytes,
            retained_entries = report.retained_entries,
            "owner journal replayed"
        );
    }
    for (seq, at) in &report.damaged {
        tracing::error!(
            seq,
            at,
            "owner journal segment damaged: entries behind the damage are lost"
        );
    }
    for (dir, expected, found) in &report.gaps {
        tracing::error!(dir, %expected, %found, "owner journal entries do not continue their log");
    }
}

fn log_journal_event(event: JournalEvent) {
    match event {
        JournalEvent::FlushFailed(fault) => {
            tracing::error!(error = %fault, "owner journal flush failed; its commits are refused and retried")
        }
        JournalEvent::Latched(fault) => tracing::error!(
            error = %fault,
            "owner journal latched: its repair failed; commits are refused until a repair succeeds"
        ),
        JournalEvent::Trimmed { seq } => tracing::debug!(seq, "owner journal segment trimmed"),
        JournalEvent::TrimFailed(fault) => {
            tracing::warn!(error = %fault, "removing an owner journal segment failed")
        }
    }
}

/// How the owner stores its commits.
#[derive(Clone, Debug)]
pub struct OwnerStorage {
    /// Each partition log's zero fill (`storage.partition_prealloc_bytes`; unused when journaled).
    pub prealloc_bytes: u64,
    /// Each partition log's segment size (`storage.partition_segment_bytes`).
    pub segment_bytes: u64,
    /// The owner journal, or `None`: every partition commit pays its own fsync.
    pub journal: Option<JournalConfig>,
    /// `storage.retention_check_interval_ms`.
    pub retention_check_interval: Duration,
}

/// Why a freeze was not armed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FreezeError {
    /// The owner refused it.
    #[error(transparent)]
    Refused(#[from] FreezeRefused),
    /// The host stopped before answering.
    #[error("the partition host has stopped")]
    Stopped,
}

/// Why a commit was not made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PartitionCommitError {
    /// The combiner refused or failed it; nothing of it is visible.
    #[error(transparent)]
    Combiner(#[from] CommitError),
    /// The host stopped before answering.
    #[error("the partition host has stopped")]
    Stopped,
}

enum Command {
    Commit {
        topic: Arc<str>,
        partition: PartitionId,
        batch: CommitBatch,
        reply: oneshot::Sender<Result<CommittedRange, CommitError>>,
    },
    Abandon {
        topic: Arc<str>,
        partition: PartitionId,
        id: BatchId,
    },
    Read {
        topic: TopicKey,
        partition: PartitionId,
        offset: Offset,
        records_max: u32,
        reply: ReadReply,
    },
    Stat {
        topic: TopicKey,
        partition: PartitionId,
        reply: oneshot::Sender<PartitionStat>,
    },
    Freeze {
        topic: Arc<str>,
        partition: PartitionId,
        move_id: u64,
        reply: FreezeReply,
    },
}

type FreezeReply = oneshot::Sender<Result<Offset, FreezeRefused>>;

type ReadReply = oneshot::Sender<Result<ReadBatch, PartitionReadError>>;

/// What comes back to the host.
enum Event {
    /// A finished request of one combiner (or of the owner's removals on its lanes).
    Io {
        actor: ActorKey,
        request: IoRequest,
        completion: IoCompletion,
    },
    /// The metastore replica changed (`open`), or the metastore stopped; the receiver comes back to
    /// wait for the next change.
    Meta {
        receiver: watch::Receiver<Arc<MetaView>>,
        open: bool,
    },
}

/// What the host publishes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionStatus {
    /// The metastore replica index the views were last computed from.
    pub applied_index: u64,
    /// Whether that replica state was caught up with the log found at start-up.
    pub caught_up: bool,
    /// Logs still opening (recovering).
    pub opening: usize,
    /// Logs whose open failed (the combiner retries those that may be retried).
    pub open_failed: usize,
    /// Logs whose open failed in a way only a restart of the process can clear (the final sync of
    /// recovery failed: see `RecoveryError::Sync`): the alert an operator restarts the node on.
    pub restart_needed: usize,
}

impl PartitionStatus {
    /// Every log of the caught-up replica's topics finished opening (or failed to).
    pub fn settled(&self) -> bool {
        self.caught_up && self.opening == 0
    }
}

/// Announces the commits this host answers, per topic, to whoever waits on them (the queue-mode
/// consume host long-polls on it).
#[derive(Debug, Default)]
pub struct CommitWakes {
    topics: Mutex<HashMap<Arc<str>, watch::Sender<u64>>>,
}

impl CommitWakes {
    /// A receiver that changes on every commit to `topic` from now on.
    pub fn subscribe(&self, topic: &str) -> watch::Receiver<u64> {
        let mut topics = self
            .topics
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        match topics.get(topic) {
            Some(sender) => sender.subscribe(),
            None => {
                let (sender, receiver) = watch::channel(0);
                topics.insert(Arc::from(topic), sender);
                receiver
            }
        }
    }

    /// A commit to `topic` was answered. Topics nobody waits on are forgotten here.
    pub fn wake(&self, topic: &str) {
        let mut topics = self
            .topics
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Some(sender) = topics.get(topic) {
            if sender.receiver_count() == 0 {
                topics.remove(topic);
            } else {
                sender.send_modify(|generation| *generation = generation.wrapping_add(1));
            }
        }
    }
}

/// A handle on the partition host; clones share it.
#[derive(Clone, Debug)]
pub struct PartitionHost {
    commands: mpsc::Sender<Command>,
    status: watch::Receiver<PartitionStatus>,
    next_batch: Arc<AtomicU64>,
    wakes: Arc<CommitWakes>,
}

/// Sends `Abandon` for a commit whose caller stopped waiting before the answer.
struct AbandonGuard {
    commands: mpsc::Sender<Command>,
    topic: Arc<str>,
    partition: PartitionId,
    id: BatchId,
    armed: bool,
}

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: a full mailbox loses the notice, and the combiner's own deadline check
            // still leaves the batch out.
            let _ = self.commands.try_send(Command::Abandon {
                topic: self.topic.clone(),
                partition: self.partition,
                id: self.id,
            });
        }
    }
}

impl PartitionHost {
    /// Starts the host task. It follows `metastore` from now on; `clock` is the actors' `now` and
    /// `node` is this node (the owner it compares assignments with).
    pub fn spawn(
        disk: Arc<dyn Disk>,
        metastore: &Metastore,
        clock: Clock,
        node: NodeId,
        metrics: Arc<Metrics>,
        storage: OwnerStorage,
        hooks: &NodeHooks,
    ) -> PartitionHost {
        let OwnerStorage {
            prealloc_bytes,
            segment_bytes,
            journal,
            retention_check_interval,
        } = storage;
        let (status_sender, status) = watch::channel(PartitionStatus::default());
        let unix_epoch_ms =
            crate::clock::unix_ms().saturating_sub(clock.now().as_nanos() / 1_000_000);
        let meta = metastore.subscribe();
        let view = meta.borrow().clone();
        let mut template = CombinerConfig::new(unix_epoch_ms);
        template.log.commit_lane = COMMIT_LANE;
        template.log.preallocate_bytes = prealloc_bytes;
        template.log.segment_bytes_max = segment_bytes;
        template.log.plant = hooks.plant;
        template.plant = hooks.plant;
        if let Some(segment_bytes_max) = hooks.sizes.partition_segment_bytes_max {
            template.log.segment_bytes_max = segment_bytes_max;
        }
        let owner = Owner::new(OwnerConfig {
            node,
            combiner: template,
            journal,
            retention_check_interval,
        });
        let config = HostConfig {
            mailbox_capacity: MAILBOX_CAPACITY,
            completions_capacity: COMPLETIONS_CAPACITY,
        };
        let observer = hooks.observer.clone();
        let commands = host::spawn(config, clock.clone(), move |completions| Host {
            owner,
            clock,
            meta,
            view,
            executor: IoExecutor::new_keyed(disk, completions, |actor, request, completion| {
                Event::Io {
                    actor,
                    request,
                    completion,
                }
            }),
            commits: BTreeMap::new(),
            reads: BTreeMap::new(),
            next_read: 0,
            freezes: BTreeMap::new(),
            next_freeze: 0,
            status: status_sender,
            metrics,
            observer,
            stopped: false,
        });
        PartitionHost {
            commands,
            status,
            next_batch: Arc::new(AtomicU64::new(0)),
            wakes: Arc::default(),
        }
    }

    /// The current status.
    pub fn status(&self) -> PartitionStatus {
        self.status.borrow().clone()
    }

    /// Waits until every log of the caught-up replica's topics finished opening (or failed to).
    pub async fn wait_settled(&self) -> Result<PartitionStatus, PartitionReadError> {
        let mut status = self.status.clone();
        let settled = status
            .wait_for(PartitionStatus::settled)
            .await
            .map_err(|_| PartitionReadError::Stopped)?;
        Ok(settled.clone())
    }

    /// Commits `records` to one partition through its combiner; `deadline` is when the caller stops
    /// waiting (the combiner leaves the batch out if its cycle starts later). Dropping the future before
    /// the answer tells the combiner the caller gave up.
    pub async fn commit(
        &self,
        topic: Arc<str>,
        partition: PartitionId,
        records: Vec<BatchRecord>,
        deadline: Option<Instant>,
    ) -> Result<CommittedRange, PartitionCommitError> {
        let id = BatchId(self.next_batch.fetch_add(1, Ordering::Relaxed));
        let (reply, answer) = oneshot::channel();
        let batch = CommitBatch {
            id,
            records,
            deadline,
        };
        let mut guard = AbandonGuard {
            commands: self.commands.clone(),
            topic: topic.clone(),
            partition,
            id,
            armed: false,
        };
        crate::mailbox::send(
            &self.commands,
            Command::Commit {
                topic,
                partition,
                batch,
                reply,
            },
        )
        .await
        .map_err(|_| PartitionCommitError::Stopped)?;
        guard.armed = true;
        let result = answer.await.map_err(|_| PartitionCommitError::Stopped);
        guard.armed = false;
        let range = result??;
        self.wakes.wake(&guard.topic);
        Ok(range)
    }

    /// Arms the handoff freeze of a partition this node is moving away (see
    /// `narad_core::partition::owner::freeze`) and answers its final high watermark.
    pub async fn freeze(
        &self,
        topic: &str,
        partition: PartitionId,
        move_id: u64,
    ) -> Result<Offset, FreezeError> {
        let (reply, answer) = oneshot::channel();
        crate::mailbox::send(
            &self.commands,
            Command::Freeze {
                topic: Arc::from(topic),
                partition,
                move_id,
                reply,
            },
        )
        .await
        .map_err(|_| FreezeError::Stopped)?;
        answer
            .await
            .map_err(|_| FreezeError::Stopped)?
            .map_err(FreezeError::Refused)
    }

    /// Where long-polling queue-mode consumes learn of commits.
    pub fn wakes(&self) -> &CommitWakes {
        &self.wakes
    }

    /// Reads up to `records_max` visible records of the incarnation `topic` from `offset`.
    pub async fn read(
        &self,
        topic: &TopicKey,
        partition: PartitionId,
        offset: Offset,
        records_max: u32,
    ) -> Result<ReadBatch, PartitionReadError> {
        let (reply, answer) = oneshot::channel();
        crate::mailbox::send(
            &self.commands,
            Command::Read {
                topic: topic.clone(),
                partition,
                offset,
                records_max,
                reply,
            },
        )
        .await
        .map_err(|_| PartitionReadError::Stopped)?;
        answer.await.map_err(|_| PartitionReadError::Stopped)?
    }

    /// The figures of one partition of the incarnation `topic` (zeros when its log is not open).
    pub async fn stat(&self, topic: &TopicKey, partition: PartitionId) -> PartitionStat {
        let (reply, answer) = oneshot::channel();
        let sent = crate::mailbox::send(
            &self.commands,
            Command::Stat {
                topic: topic.clone(),
                partition,
                reply,
            },
        )
        .await;
        match sent {
            Ok(()) => answer.await.unwrap_or_default(),
            Err(_) => PartitionStat::default(),
        }
    }
}

impl http::PartitionReader for PartitionHost {
    fn read(
        &self,
        topic: &TopicKey,
        partition: PartitionId,
        offset: Offset,
    ) -> BoxFuture<'_, Result<ReadOutcome, http::ReplayError>> {
        let topic = topic.clone();
        Box::pin(async move {
            match PartitionHost::read(self, &topic, partition, offset, 1).await {
                Ok(batch) => match batch.records.into_iter().next() {
                    Some(record) => Ok(ReadOutcome::Record(StoredRecord {
                        offset: batch.first,
                        key: record.key,
                        payload: record.payload,
                        committed_at_ms: record.committed_at_ms,
                    })),
                    None => Ok(ReadOutcome::PastEnd),
                },
                Err(PartitionReadError::Log(LogReadError::AtOrPastHighWatermark { .. })) => {
                    Ok(ReadOutcome::PastEnd)
                }
                Err(PartitionReadError::Log(LogReadError::BelowOldestRetained { .. })) => {
                    Ok(ReadOutcome::Gone)
                }
                Err(PartitionReadError::NotLive(_)) => Ok(ReadOutcome::OtherIncarnation),
                Err(error) => Err(http::ReplayError(error.to_string())),
            }
        })
    }
}

impl http::PartitionStats for PartitionHost {
    fn partition_stat(
        &self,
        topic: &TopicKey,
        partition: PartitionId,
    ) -> BoxFuture<'_, PartitionStat> {
        let topic = topic.clone();
        Box::pin(async move { self.stat(&topic, partition).await })
    }
}

/// The host task's state.
struct Host {
    owner: Owner,
    clock: Clock,
    meta: watch::Receiver<Arc<MetaView>>,
    /// The replica state last fed to the owner.
    view: Arc<MetaView>,
    executor: IoExecutor<Event>,
    commits: BTreeMap<BatchId, oneshot::Sender<Result<CommittedRange, CommitError>>>,
    reads: BTreeMap<LogReadId, ReadReply>,
    next_read: u64,
    freezes: BTreeMap<QueryId, FreezeReply>,
    next_freeze: u64,
    status: watch::Sender<PartitionStatus>,
    metrics: Arc<Metrics>,
    /// Events and broken invariants go here (see [`crate::observer`]).
    observer: Observer,
    /// Every handle on the mailbox is gone.
    stopped: bool,
}

/// Waits for the next change `receiver` has not seen.
async fn meta_change(mut receiver: watch::Receiver<Arc<MetaView>>) -> Event {
    let open = receiver.changed().await.is_ok();
    Event::Meta { receiver, open }
}

/// Turns: a completion (the commands waiting fed first), a metastore change, or the commands waiting
/// (before each, a pending metastore change is fed first); the status is published after each input.
impl Hosted for Host {
    type Command = Command;
    type Completion = Event;

    fn on_start(&mut self, turn: &mut Turn<'_, Event>) {
        self.apply_view();
        self.publish();
        turn.answer_later(meta_change(self.meta.clone()));
    }

    fn on_commands(&mut self, _turn: &mut Turn<'_, Event>, commands: &mut VecDeque<Command>) {
        for command in commands.drain(..) {
            if self.meta.has_changed().unwrap_or(false) {
                self.apply_view();
            }
            self.on_command(command);
            self.publish();
        }
    }

    fn on_mailbox_closed(&mut self, _turn: &mut Turn<'_, Event>) {
        self.stopped = true;
    }

    fn on_completion(&mut self, turn: &mut Turn<'_, Event>, event: Event) {
        match event {
            Event::Io {
                actor,
                request,
                completion,
            } => self.on_io(actor, request, completion),
            Event::Meta { receiver, open } => {
                // Applied already if a command came first and took it.
                if self.meta.borrow().has_changed() {
                    self.apply_view();
                }
                // The metastore stopped: the last view stays.
                if open {
                    turn.answer_later(meta_change(receiver));
                }
            }
        }
        self.publish();
    }

    fn on_timeout(&mut self, _turn: &mut Turn<'_, Event>) {
        self.feed(OwnerInput::Tick);
        self.publish();
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.owner.poll_timeout()
    }

    fn finished(&self) -> bool {
        self.stopped
    }
}

impl Host {
    fn publish(&self) {
        let owner = self.owner.status();
        let status = PartitionStatus {
            applied_index: self.view.applied_index,
            caught_up: self.view.caught_up,
            opening: owner.opening,
            open_failed: owner.open_failed,
            restart_needed: owner.restart_needed,
        };
        self.status.send_if_modified(|current| {
            let changed = *current != status;
            *current = status;
            changed
        });
    }

    /// Feeds the owner the replica's latest state.
    fn apply_view(&mut self) {
        self.view = self.meta.borrow_and_update().clone();
        let state = Arc::new(self.view.state.clone());
        self.feed(OwnerInput::Replica(state));
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Commit {
                topic,
                partition,
                batch,
                reply,
            } => {
                self.commits.insert(batch.id, reply);
                self.feed(OwnerInput::Commit {
                    topic,
                    partition,
                    batch,
                });
            }
            Command::Abandon {
                topic,
                partition,
                id,
            } => self.feed(OwnerInput::Abandon {
                topic,
                partition,
                id,
            }),
            Command::Read {
                topic,
                partition,
                offset,
                records_max,
                reply,
            } => {
                let id = LogReadId(self.next_read);
                self.next_read += 1;
                self.reads.insert(id, reply);
                self.feed(OwnerInput::Read(OwnerRead {
                    id,
                    topic: Arc::from(topic.name.as_str()),
                    topic_id: topic.id,
                    partition,
                    offset,
                    records_max,
                    bytes_max: REPLAY_READ_BYTES_MAX,
                }));
            }
            Command::Stat {
                topic,
                partition,
                reply,
            } => {
                let stat = self
                    .owner
                    .stats(&topic.name, topic.id, partition)
                    .map_or_else(PartitionStat::default, |stats| PartitionStat {
                        segments: stats.segments as u64,
                        oldest_offset: stats.oldest_offset,
                        next_offset: stats.next_offset,
                        high_watermark: stats.high_watermark,
                        size_bytes: stats.size_bytes,
                        oldest_segment_at_s: stats.oldest_segment_at_ms.map(|ms| ms / 1000),
                    });
                let _ = reply.send(stat);
            }
            Command::Freeze {
                topic,
                partition,
                move_id,
                reply,
            } => {
                let query = QueryId(self.next_freeze);
                self.next_freeze += 1;
                self.freezes.insert(query, reply);
                self.feed(OwnerInput::Freeze(FreezeRequest {
                    topic,
                    partition,
                    move_id,
                    query,
                }));
            }
        }
    }

    fn on_io(&mut self, actor: ActorKey, request: IoRequest, completion: IoCompletion) {
        let key = LogKey(actor.0);
        // A commit's request writes its run, syncs it and reads it back (recovery reads whole
        // segments, torn tails included, and writes nothing in the same request).
        let commit = !Owner::is_removal(&completion)
            && request
                .ops
                .iter()
                .any(|op| matches!(op, IoOp::WriteAt { .. }));
        let audit = (commit && self.observer.is_watched()).then(|| {
            let verified = read_back_verifies(&completion);
            (self.owner.high_watermark(key), verified)
        });
        self.feed(OwnerInput::IoDone { key, completion });
        if let Some((before, Some(false))) = audit {
            let after = self.owner.high_watermark(key);
            if after > before {
                let topic = self.owner.partition_of(key).map(|(topic, _)| topic.clone());
                self.observer.violation(
                    Invariant::HighWatermarkAboveVerified,
                    format_args!(
                        "{topic:?} high watermark {before:?} -> {after:?} over a read-back that fails its checks"
                    ),
                );
            }
        }
    }

    /// Feeds the owner one input and carries out everything it asks for.
    fn feed(&mut self, input: OwnerInput) {
        let started = self.clock.now();
        narad_core::feed(&mut self.owner, started, input);
        while let Some(output) = self.owner.poll_output() {
            match output {
                OwnerOutput::Io { key, request } => {
                    self.executor.submit_for(ActorKey(key.0), request)
                }
                OwnerOutput::Forget { key } => self.executor.forget(ActorKey(key.0)),
                OwnerOutput::Committed { id, result } => {
                    if let Some(reply) = self.commits.remove(&id) {
                        let _ = reply.send(result);
                    }
                }
                OwnerOutput::ReadDone { id, result } => {
                    if let Some(reply) = self.reads.remove(&id) {
                        let _ = reply.send(result.map_err(PartitionReadError::from));
                    }
                }
                OwnerOutput::Log {
                    topic,
                    partition,
                    event,
                } => self.log_event(&topic, partition, event),
                OwnerOutput::FreezeArmed { query, result } => {
                    if let Some(reply) = self.freezes.remove(&query) {
                        let _ = reply.send(result);
                    }
                }
                OwnerOutput::Journal(event) => log_journal_event(event),
                OwnerOutput::RetentionChecked { sizes } => self.retention_checked(started, sizes),
            }
        }
    }

    fn log_event(&self, topic: &str, partition: PartitionId, event: LogEvent) {
        match event {
            LogEvent::Opened { topic_id, report } => {
                tracing::info!(
                    topic,
                    %partition,
                    ?topic_id,
                    segments = report.segments,
                    high_watermark = %report.high_watermark,
                    truncated_bytes = report.truncated_bytes,
                    "partition log opened"
                );
                // Rot inside acknowledged data: the offsets in it are gone for good (one copy), the
                // frames behind it were kept. An operator must hear of it, loudly and countably.
                for skipped in &report.skipped {
                    tracing::error!(
                        topic,
                        %partition,
                        segment = %skipped.segment,
                        byte = skipped.byte,
                        damage = ?skipped.damage,
                        first_offset = %skipped.offsets.0,
                        end_offset = %skipped.offsets.1,
                        "partition log damaged: acknowledged records in these offsets are unreadable; \
                         the records behind them were kept"
                    );
                    self.metrics.error("storage", "partition_damaged").inc();
                }
            }
            LogEvent::OpenFailed { topic_id, error } => {
                tracing::error!(topic, %partition, ?topic_id, %error, "partition log open failed");
                self.metrics.error("storage", "partition_open").inc();
            }
            LogEvent::SyncFailed { topic_id, fault } => {
                tracing::error!(
                    topic,
                    %partition,
                    ?topic_id,
                    %fault,
                    "partition log sync failed; the owner journal keeps its records and it is synced again later"
                );
                self.metrics.error("storage", "partition_sync").inc();
            }
            LogEvent::Latched { topic_id, fault } => {
                tracing::error!(
                    topic,
                    %partition,
                    ?topic_id,
                    %fault,
                    "partition log latched: commits refused until its repair succeeds"
                );
                self.metrics.error("storage", "partition_latched").inc();
            }
            LogEvent::Retired { topic_id, dir } => tracing::info!(
                topic,
                %partition,
                ?topic_id,
                dir,
                "partition log retired; removing its files"
            ),
            LogEvent::Removed { dir } => tracing::info!(dir, "retired partition log removed"),
            LogEvent::RemoveFailed { dir, op, fault } => {
                tracing::warn!(dir, op, %fault, "removing a retired partition log failed; its files stay");
                self.metrics.error("storage", "retired_log_remove").inc();
            }
            LogEvent::Retained(range) => {
                tracing::info!(
                    topic,
                    %partition,
                    reason = range.reason.label(),
                    segments = range.segments,
                    records = range.records,
                    bytes = range.bytes,
                    oldest_offset = %range.oldest,
                    "retention removed segments"
                );
                self.metrics.storage.retained(
                    topic,
                    partition.0,
                    range.reason.label(),
                    range.records,
                    range.bytes,
                );
            }
            LogEvent::RetentionFailed { fault } => {
                tracing::warn!(topic, %partition, %fault, "a retention step failed; the next check tries again");
                self.metrics.error("storage", "retention").inc();
            }
        }
    }

    /// A retention check ran (within the input handled since `started`): its duration and the
    /// sizes of the open logs.
    fn retention_checked(&self, started: Instant, sizes: Vec<(Arc<str>, PartitionId, u64)>) {
        let took = self.clock.now().saturating_duration_since(started);
        let storage = &self.metrics.storage;
        storage
            .retention_run_duration_seconds
            .observe(took.as_secs_f64());
        storage.open_partition_logs.set(sizes.len() as i64);
        for (topic, partition, size) in sizes {
            let labels = crate::metrics::PartitionLabels {
                topic: topic.to_string(),
                partition: partition.0.to_string(),
            };
            storage
                .partition_size_bytes
                .get_or_create(&labels)
                .set(i64::try_from(size).unwrap_or(i64::MAX));
        }
    }
}
