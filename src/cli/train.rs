//! `ringrec train`: its flags, turned into a [`TrainConfig`], the progress bar and the
//! printed summary.

use std::path::PathBuf;

use ringrec::comm::Backend;
use ringrec::device::Placement;
use ringrec::engine::Compression;
use ringrec::embedding::{Evict, OptimizerKind, StorageDtype};
use ringrec::model::DenseOptimizer;
use ringrec::sparse::{SparseExchange, SparseNormalize};
use ringrec::topology::Topology;
use ringrec::train::{self, NanPolicy, Progress, TrainConfig, TrainSummary};

/// `--backend`: `auto` (the best for the topology) or a backend.
#[derive(Clone, Copy, Debug)]
pub struct BackendArg(pub Option<Backend>);

/// Parses `--backend`.
pub fn backend(s: &str) -> Result<BackendArg, String> {
    match s {
        "auto" => Ok(BackendArg(None)),
        _ => Backend::parse(s).map(|b| BackendArg(Some(b))).ok_or_else(|| format!("`{s}` is not a backend; choose from auto, mpi, ring, shm, hier")),
    }
}

/// Parses `--compression`.
pub fn compression(s: &str) -> Result<Compression, String> {
    Compression::parse(s).ok_or_else(|| format!("`{s}` is not a compression; choose from none, fp16, bf16, 1bit, 1bit-l1"))
}

/// Parses `--device`.
pub fn placement(s: &str) -> Result<Placement, String> {
    Placement::parse(s).ok_or_else(|| format!("`{s}` is not a device; choose from auto, cpu, cuda"))
}

