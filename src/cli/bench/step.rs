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
//! With the GPU hot-row cache (`--gpu-cache-mib`, a list; 0 is today's path above), the
//! host work is the cache's (`embedding::cache::CacheDirectory`, the trainer's own):
//!
//! - `plan`: the batch's keys counted for the next refresh and each unique key mapped to its
//!   cache slot or a miss (one lookup per key);
//! - `lookup`: only the misses' rows from the host table, with the per-key sources;
//! - `update`: the cache's update list, as the trainer builds it (`train::gpu_cache`): the
//!   cached entries of the list the host's leader applied (`EmbeddingStage::applied`) with
//!   their slots and gradient rows, or in a world of one rank, where those rows are bit for
//!   bit its own key gradients (checked) and the list is the batch's own keys, nothing (the
//!   device reads the slots from the batch's sources it holds);
//! - `refresh` (every `--gpu-cache-refresh` steps, timed apart and added per step): the
//!   keys chosen anew, the entering rows and accumulators read from the host table.
//!
//! `--write-back` measures the trainer's `--gpu-cache-mode write-back` beside it (one rank):
//! the device updates its cached rows itself, so only the misses' gradients go through the
//! exchange, the leader's update takes every key but steps only the misses' rows (the
//! cached ones held: their usage recorded), and the rows leaving at a refresh are written
//! back into the table.
//!
//! First every row's keys of the data set are put into the table (zero gradients), as after
//! an epoch, so no combination pays for inserting them. Each combination warms up
//! (`--warmup`, and with a cache `--cache-warmup` steps, so the cache holds the keys of
//! earlier batches, as in a long run); the timed steps read the same rows for every cache
//! size. The bytes each way
//! per sample are those the trainer's staging moves: up, the rows staged (every unique key's,
//! or only the misses' plus a 4-byte source per unique key), the inverse map, dense
//! features and labels (the device builds the per-key lists), the update list and the
//! refreshed rows with their optimizer state; down, the key gradients (every unique key's;
//! write-back also the rows leaving).
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

use ringrec::data::Fields;
use ringrec::embedding::cache::{slot_bytes, slots_for_bytes, CacheCounters, CacheDirectory, StagingPlan, UpdateSelection, DEFAULT_REFRESH_STEPS};
use ringrec::data::shard;
use ringrec::topology::Topology;
use ringrec::train::batch::Batch;
use ringrec::train::embedding::{EmbeddingStage, Held};
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
    /// GPU hot-row cache sizes to measure, MiB (comma separated; 0: no cache, today's path).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub gpu_cache_mib: Vec<u64>,
    /// Steps between two refreshes of the cache's keys.
    #[arg(long, default_value_t = DEFAULT_REFRESH_STEPS)]
    pub gpu_cache_refresh: u64,
    /// Also measure each cache in write-back (one rank only), the trainer's
    /// `--gpu-cache-mode write-back` host path: only the misses' key gradients go through
    /// the exchange, the leader's update takes every key with the cached ones held (usage
    /// recorded, rows not stepped: `EmbeddingTable::apply_updates_held`), and the rows
    /// leaving at a refresh are written back into the table (`EmbeddingTable::write_back`;
    /// the table's own rows stand in for the device's).
    #[arg(long)]
    pub write_back: bool,
    /// Warm-up steps with a cache (at least `--warmup`): the cache holds keys of the batches
    /// before the timed ones, as in a long run.
    #[arg(long, default_value_t = 2 * DEFAULT_REFRESH_STEPS as usize)]
    pub cache_warmup: usize,
    /// Print one JSON document (one line) instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// One batch size's and cache size's figures (means over the timed steps; phases: the
