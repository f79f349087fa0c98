mod harness;

use std::collections::BTreeSet;
use std::time::Duration;

use raft::eraftpb::{Entry, MessageType};

use super::*;
use crate::error::IoFault;
use crate::ids::TopicId;
use crate::metastore::{Applied, TopicError};
use harness::{config, Cluster, Peer, Sent};

fn create(name: &str) -> Command {
    crate::metastore::create_command(name, 0)
}

fn created_id(result: &Result<Applied, ProposalError>) -> TopicId {
    match result {
        Ok(Applied::TopicCreated(topic)) => topic.id,
        other => panic!("expected a created topic, got {other:?}"),
    }
}

/// Proposes on `id` and runs until every replica not cut off applied as far as `id` has.
fn propose(cluster: &mut Cluster, id: u64, proposal: u64, command: Command) {
    cluster.handle(
        id,
        ReplicaInput::Propose {
            id: ProposalId(proposal),
            command,
        },
    );
    let answered = cluster.run_until(Duration::from_secs(10), |cluster| {
        let applied = cluster.replica(id).applied_index();
        let everyone = (1..=cluster.peers.len() as u64)
            .filter(|peer| !cluster.cut.contains(peer))
            .all(|peer| cluster.replica(peer).applied_index() >= applied);
        let answered = cluster.peers[(id - 1) as usize]
            .answers
            .iter()
            .any(|(answered, _)| answered.0 == proposal);
        answered && everyone
    });
    assert!(answered, "proposal {proposal} on {id} unanswered");
}

fn answer(cluster: &mut Cluster, id: u64, proposal: u64) -> Result<Applied, ProposalError> {
    let answers = &cluster.peer(id).answers;
    let found = answers.iter().find(|(answered, _)| answered.0 == proposal);
    found.expect("answered").1.clone()
}

/// The election of `seed`: the leader, when it settled, and the messages sent until then.
fn election(seed: u64) -> (u64, Instant, Vec<Sent>) {
    let mut cluster = Cluster::new(3, seed);
    let leader = cluster.elect();
    (leader, cluster.now, cluster.trace)
}

#[test]
fn three_replicas_elect_one_leader_and_a_seed_replays_the_election() {
    let (leader, at, trace) = election(7);
    assert!((1..=3).contains(&leader));
    assert!(!trace.is_empty());
    // Exactly one leader, whom the others follow.
    let mut cluster = Cluster::new(3, 7);
    assert_eq!(cluster.elect(), leader);
    assert_eq!(cluster.leaders(), vec![leader]);
    for id in 1..=3 {
        assert_eq!(cluster.replica(id).leader(), Some(NodeId(leader as u32)));
    }
    // One seed, the same election message for message.
    assert_eq!(election(7), (leader, at, trace.clone()));
    // Other seeds time the election differently.
    let others: Vec<(u64, Instant, Vec<Sent>)> = (8..12).map(election).collect();
    assert!(
        others.iter().any(|(_, _, other)| *other != trace),
        "every seed sent the same messages"
    );
    let leaders: BTreeSet<u64> = (0..16).map(|seed| election(seed).0).collect();
    assert!(leaders.len() > 1, "seeds 0..16 all elected {leaders:?}");
}

/// Ticks until a lone replica of `voters` voters first asks for (pre-)votes.
fn ticks_to_first_campaign(id: u32, voters: u32, seed: u64) -> usize {
    let mut replica = MetaReplica::new(
        config(id, voters, seed),
        RecoveredLog::default(),
        Instant::ZERO,
    )
    .expect("opens");
    let mut now = Instant::ZERO;
    for tick in 1..=100 {
        now = replica.poll_timeout().expect("ticking");
        replica.handle(now, ReplicaInput::Tick);
        while let Some(output) = replica.poll_output() {
            let campaigned = match output {
                ReplicaOutput::Send(message) => {
                    message.get_msg_type() == MessageType::MsgRequestPreVote
                }
                ReplicaOutput::Persist(request) => {
                    // A sole voter votes for itself: its campaign starts with storing the vote.
                    let id = request.id;
                    replica.handle(now, ReplicaInput::PersistDone { id, result: Ok(()) });
                    voters == 1
                }
                ReplicaOutput::Applied { .. }
                | ReplicaOutput::Answered { .. }
                | ReplicaOutput::ReadIndexReady { .. }
                | ReplicaOutput::ReadIndexFailed { .. }
                | ReplicaOutput::Latched(_) => false,
            };
            if campaigned {
                return tick;
            }
        }
    }
    panic!("replica {id} never campaigned (last tick at {now})");
}

