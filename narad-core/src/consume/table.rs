//! The node's consumer cursors on disk: one table of every partition cursor it owns, written whole
//! to one of two slot files in turn (`consumers/cursors.0`, `consumers/cursors.1`).
//!
//! A flush writes the table to the slot not holding the newest good copy, truncates it to length and
//! fsyncs it: one write and one fsync per flush, however many partitions. A torn or lost write fails
//! its checksum and the other slot, the previous good copy, is read instead; a slot is only ever
//! rewritten while the other holds a good copy, and the slots swap only after a flush's fsync
//! succeeded (after a failed fsync the same slot is written again, every byte, so no page the failed
//! fsync dropped is trusted).
//!
//! Format (big-endian): `u32 magic "NCUR" | u8 version 1 | u64 seq | u32 count |
//! count × (u64 topic id | u32 partition | u64 cursor) | u32 CRC32-IEEE of every byte before it`.

use std::collections::BTreeMap;

use super::super::codec::{DecodeError, Reader};
use crate::disk::IoOp;
use crate::ids::{Offset, PartitionId, TopicId};

/// The directory of the slot files.
pub const CURSOR_DIR: &str = "consumers";
/// The two slot files.
pub const SLOTS: [&str; 2] = ["consumers/cursors.0", "consumers/cursors.1"];

const MAGIC: u32 = 0x4e43_5552;
const VERSION: u8 = 1;
const HEADER_BYTES: usize = 4 + 1 + 8 + 4;
const ENTRY_BYTES: usize = 8 + 4 + 8;
/// The most entries a table holds (every partition of 100,000 topics at the 108 cap would not fit,
/// but a node owning that many is far past what it serves); a larger count is a corrupt header.
pub const ENTRIES_MAX: u32 = 4 * 1024 * 1024;

/// A partition's cursor key: the topic incarnation and the partition.
pub type CursorKey = (TopicId, PartitionId);

/// One copy of the table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CursorTable {
    /// Which flush wrote it (the newer good slot wins).
    pub seq: u64,
    /// Every partition's cursor: the lowest offset not acked.
    pub cursors: BTreeMap<CursorKey, Offset>,
}

impl CursorTable {
    /// The slot file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + self.cursors.len() * ENTRY_BYTES + 4);
        out.extend_from_slice(&MAGIC.to_be_bytes());
        out.push(VERSION);
        out.extend_from_slice(&self.seq.to_be_bytes());
        let count = u32::try_from(self.cursors.len()).expect("cursor table within ENTRIES_MAX");
        out.extend_from_slice(&count.to_be_bytes());
        for ((topic, partition), cursor) in &self.cursors {
            out.extend_from_slice(&topic.0.to_be_bytes());
            out.extend_from_slice(&partition.0.to_be_bytes());
            out.extend_from_slice(&cursor.0.to_be_bytes());
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    /// Decodes a slot file's bytes; strict (trailing bytes, a bad checksum, a repeated key are
    /// errors).
    pub fn decode(bytes: &[u8]) -> Result<CursorTable, DecodeError> {
        let Some(body_len) = bytes.len().checked_sub(4) else {
            return Err(DecodeError::Truncated);
        };
        let (body, crc) = bytes.split_at(body_len);
        let mut reader = Reader::new(body);
        if reader.u32()? != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        match reader.u8()? {
            VERSION => {}
            other => return Err(DecodeError::UnknownFormat(other)),
        }
        let seq = reader.u64()?;
        let count = reader.u32()?;
        if count > ENTRIES_MAX {
            return Err(DecodeError::BadLength(u64::from(count)));
        }
        if reader.remaining() != count as usize * ENTRY_BYTES {
            return Err(if reader.remaining() < count as usize * ENTRY_BYTES {
                DecodeError::Truncated
            } else {
                DecodeError::TrailingBytes
            });
        }
        if crc32fast::hash(body).to_be_bytes() != crc {
            return Err(DecodeError::BadChecksum);
        }
        let mut cursors = BTreeMap::new();
        for _ in 0..count {
            let topic = TopicId(reader.u64()?);
            let partition = PartitionId(reader.u32()?);
            let cursor = Offset(reader.u64()?);
            if cursors.insert((topic, partition), cursor).is_some() {
                return Err(DecodeError::BadLength(u64::from(count)));
            }
        }
        reader.finish()?;
        Ok(CursorTable { seq, cursors })
    }
}

/// Which slot holds what, and where the next flush goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CursorSlots {
    /// The newest good copy found (empty when neither slot decodes).
    pub table: CursorTable,
    /// The slot the next flush writes.
    pub next_slot: usize,
}

impl CursorSlots {
    /// Picks the newest good copy of the two slots' contents (`None`: missing or unreadable).
    pub fn recover(slots: [Option<&[u8]>; 2]) -> CursorSlots {
        let decoded = slots.map(|bytes| bytes.and_then(|bytes| CursorTable::decode(bytes).ok()));
        let newest = match &decoded {
            [Some(a), Some(b)] => usize::from(b.seq > a.seq),
            [Some(_), None] => 0,
            [None, Some(_)] => 1,
            [None, None] => {
                return CursorSlots {
                    table: CursorTable::default(),
                    next_slot: 0,
                }
            }
        };
        let [a, b] = decoded;
        let table = if newest == 0 { a } else { b }.expect("the newest slot decoded");
        CursorSlots {
            table,
            next_slot: 1 - newest,
        }
    }

    /// The ops of a flush of `cursors`: the next seq's table written to the next slot, cut to its
    /// length, fsynced. Call [`CursorSlots::flushed`] once they all succeeded.
    pub fn flush_ops(&self, cursors: &BTreeMap<CursorKey, Offset>) -> (CursorTable, Vec<IoOp>) {
        let table = CursorTable {
            seq: self.table.seq + 1,
            cursors: cursors.clone(),
        };
        let bytes = table.encode();
        let path = SLOTS[self.next_slot].to_string();
        let len = bytes.len() as u64;
        let ops = vec![
            IoOp::WriteAt {
                path: path.clone(),
                offset: 0,
                data: bytes,
            },
            IoOp::SetLen {
                path: path.clone(),
                len,
            },
            IoOp::SyncData { path },
        ];
        (table, ops)
    }

    /// A flush of `table` succeeded: it is the newest good copy, and the other slot is next.
    pub fn flushed(&mut self, table: CursorTable) {
        self.table = table;
        self.next_slot = 1 - self.next_slot;
    }
}
