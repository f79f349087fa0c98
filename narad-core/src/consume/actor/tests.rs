use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::codec::partition::PartitionRecord;
use crate::codec::DecodeError;
use crate::consume::table::{CursorTable, SLOTS};
use crate::disk::{IoOp, IoReply};
use crate::error::IoFault;
use crate::planted::Plant;

const VIS: Duration = Duration::from_secs(5);
const T: TopicId = TopicId(7);
const OTHER: TopicId = TopicId(8);

fn topic() -> QueueTopic {
    QueueTopic {
        name: Arc::from("t"),
        id: T,
    }
}

fn limits() -> QueueLimits {
    QueueLimits {
        visibility: VIS,
        in_flight_max: 8,
        acked_ahead_max: 8,
    }
}

fn ms(millis: u64) -> Instant {
    Instant::from_millis(millis)
}

fn p(partition: u32) -> PartitionId {
    PartitionId(partition)
}

fn record(payload: &str) -> PartitionRecord {
    PartitionRecord {
        key: None,
        committed_at_ms: 1,
        payload: payload.as_bytes().to_vec(),
    }
}

fn stat(high_watermark: u64, oldest: u64) -> PartitionStat {
    PartitionStat {
        high_watermark: Offset(high_watermark),
        oldest_offset: Offset(oldest),
        next_offset: Offset(high_watermark),
        ..PartitionStat::default()
    }
}

fn stat_out(call: CallId, partition: u32) -> ConsumeOutput {
    ConsumeOutput::Stat {
        call,
        topic: topic(),
        partition: p(partition),
    }
}

fn read_out(call: CallId, partition: u32, offset: u64) -> ConsumeOutput {
    ConsumeOutput::Read {
        call,
        topic: topic(),
        partition: p(partition),
        offset: Offset(offset),
    }
}

fn watch_out() -> ConsumeOutput {
    ConsumeOutput::WatchCommits {
        topic: Arc::from("t"),
    }
}

/// Drives one actor on virtual time.
struct Harness {
    actor: ConsumeActor,
    now: Instant,
    next_call: u64,
}

impl Harness {
    fn new() -> Harness {
        Harness::with_cursors(&[])
    }

    fn with_cursors(cursors: &[((TopicId, u32), u64)]) -> Harness {
        let slots = CursorSlots {
            table: CursorTable {
                seq: 1,
                cursors: cursors
                    .iter()
                    .map(|((topic, partition), cursor)| ((*topic, p(*partition)), Offset(*cursor)))
                    .collect(),
            },
            next_slot: 1,
        };
        let config = ConsumeConfig {
            nonce_seed: 42,
            plant: Plant::NONE,
        };
        Harness {
            actor: ConsumeActor::new(config, slots, ms(0)),
            now: ms(0),
            next_call: 0,
        }
    }

    fn at(&mut self, millis: u64) {
        self.now = ms(millis);
    }

    fn feed(&mut self, input: ConsumeInput) -> Vec<ConsumeOutput> {
        self.actor.handle(self.now, input);
        std::iter::from_fn(|| self.actor.poll_output()).collect()
    }

    fn call_id(&mut self) -> CallId {
        self.next_call += 1;
        CallId(self.next_call)
    }

    fn consume(&mut self, candidates: &[u32], wait_ms: u64) -> (CallId, Vec<ConsumeOutput>) {
        let call = self.call_id();
        let outputs = self.feed(ConsumeInput::Consume {
            call,
            topic: topic(),
            limits: limits(),
            candidates: candidates.iter().copied().map(p).collect(),
            wait: Duration::from_millis(wait_ms),
        });
        (call, outputs)
    }

    fn stat(&mut self, call: CallId, high_watermark: u64, oldest: u64) -> Vec<ConsumeOutput> {
        self.feed(ConsumeInput::StatDone {
            call,
            stat: stat(high_watermark, oldest),
        })
    }

