//! `ringrec train`: synchronous data-parallel training of the CTR model (design 003).
//!
//! One step on every rank:
//! 1. this rank's slice of the global batch (same global batches at any rank count);
//! 2. unique keys of the batch -> rows from the host-shared table (read-only mapping);
//! 3. MLP forward/backward; each layer's gradient (already scaled by 1/global batch, so
//!    the sum over ranks is the average) goes to the [`crate::engine`] as soon as backward
//!    produced it (`dense.layer<l>`, last layer first), so its allreduce runs on the
//!    engine's thread while the layers below are back-propagated; the input gradient is
//!    scattered into one gradient row per unique key;
//! 4. meanwhile, on this thread, the sparse exchange (host pre-aggregation, leaders
//!    allgather, frequency normalisation) with the leader's table update and the host
//!    barrier;
//! 5. wait for the dense allreduces; dense optimizer on every rank (identical inputs,
//!    identical replicas).
//!
//! The data set defaults to a synthetic Criteo-format file that ringrec generates once
//! (`ringrec data synth`), cached as a memory-mappable binary (`ringrec data prepare`).

pub mod checkpoint;
pub mod dense;
pub mod metrics;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use mpi::collective::{CommunicatorCollectives, SystemOperation};
use serde::Serialize;

use crate::comm::{self, Backend, Collectives, CollectivesExt};
use crate::cuda::DeviceChoice;
use crate::data::cache::Dataset;
use crate::data::criteo::{NUM_DENSE, NUM_SPARSE};
use crate::data::shard;
use crate::embedding::{HostTable, OptimizerKind, TableConfig, TableSource};
use crate::engine::EngineConfig;
use crate::model::mlp::sigmoid;
use crate::model::{DenseOptimState, DenseOptimizer, Mlp, MlpShape};
use crate::sparse::{SparseExchange, SparseExchanger, SparseNormalize};
use crate::topology::Topology;

use checkpoint::DenseCheckpoint;
use dense::{DenseModel, Placement};

/// Sparse (embedding) optimizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
pub enum SparseOptimizer {
    /// `row -= lr * g`.
    Sgd,
    /// Row-wise Adagrad.
    Adagrad,
}

/// Which collective backend carries the dense gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// shm on one host, hier on several.
    Auto,
    /// MPI's allreduce.
    Mpi,
    /// Ring over MPI point-to-point.
    Ring,
    /// Shared memory (one host).
    Shm,
    /// shm inside hosts, ring across.
    Hier,
}

