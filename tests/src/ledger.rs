//! The black-box ledger: the simulator's checker ([`narad_sim::ledger::Ledger`], ARCHITECTURE.md §6)
//! behind a handle the producer threads of a test share, plus what only an HTTP client knows: why a
//! call that was not accepted ended so (`status 500`, `connection failed (TimedOut)`, ...).
//!
//! Every record's payload is the simulator's self-checking payload ([`narad_sim::payload`],
//! [`PAYLOAD_BYTES`] long) carrying the id the ledger gave it, and the ledger holds the key it was
//! produced with. A replay of every partition ([`crate::load::replay_all`]) is one
//! [`Observation`], each copy with the key it was served with, and [`SharedLedger::check`] judges it
//! as the simulator's final read (it is also the "liveness deadline" read, so nothing is unseen):
//! - **lost**: answered 202, never visible (or visible only misplaced) — must be none;
//! - **phantom**: visible, never sent, sent and refused, or not a well-formed payload — must be none;
//! - **misplaced**: visible under another topic, or another key than it was produced with — must be
//!   none;
//! - **duplicates**: visible more than once — allowed, counted and reported as a histogram;
//! - **ambiguous**: a 5xx, or a connection that failed after the request was written — may or may not
//!   be visible; how many were is reported, by reason;
//! - **refused**: a 4xx to a valid produce — a failure of the test ([`Verdict::is_ok`]).
//!
//! The HTTP surface shows no incarnation ids: every record is registered, and every copy read, under
//! [`INCARNATION`], so the incarnation check holds trivially; the topic name and key checks stand.
//! Except for a topic the test deletes and creates again: it tells the ledger
//! ([`SharedLedger::recreated`]), which registers the topic's later records under a new incarnation id
//! and excuses the old incarnation's records from being visible; the test reads the new incarnation
//! labelled with that id ([`crate::load::replay_incarnation`]), so an old record served there is
//! misplaced.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use narad_core::TopicId;
pub use narad_sim::ledger::offsets::offset_conflicts;
pub use narad_sim::ledger::{served_at, Observation, Outcome, Served};
use narad_sim::ledger::{Anomaly, AttemptId, Ledger, Report};
use narad_sim::payload;

use crate::conn::ConnError;
use crate::Response;

/// The incarnation every record and every copy is registered under (see the module documentation).
pub const INCARNATION: TopicId = TopicId(1);
/// Bytes of every produced payload: the simulator's header and a filler derived from the id, which
/// catches a damaged or spliced payload.
pub const PAYLOAD_BYTES: usize = 64;

/// One record of a call, as it is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Its id in the ledger.
    pub id: u64,
    /// The key it is produced with.
    pub key: Option<String>,
    /// Its payload: the id, encoded.
    pub payload: Vec<u8>,
}

/// The ledger of a test, shared by every producer (clones share it).
#[derive(Clone, Debug, Default)]
pub struct SharedLedger {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    ledger: Ledger,
    /// Why each call that was not accepted ended so.
    reasons: BTreeMap<AttemptId, String>,
    /// The current incarnation of every topic recreated at least once; every other topic is in
    /// [`INCARNATION`].
    incarnations: BTreeMap<String, TopicId>,
    /// The topics with records registered under [`INCARNATION`].
    first_incarnation: BTreeSet<String>,
    /// Whether [`INCARNATION`] was deleted (by recreating its only topic).
    first_deleted: bool,
    /// Incarnations made by [`SharedLedger::recreated`] so far (they number from 2).
    recreations: u64,
}

