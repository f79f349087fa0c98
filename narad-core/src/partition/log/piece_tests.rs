//! Recovery reads segments in bounded pieces: over many random damaged logs it finds exactly what a
//! scan of whole segments finds (report, high watermark, reads, files, the rewrite of the last run),
//! and no read asks for more than a piece or the largest frame.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::pieces::PieceScan;
use super::*;
use crate::codec::partition::{encode_frame, RecordView};
use crate::disk::sim::SimDisk;
use crate::disk::Disk;
use crate::partition::driver::{run_to_idle, HookVerdict, IoHook};

const DIR: &str = "topics/t/p00000";
const NOW: Instant = Instant::ZERO;
const LOGS: u64 = 400;

fn path(base: u64) -> String {
    join(DIR, &segment_name(Offset(base)))
}

/// A log's segment files, as `(base, bytes)`, and the length of its largest frame.
struct Image {
    segments: Vec<(u64, Vec<u8>)>,
    frame_max: usize,
}

/// One frame of `count` random records at `base`: mostly small, now and then larger than a piece.
fn random_frame(rng: &mut ChaCha8Rng, base: u64, count: u64, at_ms: u64) -> Vec<u8> {
    let payloads: Vec<Vec<u8>> = (0..count)
        .map(|_| {
            let len = if rng.random_bool(0.1) {
                rng.random_range(3_000..9_000)
            } else {
                rng.random_range(0..200)
            };
            (0..len).map(|_| rng.random()).collect()
        })
        .collect();
    let records: Vec<RecordView<'_>> = payloads
        .iter()
        .map(|payload| RecordView {
            key: None,
            committed_at_ms: at_ms,
            payload,
        })
        .collect();
    let mut out = Vec::new();
    encode_frame(&mut out, Offset(base), &records);
    out
}

/// A random log of 1 to 3 segments; commit times repeat often, so last runs of many frames occur.
fn random_image(rng: &mut ChaCha8Rng) -> Image {
    let mut image = Image {
        segments: Vec::new(),
        frame_max: 0,
    };
    let (mut offset, mut at_ms) = (0u64, 1u64);
    for _ in 0..rng.random_range(1..=3) {
        let base = offset;
        let mut bytes = Vec::new();
        let mut starts = Vec::new();
        // At least one frame: each segment's base is its own.
        for _ in 0..rng.random_range(1..=12) {
            if rng.random_bool(0.4) {
                at_ms += rng.random_range(1..3);
            }
            let count = rng.random_range(1..=4);
            let frame = random_frame(rng, offset, count, at_ms);
            image.frame_max = image.frame_max.max(frame.len());
            starts.push(bytes.len());
            bytes.extend(frame);
            offset += count;
        }
        for _ in 0..rng.random_range(0..=2) {
            damage(rng, &mut bytes, &starts, &mut image.frame_max);
        }
        image.segments.push((base, bytes));
    }
    image
}

/// One kind of damage: rot (anywhere, or in a header), a tear, zeros at the end or inside, garbage,
/// or a stale frame whose offsets do not continue.
fn damage(rng: &mut ChaCha8Rng, bytes: &mut Vec<u8>, starts: &[usize], frame_max: &mut usize) {
    let len = bytes.len();
    match rng.random_range(0..7) {
        0 if len > 0 => bytes[rng.random_range(0..len)] ^= rng.random_range(1..=255u8),
        1 if !starts.is_empty() => {
            let at = starts[rng.random_range(0..starts.len())] + rng.random_range(0..27);
            if let Some(byte) = bytes.get_mut(at) {
                *byte ^= 1 << rng.random_range(0..8);
            }
        }
        2 if len > 0 => bytes.truncate(rng.random_range(0..len)),
        3 => bytes.resize(len + rng.random_range(1..3_000), 0),
        4 if len > 0 => {
            let from = rng.random_range(0..len);
            let to = rng.random_range(from..=len.min(from + 500));
            bytes[from..to].fill(0);
        }
        5 => bytes.extend((0..rng.random_range(1..300)).map(|_| rng.random::<u8>())),
        6 if !starts.is_empty() => {
            let at = starts[rng.random_range(0..starts.len())].min(len);
            let stale_base = rng.random_range(0..40);
            let stale = random_frame(rng, stale_base, 1, 1);
            *frame_max = (*frame_max).max(stale.len());
            bytes.splice(at..at, stale);
        }
        _ => {}
    }
}

