//! The partition log's frame and keyed record envelope.
//!
//! Frame (big-endian, 27-byte header), the layout of the Go release:
//!
//! ```text
//! CA FE | u8 flags | i32 count | i64 base_offset | i32 uncompressed | i32 stored | u32 CRC | records
//! ```
//!
//! - `flags` bits 0–2 name the compression codec; only 0 (none) is written or read here, and every other
//!   bit is reserved (must be 0). With no compression `uncompressed == stored == len(records)`.
//! - `count ≥ 1` records with the dense offsets `base_offset .. base_offset + count`.
//! - The CRC covers header bytes `[2, 23)` (flags through stored length) and then the stored records, so
//!   a damaged count, offset or length is caught as surely as a damaged payload.
//! - `records` is `count` times `[u32 len][record]`, a record being
//!   `0x02 | uvarint key_len | key | u64 committed_at_ms | payload`; `key_len == 0` means no key.
//!
//! **Checksum.** CRC32-IEEE (the `crc32fast` crate, hardware-accelerated, already used by the WAL)
//! rather than the Go release's CRC32C: byte identity with the Go release is not required, and this
//! keeps one checksum implementation in the core. Both are 32-bit CRCs; the choice is per format and
//! recorded here so a reader of old data knows which polynomial to use.
//!
//! The decoder is strict and total: every field is bounds-checked, the record section must hold exactly
//! `count` well-formed records and nothing else, and every failure is a [`DecodeError`], never a panic.

use super::{DecodeError, Reader};
use crate::ids::Offset;

/// The two magic bytes every frame starts with.
pub const FRAME_MAGIC: [u8; 2] = [0xCA, 0xFE];
/// Bytes before a frame's records.
pub const FRAME_HEADER_BYTES: usize = 27;
/// The largest frame, header included (the Go release's cap).
pub const FRAME_BYTES_MAX: usize = 256 * 1024 * 1024;
/// The largest record section a frame may carry.
pub const FRAME_RECORDS_BYTES_MAX: usize = FRAME_BYTES_MAX - FRAME_HEADER_BYTES;
/// The flags value of an uncompressed frame (the only one this release writes or reads).
pub const FLAGS_COMPRESSION_NONE: u8 = 0;
/// Format byte of a keyed record envelope.
pub const RECORD_FORMAT: u8 = 0x02;
/// Bytes of a record's envelope besides its key, payload and key-length varint: format byte and
/// timestamp.
const RECORD_FIXED_BYTES: usize = 1 + 8;
/// Byte range of the header the CRC covers (flags through the stored length).
const CRC_HEADER_RANGE: core::ops::Range<usize> = 2..23;

/// One record as the partition log stores it, borrowing its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// The key, or `None`. An empty key is stored as no key.
    pub key: Option<&'a [u8]>,
    /// Commit time, Unix milliseconds; never decreases along a partition.
    pub committed_at_ms: u64,
    /// The message bytes.
    pub payload: &'a [u8],
}

impl RecordView<'_> {
    /// Bytes the record occupies inside a frame, its `u32` length prefix included.
    pub fn framed_len(&self) -> usize {
        let key_len = self.key.map_or(0, <[u8]>::len);
        4 + RECORD_FIXED_BYTES + uvarint_len(key_len as u64) + key_len + self.payload.len()
    }

    /// An owned copy.
    pub fn to_owned_record(&self) -> PartitionRecord {
        PartitionRecord {
            key: self.key.map(<[u8]>::to_vec),
            committed_at_ms: self.committed_at_ms,
            payload: self.payload.to_vec(),
        }
    }
}

/// One record, owned (what reads hand out).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionRecord {
    /// The key, or `None`. Never `Some` of an empty key.
    pub key: Option<Vec<u8>>,
    /// Commit time, Unix milliseconds.
    pub committed_at_ms: u64,
    /// The message bytes.
    pub payload: Vec<u8>,
}

