//! The `ringrec` binary as a user runs it: alone (a world of one rank), under mpirun, and
//! the allreduce benchmark's table and JSON.

mod common;

use std::process::Command;
use std::time::Duration;

#[test]
fn without_mpirun_the_binary_is_a_world_of_one_rank() {
    let job = common::run_with_timeout(
        {
            let mut c = Command::new(env!("CARGO_BIN_EXE_ringrec"));
            c.arg("demo").env("RINGREC_JOB_ID", format!("cli-single-{}", std::process::id()));
            c
        },
        Duration::from_secs(120),
    );
    job.assert_ok();
    assert!(job.stdout.contains("ringrec demo: 1 rank(s) on 1 host(s)"), "{}", job.stdout);
    assert!(job.stdout.contains("rank 0/1 local_rank 0/1 cross_rank 0/1 host 0 of 1"), "{}", job.stdout);
    for b in ["mpi", "ring", "shm", "hier"] {
        assert!(job.stdout.contains(&format!("with {b:<4}: every element = 1 (expected 1) OK")), "{b}: {}", job.stdout);
    }
    assert!(common::shm_leftovers(&format!("cli-single-{}", std::process::id())).is_empty());
}

#[test]
fn demo_on_four_ranks_as_two_hosts_prints_topology_and_results() {
    let id = format!("cli-demo-{}", std::process::id());
    let job = common::mpirun(4, &[("RINGREC_RANKS_PER_HOST", "2"), ("RINGREC_JOB_ID", &id)], &["demo"]);
    job.assert_ok();
    for (r, l, h) in [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)] {
        let line = format!("rank {r}/4 local_rank {l}/2 cross_rank {h}/2 host {h} of 2");
        assert!(job.stdout.contains(&line), "missing `{line}`:\n{}", job.stdout);
    }
    assert!(job.stdout.contains("with hier: every element = 10 (expected 10) OK"), "{}", job.stdout);
    assert!(job.stdout.contains("with shm : skipped"), "{}", job.stdout);
    assert!(common::shm_leftovers(&id).is_empty(), "segments left: {:?}", common::shm_leftovers(&id));
}

#[test]
fn bench_allreduce_validates_every_row() {
    let job = common::mpirun(2, &[], &["bench", "allreduce", "-b", "8", "-e", "256K", "-n", "2", "-w", "1", "--json"]);
    job.assert_ok();
    let report: serde_json::Value = serde_json::from_str(&job.stdout).unwrap_or_else(|e| panic!("{e}: {}", job.stdout));
    assert_eq!(report["ranks"], 2);
    let rows = report["rows"].as_array().expect("rows");
    // 16 sizes (8 B .. 256 KiB) x 4 backends.
    assert_eq!(rows.len(), 16 * 4, "{}", job.stdout);
    for r in rows {
        assert_eq!(r["wrong"], 0, "{r}");
        let (size, time, algbw, busbw) = (r["size"].as_f64().unwrap(), r["time_us"].as_f64().unwrap(), r["algbw"].as_f64().unwrap(), r["busbw"].as_f64().unwrap());
        assert!(time > 0.0);
        assert!((algbw - size / time / 1e3).abs() <= 1e-9 * algbw.max(1.0), "{r}");
        assert!((busbw - algbw).abs() <= 1e-12, "with 2 ranks busbw = algbw * 2(n-1)/n = algbw: {r}");
    }
}

#[test]
fn bench_allreduce_prints_an_nccl_tests_table() {
    let job = common::mpirun(3, &[], &["bench", "allreduce", "--backends", "shm", "-b", "1K", "-e", "4K", "-d", "bf16", "-o", "avg", "-n", "2"]);
    job.assert_ok();
    assert!(job.stdout.contains("#       size        count     type  redop       time    algbw    busbw  #wrong"), "{}", job.stdout);
    let rows: Vec<&str> = job.stdout.lines().filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit())).collect();
    assert_eq!(rows.len(), 6, "3 sizes x (mpi + shm):\n{}", job.stdout);
    for r in rows {
        let cols: Vec<&str> = r.split_whitespace().collect();
        assert_eq!(cols[2], "bfloat16");
        assert_eq!(cols[3], "avg");
        assert_eq!(cols[7], "0", "#wrong: {r}");
    }
    assert!(job.stdout.contains("#wrong total: 0"));
}

