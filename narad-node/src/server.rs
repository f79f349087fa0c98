//! `narad serve`: opens the data directory, starts the metastore, serves HTTP `/v1`, and shuts down
//! gracefully on SIGTERM or Ctrl-C (health turns 503, the listener stops accepting, requests in flight
//! get `http.shutdown_grace_ms` to finish).
//!
//! Start-up order: bind the listener (so `/readyz` answers 503 while recovering instead of refusing
//! connections), open the metastore, serve, and mark ready once the metastore replica has applied its
//! whole log again and lists this node as a member (so every partition has an owner). The produce path's recovery (WAL, checkpoint, partition logs) joins that readiness
//! condition at integration.
//!
//! INTERIM until the produce path is merged: the metastore runs over [`InterimDisk`] (the node's
//! `FsDisk` replaces it), produces are refused with 503 by [`NoWal`], and replay reads and partition
//! figures come from [`NoPartitions`] (always past the end, all zeros).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use narad_core::codec::wal::ProduceRecord;
use narad_core::disk::Disk;
use narad_core::ids::{NodeId, Offset, PartitionId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::config::Config;
use crate::http::{self, App};
use crate::http::{
    AppendError, BoxFuture, PartitionReader, PartitionStat, PartitionStats, ProduceSink, ReadError,
    ReadOutcome, TopicKey,
};
use crate::metastore::interim_disk::InterimDisk;
use crate::metastore::{Metastore, MetastoreOptions};
use crate::metrics::Metrics;

/// Runs a node until SIGTERM or Ctrl-C.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let addr = config.http_addr()?;
    let data_dir = &config.storage.data_dir;
    let disk: Arc<dyn Disk> = Arc::new(
        InterimDisk::new(data_dir)
            .with_context(|| format!("opening data dir {}", data_dir.display()))?,
    );
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding http.addr {addr}"))?;
    let local_addr = listener.local_addr()?;
    let options = MetastoreOptions::new(NodeId(config.cluster.node_id), local_addr.to_string());
    let metastore = Metastore::open(disk, options)
        .await
        .context("opening the metastore")?;
    let metrics = Arc::new(Metrics::new());
    let seed = ChaCha8Rng::from_os_rng().random();
    let app = Arc::new(App::new(
        metastore.clone(),
        Arc::new(NoWal),
        Arc::new(NoPartitions),
        Arc::new(NoPartitions),
        metrics,
        seed,
    ));
    tracing::info!(
        addr = %local_addr,
        data_dir = %data_dir.display(),
        dev = config.dev,
        "http listening"
    );
    let recovering = app.clone();
    let node_id = NodeId(config.cluster.node_id);
    tokio::spawn(async move {
        let recovered = recovering
            .metastore
            .wait_until(|view| view.caught_up && view.state.members().contains_key(&node_id))
            .await;
        match recovered {
            Ok(()) => {
                recovering.set_ready();
                tracing::info!("ready");
            }
            Err(error) => tracing::error!(%error, "metastore recovery failed; staying unready"),
        }
    });

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let shutting_down = app.clone();
    let server =
        axum::serve(listener, http::router::router(app)).with_graceful_shutdown(async move {
            shutdown_signal().await;
            shutting_down.set_shutting_down();
            tracing::info!("shutting down: no new connections, finishing requests in flight");
            let _ = stop_tx.send(true);
        });
    let grace = Duration::from_millis(config.http.shutdown_grace_ms);
    let mut stopped = stop_rx;
    tokio::select! {
        result = server => result.context("http server")?,
        () = async {
            let _ = stopped.wait_for(|stop| *stop).await;
            tokio::time::sleep(grace).await;
        } => tracing::warn!(grace_ms = config.http.shutdown_grace_ms, "shutdown grace elapsed; exiting"),
    }
    tracing::info!("stopped");
    Ok(())
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

/// INTERIM: no ingress WAL yet; every produce is refused with 503.
struct NoWal;

impl ProduceSink for NoWal {
    fn append(&self, _record: ProduceRecord) -> BoxFuture<'_, Result<(), AppendError>> {
        Box::pin(async { Err(AppendError::Unavailable) })
    }

    fn append_many(&self, _records: Vec<ProduceRecord>) -> BoxFuture<'_, Result<(), AppendError>> {
        Box::pin(async { Err(AppendError::Unavailable) })
    }
}

/// INTERIM: no partition logs yet; every partition is empty.
struct NoPartitions;

impl PartitionReader for NoPartitions {
    fn read(
        &self,
        _topic: &TopicKey,
        _partition: PartitionId,
        _offset: Offset,
    ) -> BoxFuture<'_, Result<ReadOutcome, ReadError>> {
        Box::pin(async { Ok(ReadOutcome::PastEnd) })
    }
}

impl PartitionStats for NoPartitions {
    fn partition_stat(
        &self,
        _topic: &TopicKey,
        _partition: PartitionId,
    ) -> BoxFuture<'_, PartitionStat> {
        Box::pin(async { PartitionStat::default() })
    }
}
