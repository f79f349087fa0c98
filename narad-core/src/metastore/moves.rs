//! Partition moves: the replicated record of a partition being copied from its owner to another
//! member, the owner switch that ends it, and members draining.
//!
//! # Lifecycle
//! [`Command::PlanMove`] records a move from the partition's current owner to a member alive and not
//! draining, in state [`MoveState::Copying`]: the target copies the partition while the owner keeps
//! serving it. [`Command::MoveFrozen`] records the final high watermark once the owner stopped
//! appending to the partition ([`MoveState::Frozen`]). [`Command::SwitchOwner`] then makes the target
//! the owner and ends the move; [`Command::AbortMove`] ends it without a switch.
//!
//! The switch is a compare-and-swap: it names the incarnation, the source, the target and the final
//! watermark it was decided on, and applies only if the move in flight and the partition's owner
//! still match all of them. A switch raced by an abort, a reassignment ([`Command::AssignPartition`]
//! removes the move: the owner changed under it), a deletion or a recreation of the topic is refused
//! and changes nothing, so a copy is never made the owner of a partition it was not copied from.
//!
//! # Placements
//! A partition whose data lives in a copy made by a move has a placement epoch: the `planned_at` of
//! the move that made it. Versions are unique and grow, so every copy has an epoch of its own and a
//! later copy a higher one; a partition never moved has epoch 0, its placement from creation. The
//! epoch tells a copy apart from data an earlier placement of the same partition left on a node.
//!
//! # Draining
//! A draining member gets no new partition (at create, at a partition increase, when a member joins)
//! unless every candidate is draining, and takes no move; [`super::plan_rebalance`] moves its
//! partitions away. Removing a member ends its draining and every move from or to it.
//!
//! [`Command::PlanMove`]: super::Command::PlanMove
//! [`Command::MoveFrozen`]: super::Command::MoveFrozen
//! [`Command::SwitchOwner`]: super::Command::SwitchOwner
//! [`Command::AbortMove`]: super::Command::AbortMove
//! [`Command::AssignPartition`]: super::Command::AssignPartition

use serde::{Deserialize, Serialize};

use super::{Applied, MetaState, Topic, TopicError};
use crate::ids::{NodeId, Offset, PartitionId, TopicId};

/// A partition move in flight.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    /// The incarnation of the topic the move was planned for.
    pub topic_id: TopicId,
    /// The partition's owner when the move was planned (and still: a new owner removes the move).
    pub from: NodeId,
    /// The member the partition is copied to.
    pub to: NodeId,
    /// How far the move got.
    pub state: MoveState,
    /// [`MetaState::version`] when the move was planned: the placement epoch of the copy.
    pub planned_at: u64,
    /// The partition's high watermark when the owner froze it; set exactly when [`MoveState::Frozen`].
    pub final_hw: Option<Offset>,
}

/// How far a move got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MoveState {
    /// The target copies the partition; the owner still appends to it.
    Copying,
    /// The owner stopped appending at the move's `final_hw`; the switch may follow.
    Frozen,
}

impl MoveState {
    /// The state's name on the wire: `copying` or `frozen`.
    pub fn as_str(self) -> &'static str {
        match self {
            MoveState::Copying => "copying",
            MoveState::Frozen => "frozen",
        }
    }
}

/// A move to plan: one partition of one incarnation, from its owner to another member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveOrder {
    /// Topic name.
    pub topic: String,
    /// The incarnation the order was decided for; a recreated topic refuses it.
    pub topic_id: TopicId,
    /// Partition index.
    pub partition: PartitionId,
    /// The partition's owner.
    pub from: NodeId,
    /// The member to copy it to.
    pub to: NodeId,
}

impl MetaState {
    /// The moves in flight, by topic name and partition.
    pub fn moves(&self) -> &std::collections::BTreeMap<(String, PartitionId), Move> {
        &self.moves
    }

    /// The move in flight of one partition, if any.
    pub fn move_of(&self, topic: &str, partition: PartitionId) -> Option<&Move> {
        self.moves.get(&(topic.to_string(), partition))
    }

    /// How many moves in flight copy a partition away from `node`.
    pub fn outbound_moves(&self, node: NodeId) -> usize {
        self.moves
            .values()
            .filter(|found| found.from == node)
            .count()
    }

    /// Whether `node` is a member marked draining.
    pub fn is_draining(&self, node: NodeId) -> bool {
        self.draining.contains(&node)
    }

    /// The members marked draining.
    pub fn draining(&self) -> &std::collections::BTreeSet<NodeId> {
        &self.draining
    }

