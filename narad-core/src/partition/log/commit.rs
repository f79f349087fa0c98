//! CommitDurable of [`PartitionLog`]: encode, write, sync, read back and verify a run, then advance
//! the high watermark; a failed commit is discarded and the file repaired (see the module
//! documentation of `log`).

use super::*;

/// The request's records as they are framed, or `RecordTooLarge` if one would not fit in a frame.
fn commit_views(
    request: &CommitRequest,
    committed_at_ms: u64,
) -> Result<Vec<RecordView<'_>>, CommitFault> {
    let views: Vec<RecordView<'_>> = request
        .records
        .iter()
        .map(|record| RecordView {
            key: record.key.as_deref().filter(|key| !key.is_empty()),
            committed_at_ms,
            payload: &record.payload,
        })
        .collect();
    if views
        .iter()
        .any(|view| view.framed_len() > FRAME_RECORDS_BYTES_MAX)
    {
        return Err(CommitFault::RecordTooLarge);
    }
    Ok(views)
}

impl PartitionLog {
    pub(super) fn on_commit(&mut self, request: CommitRequest) {
        if let Err(fault) = self.begin_commit(&request) {
            self.outputs.push_back(LogOutput::CommitDone {
                id: request.id,
                result: Err(fault),
            });
        }
    }

    pub(super) fn begin_commit(&mut self, request: &CommitRequest) -> Result<(), CommitFault> {
        if !matches!(self.phase, Phase::Ready) {
            return Err(CommitFault::NotReady(self.status()));
        }
        if request.records.is_empty() {
            return Err(CommitFault::Empty);
        }
        let committed_at_ms = request.committed_at_ms.max(self.last_committed_at_ms);
        let views = commit_views(request, committed_at_ms)?;
        let (run, frames) = self.encode_run(&views);
        let run_bytes = run.len() as u64;
        let (segment, created) = self.segment_for_run(run_bytes);
        let position = if created {
            0
        } else {
            self.segments[&segment].bytes
        };
        let name_durable = !created && self.segments[&segment].name_durable;
        let path = self.segment_path(segment);
        let mut ops = Vec::with_capacity(7);
        let mut stages = Stages::default();
        if created {
            self.push_seal(&mut ops, &mut stages);
            ops.push(IoOp::Create { path: path.clone() });
            stages.push(Stage::Create);
        }
        ops.push(IoOp::WriteAt {
            path: path.clone(),
            offset: position,
            data: run,
        });
        stages.push(Stage::Write);
        let write_end = position + run_bytes;
        let zeroed = if created {
            0
        } else {
            self.segments[&segment].file_bytes
        };
        let fill = self.fill_after_run(run_bytes, created, write_end);
        let file_bytes = if write_end > zeroed && fill > 0 {
            ops.push(IoOp::WriteZeros {
                path: path.clone(),
                offset: write_end,
                len: fill,
            });
            stages.push(Stage::Fill);
            write_end + fill
        } else {
            zeroed.max(write_end)
        };
        self.push_syncs(&path, name_durable, &mut ops, &mut stages);
        ops.push(IoOp::ReadAt {
            path,
            offset: position,
            len: run_bytes as usize,
        });
        stages.push(Stage::ReadBack);
        let end_offset = Offset(self.high_watermark.0 + request.records.len() as u64);
        let io = self.request(self.config.commit_lane, ops);
        self.next_offset = end_offset;
        self.phase = Phase::Committing(Box::new(PendingCommit {
            id: request.id,
            io,
            segment,
            created,
            position,
            run_bytes,
            file_bytes,
            frames,
            end_offset,
            committed_at_ms,
            stages,
        }));
        Ok(())
    }

