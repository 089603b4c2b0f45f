//! `ringrec serve-model --model DIR --listen ADDR`: an online scoring service (one
//! process, no mpirun). It loads a bundle or the newest good checkpoint of a directory
//! ([`ringrec::train::scorer::Scorer`]: the table mapped read-only, scoring on the CPU
//! through `predict`'s one scoring step) and answers:
//!
//! - `POST /v1/score`: rows as JSON or Criteo TSV lines ([`request`]) ->
//!   `{"probabilities": [...], "model": {"version": V, "step": S}}`; concurrent requests
//!   are coalesced into model batches ([`batcher`]). Refusals are JSON `{"error": ...}`:
//!   400 naming the row and field, 401 without a valid token (with `--state-dir`), 413 a
//!   body over `--max-body`, 503 when `--max-queue` requests already wait.
//! - `GET /metrics`: Prometheus text ([`metrics`]).
//! - `GET /v1/model`: the model served.
//!
//! `--watch` swaps in a newer model when one appears ([`live`]), without dropping or
//! failing a request. With `--state-dir DIR` every request needs one of `ringrec serve`'s
//! bearer tokens of that directory (`ringrec serve token add NAME --state-dir DIR`).

pub mod batcher;
pub mod live;
pub mod metrics;
pub mod request;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ringrec::train::source::Fallback;
use serde_json::json;

use super::serve::api::{authorize, ApiError};
use super::serve::tokens::Tokens;

/// Flags of `ringrec serve-model`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeModelArgs {
    /// The model: a checkpoint directory (its newest checkpoint that passes every check),
    /// one checkpoint (DIR/step-N), or an export bundle (ringrec export).
    #[arg(long)]
    pub model: PathBuf,
    /// Address to listen on (port 0: any free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:8760")]
    pub listen: String,
    /// Swap in a newer model when one appears at --model (a checkpoint directory's new
    /// LATEST, a bundle replaced), checked every --watch-secs.
    #[arg(long)]
    pub watch: bool,
    /// Seconds between checks of --watch.
    #[arg(long, default_value_t = 2.0)]
    pub watch_secs: f64,
    /// Require `ringrec serve`'s bearer tokens of this state directory on every request.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Most rows in one model batch; a longer request is scored in batches of this many
    /// (as `ringrec predict --batch` cuts its rows).
    #[arg(long, default_value_t = 512)]
    pub max_batch: usize,
    /// Microseconds the first request of a batch waits for others to join it.
    #[arg(long, default_value_t = 200)]
    pub max_wait_us: u64,
    /// Scoring threads (default: the cores).
    /// [env: RINGREC_THREADS]
    #[arg(long)]
    pub threads: Option<usize>,
    /// Most requests waiting for the scoring thread; a request past it is refused at once
    /// with 503 (and `Retry-After: 1`) instead of waiting behind the others.
    #[arg(long, default_value_t = 1024)]
    pub max_queue: usize,
    /// The largest request body, in bytes.
    #[arg(long, default_value_t = 8 << 20)]
    pub max_body: usize,
    /// Refuse a checkpoint directory whose newest checkpoint is damaged (at start and on
    /// a swap), instead of using the newest one that passes every check.
    #[arg(long)]
    pub require_newest: bool,
}

/// What the handlers share.
struct App {
    tokens: Option<Tokens>,
    queue: mpsc::SyncSender<batcher::Job>,
    max_queue: usize,
    live: Arc<live::Live>,
    metrics: Arc<metrics::Metrics>,
}

/// Runs the service until SIGTERM or SIGINT.
pub fn run(args: &ServeModelArgs) -> anyhow::Result<()> {
    let addr: SocketAddr = args.listen.parse().with_context(|| format!("--listen {}: not an address like 127.0.0.1:8760", args.listen))?;
    anyhow::ensure!(args.max_batch > 0, "--max-batch must be positive");
    anyhow::ensure!(args.max_queue > 0, "--max-queue must be positive");
    anyhow::ensure!(args.watch_secs > 0.0 && args.watch_secs.is_finite(), "--watch-secs must be a positive number of seconds");
    let tokens = args.state_dir.as_ref().map(|d| Tokens::open(d)).transpose()?;
    if tokens.as_ref().is_some_and(|t| t.count() == 0) {
        ringrec::eprint_line("ringrec serve-model: warning: the state directory has no tokens yet: every request is refused until `ringrec serve token add NAME --state-dir DIR` makes one");
    }
    if tokens.is_none() && !addr.ip().is_loopback() {
        ringrec::eprint_line(&format!("ringrec serve-model: warning: listening on {addr} without tokens (--state-dir): anyone who reaches it can score"));
    }
    let rc = ringrec::config::RuntimeConfig::from_env().context("reading RINGREC_* settings")?;
    let threads = super::or_env(args.threads, "RINGREC_THREADS")?.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).max(1);
    let _ = rayon::ThreadPoolBuilder::new().num_threads(threads).build_global();
    let fallback = if args.require_newest { Fallback::Refuse("leave out --require-newest to serve it") } else { Fallback::Allow };
    let opts = live::LoadOptions { model: args.model.clone(), fallback, shm_dir: rc.shm_dir.clone(), threads };
    let first = opts.load(1)?;
    let metrics = Arc::new(metrics::Metrics::new());
    metrics.model_loaded(&first);
    let described = format!("{}, {} table rows, on {}", first.describe, first.table_rows, first.scorer.lock().unwrap_or_else(|e| e.into_inner()).device());
    let live = Arc::new(live::Live::new(first));
    let (tx, rx) = mpsc::sync_channel(args.max_queue);
    let limits = batcher::Limits { max_batch: args.max_batch, max_wait: Duration::from_micros(args.max_wait_us) };
    {
        let (live, metrics) = (live.clone(), metrics.clone());
        std::thread::Builder::new().name("score".into()).spawn(move || batcher::run(rx, live, limits, metrics)).context("starting the scoring thread")?;
    }
    if args.watch {
        let (live, metrics, every) = (live.clone(), metrics.clone(), Duration::from_secs_f64(args.watch_secs));
        std::thread::Builder::new().name("watch".into()).spawn(move || live::watch(live, opts, every, metrics)).context("starting the model watcher")?;
    }
    let app = Arc::new(App { tokens, queue: tx, max_queue: args.max_queue, live, metrics });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listening on {addr} (in use? pick another --listen)"))?;
        let bound = listener.local_addr()?;
        println!("ringrec serve-model: listening on http://{bound} ({described}{})", if args.watch { "; watching for newer models" } else { "" });
        let _ = std::io::stdout().flush();
        axum::serve(listener, router(app, args.max_body)).with_graceful_shutdown(super::serve::shutdown()).await.context("serving HTTP")
    })?;
    ringrec::eprint_line("ringrec serve-model: stopped");
    Ok(())
}

