//! Rules of the reader, the window and the checkpoint.

use super::*;

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
