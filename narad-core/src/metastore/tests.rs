use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

mod formats;
mod moves;
mod plan;

fn settings(retention_ms: u64) -> TopicSettings {
    TopicSettings {
        retention_ms,
        retention_bytes: 0,
        visibility_timeout_ms: 0,
        max_in_flight_per_partition: 0,
        max_acked_ahead_per_partition: 0,
    }
}

fn create(name: &str, partitions: u32) -> Command {
    super::create_command(name, partitions)
}

fn alter(name: &str) -> AlterTopic {
    AlterTopic {
        name: name.to_string(),
        ..AlterTopic::default()
    }
}

fn member(node: u32) -> Command {
    Command::AddMember {
        node: NodeId(node),
        addr: format!("127.0.0.1:{}", 7943 + node),
    }
}

fn state_with_members(nodes: &[u32]) -> MetaState {
    let mut state = MetaState::new();
    for &node in nodes {
        state.apply(&member(node)).unwrap();
    }
    state
}

fn created(state: &mut MetaState, command: &Command) -> Topic {
    match state.apply(command) {
        Ok(Applied::TopicCreated(topic)) => topic,
        other => panic!("expected a created topic, got {other:?}"),
    }
}

#[test]
fn create_applies_the_defaults_for_zero_fields() {
    let mut state = state_with_members(&[1]);
    let topic = created(&mut state, &create("orders", 0));
    assert_eq!(
        topic,
        Topic {
            name: "orders".to_string(),
            id: TopicId(1),
            owners: vec![Some(NodeId(1)); 3],
            schema: None,
            schema_version: 0,
            settings: TopicSettings {
                retention_ms: 604_800_000,
                retention_bytes: 0,
                visibility_timeout_ms: 30_000,
                max_in_flight_per_partition: 1024,
                max_acked_ahead_per_partition: 1024,
            },
            owner: String::new(),
            created_at_s: 1_700_000_000,
            metadata_version: 2,
        }
    );
    assert_eq!(state.topic("orders"), Some(&topic));
}

#[test]
fn create_keeps_explicit_values_and_schema() {
    let mut state = state_with_members(&[1]);
    let command = Command::CreateTopic(CreateTopic {
        name: "a.B_c-9".to_string(),
        partitions: 108,
        settings: TopicSettings {
            retention_ms: 3_600_000,
            retention_bytes: 1_048_576,
            visibility_timeout_ms: 5,
            max_in_flight_per_partition: 7,
            max_acked_ahead_per_partition: 9,
        },
        schema: Some("{\"type\":\"object\"}".to_string()),
        owner: "alice".to_string(),
        created_at_s: 42,
    });
    let topic = created(&mut state, &command);
    assert_eq!(topic.partitions(), 108);
    assert_eq!(
        topic.settings,
        TopicSettings {
            retention_ms: 3_600_000,
            retention_bytes: 1_048_576,
            visibility_timeout_ms: 5,
            max_in_flight_per_partition: 7,
            max_acked_ahead_per_partition: 9,
        }
    );
    assert_eq!(topic.schema.as_deref(), Some("{\"type\":\"object\"}"));
    assert_eq!(topic.schema_version, 1);
    assert_eq!(topic.owner, "alice");
    assert_eq!(topic.created_at_s, 42);
}

#[test]
fn create_refuses_an_existing_name() {
    let mut state = state_with_members(&[1]);
    created(&mut state, &create("orders", 3));
    assert_eq!(state.apply(&create("orders", 5)), Err(TopicError::Exists));
    assert_eq!(state.topic("orders").unwrap().partitions(), 3);
}

#[test]
fn topic_names_follow_the_surface_pattern() {
    assert_eq!(validate_topic_name(""), Err(TopicError::NameRequired));
    assert_eq!(validate_topic_name("a b"), Err(TopicError::NameInvalid));
    assert_eq!(validate_topic_name("a/b"), Err(TopicError::NameInvalid));
    assert_eq!(validate_topic_name("é"), Err(TopicError::NameInvalid));
    assert_eq!(
        validate_topic_name(&"a".repeat(256)),
        Err(TopicError::NameInvalid)
    );
    assert_eq!(validate_topic_name("."), Err(TopicError::NameReserved));
    assert_eq!(validate_topic_name(".."), Err(TopicError::NameReserved));
    assert_eq!(validate_topic_name(&"a".repeat(255)), Ok(()));
    assert_eq!(validate_topic_name("..."), Ok(()));
    assert_eq!(validate_topic_name("Orders.v2_eu-1"), Ok(()));
}

