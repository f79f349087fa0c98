//! The ingress WAL's formats: the frame around every record, and the produce record (formats 1 and 2).
//!
//! Frame (big-endian, 20-byte header): `u32 magic "NWAL" | u32 len (1..=16 MiB) | u64 seq |
//! u32 CRC32-IEEE(payload) | payload`.
//!
//! Produce record, format 1: `u8 0x01 | u32+topic | u32+key | u32 partition | u64 timestamp_ms |
//! u32+payload`. Format 2 adds `u64 topic_id` after the topic name. An empty key means no key.
//!
//! Prepared-segment trailer (the last 16 bytes of a zero-filled segment made off the append path):
//! `"NWPREP01" | u64 write_limit`, where `write_limit` is the trailer's own offset: frames may only
//! occupy `[0, write_limit)`.

use super::{DecodeError, Reader};
use crate::ids::{PartitionId, Seq, TopicId};

/// `"NWAL"`.
pub const FRAME_MAGIC: u32 = 0x4e57_414c;
/// Bytes before a frame's payload.
pub const FRAME_HEADER_BYTES: usize = 20;
/// The largest payload a frame may carry.
pub const FRAME_PAYLOAD_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Format byte of a record without an incarnation id.
pub const RECORD_FORMAT_1: u8 = 0x01;
/// Format byte of a record with an incarnation id.
pub const RECORD_FORMAT_2: u8 = 0x02;

/// One decoded frame, borrowing its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The record's WAL sequence number.
    pub seq: Seq,
    /// The encoded record.
    pub payload: &'a [u8],
}

impl Frame<'_> {
    /// Bytes the frame occupies on disk.
    pub fn encoded_len(&self) -> usize {
        FRAME_HEADER_BYTES + self.payload.len()
    }
}

/// Appends one frame to `out`. Panics on an empty or oversized payload: callers check sizes first.
pub fn encode_frame(out: &mut Vec<u8>, seq: Seq, payload: &[u8]) {
    assert!(!payload.is_empty() && payload.len() <= FRAME_PAYLOAD_BYTES_MAX);
    out.reserve(FRAME_HEADER_BYTES + payload.len());
    out.extend_from_slice(&FRAME_MAGIC.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&seq.0.to_be_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_be_bytes());
    out.extend_from_slice(payload);
}

/// The 20-byte header of the frame carrying `payload` as `seq`, for writers that fill the payload in
/// place and prepend the header afterwards. Panics on an empty or oversized payload, like [`encode_frame`].
pub fn encode_frame_header(seq: Seq, payload: &[u8]) -> [u8; FRAME_HEADER_BYTES] {
    assert!(!payload.is_empty() && payload.len() <= FRAME_PAYLOAD_BYTES_MAX);
    let mut header = [0u8; FRAME_HEADER_BYTES];
    header[0..4].copy_from_slice(&FRAME_MAGIC.to_be_bytes());
    header[4..8].copy_from_slice(&(payload.len() as u32).to_be_bytes());
    header[8..16].copy_from_slice(&seq.0.to_be_bytes());
    header[16..20].copy_from_slice(&crc32fast::hash(payload).to_be_bytes());
    header
}

/// A frame header whose magic and length are valid (its checksum is not checked yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The record's WAL sequence number.
    pub seq: Seq,
    /// Payload bytes after the header (1..=16 MiB).
    pub len: usize,
    /// CRC32-IEEE of the payload.
    pub crc: u32,
}

impl FrameHeader {
    /// Bytes the whole frame occupies.
    pub fn frame_len(&self) -> usize {
        FRAME_HEADER_BYTES + self.len
    }
}

/// Decodes the header at the start of `bytes`: magic and length checked, payload not read.
pub fn decode_frame_header(bytes: &[u8]) -> Result<FrameHeader, DecodeError> {
    let mut reader = Reader::new(bytes);
    if reader.u32()? != FRAME_MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let len = reader.u32()? as usize;
    if len == 0 || len > FRAME_PAYLOAD_BYTES_MAX {
        return Err(DecodeError::BadLength(len as u64));
    }
    let seq = Seq(reader.u64()?);
    let crc = reader.u32()?;
    Ok(FrameHeader { seq, len, crc })
}