    fn read(&mut self, call: CallId, offset: u64, high_watermark: u64) -> Vec<ConsumeOutput> {
        self.feed(ConsumeInput::ReadDone {
            call,
            result: Ok(ReadBatch {
                first: Offset(offset),
                records: vec![record("m")],
                high_watermark: Offset(high_watermark),
            }),
        })
    }

    fn read_error(&mut self, call: CallId, error: PartitionReadError) -> Vec<ConsumeOutput> {
        self.feed(ConsumeInput::ReadDone {
            call,
            result: Err(error),
        })
    }

    fn settle(&mut self, handle: ReceiptHandle, action: Settle) -> Vec<ConsumeOutput> {
        let call = self.call_id();
        self.feed(ConsumeInput::Settle {
            call,
            topic: topic(),
            handle,
            action,
        })
    }

    fn tick(&mut self) -> Vec<ConsumeOutput> {
        self.feed(ConsumeInput::Tick)
    }

    /// Leases the next record of `partition` (whose log holds `high_watermark` records) and
    /// returns its handle.
    fn lease(&mut self, partition: u32, high_watermark: u64) -> ReceiptHandle {
        let (call, mut outputs) = self.consume(&[partition], 0);
        loop {
            match outputs.pop() {
                Some(ConsumeOutput::Stat { .. }) => outputs = self.stat(call, high_watermark, 0),
                Some(ConsumeOutput::Read { offset, .. }) => {
                    outputs = self.read(call, offset.0, high_watermark);
                }
                Some(ConsumeOutput::Consumed {
                    leased: Some(leased),
                    ..
                }) => return leased.handle,
                other => panic!("expected a lease on the way, got {other:?}"),
            }
        }
    }
}

fn consumed(outputs: &[ConsumeOutput]) -> Option<&LeasedRecord> {
    outputs.iter().find_map(|output| match output {
        ConsumeOutput::Consumed { leased, .. } => leased.as_ref(),
        _ => None,
    })
}

/// The table a `StoreCursors` request writes, and the slot file it goes to.
fn stored(outputs: &[ConsumeOutput]) -> (IoId, String, BTreeMap<CursorKey, Offset>) {
    let request = outputs
        .iter()
        .find_map(|output| match output {
            ConsumeOutput::StoreCursors(request) => Some(request),
            _ => None,
        })
        .expect("a cursor write");
    match &request.ops[..] {
        [IoOp::WriteAt { path, data, .. }, IoOp::SetLen { .. }, IoOp::SyncData { .. }] => {
            let table = CursorTable::decode(data).expect("a good table");
            (request.id, path.clone(), table.cursors)
        }
        other => panic!("unexpected cursor write {other:?}"),
    }
}

fn store_done(id: IoId, ok: bool) -> ConsumeInput {
    ConsumeInput::StoreDone(IoCompletion {
        id,
        result: if ok {
            Ok(vec![IoReply::Done, IoReply::Done, IoReply::Done])
        } else {
            Err((2, IoFault::Other("EIO".into())))
        },
    })
}

#[test]
fn each_round_starts_one_candidate_further_in_the_topics_rotation() {
    let mut h = Harness::new();
    let (a, outputs) = h.consume(&[0, 1, 2], 1_000);
    assert_eq!(outputs, [watch_out(), stat_out(a, 0)]);
    let (b, outputs) = h.consume(&[0, 1, 2], 1_000);
    assert_eq!(outputs, [stat_out(b, 1)]);
    let (c, outputs) = h.consume(&[0, 1, 2], 1_000);
    assert_eq!(outputs, [stat_out(c, 2)]);
    let (d, outputs) = h.consume(&[0, 1, 2], 1_000);
    assert_eq!(outputs, [stat_out(d, 0)]);
    // Within a round, an empty partition passes the call on to the next candidate, wrapping.
    assert_eq!(h.stat(c, 0, 0), [stat_out(c, 0)]);
    assert_eq!(h.stat(c, 0, 0), [stat_out(c, 1)]);
}

