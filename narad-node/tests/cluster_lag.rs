//! A remote owner whose metastore replica lags behind a delete and recreate, on real processes: the
//! `failpoints` build of the node (`cargo test -p narad-node --features failpoints --test
//! cluster_lag`), each member with its own `metastore-hold-file` failpoint. While one member's file
//! exists its raft replica keeps voting and committing, but the node goes on acting on the state from
//! before: the lagging replica of the produce-path spec's "Discarding" section.
//!
//! The topic is deleted and created again through the other members while one of them (a follower,
//! so the cluster's proposals never wait on it) is held. Records produced to partitions it owns are
//! 202'd by the accepting member, carry the new incarnation id, and are refused by the lagging owner
//! with 412 on the wire (counted on both sides), neither marking it failing nor rerouting anything,
//! and a read of the new incarnation forwarded to it is a retriable 503, not the old incarnation's
//! records and not 410.
//! Once the hold ends the same records commit into the new incarnation; nothing of the old
//! incarnation is visible in it, and every 202 is.

#![cfg(feature = "failpoints")]
#![allow(clippy::too_many_lines)] // A scenario on real processes reads best as one script.

use std::path::{Path, PathBuf};
use std::time::Duration;

use narad_tests::cluster::{Cluster, CLUSTER_POLL_INTERVAL, MEMBER_TIMEOUT};
use narad_tests::conn::Conn;
use narad_tests::ledger::{judge, Outcome, SharedLedger};
use narad_tests::load::{pause, replay_incarnation, ProducerSpec, Producers, Target};
use narad_tests::observe::{metric_sum, metrics_text, poll_until};
use narad_tests::{http, Node};

const SECRET: &str = "cluster-lag-secret";
const MEMBERS: u64 = 3;
const TOPIC: &str = "lag";
const PARTITIONS: u32 = 6;
const BATCH_MAX: usize = 8;
/// Records of the first incarnation each member's producers get acknowledged.
const FIRST_RECORDS: u64 = 200;
/// Records produced through each accepting member to each partition the held member owns.
const HELD_RECORDS: usize = 20;
/// Keyless records produced through each accepting member while the owner lags.
const KEYLESS_RECORDS: usize = 60;
/// How long the owner stays held after its first 412s: past the dispatcher's 3 s reroute grace, so a
/// 412 read as a failure of the destination would have rerouted the keyless records by then.
const HOLD_PAST_GRACE: Duration = Duration::from_secs(5);
/// How long the 412s are watched for while the member is held.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(20);
/// The owner-side and sender-side counters of 412s.
const REFUSALS: &str = "narad_cluster_incarnation_refusals_total";
const MISMATCHES: &str = "narad_ingress_dispatch_incarnation_mismatches_total";
const REROUTES: &str = "narad_ingress_dispatch_reroutes_total";
const BACKLOG: &str = "narad_ingress_dispatch_backlog_records";

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_narad"))
}

fn hold_file(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("hold-{id}"))
}

fn metric_on(node: &Node, name: &str) -> f64 {
    metric_sum(&metrics_text(node), name)
}

fn status(node: &Node, path: &str) -> u16 {
    http(node.addr(), "GET", path, &[], b"").map_or(0, |response| response.status)
}

/// The owners `on` lists for `topic`, once it lists `partitions` of them.
fn owners_on(cluster: &Cluster, on: u64, topic: &str) -> Vec<u64> {
    poll_until(
        &format!("node {on} to list topic {topic}"),
        MEMBER_TIMEOUT,
        CLUSTER_POLL_INTERVAL,
        || {
            let owners = cluster.try_owners(on, topic).ok()?;
            (owners.len() == PARTITIONS as usize).then_some(owners)
        },
    )
}

/// Produces `count` keyless records to `partition` through `node`, each registered in `ledger`;
/// every one must be answered 202.
/// `partition` `None`: keyless records, placed by the accepting member (and reroutable).
fn produce_to(node: &Node, ledger: &SharedLedger, partition: Option<u32>, count: usize) {
    let mut conn = Conn::new(node.addr());
    let path = match partition {
        Some(partition) => format!("/v1/topics/{TOPIC}/produce?partition={partition}"),
        None => format!("/v1/topics/{TOPIC}/produce"),
    };
    for _ in 0..count {
        let (attempt, records) = ledger.begin(TOPIC, vec![None]);
        let judged = judge(&conn.post(&path, &records[0].payload));
        ledger.complete(attempt, judged.clone());
        assert_eq!(judged.0, Outcome::Accepted, "{path}: {}", judged.1);
    }
}

