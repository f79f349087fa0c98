//! The queue-mode handoff of a move: the destination holds the partition's queue (serves none of
//! its records) from before the switch until it adopts the source's queue state, which the source
//! hands over ([`Control::MoveQueue`]) once the switch applied there: its cursor and the offsets
//! acked past it. Leases end early (their records are delivered again by the new owner), never
//! silently: an ack of such a lease is answered as a stale handle.
//!
//! The source is asked until it answers or the leader marks it dead; then the destination resumes
//! from what it holds itself (the records are delivered again: at-least-once).

use std::time::Duration;

use narad_core::codec::cluster::{Control, ControlAnswer};
use narad_core::ids::{NodeId, PartitionId, TopicId};
use narad_core::metastore::Move;

use super::Moves;

/// How long one handoff request may take.
const HANDOFF_TIMEOUT: Duration = Duration::from_secs(5);
/// Between handoff requests.
const HANDOFF_RETRY: Duration = Duration::from_millis(500);

impl Moves {
    /// Holds the partition's queue here until [`Moves::take_queue`] adopts the source's.
    pub(super) async fn hold_queue(&self, planned: &Move, partition: PartitionId) {
        let key = (planned.topic_id, partition);
        self.inner
            .setup
            .consumers
            .hold(key, planned.planned_at)
            .await;
    }

    /// Ends the hold of an aborted move (a later move's hold stands).
    pub(super) async fn release_queue(&self, planned: &Move, partition: PartitionId) {
        let key = (planned.topic_id, partition);
        self.inner
            .setup
            .consumers
            .adopt(key, planned.planned_at, None)
            .await;
    }

    /// Takes the partition's queue state from the move's source (see the module documentation).
    pub(super) async fn take_queue(&self, topic: &str, partition: PartitionId, planned: &Move) {
        let key = (planned.topic_id, partition);
        let body = Control::MoveQueue {
            topic: topic.to_string(),
            topic_id: planned.topic_id,
            partition,
        }
        .encode();
        loop {
            let answer = self
                .inner
                .setup
                .cluster
                .call(planned.from, "move_queue", &body, HANDOFF_TIMEOUT)
                .await;
            if let Ok(Ok(ControlAnswer::MoveQueue(state))) =
                answer.as_deref().map(ControlAnswer::decode)
            {
                tracing::debug!(topic, partition = partition.0, node = self.inner.setup.node.0, from = planned.from.0, cursor = ?state.as_ref().map(|state| state.cursor), "queue adopted");
                self.inner
                    .setup
                    .consumers
                    .adopt(key, planned.planned_at, state)
                    .await;
                return;
            }
            let view = self.inner.setup.metastore.view();
            // Asked even once the partition moved on from here: the next owner waits for it.
            let source_gone = !view.state.is_alive(planned.from);
            let topic_gone = view
                .state
                .topic(topic)
                .is_none_or(|record| record.id != planned.topic_id);
            // A later move brought the partition here again: its own hold supersedes this one.
            let superseded = view.state.placement(planned.topic_id, partition) > planned.planned_at
                && view
                    .state
                    .topic(topic)
                    .and_then(|record| record.owner_of(partition))
                    == Some(self.inner.setup.node);
            if superseded {
                return;
            }
            if source_gone || topic_gone || self.inner.setup.metastore.is_stopped() {
                tracing::warn!(topic, partition = partition.0, "the move's source did not hand its queue over: its unacked records are delivered again");
                self.inner
                    .setup
                    .consumers
                    .adopt(key, planned.planned_at, None)
                    .await;
                return;
            }
            tokio::time::sleep(HANDOFF_RETRY).await;
        }
    }

    /// Answers a destination's handoff request: once the switch applied here, the queue is let go.
    pub async fn move_queue(
        &self,
        from: NodeId,
        topic: String,
        topic_id: TopicId,
        partition: PartitionId,
    ) -> ControlAnswer {
        let switched = {
            let view = self.inner.setup.metastore.view();
            view.state
                .topic(&topic)
                .filter(|record| record.id == topic_id)
                .and_then(|record| record.owner_of(partition))
                == Some(from)
        };
        if !switched {
            return ControlAnswer::Unavailable("the switch has not applied here yet".to_string());
        }
        match self
            .inner
            .setup
            .consumers
            .handoff((topic_id, partition))
            .await
        {
            Ok(state) => {
                tracing::debug!(topic, partition = partition.0, node = self.inner.setup.node.0, to = from.0, cursor = ?state.as_ref().map(|state| state.cursor), "queue handed off");
                ControlAnswer::MoveQueue(state)
            }
            Err(_) => ControlAnswer::Unavailable(
                "the partition's queue has not arrived here from its previous owner yet".into(),
            ),
        }
    }
}
