//! The metastore host: runs the pure [`MetaReplica`] actor (raft-rs's `RawNode` and the [`MetaState`] it
//! replicates) over [`MetaDisk`], and answers the [`Metastore`] handles.
//!
//! One task owns the replica and the open files. It decides nothing: it feeds one input per turn — a
//! finished persist first, then a due tick, then a request from the bounded mailbox
//! ([`PROPOSALS_QUEUED_MAX`]) — and drains the replica's outputs until `None` after each, executing
//! them: a `Persist` runs on the blocking pool (inline under madsim; at most one is outstanding, and
//! its `PersistDone` comes back as an input), a `Send` has no transport yet (a sole voter sends none;
//! one that appears is logged as an error), `Applied` publishes the view, answers go to their callers.
//! Ticks are fed at the replica's `poll_timeout`, read on the node's [`Clock`] (virtual under madsim),
//! and the replica itself decides whether a tick is due.
//!
//! A proposal is answered once its entry is applied, with the state machine's own answer, so "created"
//! means "in the durable log and applied". [`Metastore::read_index`] is the replica's ReadIndex barrier:
//! it returns once this replica has applied everything committed when it was called, as confirmed by a
//! quorum (a sole voter confirms itself).
//!
//! Reads come from the local replica: [`Metastore::view`] is the state as of the last applied entry,
//! published copy-on-write through a `watch` channel (metadata changes are rare; readers never block the
//! host). Answers are sent only after the view that shows them is published, so a caller answered
//! "created" finds its topic in the view on any thread. `caught_up` turns true once everything the log
//! held at start-up is applied again, which is what `/readyz` waits for.
//!
//! A disk failure latches the replica: pending and later proposals get [`ProposeError::Unavailable`],
//! reads keep serving the last applied state, and a restart is the only way out (as for the WAL).
//!
//! Decisions: one voter for now (the cluster issue adds peers and a transport for `Send`). The replica
//! is configured to campaign when it is constructed if it is the only voter (`fast_start_sole_voter`):
//! it leads before the first proposal (this node's own join) arrives, instead of refusing proposals
//! for the one to two seconds of its own election timeout.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use narad_core::actor::Actor;
use narad_core::disk::Disk;
use narad_core::error::IoFault;
use narad_core::ids::NodeId;
use narad_core::metastore::replica::{
    MetaReplica, MetaReplicaConfig, PersistId, PersistRequest, ProposalError, ProposalId, ReadId,
    RecoveredLog, ReplicaInput, ReplicaOutput, REQUEST_TIMEOUT,
};
use narad_core::metastore::{Applied, Command, MetaState, TopicError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::{mpsc, oneshot, watch};

use super::slog_bridge;
use super::storage::{MetaDisk, MetaStorageError, Recovered};
use crate::clock::{Clock, WakeTimer};

pub use narad_core::metastore::replica::{
    ELECTION_TICKS, HEARTBEAT_TICKS, SNAPSHOT_EVERY_ENTRIES, TICK_INTERVAL as TICK,
};

/// Requests (proposals and read barriers) waiting in the mailbox before a caller waits for room.
pub const PROPOSALS_QUEUED_MAX: usize = 1024;
/// How long a caller waits for a proposal's (or a read barrier's) answer before it is "unavailable"
/// (the replica fails the request itself after the same time).
pub const PROPOSE_TIMEOUT: Duration = REQUEST_TIMEOUT;
/// How far out the host's timer sits while the latched replica wants no tick.
const IDLE_WAKE: Duration = Duration::from_secs(3600);

/// Why a proposal got no answer from the state machine.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// The state machine refused the command (the same answer on every replica).
    #[error(transparent)]
    Refused(#[from] TopicError),
    /// No answer: not the leader, disk failed, shutting down, or timed out (HTTP 503).
    #[error("control plane unavailable: {0}")]
    Unavailable(String),
}

/// What the local replica shows.
#[derive(Clone, Debug, Default)]
pub struct MetaView {
    /// The state after the last applied entry.
    pub state: MetaState,
    /// Raft index of that entry.
    pub applied_index: u64,
    /// Whether everything the log held at start-up has been applied again.
    pub caught_up: bool,
    /// The disk failure that latched the metastore, if any.
    pub failed: Option<String>,
}

/// Who this node is in the metastore, its snapshot cadence and its seeds.
#[derive(Clone, Debug)]
pub struct MetastoreOptions {
    /// Raft id and member id.
    pub node_id: NodeId,
    /// Address recorded in the member set.
    pub addr: String,
    /// Applied entries between snapshots ([`SNAPSHOT_EVERY_ENTRIES`]).
    pub snapshot_every_entries: u64,
    /// Seeds this start's proposal nonce (mixed with the log's position at start by the replica), so
    /// simulated runs replay; `None` draws the nonce from the OS.
    pub boot_nonce: Option<u64>,
    /// Seeds the replica's election jitter (its stream is the node id).
    pub seed: u64,
    /// The clock the replica's ticks are timed on; `None`: one started at open.
    pub clock: Option<Clock>,
}

impl MetastoreOptions {
    /// Options with the default snapshot cadence, seed 0 and a clock of its own.
    pub fn new(node_id: NodeId, addr: String) -> Self {
        MetastoreOptions {
            node_id,
            addr,
            snapshot_every_entries: SNAPSHOT_EVERY_ENTRIES,
            boot_nonce: None,
            seed: 0,
            clock: None,
        }
    }
}

/// A handle on the running metastore; cheap to clone.
#[derive(Clone, Debug)]
pub struct Metastore {
    requests: mpsc::Sender<Request>,
    view: watch::Receiver<Arc<MetaView>>,
}

/// Where a proposal's answer goes.
type ProposalReply = oneshot::Sender<Result<Applied, ProposeError>>;
/// Where a read barrier's answer goes.
type ReadReply = oneshot::Sender<Result<(), ProposeError>>;

/// A caller's request, through the mailbox.
enum Request {
    Propose {
        command: Command,
        reply: ProposalReply,
    },
    ReadIndex {
        reply: ReadReply,
    },
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Request::Propose { command, .. } => {
                f.debug_struct("Propose").field("command", command).finish()
            }
            Request::ReadIndex { .. } => f.write_str("ReadIndex"),
        }
    }
}

