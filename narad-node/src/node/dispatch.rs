//! The dispatcher host: runs the [`Dispatcher`] in one task and carries out its outputs (see the driver
//! protocol in `narad_core::dispatcher`). It decides nothing.
//!
//! - `ReadWal` → a read of the WAL host, answered `WalFrames` / `WalReadFailed`.
//! - `SendCommit` to the local owner → the partition host's combiner, in a task of its own that gives
//!   up at the commit's deadline (`Timeout`; the combiner is told the caller left). Combiner errors map
//!   to [`CommitFailure`]: `TopicIncarnationMismatch` → `IncarnationMismatch`, a caller that gave up →
//!   `Timeout`, everything else → `Error`. A remote owner cannot occur on a single node: it is answered
//!   `Error(Unreachable)` at once.
//! - `StoreCheckpoint` → the checkpointer (through the WAL host), answered once written in place.
//! - `ConfirmTopicGone` → the local replica once it is caught up: on a single voter (the leader) a read
//!   after its applied index is the barrier.
//! - `Warn` → `tracing::warn!` with the spec's text and the warning's fields.
//!
//! Inputs it feeds besides the answers: `Durable` on every advance of the WAL's durable frontier,
//! `Topic` for every topic whose view changed in the replica, `Member` (this node alive, and every other
//! member as the replica lists it), and `Tick` at the dispatcher's timeout. After every turn it
//! publishes the gauges it alone knows (backlog bytes, oldest undispatched age, reroutes); the backlog
//! records gauge is read from the WAL host at scrape time (durable end minus the written checkpoint),
//! so it is never behind a 202.
//!
//! Metrics at partition commit: `messages_produced_total` / `bytes_produced_total` per partition, the
//! commit latency and, per record, accept→visible: from the monotonic instant the record's group commit
//! answered its caller (its 202; [`crate::accept_times`]) to the instant the partition commit's answer
//! makes it visible, on the node's clock. Records with no 202 instant (recovered at start-up) are not
//! observed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use narad_core::dispatcher::{
    CommitError, CommitFailure, CommitOwner, DispatchWarning, Dispatcher, DispatcherConfig,
    DispatcherInput, DispatcherOutput, LeaderView, ReadWal, SendCommit, TopicView,
};
use narad_core::ids::NodeId;
use narad_core::partition::{self, BatchRecord, CommitFault};
use narad_core::wal::ReadError as WalReadFailure;
use narad_core::{Actor, IoFault, Seq};
use tokio::sync::{mpsc, watch};

use super::partitions::{PartitionCommitError, PartitionHost};
use super::NodeHooks;
use crate::clock::{self, Clock};
use crate::metastore::{MetaView, Metastore};
use crate::metrics::{Metrics, PartitionLabels};
use crate::probe::{Invariant, Probe};
use crate::wal_host::{StoreError, WalHost, WalReadError, WalStatus};

/// Answers the host's helper tasks may queue before they wait.
pub const EVENTS_CAPACITY: usize = 1024;

/// A handle on the running dispatcher host.
#[derive(Debug)]
pub struct DispatchHost {
    stop: watch::Sender<bool>,
    done: watch::Receiver<bool>,
}

impl DispatchHost {
    /// Starts the dispatcher at the WAL's recovered checkpoint and durable end.
    pub fn spawn(
        node: NodeId,
        wal: WalHost,
        partitions: PartitionHost,
        metastore: Metastore,
        clock: Clock,
        metrics: Arc<Metrics>,
        hooks: &NodeHooks,
    ) -> DispatchHost {
        let status = wal.status();
        let config = DispatcherConfig {
            node,
            checkpoint: status.dispatch_start,
            durable_next: status.durable_next_seq,
            plant: hooks.plant,
        };
        tracing::info!(
            checkpoint = %config.checkpoint,
            durable_next = %config.durable_next,
            "ingress dispatch starting; replaying undispatched records"
        );
        let (events_tx, events) = mpsc::channel(EVENTS_CAPACITY);
        let (stop, stop_rx) = watch::channel(false);
        let (done_tx, done) = watch::channel(false);
        let host = Host {
            node,
            dispatcher: Dispatcher::new(config),
            wal_status: wal.subscribe(),
            wal,
            partitions,
            meta: metastore.subscribe(),
            metastore,
            clock,
            metrics,
            events_tx,
            durable_fed: status.durable_next_seq,
            topics: BTreeMap::new(),
            members: BTreeSet::new(),
            reroutes_published: 0,
            probe: hooks.probe.clone(),
        };
        tokio::spawn(async move {
            host.run(events, stop_rx).await;
            let _ = done_tx.send(true);
        });
        DispatchHost { stop, done }
    }

