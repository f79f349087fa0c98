//! The node's side of the cluster transport: what it asks peers ([`RemoteTransport`] for commits,
//! [`ClusterPeers`] for the metastore, [`Forwarding`] for replay reads and partition figures, the heartbeats) and how
//! it answers them ([`NodeInbound`]).
//!
//! # Owner side
//! A remote `CommitProduceBatch` enters this node's partition host exactly as a local commit does: the
//! same combiner, under the same checks under the produce lock (ownership and freeze, the log current,
//! the caller still waiting, the incarnation). The caller's remaining budget rides in the frame, so a
//! batch whose caller gave up is left out of a cycle that starts after it. The combiner's refusal is
//! answered as the wire's: not owner; 412 naming both incarnations (logged at info); 400 for a frame
//! that does not decode (trailing bytes from a newer sender among them).
//!
//! # Synchronous produce
//! The node RPC `Produce` op ([`SyncProduce`]) is the synchronous path: no ingress WAL, validated as
//! an HTTP produce, placed by `PartitionPicker::pick_for_sync_produce` (the accept-time choice, then
//! forward past partitions whose owner membership reports dead; a pinned partition is kept), and
//! committed on the owner, here or over `CommitProduce` with the record's incarnation id. It answers
//! the partition and offset once the record is visible. HTTP produces never take this path.
//!
//! # Dispatcher side
//! [`RemoteTransport`] is the node's one [`CommitTransport`] in a cluster: a local owner goes to the
//! [`LocalTransport`], a remote one over QUIC on what is left of the commit's budget (30 s, a probe's
//! 5 s). The incarnation section is written iff the dispatcher asks for ids (`with_ids`) and a record
//! has one. A 400 to a batch that carried the section is [`CommitFailure::RefusedTrailingIds`] (the
//! dispatcher resends without ids and remembers the owner as legacy); a 412 is
//! [`CommitFailure::IncarnationMismatch`]; an unreachable peer is `Unavailable`, a call past its
//! budget `Timeout`.

mod commit;
mod forward;
mod heartbeat;
mod inbound;
mod raft;

// The wire-answer mapping, for the node tests that feed it owners' answers.
#[cfg(test)]
pub(crate) use commit::commit_outcome;
pub use commit::RemoteTransport;
pub use forward::{
    settle_outcome, Forwarding, QueueForwarding, QUEUE_REMOTE_POLL, QUEUE_RPC_SLACK,
    REPLAY_TIMEOUT, STAT_TIMEOUT,
};
pub use heartbeat::spawn_heartbeats;
pub use inbound::{NodeInbound, SyncProduce};
pub use raft::{ClusterPeers, RAFT_QUEUE_MAX, RAFT_SEND_TIMEOUT};
