//! The GPU hot-row cache (issue 30) under real mpirun: on `--device host` (the kernels of
//! kernels/*.cu compiled for the CPU, queued like a GPU's work) a run with a small cache
//! (keys enter and leave every few steps) ends bit-identical to the run without one — the
//! dense parameters (`params_fnv`) and the table file — at 1, 2 and 4 ranks (4 as 2
//! simulated hosts), with Adagrad and SGD tables, and under random queue delays. The
//! combinations the cache does not support are refused naming the flags. `gpu_*` runs the
//! same comparison on `--device cuda` (skipped without a GPU).

mod common;

use std::path::{Path, PathBuf};

fn tmpdir(name: &str) -> PathBuf {
    common::scratch(&format!("gpu-cache-{name}"))
}

fn data_dir() -> PathBuf {
    common::shared_scratch("gpu-cache-data")
}

/// 12 steps of 240 samples at dim 16 (a few thousand distinct keys per step).
const RUN: [&str; 10] = ["train", "--synth-rows", "6000", "--batch", "240", "--max-steps", "12", "--no-progress", "--json", "--hidden"];

/// A cache of about 300 slots (0.02 MiB at dim 16), its keys chosen every 3 steps: far
/// fewer slots than keys, so keys enter and leave at every refresh.
const SMALL_CACHE: [&str; 4] = ["--gpu-cache-mib", "0.02", "--gpu-cache-refresh", "3"];

fn train(np: usize, env: &[(&str, &str)], args: &[&str]) -> common::Job {
    let dd = data_dir();
    let mut e = vec![("RINGREC_DATA_DIR", dd.to_str().expect("utf8"))];
    e.extend_from_slice(env);
    let mut a = RUN.to_vec();
    a.push("16");
    a.extend_from_slice(args);
    common::mpirun(np, &e, &common::small_table(&a))
}

fn summary(job: &common::Job) -> serde_json::Value {
    let line = job.stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON summary:\n{}", job.all()));
    serde_json::from_str(line).expect("summary JSON")
}

/// The table file of the run's last checkpoint in `dir`.
fn table_file(dir: &Path) -> Vec<u8> {
    let step = ringrec::train::checkpoint::latest_step(dir).unwrap_or_else(|| panic!("no checkpoint in {}", dir.display()));
    std::fs::read(ringrec::train::checkpoint::step_dir(dir, step).join("table.rrt")).expect("table file")
}

/// Runs with the cache off and on (and on under each of `seeds`' random delays) on
/// `device`; asserts every run ends with the same parameters and table file, and the cached
/// runs with the same table rows CRC. Returns the cached run's summary.
fn compare(what: &str, np: usize, env: &[(&str, &str)], device: &str, extra: &[&str], seeds: &[&str]) -> serde_json::Value {
    let run = |tag: &str, env: &[(&str, &str)], cache: &[&str]| {
        let dir = tmpdir(&format!("{what}-{tag}"));
        let args = [&["--device", device, "--checkpoint-dir", dir.to_str().expect("utf8")][..], extra, cache].concat();
        let job = train(np, env, &args);
        job.assert_ok();
        (summary(&job), table_file(&dir), job)
    };
    let (off, off_table, _) = run("off", env, &["--gpu-cache-mib", "0"]);
    let (on, on_table, job) = run("on", env, &SMALL_CACHE);
    let g = &on["gpu_cache"];
    assert!(g["slots"].as_u64().unwrap() > 100 && g["slots"].as_u64().unwrap() < 1000, "{what}: {g}");
    assert!(g["hit_rate"].as_f64().unwrap() > 0.05, "{what}: the cache found nothing: {g}");
    assert!(g["rows_refreshed"].as_u64().unwrap() > g["slots"].as_u64().unwrap(), "{what}: keys did not enter and leave: {g}");
    assert!(job.stderr.contains("GPU hot-row cache:"), "{what}: the run does not state its cache:\n{}", job.stderr);
    assert_eq!(off["gpu_cache"]["slots"], 0, "{what}");
    assert_eq!(on["params_fnv"], off["params_fnv"], "{what}: the cache changed the dense parameters");
    assert!(on_table == off_table, "{what}: the cache changed the table file");
    let crc = on["table_rows_crc_per_host"].clone();
    for seed in seeds {
        let delayed_env = [env, &[("RINGREC_HOST_DELAY_SEED", *seed)]].concat();
        let (delayed, table, _) = run(&format!("seed{seed}"), &delayed_env, &SMALL_CACHE);
        assert!(delayed["device"].as_str().unwrap().contains("random delays"), "{delayed}");
        assert_eq!(delayed["params_fnv"], off["params_fnv"], "{what}: delay seed {seed} changed the parameters");
        assert_eq!(delayed["table_rows_crc_per_host"], crc, "{what}: delay seed {seed} changed the table rows");
        assert!(table == off_table, "{what}: delay seed {seed} changed the table file");
    }
    on
}

