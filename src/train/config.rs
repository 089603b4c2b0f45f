//! [`TrainConfig`]: every setting of a training run, declared once ([`crate::settings`]):
//! its flag and help (`ringrec train`'s flags are built from [`TrainConfig::SETTINGS`]),
//! whether every rank must agree on it ([`TrainConfig::settings`], compared at start) and
//! whether a resume must repeat it ([`TrainConfig::resume_settings`], recorded in each
//! checkpoint), and what the job service does with it. The run's checks
//! ([`TrainConfig::validate`]) and the derived configurations (engine, table) follow.

use std::path::PathBuf;

use super::tables::TableSpec;
use super::{data, gpu_cache::GpuCacheMode, prefetch::Pipeline, sync::SyncScope, weights, TrainError, TrainResult};
use crate::comm::Backend;
use crate::data::weights::WeightConfig;
use crate::data::ColumnSpec;
use crate::device::{GemmPrecision, Placement};
use crate::embedding::{Evict, OptimizerKind, StorageDtype, TableConfig};
use crate::engine::{Compression, EngineConfig};
use crate::model::{CrossStructure, DenseOptimizer, ModelKind, ModelSpec};
use crate::settings::{one, settings, Scope, ServiceRole, SettingValue, Word};
use crate::sparse::{SparseExchange, SparseNormalize};
use crate::topology::Topology;

/// The default scale of a DeepFM table's initial rows: its second-order term sums 325
/// pairwise products of the rows, noise of about 1.4 per logit at `1 / sqrt(d + 1)` that
/// one epoch does not wash out (PyTorch's DeepFM alike; docs/models.md); small rows start
/// it near zero, as DeepFM implementations do.
pub const DEEPFM_INIT_SCALE: f32 = 0.01;

/// What a non-finite (NaN or infinite) loss, gradient or parameter does to a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NanPolicy {
    /// Stop every rank at that step with a message naming the step and the tensor; the
    /// last checkpoint stays the newest (default).
    Stop,
    /// Skip the step's update of the part that is not finite (the dense optimizer step when
    /// the reduced dense gradient is not, the table update when the merged sparse gradient
    /// is not: each decided on data every rank holds identically) and go on; every skip is
    /// reported and counted.
    SkipStep,
}

crate::config::named_enum!(NanPolicy { Stop => "stop", SkipStep => "skip-step" });

/// `--test-fraction` when it is not given.
pub const DEFAULT_TEST_FRACTION: f64 = 0.1;

/// `~/.cache/ringrec` (or `$XDG_CACHE_HOME/ringrec`, or a per-user temporary directory):
/// where the default data set and the TSV caches live unless `--data-dir` or
/// `RINGREC_DATA_DIR` say otherwise.
pub fn default_data_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("XDG_CACHE_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h).join("ringrec");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h).join(".cache").join("ringrec");
    }
    // SAFETY: getuid has no preconditions.
    std::env::temp_dir().join(format!("ringrec-{}", unsafe { libc::getuid() }))
}

/// `--backend`: `auto` (the best for the topology) or a backend.
pub fn parse_backend(values: &[&str]) -> Result<Option<Backend>, String> {
    match one(values)? {
        "auto" => Ok(None),
        s => Backend::parse_word(s).map(Some).map_err(|_| format!("`{s}` is not a backend; choose from auto, mpi, ring, shm, hier")),
    }
}

fn show_backend(b: &Option<Backend>) -> String {
    b.map_or_else(|| "auto".to_string(), |b| b.name().to_string())
}

/// `--no-eval`: the switch turns the evaluation off.
fn parse_no_eval(values: &[&str]) -> Result<bool, String> {
    bool::from_values(values).map(|no| !no)
}

fn show_no_eval(eval: &bool) -> String {
    (!eval).to_string()
}

/// A size: bytes, or a number with K, M or G.
pub fn size(s: &str) -> Result<u64, String> {
    crate::config::parse_bytes(s).map(|b| b as u64).ok_or_else(|| format!("`{s}` is not a size; give bytes, or a number with K, M or G (e.g. 8G)"))
}

/// A size flag ([`size`]).
pub fn parse_bytes(values: &[&str]) -> Result<Option<u64>, String> {
    size(one(values)?).map(Some)
}

const DEFAULT_SKETCH_MIB: u64 = crate::embedding::admit::DEFAULT_SKETCH_BYTES >> 20;

