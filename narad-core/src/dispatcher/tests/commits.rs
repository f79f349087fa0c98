//! Rules of commits: one per destination, the fan-out, linger, the byte budget, hung commits.

use super::*;

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

#[test]
fn a_hung_commit_failing_at_the_held_limit_keeps_its_probe_and_the_reader_waits_for_room() {
    let mut h = Harness::with_topic(&[0; 5]);
    h.append_n(0, 1);
    let hung = h.take_commits().remove(0);
    h.advance_to(at(1000));
    assert_eq!(h.d.hung_commits(), 1);
    // Four other destinations fill the window: the reader stops at the limit, the hung record aside.
    let limit = h.d.held_limit_records();
    let records: Vec<_> = (0..limit + 400)
        .map(|i| rec("t", Some(1), 1 + (i % 4) as u32, None))
        .collect();
    h.append(&records);
    let _ = h.take();
    assert_eq!(h.d.held_counted_records(), limit);
    let reads = h.reads.len();
    // The hung commit fails: its destination keeps its one record as the probe, counted again.
    h.error(&hung);
    assert_eq!(h.d.held_counted_records(), limit + 1);
    assert_eq!(h.reads.len(), reads, "no read while over the limit");
}
