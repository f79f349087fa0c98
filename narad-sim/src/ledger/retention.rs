//! What retention was entitled to remove: the only records the ledger lets go missing besides deleted
//! incarnations and rot.
//!
//! - **Age.** Retention removes a segment once its newest record's commit time is `retention_ms` old,
//!   and a record is committed after its call was sent: a record whose call was sent at least
//!   `retention_ms` before an observation ended may be gone from it.
//! - **Size.** Retention removes the oldest segment of a partition only while what remains holds at
//!   least `retention_bytes` of frames, so whenever something was removed the partition still holds
//!   the bound. A record may be missing when a partition it may be in (its aimed partition; any of the
//!   topic's for a keyless one) was trimmed (its first served offset is above 0) and what the
//!   observation served there could amount to the bound: each record counted with the most a frame
//!   could add to it ([`RECORD_OVERHEAD_MAX`]), so a node that kept the bound is never flagged, and
//!   one that kept much less is.
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

/// What one observation says about each partition: its first served offset and how many frame bytes
/// its served records could take at most.
#[derive(Debug, Default)]
pub(super) struct RetainedView {
    at_ns: u64,
    partitions: BTreeMap<(Arc<str>, TopicId, PartitionId), (Offset, u64)>,
}

impl RetainedView {
    pub(super) fn new(observation: &Observation) -> RetainedView {
        let mut partitions: BTreeMap<(Arc<str>, TopicId, PartitionId), (Offset, u64)> =
            BTreeMap::new();
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
                .or_insert((served.offset, 0));
            entry.0 = entry.0.min(served.offset);
            entry.1 += bytes;
        }
        RetainedView {
            at_ns: observation.at_ns,
            partitions,
        }
    }

    /// Whether `partition` was trimmed and could still hold `bound` bytes of frames.
    fn trimmed_to_bound(&self, key: &(Arc<str>, TopicId, PartitionId), bound: u64) -> bool {
        self.partitions
            .get(key)
            .is_some_and(|&(first, bytes)| first > Offset(0) && bytes >= bound)
    }
}

impl Ledger {
    /// Every topic of the run is created with `rule`: what it entitles retention to remove is
    /// excused (see the module documentation).
    pub fn set_retention(&mut self, rule: RetentionRule) {
        self.retention = rule;
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
        match entry.aimed_at {
            Some(partition) => view.trimmed_to_bound(
                &(entry.topic.clone(), entry.topic_id, partition),
                rule.retention_bytes,
            ),
            None => view
                .partitions
                .keys()
                .filter(|(topic, topic_id, _)| *topic == entry.topic && *topic_id == entry.topic_id)
                .any(|key| view.trimmed_to_bound(key, rule.retention_bytes)),
        }
    }
}
