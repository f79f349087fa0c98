//! Scenario files (`scenarios/*.toml`): what a run simulates, as data.
//!
//! A scenario names the topology, the topics, the workload, the disk's normal latency, the fault mix and
//! the time budget. Every knob that is a *range* (`x = [lo, hi]`, or a plain `x = n` for a fixed value)
//! is drawn per seed ([`Scenario::draw`]): swarm testing, so one sweep covers seeds that crash a lot and
//! never fail an fsync, seeds that only fail fsyncs, seeds that do nothing at all, and so on.
//!
//! Parsing is strict: an unknown key anywhere is an error, so a typo never silently means "default".
//! A scenario may carry an explicit fault schedule (`[[schedule]]`, written by `shrink`) which replaces
//! the generated one, and a `[regression]` table naming the seed (and planted bug) it was shrunk from.

mod moves;
mod retention;

pub use moves::MovesSpec;
pub use retention::RetentionSpec;
use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::fault::{FaultEvent, Target, FAULT_KINDS};
use crate::seam::PlantedBug;

/// Longest topic name accepted (the node's own limit may be lower; the harness only needs a bound).
pub const TOPIC_NAME_BYTES_MAX: usize = 128;
/// Most partitions a scenario topic may have.
pub const PARTITIONS_MAX: u32 = 1024;
/// Most topics a scenario may declare.
pub const TOPICS_MAX: usize = 64;
/// Most nodes of one simulated cluster (their addresses are 10.0.0.1 upwards).
pub const NODES_MAX: u32 = 9;
/// Largest payload a scenario may ask for (the /v1 single-produce limit is 1 MiB).
pub const PAYLOAD_BYTES_MAX: u64 = 1 << 20;
/// Most records in one batch produce (the /v1 batch limit).
pub const BATCH_RECORDS_MAX: u64 = 1000;
/// Longest simulated phase accepted, so a typo cannot ask for a run of years.
pub const PHASE_MS_MAX: u64 = 3_600_000;

/// An integer knob: a fixed value or an inclusive range `[lo, hi]` drawn per seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Span {
    /// Always this value.
    Fixed(u64),
    /// Drawn uniformly from `lo..=hi` per seed.
    Range([u64; 2]),
}

impl Span {
    /// The smallest value the knob can take.
    pub fn lo(self) -> u64 {
        match self {
            Span::Fixed(value) => value,
            Span::Range([lo, _]) => lo,
        }
    }

    /// The largest value the knob can take.
    pub fn hi(self) -> u64 {
        match self {
            Span::Fixed(value) => value,
            Span::Range([_, hi]) => hi,
        }
    }

    /// Draws a value (uniform in the range).
    pub fn draw(self, rng: &mut ChaCha8Rng) -> u64 {
        match self {
            Span::Fixed(value) => value,
            Span::Range([lo, hi]) => rng.random_range(lo..=hi),
        }
    }

    fn check(self, name: &str, min: u64, max: u64) -> Result<(), String> {
        if self.lo() > self.hi() {
            return Err(format!(
                "{name}: range [{}, {}] is reversed",
                self.lo(),
                self.hi()
            ));
        }
        if self.lo() < min || self.hi() > max {
            return Err(format!(
                "{name}: [{}, {}] is outside the accepted {min}..={max}",
                self.lo(),
                self.hi()
            ));
        }
        Ok(())
    }
}

/// A whole scenario file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// What the scenario exercises, for people.
    #[serde(default)]
    pub description: String,
    /// Nodes and their layout.
    pub topology: Topology,
    /// Topics created before the workload starts.
    pub topics: Vec<TopicSpec>,
    /// What the simulated clients do.
    pub workload: Workload,
    /// The disk's latency when it is healthy.
    pub disk: DiskSpec,
    /// The fault mix of the safety phase.
    pub faults: FaultMix,
    /// The time budget.
    pub phases: Phases,
    /// Node settings (file sizes), so rolls and compaction happen within a run.
    #[serde(default)]
    pub node: NodeSpec,
    /// Every topic's retention, and how often the nodes enforce it.
    #[serde(default, skip_serializing_if = "RetentionSpec::is_default")]
    pub retention: RetentionSpec,
    /// The operator's moves, rebalances and decommissions.
    #[serde(default, skip_serializing_if = "MovesSpec::is_default")]
    pub moves: MovesSpec,
    /// An explicit fault schedule; when present it replaces the generated one (used by `shrink`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Vec<FaultEvent>>,
    /// Present in regression files: the seed (and planted bug) the schedule was shrunk from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regression: Option<Regression>,
}

