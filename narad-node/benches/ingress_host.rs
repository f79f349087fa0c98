//! WAL host throughput against a minimal group-commit baseline, side by side in one process.
//!
//! `cargo bench -p narad-node --bench ingress_host` runs, for prealloc off and on and for 1 / 8 / 64 / 256
//! concurrent appenders of 1 KiB records, the WAL host over `FsDisk` and a baseline (one flusher thread:
//! one `pwrite` + one `fdatasync` of whatever is staged, in the same file mode) on the same directory,
//! alternating, and prints the medians: acks/s (with the range over the runs), records per fsync (the
//! host counts `fdatasync`s of segment files), p50/p99 latency; "vs base" is the ratio of the medians.
//!
//! Knobs (environment): `NARAD_BENCH_SECS` (seconds per run, default 1), `NARAD_BENCH_REPEATS` (runs per
//! system and row, default 3; medians are reported), `NARAD_BENCH_APPENDERS` (comma list, default
//! `1,8,64,256`), `NARAD_BENCH_PREALLOC` (`off`, `on` or `both`, default `both`), `NARAD_BENCH_DIR`
//! (where the files go, default cargo's target tmp dir: keep it on the disk you mean to measure, not a
//! tmpfs). Without `--bench` (as `cargo test --all-targets` runs it) it does one short smoke row.
//!
//! Targets (from the issue): at 64 appenders the host reaches ≥ 0.9× the baseline's acks/s in the same
//! file mode, with ≥ 25 records per fsync.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use narad_core::disk::{Disk, DiskLayer};
use narad_core::wal::WalConfig;
use narad_core::IoFault;
use narad_node::clock::Clock;
use narad_node::fs_disk::FsDisk;
use narad_node::ingress::{IngressHost, IngressHostConfig};
use tokio::sync::oneshot;
use tokio::time::Instant;

const RECORD_BYTES: usize = 1024;
const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
const WAL_DIR: &str = "wal";
/// Pause after deleting a row's files, so their cleanup does not land in the next row's first run.
const SETTLE: Duration = Duration::from_millis(500);

struct Settings {
    run: Duration,
    repeats: usize,
    appenders: Vec<usize>,
    prealloc: Vec<bool>,
    root: PathBuf,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(default)
}

fn settings() -> Settings {
    let full = std::env::args().any(|arg| arg == "--bench");
    let root = std::env::var("NARAD_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    if !full {
        return Settings {
            run: Duration::from_millis(200),
            repeats: 1,
            appenders: vec![8],
            prealloc: vec![false],
            root,
        };
    }
    let appenders = std::env::var("NARAD_BENCH_APPENDERS")
        .ok()
        .map(|text| {
            text.split(',')
                .filter_map(|part| part.trim().parse().ok())
                .collect()
        })
        .unwrap_or_else(|| vec![1, 8, 64, 256]);
    let prealloc = match std::env::var("NARAD_BENCH_PREALLOC").as_deref() {
        Ok("off") => vec![false],
        Ok("on") => vec![true],
        _ => vec![false, true],
    };
    Settings {
        run: Duration::from_secs_f64(env_or("NARAD_BENCH_SECS", 1.0)),
        repeats: env_or("NARAD_BENCH_REPEATS", 3usize).max(1),
        appenders,
        prealloc,
        root,
    }
}

/// One run's figures.
#[derive(Clone, Copy, Debug, Default)]
struct Figures {
    acks_per_second: f64,
    records_per_fsync: f64,
    p50_us: f64,
    p99_us: f64,
}

