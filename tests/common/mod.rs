//! Launching real `mpirun` jobs from tests; temporary directories.
#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// One mpirun job at a time: the machine has 2 cores and the jobs oversubscribe them.
pub static MPI_JOBS: Mutex<()> = Mutex::new(());

/// What a finished (or killed) job printed.
pub struct Job {
    /// Exit status code (None when killed by a signal).
    pub code: Option<i32>,
    /// stdout and stderr.
    pub stdout: String,
    pub stderr: String,
    /// Wall time.
    pub elapsed: Duration,
    /// True when the job ran past its deadline and was killed.
    pub timed_out: bool,
}

impl Job {
    pub fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
    /// The last JSON object line of stdout (`ringrec train --json`'s summary).
    pub fn summary(&self) -> serde_json::Value {
        let line = self.stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON summary:\n{}", self.all()));
        serde_json::from_str(line).expect("summary JSON")
    }
    pub fn assert_ok(&self) {
        assert!(
            self.code == Some(0) && !self.timed_out,
            "job failed (code {:?}, timed out {}):\n--- stdout\n{}\n--- stderr\n{}",
            self.code,
            self.timed_out,
            self.stdout,
            self.stderr
        );
    }
}

/// Every checkpoint's table files (`table.rrt`, then each `--table`'s `table.NAME.rrt` by
/// name) in checkpoint directory `dir`, by step: each as `STEP/FILE` and its bytes.
pub fn checkpoint_tables(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut steps: Vec<_> = std::fs::read_dir(dir).expect("checkpoint dir").filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.join("table.rrt").exists()).collect();
    steps.sort();
    let mut out = Vec::new();
    for p in &steps {
        let mut files: Vec<String> = std::fs::read_dir(p).expect("checkpoint").filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().to_string()).filter(|n| n.starts_with("table.") && n.ends_with(".rrt")).collect();
        files.sort_by_key(|n| (n != "table.rrt", n.clone()));
        for f in files {
            out.push((format!("{}/{f}", p.file_name().unwrap().to_string_lossy()), std::fs::read(p.join(&f)).expect("table file")));
        }
    }
    out
}

/// A finished `ringrec train --json` run with checkpoints, as the GPU hot-row cache's tests
/// compare runs: its summary, every checkpoint's table file by step, its stderr.
pub struct CheckpointedRun {
    pub summary: serde_json::Value,
    pub tables: Vec<(String, Vec<u8>)>,
    pub stderr: String,
}

impl CheckpointedRun {
    /// `job` (asserted to have succeeded) and its checkpoint directory `dir`.
    pub fn of(job: &Job, dir: &Path) -> CheckpointedRun {
        job.assert_ok();
        CheckpointedRun { summary: job.summary(), tables: checkpoint_tables(dir), stderr: job.stderr.clone() }
    }