#[test]
fn election_timeouts_follow_the_seed_within_the_jittered_range() {
    let range = ELECTION_TICKS..=ELECTION_TICKS + ELECTION_JITTER_TICKS_MAX;
    let timeouts: Vec<usize> = (0..32)
        .map(|seed| ticks_to_first_campaign(1, 1, seed))
        .collect();
    for (seed, ticks) in timeouts.iter().enumerate() {
        assert!(range.contains(ticks), "seed {seed}: {ticks} ticks");
        assert_eq!(
            ticks_to_first_campaign(1, 1, seed as u64),
            *ticks,
            "seed {seed} replays"
        );
    }
    let distinct: BTreeSet<usize> = timeouts.iter().copied().collect();
    assert!(distinct.len() >= 5, "jitter took only {distinct:?}");
    // One seed, several replicas: each draws from its own stream.
    let per_replica: Vec<Vec<usize>> = (0..8)
        .map(|seed| {
            (1..=3)
                .map(|id| ticks_to_first_campaign(id, 3, seed))
                .collect()
        })
        .collect();
    assert!(
        per_replica
            .iter()
            .any(|ticks| ticks[0] != ticks[1] || ticks[1] != ticks[2]),
        "replicas given one seed time out together: {per_replica:?}"
    );
}

/// The jitter shortens a timeout only once `election_ticks` have passed, so raft's lease ends on time:
/// a follower still waiting out its own jitter grants the first candidate's pre-vote. (Withholding
/// ticks instead keeps that follower inside its lease, it ignores the first candidate, and the second
/// to time out wins.)
#[test]
fn the_first_follower_to_time_out_wins_the_next_election() {
    let mut decided = 0;
    for seed in 0..12 {
        let mut cluster = Cluster::new(3, seed);
        let old = cluster.elect();
        cluster.run_for(Duration::ZERO);
        let cut_at = cluster.trace.len();
        cluster.cut.insert(old);
        let elected = cluster.run_until(Duration::from_secs(10), |cluster| {
            cluster.leaders().iter().any(|&id| id != old)
        });
        assert!(elected, "seed {seed}: no new leader");
        let new = *cluster
            .leaders()
            .iter()
            .find(|&&id| id != old)
            .expect("new leader");
        let pre_votes: Vec<&Sent> = cluster.trace[cut_at..]
            .iter()
            .filter(|sent| sent.from != old && sent.kind == MessageType::MsgRequestPreVote)
            .collect();
        let first_at = pre_votes.first().expect("someone campaigned").at;
        let first: BTreeSet<u64> = pre_votes
            .iter()
            .filter(|sent| sent.at == first_at)
            .map(|sent| sent.from)
            .collect();
        if first.len() == 1 {
            assert_eq!(first.into_iter().next(), Some(new), "seed {seed}");
            decided += 1;
        }
    }
    assert!(decided >= 6, "only {decided} seeds had one first candidate");
}

#[test]
fn a_sole_voter_elects_itself_without_the_fast_start_and_at_once_with_it() {
    let mut slow = Cluster::new(1, 3);
    assert_eq!(slow.elect(), 1);
    assert!(slow.now >= Instant::ZERO + TICK_INTERVAL * ELECTION_TICKS as u32);
    let mut fast = Cluster::with(1, 3, |config| config.fast_start_sole_voter = true);
    assert_eq!(fast.replica(1).role(), StateRole::Leader);
    assert!(
        fast.peer(1).persist.is_some(),
        "its vote and first entry to store"
    );
    assert_eq!(fast.elect(), 1);
    assert_eq!(fast.now, Instant::ZERO);
    // With peers the fast start is ignored: simultaneous campaigns would split the vote.
    let peers = Cluster::with(3, 3, |config| config.fast_start_sole_voter = true);
    for id in 1..=3 {
        assert_eq!(peers.replica(id).role(), StateRole::Follower);
    }
}

