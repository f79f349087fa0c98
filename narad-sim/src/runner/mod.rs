//! One simulated run: a scenario and a seed, under madsim (compiled only with `--cfg madsim`).
//!
//! The run builds its own madsim [`Runtime`] from the seed, so runs of different seeds can go on in
//! parallel OS threads. Inside it:
//! 1. the seed's knobs and fault schedule are drawn ([`crate::scenario::Scenario::draw`], [`schedule::generate`]);
//! 2. every node (one, or a cluster's members at 10.0.0.1 upwards) boots in its own madsim node on a
//!    fresh [`SimDisk`]; the scenario's topics are created through any of them;
//! 3. **safety phase**: producer tasks run the workload (every record registered in the [`Ledger`] before
//!    it is sent, each call through a node drawn at random), a churn task deletes and recreates
//!    churning topics, and the injector applies the schedule, each event to the node it names (or, in
//!    a cluster, to the leader of the moment): crash (`Handle::kill` and [`SimDisk::crash`] in one instant, restart later), pause, disk
//!    error episodes ([`SimDisk`] fault rules on the node's path prefixes), slow-disk episodes
//!    ([`SimIo`]), bit rot ([`SimDisk::rot`] at a place the harness draws; its victims are excused in the
//!    ledger);
//! 4. **liveness phase**: every fault heals (rules cleared, nodes resumed or restarted); once every
//!    node's backlog is 0 — or at the liveness deadline at the latest — every partition is read, at
//!    its owner;
//! 5. a **final crash** of every node at once and their restart, a settle period, and a second read;
//! 6. the ledger judges both reads; in-node invariant violations and harness errors also fail the run.
//!
//! This module holds the run loop and the state its tasks share ([`World`]); the parts live beside it:
//! `server` (the node as the harness holds it, and client calls to it), `watchdog` (the produce calls'
//! timeouts on one timer), `workload` (the simulated clients), `faults` (injection, the operator and
//! the heal) and `observe` (the reads the ledger judges, and a failed run's details).

mod consumer;
mod faults;
mod observe;
mod operator;
mod server;
mod timeline;
mod watchdog;
mod workload;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use madsim::runtime::{Handle, Runtime};
use narad_core::disk::sim::{FaultRule, SimDisk};
use narad_core::{PartitionId, TopicId};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::ledger::Ledger;
use crate::outcome::{panic_text, RunOutcome, RunSpec};
use crate::scenario::{Knobs, TopicSpec};
use crate::schedule;
use crate::seam::{derive_seed, DiskLayout, NodeSizes, Observer, PlantedBug, SimIo, SimNode};
use server::Server;
use watchdog::Watchdog;

/// Extra simulated time beyond the scenario's phases before madsim's time limit stops a run.
const TIME_LIMIT_MARGIN: Duration = Duration::from_secs(120);
/// How often the harness polls the node's status while it waits (for a boot, for a zero backlog).
const STATUS_POLL: Duration = Duration::from_millis(20);
/// How long a topic-management, status or read call may take before the harness retries it.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between retries of topic-management and read calls.
const ADMIN_RETRY: Duration = Duration::from_millis(100);

/// Simulated nanoseconds since the run started.
fn sim_now_ns() -> u64 {
    madsim::time::TimeHandle::current().elapsed().as_nanos() as u64
}

