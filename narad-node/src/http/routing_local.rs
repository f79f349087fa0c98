//! STOPGAP partition pickers, to be replaced by `narad_core::routing` when it is merged (the routing
//! helper owns that module). Only [`keyed`] and [`KeylessRotations::next`] are called from the HTTP code.
//!
//! - Keyed: FNV-1a 32-bit of the key bytes, mod the partition count (as Narad `/v1`).
//! - Keyless: round-robin per topic on this node, from a random start; no invented key. The
//!   rotations of at most [`KEYLESS_TOPICS_MAX`] topics are kept, the least recently used forgotten
//!   first (the real picker forgets idle ones by time).

use std::collections::BTreeMap;
use std::sync::Mutex;

use narad_core::ids::{PartitionId, TopicId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Topics whose keyless rotation is remembered.
pub const KEYLESS_TOPICS_MAX: usize = 4096;

/// FNV-1a, 32-bit.
pub fn fnv1a_32(bytes: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in bytes {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// The partition a non-empty key maps to.
pub fn keyed(key: &[u8], partitions: u32) -> PartitionId {
    assert!(partitions > 0, "topics have at least one partition");
    PartitionId(fnv1a_32(key) % partitions)
}

/// Per-topic keyless rotations.
#[derive(Debug)]
pub struct KeylessRotations {
    inner: Mutex<Rotations>,
}

#[derive(Debug)]
struct Rotations {
    rng: ChaCha8Rng,
    /// Topic → (next counter value, last use).
    topics: BTreeMap<TopicId, (u64, u64)>,
    uses: u64,
}

impl KeylessRotations {
    /// Rotations whose random starts come from `seed`.
    pub fn new(seed: u64) -> Self {
        KeylessRotations {
            inner: Mutex::new(Rotations {
                rng: ChaCha8Rng::seed_from_u64(seed),
                topics: BTreeMap::new(),
                uses: 0,
            }),
        }
    }

    /// The next partition of `topic`'s rotation.
    pub fn next(&self, topic: TopicId, partitions: u32) -> PartitionId {
        assert!(partitions > 0, "topics have at least one partition");
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        inner.uses += 1;
        let uses = inner.uses;
        if !inner.topics.contains_key(&topic) {
            if inner.topics.len() >= KEYLESS_TOPICS_MAX {
                let idlest = inner
                    .topics
                    .iter()
                    .min_by_key(|(_, (_, used))| *used)
                    .map(|(id, _)| *id);
                if let Some(idlest) = idlest {
                    inner.topics.remove(&idlest);
                }
            }
            let start = inner.rng.random::<u32>();
            inner.topics.insert(topic, (u64::from(start), uses));
        }
        let slot = inner.topics.get_mut(&topic).expect("inserted above");
        let counter = slot.0;
        *slot = (counter.wrapping_add(1), uses);
        PartitionId((counter % u64::from(partitions)) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_surface_vectors() {
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a_32(b"customer-42"), 0xfe68_adbe);
        assert_eq!(fnv1a_32(b"key-1"), 0x57e0_3446);
        assert_eq!(keyed(b"customer-42", 3), PartitionId(1));
        assert_eq!(keyed(b"customer-42", 8), PartitionId(6));
    }

    #[test]
    fn keyless_rotation_spreads_exactly_evenly() {
        let rotations = KeylessRotations::new(7);
        let mut counts = [0u32; 5];
        for _ in 0..50 {
            counts[rotations.next(TopicId(1), 5).0 as usize] += 1;
        }
        assert_eq!(counts, [10; 5]);
    }

    #[test]
    fn each_topic_has_its_own_rotation() {
        let rotations = KeylessRotations::new(7);
        let first = rotations.next(TopicId(1), 3);
        rotations.next(TopicId(2), 3);
        let second = rotations.next(TopicId(1), 3);
        assert_eq!(second.0, (first.0 + 1) % 3);
    }
}
