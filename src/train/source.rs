//! What `--model` (`ringrec predict`, `ringrec export`) and `--init-from` (`ringrec train`)
//! name, resolved into one [`ModelSource`]:
//!
//! - a **checkpoint directory** (`--checkpoint-dir` of a run): its newest checkpoint that
//!   passes every check, as `--resume` finds it ([`checkpoint::find`]; a damaged newest one
//!   falls back to the previous with a warning, recorded in [`ModelSource::skipped`], unless
//!   the caller refuses that: [`Fallback::Refuse`], `export`'s default and
//!   `--require-newest`), or one checkpoint (`D/step-N`) itself:
//!   dense parameters, the dense optimizer's state, the table as saved (with its optimizer
//!   state);
//! - an **export bundle** ([`super::bundle`]): dense parameters and the table's live rows,
//!   no optimizer state;
//! - a **sparse-parameter file** (`RRSPARAM`, [`crate::embedding::params`]): the table's
//!   rows only (`--init-dense` may add dense weights: a bundle's or a checkpoint's `dense.bin`,
//!   [`crate::model::dense_bin`]).
//!
//! A `--table` model (fields in tables of their own) has its named tables beside the
//! default one ([`NamedTables`]: a checkpoint's `table.NAME.rrt`, a bundle's
//! `table.NAME.bin`) and the names of the fields they are laid out over.
//!
//! Rank 0 resolves and checks the source (every checksum); [`ModelSource::share`] gives
//! every rank the same description and dense values, and each host leader then fills its
//! host table from [`TableFile`] ([`TableFile::config`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::bundle::{Bundle, BundleError};
use super::checkpoint::{self, CheckpointError, Manifest};
use super::tables::{table_file, TableLayout, TableSpec};
use super::TrainResult;
use crate::comm::{Collectives, CollectivesExt};
use crate::data::criteo::{NUM_DENSE, NUM_SPARSE};
use crate::data::ColumnSpec;
use crate::embedding::format::capacity_for_rows;
use crate::embedding::{Header, OptimizerKind, StorageDtype, TableConfig, TableError, TableSource};
use crate::model::{DenseOptimState, DenseWeights, ModelSpec};
use crate::settings::{SettingValue, Word};
use crate::topology::Topology;

/// What kind of model a path holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SourceKind {
    /// A checkpoint (dense parameters, optimizer state, the saved table).
    Checkpoint,
    /// An export bundle (dense parameters and the table's rows).
    Bundle,
    /// A sparse-parameter file (the table's rows).
    Params,
}

/// Why a path is not a usable model; each names the path and what to do.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// A checkpoint could not be found or read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A bundle is damaged.
    #[error(transparent)]
    Bundle(#[from] BundleError),
    /// A table or sparse-parameter file is damaged.
    #[error(transparent)]
    Table(#[from] TableError),
    /// The newest checkpoint of a directory is damaged and the caller refuses to fall back
    /// to an older one ([`Fallback::Refuse`]).
    #[error("{dir}: its newest checkpoint is damaged ({skipped}); refusing to use the older checkpoint of step {step} instead: repair or remove the damaged one, or {allow}")]
    NotNewest {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The checkpoints skipped, each with why.
        skipped: String,
        /// The step of the newest usable checkpoint.
        step: u64,
        /// How to allow the fallback (`pass --allow-older`).
        allow: &'static str,
    },
    /// The path holds no model ringrec knows.
    #[error("{path}: {detail}")]
    NotAModel {
        /// The path.
        path: PathBuf,
        /// What it is and what was expected.
        detail: String,
    },
}

/// A name (`f32`, `adagrad`) for serde, through `Display` and `FromStr`.
mod by_name {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<T: std::fmt::Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }
    pub fn deserialize<'de, T: std::str::FromStr<Err = String>, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// An optional [`by_name`].
mod opt_name {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<T: std::fmt::Display, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, T: std::str::FromStr<Err = String>, D: Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
        Option::<String>::deserialize(d)?.map(|s| s.parse().map_err(serde::de::Error::custom)).transpose()
    }
}

