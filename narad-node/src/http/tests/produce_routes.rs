//! Single-record produce: partition choice, refusals and WAL failures.

use narad_core::wal::AppendError;
use narad_core::IoFault;

use super::*;

async fn produce(f: &Fixture, topic: &str, query: Option<&str>, body: &[u8]) -> Reply {
    produce::produce(&f.app, topic, query, Body::Bytes(body.to_vec())).await
}

#[tokio::test]
async fn a_keyed_produce_is_202_with_the_durability_header_and_a_format_2_record() {
    let f = fixture().await;
    let id = topic(&f, "orders", 3, None).await;
    let reply = produce(&f, "orders", Some("key=customer-42"), b"{\"n\":1}").await;
    assert_eq!(
        reply,
        Reply::empty(202).with_header(("narad-durability", "local-wal-fsync"))
    );
    let records = f.sink.records();
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(record.topic, "orders");
    assert_eq!(record.topic_id, Some(id));
    assert_eq!(record.key.as_deref(), Some(&b"customer-42"[..]));
    assert_eq!(record.partition, PartitionId(1));
    assert_eq!(record.payload, b"{\"n\":1}");
    assert!(record.timestamp_ms > 1_700_000_000_000);
}

#[tokio::test]
async fn keys_pin_partitions_by_the_fnv1a_vectors() {
    let f = fixture().await;
    topic(&f, "eight", 8, None).await;
    topic(&f, "three", 3, None).await;
    for _ in 0..3 {
        produce(&f, "eight", Some("key=customer-42"), b"x").await;
        produce(&f, "three", Some("key=customer-42"), b"x").await;
    }
    let partitions: Vec<(String, u32)> = f
        .sink
        .records()
        .iter()
        .map(|record| (record.topic.clone(), record.partition.0))
        .collect();
    let expected: Vec<(String, u32)> = (0..3)
        .flat_map(|_| [("eight".to_string(), 6), ("three".to_string(), 1)])
        .collect();
    assert_eq!(partitions, expected);
}

#[tokio::test]
async fn keyless_produces_rotate_exactly_evenly_and_store_no_key() {
    let f = fixture().await;
    topic(&f, "orders", 4, None).await;
    for _ in 0..40 {
        produce(&f, "orders", None, b"x").await;
    }
    produce(&f, "orders", Some("key="), b"x").await;
    let mut counts = [0; 4];
    for record in f.sink.records().iter().take(40) {
        assert_eq!(record.key, None);
        counts[record.partition.0 as usize] += 1;
    }
    assert_eq!(counts, [10; 4]);
    assert_eq!(f.sink.records()[40].key, None);
}

#[tokio::test]
async fn a_partition_parameter_pins_even_with_a_key() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    produce(
        &f,
        "orders",
        Some("key=customer-42&partition=2&other=x"),
        b"x",
    )
    .await;
    assert_eq!(f.sink.records()[0].partition, PartitionId(2));
}

#[tokio::test]
async fn produce_refusals_follow_the_surface_check_order() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    type Case<'a> = (&'a str, Option<&'a str>, &'a [u8], u16, &'a str);
    let cases: [Case; 9] = [
        (
            "orders",
            Some("key=a&key=b"),
            b"x",
            400,
            "invalid argument: repeated query parameter \\\"key\\\"",
        ),
        (
            "orders",
            Some("partition=1&partition=1"),
            b"x",
            400,
            "invalid argument: repeated query parameter \\\"partition\\\"",
        ),
        (
            "orders",
            Some("partition=-1"),
            b"x",
            400,
            "invalid argument: partition must be a non-negative integer",
        ),
        (
            "orders",
            Some("partition="),
            b"x",
            400,
            "invalid argument: partition must be a non-negative integer",
        ),
        (
            "orders",
            Some("partition=x"),
            b"",
            400,
            "invalid argument: partition must be a non-negative integer",
        ),
        ("orders", None, b"", 400, "message required"),
        ("nope", None, b"", 400, "message required"),
        ("nope", Some("partition=9"), b"x", 404, "topic not found"),
        (
            "orders",
            Some("partition=3"),
            b"x",
            400,
            "invalid argument: partition out of range",
        ),
    ];
    for (topic, query, body, status, message) in cases {
        assert_error(&produce(&f, topic, query, body).await, status, message);
    }
    assert_error(
        &produce::produce(&f.app, "orders", None, Body::TooLarge).await,
        413,
        "request body too large",
    );
    assert!(f.sink.calls().is_empty());
}