settings! {
    /// What a training run does: every flag of `ringrec train` but its presentation
    /// (`--json`, `--no-progress`, `--progress-dir`).
    #[derive(Clone, Debug)]
    pub struct TrainConfig {
        /// Training data, trained in the order given: Criteo-format TSVs or prepared `.rrdata`
        /// caches, directories (their files in natural order: day_2 before day_10) and quoted
        /// globs (`'days/day_*'`, `'day_[0-8].tsv'`, natural order); repeated or
        /// comma-separated. One epoch is a pass over all of them; each TSV is prepared once
        /// into a cache (the next one while the current one trains). Default: a synthetic set
        /// that ringrec generates once under --data-dir.
        #[setting(flag = "--data", scope = Scope::Resumed, service = ServiceRole::Typed("data"), value_name = "PATHS")]
        pub data: Vec<PathBuf> = Vec::new(),
        /// Where the default data set and TSV caches live [default: ~/.cache/ringrec].
        #[setting(flag = "--data-dir", scope = Scope::Free("each host's cache location"), service = ServiceRole::Owned, value_name = "DIR", env = "RINGREC_DATA_DIR")]
        pub data_dir: PathBuf = default_data_dir(),
        /// Rows of the default synthetic data set.
        #[setting(flag = "--synth-rows", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "N")]
        pub synth_rows: u64 = 200_000,
        /// Passes over the training split.
        #[setting(flag = "--epochs", scope = Scope::Agreed, service = ServiceRole::Typed("epochs"), value_name = "N")]
        pub epochs: u64 = 1,
        /// Stop after this many global steps (counted from the start of the run, resumed
        /// steps included).
        #[setting(flag = "--max-steps", scope = Scope::Agreed, service = ServiceRole::Typed("max_steps"), value_name = "N")]
        pub max_steps: Option<u64> = None,
        /// Global batch (split over the ranks).
        #[setting(flag = "--batch", scope = Scope::Resumed, service = ServiceRole::Typed("batch"), value_name = "N")]
        pub batch: usize = 1024,
        /// Embedding dimension.
        #[setting(flag = "--dim", scope = Scope::Resumed, service = ServiceRole::Typed("dim"), value_name = "N")]
        pub dim: usize = 16,
        /// Hidden layer widths of the MLP.
        #[setting(flag = "--hidden", scope = Scope::Resumed, service = ServiceRole::Typed("hidden"), value_name = "WIDTHS")]
        pub hidden: Vec<usize> = vec![256, 128],
        /// The dense model: mlp, dlrm, dcn, deepfm or wide-deep (docs/training.md, "Models").
        #[setting(flag = "--model", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "MODEL")]
        pub model: ModelKind = ModelKind::Mlp,
        /// DLRM's bottom MLP hidden widths over the dense features (its last layer is --dim
        /// wide). --model dlrm only.
        #[setting(flag = "--bottom-mlp", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "WIDTHS")]
        pub bottom_mlp: Vec<usize> = vec![64],
        /// DLRM: each vector's dot product with itself too. --model dlrm only.
        #[setting(flag = "--interaction-self", scope = Scope::Resumed, service = ServiceRole::Args)]
        pub interaction_self: bool = false,
        /// DCN-v2's cross layers. --model dcn only.
        #[setting(flag = "--cross-layers", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "N")]
        pub cross_layers: usize = 3,
        /// DCN-v2's cross rank: 0 = full matrices, R > 0 = low-rank U V. --model dcn only.
        #[setting(flag = "--cross-rank", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "R")]
        pub cross_rank: usize = 0,
        /// DCN-v2's structure: stacked (the deep MLP on the cross network's output) or
        /// parallel (side by side). --model dcn only.
        #[setting(flag = "--cross-structure", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "STRUCTURE")]
        pub cross_structure: CrossStructure = CrossStructure::Stacked,
        /// Dense learning rate.
        #[setting(flag = "--lr", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "LR")]
        pub lr: f32 = 0.001,
        /// Dense optimizer: sgd or adam.
        #[setting(flag = "--dense-optimizer", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "OPTIMIZER")]
        pub dense_optimizer: DenseOptimizer = DenseOptimizer::Adam,
        /// Embedding learning rate.
        #[setting(flag = "--sparse-lr", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "LR")]
        pub sparse_lr: f32 = 0.05,
        /// Embedding optimizer (applied by each host leader): sgd or adagrad.
        #[setting(flag = "--sparse-optimizer", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "OPTIMIZER")]
        pub sparse_optimizer: OptimizerKind = OptimizerKind::Sgd,
        /// Held-out fraction: the last rows of the data set when --data is one file and there
        /// is no --eval-data [default: 0.1].
        #[setting(flag = "--test-fraction", scope = Scope::Resumed, service = ServiceRole::Typed("test_fraction"), value_name = "FRACTION")]
        pub test_fraction: Option<f64> = None,
        /// Seed of the model's initial parameters and embedding rows.
        #[setting(flag = "--seed", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "SEED")]
        pub seed: u64 = 1,
        /// Shuffle the training rows every epoch (deterministically from --seed).
        #[setting(flag = "--shuffle", scope = Scope::Resumed, service = ServiceRole::Args)]
        pub shuffle: bool = false,
        /// Collective backend of the host tensors: auto (shm on one host, hier on several),
        /// mpi, ring, shm, hier. Device tensors use the device's collectives (NCCL on GPUs).
        #[setting(flag = "--backend", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "BACKEND", parse = parse_backend, show = show_backend)]
        pub backend: Option<Backend> = None,
        /// Where the dense model runs: cuda (one GPU per rank, NCCL between them), cpu, host
        /// (the GPU's kernels compiled for the CPU, for tests), or auto (cuda when this ringrec
        /// has the `cuda` feature, a driver and a GPU for each rank of a host; else cpu, with a
        /// note when ranks would have shared a GPU).
        #[setting(flag = "--device", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "DEVICE")]
        pub device: Placement = Placement::Auto,
        /// Arithmetic of the dense model's GEMMs: f32, or bf16 (operands rounded to bfloat16,
        /// products accumulated in f32: AVX-512 BF16 on the CPU, which it needs, tensor cores
        /// on a GPU). Parameters, gradients, optimizer state and checkpoints stay f32, so a
        /// resumed run may change it.
        #[setting(flag = "--dense-precision", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "PRECISION")]
        pub dense_precision: GemmPrecision = GemmPrecision::F32,
        /// MiB of each GPU's memory for the hot-row cache (fractions allowed): the rows of the keys this rank
        /// sees most (single-hot and multi-hot list ids alike, with their optimizer state), kept
        /// on the device and updated there exactly as the host updates them, so only the other
        /// rows are uploaded (0: off, the default: it does not pay yet, docs/gpus.md). At most
        /// the rows the table can hold. Refused on --device cpu and with --table.
        #[setting(flag = "--gpu-cache-mib", scope = Scope::Free("each rank's own GPU memory; results do not depend on it"), service = ServiceRole::Args, value_name = "MIB")]
        pub gpu_cache_mib: Option<f64> = None,
        /// Steps between two choices of the hot-row cache's keys (the most frequent in this
        /// rank's recent batches).
        #[setting(flag = "--gpu-cache-refresh", scope = Scope::Free("each rank's own cache; results do not depend on it"), service = ServiceRole::Args, value_name = "STEPS")]
        pub gpu_cache_refresh: u64 = crate::embedding::cache::DEFAULT_REFRESH_STEPS,
        /// Who updates the hot-row cache's rows: write-through (the host table's leader
        /// updates every row, the cache a copy of its rows), or write-back (one rank per
        /// host: the cached rows and their optimizer state are updated on the device only,
        /// the host skips them, and they are written back into the host table before
        /// anything reads it: rows leaving the cache, checkpoints, evaluation, the run's
        /// end). The same results either way.
        #[setting(flag = "--gpu-cache-mode", scope = Scope::Free("each rank's own cache; results do not depend on it"), service = ServiceRole::Args, value_name = "MODE")]
        pub gpu_cache_mode: GpuCacheMode = GpuCacheMode::WriteThrough,
        /// Sparse exchange: hier (per-host pre-aggregation) or flat (every rank allgathers).
        #[setting(flag = "--sparse-exchange", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "EXCHANGE")]
        pub sparse_exchange: SparseExchange = SparseExchange::Hierarchical,
        /// What a key's summed gradient is divided by: frequency (ranks holding it), world,
        /// none, or weighted (the summed weights of the ranks holding it).
        #[setting(flag = "--sparse-normalize", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "BY")]
        pub sparse_normalize: SparseNormalize = SparseNormalize::Frequency,
        /// Threads per rank [default: cores / ranks on this host].
        #[setting(flag = "--threads", scope = Scope::Free("each rank's own threads"), service = ServiceRole::Typed("threads"), value_name = "N", env = "RINGREC_THREADS")]
        pub threads: Option<usize> = None,
        /// Slots of the host-shared embedding table (80% can hold rows).
        #[setting(flag = "--table-capacity", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "SLOTS")]
        pub table_capacity: u64 = 1 << 21,
        /// Categorical fields in a host table of their own: FIELDS=NAME[:dim=N][:capacity=SLOTS][:max_bytes=BYTES],
        /// repeated for several tables (e.g. `--table c3,l0=items:dim=32:capacity=1048576`).
        /// Fields are named as the data names them: a Parquet file's columns (single-hot or
        /// list: c3, l0), C1..C26 for a TSV's; dim and capacity default to --dim and
        /// --table-capacity, every other table flag is the run's. Fields not named stay in
        /// the default table. Fields of different dims need --model mlp or dcn. A table's
        /// largest file is its max_bytes, else its share (by initial size) of
        /// --table-max-bytes, or of the shared-memory directory's room, with the default table.
        #[setting(flag = "--table", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "FIELDS=NAME[:dim=N][:capacity=SLOTS][:max_bytes=BYTES]")]
        pub tables: Vec<TableSpec> = Vec::new(),
        /// Malformed input lines tolerated before stopping (they are counted and reported).
        #[setting(flag = "--max-bad-lines", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "N", env = "RINGREC_MAX_BAD_LINES")]
        pub max_bad_lines: u64 = crate::data::criteo::DEFAULT_MAX_BAD_LINES,
        /// A Parquet input's label column [default: label] (see `ringrec data prepare`).
        #[setting(flag = "--label-column", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "NAME")]
        pub label_column: Option<String> = None,
        /// A Parquet input's dense feature columns, comma-separated: with --sparse-columns,
        /// the only feature columns read [default: inferred: numbers dense, strings
        /// categorical].
        #[setting(flag = "--dense-columns", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "NAMES")]
        pub dense_columns: Vec<String> = Vec::new(),
        /// A Parquet input's categorical columns (one id a row; strings or integers),
        /// comma-separated: with --dense-columns, the only feature columns read.
        #[setting(flag = "--sparse-columns", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "NAMES")]
        pub sparse_columns: Vec<String> = Vec::new(),
        /// How each multi-hot field (a Parquet list column) is pooled into one vector a
        /// row: sum or mean (EmbeddingBag's modes; an empty list pools to zeros), for every
        /// field, or FIELD=MODE,... (fields not named are summed). Part of the model: a
        /// checkpoint records it (a resume repeats it); not given, a run from --init-from
        /// takes its model's, any other run sums.
        #[setting(flag = "--multi-hot-pooling", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "MODE")]
        pub multi_hot_pooling: Option<String> = None,
        /// A Parquet input's columns in a TOML file: label, weight, dense columns with their
        /// transform (log or none), sparse columns (see docs/data.md); instead of the column
        /// flags (--label-column, --dense-columns, --sparse-columns, --weight-column NAME).
        #[setting(flag = "--schema", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "FILE.toml")]
        pub schema: Option<PathBuf> = None,
        /// Write checkpoints here (every --checkpoint-every steps and at the end).
        #[setting(flag = "--checkpoint-dir", scope = Scope::Agreed, service = ServiceRole::Owned, value_name = "DIR")]
        pub checkpoint_dir: Option<PathBuf> = None,
        /// Steps between checkpoints (0: only at the end).
        #[setting(flag = "--checkpoint-every", scope = Scope::Agreed, service = ServiceRole::Typed("checkpoint_every"), value_name = "STEPS")]
        pub checkpoint_every: u64 = 0,
        /// Continue from the newest complete checkpoint in --checkpoint-dir (a damaged newest
        /// one falls back to the previous, with a warning).
        #[setting(flag = "--resume", scope = Scope::Agreed, service = ServiceRole::Owned)]
        pub resume: bool = false,
        /// Checkpoints to keep (the newest ones).
        #[setting(flag = "--keep-checkpoints", scope = Scope::Agreed, service = ServiceRole::Typed("keep_checkpoints"), value_name = "N")]
        pub keep_checkpoints: usize = 2,
        /// Write a periodic checkpoint only when the dense parameters moved by at least this
        /// relative L2 change since the last one (e.g. 0.05; 0: always; design 002's
        /// change-gated backup).
        #[setting(flag = "--checkpoint-min-change", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "CHANGE")]
        pub checkpoint_min_change: f64 = 0.0,
        /// A NaN or infinite loss, gradient or parameter: `stop` every rank at that step, or
        /// `skip-step` (skip that update and go on).
        #[setting(flag = "--nan-policy", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "POLICY")]
        pub nan_policy: NanPolicy = NanPolicy::Stop,
        /// Evaluate on the held-out rows every N steps (global AUC and log loss), with an
        /// interval report of loss, samples/s and traffic (0: only at the end).
        #[setting(flag = "--eval-every", scope = Scope::Agreed, service = ServiceRole::Typed("eval_every"), value_name = "N")]
        pub eval_every: u64 = 0,
        /// Write each interval report (--eval-every) as one JSON line to this file (rank 0;
        /// appended to when resuming). Plot it with scripts/plot_metrics.py.
        #[setting(flag = "--metrics-out", scope = Scope::Free("rank 0's is written"), service = ServiceRole::Owned, value_name = "FILE")]
        pub metrics_out: Option<PathBuf> = None,
        /// Stop every rank once the held-out log loss at an --eval-every report is at most X
        /// (the summary's `stopped_at_target` says when).
        #[setting(flag = "--stop-at-loss", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "X")]
        pub stop_at_loss: Option<f64> = None,
        /// Stop every rank once the held-out AUC at an --eval-every report is at least Y.
        #[setting(flag = "--stop-at-auc", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "Y")]
        pub stop_at_auc: Option<f64> = None,
        /// Compression of the dense gradients' allreduce: none, fp16, bf16, 1bit (sign bits
        /// and an L2 scale times --onebit-lambda, with error feedback) or 1bit-l1 (an L1
        /// scale). Default: RINGREC_COMPRESSION, else none.
        #[setting(flag = "--compression", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "COMPRESSION", env = "RINGREC_COMPRESSION")]
        pub compression: Option<Compression> = None,
        /// The factor lambda of --compression 1bit, in (0, 1]: 1 keeps the gradient's norm,
        /// less shrinks the scale so a spiky gradient's error still shrinks (design 001).
        /// Default: RINGREC_ONEBIT_LAMBDA, else 1.
        #[setting(flag = "--onebit-lambda", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "LAMBDA", env = "RINGREC_ONEBIT_LAMBDA")]
        pub onebit_lambda: Option<f32> = None,
        /// Values per scale of --compression 1bit / 1bit-l1: each block of that many
        /// consecutive values of a tensor gets its own scale (0: one scale per tensor, design
        /// 001's literal form). Default: RINGREC_ONEBIT_BLOCK, else 256.
        #[setting(flag = "--onebit-block", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "VALUES", env = "RINGREC_ONEBIT_BLOCK")]
        pub onebit_block: Option<usize> = None,
        /// Train the first STEPS steps with the dense gradients uncompressed, then switch to
        /// --compression (1-bit Adam's warmup, DeepSpeed's `freeze_step`: Adam's moments
        /// settle on exact gradients first; error feedback starts at the switch).
        #[setting(flag = "--compression-warmup", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "STEPS")]
        pub compression_warmup: u64 = 0,
        /// What a weighted step's loss sum is divided by: weights (the global batch's weight
        /// sum: the weighted mean) or rows (its rows: light, old samples move the model less,
        /// so --decay-base acts on days trained in order too).
        #[setting(flag = "--loss-normalize", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "BY")]
        pub loss_normalize: weights::LossNormalize = weights::LossNormalize::Weights,
        /// Compression of the sparse rows on the hierarchical exchange's cross-host leg: none,
        /// 1bit (L2 scale times --onebit-lambda) or 1bit-l1 (one scale and the signs per row,
        /// with error feedback per key: a residual row per key sent), fp16 or bf16 (each
        /// value rounded to half precision).
        #[setting(flag = "--sparse-compression", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "COMPRESSION")]
        pub sparse_compression: Compression = Compression::None,
        /// Include every step's loss in the JSON summary.
        #[setting(flag = "--record-losses", scope = Scope::Free("rank 0's summary holds them"), service = ServiceRole::Refused("a job's losses are its metrics"))]
        pub record_losses: bool = false,
        /// Skip the evaluation on the held-out split.
        #[setting(flag = "--no-eval", scope = Scope::Agreed, service = ServiceRole::Args, parse = parse_no_eval, show = show_no_eval)]
        pub eval: bool = true,
        /// Warm start: a new run from a trained model — a checkpoint directory (dense
        /// parameters, optimizer state and table), an export bundle (dense parameters and
        /// table) or a sparse-parameter file (table; dense weights with --init-dense). Its
        /// steps count from 0 and its data from the beginning; exclusive with --resume.
        #[setting(flag = "--init-from", scope = Scope::Agreed, service = ServiceRole::Owned, value_name = "PATH")]
        pub init_from: Option<PathBuf> = None,
        /// With --init-from a checkpoint directory: refuse to start when its newest
        /// checkpoint is damaged, instead of starting from the newest one that passes every
        /// check (a warning, and the summary's init_from says which).
        #[setting(flag = "--require-newest", scope = Scope::Agreed, service = ServiceRole::Args)]
        pub require_newest: bool = false,
        /// Dense weights (an export bundle's dense.bin layout) for an --init-from
        /// sparse-parameter file.
        #[setting(flag = "--init-dense", scope = Scope::Agreed, service = ServiceRole::Owned, value_name = "FILE")]
        pub init_dense: Option<PathBuf> = None,
        /// Held-out data (the syntax of --data), scored whole by every evaluation; the
        /// training data is then not split.
        #[setting(flag = "--eval-data", scope = Scope::Agreed, service = ServiceRole::Typed("eval_data"), value_name = "PATHS")]
        pub eval_data: Vec<PathBuf> = Vec::new(),
        /// Storage of the table's rows: f32, f16 or bf16 (arithmetic is f32 either way).
        #[setting(flag = "--table-dtype", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "DTYPE")]
        pub table_dtype: StorageDtype = StorageDtype::F32,
        /// The table's initial rows are uniform in [-S, S] (default 1 / sqrt(row width); 0.01 with --model deepfm, whose second-order term would otherwise start as noise).
        #[setting(flag = "--table-init-scale", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "S")]
        pub table_init_scale: Option<f32> = None,
        /// Largest size of the host table file (e.g. 8G): the table doubles when it passes
        /// 70% load up to this size, then evicts (--evict). Default: what a growth's peak
        /// (old and new table at once) leaves room for beside the sparse exchange's host
        /// boards in the shared-memory directory's free space at the start, at most half of
        /// it (shared among a machine's hosts). With --table: the largest size of all the
        /// tables without a max_bytes= of their own together, each its share by initial size.
        #[setting(flag = "--table-max-bytes", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "BYTES", parse = parse_bytes)]
        pub table_max_bytes: Option<u64> = None,
        /// A key gets its own row in the K-th step that holds it; until then it reads its
        /// initial row and its gradient is dropped (1: at once).
        #[setting(flag = "--admit-after", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "K")]
        pub admit_after: u32 = 1,
        /// MiB of the count-min sketch that counts the steps of keys not admitted yet.
        #[setting(flag = "--admit-sketch-mib", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "MIB")]
        pub admit_sketch_mib: u64 = DEFAULT_SKETCH_MIB,
        /// Remove rows not updated for this many steps (they read their initial row again).
        #[setting(flag = "--expire-after-steps", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "STEPS")]
        pub expire_after_steps: Option<u64> = None,
        /// Which rows go when the table at --table-max-bytes needs room: lru (least recently
        /// updated) or lfu (least often updated).
        #[setting(flag = "--evict", scope = Scope::Resumed, service = ServiceRole::Args, value_name = "POLICY")]
        pub evict: Evict = Evict::Lru,
        /// Synchronise every K steps (1: every step, fully synchronous). With K > 1 each rank
        /// (or host, --sync-scope) trains K local steps from the last synchronised state, then
        /// the ranks average their dense delta through the engine's allreduce and the hosts
        /// exchange their tables' zero-filtered row deltas; evaluations, checkpoints and the
        /// end of the run always see a synchronised state.
        #[setting(flag = "--sync-every", scope = Scope::Agreed, service = ServiceRole::Typed("sync_every"), value_name = "K")]
        pub sync_every: u64 = 1,
        /// With --sync-every K > 1: `rank` (each rank trains on its own between syncs) or
        /// `host` (the ranks of a host sum their dense gradients every step over shared
        /// memory; only hosts sync every K steps).
        #[setting(flag = "--sync-scope", scope = Scope::Agreed, service = ServiceRole::Args, value_name = "SCOPE")]
        pub sync_scope: SyncScope = SyncScope::Rank,
        /// Read the next step's batch (this rank's rows and their deduplicated keys) on a
        /// second thread while a step runs: on, off, or auto (on for --device cuda and host,
        /// off for cpu, whose dense step uses every core). The results are the same bits
        /// either way: the table rows of a step are still read after the previous step's
        /// update.
        #[setting(flag = "--pipeline", scope = Scope::Free("the results do not depend on it"), service = ServiceRole::Args, value_name = "MODE")]
        pub pipeline: Pipeline = Pipeline::Auto,
    }
    nested {
        /// Per-sample weights: time decay, merged duplicates, dropped light rows, a weight
        /// column ([`crate::data::weights`]; the default weighs every row 1).
        pub weights: WeightConfig,
    }
}

