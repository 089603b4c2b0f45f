//! Multi-hot fields trained end to end (issue 33): the generated multi-hot set (10 single-hot
//! fields, 6 lists of mean length 20) prepared into a version-4 cache and trained at 1 and 2
//! ranks on `--device cpu` and `--device host`. The ranks end with the same parameters, the
//! two devices agree, sum and mean pooling differ, the lists cut to their first id differ,
//! and the loss falls. Small sizes: the whole file runs in well under a minute in a debug
//! build.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ringrec::data::multihot::synth_multi_hot_cut;

/// Every column of the multi-hot set read as categorical (its single-hot ids are integers,
/// which would otherwise be dense features).
const SPARSE: &str = "c0,c1,c2,c3,c4,c5,c6,c7,c8,c9,l0,l1,l2,l3,l4,l5";
const ROWS: u64 = 4000;

/// The whole set and the one with every list cut to its first id, written once.
fn data() -> &'static (PathBuf, PathBuf) {
    static DATA: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    DATA.get_or_init(|| {
        let d = common::shared_scratch("multihot-data");
        let (whole, cut) = (d.join("whole.parquet"), d.join("cut.parquet"));
        synth_multi_hot_cut(&whole, ROWS, 5, None).unwrap();
        synth_multi_hot_cut(&cut, ROWS, 5, Some(1)).unwrap();
        (whole, cut)
    })
}

/// `ringrec train --json` on `data` at `np` ranks on `device`, with `extra` flags: its summary.
fn train(name: &str, np: usize, data: &Path, device: &str, extra: &[&str]) -> serde_json::Value {
    let dir = common::scratch(&format!("multihot-{name}"));
    let data_dir = dir.join("data");
    let mut args = vec!["train", "--data", data.to_str().unwrap(), "--sparse-columns", SPARSE, "--data-dir", data_dir.to_str().unwrap()];
    args.extend(["--device", device, "--batch", "256", "--epochs", "2", "--hidden", "32,16", "--threads", "1", "--record-losses", "--json"]);
    args.extend(extra);
    let job = common::mpirun(np, &[], &common::small_table(&args));
    job.assert_ok();
    job.summary()
}

fn fnv(s: &serde_json::Value) -> String {
    s["params_fnv"].as_str().unwrap().to_string()
}

/// Every rank ends with the same parameters.
fn ranks_agree(s: &serde_json::Value) {
    let per_rank: Vec<&serde_json::Value> = s["params_fnv_per_rank"].as_array().unwrap().iter().collect();
    assert!(per_rank.iter().all(|f| **f == s["params_fnv"]), "{per_rank:?} vs {}", s["params_fnv"]);
}

#[test]
fn the_multi_hot_set_trains_at_one_and_two_ranks_on_the_cpu_and_host_devices() {
    let (whole, cut) = data();
    let cpu1 = train("cpu1", 1, whole, "cpu", &[]);
    let losses: Vec<f64> = cpu1["losses"].as_array().unwrap().iter().map(|l| l.as_f64().unwrap()).collect();
    let k = losses.len() / 4;
    let (first, last) = (losses[..k].iter().sum::<f64>() / k as f64, losses[losses.len() - k..].iter().sum::<f64>() / k as f64);
    assert!(last < first - 0.02, "the loss falls: first quarter {first}, last quarter {last}");
    assert!(cpu1["test_auc"].as_f64().unwrap() > 0.5, "{}", cpu1["test_auc"]);

    let cpu2 = train("cpu2", 2, whole, "cpu", &[]);
    ranks_agree(&cpu2);
    let host2 = train("host2", 2, whole, "host", &[]);
    ranks_agree(&host2);
    // The host kernels' GEMMs sum in another order than the CPU's: the same training,
    // within rounding.
    for key in ["train_loss", "test_auc", "test_logloss"] {
        let (c, h) = (cpu2[key].as_f64().unwrap(), host2[key].as_f64().unwrap());
        assert!((c - h).abs() < 2e-3, "{key}: cpu {c}, host {h}");
    }
    assert_eq!(cpu2["table_rows"], host2["table_rows"]);
    assert_eq!(cpu1["table_rows"], cpu2["table_rows"], "every list id is a row of the table");

    let mean = train("mean", 2, whole, "cpu", &["--multi-hot-pooling", "mean"]);
    ranks_agree(&mean);
    assert_ne!(fnv(&mean), fnv(&cpu2), "mean pooling differs from sum");
    let one_mean = train("one-mean", 2, whole, "cpu", &["--multi-hot-pooling", "l2=mean"]);
    assert!(fnv(&one_mean) != fnv(&cpu2) && fnv(&one_mean) != fnv(&mean), "one field's mean differs from both");

    let cut2 = train("cut", 2, cut, "cpu", &[]);
    ranks_agree(&cut2);
    assert_ne!(fnv(&cut2), fnv(&cpu2));
    assert!(cut2["table_rows"].as_u64().unwrap() < cpu2["table_rows"].as_u64().unwrap(), "fewer ids, fewer rows");
}

