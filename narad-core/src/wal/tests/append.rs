//! Group commit, batches, rolls, withdrawn fills and the failure latch.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::*;

#[test]
fn open_of_an_empty_directory_creates_the_first_segment_and_syncs_the_directory() {
    let (_, repair) = Harness::open_empty(small_config());
    assert_eq!(
        repair,
        request(
            0,
            0,
            vec![
                IoOp::CreateDirAll { dir: "wal".into() },
                IoOp::Create { path: SEG0.into() },
                IoOp::SyncDir { dir: "wal".into() },
            ]
        )
    );
}

#[test]
fn appends_wait_for_the_open_repair_then_flush_with_one_write_and_one_sync() {
    let (mut h, repair) = Harness::open_empty(small_config());
    assert_eq!(h.append(1, b"aaaa"), vec![]);
    let outputs = h.complete(&repair);
    let flush = request(1, 0, flush_ops(SEG0, 0, frames(0, &[b"aaaa"])));
    assert_eq!(outputs, vec![durable(0), WalOutput::Io(flush.clone())]);
    assert_eq!(h.complete(&flush), vec![done(1, 0, 1), durable(1)]);
    assert_eq!(h.wal.durable_next_seq(), Seq(1));
}

#[test]
fn a_wake_per_append_flushes_at_once_when_no_flush_is_in_flight() {
    let mut h = Harness::ready(small_config());
    let flush = one_io(h.append(1, b"aaaa"));
    assert_eq!(
        flush,
        request(1, 0, flush_ops(SEG0, 0, frames(0, &[b"aaaa"])))
    );
}

#[test]
fn appends_staged_during_a_flush_share_the_next_write_and_sync() {
    let mut h = Harness::ready(small_config());
    let first = one_io(h.append(1, b"aaaa"));
    assert_eq!(h.append(2, b"bbbb"), vec![]);
    assert_eq!(h.append(3, b"cccc"), vec![]);
    let outputs = h.complete(&first);
    let second = request(2, 0, flush_ops(SEG0, 24, frames(1, &[b"bbbb", b"cccc"])));
    assert_eq!(
        outputs,
        vec![done(1, 0, 1), durable(1), WalOutput::Io(second.clone())]
    );
    assert_eq!(
        h.complete(&second),
        vec![done(2, 1, 2), done(3, 2, 3), durable(3)]
    );
}

#[test]
fn a_caller_is_answered_only_when_its_own_bytes_are_durable() {
    let mut h = Harness::ready(small_config());
    let first = one_io(h.append(1, b"aaaa"));
    h.append(2, b"bbbb");
    let outputs = h.complete(&first);
    assert!(!outputs.iter().any(|output| matches!(
        output,
        WalOutput::AppendDone {
            id: AppendId(2),
            ..
        }
    )));
    assert_eq!(h.wal.durable_next_seq(), Seq(1));
    assert_eq!(h.wal.next_seq(), Seq(2));
}

#[test]
fn the_backstop_fires_ten_ms_after_a_record_starts_waiting_and_rearms_while_it_waits() {
    let mut h = Harness::ready(small_config());
    let first = one_io(h.at(0).append(1, b"aaaa"));
    assert_eq!(
        h.wal.poll_timeout(),
        None,
        "nothing waits: the record is in flight"
    );
    h.at(1).append(2, b"bbbb");
    assert_eq!(h.wal.poll_timeout(), Some(ms(11)));
    assert_eq!(
        h.at(5).input(WalInput::Tick),
        vec![],
        "a tick before the deadline does nothing"
    );
    assert_eq!(h.wal.poll_timeout(), Some(ms(11)));
    assert_eq!(
        h.at(11).input(WalInput::Tick),
        vec![],
        "the lane is busy: nothing to start"
    );
    assert_eq!(
        h.wal.poll_timeout(),
        Some(ms(21)),
        "re-armed while the record waits"
    );
    let outputs = h.at(15).complete(&first);
    assert_eq!(
        ios(&outputs).len(),
        1,
        "the completion starts the waiting flush"
    );
    assert_eq!(h.wal.poll_timeout(), None);
}

