//! Partition moves on this node: the destination's copy ([`copy`]), the source's reads, freeze and
//! lapse ([`source`]), the queue-mode handoff ([`queue`]), and the leader's duties.
//!
//! Every state change of a move is a metastore command, so every replica agrees on it: the plan
//! (`PlanMove`: the target), the freeze (`MoveFrozen`, with the final high watermark), the switch
//! (`SwitchOwner`, a compare-and-swap on owner, target and final watermark) and the abort
//! (`AbortMove`). This module only reacts to the replica:
//! - **Destination.** A move to this node starts its copy task (one per move).
//! - **Source.** A frozen move from this node (after a restart too) gets its lapse watch.
//! - **Leader.** The leader aborts moves whose source or destination it marked dead (a dead source
//!   cannot be copied from, a dead destination would hold a move slot for ever), and plans moves:
//!   always off draining members, and, with `cluster.auto_rebalance`, once a member joined or
//!   stopped draining, towards every alive, non-draining member's fair share
//!   (`narad_core::metastore::plan_rebalance`) until nothing is left to plan; at most
//!   `cluster.max_moves_in_flight` at a time. A pass runs on every replica change and every second;
//!   passes never overlap.

mod copy;
mod queue;
mod source;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use narad_core::codec::cluster::{Control, ControlAnswer};
use narad_core::disk::Disk;
use narad_core::ids::{NodeId, PartitionId};
use narad_core::metastore::{plan_rebalance, Command, MetaState};
use narad_core::planted::Plant;

use crate::cluster::Cluster;
use crate::metastore::Metastore;
use crate::metrics::Metrics;
use crate::node::consumers::Consumers;
use crate::node::partitions::PartitionHost;

pub use copy::{MOVE_FREEZE_TIMEOUT, MOVE_READ_TIMEOUT, TAIL_RECORDS};
pub use source::{FREEZE_TTL, MOVE_READ_RECORDS_MAX};

/// How often the leader's pass and the destination's scan run without a replica change.
const PASS_INTERVAL: Duration = Duration::from_secs(1);

/// What [`Moves::spawn`] needs.
pub struct MovesSetup {
    /// This node.
    pub node: NodeId,
    /// The node's metastore.
    pub metastore: Metastore,
    /// The node's partition host (the source's reads and freezes).
    pub partitions: PartitionHost,
    /// The node's queue-mode consumers (the queue handoff).
    pub consumers: Consumers,
    /// The cluster transport.
    pub cluster: Cluster,
    /// The node's disk (the destination's copy).
    pub disk: Arc<dyn Disk>,
    /// `storage.partition_segment_bytes`: the copy's segment size.
    pub segment_bytes: u64,
    /// The node's metrics.
    pub metrics: Arc<Metrics>,
    /// `cluster.max_moves_in_flight`.
    pub max_in_flight: u32,
    /// `cluster.auto_rebalance`.
    pub auto_rebalance: bool,
    /// Bytes copied so far by the moves to this node, for `GET /v1/cluster/moves`.
    pub progress: Arc<crate::http::MoveProgress>,
    /// The bug planted in the moves (simulator only).
    pub plant: Plant,
}

struct Inner {
    setup: MovesSetup,
    /// Copy tasks running: (topic, partition, planned_at).
    running: Mutex<BTreeSet<(String, PartitionId, u64)>>,
    /// Copy tasks ended (switched or gone), never started again; pruned of moves the replica no
    /// longer lists.
    ended: Mutex<BTreeSet<(String, PartitionId, u64)>>,
    /// Lapse watches running: (topic, partition, planned_at).
    lapse_watched: Mutex<BTreeSet<(String, PartitionId, u64)>>,
    /// A leader pass is running.
    passing: AtomicBool,
    /// A member joined or stopped draining since the last balanced plan (`auto_rebalance`).
    rebalancing: AtomicBool,
}

/// The node's move duties; see the module documentation.
#[derive(Clone)]
pub struct Moves {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Moves {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Moves")
            .field("node", &self.inner.setup.node)
            .finish_non_exhaustive()
    }
}

impl Moves {
    /// Starts the duties; they end when the cluster transport closes.
    pub fn spawn(mut setup: MovesSetup) -> Moves {
        setup.max_in_flight = setup.max_in_flight.max(1);
        let moves = Moves {
            inner: Arc::new(Inner {
                setup,
                running: Mutex::new(BTreeSet::new()),
                ended: Mutex::new(BTreeSet::new()),
                lapse_watched: Mutex::new(BTreeSet::new()),
                passing: AtomicBool::new(false),
                rebalancing: AtomicBool::new(false),
            }),
        };
        let watching = moves.clone();
        tokio::spawn(async move { watching.watch().await });
        moves
    }

