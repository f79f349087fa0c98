//! The node's side of the cluster transport: what it asks peers ([`RemoteTransport`] for commits,
//! [`ClusterPeers`] for the metastore, [`Forwarding`] for replay reads and partition figures, the heartbeats) and how
//! it answers them ([`NodeInbound`]).
//!
//! # Owner side
//! A remote `CommitProduceBatch` enters this node's partition host exactly as a local commit does: the
//! same combiner, under the same checks under the produce lock (ownership and freeze, the log current,
//! the caller still waiting, the incarnation). The caller's remaining budget rides in the frame, so a
//! batch whose caller gave up is left out of a cycle that starts after it. The combiner's refusal is
//! answered as the wire's: not owner; 412 naming both incarnations (logged at info); 400 for a frame
//! that does not decode (trailing bytes from a newer sender among them).
//!
//! # Synchronous produce
//! The node RPC `Produce` op ([`SyncProduce`]) is the synchronous path: no ingress WAL, validated as
//! an HTTP produce, placed by `PartitionPicker::pick_for_sync_produce` (the accept-time choice, then
//! forward past partitions whose owner membership reports dead; a pinned partition is kept), and
//! committed on the owner, here or over `CommitProduce` with the record's incarnation id. It answers
//! the partition and offset once the record is visible. HTTP produces never take this path.
//!
//! # Dispatcher side
//! [`RemoteTransport`] is the node's one [`CommitTransport`] in a cluster: a local owner goes to the
//! [`LocalTransport`], a remote one over QUIC on what is left of the commit's budget (30 s, a probe's
//! 5 s). The incarnation section is written iff the dispatcher asks for ids (`with_ids`) and a record
//! has one. A 400 to a batch that carried the section is [`CommitFailure::RefusedTrailingIds`] (the
//! dispatcher resends without ids and remembers the owner as legacy); a 412 is
//! [`CommitFailure::IncarnationMismatch`]; an unreachable peer is `Unavailable`, a call past its
//! budget `Timeout`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use narad_core::codec::cluster::{
    CommitAnswer, CommitProduce, CommitProduceBatch, Control, ControlAnswer, IdSection,
    ReplayAnswer, Request, WireRecord,
};
use narad_core::dispatcher::{CommitFailure, CommitOwner, SendCommit};
use narad_core::ids::{NodeId, Offset, PartitionId};
use narad_core::metastore::liveness::HEARTBEAT_INTERVAL;
use narad_core::metastore::{Applied, Command};
use narad_core::partition::{BatchRecord, CommittedRange};
use narad_core::planted::{Plant, PlantedBug};
use narad_core::routing::{PartitionChoice, PartitionPicker, PickError};
use tokio::sync::mpsc;

use super::partitions::{PartitionCommitError, PartitionHost};
use super::transport::{CommitOutcome, CommitTransport, LocalTransport};
use crate::clock::Clock;
use crate::cluster::{Cluster, Inbound, RpcError};
use crate::http::{
    BoxFuture, PartitionReader, PartitionStat, PartitionStats, ReadError, ReadOutcome, TopicKey,
};
use crate::metastore::{DeliveryReports, MetaPeers, Metastore, ProposeError, PROPOSE_TIMEOUT};
use crate::metrics::Metrics;

/// Raft batches queued for one peer before more are dropped (raft sends again).
pub const RAFT_QUEUE_MAX: usize = 256;
/// How long one raft delivery may take.
pub const RAFT_SEND_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a forwarded replay read may take.
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(10);

/// The metastore's way to its peers over the cluster transport.
#[derive(Debug)]
pub struct ClusterPeers {
    cluster: Cluster,
    queues: BTreeMap<NodeId, mpsc::Sender<RaftBatch>>,
    /// Where deliveries are reported, once the metastore is open.
    metastore: Arc<std::sync::OnceLock<DeliveryReports>>,
}

/// Raft messages for one peer, and whether one carries a snapshot.
type RaftBatch = (Vec<Vec<u8>>, bool);

impl ClusterPeers {
    /// One sender task per peer, delivering raft messages in order.
    pub fn new(cluster: Cluster) -> Arc<ClusterPeers> {
        let mut queues = BTreeMap::new();
        let metastore = Arc::new(std::sync::OnceLock::new());
        for peer in cluster.peers() {
            let (sender, receiver) = mpsc::channel(RAFT_QUEUE_MAX);
            queues.insert(peer, sender);
            let cluster = cluster.clone();
            tokio::spawn(deliver_raft(cluster, peer, receiver, metastore.clone()));
        }
        Arc::new(ClusterPeers {
            cluster,
            queues,
            metastore,
        })
    }

