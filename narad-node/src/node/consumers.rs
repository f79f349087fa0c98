//! Queue-mode consume on the partitions this node owns: the [`ConsumeActor`]
//! (`narad_core::consume::actor`: every partition queue, the rotation, the high watermarks learned,
//! read outcomes, long-poll wakes, cursor flushes and pruning) run on the generic host, and the handle
//! callers use ([`Consumers`]: the HTTP seam, and the peers' forwarded calls). The node's cursor
//! table lives on disk in `consumers/cursors.{0,1}`.
//!
//! The actor has a host of its own beside the partition host rather than living inside that host's
//! value: it reaches the logs through [`PartitionHost`]'s reads and figures exactly as a replay read
//! does (parked reads included), and its calls, waits and cursor writes stay off the owner's commit
//! path, so neither host routes the other's inputs.
//!
//! The host decides nothing: a caller's command becomes an input; each output becomes a read or a
//! stat of the partition host, a cursor-table write, a watch on [`super::partitions::CommitWakes`],
//! an answer, or a log line and a counter; each result comes back as an input. Before a tick or a
//! flush, the replica's live topics are fed if they changed.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use narad_core::codec::cluster::{LeasedRecord, QueueHandoff};
use narad_core::consume::actor::{
    CallId, ConsumeActor, ConsumeConfig, ConsumeEvent, ConsumeInput, ConsumeOutput, HandoffPending,
    QueueTopic,
};
use narad_core::consume::table::{CursorKey, CursorSlots, CURSOR_DIR, SLOTS};
use narad_core::consume::{HandleError, QueueLimits, ReceiptHandle};
use narad_core::disk::{Disk, IoId, IoLane, IoOp, IoReply, IoRequest};
use narad_core::ids::{NodeId, PartitionId};
use narad_core::planted::Plant;
use narad_core::{Actor, Instant, IoFault};
use tokio::sync::{mpsc, oneshot, watch};

use super::partitions::PartitionHost;
use crate::clock::Clock;
use crate::host::{self, HostConfig, Hosted, Turn};
use crate::http::{
    BoxFuture, Leased, QueueConsumer, QueueOutcome, Settle, SettleOutcome, TopicKey,
};
use crate::metastore::{MetaView, Metastore};
use crate::metrics::Metrics;

pub use narad_core::consume::actor::{CONSUME_WAIT_MAX, CURSOR_FLUSH_INTERVAL};

/// Commands the host's mailbox holds before callers wait.
pub const MAILBOX_CAPACITY: usize = 4096;

/// Why the cursor table could not be read at start-up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("consumer cursors: {0}")]
pub struct CursorsError(pub IoFault);

/// What [`Consumers::open`] needs.
pub struct ConsumersSetup {
    /// The data directory (the cursor table lives under `consumers/`).
    pub disk: Arc<dyn Disk>,
    /// Where records are read and commits announced.
    pub partitions: PartitionHost,
    /// Who owns what, and which topic incarnations live.
    pub metastore: Metastore,
    /// This node.
    pub node: NodeId,
    /// Leases are timed on it.
    pub clock: Clock,
    /// The node's metrics.
    pub metrics: Arc<Metrics>,
    /// Seeds the queues' nonces.
    pub seed: u64,
    /// The bug planted (the simulator only).
    pub plant: Plant,
}

/// The node's queue-mode consume; clones share it.
#[derive(Clone)]
pub struct Consumers {
    commands: mpsc::Sender<Command>,
    next_call: Arc<AtomicU64>,
    metastore: Metastore,
    node: NodeId,
    clock: Clock,
}

impl std::fmt::Debug for Consumers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumers").finish_non_exhaustive()
    }
}

enum Command {
    Consume {
        call: CallId,
        topic: QueueTopic,
        limits: QueueLimits,
        candidates: Vec<PartitionId>,
        wait: Duration,
        reply: oneshot::Sender<Option<LeasedRecord>>,
    },
    Abandon {
        call: CallId,
    },
    Settle {
        call: CallId,
        topic: QueueTopic,
        handle: ReceiptHandle,
        action: Settle,
        reply: oneshot::Sender<Result<(), HandleError>>,
    },
    Flush {
        call: CallId,
        reply: oneshot::Sender<Result<(), IoFault>>,
    },
    /// A move's queue handoff (`ConsumeInput::Hold`, `Adopt`, `Handoff`).
    Move(MoveQueue),
}

