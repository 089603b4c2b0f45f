//! The data layer as a user sees it: Criteo TSV in, malformed lines counted and reported,
//! binary cache out and back, batches cut among ranks, synthetic data with a known optimum.
//! No MPI: everything here is single-process.

mod common;

use common::TempDir;
use std::io::Write;
use std::path::{Path, PathBuf};

use ringrec::fileio::IoError;
use ringrec::header::FormatError;
use ringrec::data::cache::{cache_path, CacheHeader, CacheLayout, CHECKSUM_AT, HEADER_FIELDS, RACY_NS};
use ringrec::data::criteo::{category_key, missing_key, read_tsv, DEFAULT_MAX_BAD_LINES};
use ringrec::data::{
    epoch_order, global_batch_range, prepare, rank_slice, split, steps_per_epoch, synth, BadLineKind, DataError, Dataset, Sample, NUM_DENSE, NUM_SPARSE,
};
use ringrec::hash::{fnv1a64, Stream};


/// A well-formed line: label, I1..I13 = i, i+1, ..., C1..C26 = 8 hex digits `(k + 1) << 24 ^ i`.
fn good(label: u8, i: i64) -> String {
    let mut f = vec![label.to_string()];
    f.extend((0..NUM_DENSE as i64).map(|k| (i + k).to_string()));
    f.extend((0..NUM_SPARSE as u32).map(|k| format!("{:08x}", (0x0100_0000u32 * (k + 1)) ^ i as u32)));
    f.join("\t")
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::File::create(path).and_then(|mut f| f.write_all(bytes)).expect("write test file");
}

/// The real sample, relative to the crate root; `None` (with the reason printed) when absent.
fn real_sample() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/criteo_1tb_day0_10000.txt");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipping: the real Criteo sample {} is not present", p.display());
        None
    }
}

#[test]
fn every_kind_of_bad_line_is_counted_and_reported() {
    let d = TempDir::new("kinds");
    let g = good(1, 5);
    let mut text: Vec<u8> = Vec::new();
    let mut add = |l: &[u8]| {
        text.extend_from_slice(l);
        text.push(b'\n');
    };
    add(good(0, 1).as_bytes()); // 1
    add(b""); // 2 empty
    add(g.rsplit_once('\t').unwrap().0.as_bytes()); // 3 field count (39)
    add(good(1, 2).replacen('1', "x", 1).as_bytes()); // 4 label "x"
    add(format!("2{}", &g[1..]).as_bytes()); // 5 label 2
    add(g.replacen("\t5\t", "\t5a\t", 1).as_bytes()); // 6 integer "5a"
    add(g.replacen("\t5\t", "\t1.5\t", 1).as_bytes()); // 7 integer "1.5"
    add(g.replace(&format!("{:08x}", 0x0100_0000u32 ^ 5), "zzzzzzzz").as_bytes()); // 8 categorical
    add(g.replace(&format!("{:08x}", 0x0100_0000u32 ^ 5), "1234567890abcdef0").as_bytes()); // 9 categorical, 17 digits
    add(&[g.as_bytes(), b"\t\xff"].concat()); // 10 invalid UTF-8 (and 41 fields: UTF-8 wins)
    add(good(0, 3).as_bytes()); // 11
    add(b"\r"); // 12 empty (CRLF)
    let tsv = d.path("kinds.tsv");
    write(&tsv, &text);

    let (rows, r) = read_tsv(&tsv, DEFAULT_MAX_BAD_LINES).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(r.lines, 12);
    assert_eq!(r.rows, 2);
    assert_eq!(r.bad(), 10);
    assert_eq!(r.lines, r.rows + r.bad(), "nothing dropped silently");
    let want = [
        (BadLineKind::Empty, 2),
        (BadLineKind::FieldCount, 1),
        (BadLineKind::Label, 2),
        (BadLineKind::Integer, 2),
        (BadLineKind::Categorical, 2),
        (BadLineKind::Utf8, 1),
    ];
    for (k, n) in want {
        assert_eq!(r.count(k), n, "{k}");
    }
    let first: Vec<(u64, BadLineKind, &str)> = r.first.iter().map(|b| (b.line, b.kind, b.detail.as_str())).collect();
    assert_eq!(
        first,
        vec![
            (2, BadLineKind::Empty, "empty line"),
            (3, BadLineKind::FieldCount, "wrong field count: found 39, expected 40 tab-separated fields"),
            (4, BadLineKind::Label, "label \"x\" is not 0 or 1"),
            (5, BadLineKind::Label, "label \"2\" is not 0 or 1"),
            (6, BadLineKind::Integer, "field 2 (I1) \"5a\" is not an integer"),
        ]
    );
    // The summary names every kind and the first lines.
    let s = r.to_string();
    assert!(
        s.starts_with("12 lines: 2 rows, 10 malformed (empty 2, field_count 1, label 2, integer 2, categorical 2, utf8 1); first: line 2: empty line;"),
        "{s}"
    );
    assert!(s.ends_with("; ..."), "{s}");

    // The same counts survive into the cache header.
    let out = d.path("kinds.rrdata");
    let sum = prepare(&tsv, &out, DEFAULT_MAX_BAD_LINES).unwrap();
    assert_eq!(sum.rows, 2);
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.header().bad_lines, 10);
    assert_eq!(ds.header().bad_counts, [2, 1, 2, 2, 2, 1, 0]);
    assert_eq!(ds.header().lines, 12);
}

#[test]
fn utf8_and_categorical_details_name_field_and_offset() {
    let d = TempDir::new("details");
    let g = good(0, 0);
    let cat = format!("{:08x}", 0x0100_0000u32 * 26);
    let text = format!("{}\n{}\n", g.replace(&cat, "12g4"), g.replace(&cat, "é"));
    let mut bytes = text.into_bytes();
    bytes.extend_from_slice(&[b'0', b'\t', 0xc3, 0x28, b'\n']);
    let tsv = d.path("d.tsv");
    write(&tsv, &bytes);
    let (_, r) = read_tsv(&tsv, 10).unwrap();
    let details: Vec<&str> = r.first.iter().map(|b| b.detail.as_str()).collect();
    assert_eq!(
        details,
        vec!["field 40 (C26) \"12g4\" is not 1 to 16 hex digits", "field 40 (C26) \"é\" is not 1 to 16 hex digits", "not valid UTF-8 (bad byte at offset 2)",]
    );
}

