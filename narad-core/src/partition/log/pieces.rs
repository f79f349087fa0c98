//! The scan of one segment read in bounded pieces (see `recovery`): a window of the file's bytes,
//! the scan of its frames, and the search behind damage, each resumed where the last piece ended.
//!
//! The result is exactly that of scanning the whole segment at once: every verdict on a frame is taken
//! only once the bytes it depends on are held (see `segment::settled`), so where the pieces end never
//! shows.

use super::super::segment::{DamageSearch, FrameScanner, SearchStep, SegmentScan};
use super::{FrameDamage, Offset, SkippedDamage};

/// Where the scan of a segment is.
#[derive(Clone, Debug)]
enum Stage {
    /// Scanning frames from byte `origin` (0, or where frames resume behind damage).
    Frames {
        origin: u64,
        scanner: FrameScanner,
    },
    /// Searching behind the damage the scan so far ended at.
    Search(DamageSearch),
    Done,
}

/// The scan of one segment, fed the pieces it asks for.
#[derive(Clone, Debug)]
pub(super) struct PieceScan {
    base: Offset,
    /// The file's length (as measured, or where a short read proved it ends).
    file_len: u64,
    /// Bytes asked of one read, unless a frame needs more.
    piece: usize,
    /// Keep the bytes of the last run (the last segment's, for the rewrite in `finalize`).
    keep_run: bool,
    interval_bytes: u64,
    verify_crc: bool,
    /// The file's bytes `window_start ..` held.
    window: Vec<u8>,
    window_start: u64,
    /// The merged result of the frame scans finished so far, positions from byte 0.
    result: Option<SegmentScan>,
    stage: Stage,
    /// Damage skipped in this segment, in order.
    skipped: Vec<SkippedDamage>,
    /// Zeros from the end of the frames to the end of the file.
    zero_tail: bool,
}

/// A read the scan needs next: `len` bytes at `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PieceRead {
    /// The first byte.
    pub offset: u64,
    /// Bytes asked for (at least one).
    pub len: usize,
}

/// What the scan of a segment found, positions from its byte 0.
#[derive(Clone, Debug)]
pub(super) struct PieceScanDone {
    /// The frames verified, and the damage the scan ended at, if any.
    pub result: SegmentScan,
    /// Damage with verified frames behind it, in order.
    pub skipped: Vec<SkippedDamage>,
    /// Nothing but zeros from the end of the frames to the end of the file.
    pub zero_tail: bool,
    /// The file's length.
    pub file_len: u64,
    /// The bytes of the last run (`result.last_run_start .. result.verified_bytes`), when held.
    pub last_run: Option<Vec<u8>>,
}

impl PieceScan {
    /// The scan of segment `base`, `file_len` bytes long, read `piece` bytes at a time; `keep_run`
    /// for the last segment, whose last run `finalize` writes again.
    pub fn new(
        base: Offset,
        file_len: u64,
        piece: usize,
        keep_run: bool,
        interval_bytes: u64,
        verify_crc: bool,
    ) -> Self {
        PieceScan {
            base,
            file_len,
            piece: piece.max(1),
            keep_run,
            interval_bytes,
            verify_crc,
            window: Vec::new(),
            window_start: 0,
            result: None,
            stage: Stage::Frames {
                origin: 0,
                scanner: FrameScanner::new(base, interval_bytes, verify_crc),
            },
            skipped: Vec::new(),
            zero_tail: false,
        }
    }

    /// Scans as far as the bytes held allow: the read to run next, or `None` when the scan is over.
    pub fn advance(&mut self) -> Option<PieceRead> {
        loop {
            // Each stage moves its position on as it scans: a need counts from where it stopped.
            let need = match &mut self.stage {
                Stage::Frames { origin, scanner } => {
                    let at = *origin + scanner.position();
                    let held = held_from(&self.window, self.window_start, at);
                    match scanner.feed(held, self.file_len - at) {
                        Some(need) => Some((*origin + scanner.position(), need)),
                        None => {
                            self.frames_done();
                            None
                        }
                    }
                }
                Stage::Search(search) => {
                    let at = search.position();
                    let held = held_from(&self.window, self.window_start, at);
                    match search.feed(held, self.file_len - at) {
                        SearchStep::Need(need) => Some((search.position(), need)),
                        step @ (SearchStep::Found(..) | SearchStep::Zeros | SearchStep::Torn) => {
                            self.search_done(step);
                            None
                        }
                    }
                }
                Stage::Done => return None,
            };
            if let Some((at, need)) = need {
                return Some(self.read_for(at, need));
            }
        }
    }

    /// Takes in the bytes a [`PieceRead`] returned. A reply shorter than asked means the file ends
    /// there (a whole read would have returned as much); a longer one is cut to what was asked.
    pub fn on_piece(&mut self, read: PieceRead, mut bytes: Vec<u8>) {
        debug_assert_eq!(read.offset, self.window_start + self.window.len() as u64);
        if bytes.len() < read.len {
            self.file_len = read.offset + bytes.len() as u64;
        }
        bytes.truncate(read.len);
        if self.window.is_empty() {
            self.window = bytes;
        } else {
            self.window.extend_from_slice(&bytes);
        }
    }

