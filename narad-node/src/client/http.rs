//! The client's HTTP: one ureq agent (keep-alive connections reused across a command's requests),
//! the node's base URL, and Basic auth when a user is given.
//!
//! Every answer comes back as a [`Reply`] whatever its status: the callers know which status each
//! route succeeds with, and turn any other into an [`ApiError`] carrying the server's message.

use std::fmt;
use std::time::Duration;

use anyhow::{bail, Context as _};
use ureq::http::{Method, Request};

use crate::cli::ClientOpts;

/// Longest wait for a TCP connection to the node.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest one exchange may take: above the 10 s a queue-mode consume may wait for a message
/// (`CONSUME_WAIT_MAX`), with room for a slow node.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A node's `/v1` API, as seen by one client command.
pub struct Client {
    agent: ureq::Agent,
    /// `http://host:port`, without a trailing slash.
    base: String,
    /// The `Authorization` header value, when a user was given.
    authorization: Option<String>,
}

/// An HTTP answer: its status and body (any status: see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// A request the node refused: the status and the server's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// Status code.
    pub status: u16,
    /// The `error` of a `{"error":…}` body (with the codes of its `reasons`, when it has some),
    /// else the body's text, else the status's reason.
    pub message: String,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (HTTP {})", self.message, self.status)
    }
}

impl std::error::Error for ApiError {}

impl Reply {
    /// The server's message in this answer (see [`ApiError::message`]).
    pub fn error_message(&self) -> String {
        #[derive(serde::Deserialize)]
        struct ErrorBody {
            error: String,
            /// Why, as codes (a refused decommission's `below_min_voters`, `no_receivers`, …).
            #[serde(default)]
            reasons: Vec<Reason>,
        }
        #[derive(serde::Deserialize)]
        struct Reason {
            code: String,
        }
        if let Ok(body) = serde_json::from_slice::<ErrorBody>(&self.body) {
            if body.reasons.is_empty() {
                return body.error;
            }
            let codes: Vec<&str> = body.reasons.iter().map(|r| r.code.as_str()).collect();
            return format!("{}: {}", body.error, codes.join(", "));
        }
        // Cluster-forward failures (502, 503) and unmatched routes answer plain text.
        let text = String::from_utf8_lossy(&self.body);
        let text = text.trim();
        if !text.is_empty() {
            return text.to_string();
        }
        ureq::http::StatusCode::from_u16(self.status)
            .ok()
            .and_then(|status| status.canonical_reason())
            .unwrap_or("unexpected answer")
            .to_lowercase()
    }

    /// This answer as an error (whatever its status).
    pub fn error(&self) -> ApiError {
        ApiError {
            status: self.status,
            message: self.error_message(),
        }
    }

    /// This answer when its status is `status`; the server's error otherwise.
    pub fn expect(self, status: u16) -> Result<Reply, ApiError> {
        if self.status == status {
            Ok(self)
        } else {
            Err(self.error())
        }
    }

    /// The body as JSON of type `T`.
    pub fn json<'a, T: serde::Deserialize<'a>>(&'a self) -> anyhow::Result<T> {
        serde_json::from_slice(&self.body).with_context(|| {
            format!(
                "the node answered JSON this client does not understand: {}",
                String::from_utf8_lossy(&self.body).trim()
            )
        })
    }

    /// The body without its trailing newline: the server's JSON value as one output line.
    pub fn json_line(&self) -> &[u8] {
        self.body.strip_suffix(b"\n").unwrap_or(&self.body)
    }
}

