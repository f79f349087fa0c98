//! `GET /v1/openapi.json`: the OpenAPI 3.1 document of every route, written by hand in `openapi.json`
//! beside this file and served verbatim.
//!
//! The tests below keep it true: it is valid OpenAPI 3.1 (the official meta-schema, a test fixture),
//! every `$ref` resolves and every schema compiles; its operations are exactly the router's routes
//! (`router.rs`, read as source); each operation's status codes are the table in the tests, and the
//! route functions answer no status literal their routes leave undocumented; and a node over a socket
//! answers a request of every operation with a status, `Content-Type`, headers and body the document
//! allows. `ci/schemathesis` fuzzes a real node against it.

use super::reply::JSON;
use super::{App, Reply};

/// The document, as served.
pub const DOCUMENT: &str = include_str!("openapi.json");

/// `GET /v1/openapi.json` → 200, the document.
pub fn openapi(_app: &App) -> Reply {
    Reply {
        status: 200,
        content_type: Some(JSON),
        headers: Vec::new(),
        body: DOCUMENT.as_bytes().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use serde_json::{json, Value};

    use super::DOCUMENT;

    /// The HTTP methods an OpenAPI path item can hold, as its keys spell them.
    const METHODS: [&str; 8] = [
        "get", "put", "post", "delete", "options", "head", "patch", "trace",
    ];

    /// Every status code each operation documents, by hand from the route functions (`topics.rs`,
    /// `produce.rs`, `consume.rs`, `ops.rs`, `users.rs`, `router.rs`) and the surface. A code removed from the
    /// document, or added to it without a line here, fails `documented_status_codes_match_the_table`.
    const STATUS_CODES: &[(&str, &str, &[u16])] = &[
        (
            "POST",
            "/v1/topics",
            &[201, 400, 401, 403, 409, 413, 429, 500, 503],
        ),
        ("GET", "/v1/topics", &[200, 400, 401, 429]),
        ("GET", "/v1/topics/{topic}", &[200, 400, 401, 404, 429]),
        (
            "PATCH",
            "/v1/topics/{topic}",
            &[200, 400, 401, 403, 404, 413, 429, 500, 503],
        ),
        (
            "DELETE",
            "/v1/topics/{topic}",
            &[204, 401, 403, 404, 429, 500, 503],
        ),
        (
            "POST",
            "/v1/topics/{topic}/produce",
            &[202, 400, 401, 403, 404, 413, 414, 429, 431, 500, 503],
        ),
        (
            "POST",
            "/v1/topics/{topic}/produce/batch",
            &[202, 400, 401, 403, 404, 413, 415, 429, 500, 503],
        ),
        (
            "GET",
            "/v1/topics/{topic}/consume",
            &[200, 204, 400, 401, 403, 404, 410, 429, 502, 503],
        ),
        (
            "POST",
            "/v1/topics/{topic}/ack",
            &[204, 400, 401, 403, 404, 410, 429, 502, 503],
        ),
        ("GET", "/v1/cluster/members", &[200, 401, 403, 429]),
        ("GET", "/healthz", &[200, 503]),
        ("GET", "/readyz", &[200, 503]),
        ("GET", "/metrics", &[200]),
        ("GET", "/v1/openapi.json", &[200, 401, 429]),
        (
            "POST",
            "/v1/users",
            &[201, 400, 401, 403, 409, 413, 429, 500, 503],
        ),
        ("GET", "/v1/users", &[200, 401, 403, 429]),
        ("GET", "/v1/users/{username}", &[200, 401, 403, 404, 429]),
        (
            "DELETE",
            "/v1/users/{username}",
            &[204, 401, 403, 404, 429, 500, 503],
        ),
        (
            "PUT",
            "/v1/users/{username}/grants",
            &[200, 400, 401, 403, 404, 413, 429, 500, 503],
        ),
        (
            "PUT",
            "/v1/users/{username}/password",
            &[204, 400, 401, 403, 404, 413, 429, 500, 503],
        ),
    ];

    /// `(METHOD, path)`.
    type Route = (&'static str, &'static str);

    /// Which source file answers for which routes: every status literal of a file (`Reply::error(410`,
    /// `Reply::empty(204` …) must be documented on at least one of its routes.
    const ROUTE_SOURCES: &[(&str, &str, &[Route])] = &[
        (
            "topics.rs",
            include_str!("topics.rs"),
            &[
                ("POST", "/v1/topics"),
                ("GET", "/v1/topics"),
                ("GET", "/v1/topics/{topic}"),
                ("PATCH", "/v1/topics/{topic}"),
                ("DELETE", "/v1/topics/{topic}"),
            ],
        ),
        (
            "produce.rs",
            include_str!("produce.rs"),
            &[
                ("POST", "/v1/topics/{topic}/produce"),
                ("POST", "/v1/topics/{topic}/produce/batch"),
            ],
        ),
        (
            "consume.rs",
            include_str!("consume.rs"),
            &[
                ("GET", "/v1/topics/{topic}/consume"),
                ("POST", "/v1/topics/{topic}/ack"),
            ],
        ),
        (
            "ops.rs",
            include_str!("ops.rs"),
            &[
                ("GET", "/v1/cluster/members"),
                ("GET", "/healthz"),
                ("GET", "/readyz"),
                ("GET", "/metrics"),
            ],
        ),
        (
            "users.rs",
            include_str!("users.rs"),
            &[
                ("POST", "/v1/users"),
                ("GET", "/v1/users"),
                ("GET", "/v1/users/{username}"),
                ("DELETE", "/v1/users/{username}"),
                ("PUT", "/v1/users/{username}/grants"),
                ("PUT", "/v1/users/{username}/password"),
            ],
        ),
        (
            "router.rs",
            include_str!("router.rs"),
            &[
                ("POST", "/v1/topics"),
                ("PATCH", "/v1/topics/{topic}"),
                ("POST", "/v1/topics/{topic}/produce"),
                ("POST", "/v1/topics/{topic}/produce/batch"),
            ],
        ),
    ];

    fn document() -> Value {
        serde_json::from_str(DOCUMENT).expect("openapi.json is JSON")
    }

    /// `(METHOD, path)` of every documented operation.
    fn operations(doc: &Value) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in METHODS {
                if item.get(method).is_some() {
                    out.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        out
    }

    fn operation<'a>(doc: &'a Value, method: &str, path: &str) -> &'a Value {
        let item = doc["paths"]
            .get(path)
            .unwrap_or_else(|| panic!("{path} is not documented"));
        item.get(method.to_lowercase())
            .unwrap_or_else(|| panic!("{method} {path} is not documented"))
    }

    /// Follows `$ref`s (local JSON pointers) until a value without one.
    fn resolve<'a>(doc: &'a Value, mut value: &'a Value) -> &'a Value {
        while let Some(reference) = value.get("$ref").and_then(Value::as_str) {
            let pointer = reference
                .strip_prefix('#')
                .unwrap_or_else(|| panic!("{reference} is not a local reference"));
            value = doc
                .pointer(pointer)
                .unwrap_or_else(|| panic!("{reference} does not resolve"));
        }
        value
    }

    fn responses<'a>(doc: &'a Value, method: &str, path: &str) -> BTreeMap<u16, &'a Value> {
        operation(doc, method, path)["responses"]
            .as_object()
            .unwrap_or_else(|| panic!("{method} {path} has no responses"))
            .iter()
            .map(|(code, response)| {
                let code = code
                    .parse()
                    .unwrap_or_else(|_| panic!("{method} {path}: response {code} is not a code"));
                (code, resolve(doc, response))
            })
            .collect()
    }

    /// A schema of the document as a standalone JSON Schema: its `#/components/...` references
    /// resolve inside it (`components` is no JSON Schema keyword, so it only carries them).
    fn standalone(doc: &Value, schema: &Value) -> Value {
        match schema {
            Value::Object(object) => {
                let mut object = object.clone();
                object.insert("components".to_string(), doc["components"].clone());
                Value::Object(object)
            }
            other => other.clone(),
        }
    }

    fn compile(doc: &Value, schema: &Value) -> jsonschema::Validator {
        jsonschema::draft202012::new(&standalone(doc, schema))
            .unwrap_or_else(|error| panic!("{schema} does not compile: {error}"))
    }

    fn violations(validator: &jsonschema::Validator, instance: &Value) -> Vec<String> {
        validator
            .iter_errors(instance)
            .map(|error| format!("{error} (at {})", error.instance_path()))
            .collect()
    }

    #[test]
    fn document_is_openapi_3_1_json() {
        let doc = document();
        let version = doc["openapi"].as_str().expect("openapi is a string");
        assert!(version.starts_with("3.1."), "openapi {version}");
        assert!(
            DOCUMENT.ends_with('\n'),
            "a JSON answer ends with a newline"
        );
    }

    /// The OpenAPI 3.1 meta-schema (`https://spec.openapis.org/oas/3.1/schema/2022-10-07`, the
    /// OpenAPI Initiative's, Apache-2.0), as schemathesis 4.32.5 bundles it.
    #[test]
    fn document_matches_the_openapi_3_1_meta_schema() {
        let meta: Value = serde_json::from_str(include_str!("openapi-3.1-schema.json")).unwrap();
        let validator = jsonschema::draft202012::new(&meta).expect("the meta-schema compiles");
        let errors = violations(&validator, &document());
        assert!(errors.is_empty(), "{errors:#?}");
    }

    fn walk<'a>(value: &'a Value, at: String, visit: &mut impl FnMut(&str, &'a Value)) {
        visit(&at, value);
        match value {
            Value::Object(object) => {
                for (key, child) in object {
                    walk(child, format!("{at}/{key}"), visit);
                }
            }
            Value::Array(items) => {
                for (index, child) in items.iter().enumerate() {
                    walk(child, format!("{at}/{index}"), visit);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn every_reference_resolves_and_every_schema_compiles() {
        let doc = document();
        walk(&doc, String::new(), &mut |at, value| {
            if let Some(reference) = value.get("$ref").and_then(Value::as_str) {
                let pointer = reference.strip_prefix('#').expect("local reference");
                assert!(doc.pointer(pointer).is_some(), "{at}: {reference}");
            }
        });
        let mut schemas = Vec::new();
        walk(&doc, String::new(), &mut |at, value| {
            if at.ends_with("/schema") && !at.contains("/components/schemas/") {
                schemas.push((at.to_string(), value));
            }
        });
        for (name, schema) in doc["components"]["schemas"].as_object().unwrap() {
            schemas.push((format!("/components/schemas/{name}"), schema));
        }
        assert!(schemas.len() > 40, "{} schemas", schemas.len());
        for (at, schema) in schemas {
            if let Err(error) = jsonschema::meta::validate(schema) {
                panic!("{at} is not a valid JSON Schema: {error}");
            }
            compile(&doc, schema);
        }
    }

    /// Removes `//` comments (outside string literals) from Rust source.
    fn strip_comments(source: &str) -> String {
        let mut out = String::with_capacity(source.len());
        let mut chars = source.chars().peekable();
        let mut in_string = false;
        while let Some(character) = chars.next() {
            if in_string {
                out.push(character);
                match character {
                    '\\' => out.extend(chars.next()),
                    '"' => in_string = false,
                    _ => {}
                }
            } else if character == '/' && chars.peek() == Some(&'/') {
                for next in chars.by_ref() {
                    if next == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            } else {
                in_string = character == '"';
                out.push(character);
            }
        }
        out
    }

    /// The text inside the parentheses that open just before `text` (up to the matching `)`).
    fn parenthesized(text: &str) -> &str {
        let mut depth = 1;
        let mut in_string = false;
        let mut escaped = false;
        for (index, character) in text.char_indices() {
            if in_string {
                match (escaped, character) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '"') => in_string = false,
                    _ => {}
                }
                continue;
            }
            match character {
                '"' => in_string = true,
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        return &text[..index];
                    }
                }
                _ => {}
            }
        }
        panic!("unbalanced parentheses after {text:.40}");
    }

    /// `(METHOD, path)` of every route `router.rs` registers: each `.route("path", get(h).post(h)…)`.
    fn router_routes(source: &str) -> BTreeSet<(String, String)> {
        let code = strip_comments(source);
        for unsupported in [".nest(", ".merge(", ".route_service(", ".nest_service("] {
            assert!(
                !code.contains(unsupported),
                "router.rs uses {unsupported}: teach router_routes to read it"
            );
        }
        let mut routes = BTreeSet::new();
        let mut rest = code.as_str();
        while let Some(at) = rest.find(".route(") {
            let args = parenthesized(&rest[at + ".route(".len()..]);
            let open = args.find('"').expect("a route's path is a string literal");
            let close = open + 1 + args[open + 1..].find('"').expect("closing quote");
            let path = &args[open + 1..close];
            let handlers = &args[close + 1..];
            let mut methods = 0;
            for method in METHODS.iter().copied().chain(["any"]) {
                let call = format!("{method}(");
                let mut from = 0;
                while let Some(found) = handlers[from..].find(&call) {
                    let start = from + found;
                    let before = handlers[..start].chars().next_back();
                    if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                        assert_ne!(method, "any", "{path}: any() routes every method");
                        routes.insert((method.to_uppercase(), path.to_string()));
                        methods += 1;
                    }
                    from = start + call.len();
                }
            }
            assert!(
                methods > 0,
                "{path}: no method router found in {handlers:?}"
            );
            rest = &rest[at + ".route(".len() + args.len()..];
        }
        routes
    }

    #[test]
    fn the_route_scanner_reads_method_chains() {
        let source = r#"
            // .route("/commented", get(nothing))
            Router::new()
                .route("/a", post(create).get(list))
                .route(
                    "/a/{b}",
                    get(get_b).patch(alter_b).delete(delete_b),
                )
                .route("/c", get(target(")")))
        "#;
        let routes: Vec<String> = router_routes(source)
            .into_iter()
            .map(|(method, path)| format!("{method} {path}"))
            .collect();
        assert_eq!(
            routes,
            [
                "DELETE /a/{b}",
                "GET /a",
                "GET /a/{b}",
                "GET /c",
                "PATCH /a/{b}",
                "POST /a"
            ]
        );
    }

    #[test]
    fn router_routes_are_exactly_the_documented_operations() {
        let routes = router_routes(include_str!("router.rs"));
        let documented = operations(&document());
        let undocumented: Vec<_> = routes.difference(&documented).collect();
        assert!(
            undocumented.is_empty(),
            "routes in router.rs missing from openapi.json: {undocumented:?}"
        );
        let unrouted: Vec<_> = documented.difference(&routes).collect();
        assert!(
            unrouted.is_empty(),
            "operations in openapi.json that router.rs does not route: {unrouted:?}"
        );
    }

    #[test]
    fn documented_status_codes_match_the_table() {
        let doc = document();
        let table: BTreeSet<(String, String)> = STATUS_CODES
            .iter()
            .map(|(method, path, _)| (method.to_string(), path.to_string()))
            .collect();
        assert_eq!(table, operations(&doc), "the table lists every operation");
        for (method, path, codes) in STATUS_CODES {
            let responses = responses(&doc, method, path);
            let documented: Vec<u16> = responses.keys().copied().collect();
            assert_eq!(documented, codes.to_vec(), "{method} {path}");
            for (code, response) in responses {
                let content = response.get("content");
                match code {
                    204 => assert!(content.is_none(), "{method} {path} {code} has no body"),
                    202 | 414 | 431 if path.ends_with("/produce") => {
                        assert!(content.is_none(), "{method} {path} {code} has no body")
                    }
                    _ => assert!(content.is_some(), "{method} {path} {code} has a body"),
                }
                let Some(content) = content else { continue };
                if code < 400 || (*path == "/healthz" && code == 503) {
                    continue;
                }
                // Errors: `{"error": …}` in JSON, or plain text (cluster forwarding).
                for (media, body) in content.as_object().unwrap() {
                    match media.as_str() {
                        "application/json" => assert_eq!(
                            body["schema"]["$ref"], "#/components/schemas/Error",
                            "{method} {path} {code}"
                        ),
                        "text/plain" => {}
                        other => panic!("{method} {path} {code}: error media type {other}"),
                    }
                }
            }
        }
    }

    /// Status literals in `Reply::…(` calls and `Reply { status: … }` literals of a source file.
    fn status_literals(source: &str) -> BTreeSet<u16> {
        let code = strip_comments(source);
        let mut out = BTreeSet::new();
        for prefix in [
            "Reply::error(",
            "Reply::plain(",
            "Reply::json(",
            "Reply::empty(",
            "status:",
        ] {
            let mut rest = code.as_str();
            while let Some(at) = rest.find(prefix) {
                rest = &rest[at + prefix.len()..];
                let text = rest.trim_start();
                let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
                if let Ok(status) = digits.parse() {
                    out.insert(status);
                }
            }
        }
        out
    }

    #[test]
    fn status_literals_are_read_from_replies() {
        let source = r#"
            // Reply::error(418, "commented out")
            Err(Reply::error(
                410,
                "gone",
            ));
            Reply::plain(503, "down");
            Reply::json(200, body);
            Reply::empty(204).with_header(H);
            Reply { status: 202, content_type: None };
            Reply::error(status, "computed");
        "#;
        assert_eq!(
            status_literals(source).into_iter().collect::<Vec<_>>(),
            [200, 202, 204, 410, 503]
        );
    }

    #[test]
    fn route_sources_answer_only_documented_codes() {
        let doc = document();
        for (file, source, routes) in ROUTE_SOURCES {
            let documented: BTreeSet<u16> = routes
                .iter()
                .flat_map(|(method, path)| responses(&doc, method, path).into_keys())
                .collect();
            let literals = status_literals(source);
            assert!(!literals.is_empty(), "{file}: no status literal found");
            let undocumented: Vec<_> = literals.difference(&documented).collect();
            assert!(
                undocumented.is_empty(),
                "{file} answers {undocumented:?}, which none of its routes document"
            );
        }
    }

    #[cfg(not(madsim))]
    mod live {
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
            router, AppendError, BoxFuture, Leased, PartitionReader, PartitionStat, PartitionStats,
            ProduceSink, QueueConsumer, QueueLimits, QueueOutcome, ReadError, ReadOutcome,
            ReceiptHandle, Settle, SettleOutcome, StoredRecord, TopicKey,
        };
        use crate::http::{App, BODY_BYTES_MAX};
        use crate::metastore::{Metastore, MetastoreOptions};
        use crate::metrics::Metrics;

        /// Accepts every append.
        struct Sink;

        impl ProduceSink for Sink {
            fn append(&self, _: ProduceRecord) -> BoxFuture<'_, Result<(), AppendError>> {
                Box::pin(async { Ok(()) })
            }
            fn append_many(&self, _: Vec<ProduceRecord>) -> BoxFuture<'_, Result<(), AppendError>> {
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
            ) -> BoxFuture<'_, Result<ReadOutcome, ReadError>> {
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
                .with_auth(true),
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
            for (method, path, target, headers, body, expected) in CASES {
                let request = format!("{method} {target}");
                let answer = send(addr, method, target, headers, body).await;
                assert_eq!(
                    answer.status,
                    *expected,
                    "{request}: {}",
                    String::from_utf8_lossy(&answer.body)
                );
                check(&doc, method, path, &request, &answer);
                exercised.insert((method.to_string(), path.to_string()));
            }
            assert_eq!(exercised, operations(&doc), "a case for every operation");

            // The ghost's bucket had one failure above: four more empty it, then 429.
            for expected in [401, 401, 401, 401, 429] {
                let answer =
                    send(addr, "GET", "/v1/topics", &[("Authorization", GHOST)], b"").await;
                assert_eq!(answer.status, expected);
                check(&doc, "GET", "/v1/topics", "GET /v1/topics (ghost)", &answer);
            }

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
    }
}
