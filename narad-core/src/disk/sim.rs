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
//! Capacity: a disk made with a capacity ([`SimDisk::set_capacity`]) counts as used the live length of
//! every named file; a write, zero fill or `set_len` that would grow the files past it fails with
//! ENOSPC and changes nothing (what a full file system does), and [`Disk::space`] reports what is
//! left. Without one the disk is unbounded and reports [`UNBOUNDED_TOTAL_BYTES`].
//!
//! Faults: `sync_data` failing with EIO drops the pending pages *and marks them clean* (fsyncgate), so a
//! later sync "succeeds" without them; writes failing with EIO or ENOSPC write nothing; bit rot flips a
//! bit of synced data on the medium, and in what reads see only where they see the medium's byte (not
//! under a pending write, nor in pages a failed sync left in memory); a lying mode makes every sync a no-op, only to prove a checker notices.
//!
//! All randomness comes from a `ChaCha8Rng` seeded by the caller; iteration is over `BTreeMap`s, so a
//! seed replays exactly.
//!
//! Images are kept in fixed pages ([`PAGE_BYTES`]) so a growing file never moves the bytes it holds (a
//! `Vec` image was reallocated and copied as the file grew); a page never written since it was last all
//! zeros is not allocated (a prepared segment costs nothing until written). The bytes pending since the
//! last sync are kept in one buffer per file, reused after each sync. Neither changes what any operation
//! or a crash does.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{parent_dir, Disk, DiskSpace};
use crate::error::IoFault;

/// The unit a crash tears writes into.
pub const BLOCK_BYTES: u64 = 4096;

/// The size [`Disk::space`] reports for a disk without a capacity: 1 PiB, so a free-space floor
/// never trips.
pub const UNBOUNDED_TOTAL_BYTES: u64 = 1 << 50;

/// The size of one page of a file image (a multiple of [`BLOCK_BYTES`]; only memory layout).
pub const PAGE_BYTES: usize = 16 * 1024;

/// What an injected fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskFault {
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
    pub kind: DiskFault,
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

/// A change issued since the file's last successful sync.
#[derive(Clone, Debug)]
enum Pending {
    /// The written bytes are `Inode::pending_bytes[start..start + len]`.
    Write {
        offset: u64,
        start: usize,
        len: usize,
    },
    Zeros {
        offset: u64,
        len: u64,
    },
    SetLen(u64),
}

#[derive(Clone, Debug, Default)]
struct Inode {
    live: Image,
    durable: Image,
    pending: Vec<Pending>,
    /// The bytes of the pending writes, in issue order; emptied (keeping its allocation) with the list.
    pending_bytes: Vec<u8>,
}

impl Inode {
    /// Forgets the pending changes (synced, or dropped by a failed sync).
    fn clear_pending(&mut self) {
        self.pending.clear();
        self.pending_bytes.clear();
    }
}

/// A file's bytes in pages of [`PAGE_BYTES`]: growing never copies what is there. `None` is a page
/// of zeros. Invariant: `pages.len() == len.div_ceil(PAGE_BYTES)`, and every byte at or past `len` in
/// an allocated page is zero (truncation clears them), so growing the file reads zeros.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Image {
    len: usize,
    pages: Vec<Option<Box<[u8]>>>,
}

impl Image {
    fn len(&self) -> usize {
        self.len
    }

    /// Truncates, or extends with zeros, to `len` bytes.
    fn set_len(&mut self, len: usize) {
        if len < self.len {
            self.pages.truncate(len.div_ceil(PAGE_BYTES));
            let cut = len % PAGE_BYTES;
            if cut != 0 {
                if let Some(Some(page)) = self.pages.last_mut() {
                    page[cut..].fill(0);
                }
            }
        } else {
            self.pages.resize_with(len.div_ceil(PAGE_BYTES), || None);
        }
        self.len = len;
    }

