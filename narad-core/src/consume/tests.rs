use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::table::{CursorSlots, CursorTable};
use super::*;
use crate::ids::TopicId;

const VIS: Duration = Duration::from_secs(5);

fn limits(in_flight_max: u32, acked_ahead_max: u32) -> QueueLimits {
    QueueLimits {
        visibility: VIS,
        in_flight_max,
        acked_ahead_max,
    }
}

fn ms(millis: u64) -> Instant {
    Instant::from_millis(millis)
}

#[track_caller]
fn lease(reserve: Reserve) -> (Offset, u64) {
    match reserve {
        Reserve::Leased { offset, nonce, .. } => (offset, nonce),
        other => panic!("expected a lease, got {other:?}"),
    }
}

#[test]
fn fresh_records_are_leased_in_order_up_to_the_high_watermark() {
    let mut queue = PartitionQueue::new(limits(8, 8), Offset(0), 100);
    assert_eq!(lease(queue.reserve(ms(0), Offset(2))).0, Offset(0));
    assert_eq!(lease(queue.reserve(ms(0), Offset(2))).0, Offset(1));
    assert_eq!(queue.reserve(ms(0), Offset(2)), Reserve::Empty);
    assert_eq!(lease(queue.reserve(ms(0), Offset(3))).0, Offset(2));
}

#[test]
fn each_lease_gets_its_own_nonce_and_a_deadline_one_visibility_away() {
    let mut queue = PartitionQueue::new(limits(8, 8), Offset(0), 7);
    let Reserve::Leased {
        nonce, deadline, ..
    } = queue.reserve(ms(1_000), Offset(5))
    else {
        panic!("leased")
    };
    assert_eq!(nonce, 7);
    assert_eq!(deadline, ms(1_000) + VIS);
    assert_eq!(lease(queue.reserve(ms(1_000), Offset(5))).1, 8);
}

#[test]
fn acks_in_order_advance_the_cursor_and_acks_ahead_wait_for_the_gap() {
    let mut queue = PartitionQueue::new(limits(8, 8), Offset(10), 0);
    let first = lease(queue.reserve(ms(0), Offset(13)));
    let second = lease(queue.reserve(ms(0), Offset(13)));
    let third = lease(queue.reserve(ms(0), Offset(13)));
    assert_eq!(queue.ack(ms(1), third.0, third.1), Ok(Offset(10)));
    assert_eq!(queue.ack(ms(1), second.0, second.1), Ok(Offset(10)));
    assert_eq!(queue.acked_ahead(), 2);
    assert_eq!(queue.ack(ms(1), first.0, first.1), Ok(Offset(13)));
    assert_eq!(queue.acked_ahead(), 0);
    assert_eq!(queue.cursor(), Offset(13));
}

#[test]
fn an_acked_handle_is_stale_the_second_time() {
    let mut queue = PartitionQueue::new(limits(8, 8), Offset(0), 0);
    let (offset, nonce) = lease(queue.reserve(ms(0), Offset(1)));
    assert_eq!(queue.ack(ms(1), offset, nonce), Ok(Offset(1)));
    assert_eq!(queue.ack(ms(1), offset, nonce), Err(HandleError::Stale));
    assert_eq!(queue.nack(ms(1), offset, nonce), Err(HandleError::Stale));
    assert_eq!(queue.extend(ms(1), offset, nonce), Err(HandleError::Stale));
}

#[test]
fn an_expired_lease_is_redelivered_under_a_new_nonce_and_its_old_handle_is_stale() {
    let mut queue = PartitionQueue::new(limits(8, 8), Offset(0), 0);
    let (offset, old) = lease(queue.reserve(ms(0), Offset(1)));
    assert_eq!(queue.reserve(ms(4_999), Offset(1)), Reserve::Empty);
    let Reserve::Leased {
        offset: again,
        nonce,
        redelivery,
        ..
    } = queue.reserve(ms(5_000), Offset(1))
    else {
        panic!("the expired lease is redelivered")
    };
    assert_eq!((again, redelivery), (offset, true));
    assert_ne!(nonce, old);
    assert_eq!(queue.ack(ms(5_001), offset, old), Err(HandleError::Stale));
    assert_eq!(queue.ack(ms(5_001), offset, nonce), Ok(Offset(1)));
}

#[test]
fn a_lease_past_its_deadline_is_never_acked_even_before_a_sweep() {
    let mut queue = PartitionQueue::new(limits(8, 8), Offset(0), 0);
    let (offset, nonce) = lease(queue.reserve(ms(0), Offset(1)));
    assert_eq!(queue.ack(ms(5_000), offset, nonce), Err(HandleError::Stale));
    assert_eq!(queue.cursor(), Offset(0));
    assert_eq!(queue.waiting_redelivery(), 1);
}

