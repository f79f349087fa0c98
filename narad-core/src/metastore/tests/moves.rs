//! Partition moves, draining members and placements: every command's effect and refusals, the switch's
//! compare-and-swap, the cleanup by other commands, and their encoding.

use super::*;

/// Members 1, 2 and 3, and "orders" (id 1) with 6 partitions owned by 2, 3, 1, 2, 3, 1.
fn cluster() -> (MetaState, Topic) {
    let mut state = state_with_members(&[1, 2, 3]);
    let topic = created(&mut state, &create("orders", 6));
    (state, topic)
}

fn order(topic: &Topic, partition: u32, to: u32) -> MoveOrder {
    let partition = PartitionId(partition);
    MoveOrder {
        topic: topic.name.clone(),
        topic_id: topic.id,
        partition,
        from: topic.owner_of(partition).unwrap_or(NodeId(0)),
        to: NodeId(to),
    }
}

fn plan(order: &MoveOrder) -> Command {
    Command::PlanMove {
        order: order.clone(),
        max_in_flight: 16,
    }
}

fn frozen(order: &MoveOrder, final_hw: u64) -> Command {
    Command::MoveFrozen {
        topic: order.topic.clone(),
        topic_id: order.topic_id,
        partition: order.partition,
        to: order.to,
        move_id: None,
        final_hw: Offset(final_hw),
    }
}

fn switch(order: &MoveOrder, final_hw: u64) -> Command {
    Command::SwitchOwner {
        topic: order.topic.clone(),
        topic_id: order.topic_id,
        partition: order.partition,
        from: order.from,
        to: order.to,
        move_id: None,
        final_hw: Offset(final_hw),
    }
}

fn abort(order: &MoveOrder, to: Option<u32>) -> Command {
    Command::AbortMove {
        topic: order.topic.clone(),
        partition: order.partition,
        to: to.map(NodeId),
        move_id: None,
    }
}

fn draining(node: u32, draining: bool) -> Command {
    Command::SetDraining {
        node: NodeId(node),
        draining,
    }
}

/// Applies `command`, expects `error`, and checks that nothing but the version changed.
fn refused(state: &mut MetaState, command: &Command, error: TopicError) {
    let before = state.clone();
    assert_eq!(state.apply(command), Err(error), "{command:?}");
    assert_eq!(state.version(), before.version() + 1);
    let mut unchanged = state.clone();
    unchanged.version = before.version;
    assert_eq!(unchanged, before, "{command:?} changed the state");
}

/// Plans `order` and freezes it at `final_hw`; returns its `planned_at`.
fn plan_frozen(state: &mut MetaState, order: &MoveOrder, final_hw: u64) -> u64 {
    state.apply(&plan(order)).unwrap();
    let planned_at = state.version();
    state.apply(&frozen(order, final_hw)).unwrap();
    planned_at
}

#[test]
fn plan_move_records_a_copying_move_planned_at_this_version() {
    let (mut state, topic) = cluster();
    let order = order(&topic, 0, 1);
    let Ok(Applied::MovePlanned {
        topic: name,
        partition,
        planned,
    }) = state.apply(&plan(&order))
    else {
        panic!("move refused");
    };
    assert_eq!((name.as_str(), partition), ("orders", PartitionId(0)));
    assert_eq!(
        planned,
        Move {
            topic_id: topic.id,
            from: NodeId(2),
            to: NodeId(1),
            state: MoveState::Copying,
            planned_at: state.version(),
            final_hw: None,
        }
    );
    assert_eq!(state.move_of("orders", PartitionId(0)), Some(&planned));
    assert_eq!(state.move_of("orders", PartitionId(1)), None);
    assert_eq!(state.moves().len(), 1);
    assert_eq!(state.outbound_moves(NodeId(2)), 1);
    assert_eq!(state.outbound_moves(NodeId(1)), 0);
    // The owner stays until the switch.
    assert_eq!(state.topic("orders"), Some(&topic));
    assert_eq!(MoveState::Copying.as_str(), "copying");
    assert_eq!(MoveState::Frozen.as_str(), "frozen");
}

