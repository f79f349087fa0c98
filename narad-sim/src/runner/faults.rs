//! Fault injection: the schedule's events applied to the node, its disk and its I/O latency, the
//! operator who restarts a latched node, and the heal that starts the liveness phase.
//!
//! Contract: each event strikes at its instant of the safety phase, until the heal (a crash of a node
//! that is down, or a pause of one down or paused, is skipped and traced). A crash's restart and a
//! pause's resume are timers that do nothing once a later crash, pause or the heal changed the node's
//! state (its generation). Disk error episodes are [`SimDisk`](narad_core::disk::sim::SimDisk) fault
//! rules on the target's path prefix and slow-disk episodes [`SimIo`](crate::seam::SimIo) episodes;
//! an episode's end removes that episode only. Bit rot flips one bit of synced data and excuses,
//! before the flip, the records it may destroy. A partition clogs madsim links between the node and
//! its peers (counted per link, so overlapping cuts end one by one); a network episode sets madsim's
//! packet loss and latency for the whole network (the worst of the episodes in force). Clients call
//! nodes directly, not over madsim's network, so a partitioned node still takes produces.
//! [`World::heal`] ends every fault at once.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use madsim::net::NetSim;
use madsim::runtime::Handle;
use madsim::task::NodeId as MadsimNodeId;
use narad_core::disk::sim::{DiskFault, FaultRule};
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
/// A produce call is attributed to every fault in force within this long after it was sent (its
/// records' dispatch, reroute and commit happen then).
const ATTRIBUTION_WINDOW: Duration = Duration::from_secs(10);

/// A fault as it was applied: its kind and when it was in force.
#[derive(Clone, Debug)]
pub struct FaultWindow {
    pub(super) kind: &'static str,
    pub(super) start_ns: u64,
    pub(super) end_ns: u64,
    /// The node it struck (`None`: the whole network).
    pub(super) node: Option<usize>,
    /// A partition's other side: `Some(None)` every other node.
    pub(super) peer: Option<Option<usize>>,
    /// What it was, as the trace describes it.
    pub(super) label: String,
}

/// The kinds of the faults in force within [`ATTRIBUTION_WINDOW`] after `at_ns`, each once.
pub(super) fn kinds_around(log: &[FaultWindow], at_ns: u64) -> Vec<&'static str> {
    let until = at_ns + ATTRIBUTION_WINDOW.as_nanos() as u64;
    let mut kinds: Vec<&'static str> = log
        .iter()
        .filter(|window| window.start_ns <= until && window.end_ns >= at_ns)
        .map(|window| window.kind)
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    kinds
}

impl<N: SimNode> World<N> {
    /// The path prefix of a fault target on the node's disk.
    fn prefix(&self, target: Target) -> String {
        match target {
            Target::Wal => self.layout.wal_prefix.clone(),
            Target::Partitions => self.layout.partition_prefix.clone(),
            Target::All => String::new(),
        }
    }

