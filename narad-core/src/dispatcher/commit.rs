//! Commits: the fan-out, linger, byte budget, hung commits, probes, failures, 412s, legacy owners and
//! the leader's answers about deleted topics.

use super::api::{
    CommitFailure, CommitId, CommitOwner, CommitRecords, DispatchWarning, DispatcherOutput,
    FailureReaction, LeaderView, SendCommit,
};
use super::machine::Dispatcher;
use super::place::{Resolution, Status};
use super::tables::{DestIdx, Failing, InFlight, PostFailure, Queued, TopicIdx};
use super::*;
use crate::ids::TopicId;
use crate::time::Instant;
use core::ops::Bound;
use std::sync::Arc;

impl Dispatcher {
    // ----- sending -----

    /// Sends what may leave now: due probes first, then queues, oldest queued record first, while
    /// fewer than 16 commits count as in flight.
    pub(super) fn pump(&mut self, now: Instant) {
        if !self.failing_dests.is_empty() && !self.send_due_probes(now) {
            return;
        }
        // Every candidate left after the scan waits (linger, owner lookup); the earliest of their
        // wake-ups is remembered for `poll_timeout`. With every slot taken none is needed: a slot
        // frees on an answer or at the hung threshold, both wake-ups of their own.
        let mut cursor: Option<(Instant, DestIdx)> = None;
        let mut wake: Option<Instant> = None;
        while self.counted_in_flight < COMMITS_IN_FLIGHT_MAX {
            let next = match cursor {
                None => self.candidates.iter().next(),
                Some(key) => self
                    .candidates
                    .range((Bound::Excluded(key), Bound::Unbounded))
                    .next(),
            };
            let Some(&key) = next else { break };
            cursor = Some(key);
            self.try_send(now, key.1);
            if self.dest(key.1).candidate_key.is_some() {
                if let Some(at) = self.candidate_wake(now, key.1) {
                    wake = Some(wake.map_or(at, |wake| wake.min(at)));
                }
            }
        }
        self.candidates_wake = if self.counted_in_flight < COMMITS_IN_FLIGHT_MAX {
            wake
        } else {
            None
        };
    }

    /// Sends the probes that are due, failing destinations in order; `false` once every slot is taken.
    fn send_due_probes(&mut self, now: Instant) -> bool {
        let failing: Vec<DestIdx> = self.failing_dests.iter().copied().collect();
        for idx in failing {
            if self.counted_in_flight >= COMMITS_IN_FLIGHT_MAX {
                return false;
            }
            let due =
                self.dest(idx).in_flight.is_none()
                    && self.dest(idx).failing.as_ref().is_some_and(|failing| {
                        failing.probe.is_some() && failing.next_probe_at <= now
                    });
            if due {
                self.send_probe(now, idx);
            }
        }
        true
    }

    /// When a candidate that could not leave wants to be looked at again.
    pub(super) fn candidate_wake(&self, now: Instant, idx: DestIdx) -> Option<Instant> {
        let dest = self.dest(idx);
        if let Some(at) = dest.lookup_at {
            return Some(at.max(now));
        }
        if self.counted_in_flight >= COMMITS_IN_FLIGHT_MAX {
            return None; // A slot frees on a commit answer or at the hung threshold.
        }
        match self.resolve_owner(idx) {
            Resolution::Owner(owner) => self.linger_until(idx, owner),
            Resolution::Unresolved => Some(now),
        }
    }

    /// A small batch waits for more while other commits are in flight: until twice its owner's recent
    /// commit latency has passed since its oldest record, at most 50 ms. `None`: it leaves now.
    fn linger_until(&self, idx: DestIdx, owner: CommitOwner) -> Option<Instant> {
        let dest = self.dest(idx);
        if dest.queue.len() >= TARGET_RECORDS_PER_DESTINATION || self.counted_in_flight == 0 {
            return None;
        }
        let latency = self.latency_ewma.get(&owner)?;
        let oldest = self.queued.get(dest.queue.front()?.0).placed_at;
        Some(oldest + (*latency * 2).min(LINGER_MAX))
    }

