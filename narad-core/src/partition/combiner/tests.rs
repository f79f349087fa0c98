//! Unit tests of the combiner: one rule per test, exact outputs.

use std::collections::VecDeque;

use super::*;
use crate::disk::sim::{DiskFault, FaultRule, SimDisk};
use crate::disk::{execute, IoOp};

const EPOCH_MS: u64 = 1_700_000_000_000;
const DIR_A: &str = "topics/t/1/p00000";
const DIR_B: &str = "topics/t/2/p00000";

fn live(topic_id: Option<u64>, dir: &str) -> Option<LiveTopic> {
    Some(LiveTopic {
        topic_id: topic_id.map(TopicId),
        log_dir: dir.into(),
    })
}

fn view(version: u64, live: Option<LiveTopic>) -> TopicView {
    TopicView {
        version,
        owned: true,
        frozen: false,
        live,
    }
}

fn view_a() -> TopicView {
    view(1, live(Some(1), DIR_A))
}

fn config() -> CombinerConfig {
    CombinerConfig {
        log: PartitionLogConfig {
            segment_bytes_max: 4096,
            ..PartitionLogConfig::new("")
        },
        ..CombinerConfig::new(EPOCH_MS)
    }
}

fn batch(id: u64, topic_id: Option<u64>, payloads: &[&str]) -> CommitBatch {
    CommitBatch {
        id: BatchId(id),
        records: payloads
            .iter()
            .map(|payload| BatchRecord {
                topic_id: topic_id.map(TopicId),
                key: None,
                payload: payload.as_bytes().to_vec(),
            })
            .collect(),
        deadline: None,
    }
}

fn ok(id: u64, base: u64, count: u64, at_ms: u64) -> CombinerOutput {
    CombinerOutput::Committed {
        id: BatchId(id),
        result: Ok(CommittedRange {
            base: Offset(base),
            count,
            committed_at_ms: at_ms,
        }),
    }
}

fn err(id: u64, error: CommitError) -> CombinerOutput {
    CombinerOutput::Committed {
        id: BatchId(id),
        result: Err(error),
    }
}

/// Drives a combiner over a SimDisk, holding I/O requests until told to run them.
struct Harness {
    combiner: Combiner,
    disk: SimDisk,
    now: Instant,
    pending: VecDeque<IoRequest>,
    outputs: Vec<CombinerOutput>,
}

impl Harness {
    fn new(config: CombinerConfig, view: TopicView) -> Self {
        let mut harness = Harness {
            combiner: Combiner::new(config, view),
            disk: SimDisk::new(7),
            now: Instant::ZERO,
            pending: VecDeque::new(),
            outputs: Vec::new(),
        };
        harness.collect();
        harness.run_all();
        harness
    }

    /// A combiner whose log of incarnation 1 is open, outputs cleared.
    fn opened() -> Self {
        let mut harness = Harness::new(config(), view_a());
        assert!(matches!(
            harness.take().as_slice(),
            [CombinerOutput::LogOpened {
                topic_id: Some(TopicId(1)),
                ..
            }]
        ));
        harness
    }

    fn collect(&mut self) {
        while let Some(output) = self.combiner.poll_output() {
            match output {
                CombinerOutput::Io(request) => self.pending.push_back(request),
                other => self.outputs.push(other),
            }
        }
    }

    fn input(&mut self, input: CombinerInput) {
        self.combiner.handle(self.now, input);
        self.collect();
    }

    fn submit(&mut self, batch: CommitBatch) {
        self.input(CombinerInput::Submit(batch));
    }

    fn run_one(&mut self) {
        let request = self.pending.pop_front().expect("an io request is pending");
        let completion = execute(&self.disk, &request);
        self.input(CombinerInput::Io(completion));
    }

    fn run_all(&mut self) {
        while !self.pending.is_empty() {
            self.run_one();
        }
    }

    fn take(&mut self) -> Vec<CombinerOutput> {
        std::mem::take(&mut self.outputs)
    }
}

