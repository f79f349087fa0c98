//! `GET /v1/topics/{t}/consume` and `POST /v1/topics/{t}/ack`.
//!
//! **Replay** (`offset` given): reads, no reservation, no receipt handle, `wait` ignored. Check order:
//! `partition`, `offset` and `wait` (repeated or malformed → 400; `offset` without `partition` →
//! 400 `partition required for replay-mode consume`) → topic (404) → partition range (400) → read: the
//! record → 200, at or past the high watermark → 204, below the oldest retained offset or unreadable →
//! 410.
//!
//! **Queue mode** (no `offset`): leases one record on the partition's owner (`narad_core::consume`)
//! for the topic's `visibility_timeout_ms`; 200 with `receipt_handle` = `partition:offset:nonce`, or
//! 204 when nothing arrives within `wait` (a Go duration, `0s` when absent, clamped to 10 s). Same
//! checks, then the lease.
//!
//! **Ack** `?receipt_handle=H[&extend=]`: `extend` absent, empty or `false` acks, `true`/`1` extends the
//! lease, `0` nacks (redelivered at once); anything else → 400. A repeated parameter: the first wins.
//! Missing or malformed handle → 400, topic → 404, a handle no lease holds (acked, redelivered,
//! expired, another topic's) → 410, the acked-ahead set full → 503; done → 204.
//!
//! The message JSON keeps the surface's field order `topic, partition, offset, key?, payload,
//! payload_encoding?, timestamp, receipt_handle?`: a payload that is valid JSON is embedded verbatim,
//! other UTF-8 becomes a JSON string (Go escaping), anything else padded base64 with
//! `"payload_encoding":"base64"`. `timestamp` is the commit time in Unix seconds.

use base64::Engine as _;
use narad_core::ids::{Offset, PartitionId};

use std::time::Duration;

use super::reply::{json_string, JsonObject};
use super::{
    parse_index, App, Query, QueueOutcome, ReadOutcome, ReceiptHandle, Reply, Settle,
    SettleOutcome, StoredRecord, TopicKey,
};

/// The longest a queue-mode consume waits (`wait` is clamped to it), as Narad's `max_consume_wait`.
pub const CONSUME_WAIT_MAX: Duration = Duration::from_secs(10);

/// `GET /v1/topics/{t}/consume`.
pub async fn consume(app: &App, topic: &str, query: Option<&str>) -> Reply {
    match consume_or_replay(app, topic, query).await {
        Ok(reply) | Err(reply) => reply,
    }
}

async fn consume_or_replay(app: &App, topic: &str, query: Option<&str>) -> Result<Reply, Reply> {
    let query = Query::parse(query);
    let partition = query
        .single("partition")?
        .map(|value| parse_index("partition", value))
        .transpose()?;
    let offset = query
        .single("offset")?
        .map(|value| parse_index("offset", value))
        .transpose()?;
    let wait = query
        .single("wait")?
        .map(|value| {
            parse_go_duration(value).ok_or_else(|| {
                Reply::error(
                    400,
                    &format!(
                        "invalid argument: wait {value:?} is not a duration such as 500ms or 5s"
                    ),
                )
            })
        })
        .transpose()?
        .unwrap_or(Duration::ZERO);
    match (partition, offset) {
        (Some(partition), Some(offset)) => replay(app, topic, partition, offset).await,
        (None, Some(_)) => Err(Reply::error(
            400,
            "partition required for replay-mode consume",
        )),
        (partition, None) => queue_consume(app, topic, partition, wait).await,
    }
}

/// The topic `name` and its key, or 404.
fn find_topic(app: &App, name: &str) -> Result<narad_core::metastore::Topic, Reply> {
    let view = app.metastore.view();
    view.state
        .topic(name)
        .cloned()
        .ok_or_else(|| Reply::error(404, "topic not found"))
}

