//! Never lose, never corrupt: checkpoints under real mpirun. A whole job SIGKILLed at
//! seeded moments and resumed each time ends equal to an uninterrupted run with no
//! temporary file left; the newest checkpoints are kept, whole and private; a damaged
//! newest one falls back to the previous; parts and flags that do not belong together are
//! refused naming the flag; a NaN stops the run at that step (or is skipped) and is never
//! saved; a full checkpoint filesystem keeps the previous checkpoint; checkpoints written in
//! the background resume bit-identically to synchronous ones, and one due while another is
//! being written waits for it.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ringrec::train::checkpoint::{latest_step, list, step_dir};

fn tmpdir(name: &str) -> PathBuf {
    common::scratch(name)
}

/// The small data set every run here trains on (generated once per test binary).
fn data_dir() -> PathBuf {
    common::shared_scratch("data")
}

fn train_args<'a>(ck: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["train", "--synth-rows", "6000", "--batch", "240", "--hidden", "32", "--table-capacity", "65536", "--no-progress", "--json", "--no-eval"];
    a.extend_from_slice(&["--checkpoint-dir", ck.to_str().expect("utf8")]);
    a.extend_from_slice(extra);
    a
}

fn train(np: usize, env: &[(&str, &str)], ck: &Path, extra: &[&str]) -> common::Job {
    let dd = data_dir();
    let mut all = vec![("RINGREC_DATA_DIR", dd.to_str().expect("utf8"))];
    all.extend_from_slice(env);
    common::mpirun(np, &all, &train_args(ck, extra))
}

fn summary(job: &common::Job) -> serde_json::Value {
    let line = job.stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON summary:\n{}", job.all()));
    serde_json::from_str(line).expect("summary JSON")
}

