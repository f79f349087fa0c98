//! Narad's core: the pure state machines of the produce path and the formats they read and write.
//!
//! Nothing in this crate performs I/O, reads a clock or draws ambient randomness. Every actor follows
//! the sans-IO pattern of [`actor::Actor`]: the driver feeds events with the current [`time::Instant`],
//! drains commands with `poll_output`, executes them (disk, network) and feeds the results back as events.
//! The same actors run under the real node (tokio, real files) and under the simulator (madsim, a
//! simulated disk that tears writes and fails fsyncs).

#![forbid(unsafe_code)]
// Every actor output, input and phase is matched by name, so a new variant cannot slip past a host.
#![deny(clippy::wildcard_enum_match_arm)]
// Tests pick one kind of output out of many; the production build above is what the rule guards.
#![cfg_attr(test, allow(clippy::wildcard_enum_match_arm))]

pub mod actor;
pub mod checkpoint;
pub mod codec;
pub mod cohort;
pub mod consume;
pub mod disk;
pub mod dispatcher;
pub mod error;
pub mod ids;
pub mod metastore;
pub mod partition;
pub mod planted;
pub mod routing;
pub mod time;
pub mod wal;

pub use actor::{feed, Actor};

/// Whether the actors check their full invariants after every event (segment walks, recounts): in
/// debug builds and tests, and in the simulator's build (`--cfg narad_invariants`, set by `ci/sim`),
/// whose profile keeps overflow checks but leaves debug assertions off, so the standard library's
/// unsafe-precondition checks (which safe code cannot trip) do not slow every simulated event.
/// A release node skips them.
pub const DEEP_CHECKS: bool = cfg!(any(debug_assertions, narad_invariants));
pub use error::IoFault;
pub use ids::{NodeId, Offset, PartitionId, Seq, TopicId};
pub use time::Instant;