    fn try_send(&mut self, now: Instant, idx: DestIdx) {
        if self.dest(idx).lookup_at.is_some_and(|at| at > now) {
            return;
        }
        let owner = match self.resolve_owner(idx) {
            Resolution::Unresolved => {
                // The topic may have gone locally (then nothing resolves): check before waiting.
                self.check_before_leaving(now, idx);
                let dest = self.dest_mut(idx);
                dest.lookup_at = (!dest.queue.is_empty()).then_some(now + OWNER_LOOKUP_INTERVAL);
                self.refresh_candidate(idx);
                return;
            }
            Resolution::Owner(owner) => owner,
        };
        self.dest_mut(idx).lookup_at = None;
        if let CommitOwner::Remote(node) = owner {
            if self.is_dead(node) {
                // Rerouted at once: the records go back to the WAL and the rescan places them.
                self.return_queue(idx);
                self.want_rescan();
                return;
            }
        }
        if self
            .linger_until(idx, owner)
            .is_some_and(|until| until > now)
        {
            return;
        }
        let was_full = self.dest(idx).queue.len() >= self.destination_queue_cap();
        self.check_before_leaving(now, idx);
        if self.dest(idx).queue.is_empty() {
            self.refresh_candidate(idx);
            return;
        }
        let (records, homes) = self.take_batch(idx, owner);
        self.send(now, idx, owner, records, homes, false);
        if was_full {
            self.want_rescan(); // The queue drained: its skipped records can come back.
        }
    }

    /// The incarnation check just before a batch leaves: records whose incarnation was replaced
    /// meanwhile go back to the WAL to wait for the leader; confirmed-gone ones are discarded.
    fn check_before_leaving(&mut self, now: Instant, idx: DestIdx) {
        if self.dest(idx).verified_epoch == self.incarnation_epoch {
            return; // Nothing changed since every queued record was checked.
        }
        self.dest_mut(idx).verified_epoch = self.incarnation_epoch;
        let topic = self.dest(idx).topic;
        let mut last: Option<(Option<TopicId>, Status)> = None;
        let mut all_resolved = true;
        for &slot in &self.dest(idx).queue {
            let id = self.queued.get(slot.0).record.topic_id();
            let status = match last {
                Some((last_id, status)) if last_id == id => status,
                _ => self.status(topic, id),
            };
            last = Some((id, status));
            if status != Status::Resolved {
                all_resolved = false;
                break;
            }
        }
        if all_resolved {
            return;
        }
        let queue = std::mem::take(&mut self.dest_mut(idx).queue);
        let mut discarded: Vec<(Option<TopicId>, usize)> = Vec::new();
        for slot in queue {
            let id = self.queued.get(slot.0).record.topic_id();
            if self.status(topic, id) == Status::Resolved {
                self.dest_mut(idx).queue.push_back(slot);
                continue;
            }
            let queued = self.queued.remove(slot.0);
            match self.status(topic, id) {
                Status::Resolved => unreachable!("kept above"),
                Status::NeedsConfirm => {
                    self.ask_if_needed(now, topic, queued.record.topic_id());
                    self.return_to_confirm(queued);
                }
                Status::GoneDeleted | Status::GoneStale => {
                    let id = queued.record.topic_id();
                    self.check_discard_confirmed(topic, id);
                    match discarded.last_mut() {
                        Some((last_id, count)) if *last_id == id => *count += 1,
                        _ => discarded.push((id, 1)),
                    }
                    self.finish_held(&queued.record, queued.home);
                    self.stats.discarded_records += 1;
                }
            }
        }
        let name = self.topic(topic).name.to_string();
        let partition = self.dest(idx).partition;
        for (topic_id, records) in discarded {
            self.emit(DispatcherOutput::Warn(
                DispatchWarning::DiscardedQueueForDeletedTopic {
                    topic: name.clone(),
                    topic_id,
                    partition,
                    records,
                },
            ));
        }
        self.refresh_candidate(idx);
    }

