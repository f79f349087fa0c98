//! Segment preparation: the spare, the rename at roll, runs, trims, failures.

use super::*;
use crate::codec::wal::encode_prep_trailer;

const PREP: &str = "wal/next-segment.prep";

fn prealloc_config() -> WalConfig {
    WalConfig {
        prealloc: true,
        ..small_config()
    }
}

fn prep_request(id: u64) -> IoRequest {
    request(
        id,
        1,
        vec![
            IoOp::Create { path: PREP.into() },
            IoOp::WriteZeros {
                path: PREP.into(),
                offset: 0,
                len: 240,
            },
            IoOp::WriteAt {
                path: PREP.into(),
                offset: 240,
                data: encode_prep_trailer(240).to_vec(),
            },
            IoOp::SyncData { path: PREP.into() },
        ],
    )
}

/// Appends one 70-byte frame and completes its flush; returns the request ids seen on the way.
fn append_durably(h: &mut Harness, id: u64) {
    let outputs = h.append(id, &payload(id as u8, 50));
    for request in ios(&outputs) {
        if request.lane == IoLane(0) {
            let outputs = h.complete(&request);
            assert!(ios(&outputs).is_empty(), "{outputs:?}");
        }
    }
}

#[test]
fn the_spare_is_prepared_once_the_active_segment_is_half_full() {
    let mut h = Harness::ready(prealloc_config());
    let first = one_io(h.append(1, &payload(1, 50)));
    assert_eq!(first.lane, IoLane(0), "70 of 256 bytes: no preparation yet");
    h.complete(&first);
    let outputs = h.append(2, &payload(2, 50));
    let flush = request(3, 0, flush_ops(SEG0, 70, frames(1, &[&payload(2, 50)])));
    assert_eq!(
        outputs,
        vec![WalOutput::Io(prep_request(2)), WalOutput::Io(flush)]
    );
    assert_eq!(
        h.wal.bytes_on_disk(),
        70 + 256,
        "the spare counts while it is made"
    );
}

#[test]
fn the_roll_renames_the_ready_spare_into_place_and_the_next_roll_trims_it() {
    let mut h = Harness::ready(prealloc_config());
    append_durably(&mut h, 1);
    let outputs = h.append(2, &payload(2, 50));
    let prep = ios(&outputs)[0].clone();
    assert_eq!(prep, prep_request(2));
    h.complete(&ios(&outputs)[1]);
    assert_eq!(h.complete(&prep), vec![]);
    append_durably(&mut h, 3); // seg0 holds 210 bytes
    let roll = one_io(h.append(4, &payload(4, 50)));
    assert_eq!(
        roll,
        request(
            5,
            0,
            vec![
                IoOp::Rename {
                    from: PREP.into(),
                    to: seg_path(3)
                },
                IoOp::SyncDir { dir: "wal".into() },
            ]
        )
    );
    let flush = one_io(h.complete(&roll));
    assert_eq!(
        flush,
        request(
            6,
            0,
            flush_ops(&seg_path(3), 0, frames(3, &[&payload(4, 50)]))
        )
    );
    assert_eq!(h.complete(&flush), vec![done(4, 3, 4), durable(4)]);
    assert_eq!(
        h.wal.bytes_on_disk(),
        210 + 256,
        "the prepared segment is full length"
    );
    // Half of the prepared segment's 240-byte write limit: prepare the next spare.
    let outputs = h.append(5, &payload(5, 50));
    assert_eq!(ios(&outputs)[0], prep_request(7));
    h.complete(&ios(&outputs)[1]);
    h.complete(&ios(&outputs)[0]);
    append_durably(&mut h, 6); // seg3 holds 210 of 240 bytes
    let roll = one_io(h.append(7, &payload(7, 50)));
    assert_eq!(
        roll,
        request(
            10,
            0,
            vec![
                IoOp::SetLen {
                    path: seg_path(3),
                    len: 210
                },
                IoOp::SyncData { path: seg_path(3) },
                IoOp::Rename {
                    from: PREP.into(),
                    to: seg_path(6)
                },
                IoOp::SyncDir { dir: "wal".into() },
            ]
        )
    );
    h.complete(&roll);
    assert_eq!(
        h.wal.bytes_on_disk(),
        210 + 210 + 256,
        "sealed segments are trimmed to their data"
    );
}

/// Opens a directory holding one clean prepared segment (no frames yet).
fn open_prepared(config: WalConfig) -> Harness {
    let mut recovery = WalRecovery::new(config, Seq(0)).unwrap();
    let names = recovery.plan(&["00000000000000000000.wal".to_string()]);
    let mut bytes = vec![0u8; 240];
    bytes.extend_from_slice(&encode_prep_trailer(240));
    recovery.feed_segment(&names[0], bytes).unwrap();
    let opened = recovery.finish().unwrap();
    let mut h = Harness {
        wal: opened.wal,
        now: Instant::ZERO,
    };
    let repair = one_io(h.drain());
    assert_eq!(
        repair.ops,
        vec![IoOp::SyncDir { dir: "wal".into() }],
        "a clean prepared tail stays as it is"
    );
    h.complete(&repair);
    h
}

#[test]
fn writes_into_a_prepared_segment_go_in_runs_of_whole_frames_each_synced() {
    let mut h = open_prepared(small_config());
    let first = one_io(h.append(1, &payload(1, 20)));
    for id in 2..=5 {
        h.append(id, &payload(id as u8, 20));
    }
    let outputs = h.complete(&first);
    let run1 = frames(1, &[&payload(2, 20), &payload(3, 20), &payload(4, 20)]);
    let run2 = frames(4, &[&payload(5, 20)]);
    let mut ops = flush_ops(SEG0, 40, run1);
    ops.extend(flush_ops(SEG0, 160, run2));
    assert_eq!(outputs[2], WalOutput::Io(request(2, 0, ops)));
}

#[test]
fn a_roll_with_no_spare_ready_creates_an_empty_segment() {
    let mut h = Harness::ready(prealloc_config());
    append_durably(&mut h, 1);
    let outputs = h.append(2, &payload(2, 50));
    h.complete(&ios(&outputs)[1]); // the spare (request 2) is still being made
    append_durably(&mut h, 3);
    let roll = one_io(h.append(4, &payload(4, 50)));
    assert_eq!(
        roll.ops,
        vec![
            IoOp::Create { path: seg_path(3) },
            IoOp::SyncDir { dir: "wal".into() }
        ]
    );
}

#[test]
fn a_failed_preparation_warns_removes_the_spare_and_does_not_latch() {
    let mut h = Harness::ready(prealloc_config());
    append_durably(&mut h, 1);
    let outputs = h.append(2, &payload(2, 50));
    let prep = ios(&outputs)[0].clone();
    h.complete(&ios(&outputs)[1]);
    let outputs = h.fail(&prep, 1, IoFault::NoSpace);
    let cleanup = request(4, 1, vec![IoOp::Remove { path: PREP.into() }]);
    assert_eq!(
        outputs,
        vec![
            WalOutput::Warning(WalWarning::PrepareFailed {
                fault: IoFault::NoSpace
            }),
            WalOutput::Io(cleanup.clone()),
        ]
    );
    assert_eq!(
        h.complete(&cleanup),
        vec![],
        "no second attempt for the same segment"
    );
    assert!(!h.wal.is_latched());
    append_durably(&mut h, 3);
    let roll = one_io(h.append(4, &payload(4, 50)));
    assert_eq!(
        roll.ops,
        vec![
            IoOp::Create { path: seg_path(3) },
            IoOp::SyncDir { dir: "wal".into() }
        ]
    );
}
