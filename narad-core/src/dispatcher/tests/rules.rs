//! One test per dispatcher rule, on virtual time, asserting exact outputs.

use super::*;

fn read(from: u64, max_records: usize) -> ReadWal {
    ReadWal {
        from: Seq(from),
        max_records,
        max_bytes: READ_BYTES_MAX,
    }
}

// ----- the reader -----

#[test]
fn reads_each_durable_record_once_as_it_becomes_durable() {
    let mut h = Harness::with_topic(&[0, 0]);
    h.append(&[
        rec("t", Some(1), 0, None),
        rec("t", Some(1), 0, None),
        rec("t", Some(1), 1, None),
    ]);
    assert_eq!(h.reads, vec![read(0, 4096)]);
    let commits = h.take_commits();
    assert_eq!(commits.len(), 2);
    assert_eq!(
        (seqs(&commits[0]), commits[0].partition, commits[0].owner),
        (vec![0, 1], PartitionId(0), CommitOwner::Local)
    );
    assert_eq!(commits[0].topic_id, Some(TopicId(1)));
    assert_eq!(&*commits[0].topic, "t");
    assert!(commits[0].with_ids);
    assert_eq!(commits[0].deadline, Instant::ZERO + COMMIT_BUDGET);
    assert_eq!(seqs(&commits[1]), vec![2]);
    h.append_n(0, 2);
    assert_eq!(h.reads, vec![read(0, 4096), read(3, 4096)]);
    h.done(&commits[0]);
    h.done(&commits[1]);
    let next = h.take_commits();
    assert_eq!(next.len(), 1);
    assert_eq!(seqs(&next[0]), vec![3, 4]);
    h.done(&next[0]);
    assert_eq!(h.d.checkpoint(), Seq(5));
    assert_eq!(h.d.stats().records_read, 5);
    assert_eq!(h.d.stats().records_reread, 0);
}

#[test]
fn idle_backstop_reads_every_10ms_without_a_wakeup() {
    let mut h = Harness::with_topic(&[0]);
    // Durable in the WAL, but the dispatcher was never told.
    h.wal.push(rec("t", Some(1), 0, None).to_bytes());
    h.advance_to(just_before(at(10)));
    assert!(h.reads.is_empty());
    assert!(h.take().is_empty());
    h.advance_to(at(10));
    assert_eq!(h.reads, vec![read(0, 4096)]);
    assert_eq!(seqs(&h.take_commits()[0]), vec![0]);
    h.advance_to(at(20));
    assert_eq!(h.reads, vec![read(0, 4096), read(1, 4096)]);
}

#[test]
fn undecodable_record_stops_the_reader_in_front_of_it() {
    let mut h = Harness::with_topic(&[0]);
    h.append(&[rec("t", Some(1), 0, None)]);
    let mut bad = rec("t", Some(1), 0, None).to_bytes();
    bad[0] = 9;
    h.wal.push(bad);
    h.append(&[rec("t", Some(1), 0, None)]);
    let outputs = h.take();
    assert_eq!(
        outputs[1..],
        [DispatcherOutput::Warn(DispatchWarning::UndecodableRecord {
            seq: Seq(1),
            error: crate::codec::DecodeError::UnknownFormat(9),
        })]
    );
    let DispatcherOutput::SendCommit(commit) = &outputs[0] else {
        panic!("{outputs:?}")
    };
    assert_eq!(seqs(commit), vec![0]);
    h.done(commit);
    assert_eq!(
        (h.d.checkpoint(), h.d.read_frontier(), h.d.stalled_at()),
        (Seq(1), Seq(1), Some(Seq(1)))
    );
    // Tried again once a second, warned once.
    h.advance_to(at(2500));
    assert_eq!(h.d.read_frontier(), Seq(1));
    assert!(h.take().is_empty());
}

// ----- one commit per destination, the fan-out, order -----

#[test]
fn one_commit_in_flight_per_destination_and_its_queue_goes_next() {
    let mut h = Harness::with_topic(&[0]);
    h.append_n(0, 2);
    let first = h.take_commits();
    assert_eq!(seqs(&first[0]), vec![0, 1]);
    h.append_n(0, 3);
    assert!(h.take().is_empty(), "one commit in flight per destination");
    h.done(&first[0]);
    let second = h.take_commits();
    assert_eq!(second.len(), 1);
    assert_eq!(seqs(&second[0]), vec![2, 3, 4]);
}

#[test]
fn at_most_16_commits_in_flight() {
    let mut h = Harness::with_topic(&[0; 20]);
    let records: Vec<_> = (0..20).map(|p| rec("t", Some(1), p, None)).collect();
    h.append(&records);
    let commits = h.take_commits();
    assert_eq!(
        commits.iter().map(|c| c.partition.0).collect::<Vec<_>>(),
        (0..16).collect::<Vec<_>>()
    );
    assert_eq!(h.d.commits_in_flight(), 16);
    h.done(&commits[3]);
    let next = h.take_commits();
    assert_eq!(
        next.iter().map(|c| c.partition.0).collect::<Vec<_>>(),
        vec![16]
    );
}

#[test]
fn records_of_a_batch_sharing_a_key_reach_their_partition_in_batch_order() {
    let mut h = Harness::with_topic(&[0, 0, 0]);
    let key = "customer-42"; // partition 1 of 3
    let batch: Vec<_> = (0..6)
        .map(|i| {
            if i % 2 == 0 {
                rec("t", Some(1), 1, Some(key))
            } else {
                rec("t", Some(1), 0, Some("x"))
            }
        })
        .collect();
    h.append(&batch[..1]);
    h.append(&batch[1..]);
    let mut order = Vec::new();
    for _ in 0..4 {
        for commit in h.take_commits() {
            if commit.partition == PartitionId(1) {
                order.extend(seqs(&commit));
            }
            h.done(&commit);
        }
    }
    assert_eq!(order, vec![0, 2, 4]);
}

