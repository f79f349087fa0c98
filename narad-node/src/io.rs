//! The I/O executor: runs an actor's [`IoRequest`]s on a [`Disk`] and delivers each request back with
//! its [`IoCompletion`] to the actor's mailbox (the WAL reuses the request's buffers).
//!
//! It decides nothing: no retries, no reordering, no dropping. Lanes are an actor *instance's* own
//! ordering domains: an executor serves one actor through [`IoExecutor::submit`], or many instances of
//! one kind (every partition's combiner) through [`IoExecutor::submit_for`], which keys the
//! serialization by `(instance, lane)` and hands the instance back with each completion; an instance
//! that is gone gives its lanes back with [`IoExecutor::forget`]. Each `(instance, lane)` holds at most
//! [`LANE_QUEUE_MAX`] requests queued or running; an actor keeps far fewer outstanding, so a full lane
//! is a programmer error and panics.
//!
//! # Contract
//! Requests of one `(instance, lane)` run one at a time in submission order, and their completions are
//! delivered in that order. Lanes with different numbers run concurrently.
//!
//! # Threads (a real node)
//! - **An executor for one actor** ([`IoExecutor::new`]: the ingress WAL, the checkpointer) runs each
//!   lane on an OS thread of its own, started by the lane's first request: it takes the lane's
//!   requests from a channel (bounded by the count above), runs each on the disk and sends the
//!   completion straight into the mailbox. A request costs two thread hand-offs (to the lane's thread,
//!   back to the actor's task), where an async lane task plus `spawn_blocking` per request cost four
//!   and a blocking-pool round trip; the WAL's group commit, on every produce's path, is one such
//!   request. Should the OS refuse the thread, the lane falls back to the async task below.
//! - **A keyed executor** ([`IoExecutor::new_keyed`]: one instance per partition, thousands on a big
//!   node) keeps a queue per `(instance, lane)` and runs them on a pool of worker threads of its own
//!   (at most [`POOL_WORKERS_MAX`], started on demand, each ending after [`POOL_WORKER_KEEP_ALIVE`]
//!   idle): a worker takes the next ready lane, runs its oldest request and delivers the completion
//!   before the lane's next request may be taken. An idle partition holds no thread (why not one
//!   thread per lane number, and why not a task per lane with `spawn_blocking`: `docs/decisions.md`).
//!
//! Under `--cfg madsim` every `(instance, lane)` is such a task, and runs each request op by op in the
//! simulated task, taking the ops' simulated latencies: one wait per sync for the ops up to it (and a
//! read-back right after the last sync), one per op after the last sync (see [`run_request`]).

use std::collections::BTreeMap;
#[cfg(not(madsim))]
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

#[cfg(not(madsim))]
use narad_core::disk::execute;
use narad_core::disk::{Disk, IoCompletion, IoLane, IoRequest};
#[cfg(not(madsim))]
use narad_core::IoFault;
use tokio::sync::mpsc;

/// The most requests one lane may hold queued or running.
pub const LANE_QUEUE_MAX: usize = 64;

/// Names one actor instance among those an executor serves ([`IoExecutor::submit_for`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ActorKey(pub u64);

/// Wraps a finished request (and, for a keyed executor, the instance that issued it) into the
/// mailbox's message type.
enum Wrap<M> {
    Single(fn(IoRequest, IoCompletion) -> M),
    Keyed(fn(ActorKey, IoRequest, IoCompletion) -> M),
}

impl<M> Clone for Wrap<M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M> Copy for Wrap<M> {}

/// Runs one actor's (or one kind of actor's) I/O; see the module documentation.
pub struct IoExecutor<M> {
    disk: Arc<dyn Disk>,
    deliver: Deliver<M>,
    lanes: Mutex<Lanes>,
    /// A real node's keyed executor: its lanes' requests run on its worker pool.
    #[cfg(not(madsim))]
    pool: Option<Arc<Pool<M>>>,
}

