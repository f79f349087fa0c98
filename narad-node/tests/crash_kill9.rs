//! The crash test: concurrent producers (keyed and keyless, single and batch) against the real `narad`
//! binary, `kill -9` of the node at random moments over several rounds, a restart on the same data dir
//! after each, and at the end — once the dispatch backlog gauge reads 0 (waited for at most
//! [`narad_tests::observe::WAIT_TIMEOUT`]) — a replay of every partition checked against the ledger of
//! every attempt (the simulator's checker): every 202'd record present (duplicates counted and
//! reported), nothing that was never produced, every record under the topic and key it was produced
//! with.
//!
//! The kill moments are drawn from a seeded ChaCha8Rng: after a random number of newly acknowledged
//! records, plus a random delay of up to [`KILL_DELAY_MS_MAX`] ms; in some rounds the restarted node is
//! killed once more, a few milliseconds into its recovery, before the restart that lets it finish.
//! `NARAD_CRASH_SEED` fixes the seed (otherwise a fresh one is drawn and printed) and
//! `NARAD_CRASH_ROUNDS` the number of kills. The same seed gives the same schedule; the interleaving
//! with the node's own timing is real, so a failure may need a few reruns to reproduce — every run
//! prints its seed and the rerun command.
//!
//! Scope: `kill -9` is a process crash, so the page cache survives it; what a power loss does to
//! unsynced writes (and an fsync that lies or fails) is the simulator's job over SimDisk. This test
//! proves the real binary's recovery, replay, checkpointing and dispatch on real files.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use narad_core::PartitionId;
use narad_tests::ledger::{Outcome, SharedLedger};
use narad_tests::load::{pause, replay_all, ProducerSpec, Producers, Target};
use narad_tests::observe::wait_backlog_drained;
use narad_tests::Node;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const TOPIC: &str = "crash";
const PARTITIONS: u32 = 4;
/// Kills when `NARAD_CRASH_ROUNDS` is unset.
const ROUNDS_DEFAULT: u32 = 12;
/// Largest batch the batch producers send.
const BATCH_MAX: usize = 16;
/// Fewest newly acknowledged records before a kill.
const ACKS_BEFORE_KILL_MIN: u64 = 50;
/// Most newly acknowledged records before a kill.
const ACKS_BEFORE_KILL_MAX: u64 = 800;
/// Extra delay after those acknowledgements, drawn up to this.
const KILL_DELAY_MS_MAX: u64 = 25;
/// Chance that a round also kills the restarted node during its recovery.
const RECOVERY_KILL_PROBABILITY: f64 = 0.35;
/// How far into recovery that second kill lands, drawn up to this (from the `http listening` line).
const RECOVERY_KILL_DELAY_MS_MAX: u64 = 30;
/// Longest wait for a round's acknowledgements (a node that stops accepting fails the test).
const ROUND_TIMEOUT: Duration = Duration::from_secs(60);

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_narad"))
}

fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    let text = std::env::var(name).ok()?;
    Some(
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a number")),
    )
}

#[test]
fn every_acknowledged_record_survives_kill_9_at_random_moments() {
    let rounds: u32 = env_number("NARAD_CRASH_ROUNDS").unwrap_or(ROUNDS_DEFAULT);
    crash_rounds(
        &[],
        rounds,
        "every_acknowledged_record_survives_kill_9_at_random_moments",
    );
}

/// The same with `storage.ingress_wal_prealloc = true` on real files. A segment is prepared only
/// once the active one passes half its 64 MiB, which a dispatcher that keeps up (it rotates a
/// dispatched segment past 1 MiB) rarely lets happen here: appending into prepared segments and
/// recovering them after a crash is the simulator's (crash-storm, cluster-disk and cluster-heavy
/// draw `node.wal_prealloc` per seed, on 16 KiB to 8 MiB segments).
#[test]
fn every_acknowledged_record_survives_kill_9_with_wal_prealloc_on() {
    let rounds: u32 = env_number("NARAD_CRASH_ROUNDS").unwrap_or(ROUNDS_DEFAULT / 2);
    crash_rounds(
        &[("NARAD_STORAGE_INGRESS_WAL_PREALLOC", "true")],
        rounds,
        "every_acknowledged_record_survives_kill_9_with_wal_prealloc_on",
    );
}

