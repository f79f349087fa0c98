//! The cohort wait: after a flush that answered enough appends, the next flush waits (briefly) for them
//! to come back. Times are in µs; every flush below runs for a chosen duration so the wait's bound
//! (`min(commit_delay_us_max, commit_delay_flush_percent of the flush's duration)`) is exact.

use super::*;

/// Waits at most 2 ms and half the last flush, for cohorts of at least 3 appends.
fn cohort_config() -> WalConfig {
    WalConfig {
        commit_delay_us_max: 2_000,
        commit_siblings_min: 3,
        commit_delay_flush_percent: 50,
        ..small_config()
    }
}

/// Flush 1 carries record 0 (t = 0 → 1 ms); flush 2 carries records 1..4 of appends 2, 3, 4
/// (t = 1 ms → `flush2_end_us`). Returns the harness after flush 2 completed, with its outputs.
fn after_a_flush_of_three(config: WalConfig, flush2_end_us: u64) -> (Harness, Vec<WalOutput>) {
    let mut h = Harness::ready(config);
    let first = one_io(h.at_us(0).append(1, b"aaaa"));
    assert_eq!(h.append(2, b"bbbb"), vec![]);
    assert_eq!(h.append(3, b"cccc"), vec![]);
    assert_eq!(h.append(4, b"dddd"), vec![]);
    let outputs = h.at_us(1_000).complete(&first);
    let second = request(
        2,
        0,
        flush_ops(SEG0, 24, frames(1, &[b"bbbb", b"cccc", b"dddd"])),
    );
    assert_eq!(
        outputs,
        vec![done(1, 0, 1), durable(1), WalOutput::Io(second.clone())],
        "one answered append is below the threshold: the next flush starts at once"
    );
    let outputs = h.at_us(flush2_end_us).complete(&second);
    (h, outputs)
}

/// Appends record 5 at `at_us` and asserts it leaves at once as flush 3: no cohort wait holds it.
fn flushes_at_once(h: &mut Harness, at_us: u64) {
    let outputs = h.at_us(at_us).append(5, b"eeee");
    assert_eq!(outputs, vec![WalOutput::Io(flush3(&[b"eeee"]))]);
}

fn flush3(records: &[&[u8]]) -> IoRequest {
    request(3, 0, flush_ops(SEG0, 96, frames(4, records)))
}

#[test]
fn after_a_flush_that_answered_the_siblings_threshold_the_next_flush_waits_for_the_cohort() {
    let (mut h, outputs) = after_a_flush_of_three(cohort_config(), 3_000);
    assert_eq!(
        outputs,
        vec![done(2, 1, 2), done(3, 2, 3), done(4, 3, 4), durable(4)]
    );
    assert_eq!(
        h.wal.poll_timeout(),
        None,
        "nothing staged: nothing to wake"
    );
    assert_eq!(
        h.at_us(3_100).append(5, b"eeee"),
        vec![],
        "the record waits for the cohort"
    );
    // The flush ran 2 ms: the wait is min(2 ms cap, 2 ms / 2) = 1 ms after its completion.
    assert_eq!(h.wal.poll_timeout(), Some(us(4_000)));
    assert_eq!(h.at_us(3_200).append(6, b"ffff"), vec![]);
    assert_eq!(h.wal.poll_timeout(), Some(us(4_000)));
}

#[test]
fn the_flush_starts_as_soon_as_the_cohort_is_back() {
    let (mut h, _) = after_a_flush_of_three(cohort_config(), 3_000);
    assert_eq!(h.at_us(3_100).append(5, b"eeee"), vec![]);
    assert_eq!(h.at_us(3_200).append(6, b"ffff"), vec![]);
    let outputs = h.at_us(3_300).append(7, b"gggg");
    let third = flush3(&[b"eeee", b"ffff", b"gggg"]);
    assert_eq!(outputs, vec![WalOutput::Io(third.clone())]);
    assert_eq!(h.wal.poll_timeout(), None);
    assert_eq!(
        h.at_us(5_300).complete(&third),
        vec![done(5, 4, 5), done(6, 5, 6), done(7, 6, 7), durable(7)]
    );
}

#[test]
fn the_flush_starts_at_the_deadline_when_the_cohort_does_not_come_back() {
    let (mut h, _) = after_a_flush_of_three(cohort_config(), 3_000);
    assert_eq!(h.at_us(3_100).append(5, b"eeee"), vec![]);
    assert_eq!(
        h.at_us(3_999).input(WalInput::Tick),
        vec![],
        "a tick before the deadline does nothing"
    );
    assert_eq!(h.wal.poll_timeout(), Some(us(4_000)));
    let outputs = h.at_us(4_000).input(WalInput::Tick);
    assert_eq!(outputs, vec![WalOutput::Io(flush3(&[b"eeee"]))]);
    assert_eq!(h.wal.poll_timeout(), None);
}

#[test]
fn an_append_after_the_deadline_flushes_at_once_without_a_tick() {
    let (mut h, _) = after_a_flush_of_three(cohort_config(), 3_000);
    flushes_at_once(&mut h, 4_000);
}

