//! Inputs beyond the plain Criteo TSV (issue 33): gzip- and zstd-compressed TSVs, and Parquet
//! files — written by ringrec's own writer and, independently, by pyarrow (the tests' venv:
//! scripts/test-venv.sh; those tests are skipped without it, a failure in CI). Each prepared
//! cache is compared with the one its plain TSV gives, or with values computed here from
//! what the writer wrote; each bad file is a clear error naming it, never a panic.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use ringrec::data::cache::Dataset;
use ringrec::data::criteo::{category_key, dense_value, missing_key};
use ringrec::data::lists::list_key;
use ringrec::data::parquet_file::check_same_schema;
use ringrec::data::parquet_write::tsv_to_parquet;
use ringrec::data::prepare::{prepare_with, PrepareOptions};
use ringrec::data::synth;
use ringrec::data::{ColumnSpec, Fields};
use ringrec::hash::{crc32, fnv1a64};

fn dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("formats-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A cache's labels, dense values and keys.
fn columns(p: &Path) -> (Vec<f32>, Vec<f32>, Vec<u64>) {
    let ds = Dataset::open(p).unwrap();
    (ds.labels().to_vec(), ds.dense_all().to_vec(), ds.keys_all().to_vec())
}

/// A cache's bytes after its header (which records its source): every section and the
/// block sums.
fn body(p: &Path) -> Vec<u8> {
    let at = Dataset::open(p).unwrap().header().layout.labels_offset as usize;
    std::fs::read(p).unwrap()[at..].to_vec()
}

/// The temporary files left in `d` (names starting with a dot).
fn temporaries(d: &Path) -> Vec<String> {
    std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with('.')).collect()
}

fn opts(max_bad_lines: u64) -> PrepareOptions {
    PrepareOptions { chunk_bytes: 64 << 10, ..PrepareOptions::new(max_bad_lines) }.threads(3)
}

fn gzip(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(p).unwrap();
        out.extend(e.finish().unwrap());
    }
    out
}

/// Zstandard frames with their content checksums, as the `zstd` tool writes them.
fn zstd_frames(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        e.include_checksum(true).unwrap();
        e.write_all(p).unwrap();
        out.extend(e.finish().unwrap());
    }
    out
}

