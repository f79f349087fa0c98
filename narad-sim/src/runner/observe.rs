//! The observation: the reads the ledger judges, and what a failed run reports about its missing
//! records.
//!
//! Contract: [`World::observe`] waits until every node has booted and its backlog is 0 (or the
//! deadline passes), then reads every partition of every topic, at its owner, from offset 0 to the
//! high watermark;
//! if a record that must be visible is missing and the deadline has not passed, it waits for the
//! deadline and reads again, so a record is unseen only if it is still missing then. A read call
//! that keeps failing is a harness error; a read that does not end within [`READ_CALLS_MAX`] calls
//! too.

use std::sync::Arc;
use std::time::Duration;

use narad_core::{Offset, PartitionId};

use super::server::Call;
use super::{lock, sim_now_ns, World, ADMIN_RETRY, ADMIN_TIMEOUT, STATUS_POLL};
use crate::ledger::{Observation, Outcome, Report, Served};
use crate::payload;
use crate::seam::SimNode;

/// Records asked for per read call.
const READ_RECORDS_MAX: usize = 1000;
/// Read calls per partition before the harness gives up on it (a bound on a node serving forever).
const READ_CALLS_MAX: usize = 100_000;
/// Records of each failure category described in a run's details.
const DETAILS_MAX: usize = 10;
/// Calls asking for a partition's owner before the harness gives up (50 pauses of `ADMIN_RETRY` on
/// top of the calls: longer than a node's boot).
const OWNER_ASKS_MAX: usize = 250;

impl<N: SimNode> World<N> {
    /// Reads every partition of every topic's current incarnation.
    pub(super) async fn read_all(&self) -> Observation {
        let mut observation = Observation::default();
        let kept_down = lock(&self.kept_down).clone();
        for topic in &self.topics {
            for p in 0..topic.spec.partitions {
                if !kept_down.is_empty()
                    && kept_down.contains(&self.owner_of(&topic.spec.name, PartitionId(p)).await)
                {
                    continue; // Unreadable until it restarts: the final read covers it.
                }
                self.read_partition(&topic.spec.name, PartitionId(p), &mut observation)
                    .await;
            }
        }
        observation.at_ns = sim_now_ns();
        observation
    }

    /// Reads one partition from offset 0 to its high watermark into `out`; more than 20 failed
    /// calls are a harness error.
    async fn read_partition(&self, name: &str, partition: PartitionId, out: &mut Observation) {
        let mut from = Offset(0);
        let mut failures = 0;
        let mut last_failure;
        // Resolved once per partition, and again after a failed call.
        let mut owner: Option<usize> = None;
        for _ in 0..READ_CALLS_MAX {
            let read_name = name.to_string();
            let at = match owner {
                Some(at) => at,
                None => *owner.insert(self.owner_of(name, partition).await),
            };
            let result = self.servers[at]
                .call(ADMIN_TIMEOUT, move |node| async move {
                    node.read(&read_name, partition, from, READ_RECORDS_MAX)
                        .await
                })
                .await;
            let batch = match result {
                Call::Done(Ok(batch)) => batch,
                failed @ (Call::Done(Err(_)) | Call::Refused | Call::Reset | Call::TimedOut) => {
                    last_failure = match failed {
                        Call::Done(Err(error)) => format!("{error:?}"),
                        Call::Refused => "refused".to_string(),
                        Call::Reset => "reset".to_string(),
                        _ => "timed out".to_string(),
                    };
                    failures += 1;
                    owner = None;
                    if failures > 20 {
                        self.error(format!(
                            "read {name}/{partition} from {from} keeps failing ({last_failure})"
                        ));
                        return;
                    }
                    tokio::time::sleep(ADMIN_RETRY).await;
                    continue;
                }
            };
            let Some(last) = batch.records.last() else {
                self.observer.event(
                    "harness",
                    format_args!(
                        "read {name}/{partition} from node {at}: ends at {from}, high watermark {}",
                        batch.high_watermark
                    ),
                );
                return;
            };
            from = last.offset.next();
            let topic: Arc<str> = Arc::from(name);
            for record in batch.records {
                out.served.push(
                    Served::new(
                        topic.clone(),
                        batch.topic_id,
                        partition,
                        record.offset,
                        record.payload,
                    )
                    .with_committed_at(record.committed_at_ms),
                );
            }
            if from >= batch.high_watermark {
                self.observer.event(
                    "harness",
                    format_args!(
                        "read {name}/{partition} from node {at}: high watermark {}",
                        batch.high_watermark
                    ),
                );
                return;
            }
        }
        self.error(format!("read {name}/{partition} did not end"));
    }

