//! `FsDisk`: the [`Disk`] seam over real files under a root directory.
//!
//! Paths are relative to the root and `/`-separated, as everywhere in the seam. Open file handles are
//! cached (at most [`OPEN_FILES_MAX`] unless [`FsDisk::with_open_files_max`] says otherwise) so a group commit costs one `pwrite` and one `fdatasync`, not an
//! `open` as well; the cache follows this disk's own renames and removes, so it stays coherent as long as
//! nothing else renames files under the root. Reads and writes are positional (`pread`/`pwrite`), so two
//! lanes may work on one file at once without a shared cursor.
//!
//! `std::io::Error` stops here: ENOSPC → [`IoFault::NoSpace`], EIO → [`IoFault::Eio`], not found →
//! [`IoFault::NotFound`], already exists → [`IoFault::AlreadyExists`], anything else → [`IoFault::Other`].
//!
//! Failpoints ([`crate::failpoints`]) can make writes and syncs under a path prefix fail with ENOSPC or
//! EIO. [`FsDisk::with_failpoints`] sets them in code; with the `failpoints` cargo feature (off by
//! default) [`FsDisk::new`] also reads them from `NARAD_FAILPOINTS`, so a black-box test can make a real
//! `narad` process run out of disk. Without the feature the environment is never read.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use narad_core::disk::{Disk, DiskSpace};
use narad_core::IoFault;

use crate::failpoints::{Failpoints, Verdict};

/// The most file handles kept open by default; past it the cache is emptied (handles in use stay
/// valid).
pub const OPEN_FILES_MAX: usize = 256;
/// The largest single write `write_zeros` issues.
pub const ZERO_CHUNK_BYTES_MAX: u64 = 1 << 20;

/// Linux's ENOSPC.
const ENOSPC: i32 = 28;
/// Linux's EIO.
const EIO: i32 = 5;

/// Converts an `std::io::Error` into the seam's [`IoFault`].
// `io::ErrorKind` is non-exhaustive: every kind without a fault of its own is one with its text.
#[allow(clippy::wildcard_enum_match_arm)]
pub fn io_fault(error: &io::Error) -> IoFault {
    match error.raw_os_error() {
        Some(ENOSPC) => return IoFault::NoSpace,
        Some(EIO) => return IoFault::Eio,
        _ => {}
    }
    match error.kind() {
        io::ErrorKind::NotFound => IoFault::NotFound,
        io::ErrorKind::AlreadyExists => IoFault::AlreadyExists,
        io::ErrorKind::StorageFull => IoFault::NoSpace,
        _ => IoFault::Other(error.to_string()),
    }
}

fn fault(error: io::Error) -> IoFault {
    io_fault(&error)
}

/// Real files under a root directory.
#[derive(Debug)]
pub struct FsDisk {
    root: PathBuf,
    files: Mutex<HandleCache>,
    open_files_max: usize,
    failpoints: Option<Failpoints>,
    /// Handles unused this long are closed (`storage.idle_log_eviction_ms`); `None`: kept.
    idle_close_after: Option<std::time::Duration>,
    /// Handles closed for idleness so far (`narad_idle_logs_evicted_total`).
    idle_closed: Arc<std::sync::atomic::AtomicU64>,
}

/// The open handles, with when each was last used, and when idle ones were last looked for.
#[derive(Debug, Default)]
struct HandleCache {
    files: HashMap<String, (Arc<File>, std::time::Instant)>,
    swept: Option<std::time::Instant>,
}

/// The real clock of the real disk: idle handles are a property of wall time.
#[allow(clippy::disallowed_methods)]
fn wall_now() -> std::time::Instant {
    std::time::Instant::now()
}