fn figures(acks: u64, fsyncs: u64, elapsed: Duration, mut latencies_ns: Vec<u64>) -> Figures {
    latencies_ns.sort_unstable();
    let quantile = |q: f64| {
        if latencies_ns.is_empty() {
            return 0.0;
        }
        let index = ((latencies_ns.len() as f64 - 1.0) * q).round() as usize;
        latencies_ns[index] as f64 / 1_000.0
    };
    Figures {
        acks_per_second: acks as f64 / elapsed.as_secs_f64(),
        records_per_fsync: acks as f64 / fsyncs.max(1) as f64,
        p50_us: quantile(0.50),
        p99_us: quantile(0.99),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn median_figures(runs: &[Figures]) -> Figures {
    Figures {
        acks_per_second: median(runs.iter().map(|run| run.acks_per_second).collect()),
        records_per_fsync: median(runs.iter().map(|run| run.records_per_fsync).collect()),
        p50_us: median(runs.iter().map(|run| run.p50_us).collect()),
        p99_us: median(runs.iter().map(|run| run.p99_us).collect()),
    }
}

// ---------------------------------------------------------------------------------------------------
// The WAL host.

/// FsDisk that counts `sync_data` calls on segment files (the group commits and rolls).
struct CountingDisk {
    inner: FsDisk,
    segment_syncs: AtomicU64,
}

impl DiskLayer for CountingDisk {
    fn inner(&self) -> &dyn Disk {
        &self.inner
    }
    fn sync_data(&self, path: &str) -> Result<(), IoFault> {
        if path.ends_with(".wal") {
            self.segment_syncs.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.sync_data(path)
    }
}

async fn run_host(dir: &Path, appenders: usize, prealloc: bool, run: Duration) -> Figures {
    let disk = Arc::new(CountingDisk {
        inner: FsDisk::new(dir).expect("bench dir"),
        segment_syncs: AtomicU64::new(0),
    });
    let config = IngressHostConfig::new(WalConfig {
        dir: WAL_DIR.to_string(),
        prealloc,
        ..WalConfig::default()
    });
    let (host, _) = IngressHost::open(disk.clone(), config, Clock::start())
        .await
        .expect("open the WAL");
    if prealloc {
        // Fill the first (created, not prepared) segment so the measured appends overwrite a prepared one.
        let batch = vec![vec![1u8; RECORD_BYTES]; 1000];
        let records_per_segment = SEGMENT_BYTES / RECORD_BYTES as u64;
        while host.durable_next_seq().0 < records_per_segment + 2000 {
            host.append_many(batch.clone()).await.expect("warm-up");
        }
    }
    let syncs_before = disk.segment_syncs.load(Ordering::Relaxed);
    let started = Instant::now();
    let stop_at = started + run;
    let mut tasks = Vec::with_capacity(appenders);
    for _ in 0..appenders {
        let host = host.clone();
        tasks.push(tokio::spawn(async move {
            let record = vec![7u8; RECORD_BYTES];
            let mut latencies = Vec::new();
            while Instant::now() < stop_at {
                let sent = Instant::now();
                host.append(record.clone()).await.expect("append");
                latencies.push(sent.elapsed().as_nanos() as u64);
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("appender"));
    }
    let elapsed = started.elapsed();
    let fsyncs = disk.segment_syncs.load(Ordering::Relaxed) - syncs_before;
    host.shutdown().await.expect("shutdown");
    figures(latencies.len() as u64, fsyncs, elapsed, latencies)
}

// ---------------------------------------------------------------------------------------------------
// The baseline: one flusher thread, one write + one fdatasync of whatever is staged.

#[derive(Default)]
struct Staged {
    bytes: Vec<u8>,
    waiters: Vec<oneshot::Sender<()>>,
}

struct Baseline {
    staged: Mutex<Staged>,
    wake: Condvar,
    stop: AtomicBool,
    fsyncs: AtomicU64,
}

/// The flusher: appends to a growing file (rolling to a new one at 64 MiB, with a directory fsync), or,
/// in prealloc mode, overwrites a zero-filled 64 MiB file in place, wrapping around.
fn flusher(baseline: Arc<Baseline>, dir: PathBuf, prealloc: bool) {
    let open = |index: u64| -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(!prealloc)
            .open(dir.join(format!("{index:020}.base")))
            .expect("baseline file")
    };
    let mut file_index = 0;
    let mut file = open(file_index);
    let mut offset = 0u64;
    let mut spare = Staged::default();
    loop {
        {
            let mut staged = baseline.staged.lock().expect("lock");
            while staged.bytes.is_empty() && !baseline.stop.load(Ordering::Relaxed) {
                staged = baseline.wake.wait(staged).expect("lock");
            }
            if staged.bytes.is_empty() {
                return;
            }
            std::mem::swap(&mut *staged, &mut spare);
        }
        if offset + spare.bytes.len() as u64 > SEGMENT_BYTES {
            if prealloc {
                offset = 0;
            } else {
                file_index += 1;
                file = open(file_index);
                File::open(&dir)
                    .and_then(|directory| directory.sync_all())
                    .expect("dir fsync");
                offset = 0;
            }
        }
        file.write_all_at(&spare.bytes, offset).expect("write");
        file.sync_data().expect("fdatasync");
        baseline.fsyncs.fetch_add(1, Ordering::Relaxed);
        offset += spare.bytes.len() as u64;
        spare.bytes.clear();
        for waiter in spare.waiters.drain(..) {
            let _ = waiter.send(());
        }
    }
}

async fn run_baseline(dir: &Path, appenders: usize, prealloc: bool, run: Duration) -> Figures {
    let dir = dir.join(WAL_DIR);
    std::fs::create_dir_all(&dir).expect("baseline dir");
    if prealloc {
        let file = File::create(dir.join(format!("{:020}.base", 0))).expect("prepare");
        let zeros = vec![0u8; 1 << 20];
        for chunk in 0..SEGMENT_BYTES / (1 << 20) {
            file.write_all_at(&zeros, chunk << 20).expect("zero-fill");
        }
        file.sync_all().expect("sync the prepared file");
    }
    let baseline = Arc::new(Baseline {
        staged: Mutex::new(Staged::default()),
        wake: Condvar::new(),
        stop: AtomicBool::new(false),
        fsyncs: AtomicU64::new(0),
    });
    let thread = {
        let baseline = Arc::clone(&baseline);
        std::thread::spawn(move || flusher(baseline, dir, prealloc))
    };
    let started = Instant::now();
    let stop_at = started + run;
    let mut tasks = Vec::with_capacity(appenders);
    for _ in 0..appenders {
        let baseline = Arc::clone(&baseline);
        tasks.push(tokio::spawn(async move {
            let record = vec![7u8; RECORD_BYTES];
            let mut latencies = Vec::new();
            while Instant::now() < stop_at {
                let sent = Instant::now();
                let (done, durable) = oneshot::channel();
                {
                    let mut staged = baseline.staged.lock().expect("lock");
                    staged.bytes.extend_from_slice(&record);
                    staged.waiters.push(done);
                }
                baseline.wake.notify_one();
                durable.await.expect("flushed");
                latencies.push(sent.elapsed().as_nanos() as u64);
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("appender"));
    }
    let elapsed = started.elapsed();
    let fsyncs = baseline.fsyncs.load(Ordering::Relaxed);
    baseline.stop.store(true, Ordering::Relaxed);
    baseline.wake.notify_one();
    thread.join().expect("flusher");
    figures(latencies.len() as u64, fsyncs, elapsed, latencies)
}

// ---------------------------------------------------------------------------------------------------

fn main() {
    let settings = settings();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    std::fs::create_dir_all(&settings.root).expect("bench root");
    println!(
        "WAL host vs baseline group commit: {} B records, {:.1} s per run, median of {} runs, files under {}",
        RECORD_BYTES,
        settings.run.as_secs_f64(),
        settings.repeats,
        settings.root.display()
    );
    println!(
        "{:<9} {:>9} {:<9} {:>11} {:>17} {:>10} {:>9} {:>9} {:>8}",
        "prealloc",
        "appenders",
        "system",
        "acks/s",
        "(min..max)",
        "rec/fsync",
        "p50 µs",
        "p99 µs",
        "vs base"
    );
    let mut verdicts = Vec::new();
    for &prealloc in &settings.prealloc {
        for &appenders in &settings.appenders {
            let mut host_runs = Vec::new();
            let mut base_runs = Vec::new();
            // Every run gets a fresh directory, kept until the row ends: deleting files (a discard on
            // some mounts) right before the other system's run would slow its fsyncs. The order
            // alternates so neither system always runs first.
            let mut dirs = Vec::new();
            for repeat in 0..settings.repeats {
                for host_turn in [repeat % 2 == 0, repeat % 2 == 1] {
                    let dir = tempfile::tempdir_in(&settings.root).expect("run dir");
                    if host_turn {
                        let run = run_host(dir.path(), appenders, prealloc, settings.run);
                        host_runs.push(runtime.block_on(run));
                    } else {
                        let run = run_baseline(dir.path(), appenders, prealloc, settings.run);
                        base_runs.push(runtime.block_on(run));
                    }
                    dirs.push(dir);
                }
            }
            drop(dirs);
            runtime.block_on(async { tokio::time::sleep(SETTLE).await });
            let host = median_figures(&host_runs);
            let base = median_figures(&base_runs);
            let ratio = host.acks_per_second / base.acks_per_second.max(f64::MIN_POSITIVE);
            let mode = if prealloc { "on" } else { "off" };
            for (system, row, runs, versus) in [
                ("host", host, &host_runs, format!("{ratio:.2}x")),
                ("baseline", base, &base_runs, String::new()),
            ] {
                let acks = runs.iter().map(|run| run.acks_per_second);
                let low = acks.clone().fold(f64::INFINITY, f64::min);
                let high = acks.fold(0.0, f64::max);
                println!(
                    "{:<9} {:>9} {:<9} {:>11.0} {:>17} {:>10.1} {:>9.0} {:>9.0} {:>8}",
                    mode,
                    appenders,
                    system,
                    row.acks_per_second,
                    format!("({low:.0}..{high:.0})"),
                    row.records_per_fsync,
                    row.p50_us,
                    row.p99_us,
                    versus
                );
            }
            if appenders == 64 {
                let met = ratio >= 0.9 && host.records_per_fsync >= 25.0;
                verdicts.push(format!(
                    "prealloc {mode}, 64 appenders: host/baseline {ratio:.2} (target >= 0.90), {:.1} records/fsync (target >= 25): {}",
                    host.records_per_fsync,
                    if met { "met" } else { "NOT met" }
                ));
            }
        }
    }
    for verdict in verdicts {
        println!("{verdict}");
    }
}