#[test]
fn append_many_takes_consecutive_seqs_with_nothing_interleaved_and_one_answer() {
    let mut h = Harness::ready(small_config());
    let first = one_io(h.append(9, b"zzzz"));
    assert_eq!(h.append_many(5, &[b"b1b1", b"b2b2", b"b3b3"]), vec![]);
    assert_eq!(h.append(6, b"cccc"), vec![]);
    let outputs = h.complete(&first);
    let batch = frames(1, &[b"b1b1", b"b2b2", b"b3b3", b"cccc"]);
    let second = request(2, 0, flush_ops(SEG0, 24, batch));
    assert_eq!(
        outputs,
        vec![done(9, 0, 1), durable(1), WalOutput::Io(second.clone())]
    );
    assert_eq!(
        h.complete(&second),
        vec![done(5, 1, 4), done(6, 4, 5), durable(5)]
    );
}

#[test]
fn append_many_checks_every_size_before_staging_anything() {
    let mut h = Harness::ready(small_config());
    let called = Arc::new(AtomicBool::new(false));
    let seen = called.clone();
    let fill: FillFn = Box::new(move |_, _| {
        seen.store(true, Ordering::SeqCst);
        Ok(())
    });
    let outputs = h.input(WalInput::AppendMany {
        id: AppendId(1),
        sizes: vec![4, 101, 4],
        fill,
    });
    assert_eq!(
        outputs,
        vec![failed(
            1,
            AppendError::RecordTooLarge {
                index: 1,
                bytes: 101,
                bytes_max: 100
            }
        )]
    );
    assert!(!called.load(Ordering::SeqCst), "the fill never ran");
    assert_eq!(h.wal.next_seq(), Seq(0));
    let outputs = h.input(WalInput::AppendMany {
        id: AppendId(2),
        sizes: vec![4, 0],
        fill: Box::new(|_, _| Ok(())),
    });
    assert_eq!(
        outputs,
        vec![failed(2, AppendError::EmptyRecord { index: 1 })]
    );
    assert_eq!(h.wal.next_seq(), Seq(0));
}

#[test]
fn an_empty_batch_is_answered_at_once_with_no_seqs() {
    let mut h = Harness::ready(small_config());
    let outputs = h.append_many(1, &[]);
    assert_eq!(outputs, vec![done(1, 0, 0)]);
}

#[test]
fn appends_beyond_the_unflushed_limit_are_refused_before_staging() {
    let config = WalConfig {
        unflushed_bytes_max: 150,
        ..small_config()
    };
    let mut h = Harness::ready(config);
    h.append(1, &payload(1, 100)); // 120 bytes in flight
    let outputs = h.append(2, &payload(2, 20));
    assert_eq!(
        outputs,
        vec![failed(
            2,
            AppendError::Overloaded {
                unflushed_bytes: 160,
                bytes_max: 150
            }
        )]
    );
    assert_eq!(h.wal.next_seq(), Seq(1));
}

/// Two 70-byte frames (seqs 0 and 1) durable in segment 0 (140 of 256 bytes).
pub(super) fn two_frames_durable(h: &mut Harness) {
    let first = one_io(h.append(1, &payload(b'a', 50)));
    assert_eq!(h.complete(&first), vec![done(1, 0, 1), durable(1)]);
    let second = one_io(h.append(2, &payload(b'b', 50)));
    assert_eq!(h.complete(&second), vec![done(2, 1, 2), durable(2)]);
}

