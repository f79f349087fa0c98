//! On-disk and on-wire formats. Every decoder is strict and total: truncation, trailing bytes and
//! unknown format bytes are errors, never panics.

pub mod cluster;
pub mod partition;
pub mod wal;

/// Why bytes did not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The input ended inside a field.
    #[error("truncated")]
    Truncated,
    /// Bytes were left after the last field.
    #[error("trailing bytes")]
    TrailingBytes,
    /// The format byte is not one this release reads.
    #[error("unknown format byte {0:#04x}")]
    UnknownFormat(u8),
    /// The magic number is wrong (not a frame, or a zeroed hole).
    #[error("bad magic")]
    BadMagic,
    /// A length field is zero or above its limit.
    #[error("bad length {0}")]
    BadLength(u64),
    /// The checksum does not match the bytes.
    #[error("checksum mismatch")]
    BadChecksum,
    /// A text field is not UTF-8.
    #[error("text is not UTF-8")]
    NotUtf8,
}

/// A cursor over bytes that never panics: every read checks the remaining length.
#[derive(Debug)]
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads from the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.bytes.len()
    }

    /// Takes the next `len` bytes.
    pub fn take(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < len {
            return Err(DecodeError::Truncated);
        }
        let (head, tail) = self.bytes.split_at(len);
        self.bytes = tail;
        Ok(head)
    }

    /// Takes one byte.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    /// Takes a big-endian u32.
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        let bytes = self.take(4)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// Takes a big-endian u64.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        let bytes = self.take(8)?;
        let mut array = [0u8; 8];
        array.copy_from_slice(bytes);
        Ok(u64::from_be_bytes(array))
    }

    /// Takes a u32 length followed by that many bytes.
    pub fn u32_prefixed(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    /// Fails unless every byte was read.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes)
        }
    }
}
