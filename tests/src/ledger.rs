//! The black-box ledger: every produce attempt with its outcome, checked against what a replay of
//! every partition finds. The same rules as the simulator's checker (ARCHITECTURE.md §6):
//! - **lost**: answered 202, never visible — must be none;
//! - **phantom**: visible, never sent — must be none;
//! - **misattributed**: visible with a key other than the one it was produced with — must be none;
//! - **duplicates**: visible more than once — allowed, counted and reported as a histogram;
//! - ambiguous attempts (a 5xx, or a connection that failed after the request was written) may or may
//!   not be visible; how many were is reported.
//!
//! Every record is identified by its payload, a unique id (see [`crate::load`]).

use std::collections::BTreeMap;
use std::fmt;

/// What the node answered to an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 202: the record must be visible.
    Acked,
    /// A 5xx, or the connection failed after the request was written: may or may not be visible.
    Ambiguous(String),
    /// A 4xx: the node refused it (never visible; a 4xx to a valid produce is a test failure).
    Refused(u16, String),
}

/// One sent record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The key it was produced with.
    pub key: Option<String>,
    /// Its outcome.
    pub outcome: Outcome,
}

/// A record read back by replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// Partition.
    pub partition: u32,
    /// Offset.
    pub offset: u64,
    /// Key, if any.
    pub key: Option<String>,
    /// Payload text.
    pub payload: String,
}

/// Every attempt, by record id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    entries: BTreeMap<String, Entry>,
}

/// The outcome of [`Ledger::check`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Records answered 202.
    pub acked: usize,
    /// Records with an ambiguous outcome.
    pub ambiguous: usize,
    /// Of those, how many are visible.
    pub ambiguous_visible: usize,
    /// Records refused with a 4xx (status → count).
    pub refused: BTreeMap<u16, usize>,
    /// Ambiguous outcomes by reason (`status 500`, `exchange: ...`).
    pub ambiguous_reasons: BTreeMap<String, usize>,
    /// Records read back.
    pub seen_records: usize,
    /// Extra copies (records read back minus distinct ids read back).
    pub duplicates: usize,
    /// copies → how many ids were visible that many times (2 and more).
    pub duplicate_histogram: BTreeMap<usize, usize>,
    /// Acked ids never read back (at most [`Verdict::LISTED_MAX`] listed).
    pub lost: Vec<String>,
    /// Count of lost ids.
    pub lost_count: usize,
    /// Payloads read back that were never sent, or sent and refused (listed up to the cap).
    pub phantoms: Vec<String>,
    /// Count of phantoms.
    pub phantom_count: usize,
    /// Ids read back with another key than they were produced with (listed up to the cap).
    pub misattributed: Vec<String>,
    /// Count of misattributed records.
    pub misattributed_count: usize,
}

impl Verdict {
    /// How many ids each failure list shows.
    pub const LISTED_MAX: usize = 20;

    /// No loss, no phantom, no misattribution, no refusal.
    pub fn is_ok(&self) -> bool {
        self.lost_count == 0
            && self.phantom_count == 0
            && self.misattributed_count == 0
            && self.refused.is_empty()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "acked {} | ambiguous {} ({} visible; {:?}) | refused {:?}",
            self.acked,
            self.ambiguous,
            self.ambiguous_visible,
            self.ambiguous_reasons,
            self.refused
        )?;
        writeln!(
            f,
            "read back {} records | duplicates {} (copies → ids: {:?})",
            self.seen_records, self.duplicates, self.duplicate_histogram
        )?;
        write!(
            f,
            "lost {} {:?} | phantoms {} {:?} | misattributed {} {:?}",
            self.lost_count,
            self.lost,
            self.phantom_count,
            self.phantoms,
            self.misattributed_count,
            self.misattributed
        )
    }
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// Records an attempt. An id is recorded once (ids are unique per attempt).
    pub fn record(&mut self, id: String, key: Option<String>, outcome: Outcome) {
        let previous = self.entries.insert(id.clone(), Entry { key, outcome });
        assert!(previous.is_none(), "record id {id} was used twice");
    }

    /// Adds another ledger's attempts (ids must not overlap).
    pub fn merge(&mut self, other: Ledger) {
        for (id, entry) in other.entries {
            self.record(id, entry.key, entry.outcome);
        }
    }

    /// Attempts recorded.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Ids answered 202.
    pub fn acked(&self) -> impl Iterator<Item = &str> {
        self.entries
            .iter()
            .filter(|(_, entry)| entry.outcome == Outcome::Acked)
            .map(|(id, _)| id.as_str())
    }

    /// Checks what replay found against the attempts.
    pub fn check(&self, seen: &[Seen]) -> Verdict {
        let mut verdict = Verdict {
            seen_records: seen.len(),
            ..Verdict::default()
        };
        let mut copies: BTreeMap<&str, usize> = BTreeMap::new();
        for record in seen {
            match self.entries.get(&record.payload) {
                None
                | Some(Entry {
                    outcome: Outcome::Refused(..),
                    ..
                }) => {
                    verdict.phantom_count += 1;
                    push_capped(&mut verdict.phantoms, &record.payload);
                }
                Some(entry) => {
                    *copies.entry(record.payload.as_str()).or_default() += 1;
                    if entry.key != record.key {
                        verdict.misattributed_count += 1;
                        push_capped(
                            &mut verdict.misattributed,
                            &format!(
                                "{} (key {:?}, read {:?} at {}/{})",
                                record.payload,
                                entry.key,
                                record.key,
                                record.partition,
                                record.offset
                            ),
                        );
                    }
                }
            }
        }
        for (id, entry) in &self.entries {
            let visible = copies.get(id.as_str()).copied().unwrap_or(0);
            match &entry.outcome {
                Outcome::Acked => {
                    verdict.acked += 1;
                    if visible == 0 {
                        verdict.lost_count += 1;
                        push_capped(&mut verdict.lost, id);
                    }
                }
                Outcome::Ambiguous(reason) => {
                    verdict.ambiguous += 1;
                    *verdict.ambiguous_reasons.entry(reason.clone()).or_default() += 1;
                    if visible > 0 {
                        verdict.ambiguous_visible += 1;
                    }
                }
                Outcome::Refused(status, _) => {
                    *verdict.refused.entry(*status).or_default() += 1;
                }
            }
            if visible > 1 {
                verdict.duplicates += visible - 1;
                *verdict.duplicate_histogram.entry(visible).or_default() += 1;
            }
        }
        verdict
    }
}

