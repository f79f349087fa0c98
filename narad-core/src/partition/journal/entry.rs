//! The owner journal's entry: one partition frame, named by the partition log directory, segment and
//! byte position it was written to.
//!
//! ```text
//! magic u32 "NJE1" | body_len u32 | crc u32 (CRC32-IEEE of the body)
//! body: dir_len u16 | dir (UTF-8) | segment base u64 | position u64 | frame (a partition-log frame)
//! ```
//! All integers big-endian. The frame keeps its own header and checksum, so a replayed frame is
//! byte for byte what the partition log wrote and what its recovery verifies.

use crate::codec::partition::{decode_header, FRAME_BYTES_MAX};
use crate::ids::Offset;

/// The first four bytes of every entry.
pub const ENTRY_MAGIC: [u8; 4] = *b"NJE1";
/// Bytes before the body.
pub const ENTRY_HEADER_BYTES: usize = 12;
/// The longest directory name an entry may carry.
pub const ENTRY_DIR_BYTES_MAX: usize = 4096;
/// The longest body a decoder accepts (a frame at its maximum, its directory and positions).
pub const ENTRY_BODY_BYTES_MAX: usize = FRAME_BYTES_MAX + ENTRY_DIR_BYTES_MAX + 18;

/// A decoded entry, borrowing the bytes it was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryView<'a> {
    /// The partition log's directory.
    pub dir: &'a str,
    /// The base offset of the partition segment the frame was written to.
    pub segment: Offset,
    /// The frame's byte position in that segment.
    pub position: u64,
    /// The frame's first offset.
    pub base: Offset,
    /// The offset past the frame's last record.
    pub end: Offset,
    /// The frame, whole.
    pub frame: &'a [u8],
}

/// Why bytes do not hold an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryDamage {
    /// The bytes end before the entry does: `needed` bytes from its start would hold it.
    Short {
        /// Bytes needed from the entry's start.
        needed: usize,
    },
    /// Not an entry: bad magic, length, checksum or structure.
    Bad,
}

/// Bytes an entry of `dir` and `frame_len` frame bytes occupies.
pub fn entry_len(dir: &str, frame_len: usize) -> usize {
    ENTRY_HEADER_BYTES + 2 + dir.len() + 16 + frame_len
}

/// Appends one entry to `out`. Panics on a directory name longer than [`ENTRY_DIR_BYTES_MAX`]
/// (partition directories are short by construction).
pub fn encode_entry(out: &mut Vec<u8>, dir: &str, segment: Offset, position: u64, frame: &[u8]) {
    assert!(
        dir.len() <= ENTRY_DIR_BYTES_MAX,
        "journal entry directory too long"
    );
    let body_len = 2 + dir.len() + 16 + frame.len();
    let start = out.len();
    out.reserve(ENTRY_HEADER_BYTES + body_len);
    out.extend_from_slice(&ENTRY_MAGIC);
    out.extend_from_slice(&(body_len as u32).to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    let body = out.len();
    out.extend_from_slice(&(dir.len() as u16).to_be_bytes());
    out.extend_from_slice(dir.as_bytes());
    out.extend_from_slice(&segment.0.to_be_bytes());
    out.extend_from_slice(&position.to_be_bytes());
    out.extend_from_slice(frame);
    let crc = crc32fast::hash(&out[body..]);
    out[start + 8..start + 12].copy_from_slice(&crc.to_be_bytes());
}

/// Decodes the entry at the start of `bytes`; returns it and its length.
pub fn decode_entry(bytes: &[u8]) -> Result<(EntryView<'_>, usize), EntryDamage> {
    let Some(header) = bytes.get(..ENTRY_HEADER_BYTES) else {
        let seen = bytes.len().min(ENTRY_MAGIC.len());
        if bytes[..seen] != ENTRY_MAGIC[..seen] {
            return Err(EntryDamage::Bad);
        }
        return Err(EntryDamage::Short {
            needed: ENTRY_HEADER_BYTES,
        });
    };
    if header[..4] != ENTRY_MAGIC {
        return Err(EntryDamage::Bad);
    }
    let body_len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
    if !(2 + 16..=ENTRY_BODY_BYTES_MAX).contains(&body_len) {
        return Err(EntryDamage::Bad);
    }
    let total = ENTRY_HEADER_BYTES + body_len;
    let Some(body) = bytes.get(ENTRY_HEADER_BYTES..total) else {
        return Err(EntryDamage::Short { needed: total });
    };
    let crc = u32::from_be_bytes([header[8], header[9], header[10], header[11]]);
    if crc32fast::hash(body) != crc {
        return Err(EntryDamage::Bad);
    }
    let dir_len = usize::from(u16::from_be_bytes([body[0], body[1]]));
    let Some(rest) = body.get(2 + dir_len..) else {
        return Err(EntryDamage::Bad);
    };
    let Ok(dir) = std::str::from_utf8(&body[2..2 + dir_len]) else {
        return Err(EntryDamage::Bad);
    };
    if rest.len() < 16 {
        return Err(EntryDamage::Bad);
    }
    let segment = Offset(u64::from_be_bytes(rest[..8].try_into().expect("8 bytes")));
    let position = u64::from_be_bytes(rest[8..16].try_into().expect("8 bytes"));
    let frame = &rest[16..];
    let Ok(frame_header) = decode_header(frame) else {
        return Err(EntryDamage::Bad);
    };
    if frame_header.frame_len() != frame.len() {
        return Err(EntryDamage::Bad);
    }
    let base = frame_header.base_offset;
    let end = Offset(base.0 + u64::from(frame_header.count));
    let view = EntryView {
        dir,
        segment,
        position,
        base,
        end,
        frame,
    };
    Ok((view, total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::partition::{encode_frame, RecordView};

    fn frame(base: u64, payloads: &[&[u8]]) -> Vec<u8> {
        let views: Vec<RecordView<'_>> = payloads
            .iter()
            .map(|payload| RecordView {
                key: None,
                committed_at_ms: 7,
                payload,
            })
            .collect();
        let mut out = Vec::new();
        encode_frame(&mut out, Offset(base), &views);
        out
    }

    #[test]
    fn an_entry_round_trips_and_names_its_offsets() {
        let frame = frame(40, &[b"a", b"bc", b"def"]);
        let mut out = Vec::new();
        encode_entry(&mut out, "topics/t/1/p00000", Offset(32), 4096, &frame);
        assert_eq!(out.len(), entry_len("topics/t/1/p00000", frame.len()));
        let (view, len) = decode_entry(&out).unwrap();
        assert_eq!(len, out.len());
        assert_eq!(view.dir, "topics/t/1/p00000");
        assert_eq!((view.segment, view.position), (Offset(32), 4096));
        assert_eq!((view.base, view.end), (Offset(40), Offset(43)));
        assert_eq!(view.frame, &frame[..]);
    }

    #[test]
    fn a_short_entry_says_how_much_it_needs_and_any_flipped_bit_is_bad() {
        let mut out = Vec::new();
        encode_entry(&mut out, "d", Offset(0), 0, &frame(0, &[b"xyz"]));
        for cut in 0..out.len() {
            assert!(
                matches!(decode_entry(&out[..cut]), Err(EntryDamage::Short { needed }) if needed > cut),
                "cut at {cut}"
            );
        }
        for byte in 0..out.len() {
            let mut bad = out.clone();
            bad[byte] ^= 0x10;
            assert!(decode_entry(&bad).is_err(), "flip at {byte}");
        }
        assert_eq!(decode_entry(&[0u8; 32]), Err(EntryDamage::Bad));
    }
}