fn stopped() -> ProposeError {
    ProposeError::Unavailable("metastore stopped".to_string())
}

impl Metastore {
    /// Opens the metastore files on `disk`, restores the state and starts the host task, which replays
    /// the log and then adds this node to the member set if it is not there. The task ends when every
    /// handle is dropped. Use [`Metastore::wait_caught_up`] before trusting reads.
    pub async fn open(
        disk: Arc<dyn Disk>,
        options: MetastoreOptions,
    ) -> Result<Metastore, MetaStorageError> {
        let (meta_disk, recovered) = blocking(move || MetaDisk::open(disk)).await?;
        if recovered.torn_bytes > 0 {
            tracing::warn!(
                torn_bytes = recovered.torn_bytes,
                "metastore log had a torn tail; truncated"
            );
        }
        let host = Host::new(meta_disk, recovered, &options)?;
        let (requests, mailbox) = mpsc::channel(PROPOSALS_QUEUED_MAX);
        let view = host.view_tx.subscribe();
        tokio::spawn(host.run(mailbox));
        let metastore = Metastore { requests, view };
        let joining = metastore.clone();
        tokio::spawn(async move { joining.join_as_member(&options).await });
        Ok(metastore)
    }

    /// The local replica's state as of the last applied entry.
    pub fn view(&self) -> Arc<MetaView> {
        self.view.borrow().clone()
    }

    /// A receiver that wakes on every applied change of the local replica (and on a latch).
    pub fn subscribe(&self) -> watch::Receiver<Arc<MetaView>> {
        self.view.clone()
    }

    /// Waits until the replica has applied everything its log held at start-up (or failed).
    pub async fn wait_caught_up(&self) -> Result<(), ProposeError> {
        self.wait_until(|view| view.caught_up).await
    }

    /// Waits until the view satisfies `predicate`; fails if the metastore latched or stopped first.
    pub async fn wait_until(
        &self,
        mut predicate: impl FnMut(&MetaView) -> bool,
    ) -> Result<(), ProposeError> {
        let mut view = self.view.clone();
        let result = view
            .wait_for(|view| predicate(view) || view.failed.is_some())
            .await;
        match result {
            Ok(view) => match &view.failed {
                Some(failure) => Err(ProposeError::Unavailable(failure.clone())),
                None => Ok(()),
            },
            Err(_) => Err(stopped()),
        }
    }

    /// Proposes a command and waits until it is applied (or [`PROPOSE_TIMEOUT`] passes).
    pub async fn propose(&self, command: Command) -> Result<Applied, ProposeError> {
        let (reply, answer) = oneshot::channel();
        self.ask(Request::Propose { command, reply }, answer, "proposal")
            .await
    }

    /// A read barrier: resolves once this replica has applied everything committed at the time of the
    /// call, as confirmed by a quorum (ReadIndex; a sole voter confirms itself once it leads), so the
    /// [`Metastore::view`] read afterwards is linearizable. Fails after [`PROPOSE_TIMEOUT`] without a
    /// quorum, or when the metastore latched or stopped.
    pub async fn read_index(&self) -> Result<(), ProposeError> {
        let (reply, answer) = oneshot::channel();
        self.ask(Request::ReadIndex { reply }, answer, "read barrier")
            .await
    }

