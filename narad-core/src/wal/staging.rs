//! Staging, group commit, rolls and the failure latch.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::{
    AppendError, AppendId, Batch, Cohort, FillError, IngressWal, Pending, Prep, Roll, SeqRange,
    Step, Tail, WalOutput, POOL_BUFFERS_MAX,
};
use crate::codec::wal::{decode_frame_header, encode_frame_header, FRAME_HEADER_BYTES};
use crate::disk::{IoOp, IoReply, IoRequest};
use crate::error::IoFault;
use crate::ids::Seq;
use crate::planted::PlantedBug;
use crate::time::Instant;

/// Where to withdraw to when a fill fails: the state before the call, or right after a roll inside it.
#[derive(Clone, Copy)]
struct Mark {
    buf_len: usize,
    next_seq: Seq,
    tail_end: u64,
    unflushed_bytes: usize,
}

type Fill<'a> = dyn FnMut(usize, &mut [u8]) -> Result<(), FillError> + 'a;

impl IngressWal {
    pub(super) fn on_append(
        &mut self,
        now: Instant,
        id: AppendId,
        sizes: &[usize],
        fill: &mut Fill<'_>,
    ) {
        match self.stage(sizes, fill) {
            Ok(range) if range.is_empty() => self.outputs.push_back(WalOutput::AppendDone {
                id,
                result: Ok(range),
            }),
            Ok(range) if std::mem::take(&mut self.planted_tail_dropped) => {
                let before_roll = self.queue.iter_mut().rev().find_map(|step| match step {
                    Step::Flush(batch) => Some(batch),
                    Step::Repair | Step::Roll(_) => None,
                });
                before_roll
                    .expect("a roll inside a batch queued the records before it")
                    .waiters
                    .push((id, range));
                self.note_arrival();
            }
            // The batch holding the last record is the open one: its flush answers the caller.
            Ok(range) => {
                self.open.waiters.push((id, range));
                self.note_arrival();
            }
            Err(error) => self.outputs.push_back(WalOutput::AppendDone {
                id,
                result: Err(error),
            }),
        }
        self.maybe_prepare();
        self.start_next(now);
    }

    /// Counts a staged append towards the cohort the next flush waits for; once it is back, stop waiting.
    fn note_arrival(&mut self) {
        if let Some(cohort) = &mut self.cohort {
            cohort.appends_arrived += 1;
            if cohort.appends_arrived >= cohort.appends_wanted {
                self.cohort = None;
            }
        }
    }

    /// After a flush that answered `answered` appends, wrote `flushed_bytes` and ran from when it
    /// started to `now`: wait for them to come back before the next flush, if they are enough, the
    /// flush was not bound by bandwidth and the wait would not be zero.
    fn expect_cohort(&mut self, now: Instant, answered: usize, flushed_bytes: usize) {
        self.cohort = None;
        let Some(started) = self.flush_started_at.take() else {
            return;
        };
        let took = now.saturating_duration_since(started);
        let Some(delay) = self
            .config
            .cohort_wait()
            .after(answered, flushed_bytes as u64, took)
        else {
            return;
        };
        self.cohort = Some(Cohort {
            appends_wanted: answered,
            appends_arrived: 0,
            deadline: now.saturating_add(delay),
        });
    }

