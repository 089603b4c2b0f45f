//! The HTTP side (axum on tokio): the JSON API under `/api/` (a bearer token on every
//! call: missing or wrong -> 401 and nothing changes) and the dashboard page at `/`
//! (served without a token; it asks for one).
//!
//! Every refusal is JSON `{"error": "..."}` with a 4xx status: 400 a malformed or invalid
//! request (the message names the field), 401 no or a wrong token, 404 no such job or
//! route, 405 a wrong method, 409 a kill of an ended job, 413 a body over `--max-body`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{json, Value};

use super::service::{Service, ServiceError};
use super::spec::JobSpec;
use super::tokens::Tokens;

/// What the handlers share.
pub struct AppState {
    /// The service.
    pub service: Arc<Service>,
    /// The accepted tokens.
    pub tokens: Tokens,
    /// `/metrics`' counters.
    pub metrics: super::metrics::ServeMetrics,
}

/// The name of the token a request presented.
#[derive(Clone)]
struct Caller(String);

/// An HTTP error with a JSON body `{"error": message}` (`ringrec serve-model` answers
/// with it too).
pub struct ApiError(pub StatusCode, pub String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> ApiError {
        match e {
            ServiceError::Invalid(m) => ApiError(StatusCode::BAD_REQUEST, m),
            ServiceError::NotFound(id) => ApiError(StatusCode::NOT_FOUND, format!("there is no job {id}")),
            ServiceError::Conflict(m) => ApiError(StatusCode::CONFLICT, m),
            ServiceError::Internal(m) => ApiError(StatusCode::INTERNAL_SERVER_ERROR, m),
        }
    }
}

const PAGE: &str = include_str!("dashboard.html");

/// The router: `/`, `/api/...`, JSON 404s elsewhere.
pub fn router(state: Arc<AppState>, max_body: usize) -> Router {
    let api = Router::new()
        .route("/info", get(info))
        .route("/jobs", get(list).post(create))
        .route("/jobs/{id}", get(show))
        .route("/jobs/{id}/kill", post(kill))
        .route("/jobs/{id}/resubmit", post(resubmit))
        .route("/jobs/{id}/logs", get(logs))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), auth));
    let metrics = Router::new().route("/metrics", get(metrics_text)).layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .nest("/api", api)
        .merge(metrics)
        .route_layer(middleware::from_fn_with_state(state.clone(), timed))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError(StatusCode::NOT_FOUND, "no such route; the API is under /api/ (GET /api/jobs, POST /api/jobs, GET /api/jobs/{id}, POST /api/jobs/{id}/kill, GET /api/jobs/{id}/logs)".into())
}

/// A refused bearer token: 401 with `WWW-Authenticate: Bearer` and why.
pub struct Unauthorized(&'static str);

impl IntoResponse for Unauthorized {
    fn into_response(self) -> Response {
        let mut r = ApiError(StatusCode::UNAUTHORIZED, self.0.to_string()).into_response();
        r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        r
    }
}

/// The name of the token `headers` present, or why it is refused (`ringrec serve-model`
/// checks its requests with it too).
pub fn authorize(tokens: &Tokens, headers: &axum::http::HeaderMap) -> Result<String, Unauthorized> {
    let presented = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).map(str::trim);
    let Some(token) = presented else {
        return Err(Unauthorized("missing bearer token: send `Authorization: Bearer <token>` (make one with `ringrec serve token add NAME --state-dir DIR`)"));
    };
    tokens.check(token).ok_or(Unauthorized("token refused: it is not one of this service's tokens"))
}

/// Observes each call's latency under its route's pattern (`/api/jobs/{id}`).
async fn timed(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let route = req.extensions().get::<axum::extract::MatchedPath>().map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = req.method().to_string();
    let resp = next.run(req).await;
    st.metrics.observe(&route, &method, started.elapsed().as_secs_f64());
    resp
}

