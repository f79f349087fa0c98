//! Queue-mode consume on the partitions this node owns: one [`PartitionQueue`] per partition
//! (`narad_core::consume`: leases, acks, the cursor), the records read from the partition host, and
//! the node's cursor table kept on disk (`consumers/cursors.{0,1}`).
//!
//! - **Reserve.** A consume tries its candidate partitions in a rotation (a topic's consumers are
//!   spread over its partitions), leasing the first record one has; the record is then read from the
//!   log. A read that fails gives the lease back (redelivered next), one below the oldest retained
//!   record moves the queue past what retention removed.
//! - **Long poll.** With nothing to lease, the consume waits for a commit to one of the topic's
//!   partitions here ([`CommitWakes`], fed by the partition host on every commit it answers) or for
//!   the earliest lease deadline among its candidates (an expired lease is redelivered), up to its
//!   `wait`.
//! - **The visibility boundary.** A queue leases fresh records below the high watermark it last
//!   learned, from a read or from the partition's figures, asked again only once the queue has
//!   nothing below it.
//! - **Cursors on disk.** A flush task writes the table every [`CURSOR_FLUSH_INTERVAL`] when a cursor
//!   moved (and at shutdown), so an ack is answered at once and a crash redelivers at most the acks of
//!   the last interval, plus every acked-ahead offset: at-least-once. Cursors of topic incarnations
//!   no longer live are dropped from the next flush.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use narad_core::consume::table::{CursorKey, CursorSlots, CURSOR_DIR, SLOTS};
use narad_core::consume::{HandleError, PartitionQueue, QueueLimits, ReceiptHandle, Reserve};
use narad_core::disk::{Disk, IoId, IoLane, IoOp, IoReply, IoRequest};
use narad_core::ids::{NodeId, Offset, PartitionId, TopicId};
use narad_core::partition::log::ReadFault;
use narad_core::partition::ReadError;
use narad_core::planted::{Plant, PlantedBug};
use narad_core::IoFault;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::watch;

use super::partitions::{PartitionHost, PartitionReadError};
use crate::clock::Clock;
use crate::http::{
    BoxFuture, Leased, QueueConsumer, QueueOutcome, Settle, SettleOutcome, StoredRecord, TopicKey,
};
use crate::metastore::Metastore;
use crate::metrics::Metrics;

/// How often moved cursors are written to disk.
pub const CURSOR_FLUSH_INTERVAL: Duration = Duration::from_millis(100);
/// The longest a queue-mode consume waits (`wait` is clamped to it), as Narad's `max_consume_wait`.
pub const CONSUME_WAIT_MAX: Duration = Duration::from_secs(10);
/// Reads one consume may try on one partition before it moves on (each failed read gives its lease
/// back, so a partition whose reads fail cannot hold a consume).
const READS_PER_PARTITION_MAX: usize = 4;

/// Wakes long-polling consumes when a commit makes records of a topic visible here.
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

/// Why the cursor table could not be read at start-up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("consumer cursors: {0}")]
pub struct CursorsError(pub IoFault);

struct Queue {
    queue: PartitionQueue,
    /// The high watermark last learned.
    high_watermark: Offset,
}

struct State {
    queues: BTreeMap<CursorKey, Queue>,
    /// Cursors read at start-up for partitions no consume has touched since.
    loaded: BTreeMap<CursorKey, Offset>,
    /// Where each topic's next consume starts its rotation.
    rotation: HashMap<TopicId, u32>,
    /// Nonce seeds of new queues.
    rng: ChaCha8Rng,
    /// A cursor moved since the last flush.
    dirty: bool,
}

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
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    slots: tokio::sync::Mutex<CursorSlots>,
    partitions: PartitionHost,
    metastore: Metastore,
    node: NodeId,
    disk: Arc<dyn Disk>,
    clock: Clock,
    metrics: Arc<Metrics>,
    plant: Plant,
}

