//! The GPU hot-row cache in write-back (`--gpu-cache-mode write-back`, issue 30 point 2)
//! under real mpirun on `--device host` (the kernels of kernels/*.cu compiled for the CPU,
//! queued like a GPU's work): the cached rows are updated on the device only and written
//! back into the host table before anything reads it, and a run ends bit-identical to the
//! run without a cache and to write-through — the dense parameters (`params_fnv`), every
//! checkpoint's table file (rows, accumulators, usage, header) and the table rows' CRC —
//! at one rank and on hosts of one rank (2 and 4), Adagrad and SGD tables, a refresh every
//! 3 steps, checkpoints and evaluations mid-run, admission, growth, eviction, expiry, a
//! skipped NaN step, a resume, and random queue delays. A skipped write-back
//! (`RINGREC_HOST_FAULT=no-write-back-wait`) is caught; several ranks on a host are refused.
//! `gpu_*` runs the one-rank comparison on `--device cuda` (skipped without a GPU).

mod common;

use std::path::PathBuf;

use common::CheckpointedRun as Run;

fn data_dir() -> PathBuf {
    common::shared_scratch("write-back-data")
}

/// 12 steps of 240 samples at dim 16 (a few thousand distinct keys per step), a checkpoint
/// every 4 steps (each one kept) and an evaluation every 5: the host table is read mid-run.
const RUN: [&str; 16] = [
    "train", "--synth-rows", "6000", "--batch", "240", "--no-progress", "--json", "--hidden", "16", "--checkpoint-every", "4", "--keep-checkpoints", "5", "--eval-every", "5", "--test-fraction",
];

/// A cache of about 300 slots (0.02 MiB at dim 16), its keys chosen every 3 steps: keys
/// enter and leave at every refresh, so rows are written back at every one.
const CACHE: [&str; 4] = ["--gpu-cache-mib", "0.02", "--gpu-cache-refresh", "3"];

/// The three ways a run can go: no cache, write-through, write-back.
fn modes() -> [(&'static str, Vec<&'static str>); 3] {
    let with = |mode: &'static str| [&CACHE[..], &["--gpu-cache-mode", mode][..]].concat();
    [("off", vec!["--gpu-cache-mib", "0"]), ("through", with("write-through")), ("back", with("write-back"))]
}

fn train(np: usize, env: &[(&str, &str)], args: &[&str]) -> common::Job {
    let dd = data_dir();
    let mut e = vec![("RINGREC_DATA_DIR", dd.to_str().expect("utf8"))];
    e.extend_from_slice(env);
    let mut a = RUN.to_vec();
    a.push("0.1");
    if !args.contains(&"--device") {
        a.extend_from_slice(&["--device", "host"]);
    }
    a.extend_from_slice(args);
    common::mpirun(np, &e, &common::small_table(&a))
}

/// One run: its summary and its checkpoints' tables.
fn run(what: &str, np: usize, env: &[(&str, &str)], args: &[&str]) -> Run {
    let dir = common::scratch(&format!("write-back-{what}"));
    let args = [&["--checkpoint-dir", dir.to_str().expect("utf8")][..], args].concat();
    Run::of(&train(np, env, &args), &dir)
}

/// Runs `extra` with no cache, write-through and write-back (and write-back under each of
/// `seeds`' random delays); asserts they all end the same. Returns the write-back run.
fn compare(what: &str, np: usize, env: &[(&str, &str)], extra: &[&str], seeds: &[&str]) -> Run {
    let [off, through, back] = modes().map(|(tag, cache)| run(&format!("{what}-{tag}"), np, env, &[extra, &cache[..]].concat()));
    let g = &back.summary["gpu_cache"];
    assert_eq!(g["mode"], "write-back", "{what}: {g}");
    assert!(g["hit_rate"].as_f64().unwrap() > 0.05, "{what}: the cache found nothing: {g}");
    assert!(g["rows_refreshed"].as_u64().unwrap() > g["slots"].as_u64().unwrap(), "{what}: keys did not enter and leave: {g}");
    assert!(back.stderr.contains("write-back (--gpu-cache-mib"), "{what}: the run does not state its cache mode:\n{}", back.stderr);
    off.assert_same(&format!("{what}: write-through"), &through);
    off.assert_same(&format!("{what}: write-back"), &back);
    assert_eq!(back.summary["table_rows_crc_per_host"], through.summary["table_rows_crc_per_host"], "{what}");
    for seed in seeds {
        let delayed_env = [env, &[("RINGREC_HOST_DELAY_SEED", *seed)]].concat();
        let delayed = run(&format!("{what}-seed{seed}"), np, &delayed_env, &[extra, &modes()[2].1[..]].concat());
        assert!(delayed.summary["device"].as_str().unwrap().contains("random delays"), "{}", delayed.summary);
        off.assert_same(&format!("{what}: write-back, delay seed {seed}"), &delayed);
    }
    back
}

#[test]
fn write_back_changes_no_bit_at_one_rank() {
    for opt in ["adagrad", "sgd"] {
        compare(&format!("1-{opt}"), 1, &[], &["--max-steps", "12", "--sparse-optimizer", opt], &["1", "2"]);
    }
}

