//! Any number of dense and categorical fields (issue 33 point 4): Parquet files written by
//! pyarrow (the tests' venv; skipped without it, a failure in CI) with exactly their
//! columns, none padded to Criteo's 13 dense and 26 single-hot fields — 2 dense, 30
//! single-hot and 2 multi-hot columns; the same without the dense ones; 3 single-hot
//! columns only. Each trains (the loss falls; the ranks agree), scores in `predict` as in
//! the run's evaluation, resumes and warm-starts; a model of one shape is refused on data
//! of another naming both; a bundle of 3 fields scores in scripts/bundle_predict.py as in
//! `predict`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Writes `wide.parquet` (label, d0, d1 floats, c0..c29 strings, l0, l1 lists of int64),
/// `nodense.parquet` (the same rows without d0, d1), `three.parquet` (label, c0..c2),
/// `densecols.parquet` (label, d0, d1) and an
/// `eval-` file of each (other rows), labels drawn from a planted logistic model over
/// every field.
const PYARROW_FIELDS: &str = r#"
import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq
d = sys.argv[1]
def write(name, n, seed):
    rng = np.random.default_rng(seed)
    w = np.random.default_rng(99)
    cats = {f"c{j}": rng.integers(0, 20, n) for j in range(30)}
    cw = {f"c{j}": w.normal(0, 1.0, 20) for j in range(30)}
    dense = {"d0": rng.normal(0, 1, n), "d1": rng.normal(0, 1, n)}
    lists = {f"l{g}": [list(rng.integers(0, 50, rng.integers(0, 6))) for _ in range(n)] for g in range(2)}
    lw = {f"l{g}": w.normal(0, 0.8, 50) for g in range(2)}
    def labels(names, use_dense, use_lists):
        z = sum(cw[c][cats[c]] for c in names)
        if use_dense:
            z = z + 1.5 * dense["d0"] - 1.0 * dense["d1"]
        if use_lists:
            for g, l in lists.items():
                z = z + np.array([lw[g][v].sum() for v in l])
        return (rng.random(n) < 1 / (1 + np.exp(-z))).astype(np.int64)
    strings = lambda c: pa.array([f"v{v}" for v in cats[c]])
    wide = {"label": labels(list(cats), True, True), **{k: pa.array(v) for k, v in dense.items()}}
    wide.update({c: strings(c) for c in cats})
    wide.update({g: pa.array(l, pa.list_(pa.int64())) for g, l in lists.items()})
    pq.write_table(pa.table(wide), f"{d}/{name}wide.parquet", row_group_size=1000)
    nodense = {k: v for k, v in wide.items() if not k.startswith("d")}
    nodense["label"] = labels(list(cats), False, True)
    pq.write_table(pa.table(nodense), f"{d}/{name}nodense.parquet", row_group_size=1000)
    three = {"label": labels(["c0", "c1", "c2"], False, False), **{c: strings(c) for c in ["c0", "c1", "c2"]}}
    pq.write_table(pa.table(three), f"{d}/{name}three.parquet", row_group_size=1000)
    only_dense = {"label": wide["label"], **{k: pa.array(v) for k, v in dense.items()}}
    pq.write_table(pa.table(only_dense), f"{d}/{name}densecols.parquet", row_group_size=1000)
write("", 4000, 1)
write("eval-", 1000, 2)
"#;

/// The files' directory, written once (`None`: no venv, the reason printed).
fn data() -> Option<&'static PathBuf> {
    static DATA: OnceLock<Option<PathBuf>> = OnceLock::new();
    DATA.get_or_init(|| {
        let py = common::test_python("numpy, pyarrow")?;
        let d = common::shared_scratch("fields-data");
        assert!(Command::new(&py).args(["-c", PYARROW_FIELDS]).arg(&d).status().unwrap().success(), "the pyarrow script failed");
        Some(d)
    })
    .as_ref()
}

/// `ringrec ARGS` at `np` ranks (`train` and `predict` with every run's flags): its job.
fn ringrec(np: usize, dir: &Path, args: &[&str]) -> common::Job {
    let data_dir = dir.join("data");
    let mut all: Vec<&str> = args.to_vec();
    if args[0] != "export" {
        all.extend(["--data-dir", data_dir.to_str().unwrap(), "--device", "cpu", "--threads", "1"]);
    }
    all.push("--json");
    common::mpirun(np, &[], &common::small_table(&all))
}

