//! Reopening a log: the verified prefix becomes the high watermark; damage in sealed and last
//! segments, torn appends and failed recovery I/O.

use super::*;

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
        Err(LogReadError::Unreadable { .. })
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
        Err(LogReadError::Unreadable {
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
        Err(LogReadError::Unreadable {
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
            id: LogReadId(1),
            offset: Offset(0),
            records_max: 1,
            bytes_max: 1,
        }),
    );
    assert_eq!(
        log.poll_output(),
        Some(LogOutput::ReadDone {
            id: LogReadId(1),
            result: Err(LogReadError::NotOpen)
        })
    );
}
