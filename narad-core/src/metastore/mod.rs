//! The replicated metadata state machine: topics and incarnations, assignments, members. [`replica`]
//! replicates it with raft as a sans-IO actor.
//!
//! # Contract
//! [`MetaState::apply`] is a pure, deterministic function of the state and one [`Command`]: every
//! replica that applies the same log reaches the same state and the same [`Applied`] / [`TopicError`]
//! answers. Nothing in it reads a clock or draws randomness; values that need either (a topic's
//! `created_at_s`) travel inside the command, filled in by the proposer.
//!
//! Commands are checked again when applied, whatever the proposer checked: a proposal raced by another
//! (two creates of one name) is refused deterministically by whichever applies second.
//!
//! # Incarnations
//! Every create takes the next [`TopicId`] from a counter in the state (starting at 1), so a topic
//! deleted and created again under the same name gets a new id, and an id is never reused. Every applied
//! command that changes a topic stamps it with the state's [`MetaState::version`] (one more per applied
//! command, refused ones included), so a topic's `metadata_version` only grows, across recreations too.
//!
//! # Assignments
//! A partition's owner is picked at create (and at a partition increase) round-robin over the members in
//! id order (those alive and not draining; those alive when every one of them is draining; every member
//! when none is alive), starting at member `id mod members`. A partition created while there are no
//! members stays unassigned (`None`) until a member is added, which assigns every unassigned partition
//! by the same rule over the members not draining (every member when all are draining).
//!
//! An assigned partition changes owner only by a command that names it: [`Command::AssignPartition`]
//! (an operator's decision, which ends a move of that partition in flight) or the switch that ends a
//! move ([`moves`]). Adding or removing a member moves nothing by itself: [`plan_rebalance`] computes the
//! moves that even the load out, and its orders are proposed as [`Command::PlanMove`].
//!
//! # Encoding
//! Commands and snapshots are postcard (serde) behind one format byte ([`COMMAND_FORMAT_2`],
//! [`SNAPSHOT_FORMAT_5`]). Postcard encodes enum variants by index and struct fields by position: new
//! variants go at the end, and a field change needs a new format byte. Every earlier format byte is still
//! decoded, through private structs of its layout (`formats`), into today's types: a raft log or snapshot
//! written by an earlier release replays. Decoding is total: bad bytes are an [`EncodingError`], never a
//! panic.
//!
//! The move and draining commands ([`Command::PlanMove`] to [`Command::SetDraining`]) were appended at
//! the end of [`Command`] under [`COMMAND_FORMAT_2`]: an appended variant takes the next index and
//! leaves every earlier variant's bytes as they were, so a log written before them decodes unchanged.
//! The same holds for the variants appended to [`Applied`] and [`TopicError`]. The snapshot's new fields
//! (moves, draining members, placements) change its layout: [`SNAPSHOT_FORMAT_5`].

mod formats;
pub mod liveness;
pub mod moves;
pub mod plan;
pub mod replica;
mod topic;
pub mod users;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ids::{NodeId, Offset, PartitionId, TopicId};

pub use moves::{Move, MoveOrder, MoveState};
pub use plan::{dead_owned, decommission_blockers, plan_rebalance, DecommissionBlocker};
pub use topic::{
    check_retention_bytes, normalize_retention_ms, validate_topic_name, AlterTopic, CreateTopic,
    Topic, TopicError, TopicSettings, ACKED_AHEAD_PER_PARTITION_DEFAULT,
    IN_FLIGHT_PER_PARTITION_DEFAULT, PARTITIONS_DEFAULT, PARTITIONS_MAX, PARTITIONS_MIN,
    RETENTION_BYTES_MIN, RETENTION_MS_DEFAULT, RETENTION_MS_FLOOR, RETENTION_MS_MIN_DEFAULT,
    SCHEMA_BYTES_MAX, TOPICS_MAX, TOPIC_NAME_BYTES_MAX, VISIBILITY_TIMEOUT_MS_DEFAULT,
};

