//! Partition pickers: the key hash, the keyless round-robin, and the dead-owner-skipping picker.
//!
//! Two pickers exist and the difference is deliberate (produce-path spec, "Two produce paths"):
//! - [`PartitionPicker::pick_for_accept`] is the WAL-first accept every HTTP produce takes: a pure hash
//!   (or round-robin, or the pinned partition) with **no** liveness check. An accept must cost no more than
//!   a local fsync; the dispatcher deals with dead owners later, by rerouting.
//! - [`PartitionPicker::pick_for_sync_produce`] is the synchronous path behind the node RPC `Produce` op:
//!   it walks forward (wrapping) past partitions whose owner membership reports dead, so a dead node does
//!   not swallow its share of the keyspace.
//!
//! A keyed record goes to `FNV-1a-32(key) % partitions` (byte-compatible with Narad /v1); an explicit
//! partition pins; a keyless record (no key, or an empty one) takes its topic's round-robin rotation on
//! this node, which starts at a random partition drawn from the seeded generator the node passes in.

mod round_robin;

pub use round_robin::{RoundRobin, ROTATIONS_MAX, ROTATION_IDLE_FORGET};

use crate::ids::PartitionId;
use crate::time::Instant;
use core::hash::{BuildHasher, Hasher};

/// The FNV-1a 32-bit offset basis.
const FNV_OFFSET_BASIS: u32 = 0x811c_9dc5;
/// The FNV-1a 32-bit prime.
const FNV_PRIME: u32 = 0x0100_0193;

