//! The GPU hot-row cache with per-field tables (issues 30 and 33) under real mpirun on
//! `--device host` (the kernels of kernels/*.cu compiled for the CPU, queued like a GPU's
//! work): the generated multi-hot set with two `--table` tables of other dims than the
//! default one (8 and 24 beside 16; single-hot and list fields in each), trained with a
//! small cache per table — each table's keys chosen every 3 steps, its hits' rows gathered
//! from its slots on the device, its misses' rows uploaded — ends bit-identical to the run
//! without a cache: the dense parameters (`params_fnv`) and every checkpoint's table files
//! (`table.rrt` and each `table.NAME.rrt`), at one rank, two ranks on a host and two hosts
//! of one rank, Adagrad and SGD, under random queue delays. `gpu_*` runs the one-rank comparison on
//! `--device cuda` (skipped without a GPU).

mod common;
#[path = "common/cache_runs.rs"]
mod cache_runs;

use cache_runs::{CacheRuns, CACHE};

/// 12 steps of 200 samples (an mlp: the fields' widths differ), default dim 16, two
/// tables of dims 8 and 24, a checkpoint every 4 steps (each one kept) and an evaluation
/// every 5: the host tables are read mid-run.
const RUN: [&str; 25] = [
    "--batch", "200", "--max-steps", "12", "--dim", "16", "--hidden", "16", "--threads", "1", "--json", "--no-progress", "--checkpoint-every", "4", "--keep-checkpoints", "5", "--eval-every", "5",
    "--model", "mlp", "--table", "c3,c4,l0=items:dim=8:capacity=65536", "--table", "c1,l5=more:dim=24:capacity=65536", "--device",
];

/// The ways a run can go: no cache, write-through (0.1 MiB shared by the three tables).
fn runs() -> CacheRuns {
    CacheRuns { prefix: "cache-tables", flags: &RUN, modes: vec![("off", vec!["--gpu-cache-mib", "0"]), ("through", [&CACHE[..], &["--gpu-cache-mode", "write-through"][..]].concat())] }
}

fn compare(what: &str, np: usize, env: &[(&str, &str)], device: &str, extra: &[&str], modes: &[usize], seeds: &[&str]) -> common::CheckpointedRun {
    runs().compare(what, np, env, device, extra, modes, seeds)
}

#[test]
fn the_cache_over_tables_changes_no_bit_at_one_rank() {
    let on = compare("1-adagrad", 1, &[], "host", &["--sparse-optimizer", "adagrad"], &[1], &["1", "2"]);
    let names: Vec<&str> = on.tables.iter().map(|(n, _)| n.as_str()).collect();
    for f in ["/table.rrt", "/table.items.rrt", "/table.more.rrt"] {
        assert!(names.iter().filter(|n| n.ends_with(f)).count() >= 3, "{f} in every checkpoint: {names:?}");
    }
    compare("1-sgd-mean", 1, &[], "host", &["--sparse-optimizer", "sgd", "--multi-hot-pooling", "mean"], &[1], &[]);
}

#[test]
fn the_cache_over_tables_changes_no_bit_on_two_ranks_and_two_hosts() {
    // Two ranks on a host share its tables; each rank's caches apply the host's merged lists.
    compare("2-adagrad", 2, &[], "host", &["--sparse-optimizer", "adagrad"], &[1], &[]);
    // Hosts of one rank: every key is exchanged, each rank's caches apply the merged lists.
    let env = [("RINGREC_RANKS_PER_HOST", "1")];
    for opt in ["adagrad", "sgd"] {
        let on = compare(&format!("2h-{opt}"), 2, &env, "host", &["--sparse-optimizer", opt], &[1], &["3"]);
        let crcs = on.summary["table_rows_crc_per_host"].as_array().unwrap().clone();
        assert_eq!(crcs.len(), 2, "{}", on.summary);
        assert_eq!(crcs[0], crcs[1], "the hosts' tables differ: {}", on.summary);
    }
}

#[test]
fn write_back_over_tables_is_refused() {
    let dir = common::scratch("cache-tables-refused");
    let args = runs().args(&dir, "host", &[&["--gpu-cache-mode", "write-back"][..], &CACHE[..]].concat());
    let job = common::mpirun(1, &[], &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(job.code != Some(0) && job.stderr.contains("--table with --gpu-cache-mode write-back"), "{}", job.stderr);
}

#[test]
fn gpu_the_cache_over_tables_changes_no_bit_on_a_gpu() {
    if common::gpus().is_none() {
        println!("skipped: no GPU (the same comparison runs on --device host above)");
        return;
    }
    for opt in ["adagrad", "sgd"] {
        compare(&format!("gpu-{opt}"), 1, &[], "cuda", &["--sparse-optimizer", opt], &[1], &[]);
    }
}
