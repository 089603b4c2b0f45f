//! Per-field tables (`--table`, issue 33 point 4) trained end to end on the generated
//! multi-hot set (10 single-hot fields `c0`..`c9`, 6 lists `l0`..`l5`).
//!
//! The property first: keys are hashed with their field's number, rows are initialised from
//! the key and the sparse update is per key, so fields moved into tables of the same dim
//! train bit for bit as in the one table — the same `params_fnv` and the same row for every
//! key — at 1 and 2 ranks, on `--device cpu` and `host`, with sum and mean pooling, an mlp
//! and a wide-deep, and on 2 simulated hosts. Then: a table of another dim trains (the loss
//! falls), its run resumed from a checkpoint ends with the uninterrupted run's bits, and
//! `predict` scores its held-out rows as its evaluation did; a wide-deep over tables of
//! different dims learns (each field's first-order weight after its own dim's values); the
//! refusals name the flag (deepfm needs one dim).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ringrec::data::multihot::synth_multi_hot_cut;
use ringrec::embedding::EmbeddingTable;

/// Every column of the multi-hot set read as categorical.
const SPARSE: &str = "c0,c1,c2,c3,c4,c5,c6,c7,c8,c9,l0,l1,l2,l3,l4,l5";
const ROWS: u64 = 3000;
/// Two tables beside the default one: single-hot and list fields in each.
const TWO_TABLES: [&str; 4] = ["--table", "c3,l0=items", "--table", "c1,c2,l5=more"];

/// The multi-hot set, written once.
fn data() -> &'static PathBuf {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(|| {
        let p = common::shared_scratch("tables-data").join("mh.parquet");
        synth_multi_hot_cut(&p, ROWS, 5, None).unwrap();
        p
    })
}

/// The flags of every run on the set, `dir` its directory; every table (the default one and
/// each `--table` that names no capacity) of [`common::SMALL_TABLE`]'s slots: a checkpoint of
/// three default-sized tables is half a gigabyte, and CI's disk is small.
fn flags(dir: &Path) -> Vec<String> {
    let d = dir.join("data");
    let args = ["train", "--data", data().to_str().unwrap(), "--sparse-columns", SPARSE, "--data-dir", d.to_str().unwrap(), "--batch", "256", "--hidden", "16", "--threads", "1", "--record-losses", "--json"];
    common::small_table(&args).iter().map(|s| s.to_string()).collect()
}

