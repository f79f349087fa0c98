//! The seam between the harness and a node under simulation.
//!
//! A node plugs into the harness by implementing [`SimNode`]. The harness owns everything a node must
//! not decide: the disk ([`SimDisk`], kept across restarts so a crash can tear it), the I/O latency model
//! ([`SimIo`]), the trace and invariant sink ([`Observer`]), and which bug to plant ([`PlantedBug`]).
//!
//! # Lifecycle
//! The harness creates one madsim node per cluster member. Its `init` calls [`SimNode::start`] on every
//! boot (first start and each restart) inside that madsim node, so every task the node spawns belongs to
//! it: `Handle::kill` drops them all, in the same simulated instant as [`SimDisk::crash`]. `start` runs
//! recovery and returns a handle once the node accepts calls. The harness then calls the handle's methods
//! *as tasks spawned on the node's madsim node* (the way an HTTP handler runs in the node's process), so a
//! call in flight when the node is killed ends with a reset, and a call to a paused node hangs until the
//! client's timeout. A call future may be dropped at any await point (client timeout): a node must
//! carry on with whatever it staged, as it would after an HTTP client disconnect.
//!
//! # Rules for an implementation
//! * All file I/O goes through `ctx.disk` (a [`narad_core::disk::Disk`]); before each operation (or
//!   request) sleep [`SimIo::op_delay`] in simulated time, or run requests with [`SimIo::execute`].
//! * Every RNG is seeded from `ctx.seed` and `ctx.boot` (one stream per component); never ambient
//!   randomness or wall-clock time.
//! * Report notable events through `ctx.observer.event` (they enter the trace hash) and broken in-node
//!   invariants through `ctx.observer.violation` (the run fails).
//! * Honour `ctx.plant_bug` for the bugs [`SimNode::supports`] claims, and nothing else.
//!
//! # Plugging in the real node
//! narad-sim depends on narad-node (never the reverse), so the real node plugs in through an adapter
//! module here (`node_narad.rs`: a `NaradSimNode` wrapping narad-node's handle, `impl SimNode`), the
//! node `main.rs` runs. What narad-node has to expose, under `cfg(madsim)`:
//! * a start function taking `Arc<dyn Disk>` (the [`SimDisk`]), a per-op delay hook
//!   (`Arc<dyn Fn(&IoOp) -> Duration + Send + Sync>`, fed by [`SimIo::op_delay`]; its I/O executor
//!   sleeps that long with `tokio::time::sleep` before each op instead of `spawn_blocking`), the seed
//!   and boot number, the planted bug (its own enum or the name string: [`PlantedBug::name`]), and
//!   two callbacks for trace events and invariant violations (bridged to [`Observer`]); it runs recovery,
//!   spawns the actors' tasks with `tokio::spawn` and returns a handle;
//! * on that handle, the functions the HTTP handlers call (the listener is compiled out): produce,
//!   batch produce, topic create / delete / describe, consume read, and the readiness flag and backlog
//!   gauge ([`NodeStatus`]);
//! * its disk layout ([`DiskLayout`]: the WAL's and the partition logs' path prefixes, and where a
//!   partition log's checksummed units lie).

use std::fmt;
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use narad_core::disk::sim::SimDisk;
use narad_core::disk::{execute_op, Disk, IoCompletion, IoOp, IoRequest};
use narad_core::{NodeId, Offset, PartitionId, TopicId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::trace::{Trace, TraceField};

pub use narad_core::planted::PlantedBug;

/// One record of a produce call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceRecord {
    /// The key (`?key=`), or `None` for a keyless produce.
    pub key: Option<Vec<u8>>,
    /// The payload (the harness encodes a unique record id in it).
    pub payload: Vec<u8>,
}

/// Why a call did not succeed, in HTTP terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeError {
    /// A 4xx: refused before anything was stored (validation, unknown topic, partition out of range,
    /// topic already exists). The ledger holds the node to it: a refused record must never be served.
    Refused(String),
    /// A 5xx (WAL latched, not ready, internal failure): the call may or may not have taken effect.
    Failed(String),
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeError::Refused(reason) => write!(f, "4xx {reason}"),
            NodeError::Failed(reason) => write!(f, "5xx {reason}"),
        }
    }
}

/// A topic as the node's metastore describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopicInfo {
    /// The incarnation id.
    pub id: TopicId,
    /// Partition count.
    pub partitions: u32,
}

