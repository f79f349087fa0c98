//! A small synchronous driver: runs I/O requests on a `&dyn Disk`, one op at a time, with a hook that
//! may act on the disk before each op (rot bytes, crash the machine) — for tests and the simulator.

use super::combiner::{Combiner, CombinerInput, CombinerOutput};
use super::log::{LogInput, LogOutput, PartitionLog};
use crate::actor::Actor;
use crate::disk::{execute_op, Disk, IoCompletion, IoOp, IoRequest};
use crate::time::Instant;

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
        IoOp::ReadAt { .. } | IoOp::Len { .. } | IoOp::List { .. }
    )
}

/// An actor whose outputs include I/O requests and whose inputs include their completions.
pub trait IoActor: Actor {
    /// The I/O request an output carries, if it is one.
    fn io_request(output: &Self::Output) -> Option<&IoRequest>;
    /// The input that feeds a completion back.
    fn io_input(completion: IoCompletion) -> Self::Input;
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
        let Some(request) = A::io_request(&output) else {
            others.push(output);
            continue;
        };
        let completion = run_request(disk, request, hook).ok_or(Crashed)?;
        actor.handle(now, A::io_input(completion));
    }
    Ok(others)
}

impl IoActor for PartitionLog {
    fn io_request(output: &LogOutput) -> Option<&IoRequest> {
        match output {
            LogOutput::Io(request) => Some(request),
            LogOutput::Opened(_)
            | LogOutput::OpenFailed(_)
            | LogOutput::CommitDone { .. }
            | LogOutput::ReadDone { .. }
            | LogOutput::Latched(_) => None,
        }
    }

    fn io_input(completion: IoCompletion) -> LogInput {
        LogInput::Io(completion)
    }
}

impl IoActor for Combiner {
    fn io_request(output: &CombinerOutput) -> Option<&IoRequest> {
        match output {
            CombinerOutput::Io(request) => Some(request),
            CombinerOutput::Committed { .. }
            | CombinerOutput::ReadDone { .. }
            | CombinerOutput::HighWatermark { .. }
            | CombinerOutput::LogOpened { .. }
            | CombinerOutput::LogOpenFailed { .. }
            | CombinerOutput::LogLatched { .. }
            | CombinerOutput::LogRetired { .. } => None,
        }
    }

    fn io_input(completion: IoCompletion) -> CombinerInput {
        CombinerInput::Io(completion)
    }
}
