//! Synchronous data-parallel training of the CTR model (design 003): [`run`] with a
//! [`TrainConfig`], or a [`Trainer`] step by step (`new`, `step`, `evaluate`, `summary`).
//!
//! One step on every rank ([`Trainer::step`]):
//! 1. this rank's slice of the global batch (the same global batches at any rank count),
//!    its keys deduplicated ([`batch::Batch`]);
//! 2. the embedding stage looks the unique keys' rows up in the host-shared table
//!    ([`embedding::EmbeddingStage`]) straight into the dense model's staging slot;
//! 3. the dense model ([`crate::model::DenseModel`], on the CPU or a device) runs forward
//!    and backward; each layer's gradient (already scaled by 1/global batch, so the sum
//!    over ranks is the average) goes to the [`crate::engine`] as soon as backward produced
//!    it (`dense.layer<l>`, last layer first), so its allreduce runs on the engine's thread
//!    while the layers below are back-propagated;
//! 4. meanwhile, on this thread, the embedding stage exchanges the per-key gradients (host
//!    pre-aggregation, leaders allgather, frequency normalisation), the leader applies
//!    them to the table, then the host barrier;
//! 5. the reduced dense gradients come back from the engine; the dense optimizer runs on
//!    every rank (identical inputs, identical replicas).
//!
//! With `--sync-every k > 1` steps 3-5 stay on the rank (or host) and a sync every k steps
//! averages the dense delta and exchanges the tables' row deltas instead ([`sync`]).
//!
//! The data is one or more files trained in order, each cached as a memory-mappable
//! binary as training reaches it, the next one prepared in the background ([`data`]); it
//! defaults to a synthetic Criteo-format file that ringrec generates once.
//!
//! Using a trained model: [`predict`] (the scoring both the evaluation and `ringrec
//! predict` use), [`bundle`] (`ringrec export`'s serving bundle), [`source`] (what
//! `--model` and `--init-from` name), [`warm`] (`train --init-from`).

pub mod batch;
pub mod bundle;
pub mod checkpoint;
pub mod data;
pub mod embedding;
pub mod error;
pub mod metrics;
pub mod phases;
pub mod predict;
pub mod source;
pub mod sync;
pub mod trainer;
pub mod warm;
pub mod weights;

use std::path::PathBuf;

use serde::Serialize;

use crate::comm::device::{Alone, HostCollectives};
use crate::comm::nccl::NcclComm;
use crate::comm::{self, Backend};
use crate::device::{CpuDevice, CudaDevice, Device, HostKernels, HostOptions, Placement};
use crate::data::weights::WeightConfig;
use crate::embedding::{Evict, OptimizerKind, StorageDtype, TableConfig};
use crate::engine::{Compression, DeviceExecutor, Engine, EngineConfig, ExecuteDevice};
use crate::model::DenseOptimizer;
use crate::sparse::{SparseExchange, SparseNormalize};
use crate::topology::Topology;

pub use error::{TrainError, TrainResult};
pub use sync::SyncScope;

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
pub use trainer::{Evaluation, Progress, Trainer};

