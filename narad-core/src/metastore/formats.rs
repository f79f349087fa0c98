//! The layouts of earlier format bytes, still decoded into today's types (see the module doc's
//! `# Encoding`).
//!
//! Postcard writes struct fields by position, so an older layout is decoded through a private struct
//! that has its fields, then converted: a field the older release did not have gets the value that
//! changes nothing (`retention_bytes` 0: no size bound; no dead member; no user; no move, no member
//! draining and every partition at its placement from creation).

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use super::{
    decode_with_format, users, AlterTopic, Command, CreateTopic, EncodingError, Member, MetaState,
    Topic, TopicSettings, COMMAND_FORMAT_1, SNAPSHOT_FORMAT_1, SNAPSHOT_FORMAT_2,
    SNAPSHOT_FORMAT_3, SNAPSHOT_FORMAT_4,
};
use crate::ids::{NodeId, TopicId};

/// [`TopicSettings`] before `retention_bytes` (command format 1, snapshot formats 1–3).
#[derive(Deserialize)]
struct TopicSettingsFormat1 {
    retention_ms: u64,
    visibility_timeout_ms: u64,
    max_in_flight_per_partition: u32,
    max_acked_ahead_per_partition: u32,
}

impl From<TopicSettingsFormat1> for TopicSettings {
    fn from(old: TopicSettingsFormat1) -> Self {
        TopicSettings {
            retention_ms: old.retention_ms,
            retention_bytes: 0,
            visibility_timeout_ms: old.visibility_timeout_ms,
            max_in_flight_per_partition: old.max_in_flight_per_partition,
            max_acked_ahead_per_partition: old.max_acked_ahead_per_partition,
        }
    }
}

/// [`CreateTopic`] of command format 1.
#[derive(Deserialize)]
struct CreateTopicFormat1 {
    name: String,
    partitions: u32,
    settings: TopicSettingsFormat1,
    schema: Option<String>,
    owner: String,
    created_at_s: u64,
}

/// [`AlterTopic`] of command format 1.
#[derive(Deserialize)]
struct AlterTopicFormat1 {
    name: String,
    partitions: Option<u32>,
    retention_ms: Option<u64>,
    max_in_flight_per_partition: Option<u32>,
    max_acked_ahead_per_partition: Option<u32>,
    schema: Option<String>,
}

/// The two variants of command format 1 whose layout differs from today's, at their indexes (0, 1).
#[derive(Deserialize)]
enum CommandFormat1 {
    CreateTopic(CreateTopicFormat1),
    AlterTopic(AlterTopicFormat1),
}

impl From<CommandFormat1> for Command {
    fn from(old: CommandFormat1) -> Self {
        match old {
            CommandFormat1::CreateTopic(create) => Command::CreateTopic(CreateTopic {
                name: create.name,
                partitions: create.partitions,
                settings: create.settings.into(),
                schema: create.schema,
                owner: create.owner,
                created_at_s: create.created_at_s,
            }),
            CommandFormat1::AlterTopic(alter) => Command::AlterTopic(AlterTopic {
                name: alter.name,
                partitions: alter.partitions,
                retention_ms: alter.retention_ms,
                retention_bytes: None,
                max_in_flight_per_partition: alter.max_in_flight_per_partition,
                max_acked_ahead_per_partition: alter.max_acked_ahead_per_partition,
                schema: alter.schema,
            }),
        }
    }
}

/// Decodes a [`COMMAND_FORMAT_1`] command. Postcard writes the variant index first, as a varint: the
/// indexes 0 (`CreateTopic`) and 1 (`AlterTopic`) are the single bytes 0 and 1 (a longer varint's
/// first byte has its top bit set). Those two go through their old layouts; every other variant's
/// layout is today's.
pub(super) fn decode_command_format_1(bytes: &[u8]) -> Result<Command, EncodingError> {
    match bytes.get(1) {
        Some(0 | 1) => {
            decode_with_format::<CommandFormat1>(COMMAND_FORMAT_1, bytes).map(Command::from)
        }
        _ => decode_with_format(COMMAND_FORMAT_1, bytes),
    }
}