#[test]
fn plan_move_is_refused_in_its_documented_order() {
    let (mut state, topic) = cluster();
    state.apply(&member(4)).unwrap();
    state.apply(&member(5)).unwrap();
    state
        .apply(&Command::SetMemberAlive {
            node: NodeId(4),
            alive: false,
        })
        .unwrap();
    state.apply(&draining(5, true)).unwrap();

    let mut missing = order(&topic, 0, 1);
    missing.topic = "nope".to_string();
    refused(&mut state, &plan(&missing), TopicError::NotFound);
    let mut other_incarnation = order(&topic, 6, 9);
    other_incarnation.topic_id = TopicId(99);
    refused(&mut state, &plan(&other_incarnation), TopicError::NotFound);
    refused(
        &mut state,
        &plan(&order(&topic, 6, 1)),
        TopicError::PartitionOutOfRange,
    );
    let mut not_owner = order(&topic, 0, 9);
    not_owner.from = NodeId(1);
    refused(
        &mut state,
        &plan(&not_owner),
        TopicError::MoveNotOwner(NodeId(1)),
    );
    refused(
        &mut state,
        &plan(&order(&topic, 1, 9)),
        TopicError::UnknownMember(NodeId(9)),
    );
    for to in [3, 4, 5] {
        // Partition 1's owner is 3; 4 is marked dead, 5 draining.
        refused(
            &mut state,
            &plan(&order(&topic, 1, to)),
            TopicError::MoveTargetUnavailable(NodeId(to)),
        );
    }
    state.apply(&plan(&order(&topic, 0, 1))).unwrap();
    refused(
        &mut state,
        &plan(&order(&topic, 0, 3)),
        TopicError::MoveInProgress,
    );
    let capped = |to: u32, max_in_flight: u32| Command::PlanMove {
        order: order(&topic, 1, to),
        max_in_flight,
    };
    refused(
        &mut state,
        &capped(4, 1),
        TopicError::MoveTargetUnavailable(NodeId(4)),
    );
    refused(
        &mut state,
        &capped(1, 1),
        TopicError::TooManyMoves { max_in_flight: 1 },
    );
    assert!(matches!(
        state.apply(&capped(1, 2)),
        Ok(Applied::MovePlanned { .. })
    ));
    assert_eq!(
        TopicError::TooManyMoves { max_in_flight: 1 }.to_string(),
        "too many partition moves in flight (limit 1)"
    );
}

#[test]
fn move_frozen_sets_the_final_watermark_once() {
    let (mut state, topic) = cluster();
    let order = order(&topic, 0, 1);
    refused(&mut state, &frozen(&order, 10), TopicError::MoveNotFound);
    state.apply(&plan(&order)).unwrap();
    let planned_at = state.version();
    let mut other_target = order.clone();
    other_target.to = NodeId(3);
    refused(
        &mut state,
        &frozen(&other_target, 10),
        TopicError::MoveNotFound,
    );
    let mut other_incarnation = order.clone();
    other_incarnation.topic_id = TopicId(99);
    refused(
        &mut state,
        &frozen(&other_incarnation, 10),
        TopicError::MoveNotFound,
    );
    let expected = Move {
        topic_id: topic.id,
        from: NodeId(2),
        to: NodeId(1),
        state: MoveState::Frozen,
        planned_at,
        final_hw: Some(Offset(10)),
    };
    let updated = Ok(Applied::MoveUpdated {
        topic: "orders".to_string(),
        partition: PartitionId(0),
        updated: expected.clone(),
    });
    assert_eq!(state.apply(&frozen(&order, 10)), updated);
    // A retried freeze at the same watermark changes nothing; another watermark is refused.
    let before = state.clone();
    assert_eq!(state.apply(&frozen(&order, 10)), updated);
    let mut unchanged = state.clone();
    unchanged.version = before.version;
    assert_eq!(unchanged, before);
    refused(&mut state, &frozen(&order, 11), TopicError::MoveNotFound);
    assert_eq!(state.move_of("orders", PartitionId(0)), Some(&expected));
}