#[test]
fn the_wait_is_capped_by_commit_delay_us_max() {
    // Flush 2 ran 8 ms: half of it is 4 ms, above the 2 ms cap.
    let (mut h, _) = after_a_flush_of_three(cohort_config(), 9_000);
    assert_eq!(h.at_us(9_000).append(5, b"eeee"), vec![]);
    assert_eq!(h.wal.poll_timeout(), Some(us(11_000)));
}

#[test]
fn below_the_siblings_threshold_the_next_flush_starts_at_once() {
    let config = WalConfig {
        commit_siblings_min: 4,
        ..cohort_config()
    };
    let (mut h, outputs) = after_a_flush_of_three(config, 3_000);
    assert_eq!(
        outputs,
        vec![done(2, 1, 2), done(3, 2, 3), done(4, 3, 4), durable(4)]
    );
    flushes_at_once(&mut h, 3_100);
}

#[test]
fn a_zero_commit_delay_is_the_specs_wake_per_append() {
    let config = WalConfig {
        commit_delay_us_max: 0,
        ..cohort_config()
    };
    let (mut h, _) = after_a_flush_of_three(config, 3_000);
    flushes_at_once(&mut h, 3_100);
    assert_eq!(h.wal.poll_timeout(), None);
}

#[test]
fn appends_staged_during_the_flush_do_not_count_towards_the_cohort() {
    let mut h = Harness::ready(cohort_config());
    let first = one_io(h.at_us(0).append(1, b"aaaa"));
    h.append(2, b"bbbb");
    h.append(3, b"cccc");
    h.append(4, b"dddd");
    let second = ios(&h.at_us(1_000).complete(&first)).remove(0);
    // Staged while flush 2 runs: waits with the cohort, but is not part of it.
    assert_eq!(h.at_us(2_000).append(5, b"eeee"), vec![]);
    assert_eq!(
        h.at_us(3_000).complete(&second),
        vec![done(2, 1, 2), done(3, 2, 3), done(4, 3, 4), durable(4)],
        "record 4 waits for the three answered appends to come back"
    );
    assert_eq!(h.wal.poll_timeout(), Some(us(4_000)));
    assert_eq!(h.at_us(3_100).append(6, b"ffff"), vec![]);
    assert_eq!(h.at_us(3_200).append(7, b"gggg"), vec![]);
    let outputs = h.at_us(3_300).append(8, b"hhhh");
    assert_eq!(
        outputs,
        vec![WalOutput::Io(flush3(&[b"eeee", b"ffff", b"gggg", b"hhhh"]))]
    );
}

#[test]
fn a_batch_counts_as_one_append_of_the_cohort() {
    let (mut h, _) = after_a_flush_of_three(cohort_config(), 3_000);
    assert_eq!(
        h.at_us(3_100).append_many(5, &[b"e1e1", b"e2e2", b"e3e3"]),
        vec![],
        "three records, one caller"
    );
    assert_eq!(h.at_us(3_200).append(6, b"ffff"), vec![]);
    let outputs = h.at_us(3_300).append(7, b"gggg");
    assert_eq!(
        outputs,
        vec![WalOutput::Io(flush3(&[
            b"e1e1", b"e2e2", b"e3e3", b"ffff", b"gggg"
        ]))]
    );
    assert_eq!(
        h.at_us(4_000)
            .complete(&flush3(&[b"e1e1", b"e2e2", b"e3e3", b"ffff", b"gggg"])),
        vec![done(5, 4, 7), done(6, 7, 8), done(7, 8, 9), durable(9)]
    );
}

#[test]
fn the_backstop_starts_the_flush_whatever_the_cohort() {
    let mut h = Harness::ready(cohort_config());
    let first = one_io(h.at_us(0).append(1, b"aaaa"));
    h.append(2, b"bbbb");
    h.append(3, b"cccc");
    h.append(4, b"dddd");
    let second = ios(&h.at_us(1_000).complete(&first)).remove(0);
    // Staged at 1 ms: the backstop is due at 11 ms.
    assert_eq!(h.append(5, b"eeee"), vec![]);
    assert_eq!(h.wal.poll_timeout(), Some(ms(11)));
    // Flush 2 ran 9.5 ms: the cohort wait would end at 10.5 + min(2, 4.75) = 12.5 ms.
    h.at_us(10_500).complete(&second);
    assert_eq!(h.wal.poll_timeout(), Some(ms(11)));
    assert_eq!(h.at_us(10_999).input(WalInput::Tick), vec![]);
    let outputs = h.at_us(11_000).input(WalInput::Tick);
    assert_eq!(outputs, vec![WalOutput::Io(flush3(&[b"eeee"]))]);
    assert_eq!(h.wal.poll_timeout(), None);
}