    /// The front of the queue that leaves as one commit: one incarnation, and for a remote owner at
    /// most 8 MiB of encoded records (always at least one). The rest stays queued, in order.
    fn take_batch(
        &mut self,
        idx: DestIdx,
        owner: CommitOwner,
    ) -> (Vec<super::record::DispatchRecord>, Vec<DestIdx>) {
        let budget_bytes = match owner {
            CommitOwner::Local => usize::MAX,
            CommitOwner::Remote(_) => REMOTE_COMMIT_BYTES_MAX,
        };
        let dest = self.dests.get_mut(idx.0);
        let mut first_id = None;
        let mut bytes = 0usize;
        let mut records = Vec::with_capacity(dest.queue.len());
        let mut homes = Vec::with_capacity(dest.queue.len());
        while let Some(&slot) = dest.queue.front() {
            let front = &self.queued.get(slot.0).record;
            let id = Some(front.topic_id());
            if first_id.is_some() && id != first_id {
                break;
            }
            first_id = id;
            let len = front.encoded_len();
            if !records.is_empty() && bytes.saturating_add(len) > budget_bytes {
                break;
            }
            bytes = bytes.saturating_add(len);
            dest.queue.pop_front();
            let queued = self.queued.remove(slot.0);
            records.push(queued.record);
            homes.push(queued.home);
        }
        (records, homes)
    }

    fn send_probe(&mut self, now: Instant, idx: DestIdx) {
        let topic = self.dest(idx).topic;
        let failing = self.dest(idx).failing.as_ref().expect("a due probe");
        let probe_id = failing
            .probe
            .as_ref()
            .expect("a due probe")
            .record
            .topic_id();
        if self.status(topic, probe_id) != Status::Resolved {
            // The incarnation check before it leaves: its topic went meanwhile.
            let failing = self.dest_mut(idx).failing.as_mut().expect("a due probe");
            let probe = failing.probe.take().expect("a due probe");
            let post = PostFailure {
                topic_id: probe_id,
                records: vec![probe],
                failure: failing.last_failure.clone(),
                started: failing.since,
            };
            return self.check_after_failure(now, idx, post);
        }
        let owner = match self.resolve_owner(idx) {
            Resolution::Owner(owner) => owner,
            Resolution::Unresolved => {
                // Looked up again in 10 ms.
                if let Some(failing) = self.dest_mut(idx).failing.as_mut() {
                    failing.next_probe_at = now + OWNER_LOOKUP_INTERVAL;
                }
                return;
            }
        };
        let failing = self.dest_mut(idx).failing.as_mut().expect("a due probe");
        let probe = failing.probe.take().expect("a due probe");
        self.send(now, idx, owner, vec![probe.record], vec![probe.home], true);
    }

    fn send(
        &mut self,
        now: Instant,
        idx: DestIdx,
        owner: CommitOwner,
        records: Vec<super::record::DispatchRecord>,
        homes: Vec<DestIdx>,
        probe: bool,
    ) {
        let with_ids = match owner {
            CommitOwner::Local => true,
            CommitOwner::Remote(node) => self
                .legacy_until
                .get(&node)
                .is_none_or(|until| *until <= now),
        };
        let budget = if probe { PROBE_BUDGET } else { COMMIT_BUDGET };
        let topic_id = records[0].topic_id();
        let commit = InFlight {
            commit_id: self.new_commit_id(),
            topic_id,
            records: CommitRecords(Arc::new(records)),
            homes,
            owner,
            started: now,
            deadline: now + budget,
            hung: false,
            probe,
            with_ids,
        };
        self.launch(idx, commit);
    }

    fn new_commit_id(&mut self) -> CommitId {
        let id = CommitId(self.next_commit_id);
        self.next_commit_id += 1;
        id
    }

    /// Puts a commit in flight and emits it.
    fn launch(&mut self, idx: DestIdx, commit: InFlight) {
        let dest = self.dest(idx);
        let output = SendCommit {
            commit_id: commit.commit_id,
            topic: self.topic(dest.topic).name.clone(),
            topic_id: commit.topic_id,
            partition: dest.partition,
            owner: commit.owner,
            records: commit.records.clone(),
            with_ids: commit.with_ids,
            deadline: commit.deadline,
        };
        self.commits.insert(commit.commit_id, idx);
        if commit.hung {
            self.held_hung += commit.records.len();
        } else {
            self.counted_in_flight += 1;
        }
        self.stats.commits_sent += 1;
        let dest = self.dest_mut(idx);
        assert!(
            dest.in_flight.is_none(),
            "at most one commit in flight per destination"
        );
        dest.in_flight = Some(commit);
        self.refresh_candidate(idx);
        self.emit(DispatcherOutput::SendCommit(output));
    }

