//! The disk-failure test on the real binary, built with the `failpoints` feature
//! (`cargo test -p narad-node --features failpoints --test disk_failure`): `NARAD_FAILPOINTS` makes
//! FsDisk fail the ingress WAL's segment writes with ENOSPC after a byte budget, or its fdatasyncs
//! with EIO after a number of syncs, while producers (keyed and keyless, single and batch) load the
//! node. Then, as the produce-path spec's "WAL disk failure" section says:
//! - produces get 500 with `{"error": ...}`, counted in `errors_total{component="http",kind="5xx"}`;
//! - `narad_ingress_wal_failed` reads 1; `/readyz` and replay reads are unaffected;
//! - once the fault clears (the failpoints' clear file exists) produces keep failing: the latch holds;
//! - a restart clears the latch: produces get 202 again and the gauge reads 0;
//! - every record that got a 202, before the fault or after the restart, is visible exactly as
//!   produced, and nothing that was never produced is. A record that got a 500 may be visible (the
//!   spec: frames written before the failing point survive the rescan); those are counted.
//!
//! Two variants: ENOSPC on writes, restarted gracefully (SIGTERM, which must exit 0 with the WAL
//! latched), and EIO on fdatasync, restarted with `kill -9`.

#![cfg(feature = "failpoints")]

use std::path::Path;
use std::time::Duration;

use narad_load::scrape::Scrape;
use narad_tests::ledger::{judge, SharedLedger};
use narad_tests::load::{replay_all, ProducerSpec, Producers, Target};
use narad_tests::observe::wait_backlog_drained;
use narad_tests::Node;

const TOPIC: &str = "disk";
const PARTITIONS: u32 = 3;
/// The WAL's segment files (`ingress/produce/<20-digit seq>.wal`), not its checkpoint file.
const WAL_SEGMENTS: &str = "ingress/produce/0";
/// Largest batch the batch producers send.
const BATCH_MAX: usize = 8;
/// Longest wait for the fault to strike under load, and for other progress.
const WAIT: Duration = Duration::from_secs(60);
/// Records that keep failing after the fault cleared, before the test restarts the node.
const FAILURES_AFTER_CLEAR: u64 = 50;
/// Records acknowledged after the restart.
const ACKS_AFTER_RESTART: u64 = 200;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_narad"))
}

fn metrics(node: &Node) -> Scrape {
    let response = node.get("/metrics");
    assert_eq!(response.status, 200, "{}", response.text());
    Scrape::parse(&response.text())
}

fn http_5xx(scrape: &Scrape) -> f64 {
    scrape
        .get(
            "narad_errors_total",
            &[("component", "http"), ("kind", "5xx")],
        )
        .unwrap_or(0.0)
}

/// A single keyless produce outside the producers, registered in `ledger` with its outcome (the
/// callers expect a 500: then it may be visible but is never required to be).
fn produce_probe(node: &Node, ledger: &SharedLedger) -> narad_tests::Response {
    let (attempt, records) = ledger.begin(TOPIC, vec![None]);
    let response = node.post(&format!("/v1/topics/{TOPIC}/produce"), &records[0].payload);
    ledger.complete(attempt, judge(&Ok(response.clone())));
    response
}

/// How the node is restarted after the fault.
enum Restart {
    Kill,
    Terminate,
}

