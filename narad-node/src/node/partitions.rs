//! The partition host: one [`Combiner`] per partition of every topic, hosted in one task, with their
//! I/O on a keyed [`IoExecutor`] (each combiner's lanes are its own ordering domains).
//!
//! # What it does (and decides nothing)
//! - **Views.** Each combiner's [`TopicView`] (owned, frozen, the live incarnation and its log
//!   directory) is computed from the local metastore replica and sent again on every metastore change.
//!   A combiner exists for every partition of every topic the replica holds (so every log is opened at
//!   once, and at start-up before the node turns ready), and on demand for a commit, read or figure
//!   asking about any other (topic, partition): its view then says the topic is absent, and the combiner
//!   answers accordingly. A name the replica does not hold is *owned* here (a single node owns every
//!   partition): the combiner's answer is then the incarnation refusal or "topic not found", which the
//!   dispatcher turns into a leader confirmation and a discard — never a "not owner" that would reroute.
//!   Before handling any command the host applies a pending metastore change, so its views are never
//!   older than the replica state the caller looked at.
//! - **Logs.** The directory of a partition's log names the incarnation
//!   (`topics/<name>/<id>/p<05 partition>`), so a recreated topic starts empty. When a combiner lets a
//!   log go ([`CombinerOutput::LogRetired`]), the host removes the log's files on that combiner's own
//!   commit lane (behind anything the log still had queued there), then syncs the directory. Empty
//!   directories are left behind (the `Disk` seam has no directory removal).
//! - **Reads** wait while the partition's log is still opening (a topic created a moment ago, or
//!   start-up) and go to the combiner once it is open.
//! - **Idle combiners** of a name the replica no longer holds are dropped once they hold nothing.
//!
//! Polling order: the host task handles one input per turn, an I/O completion first, else a
//! metastore change, else a command, and publishes its status after each; it polls its sources
//! itself with the task's waker (one `poll_fn` loop, no `select!` futures made and dropped per turn).
//! After every input to a combiner its outputs are drained at once (I/O to the executor, outcomes to
//! their callers, log events to the log and the metrics).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use narad_core::disk::{join, Disk, IoCompletion, IoId, IoLane, IoOp, IoReply, IoRequest};
use narad_core::ids::{NodeId, Offset, PartitionId, TopicId};
use narad_core::partition::{
    BatchId, BatchRecord, Combiner, CombinerConfig, CombinerInput, CombinerOutput, CommitBatch,
    CommitError, CommittedRange, LiveTopic, LogStatus, ReadBatch, ReadError, ReadId, ReadRequest,
    RecoveryError, TopicView,
};
use narad_core::{Actor, Instant};
use tokio::sync::{mpsc, oneshot, watch};

use super::NodeHooks;
use crate::clock::Clock;
use crate::http::{self, BoxFuture, PartitionStat, ReadOutcome, StoredRecord, TopicKey};
use crate::io::{ActorKey, IoExecutor};
use crate::metastore::{MetaView, Metastore};
use crate::metrics::Metrics;
use crate::probe::{Invariant, Probe};
use narad_core::codec::partition::verify_frame_checked;

/// Commands the host's mailbox holds before callers wait.
pub const MAILBOX_CAPACITY: usize = 4096;
/// Completions the executor may queue for the host.
pub const COMPLETIONS_CAPACITY: usize = 1024;
/// Reads parked behind one opening log, at most (more are refused as busy).
pub const PARKED_READS_MAX: usize = 1024;
/// The most record bytes one replay read asks for (a read always returns at least one record).
pub const REPLAY_READ_BYTES_MAX: u32 = 1024 * 1024;
/// The directory of every topic's partition logs.
pub const TOPICS_DIR: &str = "topics";
/// Io ids at and above this are the host's own (removing retired logs), never a log's.
const JANITOR_IO_BASE: u64 = 1 << 63;
/// The lane a combiner's logs run recovery and commits on (the janitor joins it).
const COMMIT_LANE: IoLane = IoLane(0);

/// For the probe: whether the data a completed request read back decodes as whole frames with valid
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

/// The directory of one partition's log of one topic incarnation.
pub fn partition_dir(topic: &str, topic_id: TopicId, partition: PartitionId) -> String {
    format!("{TOPICS_DIR}/{topic}/{topic_id}/p{:05}", partition.0)
}