#[test]
fn max_bad_lines_stops_with_a_clear_error() {
    let d = TempDir::new("limit");
    let tsv = d.path("limit.tsv");
    let text = format!("{}\nbad one\n{}\n2\tx\nbad three\n{}\n", good(0, 1), good(1, 2), good(0, 3));
    write(&tsv, text.as_bytes());

    // Three bad lines are fine with a limit of 3 ...
    let (rows, r) = read_tsv(&tsv, 3).unwrap();
    assert_eq!((rows.len(), r.bad(), r.lines), (3, 3, 6));

    // ... but not with a limit of 2: reading stops at the third, at line 5.
    let e = read_tsv(&tsv, 2).unwrap_err();
    assert!(matches!(e, DataError::TooManyBadLines { count: 3, limit: 2, at_line: 5, .. }), "{e:?}");
    let msg = e.to_string();
    assert_eq!(
        msg,
        format!(
            "{}: 3 malformed line(s) by line 5, more than --max-bad-lines 2 allows; first: line 2: wrong field count: found 1, expected 40 tab-separated fields; \
             line 4: wrong field count: found 2, expected 40 tab-separated fields; line 5: wrong field count: found 1, expected 40 tab-separated fields; \
             fix the input or raise --max-bad-lines (or RINGREC_MAX_BAD_LINES) to skip and count them",
            tsv.display()
        )
    );

    // 0 means no bad line at all; prepare refuses too and leaves no file behind.
    let e = read_tsv(&tsv, 0).unwrap_err();
    assert!(matches!(e, DataError::TooManyBadLines { count: 1, limit: 0, at_line: 2, .. }), "{e:?}");
    let out = d.path("limit.rrdata");
    let e = prepare(&tsv, &out, 0).unwrap_err();
    assert!(e.to_string().contains("more than --max-bad-lines 0 allows"), "{e}");
    assert!(!out.exists());
    let left: Vec<_> = std::fs::read_dir(&d.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 1, "only the TSV is left, no temporary file: {left:?}");
}

