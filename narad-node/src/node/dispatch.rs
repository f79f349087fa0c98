//! The dispatcher host: runs the [`Dispatcher`] in one task and carries out its outputs (see the driver
//! protocol in `narad_core::dispatcher`). It decides nothing.
//!
//! - `ReadWal` → a read of the WAL host, answered `WalFrames` / `WalReadFailed`; a read from the WAL's
//!   published durable frontier on (the idle backstop's, mostly) is answered an empty `WalFrames` at
//!   once, without asking the WAL host (unless the WAL latched).
//! - `SendCommit` → the node's one [`CommitTransport`], whatever the owner, giving up at the commit's
//!   deadline (`Timeout`; dropping the transport's future tells the owner the caller left). The
//!   host's own wake-up timer keeps the deadlines of the commits in flight (no timer per commit) and
//!   aborts a commit once its deadline passed. The transport's typed answer is fed as it is.
//! - `StoreCheckpoint` → the checkpointer (through the WAL host), answered once written in place.
//! - `ConfirmTopicGone` → the local replica once it is caught up: on a single voter (the leader) a read
//!   after its applied index is the barrier.
//! - `Warn` → `tracing::warn!` with the spec's text and the warning's fields.
//!
//! Every output that is answered later becomes one future in the host's set of outstanding answers,
//! polled by the host task itself (no task and no channel per answer). The protocol bounds the set:
//! one read, one checkpoint store, one question per topic and one commit per destination at most.
//!
//! Polling order: signals first (stop, the WAL's durable frontier, the metastore replica, in the order
//! they fired), then answers, then the wake-up timer. A turn feeds every signal and answer ready
//! (polled with the task's own waker, so a source is not polled again only to register it), and the
//! timer only when none was; then it drains the outputs, publishes the gauges and moves the wake-up
//! timer once. Turns repeat until nothing is ready.
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures_util::future::{AbortHandle, AbortRegistration, Abortable};
use futures_util::stream::{FuturesUnordered, StreamExt};

use narad_core::dispatcher::{
    CommitFailure, CommitId, DispatchWarning, Dispatcher, DispatcherConfig, DispatcherInput,
    DispatcherOutput, LeaderView, ReadWal, SendCommit, TopicPlacement,
};
use narad_core::ids::{NodeId, PartitionId};
use narad_core::routing::FnvBuildHasher;
use narad_core::wal::ReadError as WalReadFailure;
use narad_core::{Actor, Instant, IoFault, Seq};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;