#[test]
fn bad_flags_say_what_to_do() {
    let job = common::mpirun(1, &[], &["bench", "allreduce", "--backends", "nccl2", "-e", "1K"]);
    assert_ne!(job.code, Some(0));
    assert!(job.stderr.contains("unknown backend `nccl2`; choose from mpi, ring, shm, hier"), "{}", job.all());
}

#[test]
fn bench_allreduce_nccl_row_is_skipped_with_the_reason_without_a_gpu() {
    if ringrec::device::probe().is_ok() {
        eprintln!("skipped: this machine has a GPU; the NCCL rows are measured instead");
        return;
    }
    let job = common::mpirun(2, &[], &["bench", "allreduce", "--backend", "nccl", "-b", "1K", "-e", "4K", "-n", "2"]);
    job.assert_ok();
    assert!(job.stdout.contains("# backend nccl: skipped ("), "{}", job.all());
    assert!(job.stdout.contains("use --device cpu"), "the reason says what is missing: {}", job.all());
    // The reference rows are still measured and validated.
    assert!(job.stdout.contains("# backend: mpi") && job.stdout.contains("#wrong total: 0"), "{}", job.all());
}

#[test]
fn nccl_allreduce_is_exact_for_f32_f16_bf16_on_gpus() {
    let Some(devices) = common::gpus() else { return };
    // Sums of the pattern's small integers are exact in every type (averages are not:
    // NCCL may pre-multiply by 1/n), so every element is checked exactly.
    let np = devices.min(4);
    // The table names the types as nccl-tests does.
    for (dtype, printed) in [("f32", "float"), ("f16", "half"), ("bf16", "bfloat16")] {
        let job = common::mpirun(np, &[], &["bench", "allreduce", "--backend", "nccl", "-b", "8", "-e", "64M", "-f", "8", "-n", "3", "-w", "1", "-d", dtype, "-o", "sum"]);
        job.assert_ok();
        assert!(job.stdout.contains("# backend: nccl"), "{dtype}: {}", job.all());
        let rows = job.stdout.lines().filter(|l| l.split_whitespace().nth(2) == Some(printed)).count();
        assert_eq!(rows, 2 * 8, "{dtype}: mpi and nccl rows, 8 B to 16 MiB by 8x: {}", job.all());
        assert!(job.stdout.contains("#wrong total: 0"), "{dtype}: {}", job.all());
    }
}

