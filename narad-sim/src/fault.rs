//! The fault vocabulary: the timed events a schedule is made of, and the kinds the fault weights
//! choose between.
//!
//! A [`FaultEvent`] is data: scenario files carry them (`[[schedule]]` tables, written by `shrink`),
//! [`crate::schedule::generate`] draws them from a seed, a run applies them through the seam. Times are
//! microseconds of simulated time since the run started. This module depends on nothing else of the
//! harness, so the scenario format and the schedule generator both build on it.

use serde::{Deserialize, Serialize};

/// Which files a disk fault strikes, as the node's [`crate::seam::DiskLayout`] names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// The ingress WAL's files.
    Wal,
    /// The partition logs.
    Partitions,
    /// Every file on the disk.
    All,
}

impl Target {
    /// The name used in traces and files.
    pub fn name(self) -> &'static str {
        match self {
            Target::Wal => "wal",
            Target::Partitions => "partitions",
            Target::All => "all",
        }
    }
}

/// The error a disk episode injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskError {
    /// `sync_data` fails with EIO and drops the dirty pages (fsyncgate).
    FsyncEio,
    /// Writes fail with EIO.
    WriteEio,
    /// Writes and growth fail with ENOSPC.
    Enospc,
}

/// Every name [`FaultEvent::kind_name`] gives, and `none` (a record no fault overlapped): the keys
/// of a report's breakdown by fault kind.
pub const KIND_NAMES: &[&str] = &[
    "crash",
    "pause",
    "fsync-eio",
    "write-eio",
    "enospc",
    "slow-disk",
    "partition",
    "net",
    "bit-rot",
    "lag",
    "none",
];

/// One timed fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum FaultEvent {
    /// Kill the node and crash its disk in the same instant; restart it `down_ms` later.
    Crash {
        /// When, in microseconds of simulated time.
        at_us: u64,
        /// The node it strikes (an index into the cluster); none: the single node, or in a cluster
        /// the raft leader when it strikes (node 0 if no leader is known).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<u32>,
        /// How long the node stays down.
        down_ms: u64,
    },
    /// Stop scheduling the node's tasks for `duration_ms`.
    Pause {
        /// When.
        at_us: u64,
        /// The node it strikes (an index into the cluster); none: the single node, or in a cluster
        /// the raft leader when it strikes (node 0 if no leader is known).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<u32>,
        /// How long.
        duration_ms: u64,
    },
    /// For `duration_ms`, operations on `target` fail with `error` with chance `chance_ppm`.
    Disk {
        /// When.
        at_us: u64,
        /// The node it strikes (an index into the cluster); none: the single node, or in a cluster
        /// the raft leader when it strikes (node 0 if no leader is known).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<u32>,
        /// Which files.
        target: Target,
        /// Which error.
        error: DiskError,
        /// Chance per matching operation, parts per million.
        chance_ppm: u32,
        /// How long the episode lasts.
        duration_ms: u64,
    },
    /// For `duration_ms`, operations on `target` take `latency_us` on average.
    SlowDisk {
        /// When.
        at_us: u64,
        /// The node it strikes (an index into the cluster); none: the single node, or in a cluster
        /// the raft leader when it strikes (node 0 if no leader is known).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<u32>,
        /// Which files.
        target: Target,
        /// Mean latency per operation.
        latency_us: u64,
        /// How long the episode lasts.
        duration_ms: u64,
    },
    /// Cut the network between the node and `peer` (or every other node) for `duration_ms`:
    /// madsim's `NetSim` clogs the links, so peer traffic (QUIC: raft, heartbeats, commits,
    /// forwarded reads) is dropped while clients still reach the node.
    Partition {
        /// When.
        at_us: u64,
        /// The node on one side (an index into the cluster); none: the raft leader when it strikes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<u32>,
        /// The node on the other side; none: every other node.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        peer: Option<u32>,
        /// Only packets from `node` towards `peer` are lost (the other direction still flows).
        #[serde(default, skip_serializing_if = "is_false")]
        one_way: bool,
        /// How long the cut lasts.
        duration_ms: u64,
    },
    /// For `duration_ms`, every packet between nodes is lost with chance `loss_ppm` and delayed by a
    /// latency drawn from `latency_min_us..latency_max_us` (jitter reorders them). Strikes the whole
    /// network; overlapping episodes combine to the worst of each.
    Net {
        /// When.
        at_us: u64,
        /// Chance that a packet is lost, parts per million.
        loss_ppm: u32,
        /// Least one-way latency.
        latency_min_us: u64,
        /// Greatest one-way latency (exclusive; above `latency_min_us`).
        latency_max_us: u64,
        /// How long the episode lasts.
        duration_ms: u64,
    },
    /// Hold the node's metadata view for `duration_ms`: its replica goes on voting and appending,
    /// while the rest of the node (ownership, incarnation checks, placement, the produce path)
    /// keeps the state from before, as a replica lagging behind the log would. For the first
    /// `cut_ms` the node is also cut from every other node both ways, so what it took before a
    /// topic change reaches the owners only after the change, from a sender that still lags.
    Lag {
        /// When.
        at_us: u64,
        /// The node it strikes (an index into the cluster).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<u32>,
        /// How long the view is held.
        duration_ms: u64,
        /// How long the node is cut from its peers at the start (0: not cut; at most `duration_ms`).
        #[serde(default)]
        cut_ms: u64,
    },
    /// Flip one bit of synced data in a file under `target`.
    BitRot {
        /// When.
        at_us: u64,
        /// The node it strikes (an index into the cluster); none: the single node, or in a cluster
        /// the raft leader when it strikes (node 0 if no leader is known).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<u32>,
        /// Which files.
        target: Target,
    },
}

