//! The metastore replica: raft-rs's sans-IO `RawNode` and the [`MetaState`] it replicates, as one pure
//! actor. The driver persists, sends and ticks; every decision is made here.
//!
//! # Contract
//! - **Persist is a round trip.** raft's `Ready` is handled with its async-persist API: the new entries,
//!   a changed hard state (term or vote; commit is not stored) and any snapshot become one
//!   [`ReplicaOutput::Persist`]; raft is told with `advance_append_async` and learns they are durable
//!   only from [`ReplicaInput::PersistDone`] (`on_persist_ready`). Until then the leader does not count
//!   its own copy towards a commit, and a follower sends none of the messages that ready produced
//!   (append and vote answers promise durability). raft-rs requires the entries to be readable from its
//!   storage when `advance_append_async` is called, so they enter the in-memory log at once; raft's
//!   persisted index, not the in-memory log, is what stands for "on disk". Entries are applied only up
//!   to it. At most one persist is outstanding: what readies produce meanwhile is merged into the next
//!   (a group commit), so a burst of proposals costs one fdatasync per round trip.
//! - **Snapshots.** Every [`MetaReplicaConfig::snapshot_every_entries`] applied entries the replica
//!   encodes its state at the applied index, drops the in-memory log below it and asks the driver to
//!   store the snapshot and rewrite the log above it. A leader ships that snapshot (with its data) to a
//!   follower behind its first index; the follower stores it, and applies it once stored.
//! - **Proposals** are accepted on the leader only; a follower answers [`ProposalError::NotLeader`]
//!   with the leader it knows. raft's own forwarding drops a proposal silently when the leader changes,
//!   leaving the caller only a timeout; a refusal naming the leader lets the cluster transport forward it
//!   and carry the leader's own answer back. An accepted proposal is answered when the entry at its log
//!   index is applied here: with the state machine's answer if the entry is its own (index, term and
//!   context `nonce | id` match), with [`ProposalError::Lost`] if another leader's entry took the index,
//!   or after [`MetaReplicaConfig::request_timeout`] with [`ProposalError::TimedOut`]. The nonce differs
//!   per start, so a previous start's replayed entries never answer a new proposal that reused an id.
//! - **ReadIndex** ([`ReplicaInput::ReadIndex`]) is raft's safe read-only request: the leader records
//!   its commit index and confirms it is still leader with a quorum of heartbeat answers (a sole voter
//!   needs none); a follower asks its leader. A leader answers only once it has committed an entry of
//!   its own term, so requests wait for that, and for a leader to be known at all. A request whose
//!   leader changed is asked again of the new one (raft drops pending reads on every leader change);
//!   one that gets no confirmation within the request timeout fails. [`ReplicaOutput::ReadIndexReady`]
//!   comes only once this replica has applied through the confirmed index, so the driver may answer at
//!   once.
//! - **A failed persist latches** the replica ([`ReplicaOutput::Latched`]): a failed fdatasync is never
//!   retried (its pages may be gone), pending and later proposals and reads fail, the state stays
//!   readable, and only a restart leaves the latch.
//!
//! # Election timing
//! raft-rs draws each election timeout from rand 0.8's `thread_rng`, which nothing seeds (under madsim
//! its `getrandom` 0.2 reaches the OS), so several voters could not replay. The replica pins raft's
//! range to one value, the longest timeout (`election_ticks + election_jitter_ticks_max`), and draws the
//! jitter from a `ChaCha8Rng` seeded by [`MetaReplicaConfig::election_seed`] (stream: the replica's id):
//! when a follower's or candidate's election timer reaches `election_ticks` without a leader's message,
//! the replica draws `jitter` in `0..=election_jitter_ticks_max` and feeds raft
//! `election_jitter_ticks_max - jitter` extra ticks at once, so it campaigns after
//! `election_ticks + jitter` ticks, once per round. Shortening after `election_ticks`, rather than
//! withholding ticks before, keeps raft's lease exact: with check-quorum a follower ignores votes until
//! `election_ticks` have passed since it heard from the leader, and withheld ticks would stretch that
//! lease by the jitter, so the first candidate would be ignored by every follower still waiting.
//! raft's own call to `reset_randomized_election_timeout` still runs but draws from a range of one.
//! (`set_randomized_election_timeout` is public but documented as a testing hook, and must stay in the
//! pinned range.)
//!
//! There is no single-voter shortcut inside raft's use: a sole voter elects itself when its timeout
//! passes. [`MetaReplicaConfig::fast_start_sole_voter`] makes a sole voter campaign in
//! [`MetaReplica::new`] instead, for the node's start-up: it leads before the first proposal arrives
//! (which a follower would refuse).
//!
//! # Polling order
//! Construct with [`MetaReplica::new`]; after it and after every [`Actor::handle`] drain
//! [`Actor::poll_output`] to `None`; feed [`ReplicaInput::Tick`] at [`Actor::poll_timeout`]. Run each
//! `Persist` (there is at most one outstanding) and feed its `PersistDone`; deliver each `Send` to its
//! peer (or drop it: raft retries). Publish [`MetaReplica::state`] on `Applied` before sending the
//! answers drained with it, so a caller answered "created" finds the topic in the view.
//!
//! Modules: `open` (start-up from recovered state), `ready` (raft's readies, persists, applies,
//! compaction, the latch), `reads` (read-index requests), `storage` (raft's log view).
//!
//! # Invariants (checked after every `handle` when [`crate::DEEP_CHECKS`])
//! Applied ≤ raft's persisted and committed indexes; raft's randomized timeout is the pinned value;
//! every pending proposal's index is above the applied index; at most one persist outstanding, and
//! nothing waits to be persisted when none is; pending requests and held messages within their limits;
//! a latched replica holds no pending request.

