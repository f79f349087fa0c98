//! Topic records and the rules a topic's fields obey (the `/v1` surface's validation).

use serde::{Deserialize, Serialize};

use crate::ids::{NodeId, PartitionId, TopicId};

/// Partitions a topic gets when the request says 0.
pub const PARTITIONS_DEFAULT: u32 = 3;
/// Fewest partitions a topic may have.
pub const PARTITIONS_MIN: u32 = 3;
/// Most partitions a topic may have.
pub const PARTITIONS_MAX: u32 = 108;
/// Retention when the request says 0: seven days.
pub const RETENTION_MS_DEFAULT: u64 = 7 * 24 * 3_600_000;
/// Shortest retention the replicated state accepts (0 aside). Each node refuses shorter than its own
/// `topic.min_retention_ms` before proposing; the state machine keeps only this floor, so a command
/// proposed by a node configured with a short minimum is never refused when another replica applies it.
pub const RETENTION_MS_FLOOR: u64 = 100;
/// The node's default minimum retention (`topic.min_retention_ms`): one hour, as Narad.
pub const RETENTION_MS_MIN_DEFAULT: u64 = 3_600_000;
/// Smallest size bound a partition may be given (0 aside, which means no bound): 1 MiB.
pub const RETENTION_BYTES_MIN: u64 = 1024 * 1024;
/// Visibility timeout when the request says 0.
pub const VISIBILITY_TIMEOUT_MS_DEFAULT: u64 = 30_000;
/// `max_in_flight_per_partition` when the request says 0.
pub const IN_FLIGHT_PER_PARTITION_DEFAULT: u32 = 1024;
/// `max_acked_ahead_per_partition` when the request says 0.
pub const ACKED_AHEAD_PER_PARTITION_DEFAULT: u32 = 1024;
/// Longest topic name, in bytes.
pub const TOPIC_NAME_BYTES_MAX: usize = 255;
/// Most topics the metastore holds; a create past it is refused.
pub const TOPICS_MAX: usize = 10_000;
/// Largest schema text a topic may carry (the JSON request body bound).
pub const SCHEMA_BYTES_MAX: usize = 1024 * 1024;

