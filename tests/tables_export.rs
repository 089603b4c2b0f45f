//! A `--table` model (fields in tables of their own, issue 33 point 4) goes everywhere a
//! one-table model goes: `ringrec export` writes every table into the bundle (model.json
//! records the layout), and the bundle scores as the checkpoint in `ringrec predict`
//! (bit for bit), in scripts/bundle_predict.py (numpy, pyarrow: within 1e-6), in ONNX
//! Runtime (within 1e-5) and in `ringrec serve-model` (bit for bit), with tables of
//! different dims (an mlp, a dcn, a wide-deep: rows of each dim + 1, model.json's
//! `field_dims`) and of one dim (a deepfm, rows of dim + 1); `--init-from` such a
//! checkpoint or bundle with the same tables trains as the one-table path does from the
//! one-table model, another layout is refused naming both; a bundle missing a table file,
//! with one cut short, or whose layout does not match its tables is refused naming it.
//! The Python side needs the tests' venv (scripts/test-venv.sh; skipped without it).

mod common;
#[path = "common/server.rs"]
mod server;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{json, Value};
use server::{multi_hot_rows, Server};

/// Every column of the multi-hot set read as categorical (10 single-hot, 6 lists).
const SPARSE: &str = "c0,c1,c2,c3,c4,c5,c6,c7,c8,c9,l0,l1,l2,l3,l4,l5";
const ROWS: u64 = 1200;
/// Two tables of the default dim beside the default one: single-hot and list fields in each.
const TWO_TABLES: [&str; 4] = ["--table", "c3,l0=items", "--table", "c1,c2,l5=more"];
/// Two tables of other dims.
const TWO_DIMS: [&str; 4] = ["--table", "c3,l0=items:dim=8", "--table", "c1,c2,l5=more:dim=4"];

/// The multi-hot set, written once.
fn data() -> &'static PathBuf {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(|| {
        let p = common::shared_scratch("tables-export-data").join("mh.parquet");
        ringrec::data::multihot::synth_multi_hot_cut(&p, ROWS, 5, None).unwrap();
        p
    })
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf8")
}

/// `ringrec ARGS` at one rank (a `train` on [`common::SMALL_TABLE`]), the data cache under
/// `dir`.
fn ringrec(dir: &Path, args: &[&str]) -> common::Job {
    common::mpirun(1, &[("RINGREC_DATA_DIR", s(&dir.join("cache")))], &common::small_table(args))
}

/// `ringrec train` on the set with `extra` flags, checkpoints in `ck`: its summary.
fn train(dir: &Path, ck: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["train", "--data", s(data()), "--sparse-columns", SPARSE, "--batch", "200", "--hidden", "16", "--threads", "2", "--device", "cpu", "--checkpoint-dir", s(ck), "--no-progress", "--json"];
    args.extend_from_slice(extra);
    let job = ringrec(dir, &args);
    job.assert_ok();
    job.summary()
}

