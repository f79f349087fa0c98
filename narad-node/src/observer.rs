//! The node's observer: where a host reports notable events and broken invariants to whoever watches
//! (the simulator; nobody in production, where [`Observer::none`] makes every call a no-op).
//!
//! Hosts report what only they can see, after every turn of their actor, from its getters and its
//! outputs: a report decides nothing and changes nothing. The invariants checked ([`Invariant`]) are
//! the ones the delivery contract rests on; each is a property of the actors' *outputs* against the I/O
//! they were given back, so a defect inside an actor cannot hide it.

use std::fmt;
use std::sync::Arc;

/// What a watcher implements.
pub trait NodeObserver: Send + Sync {
    /// A notable event (recovery, group commit, partition commit, latch): enters the simulator's trace.
    fn event(&self, source: &str, args: fmt::Arguments<'_>);
    /// A frequent event given by its `fields` (everything it says, for the trace hash) and its
    /// readable `text` (formatted only if the watcher keeps lines). Hashing fields instead of formatted
    /// text is what makes an event per record cheap. By default it is an [`NodeObserver::event`].
    fn event_fields(&self, source: &str, fields: &[TraceField<'_>], text: fmt::Arguments<'_>) {
        let _ = fields;
        self.event(source, text);
    }
    /// A broken invariant: the simulated run fails.
    fn violation(&self, invariant: Invariant, args: fmt::Arguments<'_>);
}

/// One value of an event reported by [`Observer::event_fields`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceField<'a> {
    /// A number.
    U64(u64),
    /// A text (a tag naming the event, a name).
    Str(&'a str),
}

/// An invariant a host checks continuously.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invariant {
    /// The checkpoint handed to the checkpointer never passes a record that is not done (committed or
    /// discarded).
    CheckpointPassesNotDone,
    /// WAL compaction only deletes segments behind the checkpoint value an fdatasync made durable.
    CompactionAheadOfSyncedCheckpoint,
    /// A partition's high watermark never passes the records the host saw verified (the read-back of
    /// their commit decoded with valid CRCs, or recovery verified them).
    HighWatermarkAboveVerified,
    /// The WAL never acknowledges a record while a write to its segments is not covered by a completed
    /// fdatasync.
    AckBeforeSync,
}

impl Invariant {
    /// The name reports use.
    pub fn name(self) -> &'static str {
        match self {
            Invariant::CheckpointPassesNotDone => "checkpoint-passes-not-done",
            Invariant::CompactionAheadOfSyncedCheckpoint => "compaction-ahead-of-synced-checkpoint",
            Invariant::HighWatermarkAboveVerified => "hwm-above-verified",
            Invariant::AckBeforeSync => "ack-before-sync",
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A cheap handle on an optional watcher; clones share it.
#[derive(Clone, Default)]
pub struct Observer {
    inner: Option<Arc<dyn NodeObserver>>,
}

impl Observer {
    /// No watcher: every report is dropped without being formatted.
    pub fn none() -> Observer {
        Observer { inner: None }
    }

    /// Reports to `watcher`.
    pub fn new(watcher: Arc<dyn NodeObserver>) -> Observer {
        Observer {
            inner: Some(watcher),
        }
    }

    /// Whether someone watches (hosts skip the bookkeeping of their checks otherwise).
    pub fn is_watched(&self) -> bool {
        self.inner.is_some()
    }

    /// Reports an event.
    pub fn event(&self, source: &str, args: fmt::Arguments<'_>) {
        if let Some(inner) = &self.inner {
            inner.event(source, args);
        }
    }

    /// Reports a frequent event by its fields (see [`NodeObserver::event_fields`]).
    pub fn event_fields(&self, source: &str, fields: &[TraceField<'_>], text: fmt::Arguments<'_>) {
        if let Some(inner) = &self.inner {
            inner.event_fields(source, fields, text);
        }
    }

    /// Reports a broken invariant.
    pub fn violation(&self, invariant: Invariant, args: fmt::Arguments<'_>) {
        if let Some(inner) = &self.inner {
            inner.violation(invariant, args);
        }
    }
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("watched", &self.is_watched())
            .finish()
    }
}

/// Probes compare equal: a watcher is not part of a configuration's value.
impl PartialEq for Observer {
    fn eq(&self, _other: &Observer) -> bool {
        true
    }
}

impl Eq for Observer {}
