//! The simulated queue-mode consumers, and what they saw.
//!
//! Contract: a consumer long-polls a topic through a node drawn at random, works on some records a
//! while (holding their leases), and acks most of what it is handed, nacks some and drops the rest without an answer (a consumer that died: its lease runs
//! out). Every delivery is checked against the ledger at once: a payload that is no record produced
//! to that topic is a foreign delivery. Consumers run through the safety and liveness phases; after
//! the final read, [`World::drain`] consumes and acks until every topic stays empty past a lease's
//! length. The run then holds the node to at-least-once: every record the final read serves (a 202'd
//! record the ledger did not excuse, or an ambiguous one that landed) was delivered to a consumer
//! that acked it: a delivery whose lease a crash took must come again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::server::{Call, Server};
use super::{lock, sim_now_ns, World, ADMIN_RETRY, ADMIN_TIMEOUT};
use crate::ledger::{ConsumeReport, Ledger, Observation};
use crate::payload;
use crate::seam::{derive_seed, AckAnswer, Leased, NodeError, SimNode};

/// How long a consumer's poll waits for a record.
const POLL_WAIT: Duration = Duration::from_millis(200);
/// Percent of deliveries acked; of the rest, half are nacked and half dropped unanswered.
const ACK_PERCENT: u64 = 90;
/// Percent of deliveries the consumer works on before it answers, and the longest such work (under
/// the one-second lease).
const WORK_PERCENT: u64 = 30;
const WORK_MS_MAX: u64 = 600;
/// The drain stops once every topic answered empty for this long: past a lease (the adapter creates
/// topics with one-second leases), so a dropped lease has come back.
const DRAIN_QUIET: Duration = Duration::from_millis(2_500);
/// The drain's pause between rounds that found every topic empty.
const DRAIN_PAUSE: Duration = Duration::from_millis(100);
/// The drain's bound (the run's time limit leaves room for it).
pub(super) const DRAIN_MAX: Duration = Duration::from_secs(240);

/// What the consumers saw.
#[derive(Debug, Default)]
pub struct Consumption {
    /// Deliveries per record id.
    delivered: BTreeMap<u64, u32>,
    /// Record ids acked (204).
    acked: BTreeSet<u64>,
    /// Record ids whose ack may have taken effect without the consumer learning it (the call timed
    /// out, was reset or failed with a 5xx): the node may have acked them, so they are not held to
    /// coming back.
    maybe_acked: BTreeSet<u64>,
    /// Deliveries of no record produced to their topic.
    foreign: Vec<String>,
    /// Where each delivered record was served from (offset stability, with the final reads').
    served_at: Vec<crate::ledger::offsets::ServedAt>,
    /// When each acked copy (incarnation, partition, offset: a record may have several copies)
    /// first answered 204, in ns of the run.
    acked_at: BTreeMap<
        (
            narad_core::TopicId,
            narad_core::PartitionId,
            narad_core::Offset,
        ),
        u64,
    >,
    /// Deliveries of a copy acked before: `(id, where, acked at, delivered at)`, in ns of the
    /// run.
    after_ack: Vec<(u64, String, u64, u64)>,
}

impl Consumption {
    /// Notes a delivery of `leased` from `topic`: its record id, or `None` when it is foreign.
    fn delivered(&mut self, ledger: &Ledger, topic: &str, leased: &Leased) -> Option<u64> {
        let id = match payload::decode(&leased.payload) {
            Ok(id) => id,
            Err(error) => {
                self.foreign.push(format!(
                    "{topic}/{}@{}: payload carries no record id ({error:?})",
                    leased.partition, leased.offset
                ));
                return None;
            }
        };
        match ledger.record(id) {
            Some(entry) if &*entry.topic == topic => {
                *self.delivered.entry(id).or_default() += 1;
                let copy = (entry.topic_id, leased.partition, leased.offset);
                if let Some(&acked_at) = self.acked_at.get(&copy) {
                    let at = format!("{topic}/{}@{}", leased.partition, leased.offset);
                    self.after_ack.push((id, at, acked_at, sim_now_ns()));
                }
                self.served_at
                    .push((entry.topic_id, leased.partition, leased.offset, id));
                Some(id)
            }
            Some(entry) => {
                self.foreign.push(format!(
                    "{topic}/{}@{}: record {id} was produced to {}",
                    leased.partition, leased.offset, entry.topic
                ));
                None
            }
            None => {
                self.foreign.push(format!(
                    "{topic}/{}@{}: record {id} was never produced",
                    leased.partition, leased.offset
                ));
                None
            }
        }
    }