impl TrainConfig {
    /// The defaults of `ringrec train`, with the data under `data_dir`.
    pub fn new(data_dir: PathBuf) -> TrainConfig {
        TrainConfig { data_dir, ..TrainConfig::defaults() }
    }

    /// The held-out fraction: `--test-fraction`, else [`DEFAULT_TEST_FRACTION`].
    pub fn test_fraction(&self) -> f64 {
        self.test_fraction.unwrap_or(DEFAULT_TEST_FRACTION)
    }

    /// The engine's settings for this run: `RINGREC_*`, then `--compression` and
    /// `--onebit-lambda`.
    pub fn engine_config(&self, topo: &Topology) -> TrainResult<EngineConfig> {
        let mut engine = EngineConfig { backend: Some(self.backend(topo)), tag: "train".into(), ..EngineConfig::from_env()? };
        if let Some(c) = self.compression {
            engine.compression = c;
        }
        if let Some(l) = self.onebit_lambda {
            if engine.compression != Compression::OneBit && self.sparse_compression != Compression::OneBit {
                return Err(TrainError::Config(format!("--onebit-lambda {l} applies to the L2 form of 1-bit compression: add --compression 1bit or --sparse-compression 1bit (this run's are {} and {})", engine.compression.name(), self.sparse_compression.name())));
            }
            engine.onebit_lambda = crate::engine::compression::check_lambda(l).map_err(|e| TrainError::Config(format!("--onebit-lambda: {e}")))?;
        }
        if let Some(b) = self.onebit_block {
            if !engine.compression.is_onebit() {
                return Err(TrainError::Config(format!("--onebit-block {b} applies to 1-bit compression of the dense gradients: add --compression 1bit or 1bit-l1")));
            }
            engine.onebit_block = b;
        }
        if self.compression_warmup > 0 && engine.compression == Compression::None {
            return Err(TrainError::Config(format!("--compression-warmup {} delays the dense gradients' compression, and this run has none: add --compression (1bit, 1bit-l1, fp16 or bf16) or drop --compression-warmup", self.compression_warmup)));
        }
        if self.sparse_compression != Compression::None && self.sparse_normalize == SparseNormalize::Weighted {
            return Err(TrainError::Config("--sparse-compression with --sparse-normalize weighted: the rows carry their rank's weight, which signs and a scale (or half precision) would lose; use frequency, or no --sparse-compression".into()));
        }
        if self.sparse_compression != Compression::None && self.sparse_exchange != SparseExchange::Hierarchical {
            return Err(TrainError::Config("--sparse-compression compresses the hierarchical exchange's cross-host leg: use --sparse-exchange hier".into()));
        }
        Ok(engine)
    }

