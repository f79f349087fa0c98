//! Black-box tests of the produce path on the real `narad` binary: produce over HTTP, wait until the
//! dispatcher made the records visible, replay them with consume; restarts; the metrics.
//!
//! Each test starts its own node on a fresh data directory and a free loopback port, so they run in
//! parallel. Waits are bounded polls of the node's own observable state (`/metrics`, `partition_stats`).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;

use narad_tests::observe::{
    high_watermarks, metric, metric_sum, metrics_text, wait_backlog_drained, wait_until,
};
use narad_tests::Node;
use serde_json::Value;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_narad"))
}

/// `POST /produce` with an optional raw query; asserts the 202 and its durability header.
fn produce(node: &Node, topic: &str, query: &str, payload: &[u8]) {
    let path = format!("/v1/topics/{topic}/produce{query}");
    let answer = node.post(&path, payload);
    assert_eq!(answer.status, 202, "{path}: {}", answer.text());
    assert_eq!(answer.header("narad-durability"), Some("local-wal-fsync"));
    assert!(answer.body.is_empty());
}

/// Waits until the topic's partitions hold `total` visible records; returns the watermarks.
fn wait_visible(node: &Node, topic: &str, total: u64) -> Vec<u64> {
    wait_until(&format!("{total} visible records in {topic}"), || {
        let marks = high_watermarks(node, topic);
        (marks.iter().sum::<u64>() >= total).then_some(marks)
    })
}

/// `GET /consume?partition=&offset=`: the message JSON, or `None` on 204.
fn replay(node: &Node, topic: &str, partition: u32, offset: u64) -> Option<Value> {
    let path = format!("/v1/topics/{topic}/consume?partition={partition}&offset={offset}");
    let answer = node.get(&path);
    match answer.status {
        200 => Some(answer.json()),
        204 => None,
        status => panic!("{path}: {status} {}", answer.text()),
    }
}

/// Every visible payload of one partition, as JSON values, in offset order.
fn partition_payloads(node: &Node, topic: &str, partition: u32) -> Vec<Value> {
    let mut payloads = Vec::new();
    while let Some(message) = replay(node, topic, partition, payloads.len() as u64) {
        assert_eq!(message["offset"], payloads.len() as u64);
        payloads.push(message["payload"].clone());
    }
    payloads
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes).expect("gzip");
    encoder.finish().expect("gzip")
}

fn zstd(bytes: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(bytes, ruzstd::encoding::CompressionLevel::Fastest)
}

