//! The disk seam: a narrow storage trait that real files and the simulated faulty disk both implement,
//! and the I/O commands actors emit for a driver to execute on it.
//!
//! Actors never touch a [`Disk`]: they emit [`IoOp`]s (grouped in an [`IoRequest`] that runs in order and
//! stops at the first failure) and receive the outcome back as an event. Drivers run requests with
//! [`execute`]. Paths are relative to the disk's root and `/`-separated.
//!
//! Durability follows POSIX as the simulator models it ([`sim::SimDisk`]): a write is durable only once a
//! [`Disk::sync_data`] of its file returned `Ok`; a create, rename or remove is durable only once a
//! [`Disk::sync_dir`] of its parent directory returned `Ok`.

pub mod driver;
pub mod sim;

use crate::error::IoFault;

/// A storage backend: real files ([`narad-node`'s `FsDisk`]) or the simulator's [`sim::SimDisk`].
///
/// Methods take `&self` so one disk can serve several I/O workers at once.
pub trait Disk: Send + Sync {
    /// Creates `path` empty, truncating it if it exists. Not durable until its directory is synced.
    fn create(&self, path: &str) -> Result<(), IoFault>;
    /// Creates `dir` and its parents if missing. Directory creation is treated as durable.
    fn create_dir_all(&self, dir: &str) -> Result<(), IoFault>;
    /// Writes all of `data` at `offset`, extending the file if needed.
    fn write_at(&self, path: &str, offset: u64, data: &[u8]) -> Result<(), IoFault>;
    /// Writes `len` zero bytes at `offset`, allocating them (not a sparse hole).
    fn write_zeros(&self, path: &str, offset: u64, len: u64) -> Result<(), IoFault>;
    /// Reads up to `len` bytes at `offset`; fewer only when the file ends first.
    fn read_at(&self, path: &str, offset: u64, len: usize) -> Result<Vec<u8>, IoFault>;
    /// The file's current length.
    fn len(&self, path: &str) -> Result<u64, IoFault>;
    /// Truncates or extends (with zeros) the file to `len`.
    fn set_len(&self, path: &str, len: u64) -> Result<(), IoFault>;
    /// fdatasync: makes every earlier write and size change of `path` durable, or fails.
    ///
    /// After a failure the pages it covered may be lost even though a later call succeeds (fsyncgate):
    /// callers must never retry a failed sync and trust the data.
    fn sync_data(&self, path: &str) -> Result<(), IoFault>;
    /// Makes every earlier create, rename and remove of an entry directly in `dir` durable.
    fn sync_dir(&self, dir: &str) -> Result<(), IoFault>;
    /// Renames `from` to `to`, replacing `to` if it exists.
    fn rename(&self, from: &str, to: &str) -> Result<(), IoFault>;
    /// Removes the file.
    fn remove(&self, path: &str) -> Result<(), IoFault>;
    /// Names (not paths) of the files directly in `dir`, sorted; empty when `dir` does not exist.
    fn list(&self, dir: &str) -> Result<Vec<String>, IoFault>;
    /// Reads `len` bytes at `offset` and returns their CRC-32 (IEEE) and how many were read (fewer only
    /// when the file ends first). A disk may read through a buffer of its own: a read-back that only
    /// checks bytes allocates nothing for them.
    fn read_crc(&self, path: &str, offset: u64, len: usize) -> Result<(u32, usize), IoFault> {
        let bytes = self.read_at(path, offset, len)?;
        Ok((crc32fast::hash(&bytes), bytes.len()))
    }
    /// The space of the file system holding the disk's root, as the node's disk guard samples it
    /// (a `statvfs` on real files; the capacity left on a simulated disk).
    fn space(&self) -> Result<DiskSpace, IoFault>;
    /// Bytes of every file under the disk's root (the data directory's size). A real disk walks the
    /// whole tree: call it rarely and off the async threads.
    fn root_size_bytes(&self) -> Result<u64, IoFault>;
    /// How long `op` takes on a *simulated* disk: a driver running under the simulator sleeps this
    /// long (in simulated time) before it runs the op. Real disks take their own time: zero. A wrapper
    /// disk must forward it.
    fn latency(&self, op: &IoOp) -> core::time::Duration {
        let _ = op;
        core::time::Duration::ZERO
    }
}

