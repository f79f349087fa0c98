//! Black-box tests of Basic auth, users and grants on real `narad` processes with auth on
//! ([`narad_tests::secure`]): the 401 challenge and the open probes, the per-username failure bucket,
//! produce/consume/create grants (checked before the query, the body and the topic's existence),
//! topic ownership, the root user's rules, grant and password changes taking effect at the next
//! request, users surviving a restart, the generated root password, and users shared by a cluster.
//!
//! Each test starts its own node (or cluster of three) on a fresh data dir and a free loopback port.

use std::path::Path;

use narad_tests::observe::{poll_until, wait_until};
use narad_tests::secure::{self, Login, SecureCluster, CHALLENGE, ROOT};
use narad_tests::{Node, Response};
use serde_json::{json, Value};

/// The root password every test seeds through `NARAD_ADMIN_PASSWORD`.
const ROOT_PASSWORD: &str = "root-password-1";
/// The body of every 401.
const UNAUTHENTICATED_BODY: &str = "{\"error\":\"authentication required\"}\n";
/// The body of every 429.
const THROTTLED: &str = "too many failed logins for this username; retry later";

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_narad"))
}

/// A single node with auth on, and the root's credentials.
fn start() -> (Node, Login) {
    (
        secure::start(binary(), Some(ROOT_PASSWORD)),
        Login::root(ROOT_PASSWORD),
    )
}

/// The message of a `{"error": "..."}` body (the body must be exactly that object).
fn error_of(response: &Response) -> String {
    let body = response.json();
    let object = body.as_object().expect("an error object");
    assert_eq!(object.len(), 1, "only an error field: {body}");
    object["error"]
        .as_str()
        .expect("an error string")
        .to_string()
}

/// The answer is `status` with the error `message`.
fn assert_error(response: &Response, status: u16, message: &str) {
    assert_eq!(response.status, status, "{}", response.text());
    assert_eq!(error_of(response), message);
}

/// The answer is a 403 whose error starts with `forbidden: ` and mentions `fragment`.
fn assert_forbidden(response: &Response, fragment: &str) {
    assert_eq!(response.status, 403, "{}", response.text());
    let message = error_of(response);
    assert!(
        message.starts_with("forbidden: ") && message.contains(fragment),
        "403 message {message:?} should be `forbidden: ...` naming {fragment:?}"
    );
}

/// The answer is the 401 challenge, header and body exactly.
fn assert_unauthenticated(response: &Response) {
    assert_eq!(response.status, 401, "{}", response.text());
    assert_eq!(response.header("www-authenticate"), Some(CHALLENGE));
    assert_eq!(response.text(), UNAUTHENTICATED_BODY);
}

/// The answer is the 429 of an empty failure bucket.
fn assert_throttled(response: &Response) {
    assert_eq!(response.status, 429, "{}", response.text());
    assert_eq!(response.header("retry-after"), Some("12"));
    assert_eq!(error_of(response), THROTTLED);
}

/// The answer is a 200 with a JSON body; returns it.
fn ok_json(response: &Response) -> Value {
    assert_eq!(response.status, 200, "{}", response.text());
    response.json()
}

/// Creates user `username` as `admin` (201 and the user JSON checked); returns its credentials.
fn create_user(node: &Node, admin: &Login, username: &str, password: &str, grants: Value) -> Login {
    let body = json!({ "username": username, "password": password, "grants": grants });
    let created = admin.post(node, "/v1/users", body.to_string().as_bytes());
    assert_eq!(created.status, 201, "{}", created.text());
    let user = created.json();
    assert_eq!(user["username"], username, "{user}");
    assert!(user["created_at_ms"].as_u64().is_some(), "{user}");
    assert!(user.get("root").is_none(), "{user}");
    assert!(user.get("password").is_none() && user.get("password_hash").is_none());
    Login::new(username, password)
}

/// Creates topic `name` (3 partitions) as `login`; returns the topic JSON.
fn create_topic(node: &Node, login: &Login, name: &str) -> Value {
    let body = json!({ "name": name, "partitions": 3 });
    let created = login.post(node, "/v1/topics", body.to_string().as_bytes());
    assert_eq!(created.status, 201, "{}", created.text());
    created.json()
}

