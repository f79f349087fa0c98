//! The metastore host: runs the pure [`MetaReplica`] actor (raft-rs's `RawNode` and the [`MetaState`] it
//! replicates) over [`MetaDisk`], and answers the [`Metastore`] handles.
//!
//! The replica and the open files run on the generic host ([`crate::host`]), which decides only when
//! each source is read: a finished persist, else the requests waiting in the bounded mailbox
//! ([`PROPOSALS_QUEUED_MAX`], fed one by one), else the timer at the replica's `poll_timeout` once it
//! has passed on the node's [`Clock`] (virtual under madsim). The metastore host decides nothing: after
//! each input it drains the replica's outputs until `None` and executes them. A `Persist` runs on the
//! blocking pool (inline under madsim) and comes back as `PersistDone` (the replica keeps at most one
//! outstanding); the `Send`s of one turn go to [`MetaPeers::send_raft`], grouped by peer, in order
//! (the cluster transport carries them; a single node sends none); `Applied` publishes the view;
//! answers go to their callers. Raft messages from peers come in through [`Metastore::step`], and
//! heartbeats through [`Metastore::heard`], both into the same mailbox.
//!
//! Proposals work on every node: a follower's replica refuses one as "not leader", naming the leader
//! it knows, and [`Metastore::propose`] then forwards the command to that leader
//! ([`MetaPeers::propose_at`]), which proposes it on its own replica and answers with its own
//! outcome and its applied index; the follower answers once it has applied that far itself, so a
//! client's next request to the same node sees its change (read-your-writes). While no leader is known (an election), the proposal is retried every
//! [`PROPOSE_RETRY`] until [`PROPOSE_TIMEOUT`]; then it is "control plane unavailable".
//!
//! Liveness: on every tick and heartbeat the host asks [`Liveness`] which members to mark dead or
//! alive; on the leader those become proposals of its own, whose answers nobody waits for.
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
//! Decisions: the voters are given ([`MetastoreOptions::voters`]: the first three members of the
//! cluster, by id). A sole voter campaigns when it is constructed (`fast_start_sole_voter`): it leads
//! before the first proposal (this node's own join) arrives, instead of refusing proposals for the
//! one to two seconds of its own election timeout.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use narad_core::actor::Actor;
use narad_core::disk::Disk;
use narad_core::error::IoFault;
use narad_core::ids::NodeId;
use narad_core::metastore::liveness::Liveness;
use narad_core::metastore::replica::{
    MetaReplica, MetaReplicaConfig, PersistId, PersistRequest, ProposalError, ProposalId,
    ReadIndexId, RecoveredLog, ReplicaInput, ReplicaOutput, REQUEST_TIMEOUT,
};
use narad_core::metastore::{Applied, Command, MetaState, TopicError};
use raft::eraftpb::Message;
use raft::StateRole;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::{mpsc, oneshot, watch};

use super::slog_bridge;
use super::storage::{MetaDisk, MetaStorageError, Recovered};
use crate::clock::Clock;
use crate::host::{self, HostConfig, Hosted, Turn};

pub use narad_core::metastore::replica::{
    ELECTION_TICKS, HEARTBEAT_TICKS, SNAPSHOT_EVERY_ENTRIES, TICK_INTERVAL as TICK,
};

/// Requests (proposals and read barriers) waiting in the mailbox before a caller waits for room.
pub const PROPOSALS_QUEUED_MAX: usize = 1024;
/// How long a caller waits for a proposal's (or a read barrier's) answer before it is "unavailable"
/// (the replica fails the request itself after the same time).
pub const PROPOSE_TIMEOUT: Duration = REQUEST_TIMEOUT;

/// How often a proposal is tried again while no leader is known.
pub const PROPOSE_RETRY: Duration = Duration::from_millis(100);

