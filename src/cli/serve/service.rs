//! The service's core: the records (SQLite, then memory), one worker thread that submits,
//! polls, kills and re-attaches, and the read side the API serves from memory.
//!
//! Every change is written to the database first, then to the in-memory view the API
//! reads, so whatever the API has shown or acknowledged survives a SIGKILL. The worker is
//! the only writer of a job's state once it exists (kills reach it as commands), so a kill
//! can never race a submission of the same job.

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock, RwLockWriteGuard};

use axum::body::Bytes;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::analyze;
use super::backend::{Cluster, Observed, Outcome, Submission, Tracked};
use super::spec::{BackendKind, JobFiles, JobSpec, Limits};
use super::state::JobState;
use super::store::{now, Changes, JobRecord, Store, Transition};

/// A refusal or failure the API turns into an HTTP status.
#[derive(Debug)]
pub enum ServiceError {
    /// 400: the request is wrong (the message says how).
    Invalid(String),
    /// 404: no such job.
    NotFound(i64),
    /// 409: the job's state does not allow it.
    Conflict(String),
    /// 500/502: the service or its cluster failed.
    Internal(String),
}

/// The service's settings.
pub struct Config {
    /// Where the database, tokens and job directories live.
    pub state_dir: PathBuf,
    /// Between two polls of the clusters.
    pub poll: Duration,
    /// After a kill, how long a job may take to stop gracefully before it is forced.
    pub kill_grace: Duration,
    /// What specs may ask for.
    pub limits: Limits,
}

enum Command {
    /// Submit what was received.
    Wake,
    /// Kill a job (by the token named), answering with its new state.
    Kill(i64, String, mpsc::Sender<Result<JobState, ServiceError>>),
}

/// The running service.
pub struct Service {
    /// Its settings.
    pub cfg: Config,
    store: Mutex<Store>,
    jobs: RwLock<BTreeMap<i64, JobRecord>>,
    backends: Vec<Arc<dyn Cluster>>,
    worker: Mutex<mpsc::Sender<Command>>,
    /// Bumped (under the write lock) by every change of `jobs`.
    generation: AtomicU64,
    /// Serialized answers of `list` (key None) and `show`, with the generation they show:
    /// status polls between two changes cost a lookup, not a serialization.
    answers: Mutex<HashMap<Option<i64>, (u64, Bytes)>>,
}

/// Most metrics points kept in memory per job (all are in the database).
const MAX_POINTS: usize = 20_000;

impl Service {
    /// Opens the records, resolves jobs left in flight by an earlier instance and starts
    /// the worker thread.
    pub fn start(cfg: Config, backends: Vec<Arc<dyn Cluster>>) -> anyhow::Result<Arc<Service>> {
        use anyhow::Context;
        std::fs::create_dir_all(cfg.state_dir.join("jobs")).with_context(|| format!("creating {}/jobs", cfg.state_dir.display()))?;
        std::fs::create_dir_all(cfg.state_dir.join("cache"))?;
        let store = Store::open(&cfg.state_dir.join("jobs.db"))?;
        let mut jobs: BTreeMap<i64, JobRecord> = store.load_all()?.into_iter().map(|j| (j.id, j)).collect();
        for j in jobs.values_mut() {
            if j.metrics.len() > MAX_POINTS {
                j.metrics.drain(..j.metrics.len() - MAX_POINTS);
            }
        }
        let (tx, rx) = mpsc::channel();
        let svc = Arc::new(Service { cfg, store: Mutex::new(store), jobs: RwLock::new(jobs), backends, worker: Mutex::new(tx), generation: AtomicU64::new(0), answers: Mutex::new(HashMap::new()) });
        svc.recover();
        let w = svc.clone();
        std::thread::Builder::new().name("serve-worker".into()).spawn(move || w.work(rx)).context("starting the worker thread")?;
        Ok(svc)
    }

    /// The back end of kind `k`, when this service has it.
    fn backend(&self, k: BackendKind) -> Option<&Arc<dyn Cluster>> {
        self.backends.iter().find(|b| b.kind() == k)
    }

    /// One line per back end.
    pub fn describe_backends(&self) -> Vec<String> {
        self.backends.iter().map(|b| b.describe()).collect()
    }

    /// The files of job `id`.
    pub fn files(&self, id: i64) -> JobFiles {
        JobFiles { dir: self.cfg.state_dir.join("jobs").join(id.to_string()), cache: self.cfg.state_dir.join("cache") }
    }

