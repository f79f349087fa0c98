//! Topic management: create, get, list, alter and delete.

use super::*;

#[tokio::test]
async fn create_answers_201_with_the_defaults_in_surface_order() {
    let f = fixture().await;
    let reply = create(&f, "{\"name\":\"orders\"}").await;
    let expected = format!(
        "{{\"name\":\"orders\",\"partitions\":3,\"retention_ms\":604800000,\
         \"visibility_timeout_ms\":30000,\"max_in_flight_per_partition\":1024,\
         \"max_acked_ahead_per_partition\":1024,\"created_at\":{}}}\n",
        created_at(&f, "orders")
    );
    assert_reply(&reply, 201, &expected);
    assert_eq!(reply.content_type, Some("application/json"));
    assert!(created_at(&f, "orders") > 1_700_000_000);
}

#[tokio::test]
async fn create_keeps_explicit_values() {
    let f = fixture().await;
    let reply = create(
        &f,
        "{\"name\":\"o\",\"partitions\":8,\"retention_ms\":3600000,\"visibility_timeout_ms\":5000,\
         \"max_in_flight_per_partition\":7,\"max_acked_ahead_per_partition\":9,\"owner\":\"x\"}",
    )
    .await;
    let expected = format!(
        "{{\"name\":\"o\",\"partitions\":8,\"retention_ms\":3600000,\"visibility_timeout_ms\":5000,\
         \"max_in_flight_per_partition\":7,\"max_acked_ahead_per_partition\":9,\"created_at\":{}}}\n",
        created_at(&f, "o")
    );
    assert_reply(&reply, 201, &expected);
}

#[tokio::test]
async fn retention_bytes_is_set_on_create_and_patch_and_shown_after_retention_ms_when_set() {
    let f = fixture().await;
    let reply = create(
        &f,
        "{\"name\":\"o\",\"retention_ms\":3600000,\"retention_bytes\":10737418240}",
    )
    .await;
    let shown = |bound: &str| {
        format!(
            "{{\"name\":\"o\",\"partitions\":3,\"retention_ms\":3600000,{bound}\
             \"visibility_timeout_ms\":30000,\"max_in_flight_per_partition\":1024,\
             \"max_acked_ahead_per_partition\":1024,\"created_at\":{}}}\n",
            created_at(&f, "o")
        )
    };
    assert_reply(&reply, 201, &shown("\"retention_bytes\":10737418240,"));
    let reply = alter(&f, "o", "{\"retention_bytes\":1048576}").await;
    assert_reply(&reply, 200, &shown("\"retention_bytes\":1048576,"));
    let reply = topics::get_topic(&f.app, "o", None).await;
    assert!(
        reply
            .text()
            .contains("\"retention_ms\":3600000,\"retention_bytes\":1048576,"),
        "{}",
        reply.text()
    );
    // 0: no bound, and not shown.
    let reply = alter(&f, "o", "{\"retention_bytes\":0}").await;
    assert_reply(&reply, 200, &shown(""));
    let view = f.app.metastore.view();
    assert_eq!(view.state.topic("o").unwrap().settings.retention_bytes, 0);
}

#[tokio::test]
async fn the_minimum_retention_is_the_nodes_own() {
    let mut f = fixture().await;
    f.app = f.app.with_min_retention_ms(1_000);
    assert_error(
        &create(&f, "{\"name\":\"t\",\"retention_ms\":999}").await,
        400,
        "invalid argument: retention_ms must be 0 (default) or at least 1000",
    );
    let reply = create(&f, "{\"name\":\"t\",\"retention_ms\":1000}").await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    assert_error(
        &alter(&f, "t", "{\"retention_ms\":500}").await,
        400,
        "invalid argument: retention_ms must be 0 (default) or at least 1000",
    );
    let reply = alter(&f, "t", "{\"retention_ms\":2000}").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let view = f.app.metastore.view();
    assert_eq!(view.state.topic("t").unwrap().settings.retention_ms, 2_000);
}

#[tokio::test]
async fn create_refuses_a_duplicate_name_with_409() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    assert_error(
        &create(&f, "{\"name\":\"orders\"}").await,
        409,
        "topic already exists",
    );
}