/// What a training run does (the flags of `ringrec train`).
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// The training inputs — Criteo-format TSVs or prepared `.rrdata` caches, directories,
    /// globs ([`crate::data::inputs`]) — trained in this order; empty: the synthetic
    /// default set.
    pub data: Vec<PathBuf>,
    /// Where the default data set and TSV caches live.
    pub data_dir: PathBuf,
    /// Rows of the default synthetic data set.
    pub synth_rows: u64,
    /// Passes over the training split.
    pub epochs: u64,
    /// Stop after this many global steps (counted from the start of the run, resumed
    /// steps included).
    pub max_steps: Option<u64>,
    /// Global batch (split over the ranks).
    pub batch: usize,
    /// Embedding dimension.
    pub dim: usize,
    /// Hidden layer widths of the MLP.
    pub hidden: Vec<usize>,
    /// Dense learning rate.
    pub lr: f32,
    /// Dense optimizer.
    pub dense_optimizer: DenseOptimizer,
    /// Embedding learning rate.
    pub sparse_lr: f32,
    /// Embedding optimizer (applied by each host leader).
    pub sparse_optimizer: OptimizerKind,
    /// Held-out fraction (the last rows of the data set) when the data is one file and
    /// there is no `eval_data`.
    pub test_fraction: f64,
    /// Seed of the model's initial parameters and embedding rows.
    pub seed: u64,
    /// Shuffle the training rows every epoch (deterministically from the seed).
    pub shuffle: bool,
    /// Host collectives backend (`None`: the best for the topology).
    pub backend: Option<Backend>,
    /// Where the dense model runs.
    pub device: Placement,
    /// Sparse exchange: hierarchical or flat.
    pub sparse_exchange: SparseExchange,
    /// What a key's summed gradient is divided by.
    pub sparse_normalize: SparseNormalize,
    /// Threads per rank (`None`: cores / ranks on this host).
    pub threads: Option<usize>,
    /// Slots of the host-shared embedding table (80% can hold rows).
    pub table_capacity: u64,
    /// Malformed input lines tolerated before stopping.
    pub max_bad_lines: u64,
    /// Write checkpoints here (every `checkpoint_every` steps and at the end).
    pub checkpoint_dir: Option<PathBuf>,
    /// Steps between checkpoints (0: only at the end).
    pub checkpoint_every: u64,
    /// Continue from the checkpoint in `checkpoint_dir`.
    pub resume: bool,
    /// Checkpoints kept (the newest ones; at least 1).
    pub keep_checkpoints: usize,
    /// Write a (periodic) checkpoint only when the dense parameters moved by at least this
    /// relative L2 change since the last one (0: always; design 002's change-gated backup).
    pub checkpoint_min_change: f64,
    /// What a non-finite loss, gradient or parameter does.
    pub nan_policy: NanPolicy,
    /// Evaluate on the held-out rows every this many steps (0: only at the end), with an
    /// interval report (loss, throughput, traffic, AUC/logloss).
    pub eval_every: u64,
    /// Rank 0 writes each interval report as one JSON line here.
    pub metrics_out: Option<PathBuf>,
    /// Stop once the held-out log loss at an `--eval-every` report is at most this.
    pub stop_at_loss: Option<f64>,
    /// Stop once the held-out AUC at an `--eval-every` report is at least this.
    pub stop_at_auc: Option<f64>,
    /// Compression of the dense allreduce (`None`: `RINGREC_COMPRESSION`, else none).
    pub compression: Option<Compression>,
    /// The factor of 1-bit compression's L2 form (`None`: `RINGREC_ONEBIT_LAMBDA`, else 1),
    /// dense and sparse.
    pub onebit_lambda: Option<f32>,
    /// Values per scale of dense 1-bit compression (`None`: `RINGREC_ONEBIT_BLOCK`, else
    /// 256; 0: one scale per tensor).
    pub onebit_block: Option<usize>,
    /// Steps at the start of training whose dense gradients go uncompressed before
    /// `--compression` takes over (0: compressed from the first step; 1-bit Adam's
    /// warmup, DeepSpeed's `freeze_step`): Adam's moments settle on exact gradients first.
    pub compression_warmup: u64,
    /// What a weighted step's loss sum is divided by: the global batch's weight sum (the
    /// weighted mean, default) or its rows.
    pub loss_normalize: weights::LossNormalize,
    /// 1-bit compression of the sparse rows sent across hosts (`None`, `OneBit`,
    /// `OneBitL1`; the hierarchical exchange only).
    pub sparse_compression: Compression,
    /// Keep every step's loss in the summary.
    pub record_losses: bool,
    /// Evaluate on the held-out split at the end.
    pub eval: bool,
    /// Warm start: a new run from this checkpoint directory, export bundle or
    /// sparse-parameter file ([`warm`]).
    pub init_from: Option<PathBuf>,
    /// Dense weights (a bundle's `dense.bin` layout) to go with an `init_from` that is a
    /// sparse-parameter file.
    pub init_dense: Option<PathBuf>,
    /// The held-out inputs (the syntax of `data`); when given, the training data is not
    /// split.
    pub eval_data: Vec<PathBuf>,
    /// Whether `test_fraction` was asked for (`--test-fraction`), not the default: an
    /// error with several training files or with `eval_data`.
    pub test_fraction_given: bool,
    /// Storage of the table's rows (arithmetic is f32 either way).
    pub table_dtype: StorageDtype,
    /// Largest size of the host table file: growth stops there and eviction starts
    /// (`None`: half of what the shared-memory directory has free at the start, shared
    /// among the hosts of a machine).
    pub table_max_bytes: Option<u64>,
    /// A key gets its own row in the K-th step that holds it (1: at once).
    pub admit_after: u32,
    /// MiB of the count-min sketch that counts the steps of keys not admitted yet.
    pub admit_sketch_mib: u64,
    /// Remove rows not updated for this many steps.
    pub expire_after_steps: Option<u64>,
    /// Which rows go when the table at its largest size needs room.
    pub evict: Evict,
    /// Synchronise every this many steps (1: every step, fully synchronous; k > 1: local
    /// SGD, [`sync`]).
    pub sync_every: u64,
    /// Who trains together between syncs (with `sync_every` > 1).
    pub sync_scope: SyncScope,
    /// Per-sample weights: time decay, merged duplicates, dropped light rows
    /// ([`crate::data::weights`]; the default weighs every row 1).
    pub weights: WeightConfig,
}

