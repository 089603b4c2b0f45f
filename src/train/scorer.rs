//! [`Scorer`]: a trained model loaded for online scoring in one process (`ringrec
//! serve-model`), on the CPU, scoring through `predict`'s one scoring step
//! ([`super::predict::score_batch`]), so its scores are `ringrec predict`'s for the same
//! rows cut into the same batches.
//!
//! [`Scorer::open`] resolves the model as `predict` does ([`ModelSource`]: a checkpoint
//! directory's newest good checkpoint, one checkpoint, or an export bundle) and checks every
//! checksum. A checkpoint's table is mapped read-only where it lies (no copy); a bundle's
//! rows are imported into a private table under the shared-memory directory, whose name is
//! unlinked as soon as it is filled (the mapping lives on; nothing is left behind). Keys a
//! table lacks read as their initial rows, as in training. A model with multi-hot fields
//! scores [`Rows`] with their bags, pooled as the model records
//! ([`ModelSource::pooling`]). A `--table` model's named tables are opened as its default
//! one, and each row's fields are gathered from their tables and pooled as `ringrec
//! predict` does ([`Gather`]), over the fields the model records.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::batch::Batch;
use super::predict::{score_batch, scoring_model, Embeddings};
use super::source::{Fallback, ModelSource, SourceKind, TableFile};
use super::tables::Gather;
use super::{TrainError, TrainResult};
use crate::data::criteo::Columns;
use crate::data::Fields;
use crate::device::{CpuDevice, Device};
use crate::embedding::{EmbeddingTable, SegmentGuard};
use crate::model::DenseModel;

/// Rows to score: their columns (of the model's shape, [`Scorer::fields`]) and, for a model
/// with multi-hot fields, each row's bags: bag `b` (field `b % bags` of row `b / bags`)
/// holds the keys `keys[offsets[b]..offsets[b + 1]]`, salted by their field
/// ([`Fields::list_key`]).
#[derive(Clone, Debug)]
pub struct Rows {
    /// Their labels, dense features and single-hot keys.
    pub columns: Columns,
    /// Multi-hot fields per row (0: none).
    pub bags: usize,
    /// Where each bag's keys start, `columns.len() * bags + 1` entries from 0.
    pub offsets: Vec<u32>,
    /// The bags' keys, bag after bag.
    pub keys: Vec<u64>,
}

impl Default for Rows {
    fn default() -> Rows {
        Rows::single_hot(Columns::default())
    }
}

impl Rows {
    /// Rows without multi-hot fields.
    pub fn single_hot(columns: Columns) -> Rows {
        Rows { columns, bags: 0, offsets: vec![0], keys: Vec::new() }
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.columns.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.columns.is_empty()
    }

    /// Empties them, for rows of `fields`' shape with `bags` multi-hot fields.
    pub fn clear(&mut self, fields: Fields, bags: usize) {
        self.columns.clear();
        self.columns.fields = fields;
        self.keys.clear();
        self.offsets.clear();
        self.offsets.push(0);
        self.bags = bags;
    }

    /// Appends `other`'s rows (of the same shape and as many multi-hot fields).
    pub fn extend(&mut self, other: &Rows) {
        let base = self.offsets.last().copied().unwrap_or(0);
        self.columns.append(&other.columns);
        self.offsets.extend(other.offsets.iter().skip(1).map(|o| o + base));
        self.keys.extend_from_slice(&other.keys);
    }
}

/// A model ready to score (see the module docs).
pub struct Scorer {
    /// What was loaded (its dense weights are in the model).
    pub source: ModelSource,
    table: EmbeddingTable,
    /// A `--table` model's named tables (in flag order) and the gathering over them all.
    named: Vec<EmbeddingTable>,
    gather: Option<Gather>,
    model: DenseModel<CpuDevice>,
    batch: Batch,
    logits: Vec<f32>,
}

impl std::fmt::Debug for Scorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scorer").field("model", &self.source.describe()).field("table_rows", &self.table.live_rows()).finish()
    }
}

/// Numbers the private tables of one process.
static NEXT_TABLE: AtomicU64 = AtomicU64::new(0);

/// The table a scorer reads `t` through: a saved table mapped read-only where it lies;
/// rows imported into a private table under `shm_dir`, whose name is removed once filled.
fn scoring_table(t: &TableFile, shm_dir: &Path) -> TrainResult<EmbeddingTable> {
    let cfg = t.scoring_config();
    Ok(match t.saved {
        Some(_) => {
            let table = EmbeddingTable::open_readonly(&t.path)?;
            table.check_matches(&cfg)?;
            table
        }
        None => {
            let n = NEXT_TABLE.fetch_add(1, Ordering::Relaxed);
            let seg = shm_dir.join(format!("ringrec-serve-{}-{n}-table", std::process::id()));
            let mut guard = SegmentGuard::new(&seg);
            let mut table = EmbeddingTable::create(&seg, &cfg)?;
            table.load_params(&t.path)?;
            guard.remove_now().map_err(|e| TrainError::Config(format!("removing the name of the scoring table {}: {e}", seg.display())))?;
            table
        }
    })
}

