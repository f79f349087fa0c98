//! Unit tests of the `/v1` routes as plain functions, with in-memory doubles for the seams.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::{Arc, Mutex};

use narad_core::codec::wal::ProduceRecord;
use narad_core::disk::sim::SimDisk;
use narad_core::ids::{NodeId, Offset, PartitionId, TopicId};

use super::auth::Caller;
use super::*;
use crate::metastore::MetastoreOptions;

/// Records every append; fails with `failure` when set.
#[derive(Default)]
struct MemorySink {
    calls: Mutex<Vec<Vec<ProduceRecord>>>,
    failure: Mutex<Option<AppendError>>,
}

impl MemorySink {
    fn outcome(&self, records: Vec<ProduceRecord>) -> Result<(), AppendError> {
        if let Some(error) = self.failure.lock().unwrap().clone() {
            return Err(error);
        }
        self.calls.lock().unwrap().push(records);
        Ok(())
    }

    fn calls(&self) -> Vec<Vec<ProduceRecord>> {
        self.calls.lock().unwrap().clone()
    }

    fn records(&self) -> Vec<ProduceRecord> {
        self.calls().into_iter().flatten().collect()
    }
}

impl ProduceSink for MemorySink {
    fn append(&self, record: ProduceRecord) -> BoxFuture<'_, Result<(), AppendError>> {
        let outcome = self.outcome(vec![record]);
        Box::pin(async move { outcome })
    }

    fn append_many(&self, records: Vec<ProduceRecord>) -> BoxFuture<'_, Result<(), AppendError>> {
        let outcome = self.outcome(records);
        Box::pin(async move { outcome })
    }
}

/// A partition's oldest offset and its records from there on.
type StoredPartition = (u64, Vec<StoredRecord>);

/// Partitions as vectors of records starting at `oldest`; `broken` partitions fail reads.
#[derive(Default)]
struct MemoryLog {
    partitions: Mutex<BTreeMap<(TopicKey, PartitionId), StoredPartition>>,
    broken: Mutex<Vec<PartitionId>>,
}

impl PartitionReader for MemoryLog {
    fn read(
        &self,
        topic: &TopicKey,
        partition: PartitionId,
        offset: Offset,
    ) -> BoxFuture<'_, Result<ReadOutcome, ReadError>> {
        let outcome = if self.broken.lock().unwrap().contains(&partition) {
            Err(ReadError("crc mismatch".to_string()))
        } else {
            let partitions = self.partitions.lock().unwrap();
            match partitions.get(&(topic.clone(), partition)) {
                None => Ok(ReadOutcome::PastEnd),
                Some((oldest, _)) if offset.0 < *oldest => Ok(ReadOutcome::Gone),
                Some((oldest, records)) => Ok(records
                    .get((offset.0 - oldest) as usize)
                    .cloned()
                    .map_or(ReadOutcome::PastEnd, ReadOutcome::Record)),
            }
        };
        Box::pin(async move { outcome })
    }
}

impl PartitionStats for MemoryLog {
    fn partition_stat(
        &self,
        topic: &TopicKey,
        partition: PartitionId,
    ) -> BoxFuture<'_, PartitionStat> {
        let partitions = self.partitions.lock().unwrap();
        let stat = match partitions.get(&(topic.clone(), partition)) {
            None => PartitionStat::default(),
            Some((oldest, records)) => PartitionStat {
                segments: 1,
                oldest_offset: Offset(*oldest),
                next_offset: Offset(oldest + records.len() as u64),
                high_watermark: Offset(oldest + records.len() as u64),
                size_bytes: 100 * records.len() as u64,
                oldest_segment_at_s: Some(1_700_000_000),
            },
        };
        Box::pin(async move { stat })
    }
}

/// A call the queue double saw.
#[derive(Clone, Debug, PartialEq)]
enum QueueCall {
    Consume {
        topic: String,
        limits: QueueLimits,
        partitions: u32,
        pinned: Option<PartitionId>,
        wait: std::time::Duration,
    },
    Settle {
        topic: String,
        handle: ReceiptHandle,
        action: Settle,
    },
}

