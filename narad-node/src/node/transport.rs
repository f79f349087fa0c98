//! The dispatcher's one way to an owner: [`CommitTransport`] carries a [`SendCommit`] to the partition's
//! owner and brings back its typed answer. The dispatcher holds exactly one, and never learns
//! whether the owner is this node's owner host or another node.
//!
//! Implementations: [`LocalTransport`] (this node's partition host; a remote owner is unavailable, as a
//! single node has no cluster transport). The cluster adds QUIC, and the simulator its network, behind
//! the same trait.
//!
//! # Contract
//! - The answer is the owner's: `Ok` once the records are durable and visible there, or the
//!   [`CommitFailure`] that says why not. Refusals are mapped where they arise (the combiner's by
//!   `From<partition::CommitError>` in `narad-core`), never by status code.
//! - The returned future may be dropped at any point: the caller has given up (the dispatcher
//!   does so at the commit's deadline). An owner that has not started the batch then leaves it out.
//! - The future drops its share of the commit's records before it resolves, so a failed commit's
//!   records go back to the dispatcher without a copy.

use narad_core::dispatcher::{CommitFailure, CommitOwner, SendCommit};
use narad_core::partition::{BatchRecord, CommittedRange};

use super::partitions::{PartitionCommitError, PartitionHost};
use crate::http::BoxFuture;

/// What an owner answered a commit.
pub type CommitOutcome = Result<CommittedRange, CommitFailure>;

/// Carries commits to partition owners; see the module documentation.
pub trait CommitTransport: Send + Sync + std::fmt::Debug {
    /// Commits `commit`'s records on `commit.owner`, giving up at `commit.deadline` at the latest.
    fn commit(&self, commit: SendCommit) -> BoxFuture<'static, CommitOutcome>;
}

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
