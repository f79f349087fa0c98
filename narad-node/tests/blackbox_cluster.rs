//! Black-box tests of a cluster of real `narad` processes on loopback ([`narad_tests::cluster`]):
//! forming, topics shared by every member, produces on any member dispatched to the partition's owner,
//! reads forwarded to it, `kill -9` of a partition owner and of the raft leader, a process with the
//! wrong cluster secret, and a topic deleted and recreated under the same name.
//!
//! Each test starts its own cluster of three, on fresh data dirs and free loopback ports; the harness
//! runs them one at a time (failure detection is timing). Loads are small (a few thousand records):
//! what is checked is where records end up, judged by the ledger (`narad_tests::ledger`) over a replay
//! of every partition — every 202'd record present, nothing never produced, every record under the
//! topic, incarnation and key it was produced with.

use std::path::Path;
use std::time::Duration;

use narad_core::PartitionId;
use narad_tests::cluster::{
    Cluster, AUTH_FAILURES, CLUSTER_POLL_INTERVAL, MEMBERS_ALIVE, MEMBER_TIMEOUT,
};
use narad_tests::conn::Conn;
use narad_tests::ledger::{judge, Observation, Outcome, SharedLedger, Verdict, INCARNATION};
use narad_tests::load::{pause, replay_all, replay_incarnation, ProducerSpec, Producers, Target};
use narad_tests::observe::{metric, metrics_text, poll_until};
use narad_tests::{http, Node};

/// The secret every member of a test cluster shares.
const SECRET: &str = "cluster-test-secret";
/// Members of every test cluster.
const MEMBERS: usize = 3;
/// Partitions of the test topics: two per member on average.
const PARTITIONS: u32 = 6;
/// Largest batch the batch producers send.
const BATCH_MAX: usize = 8;
/// Records each group of producers gets acknowledged in a stretch of load.
const STRETCH: u64 = 300;
/// Longest wait for a stretch of load (a cluster that stops accepting fails the test).
const LOAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How soon after the raft leader's death another member must be leader.
const ELECTION_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a process with the wrong secret is watched not becoming ready.
const NEVER_READY_WINDOW: Duration = Duration::from_secs(5);

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_narad"))
}

fn start() -> Cluster {
    Cluster::start(binary(), MEMBERS, SECRET)
}

/// Producers of the four kinds (keyed/keyless × single/batch) against member `id`'s address.
fn producers_on(cluster: &Cluster, id: u64, topic: &str, ledger: &SharedLedger) -> Producers {
    let target = Target::new(cluster.node(id).addr());
    let specs = ProducerSpec::all_kinds(&format!("n{id}"), BATCH_MAX);
    Producers::start(topic, &target, ledger, specs)
}

/// Waits until `producers` have `at_least` records acknowledged in all.
fn wait_acked(producers: &Producers, at_least: u64, what: &str) {
    let counts = producers
        .progress()
        .wait_until(LOAD_TIMEOUT, |counts| counts.acked >= at_least);
    assert!(
        counts.acked >= at_least,
        "{what}: only {} of {at_least} records acknowledged within {LOAD_TIMEOUT:?} ({counts:?})",
        counts.acked
    );
}

/// A stretch of load on every member (every kind of producer), stopped once each group has
/// [`STRETCH`] more records acknowledged; returns once every backlog drained.
fn load_every_member(cluster: &Cluster, topic: &str, ledger: &SharedLedger, what: &str) {
    let groups: Vec<Producers> = cluster
        .ids()
        .into_iter()
        .map(|id| producers_on(cluster, id, topic, ledger))
        .collect();
    wait_each_acked_more(&groups.iter().collect::<Vec<_>>(), STRETCH, what);
    for producers in groups {
        producers.stop();
    }
    cluster.wait_backlogs_drained();
}

/// Waits until every group has `more` records acknowledged beyond what it had.
fn wait_each_acked_more(groups: &[&Producers], more: u64, what: &str) {
    for (index, producers) in groups.iter().enumerate() {
        let from = producers.progress().counts().acked;
        wait_acked(producers, from + more, &format!("{what} (group {index})"));
    }
}