#[test]
fn a_batch_with_no_cycle_running_leads_and_commits_alone() {
    let mut h = Harness::opened();
    h.submit(batch(1, Some(1), &["a", "b"]));
    assert!(h.combiner.cycle_running());
    assert_eq!(h.pending.len(), 1, "one request: the commit");
    h.run_all();
    assert_eq!(h.take(), [ok(1, 0, 2, EPOCH_MS)]);
    assert!(!h.combiner.cycle_running());
}

#[test]
fn batches_arriving_during_a_cycle_share_the_next_one_in_arrival_order() {
    let mut h = Harness::opened();
    h.submit(batch(1, Some(1), &["a"]));
    h.submit(batch(2, Some(1), &["b", "c"]));
    h.submit(batch(3, None, &["d"]));
    assert_eq!(
        h.pending.len(),
        1,
        "batches 2 and 3 wait for the next cycle"
    );
    assert_eq!(h.combiner.queued_batches(), 2);
    h.run_one();
    assert_eq!(h.take(), [ok(1, 0, 1, EPOCH_MS)]);
    assert_eq!(h.pending.len(), 1, "one commit for both waiting batches");
    assert_eq!(h.combiner.queued_batches(), 0);
    h.run_all();
    assert_eq!(h.take(), [ok(2, 1, 2, EPOCH_MS), ok(3, 3, 1, EPOCH_MS)]);
    let log = h.combiner.log().unwrap();
    assert_eq!(log.high_watermark(), Offset(4));
}

#[test]
fn a_failed_commit_gives_every_batch_of_the_cycle_the_same_error() {
    let mut h = Harness::opened();
    h.submit(batch(1, Some(1), &["a"]));
    h.run_all();
    let _ = h.take();
    h.disk.add_fault(FaultRule {
        path_prefix: DIR_A.into(),
        kind: DiskFault::SyncEio,
        chance_ppm: 1_000_000,
        remaining: Some(1),
    });
    h.submit(batch(2, Some(1), &["b"]));
    h.submit(batch(3, Some(1), &["c"]));
    h.run_one();
    assert_eq!(
        h.take(),
        [err(
            2,
            CommitError::Storage(CommitFault::Sync(IoFault::Eio))
        )]
    );
    // Batch 3 waits for the repair (truncate + sync), then commits at the discarded offset.
    h.run_all();
    assert_eq!(h.take(), [ok(3, 1, 1, EPOCH_MS)]);
    h.disk.add_fault(FaultRule {
        path_prefix: DIR_A.into(),
        kind: DiskFault::WriteEio,
        chance_ppm: 1_000_000,
        remaining: Some(1),
    });
    h.submit(batch(4, Some(1), &["d"]));
    h.submit(batch(5, Some(1), &["e"]));
    h.submit(batch(6, None, &["f"]));
    h.run_one();
    assert_eq!(
        h.take(),
        [err(
            4,
            CommitError::Storage(CommitFault::Write(IoFault::Eio))
        )]
    );
    h.disk.add_fault(FaultRule {
        path_prefix: DIR_A.into(),
        kind: DiskFault::WriteEio,
        chance_ppm: 1_000_000,
        remaining: Some(1),
    });
    h.run_all();
    let failed = CommitError::Storage(CommitFault::Write(IoFault::Eio));
    assert_eq!(h.take(), [err(5, failed.clone()), err(6, failed)]);
}

#[test]
fn a_partition_not_owned_or_frozen_refuses_with_nothing_appended() {
    let mut h = Harness::opened();
    h.input(CombinerInput::View(TopicView {
        frozen: true,
        ..view_a()
    }));
    h.submit(batch(1, Some(1), &["a"]));
    assert_eq!(h.take(), [err(1, CommitError::NotOwner)]);
    assert!(h.pending.is_empty());
    h.input(CombinerInput::View(TopicView {
        owned: false,
        ..view_a()
    }));
    h.submit(batch(2, None, &["a"]));
    assert_eq!(h.take(), [err(2, CommitError::NotOwner)]);
    assert!(h.pending.is_empty());
    assert_eq!(h.combiner.log().unwrap().stats().next_offset, Offset(0));
}