    /// Names the metastore deliveries are reported to (once it is open).
    pub fn report_to(&self, metastore: &Metastore) {
        let _ = self.metastore.set(metastore.delivery_reports());
    }
}

/// Sends each queued batch, with whatever queued behind it, as one call, and reports how it went.
async fn deliver_raft(
    cluster: Cluster,
    peer: NodeId,
    mut queue: mpsc::Receiver<RaftBatch>,
    metastore: Arc<std::sync::OnceLock<DeliveryReports>>,
) {
    loop {
        let next = tokio::select! {
            next = queue.recv() => next,
            () = cluster.closed() => None,
        };
        let Some((mut messages, mut snapshot)) = next else {
            return;
        };
        while let Ok((more, more_snapshot)) = queue.try_recv() {
            messages.extend(more);
            snapshot |= more_snapshot;
        }
        let body = Control::Raft { messages }.encode();
        let delivered = match cluster.call(peer, "raft", &body, RAFT_SEND_TIMEOUT).await {
            Ok(_) => true,
            Err(error) => {
                tracing::debug!(%peer, %error, "raft messages not delivered");
                false
            }
        };
        if snapshot || !delivered {
            if let Some(metastore) = metastore.get() {
                metastore.report(peer, delivered, snapshot);
            }
        }
    }
}

impl MetaPeers for ClusterPeers {
    fn send_raft(&self, to: NodeId, messages: Vec<Vec<u8>>, snapshot: bool) {
        if let Some(queue) = self.queues.get(&to) {
            if queue.try_send((messages, snapshot)).is_err() && snapshot {
                // A dropped snapshot must be reported, or raft waits for it forever.
                if let Some(metastore) = self.metastore.get() {
                    metastore.report(to, false, true);
                }
            }
        }
    }

    fn propose_at(
        &self,
        leader: NodeId,
        command: Vec<u8>,
    ) -> BoxFuture<'static, Result<(Applied, u64), ProposeError>> {
        let cluster = self.cluster.clone();
        Box::pin(async move {
            let body = Control::Propose { command }.encode();
            let answer = cluster
                .call(leader, "propose", &body, PROPOSE_TIMEOUT)
                .await
                .map_err(|error| ProposeError::Unavailable(error.to_string()))?;
            match ControlAnswer::decode(&answer) {
                Ok(ControlAnswer::Proposed(bytes)) => postcard::from_bytes(&bytes)
                    .map_err(|error| ProposeError::Unavailable(error.to_string()))?,
                Ok(other) => Err(ProposeError::Unavailable(format!(
                    "the leader answered {other:?}"
                ))),
                Err(error) => Err(ProposeError::Unavailable(error.to_string())),
            }
        })
    }
}

/// Sends a heartbeat to every peer each [`HEARTBEAT_INTERVAL`], until the cluster closes.
pub fn spawn_heartbeats(cluster: Cluster) {
    tokio::spawn(async move {
        let body = Control::Heartbeat {
            from: cluster.node(),
        }
        .encode();
        let mut interval = tokio::time::interval(HEARTBEAT_INTERVAL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                () = cluster.closed() => return,
            }
            for peer in cluster.peers().collect::<Vec<_>>() {
                let cluster = cluster.clone();
                let body = body.clone();
                tokio::spawn(async move {
                    let _ = cluster
                        .call(peer, "heartbeat", &body, HEARTBEAT_INTERVAL)
                        .await;
                });
            }
        }
    });
}

/// Commits to local owners on this node, to remote ones over QUIC.
#[derive(Debug)]
pub struct RemoteTransport {
    local: LocalTransport,
    cluster: Cluster,
    clock: Clock,
}

impl RemoteTransport {
    /// The cluster's commit transport.
    pub fn new(local: LocalTransport, cluster: Cluster, clock: Clock) -> RemoteTransport {
        RemoteTransport {
            local,
            cluster,
            clock,
        }
    }
}

