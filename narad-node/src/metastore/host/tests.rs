use narad_core::disk::sim::{DiskFault, FaultRule, SimDisk};
use narad_core::ids::TopicId;
use narad_core::metastore::{CreateTopic, TopicSettings};

use super::*;

fn options() -> MetastoreOptions {
    MetastoreOptions::new(NodeId(1), "127.0.0.1:7943".to_string())
}

fn create(name: &str) -> Command {
    Command::CreateTopic(CreateTopic {
        name: name.to_string(),
        partitions: 0,
        settings: TopicSettings {
            retention_ms: 0,
            retention_bytes: 0,
            visibility_timeout_ms: 0,
            max_in_flight_per_partition: 0,
            max_acked_ahead_per_partition: 0,
        },
        schema: None,
        owner: String::new(),
        created_at_s: 1,
    })
}

async fn open(disk: &SimDisk, options: MetastoreOptions) -> Metastore {
    let metastore = Metastore::open(Arc::new(disk.clone()), options)
        .await
        .unwrap();
    metastore.wait_caught_up().await.unwrap();
    metastore
        .wait_until(|view| view.state.members().contains_key(&NodeId(1)))
        .await
        .unwrap();
    metastore
}

fn created_id(result: Result<Applied, ProposeError>) -> TopicId {
    match result {
        Ok(Applied::TopicCreated(topic)) => topic.id,
        other => panic!("expected a created topic, got {other:?}"),
    }
}

/// Found by the simulator's node tests: the answer went out while applying, before the view was
/// published, so a caller on another worker thread could miss the topic it had just created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answered_proposal_is_already_in_the_view_on_any_thread() {
    let disk = SimDisk::new(7);
    let metastore = open(&disk, options()).await;
    for index in 0..200 {
        let name = format!("t{index}");
        let id = created_id(metastore.propose(create(&name)).await);
        assert_eq!(
            metastore.view().state.topic(&name).map(|topic| topic.id),
            Some(id),
            "answered before the view showed {name}"
        );
    }
}

#[tokio::test]
async fn a_proposal_is_answered_once_applied_and_visible_in_the_view() {
    let disk = SimDisk::new(1);
    let metastore = open(&disk, options()).await;
    assert_eq!(
        created_id(metastore.propose(create("orders")).await),
        TopicId(1)
    );
    let view = metastore.view();
    let topic = view.state.topic("orders").unwrap();
    assert_eq!(topic.owners, vec![Some(NodeId(1)); 3]);
    assert!(view.state.members().contains_key(&NodeId(1)));
    assert_eq!(
        metastore.propose(create("orders")).await,
        Err(ProposeError::Refused(TopicError::Exists))
    );
}

/// Read-your-writes: the answer comes only after the view that shows the change is published, so a
/// caller on another thread never reads a replica without its own topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answered_proposal_is_already_in_the_view_on_another_thread() {
    let disk = SimDisk::new(9);
    let metastore = open(&disk, options()).await;
    for index in 0..100 {
        let name = format!("t{index}");
        created_id(metastore.propose(create(&name)).await);
        assert!(
            metastore.view().state.topic(&name).is_some(),
            "{name} answered but not in the view"
        );
    }
}

#[tokio::test]
async fn topics_survive_a_restart_and_ids_keep_counting() {
    let disk = SimDisk::new(2);
    {
        let metastore = open(&disk, options()).await;
        created_id(metastore.propose(create("a")).await);
        created_id(metastore.propose(create("b")).await);
        metastore
            .propose(Command::DeleteTopic {
                name: "b".to_string(),
            })
            .await
            .unwrap();
    }
    // Everything acknowledged was fsynced: a power loss keeps it.
    disk.crash();
    let metastore = open(&disk, options()).await;
    let view = metastore.view();
    assert_eq!(
        view.state.topic("a").map(|topic| topic.id),
        Some(TopicId(1))
    );
    assert_eq!(view.state.topic("b"), None);
    assert_eq!(created_id(metastore.propose(create("b")).await), TopicId(3));
}

