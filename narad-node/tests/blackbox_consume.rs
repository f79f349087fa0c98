//! Black-box tests of queue-mode consume on the real `narad` binary, mirroring Narad's consume tests:
//! produce and consume, long polls, acks and the cursor, lease expiry, nack and extend, the acked-ahead
//! cap, and a kill -9 under a consume load.
//!
//! Each test starts its own node on a fresh data directory and a free loopback port.
#![allow(clippy::disallowed_methods)] // Long polls are bounded in real time: the real clock.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use narad_tests::observe::wait_until;
use narad_tests::Node;
use serde_json::Value;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_narad"))
}

fn create(node: &Node, body: &str) {
    let created = node.post("/v1/topics", body.as_bytes());
    assert_eq!(created.status, 201, "{}", created.text());
}

fn produce(node: &Node, topic: &str, query: &str, payload: &str) {
    let answer = node.post(
        &format!("/v1/topics/{topic}/produce{query}"),
        payload.as_bytes(),
    );
    assert_eq!(answer.status, 202, "{}", answer.text());
}

/// A queue-mode consume: the message, or `None` on 204.
fn consume(node: &Node, topic: &str, query: &str) -> Option<Value> {
    let path = format!("/v1/topics/{topic}/consume?{query}");
    let answer = node.get(&path);
    match answer.status {
        200 => {
            let message = answer.json();
            assert!(message["receipt_handle"].is_string(), "{message}");
            Some(message)
        }
        204 => None,
        status => panic!("{path}: {status} {}", answer.text()),
    }
}

/// Consumes until a message arrives (each poll waits up to 5 s, 30 s in all).
fn next(node: &Node, topic: &str, query: &str) -> Value {
    for _ in 0..6 {
        let query = if query.is_empty() {
            "wait=5s".to_string()
        } else {
            format!("{query}&wait=5s")
        };
        if let Some(message) = consume(node, topic, &query) {
            return message;
        }
    }
    panic!("no message in {topic} within 30 s");
}

fn handle(message: &Value) -> String {
    message["receipt_handle"]
        .as_str()
        .expect("handle")
        .to_string()
}

/// `POST /ack`; the status.
fn ack(node: &Node, topic: &str, handle: &str, extend: Option<&str>) -> u16 {
    let extend = extend.map_or(String::new(), |value| format!("&extend={value}"));
    node.post(
        &format!("/v1/topics/{topic}/ack?receipt_handle={handle}{extend}"),
        b"",
    )
    .status
}

fn payload(message: &Value) -> String {
    message["payload"]
        .as_str()
        .expect("string payload")
        .to_string()
}

