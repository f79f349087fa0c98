//! The node's Prometheus metrics (prometheus-client, OpenMetrics text on `/metrics`).
//!
//! Every metric issue 4 names is declared here, with the `/v1` surface's names where it has them
//! (`narad_http_*`, `narad_errors_total`, `narad_messages_produced_total`, ...). The HTTP layer updates
//! the `http_*`, `errors_total{component="http"}`, `produce_rejections_total` and
//! `ingress_accepted_records_total` families itself; the ingress WAL, dispatcher and partition hosts
//! update the rest when they are wired in (until then those read 0).
//!
//! Decision: families with labels that only the HTTP layer knows up front (`errors_total{http,5xx}`) are
//! created at start so an alert on them sees a 0, not an absent series.

mod moves;
mod storage;

pub use moves::{MoveMetrics, MoveOutcomeLabels};
pub use storage::{RetentionLabels, StorageMetrics};

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// `Content-Type` of the `/metrics` answer.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `errors_total` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `http`, `messaging`, `storage`, `metrics`, `ingress`, `metastore`.
    pub component: String,
    /// What failed (`5xx`, `append`, `consume`, ...).
    pub kind: String,
}

/// `cluster_rpc_duration_seconds` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// The RPC: `commit_batch`, `commit`, `raft`, `heartbeat`, `propose`, `read_index`, `replay`.
    pub op: String,
}

/// Per-partition labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabels {
    /// Topic name.
    pub topic: String,
    /// Partition index.
    pub partition: String,
}

/// `produce_rejections_total` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectionLabels {
    /// Topic name.
    pub topic: String,
    /// `schema`.
    pub reason: String,
}

/// `http_requests_total` / `http_request_duration_seconds` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// The route pattern (`POST /v1/topics/{topic}/produce`) or `unmatched`.
    pub route: String,
    /// Request method.
    pub method: String,
    /// Status code.
    pub status: String,
}

/// `http_timeouts_total` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TimeoutLabels {
    /// `head` (a request head, or the TLS handshake, slower than the read timeout), `body` (a request
    /// body slower than it: 408), `write` (a response write stalled past the write timeout), `idle`
    /// (a kept-alive connection idle past the idle timeout).
    pub kind: String,
}

/// Per-route byte counters' labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The route pattern or `unmatched`.
    pub route: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 50 µs to ~26 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 20))
}

/// `narad_accept_to_visible_seconds` bucket bounds, seconds: fine over 0.5–50 ms, where a healthy node's
/// records become visible (so a p99 target such as 10 ms is read to within a bucket of 2.5 ms), then
/// coarse up to 10 s for stalls.
pub const ACCEPT_TO_VISIBLE_BUCKETS_S: [f64; 22] = [
    0.000_5, 0.001, 0.001_5, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.010, 0.012_5, 0.015,
    0.020, 0.025, 0.035, 0.050, 0.100, 0.250, 0.500, 1.0, 2.5, 10.0,
];

fn accept_to_visible_histogram() -> Histogram {
    Histogram::new(ACCEPT_TO_VISIBLE_BUCKETS_S)
}

/// Sets gauges from their source just before an encode.
type Refresh = Box<dyn Fn(&Metrics) + Send + Sync>;