/// `ringrec train` on `file` of `d` (eval on its `eval-` twin) at `np` ranks: its summary.
fn train(np: usize, d: &Path, file: &str, dir: &Path, extra: &[&str]) -> serde_json::Value {
    let (data, eval) = (d.join(file), d.join(format!("eval-{file}")));
    let mut args = vec!["train", "--data", data.to_str().unwrap(), "--eval-data", eval.to_str().unwrap(), "--batch", "256", "--hidden", "32,16", "--record-losses"];
    args.extend(extra);
    let job = ringrec(np, dir, &args);
    job.assert_ok();
    job.summary()
}

fn fnv(s: &serde_json::Value) -> String {
    s["params_fnv"].as_str().unwrap().to_string()
}

/// The loss falls (the last quarter's mean below the first's) and every rank ends with the
/// same parameters.
fn learns(s: &serde_json::Value) {
    let losses: Vec<f64> = s["losses"].as_array().unwrap().iter().map(|l| l.as_f64().unwrap()).collect();
    let k = losses.len() / 4;
    let (first, last) = (losses[..k].iter().sum::<f64>() / k as f64, losses[losses.len() - k..].iter().sum::<f64>() / k as f64);
    assert!(last < first - 0.02, "the loss falls: first quarter {first}, last quarter {last}");
    let per_rank = s["params_fnv_per_rank"].as_array().unwrap();
    assert!(per_rank.iter().all(|f| *f == s["params_fnv"]), "{per_rank:?} vs {}", s["params_fnv"]);
}

#[test]
fn thirty_single_hot_two_dense_and_two_multi_hot_columns_train_score_resume_and_warm_start() {
    let Some(d) = data() else { return };
    let dir = common::scratch("fields-wide");
    let (ck, part, full) = (dir.join("ck"), dir.join("part"), dir.join("full"));
    let one = train(1, d, "wide.parquet", &dir, &["--epochs", "3", "--checkpoint-dir", ck.to_str().unwrap()]);
    learns(&one);
    assert!(one["test_auc"].as_f64().unwrap() > 0.6, "{}", one["test_auc"]);
    let two = train(2, d, "wide.parquet", &dir, &["--epochs", "3"]);
    learns(&two);
    assert!((two["test_auc"].as_f64().unwrap() - one["test_auc"].as_f64().unwrap()).abs() < 1e-3, "1 and 2 ranks: {} {}", one["test_auc"], two["test_auc"]);

    // predict scores the eval file as the run's evaluation did.
    let eval = d.join("eval-wide.parquet");
    let job = ringrec(2, &dir, &["predict", "--model", ck.to_str().unwrap(), "--data", eval.to_str().unwrap()]);
    job.assert_ok();
    assert_eq!(job.summary()["auc"].as_f64(), one["test_auc"].as_f64(), "predict's AUC differs from train's evaluation");

    // Its bundle: 2 dense and 30 single-hot fields, the lists salted after the 30, scored by
    // bundle_predict.py (pooling the lists) as predict scores it.
    let (bundle, scores) = (dir.join("bundle"), dir.join("wide-scores"));
    ringrec(1, &dir, &["export", "--model", ck.to_str().unwrap(), "--out", bundle.to_str().unwrap()]).assert_ok();
    let model: serde_json::Value = serde_json::from_slice(&std::fs::read(bundle.join("model.json")).unwrap()).unwrap();
    assert_eq!((&model["input"]["dense_features"], &model["input"]["categorical_features"]), (&serde_json::json!(2), &serde_json::json!(30)));
    let salts: Vec<u64> = model["input"]["multi_hot"].as_array().unwrap().iter().map(|f| f["field"].as_u64().unwrap()).collect();
    assert_eq!(salts, [30, 31]);
    ringrec(1, &dir, &["predict", "--model", bundle.to_str().unwrap(), "--data", eval.to_str().unwrap(), "--out", scores.to_str().unwrap()]).assert_ok();
    let py = common::test_python("numpy, pyarrow").unwrap();
    common::compare_with_predict(&py, "bundle_predict.py", &[bundle.to_str().unwrap(), eval.to_str().unwrap()], &scores, "1e-6");

    // Stopped at step 3 and resumed to 6: the parameters of 6 steps in one run.
    let full6 = train(1, d, "wide.parquet", &dir, &["--max-steps", "6", "--checkpoint-dir", full.to_str().unwrap()]);
    train(1, d, "wide.parquet", &dir, &["--max-steps", "3", "--checkpoint-dir", part.to_str().unwrap()]);
    let resumed = train(1, d, "wide.parquet", &dir, &["--max-steps", "6", "--checkpoint-dir", part.to_str().unwrap(), "--resume"]);
    assert_eq!(fnv(&resumed), fnv(&full6));
    let warm = train(1, d, "wide.parquet", &dir, &["--max-steps", "1", "--init-from", full.to_str().unwrap()]);
    assert!(warm["table_rows"].as_u64().unwrap() >= full6["table_rows"].as_u64().unwrap(), "the table carried over");

    // The model of 2 dense, 30 + 2 fields on data of 0 dense, 30 + 2: refused, naming both.
    let nodense = d.join("nodense.parquet");
    let job = ringrec(1, &dir, &["train", "--data", nodense.to_str().unwrap(), "--max-steps", "1", "--hidden", "32,16", "--init-from", full.to_str().unwrap()]);
    assert_ne!(job.code, Some(0));
    assert!(job.stderr.contains("dense features 2 there, 0 here"), "{}", job.all());
    let job = ringrec(1, &dir, &["predict", "--model", full.to_str().unwrap(), "--data", nodense.to_str().unwrap()]);
    assert_ne!(job.code, Some(0));
    assert!(job.stderr.contains("its rows have 0 dense, 30 single-hot and 2 multi-hot fields, and the model takes 2 dense and 32 categorical fields"), "{}", job.all());
}