impl CommitTransport for RemoteTransport {
    fn commit(&self, commit: SendCommit) -> BoxFuture<'static, CommitOutcome> {
        let CommitOwner::Remote(node) = commit.owner else {
            return self.local.commit(commit);
        };
        let with_ids = commit.with_ids;
        let records: Vec<WireRecord> = commit
            .records
            .iter()
            .map(|record| WireRecord {
                topic_id: if with_ids { record.topic_id() } else { None },
                key: record.key().map(<[u8]>::to_vec),
                payload: record.payload().to_vec(),
            })
            .collect();
        let carried_ids = records.iter().any(|record| record.topic_id.is_some());
        let budget = commit.deadline.saturating_duration_since(self.clock.now());
        let batch = CommitProduceBatch {
            budget_ms: u32::try_from(budget.as_millis()).unwrap_or(u32::MAX),
            topic: commit.topic.to_string(),
            partition: commit.partition,
            records,
        };
        drop(commit);
        let cluster = self.cluster.clone();
        Box::pin(async move {
            let body = batch.encode();
            drop(batch);
            let answer = cluster.call(node, "commit_batch", &body, budget).await;
            match answer {
                Ok(answer) => commit_outcome(&answer, carried_ids),
                Err(RpcError::Timeout(_)) => Err(CommitFailure::Timeout),
                Err(RpcError::TooLarge(error)) => Err(CommitFailure::Failed(error.to_string())),
                Err(error @ (RpcError::UnknownPeer(_) | RpcError::Unreachable { .. })) => {
                    Err(CommitFailure::Unavailable(error.to_string()))
                }
            }
        })
    }
}

/// The dispatcher's form of an owner's answer.
pub(crate) fn commit_outcome(answer: &[u8], carried_ids: bool) -> CommitOutcome {
    match CommitAnswer::decode(answer) {
        Ok(CommitAnswer::Committed {
            base,
            count,
            committed_at_ms,
        }) => Ok(CommittedRange {
            base,
            count,
            committed_at_ms,
        }),
        Ok(CommitAnswer::NotOwner) => Err(CommitFailure::NotOwner),
        Ok(CommitAnswer::IncarnationMismatch {
            record_topic_id,
            live_topic_id,
        }) => Err(CommitFailure::IncarnationMismatch {
            record_topic_id,
            live_topic_id,
        }),
        Ok(CommitAnswer::BadRequest(_)) if carried_ids => Err(CommitFailure::RefusedTrailingIds),
        Ok(CommitAnswer::BadRequest(reason)) => Err(CommitFailure::Failed(reason)),
        Ok(CommitAnswer::Unavailable(reason)) => Err(CommitFailure::Unavailable(reason)),
        Ok(CommitAnswer::Failed(reason)) => Err(CommitFailure::Failed(reason)),
        Err(error) => Err(CommitFailure::Failed(format!(
            "undecodable commit answer: {error}"
        ))),
    }
}

/// The wire's form of a commit's outcome on this node.
fn commit_answer(
    outcome: Result<CommittedRange, PartitionCommitError>,
    metrics: &Metrics,
) -> CommitAnswer {
    let failure = match outcome {
        Ok(range) => {
            return CommitAnswer::Committed {
                base: range.base,
                count: range.count,
                committed_at_ms: range.committed_at_ms,
            }
        }
        Err(PartitionCommitError::Stopped) => {
            return CommitAnswer::Unavailable("the partition host has stopped".to_string())
        }
        Err(PartitionCommitError::Combiner(error)) => CommitFailure::from(error),
    };
    match failure {
        CommitFailure::NotOwner => CommitAnswer::NotOwner,
        CommitFailure::IncarnationMismatch {
            record_topic_id,
            live_topic_id,
        } => {
            metrics.cluster_incarnation_refusals.inc();
            tracing::info!(
                record_topic_id = %record_topic_id,
                live_topic_id = ?live_topic_id.map(|id| id.0),
                "refused a remote commit for another topic incarnation (412)"
            );
            CommitAnswer::IncarnationMismatch {
                record_topic_id,
                live_topic_id,
            }
        }
        CommitFailure::RefusedTrailingIds => {
            CommitAnswer::BadRequest("trailing incarnation ids".to_string())
        }
        CommitFailure::Unavailable(reason) => CommitAnswer::Unavailable(reason),
        CommitFailure::Failed(reason) => CommitAnswer::Failed(reason),
        CommitFailure::Timeout => CommitAnswer::Unavailable("the caller gave up".to_string()),
    }
}

