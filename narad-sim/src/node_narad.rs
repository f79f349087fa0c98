//! `NaradSimNode`: the real node ([`narad_node::node`]) behind the harness's [`SimNode`] seam.
//!
//! Each boot calls [`narad_node::node::start`] inside the node's madsim node with
//! - the run's [`SimDisk`] wrapped in [`LatencyDisk`], whose [`Disk::latency`] is the harness's
//!   [`SimIo`] model, so the node's I/O executors take each op's simulated latency in simulated time
//!   (one wait per sync: see `narad_node::io::run_request`);
//! - a [`Clock`] started at boot (madsim's virtual `Instant`), and a seed derived from the run's seed and
//!   the boot number (the keyless rotations' starts; raft's election jitter is irrelevant: a single
//!   voter campaigns at once);
//! - [`NodeHooks`]: a observer bridged to the harness's [`Observer`] (trace events and the hosts' invariant
//!   checks), the scenario's file sizes, and the planted bug, if any;
//!
//! and returns once recovery finished ([`narad_node::node::Node::wait_ready`]). A failed recovery is a
//! failed boot: the harness restarts the process.
//!
//! Every call goes through the same route functions the HTTP server calls
//! ([`narad_node::http::produce`], [`narad_node::http::topics`], [`narad_node::http::consume`]), with the
//! request built as a client would send it (query string, JSON batch body with base64 payloads), so
//! validation, partition choice and status mapping are exercised: 2xx is success, 4xx a refusal,
//! anything else a failure. The route answers carry no incarnation id, so the adapter reads it from the
//! node's metastore replica (as `GET /v1/topics` would show it if it did). Reads go to the partition
//! host in bulk (what the consume route calls with one record), skipping an unreadable (damaged)
//! offset as a consumer skips a 410 (the checker excuses what bit rot destroyed); the first record of
//! every read is served through the consume route too and must agree.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use narad_core::disk::sim::SimDisk;
use narad_core::disk::{Disk, DiskLayer, IoOp};
use narad_core::partition::LogReadError;
use narad_core::partition::PartitionReadError;
use narad_core::planted::Plant;
use narad_core::{Offset, PartitionId};
use narad_node::clock::Clock;
use narad_node::cluster::tls::{NodeIdentity, TlsIdentity};
use narad_node::cluster::ClusterOptions;
use narad_node::config::Config;
use narad_node::hooks::{NodeHooks, StorageSizes};
use narad_node::http::{self, Body, Reply, TopicKey};
use narad_node::node::{self, ClusterSetup, Node, NodeOptions};
use narad_node::observer::{Invariant, NodeObserver};

use crate::seam::{
    derive_seed, AckAnswer, ClusterOp, DiskLayout, Leased, NodeContext, NodeError, NodeStatus,
    Observer, PlantedBug, ProduceRecord, ReadBatch, ReadRecord, SimIo, SimNode, TopicInfo,
};

/// The cluster secret every simulated member shares.
const CLUSTER_SECRET: &[u8] = b"narad-sim-cluster-secret";

/// The simulated disk with the harness's latency model.
struct LatencyDisk {
    inner: SimDisk,
    io: SimIo,
}

impl DiskLayer for LatencyDisk {
    fn inner(&self) -> &dyn Disk {
        &self.inner
    }
    fn latency(&self, op: &IoOp) -> Duration {
        self.io.op_delay(op)
    }
}

/// The node's observer, reporting into the harness's; in a cluster each source names its node
/// (`wal@1`).
struct ProbeBridge {
    observer: Observer,
    node: Option<usize>,
}

impl ProbeBridge {
    fn source<'a>(&self, source: &'a str) -> std::borrow::Cow<'a, str> {
        match self.node {
            Some(node) => format!("{source}@{node}").into(),
            None => source.into(),
        }
    }
}

impl NodeObserver for ProbeBridge {
    fn event(&self, source: &str, args: std::fmt::Arguments<'_>) {
        self.observer.event(&self.source(source), args);
    }

