//! Tests of the dispatcher: one unit test per rule on virtual time (`reader`, `commits`, `failures`,
//! `incarnations`), and a randomized model test against simulated owners (`model`).

mod commits;
mod failures;
mod incarnations;
mod model;
mod reader;

use super::*;
use crate::actor::Actor;
use crate::codec::wal::ProduceRecord;
use crate::ids::{NodeId, PartitionId, Seq, TopicId};
use crate::time::Instant;
use ::core::time::Duration;

pub(super) const LOCAL: NodeId = NodeId(0);

/// A produce record for tests.
pub(super) fn rec(
    topic: &str,
    topic_id: Option<u64>,
    partition: u32,
    key: Option<&str>,
) -> ProduceRecord {
    ProduceRecord {
        topic: topic.to_string(),
        topic_id: topic_id.map(TopicId),
        key: key.map(|key| key.as_bytes().to_vec()),
        partition: PartitionId(partition),
        timestamp_ms: 1_700_000_000_000,
        payload: b"payload".to_vec(),
    }
}

pub(super) fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// A dispatcher with an in-test WAL that answers reads and checkpoint stores itself, collecting every
/// other output for the test to assert.
pub(super) struct Harness {
    pub(super) d: Dispatcher,
    pub(super) now: Instant,
    pub(super) wal: Vec<Vec<u8>>,
    pub(super) outputs: Vec<DispatcherOutput>,
    pub(super) reads: Vec<ReadWal>,
    /// Answer reads (else they are collected in `outputs`).
    pub(super) auto_read: bool,
    /// Answer checkpoint stores (else they are collected in `outputs`).
    pub(super) auto_store: bool,
    pub(super) stores: Vec<Seq>,
}

impl Harness {
    pub(super) fn new() -> Self {
        let d = Dispatcher::new(DispatcherConfig {
            node: LOCAL,
            checkpoint: Seq(0),
            durable_next: Seq(0),
            plant: crate::planted::Plant::NONE,
        });
        Harness {
            d,
            now: Instant::ZERO,
            wal: Vec::new(),
            outputs: Vec::new(),
            reads: Vec::new(),
            auto_read: true,
            auto_store: true,
            stores: Vec::new(),
        }
    }

    /// A harness with one topic `t` (id 1) whose partitions are owned by `owners`, every node alive.
    pub(super) fn with_topic(owners: &[u32]) -> Self {
        let mut h = Harness::new();
        for &node in owners {
            if node != LOCAL.0 {
                h.input(DispatcherInput::Member {
                    node: NodeId(node),
                    alive: true,
                });
            }
        }
        h.topic("t", Some(1), owners);
        h.outputs.clear();
        h
    }

    pub(super) fn topic(&mut self, name: &str, id: Option<u64>, owners: &[u32]) {
        self.input(DispatcherInput::Topic {
            name: name.to_string(),
            view: Some(TopicPlacement {
                topic_id: id.map(TopicId),
                owners: owners.iter().map(|&n| Some(NodeId(n))).collect(),
            }),
        });
    }

    pub(super) fn member(&mut self, node: u32, alive: bool) {
        self.input(DispatcherInput::Member {
            node: NodeId(node),
            alive,
        });
    }

    /// Appends records to the WAL, makes them durable and tells the dispatcher.
    pub(super) fn append(&mut self, records: &[ProduceRecord]) -> Vec<Seq> {
        let first = self.wal.len() as u64;
        for record in records {
            self.wal.push(record.to_bytes());
        }
        let next_seq = Seq(self.wal.len() as u64);
        self.input(DispatcherInput::Durable { next_seq });
        (first..next_seq.0).map(Seq).collect()
    }

    /// Appends `count` records of `t` for `partition`.
    pub(super) fn append_n(&mut self, partition: u32, count: usize) -> Vec<Seq> {
        let records: Vec<_> = (0..count)
            .map(|_| rec("t", Some(1), partition, None))
            .collect();
        self.append(&records)
    }

    pub(super) fn input(&mut self, input: DispatcherInput) {
        self.d.handle(self.now, input);
        self.d.check_invariants_deep();
        let wake = self
            .d
            .poll_timeout()
            .expect("the dispatcher always has a wake-up");
        assert!(
            wake > self.now,
            "wake-up {wake} not after now {}: a driver would spin",
            self.now
        );
        self.drain();
    }

