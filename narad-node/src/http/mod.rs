//! HTTP `/v1`, wire-compatible with Narad's surface (`shared/spec/narad-v1-surface.md`), with the
//! produce-path spec winning where they differ (batch produce, keyless round-robin, format-2 records).
//!
//! Structure: every route is a plain async function of an [`App`] and already-read request parts
//! (path parameters, the raw query string, a size-bounded [`Body`]) returning a [`Reply`]. The axum
//! router ([`router`], compiled only outside madsim) only reads the request, bounds the body and turns
//! the `Reply` into a response; the simulator calls the same functions directly. So every validation
//! rule, status code and message lives in these functions and is unit-tested without a socket.
//!
//! The produce and consume machinery sits behind the [`seams`] traits: [`ProduceSink`] (the ingress
//! WAL host), [`PartitionReader`] and [`PartitionStats`] (the partition logs). The metastore is used
//! directly (its handle is cheap and testable over `SimDisk`).
//!
//! Auth ([`auth`]): Basic credentials checked against the users in the metastore, grants enforced in
//! the router before the route runs (the surface's order: grant, then query, body, topic); routes
//! that need the caller (create sets the owner, alter and delete need owner or admin, the users API)
//! take an [`auth::Caller`], which is [`auth::Caller::Open`] when auth is off (`--dev`, the
//! simulator).

pub mod auth;
#[cfg(not(madsim))]
pub mod background;
pub mod cluster;
pub mod consume;
pub mod openapi;
pub mod ops;
pub mod produce;
pub mod reply;
#[cfg(not(madsim))]
pub mod router;
pub mod schema;
pub mod seams;
#[cfg(not(madsim))]
pub mod serve;
pub mod topics;
pub mod users;

#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use narad_core::ids::PartitionId;
use narad_core::routing::{PartitionChoice, PartitionPicker, PickError};

use crate::clock::Clock;

use crate::metastore::Metastore;
use crate::metrics::Metrics;

pub use cluster::{MoveProgress, MoveSettings};
pub use reply::Reply;
pub use seams::{
    BoxFuture, Leased, PartitionReader, PartitionStat, PartitionStats, ProduceSink, QueueConsumer,
    QueueLimits, QueueOutcome, ReadOutcome, ReceiptHandle, ReplayError, Settle, SettleOutcome,
    StoredRecord, TopicKey,
};

/// Largest raw body of a single produce, and of every JSON request body: 1 MiB.
pub const BODY_BYTES_MAX: usize = 1024 * 1024;
/// Largest raw (and decoded) body of a batch produce: 16 MiB.
pub const BATCH_BODY_BYTES_MAX: usize = 16 * 1024 * 1024;

/// A request body, already read up to its route's limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// The whole body.
    Bytes(Vec<u8>),
    /// The body was longer than the route allows (answered 413 where the surface's check order
    /// reaches the body).
    TooLarge,
}

/// Everything the routes share.
pub struct App {
    /// The local metastore replica (topics).
    pub metastore: Metastore,
    /// Where accepted produces go.
    pub sink: Arc<dyn ProduceSink>,
    /// Replay reads.
    pub reader: Arc<dyn PartitionReader>,
    /// Partition figures for `GET /v1/topics/{t}`.
    pub stats: Arc<dyn PartitionStats>,
    /// Queue-mode consume and acks.
    pub queue: Arc<dyn QueueConsumer>,
    /// The node's metrics.
    pub metrics: Arc<Metrics>,
    /// What the move routes need (this node, whether it is clustered, the move budget).
    pub moves: cluster::MoveSettings,
    /// Bytes copied by the moves to this node (written by the node's move duties).
    pub move_progress: Arc<cluster::MoveProgress>,
    ready: AtomicBool,
    shutting_down: AtomicBool,
    /// Set by the node's disk guard while the data directory's file system has less free space than
    /// `storage.min_free_bytes`: produces answer 507. The guard holds it weakly.
    insufficient_storage: Arc<AtomicBool>,
    /// This node's `topic.min_retention_ms`.
    min_retention_ms: u64,
    schemas: schema::SchemaCache,
    /// The accept-time partition picker (keyless rotations need `&mut`).
    picker: Mutex<PartitionPicker>,
    /// `now` for the picker's idle-rotation forgetting.
    clock: Clock,
    /// Login state (off unless [`App::with_auth`]).
    pub auth: auth::Auth,
    /// Batch bodies being decompressed at once: half the cores, so a flood of (bomb) bodies leaves
    /// the other half to the async threads.
    decoding: tokio::sync::Semaphore,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("ready", &self.is_ready())
            .finish_non_exhaustive()
    }
}