    /// Writes `data` at `offset`, extending the image (with zeros up to `offset`) if it ends first.
    fn write(&mut self, offset: u64, data: &[u8]) {
        let offset = offset as usize;
        let end = offset + data.len();
        if end > self.len {
            self.set_len(end);
        }
        let mut at = offset;
        let mut rest = data;
        while !rest.is_empty() {
            let in_page = at % PAGE_BYTES;
            let take = rest.len().min(PAGE_BYTES - in_page);
            let page = self.pages[at / PAGE_BYTES]
                .get_or_insert_with(|| vec![0u8; PAGE_BYTES].into_boxed_slice());
            page[in_page..in_page + take].copy_from_slice(&rest[..take]);
            at += take;
            rest = &rest[take..];
        }
    }

    /// Writes `len` zero bytes at `offset`, extending the image if it ends first. Whole pages of zeros
    /// are let go.
    fn zero(&mut self, offset: u64, len: u64) {
        let offset = offset as usize;
        let end = offset + len as usize;
        // Bytes past the old end read zero already.
        let clear_end = end.min(self.len);
        if end > self.len {
            self.set_len(end);
        }
        let mut at = offset;
        while at < clear_end {
            let in_page = at % PAGE_BYTES;
            let take = (clear_end - at).min(PAGE_BYTES - in_page);
            let slot = &mut self.pages[at / PAGE_BYTES];
            if take == PAGE_BYTES {
                *slot = None;
            } else if let Some(page) = slot {
                page[in_page..in_page + take].fill(0);
            }
            at += take;
        }
    }

    /// The bytes `[start, end)`; `end` must not pass the image's length.
    fn read(&self, start: usize, end: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(end - start);
        let mut at = start;
        while at < end {
            let in_page = at % PAGE_BYTES;
            let take = (end - at).min(PAGE_BYTES - in_page);
            match &self.pages[at / PAGE_BYTES] {
                Some(page) => out.extend_from_slice(&page[in_page..in_page + take]),
                None => out.resize(out.len() + take, 0),
            }
            at += take;
        }
        out
    }

    /// Every byte.
    fn to_vec(&self) -> Vec<u8> {
        self.read(0, self.len)
    }

    /// Flips the bits of `mask` in the byte at `index` (which must be inside the image).
    fn flip(&mut self, index: usize, mask: u8) {
        let page = self.pages[index / PAGE_BYTES]
            .get_or_insert_with(|| vec![0u8; PAGE_BYTES].into_boxed_slice());
        page[index % PAGE_BYTES] ^= mask;
    }
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
    /// Most bytes the named files may hold; `None`: unbounded.
    capacity_bytes: Option<u64>,
    /// The live length of every named file, summed (kept as lengths change).
    used_bytes: u64,
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
            capacity_bytes: None,
            used_bytes: 0,
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

    /// Bounds the bytes the files may hold (`None`: unbounded, the default). A capacity below what
    /// they hold already refuses every growth until enough is removed.
    pub fn set_capacity(&self, capacity_bytes: Option<u64>) {
        self.lock().capacity_bytes = capacity_bytes;
    }

    /// The live length of every file, summed: what counts against the capacity.
    pub fn used_bytes(&self) -> u64 {
        self.lock().used_bytes
    }

    /// Drops every file and directory: the disk is empty from now on. A simulator run ends with it,
    /// because madsim keeps a finished run's nodes (and the handles their start-up closures hold)
    /// alive until the process exits.
    pub fn discard(&self) {
        let mut inner = self.lock();
        inner.inodes = BTreeMap::new();
        inner.live_names = BTreeMap::new();
        inner.durable_names = BTreeMap::new();
        inner.pending_ns = BTreeMap::new();
        inner.dirs = BTreeSet::from([String::new()]);
        inner.used_bytes = 0;
    }

    /// Simulates a power loss: see the module documentation.
    pub fn crash(&self) {
        self.lock().crash();
    }