async fn metrics_text(State(st): State<Arc<AppState>>) -> Response {
    match st.metrics.render(&st.service) {
        Ok(text) => ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response(),
        Err(e) => ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the metrics: {e}")).into_response(),
    }
}

async fn auth(State(st): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    match authorize(&st.tokens, req.headers()) {
        Ok(name) => {
            req.extensions_mut().insert(Caller(name));
            next.run(req).await
        }
        Err(refused) => refused.into_response(),
    }
}

fn job_id(s: &str) -> Result<i64, ApiError> {
    match s.parse::<i64>() {
        Ok(id) if id > 0 => Ok(id),
        _ => Err(ApiError(StatusCode::BAD_REQUEST, format!("`{}` is not a job id (a positive integer)", s.escape_debug()))),
    }
}

/// Runs `f` (which may touch SQLite or wait for the worker) off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ServiceError> + Send + 'static) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(ApiError::from),
        Err(e) => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("the request's task failed: {e}"))),
    }
}

async fn info(State(st): State<Arc<AppState>>, Extension(who): Extension<Caller>) -> Json<Value> {
    let l = &st.service.cfg.limits;
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "you": who.0,
        "backends": st.service.describe_backends(),
        "data_roots": l.data_roots,
        "max_ranks": l.max_ranks,
        "states": super::state::JobState::ALL,
    }))
}

fn json_bytes(b: Bytes) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], b).into_response()
}

async fn list(State(st): State<Arc<AppState>>) -> Response {
    json_bytes(st.service.list())
}

async fn show(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    Ok(json_bytes(st.service.show(job_id(&id)?)?))
}

fn parse_spec(body: &[u8]) -> Result<JobSpec, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError(StatusCode::BAD_REQUEST, "empty body: send a job spec as a JSON object, e.g. {\"ranks\": 2, \"args\": [\"--epochs\", \"1\"]}".into()));
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("the body is not JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError(StatusCode::BAD_REQUEST, "the job spec must be a JSON object, e.g. {\"ranks\": 2}".into()));
    }
    serde_json::from_value::<JobSpec>(v).map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("the job spec is not valid: {e}")))
}

async fn create(State(st): State<Arc<AppState>>, Extension(who): Extension<Caller>, body: Bytes) -> Result<(StatusCode, Json<Value>), ApiError> {
    let spec = parse_spec(&body)?;
    let svc = st.service.clone();
    let (id, state) = blocking(move || svc.create(spec, &who.0, None)).await?;
    st.metrics.submissions.inc();
    Ok((StatusCode::CREATED, Json(json!({ "id": id, "state": state }))))
}

async fn resubmit(State(st): State<Arc<AppState>>, Extension(who): Extension<Caller>, Path(id): Path<String>) -> Result<(StatusCode, Json<Value>), ApiError> {
    let id = job_id(&id)?;
    let svc = st.service.clone();
    let (new, state) = blocking(move || svc.resubmit(id, &who.0)).await?;
    st.metrics.submissions.inc();
    Ok((StatusCode::CREATED, Json(json!({ "id": new, "state": state, "resubmit_of": id }))))
}

async fn kill(State(st): State<Arc<AppState>>, Extension(who): Extension<Caller>, Path(id): Path<String>) -> Result<(StatusCode, Json<Value>), ApiError> {
    let id = job_id(&id)?;
    let svc = st.service.clone();
    let state = blocking(move || svc.kill(id, &who.0)).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "id": id, "state": state }))))
}

#[derive(serde::Deserialize)]
struct LogQuery {
    tail: Option<u64>,
}

async fn logs(State(st): State<Arc<AppState>>, Path(id): Path<String>, q: Result<Query<LogQuery>, axum::extract::rejection::QueryRejection>) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let tail = match q {
        Ok(Query(q)) => q.tail.unwrap_or(256 << 10).min(16 << 20),
        Err(e) => return Err(ApiError(StatusCode::BAD_REQUEST, format!("tail must be a number of bytes: {e}"))),
    };
    let svc = st.service.clone();
    let text = blocking(move || svc.logs(id, tail)).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response())
}