#[test]
fn the_high_watermark_is_learned_from_figures_and_reads_and_asked_again_only_when_nothing_is_below_it(
) {
    let mut h = Harness::new();
    let (a, outputs) = h.consume(&[0], 1_000);
    assert_eq!(outputs, [watch_out(), stat_out(a, 0)]);
    assert_eq!(h.stat(a, 2, 0), [read_out(a, 0, 0)]);
    let outputs = h.read(a, 0, 2);
    assert_eq!(consumed(&outputs).map(|l| l.handle.offset), Some(Offset(0)));
    // Offset 1 is below the watermark the figures gave: leased without asking again.
    let (b, outputs) = h.consume(&[0], 1_000);
    assert_eq!(outputs, [read_out(b, 0, 1)]);
    // The read says the log holds 5 now: offsets 2..5 are leased without figures.
    h.read(b, 1, 5);
    assert_eq!(h.actor.high_watermark(T, p(0)), Some(Offset(5)));
    for offset in 2..5 {
        let (call, outputs) = h.consume(&[0], 1_000);
        assert_eq!(outputs, [read_out(call, 0, offset)]);
        h.read(call, offset, 5);
    }
    // Nothing below it: the figures are asked again.
    let (e, outputs) = h.consume(&[0], 1_000);
    assert_eq!(outputs, [stat_out(e, 0)]);
}

#[test]
fn a_read_below_the_oldest_retained_record_moves_the_queue_past_it_and_reads_again() {
    let mut h = Harness::new();
    let (a, _) = h.consume(&[0, 1], 1_000);
    assert_eq!(h.stat(a, 10, 0), [read_out(a, 0, 0)]);
    let outputs = h.read_error(
        a,
        PartitionReadError::Log(LogReadError::BelowOldestRetained { oldest: Offset(6) }),
    );
    assert_eq!(outputs, [read_out(a, 0, 6)]);
    assert_eq!(h.actor.cursor(T, p(0)), Some(Offset(6)));
    assert!(h.actor.is_dirty(), "the skip is flushed");
}

#[test]
fn figures_below_the_oldest_retained_record_move_the_queue_past_it() {
    let mut h = Harness::with_cursors(&[((T, 0), 2)]);
    let (a, outputs) = h.consume(&[0], 1_000);
    assert_eq!(outputs, [watch_out(), stat_out(a, 0)]);
    assert_eq!(h.stat(a, 9, 4), [read_out(a, 0, 4)]);
    assert_eq!(h.actor.cursor(T, p(0)), Some(Offset(4)));
    assert!(h.actor.is_dirty());
}

#[test]
fn a_damaged_record_is_passed_over_as_done_and_the_next_one_read() {
    let mut h = Harness::new();
    let (a, _) = h.consume(&[0, 1], 1_000);
    h.stat(a, 10, 0);
    for reason in [
        ReadFault::Damaged(DecodeError::BadChecksum),
        ReadFault::Skipped,
    ] {
        let offset = h.actor.cursor(T, p(0)).expect("a queue").0;
        let outputs = h.read_error(
            a,
            PartitionReadError::Log(LogReadError::Unreadable {
                offset: Offset(offset),
                reason: reason.clone(),
            }),
        );
        let damaged = ConsumeOutput::Event(ConsumeEvent::Damaged {
            topic: topic(),
            partition: p(0),
            offset: Offset(offset),
            reason,
        });
        assert_eq!(outputs, [damaged, read_out(a, 0, offset + 1)]);
        assert_eq!(h.actor.cursor(T, p(0)), Some(Offset(offset + 1)), "done");
    }
    assert!(h.actor.is_dirty());
}