#[test]
fn a_file_of_nothing_but_malformed_lines_says_so() {
    let d = TempDir::new("allbad");
    let tsv = d.path("allbad.tsv");
    write(&tsv, b"a,b,c\n1,2,3\n\n");
    let out = d.path("allbad.rrdata");
    let e = prepare(&tsv, &out, 1000).unwrap_err();
    assert!(matches!(e, DataError::AllMalformed { lines: 3, .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("every one of its 3 line(s) is malformed (empty 1, field_count 2)") && msg.contains("line 1: wrong field count: found 1"), "{msg}");
    assert!(!out.exists(), "no cache of zero rows is written");
    // The cached path says the same (and does not keep a cache of zero rows).
    let e = Dataset::from_tsv_cached(&tsv, &d.path("cache"), 1000).unwrap_err();
    assert!(matches!(e, DataError::AllMalformed { .. }), "{e:?}");
}

#[test]
fn negative_integers_and_empty_fields_parse() {
    let d = TempDir::new("neg");
    let mut f: Vec<String> = vec!["0".into()];
    f.extend(["-1", "", "0", "1", "-2147483648", "", "", "", "", "", "", "", "99"].map(String::from));
    f.extend((0..NUM_SPARSE).map(|k| if k % 2 == 0 { String::new() } else { "68fd1e64".into() }));
    let tsv = d.path("neg.tsv");
    write(&tsv, (f.join("\t") + "\n").as_bytes());
    let (rows, r) = read_tsv(&tsv, 0).unwrap();
    assert_eq!(r.bad(), 0);
    let s = rows[0];
    assert_eq!(s.label, 0.0);
    let mut dense = [0.0f32; NUM_DENSE];
    dense[3] = 2f32.ln();
    dense[12] = 100f32.ln();
    assert_eq!(s.dense, dense, "negative and missing integers are 0, others ln(1 + x)");
    for k in 0..NUM_SPARSE {
        let want = if k % 2 == 0 { missing_key(k) } else { category_key(k, 0x68fd1e64) };
        assert_eq!(s.keys[k], want, "C{}", k + 1);
        assert_ne!(s.keys[k], u64::MAX);
    }
}

#[test]
fn crlf_lines_parse_like_lf() {
    let d = TempDir::new("crlf");
    let lines: Vec<String> = (0..5).map(|i| good((i % 2) as u8, i)).collect();
    let (lf, crlf) = (d.path("lf.tsv"), d.path("crlf.tsv"));
    write(&lf, (lines.join("\n") + "\n").as_bytes());
    // CRLF, and no newline after the last line.
    write(&crlf, lines.join("\r\n").as_bytes());
    let (a, ra) = read_tsv(&lf, 0).unwrap();
    let (b, rb) = read_tsv(&crlf, 0).unwrap();
    assert_eq!(a.len(), 5);
    assert_eq!(a, b);
    assert_eq!((ra.lines, rb.lines), (5, 5));
}

#[test]
fn real_criteo_sample_parses() {
    let Some(tsv) = real_sample() else { return };
    let (rows, r) = read_tsv(&tsv, 0).unwrap();
    assert_eq!(rows.len(), 10_000);
    assert_eq!(r.bad(), 0);
    assert_eq!(rows.iter().filter(|s| s.label == 1.0).count(), 265);
    // The first line: 1  5  110  (empty)  16 ... C1 = 62770d79.
    assert_eq!(rows[0].label, 1.0);
    assert_eq!(rows[0].dense[0], 6f32.ln());
    assert_eq!(rows[0].dense[2], 0.0);
    assert_eq!(rows[0].keys[0], category_key(0, 0x62770d79));
    // Criteo has missing categoricals; each field's missing key is its own.
    let missing = rows.iter().flat_map(|s| s.keys.iter().enumerate()).filter(|(k, v)| **v == missing_key(*k)).count();
    assert!(missing > 0);
}

fn assert_same(ds: &Dataset, rows: &[Sample]) {
    assert_eq!(ds.len(), rows.len());
    for (i, s) in rows.iter().enumerate() {
        assert_eq!(ds.label(i), s.label, "row {i}");
        assert_eq!(ds.dense(i), &s.dense[..], "row {i}");
        assert_eq!(ds.keys(i), &s.keys[..], "row {i}");
    }
    // A gathered batch in a scrambled order, with a repeat.
    let idx: Vec<usize> = (0..rows.len()).rev().step_by(3).chain(std::iter::once(0)).collect();
    let (mut l, mut dn, mut k) = (vec![9.0], Vec::new(), Vec::new());
    ds.fill_batch(&idx, &mut l, &mut dn, &mut k).unwrap();
    assert_eq!(l.len(), idx.len());
    for (b, &i) in idx.iter().enumerate() {
        assert_eq!(l[b], rows[i].label);
        assert_eq!(&dn[b * NUM_DENSE..(b + 1) * NUM_DENSE], &rows[i].dense[..]);
        assert_eq!(&k[b * NUM_SPARSE..(b + 1) * NUM_SPARSE], &rows[i].keys[..]);
    }
    let idx32: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
    let (mut l2, mut d2, mut k2) = (Vec::new(), Vec::new(), Vec::new());
    ds.fill_batch(&idx32, &mut l2, &mut d2, &mut k2).unwrap();
    assert_eq!((l2, d2, k2), (l, dn, k));
}

#[test]
fn cache_round_trip_equals_direct_parsing() {
    let d = TempDir::new("roundtrip");
    // Synthetic rows with a bad line in the middle, so row_capacity > rows.
    let tsv = d.path("s.tsv");
    synth(&tsv, 5000, 3).unwrap();
    let mut text = std::fs::read(&tsv).unwrap();
    text.splice(0..0, b"not a line\n".iter().copied());
    write(&tsv, &text);
    let (rows, r) = read_tsv(&tsv, 1).unwrap();
    assert_eq!((rows.len(), r.bad()), (5000, 1));
    let out = d.path("s.rrdata");
    let sum = prepare(&tsv, &out, 1).unwrap();
    assert_eq!((sum.rows, sum.report.lines, sum.report.bad()), (5000, 5001, 1));
    let ds = Dataset::open(&out).unwrap();
    assert_eq!(ds.header().row_capacity, 5001);
    assert_eq!(sum.bytes, std::fs::metadata(&out).unwrap().len());
    assert_same(&ds, &rows);

    if let Some(real) = real_sample() {
        let (rows, _) = read_tsv(&real, 0).unwrap();
        let out = d.path("real.rrdata");
        prepare(&real, &out, 0).unwrap();
        let ds = Dataset::open(&out).unwrap();
        assert_same(&ds, &rows);
        assert_eq!(ds.positives(), 265);
    }

    // An empty TSV holds no rows: an error naming it (as a TSV of empty lines is), no
    // cache written (issue 36).
    let empty = d.path("empty.tsv");
    write(&empty, b"");
    let e = prepare(&empty, &d.path("empty.rrdata"), 0).unwrap_err().to_string();
    assert_eq!(e, format!("{}: holds no rows (the file is empty); a data file needs at least one Criteo TSV line", empty.display()));
    assert!(!d.path("empty.rrdata").exists());
}

#[test]
fn fill_batch_refuses_an_index_past_the_end() {
    let d = TempDir::new("range");
    let tsv = d.path("r.tsv");
    write(&tsv, format!("{}\n{}\n", good(0, 1), good(1, 2)).as_bytes());
    let out = d.path("r.rrdata");
    prepare(&tsv, &out, 0).unwrap();
    let ds = Dataset::open(&out).unwrap();
    let (mut l, mut dn, mut k) = (Vec::new(), Vec::new(), Vec::new());
    let e = ds.fill_batch(&[1usize, 2], &mut l, &mut dn, &mut k).unwrap_err();
    assert!(matches!(e, DataError::RowOutOfRange { index: 2, rows: 2 }), "{e:?}");
    assert_eq!(e.to_string(), "row 2 is out of range: the dataset has 2 rows");
}

#[test]
fn corrupt_cache_files_are_refused_each_with_its_own_error() {
    let d = TempDir::new("corrupt");
    let tsv = d.path("c.tsv");
    synth(&tsv, 300, 5).unwrap();
    let good_file = d.path("c.rrdata");
    prepare(&tsv, &good_file, 0).unwrap();
    let bytes = std::fs::read(&good_file).unwrap();
    let header = CacheHeader::parse(&good_file, &bytes, bytes.len() as u64).unwrap();

    let try_open = |name: &str, b: &[u8]| -> DataError {
        let p = d.path(name);
        write(&p, b);
        Dataset::open(&p).unwrap_err()
    };
    let fix_checksum = |b: &mut Vec<u8>| {
        let s = fnv1a64(&b[..CHECKSUM_AT]);
        b[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&s.to_le_bytes());
    };

    // Cut short in the data.
    let e = try_open("cut.rrdata", &bytes[..bytes.len() - 4096]);
    assert!(matches!(e, DataError::Format(FormatError::Truncated { len, need, .. }) if need == header.layout.file_len && len == need - 4096), "{e:?}");
    assert!(e.to_string().contains("is truncated"), "{e}");
    // Cut short in the header.
    let e = try_open("short.rrdata", &bytes[..100]);
    assert!(matches!(e, DataError::Format(FormatError::Truncated { need: 4096, .. })), "{e:?}");
    // Empty file.
    let e = try_open("empty.rrdata", b"");
    assert!(matches!(e, DataError::Format(FormatError::Truncated { len: 0, .. })), "{e:?}");
    // A TSV given where a cache is expected.
    let e = try_open("tsv.rrdata", &std::fs::read(&tsv).unwrap());
    assert!(matches!(e, DataError::Format(FormatError::BadMagic { .. })), "{e:?}");
    assert!(e.to_string().contains("ringrec data prepare"), "{e}");
    // A future version (3 is a cache with weights, 4 one with lists, 5 one with both), and
    // the previous one.
    let mut b = bytes.clone();
    b[8] = 6;
    fix_checksum(&mut b);
    let e = try_open("version.rrdata", &b);
    assert!(matches!(e, DataError::Format(FormatError::BadVersion { found: 6, supported: 5, .. })), "{e:?}");
    assert!(e.to_string().contains("format version 6, this build reads version 5"), "{e}");
    b[8] = 1;
    fix_checksum(&mut b);
    let e = try_open("version1.rrdata", &b);
    assert!(matches!(e, DataError::Format(FormatError::BadVersion { found: 1, supported: 2, .. })), "{e:?}");
    assert!(e.to_string().contains("format version 1, this build reads version 2; run `ringrec data prepare` on the TSV again"), "{e}");
    // A damaged header field (row count) without a matching checksum.
    let mut b = bytes.clone();
    b[32] ^= 1;
    let e = try_open("checksum.rrdata", &b);
    assert!(matches!(e, DataError::Format(FormatError::BadChecksum { .. })), "{e:?}");
    // A header that is self-consistent in its checksum but claims more rows than lines.
    let mut b = bytes.clone();
    b[32..40].copy_from_slice(&(header.rows + 1).to_le_bytes());
    fix_checksum(&mut b);
    let e = try_open("field.rrdata", &b);
    assert!(matches!(e, DataError::Format(FormatError::BadHeader { .. })), "{e:?}");
    // Sections moved.
    let mut b = bytes.clone();
    b[128..136].copy_from_slice(&(header.layout.dense_offset + 4096).to_le_bytes());
    fix_checksum(&mut b);
    let e = try_open("layout.rrdata", &b);
    assert!(matches!(e, DataError::Format(FormatError::BadLayout { .. })), "{e:?}");
    // Trailing garbage.
    let mut b = bytes.clone();
    b.extend_from_slice(&[0u8; 4096]);
    let e = try_open("long.rrdata", &b);
    assert!(matches!(e, DataError::Format(FormatError::BadLayout { .. })), "{e:?}");
    // A missing file.
    let e = Dataset::open(&d.path("absent.rrdata")).unwrap_err();
    assert!(matches!(e, DataError::Io(IoError { op: "open", .. })), "{e:?}");

    // The original still opens.
    assert_eq!(Dataset::open(&good_file).unwrap().len(), 300);
}

#[test]
fn from_tsv_cached_parses_once_and_notices_a_changed_tsv() {
    let d = TempDir::new("cached");
    let tsv = d.path("day 0.tsv");
    synth(&tsv, 1000, 9).unwrap();
    let cache_dir = d.path("cache");
    let a = Dataset::from_tsv_cached(&tsv, &cache_dir, 0).unwrap();
    assert_eq!(a.len(), 1000);
    assert_eq!(a.path(), cache_path(&tsv, &cache_dir).unwrap());
    assert!(a.path().file_name().unwrap().to_str().unwrap().starts_with("day_0."));
    let mtime = std::fs::metadata(a.path()).unwrap().modified().unwrap();
    let b = Dataset::from_tsv_cached(&tsv, &cache_dir, 0).unwrap();
    assert_eq!(b.path(), a.path());
    assert_eq!(std::fs::metadata(b.path()).unwrap().modified().unwrap(), mtime, "the cache was reused, not rewritten");

    // Concurrent callers (local ranks) all get the same valid dataset.
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| assert_eq!(Dataset::from_tsv_cached(&tsv, &cache_dir, 0).unwrap().len(), 1000));
        }
    });

    // A different TSV at the same path gets its own cache.
    synth(&tsv, 500, 9).unwrap();
    let c = Dataset::from_tsv_cached(&tsv, &cache_dir, 0).unwrap();
    assert_eq!(c.len(), 500);
    assert_ne!(c.path(), a.path());

    // A cache that skipped bad lines is not reused under a stricter limit.
    let bad = d.path("bad.tsv");
    write(&bad, format!("{}\nnope\n", good(0, 1)).as_bytes());
    assert_eq!(Dataset::from_tsv_cached(&bad, &cache_dir, 1).unwrap().len(), 1);
    let e = Dataset::from_tsv_cached(&bad, &cache_dir, 0).unwrap_err();
    assert!(matches!(e, DataError::TooManyBadLines { .. }), "{e:?}");
}

