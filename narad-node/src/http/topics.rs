//! Topic routes: create, get (with `partition_stats`), list (paging), alter, delete.
//!
//! Request bodies are strict JSON (unknown field, trailing value → 400; over 1 MiB → 413). The topic JSON
//! lists the always-present fields first, in the surface's order (`name, partitions, retention_ms,
//! visibility_timeout_ms, max_in_flight_per_partition, max_acked_ahead_per_partition, created_at`), with
//! `retention_bytes` right after `retention_ms` when it is not 0 (no bound), then `owner` when not
//! empty, then `partition_stats` on a get. `schema` is never returned. Fan-out fields (`parent`,
//! `fanout_delay_ms`) are accepted by the parser, so they are not "unknown", but refused while fan-out
//! is not built.
//!
//! `retention_ms` is checked against this node's `topic.min_retention_ms` ([`App::min_retention_ms`])
//! before proposing; the metastore keeps only a floor under every node's minimum.

use narad_core::ids::PartitionId;
use narad_core::metastore::{
    normalize_retention_ms, AlterTopic, Applied, Command, CreateTopic, Topic, TopicError,
    TopicSettings,
};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;

use narad_core::metastore::users::Action;

use super::auth::Caller;
use super::reply::{json_array, JsonObject};
use super::{parse_index, schema, App, Body, Query, Reply, TopicKey};
use crate::clock;
use crate::metastore::ProposeError;

/// Topics listed per page when `limit` is absent.
pub const LIST_LIMIT_DEFAULT: usize = 100;
/// Largest page; larger limits are clamped to it.
pub const LIST_LIMIT_MAX: usize = 1000;

/// `POST /v1/topics` body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct CreateRequest {
    name: String,
    partitions: i64,
    retention_ms: i64,
    retention_bytes: i64,
    visibility_timeout_ms: i64,
    max_in_flight_per_partition: i64,
    max_acked_ahead_per_partition: i64,
    schema: Option<Box<RawValue>>,
    parent: String,
    fanout_delay_ms: i64,
    /// Ignored: the owner is the caller.
    #[allow(dead_code)]
    owner: String,
}

/// `PATCH /v1/topics/{t}` body. `visibility_timeout_ms` is not a field (400 unknown field, as Narad).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct AlterRequest {
    partitions: Option<i64>,
    retention_ms: Option<i64>,
    retention_bytes: Option<i64>,
    max_in_flight_per_partition: Option<i64>,
    max_acked_ahead_per_partition: Option<i64>,
    schema: Option<Box<RawValue>>,
}

/// Parses a strict JSON body: one value, no unknown fields.
pub(super) fn parse_json<T: DeserializeOwned>(body: Body) -> Result<T, Reply> {
    let bytes = match body {
        Body::Bytes(bytes) => bytes,
        Body::TooLarge => return Err(Reply::error(413, "request body too large")),
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Reply::error(400, "invalid argument: request body required"));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(&bytes);
    let value = T::deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value))
        .map_err(|error| {
            Reply::error(
                400,
                &format!("invalid argument: invalid JSON body: {error}"),
            )
        })?;
    Ok(value)
}

fn non_negative(name: &str, value: i64) -> Result<u64, Reply> {
    u64::try_from(value).map_err(|_| {
        Reply::error(
            400,
            &format!("invalid argument: {name} must not be negative"),
        )
    })
}

/// `visibility_timeout_ms`: 0 (the default) or a lease of at least a second. Checked here, before the
/// proposal, not in the replicated state machine: replicas of every release apply the same creates.
fn visibility_ms(value: i64) -> Result<u64, Reply> {
    let ms = non_negative("visibility_timeout_ms", value)?;
    let min = narad_core::consume::VISIBILITY_MIN.as_millis() as u64;
    if ms != 0 && ms < min {
        return Err(Reply::error(
            400,
            &format!(
                "invalid argument: visibility_timeout_ms must be 0 (default) or at least {min}"
            ),
        ));
    }
    Ok(ms)
}

/// A PATCH's `retention_ms`, checked against this node's minimum (the metastore checks only its
/// floor).
fn retention_ms(app: &App, value: i64) -> Result<u64, Reply> {
    let ms = non_negative("retention_ms", value)?;
    normalize_retention_ms(ms, app.min_retention_ms()).map_err(|error| topic_error(&error))?;
    Ok(ms)
}

