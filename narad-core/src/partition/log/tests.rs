//! Unit tests of the partition log: one rule per test, exact outputs.

use super::*;
use crate::codec::partition::{encode_frame, RecordView};
use crate::disk::sim::{DiskFault, FaultRule, SimDisk};
use crate::disk::{Disk, IoReply};
use crate::partition::driver::{run_to_idle, NoHook};
use crate::partition::segment::scan_segment;

mod reads_and_rolls;
mod reopening;
mod retention;
mod zero_fill;

const DIR: &str = "topics/orders/p00000";
const NOW: Instant = Instant::ZERO;

/// Without zero fill: most rules here are about frames and name the files' exact bytes.
fn config() -> PartitionLogConfig {
    PartitionLogConfig {
        segment_bytes_max: 1024,
        preallocate_bytes: 0,
        index_interval_bytes: 64,
        ..PartitionLogConfig::new(DIR)
    }
}

fn path(base: u64) -> String {
    format!("{DIR}/{}", segment_name(Offset(base)))
}

fn open(disk: &SimDisk, config: PartitionLogConfig) -> (PartitionLog, Vec<LogOutput>) {
    let mut log = PartitionLog::open(config);
    let outputs = run_to_idle(&mut log, NOW, disk, &mut NoHook).unwrap();
    (log, outputs)
}

fn opened(disk: &SimDisk) -> PartitionLog {
    let (log, outputs) = open(disk, config());
    assert!(
        matches!(outputs.as_slice(), [LogOutput::Opened(_)]),
        "{outputs:?}"
    );
    log
}

fn records(payloads: &[&str]) -> Vec<AppendRecord> {
    payloads
        .iter()
        .map(|payload| AppendRecord {
            key: None,
            payload: payload.as_bytes().to_vec(),
        })
        .collect()
}

fn commit_request(id: u64, payloads: &[&str], at_ms: u64) -> LogInput {
    LogInput::Commit(CommitRequest {
        id: LogCommitId(id),
        records: records(payloads),
        committed_at_ms: at_ms,
    })
}

fn commit(
    log: &mut PartitionLog,
    disk: &SimDisk,
    id: u64,
    payloads: &[&str],
    at_ms: u64,
) -> Vec<LogOutput> {
    log.handle(NOW, commit_request(id, payloads, at_ms));
    run_to_idle(log, NOW, disk, &mut NoHook).unwrap()
}

fn read(
    log: &mut PartitionLog,
    disk: &SimDisk,
    offset: u64,
    records_max: u32,
    bytes_max: u32,
) -> Result<ReadBatch, LogReadError> {
    log.handle(
        NOW,
        LogInput::Read(ReadRequest {
            id: LogReadId(offset),
            offset: Offset(offset),
            records_max,
            bytes_max,
        }),
    );
    let outputs = run_to_idle(log, NOW, disk, &mut NoHook).unwrap();
    match outputs.as_slice() {
        [LogOutput::ReadDone { id, result }] => {
            assert_eq!(*id, LogReadId(offset));
            result.clone()
        }
        other => panic!("unexpected outputs {other:?}"),
    }
}

fn payloads(batch: &ReadBatch) -> Vec<String> {
    batch
        .records
        .iter()
        .map(|record| String::from_utf8(record.payload.clone()).unwrap())
        .collect()
}

/// Writes a synced segment at `base` of the frames of "a", "b", "c" (offsets from `base`, commit times
/// `at_ms`); returns where the frame of "b" starts.
fn write_three_frames(disk: &SimDisk, base: u64, at_ms: [u64; 3]) -> u64 {
    let mut bytes = frame_bytes(base, &["a"], at_ms[0]);
    let second = bytes.len() as u64;
    bytes.extend(frame_bytes(base + 1, &["b"], at_ms[1]));
    bytes.extend(frame_bytes(base + 2, &["c"], at_ms[2]));
    write_segment(disk, base, &bytes);
    second
}

/// Asserts what reads around a hole answer: `before` serves its payloads, a read from `hole` is
/// unreadable, and `after` serves its payloads.
fn assert_reads_around_a_hole(
    log: &mut PartitionLog,
    disk: &SimDisk,
    before: (u64, &[&str]),
    hole: u64,
    after: (u64, &[&str]),
) {
    assert_eq!(served(log, disk, before.0), before.1);
    assert!(matches!(
        read(log, disk, hole, 10, 1000),
        Err(LogReadError::Unreadable { offset, .. }) if offset == Offset(hole)
    ));
    assert_eq!(served(log, disk, after.0), after.1, "read from {}", after.0);
}