    /// Notes an ack's answer for record `id`, leased from `copy`.
    fn answered(
        &mut self,
        id: u64,
        copy: Option<(
            narad_core::TopicId,
            narad_core::PartitionId,
            narad_core::Offset,
        )>,
        answer: &Call<Result<AckAnswer, NodeError>>,
    ) {
        match answer {
            Call::Done(Ok(AckAnswer::Done)) => {
                self.acked.insert(id);
                if let Some(copy) = copy {
                    self.acked_at.entry(copy).or_insert_with(sim_now_ns);
                }
            }
            // Not acked: the lease was gone, the ack refused, or never sent.
            Call::Done(Ok(AckAnswer::Stale))
            | Call::Done(Err(NodeError::Refused(_)))
            | Call::Refused => {}
            Call::Done(Err(NodeError::Failed(_))) | Call::Reset | Call::TimedOut => {
                self.maybe_acked.insert(id);
            }
        }
    }

    /// Offsets the deliveries and the reads served with two different records (see
    /// `ledger::offsets`).
    pub fn offset_conflicts(&self, reads: &[&Observation]) -> Vec<String> {
        let reads = reads
            .iter()
            .flat_map(|observation| crate::ledger::served_at(observation));
        crate::ledger::offsets::offset_conflicts(self.served_at.iter().copied().chain(reads))
    }

    /// Deliveries of an acked record that nothing excuses: an ack is forgotten only by a crash (the
    /// cursor table holds the cursor, not the offsets acked past it) or, through a move's fallback,
    /// when the leader marks the source dead. So a record acked and delivered again with no fault in
    /// force anywhere in between, before `deadline_ns` (the end of the safety phase: the final power
    /// loss of the whole cluster may follow at once, and is not in the fault log),
    /// broke the queue's promise: a move, for one, hands the acked offsets over.
    pub fn acked_redelivered(
        &self,
        faults: &[super::faults::FaultWindow],
        reboots: &[u64],
        deadline_ns: u64,
    ) -> Vec<String> {
        self.after_ack
            .iter()
            .filter(|&&(_, _, acked_ns, at_ns)| {
                at_ns < deadline_ns
                    && !faults
                        .iter()
                        .any(|window| window.start_ns <= at_ns && window.end_ns >= acked_ns)
                    && !reboots.iter().any(|&at| acked_ns <= at && at <= at_ns)
            })
            .map(|(id, at, acked_ns, at_ns)| {
                format!("record {id} at {at} acked at {acked_ns} ns was delivered again at {at_ns} ns, no fault in between")
            })
            .collect()
    }

    /// Holds the deliveries to the final read: every record it serves was acked by a consumer.
    pub fn judge(&self, after_final: &Observation) -> ConsumeReport {
        let mut unacked: Vec<u64> = after_final
            .served
            .iter()
            .filter_map(|served| served.record_id().ok())
            .filter(|id| !self.acked.contains(id) && !self.maybe_acked.contains(id))
            .collect();
        unacked.sort_unstable();
        unacked.dedup();
        ConsumeReport {
            delivered: self.delivered.values().map(|&count| u64::from(count)).sum(),
            redelivered: self
                .delivered
                .values()
                .map(|&count| u64::from(count.saturating_sub(1)))
                .sum(),
            acked: self.acked.len() as u64,
            unacked,
            foreign: self.foreign.clone(),
            acked_redelivered: Vec::new(),
        }
    }
}

/// A call's failure, in words (for the trace).
fn failure<T: std::fmt::Debug>(call: Call<Result<T, NodeError>>) -> String {
    match call {
        Call::Done(Ok(answer)) => format!("{answer:?}"),
        Call::Done(Err(error)) => error.to_string(),
        Call::Refused => "refused".into(),
        Call::Reset => "reset".into(),
        Call::TimedOut => "timed out".into(),
    }
}

impl<N: SimNode> World<N> {
    /// One queue-mode consume of `topic` through `server`, noted in the consumption: the leased
    /// record and its id (`None`: foreign), `None` when nothing came, or why the call failed.
    async fn lease(
        &self,
        server: &Server<N>,
        topic: &str,
        wait: Duration,
    ) -> Result<Option<(Leased, Option<u64>)>, String> {
        let name = topic.to_string();
        let leased = match server
            .call(ADMIN_TIMEOUT + wait, move |node| async move {
                node.queue_consume(&name, wait).await
            })
            .await
        {
            Call::Done(Ok(Some(leased))) => leased,
            Call::Done(Ok(None)) => return Ok(None),
            other => return Err(failure(other)),
        };
        let id = {
            let ledger = lock(&self.ledger);
            lock(&self.consumption).delivered(&ledger, topic, &leased)
        };
        Ok(Some((leased, id)))
    }

