//! Tests of the owner journal and its replay: exact outputs of the journal actor, and a crash
//! harness that runs the real [`Owner`] (combiners, journaled logs, the journal) over a [`SimDisk`]
//! that tears, loses unsynced writes and fails fsyncs, replays the journal after each power loss,
//! and checks that every acknowledged record reads back at its offset.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::replay::{JournalReplay, ReplayConfig, ReplayOutput, ReplayReport};
use super::*;
use crate::disk::execute;
use crate::disk::sim::{DiskFault, FaultRule, SimDisk};
use crate::ids::{NodeId, PartitionId};
use crate::metastore::{Command, MetaState};
use crate::partition::owner::{Owner, OwnerConfig, OwnerInput, OwnerOutput, OwnerRead};
use crate::partition::{BatchId, BatchRecord, CombinerConfig, CommitBatch, LogReadId};

const HERE: NodeId = NodeId(1);

fn run(key: u64, id: u64, bytes: &[u8], end: u64) -> (LogKey, LogCommitId, JournalRun) {
    (
        LogKey(key),
        LogCommitId(id),
        JournalRun {
            segment: Offset(0),
            position: 0,
            bytes: bytes.to_vec(),
            frames: vec![(0, bytes.len(), Offset(end))],
        },
    )
}

/// A frame of one record at `base`.
fn frame(base: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    crate::codec::partition::encode_frame(
        &mut out,
        Offset(base),
        &[crate::codec::partition::RecordView {
            key: None,
            committed_at_ms: 1,
            payload,
        }],
    );
    out
}

fn append(journal: &mut OwnerJournal, key: u64, id: u64, base: u64) {
    let bytes = frame(base, b"payload");
    let (key, id, run) = run(key, id, &bytes, base + 1);
    let dir: Arc<str> = Arc::from(format!("topics/t/1/p{:05}", key.0).as_str());
    journal.handle(Instant::ZERO, JournalInput::Append { key, dir, id, run });
}

fn drain(journal: &mut OwnerJournal) -> Vec<JournalOutput> {
    std::iter::from_fn(|| journal.poll_output()).collect()
}

fn io(outputs: &[JournalOutput]) -> Vec<IoRequest> {
    outputs
        .iter()
        .filter_map(|output| match output {
            JournalOutput::Io(request) => Some(request.clone()),
            _ => None,
        })
        .collect()
}

fn done(outputs: &[JournalOutput]) -> Vec<(u64, u64, bool)> {
    outputs
        .iter()
        .filter_map(|output| match output {
            JournalOutput::Done { key, id, result } => Some((key.0, id.0, result.is_ok())),
            _ => None,
        })
        .collect()
}

#[test]
fn appends_during_a_flush_share_the_next_flush_and_answers_wait_for_its_fsync() {
    let disk = SimDisk::new(1);
    let mut journal = OwnerJournal::new(JournalConfig::new());
    append(&mut journal, 1, 10, 0);
    let first = io(&drain(&mut journal));
    assert_eq!(first.len(), 1);
    let ops: Vec<&str> = first[0].ops.iter().map(op_name).collect();
    // Small flushes: zeros written ahead, so the next flushes' fsyncs change no file size.
    assert_eq!(
        ops,
        ["mkdir", "create", "write", "zeros", "sync", "syncdir", "read"]
    );
    // Three logs append while the first flush is in flight: nothing is written for them yet.
    append(&mut journal, 2, 20, 0);
    append(&mut journal, 3, 30, 5);
    append(&mut journal, 1, 11, 1);
    assert!(drain(&mut journal).is_empty(), "one flush at a time");
    let completion = execute(&disk, &first[0]);
    journal.handle(Instant::ZERO, JournalInput::Io(completion));
    let outputs = drain(&mut journal);
    assert_eq!(done(&outputs), [(1, 10, true)]);
    let second = io(&outputs);
    assert_eq!(second.len(), 1, "the three appends share one flush");
    let ops: Vec<&str> = second[0].ops.iter().map(op_name).collect();
    assert_eq!(
        ops,
        ["write", "sync", "read"],
        "the name is durable already"
    );
    let syncs_before = disk.stats().syncs;
    let completion = execute(&disk, &second[0]);
    assert_eq!(
        disk.stats().syncs - syncs_before,
        1,
        "one fsync for three partitions"
    );
    journal.handle(Instant::ZERO, JournalInput::Io(completion));
    assert_eq!(
        done(&drain(&mut journal)),
        [(2, 20, true), (3, 30, true), (1, 11, true)]
    );
}

