//! The dispatcher's tables: topics (with the local replica's view and the deletion questions) and
//! destinations (a partition's queue, its commit in flight, its failure state).

use super::api::{CommitFailure, CommitId, CommitOwner, CommitRecords, TopicPlacement};
use super::record::DispatchRecord;
use crate::ids::{PartitionId, Seq, TopicId};
use crate::routing::FnvBuildHasher;
use crate::time::Instant;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// Index of a destination in the dispatcher's destination table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct DestIdx(pub(super) u32);

/// Index of a queued record in the dispatcher's held-record table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct HeldIdx(pub(super) u32);

/// Index of a topic in the dispatcher's topic table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct TopicIdx(pub(super) u32);

/// A table of values addressed by small indices that are reused after removal (lowest last freed
/// first), so memory follows the live set. Iteration is in index order: deterministic.
#[derive(Debug)]
pub(super) struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Slab<T> {
    pub(super) fn new() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn insert(&mut self, value: T) -> u32 {
        self.len += 1;
        if let Some(index) = self.free.pop() {
            self.items[index as usize] = Some(value);
            return index;
        }
        self.items.push(Some(value));
        (self.items.len() - 1) as u32
    }

    pub(super) fn remove(&mut self, index: u32) -> T {
        let value = self.items[index as usize]
            .take()
            .expect("removing a live slab entry");
        self.free.push(index);
        self.len -= 1;
        value
    }

    pub(super) fn get(&self, index: u32) -> &T {
        self.items[index as usize]
            .as_ref()
            .expect("a live slab entry")
    }

    pub(super) fn get_mut(&mut self, index: u32) -> &mut T {
        self.items[index as usize]
            .as_mut()
            .expect("a live slab entry")
    }

    /// Live indices, in order.
    pub(super) fn indices(&self) -> Vec<u32> {
        self.iter().map(|(index, _)| index).collect()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, &T)> + '_ {
        self.items
            .iter()
            .enumerate()
            .filter_map(|(index, item)| item.as_ref().map(|value| (index as u32, value)))
    }
}

/// Partition → destination: a dense vector for the partitions a topic has (placement looks one up per
/// record), a map for any other number a record may carry.
#[derive(Debug, Default)]
pub(super) struct PartitionMap {
    dense: Vec<Option<DestIdx>>,
    sparse: HashMap<PartitionId, DestIdx, FnvBuildHasher>,
    len: usize,
}

/// Partitions below this are kept in the dense vector.
const DENSE_PARTITIONS_MAX: u32 = 1 << 16;

impl PartitionMap {
    pub(super) fn get(&self, partition: PartitionId) -> Option<DestIdx> {
        match self.dense.get(partition.0 as usize) {
            Some(slot) => *slot,
            None if partition.0 < DENSE_PARTITIONS_MAX => None,
            None => self.sparse.get(&partition).copied(),
        }
    }

    pub(super) fn insert(&mut self, partition: PartitionId, idx: DestIdx) {
        let old = if partition.0 < DENSE_PARTITIONS_MAX {
            let index = partition.0 as usize;
            if self.dense.len() <= index {
                self.dense.resize(index + 1, None);
            }
            self.dense[index].replace(idx)
        } else {
            self.sparse.insert(partition, idx)
        };
        if old.is_none() {
            self.len += 1;
        }
    }

    pub(super) fn remove(&mut self, partition: PartitionId) {
        let old = if partition.0 < DENSE_PARTITIONS_MAX {
            self.dense
                .get_mut(partition.0 as usize)
                .and_then(Option::take)
        } else {
            self.sparse.remove(&partition)
        };
        if old.is_some() {
            self.len -= 1;
        }
        if self.len == 0 {
            self.dense = Vec::new();
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every destination, in index order.
    pub(super) fn values(&self) -> Vec<DestIdx> {
        let mut values: Vec<DestIdx> = self.dense.iter().flatten().copied().collect();
        values.extend(self.sparse.values().copied());
        values.sort();
        values
    }
}

/// A topic the dispatcher has seen, in the local replica or in a record.
#[derive(Debug)]
pub(super) struct TopicEntry {
    pub(super) name: Arc<str>,
    /// The local replica's view; `None` while the name is absent locally.
    pub(super) local: Option<TopicPlacement>,
    /// Destinations of this topic, by partition.
    pub(super) dests: PartitionMap,
    /// A [`super::DispatcherOutput::ConfirmTopicGone`] is outstanding.
    pub(super) confirm_pending: bool,
    /// The leader's last answer left something unconfirmed: no new question before this.
    pub(super) unconfirmed_until: Option<Instant>,
    /// The leader confirmed the name absent while it was absent locally: id-less records of it are
    /// gone. Cleared when the name reappears locally.
    pub(super) absent_confirmed: bool,
    /// Incarnations waiting on the outstanding question.
    pub(super) asked_ids: BTreeSet<Option<TopicId>>,
    /// Records skipped until the leader confirms (their marks are `SkippedConfirm(this)`).
    pub(super) confirm_skipped: BTreeSet<Seq>,
}

impl TopicEntry {
    pub(super) fn new(name: Arc<str>) -> Self {
        TopicEntry {
            name,
            local: None,
            dests: PartitionMap::default(),
            confirm_pending: false,
            unconfirmed_until: None,
            absent_confirmed: false,
            asked_ids: BTreeSet::new(),
            confirm_skipped: BTreeSet::new(),
        }
    }
}

/// A held record on a destination's queue.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) record: DispatchRecord,
    /// The record's own partition (it differs from the queue's after a reroute).
    pub(super) home: DestIdx,
    pub(super) placed_at: Instant,
}

/// The one commit a destination may have in flight.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) commit_id: CommitId,
    pub(super) topic_id: Option<TopicId>,
    pub(super) records: CommitRecords,
    pub(super) homes: Vec<DestIdx>,
    pub(super) owner: CommitOwner,
    /// The attempt's start (a legacy resend keeps it: the same attempt, the same budget).
    pub(super) started: Instant,
    pub(super) deadline: Instant,
    /// Past the hung threshold: no longer counted against the fan-out.
    pub(super) hung: bool,
    pub(super) probe: bool,
    pub(super) with_ids: bool,
}