    /// Stops the dispatcher (commits in flight are left to finish or fail on their own; whatever they
    /// carried is replayed from the checkpoint at the next start).
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let mut done = self.done.clone();
        let _ = done.wait_for(|done| *done).await;
    }
}

/// An answer from a helper task.
type Event = DispatcherInput;

struct Host {
    node: NodeId,
    dispatcher: Dispatcher,
    wal: WalHost,
    wal_status: watch::Receiver<WalStatus>,
    partitions: PartitionHost,
    metastore: Metastore,
    meta: watch::Receiver<Arc<MetaView>>,
    clock: Clock,
    metrics: Arc<Metrics>,
    events_tx: mpsc::Sender<Event>,
    /// The durable frontier last fed.
    durable_fed: Seq,
    /// The topic views last fed, by name.
    topics: BTreeMap<String, TopicView>,
    /// Members last fed alive.
    members: BTreeSet<NodeId>,
    reroutes_published: u64,
    /// Events and broken invariants go here (see [`crate::probe`]).
    probe: Probe,
}

impl Host {
    async fn run(mut self, mut events: mpsc::Receiver<Event>, mut stop: watch::Receiver<bool>) {
        self.feed(DispatcherInput::Member {
            node: self.node,
            alive: true,
        });
        self.members.insert(self.node);
        self.on_meta();
        self.on_wal_status();
        let mut timer = clock::WakeTimer::at(self.clock.to_tokio(self.clock.now()));
        // Moved only when the wake-up changes, not re-registered every turn.
        let mut armed = None;
        // False once the metastore stopped: the last view stays.
        let mut following = true;
        loop {
            self.drain();
            self.publish();
            let wake = self.dispatcher.poll_timeout();
            if wake != armed {
                if let Some(at) = wake {
                    timer.reset(self.clock.to_tokio(at));
                }
                armed = wake;
            }
            tokio::select! {
                biased;
                _ = stop.changed() => return,
                Some(event) = events.recv() => self.feed(event),
                changed = self.wal_status.changed() => {
                    if changed.is_err() {
                        return; // The WAL host stopped: nothing more becomes durable.
                    }
                    self.on_wal_status();
                }
                changed = self.meta.changed(), if following => match changed {
                    Ok(()) => self.on_meta(),
                    Err(_) => following = false,
                },
                () = &mut timer, if armed.is_some() => {
                    armed = None;
                    let now = self.clock.now();
                    if self.dispatcher.poll_timeout().is_some_and(|at| at <= now) {
                        self.feed(DispatcherInput::Tick);
                    }
                }
            }
        }
    }

    fn feed(&mut self, input: DispatcherInput) {
        if self.probe.is_watched() {
            match &input {
                DispatcherInput::CommitDone { commit_id } => self
                    .probe
                    .event("dispatch", format_args!("commit #{} done", commit_id.0)),
                DispatcherInput::CommitFailed { commit_id, failure } => self.probe.event(
                    "dispatch",
                    format_args!("commit #{} failed: {failure:?}", commit_id.0),
                ),
                _ => {}
            }
        }
        let now = self.clock.now();
        self.dispatcher.handle(now, input);
        self.drain();
    }

    fn on_wal_status(&mut self) {
        let status = self.wal_status.borrow_and_update().clone();
        self.metrics
            .ingress_wal_failed
            .set(i64::from(status.latched.is_some()));
        if status.durable_next_seq > self.durable_fed {
            self.durable_fed = status.durable_next_seq;
            self.feed(DispatcherInput::Durable {
                next_seq: status.durable_next_seq,
            });
        }
    }

