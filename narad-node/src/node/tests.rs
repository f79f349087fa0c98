//! The node over `SimDisk`, driven through the HTTP route functions (as the simulator drives it).

use std::sync::Arc;
use std::time::Duration;

use narad_core::codec::wal::ProduceRecord;
use narad_core::disk::sim::SimDisk;
use narad_core::dispatcher::{
    CommitFailure, CommitId, CommitOwner, CommitRecords, DispatchRecord, SendCommit,
};
use narad_core::ids::{NodeId, Offset, PartitionId, TopicId};
use narad_core::Seq;

use super::local_transport::LocalTransport;
use super::*;
use crate::http::{consume, produce, topics, Body, Reply};
use crate::ingress::transport::CommitTransport;

const WAIT_MAX: Duration = Duration::from_secs(20);

fn options(disk: &SimDisk, seed: u64) -> NodeOptions {
    NodeOptions {
        disk: Arc::new(disk.clone()),
        config: Config::default(),
        clock: Clock::start(),
        seed,
        member_addr: "127.0.0.1:7942".to_string(),
        cluster: None,
        hooks: NodeHooks::default(),
    }
}

async fn started(disk: &SimDisk, seed: u64) -> Node {
    started_with(disk, seed, true).await
}

/// A node on `disk`, with its owner journal on or off.
async fn started_with(disk: &SimDisk, seed: u64, owner_journal: bool) -> Node {
    let mut options = options(disk, seed);
    options.config.storage.owner_journal = owner_journal;
    let node = start(options).await.expect("started");
    tokio::time::timeout(WAIT_MAX, node.wait_ready())
        .await
        .expect("ready in time")
        .expect("recovered");
    node
}

fn body(text: &str) -> Body {
    Body::Bytes(text.as_bytes().to_vec())
}

