//! Offset stability: a (topic incarnation, partition, offset) served more than once — by the reads
//! at the liveness deadline and after the final settle, and by the queue-mode deliveries — serves
//! the same record every time. A partition that moves keeps its offsets; a copy that restarted a
//! log at 0, or a freeze that let a source commit after the offsets it handed over, serves another
//! record at an offset already seen.

use std::collections::BTreeMap;

use narad_core::ids::{Offset, PartitionId, TopicId};

/// Where a record was served, and which.
pub type ServedAt = (TopicId, PartitionId, Offset, u64);

/// Every offset served with two different records, in words (sorted, one line per offset).
pub fn offset_conflicts(served: impl IntoIterator<Item = ServedAt>) -> Vec<String> {
    let mut first: BTreeMap<(TopicId, PartitionId, Offset), u64> = BTreeMap::new();
    let mut conflicts: BTreeMap<(TopicId, PartitionId, Offset), Vec<u64>> = BTreeMap::new();
    for (topic_id, partition, offset, id) in served {
        let key = (topic_id, partition, offset);
        match first.get(&key) {
            None => {
                first.insert(key, id);
            }
            Some(&seen) if seen != id => {
                let ids = conflicts.entry(key).or_insert_with(|| vec![seen]);
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
            Some(_) => {}
        }
    }
    conflicts
        .into_iter()
        .map(|((topic_id, partition, offset), ids)| {
            format!("#{topic_id}/{partition}@{offset} served records {ids:?}")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_served_with_two_records_is_a_conflict_and_repeats_are_not() {
        let at = |offset: u64, id: u64| (TopicId(1), PartitionId(0), Offset(offset), id);
        assert!(offset_conflicts([at(0, 7), at(0, 7), at(1, 8)]).is_empty());
        let conflicts = offset_conflicts([at(0, 7), at(1, 8), at(0, 9), at(0, 7)]);
        assert_eq!(conflicts, vec!["#1/0@0 served records [7, 9]".to_string()]);
        // Another incarnation or partition is another offset.
        let other = (TopicId(2), PartitionId(0), Offset(0), 9);
        let partition = (TopicId(1), PartitionId(1), Offset(0), 9);
        assert!(offset_conflicts([at(0, 7), other, partition]).is_empty());
    }
}
