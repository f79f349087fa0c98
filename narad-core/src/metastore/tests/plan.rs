//! The rebalance planner: fair shares, draining and departed owners, dead owners, moves in flight, the
//! budget, determinism, and convergence over random states.

use super::*;

/// Partitions owned per node (members or not).
fn load(state: &MetaState) -> BTreeMap<NodeId, usize> {
    let mut load = BTreeMap::new();
    for topic in state.topics.values() {
        for owner in topic.owners.iter().flatten() {
            *load.entry(*owner).or_default() += 1;
        }
    }
    load
}

fn receivers(state: &MetaState) -> Vec<NodeId> {
    state
        .members()
        .keys()
        .copied()
        .filter(|&node| state.is_alive(node) && !state.is_draining(node))
        .collect()
}

fn plan_all(state: &mut MetaState, orders: &[MoveOrder]) {
    for order in orders {
        let command = Command::PlanMove {
            order: order.clone(),
            max_in_flight: u32::MAX,
        };
        assert!(
            matches!(state.apply(&command), Ok(Applied::MovePlanned { .. })),
            "{order:?} refused"
        );
    }
}

/// Freezes and switches the move in flight of `order`'s partition.
fn complete(state: &mut MetaState, topic: &str, partition: PartitionId) {
    let found = state.move_of(topic, partition).unwrap().clone();
    let final_hw = Offset(state.version());
    state
        .apply(&Command::MoveFrozen {
            topic: topic.to_string(),
            topic_id: found.topic_id,
            partition,
            to: found.to,
            move_id: None,
            final_hw,
        })
        .unwrap();
    let switch = Command::SwitchOwner {
        topic: topic.to_string(),
        topic_id: found.topic_id,
        partition,
        from: found.from,
        to: found.to,
        move_id: None,
        final_hw,
    };
    assert!(matches!(
        state.apply(&switch),
        Ok(Applied::MoveSwitched { .. })
    ));
}

/// Plans, freezes and switches every order.
fn apply_in_full(state: &mut MetaState, orders: &[MoveOrder]) {
    plan_all(state, orders);
    for order in orders {
        complete(state, &order.topic, order.partition);
    }
}

/// Plans with `max_in_flight` and applies each plan in full until the plan is empty; the rounds.
fn rebalance(state: &mut MetaState, max_in_flight: usize) -> usize {
    let mut rounds = 0;
    loop {
        let orders = plan_rebalance(state, max_in_flight);
        if orders.is_empty() {
            return rounds;
        }
        assert!(orders.len() <= max_in_flight);
        apply_in_full(state, &orders);
        rounds += 1;
        assert!(rounds < 1_000, "no convergence");
    }
}

/// Every assigned partition is at a receiver or at a member marked dead, and every receiver holds
/// ⌊T/R⌋ or ⌈T/R⌉ of the T at receivers, exactly T mod R of them ⌈T/R⌉.
fn assert_fair(state: &MetaState) {
    let receivers = receivers(state);
    let load = load(state);
    for (node, count) in &load {
        let dead = state.members().contains_key(node) && !state.is_alive(*node);
        assert!(
            receivers.contains(node) || dead || receivers.is_empty(),
            "node {node} keeps {count} partitions: {load:?}"
        );
    }
    if receivers.is_empty() {
        return;
    }
    let total: usize = receivers
        .iter()
        .map(|node| load.get(node).unwrap_or(&0))
        .sum();
    let (floor, extra) = (total / receivers.len(), total % receivers.len());
    let at_ceiling = receivers
        .iter()
        .filter(|node| load.get(node).copied().unwrap_or(0) == floor + 1)
        .count();
    for node in &receivers {
        let count = load.get(node).copied().unwrap_or(0);
        assert!(count == floor || count == floor + 1, "{load:?}");
    }
    assert_eq!(at_ceiling, if extra == 0 { 0 } else { extra }, "{load:?}");
}

/// Members 1, 2, 3; topics "a" and "b" of 9 partitions each, all on member 1.
fn all_on_one() -> MetaState {
    let mut state = state_with_members(&[1]);
    created(&mut state, &create("a", 9));
    created(&mut state, &create("b", 9));
    state.apply(&member(2)).unwrap();
    state.apply(&member(3)).unwrap();
    state
}

