//! Retention's and the partition logs' metrics (the surface's `narad_storage_retention_*`,
//! `narad_partition_size_bytes`, `narad_open_partition_logs`, `narad_idle_logs_evicted_total`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use super::PartitionLabels;

/// `storage_retention_*_deleted_total` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetentionLabels {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: String,
    /// `age` or `bytes`.
    pub reason: String,
}

/// The storage families.
#[derive(Debug)]
pub struct StorageMetrics {
    /// `narad_storage_retention_bytes_deleted_total{topic,partition,reason}`: bytes of frames
    /// retention removed.
    pub retention_bytes_deleted: Family<RetentionLabels, Counter>,
    /// `narad_storage_retention_messages_deleted_total{topic,partition,reason}`.
    pub retention_messages_deleted: Family<RetentionLabels, Counter>,
    /// `narad_storage_retention_run_duration_seconds`: one retention check over every log of the
    /// node (the decisions; the unlinks follow on the logs' lanes).
    pub retention_run_duration_seconds: Histogram,
    /// `narad_partition_size_bytes{topic,partition}`: bytes of frames a log holds (open logs).
    pub partition_size_bytes: Family<PartitionLabels, Gauge>,
    /// `narad_open_partition_logs`: partition logs holding their files open.
    pub open_partition_logs: Gauge,
    /// `narad_idle_logs_evicted_total`: partition, WAL and journal file handles the real disk closed
    /// after `storage.idle_log_eviction_ms` unused (the disk holds every open handle).
    pub idle_logs_evicted: Counter,
}

impl StorageMetrics {
    /// The families, registered in `registry`.
    pub fn new(registry: &mut Registry) -> StorageMetrics {
        let metrics = StorageMetrics {
            retention_bytes_deleted: Family::default(),
            retention_messages_deleted: Family::default(),
            // 100 µs to ~6.5 s.
            retention_run_duration_seconds: Histogram::new(exponential_buckets(0.000_1, 2.0, 17)),
            partition_size_bytes: Family::default(),
            open_partition_logs: Gauge::default(),
            idle_logs_evicted: Counter::default(),
        };
        registry.register(
            "storage_retention_bytes_deleted",
            "Bytes of partition frames retention removed",
            metrics.retention_bytes_deleted.clone(),
        );
        registry.register(
            "storage_retention_messages_deleted",
            "Records retention removed",
            metrics.retention_messages_deleted.clone(),
        );
        registry.register(
            "storage_retention_run_duration_seconds",
            "Time one retention check took over every partition log of the node",
            metrics.retention_run_duration_seconds.clone(),
        );
        registry.register(
            "partition_size_bytes",
            "Bytes of frames a partition log holds",
            metrics.partition_size_bytes.clone(),
        );
        registry.register(
            "open_partition_logs",
            "Partition logs open on this node",
            metrics.open_partition_logs.clone(),
        );
        registry.register(
            "idle_logs_evicted",
            "File handles closed after storage.idle_log_eviction_ms unused",
            metrics.idle_logs_evicted.clone(),
        );
        metrics
    }

    /// Counts what one retention decision removed.
    pub fn retained(&self, topic: &str, partition: u32, reason: &str, records: u64, bytes: u64) {
        let labels = RetentionLabels {
            topic: topic.to_string(),
            partition: partition.to_string(),
            reason: reason.to_string(),
        };
        self.retention_bytes_deleted
            .get_or_create(&labels)
            .inc_by(bytes);
        self.retention_messages_deleted
            .get_or_create(&labels)
            .inc_by(records);
    }
}
