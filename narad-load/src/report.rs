//! What a `narad bench` run reports: request latencies, the node's own figures around the measured
//! window, the consumers' figures, and the whole report as text or JSON. Pure: the workers fill it,
//! the plan does not depend on it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::OutputFormat;

/// What the consumers did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConsumeFigures {
    /// Workers.
    pub workers: usize,
    /// Messages delivered (200s), redeliveries included.
    pub delivered: u64,
    /// Acks answered 204.
    pub acked: u64,
    /// From the first consume to the last delivery, seconds.
    pub elapsed_s: f64,
    /// Failed consumes and acks by kind.
    pub errors: BTreeMap<String, u64>,
    /// Send → delivered latency of the stamped deliveries.
    pub latency: Option<LatencySummary>,
}

impl ConsumeFigures {
    /// Deliveries per second.
    pub fn msgs_per_s(&self) -> f64 {
        if self.elapsed_s > 0.0 {
            self.delivered as f64 / self.elapsed_s
        } else {
            0.0
        }
    }

    /// The report's lines.
    pub fn text(&self, out: &mut String) {
        let errors: u64 = self.errors.values().sum();
        let _ = writeln!(
            out,
            "  consume     {} delivered, {} acked, {errors} failed by {} workers in {:.2} s: {:.1} msgs/s",
            self.delivered,
            self.acked,
            self.workers,
            self.elapsed_s,
            self.msgs_per_s()
        );
        if let Some(latency) = &self.latency {
            let _ = writeln!(
                out,
                "  delivered   send→delivered p50 {:.3} ms  p95 {:.3} ms  p99 {:.3} ms  max {:.3} ms",
                latency.p50_s * 1e3,
                latency.p95_s * 1e3,
                latency.p99_s * 1e3,
                latency.max_s * 1e3
            );
        }
    }

    /// The JSON object.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "workers": self.workers,
            "delivered": self.delivered,
            "acked": self.acked,
            "elapsed_s": self.elapsed_s,
            "msgs_per_s": self.msgs_per_s(),
            "errors": self.errors,
            "send_to_delivered": self.latency.map(|latency| serde_json::json!({
                "p50_ms": latency.p50_s * 1e3,
                "p95_ms": latency.p95_s * 1e3,
                "p99_ms": latency.p99_s * 1e3,
                "max_ms": latency.max_s * 1e3,
                "timed": latency.count,
            })),
        })
    }
}

/// Request latencies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencySummary {
    /// Requests timed.
    pub count: usize,
    /// Median, seconds.
    pub p50_s: f64,
    /// 95th percentile, seconds.
    pub p95_s: f64,
    /// 99th percentile, seconds.
    pub p99_s: f64,
    /// Largest, seconds.
    pub max_s: f64,
}

impl LatencySummary {
    /// Nearest-rank percentiles of `nanos` (sorted here); `None` when empty.
    pub fn from_nanos(mut nanos: Vec<u64>) -> Option<LatencySummary> {
        if nanos.is_empty() {
            return None;
        }
        nanos.sort_unstable();
        let at = |q: f64| {
            let rank = (q * nanos.len() as f64).ceil() as usize;
            nanos[rank.clamp(1, nanos.len()) - 1] as f64 / 1e9
        };
        Some(LatencySummary {
            count: nanos.len(),
            p50_s: at(0.50),
            p95_s: at(0.95),
            p99_s: at(0.99),
            max_s: nanos[nanos.len() - 1] as f64 / 1e9,
        })
    }
}

