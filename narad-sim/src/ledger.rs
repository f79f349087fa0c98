//! The ledger checker: lives outside the node, records every produce attempt and its outcome, and judges
//! what the node finally serves.
//!
//! Every record carries a unique id in its payload ([`crate::payload`]). The ledger knows, per id, the
//! topic name and incarnation it was produced to, the partition it should land on (explicit or keyed;
//! keyless records may land anywhere), and the outcome of its produce call. [`Ledger::check`] takes two
//! observations — every partition read at the liveness deadline, and read again after the final crash
//! and restart — and classifies:
//!
//! * **lost** — 202'd, its incarnation not deleted, and absent from the final read (including a record
//!   that was visible at the deadline and vanished after the crash);
//! * **unseen** — 202'd, not deleted, present in the final read but absent at the liveness deadline;
//! * **phantom** — served but never produced as such: undecodable or damaged payload, unknown id, or an
//!   id whose produce was refused (4xx, which promises nothing was stored);
//! * **misplaced** — a known id served under another topic name or another incarnation, or under
//!   another key than it was produced with (checked when the ledger holds its key,
//!   [`Ledger::add_record_with_key`], and the read reports keys, [`Served::with_key`]);
//! * **duplicates** — extra copies in the final read (allowed; a histogram of copies per record);
//! * **reroutes** — copies on another partition of the right incarnation than the one the record was
//!   aimed at (allowed; counted).
//!
//! Records whose incarnation was deleted, records destroyed by an injected bit rot (the harness
//! scans the struck file), and records the topics' retention was entitled to remove by the end of an
//! observation ([`retention`]) are excused from lost/unseen; they may still be phantoms or misplaced.
//!
//! The black-box tests on real `narad` processes (`narad-tests`) judge their replays with this same
//! ledger: they record keys and read them back, and pass their one read as both observations.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use narad_core::{Offset, PartitionId, TopicId};

use crate::payload::{self, PayloadError};

pub mod offsets;
mod retention;

use retention::RetainedView;
pub use retention::{RetentionRule, RECORD_OVERHEAD_MAX};

/// Partition of a keyed record, as Narad /v1 routes it: FNV-1a 32-bit of the key, modulo partitions.
pub fn key_partition(key: &[u8], partitions: u32) -> PartitionId {
    assert!(partitions > 0, "a topic has at least one partition");
    let mut hash: u32 = 0x811c_9dc5;
    for &byte in key {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    PartitionId(hash % partitions)
}

/// Identifies one produce call (single or batch) in the ledger.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AttemptId(pub u32);

/// How a produce call ended, as the client saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Still running (never completed before the check: treated as ambiguous).
    Pending,
    /// `202 Accepted`: every record of the call must become visible.
    Accepted,
    /// A 4xx refusal: nothing of the call may become visible.
    Refused,
    /// A 5xx answer or a reset connection: ambiguous.
    Failed,
    /// The client gave up waiting: ambiguous.
    TimedOut,
}

impl Outcome {
    /// The name used in traces and reports.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Pending => "pending",
            Outcome::Accepted => "202",
            Outcome::Refused => "4xx",
            Outcome::Failed => "5xx",
            Outcome::TimedOut => "timeout",
        }
    }
}

/// What the ledger knows about one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordEntry {
    /// The produce call it was part of.
    pub attempt: AttemptId,
    /// Topic name it was produced to (shared by every record of the topic).
    pub topic: Arc<str>,
    /// The incarnation current when it was produced.
    pub topic_id: TopicId,
    /// Where it should land: `Some` for explicit and keyed produces, `None` for keyless.
    pub aimed_at: Option<PartitionId>,
}

