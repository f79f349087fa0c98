//! What `narad bench` sends and what it reports, as pure data: the [`Plan`] checked from the flags,
//! the request bodies, the latency summary, and the [`Report`] with its text and JSON forms.

use std::fmt::Write as _;
use std::time::Duration;

use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;

use super::{BenchArgs, OutputFormat};

/// The most workers (connections) one bench opens.
pub const WORKERS_MAX: usize = 4096;
/// The most topics one bench spreads its load over (the metastore's limit).
pub const TOPICS_MAX: usize = 10_000;
/// The most client runtime threads.
pub const THREADS_MAX: usize = 64;
/// The largest single-produce payload (the node's body limit).
pub const SINGLE_PAYLOAD_BYTES_MAX: usize = 1024 * 1024;
/// The most messages in one batch request (the node's limit).
pub const BATCH_MESSAGES_MAX: usize = 1000;
/// The largest batch body (the node's limit).
pub const BATCH_BODY_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Latency samples kept over all workers; requests past it are counted but not timed.
pub const LATENCY_SAMPLES_MAX: usize = 20_000_000;
/// Messages sent when neither `--duration` nor `--count` is given (as Narad's Go `bench`).
pub const COUNT_DEFAULT: u64 = 10_000;
/// The JSON a payload is built from: `{"bench":"xxx…"}` (as Narad's Go `bench`).
const PAYLOAD_FRAME: (&str, &str) = ("{\"bench\":\"", "\"}");

/// When the measured load stops.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stop {
    /// After this long.
    After(Duration),
    /// After this many messages.
    Count(u64),
}

/// A checked bench configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// `host:port` of the node (the first of [`Plan::authorities`]).
    pub authority: String,
    /// The `Authorization` header value every request carries (`--user`), if any.
    pub authorization: Option<String>,
    /// `host:port` of every node the workers are spread over (worker `i` takes `i mod n`).
    pub authorities: Vec<String>,
    /// Topic name; with [`Plan::topics`] > 1, the prefix of the topics' names.
    pub topic: String,
    /// Topics the load is spread over ([`Plan::topic_name`]).
    pub topics: usize,
    /// Partitions when the bench creates the topic.
    pub partitions: u32,
    /// Connections.
    pub workers: usize,
    /// Payload bytes per message.
    pub payload_bytes: usize,
    /// Messages per batch request; `None` = single produces.
    pub batch: Option<usize>,
    /// When to stop.
    pub stop: Stop,
    /// Unmeasured load before the window.
    pub warmup: Duration,
    /// Distinct keys; 0 = keyless.
    pub keys: u64,
    /// Offered messages per second; `None` = closed loop.
    pub rate_per_s: Option<f64>,
    /// Client runtime threads.
    pub threads: usize,
    /// Longest wait for the backlog to drain.
    pub drain_timeout: Duration,
    /// Report format.
    pub output: OutputFormat,
    /// Queue-mode consumer workers beside the producers (`--consume`).
    pub consume: Option<usize>,
}

/// Why the flags do not make a bench.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// A flag is out of range.
    #[error("--{flag}: {reason}")]
    Flag {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        reason: String,
    },
}

fn flag(flag: &'static str, reason: impl Into<String>) -> PlanError {
    PlanError::Flag {
        flag,
        reason: reason.into(),
    }
}