#[test]
fn a_disks_read_error_gives_the_lease_back_and_moves_on() {
    let mut h = Harness::new();
    let (a, _) = h.consume(&[0, 1], 1_000);
    h.stat(a, 10, 0);
    let error = PartitionReadError::Log(LogReadError::Unreadable {
        offset: Offset(0),
        reason: ReadFault::Io(IoFault::Other("EIO".into())),
    });
    let failed = ConsumeOutput::Event(ConsumeEvent::ReadFailed {
        topic: topic(),
        partition: p(0),
        offset: Offset(0),
        error: Some(error.clone()),
    });
    assert_eq!(h.read_error(a, error), [failed, stat_out(a, 1)]);
    assert_eq!(h.actor.cursor(T, p(0)), Some(Offset(0)), "not done");
    // Given back: the next call redelivers it.
    let (b, outputs) = h.consume(&[0], 1_000);
    let redelivered = ConsumeOutput::Event(ConsumeEvent::Redelivered);
    assert_eq!(outputs, [redelivered, read_out(b, 0, 0)]);
}

#[test]
fn any_other_read_failure_gives_the_lease_back_and_moves_on() {
    let failures = [
        Err(PartitionReadError::Log(LogReadError::Busy)),
        Err(PartitionReadError::Log(LogReadError::NotOpen)),
        Err(PartitionReadError::NotLive(T)),
        Err(PartitionReadError::Stopped),
        // Another record than the one leased.
        Ok(ReadBatch {
            first: Offset(1),
            records: vec![record("m")],
            high_watermark: Offset(10),
        }),
    ];
    for result in failures {
        let mut h = Harness::new();
        let (a, _) = h.consume(&[0, 1], 1_000);
        h.stat(a, 10, 0);
        let failed = ConsumeOutput::Event(ConsumeEvent::ReadFailed {
            topic: topic(),
            partition: p(0),
            offset: Offset(0),
            error: result.clone().err(),
        });
        let outputs = h.feed(ConsumeInput::ReadDone { call: a, result });
        assert_eq!(outputs, [failed, stat_out(a, 1)]);
        let (b, outputs) = h.consume(&[0], 1_000);
        assert_eq!(outputs[1], read_out(b, 0, 0), "redelivered");
    }
}

#[test]
fn a_read_at_or_past_the_high_watermark_believes_the_log_and_moves_on() {
    let mut h = Harness::new();
    let (a, _) = h.consume(&[0, 1], 1_000);
    assert_eq!(h.stat(a, 5, 0), [read_out(a, 0, 0)]);
    let outputs = h.read_error(
        a,
        PartitionReadError::Log(LogReadError::AtOrPastHighWatermark {
            high_watermark: Offset(0),
        }),
    );
    assert_eq!(outputs, [stat_out(a, 1)]);
    assert_eq!(h.actor.high_watermark(T, p(0)), Some(Offset(0)), "lowered");
    // The lease was given back: redelivered by the next call, whatever the watermark.
    let (b, outputs) = h.consume(&[0], 1_000);
    let redelivered = ConsumeOutput::Event(ConsumeEvent::Redelivered);
    assert_eq!(outputs, [redelivered, read_out(b, 0, 0)]);
}

#[test]
fn a_partition_whose_reads_keep_failing_holds_a_call_for_at_most_four_reads_a_round() {
    let mut h = Harness::new();
    let (a, _) = h.consume(&[0, 1], 1_000);
    h.stat(a, 100, 0);
    let mut outputs = Vec::new();
    for offset in 0..READS_PER_PARTITION_MAX as u64 {
        outputs = h.read_error(
            a,
            PartitionReadError::Log(LogReadError::BelowOldestRetained {
                oldest: Offset(offset + 1),
            }),
        );
    }
    assert_eq!(outputs, [stat_out(a, 1)]);
}

