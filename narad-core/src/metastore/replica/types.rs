//! The replica's configuration, events, commands and errors.

use core::fmt;
use core::time::Duration;

use raft::eraftpb::{Entry, HardState, Message};

use crate::error::IoFault;
use crate::ids::NodeId;
use crate::metastore::{Applied, Command, EncodingError, TopicError};

/// How often the driver feeds [`ReplicaInput::Tick`]: one raft tick.
pub const TICK_INTERVAL: Duration = Duration::from_millis(100);
/// Ticks without hearing from a leader before a follower may campaign (also the leader's check-quorum
/// period and the followers' lease).
pub const ELECTION_TICKS: usize = 10;
/// Most extra ticks the seeded jitter adds to [`ELECTION_TICKS`]: elections time out after 10 to 19
/// ticks, raft's own default range (`[election_tick, 2 × election_tick)`).
pub const ELECTION_JITTER_TICKS_MAX: usize = ELECTION_TICKS - 1;
/// Ticks between a leader's heartbeats.
pub const HEARTBEAT_TICKS: usize = 3;
/// How long a proposal or a read-index request may wait for its answer before it is failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Applied entries between snapshots (the log is rewritten then).
pub const SNAPSHOT_EVERY_ENTRIES: u64 = 1000;
/// Proposals waiting for their entry to be applied; more are refused ([`ProposalError::Overloaded`]).
pub const PROPOSALS_PENDING_MAX: usize = 1024;
/// Read-index requests waiting for their answer; more are refused ([`ReadIndexError::Overloaded`]).
pub const READS_PENDING_MAX: usize = 1024;
/// Messages held back until the persist they depend on is done; more are dropped (raft tolerates a
/// lossy network: the peer asks again).
pub const MESSAGES_HELD_MAX: usize = 4096;
/// Largest encoded log entry the replica accepts (a command carries at most a 1 MiB schema). The node's
/// log format refuses larger frames; messages from peers carrying larger entries are dropped.
pub const ENTRY_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Bytes of an entry's frame besides its command: term, index, type, two length prefixes and the
/// proposal context, with room to spare.
pub const ENTRY_OVERHEAD_BYTES: usize = 64;
/// Largest append message raft builds (`max_size_per_msg`).
pub const MESSAGE_BYTES_MAX: u64 = 1024 * 1024;
/// Append messages in flight to one follower (`max_inflight_msgs`).
pub const INFLIGHT_MESSAGES_MAX: usize = 256;

/// A proposal's id, chosen by the driver (unique among its pending proposals).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProposalId(pub u64);

/// A read-index request's id, chosen by the driver (unique among its pending requests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReadIndexId(pub u64);

/// A persist request's id, chosen by the replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PersistId(pub u64);

/// A position in the replicated log (raft index; 0 is before the first entry).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogIndex(pub u64);

impl fmt::Display for LogIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Who the replica is and how it times its elections.
#[derive(Clone, Debug)]
pub struct MetaReplicaConfig {
    /// This replica's raft id and member id (never 0).
    pub id: NodeId,
    /// The voters when the recovered state holds no snapshot (a snapshot carries its own). The cluster
    /// passes the same list to every replica.
    pub voters: Vec<NodeId>,
    /// The learners when the recovered state holds no snapshot: members beyond the voters, which
    /// receive the log but neither vote nor count towards a quorum. Disjoint from `voters`.
    pub learners: Vec<NodeId>,
    /// The interval between [`ReplicaInput::Tick`]s that advance raft (one raft tick each).
    pub tick_interval: Duration,
    /// Ticks before an election may start ([`ELECTION_TICKS`]).
    pub election_ticks: usize,
    /// Most extra ticks of seeded jitter on each election timeout ([`ELECTION_JITTER_TICKS_MAX`]).
    pub election_jitter_ticks_max: usize,
    /// Ticks between a leader's heartbeats ([`HEARTBEAT_TICKS`]); below `election_ticks`.
    pub heartbeat_ticks: usize,
    /// Seeds the election jitter. Each replica draws from its own stream of it (the stream number is
    /// its id), so replicas given one seed still time out at different ticks.
    pub election_seed: u64,
    /// Seeds this start's proposal nonce, mixed with the log's position at start (see the module
    /// documentation). The driver draws it from the OS when it has no seed.
    pub boot_nonce: u64,
    /// Applied entries between snapshots ([`SNAPSHOT_EVERY_ENTRIES`]).
    pub snapshot_every_entries: u64,
    /// How long a proposal or read-index request waits for its answer ([`REQUEST_TIMEOUT`]).
    pub request_timeout: Duration,
    /// A sole voter campaigns when it is constructed instead of after an election timeout (a node's
    /// start-up would otherwise wait one to two seconds for its own election, refusing proposals
    /// meanwhile). Ignored with peers, where simultaneous campaigns would split the vote.
    pub fast_start_sole_voter: bool,
    /// Where raft-rs's own log records go (the node bridges them to `tracing`; tests discard them).
    pub logger: slog::Logger,
}