#[tokio::test]
async fn create_validation_failures_are_400_with_the_reason() {
    let f = fixture().await;
    let cases = [
        ("{}", "invalid argument: topic name required"),
        (
            "{\"name\":\"a b\"}",
            "invalid argument: topic name must match ^[A-Za-z0-9._-]{1,255}$",
        ),
        (
            "{\"name\":\"..\"}",
            "invalid argument: topic name must not be \\\".\\\" or \\\"..\\\"",
        ),
        (
            "{\"name\":\"t\",\"partitions\":-1}",
            "invalid argument: partitions must not be negative",
        ),
        (
            "{\"name\":\"t\",\"partitions\":2}",
            "invalid argument: partitions must be between 3 and 108",
        ),
        (
            "{\"name\":\"t\",\"partitions\":109}",
            "invalid argument: partitions must be between 3 and 108",
        ),
        (
            "{\"name\":\"t\",\"retention_ms\":-5}",
            "invalid argument: retention_ms must not be negative",
        ),
        (
            "{\"name\":\"t\",\"retention_ms\":3599999}",
            "invalid argument: retention_ms must be 0 (default) or at least 3600000",
        ),
        (
            "{\"name\":\"t\",\"retention_bytes\":-1}",
            "invalid argument: retention_bytes must not be negative",
        ),
        (
            "{\"name\":\"t\",\"retention_bytes\":1048575}",
            "invalid argument: retention_bytes must be 0 (no bound) or at least 1048576",
        ),
        (
            "{\"name\":\"t\",\"visibility_timeout_ms\":999}",
            "invalid argument: visibility_timeout_ms must be 0 (default) or at least 1000",
        ),
        (
            "{\"name\":\"t\",\"parent\":\"p\"}",
            "invalid argument: fan-out topics (parent, fanout_delay_ms) are not supported",
        ),
        ("", "invalid argument: request body required"),
    ];
    for (body, message) in cases {
        assert_error(&create(&f, body).await, 400, message);
    }
    for body in [
        "{\"name\":\"t\",\"colour\":1}",
        "{\"name\":\"t\"} {}",
        "{\"name\":",
        "{\"name\":\"t\",\"partitions\":3.5}",
    ] {
        let reply = create(&f, body).await;
        assert_eq!(reply.status, 400, "{body}");
        assert!(
            reply
                .text()
                .starts_with("{\"error\":\"invalid argument: invalid JSON body: "),
            "{body}: {}",
            reply.text()
        );
    }
    assert_eq!(f.app.metastore.view().state.topic_count(), 0);
}

#[tokio::test]
async fn create_refuses_a_body_over_1_mib_with_413() {
    let f = fixture().await;
    assert_error(
        &topics::create_topic(&f.app, &Caller::Open, Body::TooLarge).await,
        413,
        "request body too large",
    );
}

#[tokio::test]
async fn create_refuses_a_schema_that_does_not_compile() {
    let f = fixture().await;
    let reply = create(&f, "{\"name\":\"t\",\"schema\":{\"type\":\"nope\"}}").await;
    assert_eq!(reply.status, 400);
    assert!(reply
        .text()
        .starts_with("{\"error\":\"invalid argument: invalid schema: "));
}

