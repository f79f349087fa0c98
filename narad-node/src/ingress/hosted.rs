//! The ingress host's [`Hosted`] value: the turn logic that ties the WAL, the checkpointer and the
//! dispatcher together.

use super::runner::Runner;
use super::*;

/// The ingress host: the WAL, the checkpointer and (once started) the dispatcher in one task.
///
/// After every input the WAL's and the checkpointer's outputs are routed first (a flush's I/O leaves,
/// its callers are answered), then the dispatcher is fed what the WAL answered it (`Durable`, its
/// read, its checkpoint store), and the WAL again what the dispatcher asked, until neither has more.
pub(super) struct Ingress {
    pub(super) runner: Runner,
    pub(super) dispatch: Option<Box<DispatchPart>>,
    pub(super) finished: bool,
}

impl Ingress {
    /// Routes both ways until quiet; see [`Ingress`].
    fn settle(&mut self, turn: &mut Turn<'_, Event>) {
        self.runner.drain();
        match self.dispatch.as_deref_mut() {
            None => self.runner.dispatch_inputs.clear(),
            Some(dispatch) => {
                loop {
                    let durable_next = self.runner.durable_next;
                    let fed = dispatch.on_wal(turn, &mut self.runner, durable_next);
                    match self.runner.dispatch_inputs.pop_front() {
                        Some(input) => dispatch.feed(turn, &mut self.runner, input),
                        None if !fed => break,
                        None => {}
                    }
                    self.runner.drain();
                }
                dispatch.publish();
            }
        }
        self.finished = self.runner.try_finish();
    }
}

impl Hosted for Ingress {
    type Command = Command;
    type Completion = Event;

    fn on_start(&mut self, turn: &mut Turn<'_, Event>) {
        self.settle(turn);
    }

    fn on_commands(&mut self, turn: &mut Turn<'_, Event>, commands: &mut VecDeque<Command>) {
        for command in commands.drain(..) {
            if self.runner.stopping {
                // No command is taken once stopping; its caller sees the host stopped.
                continue;
            }
            match command {
                Command::Append { .. } | Command::AppendMany { .. } => {
                    self.runner.stage_append(command);
                    continue;
                }
                Command::StartDispatch { mut part, reply } => {
                    self.runner.feed_appends();
                    self.settle(turn);
                    let status = self.runner.status.borrow().clone();
                    part.start(turn, &mut self.runner, &status);
                    self.dispatch = Some(part);
                    let _ = reply.send(());
                }
                Command::StopDispatch { reply } => {
                    if let Some(dispatch) = self.dispatch.as_deref_mut() {
                        dispatch.stop();
                    }
                    let _ = reply.send(());
                }
                other @ (Command::Read { .. }
                | Command::StoreCheckpoint { .. }
                | Command::Shutdown { .. }
                | Command::AcceptTime { .. }) => {
                    self.runner.feed_appends();
                    self.settle(turn);
                    self.runner.on_command(other);
                }
            }
        }
        self.runner.feed_appends();
        self.settle(turn);
    }

    fn on_mailbox_closed(&mut self, turn: &mut Turn<'_, Event>) {
        self.runner.begin_stop();
        self.settle(turn);
    }

    fn on_completion(&mut self, turn: &mut Turn<'_, Event>, event: Event) {
        match event {
            Event::Dispatch(event) => {
                if let Some(dispatch) = self.dispatch.as_deref_mut() {
                    dispatch.on_event(turn, &mut self.runner, event);
                }
            }
            io @ (Event::Wal(..) | Event::Checkpoint(_)) => self.runner.on_io(io),
        }
        self.settle(turn);
    }

    fn on_timeout(&mut self, turn: &mut Turn<'_, Event>) {
        self.runner.on_tick();
        if let Some(dispatch) = self.dispatch.as_deref_mut() {
            dispatch.on_timeout(turn, &mut self.runner);
        }
        self.settle(turn);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let wal = earliest(
            self.runner.wal.poll_timeout(),
            self.runner.checkpointer.poll_timeout(),
        );
        earliest(
            wal,
            self.dispatch
                .as_deref()
                .and_then(DispatchPart::poll_timeout),
        )
    }

    fn finished(&self) -> bool {
        self.finished
    }
}

pub(super) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}