async fn queue_consume(
    app: &App,
    topic_name: &str,
    partition: Option<u64>,
    wait: Duration,
) -> Result<Reply, Reply> {
    let topic = find_topic(app, topic_name)?;
    let pinned = match partition {
        Some(partition) if partition >= u64::from(topic.partitions()) => {
            return Err(Reply::error(
                400,
                "invalid argument: partition out of range",
            ))
        }
        Some(partition) => Some(PartitionId(partition as u32)),
        None => None,
    };
    let settings = &topic.settings;
    let limits = narad_core::consume::limits_of(
        settings.visibility_timeout_ms,
        settings.max_in_flight_per_partition,
        settings.max_acked_ahead_per_partition,
    );
    let key = TopicKey {
        name: topic.name.clone(),
        id: topic.id,
    };
    let wait = wait.min(CONSUME_WAIT_MAX);
    match app
        .queue
        .consume(&key, limits, topic.partitions(), pinned, wait)
        .await
    {
        QueueOutcome::Leased(leased) => Ok(Reply::json(
            200,
            message_json(
                &topic.name,
                leased.partition,
                &leased.record,
                Some(&leased.handle),
            ),
        )),
        QueueOutcome::Empty => Ok(Reply::empty(204)),
        QueueOutcome::OwnerDown => Err(Reply::plain(503, "partition owner is down; retry later")),
        QueueOutcome::PeerFailed(reason) => {
            tracing::warn!(%reason, topic = topic_name, "forwarded queue-mode consume failed");
            Err(Reply::plain(502, &format!("peer RPC failed: {reason}")))
        }
    }
}

/// `POST /v1/topics/{t}/ack`.
pub async fn ack(app: &App, topic: &str, query: Option<&str>) -> Reply {
    match settle(app, topic, query).await {
        Ok(reply) | Err(reply) => reply,
    }
}

async fn settle(app: &App, topic_name: &str, query: Option<&str>) -> Result<Reply, Reply> {
    let query = Query::parse(query);
    let handle = match query.first("receipt_handle") {
        None | Some("") => return Err(Reply::error(400, "receipt_handle required")),
        Some(text) => ReceiptHandle::parse(text)
            .ok_or_else(|| Reply::error(400, "invalid argument: malformed receipt_handle"))?,
    };
    let action = match query.first("extend") {
        None | Some("") | Some("false") => Settle::Ack,
        Some("true") | Some("1") => Settle::Extend,
        Some("0") => Settle::Nack,
        Some(other) => {
            return Err(Reply::error(
                400,
                &format!("invalid argument: extend must be true, false, 1 or 0, not {other:?}"),
            ))
        }
    };
    let topic = find_topic(app, topic_name)?;
    if handle.partition.0 >= topic.partitions() {
        return Err(Reply::error(410, "receipt handle is stale or expired"));
    }
    let key = TopicKey {
        name: topic.name.clone(),
        id: topic.id,
    };
    match app.queue.settle(&key, handle, action).await {
        SettleOutcome::Done => Ok(Reply::empty(204)),
        SettleOutcome::Stale => Err(Reply::error(410, "receipt handle is stale or expired")),
        SettleOutcome::AckedAheadFull => Err(Reply::error(
            503,
            "acked-ahead set is full; ack the oldest outstanding message first",
        )),
        SettleOutcome::OwnerDown => Err(Reply::plain(503, "partition owner is down; retry later")),
        SettleOutcome::PeerFailed(reason) => {
            tracing::warn!(%reason, topic = topic_name, "forwarded ack failed");
            Err(Reply::plain(502, &format!("peer RPC failed: {reason}")))
        }
    }
}