#[test]
fn a_batch_that_outgrows_the_segment_rolls_between_two_records_after_syncing_what_is_staged() {
    let mut h = Harness::ready(small_config());
    let first = one_io(h.append(1, &payload(b'a', 50)));
    assert_eq!(h.complete(&first), vec![done(1, 0, 1), durable(1)]);
    let second = one_io(h.append(2, &payload(b'b', 50)));
    assert_eq!(h.complete(&second), vec![done(2, 1, 2), durable(2)]);
    // 140 bytes used: record 2 fits (210), record 3 would pass 256 and rolls.
    let (c, d, e) = (payload(b'c', 50), payload(b'd', 50), payload(b'e', 50));
    let pre_roll = one_io(h.append_many(3, &[&c, &d, &e]));
    assert_eq!(
        pre_roll,
        request(3, 0, flush_ops(SEG0, 140, frames(2, &[&c])))
    );
    let roll = request(
        4,
        0,
        vec![
            IoOp::Create { path: seg_path(3) },
            IoOp::SyncDir { dir: "wal".into() },
        ],
    );
    assert_eq!(
        h.complete(&pre_roll),
        vec![durable(3), WalOutput::Io(roll.clone())]
    );
    let post_roll = request(5, 0, flush_ops(&seg_path(3), 0, frames(3, &[&d, &e])));
    assert_eq!(h.complete(&roll), vec![WalOutput::Io(post_roll.clone())]);
    assert_eq!(h.complete(&post_roll), vec![done(3, 2, 5), durable(5)]);
    assert_eq!(h.wal.segment_count(), 2);
}

#[test]
fn a_failed_fill_withdraws_the_batch_and_gives_its_seqs_back() {
    let mut h = Harness::ready(small_config());
    let first = one_io(h.append(1, b"aaaa"));
    h.append(2, b"bbbb");
    let fill: FillFn = Box::new(|index, out| {
        if index == 1 {
            return Err(FillError::Failed("encoder refused".into()));
        }
        out.fill(b'x');
        Ok(())
    });
    let outputs = h.input(WalInput::AppendMany {
        id: AppendId(3),
        sizes: vec![4, 4, 4],
        fill,
    });
    assert_eq!(
        outputs,
        vec![failed(
            3,
            AppendError::Fill {
                index: 1,
                error: FillError::Failed("encoder refused".into())
            }
        )]
    );
    assert_eq!(h.wal.next_seq(), Seq(2), "seq 2 is given back");
    h.append(4, b"dddd");
    let second = one_io(h.complete(&first)[2..].to_vec());
    assert_eq!(
        second,
        request(2, 0, flush_ops(SEG0, 24, frames(1, &[b"bbbb", b"dddd"])))
    );
    assert_eq!(
        h.complete(&second),
        vec![done(2, 1, 2), done(4, 2, 3), durable(3)]
    );
}

#[test]
fn a_panicking_fill_is_a_fill_error_and_withdraws_the_batch() {
    let mut h = Harness::ready(small_config());
    let fill: FillFn = Box::new(|index, out| {
        assert!(index == 0, "fill panics on record {index}");
        out.fill(b'x');
        Ok(())
    });
    let outputs = h.input(WalInput::AppendMany {
        id: AppendId(1),
        sizes: vec![4, 4],
        fill,
    });
    assert_eq!(
        outputs,
        vec![failed(
            1,
            AppendError::Fill {
                index: 1,
                error: FillError::Panicked
            }
        )]
    );
    assert_eq!(h.wal.next_seq(), Seq(0));
    assert_eq!(h.wal.unflushed_bytes(), 0);
}

#[test]
fn a_fill_failing_after_a_roll_keeps_the_records_synced_before_the_roll() {
    let mut h = Harness::ready(small_config());
    two_frames_durable(&mut h);
    let (c, d) = (payload(b'c', 50), payload(b'd', 50));
    let fill: FillFn = Box::new(move |index, out| match index {
        0 => {
            out.copy_from_slice(&c);
            Ok(())
        }
        1 => {
            out.copy_from_slice(&d);
            Ok(())
        }
        _ => Err(FillError::Failed("late".into())),
    });
    let outputs = h.input(WalInput::AppendMany {
        id: AppendId(3),
        sizes: vec![50, 50, 50],
        fill,
    });
    let pre_roll = request(3, 0, flush_ops(SEG0, 140, frames(2, &[&payload(b'c', 50)])));
    assert_eq!(
        outputs,
        vec![
            failed(
                3,
                AppendError::Fill {
                    index: 2,
                    error: FillError::Failed("late".into())
                }
            ),
            WalOutput::Io(pre_roll.clone()),
        ]
    );
    assert_eq!(
        h.wal.next_seq(),
        Seq(3),
        "record 3 (after the roll) is withdrawn, record 2 stays"
    );
    let roll = one_io(h.complete(&pre_roll)[1..].to_vec());
    assert_eq!(h.complete(&roll), vec![], "nothing staged after the roll");
    let next = one_io(h.append(4, b"ffff"));
    assert_eq!(
        next,
        request(5, 0, flush_ops(&seg_path(3), 0, frames(3, &[b"ffff"])))
    );
}

