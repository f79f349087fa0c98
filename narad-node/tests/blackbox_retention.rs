//! Black-box: retention on real `narad` processes. A topic bounded by size keeps each partition
//! between its bound and the bound plus its oldest segment (a segment holds at least one combined
//! commit, so it may be larger than `storage.partition_segment_bytes`) while it gets several times
//! the bound, its oldest
//! offsets advance, replay below them is 410 and everything above them survives a `kill -9`; age
//! retention expires a partition nobody writes to; a queue consumer keeps consuming across a
//! deletion; a three-node cluster enforces retention on every owner.

#![allow(clippy::disallowed_methods)] // Retention acts on its own clock: the waits for it are bounded in real time.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use narad_tests::cluster::Cluster;
use narad_tests::Node;
use serde_json::Value;

/// Retention checks every 200 ms; partition segments of 64 KiB (the smallest allowed).
const ENV: [(&str, &str); 2] = [
    ("NARAD_STORAGE_RETENTION_CHECK_INTERVAL_MS", "200"),
    ("NARAD_STORAGE_PARTITION_SEGMENT_BYTES", "65536"),
];
const BOUND: u64 = 1_048_576;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_narad"))
}

fn create(node: &Node, body: &str) {
    let created = node.post("/v1/topics", body.as_bytes());
    assert_eq!(created.status, 201, "{}", created.text());
}