/// Flags of `ringrec train`.
#[derive(clap::Args, Debug, Clone)]
pub struct TrainArgs {
    /// Training data, trained in the order given: Criteo-format TSVs or prepared `.rrdata`
    /// caches, directories (their files in natural order: day_2 before day_10) and quoted
    /// globs (`'days/day_*'`, `'day_[0-8].tsv'`, natural order); repeated or comma-separated. One epoch is a
    /// pass over all of them; each TSV is prepared once into a cache (the next one while
    /// the current one trains). Default: a synthetic set that ringrec generates once
    /// under --data-dir.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub data: Vec<PathBuf>,
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
    #[arg(long, default_value = "adam")]
    pub dense_optimizer: DenseOptimizer,
    /// Embedding learning rate.
    #[arg(long, default_value_t = 0.05)]
    pub sparse_lr: f32,
    /// Embedding optimizer (applied by each host leader): sgd or adagrad.
    #[arg(long, default_value = "sgd")]
    pub sparse_optimizer: OptimizerKind,
    /// Held-out fraction: the last rows of the data set when --data is one file and there
    /// is no --eval-data [default: 0.1].
    #[arg(long)]
    pub test_fraction: Option<f64>,
    /// Seed of the model's initial parameters and embedding rows.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Shuffle the training rows every epoch (deterministically from --seed).
    #[arg(long)]
    pub shuffle: bool,
    /// Collective backend of the host tensors: auto (shm on one host, hier on several),
    /// mpi, ring, shm, hier. Device tensors use the device's collectives (NCCL on GPUs).
    #[arg(long, default_value = "auto", value_parser = backend)]
    pub backend: BackendArg,
    /// Where the dense model runs: cuda (one GPU per rank, NCCL between them), cpu, or auto
    /// (cuda when this ringrec has the `cuda` feature, a driver and a GPU for each rank of a
    /// host; else cpu, with a note when ranks would have shared a GPU).
    #[arg(long, default_value = "auto", value_parser = placement)]
    pub device: Placement,
    /// Sparse exchange: hierarchical (per-host pre-aggregation) or flat (every rank allgathers).
    #[arg(long, default_value = "hier")]
    pub sparse_exchange: SparseExchange,
    /// What a key's summed gradient is divided by: frequency (ranks holding it), world, none.
    #[arg(long, default_value = "frequency")]
    pub sparse_normalize: SparseNormalize,
    /// Threads per rank (default: cores / ranks on this host).
    #[arg(long, env = "RINGREC_THREADS")]
    pub threads: Option<usize>,
    /// Slots of the host-shared embedding table (80% can hold rows).
    #[arg(long, default_value_t = 1 << 21)]
    pub table_capacity: u64,
    /// Malformed input lines tolerated before stopping (they are counted and reported).
    #[arg(long, default_value_t = ringrec::data::criteo::DEFAULT_MAX_BAD_LINES)]
    pub max_bad_lines: u64,
    /// Write checkpoints here (every --checkpoint-every steps and at the end).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Steps between checkpoints (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub checkpoint_every: u64,
    /// Continue from the newest complete checkpoint in --checkpoint-dir (a damaged newest
    /// one falls back to the previous, with a warning).
    #[arg(long)]
    pub resume: bool,
    /// Checkpoints to keep (the newest ones).
    #[arg(long, default_value_t = 2)]
    pub keep_checkpoints: usize,
    /// Write a periodic checkpoint only when the dense parameters moved by at least this
    /// relative L2 change since the last one (e.g. 0.05; 0: always).
    #[arg(long, default_value_t = 0.0)]
    pub checkpoint_min_change: f64,
    /// A NaN or infinite loss, gradient or parameter: `stop` every rank at that step, or
    /// `skip-step` (skip that update and go on).
    #[arg(long, default_value = "stop")]
    pub nan_policy: NanPolicy,
    /// Evaluate on the held-out rows every N steps (global AUC and log loss), with an
    /// interval report of loss, samples/s and traffic (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub eval_every: u64,
    /// Synchronise every K steps (1: every step, fully synchronous). With K > 1 each rank
    /// (or host, --sync-scope) trains K local steps from the last synchronised state, then
    /// the ranks average their dense delta through the engine's allreduce and the hosts
    /// exchange their tables' zero-filtered row deltas; evaluations, checkpoints and the
    /// end of the run always see a synchronised state.
    #[arg(long, default_value_t = 1, value_name = "K")]
    pub sync_every: u64,
    /// With --sync-every K > 1: `rank` (each rank trains on its own between syncs) or
    /// `host` (the ranks of a host sum their dense gradients every step over shared memory;
    /// only hosts sync every K steps).
    #[arg(long, default_value = "rank")]
    pub sync_scope: train::SyncScope,
    /// Stop every rank once the held-out log loss at an --eval-every report is at most X
    /// (the summary's `stopped_at_target` says when).
    #[arg(long, value_name = "X")]
    pub stop_at_loss: Option<f64>,
    /// Stop every rank once the held-out AUC at an --eval-every report is at least Y.
    #[arg(long, value_name = "Y")]
    pub stop_at_auc: Option<f64>,
    /// Compression of the dense gradients' allreduce: none, fp16, bf16, 1bit (sign bits and
    /// an L2 scale times --onebit-lambda, with error feedback) or 1bit-l1 (an L1 scale).
    /// Default: RINGREC_COMPRESSION, else none.
    #[arg(long, value_parser = compression)]
    pub compression: Option<Compression>,
    /// The factor lambda of --compression 1bit, in (0, 1]: 1 keeps the gradient's norm,
    /// less shrinks the scale so a spiky gradient's error still shrinks (design 001).
    #[arg(long, value_name = "LAMBDA")]
    pub onebit_lambda: Option<f32>,
    /// Values per scale of --compression 1bit / 1bit-l1: each block of that many consecutive
    /// values of a tensor gets its own scale (0: one scale per tensor, design 001's literal
    /// form). Default: RINGREC_ONEBIT_BLOCK, else 256.
    #[arg(long, value_name = "VALUES")]
    pub onebit_block: Option<usize>,
    /// Train the first STEPS steps with the dense gradients uncompressed, then switch to
    /// --compression (1-bit Adam's warmup: Adam's moments settle on exact gradients
    /// first; error feedback starts at the switch). Default 0.
    #[arg(long, value_name = "STEPS", default_value_t = 0)]
    pub compression_warmup: u64,
    /// What a weighted step's loss sum is divided by: weights (the global batch's weight
    /// sum: the weighted mean) or rows (its rows: light, old samples move the model less,
    /// so --decay-base acts on days trained in order too).
    #[arg(long, default_value = "weights", value_name = "BY")]
    pub loss_normalize: ringrec::train::weights::LossNormalize,
    /// Compression of the sparse rows on the hierarchical exchange's cross-host leg: none,
    /// 1bit (L2 scale times --onebit-lambda) or 1bit-l1 (one scale and the signs per row,
    /// with error feedback per key: a residual row per key sent), fp16 or bf16 (each value
    /// rounded to half precision).
    #[arg(long, default_value = "none", value_parser = compression)]
    pub sparse_compression: Compression,
    /// Write each interval report (--eval-every) as one JSON line to this file (rank 0;
    /// appended to when resuming). Plot it with scripts/plot_metrics.py.
    #[arg(long)]
    pub metrics_out: Option<PathBuf>,
    /// Every rank keeps DIR/rank-<rank>.json with its progress (step, samples, samples/s;
    /// at most twice a second), for `ringrec serve`'s per-rank view.
    #[arg(long)]
    pub progress_dir: Option<PathBuf>,
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
    /// Warm start: a new run from a trained model — a checkpoint directory (dense
    /// parameters, optimizer state and table), an export bundle (dense parameters and table)
    /// or a sparse-parameter file (table; dense weights with --init-dense). Its steps count
    /// from 0 and its data from the beginning; exclusive with --resume.
    #[arg(long)]
    pub init_from: Option<PathBuf>,
    /// Dense weights (an export bundle's dense.bin layout) for an --init-from
    /// sparse-parameter file.
    #[arg(long)]
    pub init_dense: Option<PathBuf>,
    /// Held-out data (the syntax of --data), scored whole by every evaluation; the
    /// training data is then not split.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub eval_data: Vec<PathBuf>,
    /// Storage of the table's rows: f32, f16 or bf16 (arithmetic is f32 either way).
    #[arg(long, default_value = "f32")]
    pub table_dtype: StorageDtype,
    /// Largest size of the host table file (e.g. 8G): the table doubles when it passes 70%
    /// load up to this size, then evicts (--evict). Default: half of what the
    /// shared-memory directory has free at the start (shared among a machine's hosts).
    #[arg(long, value_parser = bytes)]
    pub table_max_bytes: Option<u64>,
    /// A key gets its own row in the K-th step that holds it; until then it reads its
    /// initial row and its gradient is dropped (1: at once).
    #[arg(long, default_value_t = 1)]
    pub admit_after: u32,
    /// MiB of the count-min sketch that counts the steps of keys not admitted yet.
    #[arg(long, default_value_t = ringrec::embedding::admit::DEFAULT_SKETCH_BYTES >> 20)]
    pub admit_sketch_mib: u64,
    /// Remove rows not updated for this many steps (they read their initial row again).
    #[arg(long)]
    pub expire_after_steps: Option<u64>,
    /// Which rows go when the table at --table-max-bytes needs room: lru (least recently
    /// updated) or lfu (least often updated).
    #[arg(long, default_value = "lru")]
    pub evict: Evict,
    /// Per-sample weights.
    #[command(flatten)]
    pub weights: super::weights::WeightArgs,
}

