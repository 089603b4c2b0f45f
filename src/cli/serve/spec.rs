//! The job spec of `POST /api/jobs`: what a user may ask for, validated field by field
//! (sizes, numbers, paths, flags) into a [`Plan`], and the `ringrec train` command line a
//! plan becomes. Every refusal is a [`SpecError`] naming the field and what is allowed.
//!
//! Paths: data files must lie under one of the service's data roots (`--data-root`); `..`
//! components are refused before anything touches the file system, then the path is
//! resolved (symbolic links included) and must still be a regular file under a root. Extra
//! `args` are `ringrec train` flags that this build's `train --help` lists, minus those the
//! service sets itself (paths, metrics, checkpoints) and those the typed fields carry;
//! their values may not hold a `/` (paths go through the typed fields, where they are
//! checked).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use ringrec::settings::ServiceRole;
use ringrec::train::TrainConfig;
use serde::{Deserialize, Serialize};

/// A request the service refuses (HTTP 400), with what to do instead.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

fn bad<T>(msg: impl Into<String>) -> Result<T, SpecError> {
    Err(SpecError(msg.into()))
}

/// The cluster back end a job runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// mpirun (through `ringrec launch`) on the service's machine.
    Local,
    /// `sbatch` to the Slurm cluster the service's `SLURM_CONF` names.
    Slurm,
}

impl BackendKind {
    /// The spelling of the spec and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Local => "local",
            BackendKind::Slurm => "slurm",
        }
    }

    /// The back end spelled `s`.
    pub fn parse(s: &str) -> Option<BackendKind> {
        match s {
            "local" => Some(BackendKind::Local),
            "slurm" => Some(BackendKind::Slurm),
            _ => None,
        }
    }
}

/// A job as submitted (`POST /api/jobs`), stored as is so it can be resubmitted.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// A label for people (letters, digits, ` _.-`, at most 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `local` (the default) or `slurm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Ranks (MPI processes) in all; default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks: Option<i64>,
    /// Hosts and slots, `host` or `host:slots` (local: mpirun `-H`; Slurm: `--nodelist`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// Slurm: nodes to spread the ranks over (`--nodes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<i64>,
    /// Threads per rank (`--threads`; Slurm: `--cpus-per-task`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<i64>,
    /// Hidden layer widths of the MLP (`--hidden`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<Vec<i64>>,
    /// Embedding dimension (`--dim`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dim: Option<i64>,
    /// Global batch (`--batch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<i64>,
    /// Passes over the data (`--epochs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs: Option<i64>,
    /// Stop after this many steps (`--max-steps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<i64>,
    /// Training data (a Criteo TSV or `.rrdata`) under a data root; default: the
    /// synthetic set `ringrec train` generates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Held-out data under a data root (`--eval-data`, where this `ringrec train` has it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_data: Option<String>,
    /// Held-out fraction of `data` (`--test-fraction`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_fraction: Option<f64>,
    /// Steps between synchronisations (`--sync-every`, where this `ringrec train` has it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_every: Option<i64>,
    /// Steps between evaluations and metrics points (`--eval-every`); default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_every: Option<i64>,
    /// Steps between checkpoints (`--checkpoint-every`; checkpoints go to the job's directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every: Option<i64>,
    /// Checkpoints kept (`--keep-checkpoints`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_checkpoints: Option<i64>,
    /// Warm start: the id of an earlier job whose newest checkpoint this job starts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_start: Option<i64>,
    /// `RINGREC_*` variables for the ranks.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// More `ringrec train` flags, e.g. `["--lr", "0.01", "--shuffle"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
}

/// What the service allows; built once at start.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Directories data paths must lie under (canonical).
    pub data_roots: Vec<PathBuf>,
    /// The most ranks one job may ask for.
    pub max_ranks: u32,
    /// Long flags of this build's `ringrec train` (from its `--help`).
    pub train_flags: BTreeSet<String>,
    /// Whether the Slurm back end is available.
    pub slurm: bool,
}