#[test]
fn a_freeze_armed_during_a_cycle_refuses_the_batches_that_waited() {
    let mut h = Harness::opened();
    h.submit(batch(1, Some(1), &["a"]));
    h.submit(batch(2, Some(1), &["b"]));
    h.input(CombinerInput::View(TopicView {
        frozen: true,
        ..view_a()
    }));
    h.input(CombinerInput::QueryHighWatermark(QueryId(9)));
    assert_eq!(h.take(), [], "the query waits for the commit in flight");
    h.run_all();
    assert_eq!(
        h.take(),
        [
            ok(1, 0, 1, EPOCH_MS),
            CombinerOutput::HighWatermark {
                id: QueryId(9),
                high_watermark: Some(Offset(1))
            },
            err(2, CommitError::NotOwner),
        ]
    );
}

#[test]
fn a_caller_that_gave_up_is_left_out_of_the_cycle() {
    let mut h = Harness::opened();
    h.submit(batch(1, Some(1), &["a"]));
    h.submit(batch(2, Some(1), &["b"]));
    h.submit(CommitBatch {
        deadline: Some(Instant::from_millis(5)),
        ..batch(3, Some(1), &["c"])
    });
    h.submit(CommitBatch {
        deadline: Some(Instant::from_millis(50)),
        ..batch(4, Some(1), &["d"])
    });
    h.input(CombinerInput::Abandon(BatchId(2)));
    h.now = Instant::from_millis(5);
    h.run_all();
    assert_eq!(
        h.take(),
        [
            ok(1, 0, 1, EPOCH_MS),
            err(2, CommitError::CallerGone),
            err(3, CommitError::CallerGone),
            ok(4, 1, 1, EPOCH_MS + 5),
        ]
    );
}

#[test]
fn an_abandoned_batch_already_being_committed_still_gets_its_outcome() {
    let mut h = Harness::opened();
    h.submit(batch(1, Some(1), &["a"]));
    h.input(CombinerInput::Abandon(BatchId(1)));
    h.run_all();
    assert_eq!(h.take(), [ok(1, 0, 1, EPOCH_MS)]);
}

#[test]
fn a_record_of_another_incarnation_is_refused_naming_both_ids_and_records_without_ids_commit() {
    let mut h = Harness::opened();
    h.submit(batch(1, Some(1), &["a"]));
    h.submit(batch(2, Some(7), &["stale"]));
    h.submit(batch(3, None, &["by name"]));
    let mut mixed = batch(4, Some(1), &["x", "y"]);
    mixed.records[1].topic_id = Some(TopicId(8));
    h.submit(mixed);
    h.submit(batch(5, Some(1), &["b"]));
    h.run_all();
    assert_eq!(
        h.take(),
        [
            ok(1, 0, 1, EPOCH_MS),
            err(
                2,
                CommitError::TopicIncarnationMismatch {
                    record_topic_id: TopicId(7),
                    live_topic_id: Some(TopicId(1))
                }
            ),
            err(
                4,
                CommitError::TopicIncarnationMismatch {
                    record_topic_id: TopicId(8),
                    live_topic_id: Some(TopicId(1))
                }
            ),
            ok(3, 1, 1, EPOCH_MS),
            ok(5, 2, 1, EPOCH_MS),
        ]
    );
    assert!(CommitError::TopicIncarnationMismatch {
        record_topic_id: TopicId(7),
        live_topic_id: None
    }
    .retriable());
}

#[test]
fn a_deleted_topic_refuses_batches_with_ids_as_mismatch_and_without_as_not_found() {
    let mut h = Harness::opened();
    h.input(CombinerInput::View(view(2, None)));
    assert_eq!(
        h.take(),
        [CombinerOutput::LogRetired {
            topic_id: Some(TopicId(1)),
            dir: DIR_A.into()
        }]
    );
    h.submit(batch(1, Some(1), &["a"]));
    h.submit(batch(2, None, &["b"]));
    assert_eq!(
        h.take(),
        [
            err(
                1,
                CommitError::TopicIncarnationMismatch {
                    record_topic_id: TopicId(1),
                    live_topic_id: None
                }
            ),
            err(2, CommitError::TopicNotFound),
        ]
    );
    assert!(h.pending.is_empty());
}

