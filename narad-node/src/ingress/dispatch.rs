//! The dispatcher's part of the ingress host: the [`Dispatcher`] runs in the WAL's task (see
//! `crate::ingress`), which hands it `Durable`, its reads and its checkpoint stores directly, with no
//! channel round trip. This part carries out the dispatcher's outputs and decides nothing:
//!
//! - `ReadWal` → a read of the WAL it shares the task with ([`WalPort::read`]), answered `WalFrames` /
//!   `WalReadFailed` as soon as the WAL answers (at once when the records are in its recent copy).
//! - `SendCommit` → the node's one [`CommitTransport`], whatever the owner, giving up at the commit's
//!   deadline (`Timeout`; dropping the transport's future tells the owner the caller left). The part's
//!   own deadlines keep the commits in flight (no timer per commit) and abort a commit once its
//!   deadline passed. The transport's typed answer is fed as it is.
//! - `StoreCheckpoint` → the checkpointer ([`WalPort::store_checkpoint`]), answered once written in
//!   place.
//! - `ConfirmTopicGone` → a ReadIndex barrier of the metastore (the leader confirms with a quorum, and
//!   this replica has applied through the confirmed index), then the local replica read again.
//! - `Warn` → `tracing::warn!` with the spec's text and the warning's fields.
//!
//! Inputs it feeds besides the answers: `Durable` on every advance of the WAL's durable frontier,
//! `Topic` for every topic whose view changed in the replica, `Member` (this node alive, and every other
//! member alive or dead as the replica's log last marked it, on every change), and `Tick` at the dispatcher's timeout. After every turn it
//! publishes the gauges it alone knows (backlog bytes, oldest undispatched age, reroutes); the backlog
//! records gauge is read from the WAL host at scrape time (durable end minus the written checkpoint),
//! so it is never behind a 202.
//!
//! Metrics at partition commit: `messages_produced_total` / `bytes_produced_total` per partition, the
//! commit latency and, per record, accept→visible: from the monotonic instant the record's group commit
//! answered its caller (its 202; [`crate::accept_times`]) to the instant the partition commit's answer
//! makes it visible, on the node's clock. Records with no 202 instant (recovered at start-up) are not
//! observed.
//!
//! Stopping ([`DispatchHost::stop`]) feeds nothing more: commits in flight are left to finish or give
//! up at their deadlines (whatever they carried is replayed from the checkpoint at the next start, a
//! duplicate the delivery contract allows), and their answers are dropped.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures_util::future::{AbortHandle, AbortRegistration, Abortable};

use narad_core::dispatcher::{
    CommitFailure, CommitId, CommitRecords, DispatchWarning, Dispatcher, DispatcherConfig,
    DispatcherInput, DispatcherOutput, LeaderView, ReadWal, SendCommit, TopicPlacement,
};
use narad_core::ids::{NodeId, PartitionId};
use narad_core::partition::CommittedRange;
use narad_core::routing::FnvBuildHasher;
use narad_core::{Actor, Instant, Seq};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;

use super::transport::CommitTransport;
use crate::accept_times::AcceptTimes;
use crate::clock::Clock;
use crate::hooks::NodeHooks;
use crate::host::Turn;
use crate::ingress::{IngressHost, WalStatus};
use crate::metastore::{MetaView, Metastore};
use crate::metrics::{Metrics, PartitionLabels};
use crate::observer::{Invariant, Observer, TraceField};

/// A handle on the dispatcher, which runs inside the WAL host's task.
#[derive(Debug)]
pub struct DispatchHost {
    wal: IngressHost,
}

impl DispatchHost {
    /// Starts the dispatcher at the WAL's recovered checkpoint and durable end, in the WAL host's task.
    pub async fn start(
        node: NodeId,
        wal: IngressHost,
        transport: Arc<dyn CommitTransport>,
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
        let part = DispatchPart {
            node,
            dispatcher: Dispatcher::new(config),
            transport,
            metastore,
            clock,
            metrics,
            deadlines: Deadlines::default(),
            durable_fed: status.durable_next_seq,
            topics: BTreeMap::new(),
            members: BTreeMap::new(),
            reroutes_published: 0,
            produced: ProducedCounters::default(),
            observer: hooks.observer.clone(),
            stopped: false,
        };
        wal.start_dispatch(Box::new(part)).await;
        DispatchHost { wal }
    }