/// A disk that wraps another and changes a few of its methods (counts them, times them, delays them,
/// makes two writers meet): implement [`DiskLayer::inner`] and override only what the layer changes;
/// every other method, and [`Disk::latency`], reaches the inner disk unchanged, so a new `Disk` method
/// cannot be forgotten by one wrapper. Call a layer through `&dyn Disk` (both traits name the same
/// methods).
pub trait DiskLayer: Send + Sync {
    /// The disk this layer forwards to.
    fn inner(&self) -> &dyn Disk;
    /// [`Disk::create`].
    fn create(&self, path: &str) -> Result<(), IoFault> {
        self.inner().create(path)
    }
    /// [`Disk::create_dir_all`].
    fn create_dir_all(&self, dir: &str) -> Result<(), IoFault> {
        self.inner().create_dir_all(dir)
    }
    /// [`Disk::write_at`].
    fn write_at(&self, path: &str, offset: u64, data: &[u8]) -> Result<(), IoFault> {
        self.inner().write_at(path, offset, data)
    }
    /// [`Disk::write_zeros`].
    fn write_zeros(&self, path: &str, offset: u64, len: u64) -> Result<(), IoFault> {
        self.inner().write_zeros(path, offset, len)
    }
    /// [`Disk::read_at`].
    fn read_at(&self, path: &str, offset: u64, len: usize) -> Result<Vec<u8>, IoFault> {
        self.inner().read_at(path, offset, len)
    }
    /// [`Disk::len`].
    fn len(&self, path: &str) -> Result<u64, IoFault> {
        self.inner().len(path)
    }
    /// [`Disk::set_len`].
    fn set_len(&self, path: &str, len: u64) -> Result<(), IoFault> {
        self.inner().set_len(path, len)
    }
    /// [`Disk::sync_data`].
    fn sync_data(&self, path: &str) -> Result<(), IoFault> {
        self.inner().sync_data(path)
    }
    /// [`Disk::sync_dir`].
    fn sync_dir(&self, dir: &str) -> Result<(), IoFault> {
        self.inner().sync_dir(dir)
    }
    /// [`Disk::rename`].
    fn rename(&self, from: &str, to: &str) -> Result<(), IoFault> {
        self.inner().rename(from, to)
    }
    /// [`Disk::remove`].
    fn remove(&self, path: &str) -> Result<(), IoFault> {
        self.inner().remove(path)
    }
    /// [`Disk::list`].
    fn list(&self, dir: &str) -> Result<Vec<String>, IoFault> {
        self.inner().list(dir)
    }
    /// [`Disk::read_crc`].
    fn read_crc(&self, path: &str, offset: u64, len: usize) -> Result<(u32, usize), IoFault> {
        self.inner().read_crc(path, offset, len)
    }
    /// [`Disk::space`].
    fn space(&self) -> Result<DiskSpace, IoFault> {
        self.inner().space()
    }
    /// [`Disk::root_size_bytes`].
    fn root_size_bytes(&self) -> Result<u64, IoFault> {
        self.inner().root_size_bytes()
    }
    /// [`Disk::latency`].
    fn latency(&self, op: &IoOp) -> core::time::Duration {
        self.inner().latency(op)
    }
}

impl<L: DiskLayer> Disk for L {
    fn create(&self, path: &str) -> Result<(), IoFault> {
        DiskLayer::create(self, path)
    }
    fn create_dir_all(&self, dir: &str) -> Result<(), IoFault> {
        DiskLayer::create_dir_all(self, dir)
    }
    fn write_at(&self, path: &str, offset: u64, data: &[u8]) -> Result<(), IoFault> {
        DiskLayer::write_at(self, path, offset, data)
    }
    fn write_zeros(&self, path: &str, offset: u64, len: u64) -> Result<(), IoFault> {
        DiskLayer::write_zeros(self, path, offset, len)
    }
    fn read_at(&self, path: &str, offset: u64, len: usize) -> Result<Vec<u8>, IoFault> {
        DiskLayer::read_at(self, path, offset, len)
    }
    fn len(&self, path: &str) -> Result<u64, IoFault> {
        DiskLayer::len(self, path)
    }
    fn set_len(&self, path: &str, len: u64) -> Result<(), IoFault> {
        DiskLayer::set_len(self, path, len)
    }
    fn sync_data(&self, path: &str) -> Result<(), IoFault> {
        DiskLayer::sync_data(self, path)
    }
    fn sync_dir(&self, dir: &str) -> Result<(), IoFault> {
        DiskLayer::sync_dir(self, dir)
    }
    fn rename(&self, from: &str, to: &str) -> Result<(), IoFault> {
        DiskLayer::rename(self, from, to)
    }
    fn remove(&self, path: &str) -> Result<(), IoFault> {
        DiskLayer::remove(self, path)
    }
    fn list(&self, dir: &str) -> Result<Vec<String>, IoFault> {
        DiskLayer::list(self, dir)
    }
    fn read_crc(&self, path: &str, offset: u64, len: usize) -> Result<(u32, usize), IoFault> {
        DiskLayer::read_crc(self, path, offset, len)
    }
    fn space(&self) -> Result<DiskSpace, IoFault> {
        DiskLayer::space(self)
    }
    fn root_size_bytes(&self) -> Result<u64, IoFault> {
        DiskLayer::root_size_bytes(self)
    }
    fn latency(&self, op: &IoOp) -> core::time::Duration {
        DiskLayer::latency(self, op)
    }
}

