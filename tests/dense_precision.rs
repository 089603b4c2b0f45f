//! `ringrec train --dense-precision bf16` end to end under real mpirun, on the default data
//! and model: the replicas agree bit for bit, the test AUC is within 0.002 of the f32 run's,
//! and the checkpoint holds f32 master weights and Adam moments. Without AVX-512 BF16 the
//! run is refused at start, naming the CPU feature.
//!
//! The runs stop after [`STEPS`] steps: the bf16 kernel's intrinsics are not inlined in a
//! debug build (opt-level 0), where it runs about 100x slower than in a release build, and
//! the whole epoch (176 steps) would take many minutes. The full epoch's figures are
//! scripts/bench/bf16.sh's (docs/BENCHMARKS.md).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

fn tmpdir(name: &str) -> PathBuf {
    common::scratch(name)
}

/// Steps of each run.
const STEPS: &str = "40";

/// The default run (default data, model and optimizers) of `np` ranks at `precision`,
/// [`STEPS`] steps, checkpointing into `dir`.
fn train(np: usize, precision: &str, dir: &Path) -> common::Job {
    // As default_runs_keep_their_params_fnv: 1 rank on both cores, 2 ranks on one each.
    let threads = if np == 1 { "2" } else { "1" };
    let args = ["train", "--json", "--no-progress", "--threads", threads, "--max-steps", STEPS, "--dense-precision", precision, "--checkpoint-dir", dir.to_str().expect("utf8")];
    common::mpirun_exe(Path::new(env!("CARGO_BIN_EXE_ringrec")), np, &[], &common::small_table(&args), Duration::from_secs(900))
}

fn summary(job: &common::Job) -> Value {
    job.assert_ok();
    let line = job.stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON summary:\n{}", job.all()));
    serde_json::from_str(line).expect("summary JSON")
}

#[test]
fn bf16_training_agrees_across_ranks_and_stays_within_0_002_auc_of_f32() {
    if !ringrec::device::bgemm::available() {
        let job = train(1, "bf16", &tmpdir("refused"));
        assert_ne!(job.code, Some(0));
        assert!(job.stderr.contains("--dense-precision bf16 needs AVX-512 BF16 (avx512_bf16), which this CPU lacks; use f32"), "{}", job.all());
        eprintln!("skipped the bf16 runs: this CPU lacks AVX-512 BF16");
        return;
    }
    for np in [1, 2] {
        let f32_run = summary(&train(np, "f32", &tmpdir(&format!("f32-{np}"))));
        let dir = tmpdir(&format!("bf16-{np}"));
        let bf16_run = summary(&train(np, "bf16", &dir));
        let fnvs = bf16_run["params_fnv_per_rank"].as_array().expect("params_fnv_per_rank");
        assert_eq!(fnvs.len(), np);
        assert!(fnvs.iter().all(|f| *f == bf16_run["params_fnv"]), "{np} ranks: the replicas differ: {fnvs:?}");
        assert_ne!(bf16_run["params_fnv"], f32_run["params_fnv"], "{np} ranks: bf16 trained exactly as f32");
        let (a32, a16) = (f32_run["test_auc"].as_f64().expect("f32 AUC"), bf16_run["test_auc"].as_f64().expect("bf16 AUC"));
        assert!((a16 - a32).abs() <= 0.002, "{np} ranks: test AUC bf16 {a16} vs f32 {a32}");
        // The checkpoint's masters and moments are f32: values bf16 cannot hold.
        let step = ringrec::train::checkpoint::latest_step(&dir).expect("a checkpoint");
        let dense = ringrec::model::dense_bin::read(&ringrec::train::checkpoint::step_dir(&dir, step).join("dense.bin")).expect("dense.bin");
        let not_bf16 = |v: &[f32]| v.iter().filter(|x| half::bf16::from_f32(**x).to_f32() != **x).count();
        assert!(not_bf16(&dense.params) > dense.params.len() / 2, "{np} ranks: the checkpoint's parameters look rounded to bf16");
        assert_eq!(dense.moments.len(), 2, "Adam's two moments");
        for m in &dense.moments {
            assert_eq!(m.len(), dense.params.len());
            assert!(not_bf16(m) > m.len() / 2, "{np} ranks: a moment looks rounded to bf16");
        }
    }
}
