//! Failpoints: make [`crate::fs_disk::FsDisk`] fail writes or syncs under a path prefix, to test what a
//! real node does when its disk fills up or breaks.
//!
//! # Syntax of `NARAD_FAILPOINTS` (read only with the `failpoints` cargo feature)
//! Items separated by `;`:
//! - `<path-prefix>:<fault>-after-<counter>=<n>` — a rule. `<path-prefix>` is matched against disk paths
//!   (relative to the data root, `/`-separated; empty matches every path); `<fault>` is `enospc` or `eio`;
//!   `<counter>` is `bytes` (the first `n` bytes written by `write_at`/`write_zeros` to matching paths
//!   succeed, the write that crosses `n` writes the bytes up to `n` and then fails, as a full disk does,
//!   and every later write fails) or `syncs` (the first `n` `sync_data` calls on matching paths succeed,
//!   every later one fails). Counts are per rule, over all matching files.
//! - `clear-file=<path>` — while a file exists at `<path>` (an OS path), no failpoint fires and nothing
//!   is counted. A test "frees the disk" by creating that file, and may re-arm the faults by removing it.
//! - `metastore-hold-file=<path>` — while a file exists at `<path>`, the node's metastore host publishes
//!   no newer view and answers none of its callers: raft goes on voting, appending and committing, but
//!   the rest of the node (ownership, incarnation checks, the dispatcher's placement) keeps seeing the
//!   state from before the file appeared, as a replica that lags behind the log would. Removing the
//!   file releases it within a raft tick. Not a disk failpoint: [`FsDisk`](crate::fs_disk::FsDisk)
//!   ignores it; the node reads it with [`Failpoints::metastore_hold_file`].
//!
//! Example: `NARAD_FAILPOINTS="wal:enospc-after-bytes=1000000;clear-file=/tmp/narad-fault-cleared"`.
//!
//! In-process code can also call [`Failpoints::clear`], which disarms every rule for good.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use narad_core::IoFault;

/// The environment variable the `failpoints` feature reads.
pub const ENV_VAR: &str = "NARAD_FAILPOINTS";
/// The most rules one configuration may hold.
pub const RULES_MAX: usize = 16;

/// The error a rule injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailpointError {
    /// ENOSPC.
    NoSpace,
    /// EIO.
    Eio,
}

impl FailpointError {
    fn fault(self) -> IoFault {
        match self {
            FailpointError::NoSpace => IoFault::NoSpace,
            FailpointError::Eio => IoFault::Eio,
        }
    }
}

/// What a rule counts before it strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Bytes written by `write_at` and `write_zeros`.
    Bytes,
    /// `sync_data` calls.
    Syncs,
}

/// One failpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Disk paths it applies to.
    pub path_prefix: String,
    /// The error it injects.
    pub fault: FailpointError,
    /// What it counts.
    pub counter: Counter,
    /// How many bytes or syncs succeed before it strikes.
    pub after: u64,
}

/// What a write may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Write everything.
    Proceed,
    /// Write only the first `allowed_bytes`, then fail with `fault`.
    Partial {
        /// Bytes to write before failing.
        allowed_bytes: u64,
        /// The error to return.
        fault: IoFault,
    },
}

/// Why a failpoint specification did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad failpoint item {item:?}: {reason}")]
pub struct FailpointParseError {
    /// The offending item.
    pub item: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

#[derive(Debug)]
struct Armed {
    rule: Rule,
    used: u64,
}

/// A set of failpoints with their counters; shared by every lane of one disk.
#[derive(Debug)]
pub struct Failpoints {
    rules: Mutex<Vec<Armed>>,
    clear_file: Option<PathBuf>,
    metastore_hold_file: Option<PathBuf>,
    cleared: AtomicBool,
}

impl Failpoints {
    /// Failpoints from rules, with no clear file.
    pub fn new(rules: Vec<Rule>) -> Self {
        assert!(
            rules.len() <= RULES_MAX,
            "at most {RULES_MAX} failpoint rules"
        );
        Failpoints {
            rules: Mutex::new(
                rules
                    .into_iter()
                    .map(|rule| Armed { rule, used: 0 })
                    .collect(),
            ),
            clear_file: None,
            metastore_hold_file: None,
            cleared: AtomicBool::new(false),
        }
    }

