//! The dispatcher's state, its `Actor` implementation, timers, getters and invariants.

use super::api::{CommitOwner, DispatcherConfig, DispatcherInput, DispatcherOutput};
use super::strip::Strip;
use super::tables::{Dest, DestIdx, Queued, Slab, TopicEntry, TopicIdx};
use super::*;
use crate::actor::Actor;
use crate::codec::DecodeError;
use crate::error::IoFault;
use crate::ids::{NodeId, Seq, TopicId};
use crate::routing::FnvBuildHasher;
use crate::time::Instant;
use core::time::Duration;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// What the outstanding WAL read is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReadKind {
    /// New records from the read frontier.
    Fresh { from: Seq, max_records: usize },
    /// Skipped records, read again.
    Rescan { from: Seq, max_records: usize },
}

/// The per-node produce dispatcher. See the [module documentation](super) for the protocol.
#[derive(Debug)]
pub struct Dispatcher {
    pub(super) node: NodeId,
    pub(super) plant: crate::planted::Plant,
    /// The highest checkpoint the planted `checkpoint-skips-inflight` stored (never read otherwise).
    pub(super) planted_stored: Seq,
    pub(super) now: Instant,
    pub(super) strip: Strip,
    pub(super) durable_next: Seq,
    pub(super) stored: Seq,
    pub(super) store_in_flight: Option<Seq>,
    pub(super) backoff_until: Option<Instant>,
    pub(super) last_fault: Option<IoFault>,
    pub(super) read: Option<ReadKind>,
    pub(super) last_read_at: Instant,
    /// A rescan pass is running; it reads skipped records at or after `rescan_cursor`.
    pub(super) rescanning: bool,
    pub(super) rescan_cursor: Seq,
    /// Something may have unblocked skipped records during the pass: run another pass after it.
    pub(super) rescan_again: bool,
    pub(super) next_periodic_rescan: Instant,
    /// The reader stopped in front of a record it cannot decode.
    pub(super) stalled: Option<Seq>,
    pub(super) warned_undecodable: Option<Seq>,
    pub(super) topics: Slab<TopicEntry>,
    pub(super) topic_index: HashMap<Arc<str>, TopicIdx, FnvBuildHasher>,
    pub(super) dests: Slab<Dest>,
    /// Every queued record (destinations' queues hold slots of it).
    pub(super) queued: Slab<Queued>,
    pub(super) dest_high_water: usize,
    pub(super) members: BTreeMap<NodeId, bool>,
    pub(super) latency_ewma: BTreeMap<CommitOwner, Duration>,
    pub(super) legacy_until: BTreeMap<NodeId, Instant>,
    pub(super) gone: BTreeSet<TopicId>,
    pub(super) gone_order: VecDeque<TopicId>,
    pub(super) commits: BTreeMap<super::api::CommitId, DestIdx>,
    pub(super) next_commit_id: u64,
    pub(super) counted_in_flight: usize,
    pub(super) held_hung: usize,
    /// Destinations with queued records and nothing in flight, oldest queued record first.
    pub(super) candidates: BTreeSet<(Instant, DestIdx)>,
    pub(super) failing_dests: BTreeSet<DestIdx>,
    pub(super) refused_dests: BTreeSet<DestIdx>,
    /// Homes with skipped records.
    pub(super) skipped_homes: BTreeSet<DestIdx>,
    /// Topics with records skipped until the leader confirms.
    pub(super) confirm_topics: BTreeSet<TopicIdx>,
    /// Topics remembering an unconfirmed answer.
    pub(super) memory_topics: BTreeSet<TopicIdx>,
    pub(super) outputs: VecDeque<DispatcherOutput>,
    pub(super) next_wake: Option<Instant>,
    /// The earliest wake-up of a waiting candidate, as the last pump found it.
    pub(super) candidates_wake: Option<Instant>,
    pub(super) last_topic: Option<TopicIdx>,
    /// Moves whenever an incarnation check could answer differently (a replica change, a deletion
    /// confirmed), so a queue checked since needs no new check before it leaves.
    pub(super) incarnation_epoch: u64,
    pub(super) stats: Stats,
}