/// Seed and scale of the initial rows of keys a table does not hold.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct InitRows {
    /// Seed.
    pub seed: u64,
    /// Rows are uniform in `[-scale, scale)`.
    pub scale: f32,
}

/// A saved table's own shape (a checkpoint's `table.rrt`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedShape {
    /// Slots.
    pub capacity: u64,
    /// Its optimizer.
    #[serde(with = "by_name")]
    pub optimizer: OptimizerKind,
    /// Adagrad's epsilon.
    pub adagrad_eps: f32,
    /// Adagrad's initial accumulator.
    pub adagrad_init: f32,
}

/// The table file of a model and what it is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableFile {
    /// The file.
    pub path: PathBuf,
    /// Values per row.
    pub dim: u32,
    /// Rows it holds.
    pub rows: u64,
    /// The storage dtype the model was trained with (`None`: a bare sparse-parameter file).
    #[serde(with = "opt_name")]
    pub dtype: Option<StorageDtype>,
    /// The initial rows of keys it lacks (`None`: a bare sparse-parameter file).
    pub init: Option<InitRows>,
    /// A saved table (copied byte for byte) has its shape; a sparse-parameter file (imported
    /// row by row) has none.
    pub saved: Option<SavedShape>,
}

impl TableFile {
    /// The saved table `path` of header `h` (a checkpoint's).
    fn saved(path: PathBuf, h: &Header) -> TableFile {
        let saved = SavedShape { capacity: h.capacity, optimizer: h.optimizer, adagrad_eps: h.adagrad_eps, adagrad_init: h.adagrad_init };
        TableFile { path, dim: h.dim, rows: h.live_rows, dtype: Some(h.dtype), init: Some(InitRows { seed: h.seed, scale: h.init_scale }), saved: Some(saved) }
    }

    /// The saved table `path` (a checkpoint's `--table` table), its header read and checked.
    pub fn open_saved(path: &Path) -> Result<TableFile, SourceError> {
        Ok(TableFile::saved(path.to_path_buf(), &table_header(path)?))
    }

    /// The configuration of a host table filled from this file: a saved table's own shape;
    /// for a sparse-parameter file, `run`'s shape with the file's dtype and initial rows
    /// where it records them.
    pub fn config(&self, run: &TableConfig) -> TableConfig {
        let mut c = run.clone();
        c.dim = self.dim;
        if let Some(d) = self.dtype {
            c.dtype = d;
        }
        if let Some(i) = self.init {
            (c.seed, c.init_scale) = (i.seed, Some(i.scale));
        }
        match self.saved {
            Some(s) => (c.capacity, c.optimizer, c.adagrad_eps, c.adagrad_init) = (s.capacity, s.optimizer, s.adagrad_eps, s.adagrad_init),
            // Imported rows: a table that holds them below the high-water mark.
            None => c.capacity = c.capacity.max(capacity_for_rows(self.rows.saturating_mul(10).div_ceil(7))),
        }
        c
    }

    /// The configuration a scorer fills its table with (`ringrec predict`, `ringrec
    /// serve-model`): [`TableFile::config`] of a table just big enough for the file's rows.
    pub fn scoring_config(&self) -> TableConfig {
        self.config(&TableConfig::new(self.dim, capacity_for_rows(self.rows)))
    }

    /// How the host leader fills a table of `cfg` ([`TableFile::config`]) from this file.
    pub fn source<'a>(&'a self, cfg: &'a TableConfig) -> TableSource<'a> {
        match self.saved {
            Some(_) => TableSource::Saved(&self.path, cfg),
            None => TableSource::Import(cfg, &self.path),
        }
    }
}

/// A `--table` model's named tables beside its default one, and the fields they are laid
/// out over ([`super::tables`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NamedTables {
    /// The `--table` flags as its run gave them ([`TableSpec::word`]s, space-separated).
    pub flags: String,
    /// The data's categorical fields by name, single-hot then lists, and how many are
    /// single-hot (`None`: a checkpoint that does not record them, which only
    /// `ringrec predict` scores: its data names them).
    pub fields: Option<(Vec<String>, usize)>,
    /// Each named table's file, in flag order.
    pub files: Vec<TableFile>,
}

