//! The owner: every partition log this node holds, one [`Combiner`] each, kept in step with the
//! local metastore replica. It is the owner side of a commit: whatever carried a batch here (this
//! node's dispatcher, or a peer's over the cluster transport), the batch meets the same combiner and
//! the same checks under its produce lock.
//!
//! # Contract
//! - **Views.** Each combiner's [`TopicView`] is [`owner_view`] of the replica state last fed
//!   ([`OwnerInput::Replica`]). A combiner exists for every partition this node owns of every topic
//!   the replica holds (so its logs open at once, and at start-up before the node turns ready), and
//!   on demand for a commit or read naming any other (topic, partition), whose view then says the
//!   name is absent or not owned here. A peer's partitions open no log here.
//! - **Commits** go to their partition's combiner and are answered [`OwnerOutput::Committed`] with
//!   the combiner's outcome; an abandoned batch is left out if its cycle has not started.
//! - **Reads** of an incarnation that is not the live one here are answered
//!   [`OwnerReadError::NotLive`]. A read whose log is still opening is parked (at most
//!   [`PARKED_READS_MAX`] per log; more are refused as busy) and sent on once the log opened, failed
//!   or went away.
//! - **Retired logs.** When a combiner lets a log go ([`CombinerOutput::LogRetired`]), its directory
//!   is listed, then every file in it removed and the directory synced, on that combiner's commit
//!   lane (behind anything the log still had queued there). Empty directories stay (the `Disk` seam
//!   has no directory removal).
//! - **Retention.** Every `retention_check_interval` (a timer of this actor: [`Actor::poll_timeout`])
//!   each live log is fed its topic's policy ([`RetentionPolicy`], on the combiners' wall clock);
//!   what the logs remove is reported as [`LogEvent::Retained`] (see the log's `retention` module).
//! - **Idle combiners** of a name the replica no longer holds are dropped once they hold nothing;
//!   [`OwnerOutput::Forget`] then tells the driver their lanes may go, once no removal runs on them.
//!
//! # Driver protocol
//! Feed [`OwnerInput::Replica`] first and again on every change of the replica (before any request
//! that was made against the newer state); after every `handle`, drain `poll_output`: run each
//! [`OwnerOutput::Io`] on the lanes of its [`LogKey`] (requests of one key and lane in order) and feed
//! its completion back as [`OwnerInput::IoDone`]; answer the callers; log the [`LogEvent`]s. Feed
//! [`OwnerInput::Tick`] once `poll_timeout` has passed (the journal's cohort wait and the retention
//! check set one).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use super::combiner::{
    BatchId, Combiner, CombinerConfig, CombinerInput, CombinerOutput, CommitBatch, CommitError,
    CommittedRange, LiveTopic, QueryId, TopicView,
};
use super::journal::{JournalConfig, JournalEvent, JournalInput, JournalOutput, OwnerJournal};
use super::log::{
    LogReadError, LogReadId, LogStatus, PartitionStats, ReadBatch, ReadRequest, RecoveryError,
    RecoveryReport, RetainedRange, RetentionPolicy,
};
use super::{LogKey, JOURNAL_KEY};
use crate::actor::Actor;
use crate::disk::{join, IoCompletion, IoId, IoLane, IoOp, IoReply, IoRequest};
use crate::error::IoFault;
use crate::ids::{NodeId, Offset, PartitionId, TopicId};
use crate::metastore::MetaState;
use crate::planted::PlantedBug;
use crate::time::Instant;

/// The directory of every topic's partition logs (relative to the data directory).
pub const TOPICS_DIR: &str = "topics";
/// Reads parked behind one opening log, at most (more are refused as busy).
pub const PARKED_READS_MAX: usize = 1024;
/// Io ids at and above this are the owner's own (removing retired logs), never a log's.
const JANITOR_IO_BASE: u64 = 1 << 63;

/// The directory of one partition's log: the incarnation is part of it, so a recreated topic starts
/// empty.
pub fn partition_dir(topic: &str, topic_id: TopicId, partition: PartitionId) -> String {
    format!("{TOPICS_DIR}/{topic}/{topic_id}/p{:05}", partition.0)
}