fn op_name(op: &IoOp) -> &'static str {
    match op {
        IoOp::Create { .. } => "create",
        IoOp::CreateDirAll { .. } => "mkdir",
        IoOp::WriteAt { .. } => "write",
        IoOp::WriteZeros { .. } => "zeros",
        IoOp::ReadAt { .. } | IoOp::ReadCrc { .. } => "read",
        IoOp::Len { .. } => "len",
        IoOp::SetLen { .. } => "setlen",
        IoOp::SyncData { .. } => "sync",
        IoOp::SyncDir { .. } => "syncdir",
        IoOp::Rename { .. } => "rename",
        IoOp::Remove { .. } => "remove",
        IoOp::List { .. } => "list",
    }
}

#[test]
fn a_failed_fsync_fails_the_flush_cuts_it_off_durably_and_a_failed_cut_latches() {
    let disk = SimDisk::new(2);
    let mut journal = OwnerJournal::new(JournalConfig::new());
    append(&mut journal, 1, 1, 0);
    let request = io(&drain(&mut journal)).remove(0);
    journal.handle(Instant::ZERO, JournalInput::Io(execute(&disk, &request)));
    let _ = drain(&mut journal);
    disk.add_fault(FaultRule {
        path_prefix: String::new(),
        kind: DiskFault::SyncEio,
        chance_ppm: 1_000_000,
        remaining: Some(2),
    });
    append(&mut journal, 2, 2, 0);
    let request = io(&drain(&mut journal)).remove(0);
    journal.handle(Instant::ZERO, JournalInput::Io(execute(&disk, &request)));
    let outputs = drain(&mut journal);
    assert_eq!(done(&outputs), [(2, 2, false)], "never acknowledged");
    let repair = io(&outputs).remove(0);
    let position = first_entry_len();
    assert_eq!(
        repair.ops,
        vec![
            IoOp::SetLen {
                path: format!("{JOURNAL_DIR}/{}", journal_segment_name(0)),
                len: position,
            },
            IoOp::SyncData {
                path: format!("{JOURNAL_DIR}/{}", journal_segment_name(0)),
            },
        ],
        "the failed flush is cut back to the last durable byte, and that synced"
    );
    // The repair's own sync fails too: latched, appends refused until the retry interval.
    journal.handle(Instant::ZERO, JournalInput::Io(execute(&disk, &repair)));
    assert!(journal.latched());
    let _ = drain(&mut journal);
    append(&mut journal, 3, 3, 0);
    assert_eq!(done(&drain(&mut journal)), [(3, 3, false)]);
    // Past the interval the next append retries the repair first, then flushes behind it.
    let later = Instant::ZERO + REPAIR_RETRY_INTERVAL;
    let bytes = frame(0, b"payload");
    let (key, id, run) = run(4, 4, &bytes, 1);
    journal.handle(
        later,
        JournalInput::Append {
            key,
            dir: Arc::from("d"),
            id,
            run,
        },
    );
    let repair = io(&drain(&mut journal)).remove(0);
    assert!(matches!(repair.ops[0], IoOp::SetLen { len, .. } if len == position));
    journal.handle(later, JournalInput::Io(execute(&disk, &repair)));
    let flush = io(&drain(&mut journal)).remove(0);
    journal.handle(later, JournalInput::Io(execute(&disk, &flush)));
    assert_eq!(done(&drain(&mut journal)), [(4, 4, true)]);
}

fn first_entry_len() -> u64 {
    entry_len("topics/t/1/p00001", frame(0, b"payload").len()) as u64
}

