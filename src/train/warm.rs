//! Warm start (`train --init-from PATH [--init-dense FILE]`): a new run that starts from a
//! trained model instead of the seed's initial one.
//!
//! PATH is a checkpoint directory (or one checkpoint), an export bundle, or a
//! sparse-parameter file ([`ModelSource`]). Rank 0 resolves and checks it (every checksum)
//! and compares it with this run's flags: a dense model of another kind or shape (`--model`,
//! `--dim`, `--hidden` and the kind's own shape flags: [`ModelSpec::differences`]), a table
//! of another row width (`--dim`; deepfm and wide-deep rows hold one more value, the key's
//! first-order weight) or `--table-dtype`, or a saved table of another
//! `--sparse-optimizer` is refused, naming the flag and both values. Where only the dense
//! model differs and the table's rows are as wide as this run reads (an `mlp` checkpoint
//! for a `dlrm` run of the same `--dim`), the refusal says how to start from the table
//! alone (as a sparse-parameter file, with new dense parameters). The dense parameters
//! are broadcast from rank 0; each host leader fills its host table from the source (a
//! checkpoint's saved table byte for byte, Adagrad accumulators and a grown capacity
//! included; a bundle's or a parameter file's rows imported into a new table of this run's
//! shape, with at least `--table-capacity` slots and enough to hold them below the
//! high-water mark). The table then grows, admits and evicts as this run's flags say.
//!
//! A `--table` model (fields in tables of their own) starts a run with the same `--table`
//! flags: the same tables over the same fields, each of the same row width (a capacity may
//! differ), each table filled from its own file as the default one is
//! ([`super::tables::Tables::open`]); another layout, a one-table model for a `--table` run
//! or the reverse is refused naming both.
//!
//! What carries over: the model always; the optimizer state only from a checkpoint (Adam's
//! moments and step count, with this run's `--lr`; the table's Adagrad accumulators), when
//! the dense optimizer is the same. Otherwise the optimizers start anew. Rank 0 says which,
//! in one line on stderr.
//!
//! A warm start is a new run: its step count starts at 0 (checkpoints `step-1...`,
//! `--max-steps` count this run's steps) and its data at the beginning of `--data`. Adam's
//! bias correction goes on from the carried step count, so a checkpoint of N steps on day
//! A continued with `--init-from` for M steps on day B ends bit-identical to one run of N + M
//! steps over A then B (tests/predict.rs).

use super::source::{Fallback, ModelSource, SourceKind, TableFile};
use super::{TrainConfig, TrainResult};
use crate::comm::Collectives;
use crate::embedding::TableConfig;
use crate::model::DenseOptimState;
use crate::topology::Topology;

use crate::model::DenseWeights;