/// `POST /v1/topics/{topic}/produce{query}` with a small payload.
fn produce(node: &Node, login: &Login, topic: &str, query: &str) -> Response {
    login.post(
        node,
        &format!("/v1/topics/{topic}/produce{query}"),
        b"{\"n\":1}",
    )
}

/// The answer is a produce's 202: durable, no body.
fn assert_accepted(response: &Response) {
    assert_eq!(response.status, 202, "{}", response.text());
    assert_eq!(response.header("narad-durability"), Some("local-wal-fsync"));
    assert!(response.body.is_empty(), "{}", response.text());
}

/// `PUT /v1/users/{username}/grants` as `admin`.
fn set_grants(node: &Node, admin: &Login, username: &str, grants: Value) -> Response {
    admin.put(
        node,
        &format!("/v1/users/{username}/grants"),
        json!({ "grants": grants }).to_string().as_bytes(),
    )
}

/// `PUT /v1/users/{username}/password` as `login`.
fn set_password(node: &Node, login: &Login, username: &str, body: Value) -> Response {
    login.put(
        node,
        &format!("/v1/users/{username}/password"),
        body.to_string().as_bytes(),
    )
}

/// Without credentials every route but `/healthz`, `/readyz` and `/metrics` answers the 401 challenge,
/// an unknown path included; wrong, unknown or malformed credentials answer it too.
#[test]
fn requests_without_valid_credentials_get_the_401_challenge() {
    let (node, root) = start();
    for (method, path) in [
        ("GET", "/v1/topics"),
        ("POST", "/v1/topics"),
        ("GET", "/v1/users"),
        ("GET", "/v1/openapi.json"),
        ("GET", "/v1/cluster/members"),
        ("GET", "/livez"),
    ] {
        let response = node.request(method, path, &[], b"{\"name\":\"x\"}");
        assert_unauthenticated(&response);
        assert_eq!(
            response.header("content-type"),
            Some("application/json"),
            "{method} {path}"
        );
    }
    assert_unauthenticated(&Login::root("wrong-password").get(&node, "/v1/topics"));
    assert_unauthenticated(&Login::new("nobody", ROOT_PASSWORD).get(&node, "/v1/topics"));
    for malformed in ["Bearer abc", "Basic !!!", "Basic YWRtaW4="] {
        let response = node.request("GET", "/v1/topics", &[("Authorization", malformed)], b"");
        assert_unauthenticated(&response);
    }

    let health = node.get("/healthz");
    assert_eq!(
        (health.status, health.text().as_str()),
        (200, "{\"status\":\"ok\"}\n")
    );
    let ready = node.get("/readyz");
    assert_eq!(
        (ready.status, ready.text().as_str()),
        (200, "{\"status\":\"ready\"}\n")
    );
    let metrics = node.get("/metrics");
    assert_eq!(metrics.status, 200);
    assert!(metrics.text().contains("narad_"), "{}", metrics.text());

    // The right credentials pass: the same routes answer.
    let topics = ok_json(&root.get(&node, "/v1/topics"));
    assert_eq!(topics, json!({"topics": [], "next_page_token": ""}));
    assert_eq!(root.get(&node, "/livez").status, 404);
    assert_eq!(root.get(&node, "/v1/openapi.json").status, 200);
}

/// Five wrong passwords empty a username's failure bucket: the sixth try is 429 with `Retry-After`,
/// and so is the right password then; other usernames keep their own buckets.
#[test]
fn six_wrong_passwords_throttle_that_username_only() {
    let (node, root) = start();
    let alice = create_user(&node, &root, "alice", "alice-password", json!([]));
    assert_eq!(alice.get(&node, "/v1/topics").status, 200);

    let wrong = Login::new("alice", "not-alice-password");
    for attempt in 1..=5 {
        let response = wrong.get(&node, "/v1/topics");
        assert_eq!(
            response.status,
            401,
            "attempt {attempt}: {}",
            response.text()
        );
        assert_unauthenticated(&response);
    }
    assert_throttled(&wrong.get(&node, "/v1/topics"));
    // Even the right password is refused while the bucket is empty.
    assert_throttled(&alice.get(&node, "/v1/topics"));

    // Other names are unaffected: root logs in, a wrong guess at another name is a plain 401.
    assert_eq!(
        ok_json(&root.get(&node, "/v1/users/alice"))["username"],
        "alice"
    );
    assert_unauthenticated(&Login::new("mallory", "whatever-pw").get(&node, "/v1/topics"));
}

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

