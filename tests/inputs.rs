//! `ringrec train` on several input files under real mpirun: a directory, a glob and a list
//! train like the files' concatenation, `--eval-data` scores exactly its file, a resume in
//! the second file is bit-identical, later files are prepared while training, memory does
//! not grow with the number of files, and inputs that name nothing are clear errors.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::TempDir;

/// Three day files (given out of natural order to the filesystem: day_1, day_2, day_10),
/// a held-out file, and the concatenations that equal them.
struct Days {
    _dir: TempDir,
    /// `days/` holding day_1.tsv, day_2.tsv, day_10.tsv.
    days: PathBuf,
    /// The day files in natural order.
    files: Vec<PathBuf>,
    /// A held-out day.
    eval: PathBuf,
    /// day_1 + day_2 + day_10 in one file.
    all: PathBuf,
    /// `all` + `eval` in one file.
    all_eval: PathBuf,
}

/// Rows of day_1, day_2, day_10 (batches of 256 end inside files: they span files) and of
/// the held-out day (a fifth of all_eval, so `--test-fraction 0.2` holds out exactly it).
const ROWS: [u64; 3] = [1500, 1300, 1700];
const EVAL_ROWS: u64 = 1125;

fn days() -> &'static Days {
    static DAYS: OnceLock<Days> = OnceLock::new();
    DAYS.get_or_init(|| {
        let dir = TempDir::new("inputs-days");
        let days = dir.path("days");
        std::fs::create_dir_all(&days).unwrap();
        let mut files = Vec::new();
        for (i, (name, rows)) in ["day_1.tsv", "day_2.tsv", "day_10.tsv"].iter().zip(ROWS).enumerate() {
            let p = days.join(name);
            ringrec::data::synth(&p, rows, 11 + i as u64).unwrap();
            files.push(p);
        }
        let eval = dir.path("eval.tsv");
        ringrec::data::synth(&eval, EVAL_ROWS, 14).unwrap();
        let cat = |parts: &[&Path], out: &Path| {
            let bytes: Vec<u8> = parts.iter().flat_map(|p| std::fs::read(p).unwrap()).collect();
            std::fs::write(out, bytes).unwrap();
        };
        let (all, all_eval) = (dir.path("all.tsv"), dir.path("all_eval.tsv"));
        let f: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
        cat(&f, &all);
        cat(&[&f[..], &[eval.as_path()]].concat(), &all_eval);
        Days { _dir: dir, days, files, eval, all, all_eval }
    })
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `ringrec train` on `np` ranks with its caches under `data_dir`, a small model, batches
/// of 256 rows, `args`.
fn train(np: usize, hosts: Option<&str>, data_dir: &Path, args: &[&str]) -> common::Job {
    train_batch(np, hosts, data_dir, "256", args)
}

/// [`train`] with batches of `batch` rows.
fn train_batch(np: usize, hosts: Option<&str>, data_dir: &Path, batch: &str, args: &[&str]) -> common::Job {
    let mut env = vec![("RINGREC_DATA_DIR", s(data_dir))];
    if let Some(k) = hosts {
        env.push(("RINGREC_RANKS_PER_HOST", k));
    }
    let mut a = vec!["train", "--no-progress", "--json", "--batch", batch, "--hidden", "32,16", "--dim", "8", "--table-capacity", "262144"];
    a.extend_from_slice(args);
    common::mpirun(np, &env, &a)
}

fn summary(job: &common::Job) -> serde_json::Value {
    job.assert_ok();
    let line = job.stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON summary:\n{}", job.all()));
    serde_json::from_str(line).expect("summary JSON")
}

#[test]
fn a_directory_a_glob_and_a_list_train_like_the_concatenation() {
    let d = days();
    let cache = TempDir::new("inputs-same");
    let glob = d.days.join("day_*.tsv");
    let f = &d.files;
    let list = format!("{},{}", s(&f[0]), s(&f[1]));
    // Batches cross the files' ends (1500 and 2800 are not multiples of 256); one epoch is
    // the three files in order, so all four runs are the same run.
    for (np, hosts) in [(2, None), (4, Some("2"))] {
        let runs = [
            ("directory", train(np, hosts, &cache.0, &["--data", s(&d.days)])),
            ("glob", train(np, hosts, &cache.0, &["--data", s(&glob)])),
            ("list", train(np, hosts, &cache.0, &["--data", &list, "--data", s(&f[2])])),
            ("concatenation", train(np, hosts, &cache.0, &["--data", s(&d.all), "--test-fraction", "0"])),
        ];
        let reference = summary(&runs[3].1);
        assert_eq!(reference["train_rows"], 4500);
        assert_eq!(reference["steps"], 18, "ceil(4500 / 256)");
        for (what, job) in &runs[..3] {
            let got = summary(job);
            assert_eq!(got["train_rows"], 4500, "{what}");
            assert_eq!(got["test_rows"], 0, "{what}: several files are not split");
            assert_eq!(got["params_fnv"], reference["params_fnv"], "{np} ranks: the {what} trains otherwise than the concatenation");
            assert_eq!(got["table_rows"], reference["table_rows"], "{what}");
        }
        if np == 2 {
            // The order given is the order trained: another order is another run.
            let other = summary(&train(np, hosts, &cache.0, &["--data", s(&f[2]), "--data", &list]));
            assert_ne!(other["params_fnv"], reference["params_fnv"], "day_10 first must train otherwise");
        }
    }
}