/// Rank 0's checks of `m` against this run (see the module docs); what to share: the
/// source with what is not carried taken out, and the line that says so.
fn check(cfg: &TrainConfig, mine: &crate::model::ModelSpec, run: &TableConfig, mut m: ModelSource) -> Result<(ModelSource, String), String> {
    let flag = format!("--init-from {}", m.given.display());
    if let Some(d) = &cfg.init_dense {
        if m.kind != SourceKind::Params {
            return Err(format!("--init-dense {}: {flag} names the {}, which holds dense weights already; --init-dense goes with a sparse-parameter file", d.display(), m.describe()));
        }
        m.dense = Some(DenseWeights::read(d).map_err(|e| format!("--init-dense: {e}"))?);
    }
    match (&m.tables, cfg.tables.is_empty()) {
        (Some(named), _) => {
            if let Some((theirs, ours)) = named.difference(&cfg.tables, |t| cfg.for_table(t).row_width()) {
                return Err(format!("{flag}: --table: its model was trained with {theirs}, this run has {ours}; start with the same tables over the same fields, each of the same dim (a capacity may differ)"));
            }
        }
        (None, false) => return Err(format!("{flag}: --table: its model keeps every field in one table, this run has {}; start from it without --table", cfg.tables.iter().map(crate::settings::Word::word).collect::<Vec<_>>().join(" "))),
        (None, true) => {}
    }
    // A `--table` run's model reads every table's rows; its default table's are `--dim`'s.
    let width = if cfg.tables.is_empty() { mine.row_width() } else { cfg.row_width() };
    let t = &m.table;
    if t.dim as usize != width {
        let theirs = m.model().map(|d| format!(" (its model: the {d})")).unwrap_or_default();
        if mine.first_order() || m.dense.as_ref().is_some_and(|d| d.spec.first_order()) {
            return Err(format!("{flag}: its table's rows have {} values{theirs}, this run's {} reads {width} (--dim {}{})", t.dim, mine.kind, cfg.dim, if mine.first_order() { " and the key's first-order weight" } else { "" }));
        }
        return Err(format!("{flag}: its table has dim {}, this run has --dim {}; pass --dim {} or start from a model of dim {}", t.dim, cfg.dim, t.dim, cfg.dim));
    }
    if let Some(d) = &m.dense {
        let diffs = d.spec.differences(mine);
        if !diffs.is_empty() {
            let from = cfg.init_dense.as_ref().map_or(flag.clone(), |p| format!("--init-dense {}", p.display()));
            let what: Vec<String> = diffs.iter().map(|(f, theirs, ours)| format!("{f} {theirs} there, {ours} here")).collect();
            let carry = if cfg.init_dense.is_some() { String::new() } else { table_carry(&m) };
            return Err(format!("{from}: its dense model is not this run's: {} (its {}, this run's {}){carry}", what.join("; "), d.spec.describe(), mine.describe()));
        }
    }
    if let Some(theirs) = &m.columns {
        let mine = cfg.columns().map_err(|e| e.to_string())?;
        if let Some((column, there, here)) = theirs.first_difference(&mine) {
            return Err(format!("{flag}: it was trained on other Parquet columns: column `{column}` is {there} there and {here} here; name the columns as its run did (--schema or the column flags)"));
        }
    }
    // Every table of a `--table` model has the run's dtype and sparse optimizer.
    for (i, t) in std::iter::once(t).chain(m.tables.iter().flat_map(|n| &n.files)).enumerate() {
        let which = if i == 0 { "its table".to_string() } else { format!("its table {}", t.path.display()) };
        if let Some(d) = t.dtype.filter(|d| *d != run.dtype) {
            return Err(format!("{flag}: {which} stores {d}, this run uses --table-dtype {}; pass --table-dtype {d}", run.dtype));
        }
        // The table's capacity need not be --table-capacity's: a saved table is copied as it
        // is (it may have grown), imported rows get a table that holds them, and either grows.
        if let Some(s) = t.saved.filter(|s| s.optimizer != run.optimizer) {
            return Err(format!("{flag}: {which} holds the state of --sparse-optimizer {}, this run has --sparse-optimizer {}; pass --sparse-optimizer {}", s.optimizer, run.optimizer, s.optimizer));
        }
    }
    let dense = match (&m.dense, &cfg.init_dense) {
        (None, _) => format!("dense parameters initialised from --seed {}", cfg.seed),
        (Some(_), Some(p)) => format!("dense parameters from {}", p.display()),
        (Some(_), None) => "its dense parameters".into(),
    };
    let sparse_state = match (t.saved, run.optimizer) {
        (Some(_), crate::embedding::OptimizerKind::Adagrad) => "; the table's Adagrad accumulators carried",
        (None, crate::embedding::OptimizerKind::Adagrad) => "; the table's Adagrad accumulators start anew",
        _ => "",
    };
    // Adagrad accumulators that start anew make the run differ from one that never stopped.
    let sparse_lost = if t.saved.is_none() && run.optimizer == crate::embedding::OptimizerKind::Adagrad { NOT_EQUAL } else { "" };
    let opt = match m.opt.take() {
        Some(o) if o.kind == cfg.dense_optimizer => {
            let line = format!("its {} state carried (optimizer step {}, --lr {}){sparse_state}{sparse_lost}", o.kind, o.step, cfg.lr);
            m.opt = Some(o);
            line
        }
        Some(o) => format!("its optimizer state is {}'s, this run uses --dense-optimizer {}: a new optimizer state{sparse_state}{NOT_EQUAL}", o.kind, cfg.dense_optimizer),
        // Plain SGD keeps no state: nothing to lose.
        None if cfg.dense_optimizer == crate::model::DenseOptimizer::Sgd => format!("sgd keeps no optimizer state{sparse_state}{sparse_lost}"),
        None => format!("no optimizer state in it: {} starts anew{sparse_state}{NOT_EQUAL}", cfg.dense_optimizer),
    };
    let tables = match &m.tables {
        Some(n) => format!("its {} tables ({} rows)", n.files.len() + 1, t.rows + n.files.iter().map(|f| f.rows).sum::<u64>()),
        None => format!("its table ({} rows)", t.rows),
    };
    let line = format!("ringrec: warm start from the {}: {dense}, {tables}; {opt}; this run's steps count from 0 and its data from the beginning", m.describe());
    Ok((m, line))
}