#[test]
fn an_extend_keeps_the_lease_past_its_first_deadline() {
    let mut queue = PartitionQueue::new(limits(8, 8), Offset(0), 0);
    let (offset, nonce) = lease(queue.reserve(ms(0), Offset(1)));
    assert_eq!(queue.extend(ms(4_000), offset, nonce), Ok(()));
    assert_eq!(queue.next_deadline(), Some(ms(9_000)));
    assert_eq!(queue.reserve(ms(8_000), Offset(1)), Reserve::Empty);
    assert_eq!(queue.ack(ms(8_999), offset, nonce), Ok(Offset(1)));
}

#[test]
fn a_nack_redelivers_at_once_before_fresh_records() {
    let mut queue = PartitionQueue::new(limits(8, 8), Offset(0), 0);
    let (first, nonce) = lease(queue.reserve(ms(0), Offset(3)));
    assert_eq!(queue.nack(ms(1), first, nonce), Ok(()));
    let Reserve::Leased {
        offset, redelivery, ..
    } = queue.reserve(ms(1), Offset(3))
    else {
        panic!("leased")
    };
    assert_eq!((offset, redelivery), (first, true));
    assert_eq!(lease(queue.reserve(ms(1), Offset(3))).0, Offset(1));
}

#[test]
fn the_in_flight_cap_stops_fresh_leases_until_one_ends() {
    let mut queue = PartitionQueue::new(limits(2, 8), Offset(0), 0);
    let first = lease(queue.reserve(ms(0), Offset(10)));
    lease(queue.reserve(ms(0), Offset(10)));
    assert_eq!(queue.reserve(ms(0), Offset(10)), Reserve::Full);
    assert!(!queue.has_work(ms(0), Offset(10)));
    queue.ack(ms(1), first.0, first.1).unwrap();
    assert!(queue.has_work(ms(1), Offset(10)));
    assert_eq!(lease(queue.reserve(ms(1), Offset(10))).0, Offset(2));
}

#[test]
fn the_acked_ahead_cap_refuses_the_ack_and_keeps_the_lease() {
    let mut queue = PartitionQueue::new(limits(8, 1), Offset(0), 0);
    let head = lease(queue.reserve(ms(0), Offset(3)));
    let second = lease(queue.reserve(ms(0), Offset(3)));
    let third = lease(queue.reserve(ms(0), Offset(3)));
    assert_eq!(queue.ack(ms(1), second.0, second.1), Ok(Offset(0)));
    assert_eq!(
        queue.ack(ms(1), third.0, third.1),
        Err(HandleError::AckedAheadFull)
    );
    assert_eq!(queue.leased(), 2, "the refused ack's lease is kept");
    // The head's ack never needs room: it drains the acked-ahead set.
    assert_eq!(queue.ack(ms(1), head.0, head.1), Ok(Offset(2)));
    assert_eq!(queue.ack(ms(1), third.0, third.1), Ok(Offset(3)));
}

#[test]
fn a_released_lease_is_redelivered_and_a_released_stale_one_is_ignored() {
    let mut queue = PartitionQueue::new(limits(8, 8), Offset(0), 0);
    let (offset, nonce) = lease(queue.reserve(ms(0), Offset(1)));
    queue.release(offset, nonce + 1);
    assert_eq!(queue.leased(), 1);
    queue.release(offset, nonce);
    assert_eq!(queue.waiting_redelivery(), 1);
    assert_eq!(lease(queue.reserve(ms(0), Offset(1))).0, offset);
}

#[test]
fn a_discarded_lease_counts_as_done_past_the_acked_ahead_cap() {
    let mut queue = PartitionQueue::new(limits(8, 0), Offset(0), 0);
    let head = lease(queue.reserve(ms(0), Offset(3)));
    let damaged = lease(queue.reserve(ms(0), Offset(3)));
    queue.discard(damaged.0, damaged.1 + 1);
    assert_eq!(queue.leased(), 2, "another nonce's discard is ignored");
    queue.discard(damaged.0, damaged.1);
    assert_eq!((queue.leased(), queue.acked_ahead()), (1, 1));
    assert_eq!(queue.ack(ms(0), head.0, head.1), Ok(Offset(2)));
}