#[tokio::test]
async fn a_snapshot_keeps_the_state_and_shortens_the_log() {
    let disk = SimDisk::new(3);
    let mut options = options();
    options.snapshot_every_entries = 5;
    {
        let metastore = open(&disk, options.clone()).await;
        for index in 0..12 {
            created_id(metastore.propose(create(&format!("t{index:02}"))).await);
        }
    }
    assert!(disk.durable_image("metastore/snapshot").is_some());
    disk.crash();
    let metastore = open(&disk, options).await;
    let view = metastore.view();
    assert_eq!(view.state.topic_count(), 12);
    assert_eq!(
        view.state.topic("t11").map(|topic| topic.id),
        Some(TopicId(12))
    );
    assert_eq!(
        created_id(metastore.propose(create("t12")).await),
        TopicId(13)
    );
}

/// Fails the next fdatasync of the metastore log; returns the latch's message.
fn fail_next_log_sync(disk: &SimDisk) -> String {
    disk.add_fault(FaultRule {
        path_prefix: "metastore/log".to_string(),
        kind: DiskFault::SyncEio,
        chance_ppm: 1_000_000,
        remaining: Some(1),
    });
    "metastore disk failure: input/output error".to_string()
}

#[tokio::test]
async fn a_disk_failure_latches_proposals_but_reads_keep_serving() {
    let disk = SimDisk::new(4);
    let metastore = open(&disk, options()).await;
    created_id(metastore.propose(create("a")).await);
    let failure = fail_next_log_sync(&disk);
    assert_eq!(
        metastore.propose(create("b")).await,
        Err(ProposeError::Unavailable(failure.clone()))
    );
    // The fault is gone, but a failed fsync is never retried: still latched.
    assert_eq!(
        metastore.propose(create("c")).await,
        Err(ProposeError::Unavailable(failure.clone()))
    );
    let view = metastore.view();
    assert!(view.state.topic("a").is_some());
    assert_eq!(view.failed, Some(failure));
}

#[tokio::test]
async fn a_read_barrier_passes_on_a_sole_voter_and_fails_once_latched() {
    let disk = SimDisk::new(5);
    let metastore = open(&disk, options()).await;
    metastore.read_index().await.unwrap();
    created_id(metastore.propose(create("a")).await);
    metastore.read_index().await.unwrap();
    let applied = metastore.view().applied_index;
    assert!(metastore.view().state.topic("a").is_some());
    let failure = fail_next_log_sync(&disk);
    assert_eq!(
        metastore.propose(create("b")).await,
        Err(ProposeError::Unavailable(failure.clone()))
    );
    assert_eq!(
        metastore.read_index().await,
        Err(ProposeError::Unavailable(failure))
    );
    assert_eq!(metastore.view().applied_index, applied);
}

/// The failpoint a cross-process test holds a member's metastore back with: while the file exists the
/// entry is committed and applied by raft, but the view stays as it was and the caller waits; the
/// file's removal publishes both within a tick.
#[tokio::test]
async fn the_hold_file_keeps_the_view_and_the_answers_back_until_removed() {
    let dir = tempfile::tempdir().unwrap();
    let hold = dir.path().join("hold");
    let disk = SimDisk::new(3);
    let mut held = options();
    held.hold_file = Some(hold.clone());
    let metastore = open(&disk, held).await;
    let before = metastore.view();

    std::fs::write(&hold, b"").unwrap();
    let proposer = metastore.clone();
    let proposal = tokio::spawn(async move { proposer.propose(create("orders")).await });
    // Ticks come every 100 ms: ten of them with the proposal applied inside the replica.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!proposal.is_finished(), "answered while held");
    let view = metastore.view();
    assert!(view.state.topic("orders").is_none(), "published while held");
    assert_eq!(view.applied_index, before.applied_index);

    std::fs::remove_file(&hold).unwrap();
    let answered = tokio::time::timeout(Duration::from_secs(5), proposal)
        .await
        .expect("answered after the hold ended")
        .unwrap();
    assert_eq!(created_id(answered), TopicId(1));
    let view = metastore.view();
    assert!(view.state.topic("orders").is_some());
    assert!(view.applied_index > before.applied_index);
}