    fn event_fields(
        &self,
        source: &str,
        fields: &[narad_node::observer::TraceField<'_>],
        text: std::fmt::Arguments<'_>,
    ) {
        self.observer
            .event_fields(&self.source(source), fields, text);
    }

    fn violation(&self, invariant: Invariant, args: std::fmt::Arguments<'_>) {
        match self.node {
            Some(node) => self
                .observer
                .violation(invariant.name(), format_args!("node {node}: {args}")),
            None => self.observer.violation(invariant.name(), args),
        }
    }
}

/// The real node under simulation. Cloning shares it.
#[derive(Clone)]
pub struct NaradSimNode {
    node: Node,
    observer: Observer,
    /// A single node (no cluster): it leads its own metastore.
    single: bool,
    /// Its member id.
    own: narad_core::NodeId,
    /// Every topic's retention (`[retention]`; 0: the node's default).
    retention: crate::scenario::RetentionSpec,
}

/// A cluster member's transport: the run's members as peers, the shared secret, and the QUIC
/// endpoint's randomness and the node's certificate from its seed (so every run replays).
fn cluster_setup(
    ctx: &NodeContext,
    index: usize,
    own_addr: std::net::SocketAddr,
) -> Result<ClusterSetup, String> {
    let peers = ctx
        .members
        .iter()
        .enumerate()
        .map(|(member, addr)| (narad_core::NodeId(member as u32 + 1), addr.to_string()))
        .collect();
    let seed32 = |label: &str| {
        let mut bytes = [0u8; 32];
        for (chunk, part) in bytes.chunks_mut(8).zip(0u64..) {
            let word = derive_seed(ctx.seed, &format!("{label}/{}/{part}", ctx.boot));
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        bytes
    };
    let identity = NodeIdentity::from_seed(seed32("tls"))
        .map_err(|error| format!("cluster identity: {error}"))?;
    Ok(ClusterSetup {
        options: ClusterOptions {
            node: narad_core::NodeId(index as u32 + 1),
            bind: own_addr,
            peers,
            secret: CLUSTER_SECRET.to_vec(),
            rng_seed: Some(seed32("quic")),
        },
        identity: TlsIdentity::SelfSigned(identity),
    })
}

/// Maps a route's answer: 2xx `Ok`, 4xx refused, anything else failed.
fn status_of(reply: &Reply) -> Result<(), NodeError> {
    match reply.status {
        200..=299 => Ok(()),
        // 507 (the disk guard) is answered before anything is stored, as a 4xx is.
        400..=499 | 507 => Err(NodeError::Refused(format!(
            "{} {}",
            reply.status,
            reply.text().trim_end()
        ))),
        _ => Err(NodeError::Failed(format!(
            "{} {}",
            reply.status,
            reply.text().trim_end()
        ))),
    }
}

fn nonzero(bytes: u64) -> Option<u64> {
    (bytes != 0).then_some(bytes)
}

/// `key=…&partition=…` as a client would send it.
fn produce_query(key: Option<&[u8]>, partition: Option<PartitionId>) -> Option<String> {
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(key) = key {
        query.append_pair("key", &String::from_utf8_lossy(key));
    }
    if let Some(partition) = partition {
        query.append_pair("partition", &partition.0.to_string());
    }
    let query = query.finish();
    (!query.is_empty()).then_some(query)
}

/// A batch body: every payload base64-encoded (the harness's payloads are binary).
fn batch_body(partition: Option<PartitionId>, records: &[ProduceRecord]) -> Vec<u8> {
    let messages: Vec<serde_json::Value> = records
        .iter()
        .map(|record| {
            let mut message = serde_json::Map::new();
            if let Some(key) = &record.key {
                message.insert(
                    "key".into(),
                    String::from_utf8_lossy(key).into_owned().into(),
                );
            }
            if let Some(partition) = partition {
                message.insert("partition".into(), partition.0.into());
            }
            message.insert(
                "payload".into(),
                base64::engine::general_purpose::STANDARD
                    .encode(&record.payload)
                    .into(),
            );
            message.insert("payload_encoding".into(), "base64".into());
            serde_json::Value::Object(message)
        })
        .collect();
    serde_json::json!({ "messages": messages })
        .to_string()
        .into_bytes()
}

/// The payload bytes of a consumed message JSON (raw JSON, a JSON string, or base64).
fn consumed_payload(body: &[u8]) -> Result<(u64, Vec<u8>), String> {
    let message: serde_json::Value =
        serde_json::from_slice(body).map_err(|error| format!("consume JSON: {error}"))?;
    let offset = message["offset"]
        .as_u64()
        .ok_or("consume JSON without an offset")?;
    let payload = &message["payload"];
    let bytes = match (message["payload_encoding"].as_str(), payload) {
        (Some("base64"), serde_json::Value::String(text)) => {
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|error| format!("consume payload base64: {error}"))?
        }
        (None, serde_json::Value::String(text)) => text.clone().into_bytes(),
        (None, raw) => raw.to_string().into_bytes(),
        (Some(other), _) => return Err(format!("consume payload encoding {other:?}")),
    };
    Ok((offset, bytes))
}

impl NaradSimNode {
    fn app(&self) -> &http::App {
        self.node.app()
    }

