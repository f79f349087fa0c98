//! A randomized model test: one dispatcher against simulated owners whose commits succeed, fail, hang,
//! answer 412, or whose nodes die and come back, while topics are deleted and recreated. Invariants
//! are checked after every step; after the faults heal, every record must be committed (or discarded
//! after the leader confirmed its incarnation deleted) and the checkpoint must reach the durable end.
//!
//! `NARAD_DISPATCH_SEEDS=N` runs N seeds (default 1,000); `NARAD_DISPATCH_SEED=S` runs seed S alone.

use super::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};

const DEFAULT_SEEDS: u64 = 1_000;
const NODES: u32 = 4;
const FAULT_PHASE: Duration = Duration::from_secs(6);
const LIVENESS_DEADLINE: Duration = Duration::from_secs(120);

#[test]
fn model_randomized_against_simulated_owners() {
    let (first, count) = match std::env::var("NARAD_DISPATCH_SEED") {
        Ok(seed) => (seed.parse().expect("NARAD_DISPATCH_SEED is a number"), 1),
        Err(_) => {
            let count = std::env::var("NARAD_DISPATCH_SEEDS")
                .ok()
                .and_then(|count| count.parse().ok())
                .unwrap_or(DEFAULT_SEEDS);
            (0, count)
        }
    };
    let mut totals = Totals::default();
    for seed in first..first + count {
        let outcome = std::panic::catch_unwind(|| World::new(seed).run());
        match outcome {
            Ok(run) => totals.add(&run),
            Err(panic) => {
                eprintln!(
                    "dispatcher model failed for seed {seed}; rerun with:\n  NARAD_DISPATCH_SEED={seed} \
                     cargo test -p narad-core dispatcher::tests::model -- --nocapture"
                );
                std::panic::resume_unwind(panic);
            }
        }
    }
    eprintln!("dispatcher model: {count} seeds, {totals:?}");
    if count >= 100 {
        // The faults must actually happen, or the test proves nothing.
        assert!(
            totals.failed > 0 && totals.hung > 0 && totals.refused > 0,
            "{totals:?}"
        );
        assert!(
            totals.rerouted > 0 && totals.discarded > 0 && totals.legacy_resends > 0,
            "{totals:?}"
        );
        assert!(totals.duplicates > 0, "{totals:?}");
    }
}

#[derive(Debug, Default)]
struct Totals {
    records: u64,
    committed: u64,
    duplicates: u64,
    discarded: u64,
    rerouted: u64,
    failed: u64,
    hung: u64,
    refused: u64,
    legacy_resends: u64,
}

impl Totals {
    fn add(&mut self, run: &Totals) {
        self.records += run.records;
        self.committed += run.committed;
        self.duplicates += run.duplicates;
        self.discarded += run.discarded;
        self.rerouted += run.rerouted;
        self.failed += run.failed;
        self.hung += run.hung;
        self.refused += run.refused;
        self.legacy_resends += run.legacy_resends;
    }
}

#[derive(Clone, Debug)]
struct TruthTopic {
    id: Option<u64>,
    owners: Vec<u32>,
}

struct WalRecord {
    topic: String,
    id: Option<u64>,
}

/// How an owner will answer a commit, drawn when it is sent.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Commit,
    Fail,
    /// Answers after the hung threshold: success, or a timeout at the deadline.
    Hang {
        success: bool,
    },
    /// A lagging owner replica: a 412 although the ids match.
    Spurious412,
    /// The owner commits, but the answer is lost (the stream breaks): a duplicate follows.
    AnswerLost,
}

#[derive(Debug)]
enum Event {
    Deliver(DispatcherInput),
    Answer { commit_id: CommitId, mode: Mode },
    Durable,
    ReadAnswer(ReadWal),
    LeaderAnswer(String),
}