    /// The scan's findings, once [`Self::advance`] returned `None`.
    pub fn finish(self) -> PieceScanDone {
        let result = match self.result {
            Some(result) => result,
            None => unreachable!("a segment's scan finishes with its frames scanned"),
        };
        let run = result.last_run_start..result.verified_bytes;
        let last_run = (self.keep_run && run.start >= self.window_start)
            .then(|| {
                let from = (run.start - self.window_start) as usize;
                let to = (run.end - self.window_start) as usize;
                self.window.get(from..to).map(<[u8]>::to_vec)
            })
            .flatten();
        PieceScanDone {
            result,
            skipped: self.skipped,
            zero_tail: self.zero_tail,
            file_len: self.file_len,
            last_run,
        }
    }

    /// The read that brings the first `need` bytes from `at` into the window: the bytes before `at`
    /// are dropped (but the last run's, while they fit in a piece), and it asks for a piece, or for
    /// the rest of a frame longer than that.
    fn read_for(&mut self, at: u64, need: usize) -> PieceRead {
        let keep_from = self.keep_from(at);
        let window_end = self.window_start + self.window.len() as u64;
        if keep_from >= window_end {
            self.window.clear();
        } else {
            self.window
                .drain(..(keep_from - self.window_start) as usize);
        }
        self.window_start = keep_from;
        let offset = self.window_start + self.window.len() as u64;
        let wanted = (at + need as u64 - offset).max(self.piece as u64);
        let len = wanted.min(self.file_len - offset) as usize;
        PieceRead { offset, len }
    }

    /// The first byte to hold on to when the scan needs bytes from `at`: the earliest byte the last
    /// run may still start at that is held and within a piece of `at`.
    fn keep_from(&self, at: u64) -> u64 {
        let held = |start: &u64| {
            self.keep_run && *start >= self.window_start && at - *start <= self.piece as u64
        };
        let (earliest, then) = self.run_starts();
        earliest.filter(held).or(then.filter(held)).unwrap_or(at)
    }

    /// Where the last run may start, as far as the scan got: the earliest byte, and the next one
    /// should the run not reach back that far. A scan resumed behind damage whose frames all share
    /// one commit time may continue the run before the damage, or start it where it resumed.
    fn run_starts(&self) -> (Option<u64>, Option<u64>) {
        let before = self.result.as_ref().map(|result| result.last_run_start);
        match &self.stage {
            Stage::Frames { origin, scanner } => match scanner.progress().last_run_start {
                0 => (before.or(Some(*origin)), Some(*origin)),
                start => (Some(origin + start), None),
            },
            Stage::Search(_) => (before, None),
            Stage::Done => (None, None),
        }
    }

    /// A frame scan ended: merges it into the result, then searches behind its damage, if any.
    fn frames_done(&mut self) {
        let Stage::Frames { origin, scanner } = std::mem::replace(&mut self.stage, Stage::Done)
        else {
            unreachable!("frames done while scanning frames")
        };
        let rest = scanner.finish();
        let result = match self.result.take() {
            None => rest,
            Some(result) => merge(result, rest, origin),
        };
        // In any segment: a sealed one may hold damage skipped while it was the last. A tail is a
        // tear unless verified frames lie behind it; then the damaged bytes are skipped and the frames
        // behind them kept (see `segment::verified_frame_behind`).
        if let Some((byte, _)) = result.damage {
            self.stage = Stage::Search(DamageSearch::new(byte, result.end_offset));
        }
        self.result = Some(result);
    }

    /// The search behind damage ended: skips the damage and scans the frames behind it, or ends the
    /// scan (a torn or zero tail).
    fn search_done(&mut self, step: SearchStep) {
        self.stage = Stage::Done;
        let Some(result) = &self.result else {
            unreachable!("a search follows a frame scan")
        };
        match (step, result.damage) {
            (SearchStep::Found(resume, resume_offset), Some((byte, damage))) => {
                self.skip(byte, damage, (result.end_offset, resume_offset));
                self.stage = Stage::Frames {
                    origin: resume,
                    scanner: FrameScanner::new(resume_offset, self.interval_bytes, self.verify_crc),
                };
            }
            // Zeros from where the frames end to the end of the file: the preallocated fill, or an
            // append whose pages never reached the disk. Neither holds a frame.
            (SearchStep::Zeros, _) => self.zero_tail = true,
            _ => {}
        }
    }

    fn skip(&mut self, byte: u64, damage: FrameDamage, offsets: (Offset, Offset)) {
        self.skipped.push(SkippedDamage {
            segment: self.base,
            byte,
            damage,
            offsets,
        });
    }
}

/// The bytes of `window` (the file's from `window_start`) from `at` on: none when `at` is past them.
fn held_from(window: &[u8], window_start: u64, at: u64) -> &[u8] {
    let from = at.saturating_sub(window_start) as usize;
    debug_assert!(at >= window_start, "the window holds the scan's position");
    window.get(from..).unwrap_or(&[])
}

/// `result` continued by `rest`, the scan of the frames from byte `resume`, behind skipped damage.
fn merge(mut result: SegmentScan, rest: SegmentScan, resume: u64) -> SegmentScan {
    result.index.extend_shifted(rest.index, resume);
    result.end_offset = rest.end_offset;
    result.verified_bytes = resume + rest.verified_bytes;
    // The last run may span the damage: frames of one commit time behind it, that of the frames
    // before it. Then the rewrite in `finalize` starts before the damage.
    let spans = rest.last_run_start == 0 && rest.committed_at_ms_max == result.committed_at_ms_max;
    if !spans {
        result.last_run_start = resume + rest.last_run_start;
    }
    result.committed_at_ms_max = result.committed_at_ms_max.max(rest.committed_at_ms_max);
    result.committed_at_ms_first = result.committed_at_ms_first.or(rest.committed_at_ms_first);
    result.damage = rest.damage.map(|(at, damage)| (resume + at, damage));
    result
}