/// A move's queue-mode step; see [`Consumers::hold`], [`Consumers::adopt`], [`Consumers::handoff`].
type HandoffReply = oneshot::Sender<Result<Option<QueueHandoff>, HandoffPending>>;

enum MoveQueue {
    Hold(CursorKey, u64),
    Adopt(CursorKey, u64, Option<QueueHandoff>),
    Handoff(CallId, CursorKey, HandoffReply),
}

/// What comes back to the host.
enum Event {
    /// A partition's figures, for a call.
    Stat {
        call: CallId,
        stat: narad_core::codec::cluster::PartitionStat,
    },
    /// A record read, for a call.
    Read {
        call: CallId,
        result: Result<narad_core::partition::ReadBatch, narad_core::partition::PartitionReadError>,
    },
    /// A commit to `topic` was answered (`open`: the watch still stands); the receiver comes back
    /// so a watch asked again misses no commit in between.
    Committed {
        topic: Arc<str>,
        receiver: watch::Receiver<u64>,
        open: bool,
    },
    /// The cursor table's write finished.
    Stored(narad_core::disk::IoCompletion),
}

/// Runs one request of ops on the disk; the first failure ends it.
async fn run(disk: &Arc<dyn Disk>, ops: Vec<IoOp>) -> Result<Vec<IoReply>, IoFault> {
    let request = IoRequest {
        id: IoId(0),
        lane: IoLane(0),
        ops,
    };
    let (_, completion) = crate::io::run_request(Arc::clone(disk), request).await;
    completion.result.map_err(|(_, fault)| fault)
}

/// Reads one slot file whole; `None` when it is missing or empty.
async fn read_slot(disk: &Arc<dyn Disk>, path: &str) -> Result<Option<Vec<u8>>, IoFault> {
    let replies = run(
        disk,
        vec![IoOp::Len {
            path: path.to_string(),
        }],
    )
    .await;
    let len = match replies.as_deref() {
        Ok([IoReply::Len(len)]) => *len,
        Ok(other) => return Err(IoFault::Other(format!("unexpected reply {other:?}"))),
        Err(IoFault::NotFound) => return Ok(None),
        Err(fault) => return Err(fault.clone()),
    };
    if len == 0 {
        return Ok(None);
    }
    let replies = run(
        disk,
        vec![IoOp::ReadAt {
            path: path.to_string(),
            offset: 0,
            len: usize::try_from(len).unwrap_or(usize::MAX),
        }],
    )
    .await?;
    match replies.into_iter().next() {
        Some(IoReply::Data(bytes)) => Ok(Some(bytes)),
        other => Err(IoFault::Other(format!("unexpected reply {other:?}"))),
    }
}

/// Reads the cursor table, creating its slot files on a new data directory.
async fn load_slots(disk: &Arc<dyn Disk>) -> Result<CursorSlots, IoFault> {
    run(
        disk,
        vec![IoOp::CreateDirAll {
            dir: CURSOR_DIR.to_string(),
        }],
    )
    .await?;
    let mut contents = [None, None];
    for (slot, path) in SLOTS.iter().enumerate() {
        contents[slot] = read_slot(disk, path).await?;
    }
    let missing: Vec<IoOp> = SLOTS
        .iter()
        .zip(&contents)
        .filter(|(_, content)| content.is_none())
        .map(|(path, _)| IoOp::Create {
            path: path.to_string(),
        })
        .collect();
    if !missing.is_empty() {
        let mut ops = missing;
        ops.push(IoOp::SyncDir {
            dir: CURSOR_DIR.to_string(),
        });
        run(disk, ops).await?;
    }
    Ok(CursorSlots::recover([
        contents[0].as_deref(),
        contents[1].as_deref(),
    ]))
}

