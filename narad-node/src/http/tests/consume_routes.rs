//! Replay and queue mode: rendering, receipt handles, acks and refusals.

use super::*;

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
    assert_error(&read(9).await, 410, "offset aged out");
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