impl FsDisk {
    /// A disk rooted at `root` (created if missing). With the `failpoints` feature, failpoints come from
    /// the `NARAD_FAILPOINTS` environment variable; bad syntax is an error.
    pub fn new(root: impl Into<PathBuf>) -> Result<Self, IoFault> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(fault)?;
        Ok(FsDisk {
            root,
            files: Mutex::new(HandleCache::default()),
            open_files_max: OPEN_FILES_MAX,
            failpoints: Self::env_failpoints()?,
            idle_close_after: None,
            idle_closed: Arc::default(),
        })
    }

    /// Closes cached handles unused for `idle` (looked for at most every quarter of it, at the next
    /// access): a node whose thousands of partitions went quiet holds no descriptor for them.
    pub fn with_idle_close(mut self, idle: std::time::Duration) -> Self {
        self.idle_close_after = Some(idle);
        self
    }

    /// Handles closed for idleness so far, shared (the node's metric reads it).
    pub fn idle_closed(&self) -> Arc<std::sync::atomic::AtomicU64> {
        Arc::clone(&self.idle_closed)
    }

    /// Keeps at most `open_files_max` handles open (at least one). A node sizes it to its open-files
    /// limit: with fewer handles than the partition segments it writes, every commit reopened its file
    /// (the cache is emptied when full), a sixth of a node's CPU at 2,400 partitions.
    pub fn with_open_files_max(mut self, open_files_max: usize) -> Self {
        self.open_files_max = open_files_max.max(1);
        self
    }

    #[cfg(feature = "failpoints")]
    fn env_failpoints() -> Result<Option<Failpoints>, IoFault> {
        Failpoints::from_env()
            .map_err(|error| IoFault::Other(format!("{}: {error}", crate::failpoints::ENV_VAR)))
    }

    #[cfg(not(feature = "failpoints"))]
    fn env_failpoints() -> Result<Option<Failpoints>, IoFault> {
        Ok(None)
    }

    /// A disk rooted at `root` with the given failpoints (tests; the environment is not read).
    pub fn with_failpoints(
        root: impl Into<PathBuf>,
        failpoints: Failpoints,
    ) -> Result<Self, IoFault> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(fault)?;
        Ok(FsDisk {
            root,
            files: Mutex::new(HandleCache::default()),
            open_files_max: OPEN_FILES_MAX,
            failpoints: Some(failpoints),
            idle_close_after: None,
            idle_closed: Arc::default(),
        })
    }

    /// The failpoints in force, if any (to clear them at run time).
    pub fn failpoints(&self) -> Option<&Failpoints> {
        self.failpoints.as_ref()
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn full(&self, path: &str) -> PathBuf {
        assert!(
            !path.starts_with('/') && !path.split('/').any(|part| part == ".."),
            "disk paths are relative and stay under the root: {path:?}"
        );
        if path.is_empty() {
            self.root.clone()
        } else {
            self.root.join(path)
        }
    }

    fn cache(&self) -> MutexGuard<'_, HandleCache> {
        // Holding the lock never panics mid-update; a poisoned map is still consistent.
        self.files
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn remember(&self, path: &str, file: Arc<File>) {
        let mut cache = self.cache();
        if cache.files.len() >= self.open_files_max {
            cache.files.clear();
        }
        cache.files.insert(path.to_string(), (file, wall_now()));
    }

    /// Closes the handles idle past `idle_close_after`, at most every quarter of it.
    fn close_idle(&self, cache: &mut HandleCache, now: std::time::Instant) {
        let Some(idle) = self.idle_close_after else {
            return;
        };
        if cache
            .swept
            .is_some_and(|at| now.duration_since(at) < idle / 4)
        {
            return;
        }
        cache.swept = Some(now);
        let before = cache.files.len();
        cache
            .files
            .retain(|_, (_, used)| now.duration_since(*used) < idle);
        let closed = (before - cache.files.len()) as u64;
        self.idle_closed
            .fetch_add(closed, std::sync::atomic::Ordering::Relaxed);
    }

    /// The cached handle of `path`, opened read-write if not cached.
    fn handle(&self, path: &str) -> Result<Arc<File>, IoFault> {
        {
            let now = wall_now();
            let mut cache = self.cache();
            self.close_idle(&mut cache, now);
            if let Some((file, used)) = cache.files.get_mut(path) {
                *used = now;
                return Ok(Arc::clone(file));
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.full(path))
            .map_err(fault)?;
        let file = Arc::new(file);
        self.remember(path, Arc::clone(&file));
        Ok(file)
    }

    fn write_verdict(&self, path: &str, len: u64) -> Verdict {
        match &self.failpoints {
            Some(failpoints) => failpoints.on_write(path, len),
            None => Verdict::Proceed,
        }
    }

    fn sync_verdict(&self, path: &str) -> Result<(), IoFault> {
        match &self.failpoints {
            Some(failpoints) => failpoints.on_sync(path),
            None => Ok(()),
        }
    }

    fn write_zeros_unchecked(&self, file: &File, offset: u64, len: u64) -> Result<(), IoFault> {
        let chunk_bytes = len.min(ZERO_CHUNK_BYTES_MAX);
        let zeros = vec![0u8; usize::try_from(chunk_bytes).expect("at most 1 MiB")];
        let mut done = 0u64;
        while done < len {
            let step = (len - done).min(chunk_bytes);
            let step_bytes = usize::try_from(step).expect("at most 1 MiB");
            file.write_all_at(&zeros[..step_bytes], offset + done)
                .map_err(fault)?;
            done += step;
        }
        Ok(())
    }
}

/// The read-back buffer of [`Disk::read_crc`], per I/O thread.
const READ_CRC_CHUNK_BYTES: usize = 256 * 1024;

impl Disk for FsDisk {
    fn create(&self, path: &str) -> Result<(), IoFault> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(self.full(path))
            .map_err(fault)?;
        self.remember(path, Arc::new(file));
        Ok(())
    }

    fn create_dir_all(&self, dir: &str) -> Result<(), IoFault> {
        fs::create_dir_all(self.full(dir)).map_err(fault)
    }

    fn write_at(&self, path: &str, offset: u64, data: &[u8]) -> Result<(), IoFault> {
        let file = self.handle(path)?;
        match self.write_verdict(path, data.len() as u64) {
            Verdict::Proceed => file.write_all_at(data, offset).map_err(fault),
            Verdict::Partial {
                allowed_bytes,
                fault: injected,
            } => {
                let allowed = usize::try_from(allowed_bytes)
                    .unwrap_or(usize::MAX)
                    .min(data.len());
                file.write_all_at(&data[..allowed], offset).map_err(fault)?;
                Err(injected)
            }
        }
    }

    fn write_zeros(&self, path: &str, offset: u64, len: u64) -> Result<(), IoFault> {
        let file = self.handle(path)?;
        match self.write_verdict(path, len) {
            Verdict::Proceed => self.write_zeros_unchecked(&file, offset, len),
            Verdict::Partial {
                allowed_bytes,
                fault: injected,
            } => {
                self.write_zeros_unchecked(&file, offset, allowed_bytes.min(len))?;
                Err(injected)
            }
        }
    }

    fn read_at(&self, path: &str, offset: u64, len: usize) -> Result<Vec<u8>, IoFault> {
        let file = self.handle(path)?;
        let mut buffer = vec![0u8; len];
        let mut filled = 0usize;
        while filled < len {
            match file.read_at(&mut buffer[filled..], offset + filled as u64) {
                Ok(0) => break,
                Ok(read) => filled += read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(fault(error)),
            }
        }
        buffer.truncate(filled);
        Ok(buffer)
    }

    fn read_crc(&self, path: &str, offset: u64, len: usize) -> Result<(u32, usize), IoFault> {
        thread_local! {
            /// Each I/O thread's read-back buffer: a checked read-back allocates nothing.
            static BUFFER: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; READ_CRC_CHUNK_BYTES]);
        }
        let file = self.handle(path)?;
        BUFFER.with(|buffer| {
            let mut buffer = buffer.borrow_mut();
            let mut hasher = crc32fast::Hasher::new();
            let mut done = 0usize;
            while done < len {
                let want = (len - done).min(buffer.len());
                match file.read_at(&mut buffer[..want], offset + done as u64) {
                    Ok(0) => break,
                    Ok(read) => {
                        hasher.update(&buffer[..read]);
                        done += read;
                    }
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(error) => return Err(fault(error)),
                }
            }
            Ok((hasher.finalize(), done))
        })
    }

    fn len(&self, path: &str) -> Result<u64, IoFault> {
        fs::metadata(self.full(path))
            .map(|metadata| metadata.len())
            .map_err(fault)
    }

    fn set_len(&self, path: &str, len: u64) -> Result<(), IoFault> {
        let file = self.handle(path)?;
        file.set_len(len).map_err(fault)
    }

    fn sync_data(&self, path: &str) -> Result<(), IoFault> {
        let file = self.handle(path)?;
        self.sync_verdict(path)?;
        file.sync_data().map_err(fault)
    }

    fn sync_dir(&self, dir: &str) -> Result<(), IoFault> {
        let directory = File::open(self.full(dir)).map_err(fault)?;
        directory.sync_all().map_err(fault)
    }

    fn rename(&self, from: &str, to: &str) -> Result<(), IoFault> {
        fs::rename(self.full(from), self.full(to)).map_err(fault)?;
        let cache = &mut self.cache().files;
        cache.remove(to);
        if let Some(file) = cache.remove(from) {
            cache.insert(to.to_string(), file);
        }
        Ok(())
    }

    fn remove(&self, path: &str) -> Result<(), IoFault> {
        fs::remove_file(self.full(path)).map_err(fault)?;
        self.cache().files.remove(path);
        Ok(())
    }

    fn list(&self, dir: &str) -> Result<Vec<String>, IoFault> {
        let entries = match fs::read_dir(self.full(dir)) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(fault(error)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(fault)?;
            if !entry.file_type().map_err(fault)?.is_file() {
                continue;
            }
            match entry.file_name().into_string() {
                Ok(name) => names.push(name),
                Err(name) => {
                    return Err(IoFault::Other(format!(
                        "file name {name:?} in {dir:?} is not UTF-8"
                    )))
                }
            }
        }
        names.sort();
        Ok(names)
    }

    fn space(&self) -> Result<DiskSpace, IoFault> {
        let stat = rustix::fs::statvfs(&self.root).map_err(|errno| fault(errno.into()))?;
        Ok(DiskSpace {
            available_bytes: stat.f_bavail.saturating_mul(stat.f_frsize),
            total_bytes: stat.f_blocks.saturating_mul(stat.f_frsize),
        })
    }

    fn root_size_bytes(&self) -> Result<u64, IoFault> {
        tree_bytes(&self.root)
    }
}