#[test]
fn a_recreated_topic_retires_the_old_log_and_commits_into_the_new_one() {
    let mut h = Harness::opened();
    h.submit(batch(1, Some(1), &["old"]));
    h.run_all();
    let _ = h.take();
    h.input(CombinerInput::View(view(2, live(Some(2), DIR_B))));
    assert_eq!(
        h.take(),
        [CombinerOutput::LogRetired {
            topic_id: Some(TopicId(1)),
            dir: DIR_A.into()
        }]
    );
    h.run_all();
    assert!(matches!(
        h.take().as_slice(),
        [CombinerOutput::LogOpened {
            topic_id: Some(TopicId(2)),
            ..
        }]
    ));
    h.submit(batch(2, Some(1), &["stale"]));
    h.submit(batch(3, Some(2), &["new"]));
    h.run_all();
    assert_eq!(
        h.take(),
        [
            err(
                2,
                CommitError::TopicIncarnationMismatch {
                    record_topic_id: TopicId(1),
                    live_topic_id: Some(TopicId(2))
                }
            ),
            ok(3, 0, 1, EPOCH_MS),
        ]
    );
    assert_eq!(h.combiner.log().unwrap().config().dir, DIR_B);
}

#[test]
fn a_cycle_waiting_when_the_topic_is_recreated_resolves_the_new_log_and_rechecks_the_same_batches()
{
    let mut h = Harness::opened();
    h.submit(batch(1, Some(1), &["a"]));
    h.submit(batch(2, None, &["by name"]));
    h.submit(batch(3, Some(2), &["new"]));
    // The metadata moves while batch 1 commits: the next cycle holds the old log.
    h.input(CombinerInput::View(view(2, live(Some(2), DIR_B))));
    h.run_one();
    assert_eq!(
        h.take(),
        [
            ok(1, 0, 1, EPOCH_MS),
            CombinerOutput::LogRetired {
                topic_id: Some(TopicId(1)),
                dir: DIR_A.into()
            }
        ]
    );
    h.run_all();
    let outputs = h.take();
    assert!(matches!(
        outputs[0],
        CombinerOutput::LogOpened {
            topic_id: Some(TopicId(2)),
            ..
        }
    ));
    assert_eq!(outputs[1..], [ok(2, 0, 1, EPOCH_MS), ok(3, 1, 1, EPOCH_MS)]);
}

#[test]
fn a_topic_record_that_keeps_changing_ends_the_cycle_after_three_resolutions() {
    let mut h = Harness::opened();
    h.submit(batch(1, Some(1), &["a"]));
    h.submit(batch(2, None, &["b"]));
    h.input(CombinerInput::View(view(2, live(Some(2), "topics/t/2"))));
    h.run_one();
    let _ = h.take();
    // Resolution 1 is opening incarnation 2's log; each new view makes the next one.
    for (resolution, id) in [(2u64, 3u64), (3, 4)] {
        let dir = format!("topics/t/{id}");
        h.input(CombinerInput::View(view(
            resolution + 1,
            live(Some(id), &dir),
        )));
        h.run_one();
        let outputs = h.take();
        assert!(
            matches!(outputs.as_slice(), [CombinerOutput::LogRetired { .. }]),
            "resolution {resolution}: {outputs:?}"
        );
    }
    h.input(CombinerInput::View(view(5, live(Some(5), "topics/t/5"))));
    h.run_one();
    assert_eq!(
        h.take(),
        [
            err(2, CommitError::NotOwner),
            CombinerOutput::LogRetired {
                topic_id: Some(TopicId(4)),
                dir: "topics/t/4".into()
            },
        ],
        "a fourth resolution is refused with nothing appended; idle, the live log is opened"
    );
    h.run_all();
    assert!(matches!(
        h.take().as_slice(),
        [CombinerOutput::LogOpened {
            topic_id: Some(TopicId(5)),
            ..
        }]
    ));
    h.submit(batch(3, Some(5), &["c"]));
    h.run_all();
    assert_eq!(h.take(), [ok(3, 0, 1, EPOCH_MS)]);
}

