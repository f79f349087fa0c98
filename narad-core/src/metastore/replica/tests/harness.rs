//! A deterministic harness over in-memory replicas: messages delivered in send order, persists run
//! at once against an in-memory disk (unless a replica holds them), virtual time stepped to the
//! earliest `poll_timeout`. Replicas are visited in id order, so a seed replays exactly.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use raft::eraftpb::{Entry, HardState, Message, MessageType};

use super::super::*;
use crate::error::IoFault;
use crate::metastore::Applied;

/// Most events one `run` performs before the harness calls it a livelock.
const EVENTS_PER_RUN_MAX: usize = 1_000_000;

/// The durable image a replica's persists build, replayed as a driver's recovery would.
#[derive(Clone, Debug, Default)]
pub(super) struct Disk {
    pub(super) snapshot: Option<MetaSnapshot>,
    pub(super) hard_state: HardState,
    pub(super) entries: Vec<Entry>,
    /// Persist requests run, and how many of them stored a snapshot.
    pub(super) persists: usize,
    pub(super) snapshots: usize,
}

impl Disk {
    fn run(&mut self, request: &PersistRequest) {
        self.persists += 1;
        if let Some(write) = &request.snapshot {
            self.snapshots += 1;
            self.snapshot = Some(write.snapshot.clone());
            self.entries = write.log.clone();
        }
        for entry in &request.entries {
            let keep = self
                .entries
                .partition_point(|kept| kept.index < entry.index);
            self.entries.truncate(keep);
            self.entries.push(entry.clone());
        }
        if let Some(hard_state) = &request.hard_state {
            self.hard_state = hard_state.clone();
        }
    }

    pub(super) fn recovered(&self) -> RecoveredLog {
        RecoveredLog {
            snapshot: self.snapshot.clone(),
            hard_state: self.hard_state.clone(),
            entries: self.entries.clone(),
        }
    }
}

/// One replica and what it emitted.
pub(super) struct Peer {
    pub(super) replica: MetaReplica,
    pub(super) disk: Disk,
    /// The outstanding persist, while `hold_persists` keeps it from running.
    pub(super) persist: Option<PersistRequest>,
    pub(super) hold_persists: bool,
    /// The next persist fails with this fault.
    pub(super) fail_next_persist: Option<IoFault>,
    pub(super) answers: Vec<(ProposalId, Result<Applied, ProposalError>)>,
    pub(super) reads_ready: Vec<(ReadIndexId, LogIndex)>,
    pub(super) reads_failed: Vec<(ReadIndexId, ReadIndexError)>,
    pub(super) latched: Vec<ReplicaFailure>,
}

/// One sent message, as the trace records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Sent {
    pub(super) at: Instant,
    pub(super) from: u64,
    pub(super) to: u64,
    pub(super) kind: MessageType,
    pub(super) term: u64,
    pub(super) index: u64,
    pub(super) commit: u64,
    pub(super) entries: usize,
    pub(super) reject: bool,
}

/// A few replicas and the wire between them.
pub(super) struct Cluster {
    pub(super) now: Instant,
    pub(super) peers: Vec<Peer>,
    wire: VecDeque<Message>,
    /// Replicas cut off: messages to or from them are dropped.
    pub(super) cut: BTreeSet<u64>,
    /// Every message sent, in order.
    pub(super) trace: Vec<Sent>,
}

pub(super) fn logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

/// The config of replica `id` among voters `1..=voters`.
pub(super) fn config(id: u32, voters: u32, seed: u64) -> MetaReplicaConfig {
    let mut config =
        MetaReplicaConfig::new(NodeId(id), (1..=voters).map(NodeId).collect(), logger());
    config.election_seed = seed;
    config.boot_nonce = seed ^ u64::from(id);
    config
}

impl Peer {
    pub(super) fn new(replica: MetaReplica) -> Peer {
        Peer {
            replica,
            disk: Disk::default(),
            persist: None,
            hold_persists: false,
            fail_next_persist: None,
            answers: Vec::new(),
            reads_ready: Vec::new(),
            reads_failed: Vec::new(),
            latched: Vec::new(),
        }
    }
}

impl Cluster {
    /// `voters` replicas with election seed `seed`, configured by `adjust`.
    pub(super) fn with(voters: u32, seed: u64, adjust: impl Fn(&mut MetaReplicaConfig)) -> Cluster {
        let peers = (1..=voters)
            .map(|id| {
                let mut config = config(id, voters, seed);
                adjust(&mut config);
                let replica = MetaReplica::new(config, RecoveredLog::default(), Instant::ZERO)
                    .expect("a fresh replica opens");
                Peer::new(replica)
            })
            .collect();
        let mut cluster = Cluster {
            now: Instant::ZERO,
            peers,
            wire: VecDeque::new(),
            cut: BTreeSet::new(),
            trace: Vec::new(),
        };
        for id in 1..=u64::from(voters) {
            cluster.drain(id);
        }
        cluster
    }

    pub(super) fn new(voters: u32, seed: u64) -> Cluster {
        Cluster::with(voters, seed, |_| {})
    }

    pub(super) fn peer(&mut self, id: u64) -> &mut Peer {
        &mut self.peers[usize::try_from(id - 1).expect("small ids")]
    }

    pub(super) fn replica(&self, id: u64) -> &MetaReplica {
        &self.peers[usize::try_from(id - 1).expect("small ids")].replica
    }