/// A create of `name` with `partitions` (0: the default) and every setting at its default, for tests.
#[cfg(test)]
pub(crate) fn create_command(name: &str, partitions: u32) -> Command {
    Command::CreateTopic(CreateTopic {
        name: name.to_string(),
        partitions,
        settings: TopicSettings {
            retention_ms: 0,
            retention_bytes: 0,
            visibility_timeout_ms: 0,
            max_in_flight_per_partition: 0,
            max_acked_ahead_per_partition: 0,
        },
        schema: None,
        owner: String::new(),
        created_at_s: 1_700_000_000,
    })
}

/// Format byte of a [`Command`] from before `retention_bytes` (still read).
pub const COMMAND_FORMAT_1: u8 = 1;
/// Format byte of an encoded [`Command`]: format 1 plus `retention_bytes` in a create's settings and
/// in a PATCH (after `retention_ms` in both). The move and draining commands, appended at the end of
/// the enum later, did not change it: earlier variants encode as before.
pub const COMMAND_FORMAT_2: u8 = 2;
/// Format byte of a [`MetaState`] snapshot from before member liveness (still read).
pub const SNAPSHOT_FORMAT_1: u8 = 1;
/// Format byte of a [`MetaState`] snapshot from before users (still read): format 1 plus the members
/// marked dead.
pub const SNAPSHOT_FORMAT_2: u8 = 2;
/// Format byte of a [`MetaState`] snapshot from before `retention_bytes` (still read): format 2 plus
/// the users.
pub const SNAPSHOT_FORMAT_3: u8 = 3;
/// Format byte of a [`MetaState`] snapshot from before partition moves (still read): format 3 plus each
/// topic's `retention_bytes` (after `retention_ms`).
pub const SNAPSHOT_FORMAT_4: u8 = 4;
/// Format byte of an encoded [`MetaState`] snapshot: format 4 plus, at the end, the moves in flight,
/// the members draining and the placement epochs.
pub const SNAPSHOT_FORMAT_5: u8 = 5;
/// Most members the state holds.
pub const MEMBERS_MAX: usize = 1024;
/// Longest member address, in bytes.
pub const MEMBER_ADDR_BYTES_MAX: usize = 255;

/// Voters of the metastore: the first members by id.
pub const VOTERS_MAX: usize = 3;

/// The raft configuration of a cluster of `members` at bootstrap: the first [`VOTERS_MAX`] by id are
/// voters, the others learners (they get the log but neither vote nor count towards a quorum). Every
/// member computes it from the same list, so all agree.
pub fn voters_and_learners(
    members: impl IntoIterator<Item = NodeId>,
) -> (Vec<NodeId>, Vec<NodeId>) {
    let members: BTreeSet<NodeId> = members.into_iter().collect();
    let mut members: Vec<NodeId> = members.into_iter().collect();
    let learners = members.split_off(members.len().min(VOTERS_MAX));
    (members, learners)
}

/// Why bytes did not decode as a command or snapshot.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodingError {
    /// Empty input, or a format byte this release does not read.
    #[error("unknown metastore format byte {0:?}")]
    UnknownFormat(Option<u8>),
    /// The body did not decode (truncated, trailing bytes, bad values).
    #[error("malformed metastore encoding: {0}")]
    Malformed(String),
}