/// Produces `count` keyless single records to `topic` on `node` with the raw `query` (e.g.
/// `?partition=2`), each registered in `ledger`; every one must be answered 202. Returns their ids.
fn produce_registered(
    node: &Node,
    ledger: &SharedLedger,
    topic: &str,
    query: &str,
    count: usize,
) -> Vec<u64> {
    let mut conn = Conn::new(node.addr());
    let path = format!("/v1/topics/{topic}/produce{query}");
    (0..count)
        .map(|_| {
            let (attempt, records) = ledger.begin(topic, vec![None]);
            let judged = judge(&conn.post(&path, &records[0].payload));
            ledger.complete(attempt, judged.clone());
            assert_eq!(judged.0, Outcome::Accepted, "{path}: {}", judged.1);
            records[0].id
        })
        .collect()
}

/// Replays every partition of `topic` through member `id` (forwarded to each partition's owner).
fn replay_through(cluster: &Cluster, id: u64, topic: &str) -> Observation {
    replay_all(cluster.node(id).addr(), topic, PARTITIONS)
        .unwrap_or_else(|error| panic!("replay through node {id} failed: {error}"))
}

/// Judges a replay: nothing lost, invented or misplaced, something acknowledged.
fn assert_ledger_ok(ledger: &SharedLedger, replay: &Observation, what: &str) -> Verdict {
    let verdict = ledger.check(replay);
    eprintln!("{what}:\n{verdict}");
    verdict.assert_clean(what);
    verdict
}

/// `partition`'s high watermark as member `id` reports it (`GET /v1/topics/{t}?partition=N`).
fn high_watermark(cluster: &Cluster, id: u64, topic: &str, partition: u32) -> Option<u64> {
    let path = format!("/v1/topics/{topic}?partition={partition}");
    let response = http(cluster.node(id).addr(), "GET", &path, &[], b"").ok()?;
    if response.status != 200 {
        return None;
    }
    response.json()["partition_stats"][0]["high_watermark"].as_u64()
}

/// The partitions `owners` gives to member `id`.
fn owned_by(owners: &[u64], id: u64) -> Vec<u32> {
    (0..PARTITIONS)
        .filter(|&partition| owners[partition as usize] == id)
        .collect()
}

/// Waits until every live member's `narad_cluster_members_alive` gauge reads `alive`.
fn wait_members_alive_gauge(cluster: &Cluster, alive: u64) {
    poll_until(
        &format!("{MEMBERS_ALIVE} to read {alive} on every live member"),
        MEMBER_TIMEOUT,
        CLUSTER_POLL_INTERVAL,
        || {
            cluster
                .live_ids()
                .into_iter()
                .all(|id| {
                    let text = metrics_text(cluster.node(id));
                    metric(&text, MEMBERS_ALIVE) == Some(alive as f64)
                })
                .then_some(())
        },
    );
}

#[test]
fn a_three_node_cluster_forms_and_shares_topics() {
    let cluster = start();
    cluster.node(2).create_topic("shared", PARTITIONS);
    // Created through node 2, visible on 1 and 3 as well, with the same owners everywhere.
    let owners = cluster.wait_topic("shared", PARTITIONS);
    for id in [1, 3] {
        let topic = cluster
            .try_topic(id, "shared")
            .unwrap_or_else(|error| panic!("node {id}: {error}"));
        assert_eq!(topic["partitions"], PARTITIONS, "node {id}: {topic}");
    }
    assert!(
        owners.iter().all(|owner| cluster.ids().contains(owner)),
        "owners {owners:?} are not all members"
    );
    let distinct: std::collections::BTreeSet<u64> = owners.iter().copied().collect();
    assert!(
        distinct.len() >= 2,
        "every partition on one node: owners {owners:?}"
    );

    let leader = cluster.leader();
    for id in cluster.ids() {
        let members = cluster.members(id);
        let ids: Vec<u64> = members.iter().map(|member| member.id).collect();
        assert_eq!(ids, cluster.ids(), "node {id} lists {members:?}");
        assert!(
            members.iter().all(|member| member.is_alive()),
            "node {id}: {members:?}"
        );
        let leaders: Vec<u64> = members
            .iter()
            .filter(|member| member.leader)
            .map(|member| member.id)
            .collect();
        assert_eq!(leaders, [leader], "node {id}: {members:?}");
        for member in &members {
            assert_eq!(
                member.addr,
                cluster.addrs(member.id).cluster.to_string(),
                "node {id} lists member {} at another address",
                member.id
            );
        }
    }
    // Every member's count of owned partitions matches the topic's owners (it is the only topic).
    poll_until(
        "owned_partitions to match the topic's owners",
        MEMBER_TIMEOUT,
        CLUSTER_POLL_INTERVAL,
        || {
            cluster
                .members(1)
                .iter()
                .all(|member| member.owned_partitions == owned_by(&owners, member.id).len() as u64)
                .then_some(())
        },
    );
    wait_members_alive_gauge(&cluster, MEMBERS as u64);
    assert_eq!(
        cluster.metric_sum(AUTH_FAILURES),
        0.0,
        "members sharing the secret were refused"
    );
}