    /// Asserts `other` ended as this run did: the dense parameters (`params_fnv`), the same
    /// checkpoints (at least 3) and every one's table files, byte for byte.
    pub fn assert_same(&self, what: &str, other: &CheckpointedRun) {
        assert_eq!(other.summary["params_fnv"], self.summary["params_fnv"], "{what}: the dense parameters differ");
        let names = |r: &CheckpointedRun| r.tables.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names(other), names(self), "{what}: other checkpoints");
        assert!(self.tables.len() >= 3, "{what}: the run wrote {} checkpoints", self.tables.len());
        for ((n, x), (_, y)) in self.tables.iter().zip(&other.tables) {
            assert!(x == y, "{what}: the table of checkpoint {n} differs");
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `exe args` under `mpirun -np np` with `env` exported to every rank; kills the whole
/// job after `timeout`.
pub fn mpirun_exe(exe: &Path, np: usize, env: &[(&str, &str)], args: &[&str], timeout: Duration) -> Job {
    let _one_at_a_time = MPI_JOBS.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new("mpirun");
    cmd.arg("--oversubscribe").arg("-np").arg(np.to_string());
    if is_root() {
        cmd.arg("--allow-run-as-root");
    }
    for (k, v) in env {
        cmd.env(k, v);
        cmd.arg("-x").arg(k);
    }
    cmd.arg(exe).args(args);
    run_with_timeout(cmd, timeout)
}

/// A `ringrec train` table for tests that depend on no table size: 65,536 slots (a 5 MB
/// table, grown by the run if it needs more) instead of the default 2^21 (168 MB to create
/// in `/dev/shm` per host and to write at every checkpoint, for a few thousand keys). A
/// run's results do not depend on it: a row's values never depend on its slot (the same
/// `params_fnv` at any capacity).
pub const SMALL_TABLE: [&str; 2] = ["--table-capacity", "65536"];

/// The arguments of a `ringrec` command, with [`SMALL_TABLE`] added to a `train` that
/// names no `--table-capacity` of its own.
pub fn small_table<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut a = args.to_vec();
    if a.first() == Some(&"train") && !a.contains(&"--table-capacity") {
        a.extend_from_slice(&SMALL_TABLE);
    }
    a
}

/// Runs the `ringrec` binary under mpirun.
pub fn mpirun(np: usize, env: &[(&str, &str)], args: &[&str]) -> Job {
    mpirun_exe(Path::new(env!("CARGO_BIN_EXE_ringrec")), np, env, args, Duration::from_secs(300))
}

/// This test process's scratch directory, `<tmp>/ringrec-tests/<pid>`: every test's files
/// live under it, and it is removed when the process exits (kept with
/// `RINGREC_KEEP_TEST_DIRS=1`, to look at after a failure). Made on first use, when the
/// directories of test processes no longer alive (a killed run's) are removed too.
pub fn scratch_root() -> &'static Path {
    SCRATCH_ROOT.get_or_init(|| {
        let base = std::env::temp_dir().join("ringrec-tests");
        for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
            let dead = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()).is_some_and(|pid| !Path::new("/proc").join(pid.to_string()).exists());
            if dead {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let root = base.join(std::process::id().to_string());
        std::fs::create_dir_all(&root).expect("the tests' scratch directory");
        if std::env::var("RINGREC_KEEP_TEST_DIRS").as_deref() != Ok("1") {
            // SAFETY: `remove_scratch_root` is an `extern "C" fn()` that never unwinds.
            unsafe { libc::atexit(remove_scratch_root) };
        }
        root
    })
}

static SCRATCH_ROOT: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn remove_scratch_root() {
    if let Some(root) = SCRATCH_ROOT.get() {
        let _ = std::fs::remove_dir_all(root);
    }
}

/// `name` under [`scratch_root`], emptied and created.
pub fn scratch(name: &str) -> PathBuf {
    let d = scratch_root().join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("a scratch directory");
    d
}

/// `name` under [`scratch_root`], created if missing (kept as it is: a data set the tests of
/// one binary share).
pub fn shared_scratch(name: &str) -> PathBuf {
    let d = scratch_root().join(name);
    std::fs::create_dir_all(&d).expect("a scratch directory");
    d
}

/// Runs a command in its own process group, killing the group after `timeout`.
pub fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Job {
    let dir = shared_scratch(&format!("job-{:?}", std::thread::current().id()));
    let out_path = dir.join("stdout");
    let err_path = dir.join("stderr");
    let out = std::fs::File::create(&out_path).expect("stdout file");
    let err = std::fs::File::create(&err_path).expect("stderr file");
    cmd.stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn mpirun (run scripts/setup.sh to install Open MPI)");
    let pgid = child.id() as i32;
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if start.elapsed() > timeout {
            timed_out = true;
            // SAFETY: signalling our own child's process group.
            unsafe {
                libc::kill(-pgid, libc::SIGTERM);
            }
            std::thread::sleep(Duration::from_secs(2));
            // SAFETY: as above.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
            break child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    Job { code: status.and_then(|s| s.code()), stdout, stderr, elapsed, timed_out }
}

/// `ringrec data synth --rows rows --out path` (Criteo-shaped lines of the planted model).
pub fn synth(path: &Path, rows: u64) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringrec"));
    c.args(["data", "synth", "--rows", &rows.to_string(), "--out"]).arg(path);
    run_with_timeout(c, Duration::from_secs(120)).assert_ok();
}

/// The scores of `ringrec predict --out FILE` (`score<TAB>label` lines), in row order.
pub fn read_scores(path: &Path) -> Vec<f32> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().map(|l| l.split('\t').next().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{}: not score<TAB>label: {l:?}", path.display()))).collect()
}

/// An independent scorer against `ringrec predict`: `python SCRIPT ARGS --compare SCORES
/// --tolerance TOL` (scripts/bundle_predict.py, scripts/onnx_check.py: they score the
/// bundle themselves and fail past the tolerance), which must succeed; its job (the worst
/// difference is on stderr).
pub fn compare_with_predict(python: &str, script: &str, args: &[&str], scores: &Path, tolerance: &str) -> Job {
    let mut c = Command::new(python);
    c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts").join(script)).args(args).arg("--compare").arg(scores).args(["--tolerance", tolerance]);
    let job = run_with_timeout(c, Duration::from_secs(180));
    job.assert_ok();
    job
}