impl SharedLedger {
    /// An empty ledger.
    pub fn new() -> SharedLedger {
        SharedLedger::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a call producing one record per key (`None`: keyless) to `topic`, about to be sent:
    /// returns the call and its records, ids and payloads. Complete it with [`SharedLedger::complete`].
    pub fn begin(&self, topic: &str, keys: Vec<Option<String>>) -> (AttemptId, Vec<Record>) {
        let mut state = self.lock();
        let incarnation = state.incarnation(topic);
        if incarnation == INCARNATION {
            // Deletions are by incarnation id, and every topic starts in the same one.
            assert!(
                !state.first_deleted,
                "topic {topic:?} would be registered in an incarnation the ledger deleted: \
                 a test that recreates a topic produces to no other"
            );
            state.first_incarnation.insert(topic.to_string());
        }
        let attempt = state.ledger.begin();
        let records = keys
            .into_iter()
            .map(|key| {
                let id = state.ledger.add_record_with_key(
                    attempt,
                    topic,
                    incarnation,
                    None,
                    key.as_deref().map(str::as_bytes),
                );
                Record {
                    id,
                    key,
                    payload: payload::encode(id, PAYLOAD_BYTES),
                }
            })
            .collect();
        (attempt, records)
    }

    /// Records how a call ended: its outcome, and for a call that was not accepted, why.
    pub fn complete(&self, attempt: AttemptId, (outcome, reason): (Outcome, String)) {
        let mut state = self.lock();
        state.ledger.complete(attempt, outcome);
        if outcome != Outcome::Accepted {
            state.reasons.insert(attempt, reason);
        }
    }

    /// The incarnation `topic`'s records are registered in now: [`INCARNATION`] until the topic is
    /// recreated.
    pub fn incarnation(&self, topic: &str) -> TopicId {
        self.lock().incarnation(topic)
    }

    /// Tells the ledger that `topic` was deleted (the delete answered 204) and created again: its
    /// records from now on are registered in a new incarnation, which this returns (label that
    /// incarnation's replay with it, [`crate::load::replay_incarnation`]); the old incarnation's
    /// records are excused from being visible, and a copy of one in the new incarnation is misplaced.
    /// Call it while no call to `topic` is in flight: which incarnation a call that straddles the
    /// delete reached is unknowable from outside.
    ///
    /// The incarnation ids are the ledger's (the HTTP surface shows none) and a deletion excuses a
    /// whole id, so `topic` must be the only topic registered in [`INCARNATION`] (it panics otherwise).
    pub fn recreated(&self, topic: &str) -> TopicId {
        let mut state = self.lock();
        let old = state.incarnation(topic);
        if old == INCARNATION {
            let others: Vec<&String> = state
                .first_incarnation
                .iter()
                .filter(|name| *name != topic)
                .collect();
            assert!(
                others.is_empty(),
                "recreating {topic:?} would excuse the records of {others:?} too"
            );
            state.first_deleted = true;
        }
        state.recreations += 1;
        let new = TopicId(INCARNATION.0 + state.recreations);
        state.ledger.incarnation_deleted(old);
        state.incarnations.insert(topic.to_string(), new);
        new
    }

    /// The outcome of a record's call.
    pub fn outcome_of(&self, id: u64) -> Option<Outcome> {
        self.lock().ledger.outcome_of(id)
    }

    /// Judges what a replay of every partition served (see the module documentation).
    pub fn check(&self, replay: &Observation) -> Verdict {
        let state = self.lock();
        let report = state.ledger.check(replay, replay);
        let mut ambiguous_reasons = BTreeMap::new();
        let mut refused_reasons = BTreeMap::new();
        for id in 0..state.ledger.len() as u64 {
            let entry = state.ledger.record(id).expect("ids are dense");
            let reasons = match state.ledger.outcome_of(id).expect("ids are dense") {
                Outcome::Accepted => continue,
                Outcome::Refused => &mut refused_reasons,
                Outcome::Pending | Outcome::Failed | Outcome::TimedOut => &mut ambiguous_reasons,
            };
            let reason = state
                .reasons
                .get(&entry.attempt)
                .map_or("never answered", String::as_str);
            *reasons.entry(reason.to_string()).or_default() += 1;
        }
        Verdict {
            report,
            served: replay.served.len(),
            ambiguous_reasons,
            refused_reasons,
        }
    }
}

impl State {
    fn incarnation(&self, topic: &str) -> TopicId {
        self.incarnations.get(topic).copied().unwrap_or(INCARNATION)
    }
}

/// How an exchange ended, for [`SharedLedger::complete`]: the outcome, and why (`status 500`,
/// `connection failed (TimedOut)`, `status 400: {...}`).
pub fn judge(answer: &Result<Response, ConnError>) -> (Outcome, String) {
    match answer {
        Ok(response) if response.status == 202 => (Outcome::Accepted, "202".to_string()),
        Ok(response) if response.status >= 500 => {
            (Outcome::Failed, format!("status {}", response.status))
        }
        Ok(response) => (
            Outcome::Refused,
            format!("status {}: {}", response.status, response.text()),
        ),
        // Never sent: whatever of it is served is a phantom.
        Err(ConnError::Connect(error)) => (Outcome::Refused, format!("not sent ({error})")),
        Err(ConnError::Exchange(error)) => {
            let outcome = match error.kind() {
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => Outcome::TimedOut,
                _ => Outcome::Failed,
            };
            (outcome, format!("connection failed ({:?})", error.kind()))
        }
    }
}

/// The verdict on one replay.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The simulator's checker's report (lost, phantoms, misplaced, duplicates, counts).
    pub report: Report,
    /// Copies the replay read.
    pub served: usize,
    /// Records of calls that ended ambiguously, by reason.
    pub ambiguous_reasons: BTreeMap<String, u64>,
    /// Records of refused calls, by reason.
    pub refused_reasons: BTreeMap<String, u64>,
}