/// Sends `Abandon` for a consume whose caller stopped waiting before the answer.
struct AbandonGuard<'a> {
    commands: &'a mpsc::Sender<Command>,
    call: CallId,
    armed: bool,
}

impl Drop for AbandonGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: a full mailbox loses the notice; the answer then finds no caller and
            // its lease is given back.
            let _ = self.commands.try_send(Command::Abandon { call: self.call });
        }
    }
}

fn queue_topic(topic: &TopicKey) -> QueueTopic {
    QueueTopic {
        name: Arc::from(topic.name.as_str()),
        id: topic.id,
    }
}

impl Consumers {
    /// Reads the cursor table (creating its slot files on a new data directory) and starts the
    /// host.
    pub async fn open(setup: ConsumersSetup) -> Result<Consumers, CursorsError> {
        let ConsumersSetup {
            disk,
            partitions,
            metastore,
            node,
            clock,
            metrics,
            seed,
            plant,
        } = setup;
        let slots = load_slots(&disk).await.map_err(CursorsError)?;
        tracing::info!(
            cursors = slots.table.cursors.len(),
            seq = slots.table.seq,
            "consumer cursors loaded"
        );
        let config = ConsumeConfig {
            nonce_seed: seed,
            plant,
        };
        let actor = ConsumeActor::new(config, slots, clock.now());
        let meta = metastore.subscribe();
        let host_config = HostConfig {
            mailbox_capacity: MAILBOX_CAPACITY,
            // No I/O executor: the cursor writes come back as answers.
            completions_capacity: 1,
        };
        let commands = host::spawn(host_config, clock.clone(), move |_completions| Host {
            actor,
            partitions,
            disk,
            meta,
            metrics,
            consumes: HashMap::new(),
            settles: HashMap::new(),
            flushes: HashMap::new(),
            handoffs: HashMap::new(),
            fired: HashMap::new(),
            stopped: false,
        });
        Ok(Consumers {
            commands,
            next_call: Arc::new(AtomicU64::new(0)),
            metastore,
            node,
            clock,
        })
    }

    fn call_id(&self) -> CallId {
        CallId(self.next_call.fetch_add(1, Ordering::Relaxed))
    }

