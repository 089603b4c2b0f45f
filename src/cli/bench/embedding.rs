//! `ringrec bench embedding`: lookups/s and updates/s of the memory-mapped
//! [`EmbeddingTable`] against the obvious alternative, a per-rank `HashMap<u64, Vec<f32>>`,
//! measured in the same run on the same keys. One line per (dim, rows, key distribution);
//! the `check` column says whether both returned bit-identical rows.
//!
//! Threads: `1t` columns run on one thread (both sides); `par` columns use the rayon pool
//! (the table's own parallel gather vs `par_chunks` over the HashMap).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use rayon::prelude::*;

use ringrec::embedding::format::capacity_for_rows;
use ringrec::embedding::init::init_row_f32;
use ringrec::embedding::{EmbeddingTable, OptimizerKind, SegmentGuard, StorageDtype, TableConfig};

/// Key distributions of the benchmark batches.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyDist {
    /// Zipf over the table's keys (rank r drawn with probability ~ 1/r^s), as CTR ids are.
    Zipf,
    /// Uniform over the table's keys.
    Uniform,
}

/// Flags of `ringrec bench embedding`.
#[derive(clap::Args, Clone, Debug)]
pub struct EmbeddingBenchArgs {
    /// Embedding dimensions to measure (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "16,64")]
    pub dims: Vec<u32>,
    /// Rows in the table (comma separated), e.g. 1000000,10000000.
    #[arg(long, value_delimiter = ',', default_value = "1000000")]
    pub rows: Vec<u64>,
    /// Key distributions (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "zipf,uniform")]
    pub dist: Vec<KeyDist>,
    /// Keys per lookup batch (a CTR step: batch 4096 x 26 sparse features).
    #[arg(long, default_value_t = 4096 * 26)]
    pub batch: usize,
    /// Timed batches per measurement.
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Zipf exponent s.
    #[arg(long, default_value_t = 1.05)]
    pub zipf_s: f64,
    /// Table storage dtype.
    #[arg(long, default_value = "f32")]
    pub dtype: StorageDtype,
    /// Directory of the table file (default: RINGREC_SHM_DIR or /dev/shm).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print JSON records instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// One line of the result.
#[derive(Clone, Debug, serde::Serialize)]
pub struct EmbeddingBenchRow {
    /// Values per row.
    pub dim: u32,
    /// Rows in the table.
    pub rows: u64,
    /// Key distribution.
    pub dist: KeyDist,
    /// Keys per batch.
    pub batch: usize,
    /// Distinct keys per batch (what an update batch holds).
    pub unique: usize,
    /// Table lookups per second, one thread.
    pub table_lookups_1t: f64,
    /// HashMap lookups per second, one thread.
    pub hashmap_lookups_1t: f64,
    /// Table lookups per second, rayon pool.
    pub table_lookups_par: f64,
    /// HashMap lookups per second, rayon pool.
    pub hashmap_lookups_par: f64,
    /// Table row updates (SGD) per second.
    pub table_updates: f64,
    /// HashMap row updates (SGD) per second.
    pub hashmap_updates: f64,
    /// Both sides returned bit-identical rows.
    pub check: bool,
}

use ringrec::sparse::workload::{key_of, uniform_ids, zipf_ids};

/// A batch of keys of ids `0..n`: uniform, or Zipf by inverting the continuous power-law CDF.
fn draw(n: u64, len: usize, dist: KeyDist, s: f64, seed: u64) -> Vec<u64> {
    let ids = match dist {
        KeyDist::Uniform => uniform_ids(n, len, seed),
        KeyDist::Zipf => zipf_ids(n, len, s, seed),
    };
    ids.into_iter().map(key_of).collect()
}

fn map_gather(map: &HashMap<u64, Vec<f32>>, keys: &[u64], out: &mut [f32], dim: usize, scale: f32) {
    for (k, o) in keys.iter().zip(out.chunks_exact_mut(dim)) {
        match map.get(k) {
            Some(r) => o.copy_from_slice(r),
            None => init_row_f32(*k, 0, scale, o),
        }
    }
}

/// Runs `f` `iters` times over the four batches in turn; keys per second.
fn timed(iters: usize, per: usize, mut f: impl FnMut(usize) -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let t = Instant::now();
    for i in 0..iters {
        f(i % 4)?;
    }
    Ok((iters * per) as f64 / t.elapsed().as_secs_f64())
}

/// A table of `rows` rows of `dim` at `path` and a HashMap holding the same rows.
fn filled(path: &std::path::Path, rows: u64, dim: u32, dtype: StorageDtype) -> anyhow::Result<(EmbeddingTable, HashMap<u64, Vec<f32>>)> {
    let d = dim as usize;
    let mut cfg = TableConfig::new(dim, capacity_for_rows(rows));
    cfg.dtype = dtype;
    cfg.optimizer = OptimizerKind::Sgd;
    let mut table = EmbeddingTable::create(path, &cfg)?;
    let mut map: HashMap<u64, Vec<f32>> = HashMap::with_capacity(rows as usize);
    let chunk = 65536u64;
    let mut vals = Vec::with_capacity(chunk as usize * d);
    for start in (0..rows).step_by(chunk as usize) {
        let keys: Vec<u64> = (start..(start + chunk).min(rows)).map(key_of).collect();
        vals.resize(keys.len() * d, 0.0);
        table.lookup(&keys, &mut vals)?; // initial rows, rounded to storage
        table.put_rows(&keys, &vals)?;
        for (k, r) in keys.iter().zip(vals.chunks_exact(d)) {
            map.insert(*k, r.to_vec());
        }
    }
    Ok((table, map))
}

/// One line: lookups and updates of batches drawn from `dist`, on both sides.
fn measure(args: &EmbeddingBenchArgs, one: &rayon::ThreadPool, table: &mut EmbeddingTable, map: &mut HashMap<u64, Vec<f32>>, rows: u64, dim: u32, dist: KeyDist) -> anyhow::Result<EmbeddingBenchRow> {
    let (d, scale, iters) = (dim as usize, table.header().init_scale, args.iters);
    let batches: Vec<Vec<u64>> = (0..4).map(|b| draw(rows, args.batch, dist, args.zipf_s, b * 7 + dim as u64)).collect();
    let (mut out_t, mut out_m) = (vec![0f32; args.batch * d], vec![0f32; args.batch * d]);
    // Warm up, and check both sides agree.
    let mut check = true;
    for b in &batches {
        table.lookup(b, &mut out_t)?;
        map_gather(map, b, &mut out_m, d, scale);
        check &= out_t.iter().zip(&out_m).all(|(x, y)| x.to_bits() == y.to_bits());
    }
    let table_1t = one.install(|| timed(iters, args.batch, |b| Ok(table.lookup(&batches[b], &mut out_t)?)))?;
    let map_1t = timed(iters, args.batch, |b| {
        map_gather(map, &batches[b], &mut out_m, d, scale);
        Ok(())
    })?;
    let table_par = timed(iters, args.batch, |b| Ok(table.lookup(&batches[b], &mut out_t)?))?;
    let map_par = timed(iters, args.batch, |b| {
        out_m.par_chunks_mut(2048 * d).zip(batches[b].par_chunks(2048)).for_each(|(o, k)| map_gather(map, k, o, d, scale));
        Ok(())
    })?;
    // Updates: the distinct keys of a batch, as a host applies them after aggregation.
    let uniq: Vec<Vec<u64>> = batches.iter().map(|b| b.iter().copied().collect::<std::collections::BTreeSet<u64>>().into_iter().collect()).collect();
    let grads: Vec<f32> = (0..uniq.iter().map(Vec::len).max().unwrap_or(0) * d).map(|i| (i % 13) as f32 * 1e-3 - 6e-3).collect();
    let upd_iters = iters.div_ceil(4).max(1);
    let per = (0..upd_iters).map(|i| uniq[i % 4].len()).sum::<usize>() / upd_iters;
    let lr = 0.01f32;
    let table_updates = timed(upd_iters, per, |b| {
        table.apply_updates(&uniq[b], &grads[..uniq[b].len() * d], lr)?;
        Ok(())
    })?;
    let hashmap_updates = timed(upd_iters, per, |b| {
        for (k, g) in uniq[b].iter().zip(grads.chunks_exact(d)) {
            let row = map.entry(*k).or_insert_with(|| {
                let mut r = vec![0f32; d];
                init_row_f32(*k, 0, scale, &mut r);
                r
            });
            row.iter_mut().zip(g).for_each(|(w, g)| *w -= lr * g);
        }
        Ok(())
    })?;
    let unique = uniq[0].len();
    Ok(EmbeddingBenchRow { dim, rows, dist, batch: args.batch, unique, table_lookups_1t: table_1t, hashmap_lookups_1t: map_1t, table_lookups_par: table_par, hashmap_lookups_par: map_par, table_updates, hashmap_updates, check })
}

/// Runs the benchmark and prints the table (or JSON).
pub fn run(args: EmbeddingBenchArgs) -> anyhow::Result<()> {
    let dir = match args.dir.clone() {
        Some(d) => d,
        None => ringrec::config::RuntimeConfig::from_env()?.shm_dir,
    };
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().context("building a 1-thread pool")?;
    let mut results = Vec::new();
    if !args.json {
        println!("# ringrec bench embedding: batch {} keys, {} iters, storage {}, zipf s={}, {} rayon threads; rates in M rows/s", args.batch, args.iters, args.dtype, args.zipf_s, rayon::current_num_threads());
        println!("{:>4} {:>9} {:>8} {:>7} | {:>8} {:>8} {:>6} | {:>8} {:>8} {:>6} | {:>8} {:>8} {:>6} | check", "dim", "rows", "dist", "unique", "tbl 1t", "map 1t", "ratio", "tbl par", "map par", "ratio", "tbl upd", "map upd", "ratio");
    }
    for &rows in &args.rows {
        for &dim in &args.dims {
            let path = dir.join(format!("ringrec-bench-{}-table", std::process::id()));
            let _ = std::fs::remove_file(&path);
            let _guard = SegmentGuard::new(&path);
            let (mut table, mut map) = filled(&path, rows, dim, args.dtype)?;
            for &dist in &args.dist {
                let r = measure(&args, &one, &mut table, &mut map, rows, dim, dist)?;
                if !args.json {
                    let cols = [(r.table_lookups_1t, r.hashmap_lookups_1t), (r.table_lookups_par, r.hashmap_lookups_par), (r.table_updates, r.hashmap_updates)];
                    let cols: Vec<String> = cols.iter().map(|(t, m)| format!("{:>8.2} {:>8.2} {:>5.2}x", t / 1e6, m / 1e6, t / m)).collect();
                    println!("{:>4} {:>9} {:>8} {:>7} | {} | {}", dim, rows, format!("{dist:?}").to_lowercase(), r.unique, cols.join(" | "), if r.check { "ok" } else { "MISMATCH" });
                }
                results.push(r);
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    }
    if results.iter().any(|r| !r.check) {
        anyhow::bail!("the table and the HashMap returned different rows");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_draws_are_skewed_and_in_range() {
        let keys = draw(1000, 20000, KeyDist::Zipf, 1.05, 1);
        let hot = keys.iter().filter(|k| **k == key_of(0)).count();
        let cold = keys.iter().filter(|k| **k == key_of(999)).count();
        assert!(hot > 50 * cold.max(1), "hot {hot} cold {cold}");
        let valid: std::collections::HashSet<u64> = (0..1000).map(key_of).collect();
        assert!(keys.iter().all(|k| valid.contains(k)));
        let u = draw(1000, 20000, KeyDist::Uniform, 1.05, 1);
        assert!(u.iter().filter(|k| **k == key_of(0)).count() < 60);
    }
}
