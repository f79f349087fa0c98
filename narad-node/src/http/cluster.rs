//! The cluster's shape: partition moves, rebalance and decommission (admin routes).
//!
//! - `GET /v1/cluster/moves`: every move the replica records, with its state (`copying` until the
//!   source's freeze is recorded, then `frozen`) and the bytes copied so far (known on the
//!   destination; 0 elsewhere).
//! - `POST /v1/cluster/moves` `{"topic","partition","to"}` → 202: one operator move (`PlanMove`).
//!   `DELETE /v1/cluster/moves/{topic}/{partition}` → 204: aborts it (`AbortMove`); a switch that
//!   already applied is not undone (404 then).
//! - `POST /v1/cluster/rebalance` → 200 `{"planned":N}`: plans moves towards every alive,
//!   non-draining member's fair share, at most `cluster.max_moves_in_flight` in flight.
//! - `POST /v1/cluster/members/{id}/decommission` → 204: the member drains (the leader moves its
//!   partitions away, and its produce answers 503); 404 for an unknown member; 409 with `reasons`
//!   (`below_min_voters`, `no_receivers`, `owner_dead`) when it cannot complete; 400 with
//!   `?force=true` (a dead member's partitions are not reassigned by this release). `DELETE` → 204:
//!   draining ends, and its moves not yet switched are aborted.
//!
//! Every change is a metastore proposal, checked again when applied.

use std::collections::BTreeMap;
use std::sync::Mutex;

use narad_core::ids::{NodeId, PartitionId};
use narad_core::metastore::{
    decommission_blockers, plan_rebalance, voters_and_learners, Command, MoveOrder, TopicError,
};
use serde::Deserialize;

use super::reply::{json_array, json_string, JsonObject};
use super::topics::{parse_json, propose_error};
use super::{App, Body, Reply};

/// What a node's move routes need besides the metastore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoveSettings {
    /// This node (its produce answers 503 while it drains).
    pub node: NodeId,
    /// Whether the node is a cluster member (moves exist only there).
    pub clustered: bool,
    /// `cluster.max_moves_in_flight`.
    pub max_in_flight: u32,
}

impl Default for MoveSettings {
    fn default() -> Self {
        MoveSettings {
            node: NodeId(1),
            clustered: false,
            max_in_flight: 8,
        }
    }
}

/// Bytes copied so far by the moves whose destination is this node, by (topic, partition).
#[derive(Debug, Default)]
pub struct MoveProgress {
    copied: Mutex<BTreeMap<(String, PartitionId), u64>>,
}

impl MoveProgress {
    /// Notes the bytes copied of `(topic, partition)` (`None`: its copy ended).
    pub fn set(&self, topic: &str, partition: PartitionId, bytes: Option<u64>) {
        let mut copied = self.copied.lock().unwrap_or_else(|p| p.into_inner());
        match bytes {
            Some(bytes) => {
                copied.insert((topic.to_string(), partition), bytes);
            }
            None => {
                copied.remove(&(topic.to_string(), partition));
            }
        }
    }

    /// The bytes copied of `(topic, partition)` here, if its copy runs here.
    pub fn get(&self, topic: &str, partition: PartitionId) -> Option<u64> {
        self.copied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(topic.to_string(), partition))
            .copied()
    }
}

fn not_clustered() -> Reply {
    Reply::error(
        409,
        "partition moves need a cluster: this node runs alone (cluster.peers is empty)",
    )
}

