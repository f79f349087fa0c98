//! Crash-recovery property test over `SimDisk`.
//!
//! Per seed: several lives of one WAL on one simulated disk. Each life opens the WAL (recovery), checks
//! what it recovered against the model, then runs random single and batch appends (some fills fail),
//! random I/O progress one op at a time on random lanes (so group commits batch at random), clock
//! moves, synced checkpoints (compaction) and reads, with fsync EIO / write EIO / ENOSPC injected on
//! some lives. A life ends in a power loss (`SimDisk::crash`: torn writes, holes in prepared segments,
//! lost unsynced creates and renames) or in a process restart without one (the page cache survives,
//! including pages an fsync failure dropped). After each reopen:
//! - every acknowledged record (and every record an earlier open recovered) is there, byte-exact, at its
//!   sequence number, unless compaction removed it behind the synced checkpoint;
//! - nothing is recovered that was never appended, was withdrawn, or is recovered twice;
//! - sequence numbers are dense (reads walk them one by one);
//! - a disk fault on the append path latched the WAL at once, and no append in a failed batch was
//!   acknowledged (each append gets exactly one answer).
//!
//! Seeds: `NARAD_WAL_CRASH_SEEDS` (default 2,000 per mode), or one seed with `NARAD_WAL_CRASH_SEED`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::disk::sim::{DiskFault, FaultRule, SimDisk};
use crate::disk::{Disk, IoId};
use crate::wal::driver::{open_wal, SyncDriver};

const SEEDS_ENV: &str = "NARAD_WAL_CRASH_SEEDS";
const SEED_ENV: &str = "NARAD_WAL_CRASH_SEED";
const SEEDS_DEFAULT: u64 = 2_000;
const LANE_APPEND: IoLane = IoLane(0);
const LANE_READ: IoLane = IoLane(2);

#[test]
fn crash_recovery_keeps_every_acknowledged_record() {
    run_seeds("crash_recovery_keeps_every_acknowledged_record", false);
}

#[test]
fn crash_recovery_keeps_every_acknowledged_record_in_prepared_segments() {
    run_seeds(
        "crash_recovery_keeps_every_acknowledged_record_in_prepared_segments",
        true,
    );
}

fn run_seeds(test: &str, prealloc: bool) {
    let seeds: Vec<u64> = match std::env::var(SEED_ENV) {
        Ok(seed) => vec![seed.parse().expect("NARAD_WAL_CRASH_SEED is a number")],
        Err(_) => {
            let count = std::env::var(SEEDS_ENV)
                .ok()
                .map(|count| count.parse().expect("NARAD_WAL_CRASH_SEEDS is a number"))
                .unwrap_or(SEEDS_DEFAULT);
            (0..count).collect()
        }
    };
    let mut total = Coverage::default();
    let seed_count = seeds.len();
    for seed in seeds {
        let outcome = std::panic::catch_unwind(|| Scenario::new(seed, prealloc).run());
        match outcome {
            Ok(coverage) => total.add(&coverage),
            Err(panic) => {
                eprintln!(
                    "WAL crash property failed at seed {seed}. Rerun: \
                     {SEED_ENV}={seed} cargo test -p narad-core --lib wal::tests::crash::{test} -- --exact --nocapture"
                );
                std::panic::resume_unwind(panic);
            }
        }
    }
    eprintln!("{test}: {seed_count} seeds, {total:?}");
    if seed_count >= 500 {
        // A property that never meets the faults it is about proves nothing.
        assert!(
            total.acked > 0 && total.crashes > 0 && total.torn_tails > 0,
            "{total:?}"
        );
        assert!(
            total.latches > 0 && total.sync_eio_latches > 0 && total.rolls > 0,
            "{total:?}"
        );
        assert!(total.recovered_unacked > 0, "{total:?}");
        if prealloc {
            assert!(
                total.prepared_rolls > 0 && total.holes_truncated > 0,
                "{total:?}"
            );
        }
    }
}

/// What the seeds exercised, summed (printed with `--nocapture`).
#[derive(Clone, Debug, Default)]
struct Coverage {
    acked: u64,
    crashes: u64,
    restarts: u64,
    latches: u64,
    sync_eio_latches: u64,
    torn_tails: u64,
    /// Torn tails in a prepared segment with valid frames behind the bad one.
    holes_truncated: u64,
    rolls: u64,
    prepared_rolls: u64,
    recovered_unacked: u64,
    reads: u64,
}

