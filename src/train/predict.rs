//! Scoring rows with a trained model: the one scoring path of `train`'s held-out
//! evaluation ([`super::Trainer::evaluate`]) and of `ringrec predict` ([`run`]), so the two
//! give the same bits for the same model, rows, `--batch` and rank count.
//!
//! [`gather_scores`] cuts a range of rows into rank slices ([`shard::rank_slice`]: rank r
//! scores the r-th contiguous part), each rank scores its slice in batches of `--batch`
//! rows ([`score_rows`]: the table lookup into the model's staging slot, the forward pass,
//! the sigmoid), and rank 0 gathers the scores in rank order, which is row order.
//!
//! `ringrec predict --model DIR --data FILES` ([`run`]): rank 0 resolves the model
//! ([`ModelSource`]: a checkpoint directory, one checkpoint, or an export bundle) and
//! checks every checksum; the dense weights are broadcast; each host leader fills the host
//! table once (a checkpoint's table copied byte for byte, a bundle's rows imported with its
//! initial-row rule, so keys the table lacks score as in training) and the other local
//! ranks map it; each file is opened like training data (a TSV parsed once per host into
//! its cache, or a `.rrdata` cache) and scored in order. Rank 0 holds the scores and
//! labels in row order and computes the exact AUC and log loss ([`super::metrics`]).
//! The bits depend on how the rows are cut into batches (a GEMM's blocking, and so its
//! rounding, follows the batch's row count): the same `--batch` and rank count as the
//! training run give its evaluation's scores exactly; other values give the same scores
//! within a few units in the last place (within 1e-6, tests/predict.rs).

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::batch::Batch;
use super::embedding::TableName;
use super::tables::{Gather, TableLayout, TableSpec};
use crate::model::pooling::Pooling;
use super::source::{Fallback, ModelSource, SourceKind};
use super::{metrics, TrainError, TrainResult};
use crate::comm::{self, Backend, Collectives, CollectivesExt};
use crate::data::cache::Dataset;
use crate::data::{inputs, shard, EvalSet, PrepareOptions};
use crate::device::cpu::sigmoid;
use crate::device::{CpuDevice, Device, HostKernels, HostOptions, Placement};
use crate::embedding::{EmbeddingTable, HostTable};
use crate::model::{DenseModel, DenseOptimState, DenseOptimizer};
use crate::topology::Topology;

/// Stages batch `b` for `model`: its unique keys' rows from `table`, its inverse map, dense
/// features and labels, and its multi-hot bags (a model and a batch with as many
/// multi-hot fields).
pub fn stage<D: Device>(model: &mut DenseModel<D>, table: &HostTable, b: &Batch) -> TrainResult<()> {
    stage_from(model, table.table(), b)
}

/// [`stage`] from any table (a host table's, or one a single process maps, `ringrec
/// serve-model`).
pub fn stage_from<D: Device>(model: &mut DenseModel<D>, table: &EmbeddingTable, b: &Batch) -> TrainResult<()> {
    let (spec, bags) = (model.spec(), model.multi_hot_fields());
    let takes = crate::data::Fields { dense: spec.ndense, sparse: spec.fields - bags };
    if b.fields != takes || b.bags != bags {
        return Err(crate::device::DeviceError::refused("staging a batch", format!("the batch has {}, the model takes {}", b.fields.with_lists(b.bags), takes.with_lists(bags))).into());
    }
    let st = model.stage(b.len(), b.uniq.len())?;
    table.lookup(&b.uniq, st.emb)?;
    st.inverse.copy_from_slice(&b.inverse);
    st.dense.copy_from_slice(&b.dense);
    st.labels.copy_from_slice(&b.labels);
    stage_bags(model, b)
}

/// Stages the bags of a multi-hot batch `b` (its ids rows among its unique keys) after its
/// rows ([`DenseModel::stage`] or `stage_sourced`); nothing for a single-hot batch.
pub(super) fn stage_bags<D: Device>(model: &mut DenseModel<D>, b: &Batch) -> TrainResult<()> {
    if b.bags > 0 {
        let (offsets, index) = model.stage_bags(b.len(), b.bag_index.len())?;
        offsets.copy_from_slice(&b.bag_offsets);
        index.copy_from_slice(&b.bag_index);
    }
    Ok(())
}