mod open;
mod reads;
mod ready;
mod storage;
mod types;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use raft::eraftpb::Message;
use raft::{RawNode, INVALID_ID};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::actor::Actor;
use crate::ids::NodeId;
use crate::metastore::{Command, MetaState};
use crate::time::Instant;
use reads::{PendingRead, ReadStage};
use ready::{InFlight, PendingPersist};
use storage::ReplicaStorage;

pub use raft::StateRole;
pub use types::{
    LogIndex, MetaReplicaConfig, MetaSnapshot, PersistId, PersistRequest, ProposalError,
    ProposalId, ReadIndexError, ReadIndexId, RecoveredLog, ReplicaFailure, ReplicaInput,
    ReplicaOpenError, ReplicaOutput, SnapshotWrite, ELECTION_JITTER_TICKS_MAX, ELECTION_TICKS,
    ENTRY_BYTES_MAX, ENTRY_OVERHEAD_BYTES, HEARTBEAT_TICKS, INFLIGHT_MESSAGES_MAX,
    MESSAGES_HELD_MAX, MESSAGE_BYTES_MAX, PROPOSALS_PENDING_MAX, READS_PENDING_MAX,
    REQUEST_TIMEOUT, SNAPSHOT_EVERY_ENTRIES, TICK_INTERVAL,
};

/// A proposal's context: the boot nonce and the proposal id.
const PROPOSAL_CONTEXT_BYTES: usize = 16;
/// Readies (and read hand-overs) in one `handle` before the replica calls raft's output a runaway and
/// panics (raft settles in a few: each ready's follow-ups wait for the persist or the next input).
const READIES_PER_HANDLE_MAX: usize = 1024;

/// A proposal waiting for its entry to be applied.
#[derive(Clone, Debug)]
struct PendingProposal {
    id: ProposalId,
    /// The term it was appended in; with its index, it identifies the entry.
    term: u64,
    /// `nonce | id`, as written into the entry.
    context: Vec<u8>,
    deadline: Instant,
}

