//! [`Trainer`]: a training run on one rank, step by step — [`Trainer::new`] (data, model,
//! table, resume), [`Trainer::step`], [`Trainer::evaluate`], [`Trainer::summary`]. See the
//! module docs of [`crate::train`] for what a step does. The trainer speaks to its peers
//! through the engine (the dense tensors), the collectives backend (start-up and evaluation
//! data) and the control channel ([`crate::control`]: every scalar agreement). Beside this
//! file: [`super::checkpointing`] (resume, a step's checkpoint), [`super::report`] (the
//! `--eval-every` reports), [`super::summary`] and [`super::traffic`] (the run's summary),
//! [`super::fault`] (`RINGREC_FAULT_*`), [`super::prefetch`] (`--pipeline`: the next
//! step's batch read while a step runs, and the waits that remain).

use std::time::Instant;

use super::batch::Batch;
use super::checkpointing::resume;
use super::data::{self, TrainData};
use super::embedding::{EmbeddingStage, Held};
use super::fault::Faults;
use super::gpu_cache::{GpuCache, GpuCacheMode, TableAt};
use super::phases::{DeviceWait, PhaseTimer};
use super::predict;
use super::prefetch::{Ahead, Prefetcher};
use super::report::Mark;
use super::sync::LocalSgd;
use super::table_caches::TableCaches;
use super::tables::Tables;
use super::weights::{self, BatchWeights};
use super::metrics::Evaluation;
use super::{NanPolicy, StopTarget, TrainConfig, TrainError, TrainResult};
use crate::comm::{self, Collectives, CollectivesExt};
use crate::data::{shard, EvalSet};
use crate::device::Device;
use crate::dtype::ReduceOp;
use crate::engine::{Engine, Handle};
use crate::model::{DenseModel, DenseOptimState, Part};
use crate::sparse::{SparseNormalize, SparseStats};
use crate::tensor::Tensor;
use crate::topology::Topology;

/// Where a run is: global steps done, and the epoch and step within it of the next step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Position {
    /// Global steps completed (resumed steps included).
    pub step: u64,
    /// Epoch of the next step.
    pub epoch: u64,
    /// Step within that epoch.
    pub in_epoch: u64,
}

/// What the progress display shows after a step (rank 0).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Progress {
    /// Global steps completed.
    pub step: u64,
    /// Steps the run will have completed at its end.
    pub total_steps: u64,
    /// Epoch of the last recorded loss.
    pub epoch: u64,
    /// The last recorded global mean loss.
    pub loss: Option<f64>,
    /// Samples per second so far (all ranks, training time only).
    pub samples_per_sec: f64,
    /// Samples this rank trained on in this run (its share of every global batch).
    pub samples: u64,
    /// The held-out AUC of the last `--eval-every` report (rank 0).
    pub eval_auc: Option<f64>,
}

/// A step whose loss is still to be read: read after the next batch is staged, so on a
/// device the staging overlaps the step's tail.
#[derive(Clone, Copy)]
pub(super) struct Unread {
    /// What the global loss sum is divided by: the global batch, or its weight sum.
    pub(super) divisor: f64,
    pub(super) epoch: u64,
    /// The step it belongs to (1-based).
    pub(super) step: u64,
}

/// Losses of the run.
#[derive(Default)]
pub(super) struct Losses {
    /// The epoch `epoch` is summed over.
    pub(super) epoch: u64,
    /// Sum of the epoch's step losses.
    pub(super) sum: f64,
    /// Steps summed.
    pub(super) steps: u64,
    /// Every step's loss (with `record_losses`).
    pub(super) all: Vec<f64>,
    /// Sum and count of the losses recorded since the last interval report.
    pub(super) interval_sum: f64,
    pub(super) interval_steps: u64,
}

/// Totals over the steps this run took on this rank.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) steps: u64,
    pub(super) samples: u64,
    /// Samples of every rank (the global batches of the steps taken).
    pub(super) global_samples: u64,
    /// Steps whose batch was read ahead (`--pipeline`).
    pub(super) prefetched: u64,
    pub(super) checkpoints_written: u64,
    pub(super) checkpoints_skipped: u64,
    pub(super) nan_skips_dense: u64,
    pub(super) intra_bytes: f64,
    pub(super) cross_bytes: f64,
}

/// Steps between the ranks' checks for a stop signal (SIGTERM, SIGINT, SIGUSR1): a signal
/// stops the job within this many steps.
pub const SIGNAL_CHECK_EVERY: u64 = 16;

