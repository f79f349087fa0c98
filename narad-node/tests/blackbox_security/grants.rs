//! Produce and consume grants, and topic ownership.

use super::*;

/// A `produce` grant on `orders-*` lets its holder produce to `orders-eu` and nothing else: other
/// topics, consume (queue and replay) and ack are 403, and the 403 comes before the query, the body
/// and the topic's existence (a missing `billing2` is 403, a missing `orders-zz` 404).
#[test]
fn a_produce_grant_covers_its_pattern_and_nothing_else() {
    let (node, root) = start();
    create_topic(&node, &root, "orders-eu");
    create_topic(&node, &root, "billing");
    let producer = create_user(
        &node,
        &root,
        "producer",
        "producer-password",
        json!([{"action": "produce", "patterns": ["orders-*"]}]),
    );

    assert_accepted(&produce(&node, &producer, "orders-eu", ""));
    let batch = producer.post(
        &node,
        "/v1/topics/orders-eu/produce/batch",
        br#"{"messages":[{"payload":"a"},{"payload":"b"}]}"#,
    );
    assert_eq!(
        (batch.status, batch.text().as_str()),
        (202, "{\"accepted\":2}\n")
    );

    assert_forbidden(&produce(&node, &producer, "billing", ""), "produce");
    assert_forbidden(
        &producer.post(&node, "/v1/topics/billing/produce/batch", b"not json"),
        "produce",
    );
    // Before the query: a bad partition is not looked at.
    assert_forbidden(
        &produce(&node, &producer, "billing", "?partition=abc"),
        "produce",
    );
    assert_forbidden(
        &producer.get(&node, "/v1/topics/orders-eu/consume?wait=0s"),
        "consume",
    );
    assert_forbidden(
        &producer.get(&node, "/v1/topics/orders-eu/consume?partition=0&offset=0"),
        "consume",
    );
    assert_forbidden(
        &producer.post(&node, "/v1/topics/orders-eu/ack?receipt_handle=0:0:0", b""),
        "consume",
    );

    // Before the topic's existence.
    assert_forbidden(&produce(&node, &producer, "billing2", ""), "produce");
    assert_error(
        &produce(&node, &producer, "orders-zz", ""),
        404,
        "topic not found",
    );

    // A login is enough to read topics; the admin routes and topic creation are not.
    let listed = ok_json(&producer.get(&node, "/v1/topics"));
    let names: Vec<&str> = listed["topics"]
        .as_array()
        .expect("topics")
        .iter()
        .map(|topic| topic["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["billing", "orders-eu"]);
    assert_eq!(
        ok_json(&producer.get(&node, "/v1/topics/billing"))["name"],
        "billing"
    );
    assert_forbidden(&producer.get(&node, "/v1/cluster/members"), "admin");
    assert_forbidden(&producer.get(&node, "/v1/users"), "admin");
    assert_forbidden(
        &producer.post(&node, "/v1/topics", br#"{"name":"orders-new"}"#),
        "create",
    );
    assert_eq!(root.get(&node, "/v1/topics/orders-new").status, 404);
}

/// A `consume` grant covers replay (`?partition=&offset=`) and queue-mode consume with its ack; a
/// literal pattern matches only its own topic.
#[test]
fn a_consume_grant_covers_replay_queue_consume_and_ack() {
    let (node, root) = start();
    create_topic(&node, &root, "orders-us");
    create_topic(&node, &root, "orders-usa");
    let consumer = create_user(
        &node,
        &root,
        "consumer",
        "consumer-password",
        json!([{"action": "consume", "patterns": ["orders-us"]}]),
    );
    let produced = root.post(
        &node,
        "/v1/topics/orders-us/produce?partition=0",
        b"\"hello\"",
    );
    assert_accepted(&produced);

    // Dispatch is asynchronous: the record is replayable once visible (204 until then).
    let replayed = wait_until("the produced record to be replayable", || {
        let response = consumer.get(&node, "/v1/topics/orders-us/consume?partition=0&offset=0");
        match response.status {
            200 => Some(response.json()),
            204 => None,
            status => panic!("replay: {status} {}", response.text()),
        }
    });
    assert_eq!(
        (
            &replayed["topic"],
            &replayed["partition"],
            &replayed["offset"],
            &replayed["payload"]
        ),
        (&json!("orders-us"), &json!(0), &json!(0), &json!("hello"))
    );

    let leased = consumer.get(&node, "/v1/topics/orders-us/consume?wait=5s");
    let message = ok_json(&leased);
    assert_eq!(message["payload"], "hello", "{message}");
    let handle = message["receipt_handle"].as_str().expect("receipt_handle");
    let acked = consumer.post(
        &node,
        &format!("/v1/topics/orders-us/ack?receipt_handle={handle}"),
        b"",
    );
    assert_eq!(
        (acked.status, acked.body.len()),
        (204, 0),
        "{}",
        acked.text()
    );

    assert_forbidden(&produce(&node, &consumer, "orders-us", ""), "produce");
    assert_forbidden(
        &consumer.get(&node, "/v1/topics/orders-usa/consume?partition=0&offset=0"),
        "consume",
    );
}

/// `POST /v1/topics` needs a `create` grant matching the name and makes the caller the topic's owner;
/// only the owner or an admin may alter or delete it.
#[test]
fn create_sets_the_owner_who_with_admins_alone_manages_the_topic() {
    let (node, root) = start();
    let team = create_user(
        &node,
        &root,
        "team",
        "team-password",
        json!([{"action": "create", "patterns": ["team-*"]}]),
    );
    let other = create_user(
        &node,
        &root,
        "other",
        "other-password",
        json!([{"action": "create", "patterns": ["*"]}]),
    );

    let created = create_topic(&node, &team, "team-a");
    assert_eq!(created["owner"], "team", "{created}");
    assert_eq!(
        ok_json(&other.get(&node, "/v1/topics/team-a"))["owner"],
        "team"
    );
    assert_forbidden(
        &team.post(&node, "/v1/topics", br#"{"name":"other","partitions":3}"#),
        "create",
    );
    assert_eq!(root.get(&node, "/v1/topics/other").status, 404);

    let patch = br#"{"retention_ms":7200000}"#;
    assert_forbidden(&other.patch(&node, "/v1/topics/team-a", patch), "owner");
    assert_forbidden(&other.delete(&node, "/v1/topics/team-a"), "owner");
    assert_error(
        &other.patch(&node, "/v1/topics/team-b", patch),
        404,
        "topic not found",
    );
    assert_error(
        &other.delete(&node, "/v1/topics/team-b"),
        404,
        "topic not found",
    );

    let altered = ok_json(&team.patch(&node, "/v1/topics/team-a", patch));
    assert_eq!(
        (&altered["retention_ms"], &altered["owner"]),
        (&json!(7_200_000), &json!("team"))
    );
    let deleted = root.delete(&node, "/v1/topics/team-a");
    assert_eq!((deleted.status, deleted.body.len()), (204, 0));
    assert_error(
        &root.get(&node, "/v1/topics/team-a"),
        404,
        "topic not found",
    );

    // The user with `create` on `*` owns what it creates.
    let mine = create_topic(&node, &other, "elsewhere");
    assert_eq!(mine["owner"], "other", "{mine}");
}
