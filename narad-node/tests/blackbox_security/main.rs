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

mod grants;
mod users;

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