#[test]
fn create_partitions_must_be_zero_or_between_3_and_108() {
    let mut state = state_with_members(&[1]);
    for bad in [1, 2, 109, u32::MAX] {
        assert_eq!(
            state.apply(&create("t", bad)),
            Err(TopicError::PartitionsOutOfRange),
            "partitions {bad}"
        );
    }
    assert_eq!(created(&mut state, &create("min", 3)).partitions(), 3);
    assert_eq!(created(&mut state, &create("max", 108)).partitions(), 108);
}

#[test]
fn create_retention_must_be_zero_or_at_least_the_floor() {
    let mut state = state_with_members(&[1]);
    for bad in [1, 99] {
        let mut command = create("t", 0);
        if let Command::CreateTopic(create) = &mut command {
            create.settings.retention_ms = bad;
        }
        assert_eq!(
            state.apply(&command),
            Err(TopicError::RetentionTooShort { min: 100 }),
            "{bad}"
        );
    }
    let mut command = create("t", 0);
    if let Command::CreateTopic(create) = &mut command {
        create.settings.retention_ms = 100;
    }
    assert_eq!(created(&mut state, &command).settings.retention_ms, 100);
}

#[test]
fn a_node_minimum_applies_only_where_the_node_checks() {
    let mut create = CreateTopic {
        name: "t".to_string(),
        partitions: 0,
        settings: settings(3_599_999),
        schema: None,
        owner: String::new(),
        created_at_s: 1,
    };
    assert_eq!(
        create.normalized_with_min_retention(3_600_000),
        Err(TopicError::RetentionTooShort { min: 3_600_000 })
    );
    assert_eq!(
        TopicError::RetentionTooShort { min: 3_600_000 }.to_string(),
        "invalid argument: retention_ms must be 0 (default) or at least 3600000"
    );
    // A node's minimum below the floor does not lower it.
    create.settings.retention_ms = 50;
    assert_eq!(
        create.normalized_with_min_retention(10),
        Err(TopicError::RetentionTooShort { min: 100 })
    );
    create.settings.retention_ms = 1_000;
    assert_eq!(
        create
            .normalized_with_min_retention(1_000)
            .map(|create| create.settings.retention_ms),
        Ok(1_000)
    );
}

#[test]
fn retention_bytes_is_zero_or_at_least_one_mebibyte_and_never_defaulted() {
    let mut state = state_with_members(&[1]);
    for bad in [1, 1_048_575] {
        let mut command = create("t", 0);
        if let Command::CreateTopic(create) = &mut command {
            create.settings.retention_bytes = bad;
        }
        assert_eq!(
            state.apply(&command),
            Err(TopicError::RetentionBytesTooSmall),
            "{bad}"
        );
    }
    assert_eq!(
        created(&mut state, &create("t", 0))
            .settings
            .retention_bytes,
        0
    );
    let mut change = alter("t");
    change.retention_bytes = Some(1_048_575);
    assert_eq!(
        state.apply(&Command::AlterTopic(change)),
        Err(TopicError::RetentionBytesTooSmall)
    );
    let mut change = alter("t");
    change.retention_bytes = Some(10 << 30);
    let Ok(Applied::TopicAltered(topic)) = state.apply(&Command::AlterTopic(change)) else {
        panic!("alter refused");
    };
    assert_eq!(topic.settings.retention_bytes, 10 << 30);
    let mut change = alter("t");
    change.retention_bytes = Some(0);
    let Ok(Applied::TopicAltered(topic)) = state.apply(&Command::AlterTopic(change)) else {
        panic!("alter refused");
    };
    assert_eq!(topic.settings.retention_bytes, 0);
    assert_eq!(
        TopicError::RetentionBytesTooSmall.to_string(),
        "invalid argument: retention_bytes must be 0 (no bound) or at least 1048576"
    );
}

