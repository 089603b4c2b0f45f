//! Using a trained model under real mpirun: `ringrec predict` gives `train`'s evaluation
//! scores bit for bit, an export bundle gives the checkpoint's scores, the independent
//! Python reader reproduces them within 1e-6, and a warm start (`train --init-from`) from
//! a checkpoint continues bit-identically.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::TempDir;

/// `ringrec ARGS` under mpirun with `np` ranks, the data cache under `dir`; a `train` on
/// [`common::SMALL_TABLE`].
fn ringrec(dir: &TempDir, np: usize, env: &[(&str, &str)], args: &[&str]) -> common::Job {
    let data = dir.path("data");
    let mut e = vec![("RINGREC_DATA_DIR", data.to_str().expect("utf8"))];
    e.extend_from_slice(env);
    common::mpirun(np, &e, &common::small_table(args))
}

/// The last JSON line of a job's stdout.
fn json(job: &common::Job) -> serde_json::Value {
    job.assert_ok();
    let line = job.stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON line:\n{}", job.all()));
    serde_json::from_str(line).expect("JSON")
}

/// `score<TAB>label` lines as (score, label).
fn scores(path: &Path) -> Vec<(f32, f32)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| {
            let (s, y) = l.split_once('\t').unwrap_or_else(|| panic!("not score<TAB>label: {l:?}"));
            (s.parse().expect("score"), y.parse().expect("label"))
        })
        .collect()
}

/// A python3 that has numpy (the test venv's, target/test-venv, first), or why there is none.
fn python() -> Result<String, String> {
    let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/target/test-venv/bin/python");
    for p in [venv, "python3", "/usr/bin/python3"] {
        if Command::new(p).args(["-c", "import numpy"]).output().is_ok_and(|o| o.status.success()) {
            return Ok(p.to_string());
        }
    }
    Err("no python3 with numpy (scripts/setup.sh --tests installs python3-numpy)".into())
}

/// Specs of every model and shape over Criteo's input (dim 4, small MLPs).
fn every_model() -> Vec<ringrec::model::ModelSpec> {
    use ringrec::model::{CrossStructure, ModelKind, ModelSpec};
    let base = ModelSpec::mlp(26, 4, 13, vec![8, 4]);
    vec![
        base.clone(),
        ModelSpec { kind: ModelKind::Dlrm, bottom: vec![8], ..base.clone() },
        ModelSpec { kind: ModelKind::Dlrm, bottom: vec![], interaction_self: true, ..base.clone() },
        ModelSpec { kind: ModelKind::Dcn, cross_layers: 2, ..base.clone() },
        ModelSpec { kind: ModelKind::Dcn, cross_layers: 2, cross_rank: 3, cross_structure: CrossStructure::Parallel, ..base.clone() },
        ModelSpec { kind: ModelKind::DeepFm, ..base.clone() },
        ModelSpec { kind: ModelKind::WideDeep, hidden: vec![6], ..base },
    ]
}

