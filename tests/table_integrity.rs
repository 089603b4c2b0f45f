//! Never lose, never corrupt (issue 20), for the table file and the sparse-parameter file:
//! seeded damage to saved files is an error naming the file or leaves the table exactly as
//! it was (never a panic, never a silently different table); `ringrec table verify`; the
//! shape cross-check of a resumed table; a full shm directory; and (ignored, release mode)
//! what the checksums cost.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use common::TempDir;
use ringrec::embedding::format::{CHECKSUM_AT, HEADER_FIELDS, HEADER_LEN};
use ringrec::embedding::*;
use ringrec::hash::{Stream, CHECKSUM_BLOCK};
use ringrec::header::FormatError;

/// Rows of the damaged table: a few thousand, over three 1 MiB checksum blocks.
const ROWS: u64 = 5000;
const DIM: u32 = 32;

fn adagrad_cfg() -> TableConfig {
    let mut c = TableConfig::new(DIM, 16384);
    c.optimizer = OptimizerKind::Adagrad;
    c.seed = 7;
    c.adagrad_init = 0.1;
    c
}

/// A live Adagrad table of [`ROWS`] rows after three update steps.
fn trained_table(path: &Path) -> EmbeddingTable {
    let mut t = EmbeddingTable::create(path, &adagrad_cfg()).unwrap();
    let mut s = Stream(11);
    for step in 0..3u64 {
        let keys: Vec<u64> = (0..ROWS).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 4).collect();
        let grads: Vec<f32> = (0..keys.len() * DIM as usize).map(|_| s.unit() as f32 - 0.5 + step as f32 * 0.01).collect();
        t.apply_updates(&keys, &grads, 0.05).unwrap();
    }
    assert_eq!(t.live_rows(), ROWS);
    t
}

/// Every (key, row bits, accumulator bits) of a table, keys ascending.
fn contents(t: &EmbeddingTable) -> Vec<(u64, Vec<u32>, Option<u32>)> {
    let d = t.dim();
    let keys: Vec<u64> = t.live_keys().into_iter().map(|(k, _)| k).collect();
    let mut rows = vec![0f32; keys.len() * d];
    t.lookup(&keys, &mut rows).unwrap();
    keys.iter().zip(rows.chunks_exact(d)).map(|(k, r)| (*k, r.iter().map(|x| x.to_bits()).collect(), t.accumulator(*k).map(f32::to_bits))).collect()
}

/// What a damaged copy gave: refused (naming the file), or read back unchanged, or wrong.
#[derive(Default, Debug)]
struct Tally {
    refused: u32,
    unchanged: u32,
    wrong: u32,
}