/// [`Topic`] of snapshot formats 1–3.
#[derive(Deserialize)]
struct TopicFormat1 {
    name: String,
    id: TopicId,
    owners: Vec<Option<NodeId>>,
    schema: Option<String>,
    schema_version: u32,
    settings: TopicSettingsFormat1,
    owner: String,
    created_at_s: u64,
    metadata_version: u64,
}

impl From<TopicFormat1> for Topic {
    fn from(old: TopicFormat1) -> Self {
        Topic {
            name: old.name,
            id: old.id,
            owners: old.owners,
            schema: old.schema,
            schema_version: old.schema_version,
            settings: old.settings.into(),
            owner: old.owner,
            created_at_s: old.created_at_s,
            metadata_version: old.metadata_version,
        }
    }
}

/// [`SNAPSHOT_FORMAT_1`]'s state: no liveness.
#[derive(Deserialize)]
struct MetaStateFormat1 {
    topics: BTreeMap<String, TopicFormat1>,
    members: BTreeMap<NodeId, Member>,
    next_topic_id: u64,
    version: u64,
}

/// [`SNAPSHOT_FORMAT_2`]'s state: no users.
#[derive(Deserialize)]
struct MetaStateFormat2 {
    topics: BTreeMap<String, TopicFormat1>,
    members: BTreeMap<NodeId, Member>,
    next_topic_id: u64,
    version: u64,
    dead: BTreeSet<NodeId>,
}

/// [`SNAPSHOT_FORMAT_3`]'s state: topics without `retention_bytes`.
#[derive(Deserialize)]
struct MetaStateFormat3 {
    topics: BTreeMap<String, TopicFormat1>,
    members: BTreeMap<NodeId, Member>,
    next_topic_id: u64,
    version: u64,
    dead: BTreeSet<NodeId>,
    users: users::Users,
}

/// [`SNAPSHOT_FORMAT_4`]'s state: no moves, no draining members, no placements.
#[derive(Deserialize)]
struct MetaStateFormat4 {
    topics: BTreeMap<String, Topic>,
    members: BTreeMap<NodeId, Member>,
    next_topic_id: u64,
    version: u64,
    dead: BTreeSet<NodeId>,
    users: users::Users,
}

fn topics(old: BTreeMap<String, TopicFormat1>) -> BTreeMap<String, Topic> {
    old.into_iter()
        .map(|(name, topic)| (name, topic.into()))
        .collect()
}

/// Decodes a snapshot of format 1, 2, 3 or 4 (the caller checked the byte; any other is refused).
pub(super) fn decode_snapshot(bytes: &[u8]) -> Result<MetaState, EncodingError> {
    let state = match bytes.first() {
        Some(&SNAPSHOT_FORMAT_1) => {
            let old: MetaStateFormat1 = decode_with_format(SNAPSHOT_FORMAT_1, bytes)?;
            MetaState {
                topics: topics(old.topics),
                members: old.members,
                next_topic_id: old.next_topic_id,
                version: old.version,
                ..MetaState::default()
            }
        }
        Some(&SNAPSHOT_FORMAT_2) => {
            let old: MetaStateFormat2 = decode_with_format(SNAPSHOT_FORMAT_2, bytes)?;
            MetaState {
                topics: topics(old.topics),
                members: old.members,
                next_topic_id: old.next_topic_id,
                version: old.version,
                dead: old.dead,
                ..MetaState::default()
            }
        }
        Some(&SNAPSHOT_FORMAT_3) => {
            let old: MetaStateFormat3 = decode_with_format(SNAPSHOT_FORMAT_3, bytes)?;
            MetaState {
                topics: topics(old.topics),
                members: old.members,
                next_topic_id: old.next_topic_id,
                version: old.version,
                dead: old.dead,
                users: old.users,
                ..MetaState::default()
            }
        }
        _ => {
            let old: MetaStateFormat4 = decode_with_format(SNAPSHOT_FORMAT_4, bytes)?;
            MetaState {
                topics: old.topics,
                members: old.members,
                next_topic_id: old.next_topic_id,
                version: old.version,
                dead: old.dead,
                users: old.users,
                ..MetaState::default()
            }
        }
    };
    Ok(state)
}
