//! Payloads the simulated clients produce: each carries a unique record id and checks itself.
//!
//! Layout (little endian): `MAGIC` (4 bytes) · id (u64) · body length (u32) · CRC-32 of id and body (u32)
//! · body. The body is a filler derived from the id, so any flipped, torn or spliced byte makes the
//! payload fail [`decode`]: the checker then counts it as a phantom (served, never produced as such).
//! [`scan`] finds every payload inside a raw file image, which is how the harness learns which records
//! a bit-rot fault destroyed.

/// Marks the start of a harness payload.
pub const MAGIC: [u8; 4] = *b"nsim";
/// Bytes before the body.
pub const HEADER_BYTES: usize = 20;

/// Why bytes are not a well-formed payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PayloadError {
    /// Shorter than a header, or than the header says.
    Short,
    /// Does not start with [`MAGIC`].
    NoMagic,
    /// Longer than the header says.
    TrailingBytes,
    /// The checksum or the filler does not match: the bytes were damaged.
    Corrupt,
}

/// Byte `index` of record `id`'s body: [`filler_base`]`(id) ^ FILLER_STEPS[index % 256]`.
#[cfg(test)]
fn filler(id: u64, index: usize) -> u8 {
    (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8 ^ (index as u8).wrapping_mul(31)
}

/// The part of a body byte that depends on the record id.
fn filler_base(id: u64) -> u8 {
    (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
}

/// The part of a body byte that depends on its index (period 256): `(index as u8) * 31`.
const FILLER_STEPS: [u8; 256] = {
    let mut steps = [0u8; 256];
    let mut index = 0;
    while index < 256 {
        steps[index] = (index as u8).wrapping_mul(31);
        index += 1;
    }
    steps
};

/// Whether `body` is record `id`'s filler. Whole 256-byte periods are compared without an early exit
/// (the compiler vectorizes it): the checker decodes every served record, several times a run.
fn filler_matches(id: u64, body: &[u8]) -> bool {
    let base = filler_base(id);
    let diff = body.chunks(FILLER_STEPS.len()).fold(0u8, |acc, chunk| {
        chunk
            .iter()
            .zip(FILLER_STEPS.iter())
            .fold(acc, |acc, (&byte, &step)| acc | (byte ^ step ^ base))
    });
    diff == 0
}

fn checksum(id: u64, body: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&id.to_le_bytes());
    hasher.update(body);
    hasher.finalize()
}

/// The payload of record `id`, `total_bytes` long (or just the header when smaller).
pub fn encode(id: u64, total_bytes: usize) -> Vec<u8> {
    let body_len = total_bytes.saturating_sub(HEADER_BYTES);
    let base = filler_base(id);
    // One buffer: the header with a checksum placeholder, the body, then the checksum in place.
    let mut out = Vec::with_capacity(HEADER_BYTES + body_len);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    while out.len() < HEADER_BYTES + body_len {
        let take = (HEADER_BYTES + body_len - out.len()).min(FILLER_STEPS.len());
        out.extend(FILLER_STEPS[..take].iter().map(|&step| step ^ base));
    }
    let crc = checksum(id, &out[HEADER_BYTES..]);
    out[16..HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
    out
}

/// Reads the header at the start of `bytes`: `(id, total length)`, without checking the body.
fn header(bytes: &[u8]) -> Result<(u64, usize), PayloadError> {
    if bytes.len() < HEADER_BYTES {
        return Err(PayloadError::Short);
    }
    if bytes[..4] != MAGIC {
        return Err(PayloadError::NoMagic);
    }
    let id = u64::from_le_bytes(bytes[4..12].try_into().expect("8 bytes"));
    let body_len = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")) as usize;
    Ok((id, HEADER_BYTES + body_len))
}

/// The record id of a well-formed payload.
pub fn decode(bytes: &[u8]) -> Result<u64, PayloadError> {
    let (id, total) = header(bytes)?;
    if bytes.len() < total {
        return Err(PayloadError::Short);
    }
    if bytes.len() > total {
        return Err(PayloadError::TrailingBytes);
    }
    let stored = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    let body = &bytes[HEADER_BYTES..];
    if stored != checksum(id, body) || !filler_matches(id, body) {
        return Err(PayloadError::Corrupt);
    }
    Ok(id)
}

/// A payload found inside a file image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    /// The record id its header names (the body may be damaged).
    pub id: u64,
    /// Offset of its first byte in the image.
    pub start: u64,
    /// Offset just past its last byte.
    pub end: u64,
}

/// Every well-formed payload in `image`, in file order.
///
/// A damaged one is neither reported (its id may be the damaged part) nor stepped over: a flipped bit
/// in its length field can claim the bytes of the payloads after it, which must still be found. Rot
/// victims are collected from the images before the flip (see the runner's `rot`), so a payload
/// damaged by rot is excused there.
pub fn scan(image: &[u8]) -> Vec<Found> {
    let mut found = Vec::new();
    let mut at = 0;
    while at + HEADER_BYTES <= image.len() {
        if image[at..at + 4] != MAGIC {
            at += 1;
            continue;
        }
        match header(&image[at..]) {
            Ok((id, total))
                if at + total <= image.len() && decode(&image[at..at + total]) == Ok(id) =>
            {
                found.push(Found {
                    id,
                    start: at as u64,
                    end: (at + total) as u64,
                });
                at += total;
            }
            Ok(_) | Err(_) => at += 1,
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_decodes_to_its_id() {
        for size in [0, 20, 21, 100, 4096] {
            let bytes = encode(42, size);
            assert_eq!(bytes.len(), size.max(HEADER_BYTES));
            assert_eq!(decode(&bytes), Ok(42));
        }
    }

    #[test]
    fn the_body_is_the_filler_of_the_id_past_one_period() {
        for id in [0, 1, 42, u64::MAX] {
            let bytes = encode(id, HEADER_BYTES + 600);
            let body = &bytes[HEADER_BYTES..];
            let expected: Vec<u8> = (0..600).map(|index| filler(id, index)).collect();
            assert_eq!(body, &expected[..]);
            assert!(filler_matches(id, body));
            let mut damaged = body.to_vec();
            damaged[517] ^= 0x10;
            assert!(!filler_matches(id, &damaged));
        }
    }

    #[test]
    fn any_flipped_bit_is_detected() {
        let bytes = encode(7, 64);
        for index in 0..bytes.len() {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[index] ^= 1 << bit;
                assert!(decode(&damaged).is_err(), "byte {index} bit {bit}");
            }
        }
    }

    #[test]
    fn truncated_or_extended_payloads_are_rejected() {
        let bytes = encode(7, 64);
        assert_eq!(decode(&bytes[..63]), Err(PayloadError::Short));
        assert_eq!(decode(&bytes[..10]), Err(PayloadError::Short));
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode(&longer), Err(PayloadError::TrailingBytes));
        assert_eq!(decode(&[0u8; 30]), Err(PayloadError::NoMagic));
    }

    #[test]
    fn scan_finds_payloads_behind_one_whose_length_field_rotted() {
        let mut image = encode(5, 30);
        let b = encode(6, 40);
        image.extend_from_slice(&b);
        image.extend_from_slice(&[0; 200]);
        // A flipped bit in payload 5's body length makes it claim payload 6 and beyond.
        image[12] ^= 1 << 7;
        assert_eq!(
            scan(&image),
            vec![Found {
                id: 6,
                start: 30,
                end: 70
            }]
        );
    }

    #[test]
    fn scan_finds_payloads_between_framing_bytes() {
        let mut image = vec![1, 2, 3];
        let a = encode(5, 30);
        let b = encode(6, 20);
        image.extend_from_slice(&a);
        image.extend_from_slice(&[9, 9]);
        image.extend_from_slice(&b);
        assert_eq!(
            scan(&image),
            vec![
                Found {
                    id: 5,
                    start: 3,
                    end: 33
                },
                Found {
                    id: 6,
                    start: 35,
                    end: 55
                }
            ]
        );
    }
}