#[test]
fn records_below_the_oldest_retained_count_as_done() {
    let mut queue = PartitionQueue::new(limits(8, 8), Offset(0), 0);
    let first = lease(queue.reserve(ms(0), Offset(10)));
    lease(queue.reserve(ms(0), Offset(10)));
    let third = lease(queue.reserve(ms(0), Offset(10)));
    let fifth_lease = {
        lease(queue.reserve(ms(0), Offset(10)));
        lease(queue.reserve(ms(0), Offset(10)))
    };
    queue.ack(ms(0), fifth_lease.0, fifth_lease.1).unwrap();
    queue.nack(ms(0), third.0, third.1).unwrap();
    queue.skip_below(Offset(4));
    // 0..4 are gone; 4 is acked, so the cursor passes it too.
    assert_eq!(queue.cursor(), Offset(5));
    assert_eq!(queue.ack(ms(0), first.0, first.1), Err(HandleError::Stale));
    assert_eq!(lease(queue.reserve(ms(0), Offset(10))).0, Offset(5));
    // A cursor past `next` moves `next` too.
    let mut empty = PartitionQueue::new(limits(8, 8), Offset(0), 0);
    empty.skip_below(Offset(7));
    assert_eq!(lease(empty.reserve(ms(0), Offset(9))).0, Offset(7));
}

#[test]
fn a_restart_resumes_at_the_cursor() {
    let mut queue = PartitionQueue::new(limits(8, 8), Offset(4), 0);
    assert_eq!(lease(queue.reserve(ms(0), Offset(5))).0, Offset(4));
}

#[test]
fn receipt_handles_print_and_parse_in_decimal() {
    let handle = ReceiptHandle {
        partition: PartitionId(2),
        offset: Offset(41),
        nonce: 18_446_744_073_709_551_615,
    };
    assert_eq!(handle.to_string(), "2:41:18446744073709551615");
    assert_eq!(ReceiptHandle::parse(&handle.to_string()), Some(handle));
    for bad in [
        "",
        "1:2",
        "1:2:3:4",
        "a:2:3",
        "1::3",
        "+1:2:3",
        "1:-2:3",
        " 1:2:3",
        "1:2:3 ",
        "4294967296:0:0",
        "1:2:18446744073709551616",
    ] {
        assert_eq!(ReceiptHandle::parse(bad), None, "{bad:?}");
    }
}

#[test]
fn topic_limits_default_and_clamp() {
    assert_eq!(limits_of(0, 1024, 1024).visibility, VISIBILITY_DEFAULT);
    assert_eq!(limits_of(10, 1024, 1024).visibility, VISIBILITY_MIN);
    assert_eq!(
        limits_of(2_500, 3, 4),
        QueueLimits {
            visibility: Duration::from_millis(2_500),
            in_flight_max: 3,
            acked_ahead_max: 4
        }
    );
}

/// Random consumers against the queue, the model being what was delivered and acked: every offset
/// below the high watermark is delivered at least once, nothing is acked that was not delivered
/// under that handle, the cursor never passes an offset not acked, and the caps hold.
#[test]
fn random_consumers_get_every_record_at_least_once_within_the_caps() {
    for seed in 0..200u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let in_flight_max = rng.random_range(1..6);
        let acked_ahead_max = rng.random_range(0..6);
        let mut queue =
            PartitionQueue::new(limits(in_flight_max, acked_ahead_max), Offset(0), seed);
        let mut now = ms(0);
        let mut hwm = 0u64;
        let mut held: Vec<(Offset, u64)> = Vec::new();
        let mut delivered = BTreeSet::new();
        let mut acked = BTreeSet::new();
        let mut nonces = BTreeSet::new();
        for _ in 0..400 {
            now += Duration::from_millis(rng.random_range(0..1_500));
            match rng.random_range(0..10) {
                0..=1 => hwm += rng.random_range(0..4),
                2..=4 => {
                    if let Reserve::Leased { offset, nonce, .. } = queue.reserve(now, Offset(hwm)) {
                        assert!(offset.0 < hwm, "only visible records are leased");
                        assert!(nonces.insert(nonce), "nonces are never reused");
                        delivered.insert(offset.0);
                        held.push((offset, nonce));
                    }
                }
                _ if held.is_empty() => {}
                choice => {
                    let (offset, nonce) = held.swap_remove(rng.random_range(0..held.len()));
                    let result = match choice {
                        5..=7 => queue.ack(now, offset, nonce).map(|_| true),
                        8 => queue.extend(now, offset, nonce).map(|()| false),
                        _ => queue.nack(now, offset, nonce).map(|()| false),
                    };
                    match result {
                        Ok(true) => assert!(acked.insert(offset.0), "acked twice"),
                        Ok(false) => held.push((offset, nonce)),
                        Err(HandleError::AckedAheadFull) => held.push((offset, nonce)),
                        Err(HandleError::Stale) => {}
                    }
                }
            }
            assert!((0..queue.cursor().0).all(|offset| acked.contains(&offset)));
            assert!(queue.leased() + queue.waiting_redelivery() <= in_flight_max as usize);
            assert!(queue.acked_ahead() <= acked_ahead_max as usize);
        }
        // Drain: a diligent consumer acks everything it is handed from now on.
        for (offset, nonce) in held.drain(..) {
            if queue.ack(now, offset, nonce) == Ok(queue.cursor()) {
                acked.insert(offset.0);
            }
        }
        loop {
            now += VIS;
            let mut progressed = false;
            while let Reserve::Leased { offset, nonce, .. } = queue.reserve(now, Offset(hwm)) {
                delivered.insert(offset.0);
                if queue.ack(now, offset, nonce).is_ok() {
                    acked.insert(offset.0);
                    progressed = true;
                }
            }
            if queue.cursor().0 == hwm || !progressed {
                break;
            }
        }
        assert_eq!(queue.cursor(), Offset(hwm), "seed {seed}: drained");
        assert!((0..hwm).all(|offset| delivered.contains(&offset)));
        assert!(acked.is_subset(&delivered));
    }
}