/// The directory of one partition's log at a placement: placement 0 (where the partition was
/// created) is [`partition_dir`]; a partition a move brought here lives in a directory of its own,
/// named by the move's placement epoch. So a partition that leaves a node and comes back later never
/// meets what the node's owner journal still holds of its earlier stay (the journal replays by
/// directory), and the copy a move makes is never written over a directory a log may open.
pub fn partition_dir_at(
    topic: &str,
    topic_id: TopicId,
    partition: PartitionId,
    placement: u64,
) -> String {
    match placement {
        0 => partition_dir(topic, topic_id, partition),
        epoch => format!(
            "{TOPICS_DIR}/{topic}/{topic_id}/p{:05}.m{epoch}",
            partition.0
        ),
    }
}

/// What the replica `state` says about `(topic, partition)` to the combiner on `node`.
///
/// A name the replica does not hold is *owned*: the combiner then answers the incarnation refusal
/// (or "topic not found"), which the dispatcher turns into a leader confirmation and a discard,
/// never a "not owner" that would reroute records of a deleted topic by name. A partition the
/// topic does not have (yet) is not owned. A partition owned elsewhere has no live log here: a
/// partition that moved away lets its log go (its files are reclaimed once the switch applied
/// here, which is after the raft log committed it), and a read that reaches a node that does not
/// own the partition is answered as not live (retriable: the asker's replica lags). A partition
/// this node is moving away, whose move the replica records as frozen, is frozen.
pub fn owner_view(
    state: &MetaState,
    node: NodeId,
    topic: &str,
    partition: PartitionId,
) -> TopicView {
    match state.topic(topic) {
        Some(record) if partition.0 < record.partitions() => {
            let owned = record.owner_of(partition) == Some(node);
            let frozen = state.move_of(topic, partition).is_some_and(|moving| {
                moving.from == node && moving.topic_id == record.id && moving.final_hw.is_some()
            });
            TopicView {
                version: record.metadata_version,
                owned,
                frozen: owned && frozen,
                live: owned.then(|| LiveTopic {
                    topic_id: Some(record.id),
                    log_dir: partition_dir_at(
                        topic,
                        record.id,
                        partition,
                        state.placement(record.id, partition),
                    ),
                }),
            }
        }
        Some(record) => TopicView {
            version: record.metadata_version,
            owned: false,
            frozen: false,
            live: None,
        },
        None => TopicView {
            version: 0,
            owned: true,
            frozen: false,
            live: None,
        },
    }
}

/// Settings of an [`Owner`].
#[derive(Clone, Debug)]
pub struct OwnerConfig {
    /// This node: the owner assignments are compared with it.
    pub node: NodeId,
    /// Every combiner's settings (its log's included).
    pub combiner: CombinerConfig,
    /// The owner journal's settings; `None` runs every log on its own fsyncs (one per commit).
    pub journal: Option<JournalConfig>,
    /// How often retention checks every log ([`RETENTION_CHECK_INTERVAL_DEFAULT`]).
    pub retention_check_interval: Duration,
}

/// `storage.retention_check_interval_ms`' default, as Narad's.
pub const RETENTION_CHECK_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);

/// A replay read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerRead {
    /// Names the read in its answer; unique among the reads outstanding.
    pub id: LogReadId,
    /// The topic name.
    pub topic: Arc<str>,
    /// The incarnation the caller looked up.
    pub topic_id: TopicId,
    /// The partition.
    pub partition: PartitionId,
    /// The first offset wanted.
    pub offset: Offset,
    /// At most this many records.
    pub records_max: u32,
    /// At most this many record bytes (always the first record).
    pub bytes_max: u32,
}

/// Why a read returned nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OwnerReadError {
    /// The log refused or failed the read.
    #[error(transparent)]
    Log(#[from] LogReadError),
    /// The topic was deleted or recreated since the caller looked it up.
    #[error("topic incarnation {0} is no longer live")]
    NotLive(TopicId),
}

impl From<OwnerReadError> for super::PartitionReadError {
    fn from(error: OwnerReadError) -> super::PartitionReadError {
        match error {
            OwnerReadError::Log(error) => super::PartitionReadError::Log(error),
            OwnerReadError::NotLive(topic_id) => super::PartitionReadError::NotLive(topic_id),
        }
    }
}

