//! Open and recovery of [`PartitionLog`]: list, measure and scan every segment, then make the
//! verified prefix durable before anything is served (see the module documentation of `log`).

use super::*;

/// Damage recovery stepped over because verified frames lie behind it (rot, or a failed commit's
/// leftovers: not a tear).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedDamage {
    /// The segment's base offset.
    pub segment: Offset,
    /// Byte position of the bad frame.
    pub byte: u64,
    /// What is wrong there.
    pub damage: FrameDamage,
    /// The offsets lost with the damaged bytes: `[first, end)`.
    pub offsets: (Offset, Offset),
}

/// What recovery found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segments kept.
    pub segments: usize,
    /// The oldest retained offset.
    pub oldest_offset: Offset,
    /// The recovered high watermark: the end of the verified prefix.
    pub high_watermark: Offset,
    /// Bytes truncated from the last segment's tail.
    pub truncated_bytes: u64,
    /// Where the last segment's verified prefix ended early, and why: `(segment base, byte, damage)`.
    pub damage: Option<(Offset, u64, FrameDamage)>,
    /// Damage with verified frames behind it, in any segment: skipped, never truncated. Its
    /// offsets stay below the high watermark and read as [`LogReadError::Unreadable`].
    pub skipped: Vec<SkippedDamage>,
}

/// Why a log could not be opened. The directory is left as it was (except a truncated tail).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryError {
    /// An I/O operation of the recovery failed before anything was changed; opening again may work.
    #[error("i/o during recovery: {0}")]
    Io(IoFault),
    /// The final truncate-and-sync of the recovered tail failed. Which of the tail's bytes are durable
    /// is now unknown while the page cache still shows them all (fsyncgate), so this process must not
    /// open the log again: only a restart that drops the page cache (power cycle, reboot) may.
    #[error("sync at the end of recovery failed: {0}")]
    Sync(IoFault),
    /// A sealed (not last) segment has a bad frame and its verified frames already reach past the
    /// next segment's base: the segments contradict each other.
    #[error("segment {segment} damaged at byte {byte}: {damage}")]
    Corrupt {
        /// The segment's base offset.
        segment: Offset,
        /// Byte position of the bad frame.
        byte: u64,
        /// What is wrong there.
        damage: FrameDamage,
    },
    /// A segment does not start where the previous one ended.
    #[error("segment {segment} does not continue the log at offset {expected}")]
    Discontiguous {
        /// The segment's base offset.
        segment: Offset,
        /// Where the previous segment ended.
        expected: Offset,
    },
    /// A segment's length does not fit in memory.
    #[error("segment {segment} too large to scan ({len} bytes)")]
    SegmentTooLarge {
        /// The segment's base offset.
        segment: Offset,
        /// Its length.
        len: u64,
    },
}

impl RecoveryError {
    /// True when opening the log again in this process is safe (nothing was left of unknown durability).
    pub fn reopen_allowed(&self) -> bool {
        match self {
            RecoveryError::Io(_) => true,
            RecoveryError::Sync(_)
            | RecoveryError::Corrupt { .. }
            | RecoveryError::Discontiguous { .. }
            | RecoveryError::SegmentTooLarge { .. } => false,
        }
    }
}

impl PartitionLog {
    pub(super) fn on_recovery_io(&mut self, completion: IoCompletion) {
        let phase = std::mem::replace(&mut self.phase, Phase::Ready);
        let replies = match completion.result {
            Ok(replies) => replies,
            // A write of the last run may have failed, or the sync: which bytes are durable is unknown.
            Err((_, fault)) if writes_run(&phase) => {
                return self.fail_open(RecoveryError::Sync(fault))
            }
            Err((_, fault)) => return self.fail_open(RecoveryError::Io(fault)),
        };
        match phase {
            Phase::Listing(_) => self.on_listed(replies),
            Phase::Measuring(_, bases) => self.on_measured(bases, replies),
            Phase::Scanning(_, scan) => self.on_segment_read(scan, replies),
            Phase::Rewriting(_, reread) => self.on_reread(*reread, replies),
            Phase::Finalizing(_, report) => {
                self.phase = Phase::Ready;
                self.outputs.push_back(LogOutput::Opened(report));
            }
            other @ (Phase::Ready
            | Phase::Committing(_)
            | Phase::Journaling(_)
            | Phase::Repairing(..)
            | Phase::Rolling(..)
            | Phase::Latched(..)
            | Phase::OpenFailed(_)) => unreachable!("recovery completion in phase {other:?}"),
        }
    }

