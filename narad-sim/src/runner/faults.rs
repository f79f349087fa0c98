//! Fault injection: the schedule's events applied to the node, its disk and its I/O latency, the
//! operator who restarts a latched node, and the heal that starts the liveness phase.
//!
//! Contract: each event strikes at its instant of the safety phase, until the heal (a crash of a node
//! that is down, or a pause of one down or paused, is skipped and traced). A crash's restart and a
//! pause's resume are timers that do nothing once a later crash, pause or the heal changed the node's
//! state (its generation). Disk error episodes are [`SimDisk`](narad_core::disk::sim::SimDisk) fault
//! rules on the target's path prefix and slow-disk episodes [`SimIo`](crate::seam::SimIo) episodes;
//! an episode's end removes that episode only. Bit rot flips one bit of synced data and excuses,
//! before the flip, the records it may destroy. [`World::heal`] ends every fault at once.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use madsim::runtime::Handle;
use narad_core::disk::sim::{FaultKind as DiskFaultKind, FaultRule};
use rand::Rng;

use super::server::{Call, Server};
use super::{lock, sim_now_ns, World, ADMIN_TIMEOUT};
use crate::fault::{DiskError, FaultEvent, Target};
use crate::payload;
use crate::seam::SimNode;

/// How often the operator looks at the node's status.
const OPERATOR_POLL: Duration = Duration::from_millis(250);
/// How long the injector waits for a node's status when it looks for the leader.
const LEADER_ASK_TIMEOUT: Duration = Duration::from_millis(50);
/// How long a latch holds before the operator restarts the process.
const OPERATOR_RESTART_AFTER: Duration = Duration::from_secs(1);

impl<N: SimNode> World<N> {
    /// The path prefix of a fault target on the node's disk.
    fn prefix(&self, target: Target) -> String {
        match target {
            Target::Wal => self.layout.wal_prefix.clone(),
            Target::Partitions => self.layout.partition_prefix.clone(),
            Target::All => String::new(),
        }
    }

    /// Applies the schedule's events at their instants until the faults heal.
    pub(super) async fn injector(self: Arc<Self>, events: Vec<FaultEvent>) {
        for (episode, event) in events.into_iter().enumerate() {
            let at_ns = event.at_us() * 1000;
            let now = sim_now_ns();
            if at_ns > now {
                tokio::time::sleep(Duration::from_nanos(at_ns - now)).await;
            }
            if self.healed.load(Ordering::Relaxed) {
                return;
            }
            let index = self.struck(event.node()).await;
            self.clone().apply(episode as u64, event, index);
        }
    }

    /// The node an event strikes: the one it names, else the single node, else the node that says
    /// it leads the metastore now (node 0 if none does).
    async fn struck(&self, node: Option<u32>) -> usize {
        if let Some(node) = node {
            if (node as usize) < self.servers.len() {
                return node as usize;
            }
            // A scenario's schedule is validated; one handed in otherwise may still be wrong.
            self.error(format!(
                "a fault names node {node} of {}",
                self.servers.len()
            ));
            return 0;
        }
        if self.servers.len() == 1 {
            return 0;
        }
        for server in &self.servers {
            let state = *lock(&server.state);
            if state.down || state.paused {
                continue;
            }
            let status = server
                .call(
                    LEADER_ASK_TIMEOUT,
                    |node| async move { node.status().await },
                )
                .await;
            if matches!(status, Call::Done(status) if status.leader) {
                return server.index;
            }
        }
        0
    }