#[test]
fn a_proposal_on_the_leader_is_applied_on_all_three_with_the_same_answer() {
    let mut cluster = Cluster::new(3, 11);
    let leader = cluster.elect();
    propose(&mut cluster, leader, 1, create("orders"));
    assert_eq!(created_id(&answer(&mut cluster, leader, 1)), TopicId(1));
    propose(&mut cluster, leader, 2, create("orders"));
    assert_eq!(
        answer(&mut cluster, leader, 2),
        Err(ProposalError::Refused(TopicError::Exists))
    );
    let expected = cluster.replica(leader).state().clone();
    assert_eq!(
        expected.topic("orders").map(|topic| topic.id),
        Some(TopicId(1))
    );
    for id in 1..=3 {
        assert_eq!(cluster.replica(id).state(), &expected, "replica {id}");
        assert_eq!(
            cluster.replica(id).applied_index(),
            cluster.replica(leader).applied_index()
        );
        if id != leader {
            assert!(
                cluster.peer(id).answers.is_empty(),
                "only the proposer answers"
            );
        }
    }
}

#[test]
fn a_proposal_on_a_follower_is_refused_naming_the_leader() {
    let mut cluster = Cluster::new(3, 12);
    let leader = cluster.elect();
    let follower = if leader == 1 { 2 } else { 1 };
    cluster.handle(
        follower,
        ReplicaInput::Propose {
            id: ProposalId(5),
            command: create("orders"),
        },
    );
    let leader_id = Some(NodeId(leader as u32));
    assert_eq!(
        cluster.peer(follower).answers,
        vec![(
            ProposalId(5),
            Err(ProposalError::NotLeader { leader: leader_id })
        )]
    );
    cluster.run_for(Duration::from_secs(1));
    assert_eq!(cluster.replica(leader).state().topic_count(), 0);
}

fn read(cluster: &mut Cluster, id: u64, read: u64) {
    cluster.handle(
        id,
        ReplicaInput::ReadIndex {
            id: ReadIndexId(read),
        },
    );
}

fn others(leader: u64) -> Vec<u64> {
    (1..=3).filter(|&id| id != leader).collect()
}

#[test]
fn a_read_index_completes_only_with_a_quorum() {
    let mut cluster = Cluster::new(3, 13);
    let leader = cluster.elect();
    propose(&mut cluster, leader, 1, create("orders"));
    let committed = cluster.replica(leader).applied_index();
    cluster.cut.extend(others(leader));
    read(&mut cluster, leader, 1);
    // Heartbeats go unanswered; within the leader's check-quorum period it stays leader and waits.
    cluster.run_for(TICK_INTERVAL * (ELECTION_TICKS as u32 - 2));
    assert_eq!(cluster.leaders(), vec![leader]);
    assert!(cluster.peer(leader).reads_ready.is_empty());
    assert!(cluster.peer(leader).reads_failed.is_empty());
    cluster.cut.clear();
    let ready = cluster.run_until(Duration::from_secs(5), |cluster| {
        !cluster.peers[(leader - 1) as usize].reads_ready.is_empty()
    });
    assert!(ready);
    assert_eq!(
        cluster.peer(leader).reads_ready,
        vec![(ReadIndexId(1), committed)]
    );
}

#[test]
fn a_read_index_cut_off_from_its_quorum_times_out_and_the_leader_steps_down() {
    let mut cluster = Cluster::new(3, 14);
    let leader = cluster.elect();
    cluster.cut.extend(others(leader));
    read(&mut cluster, leader, 1);
    cluster.run_for(REQUEST_TIMEOUT + TICK_INTERVAL);
    assert!(cluster.peer(leader).reads_ready.is_empty());
    assert_eq!(
        cluster.peer(leader).reads_failed,
        vec![(ReadIndexId(1), ReadIndexError::TimedOut)]
    );
    assert_ne!(cluster.replica(leader).role(), StateRole::Leader);
}

#[test]
fn a_read_index_on_a_follower_is_confirmed_by_the_leader() {
    let mut cluster = Cluster::new(3, 15);
    let leader = cluster.elect();
    propose(&mut cluster, leader, 1, create("orders"));
    let follower = others(leader)[0];
    read(&mut cluster, follower, 9);
    let ready = cluster.run_until(Duration::from_secs(1), |cluster| {
        !cluster.peers[(follower - 1) as usize]
            .reads_ready
            .is_empty()
    });
    assert!(ready);
    let (id, index) = cluster.peer(follower).reads_ready[0];
    assert_eq!(id, ReadIndexId(9));
    assert_eq!(index, cluster.replica(leader).applied_index());
    assert!(cluster.replica(follower).state().topic("orders").is_some());
}

