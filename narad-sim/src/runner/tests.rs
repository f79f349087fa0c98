//! End-to-end tests of the runner: the model node under madsim, and small wrapper nodes that break
//! one rule each so every failure category is shown to be caught.

use std::sync::Arc;

use narad_core::{Offset, PartitionId};

use super::{run, sim_now_ns};
use crate::fault::{DiskError, FaultEvent, Target};
use crate::model_node::ModelNode;
use crate::outcome::{RunOutcome, RunSpec};
use crate::scenario::Scenario;
use crate::seam::{
    DiskLayout, NodeContext, NodeError, PlantedBug, ProduceRecord, SimNode, TopicInfo,
};

/// A small scenario: two topics (one churning), every fault kind possible.
const SMALL: &str = r#"
[topology]
nodes = 1

[[topics]]
name = "orders"
partitions = 3

[[topics]]
name = "events"
partitions = 2
churn = true

[workload]
rate_per_s = 300
producers = 3
keyed = 1
keyless = 1
explicit = 1
single = 2
batch = 1
batch_records = [2, 10]
payload_bytes = [20, 200]
keys = 8
churn_every_ms = 500
timeout_ms = 1000

[disk]
op_us = 20
sync_us = 300

[faults]
per_minute = 120
warmup_ms = 100
crash = 2
pause = 1
wal_fsync_eio = 1
partition_fsync_eio = 1
write_eio = 1
enospc = 1
slow_disk = 1
bit_rot = 1
down_ms = [1, 300]
pause_ms = [1, 300]
episode_ms = [1, 300]
chance_ppm = 500000
slow_us = 5000

[phases]
safety_ms = 3000
liveness_ms = 5000
final_settle_ms = 2000
"#;

fn spec(seed: u64, plant_bug: Option<PlantedBug>) -> RunSpec {
    RunSpec {
        scenario: Arc::new(Scenario::parse(SMALL).unwrap()),
        scenario_path: "small".into(),
        seed,
        plant_bug,
        trace: false,
        schedule: None,
    }
}

#[test]
fn the_model_node_passes_every_seed() {
    for seed in 1..=10 {
        let outcome = run::<ModelNode>(&spec(seed, None));
        assert!(!outcome.failed(), "seed {seed}: {}", outcome.reason());
        assert!(outcome.accepted > 0, "seed {seed} accepted nothing");
    }
}

#[test]
fn a_seed_replays_to_the_same_trace_hash() {
    let a = run::<ModelNode>(&spec(3, None));
    let b = run::<ModelNode>(&spec(3, None));
    let c = run::<ModelNode>(&spec(4, None));
    assert_eq!(
        (a.trace_hash, a.trace_events),
        (b.trace_hash, b.trace_events)
    );
    assert_eq!(a.report, b.report);
    assert_ne!(a.trace_hash, c.trace_hash);
}

/// A planted bug, a fault schedule that gives it its chance (`None`: the seed's generated one), and
/// whether a run's report shows the failure it must cause.
type PlantedCase = (PlantedBug, Option<Vec<FaultEvent>>, fn(&RunOutcome) -> bool);

/// Every planted bug the model node implements, as a [`PlantedCase`].
fn planted_cases() -> Vec<PlantedCase> {
    let fsync_eio = vec![FaultEvent::Disk {
        at_us: 500_000,
        node: None,
        target: Target::Partitions,
        error: DiskError::FsyncEio,
        chance_ppm: 200_000,
        duration_ms: 500,
    }];
    vec![
        (PlantedBug::AckBeforeFsync, None, |o| {
            !o.report.lost.is_empty()
        }),
        (PlantedBug::FsyncRetryAfterEio, Some(fsync_eio), |o| {
            !o.report.lost.is_empty()
        }),
        (PlantedBug::SkipReadbackCrc, Some(rot_then_crash()), |o| {
            !o.report.phantoms.is_empty()
        }),
        (PlantedBug::StaleIncarnationIntoRecreatedTopic, None, |o| {
            !o.report.misplaced.is_empty()
        }),
        (PlantedBug::RollDropsBatchTail, Some(Vec::new()), |o| {
            !o.report.lost.is_empty()
        }),
    ]
}