impl FaultEvent {
    /// When the event strikes.
    pub fn at_us(&self) -> u64 {
        match self {
            FaultEvent::Crash { at_us, .. }
            | FaultEvent::Pause { at_us, .. }
            | FaultEvent::Disk { at_us, .. }
            | FaultEvent::SlowDisk { at_us, .. }
            | FaultEvent::Partition { at_us, .. }
            | FaultEvent::Net { at_us, .. }
            | FaultEvent::Lag { at_us, .. }
            | FaultEvent::BitRot { at_us, .. } => *at_us,
        }
    }

    /// The node it strikes: `None` is the single node, or a cluster's leader at that instant (and
    /// for [`FaultEvent::Net`], which strikes no node, always `None`).
    pub fn node(&self) -> Option<u32> {
        match self {
            FaultEvent::Crash { node, .. }
            | FaultEvent::Pause { node, .. }
            | FaultEvent::Disk { node, .. }
            | FaultEvent::SlowDisk { node, .. }
            | FaultEvent::Partition { node, .. }
            | FaultEvent::Lag { node, .. }
            | FaultEvent::BitRot { node, .. } => *node,
            FaultEvent::Net { .. } => None,
        }
    }

    /// Aims the event at `node` (a [`FaultEvent::Net`] strikes the whole network and stays as it is).
    pub fn set_node(&mut self, to: Option<u32>) {
        match self {
            FaultEvent::Crash { node, .. }
            | FaultEvent::Pause { node, .. }
            | FaultEvent::Disk { node, .. }
            | FaultEvent::SlowDisk { node, .. }
            | FaultEvent::Partition { node, .. }
            | FaultEvent::Lag { node, .. }
            | FaultEvent::BitRot { node, .. } => *node = to,
            FaultEvent::Net { .. } => {}
        }
    }

    /// Whether it strikes the network as a whole rather than a node.
    pub fn is_global(&self) -> bool {
        matches!(self, FaultEvent::Net { .. })
    }