/// Flags of `ringrec train`.
#[derive(clap::Args, Debug, Clone)]
pub struct TrainArgs {
    /// Criteo-format TSV or a prepared `.rrdata` cache. Default: a synthetic set that
    /// ringrec generates once under --data-dir.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Where the default data set and TSV caches live.
    #[arg(long, env = "RINGREC_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Rows of the default synthetic data set.
    #[arg(long, default_value_t = 200_000)]
    pub synth_rows: u64,
    /// Passes over the training split.
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Stop after this many global steps (counted from the start of the run, resumed steps included).
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// Global batch (split over the ranks).
    #[arg(long, default_value_t = 1024)]
    pub batch: usize,
    /// Embedding dimension.
    #[arg(long, default_value_t = 16)]
    pub dim: usize,
    /// Hidden layer widths of the MLP.
    #[arg(long, default_value = "256,128", value_delimiter = ',')]
    pub hidden: Vec<usize>,
    /// Dense learning rate.
    #[arg(long, default_value_t = 0.001)]
    pub lr: f32,
    /// Dense optimizer.
    #[arg(long, value_enum, default_value = "adam")]
    pub dense_optimizer: DenseOptimizer,
    /// Embedding learning rate.
    #[arg(long, default_value_t = 0.05)]
    pub sparse_lr: f32,
    /// Embedding optimizer (applied by each host leader).
    #[arg(long, value_enum, default_value = "sgd")]
    pub sparse_optimizer: SparseOptimizer,
    /// Held-out fraction (the last rows of the data set).
    #[arg(long, default_value_t = 0.1)]
    pub test_fraction: f64,
    /// Seed of the model's initial parameters and embedding rows.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Shuffle the training rows every epoch (deterministically from --seed).
    #[arg(long)]
    pub shuffle: bool,
    /// Collective backend of the dense gradients on the CPU path (the GPU path uses NCCL).
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,
    /// Where the dense model runs: cuda (one GPU per rank, NCCL between them), cpu, or auto
    /// (cuda when this ringrec has the `cuda` feature and a driver and a GPU are present).
    #[arg(long, value_enum, default_value = "auto")]
    pub device: DeviceChoice,
    /// Sparse exchange: hierarchical (per-host pre-aggregation) or flat (every rank allgathers).
    #[arg(long, value_enum, default_value = "hier")]
    pub sparse_exchange: SparseExchange,
    /// What a key's summed gradient is divided by: frequency (ranks holding it), world, none.
    #[arg(long, value_enum, default_value = "frequency")]
    pub sparse_normalize: SparseNormalize,
    /// Threads per rank (default: cores / ranks on this host).
    #[arg(long, env = "RINGREC_THREADS")]
    pub threads: Option<usize>,
    /// Slots of the host-shared embedding table (80% can hold rows).
    #[arg(long, default_value_t = 1 << 21)]
    pub table_capacity: u64,
    /// Malformed input lines tolerated before stopping (they are counted and reported).
    #[arg(long, default_value_t = crate::data::criteo::DEFAULT_MAX_BAD_LINES)]
    pub max_bad_lines: u64,
    /// Write checkpoints here (every --checkpoint-every steps and at the end).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Steps between checkpoints (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub checkpoint_every: u64,
    /// Continue from the checkpoint in --checkpoint-dir.
    #[arg(long)]
    pub resume: bool,
    /// Print a final JSON summary (rank 0).
    #[arg(long)]
    pub json: bool,
    /// Include every step's loss in the JSON summary.
    #[arg(long)]
    pub record_losses: bool,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Skip the evaluation on the held-out split.
    #[arg(long)]
    pub no_eval: bool,
}

/// What a run reports (rank 0 prints it).
#[derive(Serialize, Debug, Clone, Default)]
pub struct TrainSummary {
    /// World size.
    pub ranks: usize,
    /// Hosts.
    pub hosts: usize,
    /// Threads per rank.
    pub threads_per_rank: usize,
    /// Dense backend (CPU path: the engine's collectives; a device path uses NCCL or, for
    /// the host device, its own backend of this kind).
    pub backend: String,
    /// Where the dense model ran: `cpu`, or the GPU's name and ordinal.
    pub device: String,
    /// Sparse exchange and normalisation.
    pub sparse_exchange: String,
    /// Sparse normalisation.
    pub sparse_normalize: String,
    /// Training rows, held-out rows.
    pub train_rows: usize,
    /// Held-out rows.
    pub test_rows: usize,
    /// Global steps taken in this run.
    pub steps: u64,
    /// Global step reached (resumed runs count earlier steps).
    pub global_step: u64,
    /// Samples trained on in this run.
    pub samples: u64,
    /// Wall time of the training loop (seconds).
    pub train_seconds: f64,
    /// Training samples per second (all ranks).
    pub samples_per_sec: f64,
    /// Mean training loss over the last epoch's steps of this run.
    pub train_loss: f64,
    /// Held-out log loss.
    pub test_logloss: Option<f64>,
    /// Held-out AUC over all ranks' predictions.
    pub test_auc: Option<f64>,
    /// Largest peak resident set over the ranks (MiB).
    pub peak_rss_mib: f64,
    /// MLP forward+backward GFLOP/s on rank 0 (CPU path; 0 on a device, whose step only
    /// queues work).
    pub mlp_gflops: f64,
    /// Rows in the host table at the end.
    pub table_rows: u64,
    /// Sparse-exchange bytes rank 0 sent + received inside its host per step (mean).
    pub sparse_bytes_intra_host_per_step: f64,
    /// Sparse-exchange bytes rank 0 sent + received across hosts per step (mean).
    pub sparse_bytes_cross_host_per_step: f64,
    /// FNV-1a of the final dense parameters (same on every rank).
    pub params_fnv: String,
    /// Seconds rank 0 spent per phase: batch (data + lookup + input), mlp (forward,
    /// backward and submitting the layers' gradients), scatter (key gradients), sparse
    /// (exchange + apply + host barrier, overlapping the dense allreduce), allreduce (the
    /// wait for the dense allreduce that remains after the sparse exchange), optimizer.
    pub phase_seconds: std::collections::BTreeMap<String, f64>,
    /// Every step's global mean loss (with --record-losses).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub losses: Vec<f64>,
}

