//! Produce routes: `POST /v1/topics/{t}/produce?key=&partition=` (raw body) and
//! `POST /v1/topics/{t}/produce/batch` (JSON, optionally gzip or zstd).
//!
//! Single produce, in the surface's check order: query (`key`, `partition`: repeated, malformed →
//! 400) → body (over 1 MiB → 413, empty → 400 `message required`) → topic (404) → schema (400, counted in
//! `produce_rejections_total{reason="schema"}`) → partition range (400) → free space (507) → WAL append
//! and group commit → 202 with no body and `Narad-Durability: local-wal-fsync`.
//!
//! Batch: `Content-Encoding` (absent/`identity`, `gzip`, `zstd`; others 415) → raw body over 16 MiB →
//! 413 → decoding, bounded at 16 MiB of output (a decompression bomb is a 413 once the bound is passed,
//! never a larger allocation) → strict JSON `{"messages":[…]}` with 1–1,000 messages (the parser stops
//! at the 1,001st) → topic (404) → every message checked in order (key, partition, payload, schema,
//! partition range); the first failure refuses the whole batch with 400 `messages[i]: …` → free space
//! (507) → one `append_many` → 202 `{"accepted":N}`.
//!
//! Free space: while the node's disk guard finds less free space on the data directory's file system
//! than `storage.min_free_bytes`, both routes answer 507 `{"error":"insufficient storage"}` without
//! touching the WAL (or the keyless rotation), so a filling disk refuses new records instead of
//! latching the WAL on ENOSPC; they take records again by themselves once there is space.
//!
//! Draining: while the replica records this node as draining (a decommission), both routes answer
//! 503 `{"error":"member is draining"}` after the free-space check: clients go to other nodes, and
//! the node's WAL drains to zero backlog.
//!
//! A payload is any JSON value: a JSON string is stored as its text, any other value as its JSON text
//! verbatim (as it appeared in the body); with `"payload_encoding":"base64"` the string is decoded
//! (standard alphabet, padded). An empty payload is refused like an empty single produce.
//!
//! Partition choice: `partition` pins; a non-empty key hashes (FNV-1a 32-bit mod partitions); otherwise
//! the topic's keyless rotation on this node. Keyless records are stored without a key. Partitions are
//! picked only after every check passed, so a refused batch does not move the rotation.
//!
//! A failed append (WAL latched) is a 500 `{"error":"produce failed"}`, logged as `http server error`;
//! no WAL accepting appends (start-up, shutdown) is a 503. The router counts both in
//! `errors_total{component="http",kind="5xx"}`.

use std::fmt;
use std::io::Read;

use base64::Engine as _;
use narad_core::codec::wal::ProduceRecord;
use narad_core::ids::PartitionId;
use narad_core::metastore::Topic;
use narad_core::routing::{PartitionChoice, PickError};
use serde::de::{Deserializer, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::reply::{JsonObject, DURABILITY_HEADER};
use super::BODY_BYTES_MAX;
use super::{parse_index, schema, App, Body, Query, Reply, BATCH_BODY_BYTES_MAX};
use crate::ingress::WalError;
use crate::metrics::RejectionLabels;
use narad_core::wal::AppendError;

/// Largest message payload: 1 MiB (the single-produce body limit).
pub const PAYLOAD_BYTES_MAX: usize = BODY_BYTES_MAX;
/// Largest key.
pub const KEY_BYTES_MAX: usize = 64 * 1024;
/// Most messages in one batch.
pub const BATCH_MESSAGES_MAX: usize = 1000;

/// Why one message was refused (the batch prefixes `messages[i]: `).
#[derive(Debug)]
enum MessageError {
    KeyTooLong,
    PartitionMalformed,
    PayloadRequired,
    PayloadTooLarge,
    PayloadEncoding(String),
    PayloadNotBase64,
    Schema(String),
    PartitionOutOfRange,
}

impl fmt::Display for MessageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MessageError::KeyTooLong => write!(f, "key too long (max {KEY_BYTES_MAX} bytes)"),
            MessageError::PartitionMalformed => {
                write!(f, "partition must be a non-negative integer")
            }
            MessageError::PayloadRequired => write!(f, "message required"),
            MessageError::PayloadTooLarge => {
                write!(f, "payload too large (max {PAYLOAD_BYTES_MAX} bytes)")
            }
            MessageError::PayloadEncoding(encoding) => {
                write!(
                    f,
                    "unsupported payload_encoding {encoding:?} (only \"base64\")"
                )
            }
            MessageError::PayloadNotBase64 => write!(f, "payload is not valid base64"),
            MessageError::Schema(reason) => {
                write!(f, "message does not match the topic schema: {reason}")
            }
            MessageError::PartitionOutOfRange => write!(f, "partition out of range"),
        }
    }
}

