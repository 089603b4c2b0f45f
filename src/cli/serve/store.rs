//! The service's records in SQLite (`STATE_DIR/jobs.db`, WAL, `synchronous=FULL`): every
//! job with its spec and state, every state transition with its time and reason, the
//! job's metrics points and each rank's last progress. Every change is one transaction,
//! written before the service answers or acts on it, so a service killed at any moment
//! (SIGKILL) restarts with every job it ever acknowledged, at its last recorded state.
//!
//! Schema (`PRAGMA user_version` = 1):
//! - `jobs(id, name, owner, backend, spec, state, cluster_id, created_at, updated_at,
//!   exit_code, cause, summary, resubmit_of, metrics_offset)`
//! - `transitions(job_id, seq, state, at, reason)`
//! - `metrics(job_id, seq, point)`: one `--metrics-out` line each, in order; the job's
//!   `metrics_offset` (bytes of the file read) advances in the same transaction
//! - `ranks(job_id, rank, progress)`: the newest progress record of each rank

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context};
use rusqlite::{params, Connection};
use serde::Serialize;

use super::spec::{BackendKind, JobSpec};
use super::state::JobState;

/// One state change of a job.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Transition {
    /// The state entered.
    pub state: JobState,
    /// When (seconds since the Unix epoch).
    pub at: f64,
    /// Why, in words.
    pub reason: String,
}

/// A job as recorded.
#[derive(Clone, Debug)]
pub struct JobRecord {
    /// The service's id (1, 2, ...).
    pub id: i64,
    /// The spec's name.
    pub name: String,
    /// The token name that submitted it.
    pub owner: String,
    /// Its back end.
    pub backend: BackendKind,
    /// The spec as submitted.
    pub spec: JobSpec,
    /// The current state.
    pub state: JobState,
    /// The back end's handle (Slurm job id; `local:<dir>` for the local back end).
    pub cluster_id: Option<String>,
    /// When it was received.
    pub created_at: f64,
    /// When its record last changed.
    pub updated_at: f64,
    /// The job's exit status, once known.
    pub exit_code: Option<i32>,
    /// Why it failed (from its log) or could not be submitted.
    pub cause: Option<String>,
    /// The final `--json` summary of `ringrec train`, when it printed one.
    pub summary: Option<serde_json::Value>,
    /// The job this one resubmits.
    pub resubmit_of: Option<i64>,
    /// Bytes of its metrics file already recorded.
    pub metrics_offset: u64,
    /// Every state change, oldest first.
    pub transitions: Vec<Transition>,
    /// Metrics points, oldest first (the service keeps the newest in memory; all are in
    /// the database).
    pub metrics: Vec<serde_json::Value>,
    /// How many metrics points were recorded in all (the next one's sequence number).
    pub metrics_seen: usize,
    /// Each rank's last progress record.
    pub ranks: BTreeMap<u32, serde_json::Value>,
}

/// What a transition changes besides the state.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    /// The back end's handle.
    pub cluster_id: Option<String>,
    /// The exit status.
    pub exit_code: Option<i32>,
    /// The cause of a failure.
    pub cause: Option<String>,
    /// The final summary.
    pub summary: Option<serde_json::Value>,
}

/// The open database.
pub struct Store {
    db: Connection,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jobs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  owner TEXT NOT NULL,
  backend TEXT NOT NULL,
  spec TEXT NOT NULL,
  state TEXT NOT NULL,
  cluster_id TEXT,
  created_at REAL NOT NULL,
  updated_at REAL NOT NULL,
  exit_code INTEGER,
  cause TEXT,
  summary TEXT,
  resubmit_of INTEGER,
  metrics_offset INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS transitions (
  job_id INTEGER NOT NULL REFERENCES jobs(id),
  seq INTEGER NOT NULL,
  state TEXT NOT NULL,
  at REAL NOT NULL,
  reason TEXT NOT NULL,
  PRIMARY KEY (job_id, seq)
);
CREATE TABLE IF NOT EXISTS metrics (
  job_id INTEGER NOT NULL REFERENCES jobs(id),
  seq INTEGER NOT NULL,
  point TEXT NOT NULL,
  PRIMARY KEY (job_id, seq)
);
CREATE TABLE IF NOT EXISTS ranks (
  job_id INTEGER NOT NULL REFERENCES jobs(id),
  rank INTEGER NOT NULL,
  progress TEXT NOT NULL,
  PRIMARY KEY (job_id, rank)
);
";

/// Seconds since the Unix epoch, now.
pub fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

impl Store {
    /// Opens (creating) the database at `path` and brings its schema up to date.
    pub fn open(path: &Path) -> anyhow::Result<Store> {
        let db = Connection::open(path).with_context(|| format!("opening the job database {}", path.display()))?;
        db.pragma_update(None, "journal_mode", "WAL").context("setting the database's journal to WAL")?;
        db.pragma_update(None, "synchronous", "FULL")?;
        db.pragma_update(None, "foreign_keys", "ON")?;
        db.busy_timeout(std::time::Duration::from_secs(10))?;
        let version: i64 = db.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version > 1 {
            bail!("{}: schema version {version} is newer than this ringrec knows (1); use the ringrec that wrote it", path.display());
        }
        db.execute_batch(SCHEMA).with_context(|| format!("{}: creating the schema (is it a ringrec job database?)", path.display()))?;
        db.pragma_update(None, "user_version", 1)?;
        Ok(Store { db })
    }

