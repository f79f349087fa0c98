//! The harness's side of the simulated node: its madsim node, its boots, and client calls to it.
//!
//! Contract: [`Server::boot`] creates the node's madsim node, whose init boots the node at every
//! start and restart ([`SimNode::start`]); a failed boot restarts the process after a pause. A call
//! ([`Server::call`], [`Server::call_watched`]) runs as a task on the node's madsim node, as a request
//! handler would, and ends as the client sees it ([`Call`]): answered, refused while the node is down,
//! reset when the node dies under it, or timed out (the handler is then dropped, as on a client
//! disconnect). [`Server::crash`] kills the node and crashes its disk in one instant;
//! [`Server::process_restart`] restarts the process with the disk intact. [`NodeState::generation`]
//! changes at every crash, pause and heal, so a timer that ends a fault can tell it is stale.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use madsim::runtime::{Handle, NodeHandle};
use madsim::task::NodeId as MadsimNodeId;
use narad_core::disk::sim::SimDisk;
use narad_core::NodeId;

use super::watchdog::Watchdog;
use super::{lock, sim_now_ns, STATUS_POLL};
use crate::seam::{derive_seed, NodeContext, NodeSizes, Observer, PlantedBug, SimIo, SimNode};

/// How long a failed boot waits before the supervisor tries again.
const BOOT_RETRY: Duration = Duration::from_millis(500);
/// A connection to a node that is down is refused after this long.
const REFUSED_DELAY: Duration = Duration::from_millis(1);

/// Whether the node is up, paused or down, as the harness made it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct NodeState {
    /// Killed (a crash), not yet restarted.
    pub(super) down: bool,
    /// Its tasks stopped by a pause.
    pub(super) paused: bool,
    /// Bumped at every crash, pause and heal so a stale timer cannot undo a later change.
    pub(super) generation: u64,
}

/// A booted node and the madsim handle that spawns tasks on its current incarnation (a restart
/// makes a new one; the slot is emptied before every restart).
type Booted<N> = (N, NodeHandle);

/// The harness's side of one simulated node.
pub(super) struct Server<N: SimNode> {
    /// Its index in the cluster (0 for a single node).
    pub(super) index: usize,
    /// The madsim node it runs in (kill, restart, pause and resume address it).
    pub(super) madsim_id: MadsimNodeId,
    slot: Arc<Mutex<Option<Booted<N>>>>,
    /// Up, paused or down.
    pub(super) state: Mutex<NodeState>,
    /// Its disk, across restarts.
    pub(super) disk: SimDisk,
    /// Its disk's latency model.
    pub(super) io: SimIo,
    observer: Observer,
    /// Crashes so far (the final one included).
    pub(super) crashes: AtomicU32,
    /// When each boot after the first began, in ns of the run: every restart (a crash's, an
    /// operator's process restart, a failed boot's), each of which forgets what memory held.
    pub(super) reboots: Arc<Mutex<Vec<u64>>>,
    /// The node's view hold ([`NodeContext::view_hold`]), set while any lag fault holds it.
    view_hold: Arc<AtomicBool>,
    /// Lag faults in force on the node (they may overlap; the last to end releases the view), and
    /// how many ever began.
    view_holds: Mutex<(u32, u64)>,
}

/// How a call to the node ended, from the client's side.
pub(super) enum Call<T> {
    /// The node answered.
    Done(T),
    /// The node was down: connection refused.
    Refused,
    /// The node died while the call was in flight: connection reset.
    Reset,
    /// The client gave up.
    TimedOut,
}

impl<N: SimNode> Server<N> {
    /// Frees what the run leaves behind: the booted node and the disk's contents. madsim keeps
    /// every node's start-up closure (which shares the slot and the disk) until the process exits,
    /// so a sweep of thousands of runs would otherwise keep every run's last nodes and disks.
    pub(super) fn release(&self) {
        drop(lock(&self.slot).take());
        self.disk.discard();
    }