/// The events an [`Owner`] consumes.
#[derive(Clone, Debug)]
pub enum OwnerInput {
    /// The local metastore replica's state (at start, and after every change).
    Replica(Arc<MetaState>),
    /// `poll_timeout` has passed.
    Tick,
    /// Commit a batch of one partition's records.
    Commit {
        /// The topic name.
        topic: Arc<str>,
        /// The partition.
        partition: PartitionId,
        /// The batch (its id is unique among the batches outstanding).
        batch: CommitBatch,
    },
    /// The caller of a batch gave up.
    Abandon {
        /// The topic name.
        topic: Arc<str>,
        /// The partition.
        partition: PartitionId,
        /// The batch.
        id: BatchId,
    },
    /// A replay read.
    Read(OwnerRead),
    /// Arm the handoff freeze of a partition this node is moving away (see the `freeze` module):
    /// answered [`OwnerOutput::FreezeArmed`] with the final high watermark.
    Freeze(FreezeRequest),
    /// A request of [`OwnerOutput::Io`] finished.
    IoDone {
        /// The key it was run for.
        key: LogKey,
        /// Its completion.
        completion: IoCompletion,
    },
}

/// What happened to a log, for the driver's log lines and counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogEvent {
    /// The log finished opening.
    Opened {
        /// Its incarnation.
        topic_id: Option<TopicId>,
        /// What recovery found (its `skipped` damage is what an operator must hear of).
        report: RecoveryReport,
    },
    /// Retention took segments out of the log.
    Retained(RetainedRange),
    /// A step of retention failed (tried again at the next check).
    RetentionFailed {
        /// The fault.
        fault: IoFault,
    },
    /// The log failed to open.
    OpenFailed {
        /// Its incarnation.
        topic_id: Option<TopicId>,
        /// Why.
        error: RecoveryError,
    },
    /// A lazy sync of the log's files failed: the journal keeps its records, and asks again later.
    SyncFailed {
        /// Its incarnation.
        topic_id: Option<TopicId>,
        /// The fault.
        fault: IoFault,
    },
    /// The log latched after a failed commit could not be truncated.
    Latched {
        /// Its incarnation.
        topic_id: Option<TopicId>,
        /// The fault.
        fault: IoFault,
    },
    /// The log was let go; its files are being removed.
    Retired {
        /// Its incarnation.
        topic_id: Option<TopicId>,
        /// Its directory.
        dir: String,
    },
    /// A retired log's files are gone.
    Removed {
        /// Its directory.
        dir: String,
    },
    /// Removing a retired log failed; its files stay.
    RemoveFailed {
        /// Its directory.
        dir: String,
        /// The index of the failed op in its request.
        op: usize,
        /// The fault.
        fault: IoFault,
    },
}

/// The commands an [`Owner`] emits.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnerOutput {
    /// Run `request` on the lanes of `key`; feed back [`OwnerInput::IoDone`].
    Io {
        /// Orders the request with the others of its key and lane.
        key: LogKey,
        /// The request.
        request: IoRequest,
    },
    /// Nothing runs for `key` any more: its lanes may go.
    Forget {
        /// The key.
        key: LogKey,
    },
    /// A batch's outcome.
    Committed {
        /// The batch.
        id: BatchId,
        /// Its offsets, or why it was not committed.
        result: Result<CommittedRange, CommitError>,
    },
    /// A freeze's outcome: the final high watermark, or why it was not armed.
    FreezeArmed {
        /// The request's query id.
        query: QueryId,
        /// The final high watermark.
        result: Result<Offset, FreezeRefused>,
    },
    /// A read's outcome.
    ReadDone {
        /// The read.
        id: LogReadId,
        /// Records, or why none.
        result: Result<ReadBatch, OwnerReadError>,
    },
    /// Something happened to the owner journal.
    Journal(JournalEvent),
    /// A retention check fed every live log its policy; the size of each open log after its
    /// decisions, in bytes of frames.
    RetentionChecked {
        /// `(topic, partition, size)` of every open log.
        sizes: Vec<(Arc<str>, PartitionId, u64)>,
    },
    /// Something happened to a log.
    Log {
        /// The topic name.
        topic: Arc<str>,
        /// The partition.
        partition: PartitionId,
        /// What.
        event: LogEvent,
    },
}

