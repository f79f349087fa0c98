//! The one generic host every actor of the node runs on: a bounded mailbox of commands, a bounded
//! channel of I/O completions, a set of answers on their way (futures the host polls itself: no task
//! and no channel per answer), and one timer at the hosted actors' `poll_timeout`.
//!
//! A [`Hosted`] value holds one or more actors and routes their outputs; the host owns the loop and
//! decides only *when* each source is read. Within a call the hosted value follows the `Actor`
//! contract: it feeds one input, drains the actor's outputs to `None` and carries them out before the
//! next input.
//!
//! # Turns
//! Each turn takes one source, in this order, then asks the hosted value whether it is done:
//! 1. one I/O completion, with the commands already waiting handed over first (so a flush the
//!    completion starts carries them rather than leaving them for the one after);
//! 2. one answer that resolved;
//! 3. the commands waiting in the mailbox, at most [`COMMANDS_PER_TURN_MAX`], as one batch (a hosted
//!    actor that batches, the WAL's group commit, sees them together);
//! 4. the timer, only when nothing else was ready, and only once the instant has passed by the
//!    clock (a timer that fires early is not trusted).
//!
//! A source that answered `Pending` holds the task's waker and is not polled again in the same poll,
//! so one event costs one poll of each idle source, not one per turn.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::stream::{FuturesUnordered, StreamExt};
use narad_core::Instant;
use tokio::sync::mpsc;

use crate::clock::{Clock, WakeTimer};

/// Commands taken from the mailbox in one turn, at most: then the completions get their turn.
pub const COMMANDS_PER_TURN_MAX: usize = 1024;

/// An answer on its way: resolves to a completion the host hands to [`Hosted::on_completion`].
pub type Answer<C> = Pin<Box<dyn Future<Output = C> + Send>>;

/// What a hosted value can ask of the host during a call.
pub struct Turn<'a, C> {
    now: Instant,
    answers: &'a mut FuturesUnordered<Answer<C>>,
}

impl<C> Turn<'_, C> {
    /// The instant of this call, read once from the node's clock.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Polls `answer` with the host's other sources and hands its output to
    /// [`Hosted::on_completion`] once it resolves.
    pub fn answer_later(&mut self, answer: impl Future<Output = C> + Send + 'static) {
        self.answers.push(Box::pin(answer));
    }
}

