//! Placement: each record read (or read again) is checked against its topic incarnation, then held
//! on its destination's queue, skipped (left in the WAL), or discarded after the leader confirmed it.

use super::api::{CommitOwner, DispatchWarning, DispatcherOutput, TopicPlacement};
use super::machine::Dispatcher;
use super::record::DispatchRecord;
use super::strip::Mark;
use super::tables::{Dest, DestIdx, HeldIdx, Queued, TopicEntry, TopicIdx};
use super::*;
use crate::ids::{NodeId, PartitionId, Seq, TopicId};
use crate::time::Instant;
use std::sync::Arc;

/// Where a record stands against the local replica and the leader's confirmations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Status {
    /// Its incarnation is the live one (or it has none and the name exists): it may be committed.
    Resolved,
    /// The name is absent, or holds another incarnation, and the leader has not confirmed it: keep it.
    NeedsConfirm,
    /// Confirmed deleted: the name is absent locally.
    GoneDeleted,
    /// Confirmed deleted: the name lives on under another incarnation.
    GoneStale,
}

/// Whether a record is read for the first time or again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    Fresh,
    Rescan,
}

/// Who owns a destination, as far as the local replica knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Resolution {
    /// Not assigned yet (or the partition is not in the topic): look again in 10 ms.
    Unresolved,
    Owner(CommitOwner),
}

/// Why a record could not even be given a destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TableFull;

impl Dispatcher {
    // ----- interning -----

    pub(super) fn find_topic(&mut self, name: &str) -> Option<TopicIdx> {
        if let Some(idx) = self.last_topic {
            if &*self.topic(idx).name == name {
                return Some(idx);
            }
        }
        let idx = *self.topic_index.get(name)?;
        self.last_topic = Some(idx);
        Some(idx)
    }

    pub(super) fn intern_topic(&mut self, name: &str) -> Result<TopicIdx, TableFull> {
        if let Some(idx) = self.find_topic(name) {
            return Ok(idx);
        }
        if self.topics.len() >= TOPICS_MAX {
            return Err(TableFull);
        }
        let name: Arc<str> = Arc::from(name);
        let idx = TopicIdx(self.topics.insert(TopicEntry::new(name.clone())));
        self.topic_index.insert(name, idx);
        self.last_topic = Some(idx);
        Ok(idx)
    }

    pub(super) fn intern_dest(
        &mut self,
        topic: TopicIdx,
        partition: PartitionId,
    ) -> Result<DestIdx, TableFull> {
        if let Some(idx) = self.topic(topic).dests.get(partition) {
            return Ok(idx);
        }
        if self.dests.len() >= DESTINATIONS_MAX {
            return Err(TableFull);
        }
        let idx = DestIdx(self.dests.insert(Dest::new(topic, partition)));
        self.topic_mut(topic).dests.insert(partition, idx);
        self.dest_high_water = self.dest_high_water.max(self.dests.len());
        Ok(idx)
    }

    // ----- the incarnation check -----

    pub(super) fn status(&self, topic: TopicIdx, topic_id: Option<TopicId>) -> Status {
        let entry = self.topic(topic);
        if entry.local.is_some()
            && self
                .plant
                .is(crate::planted::PlantedBug::StaleIncarnationIntoRecreatedTopic)
        {
            return Status::Resolved; // Planted: any incarnation of a live name is taken as live.
        }
        match (&entry.local, topic_id) {
            (Some(_), None) => Status::Resolved,
            (Some(view), Some(id)) if view.topic_id == Some(id) => Status::Resolved,
            (Some(_), Some(id)) if self.gone.contains(&id) => Status::GoneStale,
            (None, Some(id)) if self.gone.contains(&id) => Status::GoneDeleted,
            (None, None) if entry.absent_confirmed => Status::GoneDeleted,
            // Planted: the local replica alone decides that an incarnation is gone.
            (None, _)
                if self
                    .plant
                    .is(crate::planted::PlantedBug::DiscardWithoutLeaderConfirm) =>
            {
                Status::GoneDeleted
            }
            (Some(_), Some(_))
                if self
                    .plant
                    .is(crate::planted::PlantedBug::DiscardWithoutLeaderConfirm) =>
            {
                Status::GoneStale
            }
            _ => Status::NeedsConfirm,
        }
    }

