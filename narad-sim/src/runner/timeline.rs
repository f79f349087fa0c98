//! Gathers a run's [`TimelineData`] at its end (only with the readable trace: `--trace`,
//! `--timeline`).

use std::collections::{BTreeMap, BTreeSet};

use narad_core::PartitionId;

use super::{lock, sim_now_ns, World};
use crate::ledger::{Observation, Report};
use crate::seam::SimNode;
use crate::timeline::{Arrow, CallMark, FaultBand, ReadMark, TimelineData};

impl<N: SimNode> World<N> {
    /// What the run's timeline shows; `kept` are the nodes kept down through the liveness deadline.
    pub(super) async fn timeline(
        &self,
        report: &Report,
        after_final: &Observation,
        kept: &[usize],
    ) -> TimelineData {
        let heal_ns = self.safety_end_ns;
        let reads = lock(&self.reads).clone();
        let faults = self.fault_bands(&reads, kept);
        let owners = self.partition_owners().await;

        let ledger = lock(&self.ledger);
        let failed_attempts: BTreeSet<_> = report
            .lost
            .iter()
            .chain(&report.unseen)
            .filter_map(|&id| ledger.record(id).map(|entry| entry.attempt))
            .collect();
        let noted = ledger.calls();
        let calls = noted
            .iter()
            .map(|&(attempt, via, outcome, records)| CallMark {
                node: via.node as usize,
                at_ns: via.at_ns,
                outcome: outcome.name(),
                records,
                failed_record: failed_attempts.contains(&attempt),
            })
            .collect();
        // A rerouted record's copy off its partition: an arrow from the owner it was aimed at to
        // the owner of the partition that took it, when its call was sent.
        let rerouted: BTreeSet<u64> = report.rerouted.iter().copied().collect();
        let sent_at: BTreeMap<_, _> = noted
            .iter()
            .map(|&(attempt, via, _, _)| (attempt, via.at_ns))
            .collect();
        let mut reroutes = Vec::new();
        for served in &after_final.served {
            let Ok(id) = served.record_id() else {
                continue;
            };
            if !rerouted.contains(&id) {
                continue;
            }
            let Some(entry) = ledger.record(id) else {
                continue;
            };
            let Some(aimed) = entry.aimed_at else {
                continue;
            };
            if aimed == served.partition || *entry.topic != *served.topic {
                continue;
            }
            let owner = |partition: PartitionId| {
                owners
                    .get(&format!("{}/{}", entry.topic, partition.0))
                    .copied()
            };
            if let (Some(from), Some(to)) = (owner(aimed), owner(served.partition)) {
                reroutes.push(Arrow {
                    from,
                    to,
                    at_ns: sent_at.get(&entry.attempt).copied().unwrap_or(0),
                    count: 1,
                });
            }
        }
        drop(ledger);

        TimelineData {
            scenario: self.spec.scenario_path.clone(),
            seed: self.spec.seed,
            plant_bug: self.spec.plant_bug.map(|bug| bug.name().to_string()),
            nodes: self.servers.len(),
            safety_end_ns: heal_ns,
            end_ns: sim_now_ns(),
            faults,
            calls,
            reads,
            reroutes,
            owners,
            verdict: format!("accepted={} {}", report.accepted, report.verdict_line()),
            failure: None,
        }
    }

    /// The faults as bands: each applied fault up to the heal, the nodes kept down through the
    /// liveness read, and the final crash.
    fn fault_bands(&self, reads: &[ReadMark], kept: &[usize]) -> Vec<FaultBand> {
        let heal_ns = self.safety_end_ns;
        let mut faults: Vec<FaultBand> = lock(&self.fault_log)
            .iter()
            .map(|window| FaultBand {
                kind: window.kind,
                label: window.label.clone(),
                node: window.node,
                peer: window.peer,
                start_ns: window.start_ns,
                // Every fault ends at the heal at the latest.
                end_ns: window.end_ns.min(heal_ns).max(window.start_ns),
            })
            .collect();
        // The liveness read ends the phase a kept-down node sits out.
        let liveness_ns = reads
            .iter()
            .find(|read| read.what == "liveness")
            .map_or(heal_ns, |read| read.at_ns);
        for &node in kept {
            faults.push(FaultBand {
                kind: "kept-down",
                label: format!("node {node} kept down through the liveness deadline"),
                node: Some(node),
                peer: None,
                start_ns: heal_ns,
                end_ns: liveness_ns,
            });
        }
        if self.spec.scenario.phases.final_crash {
            for node in 0..self.servers.len() {
                faults.push(FaultBand {
                    kind: "final-crash",
                    label: format!("final power loss of node {node}"),
                    node: Some(node),
                    peer: None,
                    start_ns: liveness_ns,
                    end_ns: liveness_ns,
                });
            }
        }
        faults
    }

    /// The owner of every partition (`topic/partition`), as the run ends.
    async fn partition_owners(&self) -> BTreeMap<String, usize> {
        let mut owners = BTreeMap::new();
        for topic in &self.topics {
            for partition in 0..topic.spec.partitions {
                let owner = self
                    .owner_of(&topic.spec.name, PartitionId(partition))
                    .await;
                owners.insert(format!("{}/{partition}", topic.spec.name), owner);
            }
        }
        owners
    }
}
