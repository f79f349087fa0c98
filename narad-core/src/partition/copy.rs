//! `CopyWriter`: the files a partition move's destination writes, as I/O to run.
//!
//! # Contract
//! - The destination reads the partition from its source in chunks of visible records (each frame
//!   CRC-checked by the source's read) and hands them here in offset order from the first record
//!   it copies; the writer turns them into the log's own segment files (`<base>.log`, frames of at
//!   most [`COPY_FRAME_BYTES_MAX`], a new segment once one holds `segment_bytes`), keeping every
//!   record's offset and commit time, so the copy is the partition as its owner would have written
//!   it and a record keeps its offset across the move.
//! - [`CopyWriter::finish`] makes the copy durable and checks it: every segment synced, the
//!   directory synced, then every segment read back whole, whose CRC-32 must be that of the bytes
//!   written ([`CopyWriter::verify`]). A copy of no record is one empty segment named by the offset
//!   the log continues at, so the log opened on it starts there, never at 0.
//! - Nothing is decided here about where the chunks come from or when the copy is finished.

use crate::codec::partition::{encode_frame, PartitionRecord, RecordView, FRAME_HEADER_BYTES};
use crate::disk::{join, IoOp, IoReply};
use crate::ids::Offset;
use crate::partition::segment::segment_name;

/// The most bytes one frame of a copy takes (a larger record is a frame of its own), and never more
/// than the copy's segment size.
pub const COPY_FRAME_BYTES_MAX: usize = 1024 * 1024;

/// Why a copy cannot go on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CopyError {
    /// A chunk does not continue where the copy ends.
    #[error("chunk at {got} does not continue the copy at {expected}")]
    Gap {
        /// The offset the copy continues at.
        expected: Offset,
        /// The chunk's first offset.
        got: Offset,
    },
    /// The bytes read back are not the bytes written.
    #[error("segment {segment} of the copy read back with another checksum")]
    ReadBack {
        /// The segment's file name.
        segment: String,
    },
}

#[derive(Clone, Debug)]
struct CopiedSegment {
    base: Offset,
    len: u64,
    crc: crc32fast::Hasher,
    synced: bool,
}

/// The segment files of a copy, as I/O; see the module documentation.
#[derive(Clone, Debug)]
pub struct CopyWriter {
    dir: String,
    segment_bytes: u64,
    segments: Vec<CopiedSegment>,
    next: Option<Offset>,
    bytes: u64,
}

impl CopyWriter {
    /// A copy into `dir` (which must hold nothing), rolling segments at `segment_bytes`.
    pub fn new(dir: String, segment_bytes: u64) -> CopyWriter {
        CopyWriter {
            dir,
            segment_bytes: segment_bytes.max(1),
            segments: Vec::new(),
            next: None,
            bytes: 0,
        }
    }

    /// The offset the next chunk must start at (`None` before the first).
    pub fn next_offset(&self) -> Option<Offset> {
        self.next
    }

    /// Bytes of frames written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The ops that write `records`, the first at offset `first`.
    pub fn append(
        &mut self,
        first: Offset,
        records: &[PartitionRecord],
    ) -> Result<Vec<IoOp>, CopyError> {
        if let Some(expected) = self.next {
            if expected != first {
                return Err(CopyError::Gap {
                    expected,
                    got: first,
                });
            }
        }
        let mut ops = Vec::new();
        let mut offset = first;
        let mut rest = records;
        // A frame never larger than a segment (one record aside), so segments keep their size.
        let frame_max =
            COPY_FRAME_BYTES_MAX.min(usize::try_from(self.segment_bytes).unwrap_or(usize::MAX));
        while !rest.is_empty() {
            let mut take = 0;
            let mut bytes = 0;
            for record in rest {
                let len = view(record).framed_len();
                if take > 0 && FRAME_HEADER_BYTES + bytes + len > frame_max {
                    break;
                }
                take += 1;
                bytes += len;
            }
            let views: Vec<RecordView<'_>> = rest[..take].iter().map(view).collect();
            let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + bytes);
            encode_frame(&mut frame, offset, &views);
            self.write_frame(offset, frame, &mut ops);
            offset = Offset(offset.0 + take as u64);
            rest = &rest[take..];
        }
        self.next = Some(offset);
        Ok(ops)
    }

    fn write_frame(&mut self, base: Offset, frame: Vec<u8>, ops: &mut Vec<IoOp>) {
        let roll = self.segments.last().is_none_or(|segment| {
            segment.len > 0 && segment.len + frame.len() as u64 > self.segment_bytes
        });
        if roll {
            if let Some(last) = self.segments.last_mut() {
                last.synced = true;
                ops.push(IoOp::SyncData {
                    path: join(&self.dir, &segment_name(last.base)),
                });
            }
            ops.push(IoOp::Create {
                path: join(&self.dir, &segment_name(base)),
            });
            self.segments.push(CopiedSegment {
                base,
                len: 0,
                crc: crc32fast::Hasher::new(),
                synced: false,
            });
        }
        let segment = self
            .segments
            .last_mut()
            .expect("a segment exists after a roll");
        segment.crc.update(&frame);
        let position = segment.len;
        segment.len += frame.len() as u64;
        self.bytes += frame.len() as u64;
        ops.push(IoOp::WriteAt {
            path: join(&self.dir, &segment_name(segment.base)),
            offset: position,
            data: frame,
        });
    }

    /// The ops that make the copy durable and read it back, for a partition whose log continues at
    /// `end` (every record below it copied). Verify their replies with [`CopyWriter::verify`].
    pub fn finish(&mut self, end: Offset) -> Vec<IoOp> {
        let mut ops = Vec::new();
        if self.segments.is_empty() {
            ops.push(IoOp::Create {
                path: join(&self.dir, &segment_name(end)),
            });
            self.segments.push(CopiedSegment {
                base: end,
                len: 0,
                crc: crc32fast::Hasher::new(),
                synced: false,
            });
            self.next = Some(end);
        }
        for segment in &mut self.segments {
            if !segment.synced {
                segment.synced = true;
                ops.push(IoOp::SyncData {
                    path: join(&self.dir, &segment_name(segment.base)),
                });
            }
        }
        ops.push(IoOp::SyncDir {
            dir: self.dir.clone(),
        });
        for segment in &self.segments {
            ops.push(IoOp::ReadCrc {
                path: join(&self.dir, &segment_name(segment.base)),
                offset: 0,
                len: usize::try_from(segment.len).unwrap_or(usize::MAX),
            });
        }
        ops
    }

    /// Checks the replies to [`CopyWriter::finish`]'s ops: every segment read back with the CRC
    /// of the bytes written to it.
    pub fn verify(&self, replies: &[IoReply]) -> Result<(), CopyError> {
        let crcs: Vec<(u32, usize)> = replies
            .iter()
            .filter_map(|reply| match reply {
                IoReply::Crc(crc, len) => Some((*crc, *len)),
                IoReply::Done | IoReply::Data(_) | IoReply::Len(_) | IoReply::Names(_) => None,
            })
            .collect();
        for (index, segment) in self.segments.iter().enumerate() {
            let expected = (segment.crc.clone().finalize(), segment.len as usize);
            if crcs.get(index) != Some(&expected) {
                return Err(CopyError::ReadBack {
                    segment: segment_name(segment.base),
                });
            }
        }
        Ok(())
    }
}