    /// Feeds every topic whose view changed, and every member not fed yet.
    fn on_meta(&mut self) {
        let view = self.meta.borrow_and_update().clone();
        let (records, _) = view.state.topics_after("", usize::MAX);
        let mut current: BTreeMap<String, TopicView> = BTreeMap::new();
        for topic in records {
            current.insert(
                topic.name.clone(),
                TopicView {
                    topic_id: Some(topic.id),
                    owners: topic.owners.clone(),
                },
            );
        }
        let gone: Vec<String> = self
            .topics
            .keys()
            .filter(|name| !current.contains_key(*name))
            .cloned()
            .collect();
        for name in gone {
            self.topics.remove(&name);
            self.feed(DispatcherInput::Topic { name, view: None });
        }
        for (name, topic) in current {
            if self.topics.get(&name) != Some(&topic) {
                self.topics.insert(name.clone(), topic.clone());
                self.feed(DispatcherInput::Topic {
                    name,
                    view: Some(topic),
                });
            }
        }
        let members: Vec<NodeId> = view.state.members().keys().copied().collect();
        for node in members {
            if self.members.insert(node) {
                self.feed(DispatcherInput::Member { node, alive: true });
            }
        }
    }

    fn drain(&mut self) {
        while let Some(output) = self.dispatcher.poll_output() {
            match output {
                DispatcherOutput::ReadWal(read) => self.read_wal(read),
                DispatcherOutput::SendCommit(commit) => self.send_commit(commit),
                DispatcherOutput::StoreCheckpoint { seq } => {
                    self.audit_checkpoint(seq);
                    self.store_checkpoint(seq)
                }
                DispatcherOutput::ConfirmTopicGone { topic } => self.confirm_topic_gone(topic),
                DispatcherOutput::Warn(warning) => log_warning(&warning),
            }
        }
    }

    fn publish(&mut self) {
        let metrics = &self.metrics;
        let dispatcher = &self.dispatcher;
        metrics
            .ingress_dispatch_backlog_bytes
            .set(i64::try_from(dispatcher.backlog_bytes_read()).unwrap_or(i64::MAX));
        let age_s = dispatcher
            .oldest_undispatched_accept_ms()
            .map_or(0.0, |accepted| {
                clock::unix_ms().saturating_sub(accepted) as f64 / 1000.0
            });
        metrics
            .ingress_dispatch_oldest_record_age_seconds
            .set(age_s);
        let reroutes = dispatcher.stats().rerouted_records;
        if reroutes > self.reroutes_published {
            metrics
                .ingress_dispatch_reroutes
                .inc_by(reroutes - self.reroutes_published);
            self.reroutes_published = reroutes;
        }
    }

