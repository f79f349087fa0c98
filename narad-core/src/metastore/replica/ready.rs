//! raft's readies: what the replica applies, persists and sends for each, and the persist round trip.

use raft::eraftpb::{Entry, EntryType, HardState, Message, Snapshot};
use raft::Storage;

use super::types::{
    LogIndex, MetaSnapshot, PersistId, PersistRequest, ProposalError, ProposalId, ReadIndexError,
    ReplicaFailure, ReplicaOutput, SnapshotWrite, MESSAGES_HELD_MAX,
};
use super::{open, MetaReplica, READIES_PER_HANDLE_MAX};
use crate::metastore::{Applied, Command, MetaState};

/// A snapshot waiting to be stored.
#[derive(Clone, Debug)]
pub(super) struct PendingSnapshot {
    pub(super) write: MetaSnapshot,
    /// A leader's snapshot: the state to apply once it is stored. `None`: this replica's compaction.
    pub(super) restore: Option<MetaState>,
}

/// What the readies since the last persist request produced.
#[derive(Clone, Debug, Default)]
pub(super) struct PendingPersist {
    /// The last ready these cover (raft's `on_persist_ready` number).
    pub(super) ready: Option<u64>,
    pub(super) entries: Vec<Entry>,
    pub(super) hard_state: Option<HardState>,
    pub(super) snapshot: Option<PendingSnapshot>,
    /// Messages to send once everything before them is persisted.
    pub(super) messages: Vec<Message>,
}

impl PendingPersist {
    pub(super) fn has_writes(&self) -> bool {
        !self.entries.is_empty() || self.hard_state.is_some() || self.snapshot.is_some()
    }

    pub(super) fn is_empty(&self) -> bool {
        !self.has_writes() && self.ready.is_none() && self.messages.is_empty()
    }

    /// Adds a ready's entries: ones at or below the last pending index replace the pending suffix.
    pub(super) fn merge_entries(&mut self, entries: Vec<Entry>) {
        let Some(first) = entries.first().map(|entry| entry.index) else {
            return;
        };
        let keep = self.entries.partition_point(|entry| entry.index < first);
        self.entries.truncate(keep);
        self.entries.extend(entries);
    }
}

/// The outstanding persist request.
#[derive(Clone, Debug)]
pub(super) struct InFlight {
    pub(super) id: PersistId,
    pub(super) ready: Option<u64>,
    /// A leader's snapshot to apply once stored: its index and state.
    pub(super) restore: Option<(u64, MetaState)>,
    pub(super) messages: Vec<Message>,
}

impl MetaReplica {
    /// Handles raft's readies and read requests until neither has anything more to do.
    pub(super) fn settle(&mut self) {
        for _ in 0..READIES_PER_HANDLE_MAX {
            if self.failure.is_some() {
                return;
            }
            if self.node.has_ready() {
                self.on_ready();
                continue;
            }
            self.follow_leader();
            if !self.ask_held_reads() {
                self.complete_reads();
                return;
            }
        }
        panic!("raft kept producing readies for {READIES_PER_HANDLE_MAX} rounds");
    }

    pub(super) fn on_ready(&mut self) {
        let mut ready = self.node.ready();
        for message in ready.take_messages() {
            self.outputs.push_back(ReplicaOutput::Send(message));
        }
        if !ready.snapshot().is_empty() {
            let snapshot = ready.snapshot().clone();
            if let Err(failure) = self.on_leader_snapshot(snapshot) {
                // raft's ready stays unadvanced: a latched replica never calls raft again.
                return self.latch(failure);
            }
        }
        self.apply_committed(ready.take_committed_entries());
        let entries = ready.take_entries();
        if let Some(first) = entries.first().map(|entry| entry.index) {
            // raft hands only entries past the ones its log already agrees on: one at or below the
            // log recovered at start-up replaces that suffix. A committed entry is never replaced,
            // so the replaced ones were never applied, here or anywhere; catching up must not wait
            // for the cluster to write past them (a quiet cluster never would).
            self.recovered_last_index = self.recovered_last_index.min(first - 1);
        }
        if !entries.is_empty() {
            let appended = self.node.mut_store().memory.wl().append(&entries);
            appended.expect("raft hands entries that follow its log");
            self.pending.merge_entries(entries);
        }
        if let Some(hard_state) = ready.hs() {
            self.node
                .mut_store()
                .memory
                .wl()
                .set_hardstate(hard_state.clone());
            let term_vote = (hard_state.term, hard_state.vote);
            if term_vote != self.hard_state_requested {
                self.hard_state_requested = term_vote;
                self.pending.hard_state = Some(hard_state.clone());
            }
        }
        let read_states = ready.take_read_states();
        let held = ready.take_persisted_messages();
        self.hold(held);
        self.pending.ready = Some(ready.number());
        self.node.advance_append_async(ready);
        self.on_read_states(read_states);
        self.after_apply();
        self.issue_persist();
    }

