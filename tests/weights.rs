//! Sample weights and weighted aggregation (issue 17, parts 2 and 3) under real mpirun:
//! the engine's weighted allreduce over uneven shards equals the one-rank mean gradient;
//! `--merge-duplicates` counts exactly the repeated rows and trains like the unmerged data
//! at twice the batch; `--decay-base` with `--min-sample-weight` drops exactly the old days;
//! `--sparse-normalize weighted` (unit weights: `frequency` bit for bit; unequal weights:
//! a reference); the GPU code path (`--device host`) and a resumed weighted run agree;
//! bad weight flags are refused with what to do.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ringrec::engine::Tensor;

fn tmpdir(name: &str) -> PathBuf {
    common::scratch(name)
}

fn summary(job: &common::Job) -> serde_json::Value {
    let line = job.stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON summary:\n{}", job.all()));
    serde_json::from_str(line).expect("summary JSON")
}

/// `ringrec train` on `np` ranks with the data dir under `dir`.
fn train(np: usize, dir: &Path, args: &[&str]) -> common::Job {
    train_env(np, dir, &[], args)
}

/// [`train`] with more environment.
fn train_env(np: usize, dir: &Path, env: &[(&str, &str)], args: &[&str]) -> common::Job {
    let dd = dir.join("data");
    let mut e = vec![("RINGREC_DATA_DIR", dd.to_str().expect("utf8"))];
    e.extend_from_slice(env);
    let mut a = vec!["train", "--no-progress", "--json", "--record-losses", "--hidden", "32,16"];
    a.extend_from_slice(args);
    common::mpirun(np, &e, &common::small_table(&a))
}

/// Two day files in `dir`: day 0 of `rows0` rows and 300 copies of its first rows, day 1 of
/// `rows1` rows (synthetic, seeds `seed` and `seed + 1`); their `--data` value.
fn two_days(dir: &Path, rows0: u64, rows1: u64, seed: u64) -> String {
    let mut day0 = synth_lines(dir, rows0, seed);
    day0.extend(day0[..300].to_vec());
    let days = [write_lines(&dir.join("day_0.tsv"), &day0), write_lines(&dir.join("day_1.tsv"), &synth_lines(dir, rows1, seed + 1))];
    days.join(",")
}

/// A synthetic TSV of `rows` rows (seed `seed`), its lines.
fn synth_lines(dir: &Path, rows: u64, seed: u64) -> Vec<String> {
    let p = dir.join(format!("synth-{rows}-{seed}.tsv"));
    ringrec::data::synth(&p, rows, seed).expect("synth");
    std::fs::read_to_string(&p).expect("read").lines().map(String::from).collect()
}

fn write_lines(p: &Path, lines: &[String]) -> String {
    std::fs::write(p, lines.join("\n") + "\n").expect("write");
    p.to_str().expect("utf8").to_string()
}

/// The small problem of the weighted allreduce: row i has features x_i (4 values) and
/// target y_i; the gradient of the mean squared error of the linear model `theta` over rows.
fn rows_gradient(rows: std::ops::Range<usize>) -> Vec<f64> {
    let theta = [0.5, -1.0, 0.25, 2.0];
    let x = |i: usize, j: usize| ((i * 7 + j * 3) % 11) as f64 / 5.0 - 1.0;
    let y = |i: usize| (i % 5) as f64 - 2.0;
    let mut g = vec![0.0; 4];
    let n = rows.len() as f64;
    for i in rows {
        let err: f64 = (0..4).map(|j| theta[j] * x(i, j)).sum::<f64>() - y(i);
        for (j, gj) in g.iter_mut().enumerate() {
            *gj += 2.0 * err * x(i, j) / n;
        }
    }
    g
}

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_weighted_allreduce() {
    let rt = ringrec::init().expect("engine");
    let me = rt.rank();
    assert_eq!(rt.size(), 3);
    // Uneven shards of 23 rows: 5, 7, 11.
    let bounds = [0, 5, 12, 23];
    let mine = bounds[me]..bounds[me + 1];
    let weight = mine.len() as f64;
    let local: Vec<f32> = rows_gradient(mine).iter().map(|v| *v as f32).collect();
    let want = rows_gradient(0..23);
    let got = rt.weighted_allreduce("g", Tensor::from_vec(local.clone()), weight).expect("weighted allreduce");
    let got = got.as_slice::<f32>().expect("f32");
    for (g, w) in got.iter().zip(&want) {
        assert!((*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()), "rank {me}: {got:?} vs the one-rank gradient {want:?}");
    }
    // The plain average of the ranks' means is not it (the shards are uneven).
    let avg = rt.allreduce("avg", Tensor::from_vec(local), ringrec::dtype::ReduceOp::Average).expect("average");
    let avg = avg.as_slice::<f32>().expect("f32");
    assert!(avg.iter().zip(&want).any(|(a, w)| (*a as f64 - w).abs() > 1e-3), "the shards should make the plain average differ: {avg:?} {want:?}");
    // f64 tensors too; all weights 0 is an error on every rank.
    let got = rt.weighted_allreduce("g64", Tensor::from_vec(vec![me as f64 + 1.0]), [1.0, 0.0, 3.0][me]).expect("f64");
    assert_eq!(got.as_slice::<f64>().expect("f64"), &[(1.0 + 9.0) / 4.0]);
    let zero = rt.weighted_allreduce("zero", Tensor::from_vec(vec![1.0f32]), 0.0).unwrap_err();
    assert!(zero.to_string().contains("sum to 0"), "{zero}");
    println!("WEIGHTED OK rank={me}");
}