#[test]
fn a_sealed_segment_is_removed_only_once_every_log_it_holds_has_synced_past_it() {
    let disk = SimDisk::new(3);
    let entry = first_entry_len();
    let mut config = JournalConfig::new();
    // One entry per segment; one sealed segment of slack.
    config.segment_bytes_max = entry;
    config.sealed_segments_kept = 1;
    let mut journal = OwnerJournal::new(config);
    let flush = |journal: &mut OwnerJournal, key: u64, id: u64, base: u64| {
        append(journal, key, id, base);
        let outputs = drain(journal);
        let request = io(&outputs).remove(0);
        journal.handle(Instant::ZERO, JournalInput::Io(execute(&disk, &request)));
        drain(journal)
    };
    // Segments 0 (log 1) and 1 (log 2): one sealed, within the slack.
    let outputs = flush(&mut journal, 1, 1, 0);
    assert_eq!(done(&outputs), [(1, 1, true)]);
    let outputs = flush(&mut journal, 2, 2, 0);
    assert!(!outputs
        .iter()
        .any(|o| matches!(o, JournalOutput::SyncWanted { .. })));
    // Segment 2: two sealed, so log 1 (the oldest's only pin) is asked to sync.
    let outputs = flush(&mut journal, 2, 3, 1);
    let wanted: Vec<u64> = outputs
        .iter()
        .filter_map(|o| match o {
            JournalOutput::SyncWanted { key } => Some(key.0),
            _ => None,
        })
        .collect();
    assert_eq!(wanted, [1]);
    assert!(io(&outputs).is_empty(), "nothing removed before the sync");
    // A sync short of the pin releases nothing.
    journal.handle(
        Instant::ZERO,
        JournalInput::Synced {
            key: LogKey(1),
            through: Offset(0),
        },
    );
    assert!(io(&drain(&mut journal)).is_empty());
    journal.handle(
        Instant::ZERO,
        JournalInput::Synced {
            key: LogKey(1),
            through: Offset(1),
        },
    );
    let trim = io(&drain(&mut journal)).remove(0);
    let ops: Vec<&str> = trim.ops.iter().map(op_name).collect();
    assert_eq!(ops, ["remove", "syncdir"]);
    assert!(
        matches!(&trim.ops[0], IoOp::Remove { path } if path.ends_with(&journal_segment_name(0)))
    );
    journal.handle(Instant::ZERO, JournalInput::Io(execute(&disk, &trim)));
    assert_eq!(journal.segments(), 2);
    // A released log (its directory removed) pins nothing either.
    let outputs = flush(&mut journal, 3, 4, 0);
    assert!(outputs
        .iter()
        .any(|o| matches!(o, JournalOutput::SyncWanted { key } if key.0 == 2)));
    journal.handle(Instant::ZERO, JournalInput::Released { key: LogKey(2) });
    let trim = io(&drain(&mut journal)).remove(0);
    assert!(
        matches!(&trim.ops[0], IoOp::Remove { path } if path.ends_with(&journal_segment_name(1)))
    );
}

#[test]
fn appends_past_the_journal_byte_limit_are_refused_until_trims_catch_up() {
    let disk = SimDisk::new(4);
    let mut config = JournalConfig::new();
    config.journal_bytes_max = first_entry_len() * 2;
    let mut journal = OwnerJournal::new(config);
    for id in 0..3 {
        append(&mut journal, 1, id, id);
        let outputs = drain(&mut journal);
        for request in io(&outputs) {
            journal.handle(Instant::ZERO, JournalInput::Io(execute(&disk, &request)));
        }
        let outputs = [outputs, drain(&mut journal)].concat();
        let expected = id < 2;
        assert_eq!(done(&outputs), [(1, id, expected)], "append {id}");
    }
}

// ---- the crash harness ----

fn owner_state(partitions: u32) -> MetaState {
    let mut state = MetaState::new();
    let member = Command::AddMember {
        node: HERE,
        addr: "n1".into(),
    };
    state.apply(&member).expect("member");
    let create = crate::metastore::create_command("t", partitions);
    state.apply(&create).expect("created");
    state
}

struct Crash {
    disk: SimDisk,
    rng: ChaCha8Rng,
    owner: Owner,
    state: Arc<MetaState>,
    pending: Vec<(LogKey, IoRequest)>,
    /// Acknowledged records: (partition, offset) -> payload.
    acked: BTreeMap<(u32, u64), Vec<u8>>,
    /// Commits waiting for an answer: batch id -> (partition, payloads).
    waiting: BTreeMap<u64, (u32, Vec<Vec<u8>>)>,
    reads: BTreeMap<u64, Result<crate::partition::ReadBatch, String>>,
    next_batch: u64,
    partitions: u32,
    replays: Vec<ReplayReport>,
    journal_config: JournalConfig,
    /// Advances a little each step, so latched logs and failed syncs are retried.
    now: Instant,
}

