//! INTERIM: a minimal `std::fs` [`Disk`] so the metastore persists in the real node before the
//! WAL host's `FsDisk` lands. It has no preallocation, no failpoints and no O_DIRECT tricks; it exists
//! only so topics survive restarts now. At integration, `crate::server` hands the metastore the shared
//! `FsDisk` instead and this file is deleted.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use narad_core::disk::Disk;
use narad_core::error::IoFault;

/// Real files under a root directory.
#[derive(Debug)]
pub struct InterimDisk {
    root: PathBuf,
}

impl InterimDisk {
    /// A disk rooted at `root` (created if missing).
    pub fn new(root: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(root)?;
        Ok(InterimDisk {
            root: root.to_path_buf(),
        })
    }

    fn at(&self, path: &str) -> PathBuf {
        self.root.join(path)
    }

    fn open(&self, path: &str) -> Result<File, IoFault> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.at(path))
            .map_err(fault)
    }
}

fn fault(error: std::io::Error) -> IoFault {
    match error.kind() {
        ErrorKind::NotFound => IoFault::NotFound,
        ErrorKind::AlreadyExists => IoFault::AlreadyExists,
        ErrorKind::StorageFull => IoFault::NoSpace,
        _ if error.raw_os_error() == Some(5) => IoFault::Eio,
        _ => IoFault::Other(error.to_string()),
    }
}

impl Disk for InterimDisk {
    fn create(&self, path: &str) -> Result<(), IoFault> {
        File::create(self.at(path)).map(drop).map_err(fault)
    }

    fn create_dir_all(&self, dir: &str) -> Result<(), IoFault> {
        std::fs::create_dir_all(self.at(dir)).map_err(fault)
    }

    fn write_at(&self, path: &str, offset: u64, data: &[u8]) -> Result<(), IoFault> {
        self.open(path)?.write_all_at(data, offset).map_err(fault)
    }

    fn write_zeros(&self, path: &str, offset: u64, len: u64) -> Result<(), IoFault> {
        let zeros = vec![0u8; usize::try_from(len).map_err(|_| IoFault::NoSpace)?];
        self.write_at(path, offset, &zeros)
    }

    fn read_at(&self, path: &str, offset: u64, len: usize) -> Result<Vec<u8>, IoFault> {
        let file = self.open(path)?;
        let mut buffer = vec![0u8; len];
        let mut filled = 0;
        while filled < len {
            match file.read_at(&mut buffer[filled..], offset + filled as u64) {
                Ok(0) => break,
                Ok(read) => filled += read,
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(error) => return Err(fault(error)),
            }
        }
        buffer.truncate(filled);
        Ok(buffer)
    }

    fn len(&self, path: &str) -> Result<u64, IoFault> {
        std::fs::metadata(self.at(path))
            .map(|meta| meta.len())
            .map_err(fault)
    }

    fn set_len(&self, path: &str, len: u64) -> Result<(), IoFault> {
        self.open(path)?.set_len(len).map_err(fault)
    }

    fn sync_data(&self, path: &str) -> Result<(), IoFault> {
        self.open(path)?.sync_data().map_err(fault)
    }

    fn sync_dir(&self, dir: &str) -> Result<(), IoFault> {
        File::open(self.at(dir))
            .and_then(|file| file.sync_all())
            .map_err(fault)
    }

    fn rename(&self, from: &str, to: &str) -> Result<(), IoFault> {
        std::fs::rename(self.at(from), self.at(to)).map_err(fault)
    }

    fn remove(&self, path: &str) -> Result<(), IoFault> {
        std::fs::remove_file(self.at(path)).map_err(fault)
    }

    fn list(&self, dir: &str) -> Result<Vec<String>, IoFault> {
        let entries = match std::fs::read_dir(self.at(dir)) {
            Ok(entries) => entries,
            Err(error) if error.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(fault(error)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(fault)?;
            if entry.file_type().map_err(fault)?.is_file() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        names.sort();
        Ok(names)
    }
}
