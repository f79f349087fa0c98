//! Partition moves' metrics (the surface's `narad_moves_*`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// `narad_moves_total` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MoveOutcomeLabels {
    /// `completed`, `aborted` or `forced`.
    pub outcome: String,
}

/// The move families.
#[derive(Debug)]
pub struct MoveMetrics {
    /// `narad_moves_in_flight`: moves the metastore records (every node reports the same).
    pub in_flight: Gauge,
    /// `narad_moves_total{outcome}`: moves this node ended as their destination (completed,
    /// aborted) or reassigned (forced).
    pub total: Family<MoveOutcomeLabels, Counter>,
    /// `narad_moves_duration_seconds`: from the start of a destination's copy to its switch.
    pub duration_seconds: Histogram,
    /// `narad_moves_bytes_total`: bytes of frames destinations on this node copied.
    pub bytes: Counter,
    /// `narad_moves_forced_offsets_total`: offsets a forced reassignment skipped (what only the
    /// dead owner's disk held, or may have).
    pub forced_offsets: Counter,
}

impl MoveMetrics {
    /// The families, registered in `registry`.
    pub fn new(registry: &mut Registry) -> MoveMetrics {
        let metrics = MoveMetrics {
            in_flight: Gauge::default(),
            total: Family::default(),
            // 10 ms to ~11 min.
            duration_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 17)),
            bytes: Counter::default(),
            forced_offsets: Counter::default(),
        };
        registry.register(
            "moves_in_flight",
            "Partition moves the metastore records in flight",
            metrics.in_flight.clone(),
        );
        registry.register(
            "moves",
            "Partition moves ended here, by outcome",
            metrics.total.clone(),
        );
        registry.register(
            "moves_duration_seconds",
            "Time from a move's first copied chunk to its switch, at its destination",
            metrics.duration_seconds.clone(),
        );
        registry.register(
            "moves_bytes",
            "Bytes of partition frames copied by moves to this node",
            metrics.bytes.clone(),
        );
        registry.register(
            "moves_forced_offsets",
            "Offsets skipped by forced reassignments of a dead member's partitions",
            metrics.forced_offsets.clone(),
        );
        metrics
    }

    /// Counts one move ended with `outcome`.
    pub fn ended(&self, outcome: &str) {
        self.total
            .get_or_create(&MoveOutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }
}