/// How many logs are in each state the node reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnerStatus {
    /// Logs still opening (recovering).
    pub opening: usize,
    /// Logs whose open failed (their combiner retries those that may be retried).
    pub open_failed: usize,
    /// Logs whose open failed in a way only a restart of the process clears (the final sync of
    /// recovery failed: see [`RecoveryError::Sync`]).
    pub restart_needed: usize,
}

/// One hosted combiner.
#[derive(Debug)]
struct Slot {
    topic: Arc<str>,
    partition: PartitionId,
    combiner: Combiner,
}

/// A removal step running on a combiner's commit lane.
#[derive(Debug)]
struct Removal {
    key: LogKey,
    dir: String,
    /// The listing (then the removes and the directory sync follow); else the removes.
    listing: bool,
}

/// Every partition log of this node; see the module documentation.
#[derive(Debug)]
pub struct Owner {
    config: OwnerConfig,
    state: Arc<MetaState>,
    by_name: BTreeMap<(Arc<str>, PartitionId), LogKey>,
    slots: BTreeMap<LogKey, Slot>,
    next_key: u64,
    parked: BTreeMap<LogKey, Vec<OwnerRead>>,
    removals: BTreeMap<IoId, Removal>,
    next_removal: u64,
    opening: BTreeSet<LogKey>,
    open_failed: BTreeSet<LogKey>,
    restart_needed: BTreeSet<LogKey>,
    /// The owner journal, when commits are journaled.
    journal: Option<OwnerJournal>,
    /// Inputs for the journal, fed once no combiner is being drained.
    journal_inbox: VecDeque<JournalInput>,
    /// The journal's inbox is being worked through (feeds reached from it only queue).
    pumping: bool,
    /// The instant of the input being handled (the combiners are fed it).
    now: Instant,
    /// When the next retention check is due.
    next_retention: Instant,
    /// Freezes armed here whose move the replica does not record as frozen yet, by partition: the
    /// move's `planned_at`.
    arming: BTreeMap<(Arc<str>, PartitionId), u64>,
    outputs: VecDeque<OwnerOutput>,
}

impl Owner {
    /// An owner holding nothing until the first [`OwnerInput::Replica`].
    pub fn new(mut config: OwnerConfig) -> Owner {
        config.combiner.log.journaled = config.journal.is_some();
        let journal = config.journal.clone().map(OwnerJournal::new);
        let next_retention = Instant::ZERO + config.retention_check_interval;
        Owner {
            config,
            journal,
            journal_inbox: VecDeque::new(),
            pumping: false,
            state: Arc::new(MetaState::new()),
            by_name: BTreeMap::new(),
            slots: BTreeMap::new(),
            next_key: 1,
            parked: BTreeMap::new(),
            removals: BTreeMap::new(),
            next_removal: JANITOR_IO_BASE,
            opening: BTreeSet::new(),
            open_failed: BTreeSet::new(),
            restart_needed: BTreeSet::new(),
            now: Instant::default(),
            next_retention,
            arming: BTreeMap::new(),
            outputs: VecDeque::new(),
        }
    }

    // ---- getters ----

    /// How many logs are opening, failed to open, or need a restart.
    pub fn status(&self) -> OwnerStatus {
        OwnerStatus {
            opening: self.opening.len(),
            open_failed: self.open_failed.len(),
            restart_needed: self.restart_needed.len(),
        }
    }

    /// The figures of the log of `topic_id`'s `partition`, when it is open.
    pub fn stats(
        &self,
        topic: &str,
        topic_id: TopicId,
        partition: PartitionId,
    ) -> Option<PartitionStats> {
        let key = self.by_name.get(&(Arc::from(topic), partition))?;
        let combiner = &self.slots[key].combiner;
        match (combiner.log_topic_id(), combiner.log()) {
            (Some(Some(id)), Some(log))
                if id == topic_id
                    && !matches!(log.status(), LogStatus::Opening | LogStatus::OpenFailed) =>
            {
                Some(log.stats())
            }
            _ => None,
        }
    }

    /// The high watermark of `key`'s log, if it has one open.
    pub fn high_watermark(&self, key: LogKey) -> Option<Offset> {
        self.slots
            .get(&key)
            .and_then(|slot| slot.combiner.log())
            .map(|log| log.high_watermark())
    }

