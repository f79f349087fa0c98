//! The source side of a partition move: the copy's reads, the handoff freeze and its lapse.
//!
//! - **Reads** ([`move_read`]) serve visible records of a partition this node owns to the move's
//!   destination, through the partition host's read path (every frame CRC-checked, the segments
//!   read pinned against retention for the length of the read). Only the destination the replica
//!   names for a move in flight is served.
//! - **Freeze** ([`move_freeze`]): the owner arms the freeze under the produce lock and answers the
//!   final high watermark; this node then records the freeze in the metastore (`MoveFrozen`) and
//!   answers the destination only once that applied, so a restart of this node comes back frozen
//!   (the owner reads the freeze from the replica). A second ask answers the same watermark.
//! - **Lapse** ([`watch_lapse`]): a freeze whose switch has not applied within [`FREEZE_TTL`] is
//!   ended by proposing the move's abort; produce resumes here only once the abort applied (the
//!   owner lifts a freeze when the replica no longer records its move), so a late switch can never
//!   apply over records committed after the final watermark.

use std::time::Duration;

use narad_core::codec::cluster::{ControlAnswer, MoveChunk, MoveRecord};
use narad_core::ids::{NodeId, Offset, PartitionId, TopicId};
use narad_core::metastore::Command;
use narad_core::partition::{LogReadError, PartitionReadError};

use super::Moves;
use crate::http::TopicKey;
use crate::metastore::ProposeError;

/// How long a freeze holds produce at the source before it is ended by an abort.
pub const FREEZE_TTL: Duration = Duration::from_secs(15);
/// Records one copy read asks for, at most (its bytes are bounded by the host's read limit).
pub const MOVE_READ_RECORDS_MAX: u32 = 16_384;

impl Moves {
    /// Whether the replica records a move of `(topic, partition)` of incarnation `topic_id` from
    /// this node to `to` (`move_id`: and that one).
    fn moving_to(
        &self,
        topic: &str,
        topic_id: TopicId,
        partition: PartitionId,
        to: NodeId,
        move_id: Option<u64>,
    ) -> Option<narad_core::metastore::Move> {
        let view = self.inner.setup.metastore.view();
        view.state
            .move_of(topic, partition)
            .filter(|moving| {
                moving.topic_id == topic_id
                    && moving.from == self.inner.setup.node
                    && moving.to == to
                    && move_id.is_none_or(|id| moving.planned_at == id)
            })
            .cloned()
    }

    /// Answers a destination's copy read.
    pub async fn move_read(
        &self,
        from: NodeId,
        topic: String,
        topic_id: TopicId,
        partition: PartitionId,
        offset: Offset,
    ) -> ControlAnswer {
        if self
            .moving_to(&topic, topic_id, partition, from, None)
            .is_none()
        {
            return ControlAnswer::BadRequest("no such move to the asking node".to_string());
        }
        let key = TopicKey {
            name: topic,
            id: topic_id,
        };
        let mut offset = offset;
        // One retry: an offset retention removed meanwhile reads from the oldest kept.
        for _ in 0..2 {
            match self
                .inner
                .setup
                .partitions
                .read(&key, partition, offset, MOVE_READ_RECORDS_MAX)
                .await
            {
                Ok(batch) => {
                    let records = batch
                        .records
                        .into_iter()
                        .map(|record| MoveRecord {
                            key: record.key,
                            committed_at_ms: record.committed_at_ms,
                            payload: record.payload,
                        })
                        .collect();
                    return ControlAnswer::MoveChunk(MoveChunk {
                        first: batch.first,
                        records,
                        high_watermark: batch.high_watermark,
                    });
                }
                Err(PartitionReadError::Log(LogReadError::AtOrPastHighWatermark {
                    high_watermark,
                })) => {
                    return ControlAnswer::MoveChunk(MoveChunk {
                        first: offset,
                        records: Vec::new(),
                        high_watermark,
                    })
                }
                Err(PartitionReadError::Log(LogReadError::BelowOldestRetained { oldest })) => {
                    offset = oldest;
                }
                Err(error) => return ControlAnswer::Unavailable(error.to_string()),
            }
        }
        ControlAnswer::Unavailable("retention keeps removing the copy's next records".into())
    }

    /// Arms, records and answers a move's freeze (see the module documentation).
    pub async fn move_freeze(
        &self,
        from: NodeId,
        topic: String,
        topic_id: TopicId,
        partition: PartitionId,
        move_id: u64,
    ) -> ControlAnswer {
        let Some(moving) = self.moving_to(&topic, topic_id, partition, from, Some(move_id)) else {
            return ControlAnswer::BadRequest("no such move to the asking node".to_string());
        };
        if let Some(final_hw) = moving.final_hw {
            return ControlAnswer::MoveFrozen { final_hw };
        }
        let final_hw = match self
            .inner
            .setup
            .partitions
            .freeze(&topic, partition, move_id)
            .await
        {
            Ok(final_hw) => final_hw,
            Err(error) => return ControlAnswer::Unavailable(error.to_string()),
        };
        self.watch_lapse(topic.clone(), partition, move_id, from);
        let command = Command::MoveFrozen {
            topic,
            topic_id,
            partition,
            to: from,
            move_id: Some(move_id),
            final_hw,
        };
        match self.inner.setup.metastore.propose(command).await {
            Ok(_) => ControlAnswer::MoveFrozen { final_hw },
            Err(ProposeError::Refused(refused)) => ControlAnswer::BadRequest(refused.to_string()),
            Err(error) => ControlAnswer::Unavailable(error.to_string()),
        }
    }

    /// Ends the freeze of `move_id` by an abort if its switch has not applied within
    /// [`FREEZE_TTL`]; retried while the abort cannot be proposed. One watch per move.
    pub(super) fn watch_lapse(
        &self,
        topic: String,
        partition: PartitionId,
        move_id: u64,
        to: NodeId,
    ) {
        let key = (topic.clone(), partition, move_id);
        {
            let mut watched = self
                .inner
                .lapse_watched
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if !watched.insert(key.clone()) {
                return;
            }
        }
        let moves = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(FREEZE_TTL).await;
            loop {
                let still = {
                    let view = moves.inner.setup.metastore.view();
                    view.state
                        .move_of(&topic, partition)
                        .is_some_and(|moving| moving.planned_at == move_id)
                };
                if !still || moves.inner.setup.metastore.is_stopped() {
                    break;
                }
                tracing::warn!(
                    topic,
                    partition = partition.0,
                    move_id,
                    "move freeze lapsed: aborting the move"
                );
                let abort = Command::AbortMove {
                    topic: topic.clone(),
                    partition,
                    to: Some(to),
                    move_id: Some(move_id),
                };
                match moves.inner.setup.metastore.propose(abort).await {
                    Ok(_) | Err(ProposeError::Refused(_)) => break,
                    Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
                }
            }
            moves
                .inner
                .lapse_watched
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
        });
    }
}
