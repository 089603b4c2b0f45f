//! `ringrec bench step`: the host-side work of a training step, without the dense model —
//! what bounds samples/s on a GPU, where the MLP is nearly free. Per step and rank:
//!
//! - `batch`: this rank's slice of the global batch read from the mapped data cache, its
//!   keys deduplicated (`train::batch::Batch`);
//! - `lookup`: the unique keys' rows from the host-shared table into the staging buffer,
//!   with the batch's inverse map, dense features and labels (what `DenseModel::stage`
//!   fills before the upload);
//! - `grads`: a stand-in for the download of the key gradients (one pass writing
//!   keys x dim values);
//! - `exchange`: the sparse exchange, the leader's table update and the host barrier
//!   (`EmbeddingStage::exchange_and_apply`), split into its own phases.
//!
//! time = mean of the slowest rank's step; samples/s per host = per-rank batch x ranks of
//! the host / time. The roofline: every rank of the host copies a buffer at the
//! same time (memcpy, bytes read + written per second summed over the host's ranks), and
//! the bytes a step must touch at least (each sample's cache row read and staged, each
//! unique key's table row read and staged, its gradient written, published, merged and
//! applied) divided by that bandwidth bounds the step from below.

use std::time::Instant;

use mpi::collective::{CommunicatorCollectives, SystemOperation};
use serde::Serialize;

use ringrec::data::criteo::{NUM_DENSE, NUM_SPARSE};
use ringrec::data::shard;
use ringrec::topology::Topology;
use ringrec::train::batch::Batch;
use ringrec::train::embedding::EmbeddingStage;
use ringrec::train::{data, TrainConfig};

/// Flags of `ringrec bench step`.
#[derive(clap::Args, Debug, Clone)]
pub struct StepBenchArgs {
    /// Per-rank batch sizes to measure (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "4096,16384,65536")]
    pub batch: Vec<usize>,
    /// Timed steps per batch size.
    #[arg(short = 'n', long, default_value_t = 10)]
    pub steps: usize,
    /// Untimed warm-up steps per batch size.
    #[arg(short = 'w', long, default_value_t = 2)]
    pub warmup: usize,
    /// Embedding dimension.
    #[arg(long, default_value_t = 16)]
    pub dim: usize,
    /// Criteo TSV or `.rrdata` cache (default: the synthetic set of `--synth-rows` rows).
    #[arg(long)]
    pub data: Option<std::path::PathBuf>,
    /// Rows of the synthetic default set.
    #[arg(long, default_value_t = 1_000_000)]
    pub synth_rows: u64,
    /// Where the default data set and TSV caches live.
    /// [env: RINGREC_DATA_DIR]
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
    /// Slots of the host table.
    #[arg(long, default_value_t = 1 << 23)]
    pub table_capacity: u64,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// One batch size's figures (means over the timed steps; phases: the slowest rank's).
#[derive(Serialize, Debug, Clone, Default)]
pub struct StepRow {
    /// Samples per rank per step.
    pub batch_per_rank: usize,
    /// Mean step time of the slowest rank, ms.
    pub step_ms: f64,
    /// Samples per second of one host.
    pub samples_per_sec_host: f64,
    /// Samples per second of the job.
    pub samples_per_sec: f64,
    /// Phase means (ms): batch, lookup, grads, exchange (and inside it: dedupe, host,
    /// cross, merge, apply).
    pub phases_ms: std::collections::BTreeMap<String, f64>,
    /// Distinct keys per rank per step.
    pub unique_per_rank: f64,
    /// Distinct keys per host per step.
    pub unique_per_host: f64,
    /// Keys inserted into the host table per step (rows new to it).
    pub inserted_per_step: f64,
    /// Bytes a step must stream on a host, per sample.
    pub bytes_per_sample: f64,
    /// Random cache lines a step must fetch on a host, per sample.
    pub lines_per_sample: f64,
    /// The host's memcpy bandwidth, bytes read + written per second.
    pub memcpy_bytes_per_sec: f64,
    /// The host's random 64-byte line reads per second.
    pub random_lines_per_sec: f64,
    /// Samples per second of a host at that bandwidth (the roofline bound).
    pub roofline_samples_per_sec: f64,
    /// samples_per_sec_host / roofline_samples_per_sec.
    pub of_roofline: f64,
}

/// The whole run.
#[derive(Serialize, Debug)]
pub struct StepReport {
    /// World size.
    pub ranks: usize,
    /// Hosts (simulated ones count).
    pub hosts: usize,
    /// Ranks per host.
    pub ranks_per_host: usize,
    /// One row per batch size.
    pub rows: Vec<StepRow>,
}

fn max_over(topo: &Topology, v: f64) -> f64 {
    let mut m = 0f64;
    topo.world.comm.all_reduce_into(&v, &mut m, SystemOperation::max());
    m
}

fn sum_over(comm: &impl CommunicatorCollectives, v: f64) -> f64 {
    let mut s = 0f64;
    comm.all_reduce_into(&v, &mut s, SystemOperation::sum());
    s
}

/// The host's copy bandwidth (DRAM, not cache): every local rank copies 256 MiB at once
/// after a barrier; bytes read + written by all of them over the slowest one's time (best
/// of three).
fn memcpy_bandwidth(topo: &Topology) -> f64 {
    let n = 256 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src); // fault the pages in
    let mut best = 0f64;
    for _ in 0..3 {
        topo.local.comm.barrier();
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        let mut slowest = 0f64;
        topo.local.comm.all_reduce_into(&t.elapsed().as_secs_f64(), &mut slowest, SystemOperation::max());
        best = best.max(2.0 * (n * topo.local_size) as f64 / slowest);
    }
    max_over(topo, best)
}