impl Crash {
    fn new(seed: u64) -> Crash {
        let disk = SimDisk::new(seed);
        let mut journal_config = JournalConfig::new();
        journal_config.segment_bytes_max = 2048;
        journal_config.sealed_segments_kept = 1;
        let partitions = 3;
        let state = Arc::new(owner_state(partitions));
        let owner = Crash::owner(&journal_config, 0);
        let mut harness = Crash {
            disk,
            rng: ChaCha8Rng::seed_from_u64(seed),
            owner,
            state,
            pending: Vec::new(),
            acked: BTreeMap::new(),
            waiting: BTreeMap::new(),
            reads: BTreeMap::new(),
            next_batch: 0,
            partitions,
            replays: Vec::new(),
            journal_config,
            now: Instant::ZERO,
        };
        let state = harness.state.clone();
        harness.input(OwnerInput::Replica(state));
        harness
    }

    fn owner(journal: &JournalConfig, first_seq: u64) -> Owner {
        let mut combiner = CombinerConfig::new(1_700_000_000_000);
        combiner.log.segment_bytes_max = 1024;
        let mut journal = journal.clone();
        journal.first_seq = first_seq;
        Owner::new(OwnerConfig {
            node: HERE,
            combiner,
            journal: Some(journal),
            retention_check_interval: crate::partition::owner::RETENTION_CHECK_INTERVAL_DEFAULT,
        })
    }

    fn input(&mut self, input: OwnerInput) {
        self.now += std::time::Duration::from_millis(5);
        self.owner.handle(self.now, input);
        while let Some(output) = self.owner.poll_output() {
            match output {
                OwnerOutput::Io { key, request } => self.pending.push((key, request)),
                OwnerOutput::Committed { id, result } => {
                    let (partition, payloads) = self.waiting.remove(&id.0).expect("waited");
                    if let Ok(range) = result {
                        for (index, payload) in payloads.into_iter().enumerate() {
                            let offset = range.base.0 + index as u64;
                            let previous = self.acked.insert((partition, offset), payload);
                            assert!(previous.is_none(), "offset {offset} acknowledged twice");
                        }
                    }
                }
                OwnerOutput::ReadDone { id, result } => {
                    self.reads
                        .insert(id.0, result.map_err(|error| error.to_string()));
                }
                OwnerOutput::Log {
                    event: crate::partition::owner::LogEvent::OpenFailed { error, .. },
                    ..
                } => panic!("a partition log failed to open after a replay: {error}"),
                OwnerOutput::Forget { .. }
                | OwnerOutput::Journal(_)
                | OwnerOutput::Log { .. }
                | OwnerOutput::RetentionChecked { .. }
                | OwnerOutput::FreezeArmed { .. } => {}
            }
        }
    }

    fn commit(&mut self) {
        let partition = self.rng.random_range(0..self.partitions);
        let count = self.rng.random_range(1..4);
        let payloads: Vec<Vec<u8>> = (0..count)
            .map(|_| {
                let len = self.rng.random_range(10..300);
                let tag = format!("b{}-", self.next_batch);
                let mut payload = tag.into_bytes();
                payload.resize(len, b'x');
                payload
            })
            .collect();
        let id = self.next_batch;
        self.next_batch += 1;
        self.waiting.insert(id, (partition, payloads.clone()));
        let topic_id = self.state.topic("t").map(|record| record.id);
        self.input(OwnerInput::Commit {
            topic: Arc::from("t"),
            partition: PartitionId(partition),
            batch: CommitBatch {
                id: BatchId(id),
                records: payloads
                    .into_iter()
                    .map(|payload| BatchRecord {
                        topic_id,
                        key: None,
                        payload,
                    })
                    .collect(),
                deadline: None,
            },
        });
    }

    /// Runs one request at the head of a random (key, lane).
    fn step_io(&mut self) -> bool {
        let heads: Vec<usize> = (0..self.pending.len())
            .filter(|&index| {
                let (key, request) = &self.pending[index];
                !self.pending[..index]
                    .iter()
                    .any(|(k, r)| k == key && r.lane == request.lane)
            })
            .collect();
        if heads.is_empty() {
            // A cohort wait holds staged appends: its deadline (under the 5 ms each input advances
            // the clock) has passed.
            // (The retention check's timer is always set: only a deadline the next input reaches
            // counts.)
            let next = self.now + std::time::Duration::from_millis(5);
            if self.owner.poll_timeout().is_some_and(|at| at <= next) {
                self.input(OwnerInput::Tick);
                return true;
            }
            return false;
        }
        let index = heads[self.rng.random_range(0..heads.len())];
        let (key, request) = self.pending.remove(index);
        let completion = execute(&self.disk, &request);
        self.input(OwnerInput::IoDone { key, completion });
        true
    }

