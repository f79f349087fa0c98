//! The rebalance planner: which partitions to move so the load is even over the members that can take
//! partitions. A pure function of the state, like [`MetaState::apply`]: every replica that plans from
//! the same state gets the same orders, and nothing in it reads a clock or draws randomness.
//!
//! # Receivers and fair shares
//! The receivers are the members alive and not draining, in id order. A partition counts where it will
//! be: at the target of its move in flight, else at its owner. Partitions owned by a draining member or
//! by a node no longer a member must move; partitions owned by a member marked dead are not planned (a
//! dead source cannot be copied from: they wait for the member to come back or for an operator's
//! assignment) and are reported by [`dead_owned`]. Moves in flight are never planned again.
//!
//! With `T` the partitions the receivers will hold once every order of the plan is applied (those they
//! hold, with their inbound moves, plus those that must move) and `R` the receivers, each receiver's
//! fair share is `⌊T/R⌋` or `⌈T/R⌉`. The plan moves every partition that must move to the emptiest
//! receiver, then, while the fullest receiver holds two more than the emptiest, one partition from the
//! first to the second. Applied in full, it leaves every receiver within one partition of the others:
//! at `⌊T/R⌋` or `⌈T/R⌉`, exactly `T mod R` of them at `⌈T/R⌉` (unless a receiver's count is made of
//! moves in flight to it, which cannot be planned again: the next plan evens it out).
//!
//! # Order
//! Ties go to the lowest id: the fullest donor is the receiver with the highest count, then the lowest
//! id; the emptiest is the one with the lowest count, then the lowest id. A donor gives a partition of
//! the topic it owns most partitions of (then by topic name and partition index), so a topic's
//! partitions spread over the receivers rather than moving as a block. Partitions that must move go
//! first, in topic name and partition order. The plan stops at the budget: `max_in_flight` less the
//! moves in flight.

use std::collections::{BTreeMap, BTreeSet};

use super::{MetaState, MoveOrder};
use crate::ids::{NodeId, PartitionId, TopicId};

/// Why a member cannot be decommissioned yet (its partitions could not all move away).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecommissionBlocker {
    /// It owns partitions and no other member is alive and not draining to take them.
    NoReceivers,
    /// It is marked dead: its partitions cannot be copied from it.
    OwnerDead,
}

impl DecommissionBlocker {
    /// The blocker's code on the wire: `no_receivers` or `owner_dead`.
    pub fn code(&self) -> &'static str {
        match self {
            DecommissionBlocker::NoReceivers => "no_receivers",
            DecommissionBlocker::OwnerDead => "owner_dead",
        }
    }
}

/// The moves that even the load out (see the module doc), at most `max_in_flight` less the moves in
/// flight. Empty when there is no receiver or no budget.
pub fn plan_rebalance(state: &MetaState, max_in_flight: usize) -> Vec<MoveOrder> {
    let budget = max_in_flight.saturating_sub(state.moves().len());
    let mut ledger = Ledger::new(state);
    let mut orders = Vec::new();
    if budget == 0 || ledger.counts.is_empty() {
        return orders;
    }
    for (topic, topic_id, partition, from) in std::mem::take(&mut ledger.must_move) {
        if orders.len() == budget {
            return orders;
        }
        let Some(to) = ledger.emptiest() else {
            return orders;
        };
        ledger.receive(to);
        orders.push(order(topic, topic_id, partition, from, to));
    }
    while orders.len() < budget {
        let (Some(to), Some(from)) = (ledger.emptiest(), ledger.fullest_donor()) else {
            break;
        };
        // Within one of each other: every receiver is at ⌊T/R⌋ or ⌈T/R⌉.
        if ledger.count(from) < ledger.count(to) + 2 {
            break;
        }
        let Some((topic, topic_id, partition)) = ledger.give(from) else {
            break;
        };
        ledger.receive(to);
        orders.push(order(topic, topic_id, partition, from, to));
    }
    orders
}

fn order(
    topic: &str,
    topic_id: TopicId,
    partition: PartitionId,
    from: NodeId,
    to: NodeId,
) -> MoveOrder {
    MoveOrder {
        topic: topic.to_string(),
        topic_id,
        partition,
        from,
        to,
    }
}

/// What keeps `node` from being decommissioned: [`DecommissionBlocker::NoReceivers`] when it owns
/// partitions and no other member is alive and not draining, [`DecommissionBlocker::OwnerDead`] when
/// it is marked dead. Empty when its partitions can all move away. Whether `node` is a member is the
/// caller's check.
pub fn decommission_blockers(state: &MetaState, node: NodeId) -> Vec<DecommissionBlocker> {
    let mut blockers = Vec::new();
    let owns = state
        .topics
        .values()
        .any(|topic| topic.owners.contains(&Some(node)));
    let receivers = state
        .members()
        .keys()
        .any(|&other| other != node && is_receiver(state, other));
    if owns && !receivers {
        blockers.push(DecommissionBlocker::NoReceivers);
    }
    if is_marked_dead(state, node) {
        blockers.push(DecommissionBlocker::OwnerDead);
    }
    blockers
}