/// The executor's routes.
#[derive(Default)]
struct Lanes {
    /// Every `(instance, lane)` used and not forgotten.
    lanes: BTreeMap<(ActorKey, IoLane), LaneSender>,
    /// The thread of each lane (a real node's one-actor executor).
    #[cfg(not(madsim))]
    threads: BTreeMap<IoLane, std::sync::mpsc::Sender<LaneJob>>,
}

/// A request on its way to a lane thread.
#[cfg(not(madsim))]
struct LaneJob {
    actor: ActorKey,
    request: IoRequest,
    /// The `(instance, lane)`'s count of requests queued or running.
    held: Arc<AtomicUsize>,
}

/// Where an `(instance, lane)`'s requests go: its lane's thread, or its own async task.
enum LaneSender {
    #[cfg(not(madsim))]
    Thread {
        thread: std::sync::mpsc::Sender<LaneJob>,
        held: Arc<AtomicUsize>,
    },
    Task(mpsc::Sender<IoRequest>),
}

/// Why a request could not be queued on its lane.
enum LaneRefused {
    Full,
    Closed,
}

impl LaneSender {
    #[cfg_attr(madsim, allow(unused_variables))]
    fn try_send(&self, actor: ActorKey, request: IoRequest) -> Result<(), LaneRefused> {
        match self {
            #[cfg(not(madsim))]
            LaneSender::Thread { thread, held } => {
                if held.fetch_add(1, Ordering::AcqRel) >= LANE_QUEUE_MAX {
                    held.fetch_sub(1, Ordering::AcqRel);
                    return Err(LaneRefused::Full);
                }
                let job = LaneJob {
                    actor,
                    request,
                    held: Arc::clone(held),
                };
                thread.send(job).map_err(|_| {
                    held.fetch_sub(1, Ordering::AcqRel);
                    LaneRefused::Closed
                })
            }
            LaneSender::Task(sender) => sender.try_send(request).map_err(|error| match error {
                mpsc::error::TrySendError::Full(_) => LaneRefused::Full,
                mpsc::error::TrySendError::Closed(_) => LaneRefused::Closed,
            }),
        }
    }
}

impl<M> std::fmt::Debug for IoExecutor<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoExecutor").finish_non_exhaustive()
    }
}