    /// Checks every size, then stages the records in order with consecutive sequence numbers.
    fn stage(&mut self, sizes: &[usize], fill: &mut Fill<'_>) -> Result<SeqRange, AppendError> {
        if let Some(fault) = &self.latched {
            return Err(AppendError::Disk(fault.clone()));
        }
        let mut total_bytes = 0usize;
        for (index, &bytes) in sizes.iter().enumerate() {
            if bytes == 0 {
                return Err(AppendError::EmptyRecord { index });
            }
            if bytes > self.config.record_bytes_max {
                return Err(AppendError::RecordTooLarge {
                    index,
                    bytes,
                    bytes_max: self.config.record_bytes_max,
                });
            }
            total_bytes = total_bytes.saturating_add(FRAME_HEADER_BYTES + bytes);
        }
        let unflushed_bytes = self.unflushed_bytes.saturating_add(total_bytes);
        if unflushed_bytes > self.config.unflushed_bytes_max {
            return Err(AppendError::Overloaded {
                unflushed_bytes,
                bytes_max: self.config.unflushed_bytes_max,
            });
        }
        let first = self.next_seq;
        // Grow the buffer once for the part of the batch that fits the tail segment.
        let room = self.tail.limit.saturating_sub(self.tail.end);
        self.open.buf.reserve(total_bytes.min(room as usize));
        let mut mark = self.mark();
        let mut rolled_inside = false;
        for (index, &bytes) in sizes.iter().enumerate() {
            let frame_bytes = (FRAME_HEADER_BYTES + bytes) as u64;
            if self.tail.end + frame_bytes > self.tail.limit {
                rolled_inside |= index > 0;
                if self.tail.end == 0 {
                    // Only a recovered segment written under a smaller limit can refuse a frame while
                    // empty; rolling would recreate the same file name.
                    self.withdraw(mark);
                    return Err(AppendError::RecordTooLarge {
                        index,
                        bytes,
                        bytes_max: (self.tail.limit as usize).saturating_sub(FRAME_HEADER_BYTES),
                    });
                }
                self.roll_tail();
                mark = self.mark();
            }
            let start = self.open.buf.len();
            self.open.buf.resize(start + frame_bytes as usize, 0);
            let payload = &mut self.open.buf[start + FRAME_HEADER_BYTES..];
            let filled = catch_unwind(AssertUnwindSafe(|| fill(index, payload)))
                .unwrap_or(Err(FillError::Panicked));
            if let Err(error) = filled {
                self.withdraw(mark);
                return Err(AppendError::Fill { index, error });
            }
            let header =
                encode_frame_header(self.next_seq, &self.open.buf[start + FRAME_HEADER_BYTES..]);
            self.open.buf[start..start + FRAME_HEADER_BYTES].copy_from_slice(&header);
            self.next_seq = self.next_seq.next();
            self.tail.end += frame_bytes;
            self.unflushed_bytes += frame_bytes as usize;
            self.open.seqs.next = self.next_seq;
        }
        let range = SeqRange {
            first,
            next: self.next_seq,
        };
        if rolled_inside && self.config.plant.is(PlantedBug::RollDropsBatchTail) {
            // Planted: what was staged after the roll is dropped (its sequence numbers go to the next
            // records), yet the caller is answered with the whole range once the part before the
            // roll is durable.
            self.withdraw(mark);
            self.planted_tail_dropped = true;
        }
        Ok(range)
    }

    fn mark(&self) -> Mark {
        Mark {
            buf_len: self.open.buf.len(),
            next_seq: self.next_seq,
            tail_end: self.tail.end,
            unflushed_bytes: self.unflushed_bytes,
        }
    }

    /// Takes back the records staged since `mark` and gives their sequence numbers back.
    fn withdraw(&mut self, mark: Mark) {
        self.open.buf.truncate(mark.buf_len);
        self.next_seq = mark.next_seq;
        self.tail.end = mark.tail_end;
        self.unflushed_bytes = mark.unflushed_bytes;
        self.open.seqs.next = mark.next_seq;
    }

    /// An empty batch for the tail, on a reused buffer when one is free.
    fn fresh_batch(&mut self) -> Batch {
        let buf = match self.pool.pop() {
            Some(buf) => buf,
            None => {
                self.buffers_created += 1;
                Vec::new()
            }
        };
        Batch {
            segment: self.tail.first,
            prepared: self.tail.prepared,
            offset: self.tail.end,
            buf,
            len: 0,
            seqs: SeqRange {
                first: self.next_seq,
                next: self.next_seq,
            },
            waiters: std::mem::take(&mut self.spare_waiters),
        }
    }