#[test]
fn a_waiting_call_is_answered_with_no_record_when_its_wait_ends_and_the_wait_is_clamped() {
    let mut h = Harness::new();
    let (a, _) = h.consume(&[0], 300);
    assert_eq!(h.stat(a, 0, 0), []);
    assert_eq!(h.actor.poll_timeout(), Some(ms(300)));
    h.at(299);
    assert_eq!(h.tick(), []);
    h.at(300);
    // One last round at the deadline: a record may have come without a wake.
    assert_eq!(h.tick(), [stat_out(a, 0)]);
    assert_eq!(
        h.stat(a, 0, 0),
        [ConsumeOutput::Consumed {
            call: a,
            leased: None
        }]
    );
    assert_eq!(h.actor.calls(), 0);
    let (b, _) = h.consume(&[0], 60_000);
    h.stat(b, 0, 0);
    assert_eq!(h.actor.poll_timeout(), Some(ms(300) + CONSUME_WAIT_MAX));
}

#[test]
fn a_call_without_wait_or_candidates_is_answered_after_one_round_or_at_once() {
    let mut h = Harness::new();
    let (a, _) = h.consume(&[0], 0);
    let none = |call| ConsumeOutput::Consumed { call, leased: None };
    assert_eq!(h.stat(a, 0, 0), [none(a)]);
    let (b, outputs) = h.consume(&[], 1_000);
    assert_eq!(outputs, [none(b)]);
}

#[test]
fn a_commit_to_the_topic_wakes_a_waiting_call_and_one_to_another_topic_does_not() {
    let mut h = Harness::new();
    let (a, _) = h.consume(&[0], 5_000);
    h.stat(a, 0, 0);
    h.at(100);
    let other = h.feed(ConsumeInput::Committed {
        topic: Arc::from("other"),
    });
    assert_eq!(other, []);
    let outputs = h.feed(ConsumeInput::Committed {
        topic: Arc::from("t"),
    });
    // Tried again at once, and still watched while it waits on.
    assert_eq!(outputs, [stat_out(a, 0), watch_out()]);
    assert_eq!(h.stat(a, 1, 0), [read_out(a, 0, 0)]);
    h.read(a, 0, 1);
    // Nobody waits any more: the next commit is not watched again.
    let outputs = h.feed(ConsumeInput::Committed {
        topic: Arc::from("t"),
    });
    assert_eq!(outputs, []);
}

#[test]
fn a_commit_while_a_round_reads_makes_the_call_try_again_instead_of_waiting() {
    let mut h = Harness::new();
    let (a, _) = h.consume(&[0], 5_000);
    let outputs = h.feed(ConsumeInput::Committed {
        topic: Arc::from("t"),
    });
    assert_eq!(outputs, [watch_out()]);
    // The round ends empty, but the commit may be what it missed: another round at once.
    assert_eq!(h.stat(a, 0, 0), [stat_out(a, 0)]);
    // No commit this time: it waits.
    assert_eq!(h.stat(a, 0, 0), []);
    assert_eq!(h.actor.poll_timeout(), Some(ms(5_000)));
}

#[test]
fn a_nack_wakes_a_waiting_call_which_takes_the_record_at_once() {
    let mut h = Harness::new();
    let handle = h.lease(0, 1);
    let (b, _) = h.consume(&[0], 5_000);
    assert_eq!(h.stat(b, 1, 0), []);
    let outputs = h.settle(handle, Settle::Nack);
    assert_eq!(
        outputs[..2],
        [
            ConsumeOutput::Event(ConsumeEvent::Nacked),
            ConsumeOutput::Settled {
                call: CallId(h.next_call),
                result: Ok(())
            }
        ]
    );
    assert_eq!(
        outputs[2..],
        [
            ConsumeOutput::Event(ConsumeEvent::Redelivered),
            read_out(b, 0, 0)
        ]
    );
}

