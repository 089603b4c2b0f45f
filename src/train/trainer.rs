//! [`Trainer`]: a training run on one rank, step by step — [`Trainer::new`] (data, model,
//! table, resume), [`Trainer::step`], [`Trainer::evaluate`], [`Trainer::summary`]. See the module docs of [`crate::train`] for what a step does.

use std::path::{Path, PathBuf};
use std::time::Instant;

use mpi::collective::{CommunicatorCollectives, SystemOperation};

use super::batch::Batch;
use super::checkpoint::{self, DenseState, Loaded};
use super::data::{self, TrainData};
use super::embedding::EmbeddingStage;
use super::phases::PhaseTimer;
use super::predict;
use super::sync::LocalSgd;
use super::weights::{self, BatchWeights};
use super::{metrics, NanPolicy, TrainConfig, TrainError, TrainResult, TrainSummary};
use crate::comm::count;
use crate::comm::traffic::Traffic;
use crate::comm::{self, Collectives, CollectivesExt};
use crate::data::criteo::{NUM_DENSE, NUM_SPARSE};
use crate::data::{shard, EvalSet};
use crate::device::Device;
use crate::dtype::ReduceOp;
use crate::engine::{Engine, Handle};
use crate::model::{DenseModel, DenseOptimState, InputLayout, MlpShape, Part};
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
struct Unread {
    /// What the global loss sum is divided by: the global batch, or its weight sum.
    divisor: f64,
    epoch: u64,
    /// The step it belongs to (1-based).
    step: u64,
}

/// Losses of the run.
#[derive(Default)]
struct Losses {
    /// The epoch `epoch` is summed over.
    epoch: u64,
    /// Sum of the epoch's step losses.
    sum: f64,
    /// Steps summed.
    steps: u64,
    /// Every step's loss (with `record_losses`).
    all: Vec<f64>,
    /// Sum and count of the losses recorded since the last interval report.
    interval_sum: f64,
    interval_steps: u64,
}

/// Where the last interval report left the counters (`--eval-every`).
#[derive(Default, Clone, Copy)]
struct Mark {
    step: u64,
    samples: u64,
    train_seconds: f64,
    intra_bytes: f64,
    cross_bytes: f64,
    /// Allreduces of the dense model over the world ([`Trainer::dense_allreduces`]).
    dense_allreduces: u64,
}

/// The held-out evaluation (rank 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Evaluation {
    /// Mean log loss.
    pub logloss: f64,
    /// Area under the ROC curve over all ranks' predictions.
    pub auc: f64,
}

/// Totals over the steps this run took on this rank.
#[derive(Default)]
struct Counters {
    steps: u64,
    samples: u64,
    /// Samples of every rank (the global batches of the steps taken).
    global_samples: u64,
    checkpoints_written: u64,
    checkpoints_skipped: u64,
    nan_skips_dense: u64,
    intra_bytes: f64,
    cross_bytes: f64,
}

/// Steps between the ranks' checks for a stop signal (SIGTERM, SIGINT, SIGUSR1): a signal
/// stops the job within this many steps.
pub const SIGNAL_CHECK_EVERY: u64 = 16;

/// A training run on one rank (see the module docs).
pub struct Trainer<'a, D: Device> {
    topo: &'a Topology,
    cfg: &'a TrainConfig,
    data: TrainData,
    /// What a checkpoint records and a resume must repeat.
    resume_settings: Vec<(&'static str, String)>,
    /// Rank 0, with `--checkpoint-min-change`: the parameters of the last checkpoint.
    last_saved: Option<Vec<f32>>,
    /// Start-up broadcasts and evaluation's gather.
    coll: Box<dyn Collectives>,
    engine: Engine,
    model: DenseModel<D>,
    embedding: EmbeddingStage,
    batch: Batch,
    position: Position,
    /// Global batches in an epoch, once every training file is open.
    steps_per_epoch: Option<u64>,
    /// Steps the run will have completed at its end (estimated while `steps_per_epoch`
    /// is not known).
    total_steps: u64,
    unread: Option<Unread>,
    losses: Losses,
    progress: Progress,
    phases: PhaseTimer,
    counters: Counters,
    started: Instant,
    /// Seconds spent in evaluations during training (not training time).
    eval_seconds: f64,
    /// The counters at the last interval report.
    mark: Mark,
    /// The last evaluation: its step and result on rank 0 (`None` elsewhere).
    last_eval: Option<(u64, Option<Evaluation>)>,
    /// A `--stop-at-*` target reached (the same on every rank): the run ends after its step.
    stopped: Option<super::StopTarget>,
    /// Rank 0's `--metrics-out` file.
    metrics: Option<std::io::BufWriter<std::fs::File>>,
    /// `--sync-every` k > 1: lazy synchronisation ([`super::sync`]).
    local: Option<LocalSgd>,
}