    /// The (topic, partition) `key` hosts, while it lives.
    pub fn partition_of(&self, key: LogKey) -> Option<(&Arc<str>, PartitionId)> {
        self.slots
            .get(&key)
            .map(|slot| (&slot.topic, slot.partition))
    }

    /// Whether `completion` belongs to one of the owner's own removals (not to a log).
    pub fn is_removal(completion: &IoCompletion) -> bool {
        completion.id.0 >= JANITOR_IO_BASE
    }

    // ---- handlers ----

    fn on_replica(&mut self, state: Arc<MetaState>) {
        self.state = state;
        self.prune_arming();
        let state = Arc::clone(&self.state);
        let (topics, _) = state.topics_after("", usize::MAX);
        for topic in topics {
            let name: Arc<str> = Arc::from(topic.name.as_str());
            for index in 0..topic.partitions() {
                // Only this node's partitions: a peer's are committed and read on the peer.
                if topic.owner_of(PartitionId(index)) == Some(self.config.node) {
                    self.ensure(&name, PartitionId(index));
                }
            }
        }
        let keys: Vec<LogKey> = self.slots.keys().copied().collect();
        for key in keys {
            let slot = &self.slots[&key];
            let view = self.view_of(&slot.topic, slot.partition);
            if *slot.combiner.view() != view {
                self.feed(key, CombinerInput::View(view));
            }
        }
    }

    /// The combiner of `(topic, partition)`, created (and its log opened) if missing.
    fn ensure(&mut self, topic: &Arc<str>, partition: PartitionId) -> LogKey {
        if let Some(key) = self.by_name.get(&(topic.clone(), partition)) {
            return *key;
        }
        let key = LogKey(self.next_key);
        self.next_key += 1;
        let view = self.view_of(topic, partition);
        let combiner = Combiner::new(self.config.combiner.clone(), view);
        self.by_name.insert((topic.clone(), partition), key);
        self.slots.insert(
            key,
            Slot {
                topic: topic.clone(),
                partition,
                combiner,
            },
        );
        self.drain(key);
        key
    }

    fn on_read(&mut self, read: OwnerRead) {
        let key = self.ensure(&read.topic.clone(), read.partition);
        self.read(key, read);
    }

    /// Sends a read to its combiner, or parks it while the log opens.
    fn read(&mut self, key: LogKey, read: OwnerRead) {
        let combiner = &self.slots[&key].combiner;
        let live = combiner.view().live.as_ref().and_then(|live| live.topic_id);
        if live != Some(read.topic_id) {
            let error = OwnerReadError::NotLive(read.topic_id);
            self.outputs.push_back(OwnerOutput::ReadDone {
                id: read.id,
                result: Err(error),
            });
            return;
        }
        let opening = combiner.log_topic_id() != Some(live)
            || combiner
                .log()
                .is_some_and(|log| log.status() == LogStatus::Opening);
        if opening {
            let parked = self.parked.entry(key).or_default();
            if parked.len() >= PARKED_READS_MAX {
                self.outputs.push_back(OwnerOutput::ReadDone {
                    id: read.id,
                    result: Err(OwnerReadError::Log(LogReadError::Busy)),
                });
            } else {
                parked.push(read);
            }
            return;
        }
        let request = ReadRequest {
            id: read.id,
            offset: read.offset,
            records_max: read.records_max,
            bytes_max: read.bytes_max,
        };
        self.feed(key, CombinerInput::Read(request));
    }

    /// Sends the reads parked behind `key`'s log again (it finished opening, or went away).
    fn unpark(&mut self, key: LogKey) {
        let Some(parked) = self.parked.remove(&key) else {
            return;
        };
        for read in parked {
            if self.slots.contains_key(&key) {
                self.read(key, read);
            } else {
                self.outputs.push_back(OwnerOutput::ReadDone {
                    id: read.id,
                    result: Err(OwnerReadError::NotLive(read.topic_id)),
                });
            }
        }
    }