#[test]
fn an_expiring_lease_wakes_a_waiting_call_which_redelivers_it() {
    let mut h = Harness::new();
    let handle = h.lease(0, 1);
    let (b, _) = h.consume(&[0], 10_000);
    assert_eq!(h.stat(b, 1, 0), []);
    // Woken at the lease's deadline, not the end of its own wait.
    assert_eq!(h.actor.poll_timeout(), Some(ms(0) + VIS));
    h.at(VIS.as_millis() as u64);
    let outputs = h.tick();
    assert_eq!(
        outputs,
        [
            ConsumeOutput::Event(ConsumeEvent::Redelivered),
            read_out(b, 0, 0)
        ]
    );
    let outputs = h.read(b, 0, 1);
    let leased = consumed(&outputs).expect("redelivered");
    assert_ne!(leased.handle.nonce, handle.nonce, "a new lease");
    assert_eq!(
        h.settle(handle, Settle::Ack)[0],
        ConsumeOutput::Settled {
            call: CallId(h.next_call),
            result: Err(HandleError::Stale)
        }
    );
}

#[test]
fn acks_and_nacks_are_counted_and_an_unknown_queue_is_stale() {
    let mut h = Harness::new();
    let handle = h.lease(0, 2);
    let outputs = h.settle(handle, Settle::Ack);
    assert_eq!(outputs[0], ConsumeOutput::Event(ConsumeEvent::Acked));
    let foreign = ReceiptHandle {
        partition: p(3),
        ..handle
    };
    let outputs = h.settle(foreign, Settle::Ack);
    assert_eq!(
        outputs,
        [ConsumeOutput::Settled {
            call: CallId(h.next_call),
            result: Err(HandleError::Stale)
        }]
    );
}

#[test]
fn nothing_is_written_while_no_cursor_moved() {
    let mut h = Harness::new();
    h.lease(0, 5);
    assert_eq!(
        h.actor.poll_timeout(),
        None,
        "a lease alone moves no cursor"
    );
    h.at(1_000);
    assert_eq!(h.tick(), []);
    let call = h.call_id();
    assert_eq!(
        h.feed(ConsumeInput::Flush { call }),
        [ConsumeOutput::Flushed {
            call,
            result: Ok(())
        }]
    );
}

#[test]
fn a_moved_cursor_is_written_at_the_next_interval_point_and_a_failed_write_again_after_one_more() {
    let mut h = Harness::new();
    let handle = h.lease(0, 5);
    h.at(250);
    h.settle(handle, Settle::Ack);
    // The grid of a periodic flush from the start: 100, 200, 300 ms.
    assert_eq!(h.actor.poll_timeout(), Some(ms(300)));
    h.at(300);
    let outputs = h.tick();
    let (id, path, cursors) = stored(&outputs);
    assert_eq!(path, SLOTS[1]);
    assert_eq!(cursors, BTreeMap::from([((T, p(0)), Offset(1))]));
    assert_eq!(h.actor.poll_timeout(), None, "one write at a time");
    h.at(310);
    let outputs = h.feed(store_done(id, false));
    assert_eq!(
        outputs,
        [ConsumeOutput::Event(ConsumeEvent::FlushFailed(
            IoFault::Other("EIO".into())
        ))]
    );
    assert_eq!(h.actor.poll_timeout(), Some(ms(410)));
    h.at(410);
    let outputs = h.tick();
    let (id, path, _) = stored(&outputs);
    assert_eq!(path, SLOTS[1], "the same slot again");
    h.feed(store_done(id, true));
    assert_eq!(h.actor.poll_timeout(), None);
    let handle = h.lease(0, 5);
    h.settle(handle, Settle::Ack);
    h.at(600);
    let (_, path, cursors) = stored(&h.tick());
    assert_eq!(path, SLOTS[0], "the other slot once one write succeeded");
    assert_eq!(cursors, BTreeMap::from([((T, p(0)), Offset(2))]));
}

#[test]
fn a_flush_call_during_a_write_is_answered_by_a_write_of_its_own() {
    let mut h = Harness::new();
    let first = h.lease(0, 5);
    let second = h.lease(0, 5);
    h.settle(first, Settle::Ack);
    h.at(100);
    let (id, _, _) = stored(&h.tick());
    h.settle(second, Settle::Ack);
    let call = h.call_id();
    assert_eq!(h.feed(ConsumeInput::Flush { call }), []);
    let outputs = h.feed(store_done(id, true));
    let (id, _, cursors) = stored(&outputs);
    assert_eq!(cursors, BTreeMap::from([((T, p(0)), Offset(2))]));
    assert_eq!(
        h.feed(store_done(id, true)),
        [ConsumeOutput::Flushed {
            call,
            result: Ok(())
        }]
    );
}