/// Running totals, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Records placed on a sibling partition's queue instead of their own.
    pub rerouted_records: u64,
    /// Records discarded after the leader confirmed their topic (incarnation) deleted.
    pub discarded_records: u64,
    /// Records whose commit landed.
    pub committed_records: u64,
    /// Commits sent (probes and legacy resends included).
    pub commits_sent: u64,
    /// Commits that failed (errors and timeouts).
    pub commits_failed: u64,
    /// Commits refused for another incarnation (412 or local mismatch).
    pub commits_refused: u64,
    /// Commits that ran past the hung threshold.
    pub commits_hung: u64,
    /// Records read from the WAL for the first time.
    pub records_read: u64,
    /// Skipped records read again.
    pub records_reread: u64,
}

impl Dispatcher {
    /// A dispatcher starting at the recovered checkpoint. Before the first `Tick` or `Durable`, feed
    /// the local replica (`Topic` for every topic) and membership (`Member` for every node).
    pub fn new(config: DispatcherConfig) -> Self {
        assert!(
            config.checkpoint <= config.durable_next,
            "checkpoint past the durable end"
        );
        Dispatcher {
            node: config.node,
            plant: config.plant,
            planted_stored: Seq(0),
            now: Instant::ZERO,
            strip: Strip::new(config.checkpoint),
            durable_next: config.durable_next,
            stored: config.checkpoint,
            store_in_flight: None,
            backoff_until: None,
            last_fault: None,
            read: None,
            last_read_at: Instant::ZERO,
            rescanning: false,
            rescan_cursor: config.checkpoint,
            rescan_again: false,
            next_periodic_rescan: Instant::ZERO + RESCAN_INTERVAL,
            stalled: None,
            warned_undecodable: None,
            topics: Slab::new(),
            topic_index: HashMap::default(),
            dests: Slab::new(),
            queued: Slab::new(),
            dest_high_water: 0,
            members: BTreeMap::new(),
            latency_ewma: BTreeMap::new(),
            legacy_until: BTreeMap::new(),
            gone: BTreeSet::new(),
            gone_order: VecDeque::new(),
            commits: BTreeMap::new(),
            next_commit_id: 0,
            counted_in_flight: 0,
            held_hung: 0,
            candidates: BTreeSet::new(),
            failing_dests: BTreeSet::new(),
            refused_dests: BTreeSet::new(),
            skipped_homes: BTreeSet::new(),
            confirm_topics: BTreeSet::new(),
            memory_topics: BTreeSet::new(),
            outputs: VecDeque::new(),
            next_wake: Some(Instant::ZERO),
            candidates_wake: None,
            last_topic: None,
            incarnation_epoch: 1,
            stats: Stats::default(),
        }
    }

    // ----- getters -----

    /// The checkpoint: the first sequence number not done.
    pub fn checkpoint(&self) -> Seq {
        self.strip.base()
    }

    /// The last checkpoint the Checkpointer confirmed storing.
    pub fn stored_checkpoint(&self) -> Seq {
        self.stored
    }

    /// The WAL's durable next sequence number, as far as the dispatcher knows.
    pub fn durable_next(&self) -> Seq {
        self.durable_next
    }

    /// The first sequence number never read.
    pub fn read_frontier(&self) -> Seq {
        self.strip.frontier()
    }

    /// `narad_ingress_dispatch_backlog_records`: durable next minus the stored checkpoint, the records
    /// a restart would replay.
    pub fn backlog_records(&self) -> u64 {
        self.durable_next.0.saturating_sub(self.stored.0)
    }

    /// Encoded bytes of records read but not done (held or skipped). Records not read yet are not
    /// counted: the WAL host knows their size.
    pub fn backlog_bytes_read(&self) -> u64 {
        self.strip.bytes_not_done()
    }

    /// Accept time (Unix ms) of the oldest undispatched record, when it has been read: the driver
    /// subtracts it from the wall clock for the oldest-record age.
    pub fn oldest_undispatched_accept_ms(&self) -> Option<u64> {
        self.strip.oldest_accept_ms()
    }