/// The space of the file system holding a disk's root ([`Disk::space`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskSpace {
    /// Bytes an unprivileged writer can still allocate (`f_bavail`: without the root reserve).
    pub available_bytes: u64,
    /// The file system's size.
    pub total_bytes: u64,
}

/// One I/O command, as an actor emits it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoOp {
    /// [`Disk::create`].
    Create {
        /// File to create or truncate.
        path: String,
    },
    /// [`Disk::create_dir_all`].
    CreateDirAll {
        /// Directory to create.
        dir: String,
    },
    /// [`Disk::write_at`].
    WriteAt {
        /// File to write.
        path: String,
        /// Byte offset.
        offset: u64,
        /// Bytes to write.
        data: Vec<u8>,
    },
    /// [`Disk::write_zeros`].
    WriteZeros {
        /// File to write.
        path: String,
        /// Byte offset.
        offset: u64,
        /// How many zero bytes.
        len: u64,
    },
    /// [`Disk::read_at`]; replies [`IoReply::Data`].
    ReadAt {
        /// File to read.
        path: String,
        /// Byte offset.
        offset: u64,
        /// Bytes wanted.
        len: usize,
    },
    /// [`Disk::read_crc`]; replies [`IoReply::Crc`].
    ReadCrc {
        /// File to read.
        path: String,
        /// Byte offset.
        offset: u64,
        /// Bytes to check.
        len: usize,
    },
    /// [`Disk::len`]; replies [`IoReply::Len`].
    Len {
        /// File to measure.
        path: String,
    },
    /// [`Disk::set_len`].
    SetLen {
        /// File to resize.
        path: String,
        /// New length.
        len: u64,
    },
    /// [`Disk::sync_data`].
    SyncData {
        /// File to sync.
        path: String,
    },
    /// [`Disk::sync_dir`].
    SyncDir {
        /// Directory to sync.
        dir: String,
    },
    /// [`Disk::rename`].
    Rename {
        /// Old path.
        from: String,
        /// New path.
        to: String,
    },
    /// [`Disk::remove`].
    Remove {
        /// File to remove.
        path: String,
    },
    /// [`Disk::list`]; replies [`IoReply::Names`].
    List {
        /// Directory to list.
        dir: String,
    },
}

impl IoOp {
    /// Whether the op makes earlier writes durable (`SyncData`, `SyncDir`): the ops a simulated disk
    /// makes a request wait for.
    pub fn is_sync(&self) -> bool {
        match self {
            IoOp::SyncData { .. } | IoOp::SyncDir { .. } => true,
            IoOp::Create { .. }
            | IoOp::CreateDirAll { .. }
            | IoOp::WriteAt { .. }
            | IoOp::WriteZeros { .. }
            | IoOp::ReadAt { .. }
            | IoOp::ReadCrc { .. }
            | IoOp::Len { .. }
            | IoOp::SetLen { .. }
            | IoOp::Rename { .. }
            | IoOp::Remove { .. }
            | IoOp::List { .. } => false,
        }
    }
}

/// The result of one successful [`IoOp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoReply {
    /// The operation returns nothing.
    Done,
    /// Bytes read.
    Data(Vec<u8>),
    /// A file length.
    Len(u64),
    /// The CRC-32 of the bytes read, and how many were read.
    Crc(u32, usize),
    /// File names.
    Names(Vec<String>),
}

/// Identifies an [`IoRequest`] so its completion can be matched to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IoId(pub u64);

/// Where a request runs: requests of one lane run one at a time in emission order; different lanes may
/// run concurrently (so preparing a WAL segment never delays a group commit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IoLane(pub u8);

/// A sequence of operations run in order, stopping at the first failure.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct IoRequest {
    /// Echoed in the completion.
    pub id: IoId,
    /// Ordering domain.
    pub lane: IoLane,
    /// The operations, in order.
    pub ops: Vec<IoOp>,
}

/// The outcome of an [`IoRequest`]: one reply per op, or the first failure (later ops did not run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoCompletion {
    /// The request's id.
    pub id: IoId,
    /// Replies in op order, or the first fault with the index of the op that failed.
    pub result: Result<Vec<IoReply>, (usize, IoFault)>,
}

