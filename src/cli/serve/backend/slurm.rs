//! The `slurm` back end: a batch script per job (`job.sh` in the job's directory) given to
//! `sbatch`; states from `squeue` (every job the controller still holds, finished ones
//! included), then `scontrol show job`, then `sacct` where accounting is enabled, then the
//! exit record the script writes last; kills with `scancel` (SIGTERM to every step: ranks
//! stop gracefully; a forced kill sends SIGKILL).
//!
//! The ranks are started by `srun --mpi=pmix` when Slurm's PMIx plugin is present
//! (`srun --mpi=list`; Open MPI then needs no launcher of its own and Slurm tracks every
//! rank), else by `mpirun` inside the allocation (Open MPI reads the allocation from
//! Slurm's environment).
//!
//! Slurm's states map to the service's: PENDING, CONFIGURING, REQUEUED -> queued; RUNNING,
//! COMPLETING -> running; SUSPENDED, STOPPED -> paused; CANCELLED -> stopped; COMPLETED
//! -> succeeded; FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE, PREEMPTED
//! -> failed; a job Slurm no longer knows -> unknown (or the script's exit record).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use super::{Cluster, Observed, Outcome, Submission, Tracked};
use crate::cli::serve::spec::{BackendKind, JobFiles};

/// How the batch script starts the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Launcher {
    /// `srun --mpi=pmix` when Slurm has the PMIx plugin, else mpirun.
    Auto,
    /// `srun --mpi=pmix`.
    Srun,
    /// `mpirun` inside the allocation.
    Mpirun,
}

/// The Slurm back end.
pub struct Slurm {
    exe: PathBuf,
    launcher: Launcher,
    /// Job names are `ringrec-<tag>-<id>`: the tag tells this service's jobs from another's.
    tag: String,
    partition: Option<String>,
}

/// Whether `sbatch` can be run (the back end is offered only then).
pub fn available() -> bool {
    Command::new("sbatch").arg("--version").output().is_ok_and(|o| o.status.success())
}

fn pmix_available() -> bool {
    Command::new("srun").arg("--mpi=list").output().is_ok_and(|o| {
        let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        o.status.success() && text.lines().any(|l| l.trim() == "pmix" || l.contains("pmix_v"))
    })
}

