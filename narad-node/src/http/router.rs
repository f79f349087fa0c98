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
use axum::routing::{delete, get, post, put};
use axum::{Extension, Router};
use narad_core::metastore::users::Action;

use super::auth::{self, Caller, Refusal};
use super::{
    cluster, consume, ops, produce, topics, users, App, Body, Reply, BATCH_BODY_BYTES_MAX,
    BODY_BYTES_MAX,
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
        .route(
            "/v1/cluster/members/{id}/decommission",
            post(decommission_member).delete(cancel_decommission),
        )
        .route("/v1/cluster/moves", get(list_moves).post(start_move))
        .route("/v1/cluster/moves/{topic}/{partition}", delete(abort_move))
        .route("/v1/cluster/rebalance", post(rebalance))
        .route("/v1/users", post(create_user).get(list_users))
        .route("/v1/users/{username}", get(get_user).delete(delete_user))
        .route("/v1/users/{username}/grants", put(set_grants))
        .route("/v1/users/{username}/password", put(set_password))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/openapi.json", get(openapi_doc))
        .fallback(unmatched)
        .layer(middleware::from_fn_with_state(app.clone(), authenticate))
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
///
/// After each [`BODY_YIELD_BYTES`] copied the async thread offers its core to the OS
/// (`sched_yield`): a large body arrives in one poll when its bytes are already buffered, and the
/// scheduler lets a running thread keep its core for a whole slice, so the I/O threads a produce
/// wakes on this core would otherwise wait behind the whole copy.
async fn read_body(body: AxumBody, limit: usize) -> Result<Body, Response> {
    use http_body_util::BodyExt as _;

    let mut body = body;
    let expected = usize::try_from(body.size_hint().lower()).unwrap_or(usize::MAX);
    let mut bytes = Vec::with_capacity(expected.min(limit).min(BODY_RESERVE_MAX));
    let mut since_yield = 0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| {
            into_response(Reply::error(
                400,
                &format!("invalid argument: could not read the request body: {error}"),
            ))
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.len() > limit - bytes.len() {
            return Ok(Body::TooLarge);
        }
        bytes.extend_from_slice(&data);
        since_yield += data.len();
        if since_yield >= BODY_YIELD_BYTES {
            since_yield = 0;
            std::thread::yield_now();
        }
    }
    Ok(Body::Bytes(bytes))
}

/// How many body bytes [`read_body`] copies between offers of the core to the OS.
const BODY_YIELD_BYTES: usize = 64 * 1024;

/// The most [`read_body`] reserves up front from a declared length (a client can declare more than
/// it sends, slowly, on thousands of connections).
const BODY_RESERVE_MAX: usize = 256 * 1024;

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

type CallerOf = Extension<Caller>;

async fn create_topic(
    State(app): AppState,
    Extension(caller): CallerOf,
    body: AxumBody,
) -> Response {
    match read_body(body, BODY_BYTES_MAX).await {
        Ok(body) => into_response(topics::create_topic(&app, &caller, body).await),
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
    Extension(caller): CallerOf,
    TopicPath(topic): TopicPath,
    body: AxumBody,
) -> Response {
    match read_body(body, BODY_BYTES_MAX).await {
        Ok(body) => into_response(topics::alter_topic(&app, &caller, &topic, body).await),
        Err(response) => response,
    }
}

async fn delete_topic(
    State(app): AppState,
    Extension(caller): CallerOf,
    TopicPath(topic): TopicPath,
) -> Response {
    into_response(topics::delete_topic(&app, &caller, &topic).await)
}

async fn create_user(
    State(app): AppState,
    Extension(caller): CallerOf,
    body: AxumBody,
) -> Response {
    match read_body(body, BODY_BYTES_MAX).await {
        Ok(body) => into_response(users::create_user(&app, &caller, body).await),
        Err(response) => response,
    }
}

async fn list_users(State(app): AppState, Extension(caller): CallerOf) -> Response {
    into_response(users::list_users(&app, &caller))
}

async fn get_user(
    State(app): AppState,
    Extension(caller): CallerOf,
    Path(username): Path<String>,
) -> Response {
    into_response(users::get_user(&app, &caller, &username))
}

async fn delete_user(
    State(app): AppState,
    Extension(caller): CallerOf,
    Path(username): Path<String>,
) -> Response {
    into_response(users::delete_user(&app, &caller, &username).await)
}

async fn set_grants(
    State(app): AppState,
    Extension(caller): CallerOf,
    Path(username): Path<String>,
    body: AxumBody,
) -> Response {
    match read_body(body, BODY_BYTES_MAX).await {
        Ok(body) => into_response(users::set_grants(&app, &caller, &username, body).await),
        Err(response) => response,
    }
}

async fn set_password(
    State(app): AppState,
    Extension(caller): CallerOf,
    Path(username): Path<String>,
    body: AxumBody,
) -> Response {
    match read_body(body, BODY_BYTES_MAX).await {
        Ok(body) => into_response(users::set_password(&app, &caller, &username, body).await),
        Err(response) => response,
    }
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

async fn decommission_member(
    State(app): AppState,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    into_response(cluster::decommission(&app, &id, query.as_deref(), true).await)
}

async fn cancel_decommission(State(app): AppState, Path(id): Path<String>) -> Response {
    into_response(cluster::decommission(&app, &id, None, false).await)
}

async fn list_moves(State(app): AppState) -> Response {
    into_response(cluster::list_moves(&app))
}

async fn start_move(State(app): AppState, body: AxumBody) -> Response {
    match read_body(body, BODY_BYTES_MAX).await {
        Ok(body) => into_response(cluster::start_move(&app, body).await),
        Err(response) => response,
    }
}

async fn abort_move(
    State(app): AppState,
    Path((topic, partition)): Path<(String, String)>,
) -> Response {
    into_response(cluster::abort_move(&app, &topic, &partition).await)
}

async fn rebalance(State(app): AppState) -> Response {
    into_response(cluster::rebalance(&app).await)
}

/// Routes that answer without credentials.
const OPEN_ROUTES: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// What a route needs beyond a login: a grant on the `{topic}` in its path, or the admin grant.
fn needs(method: &axum::http::Method, route: &str) -> Option<Action> {
    use axum::http::Method;
    match (method, route) {
        (&Method::POST, "/v1/topics/{topic}/produce" | "/v1/topics/{topic}/produce/batch") => {
            Some(Action::Produce)
        }
        (&Method::GET, "/v1/topics/{topic}/consume")
        | (&Method::POST, "/v1/topics/{topic}/ack") => Some(Action::Consume),
        (
            _,
            "/v1/cluster/members"
            | "/v1/cluster/members/{id}/decommission"
            | "/v1/cluster/moves"
            | "/v1/cluster/moves/{topic}/{partition}"
            | "/v1/cluster/rebalance",
        ) => Some(Action::Admin),
        _ => None,
    }
}

/// Basic auth, then the route's grant: 401 without valid credentials (with the challenge), 429 when
/// the username's failure bucket is empty, 403 without the grant, all before the route reads its
/// query or body. Open routes and a node with auth off pass as [`Caller::Open`].
async fn authenticate(State(app): AppState, mut request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_string());
    if !app.auth.enabled()
        || route
            .as_deref()
            .is_some_and(|route| OPEN_ROUTES.contains(&route))
    {
        request.extensions_mut().insert(Caller::Open);
        return next.run(request).await;
    }
    let credentials = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| auth::parse_basic(value.as_bytes()));
    let Some(credentials) = credentials else {
        return into_response(
            Reply::error(401, "authentication required").with_header(auth::CHALLENGE),
        );
    };
    let user = app
        .metastore
        .view()
        .state
        .users()
        .get(&credentials.username)
        .cloned();
    match app.auth.login(&credentials, user.as_ref()).await {
        Ok(()) => {}
        Err(Refusal::Unauthenticated) => {
            return into_response(
                Reply::error(401, "authentication required").with_header(auth::CHALLENGE),
            )
        }
        Err(Refusal::Throttled) => {
            return into_response(
                Reply::error(429, "too many failed logins for this username; retry later")
                    .with_header(("retry-after", "12")),
            )
        }
    }
    let Some(user) = user else {
        // `login` refuses an unknown user; this is that refusal, kept total.
        return into_response(
            Reply::error(401, "authentication required").with_header(auth::CHALLENGE),
        );
    };
    let caller = Caller::User(Box::new(user));
    if let Some(action) = route
        .as_deref()
        .and_then(|route| needs(request.method(), route))
    {
        let mut topic = String::new();
        let allowed = if action == Action::Admin {
            caller.is_admin()
        } else {
            let (mut parts, body) = request.into_parts();
            topic = match Path::<Vec<(String, String)>>::from_request_parts(&mut parts, &()).await {
                Ok(Path(params)) => params
                    .into_iter()
                    .find(|(name, _)| name == "topic")
                    .map(|(_, value)| value)
                    .unwrap_or_default(),
                Err(_) => String::new(),
            };
            request = Request::from_parts(parts, body);
            caller.may(action, &topic)
        };
        if !allowed {
            let on = if topic.is_empty() {
                String::new()
            } else {
                format!(" on topic {topic:?}")
            };
            return into_response(Reply::error(
                403,
                &format!("forbidden: no {} grant{on}", action.as_str()),
            ));
        }
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
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