#[test]
fn the_python_reader_scores_every_model_as_its_definition_says() {
    // Bundles of every model with random parameters and rows, written by ringrec's own
    // writer; tests/bundle_models.py scores them with scripts/bundle_predict.py and with a
    // second implementation of the definition (per sample, by model.json's tensors).
    use ringrec::embedding::{EmbeddingTable, TableConfig};
    use ringrec::model::DenseWeights;
    use ringrec::train::bundle::{self, Provenance};
    let py = match python() {
        Err(why) => return eprintln!("skipped: the Python reader: {why}"),
        Ok(py) => py,
    };
    let dir = TempDir::new("bundle-models");
    let data = dir.path("d.tsv");
    common::synth(&data, 200);
    let mut bundles = Vec::new();
    for (i, spec) in every_model().into_iter().enumerate() {
        let random = |n: usize, salt: u64| (0..n as u64).map(|j| ((j.wrapping_add(salt).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.5).collect::<Vec<f32>>();
        let w = DenseWeights { params: random(spec.num_params(), i as u64), spec: spec.clone() };
        let mut cfg = TableConfig::new(spec.row_width() as u32, 1 << 10);
        cfg.init_scale = Some(0.5);
        let mut table = EmbeddingTable::create(&dir.path(&format!("t{i}")), &cfg).unwrap();
        // A few keys held (the data's keys are not: they read as their initial rows).
        table.put_rows(&[1, 2, 3], &random(3 * spec.row_width(), 99)).unwrap();
        let out = dir.path(&format!("b{i}"));
        bundle::write(&out, Provenance { source: Path::new("ck"), step: 3, skipped: &[] }, &w, &table, bundle::Format::Bundle).unwrap();
        bundles.push(out);
    }
    let mut c = Command::new(py);
    c.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/bundle_models.py")).arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bundle_predict.py")).arg(&data).args(&bundles);
    let job = common::run_with_timeout(c, Duration::from_secs(300));
    job.assert_ok();
    for kind in ["mlp", "dlrm", "dcn", "deepfm", "wide-deep"] {
        assert!(job.stdout.lines().any(|l| l.starts_with(kind) && l.contains("200 rows")), "{kind}: {}", job.all());
    }
    eprintln!("{}", job.stdout);
}

#[test]
fn predict_gives_the_evaluation_scores_and_the_bundle_and_python_reader_agree() {
    let dir = TempDir::new("predict");
    let data = dir.path("synth.tsv");
    common::synth(&data, 3000);
    let (d, ck, bundle) = (data.to_str().unwrap(), dir.path("ck"), dir.path("bundle"));
    let ck_s = ck.to_str().unwrap();
    // Train 2 ranks, 10 steps, the last 10% held out and evaluated at the end.
    let t = json(&ringrec(&dir, 2, &[], &["train", "--data", d, "--batch", "200", "--max-steps", "10", "--checkpoint-dir", ck_s, "--no-progress", "--json"]));
    assert_eq!(t["test_rows"], 300);
    let (auc, logloss) = (t["test_auc"].as_f64().expect("AUC"), t["test_logloss"].as_f64().expect("logloss"));

    // Predict the held-out rows with the same rank count and batch: the evaluation's exact
    // scores, so AUC and log loss (f64 sums over every score) are equal to the last bit.
    let out2 = dir.path("ck2.tsv");
    let p = json(&ringrec(&dir, 2, &[], &["predict", "--model", ck_s, "--data", d, "--test-fraction", "0.1", "--batch", "200", "--out", out2.to_str().unwrap(), "--json"]));
    assert_eq!(p["rows"], 300);
    assert_eq!(p["step"], 10);
    assert_eq!(p["auc"].as_f64(), Some(auc), "predict's AUC differs from train's evaluation");
    assert_eq!(p["logloss"].as_f64(), Some(logloss), "predict's log loss differs from train's evaluation");
    assert!(auc > 0.55, "a trained model ranks better than chance: AUC {auc}");
    let s2 = scores(&out2);
    assert_eq!(s2.len(), 300);

    // 4 ranks as 2 simulated hosts (each host leader fills its table), another batch: the
    // same rows and labels, scores within 1e-6 (the GEMM rounds by the batch's shape).
    let out4 = dir.path("ck4.tsv");
    let p4 = json(&ringrec(&dir, 4, &[("RINGREC_RANKS_PER_HOST", "2")], &["predict", "--model", ck_s, "--data", d, "--test-fraction", "0.1", "--batch", "64", "--out", out4.to_str().unwrap(), "--json"]));
    assert_eq!((p4["ranks"].as_u64(), p4["hosts"].as_u64()), (Some(4), Some(2)));
    let s4 = scores(&out4);
    assert_eq!(s4.len(), s2.len());
    let worst = s2.iter().zip(&s4).map(|(a, b)| {
        assert_eq!(a.1, b.1, "labels differ: not the same rows in the same order");
        (a.0 - b.0).abs()
    });
    let worst = worst.fold(0f32, f32::max);
    assert!(worst <= 1e-6, "4 ranks: scores differ by {worst:e}");
    assert!((p4["auc"].as_f64().unwrap() - auc).abs() < 1e-4);

    // The export bundle scores exactly as its checkpoint (same table values, same initial
    // rows of keys it lacks).
    let e = json(&ringrec(&dir, 1, &[], &["export", "--model", ck_s, "--out", bundle.to_str().unwrap(), "--json"]));
    assert_eq!(e["step"], 10);
    assert!(e["rows"].as_u64().unwrap() > 1000, "{e}");
    let outb = dir.path("bundle2.tsv");
    json(&ringrec(&dir, 2, &[], &["predict", "--model", bundle.to_str().unwrap(), "--data", d, "--test-fraction", "0.1", "--batch", "200", "--out", outb.to_str().unwrap(), "--json"]));
    assert_eq!(std::fs::read(&outb).unwrap(), std::fs::read(&out2).unwrap(), "the bundle's scores differ from the checkpoint's");

    // The independent Python reader on every row of the file, against ringrec predict.
    let all = dir.path("all.tsv");
    let pa = json(&ringrec(&dir, 2, &[], &["predict", "--model", bundle.to_str().unwrap(), "--data", d, "--out", all.to_str().unwrap(), "--json"]));
    assert_eq!(pa["rows"], 3000);
    match python() {
        Err(why) => eprintln!("skipped: the Python reader: {why}"),
        Ok(py) => {
            let job = common::compare_with_predict(&py, "bundle_predict.py", &[bundle.to_str().unwrap(), d], &all, "1e-6");
            let line = job.stderr.lines().find(|l| l.contains("max |score - ringrec's|")).unwrap_or_else(|| panic!("{}", job.all()));
            let worst: f64 = line.split(" = ").nth(1).and_then(|r| r.split_whitespace().next()).and_then(|v| v.parse().ok()).expect("max difference");
            assert!(worst <= 1e-6, "{line}");
            assert!(job.stderr.contains("3000 rows scored"), "{}", job.stderr);
            eprintln!("python reader vs ringrec predict: {line}");
        }
    }

    // A damaged bundle is refused, naming the file; an existing --out is never overwritten.
    let tb = bundle.join("table.bin");
    let mut b = std::fs::read(&tb).unwrap();
    b[100] ^= 0x40;
    std::fs::write(&tb, &b).unwrap();
    let bad = ringrec(&dir, 1, &[], &["predict", "--model", bundle.to_str().unwrap(), "--data", d]);
    assert_eq!(bad.code, Some(1), "{}", bad.all());
    assert!(bad.stderr.contains("table.bin: checksum mismatch"), "{}", bad.stderr);
    let again = ringrec(&dir, 1, &[], &["export", "--model", ck_s, "--out", bundle.to_str().unwrap()]);
    assert!(again.stderr.contains("exists; remove it or choose another --out"), "{}", again.all());
}

