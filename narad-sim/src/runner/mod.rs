//! One simulated run: a scenario and a seed, under madsim (compiled only with `--cfg madsim`).
//!
//! The run builds its own madsim [`Runtime`] from the seed, so runs of different seeds can go on in
//! parallel OS threads. Inside it:
//! 1. the seed's knobs and fault schedule are drawn ([`crate::scenario::Scenario::draw`], [`schedule::generate`]);
//! 2. the node boots in its own madsim node on a fresh [`SimDisk`]; the scenario's topics are created;
//! 3. **safety phase**: producer tasks run the workload (every record registered in the [`Ledger`] before
//!    it is sent), a churn task deletes and recreates churning topics, and the injector applies the
//!    schedule: crash (`Handle::kill` and [`SimDisk::crash`] in one instant, restart later), pause, disk
//!    error episodes ([`SimDisk`] fault rules on the node's path prefixes), slow-disk episodes
//!    ([`SimIo`]), bit rot ([`SimDisk::rot`] at a place the harness draws; its victims are excused in the
//!    ledger);
//! 4. **liveness phase**: every fault heals (rules cleared, node resumed or restarted); once the node's
//!    backlog is 0 — or at the liveness deadline at the latest — every partition is read;
//! 5. a **final crash** and restart, a settle period, and a second read;
//! 6. the ledger judges both reads; in-node invariant violations and harness errors also fail the run.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::time::Duration;