    fn on_io(&mut self, key: LogKey, completion: IoCompletion) {
        if key == JOURNAL_KEY {
            self.journal_inbox.push_back(JournalInput::Io(completion));
            return self.pump_journal();
        }
        if Owner::is_removal(&completion) {
            return self.on_removal(key, completion);
        }
        // Otherwise the combiner may be gone, and with it whoever waited for this request.
        if self.slots.contains_key(&key) {
            self.feed(key, CombinerInput::Io(completion));
        }
    }

    // ---- the combiners ----

    fn feed(&mut self, key: LogKey, input: CombinerInput) {
        let Some(slot) = self.slots.get_mut(&key) else {
            return;
        };
        crate::feed(&mut slot.combiner, self.now, input);
        self.drain(key);
        self.drop_if_idle(key);
        self.pump_journal();
    }

    /// Feeds the journal what the combiners asked of it, and carries out its answers (which may feed
    /// combiners again, whose requests queue behind).
    fn pump_journal(&mut self) {
        if self.pumping {
            return;
        }
        self.pumping = true;
        while let Some(input) = self.journal_inbox.pop_front() {
            let Some(journal) = self.journal.as_mut() else {
                break;
            };
            crate::feed(journal, self.now, input);
            let mut outputs = Vec::new();
            while let Some(output) = journal.poll_output() {
                outputs.push(output);
            }
            for output in outputs {
                match output {
                    JournalOutput::Io(request) => self.outputs.push_back(OwnerOutput::Io {
                        key: JOURNAL_KEY,
                        request,
                    }),
                    JournalOutput::Done { key, id, result } => {
                        self.feed(key, CombinerInput::JournalDone { id, result })
                    }
                    JournalOutput::SyncWanted { key } => {
                        if self.slots.contains_key(&key) {
                            self.feed(key, CombinerInput::Sync);
                        } else {
                            // Gone without a retirement (cannot hold records): nothing to keep.
                            self.journal_inbox.push_back(JournalInput::Released { key });
                        }
                    }
                    JournalOutput::Event(event) => {
                        self.outputs.push_back(OwnerOutput::Journal(event))
                    }
                }
            }
        }
        self.journal_inbox.clear();
        self.pumping = false;
    }

    /// Routes every output of one combiner, then notes its log's state and sends on the reads parked
    /// behind it once its log opened, failed or was let go.
    fn drain(&mut self, key: LogKey) {
        let mut retired = Vec::new();
        let mut log_events = false;
        let Some(slot) = self.slots.get_mut(&key) else {
            return;
        };
        while let Some(output) = slot.combiner.poll_output() {
            let event = match output {
                CombinerOutput::Io(request) => {
                    self.outputs.push_back(OwnerOutput::Io { key, request });
                    continue;
                }
                CombinerOutput::Committed { id, result } => {
                    self.outputs
                        .push_back(OwnerOutput::Committed { id, result });
                    continue;
                }
                CombinerOutput::ReadDone { id, result } => {
                    let result = result.map_err(OwnerReadError::Log);
                    self.outputs.push_back(OwnerOutput::ReadDone { id, result });
                    continue;
                }
                // Only a freeze asks for it.
                CombinerOutput::HighWatermark { id, high_watermark } => {
                    let result = high_watermark.ok_or(FreezeRefused::NoLog);
                    self.outputs
                        .push_back(OwnerOutput::FreezeArmed { query: id, result });
                    continue;
                }
                CombinerOutput::Journal { dir, id, run } => {
                    self.journal_inbox.push_back(JournalInput::Append {
                        key,
                        dir: Arc::from(dir),
                        id,
                        run,
                    });
                    continue;
                }
                CombinerOutput::Synced { through } => {
                    self.journal_inbox
                        .push_back(JournalInput::Synced { key, through });
                    continue;
                }
                CombinerOutput::SyncDeferred => {
                    self.journal_inbox
                        .push_back(JournalInput::SyncFailed { key });
                    continue;
                }
                CombinerOutput::SyncFailed { topic_id, fault } => {
                    self.journal_inbox
                        .push_back(JournalInput::SyncFailed { key });
                    LogEvent::SyncFailed { topic_id, fault }
                }
                CombinerOutput::LogOpened { topic_id, report } => {
                    log_events = true;
                    LogEvent::Opened { topic_id, report }
                }
                CombinerOutput::LogOpenFailed { topic_id, error } => {
                    log_events = true;
                    LogEvent::OpenFailed { topic_id, error }
                }
                CombinerOutput::LogLatched { topic_id, fault } => {
                    LogEvent::Latched { topic_id, fault }
                }
                CombinerOutput::Retained(range) => {
                    if self
                        .config
                        .combiner
                        .log
                        .plant
                        .is(PlantedBug::RetentionDeletesJournalNeeded)
                    {
                        self.journal_inbox.push_back(JournalInput::Released { key });
                    }
                    LogEvent::Retained(range)
                }
                CombinerOutput::RetentionFailed(fault) => LogEvent::RetentionFailed { fault },
                CombinerOutput::LogRetired { topic_id, dir } => {
                    log_events = true;
                    self.journal_inbox.push_back(JournalInput::Released { key });
                    retired.push(dir.clone());
                    LogEvent::Retired { topic_id, dir }
                }
            };
            self.outputs.push_back(OwnerOutput::Log {
                topic: slot.topic.clone(),
                partition: slot.partition,
                event,
            });
        }
        for dir in retired {
            self.list_retired(key, dir);
        }
        self.note_log_state(key);
        if log_events {
            self.unpark(key);
        }
    }