/// FNV-1a 32-bit of `bytes`, as Narad /v1 hashes keys.
pub fn fnv1a_32(bytes: &[u8]) -> u32 {
    let mut hash = FNV_OFFSET_BASIS;
    for &byte in bytes {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

/// The partition a non-empty key hashes to: `fnv1a_32(key) % partitions`.
///
/// Panics when `partitions` is zero: a topic always has at least one partition (programmer error).
pub fn partition_for_key(key: &[u8], partitions: u32) -> PartitionId {
    assert!(partitions > 0, "a topic has at least one partition");
    PartitionId(fnv1a_32(key) % partitions)
}

/// How the producer addressed its record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartitionChoice<'a> {
    /// `?partition=` was given: the record goes exactly there.
    Pinned(PartitionId),
    /// A key was given: it hashes to its partition. An empty key counts as no key.
    Key(&'a [u8]),
    /// No key: the topic's round-robin rotation on this node.
    Keyless,
}

/// Why no partition was picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PickError {
    /// The pinned partition does not exist in the topic (the HTTP layer answers 400).
    #[error("partition {partition} out of range (topic has {partitions})")]
    OutOfRange {
        /// The partition asked for.
        partition: PartitionId,
        /// The topic's partition count.
        partitions: u32,
    },
    /// The topic has no partitions (a malformed topic record).
    #[error("topic has no partitions")]
    NoPartitions,
    /// Synchronous path only: every partition's owner is reported dead.
    #[error("no partition has a live owner")]
    NoLiveOwner,
}

/// The node's partition picker: one per node, shared by both produce paths.
#[derive(Debug)]
pub struct PartitionPicker {
    round_robin: RoundRobin,
}

impl PartitionPicker {
    /// A picker whose round-robin rotations start at partitions drawn from `seed`.
    pub fn new(seed: u64) -> Self {
        PartitionPicker {
            round_robin: RoundRobin::new(seed),
        }
    }

    /// The accept-time picker: hash, pin or round-robin, with no liveness check.
    pub fn pick_for_accept(
        &mut self,
        now: Instant,
        topic: &str,
        partitions: u32,
        choice: PartitionChoice<'_>,
    ) -> Result<PartitionId, PickError> {
        if partitions == 0 {
            return Err(PickError::NoPartitions);
        }
        match choice {
            PartitionChoice::Pinned(partition) if partition.0 < partitions => Ok(partition),
            PartitionChoice::Pinned(partition) => Err(PickError::OutOfRange {
                partition,
                partitions,
            }),
            PartitionChoice::Key(key) if !key.is_empty() => Ok(partition_for_key(key, partitions)),
            PartitionChoice::Key(_) | PartitionChoice::Keyless => {
                Ok(self.round_robin.next(now, topic, partitions))
            }
        }
    }

    /// The synchronous `Produce` picker: the accept-time choice, then forward (wrapping) past partitions
    /// whose owner `is_dead` reports dead. A pinned partition is kept as asked: the producer chose it.
    pub fn pick_for_sync_produce(
        &mut self,
        now: Instant,
        topic: &str,
        partitions: u32,
        choice: PartitionChoice<'_>,
        is_dead: impl Fn(PartitionId) -> bool,
    ) -> Result<PartitionId, PickError> {
        let first = self.pick_for_accept(now, topic, partitions, choice)?;
        if matches!(choice, PartitionChoice::Pinned(_)) {
            return Ok(first);
        }
        first_live_from(first, partitions, is_dead).ok_or(PickError::NoLiveOwner)
    }

    /// Topics whose rotation is currently remembered.
    pub fn rotations_len(&self) -> usize {
        self.round_robin.len()
    }
}

/// The first partition from `start` counting up and wrapping whose owner is not dead.
pub fn first_live_from(
    start: PartitionId,
    partitions: u32,
    is_dead: impl Fn(PartitionId) -> bool,
) -> Option<PartitionId> {
    (0..partitions)
        .map(|step| PartitionId((start.0 + step) % partitions))
        .find(|&partition| !is_dead(partition))
}

/// A [`BuildHasher`] for FNV-1a: deterministic (no random keys), fast on short keys such as topic
/// names. Used for lookup-only maps in the core; nothing iterates them into an output.
#[derive(Clone, Copy, Debug, Default)]
pub struct FnvBuildHasher;

impl BuildHasher for FnvBuildHasher {
    type Hasher = FnvHasher;
    fn build_hasher(&self) -> FnvHasher {
        FnvHasher(FNV_OFFSET_BASIS)
    }
}

/// The streaming FNV-1a 32-bit hasher behind [`FnvBuildHasher`].
#[derive(Clone, Copy, Debug)]
pub struct FnvHasher(u32);

impl Hasher for FnvHasher {
    fn finish(&self) -> u64 {
        u64::from(self.0)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 ^= u32::from(byte);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_surface_test_vectors() {
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a_32(b"customer-42"), 0xfe68_adbe);
        assert_eq!(fnv1a_32(b"key-1"), 0x57e0_3446);
        assert_eq!(fnv1a_32(b""), FNV_OFFSET_BASIS);
    }

    #[test]
    fn key_hash_picks_the_surface_partitions() {
        assert_eq!(partition_for_key(b"customer-42", 3), PartitionId(1));
        assert_eq!(partition_for_key(b"customer-42", 8), PartitionId(6));
        assert_eq!(partition_for_key(b"a", 1), PartitionId(0));
    }

    #[test]
    fn accept_picker_pins_hashes_and_range_checks() {
        let mut picker = PartitionPicker::new(7);
        let now = Instant::ZERO;
        let pick =
            |picker: &mut PartitionPicker, choice| picker.pick_for_accept(now, "t", 8, choice);
        assert_eq!(
            pick(&mut picker, PartitionChoice::Pinned(PartitionId(5))),
            Ok(PartitionId(5))
        );
        assert_eq!(
            pick(&mut picker, PartitionChoice::Pinned(PartitionId(8))),
            Err(PickError::OutOfRange {
                partition: PartitionId(8),
                partitions: 8
            })
        );
        assert_eq!(
            pick(&mut picker, PartitionChoice::Key(b"customer-42")),
            Ok(PartitionId(6))
        );
        assert_eq!(
            picker.pick_for_accept(now, "t", 0, PartitionChoice::Keyless),
            Err(PickError::NoPartitions)
        );
        // Hashing and pinning never touch the rotation.
        assert_eq!(picker.rotations_len(), 0);
    }

    #[test]
    fn accept_picker_treats_an_empty_key_as_keyless() {
        let mut picker = PartitionPicker::new(7);
        let first = picker
            .pick_for_accept(Instant::ZERO, "t", 4, PartitionChoice::Key(b""))
            .unwrap();
        let second = picker
            .pick_for_accept(Instant::ZERO, "t", 4, PartitionChoice::Keyless)
            .unwrap();
        assert_eq!(second, PartitionId((first.0 + 1) % 4));
        assert_eq!(picker.rotations_len(), 1);
    }

    #[test]
    fn accept_picker_has_no_liveness_check_but_sync_picker_walks_past_dead_owners() {
        // "customer-42" hashes to 6 of 8; partitions 6 and 7 have dead owners.
        let dead = |partition: PartitionId| partition.0 == 6 || partition.0 == 7;
        let mut picker = PartitionPicker::new(1);
        let now = Instant::ZERO;
        let key = PartitionChoice::Key(b"customer-42");
        assert_eq!(picker.pick_for_accept(now, "t", 8, key), Ok(PartitionId(6)));
        assert_eq!(
            picker.pick_for_sync_produce(now, "t", 8, key, dead),
            Ok(PartitionId(0))
        );
        // Only 7 dead: 6 is kept.
        assert_eq!(
            picker.pick_for_sync_produce(now, "t", 8, key, |p| p.0 == 7),
            Ok(PartitionId(6))
        );
        // A pin is kept even when its owner is dead.
        assert_eq!(
            picker.pick_for_sync_produce(
                now,
                "t",
                8,
                PartitionChoice::Pinned(PartitionId(7)),
                dead
            ),
            Ok(PartitionId(7))
        );
        assert_eq!(
            picker.pick_for_sync_produce(now, "t", 8, key, |_| true),
            Err(PickError::NoLiveOwner)
        );
    }

    #[test]
    fn sync_picker_skips_dead_owners_for_keyless_records_too() {
        let mut picker = PartitionPicker::new(3);
        let now = Instant::ZERO;
        for _ in 0..12 {
            let picked = picker
                .pick_for_sync_produce(now, "t", 4, PartitionChoice::Keyless, |p| p.0 == 2)
                .unwrap();
            assert_ne!(picked, PartitionId(2));
        }
    }

    #[test]
    fn fnv_build_hasher_is_fnv1a() {
        let mut hasher = FnvBuildHasher.build_hasher();
        hasher.write(b"customer-42");
        assert_eq!(hasher.finish(), 0xfe68_adbe);
    }
}
