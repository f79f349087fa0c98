//! The destination side of a partition move: copy, freeze, tail, verify, switch.
//!
//! One task per move this node is the destination of, for as long as the replica records the move:
//! 1. **Fresh directory.** The copy goes into the partition's directory at the move's placement
//!    (`partition_dir_at(.., planned_at)`), emptied first: an attempt cut short (a crash, a failed
//!    write) starts over from nothing, so a copy is never a mix of two attempts.
//! 2. **Bulk copy** in chunks read from the source ([`Control::MoveRead`]) while produce goes on
//!    there, written as the log's own segments by a [`CopyWriter`] (offsets and commit times kept).
//!    The source's retention may remove records the copy has not reached: the copy starts over
//!    from the new oldest offset.
//! 3. **Freeze** ([`Control::MoveFreeze`]) once the copy is within [`TAIL_RECORDS`] of the source's
//!    high watermark: the answer is the final high watermark, recorded in the metastore by then.
//! 4. **Tail**: the copy reads on up to the final high watermark (nothing is added meanwhile).
//! 5. **Verify**: every segment synced, the directory synced, every segment read back whole with
//!    the CRC of the bytes written.
//! 6. **Switch**: `SwitchOwner`, a compare-and-swap on the frozen move with the final high
//!    watermark. Once it applied, this node's owner opens the copy (its recovery checks every frame
//!    again) and the source's lets its copy go. A refused switch (the move was aborted, by an
//!    operator or the freeze's lapse) ends the task, and the copy is removed.
//!
//! Any failure (source unreachable, disk fault) retries the attempt from the start after a back-off,
//! while the replica still records the move; a move whose source or destination the leader marks
//! dead is aborted by the leader (see the parent module).

use std::sync::Arc;
use std::time::Duration;

use narad_core::codec::cluster::{Control, ControlAnswer, MoveChunk};
use narad_core::codec::partition::PartitionRecord;
use narad_core::disk::{IoId, IoLane, IoOp, IoReply, IoRequest};
use narad_core::ids::{Offset, PartitionId};
use narad_core::metastore::{Command, Move};
use narad_core::partition::copy::CopyWriter;
use narad_core::partition::owner::partition_dir_at;
use narad_core::partition::segment::{parse_segment_name, scan_segment, segment_name};
use narad_core::planted::PlantedBug;

use super::Moves;
use crate::metastore::ProposeError;