#[test]
fn a_multi_hot_input_takes_the_gpu_cache_and_refuses_an_unknown_pooling_field() {
    let (whole, _) = data();
    let dir = common::scratch("multihot-refused");
    let data_dir = dir.join("data");
    let base = ["train", "--data", whole.to_str().unwrap(), "--sparse-columns", SPARSE, "--data-dir", data_dir.to_str().unwrap(), "--max-steps", "1"];
    let run = |extra: &[&str]| {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        common::mpirun(1, &[], &args)
    };
    // The cache holds list ids' rows too (tests/cache_multihot.rs compares it bit for bit).
    let job = run(&["--device", "host", "--gpu-cache-mib", "1"]);
    job.assert_ok();
    assert!(job.stderr.contains("GPU hot-row cache:"), "{}", job.all());
    let job = run(&["--device", "cpu", "--multi-hot-pooling", "c0=mean"]);
    assert_ne!(job.code, Some(0));
    assert!(job.stderr.contains("`c0` is not a multi-hot field (they are: l0, l1, l2, l3, l4, l5)"), "{}", job.all());
}

#[test]
fn a_multi_hot_eval_set_is_scored_by_train_and_by_predict_alike() {
    let (whole, _) = data();
    let dir = common::scratch("multihot-eval");
    let eval = dir.join("eval.parquet");
    synth_multi_hot_cut(&eval, 1000, 6, None).unwrap();
    let (data_dir, ck) = (dir.join("data"), dir.join("ck"));
    let (e, d, c) = (eval.to_str().unwrap(), data_dir.to_str().unwrap(), ck.to_str().unwrap());
    let common_flags = ["--sparse-columns", SPARSE, "--data-dir", d, "--device", "cpu", "--batch", "256", "--multi-hot-pooling", "mean", "--json"];
    let mut args = vec!["train", "--data", whole.to_str().unwrap(), "--eval-data", e, "--checkpoint-dir", c, "--max-steps", "8", "--hidden", "16"];
    args.extend(common_flags);
    let job = common::mpirun(2, &[], &common::small_table(&args));
    job.assert_ok();
    let t = job.summary();
    assert_eq!(t["test_rows"], 1000);
    let mut args = vec!["predict", "--model", c, "--data", e];
    args.extend(common_flags);
    let job = common::mpirun(2, &[], &args);
    job.assert_ok();
    let p = job.summary();
    assert_eq!(p["auc"].as_f64(), t["test_auc"].as_f64(), "predict's AUC differs from train's evaluation");
    // The pooling is the model's: predict takes it from the checkpoint, and refuses another.
    let no_flag: Vec<&str> = args.iter().copied().filter(|a| *a != "--multi-hot-pooling" && *a != "mean").collect();
    let job = common::mpirun(1, &[], &no_flag);
    job.assert_ok();
    assert_eq!(job.summary()["auc"].as_f64(), t["test_auc"].as_f64(), "predict without --multi-hot-pooling scores as the model was trained");
    let sum: Vec<&str> = args.iter().map(|a| if *a == "mean" { "sum" } else { a }).collect();
    let job = common::mpirun(1, &[], &sum);
    assert_ne!(job.code, Some(0));
    let recorded = "l0=mean,l1=mean,l2=mean,l3=mean,l4=mean,l5=mean";
    assert!(job.stderr.contains("--multi-hot-pooling sum") && job.stderr.contains(recorded) && job.stderr.contains("field l0: mean there, sum here"), "{}", job.all());
    // A warm start takes it from the model too; a resume must repeat it.
    let train = |extra: &[&str]| {
        let mut args = vec!["train", "--data", e, "--sparse-columns", SPARSE, "--data-dir", d, "--device", "cpu", "--batch", "256", "--hidden", "16", "--json"];
        args.extend(extra);
        common::mpirun(1, &[], &common::small_table(&args))
    };
    let warm = train(&["--max-steps", "2", "--init-from", c]);
    warm.assert_ok();
    let warm_mean = train(&["--max-steps", "2", "--init-from", c, "--multi-hot-pooling", "mean"]);
    warm_mean.assert_ok();
    assert_eq!(fnv(&warm.summary()), fnv(&warm_mean.summary()), "--init-from's model pools with mean");
    let job = train(&["--max-steps", "2", "--init-from", c, "--multi-hot-pooling", "l3=mean"]);
    assert_ne!(job.code, Some(0));
    assert!(job.stderr.contains("--multi-hot-pooling l3=mean") && job.stderr.contains(recorded) && job.stderr.contains("field l0: mean there, sum here"), "{}", job.all());
    let mut resume = vec!["train", "--data", whole.to_str().unwrap(), "--checkpoint-dir", c, "--resume", "--max-steps", "9", "--hidden", "16", "--eval-data", e];
    resume.extend(common_flags.iter().map(|a| if *a == "mean" { "sum" } else { a }));
    let job = common::mpirun(1, &[], &common::small_table(&resume));
    assert_ne!(job.code, Some(0));
    assert!(job.stderr.contains(&format!("--multi-hot-pooling: the checkpoint was written with {recorded}, this run has l0=sum,l1=sum")), "{}", job.all());
}