/// A frame's header fields, validated except for the checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Records in the frame (≥ 1).
    pub count: u32,
    /// Offset of the frame's first record.
    pub base_offset: Offset,
    /// Bytes of the record section.
    pub records_bytes: u32,
    /// The stored checksum.
    pub crc: u32,
}

impl FrameHeader {
    /// Bytes the whole frame occupies.
    pub fn frame_len(&self) -> usize {
        FRAME_HEADER_BYTES + self.records_bytes as usize
    }

    /// The offset after the frame's last record.
    pub fn end_offset(&self) -> Offset {
        Offset(self.base_offset.0 + u64::from(self.count))
    }
}

/// One decoded, checksum-verified frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The validated header.
    pub header: FrameHeader,
    /// The records, in offset order (`header.count` of them).
    pub records: Vec<RecordView<'a>>,
}

/// Bytes a frame holding `records` occupies.
pub fn frame_len(records: &[RecordView<'_>]) -> usize {
    FRAME_HEADER_BYTES + records.iter().map(RecordView::framed_len).sum::<usize>()
}

/// Appends one frame holding `records` at `base_offset` to `out`.
///
/// Panics on an empty or oversized frame or an offset past `i64::MAX`: callers size frames first
/// (programmer errors, not operating errors).
pub fn encode_frame(out: &mut Vec<u8>, base_offset: Offset, records: &[RecordView<'_>]) {
    let records_bytes: usize = records.iter().map(RecordView::framed_len).sum();
    assert!(!records.is_empty(), "a frame holds at least one record");
    assert!(records.len() <= i32::MAX as usize, "too many records");
    assert!(records_bytes <= FRAME_RECORDS_BYTES_MAX, "frame too large");
    assert!(
        base_offset.0 + records.len() as u64 <= i64::MAX as u64,
        "offset out of range"
    );
    let start = out.len();
    out.reserve(FRAME_HEADER_BYTES + records_bytes);
    out.extend_from_slice(&FRAME_MAGIC);
    out.push(FLAGS_COMPRESSION_NONE);
    out.extend_from_slice(&(records.len() as u32).to_be_bytes());
    out.extend_from_slice(&base_offset.0.to_be_bytes());
    out.extend_from_slice(&(records_bytes as u32).to_be_bytes());
    out.extend_from_slice(&(records_bytes as u32).to_be_bytes());
    let crc_at = out.len();
    out.extend_from_slice(&[0; 4]);
    for record in records {
        let key = record.key.unwrap_or(&[]);
        let len = record.framed_len() - 4;
        out.extend_from_slice(&(len as u32).to_be_bytes());
        out.push(RECORD_FORMAT);
        put_uvarint(out, key.len() as u64);
        out.extend_from_slice(key);
        out.extend_from_slice(&record.committed_at_ms.to_be_bytes());
        out.extend_from_slice(record.payload);
    }
    let crc = frame_crc(
        &out[start + CRC_HEADER_RANGE.start..start + CRC_HEADER_RANGE.end],
        &out[start + FRAME_HEADER_BYTES..],
    );
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_be_bytes());
}

fn frame_crc(header_part: &[u8], records: &[u8]) -> u32 {
    // `Hasher::new` looks up the CPU's CRC instructions each time: done once, then cloned per frame.
    static FRESH: std::sync::OnceLock<crc32fast::Hasher> = std::sync::OnceLock::new();
    let mut hasher = FRESH.get_or_init(crc32fast::Hasher::new).clone();
    hasher.update(header_part);
    hasher.update(records);
    hasher.finalize()
}

/// Decodes and validates the header at the start of `bytes` (which may hold only the header).
///
/// Tells a reader how long the frame is before it has all of it; the checksum is not verified here.
pub fn decode_header(bytes: &[u8]) -> Result<FrameHeader, DecodeError> {
    let mut reader = Reader::new(bytes);
    if reader.take(2)? != FRAME_MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let flags = reader.u8()?;
    if flags != FLAGS_COMPRESSION_NONE {
        return Err(DecodeError::UnknownFormat(flags));
    }
    let count = reader.u32()?;
    if count == 0 || count > i32::MAX as u32 {
        return Err(DecodeError::BadLength(u64::from(count)));
    }
    let base_offset = reader.u64()?;
    if base_offset > i64::MAX as u64 || base_offset + u64::from(count) > i64::MAX as u64 {
        return Err(DecodeError::BadLength(base_offset));
    }
    let uncompressed = reader.u32()?;
    let stored = reader.u32()?;
    if uncompressed != stored || stored as usize > FRAME_RECORDS_BYTES_MAX {
        return Err(DecodeError::BadLength(u64::from(stored)));
    }
    // Every record takes at least its length prefix, envelope and one varint byte.
    if u64::from(stored) < u64::from(count) * (4 + RECORD_FIXED_BYTES as u64 + 1) {
        return Err(DecodeError::BadLength(u64::from(stored)));
    }
    let crc = reader.u32()?;
    Ok(FrameHeader {
        count,
        base_offset: Offset(base_offset),
        records_bytes: stored,
        crc,
    })
}

/// Decodes the frame at the start of `bytes` (trailing bytes are the next frames and are allowed):
/// header, checksum, and exactly `count` well-formed records filling the record section.
pub fn decode_frame(bytes: &[u8]) -> Result<Frame<'_>, DecodeError> {
    decode_frame_checked(bytes, true)
}