/// A message that passed every check, partition not yet picked.
struct Checked {
    key: Option<Vec<u8>>,
    pinned: Option<PartitionId>,
    payload: Vec<u8>,
}

fn check_key(key: Option<&str>) -> Result<Option<Vec<u8>>, MessageError> {
    match key {
        None | Some("") => Ok(None),
        Some(key) if key.len() > KEY_BYTES_MAX => Err(MessageError::KeyTooLong),
        Some(key) => Ok(Some(key.as_bytes().to_vec())),
    }
}

/// Schema, then partition range: the checks that need the topic.
fn check_against_topic(
    app: &App,
    topic: &Topic,
    pinned: Option<u64>,
    payload: &[u8],
) -> Result<Option<PartitionId>, MessageError> {
    if let Some(text) = &topic.schema {
        let outcome = app
            .schemas
            .validator(topic.id, topic.schema_version, text)
            .and_then(|validator| schema::check_payload(&validator, payload));
        if let Err(reason) = outcome {
            app.metrics
                .produce_rejections
                .get_or_create(&RejectionLabels {
                    topic: topic.name.clone(),
                    reason: "schema".to_string(),
                })
                .inc();
            return Err(MessageError::Schema(reason));
        }
    }
    match pinned {
        Some(index) if index >= u64::from(topic.partitions()) => {
            Err(MessageError::PartitionOutOfRange)
        }
        Some(index) => Ok(Some(PartitionId(index as u32))),
        None => Ok(None),
    }
}

/// The checks of an HTTP produce, for a synchronous `Produce` from a peer: key length, payload size,
/// schema and partition range (the topic is resolved already). The refusal's text is the HTTP one.
pub fn check_sync_produce(
    app: &App,
    topic: &Topic,
    key: Option<&[u8]>,
    pinned: Option<PartitionId>,
    payload: &[u8],
) -> Result<(), String> {
    if key.is_some_and(|key| key.len() > KEY_BYTES_MAX) {
        return Err(MessageError::KeyTooLong.to_string());
    }
    check_payload_len(payload).map_err(|error| error.to_string())?;
    check_against_topic(app, topic, pinned.map(|p| u64::from(p.0)), payload)
        .map(|_| ())
        .map_err(|error| error.to_string())
}

/// Picks the partition of a checked message and builds its WAL record.
fn record(
    app: &App,
    topic: &Topic,
    message: Checked,
    timestamp_ms: u64,
) -> Result<ProduceRecord, Reply> {
    let choice = match (message.pinned, &message.key) {
        (Some(pinned), _) => PartitionChoice::Pinned(pinned),
        (None, Some(key)) => PartitionChoice::Key(key),
        (None, None) => PartitionChoice::Keyless,
    };
    let partition = app
        .pick_partition(&topic.name, topic.partitions(), choice)
        .map_err(|error| match error {
            PickError::OutOfRange { .. } => invalid(&MessageError::PartitionOutOfRange),
            PickError::NoPartitions | PickError::NoLiveOwner => {
                tracing::error!(topic = topic.name, %error, "no partition to accept into");
                Reply::error(500, "produce failed")
            }
        })?;
    Ok(ProduceRecord {
        topic: topic.name.clone(),
        topic_id: Some(topic.id),
        key: message.key,
        partition,
        timestamp_ms,
        payload: message.payload,
    })
}

fn invalid(error: &MessageError) -> Reply {
    let prefix = match error {
        MessageError::PayloadRequired => "",
        MessageError::KeyTooLong
        | MessageError::PartitionMalformed
        | MessageError::PayloadTooLarge
        | MessageError::PayloadEncoding(_)
        | MessageError::PayloadNotBase64
        | MessageError::Schema(_)
        | MessageError::PartitionOutOfRange => "invalid argument: ",
    };
    Reply::error(400, &format!("{prefix}{error}"))
}

fn topic_not_found() -> Reply {
    Reply::error(404, "topic not found")
}