    /// Records a new job in state `received`; its id.
    pub fn insert(&mut self, name: &str, owner: &str, backend: BackendKind, spec: &JobSpec, resubmit_of: Option<i64>, at: f64) -> anyhow::Result<i64> {
        let tx = self.db.transaction()?;
        let spec_json = serde_json::to_string(spec)?;
        tx.execute(
            "INSERT INTO jobs (name, owner, backend, spec, state, created_at, updated_at, resubmit_of) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7)",
            params![name, owner, backend.as_str(), spec_json, JobState::Received.as_str(), at, resubmit_of],
        )?;
        let id = tx.last_insert_rowid();
        let reason = match resubmit_of {
            Some(o) => format!("resubmitted from job {o} by {owner}"),
            None => format!("submitted by {owner}"),
        };
        tx.execute("INSERT INTO transitions (job_id, seq, state, at, reason) VALUES (?1, 0, ?2, ?3, ?4)", params![id, JobState::Received.as_str(), at, reason])?;
        tx.commit()?;
        Ok(id)
    }

    /// Records job `id` entering `state` (with `changes`) at `at`.
    pub fn transition(&mut self, id: i64, state: JobState, reason: &str, at: f64, changes: &Changes) -> anyhow::Result<()> {
        let tx = self.db.transaction()?;
        let summary = changes.summary.as_ref().map(|s| s.to_string());
        let n = tx.execute(
            "UPDATE jobs SET state = ?2, updated_at = ?3, cluster_id = COALESCE(?4, cluster_id), exit_code = COALESCE(?5, exit_code), cause = COALESCE(?6, cause), summary = COALESCE(?7, summary) WHERE id = ?1",
            params![id, state.as_str(), at, changes.cluster_id, changes.exit_code, changes.cause, summary],
        )?;
        if n != 1 {
            bail!("job {id} is not in the database");
        }
        let seq: i64 = tx.query_row("SELECT COALESCE(MAX(seq) + 1, 0) FROM transitions WHERE job_id = ?1", [id], |r| r.get(0))?;
        tx.execute("INSERT INTO transitions (job_id, seq, state, at, reason) VALUES (?1, ?2, ?3, ?4, ?5)", params![id, seq, state.as_str(), at, reason])?;
        tx.commit()?;
        Ok(())
    }