/// Why a proposal got no answer from the state machine.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum ProposeError {
    /// The state machine refused the command (the same answer on every replica).
    #[error(transparent)]
    Refused(#[from] TopicError),
    /// No answer: disk failed, shutting down, or timed out (HTTP 503).
    #[error("control plane unavailable: {0}")]
    Unavailable(String),
    /// This replica does not lead; `leader` is the one it knows of. Only [`Metastore::propose_here`]
    /// answers it: [`Metastore::propose`] forwards to that leader instead (HTTP 503 if it surfaces).
    #[error("control plane unavailable: not the metastore leader (leader: {leader:?})")]
    NotLeader {
        /// The leader this replica knows of.
        leader: Option<NodeId>,
    },
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
    /// The leader this replica knows of.
    pub leader: Option<NodeId>,
    /// The replica's raft term.
    pub term: u64,
    /// The replica's raft commit index when the view was published.
    pub commit_index: u64,
}

/// The metastore's way to its peers: the cluster transport (absent on a single node).
pub trait MetaPeers: Send + Sync + std::fmt::Debug {
    /// Sends raft messages to `to`, in order (each raft-rs's protobuf encoding); `snapshot` says one
    /// of them carries a snapshot. Never blocks; messages that cannot be sent are dropped (raft sends
    /// again). The outcome comes back through [`Metastore::report`].
    fn send_raft(&self, to: NodeId, messages: Vec<Vec<u8>>, snapshot: bool);
    /// Asks `leader` to propose the encoded command on its own replica; its answer, with the raft
    /// index the leader had applied when it answered.
    fn propose_at(
        &self,
        leader: NodeId,
        command: Vec<u8>,
    ) -> crate::future::BoxFuture<'static, Result<(Applied, u64), ProposeError>>;
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
    /// The voters when the log holds no snapshot (empty: this node alone).
    pub voters: Vec<NodeId>,
    /// The learners when the log holds no snapshot: the members beyond the voters.
    pub learners: Vec<NodeId>,
    /// The cluster transport, for raft messages and forwarded proposals (`None`: a single node).
    pub peers: Option<Arc<dyn MetaPeers>>,
    /// A failpoint: while a file exists at this path, no newer view is published and no caller is
    /// answered (raft itself goes on), so the node acts on a lagging replica's state. Answers and the
    /// view follow within a tick of the file's removal. `None` in production.
    pub hold_file: Option<PathBuf>,
    /// The same failpoint as a flag: while it is set the view is held as by [`Self::hold_file`]
    /// (the simulator's lag fault: a flag stays deterministic where a file on the host would not).
    pub hold_flag: Option<Arc<AtomicBool>>,
    /// The bug planted in the leader's liveness decisions (simulator only).
    pub plant: narad_core::planted::Plant,
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
            voters: Vec::new(),
            learners: Vec::new(),
            peers: None,
            hold_file: None,
            hold_flag: None,
            plant: narad_core::planted::Plant::NONE,
        }
    }
}

/// A handle on the running metastore; cheap to clone.
#[derive(Clone, Debug)]
pub struct Metastore {
    node: NodeId,
    requests: mpsc::Sender<Request>,
    view: watch::Receiver<Arc<MetaView>>,
    peers: Option<Arc<dyn MetaPeers>>,
}

/// Reports raft deliveries to a metastore for as long as it runs ([`Metastore::delivery_reports`]).
#[derive(Clone, Debug)]
pub struct DeliveryReports(mpsc::WeakSender<Request>);

impl DeliveryReports {
    /// As [`Metastore::report`]; nothing once the metastore is gone.
    pub fn report(&self, peer: NodeId, delivered: bool, snapshot: bool) {
        if let Some(requests) = self.0.upgrade() {
            let _ = requests.try_send(Request::Report {
                peer,
                delivered,
                snapshot,
            });
        }
    }
}

