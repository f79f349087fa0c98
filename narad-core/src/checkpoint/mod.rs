//! The checkpointer actor: the dispatcher's durable checkpoint, stored in place and synced lazily.
//!
//! # Contract
//! The checkpoint is the next WAL sequence number the dispatcher would dispatch: every seq below it was
//! committed to its partition (or discarded). It lives in `<dir>/checkpoint` as exactly 8 bytes, big-endian;
//! a missing file means 0, any other size is an open error ([`CheckpointOpenError`]).
//! - **Store in place at once.** Every [`CheckpointInput::Store`] that moves the value emits a
//!   [`IoOp::WriteAt`] of the 8 bytes at offset 0 on the spot (coalesced only while an earlier write is
//!   still outstanding, so at most one write is ever queued), so a *process* crash keeps the value.
//! - **Lazy sync.** One [`IoOp::SyncData`] covers however many stores landed meanwhile; it is issued at the
//!   latest [`CheckpointerConfig::sync_delay`] (250 ms, `checkpointSyncDelay`) after the first store it
//!   covers arrived. [`CheckpointInput::Flush`] (shutdown) syncs now and answers
//!   [`CheckpointOutput::Flushed`] once everything stored before it is durable.
//! - **Publish only what is synced.** [`CheckpointOutput::Synced`] carries the value a successful
//!   `fdatasync` covered. It is the only value WAL compaction may trail. It never goes backwards, and the
//!   first one is published only after the recovered value was rewritten and synced at startup.
//! - **First creation** (file missing): `create checkpoint.tmp → write → fdatasync → rename → fsync dir`,
//!   so every later in-place overwrite hits a file whose name and 8 bytes are already durable.
//! - **Failures** are reported as [`CheckpointOutput::Failed`] (the dispatcher backs off on them). The
//!   actor then waits [`CheckpointerConfig::retry_delay`] and retries on its own: a failed creation is
//!   redone whole; a failed write or sync is redone as *rewrite the 8 bytes, then sync*.
//!
//! # Why a rewrite makes a later sync trustworthy (fsyncgate)
//! After a failed `fdatasync` Linux may drop the dirty page *and mark it clean*: the page cache still
//! shows our bytes, the disk may not hold them, and the next `fdatasync` "succeeds" without writing them.
//! So a failed sync's value is never published, and no later sync is credited until a write *issued
//! after the failed sync* has completed: that write dirties the page again, and since the checkpoint is 8
//! bytes at offset 0 (one page, one sector) the write replaces the whole value, so the next successful
//! sync writes exactly those bytes. The same holds across a restart: the bytes read at open may sit in a
//! page that an earlier process's failed sync marked clean, so open rewrites them before its first sync.
//! After a failed write the page is treated the same way (rewrite before any sync is credited), because
//! the kernel may or may not have copied the bytes.
//!
//! All requests go on one [`IoLane`], so they run in emission order. A sync is emitted only when no write
//! is outstanding (it covers exactly the last completed write), and a write emitted while a sync runs
//! executes after it — which is what lets a write outstanding at a sync failure re-dirty the page.
//!
//! What the disk can hold after an OS crash: some value that was stored, at least the last published
//! synced value (writes only move it forward, and an 8-byte write inside one sector is atomic).
//!
//! # Polling order
//! Construct with [`Checkpointer::open`] (it queues the startup I/O), then drain [`Actor::poll_output`]
//! after construction and after every [`Actor::handle`]; feed [`CheckpointInput::Tick`] at
//! [`Actor::poll_timeout`] and every [`IoCompletion`] of a request it emitted. Run its requests on one
//! lane, in order. Open the WAL only after the first [`CheckpointOutput::Synced`]: the WAL takes the
//! checkpoint it opens with as synced and may compact behind it.
//!
//! # Invariants (checked after every `handle` in debug builds)
//! `synced ≤ written ≤ stored`; at most one write, one sync and one creation outstanding; a sync is only
//! outstanding over a completed, trusted write; no write or sync before the file exists.

#[cfg(test)]
mod tests;

use core::time::Duration;
use std::collections::VecDeque;

use crate::actor::Actor;
use crate::disk::driver::IoActor;
use crate::disk::{join, Disk, IoCompletion, IoId, IoLane, IoOp, IoRequest};
use crate::error::IoFault;
use crate::ids::Seq;
use crate::time::Instant;