fn count(name: &str, value: i64) -> Result<u32, Reply> {
    u32::try_from(non_negative(name, value)?)
        .map_err(|_| Reply::error(400, &format!("invalid argument: {name} is too large")))
}

/// The schema text of a request field (`null` = absent), checked to compile.
fn schema_text(schema: Option<Box<RawValue>>) -> Result<Option<String>, Reply> {
    match schema {
        Some(raw) if raw.get() != "null" => {
            schema::compile(raw.get()).map_err(|error| {
                Reply::error(400, &format!("invalid argument: invalid schema: {error}"))
            })?;
            Ok(Some(raw.get().to_string()))
        }
        _ => Ok(None),
    }
}

/// The answer to a refused or unanswered proposal.
pub(super) fn propose_error(error: ProposeError) -> Reply {
    match error {
        ProposeError::Refused(error) => topic_error(&error),
        error @ (ProposeError::Unavailable(_) | ProposeError::NotLeader { .. }) => {
            tracing::warn!(reason = %error, "metastore proposal failed");
            Reply::error(503, "control plane unavailable")
        }
    }
}

/// The status and message of a metastore refusal.
pub fn topic_error(error: &TopicError) -> Reply {
    let status = match error {
        TopicError::Exists | TopicError::UserExists => 409,
        TopicError::NotFound | TopicError::UserNotFound | TopicError::MoveNotFound => 404,
        TopicError::MoveNotOwner(_)
        | TopicError::MoveInProgress
        | TopicError::MoveTargetUnavailable(_)
        | TopicError::TooManyMoves { .. } => 409,
        TopicError::RootExists | TopicError::RootUndeletable | TopicError::RootGrantsFixed => {
            return Reply::error(403, &format!("forbidden: {error}"))
        }
        TopicError::NameRequired
        | TopicError::NameInvalid
        | TopicError::NameReserved
        | TopicError::PartitionsOutOfRange
        | TopicError::PartitionsNotIncreased { .. }
        | TopicError::RetentionTooShort { .. }
        | TopicError::RetentionBytesTooSmall
        | TopicError::SchemaTooLarge
        | TopicError::NothingToChange
        | TopicError::TooManyTopics
        | TopicError::PartitionOutOfRange
        | TopicError::UnknownMember(_)
        | TopicError::MemberRefused
        | TopicError::UsernameInvalid
        | TopicError::GrantInvalid(_)
        | TopicError::TooManyUsers
        | TopicError::PasswordHashInvalid => 400,
    };
    Reply::error(status, &error.to_string())
}

/// `POST /v1/topics` → 201 topic, owned by the caller.
pub async fn create_topic(app: &App, caller: &Caller, body: Body) -> Reply {
    match create(app, caller, body).await {
        Ok(reply) | Err(reply) => reply,
    }
}

async fn create(app: &App, caller: &Caller, body: Body) -> Result<Reply, Reply> {
    let request: CreateRequest = parse_json(body)?;
    if !caller.may(Action::Create, &request.name) {
        return Err(Reply::error(
            403,
            &format!("forbidden: no create grant for topic {:?}", request.name),
        ));
    }
    if !request.parent.is_empty() || request.fanout_delay_ms != 0 {
        return Err(Reply::error(
            400,
            "invalid argument: fan-out topics (parent, fanout_delay_ms) are not supported",
        ));
    }
    let partitions = match non_negative("partitions", request.partitions)? {
        value if value > u64::from(u32::MAX) => {
            return Err(topic_error(&TopicError::PartitionsOutOfRange))
        }
        value => value as u32,
    };
    let settings = TopicSettings {
        retention_ms: non_negative("retention_ms", request.retention_ms)?,
        retention_bytes: non_negative("retention_bytes", request.retention_bytes)?,
        visibility_timeout_ms: visibility_ms(request.visibility_timeout_ms)?,
        max_in_flight_per_partition: count(
            "max_in_flight_per_partition",
            request.max_in_flight_per_partition,
        )?,
        max_acked_ahead_per_partition: count(
            "max_acked_ahead_per_partition",
            request.max_acked_ahead_per_partition,
        )?,
    };
    let create = CreateTopic {
        name: request.name,
        partitions,
        settings,
        schema: None,
        owner: caller.username().to_string(),
        created_at_s: clock::unix_s(),
    };
    // Field checks before the (costlier) schema compile.
    let mut create = create
        .normalized_with_min_retention(app.min_retention_ms())
        .map_err(|error| topic_error(&error))?;
    create.schema = schema_text(request.schema)?;
    match app.metastore.propose(Command::CreateTopic(create)).await {
        Ok(Applied::TopicCreated(topic)) => Ok(Reply::json(201, topic_json(&topic, None))),
        Ok(other) => unreachable_applied(other),
        Err(error) => Err(propose_error(error)),
    }
}