    /// Records held: queued, in flight (hung included), probes, post-failure batches.
    pub fn held_records(&self) -> usize {
        self.strip.held()
    }

    /// Records held that count against the window (hung commits aside).
    pub fn held_counted_records(&self) -> usize {
        self.strip.held() - self.held_hung
    }

    /// Records left in the WAL to be read again.
    pub fn skipped_records(&self) -> usize {
        self.strip.skipped()
    }

    /// Commits in flight that count against the fan-out (hung ones aside).
    pub fn commits_in_flight(&self) -> usize {
        self.counted_in_flight
    }

    /// Commits in flight past the hung threshold.
    pub fn hung_commits(&self) -> usize {
        self.commits.len() - self.counted_in_flight
    }

    /// The window: 64 records per destination seen, between 4,096 and 65,536.
    pub fn window_records(&self) -> usize {
        (self.dest_high_water * TARGET_RECORDS_PER_DESTINATION)
            .clamp(WINDOW_RECORDS_MIN, WINDOW_RECORDS_MAX)
    }

    /// A destination's queue cap: a quarter of the window, at least 4,096.
    pub fn destination_queue_cap(&self) -> usize {
        (self.window_records() / 4).max(DESTINATION_QUEUE_RECORDS_MIN)
    }

    /// The reader stops when the held records (hung aside) reach this: the window, but at least four
    /// destinations' worth, so one destination (a commit in flight plus a full queue) never holds more
    /// than half.
    pub fn held_limit_records(&self) -> usize {
        self.window_records().max(4 * self.destination_queue_cap())
    }

    /// The reader never reads past this: 16 windows past the checkpoint.
    pub fn lookahead_end(&self) -> Seq {
        Seq(self.strip.base().0 + LOOKAHEAD_WINDOWS * self.window_records() as u64)
    }

    /// Whether the dispatcher backs off (a failed WAL read or checkpoint store) at `now`.
    pub fn is_backing_off(&self, now: Instant) -> bool {
        self.backoff_until.is_some_and(|until| until > now)
    }

    /// The fault behind the last back-off.
    pub fn last_fault(&self) -> Option<&IoFault> {
        self.last_fault.as_ref()
    }

    /// Where the reader stopped in front of an undecodable record, if it did.
    pub fn stalled_at(&self) -> Option<Seq> {
        self.stalled
    }

    /// Destinations currently known.
    pub fn destinations(&self) -> usize {
        self.dests.len()
    }

    /// Running totals.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The moving-average commit latency of an owner, once measured.
    pub fn owner_latency(&self, owner: CommitOwner) -> Option<Duration> {
        self.latency_ewma.get(&owner).copied()
    }

    /// A one-screen description of the state, for test failures.
    pub fn debug_summary(&self) -> String {
        let mut out = format!(
            "now {} checkpoint {} stored {} frontier {} durable {} held {} hung {} skipped {} \
             in flight {} rescanning {} backoff {:?} stalled {:?}\n",
            self.now,
            self.strip.base(),
            self.stored,
            self.strip.frontier(),
            self.durable_next,
            self.strip.held(),
            self.held_hung,
            self.strip.skipped(),
            self.counted_in_flight,
            self.rescanning,
            self.backoff_until,
            self.stalled
        );
        for (index, dest) in self.dests.iter() {
            let topic = self.topic(dest.topic);
            out += &format!(
                "  dest {index} {}/{} local {:?} queue {} in_flight {:?} failing {:?} post {} skipped {:?} \
                 held_home {} refused {} lookup {:?}\n",
                topic.name,
                dest.partition,
                topic.local,
                dest.queue.len(),
                dest.in_flight.as_ref().map(|c| (c.commit_id, c.started, c.hung, c.probe, c.records.len())),
                dest.failing.as_ref().map(|f| (f.since, f.probe.as_ref().map(|p| p.record.seq()), f.next_probe_at)),
                dest.post_failure.is_some(),
                dest.skipped.iter().take(5).collect::<Vec<_>>(),
                dest.held_home,
                dest.refused,
                dest.lookup_at,
            );
        }
        for (index, topic) in self.topics.iter() {
            out += &format!(
                "  topic {index} {} pending {} until {:?} asked {:?} confirm_skipped {:?}\n",
                topic.name,
                topic.confirm_pending,
                topic.unconfirmed_until,
                topic.asked_ids,
                topic.confirm_skipped.iter().take(5).collect::<Vec<_>>()
            );
        }
        out += &format!("  members {:?} gone {:?}\n", self.members, self.gone);
        out
    }