/// The root user can't be deleted (by itself or another admin), nor its grants or password changed by
/// another admin; only root grants admin; a second admin still manages ordinary users; root changes
/// its own password only with the right `current_password`.
#[test]
fn the_root_user_is_protected_and_alone_grants_admin() {
    let (node, root) = start();
    assert_forbidden(&root.delete(&node, "/v1/users/admin"), "yourself");

    let ops = create_user(
        &node,
        &root,
        "ops",
        "ops-password",
        json!([{"action": "admin"}]),
    );
    assert_eq!(
        ok_json(&root.get(&node, "/v1/users/ops"))["grants"],
        json!([{"action": "admin", "patterns": []}])
    );
    let root_user = ok_json(&ops.get(&node, "/v1/users/admin"));
    assert_eq!(
        (&root_user["username"], &root_user["root"]),
        (&json!(ROOT), &json!(true))
    );

    assert_error(
        &ops.delete(&node, "/v1/users/admin"),
        403,
        "forbidden: the root user cannot be deleted",
    );
    assert_error(
        &set_grants(
            &node,
            &ops,
            ROOT,
            json!([{"action": "produce", "patterns": ["x"]}]),
        ),
        403,
        "forbidden: the root user's grants cannot change",
    );
    assert_eq!(
        ok_json(&root.get(&node, "/v1/users/admin")).get("grants"),
        None
    );
    assert_forbidden(
        &set_password(
            &node,
            &ops,
            ROOT,
            json!({"new_password": "taken-over-root"}),
        ),
        "root",
    );
    assert_forbidden(
        &set_password(
            &node,
            &ops,
            ROOT,
            json!({"current_password": ROOT_PASSWORD, "new_password": "taken-over-root"}),
        ),
        "root",
    );
    assert_unauthenticated(&Login::root("taken-over-root").get(&node, "/v1/topics"));
    // Only root grants admin: neither at creation nor by changing grants.
    let body =
        json!({"username": "ops2", "password": "ops2-password", "grants": [{"action": "admin"}]});
    assert_forbidden(
        &ops.post(&node, "/v1/users", body.to_string().as_bytes()),
        "admin",
    );
    assert_error(&root.get(&node, "/v1/users/ops2"), 404, "user not found");
    let writer = create_user(
        &node,
        &ops,
        "writer",
        "writer-password",
        json!([{"action": "produce", "patterns": ["logs"]}]),
    );
    assert_forbidden(
        &set_grants(&node, &ops, "writer", json!([{"action": "admin"}])),
        "admin",
    );
    assert_eq!(
        ok_json(&root.get(&node, "/v1/users/writer"))["grants"],
        json!([{"action": "produce", "patterns": ["logs"]}])
    );
    assert_eq!(writer.get(&node, "/v1/topics").status, 200);
    // The second admin can't delete itself either, but may delete an ordinary user.
    assert_forbidden(&ops.delete(&node, "/v1/users/ops"), "yourself");

    // Root's own password: the right current password is required.
    assert_forbidden(
        &set_password(
            &node,
            &root,
            ROOT,
            json!({"current_password": "not-the-root-pw", "new_password": "root-password-2"}),
        ),
        "current_password",
    );
    assert_eq!(root.get(&node, "/v1/topics").status, 200);
    let changed = set_password(
        &node,
        &root,
        ROOT,
        json!({"current_password": ROOT_PASSWORD, "new_password": "root-password-2"}),
    );
    assert_eq!(
        (changed.status, changed.body.len()),
        (204, 0),
        "{}",
        changed.text()
    );
    assert_unauthenticated(&root.get(&node, "/v1/topics"));
    assert_eq!(
        Login::root("root-password-2")
            .get(&node, "/v1/topics")
            .status,
        200
    );
}