/// The skipped damage a bad checksum at `byte` of segment 0 makes, holding offsets `from..to`.
fn checksum_skipped(byte: u64, from: u64, to: u64) -> SkippedDamage {
    SkippedDamage {
        segment: Offset(0),
        byte,
        damage: FrameDamage::Decode(DecodeError::BadChecksum),
        offsets: (Offset(from), Offset(to)),
    }
}

/// Opens the log and returns it with its recovery report; panics when the open fails.
fn reopened(disk: &SimDisk, config: PartitionLogConfig) -> (PartitionLog, RecoveryReport) {
    let (log, outputs) = open(disk, config);
    let [LogOutput::Opened(report)] = outputs.as_slice() else {
        panic!("{outputs:?}");
    };
    let report = report.clone();
    (log, report)
}

/// The payloads one read from `offset` serves (at most 10 records, 1000 bytes); panics on an error.
fn served(log: &mut PartitionLog, disk: &SimDisk, offset: u64) -> Vec<String> {
    payloads(&read(log, disk, offset, 10, 1000).unwrap())
}

fn next_io(log: &mut PartitionLog) -> IoRequest {
    match log.poll_output() {
        Some(LogOutput::Io(request)) => request,
        other => panic!("expected an io request, got {other:?}"),
    }
}

fn done(id: IoId, replies: Vec<IoReply>) -> LogInput {
    LogInput::Io(IoCompletion {
        id,
        result: Ok(replies),
    })
}

fn failed(id: IoId, index: usize, fault: IoFault) -> LogInput {
    LogInput::Io(IoCompletion {
        id,
        result: Err((index, fault)),
    })
}

/// Opens an empty log by hand (no disk), returning it ready.
fn ready_log_by_hand() -> PartitionLog {
    ready_by_hand(config())
}

fn ready_by_hand(config: PartitionLogConfig) -> PartitionLog {
    let mut log = PartitionLog::open(config);
    let list = next_io(&mut log);
    log.handle(
        NOW,
        done(list.id, vec![IoReply::Done, IoReply::Names(vec![])]),
    );
    let finalize = next_io(&mut log);
    log.handle(NOW, done(finalize.id, vec![IoReply::Done]));
    assert!(matches!(log.poll_output(), Some(LogOutput::Opened(_))));
    log
}

#[test]
fn opening_an_empty_directory_lists_it_syncs_it_and_reports_an_empty_log() {
    let mut log = PartitionLog::open(config());
    assert_eq!(log.status(), LogStatus::Opening);
    let list = next_io(&mut log);
    assert_eq!(
        list,
        IoRequest {
            id: IoId(0),
            lane: IoLane(0),
            ops: vec![
                IoOp::CreateDirAll { dir: DIR.into() },
                IoOp::List { dir: DIR.into() }
            ],
        }
    );
    log.handle(
        NOW,
        done(
            list.id,
            vec![IoReply::Done, IoReply::Names(vec!["hwm".into()])],
        ),
    );
    let finalize = next_io(&mut log);
    assert_eq!(finalize.ops, vec![IoOp::SyncDir { dir: DIR.into() }]);
    log.handle(NOW, done(finalize.id, vec![IoReply::Done]));
    assert_eq!(
        log.poll_output(),
        Some(LogOutput::Opened(RecoveryReport {
            segments: 0,
            oldest_offset: Offset(0),
            high_watermark: Offset(0),
            truncated_bytes: 0,
            damage: None,
            skipped: Vec::new(),
        }))
    );
    assert_eq!(log.status(), LogStatus::Ready);
}