use madsim::runtime::{Handle, NodeHandle, Runtime};
use madsim::task::NodeId as MadsimNodeId;
use narad_core::disk::sim::{FaultKind as DiskFaultKind, FaultRule, SimDisk};
use narad_core::{NodeId, Offset, PartitionId, TopicId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::fault::{DiskError, FaultEvent, Target};
use crate::ledger::{key_partition, Ledger, Observation, Outcome, Served};
use crate::outcome::{panic_text, RunOutcome, RunSpec};
use crate::payload;
use crate::scenario::{pick_weighted, Knobs, TopicSpec};
use crate::schedule;
use crate::seam::{
    derive_seed, DiskLayout, NodeContext, NodeError, NodeSizes, PlantedBug, Probe, ProduceRecord,
    SimIo, SimNode, TopicInfo,
};
use crate::trace::TraceField;

/// Extra simulated time beyond the scenario's phases before madsim's time limit stops a run.
const TIME_LIMIT_MARGIN: Duration = Duration::from_secs(120);
/// How long a failed boot waits before the supervisor tries again.
const BOOT_RETRY: Duration = Duration::from_millis(500);
/// How often the liveness phase polls the node's status.
const STATUS_POLL: Duration = Duration::from_millis(20);
/// How long a topic-management or read call may take before the harness retries it.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between retries of topic-management and read calls.
const ADMIN_RETRY: Duration = Duration::from_millis(100);
/// Records asked for per read call.
const READ_RECORDS_MAX: usize = 1000;
/// Read calls per partition before the harness gives up on it (a bound on a node serving forever).
const READ_CALLS_MAX: usize = 100_000;
/// Records of each failure category described in a run's details.
const DETAILS_MAX: usize = 10;
/// How often the operator looks at the node's status.
const OPERATOR_POLL: Duration = Duration::from_millis(250);
/// How long a latch holds before the operator restarts the process.
const OPERATOR_RESTART_AFTER: Duration = Duration::from_secs(1);
/// A connection to a node that is down is refused after this long.
const REFUSED_DELAY: Duration = Duration::from_millis(1);

fn sim_now_ns() -> u64 {
    madsim::time::TimeHandle::current().elapsed().as_nanos() as u64
}

/// Runs one seed to completion in its own madsim runtime. Never panics: a panic inside the simulation
/// becomes a harness error of the outcome.
pub fn run<N: SimNode>(spec: &RunSpec) -> RunOutcome {
    // A fresh OS thread per run: std's hash keys and other per-thread random state are initialized
    // inside the simulation, from its seed (a thread that used them before would replay differently).
    let spec = spec.clone();
    std::thread::scope(|scope| {
        scope
            .spawn(|| run_here::<N>(&spec))
            .join()
            .unwrap_or_else(|payload| RunOutcome {
                seed: spec.seed,
                errors: vec![format!("panic: {}", panic_text(payload.as_ref()))],
                ..RunOutcome::default()
            })
    })
}

fn run_here<N: SimNode>(spec: &RunSpec) -> RunOutcome {
    let phases = &spec.scenario.phases;
    let budget_ms = phases.safety_ms + phases.liveness_ms + phases.final_settle_ms;
    let mut runtime = Runtime::with_seed_and_config(spec.seed, madsim::Config::default());
    runtime.set_time_limit(Duration::from_millis(budget_ms) + TIME_LIMIT_MARGIN);
    let spec_inner = spec.clone();
    // Made here so a run that panics (a node's assertion, the time limit) still shows its trace.
    let probe = Probe::new(spec.trace, sim_now_ns);
    let probe_inner = probe.clone();
    // tokio's sync primitives (a `watch` receiver picks one of 8 notifiers at random) draw from a
    // per-thread RNG seeded from a process-wide counter: a second run in the same process would wake
    // tasks in another order. Inside a tokio runtime with a fixed seed that RNG replays; the
    // simulation runs unconstrained by tokio's cooperative budget (madsim schedules it).
    let seeded = real_tokio::runtime::Builder::new_current_thread()
        .rng_seed(real_tokio::runtime::RngSeed::from_bytes(
            &spec.seed.to_le_bytes(),
        ))
        .build();
    let result = catch_unwind(AssertUnwindSafe(|| match seeded {
        Ok(tokio_runtime) => tokio_runtime.block_on(real_tokio::task::unconstrained(async {
            runtime.block_on(simulate::<N>(spec_inner, probe_inner))
        })),
        Err(error) => panic!("cannot build the seeded tokio context: {error}"),
    }));
    match result {
        Ok(outcome) => outcome,
        Err(payload) => RunOutcome {
            seed: spec.seed,
            errors: vec![format!("panic: {}", panic_text(payload.as_ref()))],
            violations: probe.violations(),
            trace_hash: probe.trace_hash(),
            trace_events: probe.trace_events(),
            trace_lines: probe.trace_lines(),
            ..RunOutcome::default()
        },
    }
}

/// Whether the node is up, paused or down, as the harness made it.
#[derive(Clone, Copy, Debug, Default)]
struct NodeState {
    down: bool,
    paused: bool,
    /// Bumped at every crash, pause and heal so a stale timer cannot undo a later change.
    generation: u64,
}

/// A booted node and the madsim handle that spawns tasks on its current incarnation (a restart
/// makes a new one; the slot is emptied before every restart).
type Booted<N> = (N, NodeHandle);

/// The harness's side of one simulated node.
struct Server<N: SimNode> {
    madsim_id: MadsimNodeId,
    slot: Arc<Mutex<Option<Booted<N>>>>,
    state: Mutex<NodeState>,
    disk: SimDisk,
    probe: Probe,
    crashes: AtomicU32,
}

/// How a call to the node ended, from the client's side.
enum Call<T> {
    /// The node answered.
    Done(T),
    /// The node was down: connection refused.
    Refused,
    /// The node died while the call was in flight: connection reset.
    Reset,
    /// The client gave up.
    TimedOut,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// One call's deadline, as the [`Watchdog`] holds it.
#[derive(Default)]
struct Deadline {
    /// The deadline passed: the client gives up.
    fired: AtomicBool,
    /// The call ended: the watchdog forgets it.
    ended: AtomicBool,
    /// The call's task, woken when the deadline fires.
    waker: Mutex<Option<Waker>>,
}

impl Deadline {
    fn fire(&self) {
        self.fired.store(true, Ordering::Release);
        if let Some(waker) = lock(&self.waker).take() {
            waker.wake();
        }
    }
}

/// The client timeout of every produce call, on one timer. A madsim timer costs about a thousand
/// instructions to add, expire and poll, and a call's timer outlives the call (madsim cannot cancel
/// one): a timer per call was a timer per record. Produce calls share one timeout, so their deadlines
/// arrive in order: the watchdog sleeps until the oldest deadline of a call still running, fires the
/// deadlines that passed and forgets the calls that ended, so in a healthy run it wakes about once per
/// timeout. A deadline fires at its instant, or up to 1 ms later when it follows the one before it by
/// less than madsim's shortest sleep.
#[derive(Default)]
struct Watchdog {
    /// (deadline in simulated ns, the call's), in deadline order.
    queue: Mutex<VecDeque<(u64, Arc<Deadline>)>>,
    /// A deadline entered at the front of the queue: the watchdog's sleep is too long.
    earlier: tokio::sync::Notify,
}

impl Watchdog {
    /// Watches a call that gives up at `at_ns`.
    fn watch(&self, at_ns: u64) -> Arc<Deadline> {
        let deadline = Arc::new(Deadline::default());
        let mut queue = lock(&self.queue);
        // Deadlines come in order (one timeout, a clock that never goes back): the back, normally.
        let position = queue.partition_point(|(queued_ns, _)| *queued_ns <= at_ns);
        queue.insert(position, (at_ns, deadline.clone()));
        if position == 0 {
            self.earlier.notify_one();
        }
        deadline
    }

    /// Fires the deadlines due at `now_ns` and drops the ended calls ahead of the first still running;
    /// returns that one's deadline.
    fn expire(&self, now_ns: u64) -> Option<u64> {
        let mut queue = lock(&self.queue);
        while let Some((at_ns, deadline)) = queue.front() {
            if !deadline.ended.load(Ordering::Acquire) {
                if *at_ns > now_ns {
                    return Some(*at_ns);
                }
                deadline.fire();
            }
            queue.pop_front();
        }
        None
    }

    async fn run(self: Arc<Self>) {
        loop {
            let now = sim_now_ns();
            match self.expire(now) {
                None => self.earlier.notified().await,
                Some(at_ns) => {
                    tokio::select! {
                        biased;
                        () = self.earlier.notified() => {}
                        () = tokio::time::sleep(Duration::from_nanos(at_ns - now)) => {}
                    }
                }
            }
        }
    }
}

impl<N: SimNode> Server<N> {
    fn boot(
        disk: SimDisk,
        io: SimIo,
        probe: Probe,
        seed: u64,
        plant_bug: Option<PlantedBug>,
        sizes: NodeSizes,
    ) -> Arc<Self> {
        let slot: Arc<Mutex<Option<Booted<N>>>> = Arc::new(Mutex::new(None));
        let boots = Arc::new(AtomicU32::new(0));
        let init_slot = slot.clone();
        let init_probe = probe.clone();
        let init_disk = disk.clone();
        let node_seed = derive_seed(seed, "node/0");
        let own_id: Arc<std::sync::OnceLock<MadsimNodeId>> = Arc::new(std::sync::OnceLock::new());
        let init_own_id = own_id.clone();
        let node = Handle::current()
            .create_node()
            .name("narad-0")
            .ip("10.0.0.1".parse().expect("a valid address"))
            .init(move || {
                let ctx = NodeContext {
                    node_id: NodeId(0),
                    seed: node_seed,
                    boot: boots.fetch_add(1, Ordering::Relaxed),
                    disk: init_disk.clone(),
                    io: io.clone(),
                    plant_bug,
                    probe: init_probe.clone(),
                    sizes,
                };
                let slot = init_slot.clone();
                let own_id = init_own_id.clone();
                async move {
                    match N::start(ctx.clone()).await {
                        Ok(node) => {
                            ctx.probe
                                .event("harness", format_args!("boot {} ready", ctx.boot));
                            // Looked up once per boot, not per call.
                            let handle = own_id
                                .get()
                                .and_then(|&id| Handle::current().get_node(id))
                                .expect("the node exists for the whole run");
                            *lock(&slot) = Some((node, handle));
                        }
                        Err(error) => {
                            // A process whose start-up failed exits; its supervisor starts it again
                            // (the disk keeps everything: this is no power loss).
                            ctx.probe.event(
                                "harness",
                                format_args!("boot {} failed: {error}", ctx.boot),
                            );
                            tokio::time::sleep(BOOT_RETRY).await;
                            if let Some(&id) = own_id.get() {
                                ctx.probe.event(
                                    "harness",
                                    format_args!("process restart after failed boot {}", ctx.boot),
                                );
                                Handle::current().restart(id);
                            }
                        }
                    }
                    // The node's main task must not return: madsim ends a node whose init returns.
                    std::future::pending::<()>().await;
                }
            })
            .build();
        let _ = own_id.set(node.id());
        Arc::new(Server {
            madsim_id: node.id(),
            slot,
            state: Mutex::new(NodeState::default()),
            disk,
            probe,
            crashes: AtomicU32::new(0),
        })
    }

    /// The running node and its spawn handle; `None` after the delay a refused connection takes
    /// while it is down.
    async fn running(&self) -> Option<Booted<N>> {
        let booted = lock(&self.slot).clone();
        if booted.is_none() {
            tokio::time::sleep(REFUSED_DELAY).await;
        }
        booted
    }

    /// Runs `f(node)` as a task on the node, as a request handler would run.
    async fn call<T, Fut>(&self, timeout: Duration, f: impl FnOnce(N) -> Fut) -> Call<T>
    where
        Fut: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let Some((node, handle)) = self.running().await else {
            return Call::Refused;
        };
        let join = handle.spawn(f(node));
        let abort = join.abort_handle();
        match tokio::time::timeout(timeout, join).await {
            Ok(Ok(value)) => Call::Done(value),
            Ok(Err(_cancelled)) => Call::Reset,
            Err(_elapsed) => {
                // The client hangs up: the handler is dropped, as hyper drops it on disconnect.
                abort.abort();
                Call::TimedOut
            }
        }
    }

    /// [`Server::call`] with its timeout kept by `watchdog` (which must be running) instead of a timer
    /// of its own. The same outcomes at the same instants (see [`Watchdog`] for the exception).
    async fn call_watched<T, Fut>(
        &self,
        watchdog: &Watchdog,
        timeout: Duration,
        f: impl FnOnce(N) -> Fut,
    ) -> Call<T>
    where
        Fut: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let Some((node, handle)) = self.running().await else {
            return Call::Refused;
        };
        let mut join = handle.spawn(f(node));
        let abort = join.abort_handle();
        // As `tokio::time::timeout` (at least 1 ms), from now.
        let at_ns = sim_now_ns() + timeout.max(Duration::from_millis(1)).as_nanos() as u64;
        let deadline = watchdog.watch(at_ns);
        // The answer first, as `timeout` polls it first: an answer at the deadline counts.
        let answered = std::future::poll_fn(|cx| {
            if let Poll::Ready(result) = Pin::new(&mut join).poll(cx) {
                return Poll::Ready(Some(result));
            }
            if deadline.fired.load(Ordering::Acquire) {
                return Poll::Ready(None);
            }
            let mut waker = lock(&deadline.waker);
            if !waker
                .as_ref()
                .is_some_and(|known| known.will_wake(cx.waker()))
            {
                *waker = Some(cx.waker().clone());
            }
            Poll::Pending
        })
        .await;
        deadline.ended.store(true, Ordering::Release);
        match answered {
            Some(Ok(value)) => Call::Done(value),
            Some(Err(_cancelled)) => Call::Reset,
            None => {
                // The client hangs up: the handler is dropped, as hyper drops it on disconnect.
                abort.abort();
                Call::TimedOut
            }
        }
    }

    fn crash(&self, why: &str) {
        let mut state = lock(&self.state);
        Handle::current().kill(self.madsim_id);
        self.disk.crash();
        *lock(&self.slot) = None;
        state.down = true;
        state.paused = false;
        state.generation += 1;
        self.crashes.fetch_add(1, Ordering::Relaxed);
        self.probe.event(
            "fault",
            format_args!("crash ({why}): node killed, disk crashed"),
        );
    }

    /// The process dies and its supervisor starts it again at once: no power loss, the disk keeps
    /// everything it was given (synced or not).
    fn process_restart(&self, why: &str) {
        let mut state = lock(&self.state);
        *lock(&self.slot) = None;
        state.down = false;
        state.paused = false;
        state.generation += 1;
        Handle::current().restart(self.madsim_id);
        self.probe
            .event("fault", format_args!("process restart ({why})"));
    }

    fn restart(&self) {
        let mut state = lock(&self.state);
        state.down = false;
        state.paused = false;
        state.generation += 1;
        Handle::current().restart(self.madsim_id);
        self.probe.event("fault", format_args!("restart"));
    }

    /// Waits until the node has booted, or `deadline_ns` passes.
    async fn booted(&self, deadline_ns: u64) -> bool {
        loop {
            if lock(&self.slot).is_some() {
                return true;
            }
            if sim_now_ns() >= deadline_ns {
                return false;
            }
            tokio::time::sleep(STATUS_POLL).await;
        }
    }
}