// ----- the window -----

#[test]
fn window_is_64_records_per_destination_seen_clamped_to_4096_and_65536() {
    let mut h = Harness::with_topic(&[0; 2000]);
    assert_eq!(
        (
            h.d.window_records(),
            h.d.destination_queue_cap(),
            h.d.held_limit_records()
        ),
        (4096, 4096, 16384)
    );
    let seen = |h: &mut Harness, partitions: u32| {
        let records: Vec<_> = (0..partitions)
            .map(|p| rec("t", Some(1), p, None))
            .collect();
        h.append(&records);
        while !h.outputs.is_empty() {
            for commit in h.take_commits() {
                h.done(&commit);
            }
        }
    };
    seen(&mut h, 100);
    assert_eq!(
        (h.d.window_records(), h.d.destination_queue_cap()),
        (6400, 4096)
    );
    seen(&mut h, 1024);
    assert_eq!(
        (
            h.d.window_records(),
            h.d.destination_queue_cap(),
            h.d.held_limit_records()
        ),
        (65536, 16384, 65536)
    );
    seen(&mut h, 2000);
    assert_eq!(h.d.window_records(), 65536);
    assert_eq!(h.d.lookahead_end(), Seq(h.d.checkpoint().0 + 16 * 65536));
}

#[test]
fn reader_stops_once_held_records_reach_the_window_but_at_least_four_destinations_worth() {
    let mut h = Harness::with_topic(&[0; 8]);
    let records: Vec<_> = (0..24_000u32)
        .map(|i| rec("t", Some(1), i % 8, None))
        .collect();
    h.append(&records);
    // Window 4,096 (8 destinations), queue cap 4,096: the reader stops at 4 × 4,096 held.
    assert_eq!(
        h.reads,
        vec![
            read(0, 4096),
            read(4096, 4096),
            read(8192, 4096),
            read(12288, 4096)
        ]
    );
    assert_eq!(
        (
            h.d.held_records(),
            h.d.read_frontier(),
            h.d.skipped_records()
        ),
        (16384, Seq(16384), 0)
    );
    let commits = h.take_commits();
    assert_eq!(commits.len(), 8);
    h.advance(ms(50)); // The backstop finds no room.
    assert_eq!(h.reads.len(), 4);
    h.done(&commits[0]); // 512 records of partition 0 land.
    assert_eq!(h.reads[4], read(16384, 512));
    assert_eq!(h.d.held_records(), 16384);
}

#[test]
fn reader_never_reads_more_than_16_windows_past_the_checkpoint() {
    let mut h = Harness::with_topic(&[0, 0]);
    h.append_n(0, 1);
    let stuck = h.take_commits().remove(0);
    h.append_n(1, 70_000);
    loop {
        let commits = h.take_commits();
        if commits.is_empty() {
            break;
        }
        for commit in commits {
            h.done(&commit);
        }
    }
    assert_eq!(
        (h.d.checkpoint(), h.d.read_frontier()),
        (Seq(0), Seq(16 * 4096))
    );
    let reads = h.reads.len();
    h.advance(ms(30));
    assert_eq!(h.reads.len(), reads, "no read past the lookahead");
    h.done(&stuck);
    assert_eq!(h.d.checkpoint(), Seq(16 * 4096));
    assert_eq!(h.reads[reads], read(16 * 4096, 4096));
}

// ----- linger -----

/// Measures the local owner at `latency` (one commit), then leaves a commit to partition 0 in flight.
fn measured(latency: Duration) -> Harness {
    let mut h = Harness::with_topic(&[0, 0, 1]);
    h.append_n(0, 1);
    let first = h.take_commits().remove(0);
    h.advance(latency);
    h.done(&first);
    assert_eq!(h.d.owner_latency(CommitOwner::Local), Some(latency));
    h.append_n(0, 1);
    assert_eq!(
        h.take_commits().len(),
        1,
        "an idle dispatcher commits at once"
    );
    h
}

#[test]
fn linger_ends_at_twice_the_owners_moving_average_latency() {
    let mut h = measured(ms(4));
    h.advance_to(at(10));
    h.append_n(1, 1);
    h.advance_to(just_before(at(18)));
    assert!(
        h.take().is_empty(),
        "lingers while another commit is in flight"
    );
    h.advance_to(at(18));
    let commits = h.take_commits();
    assert_eq!((commits.len(), commits[0].partition), (1, PartitionId(1)));
}

#[test]
fn linger_is_capped_at_50ms() {
    let mut h = measured(ms(40));
    h.advance_to(at(45));
    h.append_n(1, 1);
    h.advance_to(just_before(at(95)));
    assert!(h.take().is_empty());
    h.advance_to(at(95));
    assert_eq!(h.take_commits().len(), 1);
}

#[test]
fn a_destination_with_64_records_does_not_linger() {
    let mut h = measured(ms(4));
    h.advance_to(at(10));
    h.append_n(1, 64);
    let commits = h.take_commits();
    assert_eq!(commits.len(), 1);
    assert_eq!(commits[0].records.len(), 64);
}

#[test]
fn an_unmeasured_owner_commits_at_once() {
    let mut h = measured(ms(4));
    h.advance_to(at(10));
    h.append_n(2, 1); // owned by node 1, never measured
    let commits = h.take_commits();
    assert_eq!(
        (commits.len(), commits[0].owner),
        (1, CommitOwner::Remote(NodeId(1)))
    );
}

#[test]
fn the_moving_average_weighs_a_new_sample_one_eighth() {
    let mut h = measured(ms(8));
    // The commit in flight was sent at 8 ms; it lands at 24 ms: a 16 ms sample.
    h.advance(ms(16));
    h.input(DispatcherInput::CommitDone {
        commit_id: CommitId(1),
    });
    assert_eq!(h.d.owner_latency(CommitOwner::Local), Some(ms(9)));
}

// ----- the byte budget -----

