//! Never hang: faults injected into real mpirun jobs, bounded in time and seeded.
//! (a) a rank SIGKILLed and (b) a rank SIGSTOPped at random moments, under an mpirun told
//! NOT to kill the survivors: every survivor exits within the comm timeout + 10 s with a
//! message naming the peer, and nothing is left in shared memory; (c) a SIGTERM to
//! `ringrec launch` mid-run, then `--resume`: bit-identical to an uninterrupted run; (d)
//! every `train` flag given another value on one rank (mpirun's MPMD syntax), and data
//! files of different lengths: the same clear error on every rank in bounded time (or,
//! for the flags that may differ, a normal run); (e) `ringrec launch --restarts 2` with a
//! rank killed once: the job finishes equal to an uninterrupted run.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::os::unix::process::CommandExt;

/// The comm timeout of the fault tests (seconds).
const TIMEOUT: u64 = 3;

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_ringrec")
}

fn tmpdir(name: &str) -> PathBuf {
    common::scratch(name)
}

/// The small data set every test trains on (generated once per test binary).
fn data_dir() -> PathBuf {
    common::shared_scratch("data")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A job started in its own process group, its output in files.
struct Running {
    child: Child,
    out: PathBuf,
    err: PathBuf,
    job: String,
}

/// What a finished job printed.
struct Done {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Done {
    fn all(&self) -> String {
        format!("status {:?}\n--- stdout\n{}\n--- stderr\n{}", self.code, self.stdout, self.stderr)
    }
}

/// mpirun with what every test here wants: survivors NOT killed by mpirun when a rank
/// fails, the test's environment exported, a unique job id.
fn mpirun_command(name: &str, env: &[(&str, &str)]) -> (Command, String) {
    let job = format!("rel-{name}-{}", std::process::id());
    let mut c = Command::new("mpirun");
    c.args(["--oversubscribe", "--mca", "orte_abort_on_non_zero_status", "0"]);
    if is_root() {
        c.arg("--allow-run-as-root");
    }
    let dd = data_dir();
    let mut all: Vec<(String, String)> = vec![("RINGREC_JOB_ID".into(), job.clone()), ("RINGREC_DATA_DIR".into(), dd.display().to_string()), ("RINGREC_COMM_TIMEOUT_SECONDS".into(), TIMEOUT.to_string())];
    all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    for (k, v) in &all {
        c.env(k, v);
        c.args(["-x", k]);
    }
    (c, job)
}

fn start(mut c: Command, name: &str, job: String) -> Running {
    let dir = tmpdir(&format!("out-{name}"));
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    c.stdin(Stdio::null()).stdout(std::fs::File::create(&out).unwrap()).stderr(std::fs::File::create(&err).unwrap()).process_group(0);
    Running { child: c.spawn().expect("spawn mpirun (run scripts/setup.sh)"), out, err, job }
}

impl Running {
    /// Waits up to `limit`; kills the whole group past it (a hang is a test failure).
    fn finish(mut self, limit: Duration) -> (Done, bool, String) {
        let t = Instant::now();
        let mut hung = false;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break Some(s);
            }
            if t.elapsed() > limit {
                hung = true;
                // SAFETY: signalling our own child's process group.
                unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
                break self.child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let done = Done { code: status.and_then(|s| s.code()), stdout: std::fs::read_to_string(&self.out).unwrap_or_default(), stderr: std::fs::read_to_string(&self.err).unwrap_or_default() };
        (done, hung, self.job)
    }

    /// The rank processes: (world rank, pid), from their environment.
    fn ranks(&self) -> Vec<(usize, i32)> {
        common::rank_pids(&self.job)
    }
}

fn alive(pid: i32) -> bool {
    ringrec::stale::pid_alive(pid)
}

/// A seeded number in `0..n`.
fn pick(seed: u64, salt: u64, n: u64) -> u64 {
    ringrec::hash::splitmix64(seed.wrapping_mul(0x9E37) ^ salt) % n.max(1)
}

/// `train` with `extra`, and the small defaults of these tests for the flags `extra` does
/// not give.
fn train_args(extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["train", "--no-progress", "--json"].iter().map(|s| s.to_string()).collect();
    for (flag, value) in [("--synth-rows", "6000"), ("--batch", "240"), ("--epochs", "100")] {
        if !extra.contains(&flag) {
            a.extend([flag.to_string(), value.to_string()]);
        }
    }
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Starts `np` ranks training for long, waits a seeded moment, sends `signal` to a seeded
/// rank; returns (victim, seconds from the signal to each survivor's exit, output).
fn inject(name: &str, seed: u64, np: usize, env: &[(&str, &str)], signal: i32) -> (usize, Vec<(usize, f64)>, Done, String) {
    let (mut c, job) = mpirun_command(name, env);
    c.args(["-np", &np.to_string(), exe()]).args(train_args(&["--epochs", "1000", "--no-eval"]));
    let run = start(c, name, job);
    // Ranks up (data cached by an earlier run or generated now), then a random moment.
    let t = Instant::now();
    let mut ranks = run.ranks();
    while ranks.len() < np && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
        ranks = run.ranks();
    }
    assert_eq!(ranks.len(), np, "the ranks did not start");
    std::thread::sleep(Duration::from_millis(1500 + pick(seed, 1, 2500)));
    let victim = pick(seed, 2, np as u64) as usize;
    let vpid = ranks[victim].1;
    // SAFETY: signalling a process this test started.
    unsafe { libc::kill(vpid, signal) };
    let hit = Instant::now();
    let mut exits: Vec<(usize, f64)> = Vec::new();
    let survivors: Vec<(usize, i32)> = ranks.iter().copied().filter(|(r, _)| *r != victim).collect();
    while exits.len() < survivors.len() && hit.elapsed() < Duration::from_secs(TIMEOUT + 30) {
        for (r, pid) in &survivors {
            if !exits.iter().any(|(x, _)| x == r) && !alive(*pid) {
                exits.push((*r, hit.elapsed().as_secs_f64()));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if signal == libc::SIGSTOP {
        // SAFETY: as above; the stopped rank is ended so the job can finish.
        unsafe { libc::kill(vpid, libc::SIGKILL) };
    }
    let (done, _, job) = run.finish(Duration::from_secs(30));
    (victim, exits, done, job)
}

fn check_survivors(what: &str, np: usize, victim: usize, exits: &[(usize, f64)], done: &Done, job: &str) {
    assert_eq!(exits.len(), np - 1, "{what}: survivors still running {} s after the fault:\n{}", TIMEOUT + 30, done.all());
    for (r, secs) in exits {
        assert!(*secs <= (TIMEOUT + 10) as f64, "{what}: rank {r} exited {secs:.1} s after the fault (limit {} s)", TIMEOUT + 10);
        let named = done.stderr.lines().any(|l| l.starts_with(&format!("ringrec rank {r}:")) && (l.contains(&format!("rank {victim} ")) || l.contains(&format!("[{victim}]"))));
        assert!(named, "{what}: rank {r} printed no line naming rank {victim}:\n{}", done.all());
    }
    assert_eq!(common::shm_leftovers(job), Vec::<String>::new(), "{what}: shared memory left behind");
}

/// How many seeded faults of each kind: `RINGREC_RELIABILITY_SEEDS` (the benchmark,
/// scripts/bench/reliability.sh, runs many), or `default`.
fn seeds(default: u64) -> u64 {
    std::env::var("RINGREC_RELIABILITY_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Faults of one kind: 3 ranks on one host, and every third seed 4 ranks as 2 simulated
/// hosts (the victim's host and the other one both notice).
fn faults(kind: &str, signal: i32, salt: u64, default: u64) {
    for seed in 0..seeds(default) {
        let (np, env): (usize, &[(&str, &str)]) = if seed % 3 == 2 { (4, &[("RINGREC_RANKS_PER_HOST", "2")]) } else { (3, &[]) };
        let (victim, exits, done, job) = inject(&format!("{kind}{seed}"), seed + salt, np, env, signal);
        // One line per fault, collected by scripts/bench/reliability.sh.
        eprintln!("fault {kind} seed {seed} ranks {np}: victim {victim}, survivors' exits {exits:?}");
        check_survivors(&format!("{kind} seed {seed} ({np} ranks)"), np, victim, &exits, &done, &job);
    }
}

#[test]
fn a_killed_rank_is_named_by_every_survivor_in_bounded_time() {
    faults("SIGKILL", libc::SIGKILL, 0, 3);
}

#[test]
fn a_stopped_rank_is_named_by_every_survivor_in_bounded_time() {
    faults("SIGSTOP", libc::SIGSTOP, 10, 2);
}

fn launch(name: &str, env: &[(&str, &str)], args: &[&str]) -> Command {
    let mut c = Command::new(exe());
    let dd = data_dir();
    c.env("RINGREC_DATA_DIR", &dd).env("RINGREC_JOB_ID", format!("rel-{name}-{}", std::process::id()));
    for (k, v) in env {
        c.env(k, v);
    }
    c.args(args);
    c
}

/// `ringrec launch <launch> -- train <train_args(train)>`.
fn launch_args(launch: &[&str], train: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = std::iter::once("launch").chain(launch.iter().copied()).chain(std::iter::once("--")).map(String::from).collect();
    a.extend(train_args(train));
    a
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn fnv_of(out: &str) -> String {
    let line = out.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no summary in:\n{out}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    v["params_fnv"].as_str().unwrap().to_string()
}

/// The uninterrupted run the interrupted ones are compared with.
fn reference(steps: &str) -> String {
    let args = launch_args(&["-np", "2"], &["--max-steps", steps]);
    // Its own job id: two tests may run their references at once.
    let out = launch(&format!("ref{steps}"), &[], &strs(&args)).output().unwrap();
    assert!(out.status.success(), "reference run: {}", String::from_utf8_lossy(&out.stderr));
    fnv_of(&String::from_utf8_lossy(&out.stdout))
}

#[test]
fn sigterm_to_the_launcher_checkpoints_and_resume_is_bit_identical() {
    let steps = "400";
    let want = reference(steps);
    let dir = tmpdir("sigterm");
    let ck = dir.join("ck");
    let args = launch_args(&["-np", "2"], &["--max-steps", steps, "--checkpoint-dir", ck.to_str().unwrap(), "--checkpoint-every", "20"]);
    let mut c = launch("term", &[], &strs(&args));
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = c.spawn().unwrap();
    // Stop it mid-run: once the first checkpoint (step 20) is written.
    let t = Instant::now();
    while !ck.join("LATEST").exists() && t.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: signalling the launcher this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "the launcher exits 128+SIGTERM:\n{err}");
    assert!(err.contains("stopped by SIGUSR1 after step") && err.contains("continue with --resume"), "one line saying what was saved:\n{err}");
    let at = ringrec::train::checkpoint::latest_step(&ck).expect("a checkpoint");
    assert!(at > 20 && at < 400, "stopped mid-run, at step {at}");
    let mut resume = args.clone();
    resume.push("--resume".into());
    let out = launch("term2", &[], &strs(&resume)).output().unwrap();
    assert!(out.status.success(), "resume: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(fnv_of(&String::from_utf8_lossy(&out.stdout)), want, "resumed from step {at}: the parameters differ from the uninterrupted run");
    assert_eq!(common::shm_leftovers(&format!("rel-term-{}", std::process::id())), Vec::<String>::new());
}

#[test]
fn launch_restarts_a_failed_job_from_its_checkpoint_and_ends_equal() {
    let steps = "60";
    let want = reference(steps);
    let dir = tmpdir("restart");
    let ck = dir.join("ck");
    let once = dir.join("fault-fired");
    let args = launch_args(&["-np", "2", "--restarts", "2"], &["--max-steps", steps, "--checkpoint-dir", ck.to_str().unwrap(), "--checkpoint-every", "10"]);
    let env = [("RINGREC_FAULT_EXIT", "1:35"), ("RINGREC_FAULT_ONCE", once.to_str().unwrap())];
    let out = launch("restart", &env, &strs(&args)).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("attempt 1 ended with exit status"), "{err}");
    // The newest checkpoint written whole before rank 1 died at step 35: step 30's, or
    // step 20's when step 30's was still being written in the background (a loaded machine).
    let from = err.split("relaunching from the checkpoint of step ").nth(1).and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()).and_then(|n| n.parse::<u64>().ok());
    assert!(matches!(from, Some(20 | 30)), "relaunched from the newest whole checkpoint before step 35 (20 or 30), not {from:?}:\n{err}");
    assert_eq!(fnv_of(&String::from_utf8_lossy(&out.stdout)), want);
}

/// Two ranks started with different `train` flags (mpirun's MPMD syntax).
/// An entry `^--flag` in `a` or `b` drops that flag from the defaults of `train_args`.
fn mpmd(name: &str, a: &[&str], b: &[&str]) -> (Done, bool) {
    let (mut c, job) = mpirun_command(name, &[]);
    let args = |x: &[&str]| {
        let drop: Vec<&str> = x.iter().filter_map(|f| f.strip_prefix('^')).collect();
        let keep: Vec<&str> = x.iter().copied().filter(|f| !f.starts_with('^')).collect();
        let steps: &[&str] = if keep.contains(&"--max-steps") { &[] } else { &["--max-steps", "3"] };
        train_args(&[steps, &keep].concat()).into_iter().filter(|f| !drop.contains(&f.as_str())).collect::<Vec<_>>()
    };
    c.args(["-np", "1", exe()]).args(args(a));
    c.args([":", "-np", "1", exe()]).args(args(b));
    let (done, hung, _) = start(c, name, job).finish(Duration::from_secs(60));
    (done, hung)
}

/// Two ranks with the same flags and one environment variable set differently.
fn mpmd_env(name: &str, (ka, va): (&str, &str), (kb, vb): (&str, &str)) -> (Done, bool) {
    let (mut c, job) = mpirun_command(name, &[]);
    let args = train_args(&["--max-steps", "3"]);
    c.args(["-np", "1", "-x", &format!("{ka}={va}"), exe()]).args(&args);
    c.args([":", "-np", "1", "-x", &format!("{kb}={vb}"), exe()]).args(&args);
    let (done, hung, _) = start(c, name, job).finish(Duration::from_secs(60));
    (done, hung)
}

#[test]
fn ranks_started_with_different_flags_stop_with_the_flag_named() {
    let dir = tmpdir("mpmd");
    // Two data files of different lengths.
    let (short, long) = (dir.join("short.tsv"), dir.join("long.tsv"));
    for (p, rows) in [(&short, "300"), (&long, "400")] {
        let s = Command::new(exe()).args(["data", "synth", "--rows", rows, "--out", p.to_str().unwrap()]).output().unwrap();
        assert!(s.status.success());
    }
    let ck = dir.join("ck");
    let must_match: Vec<(&str, [&str; 2])> = vec![
        ("--data", [short.to_str().unwrap(), long.to_str().unwrap()]),
        ("--synth-rows", ["6000", "5000"]),
        ("--epochs", ["1", "2"]),
        ("--batch", ["240", "120"]),
        ("--dim", ["16", "8"]),
        ("--hidden", ["256,128", "64"]),
        ("--lr", ["0.001", "0.01"]),
        ("--dense-optimizer", ["adam", "sgd"]),
        ("--sparse-lr", ["0.05", "0.1"]),
        ("--sparse-optimizer", ["sgd", "adagrad"]),
        ("--test-fraction", ["0.1", "0.2"]),
        ("--seed", ["1", "2"]),
        ("--backend", ["shm", "mpi"]),
        ("--device", ["cpu", "host"]),
        ("--sparse-exchange", ["hier", "flat"]),
        ("--sparse-normalize", ["frequency", "none"]),
        ("--table-capacity", ["2097152", "1048576"]),
        ("--max-bad-lines", ["1000", "10"]),
        ("--checkpoint-every", ["0", "5"]),
        ("--max-steps", ["3", "4"]),
        ("--keep-checkpoints", ["2", "3"]),
        ("--checkpoint-min-change", ["0", "0.05"]),
        ("--nan-policy", ["stop", "skip-step"]),
        ("--eval-data", [short.to_str().unwrap(), long.to_str().unwrap()]),
        ("--table-dtype", ["f32", "bf16"]),
        ("--table-max-bytes", ["1G", "2G"]),
        ("--admit-after", ["1", "2"]),
        ("--admit-sketch-mib", ["16", "8"]),
        ("--expire-after-steps", ["100", "200"]),
        ("--evict", ["lru", "lfu"]),
    ];
    let mut report = Vec::new();
    for (flag, [a, b]) in &must_match {
        let (done, hung) = mpmd(&format!("flag{}", flag.trim_start_matches('-')), &[flag, a], &[flag, b]);
        assert!(!hung, "{flag}: the job hung:\n{}", done.all());
        let lines: Vec<&str> = done.stderr.lines().filter(|l| l.contains("started with different settings")).collect();
        assert!(lines.len() == 2 && lines.iter().all(|l| l.contains(&format!("{flag}:"))), "{flag}: every rank must name it:\n{}", done.all());
        report.push(format!("{flag}: refused"));
    }
    // Flags without a value and flags whose absence differs.
    let ckd = ck.to_str().unwrap();
    for (flag, a, b) in [("--shuffle", vec!["--shuffle"], vec![]), ("--no-eval", vec!["--no-eval"], vec![]), ("--checkpoint-dir", vec!["--checkpoint-dir", ckd], vec![]), ("--resume", vec!["--checkpoint-dir", ckd, "--resume"], vec!["--checkpoint-dir", ckd])] {
        let (done, hung) = mpmd(&format!("flag{}", flag.trim_start_matches('-')), &a, &b);
        assert!(!hung && done.stderr.lines().filter(|l| l.contains(&format!("{flag}:"))).count() == 2, "{flag}:\n{}", done.all());
        report.push(format!("{flag}: refused"));
    }
    // A protocol knob of the environment, set per rank (`-x VAR=value` per app context).
    for (var, a, b) in [("RINGREC_COMPRESSION", "none", "fp16"), ("RINGREC_VERIFY", "1", "0")] {
        let (done, hung) = mpmd_env(&format!("env{var}"), (var, a), (var, b));
        assert!(!hung && done.stderr.lines().filter(|l| l.contains("started with different settings") && l.contains(var)).count() == 2, "{var}:\n{}", done.all());
        report.push(format!("{var}: refused"));
    }
    // Free to differ (documented in TrainConfig::settings): the run goes through.
    let other_dir = dir.join("data-elsewhere");
    let od = other_dir.to_str().unwrap();
    for (flag, a, b) in [("--threads", vec!["--threads", "1"], vec!["--threads", "2"]), ("--record-losses", vec!["--record-losses"], vec![]), ("--json", vec![], vec!["^--json"]), ("--no-progress", vec![], vec!["^--no-progress"]), ("--data-dir", vec!["--data-dir", od], vec![])] {
        let (done, hung) = mpmd(&format!("free{}", flag.trim_start_matches('-')), &a, &b);
        assert!(!hung && done.code == Some(0) && done.stdout.contains("params_fnv") && !done.stderr.contains("different settings"), "{flag} may differ:\n{}", done.all());
        report.push(format!("{flag}: may differ"));
    }
    eprintln!("{}", report.join("\n"));
}

/// Issue 36: a mismatch names the flag the user typed and the values as typed; the
/// environment variable only where it gave the value.
#[test]
fn mismatches_name_the_flags_and_values_as_typed() {
    let ck = tmpdir("mpmd-typed").join("ck");
    let ckd = ck.to_str().unwrap();
    let cases: Vec<(&str, Vec<&str>, Vec<&str>, String)> = vec![
        ("steps", vec!["--max-steps", "10"], vec!["--max-steps", "20"], "--max-steps: rank 0 has 10, rank 1 has 20".into()),
        ("compression", vec!["--compression", "none"], vec!["--compression", "fp16"], "--compression: rank 0 has none, rank 1 has fp16".into()),
        ("block", vec!["--compression", "1bit", "--onebit-block", "64"], vec!["--compression", "1bit", "--onebit-block", "128"], "--onebit-block: rank 0 has 64, rank 1 has 128".into()),
        ("ckdir", vec!["--checkpoint-dir", ckd], vec![], format!("--checkpoint-dir: rank 0 has {ckd}, rank 1 has (not set)")),
        ("hidden", vec!["--hidden", "64,32"], vec![], "--hidden: rank 0 has 64,32, rank 1 has 256,128".into()),
    ];
    for (name, a, b, want) in &cases {
        let (done, hung) = mpmd(&format!("typed-{name}"), a, b);
        assert!(!hung, "{name}: the job hung:\n{}", done.all());
        let lines = done.stderr.lines().filter(|l| l.contains("started with different settings")).count();
        assert!(lines == 2 && done.stderr.lines().filter(|l| l.contains(want.as_str())).count() == 2, "{name}: every rank must say `{want}`:\n{}", done.all());
        for internal in ["Some(", "None", "Fp16", "RINGREC_ONEBIT_BLOCK", "RINGREC_COMPRESSION"] {
            assert!(!done.stderr.contains(internal), "{name}: `{internal}` is an internal name:\n{}", done.all());
        }
    }
    let (done, hung) = mpmd_env("typed-env", ("RINGREC_COMPRESSION", "none"), ("RINGREC_COMPRESSION", "fp16"));
    let want = "--compression: rank 0 has none (RINGREC_COMPRESSION=none), rank 1 has fp16 (RINGREC_COMPRESSION=fp16)";
    assert!(!hung && done.stderr.lines().filter(|l| l.contains(want)).count() == 2, "every rank must say `{want}`:\n{}", done.all());
    let (done, hung) = mpmd_env("typed-var", ("RINGREC_SHM_CHUNK_BYTES", "1M"), ("RINGREC_SHM_CHUNK_BYTES", "2M"));
    let want = "RINGREC_SHM_CHUNK_BYTES: rank 0 has 1M, rank 1 has 2M";
    assert!(!hung && done.stderr.lines().filter(|l| l.contains(want)).count() == 2, "every rank must say `{want}`:\n{}", done.all());
}

#[test]
fn the_data_file_differs_in_length_is_refused_with_the_rows_named() {
    // Same flags, a file of another length behind the same path on one rank is what
    // `--data` identity catches above; here the default set differs by its row count.
    let (done, hung) = mpmd("rows", &["--synth-rows", "6000"], &["--synth-rows", "6001"]);
    assert!(!hung, "{}", done.all());
    assert!(done.stderr.contains("--synth-rows: rank 0 has 6000, rank 1 has 6001"), "{}", done.all());
}


/// A rank that gives up on its peers ends with `_exit` (`watchdog::end_job`), running no
/// destructor: a segment whose set-up was waiting for the failed rank keeps its name unless
/// the exit path unlinks what is tracked — which `end_job` and the second signal do.
#[test]
fn tracked_segment_names_are_unlinked_by_the_exit_path() {
    let dir = tmpdir("tracked");
    let (a, b) = (dir.join("ringrec-seg-a"), dir.join("ringrec-seg-b"));
    for p in [&a, &b] {
        std::fs::write(p, b"x").unwrap();
    }
    let ga = ringrec::signals::track(&a).expect("a free slot");
    let gb = ringrec::signals::track(&b).expect("a free slot");
    // The normal path: the guard is dropped after the name was removed; the slot is free.
    drop(gb);
    ringrec::signals::unlink_tracked();
    assert!(!a.exists(), "a tracked name must be unlinked");
    assert!(b.exists(), "a name no longer tracked must be left alone");
    drop(ga);
    std::fs::remove_dir_all(&dir).unwrap();
}