    fn note_log_state(&mut self, key: LogKey) {
        let log = self.slots.get(&key).and_then(|slot| slot.combiner.log());
        let status = log.map(|log| log.status());
        let sync_failed = log
            .and_then(|log| log.open_error())
            .is_some_and(|error| matches!(error, RecoveryError::Sync(_)));
        let mark = |set: &mut BTreeSet<LogKey>, on: bool| {
            if on {
                set.insert(key);
            } else {
                set.remove(&key);
            }
        };
        mark(
            &mut self.restart_needed,
            status == Some(LogStatus::OpenFailed) && sync_failed,
        );
        mark(&mut self.opening, status == Some(LogStatus::Opening));
        mark(&mut self.open_failed, status == Some(LogStatus::OpenFailed));
    }

    /// Drops a combiner whose name the replica no longer holds once it holds nothing.
    fn drop_if_idle(&mut self, key: LogKey) {
        let Some(slot) = self.slots.get(&key) else {
            return;
        };
        let combiner = &slot.combiner;
        let idle = combiner.view().live.is_none()
            && combiner.log().is_none()
            && combiner.queued_batches() == 0
            && !combiner.cycle_running()
            && !self.parked.contains_key(&key)
            && self.state.topic(&slot.topic).is_none();
        if !idle {
            return;
        }
        let slot = self.slots.remove(&key).expect("checked above");
        self.by_name.remove(&(slot.topic, slot.partition));
        self.opening.remove(&key);
        self.open_failed.remove(&key);
        self.restart_needed.remove(&key);
        // Lanes still running a removal are let go once it is done.
        if !self.removal_pending(key) {
            self.outputs.push_back(OwnerOutput::Forget { key });
        }
    }

    // ---- retention ----

    /// Feeds every live log its topic's retention policy.
    fn check_retention(&mut self) {
        let now_ms = self.config.combiner.unix_epoch_ms + self.now.as_nanos() / 1_000_000;
        let keys: Vec<LogKey> = self.slots.keys().copied().collect();
        for key in keys {
            let slot = &self.slots[&key];
            let Some(topic) = self.state.topic(&slot.topic) else {
                continue;
            };
            let policy = RetentionPolicy {
                now_ms,
                retention_ms: topic.settings.retention_ms,
                retention_bytes: topic.settings.retention_bytes,
            };
            self.feed(key, CombinerInput::Retain(policy));
        }
        let sizes = self
            .slots
            .values()
            .filter_map(|slot| {
                let log = slot.combiner.log()?;
                let open = !matches!(log.status(), LogStatus::Opening | LogStatus::OpenFailed);
                open.then(|| (slot.topic.clone(), slot.partition, log.stats().size_bytes))
            })
            .collect();
        self.outputs
            .push_back(OwnerOutput::RetentionChecked { sizes });
    }

    // ---- removing retired logs ----

    fn removal_pending(&self, key: LogKey) -> bool {
        self.removals.values().any(|removal| removal.key == key)
    }