    /// A leader's snapshot: raft's log now starts after it; the state follows once it is stored.
    pub(super) fn on_leader_snapshot(&mut self, snapshot: Snapshot) -> Result<(), ReplicaFailure> {
        let state = MetaState::decode_snapshot(&snapshot.data)
            .map_err(ReplicaFailure::SnapshotUndecodable)?;
        let metadata = snapshot.get_metadata();
        let conf = metadata.get_conf_state();
        let write = MetaSnapshot {
            index: metadata.index,
            term: metadata.term,
            voters: conf.voters.clone(),
            learners: conf.learners.clone(),
            state: snapshot.data.to_vec(),
        };
        assert!(write.index > self.applied, "raft restores newer snapshots");
        let store = self.node.mut_store();
        let restored = store.memory.wl().apply_snapshot(snapshot.clone());
        restored.expect("raft restores snapshots past the in-memory log's start");
        store.snapshot = snapshot;
        self.snapshot_index = write.index;
        self.pending.snapshot = Some(PendingSnapshot {
            write,
            restore: Some(state),
        });
        Ok(())
    }

    /// Applies committed entries in order and answers the proposals among them.
    pub(super) fn apply_committed(&mut self, entries: Vec<Entry>) {
        let Some(last) = entries.last().map(|entry| entry.index) else {
            return;
        };
        for entry in &entries {
            assert_eq!(entry.index, self.applied + 1, "raft applies in order");
            self.applied = entry.index;
            let result = self.apply_entry(entry);
            if let Some(proposal) = self.proposals.remove(&entry.index) {
                let own = proposal.term == entry.term && entry.context == proposal.context;
                let answer = match result {
                    Some(result) if own => result,
                    Some(_) | None => Err(ProposalError::Lost),
                };
                self.answer(proposal.id, answer);
            }
        }
        let index = LogIndex(last);
        self.outputs.push_back(ReplicaOutput::Applied { index });
    }

