use super::*;

const ORDERS: TopicId = TopicId(1);

fn served(topic: &str, topic_id: TopicId, partition: u32, offset: u64, id: u64) -> Served {
    Served::new(
        topic.into(),
        topic_id,
        PartitionId(partition),
        Offset(offset),
        payload::encode(id, 32),
    )
}

/// Two accepted records aimed at partition 0 of orders#1, one timed out.
fn ledger() -> Ledger {
    let mut ledger = Ledger::new();
    let call = ledger.begin();
    assert_eq!(
        ledger.add_record(call, "orders", ORDERS, Some(PartitionId(0))),
        0
    );
    assert_eq!(
        ledger.add_record(call, "orders", ORDERS, Some(PartitionId(0))),
        1
    );
    ledger.complete(call, Outcome::Accepted);
    let call = ledger.begin();
    assert_eq!(ledger.add_record(call, "orders", ORDERS, None), 2);
    ledger.complete(call, Outcome::TimedOut);
    ledger
}

fn both(served: Vec<Served>) -> (Observation, Observation) {
    let observation = Observation {
        served,
        ..Observation::default()
    };
    (observation.clone(), observation)
}

#[test]
fn a_clean_run_passes() {
    let (deadline, last) = both(vec![
        served("orders", ORDERS, 0, 0, 0),
        served("orders", ORDERS, 0, 1, 1),
    ]);
    let report = ledger().check(&deadline, &last);
    assert!(!report.failed(), "{report:?}");
    assert_eq!(report.accepted, 2);
    assert_eq!(report.ambiguous, 1);
    assert_eq!(report.reroutes, 0);
    assert_eq!(report.duplicate_copies(), 0);
}

#[test]
fn an_accepted_record_never_served_is_lost() {
    let (deadline, last) = both(vec![served("orders", ORDERS, 0, 0, 0)]);
    let report = ledger().check(&deadline, &last);
    assert!(report.failed());
    assert_eq!(report.lost, vec![1]);
    assert!(report.vanished.is_empty());
    assert!(report.unseen.is_empty());
}

#[test]
fn a_record_served_at_the_deadline_but_gone_after_the_final_crash_is_lost() {
    let deadline = Observation {
        at_ns: 0,
        served: vec![
            served("orders", ORDERS, 0, 0, 0),
            served("orders", ORDERS, 0, 1, 1),
        ],
    };
    let last = Observation {
        at_ns: 0,
        served: vec![served("orders", ORDERS, 0, 0, 0)],
    };
    let report = ledger().check(&deadline, &last);
    assert!(report.failed());
    assert_eq!(report.lost, vec![1]);
    assert_eq!(report.vanished, vec![1]);
}

#[test]
fn an_accepted_record_missing_at_the_deadline_is_unseen() {
    let deadline = Observation {
        at_ns: 0,
        served: vec![served("orders", ORDERS, 0, 0, 0)],
    };
    let last = Observation {
        at_ns: 0,
        served: vec![
            served("orders", ORDERS, 0, 0, 0),
            served("orders", ORDERS, 0, 1, 1),
        ],
    };
    let report = ledger().check(&deadline, &last);
    assert!(report.failed());
    assert_eq!(report.unseen, vec![1]);
    assert!(report.lost.is_empty());
}

#[test]
fn a_damaged_payload_is_a_phantom() {
    let mut damaged = payload::encode(1, 32);
    damaged[25] ^= 4;
    let bad = Served::new("orders".into(), ORDERS, PartitionId(0), Offset(2), damaged);
    let (deadline, last) = both(vec![
        served("orders", ORDERS, 0, 0, 0),
        served("orders", ORDERS, 0, 1, 1),
        bad,
    ]);
    let report = ledger().check(&deadline, &last);
    assert!(report.failed());
    assert_eq!(report.phantoms.len(), 1, "deduplicated across observations");
    assert_eq!(report.phantoms[0].offset, Offset(2));
    assert!(report.phantoms[0].reason.contains("Corrupt"));
}

