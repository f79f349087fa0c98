//! Retention of [`PartitionLog`]: whole sealed segments go from the front, by age and by size.
//!
//! # Contract
//! - **When.** [`LogInput::Retain`] carries the topic's policy and the wall clock; the owner feeds it
//!   every `retention_check_interval_ms`. Nothing else starts a deletion.
//! - **Age.** The oldest sealed segment goes while its *newest* record is older than `retention_ms`
//!   (commit times never go backwards, so every record in it is). The active segment is never deleted;
//!   once its *oldest* record has passed retention and no commit is in flight it is rolled (a new empty
//!   segment at the high watermark, `[SetLen (zeros trimmed), Create, SyncDir]` on the commit lane),
//!   so an idle partition's data expires too: the next check finds it sealed.
//! - **Size** (`retention_bytes > 0`): the oldest sealed segment goes while what would remain is still
//!   at least the bound (Kafka's rule): a partition keeps at least `retention_bytes` of its newest
//!   frames, and at most that plus one segment.
//! - **Only durable segments.** A segment goes only once it is sealed, its name is durable and, in a
//!   journaled log, its frames are synced in its own file (it is not dirty, no resync is owed): the
//!   owner journal then holds none of its bytes it would need to replay. An entitled segment that is
//!   not synced yet starts a lazy sync ([`LogOutput::Synced`] goes to the journal as any other), and
//!   the next check removes it. The journal may still hold
//!   entries of it physically (it trims whole segments, oldest first); its replay drops the entries
//!   of a segment that is missing and whose first retained entry is not at byte 0, which only a
//!   retention can leave (see `journal::replay`).
//! - **Readers first.** The chosen segments leave the log at once: `oldest_offset` moves up, reads
//!   below it are [`LogReadError::BelowOldestRetained`] without I/O. A read already in flight in one
//!   of them pins it: the files are unlinked only once no read in flight names them, and such a read
//!   that cannot serve its records answers `BelowOldestRetained` too.
//! - **Crash-safe.** The unlinks go oldest first, each followed by a directory sync
//!   (`[Remove, SyncDir]*`, on the commit lane): a crash at any point leaves a contiguous suffix of
//!   segments, which recovers as a log whose oldest offset moved up. A failed unlink is reported
//!   ([`LogOutput::RetentionFailed`]) and tried again at the next check.
//! - Every decision is reported as [`LogOutput::Retained`], per reason, when it is made.
//!
//! [`LogInput::Retain`]: super::LogInput::Retain

use std::collections::BTreeMap;

use super::{LogOutput, LogReadError, PartitionLog, Phase, Segment};
use crate::disk::{IoCompletion, IoId, IoOp};
use crate::ids::Offset;
use crate::planted::PlantedBug;

/// A topic's retention, as the owner feeds it with every check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// The wall clock now, Unix ms (the clock commit times are stamped with).
    pub now_ms: u64,
    /// Records older than this go (whole segments at a time).
    pub retention_ms: u64,
    /// Bytes of frames kept at least per partition; 0 = no bound.
    pub retention_bytes: u64,
}

/// Why a segment went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RetainReason {
    /// Its newest record passed `retention_ms`.
    Age,
    /// The newer frames alone reach `retention_bytes`.
    Bytes,
}

impl RetainReason {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            RetainReason::Age => "age",
            RetainReason::Bytes => "bytes",
        }
    }
}

/// Segments one check took away for one reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetainedRange {
    /// Why.
    pub reason: RetainReason,
    /// Segment files.
    pub segments: u64,
    /// Records (offsets) they held.
    pub records: u64,
    /// Bytes of frames they held.
    pub bytes: u64,
    /// The log's oldest offset after them.
    pub oldest: Offset,
}

/// Retention's state inside the log.
#[derive(Clone, Debug, Default)]
pub(super) struct Retention {
    /// The policy of the last check (a roll's completion carries on with it).
    policy: Option<RetentionPolicy>,
    /// Segments taken out of the log whose files are still to be unlinked: base → path.
    doomed: BTreeMap<Offset, String>,
    /// The unlink request in flight and the segments it removes, in order.
    unlinking: Option<(IoId, Vec<Offset>)>,
}

