//! The fault schedule: an explicit, timed list of fault events ([`crate::fault`]), generated from a
//! seed and a scenario.
//!
//! A schedule is data: a run applies it event by event through the seam, `shrink` deletes events from it
//! (delta debugging) and writes what is left into a regression scenario as `[[schedule]]` tables.
//! Generation draws a Poisson process of events over the safety phase (after `warmup_ms`), each event's
//! kind by the seed's fault weights and its parameters within the scenario's ranges. Times are
//! microseconds of simulated time since the run started.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

pub use crate::fault::{DiskError, FaultEvent, FaultKind, Target};
use crate::scenario::{pick_weighted, Knobs, Scenario};

/// Most events one generated schedule may hold (a bound on a typo'd rate).
pub const EVENTS_MAX: usize = 100_000;

/// Generates the fault schedule of one seed, sorted by time.
pub fn generate(scenario: &Scenario, knobs: &Knobs, rng: &mut ChaCha8Rng) -> Vec<FaultEvent> {
    let mut events = Vec::new();
    let total: u64 = knobs.fault_weights.iter().sum();
    if knobs.faults_per_minute == 0 || total == 0 {
        return events;
    }
    let mean_gap_us = 60_000_000.0 / knobs.faults_per_minute as f64;
    let end_us = scenario.phases.safety_ms * 1000;
    let mut at_us = scenario.faults.warmup_ms * 1000;
    while events.len() < EVENTS_MAX {
        // Exponential gaps: a Poisson process of fault events.
        let unit: f64 = rng.random_range(f64::EPSILON..1.0);
        at_us += (-unit.ln() * mean_gap_us) as u64 + 1;
        if at_us >= end_us {
            break;
        }
        let kind = FaultKind::ALL[pick_weighted(rng, &knobs.fault_weights).expect("total > 0")];
        let mut event = event_of(kind, at_us, scenario, rng);
        // Drawn only in a cluster, so a single node's schedules stay what they were.
        let nodes = scenario.topology.nodes;
        if nodes > 1 && !event.is_global() {
            // Crashes, pauses and partitions strike the leader of the moment one time in
            // `nodes + 1`.
            let leader = matches!(
                kind,
                FaultKind::Crash | FaultKind::Pause | FaultKind::Partition
            ) && rng.random_range(0..=nodes) == nodes;
            let node = (!leader).then(|| rng.random_range(0..nodes));
            event.set_node(node);
            if let FaultEvent::Partition { peer, .. } = &mut event {
                *peer = partition_peer(scenario, node, rng);
            }
        }
        events.push(event);
    }
    events
}

/// The other side of a partition: every other node `all_peers_percent` of the time, else one node
/// other than `node` (when `node` is the leader of the moment, any node: one that turns out to be the
/// leader itself is skipped when it strikes).
fn partition_peer(scenario: &Scenario, node: Option<u32>, rng: &mut ChaCha8Rng) -> Option<u32> {
    let nodes = scenario.topology.nodes;
    if rng.random_range(0..100) < scenario.faults.all_peers_percent.draw(rng) {
        return None;
    }
    match node {
        Some(node) => {
            let other = rng.random_range(0..nodes - 1);
            Some(if other >= node { other + 1 } else { other })
        }
        None => Some(rng.random_range(0..nodes)),
    }
}