    /// Writes the cursors if one moved since the last flush. A failure is logged and counted, and
    /// the next flush writes the same slot again.
    pub async fn flush(&self) -> Result<(), IoFault> {
        let (reply, answer) = oneshot::channel();
        let command = Command::Flush {
            call: self.call_id(),
            reply,
        };
        let stopped = || IoFault::Other("the consume host has stopped".to_string());
        crate::mailbox::send(&self.commands, command)
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Leases one record of `topic` from `candidates` (partitions owned here), waiting up to `wait`
    /// for one. `None`: nothing within the wait. Dropping the future before the answer tells the
    /// actor the caller gave up.
    pub async fn consume(
        &self,
        topic: &TopicKey,
        limits: QueueLimits,
        candidates: &[PartitionId],
        wait: Duration,
    ) -> Option<Leased> {
        let call = self.call_id();
        let (reply, answer) = oneshot::channel();
        let command = Command::Consume {
            call,
            topic: queue_topic(topic),
            limits,
            candidates: candidates.to_vec(),
            wait,
            reply,
        };
        crate::mailbox::send(&self.commands, command).await.ok()?;
        let mut guard = AbandonGuard {
            commands: &self.commands,
            call,
            armed: true,
        };
        let leased = answer.await.ok().flatten();
        guard.armed = false;
        leased.map(|leased| Leased {
            partition: leased.handle.partition,
            record: leased.record,
            handle: leased.handle,
        })
    }

    /// Acks, extends or nacks the lease `handle` of `topic`.
    pub async fn settle(
        &self,
        topic: &TopicKey,
        handle: ReceiptHandle,
        action: Settle,
    ) -> Result<(), HandleError> {
        let (reply, answer) = oneshot::channel();
        let command = Command::Settle {
            call: self.call_id(),
            topic: queue_topic(topic),
            handle,
            action,
            reply,
        };
        // A stopped host holds no lease.
        crate::mailbox::send(&self.commands, command)
            .await
            .map_err(|_| HandleError::Stale)?;
        answer.await.unwrap_or(Err(HandleError::Stale))
    }

    /// A partition is moving here by the move of placement `epoch`: its records are not served
    /// until [`Consumers::adopt`] of that epoch.
    pub async fn hold(&self, key: CursorKey, epoch: u64) {
        let command = Command::Move(MoveQueue::Hold(key, epoch));
        let _ = crate::mailbox::send(&self.commands, command).await;
    }

    /// A partition moved here by the move of `epoch`: its queue resumes from `state` (`None`:
    /// from what this node holds). Nothing happens unless the partition is held for `epoch`.
    pub async fn adopt(&self, key: CursorKey, epoch: u64, state: Option<QueueHandoff>) {
        let command = Command::Move(MoveQueue::Adopt(key, epoch, state));
        let _ = crate::mailbox::send(&self.commands, command).await;
    }

    /// A partition moved away: its queue is let go; what it held (`None`: nothing, or stopped;
    /// `Err` while its own queue state has not arrived here: ask again).
    pub async fn handoff(&self, key: CursorKey) -> Result<Option<QueueHandoff>, HandoffPending> {
        let (reply, answer) = oneshot::channel();
        let command = Command::Move(MoveQueue::Handoff(self.call_id(), key, reply));
        if crate::mailbox::send(&self.commands, command).await.is_err() {
            return Ok(None);
        }
        answer.await.unwrap_or(Ok(None))
    }

    /// The clock leases are timed on.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The partitions of `topic` this node owns now (all of `partitions` that the replica assigns
    /// here), in index order.
    pub fn owned(&self, topic: &TopicKey, partitions: u32) -> Vec<PartitionId> {
        let view = self.metastore.view();
        let Some(record) = view.state.topic(&topic.name).filter(|t| t.id == topic.id) else {
            return Vec::new();
        };
        (0..partitions)
            .map(PartitionId)
            .filter(|partition| record.owner_of(*partition) == Some(self.node))
            .collect()
    }
}

impl QueueConsumer for Consumers {
    fn consume(
        &self,
        topic: &TopicKey,
        limits: QueueLimits,
        partitions: u32,
        pinned: Option<PartitionId>,
        wait: Duration,
    ) -> BoxFuture<'_, QueueOutcome> {
        let topic = topic.clone();
        Box::pin(async move {
            let candidates = match pinned {
                Some(partition) => vec![partition],
                None => self.owned(&topic, partitions),
            };
            match Consumers::consume(self, &topic, limits, &candidates, wait).await {
                Some(leased) => QueueOutcome::Leased(leased),
                None => QueueOutcome::Empty,
            }
        })
    }

    fn settle(
        &self,
        topic: &TopicKey,
        handle: ReceiptHandle,
        action: Settle,
    ) -> BoxFuture<'_, SettleOutcome> {
        let topic = topic.clone();
        Box::pin(async move {
            match Consumers::settle(self, &topic, handle, action).await {
                Ok(()) => SettleOutcome::Done,
                Err(HandleError::Stale) => SettleOutcome::Stale,
                Err(HandleError::AckedAheadFull) => SettleOutcome::AckedAheadFull,
            }
        })
    }
}

/// The host task's state.
struct Host {
    actor: ConsumeActor,
    partitions: PartitionHost,
    disk: Arc<dyn Disk>,
    meta: watch::Receiver<Arc<MetaView>>,
    metrics: Arc<Metrics>,
    /// The callers of consumes in progress, with their topic (an answer that cannot be handed over
    /// gives its lease back).
    consumes: HashMap<
        CallId,
        (
            narad_core::ids::TopicId,
            oneshot::Sender<Option<LeasedRecord>>,
        ),
    >,
    settles: HashMap<CallId, oneshot::Sender<Result<(), HandleError>>>,
    flushes: HashMap<CallId, oneshot::Sender<Result<(), IoFault>>>,
    handoffs: HashMap<CallId, HandoffReply>,
    /// Commit watches that fired in the current call, until the actor asks for them again.
    fired: HashMap<Arc<str>, watch::Receiver<u64>>,
    /// Every handle on the mailbox is gone.
    stopped: bool,
}