impl TrainConfig {
    /// The defaults of `ringrec train`, with the data under `data_dir`.
    pub fn new(data_dir: PathBuf) -> TrainConfig {
        TrainConfig {
            data: Vec::new(),
            data_dir,
            synth_rows: 200_000,
            epochs: 1,
            max_steps: None,
            batch: 1024,
            dim: 16,
            hidden: vec![256, 128],
            lr: 0.001,
            dense_optimizer: DenseOptimizer::Adam,
            sparse_lr: 0.05,
            sparse_optimizer: OptimizerKind::Sgd,
            test_fraction: 0.1,
            seed: 1,
            shuffle: false,
            backend: None,
            device: Placement::Auto,
            sparse_exchange: SparseExchange::Hierarchical,
            sparse_normalize: SparseNormalize::Frequency,
            threads: None,
            table_capacity: 1 << 21,
            max_bad_lines: crate::data::criteo::DEFAULT_MAX_BAD_LINES,
            checkpoint_dir: None,
            checkpoint_every: 0,
            resume: false,
            keep_checkpoints: 2,
            checkpoint_min_change: 0.0,
            nan_policy: NanPolicy::Stop,
            eval_every: 0,
            metrics_out: None,
            stop_at_loss: None,
            stop_at_auc: None,
            compression: None,
            onebit_lambda: None,
            sparse_compression: Compression::None,
            onebit_block: None,
            compression_warmup: 0,
            loss_normalize: weights::LossNormalize::Weights,
            record_losses: false,
            eval: true,
            init_from: None,
            init_dense: None,
            eval_data: Vec::new(),
            test_fraction_given: false,
            table_dtype: StorageDtype::F32,
            table_max_bytes: None,
            admit_after: 1,
            admit_sketch_mib: crate::embedding::admit::DEFAULT_SKETCH_BYTES >> 20,
            expire_after_steps: None,
            evict: Evict::Lru,
            sync_every: 1,
            sync_scope: SyncScope::Rank,
            weights: WeightConfig::default(),
        }
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
        if self.loss_normalize != weights::LossNormalize::Weights && !self.weights.active() {
            return Err(TrainError::Config(format!("--loss-normalize {} chooses how a weighted loss is averaged, and every sample of this run weighs 1: add --decay-base or --merge-duplicates, or drop --loss-normalize", self.loss_normalize)));
        }
        if self.batch == 0 || self.dim == 0 || self.hidden.contains(&0) {
            return Err(TrainError::Config("--batch, --dim and every --hidden width must be positive".into()));
        }
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
        if !(0.0..1.0).contains(&self.test_fraction) {
            return Err(TrainError::Config(format!("--test-fraction must be in [0, 1), got {}", self.test_fraction)));
        }
        if self.keep_checkpoints == 0 {
            return Err(TrainError::Config("--keep-checkpoints must be at least 1 (the newest checkpoint is always kept)".into()));
        }
        if !(self.checkpoint_min_change.is_finite() && self.checkpoint_min_change >= 0.0) {
            return Err(TrainError::Config(format!("--checkpoint-min-change must be a finite value >= 0 (a relative change, e.g. 0.05), got {}", self.checkpoint_min_change)));
        }
        if self.test_fraction_given && !self.eval_data.is_empty() {
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
        if self.init_dense.is_some() && self.init_from.is_none() {
            return Err(TrainError::Config("--init-dense needs --init-from (the sparse-parameter file of the table it goes with)".into()));
        }
        self.validate_sync()?;
        self.validate_table()
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
            _ if self.weights.active() => refuse("sample weights (--decay-base, --merge-duplicates, --weight-column) are not combined with local steps yet: drop them, or use --sync-every 1"),
            _ if self.sparse_normalize == SparseNormalize::Weighted => refuse("--sparse-normalize weighted weighs the ranks of every step, which local steps do not share: use frequency, or --sync-every 1"),
            _ if self.expire_after_steps.is_some() => refuse("--expire-after-steps removes rows by each step's global keys, which local steps do not have: drop it, or use --sync-every 1"),
            _ => Ok(()),
        }
    }