fn disk_failure_latches_until_restart(rule: &str, restart: Restart) {
    let cleared_dir = tempfile::tempdir().unwrap();
    let cleared = cleared_dir.path().join("disk-freed");
    let failpoints = format!("{WAL_SEGMENTS}:{rule};clear-file={}", cleared.display());
    let mut node = Node::start_with_env(binary(), &[("NARAD_FAILPOINTS", &failpoints)]);
    node.create_topic(TOPIC, PARTITIONS);
    let target = Target::new(node.addr());
    let ledger = SharedLedger::new();
    let producers = Producers::start(
        TOPIC,
        &target,
        &ledger,
        ProducerSpec::all_kinds("", BATCH_MAX),
    );

    // Under load, the fault strikes: produces get 500.
    let counts = producers
        .progress()
        .wait_until(WAIT, |counts| counts.failed_5xx > 0);
    assert!(
        counts.failed_5xx > 0,
        "no produce failed within {WAIT:?} under {failpoints}: {counts:?}"
    );
    assert!(
        counts.acked > 0,
        "nothing was acknowledged before the fault"
    );
    let refused = produce_probe(&node, &ledger);
    assert_eq!(refused.status, 500, "{}", refused.text());
    assert!(
        refused.json()["error"].is_string(),
        "500 without an error: {}",
        refused.text()
    );
    let latched = metrics(&node);
    assert_eq!(latched.value("narad_ingress_wal_failed"), Some(1.0));
    assert!(http_5xx(&latched) >= 1.0, "5xx not counted");
    // Readiness and replay are unaffected: what was acknowledged is dispatched and readable.
    assert_eq!(node.get("/readyz").status, 200);
    wait_backlog_drained(&node);
    let first = node.get(&format!("/v1/topics/{TOPIC}/consume?partition=0&offset=0"));
    assert_eq!(first.status, 200, "{}", first.text());

    // The disk is freed: the latch holds, produces keep failing.
    std::fs::write(&cleared, b"").unwrap();
    let at_clear = producers.progress().counts();
    let counts = producers.progress().wait_until(WAIT, |counts| {
        counts.failed_5xx >= at_clear.failed_5xx + FAILURES_AFTER_CLEAR
    });
    assert!(
        counts.failed_5xx >= at_clear.failed_5xx + FAILURES_AFTER_CLEAR,
        "producers stalled: {counts:?}"
    );
    assert_eq!(
        counts.acked, at_clear.acked,
        "a produce was acknowledged after the WAL latched"
    );
    assert_eq!(produce_probe(&node, &ledger).status, 500);
    assert_eq!(metrics(&node).value("narad_ingress_wal_failed"), Some(1.0));
    producers.stop();

    // A restart clears the latch.
    match restart {
        Restart::Kill => node.kill(),
        Restart::Terminate => {
            let status = node.terminate();
            assert!(status.success(), "graceful shutdown failed: {status}");
        }
    }
    node.restart();
    assert_eq!(metrics(&node).value("narad_ingress_wal_failed"), Some(0.0));
    target.set(Some(node.addr()));
    let producers = Producers::start(
        TOPIC,
        &target,
        &ledger,
        ProducerSpec::all_kinds("-after", BATCH_MAX),
    );
    let counts = producers
        .progress()
        .wait_until(WAIT, |counts| counts.acked >= ACKS_AFTER_RESTART);
    assert!(
        counts.acked >= ACKS_AFTER_RESTART && counts.failed_5xx == 0,
        "produces after the restart: {counts:?}"
    );
    producers.stop();

    // Everything acknowledged is visible, nothing else.
    wait_backlog_drained(&node);
    let replay = replay_all(node.addr(), TOPIC, PARTITIONS).unwrap();
    let verdict = ledger.check(&replay);
    eprintln!("disk failure ({rule}):\n{verdict}");
    assert!(verdict.is_ok(), "{verdict}");
    let reasons: Vec<&String> = verdict.ambiguous_reasons.keys().collect();
    assert_eq!(reasons, ["status 500"], "{verdict}");
}

#[test]
fn enospc_on_wal_writes_latches_until_a_restart_and_loses_nothing_acknowledged() {
    disk_failure_latches_until_restart("enospc-after-bytes=400000", Restart::Terminate);
}

#[test]
fn eio_on_wal_fsync_latches_until_a_restart_and_loses_nothing_acknowledged() {
    disk_failure_latches_until_restart("eio-after-syncs=150", Restart::Kill);
}