/// `ringrec train` on the set at `np` ranks (environment `env`) with `extra` flags and
/// checkpoints in `<dir>/ck`: its summary and the checkpoint directory.
fn train(name: &str, np: usize, env: &[(&str, &str)], extra: &[&str]) -> (serde_json::Value, PathBuf) {
    let dir = common::scratch(&format!("tables-{name}"));
    let ck = dir.join("ck");
    let mut args = flags(&dir);
    args.extend(["--checkpoint-dir".to_string(), ck.to_str().unwrap().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let job = common::mpirun(np, env, &args);
    job.assert_ok();
    (job.summary(), ck)
}

/// `ringrec train` at one rank that must fail: its stderr.
fn refused(name: &str, extra: &[&str]) -> String {
    let dir = common::scratch(&format!("tables-refused-{name}"));
    let mut args = flags(&dir);
    args.extend(["--max-steps".to_string(), "1".to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let job = common::mpirun(1, &[], &args);
    assert_ne!(job.code, Some(0), "{name}: {}", job.all());
    job.stderr
}

fn fnv(s: &serde_json::Value) -> String {
    s["params_fnv"].as_str().unwrap().to_string()
}

/// Every rank ends with the same parameters.
fn ranks_agree(s: &serde_json::Value) {
    let per_rank = s["params_fnv_per_rank"].as_array().unwrap();
    assert!(per_rank.iter().all(|f| *f == s["params_fnv"]), "{per_rank:?} vs {}", s["params_fnv"]);
}

/// Every key's row in the newest checkpoint of `ck`, over all its tables (`table.rrt` and
/// each `table.NAME.rrt`); a key in two tables fails.
fn rows(ck: &Path) -> BTreeMap<u64, Vec<f32>> {
    let latest = std::fs::read_to_string(ck.join("LATEST")).unwrap();
    let step = ck.join(latest.trim());
    let mut all = BTreeMap::new();
    for e in std::fs::read_dir(&step).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if !(name.starts_with("table") && name.ends_with(".rrt")) {
            continue;
        }
        let t = EmbeddingTable::open_readonly(&p).unwrap();
        let keys: Vec<u64> = t.live_keys().into_iter().map(|(k, _)| k).collect();
        let mut v = vec![0f32; keys.len() * t.dim()];
        t.lookup(&keys, &mut v).unwrap();
        for (k, row) in keys.iter().zip(v.chunks_exact(t.dim())) {
            assert!(all.insert(*k, row.to_vec()).is_none(), "key {k:#x} in two tables ({name})");
        }
    }
    all
}

/// The mean of the first and of the last quarter of a run's losses.
fn loss_quarters(s: &serde_json::Value) -> (f64, f64) {
    let l: Vec<f64> = s["losses"].as_array().unwrap().iter().map(|l| l.as_f64().unwrap()).collect();
    let k = (l.len() / 4).max(1);
    (l[..k].iter().sum::<f64>() / k as f64, l[l.len() - k..].iter().sum::<f64>() / k as f64)
}

#[test]
fn fields_moved_into_tables_of_the_same_dim_train_bit_for_bit_as_in_one_table() {
    for (np, device, pooling, model) in [(1, "cpu", "sum", "mlp"), (1, "cpu", "mean", "mlp"), (2, "cpu", "sum", "mlp"), (2, "host", "mean", "mlp"), (1, "cpu", "mean", "wide-deep")] {
        let base = ["--device", device, "--multi-hot-pooling", pooling, "--model", model];
        let name = format!("same-{np}-{device}-{pooling}-{model}");
        let (one, one_ck) = train(&format!("{name}-one"), np, &[], &base);
        let split_flags: Vec<&str> = base.iter().chain(TWO_TABLES.iter()).copied().collect();
        let (split, split_ck) = train(&format!("{name}-split"), np, &[], &split_flags);
        ranks_agree(&split);
        assert_eq!(fnv(&one), fnv(&split), "{name}: the dense parameters");
        assert_eq!(one["table_rows"], split["table_rows"], "{name}: the rows, over every table");
        assert_eq!(one["test_auc"], split["test_auc"], "{name}: the evaluation");
        let (a, b) = (rows(&one_ck), rows(&split_ck));
        assert_eq!(a.len(), b.len());
        assert!(a == b, "{name}: every key's row is the same, in whichever table it is");
    }
}

#[test]
fn two_tables_and_the_default_train_on_two_hosts_as_one_table() {
    let env = [("RINGREC_RANKS_PER_HOST", "1")];
    let (one, _) = train("hosts-one", 2, &env, &["--device", "cpu"]);
    let split_flags: Vec<&str> = ["--device", "cpu"].iter().chain(TWO_TABLES.iter()).copied().collect();
    let (split, ck) = train("hosts-split", 2, &env, &split_flags);
    ranks_agree(&split);
    assert_eq!(fnv(&one), fnv(&split));
    assert_eq!(one["table_rows"], split["table_rows"]);
    assert!(split["sparse_bytes_cross_host_per_step"].as_f64().unwrap() > 0.0, "the tables' rows crossed hosts");
    let step = ck.join(std::fs::read_to_string(ck.join("LATEST")).unwrap().trim());
    for f in ["table.rrt", "table.items.rrt", "table.more.rrt"] {
        assert!(step.join(f).is_file(), "{f} in {}", step.display());
    }
}

#[test]
fn local_steps_sync_every_table_as_the_one_table_run_and_resume_at_a_sync() {
    // `--sync-every 3`: each table's local deltas synced like the default table's; fields
    // moved into tables of the same dim give the one-table run's bits, at 1 and 2 ranks of
    // one host and on 2 simulated hosts (scope rank and host).
    for (np, per_host, scope) in [(1, None, "rank"), (2, None, "rank"), (2, Some("1"), "rank"), (4, Some("2"), "host")] {
        let env: Vec<(&str, &str)> = per_host.map(|n| ("RINGREC_RANKS_PER_HOST", n)).into_iter().collect();
        let base = ["--device", "cpu", "--sync-every", "3", "--sync-scope", scope, "--eval-every", "5"];
        let name = format!("sync-{np}-{}-{scope}", per_host.unwrap_or("all"));
        let (one, one_ck) = train(&format!("{name}-one"), np, &env, &base);
        let split_flags: Vec<&str> = base.iter().chain(TWO_TABLES.iter()).copied().collect();
        let (split, split_ck) = train(&format!("{name}-split"), np, &env, &split_flags);
        ranks_agree(&split);
        assert_eq!(fnv(&one), fnv(&split), "{name}: the dense parameters");
        assert_eq!((&one["syncs"], &one["losses"]), (&split["syncs"], &split["losses"]), "{name}");
        assert!(split["syncs"].as_u64().unwrap() < split["steps"].as_u64().unwrap(), "{name}: local steps were taken: {split}");
        let crcs = split["table_rows_crc_per_host"].as_array().unwrap();
        assert!(crcs.iter().all(|c| *c == crcs[0] && c != ""), "{name}: every host holds the same rows of every table: {crcs:?}");
        assert_eq!(one["sync_delta_rows"], split["sync_delta_rows"], "{name}: the deltas, over every table");
        // The bytes differ by the lists' headers: three delta exchanges instead of one.
        let (a, b) = (one["sync_delta_cross_bytes_sent"].as_u64().unwrap(), split["sync_delta_cross_bytes_sent"].as_u64().unwrap());
        assert!(b >= a && b - a <= 2048 * split["syncs"].as_u64().unwrap(), "{name}: delta bytes {a} and {b}");
        let (a, b) = (rows(&one_ck), rows(&split_ck));
        assert!(!a.is_empty() && a == b, "{name}: every key's row is the same, in whichever table it is");
    }
    // A checkpoint every 4 steps (a sync mid-interval), stopped after 8 and resumed: the
    // tables' rows and the dense parameters are the one-table run's, stopped and resumed.
    let env = [("RINGREC_RANKS_PER_HOST", "1")];
    let resumed = |name: &str, tables: &[&str]| {
        let base: Vec<&str> = ["--device", "cpu", "--sync-every", "3", "--checkpoint-every", "4"].iter().chain(tables).copied().collect();
        let (first, ck) = train(name, 2, &env, &[&base[..], &["--max-steps", "8", "--no-eval"]].concat());
        assert_eq!((first["global_step"].as_u64(), first["syncs"].as_u64()), (Some(8), Some(4)), "syncs at steps 3, 4 (the checkpoint), 7 and 8: {first}");
        let dir = ck.parent().unwrap().to_path_buf();
        let mut args = flags(&dir);
        args.extend(["--checkpoint-dir", ck.to_str().unwrap(), "--resume"].iter().map(|s| s.to_string()));
        args.extend(base.iter().map(|s| s.to_string()));
        let job = common::mpirun(2, &env, &args.iter().map(String::as_str).collect::<Vec<_>>());
        job.assert_ok();
        let s = job.summary();
        assert_eq!(s["steps"].as_u64(), Some(s["global_step"].as_u64().unwrap() - 8), "{s}");
        (s, rows(&ck))
    };
    let (one, one_rows) = resumed("sync-resume-one", &[]);
    let (split, split_rows) = resumed("sync-resume-split", &TWO_TABLES);
    ranks_agree(&split);
    assert_eq!(fnv(&one), fnv(&split));
    assert!(one_rows == split_rows, "the resumed runs' rows");
}

/// The sum over the summary's per-table breakdown of `key`.
fn over_tables(s: &serde_json::Value, key: &str) -> u64 {
    s["tables"].as_object().unwrap_or_else(|| panic!("no tables in {s}")).values().map(|t| t[key].as_u64().unwrap_or_else(|| panic!("{key} in {t}"))).sum()
}

#[test]
fn the_counts_cover_every_table() {
    // 2 ranks on 2 simulated hosts: every field moved into one named table moves the same
    // keys as the one-table run, so every byte and row count is the one-table run's, and the
    // default table (holding no field) has none.
    let env = [("RINGREC_RANKS_PER_HOST", "1")];
    let base = ["--device", "cpu", "--eval-every", "4", "--max-steps", "8"];
    let (one, _) = train("counts-one", 2, &env, &base);
    assert!(one.get("tables").is_none(), "a one-table run has no breakdown: {one}");
    let every_field = format!("{SPARSE}=all");
    let all: Vec<&str> = base.iter().copied().chain(["--table", &every_field]).collect();
    let (moved, _) = train("counts-all", 2, &env, &all);
    assert_eq!(fnv(&one), fnv(&moved));
    assert_eq!(one["sparse_traffic_per_rank"], moved["sparse_traffic_per_rank"], "the bytes over every table");
    assert!(one["sparse_bytes_cross_host_per_step"].as_f64().unwrap() > 0.0);
    assert_eq!(one["sparse_bytes_cross_host_per_step"], moved["sparse_bytes_cross_host_per_step"]);
    for k in ["table_rows", "table_inserted", "table_capacity", "table_bytes", "table_growths"] {
        let part = k.strip_prefix("table_").unwrap();
        assert_eq!(one[k], moved["tables"]["all"][part], "{k}");
        assert_eq!(moved[k].as_u64().unwrap(), over_tables(&moved, part), "{k}: the sum over the tables");
    }
    assert!(one["table_growths"].as_u64().unwrap() > 0, "the table grew: {one}");
    assert_eq!((&one["table_rows"], &one["table_inserted"], &one["table_growths"]), (&moved["table_rows"], &moved["table_inserted"], &moved["table_growths"]));
    assert_eq!(moved["tables"]["default"]["rows"], 0);
    assert_eq!(moved["tables"]["default"]["sparse_bytes_sent_cross_host"], 0);
    let cross: u64 = moved["sparse_traffic_per_rank"].as_array().unwrap().iter().map(|t| t["cross_host_sent"].as_u64().unwrap()).sum();
    assert_eq!(moved["tables"]["all"]["sparse_bytes_sent_cross_host"].as_u64(), Some(cross));

    // Two tables beside the default: the counts are the sums of the three tables', each
    // table moved bytes, and the rows are the one-table run's.
    let split: Vec<&str> = base.iter().chain(TWO_TABLES.iter()).copied().collect();
    let dir = common::scratch("tables-counts-split-metrics");
    let metrics = dir.join("metrics.jsonl");
    let split: Vec<&str> = split.into_iter().chain(["--metrics-out", metrics.to_str().unwrap()]).collect();
    let (two, _) = train("counts-split", 2, &env, &split);
    assert_eq!(two["tables"].as_object().unwrap().len(), 3, "{two}");
    for k in ["table_rows", "table_inserted", "table_capacity", "table_bytes"] {
        assert_eq!(two[k].as_u64().unwrap(), over_tables(&two, k.strip_prefix("table_").unwrap()), "{k}");
    }
    assert_eq!((&one["table_rows"], &one["table_inserted"]), (&two["table_rows"], &two["table_inserted"]));
    let cross: u64 = two["sparse_traffic_per_rank"].as_array().unwrap().iter().map(|t| t["cross_host_sent"].as_u64().unwrap()).sum();
    assert_eq!(over_tables(&two, "sparse_bytes_sent_cross_host"), cross);
    for (name, t) in two["tables"].as_object().unwrap() {
        assert!(t["rows"].as_u64().unwrap() > 0 && t["sparse_bytes_sent_cross_host"].as_u64().unwrap() > 0, "{name}: {t}");
    }
    // --metrics-out: the same sums and breakdown at every report (steps 4 and 8).
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&metrics).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    let last = &lines[1];
    assert_eq!(last["table_rows"], two["table_rows"]);
    assert_eq!(last["table_bytes"], two["table_bytes"]);
    let rows: u64 = last["tables"].as_object().unwrap().values().map(|t| t["rows"].as_u64().unwrap()).sum();
    assert_eq!(Some(rows), last["table_rows"].as_u64(), "{last}");
    assert!(last["tables"]["items"].get("sparse_bytes_sent_cross_host").is_none(), "a report's breakdown has no traffic: {last}");

    // Step 3's gradients NaN under skip-step: every table skips its update, each counted.
    let nan = [("RINGREC_FAULT_NAN", "0:2")];
    let skip: Vec<&str> = ["--device", "cpu", "--max-steps", "5", "--no-eval", "--nan-policy", "skip-step"].iter().chain(TWO_TABLES.iter()).copied().collect();
    let (s, _) = train("counts-nan", 1, &nan, &skip);
    assert_eq!((&s["nan_skips"]["dense"], &s["nan_skips"]["sparse"]), (&1.into(), &3.into()), "{s}");
    for n in ["default", "items", "more"] {
        assert_eq!(s["tables"][n]["nan_skips"], 1, "{n}: {s}");
    }
}

#[test]
fn the_boards_are_sized_from_every_data_file_whose_cache_is_there() {
    // The first file's lists cut to one id, the second's whole and prepared ahead: the
    // boards' bound is the second file's (its cache's spans read at the start), not the
    // first's.
    let dir = common::scratch("tables-step-keys");
    let (short, long) = (dir.join("short.parquet"), dir.join("long.parquet"));
    synth_multi_hot_cut(&short, ROWS, 5, Some(1)).unwrap();
    synth_multi_hot_cut(&long, ROWS, 6, None).unwrap();
    let columns = ringrec::data::ColumnSpec { sparse: SPARSE.split(',').map(str::to_string).collect(), ..Default::default() };
    let opts = ringrec::data::prepare::PrepareOptions { columns, ..ringrec::data::prepare::PrepareOptions::new(0) };
    let cache = dir.join("long.rrdata");
    ringrec::data::prepare::prepare_with(&long, &cache, &opts).unwrap();
    let run = |data: &[&Path]| {
        let d = dir.join("data");
        let mut args = vec!["train", "--sparse-columns", SPARSE, "--data-dir", d.to_str().unwrap(), "--batch", "256", "--hidden", "16", "--threads", "1", "--json", "--no-eval", "--max-steps", "2"];
        for p in data {
            args.extend(["--data", p.to_str().unwrap()]);
        }
        let job = common::mpirun(1, &[], &common::small_table(&args));
        job.assert_ok();
        job.summary()["board_step_keys"].as_u64().unwrap()
    };
    let most = |p: &Path| ringrec::data::Dataset::open(p).unwrap().most_ids(256);
    let short_only = run(&[&short]);
    let both = run(&[&short, &cache]);
    assert_eq!(both, 256 * 10 + most(&cache), "the second file's lists");
    assert!(most(&cache) > 256 * 6 && both > short_only, "{both} vs {short_only}");
}

#[test]
fn the_tables_share_the_largest_size_and_a_sum_that_cannot_fit_is_refused() {
    // The free space shared by file size: `items` of twice the slots gets twice the room.
    let two = ["--table", "c3,l0=items:capacity=131072", "--table", "c1,c2,l5=more"];
    let base = ["--device", "cpu", "--max-steps", "2", "--no-eval"];
    let args: Vec<&str> = base.iter().chain(two.iter()).copied().collect();
    let (auto, _) = train("share-auto", 1, &[], &args);
    let t = &auto["tables"];
    let ratio = |n: &str| t[n]["max_bytes"].as_f64().unwrap() / t[n]["bytes"].as_f64().unwrap();
    assert!(ratio("default") > 1.0, "{t}");
    for n in ["items", "more"] {
        assert!((ratio(n) / ratio("default") - 1.0).abs() < 1e-6, "{n}: {t}");
    }
    assert_eq!(auto["table_max_bytes"].as_u64(), Some(over_tables(&auto, "max_bytes")));
    // --table-max-bytes shared by the tables without their own max_bytes=.
    let mib = 1u64 << 20;
    let args: Vec<&str> = base.iter().copied().chain(["--table-max-bytes", "64M", "--table", "c3,l0=items:max_bytes=16M", "--table", "c1,c2,l5=more"]).collect();
    let (given, _) = train("share-given", 1, &[], &args);
    let t = &given["tables"];
    assert_eq!(t["items"]["max_bytes"].as_u64(), Some(16 * mib), "{t}");
    let shared = t["default"]["max_bytes"].as_u64().unwrap() + t["more"]["max_bytes"].as_u64().unwrap();
    assert!(shared <= 64 * mib && shared + 2 >= 64 * mib, "{t}");
    assert_eq!(t["default"]["max_bytes"], t["more"]["max_bytes"], "files of the same size, the same share");
    // Sizes whose growth cannot fit in the shared-memory directory, and a --table-max-bytes
    // below the sharing tables' files: refused, naming them.
    let err = refused("share-too-big", &["--table", "c3=items:max_bytes=1000000G"]);
    assert!(err.contains("--table: the tables' largest sizes given (table `items` max_bytes=1073741824000000) sum to 1073741824000000 bytes") && err.contains("lower them, or make room there"), "{err}");
    let file = auto["tables"]["default"]["bytes"].as_u64().unwrap();
    let small = (file + 4096).to_string();
    let err = refused("share-small", &["--table-max-bytes", &small, "--table", "c3=items"]);
    assert!(err.contains(&format!("--table-max-bytes {small} with --table is shared by the tables without a max_bytes= of their own, and their initial files take {} bytes", 2 * file)), "{err}");
}

#[test]
fn a_table_of_another_dim_trains_resumes_bit_for_bit_and_predict_scores_as_its_evaluation() {
    let table = ["--table", "c3,l0=items:dim=8:capacity=65536"];
    let other: Vec<&str> = ["--device", "cpu", "--epochs", "4"].iter().chain(table.iter()).copied().collect();
    let (whole, _) = train("dim-whole", 1, &[], &other);
    let (first, last) = loss_quarters(&whole);
    assert!(last < first - 0.02, "the loss falls: first quarter {first}, last quarter {last}");
    let (one, _) = train("dim-one", 1, &[], &["--device", "cpu", "--epochs", "4"]);
    assert_ne!(fnv(&one), fnv(&whole), "another dim is another model");

    // Stopped after 17 steps, resumed from its checkpoint: the uninterrupted run's bits.
    let dir = common::scratch("tables-dim-resumed");
    let ck = dir.join("ck");
    let mut args = flags(&dir);
    args.extend(["--checkpoint-dir", ck.to_str().unwrap(), "--device", "cpu", "--epochs", "4"].iter().map(|s| s.to_string()));
    let run = |extra: &[&str]| {
        let a: Vec<&str> = args.iter().map(String::as_str).chain(extra.iter().copied()).collect();
        common::mpirun(1, &[], &a)
    };
    run(&[&table[..], &["--max-steps", "17"]].concat()).assert_ok();
    let resumed = run(&[&table[..], &["--resume"]].concat());
    resumed.assert_ok();
    let resumed = resumed.summary();
    assert_eq!(fnv(&resumed), fnv(&whole));

    // Another layout resuming it is refused naming both.
    let job = run(&["--resume", "--table", "c3,l1=items:dim=8:capacity=65536"]);
    assert_ne!(job.code, Some(0));
    assert!(job.stderr.contains("--table: the checkpoint was written with c3,l0=items:dim=8:capacity=65536, this run has c3,l1=items:dim=8:capacity=65536"), "{}", job.all());
    let job = run(&["--resume"]);
    assert!(job.code != Some(0) && job.stderr.contains("--table: the checkpoint was written with c3,l0=items:dim=8:capacity=65536, this run has none"), "{}", job.all());

    // predict reads the tables: its AUC on the held-out rows is the evaluation's.
    let d = dir.join("data");
    let predict = ["predict", "--model", ck.to_str().unwrap(), "--data", data().to_str().unwrap(), "--sparse-columns", SPARSE, "--data-dir", d.to_str().unwrap()];
    let job = common::mpirun(1, &[], &[&predict[..], &["--test-fraction", "0.1", "--batch", "256", "--device", "cpu", "--json"]].concat());
    job.assert_ok();
    let p = job.summary();
    assert_eq!(p["auc"].as_f64(), resumed["test_auc"].as_f64(), "predict's AUC differs from train's evaluation");
    assert_eq!(p["table_rows"], resumed["table_rows"]);
    // export, serve-model and --init-from: tests/tables_export.rs.

    // Fields of two dims in a dcn at 2 ranks.
    let (dcn, _) = train("dim-dcn", 2, &[], &["--device", "host", "--model", "dcn", "--table", "c0,l2=a:dim=4", "--table", "l3=b:dim=24"]);
    ranks_agree(&dcn);
    assert!(dcn["test_auc"].as_f64().is_some());
}

#[test]
fn a_wide_deep_over_tables_of_different_dims_learns_and_predict_scores_as_its_evaluation() {
    let dims = ["--model", "wide-deep", "--device", "cpu", "--epochs", "4", "--table", "c3,l0=items:dim=8:capacity=65536", "--table", "c1,l5=more:dim=4:capacity=65536"];
    let (wide, ck) = train("dim-wide-deep", 1, &[], &dims);
    let (first, last) = loss_quarters(&wide);
    assert!(last < first - 0.02, "the loss falls: first quarter {first}, last quarter {last}");
    let auc = wide["test_auc"].as_f64().unwrap();
    let d = ck.parent().unwrap().join("data");
    let predict = ["predict", "--model", ck.to_str().unwrap(), "--data", data().to_str().unwrap(), "--sparse-columns", SPARSE, "--data-dir", d.to_str().unwrap()];
    let job = common::mpirun(1, &[], &[&predict[..], &["--test-fraction", "0.1", "--batch", "256", "--device", "cpu", "--json"]].concat());
    job.assert_ok();
    assert_eq!(job.summary()["auc"].as_f64(), Some(auc), "predict's AUC differs from train's evaluation");
    // At 2 ranks on the host device: the ranks agree.
    let (two, _) = train("dim-wide-deep-2", 2, &[], &[&dims[..2], &["--device", "host", "--max-steps", "8"], &dims[6..]].concat());
    ranks_agree(&two);
    // On a synthetic Criteo set of a planted logistic model (what a wide part learns; the
    // multi-hot set's 3,000 rows are too few for any model to score its held-out rows above
    // chance): well above chance, as the one-table wide-deep.
    let dir = common::scratch("tables-wide-deep-criteo");
    let tsv = dir.join("synth.tsv");
    ringrec::data::synth::synth(&tsv, 20_000, 1).unwrap();
    let d = dir.join("data");
    let args = ["train", "--data", tsv.to_str().unwrap(), "--data-dir", d.to_str().unwrap(), "--batch", "256", "--hidden", "16", "--threads", "1", "--json", "--device", "cpu", "--epochs", "2", "--model", "wide-deep"];
    let tables = ["--table", "C1,C2=a:dim=8:capacity=65536", "--table", "C3,C9=b:dim=4:capacity=65536"];
    let auc = |extra: &[&str]| {
        let job = common::mpirun(1, &[], &common::small_table(&[&args[..], extra].concat()));
        job.assert_ok();
        job.summary()["test_auc"].as_f64().unwrap()
    };
    let (one, dims) = (auc(&[]), auc(&tables));
    assert!(dims > 0.6 && one > 0.6 && (dims - one).abs() < 0.03, "AUC of different dims {dims}, of one table {one}");
}

#[test]
fn bad_tables_are_refused_naming_the_flag() {
    for (name, extra, says) in [
        ("unknown", &["--table", "c3,zz=a"][..], "--table c3,zz=a: the data has no field `zz`; its categorical fields are c0, c1"),
        ("twice", &["--table", "c3=a", "--table", "c4,c3=b"][..], "field `c3` is in table `a` and in table `b`"),
        ("names", &["--table", "c3=a", "--table", "c4=a"][..], "two tables named `a`"),
        ("dim0", &["--table", "c3=a:dim=0"][..], "dim=0"),
        ("tag", &["--table", "c3=a/b"][..], "table name `a/b`"),
        ("deepfm", &["--model", "deepfm", "--table", "c3=a:dim=8"][..], "--model deepfm needs one dim for every field"),
        ("cache", &["--device", "host", "--gpu-cache-mib", "1", "--gpu-cache-mode", "write-back", "--table", "c3=a"][..], "--table with --gpu-cache-mode write-back"),
    ] {
        let err = refused(name, extra);
        assert!(err.contains(says), "{name}: {err}");
    }
    // Tables of one dim (not --dim) suit every model.
    let (fm, _) = train("deepfm-same", 1, &[], &["--device", "cpu", "--model", "deepfm", "--max-steps", "3", "--dim", "8", "--table", "c3=a", "--table", "l1=b"]);
    assert!(fm["params_fnv"].is_string());
}