/// The host's random cache-line rate: every local rank reads 4M random 64-byte lines of
/// 256 MiB at once (prefetched 16 ahead, as the table's lookups are); lines per second
/// of all of them over the slowest one's time (best of three).
fn random_line_rate(topo: &Topology) -> f64 {
    let lines = (256usize << 20) / 64;
    let buf: Vec<u64> = (0..lines * 8).map(|i| i as u64).collect();
    let idx: Vec<usize> = (0..4usize << 20).map(|i| (ringrec::hash::splitmix64(i as u64 ^ topo.rank as u64) % lines as u64) as usize * 8).collect();
    let mut best = 0f64;
    for _ in 0..3 {
        topo.local.comm.barrier();
        let t = Instant::now();
        let mut sum = 0u64;
        for (n, i) in idx.iter().enumerate() {
            if let Some(j) = idx.get(n + 16) {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: a prefetch is a hint that never faults; `j` indexes `buf` anyway.
                unsafe {
                    std::arch::x86_64::_mm_prefetch(buf.as_ptr().wrapping_add(*j) as *const i8, std::arch::x86_64::_MM_HINT_T0)
                };
                #[cfg(not(target_arch = "x86_64"))]
                let _ = j;
            }
            sum = sum.wrapping_add(buf[*i]);
        }
        std::hint::black_box(sum);
        let mut slowest = 0f64;
        topo.local.comm.all_reduce_into(&t.elapsed().as_secs_f64(), &mut slowest, SystemOperation::max());
        best = best.max((idx.len() * topo.local_size) as f64 / slowest);
    }
    max_over(topo, best)
}

