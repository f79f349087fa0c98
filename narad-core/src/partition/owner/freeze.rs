//! The handoff freeze: the source side of a partition move.
//!
//! # Contract
//! - A freeze is asked for ([`OwnerInput::Freeze`](super::OwnerInput::Freeze)) by the move's
//!   destination once its bulk copy caught up. It is armed only while the replica records that
//!   move (same `planned_at`) from this node, and this node owns the partition; otherwise it is
//!   refused ([`FreezeRefused::NoMove`]).
//! - Armed, the partition's combiner is fed a view with `frozen` set: from its next cycle on, every
//!   batch is refused as a retriable not-owner **under the produce lock**, with nothing appended,
//!   whatever check it passed before. Then its high watermark is queried: the combiner answers once
//!   no commit is in flight, so the answer (the *final* high watermark) covers every record this
//!   node ever answered committed on the partition.
//! - The freeze lasts while the replica records the move: the proposer of the freeze (the node's
//!   move host) records it there as frozen (with the final high watermark) before the destination
//!   hears the answer, and from then on [`owner_view`](super::owner_view) says frozen by itself, so
//!   a restart of this node comes back frozen. A freeze is lifted only when the replica no longer
//!   records the move: aborted (the partition is still owned here, and produce resumes) or switched
//!   (the partition is not owned here any more). A switch is a compare-and-swap on the frozen move,
//!   so no switch can apply once an abort did: nothing committed here after a lifted freeze is ever
//!   left behind by a move.

use std::sync::Arc;

use super::{owner_view, FreezeRefused as Refused, Owner, OwnerOutput};
use crate::ids::PartitionId;
use crate::partition::combiner::{CombinerInput, QueryId, TopicView};
use crate::planted::PlantedBug;

/// A request to arm the freeze of one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreezeRequest {
    /// The topic name.
    pub topic: Arc<str>,
    /// The partition.
    pub partition: PartitionId,
    /// The move's `planned_at` (names the move).
    pub move_id: u64,
    /// Names the answer; unique among the freezes outstanding.
    pub query: QueryId,
}

/// Why a freeze was not armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FreezeRefused {
    /// The replica records no such move of a partition owned here.
    #[error("no such move of a partition owned here")]
    NoMove,
    /// The partition's log is not open here (opening, or failed to open).
    #[error("the partition log is not open")]
    NoLog,
}

impl Owner {
    /// The view of `(topic, partition)` the combiner gets: the replica's, frozen too while a freeze
    /// armed here waits for the replica to record it.
    pub(super) fn view_of(&self, topic: &Arc<str>, partition: PartitionId) -> TopicView {
        let mut view = owner_view(&self.state, self.config.node, topic, partition);
        if view.owned && self.arming.contains_key(&(topic.clone(), partition)) {
            view.frozen = true;
        }
        if view.frozen
            && self
                .config
                .combiner
                .log
                .plant
                .is(PlantedBug::ReclaimBeforeSwitchConfirmed)
            && self
                .state
                .move_of(topic, partition)
                .is_some_and(|moving| moving.final_hw.is_some())
        {
            // The planted bug: the copy here is let go (its files removed) once the freeze is
            // recorded, before any switch applied.
            view.live = None;
        }
        view
    }

    /// Drops the armed freezes whose move the replica no longer records (aborted or switched).
    pub(super) fn prune_arming(&mut self) {
        let state = Arc::clone(&self.state);
        let node = self.config.node;
        self.arming.retain(|(topic, partition), move_id| {
            state.move_of(topic, *partition).is_some_and(|moving| {
                moving.planned_at == *move_id && moving.from == node && moving.final_hw.is_none()
            })
        });
    }

    pub(super) fn on_freeze(&mut self, request: super::FreezeRequest) {
        let node = self.config.node;
        let recorded = self
            .state
            .move_of(&request.topic, request.partition)
            .is_some_and(|moving| moving.planned_at == request.move_id && moving.from == node);
        let owned = self
            .state
            .topic(&request.topic)
            .and_then(|topic| topic.owner_of(request.partition))
            == Some(node);
        if !recorded || !owned {
            self.outputs.push_back(OwnerOutput::FreezeArmed {
                query: request.query,
                result: Err(Refused::NoMove),
            });
            return;
        }
        let frozen_already = self
            .state
            .move_of(&request.topic, request.partition)
            .is_some_and(|moving| moving.final_hw.is_some());
        if !frozen_already {
            self.arming
                .insert((request.topic.clone(), request.partition), request.move_id);
        }
        let key = self.ensure(&request.topic, request.partition);
        let view = self.view_of(&request.topic, request.partition);
        if *self.slots[&key].combiner.view() != view {
            self.feed(key, CombinerInput::View(view));
        }
        self.feed(key, CombinerInput::QueryHighWatermark(request.query));
    }
}
