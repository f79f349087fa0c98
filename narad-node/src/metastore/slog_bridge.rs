//! raft-rs logs through `slog`; this drain forwards its records to `tracing` (target `raft`), so the
//! node has one log stream and one format.

use std::fmt::Write as _;

use slog::{Drain, Level, OwnedKVList, Record, KV};

/// A `slog::Logger` whose records become `tracing` events.
pub fn logger() -> slog::Logger {
    slog::Logger::root(TracingDrain.fuse(), slog::o!())
}

struct TracingDrain;

/// Collects a record's key-values as ` key=value` pairs.
struct Pairs(String);

impl slog::Serializer for Pairs {
    fn emit_arguments(&mut self, key: slog::Key, value: &std::fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, " {key}={value}");
        Ok(())
    }
}

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        let mut pairs = Pairs(String::new());
        let _ = record.kv().serialize(record, &mut pairs);
        let _ = values.serialize(record, &mut pairs);
        let message = record.msg();
        let pairs = pairs.0;
        match record.level() {
            Level::Critical | Level::Error => tracing::error!(target: "raft", "{message}{pairs}"),
            Level::Warning => tracing::warn!(target: "raft", "{message}{pairs}"),
            Level::Info => tracing::info!(target: "raft", "{message}{pairs}"),
            Level::Debug | Level::Trace => tracing::debug!(target: "raft", "{message}{pairs}"),
        }
        Ok(())
    }
}
