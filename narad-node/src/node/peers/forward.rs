//! Forwarding to a partition's owner: replay reads and partition figures ([`Forwarding`]) and
//! queue-mode consumes and acks ([`QueueForwarding`]) go to the owner over the cluster transport
//! when it is another member, to this node's own hosts otherwise.

use std::collections::BTreeMap;
use std::time::Duration;

use narad_core::codec::cluster::{Control, ControlAnswer, ReplayAnswer};
use narad_core::ids::{NodeId, Offset, PartitionId};

use crate::cluster::Cluster;
use crate::http::{
    BoxFuture, PartitionReader, PartitionStat, PartitionStats, ReadOutcome, ReplayError, TopicKey,
};
use crate::metastore::Metastore;
use crate::node::partitions::PartitionHost;

/// How long a forwarded replay read may take.
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(10);

/// Replay reads and storage figures: of a partition owned here from the local log, of one owned
/// elsewhere from its owner.
#[derive(Debug)]
pub struct Forwarding {
    /// This node's partition host.
    pub local: PartitionHost,
    /// The transport to owners.
    pub cluster: Cluster,
    /// Who owns what, and who is alive.
    pub metastore: Metastore,
}

impl Forwarding {
    /// The partition's owner when it is another node, and whether membership reports it alive.
    fn remote_owner(&self, topic: &TopicKey, partition: PartitionId) -> Option<(NodeId, bool)> {
        let view = self.metastore.view();
        let owner = view
            .state
            .topic(&topic.name)
            .and_then(|record| record.owner_of(partition))?;
        (owner != self.cluster.node()).then(|| (owner, view.state.is_alive(owner)))
    }
}

impl PartitionReader for Forwarding {
    fn read(
        &self,
        topic: &TopicKey,
        partition: PartitionId,
        offset: Offset,
    ) -> BoxFuture<'_, Result<ReadOutcome, ReplayError>> {
        let owner = match self.remote_owner(topic, partition) {
            Some((owner, true)) => owner,
            Some((_, false)) => return Box::pin(std::future::ready(Ok(ReadOutcome::OwnerDown))),
            None => return PartitionReader::read(&self.local, topic, partition, offset),
        };
        let body = Control::Replay {
            topic: topic.name.clone(),
            topic_id: topic.id,
            partition,
            offset,
        }
        .encode();
        let cluster = self.cluster.clone();
        Box::pin(async move {
            let answer = match cluster.call(owner, "replay", &body, REPLAY_TIMEOUT).await {
                Ok(answer) => answer,
                Err(error) => return Ok(ReadOutcome::PeerFailed(error.to_string())),
            };
            match ControlAnswer::decode(&answer) {
                Ok(ControlAnswer::Replay(ReplayAnswer::Record(record))) => {
                    Ok(ReadOutcome::Record(record))
                }
                Ok(ControlAnswer::Replay(ReplayAnswer::PastEnd)) => Ok(ReadOutcome::PastEnd),
                Ok(ControlAnswer::Replay(ReplayAnswer::Gone)) => Ok(ReadOutcome::Gone),
                Ok(ControlAnswer::Replay(ReplayAnswer::OtherIncarnation)) => {
                    Ok(ReadOutcome::OtherIncarnation)
                }
                Ok(ControlAnswer::Replay(ReplayAnswer::Failed(reason))) => Err(ReplayError(reason)),
                Ok(other) => Ok(ReadOutcome::PeerFailed(format!("owner answered {other:?}"))),
                Err(error) => Ok(ReadOutcome::PeerFailed(error.to_string())),
            }
        })
    }
}

/// How long a forwarded stat may take (a topic's GET asks one per partition owned elsewhere).
pub const STAT_TIMEOUT: Duration = Duration::from_secs(2);