/// One record served by a partition read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadRecord {
    /// Its offset.
    pub offset: Offset,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Its commit time (Unix ms on the node's clock), when the node reports it.
    pub committed_at_ms: Option<u64>,
}

/// The answer to a partition read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadBatch {
    /// The incarnation served (the topic's current one).
    pub topic_id: TopicId,
    /// Records from the requested offset, in offset order, at most the requested count.
    pub records: Vec<ReadRecord>,
    /// The high watermark: the offset after the last visible record.
    pub high_watermark: Offset,
}

/// A record leased by a queue-mode consume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leased {
    /// Its partition.
    pub partition: PartitionId,
    /// Its offset there.
    pub offset: Offset,
    /// Its payload.
    pub payload: Vec<u8>,
    /// The lease's receipt handle.
    pub handle: String,
}

/// What a queue-mode ack answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckAnswer {
    /// 204: done.
    Done,
    /// 410: no lease holds the handle (expired, redelivered, or lost with a crash).
    Stale,
}

/// What `/readyz` and the backlog gauge say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    /// Whether the node serves produces.
    pub ready: bool,
    /// Records accepted but not yet visible (narad_ingress_dispatch_backlog_records).
    pub backlog_records: u64,
    /// A disk failure latched a component that only a restart revives (the alert an operator acts
    /// on, e.g. `narad_ingress_wal_failed`): the harness's operator restarts the process.
    pub latched: bool,
    /// This node is the metastore's leader (always, for a single node).
    pub leader: bool,
}

/// The byte range `[start, end)` of the checksummed unit of a file image that holds a byte.
pub type RotUnit = fn(&[u8], u64) -> Option<(u64, u64)>;

/// Where the node keeps what, so the harness can aim disk faults (path prefixes on [`SimDisk`]) and
/// excuse what bit rot destroys.
#[derive(Clone, Debug)]
pub struct DiskLayout {
    /// Prefix of the ingress WAL's files.
    pub wal_prefix: String,
    /// Prefix of the partition logs.
    pub partition_prefix: String,
    /// Prefix of the owner journal's files, if the node has one: the partition logs' disk errors and
    /// slow episodes strike it too (its fsync is the owner's commit fsync).
    pub journal_prefix: Option<String>,
    /// The byte range of the checksummed unit that holds a byte of a partition log file's image
    /// (`None` where the function cannot tell). The node promises that a flipped bit there costs only
    /// the records of that unit: the log stays open and every other record readable, after a restart
    /// too. The harness excuses those records; where the function answers `None`, or rot strikes
    /// outside the partition logs, every record of the struck file's directory.
    pub rot_unit: RotUnit,
}

/// What the harness hands a node at every boot.
#[derive(Clone)]
pub struct NodeContext {
    /// This node's id.
    pub node_id: NodeId,
    /// The simulation's seed for this node: derive one RNG stream per component from it and `boot`.
    pub seed: u64,
    /// 0 at the first start, incremented at every restart.
    pub boot: u32,
    /// The node's disk; the same one across restarts (a crash tore it just before).
    pub disk: SimDisk,
    /// The latency model to sleep before disk operations.
    pub io: SimIo,
    /// The bug to plant, if any (only ever one the node [`SimNode::supports`]).
    pub plant_bug: Option<PlantedBug>,
    /// Trace events and invariant violations go here.
    pub observer: Observer,
    /// File sizes the scenario asks for (0 = the node's default).
    pub sizes: NodeSizes,
    /// Every member's cluster address, in node order (`node_id` indexes it); one entry for a single
    /// node.
    pub members: Vec<std::net::SocketAddr>,
    /// Act as an owner from before the incarnation section (it refuses one as trailing data).
    pub legacy_owner: bool,
    /// While set, the node's metadata view is held where it was (the lag fault): its replica goes
    /// on voting and appending, the rest of the node acts on the old state. Shared across restarts.
    pub view_hold: Arc<AtomicBool>,
}

/// File sizes a scenario overrides, so segment rolls and compaction happen within a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeSizes {
    /// The ingress WAL's segment size in bytes; 0 = the node's default.
    pub wal_segment_bytes: u64,
    /// A partition log's segment size in bytes; 0 = the node's default.
    pub partition_segment_bytes: u64,
    /// The owner journal's segment size in bytes; 0 = the node's default.
    pub journal_segment_bytes: u64,
    /// `storage.ingress_wal_prealloc`: the WAL prepares its next segments and overwrites them.
    pub wal_prealloc: bool,
    /// Every topic's retention and the nodes' check interval (`[retention]`).
    pub retention: crate::scenario::RetentionSpec,
}

