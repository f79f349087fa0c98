//! The dispatcher: one per node, it moves every durable ingress-WAL record to its partition's owner
//! and keeps the checkpoint honest (produce-path spec, "Dispatch stage").
//!
//! # Contract
//! Every record in the WAL from the checkpoint on is, at any moment, **done** (committed, or discarded
//! after the metastore leader confirmed its topic incarnation deleted), **held** (queued, in flight, a
//! probe) or **skipped** (left in the WAL, read again later), or not yet read. The checkpoint is the
//! first sequence number not done, so it never passes a record that is not committed. Records are
//! never lost by the dispatcher; they may be committed more than once (a crash, a commit that lands
//! after its budget, a reroute after a late success), as the delivery contract allows.
//!
//! # Driver protocol
//! Construct with [`DispatcherConfig`] (the recovered checkpoint and the WAL's durable end), then feed
//! the local metastore replica (`Topic` for every topic) and membership (`Member` for every node)
//! before the first `Tick`. After every [`crate::Actor::handle`], drain
//! [`crate::Actor::poll_output`], execute each output, and feed each answer back as an input; then
//! arrange a `Tick` at [`crate::Actor::poll_timeout`] (always `Some`: the 1 s rescan and the 10 ms
//! read backstop keep the dispatcher ticking).
//!
//! | output | the driver | answer |
//! |---|---|---|
//! | `ReadWal { from, max_records, max_bytes }` | reads durable records `from..`, consecutive, at most `max_records` / `max_bytes` (at least one when one is durable) | `WalFrames { frames }` (possibly empty) or `WalReadFailed { fault }` (a WAL read error other than an I/O fault as `IoFault::Other`) |
//! | `SendCommit(..)` | local owner: the partition's combiner; remote: `CommitProduceBatch` over the cluster transport, with the incarnation section iff `with_ids` and `topic_id` is set; gives up at `deadline` | exactly one `CommitDone` or `CommitFailed { failure }` per `commit_id` (the owner's typed answer: a 412 or the combiner's `TopicIncarnationMismatch` → `IncarnationMismatch`, a 400 for trailing data → `RefusedTrailingIds`, giving up → `Timeout`; `From<partition::CommitError>` maps the local combiner's refusals) |
//! | `StoreCheckpoint { seq }` | hands it to the Checkpointer (in-place store, synced within 250 ms) | `CheckpointStored` or `CheckpointStoreFailed` |
//! | `ConfirmTopicGone { topic }` | asks the metastore leader (a barrier first when this node leads) what the name holds | exactly one `TopicGoneAnswer` (`Unconfirmed` when the leader cannot be reached) |
//! | `Warn(w)` | logs `w.message()` at warning level with `w`'s fields | — |
//!
//! The WAL host also sends `Durable { next_seq }` whenever its group commit makes records durable,
//! which wakes the reader at once; the metastore replica sends `Topic` on every change and membership
//! `Member` on every change. At most one read, one store, and one question per topic are outstanding;
//! the driver drops its copy of a commit's records before it answers (then a failed commit's records
//! return to the dispatcher without a copy).
//!
//! # Rules (each has a unit test named after it)
//! - **One reader, each record read once as it becomes durable**: woken by `Durable`, with a 10 ms
//!   idle backstop. It places each record on its destination's queue (a destination is a partition of
//!   a topic). The read passes over records that need no work (done, held, or still blocked) by
//!   sequence number, before decoding them.
//! - **One commit in flight per destination, up to 16 at once**; a destination's queued records leave
//!   together as its next commit, so records of one batch sharing a key reach their partition in WAL
//!   order (unless a reroute moves some).
//! - **Window**: 64 records per destination seen, between 4,096 and 65,536; a destination queues at
//!   most a quarter of it (at least 4,096); the reader stops when held records (hung commits aside)
//!   reach the window, but at least four destinations' worth (so one destination, a commit in flight
//!   plus a full queue, holds at most half); it never reads more than 16 windows past the checkpoint.
//! - **Linger**: while other commits are in flight, a destination with fewer than 64 queued records
//!   waits until twice its owner's moving-average commit latency has passed since its oldest record,
//!   at most 50 ms. An idle dispatcher, an owner not measured yet, and a failing destination's probe
//!   go at once.
//! - **Byte budget**: a remote commit carries at most 8 MiB of encoded records, always at least one;
//!   the rest stays queued in order. Local commits are unbounded. A commit never mixes incarnations.
//! - **Hung commits**: past 1 s in flight a commit stops counting against the 16, what queued behind
//!   it goes back to the WAL, and its destination takes nothing new until it lands (30 s budget).
//! - **Failure**: the destination keeps the first record as a probe, returns the rest (and its queue)
//!   to the WAL, and retries the probe 1 s after each failure on a 5 s budget. Only that destination
//!   waits; the dispatcher as a whole backs off (1 s) only when a WAL read or a checkpoint store
//!   fails. An owner that does not resolve is looked up again every 10 ms.
//! - **Reroute**: 3 s after the start of the first failed attempt, or at once when membership reports
//!   the owner dead, new and skipped records go to the next partition counting up (wrapping) whose
//!   owner is alive and whose own commits are neither failing nor hung. The probe keeps trying the
//!   original, which gets its records back once it succeeds; but a destination whose owner
//!   membership reports dead keeps no probe (its probe is rerouted too, and membership tells when
//!   the owner is back), so a dead owner never pins the checkpoint and the WAL behind it for the
//!   length of its outage. Records of a commit in flight are never resent or rerouted.
//! - **Skipped records** (probe held, hung, full queue, an earlier record of the same partition
//!   skipped, a deletion or incarnation change unconfirmed, a 412 until the next periodic pass) are
//!   read again in WAL order when their destination recovers or drains, and at least once a second.
//!   A rescan pass stops once no skipped record can be placed.
//! - **Incarnation checks** before placing, just before a batch leaves, and after a failed commit.
//!   A 412 (or local mismatch) sends the batch and its queue back to the WAL, not failing, no reroute,
//!   with the spec's warning. A record of a locally absent name, or of a replaced incarnation, is
//!   discarded only once the leader confirms (asked once per topic while a question is outstanding,
//!   an unconfirmed answer remembered 1 s); a confirmed incarnation is remembered.
//! - **Legacy owner**: a batch refused for its trailing incarnation section is sent again without ids
//!   on the rest of the same budget, and that owner gets id-less batches for 2 minutes.
//! - **Checkpoint**: moved over the done prefix and stored through the Checkpointer, one store at a
//!   time. Backlog = durable next − stored checkpoint.
//!
//! # Invariants (checked after every `handle`; fully by `check_invariants_deep`)
//! The checkpoint is the first sequence number not done and the stored one never passes it; at most
//! one commit per destination and at most 16 counted commits are in flight; records held (hung aside)
//! never exceed the held limit; the reader stays within 16 windows of the checkpoint; every held
//! record is in exactly one destination and every skipped one in exactly one skip set.

