//! Tests of the ingress host over real files and `SimDisk`.

use std::sync::atomic::{AtomicU64, Ordering};

use narad_core::checkpoint::CheckpointOp;
use narad_core::disk::DiskLayer;

use super::*;
use crate::failpoints::{Counter, FailpointError, Failpoints, Rule};
use crate::fs_disk::FsDisk;

const DIR: &str = "wal";

/// FsDisk that counts `sync_data` calls on segments.
struct CountingDisk {
    inner: FsDisk,
    segment_syncs: AtomicU64,
}

impl DiskLayer for CountingDisk {
    fn inner(&self) -> &dyn Disk {
        &self.inner
    }
    fn sync_data(&self, path: &str) -> Result<(), IoFault> {
        if path.ends_with(".wal") {
            self.segment_syncs.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.sync_data(path)
    }
}

/// An FsDisk in `dir` whose files under `DIR/<prefix>` fail with `fault` after `after` of `counter`.
fn failing_disk(
    dir: &tempfile::TempDir,
    prefix: &str,
    fault: FailpointError,
    counter: Counter,
    after: u64,
) -> Arc<dyn Disk> {
    let failpoints = Failpoints::new(vec![Rule {
        path_prefix: format!("{DIR}/{prefix}"),
        fault,
        counter,
        after,
    }]);
    Arc::new(FsDisk::with_failpoints(dir.path(), failpoints).unwrap())
}

fn config() -> IngressHostConfig {
    IngressHostConfig::new(WalConfig {
        dir: DIR.to_string(),
        ..WalConfig::default()
    })
}

fn fs_disk(root: &std::path::Path) -> Arc<dyn Disk> {
    Arc::new(FsDisk::new(root).expect("disk"))
}

fn record(index: u64) -> Vec<u8> {
    format!("record {index:05}").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_take_dense_seqs_and_are_durable_when_answered() {
    let dir = tempfile::tempdir().unwrap();
    let (host, report) = IngressHost::open(fs_disk(dir.path()), config(), Clock::start())
        .await
        .unwrap();
    assert_eq!(report.next_seq, Seq(0));
    for index in 0..3 {
        assert_eq!(host.append(record(index)).await, Ok(Seq(index)));
    }
    assert_eq!(host.durable_next_seq(), Seq(3));
    assert_eq!(
        host.append_many(vec![record(3), record(4), record(5)])
            .await,
        Ok(Seq(3)..Seq(6))
    );
    assert_eq!(host.durable_next_seq(), Seq(6));
    let frames = host.read(Seq(0), 100, 1 << 20).await.unwrap();
    let payloads: Vec<Vec<u8>> = frames.iter().map(|frame| frame.payload.clone()).collect();
    assert_eq!(payloads, (0..6).map(record).collect::<Vec<_>>());
    assert_eq!(host.shutdown().await, Ok(Seq(0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_share_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    let disk = Arc::new(CountingDisk {
        inner: FsDisk::new(dir.path()).unwrap(),
        segment_syncs: AtomicU64::new(0),
    });
    let (host, _) = IngressHost::open(disk.clone(), config(), Clock::start())
        .await
        .unwrap();
    let before = disk.segment_syncs.load(Ordering::Relaxed);
    let appenders = 64u64;
    let per_appender = 20u64;
    let mut tasks = Vec::new();
    for appender in 0..appenders {
        let host = host.clone();
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for index in 0..per_appender {
                let seq = host.append(record(appender * 1000 + index)).await.unwrap();
                seqs.push(seq);
            }
            seqs
        }));
    }
    let mut seqs = Vec::new();
    for task in tasks {
        seqs.extend(task.await.unwrap());
    }
    seqs.sort();
    let records = appenders * per_appender;
    assert_eq!(seqs, (0..records).map(Seq).collect::<Vec<_>>());
    let syncs = disk.segment_syncs.load(Ordering::Relaxed) - before;
    assert!(
        syncs * 4 <= records,
        "{records} records took {syncs} fsyncs: group commit must share them"
    );
    host.shutdown().await.unwrap();
}

/// FsDisk that notes the node clock's reading when each segment `sync_data` returns.
struct SyncTimesDisk {
    inner: FsDisk,
    clock: Clock,
    synced_at: std::sync::Mutex<Vec<Instant>>,
}

impl DiskLayer for SyncTimesDisk {
    fn inner(&self) -> &dyn Disk {
        &self.inner
    }
    fn sync_data(&self, path: &str) -> Result<(), IoFault> {
        let result = self.inner.sync_data(path);
        if path.ends_with(".wal") {
            self.synced_at.lock().unwrap().push(self.clock.now());
        }
        result
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_s_accept_instant_is_its_answer_after_the_fsync_and_recovered_ones_have_none() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::start();
    {
        let (host, _) = IngressHost::open(fs_disk(dir.path()), config(), clock.clone())
            .await
            .unwrap();
        host.append(record(0)).await.unwrap();
        host.shutdown().await.unwrap();
    }
    let disk = Arc::new(SyncTimesDisk {
        inner: FsDisk::new(dir.path()).unwrap(),
        clock: clock.clone(),
        synced_at: std::sync::Mutex::new(Vec::new()),
    });
    let (host, _) = IngressHost::open(disk.clone(), config(), clock.clone())
        .await
        .unwrap();
    let accepted_at = |seq| {
        let host = host.clone();
        async move { host.accept_time(seq).await.expect("the host runs") }
    };
    assert_eq!(accepted_at(Seq(0)).await.0, None, "recovered: no 202 here");
    for index in 1..4 {
        let asked = clock.now();
        let seq = host.append(record(index)).await.unwrap();
        let answered = clock.now();
        let accepted = accepted_at(seq)
            .await
            .0
            .expect("an accepted record has an instant");
        let last_sync = *disk.synced_at.lock().unwrap().last().unwrap();
        assert!(
            asked <= last_sync && last_sync <= accepted && accepted <= answered,
            "record {seq}: asked {asked}, fsynced {last_sync}, accepted {accepted}, answered {answered}"
        );
    }
    assert_eq!(accepted_at(Seq(3)).await.1, 3);
    host.store_checkpoint_written(Seq(3)).await.unwrap();
    let (kept_instant, kept) = accepted_at(Seq(3)).await;
    assert_eq!(
        kept, 1,
        "group commits below the written checkpoint are forgotten"
    );
    assert!(kept_instant.is_some());
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_recovers_every_acknowledged_record() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (host, _) = IngressHost::open(fs_disk(dir.path()), config(), Clock::start())
            .await
            .unwrap();
        for index in 0..10 {
            host.append(record(index)).await.unwrap();
        }
        host.append_many(vec![record(10), record(11)])
            .await
            .unwrap();
        host.shutdown().await.unwrap();
    }
    let (host, report) = IngressHost::open(fs_disk(dir.path()), config(), Clock::start())
        .await
        .unwrap();
    assert_eq!(report.next_seq, Seq(12));
    assert_eq!(host.durable_next_seq(), Seq(12));
    let frames = host.read(Seq(0), 100, 1 << 20).await.unwrap();
    let got: Vec<(Seq, Vec<u8>)> = frames
        .into_iter()
        .map(|frame| (frame.seq, frame.payload))
        .collect();
    let want: Vec<(Seq, Vec<u8>)> = (0..12).map(|index| (Seq(index), record(index))).collect();
    assert_eq!(got, want);
    assert_eq!(host.append(record(12)).await, Ok(Seq(12)));
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkpoint_round_trips_through_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (host, _) = IngressHost::open(fs_disk(dir.path()), config(), Clock::start())
            .await
            .unwrap();
        for index in 0..8 {
            host.append(record(index)).await.unwrap();
        }
        host.store_checkpoint(Seq(5)).await.unwrap();
        assert_eq!(host.shutdown().await, Ok(Seq(5)));
    }
    let bytes = std::fs::read(dir.path().join(DIR).join("checkpoint")).unwrap();
    assert_eq!(bytes, 5u64.to_be_bytes());
    let (host, _) = IngressHost::open(fs_disk(dir.path()), config(), Clock::start())
        .await
        .unwrap();
    let status = host.status();
    assert_eq!(status.checkpoint_synced, Seq(5));
    assert_eq!(status.checkpoint_stored, Seq(5));
    assert_eq!(status.dispatch_start, Seq(5));
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_synced_checkpoint_compacts_segments_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config.wal.segment_bytes_max = 64 * 1024;
    config.wal.record_bytes_max = 1024;
    config.wal.rotate_dispatched_active_after_bytes = 1024;
    let (host, _) = IngressHost::open(fs_disk(dir.path()), config, Clock::start())
        .await
        .unwrap();
    let payload = vec![7u8; 1000];
    for _ in 0..300 {
        host.append(payload.clone()).await.unwrap();
    }
    let segments = |path: &std::path::Path| {
        std::fs::read_dir(path.join(DIR))
            .unwrap()
            .filter(|entry| {
                entry
                    .as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".wal")
            })
            .count()
    };
    assert!(
        segments(dir.path()) >= 4,
        "300 KB of records in 64 KiB segments"
    );
    let mut status = host.subscribe();
    host.store_checkpoint(Seq(300)).await.unwrap();
    // Compaction follows only the synced value, which comes within the 250 ms flush delay.
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        status.wait_for(|status| status.checkpoint_synced == Seq(300)),
    )
    .await
    .expect("synced within the delay")
    .unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while segments(dir.path()) > 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        segments(dir.path()),
        1,
        "everything dispatched is reclaimed"
    );
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fsync_latches_and_every_later_append_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Segment names start with a digit: the checkpoint file is spared.
    let disk = failing_disk(&dir, "0", FailpointError::Eio, Counter::Syncs, 3);
    let (host, _) = IngressHost::open(disk, config(), Clock::start())
        .await
        .unwrap();
    let mut acked = 0u64;
    let mut failure = None;
    for index in 0..10 {
        match host.append(record(index)).await {
            Ok(seq) => {
                assert_eq!(seq, Seq(acked));
                acked += 1;
            }
            Err(error) => {
                failure = Some(error);
                break;
            }
        }
    }
    let error = WalError::Append(AppendError::Disk(IoFault::Eio));
    assert_eq!(failure, Some(error.clone()));
    assert!(host.is_latched());
    assert_eq!(host.status().latched, Some(IoFault::Eio));
    assert_eq!(host.append(record(99)).await, Err(error.clone()));
    assert_eq!(host.append_many(vec![record(100)]).await, Err(error));
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_that_cannot_be_created_fails_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let disk = failing_disk(
        &dir,
        "checkpoint",
        FailpointError::NoSpace,
        Counter::Bytes,
        0,
    );
    let error = IngressHost::open(disk, config(), Clock::start())
        .await
        .expect_err("no space");
    assert!(
        matches!(
            &error,
            WalHostOpenError::CheckpointSync(CheckpointFailure {
                op: CheckpointOp::Create,
                fault: IoFault::NoSpace
            })
        ),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_store_is_answered_once_written_and_sets_the_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let (host, _) = IngressHost::open(fs_disk(dir.path()), config(), Clock::start())
        .await
        .unwrap();
    for index in 0..5 {
        host.append(record(index)).await.unwrap();
    }
    assert_eq!(host.backlog_records(), 5);
    assert_eq!(host.store_checkpoint_written(Seq(3)).await, Ok(()));
    assert_eq!(host.status().checkpoint_written, Seq(3));
    assert_eq!(host.backlog_records(), 2);
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_store_reports_the_checkpointer_s_failure() {
    let dir = tempfile::tempdir().unwrap();
    // The creation at open writes 8 bytes; the first store's in-place write is the next.
    let disk = failing_disk(&dir, "checkpoint", FailpointError::Eio, Counter::Bytes, 8);
    let (host, _) = IngressHost::open(disk, config(), Clock::start())
        .await
        .unwrap();
    host.append(record(0)).await.unwrap();
    let failure = CheckpointFailure {
        op: CheckpointOp::Write,
        fault: IoFault::Eio,
    };
    assert_eq!(
        host.store_checkpoint_written(Seq(1)).await,
        Err(StoreError::Failed(failure))
    );
    assert_eq!(host.status().checkpoint_written, Seq(0));
    assert_eq!(host.backlog_records(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_fail_with_stopped_after_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let (host, _) = IngressHost::open(fs_disk(dir.path()), config(), Clock::start())
        .await
        .unwrap();
    host.shutdown().await.unwrap();
    // A command sent now is never taken: it is dropped with the mailbox when the task ends.
    assert_eq!(host.append(record(0)).await, Err(WalError::Unavailable));
    assert_eq!(host.shutdown().await, Err(ShutdownError::Stopped));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_simdisk_every_acknowledged_record_survives_a_power_loss() {
    use narad_core::disk::sim::SimDisk;
    let disk = SimDisk::new(7);
    let (host, _) = IngressHost::open(Arc::new(disk.clone()), config(), Clock::start())
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for appender in 0..8u64 {
        let host = host.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for index in 0..10 {
                let record = record(appender * 100 + index);
                let seq = host.append(record.clone()).await.unwrap();
                acked.push((seq, record));
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for task in tasks {
        acked.extend(task.await.unwrap());
    }
    acked.sort();
    host.store_checkpoint(Seq(40)).await.unwrap();
    assert_eq!(host.shutdown().await, Ok(Seq(40)));
    disk.crash();
    let (host, report) = IngressHost::open(Arc::new(disk.clone()), config(), Clock::start())
        .await
        .unwrap();
    assert_eq!(report.next_seq, Seq(80));
    assert_eq!(host.status().checkpoint_synced, Seq(40));
    let frames = host.read(Seq(0), 100, 1 << 20).await.unwrap();
    let recovered: Vec<(Seq, Vec<u8>)> = frames
        .into_iter()
        .map(|frame| (frame.seq, frame.payload))
        .collect();
    assert_eq!(recovered, acked);
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_truncates_a_torn_tail_and_appends_after_it() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (host, _) = IngressHost::open(fs_disk(dir.path()), config(), Clock::start())
            .await
            .unwrap();
        for index in 0..5 {
            host.append(record(index)).await.unwrap();
        }
        host.shutdown().await.unwrap();
    }
    let segment = dir.path().join(DIR).join("00000000000000000000.wal");
    let clean_len = std::fs::metadata(&segment).unwrap().len();
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes.extend_from_slice(&[0xAB; 37]);
    std::fs::write(&segment, &bytes).unwrap();
    let (host, report) = IngressHost::open(fs_disk(dir.path()), config(), Clock::start())
        .await
        .unwrap();
    let torn = report.torn_tail.expect("a torn tail");
    assert_eq!(
        (torn.segment, torn.offset, torn.bytes_dropped),
        (Seq(0), clean_len, 37)
    );
    assert_eq!(
        std::fs::metadata(&segment).unwrap().len(),
        clean_len,
        "repaired on disk"
    );
    assert_eq!(host.append(record(5)).await, Ok(Seq(5)));
    let frames = host.read(Seq(0), 100, 1 << 20).await.unwrap();
    let payloads: Vec<Vec<u8>> = frames.into_iter().map(|frame| frame.payload).collect();
    assert_eq!(payloads, (0..6).map(record).collect::<Vec<_>>());
    host.shutdown().await.unwrap();
}
