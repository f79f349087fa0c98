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
    /// How long `op` takes on a *simulated* disk: a driver running under the simulator sleeps this
    /// long (in simulated time) before it runs the op. Real disks take their own time: zero. A wrapper
    /// disk must forward it.
    fn latency(&self, op: &IoOp) -> core::time::Duration {
        let _ = op;
        core::time::Duration::ZERO
    }
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

/// The result of one successful [`IoOp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoReply {
    /// The operation returns nothing.
    Done,
    /// Bytes read.
    Data(Vec<u8>),
    /// A file length.
    Len(u64),
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