/// Answers the requests peers send this node.
#[derive(Debug)]
pub struct NodeInbound {
    /// This node's partition host.
    pub partitions: PartitionHost,
    /// This node's metastore.
    pub metastore: Metastore,
    /// The node's clock (commit budgets).
    pub clock: Clock,
    /// Reads the trailing incarnation section (`Refuse`: behave as an owner from before it).
    pub ids: IdSection,
    /// Serves the synchronous `Produce` op (`None`: refused as a bad request).
    pub sync: Option<Arc<SyncProduce>>,
    /// Counts the 412s answered.
    pub metrics: Arc<Metrics>,
    /// The bug planted in the owner side (simulator only; [`Plant::NONE`] everywhere else).
    pub plant: Plant,
    /// This node's queues, for forwarded queue-mode consumes and acks (`None`: refused).
    pub consumers: Option<super::consumers::Consumers>,
}

/// What the synchronous `Produce` op needs besides the owner side's parts.
#[derive(Debug)]
pub struct SyncProduce {
    /// This node's member id (a partition it owns commits here).
    pub node: NodeId,
    /// Validation as an HTTP produce's (schemas, limits, rejection metrics).
    pub app: Arc<crate::http::App>,
    /// The transport to other owners (`None`: a partition owned elsewhere is unavailable).
    pub cluster: Option<Cluster>,
    /// The synchronous picker: the accept-time choice, then past partitions with a dead owner.
    pub picker: std::sync::Mutex<PartitionPicker>,
}

/// A synchronous produce's request, as decoded.
struct SyncRequest {
    topic: String,
    key: Option<Vec<u8>>,
    partition: Option<PartitionId>,
    payload: Vec<u8>,
    budget: Duration,
}

impl SyncProduce {
    /// Validates, picks, commits on the owner and answers where the record is.
    async fn produce(
        &self,
        request: SyncRequest,
        partitions: &PartitionHost,
        metastore: &Metastore,
        clock: &Clock,
    ) -> ControlAnswer {
        let view = metastore.view();
        let Some(topic) = view.state.topic(&request.topic).cloned() else {
            return ControlAnswer::BadRequest("topic not found".to_string());
        };
        if let Err(reason) = crate::http::produce::check_sync_produce(
            &self.app,
            &topic,
            request.key.as_deref(),
            request.partition,
            &request.payload,
        ) {
            return ControlAnswer::BadRequest(reason);
        }
        let choice = match (request.partition, request.key.as_deref()) {
            (Some(partition), _) => PartitionChoice::Pinned(partition),
            (None, Some(key)) => PartitionChoice::Key(key),
            (None, None) => PartitionChoice::Keyless,
        };
        let now = clock.now();
        let picked = {
            let mut picker = self
                .picker
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            picker.pick_for_sync_produce(now, &topic.name, topic.partitions(), choice, |p| {
                topic
                    .owner_of(p)
                    .is_some_and(|owner| !view.state.is_alive(owner))
            })
        };
        let partition = match picked {
            Ok(partition) => partition,
            Err(PickError::NoLiveOwner) => {
                return ControlAnswer::Unavailable("no partition has a live owner".to_string())
            }
            Err(error) => return ControlAnswer::BadRequest(error.to_string()),
        };
        let owner = topic.owner_of(partition).unwrap_or(self.node);
        let deadline = now + request.budget;
        let offset = if owner == self.node {
            let record = BatchRecord {
                topic_id: Some(topic.id),
                key: request.key,
                payload: request.payload,
            };
            partitions
                .commit(topic.name.into(), partition, vec![record], Some(deadline))
                .await
                .map(|range| range.base)
                .map_err(|error| error.to_string())
        } else {
            self.commit_remote(owner, &topic, partition, request).await
        };
        match offset {
            Ok(offset) => ControlAnswer::Produced { partition, offset },
            Err(reason) => ControlAnswer::Unavailable(reason),
        }
    }