    /// The segment a run of `run_bytes` goes to, and whether it is created for it: the last one while
    /// the run fits (or the segment is empty), else a new one at the high watermark.
    fn segment_for_run(&self, run_bytes: u64) -> (Offset, bool) {
        match self.segments.iter().next_back() {
            Some((&base, last))
                if last.bytes == 0 || last.bytes + run_bytes <= self.config.segment_bytes_max =>
            {
                (base, false)
            }
            _ => (self.high_watermark, true),
        }
    }

    /// Before a new segment: trims the last one's preallocated zeros off its end.
    fn push_seal(&self, ops: &mut Vec<IoOp>, stages: &mut Stages) {
        if let Some(seal) = self.seal_op() {
            ops.push(seal);
            stages.push(Stage::Seal);
        }
    }

    /// The op that trims the last segment's zero fill off its end, when it has some (a roll, by a
    /// commit or by retention, seals it). Not synced: a crash may keep the zeros, which recovery
    /// reads as a clean end.
    pub(super) fn seal_op(&self) -> Option<IoOp> {
        let last = self.segments.values().next_back()?;
        (last.file_bytes > last.bytes).then(|| IoOp::SetLen {
            path: last.path.clone(),
            len: last.bytes,
        })
    }

    /// The zeros to preallocate after a run ending at `write_end` (0: none), from the running average
    /// of run sizes, which this run updates.
    fn fill_after_run(&mut self, run_bytes: u64, created: bool, write_end: u64) -> u64 {
        self.run_bytes_avg = match self.run_bytes_avg {
            0 => run_bytes,
            avg => (avg * 7 + run_bytes) / 8,
        };
        if created {
            self.fill_off = false;
        }
        // A journaled log's own writes are never on a commit's fsync: a fill would save nothing.
        if self.run_bytes_avg < PREALLOCATE_RUN_BYTES_MAX
            && !self.fill_off
            && !self.config.journaled
        {
            self.config
                .preallocate_bytes
                .min(self.config.segment_bytes_max / 8)
                .min(self.config.segment_bytes_max.saturating_sub(write_end))
        } else {
            0
        }
    }

    /// The syncs that make the run durable, unless the owner journal does.
    fn push_syncs(&self, path: &str, name_durable: bool, ops: &mut Vec<IoOp>, stages: &mut Stages) {
        if !self.config.journaled {
            ops.push(IoOp::SyncData {
                path: path.to_string(),
            });
            stages.push(Stage::Sync);
        }
        if !name_durable && !self.config.journaled {
            ops.push(IoOp::SyncDir {
                dir: self.config.dir.clone(),
            });
            stages.push(Stage::SyncDir);
        }
    }