/// Every metric of the node.
pub struct Metrics {
    registry: Registry,
    /// Called before every encode, so gauges read from their source are exact when scraped.
    refreshers: Mutex<Vec<Refresh>>,
    /// Durable next WAL seq minus the stored checkpoint: what a restart would replay.
    pub ingress_dispatch_backlog_records: Gauge,
    /// Bytes of those records.
    pub ingress_dispatch_backlog_bytes: Gauge,
    /// Age of the oldest undispatched record, seconds.
    pub ingress_dispatch_oldest_record_age_seconds: Gauge<f64, AtomicU64>,
    /// 1 once the ingress WAL latched a write/fsync failure.
    pub ingress_wal_failed: Gauge,
    /// Records answered 202.
    pub ingress_accepted_records: Counter,
    /// WAL fdatasync latency.
    pub ingress_wal_fsync_duration_seconds: Histogram,
    /// `narad_owner_fsyncs_total`: fdatasync calls on the owner's files (the owner journal and the
    /// partition logs), the cost owner commits add per record.
    pub owner_fsyncs: Counter,
    /// Records per WAL group commit.
    pub ingress_wal_group_commit_records: Histogram,
    /// Dispatcher commit latency (send to answer).
    pub ingress_dispatch_commit_duration_seconds: Histogram,
    /// Records rerouted to a sibling partition.
    pub ingress_dispatch_reroutes: Counter,
    /// `narad_ingress_dispatch_incarnation_mismatches_total`: commits an owner refused because their
    /// records were accepted for another topic incarnation (412 from a remote owner, or the local check).
    pub ingress_dispatch_incarnation_mismatches: Counter,
    /// Accept (202) to visible (high watermark) latency.
    pub accept_to_visible_seconds: Histogram,
    /// `narad_consume_delivered_total`: queue-mode deliveries (redeliveries included).
    pub consume_delivered: Counter,
    /// `narad_consume_redelivered_total`: deliveries of a record delivered before (lease expired,
    /// nacked, or its first delivery failed).
    pub consume_redelivered: Counter,
    /// `narad_ack_acked_total`: leases acked.
    pub consume_acked: Counter,
    /// `narad_ack_nacked_total`: leases nacked.
    pub consume_nacked: Counter,
    /// Errors by component and kind.
    pub errors: Family<ErrorLabels, Counter>,
    /// Records committed to partitions.
    pub messages_produced: Family<PartitionLabels, Counter>,
    /// Payload bytes committed to partitions.
    pub bytes_produced: Family<PartitionLabels, Counter>,
    /// Produces refused by validation (`reason="schema"`).
    pub produce_rejections: Family<RejectionLabels, Counter>,
    /// HTTP requests answered.
    pub http_requests: Family<HttpLabels, Counter>,
    /// HTTP request latency.
    pub http_request_duration_seconds: HistogramFamily<HttpLabels>,
    /// Request body bytes.
    pub http_request_bytes_in: Family<RouteLabels, Counter>,
    /// Response body bytes.
    pub http_response_bytes_out: Family<RouteLabels, Counter>,
    /// HTTP requests being served.
    pub http_requests_in_flight: Gauge,
    /// `narad_http_connections_open`: HTTP connections being served (at most `http.max_connections`).
    pub http_connections_open: Gauge,
    /// `narad_http_connections_refused_total`: connections refused past `http.max_connections`.
    pub http_connections_refused: Counter,
    /// `narad_http_timeouts_total{kind}`: connections or requests cut by a timeout.
    pub http_timeouts: Family<TimeoutLabels, Counter>,
    /// `narad_cluster_rpc_duration_seconds{op}`.
    pub cluster_rpc_duration_seconds: HistogramFamily<OpLabels>,
    /// `narad_cluster_frames_refused_total`.
    pub cluster_frames_refused: Counter,
    /// `narad_cluster_auth_failures_total`.
    pub cluster_auth_failures: Counter,
    /// `narad_cluster_incarnation_refusals_total`: remote commits this owner answered 412.
    pub cluster_incarnation_refusals: Counter,
    /// `narad_cluster_members_alive`.
    pub cluster_members_alive: Gauge,
    /// `narad_cluster_raft_term`.
    pub cluster_raft_term: Gauge,
    /// `narad_cluster_raft_leader`.
    pub cluster_raft_leader: Gauge,
    /// `narad_cluster_raft_commit_index`.
    pub cluster_raft_commit_index: Gauge,
    /// Retention's and the partition logs' families.
    pub storage: StorageMetrics,
    /// Partition moves' families.
    pub moves: MoveMetrics,
    /// `narad_disk_guard_active`: 1 while produces answer 507 for want of free space.
    pub disk_guard_active: Gauge,
    /// `narad_data_dir_available_bytes`: free space of the data directory's file system.
    pub data_dir_available_bytes: Gauge,
    /// `narad_data_dir_size_bytes`: bytes of the files under the data directory.
    pub data_dir_size_bytes: Gauge,
}

