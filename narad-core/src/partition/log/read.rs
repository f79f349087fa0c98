//! The read path of [`PartitionLog`]: serve offsets below the high watermark from verified bytes.

use super::{
    bad_reply, LogOutput, LogReadError, PartitionLog, PendingRead, Phase, ReadBatch, ReadFault,
    ReadRequest, READ_ATTEMPTS_MAX,
};
use crate::codec::partition::{
    decode_header, verify_frame_checked, visit_frame_checked, FrameHeader, PartitionRecord,
    FRAME_HEADER_BYTES,
};
use crate::codec::DecodeError;
use crate::disk::{IoCompletion, IoOp, IoReply};
use crate::ids::Offset;

impl PartitionLog {
    pub(super) fn on_read(&mut self, request: ReadRequest) {
        if let Err(error) = self.begin_read(request) {
            self.outputs.push_back(LogOutput::ReadDone {
                id: request.id,
                result: Err(error),
            });
        }
    }

    fn begin_read(&mut self, request: ReadRequest) -> Result<(), LogReadError> {
        match self.phase {
            Phase::Ready
            | Phase::Committing(..)
            | Phase::Journaling(..)
            | Phase::Repairing(..)
            | Phase::Rolling(..)
            | Phase::Latched(..) => {}
            Phase::Listing(..)
            | Phase::Measuring(..)
            | Phase::Scanning(..)
            | Phase::Rewriting(..)
            | Phase::Finalizing(..)
            | Phase::OpenFailed(..) => return Err(LogReadError::NotOpen),
        }
        if request.offset >= self.high_watermark {
            return Err(LogReadError::AtOrPastHighWatermark {
                high_watermark: self.high_watermark,
            });
        }
        let oldest = self.oldest_offset();
        if request.offset < oldest {
            return Err(LogReadError::BelowOldestRetained { oldest });
        }
        if self.reads.len() >= self.config.reads_in_flight_max {
            return Err(LogReadError::Busy);
        }
        let Some((&segment, found)) = self.segments.range(..=request.offset).next_back() else {
            return Err(LogReadError::BelowOldestRetained { oldest });
        };
        let (expected, position) = found
            .index
            .entry_for(request.offset)
            .unwrap_or((segment, 0));
        self.issue_read(PendingRead {
            request,
            segment,
            position,
            expected,
            attempts: 0,
        });
        Ok(())
    }

    fn issue_read(&mut self, mut read: PendingRead) {
        let verified_end = self.segments.get(&read.segment).map_or(0, |s| s.bytes);
        let want = u64::from(read.request.bytes_max.min(self.config.read_bytes_max))
            + 2 * self.config.index_interval_bytes
            + FRAME_HEADER_BYTES as u64;
        let len = want.min(verified_end.saturating_sub(read.position));
        self.issue_read_len(&mut read, len);
    }

    fn issue_read_len(&mut self, read: &mut PendingRead, len: u64) {
        read.attempts += 1;
        let path = self.segment_path(read.segment);
        let io = self.request(
            self.config.read_lane,
            vec![IoOp::ReadAt {
                path,
                offset: read.position,
                len: len as usize,
            }],
        );
        self.reads.insert(io, *read);
    }

    pub(super) fn on_read_io(&mut self, read: PendingRead, completion: IoCompletion) {
        let offset = read.request.offset;
        let bytes = match completion.result {
            Ok(mut replies) => match replies.pop() {
                Some(IoReply::Data(bytes)) => bytes,
                _ => {
                    return self.finish_read(
                        read,
                        Err(unreadable(offset, ReadFault::Io(bad_reply("read")))),
                    )
                }
            },
            Err((_, fault)) => {
                return self.finish_read(read, Err(unreadable(offset, ReadFault::Io(fault))))
            }
        };
        match collect_records(
            &read.request,
            read.expected,
            self.config.read_bytes_max,
            &bytes,
            self.verify_crc(),
        ) {
            Collected::Records(records) => {
                let batch = ReadBatch {
                    first: offset,
                    records,
                    high_watermark: self.high_watermark,
                };
                self.finish_read(read, Ok(batch));
            }
            Collected::Damaged(error) => {
                self.finish_read(read, Err(unreadable(offset, ReadFault::Damaged(error))))
            }
            Collected::Skipped => {
                self.finish_read(read, Err(unreadable(offset, ReadFault::Skipped)))
            }
            Collected::NeedMore {
                skip,
                expected,
                frame_len,
            } => {
                let verified_end = self.segments.get(&read.segment).map_or(0, |s| s.bytes);
                let mut next = read;
                next.position += skip;
                next.expected = expected;
                let remaining = verified_end.saturating_sub(next.position);
                if next.attempts >= READ_ATTEMPTS_MAX || remaining == 0 {
                    let error = ReadFault::Damaged(DecodeError::Truncated);
                    return self.finish_read(read, Err(unreadable(offset, error)));
                }
                match frame_len {
                    // With room for a frame behind it, should this one prove damaged.
                    Some(len) => {
                        let slack =
                            2 * self.config.index_interval_bytes + FRAME_HEADER_BYTES as u64;
                        self.issue_read_len(&mut next, (len as u64 + slack).min(remaining))
                    }
                    None => self.issue_read(next),
                }
            }
        }
    }

    fn finish_read(&mut self, read: PendingRead, result: Result<ReadBatch, LogReadError>) {
        let result = match (result, self.aged_out(read.segment)) {
            (Err(_), Some(aged_out)) => Err(aged_out),
            (result, _) => result,
        };
        self.outputs.push_back(LogOutput::ReadDone {
            id: read.request.id,
            result,
        });
        // The read may have been the last pin of a segment retention took away.
        self.unlink_doomed();
    }
}