    // ----- shared helpers -----

    pub(super) fn dest(&self, idx: DestIdx) -> &Dest {
        self.dests.get(idx.0)
    }

    pub(super) fn dest_mut(&mut self, idx: DestIdx) -> &mut Dest {
        self.dests.get_mut(idx.0)
    }

    pub(super) fn topic(&self, idx: TopicIdx) -> &TopicEntry {
        self.topics.get(idx.0)
    }

    pub(super) fn topic_mut(&mut self, idx: TopicIdx) -> &mut TopicEntry {
        self.topics.get_mut(idx.0)
    }

    pub(super) fn emit(&mut self, output: DispatcherOutput) {
        self.outputs.push_back(output);
    }

    /// Something may have unblocked skipped records: read them again (now, or after this pass).
    pub(super) fn want_rescan(&mut self) {
        if self.strip.skipped() == 0 {
            return;
        }
        if self.rescanning {
            self.rescan_again = true;
        } else {
            self.rescanning = true;
            self.rescan_cursor = self.strip.base();
        }
    }

    pub(super) fn back_off(&mut self, now: Instant, fault: IoFault) {
        self.backoff_until = Some(now + FAILURE_BACKOFF);
        self.last_fault = Some(fault);
    }

    // ----- timers -----

    fn run_timers(&mut self, now: Instant) {
        self.expire_hung(now);
        // The sets are empty on a healthy node: nothing to walk then.
        if !self.failing_dests.is_empty() {
            self.pass_reroute_graces(now);
        }
        if !self.memory_topics.is_empty() {
            self.forget_unconfirmed_answers(now);
        }
        if self.backoff_until.is_some_and(|until| until <= now) {
            self.backoff_until = None;
        }
        if !self.legacy_until.is_empty() {
            self.legacy_until.retain(|_, until| *until > now);
        }
        if now >= self.next_periodic_rescan {
            self.next_periodic_rescan = now + RESCAN_INTERVAL;
            self.periodic();
        }
    }

    /// Failing destinations whose reroute grace passed: their skipped records may go to a sibling now.
    fn pass_reroute_graces(&mut self, now: Instant) {
        let failing: Vec<DestIdx> = self.failing_dests.iter().copied().collect();
        for idx in failing {
            let grace_over = self.dest(idx).failing.as_ref().is_some_and(|failing| {
                !failing.grace_passed && failing.since + REROUTE_GRACE <= now
            });
            if grace_over {
                if let Some(failing) = self.dest_mut(idx).failing.as_mut() {
                    failing.grace_passed = true;
                }
                self.want_rescan();
            }
        }
    }

    /// Unconfirmed answers remembered long enough are forgotten: their topics may be asked again.
    fn forget_unconfirmed_answers(&mut self, now: Instant) {
        let remembering: Vec<TopicIdx> = self.memory_topics.iter().copied().collect();
        for idx in remembering {
            if self
                .topic(idx)
                .unconfirmed_until
                .is_some_and(|until| until <= now)
            {
                self.topic_mut(idx).unconfirmed_until = None;
                self.memory_topics.remove(&idx);
                self.want_rescan();
            }
        }
    }

    /// Once a second: refusals are forgotten, a stalled reader tries again, idle tables shrink, and
    /// every skipped record is considered again.
    fn periodic(&mut self) {
        for idx in std::mem::take(&mut self.refused_dests) {
            self.dest_mut(idx).refused = false;
        }
        self.stalled = None;
        self.collect_garbage();
        self.want_rescan();
    }