    /// Feeds one input to replica `id` and collects what it emits.
    pub(super) fn handle(&mut self, id: u64, input: ReplicaInput) {
        let now = self.now;
        self.peer(id).replica.handle(now, input);
        self.drain(id);
    }

    /// Collects what replica `id` emitted (after construction or an input).
    pub(super) fn drain(&mut self, id: u64) {
        let now = self.now;
        while let Some(output) = self.peer(id).replica.poll_output() {
            match output {
                ReplicaOutput::Persist(request) => {
                    let peer = self.peer(id);
                    assert!(peer.persist.is_none(), "one persist outstanding at a time");
                    peer.persist = Some(request);
                }
                ReplicaOutput::Send(message) => {
                    assert_eq!(message.from, id, "a replica sends as itself");
                    self.trace.push(Sent {
                        at: now,
                        from: message.from,
                        to: message.to,
                        kind: message.get_msg_type(),
                        term: message.term,
                        index: message.index,
                        commit: message.commit,
                        entries: message.entries.len(),
                        reject: message.reject,
                    });
                    self.wire.push_back(message);
                }
                ReplicaOutput::Applied { index } => {
                    assert_eq!(self.peer(id).replica.applied_index(), index);
                }
                ReplicaOutput::Answered {
                    id: proposal,
                    result,
                } => {
                    self.peer(id).answers.push((proposal, result));
                }
                ReplicaOutput::ReadIndexReady { id: read, index } => {
                    let peer = self.peer(id);
                    assert!(
                        peer.replica.applied_index() >= index,
                        "ready before applied"
                    );
                    peer.reads_ready.push((read, index));
                }
                ReplicaOutput::ReadIndexFailed { id: read, error } => {
                    self.peer(id).reads_failed.push((read, error));
                }
                ReplicaOutput::Latched(failure) => self.peer(id).latched.push(failure),
            }
        }
    }

    /// Runs replica `id`'s outstanding persist (failing it if told to).
    pub(super) fn finish_persist(&mut self, id: u64) -> bool {
        let peer = self.peer(id);
        let Some(request) = peer.persist.take() else {
            return false;
        };
        let result = match peer.fail_next_persist.take() {
            Some(fault) => Err(fault),
            None => {
                peer.disk.run(&request);
                Ok(())
            }
        };
        self.handle(
            id,
            ReplicaInput::PersistDone {
                id: request.id,
                result,
            },
        );
        true
    }

    /// One event: an outstanding persist (replicas in id order), else the next message on the wire.
    fn step(&mut self) -> bool {
        for id in 1..=self.peers.len() as u64 {
            if !self.peer(id).hold_persists && self.finish_persist(id) {
                return true;
            }
        }
        let Some(message) = self.wire.pop_front() else {
            return false;
        };
        let (from, to) = (message.from, message.to);
        if !self.cut.contains(&from) && !self.cut.contains(&to) {
            self.handle(to, ReplicaInput::Raft(message));
        }
        true
    }

    /// Runs until `done` holds (checked between events) or `limit` of virtual time passes; returns
    /// whether `done` held.
    pub(super) fn run_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&Cluster) -> bool,
    ) -> bool {
        let deadline = self.now + limit;
        for _ in 0..EVENTS_PER_RUN_MAX {
            if done(self) {
                return true;
            }
            if self.step() {
                continue;
            }
            let next = self
                .peers
                .iter()
                .filter_map(|peer| peer.replica.poll_timeout())
                .min();
            match next {
                Some(next) if next <= deadline => self.now = self.now.max(next),
                Some(_) | None => {
                    self.now = deadline;
                    return done(self);
                }
            }
            for id in 1..=self.peers.len() as u64 {
                let due = self
                    .replica(id)
                    .poll_timeout()
                    .is_some_and(|at| at <= self.now);
                if due {
                    self.handle(id, ReplicaInput::Tick);
                }
            }
        }
        panic!("no quiet point within {EVENTS_PER_RUN_MAX} events");
    }

    /// Runs for `duration` of virtual time.
    pub(super) fn run_for(&mut self, duration: Duration) {
        self.run_until(duration, |_| false);
    }

    /// The replicas that think they lead.
    pub(super) fn leaders(&self) -> Vec<u64> {
        (1..=self.peers.len() as u64)
            .filter(|&id| self.replica(id).role() == StateRole::Leader)
            .collect()
    }

    /// Runs until one leader is known to every replica not cut off, and has applied an entry of its
    /// term; returns it.
    pub(super) fn elect(&mut self) -> u64 {
        let elected = self.run_until(Duration::from_secs(30), |cluster| {
            cluster.settled_leader().is_some()
        });
        assert!(elected, "no leader within 30 s");
        self.settled_leader().expect("elected")
    }

    fn settled_leader(&self) -> Option<u64> {
        let leaders = self.leaders();
        let &[leader] = leaders.as_slice() else {
            return None;
        };
        let leader_replica = self.replica(leader);
        let everyone_follows = (1..=self.peers.len() as u64)
            .filter(|id| !self.cut.contains(id))
            .all(|id| self.replica(id).leader() == leader_replica.leader());
        let committed_own_term = leader_replica.node.raft.commit_to_current_term()
            && leader_replica.applied >= leader_replica.node.raft.raft_log.committed;
        (everyone_follows && committed_own_term).then_some(leader)
    }
}
