//! Micro-benchmark of the dispatcher's placement: records read, placed on their destination's queue,
//! committed and checkpointed per second on one core, against owners that answer at once.
//!
//! `cargo bench -p narad-core --bench placement` runs 1,000 partitions × 1,000,000 records with local
//! and with remote owners. Under `cargo test` (no `--bench` argument) it runs a small smoke pass.
//!
//! The dispatcher's share is measured two ways: wall-clock time inside `handle`/`poll_output`, and
//! on-CPU time (Linux `schedstat`, immune to other processes on a shared machine) of the whole loop
//! minus the on-CPU time of the same WAL reads and frees without a dispatcher.

// A benchmark measures time: the one place the core's crate reads a clock.
#![allow(clippy::disallowed_methods)]

use narad_core::codec::wal::ProduceRecord;
use narad_core::dispatcher::{
    Dispatcher, DispatcherConfig, DispatcherInput, DispatcherOutput, TopicPlacement,
    READ_BYTES_MAX, READ_RECORDS_MAX,
};
use narad_core::routing::partition_for_key;
use narad_core::{Actor, Instant, NodeId, Seq, TopicId};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

const PARTITIONS: u32 = 1_000;
const RECORDS: usize = 1_000_000;
const PAYLOAD_BYTES: usize = 100;
const REMOTE_NODES: u32 = 8;

/// Nanoseconds this thread has spent on a CPU (Linux `schedstat`), or `None` elsewhere.
fn on_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// The WAL's contents: every record encoded back to back (as in a segment), and where each starts.
struct Wal {
    bytes: Vec<u8>,
    starts: Vec<usize>,
}

impl Wal {
    fn new(count: usize) -> Wal {
        let mut bytes = Vec::new();
        let mut starts = Vec::with_capacity(count + 1);
        for seq in 0..count {
            starts.push(bytes.len());
            let key = format!("key-{seq}").into_bytes();
            ProduceRecord {
                topic: "bench".into(),
                topic_id: Some(TopicId(1)),
                partition: partition_for_key(&key, PARTITIONS),
                key: Some(key),
                timestamp_ms: 1_700_000_000_000,
                payload: vec![b'x'; PAYLOAD_BYTES],
            }
            .encode(&mut bytes);
        }
        starts.push(bytes.len());
        Wal { bytes, starts }
    }

    fn len(&self) -> usize {
        self.starts.len() - 1
    }

    /// A read as the WAL host answers it: each record copied out of the segment into its own buffer.
    fn read(&self, from: usize, max_records: usize, max_bytes: usize) -> Vec<(Seq, Vec<u8>)> {
        let mut frames = Vec::with_capacity(max_records.min(self.len() - from));
        let mut bytes = 0;
        for seq in from..self.len() {
            let record = &self.bytes[self.starts[seq]..self.starts[seq + 1]];
            if frames.len() == max_records || !frames.is_empty() && bytes + record.len() > max_bytes
            {
                break;
            }
            bytes += record.len();
            frames.push((Seq(seq as u64), record.to_vec()));
        }
        frames
    }
}

struct Run {
    /// Wall-clock time inside the dispatcher (`handle` and `poll_output`).
    busy: Duration,
    /// On-CPU time of the whole loop.
    cpu_ns: Option<u64>,
    commits: u64,
}