#[test]
fn commit_durable_is_one_request_write_sync_then_read_back() {
    let mut log = ready_log_by_hand();
    log.handle(NOW, commit_request(1, &["a", "b"], 100));
    let request = next_io(&mut log);
    let mut expected_run = Vec::new();
    let views = [
        RecordView {
            key: None,
            committed_at_ms: 100,
            payload: b"a",
        },
        RecordView {
            key: None,
            committed_at_ms: 100,
            payload: b"b",
        },
    ];
    encode_frame(&mut expected_run, Offset(0), &views);
    let run_len = expected_run.len();
    assert_eq!(
        request.ops,
        vec![
            IoOp::Create { path: path(0) },
            IoOp::WriteAt {
                path: path(0),
                offset: 0,
                data: expected_run.clone()
            },
            IoOp::SyncData { path: path(0) },
            IoOp::SyncDir { dir: DIR.into() },
            IoOp::ReadAt {
                path: path(0),
                offset: 0,
                len: run_len
            },
        ]
    );
    assert_eq!(log.status(), LogStatus::Committing);
    assert_eq!(log.stats().next_offset, Offset(2));
    assert_eq!(log.high_watermark(), Offset(0), "invisible until verified");
    log.handle(
        NOW,
        done(
            request.id,
            vec![
                IoReply::Done,
                IoReply::Done,
                IoReply::Done,
                IoReply::Done,
                IoReply::Data(expected_run),
            ],
        ),
    );
    assert_eq!(
        log.poll_output(),
        Some(LogOutput::CommitDone {
            id: LogCommitId(1),
            result: Ok(CommittedRun {
                base: Offset(0),
                count: 2,
                committed_at_ms: 100
            }),
        })
    );
    assert_eq!(log.high_watermark(), Offset(2));
    // The segment's name is durable now: the next commit syncs no directory and creates no file.
    log.handle(NOW, commit_request(2, &["c"], 100));
    let second = next_io(&mut log);
    assert_eq!(second.ops.len(), 3);
    assert!(matches!(&second.ops[0], IoOp::WriteAt { offset, .. } if *offset == run_len as u64));
    assert_eq!(second.ops[1], IoOp::SyncData { path: path(0) });
}

#[test]
fn reads_serve_nothing_at_or_past_the_high_watermark_while_a_commit_is_in_flight() {
    let disk = SimDisk::new(1);
    let mut log = opened(&disk);
    let _ = commit(&mut log, &disk, 1, &["a"], 1);
    log.handle(NOW, commit_request(2, &["b"], 1));
    let in_flight = next_io(&mut log);
    assert_eq!(log.stats().next_offset, Offset(2));
    assert_eq!(
        read(&mut log, &disk, 1, 10, 1000),
        Err(LogReadError::AtOrPastHighWatermark {
            high_watermark: Offset(1)
        })
    );
    assert_eq!(served(&mut log, &disk, 0), ["a"]);
    drop(in_flight);
}

#[test]
fn a_read_back_mismatch_discards_the_run_and_truncates_before_the_next_commit() {
    let mut log = ready_log_by_hand();
    log.handle(NOW, commit_request(1, &["a"], 5));
    let request = next_io(&mut log);
    let IoOp::WriteAt { data, .. } = &request.ops[1] else {
        panic!()
    };
    let mut rotten = data.clone();
    let last = rotten.len() - 1;
    rotten[last] ^= 1;
    log.handle(
        NOW,
        done(
            request.id,
            vec![
                IoReply::Done,
                IoReply::Done,
                IoReply::Done,
                IoReply::Done,
                IoReply::Data(rotten),
            ],
        ),
    );
    assert_eq!(
        log.poll_output(),
        Some(LogOutput::CommitDone {
            id: LogCommitId(1),
            result: Err(CommitFault::ReadBackMismatch)
        })
    );
    let repair = next_io(&mut log);
    assert_eq!(
        repair.ops,
        vec![
            IoOp::SetLen {
                path: path(0),
                len: 0
            },
            IoOp::SyncData { path: path(0) }
        ]
    );
    assert_eq!(log.high_watermark(), Offset(0));
    assert_eq!(log.stats().next_offset, Offset(0));
    assert_eq!(log.status(), LogStatus::Repairing);
    log.handle(NOW, commit_request(2, &["b"], 5));
    assert_eq!(
        log.poll_output(),
        Some(LogOutput::CommitDone {
            id: LogCommitId(2),
            result: Err(CommitFault::NotReady(LogStatus::Repairing)),
        })
    );
    log.handle(NOW, done(repair.id, vec![IoReply::Done, IoReply::Done]));
    assert_eq!(log.status(), LogStatus::Ready);
    // The created file's name was never synced: the retry still syncs the directory, at offset 0.
    log.handle(NOW, commit_request(3, &["b"], 5));
    let retry = next_io(&mut log);
    assert!(matches!(&retry.ops[0], IoOp::WriteAt { offset: 0, .. }));
    assert!(retry.ops.contains(&IoOp::SyncDir { dir: DIR.into() }));
}

