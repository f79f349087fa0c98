//! Rules of incarnations: 412s, deleted topics, stale incarnations, legacy owners, forgetting.

use super::*;

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
    h.fail(&first, Harness::mismatch(&first));
    let outputs = h.take();
    assert_eq!(
        outputs,
        vec![DispatcherOutput::Warn(
            DispatchWarning::IncarnationRefused {
                topic: "t".into(),
                topic_id: Some(TopicId(1)),
                partition: PartitionId(0),
                owner: CommitOwner::Remote(NodeId(1)),
                live_topic_id: None,
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
    h.fail(&first, CommitFailure::NotOwner);
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
            error: CommitFailure::NotOwner,
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
    h.fail(&first, CommitFailure::RefusedTrailingIds);
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
    h.fail(&first, CommitFailure::RefusedTrailingIds);
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