    /// The compression of step `step`'s (0-based) dense allreduces: none during
    /// `--compression-warmup`, then the engine's (`engine_default`).
    pub fn dense_compression_at(&self, step: u64, engine_default: Compression) -> Compression {
        if step < self.compression_warmup {
            Compression::None
        } else {
            engine_default
        }
    }

    /// Refuses settings no run can use, saying which flag and why.
    pub fn validate(&self) -> TrainResult<()> {
        self.weights.validate()?;
        if self.loss_normalize != weights::LossNormalize::Weights && !self.weight_config().active() {
            return Err(TrainError::Config(format!("--loss-normalize {} chooses how a weighted loss is averaged, and every sample of this run weighs 1: add --decay-base or --merge-duplicates, or drop --loss-normalize", self.loss_normalize)));
        }
        if self.batch == 0 || self.dim == 0 || self.hidden.contains(&0) {
            return Err(TrainError::Config("--batch, --dim and every --hidden width must be positive".into()));
        }
        self.validate_model()?;
        for (flag, v, ok) in [("--stop-at-loss", self.stop_at_loss, "above 0"), ("--stop-at-auc", self.stop_at_auc, "in (0, 1]")] {
            let Some(v) = v else { continue };
            let valid = if flag == "--stop-at-loss" { v.is_finite() && v > 0.0 } else { v > 0.0 && v <= 1.0 };
            if !valid {
                return Err(TrainError::Config(format!("{flag} must be {ok}, got {v}")));
            }
            if self.eval_every == 0 || !self.eval {
                return Err(TrainError::Config(format!("{flag} is checked on the held-out rows at each --eval-every report: add --eval-every N{}", if self.eval { "" } else { " and drop --no-eval" })));
            }
        }
        if !(0.0..1.0).contains(&self.test_fraction()) {
            return Err(TrainError::Config(format!("--test-fraction must be in [0, 1), got {}", self.test_fraction())));
        }
        if self.keep_checkpoints == 0 {
            return Err(TrainError::Config("--keep-checkpoints must be at least 1 (the newest checkpoint is always kept)".into()));
        }
        if !(self.checkpoint_min_change.is_finite() && self.checkpoint_min_change >= 0.0) {
            return Err(TrainError::Config(format!("--checkpoint-min-change must be a finite value >= 0 (a relative change, e.g. 0.05), got {}", self.checkpoint_min_change)));
        }
        if self.test_fraction.is_some() && !self.eval_data.is_empty() {
            return Err(TrainError::Config("--test-fraction and --eval-data: the held-out rows are either the last rows of one --data file or the --eval-data files; drop one".into()));
        }
        if self.resume && self.checkpoint_dir.is_none() {
            return Err(TrainError::Config("--resume needs --checkpoint-dir (the directory of the run to continue)".into()));
        }
        if self.resume && self.init_from.is_some() {
            return Err(TrainError::Config("--init-from and --resume are exclusive: --resume continues a run from its own --checkpoint-dir, --init-from starts a new run from a trained model".into()));
        }
        if let (Some(from), Some(dir)) = (&self.init_from, &self.checkpoint_dir) {
            let same = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
            if same(from) == same(dir) {
                return Err(TrainError::Config(format!("--init-from and --checkpoint-dir are the same directory ({}): a warm start is a new run whose steps count from 0; write its checkpoints into another --checkpoint-dir", dir.display())));
            }
        }
        if self.require_newest && self.init_from.is_none() {
            return Err(TrainError::Config("--require-newest goes with --init-from (a --resume falls back from a damaged newest checkpoint to the previous one by design)".into()));
        }
        if self.init_dense.is_some() && self.init_from.is_none() {
            return Err(TrainError::Config("--init-dense needs --init-from (the sparse-parameter file of the table it goes with)".into()));
        }
        self.validate_sync()?;
        self.validate_gpu_cache()?;
        self.validate_table()?;
        self.validate_tables()
    }