/// Runs one op on a disk.
pub fn execute_op(disk: &dyn Disk, op: &IoOp) -> Result<IoReply, IoFault> {
    match op {
        IoOp::Create { path } => disk.create(path).map(|()| IoReply::Done),
        IoOp::CreateDirAll { dir } => disk.create_dir_all(dir).map(|()| IoReply::Done),
        IoOp::WriteAt { path, offset, data } => {
            disk.write_at(path, *offset, data).map(|()| IoReply::Done)
        }
        IoOp::WriteZeros { path, offset, len } => disk
            .write_zeros(path, *offset, *len)
            .map(|()| IoReply::Done),
        IoOp::ReadAt { path, offset, len } => disk.read_at(path, *offset, *len).map(IoReply::Data),
        IoOp::ReadCrc { path, offset, len } => disk
            .read_crc(path, *offset, *len)
            .map(|(crc, read)| IoReply::Crc(crc, read)),
        IoOp::Len { path } => disk.len(path).map(IoReply::Len),
        IoOp::SetLen { path, len } => disk.set_len(path, *len).map(|()| IoReply::Done),
        IoOp::SyncData { path } => disk.sync_data(path).map(|()| IoReply::Done),
        IoOp::SyncDir { dir } => disk.sync_dir(dir).map(|()| IoReply::Done),
        IoOp::Rename { from, to } => disk.rename(from, to).map(|()| IoReply::Done),
        IoOp::Remove { path } => disk.remove(path).map(|()| IoReply::Done),
        IoOp::List { dir } => disk.list(dir).map(IoReply::Names),
    }
}

/// Runs a request on a disk: every op in order, stopping at the first failure.
pub fn execute(disk: &dyn Disk, request: &IoRequest) -> IoCompletion {
    let mut replies = Vec::with_capacity(request.ops.len());
    for (index, op) in request.ops.iter().enumerate() {
        match execute_op(disk, op) {
            Ok(reply) => replies.push(reply),
            Err(fault) => {
                return IoCompletion {
                    id: request.id,
                    result: Err((index, fault)),
                }
            }
        }
    }
    IoCompletion {
        id: request.id,
        result: Ok(replies),
    }
}

/// The directory part of a path (`""` for a file at the root).
pub fn parent_dir(path: &str) -> &str {
    match path.rfind('/') {
        Some(index) => &path[..index],
        None => "",
    }
}

/// The file-name part of a path.
pub fn file_name(path: &str) -> &str {
    match path.rfind('/') {
        Some(index) => &path[index + 1..],
        None => path,
    }
}

/// Joins a directory and a file name.
pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use core::sync::atomic::{AtomicU64, Ordering};
    use core::time::Duration;

    use super::sim::SimDisk;
    use super::*;

    /// Counts syncs and models a latency; everything else must reach the inner disk.
    struct Counting {
        inner: SimDisk,
        syncs: AtomicU64,
    }

    impl DiskLayer for Counting {
        fn inner(&self) -> &dyn Disk {
            &self.inner
        }
        fn sync_data(&self, path: &str) -> Result<(), IoFault> {
            self.syncs.fetch_add(1, Ordering::Relaxed);
            self.inner.sync_data(path)
        }
    }

    /// Overrides only the latency.
    struct Slow(Counting);

    impl DiskLayer for Slow {
        fn inner(&self) -> &dyn Disk {
            &self.0
        }
        fn latency(&self, _op: &IoOp) -> Duration {
            Duration::from_millis(3)
        }
    }

    #[test]
    fn a_layer_changes_what_it_overrides_and_forwards_the_rest() {
        let layered = Slow(Counting {
            inner: SimDisk::new(1),
            syncs: AtomicU64::new(0),
        });
        let disk: &dyn Disk = &layered;
        disk.create_dir_all("d").unwrap();
        disk.create("d/f").unwrap();
        disk.write_at("d/f", 0, b"abc").unwrap();
        disk.write_zeros("d/f", 3, 2).unwrap();
        disk.sync_data("d/f").unwrap();
        disk.sync_dir("d").unwrap();
        disk.rename("d/f", "d/g").unwrap();
        assert_eq!(disk.read_at("d/g", 0, 8).unwrap(), b"abc\0\0");
        disk.set_len("d/g", 1).unwrap();
        assert_eq!(disk.len("d/g").unwrap(), 1);
        assert_eq!(disk.list("d").unwrap(), ["g"]);
        disk.remove("d/g").unwrap();
        assert_eq!(disk.list("d").unwrap(), Vec::<String>::new());
        disk.create("d/h").unwrap();
        disk.write_at("d/h", 0, b"abcd").unwrap();
        assert_eq!(disk.root_size_bytes(), Ok(4));
        assert_eq!(disk.space(), layered.0.inner.space());
        assert_eq!(layered.0.syncs.load(Ordering::Relaxed), 1);
        let op = IoOp::SyncDir { dir: "d".into() };
        assert_eq!(disk.latency(&op), Duration::from_millis(3));
        let inner: &dyn Disk = &layered.0;
        assert_eq!(inner.latency(&op), Duration::ZERO);
    }
}
