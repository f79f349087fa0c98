//! Unit tests of the `/v1` routes as plain functions, with in-memory doubles for the seams.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::{Arc, Mutex};

use narad_core::codec::wal::ProduceRecord;
use narad_core::disk::sim::SimDisk;
use narad_core::ids::{NodeId, Offset, PartitionId, TopicId};

use super::auth::Caller;
use super::*;
use crate::ingress::WalError;
use crate::metastore::MetastoreOptions;

mod batch_routes;
mod consume_routes;
mod produce_routes;
mod topic_routes;

/// Records every append; fails with `failure` when set.
#[derive(Default)]
struct MemorySink {
    calls: Mutex<Vec<Vec<ProduceRecord>>>,
    failure: Mutex<Option<WalError>>,
}

impl MemorySink {
    fn outcome(&self, records: Vec<ProduceRecord>) -> Result<(), WalError> {
        if let Some(error) = self.failure.lock().unwrap().clone() {
            return Err(error);
        }
        self.calls.lock().unwrap().push(records);
        Ok(())
    }

    fn calls(&self) -> Vec<Vec<ProduceRecord>> {
        self.calls.lock().unwrap().clone()
    }

    fn records(&self) -> Vec<ProduceRecord> {
        self.calls().into_iter().flatten().collect()
    }
}

impl ProduceSink for MemorySink {
    fn append(&self, record: ProduceRecord) -> BoxFuture<'_, Result<(), WalError>> {
        let outcome = self.outcome(vec![record]);
        Box::pin(async move { outcome })
    }

    fn append_many(&self, records: Vec<ProduceRecord>) -> BoxFuture<'_, Result<(), WalError>> {
        let outcome = self.outcome(records);
        Box::pin(async move { outcome })
    }
}

/// A partition's oldest offset and its records from there on.
type StoredPartition = (u64, Vec<StoredRecord>);

/// Partitions as vectors of records starting at `oldest`; `broken` partitions fail reads.
#[derive(Default)]
struct MemoryLog {
    partitions: Mutex<BTreeMap<(TopicKey, PartitionId), StoredPartition>>,
    broken: Mutex<Vec<PartitionId>>,
}

impl PartitionReader for MemoryLog {
    fn read(
        &self,
        topic: &TopicKey,
        partition: PartitionId,
        offset: Offset,
    ) -> BoxFuture<'_, Result<ReadOutcome, ReplayError>> {
        let outcome = if self.broken.lock().unwrap().contains(&partition) {
            Err(ReplayError("crc mismatch".to_string()))
        } else {
            let partitions = self.partitions.lock().unwrap();
            match partitions.get(&(topic.clone(), partition)) {
                None => Ok(ReadOutcome::PastEnd),
                Some((oldest, _)) if offset.0 < *oldest => Ok(ReadOutcome::Gone),
                Some((oldest, records)) => Ok(records
                    .get((offset.0 - oldest) as usize)
                    .cloned()
                    .map_or(ReadOutcome::PastEnd, ReadOutcome::Record)),
            }
        };
        Box::pin(async move { outcome })
    }
}

impl PartitionStats for MemoryLog {
    fn partition_stat(
        &self,
        topic: &TopicKey,
        partition: PartitionId,
    ) -> BoxFuture<'_, PartitionStat> {
        let partitions = self.partitions.lock().unwrap();
        let stat = match partitions.get(&(topic.clone(), partition)) {
            None => PartitionStat::default(),
            Some((oldest, records)) => PartitionStat {
                segments: 1,
                oldest_offset: Offset(*oldest),
                next_offset: Offset(oldest + records.len() as u64),
                high_watermark: Offset(oldest + records.len() as u64),
                size_bytes: 100 * records.len() as u64,
                oldest_segment_at_s: Some(1_700_000_000),
            },
        };
        Box::pin(async move { stat })
    }
}

/// A call the queue double saw.
#[derive(Clone, Debug, PartialEq)]
enum QueueCall {
    Consume {
        topic: String,
        limits: QueueLimits,
        partitions: u32,
        pinned: Option<PartitionId>,
        wait: std::time::Duration,
    },
    Settle {
        topic: String,
        handle: ReceiptHandle,
        action: Settle,
    },
}

/// Answers queue-mode calls with scripted outcomes and records them.
struct ScriptedQueue {
    calls: Mutex<Vec<QueueCall>>,
    consume: Mutex<QueueOutcome>,
    settle: Mutex<SettleOutcome>,
}