#[test]
fn a_multi_hot_run_resumes_to_the_parameters_of_one_run_and_warm_starts() {
    let (whole, _) = data();
    let dir = common::scratch("multihot-resume");
    let (data_dir, ck, full) = (dir.join("data"), dir.join("ck"), dir.join("full"));
    let (d, ck, full) = (data_dir.to_str().unwrap(), ck.to_str().unwrap(), full.to_str().unwrap());
    let run = |extra: &[&str]| {
        let mut args = vec!["train", "--data", whole.to_str().unwrap(), "--sparse-columns", SPARSE, "--data-dir", d, "--device", "cpu", "--batch", "256", "--hidden", "16", "--json"];
        args.extend(extra);
        let job = common::mpirun(1, &[], &common::small_table(&args));
        job.assert_ok();
        job.summary()
    };
    let one = run(&["--max-steps", "6", "--checkpoint-dir", full]);
    run(&["--max-steps", "3", "--checkpoint-dir", ck]);
    let resumed = run(&["--max-steps", "6", "--checkpoint-dir", ck, "--resume"]);
    assert_eq!(fnv(&resumed), fnv(&one));
    let warm = run(&["--max-steps", "1", "--init-from", full]);
    assert!(warm["table_rows"].as_u64().unwrap() >= one["table_rows"].as_u64().unwrap(), "the table carried over");
}

/// `data` with a float64 column `w` appended (weights `i -> weights[i % weights.len()]`),
/// written by pyarrow in row groups of 1000 rows, as `out`.
fn with_weights(py: &str, data: &Path, out: &Path, weights: &[f64]) {
    let script = "import sys, json, pyarrow as pa, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1]); w = json.loads(sys.argv[3])
pq.write_table(t.append_column('w', pa.array([w[i % len(w)] for i in range(t.num_rows)], pa.float64())), sys.argv[2], row_group_size=1000)";
    let o = std::process::Command::new(py).args(["-c", script]).arg(data).arg(out).arg(serde_json::to_string(weights).unwrap()).output().expect("python");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_weight_column_with_list_columns_weighs_the_multi_hot_rows() {
    let Some(py) = common::test_python("pyarrow") else { return };
    let (whole, _) = data();
    let dir = common::scratch("multihot-weighted");
    let files: Vec<PathBuf> = ["ones", "twos", "uneven"].iter().map(|n| dir.join(format!("{n}.parquet"))).collect();
    for (f, w) in files.iter().zip([&[1.0][..], &[2.0], &[0.5, 1.5, 2.5]]) {
        with_weights(&py, whole, f, w);
    }
    let weighted = |f: &Path, name: &str| train(name, 2, f, "cpu", &["--weight-column", "w"]);
    let (ones, twos, uneven) = (weighted(&files[0], "w-ones"), weighted(&files[1], "w-twos"), weighted(&files[2], "w-uneven"));
    let plain = train("w-plain", 2, whole, "cpu", &[]);
    ranks_agree(&uneven);
    assert_eq!(ones["weight_column"], "w", "{ones}");
    assert_eq!(fnv(&ones), fnv(&plain), "weights all 1 train the multi-hot rows like no weights");
    assert_eq!(fnv(&twos), fnv(&ones), "weights all 2: the weighted mean is unchanged bit for bit");
    assert_ne!(fnv(&uneven), fnv(&ones), "uneven weights change the model");
    // The cache holds both: version 5, its lists and its weights.
    let cache_dir = common::scratch_root().join("multihot-w-uneven").join("data").join("cache");
    let caches: Vec<PathBuf> = std::fs::read_dir(&cache_dir).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "rrdata")).collect();
    assert_eq!(caches.len(), 1, "{caches:?}");
    let ds = ringrec::data::cache::Dataset::open(&caches[0]).unwrap();
    assert_eq!((ds.header().format().version, ds.list_fields()), (5, 6));
    assert_eq!(&ds.weights().unwrap()[..4], [0.5, 1.5, 2.5, 0.5]);
}

