//! The `local` back end: each job gets a supervisor process (`ringrec serve supervise`,
//! its own session, so it outlives a killed service) that waits for one of the service's
//! local slots (an `flock`ed file: the queue survives the service), runs `ringrec launch
//! -np N -- train ...` (mpirun in its own process group; a first SIGTERM is a graceful
//! stop with a checkpoint, a second ends the job) with every rank's output in the job's
//! log, and writes the exit status to `exit.json` last.
//!
//! The job's directory holds what the service reads: `supervisor.lock` (locked while the
//! supervisor lives: liveness without pids), `supervisor.json` (its pid), `phase`
//! (`queued` or `running`), `exit.json`. A supervisor gone without `exit.json` (killed
//! itself) is a failed job whose cause says so.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use super::{outcome_of_exit, Cluster, Observed, Outcome, Submission, Tracked};
use crate::cli::serve::spec::{BackendKind, JobFiles};

/// What the supervisor runs (`launch.json` in the job's directory).
#[derive(Serialize, Deserialize, Debug)]
pub struct LaunchFile {
    /// The command: ringrec, `launch`, its flags, `--`, `train` and the job's flags.
    pub argv: Vec<String>,
    /// Variables set for it (`RINGREC_*`; `ringrec launch` passes them to the ranks).
    pub env: Vec<(String, String)>,
    /// The directory of the slot files.
    pub slots_dir: PathBuf,
    /// How many jobs may run at once.
    pub slots: usize,
    /// The job's niceness (`nice(2)` increment): training yields the CPU to the service.
    #[serde(default)]
    pub nice: i32,
}

/// The exit record (`exit.json`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ExitRecord {
    /// The exit status (`ringrec launch`'s: 128 + signal after a graceful stop).
    pub code: Option<i32>,
    /// The signal that ended it, when it did not exit.
    #[serde(default)]
    pub signal: Option<i32>,
    /// Stopped while queued: it never ran.
    #[serde(default)]
    pub before_start: bool,
}

/// Paths of the supervisor's files in a job directory.
pub fn lock_path(dir: &Path) -> PathBuf {
    dir.join("supervisor.lock")
}
fn pid_path(dir: &Path) -> PathBuf {
    dir.join("supervisor.json")
}
/// `queued` or `running`.
pub fn phase_path(dir: &Path) -> PathBuf {
    dir.join("phase")
}

/// The local back end.
pub struct Local {
    exe: PathBuf,
    slots_dir: PathBuf,
    slots: usize,
    nice: i32,
    /// Supervisors this service started, reaped as they end.
    children: Mutex<Vec<Child>>,
}

impl Local {
    /// Jobs of `exe`, at most `slots` running at once (slot files in `slots_dir`), at
    /// niceness `nice`.
    pub fn new(exe: PathBuf, slots_dir: PathBuf, slots: usize, nice: i32) -> anyhow::Result<Local> {
        std::fs::create_dir_all(&slots_dir).with_context(|| format!("creating {}", slots_dir.display()))?;
        Ok(Local { exe, slots_dir, slots: slots.max(1), nice, children: Mutex::new(Vec::new()) })
    }

    fn reap(&self) {
        let mut c = self.children.lock().unwrap_or_else(|e| e.into_inner());
        c.retain_mut(|ch| !matches!(ch.try_wait(), Ok(Some(_))));
    }
}

/// The supervisor's pid, from its record.
fn read_pid(dir: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(pid_path(dir)).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok()?.get("pid")?.as_i64().and_then(|p| i32::try_from(p).ok())
}

/// The exit record, when written.
pub fn read_exit(files: &JobFiles) -> Option<ExitRecord> {
    serde_json::from_str(&std::fs::read_to_string(files.exit()).ok()?).ok()
}

fn ended(rec: ExitRecord) -> Observed {
    match (rec.code, rec.signal) {
        (Some(c), _) => {
            let detail = if rec.before_start { format!("stopped while queued (exit status {c})") } else { format!("exit status {c}") };
            Observed::Ended { outcome: outcome_of_exit(c), code: Some(c), detail }
        }
        (None, Some(s)) => Observed::Ended { outcome: Outcome::Failed, code: Some(128 + s), detail: format!("ringrec launch was killed by signal {s}") },
        (None, None) => Observed::Ended { outcome: Outcome::Failed, code: None, detail: "no exit status recorded".into() },
    }
}