/// A training run on one rank (see the module docs).
pub struct Trainer<'a, D: Device> {
    pub(super) topo: &'a Topology,
    pub(super) cfg: &'a TrainConfig,
    pub(super) data: TrainData,
    /// What a checkpoint records and a resume must repeat.
    pub(super) resume_settings: Vec<(&'static str, String)>,
    /// Rank 0, with `--checkpoint-min-change`: the parameters of the last checkpoint.
    pub(super) last_saved: Option<Vec<f32>>,
    /// The bulk data outside the step: the start-up broadcasts of the parameters and the
    /// optimizer's moments, evaluation's gather (scalars go through `topo.control()`).
    pub(super) coll: Box<dyn Collectives>,
    pub(super) engine: Engine,
    pub(super) model: DenseModel<D>,
    pub(super) embedding: EmbeddingStage,
    pub(super) batch: Batch,
    pub(super) position: Position,
    /// Global batches in an epoch, once every training file is open.
    pub(super) steps_per_epoch: Option<u64>,
    /// Steps the run will have completed at its end (estimated while `steps_per_epoch`
    /// is not known).
    pub(super) total_steps: u64,
    pub(super) unread: Option<Unread>,
    pub(super) losses: Losses,
    pub(super) progress: Progress,
    pub(super) phases: PhaseTimer,
    /// The time the device waited for the host between steps (`gpu_wait`).
    pub(super) device_wait: DeviceWait<D::Mark>,
    /// `--pipeline`: the thread reading the next step's batch ([`super::prefetch`]).
    pub(super) prefetch: Option<Prefetcher>,
    pub(super) counters: Counters,
    pub(super) started: Instant,
    /// Seconds spent in evaluations during training (not training time).
    pub(super) eval_seconds: f64,
    /// The counters at the last interval report.
    pub(super) mark: Mark,
    /// The last evaluation: its step and result on rank 0 (`None` elsewhere).
    pub(super) last_eval: Option<(u64, Option<Evaluation>)>,
    /// A `--stop-at-*` target reached (the same on every rank): the run ends after its step.
    pub(super) stopped: Option<StopTarget>,
    /// Rank 0's `--metrics-out` file.
    pub(super) metrics: Option<std::io::BufWriter<std::fs::File>>,
    /// `--sync-every` k > 1: lazy synchronisation ([`super::sync`]).
    pub(super) local: Option<LocalSgd>,
    /// `RINGREC_FAULT_*` on this rank ([`super::fault`]).
    pub(super) faults: Faults,
    /// `--init-from`: what the run started from.
    pub(super) warm_from: Option<super::warm::WarmFrom>,
    /// Rank 0: the checkpoint being written in the background ([`super::checkpointing`]).
    pub(super) writing: Option<super::checkpointing::InFlight>,
    /// Rank 0: a background checkpoint was refused for want of memory (said once).
    pub(super) snapshot_refused: bool,
    /// The GPU hot-row cache (`--gpu-cache-mib`; [`super::gpu_cache`]).
    pub(super) gpu_cache: Option<GpuCache<D>>,
    /// `--table`: the named tables beside `embedding` ([`super::tables`]).
    pub(super) tables: Option<Tables>,
    /// `--table` with `--gpu-cache-mib`: a hot-row cache per table
    /// ([`super::table_caches`]; `gpu_cache` is then `None`).
    pub(super) table_caches: Option<TableCaches<D>>,
}

/// The run's GPU hot-row caches: the default table's, or one per `--table` table.
type Caches<D> = (Option<GpuCache<D>>, Option<TableCaches<D>>);

/// The GPU hot-row caches of the run: one per `--table` table (stated on rank 0's first
/// lines) or, without tables, the default table's ([`open_gpu_cache`]).
fn open_caches<D: Device>(topo: &Topology, cfg: &TrainConfig, model: &DenseModel<D>, embedding: &mut EmbeddingStage, tables: Option<&mut Tables>) -> TrainResult<Caches<D>> {
    let Some(t) = tables else {
        return Ok((open_gpu_cache(topo, cfg, model, embedding)?, None));
    };
    let caches = TableCaches::open(cfg, model, embedding, t)?;
    if let (Some(c), 0) = (&caches, topo.rank) {
        let mib = c.bytes() as f64 / (1u64 << 20) as f64;
        crate::eprint_line(&format!("ringrec: GPU hot-row cache: {} slots ({mib:.1} MiB) per rank over the --table tables, keys chosen every {} steps, write-through (--gpu-cache-mib, --gpu-cache-refresh)", c.capacity(), cfg.gpu_cache_refresh));
    }
    Ok((None, caches))
}

/// The run's GPU hot-row cache on `model`'s device, if it has one (its size said once, by
/// rank 0).
fn open_gpu_cache<D: Device>(topo: &Topology, cfg: &TrainConfig, model: &DenseModel<D>, embedding: &EmbeddingStage) -> TrainResult<Option<GpuCache<D>>> {
    let table = embedding.table().table();
    let slots = super::gpu_cache::cache_slots(cfg, table);
    if slots == 0 {
        return Ok(None);
    }
    if cfg.gpu_cache_mode == GpuCacheMode::WriteBack && topo.local_size > 1 {
        return Err(TrainError::Config(format!(
            "--gpu-cache-mode write-back with {} ranks on a host: each rank caches the keys of its own batches, and the host's other ranks would read rows of the shared host table that only one GPU holds; run one rank per host (write-back is exact there), or pass --gpu-cache-mode write-through (the default)",
            topo.local_size
        )));
    }
    let cache = GpuCache::new(model.device(), table, slots, cfg.sparse_lr, cfg.gpu_cache_refresh, cfg.gpu_cache_mode)?;
    if topo.rank == 0 {
        let mib = cache.bytes() as f64 / (1u64 << 20) as f64;
        crate::eprint_line(&format!("ringrec: GPU hot-row cache: {slots} slots ({mib:.1} MiB) per rank, keys chosen every {} steps, {} (--gpu-cache-mib, --gpu-cache-refresh, --gpu-cache-mode)", cfg.gpu_cache_refresh, cfg.gpu_cache_mode));
    }
    Ok(Some(cache))
}