/// A node the harness can run: the real node through an adapter, or (in the harness's own tests) the
/// model node.
///
/// Methods other than `start` are called on a handle returned by `start`, as tasks spawned on the node's
/// madsim node (see the module documentation). Their futures must be `Send + 'static` once the handle
/// and arguments are moved in, because the harness spawns them.
pub trait SimNode: Clone + Send + Sync + 'static {
    /// A short name for reports (`model`, `narad`).
    fn name() -> &'static str;

    /// The node's on-disk layout, for aiming disk faults.
    fn layout() -> DiskLayout;

    /// Whether this node implements `bug` (the CLI refuses the others).
    fn supports(bug: PlantedBug) -> bool;

    /// Boots the node on `ctx.disk`: recovery, then serving. Runs inside the node's madsim node; every
    /// task it spawns dies with the node. An error is a failed boot (the harness retries later).
    fn start(ctx: NodeContext) -> impl Future<Output = Result<Self, String>> + Send;

    /// Creates a topic; `Refused` if it exists.
    fn create_topic(
        &self,
        name: &str,
        partitions: u32,
    ) -> impl Future<Output = Result<TopicInfo, NodeError>> + Send;

    /// Deletes a topic (its current incarnation); `Refused` if it does not exist.
    fn delete_topic(&self, name: &str) -> impl Future<Output = Result<(), NodeError>> + Send;

    /// The topic's current incarnation, or `None`.
    fn describe_topic(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<TopicInfo>, NodeError>> + Send;

    /// `POST /v1/topics/{topic}/produce[?key=][&partition=]`: `Ok` is the 202.
    fn produce(
        &self,
        topic: &str,
        partition: Option<PartitionId>,
        record: ProduceRecord,
    ) -> impl Future<Output = Result<(), NodeError>> + Send;

    /// `POST /v1/topics/{topic}/produce/batch`: all or nothing; `Ok` is the 202 for every record.
    fn produce_batch(
        &self,
        topic: &str,
        partition: Option<PartitionId>,
        records: Vec<ProduceRecord>,
    ) -> impl Future<Output = Result<(), NodeError>> + Send;

    /// `GET /v1/topics/{topic}/consume?partition=&offset=`: visible records from `from`.
    fn read(
        &self,
        topic: &str,
        partition: PartitionId,
        from: Offset,
        records_max: usize,
    ) -> impl Future<Output = Result<ReadBatch, NodeError>> + Send;

    /// Readiness and the dispatch backlog.
    fn status(&self) -> impl Future<Output = NodeStatus> + Send;

    /// Whether the node serves queue-mode consume ([`SimNode::queue_consume`]).
    fn queue_mode() -> bool {
        false
    }

    /// `GET /v1/topics/{topic}/consume?wait=`: a leased record, or `None` when none came in `wait`.
    fn queue_consume(
        &self,
        _topic: &str,
        _wait: Duration,
    ) -> impl Future<Output = Result<Option<Leased>, NodeError>> + Send {
        std::future::ready(Err(NodeError::Refused("queue mode is not served".into())))
    }

    /// `POST /v1/topics/{topic}/ack?receipt_handle=[&extend=0]`: acks the lease, or nacks it.
    fn queue_ack(
        &self,
        _topic: &str,
        _handle: &str,
        _nack: bool,
    ) -> impl Future<Output = Result<AckAnswer, NodeError>> + Send {
        std::future::ready(Err(NodeError::Refused("queue mode is not served".into())))
    }

    /// The node (an index into [`NodeContext::members`]) that owns `partition` of `topic`, as this
    /// node's metadata says; `None` when unknown. Reads go to the owner. A single node owns all.
    fn owner(&self, _topic: &str, _partition: PartitionId) -> Option<usize> {
        Some(0)
    }

    /// Most nodes this implementation can run as one cluster.
    fn nodes_max() -> u32 {
        1
    }

    /// An operator's change of the cluster's shape (`/v1/cluster/...`): `Ok` is its 2xx.
    fn cluster_op(&self, _op: ClusterOp) -> impl Future<Output = Result<(), NodeError>> + Send {
        std::future::ready(Err(NodeError::Refused(
            "cluster operations are not served".into(),
        )))
    }
}

