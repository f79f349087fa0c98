//! Reads for the dispatcher: durable frames from a sequence number on, from memory when the last group
//! commit covers them, else from disk through the sparse index (a follow-up read when a frame is larger
//! than the first read).

use super::{IngressWal, Pending, WalFrame, WalOutput, WalReadError, WalReadId};
use crate::codec::wal::{decode_frame, decode_frame_header, FRAME_HEADER_BYTES};
use crate::codec::DecodeError;
use crate::disk::{IoOp, IoReply};
use crate::error::IoFault;
use crate::ids::Seq;

/// A disk read in progress.
#[derive(Debug)]
pub(super) struct ReadState {
    id: WalReadId,
    from: Seq,
    max_records: usize,
    max_bytes: usize,
    segment: Seq,
    /// Durable bytes of the segment when the read started: frames past it are never served.
    segment_end: u64,
    /// Offset of the bytes the request in flight reads.
    offset: u64,
    /// Bytes that request asked for.
    len: usize,
    /// Sequence number of the frame at `offset`.
    expected: Seq,
    frames: Vec<WalFrame>,
    payload_bytes: usize,
}

/// What parsing a stretch of frames ended with.
enum Parsed {
    /// The answer is complete.
    Done,
    /// No record collected yet and the data ended inside a frame: read `len` bytes at `offset`.
    More {
        offset: u64,
        len: usize,
    },
    Failed(WalReadError),
}

impl ReadState {
    fn full(&self) -> bool {
        self.frames.len() >= self.max_records
    }

    /// Walks the frames in `data` (found at `self.offset`), skipping those below `from`.
    fn parse(&mut self, data: &[u8]) -> Parsed {
        let mut pos = 0usize;
        loop {
            let offset = self.offset + pos as u64;
            if self.full() || offset >= self.segment_end {
                return if self.frames.is_empty() {
                    Parsed::Failed(WalReadError::Corrupt {
                        segment: self.segment,
                        offset,
                        error: DecodeError::Truncated,
                    })
                } else {
                    Parsed::Done
                };
            }
            let rest = &data[pos..];
            let frame_len = match decode_frame_header(rest) {
                Ok(header) => header.frame_len(),
                Err(DecodeError::Truncated) => FRAME_HEADER_BYTES,
                Err(error) => return self.corrupt(offset, error),
            };
            if rest.len() < frame_len {
                if !self.frames.is_empty() {
                    return Parsed::Done;
                }
                if data.len() < self.len {
                    // The file ended before the durable bytes we know of.
                    return self.corrupt(offset, DecodeError::Truncated);
                }
                // `expected` is already the sequence number of the frame at `offset`.
                return Parsed::More {
                    offset,
                    len: frame_len,
                };
            }
            let frame = match decode_frame(rest) {
                Ok(frame) => frame,
                Err(error) => return self.corrupt(offset, error),
            };
            if frame.seq != self.expected {
                return Parsed::Failed(WalReadError::SeqMismatch {
                    segment: self.segment,
                    offset,
                    expected: self.expected,
                    found: frame.seq,
                });
            }
            if frame.seq >= self.from {
                let bytes = frame.payload.len();
                if !self.frames.is_empty() && self.payload_bytes + bytes > self.max_bytes {
                    return Parsed::Done;
                }
                self.payload_bytes += bytes;
                self.frames.push(WalFrame {
                    seq: frame.seq,
                    payload: frame.payload.to_vec(),
                });
            }
            self.expected = self.expected.next();
            pos += frame_len;
        }
    }

    fn corrupt(&self, offset: u64, error: DecodeError) -> Parsed {
        Parsed::Failed(WalReadError::Corrupt {
            segment: self.segment,
            offset,
            error,
        })
    }
}