/// Answers queue-mode calls with scripted outcomes and records them.
struct ScriptedQueue {
    calls: Mutex<Vec<QueueCall>>,
    consume: Mutex<QueueOutcome>,
    settle: Mutex<SettleOutcome>,
}

impl Default for ScriptedQueue {
    fn default() -> Self {
        ScriptedQueue {
            calls: Mutex::default(),
            consume: Mutex::new(QueueOutcome::Empty),
            settle: Mutex::new(SettleOutcome::Done),
        }
    }
}

impl ScriptedQueue {
    fn last(&self) -> Option<QueueCall> {
        self.calls.lock().unwrap().last().cloned()
    }
}

impl QueueConsumer for ScriptedQueue {
    fn consume(
        &self,
        topic: &TopicKey,
        limits: QueueLimits,
        partitions: u32,
        pinned: Option<PartitionId>,
        wait: std::time::Duration,
    ) -> BoxFuture<'_, QueueOutcome> {
        self.calls.lock().unwrap().push(QueueCall::Consume {
            topic: topic.name.clone(),
            limits,
            partitions,
            pinned,
            wait,
        });
        let outcome = self.consume.lock().unwrap().clone();
        Box::pin(async move { outcome })
    }

    fn settle(
        &self,
        topic: &TopicKey,
        handle: ReceiptHandle,
        action: Settle,
    ) -> BoxFuture<'_, SettleOutcome> {
        self.calls.lock().unwrap().push(QueueCall::Settle {
            topic: topic.name.clone(),
            handle,
            action,
        });
        let outcome = self.settle.lock().unwrap().clone();
        Box::pin(async move { outcome })
    }
}

struct Fixture {
    app: App,
    sink: Arc<MemorySink>,
    log: Arc<MemoryLog>,
    queue: Arc<ScriptedQueue>,
}

async fn fixture() -> Fixture {
    let metastore = Metastore::open(
        Arc::new(SimDisk::new(1)),
        MetastoreOptions::new(NodeId(1), "127.0.0.1:7942".to_string()),
    )
    .await
    .unwrap();
    metastore
        .wait_until(|view| view.state.members().contains_key(&NodeId(1)))
        .await
        .unwrap();
    let sink = Arc::new(MemorySink::default());
    let log = Arc::new(MemoryLog::default());
    let queue = Arc::new(ScriptedQueue::default());
    let app = App::new(
        metastore,
        sink.clone(),
        log.clone(),
        log.clone(),
        queue.clone(),
        Arc::new(Metrics::new()),
        42,
    );
    Fixture {
        app,
        sink,
        log,
        queue,
    }
}

fn json(text: &str) -> Body {
    Body::Bytes(text.as_bytes().to_vec())
}

fn assert_reply(reply: &Reply, status: u16, body: &str) {
    assert_eq!((reply.status, reply.text().as_str()), (status, body));
}

fn assert_error(reply: &Reply, status: u16, message: &str) {
    assert_reply(reply, status, &format!("{{\"error\":\"{message}\"}}\n"));
}

async fn create(f: &Fixture, body: &str) -> Reply {
    topics::create_topic(&f.app, &Caller::Open, json(body)).await
}

/// Creates `name` with `partitions` (and an optional schema); returns its incarnation.
async fn topic(f: &Fixture, name: &str, partitions: u32, schema: Option<&str>) -> TopicId {
    let schema = schema.map_or(String::new(), |schema| format!(",\"schema\":{schema}"));
    let reply = create(
        f,
        &format!("{{\"name\":\"{name}\",\"partitions\":{partitions}{schema}}}"),
    )
    .await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    f.app.metastore.view().state.topic(name).unwrap().id
}

fn created_at(f: &Fixture, name: &str) -> u64 {
    f.app
        .metastore
        .view()
        .state
        .topic(name)
        .unwrap()
        .created_at_s
}

// ---- topics ----

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

// ---- produce ----

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
    *f.sink.failure.lock().unwrap() =
        Some(AppendError::WalFailed("input/output error".to_string()));
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
    *f.sink.failure.lock().unwrap() = Some(AppendError::Unavailable);
    assert_error(
        &produce(&f, "orders", None, b"x").await,
        503,
        "ingress WAL unavailable",
    );
}

