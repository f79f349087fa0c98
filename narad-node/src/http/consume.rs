//! `GET /v1/topics/{t}/consume?partition=&offset=`: replay reads (no reservation, no receipt handle;
//! `wait` ignored).
//!
//! Check order: `partition` and `offset` (repeated or malformed → 400; `offset` without `partition` →
//! 400 `partition required for replay-mode consume`) → topic (404) → partition range (400) → read: the
//! record → 200, at or past the high watermark → 204, below the oldest retained offset or unreadable →
//! 410. Queue mode (no `offset`) is not built: 501.
//!
//! The message JSON keeps the surface's field order `topic, partition, offset, key?, payload,
//! payload_encoding?, timestamp`: a payload that is valid JSON is embedded verbatim, other UTF-8 becomes
//! a JSON string (Go escaping), anything else padded base64 with `"payload_encoding":"base64"`.
//! `timestamp` is the commit time in Unix seconds.

use base64::Engine as _;
use narad_core::ids::{Offset, PartitionId};

use super::reply::{json_string, JsonObject};
use super::{parse_index, App, Query, ReadOutcome, Reply, StoredRecord, TopicKey};

/// `GET /v1/topics/{t}/consume`.
pub async fn consume(app: &App, topic: &str, query: Option<&str>) -> Reply {
    match replay(app, topic, query).await {
        Ok(reply) | Err(reply) => reply,
    }
}

async fn replay(app: &App, topic_name: &str, query: Option<&str>) -> Result<Reply, Reply> {
    let query = Query::parse(query);
    let partition = query
        .single("partition")?
        .map(|value| parse_index("partition", value))
        .transpose()?;
    let offset = query
        .single("offset")?
        .map(|value| parse_index("offset", value))
        .transpose()?;
    let (partition, offset) =
        match (partition, offset) {
            (Some(partition), Some(offset)) => (partition, offset),
            (None, Some(_)) => {
                return Err(Reply::error(
                    400,
                    "partition required for replay-mode consume",
                ))
            }
            (_, None) => return Err(Reply::error(
                501,
                "queue-mode consume is not supported yet; pass partition= and offset= to replay",
            )),
        };
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
            message_json(&topic.name, partition, &record),
        )),
        Ok(ReadOutcome::PastEnd) => Ok(Reply::empty(204)),
        Ok(ReadOutcome::Gone) => Err(Reply::error(410, "offset is no longer retained")),
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

/// The message JSON of a replayed record.
pub fn message_json(topic: &str, partition: PartitionId, record: &StoredRecord) -> String {
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
    object
        .number("timestamp", record.committed_at_ms / 1000)
        .finish()
}