#[test]
fn warm_start_from_a_checkpoint_continues_bit_identically() {
    // Day A (6 steps of 240 rows), then day B (5 steps) warm-started from A's checkpoint,
    // against one run over A then B (11 steps): the same data order, Adam's moments and
    // step count and the table's Adagrad accumulators carried.
    let dir = TempDir::new("warm");
    let all = dir.path("all.tsv");
    common::synth(&all, 2640);
    let text = std::fs::read_to_string(&all).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let write = |name: &str, rows: &[&str]| {
        let p = dir.path(name);
        std::fs::write(&p, rows.join("\n") + "\n").unwrap();
        p.to_str().unwrap().to_string()
    };
    let (a, b, ab) = (write("a.tsv", &lines[..1440]), write("b.tsv", &lines[1440..]), write("ab.tsv", &lines));
    let common = ["--batch", "240", "--test-fraction", "0", "--sparse-optimizer", "adagrad", "--no-progress", "--json"];
    let run = |data: &str, ck: &str, extra: &[&str]| {
        let (ckp, mut args) = (dir.path(ck), vec!["train", "--data", data, "--checkpoint-dir"]);
        args.push(ckp.to_str().unwrap());
        args.extend_from_slice(&common);
        args.extend_from_slice(extra);
        ringrec(&dir, 2, &[], &args)
    };
    let table = |ck: &str| {
        let d = dir.path(ck);
        let step = ringrec::train::checkpoint::latest_step(&d).expect("a checkpoint");
        std::fs::read(ringrec::train::checkpoint::step_dir(&d, step).join("table.rrt")).unwrap()
    };
    json(&run(&a, "ckA", &[]));
    let ck_a = dir.path("ckA");
    let warm = run(&b, "ckB", &["--init-from", ck_a.to_str().unwrap()]);
    let sw = json(&warm);
    assert!(warm.stderr.contains("warm start from the checkpoint of step 6"), "{}", warm.stderr);
    assert!(warm.stderr.contains("its adam state carried (optimizer step 6"), "{}", warm.stderr);
    assert!(warm.stderr.contains("the table's Adagrad accumulators carried"), "{}", warm.stderr);
    assert_eq!(sw["steps"], 5, "a warm start is a new run: steps count from 0");
    let sf = json(&run(&ab, "ckAB", &[]));
    assert_eq!(sf["steps"], 11);
    assert_eq!(sw["params_fnv"], sf["params_fnv"], "dense parameters differ from the uninterrupted run");
    assert!(table("ckB") == table("ckAB"), "the tables differ from the uninterrupted run's");

    // From the export bundle: no optimizer state; it says so and ends elsewhere.
    let bundle = dir.path("bundleA");
    json(&ringrec(&dir, 1, &[], &["export", "--model", ck_a.to_str().unwrap(), "--out", bundle.to_str().unwrap(), "--json"]));
    let cold = run(&b, "ckC", &["--init-from", bundle.to_str().unwrap()]);
    let sc = json(&cold);
    assert!(cold.stderr.contains("no optimizer state in it: adam starts anew; the table's Adagrad accumulators start anew (so this run will not be bit-identical to one that never stopped"), "{}", cold.stderr);
    assert_ne!(sc["params_fnv"], sf["params_fnv"], "without Adam's moments the run cannot end where the uninterrupted one does");

    // Plain SGD on both sides has no state to lose: from the export bundle, the continued
    // run ends where the uninterrupted one does, bit for bit, and says nothing is lost.
    let sgd = |data: &str, ck: &str, extra: &[&str]| {
        let (ckp, mut args) = (dir.path(ck), vec!["train", "--data", data, "--checkpoint-dir"]);
        args.push(ckp.to_str().unwrap());
        args.extend_from_slice(&["--batch", "240", "--test-fraction", "0", "--dense-optimizer", "sgd", "--lr", "0.05", "--no-progress", "--json"]);
        args.extend_from_slice(extra);
        ringrec(&dir, 2, &[], &args)
    };
    json(&sgd(&a, "sA", &[]));
    let sgd_bundle = dir.path("bundleS");
    json(&ringrec(&dir, 1, &[], &["export", "--model", dir.path("sA").to_str().unwrap(), "--out", sgd_bundle.to_str().unwrap(), "--json"]));
    let from_bundle = sgd(&b, "sB", &["--init-from", sgd_bundle.to_str().unwrap()]);
    assert!(!from_bundle.stderr.contains("bit-identical"), "nothing is lost with sgd: {}", from_bundle.stderr);
    let uninterrupted = json(&sgd(&ab, "sAB", &[]));
    assert_eq!(json(&from_bundle)["params_fnv"], uninterrupted["params_fnv"], "sgd from the bundle must continue bit-identically");
}