// ---- batch ----

async fn batch(f: &Fixture, encoding: Option<&str>, body: Vec<u8>) -> Reply {
    produce::produce_batch(&f.app, "orders", encoding, Body::Bytes(body)).await
}

const MIXED_BATCH: &str = r#"{"messages":[
    {"key":"customer-42","payload":"plain text"},
    {"partition":2,"payload":{"a": [1, 2]}},
    {"payload":"aGVsbG8=","payload_encoding":"base64"},
    {"key":"","payload":7}
]}"#;

#[tokio::test]
async fn a_batch_is_one_append_of_every_message_in_order() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    let reply = batch(&f, None, MIXED_BATCH.as_bytes().to_vec()).await;
    assert_eq!(
        reply,
        Reply::json(202, "{\"accepted\":4}".to_string())
            .with_header(("narad-durability", "local-wal-fsync"))
    );
    let calls = f.sink.calls();
    assert_eq!(calls.len(), 1);
    let records = &calls[0];
    let payloads: Vec<&[u8]> = records.iter().map(|r| r.payload.as_slice()).collect();
    assert_eq!(
        payloads,
        vec![&b"plain text"[..], b"{\"a\": [1, 2]}", b"hello", b"7"]
    );
    assert_eq!(records[0].partition, PartitionId(1));
    assert_eq!(records[1].partition, PartitionId(2));
    assert_eq!(records[3].key, None);
    assert!(records
        .iter()
        .all(|r| r.timestamp_ms == records[0].timestamp_ms));
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn zstd(bytes: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(bytes, ruzstd::encoding::CompressionLevel::Fastest)
}

#[tokio::test]
async fn gzip_and_zstd_batches_decode() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    let body = MIXED_BATCH.as_bytes();
    assert_eq!(
        batch(&f, Some("gzip"), gzip(body)).await.text(),
        "{\"accepted\":4}\n"
    );
    assert_eq!(
        batch(&f, Some("zstd"), zstd(body)).await.text(),
        "{\"accepted\":4}\n"
    );
    let mut two_frames = zstd(b"{\"messages\":[{\"pay");
    two_frames.extend(zstd(b"load\":1}]}"));
    assert_eq!(
        batch(&f, Some("zstd"), two_frames).await.text(),
        "{\"accepted\":1}\n"
    );
    let calls = f.sink.calls();
    let payloads = |call: &Vec<ProduceRecord>| -> Vec<Vec<u8>> {
        call.iter().map(|record| record.payload.clone()).collect()
    };
    assert_eq!(calls.len(), 3);
    assert_eq!(payloads(&calls[1]), payloads(&calls[0]));
    assert_eq!(payloads(&calls[2]), vec![b"1".to_vec()]);
}

#[tokio::test]
async fn other_content_encodings_are_415() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    assert_error(
        &batch(&f, Some("br"), b"x".to_vec()).await,
        415,
        "unsupported Content-Encoding \\\"br\\\" (use gzip or zstd)",
    );
}

#[tokio::test]
async fn a_decompression_bomb_is_413_not_an_allocation() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    let zeros = vec![b' '; BATCH_BODY_BYTES_MAX + 1];
    for (encoding, body) in [("gzip", gzip(&zeros)), ("zstd", zstd(&zeros))] {
        assert!(
            body.len() < 1024 * 1024,
            "{encoding} bomb is {} bytes",
            body.len()
        );
        assert_error(
            &batch(&f, Some(encoding), body).await,
            413,
            "decoded request body too large",
        );
    }
    assert_error(
        &produce::produce_batch(&f.app, "orders", None, Body::TooLarge).await,
        413,
        "request body too large",
    );
}