    /// The table flags' own checks: `--admit-after` and its sketch, `--expire-after-steps`,
    /// and an explicit `--table-max-bytes` that holds at least the initial table.
    pub fn validate_table(&self) -> TrainResult<()> {
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

    /// The host table this run creates: `--dim`, `--table-capacity`, `--table-dtype`, the
    /// sparse optimizer, `--seed`, admission, and the usage section that expiry and
    /// eviction read.
    pub fn table_config(&self) -> TableConfig {
        let mut tc = TableConfig::new(self.dim as u32, self.table_capacity);
        tc.seed = self.seed;
        tc.optimizer = self.sparse_optimizer;
        tc.dtype = self.table_dtype;
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

    /// What a checkpoint records and a resume must repeat (flag, value): the data and its
    /// order, the model's shape, the optimizers and their learning rates, the table's
    /// shape. `--epochs`, `--max-steps`, the backends, the checkpoint flags and the rank
    /// count may change between runs. `data_identity` pins the training files (each one's
    /// identity, in order: [`data::TrainData::identity`]); `rows` are those of the first.
    /// `--eval-data` may change.
    pub fn resume_settings(&self, data_identity: &str, rows: usize) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("--data", data_identity.to_string()),
            ("rows of --data", rows.to_string()),
            ("--batch", self.batch.to_string()),
            ("--dim", self.dim.to_string()),
            ("--hidden", format!("{:?}", self.hidden)),
            ("--lr", self.lr.to_string()),
            ("--dense-optimizer", self.dense_optimizer.to_string()),
            ("--sparse-lr", self.sparse_lr.to_string()),
            ("--sparse-optimizer", self.sparse_optimizer.to_string()),
            ("--seed", self.seed.to_string()),
            ("--shuffle", self.shuffle.to_string()),
            ("--test-fraction", self.test_fraction.to_string()),
            ("--sparse-normalize", self.sparse_normalize.to_string()),
            ("--table-capacity", self.table_capacity.to_string()),
            ("--table-dtype", self.table_dtype.to_string()),
            ("--table-max-bytes", self.table_max_bytes.map_or("auto".into(), |b| b.to_string())),
            ("--admit-after", self.admit_after.to_string()),
            ("--admit-sketch-mib", self.admit_sketch_mib.to_string()),
            ("--expire-after-steps", format!("{:?}", self.expire_after_steps)),
            ("--evict", self.evict.to_string()),
        ];
        // Only a weighted run records it: checkpoints of unweighted runs stay resumable.
        if self.weights.active() {
            v.push(("sample weights", weights::describe(&self.weights)));
            if self.loss_normalize != weights::LossNormalize::Weights {
                v.push(("--loss-normalize", self.loss_normalize.to_string()));
            }
        }
        v
    }

