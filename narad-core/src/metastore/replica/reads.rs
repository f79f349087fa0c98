//! Read-index requests: held until a leader can take them, asked of raft, answered once applied.

use raft::{ReadState, StateRole, INVALID_ID};

use super::types::{LogIndex, ReadIndexId, ReplicaOutput};
use super::MetaReplica;
use crate::time::Instant;

/// Where a read-index request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReadStage {
    /// Waiting for a leader, or for the leader's first commit of its term.
    Held,
    /// Given to raft under the current leader.
    Asked,
    /// Confirmed at this commit index; waiting to apply through it.
    Confirmed(u64),
}

/// A read-index request waiting for its answer.
#[derive(Clone, Debug)]
pub(super) struct PendingRead {
    pub(super) stage: ReadStage,
    pub(super) deadline: Instant,
}

impl MetaReplica {
    /// raft drops its pending reads when the leader changes: ask those again of the new one.
    pub(super) fn follow_leader(&mut self) {
        let now = (self.node.raft.term, self.node.raft.leader_id);
        if now == self.followed {
            return;
        }
        self.followed = now;
        for read in self.reads.values_mut() {
            if read.stage == ReadStage::Asked {
                read.stage = ReadStage::Held;
            }
        }
    }

    /// Gives held reads to raft once a leader is known (and, on the leader, once it committed an
    /// entry of its term: raft ignores reads before). Returns whether any was given.
    pub(super) fn ask_held_reads(&mut self) -> bool {
        let raft = &self.node.raft;
        if raft.leader_id == INVALID_ID
            || (raft.state == StateRole::Leader && !raft.commit_to_current_term())
        {
            return false;
        }
        let held: Vec<ReadIndexId> = self
            .reads
            .iter()
            .filter(|(_, read)| read.stage == ReadStage::Held)
            .map(|(id, _)| *id)
            .collect();
        for id in &held {
            let mut context = self.read_prefix.to_vec();
            context.extend_from_slice(&id.0.to_be_bytes());
            self.node.read_index(context);
            if let Some(read) = self.reads.get_mut(id) {
                read.stage = ReadStage::Asked;
            }
        }
        !held.is_empty()
    }

    pub(super) fn on_read_states(&mut self, read_states: Vec<ReadState>) {
        for read_state in read_states {
            let context = read_state.request_ctx;
            let Some(id) = context.strip_prefix(&self.read_prefix[..]) else {
                continue; // Not this start's request.
            };
            let Ok(id) = <[u8; 8]>::try_from(id).map(u64::from_be_bytes) else {
                continue;
            };
            if let Some(read) = self.reads.get_mut(&ReadIndexId(id)) {
                // Any confirmation counts, even one asked of an earlier leader: it was made after the
                // request, by a leader a quorum confirmed.
                read.stage = ReadStage::Confirmed(read_state.index);
            }
        }
    }

    /// Answers the confirmed reads this replica has applied through.
    pub(super) fn complete_reads(&mut self) {
        let applied = self.applied;
        let done: Vec<(ReadIndexId, u64)> = self
            .reads
            .iter()
            .filter_map(|(id, read)| match read.stage {
                ReadStage::Confirmed(index) if index <= applied => Some((*id, index)),
                ReadStage::Confirmed(_) | ReadStage::Held | ReadStage::Asked => None,
            })
            .collect();
        for (id, index) in done {
            self.reads.remove(&id);
            let index = LogIndex(index);
            self.outputs
                .push_back(ReplicaOutput::ReadIndexReady { id, index });
        }
    }
}