    fn answer_later(&self, work: impl std::future::Future<Output = Event> + Send + 'static) {
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            let event = work.await;
            // The host stopped: nobody needs the answer.
            let _ = events.send(event).await;
        });
    }

    fn read_wal(&self, read: ReadWal) {
        let wal = self.wal.clone();
        self.answer_later(async move {
            match wal.read(read.from, read.max_records, read.max_bytes).await {
                Ok(frames) => DispatcherInput::WalFrames {
                    frames: frames
                        .into_iter()
                        .map(|frame| (frame.seq, frame.payload))
                        .collect(),
                },
                Err(WalReadError::Read(WalReadFailure::Io(fault))) => {
                    DispatcherInput::WalReadFailed { fault }
                }
                Err(error) => DispatcherInput::WalReadFailed {
                    fault: IoFault::Other(error.to_string()),
                },
            }
        });
    }

    /// A checkpoint on its way to the checkpointer must not pass the first record not done.
    fn audit_checkpoint(&self, seq: Seq) {
        if !self.probe.is_watched() {
            return;
        }
        let first_not_done = self.dispatcher.checkpoint();
        if seq > first_not_done {
            self.probe.violation(
                Invariant::CheckpointPassesNotDone,
                format_args!("checkpoint {seq} stored while {first_not_done} is not done"),
            );
        }
    }

    fn store_checkpoint(&self, seq: Seq) {
        let wal = self.wal.clone();
        self.answer_later(async move {
            match wal.store_checkpoint_written(seq).await {
                Ok(()) => DispatcherInput::CheckpointStored { seq },
                Err(StoreError::Failed(failure)) => DispatcherInput::CheckpointStoreFailed {
                    seq,
                    fault: failure.fault,
                },
                Err(StoreError::Stopped) => DispatcherInput::CheckpointStoreFailed {
                    seq,
                    fault: IoFault::Other("the ingress WAL host has stopped".to_string()),
                },
            }
        });
    }

    fn confirm_topic_gone(&self, topic: String) {
        let metastore = self.metastore.clone();
        self.answer_later(async move {
            // A single voter is the leader, and its replica applies every committed entry before it
            // answers anything: once caught up, reading it is the barrier.
            let view = match metastore.wait_caught_up().await {
                Ok(()) => match metastore.view().state.topic(&topic) {
                    None => LeaderView::Absent,
                    Some(record) => LeaderView::Present {
                        topic_id: Some(record.id),
                    },
                },
                Err(_) => LeaderView::Unconfirmed,
            };
            DispatcherInput::TopicGoneAnswer { topic, view }
        });
    }

    fn send_commit(&self, commit: SendCommit) {
        let SendCommit {
            commit_id,
            topic,
            topic_id: _,
            partition,
            owner,
            records,
            with_ids,
            deadline,
        } = commit;
        self.probe.event(
            "dispatch",
            format_args!(
                "commit #{} {topic}/{partition} records={}",
                commit_id.0,
                records.len()
            ),
        );
        if let CommitOwner::Remote(node) = owner {
            tracing::error!(%node, %topic, %partition, "a remote owner on a single node: no cluster transport");
            self.answer_later(async move {
                DispatcherInput::CommitFailed {
                    commit_id,
                    failure: CommitFailure::Error(CommitError::Unreachable),
                }
            });
            return;
        }
        let partitions = self.partitions.clone();
        let clock = self.clock;
        let metrics = self.metrics.clone();
        let accept_times = Arc::clone(self.wal.accept_times());
        self.answer_later(async move {
            let started = clock.now();
            let count = records.len() as u64;
            let bytes: u64 = records
                .iter()
                .map(|record| record.payload().len() as u64)
                .sum();
            let seqs: Vec<Seq> = records.iter().map(|record| record.seq()).collect();
            let batch: Vec<BatchRecord> = records
                .iter()
                .map(|record| BatchRecord {
                    topic_id: if with_ids { record.topic_id() } else { None },
                    key: record.key().map(<[u8]>::to_vec),
                    payload: record.payload().to_vec(),
                })
                .collect();
            // The dispatcher keeps the records for a failed commit; this copy goes before the answer.
            drop(records);
            let committing = partitions.commit(topic.clone(), partition, batch, Some(deadline));
            // `timeout` (not `timeout_at`): madsim has no `timeout_at`.
            let budget = clock
                .to_tokio(deadline)
                .saturating_duration_since(clock.to_tokio(clock.now()));
            let outcome = tokio::time::timeout(budget, committing).await;
            let elapsed = clock.now().saturating_duration_since(started);
            metrics
                .ingress_dispatch_commit_duration_seconds
                .observe(elapsed.as_secs_f64());
            let failure = match outcome {
                Ok(Ok(_range)) => {
                    let labels = PartitionLabels {
                        topic: topic.to_string(),
                        partition: partition.to_string(),
                    };
                    metrics
                        .messages_produced
                        .get_or_create(&labels)
                        .inc_by(count);
                    metrics.bytes_produced.get_or_create(&labels).inc_by(bytes);
                    accept_times.observe_visible(seqs, clock.now(), |latency| {
                        metrics
                            .accept_to_visible_seconds
                            .observe(latency.as_secs_f64());
                    });
                    return DispatcherInput::CommitDone { commit_id };
                }
                Ok(Err(error)) => commit_failure(error),
                Err(_elapsed) => CommitFailure::Timeout,
            };
            if !matches!(failure, CommitFailure::IncarnationMismatch) {
                metrics.error("ingress", "dispatch_commit").inc();
            }
            DispatcherInput::CommitFailed { commit_id, failure }
        });
    }
}