/// The cluster shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Number of nodes: 1 runs a single node; more run a cluster (at most [`NODES_MAX`]).
    pub nodes: u32,
    /// Nodes that act as an owner from before the incarnation section: they refuse a commit that
    /// carries one (400), as an older release refuses trailing data.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub legacy_nodes: Vec<u32>,
    /// When set, each seed runs one of these node counts (drawn from a stream of its own, so the
    /// other knobs draw as for a fixed count); `nodes` must be the largest of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_counts: Vec<u32>,
}

/// One topic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicSpec {
    /// Topic name.
    pub name: String,
    /// Partition count.
    pub partitions: u32,
    /// Deleted and recreated (a new incarnation) mid-flight, every `workload.churn_every_ms` on average.
    #[serde(default)]
    pub churn: bool,
}

/// The produce workload, all knobs drawn per seed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Produce calls per simulated second, over all producers.
    pub rate_per_s: Span,
    /// Concurrent producer tasks.
    pub producers: Span,
    /// Ratio weight of keyed produces (the node hashes the key to a partition).
    pub keyed: Span,
    /// Ratio weight of keyless produces (round-robin in the node).
    pub keyless: Span,
    /// Ratio weight of produces naming a partition explicitly.
    pub explicit: Span,
    /// Ratio weight of single-record produces.
    pub single: Span,
    /// Ratio weight of batch produces.
    pub batch: Span,
    /// Records per batch produce.
    pub batch_records: Span,
    /// Payload size in bytes (at least the harness's id header, which is added when smaller).
    pub payload_bytes: Span,
    /// Distinct keys per topic for keyed produces.
    pub keys: Span,
    /// Mean simulated time between two delete+recreate cycles of a churning topic.
    #[serde(default = "default_churn_every_ms")]
    pub churn_every_ms: Span,
    /// A client gives up on a call after this long (an ambiguous outcome).
    pub timeout_ms: u64,
    /// Stop producing once this many records were sent (the safety phase still runs its length).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records_max: Option<u64>,
    /// Queue-mode consumer tasks (drawn from a stream of their own, so a scenario without them
    /// draws every other knob as before). With any, every record the final read serves must have been
    /// delivered to one, and every delivery must be a produced record of its topic.
    #[serde(default = "no_consumers", skip_serializing_if = "is_no_consumers")]
    pub consumers: Span,
}

fn no_consumers() -> Span {
    Span::Fixed(0)
}

fn is_no_consumers(span: &Span) -> bool {
    *span == Span::Fixed(0)
}

fn default_churn_every_ms() -> Span {
    Span::Fixed(0)
}

/// Healthy-disk latency (each operation sleeps an exponentially distributed time with this mean).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskSpec {
    /// Mean latency of a write, read, create or other non-sync operation, in microseconds.
    pub op_us: Span,
    /// Mean latency of `sync_data` / `sync_dir`, in microseconds.
    pub sync_us: Span,
}