/// Runs one seed to completion in its own madsim runtime. Never panics: a panic inside the simulation
/// becomes a harness error of the outcome.
pub fn run<N: SimNode>(spec: &RunSpec) -> RunOutcome {
    // A fresh OS thread per run: std's hash keys and other per-thread random state are initialized
    // inside the simulation, from its seed (a thread that used them before would replay differently).
    let mut spec = spec.clone();
    if !spec.scenario.topology.node_counts.is_empty() {
        spec.scenario = std::sync::Arc::new(spec.scenario.for_seed(spec.seed));
    }
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
    let config = madsim::Config {
        net: faults::base_network(),
        ..madsim::Config::default()
    };
    let mut runtime = Runtime::with_seed_and_config(spec.seed, config);
    runtime
        .set_time_limit(Duration::from_millis(budget_ms) + TIME_LIMIT_MARGIN + consumer::DRAIN_MAX);
    let spec_inner = spec.clone();
    // Made here so a run that panics (a node's assertion, the time limit) still shows its trace.
    let observer = Observer::new(spec.trace, sim_now_ns);
    let observer_inner = observer.clone();
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
            runtime.block_on(simulate::<N>(spec_inner, observer_inner))
        })),
        Err(error) => panic!("cannot build the seeded tokio context: {error}"),
    }));
    match result {
        Ok(outcome) => outcome,
        Err(payload) => RunOutcome {
            seed: spec.seed,
            errors: vec![format!("panic: {}", panic_text(payload.as_ref()))],
            violations: observer.violations(),
            trace_hash: observer.trace_hash(),
            trace_events: observer.trace_events(),
            trace_lines: observer.trace_lines(),
            ..RunOutcome::default()
        },
    }
}

/// Locks `mutex`; a panic while it was held already failed the run, so its state stays readable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// One topic as the workload sees it.
struct TopicRuntime {
    spec: TopicSpec,
    current: Mutex<Option<TopicId>>,
    /// Producers hold it shared for a call; churn holds it exclusively, so every record is attributed
    /// to the incarnation it was sent to.
    gate: tokio::sync::RwLock<()>,
    /// Nodes whose view a lag held when the current incarnation was propagated: they may still
    /// take its produces for the incarnation before, so the clients send through the others (a
    /// client of a real cluster cannot tell, and the ledger could not say which incarnation such
    /// a 202 was for).
    stale_on: Mutex<std::collections::BTreeSet<usize>>,
}

/// Everything the run's tasks share.
struct World<N: SimNode> {
    spec: RunSpec,
    knobs: Knobs,
    layout: DiskLayout,
    /// The nodes, in member order (one for a single node).
    servers: Vec<Arc<Server<N>>>,
    /// Turns the node that topic management and reads start from.
    admin_turn: std::sync::atomic::AtomicUsize,
    observer: Observer,
    ledger: Mutex<Ledger>,
    topics: Vec<TopicRuntime>,
    safety_end_ns: u64,
    healed: AtomicBool,
    errors: Mutex<Vec<String>>,
    produce_calls: Mutex<u64>,
    /// Keeps the produce calls' timeouts.
    watchdog: Arc<Watchdog>,
    /// Disk fault episodes in force: (episode id, node, rule).
    disk_rules: Mutex<Vec<(u64, usize, FaultRule)>>,
    /// Chooses where bit rot strikes.
    rot_rng: Mutex<ChaCha8Rng>,
    /// The network faults in force.
    net: Mutex<faults::NetFaults>,
    /// Every fault applied: its kind and when it was in force, for the verdict's breakdown.
    fault_log: Mutex<Vec<faults::FaultWindow>>,
    /// When each node last crashed (ns; 0: never).
    last_crash_ns: Mutex<Vec<u64>>,
    /// The nodes kept down through the liveness deadline (`phases.keep_down`).
    kept_down: Mutex<std::collections::BTreeSet<usize>>,
    /// The harness's reads, for a timeline.
    reads: Mutex<Vec<crate::timeline::ReadMark>>,
    /// What the queue-mode consumers saw.
    consumption: Mutex<consumer::Consumption>,
    /// Set when the consumers stop (before the final crash).
    consumers_stop: AtomicBool,
}