/// `GET /v1/topics/{t}[?partition=N]` → 200 topic with `partition_stats`.
pub async fn get_topic(app: &App, name: &str, query: Option<&str>) -> Reply {
    match get(app, name, query).await {
        Ok(reply) | Err(reply) => reply,
    }
}

async fn get(app: &App, name: &str, query: Option<&str>) -> Result<Reply, Reply> {
    let query = Query::parse(query);
    let partition = query
        .single("partition")?
        .map(|value| parse_index("partition", value))
        .transpose()?;
    let view = app.metastore.view();
    let topic = view
        .state
        .topic(name)
        .ok_or_else(|| topic_error(&TopicError::NotFound))?;
    let partitions: Vec<u32> = match partition {
        Some(index) if index >= u64::from(topic.partitions()) => {
            return Err(topic_error(&TopicError::PartitionOutOfRange))
        }
        Some(index) => vec![index as u32],
        None => (0..topic.partitions()).collect(),
    };
    let key = TopicKey {
        name: topic.name.clone(),
        id: topic.id,
    };
    let mut stats = Vec::with_capacity(partitions.len());
    for index in partitions {
        let partition = PartitionId(index);
        let stat = app.stats.partition_stat(&key, partition).await;
        let mut object = JsonObject::new()
            .number("index", u64::from(index))
            .number("segments", stat.segments)
            .number("oldest_offset", stat.oldest_offset.0)
            .number("next_offset", stat.next_offset.0)
            .number("high_watermark", stat.high_watermark.0)
            .number("size_bytes", stat.size_bytes);
        if let Some(at) = stat.oldest_segment_at_s {
            object = object.number("oldest_segment_at", at);
        }
        if let Some(owner) = topic.owner_of(partition) {
            object = object.string("owner_node", &owner.to_string());
        }
        stats.push(object.finish());
    }
    Ok(Reply::json(200, topic_json(topic, Some(&stats))))
}

/// `GET /v1/topics?limit=&page_token=` → `{"topics":[…],"next_page_token":""}`.
pub fn list_topics(app: &App, query: Option<&str>) -> Reply {
    match list(app, query) {
        Ok(reply) | Err(reply) => reply,
    }
}

fn list(app: &App, query: Option<&str>) -> Result<Reply, Reply> {
    let query = Query::parse(query);
    let limit = match query.single("limit")? {
        None => LIST_LIMIT_DEFAULT,
        Some(value) => match value.parse::<i64>() {
            Ok(limit) if limit >= 1 => usize::try_from(limit)
                .unwrap_or(usize::MAX)
                .min(LIST_LIMIT_MAX),
            _ => {
                return Err(Reply::error(
                    400,
                    "invalid argument: limit must be a positive integer",
                ))
            }
        },
    };
    let token = query.single("page_token")?.unwrap_or("");
    let view = app.metastore.view();
    let (page, more) = view.state.topics_after(token, limit);
    let next_token = match page.last() {
        Some(last) if more => last.name.as_str(),
        _ => "",
    };
    let topics: Vec<String> = page.iter().map(|topic| topic_json(topic, None)).collect();
    let body = JsonObject::new()
        .raw("topics", &json_array(&topics))
        .string("next_page_token", next_token)
        .finish();
    Ok(Reply::json(200, body))
}

/// The answer when `caller` may not alter or delete `topic`.
fn check_manages(caller: &Caller, topic: &Topic) -> Result<(), Reply> {
    if caller.manages(&topic.owner) {
        Ok(())
    } else {
        Err(Reply::error(
            403,
            "forbidden: only the topic's owner or an admin may change it",
        ))
    }
}