/// The fault mix: integer ratio weights per fault kind, event rate and parameters, all swarm ranges.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultMix {
    /// Fault events per simulated minute of the safety phase.
    pub per_minute: Span,
    /// No fault starts before this much of the safety phase has passed.
    #[serde(default)]
    pub warmup_ms: u64,
    /// Weight: process crash (power loss of the disk at the same instant), restart after `down_ms`.
    pub crash: Span,
    /// Weight: the node's tasks stop running for `pause_ms` (a GC pause, a stopped VM).
    pub pause: Span,
    /// Weight: fsync fails with EIO (fsyncgate) on the ingress WAL for an episode.
    pub wal_fsync_eio: Span,
    /// Weight: fsync fails with EIO on partition logs for an episode.
    pub partition_fsync_eio: Span,
    /// Weight: writes fail with EIO (WAL or partition logs) for an episode.
    pub write_eio: Span,
    /// Weight: the device is full (ENOSPC on every path) for an episode.
    pub enospc: Span,
    /// Weight: the disk becomes slow (WAL or partition logs) for an episode.
    pub slow_disk: Span,
    /// Weight: one bit of synced data flips in a file under `rot_target`.
    pub bit_rot: Span,
    /// Where bit rot strikes (`partitions` by default: WAL rot is a loud startup failure by design).
    #[serde(default = "default_rot_target")]
    pub rot_target: Target,
    /// Which files write-EIO and slow-disk episodes pick from (default: `["wal", "partitions"]`).
    #[serde(default = "default_disk_targets")]
    pub disk_targets: Vec<Target>,
    /// How long a crashed node stays down.
    pub down_ms: Span,
    /// How long a pause lasts.
    pub pause_ms: Span,
    /// How long an EIO / ENOSPC / slow episode lasts.
    pub episode_ms: Span,
    /// Chance that an operation matching an EIO / ENOSPC episode fails, in parts per million.
    pub chance_ppm: Span,
    /// Mean per-operation latency during a slow episode, in microseconds.
    pub slow_us: Span,
    /// Weight: the network between a node (or the leader) and one peer, or every other node, is
    /// cut for `partition_ms`; clients still reach both sides. A cluster's knob.
    #[serde(default = "span_zero")]
    pub partition: Span,
    /// Weight: packet loss and latency on the whole network for `net_ms`. A cluster's knob.
    #[serde(default = "span_zero")]
    pub net: Span,
    /// How long a partition lasts (around `MEMBER_DEAD_AFTER`, 5 s, members flap dead and alive).
    #[serde(default = "default_partition_ms")]
    pub partition_ms: Span,
    /// Percent of partitions that cut only one direction (the node's packets to the peer).
    #[serde(default = "default_one_way_percent")]
    pub one_way_percent: Span,
    /// Percent of partitions that cut the node from every other node rather than from one peer.
    #[serde(default = "default_all_peers_percent")]
    pub all_peers_percent: Span,
    /// How long a lossy or slow network episode lasts.
    #[serde(default = "default_net_ms")]
    pub net_ms: Span,
    /// Packet loss during a network episode, parts per million.
    #[serde(default = "span_zero")]
    pub loss_ppm: Span,
    /// One-way latency bounds during a network episode, in microseconds: two draws, the lower the
    /// least latency, the higher the greatest (their gap is the jitter).
    #[serde(default = "default_latency_us")]
    pub latency_us: Span,
    /// Weight: a node's metadata view is held for `lag_ms` (a replica lagging behind the log),
    /// the node cut from its peers for the first `lag_cut_ms` of it. A cluster's knob.
    #[serde(default = "span_zero")]
    pub lag: Span,
    /// How long a lag holds the view.
    #[serde(default = "default_lag_ms")]
    pub lag_ms: Span,
    /// How long a lagging node is cut from its peers at the start of the lag (at most the lag).
    #[serde(default = "span_zero")]
    pub lag_cut_ms: Span,
}

fn default_lag_ms() -> Span {
    Span::Fixed(4000)
}

fn default_partition_ms() -> Span {
    Span::Fixed(2000)
}

fn default_one_way_percent() -> Span {
    Span::Fixed(25)
}

fn default_all_peers_percent() -> Span {
    Span::Fixed(50)
}

fn default_net_ms() -> Span {
    Span::Fixed(2000)
}

fn default_latency_us() -> Span {
    // madsim's own default: 1 to 10 ms.
    Span::Range([1000, 10_000])
}

fn default_rot_target() -> Target {
    Target::Partitions
}

fn default_disk_targets() -> Vec<Target> {
    vec![Target::Wal, Target::Partitions]
}

/// Node settings the harness overrides, drawn per seed; `0` keeps the node's default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// The ingress WAL's segment size in bytes (its largest record is half of it).
    #[serde(default = "span_zero")]
    pub wal_segment_bytes: Span,
    /// A partition log's segment size in bytes.
    #[serde(default = "span_zero")]
    pub partition_segment_bytes: Span,
    /// The owner journal's segment size in bytes (small: trims, partition syncs and replays in every
    /// run).
    #[serde(default = "span_zero")]
    pub journal_segment_bytes: Span,
    /// `storage.ingress_wal_prealloc`: 1 prepares WAL segments (NWPREP01) and overwrites them in
    /// place; `[0, 1]` draws it per seed.
    #[serde(default = "span_zero")]
    pub wal_prealloc: Span,
}

impl Default for NodeSpec {
    fn default() -> Self {
        NodeSpec {
            wal_segment_bytes: span_zero(),
            partition_segment_bytes: span_zero(),
            journal_segment_bytes: span_zero(),
            wal_prealloc: span_zero(),
        }
    }
}

fn span_zero() -> Span {
    Span::Fixed(0)
}

/// Smallest WAL segment a scenario may ask for: it must hold the largest payload twice over.
pub const WAL_SEGMENT_BYTES_MIN: u64 = 8 * 1024;
/// Smallest partition segment a scenario may ask for.
pub const PARTITION_SEGMENT_BYTES_MIN: u64 = 1024;

/// The time budget of a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Phases {
    /// Safety phase: the workload runs and faults strike.
    pub safety_ms: u64,
    /// Liveness deadline, counted from the end of the safety phase (faults healed): by then every
    /// 202'd record must be visible.
    pub liveness_ms: u64,
    /// After the liveness check, crash and restart the node once more and read again, so that data
    /// visible but not durable shows up as lost.
    #[serde(default = "default_true")]
    pub final_crash: bool,
    /// How long the node gets after the final restart before the final read.
    #[serde(default = "default_final_settle_ms")]
    pub final_settle_ms: u64,
    /// A cluster's nodes that are down when the faults heal stay down through the liveness deadline
    /// (learners, and voters as long as a quorum of the metastore's voters is up; the others
    /// restart): every record sent through a live node
    /// after they went down must be visible by the deadline anyway, so a dead owner's records must
    /// have rerouted. They restart before the final crash.
    #[serde(default)]
    pub keep_down: bool,
}

