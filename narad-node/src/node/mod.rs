//! The node: every host of the produce path wired together over one [`Disk`], without the HTTP
//! listener (which `crate::server` adds; the simulator calls the same route functions directly).
//!
//! # Start-up ([`start`])
//! 1. The metastore opens on the disk (`metastore/`) and replays its log in the background.
//! 2. The partition host starts and follows the replica; the HTTP [`App`] is built around it, the WAL
//!    sink (empty until the WAL opens: produces get 503) and the metrics; the [`disk_guard`] starts
//!    sampling the disk's free space. [`start`] returns here, so a listener can answer `/readyz` with
//!    503 while recovery runs.
//! 3. In the background, recovery: the metastore catches up and lists this node as a member; the
//!    ingress WAL and its checkpoint open (the checkpoint's startup sync, then the WAL's torn-tail
//!    repair: its reads serve nothing before that); the sink is attached; every partition log of every
//!    topic finishes opening (a log whose open fails is logged and counted, and does not hold the node
//!    back); the dispatcher starts, in the ingress host's task, at the recovered checkpoint, reaching
//!    every owner through the node's one [`crate::ingress::transport::CommitTransport`], and replays what is
//!    undispatched. Then the
//!    node is ready ([`Node::wait_ready`], `/readyz` 200). A failure on the way (a corrupt WAL) is
//!    reported by [`Node::wait_ready`]: the node never turns ready.
//!
//! # Shutdown ([`Node::shutdown`])
//! The dispatcher stops (commits in flight finish or not; what they carried is replayed next time), then
//! the WAL host stops: appends in flight finish and the checkpoint is flushed (one sync).
//!
//! # Data layout (relative to the disk root, the data directory)
//! `metastore/` (raft log, hard state, snapshot); `ingress/produce/` (`<20-digit seq>.wal` segments and
//! `checkpoint`); `topics/<topic>/<incarnation id>/p<05 partition>/` (`<20-digit offset>.log` segments).

pub mod consumers;
pub mod disk_guard;
pub mod local_transport;
pub mod metered_disk;
pub mod moves;
pub mod partitions;
pub mod peers;
pub mod sink;

#[cfg(test)]
mod tests;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use narad_core::disk::Disk;
use narad_core::ids::NodeId;
use narad_core::partition::journal::JournalConfig;
use narad_core::wal::WalConfig;
use narad_core::Seq;
use tokio::sync::watch;

use self::local_transport::LocalTransport;
use self::metered_disk::MeteredDisk;
use self::partitions::PartitionHost;
use self::sink::WalSink;
use crate::clock::Clock;
use crate::config::Config;
use crate::hooks::NodeHooks;
use crate::http::App;
use crate::ingress::dispatch::DispatchHost;
use crate::ingress::{DurableObserver, IngressHost, IngressHostConfig};
use crate::metastore::{Metastore, MetastoreOptions, ProposeError};
use crate::metrics::Metrics;

/// How often a cluster member that is catching up with the metastore asks the leader again.
const CATCH_UP_RETRY: Duration = Duration::from_millis(100);
/// How often a boot that waits (for partition logs whose I/O is retried, for the metastore) says so.
const BOOT_PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// How long a shutdown waits for its peers to learn the cluster connections closed.
const CLUSTER_CLOSE_WAIT: Duration = Duration::from_secs(1);

/// The ingress WAL's directory (segments and the dispatch checkpoint).
pub const WAL_DIR: &str = "ingress/produce";

/// What a node is started with.
pub struct NodeOptions {
    /// The data directory: `FsDisk` in the real node, `SimDisk` under the simulator.
    pub disk: Arc<dyn Disk>,
    /// The configuration (`cluster.node_id` and the `storage` settings are read here).
    pub config: Config,
    /// The actors' clock.
    pub clock: Clock,
    /// Seeds every random choice of the node (keyless rotations' starts).
    pub seed: u64,
    /// This node's address as recorded in the metastore's member set.
    pub member_addr: String,
    /// What a test or the simulator plugs in; [`NodeHooks::default`] in production.
    pub hooks: NodeHooks,
    /// The cluster transport to start, for a cluster member (`None`: a single node).
    pub cluster: Option<ClusterSetup>,
}