#[test]
fn a_lagging_owner_answers_412_until_its_replica_catches_up() {
    let holds = tempfile::tempdir().expect("hold dir");
    let cluster = Cluster::start_with_env(binary(), MEMBERS as usize, SECRET, |id| {
        let spec = format!(
            "metastore-hold-file={}",
            hold_file(holds.path(), id).display()
        );
        vec![("NARAD_FAILPOINTS".to_string(), spec)]
    });
    cluster.node(1).create_topic(TOPIC, PARTITIONS);
    let first_owners = cluster.wait_topic(TOPIC, PARTITIONS);
    let ledger = SharedLedger::new();

    // The first incarnation, on every partition through every member.
    let groups: Vec<Producers> = cluster
        .ids()
        .into_iter()
        .map(|id| {
            let target = Target::new(cluster.node(id).addr());
            let specs = ProducerSpec::all_kinds(&format!("n{id}"), BATCH_MAX);
            Producers::start(TOPIC, &target, &ledger, specs)
        })
        .collect();
    for producers in &groups {
        let counts = producers
            .progress()
            .wait_until(REFUSAL_TIMEOUT, |counts| counts.acked >= FIRST_RECORDS);
        assert!(
            counts.acked >= FIRST_RECORDS,
            "first incarnation: {counts:?}"
        );
    }
    for producers in groups {
        producers.stop();
    }
    cluster.wait_backlogs_drained();

    // Hold a follower: the leader and the third member carry the deletes and creates.
    let leader = cluster.leader();
    let held = (1..=MEMBERS)
        .rev()
        .find(|&id| id != leader)
        .expect("a follower");
    let accepting: Vec<u64> = (1..=MEMBERS).filter(|&id| id != held).collect();
    let via = cluster.node(accepting[0]);
    std::fs::write(hold_file(holds.path(), held), b"").expect("hold file");
    poll_until(
        &format!("node {held} to log its metastore hold"),
        MEMBER_TIMEOUT,
        CLUSTER_POLL_INTERVAL,
        || {
            let log = cluster.node(held).log();
            log.iter()
                .any(|line| line.contains("metastore view held"))
                .then_some(())
        },
    );

    let deleted = via.delete(&format!("/v1/topics/{TOPIC}"));
    assert_eq!(deleted.status, 204, "{}", deleted.text());
    let incarnation = ledger.recreated(TOPIC);
    // Placement starts at the topic id modulo the members, and every create takes the next id: two
    // other topics first give the recreated one the same owners, so a partition the held member owns
    // is its own in both incarnations, and its refusal is the incarnation check's, not ownership's.
    for filler in 1..MEMBERS {
        via.create_topic(&format!("{TOPIC}-filler-{filler}"), 3);
    }
    via.create_topic(TOPIC, PARTITIONS);
    let owners = owners_on(&cluster, accepting[0], TOPIC);
    assert_eq!(
        owners, first_owners,
        "the recreated topic was placed differently; the test needs the held member to own the \
         same partitions in both incarnations"
    );
    let held_partitions: Vec<u32> = (0..PARTITIONS)
        .filter(|&partition| owners[partition as usize] == held)
        .collect();
    assert!(!held_partitions.is_empty(), "node {held} owns no partition");
    // The held member still shows the state from before the delete.
    assert_eq!(
        status(cluster.node(held), &format!("/v1/topics/{TOPIC}")),
        200
    );
    assert_eq!(
        status(cluster.node(held), &format!("/v1/topics/{TOPIC}-filler-1")),
        404,
        "node {held} applied a create while held"
    );

    let reroutes_before = cluster.metric_sum(REROUTES);
    for &id in &accepting {
        for &partition in &held_partitions {
            produce_to(cluster.node(id), &ledger, Some(partition), HELD_RECORDS);
        }
        // Keyless records too: some land on the held member's partitions, and a 412 read as a
        // failure would reroute them.
        produce_to(cluster.node(id), &ledger, None, KEYLESS_RECORDS);
    }
    let produced = (accepting.len() * held_partitions.len() * HELD_RECORDS) as f64;
    // 412 on the wire: answered by the lagging owner, read by the senders as a mismatch.
    poll_until(
        "the lagging owner to refuse the new incarnation's records with 412",
        REFUSAL_TIMEOUT,
        CLUSTER_POLL_INTERVAL,
        || {
            let refused = metric_on(cluster.node(held), REFUSALS);
            let mismatched: f64 = accepting
                .iter()
                .map(|&id| metric_on(cluster.node(id), MISMATCHES))
                .sum();
            (refused >= accepting.len() as f64 && mismatched >= accepting.len() as f64)
                .then_some(())
        },
    );
    // A read of the new incarnation names it: the lagging owner neither serves the old one's
    // records in its place nor calls the offset gone (a consumer would skip past a 410).
    let read = via.get(&format!(
        "/v1/topics/{TOPIC}/consume?partition={}&offset=0",
        held_partitions[0]
    ));
    assert_eq!(read.status, 503, "{}", read.text());
    assert!(
        read.text().contains("another incarnation"),
        "{}",
        read.text()
    );
    pause(HOLD_PAST_GRACE);
    let waiting: f64 = accepting
        .iter()
        .map(|&id| metric_on(cluster.node(id), BACKLOG))
        .sum();
    assert!(
        waiting >= produced,
        "only {waiting} of {produced} refused records still wait in the accepting members' WALs"
    );
    eprintln!(
        "while held: {} refusals answered, {} mismatches read, {waiting} records waiting",
        metric_on(cluster.node(held), REFUSALS),
        accepting
            .iter()
            .map(|&id| metric_on(cluster.node(id), MISMATCHES))
            .sum::<f64>()
    );
    assert_eq!(
        cluster.metric_sum(REROUTES),
        reroutes_before,
        "a 412 rerouted records"
    );

    // The hold ends: the replica's view catches up, and the waiting records commit where they were
    // sent, into the new incarnation.
    std::fs::remove_file(hold_file(holds.path(), held)).expect("hold file removed");
    cluster.wait_backlogs_drained();
    assert_eq!(
        cluster.metric_sum(REROUTES),
        reroutes_before,
        "records were rerouted on the way"
    );
    for id in cluster.ids() {
        let replay = replay_incarnation(cluster.node(id).addr(), TOPIC, incarnation, PARTITIONS)
            .unwrap_or_else(|error| panic!("replay through node {id} failed: {error}"));
        let verdict = ledger.check(&replay);
        eprintln!("through node {id}:\n{verdict}");
        let report = &verdict.report;
        assert!(verdict.is_ok(), "through node {id}:\n{verdict}");
        assert_eq!(
            (
                report.lost.len(),
                report.phantoms.len(),
                report.misplaced.len()
            ),
            (0, 0, 0),
            "through node {id}:\n{verdict}"
        );
        assert!(report.excused_deleted > 0, "{verdict}");
    }
}
