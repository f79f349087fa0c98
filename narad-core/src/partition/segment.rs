//! Segments of a partition log: file naming, the sparse offset index, and the pure recovery scan.
//!
//! A segment is a file `<20-digit base offset>.log` holding whole frames with dense offsets starting at
//! its base. Recovery is a pure function of a segment's bytes ([`scan_segment`]): the verified prefix is
//! the longest run of frames from byte 0 that decode (magic, header, CRC, records) and whose offsets
//! continue exactly where the previous frame ended.

use crate::codec::partition::{
    decode_header, verify_frame_checked, visit_frame_checked, FRAME_HEADER_BYTES,
};
use crate::codec::DecodeError;
use crate::ids::Offset;

/// Suffix of a segment file name.
pub const SEGMENT_SUFFIX: &str = ".log";
/// Digits of the base offset in a segment file name.
const SEGMENT_NAME_DIGITS: usize = 20;

/// The file name of the segment whose first offset is `base`.
pub fn segment_name(base: Offset) -> String {
    format!("{:020}{SEGMENT_SUFFIX}", base.0)
}

/// The base offset a segment file name encodes, or `None` for any other file (which the log ignores).
pub fn parse_segment_name(name: &str) -> Option<Offset> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != SEGMENT_NAME_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(Offset)
}

/// A sparse map from offsets to byte positions in one segment: one entry per `interval_bytes` of
/// frames (always one for the first frame), so a read scans at most about one interval plus one
/// frame before reaching its offset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SparseIndex {
    /// `(first offset of a frame, byte position of that frame)`, both strictly increasing.
    entries: Vec<(Offset, u64)>,
}

impl SparseIndex {
    /// Notes a frame starting at `position` whose first record is `first`; indexes it when it is the
    /// first frame or at least `interval_bytes` past the last indexed frame.
    ///
    /// Panics when the frame is not past the last indexed one (offset and position): callers note
    /// frames in log order, so the index stays sorted by construction (checked here, once per entry,
    /// rather than by a walk of the whole index after every event).
    pub fn note_frame(&mut self, first: Offset, position: u64, interval_bytes: u64) {
        let due = match self.entries.last() {
            None => true,
            Some(&(last_first, last_position)) => {
                assert!(
                    first > last_first && position > last_position,
                    "frames noted in log order"
                );
                position >= last_position + interval_bytes
            }
        };
        if due {
            self.entries.push((first, position));
        }
    }

    /// Appends the entries of `later`, the index of frames that start `shift` bytes further in the
    /// same segment (recovery resuming behind a rotten frame), all of them past this index's.
    ///
    /// Panics when `later` does not start past this index's last entry (see [`Self::note_frame`]).
    pub fn extend_shifted(&mut self, later: SparseIndex, shift: u64) {
        assert!(later.is_sorted(), "a scan's index is sorted");
        if let (Some(&(last_first, last_position)), Some(&(first, position))) =
            (self.entries.last(), later.entries.first())
        {
            assert!(
                first > last_first && position + shift > last_position,
                "later frames lie behind this index's"
            );
        }
        self.entries.extend(
            later
                .entries
                .into_iter()
                .map(|(first, position)| (first, position + shift)),
        );
    }

    /// The byte position of the last indexed frame starting at or before `offset` (0 when none).
    pub fn position_for(&self, offset: Offset) -> u64 {
        self.entry_for(offset).map_or(0, |(_, position)| position)
    }

    /// The first offset and byte position of the last indexed frame starting at or before `offset`.
    pub fn entry_for(&self, offset: Offset) -> Option<(Offset, u64)> {
        let index = self.entries.partition_point(|&(first, _)| first <= offset);
        index.checked_sub(1).map(|at| self.entries[at])
    }

    /// Entries held (for tests and memory accounting).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no frame is indexed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// True when both offsets and positions strictly increase.
    pub fn is_sorted(&self) -> bool {
        self.entries
            .windows(2)
            .all(|pair| pair[0].0 < pair[1].0 && pair[0].1 < pair[1].1)
    }
}

/// Why the verified prefix of a segment ends before its last byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameDamage {
    /// The bytes there are not a whole, well-formed, checksummed frame (torn, zeroed or rotten).
    #[error("bad frame: {0}")]
    Decode(DecodeError),
    /// A well-formed frame whose offsets do not continue the segment's (a stale or misplaced frame).
    #[error("frame starts at offset {found}, expected {expected}")]
    OffsetGap {
        /// The offset the segment had reached.
        expected: Offset,
        /// The frame's base offset.
        found: Offset,
    },
}