    /// Every setting that must be the same on every rank (`Topology::agree_settings`),
    /// by its flag or variable: what shapes the model, the data and their order, the
    /// optimizers, checkpoints, the backends, and the engine's and the runtime's knobs
    /// that are part of a protocol. Free to differ: `--threads`, `--json`,
    /// `--no-progress`, `--record-losses`, `--metrics-out` (rank 0's is written),
    /// `--data-dir` (each host's cache location),
    /// `RINGREC_TIMELINE` and the engine's fusion threshold and cycle time (rank 0's are
    /// used), `RINGREC_COMM_TIMEOUT_SECONDS`, `RINGREC_LOG_SPARSE`, `RINGREC_FAULT_EXIT`.
    pub fn settings(&self, topo: &Topology, engine: &EngineConfig) -> Vec<(&'static str, String)> {
        let rc = &topo.config;
        vec![
            ("--data", if self.data.is_empty() { format!("(the synthetic set of {} rows)", self.synth_rows) } else { data::describe_inputs("--data", &self.data) }),
            ("--synth-rows", self.synth_rows.to_string()),
            ("--epochs", self.epochs.to_string()),
            ("--max-steps", format!("{:?}", self.max_steps)),
            ("--batch", self.batch.to_string()),
            ("--dim", self.dim.to_string()),
            ("--hidden", format!("{:?}", self.hidden)),
            ("--lr", self.lr.to_string()),
            ("--dense-optimizer", self.dense_optimizer.to_string()),
            ("--sparse-lr", self.sparse_lr.to_string()),
            ("--sparse-optimizer", self.sparse_optimizer.to_string()),
            ("--test-fraction", self.test_fraction.to_string()),
            ("--seed", self.seed.to_string()),
            ("--shuffle", self.shuffle.to_string()),
            ("--backend", self.backend(topo).to_string()),
            ("--device", self.device.to_string()),
            ("--sparse-exchange", self.sparse_exchange.to_string()),
            ("--sparse-normalize", self.sparse_normalize.to_string()),
            ("--table-capacity", self.table_capacity.to_string()),
            ("--max-bad-lines", self.max_bad_lines.to_string()),
            ("--checkpoint-dir", format!("{:?}", self.checkpoint_dir)),
            ("--checkpoint-every", self.checkpoint_every.to_string()),
            ("--resume", self.resume.to_string()),
            ("--keep-checkpoints", self.keep_checkpoints.to_string()),
            ("--checkpoint-min-change", self.checkpoint_min_change.to_string()),
            ("--nan-policy", self.nan_policy.to_string()),
            ("--eval-every", self.eval_every.to_string()),
            ("--stop-at-loss", format!("{:?}", self.stop_at_loss)),
            ("--stop-at-auc", format!("{:?}", self.stop_at_auc)),
            ("--no-eval", (!self.eval).to_string()),
            ("RINGREC_SHM_DIR", rc.shm_dir.display().to_string()),
            ("RINGREC_VERIFY", rc.verify.to_string()),
            ("RINGREC_SHM_CHUNK_BYTES", rc.shm_chunk_bytes.to_string()),
            ("RINGREC_RING_CHUNK_BYTES", rc.ring_chunk_bytes.to_string()),
            ("RINGREC_RANKS_PER_HOST", format!("{:?}", rc.ranks_per_host)),
            ("RINGREC_ALLOW_SHARED_GPU", rc.allow_shared_gpu.to_string()),
            ("RINGREC_CACHE_CAPACITY", engine.cache_capacity.to_string()),
            ("RINGREC_COMPRESSION", format!("{:?}", engine.compression)),
            ("RINGREC_ONEBIT_LAMBDA", engine.onebit_lambda.to_string()),
            ("RINGREC_ONEBIT_BLOCK", engine.onebit_block.to_string()),
            ("--compression-warmup", self.compression_warmup.to_string()),
            ("--loss-normalize", self.loss_normalize.to_string()),
            ("--sparse-compression", self.sparse_compression.name().to_string()),
            ("RINGREC_AUTOTUNE", engine.autotune.to_string()),
            ("RINGREC_STALL_CHECK_TIME_SECONDS", format!("{:?}", engine.stall_check)),
            ("RINGREC_STALL_SHUTDOWN_TIME_SECONDS", format!("{:?}", engine.stall_shutdown)),
            ("--init-from", format!("{:?}", self.init_from)),
            ("--init-dense", format!("{:?}", self.init_dense)),
            ("--eval-data", data::describe_inputs("--eval-data", &self.eval_data)),
            ("--test-fraction given", self.test_fraction_given.to_string()),
            ("--table-dtype", self.table_dtype.to_string()),
            ("--table-max-bytes", self.table_max_bytes.map_or("auto".into(), |b| b.to_string())),
            ("--admit-after", self.admit_after.to_string()),
            ("--admit-sketch-mib", self.admit_sketch_mib.to_string()),
            ("--expire-after-steps", format!("{:?}", self.expire_after_steps)),
            ("--evict", self.evict.to_string()),
            ("--sync-every", self.sync_every.to_string()),
            ("--sync-scope", self.sync_scope.to_string()),
            ("sample weights", weights::describe(&self.weights)),
        ]
    }
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
    /// The host collectives backend (start-up broadcasts, evaluation; the engine's for
    /// host tensors).
    pub backend: String,
    /// Where the dense model ran: `cpu`, or the device's name.
    pub device: String,
    /// Sparse exchange.
    pub sparse_exchange: String,
    /// Sparse normalisation.
    pub sparse_normalize: String,
    /// Training rows.
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
    /// MLP forward+backward GFLOP/s on rank 0 (CPU device; 0 on a GPU, whose step only
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
    /// Checkpoints written by this run (rank 0).
    pub checkpoints_written: u64,
    /// Periodic checkpoints not written because the parameters moved less than
    /// `--checkpoint-min-change` (rank 0).
    pub checkpoints_skipped: u64,
    /// Updates skipped under `--nan-policy skip-step` (dense and sparse halves counted
    /// apart: `dense`, `sparse`).
    pub nan_skips: std::collections::BTreeMap<String, u64>,
    /// Every step's global mean loss (with `record_losses`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub losses: Vec<f64>,
    /// Storage dtype of the table's rows.
    pub table_dtype: String,
    /// Slots of the host table at the end.
    pub table_capacity: u64,
    /// Bytes of the host table file at the end (one per host).
    pub table_bytes: u64,
    /// Largest size the table may grow to (`--table-max-bytes`, or what the shared-memory
    /// directory allowed).
    pub table_max_bytes: u64,
    /// Times the table grew in this run.
    pub table_growths: u64,
    /// Seconds rank 0's host leader spent building grown tables in this run (sum).
    pub table_growth_seconds: f64,
    /// The longest of those growths (seconds).
    pub table_growth_max_seconds: f64,
    /// Rows inserted in this run.
    pub table_inserted: u64,
    /// Rows evicted in this run (the table at its largest size needed room).
    pub table_evictions: u64,
    /// Rows expired in this run (`--expire-after-steps`).
    pub table_expirations: u64,
    /// Gradient rows dropped in this run because their key had no row: not admitted yet
    /// (`--admit-after`), or no room at the largest size.
    pub table_refused: u64,
    /// Bytes of the admission sketch (0 without `--admit-after`).
    pub admission_sketch_bytes: u64,
    /// Why the run ended before its last step: a `--stop-at-loss` / `--stop-at-auc` target
    /// reached at an `--eval-every` report (every rank stops after that step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_at_target: Option<StopTarget>,
    /// Every rank's sparse-exchange bytes in this run, by direction, inside its host and
    /// across hosts (counted where the bytes are written and read; the sums of `sent` and
    /// `received` over the ranks are equal).
    pub sparse_traffic_per_rank: Vec<RankTraffic>,
    /// Sparse-exchange bytes sent across hosts by all ranks, per sample trained.
    pub sparse_cross_host_bytes_per_sample: f64,
    /// Compression of the dense allreduce (`none`, `fp16`, `bf16`, `1bit`, `1bit-l1`).
    pub dense_compression: String,
    /// Bytes of dense tensors each rank reduced per step (as float32).
    pub dense_bytes_per_step: f64,
    /// Bytes each rank put on the wire for them per step (after compression; 1-bit: the
    /// encodings, 1/32 of the float32 bytes plus 4 bytes of scale per tensor).
    pub dense_wire_bytes_per_step: f64,
    /// Every rank's dense bytes in this run (the engine's collectives and, with
    /// `--sync-scope host`, the per-step host allreduces) by direction, inside its host and
    /// across hosts: as counted by ringrec's own backends ([`crate::comm::count`]; no
    /// agreement headers), else as modelled (`dense_traffic_source` says which).
    pub dense_traffic_per_rank: Vec<RankTraffic>,
    /// `counted` (every rank's backends counted every dense collective) or `model` (MPI's
    /// or NCCL's collectives, or one left to MPI's own algorithm: 1-bit's allgather on
    /// `ring` or across the hosts of `hier`).
    pub dense_traffic_source: String,
    /// The same bytes from each collective's wire bytes and the backend's algorithm (the
    /// stated model of [`crate::comm::traffic`]), whatever the source.
    pub dense_traffic_model_per_rank: Vec<RankTraffic>,
    /// The backend whose algorithm `dense_traffic_model_per_rank` follows.
    pub dense_traffic_model: String,
    /// Collectives the engine ran on each rank (a fused one counts once): the counted and
    /// the modelled traffic differ by less than 16 bytes per collective, rank and direction
    /// (parts rounded to whole elements).
    pub dense_collectives: u64,
    /// Bytes sent across hosts by all ranks, dense and sparse, per sample trained.
    pub cross_host_bytes_per_sample: f64,
    /// Compression of the sparse rows sent across hosts (`none`, `1bit`, `1bit-l1`).
    pub sparse_compression: String,
    /// Keys whose 1-bit residual rank 0 keeps (`--sparse-compression`).
    pub sparse_compression_residual_rows: u64,
    /// `--sync-every` (1: every step).
    pub sync_every: u64,
    /// `--sync-scope`.
    pub sync_scope: String,
    /// Syncs in this run: one per step with `--sync-every 1`.
    pub syncs: u64,
    /// Allreduces of the dense model over the world: the gradient every step with
    /// `--sync-every 1`, else the delta at every sync (each `dense_param_bytes`, plus a
    /// value).
    pub dense_world_allreduces: u64,
    /// Bytes of the dense parameters (f32).
    pub dense_param_bytes: u64,
    /// Table rows the hosts updated between syncs, summed over hosts and syncs
    /// (`--sync-every` > 1).
    pub sync_touched_rows: u64,
    /// Of those, the rows whose zero-filtered delta was sent (the others did not change).
    pub sync_delta_rows: u64,
    /// Bytes the sparse delta exchanges sent across hosts, summed over the ranks (part of
    /// `sparse_traffic_per_rank`).
    pub sync_delta_cross_bytes_sent: u64,
    /// Bytes the sparse delta exchanges received across hosts, summed over the ranks.
    pub sync_delta_cross_bytes_received: u64,
    /// With `--sync-every` k > 1 or `--sparse-compression`, each host's table rows at the end, as a CRC-32 of every
    /// live key and its row in key order (hex, host order): all equal when the hosts hold
    /// the same rows. Empty strings with k = 1 (the tables are byte-identical files).
    pub table_rows_crc_per_host: Vec<String>,
    /// Every rank's `params_fnv` (rank order): all equal, as the replicas are.
    pub params_fnv_per_rank: Vec<String>,
    /// Training rows left out for weighing less than `--min-sample-weight` (after merging;
    /// over the files opened).
    pub samples_dropped_by_weight: u64,
    /// Training rows merged into an identical earlier row of their file
    /// (`--merge-duplicates`).
    pub samples_merged: u64,
    /// `--weight-column`: the field of each line that held its sample's weight (`None`:
    /// no weight column).
    pub weight_column: Option<u32>,
}