fn big(partition: u32, payload_bytes: usize) -> crate::codec::wal::ProduceRecord {
    let mut record = rec("t", Some(1), partition, None);
    record.payload = vec![7; payload_bytes];
    record
}

#[test]
fn remote_byte_budget_splits_a_batch_at_8_mib() {
    let mut h = Harness::with_topic(&[1, 0]);
    h.append_n(0, 1);
    let first = h.take_commits().remove(0);
    let two_mib = 2 * 1024 * 1024;
    let records: Vec<_> = (0..7).map(|_| big(0, two_mib)).collect();
    assert!(4 * records[0].encoded_len() > REMOTE_COMMIT_BYTES_MAX);
    assert!(3 * records[0].encoded_len() <= REMOTE_COMMIT_BYTES_MAX);
    h.append(&records); // queued behind the first commit
    h.done(&first);
    let mut sizes = Vec::new();
    for _ in 0..3 {
        let commit = h.take_commits().remove(0);
        sizes.push(seqs(&commit));
        h.done(&commit);
    }
    assert_eq!(sizes, vec![vec![1, 2, 3], vec![4, 5, 6], vec![7]]);
}

#[test]
fn a_record_over_the_budget_still_goes_alone() {
    let mut h = Harness::with_topic(&[1]);
    h.append_n(0, 1);
    let first = h.take_commits().remove(0);
    h.append(&[big(0, REMOTE_COMMIT_BYTES_MAX), big(0, 10)]);
    h.done(&first);
    let second = h.take_commits().remove(0);
    assert_eq!(seqs(&second), vec![1]);
    h.done(&second);
    assert_eq!(seqs(&h.take_commits()[0]), vec![2]);
}

#[test]
fn local_commits_have_no_byte_budget() {
    let mut h = Harness::with_topic(&[0]);
    h.append_n(0, 1);
    let first = h.take_commits().remove(0);
    let records: Vec<_> = (0..7).map(|_| big(0, 2 * 1024 * 1024)).collect();
    h.append(&records);
    h.done(&first);
    let commits = h.take_commits();
    assert_eq!(seqs(&commits[0]), (1..8).collect::<Vec<_>>());
}

#[test]
fn a_read_asks_for_at_most_1_mib_but_always_one_record() {
    let mut h = Harness::with_topic(&[0]);
    h.append(&[
        big(0, 700 * 1024),
        big(0, 700 * 1024),
        big(0, 2 * 1024 * 1024),
    ]);
    assert_eq!(h.reads, vec![read(0, 4096), read(1, 4096), read(2, 4096)]);
    assert_eq!(READ_BYTES_MAX, 1024 * 1024);
}

#[test]
fn a_commit_never_mixes_incarnations() {
    let mut h = Harness::with_topic(&[0]);
    h.topic("t", None, &[0]); // a topic from before ids
    h.outputs.clear();
    h.append(&[rec("t", None, 0, None), rec("t", None, 0, None)]);
    h.topic("t", Some(1), &[0]); // (not possible in practice; exercises the split)
    let first = h.take_commits().remove(0);
    h.append(&[rec("t", Some(1), 0, None), rec("t", None, 0, None)]);
    h.done(&first);
    let second = h.take_commits().remove(0);
    assert_eq!(
        (seqs(&second), second.topic_id),
        (vec![2], Some(TopicId(1)))
    );
    h.done(&second);
    let third = h.take_commits().remove(0);
    assert_eq!((seqs(&third), third.topic_id), (vec![3], None));
}

// ----- hung commits -----

#[test]
fn hung_commit_stops_counting_against_the_fan_out_at_1s() {
    let mut h = Harness::with_topic(&[0; 17]);
    let records: Vec<_> = (0..17).map(|p| rec("t", Some(1), p, None)).collect();
    h.append(&records);
    assert_eq!(h.take_commits().len(), 16);
    h.advance_to(just_before(at(1000)));
    assert!(h.take().is_empty());
    h.advance_to(at(1000));
    let freed = h.take_commits();
    assert_eq!(
        freed.iter().map(|c| c.partition.0).collect::<Vec<_>>(),
        vec![16]
    );
    assert_eq!((h.d.commits_in_flight(), h.d.hung_commits()), (1, 16));
    assert_eq!(
        h.d.held_counted_records(),
        1,
        "hung commits do not count against the window"
    );
}

#[test]
fn hung_commit_returns_its_queue_to_the_wal_and_takes_nothing_until_it_lands() {
    let mut h = Harness::with_topic(&[1]);
    h.append_n(0, 1);
    let hung = h.take_commits().remove(0);
    h.advance_to(at(500));
    h.append_n(0, 2); // queued behind it
    assert_eq!((h.d.held_records(), h.d.skipped_records()), (3, 0));
    h.advance_to(at(1000));
    assert_eq!((h.d.held_records(), h.d.skipped_records()), (1, 2));
    h.advance_to(at(1200));
    h.append_n(0, 1); // takes nothing new
    assert_eq!((h.d.held_records(), h.d.skipped_records()), (1, 3));
    h.advance_to(at(5000));
    assert!(h.take().is_empty());
    h.done(&hung);
    let next = h.take_commits();
    assert_eq!(
        seqs(&next[0]),
        vec![1, 2, 3],
        "its skipped records come back in WAL order"
    );
    assert_eq!(next[0].deadline, at(5000) + COMMIT_BUDGET);
}

// ----- failure, probe, reroute -----

