//! `ringrec train --compression` under real mpirun, 4 ranks as 2 simulated hosts: the
//! 1-bit forms of design 001 (L1 scale; L2 scale times lambda) on the CPU path and on the
//! GPU code path (`--device host`: kernels/compress.cu compiled for the CPU, the device
//! executor's allgather), the dense traffic in the summary, and the refusals.

mod common;

use std::path::PathBuf;

fn data_dir() -> PathBuf {
    common::shared_scratch("data")
}

fn train(args: &[&str]) -> common::Job {
    let dd = data_dir();
    let env = [("RINGREC_DATA_DIR", dd.to_str().expect("utf8")), ("RINGREC_RANKS_PER_HOST", "2")];
    let mut a = vec!["train", "--synth-rows", "6000", "--batch", "240", "--no-progress", "--json", "--record-losses", "--hidden", "32,16", "--max-steps", "40", "--epochs", "3"];
    a.extend_from_slice(args);
    common::mpirun(4, &env, &common::small_table(&a))
}

fn summary(job: &common::Job) -> serde_json::Value {
    job.assert_ok();
    let line = job.stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON summary:\n{}", job.all()));
    serde_json::from_str(line).expect("summary JSON")
}

fn losses(s: &serde_json::Value) -> Vec<f64> {
    s["losses"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
}

fn field(t: &serde_json::Value, k: &str) -> u64 {
    t[k].as_u64().unwrap_or_else(|| panic!("{k} in {t}"))
}

/// Sent == received summed over the ranks, inside hosts and across.
fn balanced(traffic: &serde_json::Value, what: &str) -> (u64, u64) {
    let all = traffic.as_array().unwrap();
    assert_eq!(all.len(), 4, "{what}: one entry per rank");
    let sum = |k: &str| all.iter().map(|t| field(t, k)).sum::<u64>();
    let (cs, cr, is, ir) = (sum("cross_host_sent"), sum("cross_host_received"), sum("intra_host_sent"), sum("intra_host_received"));
    // The model rounds each rank's figure to whole bytes.
    assert!(cs.abs_diff(cr) <= 4 && is.abs_diff(ir) <= 4, "{what}: sent {cs}/{is} received {cr}/{ir}");
    (cs, is)
}

#[test]
fn each_one_bit_form_trains_sends_a_32nd_and_matches_on_the_gpu_code_path() {
    let none = summary(&train(&[]));
    assert_eq!(none["dense_compression"], "none");
    let raw = none["dense_bytes_per_step"].as_f64().unwrap();
    assert!(raw > 4.0 * 10_000.0, "{raw}");
    assert_eq!(none["dense_wire_bytes_per_step"].as_f64().unwrap(), raw);
    let (dense_cross, _) = balanced(&none["dense_traffic_per_rank"], "none");
    let (sparse_cross, _) = balanced(&none["sparse_traffic_per_rank"], "sparse");
    assert!(dense_cross > 0, "2 hosts: the dense allreduce crosses hosts");
    let samples = none["samples"].as_f64().unwrap();
    let per_sample = none["cross_host_bytes_per_sample"].as_f64().unwrap();
    assert!((per_sample - (dense_cross + sparse_cross) as f64 / samples).abs() < 1e-6, "{per_sample}");
    let base = losses(&none);
    for (form, extra) in [("1bit", vec![]), ("1bit", vec!["--onebit-lambda", "0.5", "--onebit-block", "0"]), ("1bit-l1", vec!["--onebit-block", "64"])] {
        let mut args = vec!["--compression", form];
        args.extend_from_slice(&extra);
        let cpu = summary(&train(&args));
        let what = format!("{form} {extra:?}");
        assert_eq!(cpu["dense_compression"], form, "{what}");
        // Sign bits plus 4 bytes of scale per block (or per tensor: 3 layers + the loss).
        let block = extra.iter().position(|a| *a == "--onebit-block").map_or(256.0, |i| extra[i + 1].parse::<f64>().unwrap());
        let scales = if block == 0.0 { 4.0 * 4.0 } else { raw / 4.0 / block * 4.0 + 4.0 * 4.0 };
        let wire = cpu["dense_wire_bytes_per_step"].as_f64().unwrap();
        assert!(wire >= raw / 32.0 && wire <= raw / 32.0 + scales + 16.0, "{what}: {wire} wire bytes per step for {raw} (scales {scales})");
        let (cross, _) = balanced(&cpu["dense_traffic_per_rank"], &what);
        assert!((cross as f64) < dense_cross as f64 / 4.0, "{what}: {cross} dense cross-host bytes vs {dense_cross} uncompressed");
        // It trains: finite, its last losses not far above the uncompressed run's.
        let l = losses(&cpu);
        assert!(l.iter().all(|v| v.is_finite()), "{what}: {l:?}");
        let (tail, base_tail) = (l[30..].iter().sum::<f64>() / 10.0, base[30..].iter().sum::<f64>() / 10.0);
        assert!(tail < base_tail + 0.05, "{what}: last losses {tail} vs {base_tail} without compression");
        // The GPU code path: the same forms through kernels/compress.cu.
        let mut dargs = args.clone();
        dargs.extend_from_slice(&["--device", "host"]);
        let dev = summary(&train(&dargs));
        assert!(dev["device"].as_str().unwrap().starts_with("host"), "{dev}");
        for (i, (a, b)) in l.iter().zip(losses(&dev)).enumerate() {
            assert!((a - b).abs() <= 1e-3 * a.abs(), "{what}: step {i}: device path loss {b} vs cpu {a}");
        }
    }
}

#[test]
fn bad_compression_flags_are_refused_with_what_to_do() {
    for (args, says) in [
        (vec!["--onebit-lambda", "0.5"], "add --compression 1bit"),
        (vec!["--compression", "1bit", "--onebit-lambda", "1.5"], "must be in (0, 1]"),
        (vec!["--compression", "1bit-l1", "--onebit-lambda", "0.5"], "add --compression 1bit"),
        (vec!["--compression", "2bit"], "choose from none, fp16, bf16, 1bit, 1bit-l1"),
        (vec!["--onebit-block", "64"], "add --compression 1bit or 1bit-l1"),
        (vec!["--compression-warmup", "5"], "add --compression (1bit, 1bit-l1, fp16 or bf16)"),
    ] {
        let job = train(&args);
        assert!(job.code != Some(0), "{args:?} must fail");
        assert!(job.all().contains(says), "{args:?}: {}", job.all());
    }
}

/// `--compression-warmup N`: the first N steps' gradients go exact, the rest compressed.
#[test]
fn compression_warmup_sends_exact_gradients_first() {
    let none = summary(&train(&[]));
    let raw = none["dense_bytes_per_step"].as_f64().unwrap();
    // A warmup as long as the run is the uncompressed run, bit for bit.
    let all = summary(&train(&["--compression", "1bit", "--compression-warmup", "40"]));
    assert_eq!(all["params_fnv"], none["params_fnv"], "a 40-step warmup of a 40-step run compresses nothing");
    assert_eq!(all["dense_wire_bytes_per_step"].as_f64().unwrap(), raw);
    let onebit = summary(&train(&["--compression", "1bit"]));
    let compressed = onebit["dense_wire_bytes_per_step"].as_f64().unwrap();
    assert!(compressed < raw / 25.0, "{compressed} vs {raw}");
    let part = summary(&train(&["--compression", "1bit", "--compression-warmup", "10"]));
    let (l, base) = (losses(&part), losses(&none));
    // Steps 1..=10 update with exact gradients: the losses up to the 11th match the
    // uncompressed run's; the 12th is the first after a compressed update.
    assert_eq!(l[..11], base[..11], "the warmup's steps are the uncompressed run's");
    assert_ne!(l[11], base[11], "after the warmup the gradients are compressed");
    assert_ne!(part["params_fnv"], none["params_fnv"]);
    // 10 steps at the f32 bytes, 30 at the 1-bit bytes (the sizes depend only on shapes).
    let wire = part["dense_wire_bytes_per_step"].as_f64().unwrap() * 40.0;
    assert!((wire - (10.0 * raw + 30.0 * compressed)).abs() < 1.0, "{wire} wire bytes over 40 steps; raw {raw}, compressed {compressed} per step");
}

#[test]
fn sparse_rows_cross_hosts_as_scales_and_signs() {
    let none = summary(&train(&[]));
    let (cross_none, _) = balanced(&none["sparse_traffic_per_rank"], "sparse none");
    let base = losses(&none);
    for (form, extra) in [("1bit-l1", vec![]), ("1bit", vec!["--onebit-lambda", "0.5"])] {
        let mut args = vec!["--sparse-compression", form];
        args.extend_from_slice(&extra);
        let s = summary(&train(&args));
        let what = format!("{form} {extra:?}");
        assert_eq!(s["sparse_compression"], form);
        assert_eq!(s["dense_compression"], "none");
        // A row of 16 f32s (64 bytes) + key and count becomes a scale and 2 bytes of signs.
        let (cross, _) = balanced(&s["sparse_traffic_per_rank"], &what);
        let ratio = cross as f64 / cross_none as f64;
        assert!(ratio < 0.3 && ratio > 0.15, "{what}: sparse cross-host bytes {cross} vs {cross_none}: {ratio}");
        assert!(s["sparse_compression_residual_rows"].as_u64().unwrap() > 100, "{what}: {s}");
        // Every host merged the same decoded rows: the hosts' tables hold the same rows.
        let crcs: Vec<&str> = s["table_rows_crc_per_host"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
        assert!(crcs.len() == 2 && crcs[0] == crcs[1] && !crcs[0].is_empty(), "{what}: {crcs:?}");
        let l = losses(&s);
        assert!(l.iter().all(|v| v.is_finite()), "{what}: {l:?}");
        let (tail, base_tail) = (l[30..].iter().sum::<f64>() / 10.0, base[30..].iter().sum::<f64>() / 10.0);
        assert!(tail < base_tail + 0.05, "{what}: last losses {tail} vs {base_tail} without compression");
    }
    // With --sync-every, the deltas of a sync cross hosts compressed: the hosts still end
    // with the same rows, and fewer bytes than uncompressed deltas.
    let plain = summary(&train(&["--sync-every", "4"]));
    let packed = summary(&train(&["--sync-every", "4", "--sparse-compression", "1bit-l1"]));
    for s in [&plain, &packed] {
        let crcs: Vec<&str> = s["table_rows_crc_per_host"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
        assert!(crcs.len() == 2 && crcs[0] == crcs[1], "{crcs:?}");
    }
    let (a, b) = (plain["sync_delta_cross_bytes_sent"].as_f64().unwrap(), packed["sync_delta_cross_bytes_sent"].as_f64().unwrap());
    assert!(b < 0.3 * a && b > 0.0, "compressed deltas {b} vs {a}");
    let job = train(&["--sparse-compression", "1bit", "--sparse-exchange", "flat"]);
    assert!(job.code != Some(0) && job.all().contains("use --sparse-exchange hier"), "{}", job.all());
}

/// `--sparse-compression fp16|bf16`: rows of halves (no residuals), hosts identical.
#[test]
fn sparse_rows_cross_hosts_as_halves() {
    let none = summary(&train(&[]));
    let (cross_none, _) = balanced(&none["sparse_traffic_per_rank"], "sparse none");
    let base = losses(&none);
    for form in ["fp16", "bf16"] {
        let s = summary(&train(&["--sparse-compression", form]));
        assert_eq!(s["sparse_compression"], form);
        // A row of 16 f32 (64 bytes) + key 8 + count 4 = 76 bytes becomes 32 + 12 = 44.
        let (cross, _) = balanced(&s["sparse_traffic_per_rank"], form);
        let ratio = cross as f64 / cross_none as f64;
        assert!((ratio - 44.0 / 76.0).abs() < 0.02, "{form}: sparse cross-host bytes {cross} vs {cross_none}: {ratio}");
        assert_eq!(s["sparse_compression_residual_rows"].as_u64(), Some(0), "{form}: no error feedback");
        let crcs: Vec<&str> = s["table_rows_crc_per_host"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
        assert!(crcs.len() == 2 && crcs[0] == crcs[1] && !crcs[0].is_empty(), "{form}: {crcs:?}");
        // Rounding a gradient to 11 (8) significant bits barely moves training.
        let l = losses(&s);
        let worst = l.iter().zip(&base).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        assert!(worst < 0.01, "{form}: step losses differ from uncompressed by up to {worst}");
        assert_ne!(s["params_fnv"], none["params_fnv"], "{form}: the rows were rounded");
    }
    let packed = summary(&train(&["--sync-every", "4", "--sparse-compression", "bf16"]));
    let crcs: Vec<&str> = packed["table_rows_crc_per_host"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    assert!(crcs.len() == 2 && crcs[0] == crcs[1], "{crcs:?}");
}