/// Parses a size flag: bytes, or a number with K, M or G.
pub fn bytes(s: &str) -> Result<u64, String> {
    ringrec::config::parse_bytes(s).map(|b| b as u64).ok_or_else(|| format!("`{s}` is not a size; give bytes, or a number with K, M or G (e.g. 8G)"))
}

/// `--test-fraction` when it is not given.
const DEFAULT_TEST_FRACTION: f64 = 0.1;

/// `~/.cache/ringrec` (or `$XDG_CACHE_HOME/ringrec`, or a per-user temporary directory).
pub fn default_data_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(h).join("ringrec");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".cache").join("ringrec");
    }
    // SAFETY: getuid has no preconditions.
    std::env::temp_dir().join(format!("ringrec-{}", unsafe { libc::getuid() }))
}

impl TrainArgs {
    /// The run these flags describe.
    pub fn config(&self) -> TrainConfig {
        TrainConfig {
            data: self.data.clone(),
            data_dir: self.data_dir.clone().unwrap_or_else(default_data_dir),
            synth_rows: self.synth_rows,
            epochs: self.epochs,
            max_steps: self.max_steps,
            batch: self.batch,
            dim: self.dim,
            hidden: self.hidden.clone(),
            lr: self.lr,
            dense_optimizer: self.dense_optimizer,
            sparse_lr: self.sparse_lr,
            sparse_optimizer: self.sparse_optimizer,
            test_fraction: self.test_fraction.unwrap_or(DEFAULT_TEST_FRACTION),
            seed: self.seed,
            shuffle: self.shuffle,
            backend: self.backend.0,
            device: self.device,
            sparse_exchange: self.sparse_exchange,
            sparse_normalize: self.sparse_normalize,
            threads: self.threads,
            table_capacity: self.table_capacity,
            max_bad_lines: self.max_bad_lines,
            checkpoint_dir: self.checkpoint_dir.clone(),
            checkpoint_every: self.checkpoint_every,
            resume: self.resume,
            keep_checkpoints: self.keep_checkpoints,
            checkpoint_min_change: self.checkpoint_min_change,
            nan_policy: self.nan_policy,
            eval_every: self.eval_every,
            metrics_out: self.metrics_out.clone(),
            stop_at_loss: self.stop_at_loss,
            stop_at_auc: self.stop_at_auc,
            compression: self.compression,
            onebit_lambda: self.onebit_lambda,
            sparse_compression: self.sparse_compression,
            onebit_block: self.onebit_block,
            compression_warmup: self.compression_warmup,
            loss_normalize: self.loss_normalize,
            record_losses: self.record_losses,
            eval: !self.no_eval,
            init_from: self.init_from.clone(),
            init_dense: self.init_dense.clone(),
            eval_data: self.eval_data.clone(),
            test_fraction_given: self.test_fraction.is_some(),
            table_dtype: self.table_dtype,
            table_max_bytes: self.table_max_bytes,
            admit_after: self.admit_after,
            admit_sketch_mib: self.admit_sketch_mib,
            expire_after_steps: self.expire_after_steps,
            evict: self.evict,
            sync_every: self.sync_every,
            sync_scope: self.sync_scope,
            weights: self.weights.config(),
        }
    }
}