impl std::fmt::Debug for Consumers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumers").finish_non_exhaustive()
    }
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

impl Consumers {
    /// Reads the cursor table (creating its slot files on a new data directory) and starts the
    /// flush task.
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
        run(
            &disk,
            vec![IoOp::CreateDirAll {
                dir: CURSOR_DIR.to_string(),
            }],
        )
        .await
        .map_err(CursorsError)?;
        let mut contents = [None, None];
        for (slot, path) in SLOTS.iter().enumerate() {
            contents[slot] = read_slot(&disk, path).await.map_err(CursorsError)?;
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
            run(&disk, ops).await.map_err(CursorsError)?;
        }
        let slots = CursorSlots::recover([contents[0].as_deref(), contents[1].as_deref()]);
        tracing::info!(
            cursors = slots.table.cursors.len(),
            seq = slots.table.seq,
            "consumer cursors loaded"
        );
        let state = State {
            queues: BTreeMap::new(),
            loaded: slots.table.cursors.clone(),
            rotation: HashMap::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            dirty: false,
        };
        let consumers = Consumers {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                slots: tokio::sync::Mutex::new(slots),
                partitions,
                metastore,
                node,
                disk,
                clock,
                metrics,
                plant,
            }),
        };
        let weak = Arc::downgrade(&consumers.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(CURSOR_FLUSH_INTERVAL).await;
                let Some(inner) = weak.upgrade() else { break };
                let _ = (Consumers { inner }).flush().await;
            }
        });
        Ok(consumers)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Writes the cursors if one moved since the last flush. A failure is logged and counted, and
    /// the next flush writes the same slot again.
    pub async fn flush(&self) -> Result<(), IoFault> {
        // One flush at a time: the slots lock is held across the write.
        let mut slots = self.inner.slots.lock().await;
        let cursors = {
            let mut state = self.state();
            if !state.dirty {
                return Ok(());
            }
            state.dirty = false;
            let view = self.inner.metastore.view();
            // Only a replica caught up with its log says which incarnations are gone: a booting one
            // lists none yet, and pruning on it would send every cursor back to 0.
            if view.caught_up {
                let live: BTreeSet<TopicId> = view
                    .state
                    .topics_after("", usize::MAX)
                    .0
                    .iter()
                    .map(|topic| topic.id)
                    .collect();
                state.loaded.retain(|(topic, _), _| live.contains(topic));
                state.queues.retain(|(topic, _), _| live.contains(topic));
            }
            let mut cursors = state.loaded.clone();
            let planted = self.inner.plant.is(PlantedBug::CursorPastLeases);
            for (key, queue) in &state.queues {
                let cursor = match planted {
                    // Planted: the leased records not yet acked are below what is stored.
                    true => queue.queue.next_fresh(),
                    false => queue.queue.cursor(),
                };
                cursors.insert(*key, cursor);
            }
            cursors
        };
        let (table, ops) = slots.flush_ops(&cursors);
        match run(&self.inner.disk, ops).await {
            Ok(_) => {
                slots.flushed(table);
                Ok(())
            }
            Err(fault) => {
                tracing::error!(%fault, "consumer cursor flush failed; retrying");
                self.inner.metrics.error("consume", "cursor_flush").inc();
                self.state().dirty = true;
                Err(fault)
            }
        }
    }

    /// Leases one record of `topic` from `candidates` (partitions owned here), waiting up to `wait`
    /// for one. `None`: nothing within the wait.
    pub async fn consume(
        &self,
        topic: &TopicKey,
        limits: QueueLimits,
        candidates: &[PartitionId],
        wait: Duration,
    ) -> Option<Leased> {
        if candidates.is_empty() {
            return None;
        }
        let clock = &self.inner.clock;
        let deadline = clock.now() + wait.min(CONSUME_WAIT_MAX);
        let mut wakes = self.inner.partitions.wakes().subscribe(&topic.name);
        loop {
            wakes.borrow_and_update();
            let start = {
                let mut state = self.state();
                let next = state.rotation.entry(topic.id).or_insert(0);
                let start = *next;
                *next = next.wrapping_add(1);
                start as usize
            };
            for index in 0..candidates.len() {
                let partition = candidates[(start + index) % candidates.len()];
                if let Some(leased) = self.try_partition(topic, limits, partition).await {
                    self.inner.metrics.consume_delivered.inc();
                    return Some(leased);
                }
            }
            let now = clock.now();
            if now >= deadline {
                return None;
            }
            let lease_end = {
                let state = self.state();
                candidates
                    .iter()
                    .filter_map(|partition| state.queues.get(&(topic.id, *partition)))
                    .filter_map(|queue| queue.queue.next_deadline())
                    .min()
            };
            let until = lease_end.map_or(deadline, |end| end.min(deadline));
            let nap = until.saturating_duration_since(now);
            tokio::select! {
                _ = wakes.changed() => {}
                () = tokio::time::sleep(nap) => {}
            }
        }
    }

    /// Leases and reads one record of one partition, if it has one now.
    async fn try_partition(
        &self,
        topic: &TopicKey,
        limits: QueueLimits,
        partition: PartitionId,
    ) -> Option<Leased> {
        let key = (topic.id, partition);
        for _ in 0..READS_PER_PARTITION_MAX {
            let now = self.inner.clock.now();
            let needs_watermark = {
                let mut state = self.state();
                let queue = self.queue(&mut state, key, limits);
                !queue.queue.has_work(now, queue.high_watermark)
            };
            if needs_watermark {
                let stat = self.inner.partitions.stat(topic, partition).await;
                let mut state = self.state();
                let queue = self.queue(&mut state, key, limits);
                queue.high_watermark = queue.high_watermark.max(stat.high_watermark);
                if stat.oldest_offset > queue.queue.cursor() {
                    queue.queue.skip_below(stat.oldest_offset);
                    state.dirty = true;
                }
            }
            let (offset, nonce) = {
                let now = self.inner.clock.now();
                let mut state = self.state();
                let queue = self.queue(&mut state, key, limits);
                match queue.queue.reserve(now, queue.high_watermark) {
                    Reserve::Leased {
                        offset,
                        nonce,
                        redelivery,
                        ..
                    } => {
                        if redelivery {
                            self.inner.metrics.consume_redelivered.inc();
                        }
                        (offset, nonce)
                    }
                    Reserve::Empty | Reserve::Full => return None,
                }
            };
            let read = self
                .inner
                .partitions
                .read(topic, partition, offset, 1)
                .await;
            let mut state = self.state();
            let queue = self.queue(&mut state, key, limits);
            match read {
                Ok(batch) if batch.first == offset && !batch.records.is_empty() => {
                    queue.high_watermark = queue.high_watermark.max(batch.high_watermark);
                    let record = batch.records.into_iter().next().expect("not empty");
                    return Some(Leased {
                        partition,
                        record: StoredRecord {
                            offset,
                            key: record.key,
                            payload: record.payload,
                            committed_at_ms: record.committed_at_ms,
                        },
                        handle: ReceiptHandle {
                            partition,
                            offset,
                            nonce,
                        },
                    });
                }
                Err(PartitionReadError::Log(ReadError::BelowOldestRetained { oldest, .. })) => {
                    queue.queue.skip_below(oldest);
                    state.dirty = true;
                }
                Err(PartitionReadError::Log(ReadError::Unreadable {
                    reason: reason @ (ReadFault::Damaged(_) | ReadFault::Skipped),
                    ..
                })) => {
                    // Damaged bytes never heal (a replay answers 410 there): passed over, or the
                    // queue would stop at them. A disk's read error is retried instead, below.
                    queue.queue.discard(offset, nonce);
                    state.dirty = true;
                    drop(state);
                    tracing::error!(topic = %topic.name, %partition, %offset, %reason, "queue-mode consume passes over a damaged record");
                    self.inner
                        .metrics
                        .error("messaging", "consume_damaged")
                        .inc();
                }
                Err(PartitionReadError::Log(ReadError::AtOrPastHighWatermark {
                    high_watermark,
                    ..
                })) => {
                    // The watermark learned was another incarnation's, or ran ahead of a log that
                    // reopened: believe the log.
                    queue.queue.release(offset, nonce);
                    queue.high_watermark = high_watermark;
                    return None;
                }
                other => {
                    queue.queue.release(offset, nonce);
                    drop(state);
                    tracing::warn!(topic = %topic.name, %partition, %offset, result = ?other.err(), "queue-mode read failed; the lease is given back");
                    self.inner.metrics.error("messaging", "consume").inc();
                    return None;
                }
            }
        }
        None
    }

    /// The queue of `key`, made on first use from the loaded cursor (or 0); its limits refreshed.
    fn queue<'s>(
        &self,
        state: &'s mut State,
        key: CursorKey,
        limits: QueueLimits,
    ) -> &'s mut Queue {
        let State {
            queues,
            loaded,
            rng,
            ..
        } = state;
        let queue = queues.entry(key).or_insert_with(|| {
            let cursor = loaded.remove(&key).unwrap_or_default();
            Queue {
                queue: PartitionQueue::new(limits, cursor, rng.random()),
                high_watermark: cursor,
            }
        });
        if queue.queue.limits() != limits {
            queue.queue.set_limits(limits);
        }
        queue
    }

    /// Acks, extends or nacks the lease `handle` of `topic`.
    pub fn settle(
        &self,
        topic: &TopicKey,
        handle: ReceiptHandle,
        action: Settle,
    ) -> Result<(), HandleError> {
        let now = self.inner.clock.now();
        let mut state = self.state();
        let queue = state
            .queues
            .get_mut(&(topic.id, handle.partition))
            .ok_or(HandleError::Stale)?;
        let before = queue.queue.cursor();
        let result = queue.queue.settle(now, handle.offset, handle.nonce, action);
        if queue.queue.cursor() != before {
            state.dirty = true;
        }
        let metrics = &self.inner.metrics;
        match (&result, action) {
            (Ok(()), Settle::Ack) => metrics.consume_acked.inc(),
            (Ok(()), Settle::Nack) => metrics.consume_nacked.inc(),
            _ => 0,
        };
        if result.is_ok() && action == Settle::Nack {
            drop(state);
            // A nacked record is redelivered at once: wake a waiting consume.
            self.inner.partitions.wakes().wake(&topic.name);
        }
        result
    }

    /// The clock leases are timed on.
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// The cursor of one partition's queue, as a restart would resume it (tests and figures).
    pub fn cursor(&self, topic: TopicId, partition: PartitionId) -> Option<Offset> {
        let state = self.state();
        state
            .queues
            .get(&(topic, partition))
            .map(|queue| queue.queue.cursor())
            .or_else(|| state.loaded.get(&(topic, partition)).copied())
    }
}

impl Consumers {
    /// The partitions of `topic` this node owns now (all of `partitions` that the replica assigns
    /// here), in index order.
    pub fn owned(&self, topic: &TopicKey, partitions: u32) -> Vec<PartitionId> {
        let view = self.inner.metastore.view();
        let Some(record) = view.state.topic(&topic.name).filter(|t| t.id == topic.id) else {
            return Vec::new();
        };
        (0..partitions)
            .map(PartitionId)
            .filter(|partition| record.owner_of(*partition) == Some(self.inner.node))
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
        let outcome = match Consumers::settle(self, topic, handle, action) {
            Ok(()) => SettleOutcome::Done,
            Err(HandleError::Stale) => SettleOutcome::Stale,
            Err(HandleError::AckedAheadFull) => SettleOutcome::AckedAheadFull,
        };
        Box::pin(std::future::ready(outcome))
    }
}
