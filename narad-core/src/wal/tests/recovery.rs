//! Recovery at open: torn tails, corruption, density, prepared segments, the checkpoint.

use super::*;
use crate::codec::wal::encode_prep_trailer;
use crate::codec::DecodeError;

fn name(first: u64) -> String {
    format!("{first:020}.wal")
}

/// Runs the recovery protocol over in-memory files.
fn recover(
    files: &[(&str, Vec<u8>)],
    checkpoint: u64,
    config: WalConfig,
) -> Result<Opened, OpenError> {
    let mut recovery = WalRecovery::new(config, Seq(checkpoint))?;
    let names: Vec<String> = files.iter().map(|(name, _)| name.to_string()).collect();
    for planned in recovery.plan(&names) {
        let bytes = files
            .iter()
            .find(|(name, _)| *name == planned)
            .expect("planned a listed file")
            .1
            .clone();
        recovery.feed_segment(&planned, bytes)?;
    }
    recovery.finish()
}

fn repair_ops(opened: &mut Opened) -> Vec<IoOp> {
    let outputs: Vec<WalOutput> = std::iter::from_fn(|| opened.wal.poll_output()).collect();
    ios(&outputs).pop().expect("a repair request").ops
}

/// A prepared segment of `len` bytes (trailer included) with `data` at its start.
fn prepared(len: usize, data: &[u8]) -> Vec<u8> {
    let limit = len - 16;
    let mut bytes = vec![0u8; limit];
    bytes[..data.len()].copy_from_slice(data);
    bytes.extend_from_slice(&encode_prep_trailer(limit as u64));
    bytes
}

#[test]
fn a_torn_tail_of_the_last_segment_is_truncated_and_what_was_read_is_made_durable() {
    let good = frames(0, &[b"r0", b"r1"]);
    let mut bytes = good.clone();
    bytes.extend_from_slice(&frames(2, &[b"r2-torn"])[..15]);
    let mut opened = recover(&[(&name(0), bytes)], 0, small_config()).unwrap();
    assert_eq!(opened.report.next_seq, Seq(2));
    assert_eq!(
        opened.report.torn_tail,
        Some(TornTail {
            segment: Seq(0),
            offset: 44,
            bytes_dropped: 15
        })
    );
    assert_eq!(
        repair_ops(&mut opened),
        vec![
            IoOp::SetLen {
                path: SEG0.into(),
                len: 44
            },
            IoOp::WriteAt {
                path: SEG0.into(),
                offset: 0,
                data: good
            },
            IoOp::SyncData { path: SEG0.into() },
            IoOp::SyncDir { dir: "wal".into() },
        ]
    );
}

#[test]
fn zeros_after_the_frames_of_a_plain_last_segment_are_a_torn_tail() {
    let mut bytes = frames(0, &[b"r0"]);
    bytes.extend_from_slice(&[0u8; 100]);
    let opened = recover(&[(&name(0), bytes)], 0, small_config()).unwrap();
    assert_eq!(
        opened.report.torn_tail,
        Some(TornTail {
            segment: Seq(0),
            offset: 22,
            bytes_dropped: 100
        })
    );
}

#[test]
fn a_bad_frame_in_a_segment_that_is_not_the_last_is_corruption() {
    let mut first = frames(0, &[b"r0", b"r1"]);
    let last = first.len() - 1;
    first[last] ^= 1;
    let second = frames(2, &[b"r2"]);
    let error = recover(&[(&name(0), first), (&name(2), second)], 0, small_config()).unwrap_err();
    assert_eq!(
        error,
        OpenError::Corrupt {
            segment: name(0),
            offset: 22,
            error: DecodeError::BadChecksum,
            followed_by_valid_frames: false
        }
    );
}

#[test]
fn a_bad_frame_followed_by_valid_frames_in_a_plain_last_segment_is_corruption() {
    let mut bytes = frames(0, &[b"r0", b"r1", b"r2"]);
    bytes[22 + 20] ^= 1; // the payload of frame 1
    let error = recover(&[(&name(0), bytes)], 0, small_config()).unwrap_err();
    assert_eq!(
        error,
        OpenError::Corrupt {
            segment: name(0),
            offset: 22,
            error: DecodeError::BadChecksum,
            followed_by_valid_frames: true
        }
    );
}