    async fn ask<T>(
        &self,
        request: Request,
        answer: oneshot::Receiver<Result<T, ProposeError>>,
        what: &str,
    ) -> Result<T, ProposeError> {
        let outcome = tokio::time::timeout(PROPOSE_TIMEOUT, async {
            self.requests.send(request).await.map_err(|_| stopped())?;
            answer.await.map_err(|_| stopped())?
        })
        .await;
        match outcome {
            Ok(result) => result,
            Err(_) => Err(ProposeError::Unavailable(format!(
                "metastore {what} timed out"
            ))),
        }
    }

    /// Adds this node to the member set once the replica is caught up, if it is not there yet.
    async fn join_as_member(&self, options: &MetastoreOptions) {
        if self.wait_caught_up().await.is_err() {
            return;
        }
        let known = self.view().state.members().get(&options.node_id).cloned();
        if known.is_some_and(|member| member.addr == options.addr) {
            return;
        }
        let command = Command::AddMember {
            node: options.node_id,
            addr: options.addr.clone(),
        };
        if let Err(error) = self.propose(command).await {
            tracing::error!(%error, "could not add this node to the metastore members");
        }
    }
}

/// Runs disk work off the async workers: on the blocking pool, or inline under madsim (whose disk is in
/// memory, and which has no blocking pool).
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    #[cfg(madsim)]
    {
        work()
    }
    #[cfg(not(madsim))]
    {
        match tokio::task::spawn_blocking(work).await {
            Ok(value) => value,
            Err(error) => std::panic::resume_unwind(error.into_panic()),
        }
    }
}

/// A persist running on the blocking pool: it gives the files back with the request's outcome.
type PersistRun = Pin<Box<dyn Future<Output = (MetaDisk, PersistId, Result<(), IoFault>)> + Send>>;

/// Performs one persist request's writes, in the order the replica states.
fn persist(disk: &mut MetaDisk, request: &PersistRequest) -> Result<(), IoFault> {
    if let Some(write) = &request.snapshot {
        disk.store_snapshot(&write.snapshot, &write.log)?;
    }
    disk.append(&request.entries)?;
    match &request.hard_state {
        Some(hard_state) => disk.store_hard_state(hard_state),
        None => Ok(()),
    }
}

/// An answer, sent once the view that shows it is published.
enum Answer {
    Proposal(ProposalReply, Result<Applied, ProposeError>),
    Read(ReadReply, Result<(), ProposeError>),
}

/// The task that owns the replica and the files.
struct Host {
    replica: MetaReplica,
    /// The open files; `None` while a persist has them.
    disk: Option<MetaDisk>,
    clock: Clock,
    next_request: u64,
    proposals: BTreeMap<ProposalId, ProposalReply>,
    reads: BTreeMap<ReadId, ReadReply>,
    answers: Vec<Answer>,
    view_tx: watch::Sender<Arc<MetaView>>,
}

fn recovered_log(recovered: Recovered) -> RecoveredLog {
    RecoveredLog {
        snapshot: recovered.snapshot,
        hard_state: recovered.hard_state,
        entries: recovered.entries,
    }
}

/// The caller's form of the replica's answer: only the state machine's refusals are not "unavailable".
fn propose_error(error: ProposalError) -> ProposeError {
    match error {
        ProposalError::Refused(refusal) => ProposeError::Refused(refusal),
        error @ (ProposalError::NotLeader { .. }
        | ProposalError::TooLarge { .. }
        | ProposalError::Overloaded
        | ProposalError::Dropped
        | ProposalError::Lost
        | ProposalError::Unknown
        | ProposalError::TimedOut
        | ProposalError::Undecodable(_)
        | ProposalError::Latched(_)) => ProposeError::Unavailable(error.to_string()),
    }
}

impl Host {
    fn new(
        disk: MetaDisk,
        recovered: Recovered,
        options: &MetastoreOptions,
    ) -> Result<Host, MetaStorageError> {
        let clock = options.clock.clone().unwrap_or_else(Clock::start);
        let mut config = MetaReplicaConfig::new(
            options.node_id,
            vec![options.node_id],
            slog_bridge::logger(),
        );
        config.election_seed = options.seed;
        config.boot_nonce = options
            .boot_nonce
            .unwrap_or_else(|| ChaCha8Rng::from_os_rng().random());
        config.snapshot_every_entries = options.snapshot_every_entries;
        config.fast_start_sole_voter = true;
        let replica =
            MetaReplica::new(config, recovered_log(recovered), clock.now()).map_err(|error| {
                MetaStorageError::Corrupt {
                    path: "metastore".to_string(),
                    reason: error.to_string(),
                }
            })?;
        let view = MetaView {
            state: replica.state().clone(),
            applied_index: replica.applied_index().0,
            caught_up: replica.caught_up(),
            failed: None,
        };
        Ok(Host {
            replica,
            disk: Some(disk),
            clock,
            next_request: 0,
            proposals: BTreeMap::new(),
            reads: BTreeMap::new(),
            answers: Vec::new(),
            view_tx: watch::Sender::new(Arc::new(view)),
        })
    }

