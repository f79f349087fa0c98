//! The sans-IO actor contract shared by every state machine in the core.

use crate::time::Instant;

/// A pure state machine driven by events.
///
/// Polling order: after every [`Actor::handle`], the driver drains [`Actor::poll_output`] until it returns
/// `None`, then asks [`Actor::poll_timeout`] and arranges to feed the actor's tick input at (or after)
/// that instant. Drivers match every output variant explicitly, so a new variant breaks each driver at
/// compile time instead of being silently ignored.
pub trait Actor {
    /// The events this actor consumes (I/O completions, requests, ticks).
    type Input;
    /// The commands this actor emits (I/O to perform, replies to send).
    type Output;

    /// Feed one event. Never blocks, never performs I/O, never reads a clock.
    fn handle(&mut self, now: Instant, input: Self::Input);

    /// Drain one command; call until `None` before the next `handle`.
    fn poll_output(&mut self) -> Option<Self::Output>;

    /// When the actor next wants its tick input (linger, backstops, probes, flush delays).
    fn poll_timeout(&self) -> Option<Instant>;
}