#[test]
fn sharding_covers_every_sample_once_per_epoch() {
    let n = 1003; // not a multiple of the batch: the last batch is partial
    let (train, test) = split(n, 0.1).unwrap();
    assert_eq!((train.clone(), test), (0..903, 903..1003));
    let gb = 64;
    let steps = steps_per_epoch(train.len(), gb);
    assert_eq!(steps, 15);
    for epoch in 0..2 {
        let order = epoch_order(train.len(), epoch, Some(11)).unwrap();
        // The rows of each global batch, as the 1-rank run sees them.
        let reference: Vec<Vec<usize>> =
            (0..steps).map(|s| order[global_batch_range(s, gb, train.len())].iter().map(|&p| train.start + p as usize).collect()).collect();
        for size in 1..=5 {
            let mut seen = vec![0u32; n];
            for (step, want) in reference.iter().enumerate() {
                let batch = global_batch_range(step, gb, train.len());
                let mut union = Vec::new();
                for rank in 0..size {
                    let mine = rank_slice(batch.clone(), rank, size);
                    for &p in &order[mine] {
                        let row = train.start + p as usize;
                        seen[row] += 1;
                        union.push(row);
                    }
                }
                assert_eq!(&union, want, "epoch {epoch} step {step} size {size}: ranks together see the 1-rank batch");
            }
            assert!(seen[..903].iter().all(|&c| c == 1), "epoch {epoch} size {size}: every training row exactly once");
            assert!(seen[903..].iter().all(|&c| c == 0), "no test row is trained on");
        }
        // Past the epoch there is nothing.
        assert!(global_batch_range(steps, gb, train.len()).is_empty());
    }
    // The last batch of 903 rows by 64 has 7 rows; 5 ranks take 2, 2, 1, 1, 1.
    let last = global_batch_range(14, gb, train.len());
    assert_eq!(last, 896..903);
    let lens: Vec<usize> = (0..5).map(|r| rank_slice(last.clone(), r, 5).len()).collect();
    assert_eq!(lens, vec![2, 2, 1, 1, 1]);
}