/// [`decode_frame`], with the checksum verified only when `verify_crc` (the simulator's planted
/// `skip-readback-crc` bug passes `false`; everything else must verify).
pub fn decode_frame_checked(bytes: &[u8], verify_crc: bool) -> Result<Frame<'_>, DecodeError> {
    let header = decode_header(bytes)?;
    let mut records = Vec::with_capacity(header.count as usize);
    walk_frame(bytes, header, verify_crc, |record| records.push(record))?;
    Ok(Frame { header, records })
}

/// Checks the frame at the start of `bytes` exactly as [`decode_frame_checked`] does (header,
/// checksum when `verify_crc`, exactly `count` well-formed records) without collecting its records:
/// for a verifier that needs only the verdict and the header.
pub fn verify_frame_checked(bytes: &[u8], verify_crc: bool) -> Result<FrameHeader, DecodeError> {
    let header = decode_header(bytes)?;
    walk_frame(bytes, header, verify_crc, |_| {})?;
    Ok(header)
}

/// Checks the frame at the start of `bytes` exactly as [`decode_frame_checked`] does, handing each
/// record to `visit` in order as it is decoded instead of collecting them. A frame that fails may
/// have handed some records on first: a caller keeps what it was handed only on `Ok`.
pub fn visit_frame_checked<'a>(
    bytes: &'a [u8],
    verify_crc: bool,
    visit: impl FnMut(RecordView<'a>),
) -> Result<FrameHeader, DecodeError> {
    let header = decode_header(bytes)?;
    walk_frame(bytes, header, verify_crc, visit)?;
    Ok(header)
}

/// Validates the rest of the frame whose `header` starts `bytes`, handing each record to `visit` as
/// it is decoded (a caller keeps them only once the whole frame validated).
fn walk_frame<'a>(
    bytes: &'a [u8],
    header: FrameHeader,
    verify_crc: bool,
    mut visit: impl FnMut(RecordView<'a>),
) -> Result<(), DecodeError> {
    let frame = bytes
        .get(..header.frame_len())
        .ok_or(DecodeError::Truncated)?;
    let records_bytes = &frame[FRAME_HEADER_BYTES..];
    if verify_crc && frame_crc(&frame[CRC_HEADER_RANGE], records_bytes) != header.crc {
        return Err(DecodeError::BadChecksum);
    }
    let mut reader = Reader::new(records_bytes);
    for _ in 0..header.count {
        visit(decode_record(reader.u32_prefixed()?)?);
    }
    reader.finish()
}