    /// The jobs, to change them (the cached answers go stale).
    fn jobs_mut(&self) -> RwLockWriteGuard<'_, BTreeMap<i64, JobRecord>> {
        let g = self.jobs.write().unwrap_or_else(|e| e.into_inner());
        self.generation.fetch_add(1, Ordering::SeqCst);
        g
    }

    /// The JSON of `key` (None: the list), from the cache when nothing changed since.
    fn answer(&self, key: Option<i64>) -> Result<Bytes, ServiceError> {
        let jobs = self.jobs.read().unwrap_or_else(|e| e.into_inner());
        let gen = self.generation.load(Ordering::SeqCst);
        if let Some((g, b)) = self.answers.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            if *g == gen {
                return Ok(b.clone());
            }
        }
        let v = match key {
            None => Value::Array(jobs.values().rev().map(|j| self.view(j, false)).collect()),
            Some(id) => jobs.get(&id).map(|j| self.view(j, true)).ok_or(ServiceError::NotFound(id))?,
        };
        drop(jobs);
        let b = Bytes::from(v.to_string());
        self.answers.lock().unwrap_or_else(|e| e.into_inner()).insert(key, (gen, b.clone()));
        Ok(b)
    }

    fn send(&self, c: Command) {
        let _ = self.worker.lock().unwrap_or_else(|e| e.into_inner()).send(c);
    }

    // ---- the API's side --------------------------------------------------------------

    /// Records a new job (validated; `received`) and has the worker submit it.
    pub fn create(&self, spec: JobSpec, owner: &str, resubmit_of: Option<i64>) -> Result<(i64, JobState), ServiceError> {
        let plan = self.cfg.limits.plan(&spec).map_err(|e| ServiceError::Invalid(e.0))?;
        if let Some(w) = plan.warm_start {
            let ok = self.jobs.read().unwrap_or_else(|e| e.into_inner()).contains_key(&w);
            if !ok {
                return Err(ServiceError::Invalid(format!("warm_start: there is no job {w}")));
            }
            if ringrec::train::checkpoint::latest_step(&self.files(w).checkpoints()).is_none() && ringrec::train::checkpoint::list(&self.files(w).checkpoints()).is_empty() {
                return Err(ServiceError::Invalid(format!("warm_start: job {w} has no checkpoint (give it checkpoint_every)")));
            }
        }
        let at = now();
        let id = {
            let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
            store.insert(&plan.name, owner, plan.backend, &spec, resubmit_of, at).map_err(|e| ServiceError::Internal(format!("recording the job: {e:#}")))?
        };
        let reason = match resubmit_of {
            Some(o) => format!("resubmitted from job {o} by {owner}"),
            None => format!("submitted by {owner}"),
        };
        let rec = JobRecord {
            id,
            name: plan.name.clone(),
            owner: owner.to_string(),
            backend: plan.backend,
            spec,
            state: JobState::Received,
            cluster_id: None,
            created_at: at,
            updated_at: at,
            exit_code: None,
            cause: None,
            summary: None,
            resubmit_of,
            metrics_offset: 0,
            transitions: vec![Transition { state: JobState::Received, at, reason }],
            metrics: Vec::new(),
            metrics_seen: 0,
            ranks: BTreeMap::new(),
        };
        self.jobs_mut().insert(id, rec);
        self.send(Command::Wake);
        Ok((id, JobState::Received))
    }

    /// Resubmits job `id`'s stored spec as a new job.
    pub fn resubmit(&self, id: i64, owner: &str) -> Result<(i64, JobState), ServiceError> {
        let spec = self.jobs.read().unwrap_or_else(|e| e.into_inner()).get(&id).map(|j| j.spec.clone()).ok_or(ServiceError::NotFound(id))?;
        self.create(spec, owner, Some(id))
    }

    /// Asks the worker to kill job `id`; its state after the request.
    pub fn kill(&self, id: i64, owner: &str) -> Result<JobState, ServiceError> {
        if !self.jobs.read().unwrap_or_else(|e| e.into_inner()).contains_key(&id) {
            return Err(ServiceError::NotFound(id));
        }
        let (tx, rx) = mpsc::channel();
        self.send(Command::Kill(id, owner.to_string(), tx));
        rx.recv_timeout(Duration::from_secs(60)).map_err(|_| ServiceError::Internal("the worker did not answer within 60 s; try again".into()))?
    }

    /// Every job, newest first, without its curves: `GET /api/jobs` (JSON).
    pub fn list(&self) -> Bytes {
        self.answer(None).unwrap_or_default()
    }

    /// One job in full: `GET /api/jobs/{id}` (JSON).
    pub fn show(&self, id: i64) -> Result<Bytes, ServiceError> {
        self.answer(Some(id))
    }

    /// Every job's id, state and last interval report (`GET /metrics`).
    pub fn last_reports(&self) -> Vec<(i64, JobState, Option<Value>)> {
        self.jobs.read().unwrap_or_else(|e| e.into_inner()).values().map(|j| (j.id, j.state, j.metrics.last().cloned())).collect()
    }

    /// The log of job `id` (its last `tail` bytes).
    pub fn logs(&self, id: i64, tail: u64) -> Result<String, ServiceError> {
        if !self.jobs.read().unwrap_or_else(|e| e.into_inner()).contains_key(&id) {
            return Err(ServiceError::NotFound(id));
        }
        Ok(read_tail(&self.files(id).log(), tail).unwrap_or_default())
    }

    fn view(&self, j: &JobRecord, full: bool) -> Value {
        let ranks: Vec<Value> = j.ranks.values().cloned().collect();
        let progress = j.ranks.get(&0).map(|p| json!({ "step": p.get("step"), "total_steps": p.get("total_steps") }));
        let mut v = json!({
            "id": j.id,
            "name": j.name,
            "owner": j.owner,
            "backend": j.backend.as_str(),
            "state": j.state,
            "cluster_id": j.cluster_id,
            "created_at": j.created_at,
            "updated_at": j.updated_at,
            "exit_code": j.exit_code,
            "cause": j.cause,
            "ranks_requested": j.spec.ranks.unwrap_or(1),
            "progress": progress,
            "last_metrics": j.metrics.last(),
            "resubmit_of": j.resubmit_of,
        });
        if full {
            v["spec"] = serde_json::to_value(&j.spec).unwrap_or(Value::Null);
            v["transitions"] = serde_json::to_value(&j.transitions).unwrap_or(Value::Null);
            v["ranks"] = Value::Array(ranks);
            v["metrics"] = Value::Array(j.metrics.clone());
            v["summary"] = j.summary.clone().unwrap_or(Value::Null);
        }
        v
    }

    // ---- the worker ------------------------------------------------------------------

    fn snapshot(&self, pred: impl Fn(&JobRecord) -> bool) -> Vec<(i64, JobState, Option<String>, BackendKind)> {
        let jobs = self.jobs.read().unwrap_or_else(|e| e.into_inner());
        jobs.values().filter(|j| pred(j)).map(|j| (j.id, j.state, j.cluster_id.clone(), j.backend)).collect()
    }

    /// Records `id` entering `state` (database, then memory). Errors are printed: the
    /// worker goes on, and the next poll tries again.
    fn transition(&self, id: i64, state: JobState, reason: &str, changes: Changes) -> bool {
        let at = now();
        let written = self.store.lock().unwrap_or_else(|e| e.into_inner()).transition(id, state, reason, at, &changes);
        if let Err(e) = written {
            ringrec::eprint_line(&format!("ringrec serve: error: recording job {id} as {state}: {e:#}"));
            return false;
        }
        let mut jobs = self.jobs_mut();
        if let Some(j) = jobs.get_mut(&id) {
            j.state = state;
            j.updated_at = at;
            j.transitions.push(Transition { state, at, reason: reason.to_string() });
            if changes.cluster_id.is_some() {
                j.cluster_id = changes.cluster_id;
            }
            if changes.exit_code.is_some() {
                j.exit_code = changes.exit_code;
            }
            if changes.cause.is_some() {
                j.cause = changes.cause;
            }
            if changes.summary.is_some() {
                j.summary = changes.summary;
            }
        }
        true
    }

    /// After a restart: jobs caught while submitting are looked for in their cluster
    /// (found: re-attached; not found: submitted again); the first poll re-attaches the
    /// others or marks them unknown.
    fn recover(&self) {
        for (id, state, cluster_id, backend) in self.snapshot(|j| !j.state.is_final()) {
            let in_flight = state == JobState::Submitting || (state.is_tracked() && cluster_id.is_none());
            if !in_flight {
                continue;
            }
            self.transition(id, JobState::Unknown, "the service stopped while submitting it; looking for it in the cluster", Changes::default());
            let found = self.backend(backend).and_then(|b| b.find(id, &self.files(id)));
            match found {
                Some(cid) => {
                    let reason = format!("found in the cluster as {cid} after the restart");
                    self.transition(id, JobState::Submitted, &reason, Changes { cluster_id: Some(cid), ..Changes::default() });
                }
                None => {
                    self.transition(id, JobState::Received, "not found in the cluster after the restart: submitting it again", Changes::default());
                }
            }
        }
        let tracked = self.snapshot(|j| j.state.is_tracked()).len();
        if tracked > 0 {
            ringrec::eprint_line(&format!("ringrec serve: re-attaching to {tracked} job(s) in flight"));
        }
        self.poll_all();
    }

    fn work(self: Arc<Self>, rx: mpsc::Receiver<Command>) {
        let mut next = Instant::now();
        let mut forced: HashSet<i64> = HashSet::new();
        loop {
            let wait = next.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(Command::Wake) => self.submit_received(),
                Ok(Command::Kill(id, who, reply)) => {
                    let r = self.do_kill(id, &who, &mut forced);
                    let _ = reply.send(r);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.submit_received();
                    self.poll_all();
                    self.escalate(&mut forced);
                    next = Instant::now() + self.cfg.poll;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn submit_received(&self) {
        for (id, _, _, backend) in self.snapshot(|j| j.state == JobState::Received) {
            self.submit(id, backend);
        }
    }

    fn submit(&self, id: i64, backend: BackendKind) {
        let spec = match self.jobs.read().unwrap_or_else(|e| e.into_inner()).get(&id) {
            Some(j) => j.spec.clone(),
            None => return,
        };
        let fail = |why: String| {
            self.transition(id, JobState::SubmitFailed, &why, Changes { cause: Some(why.clone()), ..Changes::default() });
        };
        // Validated again: a data file may have gone since it was received.
        let plan = match self.cfg.limits.plan(&spec) {
            Ok(p) => p,
            Err(e) => return fail(format!("the spec is no longer valid: {}", e.0)),
        };
        let Some(b) = self.backend(backend).cloned() else { return fail(format!("this service has no {} back end", backend.as_str())) };
        if !self.transition(id, JobState::Submitting, &format!("handing it to the {} back end", backend.as_str()), Changes::default()) {
            return;
        }
        let files = self.files(id);
        if let Err(e) = std::fs::create_dir_all(&files.dir) {
            return fail(format!("creating {}: {e}", files.dir.display()));
        }
        if let Some(w) = plan.warm_start {
            if let Err(e) = link_tree(&self.files(w).checkpoints(), &files.checkpoints()) {
                return fail(format!("warm start: copying job {w}'s checkpoints: {e}"));
            }
        }
        match b.submit(&Submission { id, plan: &plan, files: &files }) {
            Ok(cid) => {
                let reason = format!("accepted by the {} back end as {cid}", backend.as_str());
                self.transition(id, JobState::Submitted, &reason, Changes { cluster_id: Some(cid), ..Changes::default() });
            }
            Err(e) => fail(format!("{e:#}")),
        }
    }

    fn do_kill(&self, id: i64, who: &str, forced: &mut HashSet<i64>) -> Result<JobState, ServiceError> {
        let (state, cluster_id, backend) = {
            let jobs = self.jobs.read().unwrap_or_else(|e| e.into_inner());
            let j = jobs.get(&id).ok_or(ServiceError::NotFound(id))?;
            (j.state, j.cluster_id.clone(), j.backend)
        };
        if state.is_final() {
            return Err(ServiceError::Conflict(format!("job {id} has already ended ({state}); resubmit it to run it again")));
        }
        let Some(cid) = cluster_id else {
            self.transition(id, JobState::Stopped, &format!("killed by {who} before it was submitted"), Changes::default());
            return Ok(JobState::Stopped);
        };
        let b = self.backend(backend).cloned().ok_or_else(|| ServiceError::Internal(format!("this service has no {} back end any more", backend.as_str())))?;
        let files = self.files(id);
        let force = state == JobState::StopRequested;
        if !force && !self.transition(id, JobState::StopRequested, &format!("kill requested by {who}"), Changes::default()) {
            return Err(ServiceError::Internal("could not record the kill; try again".into()));
        }
        b.kill(&Tracked { id, cluster_id: &cid, files: &files }, force).map_err(|e| ServiceError::Internal(format!("killing job {id}: {e:#}")))?;
        if force {
            forced.insert(id);
        }
        Ok(JobState::StopRequested)
    }

    /// Jobs asked to stop that outlived the grace period are killed at once.
    fn escalate(&self, forced: &mut HashSet<i64>) {
        let grace = self.cfg.kill_grace.as_secs_f64();
        let late: Vec<(i64, String, BackendKind)> = {
            let jobs = self.jobs.read().unwrap_or_else(|e| e.into_inner());
            jobs.values()
                .filter(|j| j.state == JobState::StopRequested && !forced.contains(&j.id))
                .filter(|j| j.transitions.last().is_some_and(|t| now() - t.at > grace))
                .filter_map(|j| j.cluster_id.clone().map(|c| (j.id, c, j.backend)))
                .collect()
        };
        for (id, cid, backend) in late {
            forced.insert(id);
            if let Some(b) = self.backend(backend) {
                if let Err(e) = b.kill(&Tracked { id, cluster_id: &cid, files: &self.files(id) }, true) {
                    ringrec::eprint_line(&format!("ringrec serve: warning: forcing job {id} to stop: {e:#}"));
                }
            }
        }
    }

    fn poll_all(&self) {
        for b in &self.backends {
            let jobs = self.snapshot(|j| j.state.is_tracked() && j.backend == b.kind());
            let files: Vec<JobFiles> = jobs.iter().map(|j| self.files(j.0)).collect();
            let tracked: Vec<Tracked> = jobs.iter().zip(&files).filter_map(|((id, _, cid, _), f)| cid.as_deref().map(|c| Tracked { id: *id, cluster_id: c, files: f })).collect();
            let seen = b.poll(&tracked);
            for (t, o) in tracked.iter().zip(seen) {
                let state = jobs.iter().find(|j| j.0 == t.id).map_or(JobState::Unknown, |j| j.1);
                self.observe(t.id, state, t.files, o);
            }
        }
    }

    /// Takes in what the cluster says of one job: metrics, progress, and a state change.
    fn observe(&self, id: i64, state: JobState, files: &JobFiles, o: Observed) {
        if let Observed::NoAnswer(why) = &o {
            ringrec::eprint_line(&format!("ringrec serve: warning: job {id}: no answer from its cluster ({why}); asking again at the next poll"));
            return;
        }
        if matches!(o, Observed::Running | Observed::Ended { .. }) || state == JobState::StopRequested {
            self.ingest(id, files);
        }
        let (next, reason, changes) = match o {
            Observed::Queued | Observed::Running if state == JobState::StopRequested => return,
            Observed::Queued => (JobState::Queued, "waiting for resources".to_string(), Changes::default()),
            Observed::Running => (JobState::Running, "its ranks run".to_string(), Changes::default()),
            Observed::Paused => (JobState::Paused, "suspended by the cluster".to_string(), Changes::default()),
            Observed::Unknown(why) | Observed::NoAnswer(why) => (JobState::Unknown, why, Changes::default()),
            Observed::Ended { outcome, code, detail } => {
                let log = read_tail(&files.log(), 4 << 20).unwrap_or_default();
                let summary = last_summary(&log);
                let next = match outcome {
                    Outcome::Succeeded => JobState::Succeeded,
                    Outcome::Cancelled => JobState::Stopped,
                    Outcome::Failed if state == JobState::StopRequested => JobState::Stopped,
                    Outcome::Failed => JobState::Failed,
                };
                let cause = (next == JobState::Failed).then(|| analyze::cause(&log, code));
                (next, detail, Changes { exit_code: code, cause, summary, ..Changes::default() })
            }
        };
        if next != state {
            self.transition(id, next, &reason, changes);
        }
    }

    /// Reads the job's new metrics lines and its ranks' progress into the records.
    fn ingest(&self, id: i64, files: &JobFiles) {
        let (offset, first, old_ranks) = match self.jobs.read().unwrap_or_else(|e| e.into_inner()).get(&id) {
            Some(j) => (j.metrics_offset, j.metrics_seen, j.ranks.clone()),
            None => return,
        };
        let (points, new_offset) = read_lines(&files.metrics(), offset);
        let mut ranks = BTreeMap::new();
        if let Ok(dir) = std::fs::read_dir(files.progress()) {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(r) = name.strip_prefix("rank-").and_then(|r| r.strip_suffix(".json")).and_then(|r| r.parse::<u32>().ok()) else { continue };
                let Ok(v) = std::fs::read(e.path()).map_err(|_| ()).and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|_| ())) else { continue };
                if old_ranks.get(&r) != Some(&v) {
                    ranks.insert(r, v);
                }
            }
        }
        if points.is_empty() && new_offset == offset && ranks.is_empty() {
            return;
        }
        let written = self.store.lock().unwrap_or_else(|e| e.into_inner()).observe(id, first, &points, new_offset, &ranks);
        if let Err(e) = written {
            ringrec::eprint_line(&format!("ringrec serve: error: recording job {id}'s metrics: {e:#}"));
            return;
        }
        let mut jobs = self.jobs_mut();
        if let Some(j) = jobs.get_mut(&id) {
            j.metrics_offset = new_offset;
            j.metrics_seen += points.len();
            j.metrics.extend(points);
            if j.metrics.len() > MAX_POINTS {
                let drop = j.metrics.len() - MAX_POINTS;
                j.metrics.drain(..drop);
            }
            j.ranks.extend(ranks);
        }
    }
}

