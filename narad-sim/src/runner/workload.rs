//! The simulated clients: topic management, the producers and the churn of topics.
//!
//! Contract: every record is registered in the [`Ledger`](crate::ledger::Ledger) before the call that
//! carries it is sent, and the call's outcome is recorded when it ends, so the ledger knows every
//! attempt whatever the node does. A producer holds its topic's gate shared for a call and churn holds
//! it exclusively while it deletes and recreates the topic, so every record is attributed to the
//! incarnation it was sent to; a deleted incarnation is reported to the ledger before the next one
//! exists. Producers stop at the end of the safety phase; topic management retries through failures
//! until a deadline and reports what it could not do as a harness error.

use std::sync::Arc;
use std::time::Duration;

use narad_core::{PartitionId, TopicId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::server::Call;
use super::{lock, sim_now_ns, TopicRuntime, World, ADMIN_RETRY, ADMIN_TIMEOUT};
use crate::ledger::{key_partition, Outcome};
use crate::payload;
use crate::scenario::pick_weighted;
use crate::seam::{derive_seed, NodeError, ProduceRecord, SimNode, TopicInfo};
use crate::trace::TraceField;

/// How often the clients look whether a topic change reached a node.
const PROPAGATION_POLL: Duration = Duration::from_millis(5);

impl<N: SimNode> World<N> {
    /// Creates `topic` and learns its incarnation, retrying through failures until `deadline_ns`.
    /// `deleted` is the incarnation churn just deleted: a node whose replica lags still describes
    /// it, and a client that took that answer for the topic it created would attribute every later
    /// record to a dead incarnation.
    pub(super) async fn create_topic(
        &self,
        topic: &TopicRuntime,
        deleted: Option<TopicId>,
        deadline_ns: u64,
    ) -> Option<TopicId> {
        let name = topic.spec.name.clone();
        let partitions = topic.spec.partitions;
        while sim_now_ns() < deadline_ns {
            let create_name = name.clone();
            let created = self
                .admin_server()
                .call(ADMIN_TIMEOUT, move |node| async move {
                    node.create_topic(&create_name, partitions).await
                })
                .await;
            if let Call::Done(Ok(info)) = created {
                self.observer
                    .event("client", format_args!("created {name}#{}", info.id));
                self.propagated(topic, info.id, deadline_ns).await;
                return Some(info.id);
            }
            // Ambiguous or refused (it may exist already): ask what is there.
            if let Some(Some(info)) = self.describe(topic).await {
                if info.partitions == partitions && deleted.is_none_or(|old| info.id > old) {
                    self.observer
                        .event("client", format_args!("found {name}#{}", info.id));
                    self.propagated(topic, info.id, deadline_ns).await;
                    return Some(info.id);
                }
            }
            tokio::time::sleep(ADMIN_RETRY).await;
        }
        None
    }

    /// Waits until every node that is up describes `name` as incarnation `id` (or `deadline_ns`
    /// passes). The clients learn of a topic (re)creation only then: a node whose replica has not
    /// applied it yet takes produces for the incarnation it knows, which the spec allows and the
    /// ledger, attributing records to the incarnation the clients know, would call lost. A node
    /// that is down is not waited for: it catches up before it serves (its readiness waits for the
    /// leader). Nor is one whose view a lag holds, nor one still behind at the deadline: each is
    /// noted in the topic's [`stale_on`](super::TopicRuntime::stale_on) for the whole incarnation,
    /// and the clients send through the others.
    async fn propagated(&self, topic: &TopicRuntime, id: TopicId, deadline_ns: u64) {
        let name = topic.spec.name.as_str();
        lock(&topic.stale_on).clear();
        if self.servers.len() == 1 {
            return;
        }
        for server in &self.servers {
            let caught_up = loop {
                if server.view_held() {
                    // Down or up, it serves the view it holds until the lag ends.
                    break false;
                }
                if lock(&server.state).down {
                    break true;
                }
                if sim_now_ns() >= deadline_ns {
                    break false;
                }
                let describe_name = name.to_string();
                let known = server
                    .call(ADMIN_TIMEOUT, move |node| async move {
                        node.describe_topic(&describe_name).await
                    })
                    .await;
                match known {
                    Call::Done(Ok(Some(info))) if info.id == id => break true,
                    // Booting nodes too: one may turn ready a round trip behind.
                    _ => tokio::time::sleep(PROPAGATION_POLL).await,
                }
            };
            if !caught_up {
                lock(&topic.stale_on).insert(server.index);
            }
        }
    }

    /// What a node says of `topic`, asking one that knew its current incarnation where one can
    /// answer (not one in [`stale_on`](super::TopicRuntime::stale_on)); `None` if no answer came,
    /// or it came from a view a lag held (it may predate any change of the topic, and a delete
    /// confirmed by a view that never had the incarnation would let churn recreate over a live
    /// one).
    async fn describe(&self, topic: &TopicRuntime) -> Option<Option<TopicInfo>> {
        let describe_name = topic.spec.name.clone();
        let stale = lock(&topic.stale_on).clone();
        let server = self.admin_server_avoiding(&stale);
        let before = server.hold_mark()?;
        let answer = server
            .call(ADMIN_TIMEOUT, move |node| async move {
                node.describe_topic(&describe_name).await
            })
            .await;
        if server.hold_mark() != Some(before) {
            return None;
        }
        match answer {
            Call::Done(Ok(info)) => Some(info),
            Call::Done(Err(_)) | Call::Refused | Call::Reset | Call::TimedOut => None,
        }
    }

    /// Deletes the incarnation `old` of `topic`, retrying until the node confirms it is gone.
    async fn delete_topic(&self, topic: &TopicRuntime, old: TopicId, deadline_ns: u64) -> bool {
        let name = topic.spec.name.clone();
        while sim_now_ns() < deadline_ns {
            let delete_name = name.clone();
            let _ = self
                .admin_server()
                .call(ADMIN_TIMEOUT, move |node| async move {
                    node.delete_topic(&delete_name).await
                })
                .await;
            match self.describe(topic).await {
                Some(None) => return true,
                // A newer incarnation: the delete took, and a create (an ambiguous one of an
                // earlier churn, retried) followed it.
                Some(Some(info)) if info.id > old => return true,
                Some(Some(_)) | None => tokio::time::sleep(ADMIN_RETRY).await,
            }
        }
        false
    }

    /// Produces one call's worth of records, as one producer.
    async fn produce_once(&self, rng: &mut ChaCha8Rng) {
        let topic = &self.topics[rng.random_range(0..self.topics.len())];
        let mode = pick_weighted(rng, &self.knobs.mode_weights).expect("weights are not all 0");
        let batch = pick_weighted(rng, &self.knobs.shape_weights) == Some(1);
        let mut count = if batch {
            self.knobs.batch_records.draw(rng)
        } else {
            1
        };
        if let Some(max) = self.spec.scenario.workload.records_max {
            count = count.min(max.saturating_sub(lock(&self.ledger).len() as u64));
            if count == 0 {
                return;
            }
        }
        let _gate = topic.gate.read().await;
        let Some(topic_id) = *lock(&topic.current) else {
            return;
        };
        if lock(&topic.stale_on).len() == self.servers.len() {
            // No node is known to serve this incarnation: nothing a client sends could be
            // attributed to it.
            return;
        }
        let partitions = topic.spec.partitions;
        let explicit = (mode == 2).then(|| PartitionId(rng.random_range(0..partitions)));
        let mut records = Vec::with_capacity(count as usize);
        let attempt;
        {
            let mut ledger = lock(&self.ledger);
            attempt = ledger.begin();
            for _ in 0..count {
                let key = (mode == 0)
                    .then(|| format!("k{}", rng.random_range(0..self.knobs.keys)).into_bytes());
                let aimed =
                    explicit.or_else(|| key.as_deref().map(|k| key_partition(k, partitions)));
                let id = ledger.add_record(attempt, &topic.spec.name, topic_id, aimed);
                let size = self.knobs.payload_bytes.draw(rng) as usize;
                records.push(ProduceRecord {
                    key,
                    payload: payload::encode(id, size),
                });
            }
        }
        *lock(&self.produce_calls) += 1;
        let name = topic.spec.name.clone();
        // Any node takes produces (drawn only in a cluster: a single node's runs replay as before).
        let via = match self.servers.len() {
            1 => 0,
            count => {
                let drawn = rng.random_range(0..count);
                // A node still lagging behind this incarnation passes the call to the next one.
                let stale = lock(&topic.stale_on);
                (0..count)
                    .map(|step| (drawn + step) % count)
                    .find(|index| !stale.contains(index))
                    .expect("a node serves this incarnation")
            }
        };
        // When a call was sent also bounds when its records were committed (retention's age rule).
        if self.servers.len() > 1 || !self.spec.scenario.retention.is_default() {
            lock(&self.ledger).set_via(attempt, via as u32, sim_now_ns());
        }
        let result = self.servers[via]
            .call_watched(&self.watchdog, self.timeout(), move |node| async move {
                if batch {
                    node.produce_batch(&name, explicit, records).await
                } else {
                    let record = records.pop().expect("one record");
                    node.produce(&name, explicit, record).await
                }
            })
            .await;
        let outcome = match result {
            Call::Done(Ok(())) => Outcome::Accepted,
            Call::Done(Err(NodeError::Refused(_))) => Outcome::Refused,
            Call::Done(Err(NodeError::Failed(_))) | Call::Refused | Call::Reset => Outcome::Failed,
            Call::TimedOut => Outcome::TimedOut,
        };
        lock(&self.ledger).complete(attempt, outcome);
        // One event per produce call: hashed by its fields, formatted only for `--trace`.
        self.observer.event_fields(
            "client",
            &[
                TraceField::Str("produce"),
                TraceField::U64(u64::from(attempt.0)),
                TraceField::Str(&topic.spec.name),
                TraceField::U64(topic_id.0),
                TraceField::U64(count),
                // 0 = no explicit partition, else its number + 1.
                TraceField::U64(explicit.map_or(0, |p| u64::from(p.0) + 1)),
                TraceField::Str(outcome.name()),
                TraceField::U64(via as u64),
            ],
            format_args!(
                "produce #{} via node {via} {}#{topic_id} records={count} partition={:?} -> {}",
                attempt.0,
                topic.spec.name,
                explicit.map(|p| p.0),
                outcome.name()
            ),
        );
    }

    fn records_exhausted(&self) -> bool {
        self.spec
            .scenario
            .workload
            .records_max
            .is_some_and(|max| lock(&self.ledger).len() as u64 >= max)
    }

    /// One producer: produce calls at the seed's rate (Poisson arrivals) until the safety phase ends
    /// or the scenario's record budget is spent.
    pub(super) async fn producer(self: Arc<Self>, index: u64) {
        let mut rng =
            ChaCha8Rng::seed_from_u64(derive_seed(self.spec.seed, &format!("producer/{index}")));
        let mean_gap_ns = 1e9 * self.knobs.producers as f64 / self.knobs.rate_per_s as f64;
        loop {
            let unit: f64 = rng.random_range(f64::EPSILON..1.0);
            tokio::time::sleep(Duration::from_nanos((-unit.ln() * mean_gap_ns) as u64)).await;
            if sim_now_ns() >= self.safety_end_ns || self.records_exhausted() {
                return;
            }
            self.produce_once(&mut rng).await;
        }
    }

    /// Deletes and recreates a churning topic until the safety phase ends (a cycle in progress
    /// finishes first).
    pub(super) async fn churn(self: Arc<Self>, index: usize) {
        let topic = &self.topics[index];
        let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(
            self.spec.seed,
            &format!("churn/{}", topic.spec.name),
        ));
        let mean_ns = self.knobs.churn_every_ms as f64 * 1e6;
        let hard_deadline_ns =
            self.safety_end_ns + self.spec.scenario.phases.liveness_ms * 1_000_000 / 2;
        loop {
            let unit: f64 = rng.random_range(f64::EPSILON..1.0);
            tokio::time::sleep(Duration::from_nanos((-unit.ln() * mean_ns) as u64)).await;
            if sim_now_ns() >= self.safety_end_ns {
                return;
            }
            let _gate = topic.gate.write().await;
            let Some(old) = *lock(&topic.current) else {
                return;
            };
            self.observer
                .event("client", format_args!("churn {}#{old}", topic.spec.name));
            if !self.delete_topic(topic, old, hard_deadline_ns).await {
                self.error(format!(
                    "topic {}#{old} could not be deleted",
                    topic.spec.name
                ));
                return;
            }
            lock(&self.ledger).incarnation_deleted(old);
            *lock(&topic.current) = None;
            match self.create_topic(topic, Some(old), hard_deadline_ns).await {
                Some(id) => *lock(&topic.current) = Some(id),
                None => {
                    self.error(format!("topic {} could not be recreated", topic.spec.name));
                    return;
                }
            }
        }
    }
}