    fn expire_hung(&mut self, now: Instant) {
        let mut newly_hung = Vec::new();
        for (&commit_id, &idx) in &self.commits {
            let commit = self
                .dest(idx)
                .in_flight
                .as_ref()
                .expect("commit maps to its destination");
            if crate::DEEP_CHECKS {
                assert_eq!(commit.commit_id, commit_id);
            }
            if !commit.hung && commit.started + HUNG_AFTER <= now {
                newly_hung.push(idx);
            }
        }
        for idx in newly_hung {
            self.mark_hung(idx);
        }
    }

    fn compute_wake(&self, now: Instant) -> Option<Instant> {
        let mut wake = self.next_periodic_rescan;
        let mut consider = |at: Instant| wake = wake.min(at);
        for &idx in self.commits.values() {
            let commit = self
                .dest(idx)
                .in_flight
                .as_ref()
                .expect("commit maps to its destination");
            if !commit.hung {
                consider(commit.started + HUNG_AFTER);
            }
        }
        for &idx in &self.failing_dests {
            let dest = self.dest(idx);
            if let Some(failing) = dest.failing.as_ref() {
                let slot = self.counted_in_flight < COMMITS_IN_FLIGHT_MAX;
                if slot && failing.probe.is_some() && dest.in_flight.is_none() {
                    consider(failing.next_probe_at);
                }
                if !failing.grace_passed {
                    consider(failing.since + REROUTE_GRACE);
                }
            }
        }
        if let Some(at) = self.candidates_wake {
            consider(at);
        }
        for &idx in &self.memory_topics {
            if let Some(until) = self.topic(idx).unconfirmed_until {
                consider(until);
            }
        }
        if let Some(until) = self.backoff_until {
            consider(until);
        } else if self.read.is_none() && self.can_read_fresh() {
            consider(self.last_read_at + IDLE_BACKSTOP);
        }
        Some(wake.max(now))
    }

    // ----- invariants -----

    /// Checks the invariants that are cheap enough for every `handle` (panics on a violation: a bug).
    pub fn check_invariants(&self) {
        assert!(
            self.strip.base_is_first_not_done(),
            "the checkpoint is the first sequence number not done"
        );
        assert!(
            self.stored <= self.strip.base(),
            "stored checkpoint ahead of the checkpoint"
        );
        assert!(
            self.counted_in_flight <= COMMITS_IN_FLIGHT_MAX,
            "fan-out exceeded"
        );
        assert!(self.counted_in_flight <= self.commits.len());
        // The reader stops at the limit; a hung commit that then fails hands its destination one
        // record back as the probe (hung records are not counted): at most one more per failing
        // destination, and the reader waits until the count is back under the limit.
        assert!(
            self.held_counted_records() <= self.held_limit_records() + self.failing_dests.len(),
            "held {} records past the limit {} (+{} failing destinations' probes)",
            self.held_counted_records(),
            self.held_limit_records(),
            self.failing_dests.len()
        );
        assert!(
            self.strip.frontier() <= self.lookahead_end(),
            "read past the lookahead"
        );
        assert!(self.strip.held() >= self.held_hung);
    }

    /// Checks every invariant, recounting everything: O(held + skipped + destinations). Tests and the
    /// simulator call it after every step.
    pub fn check_invariants_deep(&self) {
        self.check_invariants();
        let (held, skipped) = self.strip.recount();
        assert_eq!((held, skipped), (self.strip.held(), self.strip.skipped()));
        let mut tally = DeepTally::default();
        for (index, dest) in self.dests.iter() {
            self.check_dest_deep(DestIdx(index), dest, &mut tally);
        }
        for (index, dest) in self.dests.iter() {
            assert_eq!(
                dest.held_home,
                tally.held_home.get(&DestIdx(index)).copied().unwrap_or(0),
                "held-home count of {index}"
            );
        }
        assert_eq!(
            tally.held_in_dests,
            self.strip.held(),
            "every held record is in a destination"
        );
        let queued: usize = self.dests.iter().map(|(_, dest)| dest.queue.len()).sum();
        assert_eq!(
            queued,
            self.queued.len(),
            "every queued record is in one queue"
        );
        assert_eq!(tally.hung_records, self.held_hung);
        assert_eq!(tally.counted, self.counted_in_flight);
        assert_eq!(
            self.candidates.len(),
            self.dests
                .iter()
                .filter(|(_, d)| d.candidate_key.is_some())
                .count()
        );
        self.check_skipped_deep();
    }