/// Single-quoted for the shell.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A command's stdout, or an error naming it and its stderr.
fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let name = format!("{:?}", cmd.get_program());
    let o = cmd.output().with_context(|| format!("running {name} (is Slurm installed? scripts/setup.sh --tests)"))?;
    if !o.status.success() {
        bail!("{name} failed ({}): {}", o.status, String::from_utf8_lossy(&o.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The service's state for a Slurm state name (`None`: not a final or known one).
pub fn map_state(state: &str) -> Option<Observed> {
    let base = state.split_whitespace().next().unwrap_or("").trim_end_matches('+');
    let end = |outcome| Some(Observed::Ended { outcome, code: None, detail: format!("Slurm: {state}") });
    match base {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESV_DEL_HOLD" => Some(Observed::Queued),
        "RUNNING" | "COMPLETING" | "RESIZING" | "SIGNALING" | "STAGE_OUT" => Some(Observed::Running),
        "SUSPENDED" | "STOPPED" => Some(Observed::Paused),
        "CANCELLED" => end(Outcome::Cancelled),
        "COMPLETED" => end(Outcome::Succeeded),
        "FAILED" | "TIMEOUT" | "NODE_FAIL" | "OUT_OF_MEMORY" | "BOOT_FAIL" | "DEADLINE" | "PREEMPTED" | "SPECIAL_EXIT" | "REVOKED" => end(Outcome::Failed),
        _ => None,
    }
}

/// `KEY=value` of a `scontrol show job -o` line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

impl Slurm {
    /// Jobs of `exe`, started by `launcher`; names tagged from `state_dir`.
    pub fn new(exe: PathBuf, launcher: Launcher, state_dir: &Path, partition: Option<String>) -> Slurm {
        let launcher = match launcher {
            Launcher::Auto if pmix_available() => Launcher::Srun,
            Launcher::Auto => Launcher::Mpirun,
            l => l,
        };
        let h = ringrec::hash::fnv1a64(state_dir.to_string_lossy().as_bytes());
        Slurm { exe, launcher, tag: format!("{:08x}", h as u32), partition }
    }

    fn job_name(&self, id: i64) -> String {
        format!("ringrec-{}-{id}", self.tag)
    }

    /// The batch script of a job.
    pub fn script(&self, job: &Submission) -> String {
        let p = job.plan;
        let f = job.files;
        let mut s = String::from("#!/bin/bash\n");
        // The name, output and directory are sbatch's arguments (paths need no quoting there).
        s += &format!("#SBATCH --ntasks={}\n", p.ranks);
        if let Some(n) = p.nodes {
            s += &format!("#SBATCH --nodes={n}\n");
        }
        if let Some(t) = p.threads {
            s += &format!("#SBATCH --cpus-per-task={t}\n");
        }
        if !p.hosts.is_empty() {
            let names: Vec<&str> = p.hosts.iter().map(|h| h.split(':').next().unwrap_or(h)).collect();
            s += &format!("#SBATCH --nodelist={}\n", names.join(","));
        }
        if let Some(part) = &self.partition {
            s += &format!("#SBATCH --partition={part}\n");
        }
        s += "#SBATCH --no-requeue\n";
        s += &format!("# Written by `ringrec serve` for job {} ({}).\n", job.id, p.name);
        for (k, v) in &p.env {
            s += &format!("export {k}={}\n", sh_quote(v));
        }
        s += "export RINGREC_JOB_ID=\"slurm-$SLURM_JOB_ID\"\n";
        let train: Vec<String> = p.train_command(f).iter().map(|a| sh_quote(a)).collect();
        let exe = sh_quote(&self.exe.to_string_lossy());
        match self.launcher {
            Launcher::Srun | Launcher::Auto => {
                s += "# srun --mpi=pmix: Slurm's PMIx plugin is present; Slurm starts and tracks every rank.\n";
                s += &format!("srun --mpi=pmix --kill-on-bad-exit=1 {exe} {}\n", train.join(" "));
            }
            Launcher::Mpirun => {
                s += "# mpirun inside the allocation: this Slurm has no PMIx plugin.\n";
                // SAFETY: geteuid has no preconditions.
                let root = if unsafe { libc::geteuid() } == 0 { " --allow-run-as-root" } else { "" };
                s += &format!("mpirun --oversubscribe{root} -np \"$SLURM_NTASKS\" {exe} {}\n", train.join(" "));
            }
        }
        s += "rc=$?\n";
        let exit = f.exit();
        let tmp = f.dir.join(".exit.json.tmp");
        s += &format!("printf '{{\"code\": %d}}\\n' \"$rc\" > {} && mv {} {}\n", sh_quote(&tmp.to_string_lossy()), sh_quote(&tmp.to_string_lossy()), sh_quote(&exit.to_string_lossy()));
        s += "exit $rc\n";
        s
    }

    /// Every job the controller holds: id -> state.
    fn queue(&self) -> anyhow::Result<HashMap<String, String>> {
        let text = output(Command::new("squeue").args(["-h", "-t", "all", "-o", "%i|%T"]))?;
        Ok(text.lines().filter_map(|l| l.split_once('|')).map(|(i, s)| (i.trim().to_string(), s.trim().to_string())).collect())
    }

    /// (state, exit status) from `scontrol show job` or `sacct`.
    fn details(&self, id: &str) -> Option<(String, Option<i32>)> {
        let code = |ec: &str| ec.split(':').next().and_then(|c| c.parse::<i32>().ok());
        if let Ok(text) = output(Command::new("scontrol").args(["show", "job", "-o", id])) {
            let line = text.lines().next().unwrap_or("");
            if let Some(st) = field(line, "JobState") {
                return Some((st.to_string(), field(line, "ExitCode").and_then(code)));
            }
        }
        let text = output(Command::new("sacct").args(["-n", "-P", "-X", "-j", id, "-o", "State,ExitCode"])).ok()?;
        let (st, ec) = text.lines().next()?.split_once('|')?;
        Some((st.to_string(), code(ec)))
    }
}

impl Cluster for Slurm {
    fn kind(&self) -> BackendKind {
        BackendKind::Slurm
    }

    fn describe(&self) -> String {
        match self.launcher {
            Launcher::Mpirun => "slurm: sbatch, ranks started by mpirun inside the allocation (Slurm's PMIx plugin not found)".into(),
            _ => "slurm: sbatch, ranks started by srun --mpi=pmix".into(),
        }
    }

    fn submit(&self, job: &Submission) -> anyhow::Result<String> {
        let path = job.files.dir.join("job.sh");
        let text = self.script(job);
        ringrec::fileio::write_atomic(&path, 0o700, |w| std::io::Write::write_all(w, text.as_bytes()))?;
        let f = job.files;
        let out = output(
            Command::new("sbatch")
                .arg("--parsable")
                .arg(format!("--job-name={}", self.job_name(job.id)))
                .arg(format!("--output={}", f.log().display()))
                .arg(format!("--chdir={}", f.dir.display()))
                .arg(&path),
        )?;
        let id = out.trim().split(';').next().unwrap_or("").to_string();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
            bail!("sbatch answered `{}`, not a job id", out.trim());
        }
        Ok(id)
    }

    fn poll(&self, jobs: &[Tracked]) -> Vec<Observed> {
        if jobs.is_empty() {
            return Vec::new();
        }
        let queue = match self.queue() {
            Ok(q) => q,
            Err(e) => return jobs.iter().map(|_| Observed::NoAnswer(format!("squeue: {e:#}"))).collect(),
        };
        jobs.iter()
            .map(|j| {
                let listed = queue.get(j.cluster_id).and_then(|s| map_state(s).map(|o| (s.clone(), o)));
                match listed {
                    Some((_, Observed::Ended { outcome, detail, .. })) => {
                        // The exit status of a finished job: scontrol has it.
                        let code = self.details(j.cluster_id).and_then(|d| d.1);
                        Observed::Ended { outcome, code, detail }
                    }
                    Some((_, o)) => o,
                    None => {
                        if let Some((st, code)) = self.details(j.cluster_id) {
                            if let Some(o) = map_state(&st) {
                                return match o {
                                    Observed::Ended { outcome, detail, .. } => Observed::Ended { outcome, code, detail },
                                    o => o,
                                };
                            }
                        }
                        match super::local::read_exit(j.files).and_then(|r| r.code) {
                            Some(c) => Observed::Ended { outcome: super::outcome_of_exit(c), code: Some(c), detail: format!("Slurm forgot job {}; its script recorded exit status {c}", j.cluster_id) },
                            None => Observed::Unknown(format!("Slurm does not know job {} (purged, or the controller restarted)", j.cluster_id)),
                        }
                    }
                }
            })
            .collect()
    }

    fn kill(&self, job: &Tracked, force: bool) -> anyhow::Result<()> {
        let mut c = Command::new("scancel");
        if force {
            c.arg("--signal=KILL");
        }
        output(c.arg(job.cluster_id)).map(|_| ())
    }

    fn find(&self, id: i64, _files: &JobFiles) -> Option<String> {
        let text = output(Command::new("squeue").args(["-h", "-t", "all", "-n", &self.job_name(id), "-o", "%i"])).ok()?;
        text.lines().map(str::trim).find(|l| !l.is_empty()).map(str::to_string)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_states_map_as_the_issue_says() {
        use crate::cli::serve::backend::Outcome::*;
        assert_eq!(map_state("PENDING"), Some(Observed::Queued));
        assert_eq!(map_state("RUNNING"), Some(Observed::Running));
        assert_eq!(map_state("SUSPENDED"), Some(Observed::Paused));
        let outcome = |s| match map_state(s) {
            Some(Observed::Ended { outcome, .. }) => Some(outcome),
            _ => None,
        };
        assert_eq!(outcome("CANCELLED by 0"), Some(Cancelled));
        assert_eq!(outcome("COMPLETED"), Some(Succeeded));
        for s in ["FAILED", "TIMEOUT", "NODE_FAIL"] {
            assert_eq!(outcome(s), Some(Failed), "{s}");
        }
        assert_eq!(map_state("WHATEVER"), None);
        assert_eq!(field("JobId=3 JobState=COMPLETED Reason=None ExitCode=0:0", "ExitCode"), Some("0:0"));
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn the_batch_script_quotes_everything_it_is_given() {
        use crate::cli::serve::spec::{BackendKind, JobFiles, Plan};
        let plan = Plan {
            name: "n".into(),
            backend: BackendKind::Slurm,
            ranks: 4,
            hosts: vec!["node1:2".into(), "node2:2".into()],
            nodes: Some(2),
            threads: Some(3),
            train_args: vec!["--lr".into(), "0.5".into()],
            env: vec![("RINGREC_X".into(), "a'b c".into())],
            warm_start: None,
            checkpoints: false,
        };
        let files = JobFiles { dir: PathBuf::from("/s/jobs/7"), cache: PathBuf::from("/s/cache") };
        let mut sl = Slurm { exe: PathBuf::from("/opt/ring rec"), launcher: Launcher::Srun, tag: "t".into(), partition: None };
        let text = sl.script(&Submission { id: 7, plan: &plan, files: &files });
        for want in ["#SBATCH --ntasks=4\n", "#SBATCH --nodes=2\n", "#SBATCH --cpus-per-task=3\n", "#SBATCH --nodelist=node1,node2\n", "export RINGREC_X='a'\\''b c'\n", "srun --mpi=pmix --kill-on-bad-exit=1 '/opt/ring rec' 'train' '--lr' '0.5' '--data-dir' '/s/cache'", "mv '/s/jobs/7/.exit.json.tmp' '/s/jobs/7/exit.json'"] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        sl.launcher = Launcher::Mpirun;
        assert!(sl.script(&Submission { id: 7, plan: &plan, files: &files }).contains("-np \"$SLURM_NTASKS\" '/opt/ring rec' 'train'"));
    }
}