    /// Commits the record on its owner over `CommitProduce`, with its incarnation id.
    async fn commit_remote(
        &self,
        owner: NodeId,
        topic: &narad_core::metastore::Topic,
        partition: PartitionId,
        request: SyncRequest,
    ) -> Result<Offset, String> {
        let Some(cluster) = &self.cluster else {
            return Err(format!(
                "partition owned by node {owner}: no cluster transport"
            ));
        };
        let body = CommitProduce {
            budget_ms: u32::try_from(request.budget.as_millis()).unwrap_or(u32::MAX),
            topic: topic.name.clone(),
            partition,
            record: WireRecord {
                topic_id: Some(topic.id),
                key: request.key,
                payload: request.payload,
            },
        }
        .encode();
        let answer = cluster
            .call(owner, "commit_produce", &body, request.budget)
            .await
            .map_err(|error| error.to_string())?;
        match CommitAnswer::decode(&answer) {
            Ok(CommitAnswer::Committed { base, .. }) => Ok(base),
            Ok(other) => Err(format!("owner node {owner} answered {other:?}")),
            Err(error) => Err(format!("owner node {owner}: {error}")),
        }
    }
}

impl Inbound for NodeInbound {
    fn handle(&self, from: NodeId, body: Vec<u8>) -> BoxFuture<'static, Vec<u8>> {
        let request = Request::decode(&body, self.ids);
        drop(body);
        let partitions = self.partitions.clone();
        let metastore = self.metastore.clone();
        let clock = self.clock.clone();
        let sync = self.sync.clone();
        let metrics = self.metrics.clone();
        let plant = self.plant;
        let consumers = self.consumers.clone();
        Box::pin(async move {
            match request {
                Ok(Request::CommitProduceBatch(batch)) => {
                    let deadline = clock.now() + Duration::from_millis(u64::from(batch.budget_ms));
                    let records: Vec<BatchRecord> = batch
                        .records
                        .into_iter()
                        .map(|record| planted_record(plant, record))
                        .collect();
                    let topic: Arc<str> = batch.topic.into();
                    if plant.is(PlantedBug::RemoteAckBeforeFsync) {
                        // Planted: answered before anything is appended, let alone synced.
                        let count = records.len() as u64;
                        tokio::spawn(async move {
                            let _ = partitions
                                .commit(topic, batch.partition, records, Some(deadline))
                                .await;
                        });
                        return CommitAnswer::Committed {
                            base: Offset(0),
                            count,
                            committed_at_ms: 0,
                        }
                        .encode();
                    }
                    let outcome = partitions
                        .commit(topic, batch.partition, records, Some(deadline))
                        .await;
                    commit_answer(outcome, &metrics).encode()
                }
                Ok(Request::CommitProduce(single)) => {
                    let deadline = clock.now() + Duration::from_millis(u64::from(single.budget_ms));
                    let records = vec![planted_record(plant, single.record)];
                    let outcome = partitions
                        .commit(
                            single.topic.into(),
                            single.partition,
                            records,
                            Some(deadline),
                        )
                        .await;
                    commit_answer(outcome, &metrics).encode()
                }
                Ok(Request::Control(control)) => {
                    let queue = consumers.as_ref();
                    control_answer(from, control, &partitions, &metastore, &clock, sync, queue)
                        .await
                        .encode()
                }
                // The 400 an older owner gives a newer sender's trailing data.
                Err(error) => {
                    CommitAnswer::BadRequest(format!("malformed request: {error}")).encode()
                }
            }
        })
    }
}

/// [`batch_record`], with the planted `owner-ignores-trailing-ids` dropping the record's id.
fn planted_record(plant: Plant, record: WireRecord) -> BatchRecord {
    let mut record = batch_record(record);
    if plant.is(PlantedBug::OwnerIgnoresTrailingIds) {
        record.topic_id = None; // Planted: committed by name, whatever its incarnation.
    }
    record
}

fn batch_record(record: WireRecord) -> BatchRecord {
    BatchRecord {
        topic_id: record.topic_id,
        key: record.key,
        payload: record.payload,
    }
}

