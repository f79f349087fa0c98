//! Rules of failing destinations: probes, reroutes, unresolved owners, skipped records and rescans.

use super::*;

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
    let sibling = h.take_commits().remove(0);
    assert_eq!(sibling.partition, PartitionId(1));
    h.done(&sibling);
    // The commit in flight fails: its records were never resent elsewhere while in flight; now they
    // reroute too, with no probe left on the dead owner to pin the checkpoint.
    h.error(&in_flight);
    let rerouted = h.take_commits();
    assert_eq!(
        (rerouted[0].partition, seqs(&rerouted[0])),
        (PartitionId(1), vec![0])
    );
    h.done(&rerouted[0]);
    assert_eq!(h.d.checkpoint(), Seq(4));
    h.advance(ms(5000));
    assert!(h.take_commits().is_empty(), "no probe tries the dead owner");
    // Alive again: its partition gets its records back.
    h.member(1, true);
    h.append_n(0, 1);
    assert_eq!(h.take_commits()[0].partition, PartitionId(0));
}

#[test]
fn a_waiting_probe_reroutes_once_its_owner_is_reported_dead() {
    let mut h = Harness::with_topic(&[1, 2]);
    h.append_n(0, 2);
    let first = h.take_commits().remove(0);
    h.error(&first);
    assert_eq!(h.d.held_records(), 1, "the probe waits for its next try");
    h.member(1, false);
    let rerouted = h.take_commits();
    assert_eq!(
        (rerouted[0].partition, seqs(&rerouted[0])),
        (PartitionId(1), vec![0, 1])
    );
    h.done(&rerouted[0]);
    assert_eq!(h.d.checkpoint(), Seq(2));
    h.advance(ms(5000));
    assert!(h.take_commits().is_empty(), "no probe tries the dead owner");
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
        view: Some(TopicPlacement {
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
    h.fail(&first, Harness::mismatch(&first));
    h.take();
    h.advance_to(just_before(at(1000)));
    assert!(h.take().is_empty());
    h.advance_to(at(1000));
    let again = h.take_commits();
    assert_eq!(seqs(&again[0]), vec![0, 1]);
}

#[test]
fn a_failing_destinations_probe_goes_at_once_without_lingering() {
    let mut h = Harness::with_topic(&[1, 1]);
    h.append_n(0, 1);
    let first = h.take_commits().remove(0);
    h.advance_to(at(40));
    h.done(&first); // node 1 measured at 40 ms
    h.append_n(0, 1);
    let failing = h.take_commits().remove(0);
    h.advance_to(at(100));
    h.error(&failing);
    h.advance_to(at(1090));
    h.append_n(1, 1); // another commit in flight when the probe is due
    assert_eq!(h.take_commits().len(), 1);
    h.advance_to(just_before(at(1100)));
    assert!(h.take().is_empty());
    h.advance_to(at(1100));
    let probe = h.take_commits();
    assert_eq!(
        (probe[0].partition, seqs(&probe[0])),
        (PartitionId(0), vec![1])
    );
    assert_eq!(h.d.commits_in_flight(), 2);
}