/// What of `m` could still start this run when its dense model is another (said with the
/// refusal): its table, whose rows are as wide as this run reads (checked before), as a
/// sparse-parameter file.
fn table_carry(m: &ModelSource) -> String {
    let t = &m.table;
    let how = match m.kind {
        SourceKind::Bundle => format!("pass --init-from {} (a sparse-parameter file)", t.path.display()),
        _ => format!("export them (ringrec table export {} --params --out FILE) and pass --init-from FILE", t.path.display()),
    };
    format!("; its table's rows ({} values) fit this run's: to start from them with new dense parameters, {how}", t.dim)
}

/// What a warm start started from: the summary's `init_from`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct WarmFrom {
    /// The model (`checkpoint of step 40 (ckpt/step-...)`).
    pub model: String,
    /// What was used: the checkpoint (`ckpt/step-...`), the bundle or the file.
    pub path: std::path::PathBuf,
    /// The step it was trained to (checkpoints and bundles).
    pub step: Option<u64>,
    /// Newer checkpoints of the directory skipped as damaged, each with why (empty: the
    /// newest was used; `--require-newest` refuses to skip).
    pub skipped: Vec<String>,
    /// The multi-hot pooling its model recorded (`None`: a sparse-parameter file's rows,
    /// no dense model).
    #[serde(skip)]
    pub pooling: Option<String>,
    /// A `--table` model's named tables' files, in flag order (empty: one table).
    #[serde(skip)]
    pub tables: Vec<TableFile>,
}

/// Said when the dense optimizer's state is not carried: the continued run cannot equal one
/// that never stopped (Adam's moments, Adagrad's accumulators; plain SGD keeps none).
const NOT_EQUAL: &str = " (so this run will not be bit-identical to one that never stopped: a checkpoint directory carries the optimizer state, an export bundle does not)";

/// Sets this run up from `cfg.init_from` on every rank (collective; see the module docs):
/// the dense parameters into `params`, the carried optimizer state (if any) into `opt`.
/// Returns the table file each host leader fills the host table from (`spec` is the run's
/// model over its data's fields, `run` its own table configuration; [`TableFile::config`]
/// turns it into the warm one) and what the run started from.
pub fn start(topo: &Topology, coll: &mut dyn Collectives, cfg: &TrainConfig, spec: &crate::model::ModelSpec, run: &TableConfig, params: &mut Vec<f32>, opt: &mut DenseOptimState) -> TrainResult<(TableFile, WarmFrom)> {
    let Some(path) = &cfg.init_from else { return Err(super::TrainError::Config("no --init-from".into())) };
    let mine = (topo.rank == 0).then(|| {
        let fallback = if cfg.require_newest { Fallback::Refuse("leave out --require-newest to start from it") } else { Fallback::Allow };
        let m = ModelSource::open(path, fallback).map_err(|e| format!("--init-from: {e}"))?;
        m.warn_skipped();
        let (m, line) = check(cfg, spec, run, m)?;
        crate::eprint_line(&line);
        Ok(m)
    });
    let m = ModelSource::share(topo, coll, mine)?;
    let pooling = m.kind.ne(&SourceKind::Params).then(|| m.pooling.clone()).flatten();
    let tables = m.tables.as_ref().map(|t| t.files.clone()).unwrap_or_default();
    let from = WarmFrom { model: m.describe(), path: m.path.clone(), step: m.step, skipped: m.skipped.clone(), pooling, tables };
    if let Some(d) = m.dense {
        *params = d.params;
    }
    if let Some(o) = m.opt {
        *opt = DenseOptimState { lr: cfg.lr, ..o };
    }
    Ok((m.table, from))
}