impl Cluster for Local {
    fn kind(&self) -> BackendKind {
        BackendKind::Local
    }

    fn describe(&self) -> String {
        format!("local: `ringrec launch` (mpirun) on this machine, {} job(s) at once, nice {}", self.slots, self.nice)
    }

    fn submit(&self, job: &Submission) -> anyhow::Result<String> {
        let dir = &job.files.dir;
        let mut argv = vec![self.exe.to_string_lossy().into_owned(), "launch".into(), "-np".into(), job.plan.ranks.to_string()];
        if !job.plan.hosts.is_empty() {
            argv.extend(["-H".into(), job.plan.hosts.join(",")]);
        }
        argv.push("--".into());
        argv.extend(job.plan.train_command(job.files));
        let launch = LaunchFile { argv, env: job.plan.env.clone(), slots_dir: self.slots_dir.clone(), slots: self.slots, nice: self.nice };
        let text = serde_json::to_vec_pretty(&launch)?;
        ringrec::fileio::write_atomic(&dir.join("launch.json"), 0o600, |w| std::io::Write::write_all(w, &text))?;
        let out = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("supervisor.log")).with_context(|| format!("creating {}/supervisor.log", dir.display()))?;
        let err = out.try_clone()?;
        let mut child = Command::new(&self.exe)
            .args(["serve", "supervise", "--job-dir"])
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting the supervisor {} serve supervise", self.exe.display()))?;
        // Submitted once the supervisor holds its lock and recorded its pid.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(pid) = read_pid(dir) {
                self.children.lock().unwrap_or_else(|e| e.into_inner()).push(child);
                self.reap();
                return Ok(format!("local:{pid}"));
            }
            if let Ok(Some(st)) = child.try_wait() {
                let log = std::fs::read_to_string(dir.join("supervisor.log")).unwrap_or_default();
                bail!("the supervisor exited at once ({st}): {}", log.trim());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the supervisor did not start within 20 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn poll(&self, jobs: &[Tracked]) -> Vec<Observed> {
        self.reap();
        jobs.iter()
            .map(|j| {
                if let Some(rec) = read_exit(j.files) {
                    return ended(rec);
                }
                let dir = &j.files.dir;
                if ringrec::fileio::is_locked(&lock_path(dir)) {
                    return match std::fs::read_to_string(phase_path(dir)).ok().as_deref().map(str::trim) {
                        Some("running") => Observed::Running,
                        _ => Observed::Queued,
                    };
                }
                // It may have written its record between the two looks.
                if let Some(rec) = read_exit(j.files) {
                    return ended(rec);
                }
                if read_pid(dir).is_none() {
                    return Observed::Unknown("the job's supervisor never started".into());
                }
                Observed::Ended { outcome: Outcome::Failed, code: None, detail: "the job's supervisor ended without recording an exit status (it was killed, or the machine restarted)".into() }
            })
            .collect()
    }

    fn kill(&self, job: &Tracked, _force: bool) -> anyhow::Result<()> {
        let dir = &job.files.dir;
        if !ringrec::fileio::is_locked(&lock_path(dir)) {
            return Ok(()); // already over
        }
        let Some(pid) = read_pid(dir) else { bail!("job {}: its supervisor has no pid record", job.id) };
        // Forced or not, one SIGTERM: a second one (`force`) is the supervisor's second,
        // which it passes on, and `ringrec launch` then ends mpirun at once.
        // SAFETY: kill(2) with a pid read from the supervisor's record, whose lock shows it
        // is alive.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ESRCH) {
                bail!("job {}: signalling its supervisor (pid {pid}): {e}", job.id);
            }
        }
        Ok(())
    }

    fn find(&self, _id: i64, files: &JobFiles) -> Option<String> {
        let dir = &files.dir;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(pid) = read_pid(dir) {
                return Some(format!("local:{pid}"));
            }
            // A supervisor that holds its lock is about to write its record.
            if !ringrec::fileio::is_locked(&lock_path(dir)) || Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