/// A change of grants is seen by the holder's next request, and a deleted user's next request is a 401.
#[test]
fn grant_changes_and_deletions_take_effect_at_the_next_request() {
    let (node, root) = start();
    create_topic(&node, &root, "t1");
    let user = create_user(
        &node,
        &root,
        "flipper",
        "flipper-password",
        json!([{"action": "produce", "patterns": ["t*"]}]),
    );
    assert_accepted(&produce(&node, &user, "t1", "?partition=1"));

    let changed = ok_json(&set_grants(
        &node,
        &root,
        "flipper",
        json!([{"action": "consume", "patterns": ["t*"]}]),
    ));
    assert_eq!(
        changed["grants"],
        json!([{"action": "consume", "patterns": ["t*"]}])
    );
    assert_forbidden(&produce(&node, &user, "t1", "?partition=1"), "produce");
    // The consume grant holds: nothing was produced to partition 0, so the replay is empty.
    let replay = user.get(&node, "/v1/topics/t1/consume?partition=0&offset=0");
    assert_eq!(
        (replay.status, replay.body.len()),
        (204, 0),
        "{}",
        replay.text()
    );

    let restored = ok_json(&set_grants(
        &node,
        &root,
        "flipper",
        json!([{"action": "produce", "patterns": ["t*"]}]),
    ));
    assert_eq!(
        restored["grants"],
        json!([{"action": "produce", "patterns": ["t*"]}])
    );
    assert_accepted(&produce(&node, &user, "t1", "?partition=1"));

    let deleted = root.delete(&node, "/v1/users/flipper");
    assert_eq!((deleted.status, deleted.body.len()), (204, 0));
    assert_unauthenticated(&produce(&node, &user, "t1", "?partition=1"));
    assert_error(&root.get(&node, "/v1/users/flipper"), 404, "user not found");
    assert_error(
        &root.delete(&node, "/v1/users/flipper"),
        404,
        "user not found",
    );
}

/// A user changes its own password with `current_password` (missing: 400, wrong: 403); the old one
/// is refused at once and the new one accepted. A non-admin can't change another's password; an
/// admin can, without `current_password`.
#[test]
fn a_password_change_takes_effect_at_once() {
    let (node, root) = start();
    let carol = create_user(&node, &root, "carol", "carol-password", json!([]));
    let dave = create_user(&node, &root, "dave", "dave-password", json!([]));
    assert_eq!(carol.get(&node, "/v1/topics").status, 200);

    let missing = set_password(
        &node,
        &carol,
        "carol",
        json!({"new_password": "carol-password-2"}),
    );
    assert_eq!(missing.status, 400, "{}", missing.text());
    assert!(
        error_of(&missing).contains("current_password"),
        "{}",
        missing.text()
    );
    assert_forbidden(
        &set_password(
            &node,
            &carol,
            "carol",
            json!({"current_password": "wrong-password", "new_password": "carol-password-2"}),
        ),
        "current_password",
    );
    assert_forbidden(
        &set_password(
            &node,
            &carol,
            "dave",
            json!({"new_password": "dave-password-2"}),
        ),
        "own password",
    );
    assert_eq!(dave.get(&node, "/v1/topics").status, 200);

    let changed = set_password(
        &node,
        &carol,
        "carol",
        json!({"current_password": "carol-password", "new_password": "carol-password-2"}),
    );
    assert_eq!(
        (changed.status, changed.body.len()),
        (204, 0),
        "{}",
        changed.text()
    );
    assert_unauthenticated(&carol.get(&node, "/v1/topics"));
    let carol = Login::new("carol", "carol-password-2");
    assert_eq!(
        ok_json(&carol.get(&node, "/v1/topics")),
        json!({"topics": [], "next_page_token": ""})
    );

    // An admin resets another user's password without the current one.
    let reset = set_password(
        &node,
        &root,
        "dave",
        json!({"new_password": "dave-password-3"}),
    );
    assert_eq!(
        (reset.status, reset.body.len()),
        (204, 0),
        "{}",
        reset.text()
    );
    assert_unauthenticated(&dave.get(&node, "/v1/topics"));
    assert_eq!(
        Login::new("dave", "dave-password-3")
            .get(&node, "/v1/topics")
            .status,
        200
    );
}