/// Names in `dir` that are not complete checkpoints or the pointer: temporaries.
/// SIGKILLs every process whose environment holds `entry` (`NAME=value`) and waits until
/// none is left (at most 10 s).
fn kill_processes_with_env(entry: &str) {
    let t = Instant::now();
    loop {
        let mut found = 0;
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let Ok(env) = std::fs::read(e.path().join("environ")) else { continue };
            if env.split(|b| *b == 0).any(|v| v == entry.as_bytes()) {
                found += 1;
                // SAFETY: a process of the job this test started (its job id is unique).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if found == 0 || t.elapsed() > Duration::from_secs(10) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().to_string()).filter(|n| n != "LATEST" && !n.starts_with("step-")).collect())
        .unwrap_or_default()
}

fn steps_kept(dir: &Path) -> Vec<u64> {
    let mut s: Vec<u64> = list(dir).into_iter().map(|c| c.0).collect();
    s.sort_unstable();
    s
}

#[test]
fn the_newest_checkpoints_are_kept_whole_and_private() {
    let ck = tmpdir("keep");
    let job = train(2, &[], &ck, &["--max-steps", "10", "--checkpoint-every", "3", "--keep-checkpoints", "2"]);
    job.assert_ok();
    // Checkpoints at 3, 6, 9 and the last step 10; the newest two are kept.
    assert_eq!(steps_kept(&ck), vec![9, 10]);
    assert_eq!(latest_step(&ck), Some(10));
    assert_eq!(summary(&job)["checkpoints_written"], 4);
    assert_eq!(temporaries(&ck), Vec::<String>::new());
    let newest = step_dir(&ck, 10);
    assert_eq!(std::fs::metadata(&newest).unwrap().permissions().mode() & 0o777, 0o700);
    for f in ["manifest.json", "dense.bin", "table.rrt"] {
        let mode = std::fs::metadata(newest.join(f)).unwrap_or_else(|e| panic!("{f}: {e}")).permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{f} must be private");
    }
    let m = ringrec::train::checkpoint::load(&newest).expect("the newest checkpoint passes every check");
    assert_eq!((m.manifest.step, m.dense.step), (10, 10));
}

#[test]
fn a_damaged_newest_checkpoint_falls_back_to_the_previous_and_ends_equal() {
    let whole = tmpdir("fallback-whole");
    let reference = train(2, &[], &whole, &["--max-steps", "14", "--checkpoint-every", "5"]);
    reference.assert_ok();
    let ck = tmpdir("fallback");
    train(2, &[], &ck, &["--max-steps", "10", "--checkpoint-every", "5"]).assert_ok();
    assert_eq!(steps_kept(&ck), vec![5, 10]);
    // One flipped byte in the newest dense.bin.
    let bin = step_dir(&ck, 10).join("dense.bin");
    let mut b = std::fs::read(&bin).unwrap();
    let at = b.len() / 2;
    b[at] ^= 0x10;
    std::fs::write(&bin, &b).unwrap();
    let job = train(2, &[], &ck, &["--max-steps", "14", "--checkpoint-every", "5", "--resume"]);
    job.assert_ok();
    assert!(job.stderr.contains("warning: skipping") && job.stderr.contains("step-000000000010") && job.stderr.contains("CRC-32 differs"), "{}", job.all());
    assert!(job.stderr.contains("resuming from") && job.stderr.contains("step-000000000005 (step 5)"), "{}", job.all());
    assert_eq!(summary(&job)["steps"], 9);
    assert_eq!(summary(&job)["params_fnv"], summary(&reference)["params_fnv"], "resumed from the previous checkpoint: the same result");
}

/// The files of the checkpoint of `step` in `dir`: (CRC-32 of `table.rrt`, of `dense.bin`).
fn file_crcs(dir: &Path, step: u64) -> (u32, u32) {
    let crc = |f: &str| ringrec::hash::crc32(&std::fs::read(step_dir(dir, step).join(f)).unwrap_or_else(|e| panic!("{f} of step {step}: {e}")));
    (crc("table.rrt"), crc("dense.bin"))
}

#[test]
fn a_run_resumed_from_background_checkpoints_is_bit_identical_to_one_written_synchronously() {
    for np in [1, 2] {
        let base = ["--max-steps", "12", "--checkpoint-every", "4", "--keep-checkpoints", "10"];
        // The reference: every checkpoint written synchronously, one run.
        let sync = tmpdir(&format!("bg-sync-{np}"));
        let reference = train(np, &[("RINGREC_CHECKPOINT_BACKGROUND", "0")], &sync, &base);
        reference.assert_ok();
        // Background checkpoints (the default), the run stopped after step 8 and resumed.
        let bg = tmpdir(&format!("bg-{np}"));
        train(np, &[], &bg, &["--max-steps", "8", "--checkpoint-every", "4", "--keep-checkpoints", "10"]).assert_ok();
        let mut args = base.to_vec();
        args.push("--resume");
        let resumed = train(np, &[], &bg, &args);
        resumed.assert_ok();
        assert!(resumed.stderr.contains("step-000000000008 (step 8)"), "{}", resumed.all());
        assert_eq!(summary(&resumed)["params_fnv"], summary(&reference)["params_fnv"], "{np} rank(s): the same parameters");
        assert_eq!(summary(&resumed)["checkpoints_written"], 1);
        assert_eq!(steps_kept(&bg), vec![4, 8, 12]);
        for step in [4, 8, 12] {
            assert_eq!(file_crcs(&bg, step), file_crcs(&sync, step), "{np} rank(s): the checkpoint of step {step}, table and dense state, byte for byte");
        }
        assert_eq!(temporaries(&bg), Vec::<String>::new());
    }
}

#[test]
fn a_checkpoint_due_while_one_is_being_written_waits_for_it() {
    let ck = tmpdir("slow-writer");
    // The writer sleeps 1.5 s before each write; a checkpoint is due every 2 steps.
    let job = train(2, &[("RINGREC_FAULT_SLOW_CHECKPOINT", "1.5")], &ck, &["--max-steps", "6", "--checkpoint-every", "2", "--keep-checkpoints", "10"]);
    job.assert_ok();
    assert!(job.stderr.contains("step 4: the checkpoint of step 2 is still being written") && job.stderr.contains("this one waits for it"), "{}", job.all());
    assert!(job.stderr.contains("step 6: the checkpoint of step 4 is still being written"), "{}", job.all());
    // None skipped: every checkpoint due is written, and the last before the job ends.
    assert_eq!(steps_kept(&ck), vec![2, 4, 6]);
    assert_eq!(latest_step(&ck), Some(6));
    assert_eq!(summary(&job)["checkpoints_written"], 3);
    assert_eq!(temporaries(&ck), Vec::<String>::new());
    for step in [2, 4, 6] {
        ringrec::train::checkpoint::load(&step_dir(&ck, step)).expect("every checkpoint whole");
    }
}

#[test]
fn parts_and_flags_that_do_not_belong_together_are_refused_naming_the_flag() {
    let ck = tmpdir("mismatch");
    train(1, &[], &ck, &["--max-steps", "6", "--checkpoint-every", "3"]).assert_ok();
    // Flags that differ from the checkpoint's: each named with both values.
    for (flag, value, saved) in [("--dim", "8", "16"), ("--seed", "2", "1"), ("--sparse-optimizer", "adagrad", "sgd"), ("--lr", "0.01", "0.001"), ("--sparse-lr", "0.1", "0.05")] {
        let job = train(1, &[], &ck, &["--max-steps", "8", "--resume", flag, value]);
        assert_ne!(job.code, Some(0), "{flag}: {}", job.all());
        let want = format!("{flag}: the checkpoint was written with {saved}, this run has {value}");
        assert!(job.stderr.contains(&want), "{flag}: expected `{want}` in:\n{}", job.all());
    }
    // A table of another step under the newest checkpoint's name: not taken (the previous
    // checkpoint is used, with a warning naming the mismatch).
    std::fs::copy(step_dir(&ck, 3).join("table.rrt"), step_dir(&ck, 6).join("table.rrt")).unwrap();
    let job = train(1, &[], &ck, &["--max-steps", "6", "--resume"]);
    job.assert_ok();
    assert!(job.stderr.contains("it is not the table of this checkpoint"), "{}", job.all());
    assert!(job.stderr.contains("resuming from") && job.stderr.contains("(step 3)"), "{}", job.all());
    // A hand-edited learning rate in a manifest: its seal breaks; with every checkpoint
    // unusable, the resume stops and says why for each.
    for s in steps_kept(&ck) {
        let m = step_dir(&ck, s).join("manifest.json");
        let text = std::fs::read_to_string(&m).unwrap().replace("\"lr\": 0.001", "\"lr\": 0.002");
        std::fs::write(&m, text).unwrap();
    }
    let job = train(1, &[], &ck, &["--max-steps", "8", "--resume"]);
    assert_ne!(job.code, Some(0));
    assert!(job.stderr.contains("no usable checkpoint") && job.stderr.contains("checksum does not match"), "{}", job.all());
}

#[test]
fn a_nan_stops_every_rank_at_that_step_and_is_never_saved() {
    let ck = tmpdir("nan-stop");
    // Rank 1's gradients of step 5 (after 4 steps) are NaN; checkpoints every 2 steps.
    let job = train(2, &[("RINGREC_FAULT_NAN", "1:4")], &ck, &["--max-steps", "10", "--checkpoint-every", "2"]);
    assert_eq!(job.code, Some(1), "{}", job.all());
    assert!(!job.timed_out);
    assert!(job.stderr.contains("step 5:") && job.stderr.contains("not finite") && job.stderr.contains("--nan-policy"), "{}", job.all());
    assert_eq!(latest_step(&ck), Some(4), "the last checkpoint before the NaN stays the newest");
    assert_eq!(steps_kept(&ck), vec![2, 4]);
    // ... and it is clean: resuming from it works and finishes.
    let job = train(2, &[], &ck, &["--max-steps", "10", "--checkpoint-every", "2", "--resume"]);
    job.assert_ok();
    assert_eq!(summary(&job)["steps"], 6, "{}", job.all());

    // skip-step: the update of step 5 is skipped (dense and sparse halves), the run goes on.
    let ck = tmpdir("nan-skip");
    let job = train(2, &[("RINGREC_FAULT_NAN", "1:4")], &ck, &["--max-steps", "10", "--checkpoint-every", "2", "--nan-policy", "skip-step"]);
    job.assert_ok();
    let s = summary(&job);
    assert_eq!((s["nan_skips"]["dense"].as_u64(), s["nan_skips"]["sparse"].as_u64()), (Some(1), Some(1)), "{s}");
    assert!(job.stderr.contains("step 5:") && job.stderr.contains("skipped (--nan-policy skip-step)"), "{}", job.all());
    let last = ringrec::train::checkpoint::load(&step_dir(&ck, 10)).expect("finite checkpoint");
    assert!(last.dense.params.iter().all(|v| v.is_finite()));

    // The GPU code path (the kernels compiled for the host) runs the same check.
    let ck = tmpdir("nan-stop-host");
    let job = train(1, &[("RINGREC_FAULT_NAN", "0:3")], &ck, &["--max-steps", "6", "--device", "host"]);
    assert_eq!(job.code, Some(1), "{}", job.all());
    assert!(job.stderr.contains("step 4:") && job.stderr.contains("not finite"), "{}", job.all());
}

#[test]
fn the_change_gate_writes_only_checkpoints_that_moved_enough() {
    let ck = tmpdir("gate");
    // A threshold no 2-step interval reaches: only the last step is written.
    let job = train(1, &[], &ck, &["--max-steps", "8", "--checkpoint-every", "2", "--checkpoint-min-change", "10"]);
    job.assert_ok();
    let s = summary(&job);
    assert_eq!((s["checkpoints_written"].as_u64(), s["checkpoints_skipped"].as_u64()), (Some(1), Some(3)), "{s}");
    assert!(job.stderr.contains("less than --checkpoint-min-change 1000.000%: not written"), "{}", job.all());
    assert_eq!(steps_kept(&ck), vec![8]);
    // A threshold every interval passes: all written, each decision reported.
    let ck = tmpdir("gate-low");
    let job = train(1, &[], &ck, &["--max-steps", "8", "--checkpoint-every", "2", "--checkpoint-min-change", "1e-9", "--keep-checkpoints", "10"]);
    job.assert_ok();
    assert_eq!(summary(&job)["checkpoints_written"], 4);
    assert_eq!(job.stderr.matches("since the last checkpoint: written").count(), 3, "{}", job.all());
    assert_eq!(steps_kept(&ck), vec![2, 4, 6, 8]);
}

/// A seeded number in `0..n`.
fn pick(seed: u64, n: u64) -> u64 {
    ringrec::hash::splitmix64(seed ^ 0xC0FFEE) % n
}

#[test]
fn a_job_killed_at_twenty_random_moments_resumes_to_the_uninterrupted_result() {
    let shm = tmpdir("kills-shm");
    let dd = data_dir();
    let base = ["--max-steps", "1600", "--epochs", "200", "--checkpoint-every", "5"];
    let whole = tmpdir("kills-whole");
    let reference = train(2, &[("RINGREC_SHM_DIR", shm.to_str().unwrap())], &whole, &base);
    reference.assert_ok();
    let want = summary(&reference)["params_fnv"].clone();
    let ck = tmpdir("kills");
    let mut resumed_from = Vec::new();
    for kill in 0..20u64 {
        let mut args: Vec<&str> = train_args(&ck, &base);
        if latest_step(&ck).is_some() {
            args.push("--resume");
        }
        let _one = common::MPI_JOBS.lock().unwrap_or_else(|e| e.into_inner());
        let mut cmd = Command::new("mpirun");
        cmd.args(["--oversubscribe", "--allow-run-as-root", "-np", "2", "-x", "RINGREC_DATA_DIR", "-x", "RINGREC_SHM_DIR", "-x", "RINGREC_JOB_ID"]);
        cmd.env("RINGREC_DATA_DIR", &dd).env("RINGREC_SHM_DIR", &shm).env("RINGREC_JOB_ID", format!("ckkill{kill}-{}", std::process::id()));
        cmd.arg(env!("CARGO_BIN_EXE_ringrec")).args(&args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).process_group(0);
        let mut child = cmd.spawn().expect("mpirun");
        let t = Instant::now();
        // A random moment of checkpointed training, whatever the machine's speed: once the
        // run has written 1 to 8 checkpoints of its own (a fixed time would land in start-up
        // on a slow machine and after the last step on a fast one), then 0-30 ms later,
        // mid-step or mid-checkpoint.
        let goal = latest_step(&ck).unwrap_or(0) + 5 * (1 + pick(kill, 8));
        while t.elapsed() < Duration::from_secs(60) && child.try_wait().unwrap().is_none() && !matches!(latest_step(&ck), Some(s) if s >= goal) {
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(pick(kill ^ 0x5EED, 30)));
        // SAFETY: the job's own process group.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        let _ = child.wait();
        // Ranks mpirun moved out of its process group would outlive it and go on writing
        // checkpoints (a .tmp that a later run's sweep must leave alone while it is fresh):
        // a machine that loses a job loses all of its processes.
        kill_processes_with_env(&format!("RINGREC_JOB_ID=ckkill{kill}-{}", std::process::id()));
        resumed_from.push(latest_step(&ck));
    }
    eprintln!("checkpoint after each kill: {resumed_from:?}");
    let progressed = resumed_from.windows(2).filter(|w| w[1] > w[0]).count();
    assert!(progressed >= 12, "most kills must land in checkpointed training: {resumed_from:?}");
    // Time passes before the job is run again: what the kills left is older than the
    // sweep's 10 s guard (which protects a file another machine may still be writing).
    fn backdate(dir: &Path) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                backdate(&e.path());
            }
            let old = std::time::SystemTime::now() - Duration::from_secs(60);
            let _ = std::fs::File::open(e.path()).and_then(|f| f.set_modified(old));
        }
    }
    backdate(&ck);
    backdate(&shm);
    let mut args: Vec<&str> = base.to_vec();
    if latest_step(&ck).is_some() {
        args.push("--resume");
    }
    let last = train(2, &[("RINGREC_SHM_DIR", shm.to_str().unwrap())], &ck, &args);
    last.assert_ok();
    assert_eq!(summary(&last)["params_fnv"], want, "the chain of resumed runs must end bit-identical to the uninterrupted run");
    assert_eq!(temporaries(&ck), Vec::<String>::new(), "temporary files left in the checkpoint directory");
    let left: Vec<String> = std::fs::read_dir(&shm).unwrap().flatten().map(|e| e.file_name().to_string_lossy().to_string()).collect();
    assert_eq!(left, Vec::<String>::new(), "files left in the shared-memory directory");
}