impl PartitionLog {
    /// Whether `id` is retention's unlink in flight.
    pub(super) fn is_retention_io(&self, id: IoId) -> bool {
        self.retention
            .unlinking
            .as_ref()
            .is_some_and(|(io, _)| *io == id)
    }

    pub(super) fn on_retain(&mut self, policy: RetentionPolicy) {
        self.retention.policy = Some(policy);
        match self.phase {
            Phase::Ready | Phase::Committing(..) | Phase::Journaling(..) => {}
            // Opening, repairing or latched: nothing changes until the log is itself again.
            Phase::Listing(..)
            | Phase::Measuring(..)
            | Phase::Scanning(..)
            | Phase::Rewriting(..)
            | Phase::Finalizing(..)
            | Phase::Rolling(..)
            | Phase::Repairing(..)
            | Phase::Latched(..)
            | Phase::OpenFailed(..) => return,
        }
        self.delete_expired(policy);
        if matches!(self.phase, Phase::Ready) && self.active_expired(policy) {
            // The unlinks follow the roll's completion (one request at a time on the commit lane).
            return self.roll_active();
        }
        self.unlink_doomed();
    }

    /// Takes the segments the policy entitles retention to remove out of the log.
    fn delete_expired(&mut self, policy: RetentionPolicy) {
        let unexpired_bug = self.config.plant.is(PlantedBug::RetentionDeletesUnexpired);
        let mut total: u64 = self.segments.values().map(|segment| segment.bytes).sum();
        let mut taken: [Option<RetainedRange>; 2] = [None, None];
        let mut sync_wanted = false;
        while self.segments.len() > 1 {
            let (&base, segment) = self.segments.iter().next().expect("more than one");
            let removable = self.removable(base, segment);
            let judged_at = if unexpired_bug {
                segment.first_at_ms
            } else {
                segment.last_at_ms
            };
            // A segment without a verified record (all damage, or empty) is no younger than the
            // segment behind it.
            let expired = judged_at
                .is_none_or(|at_ms| at_ms.saturating_add(policy.retention_ms) <= policy.now_ms);
            let over = policy.retention_bytes > 0
                && total.saturating_sub(segment.bytes) >= policy.retention_bytes;
            let reason = match (expired, over) {
                (true, _) => RetainReason::Age,
                (false, true) => RetainReason::Bytes,
                (false, false) => break,
            };
            if !removable {
                // Entitled, but its frames are durable only in the owner journal so far: a lazy
                // sync now, and the next check removes it (the journal alone asks for syncs only as
                // its own segments fill, which a quiet node may take hours to do).
                sync_wanted = true;
                break;
            }
            let segment = self.segments.remove(&base).expect("found above");
            total -= segment.bytes;
            let slot = &mut taken[usize::from(reason == RetainReason::Bytes)];
            let range = slot.get_or_insert(RetainedRange {
                reason,
                segments: 0,
                records: 0,
                bytes: 0,
                oldest: base,
            });
            range.segments += 1;
            range.records += segment.end_offset.0 - base.0;
            range.bytes += segment.bytes;
            self.retention.doomed.insert(base, segment.path);
        }
        let oldest = self.oldest_offset();
        for mut range in taken.into_iter().flatten() {
            range.oldest = oldest;
            self.outputs.push_back(LogOutput::Retained(range));
        }
        if sync_wanted {
            // (Nothing when a sync is in flight already: the next check finds it done.)
            self.on_sync();
        }
    }

    /// Whether segment `base` may go: sealed by a later one, its name durable and, journaled, its
    /// frames synced in its own file.
    fn removable(&self, base: Offset, segment: &Segment) -> bool {
        // Not dirty: every write to it came before a sync that succeeded. (`synced_bytes` is no
        // test of it: a sync that raced a journaled commit leaves it short of frames it synced.)
        let synced = !self.config.journaled
            || (!self.resync
                && !self.dirty.contains_key(&base)
                && self
                    .sync
                    .as_ref()
                    .is_none_or(|sync| sync.covered.iter().all(|(covered, _)| *covered != base)));
        segment.name_durable && synced
    }