/// Where a batch's rows come from: the run's one table, or its `--table` tables beside the
/// default one ([`Tables`]).
pub enum Embeddings<'a> {
    /// One table holds every field.
    One(&'a EmbeddingTable),
    /// Every table of a `--table` run (the default one first) and the gathering over them.
    Split(Vec<&'a EmbeddingTable>, &'a mut Gather),
}

impl Embeddings<'_> {
    /// Stages batch `b` for `model` from these tables ([`stage_from`], [`Tables::stage`]).
    pub fn stage<D: Device>(&mut self, model: &mut DenseModel<D>, b: &Batch) -> TrainResult<()> {
        match self {
            Embeddings::One(t) => stage_from(model, t, b),
            Embeddings::Split(tables, gather) => gather.stage(model, tables, b),
        }
    }
}

/// Appends the scores (sigmoid of the logit) of positions `positions` of `set` to `out`,
/// scoring them in batches of `batch_rows` from the first ([`EvalSet::batches`]; `batch` is
/// scratch).
#[allow(clippy::too_many_arguments)]
pub fn score_rows<D: Device>(model: &mut DenseModel<D>, emb: &mut Embeddings<'_>, batch: &mut Batch, set: &EvalSet, positions: Range<usize>, batch_rows: usize, out: &mut Vec<f32>) -> TrainResult<()> {
    let mut logits = Vec::new();
    for pieces in set.batches(positions, batch_rows) {
        batch.load_pieces(pieces.into_iter().map(|(ds, rows)| (ds, rows.map(|r| r as u32))))?;
        score_batch(model, emb, batch, &mut logits, out)?;
    }
    Ok(())
}

/// The one scoring step: appends the scores (sigmoid of the logit) of the rows of `b` to
/// `out` — the table lookup into the model's staging slot (from every table of a `--table`
/// model), the forward pass, the sigmoid (`logits` is scratch). [`score_rows`] and
/// `ringrec serve-model` ([`super::scorer`]) score through it.
pub fn score_batch<D: Device>(model: &mut DenseModel<D>, emb: &mut Embeddings<'_>, b: &Batch, logits: &mut Vec<f32>, out: &mut Vec<f32>) -> TrainResult<()> {
    emb.stage(model, b)?;
    score_staged(model, logits, out)
}

/// The scoring step after the staging: the forward pass of the staged batch and the
/// sigmoid, appended to `out` (`logits` is scratch).
fn score_staged<D: Device>(model: &mut DenseModel<D>, logits: &mut Vec<f32>, out: &mut Vec<f32>) -> TrainResult<()> {
    model.load()?;
    model.predict(logits)?;
    out.extend(logits.iter().map(|z| sigmoid(*z)));
    Ok(())
}

/// The dense model of `src` on `dev`, for scoring (no optimizer state): its widths and
/// weights over the table's embedding dimension.
pub fn scoring_model<D: Device>(dev: D, src: &ModelSource) -> TrainResult<DenseModel<D>> {
    let dense = src.dense.as_ref().ok_or_else(|| TrainError::Config(format!("{}: no dense weights", src.given.display())))?;
    // The model the source records (its spec), over the rows of its table.
    let n = dense.params.len();
    Ok(DenseModel::new(dev, dense.spec.clone(), &dense.params, &DenseOptimState::new(DenseOptimizer::Sgd, 0.0, n))?)
}

/// Scores every row of `set` over every rank (collective; see the module docs): rank 0
/// gets the scores in row order, the others `None`.
#[allow(clippy::too_many_arguments)]
pub fn gather_scores<D: Device>(topo: &Topology, coll: &mut dyn Collectives, model: &mut DenseModel<D>, mut emb: Embeddings<'_>, batch: &mut Batch, set: &EvalSet, batch_rows: usize) -> TrainResult<Option<Vec<f32>>> {
    let mine = shard::rank_slice(0..set.len(), topo.rank, topo.size);
    let mut scores = Vec::with_capacity(mine.len());
    score_rows(model, &mut emb, batch, set, mine, batch_rows, &mut scores)?;
    Ok(coll.gatherv(&scores, 0)?.map(|(v, _)| v))
}