#[test]
fn switch_owner_makes_the_target_the_owner_at_a_new_placement() {
    let (mut state, topic) = cluster();
    let first = order(&topic, 0, 1);
    let planned_at = plan_frozen(&mut state, &first, 10);
    let Ok(Applied::MoveSwitched {
        topic: after,
        partition,
        placement,
    }) = state.apply(&switch(&first, 10))
    else {
        panic!("switch refused");
    };
    assert_eq!((partition, placement), (PartitionId(0), planned_at));
    assert_eq!(after.owner_of(PartitionId(0)), Some(NodeId(1)));
    assert_eq!(after.owners[1..], topic.owners[1..]);
    assert_eq!(after.metadata_version, state.version());
    assert_eq!(state.topic("orders"), Some(&after));
    assert_eq!(state.move_of("orders", PartitionId(0)), None);
    assert_eq!(state.placement(topic.id, PartitionId(0)), planned_at);
    assert_eq!(state.placement(topic.id, PartitionId(1)), 0);
    // A later move of the partition gets a later epoch.
    let second = order(&after, 0, 3);
    plan_frozen(&mut state, &second, 12);
    state.apply(&switch(&second, 12)).unwrap();
    assert!(state.placement(topic.id, PartitionId(0)) > planned_at);
    assert_eq!(
        state.topic("orders").unwrap().owner_of(PartitionId(0)),
        Some(NodeId(3))
    );
}

#[test]
fn switch_owner_is_a_compare_and_swap_on_the_whole_move() {
    let (mut state, topic) = cluster();
    let order = order(&topic, 0, 1);
    state.apply(&plan(&order)).unwrap();
    // Still copying: the owner has not frozen the partition.
    refused(&mut state, &switch(&order, 10), TopicError::MoveNotFound);
    state.apply(&frozen(&order, 10)).unwrap();
    let mut wrong = Vec::new();
    for change in 0..4 {
        let mut other = order.clone();
        match change {
            0 => other.from = NodeId(3),
            1 => other.to = NodeId(3),
            2 => other.topic_id = TopicId(99),
            _ => other.partition = PartitionId(1),
        }
        wrong.push(switch(&other, 10));
    }
    wrong.push(switch(&order, 11));
    for command in &wrong {
        refused(&mut state, command, TopicError::MoveNotFound);
    }
    assert!(matches!(
        state.apply(&switch(&order, 10)),
        Ok(Applied::MoveSwitched { .. })
    ));
    // Applied once: the move is gone, a repeat is refused.
    refused(&mut state, &switch(&order, 10), TopicError::MoveNotFound);
}

#[test]
fn a_reassignment_ends_the_move_and_refuses_its_switch() {
    let (mut state, topic) = cluster();
    let moved = order(&topic, 0, 1);
    let other = order(&topic, 1, 1);
    plan_frozen(&mut state, &moved, 10);
    state.apply(&plan(&other)).unwrap();
    state
        .apply(&Command::AssignPartition {
            topic: "orders".to_string(),
            topic_id: topic.id,
            partition: PartitionId(0),
            owner: NodeId(3),
        })
        .unwrap();
    assert_eq!(state.move_of("orders", PartitionId(0)), None);
    assert!(state.move_of("orders", PartitionId(1)).is_some());
    refused(&mut state, &switch(&moved, 10), TopicError::MoveNotFound);
    assert_eq!(
        state.topic("orders").unwrap().owner_of(PartitionId(0)),
        Some(NodeId(3))
    );
    assert_eq!(state.placement(topic.id, PartitionId(0)), 0);
}

#[test]
fn a_recreated_topic_refuses_the_old_incarnations_switch() {
    let (mut state, old) = cluster();
    let stale = order(&old, 0, 1);
    plan_frozen(&mut state, &stale, 10);
    state
        .apply(&Command::DeleteTopic {
            name: "orders".to_string(),
        })
        .unwrap();
    assert!(state.moves().is_empty());
    let new = created(&mut state, &create("orders", 6));
    // The new incarnation's partition 0 moves from the same owner to the same target, frozen at the
    // same watermark: only the incarnation tells the two switches apart.
    state
        .apply(&Command::AssignPartition {
            topic: "orders".to_string(),
            topic_id: new.id,
            partition: PartitionId(0),
            owner: NodeId(2),
        })
        .unwrap();
    let fresh = order(state.topic("orders").unwrap(), 0, 1);
    assert_eq!((fresh.from, fresh.to), (stale.from, stale.to));
    plan_frozen(&mut state, &fresh, 10);
    refused(&mut state, &switch(&stale, 10), TopicError::MoveNotFound);
    refused(
        &mut state,
        &abort(&stale, Some(3)),
        TopicError::MoveNotFound,
    );
    assert!(matches!(
        state.apply(&switch(&fresh, 10)),
        Ok(Applied::MoveSwitched { .. })
    ));
}