    /// Stops the dispatcher (commits in flight are left to finish or fail on their own; whatever they
    /// carried is replayed from the checkpoint at the next start).
    pub async fn stop(&self) {
        self.wal.stop_dispatch().await;
    }
}

/// What the WAL the dispatcher shares a task with does for it.
pub(crate) trait WalPort {
    /// Reads durable records; the answer comes back as `WalFrames` or `WalReadFailed`.
    fn read(&mut self, read: ReadWal);
    /// Stores the checkpoint; the answer comes back as `CheckpointStored` or `CheckpointStoreFailed`.
    fn store_checkpoint(&mut self, seq: Seq);
    /// When each record accepted here earned its 202.
    fn accept_times(&self) -> &AcceptTimes;
}

/// An answer of the dispatcher's, on its way back through the host.
pub(crate) enum DispatchEvent {
    /// An output's answer (a leader confirmation).
    Answer(DispatcherInput),
    /// A commit's answer, with what its metrics need.
    Committed(Box<CommitReturn>),
    /// The metastore replica changed (`open`), or the metastore stopped.
    Meta {
        receiver: watch::Receiver<Arc<MetaView>>,
        open: bool,
    },
}

/// A commit come back to the dispatcher: `records` are kept only when it landed (for the
/// accept→visible observation).
pub(crate) struct CommitReturn {
    commit_id: CommitId,
    topic: Arc<str>,
    partition: PartitionId,
    count: u64,
    bytes: u64,
    started: Instant,
    answered: Instant,
    outcome: Result<CommitRecords, CommitFailure>,
}

/// The dispatcher and what carries out its outputs; see the module documentation.
pub(crate) struct DispatchPart {
    node: NodeId,
    dispatcher: Dispatcher,
    transport: Arc<dyn CommitTransport>,
    metastore: Metastore,
    clock: Clock,
    metrics: Arc<Metrics>,
    /// The deadlines of the commits in flight.
    deadlines: Deadlines,
    /// The durable frontier last fed.
    durable_fed: Seq,
    /// The topic views last fed, by name.
    topics: BTreeMap<String, TopicPlacement>,
    /// Members last fed, with the liveness fed.
    members: BTreeMap<NodeId, bool>,
    reroutes_published: u64,
    /// The produced-records series, by partition.
    produced: ProducedCounters,
    /// Events and broken invariants go here (see [`crate::observer`]).
    observer: Observer,
    /// Asked to stop: nothing more is fed; the commits in flight still give up at their deadlines.
    stopped: bool,
}

impl std::fmt::Debug for DispatchPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchPart")
            .field("node", &self.node)
            .field("stopped", &self.stopped)
            .finish_non_exhaustive()
    }
}