fn write_image(image: &Image) -> SimDisk {
    let disk = SimDisk::new(1);
    disk.create_dir_all(DIR).unwrap();
    for (base, bytes) in &image.segments {
        disk.create(&path(*base)).unwrap();
        disk.write_at(&path(*base), 0, bytes).unwrap();
        disk.sync_data(&path(*base)).unwrap();
    }
    disk.sync_dir(DIR).unwrap();
    disk
}

/// The lengths of the reads and the writes (offset, bytes) the log's requests ran.
#[derive(Default)]
struct Ops {
    read_lens: Vec<usize>,
    writes: Vec<(u64, Vec<u8>)>,
}

impl IoHook for Ops {
    fn before_op(&mut self, _disk: &dyn Disk, request: &IoRequest, index: usize) -> HookVerdict {
        match &request.ops[index] {
            IoOp::ReadAt { len, .. } => self.read_lens.push(*len),
            IoOp::WriteAt { offset, data, .. } => self.writes.push((*offset, data.clone())),
            _ => {}
        }
        HookVerdict::Run
    }
}

/// Everything recovery decided, as seen from outside.
#[derive(Debug, PartialEq, Eq)]
struct Recovered {
    outputs: Vec<LogOutput>,
    high_watermark: Offset,
    /// One read of every offset below the high watermark.
    reads: Vec<LogOutput>,
    /// The segment files' bytes afterwards.
    files: Vec<Option<Vec<u8>>>,
    /// The bytes written again, joined: `(first byte, bytes)`.
    rewrite: Option<(u64, Vec<u8>)>,
}

/// Opens `image` reading `piece` bytes at a time; returns what recovery decided, the lengths of its
/// reads and how many writes it made.
fn recover(image: &Image, piece: usize) -> (Recovered, Vec<usize>, usize) {
    let disk = write_image(image);
    let config = PartitionLogConfig {
        preallocate_bytes: 0,
        index_interval_bytes: 64,
        recovery_read_bytes_max: piece,
        ..PartitionLogConfig::new(DIR)
    };
    let mut log = PartitionLog::open(config);
    let mut ops = Ops::default();
    let outputs = run_to_idle(&mut log, NOW, &disk, &mut ops).unwrap();
    let oldest = log.stats().oldest_offset.0;
    let reads = (oldest..log.high_watermark().0)
        .flat_map(|offset| {
            let request = ReadRequest {
                id: LogReadId(offset),
                offset: Offset(offset),
                records_max: 1,
                bytes_max: 1,
            };
            log.handle(NOW, LogInput::Read(request));
            run_to_idle(&mut log, NOW, &disk, &mut crate::partition::driver::NoHook).unwrap()
        })
        .collect();
    let files = image
        .segments
        .iter()
        .map(|(base, _)| disk.durable_image(&path(*base)))
        .collect();
    let writes = ops.writes.len();
    let recovered = Recovered {
        outputs,
        high_watermark: log.high_watermark(),
        reads,
        files,
        rewrite: joined(ops.writes),
    };
    (recovered, ops.read_lens, writes)
}

/// Writes of consecutive bytes joined into one.
fn joined(writes: Vec<(u64, Vec<u8>)>) -> Option<(u64, Vec<u8>)> {
    let mut writes = writes.into_iter();
    let (start, mut bytes) = writes.next()?;
    for (offset, data) in writes {
        assert_eq!(
            offset,
            start + bytes.len() as u64,
            "the pieces follow each other"
        );
        bytes.extend(data);
    }
    Some((start, bytes))
}

/// How often the interesting cases came up (so the comparison is not vacuous).
#[derive(Debug, Default)]
struct Seen {
    skipped: u32,
    torn: u32,
    zero_tails: u32,
    failed: u32,
    frames_past_a_piece: u32,
    reread_runs: u32,
}