impl App {
    /// An app that is not ready yet; `keyless_seed` seeds the keyless rotations' random starts.
    /// Partitions are picked by `narad_core::routing`'s accept-time picker (no liveness check).
    pub fn new(
        metastore: Metastore,
        sink: Arc<dyn ProduceSink>,
        reader: Arc<dyn PartitionReader>,
        stats: Arc<dyn PartitionStats>,
        queue: Arc<dyn QueueConsumer>,
        metrics: Arc<Metrics>,
        keyless_seed: u64,
    ) -> App {
        App {
            metastore,
            sink,
            reader,
            stats,
            queue,
            metrics,
            moves: cluster::MoveSettings::default(),
            move_progress: Arc::new(cluster::MoveProgress::default()),
            ready: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            insufficient_storage: Arc::new(AtomicBool::new(false)),
            min_retention_ms: narad_core::metastore::RETENTION_MS_MIN_DEFAULT,
            schemas: schema::SchemaCache::default(),
            picker: Mutex::new(PartitionPicker::new(keyless_seed)),
            clock: Clock::start(),
            auth: auth::Auth::new(false, Clock::start()),
            decoding: tokio::sync::Semaphore::new(
                (std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get) / 2)
                    .max(1),
            ),
        }
    }

    /// The app with Basic auth on (`enabled`) or off.
    pub fn with_auth(mut self, enabled: bool) -> App {
        self.auth = auth::Auth::new(enabled, self.clock.clone());
        self
    }

    /// The app with this node's `topic.min_retention_ms` (one hour unless set).
    pub fn with_min_retention_ms(mut self, min_retention_ms: u64) -> App {
        self.min_retention_ms = min_retention_ms;
        self
    }

    /// The app with this node's move settings.
    pub fn with_moves(mut self, moves: cluster::MoveSettings) -> App {
        self.moves = moves;
        self
    }

    /// The shortest `retention_ms` (0 aside) a create or PATCH through this node may ask for.
    pub fn min_retention_ms(&self) -> u64 {
        self.min_retention_ms
    }

    /// The accept-time partition of a record of `topic` (`partitions` of them).
    pub fn pick_partition(
        &self,
        topic: &str,
        partitions: u32,
        choice: PartitionChoice<'_>,
    ) -> Result<PartitionId, PickError> {
        let now = self.clock.now();
        self.picker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pick_for_accept(now, topic, partitions, choice)
    }

    /// The partition of a synchronous produce (the node RPC's `Produce` op): the accept-time choice
    /// of the same picker, then forward past partitions `is_dead` names (a pinned partition is kept).
    pub fn pick_sync_partition(
        &self,
        topic: &str,
        partitions: u32,
        choice: PartitionChoice<'_>,
        is_dead: impl Fn(PartitionId) -> bool,
    ) -> Result<PartitionId, PickError> {
        let now = self.clock.now();
        self.picker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pick_for_sync_produce(now, topic, partitions, choice, is_dead)
    }

    /// Marks recovery done (`/readyz` answers 200 from now on).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Whether recovery is done.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Marks a graceful shutdown in progress (`/healthz` answers 503 from now on).
    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    /// Whether a graceful shutdown is in progress.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Sets or clears the disk guard: while set, produces answer 507 before touching the WAL.
    pub fn set_insufficient_storage(&self, active: bool) {
        self.insufficient_storage.store(active, Ordering::Release);
    }

    /// Whether the disk guard is refusing produces.
    pub fn is_insufficient_storage(&self) -> bool {
        self.insufficient_storage.load(Ordering::Acquire)
    }

    /// The flag [`App::set_insufficient_storage`] sets, for the disk guard's task: held weakly, so the
    /// task ends with the app.
    pub fn insufficient_storage_flag(&self) -> std::sync::Weak<AtomicBool> {
        Arc::downgrade(&self.insufficient_storage)
    }
}

/// Runs slow CPU work (password hashing, body decompression) on [`background`]'s threads, off the
/// async threads and at a lower CPU priority than them; inline under the simulator.
pub async fn offload<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    #[cfg(not(madsim))]
    {
        background::run(work).await
    }
    #[cfg(madsim)]
    {
        work()
    }
}

/// A raw query string's parameters, `%` and `+` decoded (borrowed from the raw string when nothing
/// needed decoding: a produce parses one per request).
#[derive(Debug, Default)]
pub struct Query<'a> {
    pairs: Vec<(Cow<'a, str>, Cow<'a, str>)>,
}

impl<'a> Query<'a> {
    /// Parses a raw query string (`None` = no `?`).
    pub fn parse(raw: Option<&'a str>) -> Query<'a> {
        let pairs = raw
            .map(|raw| form_urlencoded::parse(raw.as_bytes()).collect())
            .unwrap_or_default();
        Query { pairs }
    }

    /// The first value of `name` (a repeated parameter: the first wins, as the ack route reads it).
    pub fn first(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_ref())
    }

    /// The one value of `name`; a repeated parameter is a 400.
    pub fn single(&self, name: &str) -> Result<Option<&str>, Reply> {
        let mut values = self.pairs.iter().filter(|(key, _)| key == name);
        let first = values.next().map(|(_, value)| value.as_ref());
        if values.next().is_some() {
            return Err(Reply::error(
                400,
                &format!("invalid argument: repeated query parameter {name:?}"),
            ));
        }
        Ok(first)
    }
}

/// Parses a partition or offset query value: a non-negative decimal integer.
pub fn parse_index(name: &str, value: &str) -> Result<u64, Reply> {
    value.parse::<u64>().map_err(|_| {
        Reply::error(
            400,
            &format!("invalid argument: {name} must be a non-negative integer"),
        )
    })
}