impl<N: SimNode> World<N> {
    /// The shared state of a run on `servers`, before any task starts.
    fn new(
        spec: RunSpec,
        knobs: Knobs,
        servers: Vec<Arc<Server<N>>>,
        observer: Observer,
    ) -> Arc<Self> {
        let seed = spec.seed;
        let scenario = spec.scenario.clone();
        let nodes = servers.len();
        Arc::new(World {
            layout: N::layout(),
            knobs,
            servers,
            admin_turn: std::sync::atomic::AtomicUsize::new(0),
            observer,
            ledger: Mutex::new({
                let mut ledger = Ledger::new();
                ledger.set_retention(crate::ledger::RetentionRule {
                    retention_ms: scenario.retention.retention_ms,
                    retention_bytes: scenario.retention.retention_bytes,
                });
                let now = madsim::time::TimeHandle::current().now_time();
                let unix_ms = now
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |since| since.as_millis() as u64);
                ledger.set_clock_base(unix_ms.saturating_sub(sim_now_ns() / 1_000_000));
                ledger
            }),
            topics: scenario
                .topics
                .iter()
                .map(|spec| TopicRuntime {
                    spec: spec.clone(),
                    current: Mutex::new(None),
                    gate: tokio::sync::RwLock::new(()),
                    stale_on: Mutex::new(std::collections::BTreeSet::new()),
                })
                .collect(),
            safety_end_ns: scenario.phases.safety_ms * 1_000_000,
            healed: AtomicBool::new(false),
            errors: Mutex::new(Vec::new()),
            produce_calls: Mutex::new(0),
            watchdog: Arc::new(Watchdog::default()),
            disk_rules: Mutex::new(Vec::new()),
            rot_rng: Mutex::new(ChaCha8Rng::seed_from_u64(derive_seed(seed, "rot"))),
            net: Mutex::new(faults::NetFaults::default()),
            fault_log: Mutex::new(Vec::new()),
            last_crash_ns: Mutex::new(vec![0; nodes]),
            kept_down: Mutex::new(Default::default()),
            reads: Mutex::new(Vec::new()),
            consumption: Mutex::new(consumer::Consumption::default()),
            consumers_stop: AtomicBool::new(false),
            spec,
        })
    }

    /// Creates every topic of the scenario (the nodes may still be booting).
    async fn create_topics(&self) {
        for topic in &self.topics {
            match self.create_topic(topic, None, self.safety_end_ns).await {
                Some(id) => *lock(&topic.current) = Some(id),
                None => self.error(format!("topic {} could not be created", topic.spec.name)),
            }
        }
    }

    /// Starts the producers and, for the churning topics, their churn.
    fn spawn_clients(self: &Arc<Self>) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        for index in 0..self.knobs.producers {
            tasks.push(tokio::spawn(self.clone().producer(index)));
        }
        if self.knobs.churn_every_ms > 0 {
            for (index, topic) in self.topics.iter().enumerate() {
                if topic.spec.churn {
                    tasks.push(tokio::spawn(self.clone().churn(index)));
                }
            }
        }
        if !self.spec.scenario.moves.is_default() {
            tasks.push(tokio::spawn(self.clone().shape_operator()));
        }
        tasks
    }

    /// A harness error: traced, and it fails the run.
    /// A legacy owner refuses a batch's incarnation section once, and the sender's id-less resend
    /// lands: records aimed at a partition of a legacy owner that no fault touched are never
    /// rerouted (churned topics aside: their owners change with each incarnation).
    async fn check_legacy_homes(&self, report: &crate::ledger::Report, untouched: &[bool]) {
        let legacy = &self.spec.scenario.topology.legacy_nodes;
        let mut owners = std::collections::BTreeMap::new();
        let homes: Vec<(u64, Arc<str>, PartitionId)> = {
            let ledger = lock(&self.ledger);
            report
                .rerouted
                .iter()
                .filter_map(|&id| {
                    let entry = ledger.record(id)?;
                    Some((id, entry.topic.clone(), entry.aimed_at?))
                })
                .collect()
        };
        for (id, topic, partition) in homes {
            let churned = self
                .topics
                .iter()
                .any(|runtime| runtime.spec.churn && *runtime.spec.name == *topic);
            if churned {
                continue;
            }
            let key = (topic.clone(), partition);
            let owner = match owners.get(&key) {
                Some(&owner) => owner,
                None => {
                    let owner = self.owner_of(&topic, partition).await;
                    owners.insert(key, owner);
                    owner
                }
            };
            if legacy.contains(&(owner as u32)) && untouched.get(owner).copied().unwrap_or(false) {
                self.error(format!(
                    "record {id} aimed at {topic}/{partition} was rerouted, yet its owner (legacy \
                     node {owner}) never failed"
                ));
                return;
            }
        }
    }

    fn error(&self, text: String) {
        self.observer.event("harness", format_args!("ERROR {text}"));
        lock(&self.errors).push(text);
    }

    /// The produce calls' client timeout.
    fn timeout(&self) -> Duration {
        Duration::from_millis(self.spec.scenario.workload.timeout_ms)
    }

    /// The node a topic-management or read call goes to: the next one, in turn, that is not down
    /// and whose view no lag holds (any node forwards what it does not own or lead).
    fn admin_server(&self) -> &Arc<Server<N>> {
        self.admin_server_avoiding(&std::collections::BTreeSet::new())
    }

    /// [`Self::admin_server`], passing over the nodes in `avoid` too (the first in turn when
    /// every node is passed over).
    fn admin_server_avoiding(&self, avoid: &std::collections::BTreeSet<usize>) -> &Arc<Server<N>> {
        let count = self.servers.len();
        let start = self.admin_turn.fetch_add(1, Ordering::Relaxed);
        (0..count)
            .map(|step| &self.servers[(start + step) % count])
            .find(|server| {
                !lock(&server.state).down && !server.view_held() && !avoid.contains(&server.index)
            })
            .unwrap_or(&self.servers[start % count])
    }
}