impl Hosted for Host {
    type Command = Command;
    type Completion = Event;

    fn on_start(&mut self, turn: &mut Turn<'_, Event>) {
        self.feed_live_topics(turn);
    }

    fn on_commands(&mut self, turn: &mut Turn<'_, Event>, commands: &mut VecDeque<Command>) {
        for command in commands.drain(..) {
            let input = match command {
                Command::Consume {
                    call,
                    topic,
                    limits,
                    candidates,
                    wait,
                    reply,
                } => {
                    self.consumes.insert(call, (topic.id, reply));
                    ConsumeInput::Consume {
                        call,
                        topic,
                        limits,
                        candidates,
                        wait,
                    }
                }
                Command::Abandon { call } => {
                    self.consumes.remove(&call);
                    ConsumeInput::Abandon { call }
                }
                Command::Settle {
                    call,
                    topic,
                    handle,
                    action,
                    reply,
                } => {
                    self.settles.insert(call, reply);
                    ConsumeInput::Settle {
                        call,
                        topic,
                        handle,
                        action,
                    }
                }
                Command::Flush { call, reply } => {
                    self.flushes.insert(call, reply);
                    self.feed_live_topics_if_changed(turn);
                    ConsumeInput::Flush { call }
                }
                Command::Move(MoveQueue::Hold(key, epoch)) => ConsumeInput::Hold { key, epoch },
                Command::Move(MoveQueue::Adopt(key, epoch, state)) => {
                    ConsumeInput::Adopt { key, epoch, state }
                }
                Command::Move(MoveQueue::Handoff(call, key, reply)) => {
                    self.handoffs.insert(call, reply);
                    ConsumeInput::Handoff { call, key }
                }
            };
            self.feed(turn, input);
        }
    }

    fn on_mailbox_closed(&mut self, _turn: &mut Turn<'_, Event>) {
        self.stopped = true;
    }

    fn on_completion(&mut self, turn: &mut Turn<'_, Event>, event: Event) {
        let input = match event {
            Event::Stat { call, stat } => ConsumeInput::StatDone { call, stat },
            Event::Read { call, result } => ConsumeInput::ReadDone { call, result },
            Event::Committed {
                topic,
                receiver,
                open,
            } => {
                if open {
                    self.fired.insert(topic.clone(), receiver);
                }
                ConsumeInput::Committed { topic }
            }
            Event::Stored(completion) => ConsumeInput::StoreDone(completion),
        };
        self.feed(turn, input);
        // Watches the actor did not ask for again end here.
        self.fired.clear();
    }

    fn on_timeout(&mut self, turn: &mut Turn<'_, Event>) {
        self.feed_live_topics_if_changed(turn);
        self.feed(turn, ConsumeInput::Tick);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.actor.poll_timeout()
    }

    fn finished(&self) -> bool {
        self.stopped
    }
}

impl Host {
    /// Feeds the live topic incarnations when the replica changed since they were last fed.
    fn feed_live_topics_if_changed(&mut self, turn: &mut Turn<'_, Event>) {
        if self.meta.has_changed().unwrap_or(false) {
            self.feed_live_topics(turn);
        }
    }

    /// Feeds the live topic incarnations of the replica's latest state.
    fn feed_live_topics(&mut self, turn: &mut Turn<'_, Event>) {
        let view = self.meta.borrow_and_update().clone();
        let live: BTreeSet<_> = view
            .state
            .topics_after("", usize::MAX)
            .0
            .iter()
            .map(|topic| topic.id)
            .collect();
        let caught_up = view.caught_up;
        self.feed(turn, ConsumeInput::LiveTopics { caught_up, live });
    }