#[test]
fn produce_then_consume_and_ack_every_message_once() {
    let node = Node::start(binary());
    create(&node, r#"{"name":"orders","partitions":3}"#);
    let produced: BTreeSet<String> = (0..30).map(|index| format!("m-{index}")).collect();
    for message in &produced {
        produce(&node, "orders", "", message);
    }
    let mut consumed = BTreeSet::new();
    let mut partitions = BTreeSet::new();
    while consumed.len() < produced.len() {
        let message = next(&node, "orders", "");
        let [partition, offset, _nonce]: [u64; 3] = handle(&message)
            .split(':')
            .map(|part| part.parse().expect("decimal"))
            .collect::<Vec<_>>()
            .try_into()
            .expect("partition:offset:nonce");
        assert_eq!(
            (message["partition"].as_u64(), message["offset"].as_u64()),
            (Some(partition), Some(offset))
        );
        partitions.insert(partition);
        assert!(consumed.insert(payload(&message)), "delivered twice");
        assert_eq!(ack(&node, "orders", &handle(&message), None), 204);
    }
    assert_eq!(consumed, produced);
    assert_eq!(partitions.len(), 3, "every partition is served");
    assert_eq!(consume(&node, "orders", "wait=0s"), None);
}

#[test]
fn a_long_poll_returns_on_arrival_and_times_out_with_204() {
    let node = Node::start(binary());
    create(&node, r#"{"name":"orders","partitions":3}"#);
    let started = Instant::now();
    assert_eq!(consume(&node, "orders", "wait=700ms"), None);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(650),
        "answered after {waited:?}"
    );

    let addr = node.addr();
    let poller = std::thread::spawn(move || {
        let started = Instant::now();
        let answer = narad_tests::http(addr, "GET", "/v1/topics/orders/consume?wait=10s", &[], b"")
            .expect("long poll");
        let message = (answer.status == 200).then(|| answer.json());
        (message, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(500));
    produce(&node, "orders", "", "late");
    let (message, waited) = poller.join().expect("poller");
    let message = message.expect("the long poll returns the message");
    assert_eq!(payload(&message), "late");
    assert!(
        waited < Duration::from_secs(8),
        "the poll returned on arrival, not at its 10 s end: {waited:?}"
    );
}

#[test]
fn an_ack_advances_the_cursor_across_a_restart() {
    let mut node = Node::start(binary());
    create(&node, r#"{"name":"orders","partitions":3}"#);
    for index in 0..4 {
        produce(&node, "orders", "?partition=1", &format!("m-{index}"));
    }
    for index in 0..2 {
        let message = next(&node, "orders", "partition=1");
        assert_eq!(payload(&message), format!("m-{index}"));
        assert_eq!(ack(&node, "orders", &handle(&message), None), 204);
    }
    assert!(node.terminate().success());
    node.restart();
    let message = next(&node, "orders", "partition=1");
    assert_eq!(
        payload(&message),
        "m-2",
        "the acked records are not redelivered"
    );
}

#[test]
fn an_expired_lease_redelivers_and_its_old_handle_is_410() {
    let node = Node::start(binary());
    create(
        &node,
        r#"{"name":"orders","partitions":3,"visibility_timeout_ms":1000}"#,
    );
    produce(&node, "orders", "?partition=0", "only");
    let first = next(&node, "orders", "partition=0");
    assert_eq!(consume(&node, "orders", "partition=0&wait=0s"), None);
    // The long poll is woken by the lease's end.
    let again = consume(&node, "orders", "partition=0&wait=5s").expect("redelivered");
    assert_eq!(
        (payload(&again), again["offset"].clone()),
        ("only".to_string(), first["offset"].clone())
    );
    assert_ne!(handle(&again), handle(&first));
    assert_eq!(ack(&node, "orders", &handle(&first), None), 410);
    assert_eq!(ack(&node, "orders", &handle(&again), None), 204);
    assert_eq!(ack(&node, "orders", &handle(&again), None), 410);
}

#[test]
fn a_nack_redelivers_at_once_and_an_extend_keeps_the_lease() {
    let node = Node::start(binary());
    create(
        &node,
        r#"{"name":"orders","partitions":3,"visibility_timeout_ms":1500}"#,
    );
    produce(&node, "orders", "?partition=2", "job");
    let first = next(&node, "orders", "partition=2");
    assert_eq!(ack(&node, "orders", &handle(&first), Some("0")), 204);
    let again = consume(&node, "orders", "partition=2&wait=0s").expect("a nack redelivers at once");
    assert_eq!(payload(&again), "job");

    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(800));
        assert_eq!(ack(&node, "orders", &handle(&again), Some("true")), 204);
    }
    // 2.4 s after the lease began, past its 1.5 s: the extends kept it.
    assert_eq!(consume(&node, "orders", "partition=2&wait=0s"), None);
    assert_eq!(ack(&node, "orders", &handle(&again), None), 204);
}

#[test]
fn the_acked_ahead_cap_answers_503_until_the_head_is_acked() {
    let node = Node::start(binary());
    create(
        &node,
        r#"{"name":"orders","partitions":3,"max_acked_ahead_per_partition":1}"#,
    );
    for index in 0..3 {
        produce(&node, "orders", "?partition=0", &format!("m-{index}"));
    }
    let messages: Vec<Value> = (0..3)
        .map(|_| next(&node, "orders", "partition=0"))
        .collect();
    assert_eq!(ack(&node, "orders", &handle(&messages[1]), None), 204);
    let refused = node.post(
        &format!(
            "/v1/topics/orders/ack?receipt_handle={}",
            handle(&messages[2])
        ),
        b"",
    );
    assert_eq!(refused.status, 503);
    assert!(refused.json()["error"].is_string());
    assert_eq!(ack(&node, "orders", &handle(&messages[0]), None), 204);
    assert_eq!(ack(&node, "orders", &handle(&messages[2]), None), 204);
}

#[test]
fn malformed_and_foreign_handles() {
    let node = Node::start(binary());
    create(&node, r#"{"name":"orders","partitions":3}"#);
    create(&node, r#"{"name":"billing","partitions":3}"#);
    produce(&node, "orders", "?partition=0", "x");
    let message = next(&node, "orders", "partition=0");
    assert_eq!(ack(&node, "orders", "0:0", None), 400);
    assert_eq!(ack(&node, "orders", &handle(&message), Some("maybe")), 400);
    assert_eq!(ack(&node, "billing", &handle(&message), None), 410);
    assert_eq!(ack(&node, "nope", &handle(&message), None), 404);
    assert_eq!(node.get("/v1/topics/orders/consume?wait=soon").status, 400);
    assert_eq!(
        node.get("/v1/topics/orders/consume?wait=3000000h").status,
        400
    );
    // A topic segment that is not UTF-8 names no topic: JSON 404, not a plain-text 400.
    let strange = node.get("/v1/topics/%FF/consume");
    assert_eq!(
        (strange.status, strange.json()["error"].as_str()),
        (404, Some("topic not found"))
    );
    assert_eq!(ack(&node, "orders", &handle(&message), None), 204);
}

/// Consumes and acks until stopped; records what it saw.
#[derive(Default)]
struct Seen {
    delivered: Vec<String>,
    acked: Vec<String>,
}

#[test]
fn kill_9_under_a_consume_load_keeps_the_cursor_and_delivers_everything() {
    let mut node = Node::start(binary());
    create(&node, r#"{"name":"orders","partitions":3}"#);
    let produced: BTreeSet<String> = (0..300).map(|index| format!("m-{index:03}")).collect();
    for message in &produced {
        produce(&node, "orders", "", message);
    }
    // Phase 1: 100 acked, then a pause longer than the cursor flush interval.
    let mut before = BTreeSet::new();
    while before.len() < 100 {
        let message = next(&node, "orders", "");
        assert_eq!(ack(&node, "orders", &handle(&message), None), 204);
        before.insert(payload(&message));
    }
    std::thread::sleep(Duration::from_millis(500));

    // Phase 2: a consumer thread runs while the node is killed.
    let addr = node.addr();
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let consumer = {
        let (stop, seen) = (stop.clone(), seen.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok(answer) =
                    narad_tests::http(addr, "GET", "/v1/topics/orders/consume?wait=1s", &[], b"")
                else {
                    continue;
                };
                if answer.status != 200 {
                    continue;
                }
                let message = answer.json();
                let text = payload(&message);
                seen.lock().unwrap().delivered.push(text.clone());
                let path = format!("/v1/topics/orders/ack?receipt_handle={}", handle(&message));
                if let Ok(acked) = narad_tests::http(addr, "POST", &path, &[], b"") {
                    if acked.status == 204 {
                        seen.lock().unwrap().acked.push(text);
                    }
                }
            }
        })
    };
    wait_until("the consumer acked 50 more", || {
        (seen.lock().unwrap().acked.len() >= 50).then_some(())
    });
    node.kill();
    stop.store(true, Ordering::Relaxed);
    consumer.join().expect("consumer");
    node.restart();

    // Phase 3: drain.
    let mut after = Vec::new();
    while let Some(message) = consume(&node, "orders", "wait=2s") {
        assert_eq!(ack(&node, "orders", &handle(&message), None), 204);
        after.push(payload(&message));
    }
    let seen = seen.lock().unwrap();
    let delivered: BTreeSet<String> = before
        .iter()
        .chain(&seen.delivered)
        .chain(&after)
        .cloned()
        .collect();
    assert_eq!(delivered, produced, "every produced message is delivered");
    let acked: BTreeSet<&String> = before.iter().chain(&seen.acked).chain(&after).collect();
    assert!(acked.iter().all(|text| produced.contains(*text)));
    let redelivered: Vec<&String> = after.iter().filter(|text| before.contains(*text)).collect();
    assert!(
        redelivered.is_empty(),
        "the cursor flushed before the kill is kept: {redelivered:?} came again"
    );
    let counts: BTreeMap<&String, usize> =
        seen.delivered
            .iter()
            .chain(&after)
            .fold(BTreeMap::new(), |mut counts, text| {
                *counts.entry(text).or_default() += 1;
                counts
            });
    eprintln!(
        "kill -9 under consume: {} acked before, {} delivered during ({} acked), {} after; {} delivered twice",
        before.len(),
        seen.delivered.len(),
        seen.acked.len(),
        after.len(),
        counts.values().filter(|count| **count > 1).count()
    );
}
