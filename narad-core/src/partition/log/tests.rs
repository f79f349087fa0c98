//! Unit tests of the partition log: one rule per test, exact outputs.

use super::*;
use crate::codec::partition::{encode_frame, RecordView};
use crate::disk::sim::{FaultKind, FaultRule, SimDisk};
use crate::disk::{Disk, IoReply};
use crate::partition::driver::{run_to_idle, NoHook};
use crate::partition::segment::scan_segment;

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
) -> Result<ReadBatch, ReadError> {
    log.handle(
        NOW,
        LogInput::Read(ReadRequest {
            id: ReadId(offset),
            offset: Offset(offset),
            records_max,
            bytes_max,
        }),
    );
    let outputs = run_to_idle(log, NOW, disk, &mut NoHook).unwrap();
    match outputs.as_slice() {
        [LogOutput::ReadDone { id, result }] => {
            assert_eq!(*id, ReadId(offset));
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
        Err(ReadError::Unreadable { offset, .. }) if offset == Offset(hole)
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
        Err(ReadError::AtOrPastHighWatermark {
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
        kind: FaultKind::SyncEio,
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

#[test]
fn a_run_that_would_pass_the_segment_limit_rolls_to_a_new_segment_named_by_its_base() {
    let disk = SimDisk::new(4);
    let mut log = opened(&disk);
    let big = "x".repeat(600);
    let _ = commit(&mut log, &disk, 1, &[&big], 1);
    log.handle(NOW, commit_request(2, &[&big], 1));
    let request = next_io(&mut log);
    assert_eq!(request.ops[0], IoOp::Create { path: path(1) });
    assert!(request.ops.contains(&IoOp::SyncDir { dir: DIR.into() }));
    log.handle(NOW, LogInput::Io(crate::disk::execute(&disk, &request)));
    let _ = run_to_idle(&mut log, NOW, &disk, &mut NoHook).unwrap();
    let stats = log.stats();
    assert_eq!(
        (stats.segments, stats.oldest_offset, stats.high_watermark),
        (2, Offset(0), Offset(2))
    );
    assert_eq!(
        disk.list(DIR).unwrap(),
        [segment_name(Offset(0)), segment_name(Offset(1))]
    );
    assert_eq!(
        payloads(&read(&mut log, &disk, 1, 10, 10_000).unwrap()),
        std::slice::from_ref(&big)
    );
    // A run larger than a whole segment still goes into one (fresh) segment, in one write.
    let huge = "y".repeat(3000);
    let outputs = commit(&mut log, &disk, 3, &[&huge], 1);
    assert!(matches!(
        outputs.as_slice(),
        [LogOutput::CommitDone { result: Ok(_), .. }]
    ));
    assert_eq!(log.stats().segments, 3);
}

#[test]
fn reads_below_the_oldest_segment_and_past_the_high_watermark_need_no_io() {
    let disk = SimDisk::new(5);
    let mut log = opened(&disk);
    assert_eq!(
        read(&mut log, &disk, 0, 1, 100),
        Err(ReadError::AtOrPastHighWatermark {
            high_watermark: Offset(0)
        })
    );
    let _ = commit(&mut log, &disk, 1, &["a"], 1);
    assert_eq!(
        read(&mut log, &disk, 1, 1, 100),
        Err(ReadError::AtOrPastHighWatermark {
            high_watermark: Offset(1)
        })
    );
    // Retention (done by the node) removed the first segment: offsets below the next are gone.
    let big = "z".repeat(1200);
    let _ = commit(&mut log, &disk, 2, &[&big], 1);
    log.segments.remove(&Offset(0));
    assert_eq!(
        read(&mut log, &disk, 0, 1, 100),
        Err(ReadError::BelowOldestRetained { oldest: Offset(1) })
    );
}

#[test]
fn reads_respect_records_max_and_bytes_max_but_return_at_least_one_record() {
    let disk = SimDisk::new(6);
    let mut log = opened(&disk);
    let all: Vec<String> = (0..10).map(|id| format!("r{id}")).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let _ = commit(&mut log, &disk, 1, &all, 1);
    let batch = read(&mut log, &disk, 3, 4, 10_000).unwrap();
    assert_eq!(batch.first, Offset(3));
    assert_eq!(payloads(&batch), ["r3", "r4", "r5", "r6"]);
    assert_eq!(batch.high_watermark, Offset(10));
    // Each record frames to 4 + 1 + 1 + 8 + 2 = 16 bytes: 20 bytes means one, then one more.
    assert_eq!(
        payloads(&read(&mut log, &disk, 7, 10, 20).unwrap()),
        ["r7", "r8"]
    );
    assert_eq!(payloads(&read(&mut log, &disk, 9, 10, 1).unwrap()), ["r9"]);
    assert_eq!(payloads(&read(&mut log, &disk, 0, 0, 1).unwrap()), ["r0"]);
}

#[test]
fn the_sparse_index_starts_reads_near_their_offset() {
    let disk = SimDisk::new(7);
    let mut log = opened(&disk);
    for id in 0..30u64 {
        let payload = format!("{id:0>10}");
        let _ = commit(&mut log, &disk, id, &[payload.as_str()], 1);
    }
    // Frames are 27 + 24 = 51 bytes; 20 fit in the 1,024-byte segment, and an entry every 64 bytes
    // means every second frame.
    assert_eq!(log.stats().segments, 2);
    let segment = &log.segments[&Offset(0)];
    assert_eq!(segment.index.len(), 10);
    assert_eq!(segment.index.position_for(Offset(9)), 8 * 51);
    log.handle(
        NOW,
        LogInput::Read(ReadRequest {
            id: ReadId(1),
            offset: Offset(9),
            records_max: 1,
            bytes_max: 1,
        }),
    );
    let request = next_io(&mut log);
    assert_eq!(request.lane, IoLane(1));
    assert!(matches!(&request.ops[0], IoOp::ReadAt { offset, .. } if *offset == 8 * 51));
    log.handle(NOW, LogInput::Io(crate::disk::execute(&disk, &request)));
    match log.poll_output() {
        Some(LogOutput::ReadDone {
            result: Ok(batch), ..
        }) => assert_eq!(payloads(&batch), ["0000000009"]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_frame_larger_than_the_first_read_is_fetched_whole_by_a_second_read() {
    let disk = SimDisk::new(8);
    let config = PartitionLogConfig {
        segment_bytes_max: 1 << 20,
        ..config()
    };
    let (mut log, _) = open(&disk, config);
    let big = "q".repeat(5000);
    let _ = commit(&mut log, &disk, 1, &["small", &big], 1);
    log.handle(
        NOW,
        LogInput::Read(ReadRequest {
            id: ReadId(1),
            offset: Offset(1),
            records_max: 1,
            bytes_max: 10,
        }),
    );
    let first = next_io(&mut log);
    log.handle(NOW, LogInput::Io(crate::disk::execute(&disk, &first)));
    let second = next_io(&mut log);
    let frame_len = 27 + (4 + 1 + 1 + 8 + 5) + (4 + 1 + 1 + 8 + 5000);
    assert!(matches!(&second.ops[0], IoOp::ReadAt { offset: 0, len, .. } if *len == frame_len));
    log.handle(NOW, LogInput::Io(crate::disk::execute(&disk, &second)));
    match log.poll_output() {
        Some(LogOutput::ReadDone {
            result: Ok(batch), ..
        }) => assert_eq!(payloads(&batch), [big]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_rotten_frame_below_the_high_watermark_is_never_served() {
    let disk = SimDisk::new(9);
    let mut log = opened(&disk);
    let _ = commit(&mut log, &disk, 1, &["good"], 1);
    let _ = commit(&mut log, &disk, 2, &["rots"], 1);
    let size = log.stats().size_bytes;
    assert!(disk.rot(&path(0), size - 1, 0));
    assert_eq!(
        payloads(&read(&mut log, &disk, 0, 1, 100).unwrap()),
        ["good"]
    );
    assert_eq!(
        read(&mut log, &disk, 1, 1, 100),
        Err(ReadError::Unreadable {
            offset: Offset(1),
            reason: ReadFault::Damaged(DecodeError::BadChecksum)
        })
    );
}

#[test]
fn a_rotten_header_between_the_index_entry_and_the_wanted_offset_does_not_hide_the_frames_behind_it(
) {
    let disk = SimDisk::new(9);
    let mut log = opened(&disk);
    let _ = commit(&mut log, &disk, 1, &["good"], 1);
    let second_frame_at = log.stats().size_bytes;
    let _ = commit(&mut log, &disk, 2, &["rots"], 1);
    let _ = commit(&mut log, &disk, 3, &["after"], 1);
    // The second frame's magic rots: the walk from the index entry at byte 0 cannot read its length.
    assert!(disk.rot(&path(0), second_frame_at, 0));
    assert_eq!(
        payloads(&read(&mut log, &disk, 2, 1, 100).unwrap()),
        ["after"]
    );
    assert_eq!(
        read(&mut log, &disk, 1, 1, 100),
        Err(ReadError::Unreadable {
            offset: Offset(1),
            reason: ReadFault::Damaged(DecodeError::BadMagic)
        })
    );
    // A read that verified records before the damage serves them instead of failing whole.
    assert_eq!(
        payloads(&read(&mut log, &disk, 0, 10, 10_000).unwrap()),
        ["good"]
    );
}

#[test]
fn a_reopen_after_a_failed_recovery_sync_truncates_the_durable_tail_the_page_cache_no_longer_shows()
{
    let disk = SimDisk::new(11);
    let mut log = opened(&disk);
    let _ = commit(&mut log, &disk, 1, &["kept"], 1);
    let verified = log.stats().size_bytes;
    // A crash left a durable tail of garbage behind the verified frames.
    disk.write_at(&path(0), verified, &[0xAB; 40]).unwrap();
    disk.sync_data(&path(0)).unwrap();
    // The first recovery truncates it, but its sync fails: the truncate is dropped (fsyncgate)
    // while the page cache shows the short file.
    disk.add_fault(FaultRule {
        path_prefix: path(0),
        kind: FaultKind::SyncEio,
        chance_ppm: 1_000_000,
        remaining: Some(1),
    });
    let (_, outputs) = open(&disk, config());
    assert!(
        matches!(
            outputs.as_slice(),
            [LogOutput::OpenFailed(RecoveryError::Sync(_))]
        ),
        "{outputs:?}"
    );
    // A process restart (the cache survives) opens cleanly, and must make the disk agree with it.
    let (_, outputs) = open(&disk, config());
    assert!(
        matches!(outputs.as_slice(), [LogOutput::Opened(report)] if report.truncated_bytes == 0),
        "{outputs:?}"
    );
    assert_eq!(disk.durable_image(&path(0)).unwrap().len() as u64, verified);
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
fn recovery_takes_the_high_watermark_from_the_verified_prefix_and_truncates_the_tail() {
    let disk = SimDisk::new(10);
    let mut sealed = frame_bytes(0, &["a", "b"], 7);
    sealed.extend(frame_bytes(2, &["c"], 8));
    write_segment(&disk, 0, &sealed);
    let mut last = frame_bytes(3, &["d"], 9);
    let good = last.len() as u64;
    let mut torn = frame_bytes(4, &["e"], 9);
    torn.truncate(10);
    last.extend(torn);
    write_segment(&disk, 3, &last);
    disk.create(&format!("{DIR}/hwm")).unwrap();
    let (mut log, outputs) = open(&disk, config());
    assert_eq!(
        outputs,
        [LogOutput::Opened(RecoveryReport {
            segments: 2,
            oldest_offset: Offset(0),
            high_watermark: Offset(4),
            truncated_bytes: 10,
            damage: Some((Offset(3), good, FrameDamage::Decode(DecodeError::Truncated))),
            skipped: Vec::new(),
        })]
    );
    assert_eq!(disk.len(&path(3)).unwrap(), good);
    assert_eq!(
        disk.durable_image(&path(3)).unwrap().len() as u64,
        good,
        "the truncation is synced"
    );
    assert_eq!(log.last_committed_at_ms(), 9);
    let batch = read(&mut log, &disk, 0, 10, 10_000).unwrap();
    assert_eq!(
        payloads(&batch),
        ["a", "b", "c"],
        "a read stops at its segment's end"
    );
    assert_eq!(batch.records[0].key.as_deref(), Some(&b"k"[..]));
    let outputs = commit(&mut log, &disk, 1, &["e"], 1);
    assert!(matches!(
        outputs.as_slice(),
        [LogOutput::CommitDone {
            result: Ok(CommittedRun {
                base: Offset(4),
                count: 1,
                committed_at_ms: 9
            }),
            ..
        }]
    ));
}

#[test]
fn recovery_skips_damage_at_the_end_of_a_sealed_segment_up_to_the_next_segment() {
    // The next segment's name proves the rotten last frame held offset 1 only: one hole, reported,
    // and the partition stays open.
    let disk = SimDisk::new(11);
    let mut sealed = frame_bytes(0, &["a"], 1);
    let first = sealed.len() as u64;
    sealed.extend(frame_bytes(1, &["b"], 1));
    write_segment(&disk, 0, &sealed);
    write_segment(&disk, 2, &frame_bytes(2, &["c"], 1));
    let image = disk.durable_image(&path(0)).unwrap();
    assert!(disk.rot(&path(0), first + 30, 3));
    let (mut log, report) = reopened(&disk, config());
    assert_eq!(report.high_watermark, Offset(3));
    assert_eq!(report.skipped, [checksum_skipped(first, 1, 2)]);
    assert_eq!(
        disk.durable_image(&path(0)).unwrap().len(),
        image.len(),
        "a sealed segment is never truncated"
    );
    assert_reads_around_a_hole(&mut log, &disk, (0, &["a"]), 1, (2, &["c"]));
}

#[test]
fn recovery_refuses_a_damaged_sealed_segment_that_overlaps_the_next() {
    let disk = SimDisk::new(23);
    let second = write_three_frames(&disk, 0, [1, 1, 1]);
    write_segment(&disk, 1, &frame_bytes(1, &["x"], 2));
    let third = second * 2;
    assert!(disk.rot(&path(0), third + 30, 3));
    let (log, outputs) = open(&disk, config());
    let error = RecoveryError::Corrupt {
        segment: Offset(0),
        byte: third,
        damage: FrameDamage::Decode(DecodeError::BadChecksum),
    };
    assert_eq!(outputs, [LogOutput::OpenFailed(error.clone())]);
    assert_eq!(log.status(), LogStatus::OpenFailed);
    assert_eq!(log.open_error(), Some(&error));
}

#[test]
fn recovery_skips_damage_with_frames_behind_it_inside_a_sealed_segment() {
    // Damage skipped while its segment was the last stays in it once the segment is sealed.
    let disk = SimDisk::new(19);
    let first = write_three_frames(&disk, 0, [1, 1, 1]);
    write_segment(&disk, 3, &frame_bytes(3, &["d"], 2));
    assert!(disk.rot(&path(0), first + 30, 3));
    let (mut log, report) = reopened(&disk, config());
    assert_eq!(report.high_watermark, Offset(4));
    assert_eq!(report.skipped, [checksum_skipped(first, 1, 2)]);
    assert!(matches!(
        read(&mut log, &disk, 1, 10, 1000),
        Err(ReadError::Unreadable { .. })
    ));
    assert_eq!(served(&mut log, &disk, 2), ["c"]);
    assert_eq!(served(&mut log, &disk, 3), ["d"]);
}

#[test]
fn a_read_never_numbers_records_across_skipped_damage() {
    // Rot of a header's base offset (9 -> 1): the frame still claims its true length, and the first
    // frame behind it continues at offset 10, not 9.
    let disk = SimDisk::new(20);
    let second = write_three_frames(&disk, 8, [1, 2, 3]);
    assert!(disk.rot(&path(8), second + 14, 3));
    let (mut log, report) = reopened(&disk, config());
    assert_eq!(report.skipped[0].offsets, (Offset(9), Offset(10)));
    assert_eq!(served(&mut log, &disk, 8), ["a"]);
    assert_eq!(
        read(&mut log, &disk, 9, 10, 1000),
        Err(ReadError::Unreadable {
            offset: Offset(9),
            reason: ReadFault::Skipped
        })
    );
    assert_eq!(served(&mut log, &disk, 10), ["c"]);
}

/// A running log with one index entry (every read walks from the first frame) holding "a" at time 1,
/// then each of `runs` committed at times 2, 3, ...; returns it and where the frame behind "a" starts.
fn running_log_of(disk: &SimDisk, runs: &[&[&str]]) -> (PartitionLog, u64) {
    let config = PartitionLogConfig {
        index_interval_bytes: 1 << 20,
        ..config()
    };
    let (mut log, _) = open(disk, config);
    let _ = commit(&mut log, disk, 1, &["a"], 1);
    let second = disk.durable_image(&path(0)).unwrap().len() as u64;
    for (index, run) in runs.iter().enumerate() {
        let at = index as u64 + 2;
        let _ = commit(&mut log, disk, at, run, at);
    }
    (log, second)
}

#[test]
fn a_running_log_serves_the_frames_behind_a_header_whose_base_offset_or_count_rotted() {
    // Rot of a verified frame's header while the log runs: its base offset (byte 14, 1 -> 17) or its
    // record count (byte 6, 1 -> 5, with a record section long enough for five records, so the
    // header still decodes). Either way the walk from the index must not take offsets 2.. for
    // records of the damaged frame, nor skip the frames behind it.
    let long_b = "b".repeat(200);
    for (seed, b, at, bit) in [(21, "b", 14, 4), (24, long_b.as_str(), 6, 2)] {
        let disk = SimDisk::new(seed);
        let (mut log, second) = running_log_of(&disk, &[&[b], &["c"], &["d"]]);
        assert!(disk.rot(&path(0), second + at, bit));
        assert_reads_around_a_hole(&mut log, &disk, (0, &["a"]), 1, (2, &["c", "d"]));
        assert_eq!(served(&mut log, &disk, 3), ["d"]);
    }
}

#[test]
fn a_running_log_serves_the_frame_behind_a_frame_whose_record_count_rotted_downwards() {
    // One run of "b", "c", "d" in one frame whose count rots 3 -> 1: walking by that header, the next
    // frame (offset 4) does not continue at offset 2, yet it is whole and must be served.
    let disk = SimDisk::new(25);
    let (mut log, second) = running_log_of(&disk, &[&["b", "c", "d"], &["e"]]);
    assert!(disk.rot(&path(0), second + 6, 1));
    assert_reads_around_a_hole(&mut log, &disk, (0, &["a"]), 2, (4, &["e"]));
}

#[test]
fn recovery_skips_a_rotten_frame_of_the_last_segment_and_keeps_the_acknowledged_frames_behind_it() {
    let disk = SimDisk::new(14);
    let mut log = opened(&disk);
    let mut first = 0;
    for (id, payload) in [(1, "a"), (2, "b"), (3, "c"), (4, "d")] {
        let outputs = commit(&mut log, &disk, id, &[payload], id);
        assert!(matches!(
            outputs.as_slice(),
            [LogOutput::CommitDone { result: Ok(_), .. }]
        ));
        if id == 1 {
            first = disk.durable_image(&path(0)).unwrap().len() as u64;
        }
    }
    let image_len = disk.durable_image(&path(0)).unwrap().len();
    // Rot in the second frame: "a" before it and the acknowledged "c" and "d" behind it, committed at
    // two later times, are intact: a failed run could not have left them.
    assert!(disk.rot(&path(0), first + 30, 3));
    let (mut log, outputs) = open(&disk, config());
    assert_eq!(
        outputs,
        [LogOutput::Opened(RecoveryReport {
            segments: 1,
            oldest_offset: Offset(0),
            high_watermark: Offset(4),
            truncated_bytes: 0,
            damage: None,
            skipped: vec![checksum_skipped(first, 1, 2)],
        })]
    );
    assert_eq!(
        disk.durable_image(&path(0)).unwrap().len(),
        image_len,
        "nothing is truncated"
    );
    assert_eq!(payloads(&read(&mut log, &disk, 0, 1, 1000).unwrap()), ["a"]);
    assert_eq!(
        read(&mut log, &disk, 1, 10, 1000),
        Err(ReadError::Unreadable {
            offset: Offset(1),
            reason: ReadFault::Damaged(DecodeError::BadChecksum)
        })
    );
    assert_eq!(served(&mut log, &disk, 2), ["c", "d"]);
    let outputs = commit(&mut log, &disk, 5, &["e"], 5);
    assert!(matches!(
        outputs.as_slice(),
        [LogOutput::CommitDone {
            result: Ok(CommittedRun {
                base: Offset(4),
                ..
            }),
            ..
        }]
    ));
}

#[test]
fn recovery_keeps_one_acknowledged_commit_behind_rot_of_the_frame_before_it() {
    let disk = SimDisk::new(15);
    let mut log = opened(&disk);
    let _ = commit(&mut log, &disk, 1, &["a"], 1);
    let first = disk.durable_image(&path(0)).unwrap().len() as u64;
    let _ = commit(&mut log, &disk, 2, &["b"], 2);
    // "c" was acknowledged. Behind the rot it looks like a failed commit's leftovers (one commit
    // time), yet only keeping it is safe.
    let _ = commit(&mut log, &disk, 3, &["c"], 3);
    let total = disk.durable_image(&path(0)).unwrap().len();
    assert!(disk.rot(&path(0), first + 30, 3));
    let (mut log, report) = reopened(&disk, config());
    assert_eq!(
        (report.high_watermark, report.truncated_bytes, report.damage),
        (Offset(3), 0, None)
    );
    assert_eq!(report.skipped[0].offsets, (Offset(1), Offset(2)));
    assert_eq!(disk.durable_image(&path(0)).unwrap().len(), total);
    assert_eq!(served(&mut log, &disk, 2), ["c"]);
}

/// A frame per record, so one run of several records is as many frames of one commit time.
fn one_record_frames() -> PartitionLogConfig {
    PartitionLogConfig {
        frame_records_bytes_target: 1,
        ..config()
    }
}

/// Commits "a" at time 1, then one run of "b", "c", "d" at time 2, a frame each (41 bytes); returns
/// where the run starts.
fn a_then_a_run_of_three_frames(disk: &SimDisk) -> u64 {
    let (mut log, _) = open(disk, one_record_frames());
    let _ = commit(&mut log, disk, 1, &["a"], 1);
    let run_start = disk.durable_image(&path(0)).unwrap().len() as u64;
    let _ = commit(&mut log, disk, 2, &["b", "c", "d"], 2);
    run_start
}

#[test]
fn recovery_keeps_the_frames_behind_rot_inside_the_last_run() {
    let disk = SimDisk::new(16);
    let first = a_then_a_run_of_three_frames(&disk);
    // Inside the record section of the frame of "b".
    assert!(disk.rot(&path(0), first + 30, 0));
    let (mut log, report) = reopened(&disk, one_record_frames());
    assert_eq!(report.high_watermark, Offset(4), "{report:?}");
    assert_eq!(report.truncated_bytes, 0);
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].offsets, (Offset(1), Offset(2)));
    assert_eq!(served(&mut log, &disk, 2), ["c", "d"]);
}

/// Records where every write of the requests it sees starts.
#[derive(Default)]
struct WriteOffsets(Vec<u64>);

impl crate::partition::driver::IoHook for WriteOffsets {
    fn before_op(
        &mut self,
        _disk: &dyn Disk,
        request: &crate::disk::IoRequest,
        index: usize,
    ) -> crate::partition::driver::HookVerdict {
        if let IoOp::WriteAt { offset, .. } = &request.ops[index] {
            self.0.push(*offset);
        }
        crate::partition::driver::HookVerdict::Run
    }
}

#[test]
fn recovery_rewrites_a_last_run_that_spans_skipped_damage_from_its_start() {
    // The frames of the run of "b", "c", "d" may be a failed commit's, marked clean by a failed fsync:
    // recovery re-dirties all of them, not only those behind the damage, before syncing.
    let disk = SimDisk::new(22);
    let run_start = a_then_a_run_of_three_frames(&disk);
    // Inside the frame of "c".
    assert!(disk.rot(&path(0), run_start + 41 + 30, 0));
    let mut log = PartitionLog::open(one_record_frames());
    let mut writes = WriteOffsets::default();
    let outputs = run_to_idle(&mut log, NOW, &disk, &mut writes).unwrap();
    let [LogOutput::Opened(report)] = outputs.as_slice() else {
        panic!("{outputs:?}");
    };
    assert_eq!(report.skipped[0].offsets, (Offset(2), Offset(3)));
    assert_eq!(
        writes.0,
        [run_start],
        "one rewrite, from the run's first frame"
    );
}

/// Commits "a" at offset 0, then returns where the next frame goes and a frame at offset 1 whose one
/// payload holds a well-formed frame at `embedded_base` between `head` and `tail` (a payload is anything
/// a producer sent).
fn a_then_a_frame_embedding_a_frame(
    disk: &SimDisk,
    embedded_base: u64,
    head: &[u8],
    tail: &[u8],
) -> (u64, Vec<u8>) {
    let mut log = opened(disk);
    let _ = commit(&mut log, disk, 1, &["a"], 1);
    let next = disk.durable_image(&path(0)).unwrap().len() as u64;
    let embedded = frame_bytes(embedded_base, &["forged"], 2);
    let body = [head, &embedded[..], tail].concat();
    let record = RecordView {
        key: None,
        committed_at_ms: 2,
        payload: &body,
    };
    let mut outer = Vec::new();
    encode_frame(&mut outer, Offset(1), &[record]);
    (next, outer)
}

#[test]
fn recovery_truncates_a_torn_append_without_adopting_a_frame_inside_its_payload() {
    let disk = SimDisk::new(17);
    // The embedded frame continues the log's offsets; a crash kept a prefix of the append that holds
    // the embedded frame whole, the outer one not.
    let (good, outer) = a_then_a_frame_embedding_a_frame(&disk, 1, b"head", &[b'z'; 200]);
    let torn = &outer[..outer.len() - 100];
    disk.write_at(&path(0), good, torn).unwrap();
    disk.sync_data(&path(0)).unwrap();
    let (log, report) = reopened(&disk, config());
    assert_eq!(report.high_watermark, Offset(1), "{report:?}");
    assert_eq!(report.truncated_bytes, torn.len() as u64);
    assert!(report.skipped.is_empty());
    assert_eq!(log.high_watermark(), Offset(1));
}

#[test]
fn recovery_resumes_behind_a_rotten_frame_at_its_end_not_at_a_frame_inside_its_payload() {
    let disk = SimDisk::new(18);
    // The payload of the frame that rots holds a well-formed frame with later offsets.
    let (first, outer) = a_then_a_frame_embedding_a_frame(&disk, 50, b"head", b"tail");
    disk.write_at(&path(0), first, &outer).unwrap();
    let second = first + outer.len() as u64;
    disk.write_at(&path(0), second, &frame_bytes(2, &["c"], 3))
        .unwrap();
    disk.sync_data(&path(0)).unwrap();
    // Rot in the first bytes of the payload, ahead of the embedded frame.
    assert!(disk.rot(&path(0), first + FRAME_HEADER_BYTES as u64 + 12, 1));
    let (mut log, report) = reopened(&disk, config());
    assert_eq!(report.high_watermark, Offset(3), "{report:?}");
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(report.skipped[0].offsets, (Offset(1), Offset(2)));
    assert_eq!(served(&mut log, &disk, 2), ["c"]);
}

#[test]
fn recovery_refuses_segments_that_do_not_continue_each_other() {
    let disk = SimDisk::new(12);
    write_segment(&disk, 0, &frame_bytes(0, &["a"], 1));
    write_segment(&disk, 5, &frame_bytes(5, &["b"], 1));
    let (_, outputs) = open(&disk, config());
    assert_eq!(
        outputs,
        [LogOutput::OpenFailed(RecoveryError::Discontiguous {
            segment: Offset(5),
            expected: Offset(1)
        })]
    );
}

#[test]
fn recovery_syncs_the_last_segment_so_page_cache_leftovers_become_durable_before_visible() {
    let disk = SimDisk::new(13);
    disk.create_dir_all(DIR).unwrap();
    disk.create(&path(0)).unwrap();
    // Written by a process that died before its sync: still in the page cache, not durable.
    disk.write_at(&path(0), 0, &frame_bytes(0, &["a"], 1))
        .unwrap();
    let (log, outputs) = open(&disk, config());
    assert!(
        matches!(outputs.as_slice(), [LogOutput::Opened(report)] if report.high_watermark == Offset(1))
    );
    assert_eq!(
        disk.durable_image(&path(0)).unwrap().len(),
        frame_bytes(0, &["a"], 1).len()
    );
    assert_eq!(log.high_watermark(), Offset(1));
}

#[test]
fn an_io_failure_during_recovery_fails_the_open() {
    let mut log = PartitionLog::open(config());
    let list = next_io(&mut log);
    log.handle(NOW, failed(list.id, 1, IoFault::Eio));
    assert_eq!(
        log.poll_output(),
        Some(LogOutput::OpenFailed(RecoveryError::Io(IoFault::Eio)))
    );
    log.handle(
        NOW,
        LogInput::Read(ReadRequest {
            id: ReadId(1),
            offset: Offset(0),
            records_max: 1,
            bytes_max: 1,
        }),
    );
    assert_eq!(
        log.poll_output(),
        Some(LogOutput::ReadDone {
            id: ReadId(1),
            result: Err(ReadError::NotOpen)
        })
    );
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
            id: ReadId(id),
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
            id: ReadId(2),
            result: Err(ReadError::Busy)
        })
    );
    assert_eq!(log.take_pending_reads(), [ReadId(1)]);
    assert_eq!(log.reads_in_flight(), 0);
}

/// Zero fill on: 256 bytes ahead (an eighth of a 2 KiB segment would allow 256 too).
fn filling() -> PartitionLogConfig {
    PartitionLogConfig {
        segment_bytes_max: 2048,
        preallocate_bytes: 256,
        ..config()
    }
}

/// Bytes of a one-record keyless frame: what a commit of one payload writes.
fn keyless_frame_len(payload: &str) -> u64 {
    let record = RecordView {
        key: None,
        committed_at_ms: 1,
        payload: payload.as_bytes(),
    };
    let mut out = Vec::new();
    encode_frame(&mut out, Offset(0), &[record]);
    out.len() as u64
}

fn fill_ops(request: &IoRequest) -> Vec<(u64, u64)> {
    request
        .ops
        .iter()
        .filter_map(|op| match op {
            IoOp::WriteZeros { offset, len, .. } => Some((*offset, *len)),
            _ => None,
        })
        .collect()
}

/// Commits `payloads` as one run and returns the fills its request made.
fn commit_filling(
    log: &mut PartitionLog,
    disk: &SimDisk,
    id: u64,
    payloads: &[&str],
) -> Vec<(u64, u64)> {
    log.handle(NOW, commit_request(id, payloads, 1));
    let request = next_io(log);
    let fills = fill_ops(&request);
    log.handle(NOW, LogInput::Io(crate::disk::execute(disk, &request)));
    let outputs = run_to_idle(log, NOW, disk, &mut NoHook).unwrap();
    assert!(
        matches!(
            outputs.as_slice(),
            [LogOutput::CommitDone { result: Ok(_), .. }]
        ),
        "{outputs:?}"
    );
    fills
}

/// A filling log whose first commit (`"a"`, `run` bytes) filled 256 bytes behind it: `(disk, log, run)`.
fn filled_once(seed: u64) -> (SimDisk, PartitionLog, u64) {
    let disk = SimDisk::new(seed);
    let (mut log, _) = reopened(&disk, filling());
    let run = keyless_frame_len("a");
    assert_eq!(commit_filling(&mut log, &disk, 1, &["a"]), [(run, 256)]);
    (disk, log, run)
}

#[test]
fn a_commit_that_ends_past_the_zero_fill_extends_it_and_the_commits_inside_it_write_only_frames() {
    let (disk, mut log, run) = filled_once(41);
    assert_eq!(disk.len(&path(0)).unwrap(), run + 256);
    let mut end = run;
    let mut id = 2;
    // Commits inside the fill write their frames over the zeros, and nothing else.
    while end + run <= run + 256 {
        assert_eq!(commit_filling(&mut log, &disk, id, &["b"]), []);
        end += run;
        id += 1;
    }
    assert_eq!(
        disk.len(&path(0)).unwrap(),
        run + 256,
        "the fill is not extended yet"
    );
    // The first one past it fills again, from its own end.
    assert_eq!(
        commit_filling(&mut log, &disk, id, &["c"]),
        [(end + run, 256)]
    );
    assert_eq!(disk.len(&path(0)).unwrap(), end + run + 256);
    assert_eq!(
        disk.durable_image(&path(0)).unwrap().len() as u64,
        end + run + 256,
        "in the commit's fsync"
    );
    assert_eq!(log.stats().size_bytes, end + run);
    assert_eq!(served(&mut log, &disk, 0)[..2], ["a", "b"]);
}

#[test]
fn the_fill_stops_at_the_segment_limit_and_a_roll_trims_it_off_the_sealed_segment() {
    let disk = SimDisk::new(42);
    let (mut log, _) = reopened(&disk, filling());
    let big = "x".repeat(1900);
    let fills = commit_filling(&mut log, &disk, 1, &[&big]);
    let first = log.stats().size_bytes;
    assert_eq!(
        fills,
        [(first, 2048 - first)],
        "never past segment_bytes_max"
    );
    log.handle(NOW, commit_request(2, &[&big], 1));
    let request = next_io(&mut log);
    assert_eq!(
        request.ops[..2],
        [
            IoOp::SetLen {
                path: path(0),
                len: first
            },
            IoOp::Create { path: path(1) },
        ]
    );
    log.handle(NOW, LogInput::Io(crate::disk::execute(&disk, &request)));
    let _ = run_to_idle(&mut log, NOW, &disk, &mut NoHook).unwrap();
    assert_eq!(
        disk.len(&path(0)).unwrap(),
        first,
        "the sealed segment ends at its frames"
    );
    assert_eq!(log.stats().segments, 2);
    assert_eq!(served(&mut log, &disk, 1), std::slice::from_ref(&big));
}

/// Writes a segment of one frame followed by `zeros` zero bytes; returns the frame's length.
fn write_filled_segment(disk: &SimDisk, base: u64, payload: &str, zeros: usize) -> u64 {
    let mut bytes = frame_bytes(base, &[payload], 1);
    let frames = bytes.len() as u64;
    bytes.resize(bytes.len() + zeros, 0);
    write_segment(disk, base, &bytes);
    frames
}

#[test]
fn recovery_reads_zeros_behind_the_frames_as_a_clean_end_and_cuts_the_last_segment_back() {
    // A sealed segment that kept its fill (the trim at the roll is not synced) and a last segment
    // with its fill: both open without damage, and the last one is cut back to its frames.
    let disk = SimDisk::new(43);
    let sealed_frames = write_filled_segment(&disk, 0, "a", 300);
    let last_frames = write_filled_segment(&disk, 1, "b", 200);
    let (mut log, report) = reopened(&disk, filling());
    assert_eq!(
        report,
        RecoveryReport {
            segments: 2,
            oldest_offset: Offset(0),
            high_watermark: Offset(2),
            truncated_bytes: 200,
            damage: None,
            skipped: Vec::new(),
        }
    );
    assert_eq!(log.stats().size_bytes, sealed_frames + last_frames);
    assert_eq!(
        disk.durable_image(&path(1)).unwrap().len() as u64,
        last_frames
    );
    assert_eq!(served(&mut log, &disk, 0), ["a"]);
    assert_eq!(served(&mut log, &disk, 1), ["b"]);
    // The next commit fills again behind its frames.
    let fills = commit_filling(&mut log, &disk, 1, &["c"]);
    let end = log.stats().size_bytes - sealed_frames;
    assert_eq!(fills, [(end, 256)]);
}

#[test]
fn zeros_where_the_next_segment_proves_offsets_missing_are_still_a_hole() {
    let disk = SimDisk::new(44);
    let first = write_filled_segment(&disk, 0, "a", 300);
    write_segment(&disk, 2, &frame_bytes(2, &["c"], 1));
    let (mut log, report) = reopened(&disk, filling());
    assert_eq!(report.high_watermark, Offset(3));
    assert_eq!(
        report.skipped,
        [SkippedDamage {
            segment: Offset(0),
            byte: first,
            damage: FrameDamage::Decode(DecodeError::BadMagic),
            offsets: (Offset(1), Offset(2)),
        }]
    );
    assert_reads_around_a_hole(&mut log, &disk, (0, &["a"]), 1, (2, &["c"]));
}

/// Commits `payloads` as one run whose zero fill fails for want of space: a failed write.
fn commit_failing_its_fill(log: &mut PartitionLog, id: u64, payloads: &[&str]) {
    log.handle(NOW, commit_request(id, payloads, 1));
    let request = next_io(log);
    let fill = request
        .ops
        .iter()
        .position(|op| matches!(op, IoOp::WriteZeros { .. }))
        .expect("a fill");
    log.handle(NOW, failed(request.id, fill, IoFault::NoSpace));
    let output = log.poll_output();
    assert!(
        matches!(
            output,
            Some(LogOutput::CommitDone {
                result: Err(CommitFault::Write(IoFault::NoSpace)),
                ..
            })
        ),
        "{output:?}"
    );
}

#[test]
fn a_failed_fill_fails_the_commit_and_repairs_the_file_like_a_failed_write() {
    let mut log = ready_by_hand(filling());
    commit_failing_its_fill(&mut log, 1, &["a"]);
    let repair = next_io(&mut log);
    assert_eq!(
        repair.ops,
        [
            IoOp::SetLen {
                path: path(0),
                len: 0
            },
            IoOp::SyncData { path: path(0) }
        ]
    );
    log.handle(NOW, done(repair.id, vec![IoReply::Done, IoReply::Done]));
    // A full disk may fit the frames but not the zeros: the retry goes without a fill.
    log.handle(NOW, commit_request(2, &["a"], 1));
    let request = next_io(&mut log);
    assert_eq!(fill_ops(&request), []);
}

#[test]
fn after_a_failed_fill_the_segment_fills_no_more_and_the_next_one_fills_again() {
    let (disk, mut log, _) = filled_once(46);
    // A commit that passes the zeros, whose fill fails (the disk is full).
    let big = "x".repeat(400);
    commit_failing_its_fill(&mut log, 2, &[&big]);
    let outputs = run_to_idle(&mut log, NOW, &disk, &mut NoHook).unwrap();
    assert!(outputs.is_empty(), "the repair: {outputs:?}");
    // The retry and the commits after it in this segment write their frames only.
    assert_eq!(commit_filling(&mut log, &disk, 3, &[&big]), []);
    assert_eq!(commit_filling(&mut log, &disk, 4, &[&big]), []);
    assert_eq!(log.stats().segments, 1);
    // The next segment fills again.
    let huge = "y".repeat(1500);
    let fills = commit_filling(&mut log, &disk, 5, &[&huge]);
    assert_eq!(log.stats().segments, 2);
    assert_eq!(fills, [(keyless_frame_len(&huge), 256)]);
}

#[test]
fn large_commits_write_no_zero_fill_until_the_commits_get_small_again() {
    let disk = SimDisk::new(45);
    let config = PartitionLogConfig {
        segment_bytes_max: 8 << 20,
        preallocate_bytes: 4096,
        ..config()
    };
    let (mut log, _) = reopened(&disk, config);
    let large = "x".repeat(PREALLOCATE_RUN_BYTES_MAX as usize + 6000);
    assert_eq!(commit_filling(&mut log, &disk, 1, &[&large]), []);
    assert_eq!(commit_filling(&mut log, &disk, 2, &[&large]), []);
    // The average falls below the bound after one small commit (70 KiB * 7/8 < 64 KiB).
    let end = log.stats().size_bytes + keyless_frame_len("a");
    assert_eq!(commit_filling(&mut log, &disk, 3, &["a"]), [(end, 4096)]);
}