/// How long a stored checkpoint may sit written but not yet fdatasynced (`checkpointSyncDelay`).
pub const CHECKPOINT_SYNC_DELAY: Duration = Duration::from_millis(250);
/// How long the checkpointer waits after a failed create, write or sync before it tries again.
pub const CHECKPOINT_RETRY_DELAY: Duration = Duration::from_millis(250);
/// The checkpoint file's name inside its directory.
pub const CHECKPOINT_FILE_NAME: &str = "checkpoint";
/// The scratch file the first creation writes and renames into place.
pub const CHECKPOINT_TMP_FILE_NAME: &str = "checkpoint.tmp";
/// The checkpoint file's exact size.
pub const CHECKPOINT_BYTES: usize = 8;
/// The most bytes [`read_checkpoint_file`] reads (a bigger file is an open error anyway).
pub const CHECKPOINT_READ_BYTES_MAX: u64 = 4096;

/// The checkpointer's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointerConfig {
    /// Directory holding the checkpoint file (relative to the disk root).
    pub dir: String,
    /// The most a store waits before an fdatasync covering it is issued.
    pub sync_delay: Duration,
    /// The wait after a failure before the actor retries.
    pub retry_delay: Duration,
    /// The lane every request goes on (all of them on one, so they run in order).
    pub lane: IoLane,
}

impl CheckpointerConfig {
    /// The production settings for a checkpoint kept in `dir`.
    pub fn new(dir: impl Into<String>) -> Self {
        CheckpointerConfig {
            dir: dir.into(),
            sync_delay: CHECKPOINT_SYNC_DELAY,
            retry_delay: CHECKPOINT_RETRY_DELAY,
            lane: IoLane(0),
        }
    }
}

/// Why the stored checkpoint could not be opened.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointOpenError {
    /// The file exists but does not hold exactly 8 bytes.
    #[error("checkpoint file {path} holds {len} bytes, expected exactly 8")]
    BadSize {
        /// The checkpoint file.
        path: String,
        /// Bytes it holds (capped at the read limit).
        len: usize,
    },
}

/// Events the checkpointer consumes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointInput {
    /// The dispatcher's checkpoint moved to this value (never backwards).
    Store(Seq),
    /// Sync now (shutdown): answer [`CheckpointOutput::Flushed`] once every value stored so far is durable.
    Flush,
    /// The time returned by [`Actor::poll_timeout`] has come.
    Tick,
    /// A request this actor emitted finished.
    Io(IoCompletion),
}

/// Which step failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointOp {
    /// The first creation of the file (tmp, write, sync, rename, directory sync).
    Create,
    /// An in-place write of the 8 bytes.
    Write,
    /// An fdatasync of the file (or the startup directory sync).
    Sync,
}

/// A failed step and its fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointFailure {
    /// What failed.
    pub op: CheckpointOp,
    /// How.
    pub fault: IoFault,
}

/// Commands the checkpointer emits.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum CheckpointOutput {
    /// Run this request and feed its completion back.
    Io(IoRequest),
    /// The durable checkpoint advanced to this value (published once at startup, then on every advance).
    /// WAL compaction may trail only this value.
    Synced(Seq),
    /// A step failed; the actor retries after its retry delay. The dispatcher backs off on it.
    Failed(CheckpointFailure),
    /// Answer to [`CheckpointInput::Flush`]: the durable value, or the failure that prevented it.
    Flushed(Result<Seq, CheckpointFailure>),
}

/// Reads the checkpoint file's bytes for [`Checkpointer::open`]: `None` when it does not exist.
pub fn read_checkpoint_file(disk: &dyn Disk, dir: &str) -> Result<Option<Vec<u8>>, IoFault> {
    let path = join(dir, CHECKPOINT_FILE_NAME);
    let len = match disk.len(&path) {
        Ok(len) => len,
        Err(IoFault::NotFound) => return Ok(None),
        Err(fault) => return Err(fault),
    };
    let want =
        usize::try_from(len.min(CHECKPOINT_READ_BYTES_MAX)).expect("capped to a small constant");
    match disk.read_at(&path, 0, want) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(IoFault::NotFound) => Ok(None),
        Err(fault) => Err(fault),
    }
}

/// An outstanding write or sync and the value it carries (a sync: the value it covers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct InFlight {
    id: IoId,
    value: Seq,
}