/// What `ringrec predict` does (its flags).
#[derive(Clone, Debug)]
pub struct PredictConfig {
    /// A checkpoint directory, one checkpoint, or an export bundle.
    pub model: PathBuf,
    /// Criteo TSVs or `.rrdata` caches, scored in this order.
    pub data: Vec<PathBuf>,
    /// Where TSV caches live.
    pub data_dir: PathBuf,
    /// Rows per batch on each rank.
    pub batch: usize,
    /// Score only the last fraction of each file (the held-out split `train
    /// --test-fraction` cuts); 0: every row.
    pub test_fraction: f64,
    /// Where the dense model runs.
    pub device: Placement,
    /// Threads per rank (`None`: cores / ranks on this host).
    pub threads: Option<usize>,
    /// Malformed input lines tolerated per file.
    pub max_bad_lines: u64,
    /// `--weight-column`: the lines have 41 fields, the weight in this one (read past: a
    /// score does not depend on a weight); `None`: Criteo's 40.
    pub weight_column: Option<u32>,
    /// A Parquet input's label column and feature columns, as `train` read them
    /// (`--label-column`, `--dense-columns`, `--sparse-columns`).
    pub label_column: Option<String>,
    /// See `label_column`.
    pub dense_columns: Vec<String>,
    /// See `label_column`.
    pub sparse_columns: Vec<String>,
    /// `--multi-hot-pooling`: how the data's multi-hot fields are pooled; the model records
    /// it, and a value given must agree (`None`: the model's).
    pub multi_hot_pooling: Option<String>,
    /// `--schema`: the Parquet input's columns in a TOML file (instead of the column flags).
    pub schema: Option<std::path::PathBuf>,
    /// Host collectives backend (`None`: the best for the topology).
    pub backend: Option<Backend>,
    /// `--require-newest`: a checkpoint directory whose newest checkpoint is damaged is an
    /// error, not a fallback to the previous one.
    pub require_newest: bool,
}

/// One scored file.
#[derive(Clone, Debug, Serialize)]
pub struct ScoredFile {
    /// The file.
    pub path: PathBuf,
    /// Rows it has (malformed lines skipped).
    pub rows: usize,
    /// Rows scored (its held-out split with `--test-fraction`).
    pub scored: usize,
    /// Malformed lines skipped when it was parsed.
    pub bad_lines: u64,
}

/// What a predict run reports (rank 0 prints it).
#[derive(Clone, Debug, Serialize)]
pub struct PredictSummary {
    /// World size.
    pub ranks: usize,
    /// Hosts.
    pub hosts: usize,
    /// Where the dense model ran.
    pub device: String,
    /// The model (`checkpoint of step 40 (ckpt/step-...)`).
    pub model: String,
    /// What was used: the checkpoint (`ckpt/step-...`), the bundle or the file.
    pub model_path: PathBuf,
    /// Which model it is, and its shape (`dlrm (bottom 13-64-16, 351 dots, top 367-256-128-1)`).
    pub model_spec: String,
    /// Newer checkpoints of the directory skipped as damaged, each with why (empty: the
    /// newest was used).
    pub skipped: Vec<String>,
    /// The step it was trained to.
    pub step: Option<u64>,
    /// Rows of its table.
    pub table_rows: u64,
    /// The files, in order.
    pub files: Vec<ScoredFile>,
    /// Rows scored.
    pub rows: u64,
    /// Of them labelled 1.
    pub positives: u64,
    /// Exact AUC over every scored row (`None` without rows).
    pub auc: Option<f64>,
    /// Mean log loss.
    pub logloss: Option<f64>,
    /// Normalised entropy (log loss / entropy of the click rate; `None` with one class).
    pub ne: Option<f64>,
    /// Mean predicted probability / observed click rate (`None` without a positive).
    pub calibration: Option<f64>,
    /// Seconds from the start to the model and table in place on every rank.
    pub setup_seconds: f64,
    /// Seconds of scoring (data opened, rows scored, gathered).
    pub score_seconds: f64,
    /// Rows scored per second (all ranks).
    pub rows_per_sec: f64,
}

/// A predict run's result.
pub struct Predicted {
    /// The summary (rank 0's is complete; metrics are `None` elsewhere).
    pub summary: PredictSummary,
    /// Rank 0: every scored row's (score, label), in row order.
    pub scores: Option<(Vec<f32>, Vec<f32>)>,
}