impl Seen {
    fn note(&mut self, recovered: &Recovered, image: &Image, piece: usize, writes: usize) {
        match recovered.outputs.as_slice() {
            [LogOutput::Opened(report)] => {
                self.skipped += u32::from(!report.skipped.is_empty());
                self.torn += u32::from(report.damage.is_some());
                self.zero_tails += u32::from(report.damage.is_none() && report.truncated_bytes > 0);
            }
            _ => self.failed += 1,
        }
        self.frames_past_a_piece += u32::from(image.frame_max > piece);
        self.reread_runs += u32::from(writes > 1);
    }
}

#[test]
fn recovery_in_small_pieces_finds_exactly_what_a_scan_of_whole_segments_finds() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_9ec0);
    let mut seen = Seen::default();
    for case in 0..LOGS {
        let image = random_image(&mut rng);
        let piece = match case % 4 {
            0 => rng.random_range(1..=64),
            _ => rng.random_range(64..=4096),
        };
        let (whole, whole_reads, _) = recover(&image, usize::MAX);
        let (pieces, _, writes) = recover(&image, piece);
        assert_eq!(pieces, whole, "log {case}, pieces of {piece} bytes");
        // Pieces larger than any file: one read of each whole segment, as before pieces.
        let lens: Vec<usize> = image
            .segments
            .iter()
            .map(|(_, bytes)| bytes.len())
            .filter(|&len| len > 0)
            .collect();
        assert!(
            lens.starts_with(&whole_reads),
            "log {case}: {whole_reads:?}"
        );
        seen.note(&pieces, &image, piece, writes);
    }
    assert!(
        seen.skipped > 10
            && seen.torn > 10
            && seen.zero_tails > 10
            && seen.failed > 0
            && seen.frames_past_a_piece > 10
            && seen.reread_runs > 10,
        "{seen:?}"
    );
}

#[test]
fn no_recovery_read_asks_for_more_than_a_piece_or_the_largest_frame() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x0b0d_ed00);
    let mut grown = 0;
    for case in 0..LOGS {
        let image = random_image(&mut rng);
        let piece = rng.random_range(1..=4096);
        let (recovered, read_lens, _) = recover(&image, piece);
        let bound = piece.max(image.frame_max);
        assert!(!recovered.outputs.is_empty());
        for &len in &read_lens {
            assert!(len <= bound, "log {case}: a read of {len} > {bound}");
            grown += usize::from(len > piece);
        }
    }
    assert!(grown > 10, "reads grown to hold a frame: {grown}");
}

#[test]
fn a_last_run_longer_than_a_piece_is_read_again_and_written_back_a_piece_at_a_time() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut bytes = random_frame(&mut rng, 0, 1, 1);
    let run_start = bytes.len() as u64;
    for base in 1..6 {
        bytes.extend(random_frame(&mut rng, base, 1, 2));
    }
    let image = Image {
        segments: vec![(0, bytes.clone())],
        frame_max: 0,
    };
    let piece = 100;
    let disk = write_image(&image);
    let mut log = PartitionLog::open(PartitionLogConfig {
        recovery_read_bytes_max: piece,
        ..PartitionLogConfig::new(DIR)
    });
    let mut requests = Vec::new();
    while let Some(output) = log.poll_output() {
        let LogOutput::Io(request) = output else {
            assert!(matches!(output, LogOutput::Opened(_)), "{output:?}");
            break;
        };
        let completion = crate::disk::execute(&disk, &request);
        requests.push(request.ops);
        log.handle(NOW, LogInput::Io(completion));
    }
    assert_eq!(log.status(), LogStatus::Ready);
    let last = requests.last().unwrap();
    assert!(
        matches!(
            last.as_slice(),
            [
                IoOp::SetLen { .. },
                IoOp::WriteAt { .. },
                IoOp::SyncData { .. },
                IoOp::SyncDir { .. }
            ]
        ),
        "{last:?}"
    );
    let writes: Vec<(u64, Vec<u8>)> = requests
        .iter()
        .flatten()
        .filter_map(|op| match op {
            IoOp::WriteAt { offset, data, .. } => Some((*offset, data.clone())),
            _ => None,
        })
        .collect();
    assert!(writes.iter().all(|(_, data)| data.len() <= piece));
    assert_eq!(
        joined(writes),
        Some((run_start, bytes[run_start as usize..].to_vec()))
    );
}