/// One or more actors run by a host; see the module documentation.
pub trait Hosted: Send + 'static {
    /// What callers put in the mailbox.
    type Command: Send + 'static;
    /// What comes back: I/O completions (through [`Completions`]) and answers.
    type Completion: Send + 'static;

    /// Called once, before the first turn.
    fn on_start(&mut self, turn: &mut Turn<'_, Self::Completion>);

    /// The commands taken from the mailbox in one turn, in arrival order (drained by the callee).
    fn on_commands(
        &mut self,
        turn: &mut Turn<'_, Self::Completion>,
        commands: &mut VecDeque<Self::Command>,
    );

    /// Every handle on the mailbox is gone: no command will come again.
    fn on_mailbox_closed(&mut self, turn: &mut Turn<'_, Self::Completion>);

    /// An I/O completion or an answer.
    fn on_completion(
        &mut self,
        turn: &mut Turn<'_, Self::Completion>,
        completion: Self::Completion,
    );

    /// The instant of [`Hosted::poll_timeout`] has passed.
    fn on_timeout(&mut self, turn: &mut Turn<'_, Self::Completion>);

    /// When the hosted actors next want [`Hosted::on_timeout`].
    fn poll_timeout(&self) -> Option<Instant>;

    /// Whether the host may end: checked after every turn.
    fn finished(&self) -> bool;
}

/// Where an I/O executor delivers completions into a host.
pub type Completions<C> = mpsc::Sender<C>;

/// The sizes of a host's channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// Commands the mailbox holds before callers wait.
    pub mailbox_capacity: usize,
    /// Completions the executors may queue for the host.
    pub completions_capacity: usize,
}

/// Starts a host task: `hosted` is built with the sender its I/O executors deliver completions to.
/// Returns the mailbox. The task ends once [`Hosted::finished`] says so.
pub fn spawn<H: Hosted>(
    config: HostConfig,
    clock: Clock,
    hosted: impl FnOnce(Completions<H::Completion>) -> H,
) -> mpsc::Sender<H::Command> {
    let (commands, mailbox) = mpsc::channel(config.mailbox_capacity);
    let (completions_tx, completions) = mpsc::channel(config.completions_capacity);
    let hosted = hosted(completions_tx);
    let host = Host {
        hosted,
        clock,
        mailbox,
        completions,
        answers: FuturesUnordered::new(),
        batch: VecDeque::new(),
        mailbox_open: true,
    };
    tokio::spawn(host.run());
    commands
}

struct Host<H: Hosted> {
    hosted: H,
    clock: Clock,
    mailbox: mpsc::Receiver<H::Command>,
    completions: mpsc::Receiver<H::Completion>,
    answers: FuturesUnordered<Answer<H::Completion>>,
    /// The commands of the turn being handed over (kept to reuse its allocation).
    batch: VecDeque<H::Command>,
    mailbox_open: bool,
}

/// What [`Host::take_commands`] found.
struct Taken {
    /// It handed commands over (or closed the mailbox).
    handled: bool,
    /// The mailbox answered `Pending`: it holds the task's waker.
    waiting: bool,
}

impl<H: Hosted> Host<H> {
    async fn run(mut self) {
        let now = self.clock.now();
        let mut turn = Turn {
            now,
            answers: &mut self.answers,
        };
        self.hosted.on_start(&mut turn);
        if self.hosted.finished() {
            return;
        }
        // One timer, moved only when the earliest wake-up changes (not re-registered per turn).
        let mut timer = WakeTimer::at(self.clock.to_tokio(Instant(0)));
        let mut armed: Option<Instant> = None;
        std::future::poll_fn(|cx| self.poll_turns(cx, &mut timer, &mut armed)).await;
    }

    fn poll_turns(
        &mut self,
        cx: &mut Context<'_>,
        timer: &mut WakeTimer,
        armed: &mut Option<Instant>,
    ) -> Poll<()> {
        let mut completions_waiting = false;
        let mut commands_waiting = !self.mailbox_open;
        loop {
            let wake = self.hosted.poll_timeout();
            if wake != *armed {
                if let Some(at) = wake {
                    timer.reset(self.clock.to_tokio(at));
                }
                *armed = wake;
            }
            let mut progressed = false;
            if !completions_waiting {
                match self.completions.poll_recv(cx) {
                    Poll::Ready(Some(completion)) => {
                        if !commands_waiting {
                            commands_waiting = self.take_commands(cx).waiting;
                        }
                        self.complete(completion);
                        progressed = true;
                    }
                    Poll::Ready(None) | Poll::Pending => completions_waiting = true,
                }
            }
            // Polled every turn: a call may have added answers, which only a poll registers. Its
            // ready queue makes that cheap when none resolved.
            if !progressed {
                if let Poll::Ready(Some(completion)) = self.answers.poll_next_unpin(cx) {
                    self.complete(completion);
                    progressed = true;
                }
            }
            if !progressed && !commands_waiting {
                let taken = self.take_commands(cx);
                commands_waiting = taken.waiting || !self.mailbox_open;
                progressed = taken.handled;
                if !taken.waiting && self.mailbox_open {
                    // Cut off at the bound: the completions get their turn before more commands.
                    completions_waiting = false;
                }
            }
            if !progressed && armed.is_some() && Future::poll(Pin::new(&mut *timer), cx).is_ready()
            {
                *armed = None;
                let now = self.clock.now();
                if self.hosted.poll_timeout().is_some_and(|at| at <= now) {
                    let mut turn = Turn {
                        now,
                        answers: &mut self.answers,
                    };
                    self.hosted.on_timeout(&mut turn);
                }
                progressed = true;
            }
            if self.hosted.finished() {
                return Poll::Ready(());
            }
            if !progressed {
                return Poll::Pending;
            }
        }
    }

    fn complete(&mut self, completion: H::Completion) {
        let mut turn = Turn {
            now: self.clock.now(),
            answers: &mut self.answers,
        };
        self.hosted.on_completion(&mut turn, completion);
    }

    /// Hands over the commands already in the mailbox, at most [`COMMANDS_PER_TURN_MAX`], as one
    /// batch. A closed mailbox is reported once.
    fn take_commands(&mut self, cx: &mut Context<'_>) -> Taken {
        if !self.mailbox_open {
            return Taken {
                handled: false,
                waiting: false,
            };
        }
        let mut waiting = false;
        let mut closed = false;
        while self.batch.len() < COMMANDS_PER_TURN_MAX {
            match self.mailbox.poll_recv(cx) {
                Poll::Ready(Some(command)) => self.batch.push_back(command),
                Poll::Ready(None) => {
                    closed = true;
                    break;
                }
                Poll::Pending => {
                    waiting = true;
                    break;
                }
            }
        }
        let handled = !self.batch.is_empty() || closed;
        let mut turn = Turn {
            now: self.clock.now(),
            answers: &mut self.answers,
        };
        if !self.batch.is_empty() {
            self.hosted.on_commands(&mut turn, &mut self.batch);
            self.batch.clear();
        }
        if closed {
            self.mailbox_open = false;
            self.hosted.on_mailbox_closed(&mut turn);
        }
        Taken { handled, waiting }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    /// Records what the host hands over, in order.
    struct Recorder {
        log: Arc<Mutex<Vec<String>>>,
        completions: Completions<u32>,
        wake_at: Option<Instant>,
        closed: bool,
    }

    impl Recorder {
        fn note(&self, what: String) {
            self.log.lock().expect("not poisoned").push(what);
        }
    }

    impl Hosted for Recorder {
        type Command = u32;
        type Completion = u32;

        fn on_start(&mut self, turn: &mut Turn<'_, u32>) {
            self.note("start".to_string());
            turn.answer_later(async { 100 });
        }

        fn on_commands(&mut self, turn: &mut Turn<'_, u32>, commands: &mut VecDeque<u32>) {
            let batch: Vec<u32> = commands.drain(..).collect();
            self.note(format!("commands {batch:?}"));
            // Command 1 asks for an I/O completion (delivered through the channel) and a timer.
            if batch.contains(&1) {
                let _ = self.completions.try_send(7);
                self.wake_at = Some(turn.now() + Duration::from_millis(20));
            }
        }

        fn on_mailbox_closed(&mut self, _turn: &mut Turn<'_, u32>) {
            self.note("closed".to_string());
            self.closed = true;
        }

        fn on_completion(&mut self, _turn: &mut Turn<'_, u32>, completion: u32) {
            self.note(format!("completion {completion}"));
        }

        fn on_timeout(&mut self, turn: &mut Turn<'_, u32>) {
            assert!(
                self.wake_at.is_some_and(|at| at <= turn.now()),
                "never early"
            );
            self.wake_at = None;
            self.note("timeout".to_string());
        }

        fn poll_timeout(&self) -> Option<Instant> {
            self.wake_at
        }

        fn finished(&self) -> bool {
            self.closed && self.wake_at.is_none()
        }
    }

    #[tokio::test]
    async fn waiting_commands_come_as_one_batch_after_ready_answers_and_the_timer_fires_once_due() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let config = HostConfig {
            mailbox_capacity: 16,
            completions_capacity: 16,
        };
        let shared = log.clone();
        let mailbox = spawn(config, Clock::start(), move |completions| Recorder {
            log: shared,
            completions,
            wake_at: None,
            closed: false,
        });
        // Sent before the task first runs: one batch.
        for command in [2, 3, 1] {
            mailbox.try_send(command).expect("room");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        mailbox.try_send(4).expect("room");
        drop(mailbox);
        tokio::time::timeout(Duration::from_secs(5), async {
            while !log
                .lock()
                .expect("not poisoned")
                .contains(&"timeout".to_string())
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the timer fired");
        let log = log.lock().expect("not poisoned").clone();
        assert_eq!(
            log,
            [
                "start",
                "completion 100",
                "commands [2, 3, 1]",
                "completion 7",
                "commands [4]",
                "closed",
                "timeout"
            ]
        );
    }
}