fn default_true() -> bool {
    true
}

fn default_final_settle_ms() -> u64 {
    10_000
}

/// Marks a scenario file as a regression: the seed it was shrunk from, and the planted bug it needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Regression {
    /// The seed of the original failing run.
    pub seed: u64,
    /// The planted bug it was found with; the file must fail with it and pass without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plant_bug: Option<String>,
    /// The scenario it was shrunk from.
    #[serde(default)]
    pub shrunk_from: String,
}

impl Regression {
    /// The planted bug, parsed.
    pub fn planted(&self) -> Result<Option<PlantedBug>, String> {
        self.plant_bug
            .as_deref()
            .map(str::parse::<PlantedBug>)
            .transpose()
    }
}

/// The knobs one seed runs with: every [`Span`] of the scenario drawn once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Knobs {
    /// Produce calls per simulated second.
    pub rate_per_s: u64,
    /// Producer tasks.
    pub producers: u64,
    /// Weights keyed : keyless : explicit.
    pub mode_weights: [u64; 3],
    /// Weights single : batch.
    pub shape_weights: [u64; 2],
    /// Records per batch, range kept (each batch draws its size).
    pub batch_records: Span,
    /// Payload size range (each record draws its size).
    pub payload_bytes: Span,
    /// Distinct keys per topic.
    pub keys: u64,
    /// Mean interval between churn cycles; 0 = no churn.
    pub churn_every_ms: u64,
    /// Healthy mean latency of non-sync operations.
    pub op_us: u64,
    /// Healthy mean latency of syncs.
    pub sync_us: u64,
    /// Fault events per minute.
    pub faults_per_minute: u64,
    /// Weights in [`crate::fault::FaultKind::ALL`] order.
    pub fault_weights: [u64; FAULT_KINDS],
    /// The WAL's segment size; 0 = the node's default.
    pub wal_segment_bytes: u64,
    /// A partition log's segment size; 0 = the node's default.
    pub partition_segment_bytes: u64,
    /// The owner journal's segment size; 0 = the node's default.
    pub journal_segment_bytes: u64,
    /// The WAL prepares its segments (`storage.ingress_wal_prealloc`).
    pub wal_prealloc: bool,
}