    pub(super) fn on_listed(&mut self, replies: Vec<IoReply>) {
        let mut bases: Vec<Offset> = match replies.last() {
            Some(IoReply::Names(names)) => names
                .iter()
                .filter_map(|name| parse_segment_name(name))
                .collect(),
            _ => return self.fail_open(RecoveryError::Io(bad_reply("list"))),
        };
        bases.sort();
        if bases.is_empty() {
            return self.finalize(None, Vec::new(), 0, RunRewrite::None);
        }
        let ops = bases
            .iter()
            .map(|&base| IoOp::Len {
                path: self.path(base),
            })
            .collect();
        let io = self.request(self.config.commit_lane, ops);
        self.phase = Phase::Measuring(io, bases);
    }

    pub(super) fn on_measured(&mut self, bases: Vec<Offset>, replies: Vec<IoReply>) {
        let mut lens = Vec::with_capacity(bases.len());
        for reply in &replies {
            match reply {
                IoReply::Len(len) => lens.push(*len),
                IoReply::Done | IoReply::Data(_) | IoReply::Crc(..) | IoReply::Names(_) => {
                    return self.fail_open(RecoveryError::Io(bad_reply("len")))
                }
            }
        }
        if lens.len() != bases.len() {
            return self.fail_open(RecoveryError::Io(bad_reply("len")));
        }
        self.read_next_segment(ScanState {
            bases,
            lens,
            next: 0,
            skipped: Vec::new(),
            reading: None,
        });
    }

    pub(super) fn read_next_segment(&mut self, scan: ScanState) {
        let base = scan.bases[scan.next];
        let len = scan.lens[scan.next];
        if usize::try_from(len).is_err() {
            return self.fail_open(RecoveryError::SegmentTooLarge { segment: base, len });
        }
        // Before any read: it needs none of the segment's bytes.
        if let Some(previous) = self.segments.values().next_back() {
            if previous.end_offset != base {
                let expected = previous.end_offset;
                return self.fail_open(RecoveryError::Discontiguous {
                    segment: base,
                    expected,
                });
            }
        }
        let is_last = scan.next + 1 == scan.bases.len();
        let piece = PieceScan::new(
            base,
            len,
            self.config.recovery_read_bytes_max,
            is_last,
            self.config.index_interval_bytes,
            self.verify_crc(),
        );
        self.scan_pieces(scan, Box::new(piece));
    }

    /// Scans what the segment's pieces read so far allow, then reads the next piece on
    /// `commit_lane`, or ends the segment.
    fn scan_pieces(&mut self, mut scan: ScanState, mut piece: Box<PieceScan>) {
        let Some(read) = piece.advance() else {
            return self.on_segment_scanned(scan, piece.finish());
        };
        let path = self.path(scan.bases[scan.next]);
        let io = self.request(
            self.config.commit_lane,
            vec![IoOp::ReadAt {
                path,
                offset: read.offset,
                len: read.len,
            }],
        );
        scan.reading = Some((piece, read));
        self.phase = Phase::Scanning(io, scan);
    }

    pub(super) fn on_segment_read(&mut self, mut scan: ScanState, replies: Vec<IoReply>) {
        let (Some(IoReply::Data(bytes)), Some((mut piece, read))) =
            (replies.into_iter().last(), scan.reading.take())
        else {
            return self.fail_open(RecoveryError::Io(bad_reply("read")));
        };
        piece.on_piece(read, bytes);
        self.scan_pieces(scan, piece);
    }