#[tokio::test]
async fn a_body_decoding_to_exactly_the_bound_is_accepted_and_the_next_one_decodes_alone() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    let mut exact = b"{\"messages\":[{\"payload\":1}]}".to_vec();
    exact.resize(BATCH_BODY_BYTES_MAX, b' ');
    let bomb = vec![b' '; BATCH_BODY_BYTES_MAX + 1];
    for (encoding, compress) in [("gzip", gzip as fn(&[u8]) -> Vec<u8>), ("zstd", zstd)] {
        assert_eq!(
            batch(&f, Some(encoding), compress(&exact)).await.text(),
            "{\"accepted\":1}\n",
            "{encoding}"
        );
        assert_eq!(batch(&f, Some(encoding), compress(&bomb)).await.status, 413);
        // Shorter than what the thread's buffer last held: only its own bytes are parsed.
        assert_eq!(
            batch(
                &f,
                Some(encoding),
                compress(b"{\"messages\":[{\"payload\":2}]}")
            )
            .await
            .text(),
            "{\"accepted\":1}\n",
            "{encoding}"
        );
    }
    let payloads: Vec<Vec<u8>> = f
        .sink
        .calls()
        .iter()
        .map(|call| call[0].payload.clone())
        .collect();
    assert_eq!(payloads, [b"1", b"2", b"1", b"2"].map(|p| p.to_vec()));
}

#[tokio::test]
async fn corrupt_compressed_bodies_are_400() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    for encoding in ["gzip", "zstd"] {
        let reply = batch(&f, Some(encoding), b"definitely not compressed".to_vec()).await;
        assert_eq!(reply.status, 400, "{encoding}");
        assert!(reply
            .text()
            .contains(&format!("body is not valid {encoding}")));
    }
}

#[tokio::test]
async fn a_batch_needs_1_to_1000_messages() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    for body in ["{\"messages\":[]}", "{}"] {
        assert_error(
            &batch(&f, None, body.as_bytes().to_vec()).await,
            400,
            "invalid argument: messages required",
        );
    }
    let message = "{\"payload\":1}";
    let body = |count: usize| format!("{{\"messages\":[{}]}}", vec![message; count].join(","));
    assert_error(
        &batch(&f, None, body(1001).into_bytes()).await,
        400,
        "invalid argument: too many messages (max 1000)",
    );
    assert_eq!(
        batch(&f, None, body(1000).into_bytes()).await.text(),
        "{\"accepted\":1000}\n"
    );
}

#[tokio::test]
async fn the_first_bad_message_refuses_the_whole_batch_naming_its_index() {
    let f = fixture().await;
    topic(&f, "orders", 3, Some("{\"type\":\"object\"}")).await;
    let good = "{\"payload\":{\"ok\":true}}";
    let cases = [
        ("{\"partition\":3,\"payload\":{}}", "partition out of range"),
        (
            "{\"partition\":-1,\"payload\":{}}",
            "partition must be a non-negative integer",
        ),
        (
            "{\"partition\":\"1\",\"payload\":{}}",
            "partition must be a non-negative integer",
        ),
        ("{\"key\":\"k\"}", "message required"),
        ("{\"payload\":null}", "message required"),
        ("{\"payload\":\"\"}", "message required"),
        (
            "{\"payload\":\"%%%\",\"payload_encoding\":\"base64\"}",
            "payload is not valid base64",
        ),
        (
            "{\"payload\":{},\"payload_encoding\":\"hex\"}",
            "unsupported payload_encoding \\\"hex\\\" (only \\\"base64\\\")",
        ),
        (
            "{\"payload\":[1]}",
            "message does not match the topic schema: [1] is not of type \\\"object\\\"",
        ),
    ];
    for (bad, message) in cases {
        let body = format!("{{\"messages\":[{good},{good},{bad},{good}]}}");
        assert_error(
            &batch(&f, None, body.into_bytes()).await,
            400,
            &format!("invalid argument: messages[2]: {message}"),
        );
    }
    let reply = batch(
        &f,
        None,
        b"{\"messages\":[{\"payload\":1,\"extra\":2}]}".to_vec(),
    )
    .await;
    assert_eq!(reply.status, 400);
    assert!(reply.text().contains("unknown field `extra`"));
    assert!(f.sink.calls().is_empty());
}

#[tokio::test]
async fn a_batch_to_an_unknown_topic_is_404() {
    let f = fixture().await;
    assert_error(
        &batch(&f, None, b"{\"messages\":[{\"payload\":1}]}".to_vec()).await,
        404,
        "topic not found",
    );
}