/// Users and grants survive a restart on the same data dir, and the root seeded from
/// `NARAD_ADMIN_PASSWORD` is not seeded again: after a restart with another `NARAD_ADMIN_PASSWORD` the
/// first password still logs in and the new one does not.
#[test]
fn users_survive_a_restart_and_the_root_is_seeded_once() {
    let data = tempfile::tempdir().expect("data dir");
    let mut node = secure::start_in(binary(), data.path(), Some(ROOT_PASSWORD));
    let root = Login::root(ROOT_PASSWORD);
    let seeded = |node: &Node| {
        node.log()
            .iter()
            .any(|line| line.contains("seeded the root user from NARAD_ADMIN_PASSWORD"))
    };
    assert!(seeded(&node), "{}", node.log().join("\n"));
    create_topic(&node, &root, "keep");
    let keeper = create_user(
        &node,
        &root,
        "keeper",
        "keeper-password",
        json!([{"action": "produce", "patterns": ["keep"]}]),
    );
    assert_accepted(&produce(&node, &keeper, "keep", ""));

    node.restart();
    assert!(!seeded(&node), "seeded again:\n{}", node.log().join("\n"));
    assert_accepted(&produce(&node, &keeper, "keep", ""));
    assert_forbidden(&produce(&node, &keeper, "other", ""), "produce");
    let listed = ok_json(&root.get(&node, "/v1/users"));
    let users = listed["users"].as_array().expect("users");
    let names: Vec<&str> = users
        .iter()
        .map(|user| user["username"].as_str().expect("username"))
        .collect();
    assert_eq!(names, [ROOT, "keeper"]);
    assert_eq!(
        users[1]["grants"],
        json!([{"action": "produce", "patterns": ["keep"]}])
    );

    node.kill();
    drop(node);
    let node = secure::start_in(binary(), data.path(), Some("another-root-password"));
    assert_eq!(root.get(&node, "/v1/users/keeper").status, 200);
    assert_unauthenticated(&Login::root("another-root-password").get(&node, "/v1/topics"));
    assert!(
        !seeded(&node),
        "the root was seeded again:\n{}",
        node.log().join("\n")
    );
}

/// Without `NARAD_ADMIN_PASSWORD` the root gets a random password, logged once at WARN; it logs in.
#[test]
fn a_generated_root_password_is_logged_and_logs_in() {
    let node = secure::start(binary(), None);
    let log = node.log();
    let seeded: Vec<&String> = log
        .iter()
        .filter(|line| line.contains("seeded the root user with a generated password"))
        .collect();
    assert_eq!(seeded.len(), 1, "{}", log.join("\n"));
    assert!(seeded[0].contains("WARN"), "{}", seeded[0]);
    let password = secure::generated_password(seeded[0])
        .unwrap_or_else(|| panic!("no password= in {}", seeded[0]));
    assert!(password.len() >= 16, "a short password: {password:?}");

    let root = Login::root(&password);
    let me = ok_json(&root.get(&node, "/v1/users/admin"));
    assert_eq!((&me["username"], &me["root"]), (&json!(ROOT), &json!(true)));
    assert_unauthenticated(&Login::root(ROOT_PASSWORD).get(&node, "/v1/topics"));
}

