//! The [`CommitTransport`] to this node's own partition host: what a single node dispatches through,
//! and what the cluster's transport falls back to for a partition this node owns.

use narad_core::dispatcher::{CommitFailure, CommitOwner, SendCommit};
use narad_core::partition::BatchRecord;

use super::partitions::{PartitionCommitError, PartitionHost};
use crate::future::BoxFuture;
use crate::ingress::transport::{CommitOutcome, CommitTransport};

/// Commits to this node's partition host; a remote owner is [`CommitFailure::Unavailable`].
#[derive(Clone, Debug)]
pub struct LocalTransport {
    partitions: PartitionHost,
}

impl LocalTransport {
    /// A transport over this node's partition host.
    pub fn new(partitions: PartitionHost) -> LocalTransport {
        LocalTransport { partitions }
    }
}

impl CommitTransport for LocalTransport {
    fn commit(&self, commit: SendCommit) -> BoxFuture<'static, CommitOutcome> {
        let SendCommit {
            commit_id: _,
            topic,
            topic_id: _,
            partition,
            owner,
            records,
            with_ids,
            deadline,
        } = commit;
        if let CommitOwner::Remote(node) = owner {
            tracing::error!(%node, %topic, %partition, "a remote owner on a single node: no cluster transport");
            return Box::pin(std::future::ready(Err(CommitFailure::Unavailable(
                format!("no cluster transport to node {node}"),
            ))));
        }
        let batch: Vec<BatchRecord> = records
            .iter()
            .map(|record| BatchRecord {
                topic_id: if with_ids { record.topic_id() } else { None },
                key: record.key().map(<[u8]>::to_vec),
                payload: record.payload().to_vec(),
            })
            .collect();
        drop(records);
        let partitions = self.partitions.clone();
        Box::pin(async move {
            partitions
                .commit(topic, partition, batch, Some(deadline))
                .await
                .map_err(|error| match error {
                    PartitionCommitError::Combiner(error) => CommitFailure::from(error),
                    PartitionCommitError::Stopped => {
                        CommitFailure::Unavailable("the partition host has stopped".to_string())
                    }
                })
        })
    }
}