#[test]
fn info_lists_every_cuda_library_with_where_it_was_found_or_looked_for() {
    let job = common::mpirun(1, &[], &["info"]);
    job.assert_ok();
    assert!(job.stdout.contains("rank 0/1 local_rank 0/1"), "{}", job.stdout);
    let build = if cfg!(feature = "cuda") { "this build has CUDA support" } else { "this build has NO CUDA support" };
    assert!(job.stdout.contains(&format!("CUDA libraries ({build}")), "{}", job.stdout);
    for lib in ["libcuda (the NVIDIA driver): ", "libnvrtc (the CUDA runtime compiler): ", "libcublas: ", "libnccl (NCCL): "] {
        let line = job.stdout.lines().find(|l| l.trim_start().starts_with(lib)).unwrap_or_else(|| panic!("no line for {lib}:\n{}", job.stdout));
        // Found: version and file; not found: the places, the names and what to install.
        assert!(line.contains(" at ") || (line.contains("not found: looked for") && line.contains("RINGREC_CUDA_LIB_DIR") && line.contains("install")), "{line}");
    }
    assert!(job.stdout.contains("\ncuda: "), "{}", job.stdout);
    // --libs starts no MPI; a bad architecture is named; compiling without NVRTC (or
    // without the feature) says what is missing.
    let run = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_ringrec")).arg("info").args(args).output().expect("run ringrec");
    let out = run(&["--libs"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("rank 0/1") && text.contains("CUDA libraries ("), "{text}");
    let out = run(&["--compile-kernels", "sm_80,ampere"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("`ampere` is not an architecture"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&["--libs", "--require", "nvrtc,gpu"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("`gpu` is not one of driver, nvrtc, cublas, nccl"));
    if ringrec::device::probe_nccl().is_err() {
        let out = run(&["--libs", "--require", "nccl"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && (err.contains("--require: libnccl (NCCL) is not available: looked for libnccl.so.2") || err.contains("without CUDA support")), "{err}");
    }
    if ringrec::device::probe_nvrtc().is_err() {
        let out = run(&["--compile-kernels", "sm_80"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && (err.contains("pip install nvidia-cuda-nvrtc-cu12") || err.contains("without CUDA support")), "{err}");
    }
}

#[test]
fn bench_step_with_the_gpu_cache_counts_what_the_staging_moves() {
    let dir = std::env::temp_dir().join(format!("ringrec-cli-step-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("zipf.tsv");
    let ringrec = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ringrec"));
        c.args(args).env("RINGREC_JOB_ID", format!("cli-step-{}", std::process::id()));
        let job = common::run_with_timeout(c, Duration::from_secs(300));
        job.assert_ok();
        job.stdout
    };
    ringrec(&["data", "synth", "--rows", "4000", "--vocab-scale", "300", "--zipf", "1.05", "--out", data.to_str().unwrap()]);
    let (batch, dim) = (512.0, 16.0);
    let out = ringrec(&[
        "bench", "step", "--data", data.to_str().unwrap(), "--data-dir", dir.to_str().unwrap(), "--batch", "512", "--gpu-cache-mib", "0,1", "--write-back",
        "--steps", "3", "--warmup", "1", "--cache-warmup", "4", "--gpu-cache-refresh", "2", "--table-capacity", "262144", "--json",
    ]);
    let report: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(report["table_keys"].as_u64().unwrap() > 10_000, "every row's keys are in the table: {report}");
    let rows = report["rows"].as_array().expect("rows");
    let f = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {r}"));
    // Cache off, write-through 1 MiB (16,384 slots of 16 f32), write-back 1 MiB.
    assert_eq!(rows.iter().map(|r| (r["gpu_cache_mib"].as_u64(), r["write_back"].as_bool(), r["cache_slots"].as_u64())).collect::<Vec<_>>(), [
        (Some(0), Some(false), Some(0)),
        (Some(1), Some(false), Some(16384)),
        (Some(1), Some(true), Some(16384))
    ]);
    let (off, through, back) = (&rows[0], &rows[1], &rows[2]);
    // The same rows: the same unique keys per step.
    let u = f(off, "unique_per_rank");
    assert!(u > 0.0 && u == f(through, "unique_per_rank") && u == f(back, "unique_per_rank"), "{rows:?}");
    // Without a cache: every unique key's row up, with the inverse map, dense features and
    // labels (26 + 13 + 1 values per sample; the device builds the per-key lists from the
    // inverse map); its key gradient down.
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    assert!(close(f(off, "uploaded_per_sample"), 4.0 * dim * u / batch + 4.0 * 40.0), "{off}");
    assert!(close(f(off, "downloaded_per_sample"), 4.0 * dim * u / batch), "{off}");
    assert_eq!((f(off, "hit_rate"), f(off, "update_uploaded_per_sample"), f(off, "of_cache_off")), (0.0, 0.0, 1.0));
    // Write-through: hits, the same key gradients down, refreshed rows up; in a world of one
    // rank no update list (the device takes the slots from the batch's sources it holds).
    assert!(f(through, "hit_rate") > 0.05, "{through}");
    assert!(close(f(through, "downloaded_per_sample"), f(off, "downloaded_per_sample")), "{through}");
    assert!(f(through, "update_uploaded_per_sample") == 0.0 && f(through, "rows_refreshed_per_step") > 0.0, "{through}");
    // Write-back (the trainer's path): no update list; every unique key's gradient down as
    // in write-through (the trainer checks them all finite on the host), and the rows leaving
    // at a refresh besides.
    assert_eq!(f(back, "update_uploaded_per_sample"), 0.0);
    assert!(f(back, "downloaded_per_sample") >= f(through, "downloaded_per_sample"), "{back}");
    std::fs::remove_dir_all(&dir).unwrap();
}