impl PartitionStats for Forwarding {
    fn partition_stat(
        &self,
        topic: &TopicKey,
        partition: PartitionId,
    ) -> BoxFuture<'_, PartitionStat> {
        let owner = match self.remote_owner(topic, partition) {
            Some((owner, true)) => owner,
            // Owned here, unassigned, or its owner is dead: what this node holds (zeros when none).
            Some((_, false)) | None => {
                return PartitionStats::partition_stat(&self.local, topic, partition)
            }
        };
        let body = Control::Stat {
            topic: topic.name.clone(),
            topic_id: topic.id,
            partition,
        }
        .encode();
        let cluster = self.cluster.clone();
        Box::pin(async move {
            let answer = cluster.call(owner, "stat", &body, STAT_TIMEOUT).await;
            match answer.map(|bytes| ControlAnswer::decode(&bytes)) {
                Ok(Ok(ControlAnswer::Stat(stat))) => stat,
                // The figures are informative: an owner that cannot answer reports zeros.
                other => {
                    tracing::debug!(%owner, ?other, "partition figures not forwarded");
                    PartitionStat::default()
                }
            }
        })
    }
}

/// How long a forwarded queue-mode call may take beyond its wait.
pub const QUEUE_RPC_SLACK: Duration = Duration::from_secs(5);
/// How often an unpinned long poll asks the other owners again (it waits on this node's own
/// partitions in between, so a local commit still answers it at once).
pub const QUEUE_REMOTE_POLL: Duration = Duration::from_millis(100);

/// Queue-mode consume in a cluster: a partition's leases live on its owner. A pinned consume and every
/// ack go to the partition's owner (here, or forwarded with the whole wait); an unpinned consume tries
/// this node's partitions, then each live owner's once (no wait), and until its wait ends, long-polls
/// its own partitions for [`QUEUE_REMOTE_POLL`] between rounds.
#[derive(Debug)]
pub struct QueueForwarding {
    /// This node's queues.
    pub local: crate::node::consumers::Consumers,
    /// The transport to owners.
    pub cluster: Cluster,
    /// Who owns what, and who is alive.
    pub metastore: Metastore,
}

/// Where a partition's leases live.
enum QueueOwner {
    Here,
    Remote(NodeId),
    Down,
}

impl QueueForwarding {
    fn owner(&self, topic: &TopicKey, partition: PartitionId) -> QueueOwner {
        let view = self.metastore.view();
        match view
            .state
            .topic(&topic.name)
            .and_then(|record| record.owner_of(partition))
        {
            Some(owner) if owner == self.cluster.node() => QueueOwner::Here,
            Some(owner) if view.state.is_alive(owner) => QueueOwner::Remote(owner),
            Some(_) => QueueOwner::Down,
            // Unassigned (no member yet): nothing can be leased there; answered as empty.
            None => QueueOwner::Here,
        }
    }

    async fn remote_consume(
        &self,
        owner: NodeId,
        topic: &TopicKey,
        limits: crate::http::QueueLimits,
        partitions: Vec<PartitionId>,
        wait: Duration,
    ) -> crate::http::QueueOutcome {
        use crate::http::{Leased, QueueOutcome};
        let body = Control::QueueConsume {
            topic: topic.name.clone(),
            topic_id: topic.id,
            limits,
            partitions,
            wait_ms: u32::try_from(wait.as_millis()).unwrap_or(u32::MAX),
        }
        .encode();
        let answer = match self
            .cluster
            .call(owner, "queue_consume", &body, wait + QUEUE_RPC_SLACK)
            .await
        {
            Ok(answer) => answer,
            Err(error) => return QueueOutcome::PeerFailed(error.to_string()),
        };
        match ControlAnswer::decode(&answer) {
            Ok(ControlAnswer::Queue(Some(leased))) => QueueOutcome::Leased(Leased {
                partition: leased.handle.partition,
                record: leased.record,
                handle: leased.handle,
            }),
            Ok(ControlAnswer::Queue(None)) => QueueOutcome::Empty,
            Ok(other) => QueueOutcome::PeerFailed(format!("owner answered {other:?}")),
            Err(error) => QueueOutcome::PeerFailed(error.to_string()),
        }
    }