#[test]
fn eval_data_scores_exactly_the_eval_file() {
    let d = days();
    let cache = TempDir::new("inputs-eval");
    // Four ranks as two hosts. The same training rows and held-out rows as one file whose
    // last fifth is held out: the same model, the same AUC and log loss, bit for bit.
    let a = summary(&train(4, Some("2"), &cache.0, &["--data", s(&d.days), "--eval-data", s(&d.eval)]));
    let b = summary(&train(4, Some("2"), &cache.0, &["--data", s(&d.all_eval), "--test-fraction", "0.2"]));
    assert_eq!((&a["train_rows"], &a["test_rows"]), (&serde_json::json!(4500), &serde_json::json!(EVAL_ROWS)));
    assert_eq!((&b["train_rows"], &b["test_rows"]), (&serde_json::json!(4500), &serde_json::json!(EVAL_ROWS)));
    assert_eq!(a["params_fnv"], b["params_fnv"]);
    let auc = a["test_auc"].as_f64().expect("an AUC");
    assert!(auc > 0.0 && auc < 1.0, "AUC {auc}");
    assert_eq!(a["test_auc"], b["test_auc"], "the eval file's rows are exactly the held-out rows");
    assert_eq!(a["test_logloss"], b["test_logloss"]);
    // Another eval file: the same model, another score (the day files have their own
    // planted models: day_1, which was trained on, scores better than the unseen day).
    let c = summary(&train(4, Some("2"), &cache.0, &["--data", s(&d.days), "--eval-data", s(&d.files[0])]));
    assert_eq!((&c["params_fnv"], &c["test_rows"]), (&a["params_fnv"], &serde_json::json!(ROWS[0])));
    assert!(c["test_auc"].as_f64().expect("an AUC") > auc, "{c} vs {a}");
}

/// The newest checkpoint's dense state and table.
fn checkpoint(dir: &Path) -> (Vec<u8>, Vec<u8>) {
    let step = ringrec::train::checkpoint::latest_step(dir).unwrap_or_else(|| panic!("no checkpoint in {}", dir.display()));
    let d = ringrec::train::checkpoint::step_dir(dir, step);
    (std::fs::read(d.join("dense.bin")).unwrap(), std::fs::read(d.join("table.rrt")).unwrap())
}

#[test]
fn a_resume_in_the_second_file_is_bit_identical() {
    let d = days();
    let cache = TempDir::new("inputs-resume");
    let (full, part) = (TempDir::new("inputs-full"), TempDir::new("inputs-part"));
    // Two epochs, shuffled within each file; the interrupted run stops after step 8, whose
    // batch (rows 1792..2048 of the epoch) lies in day_2 (rows 1500..2800).
    let args = |dir: &TempDir| vec!["--data".to_string(), s(&d.days).to_string(), "--epochs".into(), "2".into(), "--shuffle".into(), "--checkpoint-dir".into(), s(&dir.0).into(), "--checkpoint-every".into(), "4".into()];
    let run = |dir: &TempDir, extra: &[&str]| {
        let mut a = args(dir);
        a.extend(extra.iter().map(|x| x.to_string()));
        let a: Vec<&str> = a.iter().map(|x| x.as_str()).collect();
        summary(&train(2, None, &cache.0, &a))
    };
    let uninterrupted = run(&full, &[]);
    assert_eq!(uninterrupted["global_step"], 36);
    let first = run(&part, &["--max-steps", "8"]);
    assert_eq!(first["global_step"], 8);
    let resumed = run(&part, &["--resume"]);
    assert_eq!((&resumed["steps"], &resumed["global_step"]), (&serde_json::json!(28), &serde_json::json!(36)));
    assert_eq!(resumed["params_fnv"], uninterrupted["params_fnv"]);
    let ((dense_a, table_a), (dense_b, table_b)) = (checkpoint(&full.0), checkpoint(&part.0));
    assert!(dense_a == dense_b, "the dense state differs");
    assert!(table_a == table_b, "the tables differ");
    // A resume with the files in another order is refused, naming the data.
    let job = train(2, None, &cache.0, &["--data", s(&d.files[1]), "--data", s(&d.files[0]), "--data", s(&d.files[2]), "--checkpoint-dir", s(&part.0), "--epochs", "3", "--shuffle", "--resume"]);
    assert_ne!(job.code, Some(0));
    assert!(job.stderr.contains("--data"), "{}", job.all());
}