/// How a combiner's refusal reads to the dispatcher.
fn commit_failure(error: PartitionCommitError) -> CommitFailure {
    use partition::CommitError as Combiner;
    let combiner = match error {
        PartitionCommitError::Combiner(error) => error,
        PartitionCommitError::Stopped => return CommitFailure::Error(CommitError::Unreachable),
    };
    match combiner {
        Combiner::TopicIncarnationMismatch { .. } => CommitFailure::IncarnationMismatch,
        Combiner::CallerGone => CommitFailure::Timeout,
        Combiner::NotOwner => CommitFailure::Error(CommitError::NotOwner),
        Combiner::TopicNotFound => CommitFailure::Error(CommitError::Status(404)),
        Combiner::Overloaded => CommitFailure::Error(CommitError::Status(503)),
        Combiner::RecordTooLarge | Combiner::EmptyBatch => {
            CommitFailure::Error(CommitError::Status(400))
        }
        Combiner::LogUnavailable(status) => CommitFailure::Error(CommitError::Storage(
            IoFault::Other(format!("partition log unavailable ({status:?})")),
        )),
        Combiner::Storage(fault) => CommitFailure::Error(CommitError::Storage(match fault {
            CommitFault::Create(fault)
            | CommitFault::Write(fault)
            | CommitFault::Sync(fault)
            | CommitFault::ReadBack(fault) => fault,
            other @ (CommitFault::NotReady(_)
            | CommitFault::Empty
            | CommitFault::RecordTooLarge
            | CommitFault::ReadBackMismatch) => IoFault::Other(other.to_string()),
        })),
    }
}

/// Logs a dispatcher warning with the spec's text and its fields.
fn log_warning(warning: &DispatchWarning) {
    let message = warning.message();
    match warning {
        DispatchWarning::DiscardedForDeletedTopic {
            topic,
            topic_id,
            partition,
            seq,
        } => tracing::warn!(topic, ?topic_id, %partition, %seq, "{message}"),
        DispatchWarning::DiscardedStaleIncarnation {
            topic,
            topic_id,
            partition,
            seq,
        } => tracing::warn!(topic, %topic_id, %partition, %seq, "{message}"),
        DispatchWarning::DiscardedQueueForDeletedTopic {
            topic,
            topic_id,
            partition,
            records,
        } => tracing::warn!(topic, ?topic_id, %partition, records, "{message}"),
        DispatchWarning::DiscardedAfterFailedCommit {
            topic,
            topic_id,
            partition,
            seq,
            error,
        } => tracing::warn!(topic, ?topic_id, %partition, %seq, %error, "{message}"),
        DispatchWarning::IncarnationRefused {
            topic,
            topic_id,
            partition,
            owner,
            records,
        } => tracing::warn!(topic, ?topic_id, %partition, ?owner, records, "{message}"),
        DispatchWarning::UndecodableRecord { seq, error } => {
            tracing::warn!(%seq, %error, "{message}")
        }
    }
}

#[cfg(test)]
mod tests {
    use narad_core::ids::TopicId;
    use narad_core::partition::{CommitError as Combiner, LogStatus};

    use super::*;

    fn mapped(error: Combiner) -> CommitFailure {
        commit_failure(PartitionCommitError::Combiner(error))
    }

    #[test]
    fn combiner_refusals_map_to_the_dispatcher_s_failures() {
        let mismatch = Combiner::TopicIncarnationMismatch {
            record_topic_id: TopicId(1),
            live_topic_id: Some(TopicId(2)),
        };
        assert_eq!(mapped(mismatch), CommitFailure::IncarnationMismatch);
        assert_eq!(mapped(Combiner::CallerGone), CommitFailure::Timeout);
        assert_eq!(
            mapped(Combiner::NotOwner),
            CommitFailure::Error(CommitError::NotOwner)
        );
        assert_eq!(
            mapped(Combiner::Storage(CommitFault::Sync(IoFault::Eio))),
            CommitFailure::Error(CommitError::Storage(IoFault::Eio))
        );
        assert_eq!(
            mapped(Combiner::LogUnavailable(LogStatus::Latched)),
            CommitFailure::Error(CommitError::Storage(IoFault::Other(
                "partition log unavailable (Latched)".to_string()
            )))
        );
        assert_eq!(
            mapped(Combiner::Overloaded),
            CommitFailure::Error(CommitError::Status(503))
        );
        assert_eq!(
            commit_failure(PartitionCommitError::Stopped),
            CommitFailure::Error(CommitError::Unreachable)
        );
    }
}