/// Why a topic command was refused. Every replica refuses the same command for the same reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum TopicError {
    /// The name is empty.
    #[error("invalid argument: topic name required")]
    NameRequired,
    /// The name has a character outside `[A-Za-z0-9._-]` or is longer than 255 bytes.
    #[error("invalid argument: topic name must match ^[A-Za-z0-9._-]{{1,255}}$")]
    NameInvalid,
    /// The name is `.` or `..`.
    #[error("invalid argument: topic name must not be \".\" or \"..\"")]
    NameReserved,
    /// The partition count is outside 3–108 (0 aside on create).
    #[error("invalid argument: partitions must be between 3 and 108")]
    PartitionsOutOfRange,
    /// A PATCH asked for as many partitions as the topic has, or fewer.
    #[error("invalid argument: partitions can only increase (topic has {current})")]
    PartitionsNotIncreased {
        /// The topic's current count.
        current: u32,
    },
    /// Retention is neither 0 (the default) nor at least the minimum that applied.
    #[error("invalid argument: retention_ms must be 0 (default) or at least {min}")]
    RetentionTooShort {
        /// The minimum: the proposing node's `topic.min_retention_ms`, or [`RETENTION_MS_FLOOR`] at
        /// apply.
        min: u64,
    },
    /// The schema text is over [`SCHEMA_BYTES_MAX`].
    #[error("invalid argument: schema too large")]
    SchemaTooLarge,
    /// A PATCH that changes nothing.
    #[error("invalid argument: no field to change")]
    NothingToChange,
    /// The metastore holds [`TOPICS_MAX`] topics.
    #[error("invalid argument: topic limit reached (10000)")]
    TooManyTopics,
    /// A topic of that name exists.
    #[error("topic already exists")]
    Exists,
    /// No topic of that name (or not that incarnation).
    #[error("topic not found")]
    NotFound,
    /// The partition index is not below the topic's partition count.
    #[error("invalid argument: partition out of range")]
    PartitionOutOfRange,
    /// The node named is not a member.
    #[error("invalid argument: unknown member {0}")]
    UnknownMember(NodeId),
    /// A member address over 255 bytes, or a new member past the member limit.
    #[error("invalid argument: member refused (address too long or member limit reached)")]
    MemberRefused,
    /// A username outside `^[A-Za-z0-9._-]{1,64}$`.
    #[error("invalid argument: username must match ^[A-Za-z0-9._-]{{1,64}}$")]
    UsernameInvalid,
    /// A user of that name exists.
    #[error("user already exists")]
    UserExists,
    /// No user of that name.
    #[error("user not found")]
    UserNotFound,
    /// A second root user, or a root user with grants.
    #[error("the root user exists already")]
    RootExists,
    /// The root user can't be deleted.
    #[error("the root user cannot be deleted")]
    RootUndeletable,
    /// The root user's grants can't change.
    #[error("the root user's grants cannot change")]
    RootGrantsFixed,
    /// A grant with a bad action, pattern or pattern count.
    #[error("invalid argument: {0}")]
    GrantInvalid(String),
    /// The metastore holds [`super::users::USERS_MAX`] users.
    #[error("invalid argument: user limit reached (10000)")]
    TooManyUsers,
    /// A password hash that is not a PHC or bcrypt string.
    #[error("invalid argument: malformed password hash")]
    PasswordHashInvalid,
    /// A size bound that is neither 0 (no bound) nor at least [`RETENTION_BYTES_MIN`].
    #[error("invalid argument: retention_bytes must be 0 (no bound) or at least 1048576")]
    RetentionBytesTooSmall,
    /// A move planned from a node that does not own the partition (the owner changed since the plan).
    #[error("partition is not owned by node {0}")]
    MoveNotOwner(NodeId),
    /// A move planned for a partition that has one in flight.
    #[error("a move of the partition is in progress")]
    MoveInProgress,
    /// A move planned to its own source, or to a member marked dead or draining.
    #[error("node {0} cannot take the partition (it is the source, marked dead or draining)")]
    MoveTargetUnavailable(NodeId),
    /// A move planned while the cluster-wide cap of moves in flight is reached.
    #[error("too many partition moves in flight (limit {max_in_flight})")]
    TooManyMoves {
        /// The cap the proposer gave.
        max_in_flight: u32,
    },
    /// No move in flight matches the command (it was aborted, switched, or superseded by a
    /// reassignment, a recreation or another watermark).
    #[error("partition move not found (or it no longer matches)")]
    MoveNotFound,
}

impl TopicError {
    /// Whether the caller's input was at fault (HTTP 400), as opposed to the state (404/409).
    pub fn is_invalid_argument(&self) -> bool {
        !matches!(
            self,
            TopicError::Exists
                | TopicError::NotFound
                | TopicError::MoveNotOwner(_)
                | TopicError::MoveInProgress
                | TopicError::MoveTargetUnavailable(_)
                | TopicError::TooManyMoves { .. }
                | TopicError::MoveNotFound
        )
    }
}

/// Checks a topic name against `^[A-Za-z0-9._-]{1,255}$`, not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), TopicError> {
    if name.is_empty() {
        return Err(TopicError::NameRequired);
    }
    let allowed = |byte: u8| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-');
    if name.len() > TOPIC_NAME_BYTES_MAX || !name.bytes().all(allowed) {
        return Err(TopicError::NameInvalid);
    }
    if name == "." || name == ".." {
        return Err(TopicError::NameReserved);
    }
    Ok(())
}

/// The `/v1` settings of a topic, with defaults already applied (never 0 where 0 means "default").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicSettings {
    /// How long records are kept, ms.
    pub retention_ms: u64,
    /// Bytes of its newest records each partition keeps at least (older segments go past it);
    /// 0 = no bound. Never defaulted: 0 is stored as 0.
    pub retention_bytes: u64,
    /// Queue-mode lease length, ms.
    pub visibility_timeout_ms: u64,
    /// Queue-mode reservations per partition.
    pub max_in_flight_per_partition: u32,
    /// Queue-mode acks ahead of the cursor per partition.
    pub max_acked_ahead_per_partition: u32,
}