#[test]
fn produces_on_every_node_become_visible_on_their_owners() {
    const TOPIC: &str = "everywhere";
    let cluster = start();
    cluster.node(1).create_topic(TOPIC, PARTITIONS);
    let owners = cluster.wait_topic(TOPIC, PARTITIONS);
    let ledger = SharedLedger::new();
    let groups: Vec<Producers> = cluster
        .ids()
        .into_iter()
        .map(|id| producers_on(&cluster, id, TOPIC, &ledger))
        .collect();
    for (producers, id) in groups.iter().zip(cluster.ids()) {
        wait_acked(producers, 2 * STRETCH, &format!("producers on node {id}"));
    }
    for producers in groups {
        producers.stop();
    }
    cluster.wait_backlogs_drained();

    // Node 1 and node 3 each read every partition, most of them forwarded to another owner: both
    // must serve the same records, and the ledger must find every acknowledged one.
    let through_1 = replay_through(&cluster, 1, TOPIC);
    let through_3 = replay_through(&cluster, 3, TOPIC);
    let verdict = assert_ledger_ok(&ledger, &through_1, "replay through node 1");
    assert_ledger_ok(&ledger, &through_3, "replay through node 3");
    assert_eq!(
        through_1.served, through_3.served,
        "nodes 1 and 3 serve different records"
    );
    for partition in 0..PARTITIONS {
        assert!(
            through_1
                .served
                .iter()
                .any(|copy| copy.partition == PartitionId(partition)),
            "partition {partition} (owner {}) is empty",
            owners[partition as usize]
        );
    }
    // A healthy cluster forwards and dispatches without failing a produce.
    assert!(
        !verdict
            .ambiguous_reasons
            .keys()
            .any(|reason| reason.starts_with("status 5")),
        "produces failed in a healthy cluster:\n{verdict}"
    );
}