impl Metrics {
    /// Registers every metric under the `narad_` prefix.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("narad");
        let storage = StorageMetrics::new(&mut registry);
        let moves = MoveMetrics::new(&mut registry);
        let mut m = Metrics {
            storage,
            moves,
            ingress_dispatch_backlog_records: Gauge::default(),
            ingress_dispatch_backlog_bytes: Gauge::default(),
            ingress_dispatch_oldest_record_age_seconds: Gauge::default(),
            ingress_wal_failed: Gauge::default(),
            ingress_accepted_records: Counter::default(),
            ingress_wal_fsync_duration_seconds: latency_histogram(),
            owner_fsyncs: Counter::default(),
            ingress_wal_group_commit_records: Histogram::new(exponential_buckets(1.0, 2.0, 17)),
            ingress_dispatch_commit_duration_seconds: latency_histogram(),
            ingress_dispatch_reroutes: Counter::default(),
            ingress_dispatch_incarnation_mismatches: Counter::default(),
            accept_to_visible_seconds: accept_to_visible_histogram(),
            consume_delivered: Counter::default(),
            consume_redelivered: Counter::default(),
            consume_acked: Counter::default(),
            consume_nacked: Counter::default(),
            errors: Family::default(),
            messages_produced: Family::default(),
            bytes_produced: Family::default(),
            produce_rejections: Family::default(),
            http_requests: Family::default(),
            http_request_duration_seconds: Family::new_with_constructor(latency_histogram),
            http_request_bytes_in: Family::default(),
            http_response_bytes_out: Family::default(),
            http_requests_in_flight: Gauge::default(),
            http_connections_open: Gauge::default(),
            http_connections_refused: Counter::default(),
            http_timeouts: Family::default(),
            cluster_rpc_duration_seconds: Family::new_with_constructor(latency_histogram),
            cluster_frames_refused: Counter::default(),
            cluster_auth_failures: Counter::default(),
            cluster_incarnation_refusals: Counter::default(),
            cluster_members_alive: Gauge::default(),
            cluster_raft_term: Gauge::default(),
            cluster_raft_leader: Gauge::default(),
            cluster_raft_commit_index: Gauge::default(),
            disk_guard_active: Gauge::default(),
            data_dir_available_bytes: Gauge::default(),
            data_dir_size_bytes: Gauge::default(),
            registry,
            refreshers: Mutex::new(Vec::new()),
        };
        m.register_ingress();
        m.register_consume();
        m.register_produce();
        m.register_http();
        m.register_cluster();
        m.register_data_dir();
        m.error("http", "5xx");
        m
    }

    /// Registers the ingress WAL's and the dispatcher's metrics.
    fn register_ingress(&mut self) {
        let r = &mut self.registry;
        r.register(
            "ingress_dispatch_backlog_records",
            "Records a restart would replay: durable next WAL seq minus the stored checkpoint",
            self.ingress_dispatch_backlog_records.clone(),
        );
        r.register(
            "ingress_dispatch_backlog_bytes",
            "Bytes of the undispatched WAL records",
            self.ingress_dispatch_backlog_bytes.clone(),
        );
        r.register(
            "ingress_dispatch_oldest_record_age_seconds",
            "Age of the oldest undispatched WAL record",
            self.ingress_dispatch_oldest_record_age_seconds.clone(),
        );
        r.register(
            "ingress_wal_failed",
            "1 once the ingress WAL latched a write or fsync failure (until restart)",
            self.ingress_wal_failed.clone(),
        );
        r.register(
            "ingress_accepted_records",
            "Records acknowledged with 202 (fsynced in the ingress WAL)",
            self.ingress_accepted_records.clone(),
        );
        r.register(
            "ingress_wal_fsync_duration_seconds",
            "Ingress WAL fdatasync latency",
            self.ingress_wal_fsync_duration_seconds.clone(),
        );
        r.register(
            "owner_fsyncs",
            "fdatasync calls on owner files: the owner journal and the partition logs",
            self.owner_fsyncs.clone(),
        );
        r.register(
            "ingress_wal_group_commit_records",
            "Records made durable by one ingress WAL group commit",
            self.ingress_wal_group_commit_records.clone(),
        );
        r.register(
            "ingress_dispatch_commit_duration_seconds",
            "Dispatcher commit latency, send to answer",
            self.ingress_dispatch_commit_duration_seconds.clone(),
        );
        r.register(
            "ingress_dispatch_reroutes",
            "Records rerouted to a sibling partition",
            self.ingress_dispatch_reroutes.clone(),
        );
        r.register(
            "ingress_dispatch_incarnation_mismatches",
            "Commits refused for records of another topic incarnation (a remote owner's 412, or the local check)",
            self.ingress_dispatch_incarnation_mismatches.clone(),
        );
        r.register(
            "accept_to_visible_seconds",
            "Latency from the 202 to the record becoming visible",
            self.accept_to_visible_seconds.clone(),
        );
    }

    /// Registers queue-mode deliveries and acknowledgements.
    fn register_consume(&mut self) {
        let r = &mut self.registry;
        r.register(
            "consume_delivered",
            "Queue-mode deliveries, redeliveries included",
            self.consume_delivered.clone(),
        );
        r.register(
            "consume_redelivered",
            "Queue-mode deliveries of a record delivered before",
            self.consume_redelivered.clone(),
        );
        r.register(
            "ack_acked",
            "Queue-mode leases acked",
            self.consume_acked.clone(),
        );
        r.register(
            "ack_nacked",
            "Queue-mode leases nacked",
            self.consume_nacked.clone(),
        );
    }

    /// Registers errors and what partitions committed or refused.
    fn register_produce(&mut self) {
        let r = &mut self.registry;
        r.register(
            "errors",
            "Errors by component and kind",
            self.errors.clone(),
        );
        r.register(
            "messages_produced",
            "Records committed to a partition",
            self.messages_produced.clone(),
        );
        r.register(
            "bytes_produced",
            "Payload bytes committed to a partition",
            self.bytes_produced.clone(),
        );
        r.register(
            "produce_rejections",
            "Produces refused by validation",
            self.produce_rejections.clone(),
        );
    }

    /// Registers the HTTP server's metrics.
    fn register_http(&mut self) {
        let r = &mut self.registry;
        r.register(
            "http_requests",
            "HTTP requests answered",
            self.http_requests.clone(),
        );
        r.register(
            "http_request_duration_seconds",
            "HTTP request latency",
            self.http_request_duration_seconds.clone(),
        );
        r.register(
            "http_request_bytes_in",
            "HTTP request body bytes",
            self.http_request_bytes_in.clone(),
        );
        r.register(
            "http_response_bytes_out",
            "HTTP response body bytes",
            self.http_response_bytes_out.clone(),
        );
        r.register(
            "http_requests_in_flight",
            "HTTP requests being served",
            self.http_requests_in_flight.clone(),
        );
        r.register(
            "http_connections_open",
            "HTTP connections being served",
            self.http_connections_open.clone(),
        );
        r.register(
            "http_connections_refused",
            "HTTP connections refused (503) past http.max_connections",
            self.http_connections_refused.clone(),
        );
        r.register(
            "http_timeouts",
            "HTTP connections or requests cut by a timeout, by kind (head, body, write, idle)",
            self.http_timeouts.clone(),
        );
    }

    /// Registers the peer RPCs' and the metastore replica's metrics.
    fn register_cluster(&mut self) {
        let r = &mut self.registry;
        r.register(
            "cluster_rpc_duration_seconds",
            "Peer RPC latency, request sent to answer read, by op",
            self.cluster_rpc_duration_seconds.clone(),
        );
        r.register(
            "cluster_frames_refused",
            "Cluster frames refused for their size (before sending, or on receipt)",
            self.cluster_frames_refused.clone(),
        );
        r.register(
            "cluster_auth_failures",
            "Peer connections closed for a wrong or missing proof of the cluster secret",
            self.cluster_auth_failures.clone(),
        );
        r.register(
            "cluster_incarnation_refusals",
            "Remote commits answered 412: their records carry another topic incarnation than this owner's",
            self.cluster_incarnation_refusals.clone(),
        );
        r.register(
            "cluster_members_alive",
            "Members the metastore lists alive",
            self.cluster_members_alive.clone(),
        );
        r.register(
            "cluster_raft_term",
            "The metastore replica's raft term",
            self.cluster_raft_term.clone(),
        );
        r.register(
            "cluster_raft_leader",
            "The raft leader this replica knows (0: none)",
            self.cluster_raft_leader.clone(),
        );
        r.register(
            "cluster_raft_commit_index",
            "The metastore replica's raft commit index",
            self.cluster_raft_commit_index.clone(),
        );
    }

    /// Registers the disk guard's and the data directory's metrics.
    fn register_data_dir(&mut self) {
        let r = &mut self.registry;
        r.register(
            "disk_guard_active",
            "1 while produces answer 507: the data directory's file system has less free space than storage.min_free_bytes",
            self.disk_guard_active.clone(),
        );
        r.register(
            "data_dir_available_bytes",
            "Bytes available on the data directory's file system, as the disk guard last sampled them",
            self.data_dir_available_bytes.clone(),
        );
        r.register(
            "data_dir_size_bytes",
            "Bytes of the files under the data directory, measured at most every 10 s",
            self.data_dir_size_bytes.clone(),
        );
    }

    /// The counter `errors_total{component, kind}`.
    pub fn error(&self, component: &str, kind: &str) -> Counter {
        self.errors
            .get_or_create(&ErrorLabels {
                component: component.to_string(),
                kind: kind.to_string(),
            })
            .clone()
    }

    /// Registers `refresh`, called before every [`Metrics::encode`] to set gauges from their source.
    pub fn add_refresh(&self, refresh: impl Fn(&Metrics) + Send + Sync + 'static) {
        self.refreshers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Box::new(refresh));
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        for refresh in self
            .refreshers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
        {
            refresh(self);
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String does not fail");
        text
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_load_generators_scrape_reads_this_exposition() {
        let metrics = Metrics::new();
        metrics.accept_to_visible_seconds.observe(0.003);
        metrics.ingress_accepted_records.inc_by(7);
        let scrape = narad_load::scrape::Scrape::parse(&metrics.encode());
        assert_eq!(scrape.skipped_lines, 0);
        assert_eq!(
            scrape.value("narad_ingress_accepted_records_total"),
            Some(7.0)
        );
        assert_eq!(
            scrape.value("narad_ingress_dispatch_backlog_records"),
            Some(0.0)
        );
        let histogram = scrape.histogram("narad_accept_to_visible_seconds").unwrap();
        assert_eq!(histogram.count(), 1.0);
        assert_eq!(histogram.quantile_bound(0.99), Some(0.003));
    }

    #[test]
    fn accept_to_visible_has_fine_buckets_from_half_a_millisecond_to_fifty() {
        let metrics = Metrics::new();
        metrics.accept_to_visible_seconds.observe(0.009);
        let text = metrics.encode();
        let bounds: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with("narad_accept_to_visible_seconds_bucket{"))
            .filter_map(|line| line.split('"').nth(1))
            .collect();
        assert_eq!(
            bounds,
            [
                "0.0005", "0.001", "0.0015", "0.002", "0.003", "0.004", "0.005", "0.006", "0.008",
                "0.01", "0.0125", "0.015", "0.02", "0.025", "0.035", "0.05", "0.1", "0.25", "0.5",
                "1.0", "2.5", "10.0", "+Inf"
            ]
        );
        assert!(text.contains("narad_accept_to_visible_seconds_bucket{le=\"0.008\"} 0\n"));
        assert!(text.contains("narad_accept_to_visible_seconds_bucket{le=\"0.01\"} 1\n"));
    }

    #[test]
    fn every_issue_4_metric_is_exposed() {
        let metrics = Metrics::new();
        // Labelled families appear once they have a series (as in every Prometheus client).
        let partition = PartitionLabels {
            topic: "t".to_string(),
            partition: "0".to_string(),
        };
        metrics.messages_produced.get_or_create(&partition).inc();
        metrics.bytes_produced.get_or_create(&partition).inc();
        metrics
            .produce_rejections
            .get_or_create(&RejectionLabels {
                topic: "t".to_string(),
                reason: "schema".to_string(),
            })
            .inc();
        let http = HttpLabels {
            route: "GET /healthz".to_string(),
            method: "GET".to_string(),
            status: "200".to_string(),
        };
        metrics.http_requests.get_or_create(&http).inc();
        metrics
            .http_request_duration_seconds
            .get_or_create(&http)
            .observe(0.1);
        let route = RouteLabels {
            route: "GET /healthz".to_string(),
        };
        metrics.http_request_bytes_in.get_or_create(&route).inc();
        metrics.http_response_bytes_out.get_or_create(&route).inc();
        let text = metrics.encode();
        for name in [
            "narad_ingress_dispatch_backlog_records",
            "narad_ingress_dispatch_backlog_bytes",
            "narad_ingress_dispatch_oldest_record_age_seconds",
            "narad_ingress_wal_failed",
            "narad_ingress_accepted_records",
            "narad_ingress_wal_fsync_duration_seconds",
            "narad_ingress_wal_group_commit_records",
            "narad_ingress_dispatch_commit_duration_seconds",
            "narad_ingress_dispatch_reroutes",
            "narad_accept_to_visible_seconds",
            "narad_errors",
            "narad_messages_produced",
            "narad_bytes_produced",
            "narad_produce_rejections",
            "narad_http_requests",
            "narad_http_request_duration_seconds",
            "narad_http_request_bytes_in",
            "narad_http_response_bytes_out",
            "narad_http_requests_in_flight",
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{name} missing from:\n{text}"
            );
        }
        let fresh = Metrics::new().encode();
        assert!(fresh.contains("narad_errors_total{component=\"http\",kind=\"5xx\"} 0\n"));
        assert!(fresh.contains("narad_ingress_wal_failed 0\n"));
        assert!(fresh.contains("narad_ingress_dispatch_backlog_records 0\n"));
        for gauge in [
            "narad_disk_guard_active",
            "narad_data_dir_available_bytes",
            "narad_data_dir_size_bytes",
        ] {
            assert!(
                fresh.contains(&format!("# TYPE {gauge} gauge\n{gauge} 0\n")),
                "{gauge}"
            );
        }
    }
}
