//! Retention: sealed segments go from the front by age and by size, the active one rolls, readers pin,
//! and a crash anywhere in the unlinks recovers a contiguous log.

use super::*;
use crate::partition::log::{RetainReason, RetainedRange, RetentionPolicy};

const HOUR_MS: u64 = 3_600_000;

/// A log of four segments (one 600-byte record each, commit times 1000, 2000, 3000, 4000 ms).
fn four_segments(disk: &SimDisk) -> PartitionLog {
    let mut log = opened(disk);
    let big = "x".repeat(600);
    for id in 0..4u64 {
        let outputs = commit(&mut log, disk, id, &[&big], (id + 1) * 1000);
        assert!(matches!(
            outputs.as_slice(),
            [LogOutput::CommitDone { result: Ok(_), .. }]
        ));
    }
    assert_eq!(log.stats().segments, 4);
    log
}

fn retain(log: &mut PartitionLog, disk: &SimDisk, policy: RetentionPolicy) -> Vec<LogOutput> {
    log.handle(NOW, LogInput::Retain(policy));
    run_to_idle(log, NOW, disk, &mut NoHook).unwrap()
}

fn age(now_ms: u64, retention_ms: u64) -> RetentionPolicy {
    RetentionPolicy {
        now_ms,
        retention_ms,
        retention_bytes: 0,
    }
}

fn retained(outputs: &[LogOutput]) -> Vec<RetainedRange> {
    outputs
        .iter()
        .filter_map(|output| match output {
            LogOutput::Retained(range) => Some(*range),
            _ => None,
        })
        .collect()
}

#[test]
fn age_removes_sealed_segments_whose_newest_record_passed_retention_and_never_the_active_one() {
    let disk = SimDisk::new(1);
    let mut log = four_segments(&disk);
    // Records at 1000 and 2000 are older than 1500 ms at 3500; 3000 is not.
    let outputs = retain(&mut log, &disk, age(3_500, 1_500));
    let ranges = retained(&outputs);
    assert_eq!(ranges.len(), 1, "{outputs:?}");
    assert_eq!(
        (ranges[0].reason, ranges[0].segments, ranges[0].records),
        (RetainReason::Age, 2, 2)
    );
    assert_eq!(ranges[0].oldest, Offset(2));
    assert_eq!(log.stats().oldest_offset, Offset(2));
    assert_eq!(log.stats().oldest_segment_at_ms, Some(3_000));
    assert_eq!(
        disk.list(DIR).unwrap(),
        [segment_name(Offset(2)), segment_name(Offset(3))]
    );
    assert_eq!(
        read(&mut log, &disk, 1, 10, 10_000),
        Err(LogReadError::BelowOldestRetained { oldest: Offset(2) })
    );
    assert_eq!(served(&mut log, &disk, 2).len(), 1);
    // Far in the future every sealed segment goes, then the active one is rolled and goes too: an
    // empty segment at the high watermark is left.
    let outputs = retain(&mut log, &disk, age(4_000 + HOUR_MS, HOUR_MS - 1));
    let records: u64 = retained(&outputs).iter().map(|range| range.records).sum();
    assert_eq!(records, 2, "{outputs:?}");
    let stats = log.stats();
    assert_eq!(
        (stats.segments, stats.oldest_offset, stats.high_watermark),
        (1, Offset(4), Offset(4))
    );
    assert_eq!(disk.list(DIR).unwrap(), [segment_name(Offset(4))]);
}

#[test]
fn an_idle_partitions_active_segment_rolls_once_its_oldest_record_expires_then_goes() {
    let disk = SimDisk::new(2);
    let mut log = opened(&disk);
    let _ = commit(&mut log, &disk, 1, &["a", "b"], 1_000);
    assert_eq!(log.stats().segments, 1);
    // Nothing expired yet: no roll.
    let outputs = retain(&mut log, &disk, age(1_500, 1_000));
    assert!(outputs.is_empty(), "{outputs:?}");
    assert_eq!(disk.list(DIR).unwrap(), [segment_name(Offset(0))]);
    // Expired: the active segment is sealed by a roll, and then removed by the same check.
    let outputs = retain(&mut log, &disk, age(2_500, 1_000));
    let ranges = retained(&outputs);
    assert_eq!(
        (ranges.len(), ranges[0].records, ranges[0].oldest),
        (1, 2, Offset(2))
    );
    assert_eq!(disk.list(DIR).unwrap(), [segment_name(Offset(2))]);
    let stats = log.stats();
    assert_eq!(
        (
            stats.segments,
            stats.oldest_offset,
            stats.high_watermark,
            stats.size_bytes
        ),
        (1, Offset(2), Offset(2), 0)
    );
    // The log goes on at the high watermark, and survives a reopen as it is.
    let _ = commit(&mut log, &disk, 2, &["c"], 3_000);
    assert_eq!(served(&mut log, &disk, 2), ["c"]);
    disk.crash();
    let (mut log, report) = reopened(&disk, config());
    assert_eq!(
        (report.oldest_offset, report.high_watermark),
        (Offset(2), Offset(3))
    );
    assert_eq!(served(&mut log, &disk, 2), ["c"]);
}