/// The checkpointer actor; see the module documentation.
#[derive(Debug)]
pub struct Checkpointer {
    config: CheckpointerConfig,
    path: String,
    tmp_path: String,
    /// The value found at open (0 when the file was missing).
    recovered: Seq,
    /// The latest value the dispatcher stored.
    stored: Seq,
    /// The value of the last completed write (or creation, or the bytes found at open).
    written: Seq,
    /// False after a failed write or sync (and at open) until a write issued afterwards completes.
    page_trusted: bool,
    /// False until the file's creation completed (or it was found at open).
    file_exists: bool,
    /// Whether the file's directory entry is known durable (the first sync also syncs the directory).
    dir_synced: bool,
    create: Option<InFlight>,
    write: Option<InFlight>,
    sync: Option<InFlight>,
    /// The last published synced value; `None` before the startup sync.
    synced: Option<Seq>,
    /// When a sync covering everything stored so far must be issued; `None` when nothing is uncovered.
    sync_due: Option<Instant>,
    /// Arrival of the first store not yet carried by a write.
    unwritten_since: Option<Instant>,
    /// While set, nothing is issued: the backoff after a failure.
    retry_at: Option<Instant>,
    /// A pending flush: the value that must be durable before [`CheckpointOutput::Flushed`].
    flush: Option<Seq>,
    next_io: u64,
    outputs: VecDeque<CheckpointOutput>,
    /// A planted bug for the crash test's self-check: trust the page after a failed sync.
    #[cfg(test)]
    plant_trust_after_failed_sync: bool,
}

impl Checkpointer {
    /// Opens the checkpoint from the file's bytes (`None`: the file does not exist) and queues the
    /// startup I/O: the first creation, or the rewrite-and-sync of the recovered value.
    pub fn open(
        config: CheckpointerConfig,
        now: Instant,
        stored_bytes: Option<&[u8]>,
    ) -> Result<Self, CheckpointOpenError> {
        let path = join(&config.dir, CHECKPOINT_FILE_NAME);
        let tmp_path = join(&config.dir, CHECKPOINT_TMP_FILE_NAME);
        let recovered = match stored_bytes {
            None => None,
            Some(bytes) => {
                let array: [u8; CHECKPOINT_BYTES] =
                    bytes.try_into().map_err(|_| CheckpointOpenError::BadSize {
                        path: path.clone(),
                        len: bytes.len(),
                    })?;
                Some(Seq(u64::from_be_bytes(array)))
            }
        };
        let value = recovered.unwrap_or(Seq(0));
        let mut checkpointer = Checkpointer {
            config,
            path,
            tmp_path,
            recovered: value,
            stored: value,
            written: value,
            page_trusted: false,
            file_exists: recovered.is_some(),
            dir_synced: false,
            create: None,
            write: None,
            sync: None,
            synced: None,
            // The recovered value is synced at once, before anything compacts behind it.
            sync_due: Some(now),
            unwritten_since: None,
            retry_at: None,
            flush: None,
            next_io: 0,
            outputs: VecDeque::new(),
            #[cfg(test)]
            plant_trust_after_failed_sync: false,
        };
        checkpointer.pump(now);
        checkpointer.check_invariants();
        Ok(checkpointer)
    }

    /// The value found at open (0 when the file was missing).
    pub fn recovered(&self) -> Seq {
        self.recovered
    }

    /// The latest value stored (what a process crash keeps once its write completed).
    pub fn stored(&self) -> Seq {
        self.stored
    }

    /// The value of the last completed in-place write (or creation, or the bytes found at open): what a
    /// process crash keeps. A store is "stored" for the dispatcher once this reaches it.
    pub fn written(&self) -> Seq {
        self.written
    }

    /// The last published synced value; `None` until the startup sync succeeded.
    pub fn synced(&self) -> Option<Seq> {
        self.synced
    }