    fn settle(&mut self) {
        while self.step_io() {}
    }

    /// Power loss: the owner is gone with everything unsynced; the journal is replayed (itself
    /// crashed part-way at times, then replayed again) and a new owner opens the logs.
    fn crash_and_recover(&mut self) {
        self.disk.crash();
        self.pending.clear();
        self.waiting.clear();
        let report = loop {
            match self.replay() {
                Some(report) => break report,
                None => self.disk.crash(),
            }
        };
        let first_seq = report.next_seq;
        self.replays.push(report);
        self.owner = Crash::owner(&self.journal_config, first_seq);
        let state = self.state.clone();
        self.input(OwnerInput::Replica(state));
        self.settle();
        self.check_every_acked_record();
    }

    /// Runs a replay; `None` when it was crashed part-way.
    fn replay(&mut self) -> Option<ReplayReport> {
        let mut replay = JournalReplay::start(ReplayConfig::new(JOURNAL_DIR));
        loop {
            let output = replay
                .poll_output()
                .expect("a replay always has a next step");
            match output {
                ReplayOutput::Io(request) => {
                    if self.rng.random_ratio(1, 200) {
                        return None;
                    }
                    let completion = execute(&self.disk, &request);
                    replay.handle(Instant::ZERO, completion);
                }
                ReplayOutput::Done(report) => return Some(report),
                ReplayOutput::Failed(fault) => panic!("replay failed: {fault}"),
            }
        }
    }

    fn check_every_acked_record(&mut self) {
        let topic_id = self.state.topic("t").expect("topic").id;
        for partition in 0..self.partitions {
            let expected: Vec<(u64, Vec<u8>)> = self
                .acked
                .range((partition, 0)..(partition + 1, 0))
                .map(|(&(_, offset), payload)| (offset, payload.clone()))
                .collect();
            for (offset, payload) in expected {
                let id = 1_000_000 + offset + u64::from(partition) * 100_000;
                self.input(OwnerInput::Read(OwnerRead {
                    id: LogReadId(id),
                    topic: Arc::from("t"),
                    topic_id,
                    partition: PartitionId(partition),
                    offset: Offset(offset),
                    records_max: 1,
                    bytes_max: 1 << 20,
                }));
                self.settle();
                let read = self.reads.remove(&id).expect("answered");
                let batch = read.unwrap_or_else(|error| {
                    panic!("acknowledged p{partition}@{offset} unreadable after a crash: {error}")
                });
                assert_eq!(batch.first, Offset(offset));
                assert_eq!(
                    batch.records[0].payload, payload,
                    "p{partition}@{offset} holds another record"
                );
            }
        }
    }
}

fn crash_run(seed: u64, faults: bool) -> (usize, Vec<ReplayReport>) {
    let mut h = Crash::new(seed);
    h.settle();
    if faults {
        h.disk.add_fault(FaultRule {
            path_prefix: String::new(),
            kind: DiskFault::SyncEio,
            chance_ppm: 100_000,
            remaining: None,
        });
    }
    for step in 0..3_000 {
        match h.rng.random_range(0..100) {
            0..=34 if h.waiting.len() < 12 => h.commit(),
            35 if step > 100 => {
                // Faults heal at the crash: the recovery must run on a working disk.
                h.disk.clear_faults();
                h.crash_and_recover();
                if faults {
                    h.disk.add_fault(FaultRule {
                        path_prefix: String::new(),
                        kind: DiskFault::SyncEio,
                        chance_ppm: 100_000,
                        remaining: None,
                    });
                }
            }
            _ => {
                h.step_io();
            }
        }
    }
    h.disk.clear_faults();
    h.crash_and_recover();
    (h.acked.len(), h.replays)
}