/// One entry of the replicated log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Create a topic incarnation.
    CreateTopic(CreateTopic),
    /// Change a topic's settings, partition count or schema.
    AlterTopic(AlterTopic),
    /// Delete a topic (by name).
    DeleteTopic {
        /// Topic name.
        name: String,
    },
    /// Move one partition to another owner.
    AssignPartition {
        /// Topic name.
        topic: String,
        /// The incarnation the assignment was decided for; a recreated topic refuses it.
        topic_id: TopicId,
        /// Partition index.
        partition: PartitionId,
        /// New owner (must be a member).
        owner: NodeId,
    },
    /// Add (or re-address) a cluster member.
    AddMember {
        /// Member id.
        node: NodeId,
        /// Its cluster address.
        addr: String,
    },
    /// Remove a cluster member (its partitions keep their owner until reassigned).
    RemoveMember {
        /// Member id.
        node: NodeId,
    },
    /// Mark a member dead (its heartbeats stopped) or alive again: the leader's liveness decision,
    /// through the log so every replica agrees. A dead member keeps its partitions.
    SetMemberAlive {
        /// Member id.
        node: NodeId,
        /// Alive (`true`) or dead.
        alive: bool,
    },
    /// Create a user (or seed the root user).
    CreateUser(users::CreateUser),
    /// Delete a user (never root).
    DeleteUser {
        /// Its name.
        username: String,
    },
    /// Replace a user's whole grant set (never root's).
    SetGrants {
        /// Its name.
        username: String,
        /// The new grants.
        grants: Vec<users::Grant>,
        /// When, Unix ms (from the proposer).
        at_ms: u64,
    },
    /// Replace a user's password hash.
    SetPassword {
        /// Its name.
        username: String,
        /// The new hash, computed by the proposer.
        password_hash: String,
        /// When, Unix ms (from the proposer).
        at_ms: u64,
    },
    /// Record a partition move in flight, in state [`MoveState::Copying`], planned at this apply's
    /// version. Refused, in this order: no such incarnation ([`TopicError::NotFound`]), partition out
    /// of range, `from` not the owner ([`TopicError::MoveNotOwner`]), a move of the partition in flight
    /// ([`TopicError::MoveInProgress`]), `to` not a member ([`TopicError::UnknownMember`]), `to` the
    /// source, marked dead or draining ([`TopicError::MoveTargetUnavailable`]), `max_in_flight` moves
    /// in flight already ([`TopicError::TooManyMoves`]).
    PlanMove {
        /// The move.
        order: MoveOrder,
        /// The cluster-wide cap of moves in flight (the proposer's setting; checked at apply).
        max_in_flight: u32,
    },
    /// The owner stopped appending to a partition being moved: the move is
    /// [`MoveState::Frozen`] at `final_hw`. Applies to the move of that partition with that
    /// incarnation and target; again with the same watermark it changes nothing.
    MoveFrozen {
        /// Topic name.
        topic: String,
        /// The incarnation the move was planned for.
        topic_id: TopicId,
        /// Partition index.
        partition: PartitionId,
        /// The move's target.
        to: NodeId,
        /// The move's `planned_at` (`None`: whichever move of the partition matches the rest; the
        /// nodes always name it): a freeze decided for one move never freezes a later one of the
        /// same partition, whose source went on committing after the first was aborted.
        move_id: Option<u64>,
        /// The partition's high watermark when it froze.
        final_hw: Offset,
    },
    /// End a frozen move by making its target the owner: a compare-and-swap on the move (incarnation,
    /// source, target, frozen at `final_hw`) and on the partition's owner (`from`). The partition's
    /// placement epoch becomes the move's `planned_at`.
    SwitchOwner {
        /// Topic name.
        topic: String,
        /// The incarnation the move was planned for.
        topic_id: TopicId,
        /// Partition index.
        partition: PartitionId,
        /// The move's source, the owner until the switch.
        from: NodeId,
        /// The move's target, the owner after it.
        to: NodeId,
        /// The move's `planned_at` (`None`: whichever move matches the rest; the nodes always
        /// name it).
        move_id: Option<u64>,
        /// The watermark the move froze at.
        final_hw: Offset,
    },
    /// End a move without a switch (the owner stays).
    AbortMove {
        /// Topic name.
        topic: String,
        /// Partition index.
        partition: PartitionId,
        /// Only a move to this target, when given.
        to: Option<NodeId>,
        /// Only the move of this `planned_at`, when given.
        move_id: Option<u64>,
    },
    /// Mark a member draining (it gets no new partition and takes no move; the planner moves its
    /// partitions away) or not.
    SetDraining {
        /// Member id.
        node: NodeId,
        /// Draining or not.
        draining: bool,
    },
}

impl Command {
    /// Encodes the command behind [`COMMAND_FORMAT_2`].
    pub fn encode(&self) -> Vec<u8> {
        encode_with_format(COMMAND_FORMAT_2, self)
    }