/// The bytes and random lines a sample of this step touches, and the roofline bound they
/// give at the measured memcpy bandwidth and random-line rate (samples/s per host).
#[allow(clippy::too_many_arguments)]
fn roofline(topo: &Topology, dim: usize, per_host: usize, unique_per_rank: f64, unique_per_host: f64, inserted_per_step: f64, bandwidth: f64, line_rate: f64) -> (f64, f64, f64) {
    let row_bytes = (4 * dim) as f64;
    // Streamed per sample: its cache row read and written into the batch, its keys read
    // by the dedupe, its inverse written and staged, labels and dense staged. Per rank
    // and unique key: its row staged, its gradient written, published (key + row) and
    // read by the merge; per host key: the merged row written and read by the update.
    let sample = 2.0 * (4 + 4 * NUM_DENSE + 8 * NUM_SPARSE) as f64 + 8.0 * NUM_SPARSE as f64 + 2.0 * 4.0 * NUM_SPARSE as f64 + 2.0 * (4 + 4 * NUM_DENSE) as f64;
    let host_bytes = per_host as f64 * sample + topo.local_size as f64 * unique_per_rank * (4.0 * row_bytes + 8.0) + unique_per_host * (2.0 * row_bytes + 16.0);
    let bytes_per_sample = host_bytes / per_host as f64;
    // Random lines: a unique key's index slot and row per rank (lookup), a host key's
    // slot and row (update), a new key's free slot.
    let lines = topo.local_size as f64 * unique_per_rank * 2.0 + unique_per_host * 2.0 + inserted_per_step;
    let lines_per_sample = lines / per_host as f64;
    let roofline = 1.0 / (bytes_per_sample / bandwidth).max(lines_per_sample / line_rate);
    (bytes_per_sample, lines_per_sample, roofline)
}

/// One table line of a row.
fn print_row(row: &StepRow) {
    let p = |k: &str| row.phases_ms.get(k).copied().unwrap_or(0.0);
    println!(
        "{:>8} {:>9.2} {:>12.0} | {:>7.2} {:>7.2} {:>7.2} {:>8.2} ({:>6.2} {:>6.2} {:>6.2} {:>6.2} {:>6.2}) | {:>8.0} {:>9.0} {:>8.0} | {:>6.0} {:>9.2} {:>11.0} {:>5.0}%",
        row.batch_per_rank,
        row.step_ms,
        row.samples_per_sec_host,
        p("batch"),
        p("lookup"),
        p("grads"),
        p("exchange"),
        p("dedupe"),
        p("host"),
        p("cross"),
        p("merge"),
        p("apply"),
        row.unique_per_rank,
        row.unique_per_host,
        row.inserted_per_step,
        row.bytes_per_sample,
        row.lines_per_sample,
        row.roofline_samples_per_sec,
        100.0 * row.of_roofline
    );
}

