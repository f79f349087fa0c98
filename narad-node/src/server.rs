//! `narad serve`: opens the data directory, starts the node ([`crate::node`]), serves HTTP `/v1`
//! (HTTPS when `http.tls_cert_file` is set) through the hardened server of [`http::serve`], and shuts
//! down gracefully on SIGTERM or Ctrl-C.
//!
//! Start-up order: bind the listener (so `/readyz` answers 503 while recovering instead of refusing
//! connections), start the node over an [`FsDisk`] of the data directory (the metastore opens; the WAL,
//! the partition logs and the dispatcher recover in the background), serve, and log `ready` once
//! recovery is done. A failed recovery (a corrupt WAL, say) ends the process with an error.
//!
//! Shutdown: health turns 503, the listener stops accepting, requests in flight get
//! `http.shutdown_grace_ms` to finish; then the node stops dispatching and flushes the checkpoint.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use narad_core::disk::Disk;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::clock::Clock;
use crate::config::Config;
use crate::fs_disk::FsDisk;
use crate::http;
use crate::node::{self, NodeOptions};

/// The metastore hold failpoint from `NARAD_FAILPOINTS` (a `failpoints` build only).
#[cfg(feature = "failpoints")]
fn metastore_hold_file() -> anyhow::Result<Option<std::path::PathBuf>> {
    let failpoints = crate::failpoints::Failpoints::from_env()
        .with_context(|| format!("reading {}", crate::failpoints::ENV_VAR))?;
    Ok(failpoints.and_then(|failpoints| failpoints.metastore_hold_file().map(Into::into)))
}

#[cfg(not(feature = "failpoints"))]
fn metastore_hold_file() -> anyhow::Result<Option<std::path::PathBuf>> {
    Ok(None)
}

/// The fewest and most file handles the disk keeps open (see [`open_files_budget`]).
const OPEN_FILES_CACHED: std::ops::RangeInclusive<usize> = 256..=65_536;

/// Raises the soft limit on open files to the hard one, as Go's runtime does for Narad, and returns
/// how many handles the disk may keep open: half the limit (the rest is for sockets and the
/// metastore), within [`OPEN_FILES_CACHED`].
fn open_files_budget() -> usize {
    let soft = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(soft) => soft,
        Err(error) => {
            tracing::warn!(%error, "cannot raise the open-files limit");
            rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(0, |(soft, _)| soft)
        }
    };
    let budget = usize::try_from(soft / 2)
        .unwrap_or(usize::MAX)
        .clamp(*OPEN_FILES_CACHED.start(), *OPEN_FILES_CACHED.end());
    tracing::debug!(limit = soft, cached = budget, "open files");
    budget
}

/// The HTTP listener's accept queue: a burst of connections waits there for the accept loop instead of
/// having its SYNs dropped (each drop costs the client a one-second retransmission). The kernel caps it
/// at `net.core.somaxconn` (4096 on current Linux).
const HTTP_BACKLOG: u32 = 4_096;

/// Binds the HTTP listener (`SO_REUSEADDR`, as std does, so a restart rebinds at once).
fn bind(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(HTTP_BACKLOG)
}

/// Runs a node until SIGTERM or Ctrl-C.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let addr = config.http_addr()?;
    // Before anything opens: a wrong certificate or key is a start-up error naming the file.
    let serve_options = http::serve::ServeOptions::from_config(&config.http)?;
    let tls = serve_options.tls.is_some();
    let data_dir = config.storage.data_dir.clone();
    let fs_disk = FsDisk::new(&data_dir)
        .map_err(|fault| anyhow::anyhow!("{fault}"))
        .with_context(|| format!("opening data dir {}", data_dir.display()))?
        .with_open_files_max(open_files_budget())
        .with_idle_close(Duration::from_millis(config.storage.idle_log_eviction_ms));
    let idle_closed = fs_disk.idle_closed();
    let disk: Arc<dyn Disk> = Arc::new(fs_disk);
    let listener = bind(addr).with_context(|| format!("binding http.addr {addr}"))?;
    let local_addr = listener.local_addr()?;
    let grace = Duration::from_millis(config.http.shutdown_grace_ms);
    let dev = config.dev;
    let (cluster, member_addr) = cluster_setup(&config)?;
    let options = NodeOptions {
        disk,
        config,
        clock: Clock::start(),
        seed: ChaCha8Rng::from_os_rng().random(),
        member_addr: member_addr.unwrap_or_else(|| local_addr.to_string()),
        hooks: crate::hooks::NodeHooks {
            metastore_hold_file: metastore_hold_file()?,
            ..crate::hooks::NodeHooks::default()
        },
        cluster,
    };
    let node = node::start(options).await.context("starting the node")?;
    node.metrics().add_refresh(move |metrics| {
        let counter = &metrics.storage.idle_logs_evicted;
        let closed = idle_closed.load(std::sync::atomic::Ordering::Relaxed);
        counter.inc_by(closed.saturating_sub(counter.get()));
    });
    let app = node.app().clone();
    tracing::info!(
        addr = %local_addr,
        tls,
        data_dir = %data_dir.display(),
        dev,
        "http listening"
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let shutting_down = app.clone();
    let metrics = app.metrics.clone();
    let server = http::serve::serve(
        listener,
        http::router::router(app),
        serve_options,
        metrics,
        async move {
            shutdown_signal().await;
            shutting_down.set_shutting_down();
            tracing::info!("shutting down: no new connections, finishing requests in flight");
            let _ = stop_tx.send(true);
        },
    );
    let recovering = node.clone();
    let recovered = async move {
        recovering.wait_ready().await?;
        tracing::info!("ready");
        std::future::pending::<Result<(), node::StartError>>().await
    };
    let mut stopped = stop_rx;
    tokio::select! {
        result = server => result.context("http server")?,
        () = async {
            let _ = stopped.wait_for(|stop| *stop).await;
            tokio::time::sleep(grace).await;
        } => tracing::warn!(grace_ms = grace.as_millis() as u64, "shutdown grace elapsed; exiting"),
        result = recovered => {
            result.context("recovering")?;
        }
    }
    match node.shutdown().await {
        Ok(checkpoint) => tracing::info!(?checkpoint, "stopped"),
        Err(error) => {
            tracing::error!(%error, "the final checkpoint flush failed; undispatched records replay at the next start");
        }
    }
    Ok(())
}

/// A member's transport set-up and its members entry (its cluster address); none for a single node.
fn cluster_setup(config: &Config) -> anyhow::Result<(Option<node::ClusterSetup>, Option<String>)> {
    let cluster = &config.cluster;
    if !cluster.is_member() {
        return Ok((None, None));
    }
    let peers = cluster
        .peer_map()?
        .into_iter()
        .map(|(id, addr)| (narad_core::ids::NodeId(id), addr))
        .collect();
    let options = crate::cluster::ClusterOptions {
        node: narad_core::ids::NodeId(cluster.node_id),
        bind: cluster.socket_addr()?,
        peers,
        secret: cluster.secret.clone().unwrap_or_default().into_bytes(),
        rng_seed: None,
    };
    use crate::cluster::tls::{NodeIdentity, OperatorTls, TlsIdentity};
    let identity = match cluster.operator_tls() {
        Some((cert, key, ca)) => TlsIdentity::Operator(OperatorTls::load(cert, key, ca)?),
        None => TlsIdentity::SelfSigned(NodeIdentity::load_or_create(&config.storage.data_dir)?),
    };
    Ok((
        Some(node::ClusterSetup { options, identity }),
        Some(cluster.addr.clone()),
    ))
}

async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