#[test]
fn weighted_allreduce_over_uneven_shards_is_the_one_rank_gradient() {
    let job = common::run_worker("worker_weighted_allreduce", 3, &[], Duration::from_secs(120));
    job.assert_ok();
    assert_eq!(job.all().matches("WEIGHTED OK").count(), 3, "{}", job.all());
}

#[test]
fn merged_duplicates_are_counted_and_train_like_the_repeated_rows() {
    let dir = tmpdir("merge");
    let base = synth_lines(&dir, 2400, 3);
    // Every row twice in a row: merging leaves each once with weight 2; 2 ranks, batch 2B
    // unmerged and B merged put the same rows (with the same weights) on the same ranks.
    let doubled: Vec<String> = base.iter().flat_map(|l| [l.clone(), l.clone()]).collect();
    let d = write_lines(&dir.join("doubled.tsv"), &doubled);
    let eval = write_lines(&dir.join("eval.tsv"), &synth_lines(&dir, 600, 4));
    let plain = train(2, &dir, &["--data", &d, "--eval-data", &eval, "--batch", "480"]);
    plain.assert_ok();
    let merged = train(2, &dir, &["--data", &d, "--eval-data", &eval, "--batch", "240", "--merge-duplicates"]);
    merged.assert_ok();
    let (p, m) = (summary(&plain), summary(&merged));
    let distinct = base.iter().collect::<HashSet<_>>().len() as u64;
    assert_eq!(m["samples_merged"].as_u64(), Some(4800 - distinct), "{m}");
    assert_eq!(m["train_rows"].as_u64(), Some(distinct));
    assert_eq!(m["samples_dropped_by_weight"].as_u64(), Some(0));
    assert_eq!(p["samples_merged"].as_u64(), Some(0));
    let (pl, ml) = (p["losses"].as_array().unwrap(), m["losses"].as_array().unwrap());
    assert_eq!(pl.len(), ml.len(), "the same number of steps");
    for (a, b) in pl.iter().zip(ml) {
        let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
        assert!((a - b).abs() <= 1e-4 * a.abs(), "step losses differ: {a} vs {b}\n{pl:?}\n{ml:?}");
    }
    let (pa, ma) = (p["test_auc"].as_f64().unwrap(), m["test_auc"].as_f64().unwrap());
    assert!((pa - ma).abs() <= 1e-3, "AUC {pa} vs {ma}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn decay_drops_the_days_below_the_minimum_and_weighs_the_rest() {
    let dir = tmpdir("decay");
    let days: Vec<String> = (0..3).map(|d| write_lines(&dir.join(format!("day_{d}.tsv")), &synth_lines(&dir, 1200, 10 + d))).collect();
    let data = days.join(",");
    // base 2: days 0, 1, 2 weigh 1/4, 1/2, 1; a minimum of 0.3 drops day 0.
    let job = train(2, &dir, &["--data", &data, "--batch", "240", "--no-eval", "--decay-base", "2", "--min-sample-weight", "0.3"]);
    job.assert_ok();
    let s = summary(&job);
    assert_eq!(s["samples_dropped_by_weight"].as_u64(), Some(1200), "{s}");
    assert_eq!(s["train_rows"].as_u64(), Some(2400));
    assert_eq!(s["steps"].as_u64(), Some(10));
    // --day-of makes day_0 the newest (day 5).
    let job = train(2, &dir, &["--data", &data, "--batch", "240", "--no-eval", "--decay-base", "2", "--min-sample-weight", "0.3", "--day-of", &format!("{}=5", days[0])]);
    job.assert_ok();
    let s = summary(&job);
    // Days 5, 1, 2: ages 0, 4, 3 -> weights 1, 1/16, 1/8: two files dropped.
    assert_eq!(s["samples_dropped_by_weight"].as_u64(), Some(2400), "{s}");
    assert_eq!(s["train_rows"].as_u64(), Some(1200));
    // Default minimum with decay: 0.001, nothing dropped at these ages; a batch spanning
    // two days weighs them apart, so the losses differ from the unweighted run's.
    let weighted = summary(&train(2, &dir, &["--data", &data, "--batch", "500", "--no-eval", "--decay-base", "e"]));
    let plain = summary(&train(2, &dir, &["--data", &data, "--batch", "500", "--no-eval"]));
    assert_eq!(weighted["samples_dropped_by_weight"].as_u64(), Some(0));
    assert_eq!(weighted["losses"].as_array().unwrap().len(), plain["losses"].as_array().unwrap().len());
    let loss = |s: &serde_json::Value, i: usize| s["losses"][i].as_f64().unwrap();
    assert!((loss(&weighted, 0) - loss(&plain, 0)).abs() <= 1e-6, "the first batch is one day: its weights cancel in the weighted mean");
    assert!((loss(&weighted, 2) - loss(&plain, 2)).abs() > 1e-5, "batch 3 spans days 0 and 1: {} vs {}", loss(&weighted, 2), loss(&plain, 2));
    std::fs::remove_dir_all(&dir).ok();
}

/// `--loss-normalize rows`: a batch of one old day is scaled by its weight (not cancelled).
#[test]
fn loss_normalized_by_rows_lets_decay_act_on_one_day_batches() {
    let dir = tmpdir("rows");
    let days: Vec<String> = (0..3).map(|d| write_lines(&dir.join(format!("day_{d}.tsv")), &synth_lines(&dir, 1200, 20 + d))).collect();
    let data = days.join(",");
    let run = |extra: &[&str]| {
        let mut a = vec!["--data", data.as_str(), "--batch", "240", "--no-eval"];
        a.extend_from_slice(extra);
        summary(&train(2, &dir, &a))
    };
    let plain = run(&[]);
    let mean = run(&["--decay-base", "2"]);
    let rows = run(&["--decay-base", "2", "--loss-normalize", "rows"]);
    let loss = |s: &serde_json::Value, i: usize| s["losses"][i].as_f64().unwrap();
    // Batch 1 is day 0's (weight 1/4 for every row): the weighted mean is the plain loss,
    // the row-normalised loss a quarter of it.
    assert!((loss(&mean, 0) - loss(&plain, 0)).abs() <= 1e-6, "{} vs {}", loss(&mean, 0), loss(&plain, 0));
    assert!((loss(&rows, 0) - 0.25 * loss(&plain, 0)).abs() <= 1e-6, "{} vs {} / 4", loss(&rows, 0), loss(&plain, 0));
    // Its updates are a quarter (day 0) and a half (day 1) of the weighted mean's: the
    // sparse SGD moves less, so the run ends elsewhere.
    assert_ne!(rows["params_fnv"], mean["params_fnv"]);
    // Refused where nothing is weighted.
    let job = train(1, &dir, &["--data", &days[0], "--batch", "100", "--loss-normalize", "rows"]);
    assert!(job.code != Some(0) && job.all().contains("add --decay-base or --merge-duplicates"), "{}", job.all());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_weight_flags_say_what_to_do() {
    let dir = tmpdir("bad");
    let d = write_lines(&dir.join("d.tsv"), &synth_lines(&dir, 300, 5));
    for (args, want) in [
        (vec!["--decay-base", "1"], "above 1"),
        (vec!["--decay-base", "2", "--decay-unit", "hour"], "the only unit is `day`"),
        (vec!["--day-of", "x.tsv=1"], "add --decay-base"),
        (vec!["--decay-base", "2", "--day-of", "other.tsv=1"], "is not one of the --data files"),
        (vec!["--decay-base", "2", "--day-of", "x.tsv"], "FILE=N"),
        (vec!["--min-sample-weight=-1"], "--min-sample-weight must be a number >= 0"),
        (vec!["--decay-base", "2", "--min-sample-weight", "2"], "rows weigh less than --min-sample-weight: lower it"),
        (vec!["--min-sample-weight", "2"], "without --decay-base or --merge-duplicates every sample weighs 1"),
    ] {
        let mut a = vec!["--data", d.as_str(), "--batch", "100"];
        a.extend_from_slice(&args);
        let job = train(1, &dir, &a);
        assert!(job.code != Some(0), "{args:?} should fail");
        assert!(job.all().contains(want), "{args:?}: want {want:?} in\n{}", job.all());
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The table of the newest checkpoint in `dir`.
fn table_file(dir: &Path) -> Vec<u8> {
    let step = ringrec::train::checkpoint::latest_step(dir).unwrap_or_else(|| panic!("no checkpoint in {}", dir.display()));
    std::fs::read(ringrec::train::checkpoint::step_dir(dir, step).join("table.rrt")).expect("table file")
}

#[test]
fn weighted_sparse_normalisation_with_unit_weights_is_frequency() {
    let dir = tmpdir("sparse");
    let d = write_lines(&dir.join("d.tsv"), &synth_lines(&dir, 2400, 6));
    for exchange in ["hier", "flat"] {
        let run = |norm: &str| {
            let ck = dir.join(format!("ck-{exchange}-{norm}"));
            let args = ["--data", &d, "--batch", "240", "--sparse-exchange", exchange, "--sparse-normalize", norm, "--checkpoint-dir", ck.to_str().unwrap()];
            let job = train_env(4, &dir, &[("RINGREC_RANKS_PER_HOST", "2")], &args);
            job.assert_ok();
            (summary(&job), table_file(&ck))
        };
        let (f, ft) = run("frequency");
        let (w, wt) = run("weighted");
        assert_eq!(w["sparse_normalize"], "weighted");
        assert_eq!(f["params_fnv"], w["params_fnv"], "{exchange}: weighted with every weight 1 must train exactly as frequency");
        assert!(ft == wt, "{exchange}: the tables differ");
        // More bytes on the wire: each row carries its weight (4 bytes).
        assert!(w["sparse_bytes_cross_host_per_step"].as_f64() > f["sparse_bytes_cross_host_per_step"].as_f64(), "{w}");
        // And a world-normalised run does differ (the comparison can fail).
        let (n, _) = run("world");
        assert_ne!(n["params_fnv"], f["params_fnv"]);
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Rank `r`'s batch at `step`: 40 keys out of 64 (repeats allowed), rows of 3 values.
fn sparse_batch(step: u64, r: usize) -> (Vec<u64>, Vec<f32>) {
    let mut s = step * 1000 + r as u64 + 1;
    let mut next = || ringrec::hash::splitmix64_next(&mut s);
    let keys: Vec<u64> = (0..40).map(|_| next() % 64).collect();
    let grads: Vec<f32> = (0..40 * 3).map(|_| (next() % 2000) as f32 / 1000.0 - 1.0).collect();
    (keys, grads)
}

#[test]
#[ignore = "runs under mpirun, launched by the tests below"]
fn worker_weighted_sparse() {
    use ringrec::sparse::{SparseExchange, SparseExchanger, SparseNormalize};
    use std::collections::BTreeMap;
    let topo = ringrec::topology::Topology::init().expect("MPI");
    let world = topo.size;
    // Unequal weights: rank r weighs 1 + 2r.
    let weight = |r: usize| 1.0 + 2.0 * r as f32;
    let total: f32 = (0..world).map(weight).sum();
    let mut hier = SparseExchanger::new(&topo, SparseExchange::Hierarchical, SparseNormalize::Weighted, 3).expect("hier");
    let mut flat = SparseExchanger::new(&topo, SparseExchange::Flat, SparseNormalize::Weighted, 3).expect("flat");
    assert_eq!(hier.dim(), 3);
    for ex in [&mut hier, &mut flat] {
        ex.set_weights(weight(topo.rank), total);
    }
    for step in 0..6 {
        let batches: Vec<_> = (0..world).map(|r| sparse_batch(step, r)).collect();
        // Reference: per key, the sum of every holder's rows over the holders' weights.
        let mut want: BTreeMap<u64, (Vec<f64>, std::collections::BTreeSet<usize>)> = BTreeMap::new();
        for (r, (keys, grads)) in batches.iter().enumerate() {
            for (i, k) in keys.iter().enumerate() {
                let e = want.entry(*k).or_insert_with(|| (vec![0.0; 3], Default::default()));
                e.0.iter_mut().zip(&grads[i * 3..i * 3 + 3]).for_each(|(a, g)| *a += *g as f64);
                e.1.insert(r);
            }
        }
        let (keys, grads) = &batches[topo.rank];
        let f = flat.exchange(keys, grads).expect("flat").0.expect("flat holds the result");
        let (fk, fg) = (f.keys.to_vec(), f.grads.to_vec());
        assert_eq!(fk, want.keys().copied().collect::<Vec<_>>());
        for (i, (row, holders)) in want.values().enumerate() {
            let w: f64 = holders.iter().map(|r| weight(*r) as f64).sum();
            let d = w * world as f64 / total as f64;
            for (j, v) in row.iter().enumerate() {
                let got = fg[i * 3 + j] as f64;
                assert!((got - v / d).abs() <= 1e-5 * (1.0 + (v / d).abs()), "step {step} key {} value {j}: {got} vs {}", fk[i], v / d);
            }
        }
        if let Some(h) = hier.exchange(keys, grads).expect("hier").0 {
            assert_eq!(h.keys, &fk[..]);
            assert_eq!(h.grads.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), fg.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "hier and flat differ");
        }
    }
    println!("WEIGHTED SPARSE OK rank={}", topo.rank);
}

#[test]
fn weighted_sparse_normalisation_divides_by_the_holders_weights() {
    for (np, per_host) in [(4, "2"), (3, "3")] {
        let job = common::run_worker("worker_weighted_sparse", np, &[("RINGREC_RANKS_PER_HOST", per_host)], Duration::from_secs(120));
        job.assert_ok();
        assert_eq!(job.all().matches("WEIGHTED SPARSE OK").count(), np, "{}", job.all());
    }
}

#[test]
fn weighted_training_on_the_gpu_code_path_matches_the_cpu() {
    // --device host: the weights staged and uploaded like a GPU's, the weighted loss from
    // kernels/dense.cu compiled for the CPU; with random delays on the queues, a missing
    // wait on the weights' staging slot would change the bits.
    let dir = tmpdir("host");
    let data = two_days(&dir, 700, 1000, 21);
    let run = |device: &str, env: &[(&str, &str)]| {
        let job = train_env(2, &dir, env, &["--device", device, "--data", &data, "--batch", "400", "--epochs", "2", "--no-eval", "--decay-base", "e", "--merge-duplicates"]);
        job.assert_ok();
        summary(&job)
    };
    let (cpu, host, delayed) = (run("cpu", &[]), run("host", &[]), run("host", &[("RINGREC_HOST_DELAY_SEED", "2")]));
    assert_eq!(cpu["samples_merged"].as_u64(), Some(300), "{cpu}");
    let (a, b) = (cpu["losses"].as_array().unwrap(), host["losses"].as_array().unwrap());
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
        assert!((x - y).abs() <= 1e-3 * x.abs(), "host device loss {y} vs the CPU's {x}");
    }
    assert_eq!(delayed["params_fnv"], host["params_fnv"], "random delays changed the weighted run");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_resumed_weighted_run_equals_an_uninterrupted_one_and_refuses_other_weights() {
    let dir = tmpdir("resume");
    let data = two_days(&dir, 900, 1200, 31);
    let ck = dir.join("ck");
    let ck = ck.to_str().unwrap();
    let w = ["--data", data.as_str(), "--batch", "200", "--no-eval", "--decay-base", "2", "--merge-duplicates", "--shuffle"];
    let full = train(2, &dir, &[&w[..], &["--max-steps", "9"]].concat());
    full.assert_ok();
    let part = train(2, &dir, &[&w[..], &["--max-steps", "4", "--checkpoint-dir", ck]].concat());
    part.assert_ok();
    let resumed = train(2, &dir, &[&w[..], &["--max-steps", "9", "--checkpoint-dir", ck, "--resume"]].concat());
    resumed.assert_ok();
    let (f, r) = (summary(&full), summary(&resumed));
    assert_eq!(r["steps"], 5, "{r}");
    assert_eq!(r["params_fnv"], f["params_fnv"], "a resumed weighted run must continue exactly");
    // Other weights cannot resume it.
    let other = train(2, &dir, &["--data", data.as_str(), "--batch", "200", "--no-eval", "--shuffle", "--max-steps", "9", "--checkpoint-dir", ck, "--resume"]);
    assert!(other.code != Some(0), "resuming without the weights must fail");
    assert!(other.all().contains("sample weights"), "{}", other.all());
    std::fs::remove_dir_all(&dir).ok();
}