/// Files in /dev/shm whose name starts with `ringrec-<job_id>`.
pub fn shm_leftovers(job_id: &str) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().to_string()).filter(|n| n.starts_with(&format!("ringrec-{job_id}"))).collect())
        .unwrap_or_default()
}

/// Command line of the integration test binary running only `worker` (an ignored test).
pub fn worker_args(worker: &str) -> Vec<String> {
    vec!["--ignored".into(), "--exact".into(), worker.into(), "--nocapture".into(), "--test-threads=1".into()]
}

/// Runs an ignored worker test of the current test binary under mpirun.
pub fn run_worker(worker: &str, np: usize, env: &[(&str, &str)], timeout: Duration) -> Job {
    let exe = std::env::current_exe().expect("current exe");
    let args = worker_args(worker);
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let mut env: Vec<(&str, &str)> = env.to_vec();
    env.push(("RINGREC_TEST_WORKER", "1"));
    mpirun_exe(&exe, np, &env, &args, timeout)
}

/// `v` converted to `dtype` (rounded / truncated the way `as` and `half` do), as raw bytes.
pub fn to_bytes(dtype: ringrec::dtype::DType, v: &[f64]) -> Vec<u8> {
    use half::{bf16, f16};
    use ringrec::dtype::DType;
    match dtype {
        DType::F32 => bytemuck::cast_slice(&v.iter().map(|x| *x as f32).collect::<Vec<_>>()).to_vec(),
        DType::F64 => bytemuck::cast_slice(v).to_vec(),
        DType::F16 => bytemuck::cast_slice(&v.iter().map(|x| f16::from_f64(*x)).collect::<Vec<_>>()).to_vec(),
        DType::BF16 => bytemuck::cast_slice(&v.iter().map(|x| bf16::from_f64(*x)).collect::<Vec<_>>()).to_vec(),
        DType::I32 => bytemuck::cast_slice(&v.iter().map(|x| *x as i32).collect::<Vec<_>>()).to_vec(),
        DType::I64 => bytemuck::cast_slice(&v.iter().map(|x| *x as i64).collect::<Vec<_>>()).to_vec(),
        DType::U8 => v.iter().map(|x| *x as u8).collect(),
    }
}

/// GPUs the GPU path can use here, or `None` after printing why the GPU test is skipped.
pub fn gpus() -> Option<usize> {
    match ringrec::device::probe() {
        Ok(i) => Some(i.devices),
        Err(e) => {
            eprintln!("skipped: no GPU path here ({e})");
            None
        }
    }
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `<name>-<n>` under [`scratch_root`], empty.
    pub fn new(name: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let p = scratch_root().join(format!("{name}-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    /// A path inside it.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The rank processes of job `job` on this machine, as (world rank, pid) in rank order:
/// those whose environment has `RINGREC_JOB_ID=<job>` and an `OMPI_COMM_WORLD_RANK`.
pub fn rank_pids(job: &str) -> Vec<(usize, i32)> {
    let mut out = Vec::new();
    let want = format!("RINGREC_JOB_ID={job}");
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        let has_job = vars.contains(&want.as_bytes());
        let rank = vars.iter().find_map(|v| std::str::from_utf8(v).ok()?.strip_prefix("OMPI_COMM_WORLD_RANK=")?.parse::<usize>().ok());
        if let (true, Some(r)) = (has_job, rank) {
            out.push((r, pid));
        }
    }
    out.sort();
    out
}

/// The tests' Python venv (scripts/test-venv.sh: numpy, onnx, onnxruntime): the python
/// `RINGREC_TEST_PYTHON` names (scripts/test.sh sets it), else the venv's fixed place,
/// `<target>/test-venv`, checked by importing `modules`. None (the reason printed as
/// `skipped: ...`) when there is none; in CI (`CI=true`) a missing venv fails the test.
pub fn test_python(modules: &str) -> Option<String> {
    let fixed = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().map(|t| t.join("test-venv/bin/python"));
    let py = std::env::var("RINGREC_TEST_PYTHON").ok().or_else(|| fixed.map(|p| p.display().to_string()))?;
    let ok = Command::new(&py).args(["-c", &format!("import {modules}")]).output().is_ok_and(|o| o.status.success());
    if ok {
        return Some(py);
    }
    let why = format!("{py} cannot import {modules} (scripts/test-venv.sh makes the venv)");
    assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true: the tests' Python venv is required: {why}");
    eprintln!("skipped: {why}");
    None
}