/// Bit rot in the partition logs, a crash so recovery reads the damage, and more rot late in the
/// safety phase.
fn rot_then_crash() -> Vec<FaultEvent> {
    let rot = |at_us| FaultEvent::BitRot {
        at_us,
        node: None,
        target: Target::Partitions,
    };
    vec![
        rot(1_000_000),
        rot(1_400_000),
        rot(1_800_000),
        FaultEvent::Crash {
            at_us: 2_000_000,
            node: None,
            down_ms: 100,
        },
        rot(2_500_000),
        rot(2_900_000),
    ]
}

/// What a regression scenario checks (`narad-sim replay`), on the model node: every planted bug it
/// implements fails a seed of [`SMALL`] with the failure it must cause, and that seed passes without it.
#[test]
fn every_planted_bug_of_the_model_node_is_caught_and_its_seed_passes_without_it() {
    for (bug, schedule, shows) in planted_cases() {
        assert!(ModelNode::supports(bug), "{bug}");
        let caught = (1..=5)
            .find(|&seed| {
                shows(&run::<ModelNode>(&RunSpec {
                    schedule: schedule.clone(),
                    ..spec(seed, Some(bug))
                }))
            })
            .unwrap_or_else(|| panic!("{bug} is not caught in seeds 1..=5"));
        let clean = run::<ModelNode>(&RunSpec {
            schedule,
            ..spec(caught, None)
        });
        assert!(
            !clean.failed(),
            "{bug}: seed {caught} fails without it: {}",
            clean.reason()
        );
    }
}

#[test]
fn bit_rot_costs_the_model_node_only_the_struck_frames() {
    for seed in 1..=5 {
        let outcome = run::<ModelNode>(&RunSpec {
            schedule: Some(rot_then_crash()),
            ..spec(seed, None)
        });
        assert!(!outcome.failed(), "seed {seed}: {}", outcome.reason());
        let report = &outcome.report;
        // Five flips, each costing one frame (a batch's records share none: one record a frame).
        assert!(
            report.excused_rot <= 5,
            "seed {seed}: {} records excused",
            report.excused_rot
        );
    }
}

#[test]
fn a_rotten_payload_served_without_its_crc_is_caught_as_a_phantom() {
    let rot_late = vec![FaultEvent::BitRot {
        at_us: 2_900_000,
        node: None,
        target: Target::Partitions,
    }];
    let phantoms: usize = (1..=5)
        .map(|seed| {
            let clean = run::<ModelNode>(&RunSpec {
                schedule: Some(rot_late.clone()),
                ..spec(seed, None)
            });
            assert!(!clean.failed(), "seed {seed}: {}", clean.reason());
            run::<ModelNode>(&RunSpec {
                schedule: Some(rot_late.clone()),
                ..spec(seed, Some(PlantedBug::SkipReadbackCrc))
            })
            .report
            .phantoms
            .len()
        })
        .sum();
    assert!(phantoms > 0, "no seed served the rotten payload");
}

#[test]
fn an_explicit_empty_schedule_replaces_the_generated_one() {
    let generated = run::<ModelNode>(&spec(2, None));
    assert!(!generated.schedule.is_empty());
    let quiet = run::<ModelNode>(&RunSpec {
        schedule: Some(Vec::new()),
        ..spec(2, None)
    });
    assert!(quiet.schedule.is_empty());
    assert_eq!(quiet.crashes, 1, "only the final crash");
    assert!(!quiet.failed(), "{}", quiet.reason());
}

#[test]
fn a_topic_the_node_refuses_is_a_harness_error() {
    let mut bad = spec(1, None);
    let mut scenario = (*bad.scenario).clone();
    scenario.topics[0].partitions = 0;
    bad.scenario = Arc::new(scenario);
    let outcome = run::<ModelNode>(&bad);
    assert!(outcome.failed());
    assert!(
        outcome.errors[0].contains("orders could not be created"),
        "{:?}",
        outcome.errors
    );
}

/// A node whose boot panics, to prove a panic fails the run instead of the sweep.
#[derive(Clone)]
struct PanickingNode;