    async fn consume_any(
        &self,
        topic: &TopicKey,
        limits: crate::http::QueueLimits,
        partitions: u32,
        wait: Duration,
    ) -> crate::http::QueueOutcome {
        use crate::http::QueueOutcome;
        let clock = self.local.clock();
        let deadline = clock.now() + wait;
        loop {
            let mut local = Vec::new();
            let mut remote: BTreeMap<NodeId, Vec<PartitionId>> = BTreeMap::new();
            for partition in (0..partitions).map(PartitionId) {
                match self.owner(topic, partition) {
                    QueueOwner::Here => local.push(partition),
                    QueueOwner::Remote(owner) => remote.entry(owner).or_default().push(partition),
                    QueueOwner::Down => {}
                }
            }
            if let Some(leased) = self
                .local
                .consume(topic, limits, &local, Duration::ZERO)
                .await
            {
                return QueueOutcome::Leased(leased);
            }
            let mut failed = None;
            let asked = remote.len();
            for (owner, partitions) in remote {
                match self
                    .remote_consume(owner, topic, limits, partitions, Duration::ZERO)
                    .await
                {
                    QueueOutcome::Leased(leased) => return QueueOutcome::Leased(leased),
                    QueueOutcome::PeerFailed(reason) => failed = Some(reason),
                    QueueOutcome::Empty | QueueOutcome::OwnerDown => {}
                }
            }
            let now = clock.now();
            if now >= deadline {
                // Every owner asked failed and none is here: say so rather than "empty".
                return match failed {
                    Some(reason) if local.is_empty() && asked > 0 => {
                        QueueOutcome::PeerFailed(reason)
                    }
                    _ => QueueOutcome::Empty,
                };
            }
            let nap = deadline
                .saturating_duration_since(now)
                .min(QUEUE_REMOTE_POLL);
            if local.is_empty() {
                tokio::time::sleep(nap).await;
            } else if let Some(leased) = self.local.consume(topic, limits, &local, nap).await {
                return QueueOutcome::Leased(leased);
            }
        }
    }
}

impl crate::http::QueueConsumer for QueueForwarding {
    fn consume(
        &self,
        topic: &TopicKey,
        limits: crate::http::QueueLimits,
        partitions: u32,
        pinned: Option<PartitionId>,
        wait: Duration,
    ) -> BoxFuture<'_, crate::http::QueueOutcome> {
        use crate::http::QueueOutcome;
        let topic = topic.clone();
        Box::pin(async move {
            let Some(partition) = pinned else {
                return self.consume_any(&topic, limits, partitions, wait).await;
            };
            match self.owner(&topic, partition) {
                QueueOwner::Here => {
                    match self.local.consume(&topic, limits, &[partition], wait).await {
                        Some(leased) => QueueOutcome::Leased(leased),
                        None => QueueOutcome::Empty,
                    }
                }
                QueueOwner::Remote(owner) => {
                    self.remote_consume(owner, &topic, limits, vec![partition], wait)
                        .await
                }
                QueueOwner::Down => QueueOutcome::OwnerDown,
            }
        })
    }

    fn settle(
        &self,
        topic: &TopicKey,
        handle: crate::http::ReceiptHandle,
        action: crate::http::Settle,
    ) -> BoxFuture<'_, crate::http::SettleOutcome> {
        use crate::http::SettleOutcome;
        let topic = topic.clone();
        Box::pin(async move {
            let owner = match self.owner(&topic, handle.partition) {
                QueueOwner::Here => {
                    return settle_outcome(self.local.settle(&topic, handle, action).await);
                }
                QueueOwner::Down => return SettleOutcome::OwnerDown,
                QueueOwner::Remote(owner) => owner,
            };
            let body = Control::QueueSettle {
                topic: topic.name.clone(),
                topic_id: topic.id,
                handle,
                action,
            }
            .encode();
            let answer = match self
                .cluster
                .call(owner, "queue_settle", &body, QUEUE_RPC_SLACK)
                .await
            {
                Ok(answer) => answer,
                Err(error) => return SettleOutcome::PeerFailed(error.to_string()),
            };
            match ControlAnswer::decode(&answer) {
                Ok(ControlAnswer::Settled(result)) => settle_outcome(result),
                Ok(other) => SettleOutcome::PeerFailed(format!("owner answered {other:?}")),
                Err(error) => SettleOutcome::PeerFailed(error.to_string()),
            }
        })
    }
}

/// An ack, extend or nack's result as the HTTP seam answers it.
pub fn settle_outcome(
    result: Result<(), narad_core::consume::HandleError>,
) -> crate::http::SettleOutcome {
    use narad_core::consume::HandleError;
    match result {
        Ok(()) => crate::http::SettleOutcome::Done,
        Err(HandleError::Stale) => crate::http::SettleOutcome::Stale,
        Err(HandleError::AckedAheadFull) => crate::http::SettleOutcome::AckedAheadFull,
    }
}