#[test]
fn a_failed_sync_is_never_retried_the_tail_is_truncated_and_synced_first() {
    let disk = SimDisk::new(2);
    let mut log = opened(&disk);
    let _ = commit(&mut log, &disk, 1, &["kept"], 1);
    let size = log.stats().size_bytes;
    disk.add_fault(FaultRule {
        path_prefix: DIR.into(),
        kind: DiskFault::SyncEio,
        chance_ppm: 1_000_000,
        remaining: Some(1),
    });
    log.handle(NOW, commit_request(2, &["lost"], 1));
    let request = next_io(&mut log);
    let completion = crate::disk::execute(&disk, &request);
    assert_eq!(completion.result, Err((1, IoFault::Eio)));
    log.handle(NOW, LogInput::Io(completion));
    assert_eq!(
        log.poll_output(),
        Some(LogOutput::CommitDone {
            id: LogCommitId(2),
            result: Err(CommitFault::Sync(IoFault::Eio))
        })
    );
    let repair = next_io(&mut log);
    assert_eq!(
        repair.ops,
        vec![
            IoOp::SetLen {
                path: path(0),
                len: size
            },
            IoOp::SyncData { path: path(0) }
        ]
    );
    log.handle(NOW, LogInput::Io(crate::disk::execute(&disk, &repair)));
    assert_eq!(
        disk.len(&path(0)).unwrap(),
        size,
        "the unknown tail is gone"
    );
    let outputs = commit(&mut log, &disk, 3, &["again"], 1);
    assert_eq!(
        outputs,
        [LogOutput::CommitDone {
            id: LogCommitId(3),
            result: Ok(CommittedRun {
                base: Offset(1),
                count: 1,
                committed_at_ms: 1
            }),
        }]
    );
    disk.crash();
    let (mut reopened, _) = open(&disk, config());
    assert_eq!(reopened.high_watermark(), Offset(2));
    assert_eq!(
        payloads(&read(&mut reopened, &disk, 0, 10, 1000).unwrap()),
        ["kept", "again"]
    );
}

#[test]
fn a_failed_repair_latches_the_log_until_a_retried_truncation_succeeds() {
    let mut log = ready_log_by_hand();
    log.handle(NOW, commit_request(1, &["a"], 1));
    let request = next_io(&mut log);
    log.handle(NOW, failed(request.id, 1, IoFault::NoSpace));
    assert_eq!(
        log.poll_output(),
        Some(LogOutput::CommitDone {
            id: LogCommitId(1),
            result: Err(CommitFault::Write(IoFault::NoSpace))
        })
    );
    let repair = next_io(&mut log);
    log.handle(NOW, failed(repair.id, 1, IoFault::Eio));
    assert_eq!(log.poll_output(), Some(LogOutput::Latched(IoFault::Eio)));
    assert_eq!(log.status(), LogStatus::Latched);
    assert_eq!(log.latched_fault(), Some(&IoFault::Eio));
    log.handle(NOW, commit_request(2, &["b"], 1));
    assert_eq!(
        log.poll_output(),
        Some(LogOutput::CommitDone {
            id: LogCommitId(2),
            result: Err(CommitFault::NotReady(LogStatus::Latched)),
        })
    );
    assert_eq!(log.poll_output(), None);
    // The retry cuts back to the same durable position; it never re-reads the tail.
    assert!(log.retry_repair());
    let retry = next_io(&mut log);
    assert_eq!(retry.ops, repair.ops);
    log.handle(NOW, done(retry.id, vec![IoReply::Done, IoReply::Done]));
    assert_eq!(log.status(), LogStatus::Ready);
    assert!(!log.retry_repair());
}

#[test]
fn a_failed_sync_at_the_end_of_recovery_forbids_reopening_in_this_process() {
    let mut log = PartitionLog::open(config());
    let list = next_io(&mut log);
    log.handle(
        NOW,
        done(list.id, vec![IoReply::Done, IoReply::Names(vec![])]),
    );
    let finalize = next_io(&mut log);
    log.handle(NOW, failed(finalize.id, 0, IoFault::Eio));
    let error = RecoveryError::Sync(IoFault::Eio);
    assert_eq!(
        log.poll_output(),
        Some(LogOutput::OpenFailed(error.clone()))
    );
    assert!(!error.reopen_allowed());
    assert!(RecoveryError::Io(IoFault::Eio).reopen_allowed());
}

#[test]
fn a_failed_create_needs_no_repair() {
    let mut log = ready_log_by_hand();
    log.handle(NOW, commit_request(1, &["a"], 1));
    let request = next_io(&mut log);
    log.handle(NOW, failed(request.id, 0, IoFault::NoSpace));
    assert_eq!(
        log.poll_output(),
        Some(LogOutput::CommitDone {
            id: LogCommitId(1),
            result: Err(CommitFault::Create(IoFault::NoSpace))
        })
    );
    assert_eq!(log.poll_output(), None);
    assert_eq!(log.status(), LogStatus::Ready);
    assert_eq!(log.stats().segments, 0);
}