fn key(topic: u64, partition: u32) -> super::table::CursorKey {
    (TopicId(topic), PartitionId(partition))
}

#[test]
fn a_cursor_table_round_trips_and_every_flipped_bit_is_caught() {
    let table = CursorTable {
        seq: 9,
        cursors: BTreeMap::from([(key(3, 0), Offset(17)), (key(3, 1), Offset(0))]),
    };
    let bytes = table.encode();
    assert_eq!(CursorTable::decode(&bytes), Ok(table));
    for bit in 0..bytes.len() * 8 {
        let mut flipped = bytes.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        assert!(CursorTable::decode(&flipped).is_err(), "bit {bit}");
    }
    for len in 0..bytes.len() {
        assert!(CursorTable::decode(&bytes[..len]).is_err(), "cut at {len}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(CursorTable::decode(&longer).is_err());
}

#[test]
fn recovery_takes_the_newest_good_slot_and_writes_the_other() {
    let old = CursorTable {
        seq: 4,
        cursors: BTreeMap::from([(key(1, 0), Offset(3))]),
    };
    let new = CursorTable {
        seq: 5,
        cursors: BTreeMap::from([(key(1, 0), Offset(8))]),
    };
    let (old_bytes, new_bytes) = (old.encode(), new.encode());
    let both = CursorSlots::recover([Some(&old_bytes), Some(&new_bytes)]);
    assert_eq!((both.table.seq, both.next_slot), (5, 0));
    // The newest copy was torn: the older one stands, and its slot is not the one written next.
    let torn = &new_bytes[..new_bytes.len() - 3];
    let fallback = CursorSlots::recover([Some(&old_bytes), Some(torn)]);
    assert_eq!((fallback.table.clone(), fallback.next_slot), (old, 1));
    let none = CursorSlots::recover([None, Some(b"junk")]);
    assert_eq!((none.table.seq, none.table.cursors.len()), (0, 0));
}

#[test]
fn flushes_alternate_slots_only_after_success() {
    let mut slots = CursorSlots::recover([None, None]);
    let cursors = BTreeMap::from([(key(2, 1), Offset(5))]);
    let (table, ops) = slots.flush_ops(&cursors);
    assert_eq!(table.seq, 1);
    let paths: Vec<String> = ops
        .iter()
        .map(|op| match op {
            crate::disk::IoOp::WriteAt { path, .. }
            | crate::disk::IoOp::SetLen { path, .. }
            | crate::disk::IoOp::SyncData { path } => path.clone(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(paths, vec![super::table::SLOTS[0].to_string(); 3]);
    // A failed flush is not reported: the same slot is written again.
    let (again, _) = slots.flush_ops(&cursors);
    assert_eq!((again.seq, slots.next_slot), (1, 0));
    slots.flushed(again);
    assert_eq!(slots.next_slot, 1);
    assert_eq!(slots.flush_ops(&cursors).0.seq, 2);
}

#[test]
fn a_handed_off_queue_resumes_elsewhere_without_its_acked_records_and_with_its_leases_redelivered()
{
    let mut source = PartitionQueue::new(limits(8, 8), Offset(10), 0);
    let leases: Vec<(Offset, u64)> = (0..4)
        .map(|_| lease(source.reserve(ms(0), Offset(20))))
        .collect();
    // 11 and 13 acked ahead of the cursor (10, leased); 12 stays leased.
    source.ack(ms(1), leases[1].0, leases[1].1).unwrap();
    source.ack(ms(1), leases[3].0, leases[3].1).unwrap();
    let state = source.handoff();
    assert_eq!(state.cursor, Offset(10));
    assert_eq!(state.acked_ahead, vec![Offset(11), Offset(13)]);
    let mut destination = PartitionQueue::resume(limits(8, 8), &state, 500);
    let mut delivered = Vec::new();
    while let Reserve::Leased { offset, .. } = destination.reserve(ms(2), Offset(16)) {
        delivered.push(offset.0);
    }
    // The leases end early (10 and 12 come again), the acked never do, fresh ones follow.
    assert_eq!(delivered, vec![10, 12, 14, 15]);
    assert_eq!(destination.cursor(), Offset(10));
}
