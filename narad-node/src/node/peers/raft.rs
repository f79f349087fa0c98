//! Raft delivery for the metastore: [`ClusterPeers`] queues each peer's raft batches and carries
//! them over the cluster transport, reporting what could not be delivered back to the metastore.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use narad_core::codec::cluster::{Control, ControlAnswer};
use narad_core::ids::NodeId;
use narad_core::metastore::Applied;
use tokio::sync::mpsc;

use crate::cluster::Cluster;
use crate::http::BoxFuture;
use crate::metastore::{DeliveryReports, MetaPeers, Metastore, ProposeError, PROPOSE_TIMEOUT};

/// Raft batches queued for one peer before more are dropped (raft sends again).
pub const RAFT_QUEUE_MAX: usize = 256;
/// How long one raft delivery may take.
pub const RAFT_SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// The metastore's way to its peers over the cluster transport.
#[derive(Debug)]
pub struct ClusterPeers {
    cluster: Cluster,
    queues: BTreeMap<NodeId, mpsc::Sender<RaftBatch>>,
    /// Where deliveries are reported, once the metastore is open.
    metastore: Arc<std::sync::OnceLock<DeliveryReports>>,
}

/// Raft messages for one peer, and whether one carries a snapshot.
type RaftBatch = (Vec<Vec<u8>>, bool);

impl ClusterPeers {
    /// One sender task per peer, delivering raft messages in order.
    pub fn new(cluster: Cluster) -> Arc<ClusterPeers> {
        let mut queues = BTreeMap::new();
        let metastore = Arc::new(std::sync::OnceLock::new());
        for peer in cluster.peers() {
            let (sender, receiver) = mpsc::channel(RAFT_QUEUE_MAX);
            queues.insert(peer, sender);
            let cluster = cluster.clone();
            tokio::spawn(deliver_raft(cluster, peer, receiver, metastore.clone()));
        }
        Arc::new(ClusterPeers {
            cluster,
            queues,
            metastore,
        })
    }

    /// Names the metastore deliveries are reported to (once it is open).
    pub fn report_to(&self, metastore: &Metastore) {
        let _ = self.metastore.set(metastore.delivery_reports());
    }
}

/// Sends each queued batch, with whatever queued behind it, as one call, and reports how it went.
async fn deliver_raft(
    cluster: Cluster,
    peer: NodeId,
    mut queue: mpsc::Receiver<RaftBatch>,
    metastore: Arc<std::sync::OnceLock<DeliveryReports>>,
) {
    loop {
        let next = tokio::select! {
            next = queue.recv() => next,
            () = cluster.closed() => None,
        };
        let Some((mut messages, mut snapshot)) = next else {
            return;
        };
        while let Ok((more, more_snapshot)) = queue.try_recv() {
            messages.extend(more);
            snapshot |= more_snapshot;
        }
        let body = Control::Raft { messages }.encode();
        let delivered = match cluster.call(peer, "raft", &body, RAFT_SEND_TIMEOUT).await {
            Ok(_) => true,
            Err(error) => {
                tracing::debug!(%peer, %error, "raft messages not delivered");
                false
            }
        };
        if snapshot || !delivered {
            if let Some(metastore) = metastore.get() {
                metastore.report(peer, delivered, snapshot);
            }
        }
    }
}

impl MetaPeers for ClusterPeers {
    fn send_raft(&self, to: NodeId, messages: Vec<Vec<u8>>, snapshot: bool) {
        if let Some(queue) = self.queues.get(&to) {
            if queue.try_send((messages, snapshot)).is_err() && snapshot {
                // A dropped snapshot must be reported, or raft waits for it forever.
                if let Some(metastore) = self.metastore.get() {
                    metastore.report(to, false, true);
                }
            }
        }
    }

    fn propose_at(
        &self,
        leader: NodeId,
        command: Vec<u8>,
    ) -> BoxFuture<'static, Result<(Applied, u64), ProposeError>> {
        let cluster = self.cluster.clone();
        Box::pin(async move {
            let body = Control::Propose { command }.encode();
            let answer = cluster
                .call(leader, "propose", &body, PROPOSE_TIMEOUT)
                .await
                .map_err(|error| ProposeError::Unavailable(error.to_string()))?;
            match ControlAnswer::decode(&answer) {
                Ok(ControlAnswer::Proposed(bytes)) => postcard::from_bytes(&bytes)
                    .map_err(|error| ProposeError::Unavailable(error.to_string()))?,
                Ok(other) => Err(ProposeError::Unavailable(format!(
                    "the leader answered {other:?}"
                ))),
                Err(error) => Err(ProposeError::Unavailable(error.to_string())),
            }
        })
    }
}