/// An operator's change of the cluster's shape; members are named by index (0-based).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterOp {
    /// `POST /v1/cluster/moves`.
    Move {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: PartitionId,
        /// The destination member.
        to: usize,
    },
    /// `DELETE /v1/cluster/moves/{topic}/{partition}`.
    Abort {
        /// Topic name.
        topic: String,
        /// Partition.
        partition: PartitionId,
    },
    /// `POST /v1/cluster/rebalance`.
    Rebalance,
    /// `POST /v1/cluster/members/{id}/decommission`.
    Decommission {
        /// The member.
        member: usize,
    },
    /// `DELETE /v1/cluster/members/{id}/decommission`.
    CancelDecommission {
        /// The member.
        member: usize,
    },
}

/// Derives an independent seed for a named component from the run's seed (SplitMix64 finalizer over
/// the seed and an FNV-1a hash of the label).
pub fn derive_seed(seed: u64, label: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in label.as_bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut z = seed ^ hash;
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Violations a run keeps (and traces); later ones are dropped.
pub const VIOLATIONS_KEPT_MAX: usize = 100;

struct ProbeState {
    trace: Trace,
    violations: Vec<String>,
    clock: fn() -> u64,
}

/// The trace and invariant sink shared by the harness and the node. Cloning shares it.
#[derive(Clone)]
pub struct Observer {
    state: Arc<Mutex<ProbeState>>,
}

impl Observer {
    /// A observer whose events are stamped by `clock` (simulated nanoseconds since the run started).
    pub fn new(keep_lines: bool, clock: fn() -> u64) -> Self {
        Observer {
            state: Arc::new(Mutex::new(ProbeState {
                trace: Trace::new(keep_lines),
                violations: Vec::new(),
                clock,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ProbeState> {
        // A panic while holding the lock already failed the run; keep the state readable.
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Simulated nanoseconds since the run started.
    pub fn now_ns(&self) -> u64 {
        (self.lock().clock)()
    }

    /// Records an event in the trace.
    pub fn event(&self, source: &str, args: fmt::Arguments<'_>) {
        let mut state = self.lock();
        let now = (state.clock)();
        state.trace.record(now, source, args);
    }

    /// Records a frequent event by its fields (see [`Trace::record_fields`]).
    pub fn event_fields(&self, source: &str, fields: &[TraceField<'_>], text: fmt::Arguments<'_>) {
        let mut state = self.lock();
        let now = (state.clock)();
        state.trace.record_fields(now, source, fields, text);
    }

    /// Reports a broken invariant: the run fails. Also traced.
    pub fn violation(&self, invariant: &str, args: fmt::Arguments<'_>) {
        let mut state = self.lock();
        // The first ones tell the story; a broken invariant repeats on every step after.
        if state.violations.len() >= VIOLATIONS_KEPT_MAX {
            return;
        }
        let now = (state.clock)();
        state
            .trace
            .record(now, "VIOLATION", format_args!("{invariant}: {args}"));
        state.violations.push(format!("{invariant}: {args}"));
    }

    /// Violations reported so far.
    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    /// The trace hash so far.
    pub fn trace_hash(&self) -> u64 {
        self.lock().trace.hash()
    }

    /// Events traced so far.
    pub fn trace_events(&self) -> u64 {
        self.lock().trace.events()
    }

    /// The readable trace, when kept.
    pub fn trace_lines(&self) -> Option<Vec<String>> {
        self.lock().trace.lines().map(<[String]>::to_vec)
    }
}

/// A slow-disk episode in force.
#[derive(Clone, Debug)]
struct SlowEpisode {
    id: u64,
    path_prefix: String,
    latency_us: u64,
}

struct IoState {
    rng: ChaCha8Rng,
    op_us: u64,
    sync_us: u64,
    slow: Vec<SlowEpisode>,
    next_episode: u64,
}

/// The disk latency model: healthy means per operation class, plus slow episodes the harness injects.
/// Each operation's latency is drawn from an exponential distribution with the mean in force for its
/// path. Cloning shares it.
#[derive(Clone)]
pub struct SimIo {
    state: Arc<Mutex<IoState>>,
}

/// The path an operation touches (for slow-episode matching).
fn op_path(op: &IoOp) -> &str {
    match op {
        IoOp::Create { path }
        | IoOp::WriteAt { path, .. }
        | IoOp::WriteZeros { path, .. }
        | IoOp::ReadAt { path, .. }
        | IoOp::ReadCrc { path, .. }
        | IoOp::Len { path }
        | IoOp::SetLen { path, .. }
        | IoOp::SyncData { path }
        | IoOp::Remove { path } => path,
        IoOp::CreateDirAll { dir } | IoOp::SyncDir { dir } | IoOp::List { dir } => dir,
        IoOp::Rename { to, .. } => to,
    }
}

impl SimIo {
    /// A latency model with healthy means `op_us` (non-sync operations) and `sync_us` (syncs).
    pub fn new(seed: u64, op_us: u64, sync_us: u64) -> Self {
        SimIo {
            state: Arc::new(Mutex::new(IoState {
                rng: ChaCha8Rng::seed_from_u64(seed),
                op_us,
                sync_us,
                slow: Vec::new(),
                next_episode: 0,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, IoState> {
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// The latency of one operation on `path` (`sync` for `sync_data` / `sync_dir`).
    pub fn delay(&self, path: &str, sync: bool) -> Duration {
        let mut state = self.lock();
        let healthy = if sync { state.sync_us } else { state.op_us };
        let slow = state
            .slow
            .iter()
            .filter(|episode| path.starts_with(episode.path_prefix.as_str()))
            .map(|episode| episode.latency_us)
            .max()
            .unwrap_or(0);
        let mean_us = healthy.max(slow);
        if mean_us == 0 {
            return Duration::ZERO;
        }
        let unit: f64 = state.rng.random_range(f64::EPSILON..1.0);
        Duration::from_nanos((-unit.ln() * mean_us as f64 * 1000.0) as u64)
    }

    /// The latency of one [`IoOp`].
    pub fn op_delay(&self, op: &IoOp) -> Duration {
        self.delay(op_path(op), op.is_sync())
    }

    /// Sleeps (simulated time) for the latency of an operation on `path`.
    pub async fn wait(&self, path: &str, sync: bool) {
        let delay = self.delay(path, sync);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }

    /// Runs a request the way a node's I/O worker should under simulation: each op after its latency,
    /// in order, stopping at the first failure. A kill between ops leaves the rest unrun.
    pub async fn execute(&self, disk: &dyn Disk, request: &IoRequest) -> IoCompletion {
        let mut replies = Vec::with_capacity(request.ops.len());
        for (index, op) in request.ops.iter().enumerate() {
            let delay = self.op_delay(op);
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
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

    /// Starts a slow episode on paths under `path_prefix`; returns its id for [`SimIo::slow_end`].
    pub fn slow_begin(&self, path_prefix: &str, latency_us: u64) -> u64 {
        let mut state = self.lock();
        let id = state.next_episode;
        state.next_episode += 1;
        state.slow.push(SlowEpisode {
            id,
            path_prefix: path_prefix.to_string(),
            latency_us,
        });
        id
    }

    /// Ends a slow episode (no-op if already ended).
    pub fn slow_end(&self, id: u64) {
        self.lock().slow.retain(|episode| episode.id != id);
    }

    /// Ends every slow episode (the liveness phase).
    pub fn heal(&self) {
        self.lock().slow.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_episodes_raise_latency_only_on_their_prefix_until_they_end() {
        let io = SimIo::new(1, 0, 0);
        assert_eq!(io.delay("wal/0", false), Duration::ZERO);
        let episode = io.slow_begin("wal/", 1_000_000);
        let mean = |path: &str| {
            let total: Duration = (0..200).map(|_| io.delay(path, true)).sum();
            total / 200
        };
        let slow = mean("wal/0");
        assert!(
            slow > Duration::from_millis(500) && slow < Duration::from_millis(2000),
            "{slow:?}"
        );
        assert_eq!(io.delay("log/0", true), Duration::ZERO);
        io.slow_end(episode);
        assert_eq!(io.delay("wal/0", true), Duration::ZERO);
    }

    #[test]
    fn derived_seeds_differ_per_label_and_replay() {
        assert_eq!(derive_seed(7, "disk"), derive_seed(7, "disk"));
        assert_ne!(derive_seed(7, "disk"), derive_seed(7, "io"));
        assert_ne!(derive_seed(7, "disk"), derive_seed(8, "disk"));
    }
}