#[test]
fn the_cache_changes_no_bit_at_one_rank() {
    for opt in ["adagrad", "sgd"] {
        compare(&format!("1-{opt}"), 1, &[], "host", &["--sparse-optimizer", opt], &["1", "2"]);
    }
}

#[test]
fn the_cache_changes_no_bit_at_two_ranks() {
    for opt in ["adagrad", "sgd"] {
        compare(&format!("2-{opt}"), 2, &[], "host", &["--sparse-optimizer", opt], &["3"]);
    }
}

#[test]
fn the_cache_changes_no_bit_at_four_ranks_on_two_hosts() {
    let env = [("RINGREC_RANKS_PER_HOST", "2")];
    for opt in ["adagrad", "sgd"] {
        let on = compare(&format!("4-{opt}"), 4, &env, "host", &["--sparse-optimizer", opt], &["4", "5"]);
        let crcs = on["table_rows_crc_per_host"].as_array().unwrap().clone();
        assert_eq!(crcs.len(), 2, "{on}");
        assert_eq!(crcs[0], crcs[1], "the hosts' tables differ: {on}");
    }
}

#[test]
fn the_cache_applies_what_the_leader_applied_with_other_exchanges() {
    // The flat exchange (every rank holds the merged list), 1-bit rows across hosts (the
    // leader applies the decoded list: the cache the same), weighted normalisation (the
    // list's rows end in a weight the cache strips as the leader does).
    let env = [("RINGREC_RANKS_PER_HOST", "2")];
    compare("flat", 4, &env, "host", &["--sparse-exchange", "flat"], &[]);
    compare("onebit", 4, &env, "host", &["--sparse-compression", "1bit"], &[]);
    compare("weighted", 4, &env, "host", &["--sparse-normalize", "weighted"], &[]);
}

#[test]
fn the_cache_survives_admission_growth_and_eviction() {
    // --admit-after: only keys with a row are cached; a small table grows (rows move slots,
    // the cache is keyed by key) and then evicts at --table-max-bytes (the cache empties and
    // fills again at the next refresh).
    compare("admit", 2, &[], "host", &["--admit-after", "2"], &[]);
    let on = compare("evict", 2, &[], "host", &["--table-capacity", "1024", "--table-max-bytes", "600K"], &[]);
    assert!(on["table_growths"].as_u64().unwrap() > 0 && on["table_evictions"].as_u64().unwrap() > 0, "the table neither grew nor evicted: {on}");
}

#[test]
fn unsupported_combinations_are_refused_naming_the_flags() {
    for (args, says) in [
        (&["--device", "cpu", "--gpu-cache-mib", "1"][..], "--device cpu"),
        (&["--device", "host", "--gpu-cache-mib", "1", "--table-dtype", "f16"][..], "--table-dtype"),
        (&["--device", "host", "--gpu-cache-mib", "1", "--table-dtype", "bf16"][..], "--table-dtype"),
        (&["--device", "host", "--gpu-cache-mib", "1", "--sync-every", "2", "--sparse-optimizer", "sgd"][..], "--sync-every"),
        (&["--device", "host", "--gpu-cache-refresh", "0"][..], "--gpu-cache-refresh"),
        (&["--device", "host", "--gpu-cache-mib=-1"][..], "MiB of GPU memory"),
    ] {
        let job = train(1, &[], args);
        assert!(job.code != Some(0), "{args:?} was accepted:\n{}", job.all());
        let all = job.all();
        assert!(all.contains("--gpu-cache-mib") && all.contains(says), "{args:?}: the refusal does not name --gpu-cache-mib and {says}:\n{all}");
    }
}

#[test]
fn gpu_the_cache_changes_no_bit_on_a_gpu() {
    let Some(gpus) = common::gpus() else {
        println!("skipped: no GPU (the same comparison runs on --device host above)");
        return;
    };
    compare("gpu-1", 1, &[], "cuda", &[], &[]);
    if gpus >= 2 {
        compare("gpu-2", 2, &[], "cuda", &["--sparse-optimizer", "sgd"], &[]);
    }
}