#[test]
fn synth_is_deterministic_and_has_a_learnable_planted_model() {
    let d = TempDir::new("synth");
    let (a, b, c) = (d.path("a.tsv"), d.path("b.tsv"), d.path("c.tsv"));
    let sa = synth(&a, 30_000, 7).unwrap();
    let sb = synth(&b, 30_000, 7).unwrap();
    synth(&c, 30_000, 8).unwrap();
    let (ta, tb, tc) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), std::fs::read(&c).unwrap());
    assert!(ta == tb, "same seed, same bytes");
    assert!(ta != tc, "another seed, other data");
    assert_eq!(ringrec::data::SynthSummary { path: a.clone(), ..sb }, sa, "same summary");
    eprintln!("synth 30,000 rows seed 7: ctr {:.4}, Bayes AUC {:.4}", sa.ctr, sa.bayes_auc);
    assert!(sa.bayes_auc > 0.7, "planted-model AUC {}", sa.bayes_auc);
    assert!((0.2..0.3).contains(&sa.ctr), "ctr {}", sa.ctr);
    assert_eq!(sa.bytes, ta.len() as u64);

    // It is valid Criteo: every line parses, with negative integers and empty fields.
    let (rows, r) = read_tsv(&a, 0).unwrap();
    assert_eq!((rows.len(), r.bad()), (30_000, 0));
    assert_eq!(rows.iter().filter(|s| s.label == 1.0).count() as u64, sa.positives);
    let text = String::from_utf8(ta).unwrap();
    let fields: Vec<Vec<&str>> = text.lines().take(2000).map(|l| l.split('\t').collect()).collect();
    assert!(fields.iter().all(|f| f.len() == 40));
    assert!(fields.iter().any(|f| f[2].starts_with('-')), "I2 takes negative values");
    assert!(fields.iter().any(|f| f[1].is_empty()), "integers are sometimes missing");
    assert!(fields.iter().any(|f| f[16].is_empty()), "categoricals are sometimes missing (C3)");
    assert!(fields.iter().all(|f| f[14..].iter().all(|c| c.is_empty() || c.len() == 8)));
    // Zipf: the most common value of a field covers a large share of its rows.
    let mut counts = std::collections::HashMap::new();
    for f in &fields {
        *counts.entry(f[14]).or_insert(0usize) += 1;
    }
    let top = counts.values().max().copied().unwrap_or(0);
    assert!(top > 100, "top value of C1 in 2000 rows: {top}");
}

/// Whether two datasets hold the same rows, bit for bit (every label, dense value and key).
fn same_rows(a: &Dataset, b: &Dataset) -> bool {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    a.len() == b.len() && bits(a.labels()) == bits(b.labels()) && bits(a.dense_all()) == bits(b.dense_all()) && a.keys_all() == b.keys_all()
}

#[test]
fn damaged_caches_are_refused_by_name_never_read_as_other_data() {
    let d = TempDir::new("damage");
    let tsv = d.path("d.tsv");
    synth(&tsv, 300, 13).unwrap();
    let original = d.path("d.rrdata");
    prepare(&tsv, &original, 0).unwrap();
    let want = Dataset::open(&original).unwrap();
    let bytes = std::fs::read(&original).unwrap();
    let len = bytes.len();
    let victim = d.path("victim.rrdata");
    let (mut detected, mut harmless, mut wrong) = (0usize, 0usize, Vec::new());
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    let mut judge = |b: &[u8], what: String| {
        write(&victim, b);
        match Dataset::open(&victim) {
            Err(e) => {
                let msg = e.to_string();
                if msg.contains(&victim.display().to_string()) {
                    detected += 1;
                    let kind = match &e {
                        DataError::Damaged { section, .. } => format!("damaged {section}"),
                        other => format!("{other:?}").split([' ', '(', '{']).filter(|w| !w.is_empty()).take(2).collect::<Vec<_>>().join(" "),
                    };
                    *kinds.entry(kind).or_default() += 1;
                } else {
                    wrong.push(format!("{what}: the error does not name the file: {msg}"));
                }
            }
            Ok(ds) if same_rows(&ds, &want) => harmless += 1,
            Ok(_) => wrong.push(format!("{what}: opened with other rows")),
        }
    };
    let mut rng = Stream(20_261_125);
    // The first 50 flips land in the header page (fields, checksum, padding), the others
    // anywhere in the file (mostly the columns).
    for i in 0..200 {
        let at = rng.below(if i < 50 { 4096 } else { len as u64 }) as usize;
        let mut b = bytes.clone();
        b[at] ^= 1 + rng.below(255) as u8;
        judge(&b, format!("flip {i} at byte {at}"));
    }
    let cuts = [0, 1, 7, 100, HEADER_FIELDS - 1, 4095, 4096, len / 2, len - 4, len - 1];
    for cut in cuts {
        judge(&bytes[..cut], format!("truncated to {cut} bytes"));
    }
    let appends = [1usize, 4, 4096, 1 << 20];
    for n in appends {
        let mut b = bytes.clone();
        b.extend((0..n).map(|_| rng.next_u64() as u8));
        judge(&b, format!("{n} bytes appended"));
    }
    eprintln!(
        "damaged caches ({len} bytes, 300 rows): 200 flips, {} truncations, {} appends: detected {detected}, harmless {harmless}, wrong {} ({kinds:?})",
        cuts.len(),
        appends.len(),
        wrong.len()
    );
    assert!(wrong.is_empty(), "{wrong:#?}");
    // Every byte is covered (header checksum, zero padding, block sums, sums' CRC), so
    // no change goes unnoticed, not even a harmless one.
    assert_eq!((detected, harmless), (200 + cuts.len() + appends.len(), 0));
    // The untouched file still opens.
    assert!(same_rows(&Dataset::open(&original).unwrap(), &want));
}