impl Default for ScriptedQueue {
    fn default() -> Self {
        ScriptedQueue {
            calls: Mutex::default(),
            consume: Mutex::new(QueueOutcome::Empty),
            settle: Mutex::new(SettleOutcome::Done),
        }
    }
}

impl ScriptedQueue {
    fn last(&self) -> Option<QueueCall> {
        self.calls.lock().unwrap().last().cloned()
    }
}

impl QueueConsumer for ScriptedQueue {
    fn consume(
        &self,
        topic: &TopicKey,
        limits: QueueLimits,
        partitions: u32,
        pinned: Option<PartitionId>,
        wait: std::time::Duration,
    ) -> BoxFuture<'_, QueueOutcome> {
        self.calls.lock().unwrap().push(QueueCall::Consume {
            topic: topic.name.clone(),
            limits,
            partitions,
            pinned,
            wait,
        });
        let outcome = self.consume.lock().unwrap().clone();
        Box::pin(async move { outcome })
    }

    fn settle(
        &self,
        topic: &TopicKey,
        handle: ReceiptHandle,
        action: Settle,
    ) -> BoxFuture<'_, SettleOutcome> {
        self.calls.lock().unwrap().push(QueueCall::Settle {
            topic: topic.name.clone(),
            handle,
            action,
        });
        let outcome = self.settle.lock().unwrap().clone();
        Box::pin(async move { outcome })
    }
}

struct Fixture {
    app: App,
    sink: Arc<MemorySink>,
    log: Arc<MemoryLog>,
    queue: Arc<ScriptedQueue>,
}

async fn fixture() -> Fixture {
    let metastore = Metastore::open(
        Arc::new(SimDisk::new(1)),
        MetastoreOptions::new(NodeId(1), "127.0.0.1:7942".to_string()),
    )
    .await
    .unwrap();
    metastore
        .wait_until(|view| view.state.members().contains_key(&NodeId(1)))
        .await
        .unwrap();
    let sink = Arc::new(MemorySink::default());
    let log = Arc::new(MemoryLog::default());
    let queue = Arc::new(ScriptedQueue::default());
    let app = App::new(
        metastore,
        sink.clone(),
        log.clone(),
        log.clone(),
        queue.clone(),
        Arc::new(Metrics::new()),
        42,
    );
    Fixture {
        app,
        sink,
        log,
        queue,
    }
}

fn json(text: &str) -> Body {
    Body::Bytes(text.as_bytes().to_vec())
}

fn assert_reply(reply: &Reply, status: u16, body: &str) {
    assert_eq!((reply.status, reply.text().as_str()), (status, body));
}

fn assert_error(reply: &Reply, status: u16, message: &str) {
    assert_reply(reply, status, &format!("{{\"error\":\"{message}\"}}\n"));
}

async fn create(f: &Fixture, body: &str) -> Reply {
    topics::create_topic(&f.app, &Caller::Open, json(body)).await
}

/// Creates `name` with `partitions` (and an optional schema); returns its incarnation.
async fn topic(f: &Fixture, name: &str, partitions: u32, schema: Option<&str>) -> TopicId {
    let schema = schema.map_or(String::new(), |schema| format!(",\"schema\":{schema}"));
    let reply = create(
        f,
        &format!("{{\"name\":\"{name}\",\"partitions\":{partitions}{schema}}}"),
    )
    .await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    f.app.metastore.view().state.topic(name).unwrap().id
}

fn created_at(f: &Fixture, name: &str) -> u64 {
    f.app
        .metastore
        .view()
        .state
        .topic(name)
        .unwrap()
        .created_at_s
}

#[tokio::test]
async fn readyz_is_503_until_recovery_and_healthz_503_when_shutting_down() {
    let f = fixture().await;
    assert_error(&ops::readyz(&f.app), 503, "not ready: recovery in progress");
    f.app.set_ready();
    assert_reply(&ops::readyz(&f.app), 200, "{\"status\":\"ready\"}\n");
    assert_reply(&ops::healthz(&f.app), 200, "{\"status\":\"ok\"}\n");
    f.app.set_shutting_down();
    assert_reply(
        &ops::healthz(&f.app),
        503,
        "{\"status\":\"shutting down\"}\n",
    );
}