impl SimNode for PanickingNode {
    fn name() -> &'static str {
        "panicking"
    }
    fn layout() -> DiskLayout {
        DiskLayout {
            wal_prefix: "wal/".into(),
            partition_prefix: "p/".into(),
            journal_prefix: None,
            rot_unit: |_, _| None,
        }
    }
    fn supports(_bug: PlantedBug) -> bool {
        false
    }
    async fn start(_ctx: NodeContext) -> Result<Self, String> {
        panic!("boot exploded")
    }
    async fn create_topic(&self, _: &str, _: u32) -> Result<TopicInfo, NodeError> {
        unreachable!("never booted")
    }
    async fn delete_topic(&self, _: &str) -> Result<(), NodeError> {
        unreachable!("never booted")
    }
    async fn describe_topic(&self, _: &str) -> Result<Option<TopicInfo>, NodeError> {
        unreachable!("never booted")
    }
    async fn produce(
        &self,
        _: &str,
        _: Option<PartitionId>,
        _: ProduceRecord,
    ) -> Result<(), NodeError> {
        unreachable!("never booted")
    }
    async fn produce_batch(
        &self,
        _: &str,
        _: Option<PartitionId>,
        _: Vec<ProduceRecord>,
    ) -> Result<(), NodeError> {
        unreachable!("never booted")
    }
    async fn read(
        &self,
        _: &str,
        _: PartitionId,
        _: Offset,
        _: usize,
    ) -> Result<crate::seam::ReadBatch, NodeError> {
        unreachable!("never booted")
    }
    async fn status(&self) -> crate::seam::NodeStatus {
        unreachable!("never booted")
    }
}

#[test]
fn a_panic_inside_the_simulation_is_a_failed_run() {
    let outcome = run::<PanickingNode>(&spec(1, None));
    assert!(outcome.failed());
    assert_eq!(outcome.errors, ["panic: boot exploded"]);
}

/// The model node, except that reads serve nothing until 8.5 s of simulated time: past the
/// liveness deadline of [`SMALL`] (3 s + 5 s) but before the final read.
#[derive(Clone)]
struct LateNode(ModelNode);

const LATE_UNTIL_NS: u64 = 8_500_000_000;

impl SimNode for LateNode {
    fn name() -> &'static str {
        "late"
    }
    fn layout() -> DiskLayout {
        ModelNode::layout()
    }
    fn supports(_bug: PlantedBug) -> bool {
        false
    }
    async fn start(ctx: NodeContext) -> Result<Self, String> {
        ModelNode::start(ctx).await.map(LateNode)
    }
    async fn create_topic(&self, name: &str, partitions: u32) -> Result<TopicInfo, NodeError> {
        self.0.create_topic(name, partitions).await
    }
    async fn delete_topic(&self, name: &str) -> Result<(), NodeError> {
        self.0.delete_topic(name).await
    }
    async fn describe_topic(&self, name: &str) -> Result<Option<TopicInfo>, NodeError> {
        self.0.describe_topic(name).await
    }
    async fn produce(
        &self,
        topic: &str,
        partition: Option<PartitionId>,
        record: ProduceRecord,
    ) -> Result<(), NodeError> {
        self.0.produce(topic, partition, record).await
    }
    async fn produce_batch(
        &self,
        topic: &str,
        partition: Option<PartitionId>,
        records: Vec<ProduceRecord>,
    ) -> Result<(), NodeError> {
        self.0.produce_batch(topic, partition, records).await
    }
    async fn read(
        &self,
        topic: &str,
        partition: PartitionId,
        from: Offset,
        records_max: usize,
    ) -> Result<crate::seam::ReadBatch, NodeError> {
        let mut batch = self.0.read(topic, partition, from, records_max).await?;
        if sim_now_ns() < LATE_UNTIL_NS {
            batch.records.clear();
        }
        Ok(batch)
    }
    async fn status(&self) -> crate::seam::NodeStatus {
        self.0.status().await
    }
}

#[test]
fn records_visible_only_after_the_deadline_are_caught_as_unseen() {
    let outcome = run::<LateNode>(&RunSpec {
        schedule: Some(Vec::new()),
        ..spec(1, None)
    });
    let report = &outcome.report;
    assert!(report.lost.is_empty(), "{}", outcome.reason());
    assert!(!report.unseen.is_empty());
    assert_eq!(
        report.unseen.len() as u64,
        report.accepted - report.excused_deleted,
        "every required record was late"
    );
}

