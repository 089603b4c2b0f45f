//! `ringrec bench checkpoint`: what integrity costs a checkpoint. A table of N live rows
//! (dim 16, f32, random keys) and the default model's dense state are written as a
//! checkpoint and read back with every check, and the checksums alone are timed on the
//! same bytes, so the report says which share of a checkpoint's time they take.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;

use ringrec::embedding::{EmbeddingTable, TableConfig};
use ringrec::model::{DenseOptimState, DenseOptimizer, ModelSpec};
use ringrec::train::checkpoint::{self, DenseState};

/// Flags of `ringrec bench checkpoint`.
#[derive(clap::Args, Debug)]
pub struct CheckpointBenchArgs {
    /// Live rows of the table (several sizes, comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1000000,10000000")]
    pub rows: Vec<u64>,
    /// Where the checkpoints are written (a real filesystem, not tmpfs, for disk figures).
    #[arg(long, default_value = "target/bench-checkpoint")]
    pub dir: PathBuf,
    /// Where the table lives meanwhile (the host table's place).
    #[arg(long, default_value = "/dev/shm")]
    pub shm_dir: PathBuf,
    /// Repetitions per size (the best is reported).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
}

/// Runs the benchmark and prints one line per size.
pub fn run(args: &CheckpointBenchArgs) -> anyhow::Result<()> {
    let spec = ModelSpec::mlp(26, 16, 13, vec![256, 128]);
    let params = spec.init_params(1);
    let mut opt = DenseOptimState::new(DenseOptimizer::Adam, 0.001, params.len());
    opt.step = 1;
    let dense = DenseState { step: 1, epoch: 0, step_in_epoch: 1, opt, spec: Some(spec), params };
    println!("# ringrec bench checkpoint: dim 16 f32 table, {} dense parameters + Adam; best of {}; dir {}", dense.params.len(), args.repeats, args.dir.display());
    println!("{:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8}", "rows", "MB", "write s", "verify s", "sums s", "MB/s sum", "sums %");
    for &rows in &args.rows {
        let cap = ringrec::embedding::format::capacity_for_rows(rows);
        let path = args.shm_dir.join(format!("ringrec-bench-checkpoint-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut t = EmbeddingTable::create(&path, &TableConfig::new(16, cap)).with_context(|| format!("creating a {cap}-slot table in {}", args.shm_dir.display()))?;
        let _ = std::fs::remove_file(&path);
        let mut s = ringrec::hash::Stream(7);
        let chunk = 1 << 20;
        let mut left = rows;
        while left > 0 {
            let n = left.min(chunk) as usize;
            let keys: Vec<u64> = (0..n).map(|_| s.next_u64() >> 1).collect();
            let values: Vec<f32> = (0..n * 16).map(|i| (i % 97) as f32 * 1e-3).collect();
            t.put_rows(&keys, &values)?;
            left -= n as u64;
        }
        let bytes = t.as_bytes().len() as f64;
        let (mut write, mut verify, mut sums) = (f64::MAX, f64::MAX, f64::MAX);
        for _ in 0..args.repeats {
            let _ = std::fs::remove_dir_all(&args.dir);
            let t0 = Instant::now();
            let ck = checkpoint::write(&args.dir, &dense, &t, &[], 1)?;
            write = write.min(t0.elapsed().as_secs_f64());
            let t1 = Instant::now();
            checkpoint::load(&ck)?;
            verify = verify.min(t1.elapsed().as_secs_f64());
            let t2 = Instant::now();
            std::hint::black_box(ringrec::hash::block_sums(t.as_bytes()));
            std::hint::black_box(ringrec::hash::crc32(bytemuck::cast_slice(&dense.params)));
            sums = sums.min(t2.elapsed().as_secs_f64());
        }
        println!("{:>10} {:>10.1} {:>9.3} {:>9.3} {:>9.3} {:>9.0} {:>7.1}%", rows, bytes / 1e6, write, verify, sums, bytes / 1e6 / sums, 100.0 * sums / write);
        let _ = std::fs::remove_dir_all(&args.dir);
    }
    Ok(())
}