fn router(app: Arc<App>, max_body: usize) -> Router {
    Router::new()
        .route("/v1/score", post(score))
        .route("/v1/model", get(model))
        .route("/metrics", get(metrics_text))
        .fallback(|| async { ApiError(StatusCode::NOT_FOUND, "no such route: POST /v1/score, GET /v1/model, GET /metrics".into()) })
        .layer(middleware::from_fn_with_state(app.clone(), auth))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(app)
}

async fn auth(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if let Some(t) = &app.tokens {
        if let Err(refused) = authorize(t, req.headers()) {
            if req.uri().path() == "/v1/score" {
                app.metrics.answered(StatusCode::UNAUTHORIZED.as_u16(), 0, 0.0);
            }
            return refused.into_response();
        }
    }
    next.run(req).await
}

async fn score(State(app): State<Arc<App>>, body: Result<Bytes, axum::extract::rejection::BytesRejection>) -> Response {
    let started = Instant::now();
    let (mut resp, rows) = match scored(&app, body).await {
        Ok((r, n)) => (r, n),
        Err(e) => (e.into_response(), 0),
    };
    if resp.status() == StatusCode::SERVICE_UNAVAILABLE {
        resp.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    app.metrics.answered(resp.status().as_u16(), rows, started.elapsed().as_secs_f64());
    resp
}

async fn scored(app: &App, body: Result<Bytes, axum::extract::rejection::BytesRejection>) -> Result<(Response, usize), ApiError> {
    let body = body.map_err(|e| ApiError(e.status(), format!("reading the body: {}", e.body_text())))?;
    let model = app.live.current();
    let parsed = request::parse_rows(&body, model.fields, &model.dense_transforms, &model.lists).map_err(|m| ApiError(StatusCode::BAD_REQUEST, m))?;
    drop(model);
    let rows = parsed.len();
    let (reply, answer) = tokio::sync::oneshot::channel();
    let gone = || ApiError(StatusCode::SERVICE_UNAVAILABLE, "the scoring thread has stopped".into());
    match app.queue.try_send(batcher::Job { rows: parsed, reply }) {
        Ok(()) => {}
        Err(mpsc::TrySendError::Full(_)) => return Err(ApiError(StatusCode::SERVICE_UNAVAILABLE, format!("the scoring queue is full ({} requests waiting, --max-queue): retry later", app.max_queue))),
        Err(mpsc::TrySendError::Disconnected(_)) => return Err(gone()),
    }
    let s = answer.await.map_err(|_| gone())?.map_err(|m| ApiError(StatusCode::INTERNAL_SERVER_ERROR, m))?;
    // Serialized as f32 (the shortest form that reads back as the same f32).
    #[derive(serde::Serialize)]
    struct Model {
        version: u64,
        step: Option<u64>,
    }
    #[derive(serde::Serialize)]
    struct Answer {
        probabilities: Vec<f32>,
        model: Model,
    }
    Ok((Json(Answer { probabilities: s.probabilities, model: Model { version: s.version, step: s.step } }).into_response(), rows))
}

async fn model(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    let m = app.live.current();
    Json(json!({
        "version": m.version,
        "step": m.step,
        "path": m.path,
        "model": m.describe,
        "table_rows": m.table_rows,
        "multi_hot": m.lists,
        "loaded_at": m.loaded_at.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0),
    }))
}

async fn metrics_text(State(app): State<Arc<App>>) -> Response {
    match app.metrics.render() {
        Ok(text) => ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text).into_response(),
        Err(e) => ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the metrics: {e}")).into_response(),
    }
}
