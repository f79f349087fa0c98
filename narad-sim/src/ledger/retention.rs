//! What retention was entitled to remove: the only records the ledger lets go missing besides deleted
//! incarnations and rot.
//!
//! - **Age.** Retention removes a segment once its newest record's commit time is `retention_ms` old,
//!   and a record is committed after its call was sent: a record whose call was sent at least
//!   `retention_ms` before an observation ended may be gone from it.
//! - **Size.** Retention removes the oldest segment of a partition only while what remains holds at
//!   least `retention_bytes` of frames, so whenever something was removed the partition still holds
//!   the bound, and what it removed was committed before everything it kept. A record may be missing
//!   when some partition of its topic (a record may be rerouted to any) was trimmed (its first served
//!   offset is above 0), what the observation served there could amount to the bound (each record
//!   counted with the most a frame could add to it, [`RECORD_OVERHEAD_MAX`]: a node that kept the
//!   bound is never flagged, one that kept much less is), and the record was sent no later than the
//!   first kept record there was committed (it was committed after it was sent; a record sent later
//!   can only sit behind that one). Without commit times in the read, only its aimed partition counts.
//!
//! Everything else missing is lost, however old.

use std::collections::BTreeMap;
use std::sync::Arc;

use narad_core::{Offset, PartitionId, TopicId};

use super::{Ledger, Observation};

/// The most bytes a partition frame adds to a record's payload and key: the record's own header
/// (tag, key length, commit time: 1 + 10 + 8) and, at worst, a whole frame header for it alone.
pub const RECORD_OVERHEAD_MAX: u64 = 64;

/// The topics' retention, as every topic of a run is created with it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionRule {
    /// `retention_ms` (0: no age retention within the run).
    pub retention_ms: u64,
    /// `retention_bytes` (0: no size bound).
    pub retention_bytes: u64,
}

/// What one observation says about a partition.
#[derive(Clone, Copy, Debug)]
struct Kept {
    /// The first served offset.
    first: Offset,
    /// The commit time of the record at `first`, when the read reported it (Unix ms).
    first_committed_at_ms: Option<u64>,
    /// How many frame bytes its served records could take at most.
    bytes: u64,
}

/// What one observation says about each partition.
#[derive(Debug, Default)]
pub(super) struct RetainedView {
    at_ns: u64,
    partitions: BTreeMap<(Arc<str>, TopicId, PartitionId), Kept>,
}

impl RetainedView {
    pub(super) fn new(observation: &Observation) -> RetainedView {
        let mut partitions: BTreeMap<(Arc<str>, TopicId, PartitionId), Kept> = BTreeMap::new();
        for served in &observation.served {
            let bytes = served.payload.len() as u64
                + served
                    .key
                    .as_ref()
                    .and_then(Option::as_ref)
                    .map_or(0, |key| key.len() as u64)
                + RECORD_OVERHEAD_MAX;
            let entry = partitions
                .entry((served.topic.clone(), served.topic_id, served.partition))
                .or_insert(Kept {
                    first: served.offset,
                    first_committed_at_ms: served.committed_at_ms,
                    bytes: 0,
                });
            if served.offset < entry.first {
                entry.first = served.offset;
                entry.first_committed_at_ms = served.committed_at_ms;
            }
            entry.bytes += bytes;
        }
        RetainedView {
            at_ns: observation.at_ns,
            partitions,
        }
    }

    /// Whether `partition` was trimmed, could still hold `bound` bytes of frames, and its first kept
    /// record was committed no earlier than `sent_ms` (unknown: only when `aimed`).
    fn may_have_removed(
        &self,
        key: &(Arc<str>, TopicId, PartitionId),
        bound: u64,
        sent_ms: Option<u64>,
        aimed: bool,
    ) -> bool {
        self.partitions.get(key).is_some_and(|kept| {
            let before_first = match (kept.first_committed_at_ms, sent_ms) {
                (Some(first_ms), Some(sent_ms)) => sent_ms <= first_ms,
                _ => aimed,
            };
            kept.first > Offset(0) && kept.bytes >= bound && before_first
        })
    }
}

impl Ledger {
    /// Every topic of the run is created with `rule`: what it entitles retention to remove is
    /// excused (see the module documentation).
    pub fn set_retention(&mut self, rule: RetentionRule) {
        self.retention = rule;
    }

    /// The nodes' clock (Unix ms) at the run's instant 0: it places a call's send time among commit
    /// times.
    pub fn set_clock_base(&mut self, unix_ms_at_zero: u64) {
        self.clock_base_ms = Some(unix_ms_at_zero);
    }

    /// Whether retention may have removed record `id` by the end of the observation `view` was made of.
    pub(super) fn retained_away(&self, id: u64, view: &RetainedView) -> bool {
        let rule = self.retention;
        let entry = &self.records[id as usize];
        if rule.retention_ms > 0 {
            let sent_ns = self.via.get(&entry.attempt).map_or(0, |via| via.at_ns);
            if sent_ns.saturating_add(rule.retention_ms * 1_000_000) <= view.at_ns {
                return true;
            }
        }
        if rule.retention_bytes == 0 {
            return false;
        }
        let sent_ms = self
            .via
            .get(&entry.attempt)
            .and_then(|via| self.clock_base_ms.map(|base| base + via.at_ns / 1_000_000));
        view.partitions
            .keys()
            .filter(|(topic, topic_id, _)| *topic == entry.topic && *topic_id == entry.topic_id)
            .any(|key| {
                let aimed = entry.aimed_at.is_none_or(|aimed| aimed == key.2);
                view.may_have_removed(key, rule.retention_bytes, sent_ms, aimed)
            })
    }
}