/// What [`scan_segment`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentScan {
    /// The offset after the last verified record (the segment's base when no frame verified).
    pub end_offset: Offset,
    /// Bytes of the verified prefix.
    pub verified_bytes: u64,
    /// Where and why verification stopped, when it stopped before the end of the bytes.
    pub damage: Option<(u64, FrameDamage)>,
    /// The sparse index of the verified frames.
    pub index: SparseIndex,
    /// The largest commit time among verified records.
    pub committed_at_ms_max: Option<u64>,
    /// The first verified record's commit time (commit times never decrease along a partition, so
    /// the oldest record's).
    pub committed_at_ms_first: Option<u64>,
    /// Byte position of the first of the trailing verified frames that share the last frame's commit
    /// time: a superset of the last run written (every frame of a run carries one commit time, and
    /// times never decrease). `verified_bytes` when no frame verified.
    pub last_run_start: u64,
}

/// Scans a segment's bytes from the start: see the module documentation.
pub fn scan_segment(base: Offset, bytes: &[u8], interval_bytes: u64) -> SegmentScan {
    scan_segment_checked(base, bytes, interval_bytes, true)
}

/// [`scan_segment`], verifying checksums only when `verify_crc` (see
/// [`crate::codec::partition::decode_frame_checked`]).
pub fn scan_segment_checked(
    base: Offset,
    bytes: &[u8],
    interval_bytes: u64,
    verify_crc: bool,
) -> SegmentScan {
    let mut scanner = FrameScanner::new(base, interval_bytes, verify_crc);
    // All the bytes to the end: the scan always ends here.
    let need = scanner.feed(bytes, bytes.len() as u64);
    debug_assert_eq!(need, None, "a scan of every byte needs no more");
    scanner.finish()
}

/// Whether `verdict`, got by decoding the frame (or header) at the start of `bytes`, is the verdict all
/// `rest_len` bytes of the file from the same place would give; `Err(n)` when it takes the first `n`
/// of them (more than `bytes` holds) to tell.
///
/// A decoder reads a header's fields in order and then exactly the frame's `frame_len` bytes, so any
/// verdict but `Truncated` already saw every byte it depends on, and `Truncated` stands when the whole
/// frame was there (its records are short) or the header says the frame passes the end of the file.
fn settled<T>(verdict: &Result<T, DecodeError>, bytes: &[u8], rest_len: u64) -> Result<(), usize> {
    if bytes.len() as u64 >= rest_len || !matches!(verdict, Err(DecodeError::Truncated)) {
        return Ok(());
    }
    match decode_header(bytes) {
        Ok(header) if header.frame_len() <= bytes.len() => Ok(()),
        Ok(header) if header.frame_len() as u64 > rest_len => Ok(()),
        Ok(header) => Err(header.frame_len()),
        // The header itself is cut short: `rest_len > bytes.len()`, so this asks for more.
        Err(_) => Err(FRAME_HEADER_BYTES.min(usize::try_from(rest_len).unwrap_or(usize::MAX))),
    }
}

/// [`scan_segment_checked`] fed in pieces: a segment read piece by piece gives exactly the
/// [`SegmentScan`] the whole of it would (recovery holds one piece and a frame, not a segment).
///
/// Positions are relative to where the scan starts (byte 0 of the segment, or where frames resume
/// behind damage).
#[derive(Clone, Debug)]
pub struct FrameScanner {
    scan: SegmentScan,
    /// The first commit time of the last verified frame (starts of runs are where it changes).
    last_run_at_ms: Option<u64>,
    interval_bytes: u64,
    verify_crc: bool,
}

impl FrameScanner {
    /// A scan of frames from offset `base`.
    pub fn new(base: Offset, interval_bytes: u64, verify_crc: bool) -> Self {
        FrameScanner {
            scan: SegmentScan {
                end_offset: base,
                verified_bytes: 0,
                damage: None,
                index: SparseIndex::default(),
                committed_at_ms_max: None,
                committed_at_ms_first: None,
                last_run_start: 0,
            },
            last_run_at_ms: None,
            interval_bytes,
            verify_crc,
        }
    }

    /// Where the next frame starts: the bytes fed next begin here.
    pub fn position(&self) -> u64 {
        self.scan.verified_bytes
    }

    /// The scan so far (its `last_run_start` tells recovery which bytes to keep).
    pub fn progress(&self) -> &SegmentScan {
        &self.scan
    }