    async fn watch(&self) {
        let mut views = self.inner.setup.metastore.subscribe();
        // The members and the draining ones last seen: a member that joins or stops draining
        // starts a rebalance (with `auto_rebalance`), which goes on until nothing is left to plan.
        let mut seen: Option<(BTreeSet<NodeId>, BTreeSet<NodeId>)> = None;
        let mut tick = tokio::time::interval(PASS_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = views.changed() => if changed.is_err() { return },
                _ = tick.tick() => {}
                () = self.inner.setup.cluster.closed() => return,
            }
            let view = self.inner.setup.metastore.view();
            if !view.caught_up {
                continue;
            }
            let state = &view.state;
            self.inner
                .setup
                .metrics
                .moves
                .in_flight
                .set(i64::try_from(state.moves().len()).unwrap_or(i64::MAX));
            self.inner
                .ended
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(topic, partition, planned_at)| {
                    state
                        .move_of(topic, *partition)
                        .is_some_and(|moving| moving.planned_at == *planned_at)
                });
            for ((topic, partition), moving) in state.moves() {
                if moving.to == self.inner.setup.node {
                    self.start_destination(topic.clone(), *partition, moving.clone());
                }
                if moving.from == self.inner.setup.node && moving.final_hw.is_some() {
                    self.watch_lapse(topic.clone(), *partition, moving.planned_at, moving.to);
                }
            }
            let members: BTreeSet<NodeId> = state.members().keys().copied().collect();
            let draining = state.draining().clone();
            if let Some((before, was_draining)) = &seen {
                let joined = members.difference(before).next().is_some();
                let undrained = was_draining.difference(&draining).next().is_some();
                if joined || undrained {
                    self.inner.rebalancing.store(true, Ordering::Release);
                }
            }
            seen = Some((members, draining));
            if view.leader == Some(self.inner.setup.node)
                && !self.inner.passing.swap(true, Ordering::AcqRel)
            {
                let leader = self.clone();
                let state = state.clone();
                tokio::spawn(async move {
                    leader.leader_pass(&state).await;
                    leader.inner.passing.store(false, Ordering::Release);
                });
            }
        }
    }

    /// The leader's pass over the replica `state`: aborts, then plans.
    async fn leader_pass(&self, state: &MetaState) {
        for ((topic, partition), moving) in state.moves() {
            let stuck = !state.is_alive(moving.from) || !state.is_alive(moving.to);
            if stuck {
                tracing::warn!(
                    topic,
                    partition = partition.0,
                    from = moving.from.0,
                    to = moving.to.0,
                    "aborting a move whose source or destination is dead"
                );
                let abort = Command::AbortMove {
                    topic: topic.clone(),
                    partition: *partition,
                    to: Some(moving.to),
                    move_id: Some(moving.planned_at),
                };
                let _ = self.inner.setup.metastore.propose(abort).await;
            }
        }
        for order in self.orders(state) {
            let command = Command::PlanMove {
                order,
                max_in_flight: self.inner.setup.max_in_flight,
            };
            if self.inner.setup.metastore.propose(command).await.is_err() {
                break;
            }
        }
    }

    /// The moves the leader plans on its own: off draining members always; towards the fair shares
    /// with `auto_rebalance`.
    fn orders(&self, state: &MetaState) -> Vec<narad_core::metastore::MoveOrder> {
        let plan = plan_rebalance(state, self.inner.setup.max_in_flight as usize);
        if self.inner.setup.auto_rebalance && self.inner.rebalancing.load(Ordering::Acquire) {
            if plan.is_empty() && state.moves().is_empty() {
                self.inner.rebalancing.store(false, Ordering::Release);
            }
            return plan;
        }
        plan.into_iter()
            .filter(|order| {
                state.is_draining(order.from) || !state.members().contains_key(&order.from)
            })
            .collect()
    }

    /// Answers a move's request from peer `from` (copy reads, the freeze, the queue handoff).
    pub async fn answer(&self, from: NodeId, control: Control) -> ControlAnswer {
        match control {
            Control::MoveRead {
                topic,
                topic_id,
                partition,
                offset,
            } => {
                self.move_read(from, topic, topic_id, partition, offset)
                    .await
            }
            Control::MoveFreeze {
                topic,
                topic_id,
                partition,
                move_id,
            } => {
                self.move_freeze(from, topic, topic_id, partition, move_id)
                    .await
            }
            Control::MoveQueue {
                topic,
                topic_id,
                partition,
            } => self.move_queue(from, topic, topic_id, partition).await,
            Control::Raft { .. }
            | Control::Heartbeat { .. }
            | Control::Propose { .. }
            | Control::ReadIndex
            | Control::Replay { .. }
            | Control::Stat { .. }
            | Control::Produce { .. }
            | Control::QueueConsume { .. }
            | Control::QueueSettle { .. } => {
                ControlAnswer::BadRequest("not a partition move's request".into())
            }
        }
    }

    fn set_progress(&self, topic: &str, partition: PartitionId, bytes: Option<u64>) {
        self.inner.setup.progress.set(topic, partition, bytes);
    }
}