impl DispatchPart {
    /// The first inputs: this node alive, the replica's topics and members, the WAL's status; then
    /// the wait for the replica's next change.
    pub(crate) fn start<C: From<DispatchEvent> + Send + 'static>(
        &mut self,
        turn: &mut Turn<'_, C>,
        wal: &mut impl WalPort,
        status: &WalStatus,
    ) {
        self.feed(
            turn,
            wal,
            DispatcherInput::Member {
                node: self.node,
                alive: true,
            },
        );
        self.members.insert(self.node, true);
        let mut receiver = self.metastore.subscribe();
        let view = receiver.borrow_and_update().clone();
        self.on_meta(turn, wal, view);
        self.on_wal(turn, wal, status.durable_next_seq);
        turn.answer_later(async move { C::from(meta_change(receiver).await) });
        self.publish();
    }

    /// Stops feeding the dispatcher.
    pub(crate) fn stop(&mut self) {
        self.stopped = true;
    }

    /// When the part must wake: the dispatcher's timeout or a commit's deadline, whichever is first.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let deadline = self.deadlines.first();
        if self.stopped {
            return deadline;
        }
        match (self.dispatcher.poll_timeout(), deadline) {
            (Some(timeout), Some(deadline)) => Some(timeout.min(deadline)),
            (timeout, deadline) => timeout.or(deadline),
        }
    }

    /// Gives up the commits past their deadlines, and ticks the dispatcher if it is due.
    pub(crate) fn on_timeout<C: From<DispatchEvent> + Send + 'static>(
        &mut self,
        turn: &mut Turn<'_, C>,
        wal: &mut impl WalPort,
    ) {
        let now = turn.now();
        self.deadlines.expire(now);
        if !self.stopped && self.dispatcher.poll_timeout().is_some_and(|at| at <= now) {
            self.feed(turn, wal, DispatcherInput::Tick);
        }
    }

    /// An answer came back.
    pub(crate) fn on_event<C: From<DispatchEvent> + Send + 'static>(
        &mut self,
        turn: &mut Turn<'_, C>,
        wal: &mut impl WalPort,
        event: DispatchEvent,
    ) {
        match event {
            DispatchEvent::Answer(input) => self.feed(turn, wal, input),
            DispatchEvent::Committed(answer) => self.on_committed(turn, wal, *answer),
            // The metastore stopped: the last view stays.
            DispatchEvent::Meta { open: false, .. } => {}
            DispatchEvent::Meta {
                mut receiver,
                open: true,
            } => {
                let view = receiver.borrow_and_update().clone();
                self.on_meta(turn, wal, view);
                turn.answer_later(async move { C::from(meta_change(receiver).await) });
            }
        }
    }

    /// The WAL's durable frontier after a drain; feeds `Durable` when the frontier moved
    /// (and says whether it did).
    pub(crate) fn on_wal<C: From<DispatchEvent> + Send + 'static>(
        &mut self,
        turn: &mut Turn<'_, C>,
        wal: &mut impl WalPort,
        durable_next: Seq,
    ) -> bool {
        if self.stopped || durable_next <= self.durable_fed {
            return false;
        }
        self.durable_fed = durable_next;
        self.feed(
            turn,
            wal,
            DispatcherInput::Durable {
                next_seq: durable_next,
            },
        );
        true
    }

    /// Feeds one input and carries out every output.
    pub(crate) fn feed<C: From<DispatchEvent> + Send + 'static>(
        &mut self,
        turn: &mut Turn<'_, C>,
        wal: &mut impl WalPort,
        input: DispatcherInput,
    ) {
        if self.stopped {
            return;
        }
        if self.observer.is_watched() {
            match &input {
                // One per commit: hashed by its fields, formatted only for `--trace`.
                DispatcherInput::CommitDone { commit_id } => self.observer.event_fields(
                    "dispatch",
                    &[TraceField::Str("commit done"), TraceField::U64(commit_id.0)],
                    format_args!("commit #{} done", commit_id.0),
                ),
                DispatcherInput::CommitFailed { commit_id, failure } => self.observer.event(
                    "dispatch",
                    format_args!("commit #{} failed: {failure:?}", commit_id.0),
                ),
                DispatcherInput::Tick
                | DispatcherInput::Durable { .. }
                | DispatcherInput::WalFrames { .. }
                | DispatcherInput::WalReadFailed { .. }
                | DispatcherInput::CheckpointStored { .. }
                | DispatcherInput::CheckpointStoreFailed { .. }
                | DispatcherInput::Member { .. }
                | DispatcherInput::Topic { .. }
                | DispatcherInput::TopicGoneAnswer { .. } => {}
            }
        }
        if let DispatcherInput::CommitDone { commit_id }
        | DispatcherInput::CommitFailed { commit_id, .. } = &input
        {
            self.deadlines.answered(*commit_id);
        }
        narad_core::feed(&mut self.dispatcher, turn.now(), input);
        while let Some(output) = self.dispatcher.poll_output() {
            match output {
                DispatcherOutput::ReadWal(read) => wal.read(read),
                DispatcherOutput::SendCommit(commit) => self.send_commit(turn, commit),
                DispatcherOutput::StoreCheckpoint { seq } => {
                    self.audit_checkpoint(seq);
                    wal.store_checkpoint(seq);
                }
                DispatcherOutput::ConfirmTopicGone { topic } => {
                    self.confirm_topic_gone(turn, topic)
                }
                DispatcherOutput::Warn(warning) => log_warning(&warning),
            }
        }
    }

    fn on_committed<C: From<DispatchEvent> + Send + 'static>(
        &mut self,
        turn: &mut Turn<'_, C>,
        wal: &mut impl WalPort,
        answer: CommitReturn,
    ) {
        let CommitReturn {
            commit_id,
            topic,
            partition,
            count,
            bytes,
            started,
            answered,
            outcome,
        } = answer;
        let metrics = &self.metrics;
        let elapsed = answered.saturating_duration_since(started);
        metrics
            .ingress_dispatch_commit_duration_seconds
            .observe(elapsed.as_secs_f64());
        let input = match outcome {
            Ok(records) => {
                self.produced.add(metrics, &topic, partition, count, bytes);
                let seqs = records.iter().map(|record| record.seq());
                wal.accept_times()
                    .observe_visible(seqs, answered, |latency| {
                        metrics
                            .accept_to_visible_seconds
                            .observe(latency.as_secs_f64());
                    });
                // The records are dropped before the answer, as the driver protocol asks.
                drop(records);
                DispatcherInput::CommitDone { commit_id }
            }
            Err(failure) => {
                if matches!(failure, CommitFailure::IncarnationMismatch { .. }) {
                    metrics.ingress_dispatch_incarnation_mismatches.inc();
                } else {
                    metrics.error("ingress", "dispatch_commit").inc();
                }
                DispatcherInput::CommitFailed { commit_id, failure }
            }
        };
        self.feed(turn, wal, input);
    }

    /// Feeds every topic whose view changed, and every member not fed yet.
    fn on_meta<C: From<DispatchEvent> + Send + 'static>(
        &mut self,
        turn: &mut Turn<'_, C>,
        wal: &mut impl WalPort,
        view: Arc<MetaView>,
    ) {
        let (records, _) = view.state.topics_after("", usize::MAX);
        let mut current: BTreeMap<String, TopicPlacement> = BTreeMap::new();
        for topic in records {
            current.insert(
                topic.name.clone(),
                TopicPlacement {
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
            self.feed(turn, wal, DispatcherInput::Topic { name, view: None });
        }
        for (name, topic) in current {
            if self.topics.get(&name) != Some(&topic) {
                self.topics.insert(name.clone(), topic.clone());
                self.feed(
                    turn,
                    wal,
                    DispatcherInput::Topic {
                        name,
                        view: Some(topic),
                    },
                );
            }
        }
        // This node is alive to its own dispatcher whatever the log says (the leader may not have
        // heard it yet after a restart); every other member as the leader last marked it.
        let members: Vec<(NodeId, bool)> = view
            .state
            .members()
            .keys()
            .map(|node| (*node, *node == self.node || view.state.is_alive(*node)))
            .collect();
        for (node, alive) in members {
            if self.members.insert(node, alive) != Some(alive) {
                self.feed(turn, wal, DispatcherInput::Member { node, alive });
            }
        }
    }

    /// Publishes the gauges only the dispatcher knows; after every turn.
    pub(crate) fn publish(&mut self) {
        let metrics = &self.metrics;
        let dispatcher = &self.dispatcher;
        metrics
            .ingress_dispatch_backlog_bytes
            .set(i64::try_from(dispatcher.backlog_bytes_read()).unwrap_or(i64::MAX));
        let clock = &self.clock;
        let age_s = dispatcher
            .oldest_undispatched_accept_ms()
            .map_or(0.0, |accepted| {
                clock.unix_ms().saturating_sub(accepted) as f64 / 1000.0
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

    /// A checkpoint on its way to the checkpointer must not pass the first record not done.
    fn audit_checkpoint(&self, seq: Seq) {
        if !self.observer.is_watched() {
            return;
        }
        let first_not_done = self.dispatcher.checkpoint();
        if seq > first_not_done {
            self.observer.violation(
                Invariant::CheckpointPassesNotDone,
                format_args!("checkpoint {seq} stored while {first_not_done} is not done"),
            );
        }
    }

    fn confirm_topic_gone<C: From<DispatchEvent> + Send + 'static>(
        &mut self,
        turn: &mut Turn<'_, C>,
        topic: String,
    ) {
        let metastore = self.metastore.clone();
        turn.answer_later(async move {
            // The leader's confirmation: a ReadIndex barrier (confirmed by a quorum, and applied here
            // through the index it returned), then the local replica read again.
            let view = match metastore.read_index().await {
                Ok(()) => match metastore.view().state.topic(&topic) {
                    None => LeaderView::Absent,
                    Some(record) => LeaderView::Present {
                        topic_id: Some(record.id),
                    },
                },
                Err(_) => LeaderView::Unconfirmed,
            };
            C::from(DispatchEvent::Answer(DispatcherInput::TopicGoneAnswer {
                topic,
                view,
            }))
        });
    }

    fn send_commit<C: From<DispatchEvent> + Send + 'static>(
        &mut self,
        turn: &mut Turn<'_, C>,
        commit: SendCommit,
    ) {
        let commit_id = commit.commit_id;
        let topic = Arc::clone(&commit.topic);
        let partition = commit.partition;
        let count = commit.records.len() as u64;
        if self.observer.is_watched() {
            // What the remote byte budget counts: a commit within one record of it was cut there.
            // Summed only for a watcher: it walks every record of the commit.
            let encoded: usize = commit
                .records
                .iter()
                .map(|record| record.encoded_len())
                .sum();
            let to = match commit.owner {
                narad_core::dispatcher::CommitOwner::Local => "local".to_string(),
                narad_core::dispatcher::CommitOwner::Remote(node) => node.0.to_string(),
            };
            self.observer.event_fields(
                "dispatch",
                &[
                    TraceField::Str("commit"),
                    TraceField::U64(commit_id.0),
                    TraceField::Str(&topic),
                    TraceField::U64(u64::from(partition.0)),
                    TraceField::U64(count),
                    TraceField::U64(encoded as u64),
                ],
                format_args!(
                    "commit #{} {topic}/{partition} records={count} bytes={encoded} to={to}",
                    commit_id.0
                ),
            );
        }
        let bytes: u64 = commit
            .records
            .iter()
            .map(|record| record.payload().len() as u64)
            .sum();
        // This share of the records is kept until the answer, for the accept→visible observation.
        let records = commit.records.clone();
        let clock = self.clock.clone();
        let give_up = self.deadlines.start(commit_id, commit.deadline);
        let committing = self.transport.commit(commit);
        let started = turn.now();
        turn.answer_later(async move {
            // Aborted at the deadline (`Deadlines::expire`); dropping `committing` tells the owner the
            // caller left.
            let outcome = Abortable::new(committing, give_up).await;
            let outcome = match outcome {
                Ok(Ok(CommittedRange { .. })) => Ok(records),
                Ok(Err(failure)) => Err(failure),
                Err(_aborted) => Err(CommitFailure::Timeout),
            };
            // A failed commit's records go back to the dispatcher without a copy: this share is gone
            // (dropped with `outcome`'s error arm) before the answer.
            C::from(DispatchEvent::Committed(Box::new(CommitReturn {
                commit_id,
                topic,
                partition,
                count,
                bytes,
                started,
                answered: clock.now(),
                outcome,
            })))
        });
    }
}

/// Waits for the next change of the replica `receiver` has not seen.
async fn meta_change(mut receiver: watch::Receiver<Arc<MetaView>>) -> DispatchEvent {
    let open = receiver.changed().await.is_ok();
    DispatchEvent::Meta { receiver, open }
}

/// The `messages_produced_total` / `bytes_produced_total` series of each partition committed to, found
/// once: a family lookup formats the labels and hashes them, once per commit otherwise.
#[derive(Debug, Default)]
struct ProducedCounters {
    series: ProducedSeries,
}

/// `(messages, bytes)` counters by `(topic, partition)`.
type ProducedSeries = HashMap<(Arc<str>, PartitionId), (Counter, Counter), FnvBuildHasher>;

impl ProducedCounters {
    /// Counts a landed commit of `records` records and `bytes` payload bytes.
    fn add(
        &mut self,
        metrics: &Metrics,
        topic: &Arc<str>,
        partition: PartitionId,
        records: u64,
        bytes: u64,
    ) {
        let (messages, payload) = self
            .series
            .entry((Arc::clone(topic), partition))
            .or_insert_with(|| {
                let labels = PartitionLabels {
                    topic: topic.to_string(),
                    partition: partition.to_string(),
                };
                (
                    metrics.messages_produced.get_or_create(&labels).clone(),
                    metrics.bytes_produced.get_or_create(&labels).clone(),
                )
            });
        messages.inc_by(records);
        payload.inc_by(bytes);
    }
}

/// The deadlines of the local commits in flight, so that the host's one wake-up timer covers them all
/// (rather than a timer per commit). A commit's future is made abortable with the registration
/// [`Deadlines::start`] returns; [`Deadlines::expire`] aborts it once its deadline passed, and the
/// future then answers `Timeout`.
#[derive(Debug, Default)]
struct Deadlines {
    /// Earliest first, each with what gives its commit up.
    by_time: BTreeMap<(Instant, CommitId), AbortHandle>,
    /// The deadline of each commit, to forget it once answered.
    by_commit: BTreeMap<CommitId, Instant>,
}

impl Deadlines {
    /// Notes a commit sent with `deadline`.
    fn start(&mut self, commit_id: CommitId, deadline: Instant) -> AbortRegistration {
        let (abort, registration) = AbortHandle::new_pair();
        self.by_time.insert((deadline, commit_id), abort);
        self.by_commit.insert(commit_id, deadline);
        registration
    }

    /// Forgets an answered commit.
    fn answered(&mut self, commit_id: CommitId) {
        if let Some(deadline) = self.by_commit.remove(&commit_id) {
            self.by_time.remove(&(deadline, commit_id));
        }
    }

    /// The earliest deadline.
    fn first(&self) -> Option<Instant> {
        self.by_time.keys().next().map(|(at, _)| *at)
    }

    /// Gives up (and forgets) every commit whose deadline is at or before `now`, earliest first.
    fn expire(&mut self, now: Instant) -> Vec<CommitId> {
        let mut expired = Vec::new();
        while let Some(entry) = self.by_time.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((_, commit_id), abort) = entry.remove_entry();
            self.by_commit.remove(&commit_id);
            abort.abort();
            expired.push(commit_id);
        }
        expired
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
            live_topic_id,
            records,
        } => {
            tracing::warn!(topic, ?topic_id, %partition, ?owner, ?live_topic_id, records, "{message}")
        }
        DispatchWarning::UndecodableRecord { seq, error } => {
            tracing::warn!(%seq, %error, "{message}")
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::FutureExt;

    use super::*;

    #[test]
    fn a_commit_is_given_up_at_its_deadline_and_an_answered_one_never() {
        let at = |ms: u64| Instant::from_nanos(ms * 1_000_000);
        let mut deadlines = Deadlines::default();
        let late = Abortable::new(
            std::future::pending::<()>(),
            deadlines.start(CommitId(1), at(30)),
        );
        let answered = Abortable::new(
            std::future::pending::<()>(),
            deadlines.start(CommitId(2), at(10)),
        );
        let early = Abortable::new(
            std::future::pending::<()>(),
            deadlines.start(CommitId(3), at(20)),
        );
        deadlines.answered(CommitId(2));
        assert_eq!(deadlines.first(), Some(at(20)));
        assert_eq!(deadlines.expire(at(19)), Vec::<CommitId>::new());
        assert_eq!(deadlines.expire(at(20)), vec![CommitId(3)]);
        assert_eq!(
            early.now_or_never(),
            Some(Err(futures_util::future::Aborted))
        );
        assert!(!late.is_aborted());
        assert!(!answered.is_aborted());
        assert_eq!(deadlines.first(), Some(at(30)));
        assert_eq!(deadlines.expire(at(40)), vec![CommitId(1)]);
        assert!(late.is_aborted());
        assert_eq!(deadlines.first(), None);
    }

    #[test]
    fn produced_records_are_counted_per_partition_series() {
        let metrics = Metrics::new();
        let mut produced = ProducedCounters::default();
        let topic: Arc<str> = Arc::from("orders");
        produced.add(&metrics, &topic, PartitionId(1), 2, 10);
        produced.add(&metrics, &Arc::from("orders"), PartitionId(1), 3, 5);
        produced.add(&metrics, &topic, PartitionId(2), 1, 7);
        let labels = |partition: &str| PartitionLabels {
            topic: "orders".to_string(),
            partition: partition.to_string(),
        };
        let count =
            |family: &prometheus_client::metrics::family::Family<PartitionLabels, Counter>,
             partition: &str| family.get_or_create(&labels(partition)).get();
        assert_eq!(count(&metrics.messages_produced, "1"), 5);
        assert_eq!(count(&metrics.bytes_produced, "1"), 15);
        assert_eq!(count(&metrics.messages_produced, "2"), 1);
        assert_eq!(count(&metrics.bytes_produced, "2"), 7);
    }
}