    /// Keeps a buffer for reuse, trimmed to `staging_bytes_max` of capacity.
    pub(super) fn recycle(&mut self, mut buf: Vec<u8>) {
        buf.clear();
        if buf.capacity() > self.config.staging_bytes_max {
            buf.shrink_to(self.config.staging_bytes_max);
        }
        if self.pool.len() < POOL_BUFFERS_MAX && buf.capacity() > 0 {
            self.pool.push(buf);
        }
    }

    /// Queues the open batch for writing, if it holds records, and opens a new one on the tail.
    fn close_open(&mut self) {
        if self.open.seqs.is_empty() {
            return;
        }
        let fresh = self.fresh_batch();
        let batch = std::mem::replace(&mut self.open, fresh);
        self.queue.push_back(Step::Flush(batch));
    }

    /// Rolls between two records: what is staged is written and synced first, then the tail segment is
    /// sealed and the next one put in place, all in order on the append lane.
    pub(super) fn roll_tail(&mut self) {
        let old = self.tail;
        self.close_open();
        let spare = self.config.prealloc && self.prep == Prep::Ready;
        if spare {
            self.prep = Prep::Claimed;
        }
        let new = self.next_seq;
        self.queue.push_back(Step::Roll(Roll {
            old: old.first,
            old_trim: old.prepared.then_some(old.end),
            new,
            spare,
        }));
        self.tail = Tail {
            first: new,
            end: 0,
            limit: if spare {
                self.config.prepared_write_limit()
            } else {
                self.config.segment_bytes_max
            },
            prepared: spare,
        };
        assert!(self.open.seqs.is_empty() && self.open.waiters.is_empty());
        self.open.segment = new;
        self.open.prepared = spare;
        self.open.offset = 0;
        self.open.seqs = SeqRange {
            first: new,
            next: new,
        };
    }

    /// Starts the next step on the append lane when it is free: a queued step, else the open batch.
    /// The open batch waits while a cohort is expected (see the module doc); queued steps never do.
    pub(super) fn start_next(&mut self, now: Instant) {
        if self.batching || self.latched.is_some() || self.append_in_flight.is_some() {
            return;
        }
        let mut step = match self.queue.pop_front() {
            Some(step) => step,
            None if self.open.seqs.is_empty() => return,
            None if self.cohort.is_some_and(|cohort| now < cohort.deadline) => return,
            None => {
                let fresh = self.fresh_batch();
                Step::Flush(std::mem::replace(&mut self.open, fresh))
            }
        };
        let ops = match &mut step {
            Step::Repair => unreachable!("the repair is issued at open"),
            Step::Flush(batch) => {
                self.cohort = None;
                self.flush_started_at = Some(now);
                self.flush_ops(batch)
            }
            Step::Roll(roll) => self.roll_ops(*roll),
        };
        let lane = self.config.lanes.append;
        let id = self.emit_io(lane, ops, Pending::Append(step));
        self.append_in_flight = Some(id);
    }

    /// One write and one sync; into a prepared segment, runs of whole frames each written and synced.
    fn flush_ops(&self, batch: &mut Batch) -> Vec<IoOp> {
        let mut ops = self.flush_ops_synced(batch);
        if self.config.plant.is(PlantedBug::AckBeforeFsync) {
            // Planted: the flush completes, and acknowledges, once written; nothing syncs it.
            ops.retain(|op| !matches!(op, IoOp::SyncData { .. }));
        }
        ops
    }

