//! [`MeteredDisk`]: a [`Disk`] that times the ingress WAL's segment fsyncs for
//! `narad_ingress_wal_fsync_duration_seconds`, counts the owner's (journal and partition logs) for
//! `narad_owner_fsyncs_total`, and forwards everything else untouched.

use std::sync::Arc;

use narad_core::disk::{Disk, DiskLayer};
use narad_core::IoFault;

use crate::clock::Clock;
use crate::metrics::Metrics;

/// Times `sync_data` of files under `wal_dir` whose name ends in `.wal`.
pub struct MeteredDisk {
    inner: Arc<dyn Disk>,
    wal_prefix: String,
    clock: Clock,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for MeteredDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeteredDisk")
            .field("wal_prefix", &self.wal_prefix)
            .finish_non_exhaustive()
    }
}

impl MeteredDisk {
    /// Wraps `inner`; WAL segments are the `.wal` files under `wal_dir`.
    pub fn new(inner: Arc<dyn Disk>, wal_dir: &str, clock: Clock, metrics: Arc<Metrics>) -> Self {
        MeteredDisk {
            inner,
            wal_prefix: format!("{wal_dir}/"),
            clock,
            metrics,
        }
    }
}

impl DiskLayer for MeteredDisk {
    fn inner(&self) -> &dyn Disk {
        &*self.inner
    }
    fn sync_data(&self, path: &str) -> Result<(), IoFault> {
        if !(path.starts_with(&self.wal_prefix) && path.ends_with(".wal")) {
            let owner = path
                .strip_prefix(narad_core::partition::owner::TOPICS_DIR)
                .or_else(|| path.strip_prefix(narad_core::partition::journal::JOURNAL_DIR))
                .is_some_and(|rest| rest.starts_with('/'));
            if owner {
                self.metrics.owner_fsyncs.inc();
            }
            return self.inner.sync_data(path);
        }
        let started = self.clock.now();
        let result = self.inner.sync_data(path);
        let elapsed = self.clock.now().saturating_duration_since(started);
        self.metrics
            .ingress_wal_fsync_duration_seconds
            .observe(elapsed.as_secs_f64());
        result
    }
}

#[cfg(test)]
mod tests {
    use narad_core::disk::sim::SimDisk;

    use super::*;

    #[tokio::test]
    async fn wal_segment_syncs_are_timed_and_owner_syncs_counted() {
        let metrics = Arc::new(Metrics::new());
        let metered = MeteredDisk::new(
            Arc::new(SimDisk::new(1)),
            "ingress/produce",
            Clock::start(),
            metrics.clone(),
        );
        let disk: &dyn Disk = &metered;
        disk.create_dir_all("ingress/produce").unwrap();
        disk.create_dir_all("topics/t/1/p00000").unwrap();
        for path in [
            "ingress/produce/00000000000000000000.wal",
            "ingress/produce/checkpoint",
            "topics/t/1/p00000/00000000000000000000.log",
        ] {
            disk.create(path).unwrap();
            disk.sync_data(path).unwrap();
        }
        disk.create_dir_all("owner-journal").unwrap();
        disk.create("owner-journal/00000000000000000000.journal")
            .unwrap();
        disk.sync_data("owner-journal/00000000000000000000.journal")
            .unwrap();
        let text = metrics.encode();
        assert!(
            text.contains("narad_ingress_wal_fsync_duration_seconds_count 1\n"),
            "{text}"
        );
        assert!(text.contains("narad_owner_fsyncs_total 2\n"), "{text}");
    }
}
