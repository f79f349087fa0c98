//! Planted bugs: deliberate defects the simulator plants to prove its checker can fail.
//!
//! A bug is planted through an actor's configuration ([`Plant`] fields of `WalConfig`,
//! `PartitionLogConfig`, `DispatcherConfig`, `CombinerConfig`), never through a global. Only a build
//! with `--cfg madsim` (the simulator) can plant one: `Plant::new` exists only there, and outside it
//! [`Plant::is`] is the constant `false`, so every defect's branch is dead code the compiler removes.
//! This crate does not depend on madsim; it only reads the cfg flag.

use std::fmt;
use std::str::FromStr;

/// A deliberate defect the simulator must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PlantedBug {
    /// The WAL acknowledges a group commit once it is written, without the fsync that covers it.
    AckBeforeFsync,
    /// The dispatcher stores a checkpoint past a record whose commit is still in flight.
    CheckpointSkipsInflight,
    /// The WAL retries an fsync that failed with EIO and, once the retry "succeeds", acknowledges.
    FsyncRetryAfterEio,
    /// The WAL compacts the segment holding the synced checkpoint (records not yet dispatched).
    CompactAheadOfSyncedCheckpoint,
    /// The partition log trusts what it reads: no CRC check on read-back, reads or recovery.
    SkipReadbackCrc,
    /// The dispatcher and the combiner skip incarnation checks: a deleted incarnation's records are
    /// committed into the topic recreated under the same name.
    StaleIncarnationIntoRecreatedTopic,
    /// A batch that rolls the WAL segment loses the records staged after the roll, yet is acknowledged.
    RollDropsBatchTail,
    /// The dispatcher reroutes the records of a commit still in flight along with the rest of a dead
    /// or failing destination's records.
    RerouteInflight,
    /// The dispatcher discards a record once its local replica shows the incarnation gone, without
    /// asking the leader.
    DiscardWithoutLeaderConfirm,
    /// The dispatcher reads a 412 as a failure of the destination: it is marked failing and, past the
    /// grace, its records reroute.
    FourTwelveAsFailure,
    /// The owner commits a remote batch by name whatever incarnation its trailing section names.
    OwnerIgnoresTrailingIds,
    /// The owner commits a batch whose caller's deadline has passed (the caller gave up).
    CommitAfterCallerGaveUp,
    /// The owner answers a remote commit once it is appended, before the fsync that makes it durable.
    RemoteAckBeforeFsync,
    /// The metastore leader never marks a silent member dead: a dead owner's records never reroute.
    NeverMarkDead,
    /// The owner's partition log makes a commit visible (and answers it) once its partition write is
    /// read back, without waiting for the owner journal's fsync that makes it durable.
    VisibleBeforeJournalSync,
    /// The owner journal removes a sealed segment without waiting for the partition logs whose
    /// records it holds to sync them.
    TrimJournalAheadOfPartitionSync,
    /// The consumer cursor table stores each partition's lowest offset never delivered instead of its
    /// lowest offset not acked: a crash loses every leased record not yet acked.
    CursorPastLeases,
    /// After an older owner refused a batch's incarnation section, the dispatcher sends it again
    /// with the section (and keeps sending that owner's batches with it): the owner refuses each
    /// until the budget runs out and the records reroute.
    LegacyResendKeepsIds,
    /// Retention judges a segment's age by its oldest record instead of its newest: a segment goes
    /// once its first record has passed retention, records younger than retention with it.
    RetentionDeletesUnexpired,
    /// Once retention removed a log's segments, the owner lets the journal forget the log's entries
    /// as it does for a retired log: the journal trims entries of later records still durable only
    /// there, and a crash loses them.
    RetentionDeletesJournalNeeded,
    /// The combiner takes a partition's handoff freeze for ownership only when it starts a cycle's
    /// checks, not under the produce lock: a batch that passed the ownership check before the
    /// freeze commits after the final high watermark was answered, and the switch leaves it behind.
    FreezeNotRecheckedUnderLock,
    /// A move's destination proposes the switch once the freeze answered, without copying the tail
    /// between its bulk copy and the final high watermark.
    SwitchBeforeTailCopied,
    /// The source of a move reclaims its copy of the partition once its freeze is armed, before the
    /// switch applied: a move that is then aborted leaves the partition without its records.
    ReclaimBeforeSwitchConfirmed,
    /// A move carries a partition's queue-mode cursor but not its acked-ahead set: records acked
    /// past the cursor are delivered again by the new owner.
    MoveDropsAckedAhead,
}