    /// Traces a topic-management answer (they are rare, and their failures explain a run).
    fn admin_event(&self, what: &str, name: &str, reply: &Reply) {
        let source = match self.single {
            true => "node".to_string(),
            false => format!("node@{}", self.own.0 - 1),
        };
        self.observer.event(
            &source,
            format_args!(
                "{what} topic {name}: {} {}",
                reply.status,
                reply.text().trim_end()
            ),
        );
    }

    /// Serves `record`'s offset through the consume route as well, and insists on the same payload:
    /// reads go to the partition host in bulk (a route call per record is too slow for the sweeps),
    /// and this keeps the route's own path (query parsing, status mapping, the message JSON) in play.
    async fn cross_check(
        &self,
        topic: &str,
        partition: PartitionId,
        record: &ReadRecord,
    ) -> Result<(), NodeError> {
        let query = format!("partition={}&offset={}", partition.0, record.offset.0);
        let reply = http::consume::consume(self.app(), topic, Some(&query)).await;
        status_of(&reply)?;
        let (served, payload) = consumed_payload(&reply.body).map_err(NodeError::Failed)?;
        if served != record.offset.0 || payload != record.payload {
            return Err(NodeError::Failed(format!(
                "consume {topic}/{partition}@{} disagrees with the partition read",
                record.offset
            )));
        }
        Ok(())
    }

    /// The topic's current incarnation as the replica holds it.
    fn topic_info(&self, name: &str) -> Option<TopicInfo> {
        self.node
            .metastore()
            .view()
            .state
            .topic(name)
            .map(|topic| TopicInfo {
                id: topic.id,
                partitions: topic.partitions(),
            })
    }
}

/// The frame of a partition segment image that holds byte `offset`: frames are contiguous from byte
/// 0, so their headers lead there (`None` when a header on the way does not decode, e.g. an earlier
/// flip struck a length, or the offset lies past the last whole frame). Recovery and reads lose a
/// damaged frame's records only: the frames around it stay readable. The zeros behind the last frame
/// (the log's zero fill) hold no records: a flip there costs none.
fn partition_frame_at(image: &[u8], offset: u64) -> Option<(u64, u64)> {
    let mut at = 0u64;
    while at < image.len() as u64 {
        let rest = &image[at as usize..];
        if rest.iter().all(|&b| b == 0) {
            return Some((at, image.len() as u64));
        }
        let header = narad_core::codec::partition::decode_header(rest).ok()?;
        let end = at.checked_add(header.frame_len() as u64)?;
        if end > image.len() as u64 {
            return None;
        }
        if offset < end {
            return Some((at, end));
        }
        at = end;
    }
    None
}

impl SimNode for NaradSimNode {
    fn name() -> &'static str {
        "narad"
    }

    fn layout() -> DiskLayout {
        DiskLayout {
            wal_prefix: format!("{}/", node::WAL_DIR),
            partition_prefix: format!("{}/", node::partitions::TOPICS_DIR),
            journal_prefix: Some(format!("{}/", narad_core::partition::journal::JOURNAL_DIR)),
            rot_unit: partition_frame_at,
        }
    }

    fn supports(_bug: PlantedBug) -> bool {
        true
    }