#[test]
fn a_latched_log_is_unavailable_until_the_retry_interval_then_repaired() {
    let mut h = Harness::opened();
    h.disk.add_fault(FaultRule {
        path_prefix: DIR_A.into(),
        kind: DiskFault::SyncEio,
        chance_ppm: 1_000_000,
        remaining: Some(2),
    });
    h.submit(batch(1, Some(1), &["a"]));
    h.run_all();
    assert_eq!(
        h.take(),
        [
            err(1, CommitError::Storage(CommitFault::Sync(IoFault::Eio))),
            CombinerOutput::LogLatched {
                topic_id: Some(TopicId(1)),
                fault: IoFault::Eio
            },
        ]
    );
    h.now = Instant::from_millis(999);
    h.submit(batch(2, Some(1), &["b"]));
    assert_eq!(
        h.take(),
        [err(2, CommitError::LogUnavailable(LogStatus::Latched))]
    );
    assert!(h.pending.is_empty());
    h.now = Instant::from_millis(1_000);
    h.submit(batch(3, Some(1), &["c"]));
    assert_eq!(h.pending.len(), 1, "the truncation is retried first");
    assert!(matches!(h.pending[0].ops[0], IoOp::SetLen { len: 0, .. }));
    h.run_all();
    assert_eq!(h.take(), [ok(3, 0, 1, EPOCH_MS + 1_000)]);
}

#[test]
fn commit_times_are_the_epoch_plus_now_and_never_go_backwards() {
    let mut h = Harness::opened();
    h.now = Instant::from_millis(20);
    h.submit(batch(1, None, &["a"]));
    h.run_all();
    assert_eq!(h.take(), [ok(1, 0, 1, EPOCH_MS + 20)]);
    // A restart whose wall clock reads 10 ms behind: the recovered log keeps the later time.
    let behind = CombinerConfig {
        unix_epoch_ms: EPOCH_MS - 10,
        ..config()
    };
    let mut restarted = Harness {
        combiner: Combiner::new(behind, view_a()),
        disk: h.disk.clone(),
        now: Instant::from_millis(25),
        pending: VecDeque::new(),
        outputs: Vec::new(),
    };
    restarted.collect();
    restarted.run_all();
    let _ = restarted.take();
    restarted.submit(batch(2, None, &["b"]));
    restarted.run_all();
    assert_eq!(restarted.take(), [ok(2, 1, 1, EPOCH_MS + 20)]);
    restarted.now = Instant::from_millis(40);
    restarted.submit(batch(3, None, &["c"]));
    restarted.run_all();
    assert_eq!(restarted.take(), [ok(3, 2, 1, EPOCH_MS + 30)]);
}

#[test]
fn a_full_queue_refuses_and_empty_batches_are_refused() {
    let config = CombinerConfig {
        batches_queued_max: 2,
        records_queued_max: 3,
        ..config()
    };
    let mut h = Harness::new(config, view_a());
    let _ = h.take();
    h.submit(batch(1, None, &[]));
    assert_eq!(h.take(), [err(1, CommitError::EmptyBatch)]);
    assert!(!CommitError::EmptyBatch.retriable());
    h.submit(batch(2, None, &["leads"]));
    h.submit(batch(3, None, &["a", "b"]));
    h.submit(batch(4, None, &["c", "d"]));
    assert_eq!(
        h.take(),
        [err(4, CommitError::Overloaded)],
        "records over 3"
    );
    h.submit(batch(5, None, &["c"]));
    h.submit(batch(6, None, &["d"]));
    assert_eq!(
        h.take(),
        [err(6, CommitError::Overloaded)],
        "batches over 2"
    );
    h.run_all();
    assert_eq!(
        h.take(),
        [
            ok(2, 0, 1, EPOCH_MS),
            ok(3, 1, 2, EPOCH_MS),
            ok(5, 3, 1, EPOCH_MS)
        ]
    );
}