/// The metastore replica actor; see the module documentation.
pub struct MetaReplica {
    config: MetaReplicaConfig,
    /// raft id (the node id).
    id: u64,
    node: RawNode<ReplicaStorage>,
    state: MetaState,
    /// The last entry applied to `state`.
    applied: u64,
    /// The last snapshot taken or received (stored, or being stored).
    snapshot_index: u64,
    /// The last log index found at start-up: caught up once applied reaches it.
    recovered_last_index: u64,
    /// This start's proposal nonce.
    nonce: u64,
    /// This start's read-index context prefix (raft id, nonce).
    read_prefix: [u8; 16],
    /// The election jitter's stream.
    rng: ChaCha8Rng,
    next_tick_at: Instant,
    /// (term, vote) of the last hard state requested to be stored (or recovered).
    hard_state_requested: (u64, u64),
    next_persist: u64,
    in_flight: Option<InFlight>,
    pending: PendingPersist,
    /// Pending proposals by log index.
    proposals: BTreeMap<u64, PendingProposal>,
    reads: BTreeMap<ReadIndexId, PendingRead>,
    /// (term, leader) the asked reads were given to raft under.
    followed: (u64, u64),
    outputs: VecDeque<ReplicaOutput>,
    failure: Option<ReplicaFailure>,
    messages_dropped: u64,
}

impl fmt::Debug for MetaReplica {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetaReplica")
            .field("id", &self.id)
            .field("role", &self.node.raft.state)
            .field("term", &self.node.raft.term)
            .field("leader", &self.node.raft.leader_id)
            .field("applied", &self.applied)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

// Getters.
impl MetaReplica {
    /// This replica's id.
    pub fn id(&self) -> NodeId {
        NodeId(u32::try_from(self.id).expect("built from a NodeId"))
    }

    /// The state after the last applied entry.
    pub fn state(&self) -> &MetaState {
        &self.state
    }

    /// The last applied log index.
    pub fn applied_index(&self) -> LogIndex {
        LogIndex(self.applied)
    }

    /// Whether everything the log held at start-up has been applied again.
    pub fn caught_up(&self) -> bool {
        self.applied >= self.recovered_last_index
    }

    /// The failure that latched the replica, if any.
    pub fn failure(&self) -> Option<&ReplicaFailure> {
        self.failure.as_ref()
    }

    /// raft's role for this replica.
    pub fn role(&self) -> StateRole {
        self.node.raft.state
    }

    /// The leader this replica knows of.
    pub fn leader(&self) -> Option<NodeId> {
        node_id(self.node.raft.leader_id)
    }

    /// The current raft term.
    pub fn term(&self) -> u64 {
        self.node.raft.term
    }

    /// raft's commit index.
    pub fn commit_index(&self) -> u64 {
        self.node.raft.raft_log.committed
    }

    /// The voters of the current configuration, in id order.
    pub fn voters(&self) -> Vec<NodeId> {
        let conf = self.node.raft.prs().conf().to_conf_state();
        let mut voters: Vec<NodeId> = conf.voters.into_iter().filter_map(node_id).collect();
        voters.sort_unstable();
        voters
    }

    /// Messages dropped: beyond [`MESSAGES_HELD_MAX`], or from peers with oversized entries.
    pub fn messages_dropped(&self) -> u64 {
        self.messages_dropped
    }
}

fn node_id(raft_id: u64) -> Option<NodeId> {
    if raft_id == INVALID_ID {
        return None;
    }
    u32::try_from(raft_id).ok().map(NodeId)
}

impl Actor for MetaReplica {
    type Input = ReplicaInput;
    type Output = ReplicaOutput;

