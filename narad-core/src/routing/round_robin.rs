//! The keyless rotation: one per topic on each node, starting at a random partition, remembered while
//! the topic is in use and forgotten once idle.

use crate::ids::PartitionId;
use crate::time::Instant;
use core::time::Duration;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;

/// The most topics whose rotation is remembered at once; the least recently used is forgotten first.
pub const ROTATIONS_MAX: usize = 4_096;
/// A rotation unused for this long is forgotten; the topic's next keyless record starts a new one at a
/// fresh random partition.
pub const ROTATION_IDLE_FORGET: Duration = Duration::from_secs(300);

#[derive(Debug)]
struct Rotation {
    /// Where the rotation goes next (reduced modulo the partition count at use, which may change).
    next: u32,
    last_used: Instant,
    /// Key of this rotation in `by_use`.
    use_stamp: u64,
}

/// Per-topic round-robin rotations with bounded, deterministic memory.
///
/// Determinism: the start partitions come from the seeded generator and forgetting depends only on the
/// `now` values passed in, so the same calls give the same partitions.
#[derive(Debug)]
pub struct RoundRobin {
    rng: ChaCha8Rng,
    rotations: BTreeMap<String, Rotation>,
    /// Use stamp → topic, oldest first: the eviction and idle-forgetting order.
    by_use: BTreeMap<u64, String>,
    next_use_stamp: u64,
}

impl RoundRobin {
    /// Rotations whose random starts come from a ChaCha8 stream seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        RoundRobin {
            rng: ChaCha8Rng::seed_from_u64(seed),
            rotations: BTreeMap::new(),
            by_use: BTreeMap::new(),
            next_use_stamp: 0,
        }
    }

    /// Topics whose rotation is currently remembered.
    pub fn len(&self) -> usize {
        self.rotations.len()
    }

    /// Whether no rotation is remembered.
    pub fn is_empty(&self) -> bool {
        self.rotations.is_empty()
    }

    /// The next partition of `topic`'s rotation. Panics when `partitions` is zero (programmer error).
    pub fn next(&mut self, now: Instant, topic: &str, partitions: u32) -> PartitionId {
        assert!(partitions > 0, "a topic has at least one partition");
        self.forget_idle(now);
        let use_stamp = self.next_use_stamp;
        self.next_use_stamp += 1;
        if let Some(rotation) = self.rotations.get_mut(topic) {
            let name = self
                .by_use
                .remove(&rotation.use_stamp)
                .expect("every rotation has a use stamp");
            let picked = rotation.next % partitions;
            rotation.next = (picked + 1) % partitions;
            rotation.last_used = now;
            rotation.use_stamp = use_stamp;
            self.by_use.insert(use_stamp, name);
            return PartitionId(picked);
        }
        if self.rotations.len() >= ROTATIONS_MAX {
            if let Some((_, oldest)) = self.by_use.pop_first() {
                self.rotations.remove(&oldest);
            }
        }
        let picked = self.rng.random_range(0..partitions);
        self.rotations.insert(
            topic.to_string(),
            Rotation {
                next: (picked + 1) % partitions,
                last_used: now,
                use_stamp,
            },
        );
        self.by_use.insert(use_stamp, topic.to_string());
        PartitionId(picked)
    }

    fn forget_idle(&mut self, now: Instant) {
        while let Some((_, topic)) = self.by_use.first_key_value() {
            let last_used = self.rotations[topic].last_used;
            if now.saturating_duration_since(last_used) < ROTATION_IDLE_FORGET {
                break;
            }
            let (_, topic) = self.by_use.pop_first().expect("checked non-empty");
            self.rotations.remove(&topic);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyless_rotation_is_exactly_even_from_a_seeded_random_start() {
        let mut rr = RoundRobin::new(42);
        let picks: Vec<u32> = (0..12).map(|_| rr.next(Instant::ZERO, "t", 4).0).collect();
        let start = picks[0];
        let expected: Vec<u32> = (0..12).map(|i| (start + i) % 4).collect();
        assert_eq!(picks, expected);
        // Same seed, same start.
        assert_eq!(RoundRobin::new(42).next(Instant::ZERO, "t", 4).0, start);
    }

    #[test]
    fn each_topic_has_its_own_rotation() {
        let mut rr = RoundRobin::new(9);
        let a0 = rr.next(Instant::ZERO, "a", 5).0;
        let b0 = rr.next(Instant::ZERO, "b", 5).0;
        assert_eq!(rr.next(Instant::ZERO, "a", 5).0, (a0 + 1) % 5);
        assert_eq!(rr.next(Instant::ZERO, "b", 5).0, (b0 + 1) % 5);
        assert_eq!(rr.len(), 2);
    }

    #[test]
    fn random_starts_spread_over_the_partitions() {
        let mut rr = RoundRobin::new(5);
        let mut seen = [false; 8];
        for topic in 0..200 {
            seen[rr.next(Instant::ZERO, &format!("t{topic}"), 8).0 as usize] = true;
        }
        assert!(seen.iter().all(|&s| s), "{seen:?}");
    }

    #[test]
    fn idle_rotations_are_forgotten() {
        let mut rr = RoundRobin::new(1);
        rr.next(Instant::ZERO, "idle", 4);
        let t_busy = Instant::ZERO + (ROTATION_IDLE_FORGET - Duration::from_nanos(1));
        rr.next(t_busy, "busy", 4);
        assert_eq!(rr.len(), 2);
        // At exactly the idle limit the first is forgotten, the second is still remembered.
        rr.next(Instant::ZERO + ROTATION_IDLE_FORGET, "busy", 4);
        assert_eq!(rr.len(), 1);
        assert!(rr.rotations.contains_key("busy"));
    }

    #[test]
    fn rotations_are_bounded_least_recently_used_first() {
        let mut rr = RoundRobin::new(1);
        for topic in 0..ROTATIONS_MAX {
            rr.next(Instant::ZERO, &format!("t{topic}"), 3);
        }
        rr.next(Instant::ZERO, "t0", 3); // t0 is now the most recently used; t1 the least.
        rr.next(Instant::ZERO, "new", 3);
        assert_eq!(rr.len(), ROTATIONS_MAX);
        assert!(rr.rotations.contains_key("t0"));
        assert!(!rr.rotations.contains_key("t1"));
        assert_eq!(rr.by_use.len(), rr.rotations.len());
    }

    #[test]
    fn rotation_follows_a_changed_partition_count() {
        let mut rr = RoundRobin::new(2);
        let first = rr.next(Instant::ZERO, "t", 2).0;
        let second = rr.next(Instant::ZERO, "t", 6).0;
        assert_eq!(second, (first + 1) % 2);
        assert_eq!(rr.next(Instant::ZERO, "t", 6).0, (second + 1) % 6);
    }
}