    /// Decodes a command written by [`Command::encode`], or by a release before `retention_bytes`
    /// (a create or PATCH of then gets `retention_bytes` 0 / none).
    pub fn decode(bytes: &[u8]) -> Result<Command, EncodingError> {
        match bytes.first() {
            Some(&COMMAND_FORMAT_1) => formats::decode_command_format_1(bytes),
            _ => decode_with_format(COMMAND_FORMAT_2, bytes),
        }
    }
}

/// What an applied command changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Applied {
    /// The created topic, as stored.
    TopicCreated(Topic),
    /// The altered topic, as stored.
    TopicAltered(Topic),
    /// The deleted incarnation.
    TopicDeleted(TopicId),
    /// The topic after the assignment.
    PartitionAssigned(Topic),
    /// The member is in the member set.
    MemberAdded(NodeId),
    /// The member was removed (or was not there).
    MemberRemoved(NodeId),
    /// The member's liveness, as now recorded.
    MemberStatus {
        /// Member id.
        node: NodeId,
        /// Alive or dead.
        alive: bool,
    },
    /// The created user, as stored.
    UserCreated(users::User),
    /// The user was deleted.
    UserDeleted(String),
    /// The user after its grants changed.
    GrantsSet(users::User),
    /// The user's password changed.
    PasswordSet(String),
    /// The move, as recorded.
    MovePlanned {
        /// Topic name.
        topic: String,
        /// Partition index.
        partition: PartitionId,
        /// The move in flight.
        planned: Move,
    },
    /// The move after the command.
    MoveUpdated {
        /// Topic name.
        topic: String,
        /// Partition index.
        partition: PartitionId,
        /// The move in flight.
        updated: Move,
    },
    /// The move ended with the switch.
    MoveSwitched {
        /// The topic after the switch.
        topic: Topic,
        /// Partition index.
        partition: PartitionId,
        /// The partition's placement epoch now.
        placement: u64,
    },
    /// The move ended without a switch.
    MoveAborted {
        /// Topic name.
        topic: String,
        /// Partition index.
        partition: PartitionId,
        /// The move as it was.
        aborted: Move,
    },
    /// The member's draining, as now recorded.
    MemberDraining {
        /// Member id.
        node: NodeId,
        /// Draining or not.
        draining: bool,
    },
}

/// A cluster member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its cluster address.
    pub addr: String,
}

/// The whole replicated state: what every replica holds after applying the same log prefix.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaState {
    topics: BTreeMap<String, Topic>,
    members: BTreeMap<NodeId, Member>,
    /// The id the next create takes (ids start at 1; 0 is never an incarnation).
    next_topic_id: u64,
    /// Applied commands so far, refused ones included.
    version: u64,
    /// Members the leader marked dead (a subset of `members`).
    dead: BTreeSet<NodeId>,
    /// Users and their grants.
    users: users::Users,
    /// Partition moves in flight, by topic name and partition.
    moves: BTreeMap<(String, PartitionId), Move>,
    /// Members draining (a subset of `members`).
    draining: BTreeSet<NodeId>,
    /// The placement epoch of every partition whose data lives in a copy made by a move (absent: 0).
    placements: BTreeMap<(TopicId, PartitionId), u64>,
}

impl MetaState {
    /// An empty state: no topics, no members.
    pub fn new() -> Self {
        MetaState {
            next_topic_id: 1,
            ..MetaState::default()
        }
    }