impl Plan {
    /// The headers every request carries (`Authorization` with `--user`), then `extra`.
    pub fn headers<'a>(&'a self, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut headers: Vec<(&str, &str)> = self
            .authorization
            .as_deref()
            .map(|value| ("Authorization", value))
            .into_iter()
            .collect();
        headers.extend_from_slice(extra);
        headers
    }

    /// Checks the flags.
    pub fn from_args(args: &BenchArgs) -> Result<Plan, PlanError> {
        let authorities = args
            .server
            .split(',')
            .map(|server| authority(server.trim()))
            .collect::<Result<Vec<String>, PlanError>>()?;
        let authority = authorities[0].clone();
        if !(1..=WORKERS_MAX).contains(&args.workers) {
            return Err(flag("workers", format!("between 1 and {WORKERS_MAX}")));
        }
        if !(1..=TOPICS_MAX).contains(&args.topics) {
            return Err(flag("topics", format!("between 1 and {TOPICS_MAX}")));
        }
        if !(1..=THREADS_MAX).contains(&args.threads) {
            return Err(flag("threads", format!("between 1 and {THREADS_MAX}")));
        }
        if args.size == 0 {
            return Err(flag("size", "a message needs at least one byte"));
        }
        if let Some(batch) = args.batch {
            if !(1..=BATCH_MESSAGES_MAX).contains(&batch) {
                return Err(flag("batch", format!("between 1 and {BATCH_MESSAGES_MAX}")));
            }
            let body = batch_body_bytes_estimate(batch, args.size, args.keys);
            if body > BATCH_BODY_BYTES_MAX {
                return Err(flag(
                    "batch",
                    format!(
                        "{batch} × {} B is a {body} B body, over the node's 16 MiB",
                        args.size
                    ),
                ));
            }
        } else if args.size > SINGLE_PAYLOAD_BYTES_MAX {
            return Err(flag("size", "a single produce holds at most 1 MiB"));
        }
        if let Some(rate) = args.rate {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(flag("rate", "a positive number of messages per second"));
            }
        }
        let stop = match (args.duration, args.count) {
            (Some(duration), _) if duration.is_zero() => {
                return Err(flag("duration", "must be longer than 0"))
            }
            (Some(duration), _) => Stop::After(duration),
            (None, Some(0)) => return Err(flag("count", "must be at least 1")),
            (None, Some(count)) => Stop::Count(count),
            (None, None) => Stop::Count(COUNT_DEFAULT),
        };
        let consume = match (args.consume, args.consume_workers) {
            (false, _) => None,
            (true, Some(workers)) if !(1..=WORKERS_MAX).contains(&workers) => {
                return Err(flag(
                    "consume-workers",
                    format!("between 1 and {WORKERS_MAX}"),
                ))
            }
            (true, workers) => Some(workers.unwrap_or(args.workers)),
        };
        Ok(Plan {
            consume,
            authorization: args.user.as_deref().map(|user| {
                crate::http1::basic_authorization(user, args.password.as_deref().unwrap_or(""))
            }),
            authority,
            authorities,
            topic: args.topic.clone(),
            topics: args.topics,
            partitions: args.partitions,
            workers: args.workers,
            payload_bytes: args.size,
            batch: args.batch,
            stop,
            warmup: args.warmup,
            keys: args.keys,
            rate_per_s: args.rate,
            threads: args.threads,
            drain_timeout: args.drain_timeout,
            output: args.output,
        })
    }

    /// Messages per request.
    pub fn messages_per_request(&self) -> u64 {
        self.batch.map_or(1, |batch| batch as u64)
    }

    /// The name of topic `index` (below [`Plan::topics`]): the topic itself when there is one,
    /// else `<topic>-<index>`.
    pub fn topic_name(&self, index: usize) -> String {
        if self.topics == 1 {
            self.topic.clone()
        } else {
            format!("{}-{index}", self.topic)
        }
    }

    /// Every topic's name, in index order.
    pub fn topic_names(&self) -> Vec<String> {
        (0..self.topics)
            .map(|index| self.topic_name(index))
            .collect()
    }

    /// The request target (without the key) of a produce to topic `index`.
    pub fn target(&self, index: usize) -> String {
        let topic = self.topic_name(index);
        match self.batch {
            Some(_) => format!("/v1/topics/{topic}/produce/batch"),
            None => format!("/v1/topics/{topic}/produce"),
        }
    }

    /// The key of message number `message`, if keyed.
    pub fn key(&self, message: u64) -> Option<String> {
        (self.keys > 0).then(|| format!("k{}", message % self.keys))
    }

    /// One line describing the load.
    pub fn describe(&self) -> String {
        let shape = match self.batch {
            Some(batch) => format!("batches of {batch}"),
            None => "single produces".to_string(),
        };
        let keys = match self.keys {
            0 => "keyless".to_string(),
            keys => format!("{keys} keys"),
        };
        let stop = match self.stop {
            Stop::After(duration) => format!("{:.1} s", duration.as_secs_f64()),
            Stop::Count(count) => format!("{count} messages"),
        };
        let rate = match self.rate_per_s {
            Some(rate) => format!(", offered {rate:.0} msgs/s"),
            None => String::new(),
        };
        let topics = match self.topics {
            1 => format!("topic {}", self.topic),
            n => format!("{n} topics {}-0..{}-{}", self.topic, self.topic, n - 1),
        };
        format!(
            "{topics}, {} workers, {} B payloads, {shape}, {keys}, {stop}{rate}",
            self.workers, self.payload_bytes
        )
    }
}