/// How many partitions are owned by members marked dead: the planner leaves them where they are.
pub fn dead_owned(state: &MetaState) -> usize {
    state
        .topics
        .values()
        .flat_map(|topic| topic.owners.iter().flatten())
        .filter(|&&owner| is_marked_dead(state, owner))
        .count()
}

fn is_marked_dead(state: &MetaState, node: NodeId) -> bool {
    state.members().contains_key(&node) && !state.is_alive(node)
}

fn is_receiver(state: &MetaState, node: NodeId) -> bool {
    state.is_alive(node) && !state.is_draining(node)
}

/// A receiver's partitions that may still be planned, by topic name.
type Donatable<'a> = BTreeMap<&'a str, (TopicId, BTreeSet<PartitionId>)>;

/// The planner's running account: where every partition will be once the orders so far apply.
struct Ledger<'a> {
    /// Partitions each receiver will hold.
    counts: BTreeMap<NodeId, usize>,
    /// Each receiver's partitions with no move in flight or planned.
    donatable: BTreeMap<NodeId, Donatable<'a>>,
    /// Partitions owned by a draining member or a non-member, with no move in flight: topic, its
    /// incarnation, partition, owner; in topic name and partition order.
    must_move: Vec<(&'a str, TopicId, PartitionId, NodeId)>,
}

impl<'a> Ledger<'a> {
    fn new(state: &'a MetaState) -> Ledger<'a> {
        let mut counts: BTreeMap<NodeId, usize> = state
            .members()
            .keys()
            .copied()
            .filter(|&node| is_receiver(state, node))
            .map(|node| (node, 0))
            .collect();
        let mut in_flight: BTreeSet<(&str, PartitionId)> = BTreeSet::new();
        for ((topic, partition), found) in state.moves() {
            in_flight.insert((topic.as_str(), *partition));
            // A move in flight counts at its target: the partition will be there.
            if let Some(count) = counts.get_mut(&found.to) {
                *count += 1;
            }
        }
        let mut donatable: BTreeMap<NodeId, Donatable<'a>> = BTreeMap::new();
        let mut must_move = Vec::new();
        for topic in state.topics.values() {
            for (index, owner) in topic.owners.iter().enumerate() {
                let Some(owner) = *owner else { continue };
                let partition = PartitionId(index as u32);
                if in_flight.contains(&(topic.name.as_str(), partition)) {
                    continue;
                }
                if let Some(count) = counts.get_mut(&owner) {
                    *count += 1;
                    donatable
                        .entry(owner)
                        .or_default()
                        .entry(topic.name.as_str())
                        .or_insert_with(|| (topic.id, BTreeSet::new()))
                        .1
                        .insert(partition);
                } else if !is_marked_dead(state, owner) {
                    must_move.push((topic.name.as_str(), topic.id, partition, owner));
                }
            }
        }
        Ledger {
            counts,
            donatable,
            must_move,
        }
    }

    fn count(&self, node: NodeId) -> usize {
        self.counts.get(&node).copied().unwrap_or(0)
    }

    /// One more partition will be at `node`.
    fn receive(&mut self, node: NodeId) {
        *self.counts.entry(node).or_default() += 1;
    }

    /// The receiver with the fewest partitions (the lowest id among equals).
    fn emptiest(&self) -> Option<NodeId> {
        self.counts
            .iter()
            .min_by_key(|(node, count)| (**count, **node))
            .map(|(node, _)| *node)
    }

    /// The receiver with the most partitions (the lowest id among equals) among those with a partition
    /// to give.
    fn fullest_donor(&self) -> Option<NodeId> {
        self.counts
            .iter()
            .filter(|(node, _)| {
                self.donatable
                    .get(node)
                    .is_some_and(|topics| !topics.is_empty())
            })
            .min_by_key(|(node, count)| (std::cmp::Reverse(**count), **node))
            .map(|(node, _)| *node)
    }

    /// Takes one partition from `donor`: of the topic it has most partitions of to give (the first
    /// name among equals), the lowest index.
    fn give(&mut self, donor: NodeId) -> Option<(&'a str, TopicId, PartitionId)> {
        let topics = self.donatable.get_mut(&donor)?;
        let name = topics
            .iter()
            .min_by_key(|(name, (_, partitions))| (std::cmp::Reverse(partitions.len()), **name))
            .map(|(name, _)| *name)?;
        let (topic_id, partitions) = topics.get_mut(name)?;
        let topic_id = *topic_id;
        let partition = partitions.pop_first()?;
        if partitions.is_empty() {
            topics.remove(name);
        }
        if let Some(count) = self.counts.get_mut(&donor) {
            *count = count.saturating_sub(1);
        }
        Some((name, topic_id, partition))
    }
}