fn event_of(kind: FaultKind, at_us: u64, scenario: &Scenario, rng: &mut ChaCha8Rng) -> FaultEvent {
    let f = &scenario.faults;
    let wal_or_partitions =
        |rng: &mut ChaCha8Rng| f.disk_targets[rng.random_range(0..f.disk_targets.len())];
    let disk = |rng: &mut ChaCha8Rng, target, error| FaultEvent::Disk {
        at_us,
        node: None,
        target,
        error,
        chance_ppm: f.chance_ppm.draw(rng) as u32,
        duration_ms: f.episode_ms.draw(rng),
    };
    match kind {
        FaultKind::Crash => FaultEvent::Crash {
            at_us,
            node: None,
            down_ms: f.down_ms.draw(rng),
        },
        FaultKind::Pause => FaultEvent::Pause {
            at_us,
            node: None,
            duration_ms: f.pause_ms.draw(rng),
        },
        FaultKind::WalFsyncEio => disk(rng, Target::Wal, DiskError::FsyncEio),
        FaultKind::PartitionFsyncEio => disk(rng, Target::Partitions, DiskError::FsyncEio),
        FaultKind::WriteEio => {
            let target = wal_or_partitions(rng);
            disk(rng, target, DiskError::WriteEio)
        }
        FaultKind::Enospc => disk(rng, Target::All, DiskError::Enospc),
        FaultKind::SlowDisk => {
            let target = wal_or_partitions(rng);
            FaultEvent::SlowDisk {
                at_us,
                node: None,
                target,
                latency_us: f.slow_us.draw(rng),
                duration_ms: f.episode_ms.draw(rng),
            }
        }
        FaultKind::BitRot => FaultEvent::BitRot {
            at_us,
            node: None,
            target: f.rot_target,
        },
        FaultKind::Partition => FaultEvent::Partition {
            at_us,
            node: None,
            peer: None,
            one_way: rng.random_range(0..100) < f.one_way_percent.draw(rng),
            duration_ms: f.partition_ms.draw(rng),
        },
        FaultKind::Lag => FaultEvent::Lag {
            at_us,
            node: None,
            duration_ms: f.lag_ms.draw(rng),
            cut_ms: f.lag_cut_ms.draw(rng),
        },
        FaultKind::Net => {
            let (a, b) = (f.latency_us.draw(rng), f.latency_us.draw(rng));
            FaultEvent::Net {
                at_us,
                loss_ppm: f.loss_ppm.draw(rng) as u32,
                latency_min_us: a.min(b),
                latency_max_us: a.max(b) + 1,
                duration_ms: f.net_ms.draw(rng),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::tests::MINIMAL;
    use rand::SeedableRng;

    fn scenario() -> Scenario {
        let text = MINIMAL
            .replace("per_minute = [0, 60]", "per_minute = 600")
            .replace("crash = [0, 1]", "crash = 1")
            .replace("bit_rot = 0", "bit_rot = 1")
            .replace("[faults]", "[faults]\nwarmup_ms = 100");
        Scenario::parse(&text).unwrap()
    }

    #[test]
    fn a_seed_generates_the_same_schedule() {
        let scenario = scenario();
        for seed in 0..20 {
            let make = || {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let knobs = scenario.draw(&mut rng);
                generate(&scenario, &knobs, &mut rng)
            };
            assert_eq!(make(), make());
        }
    }

    #[test]
    fn events_fall_inside_the_safety_phase_after_warmup_in_order() {
        let scenario = scenario();
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let knobs = scenario.draw(&mut rng);
        let events = generate(&scenario, &knobs, &mut rng);
        // 600 per minute over 0.9 s: about 9 events.
        assert!(events.len() >= 2, "{events:?}");
        for pair in events.windows(2) {
            assert!(pair[0].at_us() < pair[1].at_us());
        }
        for event in &events {
            assert!(event.at_us() >= 100_000 && event.at_us() < 1_000_000);
        }
    }

    #[test]
    fn zero_weights_never_produce_their_kind() {
        let scenario = scenario();
        for seed in 0..20 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let knobs = scenario.draw(&mut rng);
            for event in generate(&scenario, &knobs, &mut rng) {
                assert!(
                    matches!(
                        event,
                        FaultEvent::Crash { .. }
                            | FaultEvent::BitRot { .. }
                            | FaultEvent::Disk {
                                error: DiskError::FsyncEio,
                                target: Target::Wal,
                                ..
                            }
                    ),
                    "{event:?}"
                );
            }
        }
    }

    #[test]
    fn write_eio_and_slow_disk_pick_only_the_scenario_disk_targets() {
        let text = MINIMAL
            .replace("per_minute = [0, 60]", "per_minute = 6000")
            .replace("wal_fsync_eio = 1", "wal_fsync_eio = 0")
            .replace("write_eio = 0", "write_eio = 1")
            .replace("slow_disk = 0", "slow_disk = 1")
            .replace(
                "slow_us = 1000",
                "slow_us = 1000\ndisk_targets = [\"partitions\"]",
            );
        let scenario = Scenario::parse(&text).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let knobs = scenario.draw(&mut rng);
        let events = generate(&scenario, &knobs, &mut rng);
        assert!(events.len() > 20);
        for event in events {
            match event {
                FaultEvent::Disk { target, .. } | FaultEvent::SlowDisk { target, .. } => {
                    assert_eq!(target, Target::Partitions)
                }
                FaultEvent::Crash { .. } => {}
                FaultEvent::Pause { .. }
                | FaultEvent::BitRot { .. }
                | FaultEvent::Partition { .. }
                | FaultEvent::Lag { .. }
                | FaultEvent::Net { .. } => panic!("{event:?}"),
            }
        }
    }

    #[test]
    fn a_cluster_schedule_aims_at_its_nodes_and_sometimes_at_the_leader() {
        let text = MINIMAL
            .replace("nodes = 1", "nodes = 3")
            .replace("crash = [0, 1]", "crash = 1")
            .replace("per_minute = [0, 60]", "per_minute = 6000");
        let scenario = Scenario::parse(&text).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let knobs = scenario.draw(&mut rng);
        let events = generate(&scenario, &knobs, &mut rng);
        assert!(events.len() > 20);
        let mut struck = [false; 3];
        let mut leader = false;
        for event in &events {
            match event.node() {
                Some(node) => struck[node as usize] = true,
                None => {
                    assert!(matches!(
                        event,
                        FaultEvent::Crash { .. } | FaultEvent::Pause { .. }
                    ));
                    leader = true;
                }
            }
        }
        assert_eq!(struck, [true; 3], "{events:?}");
        assert!(leader, "{events:?}");
        // A single node's events name no node.
        let single =
            Scenario::parse(&MINIMAL.replace("per_minute = [0, 60]", "per_minute = 6000")).unwrap();
        let knobs = single.draw(&mut rng);
        assert!(generate(&single, &knobs, &mut rng)
            .iter()
            .all(|event| event.node().is_none()));
    }

    #[test]
    fn network_faults_name_two_different_nodes_or_the_whole_network() {
        let text = MINIMAL
            .replace("nodes = 1", "nodes = 3")
            .replace("crash = [0, 1]", "crash = 0")
            .replace("wal_fsync_eio = 1", "wal_fsync_eio = 0")
            .replace(
                "bit_rot = 0",
                "bit_rot = 0\npartition = 2\nnet = 1\nloss_ppm = [0, 50000]",
            )
            .replace("per_minute = [0, 60]", "per_minute = 6000");
        let scenario = Scenario::parse(&text).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let knobs = scenario.draw(&mut rng);
        let events = generate(&scenario, &knobs, &mut rng);
        let (mut partitions, mut nets, mut one_way, mut to_all, mut at_leader) = (0, 0, 0, 0, 0);
        for event in &events {
            match *event {
                FaultEvent::Partition {
                    node,
                    peer,
                    one_way: one,
                    duration_ms,
                    ..
                } => {
                    partitions += 1;
                    one_way += u32::from(one);
                    to_all += u32::from(peer.is_none());
                    at_leader += u32::from(node.is_none());
                    assert_eq!(duration_ms, 2000, "the default partition_ms");
                    if let (Some(node), Some(peer)) = (node, peer) {
                        assert_ne!(node, peer, "{event:?}");
                        assert!(node < 3 && peer < 3);
                    }
                }
                FaultEvent::Net {
                    loss_ppm,
                    latency_min_us,
                    latency_max_us,
                    ..
                } => {
                    nets += 1;
                    assert!(loss_ppm <= 50_000);
                    assert!(latency_min_us < latency_max_us && latency_min_us >= 1000);
                    assert!(latency_max_us <= 10_001);
                    assert_eq!(event.node(), None);
                }
                _ => panic!("{event:?}"),
            }
        }
        assert!(partitions > 20 && nets > 10, "{partitions} {nets}");
        assert!(
            one_way > 0 && one_way < partitions,
            "{one_way} of {partitions}"
        );
        assert!(
            to_all > 0 && to_all < partitions,
            "{to_all} of {partitions}"
        );
        assert!(at_leader > 0, "{events:?}");
        // Network faults need a cluster.
        let single = MINIMAL.replace("bit_rot = 0", "bit_rot = 0\npartition = 1");
        assert!(Scenario::parse(&single).unwrap_err().contains("nodes"));
    }

    #[test]
    fn no_rate_means_no_events() {
        let text = MINIMAL.replace("per_minute = [0, 60]", "per_minute = 0");
        let scenario = Scenario::parse(&text).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let knobs = scenario.draw(&mut rng);
        assert!(generate(&scenario, &knobs, &mut rng).is_empty());
    }

    #[test]
    fn an_explicit_schedule_parses_strictly() {
        let text = format!(
            "{MINIMAL}\n[[schedule]]\nkind = \"crash\"\nat_us = 5\ndown_ms = 3\n\n\
             [[schedule]]\nkind = \"disk\"\nat_us = 9\ntarget = \"wal\"\nerror = \"fsync-eio\"\n\
             chance_ppm = 1000000\nduration_ms = 4\n"
        );
        let scenario = Scenario::parse(&text).unwrap();
        assert_eq!(
            scenario.schedule.unwrap(),
            vec![
                FaultEvent::Crash {
                    at_us: 5,
                    node: None,
                    down_ms: 3
                },
                FaultEvent::Disk {
                    at_us: 9,
                    node: None,
                    target: Target::Wal,
                    error: DiskError::FsyncEio,
                    chance_ppm: 1_000_000,
                    duration_ms: 4
                }
            ]
        );
        let bad = format!("{MINIMAL}\n[[schedule]]\nkind = \"crash\"\nat_us = 5\ndown = 3\n");
        assert!(Scenario::parse(&bad).unwrap_err().contains("down"));
    }
}