    /// Scans the frames in `bytes`, the file's bytes from [`Self::position`], `rest_len` of them to
    /// the end of the file. `None` when the scan is over (damage, or the end of the file); `Some(n)`
    /// when the frame at the (new) position needs its first `n` bytes, more than were fed.
    pub fn feed(&mut self, bytes: &[u8], rest_len: u64) -> Option<usize> {
        let start = self.scan.verified_bytes;
        loop {
            let local = self.scan.verified_bytes - start;
            if local >= rest_len {
                return None;
            }
            let rest = bytes.get(local as usize..).unwrap_or(&[]);
            if let Err(need) = self.next_frame(rest, rest_len - local) {
                return need;
            }
        }
    }

    /// Verifies the frame at the start of `rest`: `Ok` when it was added, else `Err` with what
    /// [`Self::feed`] returns.
    fn next_frame(&mut self, rest: &[u8], rest_len: u64) -> Result<(), Option<usize>> {
        // The first and largest commit time of the frame's records, taken as they are decoded (no
        // record list per frame); used only once the frame verified.
        let mut frame_at_ms: Option<u64> = None;
        let mut frame_max_ms: Option<u64> = None;
        let visited = visit_frame_checked(rest, self.verify_crc, |record| {
            frame_at_ms.get_or_insert(record.committed_at_ms);
            frame_max_ms = frame_max_ms.max(Some(record.committed_at_ms));
        });
        settled(&visited, rest, rest_len).map_err(Some)?;
        let scan = &mut self.scan;
        let position = scan.verified_bytes;
        let header = visited.map_err(|error| {
            scan.damage = Some((position, FrameDamage::Decode(error)));
            None
        })?;
        if header.base_offset != scan.end_offset {
            let damage = FrameDamage::OffsetGap {
                expected: scan.end_offset,
                found: header.base_offset,
            };
            scan.damage = Some((position, damage));
            return Err(None);
        }
        scan.index
            .note_frame(header.base_offset, position, self.interval_bytes);
        scan.committed_at_ms_max = scan.committed_at_ms_max.max(frame_max_ms);
        scan.committed_at_ms_first = scan.committed_at_ms_first.or(frame_at_ms);
        if frame_at_ms != self.last_run_at_ms {
            self.last_run_at_ms = frame_at_ms;
            scan.last_run_start = position;
        }
        scan.end_offset = header.end_offset();
        scan.verified_bytes = position + header.frame_len() as u64;
        Ok(())
    }

    /// The scan's result.
    pub fn finish(self) -> SegmentScan {
        self.scan
    }
}

/// Where verified frames resume behind the damage at byte `damage_at` of a segment: the byte
/// position and base offset of the first CRC-verified frame behind the damage whose offsets continue
/// at or past `end_offset` (the offset the verified prefix reached), or `None` when the damage is a
/// torn tail with nothing verified behind it.
///
/// Every verified frame behind damage is kept, whatever its commit time: recovery cannot tell rot of
/// an acknowledged frame followed by one acknowledged commit from a failed commit's leftovers, and only
/// the first answer is safe. Keeping a failed run's frames serves records that were produced (the
/// dispatcher commits them again: duplicates, which the contract allows) and leaves an unreadable hole;
/// truncating an acknowledged commit would lose it.
///
/// Where the search starts. A frame header at the damage that decodes and continues the prefix
/// (`base_offset == end_offset`) is trusted for the frame's extent: its two length fields must agree,
/// so one flipped bit cannot make a consistent wrong length. Then a frame reaching past the end of the
/// file is a torn append (a crash keeps a prefix of an append; acknowledged runs are synced whole) and
/// nothing is searched, and otherwise the search starts at the frame's end. Only a header that does not
/// decode or continue the prefix makes the search start at the next byte. So bytes inside a frame's
/// payload, which may well hold frames (a payload is anything a producer sent), are never adopted as
/// frames of the log, unless the header covering them is itself damaged. The search slides byte by
/// byte (the frame magic rejects most positions at once) and always verifies checksums.
///
/// [`DamageSearch`] is the same search fed in pieces.
pub fn verified_frame_behind(
    bytes: &[u8],
    damage_at: u64,
    end_offset: Offset,
) -> Option<(u64, Offset)> {
    let held = bytes.get(usize::try_from(damage_at).ok()?..)?;
    match DamageSearch::new(damage_at, end_offset).feed(held, held.len() as u64) {
        SearchStep::Found(position, base_offset) => Some((position, base_offset)),
        SearchStep::Need(_) | SearchStep::Zeros | SearchStep::Torn => None,
    }
}

/// The search of [`verified_frame_behind`], fed the file's bytes in pieces; it also tells whether
/// every byte from the damage to the end of the file is zero (which never holds a frame).
#[derive(Clone, Debug)]
pub struct DamageSearch {
    damage_at: u64,
    end_offset: Offset,
    /// The next byte position to try (the damage itself until its header was looked at).
    position: u64,
    header_checked: bool,
    /// No byte but zeros seen from the damage on.
    zeros: bool,
}

