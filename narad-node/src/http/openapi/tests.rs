use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use super::DOCUMENT;

/// The HTTP methods an OpenAPI path item can hold, as its keys spell them.
const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// Every status code each operation documents, by hand from the route functions (`topics.rs`,
/// `produce.rs`, `consume.rs`, `ops.rs`, `cluster.rs`, `users.rs`, `router.rs`) and the surface. A
/// code removed from the document, or added to it without a line here, fails
/// `documented_status_codes_match_the_table`.
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
        &[202, 400, 401, 403, 404, 413, 414, 429, 431, 500, 503, 507],
    ),
    (
        "POST",
        "/v1/topics/{topic}/produce/batch",
        &[202, 400, 401, 403, 404, 413, 415, 429, 500, 503, 507],
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
    (
        "POST",
        "/v1/cluster/members/{id}/decommission",
        &[204, 400, 401, 403, 404, 409, 429, 503],
    ),
    (
        "DELETE",
        "/v1/cluster/members/{id}/decommission",
        &[204, 401, 403, 404, 429, 503],
    ),
    ("GET", "/v1/cluster/moves", &[200, 401, 403, 429]),
    (
        "POST",
        "/v1/cluster/moves",
        &[202, 400, 401, 403, 404, 409, 413, 429, 503],
    ),
    (
        "DELETE",
        "/v1/cluster/moves/{topic}/{partition}",
        &[204, 400, 401, 403, 404, 429, 503],
    ),
    (
        "POST",
        "/v1/cluster/rebalance",
        &[200, 401, 403, 409, 429, 503],
    ),
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
        include_str!("../topics.rs"),
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
        include_str!("../produce.rs"),
        &[
            ("POST", "/v1/topics/{topic}/produce"),
            ("POST", "/v1/topics/{topic}/produce/batch"),
        ],
    ),
    (
        "consume.rs",
        include_str!("../consume.rs"),
        &[
            ("GET", "/v1/topics/{topic}/consume"),
            ("POST", "/v1/topics/{topic}/ack"),
        ],
    ),
    (
        "ops.rs",
        include_str!("../ops.rs"),
        &[
            ("GET", "/v1/cluster/members"),
            ("GET", "/healthz"),
            ("GET", "/readyz"),
            ("GET", "/metrics"),
        ],
    ),
    (
        "cluster.rs",
        include_str!("../cluster.rs"),
        &[
            ("POST", "/v1/cluster/members/{id}/decommission"),
            ("DELETE", "/v1/cluster/members/{id}/decommission"),
            ("GET", "/v1/cluster/moves"),
            ("POST", "/v1/cluster/moves"),
            ("DELETE", "/v1/cluster/moves/{topic}/{partition}"),
            ("POST", "/v1/cluster/rebalance"),
        ],
    ),
    (
        "users.rs",
        include_str!("../users.rs"),
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
        include_str!("../router.rs"),
        &[
            ("POST", "/v1/topics"),
            ("PATCH", "/v1/topics/{topic}"),
            ("POST", "/v1/topics/{topic}/produce"),
            ("POST", "/v1/topics/{topic}/produce/batch"),
            ("POST", "/v1/cluster/moves"),
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
    let meta: Value = serde_json::from_str(include_str!("../openapi-3.1-schema.json")).unwrap();
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
    let routes = router_routes(include_str!("../router.rs"));
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
                // A planned move has nothing to say yet: `GET /v1/cluster/moves` follows it.
                202 if *path == "/v1/cluster/moves" => {
                    assert!(content.is_none(), "{method} {path} {code} has no body")
                }
                _ => assert!(content.is_some(), "{method} {path} {code} has a body"),
            }
            let Some(content) = content else { continue };
            if code < 400 || (*path == "/healthz" && code == 503) {
                continue;
            }
            // Errors: `{"error": …}` in JSON (a decommission refusal adds its reasons), or plain
            // text (cluster forwarding).
            let error = if (*method, *path, code) == DECOMMISSION_REFUSED {
                "#/components/schemas/DecommissionRefused"
            } else {
                "#/components/schemas/Error"
            };
            for (media, body) in content.as_object().unwrap() {
                match media.as_str() {
                    "application/json" => {
                        assert_eq!(body["schema"]["$ref"], error, "{method} {path} {code}")
                    }
                    "text/plain" => {}
                    other => panic!("{method} {path} {code}: error media type {other}"),
                }
            }
        }
    }
}

/// The one error answer whose JSON carries more than `error`: the reasons a member cannot be
/// decommissioned.
const DECOMMISSION_REFUSED: (&str, &str, u16) =
    ("POST", "/v1/cluster/members/{id}/decommission", 409);

#[test]
fn a_decommission_refusal_is_an_error_with_reasons() {
    let doc = document();
    let error = &doc["components"]["schemas"]["Error"];
    let refused = &doc["components"]["schemas"]["DecommissionRefused"];
    // A client that reads any error's `error` reads this one's too.
    assert_eq!(refused["properties"]["error"], error["properties"]["error"]);
    let required = refused["required"].as_array().expect("required");
    assert!(required.contains(&json!("error")) && required.contains(&json!("reasons")));
    let validator = compile(&doc, refused);
    let body = json!({"error": "member 1 cannot be decommissioned",
                      "reasons": [{"code": "below_min_voters"}, {"code": "no_receivers"}]});
    assert!(violations(&validator, &body).is_empty());
    assert!(!violations(
        &validator,
        &json!({"error": "x", "reasons": [{"code": "tired"}]})
    )
    .is_empty());
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
mod live;