#[test]
fn commit_times_never_go_backwards() {
    let disk = SimDisk::new(3);
    let mut log = opened(&disk);
    let first = commit(&mut log, &disk, 1, &["a"], 1_000);
    let second = commit(&mut log, &disk, 2, &["b"], 900);
    let third = commit(&mut log, &disk, 3, &["c"], 1_100);
    let times: Vec<u64> = [first, second, third]
        .iter()
        .map(|outputs| match outputs.as_slice() {
            [LogOutput::CommitDone {
                result: Ok(run), ..
            }] => run.committed_at_ms,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(times, [1_000, 1_000, 1_100]);
    let batch = read(&mut log, &disk, 0, 10, 1000).unwrap();
    let stored: Vec<u64> = batch.records.iter().map(|r| r.committed_at_ms).collect();
    assert_eq!(stored, [1_000, 1_000, 1_100]);
    // And across a restart the last commit time is recovered.
    let (mut reopened, _) = open(&disk, config());
    assert_eq!(reopened.last_committed_at_ms(), 1_100);
    let after = commit(&mut reopened, &disk, 4, &["d"], 5);
    assert!(matches!(
        after.as_slice(),
        [LogOutput::CommitDone {
            result: Ok(CommittedRun {
                committed_at_ms: 1_100,
                ..
            }),
            ..
        }]
    ));
}

fn frame_bytes(base: u64, payloads: &[&str], at_ms: u64) -> Vec<u8> {
    let views: Vec<RecordView<'_>> = payloads
        .iter()
        .map(|payload| RecordView {
            key: Some(b"k"),
            committed_at_ms: at_ms,
            payload: payload.as_bytes(),
        })
        .collect();
    let mut out = Vec::new();
    encode_frame(&mut out, Offset(base), &views);
    out
}
fn write_segment(disk: &SimDisk, base: u64, bytes: &[u8]) {
    disk.create_dir_all(DIR).unwrap();
    disk.create(&path(base)).unwrap();
    disk.write_at(&path(base), 0, bytes).unwrap();
    disk.sync_data(&path(base)).unwrap();
    disk.sync_dir(DIR).unwrap();
}
#[test]
fn a_commit_of_nothing_is_refused() {
    let mut log = ready_log_by_hand();
    log.handle(
        NOW,
        LogInput::Commit(CommitRequest {
            id: LogCommitId(1),
            records: vec![],
            committed_at_ms: 0,
        }),
    );
    assert_eq!(
        log.poll_output(),
        Some(LogOutput::CommitDone {
            id: LogCommitId(1),
            result: Err(CommitFault::Empty)
        })
    );
    assert_eq!(log.status(), LogStatus::Ready);
}

#[test]
fn a_run_is_cut_into_frames_of_about_the_target_size() {
    let disk = SimDisk::new(14);
    let config = PartitionLogConfig {
        frame_records_bytes_target: 40,
        segment_bytes_max: 1 << 20,
        ..config()
    };
    let (mut log, _) = open(&disk, config);
    // Each record frames to 16 bytes: two per frame under a 40-byte target.
    let _ = commit(&mut log, &disk, 1, &["r0", "r1", "r2", "r3", "r4"], 1);
    let image = disk.read_at(&path(0), 0, 10_000).unwrap();
    let scan = scan_segment(Offset(0), &image, 1);
    assert_eq!(scan.index.len(), 3, "three frames");
    assert_eq!(scan.end_offset, Offset(5));
    assert_eq!(
        payloads(&read(&mut log, &disk, 3, 10, 10_000).unwrap()),
        ["r3", "r4"]
    );
}

#[test]
fn too_many_reads_in_flight_are_refused() {
    let disk = SimDisk::new(15);
    let config = PartitionLogConfig {
        reads_in_flight_max: 1,
        ..config()
    };
    let (mut log, _) = open(&disk, config);
    let _ = commit(&mut log, &disk, 1, &["a"], 1);
    let request = |id| {
        LogInput::Read(ReadRequest {
            id: LogReadId(id),
            offset: Offset(0),
            records_max: 1,
            bytes_max: 1,
        })
    };
    log.handle(NOW, request(1));
    let _first = next_io(&mut log);
    log.handle(NOW, request(2));
    assert_eq!(
        log.poll_output(),
        Some(LogOutput::ReadDone {
            id: LogReadId(2),
            result: Err(LogReadError::Busy)
        })
    );
    assert_eq!(log.take_pending_reads(), [LogReadId(1)]);
    assert_eq!(log.reads_in_flight(), 0);
}