#[test]
fn create_refuses_past_the_topic_limit() {
    let mut state = state_with_members(&[1]);
    for index in 0..TOPICS_MAX {
        let topic = Topic {
            name: format!("t{index}"),
            id: TopicId(state.next_topic_id),
            owners: vec![None; 3],
            schema: None,
            schema_version: 0,
            settings: settings(RETENTION_MS_DEFAULT),
            owner: String::new(),
            created_at_s: 0,
            metadata_version: 0,
        };
        state.next_topic_id += 1;
        state.topics.insert(topic.name.clone(), topic);
    }
    assert_eq!(
        state.apply(&create("one-more", 3)),
        Err(TopicError::TooManyTopics)
    );
}

#[test]
fn a_recreated_topic_gets_a_new_incarnation_id_and_a_higher_version() {
    let mut state = state_with_members(&[1]);
    let first = created(&mut state, &create("orders", 3));
    assert_eq!(
        state.apply(&Command::DeleteTopic {
            name: "orders".to_string()
        }),
        Ok(Applied::TopicDeleted(first.id))
    );
    assert_eq!(state.topic("orders"), None);
    let second = created(&mut state, &create("orders", 3));
    assert_eq!(first.id, TopicId(1));
    assert_eq!(second.id, TopicId(2));
    assert!(second.metadata_version > first.metadata_version);
}

#[test]
fn incarnation_ids_are_never_reused() {
    let mut state = state_with_members(&[1]);
    created(&mut state, &create("a", 3));
    created(&mut state, &create("b", 3));
    state
        .apply(&Command::DeleteTopic {
            name: "b".to_string(),
        })
        .unwrap();
    assert_eq!(created(&mut state, &create("c", 3)).id, TopicId(3));
}

#[test]
fn delete_of_an_unknown_topic_is_not_found() {
    let mut state = MetaState::new();
    assert_eq!(
        state.apply(&Command::DeleteTopic {
            name: "nope".to_string()
        }),
        Err(TopicError::NotFound)
    );
}

#[test]
fn refused_commands_move_only_the_version() {
    let mut state = state_with_members(&[1]);
    created(&mut state, &create("orders", 3));
    let before = state.clone();
    assert_eq!(state.apply(&create("orders", 3)), Err(TopicError::Exists));
    assert_eq!(state.version(), before.version() + 1);
    state.version = before.version;
    assert_eq!(state, before);
}

#[test]
fn partitions_are_assigned_round_robin_from_the_incarnation_id() {
    let mut state = state_with_members(&[3, 1, 2]);
    // Topic id 1 over members [1, 2, 3] starts at member index 1 % 3 = 1.
    let first = created(&mut state, &create("a", 4));
    assert_eq!(
        first.owners,
        vec![
            Some(NodeId(2)),
            Some(NodeId(3)),
            Some(NodeId(1)),
            Some(NodeId(2))
        ]
    );
    let second = created(&mut state, &create("b", 3));
    assert_eq!(
        second.owners,
        vec![Some(NodeId(3)), Some(NodeId(1)), Some(NodeId(2))]
    );
}

#[test]
fn partitions_stay_unassigned_until_a_member_joins() {
    let mut state = MetaState::new();
    let topic = created(&mut state, &create("orders", 3));
    assert_eq!(topic.owners, vec![None; 3]);
    assert_eq!(topic.owner_of(PartitionId(0)), None);
    assert_eq!(state.apply(&member(7)), Ok(Applied::MemberAdded(NodeId(7))));
    let topic = state.topic("orders").unwrap();
    assert_eq!(topic.owners, vec![Some(NodeId(7)); 3]);
    assert_eq!(topic.metadata_version, state.version());
}

#[test]
fn alter_with_no_field_is_refused() {
    let mut state = state_with_members(&[1]);
    created(&mut state, &create("orders", 3));
    assert_eq!(
        state.apply(&Command::AlterTopic(alter("orders"))),
        Err(TopicError::NothingToChange)
    );
}

