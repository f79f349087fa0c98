//! The dispatcher's side of a remote commit: [`RemoteTransport`], the node's one
//! [`CommitTransport`] in a cluster, and the mapping of an owner's wire answer to a [`CommitOutcome`].

use narad_core::codec::cluster::{CommitAnswer, CommitProduceBatch, WireRecord};
use narad_core::dispatcher::{CommitFailure, CommitOwner, SendCommit};
use narad_core::partition::CommittedRange;

use crate::clock::Clock;
use crate::cluster::{Cluster, RpcError};
use crate::http::BoxFuture;
use crate::ingress::transport::{CommitOutcome, CommitTransport};
use crate::node::local_transport::LocalTransport;

/// Commits to local owners on this node, to remote ones over QUIC.
#[derive(Debug)]
pub struct RemoteTransport {
    local: LocalTransport,
    cluster: Cluster,
    clock: Clock,
}

impl RemoteTransport {
    /// The cluster's commit transport.
    pub fn new(local: LocalTransport, cluster: Cluster, clock: Clock) -> RemoteTransport {
        RemoteTransport {
            local,
            cluster,
            clock,
        }
    }
}

impl CommitTransport for RemoteTransport {
    fn commit(&self, commit: SendCommit) -> BoxFuture<'static, CommitOutcome> {
        let CommitOwner::Remote(node) = commit.owner else {
            return self.local.commit(commit);
        };
        let with_ids = commit.with_ids;
        let records: Vec<WireRecord> = commit
            .records
            .iter()
            .map(|record| WireRecord {
                topic_id: if with_ids { record.topic_id() } else { None },
                key: record.key().map(<[u8]>::to_vec),
                payload: record.payload().to_vec(),
            })
            .collect();
        let carried_ids = records.iter().any(|record| record.topic_id.is_some());
        let budget = commit.deadline.saturating_duration_since(self.clock.now());
        let batch = CommitProduceBatch {
            budget_ms: u32::try_from(budget.as_millis()).unwrap_or(u32::MAX),
            topic: commit.topic.to_string(),
            partition: commit.partition,
            records,
        };
        drop(commit);
        let cluster = self.cluster.clone();
        Box::pin(async move {
            let body = batch.encode();
            drop(batch);
            let answer = cluster.call(node, "commit_batch", &body, budget).await;
            match answer {
                Ok(answer) => commit_outcome(&answer, carried_ids),
                Err(RpcError::Timeout(_)) => Err(CommitFailure::Timeout),
                Err(RpcError::TooLarge(error)) => Err(CommitFailure::Failed(error.to_string())),
                Err(error @ (RpcError::UnknownPeer(_) | RpcError::Unreachable { .. })) => {
                    Err(CommitFailure::Unavailable(error.to_string()))
                }
            }
        })
    }
}

/// The dispatcher's form of an owner's answer.
pub(crate) fn commit_outcome(answer: &[u8], carried_ids: bool) -> CommitOutcome {
    match CommitAnswer::decode(answer) {
        Ok(CommitAnswer::Committed {
            base,
            count,
            committed_at_ms,
        }) => Ok(CommittedRange {
            base,
            count,
            committed_at_ms,
        }),
        Ok(CommitAnswer::NotOwner) => Err(CommitFailure::NotOwner),
        Ok(CommitAnswer::IncarnationMismatch {
            record_topic_id,
            live_topic_id,
        }) => Err(CommitFailure::IncarnationMismatch {
            record_topic_id,
            live_topic_id,
        }),
        Ok(CommitAnswer::BadRequest(_)) if carried_ids => Err(CommitFailure::RefusedTrailingIds),
        Ok(CommitAnswer::BadRequest(reason)) => Err(CommitFailure::Failed(reason)),
        Ok(CommitAnswer::Unavailable(reason)) => Err(CommitFailure::Unavailable(reason)),
        Ok(CommitAnswer::Failed(reason)) => Err(CommitFailure::Failed(reason)),
        Err(error) => Err(CommitFailure::Failed(format!(
            "undecodable commit answer: {error}"
        ))),
    }
}