    /// Feeds the actor one input and carries out everything it asks for.
    fn feed(&mut self, turn: &mut Turn<'_, Event>, input: ConsumeInput) {
        let mut inputs = VecDeque::from([input]);
        while let Some(input) = inputs.pop_front() {
            narad_core::feed(&mut self.actor, turn.now(), input);
            while let Some(output) = self.actor.poll_output() {
                if let Some(input) = self.carry_out(turn, output) {
                    inputs.push_back(input);
                }
            }
        }
    }

    /// Carries out one output; an answer that found no caller comes back as an input.
    fn carry_out(
        &mut self,
        turn: &mut Turn<'_, Event>,
        output: ConsumeOutput,
    ) -> Option<ConsumeInput> {
        match output {
            ConsumeOutput::Stat {
                call,
                topic,
                partition,
            } => {
                let partitions = self.partitions.clone();
                let key = topic_key(&topic);
                turn.answer_later(async move {
                    let stat = partitions.stat(&key, partition).await;
                    Event::Stat { call, stat }
                });
            }
            ConsumeOutput::Read {
                call,
                topic,
                partition,
                offset,
            } => {
                let partitions = self.partitions.clone();
                let key = topic_key(&topic);
                turn.answer_later(async move {
                    let result = partitions.read(&key, partition, offset, 1).await;
                    Event::Read { call, result }
                });
            }
            ConsumeOutput::WatchCommits { topic } => {
                let mut receiver = match self.fired.remove(&topic) {
                    Some(receiver) => receiver,
                    None => self.partitions.wakes().subscribe(&topic),
                };
                turn.answer_later(async move {
                    let open = receiver.changed().await.is_ok();
                    Event::Committed {
                        topic,
                        receiver,
                        open,
                    }
                });
            }
            ConsumeOutput::Consumed { call, leased } => {
                let (topic, reply) = self.consumes.remove(&call)?;
                if let Err(Some(leased)) = reply.send(leased) {
                    return Some(ConsumeInput::Undelivered {
                        topic,
                        handle: leased.handle,
                    });
                }
            }
            ConsumeOutput::Settled { call, result } => {
                if let Some(reply) = self.settles.remove(&call) {
                    let _ = reply.send(result);
                }
            }
            ConsumeOutput::StoreCursors(request) => {
                let disk = Arc::clone(&self.disk);
                turn.answer_later(async move {
                    let (_, completion) = crate::io::run_request(disk, request).await;
                    Event::Stored(completion)
                });
            }
            ConsumeOutput::Flushed { call, result } => {
                if let Some(reply) = self.flushes.remove(&call) {
                    let _ = reply.send(result);
                }
            }
            ConsumeOutput::Event(event) => self.record(event),
            ConsumeOutput::HandedOff { call, state } => {
                if let Some(reply) = self.handoffs.remove(&call) {
                    let _ = reply.send(state);
                }
            }
        }
        None
    }

    fn record(&self, event: ConsumeEvent) {
        let metrics = &self.metrics;
        match event {
            ConsumeEvent::Delivered => {
                metrics.consume_delivered.inc();
            }
            ConsumeEvent::Redelivered => {
                metrics.consume_redelivered.inc();
            }
            ConsumeEvent::Acked => {
                metrics.consume_acked.inc();
            }
            ConsumeEvent::Nacked => {
                metrics.consume_nacked.inc();
            }
            ConsumeEvent::Damaged {
                topic,
                partition,
                offset,
                reason,
            } => {
                tracing::error!(topic = %topic.name, %partition, %offset, %reason, "queue-mode consume passes over a damaged record");
                metrics.error("messaging", "consume_damaged").inc();
            }
            ConsumeEvent::ReadFailed {
                topic,
                partition,
                offset,
                error,
            } => {
                tracing::warn!(topic = %topic.name, %partition, %offset, result = ?error, "queue-mode read failed; the lease is given back");
                metrics.error("messaging", "consume").inc();
            }
            ConsumeEvent::FlushFailed(fault) => {
                tracing::error!(%fault, "consumer cursor flush failed; retrying");
                metrics.error("consume", "cursor_flush").inc();
            }
        }
    }
}

fn topic_key(topic: &QueueTopic) -> TopicKey {
    TopicKey {
        name: topic.name.to_string(),
        id: topic.id,
    }
}