use super::transport::CommitTransport;
use super::NodeHooks;
use crate::clock::{self, Clock};
use crate::metastore::{MetaView, Metastore};
use crate::metrics::{Metrics, PartitionLabels};
use crate::probe::{Invariant, Probe, TraceField};
use crate::wal_host::{StoreError, WalHost, WalReadError, WalStatus};

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
        let (stop, stop_rx) = watch::channel(false);
        let (done_tx, done) = watch::channel(false);
        let wal_status = wal.subscribe();
        let meta = metastore.subscribe();
        let host = Host {
            node,
            dispatcher: Dispatcher::new(config),
            wal,
            transport,
            metastore,
            clock,
            metrics,
            answers: FuturesUnordered::new(),
            answered: None,
            deadlines: Deadlines::default(),
            durable_fed: status.durable_next_seq,
            wal_latched: status.latched.is_some(),
            topics: BTreeMap::new(),
            members: BTreeSet::new(),
            reroutes_published: 0,
            produced: Arc::default(),
            probe: hooks.probe.clone(),
        };
        tokio::spawn(async move {
            host.run(stop_rx, wal_status, meta).await;
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

/// An output's answer on its way: fed to the dispatcher when it resolves.
type Answer = Pin<Box<dyn Future<Output = DispatcherInput> + Send>>;

/// A wait for one [`Signal`]. It stays registered with its channel across turns (rather than a
/// waiter registered again on every turn for every channel) and hands its receiver back when it fires.
type Waiting = Pin<Box<dyn Future<Output = Signal> + Send>>;

/// A change the host follows besides the answers.
enum Signal {
    /// The host was asked to stop (or its handle is gone).
    Stop,
    /// The WAL's status changed (`open`), or the WAL host stopped.
    WalStatus {
        receiver: watch::Receiver<WalStatus>,
        open: bool,
    },
    /// The metastore replica's view changed (`open`), or the metastore stopped.
    Meta {
        receiver: watch::Receiver<Arc<MetaView>>,
        open: bool,
    },
}

impl Signal {
    /// Fires once the WAL's durable frontier passes `durable_fed` or its latch changes from `latched`
    /// (the only fields the host follows), or the WAL host stopped. The checkpoint's own changes (stored,
    /// written, synced: two or three per record) are passed over here, without a turn of the host.
    fn wal_status(
        mut receiver: watch::Receiver<WalStatus>,
        durable_fed: Seq,
        latched: bool,
    ) -> Waiting {
        Box::pin(async move {
            loop {
                if receiver.changed().await.is_err() {
                    return Signal::WalStatus {
                        receiver,
                        open: false,
                    };
                }
                let status = receiver.borrow();
                if status.durable_next_seq > durable_fed || status.latched.is_some() != latched {
                    drop(status);
                    return Signal::WalStatus {
                        receiver,
                        open: true,
                    };
                }
            }
        })
    }

    fn meta(mut receiver: watch::Receiver<Arc<MetaView>>) -> Waiting {
        Box::pin(async move {
            let open = receiver.changed().await.is_ok();
            Signal::Meta { receiver, open }
        })
    }
}

struct Host {
    node: NodeId,
    dispatcher: Dispatcher,
    wal: WalHost,
    /// The one way to every owner, this node's included.
    transport: Arc<dyn CommitTransport>,
    metastore: Metastore,
    clock: Clock,
    metrics: Arc<Metrics>,
    /// Outputs being carried out, each resolving to its answer (bounded by the driver protocol).
    answers: FuturesUnordered<Answer>,
    /// The answer of an output carried out at once (a read that finds nothing durable), fed as soon
    /// as the outputs before it are carried out.
    answered: Option<DispatcherInput>,
    /// The deadlines of the local commits in flight.
    deadlines: Deadlines,
    /// The durable frontier last fed.
    durable_fed: Seq,
    /// Whether the WAL was latched at the status last followed.
    wal_latched: bool,
    /// The topic views last fed, by name.
    topics: BTreeMap<String, TopicPlacement>,
    /// Members last fed alive.
    members: BTreeSet<NodeId>,
    reroutes_published: u64,
    /// The produced-records series, by partition.
    produced: Arc<ProducedCounters>,
    /// Events and broken invariants go here (see [`crate::probe`]).
    probe: Probe,
}

impl Host {
    async fn run(
        mut self,
        stop: watch::Receiver<bool>,
        mut wal_status: watch::Receiver<WalStatus>,
        mut meta: watch::Receiver<Arc<MetaView>>,
    ) {
        self.feed(DispatcherInput::Member {
            node: self.node,
            alive: true,
        });
        self.members.insert(self.node);
        let view = meta.borrow_and_update().clone();
        self.on_meta(view);
        let status = wal_status.borrow_and_update().clone();
        self.on_wal_status(status);
        let mut signals: FuturesUnordered<Waiting> = FuturesUnordered::new();
        signals.push(Box::pin(async move {
            let mut stop = stop;
            let _ = stop.changed().await;
            Signal::Stop
        }));
        signals.push(self.wait_wal_status(wal_status));
        signals.push(Signal::meta(meta));
        let mut timer = clock::WakeTimer::at(self.clock.to_tokio(self.clock.now()));
        // Moved only when the wake-up changes, not re-registered every turn.
        let mut armed = None;
        self.settle(&mut timer, &mut armed);
        std::future::poll_fn(|cx| self.poll_turns(cx, &mut signals, &mut timer, &mut armed)).await;
        self.let_go();
    }

    /// Runs turns until no input is ready; `Ready` once the host must stop (asked to, or the WAL host
    /// stopped: nothing more becomes durable). A turn feeds every signal ready (first) and every answer
    /// ready, and the timer only when neither had any; a turn that fed something ends with
    /// [`Host::settle`].
    ///
    /// Everything is polled with the task's own waker. The signals, once `Pending`, hold it and are
    /// not polled again in the same poll (only `on_signal` adds to them, and only while they are
    /// polled); the answers are, since a turn's drain may add some.
    fn poll_turns(
        &mut self,
        cx: &mut Context<'_>,
        signals: &mut FuturesUnordered<Waiting>,
        timer: &mut clock::WakeTimer,
        armed: &mut Option<Instant>,
    ) -> Poll<()> {
        let mut signals_waiting = false;
        loop {
            let mut progressed = false;
            while !signals_waiting {
                match signals.poll_next_unpin(cx) {
                    Poll::Ready(Some(signal)) => {
                        if !self.on_signal(signal, signals) {
                            return Poll::Ready(());
                        }
                        progressed = true;
                    }
                    Poll::Ready(None) | Poll::Pending => signals_waiting = true,
                }
            }
            while let Poll::Ready(Some(answer)) = self.answers.poll_next_unpin(cx) {
                self.feed(answer);
                progressed = true;
            }
            if !progressed && armed.is_some() && Pin::new(&mut *timer).poll(cx).is_ready() {
                *armed = None;
                let now = self.clock.now();
                self.deadlines.expire(now);
                if self.dispatcher.poll_timeout().is_some_and(|at| at <= now) {
                    self.feed(DispatcherInput::Tick);
                }
                progressed = true;
            }
            if !progressed {
                return Poll::Pending;
            }
            self.settle(timer, armed);
        }
    }

    /// Ends a turn that fed something: drains the outputs, publishes the gauges and moves the wake-up
    /// timer (only when the wake-up changed, not re-registered every turn).
    fn settle(&mut self, timer: &mut clock::WakeTimer, armed: &mut Option<Instant>) {
        self.drain();
        self.publish();
        let wake = self.wake_at();
        if wake != *armed {
            if let Some(at) = wake {
                timer.reset(self.clock.to_tokio(at));
            }
            *armed = wake;
        }
    }

    /// Acts on a signal that fired and waits for the next one of its kind; `false` once the host
    /// must stop (asked to, or the WAL host stopped: nothing more becomes durable).
    fn on_signal(&mut self, signal: Signal, signals: &mut FuturesUnordered<Waiting>) -> bool {
        match signal {
            Signal::Stop => false,
            Signal::WalStatus { open: false, .. } => false,
            Signal::WalStatus {
                mut receiver,
                open: true,
            } => {
                let status = receiver.borrow_and_update().clone();
                self.on_wal_status(status);
                signals.push(self.wait_wal_status(receiver));
                true
            }
            // The metastore stopped: the last view stays.
            Signal::Meta { open: false, .. } => true,
            Signal::Meta {
                mut receiver,
                open: true,
            } => {
                let view = receiver.borrow_and_update().clone();
                self.on_meta(view);
                signals.push(Signal::meta(receiver));
                true
            }
        }
    }

    /// Waits for the next change of the WAL's status the host follows.
    fn wait_wal_status(&self, receiver: watch::Receiver<WalStatus>) -> Waiting {
        Signal::wal_status(receiver, self.durable_fed, self.wal_latched)
    }

    /// When the loop must wake: the dispatcher's timeout or a commit's deadline, whichever is first.
    fn wake_at(&self) -> Option<Instant> {
        let deadline = self.deadlines.first();
        match (self.dispatcher.poll_timeout(), deadline) {
            (Some(timeout), Some(deadline)) => Some(timeout.min(deadline)),
            (timeout, deadline) => timeout.or(deadline),
        }
    }

    /// At stop, outputs still being carried out are left to finish on their own, in a task of their
    /// own, and their answers are dropped: a commit in flight may still land (its records are replayed
    /// from the checkpoint at the next start, a duplicate the delivery contract allows) and still gives
    /// up at its deadline, a checkpoint store may still be written (it never passes a record not done).
    fn let_go(&mut self) {
        let mut answers = std::mem::take(&mut self.answers);
        let mut deadlines = std::mem::take(&mut self.deadlines);
        if answers.is_empty() {
            return;
        }
        let clock = self.clock.clone();
        tokio::spawn(async move {
            loop {
                let next = deadlines.first();
                let wake = clock.to_tokio(next.unwrap_or_default());
                tokio::select! {
                    answer = answers.next() => if answer.is_none() {
                        return;
                    },
                    () = tokio::time::sleep_until(wake), if next.is_some() => {
                        deadlines.expire(clock.now());
                    }
                }
            }
        });
    }

    fn feed(&mut self, input: DispatcherInput) {
        if self.probe.is_watched() {
            match &input {
                // One per commit: hashed by its fields, formatted only for `--trace`.
                DispatcherInput::CommitDone { commit_id } => self.probe.event_fields(
                    "dispatch",
                    &[TraceField::Str("commit done"), TraceField::U64(commit_id.0)],
                    format_args!("commit #{} done", commit_id.0),
                ),
                DispatcherInput::CommitFailed { commit_id, failure } => self.probe.event(
                    "dispatch",
                    format_args!("commit #{} failed: {failure:?}", commit_id.0),
                ),
                _ => {}
            }
        }
        if let DispatcherInput::CommitDone { commit_id }
        | DispatcherInput::CommitFailed { commit_id, .. } = &input
        {
            self.deadlines.answered(*commit_id);
        }
        let now = self.clock.now();
        self.dispatcher.handle(now, input);
        self.drain();
    }

    fn on_wal_status(&mut self, status: WalStatus) {
        self.wal_latched = status.latched.is_some();
        self.metrics
            .ingress_wal_failed
            .set(i64::from(self.wal_latched));
        if status.durable_next_seq > self.durable_fed {
            self.durable_fed = status.durable_next_seq;
            self.feed(DispatcherInput::Durable {
                next_seq: status.durable_next_seq,
            });
        }
    }

    /// Feeds every topic whose view changed, and every member not fed yet.
    fn on_meta(&mut self, view: Arc<MetaView>) {
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

    /// Carries out every output, feeding the answers known at once (an empty read) as they come.
    fn drain(&mut self) {
        loop {
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
            let Some(answer) = self.answered.take() else {
                return;
            };
            let now = self.clock.now();
            self.dispatcher.handle(now, answer);
        }
    }

    fn publish(&mut self) {
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

    /// Carries out an output: its answer is fed once `work` resolves.
    fn answer_later(&mut self, work: impl Future<Output = DispatcherInput> + Send + 'static) {
        self.answers.push(Box::pin(work));
    }

    fn read_wal(&mut self, read: ReadWal) {
        // Nothing from `read.from` on is durable (the WAL host publishes its durable frontier before it
        // answers anyone, and the frontier only grows): the answer is an empty read, known without a
        // trip to the WAL host. This is what the idle backstop's reads mostly are. A latched WAL is
        // asked (its read reports the failure), and so is a WAL the dispatcher believes further along
        // (never: its frontier comes from the same status; asking cannot loop).
        if !self.wal_latched
            && read.from >= self.dispatcher.durable_next()
            && read.from >= self.wal.durable_next_seq()
        {
            assert!(self.answered.is_none(), "at most one read is outstanding");
            self.answered = Some(DispatcherInput::WalFrames { frames: Vec::new() });
            return;
        }
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

    fn store_checkpoint(&mut self, seq: Seq) {
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

    fn confirm_topic_gone(&mut self, topic: String) {
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

    fn send_commit(&mut self, commit: SendCommit) {
        let commit_id = commit.commit_id;
        let topic = Arc::clone(&commit.topic);
        let partition = commit.partition;
        let count = commit.records.len() as u64;
        self.probe.event_fields(
            "dispatch",
            &[
                TraceField::Str("commit"),
                TraceField::U64(commit_id.0),
                TraceField::Str(&topic),
                TraceField::U64(u64::from(partition.0)),
                TraceField::U64(count),
            ],
            format_args!(
                "commit #{} {topic}/{partition} records={count}",
                commit_id.0
            ),
        );
        let bytes: u64 = commit
            .records
            .iter()
            .map(|record| record.payload().len() as u64)
            .sum();
        // This share of the records is kept until the answer, for the accept→visible observation.
        let records = commit.records.clone();
        let clock = self.clock.clone();
        let metrics = self.metrics.clone();
        let accept_times = Arc::clone(self.wal.accept_times());
        let produced = Arc::clone(&self.produced);
        let give_up = self.deadlines.start(commit_id, commit.deadline);
        let committing = self.transport.commit(commit);
        self.answer_later(async move {
            let started = clock.now();
            // Aborted by the host at the deadline (`Deadlines::expire`); dropping `committing` tells the
            // owner the caller left.
            let outcome = Abortable::new(committing, give_up).await;
            let answered = clock.now();
            let elapsed = answered.saturating_duration_since(started);
            metrics
                .ingress_dispatch_commit_duration_seconds
                .observe(elapsed.as_secs_f64());
            let failure = match outcome {
                Ok(Ok(_range)) => {
                    produced.add(&metrics, &topic, partition, count, bytes);
                    let seqs = records.iter().map(|record| record.seq());
                    accept_times.observe_visible(seqs, answered, |latency| {
                        metrics
                            .accept_to_visible_seconds
                            .observe(latency.as_secs_f64());
                    });
                    return DispatcherInput::CommitDone { commit_id };
                }
                Ok(Err(failure)) => failure,
                Err(_aborted) => CommitFailure::Timeout,
            };
            // The dispatcher takes a failed commit's records back, without a copy once this share of
            // them is gone (before the answer; a success drops it on return, also before).
            drop(records);
            if !matches!(failure, CommitFailure::IncarnationMismatch { .. }) {
                metrics.error("ingress", "dispatch_commit").inc();
            }
            DispatcherInput::CommitFailed { commit_id, failure }
        });
    }
}

/// The `messages_produced_total` / `bytes_produced_total` series of each partition committed to, found
/// once: a family lookup formats the labels and hashes them, once per commit otherwise. Shared with the
/// commits in flight (which count their records as they land, even after the host stopped).
#[derive(Debug, Default)]
struct ProducedCounters {
    series: Mutex<ProducedSeries>,
}

/// `(messages, bytes)` counters by `(topic, partition)`.
type ProducedSeries = HashMap<(Arc<str>, PartitionId), (Counter, Counter), FnvBuildHasher>;

impl ProducedCounters {
    /// Counts a landed commit of `records` records and `bytes` payload bytes.
    fn add(
        &self,
        metrics: &Metrics,
        topic: &Arc<str>,
        partition: PartitionId,
        records: u64,
        bytes: u64,
    ) {
        let mut series = self
            .series
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (messages, payload) =
            series
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
    fn the_wal_status_wakes_the_host_only_for_the_durable_frontier_or_the_latch() {
        let status = WalStatus {
            repaired: true,
            durable_next_seq: Seq(5),
            latched: None,
            dispatch_start: Seq(0),
            checkpoint_stored: Seq(0),
            checkpoint_written: Seq(0),
            checkpoint_synced: Seq(0),
            checkpoint_failure: None,
        };
        let (sender, receiver) = watch::channel(status);
        let mut waiting = Signal::wal_status(receiver, Seq(5), false);
        assert!((&mut waiting).now_or_never().is_none());
        // The checkpoint moving (stored, written, synced) is not followed.
        sender.send_modify(|status| status.checkpoint_stored = Seq(3));
        sender.send_modify(|status| status.checkpoint_written = Seq(3));
        sender.send_modify(|status| status.checkpoint_synced = Seq(3));
        assert!((&mut waiting).now_or_never().is_none());
        sender.send_modify(|status| status.durable_next_seq = Seq(6));
        let Some(Signal::WalStatus { receiver, open }) = (&mut waiting).now_or_never() else {
            panic!("the durable frontier moved");
        };
        assert!(open);
        let mut latch = Signal::wal_status(receiver, Seq(6), false);
        sender.send_modify(|status| status.latched = Some(IoFault::Eio));
        assert!(matches!(
            (&mut latch).now_or_never(),
            Some(Signal::WalStatus { open: true, .. })
        ));
        let (sender, receiver) = watch::channel(sender.borrow().clone());
        let mut gone = Signal::wal_status(receiver, Seq(6), true);
        drop(sender);
        assert!(matches!(
            gone.as_mut().now_or_never(),
            Some(Signal::WalStatus { open: false, .. })
        ));
    }

    #[test]
    fn produced_records_are_counted_per_partition_series() {
        let metrics = Metrics::new();
        let produced = ProducedCounters::default();
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