/// Bytes of the files under `dir`, symbolic links not followed. An entry removed during the walk
/// (a segment retention deleted) is skipped, not an error.
fn tree_bytes(dir: &Path) -> Result<u64, IoFault> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(error) => return Err(fault(error)),
    };
    let mut bytes = 0u64;
    for entry in entries {
        let entry = entry.map_err(fault)?;
        let metadata = match entry.metadata() {
            Ok(metadata) => metadata,
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(fault(error)),
        };
        if metadata.is_dir() {
            bytes = bytes.saturating_add(tree_bytes(&entry.path())?);
        } else if metadata.is_file() {
            bytes = bytes.saturating_add(metadata.len());
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failpoints::{Counter, FailpointError, Rule};

    fn disk() -> (tempfile::TempDir, FsDisk) {
        let dir = tempfile::tempdir().expect("temp dir");
        let disk = FsDisk::new(dir.path().join("data")).expect("disk");
        (dir, disk)
    }

    #[test]
    fn writes_read_back_and_extend_the_file() {
        let (_dir, disk) = disk();
        disk.create_dir_all("wal").unwrap();
        disk.create("wal/a").unwrap();
        disk.write_at("wal/a", 0, b"hello").unwrap();
        disk.write_at("wal/a", 10, b"world").unwrap();
        assert_eq!(disk.len("wal/a").unwrap(), 15);
        assert_eq!(
            disk.read_at("wal/a", 0, 100).unwrap(),
            b"hello\0\0\0\0\0world"
        );
        assert_eq!(disk.read_at("wal/a", 12, 2).unwrap(), b"rl");
        disk.sync_data("wal/a").unwrap();
        disk.sync_dir("wal").unwrap();
        disk.sync_dir("").unwrap();
    }

    #[test]
    fn handles_unused_past_the_idle_time_are_closed_and_reopened_on_use() {
        let (_dir, disk) = disk();
        let disk = disk.with_idle_close(std::time::Duration::from_secs(60));
        disk.create("a").unwrap();
        disk.create("b").unwrap();
        disk.write_at("a", 0, b"x").unwrap();
        disk.write_at("b", 0, b"y").unwrap();
        assert_eq!(disk.cache().files.len(), 2);
        let later = wall_now() + std::time::Duration::from_secs(61);
        // "a" was used just before: its time is moved back only for "b".
        disk.cache().files.get_mut("a").unwrap().1 = later;
        disk.close_idle(&mut disk.cache(), later);
        assert_eq!(disk.cache().files.len(), 1);
        assert_eq!(
            disk.idle_closed()
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        // A closed handle is opened again on its next use.
        assert_eq!(disk.read_at("b", 0, 1).unwrap(), b"y");
    }

    #[test]
    fn create_truncates_an_existing_file() {
        let (_dir, disk) = disk();
        disk.create("f").unwrap();
        disk.write_at("f", 0, b"old bytes").unwrap();
        disk.create("f").unwrap();
        assert_eq!(disk.len("f").unwrap(), 0);
    }

    #[test]
    fn missing_files_are_not_found() {
        let (_dir, disk) = disk();
        assert_eq!(disk.read_at("nope", 0, 1), Err(IoFault::NotFound));
        assert_eq!(disk.write_at("nope", 0, b"x"), Err(IoFault::NotFound));
        assert_eq!(disk.len("nope"), Err(IoFault::NotFound));
        assert_eq!(disk.sync_data("nope"), Err(IoFault::NotFound));
        assert_eq!(disk.remove("nope"), Err(IoFault::NotFound));
        assert_eq!(disk.create("no-dir/f"), Err(IoFault::NotFound));
        assert_eq!(disk.list("no-dir"), Ok(Vec::new()));
    }

    #[test]
    fn read_crc_checks_the_bytes_through_its_own_buffer() {
        let (_dir, disk) = disk();
        disk.create("c").unwrap();
        let data: Vec<u8> = (0..(READ_CRC_CHUNK_BYTES * 2 + 77))
            .map(|i| i as u8)
            .collect();
        disk.write_at("c", 0, &data).unwrap();
        let (crc, read) = disk.read_crc("c", 5, data.len() - 5).unwrap();
        assert_eq!((crc, read), (crc32fast::hash(&data[5..]), data.len() - 5));
        // Past the end: what is there, and how much.
        let (crc, read) = disk.read_crc("c", 10, data.len()).unwrap();
        assert_eq!((crc, read), (crc32fast::hash(&data[10..]), data.len() - 10));
    }

    #[test]
    fn write_zeros_allocates_real_zeros_in_chunks() {
        let (_dir, disk) = disk();
        disk.create("z").unwrap();
        disk.write_at("z", 0, &[7u8; 16]).unwrap();
        let len = 3 * ZERO_CHUNK_BYTES_MAX + 5;
        disk.write_zeros("z", 8, len).unwrap();
        assert_eq!(disk.len("z").unwrap(), 8 + len);
        let head = disk.read_at("z", 0, 16).unwrap();
        assert_eq!(head, [7, 7, 7, 7, 7, 7, 7, 7, 0, 0, 0, 0, 0, 0, 0, 0]);
        let tail = disk.read_at("z", 8 + len - 4096, 4096).unwrap();
        assert!(tail.iter().all(|&byte| byte == 0));
        // Allocated, not a sparse hole: the file occupies (about) its length in blocks.
        use std::os::unix::fs::MetadataExt;
        let blocks_bytes = fs::metadata(disk.root().join("z")).unwrap().blocks() * 512;
        assert!(
            blocks_bytes >= len,
            "{blocks_bytes} bytes allocated for {len}"
        );
    }

    #[test]
    fn rename_moves_the_cached_handle_and_remove_forgets_it() {
        let (_dir, disk) = disk();
        disk.create("a").unwrap();
        disk.write_at("a", 0, b"one").unwrap();
        disk.create("b").unwrap();
        disk.rename("a", "b").unwrap();
        assert_eq!(disk.read_at("b", 0, 10).unwrap(), b"one");
        assert_eq!(disk.read_at("a", 0, 10), Err(IoFault::NotFound));
        disk.write_at("b", 3, b"two").unwrap();
        assert_eq!(fs::read(disk.root().join("b")).unwrap(), b"onetwo");
        disk.remove("b").unwrap();
        assert_eq!(disk.len("b"), Err(IoFault::NotFound));
        assert_eq!(disk.write_at("b", 0, b"x"), Err(IoFault::NotFound));
    }

    #[test]
    fn set_len_truncates_and_extends() {
        let (_dir, disk) = disk();
        disk.create("f").unwrap();
        disk.write_at("f", 0, b"abcdef").unwrap();
        disk.set_len("f", 2).unwrap();
        assert_eq!(disk.read_at("f", 0, 10).unwrap(), b"ab");
        disk.set_len("f", 4).unwrap();
        assert_eq!(disk.read_at("f", 0, 10).unwrap(), b"ab\0\0");
    }

    #[test]
    fn space_is_the_file_systems_and_the_root_size_sums_every_file_below() {
        let (_dir, disk) = disk();
        let space = disk.space().unwrap();
        assert!(space.total_bytes > 0 && space.available_bytes <= space.total_bytes);
        assert_eq!(disk.root_size_bytes(), Ok(0));
        disk.create_dir_all("topics/t/1/p00000").unwrap();
        disk.create("topics/t/1/p00000/a.log").unwrap();
        disk.write_at("topics/t/1/p00000/a.log", 0, &[1; 5_000])
            .unwrap();
        disk.create("checkpoint").unwrap();
        disk.write_at("checkpoint", 0, b"abc").unwrap();
        assert_eq!(disk.root_size_bytes(), Ok(5_003));
        // A root that went away measures nothing (the guard's walk races a removal).
        assert_eq!(tree_bytes(&disk.root().join("nope")), Ok(0));
    }

    #[test]
    fn list_names_files_only_sorted() {
        let (_dir, disk) = disk();
        disk.create_dir_all("wal/sub").unwrap();
        for name in ["c", "a", "b"] {
            disk.create(&format!("wal/{name}")).unwrap();
        }
        assert_eq!(disk.list("wal").unwrap(), ["a", "b", "c"]);
    }

    #[test]
    fn io_errors_map_to_faults() {
        assert_eq!(
            io_fault(&io::Error::from_raw_os_error(ENOSPC)),
            IoFault::NoSpace
        );
        assert_eq!(io_fault(&io::Error::from_raw_os_error(EIO)), IoFault::Eio);
        assert_eq!(
            io_fault(&io::Error::from(io::ErrorKind::NotFound)),
            IoFault::NotFound
        );
        assert_eq!(
            io_fault(&io::Error::from(io::ErrorKind::AlreadyExists)),
            IoFault::AlreadyExists
        );
        assert!(matches!(
            io_fault(&io::Error::from_raw_os_error(13)),
            IoFault::Other(_)
        ));
    }

    #[test]
    fn cache_overflow_keeps_every_file_reachable() {
        let (_dir, disk) = disk();
        for index in 0..OPEN_FILES_MAX + 10 {
            let path = format!("f{index}");
            disk.create(&path).unwrap();
            disk.write_at(&path, 0, &[index as u8]).unwrap();
        }
        assert!(disk.cache().files.len() <= OPEN_FILES_MAX);
        for index in 0..OPEN_FILES_MAX + 10 {
            assert_eq!(
                disk.read_at(&format!("f{index}"), 0, 1).unwrap(),
                [index as u8]
            );
        }
    }

    #[test]
    fn a_larger_budget_keeps_every_handle_of_a_working_set_past_the_default() {
        let (_dir, disk) = disk();
        let disk = disk.with_open_files_max(OPEN_FILES_MAX * 4);
        let files = OPEN_FILES_MAX * 3;
        for index in 0..files {
            disk.create(&format!("f{index}")).unwrap();
        }
        // Every file written again is still cached: no reopen per write.
        for index in 0..files {
            disk.write_at(&format!("f{index}"), 0, &[1]).unwrap();
        }
        assert_eq!(disk.cache().files.len(), files);
    }

    #[test]
    fn failpoint_enospc_after_bytes_writes_the_prefix_then_fails_until_cleared() {
        let dir = tempfile::tempdir().unwrap();
        let failpoints = Failpoints::new(vec![Rule {
            path_prefix: "wal/".into(),
            fault: FailpointError::NoSpace,
            counter: Counter::Bytes,
            after: 10,
        }]);
        let disk = FsDisk::with_failpoints(dir.path(), failpoints).unwrap();
        disk.create_dir_all("wal").unwrap();
        disk.create("wal/seg").unwrap();
        disk.create("other").unwrap();
        disk.write_at("wal/seg", 0, b"0123456").unwrap();
        assert_eq!(
            disk.write_at("wal/seg", 7, b"789abc"),
            Err(IoFault::NoSpace)
        );
        assert_eq!(disk.read_at("wal/seg", 0, 100).unwrap(), b"0123456789");
        assert_eq!(disk.write_at("wal/seg", 10, b"x"), Err(IoFault::NoSpace));
        assert_eq!(disk.write_zeros("wal/seg", 10, 5), Err(IoFault::NoSpace));
        assert_eq!(disk.write_at("other", 0, b"unaffected"), Ok(()));
        disk.failpoints().unwrap().clear();
        assert_eq!(disk.write_at("wal/seg", 10, b"x"), Ok(()));
    }

    #[test]
    fn failpoint_eio_after_syncs_fails_later_syncs() {
        let dir = tempfile::tempdir().unwrap();
        let failpoints = Failpoints::new(vec![Rule {
            path_prefix: "wal".into(),
            fault: FailpointError::Eio,
            counter: Counter::Syncs,
            after: 2,
        }]);
        let disk = FsDisk::with_failpoints(dir.path(), failpoints).unwrap();
        disk.create_dir_all("wal").unwrap();
        disk.create("wal/seg").unwrap();
        assert_eq!(disk.sync_data("wal/seg"), Ok(()));
        assert_eq!(disk.sync_data("wal/seg"), Ok(()));
        assert_eq!(disk.sync_data("wal/seg"), Err(IoFault::Eio));
        assert_eq!(disk.sync_data("wal/seg"), Err(IoFault::Eio));
        assert_eq!(disk.write_at("wal/seg", 0, b"writes still work"), Ok(()));
    }
}