    /// Records more of job `id`'s metrics points (`first` is the sequence number of the
    /// first) and that its metrics file was read up to byte `offset`; plus the ranks'
    /// newest progress.
    pub fn observe(&mut self, id: i64, first: usize, points: &[serde_json::Value], offset: u64, ranks: &BTreeMap<u32, serde_json::Value>) -> anyhow::Result<()> {
        let tx = self.db.transaction()?;
        for (i, p) in points.iter().enumerate() {
            tx.execute("INSERT OR REPLACE INTO metrics (job_id, seq, point) VALUES (?1, ?2, ?3)", params![id, (first + i) as i64, p.to_string()])?;
        }
        tx.execute("UPDATE jobs SET metrics_offset = ?2 WHERE id = ?1", params![id, offset as i64])?;
        for (r, p) in ranks {
            tx.execute("INSERT OR REPLACE INTO ranks (job_id, rank, progress) VALUES (?1, ?2, ?3)", params![id, *r as i64, p.to_string()])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Every job with its transitions, metrics and ranks, by id.
    pub fn load_all(&self) -> anyhow::Result<Vec<JobRecord>> {
        let mut jobs = Vec::new();
        let mut q = self.db.prepare("SELECT id, name, owner, backend, spec, state, cluster_id, created_at, updated_at, exit_code, cause, summary, resubmit_of, metrics_offset FROM jobs ORDER BY id")?;
        let rows = q.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, Option<String>>(6)?,
                r.get::<_, f64>(7)?,
                r.get::<_, f64>(8)?,
                r.get::<_, Option<i32>>(9)?,
                r.get::<_, Option<String>>(10)?,
                r.get::<_, Option<String>>(11)?,
                r.get::<_, Option<i64>>(12)?,
                r.get::<_, i64>(13)?,
            ))
        })?;
        for row in rows {
            let (id, name, owner, backend, spec, state, cluster_id, created_at, updated_at, exit_code, cause, summary, resubmit_of, offset) = row?;
            let backend = BackendKind::parse(&backend).with_context(|| format!("job {id}: unknown back end `{backend}` in the database"))?;
            let state = JobState::parse(&state).with_context(|| format!("job {id}: unknown state `{state}` in the database"))?;
            let spec: JobSpec = serde_json::from_str(&spec).with_context(|| format!("job {id}: its stored spec does not parse"))?;
            let summary = summary.and_then(|s| serde_json::from_str(&s).ok());
            jobs.push(JobRecord {
                id,
                name,
                owner,
                backend,
                spec,
                state,
                cluster_id,
                created_at,
                updated_at,
                exit_code,
                cause,
                summary,
                resubmit_of,
                metrics_offset: offset.max(0) as u64,
                transitions: Vec::new(),
                metrics: Vec::new(),
                metrics_seen: 0,
                ranks: BTreeMap::new(),
            });
        }
        let index: BTreeMap<i64, usize> = jobs.iter().enumerate().map(|(i, j)| (j.id, i)).collect();
        let mut q = self.db.prepare("SELECT job_id, state, at, reason FROM transitions ORDER BY job_id, seq")?;
        let rows = q.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, f64>(2)?, r.get::<_, String>(3)?)))?;
        for row in rows {
            let (id, state, at, reason) = row?;
            let state = JobState::parse(&state).with_context(|| format!("job {id}: unknown state `{state}` in its transitions"))?;
            if let Some(&i) = index.get(&id) {
                jobs[i].transitions.push(Transition { state, at, reason });
            }
        }
        let mut q = self.db.prepare("SELECT job_id, point FROM metrics ORDER BY job_id, seq")?;
        let rows = q.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?;
        for row in rows {
            let (id, point) = row?;
            if let Some(&i) = index.get(&id) {
                jobs[i].metrics_seen += 1;
                if let Ok(v) = serde_json::from_str(&point) {
                    jobs[i].metrics.push(v);
                }
            }
        }
        let mut q = self.db.prepare("SELECT job_id, rank, progress FROM ranks ORDER BY job_id, rank")?;
        let rows = q.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?)))?;
        for row in rows {
            let (id, rank, p) = row?;
            if let (Some(&i), Ok(v), Ok(rank)) = (index.get(&id), serde_json::from_str(&p), u32::try_from(rank)) {
                jobs[i].ranks.insert(rank, v);
            }
        }
        Ok(jobs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_reopening() {
        let dir = std::env::temp_dir().join(format!("ringrec-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let db = dir.join("jobs.db");
        let spec = JobSpec { ranks: Some(2), args: vec!["--shuffle".into()], ..JobSpec::default() };
        {
            let mut s = Store::open(&db).expect("open");
            let id = s.insert("a", "alice", BackendKind::Local, &spec, None, 10.0).expect("insert");
            assert_eq!(id, 1);
            s.transition(id, JobState::Submitted, "supervisor started", 11.0, &Changes { cluster_id: Some("local:1".into()), ..Changes::default() }).expect("t");
            let ranks = BTreeMap::from([(0u32, serde_json::json!({"step": 3}))]);
            s.observe(id, 0, &[serde_json::json!({"step": 5, "eval_auc": 0.7})], 40, &ranks).expect("observe");
            s.transition(id, JobState::Failed, "exit 1", 12.0, &Changes { exit_code: Some(1), cause: Some("rank 1: error: x".into()), ..Changes::default() }).expect("t");
            assert!(s.transition(99, JobState::Failed, "x", 1.0, &Changes::default()).is_err());
        }
        let s = Store::open(&db).expect("reopen");
        let jobs = s.load_all().expect("load");
        assert_eq!(jobs.len(), 1);
        let j = &jobs[0];
        assert_eq!((j.state, j.cluster_id.as_deref(), j.exit_code, j.cause.as_deref()), (JobState::Failed, Some("local:1"), Some(1), Some("rank 1: error: x")));
        assert_eq!(j.spec, spec);
        assert_eq!(j.transitions.iter().map(|t| t.state).collect::<Vec<_>>(), vec![JobState::Received, JobState::Submitted, JobState::Failed]);
        assert_eq!(j.transitions[2].at, 12.0);
        assert_eq!((j.metrics.len(), j.metrics_seen, j.metrics_offset), (1, 1, 40));
        assert_eq!(j.ranks[&0]["step"], 3);
        std::fs::remove_dir_all(&dir).ok();
    }
}