impl<M: Send + 'static> IoExecutor<M> {
    /// An executor over `disk` that delivers each request and its completion, wrapped by `wrap`, into `mailbox`.
    pub fn new(
        disk: Arc<dyn Disk>,
        mailbox: mpsc::Sender<M>,
        wrap: fn(IoRequest, IoCompletion) -> M,
    ) -> Self {
        IoExecutor {
            disk,
            deliver: Deliver {
                mailbox,
                wrap: Wrap::Single(wrap),
            },
            lanes: Mutex::new(Lanes::default()),
            #[cfg(not(madsim))]
            pool: None,
        }
    }

    /// An executor for many instances of one actor kind: each completion is delivered wrapped by
    /// `wrap` together with the [`ActorKey`] its request was submitted for.
    pub fn new_keyed(
        disk: Arc<dyn Disk>,
        mailbox: mpsc::Sender<M>,
        wrap: fn(ActorKey, IoRequest, IoCompletion) -> M,
    ) -> Self {
        let deliver = Deliver {
            mailbox,
            wrap: Wrap::Keyed(wrap),
        };
        IoExecutor {
            #[cfg(not(madsim))]
            pool: Some(Arc::new(Pool::new(Arc::clone(&disk), deliver.clone()))),
            disk,
            deliver,
            lanes: Mutex::new(Lanes::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lanes> {
        self.lanes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `request` on its lane; never blocks. Must be called inside the runtime.
    ///
    /// Panics when the lane already holds [`LANE_QUEUE_MAX`] requests: actors bound what they keep
    /// outstanding far below that.
    pub fn submit(&self, request: IoRequest) {
        self.submit_for(ActorKey(0), request);
    }

    /// Queues `request` on the lane `(actor, request.lane)`: after that instance's earlier requests on
    /// the same lane. Panics like [`IoExecutor::submit`].
    pub fn submit_for(&self, actor: ActorKey, request: IoRequest) {
        #[cfg(not(madsim))]
        if let Some(pool) = &self.pool {
            return pool.submit(actor, request);
        }
        let mut lanes = self.lock();
        let lane = request.lane;
        if !lanes.lanes.contains_key(&(actor, lane)) {
            let sender = self.start_lane(&mut lanes, actor, lane);
            lanes.lanes.insert((actor, lane), sender);
        }
        let sender = &lanes.lanes[&(actor, lane)];
        match sender.try_send(actor, request) {
            Ok(()) => {}
            Err(LaneRefused::Full) => {
                panic!("I/O lane {lane:?} holds {LANE_QUEUE_MAX} requests: the actor exceeded its bound")
            }
            Err(LaneRefused::Closed) => {
                // The lane ended because the mailbox is gone: nobody would read the completion.
            }
        }
    }

    /// Routes a new `(actor, lane)` of a one-actor executor to its lane's thread, started now (an
    /// async task if the OS refuses the thread). A keyed executor's lanes never get here: its worker
    /// pool takes them.
    #[cfg(not(madsim))]
    fn start_lane(&self, lanes: &mut Lanes, actor: ActorKey, lane: IoLane) -> LaneSender {
        let live = lanes.threads.get(&lane).cloned();
        let thread = match live {
            Some(thread) => Some(thread),
            None => {
                let (sender, receiver) = std::sync::mpsc::channel();
                let disk = Arc::clone(&self.disk);
                let deliver = self.deliver.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("narad-io-lane{}", lane.0))
                    .spawn(move || run_lane_thread(&*disk, &receiver, &deliver));
                match spawned {
                    Ok(_) => {
                        lanes.threads.insert(lane, sender.clone());
                        Some(sender)
                    }
                    Err(error) => {
                        tracing::warn!(%error, lane = lane.0, "no thread for an I/O lane; it runs on the blocking pool");
                        None
                    }
                }
            }
        };
        match thread {
            Some(thread) => LaneSender::Thread {
                thread,
                held: Arc::new(AtomicUsize::new(0)),
            },
            None => start_lane_task(Arc::clone(&self.disk), actor, self.deliver.clone()),
        }
    }

    /// Routes a new `(actor, lane)` to an async task of its own (every lane under the simulator).
    #[cfg(madsim)]
    fn start_lane(&self, _lanes: &mut Lanes, actor: ActorKey, _lane: IoLane) -> LaneSender {
        start_lane_task(Arc::clone(&self.disk), actor, self.deliver.clone())
    }

    /// Lets go of every lane of `actor`: the requests already queued on them still run and are
    /// delivered. A later [`IoExecutor::submit_for`] for the key starts fresh lanes.
    pub fn forget(&self, actor: ActorKey) {
        // A worker pool keeps a lane only while it holds requests: nothing to let go of.
        self.lock().lanes.retain(|(key, _), _| *key != actor);
    }

    /// `(instance, lane)`s currently kept (for tests and leak checks): with a worker pool, those
    /// holding requests.
    pub fn lanes(&self) -> usize {
        #[cfg(not(madsim))]
        if let Some(pool) = &self.pool {
            return pool.lock().lanes.len();
        }
        self.lock().lanes.len()
    }
}

#[cfg(not(madsim))]
impl<M> Drop for IoExecutor<M> {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            // Queued requests still run; then the workers end instead of waiting for their keep-alive.
            pool.lock().executor_gone = true;
            pool.work.notify_all();
        }
    }
}

/// The most worker threads of a keyed executor's pool.
#[cfg(not(madsim))]
pub const POOL_WORKERS_MAX: usize = 32;

/// How long a pool worker waits idle before it ends: a thread keeps the allocator pages of what it
/// read until it allocates again or ends.
#[cfg(not(madsim))]
pub const POOL_WORKER_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(1);

