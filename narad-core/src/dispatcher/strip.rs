//! The strip of sequence numbers from the checkpoint to the read frontier, each done, held or skipped.

use super::tables::{DestIdx, TopicIdx};
use crate::ids::Seq;
use std::collections::VecDeque;

/// The state of one sequence number between the checkpoint and the read frontier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mark {
    /// Committed, or discarded after confirmation.
    Done,
    /// Queued, in flight, a probe, or awaiting a post-failure check.
    Held,
    /// Left in the WAL because its home destination could not take it (or an earlier record of the
    /// same partition was skipped): read again once that destination can.
    SkippedBlocked(DestIdx),
    /// Left in the WAL until the leader confirms its topic (incarnation) gone: read again once the
    /// topic's question is answered or its unconfirmed answer is forgotten.
    SkippedConfirm(TopicIdx),
}

impl Mark {
    pub(super) fn is_skipped(self) -> bool {
        matches!(self, Mark::SkippedBlocked(_) | Mark::SkippedConfirm(_))
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    mark: Mark,
    bytes: u32,
    accept_ms: u64,
}

/// Marks for `[base, frontier)`; `base` is the checkpoint: the first sequence number not done.
#[derive(Debug)]
pub(super) struct Strip {
    base: Seq,
    entries: VecDeque<Entry>,
    held: usize,
    skipped: usize,
    bytes_not_done: u64,
}

impl Strip {
    pub(super) fn new(base: Seq) -> Self {
        Strip {
            base,
            entries: VecDeque::new(),
            held: 0,
            skipped: 0,
            bytes_not_done: 0,
        }
    }

    /// The checkpoint: every sequence number below it is done.
    pub(super) fn base(&self) -> Seq {
        self.base
    }

    /// The first sequence number never read.
    pub(super) fn frontier(&self) -> Seq {
        Seq(self.base.0 + self.entries.len() as u64)
    }

    pub(super) fn held(&self) -> usize {
        self.held
    }

    pub(super) fn skipped(&self) -> usize {
        self.skipped
    }

    pub(super) fn bytes_not_done(&self) -> u64 {
        self.bytes_not_done
    }

    /// The accept time of the record at the checkpoint, when it has been read.
    pub(super) fn oldest_accept_ms(&self) -> Option<u64> {
        self.entries.front().map(|entry| entry.accept_ms)
    }

    /// The mark of `seq`, or `None` outside `[base, frontier)`.
    pub(super) fn get(&self, seq: Seq) -> Option<Mark> {
        let index = seq.0.checked_sub(self.base.0)?;
        self.entries.get(index as usize).map(|entry| entry.mark)
    }

    /// Appends the mark of the frontier record.
    pub(super) fn push(&mut self, seq: Seq, mark: Mark, bytes: usize, accept_ms: u64) {
        assert_eq!(seq, self.frontier(), "records are marked in WAL order");
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
        self.entries.push_back(Entry {
            mark,
            bytes,
            accept_ms,
        });
        match mark {
            Mark::Done => return,
            Mark::Held => self.held += 1,
            Mark::SkippedBlocked(_) | Mark::SkippedConfirm(_) => self.skipped += 1,
        }
        self.bytes_not_done += u64::from(bytes);
    }

    /// Changes the mark of a read sequence number (never from done: a done record stays done).
    pub(super) fn set(&mut self, seq: Seq, mark: Mark) {
        let index = (seq.0 - self.base.0) as usize;
        let entry = &mut self.entries[index];
        let old = entry.mark;
        assert!(old != Mark::Done, "a done record never changes state");
        entry.mark = mark;
        match old {
            Mark::Done => {}
            Mark::Held => self.held -= 1,
            Mark::SkippedBlocked(_) | Mark::SkippedConfirm(_) => self.skipped -= 1,
        }
        match mark {
            Mark::Done => self.bytes_not_done -= u64::from(entry.bytes),
            Mark::Held => self.held += 1,
            Mark::SkippedBlocked(_) | Mark::SkippedConfirm(_) => self.skipped += 1,
        }
    }

    /// Moves the checkpoint over the done prefix.
    pub(super) fn advance(&mut self) {
        while let Some(entry) = self.entries.front() {
            if entry.mark != Mark::Done {
                break;
            }
            self.entries.pop_front();
            self.base = self.base.next();
        }
    }

    /// Recounts every mark (tests and invariant checks): `(held, skipped, bytes_not_done)`.
    pub(super) fn recount(&self) -> (usize, usize, u64) {
        let mut held = 0;
        let mut skipped = 0;
        let mut bytes = 0;
        for entry in &self.entries {
            match entry.mark {
                Mark::Done => continue,
                Mark::Held => held += 1,
                Mark::SkippedBlocked(_) | Mark::SkippedConfirm(_) => skipped += 1,
            }
            bytes += u64::from(entry.bytes);
        }
        (held, skipped, bytes)
    }

    /// Every skipped sequence number with its mark, in order (invariant checks).
    pub(super) fn skipped_marks(&self) -> impl Iterator<Item = (Seq, Mark)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, entry)| entry.mark.is_skipped())
            .map(|(index, entry)| (Seq(self.base.0 + index as u64), entry.mark))
    }

    /// Whether the entry at the checkpoint is not done (or the strip is empty).
    pub(super) fn base_is_first_not_done(&self) -> bool {
        self.entries
            .front()
            .is_none_or(|entry| entry.mark != Mark::Done)
    }
}
