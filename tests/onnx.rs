//! The ONNX export (`ringrec export --format onnx`) checked by an independent implementation:
//! onnx's checker (full) passes every graph, ONNX Runtime scores the default model's
//! held-out rows within 1e-5 of `ringrec predict`, and every model of docs/models.md scores
//! random inputs as a numpy implementation of the spec does (scripts/onnx_check.py); a
//! multi-hot model's graph scores its pooled lists as `ringrec predict`. The
//! Python side needs the tests' venv (scripts/test-venv.sh; skipped without it, a failure
//! in CI).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::TempDir;
use ringrec::model::onnx::{self, CrossStructure, Net, Sizes};

const MODULES: &str = "numpy, onnx, onnxruntime";

fn check_script() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/onnx_check.py")
}

/// scripts/onnx_check.py on the bundle `b` against `ringrec predict`'s scores of the
/// held-out tenth of `data`: onnx's full checker, then ONNX Runtime within 1e-5.
fn onnx_against_predict(py: &str, b: &str, data: &str, scores: &Path) -> common::Job {
    common::compare_with_predict(py, "onnx_check.py", &["bundle", b, data, "--test-fraction", "0.1"], scores, "1e-5")
}

/// `ringrec ARGS` under mpirun with `np` ranks (a `train` on [`common::SMALL_TABLE`]), the
/// data cache under `dir`; its last JSON line.
fn ringrec_json(dir: &TempDir, np: usize, args: &[&str]) -> serde_json::Value {
    let data = dir.path("data");
    let job = common::mpirun(np, &[("RINGREC_DATA_DIR", data.to_str().expect("utf8"))], &common::small_table(args));
    job.assert_ok();
    let line = job.stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON line:\n{}", job.all()));
    serde_json::from_str(line).expect("JSON")
}

/// The number after `key = ` in the line of `text` that holds `key`.
fn figure(text: &str, key: &str) -> f64 {
    let line = text.lines().find(|l| l.contains(key)).unwrap_or_else(|| panic!("no {key:?} in:\n{text}"));
    let after = line.split(key).nth(1).and_then(|r| r.trim_start_matches(" = ").split_whitespace().next());
    after.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no number after {key:?}: {line}"))
}