/// One record as a partition read served it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    /// Topic name that was read (shared by every record of a read).
    pub topic: Arc<str>,
    /// The incarnation the node served it from.
    pub topic_id: TopicId,
    /// Partition read.
    pub partition: PartitionId,
    /// Its offset there.
    pub offset: Offset,
    /// Payload bytes.
    payload: Vec<u8>,
    /// The record id the payload carries, or why it carries none: [`payload::decode`] of `payload`,
    /// done once when read (the checker judges each observation more than once).
    decoded: Result<u64, PayloadError>,
    /// The key the read served with it (`Some(None)`: none), when the reader reports keys
    /// ([`Served::with_key`]); `None` when it does not, and then no key is checked.
    key: Option<Option<Box<[u8]>>>,
    /// Its commit time, when the read reported it (retention's size rule orders by it).
    committed_at_ms: Option<u64>,
}

impl Served {
    /// A record served at `offset` of `partition` of `topic` (incarnation `topic_id`).
    pub fn new(
        topic: Arc<str>,
        topic_id: TopicId,
        partition: PartitionId,
        offset: Offset,
        payload: Vec<u8>,
    ) -> Served {
        let decoded = payload::decode(&payload);
        Served {
            topic,
            topic_id,
            partition,
            offset,
            payload,
            decoded,
            key: None,
            committed_at_ms: None,
        }
    }

    /// The same copy, with the commit time the read served with it (Unix ms on the node's clock).
    pub fn with_committed_at(mut self, committed_at_ms: Option<u64>) -> Served {
        self.committed_at_ms = committed_at_ms;
        self
    }

    /// The same copy, with the key the read served with it (`None`: keyless), to be checked against
    /// the key the record was produced with.
    pub fn with_key(mut self, key: Option<&[u8]>) -> Served {
        self.key = Some(key.map(Box::from));
        self
    }

    /// Payload bytes.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// The record id the payload carries, or why it carries none.
    pub fn record_id(&self) -> Result<u64, PayloadError> {
        self.decoded
    }
}

/// Everything served by one read of every partition of every topic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// The records, in read order.
    pub served: Vec<Served>,
    /// When the read ended, in nanoseconds of the run (retention's age rule counts to it).
    pub at_ns: u64,
}

/// A served record that should not exist where it was found.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Anomaly {
    /// Topic name read.
    pub topic: String,
    /// Incarnation served.
    pub topic_id: TopicId,
    /// Partition read.
    pub partition: PartitionId,
    /// Offset served.
    pub offset: Offset,
    /// Why it is wrong.
    pub reason: String,
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}#{}/{}@{}: {}",
            self.topic, self.topic_id, self.partition, self.offset, self.reason
        )
    }
}

/// The verdict of one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Records whose call got a 202.
    pub accepted: u64,
    /// Records whose call ended ambiguously (5xx, reset, timeout, pending).
    pub ambiguous: u64,
    /// Of those, how many the final read serves (correctly placed).
    pub ambiguous_served: u64,
    /// Records whose call was refused (4xx).
    pub refused: u64,
    /// Lost record ids (see the module documentation).
    pub lost: Vec<u64>,
    /// The subset of `lost` that was visible at the liveness deadline, then vanished.
    pub vanished: Vec<u64>,
    /// Unseen record ids.
    pub unseen: Vec<u64>,
    /// Phantoms.
    pub phantoms: Vec<Anomaly>,
    /// Misplaced copies.
    pub misplaced: Vec<Anomaly>,
    /// Copies per record → number of records with that many copies (only counts of 2 or more).
    pub duplicates: BTreeMap<u32, u64>,
    /// Copies found on a partition other than the one they were aimed at.
    pub reroutes: u64,
    /// Ids of the records served two or more times in the final read.
    pub duplicated: Vec<u64>,
    /// Ids of the records with a copy on a partition other than the one they were aimed at.
    pub rerouted: Vec<u64>,
    /// 202'd records excused because their incarnation was deleted.
    pub excused_deleted: u64,
    /// 202'd records excused because an injected bit rot destroyed them.
    pub excused_rot: u64,
    /// 202'd records missing at the end that retention was entitled to remove.
    pub excused_retention: u64,
    /// What the queue-mode consumers saw, when the scenario ran any.
    pub consumed: Option<ConsumeReport>,
    /// Offsets served with two different records (see `offsets`).
    pub offset_conflicts: Vec<String>,
}

