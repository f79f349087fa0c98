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

    /// Whether outputs of an earlier input still wait to be drained: the drain rule says none may
    /// when the next input comes ([`feed`] asserts it).
    fn has_output(&self) -> bool;
}

/// Hands `actor` its next input, as every host does: with the checks on ([`crate::DEEP_CHECKS`]),
/// asserts the drain rule first, so a host that feeds an actor before carrying out what it asked
/// fails where it does so, not later where the reordered outputs show.
pub fn feed<A: Actor + ?Sized>(actor: &mut A, now: Instant, input: A::Input) {
    if crate::DEEP_CHECKS {
        assert!(
            !actor.has_output(),
            "drain rule: an input was handed to {} before its outputs were drained",
            std::any::type_name::<A>()
        );
    }
    actor.handle(now, input);
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    /// Echoes every input as an output.
    #[derive(Default)]
    struct Echo {
        outputs: VecDeque<u32>,
    }

    impl Actor for Echo {
        type Input = u32;
        type Output = u32;

        fn handle(&mut self, _now: Instant, input: u32) {
            self.outputs.push_back(input);
        }

        fn poll_output(&mut self) -> Option<u32> {
            self.outputs.pop_front()
        }

        fn poll_timeout(&self) -> Option<Instant> {
            None
        }

        fn has_output(&self) -> bool {
            !self.outputs.is_empty()
        }
    }

    #[test]
    fn feeding_after_draining_hands_the_input_over() {
        let mut echo = Echo::default();
        feed(&mut echo, Instant::ZERO, 1);
        assert_eq!(echo.poll_output(), Some(1));
        assert_eq!(echo.poll_output(), None);
        feed(&mut echo, Instant::ZERO, 2);
        assert_eq!(echo.poll_output(), Some(2));
    }

    #[test]
    #[should_panic(expected = "drain rule")]
    fn feeding_before_draining_breaks_the_drain_rule() {
        let mut echo = Echo::default();
        feed(&mut echo, Instant::ZERO, 1);
        feed(&mut echo, Instant::ZERO, 2);
    }
}
