//! `SimDisk`: an in-memory [`Disk`] with a durability model and injectable faults.
//!
//! Each file (inode) has a *live* image (what reads see) and a *durable* image (what survives a crash),
//! plus the writes and size changes issued since its last successful `sync_data`. The namespace has the
//! same split: creates, renames and removes are pending per directory until `sync_dir`.
//!
//! [`SimDisk::crash`] is a power loss: per directory a random prefix of the pending namespace operations
//! survives; per file each pending write keeps only some whole blocks — overwrites inside the durable
//! extent (a prepared segment) persist block by block in any order, leaving holes; appends past the
//! durable end persist as a prefix, then stop. Live images are reset to what survived.
//!
//! Faults: `sync_data` failing with EIO drops the pending pages *and marks them clean* (fsyncgate), so a
//! later sync "succeeds" without them; writes failing with EIO or ENOSPC write nothing; bit rot flips a
//! bit of synced data; a lying mode makes every sync a no-op, only to prove a checker notices.
//!
//! All randomness comes from a `ChaCha8Rng` seeded by the caller; iteration is over `BTreeMap`s, so a
//! seed replays exactly.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{parent_dir, Disk};
use crate::error::IoFault;

/// The unit a crash tears writes into.
pub const BLOCK_BYTES: u64 = 4096;

/// What an injected fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// `sync_data` fails with EIO and drops the pending pages (fsyncgate).
    SyncEio,
    /// `write_at` / `write_zeros` fail with EIO, writing nothing.
    WriteEio,
    /// `write_at` / `write_zeros` / `set_len` growth fail with ENOSPC, writing nothing.
    NoSpace,
}

/// A fault that strikes operations on paths starting with `path_prefix`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultRule {
    /// Paths it applies to (`""` = all).
    pub path_prefix: String,
    /// What happens.
    pub kind: FaultKind,
    /// Chance per matching operation, in parts per million (1,000,000 = always).
    pub chance_ppm: u32,
    /// How many more times it may strike; `None` = unlimited.
    pub remaining: Option<u32>,
}

/// Counters of what the disk did, for traces and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimDiskStats {
    /// Successful `sync_data` calls.
    pub syncs: u64,
    /// `write_at` / `write_zeros` calls that succeeded.
    pub writes: u64,
    /// Faults injected.
    pub faults: u64,
    /// Crashes simulated.
    pub crashes: u64,
}

#[derive(Clone, Debug)]
enum Pending {
    Write { offset: u64, data: Vec<u8> },
    Zeros { offset: u64, len: u64 },
    SetLen(u64),
}

#[derive(Clone, Debug, Default)]
struct Inode {
    live: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
}

/// One atomic namespace change: names set to an inode, or removed (`None`).
type NsOp = Vec<(String, Option<u64>)>;

#[derive(Debug)]
struct Inner {
    rng: ChaCha8Rng,
    inodes: BTreeMap<u64, Inode>,
    next_inode: u64,
    live_names: BTreeMap<String, u64>,
    durable_names: BTreeMap<String, u64>,
    pending_ns: BTreeMap<String, Vec<NsOp>>,
    dirs: BTreeSet<String>,
    rules: Vec<FaultRule>,
    lying_sync: bool,
    stats: SimDiskStats,
}

/// The simulated disk. Cloning shares the same disk (the harness keeps a handle to crash it).
#[derive(Clone, Debug)]
pub struct SimDisk {
    inner: Arc<Mutex<Inner>>,
}