/// Runs the benchmark; prints on rank 0.
pub fn run(topo: &Topology, args: &StepBenchArgs) -> anyhow::Result<StepReport> {
    let mut cfg = TrainConfig::new(crate::cli::or_env(args.data_dir.clone(), "RINGREC_DATA_DIR")?.unwrap_or_else(crate::cli::train::default_data_dir));
    (cfg.data, cfg.synth_rows, cfg.dim, cfg.table_capacity, cfg.test_fraction) = (args.data.iter().cloned().collect(), args.synth_rows, args.dim, args.table_capacity, Some(0.0));
    let threads = cfg.threads_per_rank(topo);
    let _ = rayon::ThreadPoolBuilder::new().num_threads(threads).build_global();
    let data = data::open(topo, &cfg)?;
    let (ds, n) = data.first()?;
    let mut stage = EmbeddingStage::open(topo, &cfg, None)?;
    let (bandwidth, line_rate) = (memcpy_bandwidth(topo), random_line_rate(topo));
    let root = topo.rank == 0;
    if root && !args.json {
        println!("# ringrec bench step: {} ranks on {} host(s), {} threads per rank, dim {}, {} rows of {}", topo.size, topo.num_hosts, threads, args.dim, n, ds.path().display());
        println!("# host: memcpy {:.1} GB/s (read + write), random 64-byte reads {:.0} M/s (all local ranks at once); time = mean of the slowest rank over {} steps", bandwidth / 1e9, line_rate / 1e6, args.steps);
        println!("{:>8} {:>9} {:>12} | {:>7} {:>7} {:>7} {:>8} ({:>6} {:>6} {:>6} {:>6} {:>6}) | {:>8} {:>9} {:>8} | {:>6} {:>9} {:>11} {:>6}", "batch", "step ms", "samples/s/h", "batch", "lookup", "grads", "exchange", "dedupe", "host", "cross", "merge", "apply", "uniq/rk", "uniq/host", "new/step", "B/smp", "lines/smp", "roofline/s", "of it");
    }
    let (mut batch, mut emb, mut inverse, mut dense, mut labels, mut grads) = (Batch::default(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut rows = Vec::new();
    for &b in &args.batch {
        let global = b * topo.size;
        let mut phases = std::collections::BTreeMap::<String, f64>::new();
        let (mut total, mut uniq, mut host_uniq) = (0f64, 0f64, 0f64);
        let mut rows_before = 0;
        for step in 0..args.warmup + args.steps {
            if step == args.warmup {
                rows_before = stage.table().table().live_rows();
            }
            let timed = step >= args.warmup;
            let start = (step * global) % n;
            let mine = shard::rank_slice(0..global, topo.rank, topo.size);
            topo.world.comm.barrier();
            let t0 = Instant::now();
            batch.load(ds, mine.map(|i| ((start + i) % n) as u32))?;
            let t1 = Instant::now();
            let u = batch.uniq.len();
            emb.resize(u * args.dim, 0.0);
            stage.lookup(&batch.uniq, &mut emb)?;
            inverse.clone_from(&batch.inverse);
            dense.clone_from(&batch.dense);
            labels.clone_from(&batch.labels);
            let t2 = Instant::now();
            grads.resize(u * args.dim, 0.0);
            grads.iter_mut().zip(&emb).for_each(|(g, e)| *g = 1e-4 * e);
            let t3 = Instant::now();
            let st = stage.exchange_and_apply(&batch.uniq, &grads, step as u64, ringrec::train::NanPolicy::Stop)?;
            let t4 = Instant::now();
            if timed {
                let mut add = |k: &str, s: f64| *phases.entry(k.to_string()).or_default() += s * 1e3;
                add("batch", (t1 - t0).as_secs_f64());
                add("lookup", (t2 - t1).as_secs_f64());
                add("grads", (t3 - t2).as_secs_f64());
                add("exchange", (t4 - t3).as_secs_f64());
                add("dedupe", st.dedupe_s);
                add("host", st.host_s);
                add("cross", st.cross_s);
                add("merge", st.merge_s);
                add("apply", st.apply_s);
                total += (t4 - t0).as_secs_f64();
                uniq += u as f64;
                host_uniq += st.keys_host as f64;
            }
        }
        let steps = args.steps.max(1) as f64;
        let inserted_per_step = max_over(topo, (stage.table().table().live_rows() - rows_before) as f64 / steps);
        for v in phases.values_mut() {
            *v = max_over(topo, *v / steps);
        }
        let step_s = max_over(topo, total / steps);
        let unique_per_rank = sum_over(&topo.world.comm, uniq / steps) / topo.size as f64;
        // Ranges partition a host's keys among its ranks: their sum is the host's keys.
        let unique_per_host = sum_over(&topo.world.comm, host_uniq / steps) / topo.num_hosts as f64;
        let per_host = b * topo.local_size;
        let (bytes_per_sample, lines_per_sample, roofline) = roofline(topo, args.dim, per_host, unique_per_rank, unique_per_host, inserted_per_step, bandwidth, line_rate);
        let host_rate = per_host as f64 / step_s;
        let row = StepRow {
            batch_per_rank: b,
            step_ms: step_s * 1e3,
            samples_per_sec_host: host_rate,
            samples_per_sec: global as f64 / step_s,
            phases_ms: phases,
            unique_per_rank,
            unique_per_host,
            inserted_per_step,
            bytes_per_sample,
            lines_per_sample,
            memcpy_bytes_per_sec: bandwidth,
            random_lines_per_sec: line_rate,
            roofline_samples_per_sec: roofline,
            of_roofline: host_rate / roofline,
        };
        if root && !args.json {
            print_row(&row);
        }
        rows.push(row);
    }
    let report = StepReport { ranks: topo.size, hosts: topo.num_hosts, ranks_per_host: topo.local_size, rows };
    if root && args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(report)
}