#[tokio::test]
async fn get_reports_partition_stats_from_the_seam() {
    let f = fixture().await;
    let id = topic(&f, "orders", 3, None).await;
    let key = TopicKey {
        name: "orders".to_string(),
        id,
    };
    let record = StoredRecord {
        offset: Offset(4),
        key: None,
        payload: b"x".to_vec(),
        committed_at_ms: 0,
    };
    f.log
        .partitions
        .lock()
        .unwrap()
        .insert((key, PartitionId(1)), (4, vec![record.clone(), record]));
    let reply = topics::get_topic(&f.app, "orders", Some("partition=1")).await;
    let expected = format!(
        "{{\"name\":\"orders\",\"partitions\":3,\"retention_ms\":604800000,\
         \"visibility_timeout_ms\":30000,\"max_in_flight_per_partition\":1024,\
         \"max_acked_ahead_per_partition\":1024,\"created_at\":{},\"partition_stats\":[\
         {{\"index\":1,\"segments\":1,\"oldest_offset\":4,\"next_offset\":6,\"high_watermark\":6,\
         \"size_bytes\":200,\"oldest_segment_at\":1700000000,\"owner_node\":\"1\"}}]}}\n",
        created_at(&f, "orders")
    );
    assert_reply(&reply, 200, &expected);

    let all = topics::get_topic(&f.app, "orders", None).await.text();
    assert_eq!(all.matches("\"index\":").count(), 3);
    assert!(all.contains("{\"index\":0,\"segments\":0,\"oldest_offset\":0,\"next_offset\":0,\"high_watermark\":0,\"size_bytes\":0,\"owner_node\":\"1\"}"));
}

#[tokio::test]
async fn get_refuses_a_bad_partition_and_an_unknown_topic() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    for query in [
        "partition=3",
        "partition=-1",
        "partition=x",
        "partition=1&partition=2",
    ] {
        assert_eq!(
            topics::get_topic(&f.app, "orders", Some(query))
                .await
                .status,
            400,
            "{query}"
        );
    }
    assert_error(
        &topics::get_topic(&f.app, "orders", Some("partition=3")).await,
        400,
        "invalid argument: partition out of range",
    );
    assert_error(
        &topics::get_topic(&f.app, "nope", None).await,
        404,
        "topic not found",
    );
}