#[test]
fn eighteen_partitions_on_one_member_end_six_six_six() {
    let mut state = all_on_one();
    assert_eq!(load(&state), BTreeMap::from([(NodeId(1), 18)]));
    let full = plan_rebalance(&state, 100);
    assert_eq!(full.len(), 12);
    assert!(full.iter().all(|order| order.from == NodeId(1)));
    let to = |node: u32| full.iter().filter(|order| order.to == NodeId(node)).count();
    assert_eq!((to(2), to(3)), (6, 6));
    // The donor gives from the topic it holds most of: a, b, a, b, ...
    let topics: Vec<&str> = full.iter().map(|order| order.topic.as_str()).collect();
    assert_eq!(&topics[..4], ["a", "b", "a", "b"]);
    // The budget cuts the same plan short.
    let capped = plan_rebalance(&state, 8);
    assert_eq!(capped, full[..8]);
    assert_eq!(rebalance(&mut state, 8), 2);
    assert_eq!(
        load(&state),
        BTreeMap::from([(NodeId(1), 6), (NodeId(2), 6), (NodeId(3), 6)])
    );
    let on_one = |topic: &str| {
        state
            .topic(topic)
            .unwrap()
            .owners
            .iter()
            .filter(|owner| **owner == Some(NodeId(1)))
            .count()
    };
    assert_eq!((on_one("a"), on_one("b")), (3, 3));
    assert_fair(&state);
}

#[test]
fn a_draining_members_partitions_all_leave_it() {
    let mut state = state_with_members(&[1, 2, 3]);
    created(&mut state, &create("a", 9));
    created(&mut state, &create("b", 5));
    let owned = load(&state)[&NodeId(2)];
    state
        .apply(&Command::SetDraining {
            node: NodeId(2),
            draining: true,
        })
        .unwrap();
    let orders = plan_rebalance(&state, 2);
    assert_eq!(orders.len(), 2);
    assert!(orders.iter().all(|order| order.from == NodeId(2)));
    let orders = plan_rebalance(&state, 100);
    assert!(orders.len() >= owned);
    assert!(orders[..owned].iter().all(|order| order.from == NodeId(2)));
    assert!(orders.iter().all(|order| order.to != NodeId(2)));
    rebalance(&mut state, 3);
    assert_eq!(load(&state).get(&NodeId(2)), None);
    assert_fair(&state);
    assert_eq!(decommission_blockers(&state, NodeId(2)), vec![]);
}

#[test]
fn a_departed_members_partitions_all_leave_it() {
    let mut state = state_with_members(&[1, 2, 3]);
    created(&mut state, &create("a", 12));
    state
        .apply(&Command::RemoveMember { node: NodeId(3) })
        .unwrap();
    let orders = plan_rebalance(&state, 100);
    assert_eq!(orders.len(), 4);
    assert!(orders.iter().all(|order| order.from == NodeId(3)));
    apply_in_full(&mut state, &orders);
    assert_eq!(
        load(&state),
        BTreeMap::from([(NodeId(1), 6), (NodeId(2), 6)])
    );
}

#[test]
fn a_new_member_gets_its_fair_share() {
    let mut state = state_with_members(&[1, 2, 3]);
    created(&mut state, &create("a", 6));
    created(&mut state, &create("b", 12));
    state.apply(&member(4)).unwrap();
    assert_eq!(load(&state).get(&NodeId(4)), None);
    rebalance(&mut state, 3);
    assert_fair(&state);
    let load = load(&state);
    assert!(load[&NodeId(4)] >= 4, "{load:?}");
    assert_eq!(load.values().filter(|count| **count == 5).count(), 2);
}

#[test]
fn partitions_of_dead_owners_are_not_planned() {
    let mut state = state_with_members(&[1, 2, 3]);
    let topic = created(&mut state, &create("a", 12));
    // Member 1 takes two of member 2's partitions: 6, 2, 4.
    for index in [0, 3] {
        state
            .apply(&Command::AssignPartition {
                topic: "a".to_string(),
                topic_id: topic.id,
                partition: PartitionId(index),
                owner: NodeId(1),
            })
            .unwrap();
    }
    for command in [
        Command::SetMemberAlive {
            node: NodeId(3),
            alive: false,
        },
        Command::SetDraining {
            node: NodeId(3),
            draining: true,
        },
    ] {
        state.apply(&command).unwrap();
    }
    assert_eq!(dead_owned(&state), 4);
    let orders = plan_rebalance(&state, 100);
    assert_eq!(orders.len(), 2);
    assert!(orders
        .iter()
        .all(|order| (order.from, order.to) == (NodeId(1), NodeId(2))));
    apply_in_full(&mut state, &orders);
    assert_eq!(
        load(&state),
        BTreeMap::from([(NodeId(1), 4), (NodeId(2), 4), (NodeId(3), 4)])
    );
    assert_eq!(plan_rebalance(&state, 100), vec![]);
    assert_eq!(
        decommission_blockers(&state, NodeId(3)),
        vec![DecommissionBlocker::OwnerDead]
    );
}