/// One rank's traffic, by direction.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RankTraffic {
    /// World rank.
    pub rank: usize,
    /// Its host (0-based).
    pub host: usize,
    /// Bytes sent to ranks of its own host.
    pub intra_host_sent: u64,
    /// Bytes received from ranks of its own host.
    pub intra_host_received: u64,
    /// Bytes sent to ranks of other hosts.
    pub cross_host_sent: u64,
    /// Bytes received from ranks of other hosts.
    pub cross_host_received: u64,
}

/// A `--stop-at-*` target reached.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StopTarget {
    /// The global step after which every rank stopped.
    pub step: u64,
    /// The flag and its value (`--stop-at-auc 0.75`).
    pub target: String,
    /// The held-out value that reached it.
    pub value: f64,
}

/// Trains as `cfg` says on every rank of `topo` (collective), calling `progress` on every
/// rank after each step (each rank's own view: a display shows rank 0's, `--progress-dir`
/// writes every rank's); returns the summary.
pub fn run(topo: &Topology, cfg: &TrainConfig, progress: &mut dyn FnMut(&Progress)) -> TrainResult<TrainSummary> {
    let engine = cfg.engine_config(topo)?;
    let cfg = &TrainConfig { onebit_lambda: Some(engine.onebit_lambda), ..cfg.clone() };
    topo.agree_settings(&cfg.settings(topo, &engine))?;
    cfg.validate()?;
    let threads = cfg.threads_per_rank(topo);
    let _ = rayon::ThreadPoolBuilder::new().num_threads(threads).build_global();
    let mut placement = topo.agree(cfg.device.resolve(topo.machine_local_rank, topo.size).map_err(|e| format!("rank {}: {e}", topo.rank)))?;
    let mut gpu = None;
    if let Placement::Cuda(ordinal) = placement {
        // NCCL cannot run two ranks of a job on one GPU.
        gpu = rank_gpu(topo, cfg.device, ordinal.unwrap_or(0), true)?;
        if gpu.is_none() {
            placement = Placement::Cpu;
        }
    }
    match placement {
        Placement::HostKernels => {
            let options = topo.agree(HostOptions::from_env(topo.rank))?;
            let dev = topo.agree(HostKernels::with_options(options).map_err(|e| format!("rank {}: {e}", topo.rank)))?;
            let coll = HostCollectives::new(comm::build_tagged(cfg.backend(topo), topo, "device")?);
            let exec = DeviceExecutor::new(dev.fork()?, coll);
            drive(topo, cfg, dev, Engine::start_with_device(topo, &engine, Some(Box::new(exec)))?, progress)
        }
        Placement::Cuda(_) => {
            let dev = gpu.ok_or_else(|| TrainError::Config("internal: the GPU placement has no device".into()))?;
            let queue = dev.fork()?;
            let exec: Box<dyn ExecuteDevice> = if topo.size == 1 {
                // One rank: nothing to reduce, so no NCCL (nor libnccl) needed.
                Box::new(DeviceExecutor::new(queue, Alone))
            } else {
                let nccl = NcclComm::new(topo, &queue).map_err(|e| TrainError::Config(format!("rank {} joining the NCCL communicator: {e}", topo.rank)))?;
                Box::new(DeviceExecutor::new(queue, nccl))
            };
            if topo.rank == 0 {
                crate::eprint_line(&format!("ringrec: dense model on {}", dev.describe()));
            }
            drive(topo, cfg, dev, Engine::start_with_device(topo, &engine, Some(exec))?, progress)
        }
        Placement::Cpu | Placement::Auto => {
            let engine = Engine::start(topo, &engine)?;
            on_pool(|| drive(topo, cfg, CpuDevice::new(threads), engine, progress))
        }
    }
}

