//! Operating errors that cross the actor boundary as data.

/// An I/O failure reported by a driver, stripped of `std::io::Error` at the node's boundary.
///
/// Disk faults are operating errors: actors handle them (latch, retry elsewhere, refuse), never panic.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IoFault {
    /// The device reported an I/O error (EIO). After a failed fsync the pages it covered are gone.
    #[error("input/output error")]
    Eio,
    /// The device is full (ENOSPC).
    #[error("no space left on device")]
    NoSpace,
    /// The file or directory does not exist.
    #[error("file not found")]
    NotFound,
    /// The file already exists.
    #[error("file already exists")]
    AlreadyExists,
    /// Any other failure, with the driver's description.
    #[error("i/o failure: {0}")]
    Other(String),
}