    /// Adds the scanned segment (skipping damage a sealed segment's successor proves a hole), then
    /// scans the next one or finalizes.
    fn on_segment_scanned(&mut self, mut scan: ScanState, done: PieceScanDone) {
        let base = scan.bases[scan.next];
        let is_last = scan.next + 1 == scan.bases.len();
        let PieceScanDone {
            mut result,
            skipped,
            zero_tail,
            file_len,
            last_run,
        } = done;
        scan.skipped.extend(skipped);
        let next_base = scan.bases.get(scan.next + 1).copied();
        if zero_tail && next_base.is_none_or(|next_base| next_base == result.end_offset) {
            // The frames end where the next segment (if any) begins: nothing is missing.
            result.damage = None;
        }
        if let (Some((byte, damage)), Some(next_base)) = (result.damage, next_base) {
            // Damage at the end of a sealed segment: the next segment's name proves where this one
            // ended, so its offsets behind the damage are a hole, reported, not a reason to refuse the
            // whole partition (its bytes stay on disk as they are).
            if next_base < result.end_offset {
                return self.fail_open(RecoveryError::Corrupt {
                    segment: base,
                    byte,
                    damage,
                });
            }
            scan.skipped.push(SkippedDamage {
                segment: base,
                byte,
                damage,
                offsets: (result.end_offset, next_base),
            });
            result.end_offset = next_base;
        }
        if let Some(at_ms) = result.committed_at_ms_max {
            self.last_committed_at_ms = self.last_committed_at_ms.max(at_ms);
        }
        self.high_watermark = result.end_offset;
        self.next_offset = result.end_offset;
        let path = self.path(base);
        self.insert_segment(
            base,
            Segment {
                path,
                end_offset: result.end_offset,
                bytes: result.verified_bytes,
                // `finalize` cuts the last segment back to its frames.
                file_bytes: if is_last {
                    result.verified_bytes
                } else {
                    file_len
                },
                index: result.index,
                name_durable: true,
                // `finalize` syncs the verified frames before anything is served.
                synced_bytes: result.verified_bytes,
                first_at_ms: result.committed_at_ms_first,
                last_at_ms: result.committed_at_ms_max,
            },
        );
        if is_last {
            let damage = result.damage.map(|(byte, damage)| (base, byte, damage));
            let run = (result.last_run_start, result.verified_bytes);
            let rewrite = match last_run {
                _ if run.0 == run.1 => RunRewrite::None,
                Some(bytes) => RunRewrite::Held(run.0, bytes),
                None => RunRewrite::Reread(run.0, run.1),
            };
            let skipped = std::mem::take(&mut scan.skipped);
            return self.finalize(damage, skipped, file_len - result.verified_bytes, rewrite);
        }
        scan.next += 1;
        self.read_next_segment(scan);
    }

    /// Truncates the last segment to its verified prefix, rewrites its last run, and makes it, and the
    /// directory, durable.
    ///
    /// The rewrite closes the fsyncgate window of a process that died between a failed fdatasync and
    /// the truncation that follows it: the lost run is then the file's last run, still in the page cache
    /// as valid frames but marked clean, so a bare fdatasync would "succeed" without writing it. Writing
    /// the same bytes again dirties those pages, so the sync below really persists them (or fails). It
    /// costs one write of the frames of the last commit time, usually one run. A last run longer than
    /// the scan kept (a piece) is read again and written back a piece at a time first
    /// ([`Self::reread_run`]); its last piece is the write of the final request.
    pub(super) fn finalize(
        &mut self,
        damage: Option<(Offset, u64, FrameDamage)>,
        skipped: Vec<SkippedDamage>,
        truncated_bytes: u64,
        rewrite: RunRewrite,
    ) {
        let report = RecoveryReport {
            segments: self.segments.len(),
            oldest_offset: self.oldest_offset(),
            high_watermark: self.high_watermark,
            truncated_bytes,
            damage,
            skipped,
        };
        match rewrite {
            RunRewrite::None => self.finish_open(report, None),
            RunRewrite::Held(offset, bytes) => self.finish_open(report, Some((offset, bytes))),
            RunRewrite::Reread(start, end) => {
                let reread = Reread {
                    report,
                    end,
                    read: PieceRead {
                        offset: start,
                        len: 0,
                    },
                    wrote: false,
                };
                self.reread_run(reread, None);
            }
        }
    }

