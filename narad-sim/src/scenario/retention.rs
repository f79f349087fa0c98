//! A scenario's `[retention]`: every topic of the run is created with it, and the nodes check it
//! often enough that segments go within a run; and the disk guard's small disk.

use serde::{Deserialize, Serialize};

/// `[retention]`: 0 everywhere (the default) keeps the node's defaults (an hour or more: nothing
/// expires within a run).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionSpec {
    /// Every topic's `retention_ms` (the nodes' `topic.min_retention_ms` is lowered to allow it).
    #[serde(default)]
    pub retention_ms: u64,
    /// Every topic's `retention_bytes` (at least 1 MiB, as the node requires).
    #[serde(default)]
    pub retention_bytes: u64,
    /// The nodes' `storage.retention_check_interval_ms` (0: the node's default).
    #[serde(default)]
    pub check_interval_ms: u64,
    /// Each node's simulated disk holds at most this many bytes of files (0: unbounded): writes past
    /// it fail with ENOSPC, and the disk guard sees the space left.
    #[serde(default)]
    pub disk_capacity_bytes: u64,
    /// The nodes' `storage.min_free_bytes` (0: the node's default), for the disk guard.
    #[serde(default)]
    pub min_free_bytes: u64,
}

impl RetentionSpec {
    /// Whether the scenario sets any retention.
    pub fn is_default(&self) -> bool {
        *self == RetentionSpec::default()
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        if self.retention_ms != 0 && self.retention_ms < 1000 {
            return Err("retention.retention_ms must be 0 or at least 1000".into());
        }
        if self.retention_bytes != 0 && self.retention_bytes < 1024 * 1024 {
            return Err("retention.retention_bytes must be 0 or at least 1048576".into());
        }
        if self.check_interval_ms != 0 && self.check_interval_ms < 100 {
            return Err("retention.check_interval_ms must be 0 or at least 100".into());
        }
        if self.min_free_bytes >= self.disk_capacity_bytes && self.disk_capacity_bytes != 0 {
            return Err(
                "retention.min_free_bytes must be below retention.disk_capacity_bytes".into(),
            );
        }
        Ok(())
    }
}