/// The complete JSON lines of `path` from byte `offset` on, and the offset after them
/// (a line still being written stays for the next read).
fn read_lines(path: &std::path::Path, offset: u64) -> (Vec<Value>, u64) {
    let Ok(mut f) = std::fs::File::open(path) else { return (Vec::new(), offset) };
    if f.seek(SeekFrom::Start(offset)).is_err() {
        return (Vec::new(), offset);
    }
    let mut buf = Vec::new();
    if f.take(16 << 20).read_to_end(&mut buf).is_err() {
        return (Vec::new(), offset);
    }
    let Some(end) = buf.iter().rposition(|b| *b == b'\n') else { return (Vec::new(), offset) };
    let points = buf[..end].split(|b| *b == b'\n').filter_map(|l| serde_json::from_slice::<Value>(l).ok()).filter(Value::is_object).collect();
    (points, offset + end as u64 + 1)
}

/// The last `n` bytes of a file (lossy UTF-8, from a line start).
pub fn read_tail(path: &std::path::Path, n: u64) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let from = len.saturating_sub(n);
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).ok()?;
    let start = if from > 0 { buf.iter().position(|b| *b == b'\n').map_or(0, |p| p + 1) } else { 0 };
    Some(String::from_utf8_lossy(&buf[start..]).into_owned())
}