/// Decodes the frame at the start of `bytes` (trailing bytes are the next frames and are allowed).
pub fn decode_frame(bytes: &[u8]) -> Result<Frame<'_>, DecodeError> {
    let header = decode_frame_header(bytes)?;
    let mut reader = Reader::new(&bytes[FRAME_HEADER_BYTES..]);
    let payload = reader.take(header.len)?;
    if crc32fast::hash(payload) != header.crc {
        return Err(DecodeError::BadChecksum);
    }
    Ok(Frame {
        seq: header.seq,
        payload,
    })
}

/// `"NWPREP01"`: the magic that opens the trailer of a prepared (zero-filled) WAL segment.
pub const PREP_TRAILER_MAGIC: [u8; 8] = *b"NWPREP01";
/// Bytes of a prepared segment's trailer: the magic, then the big-endian u64 write limit.
pub const PREP_TRAILER_BYTES: usize = 16;

/// The trailer that ends a prepared segment whose frames may occupy `[0, write_limit)`; the trailer
/// itself sits at `write_limit`, so the file is `write_limit + 16` bytes long.
pub fn encode_prep_trailer(write_limit: u64) -> [u8; PREP_TRAILER_BYTES] {
    let mut trailer = [0u8; PREP_TRAILER_BYTES];
    trailer[..8].copy_from_slice(&PREP_TRAILER_MAGIC);
    trailer[8..].copy_from_slice(&write_limit.to_be_bytes());
    trailer
}

/// Decodes a trailer from exactly 16 bytes and returns its write limit.
pub fn decode_prep_trailer(bytes: &[u8]) -> Result<u64, DecodeError> {
    let mut reader = Reader::new(bytes);
    if reader.take(PREP_TRAILER_MAGIC.len())? != PREP_TRAILER_MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let write_limit = reader.u64()?;
    reader.finish()?;
    Ok(write_limit)
}

/// A produce as the ingress WAL stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceRecord {
    /// Topic name.
    pub topic: String,
    /// The incarnation the payload was validated against; `None` writes format 1.
    pub topic_id: Option<TopicId>,
    /// The key, or `None` for a keyless produce (never an invented key).
    pub key: Option<Vec<u8>>,
    /// Target partition, chosen at accept time.
    pub partition: PartitionId,
    /// Accept time, Unix milliseconds.
    pub timestamp_ms: u64,
    /// The message bytes.
    pub payload: Vec<u8>,
}

impl ProduceRecord {
    /// Bytes [`ProduceRecord::encode`] appends.
    pub fn encoded_len(&self) -> usize {
        1 + 4
            + self.topic.len()
            + if self.topic_id.is_some() { 8 } else { 0 }
            + 4
            + self.key.as_ref().map_or(0, Vec::len)
            + 4
            + 8
            + 4
            + self.payload.len()
    }

    /// Appends the record: format 2 when it has an incarnation id, else format 1.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        let format = if self.topic_id.is_some() {
            RECORD_FORMAT_2
        } else {
            RECORD_FORMAT_1
        };
        out.push(format);
        put_prefixed(out, self.topic.as_bytes());
        if let Some(topic_id) = self.topic_id {
            out.extend_from_slice(&topic_id.0.to_be_bytes());
        }
        put_prefixed(out, self.key.as_deref().unwrap_or(&[]));
        out.extend_from_slice(&self.partition.0.to_be_bytes());
        out.extend_from_slice(&self.timestamp_ms.to_be_bytes());
        put_prefixed(out, &self.payload);
    }

    /// The encoding as a new vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode(&mut out);
        out
    }

    /// Decodes exactly one record (format 1 or 2) from all of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<ProduceRecord, DecodeError> {
        let mut reader = Reader::new(bytes);
        let format = reader.u8()?;
        if format != RECORD_FORMAT_1 && format != RECORD_FORMAT_2 {
            return Err(DecodeError::UnknownFormat(format));
        }
        let topic = std::str::from_utf8(reader.u32_prefixed()?)
            .map_err(|_| DecodeError::NotUtf8)?
            .to_string();
        let topic_id = if format == RECORD_FORMAT_2 {
            Some(TopicId(reader.u64()?))
        } else {
            None
        };
        let key = reader.u32_prefixed()?;
        let key = (!key.is_empty()).then(|| key.to_vec());
        let partition = PartitionId(reader.u32()?);
        let timestamp_ms = reader.u64()?;
        let payload = reader.u32_prefixed()?.to_vec();
        reader.finish()?;
        Ok(ProduceRecord {
            topic,
            topic_id,
            key,
            partition,
            timestamp_ms,
            payload,
        })
    }
}