    /// The state machine's answer for one entry; `None` for an entry without a command.
    pub(super) fn apply_entry(&mut self, entry: &Entry) -> Option<Result<Applied, ProposalError>> {
        match entry.entry_type {
            EntryType::EntryNormal if entry.data.is_empty() => None, // A new leader's empty entry.
            EntryType::EntryNormal => Some(match Command::decode(&entry.data) {
                Ok(command) => self.state.apply(&command).map_err(ProposalError::Refused),
                Err(error) => {
                    // Every replica skips the same undecodable entry, so they still agree.
                    slog::error!(self.config.logger, "metastore entry does not decode; skipped";
                        "index" => entry.index, "error" => %error);
                    Err(ProposalError::Undecodable(error))
                }
            }),
            EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                slog::error!(self.config.logger,
                    "metastore membership changes are not supported by this build; skipped";
                    "index" => entry.index);
                None
            }
        }
    }

    /// A stored leader's snapshot becomes the state.
    pub(super) fn restore(&mut self, index: u64, state: MetaState) {
        self.state = state;
        self.applied = index;
        let covered: Vec<u64> = self.proposals.range(..=index).map(|(i, _)| *i).collect();
        for index in covered {
            if let Some(proposal) = self.proposals.remove(&index) {
                self.answer(proposal.id, Err(ProposalError::Unknown));
            }
        }
        let index = LogIndex(index);
        self.outputs.push_back(ReplicaOutput::Applied { index });
    }

    /// Tells raft what was applied, and compacts when a snapshot is due.
    pub(super) fn after_apply(&mut self) {
        if self.applied > self.node.raft.raft_log.applied {
            self.node.advance_apply_to(self.applied);
        }
        self.maybe_compact();
    }

    /// Every `snapshot_every_entries` applied entries: snapshot the state, drop the log below it.
    pub(super) fn maybe_compact(&mut self) {
        let since = self.applied.saturating_sub(self.snapshot_index);
        if since < self.config.snapshot_every_entries.max(1) {
            return;
        }
        let index = self.applied;
        let store = self.node.mut_store();
        let term = store.term(index).expect("the applied entry is in memory");
        let conf = store
            .initial_state()
            .expect("memory storage always has a state")
            .conf_state;
        let write = MetaSnapshot {
            index,
            term,
            voters: conf.voters,
            learners: conf.learners,
            state: self.state.encode_snapshot(),
        };
        store.snapshot = open::raft_snapshot(&write);
        store
            .memory
            .wl()
            .compact(index)
            .expect("compacting below the applied index");
        self.snapshot_index = index;
        // A compaction not yet requested is superseded by this newer one.
        self.pending.snapshot = Some(PendingSnapshot {
            write,
            restore: None,
        });
    }

    /// Holds messages until the persist they follow is done, within [`MESSAGES_HELD_MAX`].
    pub(super) fn hold(&mut self, messages: Vec<Message>) {
        for message in messages {
            if self.pending.messages.len() >= MESSAGES_HELD_MAX {
                self.messages_dropped += 1;
            } else {
                self.pending.messages.push(message);
            }
        }
    }

    /// Requests the pending writes when no persist is outstanding; with nothing to write, what the
    /// pending readies produced is as durable as everything before it, so it goes out now.
    pub(super) fn issue_persist(&mut self) {
        if self.in_flight.is_some() || self.failure.is_some() || self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        if !pending.has_writes() {
            if let Some(number) = pending.ready {
                self.node.on_persist_ready(number);
            }
            for message in pending.messages {
                self.outputs.push_back(ReplicaOutput::Send(message));
            }
            return;
        }
        let id = PersistId(self.next_persist);
        self.next_persist += 1;
        let (snapshot, restore) = match pending.snapshot {
            Some(PendingSnapshot { write, restore }) => {
                // The whole in-memory log above the snapshot: it already holds the pending entries.
                let log = self.node.store().entries_above(write.index);
                let restore = restore.map(|state| (write.index, state));
                (
                    Some(SnapshotWrite {
                        snapshot: write,
                        log,
                    }),
                    restore,
                )
            }
            None => (None, None),
        };
        let entries = match snapshot {
            Some(_) => Vec::new(),
            None => pending.entries,
        };
        self.in_flight = Some(InFlight {
            id,
            ready: pending.ready,
            restore,
            messages: pending.messages,
        });
        self.outputs
            .push_back(ReplicaOutput::Persist(PersistRequest {
                id,
                snapshot,
                entries,
                hard_state: pending.hard_state,
            }));
    }

    pub(super) fn answer(&mut self, id: ProposalId, result: Result<Applied, ProposalError>) {
        self.outputs
            .push_back(ReplicaOutput::Answered { id, result });
    }

    /// Fails every pending request and refuses later ones; the state stays readable.
    pub(super) fn latch(&mut self, failure: ReplicaFailure) {
        for (_, proposal) in std::mem::take(&mut self.proposals) {
            self.answer(proposal.id, Err(ProposalError::Latched(failure.clone())));
        }
        for (id, _) in std::mem::take(&mut self.reads) {
            let error = ReadIndexError::Latched(failure.clone());
            self.outputs
                .push_back(ReplicaOutput::ReadIndexFailed { id, error });
        }
        self.pending = PendingPersist::default();
        self.in_flight = None;
        self.outputs
            .push_back(ReplicaOutput::Latched(failure.clone()));
        self.failure = Some(failure);
    }
}