    fn flush_ops_synced(&self, batch: &mut Batch) -> Vec<IoOp> {
        let path = self.config.segment_path(batch.segment);
        let run_bytes_max = self.config.prepared_write_run_bytes_max;
        batch.len = batch.buf.len();
        if !batch.prepared || batch.buf.len() as u64 <= run_bytes_max {
            // The buffer travels in the request and comes back with the completion.
            let data = std::mem::take(&mut batch.buf);
            return vec![
                IoOp::WriteAt {
                    path: path.clone(),
                    offset: batch.offset,
                    data,
                },
                IoOp::SyncData { path },
            ];
        }
        let mut ops = Vec::new();
        let mut run_start = 0usize;
        let mut pos = 0usize;
        let push_run = |ops: &mut Vec<IoOp>, start: usize, end: usize| {
            ops.push(IoOp::WriteAt {
                path: path.clone(),
                offset: batch.offset + start as u64,
                data: batch.buf[start..end].to_vec(),
            });
            ops.push(IoOp::SyncData { path: path.clone() });
        };
        while pos < batch.buf.len() {
            let header =
                decode_frame_header(&batch.buf[pos..]).expect("staged frames are well formed");
            let frame_end = pos + header.frame_len();
            if pos > run_start && (frame_end - run_start) as u64 > run_bytes_max {
                push_run(&mut ops, run_start, pos);
                run_start = pos;
            }
            pos = frame_end;
        }
        push_run(&mut ops, run_start, pos);
        ops
    }

    fn roll_ops(&self, roll: Roll) -> Vec<IoOp> {
        let mut ops = Vec::new();
        if let Some(len) = roll.old_trim {
            let path = self.config.segment_path(roll.old);
            ops.push(IoOp::SetLen {
                path: path.clone(),
                len,
            });
            ops.push(IoOp::SyncData { path });
        }
        let new_path = self.config.segment_path(roll.new);
        if roll.spare {
            ops.push(IoOp::Rename {
                from: self.config.prep_path(),
                to: new_path,
            });
        } else {
            ops.push(IoOp::Create { path: new_path });
        }
        ops.push(IoOp::SyncDir {
            dir: self.config.dir.clone(),
        });
        ops
    }

    pub(super) fn on_append_step_done(
        &mut self,
        now: Instant,
        step: Step,
        request: IoRequest,
        result: Result<Vec<IoReply>, (usize, IoFault)>,
    ) {
        self.append_in_flight = None;
        let rolled = matches!(step, Step::Roll(_));
        match result {
            Err((index, fault)) if self.planted_fsync_retry(&step, &request, index) => {
                // Planted: the failed fsync is issued again, and its "success" trusted.
                let Step::Flush(mut batch) = step else {
                    unreachable!("checked by planted_fsync_retry")
                };
                let _ = fault;
                batch.buf = Self::flush_buffer(&mut batch, request);
                let path = self.config.segment_path(batch.segment);
                let lane = self.config.lanes.append;
                let id = self.emit_io(
                    lane,
                    vec![IoOp::SyncData { path }],
                    Pending::Append(Step::Flush(batch)),
                );
                self.append_in_flight = Some(id);
                return;
            }
            Err((_, fault)) => self.latch(fault, step, request),
            Ok(_) => match step {
                Step::Repair => {
                    // What recovery read is durable now: the dispatcher may read it.
                    self.repaired = true;
                    self.outputs.push_back(WalOutput::Durable {
                        next_seq: self.durable_next,
                    });
                }
                Step::Flush(batch) => {
                    self.expect_cohort(now, batch.waiters.len(), batch.len);
                    self.complete_flush(batch, request)
                }
                Step::Roll(roll) => self.complete_roll(roll),
            },
        }
        self.start_next(now);
        self.maybe_prepare();
        if rolled {
            self.compact(now);
        }
    }

    /// Whether the planted `fsync-retry-after-eio` retries this failure: a flush's first attempt
    /// (it carries the write) whose fsync failed.
    fn planted_fsync_retry(&self, step: &Step, request: &IoRequest, index: usize) -> bool {
        self.config.plant.is(PlantedBug::FsyncRetryAfterEio)
            && matches!(step, Step::Flush(_))
            && matches!(request.ops.get(index), Some(IoOp::SyncData { .. }))
            && matches!(request.ops.first(), Some(IoOp::WriteAt { .. }))
    }

    /// The flush's buffer: kept in the batch (written in runs) or handed back inside the request.
    fn flush_buffer(batch: &mut Batch, request: IoRequest) -> Vec<u8> {
        if !batch.buf.is_empty() {
            return std::mem::take(&mut batch.buf);
        }
        match request.ops.into_iter().next() {
            Some(IoOp::WriteAt { data, .. }) => data,
            _ => Vec::new(),
        }
    }

