//! The owner side of the cluster transport: [`NodeInbound`] answers what peers ask (remote commits,
//! the synchronous produce, replay reads, partition figures, queue-mode consumes and acks, proposals
//! forwarded to this node).

use std::sync::Arc;
use std::time::Duration;

use narad_core::codec::cluster::{
    CommitAnswer, CommitProduce, Control, ControlAnswer, IdSection, ReplayAnswer, Request,
    WireRecord,
};
use narad_core::dispatcher::CommitFailure;
use narad_core::ids::{NodeId, Offset, PartitionId};
use narad_core::metastore::Command;
use narad_core::partition::{BatchRecord, CommittedRange};
use narad_core::planted::{Plant, PlantedBug};
use narad_core::routing::{PartitionChoice, PickError};

use crate::clock::Clock;
use crate::cluster::{Cluster, Inbound};
use crate::http::{BoxFuture, PartitionReader, ReadOutcome, TopicKey};
use crate::metastore::{Metastore, ProposeError};
use crate::metrics::Metrics;
use crate::node::partitions::{PartitionCommitError, PartitionHost};

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
    pub consumers: Option<crate::node::consumers::Consumers>,
    /// This node's move duties, for a move's copy reads, freeze and queue handoff (`None`:
    /// refused).
    pub moves: Option<crate::node::moves::Moves>,
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
        let picked = self
            .app
            .pick_sync_partition(&topic.name, topic.partitions(), choice, |p| {
                topic
                    .owner_of(p)
                    .is_some_and(|owner| !view.state.is_alive(owner))
            });
        let partition = match picked {
            Ok(partition) => partition,
            Err(PickError::NoLiveOwner) => {
                return ControlAnswer::Unavailable("no partition has a live owner".to_string())
            }
            Err(error) => return ControlAnswer::BadRequest(error.to_string()),
        };
        let owner = topic.owner_of(partition).unwrap_or(self.node);
        let deadline = clock.now() + request.budget;
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
        let moves = self.moves.clone();
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
                    let sides = Sides {
                        partitions: &partitions,
                        metastore: &metastore,
                        clock: &clock,
                        sync,
                        consumers: queue,
                        moves: moves.as_ref(),
                    };
                    control_answer(from, control, sides).await.encode()
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

/// What answers a [`Control`] request on this node.
struct Sides<'a> {
    partitions: &'a PartitionHost,
    metastore: &'a Metastore,
    clock: &'a Clock,
    sync: Option<Arc<SyncProduce>>,
    consumers: Option<&'a crate::node::consumers::Consumers>,
    moves: Option<&'a crate::node::moves::Moves>,
}

async fn control_answer(from: NodeId, control: Control, sides: Sides<'_>) -> ControlAnswer {
    let Sides {
        partitions,
        metastore,
        clock,
        sync,
        consumers,
        moves,
    } = sides;
    match control {
        Control::Raft { messages } => raft_answer(metastore, &messages),
        Control::Heartbeat { from: said } => {
            // The connection's authenticated peer, not what the frame says.
            if said != from {
                return ControlAnswer::BadRequest("heartbeat for another node".to_string());
            }
            metastore.heard(from);
            ControlAnswer::Done
        }
        Control::Propose { command } => propose_answer(metastore, &command).await,
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
            replay_answer(partitions, &key, partition, offset).await
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
            let wait = Duration::from_millis(u64::from(wait_ms));
            queue_consume_answer(consumers, &key, limits, asked, wait).await
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
        control @ (Control::MoveRead { .. }
        | Control::MoveFreeze { .. }
        | Control::MoveQueue { .. }) => match moves {
            Some(moves) => moves.answer(from, control).await,
            None => ControlAnswer::BadRequest("partition moves are not served here".into()),
        },
    }
}

/// Raft messages from a peer, stepped into this node's metastore.
fn raft_answer(metastore: &Metastore, messages: &[Vec<u8>]) -> ControlAnswer {
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

/// A proposal forwarded to this node, answered with the index it is applied at (or before), so the
/// proposer can read its write.
async fn propose_answer(metastore: &Metastore, command: &[u8]) -> ControlAnswer {
    let outcome = match Command::decode(command) {
        Ok(command) => metastore
            .propose_here(command)
            .await
            .map(|applied| (applied, metastore.view().applied_index)),
        Err(error) => Err(ProposeError::Unavailable(error.to_string())),
    };
    ControlAnswer::Proposed(postcard::to_stdvec(&outcome).expect("postcard encodes to a Vec"))
}

/// A replay read forwarded to this node: only a local read is an answer.
async fn replay_answer(
    partitions: &PartitionHost,
    key: &TopicKey,
    partition: PartitionId,
    offset: Offset,
) -> ControlAnswer {
    let read = PartitionReader::read(partitions, key, partition, offset).await;
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

/// A queue-mode consume forwarded to this node, over the partitions asked that it owns now (the
/// asker's view may lag a reassignment).
async fn queue_consume_answer(
    consumers: &crate::node::consumers::Consumers,
    key: &TopicKey,
    limits: narad_core::consume::QueueLimits,
    asked: Vec<PartitionId>,
    wait: Duration,
) -> ControlAnswer {
    let owned = consumers.owned(key, asked.iter().map(|p| p.0 + 1).max().unwrap_or(0));
    let candidates: Vec<PartitionId> = asked.into_iter().filter(|p| owned.contains(p)).collect();
    let leased = consumers.consume(key, limits, &candidates, wait).await;
    ControlAnswer::Queue(
        leased.map(|leased| narad_core::codec::cluster::LeasedRecord {
            record: leased.record,
            handle: leased.handle,
        }),
    )
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