/// This rank's GPU `ordinal`, opened on every rank before any waits in NCCL's start-up.
/// Ranks of a machine on one physical GPU (every rank's pick is gathered, so every rank
/// decides alike): under `--device auto` (`asked`) every rank goes to the CPU instead
/// (`None`, with a note on rank 0), as without a GPU, so `train` and `predict` always
/// agree on the device; under `--device cuda` they are refused when `exclusive` (NCCL).
pub(crate) fn rank_gpu(topo: &Topology, asked: Placement, ordinal: usize, exclusive: bool) -> TrainResult<Option<CudaDevice>> {
    let dev = topo.agree(CudaDevice::new(ordinal).map_err(|e| format!("rank {} on GPU {ordinal} of {}: {e}", topo.rank, topo.hostname)))?;
    if !exclusive && asked != Placement::Auto {
        return Ok(Some(dev));
    }
    let bus = dev.pci_bus_id().unwrap_or_else(|e| format!("unknown to rank {} ({e})", topo.rank));
    match crate::device::select::check_distinct(topo, &bus, topo.config.allow_shared_gpu) {
        Ok(()) => Ok(Some(dev)),
        Err(e @ crate::device::DeviceError::SharedGpu { .. }) if asked == Placement::Auto => {
            if topo.rank == 0 {
                crate::eprint_line(&format!("ringrec: --device auto: {e}; running on the CPU (--device cuda refuses instead)"));
            }
            Ok(None)
        }
        Err(e) => Err(TrainError::Config(e.to_string())),
    }
}