#[test]
fn gzip_and_zstd_tsvs_prepare_into_the_cache_of_their_text() {
    let d = dir("compressed");
    let tsv = d.join("day_0.tsv");
    synth(&tsv, 30_000, 7).unwrap();
    let mut text = std::fs::read(&tsv).unwrap();
    text.extend_from_slice(b"2\tnot a line\n");
    std::fs::write(&tsv, &text).unwrap();
    let want = prepare_with(&tsv, &d.join("tsv.rrdata"), &opts(10)).unwrap();
    assert_eq!((want.rows, want.report.lines, want.report.bad()), (30_000, 30_001, 1));
    let half = text[..text.len() / 2].iter().rposition(|&b| b == b'\n').unwrap() + 1;
    let (a, b) = text.split_at(half);
    // Two gzip members (as pigz / bgzip / `cat a.gz b.gz` write), two zstd frames.
    for (name, bytes) in [("day_0.tsv.gz", gzip(&[a, b])), ("day_0.tsv.zst", zstd_frames(&[a, b])), ("one.gz", gzip(&[&text]))] {
        let p = d.join(name);
        std::fs::write(&p, &bytes).unwrap();
        let out = d.join(format!("{name}.rrdata"));
        let s = prepare_with(&p, &out, &opts(10)).unwrap();
        assert_eq!((s.rows, &s.report), (want.rows, &want.report), "{name}: the rows and the bad-line report of its text");
        assert_eq!(s.source_crc32, crc32(&bytes), "{name}: the content digest is the compressed file's");
        assert_eq!(columns(&out), columns(&want.path), "{name}: the same cache as its text's");
        assert_eq!((s.bytes, body(&out)), (want.bytes, body(&want.path)), "{name}: byte for byte after the header");
        // Prepared once, then reused while its stat holds.
        let cache = d.join("cache");
        let first = Dataset::from_tsv_cached_with(&p, &cache, &opts(10)).unwrap().header().prepared_ns;
        let again = Dataset::from_tsv_cached_with(&p, &cache, &opts(10)).unwrap().header().prepared_ns;
        assert_eq!(first, again, "{name}: the cache is reused");
        // The bad-line limit counts as for the TSV.
        let e = prepare_with(&p, &d.join("x.rrdata"), &opts(0)).unwrap_err().to_string();
        assert!(e.contains("1 malformed line(s) by line 30001, more than --max-bad-lines 0"), "{e}");
    }
    // Nine zstd frames (as pzstd writes), cut anywhere, not at lines: decoded on 3 threads
    // frame by frame, the same cache.
    let cuts: Vec<usize> = (0..=9).map(|k| text.len() * k / 9).collect();
    let parts: Vec<&[u8]> = cuts.windows(2).map(|w| &text[w[0]..w[1]]).collect();
    let many = zstd_frames(&parts);
    let p = d.join("many.zst");
    std::fs::write(&p, &many).unwrap();
    let s = prepare_with(&p, &d.join("many.rrdata"), &opts(10)).unwrap();
    assert_eq!((s.rows, &s.report, s.source_crc32), (want.rows, &want.report, crc32(&many)));
    assert_eq!(columns(&d.join("many.rrdata")), columns(&want.path), "nine frames: the same cache as the text's");
    assert_eq!(body(&d.join("many.rrdata")), body(&want.path), "nine frames: byte for byte after the header");
    // One thread (decoding and parsing by turns), and chunks of a few lines: the same file.
    let s1 = prepare_with(&p, &d.join("many1.rrdata"), &PrepareOptions { chunk_bytes: 1000, ..opts(10) }.threads(1)).unwrap();
    assert_eq!((s1.rows, &s1.report, body(&d.join("many1.rrdata"))), (want.rows, &want.report, body(&want.path)));
    // Parsed on every thread (the frames' own threads decode them); one stream: on all but
    // the decoding one.
    assert_eq!((s.threads, s.parsing_threads), (3, 3));
    let one = prepare_with(&d.join("one.gz"), &d.join("one.rrdata"), &opts(10)).unwrap();
    assert_eq!((one.threads, one.parsing_threads), (3, 2));
    // A damaged frame of several: the error names the first byte of that frame.
    let frames = ringrec::data::compressed::zstd_frames(&std::fs::File::open(&p).unwrap(), many.len() as u64).unwrap();
    assert_eq!(frames.len(), 9);
    let f = frames[4];
    let mut bad = many.clone();
    bad[(f.start + (f.end - f.start) / 2) as usize..][..64].fill(0x55);
    std::fs::write(&p, &bad).unwrap();
    let e = prepare_with(&p, &d.join("x.rrdata"), &opts(u64::MAX)).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}: its zstd stream is damaged at byte {} of the file (line ", p.display(), f.start)), "{e}");
    // Cut short and damaged: errors naming the file, the byte and the line.
    for (name, bytes) in [("cut.gz", gzip(&[&text])), ("cut.zst", zstd_frames(&[&text])), ("cut9.zst", many.clone())] {
        let codec = if name.ends_with("gz") { "gzip" } else { "zstd" };
        let p = d.join(name);
        std::fs::write(&p, &bytes[..bytes.len() * 2 / 3]).unwrap();
        let e = prepare_with(&p, &d.join("x.rrdata"), &opts(10)).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}: its {codec} stream is cut short at byte ", p.display())) && e.contains("(line "), "{e}");
        let mut bad = bytes.clone();
        bad[bytes.len() / 2..bytes.len() / 2 + 100].fill(0x55);
        std::fs::write(&p, &bad).unwrap();
        // Every malformed line tolerated: the codec's own check (a CRC-32 per gzip member,
        // a checksum per zstd frame) names the damage.
        let e = prepare_with(&p, &d.join("x.rrdata"), &opts(u64::MAX)).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}: its {codec} stream is damaged at byte ", p.display())), "{e}");
        assert!(!d.join("x.rrdata").exists());
        assert_eq!(temporaries(&d), Vec::<String>::new(), "{name}: no cache or spilled column left behind");
    }
    // Malformed lines spread over the file, past the limit in its middle: the error of the
    // plain text, at the same line, from a stream decoded once (one stream or nine frames).
    let mut spread = Vec::new();
    for (i, line) in text.split_inclusive(|&b| b == b'\n').enumerate() {
        spread.extend_from_slice(line);
        if i % 4000 == 3999 {
            spread.extend_from_slice(b"1\tbad\n");
        }
    }
    let tsv2 = d.join("spread.tsv");
    std::fs::write(&tsv2, &spread).unwrap();
    let plain = prepare_with(&tsv2, &d.join("x.rrdata"), &opts(3)).unwrap_err().to_string();
    assert!(plain.contains("4 malformed line(s) by line 16004, more than --max-bad-lines 3"), "{plain}");
    let cuts: Vec<usize> = (0..=9).map(|k| spread.len() * k / 9).collect();
    let nine: Vec<&[u8]> = cuts.windows(2).map(|w| &spread[w[0]..w[1]]).collect();
    for (name, bytes) in [("spread.gz", gzip(&[&spread])), ("spread.zst", zstd_frames(&nine))] {
        let p = d.join(name);
        std::fs::write(&p, &bytes).unwrap();
        let e = prepare_with(&p, &d.join("x.rrdata"), &opts(3)).unwrap_err().to_string();
        assert_eq!(e.replace(&p.display().to_string(), "F"), plain.replace(&tsv2.display().to_string(), "F"), "{name}");
        assert_eq!(temporaries(&d), Vec::<String>::new(), "{name}: nothing left behind");
        let s = prepare_with(&p, &d.join(format!("{name}.rrdata")), &opts(10)).unwrap();
        let t = prepare_with(&tsv2, &d.join("spread.rrdata"), &opts(10)).unwrap();
        assert_eq!((s.rows, &s.report, body(&d.join(format!("{name}.rrdata")))), (t.rows, &t.report, body(&t.path)), "{name}");
        std::fs::remove_file(&t.path).unwrap();
    }
    // bzip2 and xz are still refused saying what to do.
    let p = d.join("day.bz2");
    std::fs::write(&p, b"BZh91AY&SY").unwrap();
    let e = prepare_with(&p, &d.join("x.rrdata"), &opts(10)).unwrap_err().to_string();
    assert!(e.contains("it is bzip2-compressed") && e.contains("bunzip2 -k"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_criteo_shaped_parquet_file_gives_the_cache_of_its_tsv() {
    let d = dir("criteo-parquet");
    let tsv = d.join("day_0.tsv");
    synth(&tsv, 20_000, 3).unwrap();
    let want = prepare_with(&tsv, &d.join("tsv.rrdata"), &opts(0)).unwrap();
    let pq = d.join("day_0.parquet");
    assert_eq!(tsv_to_parquet(&tsv, &pq, 3_000).unwrap(), 20_000);
    for threads in [1, 4] {
        let out = d.join(format!("pq{threads}.rrdata"));
        let s = prepare_with(&pq, &out, &opts(0).threads(threads)).unwrap();
        assert_eq!(s.rows, 20_000);
        assert_eq!(columns(&out), columns(&want.path), "{threads} thread(s): the same cache as the TSV's");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// Writes the pyarrow test files into `d` (see the script).
const PYARROW_FILES: &str = r#"
import sys, pyarrow as pa, pyarrow.parquet as pq
d = sys.argv[1]
n = 1000
label = pa.array([i % 3 == 0 for i in range(n)], pa.bool_())
count = pa.array([None if i % 7 == 0 else i - 10 for i in range(n)], pa.int32())
price = pa.array([i * 0.25 for i in range(n)], pa.float64())
item = pa.array([None if i % 5 == 0 else f"item-{i % 37}" for i in range(n)], pa.string()).dictionary_encode()
user = pa.array([i * 1000003 for i in range(n)], pa.int64())
big = pa.array([f"q{i % 11}" for i in range(n)], pa.large_string())
good = pa.table({"y": label, "count": count, "price": price, "item": item, "user": user, "query": big})
pq.write_table(good, f"{d}/good.parquet", row_group_size=128)
tags = pa.array([[i, i + 1] if i % 4 else [] for i in range(n)], pa.list_(pa.int64()))
pq.write_table(pa.table({"y": label, "tags": tags}), f"{d}/list.parquet", row_group_size=100)
large = pa.array([[i] for i in range(n)], pa.large_list(pa.int64()))
pq.write_table(pa.table({"y": label, "hist": large}), f"{d}/large_list.parquet")
pq.write_table(pa.table({"y": pa.array([str(i % 2) for i in range(n)]), "price": price}), f"{d}/string_label.parquet")
bad = pa.array([2 if i == 517 else i % 2 for i in range(n)], pa.int64())
pq.write_table(pa.table({"y": bad, "price": price}), f"{d}/label_2.parquet", row_group_size=100)
nul = pa.array([None if i == 250 else i % 2 for i in range(n)], pa.int64())
pq.write_table(pa.table({"y": nul, "price": price}), f"{d}/null_label.parquet", row_group_size=100)
raw = open(f"{d}/good.parquet", "rb").read()
open(f"{d}/cut.parquet", "wb").write(raw[: len(raw) * 2 // 3])
"#;

#[test]
fn parquet_files_written_by_pyarrow_are_read_as_written() {
    let Some(py) = common::test_python("pyarrow") else { return };
    let d = dir("pyarrow");
    let ok = Command::new(&py).args(["-c", PYARROW_FILES]).arg(&d).status().unwrap();
    assert!(ok.success(), "the pyarrow script failed");
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let o = opts(0).columns(ColumnSpec::from_flags(Some("y".into()), names(&["count", "price"]), names(&["item", "user", "query"]), None));

    // Row groups of 128 rows, dictionary-encoded strings, a large string, nulls.
    let out = d.join("good.rrdata");
    let s = prepare_with(&d.join("good.parquet"), &out, &o).unwrap();
    let n = 1000usize;
    assert_eq!(s.rows, n as u64);
    assert_eq!(s.nulls, (0..n).filter(|i| i % 7 == 0).count() as u64 + (0..n).filter(|i| i % 5 == 0).count() as u64);
    let (labels, dense, keys) = columns(&out);
    assert_eq!(Dataset::open(&out).unwrap().fields(), Fields { dense: 2, sparse: 3 }, "the file's own columns, no padding");
    assert_eq!((dense.len(), keys.len()), (2 * n, 3 * n));
    for i in 0..n {
        assert_eq!(labels[i], f32::from(i % 3 == 0), "row {i}");
        let row = &dense[i * 2..(i + 1) * 2];
        let count = if i % 7 == 0 { 0.0 } else { dense_value(i as i64 - 10) };
        assert_eq!(row, [count, (i as f64 * 0.25) as f32], "row {i}: count (log), price (as is)");
        let row = &keys[i * 3..(i + 1) * 3];
        let item = if i % 5 == 0 { missing_key(0) } else { category_key(0, fnv1a64(format!("item-{}", i % 37).as_bytes())) };
        let user = category_key(1, (i as u64) * 1000003);
        let query = category_key(2, fnv1a64(format!("q{}", i % 11).as_bytes()));
        assert_eq!(row, [item, user, query], "row {i}: item (dictionary), user (an integer in --sparse-columns), query (large string)");
    }

    // Inferred, the integer `user` is a dense feature, the strings categorical.
    let inferred = opts(0).columns(ColumnSpec::from_flags(Some("y".into()), vec![], vec![], None));
    prepare_with(&d.join("good.parquet"), &out, &inferred).unwrap();
    let (_, dense2, keys2) = columns(&out);
    assert_eq!(dense2[2], dense_value(0), "row 0: user 0, dense (log)");
    assert_eq!(dense2[3 + 2], dense_value(1000003), "row 1: user, dense (log)");
    assert_eq!(keys2[2 + 1], category_key(1, fnv1a64(b"q1")), "row 1: query is field 2 now");
    // Named columns that are not there, or cannot be what they are named as.
    let named = |dense: &[&str], sparse: &[&str]| inferred.clone().columns(ColumnSpec::from_flags(Some("y".into()), names(dense), names(sparse), None));
    let e = prepare_with(&d.join("good.parquet"), &out, &named(&["cost"], &[])).unwrap_err().to_string();
    assert!(e.ends_with("column `cost`: no such column, but --dense-columns names it"), "{e}");
    let e = prepare_with(&d.join("good.parquet"), &out, &named(&["item"], &[])).unwrap_err().to_string();
    assert!(e.ends_with("column `item`: a string column cannot be a dense feature (--dense-columns)"), "{e}");
    let e = prepare_with(&d.join("good.parquet"), &out, &named(&[], &["price"])).unwrap_err().to_string();
    assert!(e.ends_with("column `price`: a floating-point column cannot be a categorical field (--sparse-columns)"), "{e}");

    // Each bad case: the file, the row group or footer, the column.
    let o = inferred;
    let err = |name: &str| prepare_with(&d.join(name), &d.join("x.rrdata"), &o).unwrap_err().to_string();
    let path = |name: &str| d.join(name).display().to_string();
    // A list column (row groups of 100, empty lists among them) and a large list: multi-hot
    // fields, a version-4 cache's bags of the ids hashed with the list field's number.
    for (file, name, bag) in [("list", "tags", (|i: u64| if i % 4 != 0 { vec![i, i + 1] } else { vec![] }) as fn(u64) -> Vec<u64>), ("large_list", "hist", |i| vec![i])] {
        let out = d.join(format!("{file}.rrdata"));
        prepare_with(&d.join(format!("{file}.parquet")), &out, &o).unwrap();
        let ds = Dataset::open(&out).unwrap();
        assert_eq!((ds.len(), ds.list_names()), (n, &[name.to_string()][..]));
        for i in 0..n {
            let want: Vec<u64> = bag(i as u64).into_iter().map(|id| list_key(0, id)).collect();
            assert_eq!(ds.bag(i, 0), want, "{file}: row {i}");
        }
    }
    let e = err("string_label.parquet");
    assert!(e.starts_with(&format!("{}: column `y`: the label is of type BYTE_ARRAY, not a boolean or a number", path("string_label.parquet"))), "{e}");
    let e = err("label_2.parquet");
    assert_eq!(e, format!("{}: row group 5, column `y`: row 517: label 2 is not 0 or 1", path("label_2.parquet")));
    let e = err("null_label.parquet");
    assert!(e.starts_with(&format!("{}: row group 2, column `y`: row 250: the label is null", path("null_label.parquet"))), "{e}");
    let e = err("cut.parquet");
    assert!(e.starts_with(&format!("{}: footer: ", path("cut.parquet"))), "{e}");
    let e = prepare_with(&d.join("good.parquet"), &d.join("x.rrdata"), &opts(0)).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}: column `label`: no such column (the file has y, count, price, item, user, query)", path("good.parquet"))), "{e}");
    assert!(!d.join("x.rrdata").exists(), "a failed preparation leaves no file");

    // Inputs of one run with different schemas: refused naming the first column that differs.
    let (good, other) = (d.join("good.parquet"), d.join("label_2.parquet"));
    check_same_schema(&[good.clone(), d.join("good.rrdata"), good.clone()], &o.columns).unwrap();
    let e = check_same_schema(&[good, other.clone()], &o.columns).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}: column `price`: the schema differs from that of {}: its input 1 is `price`", other.display(), path("good.parquet"))), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// The JSON summary `ringrec train` prints last.
fn summary(job: &common::Job) -> serde_json::Value {
    let line = job.stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON summary:\n{}", job.all()));
    serde_json::from_str(line).expect("summary JSON")
}

#[test]
fn the_same_rows_train_to_the_same_parameters_from_a_tsv_its_gzip_and_its_parquet() {
    let d = dir("train");
    let tsv = d.join("day.tsv");
    synth(&tsv, 6_000, 5).unwrap();
    let text = std::fs::read(&tsv).unwrap();
    std::fs::write(d.join("day.tsv.gz"), gzip(&[&text])).unwrap();
    tsv_to_parquet(&tsv, &d.join("day.parquet"), 1_000).unwrap();
    let train = |input: &str, extra: &[&str]| {
        let data = d.join(format!("data-{input}"));
        let input = d.join(input);
        let mut args = vec!["train", "--no-progress", "--json", "--data", input.to_str().unwrap(), "--batch", "256", "--max-steps", "8", "--hidden", "32", "--table-capacity", "65536"];
        args.extend_from_slice(extra);
        common::mpirun(1, &[("RINGREC_DATA_DIR", data.to_str().unwrap())], &args)
    };
    let want = train("day.tsv", &[]);
    want.assert_ok();
    assert!(summary(&want)["params_fnv"].is_string(), "{}", want.all());
    for input in ["day.tsv.gz", "day.parquet"] {
        let job = train(input, &[]);
        job.assert_ok();
        assert_eq!(summary(&job)["params_fnv"], summary(&want)["params_fnv"], "{input}: the same parameters as the TSV's");
    }
    // predict reads the same inputs: the same scores from the TSV and from its Parquet file.
    let ck = d.join("ck");
    train("day.parquet", &["--checkpoint-dir", ck.to_str().unwrap()]).assert_ok();
    let scores = |input: &str| {
        let (out, data) = (d.join(format!("{input}.scores")), d.join(format!("data-{input}")));
        let input = d.join(input);
        let args = ["predict", "--model", ck.to_str().unwrap(), "--data", input.to_str().unwrap(), "--out", out.to_str().unwrap()];
        common::mpirun(1, &[("RINGREC_DATA_DIR", data.to_str().unwrap())], &args).assert_ok();
        std::fs::read(&out).unwrap()
    };
    let tsv_scores = scores("day.tsv");
    assert!(!tsv_scores.is_empty());
    assert_eq!(scores("day.parquet"), tsv_scores, "predict: the Parquet file scores as its TSV");
    assert_eq!(scores("day.tsv.gz"), tsv_scores, "predict: the gzip file scores as its TSV");
    // The exported bundle scores the Parquet file in scripts/bundle_predict.py (pyarrow) as
    // `predict` does.
    if let Some(py) = common::test_python("numpy, pyarrow") {
        let bundle = d.join("bundle");
        let export = ["export", "--model", ck.to_str().unwrap(), "--out", bundle.to_str().unwrap()];
        common::mpirun(1, &[("RINGREC_DATA_DIR", d.join("data-export").to_str().unwrap())], &export).assert_ok();
        let model: serde_json::Value = serde_json::from_slice(&std::fs::read(bundle.join("model.json")).unwrap()).unwrap();
        assert!(model["input"]["parquet"].as_str().unwrap().contains("FNV-1a 64"), "model.json records the Parquet rules");
        let mut c = Command::new(py);
        c.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bundle_predict.py")).arg(&bundle).arg(d.join("day.parquet"));
        c.arg("--compare").arg(d.join("day.parquet.scores")).args(["--tolerance", "1e-6"]);
        common::run_with_timeout(c, std::time::Duration::from_secs(120)).assert_ok();
    }
    let parts = d.join("parts");
    std::fs::create_dir_all(&parts).unwrap();
    std::fs::copy(d.join("day.parquet"), parts.join("part-0.parquet")).unwrap();
    std::fs::write(parts.join("_SUCCESS"), b"").unwrap();
    let job = train("parts", &[]);
    job.assert_ok();
    assert_eq!(summary(&job)["params_fnv"], summary(&want)["params_fnv"], "a directory of Parquet parts (Spark's _SUCCESS skipped)");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn the_generated_multi_hot_set_reads_back_with_pyarrow_and_prepares_into_a_version_4_cache() {
    let d = dir("multihot");
    let p = d.join("mh.parquet");
    let s = ringrec::data::multihot::synth_multi_hot(&p, 20_000, 3).unwrap();
    assert_eq!(s.rows, 20_000);
    let per_list = s.list_ids as f64 / (20_000.0 * 6.0);
    assert!((per_list - 20.0).abs() < 0.5, "mean list length {per_list}");
    assert!(s.bayes_auc > s.first_id_auc + 0.05, "the lists carry the signal: {s:?}");
    assert_eq!(ringrec::data::multihot::synth_multi_hot(&d.join("again.parquet"), 20_000, 3).unwrap().positives, s.positives, "deterministic for a seed");
    // Inferred, the lists are the multi-hot fields of a version-4 cache, every id in a bag.
    let out = d.join("x.rrdata");
    prepare_with(&p, &out, &opts(0)).unwrap();
    let ds = Dataset::open(&out).unwrap();
    let lists: Vec<String> = (0..6).map(|g| format!("l{g}")).collect();
    assert_eq!((ds.len(), ds.list_names()), (20_000, &lists[..]));
    let ids: usize = (0..ds.len()).flat_map(|i| (0..6).map(move |g| (i, g))).map(|(i, g)| ds.bag(i, g).len()).sum();
    assert_eq!(ids as u64, s.list_ids);
    // A list column named as a dense feature is refused, naming it.
    let dense_list = PrepareOptions { columns: ColumnSpec { dense: vec!["l3".into()], ..Default::default() }, ..opts(0) };
    let e = prepare_with(&p, &out, &dense_list).unwrap_err().to_string();
    assert!(e.ends_with("column `l3`: a list column (multi-hot) cannot be a dense feature (--dense-columns)"), "{e}");
    let Some(py) = common::test_python("pyarrow") else { return };
    let check = r#"
import sys, numpy as np, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
assert t.num_rows == int(sys.argv[2]), t.num_rows
assert t.column_names == ["label"] + [f"c{f}" for f in range(10)] + [f"l{g}" for g in range(6)], t.column_names
assert int(t.column("label").to_numpy().sum()) == int(sys.argv[3])
ids = 0
for g in range(6):
    c = t.column(f"l{g}").combine_chunks()
    lens = np.diff(c.offsets.to_numpy())
    ids += int(lens.sum())
    assert lens.min() == 0 and lens.max() == 40, (lens.min(), lens.max())
assert ids == int(sys.argv[4]), ids
v = t.column("c0").to_numpy()
counts = np.bincount(v)
assert counts[0] > 20 * np.median(counts[counts > 0]), "Zipf-like: id 0 is everywhere"
print("ok")
"#;
    let out = Command::new(&py).args(["-c", check]).arg(&p).arg(s.rows.to_string()).arg(s.positives.to_string()).arg(s.list_ids.to_string()).output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok", "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_dir_all(&d).unwrap();
}

/// Writes `sch.parquet` for the schema tests into `d`.
const PYARROW_SCHEMA_FILE: &str = r#"
import sys, pyarrow as pa, pyarrow.parquet as pq
d = sys.argv[1]
n = 600
cols = {
    "y": pa.array([i % 3 == 0 for i in range(n)], pa.bool_()),
    "count": pa.array([None if i % 7 == 0 else i - 10 for i in range(n)], pa.int32()),
    "price": pa.array([None if i % 11 == 0 else i * 0.25 for i in range(n)], pa.float64()),
    "item": pa.array([None if i % 5 == 0 else f"item-{i % 37}" for i in range(n)], pa.string()),
    "user": pa.array([i * 1000003 for i in range(n)], pa.int64()),
    "w": pa.array([(i % 4) * 0.5 for i in range(n)], pa.float64()),
    "wstr": pa.array([str(i) for i in range(n)], pa.string()),
    "wneg": pa.array([-1.0 if i == 42 else 1.0 for i in range(n)], pa.float64()),
    "wnull": pa.array([None if i == 9 else 1.0 for i in range(n)], pa.float64()),
    "tags": pa.array([[i, i + 1] for i in range(n)], pa.list_(pa.int64())),
}
pq.write_table(pa.table(cols), f"{d}/sch.parquet", row_group_size=100)
"#;

#[test]
fn a_schema_file_names_columns_transforms_a_weight_and_counts_nulls() {
    let Some(py) = common::test_python("pyarrow") else { return };
    let d = common::scratch("formats-schema");
    assert!(Command::new(&py).args(["-c", PYARROW_SCHEMA_FILE]).arg(&d).status().unwrap().success(), "the pyarrow script failed");
    let src = d.join("sch.parquet");
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let schema = |name: &str, text: &str| {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        ColumnSpec::resolve(Some(&p), ColumnSpec::default())
    };
    let flags = ColumnSpec::from_flags(Some("y".into()), names(&["count", "price"]), names(&["item", "user"]), None);
    let file = schema("same.toml", "label = \"y\"\ndense = [\"count\", \"price\"]\nsparse = [\"item\", \"user\"]\n").unwrap();
    assert_eq!(file.cache_id(), flags.cache_id(), "a schema file and the same flags name the same cache");
    let (a, b) = (d.join("flags.rrdata"), d.join("file.rrdata"));
    let s = prepare_with(&src, &a, &opts(0).columns(flags.clone())).unwrap();
    prepare_with(&src, &b, &opts(0).columns(file)).unwrap();
    assert_eq!(columns(&a), columns(&b), "a schema file reads as the same flags");

    // Nulls by column, in the schema's order (the label, then the features in file order).
    let n = 600usize;
    let count = |m: usize| (0..n).filter(|i| i % m == 0).count() as u64;
    let want: Vec<(String, u64)> = [("y", 0), ("count", count(7)), ("price", count(11)), ("item", count(5)), ("user", 0)].iter().map(|(c, k)| (c.to_string(), *k)).collect();
    assert_eq!(s.column_nulls, want);
    assert_eq!(s.nulls, count(7) + count(11) + count(5));
    let footer = ringrec::data::parquet_file::null_counts(&src, &flags).unwrap();
    assert_eq!(footer, want.iter().map(|(c, k)| (c.clone(), Some(*k))).collect::<Vec<_>>(), "the footer's statistics count the same nulls");

    // Transforms: `none` keeps an integer as it is, `log` takes a float's ln(1 + max(x, 0)).
    let t = schema("t.toml", "label = \"y\"\nsparse = [\"item\", \"user\"]\n[dense]\ncount = \"none\"\nprice = { transform = \"log\" }\n").unwrap();
    assert_ne!(t.cache_id(), flags.cache_id(), "another transform, another cache");
    let c = d.join("t.rrdata");
    prepare_with(&src, &c, &opts(0).columns(t)).unwrap();
    let ((_, plain, keys), (_, dense, keys_t)) = (columns(&a), columns(&c));
    assert_eq!(keys, keys_t);
    for i in 0..n {
        let (count, price) = (if i % 7 == 0 { 0.0 } else { (i as f32) - 10.0 }, if i % 11 == 0 { 0.0 } else { (i as f64 * 0.25).ln_1p() as f32 });
        assert_eq!(dense[i * 2..i * 2 + 2], [count, price], "row {i}");
        let log_count = if i % 7 == 0 { 0.0 } else { dense_value(i as i64 - 10) };
        assert_eq!(plain[i * 2..i * 2 + 2], [log_count, if i % 11 == 0 { 0.0 } else { (i as f64 * 0.25) as f32 }], "row {i}: the defaults");
    }

    // A weight column, from the schema file or --weight-column NAME: a version-3 cache.
    let w = schema("w.toml", "label = \"y\"\nweight = \"w\"\ndense = [\"count\", \"price\"]\nsparse = [\"item\", \"user\"]\n").unwrap();
    let by_flag = ColumnSpec { weight: Some("w".into()), ..flags.clone() };
    assert_eq!(w.cache_id(), by_flag.cache_id());
    for (k, spec) in [w, by_flag].into_iter().enumerate() {
        let out = d.join(format!("w{k}.rrdata"));
        let s = prepare_with(&src, &out, &opts(0).columns(spec)).unwrap();
        assert_eq!(s.column_nulls[..2], [("y".to_string(), 0), ("w".to_string(), 0)]);
        assert_eq!(s.column_nulls[2..], want[1..]);
        assert_eq!(columns(&out), columns(&a), "the weight is no feature");
        let ds = Dataset::open(&out).unwrap();
        assert_eq!(ds.header().weight_column, Some(ringrec::data::prepare::NAMED_WEIGHT_COLUMN));
        let want: Vec<f32> = (0..n).map(|i| (i % 4) as f32 * 0.5).collect();
        assert_eq!(ds.weights().unwrap(), &want[..]);
    }

    // Each bad schema: the file, the key, the column.
    let path = src.display().to_string();
    let err = |name: &str, text: &str| -> String {
        match schema(name, text) {
            Ok(spec) => prepare_with(&src, &d.join("x.rrdata"), &opts(0).columns(spec)).unwrap_err().to_string(),
            Err(e) => e.to_string(),
        }
    };
    let at = |name: &str| d.join(name).display().to_string();
    let e = err("u.toml", "label = \"y\"\ncolumns = [\"a\"]\n");
    assert_eq!(e, format!("{}: key `columns`: not a key of a schema file (they are label, weight, dense, sparse, multi_hot)", at("u.toml")));
    let e = err("m.toml", "label = \"y\"\ndense = [\"cost\"]\n");
    assert_eq!(e, format!("{path}: column `cost`: no such column, but key `dense` of {} names it", at("m.toml")));
    let e = err("s.toml", "label = \"y\"\ndense = [\"item\"]\n");
    assert_eq!(e, format!("{path}: column `item`: a string column cannot be a dense feature (key `dense` of {})", at("s.toml")));
    let e = err("ty.toml", "label = \"y\"\nsparse = [\"item\", 3]\n");
    assert_eq!(e, format!("{}: key `sparse[1]`: of type integer, not a column name (a string)", at("ty.toml")));
    let e = err("ws.toml", "label = \"y\"\nweight = \"wstr\"\nsparse = [\"item\"]\n");
    assert!(e.starts_with(&format!("{path}: column `wstr`: the weight is of type BYTE_ARRAY, not a number")), "{e}");
    let e = err("wn.toml", "label = \"y\"\nweight = \"wneg\"\nsparse = [\"item\"]\n");
    assert_eq!(e, format!("{path}: row group 0, column `wneg`: row 42: weight -1 is not a finite number >= 0"));
    let e = err("wz.toml", "label = \"y\"\nweight = \"wnull\"\nsparse = [\"item\"]\n");
    assert!(e.starts_with(&format!("{path}: row group 0, column `wnull`: row 9: the weight is null")), "{e}");
    let e = err("mh.toml", "label = \"y\"\nmulti_hot = [\"item\"]\n");
    assert_eq!(e, format!("{path}: column `item`: named multi-hot by key `multi_hot` of {}, but not a list column: name a single-id column in `sparse`", at("mh.toml")));
    let e = err("tr.toml", "label = \"y\"\n[dense]\ncount = \"sqrt\"\n");
    assert!(e.starts_with(&format!("{}: key `dense.count`: transform \"sqrt\" is not one of", at("tr.toml"))), "{e}");
    // A TSV's weight is a field; a Parquet file's a column.
    let tsv = d.join("day.tsv");
    synth(&tsv, 100, 1).unwrap();
    let e = prepare_with(&tsv, &d.join("x.rrdata"), &opts(0).columns(ColumnSpec::from_flags(None, vec![], vec![], Some("w".into())))).unwrap_err().to_string();
    assert!(e.contains("the weight column `w` is a Parquet file's column; a TSV's weight is a field number"), "{e}");
    let e = prepare_with(&src, &d.join("x.rrdata"), &opts(0).weight_column(Some(41))).unwrap_err().to_string();
    assert!(e.contains("--weight-column 41 numbers a TSV's fields; a Parquet file's weight is a column"), "{e}");
    assert!(!d.join("x.rrdata").exists());
    std::fs::remove_dir_all(&d).unwrap();
}

/// Adds the weight column `w` (`(i % 4) / 2 + 1/4`) to the Parquet file argv[1] as argv[2].
const PYARROW_ADD_WEIGHT: &str = r#"
import sys, pyarrow as pa, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
t = t.append_column("w", pa.array([(i % 4) * 0.5 + 0.25 for i in range(t.num_rows)], pa.float64()))
pq.write_table(t, sys.argv[2], row_group_size=1000)
"#;

#[test]
fn a_schema_file_trains_as_its_flags_and_a_parquet_weight_as_a_tsv_weight() {
    let d = common::scratch("formats-schema-train");
    let tsv = d.join("day.tsv");
    synth(&tsv, 4_000, 5).unwrap();
    let pq = d.join("day.parquet");
    tsv_to_parquet(&tsv, &pq, 1_000).unwrap();
    let path = |p: &Path| p.to_str().unwrap().to_string();
    let train = |input: &Path, extra: &[&str]| {
        let data = d.join("data");
        let mut args = vec!["train", "--no-progress", "--json", "--data", input.to_str().unwrap(), "--batch", "256", "--max-steps", "6", "--hidden", "16", "--table-capacity", "65536"];
        args.extend_from_slice(extra);
        common::mpirun(1, &[("RINGREC_DATA_DIR", data.to_str().unwrap())], &args)
    };
    let fnv = |job: &common::Job| {
        job.assert_ok();
        summary(job)["params_fnv"].as_str().unwrap().to_string()
    };
    let (dense, sparse): (Vec<String>, Vec<String>) = ((1..=13).map(|i| format!("I{i}")).collect(), (1..=26).map(|i| format!("C{i}")).collect());
    let quoted = |v: &[String]| v.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", ");
    let write = |name: &str, text: String| {
        std::fs::write(d.join(name), text).unwrap();
        path(&d.join(name))
    };
    let same = write("same.toml", format!("label = \"label\"\ndense = [{}]\nsparse = [{}]\n", quoted(&dense), quoted(&sparse)));
    let none = write("none.toml", format!("label = \"label\"\nsparse = [{}]\n[dense]\nI1 = \"none\"\n{}\n", quoted(&sparse), dense[1..].iter().map(|n| format!("{n} = {{}}")).collect::<Vec<_>>().join("\n")));
    let (dense_flag, sparse_flag) = (dense.join(","), sparse.join(","));
    let by_flags = train(&pq, &["--label-column", "label", "--dense-columns", &dense_flag, "--sparse-columns", &sparse_flag]);
    let want = fnv(&by_flags);
    let ck = d.join("ck");
    let by_file = train(&pq, &["--schema", &same, "--checkpoint-dir", ck.to_str().unwrap()]);
    assert_eq!(fnv(&by_file), want, "a schema file trains as the same flags");
    let nulls = summary(&by_file)["column_nulls"].clone();
    let prepared = prepare_with(&pq, &d.join("x.rrdata"), &opts(0)).unwrap();
    let counted: u64 = nulls.as_array().unwrap().iter().map(|c| c["nulls"].as_u64().unwrap()).sum();
    assert_eq!((nulls.as_array().unwrap().len(), nulls[0]["column"].as_str(), counted), (40, Some("label"), prepared.nulls), "the summary's nulls by column: {nulls}");
    assert!(prepared.nulls > 0, "the synthetic set has empty fields");
    let ck_none = d.join("ck-none");
    assert_ne!(fnv(&train(&pq, &["--schema", &none, "--checkpoint-dir", ck_none.to_str().unwrap()])), want, "transform none on I1 trains another model");
    // The flags and the file are exclusive; a resume or a warm start on other columns is refused, naming them.
    let e = train(&pq, &["--schema", &same, "--label-column", "label"]);
    assert!(e.code != Some(0) && e.all().contains(&format!("--schema {same} and --label-column both name a Parquet input's columns")), "{}", e.all());
    let e = train(&pq, &["--schema", &none, "--checkpoint-dir", ck.to_str().unwrap(), "--resume"]);
    assert!(e.code != Some(0) && e.all().contains("Parquet columns: the checkpoint was written with") && e.all().contains("transforms I1=none (column `I1`: dense there, dense, transform none here)"), "{}", e.all());
    let e = train(&pq, &["--schema", &none, "--init-from", ck.to_str().unwrap()]);
    assert!(e.code != Some(0) && e.all().contains("column `I1` is dense there and dense, transform none here"), "{}", e.all());

    let Some(py) = common::test_python("numpy, pyarrow") else { return };
    // The bundle records the schema; bundle_predict.py scores with its transforms as predict does.
    let bundle = d.join("bundle");
    let env = [("RINGREC_DATA_DIR", d.join("data"))];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.to_str().unwrap())).collect();
    common::mpirun(1, &env, &["export", "--model", ck_none.to_str().unwrap(), "--out", bundle.to_str().unwrap()]).assert_ok();
    let model: serde_json::Value = serde_json::from_slice(&std::fs::read(bundle.join("model.json")).unwrap()).unwrap();
    assert_eq!(model["input"]["schema"]["transforms"], serde_json::json!([["I1", "none"]]), "{}", model["input"]);
    let scores = d.join("scores.tsv");
    common::mpirun(1, &env, &["predict", "--model", ck_none.to_str().unwrap(), "--data", pq.to_str().unwrap(), "--schema", &none, "--out", scores.to_str().unwrap()]).assert_ok();
    let mut c = Command::new(&py);
    c.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bundle_predict.py")).arg(&bundle).arg(&pq).arg("--compare").arg(&scores).args(["--tolerance", "1e-6"]);
    common::run_with_timeout(c, std::time::Duration::from_secs(120)).assert_ok();

    // A Parquet weight column weighs the rows as the same weights in a TSV's field 41.
    let wpq = d.join("day_w.parquet");
    assert!(Command::new(&py).args(["-c", PYARROW_ADD_WEIGHT]).arg(&pq).arg(&wpq).status().unwrap().success());
    let text = std::fs::read_to_string(&tsv).unwrap();
    let weighted: String = text.lines().enumerate().map(|(i, l)| format!("{l}\t{}\n", (i % 4) as f64 * 0.5 + 0.25)).collect();
    let wtsv = d.join("day_w.tsv");
    std::fs::write(&wtsv, weighted).unwrap();
    let tsv_weighted = fnv(&train(&wtsv, &["--weight-column", "41"]));
    assert_ne!(tsv_weighted, want, "the weights change the model");
    assert_eq!(fnv(&train(&wpq, &["--weight-column", "w"])), tsv_weighted, "--weight-column NAME weighs as the TSV's field");
    let sw = write("w.toml", "weight = \"w\"\n".into());
    assert_eq!(fnv(&train(&wpq, &["--schema", &sw])), tsv_weighted, "the schema's weight too");
    std::fs::remove_dir_all(&d).unwrap();
}