/// The users API checks what it stores: names, password lengths, grant actions and patterns; grants
/// are normalized; names are unique; users are listed in name order; non-admins are refused.
#[test]
fn the_users_api_validates_and_normalizes() {
    let (node, root) = start();
    let post = |body: Value| root.post(&node, "/v1/users", body.to_string().as_bytes());

    let created = post(json!({
        "username": "norm.user_1-x",
        "password": "12345678",
        "grants": [
            {"action": "create", "patterns": ["b", "a"]},
            {"action": "produce", "patterns": ["z", "a", "z"]},
            {"action": "produce", "patterns": ["m*"]},
        ],
    }));
    assert_eq!(created.status, 201, "{}", created.text());
    let user = created.json();
    assert_eq!(
        user["grants"],
        json!([
            {"action": "produce", "patterns": ["a", "m*", "z"]},
            {"action": "create", "patterns": ["a", "b"]},
        ])
    );
    assert_eq!(user["created_at_ms"], user["updated_at_ms"]);
    let keys: Vec<&String> = user.as_object().expect("object").keys().collect();
    assert_eq!(
        keys,
        ["created_at_ms", "grants", "updated_at_ms", "username"]
    );
    // No grants: the field is left out.
    let bare = post(json!({"username": "bare", "password": "bare-password"}));
    assert_eq!(bare.status, 201, "{}", bare.text());
    let keys: Vec<String> = bare
        .json()
        .as_object()
        .expect("object")
        .keys()
        .cloned()
        .collect();
    assert_eq!(keys, ["created_at_ms", "updated_at_ms", "username"]);

    for (body, status) in [
        (
            json!({"username": "norm.user_1-x", "password": "12345678"}),
            409,
        ),
        (json!({"username": "bad name", "password": "12345678"}), 400),
        (json!({"username": "", "password": "12345678"}), 400),
        (
            json!({"username": "x".repeat(65), "password": "12345678"}),
            400,
        ),
        (json!({"username": "short", "password": "1234567"}), 400),
        (
            json!({"username": "long", "password": "p".repeat(1025)}),
            400,
        ),
        (
            json!({"username": "act", "password": "12345678", "grants": [{"action": "delete", "patterns": ["x"]}]}),
            400,
        ),
        (
            json!({"username": "adm", "password": "12345678", "grants": [{"action": "admin", "patterns": ["x"]}]}),
            400,
        ),
        (
            json!({"username": "nopat", "password": "12345678", "grants": [{"action": "produce"}]}),
            400,
        ),
    ] {
        let response = post(body.clone());
        assert_eq!(response.status, status, "{body}: {}", response.text());
        assert!(!error_of(&response).is_empty());
    }
    // The longest name and password are accepted.
    let longest = json!({"username": "y".repeat(64), "password": "p".repeat(1024)});
    assert_eq!(post(longest).status, 201);

    let listed = ok_json(&root.get(&node, "/v1/users"));
    let names: Vec<&str> = listed["users"]
        .as_array()
        .expect("users")
        .iter()
        .map(|user| user["username"].as_str().expect("username"))
        .collect();
    let y64 = "y".repeat(64);
    assert_eq!(names, [ROOT, "bare", "norm.user_1-x", y64.as_str()]);
    assert_error(&root.get(&node, "/v1/users/ghost"), 404, "user not found");

    // A user without the admin grant is refused every users route but its own password.
    let plain = Login::new("bare", "bare-password");
    assert_forbidden(&plain.get(&node, "/v1/users"), "admin");
    assert_forbidden(&plain.get(&node, "/v1/users/bare"), "admin");
    assert_forbidden(
        &plain.post(
            &node,
            "/v1/users",
            br#"{"username":"sneaky","password":"12345678"}"#,
        ),
        "admin",
    );
    assert_forbidden(&plain.delete(&node, "/v1/users/norm.user_1-x"), "admin");
    assert_forbidden(
        &set_grants(
            &node,
            &plain,
            "bare",
            json!([{"action": "produce", "patterns": ["*"]}]),
        ),
        "admin",
    );
    assert!(ok_json(&root.get(&node, "/v1/users/bare"))
        .get("grants")
        .is_none());
}

