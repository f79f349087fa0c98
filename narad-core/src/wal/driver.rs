//! A small synchronous driver: runs an actor's I/O requests on any [`Disk`] with a manual clock.
//!
//! Used by the WAL's tests and reusable by the simulator. It decides nothing: it queues each emitted
//! request on its lane (FIFO, like a real I/O worker per lane), runs requests when told to (a whole
//! request, a single op of one, or everything until idle), feeds each completion back together with
//! its request, and feeds the tick input when the actor's timeout has passed. Outputs that are not I/O
//! are collected for the caller. Running ops one at a time lets a test crash the disk between a write
//! and its sync.

use std::collections::{BTreeMap, VecDeque};

use super::{IngressWal, OpenError, Opened, WalConfig, WalInput, WalOutput, WalRecovery};
use crate::actor::Actor;
use crate::disk::{execute_op, join, Disk, IoCompletion, IoLane, IoReply, IoRequest};
use crate::ids::Seq;
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
    /// The input fed once the actor's timeout has passed.
    fn tick() -> Self::Input;
}

impl IoActor for IngressWal {
    fn into_io(output: WalOutput) -> Result<IoRequest, WalOutput> {
        match output {
            WalOutput::Io(request) => Ok(request),
            other @ (WalOutput::AppendDone { .. }
            | WalOutput::Durable { .. }
            | WalOutput::ReadDone { .. }
            | WalOutput::Latched { .. }
            | WalOutput::Warning(_)) => Err(other),
        }
    }

    fn io_done(request: IoRequest, completion: IoCompletion) -> WalInput {
        WalInput::IoDone {
            request,
            completion,
        }
    }

    fn tick() -> WalInput {
        WalInput::Tick
    }
}

/// Opens the WAL over `disk`: lists the directory, feeds every segment to [`WalRecovery`] and returns
/// what it returns. The actor's repair request is its first output: run it before relying on the WAL.
pub fn open_wal(disk: &dyn Disk, config: WalConfig, checkpoint: Seq) -> Result<Opened, OpenError> {
    let dir = config.dir.clone();
    let mut recovery = WalRecovery::new(config, checkpoint)?;
    let names = disk.list(&dir).map_err(|fault| OpenError::Io {
        path: dir.clone(),
        fault,
    })?;
    for name in recovery.plan(&names) {
        let path = join(&dir, &name);
        let read = disk
            .len(&path)
            .and_then(|len| disk.read_at(&path, 0, len as usize));
        let bytes = read.map_err(|fault| OpenError::Io { path, fault })?;
        recovery.feed_segment(&name, bytes)?;
    }
    recovery.finish()
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
        self.actor.handle(self.now, input);
        self.drain();
    }

    /// Moves the clock to `at` (never backwards) and feeds ticks while the timeout has passed.
    pub fn advance_to(&mut self, at: Instant) {
        assert!(at >= self.now, "the clock never goes back");
        self.now = at;
        for _ in 0..TICKS_PER_ADVANCE_MAX {
            match self.actor.poll_timeout() {
                Some(deadline) if deadline <= self.now => self.handle(A::tick()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::sim::SimDisk;
    use crate::disk::IoOp;
    use crate::wal::{AppendId, WalLanes};

    fn config() -> WalConfig {
        WalConfig {
            dir: "wal".into(),
            segment_bytes_max: 4096,
            record_bytes_max: 100,
            lanes: WalLanes::default(),
            ..WalConfig::default()
        }
    }

    #[test]
    fn run_op_runs_one_op_at_a_time_and_feeds_the_completion_after_the_last() {
        let disk = SimDisk::new(1);
        let opened = open_wal(&disk, config(), Seq(0)).unwrap();
        let mut driver = SyncDriver::new(&disk, opened.wal, Instant::ZERO);
        driver.run_until_idle();
        driver.take_outputs();
        driver.handle(WalInput::Append {
            id: AppendId(1),
            record: b"abc".to_vec(),
        });
        let lane = IoLane(0);
        assert!(matches!(
            driver.head(lane).unwrap().ops[0],
            IoOp::WriteAt { .. }
        ));
        assert!(driver.run_op(lane), "the write");
        assert_eq!(
            driver.take_outputs(),
            vec![],
            "no answer between the write and the sync"
        );
        assert_eq!(
            disk.durable_image("wal/00000000000000000000.wal"),
            Some(Vec::new())
        );
        assert!(driver.run_op(lane), "the sync");
        assert_eq!(
            driver.take_outputs().len(),
            2,
            "the ack and the durable frontier"
        );
        assert!(!driver.run_op(lane), "the lane is idle");
        assert_eq!(
            disk.durable_image("wal/00000000000000000000.wal")
                .unwrap()
                .len(),
            23
        );
    }

    #[test]
    fn advance_to_feeds_a_tick_only_once_the_timeout_has_passed() {
        let disk = SimDisk::new(2);
        let opened = open_wal(&disk, config(), Seq(0)).unwrap();
        let mut driver = SyncDriver::new(&disk, opened.wal, Instant::ZERO);
        driver.handle(WalInput::Append {
            id: AppendId(1),
            record: b"abc".to_vec(),
        });
        // The repair is still queued: the record waits, and the backstop is armed 10 ms out.
        assert_eq!(
            driver.actor().poll_timeout(),
            Some(Instant::from_millis(10))
        );
        driver.advance_to(Instant::from_millis(9));
        assert_eq!(
            driver.actor().poll_timeout(),
            Some(Instant::from_millis(10))
        );
        driver.advance_to(Instant::from_millis(10));
        assert_eq!(
            driver.actor().poll_timeout(),
            Some(Instant::from_millis(20)),
            "re-armed"
        );
        assert_eq!(
            driver.pending_requests(),
            1,
            "the tick cannot pass the repair"
        );
    }
}