    /// Parses a specification (see the module documentation).
    pub fn parse(text: &str) -> Result<Self, FailpointParseError> {
        let mut rules = Vec::new();
        let mut clear_file = None;
        let mut metastore_hold_file = None;
        for item in text
            .split(';')
            .map(str::trim)
            .filter(|item| !item.is_empty())
        {
            let bad = |reason| FailpointParseError {
                item: item.to_string(),
                reason,
            };
            if let Some(path) = item.strip_prefix("clear-file=") {
                if path.is_empty() {
                    return Err(bad("clear-file needs a path"));
                }
                clear_file = Some(PathBuf::from(path));
                continue;
            }
            if let Some(path) = item.strip_prefix("metastore-hold-file=") {
                if path.is_empty() {
                    return Err(bad("metastore-hold-file needs a path"));
                }
                metastore_hold_file = Some(PathBuf::from(path));
                continue;
            }
            let (path_prefix, spec) = item
                .split_once(':')
                .ok_or_else(|| bad("expected <path-prefix>:<fault>-after-<counter>=<n>"))?;
            let (kind, count) = spec.split_once('=').ok_or_else(|| bad("missing =<n>"))?;
            let after = count
                .parse::<u64>()
                .map_err(|_| bad("<n> is not a number"))?;
            let (fault, counter) = match kind {
                "enospc-after-bytes" => (FailpointError::NoSpace, Counter::Bytes),
                "eio-after-bytes" => (FailpointError::Eio, Counter::Bytes),
                "enospc-after-syncs" => (FailpointError::NoSpace, Counter::Syncs),
                "eio-after-syncs" => (FailpointError::Eio, Counter::Syncs),
                _ => return Err(bad("fault must be (enospc|eio)-after-(bytes|syncs)")),
            };
            if rules.len() == RULES_MAX {
                return Err(bad("too many rules"));
            }
            rules.push(Rule {
                path_prefix: path_prefix.to_string(),
                fault,
                counter,
                after,
            });
        }
        let mut failpoints = Failpoints::new(rules);
        failpoints.clear_file = clear_file;
        failpoints.metastore_hold_file = metastore_hold_file;
        Ok(failpoints)
    }

    /// Failpoints from [`ENV_VAR`]; `None` when it is unset or empty.
    pub fn from_env() -> Result<Option<Self>, FailpointParseError> {
        match std::env::var(ENV_VAR) {
            Ok(text) if !text.trim().is_empty() => Self::parse(&text).map(Some),
            _ => Ok(None),
        }
    }

    /// The file whose presence holds the metastore's view back, if one is named.
    pub fn metastore_hold_file(&self) -> Option<&Path> {
        self.metastore_hold_file.as_deref()
    }

    /// Disarms every rule for the life of the process.
    pub fn clear(&self) {
        self.cleared.store(true, Ordering::SeqCst);
    }