impl PredictConfig {
    /// Refuses settings no run can use.
    pub fn validate(&self) -> TrainResult<()> {
        if self.batch == 0 {
            return Err(TrainError::Config("--batch must be positive".into()));
        }
        if !(0.0..1.0).contains(&self.test_fraction) {
            return Err(TrainError::Config(format!("--test-fraction must be in [0, 1), got {}", self.test_fraction)));
        }
        if self.data.is_empty() {
            return Err(TrainError::Config("--data needs at least one file".into()));
        }
        if let Some(c) = self.weight_column {
            crate::data::criteo::check_weight_column(c).map_err(TrainError::Config)?;
        }
        Ok(())
    }

    /// The Parquet input's named columns: `--schema`, or the column flags (exclusive).
    pub fn columns(&self) -> Result<crate::data::ColumnSpec, crate::data::DataError> {
        let flags = crate::data::ColumnSpec::from_flags(self.label_column.clone(), self.dense_columns.clone(), self.sparse_columns.clone(), None);
        // Scoring reads no weights: a schema's weight column need not be there.
        crate::data::ColumnSpec::resolve(self.schema.as_deref(), flags).map(|c| crate::data::ColumnSpec { weight: None, ..c })
    }

    /// Threads per rank on `topo`: `--threads`, else cores / ranks on this host.
    pub fn threads_per_rank(&self, topo: &Topology) -> usize {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        self.threads.unwrap_or((cores / topo.local_size).max(1)).max(1)
    }

    /// Every setting that must be the same on every rank.
    pub fn settings(&self, topo: &Topology) -> Vec<(&'static str, String)> {
        let rc = &topo.config;
        vec![
            ("--model", self.model.display().to_string()),
            ("--data", super::data::describe_inputs("--data", &self.data)),
            ("--batch", self.batch.to_string()),
            ("--test-fraction", self.test_fraction.to_string()),
            ("--device", self.device.to_string()),
            ("--max-bad-lines", self.max_bad_lines.to_string()),
            ("--weight-column", crate::settings::SettingValue::show(&self.weight_column)),
            ("--label-column", crate::settings::SettingValue::show(&self.label_column)),
            ("--dense-columns", self.dense_columns.join(",")),
            ("--sparse-columns", self.sparse_columns.join(",")),
            ("--multi-hot-pooling", crate::settings::SettingValue::show(&self.multi_hot_pooling)),
            ("--schema", self.columns().map_or_else(|e| format!("({e})"), |c| c.describe().unwrap_or_default())),
            ("--require-newest", self.require_newest.to_string()),
            ("--backend", self.backend.unwrap_or_else(|| Backend::auto(topo)).to_string()),
            ("RINGREC_SHM_DIR", rc.shm_dir.display().to_string()),
            ("RINGREC_RANKS_PER_HOST", rc.ranks_per_host.unwrap_or(0).to_string()),
            ("RINGREC_VERIFY", rc.verify.to_string()),
        ]
    }
}

/// Makes `model`'s last fields the multi-hot fields of `set`'s data (pooled as the model
/// `src` records; a `--multi-hot-pooling` given must agree), refusing data with other
/// fields than the model's.
fn multi_hot<D: Device>(model: &mut DenseModel<D>, cfg: &PredictConfig, src: &ModelSource, set: &EvalSet) -> TrainResult<Vec<Pooling>> {
    let Some((ds, _)) = set.parts().next() else { return Ok(Vec::new()) };
    let names = ds.list_names();
    let spec = model.spec();
    let have = ds.fields();
    // A `--table` model's fields are checked against its tables when a batch is staged.
    if src.tables.is_none() && (spec.fields != have.sparse + names.len() || spec.ndense != have.dense) {
        return Err(TrainError::Config(format!(
            "{}: its rows have {}, and the model takes {} dense and {} categorical fields: score the data the model was trained on",
            ds.path().display(),
            have.with_lists(names.len()),
            spec.ndense,
            spec.fields
        )));
    }
    if !names.is_empty() {
        let modes = crate::model::pooling::recorded_pooling(src.pooling.as_deref(), cfg.multi_hot_pooling.as_deref(), names, &src.describe()).map_err(TrainError::Config)?;
        // A `--table` model's fields are set by its tables' gathering ([`Gather::stage`]).
        if src.tables.is_none() {
            model.set_multi_hot(&modes)?;
        }
        return Ok(modes);
    }
    Ok(Vec::new())
}

