//! How an owner's refusal reads to the dispatcher: the local combiner's [`CommitError`] as
//! a [`CommitFailure`]. The cluster transport maps a remote owner's answer to the same type, so both
//! owners' refusals meet the same rules (`CommitFailure::reaction`).

use super::api::CommitFailure;
use crate::partition::{CommitError, CommitFault};

impl From<CommitError> for CommitFailure {
    fn from(error: CommitError) -> CommitFailure {
        match error {
            CommitError::TopicIncarnationMismatch {
                record_topic_id,
                live_topic_id,
            } => CommitFailure::IncarnationMismatch {
                record_topic_id,
                live_topic_id,
            },
            // The combiner left the batch out because its caller had given up: as if it timed out.
            CommitError::CallerGone => CommitFailure::Timeout,
            CommitError::NotOwner => CommitFailure::NotOwner,
            // An id-less batch for a name this owner does not hold: a failure, so the incarnation
            // check after it asks the leader before anything is discarded (never a reroute by name).
            CommitError::TopicNotFound => CommitFailure::Failed("topic not found".to_string()),
            CommitError::Overloaded => CommitFailure::Unavailable("commit queue full".to_string()),
            CommitError::LogUnavailable(status) => {
                CommitFailure::Unavailable(format!("partition log unavailable ({status:?})"))
            }
            CommitError::Storage(fault) => CommitFailure::Failed(match fault {
                CommitFault::Create(fault)
                | CommitFault::Write(fault)
                | CommitFault::Sync(fault)
                | CommitFault::ReadBack(fault) => format!("partition storage failed: {fault}"),
                other @ (CommitFault::NotReady(_)
                | CommitFault::Empty
                | CommitFault::RecordTooLarge
                | CommitFault::ReadBackMismatch) => format!("partition commit failed: {other}"),
            }),
            CommitError::RecordTooLarge => CommitFailure::Failed("record too large".to_string()),
            CommitError::EmptyBatch => CommitFailure::Failed("empty batch".to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatcher::FailureReaction;
    use crate::ids::TopicId;
    use crate::partition::LogStatus;
    use crate::IoFault;

    fn reaction(error: CommitError) -> FailureReaction {
        CommitFailure::from(error).reaction()
    }

    #[test]
    fn only_an_incarnation_mismatch_sends_records_back_without_failing_the_destination() {
        let mismatch = CommitError::TopicIncarnationMismatch {
            record_topic_id: TopicId(1),
            live_topic_id: Some(TopicId(2)),
        };
        assert_eq!(
            CommitFailure::from(mismatch.clone()),
            CommitFailure::IncarnationMismatch {
                record_topic_id: TopicId(1),
                live_topic_id: Some(TopicId(2)),
            }
        );
        assert_eq!(
            reaction(mismatch),
            FailureReaction::Refused {
                live_topic_id: Some(TopicId(2))
            }
        );
        for failing in [
            CommitError::NotOwner,
            CommitError::TopicNotFound,
            CommitError::CallerGone,
            CommitError::Overloaded,
            CommitError::LogUnavailable(LogStatus::Latched),
            CommitError::Storage(CommitFault::Sync(IoFault::Eio)),
            CommitError::RecordTooLarge,
            CommitError::EmptyBatch,
        ] {
            assert_eq!(
                reaction(failing.clone()),
                FailureReaction::Failing,
                "{failing:?}"
            );
        }
    }

    #[test]
    fn combiner_refusals_keep_their_kind() {
        assert_eq!(
            CommitFailure::from(CommitError::NotOwner),
            CommitFailure::NotOwner
        );
        assert_eq!(
            CommitFailure::from(CommitError::CallerGone),
            CommitFailure::Timeout
        );
        assert!(matches!(
            CommitFailure::from(CommitError::Overloaded),
            CommitFailure::Unavailable(_)
        ));
        assert!(matches!(
            CommitFailure::from(CommitError::LogUnavailable(LogStatus::Latched)),
            CommitFailure::Unavailable(_)
        ));
        assert_eq!(
            CommitFailure::from(CommitError::Storage(CommitFault::Sync(IoFault::Eio))),
            CommitFailure::Failed(format!("partition storage failed: {}", IoFault::Eio))
        );
        assert!(matches!(
            CommitFailure::from(CommitError::TopicNotFound),
            CommitFailure::Failed(_)
        ));
    }

    #[test]
    fn a_legacy_refusal_is_resent_without_ids_and_the_rest_fail_the_destination() {
        assert_eq!(
            CommitFailure::RefusedTrailingIds.reaction(),
            FailureReaction::ResendWithoutIds
        );
        for failing in [
            CommitFailure::NotOwner,
            CommitFailure::Unavailable("unreachable".to_string()),
            CommitFailure::Failed("eio".to_string()),
            CommitFailure::Timeout,
        ] {
            assert_eq!(failing.reaction(), FailureReaction::Failing, "{failing:?}");
        }
    }
}
