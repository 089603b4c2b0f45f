//! The `ringrec` Python module (python/, issue 32) under real mpirun: Horovod's API at 1, 2
//! and 4 ranks (4 as 2 simulated hosts) against numpy (tests/python/api.py), the torch
//! `DistributedOptimizer` against torch DDP over gloo (tests/python/ddp.py), and a rank that
//! raises ending the job with its traceback (tests/python/raises.py); `HostEmbedding` against
//! DDP + `nn.Embedding(sparse=True)` at 1, 2 and 4 ranks on 2 hosts (tests/python/hostemb.py),
//! two `HostEmbedding`s of different dims in one model against DDP with two, saved and
//! restored (tests/python/tables.py), and examples/python/dlrm.py for a few steps; the CUDA
//! tensor path through DLPack on the CPU (tests/python/device.py, the test hook
//! `RINGREC_PY_DEVICE=host`; made at the first device tensor, empty tensors, and ranks that
//! mix device and host tensors); several `HostEmbedding`s sharing the free shared memory
//! (tests/python/shares.py).
//!
//! Needs the module's venv and this checkout's extension (scripts/python-venv.sh: numpy,
//! torch, maturin; the extension in `<target>/python-site`), named by
//! `RINGREC_TEST_PYTHON_MODULE`; skipped without it, a failure in CI.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

fn script(name: &str) -> String {
    match name {
        "dlrm.py" => format!("{}/examples/python/{name}", env!("CARGO_MANIFEST_DIR")),
        _ => format!("{}/tests/python/{name}", env!("CARGO_MANIFEST_DIR")),
    }
}

/// The venv's python and the site directory holding the extension, or None (printed as
/// `skipped: ...`; in CI, a failure).
fn module_python(modules: &str) -> Option<(String, PathBuf)> {
    let site = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("target dir").join("python-site");
    let why = match std::env::var("RINGREC_TEST_PYTHON_MODULE") {
        Err(_) => "RINGREC_TEST_PYTHON_MODULE is not set (scripts/python-venv.sh makes the venv and builds the extension)".to_string(),
        Ok(py) => {
            let ok = std::process::Command::new(&py).env("PYTHONPATH", &site).args(["-c", &format!("import ringrec, {modules}")]).output();
            match ok {
                Ok(o) if o.status.success() => return Some((py, site)),
                Ok(o) => format!("{py} with PYTHONPATH={} cannot import ringrec, {modules}: {}", site.display(), String::from_utf8_lossy(&o.stderr).trim()),
                Err(e) => format!("cannot run {py}: {e}"),
            }
        }
    };
    assert!(std::env::var("CI").as_deref() != Ok("true"), "CI=true: the Python module's venv is required: {why}");
    eprintln!("skipped: {why}");
    None
}

/// `python script` under mpirun with `np` ranks and `env`.
fn run(np: usize, name: &str, env: &[(&str, &str)], timeout: Duration) -> Option<common::Job> {
    run_args(np, name, env, &[], timeout)
}

/// [`run`] with arguments after the script.
fn run_args(np: usize, name: &str, env: &[(&str, &str)], args: &[&str], timeout: Duration) -> Option<common::Job> {
    let (py, site) = module_python(if matches!(name, "api.py" | "raises.py" | "device.py") { "numpy" } else { "numpy, torch" })?;
    let site = site.to_str().expect("utf8 path").to_string();
    let mut env: Vec<(&str, &str)> = env.to_vec();
    env.push(("PYTHONPATH", &site));
    // A tensor some rank never submits ends the job instead of waiting for the test's deadline.
    env.push(("RINGREC_STALL_SHUTDOWN_TIME_SECONDS", "60"));
    env.push(("OMP_NUM_THREADS", "1"));
    let script = script(name);
    let mut argv = vec![script.as_str()];
    argv.extend_from_slice(args);
    Some(common::mpirun_exe(Path::new(&py), np, &env, &argv, timeout))
}

/// How many times `prefix` and a rank number appear in the job's stdout, wherever they
/// start: mpirun forwards each rank's output in chunks, so one rank's line may follow
/// another's text before its newline arrives (as it did in CI).
fn count(job: &common::Job, prefix: &str) -> usize {
    job.stdout.match_indices(prefix).filter(|(at, _)| job.stdout[at + prefix.len()..].starts_with(|c: char| c.is_ascii_digit())).count()
}

#[test]
fn the_api_matches_numpy_at_1_2_and_4_ranks_on_2_hosts() {
    for (np, per_host) in [(1, "0"), (2, "0"), (4, "2")] {
        let Some(job) = run(np, "api.py", &[("RINGREC_RANKS_PER_HOST", per_host)], Duration::from_secs(300)) else { return };
        job.assert_ok();
        assert_eq!(count(&job, "api ok rank "), np, "{}", job.all());
    }
}