#[test]
fn failed_commit_keeps_one_probe_retried_at_plus_1s_on_a_5s_budget() {
    let mut h = Harness::with_topic(&[1]);
    h.append_n(0, 3);
    let first = h.take_commits().remove(0);
    h.advance_to(at(100));
    h.error(&first);
    assert_eq!((h.d.held_records(), h.d.skipped_records()), (1, 2));
    h.advance_to(just_before(at(1100)));
    assert!(h.take().is_empty());
    h.advance_to(at(1100));
    let probe = h.take_commits().remove(0);
    assert_eq!(
        (seqs(&probe), probe.deadline),
        (vec![0], at(1100) + PROBE_BUDGET)
    );
    h.advance_to(at(1200));
    h.fail(&probe, CommitFailure::Timeout);
    h.advance_to(just_before(at(2200)));
    assert!(h.take().is_empty());
    h.advance_to(at(2200));
    let probe = h.take_commits().remove(0);
    assert_eq!(seqs(&probe), vec![0]);
    h.advance_to(at(2300));
    h.done(&probe);
    let back = h.take_commits().remove(0);
    assert_eq!(
        (seqs(&back), back.deadline),
        (vec![1, 2], at(2300) + COMMIT_BUDGET)
    );
}

#[test]
fn a_failing_destination_waits_alone() {
    let mut h = Harness::with_topic(&[1, 2]);
    h.append_n(0, 1);
    let failing = h.take_commits().remove(0);
    h.error(&failing);
    h.advance_to(at(300));
    h.append(&[rec("t", Some(1), 0, None), rec("t", Some(1), 1, None)]);
    let commits = h.take_commits();
    assert_eq!(commits.len(), 1);
    assert_eq!(
        (commits[0].partition, seqs(&commits[0])),
        (PartitionId(1), vec![2])
    );
    assert!(
        !h.d.is_backing_off(h.now),
        "a commit failure never backs off the dispatcher"
    );
}

#[test]
fn reroute_happens_3s_after_the_start_of_the_first_failed_attempt() {
    let mut h = Harness::with_topic(&[1, 2]);
    h.append_n(0, 1); // attempt starts at 0
    let first = h.take_commits().remove(0);
    h.advance_to(at(500));
    h.error(&first); // fails at 0.5 s: the grace still counts from 0
    h.advance_to(at(600));
    h.append_n(0, 1); // skipped: the destination holds its probe
    assert_eq!(h.d.skipped_records(), 1);
    h.advance_to(at(1500));
    let probe = h.take_commits().remove(0);
    h.advance_to(at(1600));
    h.error(&probe);
    h.advance_to(at(2600));
    let probe = h.take_commits().remove(0); // in flight across the grace
    assert_eq!(seqs(&probe), vec![0]);
    h.advance_to(just_before(at(3000)));
    assert!(h.take().is_empty());
    h.advance_to(at(3000));
    let rerouted = h.take_commits();
    assert_eq!(rerouted.len(), 1);
    assert_eq!(
        (rerouted[0].partition, rerouted[0].owner, seqs(&rerouted[0])),
        (PartitionId(1), CommitOwner::Remote(NodeId(2)), vec![1])
    );
    assert_eq!(h.d.stats().rerouted_records, 1);
    // New records of partition 0 go to the sibling too, while the probe keeps trying the original.
    h.done(&rerouted[0]);
    h.append_n(0, 1);
    let sibling = h.take_commits().remove(0);
    assert_eq!(sibling.partition, PartitionId(1));
    h.done(&sibling);
    h.advance_to(at(3100));
    h.done(&probe); // the original recovered: it gets its records back
    h.append_n(0, 1);
    let home = h.take_commits();
    assert_eq!(
        (home[0].partition, seqs(&home[0])),
        (PartitionId(0), vec![3])
    );
}

#[test]
fn a_dead_owner_reroutes_at_once() {
    let mut h = Harness::with_topic(&[1, 2]);
    h.append_n(0, 1);
    let in_flight = h.take_commits().remove(0);
    h.append_n(0, 2); // queued behind it
    h.member(1, false);
    let rerouted = h.take_commits();
    assert_eq!(rerouted.len(), 1, "the commit in flight is not resent");
    assert_eq!(
        (rerouted[0].partition, seqs(&rerouted[0])),
        (PartitionId(1), vec![1, 2])
    );
    h.done(&rerouted[0]);
    h.append_n(0, 1);
    assert_eq!(h.take_commits()[0].partition, PartitionId(1));
    // The commit in flight fails: its records are never resent elsewhere while in flight; the probe
    // keeps trying the original.
    h.error(&in_flight);
    h.advance(ms(1000));
    let probe = h.take_commits();
    assert_eq!(
        (probe[0].partition, seqs(&probe[0])),
        (PartitionId(0), vec![0])
    );
}

#[test]
fn reroute_takes_the_next_partition_up_wrapping_whose_owner_is_alive_and_not_failing_or_hung() {
    // Partitions: 0 → node 1 (dead), 1 → node 2 (dead), 2 → node 3 (failing), 3 → node 4 (hung),
    // 4 → node 5: records of 0 go to 4; records of 4's node dying then go from 4 around to 0? No:
    // 0 is dead too; they skip to... every other is blocked, so they stay in the WAL.
    let mut h = Harness::with_topic(&[1, 2, 3, 4, 5]);
    h.append(&[rec("t", Some(1), 2, None), rec("t", Some(1), 3, None)]);
    let commits = h.take_commits();
    h.error(&commits[0]); // partition 2 failing
    h.advance_to(at(1000)); // partition 3 hung
    let probe = h.take_commits(); // 2's probe
    assert_eq!(probe[0].partition, PartitionId(2));
    h.member(1, false);
    h.member(2, false);
    h.append_n(0, 1);
    let rerouted = h.take_commits();
    assert_eq!(
        (rerouted[0].partition, seqs(&rerouted[0])),
        (PartitionId(4), vec![2])
    );
    h.done(&rerouted[0]);
    h.member(5, false);
    h.append_n(0, 1);
    assert!(
        h.take().is_empty(),
        "no live, healthy sibling: the record stays in the WAL"
    );
    assert_eq!(h.d.skipped_records(), 1);
    h.member(2, true); // partition 1 comes back, after 0 counting up
    let back = h.take_commits();
    assert_eq!(
        (back[0].partition, seqs(&back[0])),
        (PartitionId(1), vec![3])
    );
}