/// The consumers' verdict (see `runner::consumer`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumeReport {
    /// Deliveries, redeliveries included.
    pub delivered: u64,
    /// Deliveries of a record delivered before.
    pub redelivered: u64,
    /// Records acked.
    pub acked: u64,
    /// Ids of records the final read serves that no consumer acked (never handed to one, or handed
    /// only under leases that ended unanswered and never came back).
    pub unacked: Vec<u64>,
    /// Deliveries of no record produced to their topic.
    pub foreign: Vec<String>,
    /// Deliveries of a record acked before with no fault in between (see `runner::consumer`).
    pub acked_redelivered: Vec<String>,
}

impl Report {
    /// Whether the run broke the promise.
    pub fn failed(&self) -> bool {
        !self.lost.is_empty()
            || !self.unseen.is_empty()
            || !self.phantoms.is_empty()
            || !self.misplaced.is_empty()
            || !self.offset_conflicts.is_empty()
            || self.consumed.as_ref().is_some_and(|consumed| {
                !consumed.unacked.is_empty()
                    || !consumed.foreign.is_empty()
                    || !consumed.acked_redelivered.is_empty()
            })
    }

    /// The verdict's counts as one `key=value` line: lost, unseen, phantoms, misplaced, duplicate
    /// copies and reroutes.
    pub fn verdict_line(&self) -> String {
        let mut line = format!(
            "lost={} unseen={} phantoms={} misplaced={} duplicates={} reroutes={}",
            self.lost.len(),
            self.unseen.len(),
            self.phantoms.len(),
            self.misplaced.len(),
            self.duplicate_copies(),
            self.reroutes
        );
        if !self.offset_conflicts.is_empty() {
            line.push_str(&format!(
                " offset_conflicts={}",
                self.offset_conflicts.len()
            ));
        }
        if let Some(consumed) = &self.consumed {
            line.push_str(&format!(
                " unacked={} foreign={} delivered={} redelivered={} acked={}",
                consumed.unacked.len(),
                consumed.foreign.len(),
                consumed.delivered,
                consumed.redelivered,
                consumed.acked
            ));
        }
        line
    }

    /// Extra copies over all records (a record served 3 times counts 2).
    pub fn duplicate_copies(&self) -> u64 {
        self.duplicates
            .iter()
            .map(|(&copies, &records)| u64::from(copies - 1) * records)
            .sum()
    }

    /// The histogram as `copies:records` pairs, e.g. `2:14 3:1`.
    pub fn duplicates_histogram(&self) -> String {
        let parts: Vec<String> = self
            .duplicates
            .iter()
            .map(|(copies, records)| format!("{copies}:{records}"))
            .collect();
        parts.join(" ")
    }
}

/// The record of every produce attempt of a run.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    records: Vec<RecordEntry>,
    /// Every topic name records were produced to, shared by their entries.
    names: Vec<Arc<str>>,
    attempts: Vec<Outcome>,
    deleted: BTreeSet<TopicId>,
    rotted: BTreeSet<u64>,
    /// The key each record registered by [`Ledger::add_record_with_key`] was produced with.
    keys: BTreeMap<u64, Option<Box<[u8]>>>,
    /// Where and when each call noted by [`Ledger::set_via`] was sent, by attempt.
    via: BTreeMap<AttemptId, Via>,
    /// Nodes kept down through the liveness deadline, and the instant before which a call may have
    /// left records only they hold ([`Ledger::excuse_at_deadline`]).
    down_at_deadline: Option<(BTreeSet<u32>, u64)>,
    /// Topics none of whose partitions has an owner up at the liveness deadline: their records have
    /// no live sibling to reroute to.
    stranded_at_deadline: BTreeSet<Arc<str>>,
    /// The topics' retention ([`Ledger::set_retention`]).
    retention: RetentionRule,
    /// The nodes' clock at the run's instant 0 ([`Ledger::set_clock_base`]).
    clock_base_ms: Option<u64>,
}

/// Where and when a produce call was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Via {
    /// The node (index) that took the call.
    pub node: u32,
    /// When it was sent, in nanoseconds of the run.
    pub at_ns: u64,
}

