//! Open and recovery of [`PartitionLog`]: list, measure and scan every segment, then make the
//! verified prefix durable before anything is served (see the module documentation of `log`).

use super::*;

impl PartitionLog {
    pub(super) fn on_recovery_io(&mut self, completion: IoCompletion) {
        let phase = std::mem::replace(&mut self.phase, Phase::Ready);
        let replies = match completion.result {
            Ok(replies) => replies,
            Err((_, fault)) if matches!(phase, Phase::Finalizing(..)) => {
                return self.fail_open(RecoveryError::Sync(fault))
            }
            Err((_, fault)) => return self.fail_open(RecoveryError::Io(fault)),
        };
        match phase {
            Phase::Listing(_) => self.on_listed(replies),
            Phase::Measuring(_, bases) => self.on_measured(bases, replies),
            Phase::Scanning(_, scan) => self.on_segment_read(scan, replies),
            Phase::Finalizing(_, report) => {
                self.phase = Phase::Ready;
                self.outputs.push_back(LogOutput::Opened(report));
            }
            other => unreachable!("recovery completion in phase {other:?}"),
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
            return self.finalize(None, Vec::new(), 0, None);
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
                _ => return self.fail_open(RecoveryError::Io(bad_reply("len"))),
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
        });
    }

    pub(super) fn read_next_segment(&mut self, scan: ScanState) {
        let base = scan.bases[scan.next];
        let len = scan.lens[scan.next];
        let Ok(len_usize) = usize::try_from(len) else {
            return self.fail_open(RecoveryError::SegmentTooLarge { segment: base, len });
        };
        let path = self.path(base);
        let io = self.request(
            self.config.commit_lane,
            vec![IoOp::ReadAt {
                path,
                offset: 0,
                len: len_usize,
            }],
        );
        self.phase = Phase::Scanning(io, scan);
    }

    pub(super) fn on_segment_read(&mut self, mut scan: ScanState, replies: Vec<IoReply>) {
        let Some(IoReply::Data(bytes)) = replies.last() else {
            return self.fail_open(RecoveryError::Io(bad_reply("read")));
        };
        let base = scan.bases[scan.next];
        let is_last = scan.next + 1 == scan.bases.len();
        if let Some(previous) = self.segments.values().next_back() {
            if previous.end_offset != base {
                let expected = previous.end_offset;
                return self.fail_open(RecoveryError::Discontiguous {
                    segment: base,
                    expected,
                });
            }
        }
        let mut result = scan_segment_checked(
            base,
            bytes,
            self.config.index_interval_bytes,
            self.verify_crc(),
        );
        let file_len = bytes.len() as u64;
        // Zeros from where the frames end to the end of the file: the preallocated fill, or an append
        // whose pages never reached the disk. Neither holds a frame.
        let mut zero_tail = false;
        // In any segment: a sealed one may hold damage skipped while it was the last.
        while let Some((byte, damage)) = result.damage {
            if bytes[byte as usize..].iter().all(|&b| b == 0) {
                zero_tail = true;
                break;
            }
            // A tail is a tear unless verified frames lie behind it; then the damaged bytes are
            // skipped and the frames behind them kept (see `verified_frame_behind`).
            let Some((resume, resume_offset)) =
                verified_frame_behind(bytes, byte, result.end_offset)
            else {
                break;
            };
            let Ok(resume_usize) = usize::try_from(resume) else {
                break;
            };
            scan.skipped.push(SkippedDamage {
                segment: base,
                byte,
                damage,
                offsets: (result.end_offset, resume_offset),
            });
            let rest = scan_segment_checked(
                resume_offset,
                &bytes[resume_usize..],
                self.config.index_interval_bytes,
                self.verify_crc(),
            );
            result.index.extend_shifted(rest.index, resume);
            result.end_offset = rest.end_offset;
            result.verified_bytes = resume + rest.verified_bytes;
            // The last run may span the damage: frames of one commit time behind it, that of the
            // frames before it. Then the rewrite in `finalize` starts before the damage.
            let spans =
                rest.last_run_start == 0 && rest.committed_at_ms_max == result.committed_at_ms_max;
            if !spans {
                result.last_run_start = resume + rest.last_run_start;
            }
            result.committed_at_ms_max = result.committed_at_ms_max.max(rest.committed_at_ms_max);
            result.damage = rest.damage.map(|(at, damage)| (resume + at, damage));
        }
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
            },
        );
        if is_last {
            let damage = result.damage.map(|(byte, damage)| (base, byte, damage));
            let last_run =
                bytes[result.last_run_start as usize..result.verified_bytes as usize].to_vec();
            let rewrite = (!last_run.is_empty()).then_some((result.last_run_start, last_run));
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
    /// costs one write of the frames of the last commit time, usually one run.
    pub(super) fn finalize(
        &mut self,
        damage: Option<(Offset, u64, FrameDamage)>,
        skipped: Vec<SkippedDamage>,
        truncated_bytes: u64,
        rewrite: Option<(u64, Vec<u8>)>,
    ) {
        let report = RecoveryReport {
            segments: self.segments.len(),
            oldest_offset: self.oldest_offset(),
            high_watermark: self.high_watermark,
            truncated_bytes,
            damage,
            skipped,
        };
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