#[test]
fn a_roll_is_not_held_back_by_the_cohort_but_the_flush_after_it_is() {
    let config = WalConfig {
        commit_siblings_min: 2,
        ..cohort_config()
    };
    let mut h = Harness::ready(config);
    let (a, b, c, d) = (
        payload(1, 50),
        payload(2, 50),
        payload(3, 50),
        payload(4, 50),
    );
    let first = one_io(h.at_us(0).append(1, &a));
    h.append(2, &b);
    h.append(3, &c);
    let second = ios(&h.at_us(1_000).complete(&first)).remove(0);
    assert_eq!(
        h.at_us(3_000).complete(&second),
        vec![done(2, 1, 2), done(3, 2, 3), durable(3)]
    );
    // 210 bytes used: record 3 (70 bytes) would pass 256 and rolls the segment at once.
    let roll = request(
        3,
        0,
        vec![
            IoOp::Create { path: seg_path(3) },
            IoOp::SyncDir { dir: "wal".into() },
        ],
    );
    assert_eq!(
        h.at_us(3_100).append(4, &d),
        vec![WalOutput::Io(roll.clone())]
    );
    assert_eq!(
        h.at_us(3_200).complete(&roll),
        vec![],
        "one of two appends came back: record 3 waits"
    );
    assert_eq!(h.wal.poll_timeout(), Some(us(4_000)));
    let outputs = h.at_us(4_000).input(WalInput::Tick);
    let fourth = request(4, 0, flush_ops(&seg_path(3), 0, frames(3, &[&d])));
    assert_eq!(outputs, vec![WalOutput::Io(fourth)]);
}

#[test]
fn a_failed_flush_expects_no_cohort_and_the_latch_refuses_at_once() {
    let mut h = Harness::ready(cohort_config());
    let first = one_io(h.at_us(0).append(1, b"aaaa"));
    h.append(2, b"bbbb");
    h.append(3, b"cccc");
    h.append(4, b"dddd");
    let second = ios(&h.at_us(1_000).complete(&first)).remove(0);
    assert_eq!(h.at_us(2_000).append(5, b"eeee"), vec![]);
    let fault = IoFault::NoSpace;
    let outputs = h.at_us(3_000).fail(&second, 1, fault.clone());
    let error = AppendError::Disk(fault.clone());
    assert_eq!(
        outputs,
        vec![
            WalOutput::Latched {
                fault: fault.clone()
            },
            failed(2, error.clone()),
            failed(3, error.clone()),
            failed(4, error.clone()),
            failed(5, error.clone()),
        ]
    );
    assert_eq!(h.wal.poll_timeout(), None);
    assert_eq!(h.at_us(3_100).append(6, b"ffff"), vec![failed(6, error)]);
}

#[test]
fn a_cohort_wait_holds_nothing_back_once_the_deadline_passed_with_nothing_staged() {
    let (mut h, _) = after_a_flush_of_three(cohort_config(), 3_000);
    assert_eq!(h.at_us(5_000).input(WalInput::Tick), vec![]);
    assert_eq!(h.wal.poll_timeout(), None);
    flushes_at_once(&mut h, 5_100);
}

#[test]
fn a_flush_of_at_least_commit_delay_flush_bytes_max_sets_no_cohort_wait() {
    // Flush 2 wrote 3 frames of 24 bytes: 72 bytes.
    let config = WalConfig {
        commit_delay_flush_bytes_max: 72,
        ..cohort_config()
    };
    let (mut h, _) = after_a_flush_of_three(config, 3_000);
    flushes_at_once(&mut h, 3_100);
    let config = WalConfig {
        commit_delay_flush_bytes_max: 73,
        ..cohort_config()
    };
    let (mut h, _) = after_a_flush_of_three(config, 3_000);
    assert_eq!(
        h.at_us(3_100).append(5, b"eeee"),
        vec![],
        "one byte more: it waits"
    );
}

#[test]
fn appends_handed_over_as_one_batch_share_one_flush_even_when_none_was_running() {
    let mut h = Harness::ready(small_config());
    let batch = WalInput::Batch(vec![
        WalInput::Append {
            id: AppendId(1),
            record: b"aaaa".to_vec(),
        },
        WalInput::Append {
            id: AppendId(2),
            record: b"bbbb".to_vec(),
        },
        WalInput::append_many_bytes(AppendId(3), vec![b"cccc".to_vec(), b"dddd".to_vec()]),
    ]);
    let outputs = h.at_us(0).input(batch);
    let flush = request(
        1,
        0,
        flush_ops(SEG0, 0, frames(0, &[b"aaaa", b"bbbb", b"cccc", b"dddd"])),
    );
    assert_eq!(outputs, vec![WalOutput::Io(flush.clone())]);
    assert_eq!(
        h.at_us(1_000).complete(&flush),
        vec![done(1, 0, 1), done(2, 1, 2), done(3, 2, 4), durable(4)]
    );
    // One by one, the first append leaves alone: what the batch input is for.
    let mut single = Harness::ready(small_config());
    let first = single.at_us(0).append(1, b"aaaa");
    assert_eq!(
        first,
        vec![WalOutput::Io(request(
            1,
            0,
            flush_ops(SEG0, 0, frames(0, &[b"aaaa"]))
        ))]
    );
}
