//! Earlier format bytes still decode: each test writes the old layout with serialize-only structs of
//! its own (not the decoder's), so a change of today's types that breaks an old layout fails here.

use serde::Serialize;

use super::*;

/// Topic settings as formats before `retention_bytes` wrote them.
#[derive(Serialize)]
struct OldSettings {
    retention_ms: u64,
    visibility_timeout_ms: u64,
    max_in_flight_per_partition: u32,
    max_acked_ahead_per_partition: u32,
}

#[derive(Serialize)]
struct OldCreate {
    name: String,
    partitions: u32,
    settings: OldSettings,
    schema: Option<String>,
    owner: String,
    created_at_s: u64,
}

#[derive(Serialize)]
struct OldAlter {
    name: String,
    partitions: Option<u32>,
    retention_ms: Option<u64>,
    max_in_flight_per_partition: Option<u32>,
    max_acked_ahead_per_partition: Option<u32>,
    schema: Option<String>,
}

/// The first three variants of format 1, at their indexes.
#[derive(Serialize)]
#[allow(clippy::enum_variant_names)] // The names of the variants they stand for.
enum OldCommand {
    CreateTopic(OldCreate),
    AlterTopic(OldAlter),
    DeleteTopic { name: String },
}

fn with_format<T: Serialize>(format: u8, value: &T) -> Vec<u8> {
    let mut bytes = vec![format];
    bytes.extend(postcard::to_allocvec(value).unwrap());
    bytes
}

#[test]
fn format_1_commands_decode_with_no_size_bound() {
    let create = OldCommand::CreateTopic(OldCreate {
        name: "orders".to_string(),
        partitions: 4,
        settings: OldSettings {
            retention_ms: 7_200_000,
            visibility_timeout_ms: 5_000,
            max_in_flight_per_partition: 7,
            max_acked_ahead_per_partition: 9,
        },
        schema: Some("{}".to_string()),
        owner: "alice".to_string(),
        created_at_s: 42,
    });
    assert_eq!(
        Command::decode(&with_format(COMMAND_FORMAT_1, &create)),
        Ok(Command::CreateTopic(CreateTopic {
            name: "orders".to_string(),
            partitions: 4,
            settings: TopicSettings {
                retention_ms: 7_200_000,
                retention_bytes: 0,
                visibility_timeout_ms: 5_000,
                max_in_flight_per_partition: 7,
                max_acked_ahead_per_partition: 9,
            },
            schema: Some("{}".to_string()),
            owner: "alice".to_string(),
            created_at_s: 42,
        }))
    );
    let alter = OldCommand::AlterTopic(OldAlter {
        name: "orders".to_string(),
        partitions: Some(9),
        retention_ms: Some(0),
        max_in_flight_per_partition: None,
        max_acked_ahead_per_partition: Some(3),
        schema: None,
    });
    assert_eq!(
        Command::decode(&with_format(COMMAND_FORMAT_1, &alter)),
        Ok(Command::AlterTopic(AlterTopic {
            name: "orders".to_string(),
            partitions: Some(9),
            retention_ms: Some(0),
            retention_bytes: None,
            max_in_flight_per_partition: None,
            max_acked_ahead_per_partition: Some(3),
            schema: None,
        }))
    );
    let delete = OldCommand::DeleteTopic {
        name: "orders".to_string(),
    };
    assert_eq!(
        Command::decode(&with_format(COMMAND_FORMAT_1, &delete)),
        Ok(Command::DeleteTopic {
            name: "orders".to_string()
        })
    );
}

#[test]
fn format_1_keeps_the_layout_of_every_other_variant() {
    // Variants past the first two are unchanged: today's bytes behind format 1 are format 1's.
    let commands = [
        Command::AssignPartition {
            topic: "orders".to_string(),
            topic_id: TopicId(300),
            partition: PartitionId(2),
            owner: NodeId(3),
        },
        member(4),
        Command::SetMemberAlive {
            node: NodeId(4),
            alive: false,
        },
        Command::DeleteUser {
            username: "bob".to_string(),
        },
    ];
    for command in commands {
        let mut bytes = command.encode();
        assert_eq!(bytes[0], COMMAND_FORMAT_2);
        bytes[0] = COMMAND_FORMAT_1;
        assert_eq!(Command::decode(&bytes), Ok(command));
    }
    // Decoding stays total through the old layouts.
    let delete = with_format(
        COMMAND_FORMAT_1,
        &OldCommand::DeleteTopic { name: "t".into() },
    );
    let alter = with_format(
        COMMAND_FORMAT_1,
        &OldCommand::AlterTopic(OldAlter {
            name: "t".to_string(),
            partitions: None,
            retention_ms: Some(1),
            max_in_flight_per_partition: None,
            max_acked_ahead_per_partition: None,
            schema: None,
        }),
    );
    for bytes in [delete, alter] {
        for cut in 1..bytes.len() {
            assert!(matches!(
                Command::decode(&bytes[..cut]),
                Err(EncodingError::Malformed(_))
            ));
        }
    }
}