/// In a cluster of three with auth on, a user created through node 1 logs in on nodes 2 and 3 and
/// produces there per its grant; grants changed through node 3 hold on node 2.
#[test]
fn users_are_shared_by_every_cluster_member() {
    let cluster = SecureCluster::start(binary(), 3, "security-cluster-secret", ROOT_PASSWORD);
    let root = cluster.root().clone();

    let topic = json!({"name": "shared", "partitions": 3}).to_string();
    let created = cluster.request_retrying(1, &root, "POST", "/v1/topics", topic.as_bytes());
    assert_eq!(created.status, 201, "{}", created.text());
    assert_eq!(created.json()["owner"], ROOT);
    let user = json!({
        "username": "roamer",
        "password": "roamer-password",
        "grants": [{"action": "produce", "patterns": ["shared"]}],
    })
    .to_string();
    let created = cluster.request_retrying(1, &root, "POST", "/v1/users", user.as_bytes());
    assert_eq!(created.status, 201, "{}", created.text());
    let roamer = Login::new("roamer", "roamer-password");

    for id in [2, 3] {
        let node = cluster.node(id);
        // Asked as root (so that no failed login of roamer's is spent while it replicates).
        let seen = wait_until(&format!("node {id} to see roamer and topic shared"), || {
            let user = root.get(node, "/v1/users/roamer");
            let topic = root.get(node, "/v1/topics/shared");
            (user.status == 200 && topic.status == 200).then(|| user.json())
        });
        assert_eq!(
            seen["grants"],
            json!([{"action": "produce", "patterns": ["shared"]}])
        );
        for partition in 0..3 {
            // Every partition: some are owned by another member, so the produce is dispatched there.
            assert_accepted(&produce(
                node,
                &roamer,
                "shared",
                &format!("?partition={partition}"),
            ));
        }
        assert_forbidden(
            &roamer.get(node, "/v1/topics/shared/consume?partition=0&offset=0"),
            "consume",
        );
        assert_unauthenticated(&Login::new("roamer", "not-roamer-pw").get(node, "/v1/topics"));
    }

    let regranted = cluster.request_retrying(
        3,
        &root,
        "PUT",
        "/v1/users/roamer/grants",
        json!({"grants": [{"action": "consume", "patterns": ["shared"]}]})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(
        ok_json(&regranted)["grants"],
        json!([{"action": "consume", "patterns": ["shared"]}])
    );
    let node2 = cluster.node(2);
    poll_until(
        "node 2 to see roamer's new grants",
        narad_tests::cluster::MEMBER_TIMEOUT,
        narad_tests::cluster::CLUSTER_POLL_INTERVAL,
        || {
            let user = root.get(node2, "/v1/users/roamer");
            (user.status == 200
                && user.json()["grants"] == json!([{"action": "consume", "patterns": ["shared"]}]))
            .then_some(())
        },
    );
    assert_forbidden(&produce(node2, &roamer, "shared", ""), "produce");
    // The consume grant now holds on node 2: the records produced to partition 0 replay.
    let replayed = wait_until("roamer to replay partition 0 through node 2", || {
        let response = roamer.get(node2, "/v1/topics/shared/consume?partition=0&offset=0");
        match response.status {
            200 => Some(response.json()),
            204 => None,
            status => panic!("replay: {status} {}", response.text()),
        }
    });
    assert_eq!(
        (
            &replayed["topic"],
            &replayed["offset"],
            &replayed["payload"]
        ),
        (&json!("shared"), &json!(0), &json!({"n": 1}))
    );
}

/// A user carried over from the Go release with its bcrypt hash (`password_hash` instead of
/// `password`) logs in with its old password, and after a password change with the new one only; a
/// hash that is not bcrypt, or given beside a password, is refused.
#[test]
fn a_bcrypt_hash_from_the_go_release_is_imported_and_logs_in() {
    let (node, admin) = start();
    let hash = bcrypt::hash("go-era-password", 4).unwrap();
    let body = json!({
        "username": "legacy",
        "password_hash": hash,
        "grants": [{"action": "produce", "patterns": ["*"]}],
    });
    let created = admin.post(&node, "/v1/users", body.to_string().as_bytes());
    assert_eq!(created.status, 201, "{}", created.text());
    assert!(created.json().get("password_hash").is_none());
    create_topic(&node, &admin, "legacy-topic");
    let legacy = Login::new("legacy", "go-era-password");
    assert_accepted(&produce(&node, &legacy, "legacy-topic", ""));
    assert_unauthenticated(&produce(
        &node,
        &Login::new("legacy", "go-era-passwore"),
        "legacy-topic",
        "",
    ));
    let changed = set_password(
        &node,
        &legacy,
        "legacy",
        json!({"current_password": "go-era-password", "new_password": "rust-era-password"}),
    );
    assert_eq!(changed.status, 204, "{}", changed.text());
    assert_unauthenticated(&produce(&node, &legacy, "legacy-topic", ""));
    assert_accepted(&produce(
        &node,
        &Login::new("legacy", "rust-era-password"),
        "legacy-topic",
        "",
    ));
    for bad in [
        json!({"username": "x1", "password_hash": "$argon2id$v=19$m=1,t=1,p=1$c2FsdA$aGFzaA"}),
        json!({"username": "x2", "password_hash": "$2b$04$short"}),
        json!({"username": "x3", "password": "long-enough", "password_hash": hash}),
        json!({"username": "x4"}),
    ] {
        let refused = admin.post(&node, "/v1/users", bad.to_string().as_bytes());
        assert_eq!(refused.status, 400, "{bad}: {}", refused.text());
    }
}