impl NamedTables {
    /// The `--table` flags.
    pub fn specs(&self) -> Result<Vec<TableSpec>, String> {
        let words: Vec<&str> = self.flags.split(' ').filter(|w| !w.is_empty()).collect();
        Vec::<TableSpec>::from_values(&words).map_err(|e| format!("--table {}: {e}", self.flags))
    }

    /// The layout of the tables over the recorded fields, the default table's rows of
    /// `default_dim` values; `what`: the command, for the refusal of a model that does not
    /// record its fields.
    pub fn layout(&self, default_dim: u32, what: &str) -> Result<TableLayout, String> {
        let Some((names, single)) = &self.fields else {
            return Err(format!("{what} needs the names of the model's categorical fields, and this checkpoint of a --table run does not record them (it was written before ringrec did): resume it with its data for one more step (the new checkpoint records them), or score it with ringrec predict --data"));
        };
        let widths = std::iter::once(default_dim).chain(self.files.iter().map(|f| f.dim)).map(|d| d as usize).collect();
        TableLayout::of(&self.specs()?, names, *single, widths).map_err(|e| e.to_string())
    }

    /// Whether this run's `--table` flags `run` lay out the same tables over the same fields,
    /// each of the row width `width_of` gives (capacities aside: a table grows); `None`
    /// when they do, else both as flags.
    pub fn difference(&self, run: &[TableSpec], width_of: impl Fn(&TableSpec) -> usize) -> Option<(String, String)> {
        let shape = |specs: &[TableSpec], widths: Vec<usize>| specs.iter().zip(widths).map(|(t, w)| (t.fields.clone(), t.name.clone(), w)).collect::<Vec<_>>();
        let mine = self.specs().unwrap_or_default();
        let same = mine.len() == self.files.len() && shape(&mine, self.files.iter().map(|f| f.dim as usize).collect()) == shape(run, run.iter().map(&width_of).collect());
        let ours = if run.is_empty() { "none".to_string() } else { run.iter().map(Word::word).collect::<Vec<_>>().join(" ") };
        (!same).then(|| (self.flags.clone(), ours))
    }
}

/// Whether a checkpoint directory whose newest checkpoint is damaged may give the previous
/// one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// Use the newest checkpoint that passes every check; those skipped are recorded
    /// ([`ModelSource::skipped`]) for the caller to report.
    Allow,
    /// Only the newest checkpoint: a damaged one is [`SourceError::NotNewest`], which says
    /// how to allow the fallback (`pass --allow-older`).
    Refuse(&'static str),
}

/// A model resolved from a path (see the module docs).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelSource {
    /// What it is.
    pub kind: SourceKind,
    /// The path as given.
    pub given: PathBuf,
    /// What was resolved: the checkpoint (`D/step-N`), the bundle, the file.
    pub path: PathBuf,
    /// The global step it was trained to (checkpoints and bundles).
    pub step: Option<u64>,
    /// Its dense weights (`None` for a sparse-parameter file).
    pub dense: Option<DenseWeights>,
    /// The dense optimizer's state (checkpoints only).
    pub opt: Option<DenseOptimState>,
    /// Its table.
    pub table: TableFile,
    /// Newer checkpoints of the directory skipped as damaged, each with why (empty: the
    /// newest was used).
    #[serde(default)]
    pub skipped: Vec<String>,
    /// The Parquet columns it was trained with, when they were named (a checkpoint's
    /// `Parquet columns` setting, a bundle's `input.schema`).
    #[serde(default)]
    pub columns: Option<ColumnSpec>,
    /// How its model pools the multi-hot fields, as recorded
    /// ([`crate::model::pooling::describe_pooling`]: `l0=sum,l1=mean`; `sum` for a model
    /// without them or recorded before the pooling was); `None` for a sparse-parameter file.
    #[serde(default)]
    pub pooling: Option<String>,
    /// A `--table` model's named tables (`None`: one table): a checkpoint's each in
    /// `table.NAME.rrt` beside its default table, a bundle's in `table.NAME.bin`.
    #[serde(default)]
    pub tables: Option<NamedTables>,

    /// A checkpoint written before ringrec recorded the pooling with the multi-hot fields'
    /// names, of a model not of Criteo's shape: which of its categorical fields were lists
    /// (pooled, by sum) it does not tell — its dense.bin gives their number only, the fields'
    /// split is the data's. Scoring with the data (`predict`, a resume, `--init-from`) reads
    /// the lists from it; scoring without (`serve-model`, `export`) is refused
    /// ([`ModelSource::unrecorded_fields`]).
    #[serde(default)]
    pub fields_unrecorded: bool,
}

