//! Unit tests of a journaled partition log: a commit is written and read back without an fsync,
//! handed to the owner journal, and visible only once the journal answers; lazy syncs.

use super::*;
use crate::disk::sim::{DiskFault, FaultRule, SimDisk};
use crate::disk::{execute, Disk};
use crate::partition::driver::{run_to_idle, NoHook};

const DIR: &str = "topics/orders/1/p00000";
const NOW: Instant = Instant::ZERO;

fn journaled() -> PartitionLogConfig {
    PartitionLogConfig {
        segment_bytes_max: 300,
        journaled: true,
        ..PartitionLogConfig::new(DIR)
    }
}

fn open(disk: &SimDisk) -> PartitionLog {
    let mut log = PartitionLog::open(journaled());
    let outputs = run_to_idle(&mut log, NOW, disk, &mut NoHook).unwrap();
    assert!(matches!(outputs.as_slice(), [LogOutput::Opened(_)]));
    log
}

fn commit(log: &mut PartitionLog, id: u64, payloads: &[&str]) {
    log.handle(
        NOW,
        LogInput::Commit(CommitRequest {
            id: LogCommitId(id),
            records: payloads
                .iter()
                .map(|payload| AppendRecord {
                    key: None,
                    payload: payload.as_bytes().to_vec(),
                })
                .collect(),
            committed_at_ms: 5,
        }),
    );
}

fn ops(request: &IoRequest) -> Vec<&'static str> {
    request
        .ops
        .iter()
        .map(|op| match op {
            IoOp::Create { .. } => "create",
            IoOp::WriteAt { .. } => "write",
            IoOp::WriteZeros { .. } => "zeros",
            IoOp::ReadAt { .. } => "read",
            IoOp::SetLen { .. } => "setlen",
            IoOp::SyncData { .. } => "sync",
            IoOp::SyncDir { .. } => "syncdir",
            _ => "other",
        })
        .collect()
}

/// Runs the log's I/O; returns the other outputs.
fn run(log: &mut PartitionLog, disk: &SimDisk) -> Vec<LogOutput> {
    run_to_idle(log, NOW, disk, &mut NoHook).unwrap()
}

#[test]
fn a_commit_is_written_without_an_fsync_and_visible_only_once_the_journal_answers() {
    let disk = SimDisk::new(1);
    let mut log = open(&disk);
    let syncs = disk.stats().syncs;
    commit(&mut log, 1, &["a", "bc"]);
    let request = match log.poll_output() {
        Some(LogOutput::Io(request)) => request,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        ops(&request),
        ["create", "write", "read"],
        "no fsync, no zero fill"
    );
    log.handle(NOW, LogInput::Io(execute(&disk, &request)));
    assert_eq!(disk.stats().syncs, syncs);
    let run = match log.poll_output() {
        Some(LogOutput::Journal { id, run }) => {
            assert_eq!(id, LogCommitId(1));
            run
        }
        other => panic!("{other:?}"),
    };
    assert_eq!((run.segment, run.position), (Offset(0), 0));
    assert_eq!(run.frames, vec![(0, run.bytes.len(), Offset(2))]);
    assert_eq!(
        log.high_watermark(),
        Offset(0),
        "not visible before the journal's fsync"
    );
    assert_eq!(log.status(), LogStatus::Committing);
    log.handle(
        NOW,
        LogInput::JournalDone {
            id: LogCommitId(1),
            result: Ok(()),
        },
    );
    assert!(matches!(
        log.poll_output(),
        Some(LogOutput::CommitDone {
            result: Ok(CommittedRun {
                base: Offset(0),
                count: 2,
                ..
            }),
            ..
        })
    ));
    assert_eq!(log.high_watermark(), Offset(2));
    assert!(log.unsynced());
}