/// Decodes one record envelope from all of `bytes`.
pub fn decode_record(bytes: &[u8]) -> Result<RecordView<'_>, DecodeError> {
    let mut reader = Reader::new(bytes);
    let format = reader.u8()?;
    if format != RECORD_FORMAT {
        return Err(DecodeError::UnknownFormat(format));
    }
    let key_len = take_uvarint(&mut reader)?;
    let key_len = usize::try_from(key_len).map_err(|_| DecodeError::BadLength(key_len))?;
    let key = reader.take(key_len)?;
    let committed_at_ms = reader.u64()?;
    let payload = reader.take(reader.remaining())?;
    Ok(RecordView {
        key: (!key.is_empty()).then_some(key),
        committed_at_ms,
        payload,
    })
}

/// Bytes of `value` as an unsigned LEB128 varint (Go's `binary.PutUvarint`).
fn uvarint_len(mut value: u64) -> usize {
    let mut len = 1;
    while value >= 0x80 {
        value >>= 7;
        len += 1;
    }
    len
}

fn put_uvarint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Reads a canonical uvarint: at most 10 bytes, no overflow, no redundant trailing zero groups.
fn take_uvarint(reader: &mut Reader<'_>) -> Result<u64, DecodeError> {
    let mut value: u64 = 0;
    for index in 0..10u32 {
        let byte = reader.u8()?;
        let group = u64::from(byte & 0x7f);
        if index == 9 && byte > 1 {
            return Err(DecodeError::BadLength(u64::MAX));
        }
        value |= group << (7 * index);
        if byte & 0x80 == 0 {
            if index > 0 && byte == 0 {
                return Err(DecodeError::BadLength(value));
            }
            return Ok(value);
        }
    }
    Err(DecodeError::BadLength(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn sample() -> Vec<RecordView<'static>> {
        vec![
            RecordView {
                key: Some(b"customer-42"),
                committed_at_ms: 1_700_000_000_000,
                payload: b"{\"n\":1}",
            },
            RecordView {
                key: None,
                committed_at_ms: 1_700_000_000_001,
                payload: b"",
            },
        ]
    }

    #[test]
    fn frame_round_trips_with_and_without_keys() {
        let records = sample();
        let mut bytes = Vec::new();
        encode_frame(&mut bytes, Offset(40), &records);
        assert_eq!(bytes.len(), frame_len(&records));
        let frame = decode_frame(&bytes).unwrap();
        assert_eq!(frame.header.base_offset, Offset(40));
        assert_eq!(frame.header.count, 2);
        assert_eq!(frame.header.end_offset(), Offset(42));
        assert_eq!(frame.header.frame_len(), bytes.len());
        assert_eq!(frame.records, records);
    }

    #[test]
    fn layout_is_the_go_release_layout_with_a_crc32_ieee() {
        let records = [RecordView {
            key: Some(b"k"),
            committed_at_ms: 7,
            payload: b"hi",
        }];
        let mut bytes = Vec::new();
        encode_frame(&mut bytes, Offset(5), &records);
        let record = [
            0x02, 1, b'k', 0, 0, 0, 0, 0, 0, 0, 7, b'h', b'i', // envelope
        ];
        let mut expected = vec![0xCA, 0xFE, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5];
        expected.extend_from_slice(&17u32.to_be_bytes());
        expected.extend_from_slice(&17u32.to_be_bytes());
        let mut covered = expected[2..23].to_vec();
        covered.extend_from_slice(&13u32.to_be_bytes());
        covered.extend_from_slice(&record);
        expected.extend_from_slice(&crc32fast::hash(&covered).to_be_bytes());
        expected.extend_from_slice(&13u32.to_be_bytes());
        expected.extend_from_slice(&record);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn an_empty_key_is_stored_as_no_key() {
        let records = [RecordView {
            key: Some(b""),
            committed_at_ms: 1,
            payload: b"x",
        }];
        let mut bytes = Vec::new();
        encode_frame(&mut bytes, Offset(0), &records);
        assert_eq!(decode_frame(&bytes).unwrap().records[0].key, None);
    }

    #[test]
    fn trailing_bytes_after_a_frame_are_the_next_frame() {
        let mut bytes = Vec::new();
        encode_frame(&mut bytes, Offset(0), &sample());
        let first_len = bytes.len();
        encode_frame(&mut bytes, Offset(2), &sample());
        let first = decode_frame(&bytes).unwrap();
        assert_eq!(first.header.frame_len(), first_len);
        let second = decode_frame(&bytes[first_len..]).unwrap();
        assert_eq!(second.header.base_offset, Offset(2));
    }

    #[test]
    fn decoder_names_each_kind_of_damage() {
        let mut good = Vec::new();
        encode_frame(&mut good, Offset(0), &sample());
        let mut bad_magic = good.clone();
        bad_magic[0] = 0;
        assert_eq!(decode_frame(&bad_magic), Err(DecodeError::BadMagic));
        let mut compressed = good.clone();
        compressed[2] = 1;
        assert_eq!(
            decode_frame(&compressed),
            Err(DecodeError::UnknownFormat(1))
        );
        let mut zero_count = good.clone();
        zero_count[3..7].copy_from_slice(&0u32.to_be_bytes());
        assert_eq!(decode_frame(&zero_count), Err(DecodeError::BadLength(0)));
        let mut lengths_differ = good.clone();
        lengths_differ[15..19].copy_from_slice(&1u32.to_be_bytes());
        assert!(matches!(
            decode_frame(&lengths_differ),
            Err(DecodeError::BadLength(_))
        ));
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(decode_frame(&flipped), Err(DecodeError::BadChecksum));
        let mut offset_changed = good.clone();
        offset_changed[14] ^= 1;
        assert_eq!(decode_frame(&offset_changed), Err(DecodeError::BadChecksum));
        assert_eq!(
            decode_frame(&good[..good.len() - 1]),
            Err(DecodeError::Truncated)
        );
        assert_eq!(decode_frame(&good[..10]), Err(DecodeError::Truncated));
        assert_eq!(decode_frame(&[]), Err(DecodeError::Truncated));
        let zeros = vec![0u8; 64];
        assert_eq!(decode_frame(&zeros), Err(DecodeError::BadMagic));
    }

    /// Re-seals a frame whose record section was edited, so structure checks (not the CRC) must catch it.
    fn reseal(frame: &mut [u8]) {
        let crc = frame_crc(&frame[CRC_HEADER_RANGE], &frame[FRAME_HEADER_BYTES..]);
        frame[23..27].copy_from_slice(&crc.to_be_bytes());
    }

    #[test]
    fn record_section_must_hold_exactly_count_well_formed_records() {
        let records = [RecordView {
            key: None,
            committed_at_ms: 3,
            payload: b"abc",
        }];
        let mut good = Vec::new();
        encode_frame(&mut good, Offset(0), &records);
        let mut wrong_format = good.clone();
        wrong_format[FRAME_HEADER_BYTES + 4] = 0x01;
        reseal(&mut wrong_format);
        assert_eq!(
            decode_frame(&wrong_format),
            Err(DecodeError::UnknownFormat(1))
        );
        let mut key_overruns = good.clone();
        key_overruns[FRAME_HEADER_BYTES + 5] = 100;
        reseal(&mut key_overruns);
        assert_eq!(decode_frame(&key_overruns), Err(DecodeError::Truncated));
        let mut record_len_short = good.clone();
        record_len_short[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + 4]
            .copy_from_slice(&5u32.to_be_bytes());
        reseal(&mut record_len_short);
        assert_eq!(decode_frame(&record_len_short), Err(DecodeError::Truncated));
        let mut count_too_high = good.clone();
        count_too_high[3..7].copy_from_slice(&2u32.to_be_bytes());
        reseal(&mut count_too_high);
        assert!(decode_frame(&count_too_high).is_err());
    }

    #[test]
    fn uvarint_is_canonical_and_bounded() {
        for value in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut bytes = Vec::new();
            put_uvarint(&mut bytes, value);
            assert_eq!(bytes.len(), uvarint_len(value));
            let mut reader = Reader::new(&bytes);
            assert_eq!(take_uvarint(&mut reader), Ok(value));
            reader.finish().unwrap();
        }
        let overlong = [0x80, 0x00];
        assert!(take_uvarint(&mut Reader::new(&overlong)).is_err());
        let too_long = [0xff; 11];
        assert!(take_uvarint(&mut Reader::new(&too_long)).is_err());
        let overflow = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        assert!(take_uvarint(&mut Reader::new(&overflow)).is_err());
    }

    fn seeds() -> u64 {
        std::env::var("NARAD_CODEC_SEEDS")
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or(300)
    }

    /// Random bytes and mutated frames never panic the decoder, a mutated frame never decodes to
    /// records other than the ones encoded (a mutation is caught, or it changed nothing), and
    /// verifying or visiting a frame without collecting its records gives decoding's verdict, header
    /// and records.
    #[test]
    fn decoder_is_total_over_random_and_mutated_input() {
        for seed in 0..seeds() {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let random: Vec<u8> = (0..rng.random_range(0..200))
                .map(|_| rng.random())
                .collect();
            assert_eq!(
                verify_frame_checked(&random, true),
                decode_frame(&random).map(|frame| frame.header)
            );
            let _ = decode_header(&random);
            let _ = decode_record(&random);

            let keys: Vec<Vec<u8>> = (0..rng.random_range(1..6))
                .map(|_| (0..rng.random_range(0..20)).map(|_| rng.random()).collect())
                .collect();
            let payloads: Vec<Vec<u8>> = keys
                .iter()
                .map(|_| {
                    (0..rng.random_range(0..300))
                        .map(|_| rng.random())
                        .collect()
                })
                .collect();
            let records: Vec<RecordView<'_>> = keys
                .iter()
                .zip(&payloads)
                .map(|(key, payload)| RecordView {
                    key: (!key.is_empty()).then_some(key.as_slice()),
                    committed_at_ms: rng.random(),
                    payload,
                })
                .collect();
            let mut good = Vec::new();
            let base = Offset(rng.random_range(0..1 << 40));
            encode_frame(&mut good, base, &records);
            assert_eq!(
                decode_frame(&good).map(|f| f.records),
                Ok(records.clone()),
                "seed {seed}: rerun with NARAD_CODEC_SEEDS={} cargo test -p narad-core decoder_is_total",
                seed + 1
            );
            for _ in 0..20 {
                let mut mutated = good.clone();
                match rng.random_range(0..3) {
                    0 => {
                        let at = rng.random_range(0..mutated.len());
                        mutated[at] ^= 1 << rng.random_range(0..8);
                    }
                    1 => mutated.truncate(rng.random_range(0..mutated.len())),
                    _ => {
                        let at = rng.random_range(0..mutated.len());
                        mutated[at] = rng.random();
                    }
                }
                assert_eq!(
                    verify_frame_checked(&mutated, true),
                    decode_frame(&mutated).map(|frame| frame.header),
                    "seed {seed}: verifying and decoding disagree; rerun with \
                     NARAD_CODEC_SEEDS={} cargo test -p narad-core decoder_is_total",
                    seed + 1
                );
                let mut visited = Vec::new();
                let verdict = visit_frame_checked(&mutated, true, |record| visited.push(record));
                match decode_frame(&mutated) {
                    Ok(frame) => assert_eq!(
                        (verdict, visited),
                        (Ok(frame.header), frame.records),
                        "seed {seed}: visiting and decoding disagree; rerun with \
                         NARAD_CODEC_SEEDS={} cargo test -p narad-core decoder_is_total",
                        seed + 1
                    ),
                    Err(error) => assert_eq!(verdict, Err(error), "seed {seed}"),
                }
                if let Ok(frame) = decode_frame(&mutated) {
                    assert_eq!(
                        (frame.header.base_offset, frame.records),
                        (base, records.clone()),
                        "seed {seed}: a mutation decoded to different records; rerun with \
                         NARAD_CODEC_SEEDS={} cargo test -p narad-core decoder_is_total",
                        seed + 1
                    );
                }
            }
        }
    }
}