/// Retention after the 0-means-default rule, or why it is refused: shorter than `min_ms` (never
/// below [`RETENTION_MS_FLOOR`]).
pub fn normalize_retention_ms(retention_ms: u64, min_ms: u64) -> Result<u64, TopicError> {
    let min = min_ms.max(RETENTION_MS_FLOOR);
    match retention_ms {
        0 => Ok(RETENTION_MS_DEFAULT),
        ms if ms < min => Err(TopicError::RetentionTooShort { min }),
        ms => Ok(ms),
    }
}

/// A size bound as requested (0 = no bound), or why it is refused.
pub fn check_retention_bytes(retention_bytes: u64) -> Result<u64, TopicError> {
    match retention_bytes {
        bytes if bytes != 0 && bytes < RETENTION_BYTES_MIN => {
            Err(TopicError::RetentionBytesTooSmall)
        }
        bytes => Ok(bytes),
    }
}

/// A count after the 0-means-default rule.
fn or_default<T: PartialEq + Default>(value: T, default: T) -> T {
    if value == T::default() {
        default
    } else {
        value
    }
}

/// A replica's record of one topic incarnation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topic {
    /// The name (unique among live topics).
    pub name: String,
    /// This incarnation's id: new on every create, so a deleted-then-recreated name gets another one.
    pub id: TopicId,
    /// Owner node of each partition, by index; `None` while no member exists to own it.
    /// Its length is the partition count.
    pub owners: Vec<Option<NodeId>>,
    /// The raw JSON Schema text payloads must satisfy, if any (validated by the node, not here).
    pub schema: Option<String>,
    /// Bumped on every schema change, starting at 1 for a topic created with a schema.
    pub schema_version: u32,
    /// The `/v1` settings.
    pub settings: TopicSettings,
    /// The user that created it (empty with auth off).
    pub owner: String,
    /// Creation time, Unix seconds, as the proposer read its clock.
    pub created_at_s: u64,
    /// The metastore version of this topic's last change: moves on every create, alter and assignment,
    /// and never repeats for a name (a recreated topic starts above the deleted one).
    pub metadata_version: u64,
}

impl Topic {
    /// How many partitions the topic has.
    pub fn partitions(&self) -> u32 {
        u32::try_from(self.owners.len()).expect("partition count is bounded by PARTITIONS_MAX")
    }

    /// The owner of one partition, when the partition exists and is assigned.
    pub fn owner_of(&self, partition: PartitionId) -> Option<NodeId> {
        self.owners.get(partition.0 as usize).copied().flatten()
    }
}

/// A create request, as proposed: 0 means "default" for every numeric field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateTopic {
    /// Topic name.
    pub name: String,
    /// Partition count (0 = [`PARTITIONS_DEFAULT`]).
    pub partitions: u32,
    /// Requested settings (0 = default for each).
    pub settings: TopicSettings,
    /// Raw JSON Schema text.
    pub schema: Option<String>,
    /// The creating user.
    pub owner: String,
    /// Creation time, Unix seconds (read by the proposer, so every replica stores the same value).
    pub created_at_s: u64,
}

impl CreateTopic {
    /// Applies the defaults and checks every field; the result is what the state machine stores.
    ///
    /// Check order: name, partitions, retention, size bound, schema size.
    pub fn normalized(&self) -> Result<CreateTopic, TopicError> {
        self.normalized_with_min_retention(RETENTION_MS_FLOOR)
    }

