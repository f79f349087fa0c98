//! The run's event trace and its hash.
//!
//! Every event the harness and the node report (accepts, commits, faults, crashes, recoveries, client
//! outcomes) goes through [`Trace::record`] (or [`Trace::record_fields`]) with its simulated
//! timestamp. The trace hash is FNV-1a 64 (by 8-byte words) over each event's timestamp, source and formatted
//! text, computed without allocating, or, for the frequent events given by their fields, over the
//! fields' bytes without formatting anything (the text is formatted only when lines are kept), so the
//! hash is the same with and without `--trace`. `--check-determinism` compares it across two runs of a
//! seed (madsim's own check only compares its RNG log). The readable lines are kept only when asked
//! for (`--trace`).

use std::fmt;

pub use narad_node::observer::TraceField;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Most trace lines kept for printing; later events still count in the hash.
pub const LINES_MAX: usize = 2_000_000;

/// FNV-1a 64 over 8-byte words (whole words of each write, then its tail bytes one by one), fed
/// through `fmt::Write` so events hash without being formatted into a `String`. Each step
/// (xor a word or byte, multiply by an odd prime) is a bijection of the state, so two traces that
/// differ in one write hash differently. A word per step instead of a byte: the trace hashes every
/// event of a run.
#[derive(Clone, Copy, Debug)]
struct Fnv64(u64);

impl Fnv64 {
    fn write_u64(&mut self, word: u64) {
        self.0 ^= word;
        self.0 = self.0.wrapping_mul(FNV_PRIME);
    }

    fn write_bytes(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let mut le = [0u8; 8];
            le.copy_from_slice(word);
            self.write_u64(u64::from_le_bytes(le));
        }
        for &byte in words.remainder() {
            self.write_u64(u64::from(byte));
        }
    }
}

impl fmt::Write for Fnv64 {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.write_bytes(s.as_bytes());
        Ok(())
    }
}

/// A run's trace: a running hash, an event count and, optionally, the readable lines.
#[derive(Clone, Debug)]
pub struct Trace {
    hash: Fnv64,
    events: u64,
    lines: Option<Vec<String>>,
}

impl Trace {
    /// An empty trace; `keep_lines` keeps the readable lines for printing.
    pub fn new(keep_lines: bool) -> Self {
        Trace {
            hash: Fnv64(FNV_OFFSET),
            events: 0,
            lines: keep_lines.then(Vec::new),
        }
    }

    /// Records one event at `at_ns` of simulated time, from `source` (`harness`, `node`, `fault`, ...).
    pub fn record(&mut self, at_ns: u64, source: &str, args: fmt::Arguments<'_>) {
        self.events += 1;
        // The timestamp goes in as its bytes (formatting it cost more than the rest of the event);
        // writing into the hasher cannot fail.
        self.hash.write_u64(at_ns);
        self.hash.write_bytes(source.as_bytes());
        // The bytes of `writeln!(" {args}")`, without a second level of formatting.
        self.hash.write_bytes(b" ");
        let _ = fmt::write(&mut self.hash, args);
        self.hash.write_bytes(b"\n");
        self.keep_line(at_ns, source, args);
    }

    /// Records one event given by its `fields` (everything it says) and its readable `text`: the hash
    /// covers the timestamp, the source and the fields' bytes; `text` is formatted only when lines are
    /// kept.
    pub fn record_fields(
        &mut self,
        at_ns: u64,
        source: &str,
        fields: &[TraceField<'_>],
        text: fmt::Arguments<'_>,
    ) {
        self.events += 1;
        self.hash.write_u64(at_ns);
        self.hash.write_bytes(source.as_bytes());
        // A byte no formatted text starts with (those start with a space), then each field tagged.
        self.hash.write_u64(0x1f);
        for field in fields {
            match field {
                TraceField::U64(value) => {
                    self.hash.write_u64(u64::from(b'u'));
                    self.hash.write_u64(*value);
                }
                TraceField::Str(text) => {
                    self.hash.write_u64(u64::from(b's'));
                    self.hash.write_u64(text.len() as u64);
                    self.hash.write_bytes(text.as_bytes());
                }
            }
        }
        self.keep_line(at_ns, source, text);
    }

    fn keep_line(&mut self, at_ns: u64, source: &str, args: fmt::Arguments<'_>) {
        if let Some(lines) = self.lines.as_mut() {
            if lines.len() < LINES_MAX {
                lines.push(format!(
                    "[{:>4}.{:06}s] {source:<7} {args}",
                    at_ns / 1_000_000_000,
                    at_ns % 1_000_000_000 / 1000
                ));
            }
        }
    }

    /// The hash over every event so far.
    pub fn hash(&self) -> u64 {
        self.hash.0
    }

    /// Events recorded.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// The readable lines, when kept.
    pub fn lines(&self) -> Option<&[String]> {
        self.lines.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_events_hash_the_same() {
        let mut a = Trace::new(false);
        let mut b = Trace::new(true);
        for trace in [&mut a, &mut b] {
            trace.record(5, "node", format_args!("accept {}", 3));
            trace.record(9, "fault", format_args!("crash"));
        }
        assert_eq!(a.hash(), b.hash());
        assert_eq!(a.events(), 2);
        assert_eq!(a.lines(), None);
        assert_eq!(
            b.lines().unwrap(),
            [
                "[   0.000000s] node    accept 3",
                "[   0.000000s] fault   crash"
            ]
        );
    }

    #[test]
    fn the_same_field_events_hash_the_same_with_or_without_lines() {
        let mut a = Trace::new(false);
        let mut b = Trace::new(true);
        for trace in [&mut a, &mut b] {
            trace.record_fields(
                5,
                "wal",
                &[TraceField::Str("group commit"), TraceField::U64(3)],
                format_args!("group commit {}", 3),
            );
        }
        assert_eq!(a.hash(), b.hash());
        assert_eq!(a.events(), 1);
        assert_eq!(
            b.lines().unwrap(),
            ["[   0.000000s] wal     group commit 3"]
        );
    }

    #[test]
    fn any_field_difference_changes_the_hash() {
        let hash = |at_ns, fields: &[TraceField<'_>]| {
            let mut trace = Trace::new(false);
            trace.record_fields(at_ns, "wal", fields, format_args!("ignored"));
            trace.hash()
        };
        let base = hash(1, &[TraceField::Str("a"), TraceField::U64(1)]);
        assert_ne!(base, hash(2, &[TraceField::Str("a"), TraceField::U64(1)]));
        assert_ne!(base, hash(1, &[TraceField::Str("b"), TraceField::U64(1)]));
        assert_ne!(base, hash(1, &[TraceField::Str("a"), TraceField::U64(2)]));
        assert_ne!(base, hash(1, &[TraceField::Str("a")]));
        // Tagged and length-prefixed: moving bytes between fields changes the hash.
        assert_ne!(
            hash(1, &[TraceField::Str("ab"), TraceField::Str("")]),
            hash(1, &[TraceField::Str("a"), TraceField::Str("b")])
        );
    }

    #[test]
    fn any_difference_changes_the_hash() {
        let hash = |at_ns, text: &str| {
            let mut trace = Trace::new(false);
            trace.record(at_ns, "node", format_args!("{text}"));
            trace.hash()
        };
        assert_ne!(hash(1, "a"), hash(2, "a"));
        assert_ne!(hash(1, "a"), hash(1, "b"));
    }
}