/// slowest rank's).
#[derive(Serialize, Debug, Clone, Default)]
pub struct StepRow {
    /// Samples per rank per step.
    pub batch_per_rank: usize,
    /// The GPU cache's size, MiB (0: no cache).
    pub gpu_cache_mib: u64,
    /// Write-back (`--write-back`, the trainer's `--gpu-cache-mode write-back`): cached rows
    /// updated on the device only, the host's exchange over the misses, its update over every
    /// key with the cached rows held, leaving rows written back at a refresh. Otherwise
    /// write-through (the trainer's default).
    pub write_back: bool,
    /// Its slots (rows with their optimizer state).
    pub cache_slots: usize,
    /// Host time per sample of the slowest rank, microseconds (the step's mean / batch).
    pub host_us_per_sample: f64,
    /// host_us_per_sample / that of the run without a cache at this batch size (1 without one).
    pub of_cache_off: f64,
    /// Unique keys found in the cache / unique keys (the slowest rank's: its lowest).
    pub hit_rate: f64,
    /// Bytes uploaded per sample (the rank that uploads most).
    pub uploaded_per_sample: f64,
    /// Bytes downloaded per sample (the rank that downloads most).
    pub downloaded_per_sample: f64,
    /// Rows read into the cache by refreshes, per step.
    pub rows_refreshed_per_step: f64,
    /// Of the bytes uploaded per sample, the update list's (cached keys' slots and merged
    /// gradient rows; one rank: none, the device's sources are the slots).
    pub update_uploaded_per_sample: f64,
    /// Mean step time of the slowest rank, ms.
    pub step_ms: f64,
    /// Samples per second of one host.
    pub samples_per_sec_host: f64,
    /// Samples per second of the job.
    pub samples_per_sec: f64,
    /// Phase means (ms): batch, plan, lookup, grads, exchange (and inside it: dedupe, host,
    /// cross, merge, apply), update, refresh (per step).
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
    /// Keys in the host table once every row's keys are in it (the data set's distinct keys).
    pub table_keys: u64,
    /// One row per batch size and cache size.
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
fn roofline(topo: &Topology, (dim, fields): (usize, Fields), per_host: usize, unique_per_rank: f64, unique_per_host: f64, inserted_per_step: f64, bandwidth: f64, line_rate: f64) -> (f64, f64, f64) {
    let row_bytes = (4 * dim) as f64;
    // Streamed per sample: its cache row read and written into the batch, its keys read
    // by the dedupe, its inverse written and staged, labels and dense staged. Per rank
    // and unique key: its row staged, its gradient written, published (key + row) and
    // read by the merge; per host key: the merged row written and read by the update.
    let Fields { dense, sparse } = fields;
    let sample = 2.0 * (4 + 4 * dense + 8 * sparse) as f64 + 8.0 * sparse as f64 + 2.0 * 4.0 * sparse as f64 + 2.0 * (4 + 4 * dense) as f64;
    let host_bytes = per_host as f64 * sample + topo.local_size as f64 * unique_per_rank * (4.0 * row_bytes + 8.0) + unique_per_host * (2.0 * row_bytes + 16.0);
    let bytes_per_sample = host_bytes / per_host as f64;
    // Random lines: a unique key's index slot and row per rank (lookup), a host key's
    // slot and row (update), a new key's free slot.
    let lines = topo.local_size as f64 * unique_per_rank * 2.0 + unique_per_host * 2.0 + inserted_per_step;
    let lines_per_sample = lines / per_host as f64;
    let roofline = 1.0 / (bytes_per_sample / bandwidth).max(lines_per_sample / line_rate);
    (bytes_per_sample, lines_per_sample, roofline)
}

/// The header lines of the table.
fn print_header() {
    println!(
        "{:>8} {:>6} {:>9} {:>12} {:>8} {:>6} | {:>7} {:>6} {:>7} {:>7} {:>8} ({:>6} {:>6} {:>6} {:>6} {:>6}) {:>6} {:>7} | {:>6} {:>7} {:>7} {:>7} {:>8} | {:>8} {:>9} {:>8} | {:>6} {:>9} {:>11} {:>6}",
        "batch", "cache", "step ms", "samples/s/h", "us/smp", "of off", "batch", "plan", "lookup", "grads", "exchange", "dedupe", "host", "cross", "merge", "apply", "update", "refresh", "hit%", "up B/s", "upd B/s", "down B/s", "refr/st",
        "uniq/rk", "uniq/host", "new/step", "B/smp", "lines/smp", "roofline/s", "of it"
    );
}

/// One table line of a row.
fn print_row(row: &StepRow) {
    let p = |k: &str| row.phases_ms.get(k).copied().unwrap_or(0.0);
    println!(
        "{:>8} {:>6} {:>9.2} {:>12.0} {:>8.3} {:>6.2} | {:>7.2} {:>6.2} {:>7.2} {:>7.2} {:>8.2} ({:>6.2} {:>6.2} {:>6.2} {:>6.2} {:>6.2}) {:>6.2} {:>7.2} | {:>6.1} {:>7.0} {:>7.0} {:>7.0} {:>8.0} | {:>8.0} {:>9.0} {:>8.0} | {:>6.0} {:>9.2} {:>11.0} {:>5.0}%",
        row.batch_per_rank,
        format!("{}{}", row.gpu_cache_mib, if row.write_back { "wb" } else { "" }),
        row.step_ms,
        row.samples_per_sec_host,
        row.host_us_per_sample,
        row.of_cache_off,
        p("batch"),
        p("plan"),
        p("lookup"),
        p("grads"),
        p("exchange"),
        p("dedupe"),
        p("host"),
        p("cross"),
        p("merge"),
        p("apply"),
        p("update"),
        p("refresh"),
        100.0 * row.hit_rate,
        row.uploaded_per_sample,
        row.update_uploaded_per_sample,
        row.downloaded_per_sample,
        row.rows_refreshed_per_step,
        row.unique_per_rank,
        row.unique_per_host,
        row.inserted_per_step,
        row.bytes_per_sample,
        row.lines_per_sample,
        row.roofline_samples_per_sec,
        100.0 * row.of_roofline
    );
}

/// The host memory's two rates, measured once.
struct Rates {
    bandwidth: f64,
    line_rate: f64,
}

/// The step's buffers, reused across steps.
#[derive(Default)]
struct Buffers {
    batch: Batch,
    plan: StagingPlan,
    emb: Vec<f32>,
    inverse: Vec<u32>,
    dense: Vec<f32>,
    labels: Vec<f32>,
    grads: Vec<f32>,
    selection: UpdateSelection,
    update: Vec<f32>,
    entering: Vec<u64>,
    accs: Vec<f32>,
    /// Write-back: the misses' key gradients and each unique key's row among them.
    sent: Vec<f32>,
    held: Vec<u32>,
}

/// Bytes the staging of batch `b` moves that do not depend on the cache: the inverse map,
/// dense features and labels, and a multi-hot batch's bags (where each starts, their ids,
/// each key's bags), as `DenseModel::load` uploads them (the device builds the per-key
/// lists of the single-hot fields from the inverse map).
fn batch_bytes(b: &Batch) -> usize {
    let (samples, fields) = (b.len(), b.fields);
    let bags = if b.bags > 0 { b.bag_offsets.len() + 2 * b.bag_index.len() + b.uniq.len() + 1 } else { 0 };
    4 * (samples * fields.sparse + samples * fields.dense + samples + bags)
}

/// Every row's keys put into the table once (zero gradients: values unchanged), in batches
/// of `b` per rank, so the table holds the data set's keys, as after an epoch, and no
/// measured combination pays for inserting them.
fn prime(topo: &Topology, stage: &mut EmbeddingStage, ds: &ringrec::data::Dataset, n: usize, b: usize, buf: &mut Buffers) -> anyhow::Result<()> {
    let global = b * topo.size;
    for (step, start) in (0..n).step_by(global).enumerate() {
        let end = n.min(start + global);
        buf.batch.load(ds, shard::rank_slice(start..end, topo.rank, topo.size).map(|i| i as u32))?;
        buf.grads.clear();
        buf.grads.resize(buf.batch.uniq.len() * stage.exchanger().dim(), 0.0);
        stage.exchange_and_apply(&buf.batch.uniq, &buf.grads, step as u64, ringrec::train::NanPolicy::Stop)?;
    }
    Ok(())
}

/// What the refreshes of one combination cost: per refresh, the rows read and the seconds.
#[derive(Default)]
struct Refreshes(Vec<(u64, f64)>);

impl Refreshes {
    /// Rows and seconds of a refresh in steady state: the mean of the refreshes after the
    /// first (the first fills an empty cache), or the first if it is the only one.
    fn steady(&self) -> (f64, f64) {
        let later = if self.0.len() > 1 { &self.0[1..] } else { &self.0[..] };
        let n = later.len().max(1) as f64;
        (later.iter().fold(0.0, |a, r| a + r.0 as f64) / n, later.iter().fold(0.0, |a, r| a + r.1) / n)
    }
}

/// The cache's refresh after a step: keys chosen anew, (write-back, `back`) the rows
/// leaving written back into the host table, the entering rows and accumulators read from
/// it into staging. Returns the rows read and the rows that left.
fn refresh(stage: &mut EmbeddingStage, dir: &mut CacheDirectory, dim: usize, back: bool, buf: &mut Buffers) -> anyhow::Result<(u64, u64)> {
    let table = stage.table().table();
    let r = dir.refresh(|k| table.contains(k));
    if back {
        // The device's rows and accumulators of the keys leaving: the table's stand in.
        read_rows(stage, r.leaving.iter().map(|(k, _)| *k), dim, buf)?;
        stage.table_mut().table_mut()?.write_back(&buf.entering, &buf.emb, Some(&buf.accs))?;
    }
    read_rows(stage, r.entering.iter().map(|(k, _)| *k), dim, buf)?;
    Ok((buf.entering.len() as u64, r.left as u64))
}

/// The rows and accumulators of `keys` read from the host table into `buf` (`entering`,
/// `emb`, `accs`).
fn read_rows(stage: &EmbeddingStage, keys: impl Iterator<Item = u64>, dim: usize, buf: &mut Buffers) -> anyhow::Result<()> {
    buf.entering.clear();
    buf.entering.extend(keys);
    buf.emb.resize(buf.entering.len() * dim, 0.0);
    stage.lookup(&buf.entering, &mut buf.emb)?;
    let table = stage.table().table();
    buf.accs.clear();
    buf.accs.extend(buf.entering.iter().map(|k| table.accumulator(*k).unwrap_or(0.0)));
    Ok(())
}

/// Warm-up steps with a cache at `global` samples per step: `--cache-warmup`, but no more
/// than leave the timed steps rows the warm-up did not read (at least `--warmup`).
fn cache_warmup(args: &StepBenchArgs, n: usize, global: usize) -> usize {
    args.cache_warmup.min((n / global.max(1)).saturating_sub(args.steps)).max(args.warmup)
}

/// One combination's measurement: per-rank batch `b`, a cache of `mib` MiB (0: none),
/// write-through or (`back`, one rank) write-back.
#[allow(clippy::too_many_arguments)]
fn measure(topo: &Topology, args: &StepBenchArgs, stage: &mut EmbeddingStage, ds: &ringrec::data::Dataset, n: usize, b: usize, (mib, back): (u64, bool), rates: &Rates, buf: &mut Buffers) -> anyhow::Result<StepRow> {
    let dim = args.dim;
    let optimizer = stage.table().table().header().optimizer;
    let mut dir = CacheDirectory::new(slots_for_bytes(mib << 20, dim, optimizer));
    let cached = dir.capacity() > 0;
    let back = back && cached;
    let global = b * topo.size;
    // The timed steps are the same steps of the stream for every combination.
    let first = cache_warmup(args, n, global);
    let warmup = if cached { first } else { args.warmup };
    let every = args.gpu_cache_refresh.max(1) as usize;
    let mut t = Timed { fields: ds.fields(), ..Timed::default() };
    for (i, step) in (first - warmup..first + args.steps).enumerate() {
        if step == first {
            t.rows_before = stage.table().table().live_rows();
            t.counted_from = *dir.counters();
        }
        let start = (step * global) % n;
        let mine = shard::rank_slice(0..global, topo.rank, topo.size);
        topo.world.comm.barrier();
        let t0 = Instant::now();
        buf.batch.load(ds, mine.map(|i| ((start + i) % n) as u32))?;
        let t1 = Instant::now();
        let (u, samples) = (buf.batch.uniq.len(), buf.batch.labels.len());
        if cached {
            dir.plan(&buf.batch.uniq, &[&buf.batch.inverse, &buf.batch.bag_index], samples, &mut buf.plan);
        }
        let t2 = Instant::now();
        let staged = if cached { &buf.plan.misses } else { &buf.batch.uniq };
        buf.emb.resize(staged.len() * dim, 0.0);
        stage.lookup(staged, &mut buf.emb)?;
        buf.inverse.clone_from(&buf.batch.inverse);
        buf.dense.clone_from(&buf.batch.dense);
        buf.labels.clone_from(&buf.batch.labels);
        dir.counters_mut().uploaded(4 * staged.len() * dim + batch_bytes(&buf.batch) + if cached { 4 * u } else { 0 });
        let t3 = Instant::now();
        // Every unique key's gradient comes down (write-back too: the trainer checks them
        // all finite before it leaves the cached ones on the device).
        buf.grads.resize(u * dim, 0.0);
        if cached {
            buf.grads.iter_mut().enumerate().for_each(|(j, g)| *g = 1e-4 * (j % 7) as f32);
        } else {
            buf.grads.iter_mut().zip(&buf.emb).for_each(|(g, e)| *g = 1e-4 * e);
        }
        dir.counters_mut().downloaded(4 * u * dim);
        let t4 = Instant::now();
        let nan = ringrec::train::NanPolicy::Stop;
        let st = if back {
            // Write-back, the trainer's path: the misses through the exchange, every key
            // through the leader's update with the cached rows held.
            let finite = buf.grads.iter().all(|x| x.is_finite());
            anyhow::ensure!(finite, "bench step: a stand-in gradient is not finite");
            let misses = buf.plan.split_held(&buf.grads, dim, &mut buf.sent, &mut buf.held);
            stage.exchange_and_apply_held(misses, &buf.sent, Held::Misses { all: &buf.batch.uniq, rows: &buf.held }, step as u64, nan)?
        } else {
            stage.exchange_and_apply(&buf.batch.uniq, &buf.grads, step as u64, nan)?
        };
        let t5 = Instant::now();
        if cached && !back {
            let bytes = update_list(topo, stage, &mut dir, dim, buf)?;
            t.update_bytes += if step >= first { bytes as f64 } else { 0.0 };
        }
        let t6 = Instant::now();
        if cached && (i + 1) % every == 0 {
            let (rows, left) = refresh(stage, &mut dir, dim, back, buf)?;
            // Write-back: the rows leaving come down to be written into the table.
            t.refreshes.0.push((rows + if back { left } else { 0 }, t6.elapsed().as_secs_f64()));
        }
        if step >= first {
            let mut add = |k: &str, s: f64| *t.phases.entry(k.to_string()).or_default() += s * 1e3;
            for (k, s) in [("batch", t1 - t0), ("plan", t2 - t1), ("lookup", t3 - t2), ("grads", t4 - t3), ("exchange", t5 - t4), ("update", t6 - t5)] {
                add(k, s.as_secs_f64());
            }
            for (k, s) in [("dedupe", st.dedupe_s), ("host", st.host_s), ("cross", st.cross_s), ("merge", st.merge_s), ("apply", st.apply_s)] {
                add(k, s);
            }
            t.total += (t6 - t0).as_secs_f64();
            t.uniq += u as f64;
            t.host_uniq += st.keys_host as f64;
        }
    }
    Ok(summarize(topo, args, stage, &dir, b, (mib, back), rates, t))
}

/// The cache's update list after a step, as the trainer builds it (`train::gpu_cache`): the
/// cached entries of the list the leader applied with their slots and gradient rows, or in a
/// world of one rank, where every such row is bit for bit this rank's own key gradient and
/// the list is the batch's own, nothing (the device's sources are the slots). Counts and
/// returns the bytes it uploads.
fn update_list(topo: &Topology, stage: &mut EmbeddingStage, dir: &mut CacheDirectory, dim: usize, buf: &mut Buffers) -> anyhow::Result<usize> {
    let mut own = false;
    let mut n = 0;
    if let Some(g) = stage.applied()? {
        let mine = (topo.size == 1).then_some((&buf.batch.uniq[..], &buf.grads[..]));
        own = dir.select_update(&buf.plan, g.keys, g.grads, dim, mine, &mut buf.selection);
        n = buf.selection.at.len();
        buf.update.clear();
        if !own {
            buf.update.extend(buf.selection.at.iter().flat_map(|&j| g.grads[j as usize * dim..(j as usize + 1) * dim].iter().copied()));
        }
    }
    // The batch's own list: the device updates from the sources it holds; other own lists:
    // slots and indices; else slots and rows.
    let bytes = match (own, buf.selection.from_plan) {
        (true, true) => 0,
        (true, false) => 8 * n,
        (false, _) => 4 * n * (dim + 1),
    };
    dir.counters_mut().uploaded(bytes);
    Ok(bytes)
}

/// What the timed steps of one combination summed.
#[derive(Default)]
struct Timed {
    fields: Fields,
    phases: std::collections::BTreeMap<String, f64>,
    total: f64,
    uniq: f64,
    host_uniq: f64,
    update_bytes: f64,
    rows_before: u64,
    counted_from: CacheCounters,
    refreshes: Refreshes,
}

/// One combination's row from its sums: means over the timed steps, the slowest rank's.
#[allow(clippy::too_many_arguments)]
fn summarize(topo: &Topology, args: &StepBenchArgs, stage: &EmbeddingStage, dir: &CacheDirectory, b: usize, (mib, back): (u64, bool), rates: &Rates, mut t: Timed) -> StepRow {
    let (dim, global, every) = (args.dim, b * topo.size, args.gpu_cache_refresh.max(1) as usize);
    let optimizer = stage.table().table().header().optimizer;
    let steps = args.steps.max(1) as f64;
    // A refresh (timed apart) costs its steady-state time and rows once every `every` steps.
    let (refresh_rows, refresh_s) = t.refreshes.steady();
    let (refresh_s, refresh_rows) = (refresh_s / every as f64, refresh_rows / every as f64);
    let inserted_per_step = max_over(topo, (stage.table().table().live_rows() - t.rows_before) as f64 / steps);
    for v in t.phases.values_mut() {
        *v = max_over(topo, *v / steps);
    }
    t.phases.insert("refresh".into(), max_over(topo, refresh_s * 1e3));
    let step_s = max_over(topo, t.total / steps + refresh_s);
    let unique_per_rank = sum_over(&topo.world.comm, t.uniq / steps) / topo.size as f64;
    // Ranges partition a host's keys among its ranks: their sum is the host's keys.
    let unique_per_host = sum_over(&topo.world.comm, t.host_uniq / steps) / topo.num_hosts as f64;
    let per_host = b * topo.local_size;
    let (bytes_per_sample, lines_per_sample, roofline) = roofline(topo, (dim, t.fields), per_host, unique_per_rank, unique_per_host, inserted_per_step, rates.bandwidth, rates.line_rate);
    let host_rate = per_host as f64 / step_s;
    // The timed steps' own transfers (a refresh among them excluded: it counts per step).
    let c = dir.counters().since(&t.counted_from);
    let timed_refresh_bytes = c.rows_refreshed * (slot_bytes(dim, optimizer) + 4);
    let per_sample = |bytes: f64| bytes / (steps * b as f64);
    let refresh_up = refresh_rows * (slot_bytes(dim, optimizer) + 4) as f64 / b as f64;
    StepRow {
        batch_per_rank: b,
        gpu_cache_mib: mib,
        write_back: back,
        cache_slots: dir.capacity(),
        host_us_per_sample: step_s * 1e6 / b as f64,
        of_cache_off: 1.0,
        hit_rate: -max_over(topo, -c.hit_rate()),
        uploaded_per_sample: max_over(topo, per_sample((c.bytes_uploaded - timed_refresh_bytes.min(c.bytes_uploaded)) as f64) + refresh_up),
        downloaded_per_sample: max_over(topo, per_sample(c.bytes_downloaded as f64)),
        rows_refreshed_per_step: max_over(topo, refresh_rows),
        update_uploaded_per_sample: max_over(topo, per_sample(t.update_bytes)),
        step_ms: step_s * 1e3,
        samples_per_sec_host: host_rate,
        samples_per_sec: global as f64 / step_s,
        phases_ms: t.phases,
        unique_per_rank,
        unique_per_host,
        inserted_per_step,
        bytes_per_sample,
        lines_per_sample,
        memcpy_bytes_per_sec: rates.bandwidth,
        random_lines_per_sec: rates.line_rate,
        roofline_samples_per_sec: roofline,
        of_roofline: host_rate / roofline,
    }
}

/// Runs the benchmark; prints on rank 0.
pub fn run(topo: &Topology, args: &StepBenchArgs) -> anyhow::Result<StepReport> {
    let mut cfg = TrainConfig::new(crate::cli::or_env(args.data_dir.clone(), "RINGREC_DATA_DIR")?.unwrap_or_else(crate::cli::train::default_data_dir));
    (cfg.data, cfg.synth_rows, cfg.dim, cfg.table_capacity, cfg.test_fraction) = (args.data.iter().cloned().collect(), args.synth_rows, args.dim, args.table_capacity, Some(0.0));
    let threads = cfg.threads_per_rank(topo);
    let _ = rayon::ThreadPoolBuilder::new().num_threads(threads).build_global();
    let data = data::open(topo, &cfg)?;
    let (ds, n) = data.first()?;
    let mut stage = EmbeddingStage::open(topo, &cfg, None, ringrec::train::embedding::host_step_keys(topo, &cfg, ds))?;
    if args.write_back && topo.size > 1 {
        anyhow::bail!("bench step --write-back measures one rank only (the other ranks' keys would still need the exchange): run it without mpirun, or leave out --write-back");
    }
    let rates = Rates { bandwidth: memcpy_bandwidth(topo), line_rate: random_line_rate(topo) };
    let root = topo.rank == 0;
    if root && !args.json {
        println!("# ringrec bench step: {} ranks on {} host(s), {} threads per rank, dim {}, {} rows of {}", topo.size, topo.num_hosts, threads, args.dim, n, ds.path().display());
        println!("# host: memcpy {:.1} GB/s (read + write), random 64-byte reads {:.0} M/s (all local ranks at once); time = mean of the slowest rank over {} steps", rates.bandwidth / 1e9, rates.line_rate / 1e6, args.steps);
    }
    let mut buf = Buffers::default();
    let mut rows = Vec::new();
    prime(topo, &mut stage, ds, n, args.batch.iter().copied().max().unwrap_or(1).max(1), &mut buf)?;
    let table_keys = stage.table().table().live_rows();
    if root && !args.json {
        println!("# table: {table_keys} keys, every key of the data put in before the timed steps; GPU cache (MiB, 0 = none): up to {} steps of warm-up with one, a refresh every {} steps (its time and rows counted per step); bytes per sample: up/down between host and device", args.cache_warmup, args.gpu_cache_refresh);
        print_header();
    }
    for &b in &args.batch {
        let mut off = None;
        let modes = args.gpu_cache_mib.iter().flat_map(|&m| std::iter::once((m, false)).chain((args.write_back && m > 0).then_some((m, true))));
        for mode in modes.collect::<Vec<_>>() {
            let mut row = measure(topo, args, &mut stage, ds, n, b, mode, &rates, &mut buf)?;
            if row.cache_slots == 0 {
                off = off.or(Some(row.host_us_per_sample));
            }
            row.of_cache_off = off.map_or(f64::NAN, |o| row.host_us_per_sample / o);
            if root && !args.json {
                print_row(&row);
            }
            rows.push(row);
        }
    }
    let report = StepReport { ranks: topo.size, hosts: topo.num_hosts, ranks_per_host: topo.local_size, table_keys, rows };
    if root && args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(report)
}
