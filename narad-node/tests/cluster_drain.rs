//! How fast a backlog drains on real processes, a benchmark run by `ci/bench-drain` (release build):
//! three members, producers on two of them at full speed, then the third, owner of a third of the
//! partitions, frozen (SIGSTOP) for [`FREEZE`], short of the dispatcher's 3 s reroute grace, so every
//! record aimed at its partitions waits in the accepting members' WALs. The producers stop, the
//! owner thaws (SIGCONT), and the figure is the records and bytes the other members held and the
//! time from the thaw until both read zero backlog (the records and bytes are what the frozen owner's
//! partitions took from the freeze to the drain: its high watermarks and sizes before and after), against the steady produce rate measured before
//! the freeze. The produce-path target: a backlog drains at no less than half the produce rate.
//! `DRAIN_ASSERT=1` asserts it; every acknowledged record is checked visible either way.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use narad_tests::cluster::{Cluster, MEMBER_TIMEOUT};
use narad_tests::ledger::SharedLedger;
use narad_tests::load::{pause, replay_all, ProducerSpec, Producers, Target};
use narad_tests::observe::{metric_sum, metrics_text, poll_until};

const SECRET: &str = "drain-secret";
const MEMBERS: u64 = 3;
const FROZEN: u64 = 3;
const PARTITIONS: u32 = 6;
const TOPIC: &str = "drain";
const BATCH_MAX: usize = 64;
/// How long the steady produce rate is measured.
const STEADY: Duration = Duration::from_secs(3);
/// How long the owner stays frozen: under the 3 s reroute grace and the 5 s dead timeout, so
/// nothing is rerouted and the whole backlog waits for this owner.
const FREEZE: Duration = Duration::from_millis(2_500);
const BACKLOG: &str = "narad_ingress_dispatch_backlog_records";
const REROUTES: &str = "narad_ingress_dispatch_reroutes_total";

/// The node under test: this build's, or `NARAD_DRAIN_BINARY` (another build of `narad`, for a
/// before/after figure on the same harness).
fn binary() -> PathBuf {
    std::env::var_os("NARAD_DRAIN_BINARY")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_narad")), PathBuf::from)
}

/// The high watermarks and sizes, summed, of the partitions `owners` gives member [`FROZEN`], as
/// member 1 sees them.
fn frozen_stats(cluster: &Cluster, owners: &[u64]) -> (u64, u64) {
    let got = cluster.node(1).get(&format!("/v1/topics/{TOPIC}"));
    assert_eq!(got.status, 200, "{}", got.text());
    let stats = got.json()["partition_stats"].clone();
    let stats = stats.as_array().expect("partition_stats");
    owners
        .iter()
        .zip(stats)
        .filter(|(&owner, _)| owner == FROZEN)
        .fold((0, 0), |(records, bytes), (_, stat)| {
            let field = |name: &str| {
                stat[name]
                    .as_u64()
                    .unwrap_or_else(|| panic!("{name}: {stat}"))
            };
            (
                records + field("high_watermark"),
                bytes + field("size_bytes"),
            )
        })
}

#[test]
#[allow(clippy::disallowed_methods)] // The drain figure times real processes: the real clock.
#[ignore = "a benchmark: run by ci/bench-drain"]
fn a_frozen_owners_backlog_drains_at_no_less_than_half_the_produce_rate() {
    let cluster = Cluster::start(&binary(), MEMBERS as usize, SECRET);
    cluster.node(1).create_topic(TOPIC, PARTITIONS);
    let owners = cluster.wait_topic(TOPIC, PARTITIONS);
    let frozen_partitions = owners.iter().filter(|&&owner| owner == FROZEN).count();
    assert!(
        frozen_partitions > 0,
        "member {FROZEN} owns no partition: {owners:?}"
    );

    let ledger = SharedLedger::new();
    let groups: Vec<Producers> = (1..MEMBERS)
        .map(|id| {
            let target = Target::new(cluster.node(id).addr());
            let specs = ProducerSpec::all_kinds(&format!("n{id}"), BATCH_MAX);
            Producers::start(TOPIC, &target, &ledger, specs)
        })
        .collect();
    let acked =
        |groups: &[Producers]| -> u64 { groups.iter().map(|g| g.progress().counts().acked).sum() };

    pause(Duration::from_secs(1)); // connections open, the dispatchers warm
    let (from, started) = (acked(&groups), Instant::now());
    pause(STEADY);
    let steady_per_s = (acked(&groups) - from) as f64 / started.elapsed().as_secs_f64();

    let before = frozen_stats(&cluster, &owners);
    cluster.node(FROZEN).signal("STOP");
    pause(FREEZE);
    for producers in groups {
        producers.stop();
    }
    // Only the accepting members are asked while the owner is frozen: a frozen process takes the
    // connection and never answers, which would stretch the freeze past the dead timeout.
    let backlog = |id: u64| metric_sum(&metrics_text(cluster.node(id)), BACKLOG);
    let held: f64 = (1..MEMBERS).map(backlog).sum();
    let thawed = Instant::now();
    cluster.node(FROZEN).signal("CONT");
    poll_until(
        "the accepting members' backlogs to drain",
        MEMBER_TIMEOUT,
        Duration::from_millis(5),
        || (1..MEMBERS).all(|id| backlog(id) == 0.0).then_some(()),
    );
    let drain_s = thawed.elapsed().as_secs_f64();
    cluster.wait_backlogs_drained();
    let after = frozen_stats(&cluster, &owners);
    let records = after.0 - before.0;
    let bytes = after.1 - before.1;
    let drain_per_s = records as f64 / drain_s.max(1e-3);
    let reroutes = cluster.metric_sum(REROUTES);
    eprintln!(
        "drain: member {FROZEN} (owner of {frozen_partitions} of {PARTITIONS} partitions) frozen \
         for {FREEZE:?}; the accepting members held {held} records above their checkpoints; its \
         partitions took {records} records, {:.2} MiB, drained {drain_s:.3} s after the thaw \
         ({drain_per_s:.0} records/s; steady produce before the freeze {steady_per_s:.0} records/s, \
         ratio {:.2}); records rerouted {reroutes}",
        bytes as f64 / (1024.0 * 1024.0),
        drain_per_s / steady_per_s.max(1e-3),
    );

    let replay = replay_all(cluster.node(1).addr(), TOPIC, PARTITIONS)
        .unwrap_or_else(|error| panic!("replay through node 1 failed: {error}"));
    ledger.check(&replay).assert_clean("after the drain");
    if std::env::var("DRAIN_ASSERT").is_ok_and(|value| value == "1") {
        assert!(
            drain_per_s >= steady_per_s / 2.0,
            "the backlog drained at {drain_per_s:.0} records/s, under half the produce rate \
             ({steady_per_s:.0} records/s)"
        );
    }
}