mod api;
mod commit;
mod machine;
mod outcome;
mod place;
mod read;
mod record;
mod strip;
mod tables;

#[cfg(test)]
mod tests;

pub use self::api::{
    CommitFailure, CommitId, CommitOwner, CommitRecords, DispatchWarning, DispatcherConfig,
    DispatcherInput, DispatcherOutput, FailureReaction, LeaderView, ReadWal, SendCommit,
    TopicPlacement, WARN_DISCARD_DELETED_TOPIC, WARN_DISCARD_QUEUE_DELETED_TOPIC,
    WARN_DISCARD_STALE_INCARNATION, WARN_INCARNATION_REFUSED, WARN_UNDECODABLE_RECORD,
};
pub use self::machine::{Dispatcher, Stats};
pub use self::record::DispatchRecord;

use ::core::time::Duration;

/// A record becoming durable wakes the reader at once; this bounds a missed wakeup.
pub const IDLE_BACKSTOP: Duration = Duration::from_millis(10);
/// How often an owner that does not resolve is looked up again.
pub const OWNER_LOOKUP_INTERVAL: Duration = Duration::from_millis(10);
/// The window's floor: records held in memory at once.
pub const WINDOW_RECORDS_MIN: usize = 4_096;
/// The window's hard cap.
pub const WINDOW_RECORDS_MAX: usize = 65_536;
/// The window aims for this many records per destination; a smaller batch lingers.
pub const TARGET_RECORDS_PER_DESTINATION: usize = 64;
/// The longest a small batch lingers.
pub const LINGER_MAX: Duration = Duration::from_millis(50);
/// A destination's queue cap is a quarter of the window, but at least this.
pub const DESTINATION_QUEUE_RECORDS_MIN: usize = 4_096;
/// A remote commit's encoded records: half the cluster stream's 16 MiB frame limit.
pub const REMOTE_COMMIT_BYTES_MAX: usize = 8 * 1024 * 1024;
/// The reader never reads more than this many windows past the checkpoint.
pub const LOOKAHEAD_WINDOWS: u64 = 16;
/// Commits in flight at once (hung ones aside).
pub const COMMITS_IN_FLIGHT_MAX: usize = 16;
/// A commit in flight longer than this is hung.
pub const HUNG_AFTER: Duration = Duration::from_secs(1);
/// A commit's budget.
pub const COMMIT_BUDGET: Duration = Duration::from_secs(30);
/// A probe's budget.
pub const PROBE_BUDGET: Duration = Duration::from_secs(5);
/// Between a failed commit and its probe, and the dispatcher's back-off after a failed read or store.
pub const FAILURE_BACKOFF: Duration = Duration::from_secs(1);
/// A destination failing this long (from the start of its first failed attempt) is rerouted.
pub const REROUTE_GRACE: Duration = Duration::from_secs(3);
/// Skipped records are read again at least this often.
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(1);
/// How long commits to an owner that refused topic ids go without them.
pub const LEGACY_OWNER_MEMORY: Duration = Duration::from_secs(120);
/// How long an unconfirmed answer from the leader is remembered (no new question meanwhile).
pub const UNCONFIRMED_MEMORY: Duration = Duration::from_secs(1);
/// The most records one WAL read asks for.
pub const READ_RECORDS_MAX: usize = 4_096;
/// The most record bytes one WAL read asks for (always at least one record): small enough that a
/// read's records are still in the CPU cache when they are placed, large enough to amortize the read.
pub const READ_BYTES_MAX: usize = 1024 * 1024;
/// The most destinations known at once; the reader stops in front of a record that needs another.
pub const DESTINATIONS_MAX: usize = 1 << 20;
/// The most topics known at once; the reader stops in front of a record that needs another.
pub const TOPICS_MAX: usize = 1 << 16;
/// The most confirmed-deleted incarnations remembered (the oldest is forgotten, then asked again).
pub const GONE_INCARNATIONS_MAX: usize = 65_536;
