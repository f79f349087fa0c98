//! Starting a replica from the state its driver read back from disk.

use std::collections::{BTreeMap, VecDeque};

use raft::eraftpb::{ConfState, Snapshot};
use raft::{RawNode, Storage};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::storage::ReplicaStorage;
use super::types::{MetaReplicaConfig, MetaSnapshot, RecoveredLog, ReplicaOpenError};
use super::{MetaReplica, PendingPersist};
use crate::metastore::MetaState;
use crate::time::Instant;

/// Mixes the log's position into the boot nonce, so that one seed started many times (tests, the
/// simulator's restarts) never gives a start the nonce of an earlier one whose entries it replays.
fn mix_nonce(seed: u64, last_index: u64, term: u64) -> u64 {
    seed ^ last_index.rotate_left(32) ^ term.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// raft's form of a stored snapshot.
pub(super) fn raft_snapshot(stored: &MetaSnapshot) -> Snapshot {
    let mut snapshot = Snapshot {
        data: stored.state.clone().into(),
        ..Snapshot::default()
    };
    let metadata = snapshot.mut_metadata();
    metadata.index = stored.index;
    metadata.term = stored.term;
    metadata.set_conf_state(ConfState::from((
        stored.voters.clone(),
        stored.learners.clone(),
    )));
    snapshot
}

/// Refuses recovered entries that do not follow the snapshot and each other, which only corruption
/// explains (the driver's recovery already cut a torn tail). `MemStorage` would panic on them.
fn check_log(recovered: &RecoveredLog) -> Result<(), ReplicaOpenError> {
    let (mut index, mut term) = recovered
        .snapshot
        .as_ref()
        .map_or((0, 0), |snapshot| (snapshot.index, snapshot.term));
    for entry in &recovered.entries {
        if entry.index != index + 1 {
            return Err(ReplicaOpenError::Gap {
                after: index,
                found: entry.index,
            });
        }
        if entry.term < term {
            return Err(ReplicaOpenError::TermDecreases {
                index: entry.index,
                term: entry.term,
                previous: term,
            });
        }
        (index, term) = (entry.index, entry.term);
    }
    Ok(())
}

fn refused(error: impl std::fmt::Display) -> ReplicaOpenError {
    ReplicaOpenError::Raft(error.to_string())
}

impl MetaReplica {
    /// Starts a replica from what its driver recovered: the snapshot (state and conf state), the
    /// entries above it and the hard state. Without a snapshot the voters come from the config.
    /// Refuses damage a crash cannot explain (an undecodable snapshot, gaps, terms going down).
    ///
    /// `now` starts its tick schedule. A sole voter configured for the fast start campaigns here, and
    /// wins at once: drain its outputs (the persist of its vote and first entry) before the first
    /// `handle`.
    pub fn new(
        config: MetaReplicaConfig,
        recovered: RecoveredLog,
        now: Instant,
    ) -> Result<MetaReplica, ReplicaOpenError> {
        let id = u64::from(config.id.0);
        check_log(&recovered)?;
        let mut storage = ReplicaStorage::default();
        let (state, snapshot_index) = match &recovered.snapshot {
            Some(stored) => {
                let state = MetaState::decode_snapshot(&stored.state)
                    .map_err(ReplicaOpenError::SnapshotState)?;
                let snapshot = raft_snapshot(stored);
                storage
                    .memory
                    .wl()
                    .apply_snapshot(snapshot.clone())
                    .map_err(refused)?;
                storage.snapshot = snapshot;
                (state, stored.index)
            }
            None => {
                let voters: Vec<u64> = config
                    .voters
                    .iter()
                    .map(|voter| u64::from(voter.0))
                    .collect();
                if voters.is_empty() || voters.contains(&0) {
                    return Err(refused(format!("voters {voters:?}")));
                }
                let learners: Vec<u64> = config
                    .learners
                    .iter()
                    .map(|learner| u64::from(learner.0))
                    .collect();
                if learners.contains(&0) || learners.iter().any(|id| voters.contains(id)) {
                    return Err(refused(format!(
                        "learners {learners:?} among voters {voters:?}"
                    )));
                }
                storage
                    .memory
                    .wl()
                    .set_conf_state(ConfState::from((voters, learners)));
                (MetaState::new(), 0)
            }
        };
        storage
            .memory
            .wl()
            .append(&recovered.entries)
            .map_err(refused)?;
        let last_index = recovered
            .entries
            .last()
            .map_or(snapshot_index, |entry| entry.index);
        let last_term = recovered.entries.last().map_or(0, |entry| entry.term);
        let mut hard_state = recovered.hard_state.clone();
        hard_state.term = hard_state
            .term
            .max(last_term)
            .max(storage.memory.rl().hard_state().term);
        // Commit is stored lazily: never below the snapshot, never past the log.
        hard_state.commit = hard_state.commit.clamp(snapshot_index, last_index);
        let hard_state_requested = (recovered.hard_state.term, recovered.hard_state.vote);
        let nonce = mix_nonce(config.boot_nonce, last_index, hard_state.term);
        storage.memory.wl().set_hardstate(hard_state);

        let voters = storage.initial_state().map_err(refused)?.conf_state.voters;
        let raft_config = raft_config(&config, id, snapshot_index);
        raft_config.validate().map_err(refused)?;
        let node = RawNode::new(&raft_config, storage, &config.logger).map_err(refused)?;

        let mut rng = ChaCha8Rng::seed_from_u64(config.election_seed);
        rng.set_stream(id);
        let fast_start = config.fast_start_sole_voter && voters == [id];
        let next_tick_at = now + config.tick_interval;
        let mut replica = MetaReplica {
            id,
            node,
            state,
            applied: snapshot_index,
            snapshot_index,
            recovered_last_index: last_index,
            nonce,
            read_prefix: read_prefix(id, nonce),
            rng,
            next_tick_at,
            hard_state_requested,
            next_persist: 0,
            in_flight: None,
            pending: PendingPersist::default(),
            proposals: BTreeMap::new(),
            reads: BTreeMap::new(),
            followed: (0, 0),
            outputs: VecDeque::new(),
            failure: None,
            messages_dropped: 0,
            config,
        };
        if fast_start {
            // raft refuses (and says why in its log) when this replica cannot campaign.
            let _ = replica.node.campaign();
            replica.settle();
        }
        if crate::DEEP_CHECKS {
            replica.check_invariants();
        }
        Ok(replica)
    }
}

/// The first 16 bytes of this start's read-index contexts: raft id and nonce, so a read asked by an
/// earlier start (or another replica) never matches one of this start's.
fn read_prefix(id: u64, nonce: u64) -> [u8; 16] {
    let mut prefix = [0; 16];
    prefix[..8].copy_from_slice(&id.to_be_bytes());
    prefix[8..].copy_from_slice(&nonce.to_be_bytes());
    prefix
}

/// raft's settings. The randomized election range is pinned to one value, the longest timeout, so
/// raft's own draw (rand 0.8's `thread_rng`, which nothing seeds) has nothing to choose; the replica
/// shortens each timeout by a seeded amount instead (see the module documentation).
fn raft_config(config: &MetaReplicaConfig, id: u64, applied: u64) -> raft::Config {
    let timeout_ticks_max = config.election_ticks + config.election_jitter_ticks_max;
    raft::Config {
        id,
        election_tick: config.election_ticks,
        heartbeat_tick: config.heartbeat_ticks,
        min_election_tick: timeout_ticks_max,
        max_election_tick: timeout_ticks_max + 1,
        applied,
        max_size_per_msg: super::types::MESSAGE_BYTES_MAX,
        max_inflight_msgs: super::types::INFLIGHT_MESSAGES_MAX,
        // A leader cut off from its quorum steps down after an election timeout, so reads waiting on it
        // move to the next leader instead of waiting on one that cannot confirm itself; followers
        // ignore votes while they hear from a leader.
        check_quorum: true,
        // A replica coming back from a partition cannot disrupt a working leader.
        pre_vote: true,
        read_only_option: raft::ReadOnlyOption::Safe,
        ..raft::Config::default()
    }
}