#[test]
fn a_hole_followed_by_valid_frames_within_the_window_of_a_prepared_last_segment_is_a_torn_tail() {
    let data = frames(0, &[&payload(1, 20), &payload(2, 20), &payload(3, 20)]);
    let mut bytes = prepared(256, &data);
    bytes[40..44].fill(0); // a hole where frame 1 starts
    let mut opened = recover(&[(&name(0), bytes)], 0, small_config()).unwrap();
    assert_eq!(opened.report.next_seq, Seq(1));
    assert_eq!(
        opened.report.torn_tail,
        Some(TornTail {
            segment: Seq(0),
            offset: 40,
            bytes_dropped: 216
        })
    );
    assert_eq!(
        repair_ops(&mut opened),
        vec![
            IoOp::SetLen {
                path: SEG0.into(),
                len: 40
            },
            IoOp::WriteAt {
                path: SEG0.into(),
                offset: 0,
                data: data[..40].to_vec()
            },
            IoOp::SyncData { path: SEG0.into() },
            IoOp::SyncDir { dir: "wal".into() },
        ]
    );
}

#[test]
fn valid_frames_beyond_the_window_after_a_hole_are_corruption_even_in_a_prepared_segment() {
    // Frame 0 at 0, a hole at frame 1 (offset 40), frames up to offset 40 + 128 and past it.
    let payloads: Vec<Vec<u8>> = (0..6).map(|index| payload(index, 20)).collect();
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    let data = frames(0, &refs); // 6 frames of 40 bytes: the last starts at 200
    let mut bytes = prepared(256, &data);
    bytes[40..60].fill(0);
    let error = recover(&[(&name(0), bytes)], 0, small_config()).unwrap_err();
    assert_eq!(
        error,
        OpenError::Corrupt {
            segment: name(0),
            offset: 40,
            error: DecodeError::BadMagic,
            followed_by_valid_frames: true
        }
    );
}

#[test]
fn a_hole_in_a_prepared_segment_that_is_not_the_last_is_corruption() {
    let data = frames(0, &[&payload(1, 20), &payload(2, 20), &payload(3, 20)]);
    let mut bytes = prepared(256, &data);
    bytes[40..44].fill(0);
    let next = frames(3, &[b"r3"]);
    let error = recover(&[(&name(0), bytes), (&name(3), next)], 0, small_config()).unwrap_err();
    assert!(
        matches!(
            error,
            OpenError::Corrupt {
                offset: 40,
                followed_by_valid_frames: true,
                ..
            }
        ),
        "{error:?}"
    );
}

#[test]
fn a_clean_prepared_last_segment_stays_prepared_and_is_written_in_place() {
    let data = frames(0, &[&payload(1, 20)]);
    let mut opened = recover(&[(&name(0), prepared(256, &data))], 0, small_config()).unwrap();
    assert_eq!(opened.report.torn_tail, None);
    assert_eq!(
        repair_ops(&mut opened),
        vec![
            IoOp::WriteAt {
                path: SEG0.into(),
                offset: 0,
                data: data.clone()
            },
            IoOp::SyncData { path: SEG0.into() },
            IoOp::SyncDir { dir: "wal".into() },
        ]
    );
    assert_eq!(opened.wal.bytes_on_disk(), 256);
}

#[test]
fn segments_that_do_not_start_where_the_previous_ended_refuse_to_open() {
    let error = recover(
        &[
            (&name(0), frames(0, &[b"r0", b"r1"])),
            (&name(5), frames(5, &[b"r5"])),
        ],
        0,
        small_config(),
    )
    .unwrap_err();
    assert_eq!(
        error,
        OpenError::NotDense {
            segment: name(5),
            expected: Seq(2),
            found: Seq(5)
        }
    );
}

#[test]
fn a_frame_with_another_seq_than_its_position_refuses_to_open() {
    let mut bytes = frames(0, &[b"r0"]);
    bytes.extend_from_slice(&frames(7, &[b"r7"]));
    let error = recover(&[(&name(0), bytes)], 0, small_config()).unwrap_err();
    assert_eq!(
        error,
        OpenError::SeqMismatch {
            segment: name(0),
            offset: 22,
            expected: Seq(1),
            found: Seq(7)
        }
    );
}