#[test]
fn a_failed_write_back_of_a_long_last_run_forbids_reopening_and_a_failed_first_read_does_not() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let bytes: Vec<u8> = (0..4)
        .flat_map(|base| random_frame(&mut rng, base, 1, 1))
        .collect();
    let disk = write_image(&Image {
        segments: vec![(0, bytes)],
        frame_max: 0,
    });
    for (fail_at, expected_reopen) in [(0, true), (1, false)] {
        let mut log = PartitionLog::open(PartitionLogConfig {
            recovery_read_bytes_max: 64,
            ..PartitionLogConfig::new(DIR)
        });
        let mut rereads = 0;
        let error = loop {
            match log.poll_output() {
                Some(LogOutput::Io(request)) => {
                    let mut completion = crate::disk::execute(&disk, &request);
                    // The scan's reads are one op each; the run's read again carries the write first.
                    let rereading = log.status() == LogStatus::Opening
                        && matches!(log.phase, Phase::Rewriting(..));
                    if rereading {
                        if rereads == fail_at {
                            completion.result = Err((0, IoFault::Eio));
                        }
                        rereads += 1;
                    }
                    log.handle(NOW, LogInput::Io(completion));
                }
                Some(LogOutput::OpenFailed(error)) => break error,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(error.reopen_allowed(), expected_reopen, "{error:?}");
    }
}

/// The scan of a whole segment as recovery did it before reading in pieces, kept as the oracle.
mod reference {
    use crate::codec::partition::{decode_header, verify_frame_checked, visit_frame_checked};
    use crate::ids::Offset;
    use crate::partition::segment::{FrameDamage, SegmentScan, SparseIndex};

    fn scan(base: Offset, bytes: &[u8], interval_bytes: u64) -> SegmentScan {
        let mut scan = SegmentScan {
            end_offset: base,
            verified_bytes: 0,
            damage: None,
            index: SparseIndex::default(),
            committed_at_ms_max: None,
            committed_at_ms_first: None,
            last_run_start: 0,
        };
        let mut last_run_at_ms: Option<u64> = None;
        let mut position = 0usize;
        while position < bytes.len() {
            let mut frame_at_ms: Option<u64> = None;
            let mut frame_max_ms: Option<u64> = None;
            let visited = visit_frame_checked(&bytes[position..], true, |record| {
                frame_at_ms.get_or_insert(record.committed_at_ms);
                frame_max_ms = frame_max_ms.max(Some(record.committed_at_ms));
            });
            let header = match visited {
                Ok(header) => header,
                Err(error) => {
                    scan.damage = Some((position as u64, FrameDamage::Decode(error)));
                    break;
                }
            };
            if header.base_offset != scan.end_offset {
                let damage = FrameDamage::OffsetGap {
                    expected: scan.end_offset,
                    found: header.base_offset,
                };
                scan.damage = Some((position as u64, damage));
                break;
            }
            scan.index
                .note_frame(header.base_offset, position as u64, interval_bytes);
            scan.committed_at_ms_max = scan.committed_at_ms_max.max(frame_max_ms);
            scan.committed_at_ms_first = scan.committed_at_ms_first.or(frame_at_ms);
            if frame_at_ms != last_run_at_ms {
                last_run_at_ms = frame_at_ms;
                scan.last_run_start = position as u64;
            }
            scan.end_offset = header.end_offset();
            position += header.frame_len();
            scan.verified_bytes = position as u64;
        }
        scan
    }

    fn frame_behind(bytes: &[u8], damage_at: u64, end_offset: Offset) -> Option<(u64, Offset)> {
        let damage_at = usize::try_from(damage_at).ok()?;
        let mut position = damage_at.checked_add(1)?;
        if let Ok(header) = decode_header(bytes.get(damage_at..)?) {
            if header.base_offset == end_offset {
                let frame_end = damage_at.checked_add(header.frame_len())?;
                if frame_end > bytes.len() {
                    return None;
                }
                position = frame_end;
            }
        }
        while position < bytes.len() {
            match verify_frame_checked(&bytes[position..], true) {
                Ok(header) if header.base_offset >= end_offset => {
                    return Some((position as u64, header.base_offset))
                }
                Ok(_) | Err(_) => position += 1,
            }
        }
        None
    }

    /// The scan, the skipped damage `(byte, damage, offsets)` and whether the tail was zeros.
    pub(super) type Found = (SegmentScan, Vec<(u64, FrameDamage, (Offset, Offset))>, bool);

    pub(super) fn scan_whole(base: Offset, bytes: &[u8], interval_bytes: u64) -> Found {
        let mut result = scan(base, bytes, interval_bytes);
        let mut skipped = Vec::new();
        let mut zero_tail = false;
        while let Some((byte, damage)) = result.damage {
            if bytes[byte as usize..].iter().all(|&b| b == 0) {
                zero_tail = true;
                break;
            }
            let Some((resume, resume_offset)) = frame_behind(bytes, byte, result.end_offset) else {
                break;
            };
            skipped.push((byte, damage, (result.end_offset, resume_offset)));
            let rest = scan(resume_offset, &bytes[resume as usize..], interval_bytes);
            result.index.extend_shifted(rest.index, resume);
            result.end_offset = rest.end_offset;
            result.verified_bytes = resume + rest.verified_bytes;
            let spans =
                rest.last_run_start == 0 && rest.committed_at_ms_max == result.committed_at_ms_max;
            if !spans {
                result.last_run_start = resume + rest.last_run_start;
            }
            result.committed_at_ms_max = result.committed_at_ms_max.max(rest.committed_at_ms_max);
            result.committed_at_ms_first =
                result.committed_at_ms_first.or(rest.committed_at_ms_first);
            result.damage = rest.damage.map(|(at, damage)| (resume + at, damage));
        }
        (result, skipped, zero_tail)
    }
}

/// Scans `bytes` as segment 0 in pieces of `piece`, answering each read from them.
fn scan_in_pieces(bytes: &[u8], piece: usize) -> (pieces::PieceScanDone, Vec<usize>) {
    let mut scan = PieceScan::new(Offset(0), bytes.len() as u64, piece, true, 64, true);
    let mut lens = Vec::new();
    while let Some(read) = scan.advance() {
        lens.push(read.len);
        let from = read.offset as usize;
        scan.on_piece(read, bytes[from..from + read.len].to_vec());
    }
    (scan.finish(), lens)
}

#[test]
fn a_segment_scanned_in_pieces_gives_what_the_former_whole_segment_scan_gave() {
    let mut rng = ChaCha8Rng::seed_from_u64(0x01d_5ca4);
    for case in 0..3_000 {
        let image = random_image(&mut rng);
        let (base, bytes) = &image.segments[0];
        assert_eq!(*base, 0);
        let piece = rng.random_range(1..=2048);
        let (done, lens) = scan_in_pieces(bytes, piece);
        let (result, skipped, zero_tail) = reference::scan_whole(Offset(0), bytes, 64);
        let found: Vec<_> = done
            .skipped
            .iter()
            .map(|skip| (skip.byte, skip.damage, skip.offsets))
            .collect();
        let context = format!("case {case}, pieces of {piece}");
        assert_eq!(done.result, result, "{context}");
        assert_eq!((found, done.zero_tail), (skipped, zero_tail), "{context}");
        let run = &bytes[result.last_run_start as usize..result.verified_bytes as usize];
        if let Some(kept) = done.last_run {
            assert_eq!(kept, run, "{context}");
        } else {
            // Dropped only when the scan had to read more than a piece past the run's start.
            let past_run = bytes.len() as u64 - result.last_run_start;
            assert!(
                past_run > piece as u64,
                "{context}: a run within a piece is kept"
            );
        }
        let bound = piece.max(image.frame_max);
        assert!(lens.iter().all(|&len| len <= bound), "{context}: {lens:?}");
    }
}