    async fn start(ctx: NodeContext) -> Result<Self, String> {
        let mut config = Config {
            dev: true,
            ..Config::default()
        };
        config.security.enabled = false;
        config.cluster.node_id = ctx.node_id.0 + 1;
        config.storage.ingress_wal_prealloc = ctx.sizes.wal_prealloc;
        let retention = ctx.sizes.retention;
        if retention.retention_ms > 0 {
            config.topic.min_retention_ms =
                config.topic.min_retention_ms.min(retention.retention_ms);
        }
        if retention.check_interval_ms > 0 {
            config.storage.retention_check_interval_ms = retention.check_interval_ms;
        }
        if retention.min_free_bytes > 0 {
            config.storage.min_free_bytes = Some(retention.min_free_bytes);
        }
        #[cfg(madsim)]
        let plant = Plant::new(ctx.plant_bug);
        #[cfg(not(madsim))]
        let plant = Plant::NONE;
        let hooks = NodeHooks {
            observer: narad_node::observer::Observer::new(Arc::new(ProbeBridge {
                observer: ctx.observer.clone(),
                node: (ctx.members.len() > 1).then_some(ctx.node_id.0 as usize),
            })),
            sizes: StorageSizes {
                wal_segment_bytes_max: nonzero(ctx.sizes.wal_segment_bytes),
                partition_segment_bytes_max: nonzero(ctx.sizes.partition_segment_bytes),
                journal_segment_bytes_max: nonzero(ctx.sizes.journal_segment_bytes),
            },
            plant,
            metastore_hold_file: None,
            metastore_hold_flag: Some(ctx.view_hold.clone()),
            legacy_owner: ctx.legacy_owner,
        };
        let index = ctx.node_id.0 as usize;
        let own_addr = ctx
            .members
            .get(index)
            .copied()
            .ok_or_else(|| format!("node {index} has no member address"))?;
        let cluster = if ctx.members.len() > 1 {
            Some(cluster_setup(&ctx, index, own_addr)?)
        } else {
            None
        };
        let options = NodeOptions {
            disk: Arc::new(LatencyDisk {
                inner: ctx.disk.clone(),
                io: ctx.io.clone(),
            }),
            config,
            clock: Clock::start(),
            seed: derive_seed(ctx.seed, &format!("narad/{}", ctx.boot)),
            member_addr: own_addr.to_string(),
            hooks,
            cluster,
        };
        let node = node::start(options)
            .await
            .map_err(|error| format!("start: {error}"))?;
        node.wait_ready()
            .await
            .map_err(|error| format!("recovery: {error}"))?;
        Ok(NaradSimNode {
            node,
            observer: ctx.observer,
            single: ctx.members.len() <= 1,
            own: narad_core::NodeId(index as u32 + 1),
            retention: ctx.sizes.retention,
        })
    }

    async fn create_topic(&self, name: &str, partitions: u32) -> Result<TopicInfo, NodeError> {
        // One-second leases: a lease a consumer dropped, or one a crash lost, comes back within a
        // run's settle time.
        let mut body = serde_json::json!({
            "name": name,
            "partitions": partitions,
            "visibility_timeout_ms": 1000
        });
        if self.retention.retention_ms > 0 {
            body["retention_ms"] = self.retention.retention_ms.into();
        }
        if self.retention.retention_bytes > 0 {
            body["retention_bytes"] = self.retention.retention_bytes.into();
        }
        let body = body.to_string();
        let reply = http::topics::create_topic(
            self.app(),
            &http::auth::Caller::Open,
            Body::Bytes(body.into_bytes()),
        )
        .await;
        self.admin_event("create", name, &reply);
        status_of(&reply)?;
        self.topic_info(name).ok_or_else(|| {
            NodeError::Failed(format!("topic {name} created but not in the replica"))
        })
    }

    async fn delete_topic(&self, name: &str) -> Result<(), NodeError> {
        let reply = http::topics::delete_topic(self.app(), &http::auth::Caller::Open, name).await;
        self.admin_event("delete", name, &reply);
        status_of(&reply)
    }

    async fn describe_topic(&self, name: &str) -> Result<Option<TopicInfo>, NodeError> {
        let reply = http::topics::get_topic(self.app(), name, None).await;
        match reply.status {
            404 => Ok(None),
            _ => {
                status_of(&reply)?;
                Ok(self.topic_info(name))
            }
        }
    }

    async fn produce(
        &self,
        topic: &str,
        partition: Option<PartitionId>,
        record: ProduceRecord,
    ) -> Result<(), NodeError> {
        let query = produce_query(record.key.as_deref(), partition);
        let reply = http::produce::produce(
            self.app(),
            topic,
            query.as_deref(),
            Body::Bytes(record.payload),
        )
        .await;
        status_of(&reply)
    }