    /// Applies one command. Refusals change nothing but the version.
    pub fn apply(&mut self, command: &Command) -> Result<Applied, TopicError> {
        self.version += 1;
        let result = match command {
            Command::CreateTopic(create) => self.create_topic(create),
            Command::AlterTopic(alter) => self.alter_topic(alter),
            Command::DeleteTopic { name } => self.delete_topic(name),
            Command::AssignPartition {
                topic,
                topic_id,
                partition,
                owner,
            } => self.assign_partition(topic, *topic_id, *partition, *owner),
            Command::AddMember { node, addr } => self.add_member(*node, addr),
            Command::RemoveMember { node } => {
                self.members.remove(node);
                self.dead.remove(node);
                self.forget_member_moves(*node);
                Ok(Applied::MemberRemoved(*node))
            }
            Command::SetMemberAlive { node, alive } => self.set_member_alive(*node, *alive),
            Command::CreateUser(create) => self.users.create(create).map(Applied::UserCreated),
            Command::DeleteUser { username } => self
                .users
                .delete(username)
                .map(|()| Applied::UserDeleted(username.clone())),
            Command::SetGrants {
                username,
                grants,
                at_ms,
            } => self
                .users
                .set_grants(username, grants, *at_ms)
                .map(Applied::GrantsSet),
            Command::SetPassword {
                username,
                password_hash,
                at_ms,
            } => self
                .users
                .set_password(username, password_hash, *at_ms)
                .map(|()| Applied::PasswordSet(username.clone())),
            Command::PlanMove {
                order,
                max_in_flight,
            } => self.plan_move(order, *max_in_flight),
            Command::MoveFrozen {
                topic,
                topic_id,
                partition,
                to,
                move_id,
                final_hw,
            } => self.move_frozen(topic, *topic_id, *partition, (*to, *move_id), *final_hw),
            Command::SwitchOwner {
                topic,
                topic_id,
                partition,
                from,
                to,
                move_id,
                final_hw,
            } => self.switch_owner(
                topic,
                *topic_id,
                *partition,
                (*from, *to, *move_id),
                *final_hw,
            ),
            Command::AbortMove {
                topic,
                partition,
                to,
                move_id,
            } => self.abort_move(topic, *partition, *to, *move_id),
            Command::SetDraining { node, draining } => self.set_draining(*node, *draining),
        };
        self.check_invariants();
        result
    }

    /// The live topic of that name.
    pub fn topic(&self, name: &str) -> Option<&Topic> {
        self.topics.get(name)
    }

    /// Up to `limit` topics with names after `after` (all of them when `after` is empty), in name
    /// order, and whether more follow.
    pub fn topics_after(&self, after: &str, limit: usize) -> (Vec<&Topic>, bool) {
        use std::ops::Bound::{Excluded, Unbounded};
        let lower = if after.is_empty() {
            Unbounded
        } else {
            Excluded(after)
        };
        let mut range = self
            .topics
            .range::<str, _>((lower, Unbounded))
            .map(|(_, topic)| topic);
        let page: Vec<&Topic> = range.by_ref().take(limit).collect();
        let more = range.next().is_some();
        (page, more)
    }

    /// How many live topics there are.
    pub fn topic_count(&self) -> usize {
        self.topics.len()
    }

    /// The members, by id.
    pub fn members(&self) -> &BTreeMap<NodeId, Member> {
        &self.members
    }

    /// Whether `node` is a member the leader has not marked dead.
    pub fn is_alive(&self, node: NodeId) -> bool {
        self.members.contains_key(&node) && !self.dead.contains(&node)
    }

    /// The users.
    pub fn users(&self) -> &users::Users {
        &self.users
    }

    /// How many commands have been applied (refused ones included).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Encodes the whole state behind [`SNAPSHOT_FORMAT_5`].
    pub fn encode_snapshot(&self) -> Vec<u8> {
        encode_with_format(SNAPSHOT_FORMAT_5, self)
    }

    /// Decodes a snapshot written by [`MetaState::encode_snapshot`], or by an earlier release: before
    /// partition moves (no move, no member draining, every partition at its placement from creation),
    /// before `retention_bytes` (every topic unbounded), before users (no user) or before member
    /// liveness (every member alive).
    pub fn decode_snapshot(bytes: &[u8]) -> Result<MetaState, EncodingError> {
        let state: MetaState = match bytes.first() {
            Some(&(SNAPSHOT_FORMAT_1..=SNAPSHOT_FORMAT_4)) => formats::decode_snapshot(bytes)?,
            _ => decode_with_format(SNAPSHOT_FORMAT_5, bytes)?,
        };
        state
            .invariant_violation()
            .map_or(Ok(()), |what| Err(EncodingError::Malformed(what)))?;
        Ok(state)
    }