/// A topic as snapshot formats 1–3 wrote it.
#[derive(Serialize)]
struct OldTopic {
    name: String,
    id: TopicId,
    owners: Vec<Option<NodeId>>,
    schema: Option<String>,
    schema_version: u32,
    settings: OldSettings,
    owner: String,
    created_at_s: u64,
    metadata_version: u64,
}

fn old_topics(state: &MetaState) -> BTreeMap<String, OldTopic> {
    let (topics, _) = state.topics_after("", usize::MAX);
    topics
        .into_iter()
        .map(|topic| {
            assert_eq!(topic.settings.retention_bytes, 0, "an old format has none");
            let old = OldTopic {
                name: topic.name.clone(),
                id: topic.id,
                owners: topic.owners.clone(),
                schema: topic.schema.clone(),
                schema_version: topic.schema_version,
                settings: OldSettings {
                    retention_ms: topic.settings.retention_ms,
                    visibility_timeout_ms: topic.settings.visibility_timeout_ms,
                    max_in_flight_per_partition: topic.settings.max_in_flight_per_partition,
                    max_acked_ahead_per_partition: topic.settings.max_acked_ahead_per_partition,
                },
                owner: topic.owner.clone(),
                created_at_s: topic.created_at_s,
                metadata_version: topic.metadata_version,
            };
            (topic.name.clone(), old)
        })
        .collect()
}

/// Two members (one marked dead unless `liveness` is off), two topics, and a user unless `users` is
/// off: what a release of that format could hold.
fn old_state(liveness: bool, users: bool) -> MetaState {
    let mut state = state_with_members(&[1, 2]);
    created(&mut state, &create("a", 3));
    created(&mut state, &create("b", 4));
    if liveness {
        state
            .apply(&Command::SetMemberAlive {
                node: NodeId(2),
                alive: false,
            })
            .unwrap();
    }
    if users {
        state.apply(&create_user("bob", false, Vec::new())).unwrap();
    }
    state
}

#[test]
fn a_format_1_snapshot_still_reads_with_every_member_alive() {
    #[derive(Serialize)]
    struct Format1<'a> {
        topics: BTreeMap<String, OldTopic>,
        members: &'a BTreeMap<NodeId, Member>,
        next_topic_id: u64,
        version: u64,
    }
    let state = old_state(false, false);
    let bytes = with_format(
        SNAPSHOT_FORMAT_1,
        &Format1 {
            topics: old_topics(&state),
            members: state.members(),
            next_topic_id: 3,
            version: state.version(),
        },
    );
    assert_eq!(MetaState::decode_snapshot(&bytes).unwrap(), state);
}

#[test]
fn a_format_2_snapshot_still_reads_with_no_users() {
    #[derive(Serialize)]
    struct Format2<'a> {
        topics: BTreeMap<String, OldTopic>,
        members: &'a BTreeMap<NodeId, Member>,
        next_topic_id: u64,
        version: u64,
        dead: BTreeSet<NodeId>,
    }
    let state = old_state(true, false);
    let bytes = with_format(
        SNAPSHOT_FORMAT_2,
        &Format2 {
            topics: old_topics(&state),
            members: state.members(),
            next_topic_id: 3,
            version: state.version(),
            dead: BTreeSet::from([NodeId(2)]),
        },
    );
    let decoded = MetaState::decode_snapshot(&bytes).unwrap();
    assert_eq!(decoded, state);
    assert!(!decoded.is_alive(NodeId(2)));
}

#[test]
fn a_format_3_snapshot_still_reads_with_no_size_bound() {
    #[derive(Serialize)]
    struct Format3<'a> {
        topics: BTreeMap<String, OldTopic>,
        members: &'a BTreeMap<NodeId, Member>,
        next_topic_id: u64,
        version: u64,
        dead: BTreeSet<NodeId>,
        users: &'a users::Users,
    }
    let state = old_state(true, true);
    let bytes = with_format(
        SNAPSHOT_FORMAT_3,
        &Format3 {
            topics: old_topics(&state),
            members: state.members(),
            next_topic_id: 3,
            version: state.version(),
            dead: BTreeSet::from([NodeId(2)]),
            users: state.users(),
        },
    );
    let decoded = MetaState::decode_snapshot(&bytes).unwrap();
    assert_eq!(decoded, state);
    assert!(decoded.users().get("bob").is_some());
    for cut in 1..bytes.len() {
        assert!(matches!(
            MetaState::decode_snapshot(&bytes[..cut]),
            Err(EncodingError::Malformed(_))
        ));
    }
}