    /// The checkpoint file's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    fn on_store(&mut self, now: Instant, value: Seq) {
        assert!(
            value >= self.stored,
            "the checkpoint never moves backwards: {} -> {value}",
            self.stored
        );
        if value == self.stored {
            return;
        }
        self.stored = value;
        self.unwritten_since.get_or_insert(now);
        self.sync_due.get_or_insert(now + self.config.sync_delay);
    }

    fn on_flush(&mut self, now: Instant) {
        if self.synced == Some(self.stored) {
            self.outputs
                .push_back(CheckpointOutput::Flushed(Ok(self.stored)));
            return;
        }
        self.flush = Some(self.stored);
        self.sync_due = Some(now);
    }

    fn on_completion(&mut self, now: Instant, completion: IoCompletion) {
        let id = completion.id;
        let result = completion.result.map(|_| ()).map_err(|(_, fault)| fault);
        if let Some(create) = self.create.filter(|op| op.id == id) {
            self.create = None;
            match result {
                Ok(()) => self.on_created(create.value),
                Err(fault) => self.on_failure(now, CheckpointOp::Create, fault),
            }
        } else if let Some(write) = self.write.filter(|op| op.id == id) {
            self.write = None;
            match result {
                Ok(()) => {
                    self.written = write.value;
                    // Emitted after every completion seen so far, so on the lane it ran after any
                    // failed sync: it dirtied the page again with the whole value.
                    self.page_trusted = true;
                }
                Err(fault) => {
                    self.page_trusted = false;
                    self.unwritten_since.get_or_insert(now);
                    self.on_failure(now, CheckpointOp::Write, fault);
                }
            }
        } else if let Some(sync) = self.sync.filter(|op| op.id == id) {
            self.sync = None;
            match result {
                Ok(()) => self.on_synced(sync.value),
                Err(fault) => {
                    #[cfg(test)]
                    let trust = self.plant_trust_after_failed_sync;
                    #[cfg(not(test))]
                    let trust = false;
                    // fsyncgate: the page may have been dropped and marked clean.
                    self.page_trusted = trust;
                    self.on_failure(now, CheckpointOp::Sync, fault);
                }
            }
        } else {
            panic!("completion {id:?} for a request the checkpointer did not emit");
        }
    }

    fn on_created(&mut self, value: Seq) {
        self.file_exists = true;
        self.dir_synced = true;
        self.written = value;
        self.page_trusted = true;
        self.on_synced(value);
    }

    fn on_synced(&mut self, value: Seq) {
        self.dir_synced = true;
        if self.synced != Some(value) {
            self.synced = Some(value);
            self.outputs.push_back(CheckpointOutput::Synced(value));
        }
        if let Some(target) = self.flush {
            if value >= target {
                self.flush = None;
                self.outputs.push_back(CheckpointOutput::Flushed(Ok(value)));
            }
        }
    }

    fn on_failure(&mut self, now: Instant, op: CheckpointOp, fault: IoFault) {
        let failure = CheckpointFailure { op, fault };
        self.outputs
            .push_back(CheckpointOutput::Failed(failure.clone()));
        if self.flush.take().is_some() {
            self.outputs
                .push_back(CheckpointOutput::Flushed(Err(failure)));
        }
        // What the failed step carried is uncovered again and overdue: redo it right after the backoff.
        self.sync_due = Some(now);
        self.retry_at = Some(now + self.config.retry_delay);
    }

    /// Issues whatever is due; called at the end of every event.
    fn pump(&mut self, now: Instant) {
        if let Some(retry_at) = self.retry_at {
            if now < retry_at {
                return;
            }
            self.retry_at = None;
        }
        if !self.file_exists {
            if self.create.is_none() {
                self.emit_create(now);
            }
            return;
        }
        let due = self.sync_due.is_some_and(|due| due <= now);
        let unsynced = self.synced != Some(self.written);
        if due && !unsynced && self.stored == self.written && self.page_trusted {
            // Nothing left to make durable (the due store was covered meanwhile).
            self.sync_due = None;
        } else if due
            && unsynced
            && self.sync.is_none()
            && self.write.is_none()
            && self.page_trusted
        {
            self.emit_sync(now);
        }
        if self.write.is_none() && (self.stored != self.written || !self.page_trusted) {
            self.emit_write();
        }
    }

    fn next_id(&mut self) -> IoId {
        let id = IoId(self.next_io);
        self.next_io += 1;
        id
    }

    fn emit(&mut self, id: IoId, ops: Vec<IoOp>) {
        self.outputs.push_back(CheckpointOutput::Io(IoRequest {
            id,
            lane: self.config.lane,
            ops,
        }));
    }

    fn emit_create(&mut self, now: Instant) {
        let id = self.next_id();
        let value = self.stored;
        let ops = vec![
            IoOp::CreateDirAll {
                dir: self.config.dir.clone(),
            },
            IoOp::Create {
                path: self.tmp_path.clone(),
            },
            IoOp::WriteAt {
                path: self.tmp_path.clone(),
                offset: 0,
                data: value.0.to_be_bytes().to_vec(),
            },
            IoOp::SyncData {
                path: self.tmp_path.clone(),
            },
            IoOp::Rename {
                from: self.tmp_path.clone(),
                to: self.path.clone(),
            },
            IoOp::SyncDir {
                dir: self.config.dir.clone(),
            },
        ];
        self.emit(id, ops);
        self.create = Some(InFlight { id, value });
        // The creation writes and syncs everything stored so far.
        self.unwritten_since = None;
        self.sync_due = self.flush.map(|_| now);
    }

    fn emit_write(&mut self) {
        let id = self.next_id();
        let value = self.stored;
        let ops = vec![IoOp::WriteAt {
            path: self.path.clone(),
            offset: 0,
            data: value.0.to_be_bytes().to_vec(),
        }];
        self.emit(id, ops);
        self.write = Some(InFlight { id, value });
        self.unwritten_since = None;
    }

    fn emit_sync(&mut self, now: Instant) {
        let id = self.next_id();
        let mut ops = vec![IoOp::SyncData {
            path: self.path.clone(),
        }];
        if !self.dir_synced {
            // At startup the name may come from a rename whose directory sync a crash cut short.
            ops.push(IoOp::SyncDir {
                dir: self.config.dir.clone(),
            });
        }
        self.emit(id, ops);
        self.sync = Some(InFlight {
            id,
            value: self.written,
        });
        // Stores that arrived while the last write ran are not covered by this sync.
        self.sync_due = if self.stored == self.written {
            None
        } else if self.flush.is_some_and(|target| target > self.written) {
            Some(now)
        } else {
            let since = self.unwritten_since.unwrap_or(now);
            Some(since + self.config.sync_delay)
        };
    }

    /// When the next sync is due, if nothing outstanding stands in its way.
    fn sync_wake(&self) -> Option<Instant> {
        let blocked =
            !self.file_exists || self.sync.is_some() || self.write.is_some() || !self.page_trusted;
        if blocked {
            None
        } else {
            self.sync_due
        }
    }

    fn check_invariants(&self) {
        if !crate::DEEP_CHECKS {
            return;
        }
        if let Some(synced) = self.synced {
            assert!(synced <= self.written, "synced {synced} > written");
        }
        assert!(self.written <= self.stored, "written > stored");
        if let Some(write) = self.write {
            assert!(self.written <= write.value && write.value <= self.stored);
        }
        if let Some(sync) = self.sync {
            assert!(sync.value <= self.written);
        }
        if !self.file_exists {
            assert!(self.write.is_none() && self.sync.is_none());
        }
        if self.create.is_some() {
            assert!(!self.file_exists);
        }
        assert!(self.outputs.len() <= 8, "outputs left undrained");
    }
}

