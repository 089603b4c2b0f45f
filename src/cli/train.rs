//! `ringrec train`: its flags, turned into a [`TrainConfig`], the progress bar and the
//! printed summary.

use std::path::PathBuf;

use ringrec::comm::Backend;
use ringrec::device::Placement;
use ringrec::embedding::OptimizerKind;
use ringrec::model::DenseOptimizer;
use ringrec::sparse::{SparseExchange, SparseNormalize};
use ringrec::topology::Topology;
use ringrec::train::{self, NanPolicy, Progress, TrainConfig, TrainSummary};

/// `--backend`: `auto` (the best for the topology) or a backend.
#[derive(Clone, Copy, Debug)]
pub struct BackendArg(pub Option<Backend>);

fn backend(s: &str) -> Result<BackendArg, String> {
    match s {
        "auto" => Ok(BackendArg(None)),
        _ => Backend::parse(s).map(|b| BackendArg(Some(b))).ok_or_else(|| format!("`{s}` is not a backend; choose from auto, mpi, ring, shm, hier")),
    }
}

fn placement(s: &str) -> Result<Placement, String> {
    Placement::parse(s).ok_or_else(|| format!("`{s}` is not a device; choose from auto, cpu, cuda"))
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
    #[arg(long, default_value = "adam")]
    pub dense_optimizer: DenseOptimizer,
    /// Embedding learning rate.
    #[arg(long, default_value_t = 0.05)]
    pub sparse_lr: f32,
    /// Embedding optimizer (applied by each host leader): sgd or adagrad.
    #[arg(long, default_value = "sgd")]
    pub sparse_optimizer: OptimizerKind,
    /// Held-out fraction (the last rows of the data set).
    #[arg(long, default_value_t = 0.1)]
    pub test_fraction: f64,
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
    /// (cuda when this ringrec has the `cuda` feature and a driver and a GPU are present).
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
}

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
            test_fraction: self.test_fraction,
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
            record_losses: self.record_losses,
            eval: !self.no_eval,
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