    fn handle(&mut self, now: Instant, input: ReplicaInput) {
        match input {
            ReplicaInput::Propose { id, command } => self.on_propose(now, id, &command),
            ReplicaInput::ReadIndex { id } => self.on_read_index(now, id),
            ReplicaInput::Raft(message) => self.on_message(message),
            ReplicaInput::PersistDone { id, result } => self.on_persist_done(id, result),
            ReplicaInput::PeerUnreachable { peer } => {
                if self.failure.is_none() {
                    self.node.report_unreachable(u64::from(peer.0));
                }
            }
            ReplicaInput::SnapshotSent { peer, delivered } => {
                if self.failure.is_none() {
                    let status = if delivered {
                        raft::SnapshotStatus::Finish
                    } else {
                        raft::SnapshotStatus::Failure
                    };
                    self.node.report_snapshot(u64::from(peer.0), status);
                }
            }
            ReplicaInput::Tick => self.on_tick(now),
        }
        self.settle();
        if crate::DEEP_CHECKS {
            self.check_invariants();
        }
    }

    fn poll_output(&mut self) -> Option<ReplicaOutput> {
        self.outputs.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match self.failure {
            Some(_) => None,
            None => Some(self.next_tick_at),
        }
    }

    fn has_output(&self) -> bool {
        !self.outputs.is_empty()
    }
}

// Inputs.
impl MetaReplica {
    fn on_propose(&mut self, now: Instant, id: ProposalId, command: &Command) {
        let refusal = if let Some(failure) = &self.failure {
            Some(ProposalError::Latched(failure.clone()))
        } else if self.node.raft.state != StateRole::Leader {
            Some(ProposalError::NotLeader {
                leader: self.leader(),
            })
        } else if self.proposals.len() >= PROPOSALS_PENDING_MAX {
            Some(ProposalError::Overloaded)
        } else {
            None
        };
        if let Some(error) = refusal {
            return self.answer(id, Err(error));
        }
        let data = command.encode();
        let bytes_max = ENTRY_BYTES_MAX - ENTRY_OVERHEAD_BYTES;
        if data.len() > bytes_max {
            let bytes = data.len();
            return self.answer(id, Err(ProposalError::TooLarge { bytes, bytes_max }));
        }
        let mut context = self.nonce.to_be_bytes().to_vec();
        context.extend_from_slice(&id.0.to_be_bytes());
        if self.node.propose(context.clone(), data).is_err() {
            return self.answer(id, Err(ProposalError::Dropped));
        }
        let index = self.node.raft.raft_log.last_index();
        let pending = PendingProposal {
            id,
            term: self.node.raft.term,
            context,
            deadline: now + self.config.request_timeout,
        };
        // An earlier term's proposal at this index was truncated away with the log under it.
        if let Some(replaced) = self.proposals.insert(index, pending) {
            self.answer(replaced.id, Err(ProposalError::Lost));
        }
    }

    fn on_read_index(&mut self, now: Instant, id: ReadIndexId) {
        let refusal = if let Some(failure) = &self.failure {
            Some(ReadIndexError::Latched(failure.clone()))
        } else if self.reads.len() >= READS_PENDING_MAX {
            Some(ReadIndexError::Overloaded)
        } else {
            None
        };
        if let Some(error) = refusal {
            return self
                .outputs
                .push_back(ReplicaOutput::ReadIndexFailed { id, error });
        }
        let read = PendingRead {
            stage: ReadStage::Held,
            deadline: now + self.config.request_timeout,
        };
        let previous = self.reads.insert(id, read);
        assert!(
            previous.is_none(),
            "read-index id {id:?} is already pending"
        );
    }

    fn on_message(&mut self, message: Message) {
        if self.failure.is_some() {
            return;
        }
        // Entries this replica could not have proposed itself would not fit the log's frames.
        let oversized = message.entries.iter().any(|entry| {
            entry.data.len() > ENTRY_BYTES_MAX - ENTRY_OVERHEAD_BYTES
                || entry.context.len() > PROPOSAL_CONTEXT_BYTES
        });
        if message.to != self.id || oversized {
            self.messages_dropped += 1;
            return;
        }
        // raft refuses local message types and answers from unknown peers: nothing to do about either.
        let _ = self.node.step(message);
    }