#[test]
fn kill_9_of_an_owner_reroutes_and_loses_nothing() {
    const TOPIC: &str = "owners";
    let mut cluster = start();
    cluster.node(1).create_topic(TOPIC, PARTITIONS);
    let owners = cluster.wait_topic(TOPIC, PARTITIONS);
    let leader = cluster.leader();
    let victim = cluster
        .ids()
        .into_iter()
        .find(|&id| id != leader && !owned_by(&owners, id).is_empty())
        .unwrap_or_else(|| panic!("no follower owns a partition: owners {owners:?}"));
    let victim_partition = owned_by(&owners, victim)[0];
    let others: Vec<u64> = cluster
        .ids()
        .into_iter()
        .filter(|&id| id != victim)
        .collect();
    eprintln!(
        "leader {leader}, victim {victim} (partitions {:?})",
        owned_by(&owners, victim)
    );

    let ledger = SharedLedger::new();
    let live_groups: Vec<Producers> = others
        .iter()
        .map(|&id| producers_on(&cluster, id, TOPIC, &ledger))
        .collect();
    // The victim takes records too: those it has not dispatched when it is killed must be dispatched
    // once it is back.
    let victim_group = producers_on(&cluster, victim, TOPIC, &ledger);
    wait_each_acked_more(
        &live_groups.iter().collect::<Vec<_>>(),
        STRETCH,
        "before the kill",
    );
    wait_acked(&victim_group, STRETCH, "producers on the victim");
    let backlog_at_kill = metric(
        &metrics_text(cluster.node(victim)),
        "narad_ingress_dispatch_backlog_records",
    );

    cluster.kill(victim);
    // Its producers' target stays at the dead address: connecting fails at once (never sent, not
    // registered), so they stop promptly.
    victim_group.stop();
    eprintln!("killed node {victim} with a backlog of {backlog_at_kill:?} records");
    cluster.wait_member_status(victim, "dead");
    wait_members_alive_gauge(&cluster, MEMBERS as u64 - 1);
    // Reads of its partitions have nowhere to go.
    for &id in &others {
        let path = format!("/v1/topics/{TOPIC}/consume?partition={victim_partition}&offset=0");
        let answer = cluster.node(id).get(&path);
        assert_eq!(
            answer.status,
            503,
            "node {id} {path} while its owner is down: {}",
            answer.text()
        );
        assert!(
            answer.text().contains("partition owner is down"),
            "{}",
            answer.text()
        );
    }
    // The live members keep accepting, and dispatch everything (its records rerouted to live
    // siblings) while it is down.
    wait_each_acked_more(
        &live_groups.iter().collect::<Vec<_>>(),
        STRETCH,
        "with the owner down",
    );
    for producers in live_groups {
        producers.stop();
    }
    cluster.wait_backlogs_drained();
    assert!(!cluster.is_up(victim));

    cluster.restart(victim);
    cluster.wait_member_status(victim, "alive");
    // What it had accepted itself before the kill is dispatched now.
    cluster.wait_backlogs_drained();
    // Its partition takes new records again, through another member.
    let before = high_watermark(&cluster, victim, TOPIC, victim_partition)
        .expect("the restarted owner reports its partition");
    let pinned = produce_registered(
        cluster.node(others[0]),
        &ledger,
        TOPIC,
        &format!("?partition={victim_partition}"),
        20,
    );
    poll_until(
        &format!("partition {victim_partition} to grow on node {victim}"),
        MEMBER_TIMEOUT,
        CLUSTER_POLL_INTERVAL,
        || {
            let mark = high_watermark(&cluster, victim, TOPIC, victim_partition)?;
            (mark >= before + pinned.len() as u64).then_some(())
        },
    );
    cluster.wait_backlogs_drained();

    let replay = replay_through(&cluster, others[0], TOPIC);
    assert_ledger_ok(
        &ledger,
        &replay,
        "replay after the owner's kill and restart",
    );
    for id in &pinned {
        assert!(
            replay.served.iter().any(|copy| {
                copy.partition == PartitionId(victim_partition) && copy.record_id() == Ok(*id)
            }),
            "record {id} produced to partition {victim_partition} is not there"
        );
    }
}

#[test]
fn kill_9_of_the_raft_leader_elects_a_new_one() {
    const TOPIC: &str = "leaders";
    let mut cluster = start();
    cluster.node(1).create_topic(TOPIC, PARTITIONS);
    cluster.wait_topic(TOPIC, PARTITIONS);
    let old_leader = cluster.leader();
    let followers: Vec<u64> = cluster
        .ids()
        .into_iter()
        .filter(|&id| id != old_leader)
        .collect();
    let ledger = SharedLedger::new();
    let groups: Vec<Producers> = followers
        .iter()
        .map(|&id| producers_on(&cluster, id, TOPIC, &ledger))
        .collect();
    let all: Vec<&Producers> = groups.iter().collect();
    wait_each_acked_more(&all, STRETCH, "before the leader's kill");

    cluster.kill(old_leader);
    let new_leader = cluster.leader_within(ELECTION_TIMEOUT);
    assert_ne!(new_leader, old_leader);
    eprintln!("leader {old_leader} killed; node {new_leader} leads");
    cluster.wait_member_status(old_leader, "dead");
    wait_each_acked_more(&all, STRETCH, "after the election");
    // The control plane works again: a new topic, created through the follower that does not lead
    // (forwarded to the new leader), is visible on both live members.
    let other = *followers
        .iter()
        .find(|&&id| id != new_leader)
        .expect("two followers");
    cluster.create_topic_retrying(other, "after-election", PARTITIONS);
    cluster.wait_topic("after-election", PARTITIONS);

    cluster.restart(old_leader);
    cluster.wait_member_status(old_leader, "alive");
    // The old leader learns what was decided while it was down.
    cluster.wait_topic("after-election", PARTITIONS);
    eprintln!("after the restart, node {} leads", cluster.leader());
    for producers in groups {
        producers.stop();
    }
    cluster.wait_backlogs_drained();
    let replay = replay_through(&cluster, new_leader, TOPIC);
    assert_ledger_ok(&ledger, &replay, "replay after the leader's kill");
}