    /// Takes a destination's commit out of flight (its accounting with it).
    fn land(&mut self, commit_id: CommitId) -> (DestIdx, InFlight) {
        let idx = self
            .commits
            .remove(&commit_id)
            .unwrap_or_else(|| panic!("an answer for {commit_id}, which is not in flight"));
        let commit = self.dest_mut(idx).in_flight.take().expect("in flight");
        if crate::DEEP_CHECKS {
            // A record in flight stays held until its commit lands: never placed again meanwhile.
            for record in commit.records.iter() {
                assert_eq!(
                    self.strip.get(record.seq()),
                    Some(super::strip::Mark::Held),
                    "record {} of {commit_id} was released while in flight",
                    record.seq()
                );
            }
        }
        if commit.hung {
            self.held_hung -= commit.records.len();
        } else {
            self.counted_in_flight -= 1;
        }
        (idx, commit)
    }

    /// A commit in flight past 1 s stops counting against the fan-out, and what queued behind it goes
    /// back to the WAL: its destination takes nothing new until it lands.
    pub(super) fn mark_hung(&mut self, idx: DestIdx) {
        let commit = self.dest_mut(idx).in_flight.as_mut().expect("in flight");
        commit.hung = true;
        let records = commit.records.len();
        self.counted_in_flight -= 1;
        self.held_hung += records;
        self.stats.commits_hung += 1;
        self.return_queue(idx);
        self.want_rescan();
    }

    // ----- answers -----

    pub(super) fn on_commit_done(&mut self, now: Instant, commit_id: CommitId) {
        let (idx, commit) = self.land(commit_id);
        let sample = now.saturating_duration_since(commit.started);
        let ewma = self.latency_ewma.get(&commit.owner).map_or(sample, |old| {
            (*old * (EWMA_WEIGHT_DENOMINATOR - 1) + sample) / EWMA_WEIGHT_DENOMINATOR
        });
        self.latency_ewma.insert(commit.owner, ewma);
        for (record, &home) in commit.records.iter().zip(&commit.homes) {
            self.finish_held(record, home);
        }
        self.stats.committed_records += commit.records.len() as u64;
        if commit.probe {
            // Recovered: the original gets its records back.
            self.dest_mut(idx).failing = None;
            self.failing_dests.remove(&idx);
            self.want_rescan();
        }
        if commit.hung {
            self.want_rescan();
        }
        self.refresh_candidate(idx);
        self.strip.advance();
    }

    pub(super) fn on_commit_failed(
        &mut self,
        now: Instant,
        commit_id: CommitId,
        failure: CommitFailure,
    ) {
        let (idx, mut commit) = self.land(commit_id);
        if commit.hung {
            self.want_rescan();
        }
        let reaction = match failure.reaction() {
            // Planted: the owner's refusal counts as its failure.
            FailureReaction::Refused { .. }
                if self
                    .plant
                    .is(crate::planted::PlantedBug::FourTwelveAsFailure) =>
            {
                FailureReaction::Failing
            }
            reaction @ (FailureReaction::Refused { .. }
            | FailureReaction::ResendWithoutIds
            | FailureReaction::Failing) => reaction,
        };
        match reaction {
            FailureReaction::ResendWithoutIds if commit.with_ids && now < commit.deadline => {
                // An older owner: keep its batches id-less for 2 minutes, and send this one again
                // without ids on what is left of the same budget, unless its incarnation was replaced
                // meanwhile (an id-less batch commits by name: the check must happen here).
                let planted = self
                    .plant
                    .is(crate::planted::PlantedBug::LegacyResendKeepsIds);
                if let CommitOwner::Remote(node) = commit.owner {
                    if !planted {
                        self.legacy_until.insert(node, now + LEGACY_OWNER_MEMORY);
                    }
                }
                let topic = self.dest(idx).topic;
                if self.status(topic, commit.topic_id) == Status::Resolved {
                    commit.commit_id = self.new_commit_id();
                    // Planted: the resend carries the section the owner just refused.
                    commit.with_ids = planted;
                    self.launch(idx, commit);
                } else {
                    self.stats.commits_failed += 1;
                    self.after_failure(now, idx, commit, failure);
                }
            }
            FailureReaction::Refused { live_topic_id } => {
                self.on_refused(idx, commit, live_topic_id)
            }
            FailureReaction::Failing | FailureReaction::ResendWithoutIds => {
                self.stats.commits_failed += 1;
                self.after_failure(now, idx, commit, failure);
            }
        }
        self.strip.advance();
    }