    fn on_persist_done(&mut self, id: PersistId, result: Result<(), crate::IoFault>) {
        if self.failure.is_some() {
            return; // Latched: what the request did no longer matters.
        }
        let in_flight = self
            .in_flight
            .take()
            .expect("PersistDone answers the outstanding persist");
        assert_eq!(in_flight.id, id, "PersistDone for another request");
        if let Err(fault) = result {
            return self.latch(ReplicaFailure::Persist(fault));
        }
        if let Some((index, state)) = in_flight.restore {
            self.restore(index, state);
        }
        if let Some(number) = in_flight.ready {
            self.node.on_persist_ready(number);
        }
        for message in in_flight.messages {
            self.outputs.push_back(ReplicaOutput::Send(message));
        }
        self.after_apply();
        self.issue_persist();
    }

    fn on_tick(&mut self, now: Instant) {
        if self.failure.is_some() {
            return;
        }
        self.expire(now);
        if now < self.next_tick_at {
            return;
        }
        // Missed ticks are not made up: a starved driver must not make followers campaign.
        let next = self.next_tick_at + self.config.tick_interval;
        self.next_tick_at = if next > now {
            next
        } else {
            now + self.config.tick_interval
        };
        self.tick_raft();
    }

    /// One raft tick, shortened by the seeded jitter once the election timer passes `election_ticks`.
    fn tick_raft(&mut self) {
        let fired = self.node.tick();
        let raft = &self.node.raft;
        if fired || raft.state == StateRole::Leader || !raft.promotable() {
            return;
        }
        if raft.election_elapsed != self.config.election_ticks {
            return;
        }
        let jitter_max = self.config.election_jitter_ticks_max;
        let jitter = self.rng.random_range(0..=jitter_max);
        for _ in jitter..jitter_max {
            if self.node.tick() {
                break; // Campaigned: the new round's timer started at 0.
            }
        }
    }

    /// Fails requests past their deadline.
    fn expire(&mut self, now: Instant) {
        let late: Vec<u64> = self
            .proposals
            .iter()
            .filter(|(_, proposal)| proposal.deadline <= now)
            .map(|(index, _)| *index)
            .collect();
        for index in late {
            if let Some(proposal) = self.proposals.remove(&index) {
                self.answer(proposal.id, Err(ProposalError::TimedOut));
            }
        }
        let late: Vec<ReadIndexId> = self
            .reads
            .iter()
            .filter(|(_, read)| read.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in late {
            self.reads.remove(&id);
            let error = ReadIndexError::TimedOut;
            self.outputs
                .push_back(ReplicaOutput::ReadIndexFailed { id, error });
        }
    }
}

// Invariants.
impl MetaReplica {
    fn check_invariants(&self) {
        if self.failure.is_some() {
            assert!(self.proposals.is_empty() && self.reads.is_empty());
            assert!(self.in_flight.is_none() && self.pending.is_empty());
            return;
        }
        let raft = &self.node.raft;
        let log = &raft.raft_log;
        assert!(
            self.applied <= log.persisted && self.applied <= log.committed,
            "applied {} beyond persisted {} or committed {}",
            self.applied,
            log.persisted,
            log.committed
        );
        assert!(log.applied <= self.applied);
        assert_eq!(
            raft.randomized_election_timeout(),
            self.config.election_ticks + self.config.election_jitter_ticks_max,
            "raft's election timeout is pinned"
        );
        if let Some((&index, _)) = self.proposals.first_key_value() {
            assert!(
                index > self.applied,
                "proposal at {index} applied unanswered"
            );
        }
        assert!(self.proposals.len() <= PROPOSALS_PENDING_MAX);
        assert!(self.reads.len() <= READS_PENDING_MAX);
        assert!(self.pending.messages.len() <= MESSAGES_HELD_MAX);
        if self.in_flight.is_none() {
            assert!(self.pending.is_empty(), "writes wait with no persist out");
        }
        for read in self.reads.values() {
            if let ReadStage::Confirmed(index) = read.stage {
                assert!(index > self.applied, "read confirmed at {index} unanswered");
            }
        }
    }
}