impl Scenario {
    /// The scenario as seed `seed` runs it: with `topology.node_counts`, `topology.nodes` becomes the
    /// count this seed draws (from its own stream, so every other draw stays as it was).
    pub fn for_seed(&self, seed: u64) -> Scenario {
        let mut scenario = self.clone();
        let counts = &self.topology.node_counts;
        if !counts.is_empty() {
            let mut rng = ChaCha8Rng::seed_from_u64(crate::seam::derive_seed(seed, "topology"));
            scenario.topology.nodes = counts[rng.random_range(0..counts.len())];
        }
        scenario
    }

    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
        Scenario::parse(&text).map_err(|error| format!("{}: {error}", path.display()))
    }

    /// Parses and validates scenario text.
    pub fn parse(text: &str) -> Result<Scenario, String> {
        let scenario: Scenario = toml::from_str(text).map_err(|error| error.to_string())?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// Serializes the scenario back to TOML (used to write regression files).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a scenario always serializes")
    }

    /// Checks every limit and relation the harness relies on.
    pub fn validate(&self) -> Result<(), String> {
        self.validate_topology()?;
        self.validate_topics()?;
        self.validate_workload()?;
        self.disk.op_us.check("disk.op_us", 0, 10_000_000)?;
        self.disk.sync_us.check("disk.sync_us", 0, 10_000_000)?;
        self.validate_faults()?;
        self.validate_phases()?;
        self.validate_node()?;
        self.retention.validate()?;
        self.moves.validate()?;
        if self.faults.warmup_ms >= self.phases.safety_ms {
            return Err("faults.warmup_ms must be below phases.safety_ms".into());
        }
        self.validate_schedule()?;
        if let Some(regression) = &self.regression {
            regression
                .planted()
                .map_err(|e| format!("regression: {e}"))?;
        }
        Ok(())
    }

    /// The node count, the counts a seed may draw and the legacy nodes.
    fn validate_topology(&self) -> Result<(), String> {
        if self.topology.nodes == 0 || self.topology.nodes > NODES_MAX {
            return Err(format!(
                "topology.nodes = {}: between 1 and {NODES_MAX} are supported",
                self.topology.nodes
            ));
        }
        if let Some(&count) = self
            .topology
            .node_counts
            .iter()
            .find(|&&count| !(3..=self.topology.nodes).contains(&count))
        {
            return Err(format!(
                "topology.node_counts: {count} is not between 3 and topology.nodes ({})",
                self.topology.nodes
            ));
        }
        if !self.topology.node_counts.is_empty()
            && !self.topology.node_counts.contains(&self.topology.nodes)
        {
            return Err("topology.node_counts must include topology.nodes (the largest)".into());
        }
        if let Some(&node) = self
            .topology
            .legacy_nodes
            .iter()
            .find(|&&node| node >= self.topology.nodes)
        {
            return Err(format!(
                "topology.legacy_nodes: node {node} is not one of the nodes"
            ));
        }
        Ok(())
    }

    /// Topic names (valid and distinct) and partition counts.
    fn validate_topics(&self) -> Result<(), String> {
        if self.topics.is_empty() || self.topics.len() > TOPICS_MAX {
            return Err(format!("topics: between 1 and {TOPICS_MAX} are needed"));
        }
        for (index, topic) in self.topics.iter().enumerate() {
            let valid_name = !topic.name.is_empty()
                && topic.name.len() <= TOPIC_NAME_BYTES_MAX
                && topic
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
            if !valid_name {
                return Err(format!("topics[{index}]: invalid name {:?}", topic.name));
            }
            if topic.partitions == 0 || topic.partitions > PARTITIONS_MAX {
                return Err(format!(
                    "topics[{index}]: partitions must be 1..={PARTITIONS_MAX}"
                ));
            }
            if self.topics[..index].iter().any(|t| t.name == topic.name) {
                return Err(format!("topics[{index}]: duplicate name {:?}", topic.name));
            }
        }
        Ok(())
    }

    /// The workload's rates, mixes, sizes and timeout.
    fn validate_workload(&self) -> Result<(), String> {
        let w = &self.workload;
        w.rate_per_s.check("workload.rate_per_s", 1, 1_000_000)?;
        w.producers.check("workload.producers", 1, 1024)?;
        for (name, span) in [
            ("workload.keyed", w.keyed),
            ("workload.keyless", w.keyless),
            ("workload.explicit", w.explicit),
            ("workload.single", w.single),
            ("workload.batch", w.batch),
        ] {
            span.check(name, 0, 1000)?;
        }
        if w.keyed.hi() + w.keyless.hi() + w.explicit.hi() == 0 {
            return Err("workload: keyed, keyless and explicit cannot all be 0".into());
        }
        if w.single.hi() + w.batch.hi() == 0 {
            return Err("workload: single and batch cannot both be 0".into());
        }
        w.batch_records
            .check("workload.batch_records", 1, BATCH_RECORDS_MAX)?;
        w.payload_bytes
            .check("workload.payload_bytes", 0, PAYLOAD_BYTES_MAX)?;
        w.keys.check("workload.keys", 1, 1 << 20)?;
        w.churn_every_ms
            .check("workload.churn_every_ms", 0, PHASE_MS_MAX)?;
        if w.timeout_ms == 0 || w.timeout_ms > PHASE_MS_MAX {
            return Err("workload.timeout_ms must be 1..=3600000".into());
        }
        Ok(())
    }

    /// The fault mix and each kind's spans; network faults need a cluster.
    fn validate_faults(&self) -> Result<(), String> {
        let f = &self.faults;
        f.per_minute.check("faults.per_minute", 0, 60_000)?;
        for (name, span) in self.fault_weight_spans() {
            span.check(name, 0, 1000)?;
        }
        f.down_ms.check("faults.down_ms", 0, PHASE_MS_MAX)?;
        f.pause_ms.check("faults.pause_ms", 0, PHASE_MS_MAX)?;
        f.episode_ms.check("faults.episode_ms", 0, PHASE_MS_MAX)?;
        f.chance_ppm.check("faults.chance_ppm", 0, 1_000_000)?;
        f.slow_us.check("faults.slow_us", 0, 60_000_000)?;
        f.partition_ms
            .check("faults.partition_ms", 1, PHASE_MS_MAX)?;
        f.one_way_percent.check("faults.one_way_percent", 0, 100)?;
        f.all_peers_percent
            .check("faults.all_peers_percent", 0, 100)?;
        f.net_ms.check("faults.net_ms", 1, PHASE_MS_MAX)?;
        f.loss_ppm.check("faults.loss_ppm", 0, 1_000_000)?;
        f.latency_us.check("faults.latency_us", 1, 60_000_000)?;
        if self.topology.nodes == 1 && (f.partition.hi() > 0 || f.net.hi() > 0 || f.lag.hi() > 0) {
            return Err(
                "faults.partition, faults.net and faults.lag need topology.nodes > 1".into(),
            );
        }
        f.lag_ms.check("faults.lag_ms", 1, PHASE_MS_MAX)?;
        f.lag_cut_ms.check("faults.lag_cut_ms", 0, PHASE_MS_MAX)?;
        if f.lag_cut_ms.hi() > f.lag_ms.lo() {
            return Err("faults.lag_cut_ms must not exceed faults.lag_ms".into());
        }
        if f.disk_targets.is_empty() || f.disk_targets.len() > 3 {
            return Err("faults.disk_targets must name 1 to 3 targets".into());
        }
        Ok(())
    }

    /// The phases' lengths and the final crash.
    fn validate_phases(&self) -> Result<(), String> {
        let p = &self.phases;
        if p.safety_ms == 0 || p.safety_ms > PHASE_MS_MAX {
            return Err("phases.safety_ms must be 1..=3600000".into());
        }
        if p.liveness_ms == 0 || p.liveness_ms > PHASE_MS_MAX {
            return Err("phases.liveness_ms must be 1..=3600000".into());
        }
        if p.keep_down && (self.topology.nodes < 3 || !p.final_crash) {
            return Err("phases.keep_down needs topology.nodes >= 3 and phases.final_crash".into());
        }
        if p.final_settle_ms > PHASE_MS_MAX {
            return Err("phases.final_settle_ms must be at most 3600000".into());
        }
        Ok(())
    }

    /// The node's segment sizes: the default alone or at least the minimum, and room for payloads.
    fn validate_node(&self) -> Result<(), String> {
        let w = &self.workload;
        let n = &self.node;
        n.wal_prealloc.check("node.wal_prealloc", 0, 1)?;
        for (name, span, min) in [
            (
                "node.wal_segment_bytes",
                n.wal_segment_bytes,
                WAL_SEGMENT_BYTES_MIN,
            ),
            (
                "node.partition_segment_bytes",
                n.partition_segment_bytes,
                PARTITION_SEGMENT_BYTES_MIN,
            ),
            (
                "node.journal_segment_bytes",
                n.journal_segment_bytes,
                PARTITION_SEGMENT_BYTES_MIN,
            ),
        ] {
            span.check(name, 0, 1 << 40)?;
            if span.lo() == 0 && span.hi() != 0 {
                return Err(format!("{name}: 0 (the default) cannot be part of a range"));
            }
            if span.lo() != 0 && span.lo() < min {
                return Err(format!(
                    "{name}: at least {min} bytes (or 0 for the default)"
                ));
            }
        }
        if n.wal_segment_bytes.lo() != 0 && n.wal_segment_bytes.lo() < 4 * w.payload_bytes.hi() {
            return Err("node.wal_segment_bytes must hold 4 of the largest payloads".into());
        }
        Ok(())
    }

    /// An explicit schedule: its nodes exist, its network faults have a cluster, it fits the safety phase.
    fn validate_schedule(&self) -> Result<(), String> {
        let Some(schedule) = &self.schedule else {
            return Ok(());
        };
        let safety_ms = self.phases.safety_ms;
        for (index, event) in schedule.iter().enumerate() {
            if event.node().is_some_and(|node| node >= self.topology.nodes) {
                return Err(format!(
                    "schedule[{index}]: node {} is not one of the {} nodes",
                    event.node().unwrap_or(0),
                    self.topology.nodes
                ));
            }
            match event {
                FaultEvent::Partition { node, peer, .. } => {
                    if self.topology.nodes == 1 {
                        return Err(format!("schedule[{index}]: a partition needs a cluster"));
                    }
                    if let Some(peer) = *peer {
                        if peer >= self.topology.nodes || *node == Some(peer) {
                            return Err(format!(
                                "schedule[{index}]: peer {peer} is not another of the {} nodes",
                                self.topology.nodes
                            ));
                        }
                    }
                }
                FaultEvent::Lag {
                    duration_ms,
                    cut_ms,
                    ..
                } => {
                    if self.topology.nodes == 1 {
                        return Err(format!("schedule[{index}]: a lag needs a cluster"));
                    }
                    if *duration_ms == 0 || cut_ms > duration_ms {
                        return Err(format!(
                            "schedule[{index}]: a lag lasts at least 1 ms and its cut no longer"
                        ));
                    }
                }
                FaultEvent::Net {
                    loss_ppm,
                    latency_min_us,
                    latency_max_us,
                    ..
                } => {
                    if self.topology.nodes == 1 {
                        return Err(format!(
                            "schedule[{index}]: a network episode needs a cluster"
                        ));
                    }
                    if *loss_ppm > 1_000_000 || latency_min_us >= latency_max_us {
                        return Err(format!(
                            "schedule[{index}]: loss_ppm must be at most 1000000 and \
                             latency_min_us below latency_max_us"
                        ));
                    }
                }
                _ => {}
            }
            if event.at_us() >= safety_ms * 1000 {
                return Err(format!(
                    "schedule[{index}]: at_us {} is past the safety phase",
                    event.at_us()
                ));
            }
        }
        Ok(())
    }
    fn fault_weight_spans(&self) -> [(&'static str, Span); FAULT_KINDS] {
        let f = &self.faults;
        [
            ("faults.crash", f.crash),
            ("faults.pause", f.pause),
            ("faults.wal_fsync_eio", f.wal_fsync_eio),
            ("faults.partition_fsync_eio", f.partition_fsync_eio),
            ("faults.write_eio", f.write_eio),
            ("faults.enospc", f.enospc),
            ("faults.slow_disk", f.slow_disk),
            ("faults.bit_rot", f.bit_rot),
            ("faults.partition", f.partition),
            ("faults.net", f.net),
            ("faults.lag", f.lag),
        ]
    }

    /// Draws this seed's knobs (swarm testing). Ratio groups whose draws all came out 0 fall back to
    /// their upper bounds, so a seed always has something to do.
    pub fn draw(&self, rng: &mut ChaCha8Rng) -> Knobs {
        let w = &self.workload;
        let mut mode_weights = [w.keyed.draw(rng), w.keyless.draw(rng), w.explicit.draw(rng)];
        if mode_weights.iter().all(|&x| x == 0) {
            mode_weights = [w.keyed.hi(), w.keyless.hi(), w.explicit.hi()];
        }
        let mut shape_weights = [w.single.draw(rng), w.batch.draw(rng)];
        if shape_weights.iter().all(|&x| x == 0) {
            shape_weights = [w.single.hi(), w.batch.hi()];
        }
        let mut fault_weights = [0u64; FAULT_KINDS];
        for (slot, (_, span)) in fault_weights.iter_mut().zip(self.fault_weight_spans()) {
            *slot = span.draw(rng);
        }
        Knobs {
            rate_per_s: w.rate_per_s.draw(rng),
            producers: w.producers.draw(rng),
            mode_weights,
            shape_weights,
            batch_records: w.batch_records,
            payload_bytes: w.payload_bytes,
            keys: w.keys.draw(rng),
            churn_every_ms: w.churn_every_ms.draw(rng),
            op_us: self.disk.op_us.draw(rng),
            sync_us: self.disk.sync_us.draw(rng),
            faults_per_minute: self.faults.per_minute.draw(rng),
            fault_weights,
            // Drawn last, so the knobs above stay what they were for scenarios without `[node]`.
            wal_segment_bytes: self.node.wal_segment_bytes.draw(rng),
            partition_segment_bytes: self.node.partition_segment_bytes.draw(rng),
            journal_segment_bytes: self.node.journal_segment_bytes.draw(rng),
            wal_prealloc: self.node.wal_prealloc.draw(rng) == 1,
        }
    }

    /// Whether any topic churns.
    pub fn has_churn(&self) -> bool {
        self.topics.iter().any(|topic| topic.churn)
    }
}