/// The copy asks for the freeze once it is this close (in records) to the source's high watermark.
pub const TAIL_RECORDS: u64 = 4096;
/// How long one copy read may take.
pub const MOVE_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the freeze request may take (it waits for the source's commit in flight and a
/// metastore proposal).
pub const MOVE_FREEZE_TIMEOUT: Duration = Duration::from_secs(12);
/// Back-off between attempts, first and most.
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How an attempt ended.
enum Ended {
    /// The switch applied: this node owns the partition.
    Switched,
    /// The replica no longer records the move (aborted, or the topic went).
    Gone,
}

impl Moves {
    /// Runs the move `planned` of `(topic, partition)` to this node (one task per move).
    pub(super) fn start_destination(&self, topic: String, partition: PartitionId, planned: Move) {
        let key = (topic.clone(), partition, planned.planned_at);
        {
            // A move this process ended is never started again (the replica may still list it for
            // a moment after this node's switch applied at the leader).
            let ended = self.inner.ended.lock().unwrap_or_else(|p| p.into_inner());
            if ended.contains(&key) {
                return;
            }
            let mut running = self.inner.running.lock().unwrap_or_else(|p| p.into_inner());
            if !running.insert(key.clone()) {
                return;
            }
        }
        let moves = self.clone();
        tokio::spawn(async move {
            moves.destination(&topic, partition, &planned).await;
            moves
                .inner
                .ended
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.clone());
            moves
                .inner
                .running
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
            moves.set_progress(&topic, partition, None);
        });
    }

    /// Whether the replica still records `planned`.
    fn still_moving(&self, topic: &str, partition: PartitionId, planned: &Move) -> bool {
        let view = self.inner.setup.metastore.view();
        view.state
            .move_of(topic, partition)
            .is_some_and(|moving| moving.planned_at == planned.planned_at)
    }

    async fn destination(&self, topic: &str, partition: PartitionId, planned: &Move) {
        let started = tokio::time::Instant::now();
        let dir = partition_dir_at(topic, planned.topic_id, partition, planned.planned_at);
        let mut backoff = BACKOFF_MIN;
        loop {
            if self.inner.setup.metastore.is_stopped() {
                return;
            }
            let attempt = match self.settled_if_gone(topic, partition, planned).await {
                Some(ended) => Ok(ended),
                None => self.attempt(topic, partition, planned, &dir).await,
            };
            match attempt {
                Ok(Ended::Switched) => {
                    let metrics = &self.inner.setup.metrics.moves;
                    metrics.ended("completed");
                    metrics
                        .duration_seconds
                        .observe(started.elapsed().as_secs_f64());
                    tracing::info!(
                        topic,
                        partition = partition.0,
                        from = planned.from.0,
                        "partition moved here"
                    );
                    self.take_queue(topic, partition, planned).await;
                    return;
                }
                Ok(Ended::Gone) => break,
                Err(error) => {
                    if !self.still_moving(topic, partition, planned) {
                        // Gone, or switched by a proposal whose answer was lost: the replica
                        // says which, once it caught up with the leader.
                        match self.settled(topic, partition, planned).await {
                            Some(Ended::Switched) => continue,
                            Some(Ended::Gone) => break,
                            None => return,
                        }
                    }
                    tracing::warn!(topic, partition = partition.0, %error, "partition move attempt failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
        self.release_queue(planned, partition).await;
        self.inner.setup.metrics.moves.ended("aborted");
        tracing::info!(
            topic,
            partition = partition.0,
            "partition move aborted; removing the copy"
        );
        if let Err(error) = self.wipe(&dir).await {
            tracing::warn!(dir, %error, "removing an aborted move's copy failed");
        }
    }

    async fn attempt(
        &self,
        topic: &str,
        partition: PartitionId,
        planned: &Move,
        dir: &str,
    ) -> Result<Ended, String> {
        // Once the move is frozen, an earlier attempt (of this process, or of one that crashed)
        // may have proposed the switch over a complete copy, and that proposal may still apply:
        // such a copy is kept and the switch proposed again, never wiped. An attempt proposes
        // only over a complete copy, so anything else may go.
        self.inner
            .setup
            .metastore
            .read_index()
            .await
            .map_err(|error| error.to_string())?;
        let view = self.inner.setup.metastore.view();
        // Switched already (a lagging replica restarted this task): the copy is the live log.
        if view.state.placement(planned.topic_id, partition) == planned.planned_at {
            return Ok(Ended::Switched);
        }
        let Some(moving) = view
            .state
            .move_of(topic, partition)
            .filter(|moving| moving.planned_at == planned.planned_at)
        else {
            return Ok(Ended::Gone);
        };
        if let Some(final_hw) = moving.final_hw {
            if self.copy_ends_at(dir).await? == Some(final_hw) {
                self.hold_queue(planned, partition).await;
                return self.switch(topic, partition, planned, final_hw).await;
            }
        }
        self.wipe(dir).await?;
        self.run(vec![IoOp::CreateDirAll {
            dir: dir.to_string(),
        }])
        .await?;
        let mut writer = CopyWriter::new(dir.to_string(), self.inner.setup.segment_bytes);
        let mut next = Offset(0);
        loop {
            if !self.still_moving(topic, partition, planned) {
                return Ok(Ended::Gone);
            }
            let chunk = self.read_chunk(topic, partition, planned, next).await?;
            let high_watermark = chunk.high_watermark;
            next = self.write_chunk(&mut writer, next, chunk).await?;
            self.set_progress(topic, partition, Some(writer.bytes()));
            if high_watermark.0.saturating_sub(next.0) <= TAIL_RECORDS {
                break;
            }
        }
        let final_hw = self.freeze(topic, partition, planned).await?;
        let skip_tail = self
            .inner
            .setup
            .plant
            .is(PlantedBug::SwitchBeforeTailCopied);
        while next < final_hw && !skip_tail {
            let chunk = self.read_chunk(topic, partition, planned, next).await?;
            if chunk.records.is_empty() {
                return Err(format!(
                    "the frozen source answered nothing at {next} below its final high watermark {final_hw}"
                ));
            }
            next = self.write_chunk(&mut writer, next, chunk).await?;
        }
        let replies = self.run(writer.finish(final_hw)).await?;
        writer.verify(&replies).map_err(|error| error.to_string())?;
        // From before the switch can apply here: no record of the partition is served by this
        // node's queue until the source's queue state is adopted.
        self.hold_queue(planned, partition).await;
        self.switch(topic, partition, planned, final_hw).await
    }

    /// Writes one chunk; the offset the copy continues at.
    async fn write_chunk(
        &self,
        writer: &mut CopyWriter,
        next: Offset,
        chunk: MoveChunk,
    ) -> Result<Offset, String> {
        if chunk.records.is_empty() {
            // Nothing (more) to copy: an empty copy continues where the source's log does.
            return Ok(if writer.next_offset().is_none() {
                chunk.first
            } else {
                next
            });
        }
        if writer.next_offset().is_some() && chunk.first != next {
            return Err(format!(
                "the source's retention passed the copy ({next} -> {}): starting over",
                chunk.first
            ));
        }
        let records: Vec<PartitionRecord> = chunk
            .records
            .into_iter()
            .map(|record| PartitionRecord {
                key: record.key,
                committed_at_ms: record.committed_at_ms,
                payload: record.payload,
            })
            .collect();
        let before = writer.bytes();
        let ops = writer
            .append(chunk.first, &records)
            .map_err(|error| error.to_string())?;
        self.run(ops).await?;
        self.inner
            .setup
            .metrics
            .moves
            .bytes
            .inc_by(writer.bytes() - before);
        Ok(writer.next_offset().unwrap_or(next))
    }

    async fn read_chunk(
        &self,
        topic: &str,
        partition: PartitionId,
        planned: &Move,
        offset: Offset,
    ) -> Result<MoveChunk, String> {
        let body = Control::MoveRead {
            topic: topic.to_string(),
            topic_id: planned.topic_id,
            partition,
            offset,
        }
        .encode();
        let answer = self
            .ask(planned, "move_read", &body, MOVE_READ_TIMEOUT)
            .await?;
        if let ControlAnswer::MoveChunk(chunk) = answer {
            Ok(chunk)
        } else {
            Err(format!("the source answered {answer:?}"))
        }
    }

    /// Sends `body` to the move's source; its decoded answer.
    async fn ask(
        &self,
        planned: &Move,
        op: &'static str,
        body: &[u8],
        timeout: Duration,
    ) -> Result<ControlAnswer, String> {
        let answer = self
            .inner
            .setup
            .cluster
            .call(planned.from, op, body, timeout)
            .await
            .map_err(|error| error.to_string())?;
        ControlAnswer::decode(&answer).map_err(|error| error.to_string())
    }

    async fn freeze(
        &self,
        topic: &str,
        partition: PartitionId,
        planned: &Move,
    ) -> Result<Offset, String> {
        let body = Control::MoveFreeze {
            topic: topic.to_string(),
            topic_id: planned.topic_id,
            partition,
            move_id: planned.planned_at,
        }
        .encode();
        let answer = self
            .ask(planned, "move_freeze", &body, MOVE_FREEZE_TIMEOUT)
            .await?;
        if let ControlAnswer::MoveFrozen { final_hw } = answer {
            Ok(final_hw)
        } else {
            Err(format!("the source answered the freeze with {answer:?}"))
        }
    }

    /// Proposes the switch until it applies or is refused.
    async fn switch(
        &self,
        topic: &str,
        partition: PartitionId,
        planned: &Move,
        final_hw: Offset,
    ) -> Result<Ended, String> {
        let command = Command::SwitchOwner {
            topic: topic.to_string(),
            topic_id: planned.topic_id,
            partition,
            from: planned.from,
            to: self.inner.setup.node,
            move_id: Some(planned.planned_at),
            final_hw,
        };
        loop {
            match self.inner.setup.metastore.propose(command.clone()).await {
                Ok(_) => return Ok(Ended::Switched),
                Err(ProposeError::Refused(_)) => {
                    // Refused, or applied by an earlier proposal whose answer was lost (this
                    // replica may not have applied it yet): asked after a read barrier.
                    return self
                        .settled(topic, partition, planned)
                        .await
                        .ok_or_else(|| "the node is stopping".to_string());
                }
                Err(error) => {
                    if !self.still_moving(topic, partition, planned) {
                        return self
                            .settled(topic, partition, planned)
                            .await
                            .ok_or_else(|| "the node is stopping".to_string());
                    }
                    tracing::warn!(topic, partition = partition.0, %error, "proposing a move's switch failed; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// How the move `planned` ended, once this replica has applied everything the leader had
    /// committed (a read barrier, retried until it passes): switched when the partition's
    /// placement is the move's, gone when the replica no longer records the move otherwise, `None`
    /// while it still records it (or the node stops). A copy is removed only on this answer: a
    /// switch that applied while this node's proposal timed out is never mistaken for an abort.
    async fn settled(&self, topic: &str, partition: PartitionId, planned: &Move) -> Option<Ended> {
        loop {
            if self.inner.setup.metastore.is_stopped() {
                return None;
            }
            if self.inner.setup.metastore.read_index().await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let view = self.inner.setup.metastore.view();
        if view.state.placement(planned.topic_id, partition) == planned.planned_at {
            return Some(Ended::Switched);
        }
        (!self.still_moving(topic, partition, planned)).then_some(Ended::Gone)
    }

    /// [`Moves::settled`] when the local replica no longer records the move; `None` while it does.
    async fn settled_if_gone(
        &self,
        topic: &str,
        partition: PartitionId,
        planned: &Move,
    ) -> Option<Ended> {
        if self.still_moving(topic, partition, planned) {
            return None;
        }
        self.settled(topic, partition, planned).await
    }

    /// Where the copy in `dir` ends, when it is one run of verified frames over contiguous
    /// segments (`None`: no segment, or anything else).
    async fn copy_ends_at(&self, dir: &str) -> Result<Option<Offset>, String> {
        let replies = self
            .run(vec![IoOp::List {
                dir: dir.to_string(),
            }])
            .await?;
        let mut bases: Vec<Offset> = match replies.into_iter().next() {
            Some(IoReply::Names(names)) => names
                .iter()
                .filter_map(|name| parse_segment_name(name))
                .collect(),
            _ => Vec::new(),
        };
        bases.sort();
        let mut end: Option<Offset> = None;
        for base in bases {
            if end.is_some_and(|end| end != base) {
                return Ok(None);
            }
            let path = narad_core::disk::join(dir, &segment_name(base));
            let len = match self.run(vec![IoOp::Len { path: path.clone() }]).await?[..] {
                [IoReply::Len(len)] => len,
                _ => return Ok(None),
            };
            let bytes = match self
                .run(vec![IoOp::ReadAt {
                    path,
                    offset: 0,
                    len: usize::try_from(len).unwrap_or(usize::MAX),
                }])
                .await?
                .into_iter()
                .next()
            {
                Some(IoReply::Data(bytes)) => bytes,
                _ => return Ok(None),
            };
            let scan = scan_segment(base, &bytes, 1 << 30);
            if scan.verified_bytes != bytes.len() as u64 {
                return Ok(None);
            }
            end = Some(scan.end_offset);
        }
        Ok(end)
    }

    /// Removes every file of `dir` (it may not exist).
    pub(super) async fn wipe(&self, dir: &str) -> Result<(), String> {
        let replies = self
            .run(vec![IoOp::List {
                dir: dir.to_string(),
            }])
            .await?;
        let names = match replies.into_iter().next() {
            Some(IoReply::Names(names)) => names,
            _ => Vec::new(),
        };
        if names.is_empty() {
            return Ok(());
        }
        let mut ops: Vec<IoOp> = names
            .iter()
            .map(|name| IoOp::Remove {
                path: narad_core::disk::join(dir, name),
            })
            .collect();
        ops.push(IoOp::SyncDir {
            dir: dir.to_string(),
        });
        self.run(ops).await.map(|_| ())
    }

    /// Runs `ops` as one request on the node's disk.
    async fn run(&self, ops: Vec<IoOp>) -> Result<Vec<IoReply>, String> {
        let request = IoRequest {
            id: IoId(0),
            lane: IoLane(0),
            ops,
        };
        let (_, completion) =
            crate::io::run_request(Arc::clone(&self.inner.setup.disk), request).await;
        completion
            .result
            .map_err(|(op, fault)| format!("copy I/O failed at op {op}: {fault}"))
    }
}