/// The checkpoint a run resumes from, as every rank gets it.
struct Resumed {
    position: Position,
    params: Vec<f32>,
    opt: DenseOptimState,
    table: PathBuf,
}

/// Rank 0 finds the checkpoint to resume from in `dir` (the newest that passes every
/// check and matches this run's `settings`; it says which, and why it skipped newer
/// ones); every rank gets its position, parameters and optimizer state (collective).
fn resume(topo: &Topology, coll: &mut dyn Collectives, dir: &Path, settings: &[(&'static str, String)], params: &mut Vec<f32>, opt: &mut DenseOptimState) -> TrainResult<Resumed> {
    let n = params.len();
    let (kind, lr) = (opt.kind, opt.lr);
    let found = if topo.rank == 0 {
        checkpoint::find(dir, |ck| checkpoint::check_settings(ck, settings)).map_err(|e| e.to_string()).and_then(|(ck, warnings): (Loaded, Vec<String>)| {
            for w in &warnings {
                crate::eprint_line(&format!("ringrec: warning: {w}"));
            }
            if ck.dense.params.len() != n || ck.dense.opt.kind != kind {
                return Err(format!("{}: {} dense parameters ({}), the model has {n} ({kind})", ck.dir.display(), ck.dense.params.len(), ck.dense.opt.kind));
            }
            if ck.dense.opt.lr != lr {
                return Err(format!("{}: --lr: the checkpoint's optimizer state has {}, this run has {lr}; resume with the same flags", ck.dir.display(), ck.dense.opt.lr));
            }
            crate::eprint_line(&format!("ringrec: resuming from {} (step {})", ck.dir.display(), ck.dense.step));
            Ok(ck.dense)
        })
    } else {
        Ok(DenseState { step: 0, epoch: 0, step_in_epoch: 0, opt: opt.clone(), widths: Vec::new(), params: Vec::new() })
    };
    let ck = topo.agree(found)?;
    let mut head = [ck.step as i64, ck.epoch as i64, ck.step_in_epoch as i64, ck.opt.step as i64];
    coll.broadcast(&mut head, 0)?;
    let position = Position { step: head[0] as u64, epoch: head[1] as u64, in_epoch: head[2] as u64 };
    if topo.rank == 0 {
        params.copy_from_slice(&ck.params);
        *opt = ck.opt;
    }
    opt.step = head[3] as u64;
    coll.broadcast(params.as_mut_slice(), 0)?;
    if !opt.m.is_empty() {
        coll.broadcast(&mut opt.m, 0)?;
        coll.broadcast(&mut opt.v, 0)?;
    }
    Ok(Resumed { position, params: std::mem::take(params), opt: opt.clone(), table: checkpoint::step_dir(dir, position.step).join(checkpoint::TABLE) })
}

/// Global batches of an epoch (once every training file is open) and the steps the run
/// will have completed at its end (an estimate until then).
fn totals(data: &TrainData, cfg: &TrainConfig) -> (Option<u64>, u64) {
    let spe = data.steps_per_epoch(cfg.batch);
    let per_epoch = spe.unwrap_or_else(|| shard::steps_per_epoch(data.estimated_rows(), cfg.batch) as u64);
    (spe, cfg.epochs.saturating_mul(per_epoch).min(cfg.max_steps.unwrap_or(u64::MAX)))
}

impl<'a, D: Device> Trainer<'a, D> {
    /// Sets up the run on every rank (collective): the data, the dense model on `dev` with
    /// its gradients reduced by `engine`, the host table; from the checkpoint when
    /// `cfg.resume`.
    pub fn new(topo: &'a Topology, cfg: &'a TrainConfig, dev: D, engine: Engine) -> TrainResult<Trainer<'a, D>> {
        cfg.validate()?;
        let mut data = data::open(topo, cfg)?;
        let layout = InputLayout { fields: NUM_SPARSE, dim: cfg.dim, ndense: NUM_DENSE };
        let shape = MlpShape { input: layout.width(), hidden: cfg.hidden.clone() };
        let mut params = shape.init_params(cfg.seed);
        let mut opt = DenseOptimState::new(cfg.dense_optimizer, cfg.lr, params.len());
        let mut coll = comm::build(cfg.backend(topo), topo)?;
        let resume_settings = cfg.resume_settings(&data.identity(), data.first()?.0.len());
        if let (0, Some(dir)) = (topo.rank, &cfg.checkpoint_dir) {
            // What a killed run left there (temporaries of dead processes) goes first.
            crate::stale::report(dir, &crate::stale::sweep_temporaries(dir));
        }
        let run_table = cfg.table_config();
        let warm = match &cfg.init_from {
            Some(_) => Some(super::warm::start(topo, coll.as_mut(), cfg, &run_table, &mut params, &mut opt)?),
            None => None,
        };
        let (position, saved) = match &cfg.checkpoint_dir {
            Some(dir) if cfg.resume => {
                let r = resume(topo, coll.as_mut(), dir, &resume_settings, &mut params, &mut opt)?;
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
        let embedding = match &warm {
            Some(t) => EmbeddingStage::open_from(topo, cfg, t.source(&t.config(&run_table)))?,
            None => EmbeddingStage::open(topo, cfg, saved.as_deref())?,
        };
        let local = match cfg.sync_every {
            0 | 1 => None,
            _ if cfg.sync_scope == super::SyncScope::Host && dev.kind() != "cpu" => {
                return Err(TrainError::Config(format!("--sync-scope host sums the dense gradients over the host's shared memory, in host memory, and this run's dense model is on {}: use --device cpu, or --sync-scope rank", dev.describe())));
            }
            k => Some(LocalSgd::new(topo, k, cfg.sync_scope, params.clone())?),
        };
        let model = DenseModel::new(dev, shape, layout, &params, &opt)?;
        data.reach(topo, (position.in_epoch as usize + 1) * cfg.batch + 1, position.step)?;
        let (steps_per_epoch, total_steps) = totals(&data, cfg);
        let progress = Progress { step: position.step, total_steps, epoch: position.epoch, loss: None, samples_per_sec: 0.0, samples: 0, eval_auc: None };
        // Rank 0 writes the metrics (appended to when resuming: one curve across runs).
        let metrics = match (&cfg.metrics_out, topo.rank) {
            (Some(p), 0) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(cfg.resume)
                    .write(true)
                    .truncate(!cfg.resume)
                    .open(p)
                    .map(std::io::BufWriter::new)
                    .map_err(|e| format!("--metrics-out {}: cannot write it: {e}", p.display())),
            ),
            _ => None,
        }
        .transpose();
        let metrics = topo.agree(metrics)?;
        {
            let _w = crate::watchdog::waiting("the ranks' barrier");
            topo.world.comm.barrier();
        }
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
            counters: Counters::default(),
            started: Instant::now(),
            eval_seconds: 0.0,
            mark: Mark { step: position.step, ..Mark::default() },
            last_eval: None,
            stopped: None,
            metrics,
            local,
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
    fn record(&mut self, loss_sum: f64, u: Unread) -> TrainResult<()> {
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
        predict::stage(&mut self.model, self.embedding.table(), &self.batch)?;
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
        let rows = (self.position.in_epoch as usize + 1).saturating_mul(self.cfg.batch).saturating_add(1);
        if self.steps_per_epoch.is_none() {
            self.data.reach(self.topo, rows, self.position.step)?;
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
        let fires = || topo.config.fault_once.as_ref().is_none_or(|p| std::fs::OpenOptions::new().write(true).create_new(true).open(p).is_ok());
        if topo.config.fault_exit == Some((topo.rank, self.position.step)) && fires() {
            crate::eprint_line(&format!("ringrec: fault injection: rank {} exits at step {}", topo.rank, self.position.step));
            std::process::exit(3);
        }
        if self.steps_per_epoch.is_some_and(|s| self.position.in_epoch >= s) {
            self.position.epoch += 1;
            self.position.in_epoch = 0;
        }
        let epoch = self.position.epoch;
        let global = shard::global_batch_range(self.position.in_epoch as usize, cfg.batch, self.data.train_rows());
        let global_batch = global.len();
        let global_rows = global.clone();

        self.phases.enter("batch");
        let mine = shard::rank_slice(global.clone(), topo.rank, topo.size);
        let batch_weights = self.data.load(&mut self.batch, epoch, global, mine, cfg.shuffle.then_some(cfg.seed))?;
        self.stage(batch_weights.as_ref())?;
        self.model.load()?;
        if let Some(u) = self.unread.take() {
            self.record(self.model.loss_sum()?, u)?;
        }
        if self.local.is_some() {
            let (st, loss_rows) = self.local_step(global_rows)?;
            return self.finish_step(&st, global_batch, loss_rows as f64, epoch);
        }
        self.phases.enter("mlp");
        let mut pending: Vec<(Part, Handle)> = Vec::with_capacity(self.model.mlp().num_layers() + 1);
        let engine = &self.engine;
        let (mut scale, divisor) = weights::loss_scale(batch_weights.as_ref(), global_batch, cfg.loss_normalize);
        if topo.config.fault_nan == Some((topo.rank, self.position.step)) {
            crate::eprint_line(&format!("ringrec: fault injection: rank {} makes the gradients of step {} NaN", topo.rank, self.position.step + 1));
            scale = f32::NAN;
        }
        let compression = cfg.dense_compression_at(self.position.step, engine.compression());
        self.model.step(scale, &mut |part, t| pending.push((part, engine.allreduce_async_with(&part.name(), t, ReduceOp::Sum, compression))))?;
        self.phases.enter("scatter");
        let key_grads = self.model.key_grads()?;
        self.phases.enter("sparse");
        let step = self.position.step + 1;
        if cfg.sparse_normalize == SparseNormalize::Weighted {
            self.embedding.set_sparse_weights(weights::rank_weights(batch_weights.as_ref(), self.batch.len(), global_batch));
        }
        let st = match self.embedding.exchange_and_apply(&self.batch.uniq, key_grads, step, cfg.nan_policy) {
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
        self.phases.enter("allreduce");
        for (part, h) in pending {
            self.model.give_back(part, h.wait()?)?;
        }
        self.phases.enter("optimizer");
        // The reduced dense gradient is the same on every rank: so is this decision. A global
        // batch of weight 0 (its sum known to every rank from the data) updates nothing, not
        // even the optimizer's moments: its gradient is zero, and Adam would still move.
        let weightless = batch_weights.as_ref().is_some_and(|w| w.global_sum <= 0.0);
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
        self.finish_step(&st, global_batch, divisor, epoch)
    }

    /// The counters of a step taken (its sparse exchange `st`, the `global_batch`, what its
    /// loss sum is divided by: the samples it covers or their weight sum), then a sync when one is due (`--sync-every`), then
    /// [`Trainer::end_step`].
    fn finish_step(&mut self, st: &SparseStats, global_batch: usize, divisor: f64, epoch: u64) -> TrainResult<bool> {
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
        self.end_step()?;
        Ok(true)
    }

    /// Adds an exchange's bytes to the run's sparse traffic.
    fn count_sparse(&mut self, st: &SparseStats) {
        self.counters.intra_bytes += (st.host_bytes_sent + st.host_bytes_received) as f64;
        self.counters.cross_bytes += (st.cross_bytes_sent + st.cross_bytes_received) as f64;
    }

    /// A local step of `--sync-every` on the loaded batch of global batch `global` (see
    /// [`super::sync`]): the dense step at the local loss scale, its gradients kept on
    /// this rank (scope rank) or summed over the host (scope host), the sparse update
    /// inside the host, the rank's own optimizer step. Returns the sparse exchange's
    /// counters and the samples the step's loss sum covers.
    fn local_step(&mut self, global: std::ops::Range<usize>) -> TrainResult<(SparseStats, usize)> {
        let cfg = self.cfg;
        let Some(local) = self.local.as_mut() else { return Err(TrainError::Config("internal: a local step without --sync-every".into())) };
        self.phases.enter("mlp");
        let (mut scale, loss_rows) = local.loss_scale(global.clone());
        let topo = self.topo;
        if topo.config.fault_nan == Some((topo.rank, self.position.step)) {
            crate::eprint_line(&format!("ringrec: fault injection: rank {} makes the gradients of local step {} NaN", topo.rank, self.position.step + 1));
            scale = f32::NAN;
        }
        let mut parts: Vec<(Part, Tensor)> = Vec::with_capacity(self.model.mlp().num_layers() + 1);
        self.model.step(scale, &mut |part, t| parts.push((part, t)))?;
        self.phases.enter("scatter");
        let key_grads = local.host_key_grads(self.model.key_grads()?, global);
        self.phases.enter("sparse");
        let step = self.position.step + 1;
        let st = self.embedding.exchange_and_apply(&self.batch.uniq, key_grads, step, cfg.nan_policy)?;
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
        Ok((st, loss_rows))
    }

    /// A sync of `--sync-every` when local steps were taken since the last one (collective;
    /// nothing otherwise): the tables' deltas, then the dense delta ([`super::sync`]).
    fn sync(&mut self) -> TrainResult<()> {
        if !self.local.as_ref().is_some_and(|l| l.pending()) {
            return Ok(());
        }
        self.phases.enter("sync");
        let (st, sparse_skips) = self.embedding.sync_tables()?;
        if let Some(st) = st {
            self.count_sparse(&st);
        }
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
        let mine = crate::signals::requested().unwrap_or(0);
        let mut signal = 0i32;
        {
            let _w = crate::watchdog::waiting("the ranks' check for a stop signal");
            topo.world.comm.all_reduce_into(&mine, &mut signal, SystemOperation::max());
        }
        if signal != 0 {
            let checkpoint = match &cfg.checkpoint_dir {
                Some(dir) => {
                    if !saved {
                        self.save_checkpoint(dir, false)?;
                    }
                    Some(dir.clone())
                }
                None => None,
            };
            return Err(TrainError::Stopped { signal, step: self.position.step, checkpoint });
        }
        Ok(())
    }

    /// Rank 0 writes the checkpoint of this step (the table and the dense half, see
    /// [`checkpoint`]); every rank learns the outcome. With `gated` and
    /// `--checkpoint-min-change`, rank 0 first measures how far the dense parameters moved
    /// since the last checkpoint and skips it (saying so) when that is less. Returns
    /// whether a checkpoint was written.
    fn save_checkpoint(&mut self, dir: &Path, gated: bool) -> TrainResult<bool> {
        // A checkpoint holds a synchronised state (`--sync-every`).
        self.sync()?;
        let mine = if self.topo.rank == 0 {
            (|| -> Result<bool, String> {
                let p = self.position;
                let params = self.model.params().map_err(|e| e.to_string())?;
                let min = self.cfg.checkpoint_min_change;
                if let (true, Some(last)) = (gated && min > 0.0, &self.last_saved) {
                    let change = checkpoint::relative_change(&params, last);
                    if change < min {
                        crate::eprint_line(&format!("ringrec: step {}: the parameters moved {:.3}% since the last checkpoint, less than --checkpoint-min-change {:.3}%: not written", p.step, 100.0 * change, 100.0 * min));
                        self.counters.checkpoints_skipped += 1;
                        return Ok(false);
                    }
                    crate::eprint_line(&format!("ringrec: step {}: the parameters moved {:.3}% since the last checkpoint: written", p.step, 100.0 * change));
                }
                let opt = self.model.optim_state().map_err(|e| e.to_string())?;
                let dense = DenseState { step: p.step, epoch: p.epoch, step_in_epoch: p.in_epoch, opt, widths: self.model.mlp().shape().widths(), params };
                checkpoint::write(dir, &dense, self.embedding.table().table(), &self.resume_settings, self.cfg.keep_checkpoints).map_err(|e| e.to_string())?;
                self.counters.checkpoints_written += 1;
                if self.last_saved.is_some() {
                    self.last_saved = Some(dense.params);
                }
                Ok(true)
            })()
        } else {
            Ok(true)
        };
        let written = self.topo.agree(mine).map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        // Rank 0 decided: every rank must know (the stop-signal check depends on it).
        let mut w = [u8::from(written)];
        self.coll.broadcast(&mut w, 0)?;
        Ok(w[0] == 1)
    }

    /// Allreduces of the dense model over the world in this run: one per step, or with
    /// `--sync-every` k > 1 one per sync.
    fn dense_allreduces(&self) -> u64 {
        self.local.as_ref().map_or(self.counters.steps, |l| l.counts().syncs)
    }

    /// Seconds of training so far (wall time less the evaluations during training).
    fn train_seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64() - self.eval_seconds
    }

    /// The interval report of `--eval-every` (collective): the loss of the steps since the
    /// last report, the held-out evaluation, throughput and traffic; rank 0 writes it as
    /// one JSON line to `--metrics-out` and shows it in the progress.
    fn report_interval(&mut self) -> TrainResult<()> {
        // The evaluation sees a synchronised state (`--sync-every`).
        self.sync()?;
        if let Some(u) = self.unread.take() {
            self.record(self.model.loss_sum()?, u)?;
        }
        let t = Instant::now();
        let eval = if self.cfg.eval && self.data.has_held_out() { Some(self.evaluate()?) } else { None };
        self.eval_seconds += t.elapsed().as_secs_f64();
        if let Some(e) = &eval {
            self.last_eval = Some((self.position.step, *e));
        }
        let eval = eval.flatten();
        self.check_targets(eval)?;
        let now = Mark {
            step: self.position.step,
            samples: self.counters.global_samples,
            train_seconds: self.train_seconds(),
            intra_bytes: self.counters.intra_bytes,
            cross_bytes: self.counters.cross_bytes,
            dense_allreduces: self.dense_allreduces(),
        };
        let (m, l) = (self.mark, &mut self.losses);
        let train_loss = (l.interval_steps > 0).then(|| l.interval_sum / l.interval_steps as f64);
        (l.interval_sum, l.interval_steps) = (0.0, 0);
        self.mark = now;
        self.progress.eval_auc = eval.map(|e| e.auc);
        let Some(w) = self.metrics.as_mut() else { return Ok(()) };
        let seconds = (now.train_seconds - m.train_seconds).max(1e-9);
        let rate = (now.samples - m.samples) as f64 / seconds;
        let reduced = (now.dense_allreduces - m.dense_allreduces) as f64;
        // The table's counts since the run started (admissions are rows inserted).
        let (h, c) = (*self.embedding.table().table().header(), self.embedding.counts());
        let line = serde_json::json!({
            "step": now.step,
            "epoch": self.position.epoch,
            "samples": now.samples,
            "train_loss": train_loss,
            "samples_per_sec": rate,
            "samples_per_sec_per_rank": rate / self.topo.size as f64,
            "eval_auc": eval.map(|e| e.auc),
            "eval_logloss": eval.map(|e| e.logloss),
            "eval_rows": self.data.held_out_rows(),
            "table_rows": self.embedding.table().table().live_rows(),
            "table_capacity": h.capacity,
            "table_bytes": h.layout.file_len,
            "table_growths": c.growths,
            "table_admissions": c.inserted,
            "table_evictions": c.evicted,
            "table_expirations": c.expired,
            "table_refused": c.refused,
            "admission_sketch_bytes": h.layout.sketch_len,
            "dense_bytes_reduced": reduced * 4.0 * (self.model.mlp().num_params() + 1) as f64,
            "sparse_bytes_intra_host": now.intra_bytes - m.intra_bytes,
            "sparse_bytes_cross_host": now.cross_bytes - m.cross_bytes,
            "train_seconds": now.train_seconds,
            "eval_seconds": self.eval_seconds,
            "checkpoints_written": self.counters.checkpoints_written,
            "checkpoints_skipped": self.counters.checkpoints_skipped,
        });
        use std::io::Write;
        let written = writeln!(w, "{line}").and_then(|_| w.flush());
        written.map_err(|e| TrainError::Config(format!("--metrics-out: cannot write it: {e}")))
    }

    /// Whether a `--stop-at-loss` / `--stop-at-auc` target is reached by `eval` (rank 0's;
    /// collective: rank 0 decides and tells every rank, so all stop after the same step).
    fn check_targets(&mut self, eval: Option<Evaluation>) -> TrainResult<()> {
        let cfg = self.cfg;
        if cfg.stop_at_loss.is_none() && cfg.stop_at_auc.is_none() {
            return Ok(());
        }
        // [reached (0/1), which (0 loss, 1 auc), value]
        let mut decision = [0f64; 3];
        if let Some(e) = eval {
            if cfg.stop_at_loss.is_some_and(|x| e.logloss <= x) {
                decision = [1.0, 0.0, e.logloss];
            } else if cfg.stop_at_auc.is_some_and(|y| e.auc >= y) {
                decision = [1.0, 1.0, e.auc];
            }
        }
        {
            use mpi::traits::{Communicator, Root};
            let _w = crate::watchdog::waiting("rank 0's stop-at decision");
            self.topo.world.comm.process_at_rank(0).broadcast_into(&mut decision[..]);
        }
        if decision[0] == 1.0 {
            let (flag, target, what) = if decision[1] == 0.0 { ("--stop-at-loss", cfg.stop_at_loss.unwrap_or_default(), "log loss") } else { ("--stop-at-auc", cfg.stop_at_auc.unwrap_or_default(), "AUC") };
            let step = self.position.step;
            if self.topo.rank == 0 {
                crate::eprint_line(&format!("ringrec: step {step}: held-out {what} {:.6} reached {flag} {target}: every rank stops after this step", decision[2]));
            }
            self.stopped = Some(super::StopTarget { step, target: format!("{flag} {target}"), value: decision[2] });
        }
        Ok(())
    }

    /// Scores the held-out rows (each rank a slice of the [`EvalSet`], in batches of
    /// `--batch`; the `--eval-data` files are opened the first time: the scoring of
    /// `ringrec predict`, [`predict::gather_scores`]), and computes the exact global log
    /// loss and AUC on rank 0 (`None` elsewhere).
    pub fn evaluate(&mut self) -> TrainResult<Option<Evaluation>> {
        let set: EvalSet = self.data.held_out(self.topo)?.clone();
        let scores = predict::gather_scores(self.topo, self.coll.as_mut(), &mut self.model, self.embedding.table(), &mut self.batch, &set, self.cfg.batch)?;
        set.release_pages();
        Ok(scores.map(|scores| {
            let labels = set.labels();
            Evaluation { logloss: metrics::logloss(&scores, &labels), auc: metrics::auc(&scores, &labels) }
        }))
    }

    /// Ends the run on every rank (collective): the last loss, the held-out evaluation
    /// (unless disabled) and the summary (the same on every rank but the evaluation,
    /// which rank 0 holds).
    pub fn summary(mut self) -> TrainResult<TrainSummary> {
        // The run ends synchronised (`--sync-every`).
        self.sync()?;
        if let Some(u) = self.unread.take() {
            self.record(self.model.loss_sum()?, u)?;
        }
        let topo = self.topo;
        {
            let _w = crate::watchdog::waiting("the ranks' barrier");
            topo.world.comm.barrier();
        }
        let train_seconds = self.train_seconds();
        if topo.config.log_sparse {
            let x = self.embedding.exchanger();
            crate::eprint_line(&format!("rank {} sparse exchange over {} steps: {}", topo.rank, x.steps(), x.totals()));
        }
        let _w = crate::watchdog::waiting("the run's summary");
        let mut samples = 0u64;
        topo.world.comm.all_reduce_into(&self.counters.samples, &mut samples, SystemOperation::sum());
        let eval = match self.last_eval {
            // The last interval report evaluated this very model.
            Some((step, e)) if step == self.position.step => e,
            _ if self.cfg.eval && self.data.has_held_out() => self.evaluate()?,
            _ => None,
        };
        let mut peak = 0f64;
        topo.world.comm.all_reduce_into(&metrics::peak_rss_mib(), &mut peak, SystemOperation::max());
        let traffic = self.traffic_per_rank();
        let cross_sent: u64 = traffic.iter().map(|t| t.cross_host_sent).sum();
        let mlp = self.phases.seconds("mlp");
        let steps = self.counters.steps.max(1) as f64;
        let on_cpu = self.model.device().kind() == "cpu";
        let sync = self.sync_summary()?;
        Ok(TrainSummary {
            ranks: topo.size,
            hosts: topo.num_hosts,
            threads_per_rank: self.cfg.threads_per_rank(topo),
            backend: self.coll.name().to_string(),
            device: self.model.device().describe(),
            sparse_exchange: self.cfg.sparse_exchange.name().to_string(),
            sparse_normalize: self.cfg.sparse_normalize.name().to_string(),
            train_rows: self.data.train_rows(),
            test_rows: self.data.held_out_rows(),
            steps: self.counters.steps,
            global_step: self.position.step,
            samples,
            train_seconds,
            samples_per_sec: self.counters.global_samples as f64 / train_seconds.max(1e-9),
            train_loss: self.losses.sum / self.losses.steps.max(1) as f64,
            test_logloss: eval.map(|e| e.logloss),
            test_auc: eval.map(|e| e.auc),
            peak_rss_mib: peak,
            mlp_gflops: if mlp > 0.0 && on_cpu { self.model.mlp().shape().flops_per_sample() * self.counters.samples as f64 / mlp / 1e9 } else { 0.0 },
            table_rows: self.embedding.table().table().live_rows(),
            sparse_bytes_intra_host_per_step: self.counters.intra_bytes / steps,
            sparse_bytes_cross_host_per_step: self.counters.cross_bytes / steps,
            params_fnv: crate::hash::fnv_hex(bytemuck::cast_slice(&self.model.params()?)),
            checkpoints_written: self.counters.checkpoints_written,
            checkpoints_skipped: self.counters.checkpoints_skipped,
            nan_skips: [("dense".to_string(), self.counters.nan_skips_dense), ("sparse".to_string(), self.embedding.nan_skips())].into_iter().collect(),
            phase_seconds: self.phases.totals(),
            losses: std::mem::take(&mut self.losses.all),
            stopped_at_target: self.stopped.clone(),
            sparse_cross_host_bytes_per_sample: cross_sent as f64 / (self.counters.global_samples.max(1)) as f64,
            sparse_traffic_per_rank: traffic,
            ..self.dense_summary(cross_sent, sync)
        })
    }

    /// The `--sync-every` part of the summary, with the table's part (collective): the
    /// syncs, the sparse deltas summed over the hosts and ranks, each host's table rows'
    /// CRC-32.
    fn sync_summary(&self) -> TrainResult<TrainSummary> {
        let world = &self.topo.world.comm;
        let d = self.embedding.delta_counts();
        let mine = [d.touched_rows, d.delta_rows, d.cross_bytes_sent, d.cross_bytes_received];
        let mut all = [0u64; 4];
        world.all_reduce_into(&mine[..], &mut all[..], SystemOperation::sum());
        let fnv = crate::hash::fnv1a64(bytemuck::cast_slice(&self.model.params()?));
        let mut fnvs = vec![0u64; self.topo.size];
        world.all_gather_into(&fnv, &mut fnvs[..]);
        // The hosts' rows (k > 1 or --sparse-compression only: it reads the whole table,
        // which a synchronous run's invariant makes pointless).
        let check = self.local.is_some() || self.cfg.sparse_compression != crate::engine::Compression::None;
        let crc = if self.topo.is_leader() && check { self.embedding.rows_crc()? as u64 } else { u64::MAX };
        let mut crcs = vec![0u64; self.topo.size];
        world.all_gather_into(&crc, &mut crcs[..]);
        let mut per_host = vec![String::new(); self.topo.num_hosts];
        for (r, c) in crcs.iter().enumerate().filter(|(_, c)| **c != u64::MAX) {
            per_host[self.topo.host_of_rank[r]] = format!("{c:08x}");
        }
        let (every, scope) = self.local.as_ref().map_or((1, self.cfg.sync_scope), |l| (l.every(), l.scope()));
        let syncs = self.dense_allreduces();
        Ok(TrainSummary {
            sync_every: every,
            sync_scope: scope.to_string(),
            syncs,
            dense_world_allreduces: syncs,
            dense_param_bytes: 4 * self.model.mlp().num_params() as u64,
            sync_touched_rows: all[0],
            sync_delta_rows: all[1],
            sync_delta_cross_bytes_sent: all[2],
            sync_delta_cross_bytes_received: all[3],
            table_rows_crc_per_host: per_host,
            params_fnv_per_rank: fnvs.iter().map(|f| format!("{f:016x}")).collect(),
            samples_merged: self.data.weight_counts().0,
            samples_dropped_by_weight: self.data.weight_counts().1,
            weight_column: self.cfg.weights.weight_column,
            ..self.table_summary()
        })
    }

    /// The dense half of the summary's traffic, and its sum with the sparse cross-host
    /// bytes sent (collective).
    fn dense_summary(&self, sparse_cross_sent: u64, rest: TrainSummary) -> TrainSummary {
        let s = self.engine.stats();
        let backend = self.engine.device().and_then(crate::comm::traffic::model_name).unwrap_or(self.engine.backend_name()).to_string();
        let (model, counted) = self.dense_traffic(&s);
        let source = if counted.is_some() { "counted" } else { "model" };
        let traffic = counted.unwrap_or_else(|| model.clone());
        let cross: u64 = traffic.iter().map(|t| t.cross_host_sent).sum::<u64>() + sparse_cross_sent;
        let steps = self.counters.steps.max(1) as f64;
        TrainSummary {
            dense_compression: self.engine.compression().name().to_string(),
            dense_bytes_per_step: s.bytes as f64 / steps,
            dense_wire_bytes_per_step: (s.allreduce_wire_bytes + s.allgather_wire_bytes) as f64 / steps,
            dense_traffic_per_rank: traffic,
            dense_traffic_source: source.to_string(),
            dense_traffic_model_per_rank: model,
            dense_traffic_model: backend,
            dense_collectives: s.collectives,
            sparse_compression: self.cfg.sparse_compression.name().to_string(),
            sparse_compression_residual_rows: self.embedding.exchanger().compression_residual_rows() as u64,
            cross_host_bytes_per_sample: cross as f64 / self.counters.global_samples.max(1) as f64,
            ..rest
        }
    }

    /// Every rank's dense traffic (the engine's collectives, and scope host's host
    /// allreduces) as modelled, and as counted where every rank's backends count it
    /// (collective: gathered on every rank).
    fn dense_traffic(&self, s: &crate::engine::StatsSnapshot) -> (Vec<super::RankTraffic>, Option<Vec<super::RankTraffic>>) {
        let (host_counted, host_model) = self.local.as_ref().map_or((Some(Traffic::default()), Traffic::default()), |l| l.host_traffic());
        let mut m = Traffic::from_array(s.modelled_traffic);
        m.add(host_model);
        let model = self.gather_traffic(m.to_array().map(|b| b.round() as u64));
        let engine_counted = s.counted_traffic.map(|c| Traffic::from_array(c.map(|b| b as f64)));
        let mine = count::sum(engine_counted, host_counted).map_or([u64::MAX; 4], |t| t.to_array().map(|b| b as u64));
        let counted = self.gather_traffic(mine);
        let all = counted.iter().all(|t| t.intra_host_sent != u64::MAX);
        (model, all.then_some(counted))
    }

    /// Every rank's sparse-exchange bytes by direction (collective: gathered on every rank).
    fn traffic_per_rank(&self) -> Vec<super::RankTraffic> {
        let t = self.embedding.traffic_totals();
        self.gather_traffic([t.host_bytes_sent, t.host_bytes_received, t.cross_bytes_sent, t.cross_bytes_received])
    }

    /// Every rank's `[intra sent, intra received, cross sent, cross received]` (collective:
    /// gathered on every rank).
    fn gather_traffic(&self, t: [u64; 4]) -> Vec<super::RankTraffic> {
        let mine = [t[0], t[1], t[2], t[3], self.topo.host_id as u64];
        let mut all = vec![0u64; mine.len() * self.topo.size];
        self.topo.world.comm.all_gather_into(&mine[..], &mut all[..]);
        all.chunks_exact(mine.len())
            .enumerate()
            .map(|(rank, c)| super::RankTraffic { rank, host: c[4] as usize, intra_host_sent: c[0], intra_host_received: c[1], cross_host_sent: c[2], cross_host_received: c[3] })
            .collect()
    }

    /// The table's part of the summary: its shape at the end, and what happened to its
    /// rows in this run.
    fn table_summary(&self) -> TrainSummary {
        let e = &self.embedding;
        let h = e.table().table().header();
        let c = e.counts();
        let (growth_seconds, growth_max_seconds) = e.growth_seconds();
        TrainSummary {
            table_dtype: h.dtype.to_string(),
            table_capacity: h.capacity,
            table_bytes: h.layout.file_len,
            table_max_bytes: e.max_bytes(),
            table_growths: c.growths,
            table_growth_seconds: growth_seconds,
            table_growth_max_seconds: growth_max_seconds,
            table_inserted: c.inserted,
            table_evictions: c.evicted,
            table_expirations: c.expired,
            table_refused: c.refused,
            admission_sketch_bytes: h.layout.sketch_len,
            ..TrainSummary::default()
        }
    }
}