    /// The placement epoch of a partition: the `planned_at` of the move whose copy holds its data, or 0
    /// for the placement from creation (see the module doc's `# Placements`).
    pub fn placement(&self, topic_id: TopicId, partition: PartitionId) -> u64 {
        self.placements
            .get(&(topic_id, partition))
            .copied()
            .unwrap_or(0)
    }

    /// Records a move in flight, after the checks of [`Command::PlanMove`](super::Command::PlanMove) in its documented order.
    pub(super) fn plan_move(
        &mut self,
        order: &MoveOrder,
        max_in_flight: u32,
    ) -> Result<Applied, TopicError> {
        let topic = match self.topics.get(&order.topic) {
            Some(topic) if topic.id == order.topic_id => topic,
            _ => return Err(TopicError::NotFound),
        };
        if order.partition.0 >= topic.partitions() {
            return Err(TopicError::PartitionOutOfRange);
        }
        if topic.owner_of(order.partition) != Some(order.from) {
            return Err(TopicError::MoveNotOwner(order.from));
        }
        let key = (order.topic.clone(), order.partition);
        if self.moves.contains_key(&key) {
            return Err(TopicError::MoveInProgress);
        }
        if !self.members.contains_key(&order.to) {
            return Err(TopicError::UnknownMember(order.to));
        }
        if order.to == order.from
            || self.dead.contains(&order.to)
            || self.draining.contains(&order.to)
        {
            return Err(TopicError::MoveTargetUnavailable(order.to));
        }
        if self.moves.len() >= max_in_flight as usize {
            return Err(TopicError::TooManyMoves { max_in_flight });
        }
        let planned = Move {
            topic_id: order.topic_id,
            from: order.from,
            to: order.to,
            state: MoveState::Copying,
            planned_at: self.version,
            final_hw: None,
        };
        self.moves.insert(key, planned.clone());
        Ok(Applied::MovePlanned {
            topic: order.topic.clone(),
            partition: order.partition,
            planned,
        })
    }

    /// Freezes a move at `final_hw`; again with the same watermark it changes nothing (a retried
    /// proposal), with another it is refused (the first freeze stands).
    pub(super) fn move_frozen(
        &mut self,
        topic: &str,
        topic_id: TopicId,
        partition: PartitionId,
        (to, move_id): (NodeId, Option<u64>),
        final_hw: Offset,
    ) -> Result<Applied, TopicError> {
        let found = match self.moves.get_mut(&(topic.to_string(), partition)) {
            Some(found)
                if found.topic_id == topic_id
                    && found.to == to
                    && move_id.is_none_or(|id| found.planned_at == id)
                    && found.final_hw.is_none_or(|hw| hw == final_hw) =>
            {
                found
            }
            _ => return Err(TopicError::MoveNotFound),
        };
        found.state = MoveState::Frozen;
        found.final_hw = Some(final_hw);
        Ok(Applied::MoveUpdated {
            topic: topic.to_string(),
            partition,
            updated: found.clone(),
        })
    }

    /// The compare-and-swap of [`Command::SwitchOwner`](super::Command::SwitchOwner): every check passes before anything changes.
    pub(super) fn switch_owner(
        &mut self,
        name: &str,
        topic_id: TopicId,
        partition: PartitionId,
        (from, to, move_id): (NodeId, NodeId, Option<u64>),
        final_hw: Offset,
    ) -> Result<Applied, TopicError> {
        let key = (name.to_string(), partition);
        let planned_at = self
            .moves
            .get(&key)
            .filter(|found| {
                found.topic_id == topic_id
                    && found.from == from
                    && found.to == to
                    && move_id.is_none_or(|id| found.planned_at == id)
                    && found.state == MoveState::Frozen
                    && found.final_hw == Some(final_hw)
            })
            .map(|found| found.planned_at)
            .ok_or(TopicError::MoveNotFound)?;
        let version = self.version;
        let topic = match self.topics.get_mut(name) {
            Some(topic) if topic.id == topic_id => topic,
            _ => return Err(TopicError::MoveNotFound),
        };
        // The invariant keeps a move's source the owner; checked again here as the CAS states it.
        let slot = match topic.owners.get_mut(partition.0 as usize) {
            Some(slot) if *slot == Some(from) => slot,
            _ => return Err(TopicError::MoveNotFound),
        };
        *slot = Some(to);
        topic.metadata_version = version;
        let topic = topic.clone();
        self.placements.insert((topic_id, partition), planned_at);
        self.moves.remove(&key);
        Ok(Applied::MoveSwitched {
            topic,
            partition,
            placement: planned_at,
        })
    }