impl IngressWal {
    pub(super) fn on_read(
        &mut self,
        id: WalReadId,
        from: Seq,
        max_records: usize,
        max_bytes: usize,
    ) {
        if !self.repaired {
            // A repair that failed latched the WAL: what recovery read may never become durable, so
            // it is never served; the latch's fault says so (an empty answer would tell a reader
            // that believes those records durable to ask again at once, forever).
            let result = match &self.latched {
                Some(fault) => Err(WalReadError::Io(fault.clone())),
                None => Ok(Vec::new()),
            };
            return self.answer_read(id, result);
        }
        if from >= self.durable_next || max_records == 0 {
            return self.answer_read(id, Ok(Vec::new()));
        }
        let oldest = self.oldest_segment_first_seq();
        if from < oldest {
            return self.answer_read(id, Err(WalReadError::Compacted { oldest }));
        }
        if self.recent.seqs.first <= from && from < self.recent.seqs.next {
            // Sized once: the records of the copy from `from` on, at most `max_records`.
            let wanted = usize::try_from(self.recent.seqs.next.0 - from.0).unwrap_or(usize::MAX);
            let mut state = ReadState {
                id,
                from,
                max_records,
                max_bytes,
                segment: self.recent.segment,
                segment_end: self.recent.offset + self.recent.buf.len() as u64,
                offset: self.recent.offset,
                len: self.recent.buf.len(),
                expected: self.recent.seqs.first,
                frames: Vec::with_capacity(wanted.min(max_records)),
                payload_bytes: 0,
            };
            let result = match state.parse(&self.recent.buf) {
                Parsed::Done => Ok(state.frames),
                Parsed::Failed(error) => Err(error),
                Parsed::More { .. } => unreachable!("the recent copy holds whole frames"),
            };
            return self.answer_read(id, result);
        }
        if self.reads_in_flight >= self.config.reads_in_flight_max {
            return self.answer_read(id, Err(WalReadError::Busy));
        }
        let (_, segment) = self
            .segments
            .range(..=from)
            .next_back()
            .expect("from is at or past the oldest segment");
        assert!(from < segment.next, "a durable seq lies in its segment");
        let (expected, offset) = segment.index_lookup(from);
        let state = ReadState {
            id,
            from,
            max_records,
            max_bytes,
            segment: segment.first,
            segment_end: segment.data_end,
            offset,
            len: 0,
            expected,
            frames: Vec::new(),
            payload_bytes: 0,
        };
        self.reads_in_flight += 1;
        let len = self.read_chunk_bytes(&state, offset, 0);
        self.issue_read(state, offset, len);
    }

    /// How much to read at `offset`: enough to pass the index gap and collect `max_bytes`, at least
    /// `needed`, never past the segment's durable end.
    fn read_chunk_bytes(&self, state: &ReadState, offset: u64, needed: usize) -> usize {
        let wanted = self.config.index_interval_bytes as usize
            + state.max_bytes.min(self.config.record_bytes_max)
            + 2 * FRAME_HEADER_BYTES;
        let available = (state.segment_end - offset) as usize;
        wanted.max(needed).min(available)
    }

    fn issue_read(&mut self, mut state: ReadState, offset: u64, len: usize) {
        state.offset = offset;
        state.len = len;
        let ops = vec![IoOp::ReadAt {
            path: self.config.segment_path(state.segment),
            offset,
            len,
        }];
        let lane = self.config.lanes.read;
        self.emit_io(lane, ops, Pending::Read(state));
    }

    pub(super) fn on_read_done(
        &mut self,
        mut state: ReadState,
        result: Result<Vec<IoReply>, (usize, IoFault)>,
    ) {
        let data = match result {
            Err((_, fault)) => {
                self.reads_in_flight -= 1;
                return self.answer_read(state.id, Err(WalReadError::Io(fault)));
            }
            Ok(replies) => match replies.into_iter().next() {
                Some(IoReply::Data(data)) => data,
                _ => Vec::new(),
            },
        };
        match state.parse(&data) {
            Parsed::Done => {
                self.reads_in_flight -= 1;
                let id = state.id;
                self.answer_read(id, Ok(state.frames));
            }
            Parsed::Failed(error) => {
                self.reads_in_flight -= 1;
                self.answer_read(state.id, Err(error));
            }
            Parsed::More { offset, len } => {
                let len = self.read_chunk_bytes(&state, offset, len);
                self.issue_read(state, offset, len);
            }
        }
    }

    fn answer_read(&mut self, id: WalReadId, result: Result<Vec<WalFrame>, WalReadError>) {
        self.outputs.push_back(WalOutput::ReadDone { id, result });
    }
}