    /// Acks (or nacks) `leased` through `server`, noting an ack's answer; why it was not acked.
    async fn answer(
        &self,
        server: &Server<N>,
        topic: &str,
        leased: &Leased,
        id: Option<u64>,
        nack: bool,
    ) -> Result<(), String> {
        let name = topic.to_string();
        let handle = leased.handle.clone();
        let answer = server
            .call(ADMIN_TIMEOUT, move |node| async move {
                node.queue_ack(&name, &handle, nack).await
            })
            .await;
        if let (Some(id), false) = (id, nack) {
            let copy = lock(&self.ledger)
                .record(id)
                .map(|entry| (entry.topic_id, leased.partition, leased.offset));
            lock(&self.consumption).answered(id, copy, &answer);
        }
        match answer {
            Call::Done(Ok(AckAnswer::Done)) => Ok(()),
            other => Err(failure(other)),
        }
    }

    /// One consume through a node drawn in turn, and its ack, nack or silence; whether a record came.
    async fn consume_once(&self, rng: &mut ChaCha8Rng, topic: &str, wait: Duration) -> bool {
        let (leased, id) = match self.lease(self.admin_server(), topic, wait).await {
            Ok(Some(leased)) => leased,
            Ok(None) => return false,
            Err(_) => {
                tokio::time::sleep(ADMIN_RETRY).await;
                return false;
            }
        };
        let roll = rng.random_range(0..100);
        if roll >= ACK_PERCENT && roll % 2 == 0 {
            return true; // Dropped: the lease runs out.
        }
        // Some records take the consumer a while (held under its lease when a crash strikes).
        if rng.random_range(0..100) < WORK_PERCENT {
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..WORK_MS_MAX))).await;
        }
        let nack = roll >= ACK_PERCENT;
        let _ = self
            .answer(self.admin_server(), topic, &leased, id, nack)
            .await;
        true
    }

    /// A consumer task: polls the topics in random order until told to stop.
    pub(super) async fn consumer(self: Arc<Self>, index: u64) {
        let mut rng =
            ChaCha8Rng::seed_from_u64(derive_seed(self.spec.seed, &format!("consumer/{index}")));
        while !self
            .consumers_stop
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            let topic = &self.topics[rng.random_range(0..self.topics.len())];
            let name = topic.spec.name.clone();
            self.consume_once(&mut rng, &name, POLL_WAIT).await;
        }
    }

    /// Consumes and acks every topic through every node at once (a cluster forwards each consume
    /// to the owners, one at a time: a single drain would take minutes) until each stays empty for
    /// [`DRAIN_QUIET`] (at most [`DRAIN_MAX`]).
    pub(super) async fn drain(self: &Arc<Self>) {
        let started = sim_now_ns();
        let drains: Vec<_> = (0..self.servers.len())
            .map(|index| {
                let world = self.clone();
                tokio::spawn(async move { world.drain_through(index, started).await })
            })
            .collect();
        let mut deliveries = 0;
        for drain in drains {
            deliveries += drain.await.unwrap_or(0);
        }
        let report = lock(&self.consumption).judge(&Observation::default());
        self.observer.event(
            "harness",
            format_args!(
                "drained in {:.1} s ({deliveries} deliveries): {} delivered, {} acked",
                (sim_now_ns() - started) as f64 / 1e9,
                report.delivered,
                report.acked
            ),
        );
    }

    /// One node's drain; the deliveries it made.
    async fn drain_through(&self, index: usize, started: u64) -> u64 {
        let max = DRAIN_MAX.as_nanos() as u64;
        let mut quiet_since = sim_now_ns();
        let mut deliveries = 0;
        while sim_now_ns() - started < max {
            let mut got = false;
            for topic in &self.topics {
                // Only acks from here: the drain is a diligent consumer, as fast as it is handed.
                while sim_now_ns() - started < max && self.drain_once(index, &topic.spec.name).await
                {
                    got = true;
                    deliveries += 1;
                }
            }
            if got {
                quiet_since = sim_now_ns();
            } else if sim_now_ns() - quiet_since >= DRAIN_QUIET.as_nanos() as u64 {
                break;
            } else {
                tokio::time::sleep(DRAIN_PAUSE).await;
            }
        }
        deliveries
    }

    /// One consume of `topic` through node `index`, acked at once; whether a record came.
    async fn drain_once(&self, index: usize, topic: &str) -> bool {
        let server = &self.servers[index];
        let (leased, id) = match self.lease(server, topic, Duration::ZERO).await {
            Ok(Some(leased)) => leased,
            Ok(None) => return false,
            Err(what) => {
                self.observer
                    .event("client", format_args!("drain: consume {topic}: {what}"));
                tokio::time::sleep(ADMIN_RETRY).await;
                return false;
            }
        };
        if let Err(what) = self.answer(server, topic, &leased, id, false).await {
            self.observer.event(
                "client",
                format_args!(
                    "drain: {topic}/{}@{} ({}) not acked: {what}",
                    leased.partition, leased.offset, leased.handle
                ),
            );
        }
        true
    }
}