    /// Encodes a run as frames of about `frame_records_bytes_target` record bytes each.
    pub(super) fn encode_run(&self, views: &[RecordView<'_>]) -> (Vec<u8>, Vec<FrameMeta>) {
        let total: usize = views.iter().map(RecordView::framed_len).sum();
        let mut run = Vec::with_capacity(total + FRAME_HEADER_BYTES * (1 + total / 4096));
        let mut frames = Vec::new();
        let mut start = 0;
        let mut base = self.high_watermark;
        while start < views.len() {
            let mut end = start + 1;
            let mut bytes = views[start].framed_len();
            while end < views.len() {
                let next = views[end].framed_len();
                if bytes + next > self.config.frame_records_bytes_target
                    || bytes + next > FRAME_RECORDS_BYTES_MAX
                    || end - start >= i32::MAX as usize
                {
                    break;
                }
                bytes += next;
                end += 1;
            }
            let position = run.len();
            encode_frame(&mut run, base, &views[start..end]);
            let crc_bytes = &run[position + 23..position + FRAME_HEADER_BYTES];
            frames.push(FrameMeta {
                base,
                count: (end - start) as u32,
                position: position as u64,
                records_bytes: bytes as u32,
                crc: u32::from_be_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]),
            });
            base = Offset(base.0 + (end - start) as u64);
            start = end;
        }
        (run, frames)
    }

    pub(super) fn on_commit_io(&mut self, pending: PendingCommit, completion: IoCompletion) {
        let outcome = match completion.result {
            Ok(mut replies) => match replies.pop() {
                Some(IoReply::Data(bytes)) if verify_run(&pending, &bytes, self.verify_crc()) => {
                    if self.config.journaled {
                        return self.hand_to_journal(pending, bytes);
                    }
                    Ok(())
                }
                _ => Err(CommitFault::ReadBackMismatch),
            },
            Err((index, fault)) => Err(match pending.stages.get(index).as_ref() {
                Some(Stage::Seal) | Some(Stage::Create) => CommitFault::Create(fault),
                Some(Stage::Fill) => {
                    // A nearly full disk may hold the frames but not the zeros: commits go on
                    // without a fill until the next segment.
                    self.fill_off = true;
                    CommitFault::Write(fault)
                }
                Some(Stage::Write) => CommitFault::Write(fault),
                Some(Stage::Sync) | Some(Stage::SyncDir) => CommitFault::Sync(fault),
                Some(Stage::ReadBack) | None => CommitFault::ReadBack(fault),
            }),
        };
        match outcome {
            Ok(()) => self.apply_commit(pending),
            Err(fault) => self.discard_commit(pending, fault),
        }
    }

    /// A journaled commit is written and read back here: its frames go to the owner journal, and the
    /// commit waits for the journal's fsync before anything becomes visible.
    fn hand_to_journal(&mut self, pending: PendingCommit, bytes: Vec<u8>) {
        self.writes += 1;
        self.dirty.insert(pending.segment, self.writes);
        // Each frame runs to the next one's start (the last to the run's end).
        let frames = pending
            .frames
            .iter()
            .enumerate()
            .map(|(index, frame)| {
                let start = frame.position as usize;
                let next = pending
                    .frames
                    .get(index + 1)
                    .map_or(bytes.len(), |next| next.position as usize);
                let end = Offset(frame.base.0 + u64::from(frame.count));
                (start, next - start, end)
            })
            .collect();
        let run = JournalRun {
            segment: pending.segment,
            position: pending.position,
            bytes,
            frames,
        };
        self.outputs.push_back(LogOutput::Journal {
            id: pending.id,
            run,
        });
        if self.config.plant.is(PlantedBug::VisibleBeforeJournalSync) {
            return self.apply_commit(pending);
        }
        self.phase = Phase::Journaling(Box::new(pending));
    }

    pub(super) fn on_journal_done(&mut self, id: LogCommitId, result: Result<(), IoFault>) {
        let pending = match std::mem::replace(&mut self.phase, Phase::Ready) {
            Phase::Journaling(pending) if pending.id == id => pending,
            phase @ (Phase::Listing(_)
            | Phase::Measuring(..)
            | Phase::Scanning(..)
            | Phase::Rewriting(..)
            | Phase::Finalizing(..)
            | Phase::Ready
            | Phase::Committing(_)
            | Phase::Journaling(_)
            | Phase::Repairing(..)
            | Phase::Rolling(..)
            | Phase::Latched(..)
            | Phase::OpenFailed(_)) => {
                // An answer for a commit this log no longer waits for (the planted bug's).
                self.phase = phase;
                return;
            }
        };
        match result {
            Ok(()) => self.apply_commit(*pending),
            Err(fault) => self.discard_commit(*pending, CommitFault::Sync(fault)),
        }
    }

    /// A lazy sync of every segment written since its last sync (and the directory, while a segment's
    /// name is not durable). It runs on its own lane, beside commits: it covers the writes completed
    /// before it was issued, so it vouches for the records below the high watermark of that moment.
    /// After a failed sync it is a resync: the unsynced ranges are read back first.
    pub(super) fn on_sync(&mut self) {
        if !self.config.journaled || self.sync.is_some() {
            return;
        }
        if matches!(
            self.phase,
            Phase::Listing(..)
                | Phase::Measuring(..)
                | Phase::Scanning(..)
                | Phase::Rewriting(..)
                | Phase::Finalizing(..)
                | Phase::OpenFailed(..)
        ) {
            return;
        }
        let names: Vec<Offset> = self
            .segments
            .iter()
            .filter(|(_, segment)| !segment.name_durable)
            .map(|(&base, _)| base)
            .collect();
        if self.dirty.is_empty() && names.is_empty() && !self.resync {
            let through = self.high_watermark;
            self.outputs.push_back(LogOutput::Synced { through });
            return;
        }
        if self.resync && !matches!(self.phase, Phase::Ready) {
            // A commit in flight wrote frames the failed sync may have dropped too; the resync reads
            // back only visible frames, so it waits until that commit has landed or been cut off.
            self.outputs.push_back(LogOutput::SyncDeferred);
            return;
        }
        let covered: Vec<(Offset, u64)> = self
            .segments
            .iter()
            .filter(|(base, segment)| {
                self.dirty.contains_key(base)
                    || (self.resync && segment.synced_bytes < segment.bytes)
            })
            .map(|(&base, segment)| (base, segment.bytes))
            .collect();
        let (ops, reading) = if self.resync {
            self.resync_reads(&covered)
        } else {
            (self.sync_ops(&covered, !names.is_empty()), None)
        };
        let io = self.request(self.config.sync_lane, ops);
        self.sync = Some(LazySync {
            io,
            writes: self.writes,
            through: self.high_watermark,
            names,
            covered,
            reading,
            failures: self.sync_failures,
        });
    }

    fn sync_ops(&self, covered: &[(Offset, u64)], dir: bool) -> Vec<IoOp> {
        let mut ops: Vec<IoOp> = covered
            .iter()
            .map(|&(base, _)| IoOp::SyncData {
                path: self.segment_path(base),
            })
            .collect();
        if dir {
            ops.push(IoOp::SyncDir {
                dir: self.config.dir.clone(),
            });
        }
        ops
    }

    /// Reads back every range no successful sync covered: a failed sync may have dropped their pages
    /// while leaving them in the cache marked clean, so they are written again before the next sync.
    fn resync_reads(&self, covered: &[(Offset, u64)]) -> (Vec<IoOp>, Option<Vec<ResyncRange>>) {
        let mut ops = Vec::new();
        let mut ranges = Vec::new();
        for &(base, bytes) in covered {
            let segment = &self.segments[&base];
            let from = segment.synced_bytes.min(bytes);
            ops.push(IoOp::ReadAt {
                path: segment.path.clone(),
                offset: from,
                len: (bytes - from) as usize,
            });
            ranges.push((base, from, segment.end_offset));
        }
        (ops, Some(ranges))
    }

    pub(super) fn on_sync_io(&mut self, completion: IoCompletion) {
        let Some(mut sync) = self.sync.take() else {
            return;
        };
        let replies = match completion.result {
            Ok(replies) => replies,
            Err((_, fault)) => return self.sync_failed(fault),
        };
        if let Some(ranges) = sync.reading.take() {
            return self.rewrite_ranges(sync, ranges, replies);
        }
        if self.sync_failures != sync.failures {
            // A repair's sync failed meanwhile: pages this sync was to cover may be gone.
            self.outputs.push_back(LogOutput::SyncFailed(IoFault::Other(
                "another sync of the log failed meanwhile".into(),
            )));
            return;
        }
        self.resync = false;
        // A segment a roll created whose commit waits for the journal is not held yet, so the sync
        // did not cover it: it stays dirty.
        let covered = &sync.covered;
        self.dirty.retain(|base, written| {
            *written > sync.writes || !covered.iter().any(|(covered, _)| covered == base)
        });
        for &(base, bytes) in &sync.covered {
            if let Some(segment) = self.segments.get_mut(&base) {
                segment.synced_bytes = segment.synced_bytes.max(bytes);
            }
        }
        for base in sync.names {
            if let Some(segment) = self.segments.get_mut(&base) {
                segment.name_durable = true;
            }
        }
        self.outputs.push_back(LogOutput::Synced {
            through: sync.through,
        });
    }

    /// A resync's read-back came: every range must be whole frames that verify and continue each
    /// other up to the segment's end; then they are written again and synced.
    fn rewrite_ranges(
        &mut self,
        mut sync: LazySync,
        ranges: Vec<ResyncRange>,
        replies: Vec<IoReply>,
    ) {
        let mut ops = Vec::with_capacity(ranges.len() * 2 + 1);
        for (&(base, from, end), reply) in ranges.iter().zip(replies) {
            let IoReply::Data(bytes) = reply else {
                return self.sync_failed(IoFault::Other("unexpected reply to read".into()));
            };
            if !frames_continue_to(&bytes, end, self.verify_crc()) {
                return self.sync_failed(IoFault::Other(
                    "unsynced frames no longer read back whole".into(),
                ));
            }
            if !bytes.is_empty() {
                ops.push(IoOp::WriteAt {
                    path: self.segment_path(base),
                    offset: from,
                    data: bytes,
                });
            }
        }
        ops.extend(self.sync_ops(&sync.covered, !sync.names.is_empty()));
        sync.io = self.request(self.config.sync_lane, ops);
        self.sync = Some(sync);
    }

    /// A sync failed: nothing is vouched for until a resync succeeds (the journal asks again later).
    fn sync_failed(&mut self, fault: IoFault) {
        self.resync = true;
        self.sync_failures += 1;
        self.outputs.push_back(LogOutput::SyncFailed(fault));
    }

    /// Keeps a just-created segment file (its name not yet durable) as the empty active segment.
    pub(super) fn insert_empty_segment(&mut self, base: Offset) {
        let path = self.path(base);
        self.insert_segment(
            base,
            Segment {
                path,
                end_offset: base,
                bytes: 0,
                file_bytes: 0,
                index: SparseIndex::default(),
                name_durable: false,
                synced_bytes: 0,
                first_at_ms: None,
                last_at_ms: None,
            },
        );
    }

    pub(super) fn apply_commit(&mut self, pending: PendingCommit) {
        let interval = self.config.index_interval_bytes;
        if !self.segments.contains_key(&pending.segment) {
            self.insert_empty_segment(pending.segment);
        }
        let segment = self
            .segments
            .get_mut(&pending.segment)
            .expect("inserted above");
        for frame in &pending.frames {
            segment
                .index
                .note_frame(frame.base, pending.position + frame.position, interval);
        }
        segment.bytes = pending.position + pending.run_bytes;
        segment.file_bytes = pending.file_bytes;
        segment.end_offset = pending.end_offset;
        segment.first_at_ms = segment.first_at_ms.or(Some(pending.committed_at_ms));
        segment.last_at_ms = Some(pending.committed_at_ms);
        // A journaled commit syncs neither the file nor its directory: a lazy sync does.
        segment.name_durable |= !self.config.journaled;
        self.high_watermark = pending.end_offset;
        self.next_offset = pending.end_offset;
        self.last_committed_at_ms = pending.committed_at_ms;
        self.phase = Phase::Ready;
        self.outputs.push_back(LogOutput::CommitDone {
            id: pending.id,
            result: Ok(CommittedRun {
                base: pending.frames[0].base,
                count: pending.end_offset.0 - pending.frames[0].base.0,
                committed_at_ms: pending.committed_at_ms,
            }),
        });
    }

    /// Discards the run above the high watermark and repairs the file (see the module documentation).
    pub(super) fn discard_commit(&mut self, pending: PendingCommit, fault: CommitFault) {
        self.next_offset = self.high_watermark;
        self.outputs.push_back(LogOutput::CommitDone {
            id: pending.id,
            result: Err(fault.clone()),
        });
        if matches!(fault, CommitFault::Create(_)) {
            // Nothing was written; the segment was never ours. The one it would have sealed may have
            // lost its zeros: the next commit into it fills again.
            if let Some(last) = self.segments.values_mut().next_back() {
                last.file_bytes = last.bytes;
            }
            self.phase = Phase::Ready;
            return;
        }
        if pending.created {
            // The file exists (at least in the page cache); keep it as the empty active segment.
            self.insert_empty_segment(pending.segment);
        }
        self.repair(RepairTarget {
            segment: pending.segment,
            position: pending.position,
        });
    }

    pub(super) fn repair(&mut self, target: RepairTarget) {
        if let Some(segment) = self.segments.get_mut(&target.segment) {
            segment.file_bytes = target.position;
        }
        let path = self.segment_path(target.segment);
        // Durably, journaled too: once a roll starts the next segment at the high watermark, a
        // failed commit's frames coming back after a crash would overlap it, and the journal may
        // already have dropped everything before that next segment.
        let ops = vec![
            IoOp::SetLen {
                path: path.clone(),
                len: target.position,
            },
            IoOp::SyncData { path },
        ];
        let io = self.request(self.config.commit_lane, ops);
        self.phase = Phase::Repairing(io, target);
    }

    /// Tries the truncation of a latched log again (the caller spaces attempts out).
    ///
    /// Returns false when the log is not latched. This never re-reads or trusts the tail: it only cuts
    /// the file back to the last position this process knows durable and syncs that, which is why a
    /// latched log is repaired this way rather than reopened (a reopen would re-scan the page cache
    /// and could adopt frames whose fsync failed, then build acknowledged commits on top of them).
    pub fn retry_repair(&mut self) -> bool {
        let Phase::Latched(_, target) = self.phase else {
            return false;
        };
        self.repair(target);
        true
    }

    pub(super) fn on_repair_io(&mut self, target: RepairTarget, completion: IoCompletion) {
        match completion.result {
            Ok(_) => self.phase = Phase::Ready,
            Err((_, fault)) => {
                if self.config.journaled {
                    // The failed sync may have dropped pages of records below the high watermark
                    // that no sync covered yet (fsyncgate): a later sync would "succeed" without them.
                    self.resync = true;
                    self.sync_failures += 1;
                }
                self.phase = Phase::Latched(fault.clone(), target);
                self.outputs.push_back(LogOutput::Latched(fault));
            }
        }
    }
}