    /// Whether the active segment's oldest record has passed retention (so it should be rolled).
    fn active_expired(&self, policy: RetentionPolicy) -> bool {
        self.segments.values().next_back().is_some_and(|last| {
            last.bytes > 0
                && last
                    .first_at_ms
                    .is_some_and(|at| at.saturating_add(policy.retention_ms) <= policy.now_ms)
        })
    }

    /// Seals the active segment and starts an empty one at the high watermark.
    fn roll_active(&mut self) {
        let mut ops = Vec::with_capacity(3);
        let seal = self.seal_op();
        let sealing = seal.is_some();
        ops.extend(seal);
        ops.push(IoOp::Create {
            path: self.path(self.high_watermark),
        });
        ops.push(IoOp::SyncDir {
            dir: self.config.dir.clone(),
        });
        let io = self.request(self.config.commit_lane, ops);
        self.phase = Phase::Rolling(io, sealing);
    }

    pub(super) fn on_roll_io(&mut self, sealing: bool, completion: IoCompletion) {
        self.phase = Phase::Ready;
        match completion.result {
            Ok(_) => {
                if let Some(last) = self.segments.values_mut().next_back() {
                    last.file_bytes = last.bytes;
                }
                let base = self.high_watermark;
                self.insert_empty_segment(base);
                let segment = self.segments.get_mut(&base).expect("inserted");
                segment.name_durable = true;
                if let Some(policy) = self.retention.policy {
                    self.delete_expired(policy);
                    self.unlink_doomed();
                }
            }
            Err((index, fault)) => {
                if sealing && index > 0 {
                    if let Some(last) = self.segments.values_mut().next_back() {
                        last.file_bytes = last.bytes;
                    }
                }
                // The next check rolls again (a create truncates whatever this one left).
                self.outputs.push_back(LogOutput::RetentionFailed(fault));
            }
        }
    }

    /// Unlinks the doomed segments no read in flight names, oldest first, unless an unlink runs.
    pub(super) fn unlink_doomed(&mut self) {
        if self.retention.unlinking.is_some() || self.retention.doomed.is_empty() {
            return;
        }
        let pinned = |base: &Offset| self.reads.values().any(|read| read.segment == *base);
        let bases: Vec<Offset> = self
            .retention
            .doomed
            .keys()
            .copied()
            .take_while(|base| !pinned(base))
            .collect();
        if bases.is_empty() {
            return;
        }
        let mut ops = Vec::with_capacity(bases.len() * 2);
        for base in &bases {
            ops.push(IoOp::Remove {
                path: self.retention.doomed[base].clone(),
            });
            ops.push(IoOp::SyncDir {
                dir: self.config.dir.clone(),
            });
        }
        let io = self.request(self.config.commit_lane, ops);
        self.retention.unlinking = Some((io, bases));
    }

    pub(super) fn on_unlink_io(&mut self, completion: IoCompletion) {
        let Some((_, bases)) = self.retention.unlinking.take() else {
            return;
        };
        let done = match &completion.result {
            Ok(_) => bases.len(),
            // Ops go `[Remove, SyncDir]` per segment: the pairs before the failed op are done.
            Err((index, _)) => index / 2,
        };
        for base in &bases[..done] {
            self.retention.doomed.remove(base);
        }
        match completion.result {
            Ok(_) => self.unlink_doomed(),
            // Tried again at the next check.
            Err((_, fault)) => self.outputs.push_back(LogOutput::RetentionFailed(fault)),
        }
    }

    /// A read whose segment retention took away while it was in flight: the error it would give is
    /// "aged out" (its records are no longer the log's), and its pin may be the last one.
    pub(super) fn aged_out(&self, segment: Offset) -> Option<LogReadError> {
        (!self.segments.contains_key(&segment)).then(|| LogReadError::BelowOldestRetained {
            oldest: self.oldest_offset(),
        })
    }

    /// The commit time of the oldest record kept (`partition_stats`' `oldest_segment_at`).
    pub(super) fn oldest_segment_at_ms(&self) -> Option<u64> {
        self.segments
            .values()
            .find_map(|segment| segment.first_at_ms)
    }

    /// Segments taken out of the log whose files are not yet unlinked.
    #[cfg(test)]
    pub(crate) fn doomed_segments(&self) -> usize {
        self.retention.doomed.len()
    }
}
