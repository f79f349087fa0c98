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

/// Marks for `[base, frontier)`; `base` is the checkpoint: the first sequence number not done.
///
/// The marks are 8 bytes each and nothing else, so the strip a commit's answer walks (one mark per
/// record, scattered over it) stays small enough for the CPU cache; the accept times, read only at the
/// checkpoint, sit in their own column.
#[derive(Debug)]
pub(super) struct Strip {
    base: Seq,
    marks: VecDeque<Mark>,
    accept_ms: VecDeque<u64>,
    held: usize,
    skipped: usize,
    bytes_not_done: u64,
}

impl Strip {
    pub(super) fn new(base: Seq) -> Self {
        Strip {
            base,
            marks: VecDeque::new(),
            accept_ms: VecDeque::new(),
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
        Seq(self.base.0 + self.marks.len() as u64)
    }

    pub(super) fn held(&self) -> usize {
        self.held
    }

    pub(super) fn skipped(&self) -> usize {
        self.skipped
    }

    /// Encoded bytes of the records read and not done.
    pub(super) fn bytes_not_done(&self) -> u64 {
        self.bytes_not_done
    }

    /// The accept time of the record at the checkpoint, when it has been read.
    pub(super) fn oldest_accept_ms(&self) -> Option<u64> {
        self.accept_ms.front().copied()
    }

    /// The mark of `seq`, or `None` outside `[base, frontier)`.
    pub(super) fn get(&self, seq: Seq) -> Option<Mark> {
        let index = seq.0.checked_sub(self.base.0)?;
        self.marks.get(index as usize).copied()
    }

    /// Appends the mark of the frontier record, `bytes` its encoded size.
    pub(super) fn push(&mut self, seq: Seq, mark: Mark, bytes: usize, accept_ms: u64) {
        assert_eq!(seq, self.frontier(), "records are marked in WAL order");
        self.marks.push_back(mark);
        self.accept_ms.push_back(accept_ms);
        match mark {
            Mark::Done => return,
            Mark::Held => self.held += 1,
            Mark::SkippedBlocked(_) | Mark::SkippedConfirm(_) => self.skipped += 1,
        }
        self.bytes_not_done += bytes as u64;
    }

    /// Changes the mark of a read record (never from done: a done record stays done); `bytes` is its
    /// encoded size.
    pub(super) fn set(&mut self, seq: Seq, mark: Mark, bytes: usize) {
        let index = (seq.0 - self.base.0) as usize;
        let old = std::mem::replace(&mut self.marks[index], mark);
        match old {
            Mark::Done => panic!("a done record never changes state ({seq})"),
            Mark::Held => self.held -= 1,
            Mark::SkippedBlocked(_) | Mark::SkippedConfirm(_) => self.skipped -= 1,
        }
        match mark {
            Mark::Done => self.bytes_not_done -= bytes as u64,
            Mark::Held => self.held += 1,
            Mark::SkippedBlocked(_) | Mark::SkippedConfirm(_) => self.skipped += 1,
        }
    }

    /// Moves the checkpoint over the done prefix.
    pub(super) fn advance(&mut self) {
        while self.marks.front() == Some(&Mark::Done) {
            self.marks.pop_front();
            self.accept_ms.pop_front();
            self.base = self.base.next();
        }
    }

    /// The first sequence number that is neither done nor held (the frontier when there is none):
    /// what the planted `checkpoint-skips-inflight` stores.
    pub(super) fn first_neither_done_nor_held(&self) -> Seq {
        let index = self
            .marks
            .iter()
            .position(|mark| !matches!(mark, Mark::Done | Mark::Held))
            .unwrap_or(self.marks.len());
        Seq(self.base.0 + index as u64)
    }

    /// Recounts every mark (invariant checks): `(held, skipped)`.
    pub(super) fn recount(&self) -> (usize, usize) {
        let held = self
            .marks
            .iter()
            .filter(|&&mark| mark == Mark::Held)
            .count();
        let skipped = self.marks.iter().filter(|mark| mark.is_skipped()).count();
        (held, skipped)
    }

    /// Every skipped sequence number with its mark, in order (invariant checks).
    pub(super) fn skipped_marks(&self) -> impl Iterator<Item = (Seq, Mark)> + '_ {
        self.marks
            .iter()
            .enumerate()
            .filter(|(_, mark)| mark.is_skipped())
            .map(|(index, &mark)| (Seq(self.base.0 + index as u64), mark))
    }

    /// Whether the mark at the checkpoint is not done (or the strip is empty).
    pub(super) fn base_is_first_not_done(&self) -> bool {
        self.marks.front() != Some(&Mark::Done)
    }
}