#[tokio::test]
async fn a_schema_violation_is_400_and_counted() {
    let f = fixture().await;
    topic(
        &f,
        "orders",
        3,
        Some("{\"type\":\"object\",\"required\":[\"id\"]}"),
    )
    .await;
    let reply = produce(&f, "orders", None, b"{\"x\":1}").await;
    assert_eq!(reply.status, 400);
    assert!(reply
        .text()
        .starts_with("{\"error\":\"invalid argument: message does not match the topic schema: "));
    assert_eq!(produce(&f, "orders", None, b"not json").await.status, 400);
    assert_eq!(produce(&f, "orders", None, b"{\"id\":1}").await.status, 202);
    assert!(f
        .app
        .metrics
        .encode()
        .contains("narad_produce_rejections_total{topic=\"orders\",reason=\"schema\"} 2\n"));
}

#[tokio::test]
async fn invalid_json_is_accepted_without_a_schema() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    assert_eq!(produce(&f, "orders", None, b"{not json").await.status, 202);
}

#[tokio::test]
async fn a_wal_failure_is_a_500_and_no_wal_is_a_503() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    *f.sink.failure.lock().unwrap() = Some(WalError::Append(AppendError::Disk(IoFault::Eio)));
    assert_error(
        &produce(&f, "orders", None, b"x").await,
        500,
        "produce failed",
    );
    let batch = "{\"messages\":[{\"payload\":1}]}";
    assert_error(
        &produce::produce_batch(&f.app, "orders", None, json(batch)).await,
        500,
        "produce failed",
    );
    *f.sink.failure.lock().unwrap() = Some(WalError::Unavailable);
    assert_error(
        &produce(&f, "orders", None, b"x").await,
        503,
        "ingress WAL unavailable",
    );
    // An overloaded WAL is the same retriable 503, not a failure.
    *f.sink.failure.lock().unwrap() = Some(WalError::Append(AppendError::Overloaded {
        unflushed_bytes: 2,
        bytes_max: 1,
    }));
    assert_error(
        &produce(&f, "orders", None, b"x").await,
        503,
        "ingress WAL unavailable",
    );
}

#[tokio::test]
async fn the_disk_guard_refuses_produces_with_507_before_the_wal_and_lets_them_through_once_cleared(
) {
    let f = fixture().await;
    topic(&f, "orders", 4, None).await;
    f.app.set_insufficient_storage(true);
    assert_error(
        &produce(&f, "orders", None, b"x").await,
        507,
        "insufficient storage",
    );
    let batch = "{\"messages\":[{\"payload\":1},{\"payload\":2}]}";
    assert_error(
        &produce::produce_batch(&f.app, "orders", None, json(batch)).await,
        507,
        "insufficient storage",
    );
    // The earlier checks still answer first: a bad request is a 400, an unknown topic a 404.
    assert_error(
        &produce(&f, "orders", None, b"").await,
        400,
        "message required",
    );
    assert_error(
        &produce(&f, "nope", None, b"x").await,
        404,
        "topic not found",
    );
    assert!(f.sink.calls().is_empty(), "nothing reached the WAL");
    f.app.set_insufficient_storage(false);
    assert_eq!(produce(&f, "orders", None, b"x").await.status, 202);
    let reply = produce::produce_batch(&f.app, "orders", None, json(batch)).await;
    assert_reply(&reply, 202, "{\"accepted\":2}\n");
    // The refused keyless records did not move the rotation: the same records on a node that
    // refused nothing (same seed) land on the same partitions.
    let fresh = fixture().await;
    topic(&fresh, "orders", 4, None).await;
    produce(&fresh, "orders", None, b"x").await;
    produce::produce_batch(&fresh.app, "orders", None, json(batch)).await;
    let partitions = |f: &Fixture| -> Vec<PartitionId> {
        f.sink
            .records()
            .iter()
            .map(|record| record.partition)
            .collect()
    };
    assert_eq!(partitions(&f), partitions(&fresh));
}
