//! JetStream publish load for `ci/bench-peers`.
//!
//! Creates STREAMS file-storage streams (`BENCH0`.. on subjects `bench.0`..), then runs PUBLISHERS
//! concurrent publishers for WARMUP + DURATION. Each publisher sends one SIZE-byte message to its
//! stream's subject (publisher i to stream i % STREAMS) and awaits its PubAck before the next, so a
//! message counts only once the server has stored it. Publishers share CONNECTIONS connections
//! (default: one each, like `redis-benchmark -c`).
//!
//! Prints one JSON object: `msgs_per_s` and the latency percentiles cover the messages acked inside
//! the measured window (after the warm-up); `acked_total` counts every ack, warm-up included, and
//! `stored` the messages the streams hold at the end. A failed publish (error or missing ack) is
//! counted in `errors` and the publisher carries on.
//!
//! Usage: nats-load [--server 127.0.0.1:4222] [--streams 1] [--publishers 64] [--connections N]
//!                  [--size 1024] [--duration 10s] [--warmup 2s]

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use bytes::Bytes;

struct Args {
    server: String,
    streams: usize,
    publishers: usize,
    connections: Option<usize>,
    size: usize,
    duration: Duration,
    warmup: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, scale) = if let Some(ms) = s.strip_suffix("ms") {
        (ms, 1e-3)
    } else if let Some(secs) = s.strip_suffix('s') {
        (secs, 1.0)
    } else {
        (s, 1.0)
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("bad duration {s:?} (e.g. 10s, 500ms)"))?;
    Ok(Duration::from_secs_f64(value * scale))
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        server: "127.0.0.1:4222".into(),
        streams: 1,
        publishers: 64,
        connections: None,
        size: 1024,
        duration: Duration::from_secs(10),
        warmup: Duration::from_secs(2),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{flag}: not a number: {value}"))
        };
        match flag.as_str() {
            "--server" => args.server = value.clone(),
            "--streams" => args.streams = number()?,
            "--publishers" => args.publishers = number()?,
            "--connections" => args.connections = Some(number()?),
            "--size" => args.size = number()?,
            "--duration" => args.duration = parse_duration(&value)?,
            "--warmup" => args.warmup = parse_duration(&value)?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if args.streams == 0 || args.publishers == 0 || args.connections == Some(0) {
        return Err("--streams, --publishers and --connections must be at least 1".into());
    }
    Ok(args)
}

/// What one publisher saw.
#[derive(Default)]
struct Tally {
    /// Latency of each message acked inside the measured window, in microseconds.
    latencies_us: Vec<u32>,
    acked_total: u64,
    errors: u64,
    errors_total: u64,
    first_error: Option<String>,
}

async fn publish_loop(
    js: jetstream::Context,
    subject: String,
    payload: Bytes,
    measure_from: Instant,
    end: Instant,
) -> Tally {
    let mut tally = Tally::default();
    loop {
        let sent = Instant::now();
        if sent >= end {
            return tally;
        }
        let outcome = match js.publish(subject.clone(), payload.clone()).await {
            Ok(ack) => ack.await,
            Err(err) => Err(err),
        };
        let done = Instant::now();
        let in_window = done >= measure_from && done <= end;
        match outcome {
            Ok(_) => {
                tally.acked_total += 1;
                if in_window {
                    let us = done.duration_since(sent).as_micros();
                    tally.latencies_us.push(us.min(u32::MAX as u128) as u32);
                }
            }
            Err(err) => {
                tally.errors_total += 1;
                if in_window {
                    tally.errors += 1;
                }
                tally.first_error.get_or_insert_with(|| err.to_string());
                // Do not spin on a broken connection.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

fn percentile_ms(sorted_us: &[u32], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted_us.len() as f64).ceil() as usize).clamp(1, sorted_us.len());
    sorted_us[rank - 1] as f64 / 1000.0
}

fn json_number(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "null".into()
    }
}

async fn run(args: Args) -> Result<(), async_nats::Error> {
    let connections = args
        .connections
        .unwrap_or(args.publishers)
        .min(args.publishers);
    let mut contexts = Vec::with_capacity(connections);
    for _ in 0..connections {
        contexts.push(jetstream::new(
            async_nats::connect(args.server.as_str()).await?,
        ));
    }
    let mut streams = Vec::with_capacity(args.streams);
    for i in 0..args.streams {
        let config = stream::Config {
            name: format!("BENCH{i}"),
            subjects: vec![format!("bench.{i}")],
            storage: stream::StorageType::File,
            ..Default::default()
        };
        streams.push(contexts[0].get_or_create_stream(config).await?);
    }

    let payload = Bytes::from(vec![b'x'; args.size]);
    let start = Instant::now();
    let measure_from = start + args.warmup;
    let end = measure_from + args.duration;
    let tasks: Vec<_> = (0..args.publishers)
        .map(|p| {
            let js = contexts[p % connections].clone();
            let subject = format!("bench.{}", p % args.streams);
            tokio::spawn(publish_loop(
                js,
                subject,
                payload.clone(),
                measure_from,
                end,
            ))
        })
        .collect();
    let mut latencies = Vec::new();
    let (mut acked_total, mut errors, mut errors_total, mut first_error) = (0, 0, 0, None);
    for task in tasks {
        let tally = task.await?;
        latencies.extend(tally.latencies_us);
        acked_total += tally.acked_total;
        errors += tally.errors;
        errors_total += tally.errors_total;
        first_error = first_error.or(tally.first_error);
    }
    latencies.sort_unstable();

    let mut stored = 0;
    for s in &mut streams {
        stored += s.info().await?.state.messages;
    }
    if let Some(err) = &first_error {
        eprintln!("nats-load: {errors_total} publishes failed; the first: {err}");
    }
    let secs = args.duration.as_secs_f64();
    let acked = latencies.len();
    println!(
        "{{\"streams\": {}, \"publishers\": {}, \"connections\": {}, \"size\": {}, \"duration_s\": {}, \
         \"warmup_s\": {}, \"acked\": {}, \"msgs_per_s\": {}, \"p50_ms\": {}, \"p99_ms\": {}, \
         \"max_ms\": {}, \"errors\": {}, \"acked_total\": {}, \"errors_total\": {}, \"stored\": {}}}",
        args.streams,
        args.publishers,
        connections,
        args.size,
        json_number(secs),
        json_number(args.warmup.as_secs_f64()),
        acked,
        json_number(acked as f64 / secs),
        json_number(percentile_ms(&latencies, 0.50)),
        json_number(percentile_ms(&latencies, 0.99)),
        json_number(percentile_ms(&latencies, 1.0)),
        errors,
        acked_total,
        errors_total,
        stored,
    );
    Ok(())
}

#[tokio::main]
async fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(err) => {
            eprintln!("nats-load: {err}");
            std::process::exit(2);
        }
    };
    if let Err(err) = run(args).await {
        eprintln!("nats-load: {err}");
        std::process::exit(1);
    }
}