#[test]
fn moves_in_flight_are_counted_at_their_target_and_never_planned_again() {
    let mut state = all_on_one();
    let first = plan_rebalance(&state, 5);
    assert_eq!(first.len(), 5);
    plan_all(&mut state, &first);
    // The budget is spent by the moves in flight.
    assert_eq!(plan_rebalance(&state, 5), vec![]);
    assert_eq!(plan_rebalance(&state, 4), vec![]);
    let rest = plan_rebalance(&state, 100);
    assert_eq!(rest.len(), 7, "12 in all, 5 in flight");
    assert_eq!(plan_rebalance(&state, 7), rest[..2]);
    for order in &rest {
        assert!(state.move_of(&order.topic, order.partition).is_none());
    }
    plan_all(&mut state, &rest);
    assert_eq!(plan_rebalance(&state, 100), vec![]);
    for order in first.iter().chain(&rest) {
        complete(&mut state, &order.topic, order.partition);
    }
    assert_fair(&state);
}

#[test]
fn plans_are_deterministic() {
    let mut planned = 0;
    for seed in 0..seed_count() {
        let state = random_state(&mut ChaCha8Rng::seed_from_u64(seed));
        let plan = plan_rebalance(&state, 10);
        planned += usize::from(!plan.is_empty());
        assert_eq!(plan_rebalance(&state.clone(), 10), plan, "seed {seed}");
        let decoded = MetaState::decode_snapshot(&state.encode_snapshot()).unwrap();
        assert_eq!(plan_rebalance(&decoded, 10), plan, "seed {seed}");
        let rebuilt = random_state(&mut ChaCha8Rng::seed_from_u64(seed));
        assert_eq!(plan_rebalance(&rebuilt, 10), plan, "seed {seed}");
    }
    assert!(planned > 0);
}

#[test]
fn no_receiver_no_plan() {
    let mut state = state_with_members(&[1, 2]);
    created(&mut state, &create("a", 6));
    for node in [1, 2] {
        state
            .apply(&Command::SetDraining {
                node: NodeId(node),
                draining: true,
            })
            .unwrap();
    }
    assert_eq!(plan_rebalance(&state, 100), vec![]);
}

#[test]
fn decommission_is_blocked_without_receivers_or_with_a_dead_owner() {
    let mut state = state_with_members(&[1]);
    created(&mut state, &create("a", 3));
    assert_eq!(
        decommission_blockers(&state, NodeId(1)),
        vec![DecommissionBlocker::NoReceivers]
    );
    state.apply(&member(2)).unwrap();
    assert_eq!(decommission_blockers(&state, NodeId(1)), vec![]);
    // Member 2 owns nothing: nothing needs a receiver.
    assert_eq!(decommission_blockers(&state, NodeId(2)), vec![]);
    for command in [
        Command::SetDraining {
            node: NodeId(2),
            draining: true,
        },
        Command::SetMemberAlive {
            node: NodeId(1),
            alive: false,
        },
    ] {
        state.apply(&command).unwrap();
    }
    let blockers = decommission_blockers(&state, NodeId(1));
    assert_eq!(
        blockers,
        vec![
            DecommissionBlocker::NoReceivers,
            DecommissionBlocker::OwnerDead
        ]
    );
    let codes: Vec<&str> = blockers.iter().map(DecommissionBlocker::code).collect();
    assert_eq!(codes, ["no_receivers", "owner_dead"]);
    state
        .apply(&Command::SetDraining {
            node: NodeId(2),
            draining: false,
        })
        .unwrap();
    state
        .apply(&Command::SetMemberAlive {
            node: NodeId(2),
            alive: false,
        })
        .unwrap();
    // A dead member is no receiver either.
    assert_eq!(
        decommission_blockers(&state, NodeId(1)),
        vec![
            DecommissionBlocker::NoReceivers,
            DecommissionBlocker::OwnerDead
        ]
    );
    assert_eq!(dead_owned(&state), 3);
}

