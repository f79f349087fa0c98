//! The zero fill after runs: how far it reaches, its trimming at a roll, recovery reading zeros, and
//! failed fills.

use super::*;

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