    /// 412 (or the local mismatch): the records and what queued behind them go back to the WAL in
    /// order; not a failure, no reroute; they are checked again at the next periodic rescan.
    fn on_refused(&mut self, idx: DestIdx, commit: InFlight, live_topic_id: Option<TopicId>) {
        self.stats.commits_refused += 1;
        let records = commit.records.len() + self.dest(idx).queue.len();
        let queued = into_queued(commit.records, commit.homes, commit.started);
        for queued in queued {
            self.return_to_wal(queued);
        }
        self.return_queue(idx);
        let dest = self.dest_mut(idx);
        dest.refused = true;
        if dest.failing.take().is_some() {
            self.failing_dests.remove(&idx);
        }
        self.refused_dests.insert(idx);
        self.refresh_candidate(idx);
        let dest = self.dest(idx);
        self.emit(DispatcherOutput::Warn(
            DispatchWarning::IncarnationRefused {
                topic: self.topic(dest.topic).name.to_string(),
                topic_id: commit.topic_id,
                partition: dest.partition,
                owner: commit.owner,
                live_topic_id,
                records,
            },
        ));
    }

    /// A failed commit: the incarnation check runs again first (a deleted topic's records are
    /// discarded once the leader confirms); otherwise the destination keeps one record as its probe.
    fn after_failure(
        &mut self,
        now: Instant,
        idx: DestIdx,
        commit: InFlight,
        failure: CommitFailure,
    ) {
        let records = into_queued(commit.records, commit.homes, commit.started);
        let post = PostFailure {
            records,
            topic_id: commit.topic_id,
            failure,
            started: commit.started,
        };
        self.check_after_failure(now, idx, post);
    }

    /// The incarnation check after a failed commit (and before a probe leaves): a confirmed-deleted
    /// incarnation is discarded; an unconfirmed one waits for the leader (only this destination
    /// waits); a live one is an ordinary failure.
    fn check_after_failure(&mut self, now: Instant, idx: DestIdx, post: PostFailure) {
        let topic = self.dest(idx).topic;
        match self.status(topic, post.topic_id) {
            Status::Resolved => self.fail_destination(now, idx, post),
            Status::GoneDeleted | Status::GoneStale => self.discard_after_failure(idx, post),
            Status::NeedsConfirm => {
                if self.ask_if_needed(now, topic, post.topic_id) {
                    self.return_queue(idx);
                    self.dest_mut(idx).post_failure = Some(post);
                    self.refresh_candidate(idx);
                } else {
                    self.fail_destination(now, idx, post);
                }
            }
        }
    }

    fn discard_after_failure(&mut self, idx: DestIdx, post: PostFailure) {
        self.check_discard_confirmed(self.dest(idx).topic, post.topic_id);
        let dest = self.dest(idx);
        let (topic, partition) = (self.topic(dest.topic).name.to_string(), dest.partition);
        for queued in post.records {
            self.finish_held(&queued.record, queued.home);
            self.stats.discarded_records += 1;
            self.emit(DispatcherOutput::Warn(
                DispatchWarning::DiscardedAfterFailedCommit {
                    topic: topic.clone(),
                    topic_id: post.topic_id,
                    partition,
                    seq: queued.record.seq(),
                    error: post.failure.clone(),
                },
            ));
        }
        if self.dest_mut(idx).failing.take().is_some() {
            self.failing_dests.remove(&idx);
        }
        self.refresh_candidate(idx);
        self.want_rescan();
    }