    /// Whether no failpoint may fire now (cleared, or the clear file exists).
    fn suspended(&self) -> bool {
        self.cleared.load(Ordering::SeqCst)
            || self.clear_file.as_ref().is_some_and(|path| path.exists())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Armed>> {
        self.rules
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Accounts a write of `len` bytes to `path` and says how much of it may happen.
    pub fn on_write(&self, path: &str, len: u64) -> Verdict {
        let mut rules = self.lock();
        let matching = |armed: &&mut Armed| {
            armed.rule.counter == Counter::Bytes
                && path.starts_with(armed.rule.path_prefix.as_str())
        };
        let mut allowed_bytes = len;
        let mut fault = None;
        for armed in rules.iter_mut().filter(matching) {
            let remaining = armed.rule.after.saturating_sub(armed.used);
            if len > remaining {
                allowed_bytes = allowed_bytes.min(remaining);
                fault.get_or_insert(armed.rule.fault);
            }
        }
        if fault.is_some() && self.suspended() {
            return Verdict::Proceed;
        }
        for armed in rules.iter_mut().filter(matching) {
            armed.used = armed.used.saturating_add(allowed_bytes);
        }
        match fault {
            None => Verdict::Proceed,
            Some(kind) => Verdict::Partial {
                allowed_bytes,
                fault: kind.fault(),
            },
        }
    }

    /// Accounts a `sync_data` of `path`: `Err` when a rule strikes.
    pub fn on_sync(&self, path: &str) -> Result<(), IoFault> {
        let mut rules = self.lock();
        let mut fault = None;
        for armed in rules.iter_mut() {
            if armed.rule.counter != Counter::Syncs
                || !path.starts_with(armed.rule.path_prefix.as_str())
            {
                continue;
            }
            if armed.used >= armed.rule.after {
                fault.get_or_insert(armed.rule.fault);
            }
        }
        if fault.is_some() && self.suspended() {
            return Ok(());
        }
        for armed in rules.iter_mut() {
            if armed.rule.counter == Counter::Syncs
                && path.starts_with(armed.rule.path_prefix.as_str())
            {
                armed.used = armed.used.saturating_add(1);
            }
        }
        match fault {
            None => Ok(()),
            Some(kind) => Err(kind.fault()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses() {
        let failpoints =
            Failpoints::parse("wal:enospc-after-bytes=1000000;clear-file=/tmp/narad-fault-cleared")
                .unwrap();
        assert_eq!(
            failpoints.lock()[0].rule,
            Rule {
                path_prefix: "wal".into(),
                fault: FailpointError::NoSpace,
                counter: Counter::Bytes,
                after: 1_000_000
            }
        );
        assert_eq!(
            failpoints.clear_file,
            Some(PathBuf::from("/tmp/narad-fault-cleared"))
        );
    }

    #[test]
    fn every_fault_and_counter_parses_and_an_empty_prefix_matches_all() {
        let failpoints =
            Failpoints::parse(":eio-after-syncs=0; a:eio-after-bytes=1;b:enospc-after-syncs=2")
                .unwrap();
        let rules: Vec<(FailpointError, Counter, u64)> = failpoints
            .lock()
            .iter()
            .map(|armed| (armed.rule.fault, armed.rule.counter, armed.rule.after))
            .collect();
        assert_eq!(
            rules,
            [
                (FailpointError::Eio, Counter::Syncs, 0),
                (FailpointError::Eio, Counter::Bytes, 1),
                (FailpointError::NoSpace, Counter::Syncs, 2)
            ]
        );
        assert_eq!(failpoints.on_sync("anything"), Err(IoFault::Eio));
    }

    #[test]
    fn the_metastore_hold_file_is_read_beside_disk_rules_and_arms_none() {
        let failpoints =
            Failpoints::parse("metastore-hold-file=/tmp/hold-2;wal:eio-after-syncs=5").unwrap();
        assert_eq!(
            failpoints.metastore_hold_file(),
            Some(Path::new("/tmp/hold-2"))
        );
        assert_eq!(failpoints.lock().len(), 1);
        let alone = Failpoints::parse("metastore-hold-file=/tmp/hold-2").unwrap();
        assert_eq!(alone.on_sync("wal/a"), Ok(()));
        assert_eq!(alone.on_write("wal/a", 1 << 20), Verdict::Proceed);
        assert_eq!(Failpoints::new(Vec::new()).metastore_hold_file(), None);
    }

    #[test]
    fn bad_items_are_refused() {
        for text in [
            "wal",
            "wal:enospc-after-bytes",
            "wal:enospc-after-bytes=x",
            "wal:full-after-bytes=1",
            "clear-file=",
            "metastore-hold-file=",
        ] {
            assert!(Failpoints::parse(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn the_write_crossing_the_budget_is_cut_short_and_later_writes_fail() {
        let failpoints = Failpoints::parse("wal:enospc-after-bytes=10").unwrap();
        assert_eq!(failpoints.on_write("wal/a", 6), Verdict::Proceed);
        assert_eq!(failpoints.on_write("other", 100), Verdict::Proceed);
        assert_eq!(
            failpoints.on_write("wal/b", 6),
            Verdict::Partial {
                allowed_bytes: 4,
                fault: IoFault::NoSpace
            }
        );
        assert_eq!(
            failpoints.on_write("wal/a", 1),
            Verdict::Partial {
                allowed_bytes: 0,
                fault: IoFault::NoSpace
            }
        );
    }

    #[test]
    fn the_clear_file_suspends_failpoints_while_it_exists() {
        let dir = tempfile::tempdir().unwrap();
        let clear = dir.path().join("cleared");
        let failpoints = Failpoints::parse(&format!(
            "wal:eio-after-syncs=0;clear-file={}",
            clear.display()
        ))
        .unwrap();
        assert_eq!(failpoints.on_sync("wal/a"), Err(IoFault::Eio));
        std::fs::write(&clear, b"").unwrap();
        assert_eq!(failpoints.on_sync("wal/a"), Ok(()));
        std::fs::remove_file(&clear).unwrap();
        assert_eq!(failpoints.on_sync("wal/a"), Err(IoFault::Eio));
        failpoints.clear();
        assert_eq!(failpoints.on_sync("wal/a"), Ok(()));
    }

    // Only builds without the feature: then nothing else in the process reads the variable, so setting
    // it here cannot leak failpoints into a concurrently running test's disk.
    #[cfg(not(feature = "failpoints"))]
    #[test]
    fn from_env_reads_the_variable_and_treats_empty_as_none() {
        std::env::set_var(ENV_VAR, "wal:eio-after-syncs=1");
        let parsed = Failpoints::from_env();
        std::env::set_var(ENV_VAR, "  ");
        let empty = Failpoints::from_env();
        std::env::set_var(ENV_VAR, "wal:oops");
        let bad = Failpoints::from_env();
        std::env::remove_var(ENV_VAR);
        let failpoints = parsed.unwrap().expect("set");
        assert_eq!(failpoints.on_sync("wal/a"), Ok(()));
        assert_eq!(failpoints.on_sync("wal/a"), Err(IoFault::Eio));
        assert!(empty.unwrap().is_none());
        assert!(bad.is_err());
        assert!(Failpoints::from_env().unwrap().is_none());
    }
}
