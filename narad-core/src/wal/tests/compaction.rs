//! Compaction behind the synced checkpoint, and rotation of a dispatched active segment.

use super::*;

/// Completes every request (and the ones they lead to) on the append lane; returns the other outputs.
fn settle(h: &mut Harness, outputs: Vec<WalOutput>) -> Vec<WalOutput> {
    let mut rest = Vec::new();
    let mut todo = outputs;
    while !todo.is_empty() {
        let mut next = Vec::new();
        for output in todo {
            match output {
                WalOutput::Io(request) if request.lane == IoLane(0) => {
                    next.extend(h.complete(&request))
                }
                other => rest.push(other),
            }
        }
        todo = next;
    }
    rest
}

/// Appends `count` 70-byte records one by one: three per 256-byte segment.
fn fill(h: &mut Harness, count: u64) {
    for id in 0..count {
        let outputs = h.append(id, &payload(id as u8, 50));
        settle(h, outputs);
    }
}

fn remove(first: u64) -> IoOp {
    IoOp::Remove {
        path: seg_path(first),
    }
}

fn sync_dir() -> IoOp {
    IoOp::SyncDir { dir: "wal".into() }
}

#[test]
fn segments_whose_records_are_all_below_the_synced_checkpoint_are_deleted() {
    let mut h = Harness::ready(WalConfig {
        rotate_dispatched_active_after_bytes: 1 << 20,
        ..small_config()
    });
    fill(&mut h, 7); // seg0 [0,3), seg3 [3,6), seg6 [6,7)
    assert_eq!(h.wal.segment_count(), 3);
    let outputs = h.input(WalInput::CheckpointSynced { seq: Seq(4) });
    let compact = request(10, 3, vec![remove(0), sync_dir()]);
    assert_eq!(outputs, vec![WalOutput::Io(compact.clone())]);
    assert_eq!(h.wal.oldest_segment_first_seq(), Seq(3));
    assert_eq!(h.complete(&compact), vec![]);
    assert_eq!(
        h.input(WalInput::CheckpointSynced { seq: Seq(5) }),
        vec![],
        "seg3 still holds seq 5"
    );
}

#[test]
fn the_active_segment_is_never_deleted() {
    let mut h = Harness::ready(WalConfig {
        rotate_dispatched_active_after_bytes: 1 << 20,
        ..small_config()
    });
    fill(&mut h, 7);
    let outputs = h.input(WalInput::CheckpointSynced { seq: Seq(7) });
    assert_eq!(
        outputs,
        vec![WalOutput::Io(request(
            10,
            3,
            vec![remove(0), remove(3), sync_dir()]
        ))]
    );
    assert_eq!(h.wal.segment_count(), 1);
    assert_eq!(h.wal.oldest_segment_first_seq(), Seq(6));
}

#[test]
fn a_fully_dispatched_active_segment_past_the_rotation_size_is_rotated_then_deleted() {
    let mut h = Harness::ready(small_config()); // rotate after 128 bytes
    fill(&mut h, 7);
    let outputs = h.input(WalInput::CheckpointSynced { seq: Seq(7) });
    assert_eq!(
        outputs.len(),
        1,
        "seg6 holds 70 bytes: below the rotation size"
    );
    h.complete(&ios(&outputs)[0]);
    fill(&mut h, 1); // seg6 holds 140 bytes
    let outputs = h.input(WalInput::CheckpointSynced { seq: Seq(7) });
    assert_eq!(outputs, vec![], "seq 7 is not dispatched yet");
    let outputs = h.input(WalInput::CheckpointSynced { seq: Seq(8) });
    let roll = request(12, 0, vec![IoOp::Create { path: seg_path(8) }, sync_dir()]);
    assert_eq!(outputs, vec![WalOutput::Io(roll.clone())]);
    let compact = request(13, 3, vec![remove(6), sync_dir()]);
    assert_eq!(h.complete(&roll), vec![WalOutput::Io(compact)]);
    assert_eq!(h.wal.oldest_segment_first_seq(), Seq(8));
    assert_eq!(
        h.wal.bytes_on_disk(),
        0,
        "the WAL shrinks to one empty segment"
    );
}

#[test]
fn a_failed_deletion_warns_keeps_the_segments_and_retries_at_the_next_checkpoint() {
    let mut h = Harness::ready(WalConfig {
        rotate_dispatched_active_after_bytes: 1 << 20,
        ..small_config()
    });
    fill(&mut h, 7);
    let outputs = h.input(WalInput::CheckpointSynced { seq: Seq(6) });
    let compact = ios(&outputs)[0].clone();
    let outputs = h.fail(&compact, 1, IoFault::Eio);
    assert_eq!(
        outputs,
        vec![WalOutput::Warning(WalWarning::CompactionFailed {
            fault: IoFault::Eio
        })]
    );
    assert_eq!(
        h.wal.oldest_segment_first_seq(),
        Seq(3),
        "seg0 went, seg3 stays"
    );
    assert_eq!(
        h.input(WalInput::CheckpointSynced { seq: Seq(6) }),
        vec![],
        "same value: no retry loop"
    );
    let outputs = h.input(WalInput::CheckpointSynced { seq: Seq(7) });
    assert_eq!(
        outputs,
        vec![WalOutput::Io(request(11, 3, vec![remove(3), sync_dir()]))]
    );
}

#[test]
#[should_panic(expected = "passes the durable frontier")]
fn a_checkpoint_past_the_durable_frontier_is_a_programmer_error() {
    let mut h = Harness::ready(small_config());
    h.input(WalInput::CheckpointSynced { seq: Seq(1) });
}