#[test]
fn every_acknowledged_record_survives_power_loss_through_the_journal() {
    let mut acked = 0;
    let mut replayed = 0;
    let mut entries = 0;
    for seed in 1..=12 {
        let (count, replays) = crash_run(seed, false);
        acked += count;
        replayed += replays.len();
        entries += replays.iter().map(|report| report.entries).sum::<u64>();
        for report in &replays {
            assert!(report.gaps.is_empty(), "seed {seed}: {:?}", report.gaps);
            assert!(
                report.damaged.is_empty(),
                "seed {seed}: {:?}",
                report.damaged
            );
        }
    }
    assert!(acked > 2_000, "the runs acknowledge records ({acked})");
    assert!(
        replayed > 100 && entries > 500,
        "crashes replay ({replayed}, {entries})"
    );
}

#[test]
fn every_acknowledged_record_survives_failed_fsyncs_and_power_loss() {
    let mut acked = 0;
    for seed in 100..=110 {
        let (count, _) = crash_run(seed, true);
        acked += count;
    }
    assert!(acked > 1_000, "the runs acknowledge records ({acked})");
}

#[test]
fn lazy_syncs_are_asked_for_a_bounded_number_of_logs_at_a_time() {
    let disk = SimDisk::new(5);
    let logs = SYNCS_ASKED_MAX as u64 + 4;
    let mut config = JournalConfig::new();
    config.segment_bytes_max = first_entry_len() * logs;
    config.sealed_segments_kept = 0;
    let mut journal = OwnerJournal::new(config);
    let mut wanted = Vec::new();
    // One segment of `logs` logs' entries, then one more entry seals it.
    for key in 1..=logs + 1 {
        append(&mut journal, key, key, 0);
        for output in drain(&mut journal) {
            match output {
                JournalOutput::Io(request) => {
                    journal.handle(Instant::ZERO, JournalInput::Io(execute(&disk, &request)));
                    for output in drain(&mut journal) {
                        if let JournalOutput::SyncWanted { key } = output {
                            wanted.push(key.0);
                        }
                    }
                }
                JournalOutput::SyncWanted { key } => wanted.push(key.0),
                _ => {}
            }
        }
    }
    assert_eq!(wanted, (1..=SYNCS_ASKED_MAX as u64).collect::<Vec<_>>());
    journal.handle(
        Instant::ZERO,
        JournalInput::Synced {
            key: LogKey(3),
            through: Offset(1),
        },
    );
    let next: Vec<u64> = drain(&mut journal)
        .into_iter()
        .filter_map(|output| match output {
            JournalOutput::SyncWanted { key } => Some(key.0),
            _ => None,
        })
        .collect();
    assert_eq!(
        next,
        [SYNCS_ASKED_MAX as u64 + 1],
        "one answered, one more asked"
    );
}

/// Batches queued behind a journaled commit start their cycle when the journal answers it (not only
/// when another batch arrives), before and after a delete and recreate of the topic.
#[test]
fn a_recreated_topic_commits_through_the_journal_after_its_old_logs_retired() {
    let mut h = Crash::new(77);
    h.settle();
    h.commit_at_once(20);
    h.apply(&Command::DeleteTopic { name: "t".into() });
    h.apply(&crate::metastore::create_command("t", h.partitions));
    h.acked.clear();
    h.commit_at_once(20);
    assert!(!h.acked.is_empty(), "the recreated topic takes commits");
}

impl Crash {
    /// Queues `count` commits at once (each partition's first batch leads a cycle, the rest wait
    /// behind it), runs every request, and checks each commit was answered.
    fn commit_at_once(&mut self, count: usize) {
        for _ in 0..count {
            self.commit();
        }
        self.settle();
        assert!(
            self.waiting.is_empty(),
            "every commit answered: {:?}",
            self.waiting.keys()
        );
    }

    /// Applies `command` to the replica state and feeds the owner the result.
    fn apply(&mut self, command: &Command) {
        let mut state = (*self.state).clone();
        state.apply(command).expect("applied");
        self.state = Arc::new(state);
        self.input(OwnerInput::Replica(self.state.clone()));
        self.settle();
    }
}

fn append_at(journal: &mut OwnerJournal, now: Instant, key: u64, id: u64, base: u64) {
    let bytes = frame(base, b"payload");
    let (key, id, run) = run(key, id, &bytes, base + 1);
    let dir: Arc<str> = Arc::from(format!("topics/t/1/p{:05}", key.0).as_str());
    journal.handle(now, JournalInput::Append { key, dir, id, run });
}

fn at_us(us: u64) -> Instant {
    Instant::from_nanos(us * 1_000)
}