#[test]
fn an_owner_that_does_not_resolve_is_looked_up_again_every_10ms() {
    let mut h = Harness::new();
    h.input(DispatcherInput::Topic {
        name: "t".into(),
        view: Some(TopicView {
            topic_id: Some(TopicId(1)),
            owners: vec![None],
        }),
    });
    h.append_n(0, 1);
    assert!(h.take().is_empty());
    h.advance_to(at(3));
    h.topic("t", Some(1), &[0]); // assigned at 3 ms
    assert!(h.take().is_empty());
    h.advance_to(just_before(at(10)));
    assert!(h.take().is_empty());
    h.advance_to(at(10));
    assert_eq!(seqs(&h.take_commits()[0]), vec![0]);
}

// ----- skipped records and rescans -----

#[test]
fn skipped_records_come_back_in_wal_order_when_their_destination_drains() {
    let mut h = Harness::with_topic(&[1, 2]);
    h.append_n(0, 1);
    let first = h.take_commits().remove(0);
    // Fill partition 0's queue (4,096), then more: skipped. Partition 1's records pass.
    h.append_n(0, 4096 + 100);
    h.append(&[rec("t", Some(1), 1, None)]);
    h.append_n(0, 5);
    assert_eq!(h.d.skipped_records(), 105);
    assert_eq!(h.take_commits()[0].partition, PartitionId(1));
    h.done(&first);
    let second = h.take_commits().remove(0);
    assert_eq!(seqs(&second), (1..=4096).collect::<Vec<_>>());
    // The drained queue took the skipped records back, in WAL order, behind the batch in flight.
    assert_eq!(h.d.skipped_records(), 0);
    h.done(&second);
    let third = h.take_commits().remove(0);
    let mut expected: Vec<u64> = (4097..4197).collect();
    expected.extend(4198..4203);
    assert_eq!(seqs(&third), expected);
}

#[test]
fn a_rescan_stops_once_every_partition_it_could_place_for_is_blocked_again() {
    let mut h = Harness::with_topic(&[1]);
    h.append_n(0, 1);
    let first = h.take_commits().remove(0);
    h.append_n(0, 4096 + 10_000); // 10,000 skipped behind a full queue
    assert_eq!(h.d.skipped_records(), 10_000);
    let reads_before = h.reads.len();
    h.done(&first); // the queue leaves: one rescan read refills it, then it is full again
    let rescans: Vec<_> = h.reads[reads_before..]
        .iter()
        .filter(|r| r.from < h.d.read_frontier())
        .collect();
    assert_eq!(rescans, vec![&read(4097, 4096)]);
    assert_eq!(h.d.skipped_records(), 10_000 - 4096);
    assert_eq!(h.d.stats().records_reread, 4096);
}

#[test]
fn a_rescan_passes_over_records_that_need_no_work_without_decoding_them() {
    let mut h = Harness::with_topic(&[1, 2]);
    h.append(&[rec("t", Some(1), 0, None), rec("t", Some(1), 1, None)]);
    let commits = h.take_commits();
    h.error(&commits[0]); // partition 0 failing: its records are skipped
    h.advance(ms(1500)); // probe in flight, not answered
    let _probe = h.take_commits();
    // Partition 1 hung with records skipped behind it.
    let records: Vec<_> = (0..20).map(|i| rec("t", Some(1), i % 2, None)).collect();
    h.append(&records);
    assert_eq!(h.d.skipped_records(), 20);
    h.done(&commits[1]); // partition 1 recovers: only its 10 records are decoded again
    assert_eq!(h.d.stats().records_reread, 10);
    assert_eq!(h.d.skipped_records(), 10);
}

#[test]
fn a_rescan_runs_at_least_once_a_second() {
    let mut h = Harness::with_topic(&[1]);
    h.append_n(0, 2);
    let first = h.take_commits().remove(0);
    h.advance_to(at(300));
    h.fail(&first, CommitFailure::IncarnationMismatch);
    h.take();
    h.advance_to(just_before(at(1000)));
    assert!(h.take().is_empty());
    h.advance_to(at(1000));
    let again = h.take_commits();
    assert_eq!(seqs(&again[0]), vec![0, 1]);
}

// ----- the checkpoint -----

#[test]
fn checkpoint_never_passes_a_held_or_skipped_seq() {
    let mut h = Harness::with_topic(&[1, 2]);
    h.append(&[rec("t", Some(1), 0, None), rec("t", Some(1), 1, None)]);
    let commits = h.take_commits();
    h.done(&commits[1]);
    assert_eq!(
        (h.d.checkpoint(), h.stores.clone()),
        (Seq(0), vec![]),
        "seq 0 is held"
    );
    h.error(&commits[0]); // seq 0 becomes the probe
    h.append(&[rec("t", Some(1), 0, None), rec("t", Some(1), 1, None)]); // seq 2 skipped
    let p1 = h.take_commits().remove(0);
    h.done(&p1);
    assert_eq!(h.d.checkpoint(), Seq(0));
    h.advance(ms(1000));
    let probe = h.take_commits().remove(0);
    h.done(&probe);
    assert_eq!(
        h.d.checkpoint(),
        Seq(2),
        "seq 2 is held again, no longer skipped, not done"
    );
    let back = h.take_commits().remove(0);
    h.done(&back);
    assert_eq!(h.d.checkpoint(), Seq(4));
    assert_eq!(h.stores, vec![Seq(2), Seq(4)]);
}

