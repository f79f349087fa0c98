//! Segment rolls, reads (limits, the sparse index, large frames) and rot met while serving.

use super::*;

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
        Err(LogReadError::AtOrPastHighWatermark {
            high_watermark: Offset(0)
        })
    );
    let _ = commit(&mut log, &disk, 1, &["a"], 1);
    assert_eq!(
        read(&mut log, &disk, 1, 1, 100),
        Err(LogReadError::AtOrPastHighWatermark {
            high_watermark: Offset(1)
        })
    );
    // Retention (done by the node) removed the first segment: offsets below the next are gone.
    let big = "z".repeat(1200);
    let _ = commit(&mut log, &disk, 2, &[&big], 1);
    log.segments.remove(&Offset(0));
    assert_eq!(
        read(&mut log, &disk, 0, 1, 100),
        Err(LogReadError::BelowOldestRetained { oldest: Offset(1) })
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
            id: LogReadId(1),
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
            id: LogReadId(1),
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
        Err(LogReadError::Unreadable {
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
        Err(LogReadError::Unreadable {
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
        kind: DiskFault::SyncEio,
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