/// One topic as the workload sees it.
struct TopicRuntime {
    spec: TopicSpec,
    current: Mutex<Option<TopicId>>,
    /// Producers hold it shared for a call; churn holds it exclusively, so every record is attributed
    /// to the incarnation it was sent to.
    gate: tokio::sync::RwLock<()>,
}

/// Everything the run's tasks share.
struct World<N: SimNode> {
    spec: RunSpec,
    knobs: Knobs,
    layout: DiskLayout,
    server: Arc<Server<N>>,
    io: SimIo,
    probe: Probe,
    ledger: Mutex<Ledger>,
    topics: Vec<TopicRuntime>,
    safety_end_ns: u64,
    healed: AtomicBool,
    errors: Mutex<Vec<String>>,
    produce_calls: Mutex<u64>,
    /// Keeps the produce calls' timeouts.
    watchdog: Arc<Watchdog>,
    /// Disk fault episodes in force: (episode id, rule).
    disk_rules: Mutex<Vec<(u64, FaultRule)>>,
    /// Chooses where bit rot strikes.
    rot_rng: Mutex<ChaCha8Rng>,
}

impl<N: SimNode> World<N> {
    fn error(&self, text: String) {
        self.probe.event("harness", format_args!("ERROR {text}"));
        lock(&self.errors).push(text);
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.spec.scenario.workload.timeout_ms)
    }

    fn prefix(&self, target: Target) -> String {
        match target {
            Target::Wal => self.layout.wal_prefix.clone(),
            Target::Partitions => self.layout.partition_prefix.clone(),
            Target::All => String::new(),
        }
    }

    /// Creates `topic` and learns its incarnation, retrying through failures until `deadline_ns`.
    async fn create_topic(&self, topic: &TopicRuntime, deadline_ns: u64) -> Option<TopicId> {
        let name = topic.spec.name.clone();
        let partitions = topic.spec.partitions;
        while sim_now_ns() < deadline_ns {
            let create_name = name.clone();
            let created = self
                .server
                .call(ADMIN_TIMEOUT, move |node| async move {
                    node.create_topic(&create_name, partitions).await
                })
                .await;
            if let Call::Done(Ok(info)) = created {
                self.probe
                    .event("client", format_args!("created {name}#{}", info.id));
                return Some(info.id);
            }
            // Ambiguous or refused (it may exist already): ask what is there.
            if let Some(Some(info)) = self.describe(&name).await {
                if info.partitions == partitions {
                    self.probe
                        .event("client", format_args!("found {name}#{}", info.id));
                    return Some(info.id);
                }
            }
            tokio::time::sleep(ADMIN_RETRY).await;
        }
        None
    }

    async fn describe(&self, name: &str) -> Option<Option<TopicInfo>> {
        let describe_name = name.to_string();
        match self
            .server
            .call(ADMIN_TIMEOUT, move |node| async move {
                node.describe_topic(&describe_name).await
            })
            .await
        {
            Call::Done(Ok(info)) => Some(info),
            Call::Done(Err(_)) | Call::Refused | Call::Reset | Call::TimedOut => None,
        }
    }

    /// Deletes the incarnation `old` of `topic`, retrying until the node confirms it is gone.
    async fn delete_topic(&self, topic: &TopicRuntime, old: TopicId, deadline_ns: u64) -> bool {
        let name = topic.spec.name.clone();
        while sim_now_ns() < deadline_ns {
            let delete_name = name.clone();
            let _ = self
                .server
                .call(ADMIN_TIMEOUT, move |node| async move {
                    node.delete_topic(&delete_name).await
                })
                .await;
            match self.describe(&name).await {
                Some(None) => return true,
                Some(Some(info)) if info.id != old => return true,
                Some(Some(_)) | None => tokio::time::sleep(ADMIN_RETRY).await,
            }
        }
        false
    }

    /// Produces one call's worth of records, as one producer.
    async fn produce_once(&self, rng: &mut ChaCha8Rng) {
        let topic = &self.topics[rng.random_range(0..self.topics.len())];
        let mode = pick_weighted(rng, &self.knobs.mode_weights).expect("weights are not all 0");
        let batch = pick_weighted(rng, &self.knobs.shape_weights) == Some(1);
        let mut count = if batch {
            self.knobs.batch_records.draw(rng)
        } else {
            1
        };
        if let Some(max) = self.spec.scenario.workload.records_max {
            count = count.min(max.saturating_sub(lock(&self.ledger).len() as u64));
            if count == 0 {
                return;
            }
        }
        let _gate = topic.gate.read().await;
        let Some(topic_id) = *lock(&topic.current) else {
            return;
        };
        let partitions = topic.spec.partitions;
        let explicit = (mode == 2).then(|| PartitionId(rng.random_range(0..partitions)));
        let mut records = Vec::with_capacity(count as usize);
        let attempt;
        {
            let mut ledger = lock(&self.ledger);
            attempt = ledger.begin();
            for _ in 0..count {
                let key = (mode == 0)
                    .then(|| format!("k{}", rng.random_range(0..self.knobs.keys)).into_bytes());
                let aimed =
                    explicit.or_else(|| key.as_deref().map(|k| key_partition(k, partitions)));
                let id = ledger.add_record(attempt, &topic.spec.name, topic_id, aimed);
                let size = self.knobs.payload_bytes.draw(rng) as usize;
                records.push(ProduceRecord {
                    key,
                    payload: payload::encode(id, size),
                });
            }
        }
        *lock(&self.produce_calls) += 1;
        let name = topic.spec.name.clone();
        let result = self
            .server
            .call_watched(&self.watchdog, self.timeout(), move |node| async move {
                if batch {
                    node.produce_batch(&name, explicit, records).await
                } else {
                    let record = records.pop().expect("one record");
                    node.produce(&name, explicit, record).await
                }
            })
            .await;
        let outcome = match result {
            Call::Done(Ok(())) => Outcome::Accepted,
            Call::Done(Err(NodeError::Refused(_))) => Outcome::Refused,
            Call::Done(Err(NodeError::Failed(_))) | Call::Refused | Call::Reset => Outcome::Failed,
            Call::TimedOut => Outcome::TimedOut,
        };
        lock(&self.ledger).complete(attempt, outcome);
        // One event per produce call: hashed by its fields, formatted only for `--trace`.
        self.probe.event_fields(
            "client",
            &[
                TraceField::Str("produce"),
                TraceField::U64(u64::from(attempt.0)),
                TraceField::Str(&topic.spec.name),
                TraceField::U64(topic_id.0),
                TraceField::U64(count),
                // 0 = no explicit partition, else its number + 1.
                TraceField::U64(explicit.map_or(0, |p| u64::from(p.0) + 1)),
                TraceField::Str(outcome.name()),
            ],
            format_args!(
                "produce #{} {}#{topic_id} records={count} partition={:?} -> {}",
                attempt.0,
                topic.spec.name,
                explicit.map(|p| p.0),
                outcome.name()
            ),
        );
    }

    fn records_exhausted(&self) -> bool {
        self.spec
            .scenario
            .workload
            .records_max
            .is_some_and(|max| lock(&self.ledger).len() as u64 >= max)
    }

    async fn producer(self: Arc<Self>, index: u64) {
        let mut rng =
            ChaCha8Rng::seed_from_u64(derive_seed(self.spec.seed, &format!("producer/{index}")));
        let mean_gap_ns = 1e9 * self.knobs.producers as f64 / self.knobs.rate_per_s as f64;
        loop {
            let unit: f64 = rng.random_range(f64::EPSILON..1.0);
            tokio::time::sleep(Duration::from_nanos((-unit.ln() * mean_gap_ns) as u64)).await;
            if sim_now_ns() >= self.safety_end_ns || self.records_exhausted() {
                return;
            }
            self.produce_once(&mut rng).await;
        }
    }

    async fn churn(self: Arc<Self>, index: usize) {
        let topic = &self.topics[index];
        let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(
            self.spec.seed,
            &format!("churn/{}", topic.spec.name),
        ));
        let mean_ns = self.knobs.churn_every_ms as f64 * 1e6;
        let hard_deadline_ns =
            self.safety_end_ns + self.spec.scenario.phases.liveness_ms * 1_000_000 / 2;
        loop {
            let unit: f64 = rng.random_range(f64::EPSILON..1.0);
            tokio::time::sleep(Duration::from_nanos((-unit.ln() * mean_ns) as u64)).await;
            if sim_now_ns() >= self.safety_end_ns {
                return;
            }
            let _gate = topic.gate.write().await;
            let Some(old) = *lock(&topic.current) else {
                return;
            };
            self.probe
                .event("client", format_args!("churn {}#{old}", topic.spec.name));
            if !self.delete_topic(topic, old, hard_deadline_ns).await {
                self.error(format!(
                    "topic {}#{old} could not be deleted",
                    topic.spec.name
                ));
                return;
            }
            lock(&self.ledger).incarnation_deleted(old);
            *lock(&topic.current) = None;
            match self.create_topic(topic, hard_deadline_ns).await {
                Some(id) => *lock(&topic.current) = Some(id),
                None => {
                    self.error(format!("topic {} could not be recreated", topic.spec.name));
                    return;
                }
            }
        }
    }

    async fn injector(self: Arc<Self>, events: Vec<FaultEvent>) {
        for (episode, event) in events.into_iter().enumerate() {
            let at_ns = event.at_us() * 1000;
            let now = sim_now_ns();
            if at_ns > now {
                tokio::time::sleep(Duration::from_nanos(at_ns - now)).await;
            }
            if self.healed.load(Ordering::Relaxed) {
                return;
            }
            self.clone().apply(episode as u64, event);
        }
    }

    /// Applies one fault now; its end (restart, resume, episode end) is a timer task.
    fn apply(self: Arc<Self>, episode: u64, event: FaultEvent) {
        self.probe
            .event("fault", format_args!("apply {}", event.describe()));
        match event {
            FaultEvent::Crash { down_ms, .. } => {
                if lock(&self.server.state).down {
                    self.probe
                        .event("fault", format_args!("skip: node is down"));
                    return;
                }
                self.server.crash("scheduled");
                let generation = lock(&self.server.state).generation;
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(down_ms)).await;
                    let current = lock(&self.server.state).generation;
                    if current == generation && !self.healed.load(Ordering::Relaxed) {
                        self.server.restart();
                    }
                });
            }
            FaultEvent::Pause { duration_ms, .. } => {
                let generation = {
                    let mut state = lock(&self.server.state);
                    if state.down || state.paused {
                        self.probe
                            .event("fault", format_args!("skip: node is down or paused"));
                        return;
                    }
                    state.paused = true;
                    state.generation += 1;
                    Handle::current().pause(self.server.madsim_id);
                    state.generation
                };
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(duration_ms)).await;
                    let mut state = lock(&self.server.state);
                    if state.generation == generation && state.paused {
                        state.paused = false;
                        Handle::current().resume(self.server.madsim_id);
                        self.probe.event("fault", format_args!("resume"));
                    }
                });
            }
            FaultEvent::Disk {
                target,
                error,
                chance_ppm,
                duration_ms,
                ..
            } => {
                let kind = match error {
                    DiskError::FsyncEio => DiskFaultKind::SyncEio,
                    DiskError::WriteEio => DiskFaultKind::WriteEio,
                    DiskError::Enospc => DiskFaultKind::NoSpace,
                };
                let rule = FaultRule {
                    path_prefix: self.prefix(target),
                    kind,
                    chance_ppm,
                    remaining: None,
                };
                self.server.disk.add_fault(rule.clone());
                lock(&self.disk_rules).push((episode, rule));
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(duration_ms)).await;
                    if self.healed.load(Ordering::Relaxed) {
                        return;
                    }
                    // SimDisk can only clear every rule: clear, then re-add the others in force.
                    let mut rules = lock(&self.disk_rules);
                    rules.retain(|(id, _)| *id != episode);
                    self.server.disk.clear_faults();
                    for (_, rule) in rules.iter() {
                        self.server.disk.add_fault(rule.clone());
                    }
                    self.probe
                        .event("fault", format_args!("end disk episode {episode}"));
                });
            }
            FaultEvent::SlowDisk {
                target,
                latency_us,
                duration_ms,
                ..
            } => {
                let id = self.io.slow_begin(&self.prefix(target), latency_us);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(duration_ms)).await;
                    self.io.slow_end(id);
                    self.probe
                        .event("fault", format_args!("end slow episode {episode}"));
                });
            }
            FaultEvent::BitRot { target, .. } => self.rot(target),
        }
    }

    /// Flips a bit of synced data and excuses the records it may destroy: those of the checksummed
    /// unit holding the bit ([`DiskLayout::rot_unit`]: a partition frame may hold many records on both
    /// sides of it), or, where the node cannot name the unit (or rot strikes outside the partition
    /// logs), every payload in every file of the struck file's directory. The victims are found in the
    /// images *before* the flip, so a flip inside a payload header cannot hide its own record.
    fn rot(&self, target: Target) {
        let prefix = self.prefix(target);
        let disk = &self.server.disk;
        let candidates: Vec<(String, u64)> = disk
            .paths()
            .into_iter()
            .filter(|path| path.starts_with(prefix.as_str()))
            .filter_map(|path| {
                let len = disk.durable_image(&path)?.len() as u64;
                (len > 0).then_some((path, len))
            })
            .collect();
        if candidates.is_empty() {
            self.probe.event(
                "fault",
                format_args!("bit-rot: no synced data under {prefix:?}"),
            );
            return;
        }
        let (path, offset, bit) = {
            let mut rng = lock(&self.rot_rng);
            let (path, len) = &candidates[rng.random_range(0..candidates.len())];
            let offset = rng.random_range(0..*len);
            (path.clone(), offset, rng.random_range(0..8u8))
        };
        let dir = narad_core::disk::parent_dir(&path).to_string();
        // The records of the struck unit, when the node promises to lose no more than that;
        // otherwise every record of the log's directory.
        let unit = (target == Target::Partitions)
            .then(|| disk.durable_image(&path))
            .flatten()
            .and_then(|image| {
                let (start, end) = (self.layout.rot_unit)(&image, offset)?;
                Some(
                    payload::scan(&image)
                        .into_iter()
                        .filter(|found| found.start < end && start < found.end)
                        .map(|found| found.id)
                        .collect::<Vec<u64>>(),
                )
            });
        let victims = unit.unwrap_or_else(|| self.payloads_under(&dir));
        let flipped = disk.rot(&path, offset, bit);
        self.probe.event(
            "fault",
            format_args!(
                "bit-rot {path}@{offset} bit {bit} (flipped: {flipped}): {} records excused",
                victims.len()
            ),
        );
        lock(&self.ledger).rotted(victims);
    }

    /// Every payload id in the durable images of the files directly in `dir`.
    fn payloads_under(&self, dir: &str) -> Vec<u64> {
        let disk = &self.server.disk;
        disk.paths()
            .into_iter()
            .filter(|path| narad_core::disk::parent_dir(path) == dir)
            .filter_map(|path| disk.durable_image(&path))
            .flat_map(|image| payload::scan(&image).into_iter().map(|found| found.id))
            .collect()
    }

    /// The operator: a node whose disk failure latched a component (it says so in its status, as an
    /// alert would) is restarted once the latch has held for [`OPERATOR_RESTART_AFTER`]. Runs for the
    /// whole run, faults or not.
    async fn operator(self: Arc<Self>) {
        let mut latched_since: Option<u64> = None;
        loop {
            tokio::time::sleep(OPERATOR_POLL).await;
            let state = *lock(&self.server.state);
            if state.down || state.paused {
                latched_since = None;
                continue;
            }
            let status = self
                .server
                .call(ADMIN_TIMEOUT, |node| async move { node.status().await })
                .await;
            let latched = matches!(status, Call::Done(status) if status.latched);
            if !latched {
                latched_since = None;
                continue;
            }
            let now = sim_now_ns();
            let since = *latched_since.get_or_insert(now);
            if now - since >= OPERATOR_RESTART_AFTER.as_nanos() as u64
                && lock(&self.server.state).generation == state.generation
            {
                self.server.process_restart("operator: a component latched");
                latched_since = None;
            }
        }
    }

    /// Ends every fault: the liveness phase starts.
    fn heal(&self) {
        self.healed.store(true, Ordering::Relaxed);
        self.server.disk.clear_faults();
        lock(&self.disk_rules).clear();
        self.io.heal();
        let state = *lock(&self.server.state);
        if state.down {
            self.server.restart();
        } else if state.paused {
            let mut state = lock(&self.server.state);
            state.paused = false;
            state.generation += 1;
            Handle::current().resume(self.server.madsim_id);
        }
        self.probe
            .event("harness", format_args!("heal: liveness phase starts"));
    }

    /// Reads every partition of every topic's current incarnation.
    async fn read_all(&self) -> Observation {
        let mut observation = Observation::default();
        for topic in &self.topics {
            for p in 0..topic.spec.partitions {
                self.read_partition(&topic.spec.name, PartitionId(p), &mut observation)
                    .await;
            }
        }
        observation
    }

    async fn read_partition(&self, name: &str, partition: PartitionId, out: &mut Observation) {
        let mut from = Offset(0);
        let mut failures = 0;
        let mut last_failure;
        for _ in 0..READ_CALLS_MAX {
            let read_name = name.to_string();
            let result = self
                .server
                .call(ADMIN_TIMEOUT, move |node| async move {
                    node.read(&read_name, partition, from, READ_RECORDS_MAX)
                        .await
                })
                .await;
            let batch = match result {
                Call::Done(Ok(batch)) => batch,
                failed @ (Call::Done(Err(_)) | Call::Refused | Call::Reset | Call::TimedOut) => {
                    last_failure = match failed {
                        Call::Done(Err(error)) => format!("{error:?}"),
                        Call::Refused => "refused".to_string(),
                        Call::Reset => "reset".to_string(),
                        _ => "timed out".to_string(),
                    };
                    failures += 1;
                    if failures > 20 {
                        self.error(format!(
                            "read {name}/{partition} from {from} keeps failing ({last_failure})"
                        ));
                        return;
                    }
                    tokio::time::sleep(ADMIN_RETRY).await;
                    continue;
                }
            };
            let Some(last) = batch.records.last() else {
                return;
            };
            from = last.offset.next();
            let topic: Arc<str> = Arc::from(name);
            for record in batch.records {
                out.served.push(Served::new(
                    topic.clone(),
                    batch.topic_id,
                    partition,
                    record.offset,
                    record.payload,
                ));
            }
            if from >= batch.high_watermark {
                return;
            }
        }
        self.error(format!("read {name}/{partition} did not end"));
    }

    /// Waits for a zero backlog (or `deadline_ns`), then reads; if a 202'd record is still missing
    /// before the deadline, waits for the deadline and reads again.
    async fn observe(&self, deadline_ns: u64, what: &str) -> Observation {
        if !self.server.booted(deadline_ns).await {
            self.error(format!("node not booted by the {what} deadline"));
            return Observation::default();
        }
        loop {
            let drained = matches!(
                self.server
                    .call(ADMIN_TIMEOUT, |node| async move { node.status().await })
                    .await,
                Call::Done(status) if status.backlog_records == 0
            );
            if drained || sim_now_ns() >= deadline_ns {
                break;
            }
            tokio::time::sleep(STATUS_POLL).await;
        }
        let observation = self.read_all().await;
        let missing = lock(&self.ledger).missing(&observation);
        let now = sim_now_ns();
        if missing == 0 || now >= deadline_ns {
            self.probe.event(
                "harness",
                format_args!(
                    "{what} read: {} served, {missing} missing",
                    observation.served.len()
                ),
            );
            return observation;
        }
        tokio::time::sleep(Duration::from_nanos(deadline_ns - now)).await;
        let observation = self.read_all().await;
        self.probe.event(
            "harness",
            format_args!(
                "{what} read at the deadline: {} served, {} missing",
                observation.served.len(),
                lock(&self.ledger).missing(&observation)
            ),
        );
        observation
    }
}