/// FNV-1a 64 of bytes, as hex.
pub fn fnv_hex(bytes: &[u8]) -> String {
    format!("{:016x}", bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)))
}

/// A fast hasher for u64 keys that are already well mixed (field-salted hashes).
#[derive(Default)]
struct KeyHasher(u64);
impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ *b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, k: u64) {
        self.0 = (k ^ (k >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

fn default_data_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(h).join("ringrec");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".cache").join("ringrec");
    }
    // SAFETY: getuid has no preconditions.
    std::env::temp_dir().join(format!("ringrec-{}", unsafe { libc::getuid() }))
}

/// Generates (once per machine, under a lock) or finds the data set and opens it.
fn open_data(topo: &Topology, args: &TrainArgs) -> anyhow::Result<(Dataset, PathBuf)> {
    let dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
    let attempt = (|| -> anyhow::Result<(Dataset, PathBuf)> {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating the data directory {}", dir.display()))?;
        let source = match &args.data {
            Some(p) => p.clone(),
            None => {
                let p = dir.join(format!("synth-{}-s1.tsv", args.synth_rows));
                let _lock = crate::data::cache::FileLock::exclusive(&dir.join("synth.lock"))?;
                if !p.exists() {
                    let tmp = dir.join(format!(".synth-{}.tmp-{}", args.synth_rows, std::process::id()));
                    crate::data::synth::synth(&tmp, args.synth_rows, 1)?;
                    std::fs::rename(&tmp, &p).with_context(|| format!("renaming {} to {}", tmp.display(), p.display()))?;
                }
                p
            }
        };
        let is_cache = source.extension().and_then(|e| e.to_str()) == Some(crate::data::cache::CACHE_EXT);
        let ds = if is_cache { Dataset::open(&source)? } else { Dataset::from_tsv_cached(&source, &dir.join("cache"), args.max_bad_lines)? };
        Ok((ds, source))
    })();
    // Leaders prepare first (one parse per host, under the file lock), then the others open
    // the cache; every rank learns whether all succeeded.
    Ok(topo.agree(attempt.map_err(|e| format!("{e:#}")))?)
}

fn backend_of(topo: &Topology, b: BackendChoice) -> Backend {
    match b {
        BackendChoice::Auto => Backend::auto(topo),
        BackendChoice::Mpi => Backend::Mpi,
        BackendChoice::Ring => Backend::Ring,
        BackendChoice::Shm => Backend::Shm,
        BackendChoice::Hier => Backend::Hier,
    }
}

fn fingerprint(args: &TrainArgs, source: &Path, rows: usize) -> String {
    format!(
        "data={} rows={} batch={} dim={} hidden={:?} lr={} dense={:?} sparse_lr={} sparse={:?} seed={} shuffle={} test={} normalize={} cap={}",
        source.display(),
        rows,
        args.batch,
        args.dim,
        args.hidden,
        args.lr,
        args.dense_optimizer,
        args.sparse_lr,
        args.sparse_optimizer,
        args.seed,
        args.shuffle,
        args.test_fraction,
        args.sparse_normalize.name(),
        args.table_capacity
    )
}

/// One batch on the host: its rows, labels, dense features and keys, with the keys
/// deduplicated (`uniq`, first-seen order) and `inverse[s * 26 + f]` naming sample s's
/// field f among them. Reused from step to step.
#[derive(Default)]
pub struct BatchKeys {
    rows: Vec<u32>,
    /// Labels (0/1), one per sample.
    pub labels: Vec<f32>,
    /// Dense features, 13 per sample.
    pub dense: Vec<f32>,
    keys: Vec<u64>,
    /// The batch's distinct keys.
    pub uniq: Vec<u64>,
    /// Per (sample, field): the position of its key in `uniq`.
    pub inverse: Vec<u32>,
    index: HashMap<u64, u32, BuildHasherDefault<KeyHasher>>,
}