#[test]
fn write_back_changes_no_bit_on_hosts_of_one_rank() {
    // Every key is exchanged; each host's leader holds the merged keys its rank caches.
    let env = [("RINGREC_RANKS_PER_HOST", "1")];
    for opt in ["adagrad", "sgd"] {
        let back = compare(&format!("2-{opt}"), 2, &env, &["--max-steps", "12", "--sparse-optimizer", opt], &["3"]);
        let crcs = back.summary["table_rows_crc_per_host"].as_array().unwrap().clone();
        assert_eq!(crcs.len(), 2, "{}", back.summary);
        assert_eq!(crcs[0], crcs[1], "the hosts' tables differ after the write-back: {}", back.summary);
    }
    // At 4 ranks the engine's cycle may fuse a step's layers differently from run to run;
    // fusion never changes a sum's bits (tests/fusion_order.rs), so the modes still agree.
    let back = compare("4-sgd", 4, &env, &["--max-steps", "12", "--sparse-optimizer", "sgd"], &[]);
    assert_eq!(back.summary["hosts"], 4, "{}", back.summary);
}

#[test]
fn write_back_keeps_admission_growth_eviction_and_expiry_exact() {
    // The held rows go through the leader's update as every other: placed, spared by
    // eviction, their usage recorded (so LRU and expiry choose the same rows); a removal
    // writes every cached row back before the cache empties.
    compare("admit", 1, &[], &["--max-steps", "12", "--admit-after", "2"], &[]);
    let back = compare("evict", 1, &[], &["--max-steps", "12", "--table-capacity", "1024", "--table-max-bytes", "600K"], &[]);
    assert!(back.summary["table_growths"].as_u64().unwrap() > 0 && back.summary["table_evictions"].as_u64().unwrap() > 0, "the table neither grew nor evicted: {}", back.summary);
    let back = compare("expire", 1, &[], &["--max-steps", "12", "--expire-after-steps", "2"], &[]);
    assert!(back.summary["table_expirations"].as_u64().unwrap() > 0, "nothing expired: {}", back.summary);
}

#[test]
fn a_skipped_nan_step_and_a_resume_stay_exact() {
    // Step 4's gradients NaN, skipped: the write-back step goes the write-through way.
    let nan = [("RINGREC_FAULT_NAN", "0:3")];
    compare("nan", 1, &nan, &["--max-steps", "12", "--nan-policy", "skip-step"], &[]);
    // 6 steps, then a resume to 12, equals 12 uninterrupted steps without a cache.
    let dir = common::scratch("write-back-resume");
    let ck = ["--checkpoint-dir", dir.to_str().expect("utf8")];
    let back = &modes()[2].1;
    train(1, &[], &[&ck[..], &["--max-steps", "6"], &back[..]].concat()).assert_ok();
    let resumed = train(1, &[], &[&ck[..], &["--max-steps", "12", "--resume"], &back[..]].concat());
    resumed.assert_ok();
    let off = run("resume-off", 1, &[], &["--max-steps", "12", "--gpu-cache-mib", "0"]);
    assert_eq!(resumed.summary()["params_fnv"], off.summary["params_fnv"], "the resumed write-back run differs from the uninterrupted one");
    let last = common::checkpoint_tables(&dir).pop().expect("a checkpoint");
    assert!(&last == off.tables.last().unwrap(), "the resumed write-back run's table differs");
}

#[test]
fn a_skipped_write_back_is_caught() {
    // The readers of the host table (refreshes, checkpoints, evaluations) no longer wait
    // for the write-back: the run must end differently, or the comparisons prove nothing.
    let fault = [("RINGREC_HOST_FAULT", "no-write-back-wait")];
    let args = [&["--max-steps", "12"][..], &modes()[2].1[..]].concat();
    let broken = run("fault", 1, &fault, &args);
    let off = run("fault-off", 1, &[], &["--max-steps", "12", "--gpu-cache-mib", "0"]);
    let differs = broken.summary["params_fnv"] != off.summary["params_fnv"] || broken.tables.last() != off.tables.last();
    assert!(differs, "the skipped write-back went unnoticed");
}

#[test]
fn write_back_is_refused_with_several_ranks_on_a_host() {
    let job = train(2, &[], &[&["--max-steps", "2"][..], &modes()[2].1[..]].concat());
    assert!(job.code != Some(0), "write-back at 2 ranks on one host was accepted:\n{}", job.all());
    let all = job.all();
    assert!(all.contains("--gpu-cache-mode write-back") && all.contains("write-through"), "the refusal does not name the flag and what to do:\n{all}");
    let job = train(1, &[], &["--max-steps", "2", "--gpu-cache-mib", "1", "--gpu-cache-mode", "lazy"]);
    assert!(job.code != Some(0) && job.all().contains("--gpu-cache-mode"), "a bad mode was accepted:\n{}", job.all());
}

#[test]
fn gpu_write_back_changes_no_bit_on_a_gpu() {
    if common::gpus().is_none() {
        println!("skipped: no GPU (the same comparison runs on --device host above)");
        return;
    }
    for opt in ["adagrad", "sgd"] {
        compare(&format!("gpu-{opt}"), 1, &[], &["--max-steps", "12", "--device", "cuda", "--sparse-optimizer", opt], &[]);
    }
}