#[test]
fn retention_bytes_round_trips_through_commands_and_snapshots() {
    let mut state = state_with_members(&[1]);
    let mut command = create("sized", 3);
    if let Command::CreateTopic(create) = &mut command {
        create.settings.retention_bytes = 10 << 30;
    }
    assert_eq!(Command::decode(&command.encode()), Ok(command.clone()));
    created(&mut state, &command);
    let mut change = alter("sized");
    change.retention_bytes = Some(3 << 20);
    let change = Command::AlterTopic(change);
    assert_eq!(Command::decode(&change.encode()), Ok(change.clone()));
    state.apply(&change).unwrap();
    let bytes = state.encode_snapshot();
    assert_eq!(bytes[0], SNAPSHOT_FORMAT_5);
    let decoded = MetaState::decode_snapshot(&bytes).unwrap();
    assert_eq!(
        decoded.topic("sized").unwrap().settings.retention_bytes,
        3 << 20
    );
    assert_eq!(decoded, state);
    let mut unknown = bytes;
    unknown[0] = 6;
    assert_eq!(
        MetaState::decode_snapshot(&unknown),
        Err(EncodingError::UnknownFormat(Some(6)))
    );
}

/// Topic settings as format 4 wrote them.
#[derive(Serialize)]
struct Settings4 {
    retention_ms: u64,
    retention_bytes: u64,
    visibility_timeout_ms: u64,
    max_in_flight_per_partition: u32,
    max_acked_ahead_per_partition: u32,
}

/// A topic as format 4 wrote it.
#[derive(Serialize)]
struct Topic4 {
    name: String,
    id: TopicId,
    owners: Vec<Option<NodeId>>,
    schema: Option<String>,
    schema_version: u32,
    settings: Settings4,
    owner: String,
    created_at_s: u64,
    metadata_version: u64,
}

fn topics_4(state: &MetaState) -> BTreeMap<String, Topic4> {
    let (topics, _) = state.topics_after("", usize::MAX);
    topics
        .into_iter()
        .map(|topic| {
            let old = Topic4 {
                name: topic.name.clone(),
                id: topic.id,
                owners: topic.owners.clone(),
                schema: topic.schema.clone(),
                schema_version: topic.schema_version,
                settings: Settings4 {
                    retention_ms: topic.settings.retention_ms,
                    retention_bytes: topic.settings.retention_bytes,
                    visibility_timeout_ms: topic.settings.visibility_timeout_ms,
                    max_in_flight_per_partition: topic.settings.max_in_flight_per_partition,
                    max_acked_ahead_per_partition: topic.settings.max_acked_ahead_per_partition,
                },
                owner: topic.owner.clone(),
                created_at_s: topic.created_at_s,
                metadata_version: topic.metadata_version,
            };
            (topic.name.clone(), old)
        })
        .collect()
}

#[test]
fn a_format_4_snapshot_still_reads_with_no_moves_draining_or_placements() {
    #[derive(Serialize)]
    struct Format4<'a> {
        topics: BTreeMap<String, Topic4>,
        members: &'a BTreeMap<NodeId, Member>,
        next_topic_id: u64,
        version: u64,
        dead: BTreeSet<NodeId>,
        users: &'a users::Users,
    }
    let mut state = old_state(true, true);
    let mut command = create("sized", 3);
    if let Command::CreateTopic(create) = &mut command {
        create.settings.retention_bytes = 10 << 30;
    }
    created(&mut state, &command);
    let bytes = with_format(
        SNAPSHOT_FORMAT_4,
        &Format4 {
            topics: topics_4(&state),
            members: state.members(),
            next_topic_id: 4,
            version: state.version(),
            dead: BTreeSet::from([NodeId(2)]),
            users: state.users(),
        },
    );
    let decoded = MetaState::decode_snapshot(&bytes).unwrap();
    assert_eq!(decoded, state);
    assert!(decoded.moves().is_empty() && decoded.draining().is_empty());
    assert_eq!(decoded.placement(TopicId(3), PartitionId(0)), 0);
    assert_eq!(
        decoded.topic("sized").unwrap().settings.retention_bytes,
        10 << 30
    );
    for cut in 1..bytes.len() {
        assert!(matches!(
            MetaState::decode_snapshot(&bytes[..cut]),
            Err(EncodingError::Malformed(_))
        ));
    }
    // Format 4's body behind format 5's byte lacks the new fields: refused, not misread.
    let mut relabelled = bytes;
    relabelled[0] = SNAPSHOT_FORMAT_5;
    assert!(matches!(
        MetaState::decode_snapshot(&relabelled),
        Err(EncodingError::Malformed(_))
    ));
}