#[test]
fn inputs_that_name_nothing_are_clear_errors() {
    let d = days();
    let cache = TempDir::new("inputs-errors");
    let empty = TempDir::new("inputs-empty");
    std::fs::write(empty.path(".hidden"), b"x").unwrap();
    std::fs::write(empty.path("old.rrdata"), b"x").unwrap();
    let glob = d.days.join("nope_*.tsv");
    let missing = d.days.join("missing.tsv");
    let cases: Vec<(Vec<&str>, String)> = vec![
        (vec!["--data", s(&glob)], format!("--data {}: matches no file in {}", glob.display(), d.days.display())),
        (vec!["--data", s(&empty.0)], format!("--data {}: the directory holds no data file (hidden files, .rrdata caches and .lock files are skipped)", empty.0.display())),
        (vec!["--data", s(&d.days), "--eval-data", s(&missing)], format!("--eval-data {}: cannot be read: No such file or directory", missing.display())),
        (
            vec!["--data", s(&d.days), "--test-fraction", "0.2"],
            "--test-fraction holds out the last rows of a single --data file, and --data names 3 files; hold a file out with --eval-data instead".into(),
        ),
        (
            vec!["--data", s(&d.all), "--eval-data", s(&d.eval), "--test-fraction", "0.1"],
            "--test-fraction and --eval-data: the held-out rows are either the last rows of one --data file or the --eval-data files; drop one".into(),
        ),
    ];
    for (args, want) in cases {
        let job = train(1, None, &cache.0, &args);
        assert!(job.code.is_some_and(|c| c != 0) && !job.timed_out, "{args:?}: {}", job.all());
        assert!(job.stderr.contains(&want), "{args:?}: expected\n  {want}\nin\n{}", job.stderr);
    }
}

/// Cache files (`.rrdata`) under `dir`'s cache directory whose name starts with `stem.`.
fn caches_of(dir: &Path, stem: &str) -> usize {
    std::fs::read_dir(dir.join("cache")).map_or(0, |d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&format!("{stem}.")) && e.file_name().to_string_lossy().ends_with(".rrdata")).count())
}

#[test]
fn later_files_are_prepared_while_the_first_trains() {
    let d = days();
    // One step: the run starts once day_1 is prepared, and ends long before day_10 (whose
    // preparation starts when training reaches day_2) has a cache.
    let cache = TempDir::new("inputs-early");
    summary(&train(2, None, &cache.0, &["--data", s(&d.days), "--max-steps", "1"]));
    assert_eq!(caches_of(&cache.0, "day_1"), 1, "the first file is prepared before training");
    assert_eq!(caches_of(&cache.0, "day_10"), 0, "the third file is not prepared before training starts");
    // A whole run: each later file's cache is ready when training reaches it.
    let cache = TempDir::new("inputs-ahead");
    let job = train(2, None, &cache.0, &["--data", s(&d.days)]);
    summary(&job);
    for (i, f) in [(2, &d.files[1]), (3, &d.files[2])] {
        let line = job.stderr.lines().find(|l| l.contains(&format!("training reaches {} (file {i} of 3", f.display()))).unwrap_or_else(|| panic!("no line for file {i}:\n{}", job.stderr));
        assert!(line.contains("its cache was prepared in the background"), "file {i} was not ready: {line}");
    }
    for stem in ["day_1", "day_2", "day_10"] {
        assert_eq!(caches_of(&cache.0, stem), 1, "{stem}");
    }
}

#[test]
fn peak_memory_does_not_grow_with_the_number_of_files() {
    // Three files of 40,000 rows (a 10.1 MiB cache each) against one of them. Were every
    // file's pages kept once read, three files would hold two caches more than one; as
    // it is, training moves from one file to the next holding one of them (and a few MiB
    // of the next one's, read to verify it).
    let dir = TempDir::new("inputs-rss");
    // Copies of one file: the same keys, so the same table, whatever the number of files.
    let files: Vec<PathBuf> = (0..3).map(|i| dir.path(&format!("big_{i}.tsv"))).collect();
    ringrec::data::synth(&files[0], 40_000, 21).unwrap();
    for f in &files[1..] {
        std::fs::copy(&files[0], f).unwrap();
    }
    let cache = TempDir::new("inputs-rss-cache");
    let rss = |data: &[&str]| {
        let a = [&["--no-eval"], data].concat();
        let s = summary(&train_batch(1, None, &cache.0, "4096", &a));
        s["peak_rss_mib"].as_f64().expect("peak RSS")
    };
    let one = rss(&["--data", s(&files[0]), "--test-fraction", "0"]);
    let two = rss(&["--data", s(&files[0]), "--data", s(&files[1])]);
    let three = rss(&["--data", s(&dir.0)]);
    let cache_mib = 40_000.0 * 264.0 / (1 << 20) as f64;
    let seen = format!("one file {one:.1} MiB, two {two:.1} MiB, three {three:.1} MiB (a cache is {cache_mib:.1} MiB)");
    eprintln!("peak RSS: {seen}");
    // From two files on, the background preparation's buffers (a few MiB) are there too.
    assert!(three < one + cache_mib, "peak RSS grows with the files: {seen}");
    assert!(three < two + 0.5 * cache_mib, "peak RSS grows with the files: {seen}");
}