    /// Every prefix a disk error or a slow episode aimed at `target` strikes: the owner journal's
    /// with the partition logs'.
    fn prefixes(&self, target: Target) -> Vec<String> {
        let mut prefixes = vec![self.prefix(target)];
        if target == Target::Partitions {
            prefixes.extend(self.layout.journal_prefix.clone());
        }
        prefixes
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
            if event.is_global() {
                self.clone().apply_global(episode as u64, event);
                continue;
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

    /// Logs a fault applied now to node `node` (`None`: the network), in force for `duration_ms`.
    fn log_fault(&self, event: &FaultEvent, node: Option<usize>, duration_ms: u64) {
        let start_ns = sim_now_ns();
        let peer = match event {
            FaultEvent::Partition { peer, .. } => Some(peer.map(|peer| peer as usize)),
            _ => None,
        };
        lock(&self.fault_log).push(FaultWindow {
            kind: event.kind_name(),
            start_ns,
            end_ns: start_ns + duration_ms * 1_000_000,
            node,
            peer,
            label: event.describe(),
        });
    }

    /// The links a partition of node `index` cuts: from it to `peer` (every other node when
    /// `None`), and back too unless `one_way`.
    fn links_of(
        &self,
        index: usize,
        peer: Option<usize>,
        one_way: bool,
    ) -> Vec<(MadsimNodeId, MadsimNodeId)> {
        let server = &self.servers[index];
        let peers: Vec<usize> = match peer {
            Some(peer) => vec![peer],
            None => (0..self.servers.len()).collect(),
        };
        let mut links = Vec::new();
        for peer in peers.into_iter().filter(|&peer| peer != index) {
            let Some(other) = self.servers.get(peer) else {
                continue;
            };
            links.push((server.madsim_id, other.madsim_id));
            if !one_way {
                links.push((other.madsim_id, server.madsim_id));
            }
        }
        links
    }

    /// Applies one fault to node `index` now; its end (restart, resume, episode end) is a timer task.
    fn apply(self: Arc<Self>, episode: u64, event: FaultEvent, index: usize) {
        self.observer.event(
            "fault",
            format_args!("apply {} to node {index}", event.describe()),
        );
        match event {
            FaultEvent::Crash { down_ms, .. } => self.crash_node(&event, index, down_ms),
            FaultEvent::Pause { duration_ms, .. } => self.pause_node(&event, index, duration_ms),
            FaultEvent::Disk {
                target,
                error,
                chance_ppm,
                duration_ms,
                ..
            } => {
                self.log_fault(&event, Some(index), duration_ms);
                self.disk_episode(episode, index, target, error, chance_ppm, duration_ms);
            }
            FaultEvent::SlowDisk {
                target,
                latency_us,
                duration_ms,
                ..
            } => {
                self.log_fault(&event, Some(index), duration_ms);
                self.slow_disk_episode(episode, index, target, latency_us, duration_ms);
            }
            FaultEvent::Partition {
                peer,
                one_way,
                duration_ms,
                ..
            } => self.partition_episode(episode, &event, index, peer, one_way, duration_ms),
            FaultEvent::Lag {
                duration_ms,
                cut_ms,
                ..
            } => self.lag_episode(episode, &event, index, duration_ms, cut_ms),
            FaultEvent::Net { .. } => unreachable!("a network episode strikes no node"),
            FaultEvent::BitRot { target, .. } => {
                self.log_fault(&event, Some(index), 0);
                let server = self.servers[index].clone();
                self.rot(&server, target)
            }
        }
    }

    /// Crashes node `index` (unless it is down) and restarts it `down_ms` later, unless it crashed
    /// again meanwhile or the faults healed.
    fn crash_node(self: Arc<Self>, event: &FaultEvent, index: usize, down_ms: u64) {
        let server = self.servers[index].clone();
        if lock(&server.state).down {
            self.observer
                .event("fault", format_args!("skip: node is down"));
            return;
        }
        self.log_fault(event, Some(index), down_ms);
        lock(&self.last_crash_ns)[index] = sim_now_ns();
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

    /// Pauses node `index` (unless it is down or paused) and resumes it `duration_ms` later, unless
    /// something else restarted or resumed it meanwhile.
    fn pause_node(self: Arc<Self>, event: &FaultEvent, index: usize, duration_ms: u64) {
        let server = self.servers[index].clone();
        let generation = {
            let mut state = lock(&server.state);
            if state.down || state.paused {
                self.observer
                    .event("fault", format_args!("skip: node is down or paused"));
                return;
            }
            self.log_fault(event, Some(index), duration_ms);
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
                self.observer.event("fault", format_args!("resume"));
            }
        });
    }

    /// Fails node `index`'s I/O under `target` with `error` for `duration_ms`.
    fn disk_episode(
        self: Arc<Self>,
        episode: u64,
        index: usize,
        target: Target,
        error: DiskError,
        chance_ppm: u32,
        duration_ms: u64,
    ) {
        let server = self.servers[index].clone();
        let kind = match error {
            DiskError::FsyncEio => DiskFault::SyncEio,
            DiskError::WriteEio => DiskFault::WriteEio,
            DiskError::Enospc => DiskFault::NoSpace,
        };
        for path_prefix in self.prefixes(target) {
            let rule = FaultRule {
                path_prefix,
                kind,
                chance_ppm,
                remaining: None,
            };
            server.disk.add_fault(rule.clone());
            lock(&self.disk_rules).push((episode, index, rule));
        }
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
            self.observer
                .event("fault", format_args!("end disk episode {episode}"));
        });
    }

    /// Slows node `index`'s I/O under `target` by `latency_us` for `duration_ms`.
    fn slow_disk_episode(
        self: Arc<Self>,
        episode: u64,
        index: usize,
        target: Target,
        latency_us: u64,
        duration_ms: u64,
    ) {
        let server = self.servers[index].clone();
        let ids: Vec<_> = self
            .prefixes(target)
            .iter()
            .map(|prefix| server.io.slow_begin(prefix, latency_us))
            .collect();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(duration_ms)).await;
            for id in ids {
                server.io.slow_end(id);
            }
            self.observer
                .event("fault", format_args!("end slow episode {episode}"));
        });
    }

    /// Cuts node `index`'s links to `peer` (every other node: `None`), one way or both, for
    /// `duration_ms`.
    fn partition_episode(
        self: Arc<Self>,
        episode: u64,
        event: &FaultEvent,
        index: usize,
        peer: Option<u32>,
        one_way: bool,
        duration_ms: u64,
    ) {
        let links = self.links_of(index, peer.map(|peer| peer as usize), one_way);
        if links.is_empty() {
            // The leader of the moment turned out to be the peer itself.
            self.observer
                .event("fault", format_args!("skip: no link to cut"));
            return;
        }
        self.log_fault(event, Some(index), duration_ms);
        lock(&self.net).clog(&links);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(duration_ms)).await;
            if self.healed.load(Ordering::Relaxed) {
                return;
            }
            lock(&self.net).unclog(&links);
            self.observer
                .event("fault", format_args!("end partition episode {episode}"));
        });
    }

    /// Holds node `index`'s view of the metastore for `duration_ms`, cut off from every peer for
    /// the first `cut_ms` of it.
    fn lag_episode(
        self: Arc<Self>,
        episode: u64,
        event: &FaultEvent,
        index: usize,
        duration_ms: u64,
        cut_ms: u64,
    ) {
        let server = self.servers[index].clone();
        self.log_fault(event, Some(index), duration_ms);
        server.hold_view();
        // The cut: every link to and from the node, as a two-way partition from all peers.
        let links = self.links_of(index, None, false);
        if cut_ms > 0 {
            let cut = FaultEvent::Partition {
                at_us: event.at_us(),
                node: Some(index as u32),
                peer: None,
                one_way: false,
                duration_ms: cut_ms,
            };
            self.log_fault(&cut, Some(index), cut_ms);
            lock(&self.net).clog(&links);
        }
        tokio::spawn(async move {
            if cut_ms > 0 {
                tokio::time::sleep(Duration::from_millis(cut_ms)).await;
                if self.healed.load(Ordering::Relaxed) {
                    return;
                }
                lock(&self.net).unclog(&links);
            }
            tokio::time::sleep(Duration::from_millis(duration_ms.saturating_sub(cut_ms))).await;
            if self.healed.load(Ordering::Relaxed) {
                return;
            }
            server.release_view(false);
            self.observer
                .event("fault", format_args!("end lag episode {episode}"));
        });
    }

    /// Applies a fault of the whole network now; its end is a timer task.
    fn apply_global(self: Arc<Self>, episode: u64, event: FaultEvent) {
        self.observer
            .event("fault", format_args!("apply {}", event.describe()));
        let FaultEvent::Net {
            loss_ppm,
            latency_min_us,
            latency_max_us,
            duration_ms,
            ..
        } = event
        else {
            unreachable!("only network episodes are global");
        };
        self.log_fault(&event, None, duration_ms);
        lock(&self.net).begin(
            episode,
            NetEpisode {
                loss_ppm,
                latency_us: latency_min_us..latency_max_us,
            },
        );
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(duration_ms)).await;
            if self.healed.load(Ordering::Relaxed) {
                return;
            }
            lock(&self.net).end(episode);
            self.observer
                .event("fault", format_args!("end net episode {episode}"));
        });
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
            self.observer.event(
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
        self.observer.event(
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

    /// The nodes down now that stay down through the liveness deadline (`phases.keep_down`): every
    /// learner that is down, and of the metastore's voters as many as leave a quorum of them up (a
    /// node boots only through a read barrier of the leader). Tells the ledger which records they
    /// may hold.
    fn keep_down(&self) -> std::collections::BTreeSet<usize> {
        let mut kept = std::collections::BTreeSet::new();
        if !self.spec.scenario.phases.keep_down {
            return kept;
        }
        // Member ids are node index + 1, as the nodes are told their members.
        let members = (0..self.servers.len()).map(|index| narad_core::NodeId(index as u32 + 1));
        let (voters, _) = narad_core::metastore::voters_and_learners(members);
        let voter = |index: usize| voters.contains(&narad_core::NodeId(index as u32 + 1));
        let mut voters_down_tolerated = (voters.len() - 1) / 2;
        for server in &self.servers {
            if !lock(&server.state).down {
                continue;
            }
            if !voter(server.index) {
                kept.insert(server.index);
            } else if voters_down_tolerated > 0 {
                voters_down_tolerated -= 1;
                kept.insert(server.index);
            }
        }
        if !kept.is_empty() {
            let crashes = lock(&self.last_crash_ns);
            let before_ns = kept.iter().map(|&index| crashes[index]).max().unwrap_or(0);
            let nodes = kept.iter().map(|&index| index as u32).collect();
            lock(&self.ledger).excuse_at_deadline(nodes, before_ns);
        }
        *lock(&self.kept_down) = kept.clone();
        kept
    }

    /// Tells the ledger which topics have every partition owned by a node kept down: their records
    /// cannot reroute, so they need not be visible at the liveness deadline.
    pub(super) async fn excuse_stranded_topics(&self) {
        let kept = lock(&self.kept_down).clone();
        if kept.is_empty() {
            return;
        }
        for topic in &self.topics {
            let mut stranded = true;
            for partition in 0..topic.spec.partitions {
                let owner = self
                    .owner_of(&topic.spec.name, narad_core::PartitionId(partition))
                    .await;
                stranded &= kept.contains(&owner);
            }
            if stranded {
                self.observer.event(
                    "harness",
                    format_args!("{}: every partition's owner stays down", topic.spec.name),
                );
                lock(&self.ledger).excuse_topic_at_deadline(&topic.spec.name);
            }
        }
    }

    /// Ends every fault: the liveness phase starts.
    pub(super) fn heal(&self) {
        self.healed.store(true, Ordering::Relaxed);
        lock(&self.disk_rules).clear();
        lock(&self.net).heal();
        let kept = self.keep_down();
        for server in &self.servers {
            server.disk.clear_faults();
            server.io.heal();
            server.release_view(true);
            let state = *lock(&server.state);
            if state.down && kept.contains(&server.index) {
                self.observer.event(
                    "harness",
                    format_args!(
                        "node {} stays down through the liveness deadline",
                        server.index
                    ),
                );
            } else if state.down {
                server.restart();
            } else if state.paused {
                let mut state = lock(&server.state);
                state.paused = false;
                state.generation += 1;
                Handle::current().resume(server.madsim_id);
            }
        }
        self.observer
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

/// A lossy or slow network episode in force.
#[derive(Clone, Debug)]
pub(super) struct NetEpisode {
    loss_ppm: u32,
    latency_us: Range<u64>,
}

/// The network faults in force, kept so that overlapping ones end one by one: clogged links with
/// the number of partitions that cut each, and the network episodes (madsim has one configuration
/// for the whole network, so the worst of each setting is the one in force).
#[derive(Debug, Default)]
pub(super) struct NetFaults {
    clogged: BTreeMap<(MadsimNodeId, MadsimNodeId), u32>,
    episodes: BTreeMap<u64, NetEpisode>,
}

impl NetFaults {
    fn clog(&mut self, links: &[(MadsimNodeId, MadsimNodeId)]) {
        let net = NetSim::current();
        for &(src, dst) in links {
            let cuts = self.clogged.entry((src, dst)).or_default();
            if *cuts == 0 {
                net.clog_link(src, dst);
            }
            *cuts += 1;
        }
    }

    fn unclog(&mut self, links: &[(MadsimNodeId, MadsimNodeId)]) {
        let net = NetSim::current();
        for link in links {
            let Some(cuts) = self.clogged.get_mut(link) else {
                continue;
            };
            *cuts -= 1;
            if *cuts == 0 {
                self.clogged.remove(link);
                net.unclog_link(link.0, link.1);
            }
        }
    }

    fn begin(&mut self, episode: u64, net: NetEpisode) {
        self.episodes.insert(episode, net);
        self.configure();
    }

    fn end(&mut self, episode: u64) {
        self.episodes.remove(&episode);
        self.configure();
    }

    fn configure(&self) {
        let mut config = base_network();
        if !self.episodes.is_empty() {
            let loss = self
                .episodes
                .values()
                .map(|e| e.loss_ppm)
                .max()
                .unwrap_or(0);
            let least = self.episodes.values().map(|e| e.latency_us.start).max();
            let most = self.episodes.values().map(|e| e.latency_us.end).max();
            config.packet_loss_rate = f64::from(loss) / 1e6;
            if let (Some(least), Some(most)) = (least, most) {
                config.send_latency =
                    Duration::from_micros(least)..Duration::from_micros(most.max(least + 1));
            }
        }
        NetSim::current().update_config(|current| *current = config);
    }

    fn heal(&mut self) {
        let net = NetSim::current();
        for (src, dst) in std::mem::take(&mut self.clogged).into_keys() {
            net.unclog_link(src, dst);
        }
        if !self.episodes.is_empty() {
            self.episodes.clear();
            self.configure();
        }
    }
}

/// The network between episodes: a datacenter's, with a small jitter (madsim's own default, a
/// uniform 1 to 10 ms per packet, reorders most packets of every burst, which no link of a
/// cluster does outside a fault; latency episodes bring that back on purpose).
pub(super) fn base_network() -> madsim::net::Config {
    madsim::net::Config {
        send_latency: BASE_LATENCY_MIN..BASE_LATENCY_MAX,
        ..madsim::net::Config::default()
    }
}

/// The least one-way latency between episodes (madsim adds a millisecond to every send and receive).
const BASE_LATENCY_MIN: Duration = Duration::from_micros(200);
/// The greatest one-way latency between episodes.
const BASE_LATENCY_MAX: Duration = Duration::from_micros(400);