#[test]
fn the_timeline_of_a_cluster_run_names_every_node_and_fault() {
    let scenario = Scenario::parse(include_str!("../../../scenarios/cluster-basic.toml"))
        .expect("cluster-basic parses");
    let schedule = vec![
        FaultEvent::Crash {
            at_us: 2_000_000,
            node: Some(1),
            down_ms: 6_000,
        },
        FaultEvent::Partition {
            at_us: 3_000_000,
            node: Some(0),
            peer: Some(2),
            one_way: false,
            duration_ms: 2_000,
        },
        FaultEvent::Net {
            at_us: 5_500_000,
            loss_ppm: 20_000,
            latency_min_us: 100,
            latency_max_us: 2_000,
            duration_ms: 1_000,
        },
    ];
    let spec = RunSpec {
        scenario: Arc::new(scenario),
        scenario_path: "scenarios/cluster-basic.toml".into(),
        seed: 5,
        plant_bug: None,
        trace: true,
        schedule: Some(schedule.clone()),
    };
    let outcome = run::<crate::node_narad::NaradSimNode>(&spec);
    assert!(!outcome.failed(), "{}", outcome.reason());
    let lines = outcome.trace_lines.clone().expect("traced");
    let page = crate::outcome::timeline_page(&spec, &outcome, &lines);
    for node in 0..3 {
        assert!(
            page.contains(&format!(">node {node}</text>")),
            "node {node}"
        );
    }
    for event in &schedule {
        assert!(page.contains(&event.describe()), "{}", event.describe());
        assert!(page.contains(&format!(">{}</text>", event.kind_name())));
    }
    // The crash outlasts the dead timeout: the run reroutes, and the page draws it.
    assert!(outcome.report.reroutes > 0);
    assert!(page.contains(" rerouted: node "));
    assert!(page.contains("records visible"));
    assert!(page.contains("liveness read at"));
    assert!(!page.contains("FAILED"));
}

/// cluster-heavy reaches the remote commit byte budget: once a cut heals, a remote destination's
/// queue refills from the records it left in the WAL past 8 MiB, and the dispatcher sends a commit
/// that the budget cut (within one record of 8 MiB, never past it). The first seed of the scenario
/// that does it passes, as every seed before it.
#[test]
fn cluster_heavy_cuts_remote_commits_at_the_byte_budget() {
    const BUDGET: u64 = narad_core::dispatcher::REMOTE_COMMIT_BYTES_MAX as u64;
    // The scenario's largest payload and its record's encoding around it.
    const RECORD_MAX: u64 = 8192 + 128;
    const SEEDS_MAX: u64 = 20;
    let scenario = Scenario::parse(include_str!("../../../scenarios/cluster-heavy.toml"))
        .expect("cluster-heavy parses");
    let scenario = Arc::new(scenario);
    let mut largest = 0;
    for seed in 1..=SEEDS_MAX {
        let spec = RunSpec {
            scenario: scenario.clone(),
            scenario_path: "scenarios/cluster-heavy.toml".into(),
            seed,
            plant_bug: None,
            trace: true,
            schedule: None,
        };
        let outcome = run::<crate::node_narad::NaradSimNode>(&spec);
        assert!(!outcome.failed(), "seed {seed}: {}", outcome.reason());
        let lines = outcome.trace_lines.clone().expect("traced");
        // Remote commits only (`to=` names the owner node; a local commit has no budget).
        for line in lines.iter().filter(|line| !line.ends_with(" to=local")) {
            let Some(bytes) = line
                .split(" bytes=")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|bytes| bytes.parse::<u64>().ok())
            else {
                continue;
            };
            assert!(
                bytes <= BUDGET,
                "seed {seed}: a remote commit past the budget: {line}"
            );
            largest = largest.max(bytes);
        }
        if largest > BUDGET - RECORD_MAX {
            return;
        }
    }
    panic!(
        "no remote commit reached the byte budget in {SEEDS_MAX} seeds (largest {largest} bytes)"
    );
}