impl BatchKeys {
    /// Samples in the batch.
    pub fn len(&self) -> usize {
        self.labels.len()
    }
    /// True for an empty batch.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Reads rows `self.rows` of `ds` and deduplicates their keys.
    fn load(&mut self, ds: &Dataset) -> anyhow::Result<usize> {
        ds.fill_batch(&self.rows, &mut self.labels, &mut self.dense, &mut self.keys)?;
        self.uniq.clear();
        self.index.clear();
        self.inverse.clear();
        for k in &self.keys {
            let next = self.uniq.len() as u32;
            let i = *self.index.entry(*k).or_insert(next);
            if i == next {
                self.uniq.push(*k);
            }
            self.inverse.push(i);
        }
        Ok(self.rows.len())
    }
}

/// Runs training; prints progress and the summary on rank 0; returns the summary.
pub fn run(topo: &Topology, args: &TrainArgs) -> anyhow::Result<TrainSummary> {
    if args.batch == 0 || args.dim == 0 || args.hidden.contains(&0) {
        bail!("--batch, --dim and every --hidden width must be positive");
    }
    if !(0.0..1.0).contains(&args.test_fraction) {
        bail!("--test-fraction must be in [0, 1), got {}", args.test_fraction);
    }
    if args.resume && args.checkpoint_dir.is_none() {
        bail!("--resume needs --checkpoint-dir (the directory of the run to continue)");
    }
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = args.threads.unwrap_or((cores / topo.local_size).max(1)).max(1);
    let _ = rayon::ThreadPoolBuilder::new().num_threads(threads).build_global();
    let root = topo.rank == 0;

    let (ds, source) = open_data(topo, args)?;
    let (train_range, test_range) = shard::split(ds.len(), args.test_fraction)?;
    if train_range.is_empty() {
        bail!("{}: no training rows (the data set has {} rows, --test-fraction {})", source.display(), ds.len(), args.test_fraction);
    }
    if root && ds.header().bad_lines > 0 {
        eprintln!(
            "ringrec: {}: {} malformed line(s) were skipped when the cache was prepared (run `ringrec data prepare {} OUT` to list them; --max-bad-lines {} stops beyond that)",
            source.display(),
            ds.header().bad_lines,
            source.display(),
            args.max_bad_lines
        );
    }

    let dim = args.dim;
    let shape = MlpShape { input: NUM_SPARSE * dim + NUM_DENSE, hidden: args.hidden.clone() };
    let mut mlp = Mlp::new(shape.clone(), args.seed, threads);
    let nparams = mlp.num_params();
    // `coll` carries the start-up broadcasts and evaluation's gather; the engine the dense
    // gradients of every step.
    let backend = backend_of(topo, args.backend);
    let mut coll = comm::build(backend, topo)?;
    let engine_config = EngineConfig { backend: Some(backend), tag: "train".into(), ..EngineConfig::from_env()? };
    let fp = fingerprint(args, &source, ds.len());

    // Resume: rank 0 reads the checkpoint and every rank gets its contents.
    let mut opt = DenseOptimState::new(args.dense_optimizer, args.lr, nparams);
    let mut start = (0u64, 0u64, 0u64); // global step, epoch, step in epoch
    let mut resume_table: Option<PathBuf> = None;
    if args.resume {
        let dir = args.checkpoint_dir.clone().unwrap_or_default();
        let loaded = if root {
            DenseCheckpoint::load(&dir).and_then(|ck| {
                if ck.fingerprint != fp {
                    Err(format!("{}: the checkpoint was written by a run configured as\n  {}\nnot as this one:\n  {}\nresume with the same flags", dir.display(), ck.fingerprint, fp))
                } else if ck.params.len() != nparams {
                    Err(format!("{}: {} dense parameters, the model has {nparams}", dir.display(), ck.params.len()))
                } else {
                    Ok(ck)
                }
            })
        } else {
            Ok(DenseCheckpoint::new(0, 0, 0, String::new(), &[], &opt))
        };
        let ck = topo.agree(loaded)?;
        let mut head = [ck.step as i64, ck.epoch as i64, ck.step_in_epoch as i64, ck.optim_step as i64];
        coll.broadcast(&mut head, 0)?;
        start = (head[0] as u64, head[1] as u64, head[2] as u64);
        if root {
            mlp.params_mut().copy_from_slice(&ck.params);
            opt = ck.optim_state();
        }
        opt.step = head[3] as u64;
        coll.broadcast(mlp.params_mut(), 0)?;
        if opt.kind == DenseOptimizer::Adam {
            coll.broadcast(&mut opt.m, 0)?;
            coll.broadcast(&mut opt.v, 0)?;
        }
        resume_table = Some(checkpoint::table_path(&dir, start.0));
    } else {
        // Identical start on every rank: rank 0's initial parameters.
        coll.broadcast(mlp.params_mut(), 0)?;
    }

    let mut cfg = TableConfig::new(dim as u32, args.table_capacity);
    cfg.seed = args.seed;
    cfg.optimizer = match args.sparse_optimizer {
        SparseOptimizer::Sgd => OptimizerKind::Sgd,
        SparseOptimizer::Adagrad => OptimizerKind::Adagrad,
    };
    let mut table = match &resume_table {
        Some(p) => HostTable::open_from(topo, TableSource::Saved(p)),
        None => HostTable::open_from(topo, TableSource::New(&cfg)),
    }
    .with_context(|| "opening the host-shared embedding table")?;
    let mut exch = SparseExchanger::new(topo, args.sparse_exchange, args.sparse_normalize, dim)?;

    // The dense model on this rank's device (every rank agrees before NCCL starts).
    let placement = topo.agree(dense::place(args.device, topo).map_err(|e| format!("rank {}: {e:#}", topo.rank)))?;
    let mut model = dense::build(placement, topo, mlp, opt, &engine_config, dim)?;
    if root && placement != Placement::Cpu {
        eprintln!("ringrec: dense model on {}", model.describe());
    }

    let n_train = train_range.len();
    let steps_per_epoch = shard::steps_per_epoch(n_train, args.batch) as u64;
    let total_steps = (args.epochs * steps_per_epoch).min(args.max_steps.unwrap_or(u64::MAX));
    let bar = (root && !args.no_progress).then(|| {
        let pb = indicatif::ProgressBar::new(total_steps);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{spinner} step {pos}/{len} [{bar:30}] {msg} ETA {eta}").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb.set_position(start.0);
        pb
    });

    let mut buf = BatchKeys::default();
    let mut losses = Vec::new();
    let mut epoch_loss = (0f64, 0u64, start.1);
    let mut mlp_time = 0f64;
    let mut local_samples = 0u64;
    let (mut intra, mut cross) = (0f64, 0f64);
    let (mut step, mut epoch, mut in_epoch) = start;
    let mut order: Option<(u64, Vec<u32>)> = None;
    // The step whose loss is still to be read (global length, epoch): read after the next
    // batch is staged, so on a device the staging overlaps the step's tail.
    let mut unread: Option<(usize, u64)> = None;
    topo.world.comm.barrier();
    let t0 = Instant::now();
    let mut record = |loss_sum: f64, (global_len, ep): (usize, u64), step_now: u64, steps_run: u64| {
        let loss = loss_sum / global_len as f64;
        if epoch_loss.2 != ep {
            epoch_loss = (0.0, 0, ep);
        }
        epoch_loss.0 += loss;
        epoch_loss.1 += 1;
        if args.record_losses {
            losses.push(loss);
        }
        if let Some(pb) = &bar {
            let rate = steps_run as f64 * args.batch as f64 / t0.elapsed().as_secs_f64().max(1e-9);
            pb.set_message(format!("epoch {ep} loss {loss:.4} {rate:.0} samples/s"));
            pb.set_position(step_now);
        }
    };
    let mut steps_run = 0u64;
    let mut phases = std::collections::BTreeMap::new();
    let fault = fault_injection()?;
    while step < total_steps {
        if fault == Some((topo.rank, step)) {
            eprintln!("ringrec: fault injection: rank {} exits at step {step}", topo.rank);
            std::process::exit(3);
        }
        if in_epoch >= steps_per_epoch {
            epoch += 1;
            in_epoch = 0;
        }
        if order.as_ref().map(|o| o.0) != Some(epoch) {
            order = Some((epoch, shard::epoch_order(n_train, epoch, args.shuffle.then_some(args.seed))?));
        }
        let ord = &order.as_ref().map(|o| &o.1).ok_or_else(|| anyhow!("epoch order missing"))?;
        let global = shard::global_batch_range(in_epoch as usize, args.batch, n_train);
        let global_len = global.len();
        let mine = shard::rank_slice(global, topo.rank, topo.size);
        buf.rows.clear();
        buf.rows.extend(ord[mine].iter().map(|p| train_range.start as u32 + p));

        let tb = Instant::now();
        let b = buf.load(&ds)?;
        model.stage(&buf, &table)?;
        if let Some(u) = unread.take() {
            record(model.loss_sum()?, u, step, steps_run);
        }
        let tm = Instant::now();
        model.step(&buf, 1.0 / global_len as f32)?;
        let ts = Instant::now();
        mlp_time += (ts - tm).as_secs_f64();
        local_samples += b as u64;
        let key_grads = model.key_grads(&buf)?;
        let ta = Instant::now();
        let (_, st) = exch.exchange_and_apply(topo, &mut table, &buf.uniq, key_grads, args.sparse_lr)?;
        let tw = Instant::now();
        model.wait_reduced()?;
        let to = Instant::now();
        model.apply()?;
        let te = Instant::now();
        for (name, d) in [("batch", tm - tb), ("mlp", ts - tm), ("scatter", ta - ts), ("sparse", tw - ta), ("allreduce", to - tw), ("optimizer", te - to)] {
            *phases.entry(name.to_string()).or_insert(0.0) += d.as_secs_f64();
        }
        intra += (st.host_bytes_sent + st.host_bytes_received) as f64;
        cross += (st.cross_bytes_sent + st.cross_bytes_received) as f64;

        step += 1;
        in_epoch += 1;
        steps_run += 1;
        unread = Some((global_len, epoch));
        if let Some(dir) = &args.checkpoint_dir {
            if (args.checkpoint_every > 0 && step % args.checkpoint_every == 0) || step == total_steps {
                save_checkpoint(topo, dir, &table, || Ok(DenseCheckpoint::new(step, epoch, in_epoch, fp.clone(), &model.params()?, &model.optim_state()?)))?;
            }
        }
    }
    if let Some(u) = unread.take() {
        record(model.loss_sum()?, u, step, steps_run);
    }
    topo.world.comm.barrier();
    let train_seconds = t0.elapsed().as_secs_f64();
    if std::env::var_os("RINGREC_LOG_SPARSE").is_some() {
        eprintln!("rank {} sparse exchange over {} steps: {}", topo.rank, exch.steps(), exch.totals());
    }
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    let samples = {
        let mut total = 0u64;
        topo.world.comm.all_reduce_into(&local_samples, &mut total, SystemOperation::sum());
        total
    };

    let (test_logloss, test_auc) = if args.no_eval || test_range.is_empty() {
        (None, None)
    } else {
        let (l, a) = evaluate(topo, coll.as_mut(), &ds, &table, model.as_mut(), test_range.clone(), args.batch)?;
        (l, a)
    };
    let peak = {
        let mine = metrics::peak_rss_mib();
        let mut m = 0f64;
        topo.world.comm.all_reduce_into(&mine, &mut m, SystemOperation::max());
        m
    };
    let summary = TrainSummary {
        ranks: topo.size,
        hosts: topo.num_hosts,
        threads_per_rank: threads,
        backend: coll.name().to_string(),
        device: model.describe(),
        sparse_exchange: args.sparse_exchange.name().to_string(),
        sparse_normalize: args.sparse_normalize.name().to_string(),
        train_rows: n_train,
        test_rows: test_range.len(),
        steps: steps_run,
        global_step: step,
        samples,
        train_seconds,
        samples_per_sec: samples as f64 / train_seconds.max(1e-9),
        train_loss: if epoch_loss.1 > 0 { epoch_loss.0 / epoch_loss.1 as f64 } else { 0.0 },
        test_logloss,
        test_auc,
        peak_rss_mib: peak,
        mlp_gflops: if mlp_time > 0.0 && placement == Placement::Cpu { shape.flops_per_sample() * local_samples as f64 / mlp_time / 1e9 } else { 0.0 },
        table_rows: table.table().live_rows(),
        sparse_bytes_intra_host_per_step: intra / steps_run.max(1) as f64,
        sparse_bytes_cross_host_per_step: cross / steps_run.max(1) as f64,
        params_fnv: fnv_hex(bytemuck::cast_slice(&model.params()?)),
        phase_seconds: phases,
        losses,
    };
    if root {
        if args.json {
            println!("{}", serde_json::to_string(&summary)?);
        } else {
            println!(
                "ringrec train: {} ranks on {} host(s), {} steps, {} samples in {:.1}s = {:.0} samples/s; train loss {:.4}; test logloss {} AUC {}; peak RSS {:.0} MiB",
                summary.ranks,
                summary.hosts,
                summary.steps,
                summary.samples,
                summary.train_seconds,
                summary.samples_per_sec,
                summary.train_loss,
                summary.test_logloss.map_or("-".into(), |v| format!("{v:.4}")),
                summary.test_auc.map_or("-".into(), |v| format!("{v:.4}")),
                summary.peak_rss_mib
            );
        }
    }
    Ok(summary)
}