/// A keyed executor's worker threads (a real node): started on demand up to [`POOL_WORKERS_MAX`],
/// each takes the next ready `(instance, lane)` from one queue, runs its oldest request, delivers the
/// completion straight into the mailbox and only then lets the lane's next request be taken (so a
/// lane's requests run one at a time and complete in order). A request costs two thread hand-offs (to
/// a worker, back to the actor's task), where an async lane task plus `spawn_blocking` cost four;
/// under load a worker finds the next lane ready without sleeping. An idle partition holds nothing.
#[cfg(not(madsim))]
struct Pool<M> {
    disk: Arc<dyn Disk>,
    deliver: Deliver<M>,
    state: Mutex<PoolState>,
    work: std::sync::Condvar,
}

#[cfg(not(madsim))]
#[derive(Default)]
struct PoolState {
    /// Lanes holding requests (queued or running).
    lanes: std::collections::HashMap<(ActorKey, IoLane), PoolLane>,
    /// Lanes with a queued request and none running, oldest first: exactly those.
    ready: std::collections::VecDeque<(ActorKey, IoLane)>,
    workers: usize,
    /// Workers waiting for work.
    idle: usize,
    /// The mailbox is gone: nothing runs any more.
    closed: bool,
    executor_gone: bool,
}

#[cfg(not(madsim))]
#[derive(Default)]
struct PoolLane {
    queue: std::collections::VecDeque<IoRequest>,
    running: bool,
}