impl Verdict {
    /// How many of each failure [`Verdict`]'s display lists.
    pub const LISTED_MAX: usize = 20;

    /// No loss, no phantom, no misplaced copy, no refusal.
    pub fn is_ok(&self) -> bool {
        !self.report.failed() && self.report.refused == 0
    }

    /// Panics, naming `what`, unless [`Verdict::is_ok`] holds, nothing is lost, phantom or
    /// misplaced, and something was acknowledged.
    pub fn assert_clean(&self, what: &str) {
        let report = &self.report;
        assert!(
            self.is_ok(),
            "{what}: records lost, invented or misplaced:\n{self}"
        );
        assert_eq!(
            (
                report.lost.len(),
                report.phantoms.len(),
                report.misplaced.len()
            ),
            (0, 0, 0),
            "{what}:\n{self}"
        );
        assert!(report.accepted > 0, "{what}: nothing was acknowledged");
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let report = &self.report;
        writeln!(
            f,
            "acked {} | ambiguous {} ({} visible; {:?}) | refused {} {:?}",
            report.accepted,
            report.ambiguous,
            report.ambiguous_served,
            self.ambiguous_reasons,
            report.refused,
            self.refused_reasons
        )?;
        writeln!(
            f,
            "read back {} records | duplicates {} (copies:records {})",
            self.served,
            report.duplicate_copies(),
            report.duplicates_histogram()
        )?;
        let anomalies = |anomalies: &[Anomaly]| -> Vec<String> {
            let listed = anomalies.iter().take(Self::LISTED_MAX);
            listed.map(ToString::to_string).collect()
        };
        write!(
            f,
            "lost {} {:?} | phantoms {} {:?} | misplaced {} {:?}",
            report.lost.len(),
            &report.lost[..report.lost.len().min(Self::LISTED_MAX)],
            report.phantoms.len(),
            anomalies(&report.phantoms),
            report.misplaced.len(),
            anomalies(&report.misplaced)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_core::{Offset, PartitionId};

    const TOPIC: &str = "t";

    fn answer(status: u16) -> Result<Response, ConnError> {
        Ok(Response {
            status,
            headers: Vec::new(),
            body: b"{\"error\":\"x\"}".to_vec(),
        })
    }

    fn copy(record: &Record, partition: u32, offset: u64, key: Option<&str>) -> Served {
        Served::new(
            TOPIC.into(),
            INCARNATION,
            PartitionId(partition),
            Offset(offset),
            record.payload.clone(),
        )
        .with_key(key.map(str::as_bytes))
    }

    fn replay(served: Vec<Served>) -> Observation {
        Observation {
            served,
            ..Observation::default()
        }
    }

    #[test]
    fn acked_records_read_back_once_under_their_keys_pass() {
        let ledger = SharedLedger::new();
        let (call, records) = ledger.begin(TOPIC, vec![Some("k".into()), None]);
        ledger.complete(call, judge(&answer(202)));
        let verdict = ledger.check(&replay(vec![
            copy(&records[0], 0, 0, Some("k")),
            copy(&records[1], 1, 0, None),
        ]));
        assert!(verdict.is_ok(), "{verdict}");
        assert_eq!((verdict.report.accepted, verdict.served), (2, 2));
        assert_eq!(ledger.outcome_of(records[0].id), Some(Outcome::Accepted));
    }

    #[test]
    fn a_missing_acked_record_is_lost() {
        let ledger = SharedLedger::new();
        let (call, records) = ledger.begin(TOPIC, vec![None]);
        ledger.complete(call, judge(&answer(202)));
        let verdict = ledger.check(&Observation::default());
        assert!(!verdict.is_ok());
        assert_eq!(verdict.report.lost, vec![records[0].id]);
    }

    #[test]
    fn unsent_refused_and_damaged_payloads_are_phantoms_and_a_refusal_fails() {
        let ledger = SharedLedger::new();
        let (call, refused) = ledger.begin(TOPIC, vec![None]);
        ledger.complete(call, judge(&answer(400)));
        let mut damaged = refused[0].clone();
        damaged.payload[30] ^= 1;
        let never = Record {
            id: 99,
            key: None,
            payload: payload::encode(99, PAYLOAD_BYTES),
        };
        let verdict = ledger.check(&replay(vec![
            copy(&refused[0], 0, 0, None),
            copy(&never, 0, 1, None),
            copy(&damaged, 0, 2, None),
        ]));
        assert!(!verdict.is_ok());
        assert_eq!(verdict.report.phantoms.len(), 3, "{verdict}");
        assert_eq!(verdict.report.refused, 1);
        assert_eq!(
            verdict.refused_reasons,
            BTreeMap::from([("status 400: {\"error\":\"x\"}".to_string(), 1)])
        );
    }

    #[test]
    fn a_record_under_another_key_is_misplaced() {
        let ledger = SharedLedger::new();
        let (call, records) = ledger.begin(TOPIC, vec![Some("k1".into())]);
        ledger.complete(call, judge(&answer(202)));
        let verdict = ledger.check(&replay(vec![copy(&records[0], 0, 0, Some("k2"))]));
        assert!(!verdict.is_ok());
        assert_eq!(verdict.report.misplaced.len(), 1, "{verdict}");
    }

    #[test]
    fn duplicates_and_ambiguous_records_are_counted_not_failed() {
        let ledger = SharedLedger::new();
        let (call, acked) = ledger.begin(TOPIC, vec![None]);
        ledger.complete(call, judge(&answer(202)));
        let (call, failed) = ledger.begin(TOPIC, vec![None, None]);
        ledger.complete(call, judge(&answer(500)));
        let verdict = ledger.check(&replay(vec![
            copy(&acked[0], 0, 0, None),
            copy(&acked[0], 0, 1, None),
            copy(&acked[0], 0, 2, None),
            copy(&failed[0], 0, 3, None),
            copy(&failed[0], 0, 4, None),
        ]));
        assert!(verdict.is_ok(), "{verdict}");
        assert_eq!(verdict.report.duplicate_copies(), 3);
        assert_eq!(verdict.report.duplicates_histogram(), "2:1 3:1");
        assert_eq!(
            (verdict.report.ambiguous, verdict.report.ambiguous_served),
            (2, 1)
        );
        assert_eq!(
            verdict.ambiguous_reasons,
            BTreeMap::from([("status 500".to_string(), 2)])
        );
    }

    #[test]
    fn an_old_incarnation_record_in_the_recreated_topic_is_misplaced_and_not_lost() {
        let ledger = SharedLedger::new();
        let (call, old) = ledger.begin(TOPIC, vec![None, None]);
        ledger.complete(call, judge(&answer(202)));
        let new_incarnation = ledger.recreated(TOPIC);
        assert_ne!(new_incarnation, INCARNATION);
        assert_eq!(ledger.incarnation(TOPIC), new_incarnation);
        let (call, new) = ledger.begin(TOPIC, vec![None]);
        ledger.complete(call, judge(&answer(202)));
        let in_new = |record: &Record, offset| {
            Served::new(
                TOPIC.into(),
                new_incarnation,
                PartitionId(0),
                Offset(offset),
                record.payload.clone(),
            )
            .with_key(None)
        };
        // The old records need not be served; the new one must be.
        let verdict = ledger.check(&replay(vec![in_new(&new[0], 0)]));
        assert!(verdict.is_ok(), "{verdict}");
        assert_eq!(verdict.report.excused_deleted, 2);
        let verdict = ledger.check(&replay(vec![in_new(&new[0], 0), in_new(&old[1], 1)]));
        assert!(!verdict.is_ok());
        assert_eq!(verdict.report.misplaced.len(), 1, "{verdict}");
        assert!(verdict.report.lost.is_empty(), "{verdict}");
    }

    #[test]
    #[should_panic(expected = "would excuse the records")]
    fn recreating_a_topic_that_shares_its_incarnation_id_is_refused() {
        let ledger = SharedLedger::new();
        ledger.begin(TOPIC, vec![None]);
        ledger.begin("other", vec![None]);
        ledger.recreated(TOPIC);
    }

    #[test]
    fn a_broken_exchange_is_ambiguous_and_an_unsent_call_is_refused() {
        let broken = Err(ConnError::Exchange(
            std::io::ErrorKind::ConnectionReset.into(),
        ));
        assert_eq!(
            judge(&broken),
            (
                Outcome::Failed,
                "connection failed (ConnectionReset)".to_string()
            )
        );
        let slow = Err(ConnError::Exchange(std::io::ErrorKind::WouldBlock.into()));
        assert_eq!(judge(&slow).0, Outcome::TimedOut);
        let unsent = Err(ConnError::Connect(
            std::io::ErrorKind::ConnectionRefused.into(),
        ));
        assert_eq!(judge(&unsent).0, Outcome::Refused);
    }
}