/// Runs the crash rounds against a node started with `env`.
fn crash_rounds(env: &[(&str, &str)], rounds: u32, test: &str) {
    let seed: u64 =
        env_number("NARAD_CRASH_SEED").unwrap_or_else(|| ChaCha8Rng::from_os_rng().random());
    let rerun = format!(
        "NARAD_CRASH_SEED={seed} NARAD_CRASH_ROUNDS={rounds} \
         cargo test -p narad-node --test crash_kill9 {test} -- --nocapture"
    );
    eprintln!("crash test: seed {seed}, {rounds} kills; rerun with: {rerun}");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);

    let mut node = Node::start_with_env(binary(), env);
    node.create_topic(TOPIC, PARTITIONS);
    let target = Target::new(node.addr());
    let mut specs = ProducerSpec::all_kinds("a", BATCH_MAX);
    specs.extend(ProducerSpec::all_kinds("b", BATCH_MAX));
    let ledger = SharedLedger::new();
    let producers = Producers::start(TOPIC, &target, &ledger, specs);

    // One more stretch of load after the last restart, so the recovered node takes new records too.
    for round in 1..=rounds + 1 {
        let wanted = rng.random_range(ACKS_BEFORE_KILL_MIN..=ACKS_BEFORE_KILL_MAX);
        let delay = Duration::from_millis(rng.random_range(0..=KILL_DELAY_MS_MAX));
        let from = producers.progress().counts().acked;
        let counts = producers
            .progress()
            .wait_until(ROUND_TIMEOUT, |counts| counts.acked >= from + wanted);
        assert!(
            counts.acked >= from + wanted,
            "round {round}: only {} of {wanted} records acknowledged within {ROUND_TIMEOUT:?} \
             ({counts:?}); seed {seed}, rerun: {rerun}",
            counts.acked - from
        );
        if round > rounds {
            break;
        }
        // Some rounds also crash the restarted node while it recovers (before it is ready).
        let recovery_kill = rng
            .random_bool(RECOVERY_KILL_PROBABILITY)
            .then(|| Duration::from_millis(rng.random_range(0..=RECOVERY_KILL_DELAY_MS_MAX)));
        pause(delay);
        node.kill();
        target.set(None);
        if let Some(recovery_delay) = recovery_kill {
            node.restart_unready();
            pause(recovery_delay);
        }
        node.restart();
        target.set(Some(node.addr()));
        let again = recovery_kill.map_or_else(String::new, |recovery_delay| {
            format!(", and again {recovery_delay:?} into its recovery")
        });
        eprintln!(
            "round {round}: kill -9 after {wanted} more acknowledged records + {delay:?}{again}; \
             restarted ({:?})",
            producers.progress().counts()
        );
    }
    producers.stop();

    wait_backlog_drained(&node);
    let replay = replay_all(node.addr(), TOPIC, PARTITIONS)
        .unwrap_or_else(|error| panic!("replay failed: {error}; seed {seed}, rerun: {rerun}"));
    let verdict = ledger.check(&replay);
    eprintln!("crash test (seed {seed}, {rounds} kills):\n{verdict}");
    assert!(
        verdict.is_ok(),
        "records lost, invented or misplaced:\n{verdict}\nseed {seed}, rerun: {rerun}"
    );
    assert!(verdict.report.accepted > 0, "nothing was acknowledged");
    // Without disk faults the WAL never fails: a 500 here is a node bug, not a crash artefact.
    assert!(
        !verdict.ambiguous_reasons.contains_key("status 500"),
        "produces answered 500 without any disk fault:\n{verdict}\nseed {seed}, rerun: {rerun}"
    );
}

/// The check above can fail: a node whose partition log loses committed records (here: its segment
/// files are deleted while it is down) is reported with exactly those records lost.
#[test]
fn the_ledger_check_reports_records_a_wiped_partition_log_lost() {
    let mut node = Node::start(binary());
    node.create_topic(TOPIC, PARTITIONS);
    let target = Target::new(node.addr());
    let ledger = SharedLedger::new();
    let producers = Producers::start(
        TOPIC,
        &target,
        &ledger,
        ProducerSpec::all_kinds("", BATCH_MAX),
    );
    producers
        .progress()
        .wait_until(ROUND_TIMEOUT, |counts| counts.acked >= 200);
    producers.stop();
    wait_backlog_drained(&node);
    let before = replay_all(node.addr(), TOPIC, PARTITIONS).unwrap();
    let verdict = ledger.check(&before);
    assert!(verdict.is_ok(), "{verdict}");
    let wiped: BTreeSet<u64> = before
        .served
        .iter()
        .filter(|copy| copy.partition == PartitionId(1))
        .map(|copy| copy.record_id().expect("checked: no phantom"))
        .collect();
    assert!(!wiped.is_empty(), "nothing landed on partition 1");

    node.kill();
    let topic_dir = node.data_dir().join("topics").join(TOPIC);
    let mut removed = 0;
    for incarnation in std::fs::read_dir(&topic_dir).unwrap() {
        let partition_dir = incarnation.unwrap().path().join("p00001");
        for file in std::fs::read_dir(&partition_dir).unwrap() {
            let path = file.unwrap().path();
            if path.extension().is_some_and(|ext| ext == "log") {
                std::fs::remove_file(&path).unwrap();
                removed += 1;
            }
        }
    }
    assert!(removed > 0, "no segment under {}", topic_dir.display());
    // The owner journal holds a second copy of every commit its partitions have not synced yet (a
    // restart writes them back): wipe it too, so partition 1's records are in no verified place.
    let journal_dir = node.data_dir().join("owner-journal");
    if let Ok(entries) = std::fs::read_dir(&journal_dir) {
        for file in entries {
            std::fs::remove_file(file.unwrap().path()).unwrap();
        }
    }
    node.restart();

    let after = replay_all(node.addr(), TOPIC, PARTITIONS).unwrap();
    let verdict = ledger.check(&after);
    assert!(!verdict.is_ok(), "{verdict}");
    assert!(verdict.report.phantoms.is_empty(), "{verdict}");
    assert!(verdict.report.misplaced.is_empty(), "{verdict}");
    let acked_wiped: Vec<u64> = wiped
        .into_iter()
        .filter(|&id| ledger.outcome_of(id) == Some(Outcome::Accepted))
        .collect();
    assert_eq!(verdict.report.lost, acked_wiped, "{verdict}");
}