    fn complete_flush(&mut self, mut batch: Batch, request: IoRequest) {
        let buf = Self::flush_buffer(&mut batch, request);
        assert_eq!(
            buf.len(),
            batch.len,
            "hand the write request back as it was emitted"
        );
        let interval_bytes = self.config.index_interval_bytes;
        let segment = self
            .segments
            .get_mut(&batch.segment)
            .expect("a flush targets a segment that exists");
        assert_eq!(segment.next, batch.seqs.first, "flushes land in order");
        assert_eq!(segment.data_end, batch.offset, "flushes land back to back");
        let mut pos = 0usize;
        let mut seq = batch.seqs.first;
        while pos < buf.len() {
            let header = decode_frame_header(&buf[pos..]).expect("staged frames are well formed");
            segment.note_frame(seq, batch.offset + pos as u64, interval_bytes);
            pos += header.frame_len();
            seq = seq.next();
        }
        assert_eq!(seq, batch.seqs.next);
        segment.next = batch.seqs.next;
        segment.data_end += buf.len() as u64;
        segment.file_len = segment.file_len.max(segment.data_end);
        self.durable_next = batch.seqs.next;
        self.unflushed_bytes -= buf.len();
        for (id, range) in batch.waiters.drain(..) {
            self.outputs.push_back(WalOutput::AppendDone {
                id,
                result: Ok(range),
            });
        }
        if self.spare_waiters.capacity() == 0 {
            self.spare_waiters = std::mem::take(&mut batch.waiters);
        }
        self.outputs.push_back(WalOutput::Durable {
            next_seq: self.durable_next,
        });
        let old = std::mem::replace(
            &mut self.recent,
            super::Recent {
                segment: batch.segment,
                offset: batch.offset,
                seqs: batch.seqs,
                buf,
            },
        );
        self.recycle(old.buf);
    }

    fn complete_roll(&mut self, roll: Roll) {
        if let Some(len) = roll.old_trim {
            let old = self
                .segments
                .get_mut(&roll.old)
                .expect("the sealed segment exists");
            assert_eq!(
                old.data_end, len,
                "a prepared segment is trimmed to its data"
            );
            old.prepared_limit = None;
            old.file_len = len;
        }
        let mut segment = super::Segment::empty(roll.new);
        if roll.spare {
            segment.file_len = self.config.segment_bytes_max;
            segment.prepared_limit = Some(self.config.prepared_write_limit());
            self.prep = Prep::Idle;
        }
        let previous = self.segments.insert(roll.new, segment);
        assert!(previous.is_none(), "a roll creates a new segment");
    }

    /// A write, fsync, roll or repair failed: fail everything not yet durable and refuse what follows.
    fn latch(&mut self, fault: IoFault, step: Step, request: IoRequest) {
        self.latched = Some(fault.clone());
        self.cohort = None;
        self.flush_started_at = None;
        self.outputs.push_back(WalOutput::Latched {
            fault: fault.clone(),
        });
        let mut failed = Vec::new();
        if let Step::Flush(mut batch) = step {
            let buf = Self::flush_buffer(&mut batch, request);
            self.recycle(buf);
            failed.push(batch);
        }
        for step in std::mem::take(&mut self.queue) {
            if let Step::Flush(batch) = step {
                failed.push(batch);
            }
        }
        let fresh = self.fresh_batch();
        failed.push(std::mem::replace(&mut self.open, fresh));
        for mut batch in failed {
            for (id, _) in batch.waiters.drain(..) {
                self.outputs.push_back(WalOutput::AppendDone {
                    id,
                    result: Err(AppendError::Disk(fault.clone())),
                });
            }
            let buf = std::mem::take(&mut batch.buf);
            self.recycle(buf);
        }
        // Nothing is staged any more; the tail ends at what was staged before (never written again).
        self.open.seqs = SeqRange {
            first: self.next_seq,
            next: self.next_seq,
        };
        self.open.offset = self.tail.end;
        self.unflushed_bytes = 0;
    }
}
