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

use std::path::PathBuf;
use std::sync::OnceLock;

use common::CheckpointedRun as Run;
use ringrec::data::multihot::synth_multi_hot_cut;

/// Every column of the multi-hot set read as categorical (as tests/multihot.rs reads it).
const SPARSE: &str = "c0,c1,c2,c3,c4,c5,c6,c7,c8,c9,l0,l1,l2,l3,l4,l5";

/// The multi-hot set (3000 rows), written once, and the directory of its prepared cache.
fn data() -> &'static (PathBuf, PathBuf) {
    static DATA: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    DATA.get_or_init(|| {
        let d = common::shared_scratch("cache-multihot-data");
        let whole = d.join("whole.parquet");
        synth_multi_hot_cut(&whole, 3000, 7, None).unwrap();
        (whole, d.join("prepared"))
    })
}

/// 12 steps of 200 samples at dim 16, a checkpoint every 4 steps (each one kept) and an
/// evaluation every 5: the host table is read mid-run.
const RUN: [&str; 19] = [
    "--batch", "200", "--max-steps", "12", "--dim", "16", "--hidden", "16", "--threads", "1", "--json", "--no-progress", "--checkpoint-every", "4", "--keep-checkpoints", "5", "--eval-every", "5", "--device",
];

/// A cache of about 1500 slots (0.1 MiB at dim 16), its keys chosen every 3 steps: far
/// fewer slots than the ids a step sees (about 12,000), so keys enter and leave at every
/// refresh.
const CACHE: [&str; 4] = ["--gpu-cache-mib", "0.1", "--gpu-cache-refresh", "3"];

/// The three ways a run can go: no cache, write-through, write-back.
fn modes() -> [(&'static str, Vec<&'static str>); 3] {
    let with = |mode: &'static str| [&CACHE[..], &["--gpu-cache-mode", mode][..]].concat();
    [("off", vec!["--gpu-cache-mib", "0"]), ("through", with("write-through")), ("back", with("write-back"))]
}

/// `ringrec train` on the multi-hot set at `np` ranks on `device` with `extra` flags.
fn run(what: &str, np: usize, env: &[(&str, &str)], device: &str, extra: &[&str]) -> Run {
    let (whole, prepared) = data();
    let dir = common::scratch(&format!("cache-multihot-{what}"));
    let (w, p, d) = (whole.to_str().unwrap(), prepared.to_str().unwrap(), dir.to_str().unwrap());
    let args = [&["train", "--data", w, "--sparse-columns", SPARSE, "--data-dir", p, "--checkpoint-dir", d][..], &RUN[..], &[device][..], extra].concat();
    Run::of(&common::mpirun(np, env, &common::small_table(&args)), &dir)
}

/// Runs `extra` without a cache and with it in each of `modes` (and the last of those
/// under each of `seeds`' random delays) on `device`; asserts they all end as the run
/// without a cache did. Returns the last cached run.
fn compare(what: &str, np: usize, env: &[(&str, &str)], device: &str, extra: &[&str], modes: &[usize], seeds: &[&str]) -> Run {
    let all = self::modes();
    let off = run(&format!("{what}-off"), np, env, device, &[extra, &all[0].1[..]].concat());
    assert_eq!(off.summary["gpu_cache"]["slots"], 0, "{what}");
    let mut last = None;
    for m in modes {
        let (tag, cache) = &all[*m];
        let on = run(&format!("{what}-{tag}"), np, env, device, &[extra, &cache[..]].concat());
        let g = &on.summary["gpu_cache"];
        assert!(g["hit_rate"].as_f64().unwrap() > 0.05, "{what} {tag}: the cache found nothing: {g}");
        assert!(g["rows_refreshed"].as_u64().unwrap() > g["slots"].as_u64().unwrap(), "{what} {tag}: keys did not enter and leave: {g}");
        assert!(on.stderr.contains("GPU hot-row cache:"), "{what} {tag}: the run does not state its cache:\n{}", on.stderr);
        off.assert_same(&format!("{what}: {tag}"), &on);
        last = Some((tag, cache.clone(), on));
    }
    let (tag, cache, on) = last.expect("a cached mode");
    for seed in seeds {
        let delayed_env = [env, &[("RINGREC_HOST_DELAY_SEED", *seed)]].concat();
        let delayed = run(&format!("{what}-{tag}-seed{seed}"), np, &delayed_env, device, &[extra, &cache[..]].concat());
        assert!(delayed.summary["device"].as_str().unwrap().contains("random delays"), "{}", delayed.summary);
        off.assert_same(&format!("{what}: {tag}, delay seed {seed}"), &delayed);
        assert_eq!(delayed.summary["table_rows_crc_per_host"], on.summary["table_rows_crc_per_host"], "{what}: {tag}, delay seed {seed}: the table rows");
    }
    on
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