struct World {
    seed: u64,
    rng: ChaCha8Rng,
    now: Instant,
    d: Dispatcher,
    wal: Vec<WalRecord>,
    /// The WAL's encoded records, by sequence number (what reads return).
    wal_bytes: Vec<Vec<u8>>,
    durable: usize,
    truth: BTreeMap<String, TruthTopic>,
    /// The local replica as fed to the dispatcher (it lags the truth).
    fed: BTreeMap<String, TopicPlacement>,
    deleted: BTreeMap<String, BTreeSet<u64>>,
    confirmed_gone: BTreeSet<u64>,
    alive: Vec<bool>,
    legacy_node: Option<u32>,
    next_id: u64,
    faults: bool,
    events: BTreeMap<(Instant, u64), Event>,
    event_counter: u64,
    last_ordered: Instant,
    in_flight: BTreeMap<(String, u32), CommitId>,
    in_flight_seqs: BTreeSet<u64>,
    commits: BTreeMap<CommitId, SendCommit>,
    committed: Vec<u32>,
    verified_below: usize,
    totals: Totals,
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let legacy_node = rng.random_bool(0.4).then_some(3);
        let mut world = World {
            seed,
            rng,
            now: Instant::ZERO,
            d: Dispatcher::new(DispatcherConfig {
                node: LOCAL,
                checkpoint: Seq(0),
                durable_next: Seq(0),
                plant: crate::planted::Plant::NONE,
            }),
            wal: Vec::new(),
            wal_bytes: Vec::new(),
            durable: 0,
            truth: BTreeMap::new(),
            fed: BTreeMap::new(),
            deleted: BTreeMap::new(),
            confirmed_gone: BTreeSet::new(),
            alive: vec![true; NODES as usize],
            legacy_node,
            next_id: 1,
            faults: true,
            events: BTreeMap::new(),
            event_counter: 0,
            last_ordered: Instant::ZERO,
            in_flight: BTreeMap::new(),
            in_flight_seqs: BTreeSet::new(),
            commits: BTreeMap::new(),
            committed: Vec::new(),
            verified_below: 0,
            totals: Totals::default(),
        };
        for node in 1..NODES {
            world.input(DispatcherInput::Member {
                node: NodeId(node),
                alive: true,
            });
        }
        for name in ["a", "b"] {
            world.create(name, true);
        }
        // A topic from before incarnation ids: format-1 records, committed by name.
        world.truth.insert(
            "old".into(),
            TruthTopic {
                id: None,
                owners: vec![0, 1],
            },
        );
        world.feed_topic("old", Duration::ZERO, true);
        world
    }

    fn run(mut self) -> Totals {
        let heal_at = Instant::ZERO + FAULT_PHASE;
        let deadline = heal_at + LIVENESS_DEADLINE;
        while self.now < deadline {
            if self.faults && self.now >= heal_at {
                self.heal();
            }
            if !self.faults && self.settled() {
                break;
            }
            self.step(heal_at);
        }
        assert!(
            self.settled(),
            "seed {}: not settled by the liveness deadline; wal {} in flight {:?}\n{}",
            self.seed,
            self.wal.len(),
            self.in_flight,
            self.d.debug_summary()
        );
        self.check_end();
        self.totals
    }

    fn settled(&self) -> bool {
        self.d.checkpoint().0 as usize == self.wal.len()
            && self.in_flight.is_empty()
            && self.d.stored_checkpoint() == self.d.checkpoint()
    }

    // ----- the clock -----

    fn step(&mut self, heal_at: Instant) {
        let wake = self.d.poll_timeout().expect("always a wake-up");
        let event = self.events.keys().next().map(|(at, _)| *at);
        let action = if self.faults {
            Some(self.now + Duration::from_micros(self.rng.random_range(0..20_000)))
        } else {
            None
        };
        let mut next = wake;
        if let Some(at) = event {
            next = next.min(at);
        }
        if let Some(at) = action {
            next = next.min(at);
        }
        if self.faults {
            next = next.min(heal_at.max(self.now));
        }
        self.now = next.max(self.now);
        if let Some(&key) = self.events.keys().next() {
            if key.0 <= self.now {
                let event = self.events.remove(&key).expect("exists");
                self.on_event(event);
                return;
            }
        }
        if action.is_some_and(|at| at <= self.now) {
            self.random_action();
            return;
        }
        self.input(DispatcherInput::Tick);
    }

    fn schedule(&mut self, after: Duration, event: Event) {
        self.event_counter += 1;
        self.events
            .insert((self.now + after, self.event_counter), event);
    }

    /// Replica and membership changes reach the dispatcher in the order they happened (a log).
    fn schedule_in_order(&mut self, lag: Duration, input: DispatcherInput) {
        let at = (self.now + lag).max(self.last_ordered);
        self.last_ordered = at;
        self.event_counter += 1;
        self.events
            .insert((at, self.event_counter), Event::Deliver(input));
    }

    fn delay_ms(&mut self, max_millis: u64) -> Duration {
        Duration::from_micros(self.rng.random_range(0..=max_millis * 1000))
    }

    // ----- the world acting -----

    fn random_action(&mut self) {
        let roll = self.rng.random_range(0..100);
        match roll {
            0..=54 => self.accept(),
            55..=57 => {
                let node = self.rng.random_range(1..NODES);
                self.set_alive(node, false);
            }
            58..=62 => {
                let node = self.rng.random_range(1..NODES);
                self.set_alive(node, true);
            }
            63 => {
                let name = if self.rng.random_bool(0.5) { "a" } else { "b" };
                self.delete(name);
            }
            64..=65 => {
                let name = if self.rng.random_bool(0.5) { "a" } else { "b" };
                if !self.truth.contains_key(name) {
                    self.create(name, false);
                }
            }
            66 => {
                let name = if self.rng.random_bool(0.5) { "a" } else { "b" };
                if self.truth.contains_key(name) {
                    self.delete(name);
                    self.create(name, false);
                }
            }
            _ => {}
        }
    }

    /// The node accepts a produce (or a batch) against its local replica, as the HTTP handler would.
    fn accept(&mut self) {
        let names: Vec<String> = self.fed.keys().cloned().collect();
        let name = names[self.rng.random_range(0..names.len())].clone();
        let view = self.fed[&name].clone();
        let count = if self.rng.random_bool(0.3) {
            self.rng.random_range(2..8)
        } else {
            1
        };
        for _ in 0..count {
            let partition = self.rng.random_range(0..view.owners.len() as u32);
            let mut record = rec(&name, view.topic_id.map(|id| id.0), partition, None);
            record.payload = vec![0; self.rng.random_range(1..64)];
            self.wal.push(WalRecord {
                topic: name.clone(),
                id: view.topic_id.map(|id| id.0),
            });
            self.wal_bytes.push(record.to_bytes());
            self.committed.push(0);
            self.totals.records += 1;
        }
        let lag = self.delay_ms(3);
        self.schedule(lag, Event::Durable);
    }

    fn create(&mut self, name: &str, initial: bool) {
        let partitions = self.rng.random_range(1..=4);
        let owners = (0..partitions)
            .map(|_| self.rng.random_range(0..NODES))
            .collect();
        let id = self.next_id;
        self.next_id += 1;
        self.truth.insert(
            name.to_string(),
            TruthTopic {
                id: Some(id),
                owners,
            },
        );
        let lag = if initial {
            Duration::ZERO
        } else {
            self.delay_ms(50)
        };
        // A new topic is sometimes seen before its partitions are assigned.
        let assigned = initial || self.rng.random_bool(0.7);
        self.feed_topic(name, lag, assigned);
        if !assigned {
            let later = lag + Duration::from_millis(self.rng.random_range(5..40));
            self.feed_topic(name, later, true);
        }
        if initial {
            self.drain_events_now();
        }
    }

    fn delete(&mut self, name: &str) {
        let Some(topic) = self.truth.remove(name) else {
            return;
        };
        if let Some(id) = topic.id {
            self.deleted.entry(name.to_string()).or_default().insert(id);
        }
        let lag = self.delay_ms(50);
        self.schedule_in_order(
            lag,
            DispatcherInput::Topic {
                name: name.to_string(),
                view: None,
            },
        );
    }

    fn feed_topic(&mut self, name: &str, lag: Duration, assigned: bool) {
        let topic = self.truth[name].clone();
        let view = TopicPlacement {
            topic_id: topic.id.map(TopicId),
            owners: topic
                .owners
                .iter()
                .map(|&n| assigned.then_some(NodeId(n)))
                .collect(),
        };
        self.schedule_in_order(
            lag,
            DispatcherInput::Topic {
                name: name.to_string(),
                view: Some(view),
            },
        );
    }

    fn drain_events_now(&mut self) {
        while let Some(&key) = self.events.keys().next() {
            if key.0 > self.now {
                break;
            }
            let event = self.events.remove(&key).expect("exists");
            self.on_event(event);
        }
    }

    fn set_alive(&mut self, node: u32, alive: bool) {
        if self.alive[node as usize] == alive {
            return;
        }
        self.alive[node as usize] = alive;
        let lag = self.delay_ms(200);
        self.schedule_in_order(
            lag,
            DispatcherInput::Member {
                node: NodeId(node),
                alive,
            },
        );
    }

    fn heal(&mut self) {
        self.faults = false;
        for node in 1..NODES {
            self.set_alive(node, true);
        }
        let names: Vec<String> = self.truth.keys().cloned().collect();
        for name in names {
            self.feed_topic(&name, Duration::ZERO, true);
        }
    }

    // ----- events -----

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Deliver(input) => {
                if let DispatcherInput::Topic { name, view } = &input {
                    match view {
                        Some(view) => self.fed.insert(name.clone(), view.clone()),
                        None => self.fed.remove(name),
                    };
                }
                self.input(input);
            }
            Event::Durable => {
                self.durable = self.wal.len();
                self.input(DispatcherInput::Durable {
                    next_seq: Seq(self.durable as u64),
                });
            }
            Event::ReadAnswer(read) => {
                if self.faults && self.rng.random_bool(0.01) {
                    self.input(DispatcherInput::WalReadFailed {
                        fault: crate::IoFault::Eio,
                    });
                    return;
                }
                let frames = super::serve(&self.wal_bytes, read, self.durable);
                self.input(DispatcherInput::WalFrames { frames });
            }
            Event::LeaderAnswer(topic) => {
                let view = if self.faults && self.rng.random_bool(0.15) {
                    LeaderView::Unconfirmed
                } else {
                    match self.truth.get(&topic) {
                        None => LeaderView::Absent,
                        Some(truth) => LeaderView::Present {
                            topic_id: truth.id.map(TopicId),
                        },
                    }
                };
                // What this answer confirms: every deleted incarnation of the name but the live one.
                if view != LeaderView::Unconfirmed {
                    let live = self.truth.get(&topic).and_then(|truth| truth.id);
                    for &id in self.deleted.get(&topic).into_iter().flatten() {
                        if Some(id) != live {
                            self.confirmed_gone.insert(id);
                        }
                    }
                }
                self.input(DispatcherInput::TopicGoneAnswer { topic, view });
            }
            Event::Answer { commit_id, mode } => self.answer(commit_id, mode),
        }
    }

    fn answer(&mut self, commit_id: CommitId, mode: Mode) {
        let commit = self.commits.remove(&commit_id).expect("answered once");
        self.in_flight
            .remove(&(commit.topic.to_string(), commit.partition.0));
        for record in commit.records.iter() {
            self.in_flight_seqs.remove(&record.seq().0);
        }
        let owner = match commit.owner {
            CommitOwner::Local => 0,
            CommitOwner::Remote(node) => node.0,
        };
        let truth = self.truth.get(&*commit.topic).cloned();
        let legacy = self.legacy_node == Some(owner);
        let failure = if legacy && commit.with_ids && commit.topic_id.is_some() {
            Some(CommitFailure::RefusedTrailingIds)
        } else if !self.alive[owner as usize] {
            Some(match mode {
                Mode::Hang { .. } => CommitFailure::Timeout,
                _ => CommitFailure::Unavailable("unreachable".to_string()),
            })
        } else {
            match mode {
                Mode::Fail => Some(CommitFailure::Unavailable("503".to_string())),
                Mode::Hang { success: false } => Some(CommitFailure::Timeout),
                Mode::Spurious412 => Some(Harness::mismatch(&commit)),
                Mode::Commit | Mode::Hang { success: true } | Mode::AnswerLost => match &truth {
                    None => Some(CommitFailure::NotOwner),
                    // The owner checks the incarnation under its produce lock (ids sent or not: a
                    // legacy owner commits by name, which the model counts only when it matches).
                    Some(truth)
                        if commit.topic_id.is_some()
                            && commit.topic_id != truth.id.map(TopicId) =>
                    {
                        Some(if commit.with_ids {
                            CommitFailure::IncarnationMismatch {
                                record_topic_id: commit.topic_id.unwrap_or(TopicId(0)),
                                live_topic_id: truth.id.map(TopicId),
                            }
                        } else {
                            CommitFailure::NotOwner
                        })
                    }
                    Some(truth) if commit.partition.0 as usize >= truth.owners.len() => {
                        Some(CommitFailure::NotOwner)
                    }
                    Some(_) => None,
                },
            }
        };
        match failure {
            None => {
                for record in commit.records.iter() {
                    let seq = record.seq().0 as usize;
                    // No record of a stale incarnation is ever committed into a recreated topic.
                    assert_eq!(
                        self.wal[seq].id.map(TopicId),
                        truth.as_ref().and_then(|t| t.id.map(TopicId)),
                        "seed {}: seq {seq} committed into another incarnation",
                        self.seed
                    );
                    if self.committed[seq] > 0 {
                        self.totals.duplicates += 1;
                    } else {
                        self.totals.committed += 1;
                    }
                    self.committed[seq] += 1;
                }
                drop(commit);
                if matches!(mode, Mode::AnswerLost) {
                    self.totals.failed += 1;
                    let failure = CommitFailure::Unavailable("unreachable".to_string());
                    self.input(DispatcherInput::CommitFailed { commit_id, failure });
                } else {
                    self.input(DispatcherInput::CommitDone { commit_id });
                }
            }
            Some(failure) => {
                match failure {
                    CommitFailure::IncarnationMismatch { .. } => self.totals.refused += 1,
                    CommitFailure::RefusedTrailingIds => self.totals.legacy_resends += 1,
                    CommitFailure::Timeout
                    | CommitFailure::NotOwner
                    | CommitFailure::Unavailable(_)
                    | CommitFailure::Failed(_) => self.totals.failed += 1,
                }
                drop(commit);
                self.input(DispatcherInput::CommitFailed { commit_id, failure });
            }
        }
    }

    // ----- the dispatcher -----

    fn input(&mut self, input: DispatcherInput) {
        self.d.handle(self.now, input);
        self.check();
        while let Some(output) = self.d.poll_output() {
            self.on_output(output);
        }
    }

    fn on_output(&mut self, output: DispatcherOutput) {
        match output {
            DispatcherOutput::ReadWal(read) => {
                let lag = self.delay_ms(2);
                self.schedule(lag, Event::ReadAnswer(read));
            }
            DispatcherOutput::SendCommit(commit) => self.on_send(commit),
            DispatcherOutput::StoreCheckpoint { seq } => {
                self.verify_done_below(seq.0 as usize);
                let lag = self.delay_ms(5);
                let input = if self.faults && self.rng.random_bool(0.01) {
                    DispatcherInput::CheckpointStoreFailed {
                        seq,
                        fault: crate::IoFault::NoSpace,
                    }
                } else {
                    DispatcherInput::CheckpointStored { seq }
                };
                self.schedule(lag, Event::Deliver(input));
            }
            DispatcherOutput::ConfirmTopicGone { topic } => {
                let lag = self.delay_ms(20);
                self.schedule(lag, Event::LeaderAnswer(topic));
            }
            DispatcherOutput::Warn(warning) => self.on_warning(warning),
        }
    }

    fn on_send(&mut self, commit: SendCommit) {
        let key = (commit.topic.to_string(), commit.partition.0);
        assert!(
            self.in_flight
                .insert(key.clone(), commit.commit_id)
                .is_none(),
            "seed {}: two commits in flight for {key:?}",
            self.seed
        );
        let fed_id = self.fed.get(&*commit.topic).and_then(|view| view.topic_id);
        for record in commit.records.iter() {
            assert!(
                self.in_flight_seqs.insert(record.seq().0),
                "seq {} sent twice at once",
                record.seq()
            );
            assert_eq!(record.topic(), &*commit.topic);
            assert_eq!(
                record.topic_id(),
                commit.topic_id,
                "a commit never mixes incarnations"
            );
            if let Some(id) = record.topic_id() {
                // Never sent unless the local replica holds its incarnation.
                assert_eq!(
                    Some(id),
                    fed_id,
                    "seed {}: stale incarnation sent: {commit:?}",
                    self.seed
                );
            }
        }
        let mode = if !self.faults {
            Mode::Commit
        } else {
            match self.rng.random_range(0..100) {
                0..=9 => Mode::Fail,
                10..=14 => Mode::Hang {
                    success: self.rng.random_bool(0.5),
                },
                15..=17 => Mode::Spurious412,
                18..=19 => Mode::AnswerLost,
                _ => Mode::Commit,
            }
        };
        let after = match mode {
            Mode::Hang { success: true } => {
                Duration::from_millis(self.rng.random_range(1_000..4_000))
            }
            Mode::Hang { success: false } => commit.deadline.saturating_duration_since(self.now),
            Mode::Commit | Mode::Fail | Mode::Spurious412 | Mode::AnswerLost => self.delay_ms(30),
        };
        if matches!(mode, Mode::Hang { .. }) {
            self.totals.hung += 1;
        }
        self.schedule(
            after,
            Event::Answer {
                commit_id: commit.commit_id,
                mode,
            },
        );
        self.commits.insert(commit.commit_id, commit);
    }

    fn on_warning(&mut self, warning: DispatchWarning) {
        let discarded = match &warning {
            DispatchWarning::DiscardedForDeletedTopic { seq, topic_id, .. }
            | DispatchWarning::DiscardedAfterFailedCommit { seq, topic_id, .. } => {
                Some((*seq, *topic_id))
            }
            DispatchWarning::DiscardedStaleIncarnation { seq, topic_id, .. } => {
                Some((*seq, Some(*topic_id)))
            }
            DispatchWarning::DiscardedQueueForDeletedTopic { records, .. } => {
                self.totals.discarded += *records as u64;
                None
            }
            DispatchWarning::IncarnationRefused { .. } => None,
            DispatchWarning::UndecodableRecord { .. } => panic!("seed {}: {warning:?}", self.seed),
        };
        if let Some((seq, topic_id)) = discarded {
            self.totals.discarded += 1;
            let record = &self.wal[seq.0 as usize];
            assert_eq!(record.id.map(TopicId), topic_id);
            let id = record.id.expect("the model deletes only topics with ids");
            assert!(
                self.confirmed_gone.contains(&id),
                "seed {}: seq {seq} of incarnation {id} discarded before the leader confirmed it gone",
                self.seed
            );
        }
    }

    /// Every record below `end` is committed, or its incarnation was confirmed deleted.
    fn verify_done_below(&mut self, end: usize) {
        while self.verified_below < end {
            let seq = self.verified_below;
            let record = &self.wal[seq];
            let gone = record
                .id
                .is_some_and(|id| self.confirmed_gone.contains(&id));
            assert!(
                self.committed[seq] > 0 || gone,
                "seed {}: checkpoint {end} passes seq {seq} ({} {:?}), neither committed nor confirmed gone",
                self.seed,
                record.topic,
                record.id
            );
            self.verified_below += 1;
        }
    }

    fn check(&mut self) {
        self.d.check_invariants_deep();
        assert!(self.d.held_counted_records() <= self.d.held_limit_records());
        let checkpoint = self.d.checkpoint().0 as usize;
        self.verify_done_below(checkpoint);
        let wake = self.d.poll_timeout().expect("always a wake-up");
        assert!(
            wake > self.now,
            "seed {}: wake-up {wake} not after {}",
            self.seed,
            self.now
        );
    }

    fn check_end(&mut self) {
        self.verify_done_below(self.wal.len());
        assert_eq!(self.d.backlog_records(), 0);
        assert_eq!((self.d.held_records(), self.d.skipped_records()), (0, 0));
        assert_eq!(
            self.d.backlog_bytes_read(),
            0,
            "every byte read was accounted done"
        );
        let stats = self.d.stats();
        self.totals.rerouted += stats.rerouted_records;
    }
}