#[test]
fn a_damaged_block_names_its_section_and_bytes_and_the_cached_path_prepares_it_again() {
    let d = TempDir::new("reprepare");
    let tsv = d.path("r.tsv");
    synth(&tsv, 3000, 6).unwrap();
    let (rows, _) = read_tsv(&tsv, 0).unwrap();
    let cache_dir = d.path("cache");
    let path = Dataset::from_tsv_cached(&tsv, &cache_dir, 0).unwrap().path().to_path_buf();
    let good_bytes = std::fs::read(&path).unwrap();
    let l = CacheHeader::parse(&path, &good_bytes, good_bytes.len() as u64).unwrap().layout;
    // 3000 rows: every section is one block except the keys' (624,000 bytes, one block too).
    let keys_end = l.sums_offset;
    let cases = [
        ("header", 300u64, 300u64, 301u64),
        ("labels", l.labels_offset + 5, l.labels_offset, l.dense_offset),
        ("dense", l.keys_offset - 1, l.dense_offset, l.keys_offset),
        ("keys", l.keys_offset + 1000, l.keys_offset, keys_end),
        ("checksums", l.sums_offset + 2, l.sums_offset, l.sums_offset + l.sums_len),
    ];
    for (section, at, start, end) in cases {
        let mut b = good_bytes.clone();
        b[at as usize] ^= 0x40;
        write(&path, &b);
        let e = Dataset::open(&path).unwrap_err();
        assert!(
            matches!(&e, DataError::Damaged { section: s, start: a, end: z, .. } if *s == section && *a == start && *z == end),
            "byte {at}: {e:?}"
        );
        let msg = e.to_string();
        assert_eq!(
            msg,
            format!(
                "{}: the {section} section is damaged: bytes {start}..{end} do not match the CRC-32 written with them; \
                 delete the file (a cache made from a TSV is prepared again on the next run) or run `ringrec data prepare` on its TSV again",
                path.display()
            )
        );
        // The cached path treats it like a missing cache: prepared again, the right rows.
        let ds = Dataset::from_tsv_cached(&tsv, &cache_dir, 0).unwrap();
        assert_eq!(ds.path(), path);
        assert_same(&ds, &rows);
    }
    // A cache of the previous format version at that path is prepared again too.
    let mut b = good_bytes.clone();
    b[8] = 1;
    let s = fnv1a64(&b[..CHECKSUM_AT]);
    b[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&s.to_le_bytes());
    write(&path, &b);
    assert!(matches!(Dataset::open(&path).unwrap_err(), DataError::Format(FormatError::BadVersion { found: 1, .. })));
    assert_same(&Dataset::from_tsv_cached(&tsv, &cache_dir, 0).unwrap(), &rows);
    assert_eq!(Dataset::open(&path).unwrap().header().layout, l);
}

/// Rewrites the first byte of `tsv` (a label: 0 <-> 1) in place and sets its mtime back: the
/// same inode, size and mtime, other contents.
fn rewrite_first_label_in_place(tsv: &Path) {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let before = std::fs::metadata(tsv).unwrap();
    let first = std::fs::read(tsv).unwrap()[0];
    let f = std::fs::OpenOptions::new().write(true).open(tsv).unwrap();
    f.write_all_at(&[if first == b'0' { b'1' } else { b'0' }], 0).unwrap();
    f.set_modified(before.modified().unwrap()).unwrap();
    drop(f);
    let after = std::fs::metadata(tsv).unwrap();
    assert_eq!((after.ino(), after.len(), after.modified().unwrap()), (before.ino(), before.len(), before.modified().unwrap()));
}

#[test]
fn a_tsv_rewritten_in_place_with_size_and_mtime_restored_is_read_again() {
    let d = TempDir::new("inplace");
    let tsv = d.path("t.tsv");
    synth(&tsv, 400, 8).unwrap();
    let cache_dir = d.path("cache");
    let a = Dataset::from_tsv_cached(&tsv, &cache_dir, 0).unwrap();
    let label0 = a.label(0);
    drop(a);

    // At once: the cache is racy (checked within RACY_NS of the TSV's ctime), so the stat
    // or the content digest notices.
    rewrite_first_label_in_place(&tsv);
    let b = Dataset::from_tsv_cached(&tsv, &cache_dir, 0).unwrap();
    assert_same(&b, &read_tsv(&tsv, 0).unwrap().0);
    assert_eq!(b.label(0), 1.0 - label0);
    let path = b.path().to_path_buf();
    drop(b);

    // After RACY_NS: the cache is reused on its stat alone, and the ctime alone notices.
    let ctime_ns = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(p).unwrap();
        m.ctime() as u64 * 1_000_000_000 + m.ctime_nsec() as u64
    };
    rewrite_first_label_in_place(&tsv);
    std::thread::sleep(std::time::Duration::from_nanos(RACY_NS + 100_000_000));
    let c = Dataset::from_tsv_cached(&tsv, &cache_dir, 0).unwrap();
    assert_eq!(c.label(0), label0);
    let h = *c.header();
    assert_eq!(h.source.ctime_ns, ctime_ns(&tsv));
    assert!(h.prepared_ns >= h.source.ctime_ns + RACY_NS, "not racy: {h:?}");
    drop(c);
    rewrite_first_label_in_place(&tsv);
    assert_ne!(ctime_ns(&tsv), h.source.ctime_ns, "the kernel moved the ctime on");
    let e = Dataset::from_tsv_cached(&tsv, &cache_dir, 0).unwrap();
    assert_same(&e, &read_tsv(&tsv, 0).unwrap().0);
    assert_eq!(e.label(0), 1.0 - label0);
    // Same size and mtime, so the same cache file, prepared again in place: no other file.
    assert_eq!(e.path(), path);
    let caches = std::fs::read_dir(&cache_dir).unwrap().filter(|f| f.as_ref().unwrap().path().extension().is_some_and(|x| x == "rrdata")).count();
    assert_eq!(caches, 1);
}