/// Why the model `spec` cannot read a table of rows of `dim` values (another row width,
/// [`ModelSpec::row_width`]); `None` when it can.
pub fn row_mismatch(spec: &ModelSpec, dim: u32) -> Option<String> {
    (spec.row_width() != dim as usize).then(|| format!("the {} reads table rows of {} values, its table's rows have {dim}", spec.describe(), spec.row_width()))
}

/// Why the model `spec` cannot read the rows of the fields of `layout` (each field's row
/// of its table's width: [`TableLayout::model_spec`]); `None` when it can.
pub fn layout_mismatch(spec: &ModelSpec, layout: &TableLayout) -> Option<String> {
    let widths: Vec<usize> = (0..layout.table_of.len()).map(|f| layout.width(f)).collect();
    let reads = match widths.iter().all(|w| *w == spec.row_width()) {
        true => spec.fields == widths.len(),
        false if spec.first_order() => spec.field_dims.iter().map(|d| d + 1).eq(widths.iter().copied()),
        false => spec.fields == 1 && spec.row_width() == widths.iter().sum::<usize>(),
    };
    (!reads).then(|| format!("the {} reads {} field(s) of {} values, its tables give {} fields of {widths:?} values", spec.describe(), spec.fields, spec.row_width(), widths.len()))
}

/// The hidden widths a checkpoint's manifest records (`--hidden`, as typed: `256,128`;
/// older manifests' `[256, 128]` are read as typed by [`checkpoint::read_manifest`]).
fn hidden_of(ck: &Path, m: &Manifest) -> Result<Vec<usize>, SourceError> {
    let bad = |detail: String| SourceError::Checkpoint(CheckpointError::Damaged { path: ck.join(checkpoint::MANIFEST), detail });
    let (_, v) = m.settings.iter().find(|(k, _)| k == "--hidden").ok_or_else(|| bad("it does not record --hidden (the MLP's shape)".into()))?;
    v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| s.parse::<usize>().map_err(|_| bad(format!("--hidden is {v:?}, expected a list like 256,128")))).collect()
}

/// The header of a table file (its first page only: the checksums are checked where the
/// file is opened to be used).
fn table_header(path: &Path) -> Result<Header, SourceError> {
    use std::io::Read;
    let f = crate::fileio::open_input(path).map_err(|e| TableError::io(path, "open", e))?;
    let len = f.metadata().map_err(|e| TableError::io(path, "stat", e))?.len();
    let mut head = Vec::with_capacity(crate::header::HEADER_LEN as usize);
    f.take(crate::header::HEADER_LEN).read_to_end(&mut head).map_err(|e| TableError::io(path, "read", e))?;
    Ok(Header::parse(path, &head, len)?)
}

impl ModelSource {
    /// Why it cannot be scored without its data ([`ModelSource::fields_unrecorded`]), with
    /// how to go on; `None` when its fields are known. `what`: the command, for the message.
    pub fn unrecorded_fields(&self, what: &str) -> Option<String> {
        let spec = &self.dense.as_ref()?.spec;
        self.fields_unrecorded.then(|| {
            format!(
                "{}: {what} needs the model's multi-hot fields, and this checkpoint was written before ringrec recorded them: its {} categorical fields may include list fields (summed), which only its data tells. Resume it with its data for one more step (ringrec train --resume --max-steps {} and the run's flags): the new checkpoint records them; or score it with ringrec predict --data, which reads the lists from the data",
                self.path.display(),
                spec.fields,
                self.step.unwrap_or(0) + 1
            )
        })
    }