/// What a [`DamageSearch`] fed some bytes found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SearchStep {
    /// The first `n` bytes from [`DamageSearch::position`] are needed, more than were fed.
    Need(usize),
    /// A verified frame at this byte position, with this base offset.
    Found(u64, Offset),
    /// Nothing but zeros from the damage to the end of the file.
    Zeros,
    /// No verified frame behind the damage, and not all zeros: a torn tail.
    Torn,
}

impl DamageSearch {
    /// A search behind the damage at byte `damage_at`, for frames at or past `end_offset`.
    pub fn new(damage_at: u64, end_offset: Offset) -> Self {
        DamageSearch {
            damage_at,
            end_offset,
            position: damage_at,
            header_checked: false,
            zeros: true,
        }
    }

    /// Where the bytes fed next begin.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Searches `bytes`, the file's bytes from [`Self::position`], `rest_len` of them to its end.
    pub fn feed(&mut self, bytes: &[u8], rest_len: u64) -> SearchStep {
        let start = self.position;
        let end = start + rest_len;
        if !self.header_checked {
            if let Err(need) = self.check_header(bytes, end) {
                return need;
            }
        }
        while self.position < end {
            let local = (self.position - start) as usize;
            let Some(rest) = bytes.get(local..) else {
                // Behind the frame the header at the damage spans: nothing of it was fed.
                let need = FRAME_HEADER_BYTES as u64;
                return SearchStep::Need(need.min(end - self.position) as usize);
            };
            // A frame starts with its magic, never a zero: a run of zeros (the zero fill) is passed
            // over at once.
            let zeros = rest.iter().take_while(|&&b| b == 0).count();
            if zeros > 0 {
                self.position += zeros as u64;
                continue;
            }
            let verdict = verify_frame_checked(rest, true);
            if let Err(need) = settled(&verdict, rest, end - self.position) {
                return SearchStep::Need(need);
            }
            self.zeros = false;
            match verdict {
                Ok(header) if header.base_offset >= self.end_offset => {
                    return SearchStep::Found(self.position, header.base_offset)
                }
                Ok(_) | Err(_) => self.position += 1,
            }
        }
        if self.zeros {
            SearchStep::Zeros
        } else {
            SearchStep::Torn
        }
    }

