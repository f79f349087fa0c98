//! The retention soak (`ci/soak`; a two-minute version runs in `.ci/run`): one node, then a
//! three-node cluster, under constant produce and queue-mode consume into a topic bounded by
//! `retention_bytes`. Every 10 s it samples the data directories' size, the processes' resident
//! memory and open descriptors, and the produce latency's p99 over the last interval, prints the
//! table (and an SVG of it when `SOAK_SVG` names a file), and asserts that none of them grows once the
//! first bound is reached: the last third of the run stays within the first two thirds' peak, with a
//! margin, and descriptors stay under a ceiling.
//!
//! `SOAK_SECS` sets each half's length (default 60).

#![allow(clippy::disallowed_methods)] // A soak measures real processes over wall-clock time.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use narad_tests::cluster::Cluster;
use narad_tests::{Node, Response};

/// Retention checks every second; 256 KiB partition segments; 1 MiB per partition kept.
const ENV: [(&str, &str); 2] = [
    ("NARAD_STORAGE_RETENTION_CHECK_INTERVAL_MS", "1000"),
    ("NARAD_STORAGE_PARTITION_SEGMENT_BYTES", "262144"),
];
const SAMPLE: Duration = Duration::from_secs(10);
const PRODUCERS: usize = 2;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_narad"))
}

fn soak_secs() -> u64 {
    std::env::var("SOAK_SECS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(60)
}

/// One sample of the processes under test.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    at_s: u64,
    data_dir_bytes: u64,
    rss_bytes: u64,
    fds: u64,
    produced: u64,
    consumed: u64,
    p99_ms: f64,
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => dir_bytes(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0,
        })
        .sum()
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

fn fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |entries| entries.count() as u64)
}

/// What the load threads share with the sampler.
#[derive(Default)]
struct Load {
    stop: AtomicBool,
    produced: AtomicU64,
    consumed: AtomicU64,
    /// Produce latencies (µs) since the last sample.
    latencies: Mutex<Vec<u64>>,
}