#[cfg(not(madsim))]
impl<M> Pool<M> {
    fn new(disk: Arc<dyn Disk>, deliver: Deliver<M>) -> Self {
        Pool {
            disk,
            deliver,
            state: Mutex::new(PoolState::default()),
            work: std::sync::Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        // No code panics while holding it; a poisoned state is still consistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(not(madsim))]
impl<M: Send + 'static> Pool<M> {
    fn submit(self: &Arc<Self>, actor: ActorKey, request: IoRequest) {
        let key = (actor, request.lane);
        let mut state = self.lock();
        if state.closed {
            // Nobody would read the completion.
            return;
        }
        let lane = state.lanes.entry(key).or_default();
        let held = lane.queue.len() + usize::from(lane.running);
        if held >= LANE_QUEUE_MAX {
            drop(state);
            panic!(
                "I/O lane {:?} holds {LANE_QUEUE_MAX} requests: the actor exceeded its bound",
                key.1
            );
        }
        lane.queue.push_back(request);
        if lane.running || lane.queue.len() > 1 {
            // Taken after the lane's earlier requests.
            return;
        }
        state.ready.push_back(key);
        if state.ready.len() > state.idle && state.workers < POOL_WORKERS_MAX {
            let pool = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("narad-io-pool".into())
                .spawn(move || pool.run_worker());
            match spawned {
                Ok(_) => state.workers += 1,
                // The running workers still take every ready lane, one after the other.
                Err(error) if state.workers > 0 => {
                    tracing::warn!(%error, "no new I/O worker thread; the running ones take the work")
                }
                Err(error) => panic!("cannot start any I/O worker thread: {error}"),
            }
        }
        drop(state);
        self.work.notify_one();
    }

    fn run_worker(&self) {
        let mut state = self.lock();
        loop {
            if let Some(key) = state.ready.pop_front() {
                let lane = state.lanes.get_mut(&key).expect("a ready lane is held");
                let request = lane.queue.pop_front().expect("a ready lane has a request");
                lane.running = true;
                drop(state);
                let (request, completion) = execute_caught(&*self.disk, request);
                let message = self.deliver.wrap(key.0, request, completion);
                let delivered = self.deliver.mailbox.blocking_send(message).is_ok();
                state = self.lock();
                if !delivered {
                    state.closed = true;
                    state.lanes.clear();
                    state.ready.clear();
                    continue;
                }
                let lane = state.lanes.get_mut(&key).expect("a running lane is held");
                lane.running = false;
                if lane.queue.is_empty() {
                    state.lanes.remove(&key);
                } else {
                    state.ready.push_back(key);
                }
                continue;
            }
            if state.closed || state.executor_gone {
                break;
            }
            state.idle += 1;
            let (next, waited) = self
                .work
                .wait_timeout(state, POOL_WORKER_KEEP_ALIVE)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            state = next;
            state.idle -= 1;
            if waited.timed_out() && state.ready.is_empty() {
                break;
            }
        }
        state.workers -= 1;
    }
}

/// Where completions go.
struct Deliver<M> {
    mailbox: mpsc::Sender<M>,
    wrap: Wrap<M>,
}

impl<M> Clone for Deliver<M> {
    fn clone(&self) -> Self {
        Deliver {
            mailbox: self.mailbox.clone(),
            wrap: self.wrap,
        }
    }
}

impl<M> Deliver<M> {
    fn wrap(&self, actor: ActorKey, request: IoRequest, completion: IoCompletion) -> M {
        match self.wrap {
            Wrap::Single(wrap) => wrap(request, completion),
            Wrap::Keyed(wrap) => wrap(actor, request, completion),
        }
    }
}

/// A lane's thread: runs its requests in the order they were queued and delivers each completion,
/// until the executor is gone (and the queued requests ran) or the mailbox is.
#[cfg(not(madsim))]
fn run_lane_thread<M: Send + 'static>(
    disk: &dyn Disk,
    jobs: &std::sync::mpsc::Receiver<LaneJob>,
    deliver: &Deliver<M>,
) {
    while let Ok(job) = jobs.recv() {
        let (request, completion) = execute_caught(disk, job.request);
        job.held.fetch_sub(1, Ordering::AcqRel);
        let message = deliver.wrap(job.actor, request, completion);
        if deliver.mailbox.blocking_send(message).is_err() {
            return;
        }
    }
}

/// Runs `request`; a panicking disk is a bug, but the actor still gets an answer (a failure) instead
/// of waiting for ever.
#[cfg(not(madsim))]
fn execute_caught(disk: &dyn Disk, request: IoRequest) -> (IoRequest, IoCompletion) {
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| execute(disk, &request)));
    match ran {
        Ok(completion) => (request, completion),
        Err(_) => {
            let id = request.id;
            let fault = IoFault::Other("I/O worker failed: panicked".to_string());
            (
                request,
                IoCompletion {
                    id,
                    result: Err((0, fault)),
                },
            )
        }
    }
}

/// Starts an async task for one `(instance, lane)`.
fn start_lane_task<M: Send + 'static>(
    disk: Arc<dyn Disk>,
    actor: ActorKey,
    deliver: Deliver<M>,
) -> LaneSender {
    let (sender, receiver) = mpsc::channel(LANE_QUEUE_MAX);
    tokio::spawn(run_lane(disk, receiver, actor, deliver));
    LaneSender::Task(sender)
}