impl Client {
    /// A client for the node and user in `opts`.
    pub fn new(opts: &ClientOpts) -> anyhow::Result<Client> {
        let base = base_url(&opts.server)?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            // Every status is an answer to look at (the server's `{"error":…}`), not a transport error.
            .http_status_as_error(false)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_global(Some(CALL_TIMEOUT))
            .user_agent(concat!("narad/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let authorization = opts
            .user
            .as_deref()
            .map(|user| basic_authorization(user, opts.password.as_deref().unwrap_or("")));
        Ok(Client {
            agent,
            base,
            authorization,
        })
    }

    /// `GET path?query`.
    pub fn get(&self, path: &str, query: &[(&str, &str)]) -> anyhow::Result<Reply> {
        self.send(Method::GET, path, query, None)
    }

    /// `POST path?query` with `body`.
    pub fn post(&self, path: &str, query: &[(&str, &str)], body: &[u8]) -> anyhow::Result<Reply> {
        self.send(Method::POST, path, query, Some(body))
    }

    /// `PATCH path` with `body`.
    pub fn patch(&self, path: &str, body: &[u8]) -> anyhow::Result<Reply> {
        self.send(Method::PATCH, path, &[], Some(body))
    }

    /// `PUT path` with `body`.
    pub fn put(&self, path: &str, body: &[u8]) -> anyhow::Result<Reply> {
        self.send(Method::PUT, path, &[], Some(body))
    }

    /// `DELETE path`.
    pub fn delete(&self, path: &str) -> anyhow::Result<Reply> {
        self.send(Method::DELETE, path, &[], None)
    }

    fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> anyhow::Result<Reply> {
        let url = url(&self.base, path, query);
        let mut request = Request::builder().method(method.clone()).uri(&url);
        if let Some(authorization) = &self.authorization {
            request = request.header("authorization", authorization);
        }
        let answer = match body {
            Some(body) => request.body(body).map(|request| self.agent.run(request)),
            None => request.body(()).map(|request| self.agent.run(request)),
        }
        .with_context(|| format!("cannot make a request for {url}"))?;
        let mut response =
            answer.with_context(|| format!("cannot reach the node at {}", self.base))?;
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .read_to_vec()
            .with_context(|| format!("{method} {path}: cannot read the node's answer"))?;
        Ok(Reply { status, body })
    }
}

/// `server` as a base URL: `http://` added when no scheme is given, trailing slashes dropped.
pub fn base_url(server: &str) -> anyhow::Result<String> {
    let server = server.trim().trim_end_matches('/');
    if server.is_empty() {
        bail!("--server is empty: give the node's address, such as http://127.0.0.1:7942");
    }
    if server.starts_with("https://") {
        bail!("--server {server}: this client speaks plain http only (no TLS yet)");
    }
    if server.starts_with("http://") {
        Ok(server.to_string())
    } else if server.contains("://") {
        bail!("--server {server}: only http:// addresses are supported")
    } else {
        Ok(format!("http://{server}"))
    }
}

/// `base` + `path` + the query, form-encoded (the server decodes `%` and `+`).
pub fn url(base: &str, path: &str, query: &[(&str, &str)]) -> String {
    let mut url = format!("{base}{path}");
    if !query.is_empty() {
        let mut encoded = form_urlencoded::Serializer::new(String::new());
        for (name, value) in query {
            encoded.append_pair(name, value);
        }
        url.push('?');
        url.push_str(&encoded.finish());
    }
    url
}

/// `name` as one path segment: every byte but RFC 3986's unreserved ones percent-encoded, so a
/// name can never reach another route (`a/b`, `..`, `x?y`).
pub fn segment(name: &str) -> String {
    let mut encoded = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    // `.` and `..` are unreserved but would be resolved away as path steps.
    match encoded.as_str() {
        "." => "%2E".to_string(),
        ".." => "%2E%2E".to_string(),
        _ => encoded,
    }
}

/// `/v1/topics/{name}`.
pub fn topic_path(name: &str) -> String {
    format!("/v1/topics/{}", segment(name))
}

pub use narad_load::http1::basic_authorization;

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: u16, body: &str) -> Reply {
        Reply {
            status,
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn the_error_message_is_the_servers() {
        assert_eq!(
            reply(404, "{\"error\":\"topic not found\"}\n").error(),
            ApiError {
                status: 404,
                message: "topic not found".to_string()
            }
        );
        assert_eq!(
            reply(503, "partition owner is down; retry later\n").error_message(),
            "partition owner is down; retry later"
        );
        assert_eq!(reply(501, "").error_message(), "not implemented");
        assert_eq!(
            reply(404, "{\"error\":\"topic not found\"}\n")
                .error()
                .to_string(),
            "topic not found (HTTP 404)"
        );
        assert_eq!(reply(202, "").expect(202), Ok(reply(202, "")));
        assert_eq!(
            reply(
                409,
                r#"{"error":"member 1 cannot be decommissioned","reasons":[{"code":"below_min_voters"},{"code":"no_receivers"}]}"#
            )
            .error()
            .to_string(),
            "member 1 cannot be decommissioned: below_min_voters, no_receivers (HTTP 409)"
        );
    }

    #[test]
    fn base_urls_default_to_http_and_refuse_tls() {
        assert_eq!(
            base_url("http://127.0.0.1:7942/").unwrap(),
            "http://127.0.0.1:7942"
        );
        assert_eq!(base_url("localhost:9").unwrap(), "http://localhost:9");
        assert!(base_url("https://narad.example")
            .unwrap_err()
            .to_string()
            .contains("plain http only"));
        assert!(base_url("ftp://x").is_err());
        assert!(base_url(" ").is_err());
    }

    #[test]
    fn names_and_queries_are_encoded() {
        assert_eq!(segment("orders.v2_x-y"), "orders.v2_x-y");
        assert_eq!(segment("a/b?c d"), "a%2Fb%3Fc%20d");
        assert_eq!(segment(".."), "%2E%2E");
        assert_eq!(
            url(
                "http://h",
                "/v1/topics/t/produce",
                &[("key", "a b&c"), ("partition", "2")]
            ),
            "http://h/v1/topics/t/produce?key=a+b%26c&partition=2"
        );
        assert_eq!(url("http://h", "/v1/topics", &[]), "http://h/v1/topics");
    }

    #[test]
    fn basic_auth_is_rfc_7617() {
        assert_eq!(
            basic_authorization("admin", "secret"),
            "Basic YWRtaW46c2VjcmV0"
        );
        assert_eq!(basic_authorization("me", ""), "Basic bWU6");
    }
}