/// A `--table` model's named tables (collective over the world; none for a model of one
/// table): each table file of the model (a checkpoint's `table.NAME.rrt`, copied; a
/// bundle's `table.NAME.bin`, imported) filled into a host table of its own, in the order
/// the model records them.
fn open_tables(topo: &Topology, src: &ModelSource) -> TrainResult<Vec<(TableSpec, HostTable)>> {
    let Some(t) = &src.tables else { return Ok(Vec::new()) };
    let specs = t.specs().map_err(|e| TrainError::Config(format!("{}: {e}", src.describe())))?;
    let mut out = Vec::with_capacity(specs.len());
    for (s, file) in specs.into_iter().zip(&t.files) {
        let tc = file.scoring_config();
        let table = HostTable::open_tagged(topo, file.source(&tc), &TableName::named(&s.name).tag("table"))?;
        out.push((s, table));
    }
    Ok(out)
}

/// The gathering over a `--table` model's tables (`default`, then `named`) for the rows of
/// `set`, whose first file is `input` (its fields' names), list fields pooled as `pooling`.
fn gather_of(cfg: &PredictConfig, input: &std::path::Path, set: &EvalSet, default: &HostTable, named: &[(TableSpec, HostTable)], pooling: &[Pooling]) -> TrainResult<Gather> {
    let Some((ds, _)) = set.parts().next() else { return Err(TrainError::Config("no rows to score".into())) };
    let columns = cfg.columns().map_err(|e| TrainError::Config(e.to_string()))?;
    let names = super::tables::field_names(&columns, input, ds.fields(), ds.list_names())?;
    let specs: Vec<TableSpec> = named.iter().map(|(s, _)| s.clone()).collect();
    let widths = std::iter::once(default).chain(named.iter().map(|(_, t)| t)).map(|t| t.table().dim()).collect();
    Ok(Gather::new(TableLayout::of(&specs, &names, ds.fields().sparse, widths)?, pooling))
}

/// Scores `cfg.data` with `cfg.model` on every rank of `topo` (collective; see the module
/// docs).
pub fn run(topo: &Topology, cfg: &PredictConfig) -> TrainResult<Predicted> {
    topo.agree_settings(&cfg.settings(topo))?;
    cfg.validate()?;
    let threads = cfg.threads_per_rank(topo);
    let _ = rayon::ThreadPoolBuilder::new().num_threads(threads).build_global();
    let placement = topo.agree(cfg.device.resolve(topo.machine_local_rank, topo.size).map_err(|e| format!("rank {}: {e}", topo.rank)))?;
    match placement {
        Placement::HostKernels => {
            let options = topo.agree(HostOptions::from_env(topo.rank))?;
            let dev = topo.agree(HostKernels::with_options(options).map_err(|e| format!("rank {}: {e}", topo.rank)))?;
            predict_on(topo, cfg, dev)
        }
        // Scoring needs no NCCL: ranks may share a GPU under --device cuda; --device auto
        // decides as train does (the CPU when they would), so both give the same scores.
        Placement::Cuda(ordinal) => match super::rank_gpu(topo, cfg.device, ordinal.unwrap_or(0), false)? {
            Some(dev) => predict_on(topo, cfg, dev),
            None => super::on_pool(|| predict_on(topo, cfg, CpuDevice::new(threads))),
        },
        Placement::Cpu | Placement::Auto => super::on_pool(|| predict_on(topo, cfg, CpuDevice::new(threads))),
    }
}

/// Opens `path` as training data is opened (a TSV through its cache, prepared once per
/// host on this rank's share of the cores; a `.rrdata` cache as it is) on every rank; every rank learns
/// whether all could and that they agree on its rows.
fn open_data(topo: &Topology, cfg: &PredictConfig, path: &std::path::Path) -> TrainResult<Dataset> {
    let columns = topo.agree(cfg.columns().map_err(|e| e.to_string()))?;
    let opts = PrepareOptions::new(cfg.max_bad_lines).threads(cfg.threads_per_rank(topo)).weight_column(cfg.weight_column).columns(columns);
    let ds = topo.agree(super::data::open_one(path, &cfg.data_dir.join("cache"), &opts).map_err(|e| e.to_string()))?;
    topo.agree_settings(&[("rows of --data (after skipping malformed lines)", format!("{}: {}", path.display(), ds.len()))])?;
    Ok(ds)
}