#[test]
fn a_failed_write_fails_every_caller_in_the_batch_and_latches() {
    let mut h = Harness::ready(small_config());
    let first = one_io(h.append(1, b"aaaa"));
    h.append(2, b"bbbb");
    h.append(3, b"cccc");
    let second = one_io(h.complete(&first)[2..].to_vec());
    let outputs = h.fail(&second, 0, IoFault::NoSpace);
    assert_eq!(
        outputs,
        vec![
            WalOutput::Latched {
                fault: IoFault::NoSpace
            },
            failed(2, AppendError::Disk(IoFault::NoSpace)),
            failed(3, AppendError::Disk(IoFault::NoSpace)),
        ]
    );
    assert!(h.wal.is_latched());
    assert_eq!(h.wal.durable_next_seq(), Seq(1));
    assert_eq!(
        h.append(4, b"dddd"),
        vec![failed(4, AppendError::Disk(IoFault::NoSpace))]
    );
    assert_eq!(
        h.append_many(5, &[b"eeee"]),
        vec![failed(5, AppendError::Disk(IoFault::NoSpace))]
    );
}

#[test]
fn a_failed_fsync_latches_fails_what_waits_behind_it_and_is_never_retried() {
    let mut h = Harness::ready(small_config());
    let first = one_io(h.append(1, b"aaaa"));
    h.append(2, b"bbbb");
    let outputs = h.fail(&first, 1, IoFault::Eio);
    assert_eq!(
        outputs,
        vec![
            WalOutput::Latched {
                fault: IoFault::Eio
            },
            failed(1, AppendError::Disk(IoFault::Eio)),
            failed(2, AppendError::Disk(IoFault::Eio)),
        ]
    );
    assert_eq!(h.wal.poll_timeout(), None);
    assert_eq!(h.at(100).input(WalInput::Tick), vec![], "no retry, ever");
    assert_eq!(
        h.append(3, b"cccc"),
        vec![failed(3, AppendError::Disk(IoFault::Eio))]
    );
    assert_eq!(h.wal.latch_fault(), Some(&IoFault::Eio));
}

#[test]
fn a_failed_roll_latches_and_fails_the_batch_waiting_behind_it() {
    let mut h = Harness::ready(small_config());
    two_frames_durable(&mut h);
    let (c, d) = (payload(b'c', 50), payload(b'd', 50));
    let pre_roll = one_io(h.append_many(3, &[&c, &d]));
    let roll = one_io(h.complete(&pre_roll)[1..].to_vec());
    let outputs = h.fail(&roll, 0, IoFault::NoSpace);
    assert_eq!(
        outputs,
        vec![
            WalOutput::Latched {
                fault: IoFault::NoSpace
            },
            failed(3, AppendError::Disk(IoFault::NoSpace)),
        ]
    );
    assert_eq!(
        h.wal.durable_next_seq(),
        Seq(3),
        "the pre-roll record stays durable"
    );
}

#[test]
fn staging_buffers_are_reused_across_group_commits() {
    let mut h = Harness::ready(WalConfig {
        segment_bytes_max: 1 << 20,
        ..small_config()
    });
    let mut in_flight = one_io(h.append(0, b"aaaa"));
    for id in 1..200u64 {
        h.append(id, b"bbbb");
        let outputs = h.complete(&in_flight);
        in_flight = ios(&outputs).pop().expect("the next flush starts");
    }
    assert!(
        h.wal.staging_buffers_created() <= 4,
        "created {} buffers for 200 flushes",
        h.wal.staging_buffers_created()
    );
}
