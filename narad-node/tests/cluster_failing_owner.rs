//! An owner that is alive but whose commits fail, on real processes: the `failpoints` build of the
//! node (`cargo test -p narad-node --features failpoints --test cluster_failing_owner`). One member's
//! owner-journal syncs fail with EIO from the moment a clear file is removed, while its process,
//! heartbeats and metastore stay healthy (membership keeps it alive). Records produced through
//! another member to a partition it owns are rerouted to a live sibling after the produce-path
//! spec's 3 s of failed commits, not at once (that is the dead-owner path) and not never; once its
//! disk heals, its partition takes records again.

#![cfg(feature = "failpoints")]
#![allow(clippy::disallowed_methods)] // Timing the reroute of real processes needs the real clock.

use std::path::Path;
use std::time::{Duration, Instant};

use narad_tests::cluster::{Cluster, CLUSTER_POLL_INTERVAL, MEMBER_TIMEOUT};
use narad_tests::observe::{metric_sum, metrics_text, poll_until};
use narad_tests::{http, Node};

const SECRET: &str = "failing-owner-secret";
const MEMBERS: usize = 3;
const TOPIC: &str = "failing";
const PARTITIONS: u32 = 3;
/// The failing member (a journal EIO after its clear file goes).
const FAILING: u64 = 3;
/// Records produced to its partition while it fails.
const RECORDS: usize = 20;
/// The produce-path spec's reroute grace, less a margin for the first attempt's own latency.
const GRACE_FLOOR: Duration = Duration::from_millis(2_500);
/// The longest the reroute may take (the grace, a probe, a rescan, the reads).
const REROUTE_TIMEOUT: Duration = Duration::from_secs(20);
const REROUTES: &str = "narad_ingress_dispatch_reroutes_total";

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_narad"))
}

/// Every payload on `partition` of the topic, read through `node` (forwarded to the owner).
fn payloads(node: &Node, partition: u32) -> Vec<String> {
    let mut found = Vec::new();
    for offset in 0.. {
        let path = format!("/v1/topics/{TOPIC}/consume?partition={partition}&offset={offset}");
        let Ok(response) = http(node.addr(), "GET", &path, &[], b"") else {
            break;
        };
        if response.status != 200 {
            break;
        }
        found.push(
            response.json()["payload"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );
    }
    found
}

fn produce(node: &Node, partition: u32, payload: &str) {
    let path = format!("/v1/topics/{TOPIC}/produce?partition={partition}");
    let response = node.post(&path, payload.as_bytes());
    assert_eq!(response.status, 202, "{}", response.text());
}

#[test]
fn an_alive_owner_whose_commits_fail_is_rerouted_after_the_grace() {
    let faults = tempfile::tempdir().expect("fault dir");
    let clear = faults.path().join("clear");
    std::fs::write(&clear, b"").expect("clear file");
    let cluster = Cluster::start_with_env(binary(), MEMBERS, SECRET, |id| {
        if id != FAILING {
            return Vec::new();
        }
        let spec = format!(
            "owner-journal:eio-after-syncs=0;clear-file={}",
            clear.display()
        );
        vec![("NARAD_FAILPOINTS".to_string(), spec)]
    });
    cluster.node(1).create_topic(TOPIC, PARTITIONS);
    let owners = cluster.wait_topic(TOPIC, PARTITIONS);
    let failing_partition = (0..PARTITIONS)
        .find(|&partition| owners[partition as usize] == FAILING)
        .expect("the failing member owns a partition");
    let via = (1..=MEMBERS as u64)
        .find(|&id| id != FAILING)
        .expect("another member");
    let node = cluster.node(via);
    // Healthy first: a record to its partition lands there.
    produce(node, failing_partition, "before");
    poll_until(
        "the record before the failure to land on its own partition",
        MEMBER_TIMEOUT,
        CLUSTER_POLL_INTERVAL,
        || {
            payloads(node, failing_partition)
                .contains(&"before".to_string())
                .then_some(())
        },
    );
    cluster.wait_backlogs_drained();

    std::fs::remove_file(&clear).expect("arm the failpoint");
    let reroutes_before = metric_sum(&metrics_text(node), REROUTES);
    let produced_at = Instant::now();
    for index in 0..RECORDS {
        produce(node, failing_partition, &format!("during-{index}"));
    }
    let wanted: Vec<String> = (0..RECORDS)
        .map(|index| format!("during-{index}"))
        .collect();
    let mut early = None;
    // The destination keeps one record as its probe, retried on the owner once a second and never
    // rerouted (it lands on its own partition once the owner heals): every other one reroutes.
    let visible_after = poll_until(
        "every record but the probe to be visible on a sibling of the failing owner's partition",
        REROUTE_TIMEOUT,
        Duration::from_millis(50),
        || {
            let mut seen: Vec<String> = (0..PARTITIONS)
                .filter(|&partition| partition != failing_partition)
                .flat_map(|partition| payloads(node, partition))
                .collect();
            seen.retain(|payload| payload.starts_with("during-"));
            if !seen.is_empty() && early.is_none() {
                early = Some(produced_at.elapsed());
            }
            let rerouted = wanted
                .iter()
                .filter(|payload| seen.contains(payload))
                .count();
            (rerouted >= RECORDS - 1).then(|| produced_at.elapsed())
        },
    );
    let first = early.unwrap_or(visible_after);
    assert!(
        first >= GRACE_FLOOR,
        "records rerouted after {first:?}: before the 3 s grace of a failing (not dead) owner"
    );
    // Nothing of them on the failing partition, and the owner is alive throughout.
    let on_failing = payloads(node, failing_partition);
    assert!(
        on_failing
            .iter()
            .all(|payload| !payload.starts_with("during-")),
        "{on_failing:?}"
    );
    let members = cluster.members(via);
    let failing = members
        .iter()
        .find(|member| member.id == FAILING)
        .expect("the failing member is listed");
    assert!(failing.is_alive(), "{members:?}: the owner was marked dead");
    let reroutes = metric_sum(&metrics_text(node), REROUTES) - reroutes_before;
    assert!(
        reroutes >= (RECORDS - 1) as f64,
        "{reroutes} reroutes counted"
    );
    eprintln!("rerouted: first visible after {first:?}, all after {visible_after:?}");

    // Healed: the probe lands on the owner's own partition, and so do new records.
    std::fs::write(&clear, b"").expect("heal the disk");
    poll_until(
        "every record to be visible, and a new one on the healed owner's partition",
        REROUTE_TIMEOUT,
        Duration::from_millis(200),
        || {
            produce(node, failing_partition, "after");
            let everywhere: Vec<String> = (0..PARTITIONS)
                .flat_map(|partition| payloads(node, partition))
                .collect();
            let own = payloads(node, failing_partition);
            (wanted.iter().all(|payload| everywhere.contains(payload))
                && own.contains(&"after".to_string()))
            .then_some(())
        },
    );
}