#[test]
fn abort_move_ends_the_move_and_a_late_switch_is_refused() {
    let (mut state, topic) = cluster();
    let order = order(&topic, 0, 1);
    refused(&mut state, &abort(&order, None), TopicError::MoveNotFound);
    let planned_at = plan_frozen(&mut state, &order, 10);
    refused(
        &mut state,
        &abort(&order, Some(3)),
        TopicError::MoveNotFound,
    );
    assert_eq!(
        state.apply(&abort(&order, Some(1))),
        Ok(Applied::MoveAborted {
            topic: "orders".to_string(),
            partition: PartitionId(0),
            aborted: Move {
                topic_id: topic.id,
                from: NodeId(2),
                to: NodeId(1),
                state: MoveState::Frozen,
                planned_at,
                final_hw: Some(Offset(10)),
            },
        })
    );
    refused(&mut state, &switch(&order, 10), TopicError::MoveNotFound);
    refused(&mut state, &frozen(&order, 10), TopicError::MoveNotFound);
    assert_eq!(state.topic("orders"), Some(&topic));
    // Without a target, any move of the partition.
    state.apply(&plan(&order)).unwrap();
    assert!(matches!(
        state.apply(&abort(&order, None)),
        Ok(Applied::MoveAborted { .. })
    ));
    assert!(state.moves().is_empty());
}

#[test]
fn set_draining_marks_members_only() {
    let mut state = state_with_members(&[1, 2]);
    assert_eq!(
        state.apply(&draining(2, true)),
        Ok(Applied::MemberDraining {
            node: NodeId(2),
            draining: true
        })
    );
    assert!(state.is_draining(NodeId(2)) && !state.is_draining(NodeId(1)));
    assert_eq!(state.draining(), &BTreeSet::from([NodeId(2)]));
    refused(
        &mut state,
        &draining(9, true),
        TopicError::UnknownMember(NodeId(9)),
    );
    state.apply(&draining(2, false)).unwrap();
    assert!(state.draining().is_empty());
}

#[test]
fn delete_topic_forgets_its_moves_and_placements() {
    let (mut state, topic) = cluster();
    let other = created(&mut state, &create("other", 3));
    let switched = order(&topic, 0, 1);
    plan_frozen(&mut state, &switched, 10);
    state.apply(&switch(&switched, 10)).unwrap();
    state.apply(&plan(&order(&topic, 1, 1))).unwrap();
    let kept = order(&other, 0, 1);
    plan_frozen(&mut state, &kept, 3);
    state.apply(&switch(&kept, 3)).unwrap();
    state.apply(&plan(&order(&other, 1, 2))).unwrap();
    assert_ne!(state.placement(topic.id, PartitionId(0)), 0);
    state
        .apply(&Command::DeleteTopic {
            name: "orders".to_string(),
        })
        .unwrap();
    assert_eq!(
        state.moves().keys().cloned().collect::<Vec<_>>(),
        vec![("other".to_string(), PartitionId(1))]
    );
    assert_eq!(state.placement(topic.id, PartitionId(0)), 0);
    assert_ne!(state.placement(other.id, PartitionId(0)), 0);
    assert_eq!(state.placements.len(), 1);
}

#[test]
fn remove_member_forgets_its_moves_and_its_draining() {
    let (mut state, topic) = cluster();
    let kept = order(&topic, 0, 1);
    state.apply(&plan(&kept)).unwrap();
    state.apply(&plan(&order(&topic, 1, 1))).unwrap(); // from 3
    state.apply(&plan(&order(&topic, 3, 3))).unwrap(); // to 3
    state.apply(&draining(3, true)).unwrap();
    state.apply(&draining(1, true)).unwrap();
    state
        .apply(&Command::RemoveMember { node: NodeId(3) })
        .unwrap();
    assert_eq!(
        state.moves().keys().cloned().collect::<Vec<_>>(),
        vec![("orders".to_string(), PartitionId(0))]
    );
    assert_eq!(state.draining(), &BTreeSet::from([NodeId(1)]));
    // Its partitions keep their owner until moved.
    assert_eq!(
        state.topic("orders").unwrap().owner_of(PartitionId(1)),
        Some(NodeId(3))
    );
}