#[test]
#[allow(clippy::disallowed_methods)] // Watching for an absence needs the real clock.
fn a_node_with_a_wrong_secret_never_joins() {
    let cluster = start();
    let started = std::time::Instant::now();
    let mut intruder = cluster.start_extra(4, "not-the-cluster-secret");
    // The members refuse its proof (and count it) ...
    poll_until(
        &format!("{AUTH_FAILURES} to count the intruder on a member"),
        MEMBER_TIMEOUT,
        CLUSTER_POLL_INTERVAL,
        || (cluster.metric_sum(AUTH_FAILURES) >= 1.0).then_some(()),
    );
    // ... and it stays out: no `ready` for the whole window.
    pause(NEVER_READY_WINDOW.saturating_sub(started.elapsed()));
    assert!(
        !intruder.logged_ready(),
        "a node with the wrong secret got ready:\n{}",
        intruder.log().join("\n")
    );
    let ready = http(intruder.addr(), "GET", "/readyz", &[], b"");
    assert!(
        !matches!(&ready, Ok(response) if response.status == 200),
        "/readyz of the intruder: {ready:?}"
    );
    for id in cluster.ids() {
        let members = cluster.members(id);
        assert!(
            members.iter().all(|member| member.id != 4),
            "node {id} lists the intruder: {members:?}"
        );
        assert_eq!(members.len(), MEMBERS, "node {id}: {members:?}");
        assert!(
            members.iter().all(|member| member.is_alive()),
            "node {id}: {members:?}"
        );
    }
    intruder.kill();
}

#[test]
fn delete_and_recreate_keeps_incarnations_apart() {
    const TOPIC: &str = "churn";
    let cluster = start();
    cluster.node(1).create_topic(TOPIC, PARTITIONS);
    cluster.wait_topic(TOPIC, PARTITIONS);
    let ledger = SharedLedger::new();

    // The first incarnation: records on every partition, all visible.
    load_every_member(&cluster, TOPIC, &ledger, "first incarnation");
    let old = replay_through(&cluster, 2, TOPIC);
    assert_ledger_ok(&ledger, &old, "the first incarnation");
    // More records right before the delete, some likely still undispatched when it lands: they are
    // discarded or land in the old incarnation, never in the new one.
    for id in cluster.ids() {
        produce_registered(cluster.node(id), &ledger, TOPIC, "", 50);
    }

    // Producers are stopped: every call is answered, so each record's incarnation is known.
    let deleted = cluster.node(2).delete(&format!("/v1/topics/{TOPIC}"));
    assert_eq!(deleted.status, 204, "{}", deleted.text());
    let incarnation = ledger.recreated(TOPIC);
    assert_ne!(incarnation, INCARNATION);
    poll_until(
        "every member to forget the deleted topic",
        MEMBER_TIMEOUT,
        CLUSTER_POLL_INTERVAL,
        || {
            cluster
                .ids()
                .into_iter()
                .all(|id| {
                    let path = format!("/v1/topics/{TOPIC}");
                    http(cluster.node(id).addr(), "GET", &path, &[], b"")
                        .is_ok_and(|response| response.status == 404)
                })
                .then_some(())
        },
    );
    cluster.node(3).create_topic(TOPIC, PARTITIONS);
    let owners = cluster.wait_topic(TOPIC, PARTITIONS);
    // Nothing is produced yet: every partition starts empty on its owner (no old log reused).
    for partition in 0..PARTITIONS {
        let owner = owners[partition as usize];
        assert_eq!(
            high_watermark(&cluster, owner, TOPIC, partition),
            Some(0),
            "partition {partition} of the recreated topic is not empty on its owner, node {owner}"
        );
    }

    // The second incarnation.
    load_every_member(&cluster, TOPIC, &ledger, "second incarnation");
    let new = replay_incarnation(cluster.node(1).addr(), TOPIC, incarnation, PARTITIONS)
        .unwrap_or_else(|error| panic!("replay of the recreated topic failed: {error}"));
    // A record of the first incarnation served here is misplaced; the first incarnation's records
    // are excused from being visible.
    let verdict = assert_ledger_ok(&ledger, &new, "the recreated topic");
    assert!(
        verdict.report.excused_deleted > 0,
        "no record of the first incarnation was excused:\n{verdict}"
    );
}