/// One worker's choice of topic for each of its requests: uniform over `topics`, from a generator
/// seeded with the worker's index, so a run's sequence of choices repeats.
#[derive(Clone, Debug)]
pub struct TopicPicker {
    topics: usize,
    rng: ChaCha8Rng,
}

impl TopicPicker {
    /// The picker of worker `worker` over `topics` topics (at least one).
    pub fn new(topics: usize, worker: usize) -> TopicPicker {
        TopicPicker {
            topics: topics.max(1),
            rng: ChaCha8Rng::seed_from_u64(worker as u64),
        }
    }

    /// The index of the next request's topic, below `topics`.
    pub fn next_topic(&mut self) -> usize {
        if self.topics == 1 {
            0
        } else {
            self.rng.random_range(0..self.topics)
        }
    }
}

/// `host:port` from `host:port` or `http://host:port[/]`.
fn authority(server: &str) -> Result<String, PlanError> {
    let rest = if let Some(rest) = server.strip_prefix("http://") {
        rest
    } else if server.starts_with("https://") {
        return Err(flag("server", "https is not supported; use http://"));
    } else {
        server
    };
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') {
        return Err(flag("server", format!("{server:?} is not host:port")));
    }
    Ok(rest.to_string())
}

fn batch_body_bytes_estimate(batch: usize, size: usize, keys: u64) -> usize {
    let key_bytes = if keys > 0 {
        12 + keys.to_string().len()
    } else {
        0
    };
    // {"messages":[ ... ]} and per message {"payload":...},
    16 + batch * (size + key_bytes + 16)
}

/// A payload of exactly `bytes` bytes: `{"bench":"xxx…"}` (valid JSON, as Narad's Go bench sends) when
/// it fits, else `x`s.
pub fn payload(bytes: usize) -> Vec<u8> {
    let frame = PAYLOAD_FRAME.0.len() + PAYLOAD_FRAME.1.len();
    if bytes < frame {
        return vec![b'x'; bytes];
    }
    let mut payload = Vec::with_capacity(bytes);
    payload.extend_from_slice(PAYLOAD_FRAME.0.as_bytes());
    payload.resize(bytes - PAYLOAD_FRAME.1.len(), b'x');
    payload.extend_from_slice(PAYLOAD_FRAME.1.as_bytes());
    payload
}