fn names(reply: &Reply) -> (Vec<String>, String) {
    let value: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    let names = value["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|topic| topic["name"].as_str().unwrap().to_string())
        .collect();
    (
        names,
        value["next_page_token"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn list_pages_by_name_and_the_last_page_has_an_empty_token() {
    let f = fixture().await;
    assert_reply(
        &topics::list_topics(&f.app, None),
        200,
        "{\"topics\":[],\"next_page_token\":\"\"}\n",
    );
    for name in ["c", "a", "e", "b", "d"] {
        topic(&f, name, 3, None).await;
    }
    let strings = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let page = topics::list_topics(&f.app, Some("limit=2"));
    assert_eq!(names(&page), (strings(&["a", "b"]), "b".to_string()));
    let page = topics::list_topics(&f.app, Some("limit=2&page_token=b"));
    assert_eq!(names(&page), (strings(&["c", "d"]), "d".to_string()));
    let page = topics::list_topics(&f.app, Some("limit=2&page_token=d"));
    assert_eq!(names(&page), (strings(&["e"]), String::new()));
    let page = topics::list_topics(&f.app, Some("limit=5"));
    assert_eq!(
        names(&page),
        (strings(&["a", "b", "c", "d", "e"]), String::new())
    );
    let page = topics::list_topics(&f.app, Some("page_token=zzz"));
    assert_eq!(names(&page), (vec![], String::new()));
    let page = topics::list_topics(&f.app, Some("limit=5000"));
    assert_eq!(names(&page).0.len(), 5);
}

#[tokio::test]
async fn list_refuses_a_limit_below_1_or_not_an_integer() {
    let f = fixture().await;
    for query in ["limit=0", "limit=-1", "limit=x", "limit="] {
        assert_error(
            &topics::list_topics(&f.app, Some(query)),
            400,
            "invalid argument: limit must be a positive integer",
        );
    }
}

async fn alter(f: &Fixture, name: &str, body: &str) -> Reply {
    topics::alter_topic(&f.app, &Caller::Open, name, json(body)).await
}

#[tokio::test]
async fn alter_increases_partitions_and_answers_the_topic() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    let reply = alter(&f, "orders", "{\"partitions\":5,\"retention_ms\":0}").await;
    let expected = format!(
        "{{\"name\":\"orders\",\"partitions\":5,\"retention_ms\":604800000,\
         \"visibility_timeout_ms\":30000,\"max_in_flight_per_partition\":1024,\
         \"max_acked_ahead_per_partition\":1024,\"created_at\":{}}}\n",
        created_at(&f, "orders")
    );
    assert_reply(&reply, 200, &expected);
    let reply = alter(
        &f,
        "orders",
        "{\"retention_ms\":7200000,\"max_in_flight_per_partition\":3}",
    )
    .await;
    assert_eq!(reply.status, 200);
    let topic = f
        .app
        .metastore
        .view()
        .state
        .topic("orders")
        .cloned()
        .unwrap();
    assert_eq!(topic.settings.retention_ms, 7_200_000);
    assert_eq!(topic.settings.max_in_flight_per_partition, 3);
}

#[tokio::test]
async fn alter_refusals_are_400_404_as_the_surface_says() {
    let f = fixture().await;
    topic(&f, "orders", 5, None).await;
    let cases = [
        (
            "{\"partitions\":4}",
            400,
            "invalid argument: partitions can only increase (topic has 5)",
        ),
        (
            "{\"partitions\":5}",
            400,
            "invalid argument: partitions can only increase (topic has 5)",
        ),
        (
            "{\"partitions\":109}",
            400,
            "invalid argument: partitions must be between 3 and 108",
        ),
        (
            "{\"retention_ms\":-1}",
            400,
            "invalid argument: retention_ms must not be negative",
        ),
        (
            "{\"retention_ms\":5}",
            400,
            "invalid argument: retention_ms must be 0 (default) or at least 3600000",
        ),
        (
            "{\"retention_ms\":3599999,\"partitions\":4}",
            400,
            "invalid argument: retention_ms must be 0 (default) or at least 3600000",
        ),
        (
            "{\"retention_bytes\":-1}",
            400,
            "invalid argument: retention_bytes must not be negative",
        ),
        (
            "{\"retention_bytes\":1,\"partitions\":4}",
            400,
            "invalid argument: retention_bytes must be 0 (no bound) or at least 1048576",
        ),
        ("{}", 400, "invalid argument: no field to change"),
        ("", 400, "invalid argument: request body required"),
    ];
    for (body, status, message) in cases {
        assert_error(&alter(&f, "orders", body).await, status, message);
    }
    let reply = alter(&f, "orders", "{\"visibility_timeout_ms\":1}").await;
    assert_eq!(reply.status, 400);
    assert!(
        reply
            .text()
            .contains("unknown field `visibility_timeout_ms`"),
        "{}",
        reply.text()
    );
    assert_error(
        &alter(&f, "nope", "{\"partitions\":6}").await,
        404,
        "topic not found",
    );
    assert_eq!(
        f.app
            .metastore
            .view()
            .state
            .topic("orders")
            .unwrap()
            .partitions(),
        5
    );
}

#[tokio::test]
async fn alter_schema_must_compile_and_stay_compatible() {
    let f = fixture().await;
    topic(
        &f,
        "orders",
        3,
        Some("{\"type\":\"object\",\"required\":[\"id\"]}"),
    )
    .await;
    let reply = alter(
        &f,
        "orders",
        "{\"schema\":{\"type\":\"object\",\"required\":[\"id\",\"qty\"]}}",
    )
    .await;
    assert_error(
        &reply,
        400,
        "invalid argument: incompatible schema: property \\\"qty\\\" becomes required",
    );
    let reply = alter(&f, "orders", "{\"schema\":{\"type\":\"object\"}}").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        f.app
            .metastore
            .view()
            .state
            .topic("orders")
            .unwrap()
            .schema_version,
        2
    );
}

#[tokio::test]
async fn delete_answers_204_then_404_and_a_recreate_is_a_new_incarnation() {
    let f = fixture().await;
    let first = topic(&f, "orders", 3, None).await;
    topic(&f, "other", 3, None).await;
    assert_reply(
        &topics::delete_topic(&f.app, &Caller::Open, "orders").await,
        204,
        "",
    );
    assert_eq!(
        topics::delete_topic(&f.app, &Caller::Open, "orders")
            .await
            .status,
        404
    );
    assert!(f.app.metastore.view().state.topic("other").is_some());
    let second = topic(&f, "orders", 3, None).await;
    assert_ne!(first, second);
}