#[test]
fn a_fourth_member_is_a_learner_that_owns_partitions_and_takes_proposals() {
    let cluster = Cluster::start(binary(), 4, SECRET);
    // Created through the learner: forwarded to the leader, one of the three voters.
    cluster.node(4).create_topic("wide", 8);
    let owners = cluster.wait_topic("wide", 8);
    let leader = cluster.leader();
    assert!((1..=3).contains(&leader), "leader {leader} is not a voter");
    let on_learner: Vec<u32> = (0..8u32)
        .filter(|&partition| owners[partition as usize] == 4)
        .collect();
    assert!(
        !on_learner.is_empty(),
        "the learner owns nothing: {owners:?}"
    );
    // A record for the learner's partition, accepted by node 1, is read back through node 2.
    let partition = on_learner[0];
    let produced = http(
        cluster.node(1).addr(),
        "POST",
        &format!("/v1/topics/wide/produce?partition={partition}"),
        &[],
        b"to-the-learner",
    )
    .expect("produce answered");
    assert_eq!(produced.status, 202, "{}", produced.text());
    let path = format!("/v1/topics/wide/consume?partition={partition}&offset=0");
    let read = poll_until(
        "the record to be visible through node 2",
        MEMBER_TIMEOUT,
        CLUSTER_POLL_INTERVAL,
        || {
            let answer = http(cluster.node(2).addr(), "GET", &path, &[], b"").ok()?;
            (answer.status == 200).then_some(answer)
        },
    );
    assert!(read.text().contains("to-the-learner"), "{}", read.text());
}

/// Proposals a member misses while down, past the replicas' snapshot cadence (1,000 applied entries),
/// so it can only catch up from a snapshot.
const MISSED_PROPOSALS: usize = 1_100;

