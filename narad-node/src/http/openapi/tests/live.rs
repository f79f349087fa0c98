//! A node's router over a socket, with in-memory seams: a request of every operation, each
//! answer checked against the document.

use std::sync::Arc;

use narad_core::codec::wal::ProduceRecord;
use narad_core::disk::sim::SimDisk;
use narad_core::ids::{NodeId, Offset, PartitionId};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::http::{
    router, BoxFuture, Leased, PartitionReader, PartitionStat, PartitionStats, ProduceSink,
    QueueConsumer, QueueLimits, QueueOutcome, ReadOutcome, ReceiptHandle, ReplayError, Settle,
    SettleOutcome, StoredRecord, TopicKey,
};
use crate::http::{App, MoveSettings, BODY_BYTES_MAX};
use crate::metastore::{Metastore, MetastoreOptions};
use crate::metrics::Metrics;

/// Accepts every append.
struct Sink;

impl ProduceSink for Sink {
    fn append(&self, _: ProduceRecord) -> BoxFuture<'_, Result<(), crate::ingress::WalError>> {
        Box::pin(async { Ok(()) })
    }
    fn append_many(
        &self,
        _: Vec<ProduceRecord>,
    ) -> BoxFuture<'_, Result<(), crate::ingress::WalError>> {
        Box::pin(async { Ok(()) })
    }
}

/// Offset 0: binary payload, no key; offset 1: JSON payload with a key; 2: gone; past: end.
struct Log;

fn record(offset: u64) -> StoredRecord {
    match offset {
        0 => StoredRecord {
            offset: Offset(0),
            key: None,
            payload: vec![0xff, 0x00, 0x7f],
            committed_at_ms: 1_700_000_000_123,
        },
        _ => StoredRecord {
            offset: Offset(offset),
            key: Some(b"customer-42".to_vec()),
            payload: br#"{"total":12,"note":"<&>"}"#.to_vec(),
            committed_at_ms: 1_700_000_001_000,
        },
    }
}

impl PartitionReader for Log {
    fn read(
        &self,
        _: &TopicKey,
        _: PartitionId,
        offset: Offset,
    ) -> BoxFuture<'_, Result<ReadOutcome, ReplayError>> {
        let outcome = match offset.0 {
            0 | 1 => ReadOutcome::Record(record(offset.0)),
            2 => ReadOutcome::Gone,
            _ => ReadOutcome::PastEnd,
        };
        Box::pin(async move { Ok(outcome) })
    }
}

impl PartitionStats for Log {
    fn partition_stat(&self, _: &TopicKey, _: PartitionId) -> BoxFuture<'_, PartitionStat> {
        let stat = PartitionStat {
            segments: 1,
            oldest_offset: Offset(0),
            next_offset: Offset(2),
            high_watermark: Offset(2),
            size_bytes: 200,
            oldest_segment_at_s: Some(1_700_000_000),
        };
        Box::pin(async move { stat })
    }
}

/// Leases offset 1 of the pinned partition (or 0) with nonce 7; settles nonce 7 only.
struct Queue;

impl QueueConsumer for Queue {
    fn consume(
        &self,
        _: &TopicKey,
        _: QueueLimits,
        _: u32,
        pinned: Option<PartitionId>,
        _: std::time::Duration,
    ) -> BoxFuture<'_, QueueOutcome> {
        let partition = pinned.unwrap_or(PartitionId(0));
        let outcome = QueueOutcome::Leased(Leased {
            partition,
            record: record(1),
            handle: ReceiptHandle {
                partition,
                offset: Offset(1),
                nonce: 7,
            },
        });
        Box::pin(async move { outcome })
    }

    fn settle(
        &self,
        _: &TopicKey,
        handle: ReceiptHandle,
        _: Settle,
    ) -> BoxFuture<'_, SettleOutcome> {
        let outcome = if handle.nonce == 7 {
            SettleOutcome::Done
        } else {
            SettleOutcome::Stale
        };
        Box::pin(async move { outcome })
    }
}