    /// One destination's invariants; adds what it holds to `tally`.
    fn check_dest_deep(&self, idx: DestIdx, dest: &Dest, tally: &mut DeepTally) {
        tally.held_in_dests += dest.held();
        for &slot in &dest.queue {
            let queued = self.queued.get(slot.0);
            assert_eq!(
                self.strip.get(queued.record.seq()),
                Some(super::strip::Mark::Held)
            );
            *tally.held_home.entry(queued.home).or_default() += 1;
        }
        if let Some(commit) = &dest.in_flight {
            assert_eq!(
                self.commits.get(&commit.commit_id),
                Some(&idx),
                "≤ 1 commit in flight"
            );
            assert!(commit.records.len() == commit.homes.len() && !commit.records.is_empty());
            for (record, home) in commit.records.iter().zip(&commit.homes) {
                assert_eq!(self.strip.get(record.seq()), Some(super::strip::Mark::Held));
                *tally.held_home.entry(*home).or_default() += 1;
            }
            if commit.hung {
                tally.hung_records += commit.records.len();
                assert!(
                    dest.queue.is_empty(),
                    "a hung destination takes nothing new"
                );
            } else {
                tally.counted += 1;
            }
        }
        if let Some(failing) = &dest.failing {
            assert!(self.failing_dests.contains(&idx));
            assert!(
                dest.queue.is_empty(),
                "a failing destination holds only its probe"
            );
            let probe_in_flight = dest.in_flight.as_ref().is_some_and(|c| c.probe);
            let waiting = dest.post_failure.is_some();
            assert_eq!(
                usize::from(failing.probe.is_some()) + usize::from(probe_in_flight) + usize::from(waiting),
                1,
                "a failing destination has its probe waiting, in flight, or under a post-failure check"
            );
            if let Some(probe) = &failing.probe {
                *tally.held_home.entry(probe.home).or_default() += 1;
            }
        } else {
            assert!(!self.failing_dests.contains(&idx));
        }
        if let Some(post) = &dest.post_failure {
            assert!(dest.queue.is_empty() && dest.in_flight.is_none());
            for queued in &post.records {
                *tally.held_home.entry(queued.home).or_default() += 1;
            }
        }
        let eligible = !dest.queue.is_empty()
            && dest.in_flight.is_none()
            && dest.failing.is_none()
            && dest.post_failure.is_none();
        let key = eligible
            .then(|| {
                dest.queue
                    .front()
                    .map(|&slot| self.queued.get(slot.0).placed_at)
            })
            .flatten();
        assert_eq!(dest.candidate_key, key, "candidate key of {idx:?}");
        if let Some(key) = key {
            assert!(self.candidates.contains(&(key, idx)));
        }
        assert_eq!(dest.refused, self.refused_dests.contains(&idx));
        assert_eq!(!dest.skipped.is_empty(), self.skipped_homes.contains(&idx));
        for &seq in &dest.skipped {
            assert_eq!(
                self.strip.get(seq),
                Some(super::strip::Mark::SkippedBlocked(idx))
            );
        }
    }