#[test]
fn a_failed_checkpoint_store_backs_off_the_whole_dispatcher_for_1s() {
    let mut h = Harness::with_topic(&[0]);
    h.auto_store = false;
    h.append_n(0, 1);
    let commit = h.take_commits().remove(0);
    h.done(&commit);
    assert_eq!(
        h.take(),
        vec![DispatcherOutput::StoreCheckpoint { seq: Seq(1) }]
    );
    h.advance_to(at(100));
    h.input(DispatcherInput::CheckpointStoreFailed {
        seq: Seq(1),
        fault: crate::IoFault::Eio,
    });
    let reads = h.reads.len();
    h.append_n(0, 1);
    assert_eq!(h.reads.len(), reads, "no read while backing off");
    h.advance_to(just_before(at(1100)));
    assert_eq!(h.reads.len(), reads);
    assert!(h.take().is_empty());
    h.advance_to(at(1100));
    let outputs = h.take();
    assert_eq!(
        outputs[0],
        DispatcherOutput::StoreCheckpoint { seq: Seq(1) }
    );
    assert_eq!(h.reads[reads], read(1, 4096));
}

#[test]
fn a_failed_wal_read_backs_off_for_1s() {
    let mut h = Harness::with_topic(&[0]);
    h.auto_read = false;
    h.append_n(0, 1);
    assert_eq!(h.take(), vec![DispatcherOutput::ReadWal(read(0, 4096))]);
    h.input(DispatcherInput::WalReadFailed {
        fault: crate::IoFault::Eio,
    });
    assert_eq!(h.d.last_fault(), Some(&crate::IoFault::Eio));
    h.advance_to(just_before(at(1000)));
    assert!(h.take().is_empty());
    h.advance_to(at(1000));
    assert_eq!(h.take(), vec![DispatcherOutput::ReadWal(read(0, 4096))]);
}

#[test]
fn backlog_is_the_durable_next_seq_minus_the_stored_checkpoint() {
    let mut h = Harness::with_topic(&[0]);
    h.auto_store = false;
    h.append_n(0, 3);
    assert_eq!(h.d.backlog_records(), 3);
    assert_eq!(
        h.d.backlog_bytes_read(),
        3 * rec("t", Some(1), 0, None).encoded_len() as u64
    );
    assert_eq!(h.d.oldest_undispatched_accept_ms(), Some(1_700_000_000_000));
    let commit = h.take_commits().remove(0);
    h.done(&commit);
    assert_eq!(
        (h.d.checkpoint(), h.d.backlog_records()),
        (Seq(3), 3),
        "not stored yet"
    );
    assert_eq!(
        h.take(),
        vec![DispatcherOutput::StoreCheckpoint { seq: Seq(3) }]
    );
    h.input(DispatcherInput::CheckpointStored { seq: Seq(3) });
    assert_eq!((h.d.backlog_records(), h.d.backlog_bytes_read()), (0, 0));
    assert_eq!(h.d.oldest_undispatched_accept_ms(), None);
}

// ----- incarnations, deleted topics, legacy owners -----

fn warnings(outputs: &[DispatcherOutput]) -> Vec<DispatchWarning> {
    outputs
        .iter()
        .filter_map(|output| match output {
            DispatcherOutput::Warn(warning) => Some(warning.clone()),
            _ => None,
        })
        .collect()
}

fn confirm(topic: &str) -> DispatcherOutput {
    DispatcherOutput::ConfirmTopicGone {
        topic: topic.to_string(),
    }
}

fn answer(h: &mut Harness, topic: &str, view: LeaderView) {
    h.input(DispatcherInput::TopicGoneAnswer {
        topic: topic.to_string(),
        view,
    });
}

fn delete(h: &mut Harness, topic: &str) {
    h.input(DispatcherInput::Topic {
        name: topic.to_string(),
        view: None,
    });
}

#[test]
fn a_412_returns_the_records_and_their_queue_to_the_wal_without_failing() {
    let mut h = Harness::with_topic(&[1, 2]);
    h.append_n(0, 2);
    let first = h.take_commits().remove(0);
    h.append_n(0, 1); // queued behind it
    h.advance_to(at(200));
    h.fail(&first, CommitFailure::IncarnationMismatch);
    let outputs = h.take();
    assert_eq!(
        outputs,
        vec![DispatcherOutput::Warn(
            DispatchWarning::IncarnationRefused {
                topic: "t".into(),
                topic_id: Some(TopicId(1)),
                partition: PartitionId(0),
                owner: CommitOwner::Remote(NodeId(1)),
                records: 3,
            }
        )]
    );
    assert_eq!(warnings(&outputs)[0].message(), WARN_INCARNATION_REFUSED);
    assert_eq!((h.d.held_records(), h.d.skipped_records()), (0, 3));
    assert_eq!(h.d.stats().commits_failed, 0);
    // Not failing, no reroute: at the next rescan the records go to the same partition, no probe.
    h.advance_to(at(1000));
    let again = h.take_commits();
    assert_eq!(again.len(), 1);
    assert_eq!(
        (again[0].partition, seqs(&again[0])),
        (PartitionId(0), vec![0, 1, 2])
    );
    assert_eq!(h.d.stats().rerouted_records, 0);
}

#[test]
fn a_deleted_topic_record_is_discarded_only_after_the_leader_confirms() {
    let mut h = Harness::with_topic(&[0]);
    delete(&mut h, "t");
    h.append_n(0, 2);
    assert_eq!(
        h.take(),
        vec![confirm("t")],
        "one question for the topic, for both records"
    );
    assert_eq!((h.d.checkpoint(), h.d.skipped_records()), (Seq(0), 2));
    h.advance_to(at(5));
    answer(&mut h, "t", LeaderView::Absent);
    assert_eq!(
        h.take(),
        (0..2)
            .map(
                |seq| DispatcherOutput::Warn(DispatchWarning::DiscardedForDeletedTopic {
                    topic: "t".into(),
                    topic_id: Some(TopicId(1)),
                    partition: PartitionId(0),
                    seq: Seq(seq),
                })
            )
            .collect::<Vec<_>>()
    );
    assert_eq!(h.d.checkpoint(), Seq(2));
    assert_eq!(h.d.stats().discarded_records, 2);
    assert_eq!(
        DispatchWarning::DiscardedForDeletedTopic {
            topic: "t".into(),
            topic_id: None,
            partition: PartitionId(0),
            seq: Seq(0)
        }
        .message(),
        "discarding undispatched record for deleted topic"
    );
    // The confirmed incarnation is remembered: no question for its later records.
    h.append_n(0, 1);
    assert_eq!(warnings(&h.take()).len(), 1);
}