/// The cluster address of member `index`: 10.0.0.{index + 1}, on the cluster port.
fn member_addr(index: usize) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([10, 0, 0, index as u8 + 1], CLUSTER_PORT))
}

/// The simulated nodes' cluster (QUIC) port.
const CLUSTER_PORT: u16 = 7943;

/// The run inside the simulation: the phases of the module documentation, then the verdict.
async fn simulate<N: SimNode>(spec: RunSpec, observer: Observer) -> RunOutcome {
    let scenario = spec.scenario.clone();
    let seed = spec.seed;
    if scenario.topology.nodes > N::nodes_max() {
        return RunOutcome {
            seed,
            errors: vec![format!(
                "the {} node runs at most {} nodes; the scenario asks for {}",
                N::name(),
                N::nodes_max(),
                scenario.topology.nodes
            )],
            ..RunOutcome::default()
        };
    }
    let knobs = scenario.draw(&mut ChaCha8Rng::seed_from_u64(derive_seed(seed, "knobs")));
    let events = spec
        .schedule
        .clone()
        .or_else(|| scenario.schedule.clone())
        .unwrap_or_else(|| {
            let mut rng = ChaCha8Rng::seed_from_u64(derive_seed(seed, "schedule"));
            schedule::generate(&scenario, &knobs, &mut rng)
        });
    observer.event(
        "harness",
        format_args!(
            "seed {seed} node {} plant_bug {:?} knobs {knobs:?} faults {}",
            N::name(),
            spec.plant_bug.map(PlantedBug::name),
            events.len()
        ),
    );
    let servers = boot_servers::<N>(&spec, &knobs, &observer);
    let safety_end_ns = scenario.phases.safety_ms * 1_000_000;
    let liveness_deadline_ns = safety_end_ns + scenario.phases.liveness_ms * 1_000_000;
    let world = World::new(spec, knobs, servers, observer.clone());

    // Topics first (the node may still be booting), then the safety phase.
    world.create_topics().await;
    let injector = tokio::spawn(world.clone().injector(events.clone()));
    let operator = tokio::spawn(world.clone().operator());
    let watchdog = tokio::spawn(world.watchdog.clone().run());
    let tasks = world.spawn_clients();
    // Drawn from a stream of their own: a scenario without consumers draws as before.
    let consumers = match N::queue_mode() {
        true => scenario
            .workload
            .consumers
            .draw(&mut ChaCha8Rng::seed_from_u64(derive_seed(
                seed,
                "consumers",
            ))),
        false => 0,
    };
    let consumer_tasks: Vec<_> = (0..consumers)
        .map(|index| tokio::spawn(world.clone().consumer(index)))
        .collect();
    let now = sim_now_ns();
    if now < safety_end_ns {
        tokio::time::sleep(Duration::from_nanos(safety_end_ns - now)).await;
    }
    injector.abort();
    for task in tasks {
        // Producers stop at the end of the safety phase; churn finishes its cycle first.
        let _ = task.await;
    }

    let reads = read_after_faults(&world, liveness_deadline_ns, consumers, consumer_tasks).await;
    operator.abort();
    watchdog.abort();
    verdict(&world, &observer, reads, consumers > 0, events).await
}