/// 507 while the disk guard holds (see the module doc).
fn check_free_space(app: &App) -> Result<(), Reply> {
    if app.is_insufficient_storage() {
        Err(Reply::error(507, "insufficient storage"))
    } else {
        Ok(())
    }
}

/// The answer to an append, the one place a produce's outcome becomes HTTP: 202 once durable; 503
/// when no WAL takes it or it is overloaded (the client retries elsewhere or later); 500 when the
/// disk failed (the latch holds until restart) or the WAL refused a record the HTTP checks passed.
fn append_reply(app: &App, outcome: Result<(), WalError>, accepted: usize, batch: bool) -> Reply {
    match outcome {
        Ok(()) => {
            app.metrics.ingress_accepted_records.inc_by(accepted as u64);
            let reply = if batch {
                Reply::json(
                    202,
                    JsonObject::new()
                        .number("accepted", accepted as u64)
                        .finish(),
                )
            } else {
                Reply::empty(202)
            };
            reply.with_header(DURABILITY_HEADER)
        }
        Err(
            error @ WalError::Append(
                AppendError::Disk(_)
                | AppendError::Fill { .. }
                | AppendError::RecordTooLarge { .. }
                | AppendError::EmptyRecord { .. },
            ),
        ) => {
            tracing::error!(%error, records = accepted, "http server error");
            Reply::error(500, "produce failed")
        }
        Err(error @ (WalError::Unavailable | WalError::Append(AppendError::Overloaded { .. }))) => {
            tracing::warn!(%error, records = accepted, "produce refused");
            Reply::error(503, "ingress WAL unavailable")
        }
    }
}

/// `POST /v1/topics/{t}/produce?key=&partition=`.
pub async fn produce(app: &App, topic: &str, query: Option<&str>, body: Body) -> Reply {
    match produce_one(app, topic, query, body).await {
        Ok(reply) | Err(reply) => reply,
    }
}

async fn produce_one(
    app: &App,
    topic_name: &str,
    query: Option<&str>,
    body: Body,
) -> Result<Reply, Reply> {
    let query = Query::parse(query);
    let key = check_key(query.single("key")?).map_err(|error| invalid(&error))?;
    let pinned = query
        .single("partition")?
        .map(|value| parse_index("partition", value))
        .transpose()?;
    let payload = match body {
        Body::TooLarge => return Err(Reply::error(413, "request body too large")),
        Body::Bytes(bytes) if bytes.is_empty() => {
            return Err(invalid(&MessageError::PayloadRequired))
        }
        Body::Bytes(bytes) => bytes,
    };
    let view = app.metastore.view();
    let topic = view.state.topic(topic_name).ok_or_else(topic_not_found)?;
    let pinned =
        check_against_topic(app, topic, pinned, &payload).map_err(|error| invalid(&error))?;
    check_free_space(app)?;
    super::cluster::check_not_draining(app)?;
    let message = Checked {
        key,
        pinned,
        payload,
    };
    let record = record(app, topic, message, app.clock.unix_ms())?;
    let outcome = app.sink.append(record).await;
    Ok(append_reply(app, outcome, 1, false))
}

/// A batch body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchRequest<'a> {
    #[serde(borrow, default)]
    messages: BoundedMessages<'a>,
}

/// One batch message.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchMessage<'a> {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    partition: Option<serde_json::Value>,
    #[serde(borrow, default)]
    payload: Option<&'a RawValue>,
    #[serde(default)]
    payload_encoding: Option<String>,
}

/// The message list, whose parser stops at the message past [`BATCH_MESSAGES_MAX`].
#[derive(Default)]
struct BoundedMessages<'a>(Vec<BatchMessage<'a>>);

const TOO_MANY: &str = "too many messages";

impl<'de: 'a, 'a> Deserialize<'de> for BoundedMessages<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bounded<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Bounded<'a> {
            type Value = BoundedMessages<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "an array of messages")
            }
            fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Self::Value, S::Error> {
                let mut messages = Vec::new();
                while let Some(message) = seq.next_element::<BatchMessage<'a>>()? {
                    if messages.len() == BATCH_MESSAGES_MAX {
                        return Err(serde::de::Error::custom(TOO_MANY));
                    }
                    messages.push(message);
                }
                Ok(BoundedMessages(messages))
            }
        }
        deserializer.deserialize_seq(Bounded(std::marker::PhantomData))
    }
}