/// The training rows that step `in_epoch` of an epoch reaches: its batch's, and one more
/// (whether a row follows it).
fn rows_reached(in_epoch: u64, batch: usize) -> usize {
    (in_epoch as usize + 1).saturating_mul(batch).saturating_add(1)
}

/// Global batches of an epoch (once every training file is open) and the steps the run
/// will have completed at its end (an estimate until then).
fn totals(data: &TrainData, cfg: &TrainConfig) -> (Option<u64>, u64) {
    let spe = data.steps_per_epoch(cfg.batch);
    let per_epoch = spe.unwrap_or_else(|| shard::steps_per_epoch(data.estimated_rows(), cfg.batch) as u64);
    (spe, cfg.epochs.saturating_mul(per_epoch).min(cfg.max_steps.unwrap_or(u64::MAX)))
}

/// The pooling of the data's multi-hot fields `lists` of `input` ([`TrainConfig::multi_hot`]:
/// the flag, else the `--init-from` model's `warm`, else sum), recorded in `settings` with
/// the fields' names: the pooling is part of the model.
fn model_pooling(cfg: &TrainConfig, input: &std::path::Path, lists: &[String], warm: Option<&str>, settings: &mut [(&'static str, String)]) -> TrainResult<Vec<crate::model::pooling::Pooling>> {
    let pooling = cfg.multi_hot(input, lists, warm)?;
    if let Some(entry) = settings.iter_mut().find(|(k, _)| *k == "--multi-hot-pooling") {
        entry.1 = crate::model::pooling::describe_pooling(&pooling, lists, cfg.multi_hot_pooling.as_deref());
    }
    Ok(pooling)
}

/// Records the Parquet columns of `settings` (`Parquet columns`) with the dense columns in
/// the order of their slots in `input` (the file's column order, not the schema's), so that a
/// model's recorded dense feature `j` is its column `j` with that column's transform
/// (`serve-model` reads a row's dense values by it).
fn record_dense_slots(cfg: &TrainConfig, input: &std::path::Path, settings: &mut [(&'static str, String)]) -> TrainResult<()> {
    let Some(entry) = settings.iter_mut().find(|(k, _)| *k == "Parquet columns") else { return Ok(()) };
    let Ok(spec) = cfg.columns() else { return Ok(()) };
    if spec.dense.is_empty() || !crate::data::parquet_file::is_parquet(input) {
        return Ok(());
    }
    let slots = crate::data::parquet_file::schema_of(input, &spec)?.dense_names();
    if let Some(d) = spec.in_slot_order(&slots).describe() {
        entry.1 = d;
    }
    Ok(())
}

impl<'a, D: Device> Trainer<'a, D> {
    /// Sets up the run on every rank (collective): the data, the dense model on `dev` with
    /// its gradients reduced by `engine`, the host table; from the checkpoint when
    /// `cfg.resume`.
    pub fn new(topo: &'a Topology, cfg: &'a TrainConfig, dev: D, engine: Engine) -> TrainResult<Trainer<'a, D>> {
        cfg.validate()?;
        let mut data = data::open(topo, cfg)?;
        let input = data.files().next().map(std::path::Path::to_path_buf).unwrap_or_default();
        let lists = data.first()?.0.list_names().to_vec();
        let (spec, layout) = super::tables::model_and_layout(cfg, &input, data.first()?.0.fields(), &lists)?;
        let mut params = spec.init_params(cfg.seed);
        let mut opt = DenseOptimState::new(cfg.dense_optimizer, cfg.lr, params.len());
        let mut coll = comm::build(cfg.backend(topo), topo)?;
        let mut resume_settings = cfg.resume_settings(&data.identity(), data.first()?.0.len());
        record_dense_slots(cfg, &input, &mut resume_settings)?;
        resume_settings.extend(super::tables::fields_setting(cfg, &input, data.first()?.0.fields(), &lists)?);
        if let (0, Some(dir)) = (topo.rank, &cfg.checkpoint_dir) {
            // What a killed run left there (temporaries of dead processes) goes first.
            crate::stale::report(dir, &crate::stale::sweep_temporaries(dir));
        }
        let run_table = cfg.table_config();
        let warm = cfg.init_from.as_ref().map(|_| super::warm::start(topo, coll.as_mut(), cfg, &spec, &run_table, &mut params, &mut opt)).transpose()?;
        let pooling = model_pooling(cfg, &input, &lists, warm.as_ref().and_then(|(_, from)| from.pooling.as_deref()), &mut resume_settings)?;
        let (position, saved) = match &cfg.checkpoint_dir {
            Some(dir) if cfg.resume => {
                let r = resume(topo, coll.as_mut(), dir, &resume_settings, &spec, &mut params, &mut opt)?;
                params = r.params;
                opt = r.opt;
                (r.position, Some(r.table))
            }
            _ => {
                // Identical start on every rank: rank 0's initial parameters.
                coll.broadcast(params.as_mut_slice(), 0)?;
                (Position::default(), None)
            }
        };
        let step_keys = super::embedding::data_step_keys(topo, cfg, &data)?;
        let mut embedding = match &warm {
            Some((t, _)) => EmbeddingStage::open_from(topo, cfg, t.source(&t.config(&run_table)), step_keys)?,
            None => EmbeddingStage::open(topo, cfg, saved.as_deref(), step_keys)?,
        };
        let local = match cfg.sync_every {
            0 | 1 => None,
            _ if cfg.sync_scope == super::SyncScope::Host && dev.kind() != "cpu" => {
                return Err(TrainError::Config(format!("--sync-scope host sums the dense gradients over the host's shared memory, in host memory, and this run's dense model is on {}: use --device cpu, or --sync-scope rank", dev.describe())));
            }
            k => Some(LocalSgd::new(topo, k, cfg.sync_scope, params.clone())?),
        };
        let warm_tables = warm.as_ref().map_or(&[][..], |(_, from)| &from.tables[..]);
        let mut tables = layout.map(|l| Tables::open(topo, cfg, l, &pooling, saved.as_deref().and_then(std::path::Path::parent), warm_tables, step_keys)).transpose()?;
        if let Some(t) = tables.as_mut() {
            super::embedding::share_max_bytes(topo, cfg, &mut embedding, t.stages_mut())?;
        }
        let prefetch = if cfg.pipeline.enabled(dev.kind()) { Some(Prefetcher::start()?) } else { None };
        let mut model = DenseModel::new(dev, spec, &params, &opt)?;
        if !pooling.is_empty() && tables.is_none() {
            model.set_multi_hot(&pooling)?;
        }
        let (gpu_cache, table_caches) = open_caches(topo, cfg, &model, &mut embedding, tables.as_mut())?;
        data.reach(topo, rows_reached(position.in_epoch, cfg.batch), position.step)?;
        let (steps_per_epoch, total_steps) = totals(&data, cfg);
        let progress = Progress { step: position.step, total_steps, epoch: position.epoch, loss: None, samples_per_sec: 0.0, samples: 0, eval_auc: None };
        let metrics = open_metrics(topo, cfg)?;
        topo.control().barrier("the ranks' barrier");
        Ok(Trainer {
            topo,
            cfg,
            last_saved: (topo.rank == 0 && cfg.checkpoint_min_change > 0.0).then(|| params.clone()),
            data,
            resume_settings,
            coll,
            engine,
            model,
            embedding,
            batch: Batch::default(),
            position,
            steps_per_epoch,
            total_steps,
            unread: None,
            losses: Losses { epoch: position.epoch, ..Losses::default() },
            progress,
            phases: PhaseTimer::default(),
            device_wait: DeviceWait::default(),
            prefetch,
            counters: Counters::default(),
            started: Instant::now(),
            eval_seconds: 0.0,
            mark: Mark::at(position.step),
            last_eval: None,
            stopped: None,
            metrics,
            local,
            faults: Faults::new(topo),
            warm_from: warm.map(|(_, from)| from),
            writing: None,
            snapshot_refused: false,
            gpu_cache,
            tables,
            table_caches,
        })
    }

    /// Where the run is.
    pub fn position(&self) -> Position {
        self.position
    }

    /// What the progress display shows now.
    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// Records the global loss sum of a step once it is read (the same on every rank).
    pub(super) fn record(&mut self, loss_sum: f64, u: Unread) -> TrainResult<()> {
        let loss = loss_sum / u.divisor;
        // A local step's loss is its rank's own: a non-finite one stops every rank at the
        // next sync instead (see `super::sync`).
        if !loss.is_finite() && self.cfg.nan_policy == NanPolicy::Stop && self.local.is_none() {
            return Err(TrainError::NonFinite { step: u.step, what: "the global loss".into() });
        }
        let l = &mut self.losses;
        if l.epoch != u.epoch {
            (l.epoch, l.sum, l.steps) = (u.epoch, 0.0, 0);
        }
        l.sum += loss;
        l.steps += 1;
        l.interval_sum += loss;
        l.interval_steps += 1;
        if self.cfg.record_losses {
            self.losses.all.push(loss);
        }
        let rate = self.counters.global_samples as f64 / self.train_seconds().max(1e-9);
        self.progress = Progress { step: self.position.step, total_steps: self.total_steps, epoch: u.epoch, loss: Some(loss), samples_per_sec: rate, samples: self.counters.samples, eval_auc: self.progress.eval_auc };
        Ok(())
    }

    /// Stages `batch` for the model: its unique keys' rows from the table, its inverse
    /// map, dense features and labels, and in a weighted run its samples' weights.
    fn stage(&mut self, weights: Option<&BatchWeights>) -> TrainResult<()> {
        match (self.tables.as_mut(), self.gpu_cache.as_mut()) {
            (Some(t), _) if self.table_caches.is_some() => {
                if let Some(c) = self.table_caches.as_mut() {
                    c.stage(&mut self.model, &self.embedding, t, &self.batch)?;
                }
            }
            (Some(t), _) => t.stage(&mut self.model, &self.embedding, &self.batch)?,
            (None, Some(c)) => c.stage(&mut self.model, self.embedding.table().table(), &self.batch)?,
            (None, None) => predict::stage(&mut self.model, self.embedding.table(), &self.batch)?,
        }
        if let Some(w) = weights {
            self.model.stage_weights(w.mine.len())?.copy_from_slice(&w.mine);
        }
        Ok(())
    }

    /// Whether the run ends after `step` global steps: `--max-steps`, or the last epoch's
    /// end (known once every training file is open; until then a batch is followed by
    /// another).
    fn is_last(&self, step: u64) -> bool {
        self.cfg.max_steps.is_some_and(|m| step >= m) || (self.steps_per_epoch.is_some() && step >= self.total_steps) || self.stopped.as_ref().is_some_and(|s| step >= s.step)
    }

    /// Opens the training files that the next step's batch reaches, and one row further
    /// (collective); updates the steps' totals.
    fn reach(&mut self) -> TrainResult<()> {
        if self.steps_per_epoch.is_none() {
            self.data.reach(self.topo, rows_reached(self.position.in_epoch, self.cfg.batch), self.position.step)?;
            (self.steps_per_epoch, self.total_steps) = totals(&self.data, self.cfg);
        }
        Ok(())
    }

    /// Takes the next step; false (doing nothing) once the run has taken all its steps.
    pub fn step(&mut self) -> TrainResult<bool> {
        let (topo, cfg) = (self.topo, self.cfg);
        if self.cfg.max_steps.is_some_and(|m| self.position.step >= m) {
            return Ok(false);
        }
        self.reach()?;
        if self.is_last(self.position.step) {
            return Ok(false);
        }
        self.faults.before_step(self.position.step);
        if self.steps_per_epoch.is_some_and(|s| self.position.in_epoch >= s) {
            self.position.epoch += 1;
            self.position.in_epoch = 0;
        }
        let epoch = self.position.epoch;
        let global = shard::global_batch_range(self.position.in_epoch as usize, cfg.batch, self.data.train_rows());
        let global_batch = global.len();
        let global_rows = global.clone();

        self.phases.enter("batch");
        let here = Ahead { step: self.position.step, epoch, in_epoch: self.position.in_epoch };
        let batch_weights = match self.prefetch.as_mut().map(|p| p.take(here, &mut self.batch)).transpose()?.flatten() {
            Some(weights) => {
                self.counters.prefetched += 1;
                weights
            }
            None => {
                let mine = shard::rank_slice(global.clone(), topo.rank, topo.size);
                self.data.load(&mut self.batch, epoch, global, mine, cfg.shuffle.then_some(cfg.seed))?
            }
        };
        self.prefetch_next(here)?;
        self.stage(batch_weights.as_ref())?;
        self.device_wait.step_starts(self.model.device())?;
        match (&self.gpu_cache, &self.table_caches) {
            (Some(c), _) => c.load(&mut self.model)?,
            (None, Some(c)) => c.load(&mut self.model)?,
            (None, None) => self.model.load()?,
        };
        if let Some(u) = self.unread.take() {
            self.record(self.model.loss_sum()?, u)?;
        }
        self.phases.enter("mlp");
        // The loss scale, and what the step's loss sum is divided by: the samples it
        // covers or their weight sum.
        let (scale, divisor) = match &self.local {
            Some(l) => {
                let (scale, rows) = l.loss_scale(global_rows.clone());
                (scale, rows as f64)
            }
            None => weights::loss_scale(batch_weights.as_ref(), global_batch, cfg.loss_normalize),
        };
        let scale = self.faults.poison_grads(self.position.step, self.local.is_some(), scale);
        let st = if self.local.is_some() { self.local_step(scale, global_rows)? } else { self.world_step(scale, batch_weights.as_ref(), global_batch)? };
        self.finish_step(&st, global_batch, divisor, epoch)?;
        self.device_wait.step_done(self.model.device())?;
        Ok(true)
    }

    /// With `--pipeline`: starts reading the batch of the step after `here` (the step
    /// being taken) on the prefetching thread, when that step will be taken and its global
    /// range is known without a collective (every file it reaches, and the row after it,
    /// is open: what [`Trainer::reach`] would open stays in that step).
    fn prefetch_next(&mut self, here: Ahead) -> TrainResult<()> {
        let cfg = self.cfg;
        if self.prefetch.is_none() || self.is_last(here.step + 1) {
            return Ok(());
        }
        let (mut epoch, mut in_epoch) = (here.epoch, here.in_epoch + 1);
        match self.steps_per_epoch {
            Some(s) if in_epoch >= s => (epoch, in_epoch) = (epoch + 1, 0),
            Some(_) => {}
            None if self.data.train_rows() < rows_reached(in_epoch, cfg.batch) => return Ok(()),
            None => {}
        }
        let global = shard::global_batch_range(in_epoch as usize, cfg.batch, self.data.train_rows());
        let mine = shard::rank_slice(global.clone(), self.topo.rank, self.topo.size);
        let plan = self.data.plan(epoch, global, mine, cfg.shuffle.then_some(cfg.seed))?;
        match self.prefetch.as_mut() {
            Some(p) => p.begin(Ahead { step: here.step + 1, epoch, in_epoch }, plan),
            None => Ok(()),
        }
    }

    /// A synchronous step on the loaded batch at loss scale `scale` (its samples' weights
    /// `batch_weights`, of a global batch of `global_batch` samples): the dense step with
    /// its gradients allreduced by the engine over the world while the sparse exchange
    /// runs, then the optimizer. Returns the sparse exchange's counters.
    fn world_step(&mut self, scale: f32, batch_weights: Option<&BatchWeights>, global_batch: usize) -> TrainResult<SparseStats> {
        let (topo, cfg) = (self.topo, self.cfg);
        let mut pending: Vec<(Part, Handle)> = Vec::with_capacity(self.model.num_groups() + 1);
        let engine = &self.engine;
        let compression = cfg.dense_compression_at(self.position.step, engine.compression());
        self.model.step(scale, &mut |part, t| pending.push((part, engine.allreduce_async_with(&part.name(), t, ReduceOp::Sum, compression))))?;
        self.phases.enter("scatter");
        let key_grads = self.model.key_grads()?;
        self.phases.enter("sparse");
        let step = self.position.step + 1;
        if cfg.sparse_normalize == SparseNormalize::Weighted {
            let w = weights::rank_weights(batch_weights, self.batch.len(), global_batch);
            self.embedding.set_sparse_weights(w);
            if let Some(t) = self.tables.as_mut() {
                t.set_sparse_weights(w);
            }
        }
        // A write-back cache's step (one rank): only the misses are exchanged and stepped
        // on the host, the device steps the cached rows from its own key gradients —
        // where those are the merged rows bit for bit: every one finite (else the step
        // goes the write-through way, so --nan-policy decides on the whole list) and not
        // rescaled by weights.
        // With more ranks (one per host) every key is exchanged and the leader holds the
        // merged keys its rank caches, which apply the merged list as in write-through.
        let write_back = self.gpu_cache.as_ref().is_some_and(|c| c.is_write_back());
        let held = write_back && topo.size == 1 && cfg.sparse_normalize != SparseNormalize::Weighted && key_grads.iter().all(|x| x.is_finite());
        let done = match (self.tables.as_mut(), self.gpu_cache.as_mut()) {
            (Some(t), _) => t.exchange_and_apply(&mut self.embedding, &self.batch, key_grads, step, cfg.nan_policy),
            (None, Some(c)) if held => {
                let (misses, sent, rows) = c.split_own(key_grads);
                self.embedding.exchange_and_apply_held(misses, sent, Held::Misses { all: &self.batch.uniq, rows }, step, cfg.nan_policy)
            }
            (None, Some(c)) if write_back && topo.size > 1 => self.embedding.exchange_and_apply_held(&self.batch.uniq, key_grads, Held::Cached(&|k| c.holds(k)), step, cfg.nan_policy),
            (None, _) => self.embedding.exchange_and_apply(&self.batch.uniq, key_grads, step, cfg.nan_policy),
        };
        let st = match done {
            Ok(st) => st,
            Err(e @ TrainError::NonFinite { .. }) => {
                // Every rank stops here: finish the step's dense allreduces first, so the
                // engine shuts down with nothing in flight.
                for (part, h) in pending {
                    h.wait().map_err(TrainError::from).and_then(|t| Ok(self.model.give_back(part, t)?))?;
                }
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        self.update_gpu_cache(step, held)?;
        self.phases.enter("allreduce");
        for (part, h) in pending {
            self.model.give_back(part, h.wait()?)?;
        }
        self.phases.enter("optimizer");
        // The reduced dense gradient is the same on every rank: so is this decision. A global
        // batch of weight 0 (its sum known to every rank from the data) updates nothing, not
        // even the optimizer's moments: its gradient is zero, and Adam would still move.
        let weightless = batch_weights.is_some_and(|w| w.global_sum <= 0.0);
        match (self.model.non_finite_gradient()?, cfg.nan_policy) {
            (None, _) if weightless => {}
            (None, _) => self.model.apply()?,
            (Some(what), NanPolicy::Stop) => return Err(TrainError::NonFinite { step, what }),
            (Some(what), NanPolicy::SkipStep) => {
                self.counters.nan_skips_dense += 1;
                if topo.rank == 0 {
                    crate::eprint_line(&format!("ringrec: warning: step {step}: {what} is not finite: its dense update is skipped (--nan-policy skip-step)"));
                }
            }
        }
        self.phases.stop();
        Ok(st)
    }

    /// After global step `step`'s exchange and host barrier: the GPU hot-row cache applies
    /// the list the leader applied (`held`: a write-back step, its own key gradients to
    /// its cached rows), then empties or refreshes itself when due.
    fn update_gpu_cache(&mut self, step: u64, held: bool) -> TrainResult<()> {
        if let (Some(c), Some(t)) = (self.table_caches.as_mut(), self.tables.as_mut()) {
            return c.update(self.model.device(), &mut self.embedding, t, step);
        }
        let Some(cache) = self.gpu_cache.as_mut() else { return Ok(()) };
        let (dev, host, on_dev, sources) = self.model.last_key_grads()?;
        let own = super::gpu_cache::OwnGrads { keys: &self.batch.uniq, host, dev: on_dev, sources };
        if held {
            cache.apply_own(dev, own)?;
        } else if let Some(g) = self.embedding.applied()? {
            // A world of one rank: the merged rows are (bit for bit, checked) its own.
            cache.apply(dev, g.keys, g.grads, (self.topo.size == 1).then_some(own))?;
        }
        let table = match cache.is_write_back() {
            true => TableAt::Write(self.embedding.table_mut().table_mut()?),
            false => TableAt::Read(self.embedding.table().table()),
        };
        cache.after_step(dev, table, step)
    }

    /// A write-back GPU hot-row cache writes its changed rows into the host table, before
    /// anything reads it (checkpoints, evaluations, the summary); nothing otherwise.
    pub(super) fn write_back_cache(&mut self) -> TrainResult<()> {
        match self.gpu_cache.as_mut() {
            Some(c) if c.is_write_back() => c.write_back_all(self.model.device(), self.embedding.table_mut().table_mut()?),
            _ => Ok(()),
        }
    }

    /// The counters of a step taken (its sparse exchange `st`, the `global_batch`, what its
    /// loss sum is divided by: the samples it covers or their weight sum), then a sync when one is due (`--sync-every`), then
    /// [`Trainer::end_step`].
    fn finish_step(&mut self, st: &SparseStats, global_batch: usize, divisor: f64, epoch: u64) -> TrainResult<()> {
        self.counters.samples += self.batch.len() as u64;
        self.counters.global_samples += global_batch as u64;
        self.count_sparse(st);
        self.counters.steps += 1;
        self.position.step += 1;
        self.position.in_epoch += 1;
        self.unread = Some(Unread { divisor, epoch, step: self.position.step });
        if self.local.as_mut().is_some_and(|l| l.stepped()) {
            self.sync()?;
        }
        self.end_step()
    }

    /// Adds an exchange's bytes to the run's sparse traffic.
    fn count_sparse(&mut self, st: &SparseStats) {
        self.counters.intra_bytes += (st.host_bytes_sent + st.host_bytes_received) as f64;
        self.counters.cross_bytes += (st.cross_bytes_sent + st.cross_bytes_received) as f64;
    }

    /// A local step of `--sync-every` on the loaded batch of global batch `global` at the
    /// local loss scale `scale` (see [`super::sync`]): the dense step, its gradients kept
    /// on this rank (scope rank) or summed over the host (scope host), the sparse update
    /// inside the host, the rank's own optimizer step. Returns the sparse exchange's
    /// counters.
    fn local_step(&mut self, scale: f32, global: std::ops::Range<usize>) -> TrainResult<SparseStats> {
        let cfg = self.cfg;
        let Some(local) = self.local.as_mut() else { return Err(TrainError::Config("internal: a local step without --sync-every".into())) };
        let mut parts: Vec<(Part, Tensor)> = Vec::with_capacity(self.model.num_groups() + 1);
        self.model.step(scale, &mut |part, t| parts.push((part, t)))?;
        self.phases.enter("scatter");
        let step = self.position.step + 1;
        // The per-key sums (of every table, grouped by table) take the factor to the host's
        // loss scale.
        let key_grads = local.host_key_grads(self.model.key_grads()?, global);
        self.phases.enter("sparse");
        let st = match self.tables.as_mut() {
            Some(t) => t.exchange_and_apply(&mut self.embedding, &self.batch, key_grads, step, cfg.nan_policy)?,
            None => self.embedding.exchange_and_apply(&self.batch.uniq, key_grads, step, cfg.nan_policy)?,
        };
        self.phases.enter("allreduce");
        for (part, mut t) in parts {
            local.reduce_over_host(&mut t)?;
            self.model.give_back(part, t)?;
        }
        self.phases.enter("optimizer");
        match self.model.non_finite_gradient()? {
            None => self.model.apply()?,
            Some(what) => {
                let then = if cfg.nan_policy == NanPolicy::SkipStep {
                    self.counters.nan_skips_dense += 1;
                    "(--nan-policy skip-step)"
                } else {
                    local.skipped_non_finite();
                    "; every rank stops at the next sync (--nan-policy stop)"
                };
                crate::eprint_line(&format!("ringrec: warning: rank {}: step {step}: {what} of this local step is not finite: its dense update is skipped{then}", self.topo.rank));
            }
        }
        self.phases.stop();
        Ok(st)
    }

    /// A sync of `--sync-every` when local steps were taken since the last one (collective;
    /// nothing otherwise): the tables' deltas (the default table's, then each `--table`'s in
    /// flag order), then the dense delta ([`super::sync`]).
    pub(super) fn sync(&mut self) -> TrainResult<()> {
        if !self.local.as_ref().is_some_and(|l| l.pending()) {
            return Ok(());
        }
        self.phases.enter("sync");
        let stages = std::iter::once(&mut self.embedding).chain(self.tables.iter_mut().flat_map(Tables::stages_mut));
        let mut sparse_skips = 0;
        let mut synced = Vec::new();
        for stage in stages {
            let (st, skips) = stage.sync_tables()?;
            sparse_skips += skips;
            synced.extend(st);
        }
        synced.iter().for_each(|st| self.count_sparse(st));
        let step = self.position.step;
        if let Some(local) = self.local.as_mut() {
            let compression = self.cfg.dense_compression_at(step.saturating_sub(1), self.engine.compression());
            local.sync_dense(&mut self.model, &self.engine, compression, sparse_skips, step, self.cfg.nan_policy)?;
        }
        self.phases.stop();
        Ok(())
    }

    /// What follows a step on every rank (collective): its checkpoint, its interval report
    /// (and a `--stop-at-*` decision), and every SIGNAL_CHECK_EVERY steps or after a
    /// checkpoint the ranks' check for a stop signal (an error that names the checkpoint).
    fn end_step(&mut self) -> TrainResult<()> {
        let (topo, cfg) = (self.topo, self.cfg);
        let mut saved = false;
        if let Some(dir) = &cfg.checkpoint_dir {
            let last = self.is_last(self.position.step);
            if (cfg.checkpoint_every > 0 && self.position.step % cfg.checkpoint_every == 0) || last {
                // The last step's checkpoint is always written; a periodic one may be gated.
                saved = self.save_checkpoint(dir, !last)?;
            }
        }
        let every = cfg.eval_every;
        if every > 0 && (self.position.step % every == 0 || self.is_last(self.position.step)) {
            self.report_interval()?;
            if self.stopped.is_some() && !saved {
                // The run ends here: its checkpoint is the last one, always written.
                if let Some(dir) = &cfg.checkpoint_dir {
                    saved = self.save_checkpoint(dir, false)?;
                }
            }
        }
        // A SIGTERM/SIGINT on any rank stops every rank after the same step: they compare
        // notes every SIGNAL_CHECK_EVERY steps (one more collective per step cost 4-5% of
        // a 2-rank step on 2 cores) and at checkpoints.
        if self.position.step % SIGNAL_CHECK_EVERY != 0 && !saved {
            return Ok(());
        }
        let signal = topo.control().all_max("the ranks' check for a stop signal", crate::signals::requested().unwrap_or(0));
        if signal != 0 {
            let checkpoint = match &cfg.checkpoint_dir {
                Some(dir) => {
                    if !saved {
                        self.save_checkpoint(dir, false)?;
                    }
                    // The job ends with its checkpoint written.
                    self.finish_checkpoint()?;
                    Some(dir.clone())
                }
                None => None,
            };
            return Err(TrainError::Stopped { signal, step: self.position.step, checkpoint });
        }
        Ok(())
    }

    /// Allreduces of the dense model over the world in this run: one per step, or with
    /// `--sync-every` k > 1 one per sync.
    pub(super) fn dense_allreduces(&self) -> u64 {
        self.local.as_ref().map_or(self.counters.steps, |l| l.counts().syncs)
    }

    /// Seconds of training so far (wall time less the evaluations during training).
    pub(super) fn train_seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64() - self.eval_seconds
    }

    /// Scores the held-out rows (each rank a slice of the [`EvalSet`], in batches of
    /// `--batch`; the `--eval-data` files are opened the first time: the scoring of
    /// `ringrec predict`, [`predict::gather_scores`]), and computes the exact global log
    /// loss, AUC, NE and calibration on rank 0 (`None` elsewhere).
    pub fn evaluate(&mut self) -> TrainResult<Option<Evaluation>> {
        self.write_back_cache()?;
        let set: EvalSet = self.data.held_out(self.topo)?.clone();
        let emb = match self.tables.as_mut() {
            Some(t) => {
                let (tables, gather) = t.parts(&self.embedding);
                predict::Embeddings::Split(tables, gather)
            }
            None => predict::Embeddings::One(self.embedding.table().table()),
        };
        let scores = predict::gather_scores(self.topo, self.coll.as_mut(), &mut self.model, emb, &mut self.batch, &set, self.cfg.batch)?;
        set.release_pages();
        Ok(scores.map(|scores| Evaluation::of(&scores, &set.labels())))
    }
}

/// Rank 0's `--metrics-out` file (appended to when resuming: one curve across runs);
/// collective: a file rank 0 cannot write fails every rank.
fn open_metrics(topo: &Topology, cfg: &TrainConfig) -> TrainResult<Option<std::io::BufWriter<std::fs::File>>> {
    let metrics = match (&cfg.metrics_out, topo.rank) {
        (Some(p), 0) => Some(
            crate::fileio::create_private(p, cfg.resume)
                .map(std::io::BufWriter::new)
                .map_err(|e| format!("--metrics-out {}: cannot write it: {e}", p.display())),
        ),
        _ => None,
    }
    .transpose();
    Ok(topo.agree(metrics)?)
}
