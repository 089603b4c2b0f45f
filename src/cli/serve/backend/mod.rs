//! The cluster back ends behind one trait: `local` (a supervisor process per job running
//! `ringrec launch`, i.e. mpirun, on this machine) and `slurm` (`sbatch`, `squeue`,
//! `scontrol`, `scancel`). The service submits, polls, kills and, after its own restart,
//! finds jobs through [`Cluster`] only.

pub mod local;
pub mod slurm;

use std::path::PathBuf;

use super::spec::{BackendKind, JobFiles, Plan};

/// How a job that ended, ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Exit status 0 (Slurm `COMPLETED`).
    Succeeded,
    /// Stopped by a signal it was sent (a kill; Slurm `CANCELLED`).
    Cancelled,
    /// Anything else (Slurm `FAILED`, `TIMEOUT`, `NODE_FAIL`, ...).
    Failed,
}

/// What the back end says about one job.
#[derive(Clone, Debug, PartialEq)]
pub enum Observed {
    /// Waiting for resources.
    Queued,
    /// Running.
    Running,
    /// Suspended.
    Paused,
    /// Over: how, its exit status where known, and what the cluster said (in words).
    Ended {
        /// How it ended.
        outcome: Outcome,
        /// Its exit status, where known.
        code: Option<i32>,
        /// The cluster's words (Slurm's state, the supervisor's record).
        detail: String,
    },
    /// The back end cannot tell (it forgot the job); the reason.
    Unknown(String),
    /// The back end did not answer this time (a controller too busy to reply): the job
    /// keeps its state; the reason.
    NoAnswer(String),
}

/// A job the back end is asked about: its id, handle and files.
pub struct Tracked<'a> {
    /// The service's id.
    pub id: i64,
    /// The back end's handle.
    pub cluster_id: &'a str,
    /// The job's files.
    pub files: &'a JobFiles,
}

/// A job to submit.
pub struct Submission<'a> {
    /// The service's id.
    pub id: i64,
    /// What to run.
    pub plan: &'a Plan,
    /// Where its files go.
    pub files: &'a JobFiles,
}

/// One cluster back end.
pub trait Cluster: Send + Sync {
    /// Which one.
    fn kind(&self) -> BackendKind;
    /// Hands the job to the cluster; its handle (`cluster_id`).
    fn submit(&self, job: &Submission) -> anyhow::Result<String>;
    /// The state of each job, in order.
    fn poll(&self, jobs: &[Tracked]) -> Vec<Observed>;
    /// Asks the job to stop (a graceful stop: checkpoint, then exit); `force` ends it at once.
    fn kill(&self, job: &Tracked, force: bool) -> anyhow::Result<()>;
    /// The handle of job `id` if it was submitted though the service did not record it
    /// (a service killed while submitting).
    fn find(&self, id: i64, files: &JobFiles) -> Option<String>;
    /// One line about how jobs run (shown at start and by `GET /api/info`).
    fn describe(&self) -> String;
}

/// The `ringrec` binary jobs run (this one).
pub fn ringrec_exe() -> anyhow::Result<PathBuf> {
    use anyhow::Context;
    std::env::current_exe().context("finding the ringrec binary (/proc/self/exe)")
}

/// The outcome of an exit status: 0 succeeded; a graceful stop on SIGTERM, SIGINT or
/// SIGUSR1 (128 + the signal) was a kill; anything else failed.
pub fn outcome_of_exit(code: i32) -> Outcome {
    match code {
        0 => Outcome::Succeeded,
        c if c == 128 + libc::SIGTERM || c == 128 + libc::SIGINT || c == 128 + libc::SIGUSR1 => Outcome::Cancelled,
        _ => Outcome::Failed,
    }
}