#[test]
fn an_id_never_produced_is_a_phantom() {
    let (deadline, last) = both(vec![
        served("orders", ORDERS, 0, 0, 0),
        served("orders", ORDERS, 0, 1, 1),
        served("orders", ORDERS, 0, 2, 99),
    ]);
    let report = ledger().check(&deadline, &last);
    assert!(report.failed());
    assert_eq!(report.phantoms.len(), 1);
    assert!(report.phantoms[0].reason.contains("never produced"));
}

#[test]
fn a_refused_record_that_is_served_is_a_phantom() {
    let mut ledger = ledger();
    let call = ledger.begin();
    let id = ledger.add_record(call, "orders", ORDERS, None);
    ledger.complete(call, Outcome::Refused);
    let (deadline, last) = both(vec![
        served("orders", ORDERS, 0, 0, 0),
        served("orders", ORDERS, 0, 1, 1),
        served("orders", ORDERS, 1, 0, id),
    ]);
    let report = ledger.check(&deadline, &last);
    assert!(report.failed());
    assert_eq!(report.refused, 1);
    assert!(report.phantoms[0].reason.contains("refused"));
}

#[test]
fn a_record_served_under_another_topic_is_misplaced() {
    let (deadline, last) = both(vec![
        served("orders", ORDERS, 0, 0, 0),
        served("orders", ORDERS, 0, 1, 1),
        served("events", TopicId(5), 0, 0, 1),
    ]);
    let report = ledger().check(&deadline, &last);
    assert!(report.failed());
    assert_eq!(report.misplaced.len(), 1);
    assert_eq!(report.misplaced[0].topic, "events");
}

#[test]
fn a_record_served_in_a_recreated_incarnation_is_misplaced() {
    let mut ledger = ledger();
    ledger.incarnation_deleted(ORDERS);
    let (deadline, last) = both(vec![served("orders", TopicId(2), 0, 0, 0)]);
    let report = ledger.check(&deadline, &last);
    assert!(report.failed());
    assert_eq!(report.misplaced.len(), 1);
    assert!(report.misplaced[0].reason.contains("orders#1"));
    assert!(report.lost.is_empty(), "the old incarnation was deleted");
    assert_eq!(report.excused_deleted, 2);
}

#[test]
fn records_of_a_deleted_incarnation_need_not_be_served() {
    let mut ledger = ledger();
    ledger.incarnation_deleted(ORDERS);
    let report = ledger.check(&Observation::default(), &Observation::default());
    assert!(!report.failed(), "{report:?}");
    assert_eq!(report.excused_deleted, 2);
}

#[test]
fn records_destroyed_by_bit_rot_are_excused() {
    let mut ledger = ledger();
    ledger.rotted([1]);
    let (deadline, last) = both(vec![served("orders", ORDERS, 0, 0, 0)]);
    let report = ledger.check(&deadline, &last);
    assert!(!report.failed(), "{report:?}");
    assert_eq!(report.excused_rot, 1);
}

#[test]
fn ambiguous_records_may_be_served_or_not() {
    let (deadline, last) = both(vec![
        served("orders", ORDERS, 0, 0, 0),
        served("orders", ORDERS, 0, 1, 1),
        served("orders", ORDERS, 3, 0, 2),
    ]);
    let report = ledger().check(&deadline, &last);
    assert!(!report.failed(), "{report:?}");
    assert_eq!(report.reroutes, 0, "keyless records are not aimed");
}

#[test]
fn duplicates_are_counted_in_a_histogram_and_pass() {
    let (deadline, last) = both(vec![
        served("orders", ORDERS, 0, 0, 0),
        served("orders", ORDERS, 0, 1, 1),
        served("orders", ORDERS, 0, 2, 1),
        served("orders", ORDERS, 0, 3, 0),
        served("orders", ORDERS, 0, 4, 0),
    ]);
    let report = ledger().check(&deadline, &last);
    assert!(!report.failed(), "{report:?}");
    assert_eq!(report.duplicates, BTreeMap::from([(2, 1), (3, 1)]));
    assert_eq!(report.duplicate_copies(), 3);
    assert_eq!(report.duplicates_histogram(), "2:1 3:1");
}