#[test]
fn warm_start_refuses_another_shape_naming_the_flag_and_both_values() {
    let dir = TempDir::new("warm-refuse");
    let data = dir.path("d.tsv");
    common::synth(&data, 800);
    let d = data.to_str().unwrap();
    let ck = dir.path("ck");
    json(&ringrec(&dir, 1, &[], &["train", "--data", d, "--batch", "200", "--max-steps", "2", "--checkpoint-dir", ck.to_str().unwrap(), "--hidden", "32", "--no-progress", "--json"]));
    let c = ck.to_str().unwrap();
    let base = ["train", "--data", d, "--batch", "200", "--max-steps", "1", "--no-progress", "--init-from", c];
    let refused = |extra: &[&str], want: &str| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        let job = ringrec(&dir, 1, &[], &args);
        assert_eq!(job.code, Some(1), "{extra:?} must be refused:\n{}", job.all());
        assert!(job.stderr.contains(want), "{extra:?}: expected {want:?} in:\n{}", job.stderr);
    };
    refused(&["--hidden", "32", "--dim", "8"], &format!("--init-from {c}: its table has dim 16, this run has --dim 8"));
    refused(&["--hidden", "64"], "its dense model is not this run's: --hidden 32 there, 64 here (its mlp 429-32-1, this run's mlp 429-64-1); its table's rows (16 values) fit this run's: to start from them with new dense parameters, export them (ringrec table export");
    refused(&["--hidden", "32", "--sparse-optimizer", "adagrad"], "its table holds the state of --sparse-optimizer sgd, this run has --sparse-optimizer adagrad");
    refused(&["--hidden", "32", "--checkpoint-dir", c, "--resume"], "--init-from and --resume are exclusive");
    refused(&["--hidden", "32", "--checkpoint-dir", c], "--init-from and --checkpoint-dir are the same directory");
    // predict needs dense weights: a sparse-parameter file alone is refused.
    let params = dir.path("t.params");
    let step = ringrec::train::checkpoint::latest_step(&ck).expect("checkpoint");
    let table = ringrec::train::checkpoint::step_dir(&ck, step).join("table.rrt");
    let mut c2 = Command::new(env!("CARGO_BIN_EXE_ringrec"));
    c2.args(["table", "export", table.to_str().unwrap(), "--params", "--out", params.to_str().unwrap()]);
    common::run_with_timeout(c2, Duration::from_secs(60)).assert_ok();
    let job = ringrec(&dir, 1, &[], &["predict", "--model", params.to_str().unwrap(), "--data", d]);
    assert!(job.stderr.contains("a sparse-parameter file holds no dense weights"), "{}", job.all());
    // ... and with dense weights it warm-starts (the table's rows, new optimizers).
    let mut args = base.to_vec();
    let last = args.len() - 1;
    args[last] = params.to_str().unwrap();
    args.extend_from_slice(&["--hidden", "32"]);
    let job = ringrec(&dir, 1, &[], &args);
    job.assert_ok();
    assert!(job.stderr.contains("warm start from the sparse-parameter file") && job.stderr.contains("dense parameters initialised from --seed 1"), "{}", job.stderr);
}