/// Runs `f` on a worker of the rayon pool, so the CPU device's parallel regions fork from
/// a thread that takes part in them (a caller outside the pool would sleep and be woken at
/// each of a step's dozen regions: measured 4-5% of a 2-thread step).
fn on_pool<R: Send>(f: impl FnOnce() -> R) -> R {
    /// The caller's closure, run by one pool worker while the caller waits for it.
    struct WhileCallerWaits<F>(F);
    // SAFETY: the closure's captures (the topology's MPI communicators, the engine's handle)
    // are used by one thread at a time: the pool worker while this thread waits in
    // `rayon::scope`, as in a plain call; MPI runs with MPI_THREAD_MULTIPLE (as for the
    // engine's thread), and nothing captured is thread-local. The type is local to this
    // function: nothing else can send a value with it.
    unsafe impl<F> Send for WhileCallerWaits<F> {}
    let f = WhileCallerWaits(f);
    rayon::scope(move |_| {
        let f = f;
        (f.0)()
    })
}

/// Steps a trainer on `dev` to the end, checkpointing as configured, then evaluates.
///
/// A failed step leaves its trainer undropped: dropping it would shut the engine down,
/// which waits for every rank's engine — and after a failure a peer may be dead or stuck,
/// so the error must reach the caller first. The process is expected to end after an
/// error (the shared segments' names are already gone, nothing is left behind).
fn drive<D: Device>(topo: &Topology, cfg: &TrainConfig, dev: D, engine: Engine, progress: &mut dyn FnMut(&Progress)) -> TrainResult<TrainSummary> {
    let mut t = Trainer::new(topo, cfg, dev, engine)?;
    progress(&t.progress());
    loop {
        match t.step() {
            Ok(true) => progress(&t.progress()),
            Ok(false) => return t.summary(),
            // Every rank stops after the same step: the normal teardown is safe.
            Err(e @ (TrainError::Stopped { .. } | TrainError::NonFinite { .. })) => return Err(e),
            Err(e) => {
                std::mem::forget(t);
                return Err(e);
            }
        }
    }
}