/// Logs 1 and 2 flushed together from 600 to 1,000 µs: the cohort wait is min(1 ms, 250% of 400 µs) = 1 ms.
fn journal_after_a_flush_of_two_logs(config: JournalConfig) -> (SimDisk, OwnerJournal) {
    let disk = SimDisk::new(3);
    let mut journal = OwnerJournal::new(config);
    append_at(&mut journal, at_us(0), 1, 10, 0);
    let first = io(&drain(&mut journal)).remove(0);
    append_at(&mut journal, at_us(100), 2, 20, 0);
    journal.handle(at_us(200), JournalInput::Io(execute(&disk, &first)));
    let second = io(&drain(&mut journal)).remove(0);
    // Both logs append while the second flush (of log 2 alone) is in flight.
    append_at(&mut journal, at_us(300), 1, 11, 1);
    append_at(&mut journal, at_us(300), 2, 21, 1);
    journal.handle(at_us(600), JournalInput::Io(execute(&disk, &second)));
    let outputs = drain(&mut journal);
    assert_eq!(done(&outputs), [(2, 20, true)]);
    let both = io(&outputs).remove(0);
    journal.handle(at_us(1_000), JournalInput::Io(execute(&disk, &both)));
    assert_eq!(done(&drain(&mut journal)), [(1, 11, true), (2, 21, true)]);
    (disk, journal)
}

#[test]
fn a_flush_waits_for_the_logs_the_previous_one_answered_to_come_back() {
    let (_disk, mut journal) = journal_after_a_flush_of_two_logs(JournalConfig::new());
    assert_eq!(journal.poll_timeout(), None, "nothing staged, nothing held");
    append_at(&mut journal, at_us(1_150), 3, 30, 0);
    assert!(drain(&mut journal).is_empty(), "logs 1 and 2 may come back");
    assert_eq!(journal.poll_timeout(), Some(at_us(2_000)));
    append_at(&mut journal, at_us(1_200), 1, 12, 2);
    assert!(drain(&mut journal).is_empty(), "log 2 may still come back");
    append_at(&mut journal, at_us(1_250), 2, 22, 2);
    let outputs = io(&drain(&mut journal));
    assert_eq!(
        outputs.len(),
        1,
        "the whole cohort is back: one flush for all three"
    );
    assert_eq!(journal.poll_timeout(), None);
}

#[test]
fn a_cohort_wait_ends_at_its_deadline_and_a_released_log_is_not_waited_for() {
    let (disk, mut journal) = journal_after_a_flush_of_two_logs(JournalConfig::new());
    append_at(&mut journal, at_us(1_150), 1, 12, 2);
    journal.handle(at_us(1_999), JournalInput::Tick);
    assert!(
        drain(&mut journal).is_empty(),
        "an early tick starts nothing"
    );
    journal.handle(at_us(2_000), JournalInput::Tick);
    let flush = io(&drain(&mut journal));
    assert_eq!(
        flush.len(),
        1,
        "log 2 never came back: the deadline starts the flush"
    );
    // That flush answered one log: the next starts at once.
    journal.handle(at_us(2_500), JournalInput::Io(execute(&disk, &flush[0])));
    assert_eq!(done(&drain(&mut journal)), [(1, 12, true)]);
    append_at(&mut journal, at_us(2_600), 3, 30, 0);
    assert_eq!(io(&drain(&mut journal)).len(), 1);

    let (_disk, mut journal) = journal_after_a_flush_of_two_logs(JournalConfig::new());
    append_at(&mut journal, at_us(1_150), 1, 12, 2);
    assert!(drain(&mut journal).is_empty());
    journal.handle(at_us(1_200), JournalInput::Released { key: LogKey(2) });
    assert_eq!(
        io(&drain(&mut journal)).len(),
        1,
        "a released log cannot come back"
    );
}

#[test]
fn no_cohort_wait_when_off_or_after_a_flush_bound_by_bandwidth() {
    let mut off = JournalConfig::new();
    off.cohort.delay_us_max = 0;
    let mut big = JournalConfig::new();
    big.cohort.flush_bytes_max = 64;
    for (config, why) in [
        (off, "off: the flush starts at once"),
        (big, "a flush past the byte bound waits for nothing"),
    ] {
        let (_disk, mut journal) = journal_after_a_flush_of_two_logs(config);
        append_at(&mut journal, at_us(1_150), 3, 30, 0);
        assert_eq!(io(&drain(&mut journal)).len(), 1, "{why}");
    }
}