#[test]
fn damaged_saved_tables_are_refused_naming_the_file_and_the_block() {
    let dir = TempDir::new("integrity");
    let live = trained_table(&dir.path("live"));
    let saved = dir.path("saved");
    live.save(&saved).unwrap();
    let good = std::fs::read(&saved).unwrap();
    let want = contents(&live);
    let want_header = *live.header();
    let l = want_header.layout;
    assert!(l.sums_len / 4 >= 3, "several blocks: {l:?}");
    let damaged = dir.path("damaged");
    let dst = dir.path("resumed");
    let mut s = Stream(2026);
    let mut tally = Tally::default();
    let mut by_section = std::collections::BTreeMap::<String, u32>::new();
    let check = |bytes: &[u8], expect: &dyn Fn(&TableError), tally: &mut Tally| {
        std::fs::write(&damaged, bytes).unwrap();
        // The resume path: verify, then copy to a live table.
        match EmbeddingTable::load(&damaged, &dst) {
            Err(e) => {
                assert!(e.to_string().contains(damaged.to_str().unwrap()), "the error names the file: {e}");
                assert!(!dst.exists(), "a refused load leaves no copy");
                expect(&e);
                tally.refused += 1;
            }
            Ok(t) => {
                if contents(&t) == want && *t.header() == want_header {
                    tally.unchanged += 1;
                } else {
                    tally.wrong += 1;
                }
                drop(t);
                std::fs::remove_file(&dst).unwrap();
            }
        }
    };
    for case in 0..200u64 {
        // One in eight flips lands in the header page, one in eight in the checksums' page,
        // the rest anywhere in the file.
        let at = match case % 8 {
            0 => s.below(HEADER_LEN),
            1 => l.sums_offset + s.below(l.file_len - l.sums_offset),
            _ => s.below(l.file_len),
        };
        let mut b = good.clone();
        b[at as usize] ^= 1 + s.below(255) as u8;
        let section = match at {
            a if a < CHECKSUM_AT as u64 + 8 => "header fields".to_string(),
            a if a < HEADER_LEN => "header padding".to_string(),
            a if a < l.sums_offset => l.sections_of(a, a + 1),
            _ => "checksums".to_string(),
        };
        *by_section.entry(section).or_default() += 1;
        let expect = |e: &TableError| match e {
            TableError::Format(_) => assert!(at < HEADER_FIELDS as u64, "byte {at}: {e}"),
            TableError::Corrupt { section, offset, .. } if at >= l.sums_offset + l.sums_len => assert_eq!((section.as_str(), *offset), ("checksums", at)),
            TableError::Corrupt { section, offset, .. } if at >= l.sums_offset => assert_eq!((section.as_str(), *offset), ("checksums", l.sums_offset)),
            TableError::Corrupt { section, offset, .. } if at >= HEADER_LEN => {
                // The block holding the byte, and the section(s) that block spans.
                let block = HEADER_LEN + (at - HEADER_LEN) / CHECKSUM_BLOCK as u64 * CHECKSUM_BLOCK as u64;
                assert_eq!(*offset, block, "byte {at}");
                assert_eq!(*section, l.sections_of(block, (block + CHECKSUM_BLOCK as u64).min(l.sums_offset)));
                assert!(e.to_string().contains("previous checkpoint"), "{e}");
            }
            TableError::Corrupt { section, offset, .. } => assert_eq!((section.as_str(), *offset), ("header", at)),
            other => panic!("byte {at}: unexpected error {other}"),
        };
        check(&b, &expect, &mut tally);
    }
    let flips = std::mem::take(&mut tally);
    for case in 0..20u64 {
        let mut b = good.clone();
        if case % 2 == 0 {
            b.truncate(s.below(b.len() as u64) as usize);
        } else {
            b.extend((0..1 + s.below(9000)).map(|_| s.next_u64() as u8));
        }
        check(&b, &|e| assert!(matches!(e, TableError::Format(FormatError::Truncated { .. } | FormatError::BadLayout { .. })), "{e}"), &mut tally);
    }
    println!("saved table, {} bytes, {} rows: 200 byte flips {flips:?} by region {by_section:?}; 10 truncations + 10 appends {tally:?}", good.len(), ROWS);
    assert_eq!(flips.wrong + tally.wrong, 0, "a damaged table was read as a different one");
    assert_eq!((flips.refused, tally.refused), (200, 20), "every flip is caught: the checksums cover every byte that matters");
    // The undamaged file still loads, equal to the live table.
    let t = EmbeddingTable::load(&saved, &dst).unwrap();
    assert!(contents(&t) == want && t.as_bytes() == live.as_bytes());
}