    fn drain(&mut self) {
        let mut answers = Vec::new();
        while let Some(output) = self.d.poll_output() {
            match output {
                DispatcherOutput::ReadWal(read) if self.auto_read => {
                    self.reads.push(read);
                    let frames = serve(&self.wal, read, self.wal.len());
                    answers.push(DispatcherInput::WalFrames { frames });
                }
                DispatcherOutput::StoreCheckpoint { seq } if self.auto_store => {
                    self.stores.push(seq);
                    answers.push(DispatcherInput::CheckpointStored { seq });
                }
                other => self.outputs.push(other),
            }
        }
        for answer in answers {
            self.input(answer);
        }
    }

    /// Moves virtual time to `at`, ticking at every wake-up the dispatcher asks for on the way.
    pub(super) fn advance_to(&mut self, at: Instant) {
        loop {
            let wake = self
                .d
                .poll_timeout()
                .expect("the dispatcher always has a wake-up");
            if wake > at {
                break;
            }
            self.now = wake;
            self.input(DispatcherInput::Tick);
        }
        self.now = at;
        self.input(DispatcherInput::Tick);
    }

    pub(super) fn advance(&mut self, by: Duration) {
        let at = self.now + by;
        self.advance_to(at);
    }

    pub(super) fn take(&mut self) -> Vec<DispatcherOutput> {
        std::mem::take(&mut self.outputs)
    }

    /// Takes the collected commits, asserting nothing else was emitted.
    pub(super) fn take_commits(&mut self) -> Vec<SendCommit> {
        self.take()
            .into_iter()
            .map(|output| match output {
                DispatcherOutput::SendCommit(commit) => commit,
                other => panic!("expected only commits, got {other:?}"),
            })
            .collect()
    }

    pub(super) fn done(&mut self, commit: &SendCommit) {
        self.input(DispatcherInput::CommitDone {
            commit_id: commit.commit_id,
        });
    }

    /// A 412 for `commit`: the owner holds no incarnation under the name.
    pub(super) fn mismatch(commit: &SendCommit) -> CommitFailure {
        CommitFailure::IncarnationMismatch {
            record_topic_id: commit.topic_id.unwrap_or(TopicId(0)),
            live_topic_id: None,
        }
    }

    pub(super) fn fail(&mut self, commit: &SendCommit, failure: CommitFailure) {
        self.input(DispatcherInput::CommitFailed {
            commit_id: commit.commit_id,
            failure,
        });
    }

    pub(super) fn error(&mut self, commit: &SendCommit) {
        self.fail(
            commit,
            CommitFailure::Unavailable("unreachable".to_string()),
        );
    }
}

/// The sequence numbers a commit carries.
pub(super) fn seqs(commit: &SendCommit) -> Vec<u64> {
    commit.records.iter().map(|record| record.seq().0).collect()
}

pub(super) fn at(millis: u64) -> Instant {
    Instant::from_millis(millis)
}

pub(super) fn just_before(instant: Instant) -> Instant {
    Instant::from_nanos(instant.as_nanos() - 1)
}

/// Answers a read as a WAL host does: consecutive durable records from `from`, at most `max_records`
/// and `max_bytes` (but at least one record when one is durable).
pub(super) fn serve(wal: &[Vec<u8>], read: ReadWal, durable: usize) -> Vec<(Seq, Vec<u8>)> {
    let mut frames = Vec::new();
    let mut bytes = 0;
    let end = durable.min(wal.len());
    for (seq, record) in wal.iter().enumerate().take(end).skip(read.from.0 as usize) {
        if frames.len() == read.max_records
            || !frames.is_empty() && bytes + record.len() > read.max_bytes
        {
            break;
        }
        bytes += record.len();
        frames.push((Seq(seq as u64), record.clone()));
    }
    frames
}

/// A read request as the dispatcher issues it.
pub(super) fn read(from: u64, max_records: usize) -> ReadWal {
    ReadWal {
        from: Seq(from),
        max_records,
        max_bytes: READ_BYTES_MAX,
    }
}