    /// Submits one removal step on the combiner's commit lane (after its queued requests).
    fn remove_step(&mut self, key: LogKey, dir: String, listing: bool, ops: Vec<IoOp>) {
        let id = IoId(self.next_removal);
        self.next_removal += 1;
        self.removals.insert(id, Removal { key, dir, listing });
        let lane: IoLane = self.config.combiner.log.commit_lane;
        self.outputs.push_back(OwnerOutput::Io {
            key,
            request: IoRequest { id, lane, ops },
        });
    }

    fn list_retired(&mut self, key: LogKey, dir: String) {
        let ops = vec![IoOp::List { dir: dir.clone() }];
        self.remove_step(key, dir, true, ops);
    }

    fn on_removal(&mut self, key: LogKey, completion: IoCompletion) {
        let Some(Removal { dir, listing, .. }) = self.removals.remove(&completion.id) else {
            return;
        };
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
                self.remove_step(key, dir, false, ops);
            }
            (false, Ok(_)) => self.log_removal(key, LogEvent::Removed { dir }),
            (_, Err((op, fault))) => {
                self.log_removal(key, LogEvent::RemoveFailed { dir, op, fault });
            }
        }
        if !self.slots.contains_key(&key) && !self.removal_pending(key) {
            self.outputs.push_back(OwnerOutput::Forget { key });
        }
    }

    fn log_removal(&mut self, key: LogKey, event: LogEvent) {
        // The combiner may be gone by now: its name went with it, so the event names none.
        let (topic, partition) = match self.slots.get(&key) {
            Some(slot) => (slot.topic.clone(), slot.partition),
            None => (Arc::from(""), PartitionId(0)),
        };
        self.outputs.push_back(OwnerOutput::Log {
            topic,
            partition,
            event,
        });
    }

    /// Every hosted combiner is named once, by both maps; the state sets name only hosted ones.
    fn check_invariants(&self) {
        assert_eq!(self.by_name.len(), self.slots.len());
        for ((topic, partition), key) in &self.by_name {
            let slot = &self.slots[key];
            assert!(slot.topic == *topic && slot.partition == *partition);
        }
        for set in [&self.opening, &self.open_failed, &self.restart_needed] {
            assert!(set.iter().all(|key| self.slots.contains_key(key)));
        }
        // Each combiner checks its own invariants after every input it is fed.
        for (key, parked) in &self.parked {
            assert!(self.slots.contains_key(key) && parked.len() <= PARKED_READS_MAX);
        }
    }
}

impl Actor for Owner {
    type Input = OwnerInput;
    type Output = OwnerOutput;

    fn handle(&mut self, now: Instant, input: OwnerInput) {
        self.now = now;
        match input {
            OwnerInput::Replica(state) => self.on_replica(state),
            OwnerInput::Commit {
                topic,
                partition,
                batch,
            } => {
                let key = self.ensure(&topic, partition);
                self.feed(key, CombinerInput::Submit(batch));
            }
            OwnerInput::Abandon {
                topic,
                partition,
                id,
            } => {
                if let Some(key) = self.by_name.get(&(topic, partition)).copied() {
                    self.feed(key, CombinerInput::Abandon(id));
                }
            }
            OwnerInput::Read(read) => self.on_read(read),
            OwnerInput::Freeze(request) => self.on_freeze(request),
            OwnerInput::IoDone { key, completion } => self.on_io(key, completion),
            OwnerInput::Tick => {
                if self.journal.is_some() {
                    self.journal_inbox.push_back(JournalInput::Tick);
                    self.pump_journal();
                }
            }
        }
        if now >= self.next_retention {
            self.next_retention = now + self.config.retention_check_interval;
            self.check_retention();
        }
        // A walk over every hosted combiner: at thousands of partitions it was a quarter of a
        // release node's CPU.
        if crate::DEEP_CHECKS {
            self.check_invariants();
        }
    }

    fn poll_output(&mut self) -> Option<OwnerOutput> {
        self.outputs.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let journal = self.journal.as_ref().and_then(Actor::poll_timeout);
        Some(journal.map_or(self.next_retention, |at| at.min(self.next_retention)))
    }

    fn has_output(&self) -> bool {
        !self.outputs.is_empty()
    }
}

mod freeze;
pub use freeze::{FreezeRefused, FreezeRequest};

#[cfg(test)]
mod freeze_tests;
#[cfg(test)]
mod tests;