/// A `Content-Encoding` the batch route reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    Identity,
    Gzip,
    Zstd,
}

fn encoding(header: Option<&str>) -> Result<Encoding, Reply> {
    let value = header.map(|value| value.trim().to_ascii_lowercase());
    match value.as_deref() {
        None | Some("") | Some("identity") => Ok(Encoding::Identity),
        Some("gzip") | Some("x-gzip") => Ok(Encoding::Gzip),
        Some("zstd") => Ok(Encoding::Zstd),
        Some(other) => Err(Reply::error(
            415,
            &format!("unsupported Content-Encoding {other:?} (use gzip or zstd)"),
        )),
    }
}

fn not_valid(name: &str, error: impl fmt::Display) -> Reply {
    Reply::error(
        400,
        &format!("invalid argument: body is not valid {name}: {error}"),
    )
}

fn decoded_too_large() -> Reply {
    Reply::error(413, "decoded request body too large")
}

thread_local! {
    /// The decode buffer, [`BATCH_BODY_BYTES_MAX`] + 1 bytes, kept by the thread between bodies.
    /// A fresh growing `Vec` per body spent most of a decompression bomb's CPU not inflating but
    /// faulting in, zeroing, copying on growth and unmapping up to 32 MiB, and the unmaps interrupt
    /// the async threads' cores as well. The buffer is allocated zeroed (pages the OS maps in on
    /// first write), so a thread holds only as much as the largest body it has decoded.
    static DECODE_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Decodes the body, never holding more than [`BATCH_BODY_BYTES_MAX`] + 1 decoded bytes.
fn decode_body(encoding: Encoding, raw: Vec<u8>) -> Result<Vec<u8>, Reply> {
    let decode: fn(&[u8], &mut [u8]) -> Result<usize, Reply> = match encoding {
        Encoding::Identity => return Ok(raw),
        Encoding::Gzip => inflate_gzip,
        Encoding::Zstd => decode_zstd,
    };
    DECODE_BUFFER.with_borrow_mut(|buffer| {
        if buffer.len() != BATCH_BODY_BYTES_MAX + 1 {
            *buffer = vec![0; BATCH_BODY_BYTES_MAX + 1];
        }
        let filled = decode(&raw, buffer)?;
        if filled > BATCH_BODY_BYTES_MAX {
            return Err(decoded_too_large());
        }
        Ok(buffer[..filled].to_vec())
    })
}

/// Inflates concatenated gzip members into `buffer` until it is full; the count of bytes written.
fn inflate_gzip(raw: &[u8], buffer: &mut [u8]) -> Result<usize, Reply> {
    fill(flate2::read::MultiGzDecoder::new(raw), buffer).map_err(|error| not_valid("gzip", error))
}

/// Decodes zstd frames into `buffer` until it is full; the count of bytes written. Concatenated
/// frames decode as one stream, like the zstd tool does.
fn decode_zstd(raw: &[u8], buffer: &mut [u8]) -> Result<usize, Reply> {
    let mut input = raw;
    let mut filled = 0;
    while !input.is_empty() && filled < buffer.len() {
        let before = input.len();
        let decoder = ruzstd::decoding::StreamingDecoder::new(&mut input)
            .map_err(|error| not_valid("zstd", error))?;
        filled += fill(decoder, &mut buffer[filled..]).map_err(|error| not_valid("zstd", error))?;
        if input.len() == before {
            return Err(not_valid("zstd", "no progress"));
        }
    }
    Ok(filled)
}

/// Reads from `reader` until it ends or `buffer` is full; the count of bytes read.
fn fill(mut reader: impl Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

fn payload_bytes(message: &BatchMessage<'_>) -> Result<Vec<u8>, MessageError> {
    let raw = message.payload.ok_or(MessageError::PayloadRequired)?;
    let text = raw.get();
    let bytes = match message.payload_encoding.as_deref() {
        None | Some("") => {
            if text.starts_with('"') {
                serde_json::from_str::<String>(text)
                    .map_err(|_| MessageError::PayloadRequired)?
                    .into_bytes()
            } else {
                text.as_bytes().to_vec()
            }
        }
        Some("base64") => {
            let encoded: String =
                serde_json::from_str(text).map_err(|_| MessageError::PayloadNotBase64)?;
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|_| MessageError::PayloadNotBase64)?
        }
        Some(other) => return Err(MessageError::PayloadEncoding(other.to_string())),
    };
    check_payload_len(&bytes)?;
    Ok(bytes)
}

/// A message's payload is neither empty nor over [`PAYLOAD_BYTES_MAX`].
fn check_payload_len(payload: &[u8]) -> Result<(), MessageError> {
    if payload.is_empty() {
        return Err(MessageError::PayloadRequired);
    }
    if payload.len() > PAYLOAD_BYTES_MAX {
        return Err(MessageError::PayloadTooLarge);
    }
    Ok(())
}

fn check_batch_message(
    app: &App,
    topic: &Topic,
    message: &BatchMessage<'_>,
) -> Result<Checked, MessageError> {
    let key = check_key(message.key.as_deref())?;
    let pinned = match &message.partition {
        None | Some(serde_json::Value::Null) => None,
        Some(value) => Some(value.as_u64().ok_or(MessageError::PartitionMalformed)?),
    };
    let payload = payload_bytes(message)?;
    let pinned = check_against_topic(app, topic, pinned, &payload)?;
    Ok(Checked {
        key,
        pinned,
        payload,
    })
}

/// `POST /v1/topics/{t}/produce/batch`.
pub async fn produce_batch(
    app: &App,
    topic: &str,
    content_encoding: Option<&str>,
    body: Body,
) -> Reply {
    match produce_many(app, topic, content_encoding, body).await {
        Ok(reply) | Err(reply) => reply,
    }
}

async fn produce_many(
    app: &App,
    topic_name: &str,
    content_encoding: Option<&str>,
    body: Body,
) -> Result<Reply, Reply> {
    let encoding = encoding(content_encoding)?;
    let raw = match body {
        Body::TooLarge => return Err(Reply::error(413, "request body too large")),
        Body::Bytes(bytes) => bytes,
    };
    let decoded = if encoding == Encoding::Identity {
        raw
    } else {
        let _permit = app
            .decoding
            .acquire()
            .await
            .expect("the semaphore is never closed");
        super::offload(move || decode_body(encoding, raw)).await?
    };
    let request = parse_batch(&decoded)?;
    let messages = request.messages.0;
    if messages.is_empty() {
        return Err(Reply::error(400, "invalid argument: messages required"));
    }
    let view = app.metastore.view();
    let topic = view.state.topic(topic_name).ok_or_else(topic_not_found)?;
    let mut checked = Vec::with_capacity(messages.len());
    for (index, message) in messages.iter().enumerate() {
        let message = check_batch_message(app, topic, message).map_err(|error| {
            Reply::error(
                400,
                &format!("invalid argument: messages[{index}]: {error}"),
            )
        })?;
        checked.push(message);
    }
    check_free_space(app)?;
    super::cluster::check_not_draining(app)?;
    let timestamp_ms = app.clock.unix_ms();
    let records = checked
        .into_iter()
        .map(|message| record(app, topic, message, timestamp_ms))
        .collect::<Result<Vec<ProduceRecord>, Reply>>()?;
    let accepted = records.len();
    let outcome = app.sink.append_many(records).await;
    Ok(append_reply(app, outcome, accepted, true))
}

/// The node-free part of the batch body path: the Content-Encoding, the bounded decode, the strict
/// JSON parse and each message's payload bytes (the fuzz target `batch_body` drives it). `Err` is the
/// answer the route gives; never a panic, never more than 16 MiB + 1 decoded bytes held.
pub fn decode_batch_payloads(
    content_encoding: Option<&str>,
    raw: Vec<u8>,
) -> Result<Vec<Result<Vec<u8>, String>>, Reply> {
    let decoded = decode_body(encoding(content_encoding)?, raw)?;
    let request = parse_batch(&decoded)?;
    Ok(request
        .messages
        .0
        .iter()
        .map(|message| payload_bytes(message).map_err(|error| error.to_string()))
        .collect())
}

fn parse_batch(bytes: &[u8]) -> Result<BatchRequest<'_>, Reply> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    BatchRequest::deserialize(&mut deserializer)
        .and_then(|request| deserializer.end().map(|()| request))
        .map_err(|error| {
            if error.to_string().starts_with(TOO_MANY) {
                Reply::error(
                    400,
                    &format!("invalid argument: too many messages (max {BATCH_MESSAGES_MAX})"),
                )
            } else {
                Reply::error(
                    400,
                    &format!("invalid argument: invalid JSON body: {error}"),
                )
            }
        })
}
