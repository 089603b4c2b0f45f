//! `--weight-column N` (issue 17, part 2: per-sample weights from a weight column) under
//! real mpirun: weights all 2 train bit for bit like weights all 1 (a power of two cancels
//! in the weighted mean), weights all 1 train like the same rows without the column through
//! the weighted path, uneven weights change the model the same wherever the column is, a
//! malformed weight is skipped and counted (or stops the run, naming the line and the
//! column), a global batch of weight 0 changes no parameter and reports no NaN, bad
//! settings are refused with what to do, and `predict --weight-column` scores such lines as
//! it scores the rows without the column.

mod common;

use std::path::{Path, PathBuf};

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    common::scratch(name)
}

/// The last JSON line a job printed.
fn json_of(job: &common::Job) -> serde_json::Value {
    job.assert_ok();
    let line = job.stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON summary:\n{}", job.all()));
    serde_json::from_str(line).expect("summary JSON")
}

/// `ringrec train` on 2 ranks (batch 240, small MLP, losses recorded), data dir under `dir`.
fn run(dir: &Path, args: &[&str]) -> common::Job {
    let data_dir = dir.join("data");
    let mut a = vec!["train", "--no-progress", "--json", "--record-losses", "--hidden", "32,16", "--batch", "240"];
    a.extend_from_slice(args);
    common::mpirun(2, &[("RINGREC_DATA_DIR", data_dir.to_str().expect("utf8"))], &common::small_table(&a))
}

/// The lines of a synthetic TSV of `rows` rows (seed `seed`).
fn criteo_lines(dir: &Path, rows: u64, seed: u64) -> Vec<String> {
    let p = dir.join(format!("plain-{rows}-{seed}.tsv"));
    ringrec::data::synth(&p, rows, seed).expect("synth");
    std::fs::read_to_string(&p).expect("read").lines().map(String::from).collect()
}

/// `lines` with line i's weight `weight(i)` inserted as field `column` (1-based).
fn weighted(lines: &[String], column: usize, weight: impl Fn(usize) -> String) -> Vec<String> {
    lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut f: Vec<String> = l.split('\t').map(String::from).collect();
            f.insert(column - 1, weight(i));
            f.join("\t")
        })
        .collect()
}

/// Writes `lines` to `dir/name`; its path.
fn save(dir: &Path, name: &str, lines: &[String]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, lines.join("\n") + "\n").expect("write");
    p.to_str().expect("utf8").to_string()
}

