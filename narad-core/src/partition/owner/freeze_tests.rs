//! The handoff freeze on the owner: armed under the produce lock with the final high watermark,
//! held while the replica records the move (across a restart: the replica says frozen by itself),
//! lifted by an abort.

use super::tests::{create, owned_here, state, Harness, HERE};
use super::*;
use crate::metastore::{Command, MoveOrder};
use crate::partition::combiner::QueryId;

fn plan(commands: &mut Vec<Command>) -> (TopicId, PartitionId) {
    let before = state(commands);
    let topic = before.topic("t").expect("created");
    let partition = owned_here(&before, "t");
    commands.push(Command::PlanMove {
        order: MoveOrder {
            topic: "t".into(),
            topic_id: topic.id,
            partition,
            from: HERE,
            to: NodeId(2),
        },
        max_in_flight: 8,
    });
    (topic.id, partition)
}

/// A topic with a move of a partition owned here planned, its logs open: the commands, the
/// incarnation, the partition, the harness and the move's id.
fn opened_with_a_move() -> (Vec<Command>, TopicId, PartitionId, Harness, u64) {
    let mut commands = vec![create("t", 3)];
    let (id, partition) = plan(&mut commands);
    let mut h = Harness::new();
    h.replica(&commands);
    h.run_all();
    let move_id = state(&commands).move_of("t", partition).unwrap().planned_at;
    (commands, id, partition, h, move_id)
}

fn committed(h: &mut Harness) -> Vec<(BatchId, Result<CommittedRange, CommitError>)> {
    h.run_all();
    h.take()
        .into_iter()
        .filter_map(|output| match output {
            OwnerOutput::Committed { id, result } => Some((id, result)),
            _ => None,
        })
        .collect()
}

fn freeze(h: &mut Harness, partition: PartitionId, move_id: u64) -> Result<Offset, FreezeRefused> {
    h.input(OwnerInput::Freeze(FreezeRequest {
        topic: Arc::from("t"),
        partition,
        move_id,
        query: QueryId(9),
    }));
    h.run_all();
    h.take()
        .into_iter()
        .find_map(|output| match output {
            OwnerOutput::FreezeArmed {
                query: QueryId(9),
                result,
            } => Some(result),
            _ => None,
        })
        .expect("the freeze is answered")
}

#[test]
fn a_freeze_refuses_commits_under_the_lock_until_the_move_is_aborted() {
    let (mut commands, id, partition, mut h, move_id) = opened_with_a_move();
    h.commit(1, id, partition, "before");
    assert!(matches!(committed(&mut h)[..], [(BatchId(1), Ok(_))]));
    assert_eq!(freeze(&mut h, partition, move_id), Ok(Offset(1)));
    h.commit(2, id, partition, "frozen");
    assert_eq!(
        committed(&mut h),
        [(BatchId(2), Err(CommitError::NotOwner))],
        "refused with nothing appended"
    );
    // Recorded in the replica: frozen by the replica alone (a restart comes back frozen).
    commands.push(Command::MoveFrozen {
        topic: "t".into(),
        topic_id: id,
        partition,
        to: NodeId(2),
        move_id: None,
        final_hw: Offset(1),
    });
    h.replica(&commands);
    let mut restarted = Harness::new();
    restarted.disk = h.disk.clone();
    restarted.replica(&commands);
    restarted.run_all();
    for harness in [&mut h, &mut restarted] {
        harness.commit(3, id, partition, "still frozen");
        assert_eq!(
            committed(harness),
            [(BatchId(3), Err(CommitError::NotOwner))]
        );
    }
    // Asked again: the same final high watermark.
    assert_eq!(freeze(&mut h, partition, move_id), Ok(Offset(1)));
    // Aborted: produce resumes after the final high watermark, nothing lost.
    commands.push(Command::AbortMove {
        topic: "t".into(),
        partition,
        to: Some(NodeId(2)),
        move_id: None,
    });
    h.replica(&commands);
    h.commit(4, id, partition, "after");
    match &committed(&mut h)[..] {
        [(BatchId(4), Ok(range))] => assert_eq!(range.base, Offset(1)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_freeze_without_its_move_is_refused_and_arms_nothing() {
    let (_, id, partition, mut h, move_id) = opened_with_a_move();
    assert_eq!(
        freeze(&mut h, partition, move_id + 1),
        Err(FreezeRefused::NoMove)
    );
    h.commit(1, id, partition, "not frozen");
    assert!(matches!(committed(&mut h)[..], [(BatchId(1), Ok(_))]));
}

#[test]
fn an_armed_freeze_is_lifted_when_its_move_goes_before_it_is_recorded() {
    let (mut commands, id, partition, mut h, move_id) = opened_with_a_move();
    assert_eq!(freeze(&mut h, partition, move_id), Ok(Offset(0)));
    h.commit(1, id, partition, "frozen");
    assert_eq!(
        committed(&mut h),
        [(BatchId(1), Err(CommitError::NotOwner))]
    );
    commands.push(Command::AbortMove {
        topic: "t".into(),
        partition,
        to: None,
        move_id: None,
    });
    h.replica(&commands);
    h.commit(2, id, partition, "resumed");
    assert!(matches!(committed(&mut h)[..], [(BatchId(2), Ok(_))]));
}

#[test]
fn a_switch_lets_the_source_s_log_go_and_reads_there_are_not_live() {
    let (mut commands, id, partition, mut h, move_id) = opened_with_a_move();
    assert_eq!(freeze(&mut h, partition, move_id), Ok(Offset(0)));
    for command in [
        Command::MoveFrozen {
            topic: "t".into(),
            topic_id: id,
            partition,
            to: NodeId(2),
            move_id: None,
            final_hw: Offset(0),
        },
        Command::SwitchOwner {
            topic: "t".into(),
            topic_id: id,
            partition,
            from: HERE,
            to: NodeId(2),
            move_id: None,
            final_hw: Offset(0),
        },
    ] {
        commands.push(command);
    }
    h.replica(&commands);
    h.run_all();
    let retired = h.take().into_iter().any(|output| {
        matches!(
            output,
            OwnerOutput::Log {
                event: LogEvent::Retired { .. },
                ..
            }
        )
    });
    assert!(
        retired,
        "the source's copy is reclaimed once the switch applied"
    );
    h.commit(1, id, partition, "late");
    assert_eq!(
        committed(&mut h),
        [(BatchId(1), Err(CommitError::NotOwner))]
    );
}