    /// The turn loop: one input (a finished persist, else a due tick, else a request), then the
    /// replica's outputs drained to `None`. Ends when every handle is dropped.
    async fn run(mut self, mut mailbox: mpsc::Receiver<Request>) {
        let mut running: Option<PersistRun> = None;
        let mut timer = WakeTimer::at(self.wake_at());
        loop {
            self.drain(&mut running);
            timer.reset(self.wake_at());
            // Biased: an unbiased select draws from tokio's thread RNG, which the simulator cannot seed.
            tokio::select! {
                biased;
                (disk, id, result) = async { running.as_mut().expect("guarded").await },
                    if running.is_some() =>
                {
                    running = None;
                    self.disk = Some(disk);
                    self.handle(ReplicaInput::PersistDone { id, result });
                }
                () = &mut timer => self.handle(ReplicaInput::Tick),
                request = mailbox.recv() => match request {
                    Some(request) => self.on_request(request),
                    None => return,
                },
            }
        }
    }

    fn wake_at(&self) -> tokio::time::Instant {
        match self.replica.poll_timeout() {
            Some(at) => self.clock.to_tokio(at),
            None => tokio::time::Instant::now() + IDLE_WAKE,
        }
    }

    fn handle(&mut self, input: ReplicaInput) {
        let now = self.clock.now();
        self.replica.handle(now, input);
    }

    fn on_request(&mut self, request: Request) {
        let id = self.next_request;
        self.next_request += 1;
        match request {
            Request::Propose { command, reply } => {
                let id = ProposalId(id);
                self.proposals.insert(id, reply);
                self.handle(ReplicaInput::Propose { id, command });
            }
            Request::ReadIndex { reply } => {
                let id = ReadId(id);
                self.reads.insert(id, reply);
                self.handle(ReplicaInput::ReadIndex { id });
            }
        }
    }

    /// Executes the replica's outputs; publishes the view if it changed, then sends the answers.
    fn drain(&mut self, running: &mut Option<PersistRun>) {
        let mut changed = false;
        while let Some(output) = self.replica.poll_output() {
            match output {
                ReplicaOutput::Persist(request) => {
                    assert!(
                        running.is_none(),
                        "the replica keeps one persist outstanding"
                    );
                    let mut disk = self
                        .disk
                        .take()
                        .expect("the host owns its files between persists");
                    *running = Some(Box::pin(blocking(move || {
                        let result = persist(&mut disk, &request);
                        (disk, request.id, result)
                    })));
                }
                ReplicaOutput::Send(message) => {
                    tracing::error!(
                        to = message.to,
                        "metastore has no transport for a raft message yet"
                    );
                }
                ReplicaOutput::Applied { .. } => changed = true,
                ReplicaOutput::Answered { id, result } => {
                    if let Some(reply) = self.proposals.remove(&id) {
                        let result = result.map_err(propose_error);
                        self.answers.push(Answer::Proposal(reply, result));
                    }
                }
                ReplicaOutput::ReadIndexReady { id, .. } => {
                    if let Some(reply) = self.reads.remove(&id) {
                        self.answers.push(Answer::Read(reply, Ok(())));
                    }
                }
                ReplicaOutput::ReadIndexFailed { id, error } => {
                    if let Some(reply) = self.reads.remove(&id) {
                        let error = ProposeError::Unavailable(error.to_string());
                        self.answers.push(Answer::Read(reply, Err(error)));
                    }
                }
                ReplicaOutput::Latched(failure) => {
                    tracing::error!(%failure, "metastore latched: proposals are refused until restart");
                    changed = true;
                }
            }
        }
        if changed {
            self.publish();
        }
        for answer in self.answers.drain(..) {
            // A caller that stopped waiting does not need the answer.
            match answer {
                Answer::Proposal(reply, result) => {
                    let _ = reply.send(result);
                }
                Answer::Read(reply, result) => {
                    let _ = reply.send(result);
                }
            }
        }
    }

    fn publish(&self) {
        let view = MetaView {
            state: self.replica.state().clone(),
            applied_index: self.replica.applied_index().0,
            caught_up: self.replica.caught_up(),
            failed: self.replica.failure().map(|failure| failure.to_string()),
        };
        self.view_tx.send_replace(Arc::new(view));
    }
}

#[cfg(test)]
mod tests;