#[test]
fn a_journal_failure_discards_the_commit_and_cuts_the_partition_file_back() {
    let disk = SimDisk::new(2);
    let mut log = open(&disk);
    commit(&mut log, 1, &["kept"]);
    let _ = run(&mut log, &disk);
    log.handle(
        NOW,
        LogInput::JournalDone {
            id: LogCommitId(1),
            result: Ok(()),
        },
    );
    let _ = run(&mut log, &disk);
    let kept_bytes = log.stats().size_bytes;
    commit(&mut log, 2, &["lost"]);
    let outputs = run(&mut log, &disk);
    assert!(matches!(outputs.as_slice(), [LogOutput::Journal { .. }]));
    log.handle(
        NOW,
        LogInput::JournalDone {
            id: LogCommitId(2),
            result: Err(IoFault::Eio),
        },
    );
    let outputs = run(&mut log, &disk);
    assert!(matches!(
        outputs.as_slice(),
        [LogOutput::CommitDone {
            result: Err(CommitFault::Sync(IoFault::Eio)),
            ..
        }]
    ));
    assert_eq!(log.high_watermark(), Offset(1));
    assert_eq!(
        disk.len(&format!("{DIR}/{}", segment_name(Offset(0))))
            .unwrap(),
        kept_bytes
    );
    // The offsets are taken again by the next commit.
    commit(&mut log, 3, &["again"]);
    let outputs = run(&mut log, &disk);
    assert!(
        matches!(&outputs[..], [LogOutput::Journal { run, .. }] if run.frames[0].2 == Offset(2))
    );
}

#[test]
fn a_lazy_sync_covers_the_segments_written_and_their_names_then_vouches_for_the_high_watermark() {
    let disk = SimDisk::new(3);
    let mut log = open(&disk);
    // Three commits over a roll (300-byte segments): two segments written, the second one new.
    for id in 1..=3 {
        commit(&mut log, id, &[&"x".repeat(100)]);
        let _ = run(&mut log, &disk);
        log.handle(
            NOW,
            LogInput::JournalDone {
                id: LogCommitId(id),
                result: Ok(()),
            },
        );
        let _ = run(&mut log, &disk);
    }
    assert_eq!(log.stats().segments, 2);
    log.handle(NOW, LogInput::Sync);
    let request = match log.poll_output() {
        Some(LogOutput::Io(request)) => request,
        other => panic!("{other:?}"),
    };
    assert_eq!(request.lane, IoLane(2), "beside commits, on its own lane");
    assert_eq!(ops(&request), ["sync", "sync", "syncdir"]);
    // A commit written while the sync runs is not covered by it.
    commit(&mut log, 4, &["late"]);
    let _ = run(&mut log, &disk);
    log.handle(NOW, LogInput::Io(execute(&disk, &request)));
    assert!(matches!(
        log.poll_output(),
        Some(LogOutput::Synced { through: Offset(3) })
    ));
    assert!(log.unsynced(), "the late write still waits for a sync");
    log.handle(
        NOW,
        LogInput::JournalDone {
            id: LogCommitId(4),
            result: Ok(()),
        },
    );
    let _ = run(&mut log, &disk);
    log.handle(NOW, LogInput::Sync);
    let outputs = run(&mut log, &disk);
    assert!(matches!(
        outputs.as_slice(),
        [LogOutput::Synced { through: Offset(4) }]
    ));
    assert!(!log.unsynced());
    // Nothing unsynced: answered at once, without I/O.
    log.handle(NOW, LogInput::Sync);
    assert!(matches!(
        log.poll_output(),
        Some(LogOutput::Synced { through: Offset(4) })
    ));
    assert!(log.poll_output().is_none());
}

#[test]
fn after_a_failed_lazy_sync_the_next_one_writes_the_unsynced_frames_again_before_it_vouches() {
    let disk = SimDisk::new(4);
    let mut log = open(&disk);
    let commit_visible = |log: &mut PartitionLog, id: u64, payload: &str| {
        commit(log, id, &[payload]);
        let _ = run(log, &disk);
        log.handle(
            NOW,
            LogInput::JournalDone {
                id: LogCommitId(id),
                result: Ok(()),
            },
        );
        let _ = run(log, &disk);
    };
    commit_visible(&mut log, 1, "a");
    disk.add_fault(FaultRule {
        path_prefix: String::new(),
        kind: DiskFault::SyncEio,
        chance_ppm: 1_000_000,
        remaining: Some(1),
    });
    log.handle(NOW, LogInput::Sync);
    let outputs = run(&mut log, &disk);
    assert!(matches!(
        outputs.as_slice(),
        [LogOutput::SyncFailed(IoFault::Eio)]
    ));
    // fsyncgate: the disk dropped the frame's pages and marked them clean, so a bare sync would
    // now "succeed" without them.
    let path = format!("{DIR}/{}", segment_name(Offset(0)));
    assert!(disk
        .durable_image(&path)
        .is_none_or(|image| image.is_empty()));
    // Commits go on (the journal holds them).
    assert_eq!(log.status(), LogStatus::Ready);
    commit_visible(&mut log, 2, "b");
    log.handle(NOW, LogInput::Sync);
    let request = match log.poll_output() {
        Some(LogOutput::Io(request)) => request,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        ops(&request),
        ["read"],
        "the unsynced range read back first"
    );
    log.handle(NOW, LogInput::Io(execute(&disk, &request)));
    let request = match log.poll_output() {
        Some(LogOutput::Io(request)) => request,
        other => panic!("{other:?}"),
    };
    assert_eq!(ops(&request), ["write", "sync", "syncdir"]);
    log.handle(NOW, LogInput::Io(execute(&disk, &request)));
    assert!(matches!(
        log.poll_output(),
        Some(LogOutput::Synced { through: Offset(2) })
    ));
    let image = disk.durable_image(&path).expect("synced");
    assert_eq!(
        image.len() as u64,
        log.stats().size_bytes,
        "both frames durable"
    );
    assert!(!log.unsynced());
}