#[tokio::test]
async fn keyless_batch_messages_share_the_rotation() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    let body = format!("{{\"messages\":[{}]}}", ["{\"payload\":1}"; 9].join(","));
    batch(&f, None, body.into_bytes()).await;
    let mut counts = [0; 3];
    for record in f.sink.records() {
        counts[record.partition.0 as usize] += 1;
    }
    assert_eq!(counts, [3; 3]);
}

// ---- consume ----

async fn stored(f: &Fixture, records: Vec<StoredRecord>, oldest: u64) {
    let id = f.app.metastore.view().state.topic("orders").unwrap().id;
    let key = TopicKey {
        name: "orders".to_string(),
        id,
    };
    f.log
        .partitions
        .lock()
        .unwrap()
        .insert((key, PartitionId(0)), (oldest, records));
}

fn stored_record(offset: u64, key: Option<&str>, payload: &[u8]) -> StoredRecord {
    StoredRecord {
        offset: Offset(offset),
        key: key.map(|key| key.as_bytes().to_vec()),
        payload: payload.to_vec(),
        committed_at_ms: 1_700_000_000_999,
    }
}

#[tokio::test]
async fn replay_renders_the_three_payload_encodings_in_field_order() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    stored(
        &f,
        vec![
            stored_record(10, Some("k<1>"), b"{\"a\": 1}"),
            stored_record(11, None, b"a <b> & c"),
            stored_record(12, None, &[0xff, 0x00]),
        ],
        10,
    )
    .await;
    let app = &f.app;
    let read = |offset: u64| {
        let query = format!("partition=0&offset={offset}&wait=5s");
        async move { consume::consume(app, "orders", Some(&query)).await }
    };
    assert_reply(
        &read(10).await,
        200,
        "{\"topic\":\"orders\",\"partition\":0,\"offset\":10,\"key\":\"k\\u003c1\\u003e\",\
         \"payload\":{\"a\": 1},\"timestamp\":1700000000}\n",
    );
    assert_reply(
        &read(11).await,
        200,
        "{\"topic\":\"orders\",\"partition\":0,\"offset\":11,\
         \"payload\":\"a \\u003cb\\u003e \\u0026 c\",\"timestamp\":1700000000}\n",
    );
    assert_reply(
        &read(12).await,
        200,
        "{\"topic\":\"orders\",\"partition\":0,\"offset\":12,\"payload\":\"/wA=\",\
         \"payload_encoding\":\"base64\",\"timestamp\":1700000000}\n",
    );
    assert_reply(&read(13).await, 204, "");
    assert_error(&read(9).await, 410, "offset is no longer retained");
}

#[tokio::test]
async fn an_unreadable_offset_is_410_and_counted() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    f.log.broken.lock().unwrap().push(PartitionId(1));
    assert_error(
        &consume::consume(&f.app, "orders", Some("partition=1&offset=0")).await,
        410,
        "offset is not readable",
    );
    assert!(f
        .app
        .metrics
        .encode()
        .contains("narad_errors_total{component=\"messaging\",kind=\"consume\"} 1\n"));
}

#[tokio::test]
async fn replay_refusals() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    let cases = [
        (
            "orders",
            "offset=0",
            400,
            "partition required for replay-mode consume",
        ),
        (
            "orders",
            "partition=0&offset=-1",
            400,
            "invalid argument: offset must be a non-negative integer",
        ),
        (
            "orders",
            "partition=x&offset=0",
            400,
            "invalid argument: partition must be a non-negative integer",
        ),
        (
            "orders",
            "partition=3&offset=0",
            400,
            "invalid argument: partition out of range",
        ),
        ("nope", "partition=0&offset=0", 404, "topic not found"),
        (
            "orders",
            "partition=0&offset=0&wait=soon",
            400,
            "invalid argument: wait \\\"soon\\\" is not a duration such as 500ms or 5s",
        ),
    ];
    for (topic, query, status, message) in cases {
        assert_error(
            &consume::consume(&f.app, topic, Some(query)).await,
            status,
            message,
        );
    }
}