    /// Flips one bit of the byte at `offset` on the medium of `path` (bit rot of synced data), and in
    /// what reads see only where they see the medium's byte: a page held in memory (a write not yet
    /// synced, or one a failed sync never got to the medium) is served from memory, and written back
    /// over the rot by the next sync that covers it. Returns false when the byte does not exist
    /// durably.
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
        // What reads see shows the rot only where it is the medium's byte: not under a write that
        // waits for its sync, nor where a failed sync left pages the medium never got (fsyncgate:
        // marked clean, yet kept in memory).
        let cached = index < inode.live.len()
            && inode.live.read(index, index + 1) == inode.durable.read(index, index + 1);
        inode.durable.flip(index, mask);
        let dirty = inode.pending.iter().any(|pending| match *pending {
            Pending::Write {
                offset: start, len, ..
            } => (start..start + len as u64).contains(&offset),
            Pending::Zeros { offset: start, len } => (start..start + len).contains(&offset),
            Pending::SetLen(_) => false,
        });
        if cached && !dirty {
            inode.live.flip(index, mask);
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
        Some(inner.inodes[ino].durable.to_vec())
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
    fn draw_fault(&mut self, path: &str, kinds: &[DiskFault]) -> Option<DiskFault> {
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

    /// The live length of inode `ino`.
    fn live_len(&self, ino: u64) -> u64 {
        self.inodes[&ino].live.len() as u64
    }

    /// Refuses growing inode `ino` to `new_len` past the capacity (ENOSPC, as a full file system).
    fn check_growth(&self, ino: u64, new_len: u64) -> Result<(), IoFault> {
        let growth = new_len.saturating_sub(self.live_len(ino));
        match self.capacity_bytes {
            Some(capacity) if growth > 0 && self.used_bytes + growth > capacity => {
                Err(IoFault::NoSpace)
            }
            _ => Ok(()),
        }
    }

    /// Changes inode `ino`'s live image with `change`, counting its length change as used.
    fn resize_live(&mut self, ino: u64, change: impl FnOnce(&mut Image)) {
        let live = &mut self
            .inodes
            .get_mut(&ino)
            .expect("name points at an inode")
            .live;
        let before = live.len() as u64;
        change(live);
        let after = live.len() as u64;
        self.used_bytes = self.used_bytes - before + after;
    }

    /// Sums the live lengths of the named files (after a crash replaced the namespace).
    fn recount_used(&mut self) {
        self.used_bytes = self
            .live_names
            .values()
            .map(|ino| self.inodes[ino].live.len() as u64)
            .sum();
    }

    fn ns_change(&mut self, dir: &str, op: NsOp) {
        for (name, target) in &op {
            // A name holds one inode and an inode one name (renames move it), so the files' bytes
            // change by what the name stops and starts pointing at.
            if let Some(old) = self.live_names.get(name).copied() {
                self.used_bytes -= self.live_len(old);
            }
            match target {
                Some(ino) => {
                    self.used_bytes += self.live_len(*ino);
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
        match self.draw_fault(path, &[DiskFault::WriteEio, DiskFault::NoSpace]) {
            Some(DiskFault::NoSpace) => Err(IoFault::NoSpace),
            Some(DiskFault::WriteEio) | Some(DiskFault::SyncEio) => Err(IoFault::Eio),
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
        self.recount_used();
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
                    image.set_len(len as usize);
                }
            }
            Pending::Write { offset, start, len } => {
                let data = &inode.pending_bytes[start..start + len];
                tear_write(rng, &mut image, offset, data, &mut appends_stopped);
            }
            Pending::Zeros { offset, len } => {
                let zeros = vec![0u8; len as usize];
                tear_write(rng, &mut image, offset, &zeros, &mut appends_stopped);
            }
        }
    }
    inode.pending_bytes.clear();
    inode.live = image.clone();
    inode.durable = image;
}

fn tear_write(
    rng: &mut ChaCha8Rng,
    image: &mut Image,
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
            image.write(start, chunk);
        }
        start = chunk_end;
    }
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
        inner.check_growth(ino, offset + data.len() as u64)?;
        inner.write_fault(path)?;
        inner.stats.writes += 1;
        inner.resize_live(ino, |live| live.write(offset, data));
        let inode = inner.inodes.get_mut(&ino).expect("name points at an inode");
        let start = inode.pending_bytes.len();
        inode.pending_bytes.extend_from_slice(data);
        inode.pending.push(Pending::Write {
            offset,
            start,
            len: data.len(),
        });
        Ok(())
    }