#[test]
fn copies_on_a_sibling_partition_are_reroutes_and_pass() {
    let (deadline, last) = both(vec![
        served("orders", ORDERS, 0, 0, 0),
        served("orders", ORDERS, 2, 0, 1),
    ]);
    let report = ledger().check(&deadline, &last);
    assert!(!report.failed(), "{report:?}");
    assert_eq!(report.reroutes, 1);
}

/// Three accepted calls of one record each, aimed at orders#1/0: through node 0 at 1 s, node 1
/// at 2 s and node 2 at 3 s.
fn three_calls() -> Ledger {
    let mut ledger = Ledger::new();
    for node in 0..3u32 {
        let call = ledger.begin();
        ledger.add_record(call, "orders", ORDERS, Some(PartitionId(0)));
        ledger.set_via(call, node, u64::from(node + 1) * 1_000_000_000);
        ledger.complete(call, Outcome::Accepted);
    }
    ledger
}

#[test]
fn a_report_breaks_down_by_node_and_by_the_faults_around_each_call() {
    let ledger = three_calls();
    // Record 0 lost, record 1 twice (once rerouted), record 2 in place.
    let last = Observation {
        at_ns: 0,
        served: vec![
            served("orders", ORDERS, 0, 0, 1),
            served("orders", ORDERS, 1, 0, 1),
            served("orders", ORDERS, 0, 1, 2),
        ],
    };
    let report = ledger.check(&last, &last);
    assert_eq!(
        (
            report.lost.clone(),
            report.duplicated.clone(),
            report.rerouted.clone()
        ),
        (vec![0], vec![1], vec![1])
    );
    // A crash in force around the calls of 2 s and later, nothing before.
    let breakdown = ledger.breakdown(&report, |at_ns| {
        if at_ns >= 2_000_000_000 {
            vec!["crash"]
        } else {
            vec![]
        }
    });
    let tally = |accepted, lost, duplicated, rerouted| Tally {
        accepted,
        lost,
        unseen: 0,
        duplicated,
        rerouted,
    };
    assert_eq!(breakdown.by_node[&0], tally(1, 1, 0, 0));
    assert_eq!(breakdown.by_node[&1], tally(1, 0, 1, 1));
    assert_eq!(breakdown.by_node[&2], tally(1, 0, 0, 0));
    assert_eq!(breakdown.by_fault["none"], tally(1, 1, 0, 0));
    assert_eq!(breakdown.by_fault["crash"], tally(2, 0, 1, 1));
    let mut sum = Breakdown::default();
    sum.add(&breakdown);
    sum.add(&breakdown);
    assert_eq!(sum.by_fault["crash"], tally(4, 0, 2, 2));
}

#[test]
fn records_a_down_node_may_hold_are_excused_at_the_deadline_only() {
    let mut ledger = three_calls();
    // Node 1 stays down through the deadline; it crashed at 1.5 s.
    ledger.excuse_at_deadline(BTreeSet::from([1]), 1_500_000_000);
    let nothing = Observation::default();
    // Record 0 was sent before the crash, record 1 through node 1: excused. Record 2 was sent
    // through a live node after the crash: it must be visible at the deadline.
    assert_eq!(ledger.missing_at_deadline(&nothing), 1);
    assert_eq!(ledger.missing(&nothing), 3);
    let all = Observation {
        at_ns: 0,
        served: (0..3)
            .map(|id| served("orders", ORDERS, 0, id, id))
            .collect(),
    };
    let report = ledger.check(&nothing, &all);
    assert_eq!(report.unseen, vec![2]);
    assert!(report.lost.is_empty());
    // At the final read nothing is excused.
    let report = ledger.check(&all, &nothing);
    assert_eq!(report.lost, vec![0, 1, 2]);
}