/// What a cluster member starts its transport with.
#[derive(Debug)]
pub struct ClusterSetup {
    /// The transport's address, peers and secret.
    pub options: crate::cluster::ClusterOptions,
    /// This node's certificate (self-signed, or from an operator CA).
    pub identity: crate::cluster::tls::TlsIdentity,
}

impl std::fmt::Debug for NodeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeOptions")
            .field("config", &self.config)
            .field("seed", &self.seed)
            .field("member_addr", &self.member_addr)
            .field("hooks", &self.hooks)
            .finish_non_exhaustive()
    }
}

/// Why the node could not start, or recover.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// The metastore could not open or catch up.
    #[error("metastore: {0}")]
    Metastore(String),
    /// The ingress WAL or its checkpoint could not open.
    #[error("ingress WAL: {0}")]
    Wal(String),
    /// The partition host stopped during recovery.
    #[error("partition logs: {0}")]
    Partitions(String),
    /// The cluster transport could not start.
    #[error("cluster transport: {0}")]
    Cluster(String),
}

/// Where recovery is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Recovery {
    Running,
    Ready,
    Failed(StartError),
}

/// What `/readyz` and the gauges say, for callers without HTTP (the simulator).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeStatus {
    /// Recovery is done (`/readyz` 200).
    pub ready: bool,
    /// `narad_ingress_dispatch_backlog_records`: records a restart would replay.
    pub backlog_records: u64,
    /// `narad_ingress_wal_failed`: the WAL latched a disk failure.
    pub wal_failed: bool,
    /// The metastore latched a disk failure (topic changes answer 503 until restart).
    pub metastore_failed: bool,
    /// Partition logs that only a restart can open again (their recovery's final sync failed).
    pub partitions_restart_needed: usize,
    /// `narad_disk_guard_active`: produces answer 507 for want of free space.
    pub disk_guard_active: bool,
}

/// A running node; clones share it.
#[derive(Clone, Debug)]
pub struct Node {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    app: Arc<App>,
    metastore: Metastore,
    partitions: PartitionHost,
    consumers: consumers::Consumers,
    metrics: Arc<Metrics>,
    wal: OnceLock<IngressHost>,
    dispatcher: OnceLock<DispatchHost>,
    recovery: watch::Receiver<Recovery>,
    cluster: Option<crate::cluster::Cluster>,
    /// The cluster's request handler, owned here (the cluster holds it weakly).
    _inbound: Option<Arc<peers::NodeInbound>>,
}