#[test]
fn a_full_checkpoint_filesystem_keeps_the_previous_checkpoint() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let mnt = tmpdir("fullfs");
    let ok = Command::new("mount").args(["-t", "tmpfs", "-o", "size=8m", "tmpfs", mnt.to_str().unwrap()]).status().is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: could not mount a tmpfs at {}", mnt.display());
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Unmount(mnt.clone());
    let ck = mnt.join("ck");
    // One checkpoint is ~4.9 MB (a 65536-slot table, a small MLP): the first fits in 8 MB,
    // the second does not beside it.
    let job = train(1, &[], &ck, &["--max-steps", "8", "--checkpoint-every", "4"]);
    assert_ne!(job.code, Some(0), "{}", job.all());
    assert!(job.stderr.contains("a checkpoint needs") && job.stderr.contains("free there; the previous checkpoint is kept"), "{}", job.all());
    assert_eq!(steps_kept(&ck), vec![4]);
    assert_eq!(temporaries(&ck), Vec::<String>::new(), "no partial file");
    ringrec::train::checkpoint::load(&step_dir(&ck, 4)).expect("the previous checkpoint is whole");
}

/// Every file of a checkpoint, damaged 200 ways (seeded single-byte flips, truncations,
/// appends): `load` refuses it naming the file, or reads exactly what was written — never
/// a panic, never other values.
#[test]
fn damaged_checkpoint_files_are_refused_or_read_exactly() {
    use ringrec::embedding::{EmbeddingTable, TableConfig};
    use ringrec::model::{DenseOptimState, DenseOptimizer};
    use ringrec::train::checkpoint::{self, DenseState};
    let dir = tmpdir("flips");
    let tp = dir.join("live-table");
    let mut cfg = TableConfig::new(8, 1024);
    cfg.optimizer = ringrec::embedding::OptimizerKind::Adagrad;
    let mut table = EmbeddingTable::create(&tp, &cfg).unwrap();
    let keys: Vec<u64> = (0..500u64).map(|k| k * 7919 + 3).collect();
    let grads: Vec<f32> = (0..500 * 8).map(|i| ((i % 13) as f32 - 6.0) * 0.01).collect();
    table.apply_updates(&keys, &grads, 0.1).unwrap();
    // An MLP of 288 parameters: 39 (26 fields of dim 1 and 13 dense) x 7 + 7, then 7 x 1 + 1.
    let spec = ringrec::model::ModelSpec::mlp(26, 1, 13, vec![7]);
    let n = spec.num_params();
    let mut opt = DenseOptimState::new(DenseOptimizer::Adam, 0.001, n);
    opt.step = 9;
    opt.m.iter_mut().enumerate().for_each(|(i, v)| *v = i as f32 * 1e-4);
    opt.v.iter_mut().enumerate().for_each(|(i, v)| *v = i as f32 * 1e-6);
    let dense = DenseState { step: 9, epoch: 0, step_in_epoch: 9, opt, spec: Some(spec), params: (0..n).map(|i| (i as f32).sin()).collect() };
    let settings = [("--dim", "8".to_string())];
    let ck = checkpoint::write(&dir.join("ck"), &dense, &table, &settings, 2).unwrap();
    let good = checkpoint::load(&ck).unwrap();
    let mut want_rows = vec![0f32; keys.len() * 8];
    table.lookup(&keys, &mut want_rows).unwrap();
    assert_eq!(good.dense, dense);
    let (mut refused, mut exact) = (0, 0);
    for name in ["dense.bin", "manifest.json", "table.rrt"] {
        let p = ck.join(name);
        let original = std::fs::read(&p).unwrap();
        let len = original.len() as u64;
        let mut cases: Vec<Vec<u8>> = Vec::new();
        for i in 0..200u64 {
            let mut b = original.clone();
            let at = (ringrec::hash::splitmix64(i ^ len) % len) as usize;
            b[at] ^= 1 << (i % 8);
            cases.push(b);
        }
        for cut in [0, 1, 8, 16, len / 2, len - 1] {
            cases.push(original[..cut as usize].to_vec());
        }
        for extra in [1usize, 4, 4096] {
            let mut b = original.clone();
            b.extend(std::iter::repeat_n(0u8, extra));
            cases.push(b);
        }
        for b in cases {
            std::fs::write(&p, &b).unwrap();
            match checkpoint::load(&ck) {
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.contains(&ck.display().to_string()), "{name}: the error names no file: {msg}");
                    refused += 1;
                }
                Ok(l) => {
                    assert_eq!((l.dense == good.dense, l.manifest == good.manifest), (true, true), "{name}: a damaged file was read as other values");
                    let t = EmbeddingTable::open_readonly(&l.table()).unwrap();
                    assert_eq!(t.live_keys().len(), keys.len(), "{name}: other rows");
                    let mut got = vec![0f32; keys.len() * 8];
                    t.lookup(&keys, &mut got).unwrap();
                    assert!(got == want_rows && t.header().generation == table.header().generation, "{name}: a damaged table was read as other values");
                    exact += 1;
                }
            }
        }
        std::fs::write(&p, &original).unwrap();
    }
    eprintln!("checkpoint files damaged 627 ways: {refused} refused, {exact} read exactly, 0 wrong");
    assert_eq!(refused + exact, 3 * 209);
}