impl Coverage {
    fn add(&mut self, other: &Coverage) {
        self.acked += other.acked;
        self.crashes += other.crashes;
        self.restarts += other.restarts;
        self.latches += other.latches;
        self.sync_eio_latches += other.sync_eio_latches;
        self.torn_tails += other.torn_tails;
        self.holes_truncated += other.holes_truncated;
        self.rolls += other.rolls;
        self.prepared_rolls += other.prepared_rolls;
        self.recovered_unacked += other.recovered_unacked;
        self.reads += other.reads;
    }
}

/// What became of an appended record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// No answer yet (or never: the life ended first). May or may not be on disk.
    Pending,
    /// Acknowledged durable at this seq.
    Acked(Seq),
    /// Its append failed on a disk fault; it may survive (at-least-once), never acknowledged.
    Failed,
    /// Its batch's fill failed at or after a roll inside the call: it may have been synced before the
    /// roll, or withdrawn.
    MaybeWithdrawn,
    /// Never staged (the fill failed at or before it, or the append was refused): must never appear.
    Withdrawn,
}

struct Scenario {
    seed: u64,
    rng: ChaCha8Rng,
    disk: SimDisk,
    config: WalConfig,
    now: Instant,
    records: Vec<Vec<u8>>,
    fates: Vec<Fate>,
    /// Appends not answered yet, with their record numbers.
    appends: BTreeMap<AppendId, Vec<usize>>,
    next_append: u64,
    /// Sequence numbers known durable (acknowledged, or recovered and repaired) → record number.
    durable: BTreeMap<Seq, usize>,
    /// The synced checkpoint (stored and fed back at every open).
    checkpoint: Seq,
    reads: Vec<Result<Vec<WalFrame>, WalReadError>>,
    coverage: Coverage,
    /// Roll requests already counted in this life.
    counted: BTreeSet<IoId>,
}