impl PlantedBug {
    /// Every planted bug, in the order of the issue.
    pub const ALL: [PlantedBug; 24] = [
        PlantedBug::AckBeforeFsync,
        PlantedBug::CheckpointSkipsInflight,
        PlantedBug::FsyncRetryAfterEio,
        PlantedBug::CompactAheadOfSyncedCheckpoint,
        PlantedBug::SkipReadbackCrc,
        PlantedBug::StaleIncarnationIntoRecreatedTopic,
        PlantedBug::RollDropsBatchTail,
        PlantedBug::RerouteInflight,
        PlantedBug::DiscardWithoutLeaderConfirm,
        PlantedBug::FourTwelveAsFailure,
        PlantedBug::OwnerIgnoresTrailingIds,
        PlantedBug::CommitAfterCallerGaveUp,
        PlantedBug::RemoteAckBeforeFsync,
        PlantedBug::NeverMarkDead,
        PlantedBug::VisibleBeforeJournalSync,
        PlantedBug::TrimJournalAheadOfPartitionSync,
        PlantedBug::CursorPastLeases,
        PlantedBug::LegacyResendKeepsIds,
        PlantedBug::RetentionDeletesUnexpired,
        PlantedBug::RetentionDeletesJournalNeeded,
        PlantedBug::FreezeNotRecheckedUnderLock,
        PlantedBug::SwitchBeforeTailCopied,
        PlantedBug::ReclaimBeforeSwitchConfirmed,
        PlantedBug::MoveDropsAckedAhead,
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            PlantedBug::AckBeforeFsync => "ack-before-fsync",
            PlantedBug::CheckpointSkipsInflight => "checkpoint-skips-inflight",
            PlantedBug::FsyncRetryAfterEio => "fsync-retry-after-eio",
            PlantedBug::CompactAheadOfSyncedCheckpoint => "compact-ahead-of-synced-checkpoint",
            PlantedBug::SkipReadbackCrc => "skip-readback-crc",
            PlantedBug::StaleIncarnationIntoRecreatedTopic => {
                "stale-incarnation-into-recreated-topic"
            }
            PlantedBug::RollDropsBatchTail => "roll-drops-batch-tail",
            PlantedBug::RerouteInflight => "reroute-inflight",
            PlantedBug::DiscardWithoutLeaderConfirm => "discard-without-leader-confirm",
            PlantedBug::FourTwelveAsFailure => "412-as-failure",
            PlantedBug::OwnerIgnoresTrailingIds => "owner-ignores-trailing-ids",
            PlantedBug::CommitAfterCallerGaveUp => "commit-after-caller-gave-up",
            PlantedBug::RemoteAckBeforeFsync => "remote-ack-before-fsync",
            PlantedBug::NeverMarkDead => "never-mark-dead",
            PlantedBug::VisibleBeforeJournalSync => "visible-before-journal-sync",
            PlantedBug::TrimJournalAheadOfPartitionSync => "trim-journal-ahead-of-partition-sync",
            PlantedBug::CursorPastLeases => "cursor-past-leases",
            PlantedBug::LegacyResendKeepsIds => "legacy-resend-keeps-ids",
            PlantedBug::RetentionDeletesUnexpired => "retention-deletes-unexpired",
            PlantedBug::RetentionDeletesJournalNeeded => "retention-deletes-journal-needed",
            PlantedBug::FreezeNotRecheckedUnderLock => "freeze-not-rechecked-under-lock",
            PlantedBug::SwitchBeforeTailCopied => "switch-before-tail-copied",
            PlantedBug::ReclaimBeforeSwitchConfirmed => "reclaim-before-switch-confirmed",
            PlantedBug::MoveDropsAckedAhead => "move-drops-acked-ahead",
        }
    }
}

impl fmt::Display for PlantedBug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PlantedBug {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        PlantedBug::ALL
            .into_iter()
            .find(|bug| bug.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = PlantedBug::ALL.iter().map(|bug| bug.name()).collect();
                format!("unknown planted bug {name:?}; known: {}", names.join(", "))
            })
    }
}

/// The bug planted in one actor, if any. Zero-sized outside the simulator, where nothing is planted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Plant {
    #[cfg(madsim)]
    bug: Option<PlantedBug>,
}

impl Plant {
    /// Nothing planted.
    pub const NONE: Plant = Plant {
        #[cfg(madsim)]
        bug: None,
    };

    /// Plants `bug` (simulation builds only).
    #[cfg(madsim)]
    pub fn new(bug: Option<PlantedBug>) -> Plant {
        Plant { bug }
    }

    /// Whether `bug` is planted. Always `false` outside the simulator.
    #[inline(always)]
    pub fn is(self, bug: PlantedBug) -> bool {
        #[cfg(madsim)]
        {
            self.bug == Some(bug)
        }
        #[cfg(not(madsim))]
        {
            let _ = bug;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planted_bug_names_round_trip_and_unknown_names_are_refused() {
        for bug in PlantedBug::ALL {
            assert_eq!(bug.name().parse::<PlantedBug>(), Ok(bug));
        }
        let error = "ack-after-fsync".parse::<PlantedBug>().unwrap_err();
        assert!(error.contains("unknown planted bug") && error.contains("ack-before-fsync"));
    }

    #[test]
    fn nothing_is_planted_by_default() {
        for bug in PlantedBug::ALL {
            assert!(!Plant::NONE.is(bug));
            assert!(!Plant::default().is(bug));
        }
    }
}