    fn create_topic(&mut self, create: &CreateTopic) -> Result<Applied, TopicError> {
        let create = create.normalized()?;
        if self.topics.contains_key(&create.name) {
            return Err(TopicError::Exists);
        }
        if self.topics.len() >= TOPICS_MAX {
            return Err(TopicError::TooManyTopics);
        }
        let id = TopicId(self.next_topic_id);
        self.next_topic_id += 1;
        let mut topic = Topic {
            name: create.name.clone(),
            id,
            owners: Vec::new(),
            schema_version: u32::from(create.schema.is_some()),
            schema: create.schema,
            settings: create.settings,
            owner: create.owner,
            created_at_s: create.created_at_s,
            metadata_version: self.version,
        };
        self.grow_partitions(&mut topic, create.partitions);
        self.topics.insert(create.name, topic.clone());
        Ok(Applied::TopicCreated(topic))
    }

    fn alter_topic(&mut self, alter: &AlterTopic) -> Result<Applied, TopicError> {
        let mut topic = self
            .topics
            .get(&alter.name)
            .cloned()
            .ok_or(TopicError::NotFound)?;
        let plan = alter.plan(&topic)?;
        topic.settings = plan.settings;
        self.grow_partitions(&mut topic, plan.partitions);
        if plan.schema.is_some() {
            topic.schema = plan.schema;
            topic.schema_version += 1;
        }
        topic.metadata_version = self.version;
        self.topics.insert(topic.name.clone(), topic.clone());
        Ok(Applied::TopicAltered(topic))
    }

    fn delete_topic(&mut self, name: &str) -> Result<Applied, TopicError> {
        let topic = self.topics.remove(name).ok_or(TopicError::NotFound)?;
        self.forget_topic_moves(&topic);
        Ok(Applied::TopicDeleted(topic.id))
    }

    fn assign_partition(
        &mut self,
        name: &str,
        topic_id: TopicId,
        partition: PartitionId,
        owner: NodeId,
    ) -> Result<Applied, TopicError> {
        if !self.members.contains_key(&owner) {
            return Err(TopicError::UnknownMember(owner));
        }
        let version = self.version;
        let topic = match self.topics.get_mut(name) {
            Some(topic) if topic.id == topic_id => topic,
            _ => return Err(TopicError::NotFound),
        };
        let slot = topic
            .owners
            .get_mut(partition.0 as usize)
            .ok_or(TopicError::PartitionOutOfRange)?;
        *slot = Some(owner);
        topic.metadata_version = version;
        let topic = topic.clone();
        // The owner changed under a move in flight: its copy is of a partition the source no longer
        // owns, and its switch would undo this assignment.
        self.moves.remove(&(name.to_string(), partition));
        Ok(Applied::PartitionAssigned(topic))
    }

    fn set_member_alive(&mut self, node: NodeId, alive: bool) -> Result<Applied, TopicError> {
        if !self.members.contains_key(&node) {
            return Err(TopicError::UnknownMember(node));
        }
        if alive {
            self.dead.remove(&node);
        } else {
            self.dead.insert(node);
        }
        Ok(Applied::MemberStatus { node, alive })
    }

    fn add_member(&mut self, node: NodeId, addr: &str) -> Result<Applied, TopicError> {
        if addr.len() > MEMBER_ADDR_BYTES_MAX
            || (self.members.len() >= MEMBERS_MAX && !self.members.contains_key(&node))
        {
            return Err(TopicError::MemberRefused);
        }
        self.members.insert(
            node,
            Member {
                addr: addr.to_string(),
            },
        );
        let version = self.version;
        let members = self.owner_candidates(false);
        for topic in self.topics.values_mut() {
            if topic.owners.iter().any(Option::is_none) {
                for (index, slot) in topic.owners.iter_mut().enumerate() {
                    if slot.is_none() {
                        *slot = Some(pick_owner(&members, topic.id, index));
                    }
                }
                topic.metadata_version = version;
            }
        }
        Ok(Applied::MemberAdded(node))
    }