#[test]
fn alter_of_an_unknown_topic_is_not_found() {
    let mut state = MetaState::new();
    let mut change = alter("nope");
    change.retention_ms = Some(0);
    assert_eq!(
        state.apply(&Command::AlterTopic(change)),
        Err(TopicError::NotFound)
    );
}

#[test]
fn alter_partitions_only_increase_up_to_108() {
    let mut state = state_with_members(&[1]);
    created(&mut state, &create("orders", 5));
    for (requested, error) in [
        (4, TopicError::PartitionsNotIncreased { current: 5 }),
        (5, TopicError::PartitionsNotIncreased { current: 5 }),
        (109, TopicError::PartitionsOutOfRange),
    ] {
        let mut change = alter("orders");
        change.partitions = Some(requested);
        assert_eq!(
            state.apply(&Command::AlterTopic(change)),
            Err(error),
            "{requested}"
        );
    }
    let mut change = alter("orders");
    change.partitions = Some(7);
    match state.apply(&Command::AlterTopic(change)) {
        Ok(Applied::TopicAltered(topic)) => {
            assert_eq!(topic.partitions(), 7);
            assert_eq!(topic.owners, vec![Some(NodeId(1)); 7]);
            assert_eq!(topic.metadata_version, state.version());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn alter_settings_zero_means_default() {
    let mut state = state_with_members(&[1]);
    let mut command = create("orders", 3);
    if let Command::CreateTopic(create) = &mut command {
        create.settings = TopicSettings {
            retention_ms: 7_200_000,
            retention_bytes: 2 << 20,
            visibility_timeout_ms: 1,
            max_in_flight_per_partition: 2,
            max_acked_ahead_per_partition: 3,
        };
    }
    created(&mut state, &command);
    let mut change = alter("orders");
    change.retention_ms = Some(0);
    change.max_in_flight_per_partition = Some(0);
    change.max_acked_ahead_per_partition = Some(0);
    let Ok(Applied::TopicAltered(topic)) = state.apply(&Command::AlterTopic(change)) else {
        panic!("alter refused");
    };
    assert_eq!(
        topic.settings,
        TopicSettings {
            retention_ms: RETENTION_MS_DEFAULT,
            retention_bytes: 2 << 20,
            visibility_timeout_ms: 1,
            max_in_flight_per_partition: 1024,
            max_acked_ahead_per_partition: 1024,
        }
    );
}

#[test]
fn alter_checks_retention_before_partitions_and_applies_nothing_on_refusal() {
    let mut state = state_with_members(&[1]);
    created(&mut state, &create("orders", 5));
    let before = state.topic("orders").cloned();
    let mut change = alter("orders");
    change.retention_ms = Some(1);
    change.retention_bytes = Some(1);
    change.partitions = Some(2);
    assert_eq!(
        state.apply(&Command::AlterTopic(change)),
        Err(TopicError::RetentionTooShort { min: 100 })
    );
    let mut change = alter("orders");
    change.retention_bytes = Some(1);
    change.partitions = Some(2);
    assert_eq!(
        state.apply(&Command::AlterTopic(change)),
        Err(TopicError::RetentionBytesTooSmall)
    );
    let mut change = alter("orders");
    change.retention_ms = Some(7_200_000);
    change.partitions = Some(2);
    assert_eq!(
        state.apply(&Command::AlterTopic(change)),
        Err(TopicError::PartitionsNotIncreased { current: 5 })
    );
    assert_eq!(state.topic("orders").cloned(), before);
}

#[test]
fn alter_schema_bumps_the_schema_version() {
    let mut state = state_with_members(&[1]);
    created(&mut state, &create("orders", 3));
    let mut change = alter("orders");
    change.schema = Some("{}".to_string());
    state.apply(&Command::AlterTopic(change.clone())).unwrap();
    state.apply(&Command::AlterTopic(change)).unwrap();
    let topic = state.topic("orders").unwrap();
    assert_eq!(topic.schema.as_deref(), Some("{}"));
    assert_eq!(topic.schema_version, 2);
}

#[test]
fn assign_partition_moves_one_partition_of_the_named_incarnation() {
    let mut state = state_with_members(&[1, 2]);
    let topic = created(&mut state, &create("orders", 3));
    let assign = |partition: u32, owner: u32, topic_id: TopicId| Command::AssignPartition {
        topic: "orders".to_string(),
        topic_id,
        partition: PartitionId(partition),
        owner: NodeId(owner),
    };
    assert_eq!(
        state.apply(&assign(0, 9, topic.id)),
        Err(TopicError::UnknownMember(NodeId(9)))
    );
    assert_eq!(
        state.apply(&assign(3, 1, topic.id)),
        Err(TopicError::PartitionOutOfRange)
    );
    assert_eq!(
        state.apply(&assign(0, 1, TopicId(99))),
        Err(TopicError::NotFound)
    );
    let Ok(Applied::PartitionAssigned(after)) = state.apply(&assign(0, 1, topic.id)) else {
        panic!("assignment refused");
    };
    assert_eq!(after.owner_of(PartitionId(0)), Some(NodeId(1)));
    assert_eq!(after.owners[1..], topic.owners[1..]);
}

#[test]
fn remove_member_keeps_partition_owners() {
    let mut state = state_with_members(&[1]);
    created(&mut state, &create("orders", 3));
    assert_eq!(
        state.apply(&Command::RemoveMember { node: NodeId(1) }),
        Ok(Applied::MemberRemoved(NodeId(1)))
    );
    assert!(state.members().is_empty());
    assert_eq!(
        state.topic("orders").unwrap().owners,
        vec![Some(NodeId(1)); 3]
    );
}

#[test]
fn add_member_refuses_a_long_address() {
    let mut state = MetaState::new();
    assert_eq!(
        state.apply(&Command::AddMember {
            node: NodeId(1),
            addr: "a".repeat(256)
        }),
        Err(TopicError::MemberRefused)
    );
}

#[test]
fn topics_after_pages_in_name_order() {
    let mut state = state_with_members(&[1]);
    for name in ["c", "a", "e", "b", "d"] {
        created(&mut state, &create(name, 3));
    }
    let names = |(page, more): (Vec<&Topic>, bool)| {
        (
            page.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
            more,
        )
    };
    assert_eq!(
        names(state.topics_after("", 2)),
        (vec!["a".to_string(), "b".to_string()], true)
    );
    assert_eq!(
        names(state.topics_after("b", 3)),
        (
            vec!["c".to_string(), "d".to_string(), "e".to_string()],
            false
        )
    );
    assert_eq!(
        names(state.topics_after("bb", 1)),
        (vec!["c".to_string()], true)
    );
    assert_eq!(names(state.topics_after("e", 10)), (vec![], false));
    assert_eq!(state.topic_count(), 5);
}

#[test]
fn commands_round_trip_through_their_encoding() {
    let commands = vec![
        create("orders", 0),
        Command::AlterTopic(AlterTopic {
            name: "orders".to_string(),
            partitions: Some(9),
            retention_ms: Some(0),
            retention_bytes: Some(5 << 20),
            max_in_flight_per_partition: None,
            max_acked_ahead_per_partition: Some(3),
            schema: Some("{}".to_string()),
        }),
        Command::DeleteTopic {
            name: "orders".to_string(),
        },
        Command::AssignPartition {
            topic: "orders".to_string(),
            topic_id: TopicId(u64::MAX),
            partition: PartitionId(2),
            owner: NodeId(3),
        },
        member(4),
        Command::RemoveMember { node: NodeId(4) },
    ];
    for command in commands {
        let bytes = command.encode();
        assert_eq!(bytes[0], COMMAND_FORMAT_2);
        assert_eq!(Command::decode(&bytes), Ok(command));
    }
}

#[test]
fn command_decoding_refuses_bad_bytes() {
    let bytes = create("orders", 0).encode();
    assert_eq!(
        Command::decode(&[]),
        Err(EncodingError::UnknownFormat(None))
    );
    let mut other_format = bytes.clone();
    other_format[0] = 3;
    assert_eq!(
        Command::decode(&other_format),
        Err(EncodingError::UnknownFormat(Some(3)))
    );
    for cut in 1..bytes.len() {
        assert!(
            matches!(
                Command::decode(&bytes[..cut]),
                Err(EncodingError::Malformed(_))
            ),
            "prefix of {cut} bytes decoded"
        );
    }
    let mut trailing = bytes;
    trailing.push(0);
    assert_eq!(
        Command::decode(&trailing),
        Err(EncodingError::Malformed("trailing bytes".to_string()))
    );
}

#[test]
fn snapshots_round_trip_and_refuse_broken_states() {
    let mut state = state_with_members(&[1, 2]);
    created(&mut state, &create("a", 3));
    created(&mut state, &create("b", 4));
    let bytes = state.encode_snapshot();
    assert_eq!(MetaState::decode_snapshot(&bytes), Ok(state.clone()));

    let mut broken = state.clone();
    broken.next_topic_id = 1;
    assert_eq!(
        MetaState::decode_snapshot(&broken.encode_snapshot()),
        Err(EncodingError::Malformed(
            "topic a has id 1 out of range".to_string()
        ))
    );
    assert!(matches!(
        MetaState::decode_snapshot(&bytes[..bytes.len() - 1]),
        Err(EncodingError::Malformed(_))
    ));
}

/// Seeds to run for randomized tests: `NARAD_TEST_SEEDS` (default 64).
fn seed_count() -> u64 {
    std::env::var("NARAD_TEST_SEEDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(64)
}

fn random_command(rng: &mut ChaCha8Rng) -> Command {
    let name = format!("t{}", rng.random_range(0..6));
    match rng.random_range(0..7) {
        0 | 1 => create(&name, rng.random_range(0..12)),
        2 => Command::DeleteTopic { name },
        3 => {
            let mut change = alter(&name);
            change.partitions = rng.random_bool(0.5).then(|| rng.random_range(0..12));
            change.retention_ms = rng
                .random_bool(0.3)
                .then(|| rng.random_range(0..2) * 3_600_000);
            change.retention_bytes = rng
                .random_bool(0.3)
                .then(|| rng.random_range(0..3) * (1 << 20));
            change.schema = rng.random_bool(0.2).then(|| "{}".to_string());
            Command::AlterTopic(change)
        }
        4 => Command::AssignPartition {
            topic: name,
            topic_id: TopicId(rng.random_range(0..8)),
            partition: PartitionId(rng.random_range(0..5)),
            owner: NodeId(rng.random_range(0..4)),
        },
        5 => member(rng.random_range(0..4)),
        _ => Command::RemoveMember {
            node: NodeId(rng.random_range(0..4)),
        },
    }
}

#[test]
fn replicas_applying_one_log_agree_and_snapshots_resume_it() {
    for seed in 0..seed_count() {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let log: Vec<Command> = (0..200).map(|_| random_command(&mut rng)).collect();
        let cut = rng.random_range(0..log.len());

        let mut first = MetaState::new();
        let mut second = MetaState::new();
        let mut answers = Vec::new();
        for command in &log {
            // Each replica applies the entry as decoded from the log, as the host does.
            let decoded = Command::decode(&command.encode()).unwrap();
            answers.push(first.apply(&decoded));
            assert_eq!(second.apply(&decoded), *answers.last().unwrap());
        }
        let mut resumed = MetaState::new();
        for command in &log[..cut] {
            let _ = resumed.apply(command);
        }
        let mut resumed = MetaState::decode_snapshot(&resumed.encode_snapshot()).unwrap();
        for (command, answer) in log[cut..].iter().zip(&answers[cut..]) {
            assert_eq!(
                resumed.apply(command),
                *answer,
                "seed {seed}: rerun with NARAD_TEST_SEEDS={} cargo test -p narad-core metastore",
                seed + 1
            );
        }
        assert_eq!(first, second, "seed {seed}");
        assert_eq!(first, resumed, "seed {seed}");
    }
}

#[test]
fn liveness_is_replicated_state_and_survives_a_snapshot() {
    let mut state = MetaState::new();
    for node in [1, 2] {
        state
            .apply(&Command::AddMember {
                node: NodeId(node),
                addr: format!("127.0.0.1:{node}"),
            })
            .unwrap();
    }
    assert!(state.is_alive(NodeId(2)));
    let dead = Command::SetMemberAlive {
        node: NodeId(2),
        alive: false,
    };
    assert_eq!(
        state.apply(&dead),
        Ok(Applied::MemberStatus {
            node: NodeId(2),
            alive: false
        })
    );
    assert!(!state.is_alive(NodeId(2)));
    assert!(state.is_alive(NodeId(1)));
    assert_eq!(
        state.apply(&Command::SetMemberAlive {
            node: NodeId(9),
            alive: false
        }),
        Err(TopicError::UnknownMember(NodeId(9)))
    );
    let restored = MetaState::decode_snapshot(&state.encode_snapshot()).unwrap();
    assert_eq!(restored, state);
    assert!(!restored.is_alive(NodeId(2)));
    state
        .apply(&Command::SetMemberAlive {
            node: NodeId(2),
            alive: true,
        })
        .unwrap();
    assert!(state.is_alive(NodeId(2)));
}

#[test]
fn new_partitions_go_to_members_alive_only() {
    let mut state = MetaState::new();
    for node in [1, 2, 3] {
        state
            .apply(&Command::AddMember {
                node: NodeId(node),
                addr: format!("n{node}"),
            })
            .unwrap();
    }
    state
        .apply(&Command::SetMemberAlive {
            node: NodeId(2),
            alive: false,
        })
        .unwrap();
    let Ok(Applied::TopicCreated(topic)) = state.apply(&create_command("t", 6)) else {
        panic!("created")
    };
    let owners: BTreeSet<NodeId> = topic.owners.iter().flatten().copied().collect();
    assert_eq!(owners, BTreeSet::from([NodeId(1), NodeId(3)]));
}

#[test]
fn the_first_three_members_by_id_vote_and_the_others_learn() {
    let ids = |ids: &[u32]| ids.iter().copied().map(NodeId).collect::<Vec<_>>();
    assert_eq!(
        voters_and_learners(ids(&[5, 1, 3, 2, 1])),
        (ids(&[1, 2, 3]), ids(&[5]))
    );
    assert_eq!(voters_and_learners(ids(&[2, 1])), (ids(&[1, 2]), ids(&[])));
}

fn grant(action: users::Action, patterns: &[&str]) -> users::Grant {
    users::Grant {
        action,
        patterns: patterns.iter().map(|p| p.to_string()).collect(),
    }
}

fn create_user(name: &str, root: bool, grants: Vec<users::Grant>) -> Command {
    Command::CreateUser(users::CreateUser {
        username: name.to_string(),
        password_hash: format!("$argon2id$v=19$m=19456,t=2,p=1$salt${name}"),
        grants,
        root,
        at_ms: 1_700_000_000_000,
    })
}

#[test]
fn root_is_seeded_once_and_its_rules_hold() {
    use users::Action::*;
    let mut state = MetaState::new();
    let Ok(Applied::UserCreated(root)) = state.apply(&create_user("admin", true, vec![])) else {
        panic!("root seeded")
    };
    assert!(root.root && root.is_admin() && root.may(Produce, "anything"));
    // A second seed (another node racing, or a restart) is refused, whatever its name.
    assert_eq!(
        state.apply(&create_user("admin", true, vec![])),
        Err(TopicError::UserExists)
    );
    assert_eq!(
        state.apply(&create_user("root2", true, vec![])),
        Err(TopicError::RootExists)
    );
    assert_eq!(
        state.apply(&Command::DeleteUser {
            username: "admin".to_string()
        }),
        Err(TopicError::RootUndeletable)
    );
    assert_eq!(
        state.apply(&Command::SetGrants {
            username: "admin".to_string(),
            grants: vec![grant(Produce, &["x"])],
            at_ms: 1,
        }),
        Err(TopicError::RootGrantsFixed)
    );
    assert_eq!(
        state.apply(&Command::SetPassword {
            username: "admin".to_string(),
            password_hash: "$2b$10$new".to_string(),
            at_ms: 5,
        }),
        Ok(Applied::PasswordSet("admin".to_string()))
    );
    let root = state.users().get("admin").unwrap();
    assert_eq!(
        (root.password_hash.as_str(), root.updated_at_ms),
        ("$2b$10$new", 5)
    );
}

#[test]
fn users_are_created_checked_regranted_deleted_and_survive_a_snapshot() {
    use users::Action::*;
    let mut state = MetaState::new();
    state.apply(&create_user("admin", true, vec![])).unwrap();
    let grants = vec![
        grant(Produce, &["orders-*", "audit", "orders-*"]),
        grant(Consume, &["audit"]),
        grant(Produce, &["billing"]),
    ];
    let Ok(Applied::UserCreated(user)) = state.apply(&create_user("svc.1", false, grants)) else {
        panic!("created")
    };
    // One grant per action, patterns sorted without repeats.
    assert_eq!(
        user.grants,
        vec![
            grant(Produce, &["audit", "billing", "orders-*"]),
            grant(Consume, &["audit"])
        ]
    );
    assert!(user.may(Produce, "orders-eu") && user.may(Produce, "billing"));
    assert!(!user.may(Produce, "order") && !user.may(Consume, "orders-eu") && !user.is_admin());
    assert_eq!(
        state.apply(&create_user("svc.1", false, vec![])),
        Err(TopicError::UserExists)
    );
    for bad in ["", "has space", &"x".repeat(65), "slash/"] {
        assert_eq!(
            state.apply(&create_user(bad, false, vec![])),
            Err(TopicError::UsernameInvalid),
            "{bad:?}"
        );
    }
    for bad in [
        vec![grant(Admin, &["x"])],
        vec![grant(Produce, &[])],
        vec![grant(Produce, &["a b"])],
        vec![grant(Produce, &["a*b"])],
        vec![grant(Produce, &[".."])],
    ] {
        assert!(
            matches!(
                state.apply(&create_user("other", false, bad.clone())),
                Err(TopicError::GrantInvalid(_))
            ),
            "{bad:?}"
        );
    }
    let Ok(Applied::GrantsSet(user)) = state.apply(&Command::SetGrants {
        username: "svc.1".to_string(),
        grants: vec![grant(Consume, &["*"])],
        at_ms: 9,
    }) else {
        panic!("regranted")
    };
    assert!(user.may(Consume, "anything") && !user.may(Produce, "orders-eu"));
    assert_eq!(user.updated_at_ms, 9);

    let restored = MetaState::decode_snapshot(&state.encode_snapshot()).unwrap();
    assert_eq!(restored, state);
    assert_eq!(restored.users().len(), 2);

    assert_eq!(
        state.apply(&Command::DeleteUser {
            username: "svc.1".to_string()
        }),
        Ok(Applied::UserDeleted("svc.1".to_string()))
    );
    assert_eq!(
        state.apply(&Command::DeleteUser {
            username: "svc.1".to_string()
        }),
        Err(TopicError::UserNotFound)
    );
    assert!(matches!(
        state.apply(&Command::SetPassword {
            username: "admin".to_string(),
            password_hash: "plain".to_string(),
            at_ms: 1,
        }),
        Err(TopicError::PasswordHashInvalid)
    ));
}

#[test]
fn only_root_passes_on_admin_and_others_only_what_they_hold() {
    use users::Action::*;
    let user = |root: bool, grants: Vec<users::Grant>| users::User {
        username: "u".to_string(),
        password_hash: "$x".to_string(),
        grants,
        root,
        created_at_ms: 0,
        updated_at_ms: 0,
    };
    let root = user(true, vec![]);
    let admin = user(false, vec![grant(Admin, &[])]);
    let orders = user(false, vec![grant(Produce, &["orders-*", "audit"])]);
    assert!(root.may_pass_on(&grant(Admin, &[])));
    assert!(!admin.may_pass_on(&grant(Admin, &[])));
    assert!(admin.may_pass_on(&grant(Consume, &["*"])));
    assert!(orders.may_pass_on(&grant(Produce, &["orders-eu", "orders-us-*", "audit"])));
    assert!(!orders.may_pass_on(&grant(Produce, &["orders*"])));
    assert!(!orders.may_pass_on(&grant(Produce, &["*"])));
    assert!(!orders.may_pass_on(&grant(Consume, &["audit"])));
    assert!(users::pattern_matches("*", "x") && !users::pattern_matches("a", "ab"));
}
