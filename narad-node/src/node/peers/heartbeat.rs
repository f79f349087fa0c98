//! Heartbeats: this node tells every peer it is alive once per `HEARTBEAT_INTERVAL`, the input
//! of the metastore's membership (a member not heard from is marked dead by the leader).

use narad_core::codec::cluster::Control;
use narad_core::metastore::liveness::HEARTBEAT_INTERVAL;

use crate::cluster::Cluster;

/// Sends a heartbeat to every peer each [`HEARTBEAT_INTERVAL`], until the cluster closes.
pub fn spawn_heartbeats(cluster: Cluster) {
    tokio::spawn(async move {
        let body = Control::Heartbeat {
            from: cluster.node(),
        }
        .encode();
        let mut interval = tokio::time::interval(HEARTBEAT_INTERVAL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                () = cluster.closed() => return,
            }
            for peer in cluster.peers().collect::<Vec<_>>() {
                let cluster = cluster.clone();
                let body = body.clone();
                tokio::spawn(async move {
                    let _ = cluster
                        .call(peer, "heartbeat", &body, HEARTBEAT_INTERVAL)
                        .await;
                });
            }
        }
    });
}