    /// Extends `topic.owners` to `partitions`, assigning the new partitions round-robin over the
    /// members alive (over every member when none is): a member marked dead would only have its new
    /// partitions rerouted from the start.
    fn grow_partitions(&self, topic: &mut Topic, partitions: u32) {
        let members = self.owner_candidates(true);
        let from = topic.owners.len();
        for index in from..partitions as usize {
            let owner = (!members.is_empty()).then(|| pick_owner(&members, topic.id, index));
            topic.owners.push(owner);
        }
    }

    /// The members new partitions go to, in id order: those alive when `alive_only` (every member when
    /// none is), without the draining ones unless all of them are draining. A draining member is being
    /// emptied: a partition given to it would only be moved away again.
    fn owner_candidates(&self, alive_only: bool) -> Vec<NodeId> {
        let mut eligible: Vec<NodeId> = self
            .members
            .keys()
            .copied()
            .filter(|node| !alive_only || !self.dead.contains(node))
            .collect();
        if eligible.is_empty() {
            eligible = self.members.keys().copied().collect();
        }
        let settled: Vec<NodeId> = eligible
            .iter()
            .copied()
            .filter(|node| !self.draining.contains(node))
            .collect();
        if settled.is_empty() {
            eligible
        } else {
            settled
        }
    }

    /// What is wrong with the state, if anything. Decoding a snapshot refuses a state that fails this.
    fn invariant_violation(&self) -> Option<String> {
        if self.next_topic_id == 0 {
            return Some("next topic id is 0".to_string());
        }
        for (name, topic) in &self.topics {
            if name != &topic.name {
                return Some(format!("topic {name} is stored under another name"));
            }
            if topic.id.0 == 0 || topic.id.0 >= self.next_topic_id {
                return Some(format!("topic {name} has id {} out of range", topic.id));
            }
            if topic.owners.is_empty() || topic.owners.len() > PARTITIONS_MAX as usize {
                return Some(format!(
                    "topic {name} has {} partitions",
                    topic.owners.len()
                ));
            }
            if topic.metadata_version > self.version {
                return Some(format!("topic {name} is from a future version"));
            }
        }
        if let Some(node) = self
            .dead
            .iter()
            .find(|node| !self.members.contains_key(node))
        {
            return Some(format!("node {node} is marked dead but is not a member"));
        }
        if let Some(what) = self.moves_invariant_violation() {
            return Some(what);
        }
        self.users.invariant_violation()
    }

    fn check_invariants(&self) {
        if let Some(what) = self.invariant_violation() {
            panic!("metastore invariant violated: {what}");
        }
    }
}

/// The round-robin owner of partition `index` of topic `id` over `members` (non-empty, in id order).
fn pick_owner(members: &[NodeId], id: TopicId, index: usize) -> NodeId {
    let count = members.len() as u64;
    let start = id.0 % count;
    members[((start + index as u64) % count) as usize]
}

fn encode_with_format<T: Serialize>(format: u8, value: &T) -> Vec<u8> {
    let mut out = vec![format];
    let body = postcard::to_allocvec(value).expect("postcard encodes every metastore value");
    out.extend_from_slice(&body);
    out
}

fn decode_with_format<T: for<'de> Deserialize<'de>>(
    format: u8,
    bytes: &[u8],
) -> Result<T, EncodingError> {
    match bytes.split_first() {
        Some((&first, body)) if first == format => {
            let (value, rest) = postcard::take_from_bytes(body)
                .map_err(|error| EncodingError::Malformed(error.to_string()))?;
            if rest.is_empty() {
                Ok(value)
            } else {
                Err(EncodingError::Malformed("trailing bytes".to_string()))
            }
        }
        Some((&first, _)) => Err(EncodingError::UnknownFormat(Some(first))),
        None => Err(EncodingError::UnknownFormat(None)),
    }
}

#[cfg(test)]
mod tests;