fn print(s: &TrainSummary, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(s)?);
        return Ok(());
    }
    println!(
        "ringrec train: {} ranks on {} host(s), {} steps, {} samples in {:.1}s = {:.0} samples/s; train loss {:.4}; test logloss {} AUC {}; peak RSS {:.0} MiB",
        s.ranks,
        s.hosts,
        s.steps,
        s.samples,
        s.train_seconds,
        s.samples_per_sec,
        s.train_loss,
        s.test_logloss.map_or("-".into(), |v| format!("{v:.4}")),
        s.test_auc.map_or("-".into(), |v| format!("{v:.4}")),
        s.peak_rss_mib
    );
    if s.samples_merged + s.samples_dropped_by_weight > 0 {
        println!("sample weights: {} rows merged into identical ones, {} left out below --min-sample-weight", s.samples_merged, s.samples_dropped_by_weight);
    }
    if s.table_growths + s.table_evictions + s.table_expirations + s.table_refused > 0 {
        println!(
            "table: {} rows in {} slots ({:.1} MiB); grew {} times ({:.2} s); {} rows evicted, {} expired; {} gradients of keys without a row dropped",
            s.table_rows,
            s.table_capacity,
            s.table_bytes as f64 / (1u64 << 20) as f64,
            s.table_growths,
            s.table_growth_seconds,
            s.table_evictions,
            s.table_expirations,
            s.table_refused
        );
    }
    Ok(())
}

/// Trains; rank 0 shows progress and prints the summary.
pub fn run(topo: &Topology, args: &TrainArgs) -> anyhow::Result<()> {
    let cfg = args.config();
    let mut bar: Option<indicatif::ProgressBar> = None;
    let mut ranks_file = args.progress_dir.as_deref().map(|d| super::progress::RankProgress::new(d, topo.rank, topo.size));
    let mut show = |p: &Progress| {
        if let Some(f) = ranks_file.as_mut() {
            f.update(p);
        }
        if topo.rank != 0 || args.no_progress {
            return;
        }
        let pb = bar.get_or_insert_with(|| {
            let pb = indicatif::ProgressBar::new(p.total_steps);
            pb.set_style(indicatif::ProgressStyle::with_template("{spinner} step {pos}/{len} [{bar:30}] {msg} ETA {eta}").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
            pb
        });
        if let Some(loss) = p.loss {
            let auc = p.eval_auc.map_or(String::new(), |a| format!(" eval AUC {a:.4}"));
            pb.set_message(format!("epoch {} loss {loss:.4} {:.0} samples/s{auc}", p.epoch, p.samples_per_sec));
        }
        pb.set_position(p.step);
    };
    let summary = train::run(topo, &cfg, &mut show)?;
    if let Some(f) = ranks_file.as_mut() {
        f.finish();
    }
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    if topo.rank == 0 {
        print(&summary, args.json)?;
    }
    Ok(())
}
