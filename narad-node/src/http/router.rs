//! The axum router: reads each request (path parameters, raw query, a body bounded by its route's
//! limit), calls the route's plain function and writes its [`Reply`]. Compiled only outside madsim.
//!
//! The observing middleware counts every answer in `narad_http_requests_total{route,method,status}` and
//! its latency, body bytes and in-flight count, with `route` = `METHOD /pattern` (e.g.
//! `POST /v1/topics/{topic}/produce`) or `unmatched`; every 5xx is counted in
//! `narad_errors_total{component="http",kind="5xx"}`. Unmatched paths get Go's plain-text 404, wrong
//! methods axum's 405.

use std::sync::Arc;

use axum::body::{Body as AxumBody, HttpBody as _};
use axum::extract::{FromRequestParts, MatchedPath, Path, RawQuery, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use super::{
    consume, ops, produce, topics, App, Body, Reply, BATCH_BODY_BYTES_MAX, BODY_BYTES_MAX,
};
use crate::metrics::{HttpLabels, RouteLabels};

type AppState = State<Arc<App>>;

/// The `/v1` router over `app`.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/topics", post(create_topic).get(list_topics))
        .route(
            "/v1/topics/{topic}",
            get(get_topic).patch(alter_topic).delete(delete_topic),
        )
        .route("/v1/topics/{topic}/produce", post(produce_one))
        .route("/v1/topics/{topic}/produce/batch", post(produce_batch))
        .route("/v1/topics/{topic}/consume", get(consume_one))
        .route("/v1/topics/{topic}/ack", post(ack))
        .route("/v1/cluster/members", get(cluster_members))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/openapi.json", get(openapi_doc))
        .fallback(unmatched)
        .layer(middleware::from_fn_with_state(app.clone(), observe))
        .with_state(app)
}

/// The `{topic}` path parameter. One that does not decode to UTF-8 names no topic: 404
/// `{"error":"topic not found"}`, as Narad answers it, not axum's plain-text 400.
struct TopicPath(String);

impl<S: Send + Sync> FromRequestParts<S> for TopicPath {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(topic)) => Ok(TopicPath(topic)),
            Err(_) => Err(into_response(Reply::error(404, "topic not found"))),
        }
    }
}

/// Reads at most `limit` bytes of body; more is [`Body::TooLarge`].
async fn read_body(body: AxumBody, limit: usize) -> Result<Body, Response> {
    match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => Ok(Body::Bytes(Vec::from(bytes))),
        Err(error) => {
            let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
            while let Some(cause) = source {
                if cause.is::<http_body_util::LengthLimitError>() {
                    return Ok(Body::TooLarge);
                }
                source = cause.source();
            }
            Err(into_response(Reply::error(
                400,
                &format!("invalid argument: could not read the request body: {error}"),
            )))
        }
    }
}

fn into_response(reply: Reply) -> Response {
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, reply.body).into_response();
    let headers = response.headers_mut();
    match reply.content_type {
        Some(content_type) => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        }
        None => {
            headers.remove(header::CONTENT_TYPE);
        }
    }
    for (name, value) in reply.headers {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

async fn create_topic(State(app): AppState, body: AxumBody) -> Response {
    match read_body(body, BODY_BYTES_MAX).await {
        Ok(body) => into_response(topics::create_topic(&app, body).await),
        Err(response) => response,
    }
}

async fn list_topics(State(app): AppState, RawQuery(query): RawQuery) -> Response {
    into_response(topics::list_topics(&app, query.as_deref()))
}

async fn get_topic(
    State(app): AppState,
    TopicPath(topic): TopicPath,
    RawQuery(query): RawQuery,
) -> Response {
    into_response(topics::get_topic(&app, &topic, query.as_deref()).await)
}

async fn alter_topic(
    State(app): AppState,
    TopicPath(topic): TopicPath,
    body: AxumBody,
) -> Response {
    match read_body(body, BODY_BYTES_MAX).await {
        Ok(body) => into_response(topics::alter_topic(&app, &topic, body).await),
        Err(response) => response,
    }
}

async fn delete_topic(State(app): AppState, TopicPath(topic): TopicPath) -> Response {
    into_response(topics::delete_topic(&app, &topic).await)
}

async fn produce_one(
    State(app): AppState,
    TopicPath(topic): TopicPath,
    RawQuery(query): RawQuery,
    body: AxumBody,
) -> Response {
    match read_body(body, BODY_BYTES_MAX).await {
        Ok(body) => into_response(produce::produce(&app, &topic, query.as_deref(), body).await),
        Err(response) => response,
    }
}

async fn produce_batch(
    State(app): AppState,
    TopicPath(topic): TopicPath,
    headers: HeaderMap,
    body: AxumBody,
) -> Response {
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .map(|value| value.to_str().unwrap_or("(not ASCII)").to_string());
    match read_body(body, BATCH_BODY_BYTES_MAX).await {
        Ok(body) => {
            into_response(produce::produce_batch(&app, &topic, encoding.as_deref(), body).await)
        }
        Err(response) => response,
    }
}

async fn consume_one(
    State(app): AppState,
    TopicPath(topic): TopicPath,
    RawQuery(query): RawQuery,
) -> Response {
    into_response(consume::consume(&app, &topic, query.as_deref()).await)
}

async fn ack(
    State(app): AppState,
    TopicPath(topic): TopicPath,
    RawQuery(query): RawQuery,
) -> Response {
    into_response(consume::ack(&app, &topic, query.as_deref()).await)
}

async fn cluster_members(State(app): AppState) -> Response {
    into_response(ops::cluster_members(&app))
}

async fn healthz(State(app): AppState) -> Response {
    into_response(ops::healthz(&app))
}

async fn readyz(State(app): AppState) -> Response {
    into_response(ops::readyz(&app))
}

async fn metrics(State(app): AppState) -> Response {
    into_response(ops::metrics(&app))
}

async fn openapi_doc(State(app): AppState) -> Response {
    into_response(super::openapi::openapi(&app))
}

async fn unmatched() -> Response {
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "404 page not found\n",
    )
        .into_response()
}

fn content_length(headers: &HeaderMap) -> u64 {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

async fn observe(State(app): AppState, request: Request, next: Next) -> Response {
    let method = request.method().to_string();
    let route = match request.extensions().get::<MatchedPath>() {
        Some(path) => format!("{method} {}", path.as_str()),
        None => "unmatched".to_string(),
    };
    let bytes_in = request
        .body()
        .size_hint()
        .exact()
        .unwrap_or_else(|| content_length(request.headers()));
    let metrics = &app.metrics;
    metrics.http_requests_in_flight.inc();
    let started = tokio::time::Instant::now();
    let response = next.run(request).await;
    let elapsed = started.elapsed().as_secs_f64();
    metrics.http_requests_in_flight.dec();
    let status = response.status();
    let labels = HttpLabels {
        route: route.clone(),
        method,
        status: status.as_u16().to_string(),
    };
    metrics.http_requests.get_or_create(&labels).inc();
    metrics
        .http_request_duration_seconds
        .get_or_create(&labels)
        .observe(elapsed);
    let route = RouteLabels { route };
    metrics
        .http_request_bytes_in
        .get_or_create(&route)
        .inc_by(bytes_in);
    metrics
        .http_response_bytes_out
        .get_or_create(&route)
        .inc_by(response.body().size_hint().exact().unwrap_or(0));
    if status.is_server_error() {
        metrics.error("http", "5xx").inc();
    }
    response
}
