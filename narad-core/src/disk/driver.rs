//! Synchronous drivers for I/O actors: run an actor's [`IoRequest`]s on any [`Disk`] with a manual clock.
//!
//! Used by the core's tests and reusable by the simulator. They decide nothing. [`SyncDriver`] queues
//! each emitted request on its lane (FIFO, like a real I/O worker per lane), runs requests when told to
//! (a whole request, a single op of one, or everything until idle), feeds each completion back together
//! with its request, and feeds the tick input when the actor's timeout has passed; running ops one at a
//! time lets a test crash the disk between a write and its sync. [`run_to_idle`] runs every request in
//! emission order with an [`IoHook`] that may act on the disk (rot bytes, crash the machine) before
//! each op.

use std::collections::{BTreeMap, VecDeque};

use super::{execute_op, Disk, IoCompletion, IoLane, IoOp, IoReply, IoRequest};
use crate::actor::Actor;
use crate::time::Instant;

/// Requests run by [`SyncDriver::run_until_idle`] before it decides the actor livelocks.
pub const RUN_UNTIL_IDLE_REQUESTS_MAX: usize = 1_000_000;

/// Ticks fed in one [`SyncDriver::advance_to`] before it decides the actor's timeout never moves on.
pub const TICKS_PER_ADVANCE_MAX: usize = 1_000;

/// An actor whose I/O requests a [`SyncDriver`] can run.
pub trait IoActor: Actor {
    /// Splits an output into an I/O request to run, or anything else (handed to the caller).
    fn into_io(output: Self::Output) -> Result<IoRequest, Self::Output>;
    /// The input that reports a request's completion.
    fn io_done(request: IoRequest, completion: IoCompletion) -> Self::Input;
    /// The input fed once the actor's timeout has passed; `None` for an actor that never sets one.
    fn tick() -> Option<Self::Input>;
}

/// A request being run, with the replies of the ops done so far.
#[derive(Debug)]
struct Running {
    request: IoRequest,
    replies: Vec<IoReply>,
}

/// Runs one actor over a disk, synchronously; see the module documentation.
pub struct SyncDriver<'d, A: IoActor> {
    disk: &'d dyn Disk,
    actor: A,
    now: Instant,
    lanes: BTreeMap<IoLane, VecDeque<Running>>,
    outputs: Vec<A::Output>,
}

impl<'d, A: IoActor> SyncDriver<'d, A> {
    /// Takes over `actor` (draining what it already emitted) at time `now`.
    pub fn new(disk: &'d dyn Disk, actor: A, now: Instant) -> Self {
        let mut driver = SyncDriver {
            disk,
            actor,
            now,
            lanes: BTreeMap::new(),
            outputs: Vec::new(),
        };
        driver.drain();
        driver
    }

    /// The actor.
    pub fn actor(&self) -> &A {
        &self.actor
    }

    /// The current time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Feeds one input at the current time and drains the outputs.
    pub fn handle(&mut self, input: A::Input) {
        crate::feed(&mut self.actor, self.now, input);
        self.drain();
    }

    /// Moves the clock to `at` (never backwards) and feeds ticks while the timeout has passed.
    pub fn advance_to(&mut self, at: Instant) {
        assert!(at >= self.now, "the clock never goes back");
        self.now = at;
        for _ in 0..TICKS_PER_ADVANCE_MAX {
            match self.actor.poll_timeout() {
                Some(deadline) if deadline <= self.now => {
                    let tick = A::tick().expect("an actor that sets a timeout has a tick input");
                    self.handle(tick)
                }
                _ => return,
            }
        }
        panic!("the actor's timeout stays in the past after {TICKS_PER_ADVANCE_MAX} ticks");
    }

    /// Lanes with requests waiting, in lane order.
    pub fn busy_lanes(&self) -> Vec<IoLane> {
        self.lanes
            .iter()
            .filter(|(_, queue)| !queue.is_empty())
            .map(|(&lane, _)| lane)
            .collect()
    }

    /// The request at the head of `lane`, if any.
    pub fn head(&self, lane: IoLane) -> Option<&IoRequest> {
        self.lanes
            .get(&lane)
            .and_then(|queue| queue.front())
            .map(|running| &running.request)
    }

    /// Requests waiting on every lane.
    pub fn pending_requests(&self) -> usize {
        self.lanes.values().map(VecDeque::len).sum()
    }