#[test]
fn the_default_models_onnx_graph_scores_as_ringrec_predict() {
    let dir = TempDir::new("onnx");
    let data = dir.path("synth.tsv");
    common::synth(&data, 3000);
    let (d, ck, bundle) = (data.to_str().unwrap(), dir.path("ck"), dir.path("bundle"));
    let (ck_s, b_s) = (ck.to_str().unwrap(), bundle.to_str().unwrap());
    ringrec_json(&dir, 1, &["train", "--data", d, "--batch", "200", "--max-steps", "10", "--checkpoint-dir", ck_s, "--no-progress", "--json"]);
    let e = ringrec_json(&dir, 1, &["export", "--model", ck_s, "--out", b_s, "--format", "onnx", "--json"]);
    assert_eq!((e["onnx"].as_bool(), e["step"].as_u64()), (Some(true), Some(10)), "{e}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(bundle.join("model.json")).unwrap()).unwrap();
    let o = &json["onnx"];
    assert_eq!((o["file"].as_str(), o["opset"].as_i64(), o["ir_version"].as_i64(), o["model"].as_str()), (Some("model.onnx"), Some(onnx::OPSET), Some(onnx::IR_VERSION), Some("mlp")), "{json}");
    assert_eq!(std::fs::metadata(bundle.join("model.onnx")).unwrap().len(), o["bytes"].as_u64().unwrap());

    // ringrec predict on the bundle scores the held-out rows (the bundle opens with its
    // model.onnx checked).
    let scores = dir.path("scores.tsv");
    let p = ringrec_json(&dir, 1, &["predict", "--model", b_s, "--data", d, "--test-fraction", "0.1", "--out", scores.to_str().unwrap(), "--json"]);
    assert_eq!(p["rows"], 300);

    if let Some(py) = common::test_python(MODULES) {
        let job = onnx_against_predict(&py, b_s, d, &scores);
        assert!(job.stderr.contains("checker (full) passed") && job.stderr.contains("scored 300 rows"), "{}", job.stderr);
        let worst = figure(&job.stderr, "max |score - ringrec's|");
        assert!(worst <= 1e-5, "ONNX Runtime vs ringrec predict: {worst:e}");
        eprintln!("onnxruntime vs ringrec predict: max |difference| {worst:.3e} over 300 held-out rows");
    }

    // A damaged model.onnx makes the bundle refused, naming the file.
    let mo = bundle.join("model.onnx");
    let mut b = std::fs::read(&mo).unwrap();
    let at = b.len() / 2;
    b[at] ^= 0x10;
    std::fs::write(&mo, &b).unwrap();
    let data_dir = dir.path("data");
    let bad = common::mpirun(1, &[("RINGREC_DATA_DIR", data_dir.to_str().unwrap())], &["predict", "--model", b_s, "--data", d]);
    assert_eq!(bad.code, Some(1), "{}", bad.all());
    assert!(bad.stderr.contains("model.onnx") && bad.stderr.contains("model.json says"), "{}", bad.stderr);
}

/// A multi-hot model's graph takes each multi-hot field's pooled vector in its field's slot
/// of `emb` (the caller pools, as model.json's `input.multi_hot` says): onnx_check.py pools
/// a Parquet file's lists as scripts/bundle_predict.py does and ONNX Runtime scores as
/// `ringrec predict`.
#[test]
fn a_multi_hot_models_onnx_graph_takes_the_pooled_lists_and_scores_as_ringrec_predict() {
    let Some(py) = common::test_python("numpy, onnx, onnxruntime, pyarrow") else { return };
    let dir = TempDir::new("onnx-multihot");
    let data = dir.path("mh.parquet");
    ringrec::data::multihot::synth_multi_hot_cut(&data, 2000, 3, None).expect("synth");
    let (d, ck, bundle, scores) = (data.to_str().unwrap(), dir.path("ck"), dir.path("bundle"), dir.path("scores.tsv"));
    let (ck_s, b_s) = (ck.to_str().unwrap(), bundle.to_str().unwrap());
    let sparse = "c0,c1,c2,c3,c4,c5,c6,c7,c8,c9,l0,l1,l2,l3,l4,l5";
    ringrec_json(&dir, 1, &["train", "--data", d, "--sparse-columns", sparse, "--batch", "200", "--max-steps", "6", "--hidden", "16", "--multi-hot-pooling", "l2=mean", "--checkpoint-dir", ck_s, "--no-progress", "--json"]);
    ringrec_json(&dir, 1, &["export", "--model", ck_s, "--out", b_s, "--format", "onnx", "--json"]);
    let p = ringrec_json(&dir, 1, &["predict", "--model", b_s, "--data", d, "--sparse-columns", sparse, "--test-fraction", "0.1", "--out", scores.to_str().unwrap(), "--json"]);
    assert_eq!(p["rows"], 200);
    let job = onnx_against_predict(&py, b_s, d, &scores);
    assert!(job.stderr.contains("checker (full) passed") && job.stderr.contains("scored 200 rows"), "{}", job.stderr);
    let worst = figure(&job.stderr, "max |score - ringrec's|");
    assert!(worst <= 1e-5, "ONNX Runtime vs ringrec predict: {worst:e}");
}

/// Deterministic parameters uniform in [-a, a).
fn params(n: usize, a: f32, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n).map(|_| ((ringrec::hash::splitmix64_next(&mut state) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a).collect()
}

/// spec.json of a case: the model and its shape flags as docs/models.md names them.
fn spec(net: &Net, s: Sizes) -> serde_json::Value {
    let mut j = serde_json::json!({"model": net.name(), "fields": s.fields, "dim": s.dim, "dense": s.dense});
    let (hidden, extra) = match net {
        Net::Mlp { hidden } | Net::DeepFm { hidden } | Net::WideDeep { hidden, .. } => (hidden, serde_json::json!({})),
        Net::Dlrm { bottom, hidden, interaction_self } => (hidden, serde_json::json!({"bottom": bottom, "interaction_self": interaction_self})),
        Net::Dcn { layers, rank, structure, hidden } => {
            let st = if *structure == CrossStructure::Stacked { "stacked" } else { "parallel" };
            (hidden, serde_json::json!({"cross_layers": layers, "cross_rank": rank, "cross_structure": st}))
        }
    };
    j["hidden"] = serde_json::json!(hidden);
    for (k, v) in extra.as_object().unwrap() {
        j[k] = v.clone();
    }
    j
}

/// Writes a case directory: model.onnx, spec.json, params.bin (parameters in [-a, a)).
fn write_case(dir: &Path, net: &Net, s: Sizes, a: f32, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let p = params(onnx::param_count(net, s).unwrap(), a, seed);
    std::fs::write(dir.join("model.onnx"), onnx::encode(net, s, &p).unwrap()).unwrap();
    std::fs::write(dir.join("spec.json"), spec(net, s).to_string()).unwrap();
    std::fs::write(dir.join("params.bin"), p.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
}

#[test]
fn every_models_graph_scores_as_a_numpy_reference_of_the_spec() {
    let dir = TempDir::new("onnx-models");
    let h = vec![16, 8];
    // (name, model, dim, parameter range): ranges that keep the scores spread (the script
    // refuses a comparison of scores that hardly vary).
    let cases = [
        ("mlp", Net::Mlp { hidden: h.clone() }, 8, 0.25),
        ("mlp-linear", Net::Mlp { hidden: vec![] }, 4, 0.1),
        ("dlrm", Net::Dlrm { bottom: vec![16], hidden: h.clone(), interaction_self: false }, 8, 0.25),
        ("dlrm-self", Net::Dlrm { bottom: vec![12, 6], hidden: vec![8], interaction_self: true }, 4, 0.25),
        ("dcn-full-stacked", Net::Dcn { layers: 3, rank: 0, structure: CrossStructure::Stacked, hidden: h.clone() }, 4, 0.1),
        ("dcn-lowrank-parallel", Net::Dcn { layers: 2, rank: 8, structure: CrossStructure::Parallel, hidden: h.clone() }, 8, 0.1),
        ("deepfm", Net::DeepFm { hidden: h.clone() }, 8, 0.1),
        ("wide-deep", Net::WideDeep { hidden: h.clone(), field_dims: vec![] }, 8, 0.1),
    ];
    let mut dirs = Vec::new();
    for (i, (name, net, dim, a)) in cases.iter().enumerate() {
        let d = dir.path(name);
        write_case(&d, net, Sizes::criteo(*dim), *a, 1000 + i as u64);
        dirs.push(d);
    }
    let Some(py) = common::test_python(MODULES) else { return };
    let mut c = Command::new(py);
    c.arg(check_script()).args(["reference", "--rows", "64", "--tolerance", "1e-5"]).args(&dirs);
    let job = common::run_with_timeout(c, Duration::from_secs(300));
    eprintln!("{}", job.stderr);
    job.assert_ok();
    assert!(job.stderr.contains(&format!("{0} of {0} graphs agree", cases.len())), "{}", job.stderr);
}

/// Each model of docs/models.md trained a few steps, exported with `--format onnx`: ONNX
/// Runtime scores its held-out rows within 1e-5 of `ringrec predict` on the same bundle.
#[test]
fn every_trained_models_onnx_graph_scores_as_ringrec_predict() {
    let dir = TempDir::new("onnx-trained");
    let data = dir.path("synth.tsv");
    common::synth(&data, 2000);
    let d = data.to_str().unwrap();
    let cases: [(&str, &[&str]); 5] = [
        ("dlrm", &["--model", "dlrm", "--bottom-mlp", "32"]),
        ("dlrm-self", &["--model", "dlrm", "--interaction-self"]),
        ("dcn", &["--model", "dcn", "--cross-layers", "2", "--cross-rank", "4", "--cross-structure", "parallel"]),
        ("deepfm", &["--model", "deepfm"]),
        ("wide-deep", &["--model", "wide-deep"]),
    ];
    let py = common::test_python(MODULES);
    for (name, flags) in cases {
        let (ck, bundle, scores) = (dir.path(&format!("ck-{name}")), dir.path(&format!("bundle-{name}")), dir.path(&format!("scores-{name}.tsv")));
        let (ck_s, b_s) = (ck.to_str().unwrap(), bundle.to_str().unwrap());
        let mut args = vec!["train", "--data", d, "--batch", "200", "--max-steps", "6", "--hidden", "32,16", "--checkpoint-dir", ck_s, "--no-progress", "--json"];
        args.extend_from_slice(flags);
        ringrec_json(&dir, 1, &args);
        let e = ringrec_json(&dir, 1, &["export", "--model", ck_s, "--out", b_s, "--format", "onnx", "--json"]);
        assert_eq!(e["onnx"].as_bool(), Some(true), "{name}: {e}");
        let p = ringrec_json(&dir, 1, &["predict", "--model", b_s, "--data", d, "--test-fraction", "0.1", "--out", scores.to_str().unwrap(), "--json"]);
        assert_eq!(p["rows"], 200, "{name}");
        if let Some(py) = &py {
            let job = onnx_against_predict(py, b_s, d, &scores);
            let worst = figure(&job.stderr, "max |score - ringrec's|");
            assert!(worst <= 1e-5, "{name}: ONNX Runtime vs ringrec predict: {worst:e}");
            eprintln!("{name}: onnxruntime vs ringrec predict: max |difference| {worst:.3e} over 200 held-out rows");
        }
    }
}
