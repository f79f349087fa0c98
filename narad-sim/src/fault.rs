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
            | FaultEvent::BitRot { at_us, .. } => *at_us,
        }
    }

    /// The node it strikes: `None` is the single node, or a cluster's leader at that instant.
    pub fn node(&self) -> Option<u32> {
        match self {
            FaultEvent::Crash { node, .. }
            | FaultEvent::Pause { node, .. }
            | FaultEvent::Disk { node, .. }
            | FaultEvent::SlowDisk { node, .. }
            | FaultEvent::BitRot { node, .. } => *node,
        }
    }

    /// Aims the event at `node`.
    pub fn set_node(&mut self, to: Option<u32>) {
        match self {
            FaultEvent::Crash { node, .. }
            | FaultEvent::Pause { node, .. }
            | FaultEvent::Disk { node, .. }
            | FaultEvent::SlowDisk { node, .. }
            | FaultEvent::BitRot { node, .. } => *node = to,
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
            FaultEvent::BitRot { target, .. } => format!("bit-rot target={}", target.name()),
        }
    }
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
}

impl FaultKind {
    /// Every kind, in weight order.
    pub const ALL: [FaultKind; 8] = [
        FaultKind::Crash,
        FaultKind::Pause,
        FaultKind::WalFsyncEio,
        FaultKind::PartitionFsyncEio,
        FaultKind::WriteEio,
        FaultKind::Enospc,
        FaultKind::SlowDisk,
        FaultKind::BitRot,
    ];
}