impl MetaReplicaConfig {
    /// The production timing for replica `id` among `voters`, without the fast start.
    pub fn new(id: NodeId, voters: Vec<NodeId>, logger: slog::Logger) -> Self {
        MetaReplicaConfig {
            id,
            voters,
            learners: Vec::new(),
            tick_interval: TICK_INTERVAL,
            election_ticks: ELECTION_TICKS,
            election_jitter_ticks_max: ELECTION_JITTER_TICKS_MAX,
            heartbeat_ticks: HEARTBEAT_TICKS,
            election_seed: 0,
            boot_nonce: 0,
            snapshot_every_entries: SNAPSHOT_EVERY_ENTRIES,
            request_timeout: REQUEST_TIMEOUT,
            fast_start_sole_voter: false,
            logger,
        }
    }
}

/// A stored snapshot: the applied state at `index`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetaSnapshot {
    /// Last log index the state includes.
    pub index: u64,
    /// Term of that entry.
    pub term: u64,
    /// Voters at that index.
    pub voters: Vec<u64>,
    /// Learners at that index.
    pub learners: Vec<u64>,
    /// The encoded [`crate::metastore::MetaState`].
    pub state: Vec<u8>,
}

/// What the driver read back from its disk at start-up.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecoveredLog {
    /// The last stored snapshot, if any.
    pub snapshot: Option<MetaSnapshot>,
    /// The last stored hard state (default when none).
    pub hard_state: HardState,
    /// The log entries above the snapshot, in index order.
    pub entries: Vec<Entry>,
}

/// Why a replica could not start from its recovered state: damage a crash cannot explain.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaOpenError {
    /// The snapshot's state does not decode.
    #[error("snapshot state: {0}")]
    SnapshotState(EncodingError),
    /// The entries do not follow the snapshot and each other without a gap.
    #[error("log entry {found} follows {after}")]
    Gap {
        /// The index before it (the snapshot's, or the previous entry's).
        after: u64,
        /// The entry's index.
        found: u64,
    },
    /// An entry's term is below the one before it.
    #[error("log entry {index} has term {term}, below the {previous} before it")]
    TermDecreases {
        /// The entry's index.
        index: u64,
        /// Its term.
        term: u64,
        /// The term before it.
        previous: u64,
    },
    /// The configuration or the state was refused by raft (a zero id, no voters, bad timing).
    #[error("raft refused the replica: {0}")]
    Raft(String),
}

/// Events the replica consumes.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplicaInput {
    /// Replicate a command; answered by [`ReplicaOutput::Answered`] with the same id once its entry is
    /// applied here (or refused, failed, timed out).
    Propose {
        /// The driver's id for the answer.
        id: ProposalId,
        /// The command.
        command: Command,
    },
    /// A linearizable-read barrier: answered by [`ReplicaOutput::ReadIndexReady`] once a quorum
    /// confirmed the leader and this replica applied everything committed when it was asked.
    ReadIndex {
        /// The driver's id for the answer.
        id: ReadIndexId,
    },
    /// A raft message from a peer.
    Raft(Message),
    /// The persist request of that id finished (or failed; the replica then latches).
    PersistDone {
        /// The request's id.
        id: PersistId,
        /// Whether every write and fdatasync of it succeeded.
        result: Result<(), IoFault>,
    },
    /// The transport could not reach a peer (raft slows its appends to it).
    PeerUnreachable {
        /// The peer.
        peer: NodeId,
    },
    /// A snapshot message to a peer was delivered, or failed.
    SnapshotSent {
        /// The peer.
        peer: NodeId,
        /// Whether it arrived.
        delivered: bool,
    },
    /// The time returned by `poll_timeout` has come (an early tick changes nothing).
    Tick,
}

/// A snapshot to store, and the log that stays after it.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotWrite {
    /// The snapshot (replaced atomically).
    pub snapshot: MetaSnapshot,
    /// The whole log above the snapshot: the log file is rewritten (atomically) to hold exactly these.
    pub log: Vec<Entry>,
}