/// `RINGREC_FAULT_EXIT=rank:step` makes that rank exit abruptly before that step (tests
/// of failure handling: the other ranks must stop with a message, not hang).
fn fault_injection() -> anyhow::Result<Option<(usize, u64)>> {
    match std::env::var("RINGREC_FAULT_EXIT") {
        Ok(s) if !s.is_empty() => {
            let (r, st) = s.split_once(':').ok_or_else(|| anyhow!("RINGREC_FAULT_EXIT={s:?}: expected RANK:STEP"))?;
            Ok(Some((r.trim().parse()?, st.trim().parse()?)))
        }
        _ => Ok(None),
    }
}

/// Rank 0 writes the table and the dense checkpoint that `dense` makes (called on rank 0
/// only: on a GPU it copies the parameters to the host); every rank learns the outcome.
fn save_checkpoint(topo: &Topology, dir: &Path, table: &HostTable, dense: impl FnOnce() -> anyhow::Result<DenseCheckpoint>) -> anyhow::Result<()> {
    // World rank 0 is the leader of host 0 (local rank 0, cross rank 0): it writes both
    // halves, table first, so dense.json (renamed last) only ever names a complete step.
    let mine = if topo.rank == 0 {
        (|| -> anyhow::Result<()> {
            let ck = dense()?;
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let tp = checkpoint::table_path(dir, ck.step);
            table.table().save(&tp)?;
            ck.save(dir).with_context(|| format!("writing the checkpoint in {}", dir.display()))?;
            checkpoint::remove_older_tables(dir, ck.step);
            Ok(())
        })()
        .map_err(|e| format!("{e:#}"))
    } else {
        Ok(())
    };
    Ok(topo.agree(mine)?)
}