#[test]
fn cuda_tensors_through_dlpack_reduce_on_the_host_kernels_device_at_1_and_2_ranks() {
    // Random queue delays (seeded per rank) and the same run without them: the same values.
    for (np, seed) in [(1, ""), (2, ""), (2, "7")] {
        let mut env = vec![("RINGREC_PY_DEVICE", "host")];
        if !seed.is_empty() {
            env.extend([("RINGREC_HOST_DELAY_SEED", seed), ("RINGREC_HOST_DELAY_MAX_US", "300")]);
        }
        let Some(job) = run(np, "device.py", &env, Duration::from_secs(300)) else { return };
        job.assert_ok();
        assert_eq!(count(&job, "device ok rank "), np, "{}", job.all());
    }
    let Some(job) = run(2, "device.py", &[("RINGREC_PY_DEVICE", "cpu"), ("EXPECT_REFUSED", "1")], Duration::from_secs(300)) else { return };
    job.assert_ok();
    assert_eq!(count(&job, "device refused ok rank "), 2, "{}", job.all());
}

#[test]
fn a_collective_on_a_device_tensor_on_one_rank_and_a_host_tensor_on_another_is_an_error_naming_both() {
    let Some(job) = run(2, "device.py", &[("RINGREC_PY_DEVICE", "host"), ("MIXED", "1")], Duration::from_secs(300)) else { return };
    job.assert_ok();
    assert_eq!(count(&job, "device mixed ok rank "), 2, "{}", job.all());
}

#[test]
fn host_embeddings_of_one_process_share_the_free_shared_memory_at_1_and_2_ranks() {
    for np in [1, 2] {
        let Some(job) = run(np, "shares.py", &[], Duration::from_secs(300)) else { return };
        job.assert_ok();
        assert_eq!(count(&job, "shares ok rank "), np, "{}", job.all());
    }
}

#[test]
fn distributed_optimizer_trains_as_torch_ddp_within_1e_5() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port().to_string();
    let env = [("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", port.as_str()), ("STEPS", "8")];
    let Some(job) = run(2, "ddp.py", &env, Duration::from_secs(300)) else { return };
    job.assert_ok();
    assert_eq!(count(&job, "ddp ok rank "), 2, "{}", job.all());
}

/// A free TCP port on this machine, for gloo's rendezvous.
fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port().to_string()
}

#[test]
fn host_embedding_trains_as_ddp_with_sparse_nn_embedding_at_1_2_and_4_ranks_on_2_hosts() {
    for (np, per_host) in [(1, "0"), (2, "0"), (4, "2")] {
        let dir = common::scratch(&format!("hostemb-{np}"));
        let port = free_port();
        let save = dir.to_str().expect("utf8 path");
        let env = [("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", port.as_str()), ("STEPS", "6"), ("SAVE_DIR", save), ("RINGREC_RANKS_PER_HOST", per_host)];
        let Some(job) = run(np, "hostemb.py", &env, Duration::from_secs(300)) else { return };
        job.assert_ok();
        assert_eq!(count(&job, "hostemb ok rank "), np, "{}", job.all());
    }
}

#[test]
fn two_host_embeddings_of_different_dims_train_as_ddp_and_restore_at_2_and_4_ranks_on_2_hosts() {
    for (np, per_host) in [(2, "0"), (4, "2")] {
        let dir = common::scratch(&format!("tables-{np}"));
        let port = free_port();
        let save = dir.to_str().expect("utf8 path");
        let env = [("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", port.as_str()), ("STEPS", "5"), ("SAVE_DIR", save), ("RINGREC_RANKS_PER_HOST", per_host)];
        let Some(job) = run(np, "tables.py", &env, Duration::from_secs(300)) else { return };
        job.assert_ok();
        assert_eq!(count(&job, "tables ok rank "), np, "{}", job.all());
    }
}

#[test]
fn the_dlrm_example_trains_a_few_steps_at_2_ranks() {
    let data = common::scratch("dlrm-example").join("train.tsv");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringrec")).args(["data", "synth", "--rows", "3000", "--out"]).arg(&data).output().expect("ringrec data synth");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let data = data.to_str().expect("utf8 path");
    let Some(job) = run_args(2, "dlrm.py", &[], &["--data", data, "--steps", "20", "--batch", "128"], Duration::from_secs(300)) else { return };
    job.assert_ok();
    assert!(job.stdout.contains("dlrm: done"), "{}", job.all());
}

#[test]
fn a_rank_that_raises_ends_the_job_with_its_traceback() {
    let Some(job) = run(2, "raises.py", &[("RAISE_RANK", "1")], Duration::from_secs(120)) else { return };
    let all = job.all();
    assert!(!job.timed_out && job.code != Some(0), "the job must end, failing:\n{all}");
    assert!(job.elapsed < Duration::from_secs(60), "the job took {:?} to end:\n{all}", job.elapsed);
    assert!(all.contains("ringrec rank 1: uncaught Python exception, ending the job:"), "{all}");
    assert!(all.contains("Traceback (most recent call last):") && all.contains("KeyError: 'boom on purpose from rank 1'"), "{all}");
    assert!(!all.contains("unreachable"), "{all}");
}