#[test]
fn a_file_without_dense_columns_trains() {
    let Some(d) = data() else { return };
    let dir = common::scratch("fields-nodense");
    let s = train(2, d, "nodense.parquet", &dir, &["--epochs", "3"]);
    learns(&s);
    assert!(s["test_auc"].as_f64().unwrap() > 0.6, "{}", s["test_auc"]);
    // A dlrm's bottom MLP reads dense features: refused, naming the file's shape.
    let data = d.join("nodense.parquet");
    let job = ringrec(1, &dir, &["train", "--data", data.to_str().unwrap(), "--max-steps", "1", "--model", "dlrm"]);
    assert_ne!(job.code, Some(0));
    assert!(job.stderr.contains("0 dense, 30 single-hot and 2 multi-hot fields") && job.stderr.contains("needs dense features"), "{}", job.all());
    // Dense columns only: prepared, but no model learns without a key.
    let data = d.join("densecols.parquet");
    let job = ringrec(1, &dir, &["train", "--data", data.to_str().unwrap(), "--max-steps", "1"]);
    assert_ne!(job.code, Some(0));
    assert!(job.stderr.contains("no categorical column, single-hot or multi-hot (2 dense, 0 single-hot and 0 multi-hot fields)"), "{}", job.all());
}

#[test]
fn three_single_hot_columns_train_and_their_bundle_scores_in_bundle_predict_as_in_predict() {
    let Some(d) = data() else { return };
    let dir = common::scratch("fields-three");
    let ck = dir.join("ck");
    let s = train(2, d, "three.parquet", &dir, &["--epochs", "4", "--checkpoint-dir", ck.to_str().unwrap()]);
    learns(&s);
    let bundle = dir.join("bundle");
    ringrec(1, &dir, &["export", "--model", ck.to_str().unwrap(), "--out", bundle.to_str().unwrap()]).assert_ok();
    let model: serde_json::Value = serde_json::from_slice(&std::fs::read(bundle.join("model.json")).unwrap()).unwrap();
    assert_eq!((&model["input"]["dense_features"], &model["input"]["categorical_features"]), (&serde_json::json!(0), &serde_json::json!(3)));
    let (eval, scores) = (d.join("eval-three.parquet"), dir.join("scores"));
    let job = ringrec(1, &dir, &["predict", "--model", bundle.to_str().unwrap(), "--data", eval.to_str().unwrap(), "--out", scores.to_str().unwrap()]);
    job.assert_ok();
    assert_eq!(job.summary()["auc"].as_f64(), s["test_auc"].as_f64(), "the bundle scores as the run's evaluation");
    let py = common::test_python("numpy, pyarrow").unwrap();
    common::compare_with_predict(&py, "bundle_predict.py", &[bundle.to_str().unwrap(), eval.to_str().unwrap()], &scores, "1e-6");
}