/// The multi-hot set's lists rewritten by pyarrow as other list types (`kind`: i32, u32,
/// u64, large, hex (each id as its hex string), text (a non-hex string per id), float,
/// nested), in row groups of 700 rows.
fn lists_as(py: &str, data: &Path, out: &Path, kind: &str) {
    let script = "import sys, pyarrow as pa, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1]); kind = sys.argv[3]
types = {'i32': pa.list_(pa.int32()), 'u32': pa.list_(pa.uint32()), 'u64': pa.list_(pa.uint64()), 'large': pa.large_list(pa.int64()), 'float': pa.list_(pa.float64())}
for g in range(6):
    name = f'l{g}'; col = t.column(name)
    if kind in types:
        col = col.cast(types[kind])
    elif kind == 'hex':
        col = pa.array([None if l is None else [format(i, 'x') for i in l] for l in col.to_pylist()], pa.list_(pa.string()))
    elif kind == 'text':
        col = pa.array([None if l is None else [f'item-{i}' for i in l] for l in col.to_pylist()], pa.list_(pa.string()))
    elif kind == 'nested':
        col = pa.array([None if l is None else [[i] for i in l] for l in col.to_pylist()], pa.list_(pa.list_(pa.int64())))
    t = t.set_column(t.schema.get_field_index(name), name, col)
pq.write_table(t, sys.argv[2], row_group_size=700)";
    let o = std::process::Command::new(py).args(["-c", script]).arg(data).arg(out).arg(kind).output().expect("python");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn lists_of_int32_uint_strings_and_large_lists_read_as_their_ids_and_floats_or_nested_lists_are_refused() {
    use ringrec::data::lists::{list_key, read_bags};
    use ringrec::data::Fields;
    let Some(py) = common::test_python("pyarrow") else { return };
    let (whole, _) = data();
    let dir = common::scratch("multihot-types");
    let names: Vec<String> = (0..6).map(|g| format!("l{g}")).collect();
    // c0..c9: 10 single-hot fields, the lists salted after 26 as ever.
    let fields = Fields { dense: 0, sparse: 10 };
    let want = read_bags(whole, &names, fields).unwrap();
    let file = |kind: &str| {
        let p = dir.join(format!("{kind}.parquet"));
        lists_as(&py, whole, &p, kind);
        p
    };
    for kind in ["i32", "u32", "u64", "large", "hex"] {
        let got = read_bags(&file(kind), &names, fields).unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_eq!((got.offsets == want.offsets, got.keys == want.keys, got.empty), (true, true, want.empty), "{kind}: the same ids as the int64 lists");
    }
    // A string that is not hex digits is its FNV-1a 64, as a single-hot string's.
    let text = read_bags(&file("text"), &names, fields).unwrap();
    assert_eq!(text.offsets, want.offsets);
    assert_ne!(text.keys, want.keys);
    let small = dir.join("small.parquet");
    let script = "import sys, pyarrow as pa, pyarrow.parquet as pq
pq.write_table(pa.table({'label': [0, 1], 'l0': pa.array([['item-7', '', None, 'Ab'], None], pa.list_(pa.string()))}), sys.argv[1])";
    let o = std::process::Command::new(&py).args(["-c", script]).arg(&small).output().expect("python");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let b = read_bags(&small, &names[..1], Fields { dense: 0, sparse: 0 }).unwrap();
    assert_eq!(b.keys, [list_key(0, ringrec::hash::fnv1a64(b"item-7")), list_key(0, 0xab)], "an empty string and a null are left out");
    assert_eq!((b.offsets.as_slice(), b.empty, b.null_elements), (&[0, 2, 2][..], 1, 2));
    // Trained from the hex strings, the model is the int64 lists' bit for bit.
    let (hex, base) = (train("hex", 1, &dir.join("hex.parquet"), "cpu", &["--max-steps", "6"]), train("int64", 1, whole, "cpu", &["--max-steps", "6"]));
    assert_eq!(fnv(&hex), fnv(&base), "hex-string lists train as the int64 lists they spell");
    // A list of floats and a list of lists are refused, naming the file and the column.
    for (kind, says) in [("float", "a list of DOUBLE values; a multi-hot field is a list of integer or string ids"), ("nested", "a list of lists (nested)")] {
        let p = file(kind);
        let job = common::mpirun(1, &[], &["train", "--data", p.to_str().unwrap(), "--sparse-columns", SPARSE, "--data-dir", dir.join("d").to_str().unwrap(), "--max-steps", "1"]);
        assert_ne!(job.code, Some(0));
        assert!(job.stderr.contains(&format!("{kind}.parquet")) && job.stderr.contains("`l0`") && job.stderr.contains(says), "{kind}: {}", job.all());
    }
}

#[test]
fn merging_duplicates_compares_the_lists_too() {
    let Some(py) = common::test_python("pyarrow") else { return };
    let dir = common::scratch("multihot-merge");
    let data = dir.join("dups.parquet");
    // 400 rows, the same label and single-hot id each; lists [r % 4]: 4 distinct rows.
    let script = "import sys, pyarrow as pa, pyarrow.parquet as pq
n = 400
pq.write_table(pa.table({'label': [1] * n, 'c0': ['ab'] * n, 'l0': pa.array([[r % 4] for r in range(n)], pa.list_(pa.int64()))}), sys.argv[1])";
    let o = std::process::Command::new(&py).args(["-c", script]).arg(&data).output().expect("python");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let data_dir = dir.join("d");
    let args = ["train", "--data", data.to_str().unwrap(), "--data-dir", data_dir.to_str().unwrap(), "--device", "cpu", "--batch", "2", "--hidden", "8", "--max-steps", "1", "--test-fraction", "0", "--merge-duplicates", "--json"];
    let job = common::mpirun(1, &[], &args);
    job.assert_ok();
    let s = job.summary();
    assert_eq!((s["samples_merged"].as_u64(), s["train_rows"].as_u64()), (Some(396), Some(4)), "rows differing only in their lists are not merged: {s}");
}

/// A pyarrow-written file of one single-hot column and one list column whose rows hold 0 to
/// 3 ids but for 100 rows of 1500 to 2000; `expected` gets the most keys a step of 128 rows
/// lists: 128 single-hot keys and the ids of the 128 rows with the most.
const LONG_LISTS: &str = r#"
import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq
out, expected = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(11)
n = 1000
lens = rng.integers(0, 4, n)
lens[rng.choice(n, 100, replace=False)] = rng.integers(1500, 2001, 100)
lists = [[int(v) for v in rng.integers(0, 50000, k)] for k in lens]
t = pa.table({"label": (rng.random(n) < 0.3).astype(np.int64), "c0": [f"v{v}" for v in rng.integers(0, 40, n)], "l0": pa.array(lists, pa.list_(pa.int64()))})
pq.write_table(t, out, row_group_size=300)
open(expected, "w").write(str(128 * 1 + int(np.sort(lens)[::-1][:128].sum())))
"#;

#[test]
fn long_lists_count_in_the_host_boards_room_at_two_ranks() {
    let Some(py) = common::test_python("numpy, pyarrow") else { return };
    let dir = common::scratch("multihot-long-lists");
    let (data, expected, data_dir) = (dir.join("long.parquet"), dir.join("expected"), dir.join("d"));
    assert!(std::process::Command::new(&py).args(["-c", LONG_LISTS]).arg(&data).arg(&expected).status().expect("python").success(), "the pyarrow script failed");
    let want: u64 = std::fs::read_to_string(&expected).expect("expected").trim().parse().expect("a number");
    let args = ["train", "--data", data.to_str().unwrap(), "--data-dir", data_dir.to_str().unwrap(), "--batch", "128", "--epochs", "1", "--hidden", "16", "--threads", "1", "--json"];
    let job = common::mpirun(2, &[], &args);
    job.assert_ok();
    let s = job.summary();
    ranks_agree(&s);
    // The host's 128 rows of a step (2 ranks, one host): one single-hot key each and the
    // ids of the 128 longest rows — not 26 keys a row (3,328), 60 times fewer.
    assert_eq!(s["board_step_keys"].as_u64(), Some(want), "{s}");
    assert!(want > 100 * 1500 && s["train_loss"].as_f64().is_some_and(f64::is_finite), "{s}");
}

/// Makes the checkpoint `step` of `dir` one of a ringrec from before the pooling was
/// recorded: its manifest without `--multi-hot-pooling`, resealed.
fn forge_unrecorded_pooling(step: &Path) {
    let path = step.join("manifest.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let body = text.trim_end().rsplit_once('\n').unwrap().0;
    let mut m: serde_json::Value = serde_json::from_str(body).unwrap();
    let settings = m["settings"].as_array_mut().unwrap();
    let before = settings.len();
    settings.retain(|kv| kv[0] != "--multi-hot-pooling");
    assert_eq!(settings.len() + 1, before, "the fresh checkpoint records the pooling");
    let body = serde_json::to_vec_pretty(&m).unwrap();
    let seal = serde_json::json!({ "crc32": ringrec::hash::crc32(&body) });
    std::fs::write(&path, [body, b"\n".to_vec(), seal.to_string().into_bytes(), b"\n".to_vec()].concat()).unwrap();
}

#[test]
fn an_old_multi_hot_checkpoint_scores_with_its_data_and_is_refused_without_it() {
    let (whole, _) = data();
    let dir = common::scratch("multihot-old-checkpoint");
    let (data_dir, ck, bundle) = (dir.join("data"), dir.join("ck"), dir.join("bundle"));
    let (w, d, c, b) = (whole.to_str().unwrap(), data_dir.to_str().unwrap(), ck.to_str().unwrap(), bundle.to_str().unwrap());
    let base = ["--data", w, "--sparse-columns", SPARSE, "--data-dir", d, "--batch", "256", "--hidden", "16", "--threads", "1"];
    let job = common::mpirun(1, &[], &[&["train"][..], &base, &["--max-steps", "3", "--checkpoint-dir", c, "--no-progress"]].concat());
    job.assert_ok();
    let predict = |out: &str| {
        let p = dir.join(out);
        let job = common::mpirun(1, &[], &["predict", "--model", c, "--data", w, "--sparse-columns", SPARSE, "--data-dir", d, "--batch", "256", "--threads", "1", "--out", p.to_str().unwrap()]);
        job.assert_ok();
        std::fs::read_to_string(p).unwrap()
    };
    let fresh = predict("fresh.tsv");
    let step = ck.join(std::fs::read_to_string(ck.join("LATEST")).unwrap().trim());
    forge_unrecorded_pooling(&step);
    // With its data: the lists read from it, summed as the old ringrec did.
    assert_eq!(predict("old.tsv"), fresh, "predict scores the old checkpoint as the fresh one");
    // Without: its dense.bin counts 16 categorical fields, but not which are lists.
    for args in [&["export", "--model", c, "--out", b][..], &["serve-model", "--listen", "127.0.0.1:0", "--model", c]] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ringrec"));
        cmd.args(args);
        let job = common::run_with_timeout(cmd, std::time::Duration::from_secs(60));
        assert!(job.code.is_some_and(|c| c != 0), "{args:?}: {}", job.all());
        assert!(job.all().contains("written before ringrec recorded them: its 16 categorical fields may include list fields") && job.all().contains("--resume --max-steps 4"), "{args:?}: {}", job.all());
    }
    // Resumed for one more step with its data, the new checkpoint records the fields.
    let job = common::mpirun(1, &[], &[&["train"][..], &base, &["--max-steps", "4", "--checkpoint-dir", c, "--resume", "--no-progress"]].concat());
    job.assert_ok();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ringrec"));
    cmd.args(["export", "--model", c, "--out", b]);
    common::run_with_timeout(cmd, std::time::Duration::from_secs(60)).assert_ok();
    let model: serde_json::Value = serde_json::from_slice(&std::fs::read(bundle.join("model.json")).unwrap()).unwrap();
    assert_eq!((model["input"]["categorical_features"].as_u64(), model["input"]["multi_hot"].as_array().map(Vec::len)), (Some(10), Some(6)), "{}", model["input"]);
}