/// `a` then `b`.
fn joined<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<&'a str> {
    [a, b].concat()
}

/// `train` flags of a small model of each kind besides mlp.
const MODEL_FLAGS: &[&[&str]] = &[
    &["--model", "dlrm", "--bottom-mlp", "16", "--hidden", "32,16"],
    &["--model", "dlrm", "--interaction-self", "--bottom-mlp", "16", "--hidden", "32"],
    &["--model", "dcn", "--cross-layers", "2", "--hidden", "32,16"],
    &["--model", "dcn", "--cross-layers", "2", "--cross-rank", "4", "--cross-structure", "parallel", "--hidden", "32"],
    &["--model", "deepfm", "--hidden", "32,16"],
    &["--model", "wide-deep", "--hidden", "32"],
];

#[test]
fn every_model_predicts_its_evaluation_exports_resumes_and_warm_starts() {
    let dir = TempDir::new("models");
    let data = dir.path("synth.tsv");
    common::synth(&data, 1500);
    let d = data.to_str().unwrap();
    let py = python();
    for (i, flags) in MODEL_FLAGS.iter().enumerate() {
        let kind = flags[1];
        let (ck, bundle) = (dir.path(&format!("ck{i}")), dir.path(&format!("bundle{i}")));
        let (ck_s, b_s) = (ck.to_str().unwrap(), bundle.to_str().unwrap());
        // Train 2 ranks, 6 steps, the last 10% evaluated; predict gives the evaluation's bits.
        let t = json(&ringrec(&dir, 2, &[], &joined(&["train", "--data", d, "--batch", "200", "--max-steps", "6", "--checkpoint-dir", ck_s, "--no-progress", "--json"], flags)));
        let out = dir.path(&format!("ck{i}.tsv"));
        let p = json(&ringrec(&dir, 2, &[], &["predict", "--model", ck_s, "--data", d, "--test-fraction", "0.1", "--batch", "200", "--out", out.to_str().unwrap(), "--json"]));
        assert_eq!(p["auc"].as_f64(), t["test_auc"].as_f64(), "{kind}: predict's AUC differs from train's evaluation");
        assert_eq!(p["logloss"].as_f64(), t["test_logloss"].as_f64(), "{kind}: predict's log loss differs from train's evaluation");
        assert!(p["model_spec"].as_str().unwrap().starts_with(kind), "{p}");
        // The bundle: its model.json names the model, it scores as its checkpoint.
        let e = json(&ringrec(&dir, 1, &[], &["export", "--model", ck_s, "--out", b_s, "--json"]));
        assert!(e["model"].as_str().unwrap().starts_with(kind), "{e}");
        let m: serde_json::Value = serde_json::from_slice(&std::fs::read(bundle.join("model.json")).unwrap()).unwrap();
        assert_eq!((m["version"].as_u64(), m["model"]["kind"].as_str()), (Some(3), Some(kind)));
        let outb = dir.path(&format!("bundle{i}.tsv"));
        json(&ringrec(&dir, 2, &[], &["predict", "--model", b_s, "--data", d, "--test-fraction", "0.1", "--batch", "200", "--out", outb.to_str().unwrap(), "--json"]));
        assert_eq!(std::fs::read(&outb).unwrap(), std::fs::read(&out).unwrap(), "{kind}: the bundle's scores differ from the checkpoint's");
        match &py {
            Err(why) => eprintln!("skipped: the Python reader: {why}"),
            Ok(py) => {
                let job = common::compare_with_predict(py, "bundle_predict.py", &[b_s, d, "--test-fraction", "0.1"], &out, "1e-6");
                eprintln!("{kind}: {}", job.stderr.lines().last().unwrap_or_default());
            }
        }
        // A resume with another model or shape is refused naming the flag.
        let resume = |extra: &[&str]| {
            let mut args = vec!["train", "--data", d, "--batch", "200", "--max-steps", "8", "--checkpoint-dir", ck_s, "--resume", "--no-progress"];
            args.extend_from_slice(extra);
            ringrec(&dir, 2, &[], &args)
        };
        let other = resume(&["--hidden", "32"]);
        assert!(other.stderr.contains(&format!("--model: the checkpoint was written with {kind}, this run has mlp")), "{kind}: {}", other.all());
        let mut shape = flags.to_vec();
        let h = shape.iter().position(|f| *f == "--hidden").unwrap();
        shape[h + 1] = "8";
        let other = resume(&shape);
        assert!(other.stderr.contains("--hidden: the checkpoint was written with"), "{kind}: {}", other.all());
        json(&resume(&[&flags[..], &["--json"]].concat()));
        // --init-from: the same model warm-starts; another is refused naming what differs,
        // and says how to carry the table when its rows fit.
        let warm = ringrec(&dir, 1, &[], &joined(&["train", "--data", d, "--batch", "200", "--max-steps", "2", "--init-from", ck_s, "--no-progress"], flags));
        warm.assert_ok();
        assert!(warm.stderr.contains("warm start from the checkpoint of step"), "{}", warm.stderr);
        let mlp = ringrec(&dir, 1, &[], &["train", "--data", d, "--batch", "200", "--max-steps", "2", "--init-from", ck_s, "--hidden", "32", "--no-progress"]);
        assert_eq!(mlp.code, Some(1), "{kind} -> mlp must be refused: {}", mlp.all());
        let want = if kind == "deepfm" || kind == "wide-deep" { "its table's rows have 17 values".to_string() } else { format!("its dense model is not this run's: --model {kind} there, mlp here") };
        assert!(mlp.stderr.contains(&want), "{kind}: {}", mlp.stderr);
    }
}