/// One HTTP exchange with the node at `addr`; `None` when it failed.
fn call(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Option<Response> {
    narad_tests::http(addr, method, path, &[], body).ok()
}

/// Producers and a consumer against the nodes at `addrs` (each thread takes them in turn); joined
/// once `load.stop` is set.
fn start_load(addrs: Vec<SocketAddr>, load: &Arc<Load>) -> Vec<std::thread::JoinHandle<()>> {
    let addrs = Arc::new(addrs);
    let mut threads = Vec::new();
    for producer in 0..PRODUCERS {
        let (load, addrs) = (load.clone(), addrs.clone());
        threads.push(std::thread::spawn(move || {
            let payload = "p".repeat(500);
            let mut turn = producer;
            while !load.stop.load(Ordering::Relaxed) {
                let addr = addrs[turn % addrs.len()];
                turn += 1;
                let messages: Vec<String> = (0..50)
                    .map(|i| format!(r#"{{"key":"k{i}","payload":"{payload}"}}"#))
                    .collect();
                let body = format!(r#"{{"messages":[{}]}}"#, messages.join(","));
                let started = Instant::now();
                let answer = call(
                    addr,
                    "POST",
                    "/v1/topics/soak/produce/batch",
                    body.as_bytes(),
                );
                let took = started.elapsed().as_micros() as u64;
                let answer = answer.expect("produce");
                assert_eq!(answer.status, 202, "{}", answer.text());
                load.produced.fetch_add(50, Ordering::Relaxed);
                load.latencies.lock().unwrap().push(took);
            }
        }));
    }
    let (load, addrs) = (load.clone(), addrs.clone());
    threads.push(std::thread::spawn(move || {
        let mut turn = 0;
        while !load.stop.load(Ordering::Relaxed) {
            let addr = addrs[turn % addrs.len()];
            turn += 1;
            let Some(answer) = call(addr, "GET", "/v1/topics/soak/consume?wait=1s", b"") else {
                continue;
            };
            if answer.status != 200 {
                continue;
            }
            let handle = answer.json()["receipt_handle"]
                .as_str()
                .expect("handle")
                .to_string();
            let path = format!("/v1/topics/soak/ack?receipt_handle={handle}");
            let acked = call(addr, "POST", &path, b"").expect("ack");
            // 410: the lease ran out, or retention removed the record while it was leased.
            assert!(matches!(acked.status, 204 | 410), "{}", acked.text());
            load.consumed.fetch_add(1, Ordering::Relaxed);
        }
    }));
    threads
}

fn stop(load: &Load, threads: Vec<std::thread::JoinHandle<()>>) {
    load.stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("load thread");
    }
}

fn p99_ms(mut latencies: Vec<u64>) -> f64 {
    if latencies.is_empty() {
        return 0.0;
    }
    latencies.sort_unstable();
    let index = (latencies.len() * 99).div_ceil(100).saturating_sub(1);
    latencies[index] as f64 / 1000.0
}

/// Samples every 10 s for `secs`; `measure` gives (data dir bytes, rss, fds) of the processes.
fn run_samples(secs: u64, load: &Arc<Load>, measure: impl Fn() -> (u64, u64, u64)) -> Vec<Sample> {
    let started = Instant::now();
    let mut samples = Vec::new();
    while started.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(SAMPLE);
        let (data_dir_bytes, rss_bytes, fds) = measure();
        let latencies = std::mem::take(&mut *load.latencies.lock().unwrap());
        samples.push(Sample {
            at_s: started.elapsed().as_secs(),
            data_dir_bytes,
            rss_bytes,
            fds,
            produced: load.produced.load(Ordering::Relaxed),
            consumed: load.consumed.load(Ordering::Relaxed),
            p99_ms: p99_ms(latencies),
        });
    }
    samples
}

fn table(title: &str, samples: &[Sample]) -> String {
    let mut out = format!("{title}\n");
    let _ = writeln!(
        out,
        "{:>6} {:>14} {:>10} {:>5} {:>10} {:>10} {:>9}",
        "t_s", "data_dir_MiB", "rss_MiB", "fds", "produced", "consumed", "p99_ms"
    );
    for s in samples {
        let _ = writeln!(
            out,
            "{:>6} {:>14.1} {:>10.1} {:>5} {:>10} {:>10} {:>9.1}",
            s.at_s,
            s.data_dir_bytes as f64 / 1_048_576.0,
            s.rss_bytes as f64 / 1_048_576.0,
            s.fds,
            s.produced,
            s.consumed,
            s.p99_ms
        );
    }
    out
}

/// A plain SVG of the data directory size and RSS over time (no plotting library needed).
fn svg(title: &str, samples: &[Sample]) -> String {
    let (width, height) = (640.0, 240.0);
    let t_max = samples.last().map_or(1, |s| s.at_s.max(1)) as f64;
    let y_max = samples
        .iter()
        .map(|s| s.data_dir_bytes.max(s.rss_bytes))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let line = |value: fn(&Sample) -> u64| {
        samples
            .iter()
            .map(|s| {
                format!(
                    "{:.1},{:.1}",
                    s.at_s as f64 / t_max * width,
                    height - value(s) as f64 / y_max * height
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{}\">\
         <text x=\"4\" y=\"14\" font-size=\"12\">{title}: data dir (blue), RSS (red); max {:.1} MiB</text>\
         <g transform=\"translate(0,20)\">\
         <polyline fill=\"none\" stroke=\"blue\" points=\"{}\"/>\
         <polyline fill=\"none\" stroke=\"red\" points=\"{}\"/></g></svg>\n",
        height + 20.0,
        y_max / 1_048_576.0,
        line(|s| s.data_dir_bytes),
        line(|s| s.rss_bytes),
    )
}

/// Descriptors one process may hold at any sample: the disk's handle cache (256, emptied when
/// full) and the node's own sockets, logs and listeners, with room to spare; a leak passes it.
const FDS_PER_PROCESS_MAX: u64 = 512;

/// The last third of the samples stays within the rest's peak, with a margin (the WAL's and the
/// journal's segments roll and trim, so the data directory saws; a leak grows past any margin over
/// a long soak); descriptors stay under their ceiling throughout.
fn assert_flat(title: &str, samples: &[Sample], processes: u64) {
    assert!(samples.len() >= 3, "{title}: too few samples");
    let split = samples.len() - samples.len() / 3;
    let (early, late) = samples.split_at(split);
    let peak = |f: fn(&Sample) -> u64, part: &[Sample]| part.iter().map(f).max().unwrap_or(0);
    type Check = (&'static str, fn(&Sample) -> u64, u64);
    let checks: [Check; 2] = [
        ("data dir bytes", |s| s.data_dir_bytes, 32 << 20),
        ("rss bytes", |s| s.rss_bytes, 32 << 20),
    ];
    for (what, f, margin) in checks {
        let (before, after) = (peak(f, early), peak(f, late));
        assert!(
            after <= before + before / 2 + margin,
            "{title}: {what} grew from a peak of {before} to {after}"
        );
    }
    let fds = peak(|s| s.fds, samples);
    assert!(
        fds <= FDS_PER_PROCESS_MAX * processes,
        "{title}: {fds} descriptors open"
    );
    let p99 = |part: &[Sample]| part.iter().map(|s| s.p99_ms).fold(0.0, f64::max);
    assert!(
        p99(late) <= 3.0 * p99(early) + 50.0,
        "{title}: produce p99 rose from {:.1} ms to {:.1} ms",
        p99(early),
        p99(late)
    );
    let consumed = late.last().unwrap().consumed;
    assert!(
        consumed > early.last().unwrap().consumed,
        "{title}: consumers stalled"
    );
}

fn report(title: &str, samples: &[Sample], processes: u64) {
    println!("{}", table(title, samples));
    if let Ok(path) = std::env::var("SOAK_SVG") {
        let path = format!("{path}.{}.svg", title.replace(' ', "-"));
        std::fs::write(&path, svg(title, samples)).expect("write the SVG");
        println!("svg: {path}");
    }
    assert_flat(title, samples, processes);
}

#[test]
#[ignore = "a soak: ci/soak runs it (SOAK_SECS per half)"]
fn retention_keeps_disk_memory_descriptors_and_latency_flat_under_constant_load() {
    let secs = soak_secs();
    // One node.
    let node = Node::start_with_env(binary(), &ENV);
    let created = node.post(
        "/v1/topics",
        br#"{"name":"soak","partitions":3,"retention_bytes":1048576}"#,
    );
    assert_eq!(created.status, 201, "{}", created.text());
    let data_dir = node.data_dir().to_path_buf();
    let pid = node.pid();
    let load = Arc::new(Load::default());
    let threads = start_load(vec![node.addr()], &load);
    let samples = run_samples(secs, &load, || {
        (dir_bytes(&data_dir), rss_bytes(pid), fds(pid))
    });
    stop(&load, threads);
    report("one node", &samples, 1);
    drop(node);

    // A three-node cluster, produce and consume through every member.
    let cluster = Cluster::start_with_env(binary(), 3, "soak-secret", |_| {
        ENV.iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect()
    });
    cluster.create_topic_retrying(1, "soak", 3);
    let altered = cluster
        .node(1)
        .patch("/v1/topics/soak", br#"{"retention_bytes":1048576}"#);
    assert_eq!(altered.status, 200, "{}", altered.text());
    let load = Arc::new(Load::default());
    let addrs = cluster
        .ids()
        .into_iter()
        .map(|id| cluster.node(id).addr())
        .collect();
    let threads = start_load(addrs, &load);
    let members: Vec<(std::path::PathBuf, u32)> = cluster
        .ids()
        .into_iter()
        .map(|id| {
            (
                cluster.node(id).data_dir().to_path_buf(),
                cluster.node(id).pid(),
            )
        })
        .collect();
    let samples = run_samples(secs, &load, || {
        members
            .iter()
            .fold((0, 0, 0), |(dir, rss, fd), (path, pid)| {
                (dir + dir_bytes(path), rss + rss_bytes(*pid), fd + fds(*pid))
            })
    });
    stop(&load, threads);
    report("three-node cluster", &samples, 3);
}