/// Picks an index with probability proportional to its weight; `None` when every weight is 0.
pub fn pick_weighted(rng: &mut ChaCha8Rng, weights: &[u64]) -> Option<usize> {
    let total: u64 = weights.iter().sum();
    if total == 0 {
        return None;
    }
    let mut draw = rng.random_range(0..total);
    for (index, &weight) in weights.iter().enumerate() {
        if draw < weight {
            return Some(index);
        }
        draw -= weight;
    }
    unreachable!("draw < total")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const MINIMAL: &str = r#"
[topology]
nodes = 1

[[topics]]
name = "orders"
partitions = 4

[workload]
rate_per_s = [100, 200]
producers = 2
keyed = 1
keyless = 1
explicit = 0
single = 1
batch = [0, 1]
batch_records = [2, 10]
payload_bytes = [16, 64]
keys = 8
timeout_ms = 2000

[disk]
op_us = 10
sync_us = 100

[faults]
per_minute = [0, 60]
crash = [0, 1]
pause = 0
wal_fsync_eio = 1
partition_fsync_eio = 0
write_eio = 0
enospc = 0
slow_disk = 0
bit_rot = 0
down_ms = 10
pause_ms = 10
episode_ms = 10
chance_ppm = 1000000
slow_us = 1000

[phases]
safety_ms = 1000
liveness_ms = 5000
"#;

    #[test]
    fn a_minimal_scenario_parses_with_defaults() {
        let scenario = Scenario::parse(MINIMAL).unwrap();
        assert_eq!(scenario.topics[0].partitions, 4);
        assert_eq!(scenario.workload.rate_per_s, Span::Range([100, 200]));
        assert_eq!(scenario.workload.producers, Span::Fixed(2));
        assert!(scenario.phases.final_crash);
        assert_eq!(scenario.phases.final_settle_ms, 10_000);
        assert_eq!(scenario.faults.rot_target, Target::Partitions);
        assert_eq!(scenario.schedule, None);
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let text = MINIMAL.replace("keys = 8", "keys = 8\nkeyz = 9");
        let error = Scenario::parse(&text).unwrap_err();
        assert!(error.contains("unknown field `keyz`"), "{error}");
        let text = MINIMAL.replace("[phases]", "[phases]\nsafety_s = 3");
        assert!(Scenario::parse(&text).unwrap_err().contains("safety_s"));
        let text = format!("{MINIMAL}\n[extra]\na = 1\n");
        assert!(Scenario::parse(&text).unwrap_err().contains("extra"));
    }

    #[test]
    fn reversed_ranges_and_limits_are_rejected() {
        let text = MINIMAL.replace("rate_per_s = [100, 200]", "rate_per_s = [200, 100]");
        assert!(Scenario::parse(&text).unwrap_err().contains("reversed"));
        let text = MINIMAL.replace("partitions = 4", "partitions = 0");
        assert!(Scenario::parse(&text).unwrap_err().contains("partitions"));
        let text = MINIMAL.replace("nodes = 1", "nodes = 0");
        assert!(Scenario::parse(&text).unwrap_err().contains("nodes"));
        let text = MINIMAL.replace("nodes = 1", "nodes = 10");
        assert!(Scenario::parse(&text).unwrap_err().contains("nodes"));
        assert!(Scenario::parse(&MINIMAL.replace("nodes = 1", "nodes = 3")).is_ok());
        let text = MINIMAL.replace("chance_ppm = 1000000", "chance_ppm = 1000001");
        assert!(Scenario::parse(&text).unwrap_err().contains("chance_ppm"));
    }

    #[test]
    fn a_lag_needs_a_cluster_and_a_cut_within_it() {
        let lag = MINIMAL.replace("slow_us = 1000", "slow_us = 1000\nlag = 1\nlag_ms = 3000");
        assert!(Scenario::parse(&lag).unwrap_err().contains("faults.lag"));
        let clustered = lag.replace("nodes = 1", "nodes = 3");
        let scenario = Scenario::parse(&clustered).unwrap();
        assert_eq!(scenario.faults.lag_cut_ms, Span::Fixed(0));
        let cut = clustered.replace("lag_ms = 3000", "lag_ms = 3000\nlag_cut_ms = [1000, 4000]");
        assert!(Scenario::parse(&cut).unwrap_err().contains("lag_cut_ms"));
        let cut = clustered.replace("lag_ms = 3000", "lag_ms = 3000\nlag_cut_ms = [1000, 3000]");
        assert!(Scenario::parse(&cut).is_ok());
    }

    #[test]
    fn a_regression_with_an_unknown_bug_is_rejected() {
        let text = format!("{MINIMAL}\n[regression]\nseed = 3\nplant_bug = \"no-such-bug\"\n");
        assert!(Scenario::parse(&text).unwrap_err().contains("no-such-bug"));
    }

    #[test]
    fn draws_stay_in_range_and_replay_per_seed() {
        let scenario = Scenario::parse(MINIMAL).unwrap();
        for seed in 0..50 {
            let a = scenario.draw(&mut ChaCha8Rng::seed_from_u64(seed));
            let b = scenario.draw(&mut ChaCha8Rng::seed_from_u64(seed));
            assert_eq!(a, b);
            assert!((100..=200).contains(&a.rate_per_s));
            assert_eq!(a.producers, 2);
            assert!(a.faults_per_minute <= 60);
            assert_eq!(a.fault_weights[2], 1, "wal_fsync_eio is fixed at 1");
        }
    }

    #[test]
    fn pick_weighted_never_picks_a_zero_weight() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..1000 {
            let index = pick_weighted(&mut rng, &[0, 3, 0, 1]).unwrap();
            assert!(index == 1 || index == 3);
        }
        assert_eq!(pick_weighted(&mut rng, &[0, 0]), None);
    }

    #[test]
    fn a_scenario_round_trips_through_toml() {
        let scenario = Scenario::parse(MINIMAL).unwrap();
        assert_eq!(Scenario::parse(&scenario.to_toml()).unwrap(), scenario);
    }
}