    fn write_zeros(&self, path: &str, offset: u64, len: u64) -> Result<(), IoFault> {
        let mut inner = self.lock();
        let ino = inner.ino(path)?;
        inner.check_growth(ino, offset + len)?;
        inner.write_fault(path)?;
        inner.stats.writes += 1;
        inner.resize_live(ino, |live| live.zero(offset, len));
        let inode = inner.inodes.get_mut(&ino).expect("name points at an inode");
        inode.pending.push(Pending::Zeros { offset, len });
        Ok(())
    }

    fn read_at(&self, path: &str, offset: u64, len: usize) -> Result<Vec<u8>, IoFault> {
        let inner = self.lock();
        let ino = inner.ino(path)?;
        let live = &inner.inodes[&ino].live;
        let start = (offset as usize).min(live.len());
        let end = start.saturating_add(len).min(live.len());
        Ok(live.read(start, end))
    }

    fn len(&self, path: &str) -> Result<u64, IoFault> {
        let inner = self.lock();
        let ino = inner.ino(path)?;
        Ok(inner.inodes[&ino].live.len() as u64)
    }

    fn set_len(&self, path: &str, len: u64) -> Result<(), IoFault> {
        let mut inner = self.lock();
        let ino = inner.ino(path)?;
        inner.check_growth(ino, len)?;
        if len > inner.live_len(ino) {
            if let Some(DiskFault::NoSpace) = inner.draw_fault(path, &[DiskFault::NoSpace]) {
                return Err(IoFault::NoSpace);
            }
        }
        inner.resize_live(ino, |live| live.set_len(len as usize));
        let inode = inner.inodes.get_mut(&ino).expect("name points at an inode");
        inode.pending.push(Pending::SetLen(len));
        Ok(())
    }

    fn sync_data(&self, path: &str) -> Result<(), IoFault> {
        let mut inner = self.lock();
        let ino = inner.ino(path)?;
        if inner.draw_fault(path, &[DiskFault::SyncEio]).is_some() {
            // fsyncgate: the dirty pages are dropped and marked clean; the live view keeps them until
            // a crash, and the next sync has nothing left to write.
            inner.inodes.get_mut(&ino).expect("inode").clear_pending();
            return Err(IoFault::Eio);
        }
        if inner.lying_sync {
            return Ok(());
        }
        inner.stats.syncs += 1;
        let inode = inner.inodes.get_mut(&ino).expect("name points at an inode");
        // Replay only what is pending, not the live image: pages dropped by an earlier failed sync
        // were marked clean and never reach the disk. Clearing keeps the lists' allocations for the
        // next writes (a file is written and synced over and over).
        let Inode {
            durable,
            pending,
            pending_bytes,
            ..
        } = inode;
        for write in pending.iter() {
            match *write {
                Pending::SetLen(len) => durable.set_len(len as usize),
                Pending::Write { offset, start, len } => {
                    durable.write(offset, &pending_bytes[start..start + len]);
                }
                Pending::Zeros { offset, len } => durable.zero(offset, len),
            }
        }
        inode.clear_pending();
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

    fn space(&self) -> Result<DiskSpace, IoFault> {
        let inner = self.lock();
        let total_bytes = inner.capacity_bytes.unwrap_or(UNBOUNDED_TOTAL_BYTES);
        Ok(DiskSpace {
            available_bytes: total_bytes.saturating_sub(inner.used_bytes),
            total_bytes,
        })
    }

    fn root_size_bytes(&self) -> Result<u64, IoFault> {
        Ok(self.lock().used_bytes)
    }
}

#[cfg(test)]
mod tests;
