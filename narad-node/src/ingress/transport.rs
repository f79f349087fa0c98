//! The dispatcher's one way to an owner: [`CommitTransport`] carries a [`SendCommit`] to the partition's
//! owner and brings back its typed answer. The dispatcher holds exactly one, and never learns
//! whether the owner is this node's owner host or another node.
//!
//! Implementations: `crate::node::local_transport::LocalTransport` (this node's partition host; a remote owner is unavailable, as a
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

use narad_core::dispatcher::{CommitFailure, SendCommit};
use narad_core::partition::CommittedRange;

use crate::future::BoxFuture;

/// What an owner answered a commit.
pub type CommitOutcome = Result<CommittedRange, CommitFailure>;

/// Carries commits to partition owners; see the module documentation.
pub trait CommitTransport: Send + Sync + std::fmt::Debug {
    /// Commits `commit`'s records on `commit.owner`, giving up at `commit.deadline` at the latest.
    fn commit(&self, commit: SendCommit) -> BoxFuture<'static, CommitOutcome>;
}