    /// The node that owns `partition` of `name`, as a node's metadata says (node 0 when none can
    /// say). Reads go there: a read through another node would be forwarded one record at a time.
    pub(super) async fn owner_of(&self, name: &str, partition: PartitionId) -> usize {
        if self.servers.len() == 1 {
            return 0;
        }
        // A node that is still booting has no view yet (it answers `None`): ask the next one, and
        // again after a pause, before falling back to node 0.
        for attempt in 0..OWNER_ASKS_MAX {
            let topic = name.to_string();
            if let Call::Done(Some(owner)) = self
                .admin_server()
                .call(ADMIN_TIMEOUT, move |node| async move {
                    node.owner(&topic, partition)
                })
                .await
            {
                if owner < self.servers.len() {
                    return owner;
                }
            }
            if (attempt + 1) % self.servers.len() == 0 {
                tokio::time::sleep(ADMIN_RETRY).await;
            }
        }
        // A deleted topic has no owner to name: node 0 answers for it as any node would.
        self.observer.event(
            "harness",
            format_args!("no node names the owner of {name}/{partition}: asking node 0"),
        );
        0
    }

    /// Waits for a zero backlog (or `deadline_ns`), then reads; if a 202'd record is still missing
    /// before the deadline, waits for the deadline and reads again.
    pub(super) async fn observe(&self, deadline_ns: u64, what: &str) -> Observation {
        let kept_down = lock(&self.kept_down).clone();
        let missing = |observation: &Observation| {
            let ledger = lock(&self.ledger);
            if kept_down.is_empty() {
                ledger.missing(observation)
            } else {
                ledger.missing_at_deadline(observation)
            }
        };
        for server in &self.servers {
            if kept_down.contains(&server.index) {
                continue;
            }
            if !server.booted(deadline_ns).await {
                self.error(format!(
                    "node {} not booted by the {what} deadline",
                    server.index
                ));
                return Observation::default();
            }
        }
        let started_ns = sim_now_ns();
        let mut backlog_at_start = None;
        loop {
            let mut drained = true;
            let mut backlog = 0;
            for server in self
                .servers
                .iter()
                .filter(|s| !kept_down.contains(&s.index))
            {
                match server
                    .call(ADMIN_TIMEOUT, |node| async move { node.status().await })
                    .await
                {
                    Call::Done(status) => {
                        backlog += status.backlog_records;
                        drained &= status.backlog_records == 0;
                    }
                    _ => drained = false,
                }
            }
            let backlog_at_start = *backlog_at_start.get_or_insert(backlog);
            let now = sim_now_ns();
            if drained || now >= deadline_ns {
                // The drain figure: what the dispatchers still held when this phase began, and how
                // long they took to commit it.
                self.observer.event(
                    "harness",
                    format_args!(
                        "{what} backlog: {backlog_at_start} records, {} after {:.1} s",
                        if drained {
                            "drained".to_string()
                        } else {
                            format!("{backlog} left")
                        },
                        (now - started_ns) as f64 / 1e9
                    ),
                );
                break;
            }
            tokio::time::sleep(STATUS_POLL).await;
        }
        let observation = self.read_all().await;
        let missing_now = missing(&observation);
        let now = sim_now_ns();
        if missing_now == 0 || now >= deadline_ns {
            self.observer.event(
                "harness",
                format_args!(
                    "{what} read: {} served, {missing_now} missing",
                    observation.served.len()
                ),
            );
            lock(&self.reads).push(crate::timeline::ReadMark {
                at_ns: now,
                what: what.to_string(),
                served: observation.served.len() as u64,
                missing: missing_now as u64,
            });
            return observation;
        }
        tokio::time::sleep(Duration::from_nanos(deadline_ns - now)).await;
        let observation = self.read_all().await;
        self.observer.event(
            "harness",
            format_args!(
                "{what} read at the deadline: {} served, {} missing",
                observation.served.len(),
                missing(&observation)
            ),
        );
        observation
    }

    /// Where the first lost and unseen records of `report` came from and where they sit on disk
    /// (durable images), to start a diagnosis there.
    pub(super) fn details(&self, report: &Report) -> Vec<String> {
        let ledger = lock(&self.ledger);
        let mut details = Vec::new();
        // Where the missing records sit on disk (durable images), to start the diagnosis there.
        let mut missing: Vec<u64> = report.lost.iter().take(DETAILS_MAX).copied().collect();
        missing.extend(report.unseen.iter().take(DETAILS_MAX));
        let mut places: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
        if !missing.is_empty() {
            for server in &self.servers {
                for path in server.disk.paths() {
                    let Some(image) = server.disk.durable_image(&path) else {
                        continue;
                    };
                    for found in payload::scan(&image) {
                        if missing.contains(&found.id) {
                            places
                                .entry(found.id)
                                .or_default()
                                .push(format!("node {}: {path}@{}", server.index, found.start));
                        }
                    }
                }
            }
        }
        for (kind, ids) in [("lost", &report.lost), ("unseen", &report.unseen)] {
            for &id in ids.iter().take(DETAILS_MAX) {
                if let Some(entry) = ledger.record(id) {
                    details.push(format!(
                        "{kind} record {id}: {}#{} aimed at {:?}, call #{} {}; durable in {:?}",
                        entry.topic,
                        entry.topic_id,
                        entry.aimed_at.map(|p| p.0),
                        entry.attempt.0,
                        ledger.outcome_of(id).map_or("?", Outcome::name),
                        places.get(&id).map_or(&[][..], Vec::as_slice)
                    ));
                }
            }
        }
        details
    }
}