#[test]
fn size_keeps_at_least_the_bound_and_at_most_the_bound_plus_a_segment() {
    let disk = SimDisk::new(3);
    let mut log = four_segments(&disk);
    let segment = log.segment_bytes()[0].1;
    let policy = RetentionPolicy {
        now_ms: 5_000,
        retention_ms: HOUR_MS,
        retention_bytes: segment + 1,
    };
    let outputs = retain(&mut log, &disk, policy);
    let ranges = retained(&outputs);
    assert_eq!(
        (ranges[0].reason, ranges[0].segments, ranges[0].bytes),
        (RetainReason::Bytes, 2, 2 * segment)
    );
    // Two segments kept: one alone would be below the bound.
    let size = log.stats().size_bytes;
    assert!(size > policy.retention_bytes && size <= policy.retention_bytes + segment);
    // A bound of exactly what remains keeps it.
    let outputs = retain(
        &mut log,
        &disk,
        RetentionPolicy {
            retention_bytes: size,
            ..policy
        },
    );
    assert!(retained(&outputs).is_empty());
}

#[test]
fn a_read_in_flight_pins_its_segment_until_it_answers_aged_out() {
    let disk = SimDisk::new(4);
    let mut log = four_segments(&disk);
    log.handle(
        NOW,
        LogInput::Read(ReadRequest {
            id: LogReadId(7),
            offset: Offset(0),
            records_max: 1,
            bytes_max: 10,
        }),
    );
    let read = next_io(&mut log);
    log.handle(NOW, LogInput::Retain(age(3_500, 1_500)));
    // The read's segment (0) is pinned: nothing is unlinked yet, although both segments left the log.
    assert!(log
        .poll_output()
        .is_some_and(|o| matches!(o, LogOutput::Retained(_))));
    assert!(log.poll_output().is_none());
    assert_eq!(log.doomed_segments(), 2);
    assert_eq!(disk.list(DIR).unwrap().len(), 4);
    // The read completes from the still-present file; its answer is served or aged out, never an
    // error of damage, and the unlink follows.
    log.handle(NOW, LogInput::Io(crate::disk::execute(&disk, &read)));
    let outputs = run_to_idle(&mut log, NOW, &disk, &mut NoHook).unwrap();
    let answered = outputs.iter().any(|output| {
        matches!(
            output,
            LogOutput::ReadDone {
                result: Ok(_) | Err(LogReadError::BelowOldestRetained { .. }),
                ..
            }
        )
    });
    assert!(answered, "{outputs:?}");
    assert_eq!(log.doomed_segments(), 0);
    assert_eq!(disk.list(DIR).unwrap().len(), 2);
}

#[test]
fn a_crash_anywhere_in_the_unlinks_recovers_a_contiguous_log_with_every_kept_record() {
    for crash_after in 0..=4usize {
        let disk = SimDisk::new(5);
        let mut log = four_segments(&disk);
        log.handle(NOW, LogInput::Retain(age(10_000, 6_500)));
        let mut executed = 0;
        while let Some(output) = log.poll_output() {
            let LogOutput::Io(request) = output else {
                continue;
            };
            // Run the unlink request op by op, crashing after `crash_after` of them.
            for op in request.ops.iter().take(crash_after.min(request.ops.len())) {
                let single = IoRequest {
                    id: request.id,
                    lane: request.lane,
                    ops: vec![op.clone()],
                };
                let _ = crate::disk::execute(&disk, &single);
                executed += 1;
            }
            break;
        }
        disk.crash();
        let (mut log, report) = reopened(&disk, config());
        assert_eq!(
            report.high_watermark,
            Offset(4),
            "crash after {executed} ops"
        );
        assert!(report.skipped.is_empty() && report.damage.is_none());
        for offset in report.oldest_offset.0..4 {
            assert_eq!(served(&mut log, &disk, offset).len(), 1);
        }
        assert!(report.oldest_offset <= Offset(3));
    }
}

#[test]
fn a_failed_unlink_is_reported_and_tried_again_at_the_next_check() {
    let disk = SimDisk::new(6);
    let mut log = four_segments(&disk);
    log.handle(NOW, LogInput::Retain(age(3_500, 1_500)));
    assert!(matches!(log.poll_output(), Some(LogOutput::Retained(_))));
    let unlink = next_io(&mut log);
    assert_eq!(
        unlink.ops,
        [
            IoOp::Remove { path: path(0) },
            IoOp::SyncDir { dir: DIR.into() },
            IoOp::Remove { path: path(1) },
            IoOp::SyncDir { dir: DIR.into() },
        ]
    );
    // The first pair went through, the second remove failed.
    let first = IoRequest {
        ops: unlink.ops[..2].to_vec(),
        ..unlink.clone()
    };
    let _ = crate::disk::execute(&disk, &first);
    log.handle(NOW, failed(unlink.id, 2, IoFault::Other("EIO".into())));
    assert!(matches!(
        log.poll_output(),
        Some(LogOutput::RetentionFailed(_))
    ));
    assert_eq!(log.doomed_segments(), 1);
    assert_eq!(log.stats().oldest_offset, Offset(2));
    let _ = retain(&mut log, &disk, age(3_500, 1_500));
    assert_eq!(log.doomed_segments(), 0);
    assert_eq!(
        disk.list(DIR).unwrap(),
        [segment_name(Offset(2)), segment_name(Offset(3))]
    );
}

#[test]
fn the_unexpired_plant_judges_by_the_oldest_record() {
    // Without the plant, a segment whose records straddle the retention line stays.
    let disk = SimDisk::new(7);
    let mut log = opened(&disk);
    let big = "x".repeat(400);
    let _ = commit(&mut log, &disk, 1, &[&big], 1_000);
    let _ = commit(&mut log, &disk, 2, &[&big], 3_000);
    let _ = commit(&mut log, &disk, 3, &[&big], 4_000);
    assert_eq!(log.stats().segments, 2);
    let outputs = retain(&mut log, &disk, age(3_500, 1_500));
    assert!(retained(&outputs).is_empty(), "{outputs:?}");
}