async fn app() -> Arc<App> {
    let metastore = Metastore::open(
        Arc::new(SimDisk::new(1)),
        MetastoreOptions::new(NodeId(1), "127.0.0.1:7943".to_string()),
    )
    .await
    .unwrap();
    metastore
        .wait_until(|view| view.state.members().contains_key(&NodeId(1)))
        .await
        .unwrap();
    let log = Arc::new(Log);
    Arc::new(
        App::new(
            metastore,
            Arc::new(Sink),
            log.clone(),
            log,
            Arc::new(Queue),
            Arc::new(Metrics::new()),
            7,
        )
        .with_auth(true)
        // A cluster member, so that the move routes answer (the other members are added below).
        .with_moves(MoveSettings {
            clustered: true,
            ..MoveSettings::default()
        }),
    )
}

/// `admin:root-password`, the root user the live node is seeded with.
const ROOT: &str = "Basic YWRtaW46cm9vdC1wYXNzd29yZA==";
/// `prod:prod-password`: a user granted produce on `orders` only.
const PROD: &str = "Basic cHJvZDpwcm9kLXBhc3N3b3Jk";
/// `ghost:wrong-password`: no such user.
const GHOST: &str = "Basic Z2hvc3Q6d3JvbmctcGFzc3dvcmQ=";

async fn seed_root(app: &App) {
    use narad_core::metastore::users::CreateUser;
    use narad_core::metastore::Command;
    let command = Command::CreateUser(CreateUser {
        username: "admin".to_string(),
        password_hash: crate::http::auth::hash_password("root-password"),
        grants: Vec::new(),
        root: true,
        at_ms: 1,
    });
    app.metastore.propose(command).await.unwrap();
}

/// Members 2, 3 and 4: with the node, three voters and one learner (4), the only member that may be
/// decommissioned.
async fn seed_members(app: &App) {
    use narad_core::metastore::Command;
    for id in 2..=4 {
        let command = Command::AddMember {
            node: NodeId(id),
            addr: format!("127.0.0.{id}:7943"),
        };
        app.metastore.propose(command).await.unwrap();
    }
}