    /// Asserts (with [`crate::DEEP_CHECKS`]) that a record about to be discarded has its
    /// incarnation confirmed gone by the leader: a 202'd record is destroyed on nothing less.
    pub(super) fn check_discard_confirmed(&self, topic: TopicIdx, topic_id: Option<TopicId>) {
        if !crate::DEEP_CHECKS {
            return;
        }
        let confirmed = match topic_id {
            Some(id) => self.gone.contains(&id),
            None => self.topic(topic).absent_confirmed,
        };
        assert!(
            confirmed,
            "discarding a record of {} incarnation {topic_id:?} the leader did not confirm gone",
            self.topic(topic).name
        );
    }

    /// Whether the topic may be asked about now, or its outstanding question may be joined.
    pub(super) fn confirm_open(&self, now: Instant, topic: TopicIdx) -> bool {
        let entry = self.topic(topic);
        !entry.confirm_pending && entry.unconfirmed_until.is_none_or(|until| until <= now)
    }

    /// Asks the leader about the topic unless a question is outstanding (then `topic_id` joins it) or
    /// an unconfirmed answer is still remembered. Returns whether `topic_id` waits on a question.
    pub(super) fn ask_if_needed(
        &mut self,
        now: Instant,
        topic: TopicIdx,
        topic_id: Option<TopicId>,
    ) -> bool {
        let entry = self.topic_mut(topic);
        if entry.confirm_pending {
            entry.asked_ids.insert(topic_id);
            return true;
        }
        if entry.unconfirmed_until.is_some_and(|until| until > now) {
            return false;
        }
        entry.confirm_pending = true;
        entry.asked_ids.insert(topic_id);
        let name = entry.name.to_string();
        self.emit(DispatcherOutput::ConfirmTopicGone { topic: name });
        true
    }

    pub(super) fn remember_gone(&mut self, topic_id: TopicId) {
        if !self.gone.insert(topic_id) {
            return;
        }
        self.incarnation_epoch += 1;
        self.gone_order.push_back(topic_id);
        if self.gone_order.len() > GONE_INCARNATIONS_MAX {
            if let Some(oldest) = self.gone_order.pop_front() {
                self.gone.remove(&oldest);
            }
        }
    }

    // ----- owners and routes -----

    fn view_of(&self, idx: DestIdx) -> Option<&TopicPlacement> {
        self.topic(self.dest(idx).topic).local.as_ref()
    }

    pub(super) fn resolve_owner(&self, idx: DestIdx) -> Resolution {
        let partition = self.dest(idx).partition;
        match self
            .view_of(idx)
            .and_then(|view| view.owners.get(partition.0 as usize).copied().flatten())
        {
            None => Resolution::Unresolved,
            Some(node) if node == self.node => Resolution::Owner(CommitOwner::Local),
            Some(node) => Resolution::Owner(CommitOwner::Remote(node)),
        }
    }

    /// Membership reports the node dead (this node never is).
    pub(super) fn is_dead(&self, node: NodeId) -> bool {
        node != self.node && self.members.get(&node) == Some(&false)
    }

    /// Membership reports the node alive (this node always is).
    pub(super) fn is_alive(&self, node: NodeId) -> bool {
        node == self.node || self.members.get(&node) == Some(&true)
    }

    pub(super) fn owner_is_dead(&self, idx: DestIdx) -> bool {
        matches!(self.resolve_owner(idx), Resolution::Owner(CommitOwner::Remote(node)) if self.is_dead(node))
    }

    /// Records of this home go to a sibling: its owner is dead, or it has failed for the grace.
    pub(super) fn reroutable(&self, now: Instant, home: DestIdx) -> bool {
        self.owner_is_dead(home)
            || self
                .dest(home)
                .failing
                .as_ref()
                .is_some_and(|failing| failing.since + REROUTE_GRACE <= now)
    }

    /// Whether a destination takes a new record now.
    pub(super) fn accepts(&self, idx: DestIdx) -> bool {
        let dest = self.dest(idx);
        dest.queue.len() < self.destination_queue_cap()
            && !dest.is_hung()
            && !dest.is_failing()
            && !dest.refused
    }