fn predict_on<D: Device>(topo: &Topology, cfg: &PredictConfig, dev: D) -> TrainResult<Predicted> {
    let started = Instant::now();
    let mut coll = comm::build(cfg.backend.unwrap_or_else(|| Backend::auto(topo)), topo)?;
    let mine = (topo.rank == 0).then(|| {
        let fallback = if cfg.require_newest { Fallback::Refuse("leave out --require-newest to score with it") } else { Fallback::Allow };
        ModelSource::open(&cfg.model, fallback).map_err(|e| e.to_string()).and_then(|m| {
            m.warn_skipped();
            match m.kind {
                SourceKind::Params => Err(format!("{}: a sparse-parameter file holds no dense weights; predict needs a checkpoint directory or an export bundle (ringrec export)", cfg.model.display())),
                _ => Ok(m),
            }
        })
    });
    let model_src = ModelSource::share(topo, coll.as_mut(), mine)?;
    let t = &model_src.table;
    let tc = t.scoring_config();
    let table = HostTable::open_from(topo, t.source(&tc))?;
    let named = open_tables(topo, &model_src)?;
    let mut model = scoring_model(dev, &model_src)?;
    {
        let _w = crate::watchdog::waiting("the ranks' barrier");
        coll.barrier()?;
    }
    let setup_seconds = started.elapsed().as_secs_f64();
    let scoring = Instant::now();
    let mut batch = Batch::default();
    let paths = topo.agree(inputs::resolve("--data", &cfg.data).map_err(|e| e.to_string()))?;
    let mut set = EvalSet::new();
    let mut files = Vec::with_capacity(paths.len());
    let first = paths.first().cloned().unwrap_or_default();
    for path in paths {
        let ds = open_data(topo, cfg, &path)?;
        let rows = if cfg.test_fraction > 0.0 { shard::split(ds.len(), cfg.test_fraction)?.1 } else { 0..ds.len() };
        files.push(ScoredFile { path, rows: ds.len(), scored: rows.len(), bad_lines: ds.header().bad_lines });
        set.push(Arc::new(ds), rows)?;
    }
    let pooling = multi_hot(&mut model, cfg, &model_src, &set)?;
    let mut gather = if named.is_empty() { None } else { Some(gather_of(cfg, &first, &set, &table, &named, &pooling)?) };
    let emb = match gather.as_mut() {
        Some(g) => Embeddings::Split(std::iter::once(&table).chain(named.iter().map(|(_, t)| t)).map(HostTable::table).collect(), g),
        None => Embeddings::One(table.table()),
    };
    // One set over every file, as train's evaluation scores its --eval-data files.
    let scores = gather_scores(topo, coll.as_mut(), &mut model, emb, &mut batch, &set, cfg.batch)?.unwrap_or_default();
    let labels = if topo.rank == 0 { set.labels() } else { Vec::new() };
    let score_seconds = scoring.elapsed().as_secs_f64();
    let rows: u64 = files.iter().map(|f| f.scored as u64).sum();
    let root = topo.rank == 0 && rows > 0;
    let eval = root.then(|| metrics::Evaluation::of(&scores, &labels));
    let summary = PredictSummary {
        ranks: topo.size,
        hosts: topo.num_hosts,
        device: model.device().describe(),
        model: model_src.describe(),
        model_path: model_src.path.clone(),
        model_spec: model.spec().describe(),
        skipped: model_src.skipped.clone(),
        step: model_src.step,
        table_rows: table.table().live_rows() + named.iter().map(|(_, t)| t.table().live_rows()).sum::<u64>(),
        files,
        rows,
        positives: labels.iter().filter(|y| **y > 0.5).count() as u64,
        auc: eval.map(|e| e.auc),
        logloss: eval.map(|e| e.logloss),
        ne: eval.and_then(|e| e.ne),
        calibration: eval.and_then(|e| e.calibration),
        setup_seconds,
        score_seconds,
        rows_per_sec: rows as f64 / score_seconds.max(1e-9),
    };
    Ok(Predicted { summary, scores: (topo.rank == 0).then_some((scores, labels)) })
}