/// Starts a node on `options.disk`; see the module documentation. Returns once the metastore is open
/// and the HTTP functions can be called; recovery goes on in the background ([`Node::wait_ready`]).
pub async fn start(options: NodeOptions) -> Result<Node, StartError> {
    let NodeOptions {
        disk,
        config,
        clock,
        seed,
        member_addr,
        hooks,
        cluster,
    } = options;
    let node_id = NodeId(config.cluster.node_id);
    let metrics = Arc::new(Metrics::new());
    let disk: Arc<dyn Disk> = Arc::new(MeteredDisk::new(
        disk,
        WAL_DIR,
        clock.clone(),
        metrics.clone(),
    ));
    let mut metastore_options = metastore_options(node_id, member_addr, seed, &clock, &hooks);
    let cluster = match cluster {
        Some(setup) => Some(bind_cluster(setup, node_id, &metrics, &mut metastore_options).await?),
        None => None,
    };
    let metastore = Metastore::open(Arc::clone(&disk), metastore_options)
        .await
        .map_err(|error| StartError::Metastore(error.to_string()))?;
    let cluster = cluster.map(|(cluster, peers)| {
        peers.report_to(&metastore);
        cluster
    });
    // Before any partition log opens: what its own files lost, the journal still holds.
    let replayed = partitions::replay_owner_journal(Arc::clone(&disk), &clock)
        .await
        .map_err(|fault| StartError::Partitions(format!("owner journal replay: {fault}")))?;
    let partitions = PartitionHost::spawn(
        Arc::clone(&disk),
        &metastore,
        clock.clone(),
        node_id,
        metrics.clone(),
        owner_storage(&config, &hooks, replayed.next_seq),
        &hooks,
    );
    let sink = WalSink::new();
    let (reader, stats) = read_seams(&partitions, cluster.as_ref(), &metastore);
    let consumers = consumers::Consumers::open(consumers::ConsumersSetup {
        disk: Arc::clone(&disk),
        partitions: partitions.clone(),
        metastore: metastore.clone(),
        node: node_id,
        clock: clock.clone(),
        metrics: metrics.clone(),
        seed: seed ^ 0x636f_6e73_756d_6572,
        plant: hooks.plant,
    })
    .await
    .map_err(|error| StartError::Partitions(error.to_string()))?;
    let queue = queue_seam(&consumers, cluster.as_ref(), &metastore);
    let app = Arc::new(
        App::new(
            metastore.clone(),
            sink.clone(),
            reader,
            stats,
            queue,
            metrics.clone(),
            seed,
        )
        .with_auth(config.security.enabled)
        .with_min_retention_ms(config.topic.min_retention_ms)
        .with_moves(move_settings(&config, cluster.is_some())),
    );
    disk_guard::spawn(Arc::clone(&disk), &app, &config.storage);
    let inbound = cluster.as_ref().map(|cluster| {
        let parts = (&disk, &metastore, &partitions, &consumers);
        let moves = spawn_moves(&config, &hooks, parts, cluster, &app);
        serve_peers(
            cluster,
            peers::NodeInbound {
                partitions: partitions.clone(),
                metastore: metastore.clone(),
                clock: clock.clone(),
                ids: id_section(&hooks),
                sync: Some(sync_produce(node_id, &app, cluster)),
                metrics: metrics.clone(),
                plant: hooks.plant,
                consumers: Some(consumers.clone()),
                moves: Some(moves),
            },
        )
    });
    refresh_cluster_gauges(&metrics, metastore.clone());
    let (recovery_tx, recovery) = watch::channel(Recovery::Running);
    let inner = Arc::new(Inner {
        app,
        metastore,
        partitions,
        consumers,
        metrics,
        wal: OnceLock::new(),
        dispatcher: OnceLock::new(),
        recovery,
        cluster,
        _inbound: inbound,
    });
    let wal_config = wal_config(&config, &hooks);
    let recovering = inner.clone();
    let root_seed = config
        .security
        .enabled
        .then(|| config.security.admin_password.clone());
    spawn_recovery(inner.clone(), recovery_tx, async move {
        if let Some(password) = root_seed {
            seed_root(&recovering.metastore, password).await?;
        }
        recover(&recovering, disk, wal_config, sink, node_id, clock, hooks).await
    });
    Ok(Node { inner })
}

/// What the move routes need of this node's settings.
fn move_settings(config: &Config, clustered: bool) -> crate::http::MoveSettings {
    crate::http::MoveSettings {
        node: NodeId(config.cluster.node_id),
        clustered,
        max_in_flight: config.cluster.max_moves_in_flight,
    }
}

/// How this node reads a peer's incarnation section (`Refuse`: as an owner from before it).
fn id_section(hooks: &NodeHooks) -> narad_core::codec::cluster::IdSection {
    if hooks.legacy_owner {
        narad_core::codec::cluster::IdSection::Refuse
    } else {
        narad_core::codec::cluster::IdSection::Accept
    }
}

/// The node's parts a move touches: its disk, metastore, partition host and queues.
type MoveParts<'a> = (
    &'a Arc<dyn Disk>,
    &'a Metastore,
    &'a PartitionHost,
    &'a consumers::Consumers,
);