/// `ringrec predict` of every row of the set with `model`, in batches of 64: the scores.
fn predict(dir: &Path, model: &Path, out: &Path) -> Vec<f32> {
    ringrec(dir, &["predict", "--model", s(model), "--data", s(data()), "--sparse-columns", SPARSE, "--batch", "64", "--threads", "2", "--out", s(out)]).assert_ok();
    common::read_scores(out)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn fnv(s: &Value) -> String {
    s["params_fnv"].as_str().expect("params_fnv").to_string()
}

#[test]
fn a_table_models_bundle_scores_as_predict_in_the_reader_onnx_runtime_and_the_server() {
    let py = common::test_python("numpy, pyarrow");
    let onnx_py = common::test_python("numpy, pyarrow, onnx, onnxruntime");
    let pooling = ["--multi-hot-pooling", "l1=mean,l5=mean"];
    for (name, flags, widths, onnx) in [
        ("mlp-dims", [&TWO_DIMS[..], &pooling[..]].concat(), (8usize, 4usize), true),
        ("dcn-dims", vec!["--model", "dcn", "--table", "c0,l2=items:dim=4", "--table", "l3=more:dim=24"], (4, 24), false),
        ("deepfm-same", [&["--model", "deepfm"][..], &TWO_TABLES[..]].concat(), (17, 17), false),
        ("wide-deep-dims", [&["--model", "wide-deep"][..], &TWO_DIMS[..], &pooling[..]].concat(), (9, 5), true),
    ] {
        let dir = common::scratch(&format!("tables-export-{name}"));
        let (ck, bundle) = (dir.join("ck"), dir.join("bundle"));
        train(&dir, &ck, &[&flags[..], &["--max-steps", "6"]].concat());
        let want = predict(&dir, &ck, &dir.join("ck.tsv"));
        let format = if onnx { "onnx" } else { "bundle" };
        let e = ringrec(&dir, &["export", "--model", s(&ck), "--out", s(&bundle), "--format", format, "--json"]);
        e.assert_ok();
        assert_eq!(e.summary()["tables"], json!(["table.items.bin", "table.more.bin"]), "{name}");

        // model.json: version 4, every table with its file, each field's table and width.
        let m: Value = serde_json::from_slice(&std::fs::read(bundle.join("model.json")).unwrap()).unwrap();
        assert_eq!(m["version"], 4, "{name}");
        let named: Vec<(&str, &str, u64)> = m["tables"]["named"].as_array().unwrap().iter().map(|t| (t["name"].as_str().unwrap(), t["file"].as_str().unwrap(), t["dim"].as_u64().unwrap())).collect();
        assert_eq!(named, [("items", "table.items.bin", widths.0 as u64), ("more", "table.more.bin", widths.1 as u64)], "{name}");
        let fields = m["tables"]["fields"].as_array().unwrap();
        assert_eq!(fields.len(), 16, "{name}: every field");
        let items = fields.iter().find(|f| f["table"] == "table.items.bin").unwrap();
        assert_eq!(items["width"].as_u64(), Some(widths.0 as u64), "{name}");
        assert_eq!(fields.iter().filter(|f| f["multi_hot"] == true).count(), 6, "{name}");
        for t in ["table.bin", "table.items.bin", "table.more.bin"] {
            assert!(bundle.join(t).is_file(), "{name}: {t}");
        }

        // predict on the bundle: the checkpoint's bits.
        let got = predict(&dir, &bundle, &dir.join("bundle.tsv"));
        assert_eq!(bits(&got), bits(&want), "{name}: the bundle scores as its checkpoint");
        // At 2 ranks (each host table filled once, mapped by the other rank): the same scores
        // within a few units in the last place (other batches).
        let two = dir.join("bundle-2.tsv");
        common::mpirun(2, &[("RINGREC_DATA_DIR", s(&dir.join("cache")))], &["predict", "--model", s(&bundle), "--data", s(data()), "--sparse-columns", SPARSE, "--batch", "64", "--threads", "1", "--out", s(&two)]).assert_ok();
        let worst = common::read_scores(&two).iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst <= 1e-6, "{name}: 2 ranks score within 1e-6 of one: {worst:e}");
        let Some(py) = &py else { continue };
        // The independent reader (numpy, pyarrow): within 1e-6.
        let job = common::compare_with_predict(py, "bundle_predict.py", &[s(&bundle), s(data())], &dir.join("ck.tsv"), "1e-6");
        eprintln!("{name}: {}", job.stderr.trim());
        if let (true, Some(opy)) = (onnx, &onnx_py) {
            let job = common::compare_with_predict(opy, "onnx_check.py", &["bundle", s(&bundle), s(data())], &dir.join("ck.tsv"), "1e-5");
            assert!(job.stderr.contains("checker (full) passed"), "{}", job.stderr);
            eprintln!("{name}: {}", job.stderr.trim());
        }
        // The server, from the checkpoint and from the bundle: predict's bits for JSON rows
        // (320: 5 batches of 64, as predict cut them).
        let rows = multi_hot_rows(py, data(), 320);
        for model in [&ck, &bundle] {
            let srv = Server::start(model, &["--max-batch", "64", "--max-body", "10000000"]);
            let (p, _) = srv.score(None, &json!({ "rows": rows }));
            assert_eq!(bits(&p), bits(&want[..320]), "{name}: serve-model {} scores as predict", model.display());
        }
    }
}