impl Actor for Checkpointer {
    type Input = CheckpointInput;
    type Output = CheckpointOutput;

    fn handle(&mut self, now: Instant, input: CheckpointInput) {
        match input {
            CheckpointInput::Store(value) => self.on_store(now, value),
            CheckpointInput::Flush => self.on_flush(now),
            CheckpointInput::Tick => {}
            CheckpointInput::Io(completion) => self.on_completion(now, completion),
        }
        self.pump(now);
        self.check_invariants();
    }

    fn poll_output(&mut self) -> Option<CheckpointOutput> {
        self.outputs.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        match self.retry_at {
            Some(retry_at) => Some(retry_at),
            None => self.sync_wake(),
        }
    }

    fn has_output(&self) -> bool {
        !self.outputs.is_empty()
    }
}

/// Lets [`crate::disk::driver::SyncDriver`] run the checkpointer (tests, the simulator).
impl IoActor for Checkpointer {
    fn into_io(output: CheckpointOutput) -> Result<IoRequest, CheckpointOutput> {
        match output {
            CheckpointOutput::Io(request) => Ok(request),
            other @ (CheckpointOutput::Synced(_)
            | CheckpointOutput::Failed(_)
            | CheckpointOutput::Flushed(_)) => Err(other),
        }
    }

    fn io_done(_request: IoRequest, completion: IoCompletion) -> CheckpointInput {
        CheckpointInput::Io(completion)
    }

    fn tick() -> Option<CheckpointInput> {
        Some(CheckpointInput::Tick)
    }
}