/// What the service does with the `ringrec train` flag `flag` (`--name`): the role its
/// setting declares ([`ringrec::settings::ServiceRole`]); the output's flags, `--help` and
/// `--version` are the service's own. `None`: not a flag of this build's settings.
fn role(flag: &str) -> Option<ServiceRole> {
    if crate::cli::train::OUTPUT_FLAGS.contains(&flag) || flag == "--help" || flag == "--version" {
        return Some(ServiceRole::Owned);
    }
    TrainConfig::all_settings().into_iter().find(|s| s.flag == flag).map(|s| s.service)
}

/// The most extra arguments, and bytes in one string field.
const MAX_ARGS: usize = 64;
const MAX_FIELD: usize = 256;
const MAX_PATH: usize = 4096;

/// A validated job: what the back ends need.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The label shown (the spec's name, or `job`).
    pub name: String,
    /// Where it runs.
    pub backend: BackendKind,
    /// Ranks in all.
    pub ranks: u32,
    /// `host` / `host:slots` entries.
    pub hosts: Vec<String>,
    /// Slurm `--nodes`.
    pub nodes: Option<u32>,
    /// Threads per rank.
    pub threads: Option<u32>,
    /// `ringrec train` flags from the spec (typed fields and args), without the ones the
    /// service adds per job ([`Plan::train_command`]).
    pub train_args: Vec<String>,
    /// `RINGREC_*` variables for the ranks.
    pub env: Vec<(String, String)>,
    /// The job whose checkpoint this one starts from.
    pub warm_start: Option<i64>,
    /// Whether the job writes checkpoints (or starts from one): `--checkpoint-dir` is set.
    pub checkpoints: bool,
}

/// Where a job's files live (the service's state directory, `jobs/<id>/`).
#[derive(Clone, Debug)]
pub struct JobFiles {
    /// The job's directory.
    pub dir: PathBuf,
    /// The data caches shared by the service's jobs (`--data-dir`).
    pub cache: PathBuf,
}

impl JobFiles {
    /// Every rank's output (stdout and stderr).
    pub fn log(&self) -> PathBuf {
        self.dir.join("log")
    }
    /// `--metrics-out`.
    pub fn metrics(&self) -> PathBuf {
        self.dir.join("metrics.jsonl")
    }
    /// `--progress-dir`.
    pub fn progress(&self) -> PathBuf {
        self.dir.join("progress")
    }
    /// `--checkpoint-dir`.
    pub fn checkpoints(&self) -> PathBuf {
        self.dir.join("ckpt")
    }
    /// The exit record the supervisor (local) or batch script (Slurm) writes last.
    pub fn exit(&self) -> PathBuf {
        self.dir.join("exit.json")
    }
}

impl Plan {
    /// The `ringrec train ...` arguments (without the program) for this job's files.
    pub fn train_command(&self, files: &JobFiles) -> Vec<String> {
        let mut c: Vec<String> = vec!["train".into()];
        c.extend(self.train_args.iter().cloned());
        let path = |p: PathBuf| p.to_string_lossy().into_owned();
        c.extend(["--data-dir".into(), path(files.cache.clone())]);
        c.extend(["--metrics-out".into(), path(files.metrics())]);
        c.extend(["--progress-dir".into(), path(files.progress())]);
        if self.checkpoints {
            c.extend(["--checkpoint-dir".into(), path(files.checkpoints())]);
        }
        if self.warm_start.is_some() {
            c.push("--resume".into());
        }
        c.extend(["--no-progress".into(), "--json".into()]);
        c
    }
}

fn int_in(field: &str, v: Option<i64>, lo: i64, hi: i64) -> Result<Option<u64>, SpecError> {
    match v {
        None => Ok(None),
        Some(x) if (lo..=hi).contains(&x) => Ok(Some(x as u64)),
        Some(x) => bad(format!("{field} must be between {lo} and {hi} (got {x})")),
    }
}