/// True when `bytes` are whole frames that verify, each continuing the previous, the last ending at
/// `end` (empty bytes: nothing to check).
fn frames_continue_to(bytes: &[u8], end: Offset, verify_crc: bool) -> bool {
    let mut position = 0;
    let mut next: Option<Offset> = None;
    while position < bytes.len() {
        match verify_frame_checked(&bytes[position..], verify_crc) {
            Ok(header) if next.is_none_or(|next| next == header.base_offset) => {
                next = Some(Offset(header.base_offset.0 + u64::from(header.count)));
                position += header.frame_len();
            }
            Ok(_) | Err(_) => return false,
        }
    }
    next.is_none_or(|next| next == end)
}

/// True when `bytes` are exactly the frames of `pending`: each decodes (CRC, structure) with the
/// header that was written, and nothing else follows.
fn verify_run(pending: &PendingCommit, bytes: &[u8], verify_crc: bool) -> bool {
    if bytes.len() as u64 != pending.run_bytes {
        return false;
    }
    pending.frames.iter().all(|meta| {
        let Some(at) = bytes.get(meta.position as usize..) else {
            return false;
        };
        match verify_frame_checked(at, verify_crc) {
            Ok(header) => {
                header.base_offset == meta.base
                    && header.count == meta.count
                    && header.records_bytes == meta.records_bytes
                    && header.crc == meta.crc
            }
            Err(_) => false,
        }
    })
}