#[test]
fn a_racy_cache_is_reused_only_while_the_tsv_digest_matches() {
    use std::os::unix::fs::FileExt;
    let d = TempDir::new("racy");
    let tsv = d.path("y.tsv");
    synth(&tsv, 100, 4).unwrap();
    let cache_dir = d.path("cache");
    let ds = Dataset::from_tsv_cached(&tsv, &cache_dir, 0).unwrap();
    let (path, h) = (ds.path().to_path_buf(), *ds.header());
    drop(ds);
    // A header (valid, checksummed) with the TSV's stat but another digest.
    let forge = |prepared_ns: u64| {
        let forged = CacheHeader { source_crc32: h.source_crc32 ^ 1, prepared_ns, ..h };
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&forged.encode(), 0).unwrap();
    };
    // Racy (checked in the TSV's ctime tick): the digest is compared, differs, and the
    // cache is prepared again with the right one.
    forge(h.source.ctime_ns);
    assert_eq!(Dataset::from_tsv_cached(&tsv, &cache_dir, 0).unwrap().header().source_crc32, h.source_crc32);
    // Not racy: reused on its stat alone, without reading the TSV (the forged digest stays).
    forge(h.source.ctime_ns + RACY_NS);
    assert_eq!(Dataset::from_tsv_cached(&tsv, &cache_dir, 0).unwrap().header().source_crc32, h.source_crc32 ^ 1);
}

#[test]
fn caches_are_private_to_their_owner() {
    use std::os::unix::fs::PermissionsExt;
    let d = TempDir::new("mode");
    let tsv = d.path("m.tsv");
    synth(&tsv, 50, 2).unwrap();
    let out = d.path("m.rrdata");
    prepare(&tsv, &out, 0).unwrap();
    let cached = Dataset::from_tsv_cached(&tsv, &d.path("cache"), 0).unwrap();
    for p in [out.as_path(), cached.path()] {
        // The temporary file is created with this mode and renamed: no chmod in between.
        assert_eq!(std::fs::metadata(p).unwrap().permissions().mode() & 0o7777, 0o600, "{}", p.display());
    }
}

#[test]
fn a_cache_larger_than_the_free_space_is_refused_before_writing() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let d = TempDir::new("space");
    let small = d.path("small");
    std::fs::create_dir_all(&small).unwrap();
    let mounted = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"]).arg(&small).output();
    match mounted {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            eprintln!("skipped: mount -t tmpfs failed: {}", String::from_utf8_lossy(&o.stderr).trim());
            return;
        }
        Err(e) => {
            eprintln!("skipped: cannot run mount: {e}");
            return;
        }
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(small.clone());

    // 5000 rows need 1.3 MB: more than the 1 MiB mount.
    let tsv = d.path("big.tsv");
    synth(&tsv, 5000, 3).unwrap();
    let need = CacheLayout::compute(0, 5000, false).unwrap().file_len;
    assert!(need > 1 << 20);
    let e = prepare(&tsv, &small.join("big.rrdata"), 0).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(&e, DataError::Io(io) if io.op == "reserve space"), "{e:?}");
    assert!(msg.contains(&format!("needs {need} bytes")) && msg.contains(&format!("free in {}", small.display())), "{msg}");
    let left: Vec<_> = std::fs::read_dir(&small).unwrap().map(|f| f.unwrap().file_name()).collect();
    assert!(left.is_empty(), "no temporary file is left: {left:?}");
    // A cache that fits is written there.
    let tsv = d.path("small.tsv");
    synth(&tsv, 100, 3).unwrap();
    assert_eq!(prepare(&tsv, &small.join("small.rrdata"), 0).unwrap().rows, 100);
}

/// `path`'s bytes with the header's `prepared_ns` (when `prepare` ran, the one field that
/// differs between two preparations of one file) and the header checksum zeroed.
fn without_clock(path: &Path) -> Vec<u8> {
    let mut b = std::fs::read(path).unwrap();
    b[104..112].fill(0);
    b[CHECKSUM_AT..CHECKSUM_AT + 8].fill(0);
    b
}

/// A TSV of `n` lines with malformed lines of every kind scattered through it (about one in
/// seven), CRLF endings here and there and no final newline.
fn scattered_bad_lines(n: usize) -> Vec<u8> {
    let mut rng = Stream(7);
    let mut text = Vec::new();
    for i in 0..n {
        let g = good((i % 2) as u8, i as i64);
        let line = match rng.below(14) {
            0 => String::new(),
            1 => g.rsplit_once('\t').unwrap().0.to_string(),
            2 => format!("2{}", &g[1..]),
            3 => g.replacen("\t", "\tx", 2),
            4 => g.replace(&format!("{:08x}", 0x0100_0000u32 ^ i as u32), "zz"),
            5 => format!("{g}\r"),
            _ => g,
        };
        text.extend_from_slice(line.as_bytes());
        if i + 1 < n {
            text.push(b'\n');
        }
    }
    text
}