    /// Creates the node's madsim node; its init boots the node (every boot: the first start and
    /// each restart) and fills the slot once the node is ready.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn boot(
        index: usize,
        members: Vec<std::net::SocketAddr>,
        disk: SimDisk,
        io: SimIo,
        observer: Observer,
        seed: u64,
        plant_bug: Option<PlantedBug>,
        sizes: NodeSizes,
        legacy_owner: bool,
    ) -> Arc<Self> {
        let slot: Arc<Mutex<Option<Booted<N>>>> = Arc::new(Mutex::new(None));
        let boots = Arc::new(AtomicU32::new(0));
        let reboots = Arc::new(Mutex::new(Vec::new()));
        let init_reboots = reboots.clone();
        let init_slot = slot.clone();
        let init_observer = observer.clone();
        let init_disk = disk.clone();
        let init_io = io.clone();
        let view_hold = Arc::new(AtomicBool::new(false));
        let init_view_hold = view_hold.clone();
        let node_seed = derive_seed(seed, &format!("node/{index}"));
        let ip = members[index].ip();
        let own_id: Arc<std::sync::OnceLock<MadsimNodeId>> = Arc::new(std::sync::OnceLock::new());
        let init_own_id = own_id.clone();
        let node = Handle::current()
            .create_node()
            .name(format!("narad-{index}"))
            .ip(ip)
            .init(move || {
                let boot = boots.fetch_add(1, Ordering::Relaxed);
                if boot > 0 {
                    lock(&init_reboots).push(super::sim_now_ns());
                }
                let ctx = NodeContext {
                    node_id: NodeId(index as u32),
                    seed: node_seed,
                    boot,
                    disk: init_disk.clone(),
                    io: init_io.clone(),
                    plant_bug,
                    observer: init_observer.clone(),
                    sizes,
                    members: members.clone(),
                    legacy_owner,
                    view_hold: init_view_hold.clone(),
                };
                let slot = init_slot.clone();
                let own_id = init_own_id.clone();
                async move {
                    match N::start(ctx.clone()).await {
                        Ok(node) => {
                            ctx.observer.event(
                                "harness",
                                format_args!("node {} boot {} ready", ctx.node_id.0, ctx.boot),
                            );
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
                            ctx.observer.event(
                                "harness",
                                format_args!(
                                    "node {} boot {} failed: {error}",
                                    ctx.node_id.0, ctx.boot
                                ),
                            );
                            tokio::time::sleep(BOOT_RETRY).await;
                            if let Some(&id) = own_id.get() {
                                ctx.observer.event(
                                    "harness",
                                    format_args!(
                                        "process restart of node {} after failed boot {}",
                                        ctx.node_id.0, ctx.boot
                                    ),
                                );
                                // An exited process's sockets are released (see `process_restart`).
                                Handle::current().kill(id);
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
            index,
            madsim_id: node.id(),
            slot,
            state: Mutex::new(NodeState::default()),
            disk,
            io,
            observer,
            crashes: AtomicU32::new(0),
            reboots,
            view_hold,
            view_holds: Mutex::new((0, 0)),
        })
    }

    /// Holds the node's metadata view (a lag fault begins).
    pub(super) fn hold_view(&self) {
        let mut holds = lock(&self.view_holds);
        holds.0 += 1;
        holds.1 += 1;
        self.view_hold.store(true, Ordering::Relaxed);
    }

    /// Ends one hold of the view; the view is released when none is left (`all`: every one, as
    /// at the heal).
    pub(super) fn release_view(&self, all: bool) {
        let mut holds = lock(&self.view_holds);
        holds.0 = if all { 0 } else { holds.0.saturating_sub(1) };
        if holds.0 == 0 {
            self.view_hold.store(false, Ordering::Relaxed);
        }
    }

    /// Whether a lag fault holds the node's view now.
    pub(super) fn view_held(&self) -> bool {
        self.hold_mark().is_none()
    }

    /// `None` while a lag holds the view, else how many holds ever began: a call whose answer
    /// must come from a live view compares the marks taken before and after it.
    pub(super) fn hold_mark(&self) -> Option<u64> {
        let holds = lock(&self.view_holds);
        (holds.0 == 0).then_some(holds.1)
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
    pub(super) async fn call<T, Fut>(&self, timeout: Duration, f: impl FnOnce(N) -> Fut) -> Call<T>
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
    pub(super) async fn call_watched<T, Fut>(
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

    /// Power loss: the node is killed and its disk crashes in the same instant.
    pub(super) fn crash(&self, why: &str) {
        let mut state = lock(&self.state);
        Handle::current().kill(self.madsim_id);
        self.disk.crash();
        *lock(&self.slot) = None;
        state.down = true;
        state.paused = false;
        state.generation += 1;
        self.crashes.fetch_add(1, Ordering::Relaxed);
        self.observer.event(
            "fault",
            format_args!("crash ({why}): node {} killed, disk crashed", self.index),
        );
    }

    /// The process dies and its supervisor starts it again at once: no power loss, the disk keeps
    /// everything it was given (synced or not). As the OS does when a process exits, every socket
    /// it had bound is released first (madsim's `restart` alone keeps them: only `kill` resets the
    /// node's network), whatever the dead process's memory still referenced.
    pub(super) fn process_restart(&self, why: &str) {
        let mut state = lock(&self.state);
        *lock(&self.slot) = None;
        state.down = false;
        state.paused = false;
        state.generation += 1;
        Handle::current().kill(self.madsim_id);
        Handle::current().restart(self.madsim_id);
        self.observer.event(
            "fault",
            format_args!("process restart ({why}) of node {}", self.index),
        );
    }

    /// Starts a node that is down again.
    pub(super) fn restart(&self) {
        let mut state = lock(&self.state);
        state.down = false;
        state.paused = false;
        state.generation += 1;
        Handle::current().restart(self.madsim_id);
        self.observer
            .event("fault", format_args!("restart of node {}", self.index));
    }

    /// Waits until the node has booted, or `deadline_ns` passes.
    pub(super) async fn booted(&self, deadline_ns: u64) -> bool {
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