impl Scenario {
    fn new(seed: u64, prealloc: bool) -> Scenario {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ if prealloc { 0x5eed_0001 } else { 0 });
        let segment_bytes_max = [16 * 1024, 32 * 1024, 64 * 1024][rng.random_range(0..3)];
        let config = WalConfig {
            dir: "wal".to_string(),
            segment_bytes_max,
            record_bytes_max: 6_000,
            staging_bytes_max: 16 * 1024,
            unflushed_bytes_max: 256 * 1024,
            sync_interval_ms: 10,
            // Half the seeds wait for the cohort (up to 3 ms; time moves in whole ms here).
            commit_delay_us_max: [0, 3_000][rng.random_range(0..2)],
            commit_siblings_min: 2,
            commit_delay_flush_percent: 50,
            commit_delay_flush_bytes_max: 64 * 1024,
            prealloc,
            prepared_write_run_bytes_max: [8 * 1024, 16 * 1024][rng.random_range(0..2)],
            rotate_dispatched_active_after_bytes: 8 * 1024,
            index_interval_bytes: [256, 4096][rng.random_range(0..2)],
            reads_in_flight_max: 4,
            lanes: WalLanes::default(),
            plant: crate::planted::Plant::NONE,
        };
        Scenario {
            seed,
            rng,
            disk: SimDisk::new(seed),
            config,
            now: Instant::ZERO,
            records: Vec::new(),
            fates: Vec::new(),
            appends: BTreeMap::new(),
            next_append: 0,
            durable: BTreeMap::new(),
            checkpoint: Seq(0),
            reads: Vec::new(),
            coverage: Coverage::default(),
            counted: BTreeSet::new(),
        }
    }

    fn run(mut self) -> Coverage {
        let lives = self.rng.random_range(2..=4);
        for _ in 0..lives {
            self.life();
        }
        let disk = self.disk.clone();
        let driver = self.open(&disk);
        drop(driver);
        self.coverage
    }

    /// Opens the WAL, completes its repair and checks what it recovered.
    fn open<'d>(&mut self, disk: &'d SimDisk) -> SyncDriver<'d, IngressWal> {
        let opened = open_wal(disk, self.config.clone(), self.checkpoint)
            .unwrap_or_else(|error| panic!("seed {}: open failed: {error}", self.seed));
        if let Some(torn) = &opened.report.torn_tail {
            self.coverage.torn_tails += 1;
            if self.config.prealloc && torn.bytes_dropped > 0 {
                let path = self.config.segment_path(torn.segment);
                let image = disk.read_at(&path, 0, usize::MAX).unwrap_or_default();
                if has_valid_frame_after(&image, torn.offset as usize) {
                    self.coverage.holes_truncated += 1;
                }
            }
        }
        let mut driver = SyncDriver::new(disk, opened.wal, self.now);
        driver.run_until_idle();
        assert!(
            !driver.actor().is_latched(),
            "the repair ran on a healthy disk"
        );
        let outputs = driver.take_outputs();
        self.absorb(outputs);
        self.verify(&mut driver);
        driver
    }

    fn life(&mut self) {
        let disk = self.disk.clone();
        let mut driver = self.open(&disk);
        self.inject_faults();
        let steps = self.rng.random_range(10..150);
        for _ in 0..steps {
            self.step(&mut driver);
        }
        if driver.actor().is_latched() {
            self.coverage.latches += 1;
            if driver.actor().latch_fault() == Some(&IoFault::Eio) {
                self.coverage.sync_eio_latches += 1;
            }
        }
        if self.rng.random_ratio(1, 2) {
            // Often stop between a group commit's write and its sync.
            self.run_op(&mut driver, LANE_APPEND);
        }
        drop(driver);
        disk.clear_faults();
        if self.rng.random_ratio(3, 4) {
            disk.crash();
            self.coverage.crashes += 1;
        } else {
            self.coverage.restarts += 1;
        }
        // Appends still unanswered keep an unknown fate: they may be on disk or not.
        self.appends.clear();
        self.counted.clear();
    }

    fn inject_faults(&mut self) {
        let segments = format!("{}/0", self.config.dir);
        let spare = format!("{}/next", self.config.dir);
        let mut rules = Vec::new();
        if self.rng.random_ratio(1, 4) {
            rules.push((segments.clone(), DiskFault::SyncEio));
        }
        if self.rng.random_ratio(1, 10) {
            rules.push((segments.clone(), DiskFault::WriteEio));
        }
        if self.rng.random_ratio(1, 10) {
            rules.push((segments, DiskFault::NoSpace));
        }
        if self.config.prealloc && self.rng.random_ratio(1, 5) {
            rules.push((spare, DiskFault::NoSpace));
        }
        for (path_prefix, kind) in rules {
            self.disk.add_fault(FaultRule {
                path_prefix,
                kind,
                chance_ppm: self.rng.random_range(50_000..400_000),
                remaining: Some(1),
            });
        }
    }

    fn step(&mut self, driver: &mut SyncDriver<'_, IngressWal>) {
        match self.rng.random_range(0..100) {
            0..30 => self.append_one(driver),
            30..42 => self.append_batch(driver),
            42..80 => {
                let lanes = driver.busy_lanes();
                if !lanes.is_empty() {
                    let lane = lanes[self.rng.random_range(0..lanes.len())];
                    self.run_op(driver, lane);
                }
            }
            80..86 => {
                let lanes = driver.busy_lanes();
                if !lanes.is_empty() {
                    let lane = lanes[self.rng.random_range(0..lanes.len())];
                    while driver.head(lane).is_some() && self.run_op(driver, lane) {}
                }
            }
            86..92 => {
                self.now += Duration::from_millis(self.rng.random_range(0..15));
                driver.advance_to(self.now);
            }
            92..96 => {
                let durable = driver.actor().durable_next_seq();
                let seq = Seq(self.rng.random_range(self.checkpoint.0..=durable.0));
                driver.handle(WalInput::CheckpointSynced { seq });
                self.checkpoint = seq;
            }
            _ => self.read_some(driver),
        }
        let outputs = driver.take_outputs();
        self.absorb(outputs);
    }

    /// Runs one op of `lane`'s head request; a disk fault on the append path must latch at once.
    /// Returns false when the request completed.
    fn run_op(&mut self, driver: &mut SyncDriver<'_, IngressWal>, lane: IoLane) -> bool {
        let head = driver.head(lane).map(|request| request.id);
        if let Some(request) = driver.head(lane) {
            let roll = request
                .ops
                .iter()
                .any(|op| matches!(op, IoOp::Create { .. }));
            let spare = request
                .ops
                .iter()
                .any(|op| matches!(op, IoOp::Rename { .. }));
            if lane == LANE_APPEND && (roll || spare) && self.counted.insert(request.id) {
                self.coverage.rolls += 1;
                self.coverage.prepared_rolls += u64::from(spare);
            }
        }
        let faults = self.disk.stats().faults;
        driver.run_op(lane);
        if lane == LANE_APPEND && self.disk.stats().faults > faults {
            assert!(
                driver.actor().is_latched(),
                "a disk fault on the append path latches"
            );
        }
        driver.head(lane).map(|request| request.id) == head
    }

    fn new_record(&mut self) -> usize {
        let number = self.records.len();
        let len = if self.rng.random_ratio(1, 5) {
            self.rng
                .random_range(1_000..=self.config.record_bytes_max - 8)
        } else {
            self.rng.random_range(0..200)
        };
        let mut bytes = (number as u64).to_be_bytes().to_vec();
        bytes.extend((0..len).map(|_| self.rng.random::<u8>()));
        self.records.push(bytes);
        self.fates.push(Fate::Pending);
        number
    }

    fn append_id(&mut self) -> AppendId {
        self.next_append += 1;
        AppendId(self.next_append)
    }

    fn append_one(&mut self, driver: &mut SyncDriver<'_, IngressWal>) {
        let number = self.new_record();
        let id = self.append_id();
        self.appends.insert(id, vec![number]);
        let record = self.records[number].clone();
        driver.handle(WalInput::Append { id, record });
    }

    fn append_batch(&mut self, driver: &mut SyncDriver<'_, IngressWal>) {
        let count = self.rng.random_range(1..=6);
        let numbers: Vec<usize> = (0..count).map(|_| self.new_record()).collect();
        let failing = self
            .rng
            .random_ratio(1, 5)
            .then(|| self.rng.random_range(0..count));
        let id = self.append_id();
        self.appends.insert(id, numbers.clone());
        let records: Vec<Vec<u8>> = numbers.iter().map(|&n| self.records[n].clone()).collect();
        let sizes = records.iter().map(Vec::len).collect();
        let fill: FillFn = Box::new(move |index, out| {
            if Some(index) == failing {
                return Err(FillError::Failed("planned".into()));
            }
            out.copy_from_slice(&records[index]);
            Ok(())
        });
        driver.handle(WalInput::AppendMany { id, sizes, fill });
    }

    fn absorb(&mut self, outputs: Vec<WalOutput>) {
        for output in outputs {
            match output {
                WalOutput::AppendDone { id, result } => {
                    let numbers = self
                        .appends
                        .remove(&id)
                        .unwrap_or_else(|| panic!("append {id:?} answered twice or never made"));
                    self.settle(numbers, result);
                }
                WalOutput::ReadDone { result, .. } => self.reads.push(result),
                WalOutput::Io(request) => panic!("the driver keeps requests: {request:?}"),
                WalOutput::Durable { .. } | WalOutput::Latched { .. } | WalOutput::Warning(_) => {}
            }
        }
    }

    fn settle(&mut self, numbers: Vec<usize>, result: Result<SeqRange, AppendError>) {
        match result {
            Ok(range) => {
                assert_eq!(range.len(), numbers.len() as u64);
                for (offset, &number) in numbers.iter().enumerate() {
                    let seq = Seq(range.first.0 + offset as u64);
                    assert_eq!(self.fates[number], Fate::Pending);
                    self.fates[number] = Fate::Acked(seq);
                    self.coverage.acked += 1;
                    self.note_durable(seq, number);
                }
            }
            Err(AppendError::Disk(_)) => {
                for number in numbers {
                    self.fates[number] = Fate::Failed;
                }
            }
            Err(AppendError::Fill { index, .. }) => {
                for (position, number) in numbers.into_iter().enumerate() {
                    self.fates[number] = if position < index {
                        Fate::MaybeWithdrawn
                    } else {
                        Fate::Withdrawn
                    };
                }
            }
            Err(AppendError::Overloaded { .. }) => {
                for number in numbers {
                    self.fates[number] = Fate::Withdrawn;
                }
            }
            Err(error) => panic!("unexpected append error {error}"),
        }
    }

    fn note_durable(&mut self, seq: Seq, number: usize) {
        if let Some(previous) = self.durable.insert(seq, number) {
            assert_eq!(
                previous, number,
                "seq {seq} was durable with record {previous}, now holds record {number}"
            );
        }
    }

    /// Reads a random stretch of durable records and checks them against the model.
    fn read_some(&mut self, driver: &mut SyncDriver<'_, IngressWal>) {
        let oldest = driver.actor().oldest_segment_first_seq();
        let durable = driver.actor().durable_next_seq();
        if oldest >= durable {
            return;
        }
        let from = Seq(self.rng.random_range(oldest.0..durable.0));
        let max_records = self.rng.random_range(1..20);
        let frames = self.read(driver, from, max_records);
        self.check_frames(from, &frames);
        self.coverage.reads += 1;
    }

    /// One read, running only the read lane until it is answered.
    fn read(
        &mut self,
        driver: &mut SyncDriver<'_, IngressWal>,
        from: Seq,
        max_records: usize,
    ) -> Vec<WalFrame> {
        let id = WalReadId(from.0);
        driver.handle(WalInput::Read {
            id,
            from,
            max_records,
            max_bytes: 64 * 1024,
        });
        loop {
            let outputs = driver.take_outputs();
            self.absorb(outputs);
            if let Some(result) = self.reads.pop() {
                let frames =
                    result.unwrap_or_else(|error| panic!("read from {from} failed: {error}"));
                assert!(
                    !frames.is_empty(),
                    "a read below the durable frontier returns a record"
                );
                return frames;
            }
            assert!(
                driver.run_request(LANE_READ),
                "a read waits on the read lane"
            );
        }
    }

    fn check_frames(&mut self, from: Seq, frames: &[WalFrame]) {
        for (offset, frame) in frames.iter().enumerate() {
            assert_eq!(
                frame.seq,
                Seq(from.0 + offset as u64),
                "reads return dense seqs"
            );
            let number = self.identify(&frame.payload, frame.seq);
            match self.fates[number] {
                Fate::Withdrawn => {
                    panic!("record {number} was withdrawn but is at seq {}", frame.seq)
                }
                Fate::Acked(seq) => assert_eq!(seq, frame.seq, "record {number} moved"),
                Fate::Pending | Fate::Failed | Fate::MaybeWithdrawn => {}
            }
            if let Some(&known) = self.durable.get(&frame.seq) {
                assert_eq!(known, number, "seq {} changed record", frame.seq);
            }
        }
    }

    /// The record these bytes are, or a failure: the WAL invented them.
    fn identify(&self, bytes: &[u8], seq: Seq) -> usize {
        let number = bytes
            .get(..8)
            .map(|prefix| u64::from_be_bytes(prefix.try_into().expect("8 bytes")) as usize)
            .filter(|&number| number < self.records.len() && self.records[number] == bytes);
        number.unwrap_or_else(|| panic!("seq {seq} holds bytes that were never appended"))
    }

    /// After an open: reads every record left and checks the promises.
    fn verify(&mut self, driver: &mut SyncDriver<'_, IngressWal>) {
        let oldest = driver.actor().oldest_segment_first_seq();
        let next = driver.actor().durable_next_seq();
        assert!(
            oldest <= self.checkpoint,
            "segment {oldest} is past the synced checkpoint {}",
            self.checkpoint
        );
        let mut recovered = Vec::new();
        let mut from = oldest;
        while from < next {
            let frames = self.read(driver, from, 10_000);
            self.check_frames(from, &frames);
            from = Seq(from.0 + frames.len() as u64);
            recovered.extend(frames);
        }
        let mut seen = BTreeSet::new();
        for frame in &recovered {
            let number = self.identify(&frame.payload, frame.seq);
            assert!(seen.insert(number), "record {number} recovered twice");
        }
        for (&seq, &number) in &self.durable {
            if seq < oldest {
                assert!(
                    seq < self.checkpoint,
                    "durable seq {seq} lost below the oldest segment"
                );
                continue;
            }
            let index = (seq.0 - oldest.0) as usize;
            let frame = recovered.get(index).unwrap_or_else(|| {
                panic!("durable seq {seq} (record {number}) lost; next is {next}")
            });
            assert_eq!(
                frame.payload, self.records[number],
                "durable seq {seq} changed"
            );
        }
        // What an open recovered and repaired is durable from now on.
        for frame in recovered {
            let number = self.identify(&frame.payload, frame.seq);
            if !matches!(self.fates[number], Fate::Acked(_))
                && !self.durable.contains_key(&frame.seq)
            {
                self.coverage.recovered_unacked += 1;
            }
            self.note_durable(frame.seq, number);
        }
    }
}

/// True when a CRC-valid frame starts anywhere after `offset` in `image` (a hole, not a plain tail).
fn has_valid_frame_after(image: &[u8], offset: usize) -> bool {
    (offset + 1..image.len()).any(|start| crate::codec::wal::decode_frame(&image[start..]).is_ok())
}
