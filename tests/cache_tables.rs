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
        let d = common::shared_scratch("cache-tables-data");
        let whole = d.join("whole.parquet");
        synth_multi_hot_cut(&whole, 3000, 7, None).unwrap();
        (whole, d.join("prepared"))
    })
}

/// 12 steps of 200 samples (an mlp: the fields' widths differ), default dim 16, two
/// tables of dims 8 and 24, a checkpoint every 4 steps (each one kept) and an evaluation
/// every 5: the host tables are read mid-run.
const RUN: [&str; 25] = [
    "--batch", "200", "--max-steps", "12", "--dim", "16", "--hidden", "16", "--threads", "1", "--json", "--no-progress", "--checkpoint-every", "4", "--keep-checkpoints", "5", "--eval-every", "5",
    "--model", "mlp", "--table", "c3,c4,l0=items:dim=8:capacity=65536", "--table", "c1,l5=more:dim=24:capacity=65536", "--device",
];

/// Caches of about 2300 slots in all (0.1 MiB shared by the three tables), their keys
/// chosen every 3 steps: far fewer slots than the ids a step sees, so keys enter and leave
/// at every refresh.
const CACHE: [&str; 4] = ["--gpu-cache-mib", "0.1", "--gpu-cache-refresh", "3"];

/// The ways a run can go: no cache, write-through.
fn modes() -> [(&'static str, Vec<&'static str>); 2] {
    [("off", vec!["--gpu-cache-mib", "0"]), ("through", [&CACHE[..], &["--gpu-cache-mode", "write-through"][..]].concat())]
}

/// `ringrec train` on the multi-hot set at `np` ranks on `device` with `extra` flags.
fn run(what: &str, np: usize, env: &[(&str, &str)], device: &str, extra: &[&str]) -> Run {
    let (whole, prepared) = data();
    let dir = common::scratch(&format!("cache-tables-{what}"));
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
    let (whole, prepared) = data();
    let dir = common::scratch("cache-tables-refused");
    let (w, p, d) = (whole.to_str().unwrap(), prepared.to_str().unwrap(), dir.to_str().unwrap());
    let args = [&["train", "--data", w, "--sparse-columns", SPARSE, "--data-dir", p, "--checkpoint-dir", d][..], &RUN[..], &["host", "--gpu-cache-mode", "write-back"][..], &CACHE[..]].concat();
    let job = common::mpirun(1, &[], &common::small_table(&args));
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