    /// Looks at the header at the damage (`bytes` start there); see [`verified_frame_behind`].
    fn check_header(&mut self, bytes: &[u8], end: u64) -> Result<(), SearchStep> {
        let verdict = decode_header(bytes);
        settled(&verdict, bytes, end - self.damage_at).map_err(SearchStep::Need)?;
        self.header_checked = true;
        self.zeros = bytes.first() == Some(&0);
        self.position = self.damage_at + 1;
        if let Ok(header) = verdict {
            if header.base_offset == self.end_offset {
                let frame_end = self.damage_at + header.frame_len() as u64;
                if frame_end > end {
                    return Err(SearchStep::Torn);
                }
                self.position = frame_end;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::partition::{encode_frame, RecordView};

    fn frame(out: &mut Vec<u8>, base: u64, count: usize, at_ms: u64) {
        let records: Vec<RecordView<'_>> = (0..count)
            .map(|_| RecordView {
                key: None,
                committed_at_ms: at_ms,
                payload: b"payload",
            })
            .collect();
        encode_frame(out, Offset(base), &records);
    }

    #[test]
    fn segment_names_are_twenty_digit_base_offsets() {
        assert_eq!(segment_name(Offset(42)), "00000000000000000042.log");
        assert_eq!(
            parse_segment_name("00000000000000000042.log"),
            Some(Offset(42))
        );
        assert_eq!(parse_segment_name("42.log"), None);
        assert_eq!(parse_segment_name("0000000000000000004x.log"), None);
        assert_eq!(parse_segment_name("hwm"), None);
        assert_eq!(parse_segment_name("00000000000000000042.log.tmp"), None);
    }

    #[test]
    fn scan_of_clean_frames_verifies_everything() {
        let mut bytes = Vec::new();
        frame(&mut bytes, 10, 3, 5);
        frame(&mut bytes, 13, 2, 9);
        let scan = scan_segment(Offset(10), &bytes, 4096);
        assert_eq!(scan.end_offset, Offset(15));
        assert_eq!(scan.verified_bytes, bytes.len() as u64);
        assert_eq!(scan.damage, None);
        assert_eq!(scan.committed_at_ms_max, Some(9));
        assert_eq!(scan.index.len(), 1);
        assert_eq!(
            scan.last_run_start,
            frame_len_of(10, 3),
            "the frame stamped 9 starts the last run"
        );
    }

    fn frame_len_of(base: u64, count: usize) -> u64 {
        let mut bytes = Vec::new();
        frame(&mut bytes, base, count, 0);
        bytes.len() as u64
    }

    #[test]
    fn the_last_run_covers_every_trailing_frame_with_the_last_commit_time() {
        let mut bytes = Vec::new();
        frame(&mut bytes, 0, 1, 5);
        let first = bytes.len() as u64;
        frame(&mut bytes, 1, 1, 6);
        frame(&mut bytes, 2, 1, 6);
        let scan = scan_segment(Offset(0), &bytes, 4096);
        assert_eq!(scan.last_run_start, first);
        assert_eq!(scan_segment(Offset(0), &[], 4096).last_run_start, 0);
    }

    #[test]
    fn scan_stops_at_a_torn_frame() {
        let mut bytes = Vec::new();
        frame(&mut bytes, 0, 1, 1);
        let first = bytes.len();
        frame(&mut bytes, 1, 1, 1);
        bytes.truncate(bytes.len() - 3);
        let scan = scan_segment(Offset(0), &bytes, 4096);
        assert_eq!(scan.end_offset, Offset(1));
        assert_eq!(scan.verified_bytes, first as u64);
        assert_eq!(
            scan.damage,
            Some((first as u64, FrameDamage::Decode(DecodeError::Truncated)))
        );
    }

    #[test]
    fn scan_stops_at_a_valid_frame_with_the_wrong_offset() {
        let mut bytes = Vec::new();
        frame(&mut bytes, 0, 2, 1);
        let first = bytes.len();
        frame(&mut bytes, 7, 1, 1);
        let scan = scan_segment(Offset(0), &bytes, 4096);
        assert_eq!(scan.end_offset, Offset(2));
        assert_eq!(
            scan.damage,
            Some((
                first as u64,
                FrameDamage::OffsetGap {
                    expected: Offset(2),
                    found: Offset(7)
                }
            ))
        );
    }

    #[test]
    fn scan_stops_at_zeros_and_at_rot() {
        let mut bytes = Vec::new();
        frame(&mut bytes, 0, 1, 1);
        let first = bytes.len();
        bytes.extend_from_slice(&[0u8; 100]);
        let scan = scan_segment(Offset(0), &bytes, 4096);
        assert_eq!(
            scan.damage,
            Some((first as u64, FrameDamage::Decode(DecodeError::BadMagic)))
        );
        let mut rotten = Vec::new();
        frame(&mut rotten, 0, 1, 1);
        *rotten.last_mut().unwrap() ^= 4;
        let scan = scan_segment(Offset(0), &rotten, 4096);
        assert_eq!(scan.verified_bytes, 0);
        assert_eq!(scan.end_offset, Offset(0));
        assert_eq!(
            scan.damage,
            Some((0, FrameDamage::Decode(DecodeError::BadChecksum)))
        );
    }

    #[test]
    #[should_panic(expected = "frames noted in log order")]
    fn sparse_index_refuses_a_frame_at_or_before_the_last_indexed_offset() {
        let mut index = SparseIndex::default();
        index.note_frame(Offset(5), 0, 100);
        index.note_frame(Offset(5), 200, 100);
    }

    #[test]
    #[should_panic(expected = "later frames lie behind this index's")]
    fn sparse_index_refuses_to_extend_with_frames_before_its_own() {
        let mut index = SparseIndex::default();
        index.note_frame(Offset(10), 0, 100);
        let mut earlier = SparseIndex::default();
        earlier.note_frame(Offset(3), 0, 100);
        index.extend_shifted(earlier, 50);
    }

    #[test]
    fn sparse_index_keeps_one_entry_per_interval() {
        let mut index = SparseIndex::default();
        index.note_frame(Offset(0), 0, 100);
        index.note_frame(Offset(5), 60, 100);
        index.note_frame(Offset(9), 120, 100);
        index.note_frame(Offset(12), 200, 100);
        index.note_frame(Offset(20), 260, 100);
        assert_eq!(index.len(), 3);
        assert!(index.is_sorted());
        assert_eq!(index.position_for(Offset(0)), 0);
        assert_eq!(index.position_for(Offset(8)), 0);
        assert_eq!(index.position_for(Offset(9)), 120);
        assert_eq!(index.position_for(Offset(19)), 120);
        assert_eq!(index.position_for(Offset(20)), 260);
        assert_eq!(index.position_for(Offset(1_000)), 260);
    }
}