    async fn produce_batch(
        &self,
        topic: &str,
        partition: Option<PartitionId>,
        records: Vec<ProduceRecord>,
    ) -> Result<(), NodeError> {
        let body = batch_body(partition, &records);
        let reply = http::produce::produce_batch(self.app(), topic, None, Body::Bytes(body)).await;
        status_of(&reply)
    }

    async fn read(
        &self,
        topic: &str,
        partition: PartitionId,
        from: Offset,
        records_max: usize,
    ) -> Result<ReadBatch, NodeError> {
        let Some(info) = self.topic_info(topic) else {
            return Err(NodeError::Refused(format!("topic {topic} not found")));
        };
        let key = TopicKey {
            name: topic.to_string(),
            id: info.id,
        };
        let records_max = u32::try_from(records_max.max(1)).unwrap_or(u32::MAX);
        let mut offset = from;
        // Damaged records are skipped one offset at a time, as a consumer skips a 410.
        for _ in 0..=records_max {
            match self
                .node
                .partitions()
                .read(&key, partition, offset, records_max)
                .await
            {
                Ok(batch) => {
                    let records: Vec<ReadRecord> = batch
                        .records
                        .into_iter()
                        .enumerate()
                        .map(|(index, record)| ReadRecord {
                            offset: Offset(batch.first.0 + index as u64),
                            payload: record.payload,
                            committed_at_ms: Some(record.committed_at_ms),
                        })
                        .collect();
                    if let Some(first) = records.first() {
                        self.cross_check(topic, partition, first).await?;
                    }
                    return Ok(ReadBatch {
                        topic_id: info.id,
                        records,
                        high_watermark: batch.high_watermark,
                    });
                }
                Err(PartitionReadError::Log(LogReadError::AtOrPastHighWatermark {
                    high_watermark,
                })) => {
                    return Ok(ReadBatch {
                        topic_id: info.id,
                        records: Vec::new(),
                        high_watermark,
                    })
                }
                Err(PartitionReadError::Log(LogReadError::Unreadable { .. })) => {
                    offset = offset.next();
                }
                Err(PartitionReadError::Log(LogReadError::BelowOldestRetained { oldest })) => {
                    offset = oldest;
                }
                Err(error) => return Err(NodeError::Failed(format!("read: {error}"))),
            }
        }
        // Every offset asked for was unreadable: an empty answer ends this partition's read.
        Ok(ReadBatch {
            topic_id: info.id,
            records: Vec::new(),
            high_watermark: offset,
        })
    }

    async fn status(&self) -> NodeStatus {
        let status = self.node.status();
        NodeStatus {
            ready: status.ready,
            backlog_records: status.backlog_records,
            latched: status.wal_failed
                || status.metastore_failed
                || status.partitions_restart_needed > 0,
            leader: self.single || self.node.metastore().view().leader == Some(self.own),
        }
    }

    fn queue_mode() -> bool {
        true
    }

    async fn queue_consume(
        &self,
        topic: &str,
        wait: Duration,
    ) -> Result<Option<Leased>, NodeError> {
        let query = format!("wait={}ms", wait.as_millis());
        let reply = http::consume::consume(self.app(), topic, Some(&query)).await;
        if reply.status == 204 {
            return Ok(None);
        }
        status_of(&reply)?;
        let (offset, payload) = consumed_payload(&reply.body).map_err(NodeError::Failed)?;
        let message: serde_json::Value = serde_json::from_slice(&reply.body)
            .map_err(|error| NodeError::Failed(format!("consume JSON: {error}")))?;
        let partition = message["partition"]
            .as_u64()
            .and_then(|partition| u32::try_from(partition).ok())
            .ok_or_else(|| NodeError::Failed("consume JSON without a partition".into()))?;
        let handle = message["receipt_handle"].as_str().ok_or_else(|| {
            NodeError::Failed("queue-mode consume without a receipt handle".into())
        })?;
        Ok(Some(Leased {
            partition: PartitionId(partition),
            offset: Offset(offset),
            payload,
            handle: handle.to_string(),
        }))
    }