#[test]
fn unit_and_power_of_two_weights_train_like_no_weights_and_uneven_ones_do_not() {
    let dir = scratch("equal");
    let rows = criteo_lines(&dir, 2400, 3);
    let plain = save(&dir, "plain.tsv", &rows);
    let ones = save(&dir, "ones.tsv", &weighted(&rows, 41, |_| "1".into()));
    let twos = save(&dir, "twos.tsv", &weighted(&rows, 41, |_| "2".into()));
    let uneven = |i: usize| format!("{}", 0.5 + (i % 3) as f32);
    let uneven41 = save(&dir, "uneven41.tsv", &weighted(&rows, 41, uneven));
    let uneven2 = save(&dir, "uneven2.tsv", &weighted(&rows, 2, uneven));
    let col = |data: &str, n: &str| json_of(&run(&dir, &["--data", data, "--weight-column", n]));
    let (s1, s2) = (col(&ones, "41"), col(&twos, "41"));
    // The plain rows through the weighted path (one file, day 0: every decay weight 1).
    let forced = json_of(&run(&dir, &["--data", &plain, "--decay-base", "2"]));
    let unweighted = json_of(&run(&dir, &["--data", &plain]));
    assert_eq!(s1["weight_column"], 41, "{s1}");
    assert!(unweighted["weight_column"].is_null(), "{unweighted}");
    assert_eq!(s1["train_rows"], unweighted["train_rows"]);
    assert_eq!(s1["params_fnv"], forced["params_fnv"], "weights all 1 from the column must train like the weighted path without it");
    assert_eq!(s1["params_fnv"], unweighted["params_fnv"], "weights all 1 must train like no weights at all");
    assert_eq!(s2["params_fnv"], s1["params_fnv"], "weights all 2: the weighted mean is unchanged bit for bit");
    assert_eq!(s2["losses"], s1["losses"]);
    // Uneven weights change the model, and the same wherever the column is.
    let (u41, u2) = (col(&uneven41, "41"), col(&uneven2, "2"));
    assert_ne!(u41["params_fnv"], s1["params_fnv"], "uneven weights must change the result");
    assert_eq!(u2["params_fnv"], u41["params_fnv"], "the weight in field 2 or field 41 is the same weight");
    assert_eq!(u2["weight_column"], 2);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_malformed_weight_is_skipped_and_counted_or_stops_the_run_naming_the_line() {
    let dir = scratch("bad");
    let rows = criteo_lines(&dir, 2400, 5);
    // Lines 5, 6 and 700 carry bad weights: negative, not a number, empty.
    let bad = |i: usize| match i {
        4 => "-1".to_string(),
        5 => "x".to_string(),
        699 => String::new(),
        _ => "1".to_string(),
    };
    let data = save(&dir, "bad.tsv", &weighted(&rows, 41, bad));
    let eval = save(&dir, "eval.tsv", &weighted(&criteo_lines(&dir, 480, 6), 41, |_| "1".into()));
    let job = run(&dir, &["--data", &data, "--eval-data", &eval, "--weight-column", "41"]);
    let s = json_of(&job);
    assert_eq!(s["train_rows"].as_u64(), Some(2397), "{s}");
    assert_eq!(s["test_rows"].as_u64(), Some(480), "the held-out file is read with the same column: {s}");
    assert!(job.all().contains("3 malformed line(s) were skipped"), "{}", job.all());
    // --max-bad-lines 0: the first bad weight stops it, naming the line and the column.
    let job = run(&dir, &["--data", &data, "--eval-data", &eval, "--weight-column", "41", "--max-bad-lines", "0"]);
    assert!(job.code != Some(0), "a bad weight with --max-bad-lines 0 must fail");
    assert!(job.all().contains("line 5: field 41 (the weight, --weight-column 41) \"-1\" is not a finite number >= 0"), "{}", job.all());
    // Criteo's 40 fields with --weight-column: every line is malformed, and says why.
    let plain = save(&dir, "plain.tsv", &rows);
    let job = run(&dir, &["--data", &plain, "--weight-column", "41"]);
    assert!(job.code != Some(0));
    assert!(job.all().contains("found 40, expected 41 tab-separated fields (the 40 Criteo fields and the weight in field 41"), "{}", job.all());
    // And 41 fields without the flag say how to read them.
    let job = run(&dir, &["--data", &data, "--max-bad-lines", "0"]);
    assert!(job.code != Some(0));
    assert!(job.all().contains("give its field number with --weight-column N"), "{}", job.all());
    std::fs::remove_dir_all(&dir).ok();
}

/// The table file of the newest checkpoint in `dir`.
fn table_of(dir: &Path) -> Vec<u8> {
    let step = ringrec::train::checkpoint::latest_step(dir).unwrap_or_else(|| panic!("no checkpoint in {}", dir.display()));
    std::fs::read(ringrec::train::checkpoint::step_dir(dir, step).join("table.rrt")).expect("table file")
}

/// `rows` synthetic rows (seed `seed`) with every weight `w` in field 41, saved as `name`.
fn all_weigh(dir: &Path, name: &str, rows: u64, seed: u64, w: &str) -> String {
    save(dir, name, &weighted(&criteo_lines(dir, rows, seed), 41, |_| w.into()))
}

#[test]
fn batches_of_weight_zero_change_no_parameter_and_report_no_nan() {
    let dir = scratch("zero");
    let (a, b, ones) = (all_weigh(&dir, "zero_a.tsv", 1200, 7, "0"), all_weigh(&dir, "zero_b.tsv", 1200, 8, "0"), all_weigh(&dir, "ones.tsv", 1200, 7, "1"));
    let col = |data: &str| json_of(&run(&dir, &["--data", data, "--weight-column", "41", "--no-eval"]));
    let (za, zb, one) = (col(&a), col(&b), col(&ones));
    // Weight-0 rows are kept (0 is not below the default minimum 0) and weigh nothing.
    let rows = |s: &serde_json::Value| s["train_rows"].as_u64().unwrap() + s["test_rows"].as_u64().unwrap();
    assert_eq!((rows(&za), za["samples_dropped_by_weight"].as_u64()), (1200, Some(0)), "{za}");
    let losses = za["losses"].as_array().expect("losses");
    assert_eq!(Some(losses.len() as u64), za["steps"].as_u64());
    assert!(losses.len() >= 4, "{za}");
    assert!(losses.iter().all(|l| l.as_f64() == Some(0.0)), "a batch of weight 0 reports loss 0, not NaN: {losses:?}");
    assert_eq!(za["train_loss"].as_f64(), Some(0.0), "{za}");
    // Neither file's rows moved the model: both end where they started.
    assert_eq!(za["params_fnv"], zb["params_fnv"], "steps of weight 0 must leave the parameters as they were");
    assert_ne!(one["params_fnv"], za["params_fnv"], "the same rows of weight 1 do train");
    // After batches that trained, batches of weight 0 leave the model where it was: the
    // dense optimizer (Adam, whose moments would still move it) is not stepped.
    let eval = all_weigh(&dir, "eval.tsv", 240, 10, "1");
    let days = |files: &str| json_of(&run(&dir, &["--data", files, "--eval-data", &eval, "--weight-column", "41"]));
    let (trained, then_zero) = (days(&ones), days(&format!("{ones},{a}")));
    assert_eq!(then_zero["steps"].as_u64(), Some(2 * trained["steps"].as_u64().unwrap()), "{then_zero}");
    assert_eq!(then_zero["params_fnv"], trained["params_fnv"], "steps of weight 0 after training moved the model");
    // --min-sample-weight above 0 drops them instead, and says so.
    let job = run(&dir, &["--data", &a, "--weight-column", "41", "--no-eval", "--min-sample-weight", "0.001"]);
    assert!(job.code != Some(0));
    assert!(job.all().contains(&format!("{} rows weigh less than --min-sample-weight", za["train_rows"])), "{}", job.all());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn rows_of_weight_zero_leave_the_dense_parameters_and_the_table_as_they_were() {
    let dir = scratch("zero-table");
    // The same rows with every label flipped: a zero gradient must not see the labels, so
    // the dense parameters and the table (rows, optimizer state) are the same bytes, with
    // either sparse normalisation (`weighted` divides by a weight sum of 0).
    let a = all_weigh(&dir, "zero_a.tsv", 1200, 7, "0");
    let flipped: Vec<String> = std::fs::read_to_string(&a)
        .expect("read")
        .lines()
        .map(|l| if let Some(rest) = l.strip_prefix("0\t") { format!("1\t{rest}") } else { format!("0\t{}", &l[2..]) })
        .collect();
    let flipped = save(&dir, "zero_a_flipped.tsv", &flipped);
    for norm in ["frequency", "weighted"] {
        let ran = |data: &str, name: &str| {
            let ck = dir.join(format!("ck-{norm}-{name}"));
            let s = json_of(&run(&dir, &["--data", data, "--weight-column", "41", "--no-eval", "--sparse-normalize", norm, "--checkpoint-dir", ck.to_str().expect("utf8")]));
            (s, table_of(&ck))
        };
        let ((s, t), (sf, tf)) = (ran(&a, "a"), ran(&flipped, "flipped"));
        assert_eq!(sf["params_fnv"], s["params_fnv"], "{norm}: flipped labels of weight 0 changed the dense parameters");
        assert!(t == tf, "{norm}: flipped labels of weight 0 changed the table");
        assert!(sf["losses"].as_array().expect("losses").iter().all(|l| l.as_f64() == Some(0.0)), "{sf}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_weight_column_settings_say_what_to_do() {
    let dir = scratch("flags");
    let rows = weighted(&criteo_lines(&dir, 480, 9), 41, |_| "1".into());
    let data = save(&dir, "w.tsv", &rows);
    for (args, want) in [
        (vec!["--weight-column", "0"], "give 1 to 41"),
        (vec!["--weight-column", "42"], "give 1 to 41"),
        (vec!["--weight-column", "41", "--sync-every", "2"], "--weight-column) are not combined with local steps"),
    ] {
        let mut a = vec!["--data", data.as_str()];
        a.extend_from_slice(&args);
        let job = run(&dir, &a);
        assert!(job.code != Some(0), "{args:?} should fail");
        assert!(job.all().contains(want), "{args:?}: want {want:?} in\n{}", job.all());
    }
    // A cache prepared with the column serves a run with it, and is refused by one without.
    let cache = dir.join("w.rrdata");
    let cache = cache.to_str().expect("utf8");
    let prepared = common::mpirun(1, &[], &["data", "prepare", &data, cache, "--weight-column", "41"]);
    prepared.assert_ok();
    let s = json_of(&run(&dir, &["--data", cache, "--weight-column", "41", "--no-eval"]));
    assert_eq!(s["train_rows"].as_u64().unwrap() + s["test_rows"].as_u64().unwrap(), 480, "{s}");
    let job = run(&dir, &["--data", cache, "--no-eval"]);
    assert!(job.code != Some(0));
    assert!(job.all().contains("was prepared with --weight-column 41 and this run reads its data with no weight column"), "{}", job.all());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn predict_reads_past_the_weight_column() {
    let dir = scratch("predict");
    let rows = criteo_lines(&dir, 960, 11);
    let plain = save(&dir, "plain.tsv", &rows);
    let data = save(&dir, "w.tsv", &weighted(&rows, 2, |i| format!("{}", 1 + i % 2)));
    let ck = dir.join("ck");
    let ck = ck.to_str().expect("utf8");
    json_of(&run(&dir, &["--data", &data, "--weight-column", "2", "--no-eval", "--checkpoint-dir", ck]));
    let data_dir = dir.join("data");
    let env = [("RINGREC_DATA_DIR", data_dir.to_str().expect("utf8"))];
    let predict = |file: &str, extra: &[&str], out: &str| {
        let out = dir.join(out);
        let mut a = vec!["predict", "--model", ck, "--data", file, "--out", out.to_str().expect("utf8"), "--json"];
        a.extend_from_slice(extra);
        (common::mpirun(2, &env, &a), out)
    };
    let (w, w_out) = predict(&data, &["--weight-column", "2"], "w.scores");
    let (p, p_out) = predict(&plain, &[], "p.scores");
    assert_eq!(json_of(&w)["rows"].as_u64(), Some(960), "{}", w.all());
    json_of(&p);
    let scores = std::fs::read_to_string(&w_out).expect("scores");
    assert_eq!(scores.lines().count(), 960);
    assert_eq!(scores, std::fs::read_to_string(&p_out).expect("scores"), "a score must not depend on the sample's weight");
    // Without the flag the 41-field lines are malformed, and say how to read them.
    let (bad, _) = predict(&data, &["--max-bad-lines", "0"], "bad.scores");
    assert!(bad.code != Some(0));
    assert!(bad.all().contains("--weight-column N"), "{}", bad.all());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_checkpoint_records_the_weight_column() {
    let dir = scratch("resume");
    // C26 all digits: the file reads with the weight in field 2 or (the digits) in field 41.
    let rows: Vec<String> = criteo_lines(&dir, 1440, 13)
        .iter()
        .map(|l| {
            let (head, _) = l.rsplit_once('\t').expect("40 fields");
            format!("{head}\t12345678")
        })
        .collect();
    let data = save(&dir, "w.tsv", &weighted(&rows, 2, |i| format!("{}", 1 + i % 3)));
    let ck = dir.join("ck");
    let ck = ck.to_str().expect("utf8");
    let w = ["--data", data.as_str(), "--no-eval", "--weight-column", "2", "--shuffle"];
    let full = json_of(&run(&dir, &[&w[..], &["--max-steps", "5"]].concat()));
    json_of(&run(&dir, &[&w[..], &["--max-steps", "2", "--checkpoint-dir", ck]].concat()));
    let resumed = json_of(&run(&dir, &[&w[..], &["--max-steps", "5", "--checkpoint-dir", ck, "--resume"]].concat()));
    assert_eq!(resumed["steps"], 3, "{resumed}");
    assert_eq!(resumed["params_fnv"], full["params_fnv"], "a resumed run with a weight column must continue exactly");
    // The same file read with the weight in field 41 cannot resume it.
    let other = ["--data", data.as_str(), "--no-eval", "--weight-column", "41", "--shuffle", "--max-steps", "5", "--checkpoint-dir", ck, "--resume"];
    let job = run(&dir, &other);
    assert!(job.code != Some(0), "resuming with another weight column must fail");
    assert!(job.all().contains("sample weights") && job.all().contains("--weight-column 2"), "{}", job.all());
    std::fs::remove_dir_all(&dir).ok();
}