fn run(wal: &Wal, remote: bool) -> Run {
    let total = wal.len();
    let mut dispatcher = Dispatcher::new(DispatcherConfig {
        node: NodeId(0),
        checkpoint: Seq(0),
        durable_next: Seq(0),
        plant: narad_core::planted::Plant::NONE,
    });
    let mut now = Instant::ZERO;
    let owners = (0..PARTITIONS)
        .map(|p| Some(NodeId(if remote { 1 + p % REMOTE_NODES } else { 0 })))
        .collect();
    for node in 1..=REMOTE_NODES {
        dispatcher.handle(
            now,
            DispatcherInput::Member {
                node: NodeId(node),
                alive: true,
            },
        );
    }
    dispatcher.handle(
        now,
        DispatcherInput::Topic {
            name: "bench".into(),
            view: Some(TopicPlacement {
                topic_id: Some(TopicId(1)),
                owners,
            }),
        },
    );
    let mut inputs = VecDeque::from([DispatcherInput::Durable {
        next_seq: Seq(total as u64),
    }]);
    let mut pending = BTreeMap::new();
    let mut outputs = Vec::new();
    let mut commits = 0u64;
    let mut busy = Duration::ZERO;
    let cpu_started = on_cpu_ns();
    while let Some(input) = inputs.pop_front() {
        now = Instant::from_nanos(now.as_nanos() + 1_000);
        let landed = match &input {
            DispatcherInput::CommitDone { commit_id } => Some(*commit_id),
            _ => None,
        };
        let handled = std::time::Instant::now();
        dispatcher.handle(now, input);
        while let Some(output) = dispatcher.poll_output() {
            outputs.push(output);
        }
        busy += handled.elapsed();
        // A landed commit's records are freed here, by the driver whose WAL reads they were.
        if let Some(commit_id) = landed {
            pending.remove(&commit_id);
        }
        for output in outputs.drain(..) {
            match output {
                DispatcherOutput::ReadWal(read) => {
                    let frames = wal.read(read.from.0 as usize, read.max_records, read.max_bytes);
                    inputs.push_back(DispatcherInput::WalFrames { frames });
                }
                DispatcherOutput::SendCommit(commit) => {
                    commits += 1;
                    inputs.push_back(DispatcherInput::CommitDone {
                        commit_id: commit.commit_id,
                    });
                    pending.insert(commit.commit_id, commit);
                }
                DispatcherOutput::StoreCheckpoint { seq } => {
                    inputs.push_back(DispatcherInput::CheckpointStored { seq });
                }
                DispatcherOutput::ConfirmTopicGone { topic } => {
                    panic!("unexpected question about {topic}")
                }
                DispatcherOutput::Warn(warning) => panic!("unexpected warning {warning:?}"),
            }
        }
    }
    let cpu_ns = cpu_started.and_then(|started| Some(on_cpu_ns()? - started));
    assert_eq!(
        dispatcher.checkpoint(),
        Seq(total as u64),
        "every record dispatched"
    );
    Run {
        busy,
        cpu_ns,
        commits,
    }
}

/// The same WAL reads and frees without a dispatcher: the driver's share of the loop.
fn driver_only(wal: &Wal) -> Option<u64> {
    let started = on_cpu_ns()?;
    let mut from = 0;
    while from < wal.len() {
        let frames = wal.read(from, READ_RECORDS_MAX, READ_BYTES_MAX);
        from += frames.len();
        std::hint::black_box(&frames);
        drop(frames);
    }
    Some(on_cpu_ns()? - started)
}

fn median_best(mut rates: Vec<f64>) -> (f64, f64) {
    rates.sort_by(f64::total_cmp);
    (rates[rates.len() / 2], rates[rates.len() - 1])
}

fn main() {
    let bench = std::env::args().any(|arg| arg == "--bench");
    let (count, rounds) = if bench { (RECORDS, 7) } else { (20_000, 1) };
    println!(
        "dispatcher placement: {PARTITIONS} partitions, {count} records of {PAYLOAD_BYTES} B payload, \
         owners answering at once; {rounds} rounds, median (best), M records/s"
    );
    let wal = Wal::new(count);
    let driver_ns: Vec<u64> = (0..rounds).filter_map(|_| driver_only(&wal)).collect();
    let driver_ns = driver_ns.iter().copied().min();
    for remote in [false, true] {
        let mut wall = Vec::new();
        let mut cpu = Vec::new();
        let mut commits = 0;
        for _ in 0..rounds {
            let result = run(&wal, remote);
            wall.push(count as f64 / result.busy.as_secs_f64() / 1e6);
            if let (Some(total), Some(driver)) = (result.cpu_ns, driver_ns) {
                cpu.push(count as f64 / (total.saturating_sub(driver).max(1) as f64 / 1e9) / 1e6);
            }
            commits = result.commits;
        }
        let (wall_median, wall_best) = median_best(wall);
        print!(
            "  {:<6} owners: wall-clock in the dispatcher {wall_median:.2} ({wall_best:.2})",
            if remote { "remote" } else { "local" }
        );
        if !cpu.is_empty() {
            let (cpu_median, cpu_best) = median_best(cpu);
            print!("; on-CPU, loop minus driver {cpu_median:.2} ({cpu_best:.2})");
        }
        println!(
            "; {commits} commits, {:.0} records per commit",
            count as f64 / commits as f64
        );
    }
}