#[test]
fn confirmation_is_asked_once_per_topic_per_read_and_an_unconfirmed_answer_is_remembered_1s() {
    let mut h = Harness::with_topic(&[0]);
    h.topic("u", Some(5), &[0]);
    delete(&mut h, "t");
    delete(&mut h, "u");
    h.outputs.clear();
    let records: Vec<_> = (0..6)
        .map(|i| {
            if i % 2 == 0 {
                rec("t", Some(1), 0, None)
            } else {
                rec("u", Some(5), 0, None)
            }
        })
        .collect();
    h.append(&records);
    assert_eq!(h.take(), vec![confirm("t"), confirm("u")]);
    h.advance_to(at(100));
    answer(&mut h, "t", LeaderView::Unconfirmed);
    answer(
        &mut h,
        "u",
        LeaderView::Present {
            topic_id: Some(TopicId(5)),
        },
    ); // the replica lags
    assert!(h.take().is_empty(), "nothing is discarded unconfirmed");
    h.advance_to(at(600));
    h.append_n(0, 1);
    assert!(
        h.take().is_empty(),
        "an unconfirmed answer is remembered for a second"
    );
    h.advance_to(just_before(at(1100)));
    assert!(h.take().is_empty());
    h.advance_to(at(1100));
    assert_eq!(h.take(), vec![confirm("t"), confirm("u")]);
    answer(&mut h, "t", LeaderView::Absent);
    let discarded = warnings(&h.take());
    assert_eq!(discarded.len(), 4);
    assert_eq!(h.d.skipped_records(), 3);
}

#[test]
fn a_stale_incarnation_is_discarded_after_confirmation_and_remembered() {
    let mut h = Harness::with_topic(&[0, 0]);
    h.topic("t", Some(2), &[0, 0]); // deleted and recreated
    h.outputs.clear();
    h.append(&[
        rec("t", Some(1), 0, None),
        rec("t", Some(2), 1, None),
        rec("t", Some(1), 1, None),
    ]);
    let outputs = h.take();
    assert_eq!(outputs[0], confirm("t"));
    let DispatcherOutput::SendCommit(live) = &outputs[1] else {
        panic!("{outputs:?}")
    };
    assert_eq!(
        (seqs(live), live.topic_id),
        (vec![1], Some(TopicId(2))),
        "the live incarnation commits"
    );
    assert_eq!(outputs.len(), 2);
    answer(
        &mut h,
        "t",
        LeaderView::Present {
            topic_id: Some(TopicId(2)),
        },
    );
    let stale = |seq: u64, partition: u32| {
        DispatcherOutput::Warn(DispatchWarning::DiscardedStaleIncarnation {
            topic: "t".into(),
            topic_id: TopicId(1),
            partition: PartitionId(partition),
            seq: Seq(seq),
        })
    };
    assert_eq!(h.take(), vec![stale(0, 0), stale(2, 1)]);
    assert_eq!(
        warnings(&[stale(0, 0)])[0].message(),
        WARN_DISCARD_STALE_INCARNATION
    );
    h.append(&[rec("t", Some(1), 0, None)]);
    assert_eq!(
        h.take(),
        vec![stale(3, 0)],
        "the confirmed id is remembered: no new question"
    );
}

#[test]
fn the_incarnation_is_checked_again_just_before_a_batch_leaves() {
    let mut h = Harness::with_topic(&[0, 0]);
    h.append_n(0, 1);
    let first = h.take_commits().remove(0);
    h.append_n(0, 2); // queued under incarnation 1
    h.topic("t", Some(2), &[0, 0]); // recreated meanwhile
    h.done(&first);
    assert_eq!(
        h.take(),
        vec![confirm("t")],
        "they go back to the WAL to wait for the leader"
    );
    assert_eq!((h.d.held_records(), h.d.skipped_records()), (0, 2));
    answer(
        &mut h,
        "t",
        LeaderView::Present {
            topic_id: Some(TopicId(2)),
        },
    );
    assert_eq!(warnings(&h.take()).len(), 2);
    assert_eq!(h.d.checkpoint(), Seq(3));
}

#[test]
fn a_queue_of_a_confirmed_deleted_incarnation_is_discarded_with_one_warning_before_it_leaves() {
    let mut h = Harness::with_topic(&[0, 0]);
    h.append_n(0, 1);
    let first = h.take_commits().remove(0);
    h.append_n(0, 3); // queued under incarnation 1
    h.topic("t", Some(2), &[0, 0]);
    h.append(&[rec("t", Some(1), 1, None)]);
    assert_eq!(h.take(), vec![confirm("t")]);
    answer(
        &mut h,
        "t",
        LeaderView::Present {
            topic_id: Some(TopicId(2)),
        },
    );
    assert_eq!(warnings(&h.take()).len(), 1); // seq 4, placed
    h.done(&first);
    assert_eq!(
        h.take(),
        vec![DispatcherOutput::Warn(
            DispatchWarning::DiscardedQueueForDeletedTopic {
                topic: "t".into(),
                topic_id: Some(TopicId(1)),
                partition: PartitionId(0),
                records: 3,
            }
        )]
    );
    assert_eq!(
        warnings(&[DispatcherOutput::Warn(
            DispatchWarning::DiscardedQueueForDeletedTopic {
                topic: "t".into(),
                topic_id: None,
                partition: PartitionId(0),
                records: 3,
            }
        )])[0]
            .message(),
        "discarding undispatched produce records for deleted topic"
    );
    assert_eq!(h.d.checkpoint(), Seq(5));
}