#[test]
fn a_read_index_on_one_voter_completes_at_once_after_its_election() {
    let mut cluster = Cluster::new(1, 16);
    // Asked before the election: it waits for the leader's first commit.
    read(&mut cluster, 1, 1);
    assert!(cluster.peer(1).reads_ready.is_empty());
    cluster.elect();
    let applied = cluster.replica(1).applied_index();
    assert_eq!(cluster.peer(1).reads_ready, vec![(ReadIndexId(1), applied)]);
    // Asked of an elected sole voter: ready within the same handle, no time passing.
    read(&mut cluster, 1, 2);
    assert_eq!(cluster.peer(1).reads_ready[1], (ReadIndexId(2), applied));
}

#[test]
fn a_failed_persist_latches_the_replica() {
    let mut cluster = Cluster::new(3, 17);
    let leader = cluster.elect();
    propose(&mut cluster, leader, 1, create("a"));
    cluster.peer(leader).fail_next_persist = Some(IoFault::Eio);
    cluster.handle(
        leader,
        ReplicaInput::Propose {
            id: ProposalId(2),
            command: create("b"),
        },
    );
    cluster.run_for(Duration::from_millis(10));
    let failure = ReplicaFailure::Persist(IoFault::Eio);
    let latched = Err(ProposalError::Latched(failure.clone()));
    assert_eq!(cluster.peer(leader).latched, vec![failure.clone()]);
    assert_eq!(answer(&mut cluster, leader, 2), latched);
    assert_eq!(
        failure.to_string(),
        "metastore disk failure: input/output error"
    );
    // Refused from now on, the fault gone or not; the state stays readable.
    cluster.handle(
        leader,
        ReplicaInput::Propose {
            id: ProposalId(3),
            command: create("c"),
        },
    );
    assert_eq!(answer(&mut cluster, leader, 3), latched);
    read(&mut cluster, leader, 1);
    assert_eq!(
        cluster.peer(leader).reads_failed,
        vec![(ReadIndexId(1), ReadIndexError::Latched(failure.clone()))]
    );
    assert_eq!(cluster.replica(leader).failure(), Some(&failure));
    assert_eq!(cluster.replica(leader).poll_timeout(), None);
    assert!(cluster.replica(leader).state().topic("a").is_some());
}

#[test]
fn a_follower_answers_its_leader_only_once_the_entries_are_persisted() {
    let mut cluster = Cluster::new(3, 18);
    let leader = cluster.elect();
    let follower = others(leader)[0];
    // Deliver what the election left on the wire.
    cluster.run_for(Duration::ZERO);
    cluster.peer(follower).hold_persists = true;
    let sent = cluster.trace.len();
    let entry_index = cluster.replica(leader).node.raft.raft_log.last_index() + 1;
    cluster.handle(
        leader,
        ReplicaInput::Propose {
            id: ProposalId(1),
            command: create("orders"),
        },
    );
    cluster.run_until(Duration::from_millis(1), |cluster| {
        cluster.peers[(follower - 1) as usize].persist.is_some()
    });
    let append_answers = |cluster: &Cluster| {
        cluster.trace[sent..]
            .iter()
            .filter(|sent| sent.from == follower && sent.kind == MessageType::MsgAppendResponse)
            .filter(|sent| sent.index >= entry_index)
            .count()
    };
    assert!(cluster.peer(follower).persist.is_some());
    assert_eq!(append_answers(&cluster), 0, "answered before its persist");
    assert!(cluster.finish_persist(follower));
    assert_eq!(append_answers(&cluster), 1);
}

/// Runs until a leader other than `old` (cut off) is elected, and returns it.
fn elect_other_than(cluster: &mut Cluster, old: u64) -> u64 {
    let elected = cluster.run_until(Duration::from_secs(10), |cluster| {
        cluster.leaders().iter().any(|&id| id != old)
    });
    assert!(elected);
    *cluster
        .leaders()
        .iter()
        .find(|&&id| id != old)
        .expect("new leader")
}

#[test]
fn a_deposed_leaders_proposal_is_answered_lost() {
    let mut cluster = Cluster::new(3, 19);
    let old = cluster.elect();
    cluster.cut.insert(old);
    cluster.handle(
        old,
        ReplicaInput::Propose {
            id: ProposalId(1),
            command: create("stranded"),
        },
    );
    let new = elect_other_than(&mut cluster, old);
    propose(&mut cluster, new, 1, create("kept"));
    cluster.cut.clear();
    let answered = cluster.run_until(Duration::from_secs(10), |cluster| {
        !cluster.peers[(old - 1) as usize].answers.is_empty()
    });
    assert!(answered);
    assert_eq!(answer(&mut cluster, old, 1), Err(ProposalError::Lost));
    assert_eq!(cluster.replica(old).state(), cluster.replica(new).state());
    assert!(cluster.replica(old).state().topic("stranded").is_none());
}