#[test]
fn init_from_a_table_model_trains_as_the_one_table_path_and_another_layout_is_refused() {
    let dir = common::scratch("tables-export-warm");
    let (ck1, ck2) = (dir.join("one"), dir.join("split"));
    let one = train(&dir, &ck1, &["--max-steps", "5"]);
    let split = train(&dir, &ck2, &[&TWO_TABLES[..], &["--max-steps", "5"]].concat());
    assert_eq!(fnv(&one), fnv(&split), "tables of one dim train as one table");
    let (b1, b2) = (dir.join("one.bundle"), dir.join("split.bundle"));
    ringrec(&dir, &["export", "--model", s(&ck1), "--out", s(&b1)]).assert_ok();
    ringrec(&dir, &["export", "--model", s(&ck2), "--out", s(&b2)]).assert_ok();

    // A warm start from the --table checkpoint (optimizer state carried) or bundle (rows
    // imported) with the same tables: the one-table warm start's bits.
    for (what, from1, from2) in [("checkpoint", &ck1, &ck2), ("bundle", &b1, &b2)] {
        let a = train(&dir, &dir.join(format!("warm-one-{what}")), &["--init-from", s(from1), "--max-steps", "4"]);
        let b = train(&dir, &dir.join(format!("warm-split-{what}")), &[&TWO_TABLES[..], &["--init-from", s(from2), "--max-steps", "4"]].concat());
        assert_eq!(fnv(&a), fnv(&b), "--init-from a {what}: the dense parameters");
        assert_eq!(a["table_rows"], b["table_rows"], "--init-from a {what}: the rows over every table");
        assert_eq!(a["test_auc"], b["test_auc"], "--init-from a {what}: the evaluation");
    }

    // Another layout, or none, is refused naming both.
    let refused = |name: &str, extra: &[&str], says: &str| {
        let args = [&["train", "--data", s(data()), "--sparse-columns", SPARSE, "--batch", "200", "--hidden", "16", "--threads", "2", "--device", "cpu", "--max-steps", "1"][..], extra].concat();
        let job = ringrec(&dir.join(name), &args);
        assert!(job.code != Some(0) && job.stderr.contains(says), "{name}: expected {says:?}:\n{}", job.all());
    };
    refused("none", &["--init-from", s(&ck2)], "--table: its model was trained with c3,l0=items c1,c2,l5=more, this run has none");
    refused("other", &["--init-from", s(&b2), "--table", "c3,l1=items", "--table", "c1,c2,l5=more"], "--table: its model was trained with c3,l0=items c1,c2,l5=more, this run has c3,l1=items c1,c2,l5=more");
    refused("dim", &["--init-from", s(&ck2), "--table", "c3,l0=items:dim=8", "--table", "c1,c2,l5=more"], "this run has c3,l0=items:dim=8 c1,c2,l5=more");
    refused("one", &[&["--init-from", s(&ck1)][..], &TWO_TABLES[..]].concat(), "its model keeps every field in one table, this run has c3,l0=items c1,c2,l5=more");

    // Tables of other dims start from their model and train on.
    let ck3 = dir.join("dims");
    train(&dir, &ck3, &[&TWO_DIMS[..], &["--max-steps", "3"]].concat());
    let w = train(&dir, &dir.join("warm-dims"), &[&TWO_DIMS[..], &["--init-from", s(&ck3), "--max-steps", "3"]].concat());
    assert!(w["test_auc"].as_f64().is_some() && w["init_from"]["step"] == 3, "{w}");
    // A wide-deep over them: its field dims recorded and read back.
    let wide = [&["--model", "wide-deep"][..], &TWO_DIMS[..]].concat();
    let ck4 = dir.join("wide-dims");
    train(&dir, &ck4, &[&wide[..], &["--max-steps", "3"]].concat());
    let w = train(&dir, &dir.join("warm-wide-dims"), &[&wide[..], &["--init-from", s(&ck4), "--max-steps", "3"]].concat());
    assert!(w["test_auc"].as_f64().is_some() && w["init_from"]["step"] == 3, "{w}");
}

/// `ringrec serve-model --model M` that must fail to start: its stderr.
fn serve_refused(model: &Path) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringrec"));
    c.args(["serve-model", "--listen", "127.0.0.1:0", "--model"]).arg(model);
    let job = common::run_with_timeout(c, Duration::from_secs(60));
    assert_ne!(job.code, Some(0), "{}", job.all());
    job.stderr
}

#[test]
fn damaged_bundles_of_table_models_are_refused_naming_the_file() {
    let dir = common::scratch("tables-export-damaged");
    let (ck, bundle) = (dir.join("ck"), dir.join("bundle"));
    train(&dir, &ck, &[&TWO_DIMS[..], &["--max-steps", "2"]].concat());
    ringrec(&dir, &["export", "--model", s(&ck), "--out", s(&bundle)]).assert_ok();
    let copy = |name: &str| {
        let to = dir.join(name);
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(&bundle).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
        }
        to
    };
    let missing = copy("missing");
    std::fs::remove_file(missing.join("table.items.bin")).unwrap();
    let cut = copy("cut");
    let t = std::fs::read(cut.join("table.more.bin")).unwrap();
    std::fs::write(cut.join("table.more.bin"), &t[..t.len() / 2]).unwrap();
    let layout = copy("layout");
    let mut m: Value = serde_json::from_slice(&std::fs::read(layout.join("model.json")).unwrap()).unwrap();
    let f = m["tables"]["fields"].as_array_mut().unwrap().iter_mut().find(|f| f["table"] == "table.items.bin").unwrap();
    f["width"] = json!(16);
    std::fs::write(layout.join("model.json"), serde_json::to_vec(&m).unwrap()).unwrap();

    for (b, says) in [(&missing, "table.items.bin"), (&cut, "table.more.bin"), (&layout, "model.json's field `c3` reads 16 values of table.items.bin")] {
        let job = ringrec(&dir, &["predict", "--model", s(b), "--data", s(data()), "--sparse-columns", SPARSE]);
        assert!(job.code != Some(0) && job.stderr.contains(says), "predict {}: expected {says:?}:\n{}", b.display(), job.all());
        let err = serve_refused(b);
        assert!(err.contains(says), "serve-model {}: expected {says:?}:\n{err}", b.display());
        let job = ringrec(&dir.join("warm"), &["train", "--data", s(data()), "--sparse-columns", SPARSE, "--batch", "200", "--hidden", "16", "--device", "cpu", "--max-steps", "1", "--table", TWO_DIMS[1], "--table", TWO_DIMS[3], "--init-from", s(b)]);
        assert!(job.code != Some(0) && job.stderr.contains(says), "--init-from {}: expected {says:?}:\n{}", b.display(), job.all());
    }
    if let Some(py) = common::test_python("numpy, pyarrow") {
        let mut c = Command::new(py);
        c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bundle_predict.py")).arg(&missing).arg(data());
        let job = common::run_with_timeout(c, Duration::from_secs(120));
        assert!(job.code != Some(0) && job.all().contains("table.items.bin"), "{}", job.all());
    }
}