#[test]
fn produce_then_replay_consume() {
    let node = Node::start(binary());
    node.create_topic("orders", 3);
    for index in 0..5 {
        produce(
            &node,
            "orders",
            "?partition=0&key=k",
            format!(r#"{{"n":{index}}}"#).as_bytes(),
        );
    }
    assert_eq!(wait_visible(&node, "orders", 5), [5, 0, 0]);
    let first = node.get("/v1/topics/orders/consume?partition=0&offset=0");
    assert_eq!(first.status, 200);
    let timestamp = first.json()["timestamp"].as_u64().expect("timestamp");
    assert_eq!(
        first.text(),
        format!(
            "{{\"topic\":\"orders\",\"partition\":0,\"offset\":0,\"key\":\"k\",\"payload\":{{\"n\":0}},\"timestamp\":{timestamp}}}\n"
        )
    );
    let payloads = partition_payloads(&node, "orders", 0);
    let expected: Vec<Value> = (0..5).map(|n| serde_json::json!({ "n": n })).collect();
    assert_eq!(payloads, expected, "replayed in produce order");
    let past_end = node.get("/v1/topics/orders/consume?partition=0&offset=5");
    assert_eq!((past_end.status, past_end.body.len()), (204, 0));
    let stats = node.get("/v1/topics/orders?partition=0").json();
    assert_eq!(stats["partition_stats"][0]["next_offset"], 5);
    assert_eq!(stats["partition_stats"][0]["segments"], 1);
}

#[test]
fn keys_pin_to_their_fnv_partitions_and_partition_pins() {
    let node = Node::start(binary());
    node.create_topic("three", 3);
    node.create_topic("eight", 8);
    // FNV-1a("customer-42") = 0xfe68adbe: partition 1 of 3, 6 of 8.
    for _ in 0..3 {
        produce(&node, "three", "?key=customer-42", b"a");
        produce(&node, "eight", "?key=customer-42", b"b");
    }
    // An explicit partition wins over the key's hash.
    produce(&node, "eight", "?key=customer-42&partition=2", b"pinned");
    assert_eq!(wait_visible(&node, "three", 3), [0, 3, 0]);
    assert_eq!(wait_visible(&node, "eight", 4), [0, 0, 1, 0, 0, 0, 3, 0]);
    let pinned = replay(&node, "eight", 2, 0).expect("the pinned record");
    assert_eq!(pinned["payload"], "pinned");
    assert_eq!(pinned["key"], "customer-42");
}

#[test]
fn keyless_produces_spread_exactly_evenly() {
    let node = Node::start(binary());
    node.create_topic("spread", 4);
    for index in 0..40 {
        produce(&node, "spread", "", format!("m{index}").as_bytes());
    }
    let batch: Vec<String> = (0..60)
        .map(|index| format!(r#"{{"payload":"b{index}"}}"#))
        .collect();
    let body = format!(r#"{{"messages":[{}]}}"#, batch.join(","));
    let answer = node.post("/v1/topics/spread/produce/batch", body.as_bytes());
    assert_eq!(answer.status, 202, "{}", answer.text());
    assert_eq!(answer.text(), "{\"accepted\":60}\n");
    assert_eq!(wait_visible(&node, "spread", 100), [25, 25, 25, 25]);
    // Keyless records are stored without a key (no invented one).
    let message = replay(&node, "spread", 0, 0).expect("a record");
    assert!(message.get("key").is_none(), "{message}");
}

#[test]
fn a_batch_is_refused_whole_when_one_message_is_bad() {
    let node = Node::start(binary());
    node.create_topic("strict", 3);
    let body = br#"{"messages":[{"payload":"ok"},{"payload":{"a":1}},{"payload":"x","partition":3},{"payload":"late"}]}"#;
    let refused = node.post("/v1/topics/strict/produce/batch", body);
    assert_eq!(refused.status, 400);
    assert_eq!(
        refused.text(),
        "{\"error\":\"invalid argument: messages[2]: partition out of range\"}\n"
    );
    // A good record after it is visible alone: nothing of the refused batch was appended.
    produce(&node, "strict", "?partition=1", b"after");
    let text = wait_backlog_drained(&node);
    assert_eq!(wait_visible(&node, "strict", 1), [0, 1, 0]);
    assert_eq!(
        metric(&text, "narad_ingress_accepted_records_total"),
        Some(1.0)
    );
    assert_eq!(
        replay(&node, "strict", 1, 0).expect("after")["payload"],
        "after"
    );
}

#[test]
fn gzip_and_zstd_batches_are_accepted_and_a_bomb_is_413() {
    let node = Node::start(binary());
    node.create_topic("packed", 3);
    let body = br#"{"messages":[{"payload":"one","partition":0},{"payload":{"two":2},"partition":0},{"payload":"AP8=","payload_encoding":"base64","partition":0}]}"#;
    for (encoding, packed) in [("gzip", gzip(body)), ("zstd", zstd(body))] {
        let answer = node.request(
            "POST",
            "/v1/topics/packed/produce/batch",
            &[("Content-Encoding", encoding)],
            &packed,
        );
        assert_eq!(answer.status, 202, "{encoding}: {}", answer.text());
        assert_eq!(answer.text(), "{\"accepted\":3}\n");
    }
    assert_eq!(wait_visible(&node, "packed", 6), [6, 0, 0]);
    let payloads = partition_payloads(&node, "packed", 0);
    let once = [
        Value::from("one"),
        serde_json::json!({ "two": 2 }),
        Value::from("AP8="),
    ];
    assert_eq!(payloads, [once.clone(), once].concat());

    let unsupported = node.request(
        "POST",
        "/v1/topics/packed/produce/batch",
        &[("Content-Encoding", "br")],
        body,
    );
    assert_eq!(unsupported.status, 415, "{}", unsupported.text());
    // 17 MiB of zeros inflate past the 16 MiB decoded bound from a few KiB on the wire.
    let bomb = gzip(&vec![0u8; 17 * 1024 * 1024]);
    assert!(bomb.len() < 64 * 1024, "bomb is {} bytes", bomb.len());
    let refused = node.request(
        "POST",
        "/v1/topics/packed/produce/batch",
        &[("Content-Encoding", "gzip")],
        &bomb,
    );
    assert_eq!(refused.status, 413, "{}", refused.text());
}

#[test]
fn replay_encodes_json_verbatim_text_as_a_string_and_bytes_as_base64() {
    let node = Node::start(binary());
    node.create_topic("kinds", 3);
    produce(&node, "kinds", "?partition=2", br#"{"b": [1, 2]}"#);
    produce(&node, "kinds", "?partition=2", b"<hello & bye>");
    produce(&node, "kinds", "?partition=2", &[0xff, 0x00, 0xfe]);
    wait_visible(&node, "kinds", 3);
    let text = |offset| {
        let answer = node.get(&format!(
            "/v1/topics/kinds/consume?partition=2&offset={offset}"
        ));
        assert_eq!(answer.status, 200);
        let timestamp = answer.json()["timestamp"].as_u64().expect("timestamp");
        (answer.text(), timestamp)
    };
    let (json, at) = text(0);
    assert_eq!(
        json,
        format!("{{\"topic\":\"kinds\",\"partition\":2,\"offset\":0,\"payload\":{{\"b\": [1, 2]}},\"timestamp\":{at}}}\n")
    );
    let (string, at) = text(1);
    assert_eq!(
        string,
        format!("{{\"topic\":\"kinds\",\"partition\":2,\"offset\":1,\"payload\":\"\\u003chello \\u0026 bye\\u003e\",\"timestamp\":{at}}}\n")
    );
    let (bytes, at) = text(2);
    assert_eq!(
        bytes,
        format!("{{\"topic\":\"kinds\",\"partition\":2,\"offset\":2,\"payload\":\"/wD+\",\"payload_encoding\":\"base64\",\"timestamp\":{at}}}\n")
    );
}

#[test]
fn a_deleted_and_recreated_topic_starts_empty() {
    let node = Node::start(binary());
    node.create_topic("again", 3);
    for _ in 0..4 {
        produce(&node, "again", "?partition=1", b"old");
    }
    assert_eq!(wait_visible(&node, "again", 4), [0, 4, 0]);
    assert_eq!(node.delete("/v1/topics/again").status, 204);
    node.create_topic("again", 3);
    assert_eq!(high_watermarks(&node, "again"), [0, 0, 0]);
    assert_eq!(replay(&node, "again", 1, 0), None);
    produce(&node, "again", "?partition=1", b"new");
    assert_eq!(wait_visible(&node, "again", 1), [0, 1, 0]);
    assert_eq!(replay(&node, "again", 1, 0).expect("new")["payload"], "new");
    assert_eq!(replay(&node, "again", 1, 1), None);
}

#[test]
fn a_restart_replays_undispatched_records_and_keeps_committed_ones() {
    let mut node = Node::start(binary());
    node.create_topic("durable", 4);
    // Committed before the crash.
    for index in 0..20 {
        produce(&node, "durable", "", format!("c{index}").as_bytes());
    }
    wait_backlog_drained(&node);
    // Accepted right before a kill -9: some are likely still undispatched at the kill.
    let mut expected: Vec<String> = (0..20).map(|index| format!("c{index}")).collect();
    for round in 0..5 {
        let batch: Vec<String> = (0..500)
            .map(|index| format!(r#"{{"payload":"r{round}-{index}"}}"#))
            .collect();
        let body = format!(r#"{{"messages":[{}]}}"#, batch.join(","));
        let answer = node.post("/v1/topics/durable/produce/batch", body.as_bytes());
        assert_eq!(answer.status, 202, "{}", answer.text());
        expected.extend((0..500).map(|index| format!("r{round}-{index}")));
    }
    node.restart();
    let started = node
        .log()
        .into_iter()
        .find(|line| line.contains("ingress dispatch starting"))
        .expect("the dispatcher start line");
    eprintln!("after the kill: {started}");
    wait_backlog_drained(&node);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for partition in 0..4 {
        for payload in partition_payloads(&node, "durable", partition) {
            let text = payload.as_str().expect("text payloads").to_string();
            *seen.entry(text).or_default() += 1;
        }
    }
    let missing: Vec<&String> = expected
        .iter()
        .filter(|payload| !seen.contains_key(*payload))
        .collect();
    assert!(
        missing.is_empty(),
        "lost {} records: {missing:?}",
        missing.len()
    );
    let phantoms: Vec<&String> = seen
        .keys()
        .filter(|payload| !expected.contains(payload))
        .collect();
    assert!(phantoms.is_empty(), "never produced: {phantoms:?}");
    let duplicates: usize = seen.values().map(|count| count - 1).sum();
    eprintln!("{} records, {duplicates} duplicates", expected.len());
}

#[test]
fn sigterm_flushes_the_checkpoint_and_exits_zero() {
    let mut node = Node::start(binary());
    node.create_topic("calm", 3);
    for index in 0..10 {
        produce(&node, "calm", "", format!("m{index}").as_bytes());
    }
    wait_backlog_drained(&node);
    let status = node.terminate();
    assert_eq!(status.code(), Some(0), "exit status {status}");
    let checkpoint =
        std::fs::read(node.data_dir().join("ingress/produce/checkpoint")).expect("checkpoint");
    assert_eq!(checkpoint, 10u64.to_be_bytes(), "every record dispatched");
    let node = Node::start_in(binary(), node.data_dir());
    let text = metrics_text(&node);
    assert_eq!(
        metric(&text, "narad_ingress_dispatch_backlog_records"),
        Some(0.0)
    );
    assert_eq!(wait_visible(&node, "calm", 10).iter().sum::<u64>(), 10);
}

#[test]
fn metrics_carry_real_values_after_produces() {
    let node = Node::start(binary());
    node.create_topic("counted", 3);
    for index in 0..6 {
        produce(
            &node,
            "counted",
            "?partition=1",
            format!("m{index}").as_bytes(),
        );
    }
    let body = br#"{"messages":[{"payload":"a","partition":2},{"payload":"bb","partition":2}]}"#;
    assert_eq!(
        node.post("/v1/topics/counted/produce/batch", body).status,
        202
    );
    wait_visible(&node, "counted", 8);
    let text = wait_backlog_drained(&node);
    let series = |name: &str| metric(&text, name).unwrap_or_else(|| panic!("{name} in\n{text}"));
    assert_eq!(series("narad_ingress_accepted_records_total"), 8.0);
    assert_eq!(series("narad_ingress_wal_failed"), 0.0);
    assert_eq!(series("narad_ingress_dispatch_backlog_bytes"), 0.0);
    assert_eq!(
        series("narad_ingress_dispatch_oldest_record_age_seconds"),
        0.0
    );
    assert_eq!(series("narad_ingress_dispatch_reroutes_total"), 0.0);
    assert_eq!(
        series("narad_messages_produced_total{topic=\"counted\",partition=\"1\"}"),
        6.0
    );
    assert_eq!(
        series("narad_messages_produced_total{topic=\"counted\",partition=\"2\"}"),
        2.0
    );
    assert_eq!(
        series("narad_bytes_produced_total{topic=\"counted\",partition=\"1\"}"),
        12.0
    );
    assert_eq!(
        series("narad_bytes_produced_total{topic=\"counted\",partition=\"2\"}"),
        3.0
    );
    assert_eq!(series("narad_accept_to_visible_seconds_count"), 8.0);
    assert_eq!(series("narad_ingress_wal_group_commit_records_sum"), 8.0);
    let group_commits = series("narad_ingress_wal_group_commit_records_count");
    assert!((1.0..=7.0).contains(&group_commits), "{group_commits}");
    assert!(series("narad_ingress_wal_fsync_duration_seconds_count") >= group_commits);
    assert!(series("narad_ingress_dispatch_commit_duration_seconds_count") >= 2.0);
    assert_eq!(
        series("narad_errors_total{component=\"http\",kind=\"5xx\"}"),
        0.0
    );
    assert!(metric_sum(&text, "narad_http_requests_total") >= 9.0);
}

/// The disk guard's file system: a 64 MiB tmpfs when this process may mount one (root, with the
/// capability), unmounted when dropped (after the node, which is declared later and so dropped
/// first), else a directory on the test's own file system.
struct SmallFs {
    dir: tempfile::TempDir,
    tmpfs: bool,
}

/// Size of the tmpfs.
const SMALL_FS_BYTES: u64 = 64 << 20;

impl SmallFs {
    fn new() -> SmallFs {
        let dir = tempfile::tempdir().expect("temporary dir");
        let tmpfs = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={SMALL_FS_BYTES}")])
            .arg("tmpfs")
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        SmallFs { dir, tmpfs }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Bytes an unprivileged writer may still allocate there (what the node's guard reads).
    fn available(&self) -> u64 {
        let stat = rustix::fs::statvfs(self.path()).expect("statvfs");
        stat.f_bavail * stat.f_frsize
    }

    /// Writes `bytes` of real (allocated, synced) data to `name`.
    fn fill(&self, name: &str, bytes: u64) {
        let mut file = std::fs::File::create(self.path().join(name)).expect("filler");
        let chunk = vec![0x5a_u8; 1 << 20];
        let mut left = bytes;
        while left > 0 {
            let step = left.min(chunk.len() as u64) as usize;
            file.write_all(&chunk[..step]).expect("filler fits");
            left -= step as u64;
        }
        file.sync_all().expect("filler synced");
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        if self.tmpfs {
            let unmounted = std::process::Command::new("umount")
                .arg(self.dir.path())
                .status()
                .is_ok_and(|status| status.success());
            if !unmounted {
                // Still busy: detach it now, the kernel frees it once the last user lets go.
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(self.dir.path())
                    .status();
            }
        }
    }
}

/// One produce of `{"n": n}` (single, or a batch of one when `batch`): its status, and the body of a
/// refusal.
fn try_produce(node: &Node, n: u64, batch: bool) -> (u16, String) {
    let payload = format!(r#"{{"n":{n}}}"#);
    let answer = if batch {
        let body = format!(r#"{{"messages":[{{"payload":{payload}}}]}}"#);
        node.post("/v1/topics/guarded/produce/batch", body.as_bytes())
    } else {
        node.post("/v1/topics/guarded/produce", payload.as_bytes())
    };
    (answer.status, answer.text())
}

#[test]
fn the_disk_guard_answers_507_on_a_full_file_system_and_202_again_once_space_is_freed() {
    let fs = SmallFs::new();
    // The floor: a quarter of the tmpfs; on a shared file system, what is free now less a margin
    // larger than what the node writes on its own, so the filler below crosses it.
    let margin = 32 << 20;
    let floor = if fs.tmpfs {
        SMALL_FS_BYTES / 4
    } else {
        fs.available().saturating_sub(margin)
    };
    let floor_text = floor.to_string();
    let node = Node::start_in_with_env(
        binary(),
        &fs.path().join("data"),
        &[("NARAD_STORAGE_MIN_FREE_BYTES", &floor_text)],
    );
    node.create_topic("guarded", 3);
    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    let mut next = 0u64;
    for _ in 0..5 {
        assert_eq!(try_produce(&node, next, next % 2 == 1).0, 202);
        accepted.push(next);
        next += 1;
    }
    let gauge = |name: &str| metric(&metrics_text(&node), name).unwrap_or(-1.0);
    assert_eq!(gauge("narad_disk_guard_active"), 0.0);

    // Fill the file system to 8 MiB under the floor: produces turn 507 within a sample or two.
    fs.fill("filler", fs.available() - floor + (8 << 20));
    wait_until("a 507", || {
        let (status, text) = try_produce(&node, next, false);
        next += 1;
        match status {
            202 => accepted.push(next - 1),
            507 => {
                assert_eq!(text, "{\"error\":\"insufficient storage\"}\n");
                refused.push(next - 1);
                return Some(());
            }
            other => panic!("{other}: {text}"),
        }
        None
    });
    for batch in [false, true, false, true] {
        let (status, text) = try_produce(&node, next, batch);
        assert_eq!(
            (status, text.as_str()),
            (507, "{\"error\":\"insufficient storage\"}\n")
        );
        refused.push(next);
        next += 1;
    }
    assert_eq!(node.get("/readyz").status, 200, "ready all along");
    assert_eq!(gauge("narad_disk_guard_active"), 1.0);
    let available = gauge("narad_data_dir_available_bytes");
    assert!(available >= 0.0 && available < floor as f64, "{available}");

    // An operator frees space: produces are taken again, by themselves.
    std::fs::remove_file(fs.path().join("filler")).expect("filler removed");
    wait_until("a 202 again", || {
        let (status, text) = try_produce(&node, next, true);
        next += 1;
        match status {
            202 => {
                accepted.push(next - 1);
                return Some(());
            }
            507 => refused.push(next - 1),
            other => panic!("{other}: {text}"),
        }
        None
    });
    for _ in 0..5 {
        assert_eq!(try_produce(&node, next, false).0, 202);
        accepted.push(next);
        next += 1;
    }
    assert_eq!(gauge("narad_disk_guard_active"), 0.0);
    assert!(gauge("narad_data_dir_size_bytes") > 0.0);

    // What got a 202 is there, and nothing that got a 507.
    wait_visible(&node, "guarded", accepted.len() as u64);
    let mut stored: Vec<u64> = (0..3)
        .flat_map(|partition| partition_payloads(&node, "guarded", partition))
        .map(|payload| payload["n"].as_u64().expect("a number"))
        .collect();
    stored.sort_unstable();
    assert_eq!(stored, accepted, "refused: {refused:?}");
    assert!(refused.len() >= 5);
}