/// Boots every node on its own disk, each from the seed's streams.
fn boot_servers<N: SimNode>(
    spec: &RunSpec,
    knobs: &Knobs,
    observer: &Observer,
) -> Vec<Arc<Server<N>>> {
    let scenario = &spec.scenario;
    let seed = spec.seed;
    let sizes = NodeSizes {
        wal_segment_bytes: knobs.wal_segment_bytes,
        partition_segment_bytes: knobs.partition_segment_bytes,
        journal_segment_bytes: knobs.journal_segment_bytes,
        wal_prealloc: knobs.wal_prealloc,
        retention: scenario.retention,
    };
    let nodes = scenario.topology.nodes as usize;
    let members: Vec<std::net::SocketAddr> = (0..nodes).map(member_addr).collect();
    // Node 0's streams keep a single node's labels, so its runs replay as before the cluster.
    let label = |what: &str, index: usize| match index {
        0 => what.to_string(),
        _ => format!("{what}/{index}"),
    };
    (0..nodes)
        .map(|index| {
            let disk = SimDisk::new(derive_seed(seed, &label("disk", index)));
            let capacity = scenario.retention.disk_capacity_bytes;
            if capacity > 0 {
                disk.set_capacity(Some(capacity));
            }
            let io = SimIo::new(
                derive_seed(seed, &label("io", index)),
                knobs.op_us,
                knobs.sync_us,
            );
            Server::<N>::boot(
                index,
                members.clone(),
                disk,
                io,
                observer.clone(),
                seed,
                spec.plant_bug,
                sizes,
                scenario.topology.legacy_nodes.contains(&(index as u32)),
            )
        })
        .collect()
}

/// What the liveness phase and the final crash leave for the ledger to judge.
struct Reads {
    /// Per node: no fault touched it before the heal.
    untouched: Vec<bool>,
    /// The read at the liveness deadline.
    at_deadline: crate::ledger::Observation,
    /// The read after the final crash (the same read without one).
    after_final: crate::ledger::Observation,
    /// The nodes kept down through the liveness deadline.
    kept_down: std::collections::BTreeSet<usize>,
}

/// The liveness phase (every fault heals, then every partition is read) and the final crash (every
/// node at once, then a read after the settle period); the consumers run up to the crash and drain
/// after it.
async fn read_after_faults<N: SimNode>(
    world: &Arc<World<N>>,
    liveness_deadline_ns: u64,
    consumers: u64,
    consumer_tasks: Vec<tokio::task::JoinHandle<()>>,
) -> Reads {
    let servers = &world.servers;
    // Which nodes no fault touched, as the faults heal (every crash, pause and restart bumps the
    // generation).
    let untouched: Vec<bool> = servers
        .iter()
        .map(|server| lock(&server.state).generation == 0)
        .collect();
    // Liveness phase.
    world.heal();
    world.excuse_stranded_topics().await;
    let at_deadline = world.observe(liveness_deadline_ns, "liveness").await;
    let kept_down = std::mem::take(&mut *lock(&world.kept_down));
    for &index in &kept_down {
        servers[index].restart();
    }

    // Final crash: what was visible must also be durable. The consumers run up to it, so it takes
    // leases with it.
    let after_final = if world.spec.scenario.phases.final_crash {
        // Power loss of every node at once, then every node starts again.
        for server in servers {
            server.crash("final");
        }
        world.consumers_stop.store(true, Ordering::Relaxed);
        for server in servers {
            server.restart();
        }
        let settle_deadline_ns =
            sim_now_ns() + world.spec.scenario.phases.final_settle_ms * 1_000_000;
        world.observe(settle_deadline_ns, "final").await
    } else {
        at_deadline.clone()
    };
    world.consumers_stop.store(true, Ordering::Relaxed);
    for task in consumer_tasks {
        let _ = task.await;
    }

    if consumers > 0 {
        world.drain().await;
    }
    Reads {
        untouched,
        at_deadline,
        after_final,
        kept_down,
    }
}

