//! The GPU hot-row cache with multi-hot fields (issues 30 and 33) under real mpirun on
//! `--device host` (the kernels of kernels/*.cu compiled for the CPU, queued like a GPU's
//! work): the generated multi-hot set (10 single-hot fields, 6 lists of mean length 20)
//! trained with a small cache — its keys chosen every 3 steps among single-hot and list ids
//! alike, each bag id's row pooled from its cache slot or its staged miss — ends
//! bit-identical to the run without a cache: the dense parameters (`params_fnv`) and every
//! checkpoint's table file, in write-through and write-back, at one rank, two ranks on a
//! host (write-through) and two hosts of one rank, Adagrad and SGD, sum and mean pooling,
//! under random queue delays. A skipped write-back (`RINGREC_HOST_FAULT=no-write-back-wait`)
//! is caught. `gpu_*` runs the one-rank comparison on `--device cuda` (skipped without a GPU).

mod common;
#[path = "common/cache_runs.rs"]
mod cache_runs;

use cache_runs::{CacheRuns, CACHE};

/// 12 steps of 200 samples at dim 16, a checkpoint every 4 steps (each one kept) and an
/// evaluation every 5: the host table is read mid-run.
const RUN: [&str; 19] = [
    "--batch", "200", "--max-steps", "12", "--dim", "16", "--hidden", "16", "--threads", "1", "--json", "--no-progress", "--checkpoint-every", "4", "--keep-checkpoints", "5", "--eval-every", "5", "--device",
];

/// The three ways a run can go: no cache, write-through, write-back.
fn runs() -> CacheRuns {
    let with = |mode: &'static str| [&CACHE[..], &["--gpu-cache-mode", mode][..]].concat();
    CacheRuns { prefix: "cache-multihot", flags: &RUN, modes: vec![("off", vec!["--gpu-cache-mib", "0"]), ("through", with("write-through")), ("back", with("write-back"))] }
}

fn compare(what: &str, np: usize, env: &[(&str, &str)], device: &str, extra: &[&str], modes: &[usize], seeds: &[&str]) -> common::CheckpointedRun {
    runs().compare(what, np, env, device, extra, modes, seeds)
}

fn run(what: &str, np: usize, env: &[(&str, &str)], device: &str, extra: &[&str]) -> common::CheckpointedRun {
    runs().run(what, np, env, device, extra)
}

fn modes() -> Vec<(&'static str, Vec<&'static str>)> {
    runs().modes
}

#[test]
fn the_cache_with_lists_changes_no_bit_at_one_rank() {
    compare("1-adagrad", 1, &[], "host", &["--sparse-optimizer", "adagrad"], &[1, 2], &["1"]);
    compare("1-sgd-mean", 1, &[], "host", &["--sparse-optimizer", "sgd", "--multi-hot-pooling", "mean"], &[1, 2], &[]);
}

#[test]
fn the_cache_with_lists_changes_no_bit_on_two_ranks_and_two_hosts() {
    // Two ranks on a host share its table (write-through only: write-back is refused there).
    compare("2-adagrad", 2, &[], "host", &["--sparse-optimizer", "adagrad"], &[1], &[]);
    // Hosts of one rank: every key is exchanged, each leader holds the merged keys its rank caches.
    let env = [("RINGREC_RANKS_PER_HOST", "1")];
    for opt in ["adagrad", "sgd"] {
        let back = compare(&format!("2h-{opt}"), 2, &env, "host", &["--sparse-optimizer", opt], &[1, 2], &["2"]);
        let crcs = back.summary["table_rows_crc_per_host"].as_array().unwrap().clone();
        assert_eq!(crcs.len(), 2, "{}", back.summary);
        assert_eq!(crcs[0], crcs[1], "the hosts' tables differ after the write-back: {}", back.summary);
    }
}

#[test]
fn a_skipped_write_back_with_lists_is_caught() {
    // The readers of the host table (refreshes, checkpoints, evaluations) no longer wait
    // for the write-back of the rows the lists' ids updated on the device.
    let fault = [("RINGREC_HOST_FAULT", "no-write-back-wait")];
    let broken = run("fault", 1, &fault, "host", &modes()[2].1);
    let off = run("fault-off", 1, &[], "host", &modes()[0].1);
    let differs = broken.summary["params_fnv"] != off.summary["params_fnv"] || broken.tables.last() != off.tables.last();
    assert!(differs, "the skipped write-back went unnoticed");
}

#[test]
fn gpu_the_cache_with_lists_changes_no_bit_on_a_gpu() {
    if common::gpus().is_none() {
        println!("skipped: no GPU (the same comparison runs on --device host above)");
        return;
    }
    for opt in ["adagrad", "sgd"] {
        compare(&format!("gpu-{opt}"), 1, &[], "cuda", &["--sparse-optimizer", opt], &[1, 2], &[]);
    }
}