#[test]
fn draining_members_get_no_new_partitions() {
    let mut state = state_with_members(&[1, 2, 3]);
    state.apply(&draining(2, true)).unwrap();
    let topic = created(&mut state, &create("t", 6));
    assert!(topic.owners.iter().all(|owner| owner.is_some()));
    assert!(!topic.owners.contains(&Some(NodeId(2))));
    let mut change = alter("t");
    change.partitions = Some(12);
    let Ok(Applied::TopicAltered(topic)) = state.apply(&Command::AlterTopic(change)) else {
        panic!("alter refused");
    };
    assert!(topic.owners.iter().all(|owner| owner.is_some()));
    assert!(!topic.owners.contains(&Some(NodeId(2))));

    // A member joining assigns unassigned partitions over the members not draining.
    state.topics.get_mut("t").unwrap().owners[0] = None;
    state.apply(&draining(1, true)).unwrap();
    state.apply(&member(4)).unwrap();
    // Topic id 1 over [3, 4] starts at index 1 % 2 = 1.
    assert_eq!(
        state.topic("t").unwrap().owner_of(PartitionId(0)),
        Some(NodeId(4))
    );

    // Every candidate draining: as without draining.
    state.apply(&draining(3, true)).unwrap();
    state.apply(&draining(4, true)).unwrap();
    let all = created(&mut state, &create("all", 4));
    assert_eq!(
        all.owners.iter().flatten().collect::<BTreeSet<_>>().len(),
        4
    );
    // The only member alive is draining: it takes new partitions rather than the dead ones.
    let mut state = state_with_members(&[1, 2, 3]);
    for node in [1, 3] {
        state
            .apply(&Command::SetMemberAlive {
                node: NodeId(node),
                alive: false,
            })
            .unwrap();
    }
    state.apply(&draining(2, true)).unwrap();
    let topic = created(&mut state, &create("t", 3));
    assert_eq!(topic.owners, vec![Some(NodeId(2)); 3]);
}

/// Two topics, a switched move (a placement), a frozen and a copying move, a member draining.
fn state_with_moves() -> MetaState {
    let (mut state, topic) = cluster();
    let other = created(&mut state, &create("other", 3));
    let switched = order(&topic, 0, 1);
    plan_frozen(&mut state, &switched, 10);
    state.apply(&switch(&switched, 10)).unwrap();
    plan_frozen(&mut state, &order(&topic, 1, 2), 7);
    state.apply(&plan(&order(&other, 2, 1))).unwrap();
    state.apply(&draining(3, true)).unwrap();
    state
}

#[test]
fn snapshots_keep_moves_draining_and_placements() {
    let state = state_with_moves();
    let bytes = state.encode_snapshot();
    assert_eq!(bytes[0], SNAPSHOT_FORMAT_5);
    let decoded = MetaState::decode_snapshot(&bytes).unwrap();
    assert_eq!(decoded, state);
    assert_eq!(decoded.moves().len(), 2);
    assert!(decoded.is_draining(NodeId(3)));
    assert_ne!(decoded.placement(TopicId(1), PartitionId(0)), 0);
    for cut in 1..bytes.len() {
        assert!(matches!(
            MetaState::decode_snapshot(&bytes[..cut]),
            Err(EncodingError::Malformed(_))
        ));
    }
}