/// Starts the node's move duties (a cluster member only).
fn spawn_moves(
    config: &Config,
    hooks: &NodeHooks,
    (disk, metastore, partitions, consumers): MoveParts<'_>,
    cluster: &crate::cluster::Cluster,
    app: &Arc<App>,
) -> moves::Moves {
    moves::Moves::spawn(moves::MovesSetup {
        node: NodeId(config.cluster.node_id),
        metastore: metastore.clone(),
        partitions: partitions.clone(),
        consumers: consumers.clone(),
        cluster: cluster.clone(),
        disk: Arc::clone(disk),
        segment_bytes: config.storage.partition_segment_bytes,
        metrics: app.metrics.clone(),
        max_in_flight: config.cluster.max_moves_in_flight,
        auto_rebalance: config.cluster.auto_rebalance,
        progress: app.move_progress.clone(),
        plant: hooks.plant,
    })
}

/// The metastore's options before the cluster adds its voters and peers.
fn metastore_options(
    node_id: NodeId,
    member_addr: String,
    seed: u64,
    clock: &Clock,
    hooks: &NodeHooks,
) -> MetastoreOptions {
    let mut metastore_options = MetastoreOptions::new(node_id, member_addr);
    // One stream per component: the boot nonce and the election jitter from the node's seed, each
    // mixed with its own constant so neither is the seed.
    metastore_options.boot_nonce = Some(seed ^ 0x6d65_7461_7374_6f72);
    metastore_options.seed = seed ^ 0x656c_6563_7469_6f6e;
    metastore_options.clock = Some(clock.clone());
    metastore_options.hold_file = hooks.metastore_hold_file.clone();
    metastore_options.hold_flag = hooks.metastore_hold_flag.clone();
    metastore_options.plant = hooks.plant;
    metastore_options
}

/// Binds a cluster member's transport and gives the metastore its voters, learners and peers.
async fn bind_cluster(
    setup: ClusterSetup,
    node_id: NodeId,
    metrics: &Arc<Metrics>,
    metastore_options: &mut MetastoreOptions,
) -> Result<(crate::cluster::Cluster, Arc<peers::ClusterPeers>), StartError> {
    let members = setup
        .options
        .peers
        .keys()
        .copied()
        .chain(std::iter::once(node_id));
    let (voters, learners) = narad_core::metastore::voters_and_learners(members);
    let cluster = crate::cluster::Cluster::bind(setup.options, &setup.identity, metrics.clone())
        .await
        .map_err(|error| StartError::Cluster(error.to_string()))?;
    tracing::info!(voters = ?voters, learners = ?learners, addr = ?cluster.local_addr().ok(), "cluster transport listening");
    metastore_options.voters = voters;
    metastore_options.learners = learners;
    let peers = peers::ClusterPeers::new(cluster.clone());
    metastore_options.peers = Some(peers.clone());
    Ok((cluster, peers))
}

/// What the partition host stores with: `[storage]`'s partition settings and the owner journal.
fn owner_storage(config: &Config, hooks: &NodeHooks, first_seq: u64) -> partitions::OwnerStorage {
    partitions::OwnerStorage {
        prealloc_bytes: config.storage.partition_prealloc_bytes,
        segment_bytes: config.storage.partition_segment_bytes,
        journal: owner_journal_config(config, hooks, first_seq),
        retention_check_interval: std::time::Duration::from_millis(
            config.storage.retention_check_interval_ms,
        ),
    }
}

/// The owner journal's configuration (`None`: the node runs without one); its sequence numbers go
/// on from the replayed journal's.
fn owner_journal_config(
    config: &Config,
    hooks: &NodeHooks,
    first_seq: u64,
) -> Option<JournalConfig> {
    config.storage.owner_journal.then(|| {
        let mut journal = JournalConfig::new();
        journal.first_seq = first_seq;
        journal.cohort.delay_us_max = config.storage.owner_journal_commit_delay_us;
        journal.plant = hooks.plant;
        if let Some(segment_bytes_max) = hooks.sizes.journal_segment_bytes_max {
            journal.segment_bytes_max = segment_bytes_max;
        }
        journal
    })
}

