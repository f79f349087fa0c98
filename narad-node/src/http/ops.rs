//! `/healthz`, `/readyz` and `/metrics` (no auth on any of them, as in Narad).
//!
//! - `/healthz`: 200 `{"status":"ok"}`, or 503 `{"status":"shutting down"}` once a graceful shutdown began.
//! - `/readyz`: 200 `{"status":"ready"}` once start-up recovery is done, else 503 `{"error":…}`. A latched
//!   WAL does not make the node unready (alert on `narad_ingress_wal_failed` instead).
//! - `/metrics`: OpenMetrics text.

use super::{App, Reply};
use crate::metrics;

/// `GET /healthz`.
pub fn healthz(app: &App) -> Reply {
    if app.is_shutting_down() {
        Reply::json(503, "{\"status\":\"shutting down\"}".to_string())
    } else {
        Reply::json(200, "{\"status\":\"ok\"}".to_string())
    }
}

/// `GET /readyz`.
pub fn readyz(app: &App) -> Reply {
    if app.is_ready() {
        Reply::json(200, "{\"status\":\"ready\"}".to_string())
    } else {
        Reply::error(503, "not ready: recovery in progress")
    }
}

/// `GET /metrics`.
pub fn metrics(app: &App) -> Reply {
    Reply {
        status: 200,
        content_type: Some(metrics::CONTENT_TYPE),
        headers: Vec::new(),
        body: app.metrics.encode().into_bytes(),
    }
}