/// Produces `batches` batches of 32 records of 1 KiB to `partition` (each payload names its number).
fn fill(node: &Node, topic: &str, partition: u32, batches: usize) {
    let mut next = 0;
    for _ in 0..batches {
        let messages: Vec<String> = (0..32)
            .map(|_| {
                next += 1;
                format!(
                    r#"{{"partition":{partition},"payload":"{next:08}-{}"}}"#,
                    "x".repeat(1015)
                )
            })
            .collect();
        let body = format!(r#"{{"messages":[{}]}}"#, messages.join(","));
        let answer = node.post(
            &format!("/v1/topics/{topic}/produce/batch"),
            body.as_bytes(),
        );
        assert_eq!(answer.status, 202, "{}", answer.text());
    }
}

/// The topic's `partition_stats`, by index.
fn stats(node: &Node, topic: &str) -> Vec<Value> {
    let answer = node.get(&format!("/v1/topics/{topic}"));
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()["partition_stats"]
        .as_array()
        .expect("partition_stats")
        .clone()
}

fn number(stat: &Value, field: &str) -> u64 {
    stat[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {stat}"))
}

/// Waits (up to 30 s) until `done` holds for the topic's stats; returns them.
fn wait_stats(node: &Node, topic: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = stats(node, topic);
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "stats never settled: {stats:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A replay read: the status and the body.
fn replay(node: &Node, topic: &str, partition: u64, offset: u64) -> (u16, String) {
    let answer = node.get(&format!(
        "/v1/topics/{topic}/consume?partition={partition}&offset={offset}"
    ));
    (answer.status, answer.text())
}

/// The sizes of the segment files (oldest first) of every partition directory of `topic`.
fn partition_files(data_dir: &Path, topic: &str) -> Vec<Vec<u64>> {
    let mut partitions = Vec::new();
    let topic_dir = data_dir.join("topics").join(topic);
    for incarnation in std::fs::read_dir(&topic_dir).expect("topic dir") {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(incarnation.unwrap().path())
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .collect();
        dirs.sort();
        for dir in dirs {
            // Retention unlinks while this lists: a file gone between the listing and its
            // metadata is simply not there any more.
            let mut files: Vec<(String, u64)> = std::fs::read_dir(&dir)
                .unwrap()
                .filter_map(|entry| {
                    let entry = entry.ok()?;
                    let name = entry.file_name().to_string_lossy().into_owned();
                    Some((name, entry.metadata().ok()?.len()))
                })
                .collect();
            files.sort();
            partitions.push(files.into_iter().map(|(_, len)| len).collect());
        }
    }
    partitions
}

/// Kafka's rule on a partition's files: it holds at least the bound, and without its oldest
/// segment it would hold less (so it holds at most the bound plus that segment).
fn kept_by_the_rule(files: &[u64]) -> bool {
    let total: u64 = files.iter().sum();
    total >= BOUND && files.first().is_some_and(|&oldest| total - oldest < BOUND)
}

/// Waits (up to 10 s: the unlinks follow the decisions on each log's lane) until every partition
/// directory of `topic` listed in `written` (indexes among its directories) keeps its files by the
/// rule; the sizes of every directory's files.
fn wait_files(data_dir: &Path, topic: &str, written: &[usize]) -> Vec<Vec<u64>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let partitions = partition_files(data_dir, topic);
        if written.iter().all(|&index| {
            partitions
                .get(index)
                .is_some_and(|files| kept_by_the_rule(files))
        }) {
            return partitions;
        }
        assert!(
            Instant::now() < deadline,
            "partition files not kept by the rule: {partitions:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every partition committed its `records`, was trimmed, and holds at least the bound.
fn bounded(stats: &[Value], records: u64) -> bool {
    stats.iter().all(|stat| {
        number(stat, "high_watermark") == records
            && number(stat, "oldest_offset") > 0
            && number(stat, "size_bytes") >= BOUND
    })
}

#[test]
fn a_size_bound_keeps_each_partition_between_the_bound_and_its_oldest_segment_more_across_kill_9() {
    let mut node = Node::start_with_env(binary(), &ENV);
    create(
        &node,
        r#"{"name":"logs","partitions":3,"retention_bytes":1048576}"#,
    );
    // About 4 MiB per partition: four times the bound.
    for partition in 0..3 {
        fill(&node, "logs", partition, 128);
    }
    let settled = wait_stats(&node, "logs", |stats| bounded(stats, 128 * 32));
    let files = wait_files(node.data_dir(), "logs", &[0, 1, 2]);
    assert_eq!(files.len(), 3);
    let metrics = node.get("/metrics").text();
    assert!(
        metrics.contains("narad_storage_retention_bytes_deleted_total{topic=\"logs\",partition=\"0\",reason=\"bytes\"}"),
        "{metrics}"
    );
    for (partition, stat) in settled.iter().enumerate() {
        let oldest = number(stat, "oldest_offset");
        let (status, body) = replay(&node, "logs", partition as u64, oldest - 1);
        assert_eq!(status, 410, "{body}");
        assert_eq!(body.trim_end(), r#"{"error":"offset aged out"}"#);
    }
    node.kill();
    node.restart();
    let after = stats(&node, "logs");
    for (partition, (before, after)) in settled.iter().zip(&after).enumerate() {
        let oldest = number(after, "oldest_offset");
        let high = number(after, "high_watermark");
        assert!(oldest >= number(before, "oldest_offset"));
        assert_eq!(high, number(before, "high_watermark"));
        // Every record above the oldest offset reads back, in order.
        for offset in oldest..high {
            let (status, body) = replay(&node, "logs", partition as u64, offset);
            assert_eq!(status, 200, "offset {offset}: {body}");
            let message: Value = serde_json::from_str(&body).unwrap();
            let payload = message["payload"].as_str().unwrap();
            assert_eq!(payload[..8].parse::<u64>().unwrap(), offset + 1);
        }
    }
}

#[test]
fn age_retention_expires_a_partition_nobody_writes_to() {
    let mut env = ENV.to_vec();
    env.push(("NARAD_TOPIC_MIN_RETENTION_MS", "1000"));
    let node = Node::start_with_env(binary(), &env);
    // Below the lowered minimum: still refused.
    let refused = node.post(
        "/v1/topics",
        br#"{"name":"short","partitions":3,"retention_ms":999}"#,
    );
    assert_eq!(refused.status, 400, "{}", refused.text());
    create(
        &node,
        r#"{"name":"short","partitions":3,"retention_ms":1000}"#,
    );
    fill(&node, "short", 1, 2);
    let written = wait_stats(&node, "short", |stats| {
        number(&stats[1], "high_watermark") == 64
    });
    assert_eq!(number(&written[1], "oldest_offset"), 0);
    // Nothing more is written: the active segment rolls once its oldest record passes a second,
    // and goes.
    let expired = wait_stats(&node, "short", |stats| {
        number(&stats[1], "oldest_offset") == 64 && number(&stats[1], "size_bytes") == 0
    });
    assert_eq!(number(&expired[1], "high_watermark"), 64);
    assert_eq!(replay(&node, "short", 1, 0).0, 410);
    assert_eq!(replay(&node, "short", 1, 64).0, 204);
    // The partition goes on at its high watermark.
    fill(&node, "short", 1, 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while replay(&node, "short", 1, 64).0 != 200 {
        assert!(
            Instant::now() < deadline,
            "the new record never became visible"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_queue_consumer_keeps_consuming_across_a_deletion() {
    let node = Node::start_with_env(binary(), &ENV);
    create(
        &node,
        r#"{"name":"jobs","partitions":3,"retention_bytes":1048576}"#,
    );
    // One record is consumed (and acked) first: the cursor sits at offset 1 when retention removes
    // the segments in front of it.
    fill(&node, "jobs", 0, 1);
    let first = next(&node, "jobs");
    assert_eq!(first["offset"], 0);
    ack(&node, "jobs", &first);
    fill(&node, "jobs", 0, 96);
    wait_stats(&node, "jobs", |stats| {
        number(&stats[0], "high_watermark") == 97 * 32 && number(&stats[0], "oldest_offset") > 1
    });
    wait_files(node.data_dir(), "jobs", &[0]);
    let trimmed = stats(&node, "jobs");
    let oldest = number(&trimmed[0], "oldest_offset");
    let high = number(&trimmed[0], "high_watermark");
    // The consumer resumes at the oldest retained record and gets every one of them, in order.
    let mut expected = oldest;
    while expected < high {
        let message = next(&node, "jobs");
        let offset = message["offset"].as_u64().unwrap();
        assert!(
            offset >= oldest,
            "offset {offset} is below the oldest {oldest}"
        );
        assert_eq!(offset, expected);
        ack(&node, "jobs", &message);
        expected += 1;
    }
    let more = node.post("/v1/topics/jobs/produce?partition=0", b"after");
    assert_eq!(more.status, 202);
    let message = next(&node, "jobs");
    assert_eq!(message["offset"].as_u64(), Some(high));
    assert_eq!(message["payload"], "after");
}

fn next(node: &Node, topic: &str) -> Value {
    for _ in 0..10 {
        let answer = node.get(&format!("/v1/topics/{topic}/consume?wait=3s"));
        match answer.status {
            200 => return answer.json(),
            204 => continue,
            status => panic!("consume: {status} {}", answer.text()),
        }
    }
    panic!("nothing to consume in 30 s");
}

fn ack(node: &Node, topic: &str, message: &Value) {
    let handle = message["receipt_handle"].as_str().expect("handle");
    let answer = node.post(
        &format!("/v1/topics/{topic}/ack?receipt_handle={handle}"),
        b"",
    );
    assert_eq!(answer.status, 204, "{}", answer.text());
}

#[test]
fn a_three_node_cluster_enforces_retention_on_every_owner() {
    let cluster = Cluster::start_with_env(binary(), 3, "retention-secret", |_| {
        ENV.iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect()
    });
    let topic = cluster.create_topic_retrying(1, "spread", 3);
    assert_eq!(topic["partitions"], 3);
    let owners = cluster.try_owners(1, "spread").expect("owners");
    let mut distinct = owners.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "one partition per member: {owners:?}");
    let altered = cluster
        .node(1)
        .patch("/v1/topics/spread", br#"{"retention_bytes":1048576}"#);
    assert_eq!(altered.status, 200, "{}", altered.text());
    // Everything through member 1: the other owners get their records over the cluster transport.
    for partition in 0..3 {
        fill(cluster.node(1), "spread", partition, 80);
    }
    for id in cluster.ids() {
        // Each member's view of every partition (forwarded to its owner) shows it trimmed.
        let settled = wait_stats(cluster.node(id), "spread", |stats| bounded(stats, 80 * 32));
        assert_eq!(settled.len(), 3);
    }
    for (index, owner) in owners.iter().enumerate() {
        let data_dir = cluster.node(*owner).data_dir().to_path_buf();
        let files = wait_files(&data_dir, "spread", &[0]);
        assert_eq!(
            files.len(),
            1,
            "member {owner} holds partition {index} alone"
        );
    }
}