    async fn queue_ack(
        &self,
        topic: &str,
        handle: &str,
        nack: bool,
    ) -> Result<AckAnswer, NodeError> {
        let query = format!(
            "receipt_handle={handle}{}",
            if nack { "&extend=0" } else { "" }
        );
        let reply = http::consume::ack(self.app(), topic, Some(&query)).await;
        match reply.status {
            410 => Ok(AckAnswer::Stale),
            _ => status_of(&reply).map(|()| AckAnswer::Done),
        }
    }

    fn owner(&self, topic: &str, partition: PartitionId) -> Option<usize> {
        if self.single {
            return Some(0);
        }
        let view = self.node.metastore().view();
        let owner = view.state.topic(topic)?.owner_of(partition)?;
        (owner.0 as usize).checked_sub(1)
    }

    fn nodes_max() -> u32 {
        crate::scenario::NODES_MAX
    }

    async fn cluster_op(&self, op: ClusterOp) -> Result<(), NodeError> {
        use narad_node::http::cluster;
        let app = self.app();
        let id = |member: usize| (member + 1).to_string();
        let (name, reply) = match &op {
            ClusterOp::Move {
                topic,
                partition,
                to,
            } => {
                let body = serde_json::json!({
                    "topic": topic,
                    "partition": partition.0,
                    "to": to + 1,
                })
                .to_string();
                let reply = cluster::start_move(app, Body::Bytes(body.into_bytes())).await;
                ("move", reply)
            }
            ClusterOp::Abort { topic, partition } => (
                "abort-move",
                cluster::abort_move(app, topic, &partition.0.to_string()).await,
            ),
            ClusterOp::Rebalance => ("rebalance", cluster::rebalance(app).await),
            ClusterOp::Decommission { member } => (
                "decommission",
                cluster::decommission(app, &id(*member), None, true).await,
            ),
            ClusterOp::CancelDecommission { member } => (
                "cancel-decommission",
                cluster::decommission(app, &id(*member), None, false).await,
            ),
        };
        self.admin_event(name, &format!("{op:?}"), &reply);
        status_of(&reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_encode_keys_and_partitions_as_a_client_would() {
        assert_eq!(produce_query(None, None), None);
        assert_eq!(
            produce_query(Some(b"k 1&x"), Some(PartitionId(3))).as_deref(),
            Some("key=k+1%26x&partition=3")
        );
    }

    #[test]
    fn consumed_payloads_decode_from_every_encoding() {
        let base64 = br#"{"topic":"t","partition":0,"offset":7,"payload":"AAE=","payload_encoding":"base64","timestamp":1}"#;
        assert_eq!(consumed_payload(base64), Ok((7, vec![0, 1])));
        let text = br#"{"topic":"t","partition":0,"offset":2,"payload":"h\u0001i","timestamp":1}"#;
        assert_eq!(consumed_payload(text), Ok((2, b"h\x01i".to_vec())));
        let raw = br#"{"topic":"t","partition":0,"offset":3,"payload":{"a":1},"timestamp":1}"#;
        assert_eq!(consumed_payload(raw), Ok((3, br#"{"a":1}"#.to_vec())));
    }

    #[test]
    fn a_flip_in_the_zero_fill_behind_the_frames_strikes_no_frame() {
        use narad_core::codec::partition::{encode_frame, RecordView};
        let mut image = Vec::new();
        for (base, payload) in [(0, &b"first"[..]), (1, &b"second"[..])] {
            let record = RecordView {
                key: None,
                committed_at_ms: 1,
                payload,
            };
            encode_frame(&mut image, narad_core::ids::Offset(base), &[record]);
        }
        let frames = image.len() as u64;
        image.resize(image.len() + 4096, 0);
        assert_eq!(partition_frame_at(&image, 0).map(|(at, _)| at), Some(0));
        let (second, end) = partition_frame_at(&image, frames - 1).unwrap();
        assert!(second > 0 && end == frames);
        let fill = Some((frames, frames + 4096));
        assert_eq!(partition_frame_at(&image, frames), fill);
        assert_eq!(partition_frame_at(&image, frames + 4095), fill);
        // Garbage behind the frames is no fill: the unit is unknown.
        image[frames as usize + 100] = 1;
        assert_eq!(partition_frame_at(&image, frames + 4095), None);
    }
}

/// How the node's I/O executor spends simulated time on the disk (`narad_node::io::run_request` under
/// madsim): what runs when, for the shapes of request the node issues.
#[cfg(all(test, madsim))]
mod io_timing_tests {
    use std::sync::Mutex;

    use madsim::runtime::Runtime;
    use madsim::time::Instant;
    use narad_core::disk::{IoId, IoLane, IoRequest};
    use narad_core::IoFault;

    use super::*;

    /// Every op takes 1 ms; each op that runs notes its name and the simulated milliseconds since `start`.
    struct TimedDisk {
        inner: SimDisk,
        start: Instant,
        ran: Mutex<Vec<(&'static str, u128)>>,
    }

    impl TimedDisk {
        fn note(&self, op: &'static str) {
            let at = self.start.elapsed().as_millis();
            self.ran.lock().unwrap().push((op, at));
        }
    }

    impl DiskLayer for TimedDisk {
        fn inner(&self) -> &dyn Disk {
            &self.inner
        }
        fn write_at(&self, path: &str, offset: u64, data: &[u8]) -> Result<(), IoFault> {
            self.note("write");
            self.inner.write_at(path, offset, data)
        }
        fn sync_data(&self, path: &str) -> Result<(), IoFault> {
            self.note("sync");
            self.inner.sync_data(path)
        }
        fn read_at(&self, path: &str, offset: u64, len: usize) -> Result<Vec<u8>, IoFault> {
            self.note("read");
            self.inner.read_at(path, offset, len)
        }
        fn latency(&self, _op: &IoOp) -> Duration {
            Duration::from_millis(1)
        }
    }

    /// Runs one request of these ops on a fresh timed disk; returns what ran when and the total time.
    #[allow(clippy::disallowed_methods)] // madsim's `Instant` (std's, read in simulated time)
    fn timeline(ops: Vec<IoOp>) -> (Vec<(&'static str, u128)>, u128) {
        let runtime = Runtime::with_seed_and_config(1, madsim::Config::default());
        runtime.block_on(async move {
            let inner = SimDisk::new(1);
            inner.create("f").unwrap();
            let disk = Arc::new(TimedDisk {
                inner,
                start: Instant::now(),
                ran: Mutex::new(Vec::new()),
            });
            let request = IoRequest {
                id: IoId(1),
                lane: IoLane(0),
                ops,
            };
            let (_, completion) = narad_node::io::run_request(disk.clone(), request).await;
            assert!(completion.result.is_ok(), "{completion:?}");
            let total = disk.start.elapsed().as_millis();
            let ran = disk.ran.lock().unwrap().clone();
            (ran, total)
        })
    }

    fn write() -> IoOp {
        IoOp::WriteAt {
            path: "f".into(),
            offset: 0,
            data: b"abc".to_vec(),
        }
    }

    fn sync() -> IoOp {
        IoOp::SyncData { path: "f".into() }
    }

    fn read() -> IoOp {
        IoOp::ReadAt {
            path: "f".into(),
            offset: 0,
            len: 3,
        }
    }

    #[test]
    fn ops_before_a_sync_run_at_once_and_the_sync_waits_for_all_of_them() {
        let (ran, total) = timeline(vec![write(), write(), sync()]);
        assert_eq!(ran, [("write", 0), ("write", 0), ("sync", 3)]);
        assert_eq!(total, 3);
    }

    #[test]
    fn a_lone_read_back_after_the_last_sync_waits_with_the_sync() {
        let (ran, total) = timeline(vec![write(), sync(), read()]);
        assert_eq!(ran, [("write", 0), ("sync", 3), ("read", 3)]);
        assert_eq!(total, 3);
    }

    #[test]
    fn ops_after_the_last_sync_otherwise_wait_one_by_one() {
        let (ran, total) = timeline(vec![write(), sync(), read(), read()]);
        assert_eq!(ran, [("write", 0), ("sync", 2), ("read", 3), ("read", 4)]);
        assert_eq!(total, 4);
        // Reads only: nothing a crash could tell apart, so they wait once, before the last.
        let (ran, total) = timeline(vec![read(), read()]);
        assert_eq!(ran, [("read", 0), ("read", 2)]);
        assert_eq!(total, 2);
        let (ran, total) = timeline(vec![write(), sync(), write()]);
        assert_eq!(ran, [("write", 0), ("sync", 2), ("write", 3)]);
        assert_eq!(total, 3);
    }
}