// ---- queue mode ----

fn handle(partition: u32, offset: u64, nonce: u64) -> ReceiptHandle {
    ReceiptHandle {
        partition: PartitionId(partition),
        offset: Offset(offset),
        nonce,
    }
}

#[tokio::test]
async fn queue_consume_answers_the_message_with_its_receipt_handle_last() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    *f.queue.consume.lock().unwrap() = QueueOutcome::Leased(Leased {
        partition: PartitionId(2),
        record: StoredRecord {
            offset: Offset(7),
            key: Some(b"k".to_vec()),
            payload: b"{\"a\":1}".to_vec(),
            committed_at_ms: 1_700_000_000_999,
        },
        handle: handle(2, 7, 99),
    });
    assert_reply(
        &consume::consume(&f.app, "orders", Some("wait=500ms")).await,
        200,
        "{\"topic\":\"orders\",\"partition\":2,\"offset\":7,\"key\":\"k\",\"payload\":{\"a\":1},\"timestamp\":1700000000,\"receipt_handle\":\"2:7:99\"}\n",
    );
    assert_eq!(
        f.queue.last(),
        Some(QueueCall::Consume {
            topic: "orders".to_string(),
            limits: narad_core::consume::limits_of(0, 1024, 1024),
            partitions: 3,
            pinned: None,
            wait: std::time::Duration::from_millis(500),
        })
    );
}

#[tokio::test]
async fn queue_consume_pins_clamps_the_wait_and_answers_204_when_empty() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    let cases = [
        ("partition=1&wait=1m", Some(1), 10_000),
        ("wait=1.5s", None, 1_500),
        ("", None, 0),
        ("wait=0", None, 0),
        ("wait=-2s", None, 0),
    ];
    for (query, pinned, wait_ms) in cases {
        let reply = consume::consume(&f.app, "orders", Some(query)).await;
        assert_eq!(
            (reply.status, reply.text()),
            (204, String::new()),
            "{query}"
        );
        let Some(QueueCall::Consume {
            pinned: p, wait, ..
        }) = f.queue.last()
        else {
            panic!("no consume for {query}")
        };
        assert_eq!(
            (p, wait),
            (
                pinned.map(PartitionId),
                std::time::Duration::from_millis(wait_ms)
            ),
            "{query}"
        );
    }
}

#[tokio::test]
async fn queue_consume_refusals() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    assert_error(
        &consume::consume(&f.app, "orders", Some("partition=3")).await,
        400,
        "invalid argument: partition out of range",
    );
    assert_error(
        &consume::consume(&f.app, "nope", Some("wait=1s")).await,
        404,
        "topic not found",
    );
    assert_error(
        &consume::consume(&f.app, "orders", Some("wait=1s&wait=2s")).await,
        400,
        "invalid argument: repeated query parameter \\\"wait\\\"",
    );
    assert!(f.queue.last().is_none(), "no refusal reaches the queue");
    *f.queue.consume.lock().unwrap() = QueueOutcome::OwnerDown;
    let reply = consume::consume(&f.app, "orders", Some("partition=0")).await;
    assert_eq!(
        (reply.status, reply.text().as_str()),
        (503, "partition owner is down; retry later\n")
    );
    *f.queue.consume.lock().unwrap() = QueueOutcome::PeerFailed("timed out".to_string());
    let reply = consume::consume(&f.app, "orders", None).await;
    assert_eq!(
        (reply.status, reply.text().as_str()),
        (502, "peer RPC failed: timed out\n")
    );
}

#[tokio::test]
async fn ack_extend_and_nack_are_read_from_the_extend_parameter() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    let cases = [
        ("receipt_handle=1:5:9", Settle::Ack),
        ("receipt_handle=1:5:9&extend=", Settle::Ack),
        ("receipt_handle=1:5:9&extend=false", Settle::Ack),
        ("receipt_handle=1:5:9&extend=true", Settle::Extend),
        ("receipt_handle=1:5:9&extend=1", Settle::Extend),
        ("receipt_handle=1:5:9&extend=0", Settle::Nack),
        // A repeated parameter: the first wins.
        (
            "receipt_handle=1:5:9&receipt_handle=x&extend=0&extend=x",
            Settle::Nack,
        ),
    ];
    for (query, action) in cases {
        let reply = consume::ack(&f.app, "orders", Some(query)).await;
        assert_eq!(
            (reply.status, reply.text()),
            (204, String::new()),
            "{query}"
        );
        assert_eq!(
            f.queue.last(),
            Some(QueueCall::Settle {
                topic: "orders".to_string(),
                handle: handle(1, 5, 9),
                action
            }),
            "{query}"
        );
    }
}