async fn run_lane<M: Send + 'static>(
    disk: Arc<dyn Disk>,
    mut requests: mpsc::Receiver<IoRequest>,
    actor: ActorKey,
    deliver: Deliver<M>,
) {
    while let Some(request) = requests.recv().await {
        let (request, completion) = run_request(Arc::clone(&disk), request).await;
        let message = deliver.wrap(actor, request, completion);
        if crate::mailbox::send(&deliver.mailbox, message)
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Runs one request on `disk` and hands it back with its completion: on the blocking pool in a real
/// node; under `--cfg madsim` op by op in the simulated task, taking the ops' simulated
/// [`Disk::latency`] (see the madsim variant), so a crash can fall inside a request and slow disks slow
/// the node.
#[cfg(not(madsim))]
pub async fn run_request(disk: Arc<dyn Disk>, request: IoRequest) -> (IoRequest, IoCompletion) {
    let id = request.id;
    let lane = request.lane;
    let job = tokio::task::spawn_blocking(move || {
        let completion = execute(&*disk, &request);
        (request, completion)
    });
    match job.await {
        Ok(done) => done,
        // A panicking disk is a bug; still answer, so the actor sees a failure instead of waiting.
        // The request went down with the worker: an empty one with its id and lane stands in.
        Err(error) => (
            IoRequest {
                id,
                lane,
                ops: Vec::new(),
            },
            IoCompletion {
                id,
                result: Err((0, IoFault::Other(format!("I/O worker failed: {error}")))),
            },
        ),
    }
}

/// Runs one request on `disk` and hands it back with its completion: on the blocking pool in a real
/// node; under `--cfg madsim` op by op in the simulated task, taking each op's simulated
/// [`Disk::latency`] in simulated time (see below), so a crash can fall inside a request and slow
/// disks slow the node.
///
/// Under madsim a request waits once per sync op instead of once per op before it (every wait is a
/// madsim timer, a wake-up and a task poll: the simulator's largest per-op cost). The ops before a sync
/// (`sync_data`, `sync_dir`) run at once, each drawing its latency as it runs; the sync then waits
/// those latencies and its own together, and runs: a crash during that wait finds the writes issued
/// and not yet durable, which a power loss tears exactly as it would have between two per-op waits
/// (the state "none of them issued yet" is the state before the request). Ops after the last sync
/// (reads, lone writes: most requests without a sync) wait their own latency and then run, one by
/// one, as before, so a slow-disk episode that ends meanwhile stops slowing them. One exception: a
/// request that ends with one read right after its last sync (the partition commit's read-back) draws
/// that read's latency with the sync's and waits both in the sync's wait, then runs the sync and the
/// read together. A read changes nothing on the disk, so a crash finds the same states (the sync not
/// run yet, or run); a slow-disk episode outlives itself by at most that one read's latency. A failing
/// op ends the request after the latencies drawn so far.
#[cfg(madsim)]
pub async fn run_request(disk: Arc<dyn Disk>, request: IoRequest) -> (IoRequest, IoCompletion) {
    let ops = &request.ops;
    let last_sync = ops.iter().rposition(narad_core::disk::IoOp::is_sync);
    let read_back = last_sync
        .map(|last| last + 1)
        .filter(|&next| next + 1 == ops.len() && narad_core::disk::driver::is_read(&ops[next]));
    let mut replies = Vec::with_capacity(ops.len());
    let reads_only = ops.iter().all(narad_core::disk::driver::is_read);
    let mut wait = std::time::Duration::ZERO;
    let mut failure = None;
    for (index, op) in ops.iter().enumerate() {
        if Some(index) != read_back {
            wait += disk.latency(op);
        }
        if Some(index) == last_sync {
            if let Some(read) = read_back {
                wait += disk.latency(&ops[read]);
            }
        }
        // A request of reads only changes nothing on the disk, so a crash cannot tell whether its
        // reads ran one by one: they wait once, together, before the last of them (a replay reads
        // thousands of journal entries in one request).
        let alone = last_sync.is_none_or(|last| index > last)
            && Some(index) != read_back
            && (!reads_only || index + 1 == ops.len());
        if op.is_sync() || alone {
            sleep_simulated(std::mem::take(&mut wait)).await;
        }
        match narad_core::disk::execute_op(&*disk, op) {
            Ok(reply) => replies.push(reply),
            Err(fault) => {
                failure = Some((index, fault));
                break;
            }
        }
    }
    // A failed op ran before the sync it preceded: it and the ops before it took their time.
    sleep_simulated(wait).await;
    let id = request.id;
    let result = match failure {
        Some(failed) => Err(failed),
        None => Ok(replies),
    };
    (request, IoCompletion { id, result })
}

/// Sleeps `wait` in simulated time (no timer for a zero wait).
#[cfg(madsim)]
async fn sleep_simulated(wait: std::time::Duration) {
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests;