/// The last `--json` summary line of `ringrec train` in a log.
fn last_summary(log: &str) -> Option<Value> {
    log.lines().rev().filter(|l| l.starts_with('{')).filter_map(|l| serde_json::from_str::<Value>(l).ok()).find(|v| v.get("samples_per_sec").is_some() && v.get("steps").is_some())
}

/// Hard-links every file of `src` into `dst` (a warm start's checkpoints: they are never
/// written again once made, so links are copies); copies where links are impossible.
fn link_tree(src: &std::path::Path, dst: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let to = dst.join(e.file_name());
        if e.file_type()?.is_dir() {
            link_tree(&e.path(), &to)?;
        } else if std::fs::hard_link(e.path(), &to).is_err() {
            std::fs::copy(e.path(), &to)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_lines_are_read_once_and_only_when_complete() {
        let p = std::env::temp_dir().join(format!("ringrec-lines-{}", std::process::id()));
        std::fs::write(&p, "{\"step\": 1}\n{\"step\": 2}\nnot json\n{\"step\": 3").expect("write");
        let (v, off) = read_lines(&p, 0);
        assert_eq!(v.iter().map(|x| x["step"].as_i64()).collect::<Vec<_>>(), vec![Some(1), Some(2)]);
        assert_eq!(off, 33);
        let (v, off2) = read_lines(&p, off);
        assert!(v.is_empty() && off2 == off, "a partial line waits");
        std::fs::write(&p, "{\"step\": 1}\n{\"step\": 2}\nnot json\n{\"step\": 3}\n").expect("write");
        let (v, _) = read_lines(&p, off);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0]["step"], 3);
        std::fs::remove_file(&p).ok();
        let log = "x\n{\"steps\": 4, \"samples_per_sec\": 10.0}\nringrec launch: done\n";
        assert_eq!(last_summary(log).map(|v| v["steps"].clone()), Some(json!(4)));
    }
}