#[test]
fn damaged_sparse_parameter_files_are_refused_naming_the_file() {
    let dir = TempDir::new("integrity");
    let live = trained_table(&dir.path("live"));
    let params = dir.path("rows.params");
    assert_eq!(live.export_params(&params).unwrap(), ROWS);
    let good = std::fs::read(&params).unwrap();
    // Version 3: the 32-byte frame header, the 16-byte payload header, the records, the CRC.
    assert_eq!(good.len() as u64, 32 + 16 + ROWS * (8 + 4 * DIM as u64) + 4);
    let cfg = TableConfig::new(DIM, 16384);
    let want = contents(&EmbeddingTable::import_params(&params, &dir.path("want"), &cfg).unwrap());
    assert_eq!(want.len() as u64, ROWS);
    let damaged = dir.path("damaged.params");
    let dst = dir.path("imported");
    let mut s = Stream(77);
    let mut tally = Tally::default();
    for case in 0..240u64 {
        let mut b = good.clone();
        match case {
            0..200 => {
                let at = if case % 8 == 0 { s.below(24) } else { s.below(b.len() as u64) } as usize;
                b[at] ^= 1 + s.below(255) as u8;
            }
            200..220 => b.truncate(s.below(b.len() as u64) as usize),
            _ => b.extend((0..1 + s.below(300)).map(|_| s.next_u64() as u8)),
        }
        std::fs::write(&damaged, &b).unwrap();
        match EmbeddingTable::import_params(&damaged, &dst, &cfg) {
            Err(e) => {
                assert!(e.to_string().contains(damaged.to_str().unwrap()), "{e}");
                assert!(!dst.exists(), "a refused import leaves no table");
                tally.refused += 1;
            }
            Ok(t) => {
                if contents(&t) == want {
                    tally.unchanged += 1;
                } else {
                    tally.wrong += 1;
                }
                drop(t);
                std::fs::remove_file(&dst).unwrap();
            }
        }
    }
    println!("sparse-parameter file, {} bytes: 200 flips + 20 truncations + 20 appends: {tally:?}", good.len());
    assert_eq!(tally.wrong, 0);
    assert_eq!(tally.refused, 240, "a CRC-32 catches every single-byte change");
    // The message of a damaged record.
    let mut b = good.clone();
    b[1000] ^= 0x40;
    std::fs::write(&damaged, &b).unwrap();
    let e = EmbeddingTable::import_params(&damaged, &dst, &cfg).unwrap_err().to_string();
    assert!(e.contains("checksum mismatch") && e.contains("export it again or restore it from a saved copy"), "{e}");
    // Nothing was written from the damaged file: a table it was loaded into is unchanged.
    let mut t = EmbeddingTable::create(&dst, &cfg).unwrap();
    assert!(t.load_params(&damaged).is_err());
    assert_eq!((t.live_rows(), t.generation()), (0, 0));
    // Version 1 (no CRC) is refused with what to do.
    let mut v1 = good[..good.len() - 4].to_vec();
    v1[8] = 1;
    std::fs::write(&damaged, &v1).unwrap();
    let e = read_params_header(&damaged).unwrap_err().to_string();
    assert!(e.contains("version 1 has no checksum") && e.contains("export it again"), "{e}");
}