#[test]
fn a_member_that_missed_a_snapshot_s_worth_of_log_catches_up_from_a_snapshot() {
    let mut cluster = start();
    let leader = cluster.leader();
    let lagging = cluster
        .ids()
        .into_iter()
        .find(|&id| id != leader)
        .expect("a follower");
    cluster.kill(lagging);
    let mut conn = Conn::new(cluster.node(leader).addr());
    for round in 0..MISSED_PROPOSALS / 2 {
        let created = conn
            .post("/v1/topics", br#"{"name":"churn","partitions":3}"#)
            .expect("create answered");
        assert_eq!(created.status, 201, "round {round}: {}", created.text());
        let deleted = conn
            .request("DELETE", "/v1/topics/churn", &[], b"")
            .expect("delete answered");
        assert_eq!(deleted.status, 204, "round {round}: {}", deleted.text());
    }
    cluster.node(leader).create_topic("after", 3);
    cluster.restart(lagging);
    let owners = poll_until(
        "the restarted member to show the topic created while it was down",
        MEMBER_TIMEOUT,
        CLUSTER_POLL_INTERVAL,
        || cluster.try_owners(lagging, "after").ok(),
    );
    assert_eq!(owners.len(), 3);
    assert!(
        cluster.try_topic(lagging, "churn").is_err(),
        "churn is deleted"
    );
    cluster.wait_member_status(lagging, "alive");
}

/// The node RPC `Produce` op, sent by a peer: the test speaks as member 3 after its process was
/// killed (it holds the secret, as a restarted process would). Member 1 places each record with the
/// picker that walks past partitions of a dead owner, commits it on the owner (itself, or member 2
/// over `CommitProduce`), and answers once it is visible.
#[test]
fn a_synchronous_produce_skips_a_dead_owner_and_commits_on_a_remote_one() {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use narad_core::codec::cluster::{Control, ControlAnswer};
    use narad_core::ids::NodeId;
    use narad_core::routing::partition_for_key;
    use narad_node::cluster::tls::{NodeIdentity, TlsIdentity};
    use narad_node::cluster::{Cluster as Transport, ClusterOptions};
    use narad_node::metrics::Metrics;

    let mut cluster = start();
    cluster.node(1).create_topic("sync", PARTITIONS);
    let owners = cluster.wait_topic("sync", PARTITIONS);
    let owner = |partition: u32| owners[partition as usize];
    assert!(
        !owned_by(&owners, 2).is_empty() && !owned_by(&owners, 3).is_empty(),
        "owners {owners:?}"
    );
    cluster.kill(3);
    cluster.wait_member_status(3, "dead");
    let key_on = |id: u64| {
        (0..10_000)
            .map(|i| format!("key-{i}"))
            .find(|key| owner(partition_for_key(key.as_bytes(), PARTITIONS).0) == id)
            .expect("a key for every owner")
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let answers = runtime.block_on(async {
        let peers: BTreeMap<NodeId, String> = cluster
            .ids()
            .into_iter()
            .map(|id| (NodeId(id as u32), cluster.addrs(id).cluster.to_string()))
            .collect();
        let options = ClusterOptions {
            node: NodeId(3),
            bind: "127.0.0.1:0".parse().expect("an address"),
            peers,
            secret: SECRET.as_bytes().to_vec(),
            rng_seed: None,
        };
        let identity = TlsIdentity::SelfSigned(NodeIdentity::generate().expect("a certificate"));
        let me = Transport::bind(options, &identity, Arc::new(Metrics::new()))
            .await
            .expect("the test's transport");
        let mut answers = Vec::new();
        for (key, payload) in [(key_on(3), "skips-dead"), (key_on(2), "remote-owner")] {
            let body = Control::Produce {
                topic: "sync".to_string(),
                key: Some(key.into_bytes()),
                partition: None,
                payload: payload.as_bytes().to_vec(),
                budget_ms: 10_000,
            }
            .encode();
            let answer = me
                .call(NodeId(1), "produce", &body, Duration::from_secs(15))
                .await
                .expect("member 1 answers");
            answers.push((
                payload,
                ControlAnswer::decode(&answer).expect("a control answer"),
            ));
        }
        answers
    });
    for (payload, answer) in answers {
        let ControlAnswer::Produced { partition, offset } = answer else {
            panic!("{payload}: {answer:?}");
        };
        let hashed = |id| partition_for_key(key_on(id).as_bytes(), PARTITIONS).0;
        let expected = match payload {
            // Node 3's partition is skipped for the next one (wrapping) with a live owner.
            "skips-dead" => (1..PARTITIONS)
                .map(|step| (hashed(3) + step) % PARTITIONS)
                .find(|&p| owner(p) != 3)
                .expect("a live owner"),
            // Node 2's partition is kept: member 1 committed the record there.
            _ => hashed(2),
        };
        assert_eq!(partition.0, expected, "{payload}: owners {owners:?}");
        // Visible when answered: readable at once through member 2.
        let path = format!(
            "/v1/topics/sync/consume?partition={}&offset={}",
            partition.0, offset.0
        );
        let response = cluster.node(2).get(&path);
        assert_eq!(response.status, 200, "{payload}: {}", response.text());
        assert!(
            response.text().contains(payload),
            "{payload}: {}",
            response.text()
        );
    }
}

/// A queue-mode consume through member `id`: the message, or `None` on 204.
fn queue_consume(
    cluster: &Cluster,
    id: u64,
    topic: &str,
    query: &str,
) -> Option<serde_json::Value> {
    let path = format!("/v1/topics/{topic}/consume?{query}");
    let answer = http(cluster.node(id).addr(), "GET", &path, &[], b"").expect("consume");
    match answer.status {
        200 => Some(answer.json()),
        204 => None,
        status => panic!("node {id} {path}: {status} {}", answer.text()),
    }
}

/// An ack through member `id`; the status.
fn queue_ack(cluster: &Cluster, id: u64, topic: &str, handle: &str, extend: &str) -> u16 {
    let path = format!("/v1/topics/{topic}/ack?receipt_handle={handle}{extend}");
    http(cluster.node(id).addr(), "POST", &path, &[], b"")
        .expect("ack")
        .status
}

#[test]
#[allow(clippy::disallowed_methods)] // The long poll must be waiting before the record is produced.
fn queue_consume_on_any_member_leases_on_the_owner() {
    const TOPIC: &str = "queue";
    let mut cluster = start();
    cluster.node(1).create_topic(TOPIC, PARTITIONS);
    let owners = cluster.wait_topic(TOPIC, PARTITIONS);
    let produced: std::collections::BTreeSet<String> =
        (0..60).map(|index| format!("q-{index:02}")).collect();
    for (index, payload) in produced.iter().enumerate() {
        let member = (index % MEMBERS) as u64 + 1;
        let path = format!(
            "/v1/topics/{TOPIC}/produce?partition={}",
            index % PARTITIONS as usize
        );
        let answer = http(
            cluster.node(member).addr(),
            "POST",
            &path,
            &[],
            payload.as_bytes(),
        )
        .expect("produce");
        assert_eq!(answer.status, 202, "{}", answer.text());
    }
    cluster.wait_backlogs_drained();

    // Every record once, leased through node 2 (most partitions owned elsewhere), acked through
    // node 3 or node 1 (forwarded to the owner, which holds the lease).
    let mut consumed = std::collections::BTreeSet::new();
    let mut partitions = std::collections::BTreeSet::new();
    while consumed.len() < produced.len() {
        let message = queue_consume(&cluster, 2, TOPIC, "wait=2s")
            .unwrap_or_else(|| panic!("only {} of 60 consumed", consumed.len()));
        let handle = message["receipt_handle"]
            .as_str()
            .expect("handle")
            .to_string();
        partitions.insert(message["partition"].as_u64().expect("partition"));
        assert!(
            consumed.insert(message["payload"].as_str().expect("payload").to_string()),
            "delivered twice: {message}"
        );
        let via = if consumed.len() % 2 == 0 { 3 } else { 1 };
        assert_eq!(
            queue_ack(&cluster, via, TOPIC, &handle, ""),
            204,
            "{message}"
        );
        assert_eq!(
            queue_ack(&cluster, 2, TOPIC, &handle, ""),
            410,
            "acked twice"
        );
    }
    assert_eq!(consumed, produced);
    assert_eq!(partitions.len(), PARTITIONS as usize, "every owner served");
    assert_eq!(queue_consume(&cluster, 1, TOPIC, "wait=0s"), None);

    // A pinned consume forwarded to the owner long-polls there: a produce through a third member
    // answers it.
    let partition = 0u32;
    let owner = owners[partition as usize];
    let asker = cluster
        .ids()
        .into_iter()
        .find(|&id| id != owner)
        .expect("a non-owner");
    let producer = cluster
        .ids()
        .into_iter()
        .find(|&id| id != owner && id != asker)
        .expect("a third member");
    let addr = cluster.node(asker).addr();
    let poll = std::thread::spawn(move || {
        let path = format!("/v1/topics/{TOPIC}/consume?partition={partition}&wait=10s");
        http(addr, "GET", &path, &[], b"").expect("long poll")
    });
    std::thread::sleep(Duration::from_millis(300));
    let path = format!("/v1/topics/{TOPIC}/produce?partition={partition}");
    let answer = http(cluster.node(producer).addr(), "POST", &path, &[], b"late").expect("produce");
    assert_eq!(answer.status, 202);
    let answer = poll.join().expect("poll");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["payload"], "late");
    let handle = answer.json()["receipt_handle"]
        .as_str()
        .expect("handle")
        .to_string();
    assert_eq!(
        queue_ack(&cluster, producer, TOPIC, &handle, "&extend=0"),
        204
    );

    // The owner dies: its partition's pinned consumes and acks answer 503 once membership says so.
    cluster.kill(owner);
    poll_until(
        "a pinned consume of the dead owner's partition to answer 503",
        MEMBER_TIMEOUT,
        CLUSTER_POLL_INTERVAL,
        || {
            let path = format!("/v1/topics/{TOPIC}/consume?partition={partition}&wait=0s");
            let answer = http(cluster.node(asker).addr(), "GET", &path, &[], b"").ok()?;
            (answer.status == 503).then(|| answer.text())
        },
    );
    assert_eq!(queue_ack(&cluster, asker, TOPIC, &handle, ""), 503);
}