#[test]
fn snapshot_decoding_refuses_broken_moves_draining_and_placements() {
    let state = state_with_moves();
    let key = ("orders".to_string(), PartitionId(1));
    let a_move = state.move_of("orders", PartitionId(1)).unwrap().clone();
    let with_move = |key: (String, PartitionId), change: &dyn Fn(&mut Move)| {
        let mut broken = state.clone();
        let mut found = a_move.clone();
        change(&mut found);
        broken.moves.remove(&("orders".to_string(), PartitionId(1)));
        broken.moves.insert(key, found);
        broken
    };
    let cases: Vec<(MetaState, &str)> = vec![
        (
            with_move(("nope".to_string(), PartitionId(1)), &|_| {}),
            "move of nope/1 names no live incarnation",
        ),
        (
            with_move(key.clone(), &|found| found.topic_id = TopicId(2)),
            "move of orders/1 names no live incarnation",
        ),
        (
            with_move(("orders".to_string(), PartitionId(6)), &|_| {}),
            "move of orders/6 is out of range",
        ),
        (
            with_move(key.clone(), &|found| found.from = NodeId(1)),
            "move of orders/1 is not from the partition's owner",
        ),
        (
            with_move(key.clone(), &|found| found.to = NodeId(3)),
            "move of orders/1 targets 3, not another member",
        ),
        (
            with_move(key.clone(), &|found| found.to = NodeId(9)),
            "move of orders/1 targets 9, not another member",
        ),
        (
            with_move(key.clone(), &|found| found.final_hw = None),
            "move of orders/1 is frozen with final watermark None",
        ),
        (
            with_move(key.clone(), &|found| found.state = MoveState::Copying),
            "move of orders/1 is copying with final watermark Some(Offset(7))",
        ),
        (
            with_move(key.clone(), &|found| found.planned_at = 0),
            "move of orders/1 was planned at version 0",
        ),
        (
            with_move(key.clone(), &|found| found.planned_at = u64::MAX),
            "move of orders/1 was planned at version 18446744073709551615",
        ),
    ];
    let mut cases = cases;
    let mut broken = state.clone();
    broken.draining.insert(NodeId(9));
    cases.push((broken, "node 9 is draining but is not a member"));
    for (placement, what) in [
        (
            (TopicId(9), PartitionId(0), 1),
            "placement of topic id 9 partition 0 names no live partition",
        ),
        (
            (TopicId(1), PartitionId(6), 1),
            "placement of topic id 1 partition 6 names no live partition",
        ),
        (
            (TopicId(1), PartitionId(2), 0),
            "placement of topic id 1 partition 2 has epoch 0",
        ),
        (
            (TopicId(1), PartitionId(2), u64::MAX),
            "placement of topic id 1 partition 2 has epoch 18446744073709551615",
        ),
    ] {
        let mut broken = state.clone();
        let (id, partition, epoch) = placement;
        broken.placements.insert((id, partition), epoch);
        cases.push((broken, what));
    }
    for (broken, what) in cases {
        assert_eq!(
            MetaState::decode_snapshot(&broken.encode_snapshot()),
            Err(EncodingError::Malformed(what.to_string()))
        );
    }
}

#[test]
fn move_commands_round_trip_and_leave_earlier_variants_bytes_alone() {
    let order = MoveOrder {
        topic: "orders".to_string(),
        topic_id: TopicId(u64::MAX),
        partition: PartitionId(107),
        from: NodeId(1),
        to: NodeId(u32::MAX),
    };
    let commands = vec![
        Command::PlanMove {
            order: order.clone(),
            max_in_flight: 8,
        },
        frozen(&order, u64::MAX),
        switch(&order, 0),
        abort(&order, None),
        abort(&order, Some(2)),
        draining(3, true),
    ];
    for command in commands {
        let bytes = command.encode();
        assert_eq!(bytes[0], COMMAND_FORMAT_2);
        assert_eq!(Command::decode(&bytes), Ok(command));
    }
    // Variant indexes: the earlier ones keep theirs, the new ones follow `SetPassword` (10).
    assert_eq!(
        Command::DeleteTopic {
            name: "t".to_string()
        }
        .encode(),
        vec![COMMAND_FORMAT_2, 2, 1, b't']
    );
    assert_eq!(
        Command::RemoveMember { node: NodeId(3) }.encode(),
        vec![COMMAND_FORMAT_2, 5, 3]
    );
    assert_eq!(draining(3, true).encode(), vec![COMMAND_FORMAT_2, 15, 3, 1]);
    assert_eq!(abort(&order, None).encode()[..2], [COMMAND_FORMAT_2, 14]);
}