fn view(record: &PartitionRecord) -> RecordView<'_> {
    RecordView {
        key: record.key.as_deref(),
        committed_at_ms: record.committed_at_ms,
        payload: &record.payload,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::sim::SimDisk;
    use crate::disk::{execute, Disk, IoId, IoLane, IoRequest};
    use crate::partition::segment::scan_segment;

    fn record(n: u64, bytes: usize) -> PartitionRecord {
        PartitionRecord {
            key: (n % 2 == 0).then(|| n.to_be_bytes().to_vec()),
            committed_at_ms: 1_000 + n,
            payload: vec![n as u8; bytes],
        }
    }

    fn run(disk: &SimDisk, ops: Vec<IoOp>) -> Vec<IoReply> {
        let request = IoRequest {
            id: IoId(1),
            lane: IoLane(0),
            ops,
        };
        execute(disk, &request).result.expect("ops run")
    }

    #[test]
    fn a_copy_is_segments_of_verified_frames_with_the_offsets_and_commit_times_kept() {
        let disk = SimDisk::new(1);
        disk.create_dir_all("p").unwrap();
        let mut writer = CopyWriter::new("p".into(), 4096);
        let records: Vec<PartitionRecord> = (100..160).map(|n| record(n, 300)).collect();
        run(&disk, writer.append(Offset(100), &records[..25]).unwrap());
        run(&disk, writer.append(Offset(125), &records[25..]).unwrap());
        assert_eq!(
            writer.append(Offset(170), &records[..1]),
            Err(CopyError::Gap {
                expected: Offset(160),
                got: Offset(170)
            })
        );
        let replies = run(&disk, writer.finish(Offset(160)));
        writer.verify(&replies).unwrap();
        let names = disk.list("p").unwrap();
        assert!(names.len() > 1, "rolled at 4 KiB: {names:?}");
        let mut next = Offset(100);
        for name in names {
            let base = crate::partition::segment::parse_segment_name(&name).unwrap();
            assert_eq!(base, next);
            let bytes = disk.read_at(&join("p", &name), 0, 1 << 20).unwrap();
            assert!(bytes.len() as u64 <= 4096 + 400);
            let scan = scan_segment(base, &bytes, 1024);
            assert_eq!(
                scan.verified_bytes,
                bytes.len() as u64,
                "every frame verifies"
            );
            next = scan.end_offset;
        }
        assert_eq!(next, Offset(160));
    }

    #[test]
    fn an_empty_copy_continues_at_the_offset_the_log_had_reached() {
        let disk = SimDisk::new(2);
        disk.create_dir_all("p").unwrap();
        let mut writer = CopyWriter::new("p".into(), 4096);
        let replies = run(&disk, writer.finish(Offset(64)));
        writer.verify(&replies).unwrap();
        assert_eq!(disk.list("p").unwrap(), vec![segment_name(Offset(64))]);
    }

    #[test]
    fn a_read_back_that_differs_fails_the_copy() {
        let disk = SimDisk::new(3);
        disk.create_dir_all("p").unwrap();
        let mut writer = CopyWriter::new("p".into(), 1 << 20);
        let records: Vec<PartitionRecord> = (0..4).map(|n| record(n, 10)).collect();
        run(&disk, writer.append(Offset(0), &records).unwrap());
        let mut replies = run(&disk, writer.finish(Offset(4)));
        writer.verify(&replies).unwrap();
        for reply in &mut replies {
            if let IoReply::Crc(crc, _) = reply {
                *crc ^= 1;
            }
        }
        assert!(matches!(
            writer.verify(&replies),
            Err(CopyError::ReadBack { .. })
        ));
    }
}