impl SimDisk {
    /// An empty disk whose crash tearing and fault draws come from `seed`.
    pub fn new(seed: u64) -> Self {
        let inner = Inner {
            rng: ChaCha8Rng::seed_from_u64(seed),
            inodes: BTreeMap::new(),
            next_inode: 1,
            live_names: BTreeMap::new(),
            durable_names: BTreeMap::new(),
            pending_ns: BTreeMap::new(),
            dirs: BTreeSet::from([String::new()]),
            rules: Vec::new(),
            lying_sync: false,
            stats: SimDiskStats::default(),
        };
        SimDisk {
            inner: Arc::new(Mutex::new(inner)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock already failed the test; keep serving the poisoned state.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds a fault rule.
    pub fn add_fault(&self, rule: FaultRule) {
        self.lock().rules.push(rule);
    }

    /// Removes every fault rule (the faults "heal").
    pub fn clear_faults(&self) {
        self.lock().rules.clear();
    }

    /// Makes every later `sync_data` a no-op that reports success. Only for proving checkers catch loss.
    pub fn set_lying_sync(&self, lying: bool) {
        self.lock().lying_sync = lying;
    }

    /// Simulates a power loss: see the module documentation.
    pub fn crash(&self) {
        self.lock().crash();
    }

    /// Flips one bit of the byte at `offset` in both images of `path` (bit rot of synced data).
    /// Returns false when the byte does not exist durably.
    pub fn rot(&self, path: &str, offset: u64, bit: u8) -> bool {
        let mut inner = self.lock();
        let Some(&ino) = inner.live_names.get(path) else {
            return false;
        };
        let inode = inner.inodes.get_mut(&ino).expect("name points at an inode");
        let index = offset as usize;
        if index >= inode.durable.len() {
            return false;
        }
        let mask = 1u8 << (bit % 8);
        inode.durable[index] ^= mask;
        if index < inode.live.len() {
            inode.live[index] ^= mask;
        }
        true
    }

    /// Flips a random bit of a random durable byte of a random file under `path_prefix`.
    /// Returns the path and offset hit, if any file had durable bytes.
    pub fn rot_random(&self, path_prefix: &str) -> Option<(String, u64)> {
        let (path, offset, bit) = {
            let mut inner = self.lock();
            let candidates: Vec<(String, u64)> = inner
                .live_names
                .iter()
                .filter(|(name, _)| name.starts_with(path_prefix))
                .filter_map(|(name, ino)| {
                    let len = inner.inodes[ino].durable.len() as u64;
                    (len > 0).then(|| (name.clone(), len))
                })
                .collect();
            if candidates.is_empty() {
                return None;
            }
            let (path, len) = candidates[inner.rng.random_range(0..candidates.len())].clone();
            let offset = inner.rng.random_range(0..len);
            let bit = inner.rng.random_range(0..8u8);
            (path, offset, bit)
        };
        self.rot(&path, offset, bit).then_some((path, offset))
    }

    /// The durable image of `path` under the durable namespace: what a crash right now could at best keep.
    pub fn durable_image(&self, path: &str) -> Option<Vec<u8>> {
        let inner = self.lock();
        let ino = inner.durable_names.get(path)?;
        Some(inner.inodes[ino].durable.clone())
    }

    /// Counters so far.
    pub fn stats(&self) -> SimDiskStats {
        self.lock().stats
    }

    /// Every live path, sorted.
    pub fn paths(&self) -> Vec<String> {
        self.lock().live_names.keys().cloned().collect()
    }
}

impl Inner {
    fn draw_fault(&mut self, path: &str, kinds: &[FaultKind]) -> Option<FaultKind> {
        for index in 0..self.rules.len() {
            let rule = &self.rules[index];
            if !kinds.contains(&rule.kind) || !path.starts_with(rule.path_prefix.as_str()) {
                continue;
            }
            if rule.remaining == Some(0) {
                continue;
            }
            let chance = rule.chance_ppm;
            if self.rng.random_range(0..1_000_000u32) >= chance {
                continue;
            }
            let rule = &mut self.rules[index];
            if let Some(remaining) = rule.remaining.as_mut() {
                *remaining -= 1;
            }
            self.stats.faults += 1;
            return Some(rule.kind);
        }
        None
    }

    fn ino(&self, path: &str) -> Result<u64, IoFault> {
        self.live_names.get(path).copied().ok_or(IoFault::NotFound)
    }

    fn require_dir(&self, path: &str) -> Result<(), IoFault> {
        if self.dirs.contains(parent_dir(path)) {
            Ok(())
        } else {
            Err(IoFault::NotFound)
        }
    }

    fn ns_change(&mut self, dir: &str, op: NsOp) {
        for (name, target) in &op {
            match target {
                Some(ino) => {
                    self.live_names.insert(name.clone(), *ino);
                }
                None => {
                    self.live_names.remove(name);
                }
            }
        }
        self.pending_ns.entry(dir.to_string()).or_default().push(op);
    }

    fn write_fault(&mut self, path: &str) -> Result<(), IoFault> {
        match self.draw_fault(path, &[FaultKind::WriteEio, FaultKind::NoSpace]) {
            Some(FaultKind::NoSpace) => Err(IoFault::NoSpace),
            Some(FaultKind::WriteEio) | Some(FaultKind::SyncEio) => Err(IoFault::Eio),
            None => Ok(()),
        }
    }

    fn crash(&mut self) {
        self.stats.crashes += 1;
        // Namespace: per directory a random prefix of the pending operations survives.
        let pending_ns = std::mem::take(&mut self.pending_ns);
        for ops in pending_ns.into_values() {
            let kept = self.rng.random_range(0..=ops.len());
            for op in ops.into_iter().take(kept) {
                for (name, target) in op {
                    match target {
                        Some(ino) => {
                            self.durable_names.insert(name, ino);
                        }
                        None => {
                            self.durable_names.remove(&name);
                        }
                    }
                }
            }
        }
        self.live_names = self.durable_names.clone();
        let reachable: BTreeSet<u64> = self.live_names.values().copied().collect();
        self.inodes.retain(|ino, _| reachable.contains(ino));
        let inos: Vec<u64> = self.inodes.keys().copied().collect();
        for ino in inos {
            let mut inode = self.inodes.remove(&ino).expect("listed above");
            tear(&mut self.rng, &mut inode);
            self.inodes.insert(ino, inode);
        }
    }
}

/// Applies a crash to one file: see the module documentation.
fn tear(rng: &mut ChaCha8Rng, inode: &mut Inode) {
    let mut image = std::mem::take(&mut inode.durable);
    let mut appends_stopped = false;
    for pending in std::mem::take(&mut inode.pending) {
        match pending {
            Pending::SetLen(len) => {
                if rng.random_bool(0.5) {
                    image.resize(len as usize, 0);
                }
            }
            Pending::Write { offset, data } => {
                tear_write(rng, &mut image, offset, &data, &mut appends_stopped);
            }
            Pending::Zeros { offset, len } => {
                let zeros = vec![0u8; len as usize];
                tear_write(rng, &mut image, offset, &zeros, &mut appends_stopped);
            }
        }
    }
    inode.live = image.clone();
    inode.durable = image;
}

fn tear_write(
    rng: &mut ChaCha8Rng,
    image: &mut Vec<u8>,
    offset: u64,
    data: &[u8],
    appends_stopped: &mut bool,
) {
    let end = offset + data.len() as u64;
    let mut start = offset;
    while start < end {
        let block_end = ((start / BLOCK_BYTES) + 1) * BLOCK_BYTES;
        let chunk_end = block_end.min(end);
        let chunk = &data[(start - offset) as usize..(chunk_end - offset) as usize];
        let overwrite = chunk_end <= image.len() as u64;
        let keep = if overwrite {
            rng.random_bool(0.5)
        } else if *appends_stopped || start > image.len() as u64 {
            false
        } else {
            let keep = rng.random_bool(0.75);
            *appends_stopped |= !keep;
            keep
        };
        if keep {
            if image.len() < chunk_end as usize {
                image.resize(chunk_end as usize, 0);
            }
            image[start as usize..chunk_end as usize].copy_from_slice(chunk);
        }
        start = chunk_end;
    }
}

fn zero_live(image: &mut Vec<u8>, offset: u64, len: u64) {
    let end = (offset + len) as usize;
    if image.len() < end {
        image.resize(end, 0);
    }
    image[offset as usize..end].fill(0);
}

fn write_live(image: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let end = offset as usize + data.len();
    if image.len() < end {
        image.resize(end, 0);
    }
    image[offset as usize..end].copy_from_slice(data);
}

impl Disk for SimDisk {
    fn create(&self, path: &str) -> Result<(), IoFault> {
        let mut inner = self.lock();
        inner.require_dir(path)?;
        let ino = inner.next_inode;
        inner.next_inode += 1;
        inner.inodes.insert(ino, Inode::default());
        // A truncating create of an existing name gets a fresh inode: the old content is gone at once
        // in the live view and, once the directory is synced, durably.
        inner.ns_change(parent_dir(path), vec![(path.to_string(), Some(ino))]);
        Ok(())
    }

    fn create_dir_all(&self, dir: &str) -> Result<(), IoFault> {
        let mut inner = self.lock();
        let mut prefix = String::new();
        for part in dir.split('/').filter(|part| !part.is_empty()) {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            inner.dirs.insert(prefix.clone());
        }
        Ok(())
    }

    fn write_at(&self, path: &str, offset: u64, data: &[u8]) -> Result<(), IoFault> {
        let mut inner = self.lock();
        let ino = inner.ino(path)?;
        inner.write_fault(path)?;
        inner.stats.writes += 1;
        let inode = inner.inodes.get_mut(&ino).expect("name points at an inode");
        write_live(&mut inode.live, offset, data);
        inode.pending.push(Pending::Write {
            offset,
            data: data.to_vec(),
        });
        Ok(())
    }

    fn write_zeros(&self, path: &str, offset: u64, len: u64) -> Result<(), IoFault> {
        let mut inner = self.lock();
        let ino = inner.ino(path)?;
        inner.write_fault(path)?;
        inner.stats.writes += 1;
        let inode = inner.inodes.get_mut(&ino).expect("name points at an inode");
        zero_live(&mut inode.live, offset, len);
        inode.pending.push(Pending::Zeros { offset, len });
        Ok(())
    }

    fn read_at(&self, path: &str, offset: u64, len: usize) -> Result<Vec<u8>, IoFault> {
        let inner = self.lock();
        let ino = inner.ino(path)?;
        let live = &inner.inodes[&ino].live;
        let start = (offset as usize).min(live.len());
        let end = start.saturating_add(len).min(live.len());
        Ok(live[start..end].to_vec())
    }

    fn len(&self, path: &str) -> Result<u64, IoFault> {
        let inner = self.lock();
        let ino = inner.ino(path)?;
        Ok(inner.inodes[&ino].live.len() as u64)
    }

    fn set_len(&self, path: &str, len: u64) -> Result<(), IoFault> {
        let mut inner = self.lock();
        let ino = inner.ino(path)?;
        if len > inner.inodes[&ino].live.len() as u64 {
            if let Some(FaultKind::NoSpace) = inner.draw_fault(path, &[FaultKind::NoSpace]) {
                return Err(IoFault::NoSpace);
            }
        }
        let inode = inner.inodes.get_mut(&ino).expect("name points at an inode");
        inode.live.resize(len as usize, 0);
        inode.pending.push(Pending::SetLen(len));
        Ok(())
    }

    fn sync_data(&self, path: &str) -> Result<(), IoFault> {
        let mut inner = self.lock();
        let ino = inner.ino(path)?;
        if inner.draw_fault(path, &[FaultKind::SyncEio]).is_some() {
            // fsyncgate: the dirty pages are dropped and marked clean; the live view keeps them until
            // a crash, and the next sync has nothing left to write.
            inner.inodes.get_mut(&ino).expect("inode").pending.clear();
            return Err(IoFault::Eio);
        }
        if inner.lying_sync {
            return Ok(());
        }
        inner.stats.syncs += 1;
        let inode = inner.inodes.get_mut(&ino).expect("name points at an inode");
        // Replay only what is pending, not the live image: pages dropped by an earlier failed sync
        // were marked clean and never reach the disk. Draining keeps the list's allocation for the
        // next writes (a file is written and synced over and over).
        let Inode {
            durable, pending, ..
        } = inode;
        for write in pending.drain(..) {
            match write {
                Pending::SetLen(len) => durable.resize(len as usize, 0),
                Pending::Write { offset, data } => write_live(durable, offset, &data),
                Pending::Zeros { offset, len } => zero_live(durable, offset, len),
            }
        }
        Ok(())
    }

    fn sync_dir(&self, dir: &str) -> Result<(), IoFault> {
        let mut inner = self.lock();
        if !inner.dirs.contains(dir) {
            return Err(IoFault::NotFound);
        }
        if inner.lying_sync {
            return Ok(());
        }
        if let Some(ops) = inner.pending_ns.remove(dir) {
            for op in ops {
                for (name, target) in op {
                    match target {
                        Some(ino) => {
                            inner.durable_names.insert(name, ino);
                        }
                        None => {
                            inner.durable_names.remove(&name);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> Result<(), IoFault> {
        let mut inner = self.lock();
        let ino = inner.ino(from)?;
        inner.require_dir(to)?;
        // Recorded in the destination's directory as one atomic change (we only rename within one).
        inner.ns_change(
            parent_dir(to),
            vec![(from.to_string(), None), (to.to_string(), Some(ino))],
        );
        Ok(())
    }

    fn remove(&self, path: &str) -> Result<(), IoFault> {
        let mut inner = self.lock();
        inner.ino(path)?;
        inner.ns_change(parent_dir(path), vec![(path.to_string(), None)]);
        Ok(())
    }

    fn list(&self, dir: &str) -> Result<Vec<String>, IoFault> {
        let inner = self.lock();
        Ok(inner
            .live_names
            .keys()
            .filter(|name| parent_dir(name) == dir)
            .map(|name| super::file_name(name).to_string())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk_with_dir(seed: u64) -> SimDisk {
        let disk = SimDisk::new(seed);
        disk.create_dir_all("d").unwrap();
        disk
    }

    #[test]
    fn synced_data_and_names_survive_a_crash() {
        let disk = disk_with_dir(1);
        disk.create("d/f").unwrap();
        disk.write_at("d/f", 0, b"hello").unwrap();
        disk.sync_data("d/f").unwrap();
        disk.sync_dir("d").unwrap();
        disk.crash();
        assert_eq!(disk.read_at("d/f", 0, 100).unwrap(), b"hello");
    }

    #[test]
    fn unsynced_create_can_vanish() {
        let mut vanished = 0;
        for seed in 0..64 {
            let disk = disk_with_dir(seed);
            disk.create("d/f").unwrap();
            disk.write_at("d/f", 0, b"x").unwrap();
            disk.sync_data("d/f").unwrap();
            disk.crash();
            if disk.len("d/f").is_err() {
                vanished += 1;
            }
        }
        assert!(vanished > 0 && vanished < 64, "vanished {vanished} of 64");
    }

    #[test]
    fn unsynced_appends_tear_to_a_block_prefix() {
        let data: Vec<u8> = (0..5 * BLOCK_BYTES).map(|i| (i % 251) as u8 + 1).collect();
        let mut lengths = BTreeSet::new();
        for seed in 0..200 {
            let disk = disk_with_dir(seed);
            disk.create("d/f").unwrap();
            disk.sync_dir("d").unwrap();
            disk.write_at("d/f", 0, &data).unwrap();
            disk.crash();
            let kept = disk.read_at("d/f", 0, data.len()).unwrap();
            assert_eq!(kept.len() as u64 % BLOCK_BYTES, 0);
            assert_eq!(&data[..kept.len()], &kept[..], "a prefix, never a hole");
            lengths.insert(kept.len());
        }
        assert!(lengths.contains(&0) && lengths.contains(&data.len()) && lengths.len() > 2);
    }

    #[test]
    fn overwrites_of_synced_extent_can_leave_holes() {
        let mut saw_hole = false;
        for seed in 0..100 {
            let disk = disk_with_dir(seed);
            disk.create("d/f").unwrap();
            disk.write_zeros("d/f", 0, 4 * BLOCK_BYTES).unwrap();
            disk.sync_data("d/f").unwrap();
            disk.sync_dir("d").unwrap();
            disk.write_at("d/f", 0, &vec![7u8; 4 * BLOCK_BYTES as usize])
                .unwrap();
            disk.crash();
            let image = disk.read_at("d/f", 0, 4 * BLOCK_BYTES as usize).unwrap();
            let blocks: Vec<bool> = image
                .chunks(BLOCK_BYTES as usize)
                .map(|b| b[0] == 7)
                .collect();
            if blocks.windows(2).any(|w| !w[0] && w[1]) {
                saw_hole = true;
            }
        }
        assert!(
            saw_hole,
            "some seed must persist a later block without an earlier one"
        );
    }

    #[test]
    fn failed_sync_drops_pages_and_a_later_sync_lies() {
        let disk = disk_with_dir(3);
        disk.create("d/f").unwrap();
        disk.sync_dir("d").unwrap();
        disk.write_at("d/f", 0, b"lost").unwrap();
        disk.add_fault(FaultRule {
            path_prefix: "d/".into(),
            kind: FaultKind::SyncEio,
            chance_ppm: 1_000_000,
            remaining: Some(1),
        });
        assert_eq!(disk.sync_data("d/f"), Err(IoFault::Eio));
        assert_eq!(
            disk.read_at("d/f", 0, 4).unwrap(),
            b"lost",
            "still in the page cache"
        );
        assert_eq!(
            disk.sync_data("d/f"),
            Ok(()),
            "fsyncgate: the retry succeeds"
        );
        disk.crash();
        assert_eq!(
            disk.read_at("d/f", 0, 4).unwrap(),
            b"",
            "but the data never reached the disk"
        );
    }

    #[test]
    fn enospc_writes_nothing() {
        let disk = disk_with_dir(4);
        disk.create("d/f").unwrap();
        disk.add_fault(FaultRule {
            path_prefix: String::new(),
            kind: FaultKind::NoSpace,
            chance_ppm: 1_000_000,
            remaining: None,
        });
        assert_eq!(disk.write_at("d/f", 0, b"abc"), Err(IoFault::NoSpace));
        assert_eq!(disk.len("d/f").unwrap(), 0);
        disk.clear_faults();
        assert_eq!(disk.write_at("d/f", 0, b"abc"), Ok(()));
    }

    #[test]
    fn rename_without_dir_sync_can_revert() {
        let mut reverted = 0;
        for seed in 0..64 {
            let disk = disk_with_dir(seed);
            disk.create("d/a").unwrap();
            disk.write_at("d/a", 0, b"x").unwrap();
            disk.sync_data("d/a").unwrap();
            disk.sync_dir("d").unwrap();
            disk.rename("d/a", "d/b").unwrap();
            disk.crash();
            let names = disk.list("d").unwrap();
            assert!(names == ["a"] || names == ["b"], "atomic: {names:?}");
            if names == ["a"] {
                reverted += 1;
            }
        }
        assert!(reverted > 0 && reverted < 64);
    }

    #[test]
    fn bit_rot_changes_synced_bytes() {
        let disk = disk_with_dir(5);
        disk.create("d/f").unwrap();
        disk.write_at("d/f", 0, &[0u8; 8]).unwrap();
        disk.sync_data("d/f").unwrap();
        assert!(disk.rot("d/f", 3, 2));
        assert_eq!(disk.read_at("d/f", 3, 1).unwrap(), [4u8]);
    }

    #[test]
    fn a_seed_replays_exactly() {
        let run = |seed| {
            let disk = disk_with_dir(seed);
            disk.create("d/f").unwrap();
            disk.sync_dir("d").unwrap();
            disk.write_at("d/f", 0, &vec![1u8; 10 * BLOCK_BYTES as usize])
                .unwrap();
            disk.crash();
            disk.len("d/f").unwrap()
        };
        for seed in 0..20 {
            assert_eq!(run(seed), run(seed));
        }
    }
}
