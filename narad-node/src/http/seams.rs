//! The seams between the HTTP surface and the produce/consume machinery built elsewhere: the ingress
//! WAL host implements [`ProduceSink`], the partition logs implement [`PartitionReader`] and
//! [`PartitionStats`]. The HTTP code only ever sees these traits, so the simulator and the unit tests can
//! plug in their own.
//!
//! The methods return boxed futures (not `async fn`) so the traits stay object-safe behind `Arc<dyn _>`.

use narad_core::codec::wal::ProduceRecord;
use narad_core::ids::{Offset, PartitionId, TopicId};

pub use crate::future::BoxFuture;
use crate::ingress::WalError;

/// Where accepted produces go: the ingress WAL host.
///
/// Contract: the returned future resolves `Ok` only once every record of the call is fsynced in the
/// WAL (the 202 promise); `append_many` stages its records in order with consecutive sequence numbers
/// and one group commit, all or nothing as far as the answer goes.
pub trait ProduceSink: Send + Sync {
    /// Appends one record and waits for its group commit.
    fn append(&self, record: ProduceRecord) -> BoxFuture<'_, Result<(), WalError>>;
    /// Appends a batch's records in order and waits for the group commit holding the last one.
    fn append_many(&self, records: Vec<ProduceRecord>) -> BoxFuture<'_, Result<(), WalError>>;
}

/// A topic incarnation, as the partition logs key it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicKey {
    /// Topic name.
    pub name: String,
    /// Incarnation id.
    pub id: TopicId,
}

pub use narad_core::codec::cluster::StoredRecord;

/// What a replay read found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// The record at the offset.
    Record(StoredRecord),
    /// The offset is at or past the high watermark (HTTP 204).
    PastEnd,
    /// The offset is below the oldest retained record (HTTP 410).
    Gone,
    /// The partition's owner is another node, marked dead (HTTP 503, plain text).
    OwnerDown,
    /// Forwarding the read to the partition's owner failed (HTTP 502, plain text).
    PeerFailed(String),
    /// The owner does not hold the asked incarnation of the topic (yet, or any more): a replica
    /// lags behind a delete and recreate (HTTP 503, plain text: retriable, never "gone").
    OtherIncarnation,
}

/// Why a replay read failed (HTTP 410, as the surface answers an unreadable offset).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("partition read failed: {0}")]
pub struct ReplayError(pub String);

/// Replay reads of visible records.
pub trait PartitionReader: Send + Sync {
    /// Reads the record at `offset` of one partition, without reserving it.
    fn read(
        &self,
        topic: &TopicKey,
        partition: PartitionId,
        offset: Offset,
    ) -> BoxFuture<'_, Result<ReadOutcome, ReplayError>>;
}

pub use narad_core::codec::cluster::PartitionStat;

/// Storage figures of partitions. A partition with no log yet reports all zeros.
pub trait PartitionStats: Send + Sync {
    /// Figures of one partition.
    fn partition_stat(
        &self,
        topic: &TopicKey,
        partition: PartitionId,
    ) -> BoxFuture<'_, PartitionStat>;
}

pub use narad_core::consume::{QueueLimits, ReceiptHandle, Settle};

/// A record leased to a queue-mode consumer.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Leased {
    /// The partition.
    pub partition: PartitionId,
    /// The record.
    pub record: StoredRecord,
    /// The lease's handle.
    pub handle: ReceiptHandle,
}

/// What a queue-mode consume found.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum QueueOutcome {
    /// A record, leased (HTTP 200 with its receipt handle).
    Leased(Leased),
    /// Nothing within the wait (HTTP 204).
    Empty,
    /// The pinned partition's owner is another node, marked dead (HTTP 503, plain text).
    OwnerDown,
    /// Forwarding to the owner failed (HTTP 502, plain text).
    PeerFailed(String),
}

/// What an ack, extend or nack found.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SettleOutcome {
    /// Done (HTTP 204).
    Done,
    /// No lease holds the handle: acked, redelivered under another nonce, or expired (HTTP 410).
    Stale,
    /// The ack would pass the acked-ahead cap; the lease is kept (HTTP 503).
    AckedAheadFull,
    /// The partition's owner is another node, marked dead (HTTP 503, plain text).
    OwnerDown,
    /// Forwarding to the owner failed (HTTP 502, plain text).
    PeerFailed(String),
}

/// Queue-mode consume: leases on the partitions' owners.
pub trait QueueConsumer: Send + Sync {
    /// Leases one record of `topic` (`partitions` of them, or only `pinned`), waiting up to `wait`.
    fn consume(
        &self,
        topic: &TopicKey,
        limits: QueueLimits,
        partitions: u32,
        pinned: Option<PartitionId>,
        wait: std::time::Duration,
    ) -> BoxFuture<'_, QueueOutcome>;
    /// Acks, extends or nacks the lease `handle` of `topic`.
    fn settle(
        &self,
        topic: &TopicKey,
        handle: ReceiptHandle,
        action: Settle,
    ) -> BoxFuture<'_, SettleOutcome>;
}