async fn control_answer(
    from: NodeId,
    control: Control,
    partitions: &PartitionHost,
    metastore: &Metastore,
    clock: &Clock,
    sync: Option<Arc<SyncProduce>>,
    consumers: Option<&super::consumers::Consumers>,
) -> ControlAnswer {
    match control {
        Control::Raft { messages } => {
            use protobuf::Message as _;
            let decoded: Result<Vec<raft::eraftpb::Message>, _> = messages
                .iter()
                .map(|bytes| raft::eraftpb::Message::parse_from_bytes(bytes))
                .collect();
            match decoded {
                Ok(messages) => {
                    metastore.step(messages);
                    ControlAnswer::Done
                }
                Err(error) => ControlAnswer::BadRequest(format!("raft message: {error}")),
            }
        }
        Control::Heartbeat { from: said } => {
            // The connection's authenticated peer, not what the frame says.
            if said != from {
                return ControlAnswer::BadRequest("heartbeat for another node".to_string());
            }
            metastore.heard(from);
            ControlAnswer::Done
        }
        Control::Propose { command } => {
            let outcome = match Command::decode(&command) {
                // With the index it is applied at (or before), so the proposer can read its write.
                Ok(command) => metastore
                    .propose_here(command)
                    .await
                    .map(|applied| (applied, metastore.view().applied_index)),
                Err(error) => Err(ProposeError::Unavailable(error.to_string())),
            };
            ControlAnswer::Proposed(
                postcard::to_stdvec(&outcome).expect("postcard encodes to a Vec"),
            )
        }
        Control::ReadIndex => match metastore.read_index().await {
            Ok(()) => ControlAnswer::ReadIndex {
                index: metastore.view().applied_index,
            },
            Err(error) => ControlAnswer::Unavailable(error.to_string()),
        },
        Control::Replay {
            topic,
            topic_id,
            partition,
            offset,
        } => {
            let key = TopicKey {
                name: topic,
                id: topic_id,
            };
            let read = PartitionReader::read(partitions, &key, partition, offset).await;
            ControlAnswer::Replay(match read {
                Ok(ReadOutcome::Record(record)) => ReplayAnswer::Record(record),
                Ok(ReadOutcome::PastEnd) => ReplayAnswer::PastEnd,
                Ok(ReadOutcome::Gone) => ReplayAnswer::Gone,
                Ok(ReadOutcome::OtherIncarnation) => ReplayAnswer::OtherIncarnation,
                Ok(ReadOutcome::OwnerDown | ReadOutcome::PeerFailed(_)) => {
                    ReplayAnswer::Failed("not a local read".to_string())
                }
                Err(error) => ReplayAnswer::Failed(error.to_string()),
            })
        }
        Control::Stat {
            topic,
            topic_id,
            partition,
        } => {
            let key = TopicKey {
                name: topic,
                id: topic_id,
            };
            ControlAnswer::Stat(partitions.stat(&key, partition).await)
        }
        Control::Produce {
            topic,
            key,
            partition,
            payload,
            budget_ms,
        } => {
            let Some(sync) = sync else {
                return ControlAnswer::BadRequest("produce is not served here".to_string());
            };
            let request = SyncRequest {
                topic,
                key,
                partition,
                payload,
                budget: Duration::from_millis(u64::from(budget_ms)),
            };
            sync.produce(request, partitions, metastore, clock).await
        }
        Control::QueueConsume {
            topic,
            topic_id,
            limits,
            partitions: asked,
            wait_ms,
        } => {
            let Some(consumers) = consumers else {
                return ControlAnswer::BadRequest("queue-mode consume is not served here".into());
            };
            let key = TopicKey {
                name: topic,
                id: topic_id,
            };
            // Only what this node owns now: the asker's view may lag a reassignment.
            let owned = consumers.owned(&key, asked.iter().map(|p| p.0 + 1).max().unwrap_or(0));
            let candidates: Vec<PartitionId> =
                asked.into_iter().filter(|p| owned.contains(p)).collect();
            let wait = Duration::from_millis(u64::from(wait_ms));
            let leased = consumers.consume(&key, limits, &candidates, wait).await;
            ControlAnswer::Queue(
                leased.map(|leased| narad_core::codec::cluster::LeasedRecord {
                    record: leased.record,
                    handle: leased.handle,
                }),
            )
        }
        Control::QueueSettle {
            topic,
            topic_id,
            handle,
            action,
        } => {
            let Some(consumers) = consumers else {
                return ControlAnswer::BadRequest("queue-mode ack is not served here".into());
            };
            let key = TopicKey {
                name: topic,
                id: topic_id,
            };
            ControlAnswer::Settled(consumers.settle(&key, handle, action).await)
        }
    }
}

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
    ) -> BoxFuture<'_, Result<ReadOutcome, ReadError>> {
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
                Ok(ControlAnswer::Replay(ReplayAnswer::Failed(reason))) => Err(ReadError(reason)),
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
    pub local: super::consumers::Consumers,
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