/// The HTTP layer's partition reads and statistics: the local partitions, or, in a cluster, the
/// partitions forwarded to their owners.
fn read_seams(
    partitions: &PartitionHost,
    cluster: Option<&crate::cluster::Cluster>,
    metastore: &Metastore,
) -> (
    Arc<dyn crate::http::PartitionReader>,
    Arc<dyn crate::http::PartitionStats>,
) {
    match cluster {
        Some(cluster) => {
            let forwarding = Arc::new(peers::Forwarding {
                local: partitions.clone(),
                cluster: cluster.clone(),
                metastore: metastore.clone(),
            });
            (forwarding.clone(), forwarding)
        }
        None => {
            let local = Arc::new(partitions.clone());
            (local.clone(), local)
        }
    }
}

/// The HTTP layer's queue consumer: the local one, or, in a cluster, forwarded to the owners.
fn queue_seam(
    consumers: &consumers::Consumers,
    cluster: Option<&crate::cluster::Cluster>,
    metastore: &Metastore,
) -> Arc<dyn crate::http::QueueConsumer> {
    match cluster {
        Some(cluster) => Arc::new(peers::QueueForwarding {
            local: consumers.clone(),
            cluster: cluster.clone(),
            metastore: metastore.clone(),
        }),
        None => Arc::new(consumers.clone()),
    }
}

/// The synchronous produce a peer asks of this node.
fn sync_produce(
    node_id: NodeId,
    app: &Arc<App>,
    cluster: &crate::cluster::Cluster,
) -> Arc<peers::SyncProduce> {
    Arc::new(peers::SyncProduce {
        node: node_id,
        app: app.clone(),
        cluster: Some(cluster.clone()),
    })
}

/// Serves the peers' requests with `inbound` and starts the heartbeats; the node owns the handler
/// (the cluster holds it weakly).
fn serve_peers(
    cluster: &crate::cluster::Cluster,
    inbound: peers::NodeInbound,
) -> Arc<peers::NodeInbound> {
    let inbound = Arc::new(inbound);
    let serving: Arc<dyn crate::cluster::Inbound> = inbound.clone();
    cluster.serve(&serving);
    peers::spawn_heartbeats(cluster.clone());
    inbound
}

/// Sets the `cluster_*` gauges from the metastore's view before every scrape.
fn refresh_cluster_gauges(metrics: &Metrics, metastore: Metastore) {
    metrics.add_refresh(move |metrics| {
        let view = metastore.view();
        let alive = view
            .state
            .members()
            .keys()
            .filter(|node| view.state.is_alive(**node))
            .count();
        metrics.cluster_members_alive.set(alive as i64);
        metrics
            .cluster_raft_term
            .set(i64::try_from(view.term).unwrap_or(i64::MAX));
        metrics
            .cluster_raft_leader
            .set(view.leader.map_or(0, |leader| i64::from(leader.0)));
        metrics
            .cluster_raft_commit_index
            .set(i64::try_from(view.commit_index).unwrap_or(i64::MAX));
    });
}

/// Runs `recovery` in the background: the node turns ready when it succeeds and stays unready,
/// with the error for [`Node::wait_ready`], when it fails.
fn spawn_recovery(
    inner: Arc<Inner>,
    recovery_tx: watch::Sender<Recovery>,
    recovery: impl std::future::Future<Output = Result<(), StartError>> + Send + 'static,
) {
    tokio::spawn(async move {
        let state = match recovery.await {
            Ok(()) => {
                inner.app.set_ready();
                Recovery::Ready
            }
            Err(error) => {
                tracing::error!(%error, "recovery failed; the node stays unready");
                Recovery::Failed(error)
            }
        };
        let _ = recovery_tx.send(state);
    });
}