#[test]
fn a_restarted_replica_whose_uncommitted_suffix_was_replaced_catches_up_without_new_writes() {
    let mut cluster = Cluster::new(3, 19);
    let old = cluster.elect();
    cluster.cut.insert(old);
    // Appended and persisted on the cut-off leader only: never committed.
    for proposal in 1..=3 {
        cluster.handle(
            old,
            ReplicaInput::Propose {
                id: ProposalId(proposal),
                command: create(&format!("stranded{proposal}")),
            },
        );
    }
    let new = elect_other_than(&mut cluster, old);
    let disk = cluster.peer(old).disk.clone();
    let stranded_last = disk.entries.last().expect("persisted").index;
    cluster.run_until(Duration::from_secs(1), |cluster| {
        cluster.replica(new).applied_index().0 > 0
    });
    assert!(
        cluster.replica(new).applied_index().0 < stranded_last,
        "the cluster's log stays below the stranded suffix"
    );

    // The old leader restarts from its disk and rejoins a cluster that writes nothing more.
    let replica = MetaReplica::new(config(old as u32, 3, 19), disk.recovered(), cluster.now)
        .expect("reopens");
    assert!(!replica.caught_up());
    cluster.peers[(old - 1) as usize] = Peer::new(replica);
    cluster.peers[(old - 1) as usize].disk = disk;
    cluster.drain(old);
    cluster.cut.clear();
    let caught_up = cluster.run_until(Duration::from_secs(10), |cluster| {
        cluster.replica(old).caught_up()
            && cluster.replica(old).applied_index() == cluster.replica(new).applied_index()
    });
    assert!(caught_up, "the replaced suffix was never applied anywhere");
    assert!(cluster.replica(old).state().topic("stranded1").is_none());
    assert_eq!(cluster.replica(old).state(), cluster.replica(new).state());
}

#[test]
fn a_restarted_replica_recovers_its_snapshot_and_log() {
    let mut cluster = Cluster::with(1, 20, |config| config.snapshot_every_entries = 3);
    cluster.elect();
    for proposal in 0..7 {
        propose(&mut cluster, 1, proposal, create(&format!("t{proposal}")));
    }
    let disk = cluster.peer(1).disk.clone();
    assert!(disk.snapshots >= 2, "{} snapshots", disk.snapshots);
    let snapshot_index = disk.snapshot.as_ref().expect("stored").index;
    assert!(disk
        .entries
        .iter()
        .all(|entry| entry.index > snapshot_index));
    let state = cluster.replica(1).state().clone();

    let mut config = config(1, 1, 20);
    config.snapshot_every_entries = 3;
    let replica = MetaReplica::new(config, disk.recovered(), Instant::ZERO).expect("reopens");
    assert_eq!(replica.applied_index(), LogIndex(snapshot_index));
    assert_eq!(replica.caught_up(), disk.entries.is_empty());
    let mut restarted = Cluster::new(1, 20);
    restarted.peers[0] = Peer::new(replica);
    restarted.peers[0].disk = disk;
    restarted.elect();
    assert!(restarted.replica(1).caught_up());
    assert_eq!(restarted.replica(1).state(), &state);
    propose(&mut restarted, 1, 100, create("next"));
    assert_eq!(created_id(&answer(&mut restarted, 1, 100)), TopicId(8));
}

#[test]
fn a_follower_behind_the_leaders_snapshot_catches_up_from_it() {
    let mut cluster = Cluster::with(3, 21, |config| config.snapshot_every_entries = 3);
    let leader = cluster.elect();
    let behind = others(leader)[1];
    cluster.cut.insert(behind);
    for proposal in 0..8 {
        propose(
            &mut cluster,
            leader,
            proposal,
            create(&format!("t{proposal}")),
        );
    }
    assert!(cluster.peer(leader).disk.snapshots >= 2);
    cluster.cut.clear();
    let caught_up = cluster.run_until(Duration::from_secs(10), |cluster| {
        cluster.replica(behind).applied_index() == cluster.replica(leader).applied_index()
    });
    assert!(caught_up);
    let leader_state = cluster.replica(leader).state().clone();
    assert_eq!(cluster.replica(behind).state(), &leader_state);
    let disk = &cluster.peer(behind).disk;
    assert!(
        disk.snapshots >= 1,
        "the follower stored the leader's snapshot"
    );
    assert_eq!(
        disk.snapshot
            .as_ref()
            .map(|snapshot| snapshot.state.clone()),
        cluster
            .peer(leader)
            .disk
            .snapshot
            .as_ref()
            .map(|snapshot| snapshot.state.clone())
    );
}