    /// The next partition counting up and wrapping whose owner is alive and whose own commits are
    /// neither failing nor hung.
    pub(super) fn sibling(&mut self, home: DestIdx) -> Option<DestIdx> {
        let topic = self.dest(home).topic;
        let start = self.dest(home).partition.0;
        let partitions = self.topic(topic).local.as_ref()?.owners.len() as u32;
        for step in 1..partitions {
            let partition = PartitionId((start.wrapping_add(step)) % partitions);
            let owner = self.topic(topic).local.as_ref()?.owners[partition.0 as usize];
            if !owner.is_some_and(|node| self.is_alive(node)) {
                continue;
            }
            let Ok(idx) = self.intern_dest(topic, partition) else {
                continue;
            };
            let dest = self.dest(idx);
            if dest.is_failing() || dest.is_hung() {
                continue;
            }
            return Some(idx);
        }
        None
    }

    /// Where a record of `home` goes now, or `None` when it must be skipped.
    pub(super) fn route(&mut self, now: Instant, home: DestIdx) -> Option<DestIdx> {
        if self.reroutable(now, home) {
            let sibling = self.sibling(home)?;
            return self.accepts(sibling).then_some(sibling);
        }
        self.accepts(home).then_some(home)
    }

    /// Whether the skipped record `seq` of `home` could be placed now (read again without decoding
    /// the others).
    pub(super) fn home_open(&mut self, now: Instant, home: DestIdx, seq: Seq) -> bool {
        self.dest(home).skipped.first() == Some(&seq) && self.route(now, home).is_some()
    }

    // ----- placement -----

    /// Places a decoded record. `Err(TableFull)` leaves it unmarked (the reader stops in front of it).
    pub(super) fn place(
        &mut self,
        now: Instant,
        record: DispatchRecord,
        origin: Origin,
    ) -> Result<(), TableFull> {
        // Most records are of the topic before them: compare bytes, skipping the UTF-8 check.
        let topic = match self.last_topic {
            Some(idx) if self.topic(idx).name.as_bytes() == record.topic_bytes() => idx,
            _ => self.intern_topic(record.topic())?,
        };
        match self.status(topic, record.topic_id()) {
            Status::Resolved => {}
            Status::NeedsConfirm => {
                self.ask_if_needed(now, topic, record.topic_id());
                self.skip_confirm(topic, &record, origin);
                return Ok(());
            }
            gone @ (Status::GoneDeleted | Status::GoneStale) => {
                self.discard_placed(topic, &record, gone, origin);
                return Ok(());
            }
        }
        let home = self.intern_dest(topic, record.partition())?;
        if self
            .dest(home)
            .skipped
            .first()
            .is_some_and(|&first| first < record.seq())
        {
            self.skip_blocked(home, &record, origin);
            return Ok(());
        }
        match self.route(now, home) {
            Some(idx) => self.hold(now, idx, home, record, origin),
            None => self.skip_blocked(home, &record, origin),
        }
        Ok(())
    }

    fn mark(&mut self, record: &DispatchRecord, mark: Mark, origin: Origin) {
        match origin {
            Origin::Fresh => self.strip.push(
                record.seq(),
                mark,
                record.encoded_len(),
                record.timestamp_ms(),
            ),
            Origin::Rescan => self.strip.set(record.seq(), mark, record.encoded_len()),
        }
    }

    fn hold(
        &mut self,
        now: Instant,
        idx: DestIdx,
        home: DestIdx,
        record: DispatchRecord,
        origin: Origin,
    ) {
        if idx != home {
            self.stats.rerouted_records += 1;
        }
        self.mark(&record, Mark::Held, origin);
        self.dest_mut(home).held_home += 1;
        let epoch = self.incarnation_epoch;
        let dest = self.dest_mut(idx);
        let was_empty = dest.queue.is_empty();
        if was_empty {
            // Every record queued from now on was checked at placement, at this epoch or later.
            dest.verified_epoch = epoch;
        }
        let slot = HeldIdx(self.queued.insert(Queued {
            record,
            home,
            placed_at: now,
        }));
        self.dest_mut(idx).queue.push_back(slot);
        if was_empty {
            self.refresh_candidate(idx);
        }
    }

    fn skip_blocked(&mut self, home: DestIdx, record: &DispatchRecord, origin: Origin) {
        self.mark(record, Mark::SkippedBlocked(home), origin);
        self.dest_mut(home).skipped.insert(record.seq());
        self.skipped_homes.insert(home);
    }

    pub(super) fn skip_confirm(
        &mut self,
        topic: TopicIdx,
        record: &DispatchRecord,
        origin: Origin,
    ) {
        self.mark(record, Mark::SkippedConfirm(topic), origin);
        self.topic_mut(topic).confirm_skipped.insert(record.seq());
        self.confirm_topics.insert(topic);
    }