/// Commits `payloads` and answers its journal hand-off at once.
fn commit_journaled(log: &mut PartitionLog, disk: &SimDisk, id: u64, payloads: &[&str]) {
    commit(log, id, payloads);
    let outputs = run(log, disk);
    assert!(matches!(outputs.as_slice(), [LogOutput::Journal { .. }]));
    log.handle(
        NOW,
        LogInput::JournalDone {
            id: LogCommitId(id),
            result: Ok(()),
        },
    );
    let outputs = run(log, disk);
    assert!(matches!(
        outputs.as_slice(),
        [LogOutput::CommitDone { result: Ok(_), .. }]
    ));
}

#[test]
fn retention_removes_a_journaled_segment_only_once_synced_even_after_a_sync_raced_its_commit() {
    let disk = SimDisk::new(9);
    let mut log = open(&disk);
    let (small, big) = ("x".repeat(90), "x".repeat(200));
    // Segment 0 is created by a first commit and synced; its second commit is written (waiting
    // for the journal) when a lazy sync starts and ends: the sync covers its frames, the segment's
    // bytes grow only after.
    commit_journaled(&mut log, &disk, 1, &[&small]);
    log.handle(NOW, LogInput::Sync);
    assert!(matches!(
        run(&mut log, &disk).as_slice(),
        [LogOutput::Synced { .. }]
    ));
    commit(&mut log, 2, &[&small]);
    assert!(matches!(
        run(&mut log, &disk).as_slice(),
        [LogOutput::Journal { .. }]
    ));
    log.handle(NOW, LogInput::Sync);
    assert!(matches!(
        run(&mut log, &disk).as_slice(),
        [LogOutput::Synced { .. }]
    ));
    log.handle(
        NOW,
        LogInput::JournalDone {
            id: LogCommitId(2),
            result: Ok(()),
        },
    );
    let _ = run(&mut log, &disk);
    // Segment 1 seals segment 0.
    commit_journaled(&mut log, &disk, 3, &[&big]);
    assert_eq!(log.stats().segments, 2);
    // By size (an age policy would also roll the active segment, a second request at once).
    let policy = RetentionPolicy {
        now_ms: 1_000_000,
        retention_ms: u64::MAX / 2,
        retention_bytes: 1,
    };
    // The sync covered the raced commit's frames: segment 0 is synced, and goes.
    log.handle(NOW, LogInput::Retain(policy));
    let outputs = run(&mut log, &disk);
    assert!(
        outputs
            .iter()
            .any(|output| matches!(output, LogOutput::Retained(range) if range.records == 2)),
        "{outputs:?}"
    );
    assert_eq!(log.stats().oldest_offset, Offset(2));
    // Segment 1 is dirty when sealed by segment 2: the check starts a sync instead of removing it,
    // and the next check removes it.
    commit_journaled(&mut log, &disk, 4, &[&big]);
    log.handle(NOW, LogInput::Retain(policy));
    let outputs = run(&mut log, &disk);
    assert!(
        outputs
            .iter()
            .all(|output| !matches!(output, LogOutput::Retained(_))),
        "{outputs:?}"
    );
    assert!(outputs
        .iter()
        .any(|output| matches!(output, LogOutput::Synced { .. })));
    assert_eq!(disk.list(DIR).unwrap().len(), 2);
    log.handle(NOW, LogInput::Retain(policy));
    let outputs = run(&mut log, &disk);
    assert!(outputs
        .iter()
        .any(|output| matches!(output, LogOutput::Retained(_))));
    assert_eq!(log.stats().oldest_offset, Offset(3));
    assert_eq!(disk.list(DIR).unwrap().len(), 1);
}