impl Scorer {
    /// Loads `path` (see the module docs) to score on `threads` threads; a bundle's table is
    /// imported under `shm_dir`. Newer checkpoints skipped as damaged are listed in
    /// `source.skipped`.
    pub fn open(path: &Path, fallback: Fallback, shm_dir: &Path, threads: usize) -> TrainResult<Scorer> {
        let mut source = ModelSource::open(path, fallback).map_err(|e| TrainError::Config(e.to_string()))?;
        if source.kind == SourceKind::Params {
            return Err(TrainError::Config(format!("{}: a sparse-parameter file holds no dense weights; serving needs a checkpoint directory or an export bundle (ringrec export)", path.display())));
        }
        if let Some(why) = source.unrecorded_fields("serving") {
            return Err(TrainError::Config(why));
        }
        let table = scoring_table(&source.table, shm_dir)?;
        let named = source.tables.iter().flat_map(|t| &t.files).map(|f| scoring_table(f, shm_dir)).collect::<TrainResult<Vec<_>>>()?;
        let mut model = scoring_model(CpuDevice::new(threads), &source)?;
        let lists: Vec<_> = source.pooling.as_deref().and_then(|p| crate::model::pooling::recorded_fields(p).ok()).unwrap_or_default();
        let modes: Vec<_> = lists.iter().map(|(_, m)| *m).collect();
        let gather = match &source.tables {
            // The tables pool the multi-hot fields on the host.
            Some(t) => Some(Gather::new(t.layout(table.header().dim, "serving").map_err(TrainError::Config)?, &modes)),
            None if !lists.is_empty() => {
                model.set_multi_hot(&modes)?;
                None
            }
            None => None,
        };
        if let Some(d) = source.dense.as_mut() {
            d.params = Vec::new();
        }
        Ok(Scorer { source, table, named, gather, model, batch: Batch::default(), logits: Vec::new() })
    }

    /// Appends the scores of `rows` to `out`, in batches of `batch_rows` from the first (the
    /// cut `ringrec predict --batch` makes of its rows): rows of the model's shape
    /// ([`Scorer::fields`]) with their bags (as many multi-hot fields as the model's,
    /// [`Scorer::multi_hot_fields`]), pooled as the model records.
    pub fn score_rows(&mut self, rows: &Rows, batch_rows: usize, out: &mut Vec<f32>) -> TrainResult<()> {
        let (bags, step) = (rows.bags, batch_rows.max(1));
        if bags != self.bags() {
            return Err(TrainError::Config(format!("the rows have {bags} multi-hot fields, the model {}", self.bags())));
        }
        let mut offsets = Vec::new();
        for first in (0..rows.len()).step_by(step) {
            let end = (first + step).min(rows.len());
            let span = &rows.offsets[first * bags..=end * bags];
            let base = span[0];
            offsets.clear();
            offsets.extend(span.iter().map(|o| o - base));
            self.batch.load_columns_with_bags(&rows.columns, first..end, bags, &offsets, &rows.keys[base as usize..span[span.len() - 1] as usize])?;
            let mut emb = match self.gather.as_mut() {
                Some(g) => Embeddings::Split(std::iter::once(&self.table).chain(&self.named).collect(), g),
                None => Embeddings::One(&self.table),
            };
            score_batch(&mut self.model, &mut emb, &self.batch, &mut self.logits, out)?;
        }
        Ok(())
    }

    /// The rows the model takes: its dense features and single-hot categorical fields.
    pub fn fields(&self) -> Fields {
        let spec = self.model.spec();
        let fields = self.source.tables.as_ref().and_then(|t| t.fields.as_ref()).map_or(spec.fields, |(names, _)| names.len());
        Fields { dense: spec.ndense, sparse: fields - self.bags() }
    }

    /// Multi-hot fields per row.
    fn bags(&self) -> usize {
        match self.gather {
            Some(_) => self.multi_hot_fields().len(),
            None => self.model.multi_hot_fields(),
        }
    }

    /// Each dense feature's transform where the model's Parquet columns chose one (a schema
    /// file's `[dense]`), by slot; `None` where the default applies (log for an integer,
    /// none for a float: the value's own type). Its columns are recorded in their slots'
    /// order; a model whose columns name no dense columns has no explicit transforms.
    pub fn dense_transforms(&self) -> Vec<Option<crate::data::schema::Transform>> {
        let n = self.fields().dense;
        match &self.source.columns {
            Some(c) if c.dense.len() == n => c.dense.iter().map(|name| c.transform(name)).collect(),
            _ => vec![None; n],
        }
    }

    /// The model's multi-hot fields with their pooling, in order (empty without them).
    pub fn multi_hot_fields(&self) -> Vec<(String, crate::model::pooling::Pooling)> {
        self.source.pooling.as_deref().and_then(|p| crate::model::pooling::recorded_fields(p).ok()).unwrap_or_default()
    }

    /// Rows of its table.
    pub fn table_rows(&self) -> u64 {
        self.table.live_rows() + self.named.iter().map(EmbeddingTable::live_rows).sum::<u64>()
    }

    /// The device it scores on, in words.
    pub fn device(&self) -> String {
        self.model.device().describe()
    }
}