#[test]
fn batches_submitted_while_the_log_opens_wait_for_it() {
    let mut h = Harness {
        combiner: Combiner::new(config(), view_a()),
        disk: SimDisk::new(3),
        now: Instant::ZERO,
        pending: VecDeque::new(),
        outputs: Vec::new(),
    };
    h.collect();
    h.submit(batch(1, Some(1), &["a"]));
    assert_eq!(h.take(), []);
    h.run_all();
    let outputs = h.take();
    assert!(matches!(outputs[0], CombinerOutput::LogOpened { .. }));
    assert_eq!(outputs[1..], [ok(1, 0, 1, EPOCH_MS)]);
}

#[test]
fn reads_are_served_from_the_live_incarnation_only() {
    let mut h = Harness::opened();
    h.submit(batch(1, Some(1), &["a"]));
    h.run_all();
    let _ = h.take();
    let read = |id| {
        CombinerInput::Read(ReadRequest {
            id: LogReadId(id),
            offset: Offset(0),
            records_max: 10,
            bytes_max: 1_000,
        })
    };
    h.input(read(1));
    h.run_all();
    match h.take().as_slice() {
        [CombinerOutput::ReadDone {
            id: LogReadId(1),
            result: Ok(batch),
        }] => assert_eq!(batch.records[0].payload, b"a"),
        other => panic!("{other:?}"),
    }
    // A read in flight when the topic is recreated is answered as retired.
    h.input(read(2));
    h.input(CombinerInput::View(view(2, live(Some(2), DIR_B))));
    let outputs = h.take();
    assert_eq!(
        outputs[..2],
        [
            CombinerOutput::ReadDone {
                id: LogReadId(2),
                result: Err(LogReadError::Retired)
            },
            CombinerOutput::LogRetired {
                topic_id: Some(TopicId(1)),
                dir: DIR_A.into()
            },
        ]
    );
    h.input(read(3));
    assert_eq!(
        h.take(),
        [CombinerOutput::ReadDone {
            id: LogReadId(3),
            result: Err(LogReadError::NotOpen)
        }],
        "the new log is still opening"
    );
    h.run_all();
    let _ = h.take();
    h.input(read(4));
    assert_eq!(
        h.take(),
        [CombinerOutput::ReadDone {
            id: LogReadId(4),
            result: Err(LogReadError::AtOrPastHighWatermark {
                high_watermark: Offset(0)
            })
        }]
    );
}

#[test]
fn the_high_watermark_query_is_answered_at_once_when_no_commit_runs() {
    let mut h = Harness::opened();
    h.input(CombinerInput::QueryHighWatermark(QueryId(1)));
    assert_eq!(
        h.take(),
        [CombinerOutput::HighWatermark {
            id: QueryId(1),
            high_watermark: Some(Offset(0))
        }]
    );
}

/// The payloads of one batch.
type Payloads = Vec<Vec<u8>>;