/// What the node's `/metrics` said about the measured window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFigures {
    /// `narad_ingress_accepted_records_total` delta.
    pub accepted_records: f64,
    /// Ingress WAL fdatasyncs (`narad_ingress_wal_fsync_duration_seconds_count` delta).
    pub wal_fsyncs: f64,
    /// Owner-side fsyncs (`narad_owner_fsyncs_total`: partition logs and the owner journal), else
    /// partition-log fsyncs, when the node exports them.
    pub partition_fsyncs: Option<f64>,
    /// Dispatcher commits (`narad_ingress_dispatch_commit_duration_seconds_count` delta): each costs
    /// the owner at most one partition-log fsync (combined commits share one), so they bound the
    /// partition fsyncs a node that does not export them paid.
    pub dispatch_commits: f64,
    /// WAL fdatasync p50, interpolated in its bucket, seconds.
    pub wal_fsync_p50_s: Option<f64>,
    /// WAL fdatasync p99, interpolated in its bucket, seconds.
    pub wal_fsync_p99_s: Option<f64>,
    /// Mean records per WAL group commit.
    pub group_commit_records_mean: Option<f64>,
    /// accept→visible p50, interpolated in its bucket, seconds.
    pub accept_to_visible_p50_s: Option<f64>,
    /// accept→visible p99, interpolated in its bucket, seconds.
    pub accept_to_visible_p99_s: Option<f64>,
    /// The upper bound of the bucket holding the accept→visible p99, seconds.
    pub accept_to_visible_p99_bound_s: Option<f64>,
    /// Records whose visibility the histogram saw.
    pub visible_records: f64,
    /// `narad_errors_total{component="http",kind="5xx"}` delta.
    pub http_5xx: f64,
    /// Whether the backlog reached 0 before the last scrape.
    pub backlog_drained: bool,
    /// The backlog at the last scrape.
    pub backlog_records: f64,
}

/// The outcome of a bench.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The load, in words.
    pub description: String,
    /// Measured window, seconds.
    pub elapsed_s: f64,
    /// Requests answered 2xx in the window.
    pub requests_ok: u64,
    /// Messages in those requests.
    pub messages_ok: u64,
    /// Payload bytes in those requests.
    pub payload_bytes_ok: u64,
    /// Failed requests by kind (`status 500`, `io`, ...).
    pub errors: BTreeMap<String, u64>,
    /// Client-side latency of the timed requests.
    pub latency: Option<LatencySummary>,
    /// The node's figures; `None` when `/metrics` could not be read.
    pub node: Option<NodeFigures>,
    /// The consumers' figures (`--consume`).
    pub consume: Option<ConsumeFigures>,
}

fn ms(seconds: f64) -> String {
    format!("{:.3} ms", seconds * 1e3)
}

fn opt_ms(seconds: Option<f64>) -> String {
    seconds.map_or_else(|| "n/a".to_string(), ms)
}

