//! The load generator behind `narad bench`, and the HTTP/1.1 client codec ([`http1`]) the black-box
//! tests share with it. `narad bench`: a load generator for a running node's produce path, over HTTP/1.1 keep-alive.
//!
//! W workers (tasks on a small tokio runtime, one connection each) send single produces
//! (`POST /v1/topics/{t}/produce`, raw body of S bytes) or batches (`POST .../produce/batch`, N
//! messages of S payload bytes), keyed (`--keys K`: key `k<m mod K>` for message m) or keyless, to
//! one topic or to `--topics N` (`<topic>-0` .. `<topic>-<N-1>`, each request to a uniformly random
//! one, from a seeded generator per worker), for a duration or a message count, closed-loop (each
//! worker sends its next request when the last one is answered) or at a fixed offered rate (`--rate`,
//! messages/s over all workers; latency is then measured from each request's scheduled start, so a
//! node that falls behind shows it instead of slowing the schedule down).
//!
//! Around the measured window it scrapes `/metrics` and reports, besides the client's own msgs/s, MB/s
//! (payload bytes, 10^6 B) and p50/p95/p99 latency: fsyncs per accepted record (WAL fdatasyncs, and
//! partition-log fsyncs when the node exports them), records per group commit, dispatcher commits per
//! record (each at most one partition-log fsync on the owner), and the node's
//! accept→visible quantiles. Before the last scrape it waits (bounded by `--drain-timeout`) for
//! `narad_ingress_dispatch_backlog_records` to reach 0, so every accepted record's visibility is
//! counted. Every figure is the whole node's (its counters and its backlog cover all topics), so
//! with several topics they are summed over them.
//!
//! Layout: [`http1`] (request bytes, response parsing; pure), [`scrape`] (reading `/metrics`; pure),
//! [`workload`] (the plan from the flags, bodies; pure), [`report`] (latency summaries, the node's
//! figures, the report; pure), [`consume`] (stamped payloads and, outside madsim, the consumer
//! workers), and, outside madsim, `client` (one tokio connection) and `run` (the workers).

#![forbid(unsafe_code)]

#[cfg(not(madsim))]
mod client;
pub mod consume;
pub mod http1;
pub mod report;
#[cfg(not(madsim))]
mod run;
pub mod scrape;
pub mod workload;

use std::time::Duration;

use clap::{Args, ValueEnum};

pub use report::{LatencySummary, Report};
#[cfg(not(madsim))]
pub use run::main;
pub use workload::{Plan, PlanError};

/// How the report is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object on one line.
    Json,
}

/// `narad bench` flags.
#[derive(Debug, Args, Clone, PartialEq)]
pub struct BenchArgs {
    /// Topic to produce to (created with `--partitions` if missing); with `--topics N` > 1, the
    /// prefix of the N topics.
    #[arg(default_value = "bench")]
    pub topic: String,
    /// Topics to spread the load over: with N > 1, `<topic>-0` .. `<topic>-<N-1>` (each created with
    /// `--partitions` if missing), every request to a uniformly random one of them.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub topics: usize,
    /// The node's HTTP address (`host:port` or `http://host:port`); several, comma-separated, spread
    /// the workers over a cluster's nodes round-robin.
    #[arg(
        long,
        short = 's',
        env = "NARAD_ADDR",
        default_value = "http://127.0.0.1:7942"
    )]
    pub server: String,
    /// User name for HTTP Basic auth (none sent without it).
    #[arg(short = 'u', long, env = "NARAD_USER", value_name = "USER")]
    pub user: Option<String>,
    /// Password for HTTP Basic auth (with `--user`).
    #[arg(
        short = 'p',
        long,
        env = "NARAD_PASS",
        hide_env_values = true,
        value_name = "PASSWORD"
    )]
    pub password: Option<String>,
    /// Concurrent keep-alive connections, one request in flight each.
    #[arg(long, short = 'w', default_value_t = 8)]
    pub workers: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 256)]
    pub size: usize,
    /// Messages per batch request (`/produce/batch`); without it, single produces.
    #[arg(long, value_name = "N")]
    pub batch: Option<usize>,
    /// Run for this long (`500ms`, `10s`, `2m`) after the warm-up.
    #[arg(long, value_parser = parse_duration, conflicts_with = "count")]
    pub duration: Option<Duration>,
    /// Send this many messages after the warm-up (default 10000 when no --duration is given).
    #[arg(long)]
    pub count: Option<u64>,
    /// Distinct keys (`k0` .. `k<K-1>`); 0 = keyless.
    #[arg(long, default_value_t = 0)]
    pub keys: u64,
    /// Offered load in messages per second over all workers (default: as fast as answers come).
    #[arg(long, value_name = "MSGS_PER_S")]
    pub rate: Option<f64>,
    /// Load sent before measuring starts (not counted).
    #[arg(long, value_parser = parse_duration, default_value = "0s")]
    pub warmup: Duration,
    /// Partitions of the topic when the bench creates it.
    #[arg(long, default_value_t = 8)]
    pub partitions: u32,
    /// Client runtime threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Longest wait after the load for the node's dispatch backlog to drain.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub drain_timeout: Duration,
    /// Report format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Queue-mode consumers beside the producers: each long-polls and acks until the producers are
    /// done and the topic is empty; reports consume msgs/s and send → delivered latency.
    #[arg(long)]
    pub consume: bool,
    /// Consumer workers with `--consume` (default: as many as `--workers`).
    #[arg(long, value_name = "N", requires = "consume")]
    pub consume_workers: Option<usize>,
}

/// Parses `250ms`, `10s`, `1.5s`, `2m` (a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (try 500ms, 10s, 2m)"))?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "us" | "µs" => value / 1_000_000.0,
        "m" | "min" => value * 60.0,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (ms, s, m)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|error| format!("{text:?}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_ms_s_and_m() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("3h").is_err());
        assert!(parse_duration("fast").is_err());
    }
}