    /// Resolves and checks `path` (see the module docs), falling back from a damaged newest
    /// checkpoint as `fallback` says.
    pub fn open(path: &Path, fallback: Fallback) -> Result<ModelSource, SourceError> {
        let not = |detail: &str| SourceError::NotAModel { path: path.to_path_buf(), detail: detail.into() };
        let meta = std::fs::metadata(path).map_err(|e| SourceError::NotAModel { path: path.to_path_buf(), detail: format!("cannot be read ({e})") })?;
        if meta.is_file() {
            let mut magic = [0u8; 8];
            {
                use std::io::Read;
                let _ = crate::fileio::open_input(path).and_then(|mut f| f.read_exact(&mut magic));
            }
            return match &magic {
                m if *m == crate::embedding::params::PARAMS_MAGIC => ModelSource::params(path),
                m if *m == crate::model::dense_bin::DENSE_FRAME.magic => Err(not("dense weights only (a bundle's or a checkpoint's dense.bin): pass the table with --init-from and this file with --init-dense")),
                _ => Err(not("not a sparse-parameter file (RRSPARAM), a checkpoint directory or an export bundle")),
            };
        }
        if let Some(kind) = crate::fileio::special_kind(meta.file_type()).filter(|_| !meta.is_dir()) {
            return Err(not(&format!("it is {kind}, not a checkpoint directory, an export bundle or a sparse-parameter file")));
        }
        if path.join(super::bundle::MODEL_JSON).is_file() {
            return ModelSource::bundle(path, Bundle::open(path)?);
        }
        let (ck, skipped) = if path.join(checkpoint::MANIFEST).is_file() { (checkpoint::load(path)?, Vec::new()) } else { checkpoint::find(path, |_| Ok(()))? };
        if let (false, Fallback::Refuse(allow)) = (skipped.is_empty(), fallback) {
            return Err(SourceError::NotNewest { dir: path.to_path_buf(), skipped: skipped.join("; "), step: ck.dense.step, allow });
        }
        let tables = match ck.manifest.settings.iter().find(|(k, v)| k == "--table" && !v.is_empty() && v != "none") {
            Some((_, flags)) => Some(ModelSource::checkpoint_tables(&ck.dir, flags, &ck.manifest)?),
            None => None,
        };
        let table = ck.table();
        let h = table_header(&table)?;
        let spec = match ck.dense.spec.clone() {
            Some(spec) => spec,
            None => {
                // A checkpoint of an older ringrec: an mlp whose dense.bin records no widths;
                // the manifest's --hidden and the table's dim give them.
                let hidden = hidden_of(&ck.dir, &ck.manifest)?;
                let spec = ModelSpec::mlp(NUM_SPARSE, h.dim as usize, NUM_DENSE, hidden.clone());
                if spec.num_params() != ck.dense.params.len() {
                    return Err(CheckpointError::Damaged { path: ck.dir.join(checkpoint::DENSE), detail: format!("{} dense parameters, but dim {} and --hidden {hidden:?} need {}", ck.dense.params.len(), h.dim, spec.num_params()) }.into());
                }
                spec
            }
        };
        // With `--table` the fields' widths are the tables' (checked when the rows are staged,
        // where the checkpoint does not record its fields).
        let mismatch = match &tables {
            Some(t) => t.layout(h.dim, "").ok().and_then(|l| layout_mismatch(&spec, &l)),
            None => row_mismatch(&spec, h.dim),
        };
        if let Some(e) = mismatch {
            return Err(CheckpointError::Damaged { path: ck.dir.join(checkpoint::DENSE), detail: e }.into());
        }
        let dense = DenseWeights { spec, params: ck.dense.params };
        let table = TableFile::saved(table, &h);
        let columns = ck.manifest.settings.iter().find(|(k, _)| k == "Parquet columns").and_then(|(_, v)| ColumnSpec::from_description(v));
        // `read_manifest` gives an older checkpoint `sum`, which it pooled with.
        let pooling = ck.manifest.settings.iter().find(|(k, _)| k == "--multi-hot-pooling").map(|(_, v)| v.clone());
        let fields_unrecorded = ck.manifest.pooling_unrecorded && !(dense.spec.fields == NUM_SPARSE && dense.spec.ndense == NUM_DENSE);
        Ok(ModelSource { kind: SourceKind::Checkpoint, given: path.to_path_buf(), path: ck.dir, step: Some(ck.dense.step), dense: Some(dense), opt: Some(ck.dense.opt), table, skipped, columns, pooling, fields_unrecorded, tables })
    }