/// `PATCH /v1/topics/{t}` → 200 topic (owner or admin).
pub async fn alter_topic(app: &App, caller: &Caller, name: &str, body: Body) -> Reply {
    match alter(app, caller, name, body).await {
        Ok(reply) | Err(reply) => reply,
    }
}

async fn alter(app: &App, caller: &Caller, name: &str, body: Body) -> Result<Reply, Reply> {
    let current = app
        .metastore
        .view()
        .state
        .topic(name)
        .cloned()
        .ok_or_else(|| topic_error(&TopicError::NotFound))?;
    check_manages(caller, &current)?;
    let request: AlterRequest = parse_json(body)?;
    let partitions = match request.partitions {
        Some(value) => match non_negative("partitions", value)? {
            value if value > u64::from(u32::MAX) => {
                return Err(topic_error(&TopicError::PartitionsOutOfRange))
            }
            value => Some(value as u32),
        },
        None => None,
    };
    let change = AlterTopic {
        name: name.to_string(),
        partitions,
        retention_ms: request
            .retention_ms
            .map(|value| retention_ms(app, value))
            .transpose()?,
        retention_bytes: request
            .retention_bytes
            .map(|value| non_negative("retention_bytes", value))
            .transpose()?,
        max_in_flight_per_partition: request
            .max_in_flight_per_partition
            .map(|value| count("max_in_flight_per_partition", value))
            .transpose()?,
        max_acked_ahead_per_partition: request
            .max_acked_ahead_per_partition
            .map(|value| count("max_acked_ahead_per_partition", value))
            .transpose()?,
        schema: schema_text(request.schema)?,
    };
    if let (Some(old), Some(new)) = (&current.schema, &change.schema) {
        schema::check_compatible(old, new).map_err(|reason| {
            Reply::error(
                400,
                &format!("invalid argument: incompatible schema: {reason}"),
            )
        })?;
    }
    match app.metastore.propose(Command::AlterTopic(change)).await {
        Ok(Applied::TopicAltered(topic)) => Ok(Reply::json(200, topic_json(&topic, None))),
        Ok(other) => unreachable_applied(other),
        Err(error) => Err(propose_error(error)),
    }
}

/// `DELETE /v1/topics/{t}` → 204 (owner or admin).
pub async fn delete_topic(app: &App, caller: &Caller, name: &str) -> Reply {
    match app.metastore.view().state.topic(name) {
        None => return topic_error(&TopicError::NotFound),
        Some(topic) => {
            if let Err(reply) = check_manages(caller, topic) {
                return reply;
            }
        }
    }
    let command = Command::DeleteTopic {
        name: name.to_string(),
    };
    match app.metastore.propose(command).await {
        Ok(Applied::TopicDeleted(_)) => Reply::empty(204),
        Ok(other) => unreachable_applied(other).unwrap_or_else(|reply| reply),
        Err(error) => propose_error(error),
    }
}

/// A topic command answered with another command's outcome: a bug in the host, answered 500.
fn unreachable_applied(applied: Applied) -> Result<Reply, Reply> {
    tracing::error!(
        ?applied,
        "metastore answered a topic command with another outcome"
    );
    Err(Reply::error(500, "topic update failed"))
}

/// The topic JSON, with `partition_stats` when given.
pub fn topic_json(topic: &Topic, partition_stats: Option<&[String]>) -> String {
    let settings = &topic.settings;
    let mut object = JsonObject::new()
        .string("name", &topic.name)
        .number("partitions", u64::from(topic.partitions()))
        .number("retention_ms", settings.retention_ms);
    if settings.retention_bytes != 0 {
        object = object.number("retention_bytes", settings.retention_bytes);
    }
    object = object
        .number("visibility_timeout_ms", settings.visibility_timeout_ms)
        .number(
            "max_in_flight_per_partition",
            u64::from(settings.max_in_flight_per_partition),
        )
        .number(
            "max_acked_ahead_per_partition",
            u64::from(settings.max_acked_ahead_per_partition),
        )
        .number("created_at", topic.created_at_s);
    if !topic.owner.is_empty() {
        object = object.string("owner", &topic.owner);
    }
    if let Some(stats) = partition_stats {
        object = object.raw("partition_stats", &json_array(stats));
    }
    object.finish()
}