fn put_prefixed(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(topic_id: Option<TopicId>, key: Option<&[u8]>) -> ProduceRecord {
        ProduceRecord {
            topic: "orders".into(),
            topic_id,
            key: key.map(<[u8]>::to_vec),
            partition: PartitionId(2),
            timestamp_ms: 1_700_000_000_000,
            payload: b"{\"n\":1}".to_vec(),
        }
    }

    #[test]
    fn both_formats_round_trip() {
        for rec in [
            record(None, None),
            record(None, Some(b"k")),
            record(Some(TopicId(9)), None),
            record(Some(TopicId(9)), Some(b"customer-42")),
        ] {
            let bytes = rec.to_bytes();
            assert_eq!(bytes.len(), rec.encoded_len());
            let expected_format = if rec.topic_id.is_some() { 2 } else { 1 };
            assert_eq!(bytes[0], expected_format);
            assert_eq!(ProduceRecord::decode(&bytes), Ok(rec));
        }
    }

    #[test]
    fn format_1_layout_is_the_go_release_layout() {
        let bytes = record(None, Some(b"k")).to_bytes();
        let mut expected = vec![1, 0, 0, 0, 6];
        expected.extend_from_slice(b"orders");
        expected.extend_from_slice(&[0, 0, 0, 1, b'k', 0, 0, 0, 2]);
        expected.extend_from_slice(&1_700_000_000_000u64.to_be_bytes());
        expected.extend_from_slice(&[0, 0, 0, 7]);
        expected.extend_from_slice(b"{\"n\":1}");
        assert_eq!(bytes, expected);
    }

    #[test]
    fn record_decoder_is_strict() {
        let bytes = record(Some(TopicId(1)), Some(b"k")).to_bytes();
        for cut in 0..bytes.len() {
            assert_eq!(
                ProduceRecord::decode(&bytes[..cut]),
                Err(DecodeError::Truncated)
            );
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert_eq!(
            ProduceRecord::decode(&trailing),
            Err(DecodeError::TrailingBytes)
        );
        let mut unknown = bytes;
        unknown[0] = 3;
        assert_eq!(
            ProduceRecord::decode(&unknown),
            Err(DecodeError::UnknownFormat(3))
        );
    }

    #[test]
    fn frame_header_matches_encode_frame() {
        let mut out = Vec::new();
        encode_frame(&mut out, Seq(9), b"abc");
        assert_eq!(
            encode_frame_header(Seq(9), b"abc")[..],
            out[..FRAME_HEADER_BYTES]
        );
        let header = decode_frame_header(&out).unwrap();
        assert_eq!(
            header,
            FrameHeader {
                seq: Seq(9),
                len: 3,
                crc: crc32fast::hash(b"abc")
            }
        );
        assert_eq!(header.frame_len(), out.len());
        assert_eq!(decode_frame_header(&out[..19]), Err(DecodeError::Truncated));
    }

    #[test]
    fn prep_trailer_round_trips_and_is_strict() {
        let trailer = encode_prep_trailer(64 * 1024 * 1024 - 16);
        assert_eq!(&trailer[..8], b"NWPREP01");
        assert_eq!(decode_prep_trailer(&trailer), Ok(64 * 1024 * 1024 - 16));
        assert_eq!(
            decode_prep_trailer(&trailer[..15]),
            Err(DecodeError::Truncated)
        );
        let mut longer = trailer.to_vec();
        longer.push(0);
        assert_eq!(
            decode_prep_trailer(&longer),
            Err(DecodeError::TrailingBytes)
        );
        assert_eq!(decode_prep_trailer(&[0u8; 16]), Err(DecodeError::BadMagic));
    }

    #[test]
    fn frame_round_trips_and_detects_damage() {
        let mut out = Vec::new();
        encode_frame(&mut out, Seq(7), b"payload");
        assert_eq!(out.len(), FRAME_HEADER_BYTES + 7);
        let frame = decode_frame(&out).unwrap();
        assert_eq!((frame.seq, frame.payload), (Seq(7), &b"payload"[..]));
        let mut damaged = out.clone();
        *damaged.last_mut().unwrap() ^= 1;
        assert_eq!(decode_frame(&damaged), Err(DecodeError::BadChecksum));
        assert_eq!(decode_frame(&[0u8; 32]), Err(DecodeError::BadMagic));
        assert_eq!(decode_frame(&out[..10]), Err(DecodeError::Truncated));
    }
}