#[test]
fn after_a_failed_commit_a_deleted_topic_is_confirmed_and_its_records_discarded_with_the_error() {
    let mut h = Harness::with_topic(&[1, 2]);
    h.append_n(0, 2);
    let first = h.take_commits().remove(0);
    h.append(&[rec("t", Some(1), 1, None)]);
    let other = h.take_commits().remove(0);
    delete(&mut h, "t");
    h.fail(&first, CommitFailure::Error(CommitError::NotOwner));
    assert_eq!(
        h.take(),
        vec![confirm("t")],
        "only this destination waits for the answer"
    );
    h.advance(ms(1500));
    assert!(h.take().is_empty(), "no probe while the question is open");
    answer(&mut h, "t", LeaderView::Absent);
    let discarded = |seq: u64| {
        DispatcherOutput::Warn(DispatchWarning::DiscardedAfterFailedCommit {
            topic: "t".into(),
            topic_id: Some(TopicId(1)),
            partition: PartitionId(0),
            seq: Seq(seq),
            error: CommitFailure::Error(CommitError::NotOwner),
        })
    };
    assert_eq!(h.take(), vec![discarded(0), discarded(1)]);
    assert_eq!(
        warnings(&[discarded(0)])[0].message(),
        WARN_DISCARD_DELETED_TOPIC
    );
    h.done(&other);
    assert_eq!(h.d.checkpoint(), Seq(3));
}

#[test]
fn after_a_failed_commit_an_unconfirmed_deletion_keeps_a_probe_checked_again_before_it_leaves() {
    let mut h = Harness::with_topic(&[1]);
    h.append_n(0, 2);
    let first = h.take_commits().remove(0);
    h.topic("t", Some(2), &[1]);
    h.fail(&first, CommitFailure::Timeout);
    assert_eq!(h.take(), vec![confirm("t")]);
    h.advance_to(at(200));
    answer(&mut h, "t", LeaderView::Unconfirmed);
    assert_eq!(
        (h.d.held_records(), h.d.skipped_records()),
        (1, 1),
        "an ordinary failure: a probe"
    );
    h.advance_to(just_before(at(1200)));
    assert!(h.take().is_empty());
    h.advance_to(at(1200));
    assert_eq!(
        h.take(),
        vec![confirm("t")],
        "the probe's incarnation is checked before it leaves"
    );
    answer(
        &mut h,
        "t",
        LeaderView::Present {
            topic_id: Some(TopicId(2)),
        },
    );
    let outputs = h.take();
    assert_eq!(
        outputs,
        vec![
            DispatcherOutput::Warn(DispatchWarning::DiscardedAfterFailedCommit {
                topic: "t".into(),
                topic_id: Some(TopicId(1)),
                partition: PartitionId(0),
                seq: Seq(0),
                error: CommitFailure::Timeout,
            }),
            DispatcherOutput::Warn(DispatchWarning::DiscardedStaleIncarnation {
                topic: "t".into(),
                topic_id: TopicId(1),
                partition: PartitionId(0),
                seq: Seq(1),
            }),
        ]
    );
    assert_eq!(h.d.checkpoint(), Seq(2));
}

#[test]
fn a_legacy_owner_gets_the_batch_again_without_ids_and_id_less_batches_for_2_minutes() {
    let mut h = Harness::with_topic(&[1, 2]);
    h.append_n(0, 2);
    let first = h.take_commits().remove(0);
    assert!(first.with_ids);
    h.advance_to(at(100));
    h.fail(&first, CommitFailure::LegacyRefusedIds);
    let resent = h.take_commits().remove(0);
    assert_eq!(
        (
            seqs(&resent),
            resent.with_ids,
            resent.deadline,
            resent.owner
        ),
        (
            vec![0, 1],
            false,
            first.deadline,
            CommitOwner::Remote(NodeId(1))
        ),
        "sent again without ids, on what is left of the same budget"
    );
    assert_ne!(resent.commit_id, first.commit_id);
    h.done(&resent);
    h.append(&[rec("t", Some(1), 0, None), rec("t", Some(1), 1, None)]);
    let commits = h.take_commits();
    assert_eq!(
        commits
            .iter()
            .map(|c| (c.partition.0, c.with_ids))
            .collect::<Vec<_>>(),
        vec![(0, false), (1, true)],
        "only that owner goes without ids"
    );
    for commit in &commits {
        h.done(commit);
    }
    h.advance_to(just_before(at(100) + LEGACY_OWNER_MEMORY));
    h.append_n(0, 1);
    let commit = h.take_commits().remove(0);
    assert!(!commit.with_ids);
    h.done(&commit);
    h.advance_to(at(100) + LEGACY_OWNER_MEMORY);
    h.append_n(0, 1);
    assert!(
        h.take_commits()[0].with_ids,
        "tried with ids again after 2 minutes"
    );
}

#[test]
fn a_legacy_refusal_past_the_deadline_is_an_ordinary_failure() {
    let mut h = Harness::with_topic(&[1]);
    h.append_n(0, 2);
    let first = h.take_commits().remove(0);
    h.advance_to(first.deadline);
    h.fail(&first, CommitFailure::LegacyRefusedIds);
    assert!(h.take().is_empty());
    assert_eq!((h.d.held_records(), h.d.skipped_records()), (1, 1));
}

#[test]
fn idle_destinations_and_topics_that_no_longer_exist_are_forgotten() {
    let mut h = Harness::with_topic(&[0, 0, 0]);
    h.append(&[rec("t", Some(1), 0, None), rec("t", Some(1), 2, None)]);
    for commit in h.take_commits() {
        h.done(&commit);
    }
    assert_eq!(h.d.destinations(), 2);
    delete(&mut h, "t");
    h.advance_to(at(1000));
    assert_eq!(h.d.destinations(), 0);
    assert_eq!(h.d.window_records(), 4096);
}