    /// The kind of fault it is, for the breakdowns of a run's report.
    pub fn kind_name(&self) -> &'static str {
        match self {
            FaultEvent::Crash { .. } => "crash",
            FaultEvent::Pause { .. } => "pause",
            FaultEvent::Disk { error, .. } => match error {
                DiskError::FsyncEio => "fsync-eio",
                DiskError::WriteEio => "write-eio",
                DiskError::Enospc => "enospc",
            },
            FaultEvent::SlowDisk { .. } => "slow-disk",
            FaultEvent::Partition { .. } => "partition",
            FaultEvent::Net { .. } => "net",
            FaultEvent::Lag { .. } => "lag",
            FaultEvent::BitRot { .. } => "bit-rot",
        }
    }

    /// A one-line description for traces.
    pub fn describe(&self) -> String {
        let what = self.describe_fault();
        match self.node() {
            Some(node) => format!("{what} node={node}"),
            None => what,
        }
    }

    fn describe_fault(&self) -> String {
        match self {
            FaultEvent::Crash { down_ms, .. } => format!("crash down_ms={down_ms}"),
            FaultEvent::Pause { duration_ms, .. } => format!("pause duration_ms={duration_ms}"),
            FaultEvent::Disk {
                target,
                error,
                chance_ppm,
                duration_ms,
                ..
            } => format!(
                "disk {error:?} target={} chance_ppm={chance_ppm} duration_ms={duration_ms}",
                target.name()
            ),
            FaultEvent::SlowDisk {
                target,
                latency_us,
                duration_ms,
                ..
            } => format!(
                "slow-disk target={} latency_us={latency_us} duration_ms={duration_ms}",
                target.name()
            ),
            FaultEvent::Partition {
                peer,
                one_way,
                duration_ms,
                ..
            } => {
                let peer = peer.map_or_else(|| "all".to_string(), |peer| peer.to_string());
                let way = if *one_way { "one-way" } else { "two-way" };
                format!("partition peer={peer} {way} duration_ms={duration_ms}")
            }
            FaultEvent::Net {
                loss_ppm,
                latency_min_us,
                latency_max_us,
                duration_ms,
                ..
            } => format!(
                "net loss_ppm={loss_ppm} latency_us={latency_min_us}..{latency_max_us} \
                 duration_ms={duration_ms}"
            ),
            FaultEvent::Lag {
                duration_ms,
                cut_ms,
                ..
            } => format!("lag duration_ms={duration_ms} cut_ms={cut_ms}"),
            FaultEvent::BitRot { target, .. } => format!("bit-rot target={}", target.name()),
        }
    }
}

fn is_false(value: &bool) -> bool {
    !value
}

/// The kinds the fault weights choose between, in [`crate::scenario::Knobs::fault_weights`] order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// [`FaultEvent::Crash`].
    Crash,
    /// [`FaultEvent::Pause`].
    Pause,
    /// [`FaultEvent::Disk`] with fsync EIO on the WAL.
    WalFsyncEio,
    /// [`FaultEvent::Disk`] with fsync EIO on partition logs.
    PartitionFsyncEio,
    /// [`FaultEvent::Disk`] with write EIO.
    WriteEio,
    /// [`FaultEvent::Disk`] with ENOSPC everywhere.
    Enospc,
    /// [`FaultEvent::SlowDisk`].
    SlowDisk,
    /// [`FaultEvent::BitRot`].
    BitRot,
    /// [`FaultEvent::Partition`].
    Partition,
    /// [`FaultEvent::Net`].
    Net,
    /// [`FaultEvent::Lag`].
    Lag,
}

/// How many fault kinds there are.
pub const FAULT_KINDS: usize = 11;

impl FaultKind {
    /// Every kind, in weight order (kinds added later go last, so older scenarios draw as before).
    pub const ALL: [FaultKind; FAULT_KINDS] = [
        FaultKind::Crash,
        FaultKind::Pause,
        FaultKind::WalFsyncEio,
        FaultKind::PartitionFsyncEio,
        FaultKind::WriteEio,
        FaultKind::Enospc,
        FaultKind::SlowDisk,
        FaultKind::BitRot,
        FaultKind::Partition,
        FaultKind::Net,
        FaultKind::Lag,
    ];
}