/// A batch body: every message carries `payload` (as a JSON value when it is JSON, else as a JSON
/// string; either way the node stores exactly `payload`) and its key from `keys`.
pub fn batch_body(payload: &[u8], keys: &[Option<String>]) -> Vec<u8> {
    let value = if serde_json::from_slice::<serde::de::IgnoredAny>(payload).is_ok() {
        String::from_utf8_lossy(payload).into_owned()
    } else {
        serde_json::to_string(&String::from_utf8_lossy(payload)).expect("a string serializes")
    };
    let mut body = String::with_capacity(16 + keys.len() * (value.len() + 32));
    body.push_str("{\"messages\":[");
    for (index, key) in keys.iter().enumerate() {
        if index > 0 {
            body.push(',');
        }
        body.push('{');
        if let Some(key) = key {
            let _ = write!(
                body,
                "\"key\":{},",
                serde_json::to_string(key).expect("a string serializes")
            );
        }
        body.push_str("\"payload\":");
        body.push_str(&value);
        body.push('}');
    }
    body.push_str("]}");
    body.into_bytes()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use clap::Parser;

    use super::*;
    use crate::report::{LatencySummary, NodeFigures, Report};

    /// `narad bench`'s flags as the `narad` command line flattens them.
    #[derive(Parser)]
    struct Bench {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn args(extra: &[&str]) -> BenchArgs {
        let mut argv = vec!["bench"];
        argv.extend_from_slice(extra);
        Bench::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn defaults_follow_narads_go_bench() {
        let plan = Plan::from_args(&args(&[])).unwrap();
        assert_eq!(
            plan,
            Plan {
                authority: "127.0.0.1:7942".to_string(),
                authorization: None,
                authorities: vec!["127.0.0.1:7942".to_string()],
                topic: "bench".to_string(),
                topics: 1,
                partitions: 8,
                workers: 8,
                payload_bytes: 256,
                batch: None,
                stop: Stop::Count(10_000),
                warmup: Duration::ZERO,
                keys: 0,
                rate_per_s: None,
                threads: 1,
                drain_timeout: Duration::from_secs(30),
                output: OutputFormat::Text,
                consume: None,
            }
        );
        let consuming = Plan::from_args(&args(&["--consume", "--workers", "3"])).unwrap();
        assert_eq!(consuming.consume, Some(3));
        let fewer = Plan::from_args(&args(&["--consume", "--consume-workers", "2"])).unwrap();
        assert_eq!(fewer.consume, Some(2));
        assert!(Plan::from_args(&args(&["--consume", "--consume-workers", "0"])).is_err());
    }

    #[test]
    fn flags_reach_the_plan() {
        let plan = Plan::from_args(&args(&[
            "orders",
            "-s",
            "10.0.0.1:80/",
            "-w",
            "64",
            "--size",
            "1024",
            "--batch",
            "100",
            "--duration",
            "5s",
            "--keys",
            "16",
            "--rate",
            "2000",
            "--warmup",
            "1s",
        ]))
        .unwrap();
        assert_eq!(plan.authority, "10.0.0.1:80");
        assert_eq!(plan.topic, "orders");
        assert_eq!(plan.batch, Some(100));
        assert_eq!(plan.stop, Stop::After(Duration::from_secs(5)));
        assert_eq!(plan.rate_per_s, Some(2000.0));
        assert_eq!(plan.target(0), "/v1/topics/orders/produce/batch");
        assert_eq!(plan.key(17), Some("k1".to_string()));
        assert_eq!(
            plan.describe(),
            "topic orders, 64 workers, 1024 B payloads, batches of 100, 16 keys, 5.0 s, offered 2000 msgs/s"
        );
    }

    #[test]
    fn out_of_range_flags_are_refused() {
        let refused = |extra: &[&str]| Plan::from_args(&args(extra)).unwrap_err().to_string();
        assert_eq!(refused(&["-w", "0"]), "--workers: between 1 and 4096");
        assert_eq!(refused(&["--topics", "0"]), "--topics: between 1 and 10000");
        assert_eq!(
            refused(&["--topics", "10001"]),
            "--topics: between 1 and 10000"
        );
        assert_eq!(
            refused(&["--size", "0"]),
            "--size: a message needs at least one byte"
        );
        assert_eq!(
            refused(&["--size", "1048577"]),
            "--size: a single produce holds at most 1 MiB"
        );
        assert_eq!(refused(&["--batch", "1001"]), "--batch: between 1 and 1000");
        assert_eq!(
            refused(&["--batch", "1000", "--size", "20000"]),
            "--batch: 1000 × 20000 B is a 20016016 B body, over the node's 16 MiB"
        );
        assert_eq!(
            refused(&["--rate", "0"]),
            "--rate: a positive number of messages per second"
        );
        assert_eq!(refused(&["--count", "0"]), "--count: must be at least 1");
        assert_eq!(
            refused(&["-s", "https://x:1"]),
            "--server: https is not supported; use http://"
        );
        assert!(Bench::try_parse_from(["bench", "--count", "1", "--duration", "1s"]).is_err());
    }

    #[test]
    fn several_topics_are_named_by_index_and_one_keeps_its_name() {
        let one = Plan::from_args(&args(&["orders"])).unwrap();
        assert_eq!(one.topic_names(), vec!["orders".to_string()]);
        assert_eq!(one.target(0), "/v1/topics/orders/produce");
        let many = Plan::from_args(&args(&["orders", "--topics", "3", "--batch", "10"])).unwrap();
        assert_eq!(many.topics, 3);
        assert_eq!(many.topic_names(), vec!["orders-0", "orders-1", "orders-2"]);
        assert_eq!(many.target(2), "/v1/topics/orders-2/produce/batch");
        assert!(
            many.describe()
                .starts_with("3 topics orders-0..orders-2, 8 workers"),
            "{}",
            many.describe()
        );
    }

    #[test]
    fn topic_choices_are_uniform_and_repeat_per_worker() {
        let mut one = TopicPicker::new(1, 5);
        assert!((0..100).all(|_| one.next_topic() == 0));
        let topics = 30;
        let draws = 300_000;
        let mut counts = vec![0u32; topics];
        let mut picker = TopicPicker::new(topics, 0);
        for _ in 0..draws {
            counts[picker.next_topic()] += 1;
        }
        // 10,000 expected a topic; a binomial's standard deviation is about 98.
        let expected = f64::from(draws) / topics as f64;
        for (topic, count) in counts.iter().enumerate() {
            let off = (f64::from(*count) - expected).abs();
            assert!(off < 600.0, "topic {topic}: {count} of {draws}");
        }
        let sequence = |worker| {
            let mut picker = TopicPicker::new(topics, worker);
            (0..64).map(|_| picker.next_topic()).collect::<Vec<_>>()
        };
        assert_eq!(sequence(3), sequence(3));
        assert_ne!(sequence(3), sequence(4));
    }

    #[test]
    fn payloads_are_exactly_their_size_and_json_when_they_fit() {
        assert_eq!(payload(3), b"xxx".to_vec());
        assert_eq!(payload(12), b"{\"bench\":\"\"}".to_vec());
        assert_eq!(payload(15), b"{\"bench\":\"xxx\"}".to_vec());
        assert_eq!(payload(1024).len(), 1024);
    }

    #[test]
    fn batch_bodies_embed_json_payloads_verbatim_and_quote_the_rest() {
        let keys = [Some("k1".to_string()), None];
        assert_eq!(
            String::from_utf8(batch_body(&payload(15), &keys)).unwrap(),
            "{\"messages\":[{\"key\":\"k1\",\"payload\":{\"bench\":\"xxx\"}},{\"payload\":{\"bench\":\"xxx\"}}]}"
        );
        assert_eq!(
            String::from_utf8(batch_body(b"xy", &[None])).unwrap(),
            "{\"messages\":[{\"payload\":\"xy\"}]}"
        );
        let estimate = batch_body_bytes_estimate(100, 1024, 16);
        let real = batch_body(&payload(1024), &vec![Some("k15".to_string()); 100]).len();
        assert!(estimate >= real, "{estimate} < {real}");
    }

    #[test]
    fn latency_percentiles_are_nearest_rank() {
        let nanos: Vec<u64> = (1..=1000).rev().map(|ms| ms * 1_000_000).collect();
        let summary = LatencySummary::from_nanos(nanos).unwrap();
        assert_eq!(
            summary,
            LatencySummary {
                count: 1000,
                p50_s: 0.5,
                p95_s: 0.95,
                p99_s: 0.99,
                max_s: 1.0
            }
        );
        assert_eq!(LatencySummary::from_nanos(vec![]), None);
        let one = LatencySummary::from_nanos(vec![7]).unwrap();
        assert_eq!((one.p50_s, one.p99_s), (7e-9, 7e-9));
    }

    #[test]
    fn the_report_computes_rates_and_fsyncs_per_record() {
        let report = Report {
            description: "d".to_string(),
            elapsed_s: 2.0,
            requests_ok: 1000,
            messages_ok: 1000,
            payload_bytes_ok: 1_024_000,
            errors: BTreeMap::from([("status 500".to_string(), 2)]),
            latency: None,
            node: Some(NodeFigures {
                accepted_records: 1000.0,
                wal_fsyncs: 40.0,
                partition_fsyncs: Some(10.0),
                ..NodeFigures::default()
            }),
            consume: None,
        };
        assert_eq!(report.msgs_per_s(), 500.0);
        assert_eq!(report.mb_per_s(), 0.512);
        assert_eq!(report.fsyncs_per_record(), Some(0.05));
        assert_eq!(report.errors_total(), 2);
        let text = report.text();
        assert!(
            text.contains(
                "  requests    1000 ok (1000 messages), 2 failed (2 status 500) in 2.00 s\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("  throughput  500.0 msgs/s, 0.51 MB/s of payload\n"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&report.json()).unwrap();
        assert_eq!(json["msgs_per_s"], 500.0);
        assert_eq!(json["node"]["fsyncs_per_record"], 0.05);
        assert_eq!(json["errors"]["status 500"], 2);
    }
}