#[test]
fn a_checkpoint_below_the_oldest_segment_starts_dispatch_there_with_the_spec_warning() {
    let mut opened = recover(&[(&name(10), frames(10, &[b"r10"]))], 4, small_config()).unwrap();
    assert_eq!(opened.report.dispatch_start, Seq(10));
    assert_eq!(opened.wal.dispatch_start(), Seq(10));
    let warning = opened.wal.poll_output();
    let expected = WalWarning::CheckpointBelowOldestSegment {
        checkpoint: Seq(4),
        oldest_segment: Seq(10),
    };
    assert_eq!(warning, Some(WalOutput::Warning(expected.clone())));
    assert_eq!(
        expected.message(),
        "ingress dispatch checkpoint was below the oldest WAL segment; dispatch starts at that segment"
    );
}

#[test]
fn a_checkpoint_above_the_recovered_next_seq_refuses_to_open() {
    let error = recover(&[(&name(0), frames(0, &[b"r0"]))], 2, small_config()).unwrap_err();
    assert_eq!(
        error,
        OpenError::CheckpointAhead {
            checkpoint: Seq(2),
            next_seq: Seq(1)
        }
    );
    let error = recover(&[], 1, small_config()).unwrap_err();
    assert_eq!(
        error,
        OpenError::CheckpointAhead {
            checkpoint: Seq(1),
            next_seq: Seq(0)
        }
    );
}

#[test]
fn a_leftover_spare_is_removed_and_other_files_are_left_alone() {
    let mut opened = recover(
        &[
            (&name(0), frames(0, &[b"r0"])),
            ("next-segment.prep", vec![0u8; 10]),
            ("checkpoint", vec![0u8; 8]),
        ],
        1,
        small_config(),
    )
    .unwrap();
    assert!(opened.report.removed_prep_file);
    assert_eq!(opened.report.ignored_files, vec!["checkpoint".to_string()]);
    let ops = repair_ops(&mut opened);
    assert_eq!(
        ops[ops.len() - 2..],
        [
            IoOp::Remove {
                path: "wal/next-segment.prep".into()
            },
            IoOp::SyncDir { dir: "wal".into() }
        ]
    );
}

#[test]
fn reads_after_a_failed_repair_answer_the_latch_fault_never_the_recovered_records() {
    let mut opened = recover(&[(&name(0), frames(0, &[b"r0", b"r1"]))], 0, small_config()).unwrap();
    let repair =
        ios(&std::iter::from_fn(|| opened.wal.poll_output()).collect::<Vec<_>>())[0].clone();
    let mut h = Harness {
        wal: opened.wal,
        now: Instant::ZERO,
    };
    let read = |h: &mut Harness| {
        h.input(WalInput::Read {
            id: WalReadId(3),
            from: Seq(0),
            max_records: 10,
            max_bytes: 1000,
        })
    };
    // While the repair runs, nothing recovered is served yet.
    assert_eq!(
        read(&mut h),
        vec![WalOutput::ReadDone {
            id: WalReadId(3),
            result: Ok(Vec::new())
        }]
    );
    let _ = h.fail(&repair, 1, IoFault::Eio);
    assert_eq!(h.wal.durable_next_seq(), Seq(2), "recovery saw two records");
    assert_eq!(
        read(&mut h),
        vec![WalOutput::ReadDone {
            id: WalReadId(3),
            result: Err(WalReadError::Io(IoFault::Eio))
        }]
    );
}

#[test]
fn a_failed_repair_latches_the_wal() {
    let mut opened = recover(&[(&name(0), frames(0, &[b"r0"]))], 0, small_config()).unwrap();
    let repair =
        ios(&std::iter::from_fn(|| opened.wal.poll_output()).collect::<Vec<_>>())[0].clone();
    let mut h = Harness {
        wal: opened.wal,
        now: Instant::ZERO,
    };
    assert_eq!(h.append(1, b"aaaa"), vec![]);
    let outputs = h.fail(&repair, 1, IoFault::Eio);
    assert_eq!(
        outputs,
        vec![
            WalOutput::Latched {
                fault: IoFault::Eio
            },
            failed(1, AppendError::Disk(IoFault::Eio))
        ]
    );
}