/// A move command built from the generator's state: mostly about a move or partition that exists,
/// with a field sometimes off so refusals are exercised too.
fn random_move_command(rng: &mut ChaCha8Rng, state: &MetaState) -> Command {
    let (topics, _) = state.topics_after("", usize::MAX);
    let in_flight: Vec<(&(String, PartitionId), &Move)> = state.moves().iter().collect();
    let node = |rng: &mut ChaCha8Rng| NodeId(rng.random_range(0..5));
    let final_hw = Offset(rng.random_range(0..3));
    match (
        rng.random_range(0..6),
        in_flight.is_empty(),
        topics.is_empty(),
    ) {
        (0 | 1, _, false) => {
            let topic = topics[rng.random_range(0..topics.len())];
            let partition = PartitionId(rng.random_range(0..topic.partitions() + 1));
            let from = match topic.owner_of(partition) {
                Some(owner) if rng.random_bool(0.9) => owner,
                _ => node(rng),
            };
            Command::PlanMove {
                order: MoveOrder {
                    topic: topic.name.clone(),
                    topic_id: topic.id,
                    partition,
                    from,
                    to: node(rng),
                },
                max_in_flight: rng.random_range(0..6),
            }
        }
        (2..=4, false, _) => {
            let ((topic, partition), found) = in_flight[rng.random_range(0..in_flight.len())];
            let order = MoveOrder {
                topic: topic.clone(),
                topic_id: found.topic_id,
                partition: *partition,
                from: found.from,
                to: if rng.random_bool(0.9) {
                    found.to
                } else {
                    node(rng)
                },
            };
            let hw = found.final_hw.map_or(final_hw.0, |hw| hw.0);
            match rng.random_range(0..3) {
                0 => frozen(&order, final_hw.0),
                1 => switch(&order, hw),
                _ => abort(&order, rng.random_bool(0.5).then_some(order.to.0)),
            }
        }
        _ => Command::SetDraining {
            node: node(rng),
            draining: rng.random_bool(0.5),
        },
    }
}

#[test]
fn replicas_applying_moves_agree_and_snapshots_resume_them() {
    let mut switched = 0;
    for seed in 0..seed_count() {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut first = MetaState::new();
        let mut log = Vec::new();
        let mut answers = Vec::new();
        for _ in 0..300 {
            let command = if rng.random_bool(0.5) {
                random_command(&mut rng)
            } else {
                random_move_command(&mut rng, &first)
            };
            // Applied as decoded from the log, as the host does; every apply checks the invariants.
            let command = Command::decode(&command.encode()).unwrap();
            let answer = first.apply(&command);
            switched += usize::from(matches!(answer, Ok(Applied::MoveSwitched { .. })));
            log.push(command);
            answers.push(answer);
        }
        let cut = rng.random_range(0..log.len());
        let mut second = MetaState::new();
        for command in &log[..cut] {
            let _ = second.apply(command);
        }
        let mut resumed = MetaState::decode_snapshot(&second.encode_snapshot()).unwrap();
        for (command, answer) in log[cut..].iter().zip(&answers[cut..]) {
            assert_eq!(
                resumed.apply(command),
                *answer,
                "seed {seed}: rerun with NARAD_TEST_SEEDS={} cargo test -p narad-core metastore",
                seed + 1
            );
        }
        assert_eq!(first, resumed, "seed {seed}");
    }
    assert!(switched > 0, "no switch applied: the generator is too weak");
}

/// A freeze, switch or abort naming an earlier (aborted) move of the partition never applies to
/// a later one: the source committed on between the two, so the first freeze's watermark is not
/// the second's.
#[test]
fn a_freeze_switch_or_abort_of_an_aborted_move_is_refused_on_the_next_one() {
    let (mut state, topic) = cluster();
    let order = order(&topic, 0, 1);
    state.apply(&plan(&order)).unwrap();
    let first = state.version();
    state.apply(&abort(&order, None)).unwrap();
    state.apply(&plan(&order)).unwrap();
    let second = state.version();
    let named = |command: Command, id: u64| match command {
        Command::MoveFrozen {
            topic,
            topic_id,
            partition,
            to,
            final_hw,
            ..
        } => Command::MoveFrozen {
            topic,
            topic_id,
            partition,
            to,
            move_id: Some(id),
            final_hw,
        },
        Command::SwitchOwner {
            topic,
            topic_id,
            partition,
            from,
            to,
            final_hw,
            ..
        } => Command::SwitchOwner {
            topic,
            topic_id,
            partition,
            from,
            to,
            move_id: Some(id),
            final_hw,
        },
        Command::AbortMove {
            topic,
            partition,
            to,
            ..
        } => Command::AbortMove {
            topic,
            partition,
            to,
            move_id: Some(id),
        },
        other => other,
    };
    refused(
        &mut state,
        &named(frozen(&order, 10), first),
        TopicError::MoveNotFound,
    );
    refused(
        &mut state,
        &named(abort(&order, None), first),
        TopicError::MoveNotFound,
    );
    state.apply(&named(frozen(&order, 12), second)).unwrap();
    refused(
        &mut state,
        &named(switch(&order, 12), first),
        TopicError::MoveNotFound,
    );
    assert!(matches!(
        state.apply(&named(switch(&order, 12), second)),
        Ok(Applied::MoveSwitched { .. })
    ));
}