    fn bundle(path: &Path, b: Bundle) -> Result<ModelSource, SourceError> {
        let file = |t: &super::bundle::TableSpec| -> Result<TableFile, SourceError> {
            let init = Some(InitRows { seed: t.init_seed, scale: t.init_scale });
            Ok(TableFile { path: b.dir.join(&t.file), dim: t.dim, rows: t.rows, dtype: Some(b.dtype_of(t)?), init, saved: None })
        };
        let table = file(&b.json.table)?;
        let tables = match &b.json.tables {
            Some(t) => {
                let names = t.fields.iter().map(|f| f.name.clone()).collect();
                let files = t.named.iter().map(|n| file(&n.table)).collect::<Result<_, _>>()?;
                Some(NamedTables { flags: t.flags.clone(), fields: Some((names, t.fields.iter().filter(|f| !f.multi_hot).count())), files })
            }
            None => None,
        };
        let mismatch = match (&tables, &b.json.tables) {
            (Some(t), Some(j)) => match t.layout(table.dim, "reading it") {
                Ok(l) => j.fields.iter().enumerate().find(|(f, fl)| l.width(*f) != fl.width || fl.table != j.file_of(l.table_of[*f])).map(|(_, fl)| format!("model.json's field `{}` reads {} values of {}, the tables --table {} lays out give it other rows", fl.name, fl.width, fl.table, t.flags)).or_else(|| layout_mismatch(&b.dense.spec, &l)),
                Err(e) => Some(e),
            },
            _ => row_mismatch(&b.dense.spec, table.dim),
        };
        if let Some(e) = mismatch {
            return Err(BundleError::Damaged { path: b.dir.join(super::bundle::DENSE_BIN), detail: e }.into());
        }
        let columns = b.json.input.schema.clone();
        let pooling = Some(b.json.input.pooling());
        Ok(ModelSource { kind: SourceKind::Bundle, given: path.to_path_buf(), path: b.dir.clone(), step: Some(b.json.step), dense: Some(b.dense), opt: None, table, skipped: Vec::new(), columns, pooling, fields_unrecorded: false, tables })
    }

    /// The named tables of the checkpoint `dir` of a `--table` run (`flags`), each
    /// `table.NAME.rrt` beside its default table, its header read and checked.
    fn checkpoint_tables(dir: &Path, flags: &str, m: &Manifest) -> Result<NamedTables, SourceError> {
        let fields = m.settings.iter().find(|(k, _)| k == super::tables::FIELDS_SETTING).and_then(|(_, v)| super::tables::recorded_field_names(v));
        let mut t = NamedTables { flags: flags.to_string(), fields, files: Vec::new() };
        let specs = t.specs().map_err(|detail| CheckpointError::Damaged { path: dir.join(checkpoint::MANIFEST), detail })?;
        t.files = specs.iter().map(|s| TableFile::open_saved(&dir.join(table_file(&s.name)))).collect::<Result<_, _>>()?;
        Ok(t)
    }

    fn params(path: &Path) -> Result<ModelSource, SourceError> {
        let (ph, _) = crate::embedding::read_params_header(path)?;
        let table = TableFile { path: path.to_path_buf(), dim: ph.dim, rows: ph.count, dtype: None, init: None, saved: None };
        Ok(ModelSource { kind: SourceKind::Params, given: path.to_path_buf(), path: path.to_path_buf(), step: None, dense: None, opt: None, table, skipped: Vec::new(), columns: None, pooling: None, fields_unrecorded: false, tables: None })
    }

    /// `checkpoint of step 40 (ckpt/step-000000000040)`.
    pub fn describe(&self) -> String {
        let step = self.step.map(|s| format!(" of step {s}")).unwrap_or_default();
        match self.kind {
            SourceKind::Checkpoint => format!("checkpoint{step} ({})", self.path.display()),
            SourceKind::Bundle => format!("export bundle{step} ({})", self.path.display()),
            SourceKind::Params => format!("sparse-parameter file ({})", self.path.display()),
        }
    }