/// A destination whose commits fail: it holds one record as its probe.
#[derive(Debug)]
pub(super) struct Failing {
    /// The start of the first failed attempt: the reroute grace counts from here.
    pub(super) since: Instant,
    /// The probe, while it waits for its next try (`None` while it is in flight).
    pub(super) probe: Option<Queued>,
    pub(super) next_probe_at: Instant,
    /// The reroute grace has passed (its rescan was triggered).
    pub(super) grace_passed: bool,
    /// Why the last attempt failed (logged if the probe's topic turns out deleted).
    pub(super) last_failure: CommitFailure,
}

/// A failed commit whose topic (incarnation) looks deleted locally, waiting for the leader's answer
/// before it is discarded or treated as an ordinary failure. Only its destination waits.
#[derive(Debug)]
pub(super) struct PostFailure {
    pub(super) records: Vec<Queued>,
    pub(super) topic_id: Option<TopicId>,
    pub(super) failure: CommitFailure,
    pub(super) started: Instant,
}

/// A destination: one partition of one topic, where commits go.
#[derive(Debug)]
pub(super) struct Dest {
    pub(super) topic: TopicIdx,
    pub(super) partition: PartitionId,
    /// Queued records, in WAL order: slots of the dispatcher's held-record table. (The records live
    /// in one table whose freed slots are reused first, so placing a record writes into memory a
    /// landed commit just released, still in the CPU cache, instead of into one of a thousand queues.)
    pub(super) queue: VecDeque<HeldIdx>,
    pub(super) in_flight: Option<InFlight>,
    pub(super) failing: Option<Failing>,
    pub(super) post_failure: Option<PostFailure>,
    /// Skipped records whose home this is (marks `SkippedBlocked(this)`), in WAL order.
    pub(super) skipped: BTreeSet<Seq>,
    /// Held records (anywhere) whose home this is.
    pub(super) held_home: u32,
    /// The owner did not resolve: look it up again at this time.
    pub(super) lookup_at: Option<Instant>,
    /// The owner refused an incarnation (412): take nothing until the next periodic rescan.
    pub(super) refused: bool,
    /// This destination's key in the candidate set, when it is a candidate.
    pub(super) candidate_key: Option<Instant>,
    /// Every queued record passed the incarnation check at this epoch or later.
    pub(super) verified_epoch: u64,
}

impl Dest {
    pub(super) fn new(topic: TopicIdx, partition: PartitionId) -> Self {
        Dest {
            topic,
            partition,
            queue: VecDeque::new(),
            in_flight: None,
            failing: None,
            post_failure: None,
            skipped: BTreeSet::new(),
            held_home: 0,
            lookup_at: None,
            refused: false,
            candidate_key: None,
            verified_epoch: 0,
        }
    }

    pub(super) fn is_hung(&self) -> bool {
        self.in_flight.as_ref().is_some_and(|commit| commit.hung)
    }

    /// Failing, or waiting on a post-failure check: not a reroute target.
    pub(super) fn is_failing(&self) -> bool {
        self.failing.is_some() || self.post_failure.is_some()
    }

    /// Records this destination holds: queued, in flight, its probe, its post-failure batch.
    pub(super) fn held(&self) -> usize {
        self.queue.len()
            + self
                .in_flight
                .as_ref()
                .map_or(0, |commit| commit.records.len())
            + self
                .failing
                .as_ref()
                .map_or(0, |failing| usize::from(failing.probe.is_some()))
            + self
                .post_failure
                .as_ref()
                .map_or(0, |post| post.records.len())
    }
}