    fn discard_placed(
        &mut self,
        topic: TopicIdx,
        record: &DispatchRecord,
        gone: Status,
        origin: Origin,
    ) {
        self.check_discard_confirmed(topic, record.topic_id());
        self.mark(record, Mark::Done, origin);
        self.stats.discarded_records += 1;
        let name = self.topic(topic).name.to_string();
        let warning = match (gone, record.topic_id()) {
            (Status::GoneStale, Some(topic_id)) => DispatchWarning::DiscardedStaleIncarnation {
                topic: name,
                topic_id,
                partition: record.partition(),
                seq: record.seq(),
            },
            _ => DispatchWarning::DiscardedForDeletedTopic {
                topic: name,
                topic_id: record.topic_id(),
                partition: record.partition(),
                seq: record.seq(),
            },
        };
        self.emit(DispatcherOutput::Warn(warning));
    }

    /// Takes a skipped record out of its skip set before it is placed again.
    pub(super) fn unskip(&mut self, seq: Seq, mark: Mark) {
        match mark {
            Mark::SkippedBlocked(home) => {
                let dest = self.dest_mut(home);
                dest.skipped.remove(&seq);
                if dest.skipped.is_empty() {
                    self.skipped_homes.remove(&home);
                }
            }
            Mark::SkippedConfirm(topic) => {
                let entry = self.topic_mut(topic);
                entry.confirm_skipped.remove(&seq);
                if entry.confirm_skipped.is_empty() {
                    self.confirm_topics.remove(&topic);
                }
            }
            Mark::Done | Mark::Held => unreachable!("only skipped records are read again"),
        }
    }

    /// Puts a record taken out by [`Dispatcher::unskip`] back into its skip set (its mark never changed).
    pub(super) fn reskip(&mut self, seq: Seq, mark: Mark) {
        match mark {
            Mark::SkippedBlocked(home) => {
                self.dest_mut(home).skipped.insert(seq);
                self.skipped_homes.insert(home);
            }
            Mark::SkippedConfirm(topic) => {
                self.topic_mut(topic).confirm_skipped.insert(seq);
                self.confirm_topics.insert(topic);
            }
            Mark::Done | Mark::Held => unreachable!("only skipped records are read again"),
        }
    }

    /// Sends a held record back to the WAL: it is skipped under its home, read again in WAL order.
    pub(super) fn return_to_wal(&mut self, queued: Queued) {
        let home = queued.home;
        let bytes = queued.record.encoded_len();
        self.strip
            .set(queued.record.seq(), Mark::SkippedBlocked(home), bytes);
        let dest = self.dest_mut(home);
        dest.held_home -= 1;
        dest.skipped.insert(queued.record.seq());
        self.skipped_homes.insert(home);
    }

    /// Sends a held record back to the WAL to wait for the leader's confirmation of its topic.
    pub(super) fn return_to_confirm(&mut self, queued: Queued) {
        let topic = self.dest(queued.home).topic;
        self.dest_mut(queued.home).held_home -= 1;
        let bytes = queued.record.encoded_len();
        self.strip
            .set(queued.record.seq(), Mark::SkippedConfirm(topic), bytes);
        self.topic_mut(topic)
            .confirm_skipped
            .insert(queued.record.seq());
        self.confirm_topics.insert(topic);
    }

    /// Planted `reroute-inflight`: the records of the commit in flight go back to the WAL to be
    /// placed again (rerouted) while the commit is still out.
    fn planted_reroute_in_flight(&mut self, idx: DestIdx) {
        let Some(commit) = self.dest(idx).in_flight.as_ref() else {
            return;
        };
        let records: Vec<(Seq, usize, DestIdx)> = commit
            .records
            .iter()
            .zip(&commit.homes)
            .map(|(record, &home)| (record.seq(), record.encoded_len(), home))
            .collect();
        for (seq, bytes, home) in records {
            self.strip.set(seq, Mark::SkippedBlocked(home), bytes);
            self.dest_mut(home).skipped.insert(seq);
            self.skipped_homes.insert(home);
        }
    }

    /// Marks a held record done (committed or discarded).
    pub(super) fn finish_held(&mut self, record: &DispatchRecord, home: DestIdx) {
        self.strip
            .set(record.seq(), Mark::Done, record.encoded_len());
        self.dest_mut(home).held_home -= 1;
    }