    /// Ends a move without a switch; with `to`, only a move to that target (an abort decided for one
    /// move does not end a later one of the same partition).
    pub(super) fn abort_move(
        &mut self,
        topic: &str,
        partition: PartitionId,
        to: Option<NodeId>,
        move_id: Option<u64>,
    ) -> Result<Applied, TopicError> {
        let key = (topic.to_string(), partition);
        match self.moves.get(&key) {
            Some(found)
                if to.is_none_or(|to| found.to == to)
                    && move_id.is_none_or(|id| found.planned_at == id) => {}
            _ => return Err(TopicError::MoveNotFound),
        }
        let aborted = self.moves.remove(&key).ok_or(TopicError::MoveNotFound)?;
        Ok(Applied::MoveAborted {
            topic: topic.to_string(),
            partition,
            aborted,
        })
    }

    /// Marks a member draining or not.
    pub(super) fn set_draining(
        &mut self,
        node: NodeId,
        draining: bool,
    ) -> Result<Applied, TopicError> {
        if !self.members.contains_key(&node) {
            return Err(TopicError::UnknownMember(node));
        }
        if draining {
            self.draining.insert(node);
        } else {
            self.draining.remove(&node);
        }
        Ok(Applied::MemberDraining { node, draining })
    }

    /// Forgets the moves and placements of a deleted incarnation.
    pub(super) fn forget_topic_moves(&mut self, topic: &Topic) {
        let first = PartitionId(0);
        let last = PartitionId(u32::MAX);
        let moves: Vec<(String, PartitionId)> = self
            .moves
            .range((topic.name.clone(), first)..=(topic.name.clone(), last))
            .map(|(key, _)| key.clone())
            .collect();
        for key in moves {
            self.moves.remove(&key);
        }
        let placements: Vec<(TopicId, PartitionId)> = self
            .placements
            .range((topic.id, first)..=(topic.id, last))
            .map(|(key, _)| *key)
            .collect();
        for key in placements {
            self.placements.remove(&key);
        }
    }

    /// Ends every move from or to a node that left the member set, and its draining.
    pub(super) fn forget_member_moves(&mut self, node: NodeId) {
        self.moves
            .retain(|_, found| found.from != node && found.to != node);
        self.draining.remove(&node);
    }

    /// What is wrong with the moves, the draining set or the placements, if anything.
    pub(super) fn moves_invariant_violation(&self) -> Option<String> {
        for ((name, partition), found) in &self.moves {
            let what = format!("move of {name}/{partition}");
            let Some(topic) = self
                .topics
                .get(name)
                .filter(|topic| topic.id == found.topic_id)
            else {
                return Some(format!("{what} names no live incarnation"));
            };
            if partition.0 >= topic.partitions() {
                return Some(format!("{what} is out of range"));
            }
            if topic.owner_of(*partition) != Some(found.from) {
                return Some(format!("{what} is not from the partition's owner"));
            }
            if found.to == found.from || !self.members.contains_key(&found.to) {
                return Some(format!("{what} targets {}, not another member", found.to));
            }
            if (found.state == MoveState::Frozen) != found.final_hw.is_some() {
                return Some(format!(
                    "{what} is {} with final watermark {:?}",
                    found.state.as_str(),
                    found.final_hw
                ));
            }
            if found.planned_at == 0 || found.planned_at > self.version {
                return Some(format!(
                    "{what} was planned at version {}",
                    found.planned_at
                ));
            }
        }
        if let Some(node) = self
            .draining
            .iter()
            .find(|node| !self.members.contains_key(node))
        {
            return Some(format!("node {node} is draining but is not a member"));
        }
        self.placements_invariant_violation()
    }

    fn placements_invariant_violation(&self) -> Option<String> {
        if self.placements.is_empty() {
            return None;
        }
        let partitions: std::collections::BTreeMap<TopicId, u32> = self
            .topics
            .values()
            .map(|topic| (topic.id, topic.partitions()))
            .collect();
        for ((id, partition), epoch) in &self.placements {
            if partitions.get(id).is_none_or(|count| partition.0 >= *count) {
                return Some(format!(
                    "placement of topic id {id} partition {partition} names no live partition"
                ));
            }
            if *epoch == 0 || *epoch > self.version {
                return Some(format!(
                    "placement of topic id {id} partition {partition} has epoch {epoch}"
                ));
            }
        }
        None
    }
}