/// What happened to the records of one group (a node, a fault kind), for a report's breakdowns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Records whose call got a 202.
    pub accepted: u64,
    /// Of those, lost.
    pub lost: u64,
    /// Of those, unseen at the liveness deadline.
    pub unseen: u64,
    /// Records served more than once.
    pub duplicated: u64,
    /// Records with a copy off the partition they were aimed at.
    pub rerouted: u64,
}

impl Tally {
    /// Adds `other` into this one.
    pub fn add(&mut self, other: &Tally) {
        self.accepted += other.accepted;
        self.lost += other.lost;
        self.unseen += other.unseen;
        self.duplicated += other.duplicated;
        self.rerouted += other.rerouted;
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "accepted={} lost={} unseen={} duplicated={} rerouted={}",
            self.accepted, self.lost, self.unseen, self.duplicated, self.rerouted
        )
    }
}

/// A report broken down by the node that took each call and by the fault kinds in force around it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Breakdown {
    /// By node index.
    pub by_node: BTreeMap<u32, Tally>,
    /// By fault kind (a record counts under every kind it overlapped; `none` when it overlapped none).
    pub by_fault: BTreeMap<&'static str, Tally>,
}

impl Breakdown {
    /// Adds `other` into this one.
    pub fn add(&mut self, other: &Breakdown) {
        for (node, tally) in &other.by_node {
            self.by_node.entry(*node).or_default().add(tally);
        }
        for (kind, tally) in &other.by_fault {
            self.by_fault.entry(kind).or_default().add(tally);
        }
    }
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Ledger::default()
    }

    /// Nodes `nodes` stay down through the liveness deadline: a record taken by one of them, or sent
    /// before `sent_before_ns` (it may have been committed on one of their partitions), need not be
    /// visible at the deadline (it must be after the final restart). Every other record must: a
    /// dead owner's records reroute to live siblings. Calls without [`Ledger::set_via`] count as
    /// sent at 0.
    pub fn excuse_at_deadline(&mut self, nodes: BTreeSet<u32>, sent_before_ns: u64) {
        self.down_at_deadline = Some((nodes, sent_before_ns));
    }

    /// Every partition of `topic` is owned by a node down through the liveness deadline: its
    /// records need not be visible there (there is no live sibling to reroute them to).
    pub fn excuse_topic_at_deadline(&mut self, topic: &str) {
        self.stranded_at_deadline.insert(Arc::from(topic));
    }

    /// Whether record `id` may be missing at the liveness deadline ([`Ledger::excuse_at_deadline`]).
    fn excused_at_deadline(&self, id: u64) -> bool {
        let Some((nodes, before_ns)) = &self.down_at_deadline else {
            return false;
        };
        let entry = &self.records[id as usize];
        if self.stranded_at_deadline.contains(&entry.topic) {
            return true;
        }
        match self.via.get(&entry.attempt) {
            Some(via) => nodes.contains(&via.node) || via.at_ns < *before_ns,
            None => true,
        }
    }

    /// Every call noted by [`Ledger::set_via`], in call order: where and when it was sent, how it
    /// ended and how many records it carried (for a run's timeline).
    pub fn calls(&self) -> Vec<(AttemptId, Via, Outcome, u64)> {
        let mut records: BTreeMap<AttemptId, u64> = BTreeMap::new();
        for entry in &self.records {
            *records.entry(entry.attempt).or_default() += 1;
        }
        self.via
            .iter()
            .map(|(&attempt, &via)| {
                let outcome = self.attempts[attempt.0 as usize];
                (
                    attempt,
                    via,
                    outcome,
                    records.get(&attempt).copied().unwrap_or(0),
                )
            })
            .collect()
    }

    /// Notes that call `attempt` was sent through node `node` at `at_ns`, for the report's
    /// breakdowns ([`Ledger::breakdown`]).
    pub fn set_via(&mut self, attempt: AttemptId, node: u32, at_ns: u64) {
        self.via.insert(attempt, Via { node, at_ns });
    }

    /// Breaks `report` (this ledger's) down by node and by the fault kinds `faults_around` names
    /// for a call sent at a given instant. Calls without [`Ledger::set_via`] are left out.
    pub fn breakdown(
        &self,
        report: &Report,
        faults_around: impl Fn(u64) -> Vec<&'static str>,
    ) -> Breakdown {
        let mut breakdown = Breakdown::default();
        let mut tallies: BTreeMap<u64, Tally> = BTreeMap::new();
        for (id, entry) in self.records.iter().enumerate() {
            if self.attempts[entry.attempt.0 as usize] == Outcome::Accepted {
                tallies.entry(id as u64).or_default().accepted = 1;
            }
        }
        for &id in &report.lost {
            tallies.entry(id).or_default().lost = 1;
        }
        for &id in &report.unseen {
            tallies.entry(id).or_default().unseen = 1;
        }
        for &id in &report.duplicated {
            tallies.entry(id).or_default().duplicated = 1;
        }
        for &id in &report.rerouted {
            tallies.entry(id).or_default().rerouted = 1;
        }
        let mut kinds_at: BTreeMap<u64, Vec<&'static str>> = BTreeMap::new();
        for (id, tally) in tallies {
            let Some(entry) = self.record(id) else {
                continue;
            };
            let Some(via) = self.via.get(&entry.attempt) else {
                continue;
            };
            breakdown.by_node.entry(via.node).or_default().add(&tally);
            let kinds = kinds_at
                .entry(via.at_ns)
                .or_insert_with(|| faults_around(via.at_ns));
            if kinds.is_empty() {
                breakdown.by_fault.entry("none").or_default().add(&tally);
            }
            for kind in kinds.iter() {
                breakdown.by_fault.entry(kind).or_default().add(&tally);
            }
        }
        breakdown
    }

    /// Opens a produce call; its outcome is [`Outcome::Pending`] until [`Ledger::complete`].
    pub fn begin(&mut self) -> AttemptId {
        let id = AttemptId(u32::try_from(self.attempts.len()).expect("fewer than 2^32 attempts"));
        self.attempts.push(Outcome::Pending);
        id
    }

    /// Registers one record of a call and returns its id (dense from 0), to encode in its payload.
    pub fn add_record(
        &mut self,
        attempt: AttemptId,
        topic: &str,
        topic_id: TopicId,
        aimed_at: Option<PartitionId>,
    ) -> u64 {
        assert!(
            (attempt.0 as usize) < self.attempts.len(),
            "unknown attempt"
        );
        let topic = match self.names.iter().find(|name| &***name == topic) {
            Some(name) => name.clone(),
            None => {
                let name: Arc<str> = Arc::from(topic);
                self.names.push(name.clone());
                name
            }
        };
        self.records.push(RecordEntry {
            attempt,
            topic,
            topic_id,
            aimed_at,
        });
        self.records.len() as u64 - 1
    }

    /// Registers one record like [`Ledger::add_record`], and the key it was produced with (`None`:
    /// keyless): a copy whose read reports another key ([`Served::with_key`]) is misplaced.
    pub fn add_record_with_key(
        &mut self,
        attempt: AttemptId,
        topic: &str,
        topic_id: TopicId,
        aimed_at: Option<PartitionId>,
        key: Option<&[u8]>,
    ) -> u64 {
        let id = self.add_record(attempt, topic, topic_id, aimed_at);
        self.keys.insert(id, key.map(Box::from));
        id
    }

    /// Records how a call ended.
    pub fn complete(&mut self, attempt: AttemptId, outcome: Outcome) {
        let slot = &mut self.attempts[attempt.0 as usize];
        assert_eq!(*slot, Outcome::Pending, "a call completes once");
        *slot = outcome;
    }

    /// Marks an incarnation as deleted (confirmed by the node).
    pub fn incarnation_deleted(&mut self, topic_id: TopicId) {
        self.deleted.insert(topic_id);
    }

    /// Excuses records an injected bit rot destroyed.
    pub fn rotted(&mut self, ids: impl IntoIterator<Item = u64>) {
        self.rotted.extend(ids);
    }

    /// The entry of a record id.
    pub fn record(&self, id: u64) -> Option<&RecordEntry> {
        self.records.get(usize::try_from(id).ok()?)
    }

    /// The outcome of a record's call.
    pub fn outcome_of(&self, id: u64) -> Option<Outcome> {
        self.record(id)
            .map(|entry| self.attempts[entry.attempt.0 as usize])
    }

    /// Number of records registered.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no record was registered.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Whether a copy of record `id` carries the key the record was produced with, as far as both are
    /// known (the ledger's, [`Ledger::add_record_with_key`]; the read's, [`Served::with_key`]).
    fn key_matches(&self, id: u64, copy: &Served) -> bool {
        match (&copy.key, self.keys.get(&id)) {
            (Some(served), Some(produced)) => served == produced,
            (None, _) | (_, None) => true,
        }
    }

    /// Whether a 202'd record must be visible (not excused by deletion or bit rot).
    fn must_be_visible(&self, id: u64) -> bool {
        let entry = &self.records[id as usize];
        self.attempts[entry.attempt.0 as usize] == Outcome::Accepted
            && !self.deleted.contains(&entry.topic_id)
            && !self.rotted.contains(&id)
    }

    /// [`Ledger::missing`] at the liveness deadline: records excused there
    /// ([`Ledger::excuse_at_deadline`]) are not counted.
    pub fn missing_at_deadline(&self, observation: &Observation) -> usize {
        self.missing_where(observation, |id| !self.excused_at_deadline(id))
    }

    /// How many records that must be visible are not served, correctly placed, in `observation`:
    /// the cheap question the liveness phase asks before the full [`Ledger::check`].
    pub fn missing(&self, observation: &Observation) -> usize {
        self.missing_where(observation, |_| true)
    }

    fn missing_where(&self, observation: &Observation, counted: impl Fn(u64) -> bool) -> usize {
        let view = RetainedView::new(observation);
        // Ids are dense from 0: a flag per record instead of a set (this runs once per read).
        let mut served = vec![false; self.records.len()];
        for copy in &observation.served {
            let Ok(id) = copy.decoded else {
                continue;
            };
            if let Some(entry) = self.record(id) {
                if entry.topic == copy.topic
                    && entry.topic_id == copy.topic_id
                    && self.key_matches(id, copy)
                {
                    served[id as usize] = true;
                }
            }
        }
        (0..self.records.len() as u64)
            .filter(|&id| {
                self.must_be_visible(id)
                    && !served[id as usize]
                    && counted(id)
                    && !self.retained_away(id, &view)
            })
            .count()
    }

    /// Judges the two observations: see the module documentation.
    pub fn check(&self, at_deadline: &Observation, after_final: &Observation) -> Report {
        let mut report = Report::default();
        for (id, entry) in self.records.iter().enumerate() {
            match self.attempts[entry.attempt.0 as usize] {
                Outcome::Accepted => {
                    report.accepted += 1;
                    if self.deleted.contains(&entry.topic_id) {
                        report.excused_deleted += 1;
                    } else if self.rotted.contains(&(id as u64)) {
                        report.excused_rot += 1;
                    }
                }
                Outcome::Refused => report.refused += 1,
                Outcome::Pending | Outcome::Failed | Outcome::TimedOut => report.ambiguous += 1,
            }
        }
        let mut anomalies_phantom = BTreeSet::new();
        let mut anomalies_misplaced = BTreeSet::new();
        let deadline_copies = self.classify(
            at_deadline,
            &mut anomalies_phantom,
            &mut anomalies_misplaced,
            None,
        );
        let final_copies = self.classify(
            after_final,
            &mut anomalies_phantom,
            &mut anomalies_misplaced,
            Some((&mut report.reroutes, &mut report.rerouted)),
        );
        report.rerouted.sort_unstable();
        report.rerouted.dedup();
        let deadline_view = RetainedView::new(at_deadline);
        let final_view = RetainedView::new(after_final);
        for id in 0..self.records.len() as u64 {
            if !self.must_be_visible(id) {
                continue;
            }
            let at_final = final_copies[id as usize];
            let at_deadline = deadline_copies[id as usize];
            if at_final == 0 {
                if self.retained_away(id, &final_view) {
                    report.excused_retention += 1;
                    continue;
                }
                report.lost.push(id);
                if at_deadline > 0 {
                    report.vanished.push(id);
                }
            } else if at_deadline == 0
                && !self.excused_at_deadline(id)
                && !self.retained_away(id, &deadline_view)
            {
                report.unseen.push(id);
            }
        }
        for (id, &copies) in final_copies.iter().enumerate() {
            if copies >= 2 {
                *report.duplicates.entry(copies).or_default() += 1;
                report.duplicated.push(id as u64);
            }
        }
        report.ambiguous_served = (0..self.records.len())
            .filter(|&id| final_copies[id] > 0)
            .filter(|&id| {
                let attempt = self.records[id].attempt.0 as usize;
                matches!(
                    self.attempts[attempt],
                    Outcome::Pending | Outcome::Failed | Outcome::TimedOut
                )
            })
            .count() as u64;
        report.phantoms = anomalies_phantom.into_iter().collect();
        report.misplaced = anomalies_misplaced.into_iter().collect();
        report.offset_conflicts =
            offsets::offset_conflicts(served_at(at_deadline).chain(served_at(after_final)));
        report
    }

    /// Counts correctly placed copies per id (indexed by id: ids are dense from 0); collects phantoms
    /// and misplaced copies (deduplicated by location and payload, so a record seen in both
    /// observations counts once).
    fn classify(
        &self,
        observation: &Observation,
        phantoms: &mut BTreeSet<Anomaly>,
        misplaced: &mut BTreeSet<Anomaly>,
        mut reroutes: Option<(&mut u64, &mut Vec<u64>)>,
    ) -> Vec<u32> {
        let mut copies = vec![0u32; self.records.len()];
        for served in &observation.served {
            let anomaly = |reason: String| Anomaly {
                topic: served.topic.to_string(),
                topic_id: served.topic_id,
                partition: served.partition,
                offset: served.offset,
                reason,
            };
            let id = match served.decoded {
                Ok(id) => id,
                Err(error) => {
                    phantoms.insert(anomaly(format!(
                        "payload of {} bytes is not a produced payload ({error:?}), crc32 {:08x}",
                        served.payload.len(),
                        crc32fast::hash(&served.payload)
                    )));
                    continue;
                }
            };
            let Some(entry) = self.record(id) else {
                phantoms.insert(anomaly(format!("record {id} was never produced")));
                continue;
            };
            if self.attempts[entry.attempt.0 as usize] == Outcome::Refused {
                phantoms.insert(anomaly(format!(
                    "record {id} was refused (4xx) yet is served"
                )));
                continue;
            }
            if entry.topic != served.topic || entry.topic_id != served.topic_id {
                misplaced.insert(anomaly(format!(
                    "record {id} was produced to {}#{}",
                    entry.topic, entry.topic_id
                )));
                continue;
            }
            if !self.key_matches(id, served) {
                let key =
                    |key: Option<&[u8]>| key.map(|key| String::from_utf8_lossy(key).into_owned());
                misplaced.insert(anomaly(format!(
                    "record {id} was produced with key {:?}, served with key {:?}",
                    key(self.keys.get(&id).and_then(Option::as_deref)),
                    key(served.key.as_ref().and_then(Option::as_deref)),
                )));
                continue;
            }
            copies[id as usize] += 1;
            if let (Some((count, ids)), Some(aimed)) = (reroutes.as_mut(), entry.aimed_at) {
                if aimed != served.partition {
                    **count += 1;
                    ids.push(id);
                }
            }
        }
        copies
    }
}

/// Where each record of `observation` was served (copies that carry no record id left out).
pub fn served_at(observation: &Observation) -> impl Iterator<Item = offsets::ServedAt> + '_ {
    observation.served.iter().filter_map(|served| {
        let id = served.decoded.ok()?;
        Some((served.topic_id, served.partition, served.offset, id))
    })
}

#[cfg(test)]
mod tests;