    /// `--table`'s checks that need no data (names, fields in two tables, each table's
    /// own shape), and what per-field tables cannot run with yet (each refusal names both
    /// flags and what to do).
    pub fn validate_tables(&self) -> TrainResult<()> {
        if self.tables.is_empty() {
            return Ok(());
        }
        super::tables::check_specs(&self.tables)?;
        let refuse = |other: &str, why: &str| Err(TrainError::Config(format!("--table with {other}: {why}")));
        if self.gpu_cache_asked() && self.gpu_cache_mode == super::GpuCacheMode::WriteBack {
            return refuse("--gpu-cache-mode write-back", "the per-table hot-row caches are write-through only: pass --gpu-cache-mode write-through, or drop --table");
        }
        for t in &self.tables {
            self.for_table(t).validate_table().map_err(|e| TrainError::Config(format!("--table {}: {e}", t.word())))?;
        }
        self.validate_shared_max_bytes()
    }

    /// With `--table`, `--table-max-bytes` is shared by the default table and every table
    /// without a `max_bytes=` of its own ([`super::embedding::share_max_bytes`]): it must
    /// hold their initial files together.
    fn validate_shared_max_bytes(&self) -> TrainResult<()> {
        let Some(max) = self.table_max_bytes else { return Ok(()) };
        let file = |c: &TrainConfig| c.table_config().header().map(|h| h.layout.file_len).map_err(|e| TrainError::Config(e.to_string()));
        let mut sharers = vec![("the default table".to_string(), file(self)?)];
        for t in self.tables.iter().filter(|t| t.max_bytes.is_none()) {
            sharers.push((format!("table `{}`", t.name), file(&self.for_table(t))?));
        }
        let sum: u64 = sharers.iter().map(|(_, b)| b).sum();
        if sum > max {
            let each: Vec<String> = sharers.iter().map(|(n, b)| format!("{n} {b}")).collect();
            return Err(TrainError::Config(format!(
                "--table-max-bytes {max} with --table is shared by the tables without a max_bytes= of their own, and their initial files take {sum} bytes ({}): raise it, lower their capacities, or give tables their own :max_bytes=",
                each.join(", ")
            )));
        }
        Ok(())
    }

    /// The run's settings for the table of `--table` `t`: its dim, capacity and largest
    /// size (`max_bytes=`; without it, none yet: its share is given once every table is
    /// open, [`super::embedding::share_max_bytes`]), every other setting the run's.
    pub fn for_table(&self, t: &TableSpec) -> TrainConfig {
        TrainConfig { dim: t.dim.unwrap_or(self.dim), table_capacity: t.capacity.unwrap_or(self.table_capacity), table_max_bytes: t.max_bytes, tables: Vec::new(), ..self.clone() }
    }

    /// Whether this run asks for the GPU hot-row cache (`--gpu-cache-mib` given and not 0).
    fn gpu_cache_asked(&self) -> bool {
        self.gpu_cache_mib.is_some_and(|m| m > 0.0)
    }

    /// `--gpu-cache-mib` and `--gpu-cache-refresh`, and what the hot-row cache cannot run
    /// with (each refusal names both flags and what to do). The default size turns the
    /// cache off for these combinations instead of refusing them. Eviction and expiry are
    /// supported: a step that removed rows from the table empties every cache (the next
    /// step fills it again).
    pub fn validate_gpu_cache(&self) -> TrainResult<()> {
        if let Some(m) = self.gpu_cache_mib.filter(|m| !(m.is_finite() && *m >= 0.0)) {
            return Err(TrainError::Config(format!("--gpu-cache-mib {m}: give the MiB of GPU memory for the hot-row cache, >= 0 (0: off)")));
        }
        if self.gpu_cache_refresh == 0 {
            return Err(TrainError::Config("--gpu-cache-refresh 0: give at least 1 (steps between two choices of the keys of the --gpu-cache-mib cache)".into()));
        }
        if !self.gpu_cache_asked() {
            return Ok(());
        }
        let refuse = |why: &str| Err(TrainError::Config(format!("--gpu-cache-mib {}: {why}", self.gpu_cache_mib.unwrap_or(0.0))));
        match self.gpu_cache_unsupported() {
            Some(why) => refuse(why),
            None => Ok(()),
        }
    }