#[tokio::test]
async fn ack_refusals() {
    let f = fixture().await;
    topic(&f, "orders", 3, None).await;
    let cases = [
        ("orders", "", 400, "receipt_handle required"),
        ("orders", "receipt_handle=", 400, "receipt_handle required"),
        (
            "orders",
            "receipt_handle=1:5",
            400,
            "invalid argument: malformed receipt_handle",
        ),
        (
            "orders",
            "receipt_handle=1:5:9&extend=maybe",
            400,
            "invalid argument: extend must be true, false, 1 or 0, not \\\"maybe\\\"",
        ),
        ("nope", "receipt_handle=1:5:9", 404, "topic not found"),
        (
            "orders",
            "receipt_handle=3:5:9",
            410,
            "receipt handle is stale or expired",
        ),
    ];
    for (topic, query, status, message) in cases {
        assert_error(
            &consume::ack(&f.app, topic, Some(query)).await,
            status,
            message,
        );
    }
    assert!(f.queue.last().is_none(), "no refusal reaches the queue");
    *f.queue.settle.lock().unwrap() = SettleOutcome::Stale;
    assert_error(
        &consume::ack(&f.app, "orders", Some("receipt_handle=0:1:2")).await,
        410,
        "receipt handle is stale or expired",
    );
    *f.queue.settle.lock().unwrap() = SettleOutcome::AckedAheadFull;
    assert_error(
        &consume::ack(&f.app, "orders", Some("receipt_handle=0:1:2")).await,
        503,
        "acked-ahead set is full; ack the oldest outstanding message first",
    );
}

#[test]
fn go_durations_parse_as_go_parses_them() {
    use std::time::Duration;
    let cases = [
        ("0", Some(Duration::ZERO)),
        ("0s", Some(Duration::ZERO)),
        ("500ms", Some(Duration::from_millis(500))),
        ("10s", Some(Duration::from_secs(10))),
        ("1.5s", Some(Duration::from_millis(1_500))),
        (".5s", Some(Duration::from_millis(500))),
        ("1m30s", Some(Duration::from_secs(90))),
        ("1h", Some(Duration::from_secs(3_600))),
        ("250us", Some(Duration::from_micros(250))),
        ("250µs", Some(Duration::from_micros(250))),
        ("7ns", Some(Duration::from_nanos(7))),
        ("+2s", Some(Duration::from_secs(2))),
        ("-2s", Some(Duration::ZERO)),
        ("", None),
        ("5", None),
        ("s", None),
        (".s", None),
        ("1.2.3s", None),
        ("5 s", None),
        ("5sec", None),
        ("abc", None),
        ("-", None),
        ("99999999999999999999h", None),
        ("2562047h", Some(Duration::from_secs(2_562_047 * 3_600))),
        ("3000000h", None),
    ];
    for (text, expected) in cases {
        assert_eq!(consume::parse_go_duration(text), expected, "{text:?}");
    }
}

// ---- health ----

#[tokio::test]
async fn readyz_is_503_until_recovery_and_healthz_503_when_shutting_down() {
    let f = fixture().await;
    assert_error(&ops::readyz(&f.app), 503, "not ready: recovery in progress");
    f.app.set_ready();
    assert_reply(&ops::readyz(&f.app), 200, "{\"status\":\"ready\"}\n");
    assert_reply(&ops::healthz(&f.app), 200, "{\"status\":\"ok\"}\n");
    f.app.set_shutting_down();
    assert_reply(
        &ops::healthz(&f.app),
        503,
        "{\"status\":\"shutting down\"}\n",
    );
}