#[test]
fn flushes_drop_cursors_of_incarnations_no_longer_live_once_the_replica_caught_up() {
    let mut h = Harness::with_cursors(&[((T, 0), 0), ((OTHER, 0), 9), ((OTHER, 1), 4)]);
    let live = BTreeSet::from([T]);
    h.feed(ConsumeInput::LiveTopics {
        caught_up: false,
        live: live.clone(),
    });
    // A queue of the other incarnation, its cursor moved by an ack.
    let other = QueueTopic {
        name: Arc::from("u"),
        id: OTHER,
    };
    let call = h.call_id();
    h.feed(ConsumeInput::Consume {
        call,
        topic: other.clone(),
        limits: limits(),
        candidates: vec![p(2)],
        wait: Duration::ZERO,
    });
    h.stat(call, 3, 0);
    let handle = consumed(&h.read(call, 0, 3)).expect("leased").handle;
    let settle = h.call_id();
    h.feed(ConsumeInput::Settle {
        call: settle,
        topic: other,
        handle,
        action: Settle::Ack,
    });
    let handle = h.lease(0, 5);
    h.settle(handle, Settle::Ack);
    h.at(100);
    let (id, _, cursors) = stored(&h.tick());
    assert_eq!(
        cursors.len(),
        4,
        "a replica still booting lists no topic yet"
    );
    assert_eq!(cursors[&(OTHER, p(2))], Offset(1));
    h.feed(store_done(id, true));
    h.feed(ConsumeInput::LiveTopics {
        caught_up: true,
        live,
    });
    let handle = h.lease(0, 5);
    h.settle(handle, Settle::Ack);
    h.at(200);
    let (_, _, cursors) = stored(&h.tick());
    assert_eq!(cursors, BTreeMap::from([((T, p(0)), Offset(2))]));
    assert_eq!(h.actor.cursor(OTHER, p(0)), None);
    assert_eq!(h.actor.cursor(OTHER, p(2)), None);
}

#[test]
fn an_abandoned_call_is_never_answered_and_a_record_it_read_is_given_back() {
    let mut h = Harness::new();
    let (a, _) = h.consume(&[0], 1_000);
    assert_eq!(h.stat(a, 1, 0), [read_out(a, 0, 0)]);
    assert_eq!(h.feed(ConsumeInput::Abandon { call: a }), []);
    assert_eq!(h.read(a, 0, 1), []);
    assert_eq!(h.actor.calls(), 0);
    let (b, outputs) = h.consume(&[0], 1_000);
    let redelivered = ConsumeOutput::Event(ConsumeEvent::Redelivered);
    assert_eq!(outputs, [redelivered, read_out(b, 0, 0)]);
    // A waiting call goes at once.
    h.read(b, 0, 1);
    let (c, _) = h.consume(&[0], 1_000);
    assert_eq!(h.stat(c, 1, 0), []);
    assert_eq!(h.feed(ConsumeInput::Abandon { call: c }), []);
    assert_eq!(h.actor.calls(), 0);
    assert_eq!(h.actor.poll_timeout(), None);
}

#[test]
fn an_undelivered_record_is_given_back() {
    let mut h = Harness::new();
    let handle = h.lease(0, 1);
    h.feed(ConsumeInput::Undelivered { topic: T, handle });
    let (b, outputs) = h.consume(&[0], 1_000);
    let redelivered = ConsumeOutput::Event(ConsumeEvent::Redelivered);
    assert_eq!(outputs, [redelivered, read_out(b, 0, 0)]);
}