/// The first position from `from` on where a whole frame verifies (checksum included) and continues
/// at or past `expected`, and its header. A read walks frames from a sparse-index entry to
/// the wanted offset by their headers; when one of those headers is damaged (it does not decode, or
/// does not continue the offsets walked), its length is unknown, so the walk finds the next frame the
/// way recovery steps over damage.
fn resync(
    bytes: &[u8],
    from: usize,
    expected: Offset,
    verify_crc: bool,
) -> Option<(usize, FrameHeader)> {
    (from..bytes.len()).find_map(|position| {
        verify_frame_checked(&bytes[position..], verify_crc)
            .ok()
            .filter(|header| header.base_offset >= expected)
            .map(|header| (position, header))
    })
}

fn unreadable(offset: Offset, reason: ReadFault) -> LogReadError {
    LogReadError::Unreadable { offset, reason }
}

enum Collected {
    Records(Vec<PartitionRecord>),
    Damaged(DecodeError),
    /// The wanted offset lies in damaged bytes: the frames around them do not hold it.
    Skipped,
    /// Nothing collected yet and the buffer ended inside a frame: read again `skip` bytes further,
    /// where the frame holding `expected` starts, `frame_len` bytes when its header was complete.
    NeedMore {
        skip: u64,
        expected: Offset,
        frame_len: Option<usize>,
    },
}

/// Walks the frames in `bytes` (starting at the frame that holds `expected`) and collects the records
/// wanted.
///
/// Every header walked must continue the offsets walked so far: recovery verified them so, and a
/// header that does not (rot of its base offset, or the frames behind damage recovery skipped) is
/// damage, never a reason to number records differently. So the records of a batch are dense from the
/// wanted offset.
fn collect_records(
    request: &ReadRequest,
    mut expected: Offset,
    read_bytes_max: u32,
    bytes: &[u8],
    verify_crc: bool,
) -> Collected {
    let records_max = request.records_max.max(1) as usize;
    let bytes_max = request.bytes_max.min(read_bytes_max) as usize;
    let mut records: Vec<PartitionRecord> = Vec::new();
    let mut taken_bytes = 0usize;
    let mut position = 0usize;
    while position < bytes.len() {
        if records.len() >= records_max || (!records.is_empty() && taken_bytes >= bytes_max) {
            break;
        }
        let header = match decode_header(&bytes[position..]) {
            Ok(header) if header.base_offset == expected => header,
            Err(DecodeError::Truncated) => break,
            // Serve what verified; the next read reports the damage.
            Ok(_) | Err(_) if !records.is_empty() => break,
            // A header that decodes but does not continue may still be a whole frame (the one in
            // front lost records to a rotten count): the search starts with it.
            decoded => match resync(
                bytes,
                position + usize::from(decoded.is_err()),
                expected,
                verify_crc,
            ) {
                // Damage ahead of the wanted offset (rot of a header the sparse index walk steps
                // through, or bytes recovery skipped): the frames behind it are intact and served,
                // as recovery keeps them.
                Some((next, header)) if header.base_offset <= request.offset => {
                    position = next;
                    expected = header.base_offset;
                    header
                }
                // The wanted offset lies in the damaged bytes, or nothing verifies behind them here.
                Some(_) | None => {
                    return match decoded {
                        Err(error) => Collected::Damaged(error),
                        Ok(_) => Collected::Skipped,
                    }
                }
            },
        };
        let rest = &bytes[position..];
        let frame_len = header.frame_len();
        if header.end_offset() <= request.offset {
            position += frame_len;
            expected = header.end_offset();
            continue;
        }
        if rest.len() < frame_len {
            if records.is_empty() {
                return Collected::NeedMore {
                    skip: position as u64,
                    expected,
                    frame_len: Some(frame_len),
                };
            }
            break;
        }
        // The frame's records are taken as they are decoded (no record list per frame) and given
        // back if the frame then fails its checks.
        let kept = records.len();
        let mut offset = header.base_offset.0;
        let mut full = false;
        let visited = visit_frame_checked(rest, verify_crc, |record| {
            let at = offset;
            offset += 1;
            if full || at < request.offset.0 {
                return;
            }
            if records.len() >= records_max || (!records.is_empty() && taken_bytes >= bytes_max) {
                full = true;
                return;
            }
            taken_bytes += record.framed_len();
            records.push(record.to_owned_record());
        });
        if let Err(error) = visited {
            records.truncate(kept);
            if !records.is_empty() {
                // Serve what verified; the next read reports the damage.
                break;
            }
            // The frame is damaged, so its record count is not to be trusted (its length is: the
            // header continued the offsets walked, and its two length fields agree). The wanted
            // offset may lie behind it, as recovery would find after a restart.
            let behind = position + frame_len;
            let floor = Offset(header.base_offset.0 + 1);
            match resync(bytes, behind, floor, verify_crc) {
                Some((next, found)) if found.base_offset <= request.offset => {
                    position = next;
                    expected = found.base_offset;
                    continue;
                }
                Some(_) | None => return Collected::Damaged(error),
            }
        }
        if full {
            return Collected::Records(records);
        }
        position += frame_len;
        expected = header.end_offset();
    }
    if records.is_empty() {
        Collected::NeedMore {
            skip: position as u64,
            expected,
            frame_len: None,
        }
    } else {
        Collected::Records(records)
    }
}