    /// [`CreateTopic::normalized`] with the proposing node's minimum retention (`min_retention_ms`,
    /// never below [`RETENTION_MS_FLOOR`]), in the same check order.
    pub fn normalized_with_min_retention(
        &self,
        min_retention_ms: u64,
    ) -> Result<CreateTopic, TopicError> {
        validate_topic_name(&self.name)?;
        let partitions = or_default(self.partitions, PARTITIONS_DEFAULT);
        if !(PARTITIONS_MIN..=PARTITIONS_MAX).contains(&partitions) {
            return Err(TopicError::PartitionsOutOfRange);
        }
        let settings = TopicSettings {
            retention_ms: normalize_retention_ms(self.settings.retention_ms, min_retention_ms)?,
            retention_bytes: check_retention_bytes(self.settings.retention_bytes)?,
            visibility_timeout_ms: or_default(
                self.settings.visibility_timeout_ms,
                VISIBILITY_TIMEOUT_MS_DEFAULT,
            ),
            max_in_flight_per_partition: or_default(
                self.settings.max_in_flight_per_partition,
                IN_FLIGHT_PER_PARTITION_DEFAULT,
            ),
            max_acked_ahead_per_partition: or_default(
                self.settings.max_acked_ahead_per_partition,
                ACKED_AHEAD_PER_PARTITION_DEFAULT,
            ),
        };
        check_schema_size(self.schema.as_deref())?;
        Ok(CreateTopic {
            name: self.name.clone(),
            partitions,
            settings,
            schema: self.schema.clone(),
            owner: self.owner.clone(),
            created_at_s: self.created_at_s,
        })
    }
}

fn check_schema_size(schema: Option<&str>) -> Result<(), TopicError> {
    match schema {
        Some(text) if text.len() > SCHEMA_BYTES_MAX => Err(TopicError::SchemaTooLarge),
        _ => Ok(()),
    }
}

/// A PATCH: `None` leaves a field alone; `Some(0)` resets a setting to its default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlterTopic {
    /// Topic name.
    pub name: String,
    /// New partition count: must be above the current one (increase only).
    pub partitions: Option<u32>,
    /// New retention (0 = default).
    pub retention_ms: Option<u64>,
    /// New size bound per partition (0 = no bound).
    pub retention_bytes: Option<u64>,
    /// New in-flight cap (0 = default).
    pub max_in_flight_per_partition: Option<u32>,
    /// New acked-ahead cap (0 = default).
    pub max_acked_ahead_per_partition: Option<u32>,
    /// New schema text; the node checks it compiles and is compatible before proposing.
    pub schema: Option<String>,
}

/// The changes an [`AlterTopic`] makes to one topic, after its checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AlterPlan {
    pub settings: TopicSettings,
    pub partitions: u32,
    pub schema: Option<String>,
}

impl AlterTopic {
    /// Checks the PATCH against the topic, in the surface's order (retention → size bound → caps →
    /// partitions → schema); the whole PATCH applies or none of it does.
    pub(crate) fn plan(&self, topic: &Topic) -> Result<AlterPlan, TopicError> {
        let nothing = self.partitions.is_none()
            && self.retention_ms.is_none()
            && self.retention_bytes.is_none()
            && self.max_in_flight_per_partition.is_none()
            && self.max_acked_ahead_per_partition.is_none()
            && self.schema.is_none();
        if nothing {
            return Err(TopicError::NothingToChange);
        }
        let mut settings = topic.settings.clone();
        if let Some(retention_ms) = self.retention_ms {
            settings.retention_ms = normalize_retention_ms(retention_ms, RETENTION_MS_FLOOR)?;
        }
        if let Some(retention_bytes) = self.retention_bytes {
            settings.retention_bytes = check_retention_bytes(retention_bytes)?;
        }
        if let Some(cap) = self.max_in_flight_per_partition {
            settings.max_in_flight_per_partition = or_default(cap, IN_FLIGHT_PER_PARTITION_DEFAULT);
        }
        if let Some(cap) = self.max_acked_ahead_per_partition {
            settings.max_acked_ahead_per_partition =
                or_default(cap, ACKED_AHEAD_PER_PARTITION_DEFAULT);
        }
        let current = topic.partitions();
        let partitions = match self.partitions {
            None => current,
            Some(requested) if requested > PARTITIONS_MAX => {
                return Err(TopicError::PartitionsOutOfRange)
            }
            Some(requested) if requested <= current => {
                return Err(TopicError::PartitionsNotIncreased { current })
            }
            Some(requested) => requested,
        };
        check_schema_size(self.schema.as_deref())?;
        Ok(AlterPlan {
            settings,
            partitions,
            schema: self.schema.clone(),
        })
    }
}