#[test]
fn every_thread_count_writes_the_same_cache_and_report_as_one_read() {
    use ringrec::data::{prepare_with, PrepareOptions};
    let d = TempDir::new("threads");
    let tsv = d.path("mixed.tsv");
    write(&tsv, &scattered_bad_lines(3000));
    let (rows, want) = read_tsv(&tsv, u64::MAX).unwrap();
    assert!(want.bad() > 300 && want.count(BadLineKind::Empty) > 0 && want.count(BadLineKind::Categorical) > 0, "{want}");
    let one = d.path("one.rrdata");
    let opts = PrepareOptions { chunk_bytes: 4099, ..PrepareOptions::new(u64::MAX) };
    let s = prepare_with(&tsv, &one, &opts.clone().threads(1)).unwrap();
    assert_eq!(s.report, want, "one thread, chunks of 4099 bytes: the report of one sequential read");
    assert_same(&Dataset::open(&one).unwrap(), &rows);
    // Chunks of 61 bytes (lines span several) to 1 MiB (one chunk), 2 to 5 threads: the
    // same bytes, the same report.
    for (chunk, threads) in [(61, 2), (997, 2), (4099, 3), (65_536, 5), (1 << 20, 2)] {
        let out = d.path(&format!("{chunk}-{threads}.rrdata"));
        let s = prepare_with(&tsv, &out, &PrepareOptions { chunk_bytes: chunk, ..PrepareOptions::new(u64::MAX) }.threads(threads)).unwrap();
        assert_eq!((s.threads, &s.report), (threads, &want), "chunks of {chunk} bytes, {threads} threads");
        assert!(without_clock(&out) == without_clock(&one), "chunks of {chunk} bytes, {threads} threads: the cache differs from the one-thread cache");
    }
    // --max-bad-lines counts over the whole file: the error names the line that exceeds
    // it, wherever the chunks are cut, as one sequential read does.
    for limit in [0, 1, 57, want.bad() - 1] {
        let reference = read_tsv(&tsv, limit).unwrap_err().to_string();
        for (chunk, threads) in [(1 << 20, 1), (997, 2), (4099, 3)] {
            let out = d.path("limited.rrdata");
            let e = prepare_with(&tsv, &out, &PrepareOptions { chunk_bytes: chunk, ..PrepareOptions::new(limit) }.threads(threads)).unwrap_err();
            assert_eq!(e.to_string(), reference, "limit {limit}, chunks of {chunk} bytes, {threads} threads");
            assert!(!out.exists());
        }
    }
    assert!(prepare_with(&tsv, &d.path("enough.rrdata"), &PrepareOptions::new(want.bad()).threads(2)).is_ok());
    // Nothing but temporaries-free outputs in the directory.
    assert!(std::fs::read_dir(&d.0).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().starts_with('.')));
}

#[test]
fn a_large_file_on_two_threads_equals_one_thread() {
    use ringrec::data::{prepare_with, PrepareOptions};
    let d = TempDir::new("threads-large");
    let tsv = d.path("s.tsv");
    synth(&tsv, 60_000, 5).unwrap(); // about 15 MB: two 8 MiB chunks
    let (a, b) = (d.path("a.rrdata"), d.path("b.rrdata"));
    prepare_with(&tsv, &a, &PrepareOptions::new(0).threads(1)).unwrap();
    let s = prepare_with(&tsv, &b, &PrepareOptions::new(0).threads(2)).unwrap();
    assert_eq!((s.rows, s.threads), (60_000, 2));
    assert!(s.source_bytes > 8 << 20, "more than one chunk: {} bytes", s.source_bytes);
    assert!(without_clock(&a) == without_clock(&b));
}

#[test]
fn a_cancelled_preparation_leaves_nothing() {
    use ringrec::data::{prepare_with, PrepareOptions};
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    let d = TempDir::new("cancel");
    let tsv = d.path("s.tsv");
    synth(&tsv, 2000, 1).unwrap();
    let opts = PrepareOptions { cancel: Some(Arc::new(AtomicBool::new(true))), ..PrepareOptions::new(0) };
    let e = prepare_with(&tsv, &d.path("s.rrdata"), &opts).unwrap_err();
    assert!(matches!(e, DataError::Cancelled { .. }), "{e}");
    let left: Vec<_> = std::fs::read_dir(&d.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("s.tsv")]);
}

#[test]
fn an_eval_set_reads_its_datasets_in_order_in_batches() {
    use ringrec::data::EvalSet;
    use std::sync::Arc;
    let d = TempDir::new("evalset");
    let mut all = Vec::new();
    let mut set = EvalSet::new();
    for (seed, n, rows) in [(1u64, 50usize, 10..50), (2, 30, 0..30)] {
        let tsv = d.path(&format!("{seed}.tsv"));
        synth(&tsv, n as u64, seed).unwrap();
        let (samples, _) = read_tsv(&tsv, 0).unwrap();
        all.extend_from_slice(&samples[rows.clone()]);
        let out = d.path(&format!("{seed}.rrdata"));
        prepare(&tsv, &out, 0).unwrap();
        set.push(Arc::new(Dataset::open(&out).unwrap()), rows).unwrap();
    }
    assert_eq!(set.len(), 70);
    assert!(set.push(Arc::new(Dataset::open(&d.path("2.rrdata")).unwrap()), 0..31).is_err());
    // A rank's slice 35..70 in batches of 16: 35..51 spans both files.
    let batches: Vec<Vec<(usize, std::ops::Range<usize>)>> =
        set.batches(35..70, 16).map(|b| b.into_iter().map(|(ds, r)| (ds.len(), r)).collect()).collect();
    assert_eq!(batches, vec![vec![(50, 45..50), (30, 0..11)], vec![(30, 11..27)], vec![(30, 27..30)]]);
    // The rows read are the set's rows in order.
    let mut keys = Vec::new();
    for b in set.batches(0..70, 16) {
        for (ds, r) in b {
            keys.extend(r.flat_map(|i| ds.keys(i).to_vec()));
        }
    }
    assert_eq!(keys, all.iter().flat_map(|s| s.keys).collect::<Vec<_>>());
}
