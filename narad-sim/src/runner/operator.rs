//! The simulated operator of `[moves]`: while the safety phase runs, it changes the cluster's
//! shape through a node drawn in turn: operator moves (to a member drawn at random, sometimes the
//! owner itself or a draining one: refusals are part of the contract), aborts of moves, rebalances,
//! decommissions and their cancels. Refusals (409, 404) and failures are traced, never errors: the
//! ledger judges what the records went through.

use std::sync::Arc;
use std::time::Duration;

use narad_core::PartitionId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::server::Call;
use super::{sim_now_ns, World, ADMIN_TIMEOUT};
use crate::seam::{derive_seed, ClusterOp, SimNode};

impl<N: SimNode> World<N> {
    /// Runs the operator until the end of the safety phase.
    pub(super) async fn shape_operator(self: Arc<Self>) {
        let spec = self.spec.scenario.moves;
        let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(self.spec.seed, "operator"));
        let every_ms = spec.every_ms.draw(&mut rng);
        let decommission_percent = spec.decommission_percent.draw(&mut rng);
        let members = self.servers.len();
        if every_ms == 0 || members < 2 {
            return;
        }
        let mean_ns = every_ms as f64 * 1e6;
        loop {
            let unit: f64 = rng.random_range(f64::EPSILON..1.0);
            tokio::time::sleep(Duration::from_nanos((-unit.ln() * mean_ns) as u64)).await;
            if sim_now_ns() >= self.safety_end_ns {
                return;
            }
            let op = self.draw_op(&mut rng, members, decommission_percent);
            let server = self.admin_server();
            let sent = op.clone();
            let answer = server
                .call(ADMIN_TIMEOUT, move |node| async move {
                    node.cluster_op(sent).await
                })
                .await;
            let outcome = match answer {
                Call::Done(Ok(())) => "done".to_string(),
                Call::Done(Err(error)) => error.to_string(),
                Call::Refused => "refused".into(),
                Call::Reset => "reset".into(),
                Call::TimedOut => "timed out".into(),
            };
            self.observer.event(
                "operator",
                format_args!("{op:?} via node@{}: {outcome}", server.index),
            );
        }
    }

    fn draw_op(
        &self,
        rng: &mut ChaCha8Rng,
        members: usize,
        decommission_percent: u64,
    ) -> ClusterOp {
        if rng.random_range(0..100) < decommission_percent {
            let member = rng.random_range(0..members);
            return if rng.random_bool(0.5) {
                ClusterOp::Decommission { member }
            } else {
                ClusterOp::CancelDecommission { member }
            };
        }
        let topics: Vec<_> = self
            .topics
            .iter()
            .filter(|topic| !topic.spec.churn)
            .collect();
        if topics.is_empty() {
            return ClusterOp::Rebalance;
        }
        let topic = topics[rng.random_range(0..topics.len())];
        let partition = PartitionId(rng.random_range(0..topic.spec.partitions));
        match rng.random_range(0..10) {
            0..=5 => ClusterOp::Move {
                topic: topic.spec.name.clone(),
                partition,
                to: rng.random_range(0..members),
            },
            6 | 7 => ClusterOp::Abort {
                topic: topic.spec.name.clone(),
                partition,
            },
            _ => ClusterOp::Rebalance,
        }
    }
}