/// Predicts the held-out rows (each rank a slice), gathers (score, label) to rank 0 and
/// computes the exact global log loss and AUC there.
fn evaluate(topo: &Topology, coll: &mut dyn Collectives, ds: &Dataset, table: &HostTable, model: &mut dyn DenseModel, test: std::ops::Range<usize>, batch: usize) -> anyhow::Result<(Option<f64>, Option<f64>)> {
    let mine = shard::rank_slice(test, topo.rank, topo.size);
    let mut pairs: Vec<f32> = Vec::with_capacity(2 * mine.len());
    let mut buf = BatchKeys::default();
    let mut logits = Vec::new();
    let mut at = mine.start;
    while at < mine.end {
        let end = (at + batch).min(mine.end);
        buf.rows.clear();
        buf.rows.extend((at..end).map(|r| r as u32));
        buf.load(ds)?;
        model.stage(&buf, table)?;
        model.predict(&buf, &mut logits)?;
        for (z, y) in logits.iter().zip(&buf.labels) {
            pairs.push(sigmoid(*z));
            pairs.push(*y);
        }
        at = end;
    }
    let all = coll.gatherv(&pairs, 0)?;
    Ok(match all {
        Some((v, _)) => {
            let scores: Vec<f32> = v.iter().step_by(2).copied().collect();
            let labels: Vec<f32> = v.iter().skip(1).step_by(2).copied().collect();
            (Some(metrics::logloss(&scores, &labels)), Some(metrics::auc(&scores, &labels)))
        }
        None => (None, None),
    })
}
