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
mod tests;