/// The ledger's judgement of the reads, the run's details, and the nodes released.
async fn verdict<N: SimNode>(
    world: &Arc<World<N>>,
    observer: &Observer,
    reads: Reads,
    consumed: bool,
    events: Vec<crate::fault::FaultEvent>,
) -> RunOutcome {
    let servers = &world.servers;
    let Reads {
        untouched,
        at_deadline,
        after_final,
        kept_down,
    } = reads;
    let mut report = lock(&world.ledger).check(&at_deadline, &after_final);
    if !world.spec.scenario.topology.legacy_nodes.is_empty() {
        world.check_legacy_homes(&report, &untouched).await;
    }
    if consumed {
        let owed = if world.spec.scenario.retention.is_default() {
            after_final.clone()
        } else {
            // Retention may remove what the final read served before the drain reaches it: owed
            // are the records served both then and after the drain.
            let still = world.read_all().await;
            let ids: std::collections::BTreeSet<u64> = still
                .served
                .iter()
                .filter_map(|served| served.record_id().ok())
                .collect();
            let mut owed = after_final.clone();
            owed.served
                .retain(|served| served.record_id().is_ok_and(|id| ids.contains(&id)));
            owed
        };
        let consumption = lock(&world.consumption);
        let mut consumed = consumption.judge(&owed);
        // The whole cluster's power loss may come as the safety phase ends (it is not in the
        // fault log): deliveries after it are not judged.
        let reboots: Vec<u64> = servers
            .iter()
            .flat_map(|server| lock(&server.reboots).clone())
            .collect();
        consumed.acked_redelivered =
            consumption.acked_redelivered(&lock(&world.fault_log), &reboots, world.safety_end_ns);
        report.consumed = Some(consumed);
        // The deliveries against the reads (the reads against each other were checked above).
        let conflicts = consumption.offset_conflicts(&[&at_deadline, &after_final]);
        drop(consumption);
        for conflict in conflicts {
            if !report.offset_conflicts.contains(&conflict) {
                report.offset_conflicts.push(conflict);
            }
        }
    }
    observer.event("harness", format_args!("verdict {}", report.verdict_line()));
    let details = world.details(&report);
    let timeline = if world.spec.trace {
        let kept: Vec<usize> = kept_down.iter().copied().collect();
        Some(world.timeline(&report, &after_final, &kept).await)
    } else {
        None
    };
    let breakdown = if servers.len() > 1 {
        let log = lock(&world.fault_log).clone();
        lock(&world.ledger).breakdown(&report, |at_ns| faults::kinds_around(&log, at_ns))
    } else {
        Default::default()
    };
    // madsim frees no task when its runtime drops, and a node's tasks hold each other (channels,
    // wakers) in cycles: kill the node and let the executor drop its tasks, or every run leaks them.
    for server in servers {
        Handle::current().kill(server.madsim_id);
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
    for server in servers {
        server.release();
    }
    let errors = lock(&world.errors).clone();
    let produce_calls = *lock(&world.produce_calls);
    RunOutcome {
        seed: world.spec.seed,
        accepted: report.accepted,
        report,
        violations: observer.violations(),
        errors,
        trace_hash: observer.trace_hash(),
        trace_events: observer.trace_events(),
        trace_lines: observer.trace_lines(),
        schedule: events,
        sim_ns: sim_now_ns(),
        produce_calls,
        crashes: servers
            .iter()
            .map(|server| u64::from(server.crashes.load(Ordering::Relaxed)))
            .sum(),
        details,
        breakdown,
        timeline,
    }
}

#[cfg(test)]
mod tests;