/// Durable writes the driver performs in this order, then answers [`ReplicaInput::PersistDone`].
/// At most one is outstanding at a time.
#[derive(Clone, Debug, PartialEq)]
pub struct PersistRequest {
    /// The request's id.
    pub id: PersistId,
    /// First: store this snapshot and rewrite the log (a leader's snapshot, or this replica's
    /// compaction).
    pub snapshot: Option<SnapshotWrite>,
    /// Then: append these entries and fdatasync (an entry at or below the log's last one replaces the
    /// log from its index on).
    pub entries: Vec<Entry>,
    /// Then: store this hard state (term or vote changed since the last one requested).
    pub hard_state: Option<HardState>,
}

/// Commands the replica emits.
#[derive(Clone, Debug, PartialEq)]
#[must_use]
pub enum ReplicaOutput {
    /// Perform these writes and feed [`ReplicaInput::PersistDone`].
    Persist(PersistRequest),
    /// Send this message to peer `message.to`.
    Send(Message),
    /// The state ([`super::MetaReplica::state`]) now includes every entry through `index`: publish it
    /// before the answers emitted with it.
    Applied {
        /// The last applied index.
        index: LogIndex,
    },
    /// A proposal's answer.
    Answered {
        /// The proposal.
        id: ProposalId,
        /// The state machine's answer, or why there is none.
        result: Result<Applied, ProposalError>,
    },
    /// A read-index barrier passed: this replica has applied through `index`, which was committed
    /// when the request was made, as confirmed by a quorum.
    ReadIndexReady {
        /// The request.
        id: ReadIndexId,
        /// The confirmed commit index.
        index: LogIndex,
    },
    /// A read-index request failed.
    ReadIndexFailed {
        /// The request.
        id: ReadIndexId,
        /// Why.
        error: ReadIndexError,
    },
    /// The replica latched: proposals and reads are refused until restart; the state stays readable.
    Latched(ReplicaFailure),
}

/// Why the replica latched.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplicaFailure {
    /// A persist failed (a failed fdatasync is never retried: its pages may be gone).
    #[error("metastore disk failure: {0}")]
    Persist(IoFault),
    /// A leader's snapshot did not decode.
    #[error("metastore snapshot from the leader does not decode: {0}")]
    SnapshotUndecodable(EncodingError),
}

/// Why a proposal got no answer from the state machine.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProposalError {
    /// The state machine refused the command (the same answer on every replica).
    #[error(transparent)]
    Refused(TopicError),
    /// This replica is not the leader; proposals go to the leader (when one is known).
    #[error("not the metastore leader (leader: {leader:?})")]
    NotLeader {
        /// The leader this replica knows of.
        leader: Option<NodeId>,
    },
    /// The encoded command is larger than a log entry may be.
    #[error("metastore command of {bytes} bytes is above the {bytes_max}-byte limit")]
    TooLarge {
        /// Its size.
        bytes: usize,
        /// The limit.
        bytes_max: usize,
    },
    /// [`PROPOSALS_PENDING_MAX`] proposals are already waiting.
    #[error("too many metastore proposals pending")]
    Overloaded,
    /// raft dropped the proposal (a leadership transfer, or its uncommitted-size limit).
    #[error("raft dropped the metastore proposal")]
    Dropped,
    /// Another leader's entry took the proposal's log index: it was never committed.
    #[error("the metastore proposal was replaced by another leader's entry")]
    Lost,
    /// The entry was applied through a snapshot from the leader: its answer is not known here.
    #[error("the metastore proposal was applied through a snapshot; its answer is unknown")]
    Unknown,
    /// Not applied within the request timeout (it may still be applied later).
    #[error("metastore proposal timed out")]
    TimedOut,
    /// The entry did not decode when applied (every replica skips it).
    #[error("metastore entry does not decode: {0}")]
    Undecodable(EncodingError),
    /// The replica latched.
    #[error(transparent)]
    Latched(ReplicaFailure),
}

/// Why a read-index request failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadIndexError {
    /// [`READS_PENDING_MAX`] requests are already waiting.
    #[error("too many metastore reads pending")]
    Overloaded,
    /// No quorum confirmed a leader within the request timeout.
    #[error("metastore read barrier timed out")]
    TimedOut,
    /// The replica latched.
    #[error(transparent)]
    Latched(ReplicaFailure),
}