fn wal_config(config: &Config, hooks: &NodeHooks) -> IngressHostConfig {
    let mut wal = WalConfig {
        dir: WAL_DIR.to_string(),
        sync_interval_ms: config.storage.ingress_wal_sync_interval_ms,
        commit_delay_us_max: config.storage.ingress_wal_commit_delay_us,
        prealloc: config.storage.ingress_wal_prealloc,
        plant: hooks.plant,
        ..WalConfig::default()
    };
    if let Some(segment_bytes_max) = hooks.sizes.wal_segment_bytes_max {
        let half = segment_bytes_max / 2;
        wal.segment_bytes_max = segment_bytes_max;
        wal.record_bytes_max = wal
            .record_bytes_max
            .min(usize::try_from(half).unwrap_or(usize::MAX));
        wal.rotate_dispatched_active_after_bytes = half;
        wal.prepared_write_run_bytes_max = wal.prepared_write_run_bytes_max.min(half);
    }
    let mut host = IngressHostConfig::new(wal);
    host.observer = hooks.observer.clone();
    host
}

/// Seeds the root user once, when auth is on: with `password` (`NARAD_ADMIN_PASSWORD`), or with a random
/// one logged once, by the node whose proposal created it. Other nodes (and restarts) find the root
/// there, or have their proposal refused by the replicated state. Waits for a metastore leader: the
/// node is not ready (nobody could log in) until the root exists.
async fn seed_root(metastore: &Metastore, password: Option<String>) -> Result<(), StartError> {
    use narad_core::metastore::users::{CreateUser, ROOT_USERNAME};
    use narad_core::metastore::{Applied, Command, TopicError};
    let (password, generated) = match password {
        Some(password) => (password, false),
        None => {
            use rand::distr::{Alphanumeric, SampleString as _};
            use rand::SeedableRng as _;
            // A secret, so from the OS, not from the node's seeded stream.
            let mut rng = rand_chacha::ChaCha20Rng::from_os_rng();
            (Alphanumeric.sample_string(&mut rng, 24), true)
        }
    };
    let mut hash = None;
    loop {
        metastore
            .wait_until(|view| view.caught_up)
            .await
            .map_err(|error| StartError::Metastore(error.to_string()))?;
        if metastore.view().state.users().has_root() {
            return Ok(());
        }
        if hash.is_none() {
            let password = password.clone();
            hash = Some(
                crate::http::auth::offload(move || crate::http::auth::hash_password(&password))
                    .await,
            );
        }
        let command = Command::CreateUser(CreateUser {
            username: ROOT_USERNAME.to_string(),
            password_hash: hash.clone().unwrap_or_default(),
            grants: Vec::new(),
            root: true,
            at_ms: crate::clock::unix_ms(),
        });
        match metastore.propose(command).await {
            Ok(Applied::UserCreated(_)) => {
                if generated {
                    tracing::warn!(
                        username = ROOT_USERNAME,
                        %password,
                        "seeded the root user with a generated password; it is shown this once: \
                         change it with PUT /v1/users/admin/password"
                    );
                } else {
                    tracing::info!(
                        username = ROOT_USERNAME,
                        "seeded the root user from NARAD_ADMIN_PASSWORD"
                    );
                }
                return Ok(());
            }
            Err(ProposeError::Refused(TopicError::UserExists | TopicError::RootExists)) => {
                return Ok(())
            }
            Ok(other) => {
                return Err(StartError::Metastore(format!(
                    "seeding the root user answered {other:?}"
                )))
            }
            Err(ProposeError::Refused(error)) => {
                return Err(StartError::Metastore(format!(
                    "seeding the root user was refused: {error}"
                )))
            }
            Err(error) => {
                if let Some(failure) = metastore.view().failed.clone() {
                    return Err(StartError::Metastore(failure));
                }
                if metastore.is_stopped() {
                    return Err(StartError::Metastore(error.to_string()));
                }
                tracing::info!(%error, "waiting for the metastore leader to seed the root user");
                tokio::time::sleep(CATCH_UP_RETRY).await;
            }
        }
    }
}