    /// Every skipped record is in its destination's or its topic's skip set, and only there.
    fn check_skipped_deep(&self) {
        let mut confirm_skipped = 0;
        for (index, topic) in self.topics.iter() {
            confirm_skipped += topic.confirm_skipped.len();
            for &seq in &topic.confirm_skipped {
                assert_eq!(
                    self.strip.get(seq),
                    Some(super::strip::Mark::SkippedConfirm(TopicIdx(index)))
                );
            }
            assert_eq!(
                !topic.confirm_skipped.is_empty(),
                self.confirm_topics.contains(&TopicIdx(index))
            );
        }
        for (seq, mark) in self.strip.skipped_marks() {
            let listed = match mark {
                super::strip::Mark::SkippedBlocked(home) => self.dest(home).skipped.contains(&seq),
                super::strip::Mark::SkippedConfirm(topic) => {
                    self.topic(topic).confirm_skipped.contains(&seq)
                }
                super::strip::Mark::Done | super::strip::Mark::Held => false,
            };
            assert!(listed, "skipped {seq} is in its skip set");
        }
        let blocked_skipped: usize = self.dests.iter().map(|(_, d)| d.skipped.len()).sum();
        assert_eq!(blocked_skipped + confirm_skipped, self.strip.skipped());
    }
}

/// What [`Dispatcher::check_invariants_deep`] counts over the destinations, to compare with the totals.
#[derive(Default)]
struct DeepTally {
    /// Records held by destinations.
    held_in_dests: usize,
    /// Records of hung commits.
    hung_records: usize,
    /// Commits in flight that count against the limit (not hung).
    counted: usize,
    /// Records held, by their home destination.
    held_home: BTreeMap<DestIdx, u32>,
}

impl Actor for Dispatcher {
    type Input = DispatcherInput;
    type Output = DispatcherOutput;

    fn handle(&mut self, now: Instant, input: DispatcherInput) {
        let now = now.max(self.now);
        self.now = now;
        match input {
            DispatcherInput::Tick => {}
            DispatcherInput::Durable { next_seq } => {
                self.durable_next = self.durable_next.max(next_seq);
            }
            DispatcherInput::WalFrames { frames } => self.on_wal_frames(now, frames),
            DispatcherInput::WalReadFailed { fault } => {
                assert!(self.read.take().is_some(), "a read answer without a read");
                self.back_off(now, fault);
            }
            DispatcherInput::CheckpointStored { seq } => {
                assert_eq!(
                    self.store_in_flight.take(),
                    Some(seq),
                    "a store answer without a store"
                );
                // The planted `checkpoint-skips-inflight` stored past the checkpoint; the
                // dispatcher's own books stay honest, so only the stored value lies.
                let seq = if self
                    .plant
                    .is(crate::planted::PlantedBug::CheckpointSkipsInflight)
                {
                    self.planted_stored = self.planted_stored.max(seq);
                    seq.min(self.strip.base())
                } else {
                    seq
                };
                self.stored = self.stored.max(seq);
            }
            DispatcherInput::CheckpointStoreFailed { seq, fault } => {
                assert_eq!(
                    self.store_in_flight.take(),
                    Some(seq),
                    "a store answer without a store"
                );
                self.back_off(now, fault);
            }
            DispatcherInput::CommitDone { commit_id } => self.on_commit_done(now, commit_id),
            DispatcherInput::CommitFailed { commit_id, failure } => {
                self.on_commit_failed(now, commit_id, failure)
            }
            DispatcherInput::Member { node, alive } => self.on_member(node, alive),
            DispatcherInput::Topic { name, view } => self.on_topic(name, view),
            DispatcherInput::TopicGoneAnswer { topic, view } => {
                self.on_gone_answer(now, &topic, view)
            }
        }
        self.run_timers(now);
        self.pump(now);
        self.maybe_read(now);
        self.maybe_store_checkpoint(now);
        self.next_wake = self.compute_wake(now);
        self.check_invariants();
    }

    fn poll_output(&mut self) -> Option<DispatcherOutput> {
        self.outputs.pop_front()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.next_wake
    }

    fn has_output(&self) -> bool {
        !self.outputs.is_empty()
    }
}

/// A record that does not decode stops the reader (spec: a binary that cannot decode a record stops in
/// front of it; nothing behind it is lost).
pub(super) fn undecodable_warning(seq: Seq, error: DecodeError) -> DispatcherOutput {
    DispatcherOutput::Warn(super::api::DispatchWarning::UndecodableRecord { seq, error })
}