fn printable(field: &str, s: &str, max: usize) -> Result<(), SpecError> {
    if s.len() > max {
        return bad(format!("{field} is {} bytes long; at most {max} are allowed", s.len()));
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return bad(format!("{field} holds a control character ({:?}); only printable text is allowed", c));
    }
    Ok(())
}

/// A host entry: a host name (letters, digits, `.-`) and optional `:slots`.
fn host_entry(h: &str) -> Result<(), SpecError> {
    let (name, slots) = match h.split_once(':') {
        Some((n, s)) => (n, Some(s)),
        None => (h, None),
    };
    let ok_name = !name.is_empty() && name.len() <= 253 && name.starts_with(|c: char| c.is_ascii_alphanumeric()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
    if !ok_name {
        return bad(format!("hosts: `{}` is not a host name (letters, digits, '.' and '-', optionally `:slots`)", h.escape_debug()));
    }
    if let Some(s) = slots {
        match s.parse::<u32>() {
            Ok(n) if (1..=1024).contains(&n) => {}
            _ => return bad(format!("hosts: `{}`: slots must be a number from 1 to 1024", h.escape_debug())),
        }
    }
    Ok(())
}

impl Limits {
    /// Resolves a data path of field `field`: no `..`, under a data root, a regular file.
    pub fn data_path(&self, field: &str, p: &str) -> Result<PathBuf, SpecError> {
        printable(field, p, MAX_PATH)?;
        if p.is_empty() {
            return bad(format!("{field} is empty; give a file under a data root ({})", self.roots()));
        }
        let path = Path::new(p);
        if path.components().any(|c| matches!(c, Component::ParentDir)) {
            return bad(format!("{field}: `{}` contains `..`; give a path under a data root ({})", p.escape_debug(), self.roots()));
        }
        let Some(first) = self.data_roots.first() else {
            return bad(format!("{field}: this service has no data root; start it with --data-root DIR to allow data files"));
        };
        let joined = if path.is_absolute() { path.to_path_buf() } else { first.join(path) };
        let real = std::fs::canonicalize(&joined).map_err(|e| SpecError(format!("{field}: `{}`: {e}; give an existing file under a data root ({})", p.escape_debug(), self.roots())))?;
        if !self.data_roots.iter().any(|r| real.starts_with(r)) {
            return bad(format!("{field}: `{}` is outside the data roots ({}); copy it there or start the service with another --data-root", p.escape_debug(), self.roots()));
        }
        if !real.is_file() {
            return bad(format!("{field}: `{}` is not a regular file", p.escape_debug()));
        }
        Ok(real)
    }

    fn roots(&self) -> String {
        if self.data_roots.is_empty() {
            return "none".into();
        }
        self.data_roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
    }

    /// `flag` (typed field `field`) needs this `ringrec train` to have it.
    fn needs_flag(&self, flag: &str, field: &str) -> Result<(), SpecError> {
        if self.train_flags.contains(flag) {
            return Ok(());
        }
        bad(format!("{field}: this ringrec's `train` has no {flag} flag; leave {field} out (or upgrade ringrec)"))
    }

    /// Checks every field of `spec` and turns it into a plan.
    pub fn plan(&self, spec: &JobSpec) -> Result<Plan, SpecError> {
        let name = job_name(spec)?;
        let (backend, ranks, nodes) = self.placement(spec)?;
        let threads = int_in("threads", spec.threads, 1, 256)?.map(|n| n as u32);
        let mut args: Vec<String> = Vec::new();
        if let Some(t) = threads {
            args.extend(["--threads".into(), t.to_string()]);
        }
        self.model_args(spec, &mut args)?;
        let ckpt_every = self.run_args(spec, &mut args)?;
        if let Some(w) = spec.warm_start {
            if w < 1 {
                return bad(format!("warm_start must be the id of an earlier job (got {w})"));
            }
        }
        self.extra_args(&spec.args, &mut args)?;
        let env = env_vars(spec)?;
        Ok(Plan { name, backend, ranks, hosts: spec.hosts.clone(), nodes, threads, train_args: args, env, warm_start: spec.warm_start, checkpoints: ckpt_every.is_some() || spec.warm_start.is_some() })
    }

    /// Where the job runs: its back end (one this service has), ranks, hosts and nodes.
    fn placement(&self, spec: &JobSpec) -> Result<(BackendKind, u32, Option<u32>), SpecError> {
        let backend = match spec.backend.as_deref() {
            None => BackendKind::Local,
            Some(b) => BackendKind::parse(b).ok_or_else(|| SpecError(format!("backend must be `local` or `slurm` (got `{}`)", b.escape_debug())))?,
        };
        if backend == BackendKind::Slurm && !self.slurm {
            return bad("backend `slurm`: this service has no Slurm back end (sbatch was not found when it started, or it was started with --no-slurm); use `local`");
        }
        let ranks = int_in("ranks", spec.ranks, 1, self.max_ranks as i64)?.unwrap_or(1) as u32;
        if spec.hosts.len() > 64 {
            return bad(format!("hosts lists {} entries; at most 64 are allowed", spec.hosts.len()));
        }
        for h in &spec.hosts {
            printable("hosts", h, MAX_FIELD)?;
            host_entry(h)?;
        }
        let nodes = int_in("nodes", spec.nodes, 1, 1024)?.map(|n| n as u32);
        if nodes.is_some_and(|n| n > ranks) {
            return bad(format!("nodes ({}) exceeds ranks ({ranks}): every node needs at least one rank", nodes.unwrap_or(0)));
        }
        if nodes.is_some() && backend == BackendKind::Local {
            return bad("nodes is a Slurm setting; for `local` list hosts instead");
        }
        Ok((backend, ranks, nodes))
    }

    /// The model's and the schedule's flags (hidden, dim, batch, epochs, max_steps,
    /// keep_checkpoints, sync_every), appended to `args`.
    fn model_args(&self, spec: &JobSpec, args: &mut Vec<String>) -> Result<(), SpecError> {
        if let Some(h) = &spec.hidden {
            if h.is_empty() || h.len() > 8 {
                return bad(format!("hidden must list 1 to 8 layer widths (got {})", h.len()));
            }
            let mut w = Vec::new();
            for x in h {
                w.push(int_in("hidden", Some(*x), 1, 65536)?.unwrap_or(1).to_string());
            }
            args.extend(["--hidden".into(), w.join(",")]);
        }
        for (flag, field, v, hi) in [
            ("--dim", "dim", spec.dim, 1024),
            ("--batch", "batch", spec.batch, 1 << 22),
            ("--epochs", "epochs", spec.epochs, 10_000),
            ("--max-steps", "max_steps", spec.max_steps, 1 << 40),
            ("--keep-checkpoints", "keep_checkpoints", spec.keep_checkpoints, 100),
        ] {
            if let Some(x) = int_in(field, v, 1, hi)? {
                args.extend([flag.to_string(), x.to_string()]);
            }
        }
        if let Some(s) = int_in("sync_every", spec.sync_every, 1, 1 << 20)? {
            self.needs_flag("--sync-every", "sync_every")?;
            args.extend(["--sync-every".into(), s.to_string()]);
        }
        Ok(())
    }

    /// The evaluation, checkpoint and data flags (eval_every, checkpoint_every,
    /// test_fraction, data, eval_data), appended to `args`; the checkpoint interval.
    fn run_args(&self, spec: &JobSpec, args: &mut Vec<String>) -> Result<Option<u64>, SpecError> {
        let eval_every = int_in("eval_every", spec.eval_every, 1, 1 << 30)?.unwrap_or(10);
        args.extend(["--eval-every".into(), eval_every.to_string()]);
        let ckpt_every = int_in("checkpoint_every", spec.checkpoint_every, 0, 1 << 30)?;
        if let Some(c) = ckpt_every {
            args.extend(["--checkpoint-every".into(), c.to_string()]);
        }
        if let Some(f) = spec.test_fraction {
            if !(f.is_finite() && f > 0.0 && f < 1.0) {
                return bad(format!("test_fraction must be above 0 and below 1 (got {f})"));
            }
            args.extend(["--test-fraction".into(), f.to_string()]);
        }
        if let Some(d) = &spec.data {
            args.extend(["--data".into(), self.data_path("data", d)?.to_string_lossy().into_owned()]);
        }
        if let Some(d) = &spec.eval_data {
            self.needs_flag("--eval-data", "eval_data")?;
            args.extend(["--eval-data".into(), self.data_path("eval_data", d)?.to_string_lossy().into_owned()]);
        }
        Ok(ckpt_every)
    }

    /// Checks the spec's extra flags and appends them to `out`.
    fn extra_args(&self, extra: &[String], out: &mut Vec<String>) -> Result<(), SpecError> {
        if extra.len() > MAX_ARGS {
            return bad(format!("args lists {} entries; at most {MAX_ARGS} are allowed", extra.len()));
        }
        for a in extra {
            printable("args", a, MAX_FIELD)?;
            if a.contains('/') {
                return bad(format!("args: `{}` holds a `/`: give files through the typed fields (data, eval_data), which are checked against the data roots", a.escape_debug()));
            }
            let looks_like_flag = a.starts_with('-') && a.parse::<f64>().is_err();
            if !looks_like_flag {
                continue;
            }
            let flag = a.split_once('=').map_or(a.as_str(), |(f, _)| f);
            if !flag.starts_with("--") {
                return bad(format!("args: `{}`: give flags in their long form (`--name`)", a.escape_debug()));
            }
            match role(flag) {
                Some(ServiceRole::Owned) => return bad(format!("args: {flag} is set by the service for every job; leave it out")),
                Some(ServiceRole::Typed(field)) => return bad(format!("args: {flag} is set through the spec's field `{field}`")),
                Some(ServiceRole::Refused(why)) => return bad(format!("args: {flag} may not be given: {why}")),
                Some(ServiceRole::Args) | None => {}
            }
            if !self.train_flags.contains(flag) {
                return bad(format!("args: {flag} is not a flag of `ringrec train` (see `ringrec train --help`)"));
            }
        }
        out.extend(extra.iter().cloned());
        Ok(())
    }
}

/// The job's name: letters, digits, spaces and `_.-`; `job` when the spec has none.
fn job_name(spec: &JobSpec) -> Result<String, SpecError> {
    let Some(n) = &spec.name else { return Ok("job".into()) };
    printable("name", n, 64)?;
    if !n.chars().all(|c| c.is_ascii_alphanumeric() || " _.-".contains(c)) {
        return bad("name may hold letters, digits, spaces and `_.-` only");
    }
    Ok(n.clone())
}

/// The job's environment: at most 32 `RINGREC_*` variables, none holding a path.
fn env_vars(spec: &JobSpec) -> Result<Vec<(String, String)>, SpecError> {
    if spec.env.len() > 32 {
        return bad(format!("env sets {} variables; at most 32 are allowed", spec.env.len()));
    }
    let mut env = Vec::new();
    for (k, v) in &spec.env {
        let ok = k.len() <= 64 && k.strip_prefix("RINGREC_").is_some_and(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'));
        if !ok {
            return bad(format!("env: `{}` is not a RINGREC_* variable (upper-case letters, digits, `_`); only ringrec's own settings may be set", k.escape_debug()));
        }
        if !ringrec::config::VARIABLES.iter().any(|known| known.name == k) {
            return bad(format!("env: {k} is not a variable ringrec reads (a typo?); `ringrec info --variables` lists them"));
        }
        printable(&format!("env {k}"), v, MAX_FIELD)?;
        if v.contains('/') {
            return bad(format!("env {k}: values may not hold a path (`/`)"));
        }
        env.push((k.clone(), v.clone()));
    }
    Ok(env)
}

/// The long flags (`--name`) that a `--help` text lists.
pub fn flags_of_help(help: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    for word in help.split(|c: char| c.is_whitespace() || c == ',' || c == '[' || c == ']' || c == '<' || c == '=') {
        if let Some(rest) = word.strip_prefix("--") {
            if !rest.is_empty() && rest.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') {
                flags.insert(word.to_string());
            }
        }
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(root: &Path) -> Limits {
        let help = "  --data <DATA>\n  --epochs <EPOCHS>\n      --lr <LR>  Dense\n  --shuffle\n  --max-steps <MAX_STEPS>\n  --threads <T>";
        Limits { data_roots: vec![std::fs::canonicalize(root).expect("temp dir")], max_ranks: 8, train_flags: flags_of_help(help), slurm: false }
    }

    fn spec(json: &str) -> JobSpec {
        serde_json::from_str(json).expect("test spec parses")
    }

    fn refused(l: &Limits, json: &str) -> String {
        match l.plan(&spec(json)) {
            Err(e) => e.0,
            Ok(p) => panic!("{json} was accepted: {p:?}"),
        }
    }

    #[test]
    fn a_full_spec_becomes_train_flags() {
        let dir = std::env::temp_dir().join(format!("ringrec-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("d.tsv"), "1\t2\n").expect("write");
        let l = limits(&dir);
        let p = l.plan(&spec(r#"{"ranks": 2, "threads": 1, "hidden": [8, 4], "epochs": 2, "data": "d.tsv", "eval_every": 5, "checkpoint_every": 3, "args": ["--lr", "0.01", "--shuffle"], "env": {"RINGREC_VERIFY": "0"}}"#)).expect("valid");
        let real = std::fs::canonicalize(dir.join("d.tsv")).expect("exists");
        let want: Vec<String> = ["--threads", "1", "--hidden", "8,4", "--epochs", "2", "--eval-every", "5", "--checkpoint-every", "3", "--data", &real.to_string_lossy(), "--lr", "0.01", "--shuffle"].iter().map(|s| s.to_string()).collect();
        assert_eq!(p.train_args, want);
        assert_eq!((p.ranks, p.backend, p.checkpoints), (2, BackendKind::Local, true));
        assert_eq!(p.env, vec![("RINGREC_VERIFY".to_string(), "0".to_string())]);
        let files = JobFiles { dir: PathBuf::from("/s/jobs/3"), cache: PathBuf::from("/s/cache") };
        let cmd = p.train_command(&files);
        assert_eq!(cmd[0], "train");
        assert!(cmd.windows(2).any(|w| w[0] == "--metrics-out" && w[1] == "/s/jobs/3/metrics.jsonl"));
        assert!(cmd.windows(2).any(|w| w[0] == "--checkpoint-dir" && w[1] == "/s/jobs/3/ckpt"));
        assert!(!cmd.contains(&"--resume".to_string()));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_fields_are_refused_naming_them() {
        let dir = std::env::temp_dir().join(format!("ringrec-spec-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let l = limits(&dir);
        assert_eq!(refused(&l, r#"{"ranks": -1}"#), "ranks must be between 1 and 8 (got -1)");
        assert_eq!(refused(&l, r#"{"ranks": 9}"#), "ranks must be between 1 and 8 (got 9)");
        assert!(refused(&l, r#"{"data": "../../etc/passwd"}"#).contains("contains `..`"));
        assert!(refused(&l, r#"{"data": "/etc/passwd"}"#).contains("outside the data roots"));
        assert!(refused(&l, r#"{"data": "missing.tsv"}"#).contains("No such file"));
        assert!(refused(&l, r#"{"backend": "slurm"}"#).contains("no Slurm back end"));
        assert!(refused(&l, r#"{"backend": "pbs"}"#).contains("`local` or `slurm`"));
        assert!(refused(&l, r#"{"args": ["--metrics-out", "x"]}"#).contains("set by the service"));
        assert!(refused(&l, r#"{"env": {"RINGREC_VERIFI": "0"}}"#).contains("RINGREC_VERIFI is not a variable ringrec reads"));
        assert!(refused(&l, r#"{"args": ["--epochs=3"]}"#).contains("field `epochs`"));
        assert!(refused(&l, r#"{"args": ["--rm-rf"]}"#).contains("not a flag of `ringrec train`"));
        assert!(refused(&l, r#"{"args": ["--lr", "/tmp/x"]}"#).contains("holds a `/`"));
        assert!(refused(&l, r#"{"env": {"PATH": "x"}}"#).contains("not a RINGREC_* variable"));
        assert!(refused(&l, r#"{"hosts": ["a b"]}"#).contains("not a host name"));
        assert!(refused(&l, r#"{"hosts": ["node1:0"]}"#).contains("slots must be"));
        assert!(refused(&l, r#"{"test_fraction": 1.5}"#).contains("test_fraction"));
        assert!(refused(&l, r#"{"sync_every": 4}"#).contains("no --sync-every flag"));
        assert!(refused(&l, r#"{"hidden": []}"#).contains("1 to 8 layer widths"));
        assert!(refused(&l, r#"{"name": "x\u0000y"}"#).contains("control character"));
        // A symbolic link out of a root is refused like the path it points to.
        let link = dir.join("escape");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/etc/passwd", &link).expect("symlink");
        assert!(refused(&l, r#"{"data": "escape"}"#).contains("outside the data roots"));
        assert!(serde_json::from_str::<JobSpec>(r#"{"rank": 2}"#).is_err(), "unknown fields are refused");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_spec_carries_the_typed_settings_and_no_other() {
        // Every field set: a new field of JobSpec does not compile here until it is placed.
        let full = JobSpec {
            name: Some("x".into()),
            backend: Some("local".into()),
            ranks: Some(1),
            hosts: vec!["h".into()],
            nodes: Some(1),
            threads: Some(1),
            hidden: Some(vec![1]),
            dim: Some(1),
            batch: Some(1),
            epochs: Some(1),
            max_steps: Some(1),
            data: Some("d".into()),
            eval_data: Some("e".into()),
            test_fraction: Some(0.1),
            sync_every: Some(1),
            eval_every: Some(1),
            checkpoint_every: Some(1),
            keep_checkpoints: Some(1),
            warm_start: Some(1),
            env: [("RINGREC_X".to_string(), "1".to_string())].into(),
            args: vec!["--lr".into()],
        };
        let json = serde_json::to_value(&full).unwrap();
        let not_settings = ["name", "backend", "ranks", "hosts", "nodes", "warm_start", "env", "args"];
        let fields: BTreeSet<&str> = json.as_object().unwrap().keys().map(String::as_str).filter(|k| !not_settings.contains(k)).collect();
        let typed: BTreeSet<&str> = TrainConfig::all_settings().into_iter().filter_map(|s| match s.service {
            ServiceRole::Typed(f) => Some(f),
            _ => None,
        }).collect();
        assert_eq!(fields, typed, "the spec's typed fields are the settings declared ServiceRole::Typed");
        // Each typed setting is refused in args, naming its field; the service's own flags too.
        let l = limits(&std::env::temp_dir());
        for s in TrainConfig::all_settings() {
            let e = l.plan(&spec(&format!(r#"{{"args": ["{}"]}}"#, s.flag))).err().map(|e| e.0);
            match s.service {
                ServiceRole::Typed(f) => assert!(e.as_deref().is_some_and(|e| e.contains(&format!("field `{f}`"))), "{}: {e:?}", s.flag),
                ServiceRole::Owned => assert!(e.as_deref().is_some_and(|e| e.contains("set by the service")), "{}: {e:?}", s.flag),
                ServiceRole::Refused(why) => assert!(e.as_deref().is_some_and(|e| e.contains(why)), "{}: {e:?}", s.flag),
                ServiceRole::Args => {}
            }
        }
    }

    #[test]
    fn help_flags_are_found() {
        let f = flags_of_help("Usage: x [OPTIONS]\n  --data <DATA>  Criteo\n  --hidden <HIDDEN>  widths [default: 256,128]\n      --no-eval\n  -h, --help");
        assert_eq!(f.into_iter().collect::<Vec<_>>(), vec!["--data", "--help", "--hidden", "--no-eval"]);
    }
}