    /// Why this run cannot have a GPU hot-row cache, if it cannot.
    pub fn gpu_cache_unsupported(&self) -> Option<&'static str> {
        if self.device == Placement::Cpu {
            return Some("--device cpu keeps the dense model in host memory, where the table already is: drop --gpu-cache-mib (or pass 0), or train on --device cuda");
        }
        if self.table_dtype != StorageDtype::F32 {
            return Some("the cache holds f32 rows and does not round them as an f16/bf16 --table-dtype stores them: pass --gpu-cache-mib 0, or --table-dtype f32");
        }
        if self.sync_every > 1 {
            return Some("with --sync-every k > 1 a sync sets rows the cache does not see: pass --gpu-cache-mib 0, or --sync-every 1");
        }
        None
    }

    /// `--sync-every` and `--sync-scope`, and what lazy synchronisation cannot run with.
    pub fn validate_sync(&self) -> TrainResult<()> {
        let k = self.sync_every;
        let refuse = |why: &str| Err(TrainError::Config(format!("--sync-every {k}: {why}")));
        match k {
            0 => refuse("must be at least 1 (1: every step, the fully synchronous training; k > 1: each rank or host trains k local steps between syncs)"),
            1 if self.sync_scope == SyncScope::Host => refuse("--sync-scope host chooses who trains together between syncs, and there are none: give --sync-every k > 1, or drop --sync-scope"),
            1 => Ok(()),
            _ if self.sparse_exchange == SparseExchange::Flat => refuse("the sparse deltas travel through the hierarchical exchange: use --sparse-exchange hier (the default)"),
            _ if self.sparse_optimizer != OptimizerKind::Sgd => refuse("the table's optimizer must be sgd (row-wise Adagrad accumulators would differ between hosts): use --sparse-optimizer sgd, or --sync-every 1"),
            _ if self.admit_after > 1 => refuse("--admit-after counts each step's global keys, which local steps do not have: drop --admit-after, or use --sync-every 1"),
            _ if self.weight_config().active() => refuse("sample weights (--decay-base, --merge-duplicates, --weight-column) are not combined with local steps yet: drop them, or use --sync-every 1"),
            _ if self.sparse_normalize == SparseNormalize::Weighted => refuse("--sparse-normalize weighted weighs the ranks of every step, which local steps do not share: use frequency, or --sync-every 1"),
            _ if self.expire_after_steps.is_some() => refuse("--expire-after-steps removes rows by each step's global keys, which local steps do not have: drop it, or use --sync-every 1"),
            _ => Ok(()),
        }
    }

    /// The table flags' own checks: `--admit-after` and its sketch, `--expire-after-steps`,
    /// and an explicit `--table-max-bytes` that holds at least the initial table.
    pub fn validate_table(&self) -> TrainResult<()> {
        if let Some(s) = self.table_init_scale.filter(|s| !(s.is_finite() && *s >= 0.0)) {
            return Err(TrainError::Config(format!("--table-init-scale {s}: give a finite scale >= 0 (the initial rows are uniform in [-S, S])")));
        }
        let tc = self.table_config();
        let h = tc.header().map_err(|e| TrainError::Config(e.to_string()))?;
        if self.expire_after_steps == Some(0) {
            return Err(TrainError::Config("--expire-after-steps must be at least 1 (rows not updated for that many steps are removed)".into()));
        }
        if let Some(max) = self.table_max_bytes {
            if max < h.layout.file_len {
                return Err(TrainError::Config(format!(
                    "--table-max-bytes {max} is smaller than the initial table ({} bytes for --table-capacity {}); raise it or lower --table-capacity",
                    h.layout.file_len, self.table_capacity
                )));
            }
        }
        Ok(())
    }

    /// The dense model this run trains on a TSV's rows (13 dense features, 26 fields):
    /// `--model` and its shape flags, `--dim`.
    pub fn model_spec(&self) -> ModelSpec {
        self.model_spec_for(crate::data::Fields::CRITEO, 0)
    }

    /// [`TrainConfig::model_spec`] over data of `fields`' shape with `lists` multi-hot
    /// fields after them (pooled into the last fields' vectors: every model takes them as
    /// fields).
    pub fn model_spec_for(&self, fields: crate::data::Fields, lists: usize) -> ModelSpec {
        ModelSpec {
            kind: self.model,
            bottom: self.bottom_mlp.clone(),
            interaction_self: self.interaction_self,
            cross_layers: self.cross_layers,
            cross_rank: self.cross_rank,
            cross_structure: self.cross_structure,
            ..ModelSpec::mlp(fields.sparse + lists, self.dim, fields.dense, self.hidden.clone())
        }
    }

    /// [`TrainConfig::model_spec_for`] over the rows of `input`, refused naming it and its
    /// shape when no model can take them (no categorical field; a shape the kind refuses).
    pub fn model_spec_of(&self, input: &std::path::Path, fields: crate::data::Fields, lists: usize) -> TrainResult<ModelSpec> {
        let spec = self.model_spec_for(fields, lists);
        if spec.fields == 0 {
            return Err(TrainError::Config(format!(
                "{}: no categorical column, single-hot or multi-hot ({}): every model learns the rows' keys; name a categorical column (--sparse-columns)",
                input.display(),
                fields.with_lists(lists)
            )));
        }
        if let Some(e) = spec.check() {
            return Err(TrainError::Config(format!("{}: the model cannot take its rows ({}): {e}", input.display(), fields.with_lists(lists))));
        }
        Ok(spec)
    }

    /// The pooling of each multi-hot field of data whose list columns are `names`
    /// (`--multi-hot-pooling`; not given: `warm`, the pooling the `--init-from` model
    /// recorded, which a flag given must not contradict; else sum). Each refusal names the
    /// flag and the input. (The GPU hot-row cache holds list ids' rows too: their bags are
    /// pooled from it, `Op::PoolBagsSourced`.)
    pub fn multi_hot(&self, input: &std::path::Path, names: &[String], warm: Option<&str>) -> TrainResult<Vec<crate::model::pooling::Pooling>> {
        use crate::model::pooling::{parse_pooling, recorded_pooling};
        let flag = self.multi_hot_pooling.as_deref();
        let modes = match warm {
            Some(rec) => recorded_pooling(Some(rec), flag, names, "--init-from model"),
            None => parse_pooling(flag.unwrap_or("sum"), names),
        }
        .map_err(TrainError::Config)?;
        if names.is_empty() {
            return Ok(modes);
        }
        crate::model::pooling::mean_mask(&modes).map_err(|e| TrainError::Config(format!("{}: {e}", input.display())))?;
        Ok(modes)
    }

    /// Values per table row: `--dim`, plus the first-order weight for deepfm and wide-deep.
    pub fn row_width(&self) -> usize {
        self.model_spec().row_width()
    }

    /// Refuses a model shape flag given with a model that does not use it (a flag counts as
    /// given when its value differs from its default), and shapes no model can take.
    pub fn validate_model(&self) -> TrainResult<()> {
        let d = TrainConfig::defaults();
        let given = [
            ("--bottom-mlp", self.bottom_mlp != d.bottom_mlp, ModelKind::Dlrm),
            ("--interaction-self", self.interaction_self != d.interaction_self, ModelKind::Dlrm),
            ("--cross-layers", self.cross_layers != d.cross_layers, ModelKind::Dcn),
            ("--cross-rank", self.cross_rank != d.cross_rank, ModelKind::Dcn),
            ("--cross-structure", self.cross_structure != d.cross_structure, ModelKind::Dcn),
        ];
        if let Some((flag, _, wants)) = given.iter().find(|(_, given, wants)| *given && *wants != self.model) {
            return Err(TrainError::Config(format!("{flag} shapes --model {wants}, and this run trains --model {}: drop {flag} or pass --model {wants}", self.model)));
        }
        match self.model_spec().check() {
            Some(why) => Err(TrainError::Config(why)),
            None => Ok(()),
        }
    }

    /// The host table this run creates: `--dim`, `--table-capacity`, `--table-dtype`, the
    /// sparse optimizer, `--seed`, admission, and the usage section that expiry and
    /// eviction read.
    pub fn table_config(&self) -> TableConfig {
        let mut tc = TableConfig::new(self.row_width() as u32, self.table_capacity);
        tc.seed = self.seed;
        tc.optimizer = self.sparse_optimizer;
        tc.dtype = self.table_dtype;
        tc.init_scale = self.table_init_scale.or((self.model == ModelKind::DeepFm).then_some(DEEPFM_INIT_SCALE));
        tc.track_usage = true;
        tc.admit_after = self.admit_after;
        tc.sketch_bytes = self.admit_sketch_mib.saturating_mul(1 << 20);
        tc
    }

    /// Threads per rank on `topo`: the setting, else cores / ranks on this host.
    pub fn threads_per_rank(&self, topo: &Topology) -> usize {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        self.threads.unwrap_or((cores / topo.local_size).max(1)).max(1)
    }

    /// The host collectives backend on `topo`.
    pub fn backend(&self, topo: &Topology) -> Backend {
        self.backend.unwrap_or_else(|| Backend::auto(topo))
    }

    /// What a checkpoint records and a resume must repeat (flag, value as typed): every
    /// [`Scope::Resumed`] setting — the data and its order, the model's shape, the
    /// optimizers and their learning rates, the table's shape. `data_identity` pins the
    /// training files (each one's identity, in order: [`data::TrainData::identity`]); `rows`
    /// are those of the first. The sub-configuration `weights` is recorded as one entry,
    /// `sample weights`, and only by a weighted run, so that checkpoints of unweighted runs
    /// stay resumable by any version ([`weights::describe`] names every weight flag); a
    /// Parquet input's named columns likewise (`Parquet columns`).
    pub fn resume_settings(&self, data_identity: &str, rows: usize) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        for s in TrainConfig::SETTINGS.iter().filter(|s| s.scope == Scope::Resumed) {
            match s.field {
                "data" => v.extend([("--data", data_identity.to_string()), ("rows of --data", rows.to_string())]),
                "test_fraction" => v.push((s.flag, self.test_fraction().to_string())),
                // The fields' names and modes once the data is open (`Trainer::new`:
                // [`crate::model::pooling::describe_pooling`]); without list fields as given.
                "multi_hot_pooling" => v.push((s.flag, crate::model::pooling::describe_pooling(&[], &[], self.multi_hot_pooling.as_deref()))),
                f => v.push((s.flag, self.show(f).unwrap_or_default())),
            }
        }
        let w = self.weight_config();
        if w.active() {
            v.push(("sample weights", weights::describe(&w)));
        }
        if let Some(columns) = self.parquet_columns() {
            v.push(("Parquet columns", columns));
        }
        v
    }

    /// The weight settings with a schema file's `weight` as `--weight-column NAME` (the
    /// file and the flag are exclusive: [`ColumnSpec::resolve`]).
    pub fn weight_config(&self) -> WeightConfig {
        match self.schema.as_ref().and_then(|_| self.columns().ok()).and_then(|c| c.weight) {
            Some(name) if self.weights.weight_column.is_none() => WeightConfig { weight_column: Some(crate::data::weights::WeightColumn::Name(name)), ..self.weights.clone() },
            _ => self.weights.clone(),
        }
    }

    /// A Parquet input's named columns, from `--schema` or the column flags (exclusive:
    /// [`ColumnSpec::resolve`]).
    pub fn columns(&self) -> Result<ColumnSpec, crate::data::DataError> {
        let weight = self.weights.weight_column.as_ref().and_then(|c| c.name()).map(str::to_string);
        let flags = ColumnSpec::from_flags(self.label_column.clone(), self.dense_columns.clone(), self.sparse_columns.clone(), weight);
        ColumnSpec::resolve(self.schema.as_deref(), flags)
    }

    /// A Parquet input's named columns as flags (`None` when none is named: the schema is
    /// inferred from the files, which `--data`'s identity pins; [`ColumnSpec::describe`]: a
    /// schema file reads as the same flags). Recorded by a checkpoint only when given, so
    /// that older checkpoints stay resumable. A schema file that cannot be read describes
    /// itself as such (the run has refused it already).
    pub fn parquet_columns(&self) -> Option<String> {
        match self.columns() {
            Ok(spec) => spec.describe(),
            Err(e) => Some(format!("({e})")),
        }
    }

    /// Every setting that must be the same on every rank (`Topology::agree_settings`): the
    /// [`Scope::Agreed`] and [`Scope::Resumed`] settings by their flags (the weights' each by
    /// its own), as typed, then the `RINGREC_*` variables that are part of a protocol
    /// (`crate::config::VARIABLES` marked agreed). `--backend` is compared as resolved on
    /// `topo`, `--data`/`--eval-data` with each file's identity, and the compression
    /// settings as the engine has them (`engine`): from the flag, else from the variable,
    /// which the third column then names.
    pub fn settings(&self, topo: &Topology, engine: &EngineConfig) -> Vec<(&'static str, String, String)> {
        let mut v = Vec::new();
        for s in TrainConfig::all_settings().into_iter().filter(|s| !matches!(s.scope, Scope::Free(_))) {
            let typed = self.show(s.field).unwrap_or_default();
            let from_env = |value: String, given: bool| {
                let shown = match s.env.and_then(crate::config::var) {
                    Some(set) if !given => format!("{value} ({}={set})", s.env.unwrap_or_default()),
                    _ => value.clone(),
                };
                (value, shown)
            };
            let (value, shown) = match s.field {
                "data" if self.data.is_empty() => (format!("(the synthetic set of {} rows)", self.synth_rows), typed),
                "data" => (data::describe_inputs("--data", &self.data), typed),
                "eval_data" => (data::describe_inputs("--eval-data", &self.eval_data), typed),
                "backend" => (self.backend(topo).to_string(), typed),
                // The file's columns, not its path: every rank must read the same schema.
                "schema" if self.schema.is_some() => (self.columns().map_or_else(|e| format!("({e})"), |c| format!("{:?}", ColumnSpec { file: None, ..c })), typed),
                "compression" => from_env(engine.compression.name().to_string(), self.compression.is_some()),
                "onebit_lambda" => from_env(engine.onebit_lambda.to_string(), self.onebit_lambda.is_some()),
                "onebit_block" => from_env(engine.onebit_block.to_string(), self.onebit_block.is_some()),
                _ => (typed.clone(), typed),
            };
            v.push((s.flag, value, shown));
        }
        // The agreed variables, as the run has them; those a setting's flag may override
        // (`--compression`: RINGREC_COMPRESSION) are compared with that setting above.
        let covered: Vec<&str> = TrainConfig::all_settings().into_iter().filter_map(|s| s.env).collect();
        for var in crate::config::VARIABLES.iter().filter(|v| v.agreed && !covered.contains(&v.name)) {
            let value = agreed_variable(var.name, topo, engine);
            let shown = crate::config::var(var.name).unwrap_or_else(|| format!("{value} (default)"));
            v.push((var.name, value, shown));
        }
        v
    }
}