impl Report {
    /// Failed requests in total.
    pub fn errors_total(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Messages per second.
    pub fn msgs_per_s(&self) -> f64 {
        per_second(self.messages_ok as f64, self.elapsed_s)
    }

    /// Payload megabytes (10^6 B) per second.
    pub fn mb_per_s(&self) -> f64 {
        per_second(self.payload_bytes_ok as f64, self.elapsed_s) / 1e6
    }

    /// Fsyncs per accepted record (WAL and, when exported, partition logs).
    pub fn fsyncs_per_record(&self) -> Option<f64> {
        let node = self.node.as_ref()?;
        (node.accepted_records > 0.0).then(|| {
            (node.wal_fsyncs + node.partition_fsyncs.unwrap_or(0.0)) / node.accepted_records
        })
    }

    /// The report in `format`.
    pub fn render(&self, format: OutputFormat) -> String {
        match format {
            OutputFormat::Text => self.text(),
            OutputFormat::Json => self.json(),
        }
    }

    /// Human-readable lines.
    pub fn text(&self) -> String {
        let mut out = format!("narad bench: {}\n", self.description);
        let errors = if self.errors.is_empty() {
            "0 failed".to_string()
        } else {
            let kinds: Vec<String> = self
                .errors
                .iter()
                .map(|(kind, count)| format!("{count} {kind}"))
                .collect();
            format!("{} failed ({})", self.errors_total(), kinds.join(", "))
        };
        let _ = writeln!(
            out,
            "  requests    {} ok ({} messages), {errors} in {:.2} s",
            self.requests_ok, self.messages_ok, self.elapsed_s
        );
        let _ = writeln!(
            out,
            "  throughput  {:.1} msgs/s, {:.2} MB/s of payload",
            self.msgs_per_s(),
            self.mb_per_s()
        );
        if let Some(latency) = &self.latency {
            let _ = writeln!(
                out,
                "  latency     p50 {}  p95 {}  p99 {}  max {}",
                ms(latency.p50_s),
                ms(latency.p95_s),
                ms(latency.p99_s),
                ms(latency.max_s)
            );
        }
        match &self.node {
            None => out.push_str("  node        /metrics not readable\n"),
            Some(node) => {
                let partition = node
                    .partition_fsyncs
                    .map_or_else(String::new, |count| format!(" + {count:.0} partition"));
                let per_record = self
                    .fsyncs_per_record()
                    .map_or_else(|| "n/a".to_string(), |value| format!("{value:.4}"));
                let _ = writeln!(
                    out,
                    "  fsyncs      {per_record} per record ({:.0} WAL{partition} for {:.0} accepted records; {} records per group commit)",
                    node.wal_fsyncs,
                    node.accepted_records,
                    node.group_commit_records_mean
                        .map_or_else(|| "n/a".to_string(), |mean| format!("{mean:.1}"))
                );
                let _ = writeln!(
                    out,
                    "  wal fsync   p50 {}  p99 {}",
                    opt_ms(node.wal_fsync_p50_s),
                    opt_ms(node.wal_fsync_p99_s)
                );
                if node.accepted_records > 0.0 {
                    let _ = writeln!(
                        out,
                        "  dispatch    {:.4} commits per record ({:.0} commits; each at most one partition-log fsync)",
                        node.dispatch_commits / node.accepted_records,
                        node.dispatch_commits
                    );
                }
                let bound = node
                    .accept_to_visible_p99_bound_s
                    .map_or_else(|| "n/a".to_string(), ms);
                let _ = writeln!(
                    out,
                    "  visible     accept→visible p50 {}  p99 {} (bucket ≤ {bound}) over {:.0} records",
                    opt_ms(node.accept_to_visible_p50_s),
                    opt_ms(node.accept_to_visible_p99_s),
                    node.visible_records
                );
                if !node.backlog_drained {
                    let _ = writeln!(
                        out,
                        "  WARNING     dispatch backlog still {:.0} records at the end: accept→visible misses them",
                        node.backlog_records
                    );
                }
                if node.http_5xx > 0.0 {
                    let _ = writeln!(out, "  node 5xx    {:.0}", node.http_5xx);
                }
            }
        }
        if let Some(consume) = &self.consume {
            consume.text(&mut out);
        }
        out
    }

    /// One JSON object.
    pub fn json(&self) -> String {
        let latency = self.latency.map(|latency| {
            serde_json::json!({
                "p50_ms": latency.p50_s * 1e3,
                "p95_ms": latency.p95_s * 1e3,
                "p99_ms": latency.p99_s * 1e3,
                "max_ms": latency.max_s * 1e3,
                "timed": latency.count,
            })
        });
        let node = self.node.as_ref().map(|node| {
            serde_json::json!({
                "accepted_records": node.accepted_records,
                "wal_fsyncs": node.wal_fsyncs,
                "partition_fsyncs": node.partition_fsyncs,
                "dispatch_commits": node.dispatch_commits,
                "fsyncs_per_record": self.fsyncs_per_record(),
                "group_commit_records_mean": node.group_commit_records_mean,
                "wal_fsync_p50_ms": node.wal_fsync_p50_s.map(|s| s * 1e3),
                "wal_fsync_p99_ms": node.wal_fsync_p99_s.map(|s| s * 1e3),
                "accept_to_visible_p50_ms": node.accept_to_visible_p50_s.map(|s| s * 1e3),
                "accept_to_visible_p99_ms": node.accept_to_visible_p99_s.map(|s| s * 1e3),
                "accept_to_visible_p99_bound_ms": node.accept_to_visible_p99_bound_s.map(|s| s * 1e3),
                "visible_records": node.visible_records,
                "http_5xx": node.http_5xx,
                "backlog_drained": node.backlog_drained,
            })
        });
        serde_json::json!({
            "description": self.description,
            "elapsed_s": self.elapsed_s,
            "requests_ok": self.requests_ok,
            "messages_ok": self.messages_ok,
            "msgs_per_s": self.msgs_per_s(),
            "mb_per_s": self.mb_per_s(),
            "errors": self.errors,
            "latency": latency,
            "node": node,
            "consume": self.consume.as_ref().map(ConsumeFigures::json),
        })
        .to_string()
    }
}

fn per_second(amount: f64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        amount / seconds
    } else {
        0.0
    }
}