    /// Keeps the first record as the probe (tried again in 1 s on a 5 s budget) and returns the rest,
    /// and everything queued, to the WAL. The reroute grace counts from the first failed attempt.
    ///
    /// A destination whose owner membership reports dead keeps no probe: its records all go back and
    /// are rerouted, and membership, not a probe, tells when the owner is back. A probe there would
    /// pin the checkpoint (and the WAL behind it) for the whole outage.
    fn fail_destination(&mut self, now: Instant, idx: DestIdx, post: PostFailure) {
        if crate::DEEP_CHECKS {
            assert!(
                !matches!(post.failure, CommitFailure::IncarnationMismatch { .. }),
                "a 412 (or the local incarnation refusal) would mark {idx:?} failing"
            );
        }
        if self.owner_is_dead(idx) {
            for queued in post.records {
                self.return_to_wal(queued);
            }
            self.return_queue(idx);
            self.dest_mut(idx).failing = None;
            self.failing_dests.remove(&idx);
            self.refresh_candidate(idx);
            self.want_rescan();
            return;
        }
        let mut records = post.records.into_iter();
        let probe = records.next().expect("a commit has at least one record");
        for queued in records {
            self.return_to_wal(queued);
        }
        self.return_queue(idx);
        let since = self
            .dest(idx)
            .failing
            .as_ref()
            .map_or(post.started, |failing| failing.since);
        let grace_passed = since + REROUTE_GRACE <= now;
        self.dest_mut(idx).failing = Some(Failing {
            since,
            probe: Some(probe),
            next_probe_at: now + FAILURE_BACKOFF,
            grace_passed,
            last_failure: post.failure,
        });
        self.failing_dests.insert(idx);
        self.refresh_candidate(idx);
        if grace_passed {
            self.want_rescan();
        }
    }

    /// The leader answered a question about a topic.
    pub(super) fn on_gone_answer(&mut self, now: Instant, name: &str, view: LeaderView) {
        let Some(topic) = self.find_topic(name) else {
            return;
        };
        let entry = self.topic_mut(topic);
        if !entry.confirm_pending {
            return; // Not asked (a duplicate answer): nothing to learn from it.
        }
        entry.confirm_pending = false;
        let asked = std::mem::take(&mut entry.asked_ids);
        let locally_absent = entry.local.is_none();
        let mut unconfirmed = false;
        let mut confirmed = false;
        for topic_id in asked {
            let gone = match (&view, topic_id) {
                (LeaderView::Absent, _) => true,
                (LeaderView::Present { topic_id: live }, Some(id)) => *live != Some(id),
                (LeaderView::Present { .. }, None) | (LeaderView::Unconfirmed, _) => false,
            };
            match (gone, topic_id) {
                (true, Some(id)) => {
                    self.remember_gone(id);
                    confirmed = true;
                }
                (true, None) if locally_absent => {
                    self.incarnation_epoch += 1;
                    self.topic_mut(topic).absent_confirmed = true;
                    confirmed = true;
                }
                _ => unconfirmed = true,
            }
        }
        if unconfirmed {
            self.topic_mut(topic).unconfirmed_until = Some(now + UNCONFIRMED_MEMORY);
            self.memory_topics.insert(topic);
        }
        self.resolve_post_failures(now, topic);
        if confirmed {
            self.want_rescan();
        }
    }

    /// Destinations of the topic waiting on the answer: discard or treat as an ordinary failure.
    fn resolve_post_failures(&mut self, now: Instant, topic: TopicIdx) {
        let waiting: Vec<DestIdx> = self
            .topic(topic)
            .dests
            .values()
            .into_iter()
            .filter(|&idx| self.dest(idx).post_failure.is_some())
            .collect();
        for idx in waiting {
            let post = self.dest_mut(idx).post_failure.take().expect("filtered");
            match self.status(topic, post.topic_id) {
                Status::GoneDeleted | Status::GoneStale => self.discard_after_failure(idx, post),
                Status::Resolved | Status::NeedsConfirm => self.fail_destination(now, idx, post),
            }
        }
    }
}

/// A failed commit's records, as held records again (the driver has normally dropped its copy, so
/// this does not clone).
fn into_queued(records: CommitRecords, homes: Vec<DestIdx>, placed_at: Instant) -> Vec<Queued> {
    let records = Arc::try_unwrap(records.0).unwrap_or_else(|shared| (*shared).clone());
    records
        .into_iter()
        .zip(homes)
        .map(|(record, home)| Queued {
            record,
            home,
            placed_at,
        })
        .collect()
}

/// The moving average weighs each new sample 1/8 (as TCP's smoothed round-trip time).
const EWMA_WEIGHT_DENOMINATOR: u32 = 8;