    /// Reads the next piece of the last run from `reread.read`'s end, writing back the piece read
    /// before it (`write`) in the same request.
    fn reread_run(&mut self, mut reread: Reread, write: Option<(u64, Vec<u8>)>) {
        let Some(path) = self
            .segments
            .values()
            .next_back()
            .map(|last| last.path.clone())
        else {
            unreachable!("a last run lies in the last segment")
        };
        let offset = reread.read.offset + reread.read.len as u64;
        let len = (reread.end - offset).min(self.config.recovery_read_bytes_max.max(1) as u64);
        reread.read = PieceRead {
            offset,
            len: len as usize,
        };
        let mut ops = Vec::with_capacity(2);
        if let Some((offset, data)) = write {
            reread.wrote = true;
            ops.push(IoOp::WriteAt {
                path: path.clone(),
                offset,
                data,
            });
        }
        ops.push(IoOp::ReadAt {
            path,
            offset: reread.read.offset,
            len: reread.read.len,
        });
        let io = self.request(self.config.commit_lane, ops);
        self.phase = Phase::Rewriting(io, Box::new(reread));
    }

    pub(super) fn on_reread(&mut self, reread: Reread, replies: Vec<IoReply>) {
        let bytes = match replies.into_iter().last() {
            Some(IoReply::Data(bytes)) if bytes.len() == reread.read.len => bytes,
            // The run was scanned a moment ago: a short read means the file changed under the log.
            _ if reread.wrote => return self.fail_open(RecoveryError::Sync(bad_reply("read"))),
            _ => return self.fail_open(RecoveryError::Io(bad_reply("read"))),
        };
        let write = (reread.read.offset, bytes);
        if reread.read.offset + reread.read.len as u64 >= reread.end {
            return self.finish_open(reread.report, Some(write));
        }
        self.reread_run(reread, Some(write));
    }

    /// Emits the final request of recovery: see [`Self::finalize`].
    fn finish_open(&mut self, report: RecoveryReport, rewrite: Option<(u64, Vec<u8>)>) {
        let mut ops = Vec::new();
        if let Some(last) = self.segments.values().next_back() {
            let path = last.path.clone();
            // Always, not only after damage: a process restart sees the page cache, and a truncate
            // whose sync failed before it (fsyncgate drops it, yet the cache shows the short file)
            // would otherwise leave the old tail on disk, past the frames, in what becomes a sealed
            // segment at the next roll.
            ops.push(IoOp::SetLen {
                path: path.clone(),
                len: last.bytes,
            });
            if let Some((offset, data)) = rewrite {
                ops.push(IoOp::WriteAt {
                    path: path.clone(),
                    offset,
                    data,
                });
            }
            ops.push(IoOp::SyncData { path });
        }
        ops.push(IoOp::SyncDir {
            dir: self.config.dir.clone(),
        });
        let io = self.request(self.config.commit_lane, ops);
        self.phase = Phase::Finalizing(io, report);
    }

    pub(super) fn fail_open(&mut self, error: RecoveryError) {
        self.segments.clear();
        self.high_watermark = Offset(0);
        self.next_offset = Offset(0);
        self.phase = Phase::OpenFailed(error.clone());
        self.outputs.push_back(LogOutput::OpenFailed(error));
    }
}

/// True when the request of `phase` wrote to the last segment or synced it.
fn writes_run(phase: &Phase) -> bool {
    match phase {
        Phase::Finalizing(..) => true,
        Phase::Rewriting(_, reread) => reread.wrote,
        Phase::Listing(_)
        | Phase::Measuring(..)
        | Phase::Scanning(..)
        | Phase::Ready
        | Phase::Committing(_)
        | Phase::Journaling(_)
        | Phase::Repairing(..)
        | Phase::Rolling(..)
        | Phase::Latched(..)
        | Phase::OpenFailed(_) => false,
    }
}