#[test]
fn missing_counts_required_records_not_served_in_place() {
    let ledger = ledger();
    let observation = Observation {
        at_ns: 0,
        served: vec![
            served("orders", ORDERS, 0, 0, 0),
            served("orders", TopicId(9), 0, 1, 1),
        ],
    };
    assert_eq!(ledger.missing(&observation), 1, "record 1 is misplaced");
    assert_eq!(ledger.missing(&Observation::default()), 2);
}

/// Record 0 produced with key `k1`, record 1 keyless, both accepted on orders#1.
fn keyed_ledger() -> Ledger {
    let mut ledger = Ledger::new();
    let call = ledger.begin();
    let aimed = Some(key_partition(b"k1", 4));
    assert_eq!(
        ledger.add_record_with_key(call, "orders", ORDERS, aimed, Some(b"k1")),
        0
    );
    assert_eq!(
        ledger.add_record_with_key(call, "orders", ORDERS, None, None),
        1
    );
    ledger.complete(call, Outcome::Accepted);
    ledger
}

#[test]
fn copies_served_under_their_own_keys_pass() {
    let partition = key_partition(b"k1", 4).0;
    let (deadline, last) = both(vec![
        served("orders", ORDERS, partition, 0, 0).with_key(Some(b"k1")),
        served("orders", ORDERS, 3, 0, 1).with_key(None),
    ]);
    let report = keyed_ledger().check(&deadline, &last);
    assert!(!report.failed(), "{report:?}");
    assert_eq!(report.reroutes, 0);
}

#[test]
fn a_copy_served_under_another_key_is_misplaced() {
    let partition = key_partition(b"k1", 4).0;
    let (deadline, last) = both(vec![
        served("orders", ORDERS, partition, 0, 0).with_key(Some(b"k2")),
        served("orders", ORDERS, 3, 0, 1).with_key(Some(b"k1")),
    ]);
    let ledger = keyed_ledger();
    let report = ledger.check(&deadline, &last);
    assert!(report.failed());
    let reasons: Vec<&str> = report.misplaced.iter().map(|a| a.reason.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "record 0 was produced with key Some(\"k1\"), served with key Some(\"k2\")",
            "record 1 was produced with key None, served with key Some(\"k1\")",
        ]
    );
    assert_eq!(
        report.lost,
        vec![0, 1],
        "a misplaced copy does not count as served"
    );
    assert_eq!(ledger.missing(&last), 2);
}

#[test]
fn keys_are_checked_only_when_both_the_ledger_and_the_read_know_them() {
    let (deadline, last) = both(vec![
        served("orders", ORDERS, 0, 0, 0).with_key(Some(b"k9")),
        served("orders", ORDERS, 0, 1, 1).with_key(Some(b"k9")),
    ]);
    let report = ledger().check(&deadline, &last);
    assert!(
        !report.failed(),
        "records registered without a key: {report:?}"
    );
    let (deadline, last) = both(vec![
        served("orders", ORDERS, 0, 0, 0),
        served("orders", ORDERS, 0, 1, 1),
    ]);
    let report = keyed_ledger().check(&deadline, &last);
    assert!(!report.failed(), "a read that reports no keys: {report:?}");
}

#[test]
fn ambiguous_records_served_are_counted() {
    let (deadline, last) = both(vec![
        served("orders", ORDERS, 0, 0, 0),
        served("orders", ORDERS, 0, 1, 1),
        served("orders", ORDERS, 1, 0, 2),
        served("orders", ORDERS, 1, 1, 2),
    ]);
    let report = ledger().check(&deadline, &last);
    assert!(!report.failed(), "{report:?}");
    assert_eq!((report.ambiguous, report.ambiguous_served), (1, 1));
    assert_eq!(served("orders", ORDERS, 0, 0, 7).record_id(), Ok(7));
}

#[test]
fn key_partition_is_fnv1a_32_modulo_partitions() {
    // FNV-1a 32 of "" is the offset basis 0x811c9dc5; of "a" it is 0xe40c292c.
    assert_eq!(key_partition(b"", 1000), PartitionId(0x811c_9dc5 % 1000));
    assert_eq!(key_partition(b"a", 7), PartitionId(0xe40c_292c % 7));
}