fn push_capped(list: &mut Vec<String>, item: &str) {
    if list.len() < Verdict::LISTED_MAX {
        list.push(item.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(payload: &str, key: Option<&str>) -> Seen {
        Seen {
            partition: 0,
            offset: 0,
            key: key.map(str::to_string),
            payload: payload.to_string(),
        }
    }

    #[test]
    fn acked_records_read_back_once_pass() {
        let mut ledger = Ledger::new();
        ledger.record("a".into(), Some("k".into()), Outcome::Acked);
        ledger.record("b".into(), None, Outcome::Acked);
        let verdict = ledger.check(&[seen("a", Some("k")), seen("b", None)]);
        assert!(verdict.is_ok(), "{verdict}");
        assert_eq!((verdict.acked, verdict.duplicates), (2, 0));
    }

    #[test]
    fn a_missing_acked_record_is_lost() {
        let mut ledger = Ledger::new();
        ledger.record("a".into(), None, Outcome::Acked);
        let verdict = ledger.check(&[]);
        assert!(!verdict.is_ok());
        assert_eq!(
            (verdict.lost_count, verdict.lost.clone()),
            (1, vec!["a".to_string()])
        );
    }

    #[test]
    fn unsent_and_refused_payloads_are_phantoms() {
        let mut ledger = Ledger::new();
        ledger.record("r".into(), None, Outcome::Refused(400, "bad".into()));
        let verdict = ledger.check(&[seen("r", None), seen("never", None)]);
        assert_eq!(verdict.phantom_count, 2);
        assert_eq!(verdict.refused, BTreeMap::from([(400, 1)]));
        assert!(!verdict.is_ok());
    }

    #[test]
    fn a_record_under_another_key_is_misattributed() {
        let mut ledger = Ledger::new();
        ledger.record("a".into(), Some("k1".into()), Outcome::Acked);
        let verdict = ledger.check(&[seen("a", Some("k2"))]);
        assert_eq!(verdict.misattributed_count, 1);
        assert!(!verdict.is_ok());
    }

    #[test]
    fn duplicates_and_ambiguous_records_are_counted_not_failed() {
        let mut ledger = Ledger::new();
        ledger.record("a".into(), None, Outcome::Acked);
        ledger.record("m".into(), None, Outcome::Ambiguous("status 500".into()));
        ledger.record("n".into(), None, Outcome::Ambiguous("status 500".into()));
        let verdict = ledger.check(&[
            seen("a", None),
            seen("a", None),
            seen("a", None),
            seen("m", None),
            seen("m", None),
        ]);
        assert!(verdict.is_ok(), "{verdict}");
        assert_eq!(verdict.duplicates, 3);
        assert_eq!(
            verdict.duplicate_histogram,
            BTreeMap::from([(2, 1), (3, 1)])
        );
        assert_eq!((verdict.ambiguous, verdict.ambiguous_visible), (2, 1));
        assert_eq!(
            verdict.ambiguous_reasons,
            BTreeMap::from([("status 500".to_string(), 2)])
        );
    }
}
