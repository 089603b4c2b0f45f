//! Data-layer throughput on one synthetic 200,000-row Criteo TSV, all in one run:
//!
//! - `parse tsv`: rows/s of `CriteoReader` streaming the TSV (one thread, byte-level parser);
//! - `prepare`: rows/s and MB/s of TSV of `prepare_with` (count lines, parse, write the
//!   cache) on one thread and on every core, and the ratio of the two;
//! - `open`: `Dataset::open` of the cache (header, a fresh mapping and the CRC-32 of every
//!   1 MiB block, in parallel on the rayon pool) against a bare open (header checked, file
//!   mapped, nothing verified), and `verify` alone on a mapping already touched; file in the
//!   page cache;
//! - `cache batches`: rows/s of `Dataset::fill_batch` over a shuffled epoch in global batches
//!   of 4096 (one thread, file in the page cache);
//!
//! and the ratio of the cache's rate to the parser's (the reference measured in the same run).
//! Each figure is the best of `RINGREC_BENCH_REPEATS` (default 5) repetitions.
//!
//! `cargo bench --bench data` (`RINGREC_BENCH_ROWS` changes the row count).

use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Instant;

use ringrec::data::cache::HEADER_FIELDS;
use ringrec::data::prepare::all_cores;
use ringrec::data::{epoch_order, global_batch_range, prepare_with, steps_per_epoch, synth, CacheHeader, CriteoReader, Dataset, PrepareOptions};

fn env_u64(k: &str, default: u64) -> u64 {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn best_of<T>(repeats: u64, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut best = f64::INFINITY;
    let mut out = None;
    for _ in 0..repeats.max(1) {
        let t = Instant::now();
        let r = f();
        best = best.min(t.elapsed().as_secs_f64());
        out = Some(r);
    }
    (best, out.expect("at least one repetition"))
}

fn main() -> anyhow::Result<()> {
    let rows = env_u64("RINGREC_BENCH_ROWS", 200_000);
    let repeats = env_u64("RINGREC_BENCH_REPEATS", 5);
    let dir: PathBuf = std::env::temp_dir().join(format!("ringrec-bench-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let tsv = dir.join("synth.tsv");
    let cache = dir.join("synth.rrdata");

    let t = Instant::now();
    let s = synth(&tsv, rows, 1)?;
    let synth_s = t.elapsed().as_secs_f64();
    println!(
        "synth        {rows} rows, {:.1} MB in {synth_s:.3}s ({:.0} rows/s, {} threads); ctr {:.4}, planted-model AUC {:.4}",
        s.bytes as f64 / 1e6,
        rows as f64 / synth_s,
        rayon::current_num_threads(),
        s.ctr,
        s.bayes_auc
    );

    let (parse_s, n) = best_of(repeats, || -> anyhow::Result<u64> {
        let mut n = 0u64;
        let mut acc = 0u64;
        for r in CriteoReader::open(&tsv, 0)? {
            let r = r?;
            acc = acc.wrapping_add(r.keys[0]);
            n += 1;
        }
        black_box(acc);
        Ok(n)
    });
    let n = n?;
    assert_eq!(n, rows);
    let parse_rate = rows as f64 / parse_s;
    println!("parse tsv    {:>12.0} rows/s  {:>8.1} MB/s  ({parse_s:.3}s)", parse_rate, s.bytes as f64 / parse_s / 1e6);

    let mut prep = Vec::new();
    for threads in [1, all_cores()] {
        let (prep_s, p) = best_of(repeats, || {
            // A fresh file each time: replacing one costs its removal.
            let _ = std::fs::remove_file(&cache);
            prepare_with(&tsv, &cache, &PrepareOptions::new(0).threads(threads))
        });
        let p = p?;
        println!(
            "prepare      {:>12.0} rows/s  {:>8.1} MB/s  ({prep_s:.3}s, {threads} thread(s), cache {:.1} MB)",
            rows as f64 / prep_s,
            s.bytes as f64 / prep_s / 1e6,
            p.bytes as f64 / 1e6
        );
        prep.push((prep_s, p));
    }
    println!("ratio        prepare on {} threads / on one = {:.2}x", all_cores(), prep[0].0 / prep[1].0);
    let p = &prep[1].1;

    let (open_s, ds) = best_of(repeats, || Dataset::open(&cache));
    let ds = ds?;
    let (verify_s, v) = best_of(repeats, || ds.verify());
    v?;
    // The bare open, for comparison: what `Dataset::open` does before it verifies.
    let (bare_s, b) = best_of(repeats, || -> anyhow::Result<usize> {
        let f = std::fs::File::open(&cache)?;
        let len = f.metadata()?.len();
        let mut head = vec![0u8; HEADER_FIELDS];
        f.read_exact_at(&mut head, 0)?;
        CacheHeader::parse(&cache, &head, len)?;
        // SAFETY: a read-only mapping of the cache this bench wrote; nothing modifies it.
        let map = unsafe { memmap2::Mmap::map(&f) }?;
        Ok(black_box(map.len()))
    });
    b?;
    let mb = p.bytes as f64 / 1e6;
    let blocks = ds.header().layout.sums_len / 4;
    println!("open         {:>8.1} MB/s  ({open_s:.4}s verified: {mb:.1} MB, {blocks} blocks of 1 MiB, {} threads)", mb / open_s, rayon::current_num_threads());
    println!("open bare    {bare_s:.6}s (header and mapping, no verification): verification costs {:.4}s", open_s - bare_s);
    println!("verify       {:>8.1} MB/s  ({verify_s:.4}s, the mapping already touched)", mb / verify_s);
    let gb = 4096;
    let order = epoch_order(ds.len(), 0, Some(1))?;
    let (mut l, mut d, mut k) = (Vec::new(), Vec::new(), Vec::new());
    let (read_s, r) = best_of(repeats, || -> anyhow::Result<u64> {
        let mut acc = 0u64;
        for step in 0..steps_per_epoch(ds.len(), gb) {
            let idx = &order[global_batch_range(step, gb, ds.len())];
            ds.fill_batch(idx, &mut l, &mut d, &mut k)?;
            acc = acc.wrapping_add(k[0]).wrapping_add(l.len() as u64);
        }
        Ok(black_box(acc))
    });
    r?;
    let read_rate = rows as f64 / read_s;
    println!("cache batches{:>12.0} rows/s  {:>8.1} MB/s  ({read_s:.3}s, shuffled, global batch {gb})", read_rate, rows as f64 * 264.0 / read_s / 1e6);
    println!("ratio        cache batches / parse tsv = {:.1}x", read_rate / parse_rate);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