    /// Applies one fault to node `index` now; its end (restart, resume, episode end) is a timer task.
    fn apply(self: Arc<Self>, episode: u64, event: FaultEvent, index: usize) {
        self.probe.event(
            "fault",
            format_args!("apply {} to node {index}", event.describe()),
        );
        let server = self.servers[index].clone();
        match event {
            FaultEvent::Crash { down_ms, .. } => {
                if lock(&server.state).down {
                    self.probe
                        .event("fault", format_args!("skip: node is down"));
                    return;
                }
                server.crash("scheduled");
                let generation = lock(&server.state).generation;
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(down_ms)).await;
                    let current = lock(&server.state).generation;
                    if current == generation && !self.healed.load(Ordering::Relaxed) {
                        server.restart();
                    }
                });
            }
            FaultEvent::Pause { duration_ms, .. } => {
                let generation = {
                    let mut state = lock(&server.state);
                    if state.down || state.paused {
                        self.probe
                            .event("fault", format_args!("skip: node is down or paused"));
                        return;
                    }
                    state.paused = true;
                    state.generation += 1;
                    Handle::current().pause(server.madsim_id);
                    state.generation
                };
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(duration_ms)).await;
                    let mut state = lock(&server.state);
                    if state.generation == generation && state.paused {
                        state.paused = false;
                        Handle::current().resume(server.madsim_id);
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
                server.disk.add_fault(rule.clone());
                lock(&self.disk_rules).push((episode, index, rule));
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(duration_ms)).await;
                    if self.healed.load(Ordering::Relaxed) {
                        return;
                    }
                    // SimDisk can only clear every rule: clear, then re-add the others in force.
                    let mut rules = lock(&self.disk_rules);
                    rules.retain(|(id, _, _)| *id != episode);
                    server.disk.clear_faults();
                    for (_, node, rule) in rules.iter() {
                        if *node == index {
                            server.disk.add_fault(rule.clone());
                        }
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
                let id = server.io.slow_begin(&self.prefix(target), latency_us);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(duration_ms)).await;
                    server.io.slow_end(id);
                    self.probe
                        .event("fault", format_args!("end slow episode {episode}"));
                });
            }
            FaultEvent::BitRot { target, .. } => self.rot(&server, target),
        }
    }

    /// Flips a bit of synced data and excuses the records it may destroy: those of the checksummed
    /// unit holding the bit ([`DiskLayout::rot_unit`]: a partition frame may hold many records on both
    /// sides of it), or, where the node cannot name the unit (or rot strikes outside the partition
    /// logs), every payload in every file of the struck file's directory. The victims are found in the
    /// images *before* the flip, so a flip inside a payload header cannot hide its own record.
    fn rot(&self, server: &Server<N>, target: Target) {
        let prefix = self.prefix(target);
        let disk = &server.disk;
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
        let victims = unit.unwrap_or_else(|| payloads_under(disk, &dir));
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

    /// The operator: a node whose disk failure latched a component (it says so in its status, as an
    /// alert would) is restarted once the latch has held for [`OPERATOR_RESTART_AFTER`]. Looks at
    /// every node in turn, for the whole run, faults or not.
    pub(super) async fn operator(self: Arc<Self>) {
        let mut latched_since: Vec<Option<u64>> = vec![None; self.servers.len()];
        loop {
            tokio::time::sleep(OPERATOR_POLL).await;
            for (server, since) in self.servers.iter().zip(latched_since.iter_mut()) {
                let state = *lock(&server.state);
                if state.down || state.paused {
                    *since = None;
                    continue;
                }
                let status = server
                    .call(ADMIN_TIMEOUT, |node| async move { node.status().await })
                    .await;
                if !matches!(status, Call::Done(status) if status.latched) {
                    *since = None;
                    continue;
                }
                let now = sim_now_ns();
                let held_since = *since.get_or_insert(now);
                if now - held_since >= OPERATOR_RESTART_AFTER.as_nanos() as u64
                    && lock(&server.state).generation == state.generation
                {
                    server.process_restart("operator: a component latched");
                    *since = None;
                }
            }
        }
    }

    /// Ends every fault: the liveness phase starts.
    pub(super) fn heal(&self) {
        self.healed.store(true, Ordering::Relaxed);
        lock(&self.disk_rules).clear();
        for server in &self.servers {
            server.disk.clear_faults();
            server.io.heal();
            let state = *lock(&server.state);
            if state.down {
                server.restart();
            } else if state.paused {
                let mut state = lock(&server.state);
                state.paused = false;
                state.generation += 1;
                Handle::current().resume(server.madsim_id);
            }
        }
        self.probe
            .event("harness", format_args!("heal: liveness phase starts"));
    }
}

/// Every payload id in the durable images of the files directly in `dir` of `disk`.
fn payloads_under(disk: &narad_core::disk::sim::SimDisk, dir: &str) -> Vec<u64> {
    disk.paths()
        .into_iter()
        .filter(|path| narad_core::disk::parent_dir(path) == dir)
        .filter_map(|path| disk.durable_image(&path))
        .flat_map(|image| payload::scan(&image).into_iter().map(|found| found.id))
        .collect()
}