    /// Returns a destination's whole queue to the WAL, in order.
    pub(super) fn return_queue(&mut self, idx: DestIdx) {
        let queue = std::mem::take(&mut self.dest_mut(idx).queue);
        for slot in queue {
            let queued = self.queued.remove(slot.0);
            self.return_to_wal(queued);
        }
        self.refresh_candidate(idx);
    }

    /// Keeps the candidate set in step with a destination's state.
    pub(super) fn refresh_candidate(&mut self, idx: DestIdx) {
        let dest = self.dest(idx);
        let key =
            if dest.in_flight.is_none() && dest.failing.is_none() && dest.post_failure.is_none() {
                dest.queue
                    .front()
                    .map(|&slot| self.queued.get(slot.0).placed_at)
            } else {
                None
            };
        let old = dest.candidate_key;
        if old == key {
            return;
        }
        if let Some(old) = old {
            self.candidates.remove(&(old, idx));
        }
        if let Some(key) = key {
            self.candidates.insert((key, idx));
        }
        self.dest_mut(idx).candidate_key = key;
    }

    // ----- replica and membership -----

    pub(super) fn on_member(&mut self, node: NodeId, alive: bool) {
        let was = self.members.insert(node, alive);
        if was == Some(alive) {
            return;
        }
        if !alive {
            // A dead owner's queued records reroute at once, and so does a waiting probe (membership
            // tells when the owner is back); its commit in flight is never resent.
            for index in self.dests.indices() {
                let idx = DestIdx(index);
                if !self.owner_is_dead(idx) {
                    continue;
                }
                if !self.dest(idx).queue.is_empty() {
                    self.return_queue(idx);
                }
                if self.plant.is(crate::planted::PlantedBug::RerouteInflight) {
                    self.planted_reroute_in_flight(idx);
                }
                let waiting_probe = self
                    .dest(idx)
                    .failing
                    .as_ref()
                    .is_some_and(|failing| failing.probe.is_some());
                if waiting_probe {
                    let failing = self.dest_mut(idx).failing.take().expect("checked above");
                    self.failing_dests.remove(&idx);
                    if let Some(probe) = failing.probe {
                        self.return_to_wal(probe);
                    }
                    self.refresh_candidate(idx);
                }
            }
        }
        self.want_rescan();
    }

    pub(super) fn on_topic(&mut self, name: String, view: Option<TopicPlacement>) {
        let idx = match (self.find_topic(&name), &view) {
            (Some(idx), _) => idx,
            (None, None) => return,
            (None, Some(_)) => match self.intern_topic(&name) {
                Ok(idx) => idx,
                // Full of topics: the records of this one skip until garbage collection makes room.
                Err(TableFull) => return,
            },
        };
        self.incarnation_epoch += 1;
        let entry = self.topic_mut(idx);
        if view.is_some() {
            entry.absent_confirmed = false;
        }
        entry.local = view;
        // The replica moved: the question may have a new answer, or none may be needed.
        entry.unconfirmed_until = None;
        self.memory_topics.remove(&idx);
        self.want_rescan();
    }

    /// Drops idle destinations of topics that no longer serve them, and idle absent topics.
    pub(super) fn collect_garbage(&mut self) {
        for index in self.dests.indices() {
            let idx = DestIdx(index);
            let dest = self.dest(idx);
            let idle = dest.queue.is_empty()
                && dest.in_flight.is_none()
                && dest.failing.is_none()
                && dest.post_failure.is_none()
                && dest.skipped.is_empty()
                && dest.held_home == 0
                && !dest.refused;
            let served = self
                .topic(dest.topic)
                .local
                .as_ref()
                .is_some_and(|view| (dest.partition.0 as usize) < view.owners.len());
            if idle && !served {
                let (topic, partition) = (dest.topic, dest.partition);
                self.topic_mut(topic).dests.remove(partition);
                self.dests.remove(index);
            }
        }
        for index in self.topics.indices() {
            let entry = self.topics.get(index);
            let idle = entry.local.is_none()
                && entry.dests.is_empty()
                && entry.confirm_skipped.is_empty()
                && !entry.confirm_pending
                && entry.asked_ids.is_empty()
                && entry.unconfirmed_until.is_none();
            if idle {
                let entry = self.topics.remove(index);
                self.topic_index.remove(&entry.name);
                if self.last_topic == Some(TopicIdx(index)) {
                    self.last_topic = None;
                }
            }
        }
    }
}