    /// Runs the next op of the request at the head of `lane`; completes the request when it was the
    /// last op or it failed. Returns false when the lane is idle.
    pub fn run_op(&mut self, lane: IoLane) -> bool {
        let Some(running) = self.lanes.get_mut(&lane).and_then(VecDeque::front_mut) else {
            return false;
        };
        let index = running.replies.len();
        let outcome = match running.request.ops.get(index) {
            Some(op) => execute_op(self.disk, op).map_err(|fault| (index, fault)),
            None => Ok(IoReply::Done),
        };
        let finished = match outcome {
            Ok(reply) => {
                if index < running.request.ops.len() {
                    running.replies.push(reply);
                }
                if running.replies.len() == running.request.ops.len() {
                    Some(Ok(()))
                } else {
                    None
                }
            }
            Err(failure) => Some(Err(failure)),
        };
        if let Some(finished) = finished {
            let running = self
                .lanes
                .get_mut(&lane)
                .and_then(VecDeque::pop_front)
                .expect("the head ran above");
            let completion = IoCompletion {
                id: running.request.id,
                result: finished.map(|()| running.replies),
            };
            self.handle(A::io_done(running.request, completion));
        }
        true
    }

    /// Runs the whole request at the head of `lane`. Returns false when the lane is idle.
    pub fn run_request(&mut self, lane: IoLane) -> bool {
        let Some(id) = self.head(lane).map(|request| request.id) else {
            return false;
        };
        while self.head(lane).map(|request| request.id) == Some(id) {
            self.run_op(lane);
        }
        true
    }

    /// Runs requests (lowest busy lane first) until no lane has any. Returns how many ran.
    pub fn run_until_idle(&mut self) -> usize {
        for ran in 0..RUN_UNTIL_IDLE_REQUESTS_MAX {
            let Some(&lane) = self.busy_lanes().first() else {
                return ran;
            };
            self.run_request(lane);
        }
        panic!("still busy after {RUN_UNTIL_IDLE_REQUESTS_MAX} requests");
    }

    /// Takes the non-I/O outputs collected so far, in emission order.
    pub fn take_outputs(&mut self) -> Vec<A::Output> {
        std::mem::take(&mut self.outputs)
    }

    /// Gives the actor back; requests not yet run are dropped (as a crash would).
    pub fn into_actor(self) -> A {
        self.actor
    }

    fn drain(&mut self) {
        while let Some(output) = self.actor.poll_output() {
            match A::into_io(output) {
                Ok(request) => self
                    .lanes
                    .entry(request.lane)
                    .or_default()
                    .push_back(Running {
                        request,
                        replies: Vec::new(),
                    }),
                Err(output) => self.outputs.push(output),
            }
        }
    }
}

/// What the hook wants done with the op about to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookVerdict {
    /// Run it.
    Run,
    /// The machine stops here (the harness crashes the disk): this op and the rest do not run and no
    /// completion is delivered.
    Crash,
}

/// Called before each op of each request the driver runs.
pub trait IoHook {
    /// Inspect (or act on the disk before) `request.ops[index]`.
    fn before_op(&mut self, disk: &dyn Disk, request: &IoRequest, index: usize) -> HookVerdict;
}

/// A hook that runs everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHook;

impl IoHook for NoHook {
    fn before_op(&mut self, _disk: &dyn Disk, _request: &IoRequest, _index: usize) -> HookVerdict {
        HookVerdict::Run
    }
}

/// Runs `request` op by op; `None` when the hook crashed the machine part-way.
pub fn run_request(
    disk: &dyn Disk,
    request: &IoRequest,
    hook: &mut dyn IoHook,
) -> Option<IoCompletion> {
    let mut replies = Vec::with_capacity(request.ops.len());
    for (index, op) in request.ops.iter().enumerate() {
        match hook.before_op(disk, request, index) {
            HookVerdict::Run => {}
            HookVerdict::Crash => return None,
        }
        match execute_op(disk, op) {
            Ok(reply) => replies.push(reply),
            Err(fault) => {
                return Some(IoCompletion {
                    id: request.id,
                    result: Err((index, fault)),
                })
            }
        }
    }
    Some(IoCompletion {
        id: request.id,
        result: Ok(replies),
    })
}

/// True when `op` only reads.
pub fn is_read(op: &IoOp) -> bool {
    matches!(
        op,
        IoOp::ReadAt { .. } | IoOp::ReadCrc { .. } | IoOp::Len { .. } | IoOp::List { .. }
    )
}

/// The machine crashed (the hook said so) while running a request; the actor must be dropped and the
/// disk crashed by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crashed;

/// Runs every I/O request the actor emits, in emission order, feeding completions back at `now`,
/// until it emits no more; returns the other outputs in order.
pub fn run_to_idle<A: IoActor>(
    actor: &mut A,
    now: Instant,
    disk: &dyn Disk,
    hook: &mut dyn IoHook,
) -> Result<Vec<A::Output>, Crashed> {
    let mut others = Vec::new();
    while let Some(output) = actor.poll_output() {
        let request = match A::into_io(output) {
            Ok(request) => request,
            Err(other) => {
                others.push(other);
                continue;
            }
        };
        let completion = run_request(disk, &request, hook).ok_or(Crashed)?;
        crate::feed(actor, now, A::io_done(request, completion));
    }
    Ok(others)
}
