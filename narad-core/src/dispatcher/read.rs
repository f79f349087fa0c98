//! Reading the WAL: fresh reads from the frontier, rescans of skipped records, and the checkpoint.

use super::api::{DispatcherOutput, ReadWal};
use super::machine::{undecodable_warning, Dispatcher, ReadKind};
use super::place::{Origin, TableFull};
use super::record::DispatchRecord;
use super::strip::Mark;
use super::*;
use crate::ids::Seq;
use crate::planted::PlantedBug;
use crate::time::Instant;

impl Dispatcher {
    /// Whether the reader may read new records: not stalled, room in the window, within the lookahead.
    pub(super) fn can_read_fresh(&self) -> bool {
        self.stalled.is_none()
            && self.held_counted_records() < self.held_limit_records()
            && self.strip.frontier() < self.lookahead_end()
    }

    /// Issues the next read, if any: a rescan of skipped records first (older records first), else new
    /// records once the WAL says they are durable (or the 10 ms backstop passed).
    pub(super) fn maybe_read(&mut self, now: Instant) {
        if self.read.is_some() || self.is_backing_off(now) {
            return;
        }
        if self.rescanning {
            if self.held_counted_records() >= self.held_limit_records() {
                return; // Resumes when a commit frees room.
            }
            match self.next_open_skipped(now) {
                Some(from) => {
                    let max_records =
                        READ_RECORDS_MAX.min((self.strip.frontier().0 - from.0) as usize);
                    self.issue_read(now, ReadKind::Rescan { from, max_records });
                    return;
                }
                None if self.rescan_again => {
                    self.rescan_again = false;
                    self.rescan_cursor = self.strip.base();
                    return self.maybe_read(now);
                }
                None => self.rescanning = false,
            }
        }
        if !self.can_read_fresh() {
            return;
        }
        let frontier = self.strip.frontier();
        if self.durable_next <= frontier && now < self.last_read_at + IDLE_BACKSTOP {
            return;
        }
        let room = self.held_limit_records() - self.held_counted_records();
        let ahead = (self.lookahead_end().0 - frontier.0) as usize;
        let max_records = READ_RECORDS_MAX.min(room).min(ahead);
        self.issue_read(
            now,
            ReadKind::Fresh {
                from: frontier,
                max_records,
            },
        );
    }

    fn issue_read(&mut self, now: Instant, kind: ReadKind) {
        let (from, max_records) = match kind {
            ReadKind::Fresh { from, max_records } | ReadKind::Rescan { from, max_records } => {
                (from, max_records)
            }
        };
        self.read = Some(kind);
        self.last_read_at = now;
        self.emit(DispatcherOutput::ReadWal(ReadWal {
            from,
            max_records,
            max_bytes: READ_BYTES_MAX,
        }));
    }

    /// The first skipped record at or after the rescan cursor that could be placed now: the first
    /// skipped record of a home that takes records again, or of a topic whose question may be asked.
    /// A home whose first skipped record lies behind the cursor was blocked again during this pass.
    fn next_open_skipped(&mut self, now: Instant) -> Option<Seq> {
        let cursor = self.rescan_cursor;
        let mut best: Option<Seq> = None;
        let homes: Vec<_> = self.skipped_homes.iter().copied().collect();
        for home in homes {
            let Some(&first) = self.dest(home).skipped.first() else {
                continue;
            };
            if first < cursor || best.is_some_and(|best| best <= first) {
                continue;
            }
            if self.route(now, home).is_some() {
                best = Some(first);
            }
        }
        let topics: Vec<_> = self.confirm_topics.iter().copied().collect();
        for topic in topics {
            if !self.confirm_open(now, topic) {
                continue;
            }
            if let Some(&first) = self.topic(topic).confirm_skipped.range(cursor..).next() {
                if best.is_none_or(|best| first < best) {
                    best = Some(first);
                }
            }
        }
        best
    }

    pub(super) fn on_wal_frames(&mut self, now: Instant, frames: Vec<(Seq, Vec<u8>)>) {
        let kind = self.read.take().expect("a read answer without a read");
        let (from, max_records) = match kind {
            ReadKind::Fresh { from, max_records } | ReadKind::Rescan { from, max_records } => {
                (from, max_records)
            }
        };
        assert!(
            frames.len() <= max_records,
            "the WAL returned more records than asked"
        );
        for (index, (seq, _)) in frames.iter().enumerate() {
            assert_eq!(
                seq.0,
                from.0 + index as u64,
                "WAL records come consecutively from `from`"
            );
        }
        if let Some((last, _)) = frames.last() {
            self.durable_next = self.durable_next.max(last.next());
        }
        match kind {
            ReadKind::Fresh { .. } => self.place_fresh(now, frames),
            ReadKind::Rescan { .. } => self.place_again(now, frames),
        }
    }

    fn place_fresh(&mut self, now: Instant, frames: Vec<(Seq, Vec<u8>)>) {
        for (seq, bytes) in frames {
            // The window bounds the read; the frontier never skips a sequence number.
            if crate::DEEP_CHECKS {
                assert_eq!(seq, self.strip.frontier());
            }
            let record = match DispatchRecord::decode(seq, bytes) {
                Ok(record) => record,
                Err(error) => {
                    self.stalled = Some(seq);
                    if self.warned_undecodable != Some(seq) {
                        self.warned_undecodable = Some(seq);
                        self.emit(undecodable_warning(seq, error));
                    }
                    return;
                }
            };
            self.stats.records_read += 1;
            if let Err(TableFull) = self.place(now, record, Origin::Fresh) {
                // No room for another topic or destination: stop in front of it; the periodic pass
                // collects idle entries and the reader tries again.
                self.stalled = Some(seq);
                return;
            }
        }
    }

    fn place_again(&mut self, now: Instant, frames: Vec<(Seq, Vec<u8>)>) {
        for (seq, bytes) in frames {
            self.rescan_cursor = seq.next();
            let Some(mark) = self.strip.get(seq) else {
                continue; // Done and behind the checkpoint.
            };
            let open = match mark {
                Mark::Done | Mark::Held => false,
                Mark::SkippedBlocked(home) => self.home_open(now, home, seq),
                Mark::SkippedConfirm(topic) => self.confirm_open(now, topic),
            };
            if !open {
                continue; // Passed over without decoding.
            }
            if self.held_counted_records() >= self.held_limit_records() {
                self.rescan_cursor = seq;
                return;
            }
            let Ok(record) = DispatchRecord::decode(seq, bytes) else {
                continue; // Decoded once already; the WAL's CRC covers it. Left skipped.
            };
            self.stats.records_reread += 1;
            self.unskip(seq, mark);
            if let Err(TableFull) = self.place(now, record, Origin::Rescan) {
                // No room for its home destination yet: it stays skipped as it was.
                self.reskip(seq, mark);
            }
        }
    }

    /// Hands the checkpoint to the Checkpointer when it moved (one store outstanding at a time).
    pub(super) fn maybe_store_checkpoint(&mut self, now: Instant) {
        self.strip.advance();
        let checkpoint = if self.plant.is(PlantedBug::CheckpointSkipsInflight) {
            // Planted: the stored checkpoint passes records whose commit is still in flight.
            self.strip
                .first_neither_done_nor_held()
                .max(self.planted_stored)
        } else {
            self.strip.base()
        };
        let stored = self.stored.max(self.planted_stored);
        if self.store_in_flight.is_some() || self.is_backing_off(now) || checkpoint <= stored {
            return;
        }
        self.store_in_flight = Some(checkpoint);
        self.emit(DispatcherOutput::StoreCheckpoint { seq: checkpoint });
    }
}