fn entry(term: u64, index: u64) -> Entry {
    Entry {
        term,
        index,
        ..Entry::default()
    }
}

#[test]
fn recovered_gaps_falling_terms_and_bad_snapshots_are_refused() {
    let open = |recovered: RecoveredLog| {
        MetaReplica::new(config(1, 1, 0), recovered, Instant::ZERO).map(|_| ())
    };
    let log = |entries: Vec<Entry>| RecoveredLog {
        entries,
        ..RecoveredLog::default()
    };
    assert_eq!(open(log(vec![entry(1, 1), entry(1, 2)])), Ok(()));
    assert_eq!(
        open(log(vec![entry(1, 1), entry(1, 3)])),
        Err(ReplicaOpenError::Gap { after: 1, found: 3 })
    );
    assert_eq!(
        open(log(vec![entry(2, 1), entry(1, 2)])),
        Err(ReplicaOpenError::TermDecreases {
            index: 2,
            term: 1,
            previous: 2
        })
    );
    let snapshot = MetaSnapshot {
        index: 4,
        term: 1,
        voters: vec![1],
        learners: vec![],
        state: MetaState::new().encode_snapshot(),
    };
    let above = RecoveredLog {
        snapshot: Some(snapshot.clone()),
        entries: vec![entry(1, 5)],
        ..RecoveredLog::default()
    };
    assert_eq!(open(above.clone()), Ok(()));
    let mut gap = above.clone();
    gap.entries = vec![entry(1, 6)];
    assert_eq!(open(gap), Err(ReplicaOpenError::Gap { after: 4, found: 6 }));
    let mut damaged = above;
    damaged.snapshot = Some(MetaSnapshot {
        state: vec![9, 9],
        ..snapshot
    });
    assert!(matches!(
        open(damaged),
        Err(ReplicaOpenError::SnapshotState(_))
    ));
}

#[test]
fn requests_past_their_timeout_are_failed() {
    let mut cluster = Cluster::new(3, 22);
    let leader = cluster.elect();
    cluster.cut.extend(others(leader));
    cluster.handle(
        leader,
        ReplicaInput::Propose {
            id: ProposalId(1),
            command: create("orders"),
        },
    );
    cluster.run_for(REQUEST_TIMEOUT + TICK_INTERVAL);
    assert_eq!(
        answer(&mut cluster, leader, 1),
        Err(ProposalError::TimedOut)
    );
}

#[test]
fn a_learner_gets_the_log_but_no_vote_and_no_say_in_the_quorum() {
    let learner_only = |config: &mut MetaReplicaConfig| {
        config.voters = (1..=3).map(NodeId).collect();
        config.learners = vec![NodeId(4)];
    };
    let mut cluster = Cluster::with(4, 5, learner_only);
    let leader = cluster.elect();
    assert!((1..=3).contains(&leader), "a learner never leads");
    propose(&mut cluster, leader, 1, create("orders"));
    assert_eq!(created_id(&answer(&mut cluster, leader, 1)), TopicId(1));
    let replicated = cluster.run_until(Duration::from_secs(5), |cluster| {
        cluster.replica(4).state().topic("orders").is_some()
    });
    assert!(replicated, "the learner applied the entry");
    assert_eq!(
        cluster.replica(4).voters(),
        vec![NodeId(1), NodeId(2), NodeId(3)]
    );
    // Two voters still make a quorum with the learner cut off; the learner alone makes none.
    cluster.cut.insert(4);
    propose(&mut cluster, leader, 2, create("payments"));
    assert!(answer(&mut cluster, leader, 2).is_ok());
    // Learners beyond the voters only: a learner that is also a voter is refused.
    let mut config = config(1, 3, 5);
    config.learners = vec![NodeId(2)];
    assert!(MetaReplica::new(config, RecoveredLog::default(), Instant::ZERO).is_err());
}