/// Parses a Go `time.ParseDuration` string: an optional sign, then one or more decimal numbers
/// (with an optional fraction), each with a unit `ns`, `us`, `µs`, `ms`, `s`, `m` or `h`; `0` alone
/// is zero. A negative duration is no wait (Go's `time.After` fires at once); `None` when malformed
/// or past Go's range (about 292 years).
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let (negative, mut rest) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(digits);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
            return None;
        }
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let nanos_per: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().ok()?
        };
        let mut part = whole.checked_mul(nanos_per)?;
        let mut scale = nanos_per;
        for digit in fraction.bytes().take(30) {
            scale /= 10;
            part += u128::from(digit - b'0') * scale;
        }
        total = total.checked_add(part)?;
        rest = next;
    }
    if negative {
        return Some(Duration::ZERO);
    }
    // Go's Duration is an int64 of nanoseconds: larger is an overflow error there, a 400 here.
    let nanos = i64::try_from(total).ok()?;
    Some(Duration::from_nanos(nanos as u64))
}

async fn replay(app: &App, topic_name: &str, partition: u64, offset: u64) -> Result<Reply, Reply> {
    let view = app.metastore.view();
    let topic = view
        .state
        .topic(topic_name)
        .ok_or_else(|| Reply::error(404, "topic not found"))?;
    if partition >= u64::from(topic.partitions()) {
        return Err(Reply::error(
            400,
            "invalid argument: partition out of range",
        ));
    }
    let key = TopicKey {
        name: topic.name.clone(),
        id: topic.id,
    };
    let partition = PartitionId(partition as u32);
    match app.reader.read(&key, partition, Offset(offset)).await {
        Ok(ReadOutcome::Record(record)) => Ok(Reply::json(
            200,
            message_json(&topic.name, partition, &record, None),
        )),
        Ok(ReadOutcome::PastEnd) => Ok(Reply::empty(204)),
        Ok(ReadOutcome::Gone) => Err(Reply::error(410, "offset aged out")),
        // Cluster forwarding's errors are plain text, as the surface gives them.
        Ok(ReadOutcome::OwnerDown) => {
            Err(Reply::plain(503, "partition owner is down; retry later"))
        }
        // Not 410: a consumer skips past a gone offset, and this one becomes readable once the
        // lagging replica catches up.
        Ok(ReadOutcome::OtherIncarnation) => Err(Reply::plain(
            503,
            "partition owner holds another incarnation of the topic; retry later",
        )),
        Ok(ReadOutcome::PeerFailed(reason)) => {
            tracing::warn!(%reason, topic = topic_name, %partition, offset, "forwarded replay read failed");
            Err(Reply::plain(502, &format!("peer RPC failed: {reason}")))
        }
        Err(error) => {
            tracing::warn!(%error, topic = topic_name, %partition, offset, "replay read failed");
            app.metrics.error("messaging", "consume").inc();
            Err(Reply::error(410, "offset is not readable"))
        }
    }
}

/// The message JSON of a record, with its receipt handle when leased.
pub fn message_json(
    topic: &str,
    partition: PartitionId,
    record: &StoredRecord,
    handle: Option<&ReceiptHandle>,
) -> String {
    let mut object = JsonObject::new()
        .string("topic", topic)
        .number("partition", u64::from(partition.0))
        .number("offset", record.offset.0);
    if let Some(key) = &record.key {
        object = object.string("key", &String::from_utf8_lossy(key));
    }
    let payload = &record.payload;
    object = if serde_json::from_slice::<serde::de::IgnoredAny>(payload).is_ok() {
        let text = std::str::from_utf8(payload).expect("valid JSON is UTF-8");
        object.raw("payload", text)
    } else if let Ok(text) = std::str::from_utf8(payload) {
        object.raw("payload", &json_string(text))
    } else {
        object
            .string(
                "payload",
                &base64::engine::general_purpose::STANDARD.encode(payload),
            )
            .string("payload_encoding", "base64")
    };
    object = object.number("timestamp", record.committed_at_ms / 1000);
    if let Some(handle) = handle {
        object = object.string("receipt_handle", &handle.to_string());
    }
    object.finish()
}