struct Answer {
    status: u16,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

/// One HTTP/1.1 exchange on a fresh connection (`Connection: close`).
async fn send(
    addr: std::net::SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nHost: narad\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    // Root's credentials unless the case brings its own.
    if !headers.iter().any(|(name, _)| *name == "Authorization") {
        head.push_str(&format!("Authorization: {ROOT}\r\n"));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let split = raw
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .expect("a complete head");
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_lowercase(), value.trim().to_string()))
        .collect();
    Answer {
        status: status.parse().unwrap(),
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

fn essence(media: &str) -> String {
    media.split(';').next().unwrap().trim().to_lowercase()
}

/// The answer's status, `Content-Type`, headers and JSON body are ones `operation` documents.
fn check(doc: &Value, method: &str, path: &str, request: &str, answer: &Answer) {
    let what = format!("{request} → {}", answer.status);
    let responses = responses(doc, method, path);
    let response = responses
        .get(&answer.status)
        .unwrap_or_else(|| panic!("{what}: status not documented"));
    let content_type = answer.headers.get("content-type");
    match response.get("content").and_then(Value::as_object) {
        None => {
            assert_eq!(content_type, None, "{what}: no Content-Type");
            assert!(answer.body.is_empty(), "{what}: no body");
        }
        Some(content) => {
            let content_type =
                content_type.unwrap_or_else(|| panic!("{what}: Content-Type missing"));
            let (_, media) = content
                .iter()
                .find(|(media, _)| essence(media) == essence(content_type))
                .unwrap_or_else(|| panic!("{what}: Content-Type {content_type}"));
            if essence(content_type) == "application/json" {
                assert!(answer.body.ends_with(b"\n"), "{what}: final newline");
                let body: Value = serde_json::from_slice(&answer.body)
                    .unwrap_or_else(|error| panic!("{what}: not JSON: {error}"));
                let errors = violations(&compile(doc, &media["schema"]), &body);
                assert!(errors.is_empty(), "{what}: {body}: {errors:#?}");
            }
        }
    }
    for (name, header) in response
        .get("headers")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        let header = resolve(doc, header);
        let value = answer.headers.get(&name.to_lowercase());
        if header["required"] == true {
            assert!(value.is_some(), "{what}: header {name} missing");
        }
        if let Some(value) = value {
            let errors = violations(&compile(doc, &header["schema"]), &json!(value));
            assert!(errors.is_empty(), "{what}: header {name}: {errors:#?}");
        }
    }
}

/// `(operation method, operation path, request target, headers, body, expected status)`.
type Case = (
    &'static str,
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [u8],
    u16,
);

const CASES: &[Case] = &[
            ("GET", "/readyz", "/readyz", &[], b"", 200),
            ("GET", "/healthz", "/healthz", &[], b"", 200),
            ("GET", "/metrics", "/metrics", &[], b"", 200),
            ("GET", "/v1/openapi.json", "/v1/openapi.json", &[], b"", 200),
            ("GET", "/v1/cluster/members", "/v1/cluster/members", &[], b"", 200),
            ("GET", "/v1/topics", "/v1/topics", &[("Authorization", "Bearer x")], b"", 401),
            ("GET", "/v1/topics", "/v1/topics", &[("Authorization", GHOST)], b"", 401),
            ("POST", "/v1/users", "/v1/users", &[],
                br#"{"username":"prod","password":"prod-password","grants":[{"action":"produce","patterns":["orders"]}]}"#, 201),
            ("POST", "/v1/users", "/v1/users", &[], br#"{"username":"prod","password":"prod-password"}"#, 409),
            ("POST", "/v1/users", "/v1/users", &[], br#"{"username":"x","password":"short"}"#, 400),
            ("POST", "/v1/users", "/v1/users", &[("Authorization", PROD)], br#"{"username":"x","password":"long-enough"}"#, 403),
            ("GET", "/v1/users", "/v1/users", &[], b"", 200),
            ("GET", "/v1/cluster/members", "/v1/cluster/members", &[("Authorization", PROD)], b"", 403),
            ("GET", "/v1/users/{username}", "/v1/users/prod", &[], b"", 200),
            ("GET", "/v1/users/{username}", "/v1/users/admin", &[], b"", 200),
            ("GET", "/v1/users/{username}", "/v1/users/nobody", &[], b"", 404),
            ("PUT", "/v1/users/{username}/grants", "/v1/users/prod/grants", &[],
                br#"{"grants":[{"action":"produce","patterns":["orders"]},{"action":"consume","patterns":["audit-*"]}]}"#, 200),
            ("PUT", "/v1/users/{username}/grants", "/v1/users/admin/grants", &[], br#"{"grants":[]}"#, 403),
            ("PUT", "/v1/users/{username}/grants", "/v1/users/prod/grants", &[], br#"{"grants":[{"action":"fly"}]}"#, 400),
            ("PUT", "/v1/users/{username}/grants", "/v1/users/nobody/grants", &[], br#"{"grants":[]}"#, 404),
            ("PUT", "/v1/users/{username}/password", "/v1/users/prod/password", &[("Authorization", PROD)],
                br#"{"current_password":"wrong-password","new_password":"prod-password"}"#, 403),
            ("PUT", "/v1/users/{username}/password", "/v1/users/prod/password", &[("Authorization", PROD)],
                br#"{"current_password":"prod-password","new_password":"prod-password"}"#, 204),
            ("PUT", "/v1/users/{username}/password", "/v1/users/nobody/password", &[], br#"{"new_password":"long-enough"}"#, 404),
            ("PUT", "/v1/users/{username}/password", "/v1/users/prod/password", &[], br#"{"new_password":"x"}"#, 400),
            ("POST", "/v1/topics", "/v1/topics", &[], br#"{"name":"orders","partitions":4}"#, 201),
            ("POST", "/v1/topics", "/v1/topics", &[], br#"{"name":"orders"}"#, 409),
            ("POST", "/v1/topics", "/v1/topics", &[], br#"{"name":"a/b"}"#, 400),
            ("POST", "/v1/topics", "/v1/topics", &[], br#"{"name":"x","extra":1}"#, 400),
            ("POST", "/v1/topics", "/v1/topics", &[], br#"{"name":"x","partitions":2}"#, 400),
            ("POST", "/v1/topics", "/v1/topics", &[], b"", 400),
            ("GET", "/v1/topics", "/v1/topics", &[], b"", 200),
            ("GET", "/v1/topics", "/v1/topics?limit=1&page_token=", &[], b"", 200),
            ("GET", "/v1/topics", "/v1/topics?limit=0", &[], b"", 400),
            ("GET", "/v1/topics/{topic}", "/v1/topics/orders", &[], b"", 200),
            ("GET", "/v1/topics/{topic}", "/v1/topics/orders?partition=3", &[], b"", 200),
            ("GET", "/v1/topics/{topic}", "/v1/topics/orders?partition=4", &[], b"", 400),
            ("GET", "/v1/topics/{topic}", "/v1/topics/nope", &[], b"", 404),
            ("PATCH", "/v1/topics/{topic}", "/v1/topics/orders", &[], br#"{"retention_ms":7200000}"#, 200),
            ("PATCH", "/v1/topics/{topic}", "/v1/topics/orders", &[], b"{}", 400),
            ("PATCH", "/v1/topics/{topic}", "/v1/topics/orders", &[], br#"{"visibility_timeout_ms":1}"#, 400),
            ("PATCH", "/v1/topics/{topic}", "/v1/topics/nope", &[], br#"{"partitions":5}"#, 404),
            ("POST", "/v1/topics/{topic}/produce", "/v1/topics/orders/produce?key=k", &[], br#"{"a":1}"#, 202),
            ("POST", "/v1/topics/{topic}/produce", "/v1/topics/orders/produce?partition=3", &[], b"\xff", 202),
            ("POST", "/v1/topics/{topic}/produce", "/v1/topics/orders/produce", &[], b"", 400),
            ("POST", "/v1/topics/{topic}/produce", "/v1/topics/orders/produce?partition=4", &[], b"x", 400),
            ("POST", "/v1/topics/{topic}/produce", "/v1/topics/nope/produce", &[], b"x", 404),
            ("POST", "/v1/topics/{topic}/produce", "/v1/topics/orders/produce", &[("Authorization", PROD)], b"x", 202),
            ("POST", "/v1/topics/{topic}/produce", "/v1/topics/nope/produce?partition=x", &[("Authorization", PROD)], b"", 403),
            ("GET", "/v1/topics/{topic}/consume", "/v1/topics/orders/consume?partition=0&offset=0", &[("Authorization", PROD)], b"", 403),
            ("PATCH", "/v1/topics/{topic}", "/v1/topics/orders", &[("Authorization", PROD)], br#"{"retention_ms":7200000}"#, 403),
            ("POST", "/v1/topics/{topic}/produce/batch", "/v1/topics/orders/produce/batch", &[],
                br#"{"messages":[{"key":"k","payload":{"a":1}},{"partition":1,"payload":"AAEC","payload_encoding":"base64"}]}"#, 202),
            ("POST", "/v1/topics/{topic}/produce/batch", "/v1/topics/orders/produce/batch", &[], br#"{"messages":[]}"#, 400),
            ("POST", "/v1/topics/{topic}/produce/batch", "/v1/topics/orders/produce/batch", &[("Content-Encoding", "br")], b"{}", 415),
            ("POST", "/v1/topics/{topic}/produce/batch", "/v1/topics/nope/produce/batch", &[], br#"{"messages":[{"payload":1}]}"#, 404),
            ("GET", "/v1/topics/{topic}/consume", "/v1/topics/orders/consume?partition=0&offset=0", &[], b"", 200),
            ("GET", "/v1/topics/{topic}/consume", "/v1/topics/orders/consume?partition=1&offset=1", &[], b"", 200),
            ("GET", "/v1/topics/{topic}/consume", "/v1/topics/orders/consume?partition=1&offset=2", &[], b"", 410),
            ("GET", "/v1/topics/{topic}/consume", "/v1/topics/orders/consume?partition=1&offset=9", &[], b"", 204),
            ("GET", "/v1/topics/{topic}/consume", "/v1/topics/orders/consume?offset=0", &[], b"", 400),
            ("GET", "/v1/topics/{topic}/consume", "/v1/topics/orders/consume?partition=x&offset=0", &[], b"", 400),
            ("GET", "/v1/topics/{topic}/consume", "/v1/topics/orders/consume?wait=soon", &[], b"", 400),
            ("GET", "/v1/topics/{topic}/consume", "/v1/topics/orders/consume?wait=0s", &[], b"", 200),
            ("GET", "/v1/topics/{topic}/consume", "/v1/topics/orders/consume?partition=2&wait=1.5s", &[], b"", 200),
            ("GET", "/v1/topics/{topic}/consume", "/v1/topics/nope/consume", &[], b"", 404),
            ("POST", "/v1/topics/{topic}/ack", "/v1/topics/orders/ack?receipt_handle=0:1:7", &[], b"", 204),
            ("POST", "/v1/topics/{topic}/ack", "/v1/topics/orders/ack?receipt_handle=0:1:7&extend=true", &[], b"", 204),
            ("POST", "/v1/topics/{topic}/ack", "/v1/topics/orders/ack?receipt_handle=0:1:7&extend=0", &[], b"", 204),
            ("POST", "/v1/topics/{topic}/ack", "/v1/topics/orders/ack?receipt_handle=0:1:8", &[], b"", 410),
            ("POST", "/v1/topics/{topic}/ack", "/v1/topics/orders/ack", &[], b"", 400),
            ("POST", "/v1/topics/{topic}/ack", "/v1/topics/orders/ack?receipt_handle=0:1", &[], b"", 400),
            ("POST", "/v1/topics/{topic}/ack", "/v1/topics/orders/ack?receipt_handle=0:1:7&extend=maybe", &[], b"", 400),
            ("POST", "/v1/topics/{topic}/ack", "/v1/topics/nope/ack?receipt_handle=0:1:7", &[], b"", 404),
            ("DELETE", "/v1/topics/{topic}", "/v1/topics/orders", &[("Authorization", PROD)], b"", 403),
            ("DELETE", "/v1/topics/{topic}", "/v1/topics/orders", &[], b"", 204),
            ("DELETE", "/v1/users/{username}", "/v1/users/admin", &[], b"", 403),
            ("DELETE", "/v1/users/{username}", "/v1/users/prod", &[], b"", 204),
            ("DELETE", "/v1/users/{username}", "/v1/users/prod", &[], b"", 404),
            ("DELETE", "/v1/topics/{topic}", "/v1/topics/orders", &[], b"", 404),
        ];

/// Sends every case, checking each answer's status and that the document allows it; notes the
/// operations exercised.
async fn run(
    addr: std::net::SocketAddr,
    doc: &Value,
    cases: &[Case],
    exercised: &mut BTreeSet<(String, String)>,
) {
    for (method, path, target, headers, body, expected) in cases {
        let request = format!("{method} {target}");
        let answer = send(addr, method, target, headers, body).await;
        assert_eq!(
            answer.status,
            *expected,
            "{request}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        check(doc, method, path, &request, &answer);
        exercised.insert((method.to_string(), path.to_string()));
    }
}

/// The cluster's routes, once `orders` (3 partitions, all the node's) was created alone and members
/// 2 to 4 joined.
#[rustfmt::skip] // One case a line, as `CASES` above (too wide for rustfmt to touch).
const CLUSTER_CASES: &[Case] = &[
            ("GET", "/v1/cluster/moves", "/v1/cluster/moves", &[], b"", 200),
            ("POST", "/v1/cluster/moves", "/v1/cluster/moves", &[], br#"{"topic":"orders","partition":0,"to":2}"#, 202),
            ("GET", "/v1/cluster/moves", "/v1/cluster/moves", &[], b"", 200),
            ("POST", "/v1/cluster/moves", "/v1/cluster/moves", &[], br#"{"topic":"orders","partition":0,"to":3}"#, 409),
            ("POST", "/v1/cluster/moves", "/v1/cluster/moves", &[], br#"{"topic":"orders","partition":1,"to":1}"#, 409),
            ("POST", "/v1/cluster/moves", "/v1/cluster/moves", &[], br#"{"topic":"orders","partition":1,"to":9}"#, 400),
            ("POST", "/v1/cluster/moves", "/v1/cluster/moves", &[], br#"{"topic":"orders","partition":3,"to":2}"#, 400),
            ("POST", "/v1/cluster/moves", "/v1/cluster/moves", &[], br#"{"topic":"orders","partition":1,"to":2,"x":1}"#, 400),
            ("POST", "/v1/cluster/moves", "/v1/cluster/moves", &[], br#"{"topic":"nope","partition":0,"to":2}"#, 404),
            ("POST", "/v1/cluster/moves", "/v1/cluster/moves", &[], b"", 400),
            ("DELETE", "/v1/cluster/moves/{topic}/{partition}", "/v1/cluster/moves/orders/0", &[], b"", 204),
            ("DELETE", "/v1/cluster/moves/{topic}/{partition}", "/v1/cluster/moves/orders/0", &[], b"", 404),
            ("DELETE", "/v1/cluster/moves/{topic}/{partition}", "/v1/cluster/moves/orders/x", &[], b"", 400),
            ("POST", "/v1/cluster/rebalance", "/v1/cluster/rebalance", &[], b"", 200),
            ("POST", "/v1/cluster/members/{id}/decommission", "/v1/cluster/members/1/decommission", &[], b"", 409),
            ("POST", "/v1/cluster/members/{id}/decommission", "/v1/cluster/members/9/decommission", &[], b"", 404),
            ("POST", "/v1/cluster/members/{id}/decommission", "/v1/cluster/members/x/decommission", &[], b"", 404),
            ("POST", "/v1/cluster/members/{id}/decommission", "/v1/cluster/members/4/decommission", &[], b"", 204),
            ("GET", "/v1/cluster/members", "/v1/cluster/members", &[], b"", 200),
            ("DELETE", "/v1/cluster/members/{id}/decommission", "/v1/cluster/members/4/decommission", &[], b"", 204),
            ("DELETE", "/v1/cluster/members/{id}/decommission", "/v1/cluster/members/9/decommission", &[], b"", 404),
            ("POST", "/v1/cluster/members/{id}/decommission", "/v1/cluster/members/4/decommission", &[], b"", 204),
        ];

/// `GET path`'s JSON body.
async fn get_json(addr: std::net::SocketAddr, path: &str) -> Value {
    let answer = send(addr, "GET", path, &[], b"").await;
    assert_eq!(answer.status, 200, "GET {path}");
    serde_json::from_slice(&answer.body).unwrap()
}

/// What the cluster cases leave: the rebalance's moves, all from the node that owned everything,
/// and member 4 draining.
async fn check_cluster_state(addr: std::net::SocketAddr) {
    let moves = get_json(addr, "/v1/cluster/moves").await["moves"].clone();
    let moves = moves.as_array().unwrap();
    assert!(!moves.is_empty(), "the rebalance planned no move");
    for moving in moves {
        assert_eq!(
            (&moving["from"], &moving["state"], &moving["copied_bytes"]),
            (&json!(1), &json!("copying"), &json!(0)),
            "{moving}"
        );
    }
    // Planned moves count where they go: the load is even already.
    let again = send(addr, "POST", "/v1/cluster/rebalance", &[], b"").await;
    assert_eq!(again.body, b"{\"planned\":0}\n");
    let members = get_json(addr, "/v1/cluster/members").await["members"].clone();
    let members = members.as_array().unwrap();
    let flags: Vec<(&Value, &Value)> = members
        .iter()
        .map(|member| (&member["draining"], &member["outbound_moves"]))
        .collect();
    let (no, yes, none) = (&json!(false), &json!(true), &json!(0));
    let outbound = json!(moves.len());
    assert_eq!(
        flags,
        [(no, &outbound), (no, none), (no, none), (yes, none)]
    );
}

#[tokio::test]
async fn a_node_answers_every_operation_as_documented() {
    let doc = document();
    let app = app().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let routes = router::router(app.clone());
    let server = tokio::spawn(async move { axum::serve(listener, routes).await });

    // Before recovery is done: 503 with an error body.
    let answer = send(addr, "GET", "/readyz", &[], b"").await;
    assert_eq!(answer.status, 503);
    check(&doc, "GET", "/readyz", "GET /readyz (not ready)", &answer);
    app.set_ready();
    seed_root(&app).await;

    let mut exercised = BTreeSet::new();
    run(addr, &doc, CASES, &mut exercised).await;

    // The ghost's bucket had one failure above: four more empty it, then 429. A slow machine may
    // have refilled one token (one per 12 s) since, which takes one 401 more.
    let mut failures = 0;
    loop {
        let answer = send(addr, "GET", "/v1/topics", &[("Authorization", GHOST)], b"").await;
        check(&doc, "GET", "/v1/topics", "GET /v1/topics (ghost)", &answer);
        if answer.status == 429 {
            break;
        }
        assert_eq!(answer.status, 401);
        failures += 1;
        assert!(failures <= 5, "no 429 after {failures} more failures");
    }
    assert!(failures >= 4, "429 after {failures} more failures, not 4");

    // Bodies over 1 MiB.
    let large = vec![b'x'; BODY_BYTES_MAX + 1];
    for (method, path, target) in [
        ("POST", "/v1/topics", "/v1/topics"),
        (
            "POST",
            "/v1/topics/{topic}/produce",
            "/v1/topics/orders/produce",
        ),
    ] {
        let answer = send(addr, method, target, &[], &large).await;
        assert_eq!(answer.status, 413, "{method} {target}");
        check(
            &doc,
            method,
            path,
            &format!("{method} {target} (large)"),
            &answer,
        );
    }

    // While the disk guard holds: 507, as documented.
    app.set_insufficient_storage(true);
    for (path, target, body) in [
        (
            "/v1/topics/{topic}/produce",
            "/v1/topics/orders/produce",
            &b"x"[..],
        ),
        (
            "/v1/topics/{topic}/produce/batch",
            "/v1/topics/orders/produce/batch",
            &br#"{"messages":[{"payload":1}]}"#[..],
        ),
    ] {
        // The topic was deleted above: the guard answers only requests that pass every other check.
        let created = send(addr, "POST", "/v1/topics", &[], br#"{"name":"orders"}"#).await;
        assert!(matches!(created.status, 201 | 409));
        let answer = send(addr, "POST", target, &[], body).await;
        assert_eq!(answer.status, 507, "POST {target}");
        check(
            &doc,
            "POST",
            path,
            &format!("POST {target} (disk full)"),
            &answer,
        );
    }
    app.set_insufficient_storage(false);

    // The node owns every partition of `orders` (recreated above while it was alone): the
    // cluster's routes move them to the members that join now.
    seed_members(&app).await;
    run(addr, &doc, CLUSTER_CASES, &mut exercised).await;
    check_cluster_state(addr).await;
    assert_eq!(exercised, operations(&doc), "a case for every operation");

    // The route serves the document itself.
    let answer = send(addr, "GET", "/v1/openapi.json", &[], b"").await;
    assert_eq!(answer.body, DOCUMENT.as_bytes());
    assert_eq!(super::super::openapi(&app).body, DOCUMENT.as_bytes());

    // An unmatched path is no operation: Go's plain-text 404.
    let answer = send(addr, "GET", "/v1/nothing", &[], b"").await;
    assert_eq!(
        (answer.status, answer.body.as_slice()),
        (404, &b"404 page not found\n"[..])
    );
    server.abort();
}