async fn simulate<N: SimNode>(spec: RunSpec, probe: Probe) -> RunOutcome {
    let scenario = spec.scenario.clone();
    let seed = spec.seed;
    let knobs = scenario.draw(&mut ChaCha8Rng::seed_from_u64(derive_seed(seed, "knobs")));
    let events = spec
        .schedule
        .clone()
        .or_else(|| scenario.schedule.clone())
        .unwrap_or_else(|| {
            let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(seed, "schedule"));
            schedule::generate(&scenario, &knobs, &mut rng)
        });
    probe.event(
        "harness",
        format_args!(
            "seed {seed} node {} plant_bug {:?} knobs {knobs:?} faults {}",
            N::name(),
            spec.plant_bug.map(PlantedBug::name),
            events.len()
        ),
    );
    let disk = SimDisk::new(derive_seed(seed, "disk"));
    let io = SimIo::new(derive_seed(seed, "io"), knobs.op_us, knobs.sync_us);
    let sizes = NodeSizes {
        wal_segment_bytes: knobs.wal_segment_bytes,
        partition_segment_bytes: knobs.partition_segment_bytes,
    };
    let server = Server::<N>::boot(disk, io.clone(), probe.clone(), seed, spec.plant_bug, sizes);
    let safety_end_ns = scenario.phases.safety_ms * 1_000_000;
    let liveness_deadline_ns = safety_end_ns + scenario.phases.liveness_ms * 1_000_000;
    let world = Arc::new(World {
        layout: N::layout(),
        knobs: knobs.clone(),
        server: server.clone(),
        io,
        probe: probe.clone(),
        ledger: Mutex::new(Ledger::new()),
        topics: scenario
            .topics
            .iter()
            .map(|spec| TopicRuntime {
                spec: spec.clone(),
                current: Mutex::new(None),
                gate: tokio::sync::RwLock::new(()),
            })
            .collect(),
        safety_end_ns,
        healed: AtomicBool::new(false),
        errors: Mutex::new(Vec::new()),
        produce_calls: Mutex::new(0),
        watchdog: Arc::new(Watchdog::default()),
        disk_rules: Mutex::new(Vec::new()),
        rot_rng: Mutex::new(ChaCha8Rng::seed_from_u64(derive_seed(seed, "rot"))),
        spec,
    });

    // Topics first (the node may still be booting), then the safety phase.
    for topic in &world.topics {
        match world.create_topic(topic, safety_end_ns).await {
            Some(id) => *lock(&topic.current) = Some(id),
            None => world.error(format!("topic {} could not be created", topic.spec.name)),
        }
    }
    let injector = tokio::spawn(world.clone().injector(events.clone()));
    let operator = tokio::spawn(world.clone().operator());
    let watchdog = tokio::spawn(world.watchdog.clone().run());
    let mut tasks = Vec::new();
    for index in 0..knobs.producers {
        tasks.push(tokio::spawn(world.clone().producer(index)));
    }
    if knobs.churn_every_ms > 0 {
        for (index, topic) in world.topics.iter().enumerate() {
            if topic.spec.churn {
                tasks.push(tokio::spawn(world.clone().churn(index)));
            }
        }
    }
    let now = sim_now_ns();
    if now < safety_end_ns {
        tokio::time::sleep(Duration::from_nanos(safety_end_ns - now)).await;
    }
    injector.abort();
    for task in tasks {
        // Producers stop at the end of the safety phase; churn finishes its cycle first.
        let _ = task.await;
    }

    // Liveness phase.
    world.heal();
    let at_deadline = world.observe(liveness_deadline_ns, "liveness").await;

    // Final crash: what was visible must also be durable.
    let after_final = if world.spec.scenario.phases.final_crash {
        server.crash("final");
        server.restart();
        let settle_deadline_ns =
            sim_now_ns() + world.spec.scenario.phases.final_settle_ms * 1_000_000;
        world.observe(settle_deadline_ns, "final").await
    } else {
        at_deadline.clone()
    };

    operator.abort();
    watchdog.abort();
    let report = lock(&world.ledger).check(&at_deadline, &after_final);
    probe.event(
        "harness",
        format_args!(
            "verdict lost={} unseen={} phantoms={} misplaced={} duplicates={} reroutes={}",
            report.lost.len(),
            report.unseen.len(),
            report.phantoms.len(),
            report.misplaced.len(),
            report.duplicate_copies(),
            report.reroutes
        ),
    );
    let details = {
        let ledger = lock(&world.ledger);
        let mut details = Vec::new();
        // Where the missing records sit on disk (durable images), to start the diagnosis there.
        let mut missing: Vec<u64> = report.lost.iter().take(DETAILS_MAX).copied().collect();
        missing.extend(report.unseen.iter().take(DETAILS_MAX));
        let mut places: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
        if !missing.is_empty() {
            for path in server.disk.paths() {
                let Some(image) = server.disk.durable_image(&path) else {
                    continue;
                };
                for found in payload::scan(&image) {
                    if missing.contains(&found.id) {
                        places
                            .entry(found.id)
                            .or_default()
                            .push(format!("{path}@{}", found.start));
                    }
                }
            }
        }
        for (kind, ids) in [("lost", &report.lost), ("unseen", &report.unseen)] {
            for &id in ids.iter().take(DETAILS_MAX) {
                if let Some(entry) = ledger.record(id) {
                    details.push(format!(
                        "{kind} record {id}: {}#{} aimed at {:?}, call #{} {}; durable in {:?}",
                        entry.topic,
                        entry.topic_id,
                        entry.aimed_at.map(|p| p.0),
                        entry.attempt.0,
                        ledger.outcome_of(id).map_or("?", Outcome::name),
                        places.get(&id).map_or(&[][..], Vec::as_slice)
                    ));
                }
            }
        }
        details
    };
    // madsim frees no task when its runtime drops, and a node's tasks hold each other (channels,
    // wakers) in cycles: kill the node and let the executor drop its tasks, or every run leaks them.
    Handle::current().kill(server.madsim_id);
    tokio::time::sleep(Duration::from_millis(1)).await;
    let errors = lock(&world.errors).clone();
    let produce_calls = *lock(&world.produce_calls);
    RunOutcome {
        seed,
        accepted: report.accepted,
        report,
        violations: probe.violations(),
        errors,
        trace_hash: probe.trace_hash(),
        trace_events: probe.trace_events(),
        trace_lines: probe.trace_lines(),
        schedule: events,
        sim_ns: sim_now_ns(),
        produce_calls,
        crashes: u64::from(server.crashes.load(Ordering::Relaxed)),
        details,
    }
}

#[cfg(test)]
mod tests;