/// The value the run has for the agreed variable `name`: what its reader made of it, so
/// that `1` and `true` agree; a variable without a reader here is compared as typed.
fn agreed_variable(name: &str, topo: &Topology, engine: &EngineConfig) -> String {
    let rc = &topo.config;
    let secs = |d: Option<std::time::Duration>| d.map_or(0.0, |d| d.as_secs_f64()).to_string();
    match name {
        "RINGREC_SHM_DIR" => rc.shm_dir.display().to_string(),
        "RINGREC_VERIFY" => rc.verify.to_string(),
        "RINGREC_SHM_CHUNK_BYTES" => rc.shm_chunk_bytes.to_string(),
        "RINGREC_RING_CHUNK_BYTES" => rc.ring_chunk_bytes.to_string(),
        "RINGREC_RANKS_PER_HOST" => rc.ranks_per_host.unwrap_or(0).to_string(),
        "RINGREC_ALLOW_SHARED_GPU" => rc.allow_shared_gpu.to_string(),
        "RINGREC_CACHE_CAPACITY" => engine.cache_capacity.to_string(),
        "RINGREC_AUTOTUNE" => engine.autotune.to_string(),
        "RINGREC_STALL_CHECK_TIME_SECONDS" => secs(engine.stall_check),
        "RINGREC_STALL_SHUTDOWN_TIME_SECONDS" => secs(engine.stall_shutdown),
        _ => crate::config::var(name).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::NOT_SET;

    #[test]
    fn the_model_spec_follows_the_flags_and_refuses_a_flag_of_another_model() {
        let mut c = TrainConfig::defaults();
        assert_eq!(c.model_spec(), ModelSpec::mlp(26, 16, 13, vec![256, 128]));
        assert_eq!(c.row_width(), 16);
        c.set("model", &["deepfm"]).unwrap();
        assert_eq!((c.row_width(), c.table_config().dim), (17, 17));
        c.set("cross_rank", &["4"]).unwrap();
        let e = c.validate_model().unwrap_err().to_string();
        assert!(e.contains("--cross-rank") && e.contains("--model dcn") && e.contains("--model deepfm"), "{e}");
        c.set("model", &["dcn"]).unwrap();
        c.validate_model().unwrap();
        assert_eq!(c.model_spec().cross_rank, 4);
        c.set("cross_layers", &["0"]).unwrap();
        assert!(c.validate_model().unwrap_err().to_string().contains("--cross-layers must be at least 1"));
    }

    #[test]
    fn every_setting_has_a_flag_and_help_and_one_place() {
        let mut flags = std::collections::BTreeSet::new();
        for s in TrainConfig::all_settings() {
            assert!(s.flag.starts_with("--") && s.flag.len() > 2, "{}: flag {:?}", s.field, s.flag);
            assert!(flags.insert(s.flag), "{} is declared twice", s.flag);
            assert!(!s.summary().is_empty(), "{} has no help", s.flag);
        }
        assert!(TrainConfig::all_settings().len() > TrainConfig::SETTINGS.len(), "the weights' settings are the run's too");
    }

    #[test]
    fn defaults_are_those_of_the_command_line() {
        let c = TrainConfig::new(PathBuf::from("/d"));
        assert_eq!((c.batch, c.dim, c.hidden.clone(), c.lr, c.epochs, c.synth_rows, c.eval, c.test_fraction()), (1024, 16, vec![256, 128], 0.001, 1, 200_000, true, 0.1));
        assert_eq!(c.data_dir, PathBuf::from("/d"));
        assert_eq!(c.show("hidden").unwrap(), "256,128");
        assert_eq!(c.show("backend").unwrap(), "auto");
        assert_eq!(c.show("eval").unwrap(), "false", "--no-eval shows whether it was given");
        assert_eq!(c.show("max_steps").unwrap(), NOT_SET);
    }

    #[test]
    fn set_parses_like_the_command_line() {
        let mut c = TrainConfig::new(PathBuf::from("/d"));
        for (field, values) in [("backend", &["ring"][..]), ("eval", &[][..]), ("hidden", &["64", "32"][..]), ("table_max_bytes", &["8M"][..]), ("decay_base", &["e"][..]), ("day_of", &["a,b.tsv=3"][..]), ("compression", &["fp16"][..])] {
            assert!(c.set(field, values).unwrap(), "{field}");
        }
        assert_eq!((c.backend, c.eval, c.hidden.clone(), c.table_max_bytes, c.compression), (Some(Backend::Ring), false, vec![64, 32], Some(8 << 20), Some(Compression::Fp16)));
        assert_eq!(c.weights.decay_base, Some(std::f64::consts::E));
        assert_eq!(c.weights.day_of, vec![(PathBuf::from("a,b.tsv"), 3)]);
        assert_eq!(c.show("day_of").unwrap(), "a,b.tsv=3");
        assert_eq!(c.show("eval").unwrap(), "true");
        assert!(c.set("backend", &["tcp"]).unwrap_err().contains("choose from auto, mpi, ring, shm, hier"));
        assert!(!c.set("nonsense", &["1"]).unwrap());
    }

    #[test]
    fn a_weighted_run_records_every_weight_setting() {
        let d = weights::describe(&WeightConfig { weight_column: Some(crate::data::weights::WeightColumn::Field(2)), ..WeightConfig::default() });
        for s in WeightConfig::SETTINGS {
            assert!(d.contains(s.flag), "`sample weights` ({d}) must record {}", s.flag);
        }
    }

    #[test]
    fn resume_settings_are_the_resumed_scope() {
        let c = TrainConfig::new(PathBuf::from("/d"));
        let r = c.resume_settings("ID", 7);
        let flags: Vec<&str> = r.iter().map(|(k, _)| *k).collect();
        let mut want = vec!["--data", "rows of --data"];
        want.extend(TrainConfig::SETTINGS.iter().filter(|s| s.scope == Scope::Resumed && s.field != "data" && s.field != "weights").map(|s| s.flag));
        assert_eq!(flags, want);
        assert!(r.contains(&("--hidden", "256,128".to_string())) && r.contains(&("--test-fraction", "0.1".to_string())) && r.contains(&("--expire-after-steps", NOT_SET.to_string())));
        let mut w = c.clone();
        w.weights.merge_duplicates = true;
        assert_eq!(w.resume_settings("ID", 7).last().map(|(k, _)| *k), Some("sample weights"));
        let mut p = c.clone();
        p.sparse_columns = vec!["user".into(), "item".into()];
        assert_eq!(p.resume_settings("ID", 7).last(), Some(&("Parquet columns", "--label-column label --dense-columns  --sparse-columns user,item".to_string())));
    }
}