/// Why a replay read returned nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PartitionReadError {
    /// The log refused or failed the read.
    #[error(transparent)]
    Log(#[from] ReadError),
    /// The topic was deleted or recreated since the caller looked it up.
    #[error("topic incarnation {0} is no longer live")]
    NotLive(TopicId),
    /// The host stopped.
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
}

type ReadReply = oneshot::Sender<Result<ReadBatch, PartitionReadError>>;

/// A finished request of one combiner (or of the host's janitor work on its lanes).
struct IoEvent {
    actor: ActorKey,
    request: IoRequest,
    completion: IoCompletion,
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

/// A handle on the partition host; clones share it.
#[derive(Clone, Debug)]
pub struct PartitionHost {
    commands: mpsc::Sender<Command>,
    status: watch::Receiver<PartitionStatus>,
    next_batch: Arc<AtomicU64>,
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
        prealloc_bytes: u64,
        hooks: &NodeHooks,
    ) -> PartitionHost {
        let (commands, mailbox) = mpsc::channel(MAILBOX_CAPACITY);
        let (io_sender, io_receiver) = mpsc::channel(COMPLETIONS_CAPACITY);
        let (status_sender, status) = watch::channel(PartitionStatus::default());
        let unix_epoch_ms =
            crate::clock::unix_ms().saturating_sub(clock.now().as_nanos() / 1_000_000);
        let meta = metastore.subscribe();
        let view = meta.borrow().clone();
        let mut template = CombinerConfig::new(unix_epoch_ms);
        template.log.commit_lane = COMMIT_LANE;
        template.log.preallocate_bytes = prealloc_bytes;
        template.log.plant = hooks.plant;
        template.plant = hooks.plant;
        if let Some(segment_bytes_max) = hooks.sizes.partition_segment_bytes_max {
            template.log.segment_bytes_max = segment_bytes_max;
        }
        let host = Host {
            node,
            clock,
            template,
            meta,
            view,
            executor: IoExecutor::new_keyed(disk, io_sender, |actor, request, completion| {
                IoEvent {
                    actor,
                    request,
                    completion,
                }
            }),
            by_name: BTreeMap::new(),
            slots: BTreeMap::new(),
            next_actor: 1,
            commits: BTreeMap::new(),
            reads: BTreeMap::new(),
            parked: BTreeMap::new(),
            next_read: 0,
            next_janitor: JANITOR_IO_BASE,
            janitor: BTreeMap::new(),
            opening: BTreeSet::new(),
            open_failed: BTreeSet::new(),
            restart_needed: BTreeSet::new(),
            status: status_sender,
            metrics,
            probe: hooks.probe.clone(),
        };
        tokio::spawn(host.run(mailbox, io_receiver));
        PartitionHost {
            commands,
            status,
            next_batch: Arc::new(AtomicU64::new(0)),
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
        Ok(result??)
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
    ) -> BoxFuture<'_, Result<ReadOutcome, http::ReadError>> {
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
                Err(PartitionReadError::Log(ReadError::AtOrPastHighWatermark { .. })) => {
                    Ok(ReadOutcome::PastEnd)
                }
                Err(PartitionReadError::Log(ReadError::BelowOldestRetained { .. })) => {
                    Ok(ReadOutcome::Gone)
                }
                Err(error) => Err(http::ReadError(error.to_string())),
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

/// One hosted combiner.
struct Slot {
    topic: Arc<str>,
    partition: PartitionId,
    combiner: Combiner,
}

/// A read waiting for its log to finish opening.
struct Parked {
    topic_id: TopicId,
    offset: Offset,
    records_max: u32,
    reply: ReadReply,
}

/// The host task's state.
struct Host {
    node: NodeId,
    clock: Clock,
    template: CombinerConfig,
    meta: watch::Receiver<Arc<MetaView>>,
    /// The replica state the views were computed from.
    view: Arc<MetaView>,
    executor: IoExecutor<IoEvent>,
    by_name: BTreeMap<(Arc<str>, PartitionId), ActorKey>,
    slots: BTreeMap<ActorKey, Slot>,
    next_actor: u64,
    commits: BTreeMap<BatchId, oneshot::Sender<Result<CommittedRange, CommitError>>>,
    reads: BTreeMap<ReadId, ReadReply>,
    parked: BTreeMap<ActorKey, Vec<Parked>>,
    next_read: u64,
    next_janitor: u64,
    /// Janitor requests in flight: io id → the combiner whose lane runs it, and the retired log's
    /// directory.
    janitor: BTreeMap<IoId, (ActorKey, String)>,
    opening: BTreeSet<ActorKey>,
    open_failed: BTreeSet<ActorKey>,
    /// The failed opens that only a restart clears.
    restart_needed: BTreeSet<ActorKey>,
    status: watch::Sender<PartitionStatus>,
    metrics: Arc<Metrics>,
    /// Events and broken invariants go here (see [`crate::probe`]).
    probe: Probe,
}

/// The host's wait for the next metastore change: resolves with its receiver (a clone of the host's,
/// which tracks what was seen on its own) and whether the metastore is still there.
type MetaChange = Pin<
    Box<
        dyn Future<
                Output = (
                    watch::Receiver<Arc<MetaView>>,
                    Result<(), watch::error::RecvError>,
                ),
            > + Send,
    >,
>;

/// Waits for the next change `receiver` has not seen.
fn wait_meta_change(mut receiver: watch::Receiver<Arc<MetaView>>) -> MetaChange {
    Box::pin(async move {
        let changed = receiver.changed().await;
        (receiver, changed)
    })
}

impl Host {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>, mut io: mpsc::Receiver<IoEvent>) {
        self.apply_view();
        self.publish();
        // `None` once the metastore stopped: the last view stays.
        let mut meta_change = Some(wait_meta_change(self.meta.clone()));
        std::future::poll_fn(|cx| self.poll_turns(cx, &mut commands, &mut io, &mut meta_change))
            .await;
    }

    /// Runs turns until no input is ready; `Ready` once the command mailbox closed. A turn handles one
    /// input, in this order: an I/O completion, else a metastore change, else a command; then
    /// publishes the status. The metastore change is one future kept across turns (no waiter
    /// registered and dropped per turn).
    fn poll_turns(
        &mut self,
        cx: &mut Context<'_>,
        commands: &mut mpsc::Receiver<Command>,
        io: &mut mpsc::Receiver<IoEvent>,
        meta_change: &mut Option<MetaChange>,
    ) -> Poll<()> {
        loop {
            if let Poll::Ready(Some(event)) = io.poll_recv(cx) {
                self.on_io(event);
            } else if let Some(Poll::Ready((receiver, changed))) =
                meta_change.as_mut().map(|change| change.as_mut().poll(cx))
            {
                // Applied already if a command came first and took it (`has_changed` below).
                if self.meta.borrow().has_changed() {
                    self.apply_view();
                }
                // The metastore stopped: the last view stays.
                *meta_change = changed.is_ok().then(|| wait_meta_change(receiver));
            } else {
                match commands.poll_recv(cx) {
                    Poll::Ready(Some(command)) => {
                        if self.meta.has_changed().unwrap_or(false) {
                            self.apply_view();
                        }
                        self.on_command(command);
                    }
                    Poll::Ready(None) => return Poll::Ready(()),
                    Poll::Pending => return Poll::Pending,
                }
            }
            self.publish();
        }
    }

    fn publish(&self) {
        let status = PartitionStatus {
            applied_index: self.view.applied_index,
            caught_up: self.view.caught_up,
            opening: self.opening.len(),
            open_failed: self.open_failed.len(),
            restart_needed: self.restart_needed.len(),
        };
        self.status.send_if_modified(|current| {
            let changed = *current != status;
            *current = status;
            changed
        });
    }

    // ---- views ----

    /// Takes the replica's latest state: every topic's partitions get a combiner and its view; the
    /// other combiners learn their name is gone.
    fn apply_view(&mut self) {
        self.view = self.meta.borrow_and_update().clone();
        let view = self.view.clone();
        let mut wanted = Vec::new();
        let (topics, _) = view.state.topics_after("", usize::MAX);
        for topic in topics {
            let name: Arc<str> = Arc::from(topic.name.as_str());
            for index in 0..topic.partitions() {
                wanted.push((name.clone(), PartitionId(index)));
            }
        }
        for (topic, partition) in wanted {
            self.ensure(&topic, partition);
        }
        let actors: Vec<ActorKey> = self.slots.keys().copied().collect();
        for actor in actors {
            let (topic, partition) = {
                let slot = &self.slots[&actor];
                (slot.topic.clone(), slot.partition)
            };
            let view = self.view_for(&topic, partition);
            if *self.slots[&actor].combiner.view() != view {
                self.feed(actor, CombinerInput::View(view));
            }
        }
    }

    /// What the replica says about one partition.
    fn view_for(&self, topic: &str, partition: PartitionId) -> TopicView {
        match self.view.state.topic(topic) {
            Some(record) if partition.0 < record.partitions() => TopicView {
                version: record.metadata_version,
                owned: record.owner_of(partition) == Some(self.node),
                frozen: false,
                live: Some(LiveTopic {
                    topic_id: Some(record.id),
                    log_dir: partition_dir(topic, record.id, partition),
                }),
            },
            // A partition the topic does not have (yet): not ours to commit.
            Some(record) => TopicView {
                version: record.metadata_version,
                owned: false,
                frozen: false,
                live: None,
            },
            // No topic: this single node owns the name, so the combiner answers the incarnation
            // refusal (or "topic not found") rather than "not owner".
            None => TopicView {
                version: 0,
                owned: true,
                frozen: false,
                live: None,
            },
        }
    }

    /// The combiner of `(topic, partition)`, created (and its log opened) if missing.
    fn ensure(&mut self, topic: &Arc<str>, partition: PartitionId) -> ActorKey {
        if let Some(actor) = self.by_name.get(&(topic.clone(), partition)) {
            return *actor;
        }
        let actor = ActorKey(self.next_actor);
        self.next_actor += 1;
        let view = self.view_for(topic, partition);
        let combiner = Combiner::new(self.template.clone(), view);
        self.by_name.insert((topic.clone(), partition), actor);
        self.slots.insert(
            actor,
            Slot {
                topic: topic.clone(),
                partition,
                combiner,
            },
        );
        self.drain(actor);
        actor
    }

    // ---- commands ----

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Commit {
                topic,
                partition,
                batch,
                reply,
            } => {
                let actor = self.ensure(&topic, partition);
                self.commits.insert(batch.id, reply);
                self.feed(actor, CombinerInput::Submit(batch));
            }
            Command::Abandon {
                topic,
                partition,
                id,
            } => {
                if let Some(actor) = self.by_name.get(&(topic, partition)).copied() {
                    self.feed(actor, CombinerInput::Abandon(id));
                }
            }
            Command::Read {
                topic,
                partition,
                offset,
                records_max,
                reply,
            } => {
                let name: Arc<str> = Arc::from(topic.name.as_str());
                let actor = self.ensure(&name, partition);
                let parked = Parked {
                    topic_id: topic.id,
                    offset,
                    records_max,
                    reply,
                };
                self.read(actor, parked);
            }
            Command::Stat {
                topic,
                partition,
                reply,
            } => {
                let stat = self.stat(&topic, partition);
                let _ = reply.send(stat);
            }
        }
    }

    fn stat(&self, topic: &TopicKey, partition: PartitionId) -> PartitionStat {
        let Some(actor) = self
            .by_name
            .get(&(Arc::from(topic.name.as_str()), partition))
        else {
            return PartitionStat::default();
        };
        let combiner = &self.slots[actor].combiner;
        match (combiner.log_topic_id(), combiner.log()) {
            (Some(Some(id)), Some(log))
                if id == topic.id
                    && !matches!(log.status(), LogStatus::Opening | LogStatus::OpenFailed) =>
            {
                let stats = log.stats();
                PartitionStat {
                    segments: stats.segments as u64,
                    oldest_offset: stats.oldest_offset,
                    next_offset: stats.next_offset,
                    high_watermark: stats.high_watermark,
                    size_bytes: stats.size_bytes,
                    oldest_segment_at_s: None,
                }
            }
            _ => PartitionStat::default(),
        }
    }

    /// Sends a read to the combiner, or parks it while the log opens.
    fn read(&mut self, actor: ActorKey, read: Parked) {
        let combiner = &self.slots[&actor].combiner;
        let live = combiner.view().live.as_ref().and_then(|live| live.topic_id);
        if live != Some(read.topic_id) {
            let _ = read
                .reply
                .send(Err(PartitionReadError::NotLive(read.topic_id)));
            return;
        }
        let opening = combiner.log_topic_id() != Some(live)
            || combiner
                .log()
                .is_some_and(|log| log.status() == LogStatus::Opening);
        if opening {
            let parked = self.parked.entry(actor).or_default();
            if parked.len() >= PARKED_READS_MAX {
                let _ = read
                    .reply
                    .send(Err(PartitionReadError::Log(ReadError::Busy)));
            } else {
                parked.push(read);
            }
            return;
        }
        let id = ReadId(self.next_read);
        self.next_read += 1;
        self.reads.insert(id, read.reply);
        let request = ReadRequest {
            id,
            offset: read.offset,
            records_max: read.records_max,
            bytes_max: REPLAY_READ_BYTES_MAX,
        };
        self.feed(actor, CombinerInput::Read(request));
    }

    /// Sends the reads parked behind `actor`'s log again (it finished opening, or went away).
    fn unpark(&mut self, actor: ActorKey) {
        let Some(parked) = self.parked.remove(&actor) else {
            return;
        };
        for read in parked {
            if self.slots.contains_key(&actor) {
                self.read(actor, read);
            } else {
                let _ = read
                    .reply
                    .send(Err(PartitionReadError::NotLive(read.topic_id)));
            }
        }
    }

    // ---- I/O ----

    fn on_io(&mut self, event: IoEvent) {
        let IoEvent {
            actor,
            request,
            completion,
        } = event;
        if completion.id.0 >= JANITOR_IO_BASE {
            return self.on_janitor(actor, request, completion);
        }
        if self.slots.contains_key(&actor) {
            // A commit's request writes its run, syncs it and reads it back (recovery reads whole
            // segments, torn tails included, and writes nothing in the same request).
            let commit = request
                .ops
                .iter()
                .any(|op| matches!(op, IoOp::WriteAt { .. }));
            let audit = (commit && self.probe.is_watched()).then(|| {
                let verified = read_back_verifies(&completion);
                (self.high_watermark(actor), verified)
            });
            self.feed(actor, CombinerInput::Io(completion));
            if let Some((before, Some(false))) = audit {
                let after = self.high_watermark(actor);
                if after > before {
                    let topic = self.slots.get(&actor).map(|slot| slot.topic.clone());
                    self.probe.violation(
                        Invariant::HighWatermarkAboveVerified,
                        format_args!(
                            "{topic:?} high watermark {before:?} -> {after:?} over a read-back that fails its checks"
                        ),
                    );
                }
            }
        }
        // Otherwise the combiner is gone, and with it whoever waited for this request.
    }

    /// The high watermark of `actor`'s log, if it has one open.
    fn high_watermark(&self, actor: ActorKey) -> Option<Offset> {
        self.slots
            .get(&actor)
            .and_then(|slot| slot.combiner.log())
            .map(|log| log.high_watermark())
    }

    // ---- the combiners ----

    fn feed(&mut self, actor: ActorKey, input: CombinerInput) {
        let now = self.clock.now();
        let Some(slot) = self.slots.get_mut(&actor) else {
            return;
        };
        slot.combiner.handle(now, input);
        self.drain(actor);
        self.drop_if_idle(actor);
    }

    /// Routes every output of one combiner, then notes its log's state and drops it if idle and gone.
    fn drain(&mut self, actor: ActorKey) {
        let mut retired = Vec::new();
        let mut log_events = false;
        // One lookup for the whole drain (outputs touch other fields only).
        let mut slot = self.slots.get_mut(&actor);
        while let Some(output) = slot.as_mut().and_then(|slot| slot.combiner.poll_output()) {
            let slot = slot.as_deref().expect("polled above");
            match output {
                CombinerOutput::Io(request) => self.executor.submit_for(actor, request),
                CombinerOutput::Committed { id, result } => {
                    if let Some(reply) = self.commits.remove(&id) {
                        let _ = reply.send(result);
                    }
                }
                CombinerOutput::ReadDone { id, result } => {
                    if let Some(reply) = self.reads.remove(&id) {
                        let _ = reply.send(result.map_err(PartitionReadError::Log));
                    }
                }
                CombinerOutput::HighWatermark { id, high_watermark } => {
                    // Only a handoff asks; nothing here does yet.
                    tracing::debug!(?id, ?high_watermark, "partition high watermark");
                }
                CombinerOutput::LogOpened { topic_id, report } => {
                    log_events = true;
                    tracing::info!(
                        topic = %slot.topic,
                        partition = %slot.partition,
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
                            topic = %slot.topic,
                            partition = %slot.partition,
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
                CombinerOutput::LogOpenFailed { topic_id, error } => {
                    log_events = true;
                    tracing::error!(
                        topic = %slot.topic,
                        partition = %slot.partition,
                        ?topic_id,
                        %error,
                        "partition log open failed"
                    );
                    self.metrics.error("storage", "partition_open").inc();
                }
                CombinerOutput::LogLatched { topic_id, fault } => {
                    tracing::error!(
                        topic = %slot.topic,
                        partition = %slot.partition,
                        ?topic_id,
                        %fault,
                        "partition log latched: commits refused until its repair succeeds"
                    );
                    self.metrics.error("storage", "partition_latched").inc();
                }
                CombinerOutput::LogRetired { topic_id, dir } => {
                    log_events = true;
                    tracing::info!(
                        topic = %slot.topic,
                        partition = %slot.partition,
                        ?topic_id,
                        dir,
                        "partition log retired; removing its files"
                    );
                    retired.push(dir);
                }
            }
        }
        for dir in retired {
            self.janitor_list(actor, dir);
        }
        self.note_log_state(actor);
        if log_events {
            self.unpark(actor);
        }
    }

    fn note_log_state(&mut self, actor: ActorKey) {
        let log = self.slots.get(&actor).and_then(|slot| slot.combiner.log());
        let status = log.map(|log| log.status());
        let sync_failed = log
            .and_then(|log| log.open_error())
            .is_some_and(|error| matches!(error, RecoveryError::Sync(_)));
        if status == Some(LogStatus::OpenFailed) && sync_failed {
            self.restart_needed.insert(actor);
        } else {
            self.restart_needed.remove(&actor);
        }
        if status == Some(LogStatus::Opening) {
            self.opening.insert(actor);
        } else {
            self.opening.remove(&actor);
        }
        if status == Some(LogStatus::OpenFailed) {
            self.open_failed.insert(actor);
        } else {
            self.open_failed.remove(&actor);
        }
    }

    /// Drops a combiner whose name the replica no longer holds once it holds nothing.
    fn drop_if_idle(&mut self, actor: ActorKey) {
        let Some(slot) = self.slots.get(&actor) else {
            return;
        };
        let combiner = &slot.combiner;
        let idle = combiner.view().live.is_none()
            && combiner.log().is_none()
            && combiner.queued_batches() == 0
            && !combiner.cycle_running()
            && !self.parked.contains_key(&actor)
            && self.view.state.topic(&slot.topic).is_none();
        if idle {
            let slot = self.slots.remove(&actor).expect("checked above");
            self.by_name.remove(&(slot.topic, slot.partition));
            self.opening.remove(&actor);
            self.open_failed.remove(&actor);
            self.restart_needed.remove(&actor);
            // Lanes still running janitor work are let go once it is done.
            if !self.janitor_pending(actor) {
                self.executor.forget(actor);
            }
        }
    }

    // ---- removing retired logs ----

    fn janitor_pending(&self, actor: ActorKey) -> bool {
        self.janitor.values().any(|(owner, _)| *owner == actor)
    }

    fn janitor_id(&mut self) -> IoId {
        let id = IoId(self.next_janitor);
        self.next_janitor += 1;
        id
    }

    /// Lists a retired log's directory on the combiner's commit lane (after its queued requests).
    fn janitor_list(&mut self, actor: ActorKey, dir: String) {
        let id = self.janitor_id();
        self.janitor.insert(id, (actor, dir.clone()));
        self.executor.submit_for(
            actor,
            IoRequest {
                id,
                lane: COMMIT_LANE,
                ops: vec![IoOp::List { dir }],
            },
        );
    }

    fn on_janitor(&mut self, actor: ActorKey, request: IoRequest, completion: IoCompletion) {
        let Some((_, dir)) = self.janitor.remove(&completion.id) else {
            return;
        };
        let listing = matches!(request.ops.first(), Some(IoOp::List { .. }));
        match (listing, completion.result) {
            (true, Ok(replies)) => {
                let names = match replies.into_iter().next() {
                    Some(IoReply::Names(names)) => names,
                    _ => Vec::new(),
                };
                let mut ops: Vec<IoOp> = names
                    .iter()
                    .map(|name| IoOp::Remove {
                        path: join(&dir, name),
                    })
                    .collect();
                ops.push(IoOp::SyncDir { dir: dir.clone() });
                let id = self.janitor_id();
                self.janitor.insert(id, (actor, dir));
                self.executor.submit_for(
                    actor,
                    IoRequest {
                        id,
                        lane: COMMIT_LANE,
                        ops,
                    },
                );
            }
            (false, Ok(_)) => tracing::info!(dir, "retired partition log removed"),
            (_, Err((index, fault))) => {
                tracing::warn!(dir, op = index, %fault, "removing a retired partition log failed; its files stay");
                self.metrics.error("storage", "retired_log_remove").inc();
            }
        }
        if !self.slots.contains_key(&actor) && !self.janitor_pending(actor) {
            self.executor.forget(actor);
        }
    }
}