/// A small random state: 1–6 members, 1–4 topics, owners skewed at random, members marked dead,
/// draining or removed (their partitions then owned by a non-member).
fn random_state(rng: &mut ChaCha8Rng) -> MetaState {
    let nodes: u32 = rng.random_range(1..=6);
    let mut state = state_with_members(&(1..=nodes).collect::<Vec<_>>());
    for index in 0..rng.random_range(1..=4) {
        let topic = created(
            &mut state,
            &create(&format!("t{index}"), rng.random_range(3..=12)),
        );
        let skew = rng
            .random_bool(0.3)
            .then(|| NodeId(rng.random_range(1..=nodes)));
        for partition in 0..topic.partitions() {
            let owner = match skew {
                Some(owner) => owner,
                None if rng.random_bool(0.5) => NodeId(rng.random_range(1..=nodes)),
                None => continue,
            };
            state
                .apply(&Command::AssignPartition {
                    topic: topic.name.clone(),
                    topic_id: topic.id,
                    partition: PartitionId(partition),
                    owner,
                })
                .unwrap();
        }
    }
    for node in (1..=nodes).map(NodeId) {
        if rng.random_bool(0.15) {
            state
                .apply(&Command::SetMemberAlive { node, alive: false })
                .unwrap();
        }
        if rng.random_bool(0.2) {
            state
                .apply(&Command::SetDraining {
                    node,
                    draining: true,
                })
                .unwrap();
        }
        if rng.random_bool(0.1) {
            state.apply(&Command::RemoveMember { node }).unwrap();
        }
    }
    state
}

/// The partitions owned by members marked dead, by topic and partition.
fn dead_partitions(state: &MetaState) -> BTreeSet<(String, PartitionId)> {
    let mut dead = BTreeSet::new();
    for topic in state.topics.values() {
        for (index, owner) in topic.owners.iter().enumerate() {
            if owner
                .is_some_and(|owner| state.members().contains_key(&owner) && !state.is_alive(owner))
            {
                dead.insert((topic.name.clone(), PartitionId(index as u32)));
            }
        }
    }
    dead
}

#[test]
fn a_full_plan_reaches_fair_shares_over_random_states() {
    for seed in 0..seed_count() * 4 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut state = random_state(&mut rng);
        let dead = dead_partitions(&state);
        let orders = plan_rebalance(&state, usize::MAX);
        let partitions: BTreeSet<(&str, PartitionId)> = orders
            .iter()
            .map(|order| (order.topic.as_str(), order.partition))
            .collect();
        assert_eq!(
            partitions.len(),
            orders.len(),
            "seed {seed}: a partition planned twice"
        );
        if receivers(&state).is_empty() {
            assert_eq!(orders, vec![], "seed {seed}");
            continue;
        }
        apply_in_full(&mut state, &orders);
        assert_fair(&state);
        assert_eq!(plan_rebalance(&state, usize::MAX), vec![], "seed {seed}");
        assert_eq!(
            dead_partitions(&state),
            dead,
            "seed {seed}: a dead owner's partition moved"
        );
    }
}

#[test]
fn budgeted_plans_with_moves_in_flight_converge_over_random_states() {
    for seed in 0..seed_count() * 4 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut state = random_state(&mut rng);
        let dead = dead_partitions(&state);
        for round in 0.. {
            assert!(round < 10_000, "seed {seed}: no convergence");
            let budget: u32 = rng.random_range(1..=6);
            let orders = plan_rebalance(&state, budget as usize);
            assert!(orders.len() <= (budget as usize).saturating_sub(state.moves().len()));
            // Every order is accepted under the budget it was planned with.
            for order in &orders {
                let command = Command::PlanMove {
                    order: order.clone(),
                    max_in_flight: budget,
                };
                assert!(
                    matches!(state.apply(&command), Ok(Applied::MovePlanned { .. })),
                    "seed {seed}: {order:?} refused"
                );
            }
            if orders.is_empty() && state.moves().is_empty() {
                break;
            }
            let in_flight: Vec<(String, PartitionId)> = state.moves().keys().cloned().collect();
            for (topic, partition) in in_flight {
                if rng.random_bool(0.05) {
                    state
                        .apply(&Command::AbortMove {
                            topic,
                            partition,
                            to: None,
                            move_id: None,
                        })
                        .unwrap();
                } else if rng.random_bool(0.5) {
                    complete(&mut state, &topic, partition);
                }
            }
        }
        assert_fair(&state);
        assert_eq!(dead_partitions(&state), dead, "seed {seed}");
    }
}