/// Awaits `wait`, calling `still_waiting` (which logs why) every [`BOOT_PROGRESS_INTERVAL`] until
/// it is done: a boot either fails with an error, or says what it waits for, never waits silently.
async fn logged_wait<T>(wait: impl std::future::Future<Output = T>, still_waiting: impl Fn()) -> T {
    let mut wait = std::pin::pin!(wait);
    loop {
        match tokio::time::timeout(BOOT_PROGRESS_INTERVAL, &mut wait).await {
            Ok(done) => return done,
            Err(_elapsed) => still_waiting(),
        }
    }
}

async fn recover(
    inner: &Inner,
    disk: Arc<dyn Disk>,
    wal_config: IngressHostConfig,
    sink: Arc<WalSink>,
    node_id: NodeId,
    clock: Clock,
    hooks: NodeHooks,
) -> Result<(), StartError> {
    logged_wait(
        inner
            .metastore
            .wait_until(|view| view.caught_up && view.state.members().contains_key(&node_id)),
        || {
            let view = inner.metastore.view();
            tracing::warn!(
                caught_up = view.caught_up,
                failed = ?view.failed,
                "boot still waiting for the metastore to catch up and list this member"
            );
        },
    )
    .await
    .map_err(|error| StartError::Metastore(error.to_string()))?;
    if inner.cluster.is_some() {
        // A member that was down has a replica from before: it must not accept produces for a
        // topic deleted (or recreated) meanwhile. Ready only once it has applied everything the
        // cluster had committed when it came back (a ReadIndex barrier through the leader).
        // Without a quorum this waits (unready, replaying nothing) until a leader answers.
        while let Err(error) = inner.metastore.read_index().await {
            if let Some(failure) = inner.metastore.view().failed.clone() {
                return Err(StartError::Metastore(failure));
            }
            if inner.metastore.is_stopped() {
                return Err(StartError::Metastore(error.to_string()));
            }
            tracing::info!(%error, "waiting for the metastore leader before serving");
            tokio::time::sleep(CATCH_UP_RETRY).await;
        }
    }
    let metrics = inner.metrics.clone();
    let observer: DurableObserver = Arc::new(move |records| {
        metrics
            .ingress_wal_group_commit_records
            .observe(records as f64);
    });
    let (wal, report) = IngressHost::open_observed(disk, wal_config, clock.clone(), Some(observer))
        .await
        .map_err(|error| StartError::Wal(error.to_string()))?;
    let status = wal.status();
    tracing::info!(
        next_seq = %report.next_seq,
        torn_tail = ?report.torn_tail,
        checkpoint = %status.checkpoint_synced,
        dispatch_start = %status.dispatch_start,
        "ingress WAL recovered"
    );
    if let Some(fault) = &status.latched {
        tracing::error!(%fault, "ingress WAL latched during its open repair; produces are refused");
    }
    inner
        .metrics
        .ingress_wal_failed
        .set(i64::from(status.latched.is_some()));
    let source = wal.clone();
    inner.metrics.add_refresh(move |metrics| {
        let backlog = i64::try_from(source.backlog_records()).unwrap_or(i64::MAX);
        metrics.ingress_dispatch_backlog_records.set(backlog);
        metrics
            .ingress_wal_failed
            .set(i64::from(source.is_latched()));
    });
    sink.attach(wal.clone());
    let _ = inner.wal.set(wal.clone());
    let partitions = logged_wait(inner.partitions.wait_settled(), || {
        let status = inner.partitions.status();
        tracing::warn!(
            opening = status.opening,
            open_failed = status.open_failed,
            caught_up = status.caught_up,
            "boot still waiting for partition logs to open (their I/O is retried)"
        );
    })
    .await
    .map_err(|error| StartError::Partitions(error.to_string()))?;
    if partitions.open_failed > 0 {
        tracing::error!(
            logs = partitions.open_failed,
            "partition logs failed to open; their partitions refuse commits and reads"
        );
    }
    let local = LocalTransport::new(inner.partitions.clone());
    let transport: Arc<dyn crate::ingress::transport::CommitTransport> = match &inner.cluster {
        Some(cluster) => Arc::new(peers::RemoteTransport::new(
            local,
            cluster.clone(),
            clock.clone(),
        )),
        None => Arc::new(local),
    };
    let dispatcher = DispatchHost::start(
        node_id,
        wal,
        transport,
        inner.metastore.clone(),
        clock,
        inner.metrics.clone(),
        &hooks,
    )
    .await;
    let _ = inner.dispatcher.set(dispatcher);
    Ok(())
}

