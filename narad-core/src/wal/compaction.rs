//! Compaction decisions: delete segments behind the synced checkpoint, rotate a dispatched active segment.

use super::{IngressWal, Pending, Segment, WalOutput, WalWarning};
use crate::disk::{IoOp, IoReply};
use crate::error::IoFault;
use crate::ids::Seq;
use crate::planted::PlantedBug;
use crate::time::Instant;

impl IngressWal {
    pub(super) fn on_checkpoint_synced(&mut self, now: Instant, seq: Seq) {
        assert!(
            seq <= self.durable_next,
            "checkpoint {seq} passes the durable frontier {}",
            self.durable_next
        );
        if seq > self.checkpoint_synced {
            self.checkpoint_synced = seq;
            self.compact_blocked = false;
        }
        self.compact(now);
    }

    /// Deletes every segment (never the last one on disk) whose records are all below the synced
    /// checkpoint, oldest first, and rotates a fully dispatched active segment.
    pub(super) fn compact(&mut self, now: Instant) {
        if !self.compact_in_flight && !self.compact_blocked {
            let mut victims: Vec<Segment> = Vec::new();
            loop {
                let mut firsts = self.segments.keys();
                let (Some(&first), Some(&second)) = (firsts.next(), firsts.next()) else {
                    break;
                };
                // The segment holds [first, second): all below the checkpoint iff second <= it.
                let behind = if self
                    .config
                    .plant
                    .is(PlantedBug::CompactAheadOfSyncedCheckpoint)
                {
                    // Planted: the segment holding the checkpoint goes too.
                    first < self.checkpoint_synced
                } else {
                    second <= self.checkpoint_synced
                };
                if !behind {
                    break;
                }
                victims.push(self.segments.remove(&first).expect("listed above"));
            }
            if !victims.is_empty() {
                let mut ops: Vec<IoOp> = victims
                    .iter()
                    .map(|segment| IoOp::Remove {
                        path: self.config.segment_path(segment.first),
                    })
                    .collect();
                ops.push(IoOp::SyncDir {
                    dir: self.config.dir.clone(),
                });
                self.compact_in_flight = true;
                let lane = self.config.lanes.compact;
                self.emit_io(lane, ops, Pending::Compact { victims });
            }
        }
        self.maybe_rotate(now);
    }

    /// Rolls the active segment when every record in it is dispatched and it is past the rotation size,
    /// so the next compaction can delete it.
    fn maybe_rotate(&mut self, now: Instant) {
        if self.latched.is_some() || !self.queue.is_empty() || !self.open.seqs.is_empty() {
            return;
        }
        let Some((&last, _)) = self.segments.last_key_value() else {
            return;
        };
        if self.tail.first != last
            || self.tail.end < self.config.rotate_dispatched_active_after_bytes
            || self.checkpoint_synced < self.next_seq
        {
            return;
        }
        self.roll_tail();
        self.start_next(now);
    }

    pub(super) fn on_compact_done(
        &mut self,
        now: Instant,
        victims: Vec<Segment>,
        result: Result<Vec<IoReply>, (usize, IoFault)>,
    ) {
        self.compact_in_flight = false;
        if let Err((index, fault)) = result {
            // Ops are one Remove per victim, then the directory sync. Victims before `index` are gone;
            // the one that failed is gone too if it was not found; the rest stay on disk.
            let keep_from = if index < victims.len() && fault == IoFault::NotFound {
                index + 1
            } else {
                index
            };
            for segment in victims.into_iter().skip(keep_from) {
                self.segments.insert(segment.first, segment);
            }
            self.outputs
                .push_back(WalOutput::Warning(WalWarning::CompactionFailed { fault }));
            self.compact_blocked = true;
        }
        self.compact(now);
    }
}
