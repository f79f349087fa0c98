//! Batch produce: encodings, limits and refusals.

use super::*;

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