fn ringrec(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringrec")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn table_verify_passes_good_files_and_fails_damaged_ones() {
    let dir = TempDir::new("integrity");
    let live_path = dir.path("live");
    let live = trained_table(&live_path);
    let saved = dir.path("saved");
    live.save(&saved).unwrap();
    let l = live.header().layout;

    let (ok, out, err) = ringrec(&["table", "verify", saved.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(out.contains(": ok: ") && out.contains(&format!("all {} blocks ({} bytes) match their checksums", l.sums_len / 4, l.sums_offset - 4096)), "{out}");
    assert!(out.contains("5000 keys in 16384 slots"), "{out}");

    let (ok, out, err) = ringrec(&["table", "verify", live_path.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("no checksums: a live table"), "{out}");

    // A byte of the rows, in the second block.
    let mut b = std::fs::read(&saved).unwrap();
    let at = 4096 + CHECKSUM_BLOCK + 12345;
    b[at] ^= 0x10;
    let bad = dir.path("bad");
    std::fs::write(&bad, &b).unwrap();
    let (ok, out, err) = ringrec(&["table", "verify", bad.to_str().unwrap()]);
    assert!(!ok, "damage exits non-zero: {out}");
    let block = 4096 + CHECKSUM_BLOCK;
    assert!(err.contains(&format!("{}: the rows section is damaged at byte {block}", bad.display())), "{err}");
    assert!(err.contains("1 of 3 blocks differ") && err.contains("resume from the previous checkpoint"), "{err}");
    // inspect and export refuse it too.
    assert!(!ringrec(&["table", "inspect", bad.to_str().unwrap()]).0);
    assert!(!ringrec(&["table", "export", bad.to_str().unwrap()]).0);

    // `table create` and `table import` seal their files: checksums, verified like a save's.
    let made = dir.path("made");
    let (ok, out, err) = ringrec(&["table", "create", made.to_str().unwrap(), "--dim", "16", "--table-capacity", "65536"]);
    assert!(ok && out.contains("CRC-32 of 5 blocks of 1 MiB"), "{out}{err}");
    let (ok, out, _) = ringrec(&["table", "verify", made.to_str().unwrap()]);
    // Index 512 KiB + rows 4 MiB.
    assert!(ok && out.contains("all 5 blocks (4718592 bytes) match their checksums"), "{out}");
    let params = dir.path("rows.params");
    live.export_params(&params).unwrap();
    let imported = dir.path("imported");
    assert!(ringrec(&["table", "import", params.to_str().unwrap(), imported.to_str().unwrap()]).0);
    let (ok, out, _) = ringrec(&["table", "verify", imported.to_str().unwrap()]);
    assert!(ok && out.contains("match their checksums") && out.contains("5000 keys"), "{out}");
    // Sealing is for writable handles; the next update clears the flag again.
    assert!(matches!(EmbeddingTable::open_readonly(&made).unwrap().seal(), Err(TableError::ReadOnly)));
    let mut t = EmbeddingTable::open_readwrite(&made).unwrap();
    assert!(t.header().sums_valid);
    t.apply_updates(&[1], &[0.5; 16], 0.1).unwrap();
    drop(t);
    assert!(!EmbeddingTable::open_readonly(&made).unwrap().header().sums_valid);

    // A live table whose index lost a key's place (count intact): open accepts it, verify
    // does not.
    let mut b = std::fs::read(&live_path).unwrap();
    // A key at the end of its cluster (no other key probes through its slot) moves to a
    // free slot far away.
    let cap = live.header().capacity as usize;
    let used: std::collections::HashSet<usize> = live.live_keys().iter().map(|(_, s)| *s).collect();
    let (key, slot) = live.live_keys().into_iter().find(|(_, s)| !used.contains(&((s + 1) % cap))).unwrap();
    let free = (0..cap).map(|i| (slot + cap / 2 + i) % cap).find(|s| !used.contains(s)).unwrap();
    let word = |s: usize| 4096 + 8 * s;
    b[word(slot)..word(slot) + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    b[word(free)..word(free) + 8].copy_from_slice(&key.to_le_bytes());
    let stray = dir.path("stray");
    std::fs::write(&stray, &b).unwrap();
    assert!(EmbeddingTable::open_readonly(&stray).is_ok());
    let (ok, _, err) = ringrec(&["table", "verify", stray.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains(&format!("slot {free} holds key {key:#x}, which a lookup from its home slot does not reach")), "{err}");
}

#[test]
fn a_table_of_another_shape_names_the_flag_and_both_values() {
    let dir = TempDir::new("integrity");
    let mut c = TableConfig::new(8, 1 << 10);
    c.seed = 3;
    c.optimizer = OptimizerKind::Adagrad;
    let t = EmbeddingTable::create(&dir.path("t"), &c).unwrap();
    t.check_matches(&c).unwrap();
    let p = dir.path("t").display().to_string();
    let message = |f: &dyn Fn(&mut TableConfig)| {
        let mut w = c.clone();
        f(&mut w);
        let e = t.check_matches(&w).unwrap_err();
        assert!(matches!(e, TableError::Mismatch { .. }));
        e.to_string()
    };
    assert_eq!(message(&|w| w.dim = 16), format!("{p} does not match this run: --dim: the table has 8, this run asks for 16; run with the table's --dim, or start without this table"));
    assert!(message(&|w| w.optimizer = OptimizerKind::Sgd).contains("--sparse-optimizer: the table holds adagrad state, this run uses sgd"));
    assert!(message(&|w| w.seed = 4).contains("--seed: the table's initial rows come from seed 3, this run uses seed 4"));
    assert!(message(&|w| w.capacity = 3000).contains("--table-capacity: the table has 1024 slots, this run asks for 4096"));
    assert!(message(&|w| w.dtype = StorageDtype::Bf16).contains("--table-dtype: the table stores f32, this run uses bf16"));
    assert!(message(&|w| w.admit_after = 2).contains("--admit-after: the table has admission after 1, this run asks for admission after 2"));
    assert!(message(&|w| w.track_usage = true).contains("the table keeps no usage"));
    assert!(message(&|w| w.adagrad_eps = 1e-6).contains("Adagrad epsilon: the table has 0.00000001, this run asks for 0.000001"));
    assert!(message(&|w| w.init_scale = Some(0.5)).contains("--init-scale"));
    // Capacities that round to the same power of two match, and a table that grew past
    // the run's capacity too.
    let mut w = c.clone();
    w.capacity = 1000;
    t.check_matches(&w).unwrap();
    w.capacity = 16;
    t.check_matches(&w).unwrap();
}

/// A small tmpfs mounted for a test; unmounted on drop.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A 2 MiB tmpfs under `dir`, or `None` after printing why not.
fn small_tmpfs(dir: &TempDir) -> Option<Mount> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a tmpfs needs root");
        return None;
    }
    let at = dir.path("shm");
    std::fs::create_dir_all(&at).unwrap();
    match Command::new("mount").args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"]).arg(&at).output() {
        Ok(o) if o.status.success() => Some(Mount(at)),
        other => {
            eprintln!("skipped: mount -t tmpfs failed: {other:?}");
            None
        }
    }
}

#[test]
fn a_full_shm_dir_is_a_clear_error_and_leaves_nothing() {
    let dir = TempDir::new("integrity");
    let Some(shm) = small_tmpfs(&dir) else { return };
    let big = TableConfig::new(16, 1 << 16); // 4 MiB of rows
    let need = big.header().unwrap().layout.file_len;
    let in_shm = shm.0.join("table");
    let e = EmbeddingTable::create(&in_shm, &big).unwrap_err().to_string();
    assert!(e.contains(&format!("needs {need} bytes")) && e.contains(&format!("free in {}", shm.0.display())), "{e}");
    let left = || std::fs::read_dir(&shm.0).unwrap().map(|e| e.unwrap().file_name()).collect::<Vec<_>>();
    assert!(left().is_empty(), "{:?}", left());
    // Resuming into it: the same error, nothing left.
    let saved = dir.path("saved");
    EmbeddingTable::create(&dir.path("big"), &big).unwrap().save(&saved).unwrap();
    let e = EmbeddingTable::load(&saved, &in_shm).unwrap_err().to_string();
    assert!(e.contains(&format!("needs {need} bytes")), "{e}");
    assert!(left().is_empty(), "{:?}", left());
    // A table that fits is made there; saving a big one into the full directory fails
    // before writing, leaving no temporary file.
    let small = EmbeddingTable::create(&in_shm, &TableConfig::new(4, 1024)).unwrap();
    let e = EmbeddingTable::open_readonly(&saved).unwrap().save(&shm.0.join("copy")).unwrap_err().to_string();
    assert!(e.contains("needs") && e.contains(&shm.0.display().to_string()), "{e}");
    assert_eq!(left(), vec![std::ffi::OsString::from("table")]);
    drop(small);
}

/// What leaving the zero pages unwritten saves on a mostly empty table, for
/// docs/BENCHMARKS.md: `ringrec train`'s default table (2^21 slots, dim 16, 144 MiB) holding
/// `RINGREC_BENCH_ROWS` rows (600 by default, a test run's few hundred, spread over the
/// slots), saved to the temp dir by `save` and by every byte written (the space reserved,
/// the same fsync), alternately, the best of 5 each:
/// `cargo test --locked --test table_integrity -- --ignored --nocapture sparse_save_cost`
#[test]
#[ignore]
fn sparse_save_cost() {
    let n: u64 = std::env::var("RINGREC_BENCH_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(600);
    let disk = TempDir::new("sparse-save");
    let live = PathBuf::from(format!("/dev/shm/ringrec-bench-sparse-{}", std::process::id()));
    let mut t = EmbeddingTable::create(&live, &TableConfig::new(16, 1 << 21)).unwrap();
    std::fs::remove_file(&live).unwrap(); // the mapping lives on
    let keys: Vec<u64> = (0..n).map(ringrec::hash::splitmix64).collect();
    t.put_rows(&keys, &vec![0.25; 16 * keys.len()]).unwrap();
    let (saved, every) = (disk.path("saved"), disk.path("every-byte"));
    let l = t.header().layout;
    let (mut save, mut all) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..5 {
        all = all.min(best_of(1, || write_reserved(&every, l.file_len, t.as_bytes())));
        save = save.min(best_of(1, || t.save(&saved).unwrap()));
    }
    let body = HEADER_LEN as usize..l.sums_offset as usize;
    assert!(std::fs::read(&saved).unwrap()[body.clone()] == t.as_bytes()[body], "the saved body differs from the table's");
    println!("table of {:.0} MiB, {n} rows: save {save:.3} s | every byte written {all:.3} s ({:.1}x)", l.file_len as f64 / 1048576.0, all / save);
}

/// `save` without its checksums or its skipped pages: the file's space reserved first, then
/// every byte of `bytes` written, committed atomically.
fn write_reserved(path: &std::path::Path, len: u64, bytes: &[u8]) {
    let f = ringrec::fileio::AtomicFile::create(path, 0o600).unwrap();
    ringrec::fileio::reserve(f.file(), path, len).unwrap();
    std::io::Write::write_all(&mut f.file(), bytes).unwrap();
    f.commit().unwrap();
}

/// Seconds of the fastest of `n` runs of `f`.
fn best_of(n: usize, mut f: impl FnMut()) -> f64 {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// What the checksums cost, for docs/BENCHMARKS.md. Run in release mode:
/// `cargo test --release --locked --test table_integrity -- --ignored --nocapture checksum_cost`
/// (`RINGREC_BENCH_ROWS=1000000,10000000` by default: dim 16, f32, SGD). The live table
/// is in /dev/shm; it is saved to the temp dir (a disk here) and to /dev/shm (no disk: the
/// checksums' share at its largest). Reads are from the page cache.
#[test]
#[ignore]
fn checksum_cost() {
    let rows: Vec<u64> = std::env::var("RINGREC_BENCH_ROWS").unwrap_or_else(|_| "1000000,10000000".into()).split(',').map(|s| s.trim().parse().unwrap()).collect();
    let disk = TempDir::new("checksum-cost");
    let shm = PathBuf::from(format!("/dev/shm/ringrec-bench-{}", std::process::id()));
    std::fs::create_dir_all(&shm).unwrap();
    for n in rows {
        let live = shm.join("live");
        let mut t = EmbeddingTable::create(&live, &TableConfig::new(16, format::capacity_for_rows(n))).unwrap();
        std::fs::remove_file(&live).unwrap(); // the mapping lives on
        for chunk in (0..n).collect::<Vec<u64>>().chunks(1 << 20) {
            let vals: Vec<f32> = chunk.iter().flat_map(|k| (0..16).map(move |j| (*k as f32) * 1e-7 + j as f32)).collect();
            t.put_rows(chunk, &vals).unwrap();
        }
        let bytes = t.as_bytes().len() as f64;
        let l = t.header().layout;
        let sums = best_of(3, || drop(std::hint::black_box(ringrec::hash::block_sums(&t.as_bytes()[l.index_offset as usize..l.sums_offset as usize]))));
        let gb = |s: f64| bytes / s / 1e9;
        println!("rows {n:>9} file {:>6.0} MiB | block_sums alone {sums:.3} s ({:.1} GB/s) | {} threads", bytes / 1048576.0, gb(sums), rayon::current_num_threads());
        for (name, dir) in [("disk", disk.0.as_path()), ("/dev/shm", shm.as_path())] {
            let (with, without, resumed) = (dir.join("with"), dir.join("without"), shm.join("resumed"));
            // Alternately, so all see the same state of the page cache and the disk: `save`
            // of format v1 (write_atomic of the bytes), the same with the space reserved
            // first (`save` without the checksums), and `save`.
            let (mut v1, mut plain, mut save) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
            for _ in 0..5 {
                v1 = v1.min(best_of(1, || ringrec::fileio::write_atomic(&without, 0o600, |w| std::io::Write::write_all(w, t.as_bytes())).unwrap()));
                plain = plain.min(best_of(1, || write_reserved(&without, l.file_len, t.as_bytes())));
                save = save.min(best_of(1, || t.save(&with).unwrap()));
            }
            let open_plain = best_of(3, || drop(EmbeddingTable::open_readonly(&without).unwrap()));
            let open_verified = best_of(3, || drop(EmbeddingTable::open_readonly(&with).unwrap()));
            let verify = best_of(3, || drop(EmbeddingTable::verify(&with).unwrap()));
            let load = best_of(3, || {
                drop(EmbeddingTable::load(&with, &resumed).unwrap());
                std::fs::remove_file(&resumed).unwrap();
            });
            println!(
                "  to {name:<8} v1 write {v1:.3} s | reserve + write {plain:.3} s | save (the same + checksums) {save:.3} s ({:+.1}%; block_sums alone = {:.1}% of save) | open unverified {open_plain:.3} s, verified {open_verified:.3} s ({:.1} GB/s) | table verify {verify:.3} s | load (resume) {load:.3} s",
                (save / plain - 1.0) * 100.0,
                sums / save * 100.0,
                gb(open_verified),
            );
            for p in [&with, &without] {
                std::fs::remove_file(p).unwrap();
            }
        }
    }
    std::fs::remove_dir_all(&shm).unwrap();
}
