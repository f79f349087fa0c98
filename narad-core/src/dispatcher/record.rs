//! A WAL produce record as the dispatcher holds it: the encoded bytes exactly as the WAL returned them,
//! plus the positions of their fields, so nothing is copied between the WAL read and the commit.

use crate::codec::wal::{RECORD_FORMAT_1, RECORD_FORMAT_2};
use crate::codec::{DecodeError, Reader};
use crate::ids::{PartitionId, Seq, TopicId};
use core::ops::Range;

/// One produce record read from the ingress WAL, decoded in place.
///
/// The bytes are the record's encoding (format 1 or 2, as [`crate::codec::wal::ProduceRecord`] writes
/// it); the accessors borrow from them. Decoding is as strict as `ProduceRecord::decode`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchRecord {
    seq: Seq,
    bytes: Vec<u8>,
    topic_id: Option<TopicId>,
    // Offsets into `bytes`; the partition and the timestamp are read from just before the payload's
    // length. Kept small: every queued record is one of these, and queues are where placement writes.
    topic_end: u32,
    key_start: u32,
    payload_start: u32,
}

/// Where the topic name starts: after the format byte and its u32 length.
const TOPIC_START: usize = 5;
const PARTITION_BYTES: usize = 4;
const TIMESTAMP_BYTES: usize = 8;
const PAYLOAD_LEN_BYTES: usize = 4;

impl DispatchRecord {
    /// Decodes the record WAL sequence number `seq` holds, keeping `bytes` as its storage.
    pub fn decode(seq: Seq, bytes: Vec<u8>) -> Result<DispatchRecord, DecodeError> {
        if u32::try_from(bytes.len()).is_err() {
            return Err(DecodeError::BadLength(bytes.len() as u64));
        }
        let total = bytes.len();
        let mut reader = Reader::new(&bytes);
        let format = reader.u8()?;
        if format != RECORD_FORMAT_1 && format != RECORD_FORMAT_2 {
            return Err(DecodeError::UnknownFormat(format));
        }
        let topic = reader.u32_prefixed()?;
        std::str::from_utf8(topic).map_err(|_| DecodeError::NotUtf8)?;
        let topic_end = total - reader.remaining();
        let topic_id = if format == RECORD_FORMAT_2 {
            Some(TopicId(reader.u64()?))
        } else {
            None
        };
        let key_len = reader.u32()? as usize;
        let key_start = total - reader.remaining();
        reader.take(key_len)?;
        reader.u32()?; // partition
        reader.u64()?; // timestamp
        let payload = reader.u32_prefixed()?;
        let payload_start = total - reader.remaining() - payload.len();
        reader.finish()?;
        // Every offset is at most `total`, which fits a u32 (checked above).
        Ok(DispatchRecord {
            seq,
            topic_id,
            topic_end: topic_end as u32,
            key_start: key_start as u32,
            payload_start: payload_start as u32,
            bytes,
        })
    }

    /// The record's WAL sequence number.
    pub fn seq(&self) -> Seq {
        self.seq
    }

    /// The topic name.
    pub fn topic(&self) -> &str {
        // Checked UTF-8 at decode; an error here is impossible, and an empty name is the safe fallback.
        std::str::from_utf8(&self.bytes[TOPIC_START..self.topic_end as usize]).unwrap_or("")
    }

    /// The topic name's bytes.
    pub fn topic_bytes(&self) -> &[u8] {
        &self.bytes[TOPIC_START..self.topic_end as usize]
    }

    /// The incarnation the record was accepted under (format 2), or `None` (format 1).
    pub fn topic_id(&self) -> Option<TopicId> {
        self.topic_id
    }

    /// The key, or `None` for a keyless record.
    pub fn key(&self) -> Option<&[u8]> {
        let range = self.key_range();
        (!range.is_empty()).then(|| &self.bytes[range])
    }

    /// The partition chosen at accept time.
    pub fn partition(&self) -> PartitionId {
        let at =
            self.payload_start as usize - PAYLOAD_LEN_BYTES - TIMESTAMP_BYTES - PARTITION_BYTES;
        PartitionId(u32::from_be_bytes(self.array(at)))
    }

    /// The accept time, Unix milliseconds.
    pub fn timestamp_ms(&self) -> u64 {
        let at = self.payload_start as usize - PAYLOAD_LEN_BYTES - TIMESTAMP_BYTES;
        u64::from_be_bytes(self.array(at))
    }

    /// The message bytes.
    pub fn payload(&self) -> &[u8] {
        &self.bytes[self.payload_start as usize..]
    }

    /// The record's encoding as the WAL stores it.
    pub fn encoded(&self) -> &[u8] {
        &self.bytes
    }

    /// Bytes of the encoding: what the remote commit byte budget counts.
    pub fn encoded_len(&self) -> usize {
        self.bytes.len()
    }

    fn key_range(&self) -> Range<usize> {
        let key_end =
            self.payload_start as usize - PAYLOAD_LEN_BYTES - TIMESTAMP_BYTES - PARTITION_BYTES;
        self.key_start as usize..key_end
    }

    /// The `N` bytes at `at` (inside the record: checked at decode).
    fn array<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut array = [0; N];
        array.copy_from_slice(&self.bytes[at..at + N]);
        array
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::wal::ProduceRecord;

    fn sample(topic_id: Option<TopicId>, key: Option<&[u8]>) -> ProduceRecord {
        ProduceRecord {
            topic: "orders".into(),
            topic_id,
            key: key.map(<[u8]>::to_vec),
            partition: PartitionId(3),
            timestamp_ms: 1_700_000_000_123,
            payload: b"hello".to_vec(),
        }
    }

    #[test]
    fn decodes_both_formats_in_place() {
        for original in [
            sample(None, None),
            sample(Some(TopicId(77)), Some(b"customer-42")),
            sample(Some(TopicId(1)), None),
            sample(None, Some(b"k")),
        ] {
            let record = DispatchRecord::decode(Seq(9), original.to_bytes()).unwrap();
            assert_eq!(record.seq(), Seq(9));
            assert_eq!(record.topic(), "orders");
            assert_eq!(record.topic_bytes(), b"orders");
            assert_eq!(record.topic_id(), original.topic_id);
            assert_eq!(record.key(), original.key.as_deref());
            assert_eq!(record.partition(), PartitionId(3));
            assert_eq!(record.timestamp_ms(), 1_700_000_000_123);
            assert_eq!(record.payload(), b"hello");
            assert!(std::mem::size_of::<DispatchRecord>() <= 64);
            assert_eq!(record.encoded(), original.to_bytes().as_slice());
            assert_eq!(record.encoded_len(), original.encoded_len());
        }
    }

    #[test]
    fn decoding_is_as_strict_as_the_codec() {
        let bytes = sample(Some(TopicId(5)), Some(b"k")).to_bytes();
        for cut in 0..bytes.len() {
            assert_eq!(
                DispatchRecord::decode(Seq(0), bytes[..cut].to_vec()),
                Err(ProduceRecord::decode(&bytes[..cut]).unwrap_err())
            );
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert_eq!(
            DispatchRecord::decode(Seq(0), trailing),
            Err(DecodeError::TrailingBytes)
        );
        let mut unknown = bytes.clone();
        unknown[0] = 3;
        assert_eq!(
            DispatchRecord::decode(Seq(0), unknown),
            Err(DecodeError::UnknownFormat(3))
        );
        let mut not_utf8 = bytes;
        not_utf8[TOPIC_START] = 0xff;
        assert_eq!(
            DispatchRecord::decode(Seq(0), not_utf8),
            Err(DecodeError::NotUtf8)
        );
    }
}