/// A seeded random walk: batches with matching, stale or no incarnation ids, abandons, deadlines,
/// views that freeze, disown, delete and recreate the topic, write/sync faults, I/O completed in
/// between the other events. Checks: exactly one outcome per batch; acknowledged ranges of one log are
/// contiguous from 0 and never overlap; no record carrying an id lands in another incarnation's log;
/// at the end every acknowledged batch reads back exactly from its incarnation's log.
#[test]
#[allow(clippy::too_many_lines)] // one walk: its event loop and its checks read best in one place
fn random_walks_commit_every_acknowledged_batch_into_its_own_incarnation_exactly() {
    use crate::partition::driver::{run_to_idle, NoHook};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::collections::BTreeMap;

    let first: u64 = std::env::var("NARAD_COMBINER_WALK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let seeds: u64 = std::env::var("NARAD_COMBINER_WALK_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut acknowledged_total = 0;
    for seed in first..first + seeds {
        let rerun = format!(
            "seed {seed}; rerun: NARAD_COMBINER_WALK_SEED={seed} NARAD_COMBINER_WALK_SEEDS=1 \
             cargo test -p narad-core random_walks_commit"
        );
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let dirs = |id: u64| format!("topics/t/{id}/p00000");
        let mut incarnation = 1u64;
        let mut version = 1u64;
        let mut h = Harness::new(config(), view(version, live(Some(1), &dirs(1))));
        h.disk = SimDisk::new(seed);
        h.combiner = Combiner::new(config(), view(version, live(Some(1), &dirs(1))));
        h.pending.clear();
        h.outputs.clear();
        h.collect();
        for (kind, ppm) in [(DiskFault::SyncEio, 30_000), (DiskFault::WriteEio, 30_000)] {
            h.disk.add_fault(FaultRule {
                path_prefix: String::new(),
                kind,
                chance_ppm: rng.random_range(0..ppm),
                remaining: None,
            });
        }
        let mut submitted: BTreeMap<u64, (Option<u64>, Vec<Vec<u8>>)> = BTreeMap::new();
        let mut answered: BTreeMap<u64, Result<CommittedRange, CommitError>> = BTreeMap::new();
        let mut acked: BTreeMap<(String, u64), (u64, Payloads)> = BTreeMap::new();
        let mut next_id = 0u64;
        // The log a commit lands in is the one held when its step began: a commit never spans a
        // change of log, but the step that completes it may retire the log afterwards.
        let held = |h: &Harness| {
            h.combiner.log().map(|log| {
                let id = h.combiner.log_topic_id().unwrap().map(|t| t.0);
                (log.config().dir.clone(), id)
            })
        };
        for _ in 0..120 {
            let before = held(&h);
            h.now += Duration::from_millis(rng.random_range(0..300));
            match rng.random_range(0..100) {
                0..=44 => {
                    let id_choice = rng.random_range(0..10);
                    let topic_id = match id_choice {
                        0..=5 => Some(incarnation),
                        6..=7 => None,
                        _ => Some(incarnation.saturating_sub(1).max(1) + 7),
                    };
                    let payloads: Vec<Vec<u8>> = (0..rng.random_range(1..4))
                        .map(|_| format!("{seed}-{next_id}-{}", rng.random::<u16>()).into_bytes())
                        .collect();
                    let deadline = rng
                        .random_bool(0.2)
                        .then(|| h.now + Duration::from_millis(rng.random_range(0..500)));
                    h.submit(CommitBatch {
                        id: BatchId(next_id),
                        records: payloads
                            .iter()
                            .map(|payload| BatchRecord {
                                topic_id: topic_id.map(TopicId),
                                key: None,
                                payload: payload.clone(),
                            })
                            .collect(),
                        deadline,
                    });
                    submitted.insert(next_id, (topic_id, payloads));
                    next_id += 1;
                }
                45..=49 if next_id > 0 => {
                    h.input(CombinerInput::Abandon(BatchId(
                        rng.random_range(0..next_id),
                    )));
                }
                50..=57 => {
                    version += 1;
                    let mut next = view(version, live(Some(incarnation), &dirs(incarnation)));
                    match rng.random_range(0..6) {
                        0 => next.frozen = true,
                        1 => next.owned = false,
                        2 => next.live = None,
                        3 => {
                            incarnation += 1;
                            next.live = live(Some(incarnation), &dirs(incarnation));
                        }
                        _ => {}
                    }
                    h.input(CombinerInput::View(next));
                }
                _ if !h.pending.is_empty() => h.run_one(),
                _ => {}
            }
            // Outcomes are recorded as they come, with the log they landed in.
            for output in h.take() {
                match output {
                    CombinerOutput::Committed { id, result } => {
                        let (topic_id, payloads) = &submitted[&id.0];
                        if let Ok(range) = &result {
                            let (dir, log_id) = before.clone().expect("a log was held");
                            let log_id = log_id.expect("incarnations have ids here");
                            assert!(
                                topic_id.is_none_or(|t| t == log_id),
                                "{rerun}: batch {} of incarnation {topic_id:?} landed in {log_id}",
                                id.0
                            );
                            assert_eq!(range.count as usize, payloads.len(), "{rerun}");
                            let previous =
                                acked.insert((dir, range.base.0), (id.0, payloads.clone()));
                            assert!(previous.is_none(), "{rerun}: offsets reused");
                        }
                        assert!(
                            answered.insert(id.0, result).is_none(),
                            "{rerun}: two outcomes"
                        );
                    }
                    CombinerOutput::Io(_) => unreachable!("collected"),
                    CombinerOutput::ReadDone { .. }
                    | CombinerOutput::HighWatermark { .. }
                    | CombinerOutput::LogOpened { .. }
                    | CombinerOutput::LogOpenFailed { .. }
                    | CombinerOutput::LogLatched { .. }
                    | CombinerOutput::LogRetired { .. }
                    | CombinerOutput::Retained(_)
                    | CombinerOutput::RetentionFailed(_) => {}
                    CombinerOutput::Journal { .. }
                    | CombinerOutput::Synced { .. }
                    | CombinerOutput::SyncFailed { .. }
                    | CombinerOutput::SyncDeferred => {
                        unreachable!("not journaled")
                    }
                }
            }
        }
        // Settle: heal, let time pass so latched logs retry, finish every request.
        h.disk.clear_faults();
        h.now += Duration::from_secs(5);
        while !h.pending.is_empty() {
            let before = held(&h);
            h.run_one();
            for output in h.take() {
                if let CombinerOutput::Committed { id, result } = output {
                    if let Ok(range) = &result {
                        let (dir, _) = before.clone().expect("a log was held");
                        acked.insert((dir, range.base.0), (id.0, submitted[&id.0].1.clone()));
                    }
                    assert!(
                        answered.insert(id.0, result).is_none(),
                        "{rerun}: two outcomes"
                    );
                }
            }
        }
        assert_eq!(
            answered.len(),
            submitted.len(),
            "{rerun}: every batch answered"
        );
        // Every acknowledged batch reads back exactly from its incarnation's log.
        let mut by_dir: BTreeMap<String, Vec<(u64, Payloads)>> = BTreeMap::new();
        for ((dir, base), (_, payloads)) in &acked {
            by_dir
                .entry(dir.clone())
                .or_default()
                .push((*base, payloads.clone()));
        }
        for (dir, batches) in by_dir {
            let mut log = PartitionLog::open(PartitionLogConfig {
                dir: dir.clone(),
                ..config().log
            });
            let _ = run_to_idle(&mut log, h.now, &h.disk, &mut NoHook).unwrap();
            let mut expected_base = 0;
            for (base, payloads) in batches {
                assert_eq!(
                    base, expected_base,
                    "{rerun}: {dir} ranges contiguous from 0"
                );
                for (index, payload) in payloads.iter().enumerate() {
                    log.handle(
                        h.now,
                        LogInput::Read(ReadRequest {
                            id: LogReadId(0),
                            offset: Offset(base + index as u64),
                            records_max: 1,
                            bytes_max: 1,
                        }),
                    );
                    let outputs = run_to_idle(&mut log, h.now, &h.disk, &mut NoHook).unwrap();
                    match outputs.as_slice() {
                        [LogOutput::ReadDone {
                            result: Ok(read), ..
                        }] => {
                            assert_eq!(&read.records[0].payload, payload, "{rerun}: {dir}")
                        }
                        other => panic!("{rerun}: {dir} offset {}: {other:?}", base + index as u64),
                    }
                }
                expected_base = base + payloads.len() as u64;
                acknowledged_total += 1;
            }
        }
    }
    assert!(
        acknowledged_total > seeds * 5,
        "too few acknowledged batches: {acknowledged_total}"
    );
}