impl Node {
    /// The node's clock, the one every host reads (a caller's budget is measured on it).
    pub fn clock(&self) -> &Clock {
        self.inner.consumers.clock()
    }

    /// The HTTP routes' shared state: call `crate::http::{produce, consume, topics, ops}` with it.
    pub fn app(&self) -> &Arc<App> {
        &self.inner.app
    }

    /// The metastore handle.
    pub fn metastore(&self) -> &Metastore {
        &self.inner.metastore
    }

    /// The partition host (multi-record reads, figures).
    pub fn partitions(&self) -> &PartitionHost {
        &self.inner.partitions
    }

    /// The ingress WAL host, once recovery opened it.
    pub fn wal(&self) -> Option<&IngressHost> {
        self.inner.wal.get()
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Waits until recovery is done (`Ok`) or failed (`Err`, and the node never turns ready).
    pub async fn wait_ready(&self) -> Result<(), StartError> {
        let mut recovery = self.inner.recovery.clone();
        let state = recovery
            .wait_for(|state| *state != Recovery::Running)
            .await
            .map(|state| state.clone())
            .unwrap_or(Recovery::Failed(StartError::Partitions(
                "recovery task ended".to_string(),
            )));
        match state {
            Recovery::Failed(error) => Err(error),
            Recovery::Ready | Recovery::Running => Ok(()),
        }
    }

    /// Readiness, backlog and latch, read from their source (as `/metrics` shows them).
    pub fn status(&self) -> NodeStatus {
        let wal = self.inner.wal.get();
        NodeStatus {
            ready: self.inner.app.is_ready(),
            backlog_records: wal.map_or(0, IngressHost::backlog_records),
            wal_failed: wal.is_some_and(IngressHost::is_latched),
            metastore_failed: self.inner.metastore.view().failed.is_some(),
            partitions_restart_needed: self.inner.partitions.status().restart_needed,
            disk_guard_active: self.inner.app.is_insufficient_storage(),
        }
    }

    /// Stops dispatching, then the WAL (appends in flight finish, the checkpoint is flushed). Returns the
    /// durable checkpoint, or `None` when the WAL never opened.
    pub async fn shutdown(&self) -> Result<Option<Seq>, String> {
        if let Some(dispatcher) = self.inner.dispatcher.get() {
            dispatcher.stop().await;
        }
        // The acks since the last interval's flush: a clean restart redelivers none of them.
        if let Err(fault) = self.inner.consumers.flush().await {
            tracing::warn!(%fault, "consumer cursors not flushed at shutdown");
        }
        let stopped = match self.inner.wal.get() {
            Some(wal) => wal
                .shutdown()
                .await
                .map(Some)
                .map_err(|error| error.to_string()),
            None => Ok(None),
        };
        // Last: peers may still be fetching what this node owns while its WAL drains.
        if let Some(cluster) = &self.inner.cluster {
            cluster.close();
            cluster.wait_idle(CLUSTER_CLOSE_WAIT).await;
        }
        stopped
    }
}