/// `GET /v1/cluster/moves`.
pub fn list_moves(app: &App) -> Reply {
    let view = app.metastore.view();
    let moves: Vec<String> = view
        .state
        .moves()
        .iter()
        .map(|((topic, partition), moving)| {
            let state = moving.state.as_str();
            JsonObject::new()
                .string("topic", topic)
                .number("partition", u64::from(partition.0))
                .number("from", u64::from(moving.from.0))
                .number("to", u64::from(moving.to.0))
                .string("state", state)
                .number(
                    "copied_bytes",
                    app.move_progress.get(topic, *partition).unwrap_or(0),
                )
                .finish()
        })
        .collect();
    Reply::json(200, format!("{{\"moves\":{}}}", json_array(&moves)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MoveRequest {
    topic: String,
    partition: u32,
    to: u32,
}

/// `POST /v1/cluster/moves`.
pub async fn start_move(app: &App, body: Body) -> Reply {
    if !app.moves.clustered {
        return not_clustered();
    }
    let request: MoveRequest = match parse_json(body) {
        Ok(request) => request,
        Err(reply) => return reply,
    };
    let view = app.metastore.view();
    let Some(topic) = view.state.topic(&request.topic) else {
        return Reply::error(404, "topic not found");
    };
    let partition = PartitionId(request.partition);
    let Some(from) = topic.owner_of(partition) else {
        return Reply::error(400, "invalid argument: partition out of range");
    };
    let order = MoveOrder {
        topic: topic.name.clone(),
        topic_id: topic.id,
        partition,
        from,
        to: NodeId(request.to),
    };
    let command = Command::PlanMove {
        order,
        max_in_flight: app.moves.max_in_flight,
    };
    match app.metastore.propose(command).await {
        Ok(_) => Reply::empty(202),
        Err(error) => propose_error(error),
    }
}

/// `DELETE /v1/cluster/moves/{topic}/{partition}`.
pub async fn abort_move(app: &App, topic: &str, partition: &str) -> Reply {
    let Ok(partition) = partition.parse::<u32>() else {
        return Reply::error(400, "invalid argument: partition must be a number");
    };
    let command = Command::AbortMove {
        topic: topic.to_string(),
        partition: PartitionId(partition),
        to: None,
        move_id: None,
    };
    match app.metastore.propose(command).await {
        Ok(_) => Reply::empty(204),
        Err(error) => propose_error(error),
    }
}

/// `POST /v1/cluster/rebalance`.
pub async fn rebalance(app: &App) -> Reply {
    if !app.moves.clustered {
        return not_clustered();
    }
    let state = app.metastore.view().state.clone();
    let mut planned = 0u64;
    for order in plan_rebalance(&state, app.moves.max_in_flight as usize) {
        let command = Command::PlanMove {
            order,
            max_in_flight: app.moves.max_in_flight,
        };
        match app.metastore.propose(command).await {
            Ok(_) => planned += 1,
            // Raced by another plan or a membership change: the rest is planned next time.
            Err(narad_core_refused @ crate::metastore::ProposeError::Refused(_)) => {
                tracing::info!(reason = %narad_core_refused, "a rebalance move was refused");
            }
            Err(error) => return propose_error(error),
        }
    }
    Reply::json(200, format!("{{\"planned\":{planned}}}"))
}

/// `POST` (`draining`) or `DELETE` (not) `/v1/cluster/members/{id}/decommission`.
pub async fn decommission(app: &App, id: &str, query: Option<&str>, draining: bool) -> Reply {
    let Some(node) = id.parse::<u32>().ok().filter(|id| *id > 0).map(NodeId) else {
        return Reply::error(404, "member not found");
    };
    let state = app.metastore.view().state.clone();
    if !state.members().contains_key(&node) {
        return Reply::error(404, "member not found");
    }
    if !draining {
        return cancel_decommission(app, node).await;
    }
    let force = query
        .unwrap_or("")
        .split('&')
        .any(|pair| pair == "force=true" || pair == "force=1");
    if force {
        // Reassigning a dead member's partitions needs the offsets it may have served recorded in
        // the metastore, which this release does not keep: refused, never half done.
        return Reply::error(
            400,
            "invalid argument: force (reassigning a dead member's partitions) is not supported by this release",
        );
    }
    let mut reasons: Vec<&'static str> = decommission_blockers(&state, node)
        .iter()
        .map(|blocker| blocker.code())
        .collect();
    let (voters, _) = voters_and_learners(state.members().keys().copied());
    if voters.contains(&node) {
        reasons.push("below_min_voters");
    }
    if !reasons.is_empty() {
        let listed: Vec<String> = reasons
            .iter()
            .map(|code| JsonObject::new().string("code", code).finish())
            .collect();
        let body = format!(
            "{{\"error\":{},\"reasons\":{}}}",
            json_string(&format!("member {} cannot be decommissioned", node.0)),
            json_array(&listed)
        );
        return Reply::json(409, body);
    }
    match app
        .metastore
        .propose(Command::SetDraining {
            node,
            draining: true,
        })
        .await
    {
        Ok(_) => Reply::empty(204),
        Err(error) => propose_error(error),
    }
}

/// Ends a member's draining and aborts its moves not yet switched.
async fn cancel_decommission(app: &App, node: NodeId) -> Reply {
    let command = Command::SetDraining {
        node,
        draining: false,
    };
    if let Err(error) = app.metastore.propose(command).await {
        return propose_error(error);
    }
    let moves: Vec<(String, PartitionId, NodeId, u64)> = app
        .metastore
        .view()
        .state
        .moves()
        .iter()
        .filter(|(_, moving)| moving.from == node)
        .map(|((topic, partition), moving)| {
            (topic.clone(), *partition, moving.to, moving.planned_at)
        })
        .collect();
    for (topic, partition, to, move_id) in moves {
        let abort = Command::AbortMove {
            topic,
            partition,
            to: Some(to),
            move_id: Some(move_id),
        };
        match app.metastore.propose(abort).await {
            Ok(_) | Err(crate::metastore::ProposeError::Refused(TopicError::MoveNotFound)) => {}
            Err(error) => return propose_error(error),
        }
    }
    Reply::empty(204)
}

/// 503 while this node drains: its clients go to other nodes.
pub fn check_not_draining(app: &App) -> Result<(), Reply> {
    if app.moves.clustered && app.metastore.view().state.is_draining(app.moves.node) {
        Err(Reply::error(503, "member is draining"))
    } else {
        Ok(())
    }
}