async fn create_topic(node: &Node, name: &str, partitions: u32) {
    let reply = topics::create_topic(
        node.app(),
        &crate::http::auth::Caller::Open,
        body(&format!(r#"{{"name":"{name}","partitions":{partitions}}}"#)),
    )
    .await;
    assert_eq!(reply.status, 201, "{}", reply.text());
}

async fn produce_to(node: &Node, topic: &str, partition: u32, payload: &str) {
    let query = format!("partition={partition}");
    let reply = produce::produce(node.app(), topic, Some(&query), body(payload)).await;
    assert_eq!(reply.status, 202, "{}", reply.text());
}

async fn consume_at(node: &Node, topic: &str, partition: u32, offset: u64) -> Reply {
    let query = format!("partition={partition}&offset={offset}");
    consume::consume(node.app(), topic, Some(&query)).await
}

/// Polls until `done` holds, at most [`WAIT_MAX`].
async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(WAIT_MAX, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for {what}");
}

/// Stops a node and lets its tasks end before the disk is reused.
async fn stop(node: Node) {
    node.shutdown().await.expect("clean shutdown");
    drop(node);
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_records_become_visible_in_order() {
    let disk = SimDisk::new(1);
    let node = started(&disk, 1).await;
    create_topic(&node, "t", 3).await;
    for index in 0..5 {
        produce_to(&node, "t", 2, &format!("m{index}")).await;
    }
    wait_for("the backlog to drain", || {
        node.status().backlog_records == 0
    })
    .await;
    for index in 0..5u64 {
        let reply = consume_at(&node, "t", 2, index).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let message: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(message["payload"], format!("m{index}"));
    }
    assert_eq!(consume_at(&node, "t", 2, 5).await.status, 204);
    let status = node.status();
    assert!(status.ready && !status.wal_failed, "{status:?}");
    stop(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_loss_after_the_202_loses_nothing() {
    let disk = SimDisk::new(2);
    let node = started(&disk, 2).await;
    create_topic(&node, "t", 3).await;
    for index in 0..20 {
        produce_to(&node, "t", index % 2, &format!("m{index}")).await;
    }
    // No waiting for dispatch: whatever is not committed yet is replayed after the crash.
    drop(node);
    tokio::time::sleep(Duration::from_millis(50)).await;
    disk.crash();
    let node = started(&disk, 3).await;
    wait_for("the replay", || node.status().backlog_records == 0).await;
    let mut seen = Vec::new();
    for partition in 0..2 {
        let mut offset = 0;
        loop {
            let reply = consume_at(&node, "t", partition, offset).await;
            if reply.status == 204 {
                break;
            }
            assert_eq!(reply.status, 200, "{}", reply.text());
            let message: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
            seen.push(message["payload"].as_str().unwrap().to_string());
            offset += 1;
        }
    }
    seen.sort();
    seen.dedup();
    let mut expected: Vec<String> = (0..20).map(|index| format!("m{index}")).collect();
    expected.sort();
    assert_eq!(seen, expected);
    stop(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_topic_s_log_files_are_removed_and_its_name_starts_empty() {
    let disk = SimDisk::new(3);
    let node = started(&disk, 4).await;
    create_topic(&node, "gone", 3).await;
    produce_to(&node, "gone", 0, "old").await;
    let old_dir = "topics/gone/1/p00000/";
    // The backlog gauge is published after the dispatcher's turn: it may still read 0 right after
    // the 202. The log's first segment appears with the commit.
    wait_for("the commit", || {
        disk.paths().iter().any(|path| path.starts_with(old_dir))
    })
    .await;
    wait_for("the checkpoint", || node.status().backlog_records == 0).await;
    let deleted = topics::delete_topic(node.app(), &crate::http::auth::Caller::Open, "gone").await;
    assert_eq!(deleted.status, 204);
    wait_for("the retired log's files to go", || {
        !disk.paths().iter().any(|path| path.starts_with(old_dir))
    })
    .await;
    create_topic(&node, "gone", 3).await;
    assert_eq!(consume_at(&node, "gone", 0, 0).await.status, 204);
    let key = crate::http::TopicKey {
        name: "gone".to_string(),
        id: node.metastore().view().state.topic("gone").unwrap().id,
    };
    let stat = node.partitions().stat(&key, PartitionId(0)).await;
    assert_eq!(stat.high_watermark, Offset(0));
    stop(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_the_checkpoint_so_a_power_loss_replays_nothing() {
    let disk = SimDisk::new(4);
    let node = started(&disk, 5).await;
    create_topic(&node, "t", 3).await;
    for index in 0..3 {
        produce_to(&node, "t", 0, &format!("m{index}")).await;
    }
    wait_for("the commits", || node.status().backlog_records == 0).await;
    let checkpoint = node.shutdown().await.expect("flushed");
    assert_eq!(checkpoint, Some(Seq(3)));
    drop(node);
    tokio::time::sleep(Duration::from_millis(50)).await;
    disk.crash();
    let node = started(&disk, 6).await;
    let wal = node.wal().expect("the WAL opened").status();
    assert_eq!((wal.dispatch_start, wal.durable_next_seq), (Seq(3), Seq(3)));
    stop(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wal_disk_failure_answers_500_latches_until_restart_and_keeps_what_was_acked() {
    use narad_core::disk::sim::{DiskFault, FaultRule};
    let disk = SimDisk::new(5);
    let node = started(&disk, 7).await;
    create_topic(&node, "t", 3).await;
    produce_to(&node, "t", 0, "before").await;
    disk.add_fault(FaultRule {
        path_prefix: format!("{WAL_DIR}/0"),
        kind: DiskFault::SyncEio,
        chance_ppm: 1_000_000,
        remaining: Some(1),
    });
    let failed = produce::produce(node.app(), "t", Some("partition=0"), body("lost")).await;
    assert_eq!(
        (failed.status, failed.text().as_str()),
        (500, "{\"error\":\"produce failed\"}\n")
    );
    // The fault struck once, but the latch holds: still refused.
    let again = produce::produce(node.app(), "t", Some("partition=0"), body("again")).await;
    assert_eq!(again.status, 500);
    wait_for("the latch gauge", || node.status().wal_failed).await;
    // Consume keeps working.
    wait_for("the first record", || node.status().backlog_records == 0).await;
    assert_eq!(consume_at(&node, "t", 0, 0).await.status, 200);
    stop(node).await;
    let node = started(&disk, 8).await;
    assert!(!node.status().wal_failed, "a restart clears the latch");
    produce_to(&node, "t", 0, "after").await;
    wait_for("the backlog to drain", || {
        node.status().backlog_records == 0
    })
    .await;
    let first = consume_at(&node, "t", 0, 0).await;
    let message: serde_json::Value = serde_json::from_slice(&first.body).unwrap();
    assert_eq!(message["payload"], "before");
    stop(node).await;
}

/// Observations in `narad_accept_to_visible_seconds`.
fn accept_to_visible_count(node: &Node) -> f64 {
    narad_load::scrape::Scrape::parse(&node.metrics().encode())
        .histogram("narad_accept_to_visible_seconds")
        .map_or(0.0, |histogram| histogram.count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_to_visible_observes_each_record_accepted_here_once_and_no_replayed_one() {
    let disk = SimDisk::new(6);
    let node = started(&disk, 9).await;
    create_topic(&node, "t", 3).await;
    for index in 0..4 {
        produce_to(&node, "t", index % 3, &format!("m{index}")).await;
    }
    wait_for("the commits", || node.status().backlog_records == 0).await;
    assert_eq!(accept_to_visible_count(&node), 4.0);
    // Accepted with dispatch stopped: these become visible only after a restart, which did not
    // accept them.
    node.inner
        .dispatcher
        .get()
        .expect("dispatching")
        .stop()
        .await;
    for index in 4..7 {
        produce_to(&node, "t", 0, &format!("m{index}")).await;
    }
    stop(node).await;
    let node = started(&disk, 10).await;
    wait_for("the replay", || node.status().backlog_records == 0).await;
    assert_eq!(
        consume_at(&node, "t", 0, 3).await.status,
        200,
        "the replayed records are visible"
    );
    assert_eq!(accept_to_visible_count(&node), 0.0);
    stop(node).await;
}

/// The one partition log file of `t`'s partition 0.
fn partition_zero_log(disk: &SimDisk) -> String {
    let mut logs: Vec<String> = disk
        .paths()
        .into_iter()
        .filter(|path| path.starts_with("topics/t/") && path.contains("/p00000/"))
        .filter(|path| path.ends_with(".log"))
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    logs.remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rot_inside_acknowledged_data_is_reported_and_the_records_behind_it_stay_readable() {
    // Each commit synced in its own log (no journal), so the rot strikes the only durable copy.
    let disk = SimDisk::new(7);
    let node = started_with(&disk, 7, false).await;
    create_topic(&node, "t", 3).await;
    let mut first_frame_end = 0;
    for index in 0..4u64 {
        produce_to(&node, "t", 0, &format!("m{index}")).await;
        wait_for("the commit", || node.status().backlog_records == 0).await;
        wait_for("the record to be visible", || {
            disk.durable_image(&partition_zero_log(&disk))
                .is_some_and(|image| {
                    image
                        .windows(2)
                        .any(|w| w == format!("m{index}").as_bytes())
                })
        })
        .await;
        if index == 0 {
            // The file goes on with the log's zero fill: the frame's own header says where it ends.
            let image = disk.durable_image(&partition_zero_log(&disk)).unwrap();
            first_frame_end = narad_core::codec::partition::decode_header(&image)
                .unwrap()
                .frame_len() as u64;
        }
    }
    stop(node).await;
    assert!(disk.rot(&partition_zero_log(&disk), first_frame_end + 30, 3));
    let node = started_with(&disk, 8, false).await;
    let text = node.metrics().encode();
    assert!(
        text.contains("narad_errors_total{component=\"storage\",kind=\"partition_damaged\"} 1\n"),
        "{text}"
    );
    for index in [0u64, 2, 3] {
        let reply = consume_at(&node, "t", 0, index).await;
        assert_eq!(reply.status, 200, "offset {index}: {}", reply.text());
        let message: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(message["payload"], format!("m{index}"));
    }
    assert_ne!(consume_at(&node, "t", 0, 1).await.status, 200);
    assert_eq!(consume_at(&node, "t", 0, 4).await.status, 204);
    stop(node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_durable_only_in_the_owner_journal_survive_power_loss_through_its_replay() {
    let disk = SimDisk::new(9);
    let node = started(&disk, 9).await;
    create_topic(&node, "t", 3).await;
    for index in 0..6u64 {
        produce_to(&node, "t", (index % 2) as u32, &format!("jr{index}")).await;
    }
    wait_for("the commits", || node.status().backlog_records == 0).await;
    let durable_in = |prefix: &str, needle: &str| {
        disk.paths()
            .into_iter()
            .filter(|path| path.starts_with(prefix))
            .any(|path| {
                disk.durable_image(&path).is_some_and(|image| {
                    image.windows(needle.len()).any(|w| w == needle.as_bytes())
                })
            })
    };
    // Visible, and durable in the journal; the partition files have not been synced (their lazy
    // sync waits for the journal to need trimming).
    for index in 0..6u64 {
        let needle = format!("jr{index}");
        assert!(
            durable_in("owner-journal/", &needle),
            "{needle} in the journal"
        );
        assert!(
            !durable_in("topics/", &needle),
            "{needle} not yet synced in its log"
        );
        let reply = consume_at(&node, "t", (index % 2) as u32, index / 2).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    stop(node).await;
    // Power loss: every unsynced write is torn or gone, the partition files' included.
    disk.crash();
    let node = started(&disk, 10).await;
    for index in 0..6u64 {
        let reply = consume_at(&node, "t", (index % 2) as u32, index / 2).await;
        assert_eq!(reply.status, 200, "offset {}: {}", index / 2, reply.text());
        let message: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(message["payload"], format!("jr{index}"));
    }
    assert!(
        disk.paths().iter().all(|path| !path.ends_with(".journal")),
        "the replay empties the journal"
    );
    stop(node).await;
}

/// A commit of `payloads` for `topic`/0 accepted under `topic_id`, as the dispatcher would send it.
fn send_commit(
    topic: &str,
    topic_id: Option<TopicId>,
    owner: CommitOwner,
    payloads: &[&str],
) -> SendCommit {
    let records: Vec<DispatchRecord> = payloads
        .iter()
        .enumerate()
        .map(|(seq, payload)| {
            let record = ProduceRecord {
                topic: topic.to_string(),
                topic_id,
                key: None,
                partition: PartitionId(0),
                timestamp_ms: 1_700_000_000_000,
                payload: payload.as_bytes().to_vec(),
            };
            DispatchRecord::decode(Seq(seq as u64), record.to_bytes()).expect("decodes")
        })
        .collect();
    SendCommit {
        commit_id: CommitId(1),
        topic: Arc::from(topic),
        topic_id,
        partition: PartitionId(0),
        owner,
        records: CommitRecords::from(records),
        with_ids: true,
        deadline: narad_core::Instant::from_nanos(u64::MAX),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_transport_answers_with_the_owner_s_typed_outcome() {
    let disk = SimDisk::new(1);
    let node = started(&disk, 1).await;
    create_topic(&node, "t", 3).await;
    let live = node
        .metastore()
        .view()
        .state
        .topic("t")
        .expect("created")
        .id;
    let transport = LocalTransport::new(node.partitions().clone());

    let landed = transport
        .commit(send_commit(
            "t",
            Some(live),
            CommitOwner::Local,
            &["a", "b"],
        ))
        .await
        .expect("committed");
    assert_eq!((landed.base, landed.count), (Offset(0), 2));
    assert_eq!(consume_at(&node, "t", 0, 1).await.status, 200);

    let stale = TopicId(live.0 + 100);
    assert_eq!(
        transport
            .commit(send_commit("t", Some(stale), CommitOwner::Local, &["c"]))
            .await,
        Err(CommitFailure::IncarnationMismatch {
            record_topic_id: stale,
            live_topic_id: Some(live),
        })
    );
    assert_eq!(
        transport
            .commit(send_commit("absent", None, CommitOwner::Local, &["d"]))
            .await,
        Err(CommitFailure::Failed("topic not found".to_string()))
    );
    assert!(matches!(
        transport
            .commit(send_commit(
                "t",
                Some(live),
                CommitOwner::Remote(NodeId(2)),
                &["e"]
            ))
            .await,
        Err(CommitFailure::Unavailable(_))
    ));
    assert_eq!(
        consume_at(&node, "t", 0, 2).await.status,
        204,
        "nothing else landed"
    );
    stop(node).await;
}

/// The owner side of a remote commit, as the cluster transport hands it over: the frame's bytes in,
/// the answer's bytes out.
#[tokio::test]
async fn a_remote_batch_is_answered_on_the_wire_with_offsets_412_or_400() {
    use narad_core::codec::cluster::{
        CommitAnswer, CommitProduce, CommitProduceBatch, IdSection, WireRecord,
    };

    use crate::cluster::Inbound;
    use crate::node::peers::{commit_outcome, NodeInbound};

    let disk = SimDisk::new(11);
    let node = started(&disk, 11).await;
    create_topic(&node, "wire", 3).await;
    let live = node.metastore().view().state.topic("wire").unwrap().id;
    let inbound = |ids| NodeInbound {
        partitions: node.partitions().clone(),
        metastore: node.metastore().clone(),
        clock: node.clock().clone(),
        ids,
        sync: None,
        metrics: node.metrics().clone(),
        plant: narad_core::planted::Plant::NONE,
        consumers: None,
        moves: None,
    };
    let batch = |topic_id: Option<TopicId>| {
        CommitProduceBatch {
            budget_ms: 5_000,
            topic: "wire".to_string(),
            partition: PartitionId(1),
            records: ["a", "b"]
                .iter()
                .map(|payload| WireRecord {
                    topic_id,
                    key: None,
                    payload: payload.as_bytes().to_vec(),
                })
                .collect(),
        }
        .encode()
    };
    let answer = |bytes: Vec<u8>| CommitAnswer::decode(&bytes).expect("an answer");
    let ours = inbound(IdSection::Accept);
    assert!(matches!(
        answer(ours.handle(NodeId(2), batch(Some(live))).await),
        CommitAnswer::Committed {
            base: Offset(0),
            count: 2,
            ..
        }
    ));
    // Records of another incarnation: 412 naming both ids, nothing appended.
    let stale = TopicId(live.0 + 7);
    let refusals = || node.metrics().cluster_incarnation_refusals.get();
    assert_eq!(refusals(), 0);
    assert_eq!(
        answer(ours.handle(NodeId(2), batch(Some(stale))).await),
        CommitAnswer::IncarnationMismatch {
            record_topic_id: stale,
            live_topic_id: Some(live)
        }
    );
    assert_eq!(refusals(), 1, "a 412 on the wire is counted");
    // The single-record op (the synchronous produce's) is checked the same way.
    let single = |topic_id: Option<TopicId>| {
        CommitProduce {
            budget_ms: 5_000,
            topic: "wire".to_string(),
            partition: PartitionId(1),
            record: WireRecord {
                topic_id,
                key: None,
                payload: b"single".to_vec(),
            },
        }
        .encode()
    };
    assert_eq!(
        answer(ours.handle(NodeId(2), single(Some(stale))).await),
        CommitAnswer::IncarnationMismatch {
            record_topic_id: stale,
            live_topic_id: Some(live)
        }
    );
    assert_eq!(refusals(), 2, "the single record's 412 is counted");
    // An owner from before the section refuses it as trailing data (400); the sender's transport
    // reads that as "resend without ids", and the id-less frame commits there.
    let legacy = inbound(IdSection::Refuse);
    let refused = legacy.handle(NodeId(2), batch(Some(live))).await;
    assert_eq!(answer(refused.clone()).status(), 400);
    assert_eq!(
        commit_outcome(&refused, true),
        Err(CommitFailure::RefusedTrailingIds)
    );
    assert!(matches!(
        answer(legacy.handle(NodeId(2), batch(None)).await),
        CommitAnswer::Committed {
            base: Offset(2),
            count: 2,
            ..
        }
    ));
    // A frame that is not a request: 400 too, never a panic.
    let garbage = answer(ours.handle(NodeId(2), vec![0xff, 1]).await);
    assert_eq!(garbage.status(), 400);
    for (offset, payload) in [(0, "a"), (1, "b"), (2, "a"), (3, "b")] {
        let reply = consume_at(&node, "wire", 1, offset).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert!(reply.text().contains(payload), "{}", reply.text());
    }
    assert_eq!(consume_at(&node, "wire", 1, 4).await.status, 204);
    // Its live incarnation commits, after everything above: the stale one appended nothing.
    assert!(matches!(
        answer(ours.handle(NodeId(2), single(Some(live))).await),
        CommitAnswer::Committed {
            base: Offset(4),
            count: 1,
            ..
        }
    ));
    stop(node).await;
}

/// The synchronous `Produce` op as a peer sends it: validated as an HTTP produce, placed by the picker
/// that walks past partitions whose owner is dead (a pinned one is kept), committed and answered
/// with its place.
#[tokio::test]
async fn a_synchronous_produce_skips_partitions_of_dead_owners_and_answers_its_offset() {
    use narad_core::codec::cluster::{Control, ControlAnswer, IdSection};
    use narad_core::metastore::Command;
    use narad_core::routing::partition_for_key;

    use crate::cluster::Inbound;
    use crate::node::peers::{NodeInbound, SyncProduce};

    let disk = SimDisk::new(12);
    let node = started(&disk, 12).await;
    // A second member, alive when the topic is created, so it owns some partitions; then dead.
    node.metastore()
        .propose(Command::AddMember {
            node: NodeId(2),
            addr: "127.0.0.2:7943".to_string(),
        })
        .await
        .expect("member added");
    create_topic(&node, "sync", 4).await;
    node.metastore()
        .propose(Command::SetMemberAlive {
            node: NodeId(2),
            alive: false,
        })
        .await
        .expect("member marked dead");
    let topic = node.metastore().view().state.topic("sync").unwrap().clone();
    let owner = |p: u32| topic.owner_of(PartitionId(p)).unwrap();
    assert!((0..4).any(|p| owner(p) == NodeId(2)) && (0..4).any(|p| owner(p) == NodeId(1)));
    let inbound = NodeInbound {
        partitions: node.partitions().clone(),
        metastore: node.metastore().clone(),
        clock: node.clock().clone(),
        ids: IdSection::Accept,
        sync: Some(Arc::new(SyncProduce {
            node: NodeId(1),
            app: node.app().clone(),
            cluster: None,
        })),
        metrics: node.metrics().clone(),
        plant: narad_core::planted::Plant::NONE,
        consumers: None,
        moves: None,
    };
    let produce = |key: Option<&str>, partition: Option<u32>, payload: &str| {
        let request = Control::Produce {
            topic: "sync".to_string(),
            key: key.map(|k| k.as_bytes().to_vec()),
            partition: partition.map(PartitionId),
            payload: payload.as_bytes().to_vec(),
            budget_ms: 5_000,
        }
        .encode();
        let answer = inbound.handle(NodeId(2), request);
        async move { ControlAnswer::decode(&answer.await).expect("an answer") }
    };
    // A key whose partition node 2 owns lands on the next partition (wrapping) with a live owner.
    let key = (0..1000)
        .map(|i| format!("k{i}"))
        .find(|k| owner(partition_for_key(k.as_bytes(), 4).0) == NodeId(2))
        .unwrap();
    let hashed = partition_for_key(key.as_bytes(), 4).0;
    let live = (1..4)
        .map(|step| (hashed + step) % 4)
        .find(|p| owner(*p) == NodeId(1))
        .unwrap();
    assert_eq!(
        produce(Some(&key), None, "first").await,
        ControlAnswer::Produced {
            partition: PartitionId(live),
            offset: Offset(0)
        }
    );
    assert_eq!(
        produce(Some(&key), None, "second").await,
        ControlAnswer::Produced {
            partition: PartitionId(live),
            offset: Offset(1)
        }
    );
    // Answered once visible: a consume sees it at once.
    let reply = consume_at(&node, "sync", live, 1).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.text().contains("second"), "{}", reply.text());
    // Keyless records go to live owners only.
    for _ in 0..8 {
        match produce(None, None, "keyless").await {
            ControlAnswer::Produced { partition, .. } => assert_eq!(owner(partition.0), NodeId(1)),
            other => panic!("{other:?}"),
        }
    }
    // A pinned partition is kept as asked: node 2's is unavailable here (no transport to it).
    let dead = (0..4).find(|p| owner(*p) == NodeId(2)).unwrap();
    assert!(matches!(
        produce(None, Some(dead), "pinned").await,
        ControlAnswer::Unavailable(_)
    ));
    // HTTP's refusals: unknown topic, empty payload, partition out of range.
    for (answer, expected) in [
        (
            {
                let request = Control::Produce {
                    topic: "absent".to_string(),
                    key: None,
                    partition: None,
                    payload: b"x".to_vec(),
                    budget_ms: 5_000,
                }
                .encode();
                ControlAnswer::decode(&inbound.handle(NodeId(2), request).await).unwrap()
            },
            "topic not found",
        ),
        (produce(None, None, "").await, "message required"),
        (produce(None, Some(9), "x").await, "partition out of range"),
    ] {
        assert_eq!(answer, ControlAnswer::BadRequest(expected.to_string()));
    }
    stop(node).await;
}

/// A free loopback UDP address (bound, read, released).
fn free_udp_addr() -> std::net::SocketAddr {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("a loopback UDP port");
    socket.local_addr().expect("its address")
}

/// Member `id` (1-based) of a cluster on `addrs`, on `disk`.
async fn start_member(id: u32, addrs: &[std::net::SocketAddr], disk: &SimDisk) -> Node {
    use crate::cluster::tls::{NodeIdentity, TlsIdentity};
    let mut options = options(disk, u64::from(id));
    options.config.cluster.node_id = id;
    options.member_addr = addrs[id as usize - 1].to_string();
    options.cluster = Some(ClusterSetup {
        options: crate::cluster::ClusterOptions {
            node: NodeId(id),
            bind: addrs[id as usize - 1],
            peers: (1..=addrs.len() as u32)
                .map(|peer| (NodeId(peer), addrs[peer as usize - 1].to_string()))
                .collect(),
            secret: b"restart-secret".to_vec(),
            rng_seed: None,
        },
        identity: TlsIdentity::SelfSigned(NodeIdentity::generate().expect("an identity")),
    });
    start(options).await.expect("the member starts")
}

/// A cluster member shut down and started again in the same process, on the same addresses and
/// disk, binds its cluster port and serves: its peers' commits reach it and it reaches theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_member_restarted_in_process_binds_again_and_serves() {
    let addrs: Vec<_> = (0..3).map(|_| free_udp_addr()).collect();
    let disks: Vec<_> = (0..3).map(|index| SimDisk::new(40 + index)).collect();
    let mut nodes = Vec::new();
    for id in 1..=3 {
        nodes.push(start_member(id, &addrs, &disks[id as usize - 1]).await);
    }
    for node in &nodes {
        tokio::time::timeout(WAIT_MAX, node.wait_ready())
            .await
            .expect("ready in time")
            .expect("recovered");
    }
    create_topic(&nodes[0], "spread", 3).await;
    let third = nodes.pop().expect("three members");
    stop(third).await;
    let third = start_member(3, &addrs, &disks[2]).await;
    tokio::time::timeout(WAIT_MAX, third.wait_ready())
        .await
        .expect("the restarted member is ready in time")
        .expect("the restarted member recovered");
    // Every partition, whoever owns it, produced through the restarted member and read back
    // through another: its dispatcher reaches remote owners and its inbound side serves them.
    for partition in 0..3 {
        produce_to(
            &third,
            "spread",
            partition,
            &format!("after-restart-{partition}"),
        )
        .await;
    }
    for partition in 0..3 {
        let reader = &nodes[0];
        let waited = tokio::time::timeout(WAIT_MAX, async {
            loop {
                let reply = consume_at(reader, "spread", partition, 0).await;
                if reply.status == 200
                    && reply.text().contains(&format!("after-restart-{partition}"))
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "partition {partition}: the record produced through the restarted member is not visible"
        );
    }
    stop(third).await;
    for node in nodes {
        stop(node).await;
    }
}

/// A WAL written by a binary from before format 2 (records without incarnation ids, the fixture in
/// `tests/fixtures/wal-format-1`, encoded from the format's description) replays: every record is
/// dispatched by topic name and becomes visible on the partition it names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_1_wal_replays_and_dispatches() {
    use narad_core::disk::Disk;
    const FIXTURE: &[u8] =
        include_bytes!("../../tests/fixtures/wal-format-1/00000000000000000000.wal");
    let segment = format!("{WAL_DIR}/00000000000000000000.wal");
    let disk = SimDisk::new(61);
    let node = started(&disk, 61).await;
    create_topic(&node, "legacy", 3).await;
    stop(node).await;
    // The topic exists and the WAL is empty: its first segment becomes the older binary's.
    assert_eq!(disk.len(&segment), Ok(0), "{:?}", disk.paths());
    disk.write_at(&segment, 0, FIXTURE)
        .expect("fixture written");
    disk.sync_data(&segment).expect("fixture synced");
    let node = started(&disk, 62).await;
    for seq in 0..6u64 {
        let partition = (seq % 3) as u32;
        let expected = format!("format-1 record {seq}");
        let waited = tokio::time::timeout(WAIT_MAX, async {
            loop {
                for offset in 0..2 {
                    let reply = consume_at(&node, "legacy", partition, offset).await;
                    if reply.status == 200 {
                        let message: serde_json::Value =
                            serde_json::from_slice(&reply.body).expect("a JSON message");
                        if message["payload"] == expected.as_str() {
                            return message;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{expected} is not visible on legacy/{partition}"));
        // The keyed records keep their key; the keyless ones have none.
        let key = waited.get("key").and_then(|key| key.as_str());
        if seq % 2 == 0 {
            assert_eq!(key, Some(format!("k{seq}").as_str()), "{waited}");
        } else {
            assert_ne!(key, Some(""), "{waited}");
        }
    }
    wait_for("the replayed backlog to drain", || {
        node.status().backlog_records == 0
    })
    .await;
    stop(node).await;
}

/// The disk lost the checkpoint's last write while the segment deletions behind it survived: the
/// node finds its stored checkpoint below its oldest WAL segment, starts dispatch at that segment
/// (every record below it was committed before the segment went), and keeps dispatching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_below_the_oldest_segment_starts_dispatch_at_that_segment() {
    use narad_core::disk::Disk;
    let disk = SimDisk::new(71);
    let small = |seed| {
        let mut options = options(&disk, seed);
        options.hooks.sizes.wal_segment_bytes_max = Some(16 * 1024);
        options
    };
    let node = start(small(71)).await.expect("started");
    node.wait_ready().await.expect("recovered");
    create_topic(&node, "compacted", 3).await;
    let payload = "x".repeat(200);
    for index in 0..400 {
        produce_to(&node, "compacted", index % 3, &payload).await;
    }
    wait_for("the backlog to drain", || {
        node.status().backlog_records == 0
    })
    .await;
    let first_segment = |disk: &SimDisk| {
        disk.paths()
            .iter()
            .filter_map(|path| path.strip_prefix(&format!("{WAL_DIR}/")))
            .filter_map(|name| name.strip_suffix(".wal"))
            .filter_map(|first| first.parse::<u64>().ok())
            .min()
    };
    wait_for("compaction to remove the first segments", || {
        first_segment(&disk).is_some_and(|first| first > 0)
    })
    .await;
    stop(node).await;
    let oldest = first_segment(&disk).expect("a segment");
    let checkpoint = format!("{WAL_DIR}/checkpoint");
    assert!(disk.len(&checkpoint).is_ok(), "{:?}", disk.paths());
    // An older value: the write that moved it past the deleted segments is gone.
    disk.write_at(&checkpoint, 0, &0u64.to_be_bytes())
        .expect("checkpoint written");
    disk.sync_data(&checkpoint).expect("checkpoint synced");

    let node = start(small(72)).await.expect("started again");
    tokio::time::timeout(WAIT_MAX, node.wait_ready())
        .await
        .expect("ready in time")
        .expect("recovered below the oldest segment");
    let status = node.wal().expect("the WAL is open").status();
    assert_eq!(status.dispatch_start, Seq(oldest), "{status:?}");
    // Dispatch goes on: new records become visible and the backlog drains.
    produce_to(&node, "compacted", 0, "after the lost checkpoint").await;
    wait_for("the backlog to drain after the restart", || {
        node.status().backlog_records == 0
    })
    .await;
    let mut offset = 0;
    let mut last = String::new();
    loop {
        let reply = consume_at(&node, "compacted", 0, offset).await;
        if reply.status != 200 {
            assert_eq!(reply.status, 204, "{}", reply.text());
            break;
        }
        last = reply.text();
        offset += 1;
    }
    assert!(last.contains("after the lost checkpoint"), "{last}");
    stop(node).await;
}

/// A record this binary cannot decode (a format from a newer release) stops dispatch in front of
/// it: what came before is dispatched, what comes after waits in the WAL (nothing skipped, nothing
/// lost), and the node stays up and ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_record_stops_dispatch_in_front_of_it() {
    use narad_core::codec::wal::encode_frame;
    use narad_core::disk::Disk;
    let segment = format!("{WAL_DIR}/00000000000000000000.wal");
    let disk = SimDisk::new(81);
    let node = started(&disk, 81).await;
    create_topic(&node, "stuck", 3).await;
    stop(node).await;
    let record = |payload: &str| {
        ProduceRecord {
            topic: "stuck".to_string(),
            topic_id: None,
            key: None,
            partition: PartitionId(0),
            timestamp_ms: 1,
            payload: payload.as_bytes().to_vec(),
        }
        .to_bytes()
    };
    let mut unknown = record("from a newer release");
    unknown[0] = 0x09;
    let mut bytes = Vec::new();
    encode_frame(&mut bytes, Seq(0), &record("before"));
    encode_frame(&mut bytes, Seq(1), &unknown);
    encode_frame(&mut bytes, Seq(2), &record("behind"));
    disk.write_at(&segment, 0, &bytes).expect("segment written");
    disk.sync_data(&segment).expect("segment synced");

    let node = started(&disk, 82).await;
    let waited = tokio::time::timeout(WAIT_MAX, async {
        loop {
            let reply = consume_at(&node, "stuck", 0, 0).await;
            if reply.status == 200 {
                return reply.text();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the record before the undecodable one is dispatched");
    assert!(waited.contains("before"), "{waited}");
    // Well past a rescan (1 s): the record behind is still waiting, not skipped, not lost.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(consume_at(&node, "stuck", 0, 1).await.status, 204);
    let status = node.status();
    assert!(status.ready && !status.wal_failed, "{status:?}");
    assert!(status.backlog_records >= 2, "{status:?}");
    stop(node).await;
}
