//! Black-box tests of the real `narad` binary: `narad serve --dev` on a free loopback port, topics over
//! HTTP, health, metrics, restart persistence and the configuration file. Produce and consume are in
//! `blackbox_produce.rs`.

use std::path::Path;
use std::process::Command;

use narad_tests::Node;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_narad"))
}

fn start() -> Node {
    Node::start(binary())
}

#[test]
fn health_and_readiness_answer_once_started() {
    let node = start();
    let health = node.get("/healthz");
    assert_eq!(
        (health.status, health.text().as_str()),
        (200, "{\"status\":\"ok\"}\n")
    );
    assert_eq!(health.header("content-type"), Some("application/json"));
    let ready = node.get("/readyz");
    assert_eq!(
        (ready.status, ready.text().as_str()),
        (200, "{\"status\":\"ready\"}\n")
    );
}

#[test]
fn topics_crud_over_http() {
    let node = start();
    let created = node.post("/v1/topics", br#"{"name":"orders","partitions":4}"#);
    assert_eq!(created.status, 201, "{}", created.text());
    let created_at = created.json()["created_at"].as_u64().unwrap();
    assert_eq!(
        created.text(),
        format!(
            "{{\"name\":\"orders\",\"partitions\":4,\"retention_ms\":604800000,\
             \"visibility_timeout_ms\":30000,\"max_in_flight_per_partition\":1024,\
             \"max_acked_ahead_per_partition\":1024,\"created_at\":{created_at}}}\n"
        )
    );

    let got = node.get("/v1/topics/orders");
    assert_eq!(got.status, 200);
    let stats = got.json()["partition_stats"].as_array().unwrap().clone();
    assert_eq!(stats.len(), 4);
    assert_eq!(
        stats[3].to_string(),
        "{\"high_watermark\":0,\"index\":3,\"next_offset\":0,\"oldest_offset\":0,\"owner_node\":\"1\",\"segments\":0,\"size_bytes\":0}"
    );
    let one = node.get("/v1/topics/orders?partition=2").json();
    assert_eq!(one["partition_stats"][0]["index"], 2);

    let altered = node.patch(
        "/v1/topics/orders",
        br#"{"partitions":6,"retention_ms":7200000}"#,
    );
    assert_eq!(altered.status, 200, "{}", altered.text());
    assert_eq!(altered.json()["partitions"], 6);
    assert_eq!(altered.json()["retention_ms"], 7_200_000);

    let listed = node.get("/v1/topics").json();
    assert_eq!(listed["topics"][0]["name"], "orders");
    assert_eq!(listed["next_page_token"], "");

    let deleted = node.delete("/v1/topics/orders");
    assert_eq!((deleted.status, deleted.body.len()), (204, 0));
    assert_eq!(node.get("/v1/topics/orders").status, 404);
    assert_eq!(node.delete("/v1/topics/orders").status, 404);
    assert_eq!(node.post("/v1/topics", br#"{"name":"orders"}"#).status, 201);
}

#[test]
fn validation_answers_the_surface_codes() {
    let node = start();
    assert_eq!(node.post("/v1/topics", br#"{"name":"dup"}"#).status, 201);
    let cases: [(&str, &str, &[u8], u16, &str); 10] = [
        (
            "POST",
            "/v1/topics",
            br#"{"name":"dup"}"#,
            409,
            "topic already exists",
        ),
        (
            "POST",
            "/v1/topics",
            br#"{"name":""}"#,
            400,
            "invalid argument: topic name required",
        ),
        (
            "POST",
            "/v1/topics",
            br#"{"name":"x","partitions":-1}"#,
            400,
            "invalid argument: partitions must not be negative",
        ),
        (
            "POST",
            "/v1/topics",
            br#"{"name":"x","partitions":109}"#,
            400,
            "invalid argument: partitions must be between 3 and 108",
        ),
        (
            "POST",
            "/v1/topics",
            br#"{"name":"x","retention_ms":-1}"#,
            400,
            "invalid argument: retention_ms must not be negative",
        ),
        ("GET", "/v1/topics/missing", b"", 404, "topic not found"),
        (
            "PATCH",
            "/v1/topics/dup",
            br#"{"partitions":2}"#,
            400,
            "invalid argument: partitions can only increase (topic has 3)",
        ),
        (
            "PATCH",
            "/v1/topics/dup",
            b"{}",
            400,
            "invalid argument: no field to change",
        ),
        (
            "GET",
            "/v1/topics?limit=0",
            b"",
            400,
            "invalid argument: limit must be a positive integer",
        ),
        (
            "GET",
            "/v1/topics/dup/consume?offset=1",
            b"",
            400,
            "partition required for replay-mode consume",
        ),
    ];
    for (method, path, body, status, message) in cases {
        let response = node.request(method, path, &[], body);
        assert_eq!(
            (
                response.status,
                response.json()["error"].as_str().unwrap_or_default()
            ),
            (status, message),
            "{method} {path}"
        );
    }
    let unknown = node.post("/v1/topics", br#"{"name":"x","colour":1}"#);
    assert_eq!(unknown.status, 400);
    assert!(
        unknown.text().contains("unknown field `colour`"),
        "{}",
        unknown.text()
    );

    let huge = format!(
        "{{\"name\":\"x\",\"schema\":\"{}\"}}",
        "a".repeat(1024 * 1024)
    );
    let too_large = node.post("/v1/topics", huge.as_bytes());
    assert_eq!(
        (too_large.status, too_large.text().as_str()),
        (413, "{\"error\":\"request body too large\"}\n")
    );

    let unmatched = node.get("/v2/nothing");
    assert_eq!(
        (unmatched.status, unmatched.text().as_str()),
        (404, "404 page not found\n")
    );
    assert_eq!(node.request("PUT", "/v1/topics", &[], b"").status, 405);
}

#[test]
fn list_pages_walk_every_topic_in_name_order() {
    let node = start();
    let mut names: Vec<String> = (0..7).map(|index| format!("t{index}")).collect();
    names.reverse();
    for name in &names {
        let body = format!("{{\"name\":\"{name}\"}}");
        assert_eq!(node.post("/v1/topics", body.as_bytes()).status, 201);
    }
    names.sort();
    let mut seen = Vec::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = node
            .get(&format!("/v1/topics?limit=3&page_token={token}"))
            .json();
        for topic in page["topics"].as_array().unwrap() {
            seen.push(topic["name"].as_str().unwrap().to_string());
        }
        token = page["next_page_token"].as_str().unwrap().to_string();
        if token.is_empty() {
            break;
        }
        assert_eq!(&token, seen.last().unwrap());
    }
    assert_eq!(seen, names);
}

#[test]
fn metrics_are_exposed_with_route_templates() {
    let node = start();
    node.post("/v1/topics", br#"{"name":"orders"}"#);
    node.get("/v1/topics/orders");
    let metrics = node.get("/metrics");
    assert_eq!(metrics.status, 200);
    assert!(metrics
        .header("content-type")
        .unwrap()
        .starts_with("application/openmetrics-text"));
    let text = metrics.text();
    for name in [
        "narad_ingress_dispatch_backlog_records",
        "narad_ingress_dispatch_backlog_bytes",
        "narad_ingress_dispatch_oldest_record_age_seconds",
        "narad_ingress_wal_failed",
        "narad_ingress_accepted_records",
        "narad_ingress_wal_fsync_duration_seconds",
        "narad_ingress_wal_group_commit_records",
        "narad_ingress_dispatch_commit_duration_seconds",
        "narad_ingress_dispatch_reroutes",
        "narad_accept_to_visible_seconds",
        "narad_errors",
        "narad_http_requests",
        "narad_http_request_duration_seconds",
        "narad_http_request_bytes_in",
        "narad_http_response_bytes_out",
        "narad_http_requests_in_flight",
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{text}"
        );
    }
    assert!(
        text.contains("narad_errors_total{component=\"http\",kind=\"5xx\"} 0\n"),
        "{text}"
    );
    assert!(text.contains(
        "narad_http_requests_total{route=\"GET /v1/topics/{topic}\",method=\"GET\",status=\"200\"} 1\n"
    ));
    assert!(text.contains(
        "narad_http_requests_total{route=\"POST /v1/topics\",method=\"POST\",status=\"201\"} 1\n"
    ));
}

#[test]
fn topics_survive_a_kill_and_restart() {
    let mut node = start();
    let created = node
        .post("/v1/topics", br#"{"name":"kept","partitions":5}"#)
        .json();
    assert_eq!(node.post("/v1/topics", br#"{"name":"gone"}"#).status, 201);
    assert_eq!(node.delete("/v1/topics/gone").status, 204);
    assert_eq!(
        node.patch("/v1/topics/kept", br#"{"partitions":7}"#).status,
        200
    );

    node.restart();

    let kept = node.get("/v1/topics/kept").json();
    assert_eq!(kept["partitions"], 7);
    assert_eq!(kept["created_at"], created["created_at"]);
    assert_eq!(node.get("/v1/topics/gone").status, 404);
    assert_eq!(node.post("/v1/topics", br#"{"name":"kept"}"#).status, 409);
    assert_eq!(node.post("/v1/topics", br#"{"name":"gone"}"#).status, 201);
    node.restart();
    let names: Vec<String> = node.get("/v1/topics").json()["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|topic| topic["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["gone", "kept"]);
}

#[test]
fn sigterm_stops_the_node_gracefully() {
    let mut node = start();
    let status = node.terminate();
    assert!(status.success(), "exit status {status}");
    let log = node.log().join("\n");
    assert!(log.contains("shutting down"), "{log}");
    assert!(log.contains("narad_node::server: stopped"), "{log}");
}

#[test]
fn a_config_file_with_an_unknown_key_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("narad.toml");
    std::fs::write(
        &config,
        "[storage]\ningress_wal_prealloc = false\ningress_wal_shards = 4\n",
    )
    .unwrap();
    let output = Command::new(binary())
        .args(["serve", "--dev", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("unknown field `ingress_wal_shards`"),
        "{stderr}"
    );
}