/// Where a proposal's answer goes: the replica's own, so a "not leader" can be forwarded.
type ProposalReply = oneshot::Sender<Result<Applied, ProposalError>>;
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
    /// Raft messages from a peer.
    Raft(Vec<Message>),
    /// A heartbeat from a peer.
    Heard(NodeId),
    /// How a delivery of raft messages to a peer went.
    Report {
        peer: NodeId,
        delivered: bool,
        snapshot: bool,
    },
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Request::Propose { command, .. } => {
                f.debug_struct("Propose").field("command", command).finish()
            }
            Request::ReadIndex { .. } => f.write_str("ReadIndex"),
            Request::Raft(messages) => write!(f, "Raft({} messages)", messages.len()),
            Request::Heard(node) => write!(f, "Heard({node})"),
            Request::Report {
                peer, delivered, ..
            } => write!(f, "Report({peer}, delivered: {delivered})"),
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
        let clock = options.clock.clone().unwrap_or_else(Clock::start);
        let hosted = MetaHost::new(meta_disk, recovered, &options, &clock)?;
        let view = hosted.view_tx.subscribe();
        let config = HostConfig {
            mailbox_capacity: PROPOSALS_QUEUED_MAX,
            // Persists come back as answers: nothing uses the completions channel.
            completions_capacity: 1,
        };
        let requests = host::spawn(config, clock, move |_completions| hosted);
        let metastore = Metastore {
            node: options.node_id,
            requests,
            view,
            peers: options.peers.clone(),
        };
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

    /// Proposes a command and waits until it is applied (or [`PROPOSE_TIMEOUT`] passes): on this
    /// replica if it leads, else forwarded to the leader (see the module documentation).
    pub async fn propose(&self, command: Command) -> Result<Applied, ProposeError> {
        let deadline = tokio::time::Instant::now() + PROPOSE_TIMEOUT;
        loop {
            let leader = match self.propose_here(command.clone()).await {
                Err(ProposeError::NotLeader { leader }) => {
                    leader.filter(|leader| *leader != self.node)
                }
                outcome => return outcome,
            };
            if let (Some(leader), Some(peers)) = (leader, &self.peers) {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let forwarded =
                    tokio::time::timeout(left, peers.propose_at(leader, command.encode())).await;
                match forwarded {
                    // It stopped leading meanwhile: ask again once the new leader is known.
                    Ok(Err(ProposeError::NotLeader { .. })) => {}
                    Ok(Ok((applied, index))) => {
                        // Read-your-writes: the caller's next request to this node sees the
                        // change. Waited for within the proposal's time only: it is committed
                        // either way.
                        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                        let _ = tokio::time::timeout(
                            left,
                            self.wait_until(|view| view.applied_index >= index),
                        )
                        .await;
                        return Ok(applied);
                    }
                    Ok(Err(error)) => return Err(error),
                    Err(_) => break,
                }
            }
            if tokio::time::Instant::now() + PROPOSE_RETRY >= deadline {
                break;
            }
            tokio::time::sleep(PROPOSE_RETRY).await;
        }
        Err(ProposeError::Unavailable(
            "no metastore leader answered in time (no quorum?)".to_string(),
        ))
    }

    /// Proposes a command on this replica only (a forwarded proposal: never forwarded again).
    pub async fn propose_here(&self, command: Command) -> Result<Applied, ProposeError> {
        let (reply, answer) = oneshot::channel();
        let answer = self
            .ask(Request::Propose { command, reply }, answer, "proposal")
            .await?;
        answer.map_err(propose_error)
    }

    /// Hands raft messages from a peer to the replica; dropped when the mailbox is full (raft sends
    /// again).
    pub fn step(&self, messages: Vec<Message>) {
        let _ = self.requests.try_send(Request::Raft(messages));
    }

    /// How a delivery of raft messages to `peer` went: raft learns a peer it could not reach (it then
    /// probes it gently) and whether a snapshot arrived (until told, it sends that follower nothing
    /// more).
    pub fn report(&self, peer: NodeId, delivered: bool, snapshot: bool) {
        let _ = self.requests.try_send(Request::Report {
            peer,
            delivered,
            snapshot,
        });
    }

    /// A handle that reports raft deliveries ([`Metastore::report`]) without keeping the
    /// metastore alive: the cluster's delivery tasks hold it, and a strong handle there would make
    /// a cycle (metastore → its peers → the deliveries → metastore) that outlives the node.
    pub fn delivery_reports(&self) -> DeliveryReports {
        DeliveryReports(self.requests.downgrade())
    }

    /// Whether the host task has stopped (nothing will answer again).
    pub fn is_stopped(&self) -> bool {
        self.requests.is_closed()
    }

    /// Notes a heartbeat from `node` (dropped when the mailbox is full: the next one comes in a second).
    pub fn heard(&self, node: NodeId) {
        let _ = self.requests.try_send(Request::Heard(node));
    }

    /// A read barrier: resolves once this replica has applied everything committed at the time of the
    /// call, as confirmed by a quorum (ReadIndex; a sole voter confirms itself once it leads), so the
    /// [`Metastore::view`] read afterwards is linearizable. Fails after [`PROPOSE_TIMEOUT`] without a
    /// quorum, or when the metastore latched or stopped.
    pub async fn read_index(&self) -> Result<(), ProposeError> {
        let (reply, answer) = oneshot::channel();
        self.ask(Request::ReadIndex { reply }, answer, "read barrier")
            .await?
    }

    async fn ask<T>(
        &self,
        request: Request,
        answer: oneshot::Receiver<T>,
        what: &str,
    ) -> Result<T, ProposeError> {
        let outcome = tokio::time::timeout(PROPOSE_TIMEOUT, async {
            self.requests.send(request).await.map_err(|_| stopped())?;
            answer.await.map_err(|_| stopped())
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
        // Until it lands: a member's peers may not be up yet, or electing.
        loop {
            match self.propose(command.clone()).await {
                Ok(_) => return,
                Err(ProposeError::Refused(error)) => {
                    tracing::error!(%error, "the metastore refused this node as a member");
                    return;
                }
                Err(error @ (ProposeError::Unavailable(_) | ProposeError::NotLeader { .. })) => {
                    let reason = error.to_string();
                    if self.view().failed.is_some() || self.requests.is_closed() {
                        tracing::error!(%reason, "could not add this node to the metastore members");
                        return;
                    }
                    tracing::info!(%reason, "joining the cluster: the metastore has no leader yet; retrying");
                    tokio::time::sleep(PROPOSE_RETRY * 5).await;
                }
            }
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

/// A finished persist: the files back, with the request's outcome.
struct Persisted {
    disk: MetaDisk,
    id: PersistId,
    result: Result<(), IoFault>,
}

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
    Proposal(ProposalReply, Result<Applied, ProposalError>),
    Read(ReadReply, Result<(), ProposeError>),
}

/// The replica and the files, run by the generic host.
struct MetaHost {
    replica: MetaReplica,
    /// The open files; `None` while a persist has them.
    disk: Option<MetaDisk>,
    next_request: u64,
    proposals: BTreeMap<ProposalId, ProposalReply>,
    reads: BTreeMap<ReadIndexId, ReadReply>,
    answers: Vec<Answer>,
    view_tx: watch::Sender<Arc<MetaView>>,
    /// Every handle is gone.
    closed: bool,
    peers: Option<Arc<dyn MetaPeers>>,
    /// This turn's raft messages, by peer, in order, and whether one carries a snapshot.
    outbox: BTreeMap<u64, (Vec<Vec<u8>>, bool)>,
    liveness: Liveness,
    /// See [`MetastoreOptions::hold_file`].
    hold_file: Option<PathBuf>,
    /// See [`MetastoreOptions::hold_flag`].
    hold_flag: Option<Arc<AtomicBool>>,
    /// The view changed while held: publish it on release.
    unpublished: bool,
    /// The hold was in force at the last drain (its start and end are logged).
    held: bool,
}

fn view_of(replica: &MetaReplica) -> MetaView {
    MetaView {
        state: replica.state().clone(),
        applied_index: replica.applied_index().0,
        caught_up: replica.caught_up(),
        failed: replica.failure().map(|failure| failure.to_string()),
        leader: replica.leader(),
        term: replica.term(),
        commit_index: replica.commit_index(),
    }
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
        ProposalError::NotLeader { leader } => ProposeError::NotLeader { leader },
        error @ (ProposalError::TooLarge { .. }
        | ProposalError::Overloaded
        | ProposalError::Dropped
        | ProposalError::Lost
        | ProposalError::Unknown
        | ProposalError::TimedOut
        | ProposalError::Undecodable(_)
        | ProposalError::Latched(_)) => ProposeError::Unavailable(error.to_string()),
    }
}

impl MetaHost {
    fn new(
        disk: MetaDisk,
        recovered: Recovered,
        options: &MetastoreOptions,
        clock: &Clock,
    ) -> Result<MetaHost, MetaStorageError> {
        let voters = if options.voters.is_empty() {
            vec![options.node_id]
        } else {
            options.voters.clone()
        };
        let mut config = MetaReplicaConfig::new(options.node_id, voters, slog_bridge::logger());
        config.learners = options.learners.clone();
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
        let view = view_of(&replica);
        Ok(MetaHost {
            replica,
            disk: Some(disk),
            next_request: 0,
            proposals: BTreeMap::new(),
            reads: BTreeMap::new(),
            answers: Vec::new(),
            view_tx: watch::Sender::new(Arc::new(view)),
            closed: false,
            peers: options.peers.clone(),
            outbox: BTreeMap::new(),
            liveness: Liveness::with_plant(options.node_id, options.plant),
            hold_file: options.hold_file.clone(),
            hold_flag: options.hold_flag.clone(),
            unpublished: false,
            held: false,
        })
    }

    /// Proposes the liveness changes due now (on the leader only); nobody waits for their answers.
    fn check_liveness(&mut self, turn: &mut Turn<'_, Persisted>) {
        let leader = self.replica.role() == StateRole::Leader;
        let changes = self
            .liveness
            .decide(turn.now(), leader, self.replica.state());
        for command in changes {
            tracing::info!(?command, "metastore leader: member liveness changed");
            let id = ProposalId(self.next_request);
            self.next_request += 1;
            self.handle(turn, ReplicaInput::Propose { id, command });
        }
    }

    /// Feeds one input and carries out what the replica emits.
    fn handle(&mut self, turn: &mut Turn<'_, Persisted>, input: ReplicaInput) {
        narad_core::feed(&mut self.replica, turn.now(), input);
        self.drain(turn);
    }

    fn on_request(&mut self, turn: &mut Turn<'_, Persisted>, request: Request) {
        let id = self.next_request;
        self.next_request += 1;
        match request {
            Request::Propose { command, reply } => {
                let id = ProposalId(id);
                self.proposals.insert(id, reply);
                self.handle(turn, ReplicaInput::Propose { id, command });
            }
            Request::ReadIndex { reply } => {
                let id = ReadIndexId(id);
                self.reads.insert(id, reply);
                self.handle(turn, ReplicaInput::ReadIndex { id });
            }
            Request::Raft(messages) => {
                for message in messages {
                    self.handle(turn, ReplicaInput::Raft(message));
                }
            }
            Request::Heard(node) => {
                self.liveness.heard(node, turn.now());
                self.check_liveness(turn);
            }
            Request::Report {
                peer,
                delivered,
                snapshot,
            } => {
                if snapshot {
                    self.handle(turn, ReplicaInput::SnapshotSent { peer, delivered });
                }
                if !delivered {
                    self.handle(turn, ReplicaInput::PeerUnreachable { peer });
                }
            }
        }
    }

    /// Executes the replica's outputs; publishes the view if it changed, then sends the answers.
    fn drain(&mut self, turn: &mut Turn<'_, Persisted>) {
        let mut changed = false;
        while let Some(output) = self.replica.poll_output() {
            match output {
                ReplicaOutput::Persist(request) => {
                    let mut disk = self
                        .disk
                        .take()
                        .expect("the replica keeps one persist outstanding");
                    turn.answer_later(blocking(move || {
                        let result = persist(&mut disk, &request);
                        Persisted {
                            disk,
                            id: request.id,
                            result,
                        }
                    }));
                }
                ReplicaOutput::Send(message) => {
                    use protobuf::Message as _;
                    let snapshot =
                        message.get_msg_type() == raft::eraftpb::MessageType::MsgSnapshot;
                    match message.write_to_bytes() {
                        Ok(bytes) => {
                            let outbox = self.outbox.entry(message.to).or_default();
                            outbox.0.push(bytes);
                            outbox.1 |= snapshot;
                        }
                        Err(error) => tracing::error!(%error, "a raft message did not encode"),
                    }
                }
                ReplicaOutput::Applied { .. } => changed = true,
                ReplicaOutput::Answered { id, result } => {
                    if let Some(reply) = self.proposals.remove(&id) {
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
        let outbox = std::mem::take(&mut self.outbox);
        for (to, (messages, snapshot)) in outbox {
            match &self.peers {
                Some(peers) => peers.send_raft(NodeId(to as u32), messages, snapshot),
                None => tracing::error!(to, "a raft message for a peer on a single node"),
            }
        }
        // A new leader or term is published at once (forwarding and `/v1/cluster/members` read it);
        // the commit index rides along with the next publish, as every publish clones the state.
        let view = self.view_tx.borrow().clone();
        let moved = view.leader != self.replica.leader() || view.term != self.replica.term();
        self.unpublished |= changed || moved;
        if self.hold() {
            return;
        }
        if std::mem::take(&mut self.unpublished) {
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
        self.view_tx.send_replace(Arc::new(view_of(&self.replica)));
    }

    /// Whether the hold failpoint is in force now; logs when it starts and ends.
    fn hold(&mut self) -> bool {
        let held = self.hold_file.as_ref().is_some_and(|path| path.exists())
            || self
                .hold_flag
                .as_ref()
                .is_some_and(|flag| flag.load(Ordering::Relaxed));
        if held != self.held {
            self.held = held;
            let applied_index = self.replica.applied_index().0;
            if held {
                tracing::warn!(applied_index, "metastore view held (failpoint)");
            } else {
                tracing::warn!(applied_index, "metastore view released (failpoint)");
            }
        }
        held
    }
}

impl Hosted for MetaHost {
    type Command = Request;
    type Completion = Persisted;

    fn on_start(&mut self, turn: &mut Turn<'_, Persisted>) {
        // The fast start's campaign, emitted at construction.
        self.drain(turn);
    }

    fn on_commands(&mut self, turn: &mut Turn<'_, Persisted>, commands: &mut VecDeque<Request>) {
        for request in commands.drain(..) {
            self.on_request(turn, request);
        }
    }

    fn on_mailbox_closed(&mut self, _turn: &mut Turn<'_, Persisted>) {
        self.closed = true;
    }

    fn on_completion(&mut self, turn: &mut Turn<'_, Persisted>, persisted: Persisted) {
        let Persisted { disk, id, result } = persisted;
        self.disk = Some(disk);
        self.handle(turn, ReplicaInput::PersistDone { id, result });
    }

    fn on_timeout(&mut self, turn: &mut Turn<'_, Persisted>) {
        self.handle(turn, ReplicaInput::Tick);
        self.check_liveness(turn);
    }

    fn poll_timeout(&self) -> Option<narad_core::time::Instant> {
        self.replica.poll_timeout()
    }

    /// Once every handle is gone and no persist is running (so what it writes is not cut off).
    fn finished(&self) -> bool {
        self.closed && self.disk.is_some()
    }
}

#[cfg(test)]
mod tests;
