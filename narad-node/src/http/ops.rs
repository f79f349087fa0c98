//! `/healthz`, `/readyz` and `/metrics` (no auth on any of them, as in Narad).
//!
//! - `/healthz`: 200 `{"status":"ok"}`, or 503 `{"status":"shutting down"}` once a graceful shutdown began.
//! - `/readyz`: 200 `{"status":"ready"}` once start-up recovery is done, else 503 `{"error":…}`. A latched
//!   WAL does not make the node unready (alert on `narad_ingress_wal_failed` instead).
//! - `/metrics`: OpenMetrics text.
//! - `/v1/cluster/members`: the member set, with liveness, the leader and owned partitions.

use super::{App, Reply};
use crate::metrics;

/// `GET /v1/cluster/members`: every member, as this node's replica lists it: its cluster address,
/// `alive` or `dead` as the leader last marked it, whether it is the raft leader this replica knows,
/// how many partitions (over every topic) it owns, whether it drains (decommission) and how many
/// of its partitions are moving away.
pub fn cluster_members(app: &App) -> Reply {
    let view = app.metastore.view();
    let state = &view.state;
    let mut owned: std::collections::BTreeMap<narad_core::ids::NodeId, u64> =
        std::collections::BTreeMap::new();
    for topic in state.topics_after("", usize::MAX).0 {
        for owner in topic.owners.iter().flatten() {
            *owned.entry(*owner).or_default() += 1;
        }
    }
    let members: Vec<String> = state
        .members()
        .iter()
        .map(|(id, member)| {
            let status = if state.is_alive(*id) { "alive" } else { "dead" };
            super::reply::JsonObject::new()
                .number("id", u64::from(id.0))
                .string("addr", &member.addr)
                .string("status", status)
                .raw(
                    "leader",
                    if view.leader == Some(*id) {
                        "true"
                    } else {
                        "false"
                    },
                )
                .number("owned_partitions", owned.get(id).copied().unwrap_or(0))
                .raw(
                    "draining",
                    if state.is_draining(*id) {
                        "true"
                    } else {
                        "false"
                    },
                )
                .number("outbound_moves", state.outbound_moves(*id) as u64)
                .finish()
        })
        .collect();
    Reply::json(
        200,
        format!("{{\"members\":{}}}", super::reply::json_array(&members)),
    )
}

/// `GET /healthz`.
pub fn healthz(app: &App) -> Reply {
    if app.is_shutting_down() {
        Reply::json(503, "{\"status\":\"shutting down\"}".to_string())
    } else {
        Reply::json(200, "{\"status\":\"ok\"}".to_string())
    }
}

/// `GET /readyz`.
pub fn readyz(app: &App) -> Reply {
    if app.is_ready() {
        Reply::json(200, "{\"status\":\"ready\"}".to_string())
    } else {
        Reply::error(503, "not ready: recovery in progress")
    }
}

/// `GET /metrics`.
pub fn metrics(app: &App) -> Reply {
    Reply {
        status: 200,
        content_type: Some(metrics::CONTENT_TYPE),
        headers: Vec::new(),
        body: app.metrics.encode().into_bytes(),
    }
}