    /// The model its dense weights are (`dlrm (bottom 13-64-16, ...)`), if it has some.
    pub fn model(&self) -> Option<String> {
        self.dense.as_ref().map(|d| d.spec.describe())
    }

    /// Prints a warning on stderr for each checkpoint skipped as damaged.
    pub fn warn_skipped(&self) {
        for s in &self.skipped {
            crate::eprint_line(&format!("ringrec: warning: {s}"));
        }
    }

    /// Gives every rank rank 0's source (collective): rank 0 passes what it resolved (or
    /// why it could not), the others `None`; every rank gets the same source or the same
    /// error. The description travels as JSON, the dense values as f32 broadcasts.
    pub fn share(topo: &Topology, coll: &mut dyn Collectives, mine: Option<Result<ModelSource, String>>) -> TrainResult<ModelSource> {
        let mine = match mine {
            Some(r) => r.map(Some),
            None => Ok(None),
        };
        let mut mine = topo.agree(mine)?;
        let mut lens = [0i64; 3];
        let mut head = Vec::new();
        if let Some(m) = &mut mine {
            let (p, mv, vv) = (m.dense.as_mut().map(|d| std::mem::take(&mut d.params)), m.opt.as_mut().map(|o| std::mem::take(&mut o.m)), m.opt.as_mut().map(|o| std::mem::take(&mut o.v)));
            head = serde_json::to_vec(m).map_err(|e| super::TrainError::Config(format!("encoding the model's description: {e}")))?;
            lens = [p.as_ref().map_or(0, Vec::len) as i64, mv.as_ref().map_or(0, Vec::len) as i64, vv.as_ref().map_or(0, Vec::len) as i64];
            if let (Some(d), Some(p)) = (m.dense.as_mut(), p) {
                d.params = p;
            }
            if let (Some(o), Some(mv), Some(vv)) = (m.opt.as_mut(), mv, vv) {
                (o.m, o.v) = (mv, vv);
            }
        }
        let (head, _) = coll.allgatherv(&head)?;
        coll.broadcast(&mut lens, 0)?;
        let mut m: ModelSource = match mine {
            Some(m) => m,
            None => serde_json::from_slice(&head).map_err(|e| super::TrainError::Config(format!("decoding rank 0's model description: {e}")))?,
        };
        if let Some(d) = m.dense.as_mut() {
            d.params.resize(lens[0] as usize, 0.0);
            coll.broadcast(d.params.as_mut_slice(), 0)?;
        }
        if let Some(o) = m.opt.as_mut() {
            o.m.resize(lens[1] as usize, 0.0);
            o.v.resize(lens[2] as usize, 0.0);
            coll.broadcast(o.m.as_mut_slice(), 0)?;
            coll.broadcast(o.v.as_mut_slice(), 0)?;
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_files_configure_the_host_table() {
        let run = TableConfig::new(8, 1 << 10);
        let params = TableFile { path: "p".into(), dim: 8, rows: 10, dtype: None, init: None, saved: None };
        assert_eq!(params.config(&run), run, "a bare sparse-parameter file takes the run's shape");
        assert!(matches!(params.source(&run), TableSource::Import(..)));
        let saved = TableFile { dtype: Some(StorageDtype::Bf16), init: Some(InitRows { seed: 9, scale: 0.5 }), saved: Some(SavedShape { capacity: 64, optimizer: OptimizerKind::Adagrad, adagrad_eps: 1e-6, adagrad_init: 0.1 }), ..params };
        let c = saved.config(&run);
        assert_eq!((c.dtype, c.seed, c.init_scale, c.capacity, c.optimizer), (StorageDtype::Bf16, 9, Some(0.5), 64, OptimizerKind::Adagrad));
        assert!(matches!(saved.source(&c), TableSource::Saved(..)));
        let json = serde_json::to_string(&saved).unwrap();
        assert!(json.contains("\"bf16\"") && json.contains("\"adagrad\""), "{json}");
        assert_eq!(serde_json::from_str::<TableFile>(&json).unwrap(), saved);
    }

    #[test]
    fn named_tables_lay_out_their_fields_and_compare_with_a_runs_flags() {
        let file = |dim| TableFile { path: "t".into(), dim, rows: 0, dtype: None, init: None, saved: None };
        let n = NamedTables { flags: "C2=a:dim=3:capacity=64".into(), fields: Some((vec!["C1".into(), "C2".into()], 2)), files: vec![file(3)] };
        let l = n.layout(2, "export").unwrap();
        assert_eq!((l.table_of.clone(), l.widths.clone()), (vec![0, 1], vec![2, 3]));
        assert_eq!(layout_mismatch(&ModelSpec::mlp(1, 5, 13, vec![4]), &l), None);
        assert!(layout_mismatch(&ModelSpec::mlp(2, 2, 13, vec![4]), &l).is_some_and(|e| e.contains("its tables give 2 fields of [2, 3] values")));
        // A wide-deep reads each field's row as its dim + 1 values.
        let wide = |field_dims: Vec<usize>| ModelSpec { kind: crate::model::ModelKind::WideDeep, fields: 1, dim: 3, field_dims, ..ModelSpec::mlp(1, 3, 13, vec![4]) };
        assert_eq!(layout_mismatch(&wide(vec![1, 2]), &l), None);
        assert!(layout_mismatch(&wide(vec![2, 1]), &l).is_some());
        assert!(layout_mismatch(&ModelSpec { kind: crate::model::ModelKind::WideDeep, ..ModelSpec::mlp(1, 4, 13, vec![4]) }, &l).is_some());
        let run = Vec::<TableSpec>::from_values(&["C2=a:dim=3"]).unwrap();
        assert_eq!(n.difference(&run, |t| t.dim.unwrap_or(2)), None, "a capacity may differ");
        let other = Vec::<TableSpec>::from_values(&["C1=a:dim=3"]).unwrap();
        assert_eq!(n.difference(&other, |t| t.dim.unwrap_or(2)), Some(("C2=a:dim=3:capacity=64".into(), "C1=a:dim=3".into())));
        assert_eq!(n.difference(&[], |_| 2), Some(("C2=a:dim=3:capacity=64".into(), "none".into())));
        let unrecorded = NamedTables { fields: None, ..n };
        assert!(unrecorded.layout(2, "serving").unwrap_err().contains("serving needs the names"));
    }

    #[test]
    fn hidden_widths_come_from_the_manifest() {
        let m = |v: &str| Manifest {
            format: String::new(),
            version: 2,
            step: 0,
            epoch: 0,
            step_in_epoch: 0,
            optim_step: 0,
            dense_optimizer: "adam".into(),
            lr: 0.0,
            params: 0,
            param_norm: 0.0,
            settings: vec![("--hidden".into(), v.into())],
            table: checkpoint::TableFacts { generation: 0, live_rows: 0, dim: 1, capacity: 16 },
            files: Vec::new(),
            pooling_unrecorded: false,
        };
        assert_eq!(hidden_of(Path::new("c"), &m("256,128")).unwrap(), vec![256, 128]);
        assert_eq!(hidden_of(Path::new("c"), &m("")).unwrap(), Vec::<usize>::new());
        assert!(hidden_of(Path::new("c"), &m("[256, 128]")).unwrap_err().to_string().contains("expected a list"));
        // An older manifest's spelling, as read_manifest gives it.
        let old = checkpoint::settings_as_typed(vec![("--hidden".into(), "[256, 128]".into()), ("--batch".into(), "1024".into()), ("--expire-after-steps".into(), "Some(5)".into()), ("--table-max-bytes".into(), "auto".into())]);
        assert_eq!(old, [("--hidden", "256,128"), ("--batch", "1024"), ("--expire-after-steps", "5"), ("--table-max-bytes", crate::settings::NOT_SET), ("--loss-normalize", "weights"), ("--multi-hot-pooling", "sum")].map(|(k, v)| (k.to_string(), v.to_string())));
    }
}
